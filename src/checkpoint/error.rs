//! The one error type of the checkpoint store boundary.
//!
//! Every refusal names the file (relative to the state dir) and what is wrong with it, and says
//! what to do; none of them has changed a byte on disk.

use std::io;
use std::path::PathBuf;

use super::format::{CheckpointId, Digest, FormatError};
use crate::privfs::FsError;

/// Errors of the checkpoint store.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CheckpointError {
    /// `CURRENT` exists but holds no bytes.
    #[error(
        "{path}: CURRENT is empty; the store was left as it is, restore CURRENT or run `tenure verify` to find an older valid checkpoint"
    )]
    CurrentEmpty {
        /// The CURRENT file.
        path: PathBuf,
    },
    /// `CURRENT` does not have the exact `<id> <sha256>\n` form.
    #[error(
        "{path}: CURRENT {reason}; the store was left as it is, restore CURRENT or run `tenure verify` to find an older valid checkpoint"
    )]
    CurrentMalformed {
        /// The CURRENT file.
        path: PathBuf,
        /// What the parser refused.
        reason: FormatError,
    },
    /// `CURRENT` names a manifest file that does not exist.
    #[error(
        "{path}: CURRENT names a missing manifest (checkpoint {id}); the store was left as it is, restore the manifest or run `tenure verify`"
    )]
    ManifestMissing {
        /// The manifest file CURRENT points at.
        path: PathBuf,
        /// The checkpoint id CURRENT names.
        id: CheckpointId,
    },
    /// The manifest's bytes do not hash to the digest `CURRENT` records.
    #[error(
        "{path}: manifest digest mismatch: sha256 {actual}, CURRENT records {expected}; the store was left as it is: restore the file, or make an older checkpoint current (`tenure checkpoint list` shows which ones verify, `tenure checkpoint rollback --to N`)"
    )]
    ManifestDigestMismatch {
        /// The manifest file.
        path: PathBuf,
        /// Digest recorded in CURRENT.
        expected: Digest,
        /// Digest of the bytes found.
        actual: Digest,
    },
    /// The manifest does not parse or breaks a format rule.
    #[error(
        "{path}: manifest {reason}; the store was left as it is: restore the file, or make an older checkpoint current (`tenure checkpoint list` shows which ones verify, `tenure checkpoint rollback --to N`)"
    )]
    ManifestMalformed {
        /// The manifest file.
        path: PathBuf,
        /// What the parser refused.
        reason: FormatError,
    },
    /// The manifest's own id disagrees with the file it is stored in.
    #[error(
        "{path}: manifest holds id {found}, expected {expected}; the store was left as it is: restore the file, or make an older checkpoint current (`tenure checkpoint list` shows which ones verify, `tenure checkpoint rollback --to N`)"
    )]
    ManifestIdMismatch {
        /// The manifest file.
        path: PathBuf,
        /// The id its file name and CURRENT give.
        expected: CheckpointId,
        /// The id inside.
        found: CheckpointId,
    },
    /// A blob the manifest lists is absent.
    #[error(
        "{path}: blob missing for entry {name:?}; the store was left as it is: restore the file, or make an older checkpoint current (`tenure checkpoint list` shows which ones verify, `tenure checkpoint rollback --to N`)"
    )]
    BlobMissing {
        /// The blob file.
        path: PathBuf,
        /// The entry that lists it.
        name: String,
    },
    /// A blob has another length than the manifest lists.
    #[error(
        "{path}: blob size mismatch for entry {name:?}: {actual} bytes, the manifest lists {expected}; the store was left as it is: restore the file, or make an older checkpoint current (`tenure checkpoint list` shows which ones verify, `tenure checkpoint rollback --to N`)"
    )]
    BlobSizeMismatch {
        /// The blob file.
        path: PathBuf,
        /// The entry that lists it.
        name: String,
        /// Size the manifest lists.
        expected: u64,
        /// Size found (at most `expected + 1`: reading stops there).
        actual: u64,
    },
    /// A blob's bytes do not hash to its name.
    #[error(
        "{path}: blob digest mismatch for entry {name:?}: sha256 {actual}; the store was left as it is: restore the file, or make an older checkpoint current (`tenure checkpoint list` shows which ones verify, `tenure checkpoint rollback --to N`)"
    )]
    BlobDigestMismatch {
        /// The blob file.
        path: PathBuf,
        /// The entry that lists it.
        name: String,
        /// Digest of the bytes found.
        actual: Digest,
    },
    /// A file or directory of the store was refused by the private-file rules (symlink,
    /// permissive, not owned, ...) or could not be accessed.
    #[error(transparent)]
    Fs(#[from] FsError),
    /// The publisher's epoch is older than the one persisted in the state dir (card H5).
    #[error(
        "{path}: publish with epoch {epoch} refused: the state dir is owned at epoch {persisted}; nothing was written"
    )]
    StaleEpoch {
        /// The epoch file.
        path: PathBuf,
        /// The epoch the publisher holds.
        epoch: u64,
        /// The epoch persisted in the state dir.
        persisted: u64,
    },
    /// A cluster CURRENT (issue 14) was not moved: the publisher's lease no longer holds the
    /// owner key its epoch created (it expired, or a newer owner took over).
    #[error(
        "{pointer}: CURRENT was not moved: the lease of epoch {epoch} no longer holds ({reason}); the blobs and manifest written are garbage a later owner may collect"
    )]
    Fenced {
        /// Where CURRENT lives (`etcd://…/PREFIX/current`).
        pointer: String,
        /// The epoch the publisher held.
        epoch: u64,
        /// What the cluster said.
        reason: String,
    },
    /// A cluster CURRENT could not be read or written (no member answered).
    #[error("{pointer}: {reason}")]
    PointerFailed {
        /// Where CURRENT lives.
        pointer: String,
        /// What went wrong, with the fix.
        reason: String,
    },
    /// The publisher's epoch is newer than any the state dir ever granted.
    #[error(
        "{path}: publish with epoch {epoch} refused: the state dir has granted only up to epoch {persisted}; publish with the epoch the lease returned"
    )]
    UnknownEpoch {
        /// The epoch file.
        path: PathBuf,
        /// The epoch the publisher holds.
        epoch: u64,
        /// The epoch persisted in the state dir (0 when none was ever granted).
        persisted: u64,
    },
    /// The epoch file could not be read, so the publish cannot be fenced.
    #[error("{path}: cannot read the epoch to fence the publish: {reason}; nothing was written")]
    EpochUnreadable {
        /// The epoch file.
        path: PathBuf,
        /// Why it could not be read.
        reason: String,
    },
    /// The files offered for publication exceed a limit of the whole checkpoint (card P2).
    #[error(
        "{path}: cannot publish: the checkpoint {reason}; nothing was written: publish fewer files"
    )]
    OverLimit {
        /// The file at which the limit was passed.
        path: PathBuf,
        /// Which limit.
        reason: FormatError,
    },
    /// A file offered for publication has a name the manifest cannot hold.
    #[error("{path}: cannot publish: the name {reason}; rename or move the file")]
    BadEntryName {
        /// The offending file.
        path: PathBuf,
        /// Which naming rule it breaks.
        reason: FormatError,
    },
    /// The staging area holds something other than regular files and directories.
    #[error(
        "{path}: cannot publish a {kind}; a checkpoint is a directory of regular files and directories"
    )]
    UnsupportedFile {
        /// The offending entry.
        path: PathBuf,
        /// What it is (symlink, fifo, socket, device).
        kind: &'static str,
    },
    /// The store was opened read-only ([`super::CheckpointStore::open`]); only the owner
    /// publishes.
    #[error(
        "{path}: the checkpoint store was opened read-only; open it with `open_owned` while holding the lease"
    )]
    ReadOnly {
        /// The store directory.
        path: PathBuf,
    },
    /// An entry of a publish names a blob the store does not hold.
    #[error(
        "{path}: cannot carry entry {name:?} over: its blob is missing or has another size; publish the file's bytes instead"
    )]
    CarryMissing {
        /// The blob file.
        path: PathBuf,
        /// The entry.
        name: String,
    },
    /// The store options make no sense (card H6).
    #[error("invalid checkpoint store options: {0}")]
    InvalidOptions(&'static str),
    /// The checkpoint id sequence is exhausted.
    #[error("{path}: checkpoint ids are exhausted; start a new state dir")]
    IdsExhausted {
        /// The CURRENT file.
        path: PathBuf,
    },
    /// A step of a publish failed before `CURRENT` was replaced; the publish is abandoned and
    /// `CURRENT` is unchanged (an fsync error also poisons the store: reopen it).
    #[error("{source}; the publish was abandoned and CURRENT is unchanged")]
    PublishFailed {
        /// What failed.
        source: FsError,
    },
    /// The fsync of the directory holding `CURRENT` failed after the rename: `CURRENT` names
    /// either the old or the new checkpoint, both complete, and which one survives a power loss
    /// is unknown, so the publish is not acknowledged.
    #[error(
        "{source}; CURRENT was already renamed, so it names checkpoint {new} or the previous one, both complete; the publish is not acknowledged: reopen the store and publish again"
    )]
    CurrentSyncFailed {
        /// The checkpoint being published.
        new: CheckpointId,
        /// The failed directory fsync.
        source: FsError,
    },
    /// Any other I/O failure, with the file and the operation.
    #[error("{path}: {op} failed: {source}")]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// The operation (open, read, write, rename, ...).
        op: &'static str,
        /// The OS error.
        source: io::Error,
    },
}

impl CheckpointError {
    /// The same error with paths under `from` shown under `to`: a refusal found in a staging
    /// area that was then kept elsewhere names the file where the user can now find it.
    pub fn relocate(self, from: &std::path::Path, to: &std::path::Path) -> CheckpointError {
        let moved = |p: PathBuf| match p.strip_prefix(from) {
            Ok(rest) if rest.as_os_str().is_empty() => to.to_path_buf(),
            Ok(rest) => to.join(rest),
            Err(_) => p,
        };
        match self {
            CheckpointError::BadEntryName { path, reason } => CheckpointError::BadEntryName {
                path: moved(path),
                reason,
            },
            CheckpointError::OverLimit { path, reason } => CheckpointError::OverLimit {
                path: moved(path),
                reason,
            },
            CheckpointError::UnsupportedFile { path, kind } => CheckpointError::UnsupportedFile {
                path: moved(path),
                kind,
            },
            CheckpointError::Io { path, op, source } => CheckpointError::Io {
                path: moved(path),
                op,
                source,
            },
            // A staged file the publish could not open or read (mode 000, say).
            CheckpointError::Fs(mut e) => {
                let path = e.path_mut();
                *path = moved(std::mem::take(path));
                CheckpointError::Fs(e)
            }
            other => other,
        }
    }

    pub(crate) fn io(path: impl Into<PathBuf>, op: &'static str, source: io::Error) -> Self {
        CheckpointError::Io {
            path: path.into(),
            op,
            source,
        }
    }

    /// True for refusals of on-disk state (the `verify` exit code), false for operational
    /// failures such as I/O errors or fencing.
    pub fn is_corrupt_state(&self) -> bool {
        matches!(
            self,
            CheckpointError::CurrentEmpty { .. }
                | CheckpointError::CurrentMalformed { .. }
                | CheckpointError::ManifestMissing { .. }
                | CheckpointError::ManifestDigestMismatch { .. }
                | CheckpointError::ManifestMalformed { .. }
                | CheckpointError::ManifestIdMismatch { .. }
                | CheckpointError::BlobMissing { .. }
                | CheckpointError::BlobSizeMismatch { .. }
                | CheckpointError::BlobDigestMismatch { .. }
        ) || matches!(self, CheckpointError::Fs(e) if e.is_refusal())
    }
}

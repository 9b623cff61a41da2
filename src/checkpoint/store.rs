//! The store itself: open, load, verify, publish, garbage-collect, staging areas and views.
//! See the module docs of [`crate::checkpoint`] for the layout and the protocols.

use std::collections::{BTreeMap, BTreeSet};
use std::fs::File;
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use rustix::fs::Mode;

use super::error::CheckpointError;
use super::format::{self, CURRENT_LEN, CheckpointId, Current, Digest, Entry, MAX_MANIFEST_LEN};
use super::gc::{self, DEFAULT_KEEP, Seen};
use super::hash::{self, Mismatch, VerifyingReader};
use super::tree;
use super::{
    BLOBS_DIR, CURRENT_FILE, FAILED_DIR, MANIFESTS_DIR, SHA256_DIR, STAGING_DIR, STORE_DIR,
    VIEWS_DIR,
};
use crate::privfs::{Dir, FileKind, FsError, Links, StateDir};

/// Bytes written between two writeback kicks of a blob being published.
const WRITEBACK_KICK: u64 = 8 << 20;

/// Options of a store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StoreOptions {
    /// How many checkpoints a GC keeps: the current one and `keep - 1` ancestors. At least 1.
    pub keep: usize,
}

impl Default for StoreOptions {
    fn default() -> Self {
        StoreOptions { keep: DEFAULT_KEEP }
    }
}

/// A verified checkpoint: every blob it lists had the right size and digest when it was loaded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Checkpoint {
    /// Its id.
    pub id: CheckpointId,
    /// The checkpoint that was current when it was published.
    pub parent: Option<CheckpointId>,
    /// The lease epoch of its publisher.
    pub epoch: u64,
    /// Publication time, milliseconds since the Unix epoch.
    pub created_at_ms: u64,
    /// Its files, sorted by name.
    pub entries: Vec<Entry>,
    /// sha256 of its manifest file, as `CURRENT` records it.
    pub manifest_sha256: Digest,
}

impl Checkpoint {
    /// The entry called `name`.
    pub fn entry(&self, name: &str) -> Option<&Entry> {
        self.entries
            .binary_search_by(|e| e.name.as_bytes().cmp(name.as_bytes()))
            .ok()
            .map(|i| &self.entries[i])
    }

    /// Total bytes of all files.
    pub fn total_size(&self) -> u64 {
        self.entries.iter().map(|e| e.size).sum()
    }
}

/// What a best-effort read-only check found (for `tenure verify` and `status`).
#[derive(Debug)]
pub struct VerifyReport {
    /// What [`CheckpointStore::load`] returns.
    pub current: Result<Option<Checkpoint>, CheckpointError>,
    /// The newest checkpoint older than the current one (or any, when `CURRENT` is unreadable)
    /// whose manifest parses and whose blobs all verify. Evidence for an operator only: nothing
    /// ever loads it in place of the current one.
    pub newest_valid_older: Option<Checkpoint>,
}

/// Where the bytes of one file of a publish come from.
pub enum Source<'r> {
    /// Bytes read to the end from a reader.
    Reader(Box<dyn Read + 'r>),
    /// An open file; when the current checkpoint has a file of the same name and size, it is
    /// hashed first and not copied at all if its blob already exists.
    File(File),
    /// An existing blob of this store (e.g. an unchanged file of the current checkpoint): only
    /// its presence and size are checked, nothing is read or written.
    Blob {
        /// The blob's digest.
        sha256: Digest,
        /// Its size.
        size: u64,
    },
}

/// One file of [`CheckpointStore::publish_files`].
pub struct PublishFile<'r> {
    /// Entry name (see [`format::check_name`]).
    pub name: String,
    /// Permission bits to record (masked to 0o777).
    pub mode: u32,
    /// The bytes.
    pub source: Source<'r>,
}

/// One file of a publish, opened only when its blob is written.
struct Input<'r> {
    name: String,
    #[allow(clippy::type_complexity)]
    open: Box<dyn FnOnce() -> Result<(Source<'r>, u32), CheckpointError> + 'r>,
}

/// What a GC after a publish did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GcReport {
    /// Checkpoints kept, newest first.
    pub kept: Vec<CheckpointId>,
    /// Manifests removed.
    pub manifests_removed: usize,
    /// Blobs removed.
    pub blobs_removed: usize,
    /// Blob removal was skipped because a kept manifest could not be read.
    pub blobs_skipped: bool,
    /// A GC step failed; the publish is still acknowledged and the next GC retries.
    pub error: Option<String>,
}

/// The outcome of a publish.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Published {
    /// Nothing to publish (no file, or exactly the current checkpoint's files): `CURRENT` was
    /// not touched.
    Unchanged {
        /// The checkpoint that stays current, if any.
        current: Option<CheckpointId>,
    },
    /// A new checkpoint is durable and current.
    New {
        /// The new checkpoint.
        checkpoint: Checkpoint,
        /// Bytes of blobs written (files whose blob already existed are not counted).
        bytes_written: u64,
        /// What the GC afterwards did.
        gc: GcReport,
    },
}

/// An empty private directory a writer fills for the next publish (`TENURE_CHECKPOINT_OUT`).
#[derive(Debug)]
pub struct Staging {
    dir: Dir,
    name: String,
}

impl Staging {
    /// Absolute path of the area, to hand to the writer.
    pub fn path(&self) -> &Path {
        self.dir.path()
    }
}

/// A read-only copy of a checkpoint's files in the store's `views/` directory
/// (`TENURE_CHECKPOINT`); remove it with [`CheckpointStore::remove_view`].
#[derive(Debug)]
pub struct View {
    path: PathBuf,
    name: String,
}

impl View {
    /// Absolute path of the view directory.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// The directories of an open store; each is `None` only in a read-only store that lacks it.
#[derive(Debug)]
struct Dirs {
    root: Dir,
    manifests: Option<Dir>,
    blobs: Option<Dir>,
}

/// A checkpoint store inside a state dir.
#[derive(Debug)]
pub struct CheckpointStore<'s> {
    state: &'s StateDir,
    dirs: Option<Dirs>,
    owned: bool,
    keep: usize,
}

fn check_opts(opts: &StoreOptions) -> Result<(), CheckpointError> {
    if opts.keep == 0 {
        return Err(CheckpointError::InvalidOptions(
            "keep must be at least 1 (the current checkpoint)",
        ));
    }
    Ok(())
}

fn publish_failed(e: impl Into<CheckpointError>) -> CheckpointError {
    match e.into() {
        CheckpointError::Fs(source) => CheckpointError::PublishFailed { source },
        other => other,
    }
}

impl<'s> CheckpointStore<'s> {
    /// Opens the store read-only: never creates, writes or removes anything. A state dir
    /// without a store simply has no checkpoint.
    pub fn open(
        state: &'s StateDir,
        opts: StoreOptions,
    ) -> Result<CheckpointStore<'s>, CheckpointError> {
        check_opts(&opts)?;
        let dirs = match state.root().open_dir_optional(STORE_DIR)? {
            None => None,
            Some(root) => {
                let manifests = root.open_dir_optional(MANIFESTS_DIR)?;
                let blobs = match root.open_dir_optional(BLOBS_DIR)? {
                    None => None,
                    Some(b) => b.open_dir_optional(SHA256_DIR)?,
                };
                Some(Dirs {
                    root,
                    manifests,
                    blobs,
                })
            }
        };
        Ok(CheckpointStore {
            state,
            dirs,
            owned: false,
            keep: opts.keep,
        })
    }

    /// Opens the store for its owner (the lease holder): creates the directories when they are
    /// missing, removes temp files left by a crashed publish (they are never referenced) and
    /// removes leftover staging areas and views (scratch trees nothing references). Nothing
    /// else is touched: `CURRENT`, manifests and blobs stay byte-for-byte as they are.
    pub fn open_owned(
        state: &'s StateDir,
        opts: StoreOptions,
    ) -> Result<CheckpointStore<'s>, CheckpointError> {
        let store = Self::attach_owned(state, opts)?;
        let Some(dirs) = &store.dirs else {
            unreachable!("attach_owned always opens the directories")
        };
        let (root, manifests, blobs) = (&dirs.root, &dirs.manifests, &dirs.blobs);
        root.remove_temp_files("open.sweep")?;
        for d in [manifests, blobs].into_iter().flatten() {
            d.remove_temp_files("open.sweep")?;
        }
        for scratch in [STAGING_DIR, VIEWS_DIR] {
            if let Some(d) = root.open_dir_optional(scratch)? {
                for e in d.entries()? {
                    // Everything in these two directories is scratch of an earlier ownership:
                    // staging areas and views, and whatever a child left beside its area (a
                    // `rename into place` temp dir, a symlink). None of it was published, and
                    // none of it is ever followed: links are removed, not resolved.
                    match e.kind {
                        FileKind::Directory => tree::remove_tree(&d, &e.name, "open.sweep")?,
                        FileKind::Regular
                        | FileKind::Symlink
                        | FileKind::Fifo
                        | FileKind::Socket
                        | FileKind::CharDevice
                        | FileKind::BlockDevice
                        | FileKind::Unknown => match d.unlink(&e.name, "open.sweep") {
                            Ok(()) | Err(FsError::NotFound { .. }) => {}
                            Err(err) => return Err(err.into()),
                        },
                    }
                }
            }
        }
        Ok(store)
    }

    /// Opens the store for its owner *without* the sweep of [`CheckpointStore::open_owned`]:
    /// for the second and later opens within one ownership, which must keep the staging area
    /// and views this ownership made (the child's output is in its staging area).
    pub fn attach_owned(
        state: &'s StateDir,
        opts: StoreOptions,
    ) -> Result<CheckpointStore<'s>, CheckpointError> {
        check_opts(&opts)?;
        let root = state.root().ensure_dir(STORE_DIR, "open")?;
        let manifests = root.ensure_dir(MANIFESTS_DIR, "open")?;
        let blobs = root
            .ensure_dir(BLOBS_DIR, "open")?
            .ensure_dir(SHA256_DIR, "open")?;
        Ok(CheckpointStore {
            state,
            dirs: Some(Dirs {
                root,
                manifests: Some(manifests),
                blobs: Some(blobs),
            }),
            owned: true,
            keep: opts.keep,
        })
    }

    /// The store directory (for messages).
    pub fn path(&self) -> PathBuf {
        self.state.root().child_path(STORE_DIR)
    }

    fn current_path(&self) -> PathBuf {
        self.path().join(CURRENT_FILE)
    }

    fn manifest_path(&self, id: CheckpointId) -> PathBuf {
        self.path()
            .join(MANIFESTS_DIR)
            .join(id.manifest_file_name())
    }

    fn blob_path(&self, d: &Digest) -> PathBuf {
        self.path()
            .join(BLOBS_DIR)
            .join(SHA256_DIR)
            .join(d.to_hex())
    }

    /// Reads and parses `CURRENT`: `None` when there is no checkpoint yet.
    pub fn read_current(&self) -> Result<Option<Current>, CheckpointError> {
        Ok(self.read_current_raw()?.map(|(c, _)| c))
    }

    fn read_current_raw(&self) -> Result<Option<(Current, Vec<u8>)>, CheckpointError> {
        let Some(dirs) = &self.dirs else {
            return Ok(None);
        };
        let path = self.current_path();
        let bytes = match dirs.root.read_optional(CURRENT_FILE, CURRENT_LEN as u64) {
            Ok(None) => return Ok(None),
            Ok(Some(b)) => b,
            Err(FsError::TooLarge { len, .. }) => {
                return Err(CheckpointError::CurrentMalformed {
                    path,
                    reason: format::FormatError::BadLength {
                        actual: len as usize,
                        expected: CURRENT_LEN,
                    },
                });
            }
            Err(e) => return Err(e.into()),
        };
        match Current::parse(&bytes) {
            Ok(c) => Ok(Some((c, bytes))),
            Err(format::FormatError::Empty) => Err(CheckpointError::CurrentEmpty { path }),
            Err(reason) => Err(CheckpointError::CurrentMalformed { path, reason }),
        }
    }

    /// Reads manifest `id`, checking its digest when `expected` is given, its format, and that
    /// the id inside matches.
    fn read_manifest(
        &self,
        id: CheckpointId,
        expected: Option<&Digest>,
    ) -> Result<(format::Manifest, Digest), CheckpointError> {
        let path = self.manifest_path(id);
        let missing = || CheckpointError::ManifestMissing {
            path: path.clone(),
            id,
        };
        let dir = self
            .dirs
            .as_ref()
            .and_then(|d| d.manifests.as_ref())
            .ok_or_else(missing)?;
        let bytes = match dir.read_optional(id.manifest_file_name(), MAX_MANIFEST_LEN) {
            Ok(Some(b)) => b,
            Ok(None) => return Err(missing()),
            Err(FsError::TooLarge { len, .. }) => {
                return Err(CheckpointError::ManifestMalformed {
                    path,
                    reason: format::FormatError::TooLarge(len),
                });
            }
            Err(e) => return Err(e.into()),
        };
        let actual = hash::digest_bytes(&bytes);
        if let Some(expected) = expected
            && actual != *expected
        {
            return Err(CheckpointError::ManifestDigestMismatch {
                path,
                expected: *expected,
                actual,
            });
        }
        let m = format::Manifest::parse(&bytes).map_err(|reason| {
            CheckpointError::ManifestMalformed {
                path: path.clone(),
                reason,
            }
        })?;
        if m.id != id {
            return Err(CheckpointError::ManifestIdMismatch {
                path,
                expected: id,
                found: m.id,
            });
        }
        Ok((m, actual))
    }

    fn blobs_dir(&self) -> Option<&Dir> {
        self.dirs.as_ref().and_then(|d| d.blobs.as_ref())
    }

    fn open_blob(&self, e: &Entry) -> Result<File, CheckpointError> {
        let path = self.blob_path(&e.sha256);
        let missing = || CheckpointError::BlobMissing {
            path: path.clone(),
            name: e.name.clone(),
        };
        let dir = self.blobs_dir().ok_or_else(missing)?;
        // Blobs may have any link count: their content is checked by digest, not trusted.
        match dir.open_file_with(e.sha256.to_hex(), Links::Any) {
            Ok(f) => Ok(f),
            Err(FsError::NotFound { .. }) => Err(missing()),
            Err(err) => Err(err.into()),
        }
    }

    fn mismatch(&self, e: &Entry, m: Mismatch) -> CheckpointError {
        let path = self.blob_path(&e.sha256);
        match m {
            Mismatch::Size { expected, actual } => CheckpointError::BlobSizeMismatch {
                path,
                name: e.name.clone(),
                expected,
                actual,
            },
            Mismatch::Digest { actual, .. } => CheckpointError::BlobDigestMismatch {
                path,
                name: e.name.clone(),
                actual,
            },
        }
    }

    fn verify_entry(&self, e: &Entry, buf: &mut [u8]) -> Result<(), CheckpointError> {
        let mut f = self.open_blob(e)?;
        match hash::verify_reader_fast(&mut f, e.size, &e.sha256, buf)
            .map_err(|err| CheckpointError::io(self.blob_path(&e.sha256), "read", err))?
        {
            Ok(()) => Ok(()),
            Err(m) => Err(self.mismatch(e, m)),
        }
    }

    fn load_verified(
        &self,
        id: CheckpointId,
        expected: Option<&Digest>,
        buf: &mut [u8],
    ) -> Result<Checkpoint, CheckpointError> {
        let (m, digest) = self.read_manifest(id, expected)?;
        for e in &m.entries {
            self.verify_entry(e, buf)?;
        }
        Ok(Checkpoint {
            id: m.id,
            parent: m.parent,
            epoch: m.epoch,
            created_at_ms: m.created_at_ms,
            entries: m.entries,
            manifest_sha256: digest,
        })
    }

    /// Loads the current checkpoint and verifies it completely: `CURRENT`'s format, the
    /// manifest's digest and format, every blob's size and digest (streamed, constant memory).
    /// `Ok(None)` when there is no checkpoint yet. Read-only: never repairs, deletes or falls
    /// back to an older checkpoint. If `CURRENT` changes while loading (an owner published
    /// meanwhile) the load starts over, at most three times.
    pub fn load(&self) -> Result<Option<Checkpoint>, CheckpointError> {
        let mut buf = hash::buffer();
        let mut attempts = 0;
        loop {
            let Some((cur, raw)) = self.read_current_raw()? else {
                return Ok(None);
            };
            match self.load_verified(cur.id, Some(&cur.manifest_sha256), &mut buf) {
                Ok(cp) => return Ok(Some(cp)),
                Err(e) => {
                    attempts += 1;
                    let moved = matches!(self.read_current_raw(), Ok(Some((_, now))) if now != raw);
                    if !moved || attempts >= 3 {
                        return Err(e);
                    }
                }
            }
        }
    }

    /// Best-effort read-only check for `tenure verify` and `status`: the result of
    /// [`CheckpointStore::load`] and the newest valid older checkpoint.
    pub fn report(&self) -> Result<VerifyReport, CheckpointError> {
        let current = self.load();
        let below = match &current {
            Ok(Some(cp)) => Some(cp.id),
            Ok(None) => None,
            Err(_) => self.read_current().ok().flatten().map(|c| c.id),
        };
        let mut newest_valid_older = None;
        // With no checkpoint at all there is nothing older to look for.
        if !matches!(current, Ok(None)) {
            let mut buf = hash::buffer();
            for id in self.manifest_ids()?.into_iter().rev() {
                if below.is_some_and(|b| id >= b) {
                    continue;
                }
                if let Ok(cp) = self.load_verified(id, None, &mut buf) {
                    newest_valid_older = Some(cp);
                    break;
                }
            }
        }
        Ok(VerifyReport {
            current,
            newest_valid_older,
        })
    }

    /// Ids of the well-named manifest files, ascending.
    fn manifest_ids(&self) -> Result<Vec<CheckpointId>, CheckpointError> {
        let Some(dir) = self.dirs.as_ref().and_then(|d| d.manifests.as_ref()) else {
            return Ok(Vec::new());
        };
        let mut ids: Vec<CheckpointId> = dir
            .entries()?
            .into_iter()
            .filter(|e| e.kind == FileKind::Regular)
            .filter_map(|e| CheckpointId::from_manifest_file_name(e.name.to_str()?))
            .collect();
        ids.sort();
        Ok(ids)
    }

    /// Opens one file of a loaded checkpoint as a reader that re-checks size and digest as it
    /// is read and fails at end of file if they do not match.
    pub fn open_entry(&self, entry: &Entry) -> Result<VerifyingReader<File>, CheckpointError> {
        let f = self.open_blob(entry)?;
        Ok(VerifyingReader::new(
            f,
            entry.size,
            entry.sha256,
            self.blob_path(&entry.sha256).display().to_string(),
        ))
    }

    fn owned_dirs(&self) -> Result<(&Dir, &Dir, &Dir), CheckpointError> {
        match (&self.dirs, self.owned) {
            (
                Some(Dirs {
                    root,
                    manifests: Some(m),
                    blobs: Some(b),
                }),
                true,
            ) => Ok((root, m, b)),
            _ => Err(CheckpointError::ReadOnly { path: self.path() }),
        }
    }

    /// Creates a fresh, empty, private staging area (owner only).
    pub fn staging(&self) -> Result<Staging, CheckpointError> {
        let (root, _, _) = self.owned_dirs()?;
        let parent = root.ensure_dir(STAGING_DIR, "staging")?;
        loop {
            let name = tree::random_name()?;
            match parent.create_dir(&name, "staging") {
                Ok(dir) => return Ok(Staging { dir, name }),
                Err(FsError::AlreadyExists { .. }) => continue,
                Err(e) => return Err(e.into()),
            }
        }
    }

    /// Removes a staging area and everything in it.
    pub fn discard_staging(&self, staging: Staging) -> Result<(), CheckpointError> {
        let (root, _, _) = self.owned_dirs()?;
        let parent = root.open_dir(STAGING_DIR)?;
        let Staging { dir, name } = staging;
        drop(dir);
        tree::remove_tree(&parent, &name, "staging")
    }

    /// Checks the fencing epoch (card H5): the publish must name exactly the epoch persisted
    /// in the state dir. An older one is a stale owner; a newer one was never granted.
    fn fence(&self, epoch: u64) -> Result<(), CheckpointError> {
        let path = self
            .state
            .root()
            .child_path(crate::lease::CONTROL_DIR)
            .join(crate::lease::epoch::EPOCH_FILE);
        let persisted =
            crate::lease::read_epoch(self.state).map_err(|e| CheckpointError::EpochUnreadable {
                path: path.clone(),
                reason: e.to_string(),
            })?;
        if persisted > epoch {
            return Err(CheckpointError::StaleEpoch {
                path,
                epoch,
                persisted,
            });
        }
        if persisted < epoch {
            return Err(CheckpointError::UnknownEpoch {
                path,
                epoch,
                persisted,
            });
        }
        Ok(())
    }

    /// Publishes the files of a staging area as the new current checkpoint (owner only), with
    /// the protocol in the module docs. Nested directories become `/`-separated names; an
    /// empty area, or one equal to the current checkpoint, is [`Published::Unchanged`].
    pub fn publish(&self, epoch: u64, staging: &Staging) -> Result<Published, CheckpointError> {
        self.owned_dirs()?;
        self.fence(epoch)?;
        let staged = tree::walk(&staging.dir)?;
        // Each file is opened only when its turn comes, so a staging area with more files than
        // the descriptor limit still publishes.
        let dir = &staging.dir;
        let files = staged
            .into_iter()
            .map(|s| Input {
                name: s.name.clone(),
                open: Box::new(move || {
                    let f = tree::open_staged(dir, &s.name)?;
                    let st = rustix::fs::fstat(&f).map_err(|e| {
                        CheckpointError::io(dir.path().join(&s.name), "stat", e.into())
                    })?;
                    Ok((Source::File(f), st.st_mode & 0o777))
                }),
            })
            .collect();
        self.publish_checked(epoch, files, Some(staging.dir.path()))
    }

    /// Publishes a list of files as the new current checkpoint (owner only); the library form
    /// of [`CheckpointStore::publish`]. Unchanged files can be carried over cheaply with
    /// [`Source::Blob`].
    pub fn publish_files(
        &self,
        epoch: u64,
        files: Vec<PublishFile<'_>>,
    ) -> Result<Published, CheckpointError> {
        self.owned_dirs()?;
        self.fence(epoch)?;
        let files = files
            .into_iter()
            .map(|f| {
                let PublishFile { name, mode, source } = f;
                Input {
                    name,
                    open: Box::new(move || Ok((source, mode))),
                }
            })
            .collect();
        self.publish_checked(epoch, files, None)
    }

    fn publish_checked(
        &self,
        epoch: u64,
        mut files: Vec<Input<'_>>,
        origin: Option<&Path>,
    ) -> Result<Published, CheckpointError> {
        let (root, manifests, blobs) = self.owned_dirs()?;
        let shown = |name: &str| match origin {
            Some(o) => o.join(name),
            None => PathBuf::from(name),
        };
        // Names are checked before any byte is written.
        files.sort_by(|a, b| a.name.as_bytes().cmp(b.name.as_bytes()));
        let probe: Vec<Entry> = files
            .iter()
            .map(|f| Entry {
                name: f.name.clone(),
                size: 0,
                sha256: Digest([0; 32]),
                mode: 0,
            })
            .collect();
        if let Err(reason) = format::check_entries(&probe) {
            let name = match &reason {
                format::FormatError::BadName { name, .. }
                | format::FormatError::Unsorted(name)
                | format::FormatError::FileDirClash(name) => name.clone(),
                _ => String::new(),
            };
            return Err(CheckpointError::BadEntryName {
                path: shown(&name),
                reason,
            });
        }
        let parent = match self.read_current()? {
            None => None,
            Some(cur) => Some(self.read_manifest(cur.id, Some(&cur.manifest_sha256))?.0),
        };
        let parent_id = parent.as_ref().map(|m| m.id);
        if files.is_empty() {
            return Ok(Published::Unchanged { current: parent_id });
        }
        let id = match &parent {
            None => CheckpointId::FIRST,
            Some(m) => m.id.next().ok_or_else(|| CheckpointError::IdsExhausted {
                path: self.current_path(),
            })?,
        };

        // Existing blobs are reused without reading them only when the current checkpoint
        // names them (its blobs were verified when the owner loaded it). Any other blob with
        // the right name — an orphan of a crashed publish — is read and checked first, so a
        // corrupted orphan is refused instead of being referenced by the new checkpoint.
        let trusted: BTreeSet<Digest> = parent
            .iter()
            .flat_map(|m| m.entries.iter().map(|e| e.sha256))
            .collect();

        // 1. Blobs: temp, fsync, rename (never replacing), then one fsync of the blob dir.
        let mut buf = hash::buffer();
        let mut entries = Vec::with_capacity(files.len());
        let mut bytes_written = 0u64;
        for f in files {
            let hint = parent.as_ref().and_then(|m| {
                m.entries
                    .binary_search_by(|e| e.name.as_bytes().cmp(f.name.as_bytes()))
                    .ok()
                    .map(|i| &m.entries[i])
            });
            let (source, mode) = (f.open)()?;
            let (size, sha256, written) =
                self.store_blob(blobs, source, &f.name, hint, &trusted, &mut buf, &shown)?;
            bytes_written += written;
            entries.push(Entry {
                name: f.name,
                size,
                sha256,
                mode: mode & 0o777,
            });
        }
        // Always, even when every blob already existed: a blob renamed by an earlier publish
        // whose directory fsync failed must not be referenced before its entry is durable.
        blobs.sync("publish.blob").map_err(publish_failed)?;
        if parent.as_ref().is_some_and(|m| m.entries == entries) {
            return Ok(Published::Unchanged { current: parent_id });
        }

        // 2. Manifest: temp, fsync, rename, fsync of the manifests dir.
        let manifest = format::Manifest {
            format: format::MANIFEST_FORMAT,
            id,
            parent: parent_id,
            epoch,
            created_at_ms: SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map(|d| d.as_millis() as u64)
                .unwrap_or(0),
            entries,
        };
        let bytes = manifest.to_bytes();
        let manifest_sha256 = hash::digest_bytes(&bytes);
        {
            let mut tmp = manifests
                .create_temp("publish.manifest")
                .map_err(publish_failed)?;
            tmp.write_all(&bytes).map_err(publish_failed)?;
            // A leftover manifest of this id can only be the orphan of a crashed publish
            // (CURRENT names its parent), so replacing it is safe.
            tmp.sync()
                .map_err(publish_failed)?
                .rename_into(id.manifest_file_name())
                .map_err(publish_failed)?;
        }
        manifests.sync("publish.manifest").map_err(publish_failed)?;

        // 3. CURRENT, fenced once more right before the only step that makes it visible.
        self.fence(epoch)?;
        let current = Current {
            id,
            manifest_sha256,
        };
        replace_current(root, &current)?;
        crate::failpoint::hit("publish.acked")
            .map_err(|e| CheckpointError::io(self.path(), "acknowledge", e))?;

        // 4. Acknowledged: collect what the last `keep` checkpoints do not need.
        let gc = self.collect(id, manifests, blobs);
        Ok(Published::New {
            checkpoint: Checkpoint {
                id,
                parent: parent_id,
                epoch,
                created_at_ms: manifest.created_at_ms,
                entries: manifest.entries,
                manifest_sha256,
            },
            bytes_written,
            gc,
        })
    }

    /// Stores one file's bytes as a blob and returns (size, digest, bytes written).
    #[allow(clippy::too_many_arguments)]
    fn store_blob(
        &self,
        blobs: &Dir,
        source: Source<'_>,
        name: &str,
        hint: Option<&Entry>,
        trusted: &BTreeSet<Digest>,
        buf: &mut [u8],
        shown: &dyn Fn(&str) -> PathBuf,
    ) -> Result<(u64, Digest, u64), CheckpointError> {
        match source {
            Source::Blob { sha256, size } => {
                let ok = matches!(
                    blobs.stat(sha256.to_hex()),
                    Ok(Some(st)) if rustix::fs::FileType::from_raw_mode(st.st_mode) == rustix::fs::FileType::RegularFile
                        && st.st_size as u64 == size
                );
                if !ok {
                    return Err(CheckpointError::CarryMissing {
                        path: self.blob_path(&sha256),
                        name: name.to_string(),
                    });
                }
                Ok((size, sha256, 0))
            }
            Source::File(mut f) => {
                // Likely unchanged (same name and size as in the current checkpoint): hash
                // first and skip the copy when the blob exists.
                let len = f
                    .metadata()
                    .map_err(|e| CheckpointError::io(shown(name), "stat", e))?
                    .len();
                if hint.is_some_and(|h| h.size == len) {
                    let s = hash::digest_fast(&mut f, len, buf)
                        .map_err(|e| CheckpointError::io(shown(name), "read", e))?;
                    if self.blob_present(blobs, &s.sha256, s.size, name, trusted)? {
                        return Ok((s.size, s.sha256, 0));
                    }
                    f.seek(SeekFrom::Start(0))
                        .map_err(|e| CheckpointError::io(shown(name), "seek", e))?;
                }
                self.write_blob(blobs, &mut f, name, trusted, shown)
            }
            Source::Reader(mut r) => self.write_blob(blobs, &mut r, name, trusted, shown),
        }
    }

    /// Whether a blob with this digest exists; one with the wrong size, or (when it is not in
    /// `trusted`) the wrong content, is refused, never replaced (that would be a repair).
    fn blob_present(
        &self,
        blobs: &Dir,
        d: &Digest,
        size: u64,
        name: &str,
        trusted: &BTreeSet<Digest>,
    ) -> Result<bool, CheckpointError> {
        match blobs.stat(d.to_hex())? {
            None => Ok(false),
            Some(st) if st.st_size as u64 == size => {
                if !trusted.contains(d) {
                    let entry = Entry {
                        name: name.to_string(),
                        size,
                        sha256: *d,
                        mode: 0,
                    };
                    self.verify_entry(&entry, &mut hash::buffer())?;
                }
                Ok(true)
            }
            Some(st) => Err(CheckpointError::BlobSizeMismatch {
                path: self.blob_path(d),
                name: name.to_string(),
                expected: size,
                actual: st.st_size as u64,
            }),
        }
    }

    /// Copies `src` into a temp blob while hashing it, then renames it to its digest unless a
    /// blob of that digest exists already (the temp is then dropped unsynced).
    fn write_blob(
        &self,
        blobs: &Dir,
        src: &mut dyn Read,
        name: &str,
        trusted: &BTreeSet<Digest>,
        shown: &dyn Fn(&str) -> PathBuf,
    ) -> Result<(u64, Digest, u64), CheckpointError> {
        // The pipeline brings its own fixed set of buffers.
        let mut tmp = blobs.create_temp("publish.blob").map_err(publish_failed)?;
        let mut kicked = 0u64;
        let summary = hash::pipe(src, None, |chunk, offset| {
            tmp.write_all(chunk).map_err(publish_failed)?;
            let end = offset + chunk.len() as u64;
            if end - kicked >= WRITEBACK_KICK {
                // Start writeback of what is written so far, so the disk works while we go on
                // hashing and the final fsync has little left to do. DONTNEED starts
                // asynchronous writeback of dirty pages (and drops pages that are already
                // clean); it is advice only, the fsync below is what makes the blob durable.
                let _ = rustix::fs::fadvise(
                    tmp.file(),
                    kicked,
                    std::num::NonZeroU64::new(end - kicked),
                    rustix::fs::Advice::DontNeed,
                );
                kicked = end;
            }
            Ok(())
        })
        .map_err(|e| match e {
            hash::PipeError::Read(e) => CheckpointError::io(shown(name), "read", e),
            hash::PipeError::Sink(e) => e,
        })?;
        let (size, sha256) = (summary.size, summary.sha256);
        if self.blob_present(blobs, &sha256, size, name, trusted)? {
            return Ok((size, sha256, 0));
        }
        // Blobs are read-only even to us, so no later open for writing can change them by
        // accident.
        rustix::fs::fchmod(tmp.file(), Mode::from_raw_mode(0o400))
            .map_err(|e| CheckpointError::io(tmp.path(), "make read-only", e.into()))?;
        match tmp
            .sync()
            .map_err(publish_failed)?
            .rename_into_new(sha256.to_hex())
        {
            Ok(()) => Ok((size, sha256, size)),
            // Someone stored the same bytes meanwhile; theirs is as good as ours.
            Err(FsError::AlreadyExists { .. }) => Ok((size, sha256, 0)),
            Err(e) => Err(publish_failed(e)),
        }
    }

    /// The GC after an acknowledged publish. Failures are reported, not returned: the publish
    /// is already durable, and the next GC starts over from what is on disk.
    fn collect(&self, current: CheckpointId, manifests: &Dir, blobs: &Dir) -> GcReport {
        let mut report = GcReport::default();
        if let Err(e) = self.collect_into(current, manifests, blobs, &mut report) {
            report.error = Some(e.to_string());
        }
        report
    }

    fn collect_into(
        &self,
        current: CheckpointId,
        manifests: &Dir,
        blobs: &Dir,
        report: &mut GcReport,
    ) -> Result<(), CheckpointError> {
        let mut seen = BTreeMap::new();
        for id in self.manifest_ids()? {
            let s = match self.read_manifest(id, None) {
                Ok((m, _)) => Seen::Valid(m),
                Err(_) => Seen::Unreadable,
            };
            seen.insert(id, s);
        }
        let present: BTreeSet<Digest> = blobs
            .entries()?
            .into_iter()
            .filter(|e| e.kind == FileKind::Regular)
            .filter_map(|e| e.name.to_str()?.parse().ok())
            .collect();
        let plan = gc::plan(current, &seen, &present, self.keep);
        report.kept = plan.kept.clone();
        report.blobs_skipped = plan.blobs_skipped;
        // Manifests go first, so a crash mid-GC does not leave a manifest without its blobs.
        // No directory is fsynced: a deletion lost in a power cut only leaves garbage that the
        // next GC removes again, and what GC deletes is never what a kept checkpoint needs, so
        // the order of deletions does not need to be durable either (a manifest that comes
        // back without its blobs is not kept, never loaded, and reported as invalid).
        for id in &plan.manifests {
            manifests.unlink(id.manifest_file_name(), "gc.manifest")?;
            report.manifests_removed += 1;
        }
        for d in &plan.blobs {
            blobs.unlink(d.to_hex(), "gc.blob")?;
            report.blobs_removed += 1;
        }
        Ok(())
    }

    /// Copies `checkpoint`'s files into a new read-only view under the store's `views/`
    /// directory (owner only) and returns it; see [`CheckpointStore::materialise_into`].
    pub fn materialise(&self, checkpoint: &Checkpoint) -> Result<View, CheckpointError> {
        let (root, _, _) = self.owned_dirs()?;
        let parent = root.ensure_dir(VIEWS_DIR, "view")?;
        let name = tree::random_name()?;
        let path = self.materialise_into(checkpoint, &parent, &name)?;
        Ok(View { path, name })
    }

    /// Copies `checkpoint`'s files into a new directory `name` under `parent`, re-creating
    /// nested names as directories. Each copy is hashed as it is written and must match the
    /// manifest. Files get mode `entry.mode & 0o500` and directories 0500, so the view is
    /// read-only (copies, never hard links: see the module docs). On error the partial view is
    /// removed.
    pub fn materialise_into(
        &self,
        checkpoint: &Checkpoint,
        parent: &Dir,
        name: &str,
    ) -> Result<PathBuf, CheckpointError> {
        let top = parent.create_dir(name, "view")?;
        let path = top.path().to_path_buf();
        let res = self.fill_view(checkpoint, &top);
        drop(top);
        match res {
            Ok(()) => Ok(path),
            Err(e) => {
                // Best effort: a leftover view is scratch that the next owned open sweeps.
                let _ = tree::remove_tree(parent, name, "view");
                Err(e)
            }
        }
    }

    fn fill_view(&self, cp: &Checkpoint, top: &Dir) -> Result<(), CheckpointError> {
        let mut buf = hash::buffer();
        // Directories created so far, by relative name; made read-only at the end, deepest
        // first, because a read-only directory cannot receive new entries.
        let mut dirs: BTreeMap<String, Dir> = BTreeMap::new();
        for e in &cp.entries {
            let (dir_name, leaf) = match e.name.rsplit_once('/') {
                Some((d, l)) => (Some(d), l),
                None => (None, e.name.as_str()),
            };
            if let Some(d) = dir_name {
                let mut so_far = String::new();
                for comp in d.split('/') {
                    let key = if so_far.is_empty() {
                        comp.to_string()
                    } else {
                        format!("{so_far}/{comp}")
                    };
                    if !dirs.contains_key(&key) {
                        let parent = if so_far.is_empty() {
                            top
                        } else {
                            &dirs[&so_far]
                        };
                        let created = parent.create_dir(comp, "view")?;
                        dirs.insert(key.clone(), created);
                    }
                    so_far = key;
                }
            }
            let dir = dir_name.map(|d| &dirs[d]).unwrap_or(top);
            let mut out = dir.create_exclusive(leaf, "view")?;
            let out_path = dir.child_path(leaf);
            let mut src = self.open_blob(e)?;
            // Read at most one byte past the promised size: enough to notice a longer blob.
            let limit = e.size.saturating_add(1);
            let mut sink = |chunk: &[u8], _: u64| {
                out.write_all(chunk)
                    .map_err(|err| CheckpointError::io(&out_path, "write", err))
            };
            let got = if e.size >= hash::PIPELINE_MIN {
                hash::pipe(&mut src, Some(limit), &mut sink)
            } else {
                hash::copy_small(&mut src, limit, &mut buf, &mut sink)
            }
            .map_err(|err| match err {
                hash::PipeError::Read(err) => {
                    CheckpointError::io(self.blob_path(&e.sha256), "read", err)
                }
                hash::PipeError::Sink(err) => err,
            })?;
            let size = got.size;
            if size != e.size {
                return Err(self.mismatch(
                    e,
                    Mismatch::Size {
                        expected: e.size,
                        actual: size.min(e.size + 1),
                    },
                ));
            }
            let got = got.sha256;
            if got != e.sha256 {
                return Err(self.mismatch(
                    e,
                    Mismatch::Digest {
                        expected: e.sha256,
                        actual: got,
                    },
                ));
            }
            rustix::fs::fchmod(&out, Mode::from_raw_mode(e.mode & 0o500))
                .map_err(|err| CheckpointError::io(&out_path, "make read-only", err.into()))?;
        }
        for (key, d) in dirs.iter().rev() {
            rustix::fs::fchmod(d, Mode::from_raw_mode(0o500)).map_err(|err| {
                CheckpointError::io(top.path().join(key), "make read-only", err.into())
            })?;
        }
        rustix::fs::fchmod(top, Mode::from_raw_mode(0o500))
            .map_err(|err| CheckpointError::io(top.path(), "make read-only", err.into()))?;
        Ok(())
    }

    /// Removes a view made by [`CheckpointStore::materialise`].
    pub fn remove_view(&self, view: View) -> Result<(), CheckpointError> {
        let (root, _, _) = self.owned_dirs()?;
        let parent = root.open_dir(VIEWS_DIR)?;
        tree::remove_tree(&parent, &view.name, "view")
    }
}

/// Replaces `CURRENT` durably: temp file in the store directory, write, fsync, `renameat` over
/// `CURRENT`, fsync of the directory. This is the only function in the crate that replaces
/// `CURRENT`. Every failure before the rename leaves `CURRENT` untouched
/// ([`CheckpointError::PublishFailed`]); a failed directory fsync after it is
/// [`CheckpointError::CurrentSyncFailed`].
pub(crate) fn replace_current(root: &Dir, current: &Current) -> Result<(), CheckpointError> {
    let bytes = current.to_bytes();
    let mut tmp = root
        .create_temp("publish.current")
        .map_err(publish_failed)?;
    tmp.write_all(&bytes).map_err(publish_failed)?;
    tmp.sync()
        .map_err(publish_failed)?
        .rename_into(CURRENT_FILE)
        .map_err(publish_failed)?;
    root.sync("publish.current")
        .map_err(|source| CheckpointError::CurrentSyncFailed {
            new: current.id,
            source,
        })
}

/// The highest lease epoch the store records (card P3), and where: the epochs of the
/// manifests in `manifests/` and the names of kept outputs in `failed/`. Best effort and
/// read-only: an unreadable manifest records nothing.
pub fn highest_epoch(state: &StateDir) -> Option<crate::lease::epoch::Seen> {
    let store = CheckpointStore::open(state, StoreOptions::default()).ok()?;
    let mut best: Option<crate::lease::epoch::Seen> = None;
    let mut consider = |epoch: u64, path: PathBuf| {
        if best.as_ref().is_none_or(|b| epoch > b.epoch) {
            best = Some(crate::lease::epoch::Seen { epoch, path });
        }
    };
    for id in store.manifest_ids().unwrap_or_default() {
        if let Ok((m, _)) = store.read_manifest(id, None) {
            consider(m.epoch, store.manifest_path(id));
        }
    }
    if let Some(dirs) = &store.dirs
        && let Ok(Some(failed)) = dirs.root.open_dir_optional(FAILED_DIR)
        && let Ok(entries) = failed.entries()
    {
        for e in entries {
            if let Some(epoch) = e.name.to_str().and_then(failed_epoch) {
                consider(epoch, failed.child_path(&e.name));
            }
        }
    }
    best
}

/// The epoch in the name of a kept output (`<epoch>` or `<epoch>.<n>`).
fn failed_epoch(name: &str) -> Option<u64> {
    name.split('.').next()?.parse().ok()
}

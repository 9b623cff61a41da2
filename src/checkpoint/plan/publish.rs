//! The publish plan (issue 4's protocol, batched by issue 11):
//!
//! 1. **Fence** on the epoch: the publish names exactly the persisted epoch (card H5).
//! 2. Read `CURRENT`; check the parent manifest's digest before anything is written, and read
//!    its header (an unchanged checkpoint is detected by walking the parent's entries beside
//!    the new ones, both sorted by name).
//! 3. **Blobs, without an fsync each**: every new file is copied into a temp file of the
//!    scratch directory `incoming/` while it is hashed (writeback started as it goes), and
//!    renamed there to its digest. A file whose blob already exists is not copied (a likely
//!    unchanged file is hashed first; an existing blob the current checkpoint does not name is
//!    read and checked, never trusted or rewritten). Manifest lines are buffered and spilled to
//!    the manifest's temp file when large, so memory does not grow with the number of files.
//! 4. **One durability batch**: a single `syncfs` makes every new blob and the manifest
//!    durable at once (git's `core.fsyncMethod=batch`, with the filesystem-wide flush as the
//!    one barrier); without a new blob, the manifest's own fsync. A large blob (at least
//!    [`OWN_FSYNC_MIN`] bytes, its writeback started while it was copied) is made durable by
//!    its own `fdatasync` before it is closed, and when every new blob was, the batch is the
//!    manifest's fsync alone: a `syncfs` would also write back the staged copies of those
//!    blobs (and whatever else is dirty on the filesystem), only for the staging area to be
//!    deleted after the publish — on a filesystem with online discard, deleting written-back
//!    data is what costs.
//! 5. Only then are the blobs moved into `blobs/sha256/` (a listing of `incoming/`, a page at
//!    a time; a rename that finds the blob there drops ours) and the manifest renamed into
//!    place, so no name in the store ever points at data that power loss could tear. The
//!    directories changed are synced (`incoming/`, `blobs/sha256/`, `manifests/`) and the
//!    emptied `incoming/` removed.
//! 6. **Fence again**, then replace `CURRENT` (temp, write, fsync, rename, fsync of the store
//!    directory). The publish is acknowledged only after that last fsync.
//! 7. The GC ([`GcPlan`]).
//!
//! Every failure before the `CURRENT` rename leaves `CURRENT` untouched. A publish of no file,
//! or of exactly the current checkpoint's files, is [`Published::Unchanged`] and writes nothing
//! durable. The inputs come one at a time ([`Poll::Input`], [`PublishPlan::give_input`]) as
//! handles the caller opened: a staging area's files, readers, or blobs carried over.

use std::ffi::OsString;

use super::gc::GcPlan;
use super::load::{check_blob, hashed};
use super::{
    Fence, HashState, INCOMING_DIR, LIST_PAGE, MANIFEST_SPILL, Plan, Poll, StoreFds, StorePath,
    fd_of, os,
};
use crate::checkpoint::error::CheckpointError;
use crate::checkpoint::format::{
    self, CheckpointId, Current, Digest, Entry, Header, ManifestParser, PARSE_CHUNK, Parsed,
};
use crate::checkpoint::hash::Mismatch;
use crate::checkpoint::limits::{self, Limits};
use crate::checkpoint::store::{CheckpointSummary, GcReport, Published};
use crate::checkpoint::{CURRENT_FILE, format::CURRENT_LEN};
use crate::fsop::{Check, Done, Fd, Op, Step, Summary};
use crate::privfs::{FileKind, FsError};

/// The size from which a new blob is made durable by its own `fdatasync` rather than by the
/// batch's `syncfs` (its copy already started its writeback, so the fsync has little left).
pub const OWN_FSYNC_MIN: u64 = 1 << 20;

/// Where the bytes of one input come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Src {
    /// A file the caller opened (its size known).
    File {
        /// Its handle.
        fd: Fd,
        /// Its size.
        size: u64,
    },
    /// A file of a staging area the caller gives away (it discards the area after the
    /// publish): when it must become a new blob it is **adopted** — linked into the store
    /// instead of copied — if it is ours alone (one name, no writer: [`Op::Sole`]), else
    /// copied like [`Src::File`].
    Staged {
        /// Its handle (open read-only).
        fd: Fd,
        /// Its size.
        size: u64,
    },
    /// A reader the caller handed to the executor (size unknown until read).
    Reader {
        /// Its handle.
        fd: Fd,
    },
    /// An existing blob of this store: only its presence and size are checked.
    Blob {
        /// Its digest.
        sha256: Digest,
        /// Its size.
        size: u64,
    },
}

impl Src {
    fn fd(&self) -> Option<Fd> {
        match self {
            Src::File { fd, .. } | Src::Staged { fd, .. } | Src::Reader { fd } => Some(*fd),
            Src::Blob { .. } => None,
        }
    }
}

/// One input of a publish, in name order.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Input {
    /// Entry name (checked by the caller before the publish started).
    pub name: String,
    /// Permission bits to record.
    pub mode: u32,
    /// The bytes.
    pub src: Src,
}

/// The parent checkpoint's manifest, read beside the inputs.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Parent {
    id: CheckpointId,
    fd: Fd,
    parser: ManifestParser,
    pending: Option<Entry>,
    ended: bool,
}

/// What follows closing a blob's temp file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum AfterClose {
    /// Rename it to its digest in `incoming/`.
    Rename,
    /// Drop it: the blob exists already.
    Unlink,
}

/// What follows the check of an existing blob.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum AfterVerify {
    /// The input was hashed in place: reuse the blob.
    Reuse,
    /// The input was copied to a temp file: drop the temp file.
    DropTemp,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum At {
    Fence1(Fence),
    ReadCurrent,
    ParentOpen,
    ParentHash,
    ParentRewind,
    ParentHeader,
    ClearIncoming,
    MkIncoming,
    OpenIncoming,
    NextInput,
    Hint,
    StatCarried,
    HashSource,
    StatHashed,
    VerifyExisting(AfterVerify),
    RewindSource,
    CreateBlob,
    CopyBlob,
    StatCopied,
    // A staged file adopted: made read-only, found ours alone (else its mode given back, and
    // copied), hashed from its start, then linked into `incoming/` under its digest (a file
    // that cannot be linked there has its mode given back, and is copied).
    AdoptChmod,
    AdoptSole,
    AdoptUndoChmod,
    AdoptRewind,
    AdoptHash,
    AdoptLink,
    ChmodBlob,
    FsyncBlob,
    CloseBlob(AfterClose),
    RenameBlob,
    UnlinkBlobTemp,
    CloseSource,
    SpillCreate,
    SpillWrite,
    // After the last input.
    UnchangedCloseManifest,
    UnchangedUnlinkManifest,
    UnchangedCloseIncoming,
    UnchangedClearIncoming,
    ManifestCreate,
    ManifestWrite,
    Batch,
    ManifestClose,
    MoveList,
    MovePage(Fd),
    MoveRename(Fd),
    MoveUnlinkDup(Fd),
    MoveClose(Fd),
    ManifestRename,
    SyncIncoming,
    SyncBlobs,
    SyncManifests,
    CloseIncoming,
    RmIncoming,
    Fence2(Fence),
    CurrentCreate,
    CurrentWrite,
    CurrentFsync,
    CurrentClose,
    CurrentRename,
    CurrentSync,
    /// A shared store's `CURRENT` moves through the cluster's pointer ([`Poll::Replace`]).
    Replace,
    Gc(Box<GcPlan>),
    Done,
}

/// The publish plan. See the module docs for the protocol.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct PublishPlan {
    path: StorePath,
    dirs: StoreFds,
    limits: Limits,
    keep: usize,
    epoch: u64,
    count: u64,
    created_at_ms: u64,
    at: At,
    parent_id: Option<CheckpointId>,
    parent_digest: Option<Digest>,
    parent: Option<Parent>,
    id: Option<CheckpointId>,
    /// The manifest file the open (the parent's) or rename (the new one's) step names.
    mname: String,
    unchanged: bool,
    incoming: Option<Fd>,
    /// The input being stored, its parent entry, what hashing it found, its blob's file name.
    cur: Option<Input>,
    hint: Option<Entry>,
    got: Option<Summary>,
    hex: String,
    /// The blob's temp file in `incoming/` (its handle while open).
    tmp: Option<(Option<Fd>, OsString)>,
    /// Manifest lines not written yet, the hash of every line, and the manifest's temp file.
    out: Vec<u8>,
    out_hash: HashState,
    mtmp: Option<(Option<Fd>, OsString)>,
    manifest_sha256: Option<Digest>,
    /// The page of `incoming/` being moved into `blobs/sha256/`.
    page: Vec<OsString>,
    page_pos: usize,
    current_tmp: Option<(Option<Fd>, OsString)>,
    current_bytes: Vec<u8>,
    seen: u64,
    bytes: u64,
    bytes_written: u64,
    new_blobs: u64,
    /// Blobs that only the batch's `syncfs` makes durable: new ones without an fsync of their
    /// own, and existing ones the current checkpoint does not name (a crashed publish may have
    /// left them there under a name that is not durable yet, and its `incoming/` is gone, so
    /// no directory sync of ours can commit that rename).
    unsynced_blobs: u64,
    /// Blobs of at least this size get their own fsync ([`OWN_FSYNC_MIN`]).
    own_fsync_min: u64,
    /// Whether the blob being stored got its own fsync.
    blob_synced: bool,
    /// Whether the blob being stored is the input itself, adopted (its temp name in `tmp`
    /// has no handle of its own: the input's is used).
    adopted: bool,
    /// Whether the input may not be adopted (it is not ours alone, or cannot be linked).
    adopt_refused: bool,
    /// Files adopted, and staged files copied because they were not ours alone.
    adopted_files: u64,
    refused_files: u64,
    acked: bool,
    /// Whether the second fence (right before `CURRENT` is replaced) passed.
    fenced: bool,
    /// A rollback's parent and id, chosen by the caller instead of read from `CURRENT`.
    over: Option<(Option<CheckpointId>, CheckpointId)>,
    gc_report: Option<GcReport>,
    out_result: Option<Published>,
    /// A store shared by the machines of a cluster (issue 14), with the highest manifest id
    /// listed before the publish (see [`PublishPlan::shared`]).
    shared: Option<Option<CheckpointId>>,
    /// The scratch directory of this publish's new blobs: [`INCOMING_DIR`], or in a shared
    /// store one per epoch (a paused former owner's publish must not clear this one's).
    incoming_dir: String,
}

/// The first file of a temp pair, for messages.
fn tmp_name(t: &Option<(Option<Fd>, OsString)>) -> &OsString {
    &t.as_ref().expect("a temp file is open").1
}

fn tmp_fd(t: &Option<(Option<Fd>, OsString)>) -> Fd {
    t.as_ref()
        .and_then(|(fd, _)| *fd)
        .expect("the temp file is open")
}

fn publish_failed(e: FsError) -> CheckpointError {
    CheckpointError::PublishFailed { source: e }
}

impl PublishPlan {
    /// A publish of `count` inputs (already checked against the limits) by the owner of
    /// `epoch`, at time `created_at_ms`, keeping `keep` checkpoints after it.
    pub fn new(
        path: StorePath,
        dirs: StoreFds,
        limits: Limits,
        keep: usize,
        epoch: u64,
        count: u64,
        created_at_ms: u64,
    ) -> PublishPlan {
        PublishPlan {
            path,
            dirs,
            limits,
            keep,
            epoch,
            count,
            created_at_ms,
            at: At::Fence1(Fence::new(epoch)),
            parent_id: None,
            parent_digest: None,
            parent: None,
            id: None,
            mname: String::new(),
            unchanged: false,
            incoming: None,
            cur: None,
            hint: None,
            got: None,
            hex: String::new(),
            tmp: None,
            out: Vec::new(),
            out_hash: HashState::default(),
            mtmp: None,
            manifest_sha256: None,
            page: Vec::new(),
            page_pos: 0,
            current_tmp: None,
            current_bytes: Vec::new(),
            seen: 0,
            bytes: 0,
            bytes_written: 0,
            new_blobs: 0,
            unsynced_blobs: 0,
            own_fsync_min: OWN_FSYNC_MIN,
            blob_synced: false,
            adopted: false,
            adopt_refused: false,
            adopted_files: 0,
            refused_files: 0,
            acked: false,
            fenced: false,
            over: None,
            gc_report: None,
            out_result: None,
            shared: None,
            incoming_dir: INCOMING_DIR.to_string(),
        }
    }

    /// The outcome, once [`Poll::Done`].
    pub fn output(&self) -> Option<&Published> {
        self.out_result.as_ref()
    }

    /// Whether `CURRENT` was replaced and its directory synced: the publish is acknowledged
    /// (the GC may still be running).
    pub fn acked(&self) -> bool {
        self.acked
    }

    /// The checkpoint this publish writes, once it is known.
    pub fn new_id(&self) -> Option<CheckpointId> {
        self.id
    }

    /// The `CURRENT` this publish writes, once its manifest is written.
    pub fn new_current(&self) -> Option<Current> {
        Some(Current {
            id: self.id?,
            manifest_sha256: self.manifest_sha256?,
        })
    }

    /// Blobs of at least `bytes` get their own fsync instead of the batch's `syncfs` (default
    /// [`OWN_FSYNC_MIN`]); the models set it low so that their small files take both paths.
    #[must_use]
    pub fn own_fsync_from(mut self, bytes: u64) -> PublishPlan {
        self.own_fsync_min = bytes;
        self
    }

    /// A rollback: the new checkpoint gets this parent and id instead of `CURRENT`'s, has no
    /// parent entries to reuse, and is written even when it has no files.
    #[must_use]
    pub fn over(mut self, parent: Option<CheckpointId>, id: CheckpointId) -> PublishPlan {
        self.over = Some((parent, id));
        self
    }

    /// The publish into a store shared by the machines of a cluster (issue 14), whose
    /// `CURRENT` is kept by a pointer the executor reads before the plan (`current`) and moves
    /// when the plan asks ([`Poll::Replace`], answered by [`PublishPlan::replaced`]); `top` is
    /// the highest manifest id the executor listed. The plan then differs in four ways: no
    /// local epoch fence (the pointer's replace is the fence), a new id above every manifest
    /// (a former owner may have written one of the next id), a manifest rename that never
    /// replaces, and a GC that removes only older manifests and never blobs.
    pub fn shared(
        mut self,
        current: Option<Current>,
        top: Option<CheckpointId>,
    ) -> Result<PublishPlan, CheckpointError> {
        self.shared = Some(top);
        self.incoming_dir = format!("{INCOMING_DIR}-{}", self.epoch);
        if let Some((parent, _)) = self.over {
            self.parent_id = parent;
            self.parent_ready()?;
        } else if let Some(cur) = current {
            self.parent_id = Some(cur.id);
            self.parent_digest = Some(cur.manifest_sha256);
            self.mname = cur.id.manifest_file_name();
            self.at = At::ParentOpen;
        } else {
            self.parent_ready()?;
        }
        Ok(self)
    }

    /// The answer to [`Poll::Replace`]: the pointer moved (the publish is acknowledged, the GC
    /// follows), or it refused or failed, which ends the publish.
    pub fn replaced(&mut self, result: Result<(), CheckpointError>) -> Result<(), CheckpointError> {
        assert_eq!(self.at, At::Replace, "a replace was asked for");
        result?;
        self.fenced = true;
        self.acked = true;
        self.start_gc();
        Ok(())
    }

    /// The scratch directory of this publish's new blobs (removed when a publish fails).
    pub fn incoming_dir(&self) -> &str {
        &self.incoming_dir
    }

    /// Staged files adopted as new blobs so far, and staged files copied because another
    /// process still held them open for writing or they had another name.
    pub fn adoption(&self) -> (u64, u64) {
        (self.adopted_files, self.refused_files)
    }

    /// Whether the last fence, right before `CURRENT` is replaced, passed.
    pub fn fenced(&self) -> bool {
        self.fenced
    }

    /// Where the plan is, for the models' descriptions.
    pub fn stage(&self) -> String {
        match &self.at {
            At::Gc(g) => format!("Gc({:?})", g.report()),
            other => format!("{other:?}")
                .split(['(', ' '])
                .next()
                .unwrap_or("?")
                .to_string(),
        }
    }

    /// The next input, or `None` after the last: the answer to [`Poll::Input`].
    pub fn give_input(&mut self, input: Option<Input>) -> Result<(), CheckpointError> {
        assert_eq!(self.at, At::NextInput, "an input was given unasked");
        match input {
            Some(input) => {
                self.cur = Some(input);
                self.hint = None;
                self.got = None;
                self.adopted = false;
                self.adopt_refused = false;
                self.at = At::Hint;
                self.find_hint()
            }
            None => self.inputs_done(),
        }
    }

    fn current_path(&self) -> std::path::PathBuf {
        self.path.current()
    }

    fn max_manifest(&self) -> u64 {
        self.limits
            .max_manifest_bytes
            .max(limits::LEGACY_MAX_MANIFEST_BYTES)
    }

    fn input(&self) -> &Input {
        self.cur.as_ref().expect("an input is being stored")
    }

    fn trusted(&self) -> Option<Digest> {
        self.hint.as_ref().map(|h| h.sha256)
    }

    fn parent_malformed(&self, reason: format::FormatError) -> CheckpointError {
        let p = self.parent.as_ref().expect("a parent");
        CheckpointError::ManifestMalformed {
            path: self.path.manifest(p.id),
            reason,
        }
    }

    /// Walks the parent's entries up to the input's name: its entry of the same name is the
    /// hint (an unchanged file, verified when the owner loaded it).
    fn find_hint(&mut self) -> Result<(), CheckpointError> {
        let name = self.input().name.clone();
        while let Some(p) = self.parent.as_mut() {
            if p.pending.is_none() && !p.ended {
                match p.parser.next_item() {
                    Ok(Parsed::NeedMore) => return Ok(()),
                    Ok(Parsed::Entry(e)) => p.pending = Some(e),
                    Ok(Parsed::End) => p.ended = true,
                    Ok(Parsed::Header(_)) => {}
                    Err(reason) => return Err(self.parent_malformed(reason)),
                }
                continue;
            }
            match &p.pending {
                None => break,
                Some(e) => match e.name.as_bytes().cmp(name.as_bytes()) {
                    std::cmp::Ordering::Less => p.pending = None,
                    std::cmp::Ordering::Equal => {
                        self.hint = p.pending.take();
                        break;
                    }
                    std::cmp::Ordering::Greater => break,
                },
            }
        }
        self.at = match self.input().src {
            Src::Blob { sha256, .. } => {
                self.hex = sha256.to_hex();
                At::StatCarried
            }
            Src::File { size, .. } | Src::Staged { size, .. }
                if self.hint.as_ref().is_some_and(|h| h.size == size) =>
            {
                // Likely unchanged: hash first, and skip the copy if its blob exists.
                At::HashSource
            }
            Src::File { .. } | Src::Staged { .. } | Src::Reader { .. } => self.create_blob(),
        };
        Ok(())
    }

    /// A blob's temp file is created in `incoming/`, which the first new blob creates (a
    /// publish that writes no blob leaves no trace).
    fn create_blob(&mut self) -> At {
        if self.incoming.is_some() {
            self.new_blob()
        } else {
            At::ClearIncoming
        }
    }

    /// With `incoming/` open: a staged file is adopted if it may be, anything else copied.
    fn new_blob(&mut self) -> At {
        if matches!(self.input().src, Src::Staged { .. }) && !self.adopt_refused {
            // It gets its second name, its digest in `incoming/`, only once it was checked and
            // hashed: one directory operation per file fewer than a temp name renamed (issue
            // 11; 100,000 files spent a fifth of their publish in those renames).
            At::AdoptChmod
        } else {
            At::CreateBlob
        }
    }

    /// The handle of the new blob's bytes: its temp file, or the adopted input itself.
    fn blob_fd(&self) -> Fd {
        if self.adopted {
            self.input().src.fd().expect("an adopted file")
        } else {
            tmp_fd(&self.tmp)
        }
    }

    /// After the new blob was made read-only: its own fsync when it is large, then its name.
    fn after_blob_chmod(&mut self) {
        let size = self.got.expect("copied").size;
        self.blob_synced = false;
        self.at = if size >= self.own_fsync_min {
            if crate::mutant::on("own-blob-fsync-skipped") {
                // A planted bug for the mutation table: a large blob counts as
                // synced by its own fsync, which never runs.
                self.blob_synced = true;
                self.after_blob_fsync()
            } else {
                At::FsyncBlob
            }
        } else {
            self.after_blob_fsync()
        };
    }

    /// A copy's temp file is closed before its rename; an adopted file keeps the input's
    /// handle (closed with the input).
    fn after_blob_fsync(&self) -> At {
        if self.adopted {
            At::AdoptLink
        } else {
            At::CloseBlob(AfterClose::Rename)
        }
    }

    /// The input is stored as a blob of this size and digest: its manifest line is added.
    fn stored(&mut self, size: u64, sha256: Digest, written: u64) {
        let input = self.cur.as_ref().expect("an input");
        let entry = Entry {
            name: input.name.clone(),
            size,
            sha256,
            mode: input.mode & 0o777,
        };
        self.unchanged = self.unchanged && self.hint.as_ref() == Some(&entry);
        let line = entry.to_line();
        self.out_hash.update(&line);
        self.out.extend_from_slice(&line);
        self.seen += 1;
        self.bytes = self.bytes.saturating_add(size);
        self.bytes_written += written;
        self.at = if input.src.fd().is_some() {
            At::CloseSource
        } else {
            self.after_input()
        };
    }

    fn after_input(&mut self) -> At {
        self.cur = None;
        self.tmp = None;
        if self.out.len() >= MANIFEST_SPILL {
            if self.mtmp.is_none() {
                At::SpillCreate
            } else {
                At::SpillWrite
            }
        } else {
            At::NextInput
        }
    }

    fn inputs_done(&mut self) -> Result<(), CheckpointError> {
        if self.seen != self.count {
            return Err(CheckpointError::io(
                self.path.dir().join("staging"),
                "walk",
                std::io::Error::other(format!(
                    "the staging area changed while it was published ({} files, then {})",
                    self.count, self.seen
                )),
            ));
        }
        self.at = if self.unchanged {
            if self.mtmp.is_some() {
                At::UnchangedCloseManifest
            } else {
                self.unchanged_incoming()
            }
        } else if self.mtmp.is_none() {
            At::ManifestCreate
        } else {
            At::ManifestWrite
        };
        Ok(())
    }

    /// A blob of the input's digest exists with `size` bytes: reuse it if the current
    /// checkpoint names it, else check its content first; one of another size is refused,
    /// never replaced (that would be a repair).
    fn existing(&mut self, size: u64, then: AfterVerify) -> Result<(), CheckpointError> {
        let got = self.got.expect("the input was hashed");
        let d = Digest(got.sha256);
        if size != got.size {
            return Err(CheckpointError::BlobSizeMismatch {
                path: self.path.blob(&d),
                name: self.input().name.clone(),
                expected: got.size,
                actual: size,
            });
        }
        // A planted bug for the mutation table: an existing blob of the right size is reused
        // without reading it.
        if self.trusted() == Some(d) || crate::mutant::on("dedup-trusts-existing-blob") {
            self.reuse(then);
        } else {
            self.at = At::VerifyExisting(then);
        }
        Ok(())
    }

    /// The adopted file could not be linked into the store: it is the staging area's again
    /// (its mode given back) and copied.
    fn link_refused(&mut self) {
        self.adopted = false;
        self.adopt_refused = true;
        self.got = None;
        self.at = At::AdoptUndoChmod;
    }

    fn reuse(&mut self, then: AfterVerify) {
        match then {
            AfterVerify::Reuse => {
                let got = self.got.expect("hashed");
                self.stored(got.size, Digest(got.sha256), 0);
            }
            // An adopted file was given no second name: its first, in the staging area, stays.
            AfterVerify::DropTemp if self.adopted => {
                let got = self.got.expect("hashed");
                self.stored(got.size, Digest(got.sha256), 0);
            }
            AfterVerify::DropTemp => self.at = At::CloseBlob(AfterClose::Unlink),
        }
    }

    fn manifest_done(&mut self) {
        self.manifest_sha256 = Some(self.out_hash.digest());
        // A planted bug for the mutation table: the blobs are given their names before the
        // batch makes their data durable.
        self.at = if crate::mutant::on("blobs-named-before-batch-sync") && self.new_blobs > 0 {
            At::MoveList
        } else if crate::mutant::on("batch-sync-skipped") && self.new_blobs > 0 {
            // A planted bug for the mutation table: the one `syncfs` that makes the new blobs
            // and the manifest durable is skipped.
            At::ManifestClose
        } else {
            At::Batch
        };
    }

    fn after_batch(&mut self) {
        self.at = if crate::mutant::on("blobs-named-before-batch-sync") && self.new_blobs > 0 {
            At::ManifestRename
        } else if self.new_blobs > 0 {
            At::MoveList
        } else {
            At::ManifestRename
        };
    }

    fn after_move(&mut self) {
        self.at = if crate::mutant::on("blobs-named-before-batch-sync") {
            At::Batch
        } else {
            At::ManifestRename
        };
    }

    fn current(&self) -> Current {
        Current {
            id: self.id.expect("an id"),
            manifest_sha256: self.manifest_sha256.expect("the manifest is written"),
        }
    }

    fn finish(&mut self, gc: GcReport) {
        let id = self.id.expect("an id");
        self.out_result = Some(Published::New {
            checkpoint: CheckpointSummary {
                id,
                parent: self.parent_id,
                epoch: self.epoch,
                created_at_ms: self.created_at_ms,
                files: self.count,
                bytes: self.bytes,
                manifest_sha256: self.manifest_sha256.expect("written"),
            },
            bytes_written: self.bytes_written,
            gc,
        });
        self.at = At::Done;
    }

    fn start_gc(&mut self) {
        let id = self.id.expect("an id");
        let gc = GcPlan::new(self.path.clone(), self.dirs, self.limits, id, self.keep);
        self.at = At::Gc(Box::new(if self.shared.is_some() {
            gc.shared(self.epoch)
        } else {
            gc
        }));
    }

    fn after_current_rename(&mut self) {
        if crate::mutant::on("current-rename-not-synced") {
            // A planted bug for the mutation table: acknowledged without the directory fsync
            // that makes the new CURRENT durable.
            self.acked = true;
            self.start_gc();
        } else if crate::mutant::on("gc-before-current-sync") {
            // A planted bug for the mutation table: the GC runs before that fsync.
            self.start_gc();
        } else {
            self.at = At::CurrentSync;
        }
    }

    /// The GC is over: the publish too (or, with a planted bug, CURRENT's fsync comes now).
    fn gc_done(&mut self, report: GcReport) {
        if crate::mutant::on("gc-before-current-sync") {
            self.gc_report = Some(report);
            self.at = At::CurrentSync;
        } else {
            self.finish(report);
        }
    }
}

impl Plan for PublishPlan {
    fn poll(&self) -> Poll<'_> {
        let d = self.dirs;
        let op = |label, op| Poll::Op(Step::new(label, op));
        match &self.at {
            At::Fence1(f) | At::Fence2(f) => Poll::Op(f.step("publish.fence")),
            At::ReadCurrent => op(
                "publish",
                Op::ReadFile {
                    dir: d.root,
                    name: os(CURRENT_FILE),
                    max: CURRENT_LEN as u64,
                },
            ),
            At::ParentOpen => op(
                "publish",
                Op::Open {
                    dir: d.manifests,
                    name: os(&self.mname),
                    check: Check::Private,
                },
            ),
            At::ParentHash => op(
                "publish",
                Op::Hash {
                    fd: self.parent.as_ref().expect("a parent").fd,
                    limit: Some(self.max_manifest() + 1),
                },
            ),
            At::ParentRewind => op(
                "publish",
                Op::Rewind {
                    fd: self.parent.as_ref().expect("a parent").fd,
                },
            ),
            At::ParentHeader | At::Hint => op(
                "publish",
                Op::Read {
                    fd: self.parent.as_ref().expect("a parent").fd,
                    max: PARSE_CHUNK,
                },
            ),
            At::ClearIncoming | At::UnchangedClearIncoming => op(
                "publish.incoming",
                Op::RemoveTree {
                    dir: d.root,
                    name: os(&self.incoming_dir),
                },
            ),
            At::MkIncoming => op(
                "publish.incoming",
                Op::Mkdir {
                    dir: d.root,
                    name: os(&self.incoming_dir),
                },
            ),
            At::OpenIncoming => op(
                "publish.incoming",
                Op::OpenDir {
                    dir: d.root,
                    name: os(&self.incoming_dir),
                    any_mode: false,
                },
            ),
            At::NextInput => Poll::Input,
            At::StatCarried | At::StatHashed | At::StatCopied => op(
                "publish.blob",
                Op::Stat {
                    dir: d.blobs,
                    name: os(&self.hex),
                },
            ),
            At::HashSource => op(
                "publish.blob",
                Op::Hash {
                    fd: self.input().src.fd().expect("a file"),
                    limit: None,
                },
            ),
            At::VerifyExisting(_) => op(
                "publish.blob",
                Op::HashFile {
                    dir: d.blobs,
                    name: os(&self.hex),
                    limit: Some(self.got.expect("hashed").size.saturating_add(1)),
                },
            ),
            At::RewindSource => op(
                "publish.blob",
                Op::Rewind {
                    fd: self.input().src.fd().expect("a file"),
                },
            ),
            At::CreateBlob => op(
                "publish.blob",
                Op::CreateTemp {
                    dir: self.incoming.expect("incoming is open"),
                },
            ),
            At::CopyBlob => op(
                "publish.blob",
                Op::Copy {
                    to: tmp_fd(&self.tmp),
                    from: self.input().src.fd().expect("a file or reader"),
                    limit: None,
                    writeback: true,
                },
            ),
            At::AdoptLink => op(
                "publish.adopt",
                Op::LinkFd {
                    fd: self.input().src.fd().expect("a staged file"),
                    to_dir: self.incoming.expect("incoming is open"),
                    to: os(&self.hex),
                },
            ),
            At::AdoptChmod => op(
                "publish.adopt",
                // Read-only before the check below, so that no new open for writing (but
                // root's) can follow it.
                Op::Chmod {
                    fd: self.input().src.fd().expect("a staged file"),
                    mode: 0o400,
                },
            ),
            At::AdoptSole => op(
                "publish.adopt",
                Op::Sole {
                    fd: self.input().src.fd().expect("a staged file"),
                    links: 1,
                },
            ),
            At::AdoptUndoChmod => op(
                "publish.adopt",
                Op::Chmod {
                    fd: self.input().src.fd().expect("a staged file"),
                    mode: self.input().mode & 0o777,
                },
            ),
            At::AdoptRewind => op(
                "publish.adopt",
                Op::Rewind {
                    fd: self.input().src.fd().expect("a staged file"),
                },
            ),
            At::AdoptHash => op(
                "publish.adopt",
                Op::Hash {
                    fd: self.input().src.fd().expect("a staged file"),
                    limit: None,
                },
            ),
            At::ChmodBlob => op(
                "publish.blob",
                // Blobs are read-only even to us, so no later open for writing can change
                // them by accident.
                Op::Chmod {
                    fd: tmp_fd(&self.tmp),
                    mode: 0o400,
                },
            ),
            At::FsyncBlob => op(
                "publish.blob",
                Op::Fsync {
                    fd: self.blob_fd(),
                    data_only: true,
                },
            ),
            At::CloseBlob(_) => op(
                "publish.blob",
                Op::Close {
                    fd: tmp_fd(&self.tmp),
                },
            ),
            At::RenameBlob => op(
                "publish.blob",
                Op::Rename {
                    from_dir: self.incoming.expect("open"),
                    from: tmp_name(&self.tmp),
                    to_dir: self.incoming.expect("open"),
                    to: os(&self.hex),
                    noreplace: true,
                },
            ),
            At::UnlinkBlobTemp => op(
                "publish.blob",
                Op::Unlink {
                    dir: self.incoming.expect("open"),
                    name: tmp_name(&self.tmp),
                },
            ),
            At::CloseSource => op(
                "publish.blob",
                Op::Close {
                    fd: self.input().src.fd().expect("a handle"),
                },
            ),
            At::SpillCreate | At::ManifestCreate => {
                op("publish.manifest", Op::CreateTemp { dir: d.manifests })
            }
            At::SpillWrite | At::ManifestWrite => op(
                "publish.manifest",
                Op::Write {
                    fd: tmp_fd(&self.mtmp),
                    bytes: &self.out,
                },
            ),
            At::UnchangedCloseManifest | At::ManifestClose => op(
                "publish.manifest",
                Op::Close {
                    fd: tmp_fd(&self.mtmp),
                },
            ),
            At::UnchangedUnlinkManifest => op(
                "publish.manifest",
                Op::Unlink {
                    dir: d.manifests,
                    name: tmp_name(&self.mtmp),
                },
            ),
            At::UnchangedCloseIncoming | At::CloseIncoming => op(
                "publish.incoming",
                Op::Close {
                    fd: self.incoming.expect("open"),
                },
            ),
            At::Batch => {
                if self.unsynced_blobs > 0 {
                    op("publish.batch", Op::SyncFs { dir: d.root })
                } else {
                    op(
                        "publish.manifest",
                        Op::Fsync {
                            fd: tmp_fd(&self.mtmp),
                            data_only: false,
                        },
                    )
                }
            }
            At::MoveList => op(
                "publish.move",
                Op::List {
                    dir: self.incoming.expect("open"),
                },
            ),
            At::MovePage(l) => op(
                "publish.move",
                Op::ListNext {
                    list: *l,
                    max: LIST_PAGE,
                },
            ),
            At::MoveRename(_) => op(
                "publish.move",
                Op::Rename {
                    from_dir: self.incoming.expect("open"),
                    from: &self.page[self.page_pos],
                    to_dir: d.blobs,
                    to: &self.page[self.page_pos],
                    noreplace: true,
                },
            ),
            At::MoveUnlinkDup(_) => op(
                "publish.move",
                Op::Unlink {
                    dir: self.incoming.expect("open"),
                    name: &self.page[self.page_pos],
                },
            ),
            At::MoveClose(l) => op("publish.move", Op::Close { fd: *l }),
            At::ManifestRename => op(
                "publish.manifest",
                Op::Rename {
                    from_dir: d.manifests,
                    from: tmp_name(&self.mtmp),
                    to_dir: d.manifests,
                    to: os(&self.mname),
                    // In a dir of its own, a leftover manifest of this id can only be the
                    // orphan of a crashed publish (CURRENT names its parent), so replacing it
                    // is safe. In a shared store another machine may be writing this very id
                    // (a former owner that lost its lease): never replaced, the publish fails.
                    noreplace: self.shared.is_some(),
                },
            ),
            At::SyncIncoming => op(
                "publish.incoming",
                Op::SyncDir {
                    dir: self.incoming.expect("open"),
                },
            ),
            At::SyncBlobs => op("publish.blob", Op::SyncDir { dir: d.blobs }),
            At::SyncManifests => op("publish.manifest", Op::SyncDir { dir: d.manifests }),
            At::RmIncoming => op(
                "publish.incoming",
                Op::Rmdir {
                    dir: d.root,
                    name: os(&self.incoming_dir),
                },
            ),
            At::CurrentCreate => op("publish.current", Op::CreateTemp { dir: d.root }),
            At::CurrentWrite => op(
                "publish.current",
                Op::Write {
                    fd: tmp_fd(&self.current_tmp),
                    bytes: &self.current_bytes,
                },
            ),
            At::CurrentFsync => op(
                "publish.current",
                Op::Fsync {
                    fd: tmp_fd(&self.current_tmp),
                    data_only: false,
                },
            ),
            At::CurrentClose => op(
                "publish.current",
                Op::Close {
                    fd: tmp_fd(&self.current_tmp),
                },
            ),
            At::CurrentRename => op(
                "publish.current",
                Op::Rename {
                    from_dir: d.root,
                    from: tmp_name(&self.current_tmp),
                    to_dir: d.root,
                    to: os(CURRENT_FILE),
                    noreplace: false,
                },
            ),
            At::CurrentSync => op("publish.current", Op::SyncDir { dir: d.root }),
            At::Replace => Poll::Replace(self.current()),
            At::Gc(g) => g.poll(),
            At::Done => Poll::Done,
        }
    }

    fn handle(&mut self, r: Result<Done, FsError>) -> Result<(), CheckpointError> {
        let at = self.at.clone();
        match at {
            At::Fence1(mut f) => {
                if !f.handle(r, &self.path)? {
                    self.at = At::Fence1(f);
                } else if let Some((parent, _)) = self.over {
                    self.parent_id = parent;
                    self.parent_ready()?;
                } else {
                    self.at = At::ReadCurrent;
                }
            }
            At::ReadCurrent => {
                let path = self.current_path();
                match r {
                    Ok(Done::Data(bytes)) => {
                        let cur = match Current::parse(&bytes) {
                            Ok(c) => c,
                            Err(format::FormatError::Empty) => {
                                return Err(CheckpointError::CurrentEmpty { path });
                            }
                            Err(reason) => {
                                return Err(CheckpointError::CurrentMalformed { path, reason });
                            }
                        };
                        self.parent_id = Some(cur.id);
                        self.parent_digest = Some(cur.manifest_sha256);
                        self.mname = cur.id.manifest_file_name();
                        self.at = At::ParentOpen;
                    }
                    Ok(other) => panic!("a read returns data, not {other:?}"),
                    Err(FsError::NotFound { .. }) => self.parent_ready()?,
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
                }
            }
            At::ParentOpen => {
                let id = self.parent_id.expect("a parent");
                let fd = match r {
                    Ok(d) => fd_of(&d),
                    Err(FsError::NotFound { .. }) => {
                        return Err(CheckpointError::ManifestMissing {
                            path: self.path.manifest(id),
                            id,
                        });
                    }
                    Err(e) => return Err(e.into()),
                };
                self.parent = Some(Parent {
                    id,
                    fd,
                    parser: ManifestParser::new(self.limits),
                    pending: None,
                    ended: false,
                });
                self.at = At::ParentHash;
            }
            At::ParentHash => {
                let got = hashed(r)?;
                let expected = self.parent_digest.expect("a parent");
                if Digest(got.sha256) != expected {
                    return Err(CheckpointError::ManifestDigestMismatch {
                        path: self.path.manifest(self.parent_id.expect("a parent")),
                        expected,
                        actual: Digest(got.sha256),
                    });
                }
                self.at = At::ParentRewind;
            }
            At::ParentRewind => {
                r?;
                self.at = At::ParentHeader;
            }
            At::ParentHeader => {
                let chunk = data(r?);
                let p = self.parent.as_mut().expect("a parent");
                p.parser.feed(&chunk);
                match p.parser.next_item() {
                    Ok(Parsed::NeedMore) => {}
                    Ok(Parsed::Header(h)) => {
                        self.unchanged = h.files == self.count;
                        self.parent_ready()?;
                    }
                    Ok(Parsed::Entry(_) | Parsed::End) => {
                        unreachable!("the parser gives the header first")
                    }
                    Err(reason) => return Err(self.parent_malformed(reason)),
                }
            }
            At::ClearIncoming => {
                r.map_err(publish_failed)?;
                self.at = At::MkIncoming;
            }
            At::MkIncoming => {
                r.map_err(publish_failed)?;
                self.at = At::OpenIncoming;
            }
            At::OpenIncoming => {
                self.incoming = Some(fd_of(&r.map_err(publish_failed)?));
                self.at = self.new_blob();
            }
            At::NextInput => unreachable!("inputs come through give_input"),
            At::Hint => {
                let chunk = data(r?);
                let p = self.parent.as_mut().expect("a parent");
                p.parser.feed(&chunk);
                self.find_hint()?;
            }
            At::StatCarried => {
                let Src::Blob { sha256, size } = self.input().src else {
                    unreachable!("a carried blob")
                };
                match r? {
                    Done::Stat(Some(m)) if m.kind == FileKind::Regular && m.size == size => {
                        self.stored(size, sha256, 0);
                    }
                    Done::Stat(_) => {
                        return Err(CheckpointError::CarryMissing {
                            path: self.path.blob(&sha256),
                            name: self.input().name.clone(),
                        });
                    }
                    other => panic!("a stat returns metadata, not {other:?}"),
                }
            }
            At::HashSource => {
                let got = hashed(r).map_err(|e| self.source_error(e, "read"))?;
                self.got = Some(got);
                self.hex = Digest(got.sha256).to_hex();
                self.at = At::StatHashed;
            }
            At::StatHashed => match r? {
                Done::Stat(None) => self.at = At::RewindSource,
                Done::Stat(Some(m)) => self.existing(m.size, AfterVerify::Reuse)?,
                other => panic!("a stat returns metadata, not {other:?}"),
            },
            At::VerifyExisting(then) => {
                let got = self.got.expect("hashed");
                let d = Digest(got.sha256);
                let e = Entry {
                    name: self.input().name.clone(),
                    size: got.size,
                    sha256: d,
                    mode: 0,
                };
                let found = match r {
                    Ok(done) => hashed(Ok(done))?,
                    Err(FsError::NotFound { .. }) => {
                        return Err(CheckpointError::BlobMissing {
                            path: self.path.blob(&d),
                            name: e.name,
                        });
                    }
                    Err(err) => return Err(err.into()),
                };
                if let Some(m) = check_blob(&e, &found) {
                    let path = self.path.blob(&d);
                    return Err(match m {
                        Mismatch::Size { expected, actual } => CheckpointError::BlobSizeMismatch {
                            path,
                            name: e.name,
                            expected,
                            actual,
                        },
                        Mismatch::Digest { actual, .. } => CheckpointError::BlobDigestMismatch {
                            path,
                            name: e.name,
                            actual,
                        },
                    });
                }
                // Its bytes are right, but its name may not be durable: the batch must be a
                // `syncfs`.
                self.unsynced_blobs += 1;
                self.reuse(then);
            }
            At::RewindSource => {
                r.map_err(|e| self.source_error(e.into(), "seek"))?;
                self.at = self.create_blob();
            }
            At::CreateBlob => match r.map_err(publish_failed)? {
                Done::Created { fd, name } => {
                    self.tmp = Some((Some(fd), name));
                    self.at = At::CopyBlob;
                }
                other => panic!("a create returns a handle, not {other:?}"),
            },
            At::CopyBlob => {
                let got = match r {
                    Ok(d) => hashed(Ok(d))?,
                    // A failure to read the input names the input; one to write, the store.
                    Err(e) if e.path().starts_with(self.path.dir()) => {
                        return Err(publish_failed(e));
                    }
                    Err(e) => return Err(self.source_error(e.into(), "read")),
                };
                self.got = Some(got);
                self.hex = Digest(got.sha256).to_hex();
                self.at = At::StatCopied;
            }
            At::StatCopied => match r? {
                Done::Stat(None) if self.adopted => self.after_blob_chmod(),
                Done::Stat(None) => self.at = At::ChmodBlob,
                Done::Stat(Some(m)) => self.existing(m.size, AfterVerify::DropTemp)?,
                other => panic!("a stat returns metadata, not {other:?}"),
            },
            At::AdoptLink => match r {
                Ok(_) => {
                    let got = self.got.expect("hashed");
                    self.new_blobs += 1;
                    if !self.blob_synced {
                        self.unsynced_blobs += 1;
                    }
                    self.adopted_files += 1;
                    self.stored(got.size, Digest(got.sha256), got.size);
                }
                // The same bytes came earlier in this publish; theirs is as good as ours.
                Err(FsError::AlreadyExists { .. }) => {
                    let got = self.got.expect("hashed");
                    self.stored(got.size, Digest(got.sha256), 0);
                }
                // Not linkable here (another filesystem, no hard links, not permitted, or no
                // /proc to link the handle through: `NotFound`): its mode is given back and it
                // is copied.
                Err(FsError::NotFound { .. }) => self.link_refused(),
                Err(FsError::Io { source, .. }) if not_linkable(&source) => self.link_refused(),
                Err(e) => return Err(publish_failed(e)),
            },
            At::AdoptChmod => {
                r.map_err(publish_failed)?;
                self.at = At::AdoptSole;
            }
            At::AdoptSole => match r.map_err(publish_failed)? {
                // A planted bug for the mutation table: a file another process still holds
                // open for writing is adopted all the same.
                Done::Sole(true) => self.at = At::AdoptRewind,
                Done::Sole(false) if crate::mutant::on("adopt-ignores-writer") => {
                    self.at = At::AdoptRewind;
                }
                Done::Sole(false) => {
                    self.refused_files += 1;
                    self.adopt_refused = true;
                    self.at = At::AdoptUndoChmod;
                }
                other => panic!("a sole check returns a verdict, not {other:?}"),
            },
            At::AdoptUndoChmod => {
                r.map_err(publish_failed)?;
                // Copied from its start (a file whose link failed was read by its hash).
                self.at = At::RewindSource;
            }
            At::AdoptRewind => {
                r.map_err(|e| self.source_error(e.into(), "seek"))?;
                self.at = At::AdoptHash;
            }
            At::AdoptHash => {
                // From here on the file is the blob: its bytes are hashed after the check,
                // so the digest is of the bytes no writer can change any more.
                let got = hashed(r).map_err(|e| self.source_error(e, "read"))?;
                self.adopted = true;
                self.got = Some(got);
                self.hex = Digest(got.sha256).to_hex();
                self.at = At::StatCopied;
            }
            At::ChmodBlob => {
                r?;
                self.after_blob_chmod();
            }
            At::FsyncBlob => {
                r.map_err(publish_failed)?;
                self.blob_synced = true;
                self.at = self.after_blob_fsync();
            }
            At::CloseBlob(then) => {
                r?;
                if let Some((fd, _)) = &mut self.tmp {
                    *fd = None;
                }
                self.at = match then {
                    AfterClose::Rename => At::RenameBlob,
                    AfterClose::Unlink => At::UnlinkBlobTemp,
                };
            }
            At::RenameBlob => match r {
                Ok(_) => {
                    let got = self.got.expect("copied");
                    self.new_blobs += 1;
                    if !self.blob_synced {
                        self.unsynced_blobs += 1;
                    }
                    if self.adopted {
                        self.adopted_files += 1;
                    }
                    self.tmp = None;
                    self.stored(got.size, Digest(got.sha256), got.size);
                }
                // The same bytes came earlier in this publish; theirs is as good as ours.
                Err(FsError::AlreadyExists { .. }) => self.at = At::UnlinkBlobTemp,
                Err(e) => return Err(publish_failed(e)),
            },
            At::UnlinkBlobTemp => {
                r.map_err(publish_failed)?;
                let got = self.got.expect("copied");
                self.tmp = None;
                self.stored(got.size, Digest(got.sha256), 0);
            }
            At::CloseSource => {
                r?;
                self.at = self.after_input();
            }
            At::SpillCreate | At::ManifestCreate => match r.map_err(publish_failed)? {
                Done::Created { fd, name } => {
                    self.mtmp = Some((Some(fd), name));
                    self.at = if self.at == At::SpillCreate {
                        At::SpillWrite
                    } else {
                        At::ManifestWrite
                    };
                }
                other => panic!("a create returns a handle, not {other:?}"),
            },
            At::SpillWrite => {
                r.map_err(publish_failed)?;
                self.out.clear();
                self.at = At::NextInput;
            }
            At::UnchangedCloseManifest => {
                r?;
                self.at = At::UnchangedUnlinkManifest;
            }
            At::UnchangedUnlinkManifest => {
                r.map_err(publish_failed)?;
                self.mtmp = None;
                self.at = self.unchanged_incoming();
            }
            At::UnchangedCloseIncoming => {
                r?;
                self.at = At::UnchangedClearIncoming;
            }
            At::UnchangedClearIncoming => {
                r.map_err(publish_failed)?;
                self.incoming = None;
                self.at = self.unchanged_incoming();
            }
            At::ManifestWrite => {
                r.map_err(publish_failed)?;
                self.out.clear();
                self.manifest_done();
            }
            At::Batch => {
                r.map_err(publish_failed)?;
                self.at = At::ManifestClose;
            }
            At::ManifestClose => {
                r?;
                if let Some((fd, _)) = &mut self.mtmp {
                    *fd = None;
                }
                self.after_batch();
            }
            At::MoveList => self.at = At::MovePage(fd_of(&r.map_err(publish_failed)?)),
            At::MovePage(l) => {
                let Done::Entries(entries) = r.map_err(publish_failed)? else {
                    panic!("a listing returns entries")
                };
                if entries.is_empty() {
                    self.page.clear();
                    self.at = At::MoveClose(l);
                } else {
                    self.page = entries.into_iter().map(|(n, _)| n).collect();
                    self.page_pos = 0;
                    self.at = At::MoveRename(l);
                }
            }
            At::MoveRename(l) => match r {
                Ok(_) => self.next_move(l),
                // Someone stored the same bytes meanwhile; theirs is as good as ours.
                Err(FsError::AlreadyExists { .. }) => self.at = At::MoveUnlinkDup(l),
                Err(e) => return Err(publish_failed(e)),
            },
            At::MoveUnlinkDup(l) => {
                r.map_err(publish_failed)?;
                self.next_move(l);
            }
            At::MoveClose(_) => {
                r?;
                self.after_move();
            }
            At::ManifestRename => {
                r.map_err(publish_failed)?;
                self.mtmp = None;
                self.at = if self.incoming.is_some() {
                    At::SyncIncoming
                } else {
                    At::SyncBlobs
                };
            }
            At::SyncIncoming => {
                r.map_err(publish_failed)?;
                self.at = At::SyncBlobs;
            }
            At::SyncBlobs => {
                r.map_err(publish_failed)?;
                // A planted bug for the mutation table: the manifests' directory is not synced.
                self.at = if crate::mutant::on("manifest-dir-not-synced") {
                    self.after_syncs()
                } else {
                    At::SyncManifests
                };
            }
            At::SyncManifests => {
                r.map_err(publish_failed)?;
                self.at = self.after_syncs();
            }
            At::CloseIncoming => {
                r?;
                self.at = At::RmIncoming;
            }
            At::RmIncoming => {
                match r {
                    // In a shared store, a newer owner's GC removes the `incoming-EPOCH/` of a
                    // lower epoch (spec/cluster.md): this owner lost its lease while paused
                    // here, with every blob moved already; the pointer's fence refuses it next.
                    Err(FsError::NotFound { .. }) if self.shared.is_some() => {}
                    // Not empty would mean a blob was left out of `blobs/`: refused.
                    r => {
                        r.map_err(publish_failed)?;
                    }
                }
                self.incoming = None;
                self.at = self.before_current();
            }
            At::Fence2(mut f) => {
                if f.handle(r, &self.path)? {
                    self.fenced = true;
                    self.current_bytes = self.current().to_bytes();
                    self.at = At::CurrentCreate;
                } else {
                    self.at = At::Fence2(f);
                }
            }
            At::CurrentCreate => match r.map_err(publish_failed)? {
                Done::Created { fd, name } => {
                    self.current_tmp = Some((Some(fd), name));
                    self.at = At::CurrentWrite;
                }
                other => panic!("a create returns a handle, not {other:?}"),
            },
            At::CurrentWrite => {
                r.map_err(publish_failed)?;
                self.at = At::CurrentFsync;
            }
            At::CurrentFsync => {
                r.map_err(publish_failed)?;
                self.at = At::CurrentClose;
            }
            At::CurrentClose => {
                r?;
                if let Some((fd, _)) = &mut self.current_tmp {
                    *fd = None;
                }
                self.at = At::CurrentRename;
            }
            At::CurrentRename => {
                r.map_err(publish_failed)?;
                self.current_tmp = None;
                self.after_current_rename();
            }
            At::CurrentSync => {
                r.map_err(|source| CheckpointError::CurrentSyncFailed {
                    new: self.id.expect("an id"),
                    source,
                })?;
                self.acked = true;
                match self.gc_report.take() {
                    // The GC already ran (a planted bug); the publish ends here.
                    Some(gc) => self.finish(gc),
                    None => self.start_gc(),
                }
            }
            At::Replace => unreachable!("a replace is answered through `replaced`"),
            At::Gc(mut g) => match g.handle(r) {
                Ok(()) if g.poll() == Poll::Done => self.gc_done(g.report().clone()),
                Ok(()) => self.at = At::Gc(g),
                // The publish is durable all the same; the next GC starts over.
                Err(e) => self.gc_done(g.failed(&e)),
            },
            At::Done => {}
        }
        Ok(())
    }
}

impl PublishPlan {
    /// After `CURRENT` was read and its manifest's header: the new id, then `incoming/`.
    fn parent_ready(&mut self) -> Result<(), CheckpointError> {
        if self.count == 0 && self.over.is_none() {
            self.out_result = Some(Published::Unchanged {
                current: self.parent_id,
            });
            self.at = At::Done;
            return Ok(());
        }
        let id = match (self.over, self.parent_id) {
            (Some((_, id)), _) => id,
            (None, None) => CheckpointId::FIRST,
            (None, Some(p)) => p.next().ok_or_else(|| CheckpointError::IdsExhausted {
                path: self.current_path(),
            })?,
        };
        // A shared store may hold a manifest of that id already, written by a former owner
        // that lost its lease: it is never replaced; the next free id is used.
        let id = match self.shared {
            Some(Some(top)) if self.over.is_none() && top >= id => {
                top.next().ok_or_else(|| CheckpointError::IdsExhausted {
                    path: self.current_path(),
                })?
            }
            _ => id,
        };
        self.id = Some(id);
        self.mname = id.manifest_file_name();
        let header = Header {
            format: format::MANIFEST_FORMAT,
            id,
            parent: self.parent_id,
            epoch: self.epoch,
            created_at_ms: self.created_at_ms,
            files: self.count,
        };
        let line = header.to_line();
        self.out_hash.update(&line);
        self.out = line;
        self.at = At::NextInput;
        Ok(())
    }

    /// The unchanged publish's way out: `incoming/` removed if it was made, then done.
    fn unchanged_incoming(&mut self) -> At {
        if self.incoming.is_some() {
            At::UnchangedCloseIncoming
        } else {
            self.out_result = Some(Published::Unchanged {
                current: self.parent_id,
            });
            At::Done
        }
    }

    /// After the directories are synced: `incoming/` closed and removed if it was made, then
    /// the second fence.
    fn after_syncs(&self) -> At {
        if self.incoming.is_some() {
            At::CloseIncoming
        } else {
            self.before_current()
        }
    }

    /// The step that makes the checkpoint visible: the second fence and the `CURRENT` file,
    /// or in a shared store the pointer's guarded replace (the pointer is its own fence).
    fn before_current(&self) -> At {
        if self.shared.is_some() {
            At::Replace
        } else {
            At::Fence2(Fence::new(self.epoch))
        }
    }

    fn next_move(&mut self, list: Fd) {
        self.page_pos += 1;
        self.at = if self.page_pos < self.page.len() {
            At::MoveRename(list)
        } else {
            At::MovePage(list)
        };
    }

    /// A failure reading an input names the input.
    fn source_error(&self, e: CheckpointError, op: &'static str) -> CheckpointError {
        match e {
            CheckpointError::Fs(FsError::Io { source, path, .. }) => {
                CheckpointError::io(path, op, source)
            }
            other => other,
        }
    }
}

fn data(d: Done) -> Vec<u8> {
    match d {
        Done::Data(b) => b,
        other => panic!("a read returns data, not {other:?}"),
    }
}

/// Whether a hard link failed because this file cannot be linked there (the publish copies it
/// instead), rather than because the store failed.
fn not_linkable(e: &std::io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EXDEV | libc::EPERM | libc::EACCES | libc::EMLINK | libc::EOPNOTSUPP)
    )
}

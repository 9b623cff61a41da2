//! The store itself: open, load, verify, publish, garbage-collect, staging areas and views.
//! See the module docs of [`crate::checkpoint`] for the layout and the protocols.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{BufReader, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use rustix::fs::Mode;

use super::error::CheckpointError;
use super::format::{self, CURRENT_LEN, CheckpointId, Current, Digest, Entry, Header};
use super::gc::{self, DEFAULT_KEEP, Seen};
use super::hash::{self, HashingReader, Mismatch, VerifyingReader};
use super::limits::{self, Limits};
use super::tree;
use super::{
    BLOBS_DIR, CURRENT_FILE, FAILED_DIR, MANIFESTS_DIR, SHA256_DIR, STAGING_DIR, STORE_DIR,
    VIEWS_DIR,
};
use crate::privfs::{Dir, FileKind, FsError, Links, StateDir};

/// Bytes written between two writeback kicks of a blob being published.
const WRITEBACK_KICK: u64 = 8 << 20;

/// Where CURRENT lives when it is not the store's own file: a cluster (issue 14, the etcd
/// lease), whose pointer moves only while the publisher's lease holds. The store then lives in
/// a directory several machines share, and its publish differs in three ways: the fence is the
/// pointer's (the local epoch file is not consulted); a manifest never replaces an existing
/// file (a stale owner may have written one of the same id: the next free id is used); and the
/// GC removes only manifests older than the new checkpoint, never blobs (a paused former owner
/// or the next owner may be writing beside it).
pub trait CurrentPointer: std::fmt::Debug {
    /// Reads CURRENT (linearizably); `None` when there is no checkpoint yet.
    fn read(&self) -> Result<Option<Current>, CheckpointError>;
    /// Moves CURRENT to `new`, only while the lease of `epoch` holds; otherwise
    /// [`CheckpointError::Fenced`] and nothing changed.
    fn replace(&self, new: &Current, epoch: u64) -> Result<(), CheckpointError>;
    /// Where CURRENT lives, for messages.
    fn describe(&self) -> String;
}

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

impl Checkpoint {
    /// What it is without its entries.
    pub fn summary(&self) -> CheckpointSummary {
        CheckpointSummary {
            id: self.id,
            parent: self.parent,
            epoch: self.epoch,
            created_at_ms: self.created_at_ms,
            files: self.entries.len() as u64,
            bytes: self.total_size(),
            manifest_sha256: self.manifest_sha256,
        }
    }
}

/// A verified checkpoint without its list of files: what a streaming load or a publish
/// returns, in memory that does not grow with the number of files.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CheckpointSummary {
    /// Its id.
    pub id: CheckpointId,
    /// The checkpoint that was current when it was published.
    pub parent: Option<CheckpointId>,
    /// The lease epoch of its publisher.
    pub epoch: u64,
    /// Publication time, milliseconds since the Unix epoch.
    pub created_at_ms: u64,
    /// Number of files.
    pub files: u64,
    /// Total bytes of all files.
    pub bytes: u64,
    /// sha256 of its manifest file, as `CURRENT` records it.
    pub manifest_sha256: Digest,
}

/// What a best-effort read-only check found (for `tenure verify` and `status`).
#[derive(Debug)]
pub struct VerifyReport {
    /// What [`CheckpointStore::load_summary`] returns.
    pub current: Result<Option<CheckpointSummary>, CheckpointError>,
    /// The newest checkpoint older than the current one (or any, when `CURRENT` is unreadable)
    /// whose manifest parses and whose blobs all verify. Evidence for an operator only: nothing
    /// ever loads it in place of the current one.
    pub newest_valid_older: Option<CheckpointSummary>,
}

/// One checkpoint of the store as [`CheckpointStore::list`] found it (read-only).
#[derive(Debug)]
pub struct Listed {
    /// Its id (from its manifest's file name).
    pub id: CheckpointId,
    /// Whether `CURRENT` names it.
    pub current: bool,
    /// Its manifest's header, when that much of the manifest could be read.
    pub header: Option<Header>,
    /// Its full verification (the manifest's digest when `CURRENT` names it, every rule, every
    /// blob's size and digest): what a load of it would give.
    pub verified: Result<CheckpointSummary, CheckpointError>,
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
        checkpoint: CheckpointSummary,
        /// Bytes of blobs written (files whose blob already existed are not counted).
        bytes_written: u64,
        /// What the GC afterwards did.
        gc: GcReport,
    },
}

/// An empty private directory a writer fills for the next publish (`TENURE_CHECKPOINT_OUT`).
///
/// The area is known by its name, not by a descriptor: a writer that replaces the directory
/// (`rm -rf "$O"; mkdir "$O"`, or the write-a-temp-dir-then-rename pattern) has its new
/// directory published, with the same checks (card P1).
#[derive(Debug)]
pub struct Staging {
    name: String,
    path: PathBuf,
}

impl Staging {
    /// Absolute path of the area, to hand to the writer.
    pub fn path(&self) -> &Path {
        &self.path
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
    limits: Limits,
    pointer: Option<&'s dyn CurrentPointer>,
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
            limits: Limits::DEFAULT,
            pointer: None,
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

    /// Opens a store shared by the machines of a cluster (issue 14) for its owner: temp files
    /// of crashed publishes are removed as [`CheckpointStore::open_owned`] does, but staging
    /// areas and views are not — they may be a paused former owner's, whose publish must be
    /// refused by the cluster's fence rather than find its output gone.
    pub fn open_owned_shared(
        state: &'s StateDir,
        opts: StoreOptions,
    ) -> Result<CheckpointStore<'s>, CheckpointError> {
        let store = Self::attach_owned(state, opts)?;
        if let Some(dirs) = &store.dirs {
            dirs.root.remove_temp_files("open.sweep")?;
            for d in [&dirs.manifests, &dirs.blobs].into_iter().flatten() {
                d.remove_temp_files("open.sweep")?;
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
            limits: Limits::DEFAULT,
            pointer: None,
        })
    }

    /// The same store checking other limits than [`Limits::DEFAULT`], for tests that explore
    /// the limits at small sizes. Publish and load of one store always use the same limits.
    pub fn with_limits(mut self, limits: Limits) -> Self {
        self.limits = limits;
        self
    }

    /// The same store with CURRENT kept by `pointer` instead of its own file (a store shared
    /// by the machines of a cluster, issue 14).
    pub fn with_pointer(mut self, pointer: &'s dyn CurrentPointer) -> Self {
        self.pointer = Some(pointer);
        self
    }

    /// The limits this store checks.
    pub fn limits(&self) -> Limits {
        self.limits
    }

    /// The store directory (for messages).
    pub fn path(&self) -> PathBuf {
        self.state.root().child_path(STORE_DIR)
    }

    fn current_path(&self) -> PathBuf {
        self.path().join(CURRENT_FILE)
    }

    pub(crate) fn manifest_path(&self, id: CheckpointId) -> PathBuf {
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
        if let Some(p) = self.pointer {
            return Ok(p.read()?.map(|c| {
                let bytes = c.to_bytes();
                (c, bytes)
            }));
        }
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

    fn manifests_dir(&self) -> Option<&Dir> {
        self.dirs.as_ref().and_then(|d| d.manifests.as_ref())
    }

    fn open_manifest(&self, id: CheckpointId) -> Result<File, CheckpointError> {
        let missing = || CheckpointError::ManifestMissing {
            path: self.manifest_path(id),
            id,
        };
        let dir = self.manifests_dir().ok_or_else(missing)?;
        match dir.open_file(id.manifest_file_name()) {
            Ok(f) => Ok(f),
            Err(FsError::NotFound { .. }) => Err(missing()),
            Err(e) => Err(e.into()),
        }
    }

    /// Streams manifest `id`: checks its digest first when `expected` is given (a pass that
    /// only hashes), then parses it entry by entry, checking every rule and the limits, and
    /// calls `each` with every entry. The bytes are hashed again as they are parsed, so a file
    /// that changed between the passes is refused too. Memory does not grow with the number of
    /// entries. Returns the header and the digest.
    fn stream_manifest(
        &self,
        id: CheckpointId,
        expected: Option<&Digest>,
        mut each: impl FnMut(&Entry) -> Result<(), CheckpointError>,
    ) -> Result<(Header, Digest), CheckpointError> {
        let path = self.manifest_path(id);
        let malformed = |reason| CheckpointError::ManifestMalformed {
            path: path.clone(),
            reason,
        };
        let mut f = self.open_manifest(id)?;
        let max = self
            .limits
            .max_manifest_bytes
            .max(limits::LEGACY_MAX_MANIFEST_BYTES);
        if let Some(expected) = expected {
            let got = hash::digest_reader(&mut (&mut f).take(max + 1), &mut hash::buffer())
                .map_err(|e| CheckpointError::io(&path, "read", e))?;
            if got.size > max {
                return Err(malformed(format::FormatError::TooLarge(max)));
            }
            if got.sha256 != *expected {
                return Err(CheckpointError::ManifestDigestMismatch {
                    path,
                    expected: *expected,
                    actual: got.sha256,
                });
            }
            f.seek(SeekFrom::Start(0))
                .map_err(|e| CheckpointError::io(&path, "seek", e))?;
        }
        let mut r = format::ManifestReader::new(
            BufReader::with_capacity(64 << 10, HashingReader::new(f)),
            self.limits,
        )
        .map_err(malformed)?;
        let header = *r.header();
        if header.id != id {
            return Err(CheckpointError::ManifestIdMismatch {
                path,
                expected: id,
                found: header.id,
            });
        }
        while let Some(e) = r.next_entry().map_err(malformed)? {
            each(&e)?;
        }
        let digest = r.into_inner().into_inner().digest();
        if let Some(expected) = expected
            && digest != *expected
        {
            return Err(CheckpointError::ManifestDigestMismatch {
                path,
                expected: *expected,
                actual: digest,
            });
        }
        Ok((header, digest))
    }

    /// Reads only the header of manifest `id` (for a format-1 manifest, the whole document).
    fn manifest_header(&self, id: CheckpointId) -> Result<Header, CheckpointError> {
        let path = self.manifest_path(id);
        let f = self.open_manifest(id)?;
        let r = format::ManifestReader::new(BufReader::new(f), self.limits).map_err(|reason| {
            CheckpointError::ManifestMalformed {
                path: path.clone(),
                reason,
            }
        })?;
        let h = *r.header();
        if h.id != id {
            return Err(CheckpointError::ManifestIdMismatch {
                path,
                expected: id,
                found: h.id,
            });
        }
        Ok(h)
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

    /// Verifies checkpoint `id` streaming (manifest digest when `expected` is given, every
    /// rule, every blob's size and digest), collecting its entries only when `collect`.
    fn load_verified(
        &self,
        id: CheckpointId,
        expected: Option<&Digest>,
        buf: &mut [u8],
        collect: bool,
    ) -> Result<(CheckpointSummary, Vec<Entry>), CheckpointError> {
        let mut entries = Vec::new();
        let mut bytes = 0u64;
        let (h, digest) = self.stream_manifest(id, expected, |e| {
            self.verify_entry(e, buf)?;
            bytes = bytes.saturating_add(e.size);
            if collect {
                entries.push(e.clone());
            }
            Ok(())
        })?;
        Ok((
            CheckpointSummary {
                id: h.id,
                parent: h.parent,
                epoch: h.epoch,
                created_at_ms: h.created_at_ms,
                files: h.files,
                bytes,
                manifest_sha256: digest,
            },
            entries,
        ))
    }

    fn load_inner(
        &self,
        collect: bool,
    ) -> Result<Option<(CheckpointSummary, Vec<Entry>)>, CheckpointError> {
        let mut buf = hash::buffer();
        let mut attempts = 0;
        loop {
            let Some((cur, raw)) = self.read_current_raw()? else {
                return Ok(None);
            };
            match self.load_verified(cur.id, Some(&cur.manifest_sha256), &mut buf, collect) {
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

    /// Loads the current checkpoint and verifies it completely: `CURRENT`'s format, the
    /// manifest's digest and format, every blob's size and digest (streamed, constant memory).
    /// `Ok(None)` when there is no checkpoint yet. Read-only: never repairs, deletes or falls
    /// back to an older checkpoint. If `CURRENT` changes while loading (an owner published
    /// meanwhile) the load starts over, at most three times. The entries are returned in
    /// memory; [`CheckpointStore::load_summary`] verifies the same without holding them.
    pub fn load(&self) -> Result<Option<Checkpoint>, CheckpointError> {
        Ok(self.load_inner(true)?.map(|(s, entries)| Checkpoint {
            id: s.id,
            parent: s.parent,
            epoch: s.epoch,
            created_at_ms: s.created_at_ms,
            entries,
            manifest_sha256: s.manifest_sha256,
        }))
    }

    /// [`CheckpointStore::load`] without keeping the entries: the same checks in memory that
    /// does not grow with the number of files.
    pub fn load_summary(&self) -> Result<Option<CheckpointSummary>, CheckpointError> {
        Ok(self.load_inner(false)?.map(|(s, _)| s))
    }

    /// Best-effort read-only check for `tenure verify` and `status`: the result of
    /// [`CheckpointStore::load_summary`] and the newest valid older checkpoint.
    pub fn report(&self) -> Result<VerifyReport, CheckpointError> {
        let current = self.load_summary();
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
                if let Ok((cp, _)) = self.load_verified(id, None, &mut buf, false) {
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

    /// Every checkpoint whose manifest is in the store, oldest first, each verified completely
    /// (read-only; what `tenure checkpoint list` shows). A `CURRENT` that cannot be read
    /// marks no checkpoint as current; [`CheckpointStore::read_current`] says why.
    pub fn list(&self) -> Result<Vec<Listed>, CheckpointError> {
        let current = self.read_current().ok().flatten();
        let mut buf = hash::buffer();
        let mut out = Vec::new();
        for id in self.manifest_ids()? {
            let expected = current
                .as_ref()
                .filter(|c| c.id == id)
                .map(|c| c.manifest_sha256);
            out.push(Listed {
                id,
                current: expected.is_some(),
                header: self.manifest_header(id).ok(),
                verified: self
                    .load_verified(id, expected.as_ref(), &mut buf, false)
                    .map(|(s, _)| s),
            });
        }
        Ok(out)
    }

    /// Loads checkpoint `id` — the current one or an older one — and verifies it completely,
    /// as [`CheckpointStore::load`] does (when `CURRENT` names `id`, its manifest digest too).
    /// Read-only.
    pub fn load_id(&self, id: CheckpointId) -> Result<Checkpoint, CheckpointError> {
        let expected = self
            .read_current()
            .ok()
            .flatten()
            .filter(|c| c.id == id)
            .map(|c| c.manifest_sha256);
        let (s, entries) = self.load_verified(id, expected.as_ref(), &mut hash::buffer(), true)?;
        Ok(Checkpoint {
            id: s.id,
            parent: s.parent,
            epoch: s.epoch,
            created_at_ms: s.created_at_ms,
            entries,
            manifest_sha256: s.manifest_sha256,
        })
    }

    /// Ids of the well-named manifest files, ascending.
    pub(crate) fn manifest_ids(&self) -> Result<Vec<CheckpointId>, CheckpointError> {
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

    /// Creates a fresh, empty, private staging area (owner only). The directory that keeps
    /// the outputs of failed publishes is made now too, so that keeping one never needs a new
    /// directory on a full disk.
    pub fn staging(&self) -> Result<Staging, CheckpointError> {
        let (root, _, _) = self.owned_dirs()?;
        root.ensure_dir(FAILED_DIR, "staging")?;
        let parent = root.ensure_dir(STAGING_DIR, "staging")?;
        loop {
            let name = tree::random_name()?;
            match parent.create_dir(&name, "staging") {
                Ok(dir) => {
                    return Ok(Staging {
                        path: dir.path().to_path_buf(),
                        name,
                    });
                }
                Err(FsError::AlreadyExists { .. }) => continue,
                Err(e) => return Err(e.into()),
            }
        }
    }

    /// Removes a staging area and everything in it (whatever its depth).
    pub fn discard_staging(&self, staging: Staging) -> Result<(), CheckpointError> {
        let (root, _, _) = self.owned_dirs()?;
        let parent = root.open_dir(STAGING_DIR)?;
        tree::remove_tree(&parent, &staging.name, "staging")
    }

    /// Keeps the output of a failed publish (card P1): the staging area — whatever its path
    /// names now, a directory, a symlink or a file — is renamed to `failed/<epoch>` (or
    /// `failed/<epoch>.<n>` when that is taken), which needs no space and copies nothing, and
    /// the oldest kept outputs beyond `keep` are removed. Returns the path it is kept at, or
    /// `None` when the area is gone (the writer removed it: nothing to keep).
    pub fn keep_failed(
        &self,
        staging: &Staging,
        epoch: u64,
    ) -> Result<Option<PathBuf>, CheckpointError> {
        let (root, _, _) = self.owned_dirs()?;
        let parent = root.open_dir(STAGING_DIR)?;
        let failed = root.ensure_dir(FAILED_DIR, "failed")?;
        // Moving a directory to another parent rewrites its `..`, which needs write permission
        // on it; a child may have left its output read-only.
        if let Ok(d) = parent.open_dir_any_mode(&staging.name) {
            let _ = rustix::fs::fchmod(&d, Mode::from_raw_mode(0o700));
        }
        let mut n = 0u32;
        let kept = loop {
            let name = if n == 0 {
                epoch.to_string()
            } else {
                format!("{epoch}.{n}")
            };
            match parent.rename_to(&staging.name, &failed, &name, "failed", true) {
                Ok(()) => break failed.child_path(&name),
                Err(FsError::AlreadyExists { .. }) => n += 1,
                Err(FsError::NotFound { .. }) => return Ok(None),
                Err(e) => return Err(e.into()),
            }
        };
        // Durable, so the kept output outlives a power loss like the checkpoint would have.
        failed.sync("failed")?;
        parent.sync("failed")?;
        let mut all = failed_entries(&failed)?;
        all.sort();
        while all.len() > self.keep {
            let ((_, _), name) = all.remove(0);
            match failed.stat(&name)? {
                Some(st) if FileKind::of_mode(st.st_mode) == FileKind::Directory => {
                    tree::remove_tree(&failed, &name, "failed")?
                }
                Some(_) => match failed.unlink(&name, "failed") {
                    Ok(()) | Err(FsError::NotFound { .. }) => {}
                    Err(e) => return Err(e.into()),
                },
                None => {}
            }
        }
        Ok(Some(kept))
    }

    /// The outputs kept by failed publishes, oldest first: their epoch and path (read-only).
    pub fn failed_outputs(&self) -> Result<Vec<(u64, PathBuf)>, CheckpointError> {
        let Some(dirs) = &self.dirs else {
            return Ok(Vec::new());
        };
        let Some(failed) = dirs.root.open_dir_optional(FAILED_DIR)? else {
            return Ok(Vec::new());
        };
        let mut all = failed_entries(&failed)?;
        all.sort();
        Ok(all
            .into_iter()
            .map(|((epoch, _), name)| (epoch, failed.child_path(name)))
            .collect())
    }

    /// Checks the fencing epoch (card H5): the publish must name exactly the epoch persisted
    /// in the state dir. An older one is a stale owner; a newer one was never granted.
    fn fence(&self, epoch: u64) -> Result<(), CheckpointError> {
        // A cluster's pointer is its own fence: it moves only while the lease of `epoch` holds.
        if self.pointer.is_some() {
            return Ok(());
        }
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
    ///
    /// The area is looked up by its name now (card P1): if the writer replaced it, the new
    /// directory is published; if it is now a symlink or a file, the publish is refused. Every
    /// limit is checked by a first walk that reads no file, before anything durable is
    /// written (card P2); the second walk stores the blobs. Neither walk recurses, and both
    /// hold a bounded number of descriptors at any depth.
    pub fn publish(&self, epoch: u64, staging: &Staging) -> Result<Published, CheckpointError> {
        let (root, _, _) = self.owned_dirs()?;
        self.fence(epoch)?;
        let parent = root.open_dir(STAGING_DIR)?;
        let top = match parent.stat(&staging.name)? {
            None => return self.nothing_to_publish(),
            Some(st) => match FileKind::of_mode(st.st_mode) {
                FileKind::Directory => parent.open_dir_any_mode(&staging.name)?,
                FileKind::Symlink => return Err(unsupported(staging.path(), "symlink")),
                FileKind::Regular => return Err(unsupported(staging.path(), "regular file")),
                FileKind::Fifo => return Err(unsupported(staging.path(), "fifo")),
                FileKind::Socket => return Err(unsupported(staging.path(), "socket")),
                FileKind::CharDevice => {
                    return Err(unsupported(staging.path(), "character device"));
                }
                FileKind::BlockDevice => return Err(unsupported(staging.path(), "block device")),
                FileKind::Unknown => {
                    return Err(unsupported(staging.path(), "file of unknown type"));
                }
            },
        };
        // 0. The limits, before anything is written: names, depth, count, manifest size.
        let mut walker = tree::Walker::new(&top, self.limits)?;
        let mut count = 0u64;
        let mut bound = format::HEADER_LINE_MAX;
        while let Some(found) = walker.next()? {
            count += 1;
            bound += Entry::line_bound(&found.name);
            self.check_totals(count, bound, &top.path().join(&found.name))?;
        }
        drop(walker);
        let mut walker = tree::Walker::new(&top, self.limits)?;
        let top_path = top.path().to_path_buf();
        let mut next = || -> Result<Option<Input<'_>>, CheckpointError> {
            let Some(found) = walker.next()? else {
                return Ok(None);
            };
            let leaf = found.name.rsplit('/').next().unwrap_or(&found.name);
            let f = walker.dir()?.open_file_any_mode(leaf)?;
            let st = rustix::fs::fstat(&f)
                .map_err(|e| CheckpointError::io(top_path.join(&found.name), "stat", e.into()))?;
            Ok(Some(Input {
                name: found.name,
                mode: st.st_mode & 0o777,
                source: Source::File(f),
            }))
        };
        self.publish_checked(epoch, count, &mut next, Some(top.path()), None)
    }

    /// Rollback (owner only): publishes the files of checkpoint `to` again, as a new checkpoint
    /// written at `epoch`, through the same protocol as every publish (fence, blob directory
    /// fsync, manifest, fence, `CURRENT`, GC). `to` is verified completely first, and its blobs
    /// are carried over by digest ([`Source::Blob`]): nothing is copied.
    ///
    /// It works whatever `CURRENT` holds, since its purpose is to get past a current checkpoint
    /// that is refused: the new checkpoint's parent is the checkpoint `CURRENT` names (or, when
    /// `CURRENT` cannot be read, the newest manifest), so the refused checkpoint stays in the
    /// kept chain as evidence until a later garbage collection; the new id is above every
    /// manifest in the store, so nothing is overwritten. When `to` is the current checkpoint
    /// and it verifies, nothing changes ([`Published::Unchanged`]).
    pub fn republish(&self, epoch: u64, to: CheckpointId) -> Result<Published, CheckpointError> {
        self.owned_dirs()?;
        self.fence(epoch)?;
        let current = self.read_current();
        let target = self.load_id(to)?;
        let newest = self.manifest_ids()?.last().copied();
        let parent = match &current {
            Ok(Some(c)) => {
                if c.id == to {
                    return Ok(Published::Unchanged { current: Some(to) });
                }
                Some(c.id)
            }
            Ok(None) | Err(_) => newest,
        };
        let above = parent.max(newest).unwrap_or(to);
        let id = above.next().ok_or_else(|| CheckpointError::IdsExhausted {
            path: self.current_path(),
        })?;
        let count = target.entries.len() as u64;
        let mut it = target.entries.into_iter();
        let mut next = || -> Result<Option<Input<'_>>, CheckpointError> {
            Ok(it.next().map(|e| Input {
                name: e.name,
                mode: e.mode,
                source: Source::Blob {
                    sha256: e.sha256,
                    size: e.size,
                },
            }))
        };
        self.publish_checked(epoch, count, &mut next, None, Some(Over { parent, id }))
    }

    /// Publishes a list of files as the new current checkpoint (owner only); the library form
    /// of [`CheckpointStore::publish`]. Unchanged files can be carried over cheaply with
    /// [`Source::Blob`].
    pub fn publish_files(
        &self,
        epoch: u64,
        mut files: Vec<PublishFile<'_>>,
    ) -> Result<Published, CheckpointError> {
        self.owned_dirs()?;
        self.fence(epoch)?;
        // Names and limits are checked before any byte is written.
        files.sort_by(|a, b| a.name.as_bytes().cmp(b.name.as_bytes()));
        let mut check = format::EntryCheck::new(self.limits);
        let mut bound = format::HEADER_LINE_MAX;
        for f in &files {
            check.push(&f.name, f.mode & 0o777, 0).map_err(|reason| {
                CheckpointError::BadEntryName {
                    path: PathBuf::from(&f.name),
                    reason,
                }
            })?;
            bound += Entry::line_bound(&f.name);
            self.check_totals(check.count(), bound, Path::new(&f.name))?;
        }
        let count = files.len() as u64;
        let mut it = files.into_iter();
        let mut next = || -> Result<Option<Input<'_>>, CheckpointError> {
            Ok(it.next().map(|f| Input {
                name: f.name,
                mode: f.mode & 0o777,
                source: f.source,
            }))
        };
        self.publish_checked(epoch, count, &mut next, None, None)
    }

    fn check_totals(&self, count: u64, bound: u64, path: &Path) -> Result<(), CheckpointError> {
        if count > self.limits.max_entries {
            return Err(CheckpointError::OverLimit {
                path: path.to_path_buf(),
                reason: format::FormatError::TooManyEntries(self.limits.max_entries),
            });
        }
        if bound > self.limits.max_manifest_bytes {
            return Err(CheckpointError::OverLimit {
                path: path.to_path_buf(),
                reason: format::FormatError::TooLarge(self.limits.max_manifest_bytes),
            });
        }
        Ok(())
    }

    fn nothing_to_publish(&self) -> Result<Published, CheckpointError> {
        let current = self.read_current()?.map(|c| c.id);
        Ok(Published::Unchanged { current })
    }

    fn publish_checked<'r>(
        &self,
        epoch: u64,
        count: u64,
        next: &mut dyn FnMut() -> Result<Option<Input<'r>>, CheckpointError>,
        origin: Option<&Path>,
        over: Option<Over>,
    ) -> Result<Published, CheckpointError> {
        let (root, manifests, blobs) = self.owned_dirs()?;
        let shown = |name: &str| match origin {
            Some(o) => o.join(name),
            None => PathBuf::from(name),
        };
        // CURRENT and the parent manifest's digest are checked before any blob is written
        // (a rollback names its parent and id itself, and has no parent entries to reuse).
        let current = match over {
            Some(_) => None,
            None => self.read_current()?,
        };
        let parent = match &current {
            None => None,
            Some(cur) => {
                let mut f = self.open_manifest(cur.id)?;
                let path = self.manifest_path(cur.id);
                let max = self
                    .limits
                    .max_manifest_bytes
                    .max(limits::LEGACY_MAX_MANIFEST_BYTES);
                let got = hash::digest_reader(&mut (&mut f).take(max + 1), &mut hash::buffer())
                    .map_err(|e| CheckpointError::io(&path, "read", e))?;
                if got.sha256 != cur.manifest_sha256 {
                    return Err(CheckpointError::ManifestDigestMismatch {
                        path,
                        expected: cur.manifest_sha256,
                        actual: got.sha256,
                    });
                }
                f.seek(SeekFrom::Start(0))
                    .map_err(|e| CheckpointError::io(&path, "seek", e))?;
                let r = format::ManifestReader::new(BufReader::new(f), self.limits).map_err(
                    |reason| CheckpointError::ManifestMalformed {
                        path: path.clone(),
                        reason,
                    },
                )?;
                Some((r, path))
            }
        };
        let parent_id = match over {
            Some(o) => o.parent,
            None => current.map(|c| c.id),
        };
        if count == 0 && over.is_none() {
            return Ok(Published::Unchanged { current: parent_id });
        }
        let mut id = match (over, parent_id) {
            (Some(o), _) => o.id,
            (None, None) => CheckpointId::FIRST,
            (None, Some(p)) => p.next().ok_or_else(|| CheckpointError::IdsExhausted {
                path: self.current_path(),
            })?,
        };
        // A shared store may hold a manifest of that id already, written by a former owner
        // that lost its lease: it is never replaced; the next free id is used.
        if self.pointer.is_some()
            && over.is_none()
            && let Some(top) = self.manifest_ids()?.last()
            && *top >= id
        {
            id = top.next().ok_or_else(|| CheckpointError::IdsExhausted {
                path: self.current_path(),
            })?;
        }
        let mut parent = parent.map(|(r, path)| ParentEntries {
            r,
            path,
            pending: None,
        });
        // The parent's entries are read alongside the new ones (both sorted by name), so an
        // unchanged file is found without holding either list in memory.
        let mut unchanged = parent.as_ref().is_some_and(|p| p.r.header().files == count);
        let header = Header {
            format: format::MANIFEST_FORMAT,
            id,
            parent: parent_id,
            epoch,
            created_at_ms: SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map(|d| d.as_millis() as u64)
                .unwrap_or(0),
            files: count,
        };
        let mut out = ManifestOut::new(manifests, header.to_line());

        // 1. Blobs: temp, fsync, rename (never replacing), then one fsync of the blob dir. The
        //    manifest's lines are buffered meanwhile (spilled to its temp file when large).
        let mut buf = hash::buffer();
        let mut bytes_written = 0u64;
        let mut bytes = 0u64;
        let mut seen = 0u64;
        while let Some(f) = next()? {
            seen += 1;
            let hint = match &mut parent {
                Some(p) => p.find(&f.name)?,
                None => None,
            };
            let (size, sha256, written) =
                self.store_blob(blobs, f.source, &f.name, hint.as_ref(), &mut buf, &shown)?;
            bytes_written += written;
            bytes = bytes.saturating_add(size);
            let entry = Entry {
                name: f.name,
                size,
                sha256,
                mode: f.mode & 0o777,
            };
            unchanged = unchanged && hint.as_ref() == Some(&entry);
            out.push(&entry.to_line())?;
        }
        if seen != count {
            let path = origin.map_or_else(|| PathBuf::from("."), Path::to_path_buf);
            return Err(CheckpointError::io(
                path,
                "walk",
                std::io::Error::other(format!(
                    "the staging area changed while it was published ({count} files, then {seen})"
                )),
            ));
        }
        // Always, even when every blob already existed: a blob renamed by an earlier publish
        // whose directory fsync failed must not be referenced before its entry is durable.
        blobs.sync("publish.blob").map_err(publish_failed)?;
        if unchanged {
            return Ok(Published::Unchanged { current: parent_id });
        }

        // 2. Manifest: temp, fsync, rename, fsync of the manifests dir.
        let manifest_sha256 = out.finish(id, self.pointer.is_some())?;
        manifests.sync("publish.manifest").map_err(publish_failed)?;

        // 3. CURRENT, fenced once more right before the only step that makes it visible.
        self.fence(epoch)?;
        let current = Current {
            id,
            manifest_sha256,
        };
        match self.pointer {
            Some(p) => p.replace(&current, epoch)?,
            None => replace_current(root, &current)?,
        }
        crate::failpoint::hit("publish.acked")
            .map_err(|e| CheckpointError::io(self.path(), "acknowledge", e))?;

        // 4. Acknowledged: collect what the last `keep` checkpoints do not need.
        let gc = self.collect(id, manifests, blobs);
        Ok(Published::New {
            checkpoint: CheckpointSummary {
                id,
                parent: parent_id,
                epoch,
                created_at_ms: header.created_at_ms,
                files: count,
                bytes,
                manifest_sha256,
            },
            bytes_written,
            gc,
        })
    }

    /// Stores one file's bytes as a blob and returns (size, digest, bytes written). An
    /// existing blob is reused unread only when `hint` (the current checkpoint's entry of the
    /// same name, verified when the owner loaded it) names it; any other is verified first.
    fn store_blob(
        &self,
        blobs: &Dir,
        source: Source<'_>,
        name: &str,
        hint: Option<&Entry>,
        buf: &mut [u8],
        shown: &dyn Fn(&str) -> PathBuf,
    ) -> Result<(u64, Digest, u64), CheckpointError> {
        let trusted = hint.map(|h| h.sha256);
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

    /// Whether a blob with this digest exists; one with the wrong size, or (when it is not
    /// `trusted`) the wrong content, is refused, never replaced (that would be a repair).
    fn blob_present(
        &self,
        blobs: &Dir,
        d: &Digest,
        size: u64,
        name: &str,
        trusted: Option<Digest>,
    ) -> Result<bool, CheckpointError> {
        match blobs.stat(d.to_hex())? {
            None => Ok(false),
            Some(st) if st.st_size as u64 == size => {
                if trusted != Some(*d) {
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
        trusted: Option<Digest>,
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
        // Which manifests to keep needs only their headers.
        let mut seen = BTreeMap::new();
        for id in self.manifest_ids()? {
            let s = match self.manifest_header(id) {
                Ok(h) => Seen::Valid { parent: h.parent },
                Err(_) => Seen::Unreadable,
            };
            seen.insert(id, s);
        }
        let mut plan = gc::plan(current, &seen, self.keep);
        if self.pointer.is_some() {
            // A shared store: manifests above the new checkpoint may be a newer owner's (this
            // one may have lost its lease since), and any blob may be about to be named by
            // one; only older manifests go, and blobs stay.
            plan.manifests.retain(|id| *id < current);
            plan.blobs_skipped = true;
        }
        report.kept = plan.kept.clone();
        report.blobs_skipped = plan.blobs_skipped;
        // The blobs the kept checkpoints name, streamed from their manifests into a sorted
        // list of 8-byte digest prefixes (8 bytes per file, not the whole list of entries).
        // A prefix shared by a garbage blob only keeps that blob: never the reverse.
        let mut referenced = gc::Referenced::default();
        if !plan.blobs_skipped {
            for id in &plan.kept {
                if let Err(e) = self.stream_manifest(*id, None, |e| {
                    referenced.add(&e.sha256);
                    Ok(())
                }) {
                    // A kept manifest that cannot be read may name any blob.
                    report.blobs_skipped = true;
                    report.error = Some(e.to_string());
                    break;
                }
            }
        }
        referenced.seal();
        // Manifests go first, so a crash mid-GC does not leave a manifest without its blobs.
        // No directory is fsynced: a deletion lost in a power cut only leaves garbage that the
        // next GC removes again, and what GC deletes is never what a kept checkpoint needs, so
        // the order of deletions does not need to be durable either (a manifest that comes
        // back without its blobs is not kept, never loaded, and reported as invalid).
        for id in &plan.manifests {
            manifests.unlink(id.manifest_file_name(), "gc.manifest")?;
            report.manifests_removed += 1;
        }
        if report.blobs_skipped {
            return Ok(());
        }
        let mut removed = 0;
        blobs.for_each_entry(|name, kind| -> Result<bool, CheckpointError> {
            if kind != FileKind::Regular {
                return Ok(true);
            }
            let Some(d) = name.to_str().and_then(|n| n.parse::<Digest>().ok()) else {
                return Ok(true);
            };
            if gc::is_garbage(&referenced, &d) {
                blobs.unlink(name, "gc.blob")?;
                removed += 1;
            }
            Ok(true)
        })?;
        report.blobs_removed = removed;
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

    /// Verifies the current checkpoint and copies it into a new read-only view in one
    /// streaming pass over its manifest (owner only): the runner's recovery, in memory and
    /// descriptors that do not grow with the number of files or their depth. `Ok(None)` when
    /// there is no checkpoint.
    pub fn materialise_current(
        &self,
    ) -> Result<Option<(CheckpointSummary, View)>, CheckpointError> {
        let (root, _, _) = self.owned_dirs()?;
        let Some(cur) = self.read_current()? else {
            return Ok(None);
        };
        let parent = root.ensure_dir(VIEWS_DIR, "view")?;
        let name = tree::random_name()?;
        let top = parent.create_dir(&name, "view")?;
        let path = top.path().to_path_buf();
        let mut bytes = 0u64;
        let res = (|| {
            let mut w = tree::ViewWriter::new(&top);
            let mut buf = hash::buffer();
            let (h, digest) = self.stream_manifest(cur.id, Some(&cur.manifest_sha256), |e| {
                self.copy_into_view(&mut w, e, &mut buf)?;
                bytes = bytes.saturating_add(e.size);
                Ok(())
            })?;
            w.finish()?;
            Ok::<_, CheckpointError>(CheckpointSummary {
                id: h.id,
                parent: h.parent,
                epoch: h.epoch,
                created_at_ms: h.created_at_ms,
                files: h.files,
                bytes,
                manifest_sha256: digest,
            })
        })();
        drop(top);
        match res {
            Ok(s) => Ok(Some((s, View { path, name }))),
            Err(e) => {
                // Best effort: a leftover view is scratch that the next owned open sweeps.
                let _ = tree::remove_tree(&parent, &name, "view");
                Err(e)
            }
        }
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
        let res = (|| {
            let mut w = tree::ViewWriter::new(&top);
            let mut buf = hash::buffer();
            for e in &checkpoint.entries {
                self.copy_into_view(&mut w, e, &mut buf)?;
            }
            w.finish()
        })();
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

    fn copy_into_view(
        &self,
        w: &mut tree::ViewWriter<'_>,
        e: &Entry,
        buf: &mut [u8],
    ) -> Result<(), CheckpointError> {
        let (dir, leaf) = w.dir_for(&e.name)?;
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
            hash::copy_small(&mut src, limit, buf, &mut sink)
        }
        .map_err(|err| match err {
            hash::PipeError::Read(err) => {
                CheckpointError::io(self.blob_path(&e.sha256), "read", err)
            }
            hash::PipeError::Sink(err) => err,
        })?;
        if got.size != e.size {
            return Err(self.mismatch(
                e,
                Mismatch::Size {
                    expected: e.size,
                    actual: got.size.min(e.size + 1),
                },
            ));
        }
        if got.sha256 != e.sha256 {
            return Err(self.mismatch(
                e,
                Mismatch::Digest {
                    expected: e.sha256,
                    actual: got.sha256,
                },
            ));
        }
        rustix::fs::fchmod(&out, Mode::from_raw_mode(e.mode & 0o500))
            .map_err(|err| CheckpointError::io(&out_path, "make read-only", err.into()))
    }

    /// Removes a view made by [`CheckpointStore::materialise`].
    pub fn remove_view(&self, view: View) -> Result<(), CheckpointError> {
        let (root, _, _) = self.owned_dirs()?;
        let parent = root.open_dir(VIEWS_DIR)?;
        tree::remove_tree(&parent, &view.name, "view")
    }
}

/// What a rollback publishes over: the new checkpoint's parent and id, chosen by
/// [`CheckpointStore::republish`] instead of read from `CURRENT`.
#[derive(Debug, Clone, Copy)]
struct Over {
    parent: Option<CheckpointId>,
    id: CheckpointId,
}

/// One file of a publish.
struct Input<'r> {
    name: String,
    mode: u32,
    source: Source<'r>,
}

/// The current checkpoint's entries, read alongside a publish's sorted names.
struct ParentEntries {
    r: format::ManifestReader<BufReader<File>>,
    path: PathBuf,
    pending: Option<Entry>,
}

impl ParentEntries {
    /// The parent's entry called `name`, if any; names must be asked in increasing order.
    fn find(&mut self, name: &str) -> Result<Option<Entry>, CheckpointError> {
        loop {
            if self.pending.is_none() {
                self.pending =
                    self.r
                        .next_entry()
                        .map_err(|reason| CheckpointError::ManifestMalformed {
                            path: self.path.clone(),
                            reason,
                        })?;
            }
            match &self.pending {
                None => return Ok(None),
                Some(e) => match e.name.as_bytes().cmp(name.as_bytes()) {
                    std::cmp::Ordering::Less => self.pending = None,
                    std::cmp::Ordering::Equal => return Ok(self.pending.take()),
                    std::cmp::Ordering::Greater => return Ok(None),
                },
            }
        }
    }
}

/// A manifest being written: lines are buffered, and spilled to the temp file once the buffer
/// is large, so a small publish creates its manifest after its blobs (the order the crash
/// points list) and a large one never holds its manifest in memory.
struct ManifestOut<'d> {
    dir: &'d Dir,
    tmp: Option<crate::privfs::TempFile<'d>>,
    pending: Vec<u8>,
    hash: sha2::Sha256,
}

/// Bytes of manifest lines buffered before they are written out.
const MANIFEST_SPILL: usize = 1 << 20;

impl<'d> ManifestOut<'d> {
    fn new(dir: &'d Dir, header: Vec<u8>) -> ManifestOut<'d> {
        use sha2::Digest as _;
        let mut hash = sha2::Sha256::new();
        hash.update(&header);
        ManifestOut {
            dir,
            tmp: None,
            pending: header,
            hash,
        }
    }

    fn push(&mut self, line: &[u8]) -> Result<(), CheckpointError> {
        use sha2::Digest as _;
        self.hash.update(line);
        self.pending.extend_from_slice(line);
        if self.pending.len() >= MANIFEST_SPILL {
            self.spill()?;
        }
        Ok(())
    }

    fn spill(&mut self) -> Result<(), CheckpointError> {
        if self.tmp.is_none() {
            self.tmp = Some(
                self.dir
                    .create_temp("publish.manifest")
                    .map_err(publish_failed)?,
            );
        }
        let tmp = self.tmp.as_mut().expect("created above");
        tmp.write_all(&self.pending).map_err(publish_failed)?;
        self.pending.clear();
        Ok(())
    }

    /// Writes the rest, fsyncs and renames the manifest into place; returns its digest. In a
    /// shared store (`shared`) an existing manifest of the id is never replaced.
    fn finish(mut self, id: CheckpointId, shared: bool) -> Result<Digest, CheckpointError> {
        use sha2::Digest as _;
        self.spill()?;
        let digest = Digest(self.hash.clone().finalize().into());
        let synced = self
            .tmp
            .take()
            .expect("spill creates the temp file")
            .sync()
            .map_err(publish_failed)?;
        // In a dir of its own, a leftover manifest of this id can only be the orphan of a
        // crashed publish (CURRENT names its parent), so replacing it is safe. In a shared
        // store another machine may be writing this very id (a former owner that lost its
        // lease): the rename must not replace it, and then this publish fails.
        if shared {
            synced.rename_into_new(id.manifest_file_name())
        } else {
            synced.rename_into(id.manifest_file_name())
        }
        .map_err(publish_failed)?;
        Ok(digest)
    }
}

fn unsupported(path: &Path, kind: &'static str) -> CheckpointError {
    CheckpointError::UnsupportedFile {
        path: path.to_path_buf(),
        kind,
    }
}

/// A kept output in `failed/`: (epoch, n) from its name, and the name.
type FailedEntry = ((u64, u32), std::ffi::OsString);

/// The kept outputs in `failed/`, for names `<epoch>` and `<epoch>.<n>`.
fn failed_entries(failed: &Dir) -> Result<Vec<FailedEntry>, CheckpointError> {
    let mut all = Vec::new();
    for e in failed.entries()? {
        if let Some(key) = e.name.to_str().and_then(failed_name) {
            all.push((key, e.name));
        }
    }
    Ok(all)
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
        if let Ok(h) = store.manifest_header(id) {
            consider(h.epoch, store.manifest_path(id));
        }
    }
    if let Some(dirs) = &store.dirs
        && let Ok(Some(failed)) = dirs.root.open_dir_optional(FAILED_DIR)
        && let Ok(entries) = failed.entries()
    {
        for e in entries {
            if let Some((epoch, _)) = e.name.to_str().and_then(failed_name) {
                consider(epoch, failed.child_path(&e.name));
            }
        }
    }
    best
}

/// The epoch and sequence number in the name of a kept output (`<epoch>` or `<epoch>.<n>`).
pub fn failed_name(name: &str) -> Option<(u64, u32)> {
    let (epoch, n) = match name.split_once('.') {
        Some((a, b)) => (a.parse().ok()?, b.parse().ok()?),
        None => (name.parse().ok()?, 0),
    };
    Some((epoch, n))
}

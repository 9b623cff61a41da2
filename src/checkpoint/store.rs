//! The store itself: open, load, verify, publish, garbage-collect, staging areas and views.
//! See the module docs of [`crate::checkpoint`] for the layout and the protocols.

use std::ffi::OsString;
use std::fs::File;
use std::io::{BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use rustix::fs::Mode;

use super::error::CheckpointError;
use super::format::{self, CURRENT_LEN, CheckpointId, Current, Digest, Entry, Header};
use super::gc::DEFAULT_KEEP;
use super::hash::{self, VerifyingReader};
use super::limits::Limits;
use super::plan::{self, Plan, Poll, Src};
use super::tree;
use super::{
    BLOBS_DIR, CURRENT_FILE, FAILED_DIR, MANIFESTS_DIR, SHA256_DIR, STAGING_DIR, STORE_DIR,
    VIEWS_DIR,
};
use crate::fsop::{Done, Executor, Fd, Op, Summary};
use crate::privfs::{Dir, Exec, FileKind, FsError, Links, StateDir};

/// Where CURRENT lives when it is not the store's own file: a cluster (issue 14, the etcd
/// lease), whose pointer moves only while the publisher's lease holds. The store then lives in
/// a directory several machines share, and its plans run in their shared variant
/// ([`plan::PublishPlan::shared`], [`plan::OpenPlan::temps_only`]): the pointer is read
/// before a publish or a load and moved by the publish's [`Poll::Replace`] step.
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
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
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
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
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
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
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

/// What [`CheckpointStore::keep_failed_with_siblings`] kept of a failed publish's output.
pub(crate) struct KeptFailure {
    /// Where the staging area was kept (as [`CheckpointStore::keep_failed`] answers).
    pub(crate) area: Result<Option<PathBuf>, CheckpointError>,
    /// Where each entry its writer left beside it was kept.
    pub(crate) beside: Vec<PathBuf>,
    /// The entries that could not be kept (they stay where they are), and why.
    pub(crate) failures: Vec<(PathBuf, CheckpointError)>,
    /// What failed after the area was renamed into `failed/` (a sync, pruning an older kept
    /// output): the area is kept all the same, at `area`.
    pub(crate) after: Option<CheckpointError>,
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

/// The open directories of a store opened for its owner, kept from the ownership's first open
/// to its release: [`CheckpointStore::reattach`] gives the store back without a system call,
/// so one ownership opens the store once (the runner's recovery, publish and release; issue
/// 11). Valid only while the lease that opened them is held.
#[derive(Debug, Clone)]
pub(crate) struct OwnedDirs(Arc<Dirs>);

/// The load plan of what CURRENT names, and the pointer's value it was made from (a cluster's
/// pointer read before the plan; `None` when the plan reads the `CURRENT` file itself).
type CurrentLoad = (plan::LoadPlan, Option<Vec<u8>>);

/// Which sweep the owner's open makes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Sweep {
    /// The first open of an ownership of a dir of its own: everything scratch.
    All,
    /// The first open of an ownership of a shared store: temp files only.
    TempsOnly,
    /// A later open within one ownership.
    None,
}

/// A checkpoint store inside a state dir.
#[derive(Debug)]
pub struct CheckpointStore<'s> {
    state: &'s StateDir,
    dirs: Option<Arc<Dirs>>,
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
                Some(Arc::new(Dirs {
                    root,
                    manifests,
                    blobs,
                }))
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

    /// Opens the store for its owner (the lease holder), running the owned open
    /// ([`plan::OpenPlan`]): creates the directories when they are missing, removes temp files
    /// left by a crashed publish in the store directory (they are never referenced; those in
    /// `manifests/` go with the next publish's GC, so the open never lists the history) and
    /// removes leftover staging
    /// areas, views and the scratch of a crashed publish (trees nothing references). Nothing
    /// else is touched: `CURRENT`, manifests and blobs stay byte-for-byte as they are.
    pub fn open_owned(
        state: &'s StateDir,
        opts: StoreOptions,
    ) -> Result<CheckpointStore<'s>, CheckpointError> {
        Self::owned(state, opts, Sweep::All)
    }

    /// Opens a store shared by the machines of a cluster (issue 14) for its owner: temp files
    /// of crashed publishes are removed as [`CheckpointStore::open_owned`] does, but staging
    /// areas and views are not ([`plan::OpenPlan::temps_only`]) — they may be a paused former
    /// owner's, whose publish must be refused by the cluster's fence rather than find its
    /// output gone.
    pub fn open_owned_shared(
        state: &'s StateDir,
        opts: StoreOptions,
    ) -> Result<CheckpointStore<'s>, CheckpointError> {
        Self::owned(state, opts, Sweep::TempsOnly)
    }

    /// Opens the store for its owner *without* the sweep of [`CheckpointStore::open_owned`]:
    /// for the second and later opens within one ownership, which must keep the staging area
    /// and views this ownership made (the child's output is in its staging area).
    pub fn attach_owned(
        state: &'s StateDir,
        opts: StoreOptions,
    ) -> Result<CheckpointStore<'s>, CheckpointError> {
        Self::owned(state, opts, Sweep::None)
    }

    fn owned(
        state: &'s StateDir,
        opts: StoreOptions,
        sweep: Sweep,
    ) -> Result<CheckpointStore<'s>, CheckpointError> {
        check_opts(&opts)?;
        let mut exec = Exec::new(state.root());
        let mut open = match sweep {
            Sweep::All => plan::OpenPlan::new(true),
            Sweep::TempsOnly => plan::OpenPlan::new(true).temps_only(),
            Sweep::None => plan::OpenPlan::new(false),
        };
        plan::run(&mut open, &mut exec)?;
        let fds = open
            .output()
            .expect("a finished open names its directories");
        let mut take = |fd| {
            exec.take_dir(fd)
                .expect("the open plan's directories are open")
        };
        let (root, manifests, blobs) = (take(fds.root), take(fds.manifests), take(fds.blobs));
        Ok(CheckpointStore {
            state,
            dirs: Some(Arc::new(Dirs {
                root,
                manifests: Some(manifests),
                blobs: Some(blobs),
            })),
            owned: true,
            keep: opts.keep,
            limits: Limits::DEFAULT,
            pointer: None,
        })
    }

    /// This owned store's directories, to [`CheckpointStore::reattach`] later in the same
    /// ownership; `None` for a read-only store.
    pub(crate) fn owned_handles(&self) -> Option<OwnedDirs> {
        match (&self.dirs, self.owned) {
            (Some(d), true) => Some(OwnedDirs(Arc::clone(d))),
            _ => None,
        }
    }

    /// The owned store of `dirs` again, as [`CheckpointStore::attach_owned`] would open it
    /// (no sweep) but without opening anything: for the later operations of the ownership
    /// that opened `dirs` in `state`.
    pub(crate) fn reattach(
        state: &'s StateDir,
        dirs: &OwnedDirs,
        opts: StoreOptions,
    ) -> Result<CheckpointStore<'s>, CheckpointError> {
        check_opts(&opts)?;
        Ok(CheckpointStore {
            state,
            dirs: Some(Arc::clone(&dirs.0)),
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

    fn store_path(&self) -> plan::StorePath {
        plan::StorePath::new(self.path())
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

    /// An executor on the state dir holding this store's directories (lent, not duplicated:
    /// the same handles, so a directory whose fsync failed stays refused), and their handles,
    /// each `None` where a read-only store lacks the directory.
    fn exec(&self) -> Result<(Exec<'_>, [Option<Fd>; 3]), CheckpointError> {
        let mut exec = Exec::new(self.state.root());
        let mut fds = [None; 3];
        if let Some(d) = self.dirs.as_deref() {
            fds[0] = Some(exec.lend_dir(&d.root));
            if let Some(m) = &d.manifests {
                fds[1] = Some(exec.lend_dir(m));
            }
            if let Some(b) = &d.blobs {
                fds[2] = Some(exec.lend_dir(b));
            }
        }
        Ok((exec, fds))
    }

    fn owned_fds(&self) -> Result<(Exec<'_>, plan::StoreFds), CheckpointError> {
        self.owned_dirs()?;
        let (exec, fds) = self.exec()?;
        let [Some(root), Some(manifests), Some(blobs)] = fds else {
            unreachable!("an owned store has every directory")
        };
        Ok((
            exec,
            plan::StoreFds {
                root,
                manifests,
                blobs,
            },
        ))
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
        let path = self.path().join(CURRENT_FILE);
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

    /// Runs a load plan, checking blobs on up to [`verify_threads`] threads at once, and calls
    /// `each` with every entry in manifest order as its check is issued.
    fn run_load(
        &self,
        plan: &mut plan::LoadPlan,
        exec: &mut Exec<'_>,
        blobs: Option<Fd>,
        each: &mut dyn FnMut(&Entry),
    ) -> Result<(), CheckpointError> {
        let threads = verify_threads();
        let blobs = match blobs {
            Some(fd) if threads > 1 => Some(exec.dir(fd)?.try_clone()?),
            Some(_) | None => None,
        };
        let Some(blobs) = blobs else {
            loop {
                match plan.poll() {
                    Poll::Op(step) => {
                        let r = exec.run(step);
                        plan.handle(r)?;
                    }
                    Poll::Verify(token, step) => {
                        if let Some(e) = plan.ready_entry() {
                            each(e);
                        }
                        let r = exec.run(step);
                        plan.dispatched()?;
                        plan.verified(token, r)?;
                    }
                    Poll::Done => return Ok(()),
                    Poll::Input | Poll::Wait | Poll::Replace(_) => {
                        unreachable!("a load plan run in order")
                    }
                }
            }
        };
        let blobs = &blobs;
        let (jobs_tx, jobs_rx) = std::sync::mpsc::channel::<(u64, OsString, Option<u64>)>();
        let jobs_rx = std::sync::Mutex::new(jobs_rx);
        let (done_tx, done_rx) = std::sync::mpsc::channel();
        // Blob checks sent and not yet answered. A worker whose check is the only one in
        // flight hashes a large blob on a helper thread (one big blob at the reader's speed);
        // with several in flight every worker already has a core's worth of work, and a helper
        // each would put twice as many threads as cores on them, with a hand-off per buffer.
        let in_flight = std::sync::atomic::AtomicUsize::new(0);
        let in_flight = &in_flight;
        std::thread::scope(|scope| {
            for _ in 0..threads {
                let (jobs_rx, done_tx) = (&jobs_rx, done_tx.clone());
                scope.spawn(move || {
                    let mut buf = Vec::new();
                    loop {
                        let job = jobs_rx
                            .lock()
                            .unwrap_or_else(std::sync::PoisonError::into_inner)
                            .recv();
                        let Ok((token, name, limit)) = job else { break };
                        let alone = in_flight.load(std::sync::atomic::Ordering::Relaxed) <= 1;
                        let r = crate::privfs::hash_file_at(blobs, &name, limit, &mut buf, alone)
                            .map(Done::Hashed);
                        if done_tx.send((token, r)).is_err() {
                            break;
                        }
                    }
                });
            }
            drop(done_tx);
            let res = (|| loop {
                // Results that are in are taken first, so the window keeps moving.
                while let Ok((token, r)) = done_rx.try_recv() {
                    in_flight.fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
                    plan.verified(token, r)?;
                }
                match plan.poll() {
                    Poll::Op(step) => {
                        let r = exec.run(step);
                        plan.handle(r)?;
                    }
                    Poll::Verify(token, step) => {
                        let Op::HashFile { name, limit, .. } = step.op else {
                            unreachable!("a verify step hashes a file")
                        };
                        if let Some(e) = plan.ready_entry() {
                            each(e);
                        }
                        in_flight.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        jobs_tx
                            .send((token, name.to_owned(), limit))
                            .expect("the workers run until the jobs end");
                        plan.dispatched()?;
                    }
                    Poll::Wait => {
                        let (token, r) = done_rx.recv().expect("a worker answers every job");
                        in_flight.fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
                        plan.verified(token, r)?;
                    }
                    Poll::Done => return Ok(()),
                    Poll::Input | Poll::Replace(_) => unreachable!("a load takes no input"),
                }
            })();
            // Ends the workers (after the jobs in flight) before the scope joins them.
            drop(jobs_tx);
            res
        })
    }

    /// Loads checkpoint `id` with the load plan (its manifest's digest checked against
    /// `expected` when given), every blob checked; the entries kept when `collect`.
    fn load_verified(
        &self,
        id: CheckpointId,
        expected: Option<&Digest>,
        collect: bool,
    ) -> Result<(CheckpointSummary, Vec<Entry>), CheckpointError> {
        let (mut exec, [_, manifests, blobs]) = self.exec()?;
        let mut plan = plan::LoadPlan::checkpoint(
            self.store_path(),
            manifests,
            blobs,
            id,
            expected.copied(),
            self.limits,
            verify_window(),
        )?;
        let mut entries = Vec::new();
        self.run_load(&mut plan, &mut exec, blobs, &mut |e| {
            if collect {
                entries.push(e.clone());
            }
        })?;
        match plan.output() {
            Some(plan::Loaded::Verified(s)) => Ok((*s, entries)),
            Some(plan::Loaded::Nothing) | None => unreachable!("a checkpoint's load verifies it"),
        }
    }

    /// The load plan of what CURRENT names: the plan reads the store's `CURRENT` file, or,
    /// with a cluster's pointer, the pointer is read first (the executor's step) and the plan
    /// loads the checkpoint it names, the manifest's digest checked against it. `None`: no
    /// checkpoint (the pointer is unset).
    fn current_plan(
        &self,
        root: Option<Fd>,
        manifests: Option<Fd>,
        blobs: Option<Fd>,
        window: usize,
    ) -> Result<Option<CurrentLoad>, CheckpointError> {
        let Some(p) = self.pointer else {
            let plan = plan::LoadPlan::current(
                self.store_path(),
                root,
                manifests,
                blobs,
                self.limits,
                window,
            );
            return Ok(Some((plan, None)));
        };
        let Some(c) = p.read()? else {
            return Ok(None);
        };
        let plan = plan::LoadPlan::checkpoint(
            self.store_path(),
            manifests,
            blobs,
            c.id,
            Some(c.manifest_sha256),
            self.limits,
            window,
        )?;
        Ok(Some((plan, Some(c.to_bytes()))))
    }

    fn load_inner(
        &self,
        collect: bool,
    ) -> Result<Option<(CheckpointSummary, Vec<Entry>)>, CheckpointError> {
        let mut attempts = 0;
        loop {
            let (mut exec, [root, manifests, blobs]) = self.exec()?;
            let Some((mut plan, read)) =
                self.current_plan(root, manifests, blobs, verify_window())?
            else {
                return Ok(None);
            };
            let mut entries = Vec::new();
            let res = self.run_load(&mut plan, &mut exec, blobs, &mut |e| {
                if collect {
                    entries.push(e.clone());
                }
            });
            match res {
                Ok(()) => {
                    return Ok(match plan.output() {
                        Some(plan::Loaded::Verified(s)) => Some((*s, entries)),
                        Some(plan::Loaded::Nothing) | None => None,
                    });
                }
                Err(e) => {
                    // An owner may have published meanwhile: start over if CURRENT moved.
                    attempts += 1;
                    let before = read.or_else(|| plan.current_bytes().map(<[u8]>::to_vec));
                    let moved = match self.read_current_raw() {
                        Ok(Some((_, now))) => before.is_some_and(|b| b != now),
                        Ok(None) | Err(_) => false,
                    };
                    if !moved || attempts >= 3 {
                        return Err(e);
                    }
                }
            }
        }
    }

    /// Loads the current checkpoint and verifies it completely ([`plan::LoadPlan`]):
    /// `CURRENT`'s format, the manifest's digest and format, every blob's size and digest
    /// (streamed, constant memory, several blobs at once on the available cores). `Ok(None)`
    /// when there is no checkpoint yet. Read-only: never repairs, deletes or falls back to an
    /// older checkpoint. If `CURRENT` changes while loading (an owner published meanwhile) the
    /// load starts over, at most three times. The entries are returned in memory;
    /// [`CheckpointStore::load_summary`] verifies the same without holding them.
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
            for id in self.manifest_ids()?.into_iter().rev() {
                if below.is_some_and(|b| id >= b) {
                    continue;
                }
                let (mut exec, [_, manifests, blobs]) = self.exec()?;
                let Ok(mut plan) = plan::LoadPlan::checkpoint(
                    self.store_path(),
                    manifests,
                    blobs,
                    id,
                    None,
                    self.limits,
                    verify_window(),
                ) else {
                    continue;
                };
                if self
                    .run_load(&mut plan, &mut exec, blobs, &mut |_| {})
                    .is_ok()
                    && let Some(plan::Loaded::Verified(cp)) = plan.output()
                {
                    newest_valid_older = Some(*cp);
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
                    .load_verified(id, expected.as_ref(), false)
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
        let (s, entries) = self.load_verified(id, expected.as_ref(), true)?;
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
        match (self.dirs.as_deref(), self.owned) {
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

    /// Creates a fresh, empty, private staging area (owner only, [`plan::StagingPlan`]).
    pub fn staging(&self) -> Result<Staging, CheckpointError> {
        loop {
            let (mut exec, fds) = self.owned_fds()?;
            let name = tree::random_name()?;
            let mut p = plan::StagingPlan::new(fds.root, name.clone());
            match plan::run(&mut p, &mut exec) {
                Ok(()) => {
                    return Ok(Staging {
                        path: self.path().join(STAGING_DIR).join(&name),
                        name,
                    });
                }
                Err(CheckpointError::Fs(FsError::AlreadyExists { .. })) => continue,
                Err(e) => return Err(e),
            }
        }
    }

    /// Removes a staging area and everything in it (whatever its depth). An area that is an
    /// empty private directory of ours is not removed but parked as the store's one spare
    /// ([`plan::SPARE_STAGING`], unless one is parked already), for the next
    /// [`CheckpointStore::staging`] to rename into place: removing and making a directory are
    /// the dearest steps of a run that publishes nothing (issue 11). Call it only once nothing
    /// can write into the area any more (the writer and everything it started are gone).
    pub fn discard_staging(&self, staging: Staging) -> Result<(), CheckpointError> {
        let (root, _, _) = self.owned_dirs()?;
        let parent = root.open_dir(STAGING_DIR)?;
        // Parked only when it is a private directory of ours that lists as empty; anything
        // else (a link, files, a mode the writer opened, an error) is removed as before.
        let empty = match parent.open_dir(&staging.name) {
            Ok(area) => {
                let mut empty = true;
                let listed = area.for_each_entry(|_, _| -> Result<bool, FsError> {
                    empty = false;
                    Ok(false)
                });
                listed.is_ok() && empty
            }
            Err(_) => false,
        };
        // A spare parked already, or a refused rename: the area is removed as before.
        if empty
            && parent
                .rename_to(&staging.name, &parent, plan::SPARE_STAGING, "staging", true)
                .is_ok()
        {
            return Ok(());
        }
        tree::remove_tree(&parent, &staging.name, "staging")
    }

    /// Keeps a failed publish's output together with what its writer left beside it (card
    /// P1): each of [`CheckpointStore::siblings`] first, then the area itself, last and so the
    /// newest. This run's outputs count as one against the store's `keep`: the older kept
    /// outputs are pruned as if there were no siblings, and later prunes take this run's
    /// siblings before its area. Returns where the area was kept (as
    /// [`CheckpointStore::keep_failed`]) and where each sibling was; a sibling that cannot be
    /// kept is reported in the list of failures and stays where it is.
    pub(crate) fn keep_failed_with_siblings(&self, staging: &Staging, epoch: u64) -> KeptFailure {
        let (mut beside, mut failures) = (Vec::new(), Vec::new());
        match self.siblings(staging) {
            Ok(siblings) => {
                for sib in siblings {
                    match self.keep_failed_within(&sib, epoch, usize::MAX) {
                        Ok(Some(k)) => beside.push(k),
                        Ok(None) => {}
                        Err(e) => failures.push((sib.path, e)),
                    }
                }
            }
            Err(e) => failures.push((self.path().join(STAGING_DIR), e)),
        }
        let keep = self.keep.saturating_add(beside.len());
        let (area, after) = match self.keep_failed_reporting(staging, epoch, keep) {
            Ok((kept, after)) => (Ok(kept), after),
            Err(e) => (Err(e), None),
        };
        KeptFailure {
            area,
            beside,
            failures,
            after,
        }
    }

    /// What a writer left in `staging/` beside its area (card P1): the entries whose names
    /// extend the area's own — `$TENURE_CHECKPOINT_OUT.new` written to be renamed into place,
    /// the output moved aside (`.old`, `.moved`) — as areas of their own, sorted by name, for
    /// [`CheckpointStore::keep_failed`] to keep beside a kept output. Read-only; the area
    /// itself is not listed. Call it only once nothing can write into `staging/` any more.
    pub(crate) fn siblings(&self, staging: &Staging) -> Result<Vec<Staging>, CheckpointError> {
        let (root, _, _) = self.owned_dirs()?;
        let parent = root.open_dir(STAGING_DIR)?;
        let mut found = Vec::new();
        for e in parent.entries()? {
            let Some(name) = e.name.to_str() else {
                continue;
            };
            if name.len() > staging.name.len() && name.starts_with(staging.name.as_str()) {
                found.push(Staging {
                    name: name.to_owned(),
                    path: self.path().join(STAGING_DIR).join(name),
                });
            }
        }
        found.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(found)
    }

    /// Keeps the output of a failed publish (card P1, [`plan::KeepFailedPlan`]): the staging
    /// area — whatever its path names now, a directory, a symlink or a file — is renamed to
    /// `failed/<epoch>` (or `failed/<epoch>.<n>` when that is taken), which needs no space and
    /// copies nothing, and the oldest kept outputs beyond `keep` are removed. Returns the path
    /// it is kept at, or `None` when the area is gone (the writer removed it: nothing to keep).
    pub fn keep_failed(
        &self,
        staging: &Staging,
        epoch: u64,
    ) -> Result<Option<PathBuf>, CheckpointError> {
        self.keep_failed_within(staging, epoch, self.keep)
    }

    /// [`CheckpointStore::keep_failed`] with `keep` kept outputs in place of the store's.
    pub(crate) fn keep_failed_within(
        &self,
        staging: &Staging,
        epoch: u64,
        keep: usize,
    ) -> Result<Option<PathBuf>, CheckpointError> {
        match self.keep_failed_reporting(staging, epoch, keep)? {
            (kept, None) => Ok(kept),
            (_, Some(e)) => Err(e),
        }
    }

    /// [`CheckpointStore::keep_failed_within`], telling apart what failed after the area was
    /// renamed into `failed/` (the second value): the area is kept there all the same.
    fn keep_failed_reporting(
        &self,
        staging: &Staging,
        epoch: u64,
        keep: usize,
    ) -> Result<(Option<PathBuf>, Option<CheckpointError>), CheckpointError> {
        let (mut exec, fds) = self.owned_fds()?;
        let mut p = plan::KeepFailedPlan::new(fds.root, staging.name.clone(), epoch, keep);
        let after = match plan::run(&mut p, &mut exec) {
            Ok(()) => None,
            Err(e) if p.kept().is_some() => Some(e),
            Err(e) => return Err(e),
        };
        Ok((
            p.kept().map(|n| self.path().join(FAILED_DIR).join(n)),
            after,
        ))
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

    /// Publishes the files of a staging area as the new current checkpoint (owner only), with
    /// the protocol of [`plan::PublishPlan`]. Nested directories become `/`-separated names;
    /// an empty area, or one equal to the current checkpoint, is [`Published::Unchanged`].
    ///
    /// The area is looked up by its name now (card P1): if the writer replaced it, the new
    /// directory is published; if it is now a symlink or a file, the publish is refused. Every
    /// limit is checked by a first walk that reads no file, before anything durable is
    /// written (card P2); the second walk hands the files to the plan one at a time. Neither
    /// walk recurses, and both hold a bounded number of descriptors at any depth.
    pub fn publish(&self, epoch: u64, staging: &Staging) -> Result<Published, CheckpointError> {
        self.publish_staged(epoch, staging, false)
    }

    /// Publishes a staging area the caller gives away: as [`CheckpointStore::publish`], but a
    /// staged file that becomes a new blob is **adopted** — hard-linked into the store, made
    /// read-only and hashed from the bytes read — instead of copied, when it is ours alone: a
    /// regular file of the effective user, with one name, on the store's filesystem, that no
    /// process holds open for writing or mapped writable (checked after it was made read-only,
    /// so only root could open it for writing afterwards). Anything else is copied. Adoption
    /// writes nothing but names, and the staged originals need no deletion of data afterwards.
    ///
    /// The caller must discard the area after the publish ([`CheckpointStore::discard_staging`])
    /// and write nothing into it meanwhile: its adopted files share their data with blobs of
    /// the store. If the publish fails, the area keeps every file (the adopted ones read-only)
    /// for [`CheckpointStore::keep_failed`]. Whatever alters a blob afterwards (root writing
    /// through a staged name before the discard), the load refuses it by its digest.
    pub fn publish_adopting(
        &self,
        epoch: u64,
        staging: &Staging,
    ) -> Result<Published, CheckpointError> {
        self.publish_staged(epoch, staging, adopt_allowed())
    }

    fn publish_staged(
        &self,
        epoch: u64,
        staging: &Staging,
        adopt: bool,
    ) -> Result<Published, CheckpointError> {
        let (root, _, _) = self.owned_dirs()?;
        let parent = root.open_dir(STAGING_DIR)?;
        // The area is opened first (one `openat` and its `fstat` on the run path); only when
        // that fails does a look say what is there instead (issue 11).
        let top = match parent.open_dir_any_mode(&staging.name) {
            Ok(top) => top,
            Err(FsError::NotFound { .. }) => return self.nothing_to_publish(epoch),
            Err(open_err) => match parent.stat(&staging.name)? {
                None => return self.nothing_to_publish(epoch),
                Some(st) => match FileKind::of_mode(st.st_mode) {
                    FileKind::Directory => return Err(open_err.into()),
                    FileKind::Symlink => return Err(unsupported(staging.path(), "symlink")),
                    FileKind::Regular => return Err(unsupported(staging.path(), "regular file")),
                    FileKind::Fifo => return Err(unsupported(staging.path(), "fifo")),
                    FileKind::Socket => return Err(unsupported(staging.path(), "socket")),
                    FileKind::CharDevice => {
                        return Err(unsupported(staging.path(), "character device"));
                    }
                    FileKind::BlockDevice => {
                        return Err(unsupported(staging.path(), "block device"));
                    }
                    FileKind::Unknown => {
                        return Err(unsupported(staging.path(), "file of unknown type"));
                    }
                },
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
        // An empty output (the common run that publishes nothing) is not listed again.
        if count == 0 {
            return self.run_publish(epoch, 0, &mut |_| Ok(None), None);
        }
        let mut walker = tree::Walker::new(&top, self.limits)?;
        let top_path = top.path().to_path_buf();
        let euid = rustix::process::geteuid().as_raw();
        let mut next = |exec: &mut Exec<'_>| -> Result<Option<plan::Input>, CheckpointError> {
            let Some(found) = walker.next()? else {
                return Ok(None);
            };
            let leaf = found.name.rsplit('/').next().unwrap_or(&found.name);
            let (f, st) = walker.dir()?.open_file_any_mode_stat(leaf)?;
            let path = top_path.join(&found.name);
            let size = st.st_size as u64;
            // Only a file of ours with one name may be adopted (the plan checks again once it
            // is linked); the link itself refuses another filesystem.
            let ours = adopt && st.st_nlink == 1 && st.st_uid == euid;
            let fd = exec.adopt_file(f, path);
            Ok(Some(plan::Input {
                name: found.name,
                mode: st.st_mode & 0o777,
                src: if ours {
                    Src::Staged { fd, size }
                } else {
                    Src::File { fd, size }
                },
            }))
        };
        self.run_publish(epoch, count, &mut next, None)
    }

    /// Rollback (owner only): publishes the files of checkpoint `to` again, as a new checkpoint
    /// written at `epoch`, through the same protocol as every publish (the publish plan: fence,
    /// blobs, the batch, manifest, fence, `CURRENT`, GC). `to` is verified completely first, and
    /// its blobs are carried over by digest ([`Source::Blob`]): nothing is copied.
    ///
    /// It works whatever `CURRENT` holds, since its purpose is to get past a current checkpoint
    /// that is refused: the new checkpoint's parent is the checkpoint `CURRENT` names (or, when
    /// `CURRENT` cannot be read, the newest manifest), so the refused checkpoint stays in the
    /// kept chain as evidence until a later garbage collection; the new id is above every
    /// manifest in the store, so nothing is overwritten. When `to` is the current checkpoint
    /// and it verifies, nothing changes ([`Published::Unchanged`]).
    pub fn republish(&self, epoch: u64, to: CheckpointId) -> Result<Published, CheckpointError> {
        // The publish plan fences first of all; the rollback's target is read before it.
        self.owned_dirs()?;
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
            path: self.store_path().current(),
        })?;
        let count = target.entries.len() as u64;
        let mut it = target.entries.into_iter();
        self.run_publish(
            epoch,
            count,
            &mut |_| {
                Ok(it.next().map(|e| plan::Input {
                    name: e.name,
                    mode: e.mode,
                    src: Src::Blob {
                        sha256: e.sha256,
                        size: e.size,
                    },
                }))
            },
            Some((parent, id)),
        )
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
        self.run_publish(
            epoch,
            count,
            &mut |exec| {
                let Some(f) = it.next() else {
                    return Ok(None);
                };
                let path = PathBuf::from(&f.name);
                let src = match f.source {
                    Source::Reader(r) => Src::Reader {
                        fd: exec.adopt_reader(r, path),
                    },
                    Source::File(file) => {
                        let size = file
                            .metadata()
                            .map_err(|e| CheckpointError::io(&path, "stat", e))?
                            .len();
                        Src::File {
                            fd: exec.adopt_file(file, path),
                            size,
                        }
                    }
                    Source::Blob { sha256, size } => Src::Blob { sha256, size },
                };
                Ok(Some(plan::Input {
                    name: f.name,
                    mode: f.mode & 0o777,
                    src,
                }))
            },
            None,
        )
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

    /// The staging area is gone: nothing to publish, fenced and with `CURRENT` read as a
    /// publish of no file does.
    fn nothing_to_publish(&self, epoch: u64) -> Result<Published, CheckpointError> {
        self.run_publish(epoch, 0, &mut |_| Ok(None), None)
    }

    /// Runs the publish plan on the real filesystem, feeding it `next`'s inputs one at a time.
    fn run_publish<'r>(
        &'r self,
        epoch: u64,
        count: u64,
        next: &mut dyn FnMut(&mut Exec<'r>) -> Result<Option<plan::Input>, CheckpointError>,
        over: Option<(Option<CheckpointId>, CheckpointId)>,
    ) -> Result<Published, CheckpointError>
    where
        's: 'r,
    {
        let (exec, fds) = self.owned_fds()?;
        let mut exec: Exec<'r> = exec;
        let created_at_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_millis() as u64)
            .unwrap_or(0);
        let mut p = plan::PublishPlan::new(
            self.store_path(),
            fds,
            self.limits,
            self.keep,
            epoch,
            count,
            created_at_ms,
        );
        p = p.own_fsync_from(own_fsync_min());
        if let Some((parent, id)) = over {
            p = p.over(parent, id);
        }
        // A shared store (issue 14): the pointer is read and the manifests listed before the
        // plan, which then moves the pointer through its `Replace` step.
        if let Some(pointer) = self.pointer {
            p = p.shared(pointer.read()?, self.manifest_ids()?.last().copied())?;
        }
        let mut acked = false;
        let res = loop {
            let r = match p.poll() {
                Poll::Op(step) => {
                    let r = exec.run(step);
                    p.handle(r)
                }
                Poll::Input => next(&mut exec).and_then(|input| p.give_input(input)),
                Poll::Replace(current) => {
                    let pointer = self.pointer.expect("only a shared publish replaces");
                    let r = pointer.replace(&current, epoch);
                    p.replaced(r)
                }
                Poll::Done => break Ok(()),
                Poll::Verify(..) | Poll::Wait => unreachable!("a publish verifies in order"),
            };
            if let Err(e) = r {
                break Err(e);
            }
            if p.acked() && !acked {
                acked = true;
                if let Err(e) = crate::failpoint::hit("publish.acked") {
                    break Err(CheckpointError::io(self.path(), "acknowledge", e));
                }
            }
        };
        if let Err(e) = res {
            // A failed publish leaves nothing behind (best effort; a crash leaves scratch the
            // next owned open removes): the executor removes the temp files it made, and the
            // blobs this publish gathered in `incoming/` go with the directory.
            drop(exec);
            if !acked && let Ok((root, _, _)) = self.owned_dirs() {
                let _ = root.remove_tree(p.incoming_dir(), "publish.incoming");
            }
            return Err(e);
        }
        Ok(p.output()
            .expect("a finished publish has an outcome")
            .clone())
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
    /// descriptors that do not grow with the number of files or their depth. The load plan
    /// checks every blob as the copy reads it. `Ok(None)` when there is no checkpoint.
    pub fn materialise_current(
        &self,
    ) -> Result<Option<(CheckpointSummary, View)>, CheckpointError> {
        let (root, _, _) = self.owned_dirs()?;
        if self.read_current()?.is_none() {
            return Ok(None);
        }
        let parent = root.ensure_dir(VIEWS_DIR, "view")?;
        let name = tree::random_name()?;
        // Scratch: the view's entry need not survive a power loss, which ends its reader too.
        parent.mkdir(&name, "view")?;
        let top = parent.open_dir(&name)?;
        let path = top.path().to_path_buf();
        let res = (|| {
            let (mut exec, [root, manifests, blobs]) = self.exec()?;
            let Some((mut plan, _)) = self.current_plan(root, manifests, blobs, 1)? else {
                return Ok(None);
            };
            let mut w = tree::ViewWriter::new(&top);
            let mut buf = hash::buffer();
            loop {
                match plan.poll() {
                    Poll::Op(step) => {
                        let r = exec.run(step);
                        plan.handle(r)?;
                    }
                    Poll::Verify(token, _) => {
                        // The check reads the blob by copying it into the view.
                        let e = plan.ready_entry().expect("a verify step names its entry");
                        let r = self.copy_into_view(&mut w, e, &mut buf);
                        plan.dispatched()?;
                        plan.verified(token, r.map(Done::Hashed))?;
                    }
                    Poll::Done => break,
                    Poll::Input | Poll::Wait | Poll::Replace(_) => {
                        unreachable!("a load plan run in order")
                    }
                }
            }
            w.finish()?;
            match plan.output() {
                Some(plan::Loaded::Verified(s)) => Ok(Some(*s)),
                Some(plan::Loaded::Nothing) | None => Ok(None),
            }
        })();
        drop(top);
        match res {
            Ok(Some(s)) => Ok(Some((s, View { path, name }))),
            other => {
                // Best effort: a leftover view is scratch that the next owned open sweeps.
                let _ = tree::remove_tree(&parent, &name, "view");
                other.map(|_| None)
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
        parent.mkdir(name, "view")?;
        let top = parent.open_dir(name)?;
        let path = top.path().to_path_buf();
        let res = (|| {
            let mut w = tree::ViewWriter::new(&top);
            let mut buf = hash::buffer();
            for e in &checkpoint.entries {
                let got = self.copy_into_view(&mut w, e, &mut buf)?;
                if let Some(m) = plan::check_blob(e, &got) {
                    return Err(plan::blob_mismatch(self.blob_path(&e.sha256), e, m));
                }
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

    /// Copies the blob of `e` into the view at its name (read-only) and returns what the copy
    /// held; the caller checks it against the entry.
    fn copy_into_view(
        &self,
        w: &mut tree::ViewWriter<'_>,
        e: &Entry,
        buf: &mut [u8],
    ) -> Result<Summary, FsError> {
        let view_err = |err: CheckpointError| match err {
            CheckpointError::Fs(fs) => fs,
            other => FsError::Io {
                op: "write the view of",
                path: PathBuf::from(&e.name),
                source: std::io::Error::other(other.to_string()),
            },
        };
        let (dir, leaf) = w.dir_for(&e.name).map_err(view_err)?;
        let mut out = dir.create_exclusive(leaf, "view")?;
        let out_path = dir.child_path(leaf);
        let mut src = match self.open_blob(e) {
            Ok(f) => f,
            Err(CheckpointError::BlobMissing { path, .. }) => {
                return Err(FsError::NotFound { path });
            }
            Err(other) => return Err(view_err(other)),
        };
        // Read at most one byte past the promised size: enough to notice a longer blob.
        let limit = e.size.saturating_add(1);
        let mut sink = |chunk: &[u8], _: u64| {
            write_sparse(&mut out, chunk).map_err(|err| FsError::io("write", out_path.clone(), err))
        };
        let got = if e.size >= hash::PIPELINE_MIN {
            hash::pipe(&mut src, Some(limit), &mut sink)
        } else {
            hash::copy_small(&mut src, limit, buf, &mut sink)
        }
        .map_err(|err| match err {
            hash::PipeError::Read(err) => FsError::io("read", self.blob_path(&e.sha256), err),
            hash::PipeError::Sink(err) => err,
        })?;
        // Zeros at the end were skipped, not written.
        out.set_len(got.size)
            .map_err(|err| FsError::io("write", out_path.clone(), err))?;
        rustix::fs::fchmod(&out, Mode::from_raw_mode(e.mode & 0o500))
            .map_err(|err| FsError::io("make read-only", out_path.clone(), err))?;
        Ok(Summary {
            size: got.size,
            sha256: got.sha256.0,
        })
    }

    /// Removes a view made by [`CheckpointStore::materialise`].
    pub fn remove_view(&self, view: View) -> Result<(), CheckpointError> {
        let (root, _, _) = self.owned_dirs()?;
        let parent = root.open_dir(VIEWS_DIR)?;
        tree::remove_tree(&parent, &view.name, "view")
    }
}

/// Writes `chunk` at `out`'s position, seeking over every whole block of zeros instead of
/// writing it, so a sparse file copied into a view stays sparse (as `cp` keeps holes); the
/// caller sets the file's length at the end, for zeros that end it.
fn write_sparse(out: &mut File, chunk: &[u8]) -> std::io::Result<()> {
    use std::io::{Seek, SeekFrom};
    const BLOCK: usize = 4096;
    let zero = |b: &[u8]| b.iter().all(|&x| x == 0);
    let mut rest = chunk;
    while !rest.is_empty() {
        let data: usize = rest
            .chunks(BLOCK)
            .take_while(|b| !zero(b))
            .map(<[u8]>::len)
            .sum();
        out.write_all(&rest[..data])?;
        rest = &rest[data..];
        let zeros: usize = rest
            .chunks(BLOCK)
            .take_while(|b| zero(b))
            .map(<[u8]>::len)
            .sum();
        if zeros > 0 {
            out.seek(SeekFrom::Current(zeros as i64))?;
        }
        rest = &rest[zeros..];
    }
    Ok(())
}

/// The size from which a new blob gets its own fsync ([`plan::OWN_FSYNC_MIN`]). With the
/// `failpoints` feature, `TENURE_OWN_FSYNC_MIN` sets it, so the crash tests reach both
/// durability paths (a blob's own fsync, the batch's `syncfs`) with small files.
fn own_fsync_min() -> u64 {
    #[cfg(feature = "failpoints")]
    if let Some(n) = std::env::var("TENURE_OWN_FSYNC_MIN")
        .ok()
        .and_then(|v| v.parse().ok())
    {
        return n;
    }
    plan::OWN_FSYNC_MIN
}

/// Whether a publish that may adopt staged files does. With the `failpoints` feature,
/// `TENURE_ADOPT=0` makes it copy them, so the crash tests reach the copy's steps too.
fn adopt_allowed() -> bool {
    #[cfg(feature = "failpoints")]
    if std::env::var("TENURE_ADOPT").is_ok_and(|v| v == "0") {
        return false;
    }
    true
}

/// How many threads check blobs at once: the available cores, at most 8 (each holds one
/// buffer, or three for a large blob).
fn verify_threads() -> usize {
    std::thread::available_parallelism()
        .map(std::num::NonZero::get)
        .unwrap_or(1)
        .min(8)
}

/// How many blob checks a load keeps outstanding: two per thread, so no thread waits for the
/// next while the plan parses.
fn verify_window() -> usize {
    verify_threads() * 2
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

/// The lease epoch of the checkpoint `CURRENT` names (card P3, the epoch rule), and where:
/// one read of `CURRENT` and one manifest header, whatever the length of the history (issue
/// 11: nothing on the run path is O(history)). Best effort and read-only: a store that cannot
/// be read records nothing.
///
/// Why the newest checkpoint is enough: every epoch a manifest or a kept output records was
/// handed out, and so made durable in the epoch file, before anything could record it; the
/// records the epoch rule reads besides the epoch file (this, the owner record, the registry)
/// only guard against an operator rewinding that file, and the newest of them carries the
/// highest epoch a live history reached (spec/lifecycle.md, "The epoch rule as built").
pub fn highest_epoch(state: &StateDir) -> Option<crate::lease::epoch::Seen> {
    // Every acquisition asks, and a dir without a checkpoint yet has nothing to say: one
    // lookup of CURRENT answers that before the store's directories are opened (issue 11).
    // Anything but "not there" (a CURRENT, an error) goes on to read it through the store.
    if let Err(rustix::io::Errno::NOENT) = rustix::fs::statat(
        state.root(),
        Path::new(STORE_DIR).join(CURRENT_FILE),
        rustix::fs::AtFlags::SYMLINK_NOFOLLOW,
    ) {
        return None;
    }
    let store = CheckpointStore::open(state, StoreOptions::default()).ok()?;
    let current = store.read_current().ok()??;
    let h = store.manifest_header(current.id).ok()?;
    Some(crate::lease::epoch::Seen {
        epoch: h.epoch,
        path: store.manifest_path(current.id),
    })
}

/// The epoch and sequence number in the name of a kept output (`<epoch>` or `<epoch>.<n>`).
pub fn failed_name(name: &str) -> Option<(u64, u32)> {
    let (epoch, n) = match name.split_once('.') {
        Some((a, b)) => (a.parse().ok()?, b.parse().ok()?),
        None => (name.parse().ok()?, 0),
    };
    Some((epoch, n))
}

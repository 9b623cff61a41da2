//! The checkpoint store under crashes and power loss, running the store's real plans
//! (`tenure::checkpoint::plan`) on the crash filesystem ([`crate::fs::SimFs`]).
//!
//! # The world
//! One state dir. Runs come one after another; each run is one process with the real machine
//! (in-process workload) driven through the shared [`Driver`]: acquire (the lease is always
//! free; the world writes the epoch file as the lease does), recover, drain, publish, release.
//! `Recover` is the store's owned open ([`OpenPlan`], sweep included) followed by the load
//! ([`LoadPlan`]); `Publish` is the real [`PublishPlan`] — fence, parent check, blobs into
//! `incoming/`, the one `syncfs` batch, blobs and manifest named, directories synced, fence,
//! `CURRENT` replaced, GC ([`tenure::checkpoint::plan::GcPlan`]) — of two files the writer
//! left in a staging area: one whose bytes every run shares (a deduplicated blob after the
//! first) and one new per run. The model state holds the plans themselves, so every step of
//! them is a state; a step runs the plan up to and including its next step that changes the
//! filesystem (reads, opens, listings and hashes change nothing a crash could see, so folding
//! them into the next change loses no crash outcome).
//!
//! Between any two steps the world may:
//! - **crash the process** (kill -9): every handle is gone, nothing written is lost;
//! - **cut the power**: every outcome of [`SimFs::power_loss`] is a successor (unsynced writes
//!   lost, any subset of the unsynced entry operations kept, each whole), and every process is
//!   gone;
//! - during a publish, **take the dir over** (another owner's epoch is persisted, as after a
//!   lost lock): the publish must be fenced.
//!
//! Between runs the world may flip a byte of one file (a corruption) to check that the load
//! refuses it.
//!
//! # The oracle
//! Whether `CURRENT` names a complete, digest-valid checkpoint is decided here, from the
//! format's definition (the real parsers, sha256 of every file), independently of the load
//! plan, so a planted bug in the load cannot blind the property that checks it.

use std::cell::RefCell;
use std::collections::BTreeSet;
use std::ffi::OsStr;
use std::sync::Arc;

use crate::driver::{Driver, Request};
use crate::fs::{PowerLoss, Reorder, SimFs};
use crate::run::BuildFingerprint;
use crate::shared::Shared;
use sha2::Digest as _;
use stateright::{Model, Property};
use tenure::checkpoint::format::{Current, ManifestReader};
use tenure::checkpoint::plan::{
    self, Input, LoadPlan, Loaded, OpenPlan, Plan, Poll, PublishPlan, Src, StoreFds, StorePath,
};
use tenure::checkpoint::{Limits, Published};
use tenure::fsop::{Done, Executor, Fd, Op, Step};
use tenure::machine::{Action, Config, Event, Fault};

/// I12: after a crash or a power loss `CURRENT` names a complete, digest-valid checkpoint, and
/// it is the pointer the last acknowledged publish wrote or one an unacknowledged publish wrote
/// since (a load may have read such a pointer: it may vanish with power loss, as the publish
/// that wrote it was never acknowledged), never anything older; once a publish is acknowledged,
/// its pointer.
pub const CURRENT_VALID_AFTER_CRASH: &str = "current valid after crash";
/// I12: when a publish is acknowledged, `CURRENT` names the new checkpoint and it is complete
/// and digest-valid.
pub const PUBLISHED_VALID: &str = "acknowledged checkpoint valid";
/// I13: the GC deletes nothing `CURRENT` could name after a power loss at that moment.
pub const GC_KEEPS_CURRENT: &str = "gc keeps current";
/// I14: a load that refuses the state changes nothing.
pub const NO_REPAIR: &str = "no repair";
/// I14: a load never accepts a checkpoint that is not complete and digest-valid.
pub const CORRUPTION_REFUSED: &str = "corruption refused";
/// Issue 11: a successor after a crash or a power loss starts clean: without a corruption or a
/// takeover, it recovers and publishes.
pub const CLEAN_AFTER_POWER_LOSS: &str = "clean after power loss";
/// I3: a publish whose last fence ran after a newer epoch was persisted never replaces
/// `CURRENT`.
pub const FENCED_PUBLISH: &str = "fenced publish";
/// The driver feeds only events its semantics allow and the machine accepts.
pub const LEGAL_EVENTS: &str = "legal events";
/// Issue 11: a staged file adopted as a blob is never altered afterwards: a writer that still
/// holds it open for writing makes the publish copy it, so its late write changes no blob.
pub const BLOBS_UNALTERED: &str = "adopted blobs unaltered";

const V_CRASH: u16 = 1;
const V_GC: u16 = 2;
const V_REPAIR: u16 = 4;
const V_ACCEPT: u16 = 8;
const V_ILLEGAL: u16 = 16;
const V_UNCLEAN: u16 = 32;
const V_FENCE: u16 = 64;
const V_PUBLISHED: u16 = 128;
const V_ALTERED: u16 = 256;

const S_KEPT_OLD: u16 = 1;
const S_KEPT_NEW: u16 = 2;
const S_GC_DELETED: u16 = 4;
const S_DEDUP: u16 = 8;
const S_CORRUPT_REFUSED: u16 = 16;
const S_ALL_RUNS: u16 = 32;
const S_LOST_UNSYNCED: u16 = 64;
const S_FENCED: u16 = 128;
const S_CLEAN_AFTER_POWER_LOSS: u16 = 256;
const S_ADOPTED: u16 = 512;
const S_HELD_COPIED: u16 = 1024;

/// The store's directory and the staging area the writer fills, relative to the state dir.
const STORE: &str = "checkpoints";
const STAGING: &str = "checkpoints/staging/w";
const CURRENT: &str = "checkpoints/CURRENT";
/// The two files every run publishes: the shared one and the run's own.
const FILES: [&str; 2] = ["a-shared", "b-own"];

/// What the process of the current run is doing.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Stage {
    /// No process runs.
    Idle,
    /// The owned open runs; the load follows.
    Opening(Shared<OpenPlan>),
    /// The load runs.
    Loading(Shared<LoadPlan>),
    /// A publish runs; `next` is the next staged file to hand it.
    Publishing(Shared<PublishPlan>, u8),
    /// The last run refused the state: nothing runs again.
    Halted,
}

/// The bytes of a `CURRENT` the model remembers, shared between the states that hold it (a
/// clone is a reference count: every successor carries them), compared by value and hashed
/// by the hash of their value, computed once (every state's fingerprint hashes its pointers).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Pointer(Shared<Box<[u8]>>);

impl std::ops::Deref for Pointer {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        &self.0
    }
}

impl From<&[u8]> for Pointer {
    fn from(bytes: &[u8]) -> Pointer {
        Pointer(Shared::new(bytes.into()))
    }
}

/// The checkpoint model and its bounds.
#[derive(Debug, Clone)]
pub struct CheckpointModel {
    /// Runs (each publishes once) in all.
    pub runs: u8,
    /// Process crashes (kill -9) in all.
    pub crashes: u8,
    /// Power losses in all.
    pub power_losses: u8,
    /// Corruptions (one flipped file between runs) in all.
    pub corruptions: u8,
    /// Takeovers (another owner's epoch persisted during a publish) in all.
    pub takeovers: u8,
    /// The GC's `keep` values checked (one initial state each).
    pub keeps: Vec<u8>,
    /// Whether a corruption may hit files no checkpoint references (a blob a crashed publish
    /// left behind): deduplication must then check an existing blob before reusing it.
    pub corrupt_orphans: bool,
    /// Which entry operations power loss may keep.
    pub reorder: Reorder,
    /// Runs whose writer leaves a process behind that still holds the run's own staged file
    /// open for writing during the publish, and writes through it once, at any later point.
    pub late_writers: u8,
}

impl CheckpointModel {
    /// The configuration checked in CI: two runs, one crash, one power loss (entry operations
    /// kept in order, as a metadata journal commits them), one corruption, one takeover,
    /// `keep` = 1.
    pub fn ci() -> CheckpointModel {
        CheckpointModel {
            runs: 2,
            crashes: 1,
            power_losses: 1,
            corruptions: 1,
            takeovers: 1,
            keeps: vec![1],
            corrupt_orphans: true,
            reorder: Reorder::Prefix,
            late_writers: 1,
        }
    }

    /// The long configuration (`TENURE_LONG`): three runs, `keep` = 1 and 2.
    pub fn three_runs() -> CheckpointModel {
        CheckpointModel {
            runs: 3,
            keeps: vec![1, 2],
            ..CheckpointModel::ci()
        }
    }

    /// The long configuration with any subset of the unsynced entry operations kept by a power
    /// loss (a filesystem that reorders its metadata): a crash and a power loss, no corruption
    /// or takeover (with them the subsets make it too large to finish in minutes).
    pub fn any_subset() -> CheckpointModel {
        CheckpointModel {
            reorder: Reorder::Subset,
            corruptions: 0,
            takeovers: 0,
            ..CheckpointModel::ci()
        }
    }
}

/// The state of the checkpoint world.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct CheckpointState {
    /// The filesystem (and the running process's handles), shared with the states that hold
    /// it unchanged (every power-loss successor of a disk holds one of its outcomes).
    pub fs: Shared<SimFs>,
    /// The GC's `keep`.
    pub keep: u8,
    /// The current run's driver, shared with the states that hold it unchanged (every crash
    /// and power-loss successor holds a fresh one: the same allocation, hashed once).
    pub drv: Shared<Driver>,
    /// What the process does.
    pub stage: Stage,
    /// The store's directories, once the owned open opened them.
    pub fds: Option<StoreFds>,
    /// Runs started.
    pub run: u8,
    /// Runs whose publish was acknowledged.
    pub published: u8,
    /// The model's number of runs (the same in every state).
    pub runs: u8,
    /// The last durable pointer: what the last acknowledged publish wrote; `None` before any.
    pub durable: Option<Pointer>,
    /// Pointers publishes wrote since `durable` was set (unacknowledged: a crash or power loss
    /// may keep or drop each).
    pub written: Vec<Pointer>,
    /// Whether a corruption happened: the checkpoint a pointer names may then be broken.
    pub corrupted: bool,
    /// The `CURRENT` this run's publish writes, once its manifest is written.
    pub new: Option<Pointer>,
    /// Whether this run's publish was acknowledged.
    pub acked: bool,
    /// Whether another owner's epoch was persisted before this publish's last fence.
    pub stale: bool,
    /// Whether a crash or power loss preceded this run with no corruption or takeover since.
    pub after_crash: bool,
    /// Whether any corruption or takeover ever happened (the successor then need not be clean).
    pub tampered: bool,
    /// Crashes, power losses, corruptions and takeovers left.
    pub crashes_left: u8,
    /// Power losses left.
    pub power_left: u8,
    /// Corruptions left.
    pub corruptions_left: u8,
    /// Takeovers left.
    pub takeovers_left: u8,
    /// Late writers left.
    pub late_left: u8,
    /// Milestones reached (for the `sometimes` properties).
    pub seen: u16,
    /// Violations recorded by steps (bit set).
    pub violations: u16,
}

/// A step of the checkpoint world.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum CheckpointAction {
    /// A new run starts: the machine is started, acquires, and asks to recover.
    Run,
    /// The running plan's next step (with the reads before it).
    Step,
    /// The process is killed.
    Crash,
    /// Power loss, leaving the `n`th outcome of [`SimFs::power_loss`] (the outcomes carried
    /// along, shared: they are computed once per state).
    PowerLoss(usize, Arc<[PowerLoss]>),
    /// Another owner's epoch is persisted.
    Takeover,
    /// A byte of this file (a path in the state dir) flips between runs.
    Corrupt(String),
    /// The process that still holds a staged file open for writing appends to it and exits.
    LateWrite,
}

/// What `CURRENT` in `fs` names, judged by the format's definition.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Named {
    /// No `CURRENT`.
    Nothing,
    /// A complete, digest-valid checkpoint: its `CURRENT` bytes and the files it needs
    /// (paths in the state dir).
    Valid(Vec<u8>, BTreeSet<String>),
    /// Anything else.
    Invalid,
}

fn sha(b: &[u8]) -> [u8; 32] {
    sha2::Sha256::digest(b).into()
}

/// What the model asks about a disk: the bytes of its `CURRENT`, and [`judge`]'s verdict (made
/// the first time it is asked for).
struct Judged {
    current: Option<Box<[u8]>>,
    named: std::sync::OnceLock<Named>,
    /// The store's files a corruption may hit (made the first time they are asked for).
    ours: std::sync::OnceLock<Box<[String]>>,
}

impl Judged {
    fn named(&self, fs: &SimFs) -> &Named {
        self.named.get_or_init(|| judge(fs))
    }

    /// The live files of the store outside its staging area (paths in the state dir, in the
    /// order of [`SimFs::file_paths`]): what a corruption may flip a byte of.
    fn ours(&self, fs: &SimFs) -> &[String] {
        self.ours.get_or_init(|| {
            fs.file_paths(STORE)
                .into_iter()
                .filter(|path| {
                    path.strip_prefix(STORE)
                        .is_some_and(|p| p.starts_with('/') && !p.starts_with("/staging"))
                })
                .collect()
        })
    }
}

/// [`Judged`], remembered: it depends on the disk alone, and the model asks about the same disk
/// from many states (every crash and power loss checks what it left: `CURRENT`, and its
/// verdict without a corruption), so what was found for the disks seen last is kept (per
/// checker thread, a bounded table keyed by the whole filesystem value: the same answers
/// whether remembered or not). A disk found equal in another allocation takes its entry's
/// place: the allocation asked about last is the one the next states share (a remembered
/// power-loss outcome, [`SimFs::power_loss_outcomes`]), so their look-ups are found by pointer
/// rather than by comparing every inode (issue 12).
fn judged(fs: &Shared<SimFs>) -> Arc<Judged> {
    /// Disks remembered per thread before the table is emptied.
    const REMEMBERED: usize = 1 << 14;
    type Table = std::collections::HashMap<u64, (Shared<SimFs>, Arc<Judged>), BuildFingerprint>;
    thread_local! {
        static JUDGED: RefCell<Table> = RefCell::default();
    }
    let key = crate::run::fingerprint(fs);
    let hit = JUDGED.with_borrow_mut(|t| {
        let (k, j) = t.get_mut(&key)?;
        if Shared::ptr_eq(k, fs) {
            return Some(Arc::clone(j));
        }
        if *k != *fs {
            return None;
        }
        *k = fs.clone();
        Some(Arc::clone(j))
    });
    if let Some(j) = hit {
        return j;
    }
    let j = Arc::new(Judged {
        current: fs.read(CURRENT).map(Box::from),
        named: std::sync::OnceLock::new(),
        ours: std::sync::OnceLock::new(),
    });
    JUDGED.with_borrow_mut(|t| {
        if t.len() >= REMEMBERED {
            t.clear();
        }
        t.insert(key, (fs.clone(), Arc::clone(&j)));
    });
    j
}

/// The oracle: does `CURRENT` name a complete checkpoint whose every file matches its digest?
fn judge(fs: &SimFs) -> Named {
    let Some(cur) = fs.read(CURRENT) else {
        return Named::Nothing;
    };
    let Ok(c) = Current::parse(cur) else {
        return Named::Invalid;
    };
    let mpath = format!("{STORE}/manifests/{}", c.id.manifest_file_name());
    let Some(m) = fs.read(&mpath) else {
        return Named::Invalid;
    };
    if sha(m) != c.manifest_sha256.0 {
        return Named::Invalid;
    }
    let mut files = BTreeSet::from([CURRENT.to_string(), mpath]);
    let Ok(mut r) = ManifestReader::new(m, Limits::DEFAULT) else {
        return Named::Invalid;
    };
    loop {
        match r.next_entry() {
            Ok(Some(e)) => {
                let bpath = format!("{STORE}/blobs/sha256/{}", e.sha256.to_hex());
                match fs.read(&bpath) {
                    Some(b) if b.len() as u64 == e.size && sha(b) == e.sha256.0 => {
                        files.insert(bpath);
                    }
                    _ => return Named::Invalid,
                }
            }
            Ok(None) => break,
            Err(_) => return Named::Invalid,
        }
    }
    Named::Valid(cur.to_vec(), files)
}

/// Every blob of the store by its path: those in `blobs/sha256/`, and those a publish named by
/// their digest in `incoming/` already.
fn blob_paths(fs: &SimFs) -> Vec<String> {
    let mut v = fs.file_paths(&format!("{STORE}/blobs/sha256"));
    v.extend(
        fs.file_paths(&format!("{STORE}/incoming"))
            .into_iter()
            .filter(|p| p.rsplit('/').next().is_some_and(|n| n.len() == 64)),
    );
    v
}

/// Whether the blob at `path` holds the bytes its name is the digest of.
fn blob_intact(fs: &SimFs, path: &str) -> bool {
    let name = path.rsplit('/').next().unwrap_or_default();
    fs.read(path)
        .is_some_and(|b| tenure::checkpoint::format::Digest(sha(b)).to_hex() == name)
}

fn is_valid(n: &Named) -> bool {
    matches!(n, Named::Nothing | Named::Valid(..))
}

/// The content of file `f` of run `run`.
fn content(f: usize, run: u8) -> Vec<u8> {
    match f {
        0 => b"shared by every run\n".to_vec(),
        _ => format!("run {run}, a blob of its own\n").into_bytes(),
    }
}

/// The size from which the model's publish gives a blob its own fsync: the run's own file
/// (28 bytes) is large, the shared one (20 bytes) small, so the first run's batch is a
/// `syncfs` (the shared blob is new and small) and every later run's is the manifest's
/// fsync alone (its only new blob synced itself): both durability paths of the publish.
const OWN_FSYNC_MIN: u64 = 24;

fn store_path() -> StorePath {
    StorePath::new("/sim/checkpoints")
}

/// Opens a staged file for the publish, as the runner's walk of the staging area does.
fn open_input(fs: &mut SimFs, name: &str) -> (Fd, u64) {
    let mut dir = Fd::ROOT;
    for part in STAGING.split('/') {
        let d = fs
            .run(Step::new(
                "walk",
                Op::OpenDir {
                    dir,
                    name: OsStr::new(part),
                    any_mode: true,
                },
            ))
            .expect("the staging area was just written");
        if dir != Fd::ROOT {
            let _ = fs.run(Step::new("walk", Op::Close { fd: dir }));
        }
        dir = d.fd().expect("a handle");
    }
    let Done::Opened { fd, size } = fs
        .run(Step::new(
            "walk",
            Op::Open {
                dir,
                name: OsStr::new(name),
                check: tenure::fsop::Check::AnyMode,
            },
        ))
        .expect("a staged file")
    else {
        unreachable!("an open returns a handle")
    };
    let _ = fs.run(Step::new("walk", Op::Close { fd: dir }));
    (fd, size)
}

impl CheckpointState {
    fn feed(&mut self, ev: Event) {
        if self.drv.make_mut().feed(ev).is_err() {
            self.violations |= V_ILLEGAL;
        }
    }

    /// Runs the machine's actions; `Recover` and `Publish` start plans, everything else is
    /// answered at once (the lease is always free, the host drains as soon as it is ready, no
    /// residency is active).
    fn drive(&mut self) {
        loop {
            while let Some(a) = self.drv.make_mut().pop() {
                match a {
                    Action::Recover => {
                        self.stage = Stage::Opening(Shared::new(OpenPlan::new(true)));
                    }
                    Action::Publish => self.start_publish(),
                    Action::Exit(_) => {
                        // The process ends: its handles close, nothing is lost.
                        self.fs.make_mut().crash_process();
                        self.fds = None;
                        self.stage =
                            if self.drv.machine().kind() == tenure::machine::PhaseKind::Refused {
                                Stage::Halted
                            } else {
                                Stage::Idle
                            };
                    }
                    Action::AcquireLease
                    | Action::AbandonAcquire
                    | Action::SetPhase(_)
                    | Action::SpawnChild
                    | Action::ArmTimer(..)
                    | Action::DisarmTimer(_)
                    | Action::NotifyReady
                    | Action::NotifyStopping
                    | Action::BeginDrain
                    | Action::Forward(..)
                    | Action::Relay(..)
                    | Action::ExtendTimer(..)
                    | Action::Kill
                    | Action::ReleaseLease
                    | Action::Note(_) => {}
                }
            }
            if !self.drv.between_steps() {
                return;
            }
            let ev = match self.drv.request() {
                Some(Request::Acquire { .. }) => {
                    // The lease's acquisition persists the run's epoch before it grants it.
                    self.fs
                        .make_mut()
                        .put_file(".tenure/epoch", format!("{}\n", self.run).as_bytes());
                    Event::LeaseGranted {
                        epoch: u64::from(self.run),
                    }
                }
                Some(Request::Release) => Event::LeaseReleased,
                Some(Request::Recover | Request::Publish | Request::Spawn) => return,
                None => match self.drv.machine().kind() {
                    tenure::machine::PhaseKind::Ready => Event::DrainRequested,
                    tenure::machine::PhaseKind::Draining
                        if self.drv.admits(Event::ResidenciesSettled).is_ok() =>
                    {
                        Event::ResidenciesSettled
                    }
                    _ => return,
                },
            };
            self.feed(ev);
        }
    }

    /// The writer's output is in the staging area; the real publish plan starts.
    fn start_publish(&mut self) {
        for (f, name) in FILES.iter().enumerate() {
            self.fs
                .make_mut()
                .put_file_unsynced(&format!("{STAGING}/{name}"), &content(f, self.run));
        }
        if self.late_left > 0 {
            self.late_left -= 1;
            self.fs
                .make_mut()
                .hold_for_write(&format!("{STAGING}/{}", FILES[1]));
        }
        let fds = self.fds.expect("the owned open ran before the publish");
        self.stage = Stage::Publishing(
            Shared::new(
                PublishPlan::new(
                    store_path(),
                    fds,
                    Limits::DEFAULT,
                    usize::from(self.keep),
                    u64::from(self.run),
                    FILES.len() as u64,
                    0,
                )
                .own_fsync_from(OWN_FSYNC_MIN),
            ),
            0,
        );
    }

    /// Runs the current plan up to and including its next step that changes the filesystem,
    /// checking the step against I13 first.
    fn step(&mut self, reorder: Reorder) {
        loop {
            let mutated = match &self.stage {
                Stage::Opening(p) => peek_mutates(&**p),
                Stage::Loading(p) => peek_mutates(&**p),
                Stage::Publishing(p, _) => peek_mutates(&**p),
                Stage::Idle | Stage::Halted => return,
            };
            if mutated {
                self.check_gc_step(reorder);
            }
            // A clone shares every inode: cheap, and compared only if the load refuses.
            let before_load = matches!(self.stage, Stage::Loading(_)).then(|| self.fs.clone());
            let finished = self.one_step(before_load);
            if mutated || finished {
                return;
            }
        }
    }

    /// One step of the plan; `true` when the plan ended (and the machine was answered).
    fn one_step(&mut self, before_load: Option<Shared<SimFs>>) -> bool {
        let stage = std::mem::replace(&mut self.stage, Stage::Idle);
        match stage {
            Stage::Opening(mut p) => match plan::step(p.make_mut(), self.fs.make_mut()) {
                Ok(true) => self.stage = Stage::Opening(p),
                Ok(false) => {
                    let fds = p.output().expect("a finished open names its directories");
                    self.fds = Some(fds);
                    self.stage = Stage::Loading(Shared::new(LoadPlan::current(
                        store_path(),
                        Some(fds.root),
                        Some(fds.manifests),
                        Some(fds.blobs),
                        Limits::DEFAULT,
                        1,
                    )));
                }
                Err(_) => return self.recovered(false),
            },
            Stage::Loading(mut p) => match plan::step(p.make_mut(), self.fs.make_mut()) {
                Ok(true) => self.stage = Stage::Loading(p),
                Ok(false) => {
                    let accepted =
                        matches!(p.output(), Some(Loaded::Nothing | Loaded::Verified(_)));
                    return self.recovered(accepted);
                }
                Err(_) => {
                    // I14: a refusing load changed nothing.
                    if before_load.is_some_and(|t| !t.same_tree(&self.fs)) {
                        self.violations |= V_REPAIR;
                    }
                    return self.recovered(false);
                }
            },
            Stage::Publishing(mut p, next) => {
                let was_input = p.poll() == Poll::Input;
                let r = match p.poll() {
                    Poll::Input => {
                        let input = FILES.get(usize::from(next)).map(|name| {
                            let (fd, size) = open_input(self.fs.make_mut(), name);
                            Input {
                                name: (*name).to_string(),
                                mode: 0o600,
                                src: Src::Staged { fd, size },
                            }
                        });
                        p.make_mut().give_input(input).map(|()| true)
                    }
                    _ => plan::step(p.make_mut(), self.fs.make_mut()),
                };
                let next = if was_input { next + 1 } else { next };
                if self.new.is_none()
                    && let Some(c) = p.new_current()
                {
                    let bytes = Pointer::from(&c.to_bytes()[..]);
                    self.new = Some(bytes.clone());
                    self.written.push(bytes);
                }
                if p.acked() && !self.acked {
                    self.acked = true;
                    // I3: the fence must have stopped a publish a newer owner had overtaken.
                    if self.stale {
                        self.violations |= V_FENCE;
                    }
                    // I12: what is acknowledged is the new checkpoint, complete and valid.
                    let cur = self.fs.read(CURRENT);
                    if cur != self.new.as_deref()
                        || !matches!(judged(&self.fs).named(&self.fs), Named::Valid(..))
                    {
                        self.violations |= V_PUBLISHED;
                    }
                    self.durable.clone_from(&self.new);
                    self.written.clear();
                }
                match r {
                    Ok(true) => self.stage = Stage::Publishing(p, next),
                    Ok(false) => {
                        let out = p.output().cloned();
                        if let Some(Published::New {
                            bytes_written,
                            checkpoint,
                            gc,
                        }) = &out
                        {
                            if *bytes_written < checkpoint.bytes {
                                self.seen |= S_DEDUP;
                            }
                            let (adopted, refused) = p.adoption();
                            if adopted > 0 {
                                self.seen |= S_ADOPTED;
                            }
                            if refused > 0 {
                                self.seen |= S_HELD_COPIED;
                            }
                            if gc.manifests_removed > 0 {
                                self.seen |= S_GC_DELETED;
                            }
                        }
                        self.published(true);
                        return true;
                    }
                    Err(e) => {
                        if matches!(e, tenure::checkpoint::CheckpointError::StaleEpoch { .. }) {
                            self.seen |= S_FENCED;
                        }
                        self.published(false);
                        return true;
                    }
                }
            }
            Stage::Idle | Stage::Halted => self.stage = stage,
        }
        false
    }

    /// The recovery ended; the machine is answered.
    fn recovered(&mut self, accepted: bool) -> bool {
        let judged = judged(&self.fs);
        let truth = judged.named(&self.fs);
        if accepted && !is_valid(truth) {
            self.violations |= V_ACCEPT;
        }
        if !accepted && !is_valid(truth) {
            self.seen |= S_CORRUPT_REFUSED;
        }
        if !accepted && self.after_crash && !self.tampered {
            self.violations |= V_UNCLEAN;
        }
        self.stage = Stage::Idle;
        self.feed(if accepted {
            Event::RecoveryDone
        } else {
            Event::RecoveryFailed(Fault::State)
        });
        self.drive();
        true
    }

    fn published(&mut self, ok: bool) {
        // The late writer overlaps the publish only (a bound of the world).
        if self.fs.has_writer() {
            self.fs.make_mut().end_writers();
        }
        if ok {
            self.published += 1;
            if self.published == self.runs {
                self.seen |= S_ALL_RUNS;
            }
        }
        if self.after_crash && !self.tampered {
            if ok {
                self.seen |= S_CLEAN_AFTER_POWER_LOSS;
            } else {
                self.violations |= V_UNCLEAN;
            }
        }
        self.stage = Stage::Idle;
        self.feed(if ok {
            Event::CheckpointPublished
        } else {
            Event::CheckpointFailed
        });
        self.drive();
    }

    /// I13: a GC unlink must not delete a file of a checkpoint `CURRENT` could name after a
    /// power loss now.
    fn check_gc_step(&mut self, reorder: Reorder) {
        let Stage::Publishing(p, _) = &self.stage else {
            return;
        };
        let Poll::Op(Step {
            label,
            op: Op::Unlink { name, .. },
        }) = p.poll()
        else {
            return;
        };
        let dir = match label {
            "gc.manifest" => "manifests",
            "gc.blob" => "blobs/sha256",
            _ => return,
        };
        let path = format!("{STORE}/{dir}/{}", name.to_string_lossy());
        for outcome in self.fs.power_loss_outcomes(reorder).iter() {
            if let Named::Valid(_, files) = judged(&outcome.fs).named(&outcome.fs)
                && files.contains(&path)
            {
                self.violations |= V_GC;
            }
        }
    }

    /// I12 on the state a crash left.
    fn check_after_crash(&mut self) {
        let judged = judged(&self.fs);
        let cur = judged.current.as_deref();
        let (new, durable) = (self.new.as_deref(), self.durable.as_deref());
        let allowed = if self.acked {
            cur == new
        } else {
            cur == durable || cur.is_some_and(|c| self.written.iter().any(|w| **w == *c))
        };
        let valid = self.corrupted || is_valid(judged.named(&self.fs));
        let kept_old = new.is_some() && cur == durable && cur != new;
        let kept_new = new.is_some() && !self.acked && cur == new;
        if !(allowed && valid) {
            self.violations |= V_CRASH;
        }
        if kept_old {
            self.seen |= S_KEPT_OLD;
        }
        if kept_new {
            self.seen |= S_KEPT_NEW;
        }
    }

    /// This state with the disk `fs` (every other part cloned).
    fn with_fs(&self, fs: Shared<SimFs>) -> CheckpointState {
        CheckpointState {
            fs,
            keep: self.keep,
            drv: self.drv.clone(),
            stage: self.stage.clone(),
            fds: self.fds,
            run: self.run,
            published: self.published,
            runs: self.runs,
            durable: self.durable.clone(),
            written: self.written.clone(),
            corrupted: self.corrupted,
            new: self.new.clone(),
            acked: self.acked,
            stale: self.stale,
            after_crash: self.after_crash,
            tampered: self.tampered,
            crashes_left: self.crashes_left,
            power_left: self.power_left,
            corruptions_left: self.corruptions_left,
            takeovers_left: self.takeovers_left,
            late_left: self.late_left,
            seen: self.seen,
            violations: self.violations,
        }
    }

    fn after_process_end(&mut self) {
        if self.fs.has_writer() {
            self.fs.make_mut().end_writers();
        }
        self.stage = Stage::Idle;
        self.fds = None;
        self.drv = fresh_driver();
        self.after_crash = true;
    }
}

/// A run's driver before its machine started (one allocation per checker thread, shared).
fn fresh_driver() -> Shared<Driver> {
    thread_local! {
        static FRESH: Shared<Driver> = Shared::new(Driver::new(Config::in_process()));
    }
    FRESH.with(Shared::clone)
}

fn peek_mutates<P: Plan>(p: &P) -> bool {
    match p.poll() {
        Poll::Op(s) | Poll::Verify(_, s) => s.op.mutates(),
        // The model's store is a dir of its own: no cluster pointer is ever replaced.
        Poll::Input | Poll::Wait | Poll::Done | Poll::Replace(_) => false,
    }
}

impl Model for CheckpointModel {
    type State = CheckpointState;
    type Action = CheckpointAction;

    fn init_states(&self) -> Vec<CheckpointState> {
        self.keeps
            .iter()
            .map(|&keep| CheckpointState {
                fs: Shared::new(SimFs::new()),
                keep,
                drv: fresh_driver(),
                stage: Stage::Idle,
                fds: None,
                run: 0,
                published: 0,
                runs: self.runs,
                durable: None,
                written: Vec::new(),
                corrupted: false,
                new: None,
                acked: false,
                stale: false,
                after_crash: false,
                tampered: false,
                crashes_left: self.crashes,
                power_left: self.power_losses,
                corruptions_left: self.corruptions,
                takeovers_left: self.takeovers,
                late_left: self.late_writers,
                seen: 0,
                violations: 0,
            })
            .collect()
    }

    fn actions(&self, s: &CheckpointState, out: &mut Vec<CheckpointAction>) {
        if s.fs.has_writer() && matches!(s.stage, Stage::Publishing(..)) {
            out.push(CheckpointAction::LateWrite);
        }
        match &s.stage {
            Stage::Idle => {
                if s.run < self.runs {
                    out.push(CheckpointAction::Run);
                }
                if s.corruptions_left > 0 && s.run > 0 {
                    let judged = judged(&s.fs);
                    let now = judged.named(&s.fs);
                    let referenced = match now {
                        Named::Valid(_, files) => Some(files),
                        Named::Nothing | Named::Invalid => None,
                    };
                    // The store's files are remembered with the disk's verdict (the idle states
                    // after a power loss share their disk).
                    for path in judged.ours(&s.fs) {
                        if self.corrupt_orphans || referenced.is_some_and(|r| r.contains(path)) {
                            out.push(CheckpointAction::Corrupt(path.clone()));
                        }
                    }
                }
            }
            Stage::Opening(_) | Stage::Loading(_) | Stage::Publishing(..) => {
                out.push(CheckpointAction::Step);
                if s.crashes_left > 0 {
                    out.push(CheckpointAction::Crash);
                }
                if s.power_left > 0 {
                    let outcomes = s.fs.power_loss_outcomes(self.reorder);
                    for n in 0..outcomes.len() {
                        out.push(CheckpointAction::PowerLoss(n, Arc::clone(&outcomes)));
                    }
                }
                if s.takeovers_left > 0 && matches!(s.stage, Stage::Publishing(..)) {
                    out.push(CheckpointAction::Takeover);
                }
            }
            Stage::Halted => {}
        }
    }

    fn next_state(&self, s: &CheckpointState, action: CheckpointAction) -> Option<CheckpointState> {
        if let CheckpointAction::PowerLoss(n, outcomes) = action {
            // The disk is replaced: the state is built around the outcome, not around a copy
            // of the disk it replaces.
            let outcome = &outcomes[n];
            let mut s = s.with_fs(outcome.fs.clone());
            s.power_left -= 1;
            // A process crash would have kept the live tree as it was (it only closes
            // handles), so the power loss lost something iff the trees differ.
            if outcome.lost {
                s.seen |= S_LOST_UNSYNCED;
            }
            s.check_after_crash();
            s.after_process_end();
            return Some(s);
        }
        let mut s = s.clone();
        match action {
            CheckpointAction::Run => {
                s.run += 1;
                s.drv = fresh_driver();
                s.new = None;
                s.acked = false;
                s.stale = false;
                s.feed(Event::Start);
                s.drive();
            }
            CheckpointAction::Step => s.step(self.reorder),
            CheckpointAction::Crash => {
                s.crashes_left -= 1;
                s.fs = SimFs::crashed(&s.fs);
                s.check_after_crash();
                s.after_process_end();
            }
            CheckpointAction::PowerLoss(..) => unreachable!("handled above"),
            CheckpointAction::Takeover => {
                s.takeovers_left -= 1;
                s.tampered = true;
                if let Stage::Publishing(p, _) = &s.stage
                    && !p.fenced()
                {
                    s.stale = true;
                }
                s.fs.make_mut().put_file(
                    ".tenure/epoch",
                    format!("{}\n", u64::from(s.run) + 1).as_bytes(),
                );
            }
            CheckpointAction::LateWrite => {
                // Every blob whose bytes match its name before the write must still match
                // after it (a corruption may have broken one already: that one is not asked).
                let whole: Vec<String> = blob_paths(&s.fs)
                    .into_iter()
                    .filter(|b| blob_intact(&s.fs, b))
                    .collect();
                s.fs.make_mut().late_write(b"written late\n");
                if whole.iter().any(|b| !blob_intact(&s.fs, b)) {
                    s.violations |= V_ALTERED;
                }
            }
            CheckpointAction::Corrupt(path) => {
                s.corruptions_left -= 1;
                s.tampered = true;
                s.corrupted = true;
                let mut bytes = s.fs.read(&path)?.to_vec();
                match bytes.first_mut() {
                    Some(b) => *b ^= 0x20,
                    None => bytes.push(b'x'),
                }
                if path == CURRENT {
                    // The flipped pointer stands for the one it was (the load must refuse it).
                    let old = s.fs.read(CURRENT).map(Pointer::from);
                    for p in s.written.iter_mut().chain(s.durable.as_mut()) {
                        if Some(&*p) == old.as_ref() {
                            *p = Pointer::from(&bytes[..]);
                        }
                    }
                }
                s.fs.make_mut().put_file(&path, &bytes);
            }
        }
        Some(s)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        let mut v = vec![
            Property::always(CURRENT_VALID_AFTER_CRASH, |_, s: &CheckpointState| {
                s.violations & V_CRASH == 0
            }),
            Property::always(PUBLISHED_VALID, |_, s: &CheckpointState| {
                s.violations & V_PUBLISHED == 0
            }),
            Property::sometimes(
                "crash keeps the old checkpoint",
                |_, s: &CheckpointState| s.seen & S_KEPT_OLD != 0,
            ),
            Property::sometimes(
                "crash keeps the new checkpoint",
                |_, s: &CheckpointState| s.seen & S_KEPT_NEW != 0,
            ),
            Property::sometimes(
                "power loss loses unsynced writes",
                |_, s: &CheckpointState| s.seen & S_LOST_UNSYNCED != 0,
            ),
            Property::always(GC_KEEPS_CURRENT, |_, s: &CheckpointState| {
                s.violations & V_GC == 0
            }),
            Property::sometimes(
                "gc deletes a superseded checkpoint",
                |_, s: &CheckpointState| s.seen & S_GC_DELETED != 0,
            ),
            Property::sometimes(
                "a shared blob is not rewritten",
                |_, s: &CheckpointState| s.seen & S_DEDUP != 0,
            ),
            Property::always(NO_REPAIR, |_, s: &CheckpointState| {
                s.violations & V_REPAIR == 0
            }),
            Property::always(CORRUPTION_REFUSED, |_, s: &CheckpointState| {
                s.violations & V_ACCEPT == 0
            }),
            Property::always(CLEAN_AFTER_POWER_LOSS, |_, s: &CheckpointState| {
                s.violations & V_UNCLEAN == 0
            }),
            Property::sometimes(
                "a successor publishes after a crash",
                |_, s: &CheckpointState| s.seen & S_CLEAN_AFTER_POWER_LOSS != 0,
            ),
            Property::always(FENCED_PUBLISH, |_, s: &CheckpointState| {
                s.violations & V_FENCE == 0
            }),
            Property::sometimes("every run publishes", |_, s: &CheckpointState| {
                s.seen & S_ALL_RUNS != 0
            }),
            Property::always(LEGAL_EVENTS, |_, s: &CheckpointState| {
                s.violations & V_ILLEGAL == 0
            }),
            Property::sometimes("a staged file is adopted", |_, s: &CheckpointState| {
                s.seen & S_ADOPTED != 0
            }),
        ];
        // The late writer's examples exist only where the world has one.
        if self.late_writers > 0 {
            v.push(Property::always(
                BLOBS_UNALTERED,
                |_, s: &CheckpointState| s.violations & V_ALTERED == 0,
            ));
            v.push(Property::sometimes(
                "a file held open for writing is copied",
                |_, s: &CheckpointState| s.seen & S_HELD_COPIED != 0,
            ));
        }
        // The corruption and takeover examples exist only where the world has them.
        if self.corruptions > 0 {
            v.push(Property::sometimes(
                "a corrupt checkpoint is refused",
                |_, s: &CheckpointState| s.seen & S_CORRUPT_REFUSED != 0,
            ));
        }
        if self.takeovers > 0 {
            v.push(Property::sometimes(
                "a stale publish is fenced",
                |_, s: &CheckpointState| s.seen & S_FENCED != 0,
            ));
        }
        v
    }
}

impl crate::run::Describe for CheckpointModel {
    fn describe(&self, path: &[(CheckpointState, Option<CheckpointAction>)]) -> Vec<String> {
        let mut lines = Vec::new();
        if let Some((s, _)) = path.first() {
            lines.push(format!("keep = {}", s.keep));
        }
        for (s, a) in path {
            let Some(a) = a else { continue };
            lines.push(match a {
                CheckpointAction::Run => format!("run {} starts (epoch {})", s.run + 1, s.run + 1),
                CheckpointAction::Step => {
                    let step = match &s.stage {
                        Stage::Opening(p) => next_change(&**p),
                        Stage::Loading(p) => next_change(&**p),
                        Stage::Publishing(p, _) => next_change(&**p),
                        Stage::Idle | Stage::Halted => None,
                    };
                    match step {
                        Some(st) => format!("  {}", st),
                        None => "  (the plan ends)".into(),
                    }
                }
                CheckpointAction::Crash => "the process is killed".into(),
                CheckpointAction::PowerLoss(n, _) => format!("power loss (outcome {n})"),
                CheckpointAction::Takeover => "another owner persists a newer epoch".into(),
                CheckpointAction::Corrupt(p) => format!("a byte of {p} flips"),
                CheckpointAction::LateWrite => {
                    "the process still holding the run's staged file open writes to it".into()
                }
            });
        }
        if let Some((s, _)) = path.last() {
            lines.push(format!(
                "CURRENT = {:?}",
                s.fs.read(CURRENT).map(String::from_utf8_lossy)
            ));
        }
        lines
    }
}

/// The plan's next step, told in words.
fn next_change<P: Plan>(p: &P) -> Option<String> {
    match p.poll() {
        Poll::Op(s) | Poll::Verify(_, s) => Some(format!(
            "{}.{} {}",
            s.label,
            s.op.step_name(),
            describe_op(&s.op)
        )),
        Poll::Input => Some("the next staged file".into()),
        Poll::Wait | Poll::Done | Poll::Replace(_) => None,
    }
}

fn describe_op(op: &Op<'_>) -> String {
    match op {
        Op::OpenDir { name, .. }
        | Op::Mkdir { name, .. }
        | Op::CreateNew { name, .. }
        | Op::Open { name, .. }
        | Op::ReadFile { name, .. }
        | Op::HashFile { name, .. }
        | Op::WriteAt { name, .. }
        | Op::Unlink { name, .. }
        | Op::Rmdir { name, .. }
        | Op::RemoveTree { name, .. }
        | Op::Stat { name, .. } => name.to_string_lossy().into_owned(),
        Op::Rename { from, to, .. } => {
            format!("{} -> {}", from.to_string_lossy(), to.to_string_lossy())
        }
        Op::Write { bytes, .. } => format!("{} bytes", bytes.len()),
        Op::CreateTemp { .. }
        | Op::Read { .. }
        | Op::Rewind { .. }
        | Op::Copy { .. }
        | Op::Hash { .. }
        | Op::Chmod { .. }
        | Op::Fsync { .. }
        | Op::Close { .. }
        | Op::SyncDir { .. }
        | Op::SyncFs { .. }
        | Op::Sole { .. }
        | Op::List { .. }
        | Op::ListNext { .. } => String::new(),
        Op::LinkFd { to, .. } => format!("link as {}", to.to_string_lossy()),
    }
}

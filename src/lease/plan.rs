//! The lease protocols as data (design.md, "Protocols as data"; issue 12): acquisition, phase
//! updates, instance registration, orphan stopping and release are step machines that yield
//! operations as values and consume their results. A plan owns no descriptor, reads no clock,
//! draws no random number and hides no sync: every durability step is an explicit
//! [`Act::Fsync`] or [`Act::SyncDir`].
//!
//! Each protocol is written as [`Steps`] over folder-relative acts ([`Act`]: read this record,
//! write that temp file, rename, sync this folder, try the lock, end that cgroup) and driven by
//! [`Driven`], which says each file act in the vocabulary every protocol of tenure speaks
//! ([`crate::fsop`]: handles, never descriptors) and leaves the lock and process acts as the
//! lease's own operations ([`LeaseOp`]).
//!
//! Two executors run the plans. `lease::exec` runs them for real: file operations through
//! `privfs::Exec` (the same executor as the checkpoint store's plans), the lock through `flock`
//! (the one module that takes it, `lease::lock`), processes through pidfds and cgroupfs. The
//! lease model (`models/src/lease.rs`) runs the very same plans over the crash filesystem
//! (`SimFs`), its lock table and its process table, and keeps the plan itself in its state:
//! every operation boundary is a state, and a crash is one more enabled action there.
//!
//! A plan is driven by [`run`]: ask [`Plan::op`] for the operation it waits on, execute it, hand
//! the result to [`Plan::handle`]; once `op` says `None`, [`Plan::take`] gives the output. The
//! plans are `Clone + Eq + Hash` so that a model can store and compare them.
//!
//! The order of the steps is the protocol; see the module docs of [`super`] for why each step
//! is where it is.

use std::borrow::Cow;
use std::ffi::{OsStr, OsString};
use std::fmt;
use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::cgroup::{CgroupRecord, EndedCgroup, cgroup_name};
use super::epoch::{self, Rewound, Seen};
use super::identity::{Identity, Liveness};
use super::record::{
    self, Containment, DirIdentity, OwnerRecord, RECORD_VERSION, RegistryRecord, Token,
    WaiterRecord,
};
use super::{
    CONTROL_DIR, IDENTITY_FILE, INSTANCES_DIR, LEASES_DIR, LeaseError, MAX_RECORD, OWNER_FILE,
    REGISTRY_DIR, WAITERS_DIR,
};
use crate::fsop::{Done, Fd, Op, Step};
use crate::machine::PhaseKind;
use crate::privfs::{FileKind, FsError, TEMP_PREFIX};

pub use super::lock::WaitEnd;

/// A directory of the lease protocol, named relative to the state dir so that any executor can
/// find it (the real one through descriptors, the model through its crash filesystem).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Loc {
    /// The state dir itself.
    Root,
    /// `.tenure/`.
    Control,
    /// `.tenure/waiters/`.
    Waiters,
    /// `.tenure/registry/`.
    Registry,
    /// `.tenure/registry/leases/`.
    Leases,
    /// `.tenure/registry/instances/`.
    Instances,
}

impl Loc {
    /// Every directory, parents before children.
    pub const ALL: [Loc; 6] = [
        Loc::Root,
        Loc::Control,
        Loc::Waiters,
        Loc::Registry,
        Loc::Leases,
        Loc::Instances,
    ];

    /// The directory holding this one and this one's name in it (`None` for the state dir).
    pub const fn parent(self) -> Option<(Loc, &'static str)> {
        match self {
            Loc::Root => None,
            Loc::Control => Some((Loc::Root, CONTROL_DIR)),
            Loc::Waiters => Some((Loc::Control, WAITERS_DIR)),
            Loc::Registry => Some((Loc::Control, REGISTRY_DIR)),
            Loc::Leases => Some((Loc::Registry, LEASES_DIR)),
            Loc::Instances => Some((Loc::Registry, INSTANCES_DIR)),
        }
    }

    /// The path of the directory below the state dir at `root`.
    pub fn path(self, root: &Path) -> PathBuf {
        match self.parent() {
            None => root.to_path_buf(),
            Some((parent, name)) => parent.path(root).join(name),
        }
    }

    /// The index of the directory in [`Loc::ALL`].
    pub const fn index(self) -> usize {
        match self {
            Loc::Root => 0,
            Loc::Control => 1,
            Loc::Waiters => 2,
            Loc::Registry => 3,
            Loc::Leases => 4,
            Loc::Instances => 5,
        }
    }
}

/// What a protocol's steps ask for. File acts name a folder ([`Loc`]) and an entry, and are
/// said as [`crate::fsop`] operations by [`Driven`]; `label` names the crash points
/// (`<label>.<step>`) and the recorder's entries.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Act {
    /// Whether the caller's cancel descriptor is readable (answer: [`Res::Flag`]).
    Cancelled,
    /// Whether the opened state dir is still at its path (card H7; [`Res::Flag`]).
    StillAtPath,
    /// The entries of a directory ([`Res::Listed`], `None` when the directory is missing).
    List(Loc),
    /// Reads a private file of at most `max` bytes ([`Res::Bytes`], `None` when absent).
    Read {
        /// The directory.
        dir: Loc,
        /// The file.
        name: String,
        /// The largest size accepted; a larger file fails with `too large`.
        max: u64,
    },
    /// Creates a directory 0700 unless it exists ([`Res::Made`]); not durable until its parent
    /// is synced.
    Mkdir {
        /// The directory to create.
        dir: Loc,
        /// Crash point label.
        label: &'static str,
    },
    /// Creates an exclusive temp file (`.tmp-<random>`, 0600) in `dir` holding `bytes`
    /// ([`Res::Temp`] names it); not durable until fsynced.
    WriteTemp {
        /// The directory.
        dir: Loc,
        /// The content.
        bytes: Vec<u8>,
        /// Crash point label.
        label: &'static str,
    },
    /// Creates `name` exclusively (0600) in `dir` holding `bytes` ([`Res::Temp`] names it), for
    /// an entry whose name is new by construction; not durable until synced.
    WriteNew {
        /// The directory.
        dir: Loc,
        /// The new name.
        name: String,
        /// The content.
        bytes: Vec<u8>,
        /// Crash point label.
        label: &'static str,
    },
    /// Overwrites `bytes` at `offset` of the existing file `name` in place, keeping the file
    /// open so that [`Act::Fsync`] can make the write durable ([`Res::Done`]).
    WriteAt {
        /// The directory.
        dir: Loc,
        /// The file.
        name: String,
        /// Where the bytes go.
        offset: u64,
        /// The bytes (shared: a plan that is cloned keeps one copy of its owner slot).
        bytes: Arc<[u8]>,
        /// Crash point label.
        label: &'static str,
    },
    /// fsyncs a file this plan wrote.
    Fsync {
        /// The directory.
        dir: Loc,
        /// The file.
        name: String,
        /// Crash point label.
        label: &'static str,
    },
    /// Renames `from` to `to` inside `dir`, replacing `to` unless `noreplace`.
    Rename {
        /// The directory.
        dir: Loc,
        /// The entry renamed.
        from: String,
        /// Its new name.
        to: String,
        /// Fail with `already exists` instead of replacing (`RENAME_NOREPLACE`).
        noreplace: bool,
        /// Crash point label.
        label: &'static str,
    },
    /// fsyncs a directory, making its created, renamed and removed entries durable.
    SyncDir {
        /// The directory.
        dir: Loc,
        /// Crash point label.
        label: &'static str,
    },
    /// Removes a file (`not found` is a result like any other).
    Unlink {
        /// The directory.
        dir: Loc,
        /// The file.
        name: String,
        /// Crash point label.
        label: &'static str,
    },
    /// Opens `.tenure/lock`, creating it empty (0600) if it is missing.
    OpenLock,
    /// One non-blocking attempt at the exclusive lock ([`Res::Lock`]).
    TryLock,
    /// Waits for the lock until it is ours, the bound expires or the wait is cancelled
    /// ([`Res::Waited`]).
    Wait,
    /// Unlocks (`LOCK_UN`, so that a waiter woken by the close finds it free) and closes.
    Unlock,
    /// Tells the caller that the lease is held and it is about to wait (the `on_wait` call).
    Contended(Option<Box<OwnerRecord>>),
    /// Whether a recorded process still runs ([`Res::Live`]).
    Liveness(Identity),
    /// Whether the process a waiter entry's name records (pid and start time) still runs.
    PidLiveness {
        /// The pid.
        pid: u32,
        /// Its start time.
        start: u64,
    },
    /// SIGKILL to a recorded process, through its identity-checked pidfd ([`Res::Flag`]: it was
    /// delivered).
    Kill(Identity),
    /// Waits (bounded by the executor) until a recorded process is gone ([`Res::Flag`]: gone).
    AwaitGone(Identity),
    /// Ends what the recorded cgroup of an earlier ownership holds ([`Res::Ended`]).
    EndCgroup {
        /// The cgroup the owner record names.
        rec: CgroupRecord,
        /// The dir's root id (the cgroup's name carries it).
        root_id: Token,
        /// The epoch of that ownership (the cgroup's name carries it).
        epoch: u64,
    },
    /// Creates this ownership's cgroup ([`Res::Cgroup`]).
    CreateCgroup {
        /// Its name (`tenure-<root id>-<epoch>`).
        name: String,
    },
    /// Removes the cgroup [`Act::CreateCgroup`] made (nothing entered it).
    RemoveCgroup,
    /// The highest epoch the checkpoint store records (manifests and kept outputs;
    /// [`Res::Seen`]).
    CheckpointEpoch,
}

/// The answer to an [`Act`] (what [`Driven`] makes of the operations' results).
#[derive(Debug)]
pub enum Res {
    /// Done, nothing to report.
    Done,
    /// A yes/no answer.
    Flag(bool),
    /// The entries of a directory, sorted by name; `None` when the directory does not exist.
    Listed(Option<Vec<(String, FileKind)>>),
    /// The content of a file; `None` when it does not exist.
    Bytes(Option<Vec<u8>>),
    /// The name of the temp file just written.
    Temp(String),
    /// Whether [`Act::Mkdir`] created the directory (`false`: it existed).
    Made(bool),
    /// The outcome of [`Act::TryLock`].
    Lock(LockTry),
    /// How [`Act::Wait`] ended.
    Waited(WaitEnd),
    /// Whether a recorded process runs.
    Live(Liveness),
    /// What [`Act::EndCgroup`] found and did.
    Ended(EndedCgroup),
    /// The cgroup [`Act::CreateCgroup`] made, or why none could be made.
    Cgroup(Result<CgroupRecord, String>),
    /// The highest epoch the checkpoint store records.
    Seen(Option<Seen>),
    /// The operation failed.
    Failed(LeaseError),
}

/// The outcome of one try at the lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LockTry {
    /// The lock is ours.
    Locked,
    /// Another process holds it; `may_wait` when the caller's bound allows waiting.
    Busy {
        /// Whether to wait (false for a try-once bound, or an expired one).
        may_wait: bool,
    },
}

/// The steps of one protocol, in terms of [`Act`]s; [`Driven`] turns them into operations.
pub trait Steps {
    /// What the protocol yields once finished.
    type Output;
    /// The act the protocol waits on; `None` once it has finished.
    fn op(&self) -> Option<Act>;
    /// Consumes the result of the act [`Steps::op`] named.
    fn handle(&mut self, result: Res);
    /// The output, once (after `op` returned `None`).
    fn take(&mut self) -> Option<Self::Output>;
}

/// An operation of a lease plan: a file operation of the vocabulary every protocol speaks
/// ([`crate::fsop`], executed by `privfs` for real and by the models' crash filesystem), or one
/// of the lock and process operations only the lease has.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LeaseOp<'a> {
    /// A file operation.
    File(Step<'a>),
    /// Whether the caller's cancel descriptor is readable ([`LeaseRes::Flag`]).
    Cancelled,
    /// Whether the opened state dir is still at its path (card H7; [`LeaseRes::Flag`]).
    StillAtPath,
    /// Opens `lock` in the control folder `dir`, creating it empty (0600) if it is missing.
    OpenLock {
        /// The control folder.
        dir: Fd,
    },
    /// One non-blocking attempt at the exclusive lock ([`LeaseRes::Lock`]).
    TryLock,
    /// Waits for the lock until it is ours, the bound expires or the wait is cancelled
    /// ([`LeaseRes::Waited`]).
    Wait,
    /// Unlocks (`LOCK_UN`, so that a waiter woken by the close finds it free) and closes.
    Unlock,
    /// Tells the caller that the lease is held and it is about to wait (the `on_wait` call).
    Contended(Option<&'a OwnerRecord>),
    /// Whether a recorded process still runs ([`LeaseRes::Live`]).
    Liveness(&'a Identity),
    /// Whether the process a waiter entry's name records still runs ([`LeaseRes::Live`]).
    PidLiveness {
        /// The pid.
        pid: u32,
        /// Its start time.
        start: u64,
    },
    /// SIGKILL to a recorded process through its identity-checked pidfd ([`LeaseRes::Flag`]:
    /// it was delivered).
    Kill(&'a Identity),
    /// Waits (bounded by the executor) until a recorded process is gone ([`LeaseRes::Flag`]:
    /// gone).
    AwaitGone(&'a Identity),
    /// Ends what the recorded cgroup of an earlier ownership holds ([`LeaseRes::Ended`]).
    EndCgroup {
        /// The cgroup the owner record names.
        rec: &'a CgroupRecord,
        /// The dir's root id (the cgroup's name carries it).
        root_id: Token,
        /// The epoch of that ownership (the cgroup's name carries it).
        epoch: u64,
    },
    /// Creates this ownership's cgroup ([`LeaseRes::Cgroup`]).
    CreateCgroup {
        /// Its name (`tenure-<root id>-<epoch>`).
        name: &'a str,
    },
    /// Removes the cgroup [`LeaseOp::CreateCgroup`] made (nothing entered it).
    RemoveCgroup,
    /// The highest epoch the checkpoint store records ([`LeaseRes::Seen`]).
    CheckpointEpoch,
}

/// The answer to a [`LeaseOp`].
#[derive(Debug)]
pub enum LeaseRes {
    /// The result of a file operation.
    File(Result<Done, FsError>),
    /// Done, nothing to report.
    Done,
    /// A yes/no answer.
    Flag(bool),
    /// The outcome of [`LeaseOp::TryLock`].
    Lock(LockTry),
    /// How [`LeaseOp::Wait`] ended.
    Waited(WaitEnd),
    /// Whether a recorded process runs.
    Live(Liveness),
    /// What [`LeaseOp::EndCgroup`] found and did.
    Ended(EndedCgroup),
    /// The cgroup [`LeaseOp::CreateCgroup`] made, or why none could be made.
    Cgroup(Result<CgroupRecord, String>),
    /// The highest epoch the checkpoint store records.
    Seen(Option<Seen>),
    /// A lock or process operation failed.
    Failed(LeaseError),
}

/// A lease plan: ask [`Plan::op`] for the operation it waits on, execute it, hand the result
/// to [`Plan::handle`]; once `op` says `None`, [`Plan::take`] gives the output.
pub trait Plan {
    /// What the plan yields once finished.
    type Output;
    /// The operation the plan waits on; `None` once it has finished.
    fn op(&self) -> Option<LeaseOp<'_>>;
    /// Consumes the result of the operation [`Plan::op`] named.
    fn handle(&mut self, result: LeaseRes);
    /// The output, once (after `op` returned `None`).
    fn take(&mut self) -> Option<Self::Output>;
}

/// Executes lease operations: file operations through an [`crate::fsop::Executor`], the rest
/// on the kernel lock and processes (the real executor, or a model's world).
pub trait Exec {
    /// Performs `op` and says how it went.
    fn execute(&mut self, op: LeaseOp<'_>) -> LeaseRes;
}

/// Runs `plan` to the end on `exec`.
pub fn run<P: Plan, E: Exec + ?Sized>(plan: &mut P, exec: &mut E) -> P::Output {
    while let Some(op) = plan.op() {
        let res = exec.execute(op);
        plan.handle(res);
    }
    plan.take()
        .expect("a plan that asks for no operation has finished")
}

/// How many entries one listing step asks for.
const LIST_BATCH: usize = 256;

/// Where the operations of the current act are.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum Phase {
    /// Open the folder `loc` (its parent is open).
    Open(Loc),
    /// The act's own operation.
    Main,
    /// A listing is open: read more entries.
    List {
        /// The listing handle.
        list: Fd,
        /// The entries so far.
        acc: Vec<(String, FileKind)>,
    },
    /// The listing is complete: close it.
    EndList {
        /// The listing handle.
        list: Fd,
        /// The entries.
        acc: Vec<(String, FileKind)>,
    },
    /// A temp file was created: write its content.
    Write {
        /// Its handle.
        fd: Fd,
        /// Its name.
        name: String,
    },
    /// Close a temp file before the act renames or removes it.
    CloseTemp(Fd),
    /// The steps finished: close every handle left.
    Close,
}

/// A protocol's [`Steps`] turned into a [`Plan`]: each [`Act`] on a folder becomes the file
/// operations of [`crate::fsop`] — the folder opened once (and kept open for the plan),
/// listings read in batches, temp files created, written and closed — and every handle is
/// closed when the steps finish. What the acts mean (which file, which sync, in which order)
/// is the protocol's; this is only how a folder-relative act is said with handles.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Driven<S> {
    steps: S,
    /// The act being performed; `None` once the steps finished.
    act: Option<Act>,
    phase: Phase,
    /// Open folders, by [`Loc::index`] (the state dir is [`Fd::ROOT`]).
    dirs: [Option<Fd>; 6],
    /// Temp files written and still open: (folder, name, handle).
    temps: Vec<(Loc, String, Fd)>,
    /// Listings abandoned by an error, closed at the end.
    stray: Vec<Fd>,
}

/// The acquisition plan.
pub type Acquire = Driven<AcquireSteps>;
/// The read-only check plan.
pub type Check = Driven<CheckSteps>;
/// The phase-update plan.
pub type SetPhase = Driven<SetPhaseSteps>;
/// The instance-registration plan.
pub type Register = Driven<RegisterSteps>;
/// The entry-removal plan.
pub type Remove = Driven<RemoveSteps>;
/// The orphan-stopping plan.
pub type StopOrphans = Driven<StopOrphansSteps>;
/// The release plan.
pub type Release = Driven<ReleaseSteps>;

/// The folder an act works in (for [`Act::Mkdir`], the parent of the new folder).
fn act_dir(act: &Act) -> Option<Loc> {
    match act {
        Act::Read { dir, .. }
        | Act::WriteTemp { dir, .. }
        | Act::WriteNew { dir, .. }
        | Act::WriteAt { dir, .. }
        | Act::Rename { dir, .. }
        | Act::SyncDir { dir, .. }
        | Act::Unlink { dir, .. }
        | Act::List(dir) => Some(*dir),
        Act::Mkdir { dir, .. } => dir.parent().map(|(p, _)| p),
        Act::OpenLock => Some(Loc::Control),
        Act::Fsync { .. }
        | Act::Cancelled
        | Act::StillAtPath
        | Act::TryLock
        | Act::Wait
        | Act::Unlock
        | Act::Contended(_)
        | Act::Liveness(_)
        | Act::PidLiveness { .. }
        | Act::Kill(_)
        | Act::AwaitGone(_)
        | Act::EndCgroup { .. }
        | Act::CreateCgroup { .. }
        | Act::RemoveCgroup
        | Act::CheckpointEpoch => None,
    }
}

fn file<'a>(label: &'static str, op: Op<'a>) -> LeaseOp<'a> {
    LeaseOp::File(Step::new(label, op))
}

impl<S: Steps> Driven<S> {
    /// Drives `steps`.
    pub fn new(steps: S) -> Driven<S> {
        let act = steps.op();
        let mut d = Driven {
            steps,
            act,
            phase: Phase::Main,
            dirs: [None; 6],
            temps: Vec::new(),
            stray: Vec::new(),
        };
        d.begin();
        d
    }

    /// The protocol's steps (to ask where they are).
    pub fn steps(&self) -> &S {
        &self.steps
    }

    /// The handles the plan holds open (a model closes them when the process crashes).
    pub fn handles(&self) -> Vec<Fd> {
        let mut v: Vec<Fd> = self.dirs.iter().flatten().copied().collect();
        v.extend(self.temps.iter().map(|(_, _, fd)| *fd));
        v.extend(self.stray.iter().copied());
        match &self.phase {
            Phase::List { list, .. } | Phase::EndList { list, .. } => v.push(*list),
            Phase::Open(_) | Phase::Main | Phase::Write { .. } | Phase::CloseTemp(_) => {}
            Phase::Close => {}
        }
        v
    }

    /// The first of [`Driven::handles`] (without collecting them: the plan closes its handles
    /// one at a time, in this order).
    fn first_handle(&self) -> Option<Fd> {
        self.dirs
            .iter()
            .flatten()
            .copied()
            .chain(self.temps.iter().map(|(_, _, fd)| *fd))
            .chain(self.stray.iter().copied())
            .chain(match &self.phase {
                Phase::List { list, .. } | Phase::EndList { list, .. } => Some(*list),
                Phase::Open(_) | Phase::Main | Phase::Write { .. } | Phase::CloseTemp(_) => None,
                Phase::Close => None,
            })
            .next()
    }

    fn fd(&self, loc: Loc) -> Fd {
        match loc {
            Loc::Root => Fd::ROOT,
            _ => self.dirs[loc.index()].unwrap_or(Fd(u32::MAX)),
        }
    }

    fn temp_fd(&self, dir: Loc, name: &str) -> Option<Fd> {
        self.temps
            .iter()
            .find(|(l, n, _)| *l == dir && n == name)
            .map(|(_, _, fd)| *fd)
    }

    /// The outermost folder on the way to `loc` that is not open yet.
    fn first_missing(&self, loc: Loc) -> Option<Loc> {
        // Up from `loc`, the last folder not open is the outermost (no list of the chain: this
        // runs before every act).
        let mut missing = None;
        let mut at = Some(loc);
        while let Some(l) = at {
            if l != Loc::Root && self.dirs[l.index()].is_none() {
                missing = Some(l);
            }
            at = l.parent().map(|(p, _)| p);
        }
        missing
    }

    /// Sets the phase for the current act.
    fn begin(&mut self) {
        let Some(act) = &self.act else {
            self.phase = Phase::Close;
            return;
        };
        if let Some(missing) = act_dir(act).and_then(|l| self.first_missing(l)) {
            self.phase = Phase::Open(missing);
            return;
        }
        if let Act::Rename {
            dir, from: name, ..
        }
        | Act::Unlink { dir, name, .. } = act
            && let Some(fd) = self.temp_fd(*dir, name)
        {
            self.phase = Phase::CloseTemp(fd);
            return;
        }
        self.phase = Phase::Main;
    }

    /// The current act is complete: tell the steps and move to the next act.
    fn finish_act(&mut self, res: Res) {
        self.steps.handle(res);
        self.act = self.steps.op();
        self.begin();
    }

    fn main_op<'a>(&'a self, act: &'a Act) -> LeaseOp<'a> {
        match act {
            Act::Read { dir, name, max } => file(
                "lease.read",
                Op::ReadFile {
                    dir: self.fd(*dir),
                    name: OsStr::new(name),
                    max: *max,
                },
            ),
            Act::List(dir) => file("lease.list", Op::List { dir: self.fd(*dir) }),
            Act::Mkdir { dir, label } => {
                let (parent, name) = dir.parent().expect("the state dir is never made");
                file(
                    label,
                    Op::Mkdir {
                        dir: self.fd(parent),
                        name: OsStr::new(name),
                    },
                )
            }
            Act::WriteTemp { dir, label, .. } => file(label, Op::CreateTemp { dir: self.fd(*dir) }),
            Act::WriteNew {
                dir, name, label, ..
            } => file(
                label,
                Op::CreateNew {
                    dir: self.fd(*dir),
                    name: OsStr::new(name),
                },
            ),
            Act::WriteAt {
                dir,
                name,
                offset,
                bytes,
                label,
            } => file(
                label,
                Op::WriteAt {
                    dir: self.fd(*dir),
                    name: OsStr::new(name),
                    offset: *offset,
                    bytes,
                },
            ),
            Act::Fsync { dir, name, label } => file(
                label,
                Op::Fsync {
                    fd: self.temp_fd(*dir, name).unwrap_or(Fd(u32::MAX)),
                    data_only: true,
                },
            ),
            Act::Rename {
                dir,
                from,
                to,
                noreplace,
                label,
            } => file(
                label,
                Op::Rename {
                    from_dir: self.fd(*dir),
                    from: OsStr::new(from),
                    to_dir: self.fd(*dir),
                    to: OsStr::new(to),
                    noreplace: *noreplace,
                },
            ),
            Act::SyncDir { dir, label } => file(label, Op::SyncDir { dir: self.fd(*dir) }),
            Act::Unlink { dir, name, label } => file(
                label,
                Op::Unlink {
                    dir: self.fd(*dir),
                    name: OsStr::new(name),
                },
            ),
            Act::OpenLock => LeaseOp::OpenLock {
                dir: self.fd(Loc::Control),
            },
            Act::Cancelled => LeaseOp::Cancelled,
            Act::StillAtPath => LeaseOp::StillAtPath,
            Act::TryLock => LeaseOp::TryLock,
            Act::Wait => LeaseOp::Wait,
            Act::Unlock => LeaseOp::Unlock,
            Act::Contended(owner) => LeaseOp::Contended(owner.as_deref()),
            Act::Liveness(id) => LeaseOp::Liveness(id),
            Act::PidLiveness { pid, start } => LeaseOp::PidLiveness {
                pid: *pid,
                start: *start,
            },
            Act::Kill(id) => LeaseOp::Kill(id),
            Act::AwaitGone(id) => LeaseOp::AwaitGone(id),
            Act::EndCgroup {
                rec,
                root_id,
                epoch,
            } => LeaseOp::EndCgroup {
                rec,
                root_id: *root_id,
                epoch: *epoch,
            },
            Act::CreateCgroup { name } => LeaseOp::CreateCgroup { name },
            Act::RemoveCgroup => LeaseOp::RemoveCgroup,
            Act::CheckpointEpoch => LeaseOp::CheckpointEpoch,
        }
    }

    /// The result of the act's own operation.
    fn main_done(&mut self, act: Act, res: LeaseRes) {
        let fs_err = |e: FsError| Res::Failed(LeaseError::Fs(e));
        let res = match (&act, res) {
            (Act::Read { .. }, LeaseRes::File(Ok(Done::Data(b)))) => Res::Bytes(Some(b)),
            (Act::Read { .. }, LeaseRes::File(Err(FsError::NotFound { .. }))) => Res::Bytes(None),
            (Act::List(_), LeaseRes::File(Ok(Done::Opened { fd, .. }))) => {
                self.phase = Phase::List {
                    list: fd,
                    acc: Vec::new(),
                };
                self.act = Some(act);
                return;
            }
            (Act::List(_), LeaseRes::File(Err(FsError::NotFound { .. }))) => Res::Listed(None),
            (Act::Mkdir { .. }, LeaseRes::File(Ok(_))) => Res::Made(true),
            (Act::Mkdir { .. }, LeaseRes::File(Err(FsError::AlreadyExists { .. }))) => {
                Res::Made(false)
            }
            (
                Act::WriteTemp { dir, .. } | Act::WriteNew { dir, .. },
                LeaseRes::File(Ok(Done::Created { fd, name })),
            ) => {
                let name = name.to_string_lossy().into_owned();
                self.temps.push((*dir, name.clone(), fd));
                self.phase = Phase::Write { fd, name };
                self.act = Some(act);
                return;
            }
            // The file stays open (with the temp files) for the fsync that follows.
            (Act::WriteAt { dir, name, .. }, LeaseRes::File(Ok(Done::Opened { fd, .. }))) => {
                self.temps.push((*dir, name.clone(), fd));
                Res::Done
            }
            (Act::Fsync { dir, name, .. }, LeaseRes::File(r)) => match r {
                Ok(_) => Res::Done,
                Err(e) => {
                    // The executor closed the file: it is never fsynced again.
                    self.temps.retain(|(l, n, _)| !(l == dir && n == name));
                    fs_err(e)
                }
            },
            (
                Act::Rename { .. } | Act::SyncDir { .. } | Act::Unlink { .. },
                LeaseRes::File(Ok(_)),
            ) => Res::Done,
            (_, LeaseRes::File(Err(e))) => fs_err(e),
            (_, LeaseRes::File(Ok(other))) => Res::Failed(unexpected_done(other)),
            (_, LeaseRes::Done) => Res::Done,
            (_, LeaseRes::Flag(f)) => Res::Flag(f),
            (_, LeaseRes::Lock(l)) => Res::Lock(l),
            (_, LeaseRes::Waited(w)) => Res::Waited(w),
            (_, LeaseRes::Live(l)) => Res::Live(l),
            (_, LeaseRes::Ended(e)) => Res::Ended(e),
            (_, LeaseRes::Cgroup(c)) => Res::Cgroup(c),
            (_, LeaseRes::Seen(s)) => Res::Seen(s),
            (_, LeaseRes::Failed(e)) => Res::Failed(e),
        };
        self.finish_act(res);
    }
}

fn unexpected_done(done: Done) -> LeaseError {
    unexpected(Res::Failed(LeaseError::Fs(FsError::Io {
        op: "run the lease protocol on",
        path: PathBuf::from(CONTROL_DIR),
        source: std::io::Error::other(format!("unexpected answer {done:?}")),
    })))
}

impl<S: Steps> Plan for Driven<S> {
    type Output = S::Output;

    fn op(&self) -> Option<LeaseOp<'_>> {
        Some(match &self.phase {
            Phase::Close => {
                let fd = self.first_handle()?;
                file("lease.close", Op::Close { fd })
            }
            Phase::Open(loc) => {
                let (parent, name) = loc.parent().expect("the state dir is always open");
                file(
                    "lease.open",
                    Op::OpenDir {
                        dir: self.fd(parent),
                        name: OsStr::new(name),
                        any_mode: false,
                    },
                )
            }
            Phase::List { list, .. } => file(
                "lease.list",
                Op::ListNext {
                    list: *list,
                    max: LIST_BATCH,
                },
            ),
            Phase::EndList { list, .. } | Phase::CloseTemp(list) => {
                file("lease.close", Op::Close { fd: *list })
            }
            Phase::Write { fd, .. } => match &self.act {
                Some(Act::WriteTemp { bytes, label, .. } | Act::WriteNew { bytes, label, .. }) => {
                    file(label, Op::Write { fd: *fd, bytes })
                }
                _ => return None,
            },
            Phase::Main => return self.act.as_ref().map(|a| self.main_op(a)),
        })
    }

    fn handle(&mut self, res: LeaseRes) {
        let phase = std::mem::replace(&mut self.phase, Phase::Main);
        match phase {
            Phase::Close => {
                // Closing cannot fail in a way that matters: the handle is gone either way.
                if let Some(fd) = self.first_handle() {
                    for d in &mut self.dirs {
                        if *d == Some(fd) {
                            *d = None;
                        }
                    }
                    self.temps.retain(|(_, _, t)| *t != fd);
                    self.stray.retain(|t| *t != fd);
                }
                self.phase = Phase::Close;
            }
            Phase::Open(loc) => match res {
                LeaseRes::File(Ok(Done::Opened { fd, .. })) => {
                    self.dirs[loc.index()] = Some(fd);
                    self.begin();
                }
                LeaseRes::File(Err(FsError::NotFound { path })) => {
                    let r = match &self.act {
                        Some(Act::Read { .. }) => Res::Bytes(None),
                        Some(Act::List(_)) => Res::Listed(None),
                        _ => Res::Failed(LeaseError::Fs(FsError::NotFound { path })),
                    };
                    self.finish_act(r);
                }
                LeaseRes::File(Err(e)) => self.finish_act(Res::Failed(LeaseError::Fs(e))),
                other => self.finish_act(Res::Failed(unexpected(lease_res_failed(other)))),
            },
            Phase::CloseTemp(fd) => {
                self.temps.retain(|(_, _, t)| *t != fd);
                self.phase = Phase::Main;
            }
            Phase::List { list, mut acc } => match res {
                LeaseRes::File(Ok(Done::Entries(v))) if v.is_empty() => {
                    self.phase = Phase::EndList { list, acc };
                }
                LeaseRes::File(Ok(Done::Entries(v))) => {
                    // A batch shorter than asked for is the last one.
                    let last = v.len() < LIST_BATCH;
                    acc.extend(
                        v.into_iter()
                            .map(|(n, k)| (n.to_string_lossy().into_owned(), k)),
                    );
                    self.phase = if last {
                        Phase::EndList { list, acc }
                    } else {
                        Phase::List { list, acc }
                    };
                }
                LeaseRes::File(Err(e)) => {
                    self.stray.push(list);
                    self.finish_act(Res::Failed(LeaseError::Fs(e)));
                }
                other => {
                    self.stray.push(list);
                    self.finish_act(Res::Failed(unexpected(lease_res_failed(other))));
                }
            },
            Phase::EndList { mut acc, .. } => {
                acc.sort_by(|a, b| a.0.cmp(&b.0));
                self.finish_act(Res::Listed(Some(acc)));
            }
            Phase::Write { name, .. } => match res {
                LeaseRes::File(Ok(_)) => self.finish_act(Res::Temp(name)),
                LeaseRes::File(Err(e)) => self.finish_act(Res::Failed(LeaseError::Fs(e))),
                other => self.finish_act(Res::Failed(unexpected(lease_res_failed(other)))),
            },
            // The act is taken, not copied (the models run this once per operation); the
            // answers that keep it current put it back.
            Phase::Main => match self.act.take() {
                Some(act) => self.main_done(act, res),
                None => self.phase = Phase::Close,
            },
        }
    }

    fn take(&mut self) -> Option<Self::Output> {
        if self.act.is_some() || self.first_handle().is_some() {
            return None;
        }
        self.steps.take()
    }
}

/// A [`LeaseRes`] that does not fit, as a failed [`Res`] for [`unexpected`].
fn lease_res_failed(res: LeaseRes) -> Res {
    match res {
        LeaseRes::Failed(e) => Res::Failed(e),
        other => Res::Failed(LeaseError::Fs(FsError::Io {
            op: "run the lease protocol on",
            path: PathBuf::from(CONTROL_DIR),
            source: std::io::Error::other(format!("unexpected answer {other:?}")),
        })),
    }
}

/// A lease error held by a plan while it cleans up, shareable so that the plan stays `Clone`
/// (a model clones its states). Compared and hashed by what it says.
#[derive(Clone)]
pub struct Failure(Arc<LeaseError>);

impl Failure {
    /// Wraps an error.
    pub fn new(e: LeaseError) -> Failure {
        Failure(Arc::new(e))
    }

    /// The error.
    pub fn error(&self) -> &LeaseError {
        &self.0
    }

    /// Whether the error refuses the dir's state (see [`LeaseError::is_refusal`]).
    pub fn is_refusal(&self) -> bool {
        self.0.is_refusal()
    }

    /// The error itself. A plan run by one executor holds the only reference; a copy a model
    /// made becomes a generic error with the same message.
    pub fn into_error(self) -> LeaseError {
        Arc::try_unwrap(self.0).unwrap_or_else(|shared| LeaseError::Replayed {
            message: shared.to_string(),
            refusal: shared.is_refusal(),
        })
    }
}

impl fmt::Debug for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Failure({})", self.0)
    }
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl PartialEq for Failure {
    fn eq(&self, other: &Failure) -> bool {
        self.0.is_refusal() == other.0.is_refusal() && self.0.to_string() == other.0.to_string()
    }
}

impl Eq for Failure {}

impl Hash for Failure {
    fn hash<H: Hasher>(&self, h: &mut H) {
        self.0.is_refusal().hash(h);
        self.0.to_string().hash(h);
    }
}

/// Serialises a record as the control folder holds it (pretty JSON and a newline).
pub fn to_json<T: serde::Serialize>(value: &T) -> Vec<u8> {
    let mut v = serde_json::to_vec_pretty(value).expect("records serialise infallibly");
    v.push(b'\n');
    v
}

/// A `too large` read of a record is a corrupt record.
fn record_read_error(e: LeaseError) -> LeaseError {
    match e {
        LeaseError::Fs(FsError::TooLarge { path, len, .. }) => LeaseError::CorruptRecord {
            path,
            reason: format!("{len} bytes, far larger than any record tenure writes"),
        },
        e => e,
    }
}

/// The owner record, from what [`Act::Read`] returned (corrupt or of another version: refused).
/// `path` names the file in an error (made only then: the models run this per inspection).
fn owner_from(
    bytes: Option<Vec<u8>>,
    path: impl FnOnce() -> PathBuf,
) -> Result<Option<OwnerRecord>, LeaseError> {
    let Some(bytes) = bytes else { return Ok(None) };
    // The record is written without a sync (issue 11): a power loss can leave its name with
    // none of its data. An empty record is one a power loss emptied, and a power loss ended
    // every process it could speak for: it is absent, not corrupt. (The mutant
    // `lease-empty-record-refused` refuses it, and the dir after every power loss with it.)
    if bytes.is_empty() {
        if crate::mutant::on("lease-empty-record-refused") {
            return Err(LeaseError::CorruptRecord {
                path: path(),
                reason: "empty".to_owned(),
            });
        }
        return Ok(None);
    }
    let r = match record::decode_owner(&bytes) {
        Ok(Some(r)) => r,
        Ok(None) => return Ok(None),
        Err(reason) => {
            return Err(LeaseError::CorruptRecord {
                path: path(),
                reason,
            });
        }
    };
    if r.version != RECORD_VERSION {
        return Err(LeaseError::CorruptRecord {
            path: path(),
            reason: format!(
                "format version {}, this tenure reads {RECORD_VERSION}",
                r.version
            ),
        });
    }
    Ok(Some(r))
}

/// The identity marker, from what [`Act::Read`] returned: an unparsable one (or one of another
/// version) is `identity is unreadable`.
fn marker_from(
    bytes: Option<Vec<u8>>,
    path: impl FnOnce() -> PathBuf,
) -> Result<Option<DirIdentity>, LeaseError> {
    let Some(bytes) = bytes else { return Ok(None) };
    match record::parse::<DirIdentity>(&bytes) {
        Ok(m) if m.version != RECORD_VERSION => Err(LeaseError::IdentityUnreadable {
            path: path(),
            reason: format!("format version {}", m.version),
        }),
        Ok(m) => Ok(Some(m)),
        Err(reason) => Err(LeaseError::IdentityUnreadable {
            path: path(),
            reason,
        }),
    }
}

/// The epoch file, from what [`Act::Read`] returned (`None` when absent).
fn epoch_from(
    res: Res,
    path: impl FnOnce() -> PathBuf,
) -> Result<Option<epoch::Stored>, LeaseError> {
    match res {
        Res::Bytes(None) => Ok(None),
        Res::Bytes(Some(b)) => epoch::decode(&b).map(Some).map_err(|reason| {
            epoch::EpochError::Corrupt {
                path: path(),
                reason,
            }
            .into()
        }),
        Res::Failed(LeaseError::Fs(FsError::TooLarge { path, .. })) => {
            Err(epoch::EpochError::Corrupt {
                path,
                reason: "too large",
            }
            .into())
        }
        other => Err(unexpected(other)),
    }
}

/// An answer that does not fit the operation: a broken executor, reported as an I/O error.
fn unexpected(res: Res) -> LeaseError {
    match res {
        Res::Failed(e) => e,
        other => LeaseError::Fs(FsError::Io {
            op: "run the lease protocol on",
            path: PathBuf::from(CONTROL_DIR),
            source: std::io::Error::other(format!("unexpected answer {other:?}")),
        }),
    }
}

/// Whether a record belongs to the dir whose marker has `root_id` (card P4): records without
/// a root id (older versions) or with another one (a copied dir) are never acted on.
pub fn is_ours(record_root: Option<Token>, root_id: Token) -> bool {
    record_root == Some(root_id)
}

/// The epoch a registry entry's name starts with.
fn entry_epoch(name: &str) -> Option<u64> {
    record::registry_entry_epoch(name)
}

fn is_temp(name: &str) -> bool {
    name.starts_with(TEMP_PREFIX)
}

/// The waiter entry name of a process.
pub fn waiter_name(me: &Identity) -> String {
    format!("{}-{}.json", me.pid, me.start_time)
}

/// What an acquisition is given: everything it would otherwise read from the clock, the random
/// source or the process itself, so that the plan is deterministic.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct AcquireInput {
    /// The canonical path of the state dir (the marker records it; messages name it).
    pub path: PathBuf,
    /// The acquiring process.
    pub me: Identity,
    /// The current time (unix milliseconds).
    pub now: u64,
    /// A fresh random token for this ownership.
    pub token: Token,
    /// A fresh random root id, used if the dir is cold and gets its marker now.
    pub fresh_root: Token,
    /// The phase the owner record is written with.
    pub phase: PhaseKind,
    /// Whether to create a cgroup for the ownership's workload.
    pub cgroup: bool,
    /// A cluster lease's epoch (issue 14, [`super::AcquireOptions::fence`]): the ownership's
    /// epoch is exactly this, through [`super::fenced_epoch`].
    pub fence: Option<u64>,
    /// What tells this boot and mount apart from the one that wrote the epoch file (issue 11:
    /// epochs are durable in batches, see [`epoch`]).
    pub session: epoch::Session,
    /// How many epochs one durable reservation covers ([`epoch::BATCH`] in the runtime).
    pub epoch_batch: u64,
}

/// What a successful acquisition found and wrote.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Acquired {
    /// The owner record written.
    pub record: OwnerRecord,
    /// Live instances an earlier, crashed owner registered.
    pub orphans: Vec<RegistryRecord>,
    /// The registry entry names of `orphans`, in the same order (for [`StopOrphansSteps`]).
    pub orphan_entries: Vec<String>,
    /// Set when the epoch file was behind an epoch recorded elsewhere (card P3).
    pub rewound: Option<Rewound>,
    /// The owner record of the ownership before this one.
    pub previous: Option<OwnerRecord>,
    /// The dir's root id.
    pub root_id: Token,
    /// The processes of a crashed owner's cgroup this acquisition ended (card T2).
    pub leftovers: Vec<u32>,
    /// Why no cgroup could be created, when one was asked for.
    pub cgroup_error: Option<String>,
    /// Whether the ownership's cgroup was created (the executor holds it).
    pub cgroup: bool,
    /// Whether the lease was found held and waited for.
    pub waited: bool,
}

/// What an inspection of the dir found.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
struct Found {
    /// Whether `.tenure/` exists.
    control: bool,
    /// The identity marker (valid for this dir).
    marker: Option<DirIdentity>,
    /// The owner record.
    owner: Option<OwnerRecord>,
    /// Whether the owner record file exists (it is then rewritten in place, even when it held
    /// no record: empty, or torn by a power loss).
    owner_file: bool,
    /// The epoch file (0 when absent).
    epoch: u64,
    /// What the epoch file holds (`None`: absent).
    stored: Option<epoch::Stored>,
}

/// The sweeps of an acquisition, in the order they run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum SweepKind {
    /// Owner entries of earlier ownerships of this dir.
    Leases,
    /// Instance entries of earlier ownerships whose process is gone.
    Instances,
    /// Entries of waiters that are gone.
    Waiters,
}

impl SweepKind {
    fn dir(self) -> Loc {
        match self {
            SweepKind::Leases => Loc::Leases,
            SweepKind::Instances => Loc::Instances,
            SweepKind::Waiters => Loc::Waiters,
        }
    }
}

/// After an orderly release, the waiter entries of dead waiters are swept by the acquisition
/// of every epoch that is a multiple of this (and by every acquisition after a crash), not by
/// every acquisition: listing them is a cost on the run path (issue 11), and they are evidence
/// only.
pub const FULL_SWEEP_EVERY: u64 = 64;

/// Where an acquisition is.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum St {
    /// Is the caller's cancel fd readable already?
    Cancelled,
    /// Inspecting the dir (before the lock, and again under it).
    Inspect(Box<Inspection>),
    /// Create `.tenure/`.
    MakeControl,
    /// Make the new `.tenure/` durable.
    SyncRoot,
    /// Open (or create) the lock file.
    OpenLock,
    /// Try the lock.
    TryLock,
    /// Busy without waiting: read the owner record for the message.
    BusyOwner,
    /// Waiting: create `.tenure/waiters/` if an owner has not yet.
    MakeWaiters,
    /// Make the new `.tenure/waiters/` durable.
    SyncWaitersParent,
    /// Waiting: write our waiter entry.
    WriteWaiter,
    /// Waiting: rename it into place.
    RenameWaiter(String),
    /// Waiting: the rename failed; remove the temp file.
    AbandonWaiter(String),
    /// Waiting: read the owner record for the contention report.
    ReportOwner,
    /// Waiting: report the contention.
    Report(Option<Box<OwnerRecord>>),
    /// Wait for the lock.
    Wait,
    /// The wait ended without the lock: remove our waiter entry.
    GiveUp(WaitEnd),
    /// The wait expired: read the owner record for the message.
    ExpiredOwner,
    /// Under the lock: end what a crashed owner's cgroup holds.
    EndLeftovers,
    /// Under the lock: list the control folder for temp files.
    ListControl,
    /// Remove temp files a crashed owner left (index into `temps_found`).
    UnlinkTemp(usize),
    /// List the owner entries (for the epoch rule and the sweep).
    ListLeases,
    /// List the instance entries (for the epoch rule and the sweep).
    ListInstances,
    /// The highest epoch the checkpoint store records.
    CheckpointEpoch,
    /// Create the ownership's cgroup.
    CreateCgroup,
    /// Write a new reservation in place, into the slot that does not hold the confirmed one.
    WriteEpochInPlace,
    /// Write the epoch file whole to a temp file (no reservation of this session is
    /// confirmed: a new dir, another boot, an older format).
    WriteEpoch,
    /// fdatasync it (the reservation must outlive a power loss before an epoch of its batch
    /// is handed out: a child may fence an external system with it).
    FsyncEpoch,
    /// Write the epoch into the scratch slot in place (never synced: within the confirmed
    /// reservation).
    WriteScratch,
    /// Write the new marker to a temp file.
    WriteMarker,
    /// fdatasync it (a successor trusts the marker).
    FsyncMarker,
    /// Write the owner record to a temp file (never synced: evidence for live processes).
    WriteOwner,
    /// Write the owner record in place into its other slot (never synced).
    WriteOwnerInPlace,
    /// Rename the epoch into place.
    RenameEpoch,
    /// Rename the marker into place without replacing.
    RenameMarker,
    /// Rename the owner record into place.
    RenameOwner,
    /// Sync the control folder once for all three renames, before the grant.
    SyncControl,
    /// Create `.tenure/registry/` (and make it durable).
    MakeRegistry,
    /// See `MakeRegistry`.
    SyncRegistryParent,
    /// Create `.tenure/registry/leases/`.
    MakeLeases,
    /// See `MakeLeases`.
    SyncLeasesParent,
    /// Create `.tenure/registry/instances/`.
    MakeInstances,
    /// See `MakeInstances`.
    SyncInstancesParent,
    /// Create `.tenure/waiters/` (the owner does, so that a waiter never has to).
    MakeWaitersOwned,
    /// See `MakeWaitersOwned`.
    SyncWaitersOwned,
    /// List the waiter entries.
    ListWaiters,
    /// A sweep: read entry `i`.
    SweepRead(SweepKind, usize),
    /// A sweep: is the process entry `i` names alive?
    SweepLive(SweepKind, usize, Identity),
    /// A sweep: is the process a waiter entry's name records alive?
    SweepPidLive(SweepKind, usize, u32, u64),
    /// A sweep: remove entry `i` (an older tenure's, created per ownership).
    SweepUnlink(SweepKind, usize),
    /// A sweep: vacate entry `i` in place (an entry written in place, whose process is gone).
    SweepVacate(SweepKind, usize),
    /// A sweep: remove temp file `i` (of `temps_found`).
    SweepTemp(SweepKind, usize),
    /// Write our registry entry in place into `registry/leases/owner.slot` (issue 11: one
    /// `pwrite`, no create, no unlink per ownership; [`record::REGISTRY_SLOT_SUFFIX`]).
    WriteEntry,
    /// There is no such file yet (the dir's first owner, or an older tenure's dir), or the
    /// entry does not fit a slot: write it whole through a temp file.
    ReplaceEntry,
    /// Rename that temp file over it.
    RenameEntry(String),
    /// Remove our waiter entry (the lease is ours).
    DropWaiter,
    /// Failure: remove temp file `i` of `temps`.
    CleanTemp(usize),
    /// Failure: remove the cgroup made for this ownership.
    CleanCgroup,
    /// Failure: unlock.
    CleanUnlock,
    /// Failure: remove our waiter entry.
    CleanWaiter,
    /// Finished.
    Done,
}

/// The acquisition (see [`super::acquire`] and the module docs of [`super`] for the order).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct AcquireSteps {
    /// Shared, not copied, by the clones of a plan (a model clones its plans per step).
    input: Arc<AcquireInput>,
    /// `input.path`, shared by the inspections.
    root: Arc<Path>,
    st: St,
    /// Whether the lock is ours.
    locked: bool,
    /// Whether the dir was inspected before the lock (it is when something is to be created
    /// before the lock is ours: the control folder, a waiter entry).
    pre_inspected: bool,
    /// The lock was found held (`may_wait`) before the dir was inspected.
    busy: Option<bool>,
    /// What the last inspection found.
    found: Found,
    /// Our waiter entry, while it exists.
    waiter: Option<String>,
    /// Whether we waited.
    waited: bool,
    /// Names in the control folder or a registry folder being swept.
    temps_found: Vec<String>,
    /// Whether a removal needs the directory synced.
    removed: bool,
    /// The owner entries (names) under the lock.
    leases: Vec<String>,
    /// The instance entries (names) under the lock.
    instances: Vec<String>,
    /// Whether both registry folders exist (their listings found them).
    registry_made: bool,
    /// The previous owner released in order (in this session, at the epoch the file holds)
    /// and this is not an epoch of the periodic full sweep: the owner entries and the waiter
    /// entries are neither listed nor swept (see [`AcquireSteps::sweep_control`]).
    quick: bool,
    /// The waiter entries (names) under the lock.
    waiters: Vec<String>,
    /// The highest epoch recorded outside the epoch file.
    highest: Option<Seen>,
    /// The marker of the dir (found, or new for a cold dir).
    marker: Option<DirIdentity>,
    /// Whether `marker` is new and must be written.
    new_marker: bool,
    /// The record this acquisition writes.
    record: Option<OwnerRecord>,
    /// The epoch rule's report.
    rewound: Option<Rewound>,
    /// How the epoch is written, once computed.
    epoch_write: Option<epoch::EpochWrite>,
    /// Temp files written and not yet renamed: (what, name).
    temps: Vec<(Loc, String)>,
    /// The temp file names of the epoch, marker and owner record.
    epoch_tmp: Option<String>,
    marker_tmp: Option<String>,
    owner_tmp: Option<String>,
    /// The owner record's slot, rendered once the record is final (`None`: too large for a
    /// slot, written whole in the older format).
    owner_slot: Option<Arc<[u8]>>,
    /// Whether the owner record is written whole (no file yet, or too large for a slot).
    owner_whole: bool,
    /// Processes a crashed owner's cgroup held, ended.
    leftovers: Vec<u32>,
    /// Whether [`Act::EndCgroup`] already ran.
    leftovers_done: bool,
    /// The cgroup made for this ownership, or why none.
    cgroup: Option<CgroupRecord>,
    cgroup_error: Option<String>,
    /// Live instances of earlier owners.
    orphans: Vec<RegistryRecord>,
    /// The entry names of `orphans`, in the same order.
    orphan_entries: Vec<String>,
    /// The owner's registry entry, rendered once the record is final (`None`: too large for a
    /// slot, written whole).
    entry_slot: Option<Arc<[u8]>>,
    /// The instance entry whose process's liveness is being asked.
    candidate: Option<RegistryRecord>,
    /// The owner record replaced (the previous ownership's).
    previous: Option<OwnerRecord>,
    /// The error being cleaned up after.
    failure: Option<Failure>,
    /// The output, once finished.
    out: Option<Result<Acquired, Failure>>,
}

impl AcquireSteps {
    /// A new acquisition.
    pub fn new(input: AcquireInput) -> AcquireSteps {
        AcquireSteps {
            root: Arc::from(input.path.as_path()),
            input: Arc::new(input),
            st: St::Cancelled,
            locked: false,
            pre_inspected: false,
            busy: None,
            found: Found::default(),
            waiter: None,
            waited: false,
            temps_found: Vec::new(),
            removed: false,
            leases: Vec::new(),
            instances: Vec::new(),
            registry_made: false,
            quick: false,
            waiters: Vec::new(),
            highest: None,
            marker: None,
            new_marker: false,
            record: None,
            rewound: None,
            epoch_write: None,
            temps: Vec::new(),
            epoch_tmp: None,
            marker_tmp: None,
            owner_tmp: None,
            owner_slot: None,
            owner_whole: false,
            leftovers: Vec::new(),
            leftovers_done: false,
            cgroup: None,
            cgroup_error: None,
            orphans: Vec::new(),
            orphan_entries: Vec::new(),
            entry_slot: None,
            candidate: None,
            previous: None,
            failure: None,
            out: None,
        }
    }

    /// Whether the plan holds the lock (it took it and has not unlocked).
    pub fn is_locked(&self) -> bool {
        self.locked
    }

    /// Whether the plan waits for the lock now ([`Act::Wait`] is its operation).
    pub fn is_waiting(&self) -> bool {
        self.st == St::Wait
    }

    /// The epoch this acquisition will hand out, once it computed it.
    pub fn epoch(&self) -> Option<u64> {
        self.record.as_ref().map(|r| r.epoch)
    }

    /// Our waiter entry's name, while it exists.
    pub fn waiter_entry(&self) -> Option<&str> {
        self.waiter.as_deref()
    }

    fn control_path(&self, name: &str) -> PathBuf {
        Loc::Control.path(&self.input.path).join(name)
    }

    fn dir_path(&self) -> PathBuf {
        self.input.path.clone()
    }

    /// Ends the plan with `e`, cleaning up what it made first.
    fn fail(&mut self, e: LeaseError) {
        self.failure = Some(Failure::new(e));
        self.st = St::CleanTemp(0);
        self.settle();
    }

    /// Moves past cleanup steps that have nothing to do.
    fn settle(&mut self) {
        loop {
            match self.st {
                St::CleanTemp(i) if i >= self.temps.len() => self.st = St::CleanCgroup,
                St::CleanCgroup if self.cgroup.is_none() => self.st = St::CleanUnlock,
                St::CleanUnlock if !self.locked => self.st = St::CleanWaiter,
                St::CleanWaiter if self.waiter.is_none() => {
                    self.st = St::Done;
                    let f = self.failure.take().unwrap_or_else(|| {
                        Failure::new(LeaseError::Cancelled {
                            dir: self.dir_path(),
                        })
                    });
                    self.out = Some(Err(f));
                }
                _ => return,
            }
        }
    }

    /// Starts the inspection of the dir (before the lock, or again under it).
    fn inspect(&mut self) {
        self.st = St::Inspect(Box::new(Inspection::new(Arc::clone(&self.root))));
    }

    /// The inspection is complete: go on.
    fn inspected(&mut self, found: Found) {
        self.found = found;
        if self.locked {
            self.under_lock();
            return;
        }
        self.pre_inspected = true;
        if let Some(may_wait) = self.busy.take() {
            self.found_busy(may_wait);
        } else if self.found.control {
            self.st = St::OpenLock;
        } else {
            self.st = St::MakeControl;
        }
    }

    /// The lock is held by another and the dir passed the inspection: wait, or say busy.
    fn found_busy(&mut self, may_wait: bool) {
        if may_wait {
            self.waited = true;
            self.st = St::MakeWaiters;
        } else {
            self.st = St::BusyOwner;
        }
    }

    /// Under the lock, the inspection done: end a crashed owner's leftovers, then sweep.
    fn under_lock(&mut self) {
        self.previous = self.found.owner.clone();
        self.st = if self.ends_leftovers_now() {
            St::EndLeftovers
        } else {
            self.sweep_control()
        };
    }

    /// Temp files in the control folder are left only by an owner (or an acquisition) that
    /// crashed or lost power mid-write, and each such end leaves a trace the inspection saw:
    /// an owner record not released in order, or none, or one behind the epoch file (the
    /// crashed acquisition had bumped the epoch before writing any temp file), or an epoch
    /// file not yet in the slot format (its replace writes a temp file). Only then is the
    /// folder listed and swept, so that an orderly run after an orderly run lists nothing
    /// (issue 11: the run path is not a sweep).
    ///
    /// After an orderly release the registry holds no owner entry a sweep would remove (the
    /// previous owner removed its own; the acquisition before it swept the dead ones, or its
    /// owner did not release in order), so the owner entries are not listed; dead waiters'
    /// entries are evidence only, swept every [`FULL_SWEEP_EVERY`] epochs or after a crash.
    /// Instance entries are always listed: a live orphan an earlier owner could not stop must
    /// never be missed (card T2).
    fn sweep_control(&mut self) -> St {
        let in_session = match self.found.stored {
            Some(epoch::Stored::Batched(b)) => b.confirmed(self.input.session).is_some(),
            Some(epoch::Stored::Legacy(_) | epoch::Stored::Slots { .. }) | None => false,
        };
        let orderly = in_session
            && self
                .found
                .owner
                .as_ref()
                .is_some_and(|o| o.phase == PhaseKind::Released && o.epoch == self.found.epoch);
        self.quick = orderly
            && !self
                .found
                .epoch
                .wrapping_add(1)
                .is_multiple_of(FULL_SWEEP_EVERY);
        if self.quick {
            St::ListInstances
        } else if orderly {
            St::ListLeases
        } else {
            St::ListControl
        }
    }

    /// Whether the previous owner's recorded cgroup must be ended: it did not release in
    /// order (an orderly release happens only once the workload is gone) and named one.
    fn leftovers_to_end(&self) -> Option<(CgroupRecord, Token, u64)> {
        // The mutant `lease-skip-leftovers` never ends them.
        if crate::mutant::on("lease-skip-leftovers") {
            return None;
        }
        let prev = self.previous.as_ref()?;
        let marker = self.found.marker.as_ref()?;
        if prev.phase == PhaseKind::Released || self.leftovers_done {
            return None;
        }
        match &prev.containment {
            Some(Containment::Cgroup(rec)) => Some((rec.clone(), marker.root_id, prev.epoch)),
            Some(Containment::LockFd) | None => None,
        }
    }

    /// Card T2: the leftovers are ended before our record replaces the one naming them (the
    /// mutant `lease-leftovers-after-record` ends them after, which a crash in between turns
    /// into a leftover nobody ends any more).
    fn ends_leftovers_now(&self) -> bool {
        !crate::mutant::on("lease-leftovers-after-record") && self.leftovers_to_end().is_some()
    }

    /// The epoch rule (card P3): one above everything the dir records.
    fn compute(&mut self) -> Result<(), LeaseError> {
        let path = self.control_path(epoch::EPOCH_FILE);
        let mut highest = self.highest.clone();
        if let Some(o) = &self.found.owner {
            consider(&mut highest, o.epoch, || self.control_path(OWNER_FILE));
        }
        for (dir, names) in [
            (Loc::Leases, &self.leases),
            (Loc::Instances, &self.instances),
        ] {
            for n in names.iter() {
                if let Some(e) = entry_epoch(n) {
                    consider(&mut highest, e, || dir.path(&self.input.path).join(n));
                }
            }
        }
        // The epoch file's part: its scratch slot when this session wrote it, else the highest
        // reservation (a power loss may have taken the unsynced scratch writes).
        let (base, _) = self
            .found
            .stored
            .map_or((0, None), |s| s.base(self.input.session));
        let (mut next, rewound) = if crate::mutant::on("lease-epoch-file-only") {
            epoch::next_after(&path, base, None)?
        } else {
            epoch::next_after(&path, base, highest.as_ref())?
        };
        if crate::mutant::on("lease-no-epoch-bump-on-takeover")
            && self
                .found
                .owner
                .as_ref()
                .is_some_and(|o| o.phase != PhaseKind::Released)
        {
            // The bug: a takeover of a crashed owner continues its epoch.
            next -= 1;
        }
        // A cluster lease's epoch is the cluster's revision; the dir must not have seen it yet.
        let (next, rewound) = match self.input.fence {
            None => (next, rewound),
            Some(cluster) => match super::fenced_epoch(next, cluster) {
                Ok(e) => (e, None),
                Err(recorded) => {
                    return Err(LeaseError::EpochAhead {
                        dir: self.input.path.clone(),
                        recorded,
                        cluster,
                    });
                }
            },
        };
        self.rewound = rewound;
        // A cluster lease's epoch is the cluster's revision, durable in the cluster: its
        // reservation is that epoch alone, so that after a reboot the dir's next local epoch
        // is one above it and the cluster's next revision is not refused as behind the dir.
        let batch = match self.input.fence {
            Some(_) => 1,
            None => self.input.epoch_batch,
        };
        self.epoch_write = Some(epoch::plan_write(
            self.found.stored,
            self.input.session,
            next,
            batch,
        ));
        let (marker, new_marker) = match &self.found.marker {
            Some(m) if !crate::mutant::on("lease-marker-every-acquisition") => (m.clone(), false),
            _ => (
                DirIdentity {
                    version: RECORD_VERSION,
                    root_id: self.input.fresh_root,
                    path: self.input.path.clone(),
                    created_at: self.input.now,
                    adopted_at: None,
                },
                true,
            ),
        };
        self.record = Some(OwnerRecord {
            version: RECORD_VERSION,
            token: self.input.token,
            epoch: next,
            acquired_at: self.input.now,
            phase: self.input.phase,
            identity: self.input.me.clone(),
            root_id: Some(marker.root_id),
            containment: None,
        });
        self.marker = Some(marker);
        self.new_marker = new_marker;
        Ok(())
    }

    fn epoch_value(&self) -> u64 {
        self.record.as_ref().map_or(0, |r| r.epoch)
    }

    fn root_id(&self) -> Token {
        self.marker
            .as_ref()
            .map_or(self.input.fresh_root, |m| m.root_id)
    }

    /// The next sweep step for entry `i` of `kind` (or the temp files, the sync, the next
    /// sweep).
    fn sweep_from(&mut self, kind: SweepKind, i: usize) {
        let epoch = self.epoch_value();
        let names = match kind {
            SweepKind::Leases => &self.leases,
            SweepKind::Instances => &self.instances,
            SweepKind::Waiters => &self.waiters,
        };
        let mut j = i;
        while j < names.len() {
            let n = &names[j];
            let candidate = match kind {
                SweepKind::Leases => entry_epoch(n).is_some_and(|e| e < epoch),
                // Entries written in place carry their epoch inside: each is read.
                SweepKind::Instances => {
                    entry_epoch(n).is_some_and(|e| e < epoch) || record::is_registry_slot(n)
                }
                // Our own entry names a live process (this one); it is removed once the
                // lease is ours, without asking `/proc` about it.
                SweepKind::Waiters => !is_temp(n) && Some(n) != self.waiter.as_ref(),
            };
            if candidate {
                self.st = St::SweepRead(kind, j);
                return;
            }
            j += 1;
        }
        self.sweep_temps(kind, 0);
    }

    fn sweep_temps(&mut self, kind: SweepKind, i: usize) {
        // The removals are not synced (issue 11): the entries are evidence for live
        // processes, and a power loss that brings one back leaves its process dead, so the
        // next owner sweeps it again.
        if kind != SweepKind::Waiters && i < self.temps_found.len() {
            self.st = St::SweepTemp(kind, i);
        } else {
            self.next_sweep(kind);
        }
    }

    fn next_sweep(&mut self, kind: SweepKind) {
        self.removed = false;
        match kind {
            SweepKind::Leases => {
                self.temps_found = self
                    .instances
                    .iter()
                    .filter(|n| is_temp(n))
                    .cloned()
                    .collect();
                self.sweep_from(SweepKind::Instances, 0);
            }
            SweepKind::Instances if self.quick => self.st = St::WriteEntry,
            SweepKind::Instances => self.st = St::ListWaiters,
            SweepKind::Waiters => self.st = St::WriteEntry,
        }
    }

    fn sweep_names(&self, kind: SweepKind) -> &[String] {
        match kind {
            SweepKind::Leases => &self.leases,
            SweepKind::Instances => &self.instances,
            SweepKind::Waiters => &self.waiters,
        }
    }

    fn registry_entry(&self) -> RegistryRecord {
        let record = self.record.as_ref().expect("computed before the entry");
        RegistryRecord {
            version: RECORD_VERSION,
            epoch: record.epoch,
            token: record.token,
            name: "owner".to_owned(),
            identity: record.identity.clone(),
            since: record.acquired_at,
            root_id: record.root_id,
        }
    }

    fn finish(&mut self) {
        let record = self.record.clone().expect("computed before the end");
        self.out = Some(Ok(Acquired {
            root_id: self.root_id(),
            record,
            orphans: std::mem::take(&mut self.orphans),
            orphan_entries: std::mem::take(&mut self.orphan_entries),
            rewound: self.rewound.take(),
            previous: self.previous.take(),
            leftovers: std::mem::take(&mut self.leftovers),
            cgroup_error: self.cgroup_error.take(),
            cgroup: self.cgroup.is_some(),
            waited: self.waited,
        }));
        self.st = St::Done;
    }

    /// After the records are in place: the mutant's late end of the leftovers, then the
    /// registry folders.
    fn after_records(&mut self) {
        if self.leftovers_to_end().is_some() {
            self.st = St::EndLeftovers;
        } else {
            self.registry();
        }
    }

    /// Where the new epoch is written ([`epoch::plan_write`]): the scratch slot only, a new
    /// reservation in place, or a whole new file.
    fn write_epoch(&self) -> St {
        match &self.epoch_write {
            Some(epoch::EpochWrite::Scratch(_)) => St::WriteScratch,
            Some(epoch::EpochWrite::Reserve { .. }) => St::WriteEpochInPlace,
            Some(epoch::EpochWrite::Whole { .. }) | None => St::WriteEpoch,
        }
    }

    /// The in-place write of a new reservation: into the slot that does not hold the
    /// confirmed one, which stays valid whatever a power loss does to this write.
    fn epoch_in_place(&self) -> Option<Act> {
        let Some(epoch::EpochWrite::Reserve { slot, reservation }) = &self.epoch_write else {
            return None;
        };
        // Not the confirmed slot: a power loss that tears this write must leave the durable
        // high-water mark. (The models' crash filesystem keeps a file's unsynced writes in
        // order, under which the scratch slot written before would mask a torn confirmed
        // slot; disks do not, so the choice is asserted by `epoch::plan_write`'s tests.)
        let (offset, bytes) = (epoch::slot_offset(*slot), epoch::slot(reservation).to_vec());
        Some(Act::WriteAt {
            dir: Loc::Control,
            name: epoch::EPOCH_FILE.to_owned(),
            offset,
            bytes: bytes.into(),
            label: "epoch",
        })
    }

    /// The scratch slot's write: the epoch handed out, in place, never synced.
    fn scratch_in_place(&self) -> Option<Act> {
        let scratch = self.epoch_write.as_ref()?.scratch();
        Some(Act::WriteAt {
            dir: Loc::Control,
            name: epoch::EPOCH_FILE.to_owned(),
            offset: epoch::SCRATCH_OFFSET,
            bytes: epoch::slot(&scratch)[..].into(),
            label: "epoch",
        })
    }

    /// The records are in place (and the control folder synced, if it had to be): a whole
    /// new epoch file gets its scratch slot now that its reservation is durable, then the
    /// registry.
    fn records_placed(&mut self) {
        if self.epoch_tmp.is_some() {
            self.st = St::WriteScratch;
        } else {
            self.after_records();
        }
    }

    /// The epoch's temp file is durable: the marker's (if new), then the owner record's.
    fn after_epoch_fsync(&mut self) {
        self.st = if self.new_marker {
            St::WriteMarker
        } else {
            self.owner_next()
        };
    }

    /// The record is final (its epoch, its cgroup): render the owner record's write once, then
    /// write the epoch.
    fn records_ready(&mut self) -> St {
        self.owner_slot = self
            .record
            .as_ref()
            .and_then(record::owner_slot)
            .map(Arc::from);
        self.owner_whole = self.owner_slot.is_none() || !self.found.owner_file;
        self.entry_slot = record::registry_slot(Some(&self.registry_entry())).map(Arc::from);
        self.write_epoch()
    }

    fn owner_in_place(&self) -> bool {
        !self.owner_whole
    }

    /// After the epoch's and a new marker's data: the owner record's temp file, or (written in
    /// place) first the renames of the epoch file and marker, then the record.
    fn owner_next(&self) -> St {
        if !self.owner_in_place() {
            St::WriteOwner
        } else if self.epoch_tmp.is_some() {
            St::RenameEpoch
        } else if self.new_marker {
            St::RenameMarker
        } else {
            St::WriteOwnerInPlace
        }
    }

    /// The owner record's last step: its rename, or its write in place.
    fn owner_last(&self) -> St {
        if self.owner_in_place() {
            St::WriteOwnerInPlace
        } else {
            St::RenameOwner
        }
    }

    /// The registry folders are made once, by the first owner (their listings said whether
    /// they exist); then the sweeps.
    fn registry(&mut self) {
        if self.registry_made {
            self.start_sweeps();
        } else {
            self.st = St::MakeRegistry;
        }
    }
}

/// Where an inspection is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum ISt {
    /// Is the opened dir still at its path?
    StillAt,
    /// The entries of the state dir.
    ListRoot,
    /// The identity marker.
    ReadMarker,
    /// The owner record.
    ReadOwner,
    /// The epoch file.
    ReadEpoch,
}

/// The read-only inspection of a state dir, which refuses foreign, moved or corrupt state
/// before anything is created (card L8) and again under the lock, since the dir may have
/// changed while waiting:
/// - a dir that is no longer at its path: `moved or replaced` (card H7);
/// - entries besides `.tenure/` but no marker: `derived state but no identity`;
/// - a marker that does not parse: `identity is unreadable`;
/// - a marker naming another canonical path: `identity mismatch`;
/// - a corrupt owner record or epoch file, or any file that privfs refuses.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Inspection {
    /// The state dir (shared with the acquisition that inspects it).
    path: Arc<Path>,
    st: ISt,
    found: Found,
    /// An entry of the state dir besides the control folder.
    foreign: Option<String>,
    /// The marker was read again after a listing found other entries beside the control
    /// folder: another process may have written the marker and then made derived state
    /// between this one's first look for the marker and its listing (card D8: concurrent
    /// first starts).
    reread: bool,
}

impl Inspection {
    fn new(path: Arc<Path>) -> Inspection {
        Inspection {
            path,
            st: ISt::StillAt,
            found: Found::default(),
            foreign: None,
            reread: false,
        }
    }

    fn control_path(&self, name: &str) -> PathBuf {
        Loc::Control.path(&self.path).join(name)
    }

    fn op(&self) -> Option<Act> {
        Some(match self.st {
            ISt::StillAt => Act::StillAtPath,
            ISt::ListRoot => Act::List(Loc::Root),
            ISt::ReadMarker => read(Loc::Control, IDENTITY_FILE, MAX_RECORD),
            ISt::ReadOwner => read(Loc::Control, OWNER_FILE, MAX_RECORD),
            ISt::ReadEpoch => read(Loc::Control, epoch::EPOCH_FILE, epoch::MAX_LEN),
        })
    }

    /// The refusals that depend on the marker (card L8).
    fn check_marker(&self) -> Result<(), LeaseError> {
        match &self.found.marker {
            Some(m) if *m.path != *self.path => Err(LeaseError::IdentityMismatch {
                path: self.control_path(IDENTITY_FILE),
                recorded: m.path.clone(),
                actual: self.path.to_path_buf(),
            }),
            Some(_) => Ok(()),
            None => match &self.foreign {
                Some(entry) => Err(LeaseError::ForeignState {
                    dir: self.path.to_path_buf(),
                    entry: OsString::from(entry),
                }),
                None => Ok(()),
            },
        }
    }

    /// Consumes a result; `Some` once the inspection is complete.
    fn handle(&mut self, res: Res) -> Option<Result<Found, LeaseError>> {
        let done = |s: &mut Inspection| Some(Ok(std::mem::take(&mut s.found)));
        match (self.st, res) {
            // The marker first: a dir that has one (and it names this dir) needs no listing;
            // only a dir without one is listed, for entries tenure did not create.
            (ISt::StillAt, Res::Flag(true)) => {
                self.st = ISt::ReadMarker;
                None
            }
            (ISt::StillAt, Res::Flag(false)) => Some(Err(LeaseError::Moved {
                dir: self.path.to_path_buf(),
            })),
            (ISt::ReadMarker, Res::Bytes(Some(b))) => {
                match marker_from(Some(b), || self.control_path(IDENTITY_FILE)) {
                    Ok(m) => self.found.marker = m,
                    Err(e) => return Some(Err(e)),
                }
                if let Err(e) = self.check_marker() {
                    return Some(Err(e));
                }
                self.found.control = true;
                self.st = ISt::ReadOwner;
                None
            }
            (ISt::ReadMarker, Res::Bytes(None)) if self.reread => {
                if let Err(e) = self.check_marker() {
                    return Some(Err(e));
                }
                self.st = ISt::ReadOwner;
                None
            }
            (ISt::ReadMarker, Res::Bytes(None)) => {
                self.st = ISt::ListRoot;
                None
            }
            (ISt::ListRoot, Res::Listed(entries)) => {
                let entries = entries.unwrap_or_default();
                self.found.control = entries.iter().any(|(n, _)| n == CONTROL_DIR);
                self.foreign = entries
                    .into_iter()
                    .map(|(n, _)| n)
                    .find(|n| n != CONTROL_DIR);
                // Derived state beside a control folder without a marker: the marker is
                // written before anything is derived, so look for it once more; only if it is
                // still missing is the state foreign.
                if self.foreign.is_some() && self.found.control && !self.reread {
                    self.reread = true;
                    self.st = ISt::ReadMarker;
                    return None;
                }
                if let Err(e) = self.check_marker() {
                    return Some(Err(e));
                }
                if self.found.control {
                    self.st = ISt::ReadOwner;
                    None
                } else {
                    done(self)
                }
            }
            (ISt::ReadMarker, Res::Failed(e)) => Some(Err(match record_read_error(e) {
                LeaseError::CorruptRecord { path, reason } => {
                    LeaseError::IdentityUnreadable { path, reason }
                }
                e => e,
            })),
            (ISt::ReadOwner, Res::Bytes(b)) => {
                self.found.owner_file = b.is_some();
                match owner_from(b, || self.control_path(OWNER_FILE)) {
                    Ok(o) => {
                        self.found.owner = o;
                        self.st = ISt::ReadEpoch;
                        None
                    }
                    Err(e) => Some(Err(e)),
                }
            }
            (ISt::ReadEpoch, res) => match epoch_from(res, || self.control_path(epoch::EPOCH_FILE))
            {
                Ok(stored) => {
                    self.found.epoch = stored.map_or(0, epoch::Stored::epoch);
                    self.found.stored = stored;
                    done(self)
                }
                Err(e) => Some(Err(e)),
            },
            (_, Res::Failed(e)) => Some(Err(record_read_error(e))),
            (_, other) => Some(Err(unexpected(other))),
        }
    }
}

/// The read-only check of a state dir ([`super::check`]): the refusals of acquisition,
/// without creating anything.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct CheckSteps {
    inspection: Inspection,
    out: Option<Result<(), Failure>>,
}

impl CheckSteps {
    /// Checks the state dir at `path`.
    pub fn new(path: PathBuf) -> CheckSteps {
        CheckSteps {
            inspection: Inspection::new(Arc::from(path)),
            out: None,
        }
    }
}

impl Steps for CheckSteps {
    type Output = Result<(), Failure>;

    fn op(&self) -> Option<Act> {
        if self.out.is_some() {
            return None;
        }
        self.inspection.op()
    }

    fn handle(&mut self, res: Res) {
        if let Some(r) = self.inspection.handle(res) {
            self.out = Some(r.map(|_| ()).map_err(Failure::new));
        }
    }

    fn take(&mut self) -> Option<Self::Output> {
        self.out.take()
    }
}

/// Keeps the higher of `best` and (`e`, `path`).
/// `e` (recorded at `path`, made only when it is kept) if it is above `best`.
fn consider(best: &mut Option<Seen>, e: u64, path: impl FnOnce() -> PathBuf) {
    if best.as_ref().is_none_or(|b| e > b.epoch) {
        *best = Some(Seen {
            epoch: e,
            path: path(),
        });
    }
}

impl Steps for AcquireSteps {
    type Output = Result<Acquired, Failure>;

    fn op(&self) -> Option<Act> {
        Some(match &self.st {
            St::Cancelled => Act::Cancelled,
            St::Inspect(i) => return i.op(),
            St::BusyOwner | St::ReportOwner | St::ExpiredOwner => {
                read(Loc::Control, OWNER_FILE, MAX_RECORD)
            }
            St::MakeControl => Act::Mkdir {
                dir: Loc::Control,
                label: "lease.control",
            },
            St::SyncRoot => Act::SyncDir {
                dir: Loc::Root,
                label: "lease.control",
            },
            St::OpenLock => Act::OpenLock,
            St::TryLock => Act::TryLock,
            St::MakeWaiters | St::MakeWaitersOwned => Act::Mkdir {
                dir: Loc::Waiters,
                label: "lease.waiters",
            },
            St::SyncWaitersParent | St::SyncWaitersOwned => Act::SyncDir {
                dir: Loc::Control,
                label: "lease.waiters",
            },
            St::WriteWaiter => Act::WriteTemp {
                dir: Loc::Waiters,
                bytes: to_json(&WaiterRecord {
                    version: RECORD_VERSION,
                    identity: self.input.me.clone(),
                    since: self.input.now,
                }),
                label: "lease.waiter",
            },
            St::RenameWaiter(tmp) => Act::Rename {
                dir: Loc::Waiters,
                from: tmp.clone(),
                to: waiter_name(&self.input.me),
                noreplace: false,
                label: "lease.waiter",
            },
            St::AbandonWaiter(tmp) => Act::Unlink {
                dir: Loc::Waiters,
                name: tmp.clone(),
                label: "lease.waiter",
            },
            St::Report(owner) => Act::Contended(owner.clone()),
            St::Wait => Act::Wait,
            St::GiveUp(_) | St::DropWaiter | St::CleanWaiter => Act::Unlink {
                dir: Loc::Waiters,
                name: self.waiter.clone().unwrap_or_default(),
                label: "lease.waiter",
            },
            St::EndLeftovers => {
                let (rec, root_id, epoch) = self.leftovers_to_end()?;
                Act::EndCgroup {
                    rec,
                    root_id,
                    epoch,
                }
            }
            St::ListControl => Act::List(Loc::Control),
            St::UnlinkTemp(i) => Act::Unlink {
                dir: Loc::Control,
                name: self.temps_found[*i].clone(),
                label: "lease.sweep",
            },
            St::ListLeases => Act::List(Loc::Leases),
            St::ListInstances => Act::List(Loc::Instances),
            St::CheckpointEpoch => Act::CheckpointEpoch,
            St::CreateCgroup => Act::CreateCgroup {
                name: cgroup_name(&self.root_id().to_string(), self.epoch_value()),
            },
            St::WriteEpochInPlace => self.epoch_in_place()?,
            St::WriteScratch => self.scratch_in_place()?,
            St::WriteEpoch => {
                let Some(epoch::EpochWrite::Whole { reservation }) = &self.epoch_write else {
                    return None;
                };
                Act::WriteTemp {
                    dir: Loc::Control,
                    bytes: epoch::encode_batched(&epoch::Batched {
                        reserved: [Some(*reservation), None],
                        scratch: None,
                    }),
                    label: "epoch",
                }
            }
            St::FsyncEpoch => fsync(
                Loc::Control,
                self.epoch_tmp.as_deref().unwrap_or(epoch::EPOCH_FILE),
                "epoch",
            ),
            St::WriteMarker => Act::WriteTemp {
                dir: Loc::Control,
                bytes: to_json(self.marker.as_ref()?),
                label: "lease.marker",
            },
            St::FsyncMarker => fsync(Loc::Control, self.marker_tmp.as_ref()?, "lease.marker"),
            St::WriteOwner => Act::WriteTemp {
                dir: Loc::Control,
                bytes: match &self.owner_slot {
                    Some(slot) => slot.to_vec(),
                    None => to_json(self.record.as_ref()?),
                },
                label: "lease.owner",
            },
            St::WriteOwnerInPlace => owner_in_place(self.owner_slot.as_ref()?),
            St::RenameEpoch => Act::Rename {
                dir: Loc::Control,
                from: self.epoch_tmp.clone()?,
                to: epoch::EPOCH_FILE.to_owned(),
                noreplace: false,
                label: "epoch",
            },
            // Without replacing: the marker of a dir is written once (card L7).
            St::RenameMarker => Act::Rename {
                dir: Loc::Control,
                from: self.marker_tmp.clone()?,
                to: IDENTITY_FILE.to_owned(),
                noreplace: !crate::mutant::on("lease-marker-every-acquisition"),
                label: "lease.marker",
            },
            St::RenameOwner => Act::Rename {
                dir: Loc::Control,
                from: self.owner_tmp.clone()?,
                to: OWNER_FILE.to_owned(),
                noreplace: false,
                label: "lease.owner",
            },
            St::SyncControl => Act::SyncDir {
                dir: Loc::Control,
                label: "lease.acquire",
            },
            St::MakeRegistry => Act::Mkdir {
                dir: Loc::Registry,
                label: "lease.registry",
            },
            St::SyncRegistryParent => Act::SyncDir {
                dir: Loc::Control,
                label: "lease.registry",
            },
            St::MakeLeases => Act::Mkdir {
                dir: Loc::Leases,
                label: "lease.registry",
            },
            St::MakeInstances => Act::Mkdir {
                dir: Loc::Instances,
                label: "lease.registry",
            },
            St::SyncLeasesParent | St::SyncInstancesParent => Act::SyncDir {
                dir: Loc::Registry,
                label: "lease.registry",
            },
            St::ListWaiters => Act::List(Loc::Waiters),
            St::SweepRead(kind, i) => read(kind.dir(), &self.sweep_names(*kind)[*i], MAX_RECORD),
            St::SweepLive(_, _, id) => Act::Liveness(id.clone()),
            St::SweepPidLive(_, _, pid, start) => Act::PidLiveness {
                pid: *pid,
                start: *start,
            },
            St::SweepUnlink(kind, i) => Act::Unlink {
                dir: kind.dir(),
                name: self.sweep_names(*kind)[*i].clone(),
                label: "lease.sweep",
            },
            St::SweepVacate(kind, i) => {
                vacate(kind.dir(), &self.sweep_names(*kind)[*i], "lease.sweep")
            }
            St::SweepTemp(kind, i) => Act::Unlink {
                dir: kind.dir(),
                name: self.temps_found[*i].clone(),
                label: "lease.sweep",
            },
            St::WriteEntry => Act::WriteAt {
                dir: Loc::Leases,
                name: record::OWNER_ENTRY.to_owned(),
                offset: 0,
                bytes: Arc::clone(self.entry_slot.as_ref()?),
                label: "lease.registry",
            },
            St::ReplaceEntry => Act::WriteTemp {
                dir: Loc::Leases,
                bytes: match &self.entry_slot {
                    Some(slot) => slot.to_vec(),
                    None => to_json(&self.registry_entry()),
                },
                label: "lease.registry",
            },
            St::RenameEntry(tmp) => Act::Rename {
                dir: Loc::Leases,
                from: tmp.clone(),
                to: record::OWNER_ENTRY.to_owned(),
                noreplace: false,
                label: "lease.registry",
            },
            St::CleanTemp(i) => {
                let (dir, name) = &self.temps[*i];
                Act::Unlink {
                    dir: *dir,
                    name: name.clone(),
                    label: "lease.abandon",
                }
            }
            St::CleanCgroup => Act::RemoveCgroup,
            St::CleanUnlock => Act::Unlock,
            St::Done => return None,
        })
    }

    fn handle(&mut self, res: Res) {
        let st = std::mem::replace(&mut self.st, St::Done);
        match (st, res) {
            (St::Cancelled, Res::Flag(true)) => {
                self.failure = Some(Failure::new(LeaseError::Cancelled {
                    dir: self.dir_path(),
                }));
                self.st = St::CleanTemp(0);
                self.settle();
            }
            // The lock is tried first: when the control folder exists and the lock is free,
            // nothing is created before it is ours, so the one inspection under the lock is
            // the one that counts (card L8). The dir is inspected before the lock only when
            // something is to be made first: the control folder (below) or a waiter entry.
            (St::Cancelled, Res::Flag(false)) => self.st = St::OpenLock,
            (St::OpenLock, Res::Failed(LeaseError::Fs(FsError::NotFound { .. })))
                if !self.pre_inspected =>
            {
                self.inspect();
            }
            (St::Inspect(mut i), res) => match i.handle(res) {
                None => self.st = St::Inspect(i),
                Some(Ok(found)) => self.inspected(found),
                Some(Err(e)) => self.fail(e),
            },
            (St::MakeControl, Res::Made(created)) => {
                self.st = if created { St::SyncRoot } else { St::OpenLock };
            }
            (St::SyncRoot, Res::Done) => self.st = St::OpenLock,
            (St::OpenLock, Res::Done) => self.st = St::TryLock,
            (St::TryLock, Res::Lock(LockTry::Locked)) => {
                self.locked = true;
                self.inspect();
            }
            (St::TryLock, Res::Lock(LockTry::Busy { may_wait })) => {
                if self.pre_inspected {
                    self.found_busy(may_wait);
                } else {
                    self.busy = Some(may_wait);
                    self.inspect();
                }
            }
            (St::BusyOwner | St::ExpiredOwner, res) => {
                let owner = match res {
                    Res::Bytes(b) => owner_from(b, || self.control_path(OWNER_FILE))
                        .ok()
                        .flatten()
                        .map(Box::new),
                    _ => None,
                };
                self.failure = Some(Failure::new(LeaseError::Busy {
                    dir: self.dir_path(),
                    owner,
                }));
                self.st = St::CleanTemp(0);
                self.settle();
            }
            (St::MakeWaiters, Res::Made(created)) => {
                self.st = if created {
                    St::SyncWaitersParent
                } else {
                    St::WriteWaiter
                };
            }
            (St::SyncWaitersParent, Res::Done) => self.st = St::WriteWaiter,
            (St::WriteWaiter, Res::Temp(tmp)) => self.st = St::RenameWaiter(tmp),
            (St::RenameWaiter(_), Res::Done) => {
                self.waiter = Some(waiter_name(&self.input.me));
                self.st = St::ReportOwner;
            }
            (St::RenameWaiter(tmp), Res::Failed(e)) => {
                self.failure = Some(Failure::new(e));
                self.st = St::AbandonWaiter(tmp);
            }
            (St::AbandonWaiter(_), _) => {
                self.st = St::CleanTemp(0);
                self.settle();
            }
            (St::ReportOwner, res) => {
                let owner = match res {
                    Res::Bytes(b) => owner_from(b, || self.control_path(OWNER_FILE))
                        .ok()
                        .flatten()
                        .map(Box::new),
                    _ => None,
                };
                self.st = St::Report(owner);
            }
            (St::Report(_), Res::Done) => self.st = St::Wait,
            (St::Wait, Res::Waited(WaitEnd::Acquired)) => {
                self.locked = true;
                self.inspect();
            }
            (St::Wait, Res::Waited(end @ (WaitEnd::Expired | WaitEnd::Cancelled))) => {
                if crate::mutant::on("lease-waiter-left-on-cancel") && end == WaitEnd::Cancelled {
                    // The bug: a cancelled waiter forgets its entry.
                    self.waiter = None;
                    self.handle_given_up(end);
                } else {
                    self.st = St::GiveUp(end);
                }
            }
            (St::GiveUp(end), _) => {
                self.waiter = None;
                self.handle_given_up(end);
            }
            (St::EndLeftovers, Res::Ended(ended)) => {
                self.leftovers_done = true;
                match ended {
                    EndedCgroup::Gone => {}
                    EndedCgroup::Ended { killed } => self.leftovers = killed,
                    EndedCgroup::Survived { pids } => {
                        let prev = self.previous.as_ref();
                        let (epoch, cgroup) = match prev.and_then(|p| p.containment.as_ref()) {
                            Some(Containment::Cgroup(rec)) => {
                                (prev.map_or(0, |p| p.epoch), rec.path.clone())
                            }
                            Some(Containment::LockFd) | None => (0, PathBuf::new()),
                        };
                        self.fail(LeaseError::LeftoversSurvived {
                            dir: self.dir_path(),
                            epoch,
                            cgroup,
                            pids,
                        });
                        return;
                    }
                }
                if self.record.is_some() {
                    self.registry();
                } else {
                    self.st = self.sweep_control();
                }
            }
            (St::ListControl, Res::Listed(entries)) => {
                // Temp files in the control folder can only be left by an owner that crashed
                // mid-write (waiters write in `waiters/`), so the new owner removes them.
                self.temps_found = entries
                    .unwrap_or_default()
                    .into_iter()
                    .filter(|(n, k)| *k == FileKind::Regular && is_temp(n))
                    .map(|(n, _)| n)
                    .collect();
                self.removed = false;
                self.st = if self.temps_found.is_empty() {
                    St::ListLeases
                } else {
                    St::UnlinkTemp(0)
                };
            }
            (St::UnlinkTemp(i), res) => match res {
                Res::Done | Res::Failed(LeaseError::Fs(FsError::NotFound { .. })) => {
                    self.removed = true;
                    // Not synced (issue 11): a power loss that brings a temp file back brings
                    // it back to the next owner, who removes it again.
                    self.st = if i + 1 < self.temps_found.len() {
                        St::UnlinkTemp(i + 1)
                    } else {
                        St::ListLeases
                    };
                }
                other => self.fail(unexpected(other)),
            },
            (St::ListLeases, Res::Listed(entries)) => {
                self.registry_made = entries.is_some();
                self.leases = names(entries);
                self.st = St::ListInstances;
            }
            (St::ListInstances, Res::Listed(entries)) => {
                self.registry_made = entries.is_some() && (self.quick || self.registry_made);
                self.instances = names(entries);
                self.st = St::CheckpointEpoch;
            }
            (St::CheckpointEpoch, Res::Seen(seen)) => {
                self.highest = seen;
                match self.compute() {
                    Ok(()) => {
                        self.st = if self.input.cgroup {
                            St::CreateCgroup
                        } else {
                            self.records_ready()
                        };
                    }
                    Err(e) => self.fail(e),
                }
            }
            (St::CreateCgroup, Res::Cgroup(made)) => {
                match made {
                    Ok(rec) => {
                        if let Some(r) = self.record.as_mut() {
                            r.containment = Some(Containment::Cgroup(rec.clone()));
                        }
                        self.cgroup = Some(rec);
                    }
                    Err(why) => self.cgroup_error = Some(why),
                }
                self.st = self.records_ready();
            }
            (St::WriteEpoch, Res::Temp(t)) => {
                self.temps.push((Loc::Control, t.clone()));
                self.epoch_tmp = Some(t);
                // The mutant `lease-epoch-data-unsynced` renames the new epoch file into place
                // without making its data durable: a power loss can leave it empty.
                if crate::mutant::on("lease-epoch-data-unsynced") {
                    self.after_epoch_fsync();
                } else {
                    self.st = St::FsyncEpoch;
                }
            }
            (St::WriteEpochInPlace, Res::Done) => {
                // The mutant `lease-epoch-not-synced` hands out an epoch of the new
                // reservation without the fdatasync: after a power loss the reservation can
                // be old again, below an epoch already handed out (to a child that may have
                // fenced an external system with it).
                if crate::mutant::on("lease-epoch-not-synced") {
                    self.st = St::WriteScratch;
                } else {
                    self.st = St::FsyncEpoch;
                }
            }
            // A whole new file's scratch slot waits for its rename to be durable (after the
            // records); a reservation in place is durable now.
            (St::FsyncEpoch, Res::Done) => {
                if self.epoch_tmp.is_some() {
                    self.after_epoch_fsync();
                } else {
                    self.st = St::WriteScratch;
                }
            }
            (St::WriteScratch, Res::Done) => {
                if self.epoch_tmp.is_some() {
                    self.after_records();
                } else {
                    self.after_epoch_fsync();
                }
            }
            (St::WriteMarker, Res::Temp(t)) => {
                self.temps.push((Loc::Control, t.clone()));
                self.marker_tmp = Some(t);
                // The mutant `lease-marker-not-synced` renames the marker into place with its
                // data unsynced: the successor trusts a marker, and after a power loss it can
                // be empty.
                self.st = if crate::mutant::on("lease-marker-not-synced") {
                    self.owner_next()
                } else {
                    St::FsyncMarker
                };
            }
            (St::FsyncMarker, Res::Done) => self.st = self.owner_next(),
            (St::WriteOwner, Res::Temp(t)) => {
                self.temps.push((Loc::Control, t.clone()));
                self.owner_tmp = Some(t);
                // The owner record is evidence for live processes, written and never synced
                // (issue 11): a power loss that takes it (or leaves it empty) also took every
                // process it could speak for. (After a failed write in place, the epoch file and
                // marker are in place already.)
                let fallback = self.owner_slot.is_some() && self.found.owner_file;
                self.st = if fallback {
                    St::RenameOwner
                } else if self.epoch_tmp.is_some() {
                    St::RenameEpoch
                } else if self.new_marker {
                    St::RenameMarker
                } else {
                    St::RenameOwner
                };
            }
            // Every file of the acquisition is written first (the epoch and a new marker
            // fdatasynced), then all are renamed into place and the control folder is synced
            // once, before the grant: the epoch must outlive a power loss once a child could
            // have seen it. The epoch is renamed first, so a crash can leave a bumped epoch
            // with an older record (harmless), never the reverse.
            (St::RenameEpoch, Res::Done) => {
                self.forget_temp(self.epoch_tmp.clone());
                self.st = if self.new_marker {
                    St::RenameMarker
                } else {
                    self.owner_last()
                };
            }
            (St::RenameMarker, Res::Done) => {
                self.forget_temp(self.marker_tmp.clone());
                self.st = self.owner_last();
            }
            // No owner record file yet (a new dir, or one an operator removed): it is written
            // whole, once.
            (St::WriteOwnerInPlace, Res::Failed(LeaseError::Fs(FsError::NotFound { .. }))) => {
                self.owner_whole = true;
                self.st = St::WriteOwner;
            }
            (St::RenameOwner | St::WriteOwnerInPlace, Res::Done) => {
                self.forget_temp(self.owner_tmp.clone());
                // The control folder is synced only when an entry that must outlive a power
                // loss was renamed into it: a new epoch file (the first, or the one replacing
                // a legacy file) or a new marker. An epoch written in place is durable with
                // its fdatasync; the owner record's rename is evidence, never synced. (The
                // mutant `lease-epoch-not-synced` grants before the sync of a new epoch file.)
                let needs_sync = self.new_marker
                    || (self.epoch_tmp.is_some() && !crate::mutant::on("lease-epoch-not-synced"));
                if needs_sync {
                    self.st = St::SyncControl;
                } else {
                    self.records_placed();
                }
            }
            (St::SyncControl, Res::Done) => self.records_placed(),
            (St::MakeRegistry, Res::Made(created)) => {
                self.st = if created {
                    St::SyncRegistryParent
                } else {
                    St::MakeLeases
                };
            }
            (St::SyncRegistryParent, Res::Done) => self.st = St::MakeLeases,
            (St::MakeLeases, Res::Made(created)) => {
                self.st = if created {
                    St::SyncLeasesParent
                } else {
                    St::MakeInstances
                };
            }
            (St::SyncLeasesParent, Res::Done) => self.st = St::MakeInstances,
            (St::MakeInstances, Res::Made(created)) => {
                if created {
                    self.st = St::SyncInstancesParent;
                } else {
                    self.start_sweeps();
                }
            }
            (St::SyncInstancesParent, Res::Done) => self.start_sweeps(),
            (St::MakeWaitersOwned, Res::Made(created)) => {
                self.st = if created {
                    St::SyncWaitersOwned
                } else {
                    St::ListWaiters
                };
            }
            (St::SyncWaitersOwned, Res::Done) => self.st = St::WriteEntry,
            // The owner makes `waiters/` once, so that a waiter never has to.
            (St::ListWaiters, Res::Listed(None)) => self.st = St::MakeWaitersOwned,
            (St::ListWaiters, Res::Listed(Some(entries))) => {
                self.waiters = names(Some(entries));
                self.temps_found.clear();
                self.sweep_from(SweepKind::Waiters, 0);
            }
            (St::SweepRead(kind, i), res) => self.swept_read(kind, i, res),
            (St::SweepLive(kind, i, _) | St::SweepPidLive(kind, i, _, _), Res::Live(l)) => {
                let candidate = self.candidate.take();
                let name = self.sweep_names(kind)[i].clone();
                if l == Liveness::Live {
                    // A live instance of a crashed owner: an orphan the new owner must stop.
                    if let Some(c) = candidate {
                        self.orphans.push(c);
                        self.orphan_entries.push(name);
                    }
                    self.sweep_from(kind, i + 1);
                } else if record::is_registry_slot(&name) {
                    // An entry written in place is vacated in place, never removed (issue 11).
                    self.st = St::SweepVacate(kind, i);
                } else {
                    self.st = St::SweepUnlink(kind, i);
                }
            }
            (St::SweepUnlink(kind, i) | St::SweepVacate(kind, i), res) => match res {
                Res::Done | Res::Failed(LeaseError::Fs(FsError::NotFound { .. })) => {
                    self.removed = true;
                    self.sweep_from(kind, i + 1);
                }
                other => self.fail(unexpected(other)),
            },
            (St::SweepTemp(kind, i), res) => match res {
                Res::Done | Res::Failed(LeaseError::Fs(FsError::NotFound { .. })) => {
                    self.removed = true;
                    self.sweep_temps(kind, i + 1);
                }
                other => self.fail(unexpected(other)),
            },
            // No entry file yet (the dir's first owner, or one of an older tenure): it is
            // written whole, once; later owners overwrite it in place.
            (St::WriteEntry, Res::Failed(LeaseError::Fs(FsError::NotFound { .. }))) => {
                self.st = St::ReplaceEntry;
            }
            (St::ReplaceEntry, Res::Temp(t)) => {
                self.temps.push((Loc::Leases, t.clone()));
                self.st = St::RenameEntry(t);
            }
            (St::RenameEntry(t), Res::Done) => {
                self.forget_temp(Some(t));
                self.entry_written();
            }
            (St::WriteEntry, Res::Done) => self.entry_written(),
            // A waiter entry that cannot be removed is swept by the next owner (its process
            // will be gone); the lease is ours either way.
            (St::DropWaiter, _) => {
                self.waiter = None;
                self.finish();
            }
            (St::CleanTemp(i), _) => {
                self.st = St::CleanTemp(i + 1);
                self.settle();
            }
            (St::CleanCgroup, _) => {
                self.cgroup = None;
                self.st = St::CleanUnlock;
                self.settle();
            }
            (St::CleanUnlock, _) => {
                self.locked = false;
                self.st = St::CleanWaiter;
                self.settle();
            }
            (St::CleanWaiter, _) => {
                self.waiter = None;
                self.st = St::CleanWaiter;
                self.settle();
            }
            (St::Done, _) => {}
            (_, Res::Failed(e)) => {
                let e = match e {
                    e @ LeaseError::Fs(FsError::TooLarge { .. }) => record_read_error(e),
                    e => e,
                };
                self.fail(e);
            }
            (_, other) => self.fail(unexpected(other)),
        }
    }

    fn take(&mut self) -> Option<Self::Output> {
        self.out.take()
    }
}

impl AcquireSteps {
    fn handle_given_up(&mut self, end: WaitEnd) {
        match end {
            WaitEnd::Expired => self.st = St::ExpiredOwner,
            WaitEnd::Cancelled | WaitEnd::Acquired => {
                self.failure = Some(Failure::new(LeaseError::Cancelled {
                    dir: self.dir_path(),
                }));
                self.st = St::CleanTemp(0);
                self.settle();
            }
        }
    }

    /// Our registry entry is in place: remove our waiter entry, if any, and finish.
    fn entry_written(&mut self) {
        if self.waiter.is_some() {
            self.st = St::DropWaiter;
        } else {
            self.finish();
        }
    }

    fn forget_temp(&mut self, name: Option<String>) {
        if let Some(n) = name {
            self.temps.retain(|(_, t)| *t != n);
        }
    }

    fn start_sweeps(&mut self) {
        self.removed = false;
        self.temps_found = self.leases.iter().filter(|n| is_temp(n)).cloned().collect();
        self.sweep_from(SweepKind::Leases, 0);
    }

    /// A sweep read entry `i`: decide whether it goes.
    fn swept_read(&mut self, kind: SweepKind, i: usize, res: Res) {
        let root_id = self.root_id();
        let name = self.sweep_names(kind)[i].clone();
        let bytes = match res {
            Res::Bytes(b) => b,
            // An entry that cannot be read is judged by its name (waiters) or left alone.
            Res::Failed(_) => None,
            other => {
                self.fail(unexpected(other));
                return;
            }
        };
        match kind {
            // Owner entries of earlier ownerships of this dir go: whoever wrote them no longer
            // holds the lock. Entries of another dir's identity stay (card P4).
            // An empty one is an earlier owner's that a crash or a power loss cut short between
            // its create and its write: it names nobody, and goes.
            SweepKind::Leases => {
                let empty = bytes.as_ref().is_some_and(Vec::is_empty);
                let rec = bytes.and_then(|b| record::parse::<RegistryRecord>(&b).ok());
                if empty || rec.is_some_and(|r| is_ours(r.root_id, root_id)) {
                    self.st = St::SweepUnlink(kind, i);
                } else {
                    self.sweep_from(kind, i + 1);
                }
            }
            // Instance entries of earlier ownerships of this dir go once their process is
            // gone; live ones are orphans of a crashed owner. Unreadable entries and other
            // identities' are neither swept nor returned (card P4).
            SweepKind::Instances => {
                let epoch = self.epoch_value();
                let rec = if record::is_registry_slot(&name) {
                    // Vacant (or torn: only a power loss tears a slot, and it ended every
                    // process an entry could name) holds nobody.
                    bytes.and_then(|b| record::decode_registry_slot(&b).ok().flatten())
                } else {
                    bytes.and_then(|b| record::parse::<RegistryRecord>(&b).ok())
                };
                match rec {
                    Some(r) if is_ours(r.root_id, root_id) && r.epoch < epoch => {
                        self.st = St::SweepLive(kind, i, r.identity.clone());
                        self.candidate = Some(r);
                    }
                    Some(_) | None => self.sweep_from(kind, i + 1),
                }
            }
            // Waiter entries of processes that are gone go; an unreadable one is judged by its
            // name (`<pid>-<start>.json`).
            SweepKind::Waiters => {
                match bytes.and_then(|b| record::parse::<WaiterRecord>(&b).ok()) {
                    Some(r) => self.st = St::SweepLive(kind, i, r.identity),
                    None => match record::waiter_entry_name(&name) {
                        Some((pid, start)) => self.st = St::SweepPidLive(kind, i, pid, start),
                        None => self.st = St::SweepUnlink(kind, i),
                    },
                }
            }
        }
    }
}

fn read(dir: Loc, name: &str, max: u64) -> Act {
    Act::Read {
        dir,
        name: name.to_owned(),
        max,
    }
}

/// Overwrites the in-place registry entry `dir/name` with a vacant slot
/// ([`record::REGISTRY_SLOT_SUFFIX`]); a missing file is fine.
fn vacate(dir: Loc, name: &str, label: &'static str) -> Act {
    static VACANT: std::sync::LazyLock<Arc<[u8]>> = std::sync::LazyLock::new(|| {
        record::registry_slot(None)
            .expect("a vacant slot fits")
            .into()
    });
    Act::WriteAt {
        dir,
        name: name.to_owned(),
        offset: 0,
        bytes: Arc::clone(&VACANT),
        label,
    }
}

fn fsync(dir: Loc, name: &str, label: &'static str) -> Act {
    Act::Fsync {
        dir,
        name: name.to_owned(),
        label,
    }
}

fn names(entries: Option<Vec<(String, FileKind)>>) -> Vec<String> {
    entries
        .unwrap_or_default()
        .into_iter()
        .map(|(n, _)| n)
        .collect()
}

/// Where a record rewrite is.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum WSt {
    /// Write the record to a temp file.
    Write,
    /// Rename it over the record.
    Rename(String),
    /// A step failed: remove the temp file.
    Abandon(String),
    /// Finished.
    Done,
}

/// Replaces a file of `dir` with `bytes` through a temp file (registry entries, and an owner
/// record file that does not exist yet or a record too large for its slot): write, rename,
/// never a sync (issue 11: these records are evidence for live processes, and a power loss
/// ends every process they speak for). A reader sees the old or the new content, never a mix;
/// after a power loss the record can be the old one or empty, which readers take for absent.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Replace {
    dir: Loc,
    name: String,
    bytes: Vec<u8>,
    label: &'static str,
    st: WSt,
    failure: Option<Failure>,
}

impl Replace {
    fn new(dir: Loc, name: String, bytes: Vec<u8>, label: &'static str) -> Replace {
        Replace {
            dir,
            name,
            bytes,
            label,
            st: WSt::Write,
            failure: None,
        }
    }

    fn op(&self) -> Option<Act> {
        Some(match &self.st {
            WSt::Write => Act::WriteTemp {
                dir: self.dir,
                bytes: self.bytes.clone(),
                label: self.label,
            },
            WSt::Rename(t) => Act::Rename {
                dir: self.dir,
                from: t.clone(),
                to: self.name.clone(),
                noreplace: false,
                label: self.label,
            },
            WSt::Abandon(t) => Act::Unlink {
                dir: self.dir,
                name: t.clone(),
                label: self.label,
            },
            WSt::Done => return None,
        })
    }

    /// Consumes a result; `Some` once finished.
    fn handle(&mut self, res: Res) -> Option<Result<(), Failure>> {
        let st = std::mem::replace(&mut self.st, WSt::Done);
        match (st, res) {
            (WSt::Write, Res::Temp(t)) => {
                self.st = WSt::Rename(t);
                None
            }
            (WSt::Rename(_), Res::Done) => Some(Ok(())),
            (WSt::Rename(t), other) => {
                self.failure = Some(Failure::new(unexpected(other)));
                self.st = WSt::Abandon(t);
                None
            }
            (WSt::Abandon(_), _) => Some(Err(self
                .failure
                .take()
                .unwrap_or_else(|| Failure::new(unexpected(Res::Done))))),
            (WSt::Write | WSt::Done, other) => Some(Err(Failure::new(unexpected(other)))),
        }
    }
}

/// Writes a record kept in one checksummed slot overwritten in place (issue 11): the owner
/// record ([`record::OWNER_SLOT`]) and the registry entries
/// ([`record::REGISTRY_SLOT_SUFFIX`]). Its slot goes over the existing file — one `pwrite`, no
/// temp file, no rename, no sync; only a missing file (a new dir, one an operator cleaned, the
/// first registration of a name) or a record too large for a slot is written whole through a
/// temp file and a rename. Never synced: these records are evidence for live processes.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct SlotWrite {
    dir: Loc,
    /// The file (a fixed name, or an instance entry's).
    name: Cow<'static, str>,
    label: &'static str,
    /// The slot, until it is written in place (or found to have no file to go into); shared
    /// with the act that writes it.
    in_place: Option<Arc<[u8]>>,
    /// The whole-file write, once needed.
    whole: Option<Replace>,
}

impl SlotWrite {
    /// The owner record's write.
    fn owner(record: &OwnerRecord) -> SlotWrite {
        SlotWrite::new(
            Loc::Control,
            Cow::Borrowed(OWNER_FILE),
            record::owner_slot(record),
            || to_json(record),
            "lease.owner",
        )
    }

    /// An instance entry's write (`registry/instances/<name>.slot`).
    fn instance(rec: &RegistryRecord) -> SlotWrite {
        SlotWrite::new(
            Loc::Instances,
            Cow::Owned(record::instance_entry(&rec.name)),
            record::registry_slot(Some(rec)),
            || to_json(rec),
            "lease.registry",
        )
    }

    fn new(
        dir: Loc,
        name: Cow<'static, str>,
        slot: Option<Vec<u8>>,
        whole: impl FnOnce() -> Vec<u8>,
        label: &'static str,
    ) -> SlotWrite {
        let (in_place, whole) = match slot {
            Some(slot) => (Some(slot.into()), None),
            None => (
                None,
                Some(Replace::new(dir, name.to_string(), whole(), label)),
            ),
        };
        SlotWrite {
            dir,
            name,
            label,
            in_place,
            whole,
        }
    }

    fn op(&self) -> Option<Act> {
        match (&self.in_place, &self.whole) {
            (Some(slot), _) => Some(Act::WriteAt {
                dir: self.dir,
                name: self.name.to_string(),
                offset: 0,
                bytes: Arc::clone(slot),
                label: self.label,
            }),
            (None, Some(w)) => w.op(),
            (None, None) => None,
        }
    }

    fn handle(&mut self, res: Res) -> Option<Result<(), Failure>> {
        if let Some(slot) = self.in_place.take() {
            return match res {
                Res::Done => Some(Ok(())),
                // No file yet: it is written whole, once.
                Res::Failed(LeaseError::Fs(FsError::NotFound { .. })) => {
                    self.whole = Some(Replace::new(
                        self.dir,
                        self.name.to_string(),
                        slot.to_vec(),
                        self.label,
                    ));
                    None
                }
                other => Some(Err(Failure::new(unexpected(other)))),
            };
        }
        match self.whole.as_mut() {
            Some(w) => w.handle(res),
            None => Some(Err(Failure::new(unexpected(res)))),
        }
    }
}

/// The in-place write of the owner record's slot.
fn owner_in_place(slot: &Arc<[u8]>) -> Act {
    Act::WriteAt {
        dir: Loc::Control,
        name: OWNER_FILE.to_owned(),
        offset: 0,
        bytes: Arc::clone(slot),
        label: "lease.owner",
    }
}

/// Rewrites the owner record with a new phase (card H8; [`super::Lease::set_phase`]).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct SetPhaseSteps {
    write: SlotWrite,
    out: Option<Result<(), Failure>>,
}

impl SetPhaseSteps {
    /// Writes `record` (the owner's record with its new phase).
    pub fn new(record: &OwnerRecord) -> SetPhaseSteps {
        SetPhaseSteps {
            write: SlotWrite::owner(record),
            out: None,
        }
    }
}

impl Steps for SetPhaseSteps {
    type Output = Result<(), Failure>;

    fn op(&self) -> Option<Act> {
        if self.out.is_some() {
            return None;
        }
        self.write.op()
    }

    fn handle(&mut self, res: Res) {
        if let Some(done) = self.write.handle(res) {
            self.out = Some(done);
        }
    }

    fn take(&mut self) -> Option<Self::Output> {
        self.out.take()
    }
}

/// Registers a process the owner runs ([`super::Lease::register_instance`]).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct RegisterSteps {
    write: SlotWrite,
    out: Option<Result<(), Failure>>,
}

impl RegisterSteps {
    /// Writes `rec` in place as `<name>.slot` (created whole the first time the name is
    /// registered in this dir).
    pub fn new(rec: &RegistryRecord) -> RegisterSteps {
        RegisterSteps {
            write: SlotWrite::instance(rec),
            out: None,
        }
    }
}

impl Steps for RegisterSteps {
    type Output = Result<(), Failure>;

    fn op(&self) -> Option<Act> {
        if self.out.is_some() {
            return None;
        }
        self.write.op()
    }

    fn handle(&mut self, res: Res) {
        if let Some(done) = self.write.handle(res) {
            self.out = Some(done);
        }
    }

    fn take(&mut self) -> Option<Self::Output> {
        self.out.take()
    }
}

/// Removes one entry that may already be gone, or vacates one written in place
/// ([`super::Lease::unregister_instance`]).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct RemoveSteps {
    dir: Loc,
    name: String,
    label: &'static str,
    /// Overwrite with a vacant slot instead of unlinking (an entry written in place).
    vacate: bool,
    out: Option<Result<(), Failure>>,
}

impl RemoveSteps {
    /// Removes `dir/name`; absent is fine.
    pub fn new(dir: Loc, name: String, label: &'static str) -> RemoveSteps {
        RemoveSteps {
            dir,
            name,
            label,
            vacate: false,
            out: None,
        }
    }

    /// Vacates the in-place entry `dir/name` (issue 11: overwritten with a vacant slot, never
    /// unlinked); absent is fine.
    pub fn vacate(dir: Loc, name: String, label: &'static str) -> RemoveSteps {
        RemoveSteps {
            vacate: true,
            ..RemoveSteps::new(dir, name, label)
        }
    }
}

impl Steps for RemoveSteps {
    type Output = Result<(), Failure>;

    fn op(&self) -> Option<Act> {
        if self.out.is_some() {
            return None;
        }
        if self.vacate {
            return Some(vacate(self.dir, &self.name, self.label));
        }
        Some(Act::Unlink {
            dir: self.dir,
            name: self.name.clone(),
            label: self.label,
        })
    }

    fn handle(&mut self, res: Res) {
        self.out = Some(match res {
            Res::Done | Res::Failed(LeaseError::Fs(FsError::NotFound { .. })) => Ok(()),
            other => Err(Failure::new(unexpected(other))),
        });
    }

    fn take(&mut self) -> Option<Self::Output> {
        self.out.take()
    }
}

/// Where stopping orphans is.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum OSt {
    /// SIGKILL to orphan `i`.
    Kill(usize),
    /// Wait for orphan `i` to be gone.
    Await(usize),
    /// Remove orphan `i`'s entry.
    Unlink(usize),
    /// Finished.
    Done,
}

/// Stops the live orphans an earlier, crashed owner left ([`super::Lease::stop_orphans`]):
/// SIGKILL through the identity-checked pidfd path, a bounded wait until each is gone, then its
/// entry is removed. Ends with the pids stopped, or the first orphan still alive at the bound.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct StopOrphansSteps {
    orphans: Vec<RegistryRecord>,
    /// Their entry names ([`Acquired::orphan_entries`]).
    entries: Vec<String>,
    stopped: Vec<u32>,
    st: OSt,
    out: Option<Result<Vec<u32>, Box<RegistryRecord>>>,
}

impl StopOrphansSteps {
    /// Stops `orphans`, whose registry entries are named `entries` (in the same order).
    pub fn new(orphans: Vec<RegistryRecord>, entries: Vec<String>) -> StopOrphansSteps {
        let mut p = StopOrphansSteps {
            orphans,
            entries,
            stopped: Vec::new(),
            st: OSt::Kill(0),
            out: None,
        };
        p.next(0);
        p
    }

    fn next(&mut self, i: usize) {
        if i < self.orphans.len() {
            self.st = OSt::Kill(i);
        } else {
            self.st = OSt::Done;
            self.out = Some(Ok(std::mem::take(&mut self.stopped)));
        }
    }
}

impl Steps for StopOrphansSteps {
    type Output = Result<Vec<u32>, Box<RegistryRecord>>;

    fn op(&self) -> Option<Act> {
        Some(match self.st {
            OSt::Kill(i) => Act::Kill(self.orphans[i].identity.clone()),
            OSt::Await(i) => Act::AwaitGone(self.orphans[i].identity.clone()),
            OSt::Unlink(i) => {
                let name = self.entries.get(i).cloned().unwrap_or_else(|| {
                    format!("{}-{}.json", self.orphans[i].epoch, self.orphans[i].name)
                });
                if record::is_registry_slot(&name) {
                    vacate(Loc::Instances, &name, "lease.sweep")
                } else {
                    Act::Unlink {
                        dir: Loc::Instances,
                        name,
                        label: "lease.sweep",
                    }
                }
            }
            OSt::Done => return None,
        })
    }

    fn handle(&mut self, res: Res) {
        match (self.st.clone(), res) {
            (OSt::Kill(i), res) => {
                if matches!(res, Res::Flag(true)) {
                    self.stopped.push(self.orphans[i].identity.pid);
                }
                self.st = OSt::Await(i);
            }
            (OSt::Await(i), Res::Flag(true)) => self.st = OSt::Unlink(i),
            (OSt::Await(i), _) => {
                self.st = OSt::Done;
                self.out = Some(Err(Box::new(self.orphans[i].clone())));
            }
            // The entry of a stopped orphan that cannot be removed is swept by the next owner.
            (OSt::Unlink(i), _) => self.next(i + 1),
            (OSt::Done, _) => {}
        }
    }

    fn take(&mut self) -> Option<Self::Output> {
        self.out.take()
    }
}

/// Where a release is.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum RSt {
    /// Vacate this ownership's instance entry `i`.
    VacateInstance(usize),
    /// Rewrite the owner record as released.
    Record,
    /// Unlock.
    Unlock,
    /// Finished.
    Done,
}

/// The orderly release ([`super::Lease::release`]): this ownership's instance entries are
/// vacated in place (issue 11: overwritten with a vacant slot, never unlinked), the owner
/// record is rewritten with phase `released`, then the lock is released (`LOCK_UN` before the
/// close, so that a waiter woken by the close finds it free). The lock is released even when a
/// step before fails; the first error is the output.
///
/// The owner's own entry (`registry/leases/owner.slot`) is left as it is: the released owner
/// record written after it says that the ownership it names ended in order (`status` shows no
/// owner entry of an epoch a released record covers), and the next owner overwrites it. Not
/// touching it keeps two folder opens and a write off the handoff's critical path.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ReleaseSteps {
    instances: Vec<String>,
    write: SlotWrite,
    st: RSt,
    failure: Option<Failure>,
    out: Option<Result<(), Failure>>,
}

impl ReleaseSteps {
    /// Releases the ownership whose record (with phase `released`) is `released`, which
    /// registered no instance (or unregistered each).
    pub fn new(released: &OwnerRecord) -> ReleaseSteps {
        ReleaseSteps::with_instances(released, Vec::new())
    }

    /// [`ReleaseSteps::new`] for an owner that registered the instance entries `registered`
    /// (`<name>.slot`) and did not unregister them: each is vacated. (Only this ownership
    /// writes them while it owns, so nothing is listed.)
    pub fn with_instances(released: &OwnerRecord, registered: Vec<String>) -> ReleaseSteps {
        ReleaseSteps {
            st: if registered.is_empty() {
                RSt::Record
            } else {
                RSt::VacateInstance(0)
            },
            instances: registered,
            // The released record is written in place, not synced: a reader never trusts a
            // partial slot, and if a power loss takes the write the previous record comes
            // back, naming a process that no longer holds the lock, which `status` shows as
            // stale.
            write: SlotWrite::owner(released),
            failure: None,
            out: None,
        }
    }

    /// Whether the plan still holds the lock (it has not unlocked yet).
    pub fn is_locked(&self) -> bool {
        !matches!(self.st, RSt::Done)
    }

    fn failed(&mut self, e: LeaseError) {
        self.failure = Some(Failure::new(e));
        self.st = RSt::Unlock;
    }
}

impl Steps for ReleaseSteps {
    type Output = Result<(), Failure>;

    fn op(&self) -> Option<Act> {
        Some(match &self.st {
            RSt::VacateInstance(i) => vacate(Loc::Instances, &self.instances[*i], "lease.release"),
            RSt::Record => return self.write.op(),
            RSt::Unlock => Act::Unlock,
            RSt::Done => return None,
        })
    }

    fn handle(&mut self, res: Res) {
        let gone_ok = |res: Res| match res {
            Res::Done | Res::Failed(LeaseError::Fs(FsError::NotFound { .. })) => Ok(()),
            other => Err(unexpected(other)),
        };
        match (self.st.clone(), res) {
            (RSt::VacateInstance(i), res) => match gone_ok(res) {
                Ok(()) if i + 1 < self.instances.len() => self.st = RSt::VacateInstance(i + 1),
                Ok(()) => self.st = RSt::Record,
                Err(e) => self.failed(e),
            },
            (RSt::Record, res) => match self.write.handle(res) {
                None => {}
                Some(Ok(())) => self.st = RSt::Unlock,
                Some(Err(f)) => {
                    self.failure = Some(f);
                    self.st = RSt::Unlock;
                }
            },
            (RSt::Unlock, res) => {
                self.st = RSt::Done;
                let unlocked = match res {
                    Res::Done => Ok(()),
                    other => Err(Failure::new(unexpected(other))),
                };
                self.out = Some(match self.failure.take() {
                    Some(f) => Err(f),
                    None => unlocked,
                });
            }
            (RSt::Done, _) => {}
        }
    }

    fn take(&mut self) -> Option<Self::Output> {
        self.out.take()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Card D8 (concurrent first starts): a process that found no marker and then lists the
    /// dir may see what another process derived after writing the marker in between; the
    /// marker is looked for once more before the state is called foreign.
    #[test]
    fn d8_a_listing_with_derived_state_looks_for_the_marker_again() {
        let listing = || {
            Res::Listed(Some(vec![
                (CONTROL_DIR.to_string(), FileKind::Directory),
                ("checkpoints".to_string(), FileKind::Directory),
            ]))
        };
        let start = || {
            let mut i = Inspection::new(Arc::from(Path::new("/state")));
            assert!(i.handle(Res::Flag(true)).is_none());
            assert!(i.handle(Res::Bytes(None)).is_none(), "no marker yet: list");
            assert!(i.handle(listing()).is_none(), "derived state: look again");
            assert!(matches!(i.st, ISt::ReadMarker), "{:?}", i.st);
            i
        };
        // Still no marker: the state is foreign.
        let mut i = start();
        match i.handle(Res::Bytes(None)) {
            Some(Err(LeaseError::ForeignState { entry, .. })) => assert_eq!(entry, "checkpoints"),
            other => panic!("expected a foreign-state refusal, got {other:?}"),
        }
        // A marker was written meanwhile: the inspection goes on to the owner record.
        let mut i = start();
        let marker = DirIdentity {
            version: RECORD_VERSION,
            root_id: Token([7; 16]),
            path: PathBuf::from("/state"),
            created_at: 1,
            adopted_at: None,
        };
        let bytes = serde_json::to_vec(&marker).unwrap();
        assert!(i.handle(Res::Bytes(Some(bytes))).is_none());
        assert!(matches!(i.st, ISt::ReadOwner), "{:?}", i.st);
        // Without a control folder nobody is initialising it: one listing decides.
        let mut i = Inspection::new(Arc::from(Path::new("/state")));
        i.handle(Res::Flag(true));
        i.handle(Res::Bytes(None));
        let only_derived =
            Res::Listed(Some(vec![("checkpoints".to_string(), FileKind::Directory)]));
        assert!(matches!(
            i.handle(only_derived),
            Some(Err(LeaseError::ForeignState { .. }))
        ));
    }
}

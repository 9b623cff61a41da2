//! Lease contention: N processes contend for one state dir, each running the real machine in
//! the real driver core and the real lease plans (`tenure::lease::plan`) over the crash
//! filesystem ([`SimFs`]), the kernel lock table and the process table of this world.
//!
//! # What runs the real code
//! Every acquisition, phase update and release is the very plan the runner executes
//! (`plan::Acquire`, `plan::SetPhase`, `plan::Release`), kept in the model's state: each file
//! operation it yields goes to the crash filesystem, each lock operation to the lock table,
//! each process operation (liveness, ending a crashed owner's cgroup) to the process table, and
//! the plan consumes the answers. The epoch rule, the marker, the owner record, the registry,
//! the sweeps and the end of a crashed owner's leftovers are therefore the real ones; the model
//! reads what they wrote from the files (the stopper reads `owner.json`, the properties read
//! waiter entries, the registry and the epoch file). The publish fence is the real
//! `tenure::lease::epoch::fence` over the epoch file.
//!
//! # The world
//! - **Processes** live in pid slots. A slot runs one incarnation at a time; a new incarnation in
//!   a slot whose previous one crashed or exited has the *same pid* and a new start time (`start`),
//!   so every restart is a recycled pid. A crash (SIGKILL) can hit a process between any two
//!   model steps: in the middle of a step's actions, between two operations of a plan, while
//!   owning, while releasing. A crash keeps the page cache: the files stay as the process left
//!   them (power loss is another matter, below).
//! - **The kernel lock** (`flock` on `.tenure/lock`) is held per lock file (the model numbers
//!   each file created at that name: `lock_gen`) by at most one live process and is dropped
//!   when its holder dies or exits. The lock file is never removed (only the
//!   `reclaim-stale-lock` mutant and the operator of [`LeaseModel::lock_removals`] do).
//! - **Waiting**: the plan's `Wait` is answered by the world: `Wake` once the lock is free,
//!   `Expire` (the bound), or a queued stop signal (the cancel descriptor becomes readable).
//!   Before the lock is taken the plan's first operation asks whether a signal is pending.
//! - **Signals**: external stop signals arrive at any live process and are queued; the driver
//!   delivers them between steps when no plan runs (not during spawning), and a wait gets them
//!   at once.
//! - **A third-party stopper** (`tenure stop`) reads the owner record from the files, opens a
//!   pidfd for the recorded pid, re-reads the identity through `/proc` and checks that the
//!   pidfd's process has not exited, then signals through the pidfd
//!   (`tenure::lease::signal_owner`). Each is a separate step, so the recorded process can die
//!   and its pid be recycled in between.
//! - **Power loss** ([`LeaseModel::power_losses`]): every process is gone (owners, waiters,
//!   workloads), the lock table is empty, and the files are one of the states
//!   [`SimFs::power_loss`] enumerates (entry ops kept in order up to any point, each file's
//!   unsynced writes up to any point): a successor after it starts from what was durable.
//!
//! The workload is in-process (recover, serve, settle residencies) in the configurations about
//! the lease ([`LeaseModel::ci`]). In the **tree world** ([`LeaseModel::tree_ci`], card T2) every
//! process is a runner (`--type simple`) whose workload is a main process and a descendant that
//! survives the runner's crash (the main process dies of its parent-death signal): one that
//! only SIGKILL ends, or one that even SIGKILL does not end. The workload is contained one of
//! two ways:
//! - **cgroup**: the acquisition plan creates the ownership's cgroup and names it in the owner
//!   record it writes; a later acquisition ends what the record's cgroup holds (SIGKILL;
//!   refusing if something survives) before it replaces the record;
//! - **lock descriptor**: the workload inherits the lock's open file description, so the lock
//!   stays held while a process of it keeps its copy; an orderly release `LOCK_UN`s it for
//!   every copy. With `close_fd`, the descendant may close its copy (the documented limit of
//!   the no-cgroup world: the checker prints the counterexample).
//!
//! # Steps
//! With [`LeaseModel::atomic_steps`] a plan runs up to its next lock operation in one model
//! step (an acquisition is "up to the lock", then "under the lock, to the grant"), and the
//! driver's actions run with the step that enabled them. Without it every operation that
//! changes what another process or a crash can see — a rename, an unlink, a `mkdir`, a lock
//! operation, the end of a cgroup, and a sync while a power loss can still come — ends a model
//! step, and so does each visible driver action (`SetPhase`, `AbandonAcquire`, `Exit`); with
//! [`LeaseModel::coarse`] only renames, lock and cgroup operations do. Reads, listings,
//! opening and closing handles, and writing a temp file that no name refers to yet run with
//! the next visible operation (they change nothing another process or a crash could tell
//! apart).

use crate::driver::{ChildView, Driver, Request, Restart};
use crate::fs::{Reorder, SimFs};
use crate::shared::Shared;
use stateright::{Model, Property, Representative};
use std::ffi::OsStr;
use std::path::PathBuf;
use tenure::fsop::{Done, Executor, Fd, Op, Step};
use tenure::lease::cgroup::{CgroupRecord, EndedCgroup, cgroup_name};
use tenure::lease::plan::{
    self, Acquire, AcquireInput, AcquireSteps, Exec, LeaseOp, LeaseRes, LockTry, Plan, Release,
    ReleaseSteps, SetPhase, SetPhaseSteps, WaitEnd,
};
use tenure::lease::{
    Containment, Identity, LeaseError, Liveness, OwnerRecord, RegistryRecord, Token, WaiterRecord,
    epoch, record,
};
use tenure::machine::{
    Action, ChildStatus, Config, Event, Fault, PhaseKind, ReadyMode, Reason, Signal, Timer,
};

/// Deliberate bugs in the world or the driver (not in `src/`: those are planted with
/// `tenure::mutant`, see [`LeaseModel::for_src_mutant`]); each must make a property fail.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Mutation {
    /// I1: a waiter that finds the recorded owner dead (identity checked) breaks the lock by
    /// recreating the lock file, treating the record as the authority. The record is stale
    /// while a new owner has locked but not yet written it.
    ReclaimStaleLock,
    /// I3: the driver releases the lease when it starts publishing, so the publish runs without
    /// the lock (release before publish).
    ReleaseBeforePublish,
    /// I4: the stopper signals through the pidfd without comparing the identity it re-read.
    SignalWithoutIdentityCheck,
    /// I4: the stopper checks the identity, then signals by pid number (`kill(pid)`) instead of
    /// through the pidfd that pinned the process.
    SignalByPid,
    /// I5: the driver delivers a queued stop signal while the acquisition holds the lock,
    /// abandoning a run that already took the lock and wrote the record.
    CancelAfterLock,
    /// I6: after `Exit(busy)` the driver starts the machine again in the same process (a retry
    /// loop) instead of ending.
    RetryAfterExit,
    /// Legal events: the host reports residencies settled every time it sees none, not once.
    SettleTwice,
}

impl Mutation {
    /// Every mutation of this model.
    pub const ALL: [Mutation; 7] = [
        Mutation::ReclaimStaleLock,
        Mutation::ReleaseBeforePublish,
        Mutation::SignalWithoutIdentityCheck,
        Mutation::SignalByPid,
        Mutation::CancelAfterLock,
        Mutation::RetryAfterExit,
        Mutation::SettleTwice,
    ];

    /// The name used on the command line and in the README.
    pub const fn name(self) -> &'static str {
        match self {
            Mutation::ReclaimStaleLock => "reclaim-stale-lock",
            Mutation::ReleaseBeforePublish => "release-before-publish",
            Mutation::SignalWithoutIdentityCheck => "signal-without-identity-check",
            Mutation::SignalByPid => "signal-by-pid",
            Mutation::CancelAfterLock => "cancel-after-lock",
            Mutation::RetryAfterExit => "retry-after-exit",
            Mutation::SettleTwice => "settle-twice",
        }
    }

    /// The property the mutation must break.
    pub const fn breaks(self) -> &'static str {
        match self {
            Mutation::ReclaimStaleLock => AT_MOST_ONE_OWNER,
            Mutation::ReleaseBeforePublish => FENCED_WRITES,
            Mutation::SignalWithoutIdentityCheck | Mutation::SignalByPid => IDENTITY_CHECKED,
            Mutation::CancelAfterLock => CANCEL_LEAVES_NOTHING,
            Mutation::RetryAfterExit => TERMINAL_IS_FINAL,
            Mutation::SettleTwice => LEGAL_EVENTS,
        }
    }

    /// Whether the mutation is about the tree world (checked in [`LeaseModel::tree_ci`]).
    pub const fn needs_tree(self) -> bool {
        false
    }

    /// Looks a mutation up by name.
    pub fn from_name(name: &str) -> Option<Mutation> {
        Mutation::ALL.into_iter().find(|m| m.name() == name)
    }
}

/// I1: at most one process owns the state dir.
pub const AT_MOST_ONE_OWNER: &str = "at most one owner";
/// I2: every ownership's epoch is in the epoch file at the grant and above every epoch granted
/// before, across crashes and power loss.
pub const EPOCHS_INCREASE: &str = "epochs increase";
/// I3: only the lock holder writes the record, publishes or releases; stale epochs are fenced.
pub const FENCED_WRITES: &str = "fenced writes";
/// I4: no signal reaches a process whose identity differs from the record it was sent for.
pub const IDENTITY_CHECKED: &str = "identity-checked signals";
/// I5: a cancelled run (stopped or busy) leaves no lock, record, registry or waiter entry.
pub const CANCEL_LEAVES_NOTHING: &str = "cancel leaves nothing";
/// I6: a terminal phase is never left.
pub const TERMINAL_IS_FINAL: &str = "terminal is final";
/// The driver feeds only events its semantics allow and the machine accepts.
pub const LEGAL_EVENTS: &str = "legal events";
/// I7 (card T2): never two workloads' processes alive under different epochs.
pub const NO_OVERLAP: &str = "no two workloads at once";
/// I7 (card T1): no orderly release while a process of the releaser's workload runs.
pub const RELEASE_AFTER_TREE: &str = "release after the tree";
/// Card L7: once a dir has its identity marker, its root id never changes.
pub const MARKER_WRITTEN_ONCE: &str = "marker written once";
/// Issue 11: a process started after a power loss acquires without a refusal or an error
/// (what the power loss left is what the protocol made durable, and nothing it reads is torn).
pub const CLEAN_AFTER_POWER_LOSS: &str = "a successor after power loss starts clean";

const V_EPOCH: u16 = 1;
const V_FENCE: u16 = 2;
const V_SIGNAL: u16 = 4;
const V_ILLEGAL: u16 = 8;
const V_TREE: u16 = 16;
const V_MARKER: u16 = 32;

/// The model's state dir as plans and messages name it.
const DIR: &str = "/sim";
const EPOCH_PATH: &str = ".tenure/epoch";
/// Epochs per durable reservation in the model: two, so that runs explore both an epoch
/// handed out within the confirmed reservation (no sync) and one that needs a new reservation.
const EPOCH_BATCH: u64 = 2;
const OWNER_PATH: &str = ".tenure/owner.json";
const MARKER_PATH: &str = ".tenure/identity.json";
const LOCK_PATH: &str = ".tenure/lock";
const WAITERS_PATH: &str = ".tenure/waiters";
const LEASES_PATH: &str = ".tenure/registry/leases";
/// The executable every process of the model runs.
const EXE: &str = "/model/tenure";

/// The lease model and its bounds.
#[derive(Debug, Clone)]
pub struct LeaseModel {
    /// Pid slots (contending processes at once).
    pub processes: usize,
    /// Restarts in all: a new run in a slot whose run crashed or exited, under the recycled pid.
    pub restarts: u8,
    /// Crashes (SIGKILL) the world may inflict in all.
    pub crashes: u8,
    /// External stop signals the world may send in all.
    pub signals: u8,
    /// Whether one third-party stopper runs.
    pub stopper: bool,
    /// Whether recovery may fail (a refused run that releases).
    pub recovery_failures: bool,
    /// Whether armed timers fire (only the drain's grace exists here: settling past it keeps
    /// the lease).
    pub timers: bool,
    /// Whether a plan runs up to its next lock operation, and a machine step's actions run,
    /// in one model step (see the module docs); `false` makes every visible operation and
    /// action a step of its own.
    pub atomic_steps: bool,
    /// Without `atomic_steps`: only the operations a crash in between matters for — renames,
    /// lock operations, ending or making a cgroup — end a model step (the tree world's grain:
    /// a crash between the owner record's rename and the end of the leftovers it names).
    pub coarse: bool,
    /// Power losses the world may inflict in all.
    pub power_losses: u8,
    /// Times an operator may restore an old epoch file (card P3).
    pub rewinds: u8,
    /// Times an operator may remove the lock file (`rm .tenure/lock`) while it is held, so that
    /// two processes own at once and only the epoch fence protects the checkpoint (card H5).
    pub lock_removals: u8,
    /// The bug to inject, if any.
    pub mutation: Option<Mutation>,
    /// `None`: in-process hosts. `Some`: runners with process-tree workloads (card T2).
    pub tree: Option<TreeWorld>,
}

/// How the runners of the tree world contain their workloads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Contain {
    /// A cgroup per ownership, named in the owner record.
    Cgroup,
    /// The workload inherits the lock descriptor.
    LockFd,
}

/// The tree world's parameters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TreeWorld {
    /// The containment.
    pub contain: Contain,
    /// Whether a descendant may close its copy of the lock descriptor (`LockFd` only).
    pub close_fd: bool,
}

impl LeaseModel {
    /// The configuration checked in CI for `processes` slots.
    pub fn ci(processes: usize) -> LeaseModel {
        LeaseModel {
            processes,
            restarts: 1,
            crashes: 1,
            signals: 1,
            stopper: true,
            recovery_failures: false,
            timers: false,
            atomic_steps: true,
            coarse: false,
            power_losses: 0,
            rewinds: 0,
            lock_removals: 0,
            mutation: None,
            tree: None,
        }
    }

    /// The tree world checked in CI (card T2): two runners, each workload a main process and a
    /// descendant that outlives the runner's crash; two crashes and a restart, so an owner, its
    /// successor and the successor's successor can each crash at any visible step; timers fire.
    pub fn tree_ci(contain: Contain) -> LeaseModel {
        LeaseModel {
            processes: 2,
            restarts: 1,
            crashes: 2,
            signals: 0,
            stopper: false,
            recovery_failures: false,
            timers: true,
            atomic_steps: false,
            coarse: true,
            power_losses: 0,
            rewinds: 0,
            lock_removals: 0,
            mutation: None,
            tree: Some(TreeWorld {
                contain,
                close_fd: false,
            }),
        }
    }

    /// The tree world at the coarser grain checked in CI: plans run to their next lock
    /// operation in one step, one crash (an owner whose descendant outlives it, and its
    /// successor's takeover).
    pub fn tree_small(contain: Contain) -> LeaseModel {
        LeaseModel {
            crashes: 1,
            atomic_steps: true,
            coarse: false,
            ..LeaseModel::tree_ci(contain)
        }
    }

    /// Card P3: an operator restores an old epoch file once, between runs that publish; the
    /// next epoch must still be above every epoch the dir records.
    pub fn rewind_ci() -> LeaseModel {
        LeaseModel {
            processes: 1,
            restarts: 2,
            crashes: 0,
            signals: 0,
            stopper: false,
            recovery_failures: false,
            timers: false,
            atomic_steps: true,
            coarse: false,
            power_losses: 0,
            rewinds: 1,
            lock_removals: 0,
            mutation: None,
            tree: None,
        }
    }

    /// Card H5: an operator removes the lock file of a live owner once, so that a second
    /// process takes a lock on a new file and owns too; only the epoch fence keeps the stale
    /// owner from publishing. (`at most one owner` is given up here on purpose.)
    pub fn lock_lost_ci() -> LeaseModel {
        LeaseModel {
            processes: 2,
            restarts: 0,
            crashes: 0,
            signals: 0,
            stopper: false,
            recovery_failures: false,
            timers: false,
            atomic_steps: true,
            coarse: false,
            power_losses: 0,
            rewinds: 0,
            lock_removals: 1,
            mutation: None,
            tree: None,
        }
    }

    /// Issue 11: runs one after another in one pid slot (restarts), and one power loss at any
    /// point — between any two visible operations, so also between the epoch's in-place write
    /// and its fdatasync — (every process gone, the files as any prefix of their unsynced
    /// changes left them, an unsynced in-place write old, new or torn): no epoch is handed out
    /// twice, and a successor after the power loss starts clean.
    pub fn power_ci() -> LeaseModel {
        LeaseModel {
            processes: 1,
            // Four runs: with two epochs per reservation, the third run's acquisition writes a
            // new reservation in place (the first replaces the file whole, the second writes
            // its scratch slot only), and a fourth run follows a power loss in the third.
            restarts: 3,
            crashes: 0,
            signals: 0,
            stopper: false,
            // A refused run publishes nothing: its epoch is recorded in the epoch file (and in
            // records never synced) only, which is what the epoch's durability is for.
            recovery_failures: true,
            timers: false,
            atomic_steps: false,
            coarse: false,
            power_losses: 1,
            rewinds: 0,
            lock_removals: 0,
            mutation: None,
            tree: None,
        }
    }

    /// The configuration that kills the `src/` mutant `name` (see the mutation table).
    pub fn for_src_mutant(name: &str) -> LeaseModel {
        match name {
            "lease-epoch-not-synced"
            | "lease-epoch-data-unsynced"
            | "lease-epoch-slot-unchecked"
            | "lease-owner-slot-unchecked"
            | "lease-epoch-session-unchecked"
            | "lease-marker-not-synced"
            | "lease-empty-record-refused" => LeaseModel::power_ci(),
            "lease-skip-leftovers" => LeaseModel::tree_small(Contain::Cgroup),
            "lease-leftovers-after-record" => LeaseModel {
                timers: false,
                ..LeaseModel::tree_ci(Contain::Cgroup)
            },
            "lease-epoch-file-only" => LeaseModel::rewind_ci(),
            _ => LeaseModel::ci(2),
        }
    }

    /// The same model with a bug injected.
    pub fn with_mutation(mut self, m: Option<Mutation>) -> LeaseModel {
        self.mutation = m;
        self
    }

    fn is(&self, m: Mutation) -> bool {
        self.mutation == Some(m)
    }

    fn config(&self) -> Config {
        match self.tree {
            None => Config::in_process(),
            Some(_) => Config::child(ReadyMode::Start),
        }
    }

    fn contain(&self) -> Option<Contain> {
        self.tree.map(|t| t.contain)
    }
}

/// Whether a slot's current incarnation runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Life {
    /// No incarnation was ever launched in this slot.
    Vacant,
    /// The incarnation runs.
    Running,
    /// The incarnation was killed (SIGKILL, or power loss); its files stay as they were.
    Crashed,
    /// The incarnation executed `Exit`.
    Exited,
}

/// A lease plan a process is running (the answer to its driver's outstanding request, or a
/// phase update).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Job {
    /// `tenure::lease::acquire`.
    Acquire(Box<Acquire>),
    /// `Lease::set_phase`, to this phase.
    SetPhase(Box<SetPhase>, PhaseKind),
    /// `Lease::release`.
    Release(Box<Release>),
}

impl Job {
    fn op(&self) -> Option<LeaseOp<'_>> {
        match self {
            Job::Acquire(p) => p.op(),
            Job::SetPhase(p, _) => p.op(),
            Job::Release(p) => p.op(),
        }
    }

    fn handle(&mut self, r: LeaseRes) {
        match self {
            Job::Acquire(p) => p.handle(r),
            Job::SetPhase(p, _) => p.handle(r),
            Job::Release(p) => p.handle(r),
        }
    }

    fn handles(&self) -> Vec<Fd> {
        match self {
            Job::Acquire(p) => p.handles(),
            Job::SetPhase(p, _) => p.handles(),
            Job::Release(p) => p.handles(),
        }
    }

    fn waits(&self) -> bool {
        matches!(self.op(), Some(LeaseOp::Wait))
    }

    fn holds_lock_mid_acquisition(&self) -> bool {
        matches!(self, Job::Acquire(p) if p.steps().is_locked())
    }
}

/// One pid slot.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Proc {
    /// The incarnation (start time) of the current or last process at this pid.
    pub start: u8,
    /// Whether the current incarnation runs.
    pub life: Life,
    /// Its driver and machine (frozen once it crashed or exited).
    pub drv: Driver,
    /// The plan it runs.
    pub job: Option<Shared<Job>>,
    /// The owner record of its lease, once granted.
    pub lease: Option<Shared<OwnerRecord>>,
    /// The lock file (by generation) this process holds the kernel lock on.
    pub lock: Option<u8>,
    /// The lock file (by generation) this process opened to acquire.
    pub lock_open: Option<u8>,
    /// Stop signals queued for delivery.
    pub queued: u8,
    /// Whether this incarnation took the lock or published.
    pub touched: bool,
    /// Whether this incarnation reported contention (it was a visible waiter).
    pub waited: bool,
    /// Whether the host requested the drain / reported residencies settled in this run.
    pub drain_fed: bool,
    /// See `drain_fed`.
    pub settle_fed: bool,
    /// The first terminal phase the machine reached in this incarnation (for I6).
    pub ended: Option<PhaseKind>,
    /// Whether this incarnation was launched after a power loss.
    pub after_power_loss: bool,
    /// Whether its acquisition failed (refused or an I/O error), not busy or cancelled.
    pub lease_failed: bool,
}

impl Proc {
    fn vacant(config: Config) -> Proc {
        Proc {
            start: 0,
            life: Life::Vacant,
            drv: Driver::new(config),
            job: None,
            lease: None,
            lock: None,
            lock_open: None,
            queued: 0,
            touched: false,
            waited: false,
            drain_fed: false,
            settle_fed: false,
            ended: None,
            after_power_loss: false,
            lease_failed: false,
        }
    }

    fn running(&self) -> bool {
        self.life == Life::Running
    }

    /// Whether this slot's current incarnation is `start` and alive.
    fn is_live(&self, start: u8) -> bool {
        self.running() && self.start == start
    }

    fn epoch(&self) -> Option<u8> {
        self.drv.machine().phase().epoch().map(|e| e as u8)
    }
}

/// The pid slots, indexed by pid. Each slot is shared between states until a step changes it
/// (a step changes one process, and its successor shares the others) and hashed once while it
/// is: indexing it mutably copies it first if another state shares it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Procs(Vec<Shared<Proc>>);

impl Procs {
    /// The slots, in pid order.
    pub fn iter(&self) -> impl Iterator<Item = &Proc> {
        self.0.iter().map(|p| &**p)
    }

    /// The slots, to change them (each copied first if shared).
    pub fn iter_mut(&mut self) -> impl Iterator<Item = &mut Proc> {
        self.0.iter_mut().map(Shared::make_mut)
    }

    /// Slot `pid`, if there is one.
    pub fn get(&self, pid: usize) -> Option<&Proc> {
        self.0.get(pid).map(|p| &**p)
    }

    /// How many slots there are.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl std::ops::Index<usize> for Procs {
    type Output = Proc;

    fn index(&self, pid: usize) -> &Proc {
        &self.0[pid]
    }
}

impl std::ops::IndexMut<usize> for Procs {
    fn index_mut(&mut self, pid: usize) -> &mut Proc {
        self.0[pid].make_mut()
    }
}

/// The identity of the process in slot `pid` at incarnation `start`.
fn identity(pid: usize, start: u8) -> Identity {
    Identity {
        pid: pid as u32,
        start_time: u64::from(start),
        exe: PathBuf::from(EXE),
        pidfs_ino: None,
    }
}

/// A workload's main process.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum MainW {
    /// Runs.
    Alive,
    /// Died of SIGKILL; its runner has not reaped it yet.
    Killed,
    /// Reaped, or died with its crashed runner (parent-death signal).
    Gone,
}

/// A workload's descendant.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DescW {
    /// None, or it ended.
    Gone,
    /// Runs; only SIGKILL ends it. `fd`: it still has its copy of the lock descriptor.
    Stays {
        /// It holds the lock descriptor's copy.
        fd: bool,
    },
    /// Runs; not even SIGKILL ends it.
    Unkillable {
        /// It holds the lock descriptor's copy.
        fd: bool,
    },
}

impl DescW {
    fn alive(self) -> bool {
        !matches!(self, DescW::Gone)
    }

    fn holds_fd(self) -> bool {
        matches!(
            self,
            DescW::Stays { fd: true } | DescW::Unkillable { fd: true }
        )
    }
}

/// A workload a runner started; it outlives the runner's crash.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Work {
    /// The ownership's epoch.
    pub epoch: u8,
    /// The runner's pid slot and incarnation.
    pub owner: u8,
    /// See `owner`.
    pub start: u8,
    /// The main process.
    pub main: MainW,
    /// The descendant.
    pub desc: DescW,
    /// Lock descriptor world: the workload's copies refer to the owner's open file description
    /// of this lock file, and it is still locked (an orderly release `LOCK_UN`s every copy).
    pub locked_ofd: Option<u8>,
}

impl Work {
    /// Whether any process of it runs.
    fn alive(&self) -> bool {
        self.main == MainW::Alive || self.desc.alive()
    }

    /// The lock file it keeps locked (its copies of a still-locked descriptor are open).
    fn holds_lock(&self) -> Option<u8> {
        self.locked_ofd
            .filter(|_| self.main == MainW::Alive || self.desc.holds_fd())
    }
}

/// The third-party stopper (`tenure stop`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Stopper {
    /// Not run yet.
    Idle,
    /// Read the record naming this identity.
    Read {
        /// Recorded pid slot.
        pid: u8,
        /// Recorded incarnation.
        start: u8,
    },
    /// Opened a pidfd on the pid (pinning the incarnation that had it then), re-read the
    /// identity through `/proc` and found it matching (or, in a mutant, did not compare).
    Verified {
        /// Recorded pid slot.
        pid: u8,
        /// Recorded incarnation.
        start: u8,
        /// The incarnation the pidfd pins.
        pinned: u8,
    },
    /// Finished.
    Done(StopEnd),
}

/// How the stopper ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum StopEnd {
    /// The signal was delivered.
    Delivered,
    /// The recorded process was gone.
    Dead,
    /// The pid belonged to another process: nothing was signalled.
    Mismatch,
}

/// The state of the lease world.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct LeaseState {
    /// Pid slots.
    pub procs: Procs,
    /// The state dir's files (shared between states until a step changes them, and hashed
    /// once while they are).
    pub fs: Shared<SimFs>,
    /// Whether this step changed the files (they are settled and renumbered then).
    pub fs_dirty: bool,
    /// How many files were created at `.tenure/lock` (the lock table's key for the current
    /// one; 0: none yet).
    pub lock_gen: u8,
    /// The epoch of the publisher of CURRENT (0: the checkpoint present before any run); the
    /// checkpoint store's manifests record it durably.
    pub current: u8,
    /// The stopper.
    pub stopper: Stopper,
    /// Restarts left.
    pub restarts_left: u8,
    /// Crashes left.
    pub crashes_left: u8,
    /// External signals left.
    pub signals_left: u8,
    /// Power losses left.
    pub power_left: u8,
    /// Epoch-file rewinds left.
    pub rewinds_left: u8,
    /// Lock-file removals left.
    pub lock_removals_left: u8,
    /// Boots so far (power losses): what a boot tag tells apart.
    pub boot: u8,
    /// The largest epoch ever granted, across crashes and power loss (history for I2).
    pub max_granted: u8,
    /// The root id the identity marker named when last seen (L7).
    pub marker: Option<Token>,
    /// The workloads runners started (tree world), by epoch.
    pub works: Vec<Work>,
    /// A runner crashed while its workload's descendant ran.
    pub crash_left_desc: bool,
    /// A workload was started after that.
    pub spawn_after_leftover: bool,
    /// Violations recorded by steps (bit set).
    pub violations: u16,
}

/// A step of the lease world.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LeaseAction {
    /// A new incarnation starts in this slot (a recycled pid after the first) and is fed `Start`.
    Launch(u8),
    /// The driver executes the next action of its step.
    Exec(u8),
    /// The process's plan runs its next operations (up to the next visible one).
    Step(u8),
    /// The wait sees the lock free and takes it.
    Wake(u8),
    /// The wait bound expires.
    Expire(u8),
    /// Recovery finishes (`true`: done, `false`: the checkpoint is refused).
    Recover(u8, bool),
    /// The fenced publish finishes.
    Publish(u8),
    /// A queued stop signal is delivered (to the driver, or to the wait as a cancellation).
    Deliver(u8),
    /// An armed timer fires.
    Timer(u8, Timer),
    /// The host asks to drain (idle exit).
    Drain(u8),
    /// SIGKILL.
    Crash(u8),
    /// An external SIGTERM arrives and is queued.
    Signal(u8),
    /// The stopper's next step.
    Stopper,
    /// `ReclaimStaleLock` only: the waiter recreates the lock file and locks it.
    Reclaim(u8),
    /// Tree world: the runner's child is spawned; its descendant stays (`false`) or is
    /// unkillable (`true`), or there is none (`None`).
    Spawn(u8, Option<bool>),
    /// Tree world: the runner sees its main process end (by itself, or of SIGKILL).
    MainExit(u8),
    /// Tree world: the runner sees the last process of its tree gone.
    TreeGone(u8),
    /// Tree world: the descendant of the workload of this epoch closes its lock copy.
    CloseFd(u8),
    /// Tree world: an operator SIGKILLs what a crashed runner of this epoch left running.
    KillLeftover(u8),
    /// Power loss, leaving the files in the outcome of this index.
    PowerLoss(u16),
    /// An operator restores an old epoch file (`1`).
    Rewind,
    /// An operator removes the lock file.
    RemoveLock,
}

/// Whether an operation ends a model step when every visible operation is a step of its own:
/// whatever another process or a crash can tell apart (entries, locks, processes; syncs only
/// while a power loss can still come, `syncs`: without one, nothing can tell a synced file
/// from an unsynced one).
fn visible(op: &LeaseOp<'_>, coarse: bool, syncs: bool) -> bool {
    match op {
        LeaseOp::File(step) => match step.op {
            // A rename and an overwrite in place both change what a named file holds.
            Op::Rename { .. } | Op::WriteAt { .. } => true,
            Op::Mkdir { .. }
            | Op::CreateNew { .. }
            | Op::Unlink { .. }
            | Op::Rmdir { .. }
            | Op::RemoveTree { .. } => !coarse,
            Op::Fsync { .. } | Op::SyncDir { .. } | Op::SyncFs { .. } => syncs,
            _ => false,
        },
        LeaseOp::TryLock
        | LeaseOp::Wait
        | LeaseOp::Unlock
        | LeaseOp::Kill(_)
        | LeaseOp::EndCgroup { .. }
        | LeaseOp::CreateCgroup { .. } => true,
        LeaseOp::OpenLock { .. } | LeaseOp::Contended(_) | LeaseOp::RemoveCgroup => !coarse,
        LeaseOp::Cancelled
        | LeaseOp::StillAtPath
        | LeaseOp::Liveness(_)
        | LeaseOp::PidLiveness { .. }
        | LeaseOp::AwaitGone(_)
        | LeaseOp::CheckpointEpoch => false,
    }
}

/// Whether an operation ends a model step when a plan runs up to its next lock operation.
fn lock_op(op: &LeaseOp<'_>) -> bool {
    matches!(op, LeaseOp::TryLock | LeaseOp::Wait | LeaseOp::Unlock)
}

/// The world's answers to one process's plan operations.
struct World<'s> {
    s: &'s mut LeaseState,
    m: &'s LeaseModel,
    p: usize,
}

impl Exec for World<'_> {
    fn execute(&mut self, op: LeaseOp<'_>) -> LeaseRes {
        let s = &mut *self.s;
        let p = self.p;
        match op {
            LeaseOp::File(step) => LeaseRes::File(s.fs_mut().run(step)),
            LeaseOp::Cancelled => LeaseRes::Flag(s.procs[p].queued > 0),
            LeaseOp::StillAtPath => LeaseRes::Flag(true),
            LeaseOp::OpenLock { dir } => {
                match s.fs_mut().run(Step::new(
                    "lease.lock",
                    Op::CreateNew {
                        dir,
                        name: OsStr::new(tenure::lease::LOCK_FILE),
                    },
                )) {
                    Ok(Done::Created { fd, .. }) => {
                        let _ = s.fs_mut().run(Step::new("lease.lock", Op::Close { fd }));
                        s.lock_gen += 1;
                    }
                    Ok(_) | Err(tenure::privfs::FsError::AlreadyExists { .. }) => {}
                    Err(e) => return LeaseRes::Failed(LeaseError::Fs(e)),
                }
                s.procs[p].lock_open = Some(s.lock_gen);
                LeaseRes::Done
            }
            LeaseOp::TryLock => {
                let Some(lf) = s.procs[p].lock_open else {
                    return LeaseRes::Failed(LeaseError::Replayed {
                        message: "the lock file is not open".into(),
                        refusal: false,
                    });
                };
                if s.lock_free(lf) {
                    s.take_lock(p, lf);
                    LeaseRes::Lock(LockTry::Locked)
                } else {
                    LeaseRes::Lock(LockTry::Busy { may_wait: true })
                }
            }
            // Waits are answered by world actions (`Wake`, `Expire`, `Deliver`).
            LeaseOp::Wait => unreachable!("a wait is answered by the world, not executed"),
            LeaseOp::Unlock => {
                s.unlock(p);
                LeaseRes::Done
            }
            // The runner's `on_wait` notes the contention; the driver feeds `lease-busy` once
            // the acquisition returns, before its outcome.
            LeaseOp::Contended(_) => {
                s.procs[p].waited = true;
                LeaseRes::Done
            }
            LeaseOp::Liveness(id) => LeaseRes::Live(s.liveness(id.pid, id.start_time)),
            LeaseOp::PidLiveness { pid, start } => LeaseRes::Live(s.liveness(pid, start)),
            // The model's plans never stop registered orphans (the runner's child is contained
            // by its cgroup or the inherited lock here).
            LeaseOp::Kill(_) => LeaseRes::Flag(false),
            LeaseOp::AwaitGone(_) => LeaseRes::Flag(true),
            LeaseOp::EndCgroup {
                rec,
                root_id,
                epoch,
            } => LeaseRes::Ended(s.end_cgroup(rec, root_id, epoch)),
            LeaseOp::CreateCgroup { name } => LeaseRes::Cgroup(match self.m.contain() {
                Some(Contain::Cgroup) => Ok(CgroupRecord {
                    path: PathBuf::from("/model/cgroup").join(name),
                    id: 1,
                }),
                Some(Contain::LockFd) | None => Err("no cgroup v2 hierarchy in this world".into()),
            }),
            LeaseOp::RemoveCgroup => LeaseRes::Done,
            LeaseOp::CheckpointEpoch => LeaseRes::Seen((s.current > 0).then(|| epoch::Seen {
                epoch: u64::from(s.current),
                path: PathBuf::from(DIR).join("checkpoints/manifests"),
            })),
        }
    }
}

/// The root id the marker file's `bytes` name (`None`: not a marker), as `record::parse_marker`
/// reads it. Every finished plan looks at the marker and it is written once per dir, so the
/// answer for the bytes seen last is remembered (per checker thread). No mutant changes
/// `parse_marker`; one that did would have to be part of what is remembered, as a thread that
/// runs several mutants' searches in turn keeps the memo.
fn marker_root_id(bytes: &[u8]) -> Option<Token> {
    thread_local! {
        static LAST: std::cell::RefCell<Option<(Vec<u8>, Option<Token>)>> =
            const { std::cell::RefCell::new(None) };
    }
    LAST.with_borrow_mut(|last| {
        if let Some((seen, id)) = last.as_ref()
            && seen.as_slice() == bytes
        {
            return *id;
        }
        let id = record::parse_marker(bytes).ok().map(|m| m.root_id);
        *last = Some((bytes.to_vec(), id));
        id
    })
}

/// The owner record `bytes` hold, as `record::decode_owner` reads it (`None`: none, or
/// unreadable). The stopper looks at it in most states and it changes only with a phase
/// change, so the answer for the bytes seen last is remembered (per checker thread), as
/// [`marker_root_id`] does. The one mutant that changes `decode_owner`
/// (`lease-owner-slot-unchecked`) is part of what is remembered: a thread runs several
/// mutants' searches in turn.
fn owner_in(bytes: &[u8]) -> Option<OwnerRecord> {
    /// The bytes read last, whether the mutant was on, and the record they held.
    type Seen = (Vec<u8>, bool, Option<OwnerRecord>);
    thread_local! {
        static LAST: std::cell::RefCell<Option<Seen>> = const { std::cell::RefCell::new(None) };
    }
    let unchecked = tenure::mutant::on("lease-owner-slot-unchecked");
    LAST.with_borrow_mut(|last| {
        if let Some((seen, mutant, r)) = last.as_ref()
            && *mutant == unchecked
            && seen.as_slice() == bytes
        {
            return r.clone();
        }
        let r = record::decode_owner(bytes).ok().flatten();
        *last = Some((bytes.to_vec(), unchecked, r.clone()));
        r
    })
}

impl LeaseState {
    fn holds_lock(&self, p: usize) -> bool {
        self.procs[p].lock.is_some()
    }

    fn lock_free(&self, lf: u8) -> bool {
        let runner = self.procs.iter().any(|q| q.running() && q.lock == Some(lf));
        let workload = self.works.iter().any(|w| w.holds_lock() == Some(lf));
        !runner && !workload
    }

    fn take_lock(&mut self, p: usize, lf: u8) {
        let proc = &mut self.procs[p];
        proc.lock = Some(lf);
        proc.touched = true;
    }

    /// `LOCK_UN` (and close): the lock is free, for every copy of the descriptor.
    fn unlock(&mut self, p: usize) {
        let (owner, start) = (p as u8, self.procs[p].start);
        for w in self
            .works
            .iter_mut()
            .filter(|w| w.owner == owner && w.start == start)
        {
            // An orderly release happens only once the workload is gone (card T1).
            if w.alive() {
                self.violations |= V_TREE;
            }
            w.locked_ofd = None;
        }
        self.procs[p].lock = None;
        self.procs[p].lock_open = None;
    }

    /// Whether the recorded process (pid slot, start time) runs.
    fn liveness(&self, pid: u32, start: u64) -> Liveness {
        match self.procs.get(pid as usize) {
            Some(q) if q.running() && u64::from(q.start) == start => Liveness::Live,
            Some(q) if q.running() => Liveness::Recycled,
            Some(_) | None => Liveness::Dead,
        }
    }

    /// Ends what the recorded cgroup holds (card T2): SIGKILL to every process of the workload
    /// of its epoch, if the cgroup at the recorded path still carries the dir's identity and
    /// the epoch (`tenure-<root id>-<epoch>`).
    fn end_cgroup(&mut self, rec: &CgroupRecord, root_id: Token, epoch: u64) -> EndedCgroup {
        let expected = cgroup_name(&root_id.to_string(), epoch);
        if rec.path.file_name().and_then(|n| n.to_str()) != Some(expected.as_str()) {
            return EndedCgroup::Gone;
        }
        let mut killed = Vec::new();
        let mut survivors = Vec::new();
        for w in self
            .works
            .iter_mut()
            .filter(|w| u64::from(w.epoch) == epoch)
        {
            if w.main == MainW::Alive {
                w.main = MainW::Killed;
                killed.push(u32::from(w.owner) + 100);
            }
            w.desc = match w.desc {
                DescW::Stays { .. } => {
                    killed.push(u32::from(w.owner) + 200);
                    DescW::Gone
                }
                DescW::Gone => DescW::Gone,
                d @ DescW::Unkillable { .. } => {
                    survivors.push(u32::from(w.owner) + 200);
                    d
                }
            };
        }
        self.tidy_works();
        if !survivors.is_empty() {
            EndedCgroup::Survived { pids: survivors }
        } else if killed.is_empty() {
            EndedCgroup::Gone
        } else {
            EndedCgroup::Ended { killed }
        }
    }

    /// Forgets workloads nothing of which runs and nobody waits on (fewer equal states).
    fn tidy_works(&mut self) {
        let procs = &self.procs;
        self.works.retain(|w| {
            w.alive()
                || w.main == MainW::Killed
                || procs[w.owner as usize].is_live(w.start)
                    && procs[w.owner as usize].drv.child() != ChildView::Reaped
        });
    }

    /// The workload of slot `p`'s current incarnation.
    fn work_of(&mut self, p: usize) -> Option<&mut Work> {
        let (owner, start) = (p as u8, self.procs[p].start);
        self.works
            .iter_mut()
            .find(|w| w.owner == owner && w.start == start)
    }

    fn feed(&mut self, p: usize, ev: Event) {
        let proc = &mut self.procs[p];
        match proc.drv.feed(ev) {
            Ok(_) => {
                if proc.ended.is_none() && proc.drv.machine().is_terminal() {
                    proc.ended = Some(proc.drv.machine().kind());
                }
            }
            Err(_) => self.violations |= V_ILLEGAL,
        }
    }

    /// The owner record as the files hold it (`None` if absent or unreadable).
    fn owner_record(&self) -> Option<OwnerRecord> {
        self.fs.read_with(OWNER_PATH, owner_in).flatten()
    }

    /// The epoch file as the files hold it (`None` if absent or unreadable).
    fn epoch_file(&self) -> Option<u64> {
        self.fs
            .read_with(EPOCH_PATH, |b| epoch::parse(b).ok())
            .flatten()
    }

    /// Card L7: the marker's root id never changes once seen (a power loss may take back a
    /// marker that was never made durable, and then a new one may come).
    fn observe_marker(&mut self) {
        let now = self.fs.read(MARKER_PATH).and_then(marker_root_id);
        match (self.marker, now) {
            (Some(old), Some(new)) if old != new => self.violations |= V_MARKER,
            (None, Some(new)) => self.marker = Some(new),
            _ => {}
        }
    }

    /// Runs the driver: the job (per the model's granularity), then the actions of the step.
    fn advance(&mut self, m: &LeaseModel, p: usize) {
        loop {
            if !self.procs[p].running() {
                return;
            }
            if let Some(job) = self.procs[p].job.as_deref() {
                // With atomic steps a phase update (no lock operation in it) runs with the
                // step that asked for it; acquisitions and releases run as their own steps.
                if !(m.atomic_steps && matches!(job, Job::SetPhase(..))) {
                    return;
                }
                self.run_job(m, p);
                if self.procs[p].job.is_some() {
                    return;
                }
                continue;
            }
            match self.procs[p].drv.peek() {
                None => return,
                Some(a) if !m.atomic_steps && !invisible(a) => return,
                Some(_) => self.exec(m, p),
            }
        }
    }

    /// Runs `p`'s plan: up to and including its next visible operation (or lock operation,
    /// with atomic steps); never past a wait.
    fn run_job(&mut self, m: &LeaseModel, p: usize) {
        let Some(job) = self.procs[p].job.take() else {
            return;
        };
        // The plan is taken out of the state once (copied if other states share it) and put
        // back when the step ends, not re-wrapped after every operation.
        let mut job = Shared::into_inner(job);
        loop {
            let Some(op) = job.op() else {
                self.finish_job(m, p, job);
                return;
            };
            if matches!(op, LeaseOp::Wait) {
                self.procs[p].job = Some(Shared::new(job));
                return;
            }
            let boundary = if m.atomic_steps {
                lock_op(&op)
            } else {
                visible(&op, m.coarse, self.power_left > 0)
            };
            let res = World { s: self, m, p }.execute(op);
            job.handle(res);
            if !self.procs[p].running() {
                // An executed operation ended the process (not in this world); drop the plan.
                return;
            }
            if job.op().is_none() {
                self.finish_job(m, p, job);
                return;
            }
            if boundary {
                // Closing handles changes nothing anyone can see: the closes a plan ends with
                // run with its last visible operation, so that its outcome is fed at once.
                while let Some(LeaseOp::File(Step {
                    op: Op::Close { .. },
                    ..
                })) = job.op()
                {
                    let res = World { s: self, m, p }.execute(job.op().expect("just seen"));
                    job.handle(res);
                }
                if job.op().is_none() {
                    self.finish_job(m, p, job);
                } else {
                    self.procs[p].job = Some(Shared::new(job));
                }
                return;
            }
        }
    }

    /// A plan finished: its output becomes the answer the driver feeds.
    fn finish_job(&mut self, m: &LeaseModel, p: usize, job: Job) {
        self.observe_marker();
        match job {
            Job::Acquire(mut plan) => {
                let out = plan.take();
                if self.procs[p].waited {
                    self.feed(p, Event::LeaseBusy);
                    // Its actions (notes) run before the outcome is fed.
                    while self.procs[p].drv.peek().is_some() && self.procs[p].running() {
                        self.exec(m, p);
                    }
                }
                self.acquired(p, out);
            }
            Job::SetPhase(mut plan, phase) => {
                if let (Some(Ok(())), Some(l)) = (plan.take(), self.procs[p].lease.as_mut()) {
                    l.make_mut().phase = phase;
                }
            }
            Job::Release(mut plan) => {
                let _ = plan.take();
                self.procs[p].lease = None;

                if !m.is(Mutation::ReleaseBeforePublish)
                    || self.procs[p].drv.request() == Some(Request::Release)
                {
                    self.feed(p, Event::LeaseReleased);
                }
            }
        }
    }

    /// An acquisition's outcome, fed as the driver feeds it.
    fn acquired(&mut self, p: usize, out: Option<Result<plan::Acquired, plan::Failure>>) {
        match out {
            Some(Ok(acq)) => {
                let epoch = acq.record.epoch as u8;
                // I2: the epoch is in the epoch file at the grant and above every epoch
                // ever granted (across crashes and power loss).
                if epoch <= self.max_granted || self.epoch_file() != Some(u64::from(epoch)) {
                    self.violations |= V_EPOCH;
                }
                self.max_granted = self.max_granted.max(epoch);
                self.procs[p].lease = Some(Shared::new(acq.record));

                self.feed(
                    p,
                    Event::LeaseGranted {
                        epoch: u64::from(epoch),
                    },
                );
            }
            Some(Err(f)) => match f.error() {
                LeaseError::Busy { .. } => self.feed(p, Event::WaitExpired),
                LeaseError::Cancelled { .. } => {
                    // The signal that cancelled the wait is read by the driver's loop and
                    // fed as a stop.
                    let proc = &mut self.procs[p];
                    proc.queued = proc.queued.saturating_sub(1);
                    self.feed(p, Event::Stop(Signal::Term));
                }
                _ => {
                    let fault = if f.is_refusal() {
                        Fault::State
                    } else {
                        Fault::Io
                    };
                    self.procs[p].lease_failed = true;
                    self.feed(p, Event::LeaseFailed(fault));
                }
            },
            None => {}
        }
    }

    /// The plan input of slot `p`: its identity, and tokens drawn from its pid, incarnation
    /// and boot (what the runner draws from the clock and the random source).
    fn input(&self, m: &LeaseModel, p: usize) -> AcquireInput {
        let start = self.procs[p].start;
        AcquireInput {
            path: PathBuf::from(DIR),
            me: identity(p, start),
            now: 0,
            token: Token([
                p as u8, start, self.boot, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
            ]),
            fresh_root: Token([
                p as u8, start, self.boot, 2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
            ]),
            phase: PhaseKind::Recovering,
            cgroup: m.contain() == Some(Contain::Cgroup),
            fence: None,
            // A power loss ends the boot: the session the epoch file's scratch slot is trusted
            // in (issue 11).
            session: epoch::Session {
                boot: [self.boot; 16],
                mount: 0,
            },
            epoch_batch: EPOCH_BATCH,
        }
    }

    fn exec(&mut self, m: &LeaseModel, p: usize) {
        let Some(a) = self.procs[p].drv.pop() else {
            return;
        };
        match a {
            Action::AcquireLease => {
                let plan = Acquire::new(AcquireSteps::new(self.input(m, p)));
                self.procs[p].job = Some(Shared::new(Job::Acquire(Box::new(plan))));
            }
            // `lease::acquire` returned `Cancelled` and removed its waiter entry itself.
            Action::AbandonAcquire => {}
            Action::SetPhase(k) => {
                if !self.holds_lock(p) {
                    self.violations |= V_FENCE;
                }
                if let Some(l) = &self.procs[p].lease {
                    let mut next = (**l).clone();
                    next.phase = k;
                    if m.contain() == Some(Contain::LockFd) && self.work_of(p).is_some() {
                        // `Lease::share_lock` says so from the next rewrite on.
                        next.containment = Some(Containment::LockFd);
                    }
                    let plan = SetPhase::new(SetPhaseSteps::new(&next));
                    self.procs[p].job = Some(Shared::new(Job::SetPhase(Box::new(plan), k)));
                }
            }
            Action::ReleaseLease => self.start_release(p),
            // SIGKILL to every process of the workload (card T1).
            Action::Kill => {
                if let Some(w) = self.work_of(p) {
                    if w.main == MainW::Alive {
                        w.main = MainW::Killed;
                    }
                    if let DescW::Stays { .. } = w.desc {
                        w.desc = DescW::Gone;
                    }
                }
            }
            Action::Publish if m.is(Mutation::ReleaseBeforePublish) => {
                // The bug: the lease is released (to the end) before the publish runs.
                self.start_release(p);
                while self.procs[p].job.is_some() {
                    self.run_job(m, p);
                }
            }
            Action::Exit(o) => {
                if m.is(Mutation::RetryAfterExit) && o.reason == Reason::Busy {
                    self.procs[p].drv.restart_machine();
                    self.feed(p, Event::Start);
                } else {
                    self.close_handles(p);
                    let proc = &mut self.procs[p];
                    proc.life = Life::Exited;
                    proc.lock = None;
                    proc.lock_open = None;
                    proc.job = None;
                }
            }
            Action::Recover
            | Action::SpawnChild
            | Action::ArmTimer(..)
            | Action::DisarmTimer(_)
            | Action::NotifyReady
            | Action::NotifyStopping
            | Action::BeginDrain
            | Action::Forward(..)
            | Action::Relay(..)
            | Action::ExtendTimer(..)
            | Action::Publish
            | Action::Note(_) => {}
        }
    }

    /// `Lease::release` (the plan), by the lock holder only (I3).
    fn start_release(&mut self, p: usize) {
        if !self.holds_lock(p) {
            self.violations |= V_FENCE;
        }
        if let Some(l) = &self.procs[p].lease {
            let mut next = (**l).clone();
            next.phase = PhaseKind::Released;
            let plan = Release::new(ReleaseSteps::new(&next));
            self.procs[p].job = Some(Shared::new(Job::Release(Box::new(plan))));
        } else {
            self.feed(p, Event::LeaseReleased);
        }
    }

    /// Closes the handles `p`'s plan holds (its process ended).
    fn close_handles(&mut self, p: usize) {
        if let Some(job) = &self.procs[p].job {
            for fd in job.handles() {
                let _ = self.fs_mut().run(Step::new("crash", Op::Close { fd }));
            }
        }
    }

    /// Whether a queued signal can be delivered to the driver now: between steps, no plan
    /// running, not while spawning.
    fn interruptible(&self, p: usize) -> bool {
        let proc = &self.procs[p];
        proc.job.is_none()
            && proc.drv.between_steps()
            && proc.drv.peek().is_none()
            && proc.drv.request() != Some(Request::Spawn)
    }
}

/// Actions whose execution changes nothing another process or a property can see.
fn invisible(a: Action) -> bool {
    !matches!(
        a,
        Action::AbandonAcquire
            | Action::SetPhase(_)
            | Action::Exit(_)
            | Action::AcquireLease
            | Action::ReleaseLease
    )
}

impl Model for LeaseModel {
    type State = LeaseState;
    type Action = LeaseAction;

    fn init_states(&self) -> Vec<LeaseState> {
        vec![LeaseState {
            procs: Procs(vec![
                Shared::new(Proc::vacant(self.config()));
                self.processes
            ]),
            fs: Shared::new(SimFs::new()),
            fs_dirty: false,
            lock_gen: 0,
            current: 0,
            stopper: if self.stopper {
                Stopper::Idle
            } else {
                Stopper::Done(StopEnd::Dead)
            },
            restarts_left: self.restarts,
            crashes_left: self.crashes,
            signals_left: self.signals,
            power_left: self.power_losses,
            rewinds_left: self.rewinds,
            lock_removals_left: self.lock_removals,
            boot: 0,
            max_granted: 0,
            marker: None,
            works: Vec::new(),
            crash_left_desc: false,
            spawn_after_leftover: false,
            violations: 0,
        }]
    }

    fn actions(&self, s: &LeaseState, out: &mut Vec<LeaseAction>) {
        for (i, proc) in s.procs.iter().enumerate() {
            let p = i as u8;
            if !proc.running() {
                if proc.life == Life::Vacant || s.restarts_left > 0 {
                    out.push(LeaseAction::Launch(p));
                }
                continue;
            }
            if s.crashes_left > 0 {
                out.push(LeaseAction::Crash(p));
            }
            if s.signals_left > 0 && proc.queued == 0 {
                out.push(LeaseAction::Signal(p));
            }
            if let Some(job) = &proc.job {
                if job.waits() {
                    if proc.lock_open.is_some_and(|g| s.lock_free(g)) {
                        out.push(LeaseAction::Wake(p));
                    }
                    out.push(LeaseAction::Expire(p));
                    if proc.queued > 0 {
                        out.push(LeaseAction::Deliver(p));
                    }
                    if self.is(Mutation::ReclaimStaleLock)
                        && s.lock_gen < 2
                        && s.owner_record().is_some_and(|r| {
                            r.phase != PhaseKind::Released
                                && s.liveness(r.identity.pid, r.identity.start_time)
                                    != Liveness::Live
                        })
                    {
                        out.push(LeaseAction::Reclaim(p));
                    }
                } else {
                    out.push(LeaseAction::Step(p));
                    if self.is(Mutation::CancelAfterLock)
                        && proc.queued > 0
                        && job.holds_lock_mid_acquisition()
                    {
                        out.push(LeaseAction::Deliver(p));
                    }
                }
                continue;
            }
            if proc.drv.peek().is_some() {
                out.push(LeaseAction::Exec(p));
                continue;
            }
            if !proc.drv.between_steps() {
                continue;
            }
            match proc.drv.request() {
                Some(Request::Recover) => {
                    out.push(LeaseAction::Recover(p, true));
                    if self.recovery_failures {
                        out.push(LeaseAction::Recover(p, false));
                    }
                }
                Some(Request::Publish) => out.push(LeaseAction::Publish(p)),
                Some(Request::Spawn) => {
                    for desc in [None, Some(false), Some(true)] {
                        out.push(LeaseAction::Spawn(p, desc));
                    }
                }
                Some(Request::Acquire { .. } | Request::Release) | None => {}
            }
            // The runner sees its workload between steps.
            if self.tree.is_some() && proc.drv.request() != Some(Request::Spawn) {
                let mine = s
                    .works
                    .iter()
                    .find(|w| w.owner == p && w.start == proc.start);
                match (proc.drv.child(), mine) {
                    (ChildView::Running, Some(w))
                        if matches!(w.main, MainW::Alive | MainW::Killed) =>
                    {
                        out.push(LeaseAction::MainExit(p));
                    }
                    (ChildView::Tree, Some(w)) if !w.alive() => {
                        out.push(LeaseAction::TreeGone(p));
                    }
                    _ => {}
                }
            }
            if proc.queued > 0 && s.interruptible(i) {
                out.push(LeaseAction::Deliver(p));
            }
            if self.timers {
                for t in proc.drv.armed_timers() {
                    out.push(LeaseAction::Timer(p, t));
                }
            }
            if !proc.drain_fed && proc.drv.machine().kind() == PhaseKind::Ready {
                out.push(LeaseAction::Drain(p));
            }
        }
        if self.tree.is_some_and(|t| t.close_fd) {
            for w in &s.works {
                if w.desc.holds_fd() {
                    out.push(LeaseAction::CloseFd(w.epoch));
                }
            }
        }
        if self.tree.is_some() {
            for w in &s.works {
                let orphaned = s.procs[w.owner as usize].life == Life::Crashed
                    && s.procs[w.owner as usize].start == w.start;
                if orphaned && matches!(w.desc, DescW::Stays { .. }) {
                    out.push(LeaseAction::KillLeftover(w.epoch));
                }
            }
        }
        if self.stopper_can_step(s) {
            out.push(LeaseAction::Stopper);
        }
        if s.power_left > 0 {
            for k in 0..s.fs.power_loss(Reorder::Prefix).len() {
                out.push(LeaseAction::PowerLoss(k as u16));
            }
        }
        if s.rewinds_left > 0 && s.epoch_file().is_some_and(|e| e > 1) && s.idle() {
            out.push(LeaseAction::Rewind);
        }
        if s.lock_removals_left > 0
            && s.procs.iter().any(|q| q.running() && q.lock.is_some())
            && s.fs.read(LOCK_PATH).is_some()
        {
            out.push(LeaseAction::RemoveLock);
        }
    }

    fn next_state(&self, s: &LeaseState, action: LeaseAction) -> Option<LeaseState> {
        let mut s = s.clone();
        let p = match action {
            LeaseAction::Stopper => {
                self.stopper_step(&mut s);
                return Some(s);
            }
            LeaseAction::KillLeftover(epoch) => {
                for w in s.works.iter_mut().filter(|w| w.epoch == epoch) {
                    if let DescW::Stays { .. } = w.desc {
                        w.desc = DescW::Gone;
                    }
                }
                s.tidy_works();
                return Some(s);
            }
            LeaseAction::CloseFd(epoch) => {
                for w in s.works.iter_mut().filter(|w| w.epoch == epoch) {
                    w.desc = match w.desc {
                        DescW::Stays { .. } => DescW::Stays { fd: false },
                        DescW::Unkillable { .. } => DescW::Unkillable { fd: false },
                        DescW::Gone => DescW::Gone,
                    };
                }
                return Some(s);
            }
            LeaseAction::PowerLoss(k) => {
                let mut outcomes = s.fs.power_loss(Reorder::Prefix);
                if usize::from(k) >= outcomes.len() {
                    return None;
                }
                s.fs = Shared::new(outcomes.swap_remove(usize::from(k)));
                s.fs_dirty = true;
                s.power_left -= 1;
                s.boot += 1;
                for proc in s.procs.iter_mut() {
                    if proc.running() {
                        proc.life = Life::Crashed;
                    }
                    proc.lock = None;
                    proc.lock_open = None;
                    proc.job = None;
                    proc.lease = None;
                }
                // Every process is gone, the workloads' too (the cgroups with them).
                s.works.clear();
                if let Stopper::Idle | Stopper::Read { .. } | Stopper::Verified { .. } = s.stopper {
                    s.stopper = Stopper::Done(StopEnd::Dead);
                }
                // What survived of the lock file is a file nobody holds.
                s.lock_gen = s.lock_gen.saturating_add(1);
                s.marker = None;
                s.observe_marker();
                s.settle_fs();
                return Some(s);
            }
            LeaseAction::Rewind => {
                s.rewinds_left -= 1;
                s.fs_mut().put_file(EPOCH_PATH, &epoch::encode(1, None));
                s.settle_fs();
                return Some(s);
            }
            LeaseAction::RemoveLock => {
                s.lock_removals_left -= 1;
                s.fs_mut().remove(LOCK_PATH);
                s.settle_fs();
                return Some(s);
            }
            LeaseAction::Launch(p)
            | LeaseAction::Exec(p)
            | LeaseAction::Step(p)
            | LeaseAction::Wake(p)
            | LeaseAction::Expire(p)
            | LeaseAction::Recover(p, _)
            | LeaseAction::Publish(p)
            | LeaseAction::Deliver(p)
            | LeaseAction::Timer(p, _)
            | LeaseAction::Drain(p)
            | LeaseAction::Crash(p)
            | LeaseAction::Signal(p)
            | LeaseAction::Reclaim(p)
            | LeaseAction::Spawn(p, _)
            | LeaseAction::MainExit(p)
            | LeaseAction::TreeGone(p) => p as usize,
        };
        match action {
            LeaseAction::Launch(_) => {
                let boot = s.boot;
                let proc = &mut s.procs[p];
                let start = if proc.life == Life::Vacant {
                    0
                } else {
                    s.restarts_left -= 1;
                    proc.start + 1
                };
                *proc = Proc::vacant(self.config());
                proc.start = start;
                proc.life = Life::Running;
                proc.after_power_loss = boot > 0;
                s.feed(p, Event::Start);
            }
            LeaseAction::Exec(_) => s.exec(self, p),
            LeaseAction::Step(_) => s.run_job(self, p),
            LeaseAction::Wake(_) => {
                let lf = s.procs[p].lock_open?;
                s.take_lock(p, lf);
                s.answer_wait(self, p, WaitEnd::Acquired);
            }
            LeaseAction::Expire(_) => s.answer_wait(self, p, WaitEnd::Expired),
            LeaseAction::Reclaim(_) => {
                // The stale-lock "repair": a fresh lock file nobody holds, locked at once.
                s.fs_mut().remove(LOCK_PATH);
                s.fs_mut().put_file(LOCK_PATH, b"");
                s.lock_gen += 1;
                let lf = s.lock_gen;
                s.procs[p].lock_open = Some(lf);
                s.take_lock(p, lf);
                s.answer_wait(self, p, WaitEnd::Acquired);
            }
            LeaseAction::Deliver(_) => {
                let waits = s.procs[p].job.as_deref().is_some_and(Job::waits);
                if waits {
                    // The cancel descriptor became readable: the wait ends; the plan removes
                    // its waiter entry and the driver then reads the signal.
                    s.answer_wait(self, p, WaitEnd::Cancelled);
                } else if self.is(Mutation::CancelAfterLock) && s.procs[p].job.is_some() {
                    // The bug: the acquisition is abandoned under the lock, its record written.
                    s.close_handles(p);
                    s.procs[p].job = None;
                    s.procs[p].queued -= 1;
                    s.feed(p, Event::Stop(Signal::Term));
                } else {
                    s.procs[p].queued -= 1;
                    s.feed(p, Event::Stop(Signal::Term));
                }
            }
            LeaseAction::Recover(_, ok) => {
                let ev = if ok {
                    Event::RecoveryDone
                } else {
                    Event::RecoveryFailed(Fault::State)
                };
                s.feed(p, ev);
            }
            LeaseAction::Spawn(_, desc) => {
                let epoch = s.procs[p].epoch().unwrap_or(0);
                let lock_fd = self.contain() == Some(Contain::LockFd);
                let lf = s.procs[p].lock;
                s.works.push(Work {
                    epoch,
                    owner: p as u8,
                    start: s.procs[p].start,
                    main: MainW::Alive,
                    desc: match desc {
                        None => DescW::Gone,
                        Some(false) => DescW::Stays { fd: lock_fd },
                        Some(true) => DescW::Unkillable { fd: lock_fd },
                    },
                    locked_ofd: if lock_fd { lf } else { None },
                });
                s.works.sort();
                s.spawn_after_leftover |= s.crash_left_desc;
                s.feed(p, Event::ChildSpawned);
            }
            LeaseAction::MainExit(_) => {
                let w = s.work_of(p)?;
                let status = match w.main {
                    MainW::Killed => ChildStatus::Signaled(9),
                    MainW::Alive | MainW::Gone => ChildStatus::Exited(0),
                };
                w.main = MainW::Gone;
                let rest = w.desc.alive();
                s.feed(
                    p,
                    if rest {
                        Event::MainExited(status)
                    } else {
                        Event::ChildExited(status)
                    },
                );
                s.tidy_works();
            }
            LeaseAction::TreeGone(_) => {
                s.feed(p, Event::TreeEmpty);
                s.tidy_works();
            }
            LeaseAction::Publish(_) => {
                let mine = u64::from(s.procs[p].epoch().unwrap_or(0));
                // The store's fence: the real one, over the epoch file the store reads.
                let persisted = s.epoch_file().unwrap_or(0);
                if epoch::fence(mine, persisted).is_ok() {
                    if !s.holds_lock(p) || mine != u64::from(s.max_granted) {
                        s.violations |= V_FENCE;
                    }
                    s.current = mine as u8;
                    s.procs[p].touched = true;
                    s.feed(p, Event::CheckpointPublished);
                } else {
                    s.feed(p, Event::CheckpointFailed);
                }
            }
            LeaseAction::Timer(_, t) => s.feed(p, Event::TimerExpired(t)),
            LeaseAction::Drain(_) => {
                s.procs[p].drain_fed = true;
                s.feed(p, Event::DrainRequested);
            }
            LeaseAction::Crash(_) => {
                s.crashes_left -= 1;
                s.close_handles(p);
                let proc = &mut s.procs[p];
                proc.life = Life::Crashed;
                // The kernel drops the lock of a dead process; its files stay.
                proc.lock = None;
                proc.lock_open = None;
                proc.job = None;
                // Its main process dies of the parent-death signal; the descendant lives on.
                if let Some(w) = s.work_of(p) {
                    w.main = MainW::Gone;
                    if w.desc.alive() {
                        s.crash_left_desc = true;
                    }
                }
                s.tidy_works();
            }
            LeaseAction::Signal(_) => {
                s.signals_left -= 1;
                s.procs[p].queued += 1;
            }
            // Not a process step: these returned above.
            LeaseAction::Stopper
            | LeaseAction::CloseFd(_)
            | LeaseAction::KillLeftover(_)
            | LeaseAction::PowerLoss(_)
            | LeaseAction::Rewind
            | LeaseAction::RemoveLock => {}
        }
        s.advance(self, p);
        // No residency is ever active here, so the host reports them settled as soon as the
        // drain waits for them.
        let proc = &s.procs[p];
        if proc.running()
            && (!proc.settle_fed || self.is(Mutation::SettleTwice))
            && proc.drv.admits(Event::ResidenciesSettled).is_ok()
        {
            s.procs[p].settle_fed = true;
            s.feed(p, Event::ResidenciesSettled);
            s.advance(self, p);
        }
        s.settle_fs();
        Some(s)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        let mut v = self.lease_properties();
        // A world without the stopper, or without external signals, does not owe the examples
        // that need them.
        if !self.stopper {
            v.retain(|p| !matches!(p.name, "recycled pid spared" | "stopper delivers"));
        }
        if self.signals == 0 {
            v.retain(|p| p.name != "cancelled waiter");
        }
        if self.processes == 1 {
            v.retain(|p| !matches!(p.name, "handover" | "waiter gives up"));
        }
        if self.crashes == 0 && self.lock_removals == 0 {
            v.retain(|p| p.name != "crash takeover");
        }
        if self.lock_removals > 0 {
            // Two owners at once is what the removed lock file does; the fence is the point.
            v.retain(|p| p.name != AT_MOST_ONE_OWNER && p.name != "handover");
            v.push(Property::sometimes(
                "a stale owner's publish is fenced",
                |_, s: &LeaseState| {
                    s.procs.iter().any(|p| {
                        p.running()
                            && p.lock.is_some()
                            && p.epoch().is_some_and(|e| e < s.max_granted)
                            && p.drv.machine().kind() == PhaseKind::Released
                    }) || s.procs.iter().any(|p| {
                        p.drv
                            .machine()
                            .phase()
                            .outcome()
                            .is_some_and(|o| o.reason == Reason::PublishFailed)
                    })
                },
            ));
        }
        if self.power_losses > 0 {
            v.push(Property::always(
                CLEAN_AFTER_POWER_LOSS,
                |_, s: &LeaseState| {
                    s.procs
                        .iter()
                        .all(|p| !(p.after_power_loss && p.lease_failed))
                },
            ));
            v.push(Property::sometimes(
                "an owner after a power loss",
                |_, s: &LeaseState| {
                    s.procs
                        .iter()
                        .any(|p| p.after_power_loss && p.running() && p.drv.machine().kind().owns())
                },
            ));
            v.push(Property::sometimes(
                "a power loss after a grant",
                |_, s: &LeaseState| s.boot > 0 && s.max_granted >= 1,
            ));
        }
        if self.rewinds > 0 {
            v.push(Property::sometimes(
                "an owner after a rewound epoch file",
                |_, s: &LeaseState| {
                    s.rewinds_left == 0
                        && s.procs
                            .iter()
                            .any(|p| p.running() && p.drv.machine().kind().owns())
                },
            ));
        }
        if self.tree.is_none() {
            return v;
        }
        // The tree world has no stopper, no external signal and no in-process residencies: the
        // `sometimes` that need them are not its business.
        v.retain(|p| {
            p.expectation == stateright::Expectation::Always
                || matches!(p.name, "handover" | "crash takeover")
        });
        v.extend([
            // I7 (card T2): never two workloads' processes alive under different epochs.
            Property::always(NO_OVERLAP, |_, s: &LeaseState| {
                let mut live = s.works.iter().filter(|w| w.alive()).map(|w| w.epoch);
                match live.next() {
                    None => true,
                    Some(e) => live.all(|x| x == e),
                }
            }),
            // I7 (card T1): no orderly release while the releaser's workload runs.
            Property::always(RELEASE_AFTER_TREE, |_, s: &LeaseState| {
                s.violations & V_TREE == 0
            }),
            Property::sometimes(
                "a crashed owner's descendant outlives it",
                |_, s: &LeaseState| {
                    s.works.iter().any(|w| {
                        w.desc.alive()
                            && s.procs[w.owner as usize].life == Life::Crashed
                            && s.procs[w.owner as usize].start == w.start
                    })
                },
            ),
            Property::sometimes(
                "a successor's workload starts after a crashed owner's descendant",
                |_, s: &LeaseState| s.spawn_after_leftover,
            ),
            Property::sometimes("a tree is stopped, then released", |_, s: &LeaseState| {
                s.procs.iter().any(|p| {
                    p.life == Life::Exited
                        && p.ended == Some(PhaseKind::Released)
                        && p.drv
                            .machine()
                            .phase()
                            .outcome()
                            .is_some_and(|o| o.reason == Reason::Killed)
                })
            }),
        ]);
        v
    }

    fn format_action(&self, a: &LeaseAction) -> String {
        format!("{a:?}")
    }
}

impl LeaseState {
    /// Answers `p`'s wait, then lets its plan run on.
    fn answer_wait(&mut self, m: &LeaseModel, p: usize, end: WaitEnd) {
        if let Some(job) = self.procs[p].job.as_mut() {
            job.make_mut().handle(LeaseRes::Waited(end));
        }
        if m.atomic_steps || end == WaitEnd::Cancelled {
            self.run_job(m, p);
        }
    }

    /// Once no power loss can come any more, what is unsynced can no longer be lost: the files
    /// are committed (as `syncfs` would), so that states differ only in what a process or a
    /// crash can still tell apart. Then the inodes are numbered canonically.
    fn settle_fs(&mut self) {
        if !std::mem::take(&mut self.fs_dirty) {
            return;
        }
        let fs = self.fs.make_mut();
        if self.power_left == 0 {
            let _ = fs.run(Step::new("model", Op::SyncFs { dir: Fd::ROOT }));
        }
        fs.normalize();
    }

    /// The files, to change them.
    fn fs_mut(&mut self) -> &mut SimFs {
        self.fs_dirty = true;
        self.fs.make_mut()
    }

    /// Whether no process runs a plan (an operator's hands are off a busy dir).
    fn idle(&self) -> bool {
        self.procs.iter().all(|p| p.job.is_none())
    }
}

impl LeaseModel {
    /// The properties of the lease itself (I1–I6), with a `sometimes` beside each.
    fn lease_properties(&self) -> Vec<Property<Self>> {
        vec![
            // I1: ownership is the kernel lock; two machines in owning phases at once is the bug.
            Property::always(AT_MOST_ONE_OWNER, |_, s: &LeaseState| {
                s.procs
                    .iter()
                    .filter(|p| p.running() && p.drv.machine().kind().owns())
                    .count()
                    <= 1
            }),
            // Beside I1: an orderly handover to a second owner happens.
            Property::sometimes("handover", |_, s: &LeaseState| {
                s.procs
                    .iter()
                    .any(|p| p.drv.machine().kind() == PhaseKind::Released)
                    && s.procs
                        .iter()
                        .any(|p| p.running() && p.drv.machine().kind().owns())
            }),
            // I2: checked at every grant (in the epoch file, above every earlier grant).
            Property::always(EPOCHS_INCREASE, |_, s: &LeaseState| {
                s.violations & V_EPOCH == 0
            }),
            // Beside I2: a crashed owner is taken over by a later epoch.
            Property::sometimes("crash takeover", |_, s: &LeaseState| {
                s.procs.iter().any(|c| {
                    c.life == Life::Crashed
                        && c.drv.machine().kind().owns()
                        && s.procs.iter().any(|p| {
                            p.running() && p.drv.machine().kind().owns() && p.epoch() > c.epoch()
                        })
                })
            }),
            // I3: record rewrites, publishes and releases only by a lock holder; a publish that
            // takes effect names the newest epoch granted.
            Property::always(FENCED_WRITES, |_, s: &LeaseState| {
                s.violations & V_FENCE == 0
            }),
            // Beside I3: a later owner's publish moves CURRENT.
            Property::sometimes("a later owner publishes", |_, s: &LeaseState| {
                s.current >= 2
            }),
            // I4: the stopper never signals an identity other than the recorded one.
            Property::always(IDENTITY_CHECKED, |_, s: &LeaseState| {
                s.violations & V_SIGNAL == 0
            }),
            // Beside I4: the check spares a recycled pid, and a matching owner is signalled.
            Property::sometimes("recycled pid spared", |_, s: &LeaseState| {
                s.stopper == Stopper::Done(StopEnd::Mismatch)
            }),
            Property::sometimes("stopper delivers", |_, s: &LeaseState| {
                s.stopper == Stopper::Done(StopEnd::Delivered)
            }),
            // I5: a cancelled run (signal or busy) leaves nothing behind.
            Property::always(CANCEL_LEAVES_NOTHING, |_, s: &LeaseState| {
                s.procs.iter().enumerate().all(|(i, p)| {
                    p.drv.machine().kind() != PhaseKind::Cancelled || leaves_nothing(s, i)
                })
            }),
            // Beside I5: a visible waiter is cancelled by a signal; another gives up (busy).
            Property::sometimes("cancelled waiter", |_, s: &LeaseState| {
                s.procs.iter().any(|p| {
                    p.waited
                        && p.drv
                            .machine()
                            .phase()
                            .outcome()
                            .is_some_and(|o| o.reason == Reason::Cancelled)
                })
            }),
            Property::sometimes("waiter gives up", |_, s: &LeaseState| {
                s.procs.iter().any(|p| {
                    p.drv
                        .machine()
                        .phase()
                        .outcome()
                        .is_some_and(|o| o.reason == Reason::Busy)
                })
            }),
            // I6: once terminal, the machine stays in that phase.
            Property::always(TERMINAL_IS_FINAL, |_, s: &LeaseState| {
                s.procs
                    .iter()
                    .all(|p| p.ended.is_none_or(|k| k == p.drv.machine().kind()))
            }),
            Property::sometimes("a run ends released", |_, s: &LeaseState| {
                s.procs
                    .iter()
                    .any(|p| p.life == Life::Exited && p.ended == Some(PhaseKind::Released))
            }),
            // The driver feeds only events its semantics allow and the machine accepts.
            Property::always(LEGAL_EVENTS, |_, s: &LeaseState| {
                s.violations & V_ILLEGAL == 0
            }),
            Property::sometimes("settled drain publishes", |_, s: &LeaseState| {
                s.procs.iter().any(|p| p.settle_fed && p.touched) && s.current >= 1
            }),
            // Card L7: the marker is written once; its root id never changes.
            Property::always(MARKER_WRITTEN_ONCE, |_, s: &LeaseState| {
                s.violations & V_MARKER == 0
            }),
            Property::sometimes("a second owner finds the marker", |_, s: &LeaseState| {
                s.marker.is_some() && s.max_granted >= 2
            }),
        ]
    }
}

/// I5 for slot `i`: it never held the lock or changed shared state, and once its run exited
/// (the machine's `AbandonAcquire` and `Exit` executed) no waiter entry, owner record or
/// registry entry names it — as the files say.
fn leaves_nothing(s: &LeaseState, i: usize) -> bool {
    let p = &s.procs[i];
    let untouched = !p.touched && p.lock.is_none();
    if !untouched {
        return false;
    }
    if p.life != Life::Exited {
        return true;
    }
    let me = identity(i, p.start);
    let names_me = |id: &Identity| id.pid == me.pid && id.start_time == me.start_time;
    let waiter =
        s.fs.names(WAITERS_PATH)
            .iter()
            .any(|n| *n == plan::waiter_name(&me))
            || s.fs.names(WAITERS_PATH).iter().any(|n| {
                s.fs.read(&format!("{WAITERS_PATH}/{n}"))
                    .and_then(|b| record::parse::<WaiterRecord>(b).ok())
                    .is_some_and(|r| names_me(&r.identity))
            });
    let owner = s.owner_record().is_some_and(|r| names_me(&r.identity));
    let registry = s.fs.names(LEASES_PATH).iter().any(|n| {
        s.fs.read(&format!("{LEASES_PATH}/{n}"))
            .and_then(|b| {
                if record::is_registry_slot(n) {
                    record::decode_registry_slot(b).ok().flatten()
                } else {
                    record::parse::<RegistryRecord>(b).ok()
                }
            })
            .is_some_and(|r| names_me(&r.identity))
    });
    !waiter && !owner && !registry
}

impl LeaseModel {
    fn stopper_can_step(&self, s: &LeaseState) -> bool {
        match s.stopper {
            Stopper::Idle => s
                .owner_record()
                .is_some_and(|r| r.phase != PhaseKind::Released),
            Stopper::Read { .. } | Stopper::Verified { .. } => true,
            Stopper::Done(_) => false,
        }
    }

    /// One step of `tenure::lease::signal_owner` (or a mutant of it).
    fn stopper_step(&self, s: &mut LeaseState) {
        s.stopper = match s.stopper {
            Stopper::Idle => match s.owner_record() {
                Some(r) => Stopper::Read {
                    pid: r.identity.pid as u8,
                    start: r.identity.start_time as u8,
                },
                None => Stopper::Done(StopEnd::Dead),
            },
            // pidfd_open(pid) pins whichever process has the pid now (or fails with ESRCH);
            // then /proc/PID is re-read and the pidfd checked for exit, so what is compared
            // is the pinned process.
            Stopper::Read { pid, start } => {
                let at = &s.procs[pid as usize];
                if !at.running() {
                    Stopper::Done(StopEnd::Dead)
                } else if at.start == start || self.is(Mutation::SignalWithoutIdentityCheck) {
                    Stopper::Verified {
                        pid,
                        start,
                        pinned: at.start,
                    }
                } else {
                    Stopper::Done(StopEnd::Mismatch)
                }
            }
            // pidfd_send_signal reaches the pinned process or fails with ESRCH; `kill(pid)`
            // reaches whoever has the pid now.
            Stopper::Verified { pid, start, pinned } => {
                let at = &mut s.procs[pid as usize];
                let target = if self.is(Mutation::SignalByPid) {
                    at.running().then_some(at.start)
                } else {
                    at.is_live(pinned).then_some(pinned)
                };
                match target {
                    Some(t) => {
                        if t != start {
                            s.violations |= V_SIGNAL;
                        }
                        at.queued = (at.queued + 1).min(2);
                        Stopper::Done(StopEnd::Delivered)
                    }
                    None => Stopper::Done(StopEnd::Dead),
                }
            }
            Stopper::Done(e) => Stopper::Done(e),
        };
    }
}

impl Representative for LeaseState {
    /// No reduction: the processes' pids are written into the files (the owner record, the
    /// waiter entries' names, the registry), so two states that differ by a renaming of pid
    /// slots are not equal files; each state is its own representative.
    fn representative(&self) -> Self {
        self.clone()
    }
}

impl crate::run::Describe for LeaseModel {
    /// One line per step: what happened in the world, and the phase it left the process in.
    fn describe(&self, path: &[(LeaseState, Option<LeaseAction>)]) -> Vec<String> {
        path.iter()
            .filter_map(|(s, a)| {
                let a = (*a)?;
                let next = self.next_state(s, a)?;
                let phase = |p: u8| next.procs[p as usize].drv.machine().phase().label();
                let p_of = |p: u8| format!("p{p}");
                Some(match a {
                    LeaseAction::Launch(p) => format!(
                        "{} starts (pid {p}, start time {}) -> {}",
                        p_of(p),
                        next.procs[p as usize].start,
                        phase(p)
                    ),
                    LeaseAction::Exec(p) => match s.procs[p as usize].drv.peek() {
                        Some(x) => format!("{} executes {x} -> {}", p_of(p), phase(p)),
                        None => format!("{} executes nothing", p_of(p)),
                    },
                    LeaseAction::Step(p) => {
                        format!("{} {} -> {}", p_of(p), steps_told(self, s, p), phase(p))
                    }
                    LeaseAction::Wake(p) => format!("{}'s wait takes the freed lock", p_of(p)),
                    LeaseAction::Expire(p) => {
                        format!("{}'s wait bound expires -> {}", p_of(p), phase(p))
                    }
                    LeaseAction::Recover(p, ok) => format!(
                        "{} {} -> {}",
                        p_of(p),
                        if ok {
                            "recovers"
                        } else {
                            "refuses the checkpoint"
                        },
                        phase(p)
                    ),
                    LeaseAction::Publish(p) => format!(
                        "{} publishes (CURRENT by epoch {}) -> {}",
                        p_of(p),
                        next.current,
                        phase(p)
                    ),
                    LeaseAction::Deliver(p) => {
                        format!("{} gets its queued SIGTERM -> {}", p_of(p), phase(p))
                    }
                    LeaseAction::Timer(p, t) => format!("{}'s {t:?} timer fires", p_of(p)),
                    LeaseAction::Drain(p) => {
                        format!("{}'s host asks to drain -> {}", p_of(p), phase(p))
                    }
                    LeaseAction::Crash(p) => {
                        format!("{} is SIGKILLed (the kernel drops its lock)", p_of(p))
                    }
                    LeaseAction::Signal(p) => format!("SIGTERM arrives for {}", p_of(p)),
                    LeaseAction::Stopper => format!("stopper: {:?}", next.stopper),
                    LeaseAction::Reclaim(p) => format!(
                        "{} finds the recorded owner dead, recreates the lock file and locks it",
                        p_of(p)
                    ),
                    LeaseAction::Spawn(p, d) => format!(
                        "{} spawns its workload (descendant: {}) -> {}",
                        p_of(p),
                        match d {
                            None => "none",
                            Some(false) => "only SIGKILL ends it",
                            Some(true) => "unkillable",
                        },
                        phase(p)
                    ),
                    LeaseAction::MainExit(p) => {
                        format!("{} sees its main process end -> {}", p_of(p), phase(p))
                    }
                    LeaseAction::TreeGone(p) => {
                        format!("{} sees its tree gone -> {}", p_of(p), phase(p))
                    }
                    LeaseAction::CloseFd(e) => format!(
                        "the descendant of epoch {e} closes its copy of the lock descriptor"
                    ),
                    LeaseAction::KillLeftover(e) => format!(
                        "an operator SIGKILLs the descendant epoch {e}'s crashed runner left"
                    ),
                    LeaseAction::PowerLoss(k) => format!(
                        "power loss (outcome {k}): every process is gone; the files: {:?}",
                        next.fs
                    ),
                    LeaseAction::Rewind => "an operator restores an old epoch file (1)".to_string(),
                    LeaseAction::RemoveLock => {
                        "an operator removes .tenure/lock while it is held".to_string()
                    }
                })
            })
            .collect()
    }
}

/// The operations `Step(p)` runs from state `s`, told as `label.step` names.
fn steps_told(m: &LeaseModel, s: &LeaseState, p: u8) -> String {
    let p = p as usize;
    let mut s = s.clone();
    let mut told = Vec::new();
    while let Some(job) = s.procs[p].job.as_ref() {
        let Some(op) = job.op() else { break };
        if matches!(op, LeaseOp::Wait) {
            break;
        }
        let boundary = if m.atomic_steps {
            lock_op(&op)
        } else {
            visible(&op, m.coarse, s.power_left > 0)
        };
        told.push(match &op {
            LeaseOp::File(step) => format!("{}.{}", step.label, step.op.step_name()),
            other => format!("{other:?}")
                .split(['(', ' ', '{'])
                .next()
                .unwrap_or("?")
                .to_lowercase(),
        });
        let mut job = Shared::into_inner(s.procs[p].job.take().expect("checked above"));
        let res = World { s: &mut s, m, p }.execute(job.op().expect("checked above"));
        job.handle(res);
        let done = job.op().is_none();
        s.procs[p].job = Some(Shared::new(job));
        if done || boundary {
            break;
        }
    }
    if told.is_empty() {
        "runs its plan".to_string()
    } else {
        format!("runs {}", told.join(", "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn two_processes_reach_a_grant_through_the_real_plan() {
        let m = LeaseModel::ci(2);
        let mut s = m.init_states().remove(0);
        s = m.next_state(&s, LeaseAction::Launch(0)).unwrap();
        for _ in 0..8 {
            let mut acts = Vec::new();
            m.actions(&s, &mut acts);
            let Some(a) = acts
                .into_iter()
                .find(|a| matches!(a, LeaseAction::Step(0) | LeaseAction::Exec(0)))
            else {
                break;
            };
            s = m.next_state(&s, a).unwrap();
        }
        assert!(s.procs[0].drv.machine().kind().owns(), "{s:?}");
        assert_eq!(s.epoch_file(), Some(1));
        assert!(s.owner_record().is_some_and(|r| r.epoch == 1));
        assert!(s.marker.is_some());
    }
}

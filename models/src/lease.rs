//! Lease contention: N processes contend for one state dir over an abstract kernel, each
//! running the real machine through the shared [`Driver`].
//!
//! # The world
//! - **Processes** live in pid slots. A slot runs one incarnation at a time; a new incarnation in
//!   a slot whose previous one crashed or exited has the *same pid* and a new start time (`start`),
//!   so every restart is a recycled pid. A crash (SIGKILL) can hit a process between any two
//!   model steps: in the middle of a step's actions, in the middle of an acquisition, while
//!   owning, while releasing.
//! - **The kernel lock** (`flock` on `.tenure/lock`) is held per lock-file inode by at most one
//!   live process and is dropped when its holder dies or exits. The lock file is never removed
//!   (only the `ReclaimStaleLock` mutant recreates it).
//! - **Acquisition as built** (`tenure::lease::acquire`): try the lock; when held, publish a
//!   waiter entry, report `LeaseBusy`, and wait until the lock is free (`Wake`), the bound
//!   expires (`Expire`, entry removed, `WaitExpired`) or a stop signal cancels the wait (the
//!   machine says `AbandonAcquire`, the entry is removed). Taking the lock and bumping the epoch
//!   file are one step (nothing but the lock holder reads the epoch meanwhile); writing the owner
//!   record, sweeping the registry of earlier owners and the entries of dead waiters, writing our
//!   registry entry, removing our waiter entry and answering `LeaseGranted{epoch}` are the next,
//!   so a crash can fall between them: the record then still names the previous owner. Once the
//!   lock is taken the wait no longer looks at its cancel descriptor, so queued signals wait for
//!   the grant.
//! - **Owning** writes the owner record (`SetPhase`), publishes fenced by the epoch (the store
//!   refuses when the epoch file names another epoch), and releases (registry entry removed,
//!   record rewritten as released, unlock) before `LeaseReleased`.
//! - **Signals**: external stop signals arrive at any live process and are queued; the driver
//!   delivers them between steps when its outstanding request is interruptible (not during
//!   spawning, not inside the locked part of an acquisition).
//! - **A third-party stopper** (`tenure stop`) reads the owner record, opens a pidfd for the
//!   recorded pid, re-reads the identity through `/proc` and checks that the pidfd's process has
//!   not exited, then signals through the pidfd (`tenure::lease::signal_owner`). Each is a
//!   separate step, so the recorded process can die and its pid be recycled in between.
//!
//! The workload is in-process (recover, serve, settle residencies) in the configurations about
//! the lease ([`LeaseModel::ci`]). In the **tree world** ([`LeaseModel::tree_ci`], card T2) every
//! process is a runner (`--type simple`) whose workload is a main process and a descendant that
//! survives the runner's crash (the main process dies of its parent-death signal): one that
//! only SIGKILL ends, or one that even SIGKILL does not end. Runners crash at any step. The
//! workload is contained one of two ways:
//! - **cgroup**: the runner records its cgroup in the owner record before the workload starts;
//!   an acquisition ends what the record's cgroup holds (SIGKILL; refusing if something
//!   survives) before it replaces the record;
//! - **lock descriptor**: the workload inherits the lock's open file description, so the lock
//!   stays held while a process of it keeps its copy; an orderly release `LOCK_UN`s it for
//!   every copy. With `close_fd`, the descendant may close its copy (the documented limit of
//!   the no-cgroup world: the checker prints the counterexample).
//!
//! Actions with no effect on the shared world (notes, notifications, timers, the drain hook,
//! issuing a request) are executed in the same model step as the one before them: nothing else
//! could observe the difference. With [`LeaseModel::atomic_steps`] (the CI configuration at
//! N = 3) the remaining ones (`SetPhase`, `AbandonAcquire`, `Exit`) are too, since they touch
//! only the process's own record, waiter entry and life; the N = 2 CI configuration makes each
//! of them a step a crash can fall between. The host has no active residency, so it reports
//! them settled as soon as the drain waits for them.

use crate::driver::{Driver, Request, Restart};
use stateright::{Model, Property, Representative};
use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};
use tenure::machine::{
    Action, ChildStatus, Config, Event, Fault, PhaseKind, ReadyMode, Reason, Signal, Timer,
};

/// Deliberate bugs in the world or the driver; each must make a property fail.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Mutation {
    /// I1: a waiter that finds the recorded owner dead (identity checked) breaks the lock by
    /// recreating the lock file, treating the record as the authority. The record is stale
    /// while a new owner has locked but not yet written it.
    ReclaimStaleLock,
    /// I2: the grant is answered with the next epoch before the epoch file is written; the file
    /// is written later.
    EpochAfterGrant,
    /// I3: the driver releases the lease when it starts publishing, so the publish runs without
    /// the lock (release before publish).
    ReleaseBeforePublish,
    /// I4: the stopper signals through the pidfd without comparing the identity it re-read.
    SignalWithoutIdentityCheck,
    /// I4: the stopper checks the identity, then signals by pid number (`kill(pid)`) instead of
    /// through the pidfd that pinned the process.
    SignalByPid,
    /// I5: `AbandonAcquire` does not remove the waiter entry.
    WaiterLeftOnCancel,
    /// I5: the driver delivers a queued stop signal while the acquisition holds the lock,
    /// cancelling a run that already took the lock and wrote the record.
    CancelAfterLock,
    /// I6: after `Exit(busy)` the driver starts the machine again in the same process (a retry
    /// loop) instead of ending.
    RetryAfterExit,
    /// Legal events: the host reports residencies settled every time it sees none, not once.
    SettleTwice,
    /// I7 (card T2): a successor that does not end the leftover tree of a crashed owner before
    /// it starts its own workload.
    SkipEndLeftovers,
    /// I7 (card T2): a successor that ends the crashed owner's cgroup only after it replaced
    /// the owner record naming it: if it crashes in between, nobody ends it any more.
    EndLeftoversAfterRecord,
}

impl Mutation {
    /// Every mutation of this model.
    pub const ALL: [Mutation; 11] = [
        Mutation::ReclaimStaleLock,
        Mutation::EpochAfterGrant,
        Mutation::ReleaseBeforePublish,
        Mutation::SignalWithoutIdentityCheck,
        Mutation::SignalByPid,
        Mutation::WaiterLeftOnCancel,
        Mutation::CancelAfterLock,
        Mutation::RetryAfterExit,
        Mutation::SettleTwice,
        Mutation::SkipEndLeftovers,
        Mutation::EndLeftoversAfterRecord,
    ];

    /// The name used on the command line and in the README.
    pub const fn name(self) -> &'static str {
        match self {
            Mutation::ReclaimStaleLock => "reclaim-stale-lock",
            Mutation::EpochAfterGrant => "epoch-after-grant",
            Mutation::ReleaseBeforePublish => "release-before-publish",
            Mutation::SignalWithoutIdentityCheck => "signal-without-identity-check",
            Mutation::SignalByPid => "signal-by-pid",
            Mutation::WaiterLeftOnCancel => "waiter-left-on-cancel",
            Mutation::CancelAfterLock => "cancel-after-lock",
            Mutation::RetryAfterExit => "retry-after-exit",
            Mutation::SettleTwice => "settle-twice",
            Mutation::SkipEndLeftovers => "skip-end-leftovers",
            Mutation::EndLeftoversAfterRecord => "end-leftovers-after-record",
        }
    }

    /// The property the mutation must break.
    pub const fn breaks(self) -> &'static str {
        match self {
            Mutation::ReclaimStaleLock => AT_MOST_ONE_OWNER,
            Mutation::EpochAfterGrant => EPOCHS_INCREASE,
            Mutation::ReleaseBeforePublish => FENCED_WRITES,
            Mutation::SignalWithoutIdentityCheck | Mutation::SignalByPid => IDENTITY_CHECKED,
            Mutation::WaiterLeftOnCancel | Mutation::CancelAfterLock => CANCEL_LEAVES_NOTHING,
            Mutation::RetryAfterExit => TERMINAL_IS_FINAL,
            Mutation::SettleTwice => LEGAL_EVENTS,
            Mutation::SkipEndLeftovers | Mutation::EndLeftoversAfterRecord => NO_OVERLAP,
        }
    }

    /// Whether the mutation is about the tree world (checked in [`LeaseModel::tree_ci`]).
    pub const fn needs_tree(self) -> bool {
        matches!(
            self,
            Mutation::SkipEndLeftovers | Mutation::EndLeftoversAfterRecord
        )
    }

    /// Looks a mutation up by name.
    pub fn from_name(name: &str) -> Option<Mutation> {
        Mutation::ALL.into_iter().find(|m| m.name() == name)
    }
}

/// I1: at most one process owns the state dir.
pub const AT_MOST_ONE_OWNER: &str = "at most one owner";
/// I2: every ownership's epoch is durable before the grant and greater than all earlier ones.
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

const V_EPOCH: u16 = 1;
const V_FENCE: u16 = 2;
const V_SIGNAL: u16 = 4;
const V_ILLEGAL: u16 = 8;
const V_TREE: u16 = 16;

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
    /// Whether all actions of a machine step execute in one model step. They touch only the
    /// process's own record, waiter entry and exit, so no other process can tell; `false`
    /// makes each of those a separate step a crash can fall between.
    pub atomic_steps: bool,
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
            mutation: None,
            tree: None,
        }
    }

    /// The tree world checked in CI (card T2): two runners, each workload a main process and a
    /// descendant that outlives the runner's crash; two crashes and a restart, so an owner, its
    /// successor and the successor's successor can each crash at any step; timers fire.
    pub fn tree_ci(contain: Contain) -> LeaseModel {
        LeaseModel {
            processes: 2,
            restarts: 1,
            crashes: 2,
            signals: 0,
            stopper: false,
            recovery_failures: false,
            timers: true,
            atomic_steps: true,
            mutation: None,
            tree: Some(TreeWorld {
                contain,
                close_fd: false,
            }),
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
    /// The incarnation was killed (SIGKILL); its files stay as they were.
    Crashed,
    /// The incarnation executed `Exit`.
    Exited,
}

/// The world's side of an outstanding acquisition.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Acq {
    /// Not acquiring, or not tried yet.
    Idle,
    /// The lock was busy: the waiter entry is published and the wait runs.
    Waiting,
    /// The lock is ours and the epoch file holds this new epoch (taking the lock and bumping
    /// the epoch are one step: nothing outside the lock holder reads the epoch in between).
    Locked(u8),
}

/// One pid slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Proc {
    /// The incarnation (start time) of the current or last process at this pid.
    pub start: u8,
    /// Whether the current incarnation runs.
    pub life: Life,
    /// Its driver and machine (frozen once it crashed or exited).
    pub drv: Driver,
    /// The acquisition's progress in the world.
    pub acq: Acq,
    /// The inode of the lock file this process holds the kernel lock on.
    pub lock: Option<u8>,
    /// The inode of the lock file this process opened when it started acquiring.
    pub fd_ino: u8,
    /// Waiter entries under this pid, one bit per incarnation.
    pub waiter_entries: u8,
    /// Stop signals queued for delivery.
    pub queued: u8,
    /// Whether this incarnation changed shared state (lock, epoch, record, registry, CURRENT).
    pub touched: bool,
    /// Whether this incarnation reported contention (it was a visible waiter).
    pub waited: bool,
    /// Whether the host requested the drain / reported residencies settled in this run.
    pub drain_fed: bool,
    /// See `drain_fed`.
    pub settle_fed: bool,
    /// The first terminal phase the machine reached in this incarnation (for I6).
    pub ended: Option<PhaseKind>,
    /// `EpochAfterGrant` only: the epoch still to be written after the grant.
    pub late_epoch: Option<u8>,
    /// `EndLeftoversAfterRecord` only: the record the grant replaced, ended at recovery.
    pub replaced: Option<Record>,
}

impl Proc {
    fn vacant(config: Config) -> Proc {
        Proc {
            start: 0,
            life: Life::Vacant,
            drv: Driver::new(config),
            acq: Acq::Idle,
            lock: None,
            fd_ino: 0,
            waiter_entries: 0,
            queued: 0,
            touched: false,
            waited: false,
            drain_fed: false,
            settle_fed: false,
            ended: None,
            late_epoch: None,
            replaced: None,
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

/// The owner record (`owner.json`): evidence of who owns, never the authority.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Record {
    /// Pid slot of the recorded owner.
    pub pid: u8,
    /// Its incarnation.
    pub start: u8,
    /// Its epoch.
    pub epoch: u8,
    /// Whether it released in order.
    pub released: bool,
    /// Whether it names the ownership's cgroup (tree world).
    pub cgroup: bool,
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
    /// and it is still locked (an orderly release `LOCK_UN`s it for every copy).
    pub locked_ofd: bool,
}

impl Work {
    /// Whether any process of it runs.
    fn alive(&self) -> bool {
        self.main == MainW::Alive || self.desc.alive()
    }

    /// Whether it keeps the lock held (its copies of a still-locked descriptor are open).
    fn holds_lock(&self) -> bool {
        self.locked_ofd && (self.main == MainW::Alive || self.desc.holds_fd())
    }
}

/// A registry entry `leases/<epoch>.json`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RegEntry {
    /// The ownership's epoch.
    pub epoch: u8,
    /// Pid slot of the owner.
    pub pid: u8,
    /// Its incarnation.
    pub start: u8,
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
    pub procs: Vec<Proc>,
    /// The inode of `.tenure/lock`.
    pub lock_file: u8,
    /// The persisted epoch.
    pub epoch_file: u8,
    /// The owner record.
    pub record: Option<Record>,
    /// Registry entries of owners, sorted.
    pub registry: Vec<RegEntry>,
    /// The epoch of the publisher of CURRENT (0: the checkpoint present before any run).
    pub current: u8,
    /// The stopper.
    pub stopper: Stopper,
    /// Restarts left.
    pub restarts_left: u8,
    /// Crashes left.
    pub crashes_left: u8,
    /// External signals left.
    pub signals_left: u8,
    /// The largest epoch ever granted (history for I2).
    pub max_granted: u8,
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
    /// The acquisition tries the lock: taken, or busy (waiter entry + `LeaseBusy`).
    TryLock(u8),
    /// The wait sees the lock free and takes it.
    Wake(u8),
    /// The wait bound expires: entry removed, `WaitExpired`.
    Expire(u8),
    /// Under the lock: owner record, registry and sweeps, own waiter entry removed,
    /// `LeaseGranted`.
    Grant(u8),
    /// Recovery finishes (`true`: done, `false`: the checkpoint is refused).
    Recover(u8, bool),
    /// The fenced publish finishes.
    Publish(u8),
    /// The release finishes: registry entry removed, record released, unlock.
    Release(u8),
    /// A queued stop signal is delivered.
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
    /// `EpochAfterGrant` only: the late write of the epoch file.
    LateBump(u8),
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
}

impl LeaseState {
    fn holds_current_lock(&self, p: usize) -> bool {
        self.procs[p].lock == Some(self.lock_file)
    }

    fn lock_free(&self, ino: u8) -> bool {
        let runner = self
            .procs
            .iter()
            .any(|q| q.running() && q.lock == Some(ino));
        // The workloads' copies of a locked descriptor are on the one lock file there is in the
        // tree world.
        let workload = ino == self.lock_file && self.works.iter().any(Work::holds_lock);
        !runner && !workload
    }

    /// The workload of slot `p`'s current incarnation.
    fn work_of(&mut self, p: usize) -> Option<&mut Work> {
        let (owner, start) = (p as u8, self.procs[p].start);
        self.works
            .iter_mut()
            .find(|w| w.owner == owner && w.start == start)
    }

    /// Ends what the cgroup of `rec` holds (card T2): SIGKILL to every process of the workload
    /// of its epoch. Returns false when a process survives (the acquisition then refuses).
    fn end_cgroup(&mut self, rec: Option<Record>) -> bool {
        let Some(r) = rec else { return true };
        if r.released || !r.cgroup {
            return true;
        }
        let mut all_gone = true;
        for w in self.works.iter_mut().filter(|w| w.epoch == r.epoch) {
            if w.main == MainW::Alive {
                w.main = MainW::Killed;
            }
            w.desc = match w.desc {
                DescW::Stays { .. } | DescW::Gone => DescW::Gone,
                d @ DescW::Unkillable { .. } => {
                    all_gone = false;
                    d
                }
            };
        }
        self.tidy_works();
        all_gone
    }

    /// Forgets workloads nothing of which runs and nobody waits on (fewer equal states).
    fn tidy_works(&mut self) {
        let procs = &self.procs;
        self.works.retain(|w| {
            w.alive()
                || w.main == MainW::Killed
                || procs[w.owner as usize].is_live(w.start)
                    && procs[w.owner as usize].drv.child() != crate::driver::ChildView::Reaped
        });
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

    /// Executes, in the same model step, the actions at the head of the step that nothing else
    /// can observe.
    fn run_invisible(&mut self, m: &LeaseModel, p: usize) {
        while let Some(a) = self.procs[p].drv.peek() {
            if !m.atomic_steps && !invisible(a) {
                break;
            }
            self.exec(m, p);
        }
    }

    fn exec(&mut self, m: &LeaseModel, p: usize) {
        let Some(a) = self.procs[p].drv.pop() else {
            return;
        };
        match a {
            Action::AbandonAcquire => {
                let proc = &mut self.procs[p];
                if !m.is(Mutation::WaiterLeftOnCancel) {
                    proc.waiter_entries &= !(1 << proc.start);
                }
                proc.acq = Acq::Idle;
            }
            Action::SetPhase(k) => self.rewrite_record(p, k == PhaseKind::Released),
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
            Action::Publish if m.is(Mutation::ReleaseBeforePublish) => self.release_world(p),
            Action::Exit(o) => {
                if m.is(Mutation::RetryAfterExit) && o.reason == Reason::Busy {
                    self.procs[p].drv.restart_machine();
                    self.procs[p].acq = Acq::Idle;
                    self.feed(p, Event::Start);
                } else {
                    let proc = &mut self.procs[p];
                    proc.life = Life::Exited;
                    proc.lock = None;
                }
            }
            Action::AcquireLease
            | Action::Recover
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
            | Action::ReleaseLease
            | Action::Note(_) => {}
        }
    }

    /// `Lease::set_phase`: the owner rewrites its record. Only the lock holder may (I3).
    fn rewrite_record(&mut self, p: usize, released: bool) {
        if !self.holds_current_lock(p) {
            self.violations |= V_FENCE;
        }
        let proc = &mut self.procs[p];
        proc.touched = true;
        let epoch = proc.epoch().unwrap_or(0);
        let cgroup = self
            .record
            .is_some_and(|r| r.pid == p as u8 && r.start == proc.start && r.cgroup);
        self.record = Some(Record {
            pid: p as u8,
            start: proc.start,
            epoch,
            released,
            cgroup,
        });
    }

    /// `Lease::release`: registry entries removed, record rewritten as released, unlock.
    fn release_world(&mut self, p: usize) {
        let Some(epoch) = self.procs[p].epoch() else {
            return;
        };
        if self.procs[p].lock.is_none() {
            // Already released (the release-before-publish mutant did it early).
            return;
        }
        if !self.holds_current_lock(p) {
            self.violations |= V_FENCE;
        }
        if let Some(w) = self.work_of(p) {
            let alive = w.alive();
            // `LOCK_UN` unlocks every copy of the descriptor.
            w.locked_ofd = false;
            if alive {
                self.violations |= V_TREE;
            }
        }
        self.registry.retain(|r| r.epoch != epoch);
        self.rewrite_record(p, true);
        self.procs[p].lock = None;
    }

    /// The lock is taken on `ino` and the epoch bumped durably (`EpochAfterGrant`: computed, to
    /// be written after the grant).
    fn take_lock(&mut self, m: &LeaseModel, p: usize, ino: u8) {
        let epoch = self.epoch_file + 1;
        if m.is(Mutation::EpochAfterGrant) {
            self.procs[p].late_epoch = Some(epoch);
        } else {
            self.epoch_file = epoch;
        }
        let proc = &mut self.procs[p];
        proc.lock = Some(ino);
        proc.acq = Acq::Locked(epoch);
        proc.touched = true;
    }

    /// The entries of waiters whose process is gone are swept by a new owner.
    fn sweep_waiters(&mut self) {
        for q in &mut self.procs {
            let live = if q.running() { 1 << q.start } else { 0 };
            q.waiter_entries &= live;
        }
    }

    /// Whether a queued signal can be delivered now: between steps, and not inside the locked
    /// part of an acquisition or a spawn.
    fn interruptible(&self, m: &LeaseModel, p: usize) -> bool {
        let proc = &self.procs[p];
        if !proc.drv.between_steps() {
            return false;
        }
        match proc.drv.request() {
            Some(Request::Acquire { .. }) => {
                matches!(proc.acq, Acq::Idle | Acq::Waiting) || m.is(Mutation::CancelAfterLock)
            }
            Some(Request::Spawn) => false,
            Some(Request::Recover | Request::Publish | Request::Release) | None => true,
        }
    }
}

/// Actions whose execution changes nothing another process or a property can see.
fn invisible(a: Action) -> bool {
    !matches!(
        a,
        Action::AbandonAcquire | Action::SetPhase(_) | Action::Exit(_)
    )
}

impl Model for LeaseModel {
    type State = LeaseState;
    type Action = LeaseAction;

    fn init_states(&self) -> Vec<LeaseState> {
        vec![LeaseState {
            procs: vec![Proc::vacant(self.config()); self.processes],
            lock_file: 0,
            epoch_file: 0,
            record: None,
            registry: Vec::new(),
            current: 0,
            stopper: if self.stopper {
                Stopper::Idle
            } else {
                Stopper::Done(StopEnd::Dead)
            },
            restarts_left: self.restarts,
            crashes_left: self.crashes,
            signals_left: self.signals,
            max_granted: 0,
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
            if proc.late_epoch.is_some() && proc.acq == Acq::Idle {
                out.push(LeaseAction::LateBump(p));
            }
            if proc.drv.peek().is_some() {
                out.push(LeaseAction::Exec(p));
                continue;
            }
            if !proc.drv.between_steps() {
                continue;
            }
            match proc.drv.request() {
                Some(Request::Acquire { .. }) => match proc.acq {
                    Acq::Idle => out.push(LeaseAction::TryLock(p)),
                    Acq::Waiting => {
                        if s.lock_free(proc.fd_ino) {
                            out.push(LeaseAction::Wake(p));
                        }
                        out.push(LeaseAction::Expire(p));
                        if self.is(Mutation::ReclaimStaleLock)
                            && s.lock_file < 2
                            && s.record.is_some_and(|r| {
                                !r.released && !s.procs[r.pid as usize].is_live(r.start)
                            })
                        {
                            out.push(LeaseAction::Reclaim(p));
                        }
                    }
                    Acq::Locked(_) => out.push(LeaseAction::Grant(p)),
                },
                Some(Request::Recover) => {
                    out.push(LeaseAction::Recover(p, true));
                    if self.recovery_failures {
                        out.push(LeaseAction::Recover(p, false));
                    }
                }
                Some(Request::Publish) => out.push(LeaseAction::Publish(p)),
                Some(Request::Release) => out.push(LeaseAction::Release(p)),
                Some(Request::Spawn) => {
                    for desc in [None, Some(false), Some(true)] {
                        out.push(LeaseAction::Spawn(p, desc));
                    }
                }
                None => {}
            }
            // The runner sees its workload between steps.
            if self.tree.is_some() && proc.drv.request() != Some(Request::Spawn) {
                let mine = s
                    .works
                    .iter()
                    .find(|w| w.owner == p && w.start == proc.start);
                match (proc.drv.child(), mine) {
                    (crate::driver::ChildView::Running, Some(w))
                        if matches!(w.main, MainW::Alive | MainW::Killed) =>
                    {
                        out.push(LeaseAction::MainExit(p));
                    }
                    (crate::driver::ChildView::Tree, Some(w)) if !w.alive() => {
                        out.push(LeaseAction::TreeGone(p));
                    }
                    _ => {}
                }
            }
            if proc.queued > 0 && s.interruptible(self, i) {
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
            LeaseAction::Launch(p)
            | LeaseAction::Exec(p)
            | LeaseAction::TryLock(p)
            | LeaseAction::Wake(p)
            | LeaseAction::Expire(p)
            | LeaseAction::Grant(p)
            | LeaseAction::Recover(p, _)
            | LeaseAction::Publish(p)
            | LeaseAction::Release(p)
            | LeaseAction::Deliver(p)
            | LeaseAction::Timer(p, _)
            | LeaseAction::Drain(p)
            | LeaseAction::Crash(p)
            | LeaseAction::Signal(p)
            | LeaseAction::Reclaim(p)
            | LeaseAction::LateBump(p)
            | LeaseAction::Spawn(p, _)
            | LeaseAction::MainExit(p)
            | LeaseAction::TreeGone(p) => p as usize,
        };
        match action {
            LeaseAction::Launch(_) => {
                let proc = &mut s.procs[p];
                let start = if proc.life == Life::Vacant {
                    0
                } else {
                    s.restarts_left -= 1;
                    proc.start + 1
                };
                let entries = proc.waiter_entries;
                *proc = Proc::vacant(self.config());
                proc.start = start;
                proc.life = Life::Running;
                proc.waiter_entries = entries;
                s.feed(p, Event::Start);
            }
            LeaseAction::Exec(_) => s.exec(self, p),
            LeaseAction::TryLock(_) => {
                let ino = s.lock_file;
                s.procs[p].fd_ino = ino;
                if s.lock_free(ino) {
                    s.take_lock(self, p, ino);
                } else {
                    let proc = &mut s.procs[p];
                    proc.waiter_entries |= 1 << proc.start;
                    proc.acq = Acq::Waiting;
                    proc.waited = true;
                    s.feed(p, Event::LeaseBusy);
                }
            }
            LeaseAction::Wake(_) => {
                let ino = s.procs[p].fd_ino;
                s.take_lock(self, p, ino);
            }
            LeaseAction::Reclaim(_) => {
                // The stale-lock "repair": a fresh lock file nobody holds.
                s.lock_file += 1;
                let ino = s.lock_file;
                s.procs[p].fd_ino = ino;
                s.take_lock(self, p, ino);
            }
            LeaseAction::Expire(_) => {
                let proc = &mut s.procs[p];
                proc.waiter_entries &= !(1 << proc.start);
                proc.acq = Acq::Idle;
                s.feed(p, Event::WaitExpired);
            }
            LeaseAction::Grant(_) => {
                let Acq::Locked(epoch) = s.procs[p].acq else {
                    return None;
                };
                // Card T2, cgroup world: what the recorded cgroup holds is ended before the
                // record is replaced (`lease::become_owner`); a survivor refuses the
                // acquisition, which unlocks and leaves the record as it was.
                if self.contain() == Some(Contain::Cgroup) {
                    if self.is(Mutation::EndLeftoversAfterRecord) {
                        s.procs[p].replaced = s.record;
                    } else if !self.is(Mutation::SkipEndLeftovers) && !s.end_cgroup(s.record) {
                        let proc = &mut s.procs[p];
                        proc.lock = None;
                        proc.acq = Acq::Idle;
                        proc.waiter_entries &= !(1 << proc.start);
                        s.feed(p, Event::LeaseFailed(Fault::Io));
                        s.run_invisible(self, p);
                        return Some(s);
                    }
                }
                s.record = Some(Record {
                    pid: p as u8,
                    start: s.procs[p].start,
                    epoch,
                    released: false,
                    cgroup: false,
                });
                if epoch <= s.max_granted || s.epoch_file < epoch {
                    s.violations |= V_EPOCH;
                }
                s.max_granted = s.max_granted.max(epoch);
                s.registry.retain(|r| r.epoch >= epoch);
                s.sweep_waiters();
                let proc = &mut s.procs[p];
                s.registry.push(RegEntry {
                    epoch,
                    pid: p as u8,
                    start: proc.start,
                });
                s.registry.sort();
                proc.waiter_entries &= !(1 << proc.start);
                proc.acq = Acq::Idle;
                s.feed(
                    p,
                    Event::LeaseGranted {
                        epoch: u64::from(epoch),
                    },
                );
            }
            LeaseAction::LateBump(_) => {
                if let Some(e) = s.procs[p].late_epoch.take() {
                    s.epoch_file = s.epoch_file.max(e);
                }
            }
            LeaseAction::Recover(_, ok) => {
                // The mutant ends the crashed owner's cgroup only now, after its record was
                // replaced at the grant.
                let replaced = s.procs[p].replaced.take();
                let ev = if !s.end_cgroup(replaced) {
                    Event::RecoveryFailed(Fault::Io)
                } else if ok {
                    Event::RecoveryDone
                } else {
                    Event::RecoveryFailed(tenure::machine::Fault::State)
                };
                s.feed(p, ev);
            }
            LeaseAction::Spawn(_, desc) => {
                let epoch = s.procs[p].epoch().unwrap_or(0);
                let lock_fd = self.contain() == Some(Contain::LockFd);
                // The runner records its cgroup before the child enters it.
                if self.contain() == Some(Contain::Cgroup)
                    && let Some(r) = s.record.as_mut()
                    && r.pid == p as u8
                    && r.start == s.procs[p].start
                {
                    r.cgroup = true;
                }
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
                    locked_ofd: lock_fd,
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
                let epoch = s.procs[p].epoch().unwrap_or(0);
                // The store's fence: the epoch file must name exactly the publisher's epoch.
                if s.epoch_file == epoch {
                    if !s.holds_current_lock(p) {
                        s.violations |= V_FENCE;
                    }
                    s.current = epoch;
                    s.procs[p].touched = true;
                    s.feed(p, Event::CheckpointPublished);
                } else {
                    s.feed(p, Event::CheckpointFailed);
                }
            }
            LeaseAction::Release(_) => {
                s.release_world(p);
                s.feed(p, Event::LeaseReleased);
            }
            LeaseAction::Deliver(_) => {
                s.procs[p].queued -= 1;
                s.feed(p, Event::Stop(Signal::Term));
            }
            LeaseAction::Timer(_, t) => s.feed(p, Event::TimerExpired(t)),
            LeaseAction::Drain(_) => {
                s.procs[p].drain_fed = true;
                s.feed(p, Event::DrainRequested);
            }
            LeaseAction::Crash(_) => {
                s.crashes_left -= 1;
                let proc = &mut s.procs[p];
                proc.life = Life::Crashed;
                // The kernel drops the lock of a dead process; its files stay.
                proc.lock = None;
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
            LeaseAction::Stopper | LeaseAction::CloseFd(_) | LeaseAction::KillLeftover(_) => {}
        }
        s.run_invisible(self, p);
        // No residency is ever active here, so the host reports them settled as soon as the
        // drain waits for them.
        let proc = &s.procs[p];
        if proc.running()
            && (!proc.settle_fed || self.is(Mutation::SettleTwice))
            && proc.drv.admits(Event::ResidenciesSettled).is_ok()
        {
            s.procs[p].settle_fed = true;
            s.feed(p, Event::ResidenciesSettled);
            s.run_invisible(self, p);
        }
        Some(s)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        let mut v = self.lease_properties();
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
            // I2: checked at every grant (durable before the grant, above every earlier one).
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
            // I3: record rewrites, publishes and releases only by the lock holder; stale epochs
            // fenced.
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
        ]
    }
}

/// I5 for slot `i`: it never held the lock or changed shared state, and once its run exited
/// (the machine's `AbandonAcquire` and `Exit` executed) no waiter entry, record or registry
/// entry names it.
fn leaves_nothing(s: &LeaseState, i: usize) -> bool {
    let p = &s.procs[i];
    let names = |pid: u8, start: u8| usize::from(pid) == i && start == p.start;
    let untouched = !p.touched && p.lock.is_none();
    let finished = p.life != Life::Exited
        || (p.waiter_entries & (1 << p.start) == 0
            && !s.record.is_some_and(|r| names(r.pid, r.start))
            && !s.registry.iter().any(|r| names(r.pid, r.start)));
    untouched && finished
}

impl LeaseModel {
    fn stopper_can_step(&self, s: &LeaseState) -> bool {
        match s.stopper {
            Stopper::Idle => s.record.is_some_and(|r| !r.released),
            Stopper::Read { .. } | Stopper::Verified { .. } => true,
            Stopper::Done(_) => false,
        }
    }

    /// One step of `tenure::lease::signal_owner` (or a mutant of it).
    fn stopper_step(&self, s: &mut LeaseState) {
        s.stopper = match s.stopper {
            Stopper::Idle => match s.record {
                Some(r) => Stopper::Read {
                    pid: r.pid,
                    start: r.start,
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
    /// Pid slots are interchangeable: sort them and rename every pid the world records.
    fn representative(&self) -> Self {
        let n = self.procs.len();
        let key = |i: usize| {
            let mut h = DefaultHasher::new();
            self.procs[i].hash(&mut h);
            let named = |pid: u8| usize::from(pid) == i;
            (
                h.finish(),
                self.record.map(|r| named(r.pid)),
                self.registry.iter().filter(|r| named(r.pid)).count(),
                self.works
                    .iter()
                    .filter(|w| named(w.owner))
                    .map(|w| (w.epoch, w.main, w.desc))
                    .collect::<Vec<_>>(),
                match self.stopper {
                    Stopper::Read { pid, .. } | Stopper::Verified { pid, .. } => named(pid),
                    Stopper::Idle | Stopper::Done(_) => false,
                },
            )
        };
        let mut order: Vec<usize> = (0..n).collect();
        order.sort_by_key(|&i| key(i));
        // new index of old slot i
        let mut rename = vec![0u8; n];
        for (new, &old) in order.iter().enumerate() {
            rename[old] = new as u8;
        }
        let r = |pid: u8| rename[usize::from(pid)];
        let mut out = self.clone();
        out.procs = order.iter().map(|&i| self.procs[i]).collect();
        out.record = self.record.map(|rec| Record {
            pid: r(rec.pid),
            ..rec
        });
        out.registry = self
            .registry
            .iter()
            .map(|e| RegEntry {
                pid: r(e.pid),
                ..*e
            })
            .collect();
        out.registry.sort();
        out.works = self
            .works
            .iter()
            .map(|w| Work {
                owner: r(w.owner),
                ..*w
            })
            .collect();
        out.works.sort();
        out.stopper = match self.stopper {
            Stopper::Read { pid, start } => Stopper::Read { pid: r(pid), start },
            Stopper::Verified { pid, start, pinned } => Stopper::Verified {
                pid: r(pid),
                start,
                pinned,
            },
            s @ (Stopper::Idle | Stopper::Done(_)) => s,
        };
        out
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
                    LeaseAction::TryLock(p) => match next.procs[p as usize].acq {
                        Acq::Locked(e) => format!("{} takes the lock; epoch file {e}", p_of(p)),
                        _ => format!("{} finds the lock busy: waiter entry, lease-busy", p_of(p)),
                    },
                    LeaseAction::Wake(p) => format!("{}'s wait takes the freed lock", p_of(p)),
                    LeaseAction::Expire(p) => {
                        format!("{}'s wait bound expires -> {}", p_of(p), phase(p))
                    }
                    LeaseAction::Grant(p) => format!(
                        "{} writes the owner record and registry entry -> {}",
                        p_of(p),
                        phase(p)
                    ),
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
                    LeaseAction::Release(p) => format!("{} releases -> {}", p_of(p), phase(p)),
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
                    LeaseAction::LateBump(p) => format!("{} writes the epoch file late", p_of(p)),
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
                })
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn representative_is_a_permutation() {
        let m = LeaseModel::ci(3);
        let s0 = m.init_states().remove(0);
        let s1 = m.next_state(&s0, LeaseAction::Launch(2)).unwrap();
        let s2 = m.next_state(&s0, LeaseAction::Launch(0)).unwrap();
        assert_ne!(s1, s2);
        assert_eq!(s1.representative(), s2.representative());
    }
}

//! Signal interleavings: one owner and its workload (a supervised process tree, or the
//! in-process host), every stop and stray signal in every phase, twice, during every driver
//! step.
//!
//! The process runs the real machine through the shared [`Driver`]; every action of a step is a
//! separate model step, so a signal (TERM, INT or HUP) can arrive between any two of them and
//! waits in the driver's queue until the step is done. The world answers each request with every
//! answer it could give: the lease is granted at once or after contention (then granted or the
//! wait expires) or fails; recovery verifies or refuses the checkpoint; the child spawns or its
//! executable is missing or not executable; a publish is durable, skipped (nothing staged) or
//! fails. The child lives its own life: it can announce `READY=1` and `STOPPING=1` (notify mode),
//! exit by itself with 0 or 3 or be killed by someone else (SIGABRT) at any point, exit 0 after a
//! forwarded signal, die of SIGKILL, or
//! survive SIGKILL past the kill wait and be reaped later. The workload is a tree (card T1): at
//! spawn the world picks whether the main process has a descendant and what it is like — one
//! that ends by itself at any time (as one that honours TERM does), one that ignores TERM and
//! ends only by SIGKILL, or one that survives SIGKILL for a while (stuck in the kernel) — and the
//! descendant may outlive the main process. The driver sees the main process's exit as
//! `child-exited` when nothing else runs and as `main-exited` otherwise, then `tree-empty`. Stray
//! signals (USR1, ...) arrive like stop signals (card T3). A ready notify-mode workload may send
//! `WATCHDOG=1`. Armed timers fire at any point. The in-process host can request a drain (also
//! before recovery, card H2) and settles its residencies at any point of the drain; the root can
//! be lost while owning (H7), and so can the lease itself (a cluster lease that expired or
//! could not be kept alive: `lease-lost`), from the grant until the release is answered.
//!
//! Three workloads are checked in one run: the runner with `--type simple`, the runner with
//! `--type notify --ready-timeout --watchdog`, and the in-process host.
//!
//! The world records what an observer would see: when the lease is taken and released, whether
//! a child may still run, what CURRENT holds, how often the drain hook ran, and each end record
//! and exit code. The properties are about those records.
//!
//! Besides what must never happen, the model checks what the cards require to happen (the
//! obligations): an event creates an obligation (`SignalState::owed`) and an action of the
//! driver discharges it — a stop while cold is owed the cancellation, a stop while recovering
//! the refusal with nothing published, a stop while ready the forward before any SIGKILL, a
//! stray for a running workload its relay, a lost lease the SIGKILL of a running workload — and
//! every publish must come after a clean exit, every drain after its hook, and nothing may be
//! published or released once the lease is lost. An obligation left undischarged when its step
//! ends, or a forbidden action before it, is a violation.

use crate::driver::{ChildView, Driver, Request, Restart};
use crate::spec::ExitTable;
use stateright::{Model, Property};
use std::time::Duration;
use tenure::machine::{
    Action, ChildStatus, Config, Event, ExecFailure, Fault, KillMode, Note, Outcome, Phase,
    PhaseKind, ReadyMode, Reason, Signal, Target, Timer,
};

/// Deliberate bugs in the driver's execution; each must make a property fail.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Mutation {
    /// I7: the driver releases the lease as soon as it sends SIGKILL, assuming the child died.
    ReleaseOnKill,
    /// I8: the driver releases the lease when it starts publishing (release before publish).
    ReleaseBeforePublish,
    /// I9: the driver publishes the staged checkpoint whenever it releases, even when the
    /// machine did not ask for a publish (a refused recovery).
    PublishOnRelease,
    /// I10: the driver writes an end record for the terminal note as well as for `Exit`.
    DoubleEndRecord,
    /// I10: the driver computes the exit code as 128 + the signal whenever the outcome names
    /// one, instead of `Outcome::code`.
    ExitCodeFromSignal,
    /// I11: the driver also runs the drain hook when it rewrites the record as draining.
    BeginDrainOnSetPhase,
    /// I6: after `Exit(busy)` the driver starts the machine again in the same process.
    RetryAfterBusy,
    /// Legal events: the driver delivers a queued signal while the spawn is outstanding.
    SignalDuringSpawn,
    /// I7 (card T1): the driver reports the main process's exit as the end of the whole
    /// workload (`child-exited`) without waiting for the rest of its tree.
    ReleaseBeforeTree,
    /// T1: stop signals for the whole tree reach the main process only (the runner before
    /// process trees were contained): the rest of the tree is SIGKILLed without ever being asked to stop.
    TermToMainOnly,
}

impl Mutation {
    /// Every mutation of this model.
    pub const ALL: [Mutation; 10] = [
        Mutation::ReleaseOnKill,
        Mutation::ReleaseBeforePublish,
        Mutation::PublishOnRelease,
        Mutation::DoubleEndRecord,
        Mutation::ExitCodeFromSignal,
        Mutation::BeginDrainOnSetPhase,
        Mutation::RetryAfterBusy,
        Mutation::SignalDuringSpawn,
        Mutation::ReleaseBeforeTree,
        Mutation::TermToMainOnly,
    ];

    /// The name used on the command line and in the README.
    pub const fn name(self) -> &'static str {
        match self {
            Mutation::ReleaseOnKill => "release-on-kill",
            Mutation::ReleaseBeforePublish => "release-before-publish",
            Mutation::PublishOnRelease => "publish-on-release",
            Mutation::DoubleEndRecord => "double-end-record",
            Mutation::ExitCodeFromSignal => "exit-code-from-signal",
            Mutation::BeginDrainOnSetPhase => "begin-drain-on-set-phase",
            Mutation::RetryAfterBusy => "retry-after-busy",
            Mutation::SignalDuringSpawn => "signal-during-spawn",
            Mutation::ReleaseBeforeTree => "release-before-tree",
            Mutation::TermToMainOnly => "term-to-main-only",
        }
    }

    /// The property the mutation must break.
    pub const fn breaks(self) -> &'static str {
        match self {
            Mutation::ReleaseOnKill => LEASE_OUTLIVES_WORKLOAD,
            Mutation::ReleaseBeforePublish => CHECKPOINT_BEFORE_RELEASE,
            Mutation::PublishOnRelease => REFUSED_KEEPS_CURRENT,
            Mutation::DoubleEndRecord => ONE_OUTCOME,
            Mutation::ExitCodeFromSignal => EXIT_CODE_PER_SPEC,
            Mutation::BeginDrainOnSetPhase => DRAIN_ONCE,
            Mutation::RetryAfterBusy => TERMINAL_IS_FINAL,
            Mutation::SignalDuringSpawn => LEGAL_EVENTS,
            Mutation::ReleaseBeforeTree => LEASE_OUTLIVES_WORKLOAD,
            Mutation::TermToMainOnly => TERM_BEFORE_KILL,
        }
    }

    /// Looks a mutation up by name.
    pub fn from_name(name: &str) -> Option<Mutation> {
        Mutation::ALL.into_iter().find(|m| m.name() == name)
    }
}

/// I7: the lease is never released while any process of the workload may still run.
pub const LEASE_OUTLIVES_WORKLOAD: &str = "lease outlives the workload";
/// T1: with `--kill-mode tree`, no process of the workload gets SIGKILL before it was sent the
/// stop signal (a lost lease excepted: it kills at once).
pub const TERM_BEFORE_KILL: &str = "term before kill";
/// T3: no stray signal ends the owner.
pub const STRAYS_SURVIVED: &str = "stray signals never end the owner";
/// I8: the drain's checkpoint is durable before the lease is released.
pub const CHECKPOINT_BEFORE_RELEASE: &str = "checkpoint before release";
/// I9: a stop or failure while recovering never moves CURRENT.
pub const REFUSED_KEEPS_CURRENT: &str = "refused recovery keeps CURRENT";
/// I10: every run ends with exactly one end record.
pub const ONE_OUTCOME: &str = "one outcome";
/// I10: the exit code is `Outcome::code`, agrees with the spec table, and the outcome is true.
pub const EXIT_CODE_PER_SPEC: &str = "exit code per spec";
/// I11: the drain hook runs at most once per ownership.
pub const DRAIN_ONCE: &str = "drain once";
/// I6: a terminal phase is never left.
pub const TERMINAL_IS_FINAL: &str = "terminal is final";
/// The driver feeds only events its semantics allow and the machine accepts.
pub const LEGAL_EVENTS: &str = "legal events";
/// G1: a stop signal before the lease ends the run as cancelled, in the step it is fed, and the
/// lease is never taken afterwards.
pub const STOP_COLD_CANCELS: &str = "a stop while cold cancels";
/// G3: a stop signal while recovering ends the run as refused and nothing is published.
pub const STOP_RECOVERING_REFUSES: &str = "a stop while recovering refuses";
/// G4, G6, D1: a stop signal while ready is forwarded to the workload in the step it is fed,
/// before any SIGKILL.
pub const STOP_FORWARDED_BEFORE_KILL: &str = "a stop reaches the workload before a kill";
/// G4, R1: a checkpoint is published only after the workload stopped in order — the main
/// process exited 0, nothing had to be SIGKILLed, no watchdog expired — or, in-process, after
/// the residencies settled; in every phase.
pub const PUBLISH_AFTER_CLEAN_EXIT: &str = "publish only after a clean exit";
/// T3: a stray signal fed while a process of the workload runs is relayed to it in that step.
pub const STRAY_RELAYED: &str = "a stray reaches a running workload";
/// H2, I11: the drain hook has run when the owner records that it drains.
pub const HOOK_BEFORE_DRAINING: &str = "drain hook before draining";
/// Issue 14: once the lease is lost, a running workload gets SIGKILL in the step the loss is
/// fed, nothing is published or released afterwards, and the run ends `refused/lease-lost`.
pub const LEASE_LOST_STOPS: &str = "a lost lease stops the workload and publishes nothing";

const V_CHILD: u16 = 1;
const V_DURABLE: u16 = 2;
const V_ILLEGAL: u16 = 4;
const V_CODE: u16 = 8;
const V_TERM: u16 = 16;
const V_STRAY: u16 = 32;
const V_CANCEL: u16 = 64;
const V_REFUSE: u16 = 128;
const V_FORWARD: u16 = 256;
const V_CLEAN: u16 = 512;
const V_RELAY: u16 = 1024;
const V_HOOK: u16 = 2048;
const V_LOST: u16 = 4096;

/// Obligations a fed event created and an action must discharge (the bits of
/// `SignalState::owed`).
const OWE_CANCEL: u8 = 1;
const OWE_REFUSE: u8 = 2;
const OWE_FORWARD: u8 = 4;
const OWE_RELAY: u8 = 8;
/// A lost lease is owed the SIGKILL of the workload that runs.
const OWE_KILL: u8 = 16;
/// The obligations due by the end of the step that created them.
const OWE_IN_STEP: u8 = OWE_CANCEL | OWE_FORWARD | OWE_RELAY | OWE_KILL;

/// The signal model and its bounds.
#[derive(Debug, Clone)]
pub struct SignalModel {
    /// Signals that may arrive in all (each TERM, INT, HUP or a stray one).
    pub signals: u8,
    /// The workloads checked (one initial state each).
    pub workloads: Vec<Config>,
    /// The bug to inject, if any.
    pub mutation: Option<Mutation>,
}

impl SignalModel {
    /// The full model checked in CI: two signals, three workloads.
    pub fn ci() -> SignalModel {
        let mut notify = Config::child(ReadyMode::Notify);
        notify.ready_timeout = Some(Duration::from_secs(30));
        notify.watchdog = Some(Duration::from_secs(20));
        SignalModel {
            signals: 2,
            workloads: vec![
                Config::child(ReadyMode::Start),
                notify,
                Config::in_process(),
            ],
            mutation: None,
        }
    }

    /// The same model with a bug injected.
    pub fn with_mutation(mut self, m: Option<Mutation>) -> SignalModel {
        self.mutation = m;
        self
    }

    fn is(&self, m: Mutation) -> bool {
        self.mutation == Some(m)
    }
}

/// What the main process's descendant is like (card T1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Nature {
    /// Ends by itself at any time (as one that honours TERM does).
    Ends,
    /// Ignores TERM: only SIGKILL ends it.
    IgnoresTerm,
    /// Survives SIGKILL for a while (stuck in the kernel); ends some time after it.
    Unkillable,
}

/// The main process's descendant, as the world knows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Desc {
    /// The main process has none (or was never spawned).
    None,
    /// It runs.
    Alive {
        /// What it is like.
        nature: Nature,
        /// It was sent a stop signal.
        termed: bool,
        /// It was sent SIGKILL.
        killed: bool,
    },
    /// It ended (the runner, its subreaper, reaped it).
    Dead,
}

impl Desc {
    fn alive(self) -> bool {
        matches!(self, Desc::Alive { .. })
    }
}

/// A signal waiting in the driver's queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Queued {
    /// A stop signal.
    Stop(Signal),
    /// A signal the owner does not act on (SIGUSR1).
    Stray,
}

/// SIGUSR1, the stray signal the model sends.
const USR1: u8 = 10;

/// The child process as the world knows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Child {
    /// Not spawned (or no child in this workload).
    None,
    /// Running.
    Running {
        /// A stop signal was forwarded to it.
        signalled: bool,
        /// SIGKILL was sent to it.
        killed: bool,
        /// It sent `READY=1`.
        ready: bool,
        /// It sent `STOPPING=1`.
        stopping: bool,
    },
    /// Exited and reaped with this status.
    Reaped(ChildStatus),
}

/// What CURRENT holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Current {
    /// The checkpoint present before the run.
    Old,
    /// The checkpoint this run published.
    New,
}

/// The state of the signal world.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct SignalState {
    /// The owner's driver and machine.
    pub drv: Driver,
    /// Whether this process holds the kernel lock.
    pub lock: bool,
    /// Whether it held the lock at some point.
    pub owned: bool,
    /// The child (the main process).
    pub child: Child,
    /// The main process's descendant.
    pub desc: Desc,
    /// Whether the main process was sent a stop signal (for T1).
    pub main_termed: bool,
    /// A stray signal reached a process of the workload.
    pub stray_relayed: bool,
    /// SIGKILL was sent to the workload.
    pub kill_sent: bool,
    /// What CURRENT holds.
    pub current: Current,
    /// A publish was asked for and is not durable yet.
    pub publish_pending: bool,
    /// Signals still to arrive.
    pub signals_left: u8,
    /// Signals waiting to be delivered, oldest first.
    pub queue: [Option<Queued>; 2],
    /// Signals delivered (bit per signal) — what an outcome may name.
    pub delivered: u8,
    /// Stop signals delivered while draining.
    pub delivered_draining: u8,
    /// The host requested a drain / the root was lost / residencies were reported settled.
    pub drain_fed: bool,
    /// See `drain_fed`.
    pub root_lost_fed: bool,
    /// See `drain_fed`.
    pub settle_fed: bool,
    /// The lease was lost (`lease-lost` fed): from then on nothing may be published or
    /// released.
    pub lost: bool,
    /// Whether the drain hook ran before the owner was ready (card H2).
    pub early_drain: bool,
    /// Times the drain hook ran in this run (a run has at most one ownership; a drain begun
    /// before the lease belongs to the ownership that follows, card H2).
    pub drains_begun: u8,
    /// End records written.
    pub end_records: u8,
    /// The recorded outcome and the process's exit code.
    pub exit: Option<(Outcome, u8)>,
    /// The first terminal phase reached (for I6).
    pub ended: Option<PhaseKind>,
    /// What the world is owed: obligations created by an event and discharged by an action
    /// (bit set; `OWE_*`). The obligation properties are checked against them as the trace of
    /// events and actions unfolds: an obligation still owed when its step ends or when a
    /// forbidden action runs is a violation. Each is discharged within the step or, for a
    /// refusal, at the exit, so in a correct run they are a function of the rest of the state
    /// and add no states.
    pub owed: u8,
    /// The watchdog expired (the workload missed a ping); forgotten once the machine is
    /// terminal.
    pub watchdog_fired: bool,
    /// Violations recorded by steps (bit set).
    pub violations: u16,
}

/// A step of the signal world.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SignalAction {
    /// The driver executes the next action of its step.
    Exec,
    /// The world answers the outstanding request with this event.
    Answer(Event),
    /// A stop signal arrives (queued).
    Arrive(Signal),
    /// The oldest queued signal is delivered.
    Deliver,
    /// A stray signal arrives (queued).
    ArriveStray,
    /// The child is spawned, with this descendant (or none).
    Spawned(Option<Nature>),
    /// The descendant ends (by itself, or after SIGKILL).
    DescExits,
    /// The driver sees that the last process of the tree is gone.
    TreeGone,
    /// The ready workload sends `WATCHDOG=1`.
    Ping,
    /// An armed timer fires.
    Fire(Timer),
    /// The child sends `READY=1`.
    Ready,
    /// The child sends `STOPPING=1`.
    Stopping,
    /// The child exits (or dies) and is reaped with this status.
    Exit(ChildStatus),
    /// The host requests a drain.
    Drain,
    /// The state dir is moved away.
    RootLost,
    /// The host's residencies settle.
    Settle,
    /// The cluster lease is lost (it expired, or was not kept alive in time).
    LoseLease,
}

fn bit(s: Signal) -> u8 {
    match s {
        Signal::Term => 1,
        Signal::Int => 2,
        Signal::Hup => 4,
    }
}

impl SignalState {
    fn enqueue(&mut self, q: Queued) {
        self.signals_left -= 1;
        match self.queue {
            [None, _] => self.queue[0] = Some(q),
            [Some(_), None] => self.queue[1] = Some(q),
            [Some(_), Some(_)] => {}
        }
    }

    fn feed(&mut self, ev: Event) {
        match self.drv.feed(ev) {
            Ok(_) => {
                if self.drv.machine().is_terminal() {
                    if self.ended.is_none() {
                        self.ended = Some(self.drv.machine().kind());
                    }
                    // A terminal machine publishes nothing more: what only a publish needs is
                    // forgotten, so equal ends stay one state.
                    self.watchdog_fired = false;
                }
            }
            Err(_) => self.violations |= V_ILLEGAL,
        }
        self.settle_step();
    }

    /// Once every action of a step ran, the obligations due within the step must have been
    /// discharged.
    fn settle_step(&mut self) {
        if !self.drv.todo().is_empty() || self.owed & OWE_IN_STEP == 0 {
            return;
        }
        for (owed, violation) in [
            (OWE_CANCEL, V_CANCEL),
            (OWE_FORWARD, V_FORWARD),
            (OWE_RELAY, V_RELAY),
            (OWE_KILL, V_LOST),
        ] {
            if self.owed & owed != 0 {
                self.violations |= violation;
            }
        }
        self.owed &= !OWE_IN_STEP;
    }

    /// The obligations a stop signal creates, from the phase it is fed in (cards G1, G3, G4).
    fn owe_for_stop(&mut self) {
        let child = matches!(
            self.drv.machine().config().workload,
            tenure::machine::Workload::Child(_)
        );
        match self.drv.machine().phase() {
            Phase::Cold { .. } => self.owed |= OWE_CANCEL,
            // Not yet abandoned: an abandoned recovery already ends refused.
            Phase::Recovering { outcome: None, .. } => self.owed |= OWE_REFUSE,
            Phase::Ready { .. } if child => self.owed |= OWE_FORWARD,
            Phase::Recovering { .. }
            | Phase::Ready { .. }
            | Phase::Draining { .. }
            | Phase::Released(_)
            | Phase::Cancelled(_)
            | Phase::Refused(_) => {}
        }
    }

    /// Card G4 (R1 for the record): what a publish needs to have happened first.
    fn clean_for_publish(&self) -> bool {
        match self.drv.machine().config().workload {
            tenure::machine::Workload::Child(_) => {
                self.child == Child::Reaped(ChildStatus::Exited(0))
                    && !self.kill_sent
                    && !self.watchdog_fired
            }
            tenure::machine::Workload::InProcess => self.settle_fed,
        }
    }

    fn child_running(&self) -> bool {
        matches!(self.child, Child::Running { .. })
    }

    /// Whether any process of the workload runs.
    fn workload_running(&self) -> bool {
        self.child_running() || self.desc.alive()
    }

    /// The world's side of releasing the lease, with the checks of I7 and I8.
    fn release(&mut self) {
        if !self.lock {
            return;
        }
        if self.workload_running() {
            self.violations |= V_CHILD;
        }
        if self.publish_pending {
            self.violations |= V_DURABLE;
        }
        self.lock = false;
    }

    fn end_record(&mut self, o: Outcome, code: u8) {
        self.end_records += 1;
        self.exit = Some((o, code));
        let record = o.summary();
        let spec_ok = ExitTable::spec().code_of(&record) == Ok(code);
        if !spec_ok || code != o.code() || !self.truthful(o) {
            self.violations |= V_CODE;
        }
    }

    /// The outcome says only what happened: a signal it names was delivered, a child status it
    /// names is the reaped one, `killed` means SIGKILL was sent, and a cancelled or busy run
    /// never owned the lease.
    fn truthful(&self, o: Outcome) -> bool {
        let signal_ok = o.signal.is_none_or(|s| self.delivered & bit(s) != 0);
        let child_ok = o.child.is_none_or(|c| self.child == Child::Reaped(c));
        // `killed` means SIGKILL was sent to the workload.
        let killed_ok = !o.killed || self.kill_sent;
        let owned_ok = !matches!(o.reason, Reason::Cancelled | Reason::Busy) || !self.owned;
        signal_ok && child_ok && killed_ok && owned_ok
    }
}

impl Model for SignalModel {
    type State = SignalState;
    type Action = SignalAction;

    fn init_states(&self) -> Vec<SignalState> {
        self.workloads
            .iter()
            .map(|c| {
                let mut s = SignalState {
                    drv: Driver::new(*c),
                    lock: false,
                    owned: false,
                    child: Child::None,
                    desc: Desc::None,
                    main_termed: false,
                    stray_relayed: false,
                    kill_sent: false,
                    current: Current::Old,
                    publish_pending: false,
                    signals_left: self.signals,
                    queue: [None; 2],
                    delivered: 0,
                    delivered_draining: 0,
                    drain_fed: false,
                    root_lost_fed: false,
                    settle_fed: false,
                    lost: false,
                    early_drain: false,
                    drains_begun: 0,
                    end_records: 0,
                    exit: None,
                    ended: None,
                    owed: 0,
                    watchdog_fired: false,
                    violations: 0,
                };
                s.feed(Event::Start);
                s
            })
            .collect()
    }

    fn actions(&self, s: &SignalState, out: &mut Vec<SignalAction>) {
        // A signal can arrive at any moment, even after the run ended (it then changes nothing).
        if s.signals_left > 0 && !s.drv.exited() {
            for sig in Signal::ALL {
                out.push(SignalAction::Arrive(sig));
            }
            out.push(SignalAction::ArriveStray);
        }
        if s.drv.peek().is_some() {
            out.push(SignalAction::Exec);
        }
        let notify = matches!(
            s.drv.machine().config().workload,
            tenure::machine::Workload::Child(ReadyMode::Notify)
        );
        if !s.drv.between_steps() {
            return;
        }
        // Every request outstanding gets every answer the world could give (a faulty step can
        // leave two owed; the world answers them in either order).
        for r in s.drv.requests() {
            match r {
                Request::Acquire { busy } => {
                    out.push(SignalAction::Answer(Event::LeaseGranted { epoch: 1 }));
                    if busy {
                        out.push(SignalAction::Answer(Event::WaitExpired));
                    } else {
                        out.push(SignalAction::Answer(Event::LeaseBusy));
                        out.push(SignalAction::Answer(Event::LeaseFailed(Fault::Io)));
                    }
                }
                Request::Recover => {
                    out.push(SignalAction::Answer(Event::RecoveryDone));
                    out.push(SignalAction::Answer(Event::RecoveryFailed(Fault::State)));
                }
                Request::Spawn => {
                    out.push(SignalAction::Spawned(None));
                    for n in [Nature::Ends, Nature::IgnoresTerm, Nature::Unkillable] {
                        out.push(SignalAction::Spawned(Some(n)));
                    }
                    out.push(SignalAction::Answer(Event::SpawnFailed(
                        ExecFailure::NotFound,
                    )));
                    out.push(SignalAction::Answer(Event::SpawnFailed(
                        ExecFailure::NotExecutable,
                    )));
                }
                Request::Publish => {
                    out.push(SignalAction::Answer(Event::CheckpointPublished));
                    out.push(SignalAction::Answer(Event::CheckpointSkipped));
                    out.push(SignalAction::Answer(Event::CheckpointFailed));
                }
                Request::Release => out.push(SignalAction::Answer(Event::LeaseReleased)),
            }
        }
        // The driver delivers a queued signal whenever the core admits one (not while the
        // synchronous spawn is outstanding).
        let admitted = s.drv.admits(Event::Stop(Signal::Term)).is_ok();
        if s.queue[0].is_some() && (admitted || self.is(Mutation::SignalDuringSpawn)) {
            out.push(SignalAction::Deliver);
        }
        if !admitted {
            return;
        }
        // The driver sees the child (its exit through the pidfd, its datagrams on the notify
        // socket) between steps; when exactly the child acted before that is immaterial.
        if let Child::Running {
            killed,
            ready,
            stopping,
            ..
        } = s.child
        {
            if killed {
                out.push(SignalAction::Exit(ChildStatus::Signaled(9)));
            } else {
                out.push(SignalAction::Exit(ChildStatus::Exited(0)));
                out.push(SignalAction::Exit(ChildStatus::Exited(3)));
                // Killed by someone else (SIGABRT): exit code 134.
                out.push(SignalAction::Exit(ChildStatus::Signaled(6)));
                if notify && !ready {
                    out.push(SignalAction::Ready);
                }
                if notify && !stopping {
                    out.push(SignalAction::Stopping);
                }
                if notify && ready && s.drv.machine().kind() == PhaseKind::Ready {
                    out.push(SignalAction::Ping);
                }
            }
        }
        if let Desc::Alive { nature, killed, .. } = s.desc {
            let can_end = match nature {
                Nature::Ends => true,
                // Killed at once when SIGKILL was sent (see `exec`); never by itself.
                Nature::IgnoresTerm => false,
                Nature::Unkillable => killed,
            };
            if can_end {
                out.push(SignalAction::DescExits);
            }
        }
        if s.drv.child() == ChildView::Tree && !s.desc.alive() {
            out.push(SignalAction::TreeGone);
        }
        for t in s.drv.armed_timers() {
            out.push(SignalAction::Fire(t));
        }
        let in_process = matches!(
            s.drv.machine().config().workload,
            tenure::machine::Workload::InProcess
        );
        if in_process && !s.drain_fed {
            out.push(SignalAction::Drain);
        }
        if !s.root_lost_fed && s.drv.machine().kind().owns() {
            out.push(SignalAction::RootLost);
        }
        if !s.settle_fed && s.drv.admits(Event::ResidenciesSettled).is_ok() {
            out.push(SignalAction::Settle);
        }
        if !s.lost && s.drv.admits(Event::LeaseLost).is_ok() {
            out.push(SignalAction::LoseLease);
        }
    }

    fn next_state(&self, s: &SignalState, action: SignalAction) -> Option<SignalState> {
        let mut s = s.clone();
        match action {
            SignalAction::Exec => self.exec(&mut s),
            SignalAction::Answer(ev) => {
                match ev {
                    Event::LeaseGranted { .. } => {
                        s.lock = true;
                        s.owned = true;
                    }
                    Event::CheckpointPublished => {
                        s.current = Current::New;
                        s.publish_pending = false;
                    }
                    Event::CheckpointSkipped | Event::CheckpointFailed => {
                        s.publish_pending = false;
                    }
                    Event::LeaseReleased => s.release(),
                    _ => {}
                }
                s.feed(ev);
            }
            SignalAction::Spawned(nature) => {
                s.child = Child::Running {
                    signalled: false,
                    killed: false,
                    ready: false,
                    stopping: false,
                };
                s.desc = match nature {
                    Some(nature) => Desc::Alive {
                        nature,
                        termed: false,
                        killed: false,
                    },
                    None => Desc::None,
                };
                s.feed(Event::ChildSpawned);
            }
            SignalAction::Arrive(sig) => s.enqueue(Queued::Stop(sig)),
            SignalAction::ArriveStray => s.enqueue(Queued::Stray),
            SignalAction::Deliver => {
                let q = s.queue[0]?;
                s.queue = [s.queue[1], None];
                match q {
                    Queued::Stop(sig) => {
                        s.delivered |= bit(sig);
                        if s.drv.machine().kind() == PhaseKind::Draining {
                            s.delivered_draining += 1;
                        }
                        s.owe_for_stop();
                        s.feed(Event::Stop(sig));
                    }
                    Queued::Stray => {
                        let before = s.drv.machine().is_terminal();
                        // Card T3: a signal for a workload that runs reaches it.
                        if s.workload_running() && s.drv.machine().kind().owns() {
                            s.owed |= OWE_RELAY;
                        }
                        s.feed(Event::Stray(USR1));
                        if !before && s.drv.machine().is_terminal() {
                            s.violations |= V_STRAY;
                        }
                    }
                }
            }
            SignalAction::Fire(t) => {
                if t == Timer::Watchdog {
                    s.watchdog_fired = true;
                }
                s.feed(Event::TimerExpired(t));
            }
            SignalAction::Ready => {
                if let Child::Running { ref mut ready, .. } = s.child {
                    *ready = true;
                }
                s.feed(Event::ChildReady);
            }
            SignalAction::Stopping => {
                if let Child::Running {
                    ref mut stopping, ..
                } = s.child
                {
                    *stopping = true;
                }
                s.feed(Event::ChildStopping);
            }
            SignalAction::Ping => s.feed(Event::ChildWatchdog),
            SignalAction::Exit(status) => {
                s.child = Child::Reaped(status);
                // The driver tells "the whole workload ended" from "the main process ended and
                // left processes behind" (the mutant does not).
                if s.desc.alive() && !self.is(Mutation::ReleaseBeforeTree) {
                    s.feed(Event::MainExited(status));
                } else {
                    s.feed(Event::ChildExited(status));
                }
            }
            SignalAction::DescExits => s.desc = Desc::Dead,
            SignalAction::TreeGone => s.feed(Event::TreeEmpty),
            SignalAction::Drain => {
                s.drain_fed = true;
                s.feed(Event::DrainRequested);
            }
            SignalAction::RootLost => {
                s.root_lost_fed = true;
                s.feed(Event::RootLost);
            }
            SignalAction::Settle => {
                s.settle_fed = true;
                s.feed(Event::ResidenciesSettled);
            }
            SignalAction::LoseLease => {
                // Another owner may take the lease from now on: this one holds nothing.
                s.lost = true;
                s.lock = false;
                // Its workload is owed SIGKILL in this step, unless it already got it.
                if s.workload_running() && !s.kill_sent {
                    s.owed |= OWE_KILL;
                }
                s.feed(Event::LeaseLost);
            }
        }
        Some(s)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            // I7: checked whenever the lease is released: no child that may still run.
            Property::always(LEASE_OUTLIVES_WORKLOAD, |_, s: &SignalState| {
                s.violations & V_CHILD == 0
            }),
            Property::sometimes("killed after grace", |_, s: &SignalState| {
                s.exit.is_some_and(|(o, _)| o.reason == Reason::Killed) && !s.lock
            }),
            Property::sometimes("did not stop, reaped later", |_, s: &SignalState| {
                s.exit.is_some_and(|(o, _)| o.reason == Reason::DidNotStop)
            }),
            Property::sometimes(
                "a descendant outlives the main process, then the lease",
                |_, s: &SignalState| {
                    matches!(s.child, Child::Reaped(_))
                        && matches!(s.desc, Desc::Dead)
                        && s.ended == Some(PhaseKind::Released)
                        && s.exit.is_some_and(|(o, _)| o.child.is_some())
                },
            ),
            // T1: with `--kill-mode tree` nothing is SIGKILLed that was not asked to stop.
            Property::always(TERM_BEFORE_KILL, |_, s: &SignalState| {
                s.violations & V_TERM == 0
            }),
            Property::sometimes(
                "a descendant ignoring TERM is killed",
                |_, s: &SignalState| {
                    s.exit.is_some_and(|(o, _)| o.reason == Reason::Killed)
                        && s.child == Child::Reaped(ChildStatus::Exited(0))
                },
            ),
            // T3: a stray signal is relayed, never an end.
            Property::always(STRAYS_SURVIVED, |_, s: &SignalState| {
                s.violations & V_STRAY == 0
            }),
            Property::sometimes(
                "a stray signal reaches the workload",
                |_, s: &SignalState| s.stray_relayed,
            ),
            Property::sometimes(
                "a missed watchdog ping stops the workload",
                |_, s: &SignalState| s.exit.is_some_and(|(o, _)| o.reason == Reason::Watchdog),
            ),
            // I8: checked whenever the lease is released: no publish asked for and not durable.
            Property::always(CHECKPOINT_BEFORE_RELEASE, |_, s: &SignalState| {
                s.violations & V_DURABLE == 0
            }),
            Property::sometimes("drain publishes, then releases", |_, s: &SignalState| {
                s.current == Current::New && s.ended == Some(PhaseKind::Released)
            }),
            // I9: a refused run never moves CURRENT (a lost lease may end a run after a publish
            // its lease still fenced; `LEASE_LOST_STOPS` checks that nothing follows the loss).
            Property::always(REFUSED_KEEPS_CURRENT, |_, s: &SignalState| {
                !s.drv.machine().phase().outcome().is_some_and(|o| {
                    o.reason == Reason::Refused
                        && o.refusal != Some(tenure::machine::Refusal::LeaseLost)
                }) || s.current == Current::Old
            }),
            Property::sometimes(
                "refused by a signal while recovering",
                |_, s: &SignalState| {
                    s.drv.machine().phase().outcome().is_some_and(|o| {
                        o.reason == Reason::Refused
                            && matches!(o.refusal, Some(tenure::machine::Refusal::Signal(_)))
                    })
                },
            ),
            // I10: exactly one end record once the run exited, never more.
            Property::always(ONE_OUTCOME, |_, s: &SignalState| {
                s.end_records <= 1 && (!s.drv.exited() || s.end_records == 1)
            }),
            // I10: the exit code is Outcome::code, the spec table's code, and the outcome is true.
            Property::always(EXIT_CODE_PER_SPEC, |_, s: &SignalState| {
                s.violations & V_CODE == 0
            }),
            Property::sometimes("child's exit code passed through", |_, s: &SignalState| {
                s.exit.is_some_and(|(_, code)| code == 3)
            }),
            Property::sometimes("cancelled while waiting", |_, s: &SignalState| {
                s.exit
                    .is_some_and(|(o, code)| o.reason == Reason::Cancelled && code >= 129)
            }),
            // I11: the drain hook runs at most once per ownership.
            Property::always(DRAIN_ONCE, |_, s: &SignalState| s.drains_begun <= 1),
            Property::sometimes("drain requested before recovery", |_, s: &SignalState| {
                s.early_drain && s.ended == Some(PhaseKind::Released)
            }),
            Property::sometimes("two signals while draining", |_, s: &SignalState| {
                s.delivered_draining == 2
            }),
            // I6: once terminal, the machine stays in that phase.
            Property::always(TERMINAL_IS_FINAL, |_, s: &SignalState| {
                s.ended.is_none_or(|k| k == s.drv.machine().kind())
            }),
            Property::sometimes("readiness timed out", |_, s: &SignalState| {
                s.exit.is_some_and(|(o, _)| {
                    o.refusal == Some(tenure::machine::Refusal::ReadinessTimedOut)
                })
            }),
            Property::always(LEGAL_EVENTS, |_, s: &SignalState| {
                s.violations & V_ILLEGAL == 0
            }),
            // The obligations of the cards, checked against the world's trace of events and
            // actions as it unfolds (`owed`); each has its example beside it.
            Property::always(STOP_COLD_CANCELS, |_, s: &SignalState| {
                s.violations & V_CANCEL == 0
            }),
            Property::always(STOP_RECOVERING_REFUSES, |_, s: &SignalState| {
                s.violations & V_REFUSE == 0
            }),
            Property::always(STOP_FORWARDED_BEFORE_KILL, |_, s: &SignalState| {
                s.violations & V_FORWARD == 0
            }),
            Property::sometimes(
                "a forwarded stop ends the workload",
                |_, s: &SignalState| {
                    s.exit.is_some_and(|(o, _)| {
                        o.reason == Reason::Stopped
                            && o.signal.is_some()
                            && o.child == Some(ChildStatus::Exited(0))
                            && !o.killed
                    })
                },
            ),
            Property::always(PUBLISH_AFTER_CLEAN_EXIT, |_, s: &SignalState| {
                s.violations & V_CLEAN == 0
            }),
            Property::sometimes(
                "a failed workload keeps the old checkpoint",
                |_, s: &SignalState| {
                    s.exit.is_some_and(|(o, _)| {
                        o.reason == Reason::Exited && o.child == Some(ChildStatus::Exited(3))
                    }) && s.current == Current::Old
                },
            ),
            Property::always(STRAY_RELAYED, |_, s: &SignalState| {
                s.violations & V_RELAY == 0
            }),
            Property::always(HOOK_BEFORE_DRAINING, |_, s: &SignalState| {
                s.violations & V_HOOK == 0
            }),
            Property::sometimes("an in-process drain runs its hook", |_, s: &SignalState| {
                s.settle_fed && s.drains_begun == 1 && s.ended == Some(PhaseKind::Released)
            }),
            Property::always(LEASE_LOST_STOPS, |_, s: &SignalState| {
                s.violations & V_LOST == 0
            }),
            Property::sometimes(
                "a lost lease kills the ready workload",
                |_, s: &SignalState| {
                    s.exit.is_some_and(|(o, _)| {
                        o.refusal == Some(tenure::machine::Refusal::LeaseLost) && o.killed
                    })
                },
            ),
            Property::sometimes(
                "stop while spawning waits for the spawn",
                |_, s: &SignalState| {
                    s.drv.request() == Some(Request::Spawn) && s.queue[0].is_some()
                },
            ),
        ]
    }
}

impl SignalModel {
    /// Executes the next action against the world (or, in a mutant, mis-executes it).
    fn exec(&self, s: &mut SignalState) {
        let Some(a) = s.drv.pop() else {
            return;
        };
        match a {
            Action::AcquireLease | Action::AbandonAcquire | Action::Recover => {}
            Action::SpawnChild => {}
            Action::SetPhase(k) => {
                // Card H2: the hook ran before the owner says it drains.
                if k == PhaseKind::Draining && s.drains_begun == 0 {
                    s.violations |= V_HOOK;
                }
                if k == PhaseKind::Draining && self.is(Mutation::BeginDrainOnSetPhase) {
                    s.drains_begun += 1;
                }
            }
            Action::BeginDrain => {
                s.drains_begun += 1;
                if matches!(
                    s.drv.machine().kind(),
                    PhaseKind::Cold | PhaseKind::Recovering
                ) {
                    s.early_drain = true;
                }
            }
            Action::Forward(_, target) => {
                s.owed &= !OWE_FORWARD;
                if let Child::Running {
                    ref mut signalled, ..
                } = s.child
                {
                    *signalled = true;
                    s.main_termed = true;
                }
                let to_tree = target == Target::Tree && !self.is(Mutation::TermToMainOnly);
                if to_tree && let Desc::Alive { ref mut termed, .. } = s.desc {
                    *termed = true;
                }
            }
            Action::Relay(..) => {
                s.owed &= !OWE_RELAY;
                if s.workload_running() {
                    s.stray_relayed = true;
                }
            }
            Action::Kill => {
                // Cards G4, G6: the stop signal reached the workload before any SIGKILL.
                if s.owed & OWE_FORWARD != 0 {
                    s.violations |= V_FORWARD;
                }
                // T1 (kill mode tree): every process that gets SIGKILL was asked to stop first
                // — unless the lease was lost, which kills at once (issue 14).
                if s.drv.machine().config().kill_mode == KillMode::Tree && !s.lost {
                    let main_unasked = s.child_running() && !s.main_termed;
                    let desc_unasked = matches!(s.desc, Desc::Alive { termed: false, .. });
                    if main_unasked || desc_unasked {
                        s.violations |= V_TERM;
                    }
                }
                s.kill_sent = true;
                s.owed &= !OWE_KILL;
                if let Child::Running { ref mut killed, .. } = s.child {
                    *killed = true;
                }
                s.desc = match s.desc {
                    Desc::Alive {
                        nature: Nature::Unkillable,
                        termed,
                        ..
                    } => Desc::Alive {
                        nature: Nature::Unkillable,
                        termed,
                        killed: true,
                    },
                    Desc::Alive { .. } => Desc::Dead,
                    d @ (Desc::None | Desc::Dead) => d,
                };
                if self.is(Mutation::ReleaseOnKill) {
                    s.release();
                }
            }
            Action::Publish => {
                // Card G3: nothing is published after a stop while recovering.
                if s.owed & OWE_REFUSE != 0 {
                    s.violations |= V_REFUSE;
                }
                // Issue 14: nothing is published once the lease is lost.
                if s.lost {
                    s.violations |= V_LOST;
                }
                if !s.clean_for_publish() {
                    s.violations |= V_CLEAN;
                }
                if self.is(Mutation::ReleaseBeforePublish) {
                    s.publish_pending = true;
                    s.release();
                }
                s.publish_pending = true;
            }
            Action::ReleaseLease => {
                // A lost lease is not released: there is nothing left to release.
                if s.lost {
                    s.violations |= V_LOST;
                }
                if self.is(Mutation::PublishOnRelease) {
                    s.current = Current::New;
                }
            }
            Action::Note(n) => {
                if self.is(Mutation::DoubleEndRecord)
                    && matches!(
                        n,
                        Note::Released | Note::Refused | Note::Cancelled | Note::Busy
                    )
                    && let Some(o) = s.drv.machine().phase().outcome()
                {
                    s.end_record(o, o.code());
                }
            }
            Action::Exit(o) => {
                // Cards G1, G3: the end a stop before owning or while recovering owed.
                if s.owed & OWE_CANCEL != 0 && o.reason == Reason::Cancelled && !s.owned {
                    s.owed &= !OWE_CANCEL;
                }
                // (A refused run may end `did not stop`: its phase is what says it refused.)
                if s.owed & OWE_REFUSE != 0 {
                    if s.drv.machine().kind() != PhaseKind::Refused || o.code() == 0 {
                        s.violations |= V_REFUSE;
                    }
                    s.owed &= !OWE_REFUSE;
                }
                // Issue 14: a run that lost its lease says so in its outcome and exit code.
                if s.lost && o.refusal != Some(tenure::machine::Refusal::LeaseLost) {
                    s.violations |= V_LOST;
                }
                let code = if self.is(Mutation::ExitCodeFromSignal) {
                    o.signal.map_or(o.code(), Signal::exit_code)
                } else {
                    o.code()
                };
                s.end_record(o, code);
                if self.is(Mutation::RetryAfterBusy) && o.reason == Reason::Busy {
                    s.drv.restart_machine();
                    s.feed(Event::Start);
                }
            }
            Action::ArmTimer(..)
            | Action::DisarmTimer(_)
            | Action::ExtendTimer(..)
            | Action::NotifyReady
            | Action::NotifyStopping => {}
        }
        s.settle_step();
    }
}

/// The event a step feeds the machine, if it feeds one (the mutants' extra feeds aside). The
/// trace conformance tests turn model paths into traces with it.
pub fn fed_event(s: &SignalState, a: SignalAction) -> Option<Event> {
    match a {
        SignalAction::Answer(ev) => Some(ev),
        SignalAction::Spawned(_) => Some(Event::ChildSpawned),
        SignalAction::Deliver => s.queue[0].map(|q| match q {
            Queued::Stop(sig) => Event::Stop(sig),
            Queued::Stray => Event::Stray(USR1),
        }),
        SignalAction::Fire(t) => Some(Event::TimerExpired(t)),
        SignalAction::Ready => Some(Event::ChildReady),
        SignalAction::Stopping => Some(Event::ChildStopping),
        SignalAction::Exit(st) => Some(if s.desc.alive() {
            Event::MainExited(st)
        } else {
            Event::ChildExited(st)
        }),
        SignalAction::TreeGone => Some(Event::TreeEmpty),
        SignalAction::Ping => Some(Event::ChildWatchdog),
        SignalAction::Drain => Some(Event::DrainRequested),
        SignalAction::RootLost => Some(Event::RootLost),
        SignalAction::Settle => Some(Event::ResidenciesSettled),
        SignalAction::LoseLease => Some(Event::LeaseLost),
        SignalAction::Exec
        | SignalAction::Arrive(_)
        | SignalAction::ArriveStray
        | SignalAction::DescExits => None,
    }
}

impl crate::run::Describe for SignalModel {
    fn describe(&self, path: &[(SignalState, Option<SignalAction>)]) -> Vec<String> {
        let mut lines = Vec::new();
        if let Some((s, _)) = path.first() {
            lines.push(format!("workload {:?}", s.drv.machine().config().workload));
        }
        for (s, a) in path {
            let Some(a) = a else { continue };
            lines.push(match a {
                SignalAction::Exec => match s.drv.peek() {
                    Some(x) => format!("execute {x}   [{}]", s.drv.machine().phase().label()),
                    None => "execute nothing".into(),
                },
                SignalAction::Answer(ev) => format!("answer {ev}"),
                SignalAction::Arrive(sig) => format!("{sig} arrives"),
                SignalAction::ArriveStray => "SIGUSR1 arrives".into(),
                SignalAction::Spawned(n) => format!("the child is spawned (descendant: {n:?})"),
                SignalAction::DescExits => "the descendant ends".into(),
                SignalAction::TreeGone => "the driver sees the tree empty".into(),
                SignalAction::Ping => "child sends WATCHDOG=1".into(),
                SignalAction::Deliver => format!("deliver {:?}", s.queue[0]),
                SignalAction::Fire(t) => format!("timer {t:?} fires"),
                SignalAction::Ready => "child sends READY=1".into(),
                SignalAction::Stopping => "child sends STOPPING=1".into(),
                SignalAction::Exit(st) => format!("child exits: {st}"),
                SignalAction::Drain => "host requests drain".into(),
                SignalAction::RootLost => "state dir moved".into(),
                SignalAction::Settle => "residencies settle".into(),
                SignalAction::LoseLease => "the lease is lost".into(),
            });
        }
        lines
    }
}

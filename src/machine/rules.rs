//! The transition rules, carried by statig: the only place a phase changes.
//!
//! The lifecycle is a hierarchical state machine. Leaf states are the steps of a phase and keep
//! the data of that step (epoch, pending drain, outcome, how far a stop went, what of the
//! workload runs); superstates hold what their children have in common and receive their
//! children's fields by reference:
//!
//! ```text
//! root                          every event nobody handled: a typed rejection
//! ├── cold {drain_pending}      stop → cancelled; drain requested → pending (H2); strays ignored
//! │   ├── idle                  start → acquiring
//! │   └── locking               lease granted / wait expired / lease failed; a stop abandons the wait
//! │       ├── acquiring         entry: acquire-lease
//! │       └── waiting           entry: note(waiting)
//! ├── owning {epoch}            entry: note(owned); a stop, drain request or moved root nobody
//! │   │                         narrower acts on is ignored (the end already began); strays that
//! │   │                         reach no workload are ignored
//! │   ├── recovering {drain_pending}  drain requested → pending (H2); stop or moved root → refused
//! │   │   ├── verifying         entry: recover
//! │   │   ├── spawning          entry: spawn-child; nothing else can arrive
//! │   │   └── awaiting {running}  entry: arm(readiness); readiness, forking daemons (T4)
//! │   ├── ready {running}       entry: set-phase, note, notify-ready, arm(watchdog)
//! │   ├── stopping {outcome, stop, running}  grace → SIGKILL → kill wait, the rest of a tree (T1),
//! │   │   │                     strays relayed (T3), extend-timeout, late notifications
//! │   │   ├── aborting {drain_pending}  entry: the stop step; gone → abort-releasing
//! │   │   └── drain-stopping {cause}    entry: the stop step; gone → publish only after exit 0
//! │   ├── abort-releasing {drain_pending, outcome}  entry: release-lease; released → refused
//! │   └── closing               notifications of a workload that no longer runs are ignored
//! │       │                     (its steps keep the drain's cause and outcome)
//! │       ├── settling          entry: arm(grace) (in-process, H4)
//! │       ├── unsettled
//! │       ├── publishing        entry: publish
//! │       └── drain-releasing   entry: release-lease; released → released
//! └── terminal {outcome}        entry: exit(outcome), always the last action
//!     ├── released
//!     ├── cancelled
//!     └── refused
//! ```
//!
//! Entry actions issue the request a state waits for, so every way into a state issues it the
//! same way. An event goes to the leaf first; a handler that does not act on it returns `Super`
//! and its superstate decides. The root handles every event and never returns `Super`: an event
//! nobody acted on is rejected, recorded in the [`Reply`] and returned by
//! [`super::Machine::handle`] as a typed [`super::Rejected`], never dropped. Every handler that
//! matches on the event lists every event (no `_ =>`), so adding an event breaks the build
//! wherever a decision is missing (as rustls does).
//!
//! [`step`] runs one event the way the api notes record: the stored state is put into a fresh
//! statig machine, which is initialised (statig enters the state again, see [`Reply`]), handles
//! the event and is read back. Nothing here reads a clock, does I/O or panics.

use super::action::{Action, DrainCause, Note, Outcome, Reason, Refusal, Target};
use super::event::{ChildStatus, Event, Fault, Signal, Timer};
use super::{
    ChildStop, ColdStep, Config, DrainStep, HupPolicy, KillMode, Phase, PhaseKind, ReadyMode,
    RecoveryStep, Running, Workload,
};
use crate::mutant;
use statig::Outcome::{Handled, Super, Transition};
use statig::blocking::IntoStateMachineExt as _;

/// What a handler returns: handled here, deferred to the superstate, or a transition.
type Response = statig::Outcome<State>;

/// What the rules decided for one event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// The state moved (possibly to itself) and the collected actions are to be executed.
    Moved,
    /// The spec says: ignored here.
    Ignored,
    /// Illegal here: nobody handled the event.
    Rejected,
}

/// The statig context of one step: the actions the handlers and entry actions emit, in order,
/// and the verdict.
#[derive(Debug)]
pub(crate) struct Reply {
    /// What the driver must do, in order.
    pub(crate) actions: Vec<Action>,
    /// What the rules decided.
    pub(crate) verdict: Verdict,
    /// The machine is being restored, not stepped. statig initialises a machine by entering its
    /// state (every entry action from the root down); those actions were emitted when the state
    /// was first entered, so a restore emits nothing.
    restoring: bool,
}

impl Reply {
    fn new(restoring: bool) -> Reply {
        Reply {
            actions: Vec::new(),
            verdict: Verdict::Moved,
            restoring,
        }
    }

    fn emit(&mut self, action: Action) {
        if !self.restoring {
            self.actions.push(action);
        }
    }

    /// The spec ignores this event here: accepted, nothing changes.
    fn ignore(&mut self) -> Response {
        self.verdict = Verdict::Ignored;
        Handled
    }

    /// The event is illegal here.
    fn reject(&mut self) -> Response {
        self.verdict = Verdict::Rejected;
        Handled
    }
}

/// Feed one event to the machine in `state` under `config`: the next state and what was
/// decided, in `reply`. On [`Verdict::Ignored`] and [`Verdict::Rejected`] the caller keeps the
/// state it had.
pub(crate) fn step(config: Config, state: State, event: &Event, reply: &mut Reply) -> State {
    let mut sm = Rules { config }.uninitialized_state_machine();
    *sm.state_mut() = state;
    let mut sm = sm.init_with_context(&mut Reply::new(true));
    sm.handle_with_context(event, reply);
    *sm.state()
}

/// A fresh reply for one step.
pub(crate) fn reply() -> Reply {
    Reply::new(false)
}

/// The shared storage of the statig machine: the configuration, the same in every state.
struct Rules {
    config: Config,
}

#[statig::state_machine(
    initial = "State::idle(false)",
    state(derive(Debug, Clone, Copy, PartialEq, Eq, Hash)),
    visibility = "pub(crate)"
)]
// statig passes each field of a state to its handler as an argument of its own.
#[allow(clippy::too_many_arguments)]
impl Rules {
    // ----- root -----

    /// Every event reaches the root unless a state below acted on it; what reaches it is
    /// illegal in the current state. The root never defers.
    #[superstate]
    fn root(context: &mut Reply, event: &Event) -> Response {
        match event {
            Event::Start
            | Event::LeaseBusy
            | Event::LeaseGranted { .. }
            | Event::WaitExpired
            | Event::LeaseFailed(_)
            | Event::RecoveryDone
            | Event::RecoveryFailed(_)
            | Event::ChildSpawned
            | Event::SpawnFailed(_)
            | Event::ChildReady
            | Event::ChildStopping
            | Event::ChildWatchdog
            | Event::ChildExtendTimeout(_)
            | Event::ChildExited(_)
            | Event::MainExited(_)
            | Event::TreeEmpty
            | Event::MainAdopted
            | Event::Stop(_)
            | Event::Stray(_)
            | Event::DrainRequested
            | Event::RootLost
            | Event::ResidenciesSettled
            | Event::TimerExpired(_)
            | Event::CheckpointPublished
            | Event::CheckpointSkipped
            | Event::CheckpointFailed
            | Event::LeaseReleased
            | Event::LeaseLost => context.reject(),
        }
    }

    // ----- cold -----

    /// Not owning. A stop cancels, a drain request is remembered (card H2), and a signal for
    /// the workload reaches nobody: nothing of it runs before the lease (card T3).
    #[superstate(superstate = "root")]
    fn cold(&self, drain_pending: &mut bool, context: &mut Reply, event: &Event) -> Response {
        match *event {
            Event::Stop(sig) => {
                let mut o = self.outcome(Reason::Cancelled);
                o.signal = Some(sig);
                context.emit(Action::Note(Note::Cancelled));
                Transition(State::Cancelled { outcome: o })
            }
            // Card H2: a drain requested before the lease begins now; the owner then recovers
            // and closes.
            Event::DrainRequested if *drain_pending => context.ignore(),
            Event::DrainRequested => {
                *drain_pending = true;
                context.emit(Action::BeginDrain);
                Handled
            }
            Event::Stray(_) => context.ignore(),
            Event::Start
            | Event::LeaseBusy
            | Event::LeaseGranted { .. }
            | Event::WaitExpired
            | Event::LeaseFailed(_)
            | Event::RecoveryDone
            | Event::RecoveryFailed(_)
            | Event::ChildSpawned
            | Event::SpawnFailed(_)
            | Event::ChildReady
            | Event::ChildStopping
            | Event::ChildWatchdog
            | Event::ChildExtendTimeout(_)
            | Event::ChildExited(_)
            | Event::MainExited(_)
            | Event::TreeEmpty
            | Event::MainAdopted
            | Event::RootLost
            | Event::ResidenciesSettled
            | Event::TimerExpired(_)
            | Event::CheckpointPublished
            | Event::CheckpointSkipped
            | Event::CheckpointFailed
            | Event::LeaseReleased
            | Event::LeaseLost => Super,
        }
    }

    /// Not started.
    #[state(superstate = "cold")]
    fn idle(drain_pending: &bool, event: &Event) -> Response {
        match event {
            Event::Start => Transition(State::Acquiring {
                drain_pending: *drain_pending,
            }),
            Event::LeaseBusy
            | Event::LeaseGranted { .. }
            | Event::WaitExpired
            | Event::LeaseFailed(_)
            | Event::RecoveryDone
            | Event::RecoveryFailed(_)
            | Event::ChildSpawned
            | Event::SpawnFailed(_)
            | Event::ChildReady
            | Event::ChildStopping
            | Event::ChildWatchdog
            | Event::ChildExtendTimeout(_)
            | Event::ChildExited(_)
            | Event::MainExited(_)
            | Event::TreeEmpty
            | Event::MainAdopted
            | Event::Stop(_)
            | Event::Stray(_)
            | Event::DrainRequested
            | Event::RootLost
            | Event::ResidenciesSettled
            | Event::TimerExpired(_)
            | Event::CheckpointPublished
            | Event::CheckpointSkipped
            | Event::CheckpointFailed
            | Event::LeaseReleased
            | Event::LeaseLost => Super,
        }
    }

    /// Taking the lock: the lease's answers end the wait, and a stop first abandons it, then
    /// cancels as in any cold step.
    #[superstate(superstate = "cold")]
    fn locking(&self, drain_pending: &mut bool, context: &mut Reply, event: &Event) -> Response {
        match *event {
            Event::LeaseGranted { epoch } => Transition(State::Verifying {
                epoch,
                drain_pending: *drain_pending,
            }),
            Event::WaitExpired => {
                context.emit(Action::Note(Note::Busy));
                Transition(State::Cancelled {
                    outcome: self.outcome(Reason::Busy),
                })
            }
            Event::LeaseFailed(fault) => {
                let mut o = self.outcome(Reason::Refused);
                o.refusal = Some(refusal_of(fault));
                context.emit(Action::Note(Note::Refused));
                Transition(State::Refused { outcome: o })
            }
            Event::Stop(_) => {
                context.emit(Action::AbandonAcquire);
                Super
            }
            Event::Start
            | Event::LeaseBusy
            | Event::RecoveryDone
            | Event::RecoveryFailed(_)
            | Event::ChildSpawned
            | Event::SpawnFailed(_)
            | Event::ChildReady
            | Event::ChildStopping
            | Event::ChildWatchdog
            | Event::ChildExtendTimeout(_)
            | Event::ChildExited(_)
            | Event::MainExited(_)
            | Event::TreeEmpty
            | Event::MainAdopted
            | Event::Stray(_)
            | Event::DrainRequested
            | Event::RootLost
            | Event::ResidenciesSettled
            | Event::TimerExpired(_)
            | Event::CheckpointPublished
            | Event::CheckpointSkipped
            | Event::CheckpointFailed
            | Event::LeaseReleased
            | Event::LeaseLost => Super,
        }
    }

    /// Trying to take the lock.
    #[state(superstate = "locking", entry_action = "acquire_lease")]
    fn acquiring(drain_pending: &bool, event: &Event) -> Response {
        match event {
            Event::LeaseBusy => Transition(State::Waiting {
                drain_pending: *drain_pending,
            }),
            Event::Start
            | Event::LeaseGranted { .. }
            | Event::WaitExpired
            | Event::LeaseFailed(_)
            | Event::RecoveryDone
            | Event::RecoveryFailed(_)
            | Event::ChildSpawned
            | Event::SpawnFailed(_)
            | Event::ChildReady
            | Event::ChildStopping
            | Event::ChildWatchdog
            | Event::ChildExtendTimeout(_)
            | Event::ChildExited(_)
            | Event::MainExited(_)
            | Event::TreeEmpty
            | Event::MainAdopted
            | Event::Stop(_)
            | Event::Stray(_)
            | Event::DrainRequested
            | Event::RootLost
            | Event::ResidenciesSettled
            | Event::TimerExpired(_)
            | Event::CheckpointPublished
            | Event::CheckpointSkipped
            | Event::CheckpointFailed
            | Event::LeaseReleased
            | Event::LeaseLost => Super,
        }
    }

    #[action]
    fn acquire_lease(context: &mut Reply) {
        context.emit(Action::AcquireLease);
    }

    /// The lock is held by another owner; visible as a waiter.
    #[state(
        superstate = "locking",
        entry_action = "note_waiting",
        local_storage("drain_pending: bool")
    )]
    fn waiting(context: &mut Reply, event: &Event) -> Response {
        match event {
            // The lease reports contention once; a repeat changes nothing.
            Event::LeaseBusy => context.ignore(),
            Event::Stop(_) if mutant::on("stop-while-waiting-ignored") => context.ignore(),
            Event::Start
            | Event::LeaseGranted { .. }
            | Event::WaitExpired
            | Event::LeaseFailed(_)
            | Event::RecoveryDone
            | Event::RecoveryFailed(_)
            | Event::ChildSpawned
            | Event::SpawnFailed(_)
            | Event::ChildReady
            | Event::ChildStopping
            | Event::ChildWatchdog
            | Event::ChildExtendTimeout(_)
            | Event::ChildExited(_)
            | Event::MainExited(_)
            | Event::TreeEmpty
            | Event::MainAdopted
            | Event::Stop(_)
            | Event::Stray(_)
            | Event::DrainRequested
            | Event::RootLost
            | Event::ResidenciesSettled
            | Event::TimerExpired(_)
            | Event::CheckpointPublished
            | Event::CheckpointSkipped
            | Event::CheckpointFailed
            | Event::LeaseReleased
            | Event::LeaseLost => Super,
        }
    }

    #[action]
    fn note_waiting(context: &mut Reply) {
        context.emit(Action::Note(Note::Waiting));
    }

    // ----- owning -----

    /// Owning the lease. Recovering and ready act on a stop, a drain request and a moved root
    /// themselves; below them the end already began (a stopping workload, an abandoned
    /// recovery, the drain), runs to its end exactly once (I11) and ignores them. A signal for
    /// the workload that no state below relays has nobody to reach.
    #[superstate(
        superstate = "root",
        entry_action = "note_owned",
        local_storage("epoch: &'sub u64")
    )]
    fn owning(context: &mut Reply, event: &Event) -> Response {
        match event {
            Event::Stop(_) | Event::DrainRequested | Event::RootLost | Event::Stray(_) => {
                context.ignore()
            }
            Event::Start
            | Event::LeaseBusy
            | Event::LeaseGranted { .. }
            | Event::WaitExpired
            | Event::LeaseFailed(_)
            | Event::RecoveryDone
            | Event::RecoveryFailed(_)
            | Event::ChildSpawned
            | Event::SpawnFailed(_)
            | Event::ChildReady
            | Event::ChildStopping
            | Event::ChildWatchdog
            | Event::ChildExtendTimeout(_)
            | Event::ChildExited(_)
            | Event::MainExited(_)
            | Event::TreeEmpty
            | Event::MainAdopted
            | Event::ResidenciesSettled
            | Event::TimerExpired(_)
            | Event::CheckpointPublished
            | Event::CheckpointSkipped
            | Event::CheckpointFailed
            | Event::LeaseReleased
            | Event::LeaseLost => Super,
        }
    }

    #[action]
    fn note_owned(epoch: &u64, context: &mut Reply) {
        context.emit(Action::Note(Note::Owned(*epoch)));
    }

    // ----- recovering -----

    /// Recovering and not abandoned. The first drain request begins the drain now and the owner
    /// closes as soon as it would have become ready (card H2); a stop or a moved root refuses
    /// (cards G3, H7) and nothing is ever published. Where a workload already runs the step
    /// itself stops it first.
    #[superstate(superstate = "owning")]
    fn recovering(
        &self,
        epoch: &u64,
        drain_pending: &mut bool,
        context: &mut Reply,
        event: &Event,
    ) -> Response {
        match *event {
            Event::DrainRequested if *drain_pending => context.ignore(),
            Event::DrainRequested => {
                *drain_pending = true;
                context.emit(Action::BeginDrain);
                Handled
            }
            Event::Stop(sig) if mutant::on("stop-while-recovering-drains") => self.enter_drain(
                context,
                *epoch,
                DrainCause::Signal(sig),
                *drain_pending,
                None,
            ),
            Event::Stop(sig) => Transition(State::AbortReleasing {
                epoch: *epoch,
                drain_pending: *drain_pending,
                outcome: self.refusal(Refusal::Signal(sig)),
            }),
            Event::RootLost => Transition(State::AbortReleasing {
                epoch: *epoch,
                drain_pending: *drain_pending,
                outcome: self.refusal(Refusal::RootLost),
            }),
            Event::Start
            | Event::LeaseBusy
            | Event::LeaseGranted { .. }
            | Event::WaitExpired
            | Event::LeaseFailed(_)
            | Event::RecoveryDone
            | Event::RecoveryFailed(_)
            | Event::ChildSpawned
            | Event::SpawnFailed(_)
            | Event::ChildReady
            | Event::ChildStopping
            | Event::ChildWatchdog
            | Event::ChildExtendTimeout(_)
            | Event::ChildExited(_)
            | Event::MainExited(_)
            | Event::TreeEmpty
            | Event::MainAdopted
            | Event::Stray(_)
            | Event::ResidenciesSettled
            | Event::TimerExpired(_)
            | Event::CheckpointPublished
            | Event::CheckpointSkipped
            | Event::CheckpointFailed
            | Event::LeaseReleased
            | Event::LeaseLost => Super,
        }
    }

    /// The checkpoint is being read and verified (and, in-process, the host recovers).
    #[state(superstate = "recovering", entry_action = "recover")]
    fn verifying(
        &self,
        epoch: &u64,
        drain_pending: &mut bool,
        context: &mut Reply,
        event: &Event,
    ) -> Response {
        match *event {
            Event::RecoveryDone => match self.config.workload {
                Workload::InProcess => {
                    self.became_ready(context, *epoch, *drain_pending, Running::Main)
                }
                // A drain requested before recovery: no child was started, so close at once.
                Workload::Child(_) if *drain_pending => {
                    self.enter_drain(context, *epoch, DrainCause::Requested, true, None)
                }
                Workload::Child(_) => Transition(State::Spawning {
                    epoch: *epoch,
                    drain_pending: *drain_pending,
                }),
            },
            Event::RecoveryFailed(fault) => {
                context.emit(Action::Note(Note::Refused));
                Transition(State::AbortReleasing {
                    epoch: *epoch,
                    drain_pending: *drain_pending,
                    outcome: self.refusal(refusal_of(fault)),
                })
            }
            // Nothing of the workload runs yet and the lease is gone: the run ends here,
            // releasing nothing. The exit withdraws the recovery still running (the driver
            // stops its worker).
            Event::LeaseLost => {
                context.emit(Action::Note(Note::LeaseLost));
                context.emit(Action::Note(Note::Refused));
                Transition(State::Refused {
                    outcome: self.refusal(Refusal::LeaseLost),
                })
            }
            Event::Start
            | Event::LeaseBusy
            | Event::LeaseGranted { .. }
            | Event::WaitExpired
            | Event::LeaseFailed(_)
            | Event::ChildSpawned
            | Event::SpawnFailed(_)
            | Event::ChildReady
            | Event::ChildStopping
            | Event::ChildWatchdog
            | Event::ChildExtendTimeout(_)
            | Event::ChildExited(_)
            | Event::MainExited(_)
            | Event::TreeEmpty
            | Event::MainAdopted
            | Event::Stop(_)
            | Event::Stray(_)
            | Event::DrainRequested
            | Event::RootLost
            | Event::ResidenciesSettled
            | Event::TimerExpired(_)
            | Event::CheckpointPublished
            | Event::CheckpointSkipped
            | Event::CheckpointFailed
            | Event::LeaseReleased => Super,
        }
    }

    #[action]
    fn recover(context: &mut Reply) {
        context.emit(Action::Recover);
    }

    /// The child is being started.
    #[state(superstate = "recovering", entry_action = "spawn_child")]
    fn spawning(
        &self,
        epoch: &u64,
        drain_pending: &mut bool,
        context: &mut Reply,
        event: &Event,
    ) -> Response {
        match *event {
            Event::ChildSpawned => match self.config.workload {
                Workload::Child(ReadyMode::Start) => {
                    context.emit(Action::Note(Note::Spawned));
                    self.became_ready(context, *epoch, *drain_pending, Running::Main)
                }
                Workload::Child(ReadyMode::Notify | ReadyMode::Forking) => {
                    context.emit(Action::Note(Note::Spawned));
                    Transition(State::Awaiting {
                        epoch: *epoch,
                        drain_pending: *drain_pending,
                        running: Running::Main,
                    })
                }
                Workload::InProcess => Super,
            },
            Event::SpawnFailed(exec) => {
                let mut o = self.outcome(Reason::SpawnFailed);
                o.exec = Some(exec);
                Transition(State::AbortReleasing {
                    epoch: *epoch,
                    drain_pending: *drain_pending,
                    outcome: o,
                })
            }
            // The driver starts the child synchronously and delivers signals between steps,
            // so nothing else can arrive while spawning (a lost lease is noticed after it).
            Event::Stop(_)
            | Event::Stray(_)
            | Event::DrainRequested
            | Event::RootLost
            | Event::LeaseLost => context.reject(),
            Event::Start
            | Event::LeaseBusy
            | Event::LeaseGranted { .. }
            | Event::WaitExpired
            | Event::LeaseFailed(_)
            | Event::RecoveryDone
            | Event::RecoveryFailed(_)
            | Event::ChildReady
            | Event::ChildStopping
            | Event::ChildWatchdog
            | Event::ChildExtendTimeout(_)
            | Event::ChildExited(_)
            | Event::MainExited(_)
            | Event::TreeEmpty
            | Event::MainAdopted
            | Event::ResidenciesSettled
            | Event::TimerExpired(_)
            | Event::CheckpointPublished
            | Event::CheckpointSkipped
            | Event::CheckpointFailed
            | Event::LeaseReleased => Super,
        }
    }

    #[action]
    fn spawn_child(context: &mut Reply) {
        context.emit(Action::SpawnChild);
    }

    /// The child runs and is not ready yet: with the main process running, waiting for
    /// `READY=1` (a forking daemon: for its first process to exit); with only the tree left, a
    /// forking daemon's first process exited 0 and the pid file has not named the main process
    /// yet (card T4). The readiness timer runs from the start of the wait.
    #[state(superstate = "recovering", entry_action = "arm_readiness")]
    fn awaiting(
        &self,
        epoch: &u64,
        drain_pending: &mut bool,
        running: &mut Running,
        context: &mut Reply,
        event: &Event,
    ) -> Response {
        let armed = self.config.ready_timeout.is_some();
        let disarm = |context: &mut Reply| {
            if armed {
                context.emit(Action::DisarmTimer(Timer::Readiness));
            }
        };
        let forking = matches!(self.config.workload, Workload::Child(ReadyMode::Forking));
        let (epoch, pending) = (*epoch, *drain_pending);
        // Recovery is abandoned while the workload runs: stop it first (the stop step's entry
        // forwards the signal and arms the grace), then release; nothing is published.
        let abandon = |refusal, running| {
            Transition(State::Aborting {
                epoch,
                drain_pending: pending,
                outcome: self.refusal(refusal),
                stop: ChildStop::Signalled,
                running,
            })
        };
        match (*event, *running) {
            // A forking daemon is ready when its first process exits, not when it says so.
            (Event::ChildReady, Running::Main) if forking => context.ignore(),
            (Event::ChildReady, Running::Main) => {
                disarm(context);
                self.became_ready(context, epoch, pending, Running::Main)
            }
            // A workload that was never ready has no service to stop: `STOPPING=1` before
            // `READY=1` changes nothing (as systemd ignores it while starting), so the readiness
            // timeout still bounds the start; the workload's own exit ends it as any exit does.
            (Event::ChildStopping, _) => context.ignore(),
            (Event::ChildReady, Running::Tree) => context.ignore(),
            (Event::ChildExited(status), Running::Main) => {
                disarm(context);
                self.child_ended_by_itself(context, epoch, pending, status)
            }
            // Card T4: a forking daemon's first process exited 0 and left its daemon behind.
            (Event::MainExited(status), Running::Main) if forking && status.success() => {
                if self.config.pid_file {
                    *running = Running::Tree;
                    Handled
                } else {
                    disarm(context);
                    self.became_ready(context, epoch, pending, Running::Tree)
                }
            }
            (Event::MainExited(status), Running::Main) => {
                disarm(context);
                self.main_ended_by_itself(context, epoch, pending, status)
            }
            // A forking daemon's main process became known: it is ready.
            (Event::MainAdopted, Running::Tree) => {
                disarm(context);
                self.became_ready(context, epoch, pending, Running::Main)
            }
            // The daemon is gone before its pid file named it: it never became ready.
            (Event::TreeEmpty, Running::Tree) => {
                disarm(context);
                Transition(State::AbortReleasing {
                    epoch,
                    drain_pending: pending,
                    outcome: self.refusal(Refusal::NoMainPid),
                })
            }
            (Event::Stop(sig), r) if mutant::on("stop-while-recovering-drains") => {
                disarm(context);
                self.enter_drain(context, epoch, DrainCause::Signal(sig), pending, Some(r))
            }
            (Event::Stop(sig), r) => {
                disarm(context);
                abandon(Refusal::Signal(sig), r)
            }
            (Event::TimerExpired(Timer::Readiness), r) if armed => {
                context.emit(Action::Note(Note::ReadinessTimedOut));
                abandon(Refusal::ReadinessTimedOut, r)
            }
            (Event::RootLost, r) => {
                disarm(context);
                abandon(Refusal::RootLost, r)
            }
            // The lease is gone and another owner may start its workload: this one is killed
            // at once, without the grace a stop signal gets.
            (Event::LeaseLost, r) => {
                disarm(context);
                context.emit(Action::Note(Note::LeaseLost));
                Transition(State::Aborting {
                    epoch,
                    drain_pending: pending,
                    outcome: self.refusal(Refusal::LeaseLost),
                    stop: ChildStop::Killed,
                    running: r,
                })
            }
            (Event::Stray(n), r) => {
                context.emit(Action::Relay(n, relay_target(r)));
                Handled
            }
            (Event::ChildExtendTimeout(d), _) if armed => {
                context.emit(Action::ExtendTimer(Timer::Readiness, d));
                Handled
            }
            (Event::ChildExtendTimeout(_), _) => context.ignore(),
            // The watchdog runs from readiness on.
            (Event::ChildWatchdog, _) => context.ignore(),
            (Event::ChildExited(_) | Event::MainExited(_), Running::Tree)
            | (Event::MainAdopted | Event::TreeEmpty, Running::Main)
            | (
                Event::Start
                | Event::LeaseBusy
                | Event::LeaseGranted { .. }
                | Event::WaitExpired
                | Event::LeaseFailed(_)
                | Event::RecoveryDone
                | Event::RecoveryFailed(_)
                | Event::ChildSpawned
                | Event::SpawnFailed(_)
                | Event::DrainRequested
                | Event::ResidenciesSettled
                | Event::TimerExpired(_)
                | Event::CheckpointPublished
                | Event::CheckpointSkipped
                | Event::CheckpointFailed
                | Event::LeaseReleased,
                _,
            ) => Super,
        }
    }

    #[action]
    fn arm_readiness(&self, context: &mut Reply) {
        if let Some(t) = self.config.ready_timeout {
            context.emit(Action::ArmTimer(Timer::Readiness, t));
        }
    }

    // ----- ready -----

    /// Owning and serving. Every way out of ready ends the watchdog, except its own expiry.
    #[state(superstate = "owning", entry_action = "enter_ready")]
    fn ready(
        &self,
        epoch: &u64,
        running: &mut Running,
        context: &mut Reply,
        event: &Event,
    ) -> Response {
        let child = matches!(self.config.workload, Workload::Child(_));
        let main = matches!(*running, Running::Main);
        let leave = |context: &mut Reply| {
            if child && self.config.watchdog.is_some() {
                context.emit(Action::DisarmTimer(Timer::Watchdog));
            }
        };
        let (epoch, r) = (*epoch, *running);
        let drain = |context: &mut Reply, cause| {
            leave(context);
            self.enter_drain(context, epoch, cause, false, Some(r))
        };
        match *event {
            Event::Stop(sig) if self.hup_forwarded(sig) => {
                context.emit(Action::Forward(sig, relay_target(r)));
                Handled
            }
            Event::Stop(sig) => drain(context, DrainCause::Signal(sig)),
            Event::DrainRequested => drain(context, DrainCause::Requested),
            Event::RootLost => drain(context, DrainCause::RootLost),
            Event::LeaseLost => drain(context, DrainCause::LeaseLost),
            Event::ChildStopping if child => drain(context, DrainCause::ChildStopping),
            Event::ChildExited(status) if child && main => {
                leave(context);
                self.child_ended_by_itself(context, epoch, false, status)
            }
            // The main process's exit taken for the end of the whole workload.
            Event::MainExited(status) if child && main && mutant::on("main-exit-ends-workload") => {
                leave(context);
                self.child_ended_by_itself(context, epoch, false, status)
            }
            Event::MainExited(status) if child && main => {
                leave(context);
                self.main_ended_by_itself(context, epoch, false, status)
            }
            Event::TreeEmpty if child && !main => {
                leave(context);
                self.tree_ended_by_itself(context, epoch)
            }
            // A forking daemon's main process became known after it was ready.
            Event::MainAdopted if child && !main => {
                *running = Running::Main;
                Handled
            }
            Event::TimerExpired(Timer::Watchdog) if child && self.config.watchdog.is_some() => {
                context.emit(Action::Note(Note::WatchdogTimedOut));
                self.enter_drain(context, epoch, DrainCause::Watchdog, false, Some(r))
            }
            Event::ChildWatchdog if child => match self.config.watchdog {
                Some(d) => {
                    context.emit(Action::ArmTimer(Timer::Watchdog, d));
                    Handled
                }
                None => context.ignore(),
            },
            // A repeated `READY=1` changes nothing; nothing bounds the time of a ready workload.
            Event::ChildReady | Event::ChildExtendTimeout(_) if child => context.ignore(),
            Event::Stray(_) if child && mutant::on("stray-not-relayed") => context.ignore(),
            Event::Stray(n) if child => {
                context.emit(Action::Relay(n, relay_target(r)));
                Handled
            }
            // An in-process host has no workload to relay to (owning ignores the signal); the
            // rest is not for a ready owner of this kind.
            Event::Stray(_)
            | Event::ChildStopping
            | Event::ChildExited(_)
            | Event::MainExited(_)
            | Event::TreeEmpty
            | Event::MainAdopted
            | Event::ChildReady
            | Event::ChildWatchdog
            | Event::ChildExtendTimeout(_)
            | Event::Start
            | Event::LeaseBusy
            | Event::LeaseGranted { .. }
            | Event::WaitExpired
            | Event::LeaseFailed(_)
            | Event::RecoveryDone
            | Event::RecoveryFailed(_)
            | Event::ChildSpawned
            | Event::SpawnFailed(_)
            | Event::ResidenciesSettled
            | Event::TimerExpired(_)
            | Event::CheckpointPublished
            | Event::CheckpointSkipped
            | Event::CheckpointFailed
            | Event::LeaseReleased => Super,
        }
    }

    #[action]
    fn enter_ready(&self, context: &mut Reply) {
        context.emit(Action::SetPhase(PhaseKind::Ready));
        context.emit(Action::Note(Note::Ready));
        context.emit(Action::NotifyReady);
        if let (Workload::Child(_), Some(d)) = (self.config.workload, self.config.watchdog) {
            context.emit(Action::ArmTimer(Timer::Watchdog, d));
        }
    }

    // ----- stopping the workload -----

    /// The workload is being stopped, the same whether recovery was abandoned or the owner
    /// drains: its main process exiting with processes left, the grace and kill-wait timers,
    /// and signals for the workload meanwhile. The leaves decide what happens once the whole
    /// workload is gone.
    #[superstate(superstate = "owning", local_storage("epoch: &'sub u64"))]
    fn stopping(
        &self,
        outcome: &mut Outcome,
        stop: &mut ChildStop,
        running: &mut Running,
        context: &mut Reply,
        event: &Event,
    ) -> Response {
        match *event {
            // The main process is gone but its tree is not: the lease stays until it is, and the
            // rest gets the same stop (invariant I7, card T1).
            Event::MainExited(status) if matches!(*running, Running::Main) => {
                context.emit(Action::Note(Note::TreeRemains));
                outcome.child = Some(status);
                *running = Running::Tree;
                match (*stop, self.config.kill_mode) {
                    // Nothing was sent yet (`STOPPING=1`), or the stop signal reached only the
                    // main process: now the rest gets it, with a grace of its own.
                    (ChildStop::Announced, KillMode::Tree | KillMode::Main)
                    | (ChildStop::Signalled, KillMode::Main) => {
                        *stop = ChildStop::Signalled;
                        self.stop_step(context, outcome, *stop, *running);
                    }
                    // The whole tree already got the stop signal (or SIGKILL): once is enough,
                    // and the running timer goes on.
                    (ChildStop::Signalled, KillMode::Tree)
                    | (
                        ChildStop::Killed | ChildStop::Unreapable,
                        KillMode::Tree | KillMode::Main,
                    ) => {}
                }
                Handled
            }
            // A stop timer fired: grace → SIGKILL to the whole workload, kill wait → `did not
            // stop` (the lease is kept).
            Event::TimerExpired(t) => match (*stop, t) {
                (ChildStop::Signalled, Timer::Grace) => {
                    *stop = ChildStop::Killed;
                    self.stop_step(context, outcome, *stop, *running);
                    Handled
                }
                (ChildStop::Killed, Timer::KillWait) => {
                    *stop = ChildStop::Unreapable;
                    self.stop_step(context, outcome, *stop, *running);
                    Handled
                }
                (
                    ChildStop::Announced
                    | ChildStop::Signalled
                    | ChildStop::Killed
                    | ChildStop::Unreapable,
                    _,
                ) => Super,
            },
            // The workload still runs: a signal for it reaches it (card T3).
            Event::Stray(n) => {
                context.emit(Action::Relay(n, relay_target(*running)));
                Handled
            }
            Event::ChildExtendTimeout(d) => match *stop {
                ChildStop::Signalled => {
                    context.emit(Action::ExtendTimer(Timer::Grace, d));
                    Handled
                }
                ChildStop::Announced | ChildStop::Killed | ChildStop::Unreapable => {
                    context.ignore()
                }
            },
            // Late notifications change nothing: the stop runs to its end.
            Event::ChildReady
            | Event::ChildStopping
            | Event::ChildWatchdog
            | Event::MainAdopted => context.ignore(),
            // The leaves handle the end of the whole workload and the stop signals they act
            // on; owning ignores a repeated stop, drain request or moved root; the rest does
            // not fit what runs.
            Event::MainExited(_)
            | Event::ChildExited(_)
            | Event::TreeEmpty
            | Event::Start
            | Event::LeaseBusy
            | Event::LeaseGranted { .. }
            | Event::WaitExpired
            | Event::LeaseFailed(_)
            | Event::RecoveryDone
            | Event::RecoveryFailed(_)
            | Event::ChildSpawned
            | Event::SpawnFailed(_)
            | Event::Stop(_)
            | Event::DrainRequested
            | Event::RootLost
            | Event::ResidenciesSettled
            | Event::CheckpointPublished
            | Event::CheckpointSkipped
            | Event::CheckpointFailed
            | Event::LeaseReleased
            | Event::LeaseLost => Super,
        }
    }

    /// Entering a stop step sends what the step stands for.
    #[action]
    fn send_stop(
        &self,
        outcome: &Outcome,
        stop: &ChildStop,
        running: &Running,
        context: &mut Reply,
    ) {
        self.stop_step(context, outcome, *stop, *running);
    }

    /// Recovery was abandoned and the workload is being stopped. Nothing will be published
    /// (card G3).
    #[state(superstate = "stopping", entry_action = "send_stop")]
    fn aborting(
        &self,
        epoch: &u64,
        drain_pending: &bool,
        outcome: &mut Outcome,
        stop: &mut ChildStop,
        running: &Running,
        context: &mut Reply,
        event: &Event,
    ) -> Response {
        let lost = outcome.refusal == Some(Refusal::LeaseLost);
        let gone = |context: &mut Reply, status: Option<ChildStatus>| {
            stop_timer(context, *stop);
            let mut o = *outcome;
            if status.is_some() {
                o.child = status;
            }
            // The lease is already gone: the run ends with the workload, releasing nothing.
            if lost {
                if matches!(stop, ChildStop::Killed | ChildStop::Unreapable) {
                    o.killed = true;
                }
                context.emit(Action::Note(Note::Refused));
                return Transition(State::Refused { outcome: o });
            }
            match stop {
                ChildStop::Killed => o.killed = true,
                ChildStop::Unreapable => {
                    o.killed = true;
                    o.reason = Reason::DidNotStop;
                }
                ChildStop::Announced | ChildStop::Signalled => {}
            }
            // An abandoned recovery whose workload exited 0 treated as a drain.
            if mutant::on("refused-recovery-publishes") && o.child.is_some_and(ChildStatus::success)
            {
                return finish_child(*epoch, DrainCause::ChildExited, o, true);
            }
            Transition(State::AbortReleasing {
                epoch: *epoch,
                drain_pending: *drain_pending,
                outcome: o,
            })
        };
        match (*event, *running) {
            (Event::ChildExited(status), Running::Main) => gone(context, Some(status)),
            (Event::TreeEmpty, Running::Tree) => gone(context, None),
            (Event::LeaseLost, _) if lost => context.ignore(),
            (Event::LeaseLost, r) => {
                self.lose_while_stopping(context, outcome, stop, r);
                Handled
            }
            (Event::ChildExited(_), Running::Tree)
            | (Event::TreeEmpty, Running::Main)
            | (
                Event::Start
                | Event::LeaseBusy
                | Event::LeaseGranted { .. }
                | Event::WaitExpired
                | Event::LeaseFailed(_)
                | Event::RecoveryDone
                | Event::RecoveryFailed(_)
                | Event::ChildSpawned
                | Event::SpawnFailed(_)
                | Event::ChildReady
                | Event::ChildStopping
                | Event::ChildWatchdog
                | Event::ChildExtendTimeout(_)
                | Event::MainExited(_)
                | Event::MainAdopted
                | Event::Stop(_)
                | Event::Stray(_)
                | Event::DrainRequested
                | Event::RootLost
                | Event::ResidenciesSettled
                | Event::TimerExpired(_)
                | Event::CheckpointPublished
                | Event::CheckpointSkipped
                | Event::CheckpointFailed
                | Event::LeaseReleased,
                _,
            ) => Super,
        }
    }

    /// The owner drains and the workload is being stopped.
    #[state(superstate = "stopping", entry_action = "send_stop")]
    fn drain_stopping(
        &self,
        epoch: &u64,
        cause: &mut DrainCause,
        outcome: &mut Outcome,
        stop: &mut ChildStop,
        running: &Running,
        context: &mut Reply,
        event: &Event,
    ) -> Response {
        let (epoch, was) = (*epoch, *stop);
        let lost = matches!(*cause, DrainCause::LeaseLost);
        let gone = |context: &mut Reply, cause: DrainCause, status: Option<ChildStatus>| {
            if !mutant::on("missed-disarm") {
                stop_timer(context, was);
            }
            let mut o = *outcome;
            if status.is_some() {
                o.child = status;
            }
            // The lease is already gone: nothing is published and nothing released; the run
            // ends with the workload.
            if lost {
                if matches!(was, ChildStop::Killed | ChildStop::Unreapable) {
                    o.killed = true;
                }
                // What the workload staged published although the lease was lost.
                if mutant::on("publish-after-lease-lost") {
                    return finish_child(epoch, cause, o, true);
                }
                context.emit(Action::Note(Note::Refused));
                return Transition(State::Refused { outcome: o });
            }
            let watchdog = matches!(cause, DrainCause::Watchdog);
            match was {
                ChildStop::Killed => {
                    o.killed = true;
                    // A watchdog stop keeps its own reason, as a refusal does.
                    if !watchdog {
                        o.reason = Reason::Killed;
                    }
                }
                ChildStop::Unreapable => {
                    o.killed = true;
                    o.reason = Reason::DidNotStop;
                }
                ChildStop::Announced | ChildStop::Signalled => {
                    if matches!(cause, DrainCause::ChildStopping) {
                        o.reason = Reason::Exited;
                    }
                }
            }
            // Published only after the main process exited 0 and the whole workload stopped in
            // order; a workload that missed its watchdog is not trusted.
            let exited_0 = if mutant::on("publish-after-nonzero-exit") {
                o.child.is_some()
            } else {
                o.child.is_some_and(ChildStatus::success)
            };
            let in_order = matches!(was, ChildStop::Announced | ChildStop::Signalled)
                || mutant::on("publish-after-kill");
            let publish =
                exited_0 && in_order && (!watchdog || mutant::on("publish-after-watchdog"));
            finish_child(epoch, cause, o, publish)
        };
        match (*event, *running) {
            (Event::ChildExited(status), Running::Main) => gone(context, *cause, Some(status)),
            (Event::TreeEmpty, Running::Tree) => gone(context, *cause, None),
            // The main process's exit taken for the end of the workload being stopped.
            (Event::MainExited(status), Running::Main)
                if mutant::on("drain-releases-on-main-exit") =>
            {
                gone(context, *cause, Some(status))
            }
            (Event::LeaseLost, _) if lost => context.ignore(),
            // The drain's checkpoint can no longer be published: the workload is killed at
            // once and the run ends with it.
            (Event::LeaseLost, r) => {
                *cause = DrainCause::LeaseLost;
                self.lose_while_stopping(context, outcome, stop, r);
                Handled
            }
            (Event::Stop(sig), r) if self.hup_forwarded(sig) => {
                context.emit(Action::Forward(sig, relay_target(r)));
                Handled
            }
            // The child announced it is stopping but nothing bounds it yet: a stop signal now
            // forwards and starts the grace period.
            (Event::Stop(sig), r) if matches!(was, ChildStop::Announced) => {
                outcome.signal.get_or_insert(sig);
                *stop = ChildStop::Signalled;
                self.stop_step(context, outcome, *stop, r);
                Handled
            }
            (Event::ChildExited(_), Running::Tree)
            | (Event::TreeEmpty, Running::Main)
            | (
                Event::Start
                | Event::LeaseBusy
                | Event::LeaseGranted { .. }
                | Event::WaitExpired
                | Event::LeaseFailed(_)
                | Event::RecoveryDone
                | Event::RecoveryFailed(_)
                | Event::ChildSpawned
                | Event::SpawnFailed(_)
                | Event::ChildReady
                | Event::ChildStopping
                | Event::ChildWatchdog
                | Event::ChildExtendTimeout(_)
                | Event::MainExited(_)
                | Event::MainAdopted
                | Event::Stop(_)
                | Event::Stray(_)
                | Event::DrainRequested
                | Event::RootLost
                | Event::ResidenciesSettled
                | Event::TimerExpired(_)
                | Event::CheckpointPublished
                | Event::CheckpointSkipped
                | Event::CheckpointFailed
                | Event::LeaseReleased,
                _,
            ) => Super,
        }
    }

    // ----- the end of an abandoned recovery -----

    /// Recovery was abandoned and nothing of the workload runs; the lease is being released.
    #[state(
        superstate = "owning",
        entry_action = "release_lease",
        local_storage("epoch: u64", "drain_pending: bool")
    )]
    fn abort_releasing(outcome: &Outcome, context: &mut Reply, event: &Event) -> Response {
        match event {
            Event::LeaseReleased => {
                context.emit(Action::Note(Note::Refused));
                Transition(State::Refused { outcome: *outcome })
            }
            // The release finds the lease already gone: the run ends as one that lost it.
            Event::LeaseLost => {
                context.emit(Action::Note(Note::LeaseLost));
                end_lost(context, *outcome)
            }
            Event::Start
            | Event::LeaseBusy
            | Event::LeaseGranted { .. }
            | Event::WaitExpired
            | Event::LeaseFailed(_)
            | Event::RecoveryDone
            | Event::RecoveryFailed(_)
            | Event::ChildSpawned
            | Event::SpawnFailed(_)
            | Event::ChildReady
            | Event::ChildStopping
            | Event::ChildWatchdog
            | Event::ChildExtendTimeout(_)
            | Event::ChildExited(_)
            | Event::MainExited(_)
            | Event::TreeEmpty
            | Event::MainAdopted
            | Event::Stop(_)
            | Event::Stray(_)
            | Event::DrainRequested
            | Event::RootLost
            | Event::ResidenciesSettled
            | Event::TimerExpired(_)
            | Event::CheckpointPublished
            | Event::CheckpointSkipped
            | Event::CheckpointFailed => Super,
        }
    }

    #[action]
    fn release_lease(context: &mut Reply) {
        context.emit(Action::ReleaseLease);
    }

    // ----- closing: the drain once nothing of a child workload runs -----

    /// The drain goes on without a running child (an in-process host settling, publishing,
    /// releasing): notifications of a workload that no longer runs change nothing.
    #[superstate(superstate = "owning", local_storage("epoch: &'sub u64"))]
    fn closing(context: &mut Reply, event: &Event) -> Response {
        match event {
            Event::ChildReady
            | Event::ChildStopping
            | Event::ChildWatchdog
            | Event::ChildExtendTimeout(_) => context.ignore(),
            Event::Start
            | Event::LeaseBusy
            | Event::LeaseGranted { .. }
            | Event::WaitExpired
            | Event::LeaseFailed(_)
            | Event::RecoveryDone
            | Event::RecoveryFailed(_)
            | Event::ChildSpawned
            | Event::SpawnFailed(_)
            | Event::ChildExited(_)
            | Event::MainExited(_)
            | Event::TreeEmpty
            | Event::MainAdopted
            | Event::Stop(_)
            | Event::Stray(_)
            | Event::DrainRequested
            | Event::RootLost
            | Event::ResidenciesSettled
            | Event::TimerExpired(_)
            | Event::CheckpointPublished
            | Event::CheckpointSkipped
            | Event::CheckpointFailed
            | Event::LeaseReleased
            | Event::LeaseLost => Super,
        }
    }

    /// In-process: waiting for active residencies to settle; the grace timer runs.
    #[state(superstate = "closing", entry_action = "arm_grace")]
    fn settling(
        epoch: &u64,
        cause: &DrainCause,
        outcome: &Outcome,
        context: &mut Reply,
        event: &Event,
    ) -> Response {
        match event {
            Event::ResidenciesSettled => {
                context.emit(Action::DisarmTimer(Timer::Grace));
                Transition(State::Publishing {
                    epoch: *epoch,
                    cause: *cause,
                    outcome: *outcome,
                })
            }
            // Card H4: the close is bounded; the lease is kept while work may still run.
            Event::TimerExpired(Timer::Grace) => {
                context.emit(Action::Note(Note::DidNotStop));
                Transition(State::Unsettled {
                    epoch: *epoch,
                    cause: *cause,
                    outcome: *outcome,
                })
            }
            // The host's work cannot be killed; its drain hook already ran. The lease is gone,
            // so there is nothing left to wait for.
            Event::LeaseLost => {
                context.emit(Action::DisarmTimer(Timer::Grace));
                context.emit(Action::Note(Note::LeaseLost));
                end_lost(context, *outcome)
            }
            Event::Start
            | Event::LeaseBusy
            | Event::LeaseGranted { .. }
            | Event::WaitExpired
            | Event::LeaseFailed(_)
            | Event::RecoveryDone
            | Event::RecoveryFailed(_)
            | Event::ChildSpawned
            | Event::SpawnFailed(_)
            | Event::ChildReady
            | Event::ChildStopping
            | Event::ChildWatchdog
            | Event::ChildExtendTimeout(_)
            | Event::ChildExited(_)
            | Event::MainExited(_)
            | Event::TreeEmpty
            | Event::MainAdopted
            | Event::Stop(_)
            | Event::Stray(_)
            | Event::DrainRequested
            | Event::RootLost
            | Event::TimerExpired(_)
            | Event::CheckpointPublished
            | Event::CheckpointSkipped
            | Event::CheckpointFailed
            | Event::LeaseReleased => Super,
        }
    }

    #[action]
    fn arm_grace(&self, context: &mut Reply) {
        context.emit(Action::ArmTimer(Timer::Grace, self.config.grace));
    }

    /// In-process: the grace expired with active residencies; the lease is kept until they
    /// settle.
    #[state(superstate = "closing")]
    fn unsettled(
        epoch: &u64,
        cause: &DrainCause,
        outcome: &Outcome,
        context: &mut Reply,
        event: &Event,
    ) -> Response {
        match event {
            Event::ResidenciesSettled => Transition(State::Publishing {
                epoch: *epoch,
                cause: *cause,
                outcome: *outcome,
            }),
            Event::LeaseLost => {
                context.emit(Action::Note(Note::LeaseLost));
                end_lost(context, *outcome)
            }
            Event::Start
            | Event::LeaseBusy
            | Event::LeaseGranted { .. }
            | Event::WaitExpired
            | Event::LeaseFailed(_)
            | Event::RecoveryDone
            | Event::RecoveryFailed(_)
            | Event::ChildSpawned
            | Event::SpawnFailed(_)
            | Event::ChildReady
            | Event::ChildStopping
            | Event::ChildWatchdog
            | Event::ChildExtendTimeout(_)
            | Event::ChildExited(_)
            | Event::MainExited(_)
            | Event::TreeEmpty
            | Event::MainAdopted
            | Event::Stop(_)
            | Event::Stray(_)
            | Event::DrainRequested
            | Event::RootLost
            | Event::TimerExpired(_)
            | Event::CheckpointPublished
            | Event::CheckpointSkipped
            | Event::CheckpointFailed
            | Event::LeaseReleased => Super,
        }
    }

    /// The checkpoint is being published.
    #[state(superstate = "closing", entry_action = "publish")]
    fn publishing(
        epoch: &u64,
        cause: &mut DrainCause,
        outcome: &mut Outcome,
        context: &mut Reply,
        event: &Event,
    ) -> Response {
        let (epoch, o) = (*epoch, *outcome);
        // A publish asked for before the lease was lost is not withdrawn: its fence decides
        // whether it took effect (a cluster CURRENT moves only while the lease is ours). Once
        // it answers, the run ends without releasing.
        if matches!(*cause, DrainCause::LeaseLost) {
            return match event {
                Event::CheckpointPublished => {
                    context.emit(Action::Note(Note::CheckpointPublished));
                    end_lost(context, o)
                }
                Event::CheckpointSkipped => end_lost(context, o),
                Event::CheckpointFailed => {
                    context.emit(Action::Note(Note::PublishFailed));
                    end_lost(context, o)
                }
                Event::LeaseLost => context.ignore(),
                Event::Start
                | Event::LeaseBusy
                | Event::LeaseGranted { .. }
                | Event::WaitExpired
                | Event::LeaseFailed(_)
                | Event::RecoveryDone
                | Event::RecoveryFailed(_)
                | Event::ChildSpawned
                | Event::SpawnFailed(_)
                | Event::ChildReady
                | Event::ChildStopping
                | Event::ChildWatchdog
                | Event::ChildExtendTimeout(_)
                | Event::ChildExited(_)
                | Event::MainExited(_)
                | Event::TreeEmpty
                | Event::MainAdopted
                | Event::Stop(_)
                | Event::Stray(_)
                | Event::DrainRequested
                | Event::RootLost
                | Event::ResidenciesSettled
                | Event::TimerExpired(_)
                | Event::LeaseReleased => Super,
            };
        }
        let c = *cause;
        match event {
            // The publish already asked for stays owed; its answer ends the run.
            Event::LeaseLost => {
                context.emit(Action::Note(Note::LeaseLost));
                *cause = DrainCause::LeaseLost;
                *outcome = lost(*outcome);
                Handled
            }
            Event::CheckpointPublished => {
                context.emit(Action::Note(Note::CheckpointPublished));
                Transition(State::DrainReleasing {
                    epoch,
                    cause: c,
                    outcome: o,
                })
            }
            Event::CheckpointSkipped => Transition(State::DrainReleasing {
                epoch,
                cause: c,
                outcome: o,
            }),
            Event::CheckpointFailed => {
                let mut o = o;
                o.reason = Reason::PublishFailed;
                context.emit(Action::Note(Note::PublishFailed));
                Transition(State::DrainReleasing {
                    epoch,
                    cause: c,
                    outcome: o,
                })
            }
            Event::Start
            | Event::LeaseBusy
            | Event::LeaseGranted { .. }
            | Event::WaitExpired
            | Event::LeaseFailed(_)
            | Event::RecoveryDone
            | Event::RecoveryFailed(_)
            | Event::ChildSpawned
            | Event::SpawnFailed(_)
            | Event::ChildReady
            | Event::ChildStopping
            | Event::ChildWatchdog
            | Event::ChildExtendTimeout(_)
            | Event::ChildExited(_)
            | Event::MainExited(_)
            | Event::TreeEmpty
            | Event::MainAdopted
            | Event::Stop(_)
            | Event::Stray(_)
            | Event::DrainRequested
            | Event::RootLost
            | Event::ResidenciesSettled
            | Event::TimerExpired(_)
            | Event::LeaseReleased => Super,
        }
    }

    #[action]
    fn publish(context: &mut Reply) {
        if mutant::on("release-then-publish") {
            context.emit(Action::ReleaseLease);
        }
        context.emit(Action::Publish);
    }

    /// The drain's lease is being released.
    #[state(
        superstate = "closing",
        entry_action = "release_lease",
        local_storage("epoch: u64", "cause: DrainCause")
    )]
    fn drain_releasing(outcome: &Outcome, context: &mut Reply, event: &Event) -> Response {
        match event {
            Event::LeaseReleased => {
                context.emit(Action::Note(Note::Released));
                Transition(State::Released { outcome: *outcome })
            }
            // The release finds the lease already gone (the publish before it, if any, was
            // fenced by the lease): the run ends as one that lost it.
            Event::LeaseLost => {
                context.emit(Action::Note(Note::LeaseLost));
                end_lost(context, *outcome)
            }
            Event::Start
            | Event::LeaseBusy
            | Event::LeaseGranted { .. }
            | Event::WaitExpired
            | Event::LeaseFailed(_)
            | Event::RecoveryDone
            | Event::RecoveryFailed(_)
            | Event::ChildSpawned
            | Event::SpawnFailed(_)
            | Event::ChildReady
            | Event::ChildStopping
            | Event::ChildWatchdog
            | Event::ChildExtendTimeout(_)
            | Event::ChildExited(_)
            | Event::MainExited(_)
            | Event::TreeEmpty
            | Event::MainAdopted
            | Event::Stop(_)
            | Event::Stray(_)
            | Event::DrainRequested
            | Event::RootLost
            | Event::ResidenciesSettled
            | Event::TimerExpired(_)
            | Event::CheckpointPublished
            | Event::CheckpointSkipped
            | Event::CheckpointFailed => Super,
        }
    }

    // ----- terminal -----

    /// The run is over and the driver has exited: nothing is accepted (the root rejects it).
    /// Every way in ends with the exit, the last action of a run.
    #[superstate(
        superstate = "root",
        entry_action = "exit",
        local_storage("outcome: &'sub Outcome")
    )]
    fn terminal() -> Response {
        Super
    }

    #[action]
    fn exit(outcome: &Outcome, context: &mut Reply) {
        context.emit(Action::Exit(*outcome));
    }

    /// Released after an orderly end.
    #[state(superstate = "terminal", local_storage("outcome: Outcome"))]
    fn released() -> Response {
        Super
    }

    /// Ended before owning (a stop signal, or the wait bound expired).
    #[state(superstate = "terminal", local_storage("outcome: Outcome"))]
    fn cancelled() -> Response {
        Super
    }

    /// Refused while or before recovering.
    #[state(superstate = "terminal", local_storage("outcome: Outcome"))]
    fn refused() -> Response {
        Super
    }
}

/// Helpers shared by several handlers.
impl Rules {
    fn outcome(&self, reason: Reason) -> Outcome {
        Outcome::new(reason, self.config.busy_code)
    }

    /// The outcome of a refused recovery.
    fn refusal(&self, refusal: Refusal) -> Outcome {
        let mut o = self.outcome(Reason::Refused);
        o.refusal = Some(refusal);
        if let Refusal::Signal(s) = refusal {
            o.signal = Some(s);
        }
        o
    }

    /// Whether `sig` is a HUP that this configuration forwards instead of stopping on (while
    /// ready or draining; waiting and recovering keep the cards' behaviour).
    fn hup_forwarded(&self, sig: Signal) -> bool {
        matches!(sig, Signal::Hup)
            && matches!(self.config.hup, HupPolicy::Forward)
            && matches!(self.config.workload, Workload::Child(_))
    }

    /// Where a stop signal goes while `running` runs: the main process first under
    /// `--kill-mode main`, otherwise (and once the main process has exited) every process of
    /// the workload at once.
    fn stop_target(&self, running: Running) -> Target {
        match (running, self.config.kill_mode) {
            (Running::Main, KillMode::Main) => Target::Main,
            (Running::Main, KillMode::Tree) | (Running::Tree, KillMode::Main | KillMode::Tree) => {
                Target::Tree
            }
        }
    }

    /// What a stop step sends when the workload enters it: the stop signal in use and the grace,
    /// SIGKILL to every process and the kill wait, or the note that a process survived it.
    fn stop_step(&self, context: &mut Reply, o: &Outcome, stop: ChildStop, running: Running) {
        match stop {
            ChildStop::Announced => {}
            ChildStop::Signalled => {
                let sig = o.signal.unwrap_or(Signal::Term);
                if !mutant::on("no-forward-on-stop") {
                    context.emit(Action::Forward(sig, self.stop_target(running)));
                }
                context.emit(Action::ArmTimer(Timer::Grace, self.config.grace));
            }
            ChildStop::Killed => {
                context.emit(Action::Note(Note::Killed));
                context.emit(Action::Kill);
                context.emit(Action::ArmTimer(Timer::KillWait, self.config.kill_wait));
            }
            ChildStop::Unreapable => context.emit(Action::Note(Note::DidNotStop)),
        }
    }

    /// Recovery is complete: ready, or, with a drain requested meanwhile, straight into the
    /// drain (whose `BeginDrain` already happened, card H2).
    fn became_ready(
        &self,
        context: &mut Reply,
        epoch: u64,
        drain_pending: bool,
        running: Running,
    ) -> Response {
        if drain_pending {
            self.enter_drain(context, epoch, DrainCause::Requested, true, Some(running))
        } else {
            Transition(State::Ready { epoch, running })
        }
    }

    /// The bookkeeping every drain starts with: the outcome it is heading for, `BeginDrain`
    /// (unless `begun`: a drain requested before recovery completed already emitted it, so it
    /// happens exactly once per ownership), the registration and the notifications.
    fn drain_prefix(&self, context: &mut Reply, cause: DrainCause, begun: bool) -> Outcome {
        let mut o = self.outcome(Reason::Stopped);
        match cause {
            DrainCause::Signal(s) => o.signal = Some(s),
            DrainCause::RootLost => o.refusal = Some(Refusal::RootLost),
            DrainCause::ChildStopping | DrainCause::ChildExited => o.reason = Reason::Exited,
            DrainCause::Watchdog => o.reason = Reason::Watchdog,
            DrainCause::LeaseLost => o = lost(o),
            DrainCause::Requested => {}
        }
        if !begun && !mutant::on("dropped-begin-drain") {
            context.emit(Action::BeginDrain);
        }
        context.emit(Action::SetPhase(PhaseKind::Draining));
        // The loss of the lease is the line the event log needs: it is why the drain began.
        context.emit(Action::Note(match cause {
            DrainCause::LeaseLost => Note::LeaseLost,
            DrainCause::Signal(_)
            | DrainCause::Requested
            | DrainCause::ChildStopping
            | DrainCause::ChildExited
            | DrainCause::RootLost
            | DrainCause::Watchdog => Note::Draining(cause),
        }));
        context.emit(Action::NotifyStopping);
        o
    }

    /// Enter the drain while the workload still runs (`running` is `None` only when a drain was
    /// requested before any child was started). The stop step's entry forwards the cause's
    /// signal (TERM unless a stop signal caused it); `STOPPING=1` forwards nothing.
    fn enter_drain(
        &self,
        context: &mut Reply,
        epoch: u64,
        cause: DrainCause,
        begun: bool,
        running: Option<Running>,
    ) -> Response {
        let o = self.drain_prefix(context, cause, begun);
        let stop = match cause {
            DrainCause::Signal(_) if mutant::on("drain-kills-at-once") => ChildStop::Killed,
            DrainCause::Signal(_)
            | DrainCause::Requested
            | DrainCause::RootLost
            | DrainCause::Watchdog => ChildStop::Signalled,
            DrainCause::ChildStopping | DrainCause::ChildExited => ChildStop::Announced,
            // The lease is gone and another owner may start its workload: no grace.
            DrainCause::LeaseLost => ChildStop::Killed,
        };
        match (self.config.workload, running) {
            // Nothing of a child runs, or the work is the host's own and cannot be killed (its
            // drain hook ran): with the lease gone there is nothing to wait for.
            (Workload::InProcess, _) | (Workload::Child(_), None)
                if matches!(cause, DrainCause::LeaseLost) =>
            {
                end_lost(context, o)
            }
            (Workload::InProcess, _) => Transition(State::Settling {
                epoch,
                cause,
                outcome: o,
            }),
            // No child was ever started, so nothing runs and nothing was staged.
            (Workload::Child(_), None) => Transition(State::DrainReleasing {
                epoch,
                cause,
                outcome: o,
            }),
            (Workload::Child(_), Some(r)) => Transition(State::DrainStopping {
                epoch,
                cause,
                outcome: o,
                stop,
                running: r,
            }),
        }
    }

    /// The lease was lost while the workload is being stopped: the outcome becomes the loss's,
    /// and a stop still in its grace (or only announced) escalates to SIGKILL at once.
    fn lose_while_stopping(
        &self,
        context: &mut Reply,
        outcome: &mut Outcome,
        stop: &mut ChildStop,
        running: Running,
    ) {
        context.emit(Action::Note(Note::LeaseLost));
        *outcome = lost(*outcome);
        match *stop {
            ChildStop::Announced | ChildStop::Signalled => {
                stop_timer(context, *stop);
                *stop = ChildStop::Killed;
                self.stop_step(context, outcome, *stop, running);
            }
            // SIGKILL was already sent.
            ChildStop::Killed | ChildStop::Unreapable => {}
        }
    }

    /// The whole workload ended by itself while recovering or ready: drain, publish only after
    /// exit 0, pass its exit code through.
    fn child_ended_by_itself(
        &self,
        context: &mut Reply,
        epoch: u64,
        begun: bool,
        status: ChildStatus,
    ) -> Response {
        let mut o = self.drain_prefix(context, DrainCause::ChildExited, begun);
        o.child = Some(status);
        finish_child(epoch, DrainCause::ChildExited, o, status.success())
    }

    /// The main process exited by itself but left processes behind (card T1): drain, and stop
    /// what remains as any stop does (TERM, grace, SIGKILL) before anything is published or
    /// released. The main process's exit code is the run's, unless the rest had to be killed.
    fn main_ended_by_itself(
        &self,
        context: &mut Reply,
        epoch: u64,
        begun: bool,
        status: ChildStatus,
    ) -> Response {
        let mut o = self.drain_prefix(context, DrainCause::ChildExited, begun);
        o.child = Some(status);
        context.emit(Action::Note(Note::TreeRemains));
        Transition(State::DrainStopping {
            epoch,
            cause: DrainCause::ChildExited,
            outcome: o,
            stop: ChildStop::Signalled,
            running: Running::Tree,
        })
    }

    /// A forking daemon with no known main process ended by itself: nothing reports an exit
    /// status, so nothing vouches for what it staged; the lease is released without publishing.
    fn tree_ended_by_itself(&self, context: &mut Reply, epoch: u64) -> Response {
        let o = self.drain_prefix(context, DrainCause::ChildExited, false);
        finish_child(epoch, DrainCause::ChildExited, o, false)
    }
}

/// After the workload is gone: publish if the drain may (exit 0, stopped in order), otherwise
/// release at once.
fn finish_child(epoch: u64, cause: DrainCause, o: Outcome, publish: bool) -> Response {
    if publish {
        Transition(State::Publishing {
            epoch,
            cause,
            outcome: o,
        })
    } else {
        Transition(State::DrainReleasing {
            epoch,
            cause,
            outcome: o,
        })
    }
}

/// The outcome of a run whose lease was lost: refused (lease lost), keeping what it records of
/// the workload and the signal that began its end.
const fn lost(mut o: Outcome) -> Outcome {
    o.reason = Reason::Refused;
    o.refusal = Some(Refusal::LeaseLost);
    o
}

/// Ends a run whose lease was lost once nothing of its workload runs: refused, releasing
/// nothing (the lease is already gone).
fn end_lost(context: &mut Reply, o: Outcome) -> Response {
    context.emit(Action::Note(Note::Refused));
    Transition(State::Refused { outcome: lost(o) })
}

/// The timer that runs while the workload is in this stop step, disarmed when it is gone.
fn stop_timer(context: &mut Reply, stop: ChildStop) {
    match stop {
        ChildStop::Signalled => context.emit(Action::DisarmTimer(Timer::Grace)),
        ChildStop::Killed => context.emit(Action::DisarmTimer(Timer::KillWait)),
        ChildStop::Announced | ChildStop::Unreapable => {}
    }
}

/// Where a signal the owner does not act on goes: the main process, as if it had been sent to
/// it; every process of the workload once there is no main process to speak for the tree.
fn relay_target(running: Running) -> Target {
    match running {
        Running::Main => Target::Main,
        Running::Tree => Target::Tree,
    }
}

fn refusal_of(fault: Fault) -> Refusal {
    match fault {
        Fault::State => Refusal::State,
        Fault::Io => Refusal::Io,
    }
}

/// The public view of a state: its phase with the data kept in it.
pub(crate) const fn phase_of(state: &State) -> Phase {
    match *state {
        State::Idle { drain_pending } => cold_phase(ColdStep::Idle, drain_pending),
        State::Acquiring { drain_pending } => cold_phase(ColdStep::Acquiring, drain_pending),
        State::Waiting { drain_pending } => cold_phase(ColdStep::Waiting, drain_pending),
        State::Verifying {
            epoch,
            drain_pending,
        } => recovering(epoch, RecoveryStep::Verifying, drain_pending, None),
        State::Spawning {
            epoch,
            drain_pending,
        } => recovering(epoch, RecoveryStep::Spawning, drain_pending, None),
        State::Awaiting {
            epoch,
            drain_pending,
            running,
        } => {
            let step = match running {
                Running::Main => RecoveryStep::AwaitingReady,
                Running::Tree => RecoveryStep::AwaitingMain,
            };
            recovering(epoch, step, drain_pending, None)
        }
        State::Aborting {
            epoch,
            drain_pending,
            outcome,
            stop,
            running,
        } => recovering(
            epoch,
            RecoveryStep::Aborting(stop, running),
            drain_pending,
            Some(outcome),
        ),
        State::AbortReleasing {
            epoch,
            drain_pending,
            outcome,
        } => recovering(epoch, RecoveryStep::Releasing, drain_pending, Some(outcome)),
        State::Ready { epoch, running } => Phase::Ready { epoch, running },
        State::DrainStopping {
            epoch,
            cause,
            outcome,
            stop,
            running,
        } => draining(epoch, cause, DrainStep::Stopping(stop, running), outcome),
        State::Settling {
            epoch,
            cause,
            outcome,
        } => draining(epoch, cause, DrainStep::Settling, outcome),
        State::Unsettled {
            epoch,
            cause,
            outcome,
        } => draining(epoch, cause, DrainStep::Unsettled, outcome),
        State::Publishing {
            epoch,
            cause,
            outcome,
        } => draining(epoch, cause, DrainStep::Publishing, outcome),
        State::DrainReleasing {
            epoch,
            cause,
            outcome,
        } => draining(epoch, cause, DrainStep::Releasing, outcome),
        State::Released { outcome } => Phase::Released(outcome),
        State::Cancelled { outcome } => Phase::Cancelled(outcome),
        State::Refused { outcome } => Phase::Refused(outcome),
    }
}

const fn cold_phase(step: ColdStep, drain_pending: bool) -> Phase {
    Phase::Cold {
        step,
        drain_pending,
    }
}

const fn recovering(
    epoch: u64,
    step: RecoveryStep,
    drain_pending: bool,
    outcome: Option<Outcome>,
) -> Phase {
    Phase::Recovering {
        epoch,
        step,
        drain_pending,
        outcome,
    }
}

const fn draining(epoch: u64, cause: DrainCause, step: DrainStep, outcome: Outcome) -> Phase {
    Phase::Draining {
        epoch,
        cause,
        step,
        outcome,
    }
}

/// The state a phase stands for. A recovering phase keeps an outcome only once recovery was
/// abandoned; an abandoned recovery without one (a phase the rules never produce) is read as
/// refused with no recorded cause.
pub(crate) const fn state_of(phase: &Phase, busy_code: u8) -> State {
    match *phase {
        Phase::Cold {
            step,
            drain_pending,
        } => match step {
            ColdStep::Idle => State::Idle { drain_pending },
            ColdStep::Acquiring => State::Acquiring { drain_pending },
            ColdStep::Waiting => State::Waiting { drain_pending },
        },
        Phase::Recovering {
            epoch,
            step,
            drain_pending,
            outcome,
        } => {
            let abandoned = match outcome {
                Some(o) => o,
                None => Outcome::new(Reason::Refused, busy_code),
            };
            match step {
                RecoveryStep::Verifying => State::Verifying {
                    epoch,
                    drain_pending,
                },
                RecoveryStep::Spawning => State::Spawning {
                    epoch,
                    drain_pending,
                },
                RecoveryStep::AwaitingReady => State::Awaiting {
                    epoch,
                    drain_pending,
                    running: Running::Main,
                },
                RecoveryStep::AwaitingMain => State::Awaiting {
                    epoch,
                    drain_pending,
                    running: Running::Tree,
                },
                RecoveryStep::Aborting(stop, running) => State::Aborting {
                    epoch,
                    drain_pending,
                    outcome: abandoned,
                    stop,
                    running,
                },
                RecoveryStep::Releasing => State::AbortReleasing {
                    epoch,
                    drain_pending,
                    outcome: abandoned,
                },
            }
        }
        Phase::Ready { epoch, running } => State::Ready { epoch, running },
        Phase::Draining {
            epoch,
            cause,
            step,
            outcome,
        } => match step {
            DrainStep::Settling => State::Settling {
                epoch,
                cause,
                outcome,
            },
            DrainStep::Unsettled => State::Unsettled {
                epoch,
                cause,
                outcome,
            },
            DrainStep::Stopping(stop, running) => State::DrainStopping {
                epoch,
                cause,
                outcome,
                stop,
                running,
            },
            DrainStep::Publishing => State::Publishing {
                epoch,
                cause,
                outcome,
            },
            DrainStep::Releasing => State::DrainReleasing {
                epoch,
                cause,
                outcome,
            },
        },
        Phase::Released(outcome) => State::Released { outcome },
        Phase::Cancelled(outcome) => State::Cancelled { outcome },
        Phase::Refused(outcome) => State::Refused { outcome },
    }
}

/// The name of a state's phase.
pub(crate) const fn kind_of(state: &State) -> PhaseKind {
    match state {
        State::Idle { .. } | State::Acquiring { .. } | State::Waiting { .. } => PhaseKind::Cold,
        State::Verifying { .. }
        | State::Spawning { .. }
        | State::Awaiting { .. }
        | State::Aborting { .. }
        | State::AbortReleasing { .. } => PhaseKind::Recovering,
        State::Ready { .. } => PhaseKind::Ready,
        State::DrainStopping { .. }
        | State::Settling { .. }
        | State::Unsettled { .. }
        | State::Publishing { .. }
        | State::DrainReleasing { .. } => PhaseKind::Draining,
        State::Released { .. } => PhaseKind::Released,
        State::Cancelled { .. } => PhaseKind::Cancelled,
        State::Refused { .. } => PhaseKind::Refused,
    }
}

/// The state of a new machine: `cold(idle)`.
pub(crate) const INITIAL: State = State::Idle {
    drain_pending: false,
};

#[cfg(test)]
mod tests {
    //! Totality of the statig port: every reachable state of every configuration the spec
    //! renders (and of every combination of the child options) answers every sample event at a
    //! handler, never by falling off the top; the verdicts keep their contracts; the phase view
    //! is faithful. That the answers are the same as before the port is proven by
    //! spec/transitions.md, which the insta snapshot in tests/spec.rs pins byte for byte.

    use super::*;
    use crate::machine::{HupPolicy, KillMode, Machine, table};
    use statig::blocking::StateExt as _;
    use std::time::Duration;

    /// The rendered profiles and every combination of `--type`, `--kill-mode`, `--hup`,
    /// `--watchdog`, `--ready-timeout` and `--pidfile` (the last two only where the rules read
    /// them: a readiness wait exists only for notify and forking, a pid file only for forking).
    fn configs() -> Vec<Config> {
        let mut v: Vec<Config> = table::profiles().into_iter().map(|(_, c)| c).collect();
        for ready in [ReadyMode::Start, ReadyMode::Notify, ReadyMode::Forking] {
            let timeouts: &[Option<Duration>] = match ready {
                ReadyMode::Start => &[None],
                ReadyMode::Notify | ReadyMode::Forking => &[None, Some(Duration::from_secs(9))],
            };
            let pid_files: &[bool] = match ready {
                ReadyMode::Start | ReadyMode::Notify => &[false],
                ReadyMode::Forking => &[false, true],
            };
            for kill_mode in [KillMode::Tree, KillMode::Main] {
                for hup in [HupPolicy::Stop, HupPolicy::Forward] {
                    for watchdog in [None, Some(Duration::from_secs(7))] {
                        for &ready_timeout in timeouts {
                            for &pid_file in pid_files {
                                v.push(Config {
                                    kill_mode,
                                    hup,
                                    watchdog,
                                    ready_timeout,
                                    pid_file,
                                    ..Config::child(ready)
                                });
                            }
                        }
                    }
                }
            }
        }
        v
    }

    /// Every reachable machine of every configuration, computed once for all the tests here.
    fn reachable() -> &'static [(Config, Vec<Machine>)] {
        static ALL: std::sync::OnceLock<Vec<(Config, Vec<Machine>)>> = std::sync::OnceLock::new();
        ALL.get_or_init(|| {
            configs()
                .into_iter()
                .map(|c| (c, table::reachable(c)))
                .collect()
        })
    }

    /// Runs `f` on every reachable machine of every configuration with every sample event.
    fn every(mut f: impl FnMut(&Config, &Machine, Event)) {
        let events = Event::samples();
        for (config, machines) in reachable() {
            for m in machines {
                for &e in &events {
                    f(config, m, e);
                }
            }
        }
    }

    /// The root decides every event that reaches it: the chain of handlers never ends in
    /// `Super`, which statig would drop silently.
    #[test]
    fn no_event_falls_off_the_top() {
        let mut states = 0;
        every(|config, m, e| {
            states += 1;
            let mut rules = Rules { config: *config };
            let mut state = m.state;
            let mut reply = reply();
            let outcome = state.handle(&mut rules, &e, &mut reply);
            assert!(
                !matches!(outcome, Super),
                "{e} fell off the top in {}",
                m.phase().label()
            );
        });
        assert!(states > 10_000, "only {states} state × event pairs walked");
    }

    /// Each verdict keeps its contract: an ignored or rejected event changes nothing and emits
    /// nothing, a rejection names the phase and the event, and a move that leaves the state as
    /// it was does so only to emit actions.
    #[test]
    fn verdicts_keep_their_contracts() {
        let (mut moved, mut ignored, mut rejected) = (0, 0, 0);
        every(|config, m, e| {
            let mut reply = reply();
            let next = step(*config, m.state, &e, &mut reply);
            match reply.verdict {
                Verdict::Moved => {
                    moved += 1;
                    assert!(
                        next != m.state || !reply.actions.is_empty(),
                        "{e} in {}: a move that changes nothing must be an ignore",
                        m.phase().label()
                    );
                }
                Verdict::Ignored => {
                    ignored += 1;
                    assert_eq!(next, m.state, "{e} ignored in {}", m.phase().label());
                    assert!(
                        reply.actions.is_empty(),
                        "{e} ignored in {}",
                        m.phase().label()
                    );
                }
                Verdict::Rejected => {
                    rejected += 1;
                    let r = m.step(e).expect_err("rejected");
                    assert_eq!((r.phase, r.event), (m.kind(), e));
                    assert_eq!(r.label, m.phase().label());
                }
            }
        });
        assert!(moved > 0 && ignored > 0 && rejected > 0);
    }

    /// The phase is a faithful view of the statig state: reading a reachable state's phase
    /// back gives the same state, and the phase's name is the state's kind.
    #[test]
    fn phase_view_round_trips() {
        for (config, machines) in reachable() {
            for m in machines {
                let phase = m.phase();
                assert_eq!(state_of(&phase, config.busy_code), m.state, "{phase:?}");
                assert_eq!(phase.kind(), kind_of(&m.state));
                assert_eq!(Machine::with_phase(*config, phase), *m);
            }
        }
    }

    /// Restoring a stored state runs statig's entry actions again; they are muted, so a step
    /// emits only what the event caused. Without the mute, restoring a stopping workload would
    /// forward the stop signal again.
    #[test]
    fn restoring_a_state_emits_nothing() {
        let config = Config::child(ReadyMode::Start);
        let state = State::DrainStopping {
            epoch: 1,
            cause: DrainCause::Requested,
            outcome: Outcome::new(Reason::Stopped, config.busy_code),
            stop: ChildStop::Signalled,
            running: Running::Main,
        };
        let entered = |restoring| {
            let mut sm = Rules { config }.uninitialized_state_machine();
            *sm.state_mut() = state;
            let mut r = Reply::new(restoring);
            let _ = sm.init_with_context(&mut r);
            r.actions
        };
        assert_eq!(
            entered(false),
            vec![
                Action::Note(Note::Owned(1)),
                Action::Forward(Signal::Term, Target::Tree),
                Action::ArmTimer(Timer::Grace, config.grace),
            ]
        );
        assert!(entered(true).is_empty());
        let mut reply = reply();
        let _ = step(config, state, &Event::Stray(10), &mut reply);
        assert_eq!(reply.actions, vec![Action::Relay(10, Target::Main)]);
    }
}

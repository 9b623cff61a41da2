//! The transition rules: `next(config, phase, event)`. This is the only place a phase changes.
//!
//! Every match on the phase lists every phase, and every match on the event lists every event,
//! so adding either breaks the build exactly where a decision is missing (as rustls does).

use super::action::{Action, DrainCause, Note, Outcome, Reason, Refusal, Target};
use super::event::{ChildStatus, Event, Fault, Signal, Timer};
use super::{
    ChildStop, ColdStep, Config, DrainStep, HupPolicy, KillMode, Phase, PhaseKind, ReadyMode,
    RecoveryStep, Running, Workload,
};

/// What the rules decided for one event.
pub(crate) enum Decision {
    /// Go to this phase and do these actions.
    Move(Phase, Vec<Action>),
    /// The spec says: ignored here.
    Ignore,
    /// Illegal here.
    Reject,
}

use Decision::{Ignore, Move, Reject};

pub(crate) fn next(cfg: &Config, phase: &Phase, ev: Event) -> Decision {
    match *phase {
        Phase::Cold {
            step,
            drain_pending,
        } => cold(cfg, step, drain_pending, ev),
        Phase::Recovering {
            epoch,
            step,
            drain_pending,
            outcome,
        } => recovering(cfg, epoch, step, drain_pending, outcome, ev),
        Phase::Ready { epoch, running } => ready(cfg, epoch, running, ev),
        Phase::Draining {
            epoch,
            cause,
            step,
            outcome,
        } => draining(cfg, epoch, cause, step, outcome, ev),
        // Terminal phases accept nothing: the run is over and the driver has exited.
        Phase::Released(_) | Phase::Cancelled(_) | Phase::Refused(_) => Reject,
    }
}

fn outcome(cfg: &Config, reason: Reason) -> Outcome {
    Outcome::new(reason, cfg.busy_code)
}

fn cold(cfg: &Config, step: ColdStep, drain_pending: bool, ev: Event) -> Decision {
    let waiting = !matches!(step, ColdStep::Idle);
    let stay = |step| Phase::Cold {
        step,
        drain_pending,
    };
    match ev {
        Event::Start => match step {
            ColdStep::Idle => Move(stay(ColdStep::Acquiring), vec![Action::AcquireLease]),
            ColdStep::Acquiring | ColdStep::Waiting => Reject,
        },
        Event::LeaseBusy => match step {
            ColdStep::Acquiring => Move(stay(ColdStep::Waiting), vec![Action::Note(Note::Waiting)]),
            // The lease reports contention once; a repeat changes nothing.
            ColdStep::Waiting => Ignore,
            ColdStep::Idle => Reject,
        },
        Event::LeaseGranted { epoch } if waiting => Move(
            Phase::Recovering {
                epoch,
                step: RecoveryStep::Verifying,
                drain_pending,
                outcome: None,
            },
            vec![Action::Note(Note::Owned(epoch)), Action::Recover],
        ),
        Event::WaitExpired if waiting => {
            let o = outcome(cfg, Reason::Busy);
            Move(
                Phase::Cancelled(o),
                vec![Action::Note(Note::Busy), Action::Exit(o)],
            )
        }
        Event::LeaseFailed(fault) if waiting => {
            let mut o = outcome(cfg, Reason::Refused);
            o.refusal = Some(refusal_of(fault));
            Move(
                Phase::Refused(o),
                vec![Action::Note(Note::Refused), Action::Exit(o)],
            )
        }
        Event::Stop(sig) => {
            let mut o = outcome(cfg, Reason::Cancelled);
            o.signal = Some(sig);
            let mut actions = Vec::with_capacity(3);
            if waiting {
                actions.push(Action::AbandonAcquire);
            }
            actions.extend([Action::Note(Note::Cancelled), Action::Exit(o)]);
            Move(Phase::Cancelled(o), actions)
        }
        // Card H2: a drain requested before the lease begins now; the owner then recovers and
        // closes.
        Event::DrainRequested => {
            if drain_pending {
                Ignore
            } else {
                Move(
                    Phase::Cold {
                        step,
                        drain_pending: true,
                    },
                    vec![Action::BeginDrain],
                )
            }
        }
        // Nothing of a workload runs before the lease: the signal has nobody to reach, and the
        // owner survives it (card T3).
        Event::Stray(_) => Ignore,
        Event::LeaseGranted { .. } | Event::WaitExpired | Event::LeaseFailed(_) => Reject,
        Event::RecoveryDone
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
        | Event::LeaseReleased => Reject,
    }
}

fn refusal_of(fault: Fault) -> Refusal {
    match fault {
        Fault::State => Refusal::State,
        Fault::Io => Refusal::Io,
    }
}

/// Where a stop signal goes while `running` runs: the main process first under
/// `--kill-mode main`, otherwise (and once the main process has exited) every process of the
/// workload at once.
fn stop_target(cfg: &Config, running: Running) -> Target {
    match (running, cfg.kill_mode) {
        (Running::Main, KillMode::Main) => Target::Main,
        (Running::Main, KillMode::Tree) | (Running::Tree, KillMode::Main | KillMode::Tree) => {
            Target::Tree
        }
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

/// Whether `sig` is a HUP that this configuration forwards instead of stopping on (while ready
/// or draining; waiting and recovering keep the cards' behaviour).
fn hup_forwarded(cfg: &Config, sig: Signal) -> bool {
    matches!(sig, Signal::Hup)
        && matches!(cfg.hup, HupPolicy::Forward)
        && matches!(cfg.workload, Workload::Child(_))
}

/// Recovery is abandoned with this outcome: stop the workload if one runs (`running`), then
/// release. Nothing is ever published from here (card G3).
fn abandon_recovery(
    cfg: &Config,
    epoch: u64,
    drain_pending: bool,
    o: Outcome,
    running: Option<Running>,
    forward: Signal,
    mut actions: Vec<Action>,
) -> Decision {
    let step = match running {
        Some(r) => {
            actions.extend([
                Action::Forward(forward, stop_target(cfg, r)),
                Action::ArmTimer(Timer::Grace, cfg.grace),
            ]);
            RecoveryStep::Aborting(ChildStop::Signalled, r)
        }
        None => {
            actions.push(Action::ReleaseLease);
            RecoveryStep::Releasing
        }
    };
    Move(
        Phase::Recovering {
            epoch,
            step,
            drain_pending,
            outcome: Some(o),
        },
        actions,
    )
}

/// The bookkeeping every drain starts with: the outcome it is heading for, `BeginDrain` (unless
/// `begun`: a drain requested before recovery completed already emitted it, so it happens
/// exactly once per ownership), the registration and the notifications.
fn drain_prefix(
    cfg: &Config,
    cause: DrainCause,
    begun: bool,
    mut actions: Vec<Action>,
) -> (Outcome, Vec<Action>) {
    let mut o = outcome(cfg, Reason::Stopped);
    match cause {
        DrainCause::Signal(s) => o.signal = Some(s),
        DrainCause::RootLost => o.refusal = Some(Refusal::RootLost),
        DrainCause::ChildStopping | DrainCause::ChildExited => o.reason = Reason::Exited,
        DrainCause::Watchdog => o.reason = Reason::Watchdog,
        DrainCause::Requested => {}
    }
    if !begun {
        actions.push(Action::BeginDrain);
    }
    actions.extend([
        Action::SetPhase(PhaseKind::Draining),
        Action::Note(Note::Draining(cause)),
        Action::NotifyStopping,
    ]);
    (o, actions)
}

/// Enter the drain while the workload still runs (`running` is `None` only when a drain was
/// requested before any child was started).
fn enter_drain(
    cfg: &Config,
    epoch: u64,
    cause: DrainCause,
    begun: bool,
    running: Option<Running>,
    pre: Vec<Action>,
) -> Decision {
    let (o, mut actions) = drain_prefix(cfg, cause, begun, pre);
    let forward = match cause {
        DrainCause::Signal(s) => Some(s),
        DrainCause::Requested | DrainCause::RootLost | DrainCause::Watchdog => Some(Signal::Term),
        DrainCause::ChildStopping | DrainCause::ChildExited => None,
    };
    let step = match (cfg.workload, running, forward) {
        (Workload::InProcess, _, _) => {
            actions.push(Action::ArmTimer(Timer::Grace, cfg.grace));
            DrainStep::Settling
        }
        // No child was ever started, so nothing runs and nothing was staged.
        (Workload::Child(_), None, _) => {
            actions.push(Action::ReleaseLease);
            DrainStep::Releasing
        }
        (Workload::Child(_), Some(r), Some(s)) => {
            actions.extend([
                Action::Forward(s, stop_target(cfg, r)),
                Action::ArmTimer(Timer::Grace, cfg.grace),
            ]);
            DrainStep::Stopping(ChildStop::Signalled, r)
        }
        (Workload::Child(_), Some(r), None) => DrainStep::Stopping(ChildStop::Announced, r),
    };
    Move(
        Phase::Draining {
            epoch,
            cause,
            step,
            outcome: o,
        },
        actions,
    )
}

/// The whole workload ended by itself while recovering or ready: drain, publish only after
/// exit 0, pass its exit code through.
fn child_ended_by_itself(
    cfg: &Config,
    epoch: u64,
    begun: bool,
    status: ChildStatus,
    pre: Vec<Action>,
) -> Decision {
    let (mut o, mut actions) = drain_prefix(cfg, DrainCause::ChildExited, begun, pre);
    o.child = Some(status);
    let step = finish_child(&mut actions, status.success());
    Move(
        Phase::Draining {
            epoch,
            cause: DrainCause::ChildExited,
            step,
            outcome: o,
        },
        actions,
    )
}

/// The main process exited by itself but left processes behind (card T1): drain, and stop what
/// remains as any stop does (TERM, grace, SIGKILL) before anything is published or released.
/// The main process's exit code is the run's, unless the rest had to be killed.
fn main_ended_by_itself(
    cfg: &Config,
    epoch: u64,
    begun: bool,
    status: ChildStatus,
    pre: Vec<Action>,
) -> Decision {
    let (mut o, mut actions) = drain_prefix(cfg, DrainCause::ChildExited, begun, pre);
    o.child = Some(status);
    actions.extend([
        Action::Note(Note::TreeRemains),
        Action::Forward(Signal::Term, Target::Tree),
        Action::ArmTimer(Timer::Grace, cfg.grace),
    ]);
    Move(
        Phase::Draining {
            epoch,
            cause: DrainCause::ChildExited,
            step: DrainStep::Stopping(ChildStop::Signalled, Running::Tree),
            outcome: o,
        },
        actions,
    )
}

/// A forking daemon with no known main process ended by itself: nothing reports an exit status,
/// so nothing vouches for what it staged; the lease is released without publishing.
fn tree_ended_by_itself(cfg: &Config, epoch: u64, pre: Vec<Action>) -> Decision {
    let (o, mut actions) = drain_prefix(cfg, DrainCause::ChildExited, false, pre);
    let step = finish_child(&mut actions, false);
    Move(
        Phase::Draining {
            epoch,
            cause: DrainCause::ChildExited,
            step,
            outcome: o,
        },
        actions,
    )
}

/// After the workload is gone: publish if the drain may (exit 0, stopped in order), otherwise
/// release at once.
fn finish_child(actions: &mut Vec<Action>, publish: bool) -> DrainStep {
    if publish {
        actions.push(Action::Publish);
        DrainStep::Publishing
    } else {
        actions.push(Action::ReleaseLease);
        DrainStep::Releasing
    }
}

/// What an event does to a workload that is being stopped, the same while recovery is
/// abandoned and while draining.
enum StopStep {
    /// Still stopping: the next step, what runs, the main process's status if this event
    /// reported it, and the actions.
    Go(ChildStop, Running, Option<ChildStatus>, Vec<Action>),
    /// The whole workload is gone; the main process's status if this event reported it, and the
    /// actions (disarming the stop's timer).
    Gone(Option<ChildStatus>, Vec<Action>),
    /// Accepted, nothing changes.
    Ignore,
    /// Illegal here.
    Reject,
    /// Not about the workload: the phase decides.
    Other,
}

/// The stop of a workload: its main process exiting with or without leftovers, the rest of the
/// tree ending, the grace and kill-wait timers, and signals for the workload meanwhile. `sig` is
/// the stop signal in use (for the rest of the tree under `--kill-mode main`).
fn stopping(cfg: &Config, stop: ChildStop, running: Running, sig: Signal, ev: Event) -> StopStep {
    match ev {
        Event::ChildExited(status) => match running {
            Running::Main => StopStep::Gone(Some(status), stop_timer(stop)),
            Running::Tree => StopStep::Reject,
        },
        Event::MainExited(status) => match running {
            Running::Tree => StopStep::Reject,
            // The main process is gone but its tree is not: the lease stays until it is, and the
            // rest gets the same stop (invariant I7, card T1).
            Running::Main => {
                let mut actions = vec![Action::Note(Note::TreeRemains)];
                match (stop, cfg.kill_mode) {
                    // Nothing was sent yet (`STOPPING=1`), or the stop signal reached only the
                    // main process: now the rest gets it, with a grace of its own.
                    (ChildStop::Announced, KillMode::Tree | KillMode::Main) => actions.extend([
                        Action::Forward(Signal::Term, Target::Tree),
                        Action::ArmTimer(Timer::Grace, cfg.grace),
                    ]),
                    (ChildStop::Signalled, KillMode::Main) => actions.extend([
                        Action::Forward(sig, Target::Tree),
                        Action::ArmTimer(Timer::Grace, cfg.grace),
                    ]),
                    // The whole tree already got the stop signal (or SIGKILL): once is enough,
                    // and the running timer goes on.
                    (ChildStop::Signalled, KillMode::Tree)
                    | (
                        ChildStop::Killed | ChildStop::Unreapable,
                        KillMode::Tree | KillMode::Main,
                    ) => {}
                }
                let next = match stop {
                    ChildStop::Announced | ChildStop::Signalled => ChildStop::Signalled,
                    ChildStop::Killed => ChildStop::Killed,
                    ChildStop::Unreapable => ChildStop::Unreapable,
                };
                StopStep::Go(next, Running::Tree, Some(status), actions)
            }
        },
        Event::TreeEmpty => match running {
            Running::Tree => StopStep::Gone(None, stop_timer(stop)),
            Running::Main => StopStep::Reject,
        },
        Event::TimerExpired(t) => match escalate(cfg, stop, t) {
            Some((next, actions)) => StopStep::Go(next, running, None, actions),
            None => StopStep::Reject,
        },
        // The workload still runs: a signal for it reaches it (card T3).
        Event::Stray(n) => StopStep::Go(
            stop,
            running,
            None,
            vec![Action::Relay(n, relay_target(running))],
        ),
        Event::ChildExtendTimeout(d) => match stop {
            ChildStop::Signalled => StopStep::Go(
                stop,
                running,
                None,
                vec![Action::ExtendTimer(Timer::Grace, d)],
            ),
            ChildStop::Announced | ChildStop::Killed | ChildStop::Unreapable => StopStep::Ignore,
        },
        // Late notifications change nothing: the stop runs to its end.
        Event::ChildReady | Event::ChildStopping | Event::ChildWatchdog | Event::MainAdopted => {
            StopStep::Ignore
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
        | Event::Stop(_)
        | Event::DrainRequested
        | Event::RootLost
        | Event::ResidenciesSettled
        | Event::CheckpointPublished
        | Event::CheckpointSkipped
        | Event::CheckpointFailed
        | Event::LeaseReleased => StopStep::Other,
    }
}

fn recovering(
    cfg: &Config,
    epoch: u64,
    step: RecoveryStep,
    drain_pending: bool,
    abandoned: Option<Outcome>,
    ev: Event,
) -> Decision {
    let at = |step| Phase::Recovering {
        epoch,
        step,
        drain_pending,
        outcome: abandoned,
    };
    let refused = |refusal: Refusal| {
        let mut o = outcome(cfg, Reason::Refused);
        o.refusal = Some(refusal);
        if let Refusal::Signal(s) = refusal {
            o.signal = Some(s);
        }
        o
    };
    let became_ready = |running: Running, pre: Vec<Action>| {
        if drain_pending {
            enter_drain(cfg, epoch, DrainCause::Requested, true, Some(running), pre)
        } else {
            let mut actions = pre;
            actions.extend([
                Action::SetPhase(PhaseKind::Ready),
                Action::Note(Note::Ready),
                Action::NotifyReady,
            ]);
            if let (Workload::Child(_), Some(d)) = (cfg.workload, cfg.watchdog) {
                actions.push(Action::ArmTimer(Timer::Watchdog, d));
            }
            Move(Phase::Ready { epoch, running }, actions)
        }
    };
    let readiness_armed = matches!(
        step,
        RecoveryStep::AwaitingReady | RecoveryStep::AwaitingMain
    ) && cfg.ready_timeout.is_some();
    let disarm_readiness = || {
        if readiness_armed {
            vec![Action::DisarmTimer(Timer::Readiness)]
        } else {
            Vec::new()
        }
    };
    let extend_readiness = |d| {
        if readiness_armed {
            Move(at(step), vec![Action::ExtendTimer(Timer::Readiness, d)])
        } else {
            Ignore
        }
    };
    let forking = matches!(cfg.workload, Workload::Child(ReadyMode::Forking));
    match step {
        RecoveryStep::Verifying => match ev {
            Event::RecoveryDone => match cfg.workload {
                Workload::InProcess => became_ready(Running::Main, Vec::new()),
                // A drain requested before recovery: no child was started, so close at once.
                Workload::Child(_) if drain_pending => {
                    enter_drain(cfg, epoch, DrainCause::Requested, true, None, Vec::new())
                }
                Workload::Child(_) => Move(at(RecoveryStep::Spawning), vec![Action::SpawnChild]),
            },
            Event::RecoveryFailed(fault) => abandon_recovery(
                cfg,
                epoch,
                drain_pending,
                refused(refusal_of(fault)),
                None,
                Signal::Term,
                vec![Action::Note(Note::Refused)],
            ),
            Event::Stop(sig) => abandon_recovery(
                cfg,
                epoch,
                drain_pending,
                refused(Refusal::Signal(sig)),
                None,
                sig,
                Vec::new(),
            ),
            Event::RootLost => abandon_recovery(
                cfg,
                epoch,
                drain_pending,
                refused(Refusal::RootLost),
                None,
                Signal::Term,
                Vec::new(),
            ),
            Event::DrainRequested => drain_request(epoch, step, drain_pending, abandoned),
            // No workload was started yet: nobody to forward to.
            Event::Stray(_) => Ignore,
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
            | Event::ResidenciesSettled
            | Event::TimerExpired(_)
            | Event::CheckpointPublished
            | Event::CheckpointSkipped
            | Event::CheckpointFailed
            | Event::LeaseReleased => Reject,
        },
        RecoveryStep::Spawning => match ev {
            Event::ChildSpawned => match cfg.workload {
                Workload::Child(ReadyMode::Start) => {
                    became_ready(Running::Main, vec![Action::Note(Note::Spawned)])
                }
                Workload::Child(ReadyMode::Notify | ReadyMode::Forking) => {
                    let mut actions = vec![Action::Note(Note::Spawned)];
                    if let Some(t) = cfg.ready_timeout {
                        actions.push(Action::ArmTimer(Timer::Readiness, t));
                    }
                    Move(at(RecoveryStep::AwaitingReady), actions)
                }
                Workload::InProcess => Reject,
            },
            Event::SpawnFailed(exec) => {
                let mut o = outcome(cfg, Reason::SpawnFailed);
                o.exec = Some(exec);
                abandon_recovery(cfg, epoch, drain_pending, o, None, Signal::Term, Vec::new())
            }
            // The driver starts the child synchronously and delivers signals between steps,
            // so nothing else can arrive while spawning.
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
            | Event::Stop(_)
            | Event::Stray(_)
            | Event::DrainRequested
            | Event::RootLost
            | Event::ResidenciesSettled
            | Event::TimerExpired(_)
            | Event::CheckpointPublished
            | Event::CheckpointSkipped
            | Event::CheckpointFailed
            | Event::LeaseReleased => Reject,
        },
        RecoveryStep::AwaitingReady => match ev {
            // A forking daemon is ready when its first process exits, not when it says so.
            Event::ChildReady if forking => Ignore,
            Event::ChildReady => became_ready(Running::Main, disarm_readiness()),
            Event::ChildStopping => enter_drain(
                cfg,
                epoch,
                DrainCause::ChildStopping,
                drain_pending,
                Some(Running::Main),
                disarm_readiness(),
            ),
            Event::ChildExited(status) => {
                child_ended_by_itself(cfg, epoch, drain_pending, status, disarm_readiness())
            }
            // Card T4: a forking daemon's first process exited 0 and left its daemon behind.
            Event::MainExited(status) if forking && status.success() => {
                if cfg.pid_file {
                    Move(at(RecoveryStep::AwaitingMain), Vec::new())
                } else {
                    became_ready(Running::Tree, disarm_readiness())
                }
            }
            Event::MainExited(status) => {
                main_ended_by_itself(cfg, epoch, drain_pending, status, disarm_readiness())
            }
            Event::Stop(sig) => abandon_recovery(
                cfg,
                epoch,
                drain_pending,
                refused(Refusal::Signal(sig)),
                Some(Running::Main),
                sig,
                disarm_readiness(),
            ),
            Event::TimerExpired(Timer::Readiness) if readiness_armed => abandon_recovery(
                cfg,
                epoch,
                drain_pending,
                refused(Refusal::ReadinessTimedOut),
                Some(Running::Main),
                Signal::Term,
                vec![Action::Note(Note::ReadinessTimedOut)],
            ),
            Event::RootLost => abandon_recovery(
                cfg,
                epoch,
                drain_pending,
                refused(Refusal::RootLost),
                Some(Running::Main),
                Signal::Term,
                disarm_readiness(),
            ),
            Event::DrainRequested => drain_request(epoch, step, drain_pending, abandoned),
            Event::Stray(n) => Move(at(step), vec![Action::Relay(n, Target::Main)]),
            Event::ChildExtendTimeout(d) => extend_readiness(d),
            // The watchdog runs from readiness on.
            Event::ChildWatchdog => Ignore,
            Event::Start
            | Event::LeaseBusy
            | Event::LeaseGranted { .. }
            | Event::WaitExpired
            | Event::LeaseFailed(_)
            | Event::RecoveryDone
            | Event::RecoveryFailed(_)
            | Event::ChildSpawned
            | Event::SpawnFailed(_)
            | Event::TreeEmpty
            | Event::MainAdopted
            | Event::ResidenciesSettled
            | Event::TimerExpired(_)
            | Event::CheckpointPublished
            | Event::CheckpointSkipped
            | Event::CheckpointFailed
            | Event::LeaseReleased => Reject,
        },
        RecoveryStep::AwaitingMain => match ev {
            Event::MainAdopted => became_ready(Running::Main, disarm_readiness()),
            // The daemon is gone before its pid file named it: it never became ready.
            Event::TreeEmpty => abandon_recovery(
                cfg,
                epoch,
                drain_pending,
                refused(Refusal::NoMainPid),
                None,
                Signal::Term,
                disarm_readiness(),
            ),
            Event::Stop(sig) => abandon_recovery(
                cfg,
                epoch,
                drain_pending,
                refused(Refusal::Signal(sig)),
                Some(Running::Tree),
                sig,
                disarm_readiness(),
            ),
            Event::TimerExpired(Timer::Readiness) if readiness_armed => abandon_recovery(
                cfg,
                epoch,
                drain_pending,
                refused(Refusal::ReadinessTimedOut),
                Some(Running::Tree),
                Signal::Term,
                vec![Action::Note(Note::ReadinessTimedOut)],
            ),
            Event::RootLost => abandon_recovery(
                cfg,
                epoch,
                drain_pending,
                refused(Refusal::RootLost),
                Some(Running::Tree),
                Signal::Term,
                disarm_readiness(),
            ),
            Event::DrainRequested => drain_request(epoch, step, drain_pending, abandoned),
            Event::Stray(n) => Move(at(step), vec![Action::Relay(n, Target::Tree)]),
            Event::ChildExtendTimeout(d) => extend_readiness(d),
            Event::ChildReady | Event::ChildStopping | Event::ChildWatchdog => Ignore,
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
            | Event::ResidenciesSettled
            | Event::TimerExpired(_)
            | Event::CheckpointPublished
            | Event::CheckpointSkipped
            | Event::CheckpointFailed
            | Event::LeaseReleased => Reject,
        },
        RecoveryStep::Aborting(stop, running) => {
            let Some(o) = abandoned else { return Reject };
            let sig = o.signal.unwrap_or(Signal::Term);
            match stopping(cfg, stop, running, sig, ev) {
                StopStep::Go(next, running, status, actions) => {
                    let mut o = o;
                    if status.is_some() {
                        o.child = status;
                    }
                    Move(
                        Phase::Recovering {
                            epoch,
                            step: RecoveryStep::Aborting(next, running),
                            drain_pending,
                            outcome: Some(o),
                        },
                        actions,
                    )
                }
                StopStep::Gone(status, mut actions) => {
                    let mut o = o;
                    if status.is_some() {
                        o.child = status;
                    }
                    match stop {
                        ChildStop::Killed => o.killed = true,
                        ChildStop::Unreapable => {
                            o.killed = true;
                            o.reason = Reason::DidNotStop;
                        }
                        ChildStop::Announced | ChildStop::Signalled => {}
                    }
                    actions.push(Action::ReleaseLease);
                    Move(
                        Phase::Recovering {
                            epoch,
                            step: RecoveryStep::Releasing,
                            drain_pending,
                            outcome: Some(o),
                        },
                        actions,
                    )
                }
                StopStep::Ignore => Ignore,
                StopStep::Reject => Reject,
                // Already stopping: a repeated signal or request changes nothing.
                StopStep::Other => match ev {
                    Event::Stop(_) | Event::DrainRequested | Event::RootLost => Ignore,
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
                    | Event::LeaseReleased => Reject,
                },
            }
        }
        RecoveryStep::Releasing => {
            let Some(o) = abandoned else { return Reject };
            match ev {
                Event::LeaseReleased => Move(
                    Phase::Refused(o),
                    vec![Action::Note(Note::Refused), Action::Exit(o)],
                ),
                Event::Stop(_) | Event::Stray(_) | Event::DrainRequested | Event::RootLost => {
                    Ignore
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
                | Event::CheckpointFailed => Reject,
            }
        }
    }
}

/// Card H2: the first drain request while recovering begins the drain now; recovery goes on and
/// the owner closes as soon as it would have become ready.
fn drain_request(
    epoch: u64,
    step: RecoveryStep,
    drain_pending: bool,
    outcome: Option<Outcome>,
) -> Decision {
    if drain_pending {
        return Ignore;
    }
    Move(
        Phase::Recovering {
            epoch,
            step,
            drain_pending: true,
            outcome,
        },
        vec![Action::BeginDrain],
    )
}

/// The timer that runs while the workload is in this stop step, disarmed when it is gone.
fn stop_timer(stop: ChildStop) -> Vec<Action> {
    match stop {
        ChildStop::Signalled => vec![Action::DisarmTimer(Timer::Grace)],
        ChildStop::Killed => vec![Action::DisarmTimer(Timer::KillWait)],
        ChildStop::Announced | ChildStop::Unreapable => Vec::new(),
    }
}

/// A stop timer fired: grace → SIGKILL to the whole workload, kill wait → `did not stop` (the
/// lease is kept).
fn escalate(cfg: &Config, stop: ChildStop, t: Timer) -> Option<(ChildStop, Vec<Action>)> {
    match (stop, t) {
        (ChildStop::Signalled, Timer::Grace) => Some((
            ChildStop::Killed,
            vec![
                Action::Note(Note::Killed),
                Action::Kill,
                Action::ArmTimer(Timer::KillWait, cfg.kill_wait),
            ],
        )),
        (ChildStop::Killed, Timer::KillWait) => {
            Some((ChildStop::Unreapable, vec![Action::Note(Note::DidNotStop)]))
        }
        (
            ChildStop::Announced | ChildStop::Signalled | ChildStop::Killed | ChildStop::Unreapable,
            _,
        ) => None,
    }
}

fn ready(cfg: &Config, epoch: u64, running: Running, ev: Event) -> Decision {
    let child = matches!(cfg.workload, Workload::Child(_));
    let same = |actions| Move(Phase::Ready { epoch, running }, actions);
    // Every way out of ready ends the watchdog.
    let leave = || {
        if child && cfg.watchdog.is_some() {
            vec![Action::DisarmTimer(Timer::Watchdog)]
        } else {
            Vec::new()
        }
    };
    let main = matches!(running, Running::Main);
    match ev {
        Event::Stop(sig) if hup_forwarded(cfg, sig) => {
            same(vec![Action::Forward(sig, relay_target(running))])
        }
        Event::Stop(sig) => enter_drain(
            cfg,
            epoch,
            DrainCause::Signal(sig),
            false,
            Some(running),
            leave(),
        ),
        Event::DrainRequested => enter_drain(
            cfg,
            epoch,
            DrainCause::Requested,
            false,
            Some(running),
            leave(),
        ),
        Event::RootLost => enter_drain(
            cfg,
            epoch,
            DrainCause::RootLost,
            false,
            Some(running),
            leave(),
        ),
        Event::ChildStopping if child => enter_drain(
            cfg,
            epoch,
            DrainCause::ChildStopping,
            false,
            Some(running),
            leave(),
        ),
        Event::ChildExited(status) if child && main => {
            child_ended_by_itself(cfg, epoch, false, status, leave())
        }
        Event::MainExited(status) if child && main => {
            main_ended_by_itself(cfg, epoch, false, status, leave())
        }
        Event::TreeEmpty if child && !main => tree_ended_by_itself(cfg, epoch, leave()),
        // A forking daemon's main process became known after it was ready.
        Event::MainAdopted if child && !main => Move(
            Phase::Ready {
                epoch,
                running: Running::Main,
            },
            Vec::new(),
        ),
        Event::TimerExpired(Timer::Watchdog) if child && cfg.watchdog.is_some() => enter_drain(
            cfg,
            epoch,
            DrainCause::Watchdog,
            false,
            Some(running),
            vec![Action::Note(Note::WatchdogTimedOut)],
        ),
        Event::ChildWatchdog if child => match cfg.watchdog {
            Some(d) => same(vec![Action::ArmTimer(Timer::Watchdog, d)]),
            None => Ignore,
        },
        // A repeated `READY=1` changes nothing; nothing bounds the time of a ready workload.
        Event::ChildReady | Event::ChildExtendTimeout(_) if child => Ignore,
        Event::Stray(n) if child => same(vec![Action::Relay(n, relay_target(running))]),
        // An in-process host has no workload to forward to; the signal is not for the owner.
        Event::Stray(_) => Ignore,
        Event::ChildStopping
        | Event::ChildExited(_)
        | Event::MainExited(_)
        | Event::TreeEmpty
        | Event::MainAdopted
        | Event::ChildReady
        | Event::ChildWatchdog
        | Event::ChildExtendTimeout(_) => Reject,
        Event::Start
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
        | Event::LeaseReleased => Reject,
    }
}

fn draining(
    cfg: &Config,
    epoch: u64,
    cause: DrainCause,
    step: DrainStep,
    o: Outcome,
    ev: Event,
) -> Decision {
    let at = |step, outcome| Phase::Draining {
        epoch,
        cause,
        step,
        outcome,
    };
    // Once draining, further stop signals, drain requests, moved roots and notifications change
    // nothing: the drain already began and runs to its end exactly once. Signals for a workload
    // that no longer runs have nobody to reach.
    let settled_while = |ev: Event| {
        matches!(
            ev,
            Event::Stop(_)
                | Event::Stray(_)
                | Event::DrainRequested
                | Event::RootLost
                | Event::ChildReady
                | Event::ChildStopping
                | Event::ChildWatchdog
                | Event::ChildExtendTimeout(_)
        )
    };
    match step {
        DrainStep::Settling | DrainStep::Unsettled => match ev {
            Event::ResidenciesSettled => {
                let mut actions = Vec::new();
                if matches!(step, DrainStep::Settling) {
                    actions.push(Action::DisarmTimer(Timer::Grace));
                }
                actions.push(Action::Publish);
                Move(at(DrainStep::Publishing, o), actions)
            }
            Event::TimerExpired(Timer::Grace) if matches!(step, DrainStep::Settling) => {
                // Card H4: the close is bounded; the lease is kept while work may still run.
                Move(
                    at(DrainStep::Unsettled, o),
                    vec![Action::Note(Note::DidNotStop)],
                )
            }
            e if settled_while(e) => Ignore,
            _ => Reject,
        },
        DrainStep::Stopping(stop, running) => {
            match stopping(cfg, stop, running, o.signal.unwrap_or(Signal::Term), ev) {
                StopStep::Go(next, running, status, actions) => {
                    let mut o = o;
                    if status.is_some() {
                        o.child = status;
                    }
                    Move(at(DrainStep::Stopping(next, running), o), actions)
                }
                StopStep::Gone(status, mut actions) => {
                    let mut o = o;
                    if status.is_some() {
                        o.child = status;
                    }
                    let watchdog = matches!(cause, DrainCause::Watchdog);
                    match stop {
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
                    // Published only after the main process exited 0 and the whole workload
                    // stopped in order; a workload that missed its watchdog is not trusted.
                    let publish = o.child.is_some_and(ChildStatus::success)
                        && matches!(stop, ChildStop::Announced | ChildStop::Signalled)
                        && !watchdog;
                    let step = finish_child(&mut actions, publish);
                    Move(at(step, o), actions)
                }
                StopStep::Ignore => Ignore,
                StopStep::Reject => Reject,
                StopStep::Other => match ev {
                    Event::Stop(sig) if hup_forwarded(cfg, sig) => Move(
                        at(step, o),
                        vec![Action::Forward(sig, relay_target(running))],
                    ),
                    // The child announced it is stopping but nothing bounds it yet: a stop
                    // signal now forwards and starts the grace period.
                    Event::Stop(sig) if matches!(stop, ChildStop::Announced) => {
                        let mut o = o;
                        o.signal.get_or_insert(sig);
                        Move(
                            at(DrainStep::Stopping(ChildStop::Signalled, running), o),
                            vec![
                                Action::Forward(sig, stop_target(cfg, running)),
                                Action::ArmTimer(Timer::Grace, cfg.grace),
                            ],
                        )
                    }
                    e if settled_while(e) => Ignore,
                    _ => Reject,
                },
            }
        }
        DrainStep::Publishing => match ev {
            Event::CheckpointPublished => Move(
                at(DrainStep::Releasing, o),
                vec![
                    Action::Note(Note::CheckpointPublished),
                    Action::ReleaseLease,
                ],
            ),
            Event::CheckpointSkipped => {
                Move(at(DrainStep::Releasing, o), vec![Action::ReleaseLease])
            }
            Event::CheckpointFailed => {
                let mut o = o;
                o.reason = Reason::PublishFailed;
                Move(
                    at(DrainStep::Releasing, o),
                    vec![Action::Note(Note::PublishFailed), Action::ReleaseLease],
                )
            }
            e if settled_while(e) => Ignore,
            _ => Reject,
        },
        DrainStep::Releasing => match ev {
            Event::LeaseReleased => Move(
                Phase::Released(o),
                vec![Action::Note(Note::Released), Action::Exit(o)],
            ),
            e if settled_while(e) => Ignore,
            _ => Reject,
        },
    }
}

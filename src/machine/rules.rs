//! The transition rules: `next(config, phase, event)`. This is the only place a phase changes.
//!
//! Every match on the phase lists every phase, and every match on the event lists every event,
//! so adding either breaks the build exactly where a decision is missing (as rustls does).

use super::action::{Action, DrainCause, Note, Outcome, Reason, Refusal};
use super::event::{ChildStatus, Event, Fault, Signal, Timer};
use super::{
    ChildStop, ColdStep, Config, DrainStep, Phase, PhaseKind, ReadyMode, RecoveryStep, Workload,
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
        Phase::Ready { epoch } => ready(cfg, epoch, ev),
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
        Event::LeaseGranted { .. } | Event::WaitExpired | Event::LeaseFailed(_) => Reject,
        Event::RecoveryDone
        | Event::RecoveryFailed(_)
        | Event::ChildSpawned
        | Event::SpawnFailed(_)
        | Event::ChildReady
        | Event::ChildStopping
        | Event::ChildExited(_)
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

/// Recovery is abandoned with this outcome: stop the child if one runs, then release.
/// Nothing is ever published from here (card G3).
fn abandon_recovery(
    epoch: u64,
    drain_pending: bool,
    o: Outcome,
    child: bool,
    forward: Signal,
    grace: std::time::Duration,
    mut actions: Vec<Action>,
) -> Decision {
    let step = if child {
        actions.extend([
            Action::Forward(forward),
            Action::ArmTimer(Timer::Grace, grace),
        ]);
        RecoveryStep::Aborting(ChildStop::Signalled)
    } else {
        actions.push(Action::ReleaseLease);
        RecoveryStep::Releasing
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

/// Enter the drain while the workload still runs (`child_running` is false only when a drain
/// was requested before any child was started).
fn enter_drain(
    cfg: &Config,
    epoch: u64,
    cause: DrainCause,
    begun: bool,
    child_running: bool,
    pre: Vec<Action>,
) -> Decision {
    let (o, mut actions) = drain_prefix(cfg, cause, begun, pre);
    let forward = match cause {
        DrainCause::Signal(s) => Some(s),
        DrainCause::Requested | DrainCause::RootLost => Some(Signal::Term),
        DrainCause::ChildStopping | DrainCause::ChildExited => None,
    };
    let step = match (cfg.workload, forward) {
        (Workload::InProcess, _) => {
            actions.push(Action::ArmTimer(Timer::Grace, cfg.grace));
            DrainStep::Settling
        }
        // No child was ever started, so nothing runs and nothing was staged.
        (Workload::Child(_), _) if !child_running => {
            actions.push(Action::ReleaseLease);
            DrainStep::Releasing
        }
        (Workload::Child(_), Some(s)) => {
            actions.extend([
                Action::Forward(s),
                Action::ArmTimer(Timer::Grace, cfg.grace),
            ]);
            DrainStep::Stopping(ChildStop::Signalled)
        }
        (Workload::Child(_), None) => DrainStep::Stopping(ChildStop::Announced),
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

/// The child ended by itself while recovering or ready: drain, publish only after exit 0, pass
/// its exit code through.
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

/// After the child was reaped: publish if it exited 0, otherwise release at once.
fn finish_child(actions: &mut Vec<Action>, publish: bool) -> DrainStep {
    if publish {
        actions.push(Action::Publish);
        DrainStep::Publishing
    } else {
        actions.push(Action::ReleaseLease);
        DrainStep::Releasing
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
    let became_ready = |pre: Vec<Action>| {
        if drain_pending {
            enter_drain(cfg, epoch, DrainCause::Requested, true, true, pre)
        } else {
            let mut actions = pre;
            actions.extend([
                Action::SetPhase(PhaseKind::Ready),
                Action::Note(Note::Ready),
                Action::NotifyReady,
            ]);
            Move(Phase::Ready { epoch }, actions)
        }
    };
    let readiness_armed =
        matches!(step, RecoveryStep::AwaitingReady) && cfg.ready_timeout.is_some();
    let disarm_readiness = || {
        if readiness_armed {
            vec![Action::DisarmTimer(Timer::Readiness)]
        } else {
            Vec::new()
        }
    };
    match step {
        RecoveryStep::Verifying => match ev {
            Event::RecoveryDone => match cfg.workload {
                Workload::InProcess => became_ready(Vec::new()),
                // A drain requested before recovery: no child was started, so close at once.
                Workload::Child(_) if drain_pending => {
                    enter_drain(cfg, epoch, DrainCause::Requested, true, false, Vec::new())
                }
                Workload::Child(_) => Move(at(RecoveryStep::Spawning), vec![Action::SpawnChild]),
            },
            Event::RecoveryFailed(fault) => abandon_recovery(
                epoch,
                drain_pending,
                refused(refusal_of(fault)),
                false,
                Signal::Term,
                cfg.grace,
                vec![Action::Note(Note::Refused)],
            ),
            Event::Stop(sig) => abandon_recovery(
                epoch,
                drain_pending,
                refused(Refusal::Signal(sig)),
                false,
                sig,
                cfg.grace,
                Vec::new(),
            ),
            Event::RootLost => abandon_recovery(
                epoch,
                drain_pending,
                refused(Refusal::RootLost),
                false,
                Signal::Term,
                cfg.grace,
                Vec::new(),
            ),
            Event::DrainRequested => drain_request(epoch, step, drain_pending, abandoned),
            Event::Start
            | Event::LeaseBusy
            | Event::LeaseGranted { .. }
            | Event::WaitExpired
            | Event::LeaseFailed(_)
            | Event::ChildSpawned
            | Event::SpawnFailed(_)
            | Event::ChildReady
            | Event::ChildStopping
            | Event::ChildExited(_)
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
                    became_ready(vec![Action::Note(Note::Spawned)])
                }
                Workload::Child(ReadyMode::Notify) => {
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
                abandon_recovery(
                    epoch,
                    drain_pending,
                    o,
                    false,
                    Signal::Term,
                    cfg.grace,
                    Vec::new(),
                )
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
            | Event::ChildExited(_)
            | Event::Stop(_)
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
            Event::ChildReady => became_ready(disarm_readiness()),
            Event::ChildStopping => enter_drain(
                cfg,
                epoch,
                DrainCause::ChildStopping,
                drain_pending,
                true,
                disarm_readiness(),
            ),
            Event::ChildExited(status) => {
                child_ended_by_itself(cfg, epoch, drain_pending, status, disarm_readiness())
            }
            Event::Stop(sig) => abandon_recovery(
                epoch,
                drain_pending,
                refused(Refusal::Signal(sig)),
                true,
                sig,
                cfg.grace,
                disarm_readiness(),
            ),
            Event::TimerExpired(Timer::Readiness) if readiness_armed => abandon_recovery(
                epoch,
                drain_pending,
                refused(Refusal::ReadinessTimedOut),
                true,
                Signal::Term,
                cfg.grace,
                vec![Action::Note(Note::ReadinessTimedOut)],
            ),
            Event::RootLost => abandon_recovery(
                epoch,
                drain_pending,
                refused(Refusal::RootLost),
                true,
                Signal::Term,
                cfg.grace,
                disarm_readiness(),
            ),
            Event::DrainRequested => drain_request(epoch, step, drain_pending, abandoned),
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
        },
        RecoveryStep::Aborting(stop) => {
            let Some(o) = abandoned else { return Reject };
            match ev {
                Event::ChildExited(status) => {
                    let mut o = o;
                    o.child = Some(status);
                    match stop {
                        ChildStop::Killed => o.killed = true,
                        ChildStop::Unreapable => {
                            o.killed = true;
                            o.reason = Reason::DidNotStop;
                        }
                        ChildStop::Announced | ChildStop::Signalled => {}
                    }
                    let mut actions = stop_timer(stop);
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
                Event::TimerExpired(t) => match escalate(cfg, stop, t) {
                    Some((next, actions)) => Move(at(RecoveryStep::Aborting(next)), actions),
                    None => Reject,
                },
                // Already stopping: a repeated signal or a late notification changes nothing.
                Event::Stop(_)
                | Event::ChildReady
                | Event::ChildStopping
                | Event::DrainRequested
                | Event::RootLost => Ignore,
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
                | Event::CheckpointPublished
                | Event::CheckpointSkipped
                | Event::CheckpointFailed
                | Event::LeaseReleased => Reject,
            }
        }
        RecoveryStep::Releasing => {
            let Some(o) = abandoned else { return Reject };
            match ev {
                Event::LeaseReleased => Move(
                    Phase::Refused(o),
                    vec![Action::Note(Note::Refused), Action::Exit(o)],
                ),
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
                | Event::ChildExited(_)
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

/// The timer that runs while the child is in this stop step, disarmed when it is reaped.
fn stop_timer(stop: ChildStop) -> Vec<Action> {
    match stop {
        ChildStop::Signalled => vec![Action::DisarmTimer(Timer::Grace)],
        ChildStop::Killed => vec![Action::DisarmTimer(Timer::KillWait)],
        ChildStop::Announced | ChildStop::Unreapable => Vec::new(),
    }
}

/// A stop timer fired: grace → SIGKILL, kill wait → `did not stop` (the lease is kept).
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

fn ready(cfg: &Config, epoch: u64, ev: Event) -> Decision {
    let child = matches!(cfg.workload, Workload::Child(_));
    match ev {
        Event::Stop(sig) => {
            enter_drain(cfg, epoch, DrainCause::Signal(sig), false, true, Vec::new())
        }
        Event::DrainRequested => {
            enter_drain(cfg, epoch, DrainCause::Requested, false, true, Vec::new())
        }
        Event::RootLost => enter_drain(cfg, epoch, DrainCause::RootLost, false, true, Vec::new()),
        Event::ChildStopping if child => enter_drain(
            cfg,
            epoch,
            DrainCause::ChildStopping,
            false,
            true,
            Vec::new(),
        ),
        Event::ChildExited(status) if child => {
            child_ended_by_itself(cfg, epoch, false, status, Vec::new())
        }
        // A repeated `READY=1` changes nothing.
        Event::ChildReady if child => Ignore,
        Event::ChildStopping | Event::ChildExited(_) | Event::ChildReady => Reject,
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
    // nothing: the drain already began and runs to its end exactly once.
    let settled_while = |ev: Event| {
        matches!(
            ev,
            Event::Stop(_)
                | Event::DrainRequested
                | Event::RootLost
                | Event::ChildReady
                | Event::ChildStopping
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
        DrainStep::Stopping(stop) => match ev {
            Event::ChildExited(status) => {
                let mut o = o;
                o.child = Some(status);
                match stop {
                    ChildStop::Killed => {
                        o.killed = true;
                        o.reason = Reason::Killed;
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
                let mut actions = stop_timer(stop);
                let publish =
                    status.success() && matches!(stop, ChildStop::Announced | ChildStop::Signalled);
                let step = finish_child(&mut actions, publish);
                Move(at(step, o), actions)
            }
            Event::TimerExpired(t) => match escalate(cfg, stop, t) {
                Some((next, actions)) => Move(at(DrainStep::Stopping(next), o), actions),
                None => Reject,
            },
            // The child announced it is stopping but nothing bounds it yet: a stop signal now
            // forwards and starts the grace period.
            Event::Stop(sig) if matches!(stop, ChildStop::Announced) => {
                let mut o = o;
                o.signal.get_or_insert(sig);
                Move(
                    at(DrainStep::Stopping(ChildStop::Signalled), o),
                    vec![
                        Action::Forward(sig),
                        Action::ArmTimer(Timer::Grace, cfg.grace),
                    ],
                )
            }
            e if settled_while(e) => Ignore,
            _ => Reject,
        },
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

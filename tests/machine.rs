//! The pure machine against the cards it must reproduce, and an exhaustive check of the
//! spec's machine-level invariants over every reachable state and every event.
//!
//! These tests drive `tenure::machine` only; the lease, checkpoint and runner tests check the
//! same cards against real files and processes.

use std::collections::{HashSet, VecDeque};
use tenure::machine::{
    Action, ChildStatus, Config, Event, Machine, Note, Outcome, PhaseKind, ReadyMode, Reason,
    Refusal, Signal, Target, Timer, table,
};

/// Feeds events in order, panicking on a rejection, and returns every action.
fn run(m: &mut Machine, events: &[Event]) -> Vec<Action> {
    let mut all = Vec::new();
    for &e in events {
        let h = m
            .handle(e)
            .unwrap_or_else(|r| panic!("{e} rejected in {}: {r}", m.phase().label()));
        all.extend(h.actions);
    }
    all
}

fn exit_of(actions: &[Action]) -> Outcome {
    match actions.last() {
        Some(Action::Exit(o)) => *o,
        other => panic!("last action is not exit: {other:?}"),
    }
}

/// Card G1: a stop signal before the lease cancels; nothing is acquired or written; exit 143.
#[test]
fn g1_cancel_before_owning() {
    for events in [
        vec![Event::Stop(Signal::Term)],
        vec![Event::Start, Event::Stop(Signal::Term)],
        vec![Event::Start, Event::LeaseBusy, Event::Stop(Signal::Term)],
    ] {
        let mut m = Machine::new(Config::child(ReadyMode::Start));
        let actions = run(&mut m, &events);
        assert_eq!(m.kind(), PhaseKind::Cancelled);
        let o = exit_of(&actions);
        assert_eq!((o.reason, o.code()), (Reason::Cancelled, 143));
        assert!(!actions.iter().any(|a| matches!(
            a,
            Action::SetPhase(_) | Action::Publish | Action::SpawnChild | Action::Recover
        )));
        // Card L3: a waiter that is interrupted abandons its wait (and its waiter entry).
        assert_eq!(
            actions.contains(&Action::AbandonAcquire),
            events.contains(&Event::Start)
        );
    }
}

/// Card G3: a stop while recovering refuses: the signal is forwarded, nothing is published,
/// the lease is released only after the child was reaped, and no ready/released note appears.
#[test]
fn g3_refuse_during_recovery() {
    let mut m = Machine::new(Config::child(ReadyMode::Notify));
    let actions = run(
        &mut m,
        &[
            Event::Start,
            Event::LeaseGranted { epoch: 4 },
            Event::RecoveryDone,
            Event::ChildSpawned,
            Event::Stop(Signal::Term),
        ],
    );
    assert!(actions.contains(&Action::Forward(Signal::Term, Target::Tree)));
    assert!(!actions.contains(&Action::ReleaseLease), "child still runs");
    let actions = run(
        &mut m,
        &[
            Event::ChildExited(ChildStatus::Exited(0)),
            Event::LeaseReleased,
        ],
    );
    assert_eq!(m.kind(), PhaseKind::Refused);
    assert!(!actions.contains(&Action::Publish));
    assert!(!actions.contains(&Action::Note(Note::Ready)));
    assert!(!actions.contains(&Action::Note(Note::Released)));
    let o = exit_of(&actions);
    assert_eq!(o.reason, Reason::Refused);
    assert_eq!(o.refusal, Some(Refusal::Signal(Signal::Term)));
    // spec/lifecycle.md: a refusal by SIGTERM while recovering exits 128 + 15.
    assert_eq!(o.code(), 143);
    assert_eq!(o.summary(), "refused/SIGTERM");
}

/// Card G4: a stop when ready drains, publishes, then releases, in that order; exit 143.
#[test]
fn g4_checkpoint_before_release() {
    let mut m = Machine::new(Config::child(ReadyMode::Start));
    let mut actions = run(
        &mut m,
        &[
            Event::Start,
            Event::LeaseGranted { epoch: 1 },
            Event::RecoveryDone,
            Event::ChildSpawned,
            Event::Stop(Signal::Term),
            Event::ChildExited(ChildStatus::Exited(0)),
        ],
    );
    assert_eq!(actions.last(), Some(&Action::Publish));
    actions.extend(run(
        &mut m,
        &[Event::CheckpointPublished, Event::LeaseReleased],
    ));
    let pos = |a: &Action| actions.iter().position(|x| x == a).unwrap();
    assert!(pos(&Action::Forward(Signal::Term, Target::Tree)) < pos(&Action::Publish));
    assert!(pos(&Action::Publish) < pos(&Action::ReleaseLease));
    assert!(pos(&Action::Note(Note::CheckpointPublished)) < pos(&Action::Note(Note::Released)));
    assert_eq!(m.kind(), PhaseKind::Released);
    assert_eq!(exit_of(&actions).code(), 143);
}

/// Card G5/G6: the lease is not released before the child is reaped; a child that ignores the
/// stop is killed after the grace; one that survives SIGKILL keeps the lease (`did not stop`).
#[test]
fn g5_g6_lease_outlives_child_and_bounded_stop() {
    let mut m = Machine::new(Config::child(ReadyMode::Start));
    run(
        &mut m,
        &[
            Event::Start,
            Event::LeaseGranted { epoch: 1 },
            Event::RecoveryDone,
            Event::ChildSpawned,
            Event::Stop(Signal::Term),
        ],
    );
    let killed = run(&mut m, &[Event::TimerExpired(Timer::Grace)]);
    assert!(killed.contains(&Action::Kill));
    assert!(!killed.contains(&Action::ReleaseLease));
    let stuck = run(&mut m, &[Event::TimerExpired(Timer::KillWait)]);
    assert_eq!(stuck, vec![Action::Note(Note::DidNotStop)]);
    // Nothing but the child's end moves an unreapable drain on; release is impossible before.
    assert!(m.step(Event::LeaseReleased).is_err());
    assert!(m.step(Event::Stop(Signal::Term)).unwrap().1.ignored);
    let end = run(
        &mut m,
        &[
            Event::ChildExited(ChildStatus::Signaled(9)),
            Event::LeaseReleased,
        ],
    );
    assert!(!end.contains(&Action::Publish));
    assert_eq!(exit_of(&end).code(), tenure::machine::EXIT_DID_NOT_STOP);
}

/// Card D3: an executable that cannot be found exits 127, releases, publishes nothing.
#[test]
fn d3_missing_executable() {
    let mut m = Machine::new(Config::child(ReadyMode::Start));
    let actions = run(
        &mut m,
        &[
            Event::Start,
            Event::LeaseGranted { epoch: 1 },
            Event::RecoveryDone,
            Event::SpawnFailed(tenure::machine::ExecFailure::NotFound),
            Event::LeaseReleased,
        ],
    );
    assert!(actions.contains(&Action::ReleaseLease));
    assert!(!actions.contains(&Action::Publish));
    assert_eq!(exit_of(&actions).code(), 127);
}

/// Card H2: a drain requested before recovery completes begins at once — begin-drain is an
/// action of the request itself, before recovery is done — and only once; recovery then runs
/// to its end and the owner closes without ever announcing ready.
#[test]
fn h2_drain_requested_during_recovery() {
    let mut m = Machine::new(Config::in_process());
    let granted = run(&mut m, &[Event::Start, Event::LeaseGranted { epoch: 1 }]);
    assert!(
        granted.contains(&Action::Recover),
        "recovery is requested at grant"
    );
    assert!(!granted.contains(&Action::BeginDrain));
    let requested = run(&mut m, &[Event::DrainRequested]);
    assert!(
        requested.contains(&Action::BeginDrain),
        "begin-drain runs when the drain is requested, before recovery is done: {requested:?}"
    );
    assert_eq!(m.kind(), PhaseKind::Recovering, "recovery is still running");
    let again = m.step(Event::DrainRequested).unwrap().1;
    assert!(again.ignored && again.actions.is_empty(), "{again:?}");
    let rest = run(
        &mut m,
        &[
            Event::RecoveryDone,
            Event::ResidenciesSettled,
            Event::CheckpointSkipped,
            Event::LeaseReleased,
        ],
    );
    assert!(
        !rest.contains(&Action::BeginDrain),
        "the drain begins once: {rest:?}"
    );
    assert!(rest.contains(&Action::ReleaseLease));
    assert!(
        !rest.contains(&Action::Note(Note::Ready)),
        "a drained-before-ready owner never announces ready"
    );
    assert_eq!(m.kind(), PhaseKind::Released);
}

/// Illegal events are typed rejections naming phase and event, and change nothing.
#[test]
fn illegal_events_are_rejected_with_phase_and_event() {
    let m = Machine::new(Config::child(ReadyMode::Start));
    let r = m.step(Event::CheckpointPublished).unwrap_err();
    assert_eq!(r.phase, PhaseKind::Cold);
    let msg = r.to_string();
    assert!(
        msg.contains("checkpoint-published") && msg.contains("cold"),
        "{msg}"
    );
}

/// What an observer of the driver knows about the world, derived from events and actions only.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug, Default)]
struct World {
    /// Some process of the workload may run: the main process, or what remains of its tree.
    child_running: bool,
    publish_outstanding: bool,
    published: bool,
    begin_drains: u8,
    exits: u8,
    lease_held: bool,
    /// The cluster lease was lost (`lease-lost`): nothing may be published or released after.
    lost: bool,
}

/// Exhaustive check over every reachable (machine, world) pair of every profile: the
/// machine-level parts of I6, I7 (for the whole tree: `main-exited` leaves the workload running
/// until `tree-empty`, card T1), I8, I9, I10 and I11. The models check the same properties with
/// many processes and an abstract kernel.
#[test]
fn machine_invariants_hold_in_every_reachable_state() {
    let mut checked = 0usize;
    for (name, config) in table::profiles() {
        let start = (Machine::new(config), World::default());
        let mut seen = HashSet::from([start]);
        let mut queue = VecDeque::from([start]);
        while let Some((m, w)) = queue.pop_front() {
            if m.is_terminal() {
                // I6: nothing leaves a terminal phase.
                for e in Event::samples() {
                    assert!(
                        m.step(e).is_err(),
                        "{name}: {e} left terminal {}",
                        m.phase().label()
                    );
                }
                // I10: exactly one outcome, with the table's exit code.
                assert_eq!(w.exits, 1, "{name}: {}", m.phase().label());
                assert!(!w.lease_held, "{name}: ended while holding the lease");
            }
            for e in Event::samples() {
                let Ok((n, h)) = m.step(e) else { continue };
                let mut w2 = w;
                match e {
                    Event::LeaseGranted { .. } => w2.lease_held = true,
                    Event::ChildSpawned => w2.child_running = true,
                    Event::ChildExited(_) | Event::TreeEmpty => w2.child_running = false,
                    Event::CheckpointPublished => {
                        w2.publish_outstanding = false;
                        w2.published = true;
                    }
                    Event::CheckpointSkipped | Event::CheckpointFailed => {
                        w2.publish_outstanding = false
                    }
                    Event::LeaseReleased => w2.lease_held = false,
                    Event::LeaseLost => {
                        w2.lease_held = false;
                        w2.lost = true;
                    }
                    _ => {}
                }
                for a in &h.actions {
                    match a {
                        // I7: never release while the child may run.
                        Action::ReleaseLease => {
                            // A lost lease is never released: it is already gone.
                            assert!(!w2.lost, "{name}: release after the lease was lost");
                            assert!(
                                !w2.child_running,
                                "{name}: release with child running, {e} in {}",
                                m.phase().label()
                            );
                            // I8: never release while the drain's publish is outstanding.
                            assert!(
                                !w2.publish_outstanding,
                                "{name}: release before publish finished"
                            );
                        }
                        Action::Publish => {
                            // I9: a stop or failure while recovering never publishes; only a
                            // child that exits 0 by itself before `READY=1` has a checkpoint.
                            if m.kind() == PhaseKind::Recovering {
                                assert!(
                                    matches!(e, Event::ChildExited(s) if s.success()),
                                    "{name}: publish while recovering on {e}"
                                );
                            }
                            assert_ne!(n.kind(), PhaseKind::Refused);
                            assert!(!w2.child_running, "{name}: publish while the child runs");
                            assert!(!w2.lost, "{name}: publish after the lease was lost");
                            w2.publish_outstanding = true;
                        }
                        Action::BeginDrain => w2.begin_drains += 1,
                        Action::Exit(o) => {
                            w2.exits += 1;
                            assert_eq!(n.phase().outcome(), Some(*o));
                            assert_eq!(h.actions.last(), Some(a), "exit is the last action");
                        }
                        _ => {}
                    }
                }
                // I11: the drain begins at most once per ownership.
                assert!(w2.begin_drains <= 1, "{name}: begin-drain twice via {e}");
                // I9: a refused run never published — unless the refusal is the lease's loss,
                // which may follow a publish that the lease still fenced.
                if n.kind() == PhaseKind::Refused && !w2.lost {
                    assert!(!w2.published);
                }
                // A run that lost its lease ends refused (lease lost), whatever it was doing.
                if w2.lost && n.is_terminal() {
                    assert_eq!(
                        n.phase().outcome().and_then(|o| o.refusal),
                        Some(tenure::machine::Refusal::LeaseLost),
                        "{name}: {e} in {}",
                        m.phase().label()
                    );
                }
                if seen.insert((n, w2)) {
                    queue.push_back((n, w2));
                }
            }
            checked += 1;
        }
    }
    assert!(checked > 100, "explored only {checked} states");
}

/// A trace line survives a JSON round trip (the runner writes it, the models read it).
#[test]
fn trace_lines_round_trip() {
    use tenure::machine::trace::{TraceLine, TraceStep};
    let mut m = Machine::new(Config::child(ReadyMode::Notify));
    let mut lines = vec![TraceLine::Header {
        version: tenure::machine::trace::TRACE_VERSION,
        config: *m.config(),
        pid: 1,
    }];
    for (i, e) in [
        Event::Start,
        Event::LeaseGranted { epoch: 7 },
        Event::RecoveryDone,
        Event::ChildSpawned,
        Event::Stop(Signal::Int),
        Event::Start,
    ]
    .into_iter()
    .enumerate()
    {
        lines.push(TraceLine::Step(TraceStep::record(
            &mut m,
            i as u64 + 1,
            0,
            e,
        )));
    }
    for l in &lines {
        let text = serde_json::to_string(l).unwrap();
        let back: TraceLine = serde_json::from_str(&text).unwrap();
        assert_eq!(&back, l, "{text}");
    }
    let TraceLine::Step(last) = lines.last().unwrap() else {
        panic!()
    };
    assert!(last.rejected.is_some(), "start is illegal while aborting");
}

fn granted(config: Config) -> Machine {
    let mut m = Machine::new(config);
    run(
        &mut m,
        &[
            Event::Start,
            Event::LeaseGranted { epoch: 1 },
            Event::RecoveryDone,
            Event::ChildSpawned,
        ],
    );
    m
}

/// Card T1: a main process that exits by itself and leaves descendants behind does not end the
/// ownership: the rest gets TERM, the grace, SIGKILL, and the lease is released only when the
/// tree is empty; the main process's code is kept unless the rest had to be killed.
#[test]
fn t1_leftover_tree_is_stopped_before_release() {
    let mut m = granted(Config::child(ReadyMode::Start));
    let a = run(&mut m, &[Event::MainExited(ChildStatus::Exited(0))]);
    assert!(a.contains(&Action::Note(Note::TreeRemains)));
    assert!(a.contains(&Action::Forward(Signal::Term, Target::Tree)));
    assert!(!a.contains(&Action::ReleaseLease) && !a.contains(&Action::Publish));
    let a = run(
        &mut m,
        &[
            Event::TimerExpired(Timer::Grace),
            Event::TimerExpired(Timer::KillWait),
        ],
    );
    assert!(a.contains(&Action::Kill));
    assert!(m.step(Event::LeaseReleased).is_err(), "tree still runs");
    let a = run(&mut m, &[Event::TreeEmpty, Event::LeaseReleased]);
    assert!(
        !a.contains(&Action::Publish),
        "a killed tree publishes nothing"
    );
    let o = exit_of(&a);
    assert_eq!(o.reason, Reason::DidNotStop);
    assert_eq!(o.child, Some(ChildStatus::Exited(0)));

    // Stopped in order within the grace: the main process's code, published after exit 0.
    let mut m = granted(Config::child(ReadyMode::Start));
    let a = run(
        &mut m,
        &[Event::MainExited(ChildStatus::Exited(0)), Event::TreeEmpty],
    );
    assert_eq!(a.last(), Some(&Action::Publish));
    let a = run(&mut m, &[Event::CheckpointSkipped, Event::LeaseReleased]);
    assert_eq!(exit_of(&a).summary(), "exited/0");
}

/// Card T1 with `--kill-mode main`: the stop signal reaches the main process first, and what
/// remains of its tree gets it (with a grace of its own) once the main process has exited. With
/// the default `tree` mode every process gets it at once, and only once.
#[test]
fn t1_kill_mode_main_then_tree() {
    let mut c = Config::child(ReadyMode::Start);
    c.kill_mode = tenure::machine::KillMode::Main;
    let mut m = granted(c);
    let a = run(&mut m, &[Event::Stop(Signal::Int)]);
    assert!(a.contains(&Action::Forward(Signal::Int, Target::Main)));
    let a = run(&mut m, &[Event::MainExited(ChildStatus::Exited(0))]);
    assert!(a.contains(&Action::Forward(Signal::Int, Target::Tree)));
    assert!(a.contains(&Action::ArmTimer(Timer::Grace, c.grace)));
    let a = run(&mut m, &[Event::TreeEmpty]);
    assert_eq!(a.last(), Some(&Action::Publish));

    let mut m = granted(Config::child(ReadyMode::Start));
    let a = run(&mut m, &[Event::Stop(Signal::Int)]);
    assert!(a.contains(&Action::Forward(Signal::Int, Target::Tree)));
    let a = run(&mut m, &[Event::MainExited(ChildStatus::Exited(0))]);
    assert!(
        !a.iter().any(|x| matches!(x, Action::Forward(..))),
        "card T3: the tree already had the signal once: {a:?}"
    );
}

/// Card T3: no catchable signal ends the owner. A stray signal reaches the workload's main
/// process while one runs and is ignored when nothing runs; HUP is forwarded while ready by
/// default (`--hup forward`) and stops with `--hup stop`; while waiting it still cancels.
#[test]
fn t3_stray_signals_and_hup_policy() {
    let mut m = granted(Config::child(ReadyMode::Start));
    let a = run(&mut m, &[Event::Stray(10), Event::Stop(Signal::Hup)]);
    assert_eq!(
        a,
        vec![
            Action::Relay(10, Target::Main),
            Action::Forward(Signal::Hup, Target::Main)
        ]
    );
    assert_eq!(m.kind(), PhaseKind::Ready);

    let cold = Machine::new(Config::child(ReadyMode::Start));
    assert!(cold.step(Event::Stray(12)).unwrap().1.ignored);
    let mut waiting = Machine::new(Config::child(ReadyMode::Start));
    let a = run(
        &mut waiting,
        &[Event::Start, Event::LeaseBusy, Event::Stop(Signal::Hup)],
    );
    assert_eq!(exit_of(&a).code(), 129, "card G1 with HUP");

    let mut c = Config::child(ReadyMode::Start);
    c.hup = tenure::machine::HupPolicy::Stop;
    let mut m = granted(c);
    run(&mut m, &[Event::Stop(Signal::Hup)]);
    assert_eq!(m.kind(), PhaseKind::Draining);
}

/// Card T4: a forking daemon is ready when its first process exits 0 and leaves its tree; with
/// a pid file, once the file names the main process. A tree that ends before that is refused.
#[test]
fn t4_forking_readiness() {
    let mut c = Config::child(ReadyMode::Forking);
    let mut m = granted(c);
    let a = run(&mut m, &[Event::MainExited(ChildStatus::Exited(0))]);
    assert!(a.contains(&Action::Note(Note::Ready)));
    assert_eq!(m.phase().label(), "ready(tree only)");
    run(&mut m, &[Event::MainAdopted]);
    let a = run(&mut m, &[Event::Stop(Signal::Term)]);
    assert!(
        a.contains(&Action::Forward(Signal::Term, Target::Main)),
        "a forking daemon's main process is stopped first"
    );

    c.pid_file = true;
    let mut m = granted(c);
    let a = run(&mut m, &[Event::MainExited(ChildStatus::Exited(0))]);
    assert!(!a.contains(&Action::Note(Note::Ready)));
    let a = run(&mut m, &[Event::TreeEmpty, Event::LeaseReleased]);
    let o = exit_of(&a);
    assert_eq!(
        (o.reason, o.refusal),
        (Reason::Refused, Some(Refusal::NoMainPid))
    );
    assert_eq!(o.code(), 69);

    // A first process that fails is the workload failing, leftovers stopped.
    let mut m = granted(Config::child(ReadyMode::Forking));
    let a = run(&mut m, &[Event::MainExited(ChildStatus::Exited(1))]);
    assert!(a.contains(&Action::Forward(Signal::Term, Target::Tree)));
}

/// `--watchdog`: armed when ready, re-armed by every `WATCHDOG=1`; a missed ping stops the
/// workload like a readiness timeout (TERM, grace, SIGKILL) and publishes nothing.
#[test]
fn watchdog_missed_ping_stops_without_publishing() {
    let mut c = Config::child(ReadyMode::Notify);
    c.watchdog = Some(std::time::Duration::from_secs(5));
    let mut m = granted(c);
    let a = run(&mut m, &[Event::ChildReady]);
    assert!(a.contains(&Action::ArmTimer(Timer::Watchdog, c.watchdog.unwrap())));
    let a = run(&mut m, &[Event::ChildWatchdog]);
    assert_eq!(
        a,
        vec![Action::ArmTimer(Timer::Watchdog, c.watchdog.unwrap())]
    );
    let a = run(&mut m, &[Event::TimerExpired(Timer::Watchdog)]);
    assert!(a.contains(&Action::Note(Note::WatchdogTimedOut)));
    assert!(a.contains(&Action::Forward(Signal::Term, Target::Tree)));
    let a = run(
        &mut m,
        &[
            Event::ChildExited(ChildStatus::Exited(0)),
            Event::LeaseReleased,
        ],
    );
    assert!(!a.contains(&Action::Publish));
    let o = exit_of(&a);
    assert_eq!(
        (o.summary().as_str(), o.code()),
        ("watchdog/missed-ping", 69)
    );
}

/// `EXTEND_TIMEOUT_USEC=`: extends the readiness timer while starting and the grace while
/// stopping; nothing else.
#[test]
fn extend_timeout_extends_the_running_bound() {
    let d = std::time::Duration::from_secs(90);
    let mut c = Config::child(ReadyMode::Notify);
    c.ready_timeout = Some(std::time::Duration::from_secs(1));
    let mut m = granted(c);
    let a = run(&mut m, &[Event::ChildExtendTimeout(d)]);
    assert_eq!(a, vec![Action::ExtendTimer(Timer::Readiness, d)]);
    run(&mut m, &[Event::ChildReady]);
    assert!(m.step(Event::ChildExtendTimeout(d)).unwrap().1.ignored);
    let a = run(
        &mut m,
        &[Event::Stop(Signal::Term), Event::ChildExtendTimeout(d)],
    );
    assert_eq!(a.last(), Some(&Action::ExtendTimer(Timer::Grace, d)));
}

/// Issue 14: a cluster lease lost while ready kills the workload at once (no stop signal, no
/// grace: another owner may be starting its own), publishes and releases nothing, and ends
/// `refused/lease-lost` with exit 76 once the workload is gone — even a workload that staged a
/// checkpoint and exits 0.
#[test]
fn lease_lost_while_ready_kills_at_once_and_publishes_nothing() {
    let mut m = granted(Config::child(ReadyMode::Start));
    let a = run(&mut m, &[Event::LeaseLost]);
    assert!(a.contains(&Action::Kill), "{a:?}");
    assert!(a.contains(&Action::Note(Note::LeaseLost)));
    assert!(
        !a.iter().any(|x| matches!(x, Action::Forward(..))),
        "no stop signal and grace before the kill: {a:?}"
    );
    // A repeated loss changes nothing; a stop signal meanwhile neither.
    assert!(m.handle(Event::LeaseLost).unwrap().ignored);
    assert!(m.handle(Event::Stop(Signal::Term)).unwrap().ignored);
    let a = run(&mut m, &[Event::ChildExited(ChildStatus::Exited(0))]);
    assert!(!a.contains(&Action::Publish) && !a.contains(&Action::ReleaseLease));
    let o = exit_of(&a);
    assert_eq!(o.summary(), "refused/lease-lost");
    assert_eq!(o.code(), tenure::machine::EXIT_LEASE_LOST);
    assert_eq!(m.kind(), PhaseKind::Refused);
}

/// Issue 14: the loss while draining escalates a stop in its grace to SIGKILL; while
/// verifying it ends the run at once (nothing of the workload runs); a publish already asked
/// for keeps its answer, then the run ends without a release; a release in progress is
/// answered by the loss.
#[test]
fn lease_lost_in_every_owning_step_ends_refused_without_release() {
    // Draining: the stop signal was forwarded and the grace runs.
    let mut m = granted(Config::child(ReadyMode::Start));
    run(&mut m, &[Event::Stop(Signal::Term)]);
    let a = run(&mut m, &[Event::LeaseLost]);
    assert_eq!(
        a,
        [
            Action::Note(Note::LeaseLost),
            Action::DisarmTimer(Timer::Grace),
            Action::Note(Note::Killed),
            Action::Kill,
            Action::ArmTimer(Timer::KillWait, Config::child(ReadyMode::Start).kill_wait),
        ]
    );
    let o = exit_of(&run(
        &mut m,
        &[Event::ChildExited(ChildStatus::Signaled(9))],
    ));
    assert_eq!(
        (o.summary().as_str(), o.killed),
        ("refused/lease-lost", true)
    );

    // Verifying: nothing runs, so the run ends in the step.
    let mut m = Machine::new(Config::child(ReadyMode::Start));
    run(&mut m, &[Event::Start, Event::LeaseGranted { epoch: 3 }]);
    let a = run(&mut m, &[Event::LeaseLost]);
    assert!(!a.contains(&Action::ReleaseLease));
    assert_eq!(exit_of(&a).code(), 76);

    // Publishing: the publish's answer comes, then the end.
    let mut m = granted(Config::child(ReadyMode::Start));
    run(
        &mut m,
        &[
            Event::Stop(Signal::Term),
            Event::ChildExited(ChildStatus::Exited(0)),
        ],
    );
    assert!(matches!(
        m.phase(),
        tenure::machine::Phase::Draining {
            step: tenure::machine::DrainStep::Publishing,
            ..
        }
    ));
    let a = run(&mut m, &[Event::LeaseLost]);
    assert_eq!(a, [Action::Note(Note::LeaseLost)]);
    let a = run(&mut m, &[Event::CheckpointFailed]);
    assert!(!a.contains(&Action::ReleaseLease));
    assert_eq!(exit_of(&a).summary(), "refused/lease-lost");

    // Releasing: the loss answers the release.
    let mut m = granted(Config::child(ReadyMode::Start));
    run(
        &mut m,
        &[
            Event::Stop(Signal::Term),
            Event::ChildExited(ChildStatus::Exited(0)),
            Event::CheckpointPublished,
        ],
    );
    let a = run(&mut m, &[Event::LeaseLost]);
    assert_eq!(exit_of(&a).code(), 76);
    assert!(m.step(Event::LeaseReleased).is_err());
}

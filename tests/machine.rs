//! The pure machine against the cards it must reproduce, and an exhaustive check of the
//! spec's machine-level invariants over every reachable state and every event.
//!
//! These tests drive `tenure::machine` only; the lease, checkpoint and runner tests check the
//! same cards against real files and processes.

use std::collections::{HashSet, VecDeque};
use tenure::machine::{
    Action, ChildStatus, Config, Event, Machine, Note, Outcome, PhaseKind, ReadyMode, Reason,
    Refusal, Signal, Timer, table,
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
    assert!(actions.contains(&Action::Forward(Signal::Term)));
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
    assert!(pos(&Action::Forward(Signal::Term)) < pos(&Action::Publish));
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
    child_running: bool,
    publish_outstanding: bool,
    published: bool,
    begin_drains: u8,
    exits: u8,
    lease_held: bool,
}

/// Exhaustive check over every reachable (machine, world) pair of every profile: the
/// machine-level parts of I6, I7, I8, I9, I10 and I11. The models check the same properties
/// with many processes and an abstract kernel.
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
                    Event::ChildExited(_) => w2.child_running = false,
                    Event::CheckpointPublished => {
                        w2.publish_outstanding = false;
                        w2.published = true;
                    }
                    Event::CheckpointSkipped | Event::CheckpointFailed => {
                        w2.publish_outstanding = false
                    }
                    Event::LeaseReleased => w2.lease_held = false,
                    _ => {}
                }
                for a in &h.actions {
                    match a {
                        // I7: never release while the child may run.
                        Action::ReleaseLease => {
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
                // I9: a refused run never published.
                if n.kind() == PhaseKind::Refused {
                    assert!(!w2.published);
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

//! Trace conformance: traces of scripted runs (recorded with `TraceStep::record`, the same
//! function the runner's `--trace` uses) conform; hand-corrupted traces are reported at the
//! first step the model does not allow; and every behaviour of the signal model, written as a
//! trace, conforms (the checker accepts what the models explore).

use serde_json::Value;
use stateright::Model;
use std::time::Duration;
use tenure::machine::{
    ChildStatus, Config, Event, ReadyMode, Reason, Signal, Timer, trace::TRACE_VERSION,
};
use tenure_models::driver::NotAllowed;
use tenure_models::signals::{SignalModel, fed_event};
use tenure_models::trace::{Problem, check_file, check_str, record};

fn start() -> Config {
    Config::child(ReadyMode::Start)
}

fn normal_stop() -> Vec<Event> {
    vec![
        Event::Start,
        Event::LeaseGranted { epoch: 1 },
        Event::RecoveryDone,
        Event::ChildSpawned,
        Event::Stop(Signal::Term),
        Event::ChildExited(ChildStatus::Exited(0)),
        Event::CheckpointPublished,
        Event::LeaseReleased,
    ]
}

/// Card G4: SIGTERM while ready drains, publishes and releases; exit 143.
#[test]
fn normal_stop_conforms() {
    let s = check_str(&record(start(), 41, &normal_stop())).unwrap();
    assert_eq!(s.steps, 8);
    assert_eq!(s.pid, 41);
    assert_eq!(s.exit_code(), Some(143));
    assert_eq!(s.outcome.unwrap().reason, Reason::Stopped);
}

/// Card G3: SIGTERM while the checkpoint is verified refuses; exit 143, nothing published.
#[test]
fn refused_recovery_conforms() {
    let events = [
        Event::Start,
        Event::LeaseGranted { epoch: 2 },
        Event::Stop(Signal::Term),
        Event::LeaseReleased,
    ];
    let s = check_str(&record(start(), 7, &events)).unwrap();
    assert_eq!(s.outcome.unwrap().reason, Reason::Refused);
    assert_eq!(s.exit_code(), Some(143));
}

/// Card L3: SIGINT to a waiter cancels it; exit 130.
#[test]
fn cancelled_wait_conforms() {
    let events = [Event::Start, Event::LeaseBusy, Event::Stop(Signal::Int)];
    let s = check_str(&record(start(), 7, &events)).unwrap();
    assert_eq!(s.outcome.unwrap().reason, Reason::Cancelled);
    assert_eq!(s.exit_code(), Some(130));
}

/// Card G6: a child that ignores SIGTERM is killed after the grace; exit 137.
#[test]
fn kill_after_grace_conforms() {
    let events = [
        Event::Start,
        Event::LeaseGranted { epoch: 1 },
        Event::RecoveryDone,
        Event::ChildSpawned,
        Event::Stop(Signal::Term),
        Event::TimerExpired(Timer::Grace),
        Event::ChildExited(ChildStatus::Signaled(9)),
        Event::LeaseReleased,
    ];
    let s = check_str(&record(start(), 7, &events)).unwrap();
    assert_eq!(s.exit_code(), Some(137));
}

/// Card L5, seen from the successor: it waits, the owner is SIGKILLed, the kernel hands the
/// lock over with a higher epoch; the child then exits 0 by itself and is published.
#[test]
fn crash_takeover_from_the_successor_conforms() {
    let events = [
        Event::Start,
        Event::LeaseBusy,
        Event::LeaseGranted { epoch: 5 },
        Event::RecoveryDone,
        Event::ChildSpawned,
        Event::ChildExited(ChildStatus::Exited(0)),
        Event::CheckpointPublished,
        Event::LeaseReleased,
    ];
    let s = check_str(&record(start(), 7, &events)).unwrap();
    assert_eq!(s.exit_code(), Some(0));
}

/// Card D4 and H2: a notify-mode readiness timeout, and an in-process drain requested before
/// recovery, both conform; a trace cut short (a crashed run) conforms as far as it goes.
#[test]
fn notify_in_process_and_cut_traces_conform() {
    let mut notify = Config::child(ReadyMode::Notify);
    notify.ready_timeout = Some(Duration::from_secs(1));
    let events = [
        Event::Start,
        Event::LeaseGranted { epoch: 1 },
        Event::RecoveryDone,
        Event::ChildSpawned,
        Event::TimerExpired(Timer::Readiness),
        Event::ChildExited(ChildStatus::Exited(0)),
        Event::LeaseReleased,
    ];
    let s = check_str(&record(notify, 7, &events)).unwrap();
    assert_eq!(s.exit_code(), Some(69));
    let events = [
        Event::Start,
        Event::DrainRequested,
        Event::LeaseGranted { epoch: 1 },
        Event::RecoveryDone,
        Event::ResidenciesSettled,
        Event::CheckpointSkipped,
        Event::LeaseReleased,
    ];
    let s = check_str(&record(Config::in_process(), 7, &events)).unwrap();
    assert_eq!(s.exit_code(), Some(0));
    let s = check_str(&record(start(), 7, &normal_stop()[..5])).unwrap();
    assert_eq!(s.outcome, None);
    assert_eq!(s.final_phase, "draining(stopping: signalled)");
}

/// `check_file` reads a file the way the runner writes it.
#[test]
fn check_file_reads_a_trace_file() {
    let dir = tempdir();
    let path = dir.join("run.jsonl");
    std::fs::write(&path, record(start(), 9, &normal_stop())).unwrap();
    assert_eq!(check_file(&path).unwrap().steps, 8);
    let missing = check_file(dir.join("absent.jsonl")).unwrap_err();
    assert!(matches!(missing.problem, Problem::Io(_)), "{missing}");
    std::fs::remove_dir_all(&dir).unwrap();
}

fn tempdir() -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!(
        "tenure-models-trace-{}-{:?}",
        std::process::id(),
        std::thread::current().id()
    ));
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// Records `events` (which the machine may reject: the recorder writes what happened) and
/// returns the first violation.
fn violation(config: Config, events: &[Event]) -> tenure_models::trace::Violation {
    check_str(&record(config, 7, events)).unwrap_err()
}

fn lines(text: &str) -> Vec<Value> {
    text.lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

fn unlines(v: &[Value]) -> String {
    v.iter().map(|l| format!("{l}\n")).collect()
}

/// Each corrupted trace is reported at its first bad step, with the reason.
#[test]
fn corrupted_traces_are_reported() {
    // A grant before the driver asked for the lease.
    let v = violation(start(), &[Event::LeaseGranted { epoch: 1 }]);
    assert_eq!((v.line, v.seq), (2, Some(1)));
    assert_eq!(v.problem, Problem::NotAllowed(NotAllowed::StartOrder));

    // Recovery answered while only waiting for the lease.
    let v = violation(
        start(),
        &[Event::Start, Event::LeaseBusy, Event::RecoveryDone],
    );
    assert_eq!(v.seq, Some(3));
    assert_eq!(v.problem, Problem::NotAllowed(NotAllowed::NoRequest));

    // Contention reported twice for one acquisition.
    let v = violation(start(), &[Event::Start, Event::LeaseBusy, Event::LeaseBusy]);
    assert_eq!(v.problem, Problem::NotAllowed(NotAllowed::BusyTwice));

    // A child exit before any spawn.
    let mut e = normal_stop()[..3].to_vec();
    e.push(Event::ChildExited(ChildStatus::Exited(0)));
    let v = violation(start(), &e);
    assert_eq!(v.seq, Some(4));
    assert_eq!(v.problem, Problem::NotAllowed(NotAllowed::Spawning));

    // The grace timer firing while it is not armed.
    let mut e = normal_stop()[..4].to_vec();
    e.push(Event::TimerExpired(Timer::Grace));
    let v = violation(start(), &e);
    assert_eq!(v.problem, Problem::NotAllowed(NotAllowed::TimerNotArmed));

    // A stop delivered between the spawn and its answer.
    let mut e = normal_stop()[..3].to_vec();
    e.push(Event::Stop(Signal::Term));
    let v = violation(start(), &e);
    assert_eq!(v.problem, Problem::NotAllowed(NotAllowed::Spawning));

    // Anything after the exit.
    let mut e = normal_stop();
    e.push(Event::Stop(Signal::Hup));
    let v = violation(start(), &e);
    assert_eq!(v.seq, Some(9));
    assert_eq!(v.problem, Problem::NotAllowed(NotAllowed::Exited));

    // An event the driver may feed but the machine rejects here (the recorder wrote the
    // rejection; the checker reports it).
    // (The driver may report a moved root at any time; before the lease the machine rejects it.)
    let v = violation(Config::in_process(), &[Event::Start, Event::RootLost]);
    assert!(matches!(v.problem, Problem::Rejected(_)), "{v}");
}

/// Edited fields, sequence gaps and bad headers are reported too.
#[test]
fn edited_traces_are_reported() {
    let good = lines(&record(start(), 7, &normal_stop()));

    let mut t = good.clone();
    t[5]["actions"].as_array_mut().unwrap().pop();
    let v = check_str(&unlines(&t)).unwrap_err();
    assert_eq!((v.line, v.seq), (6, Some(5)));
    assert!(
        matches!(
            v.problem,
            Problem::Mismatch {
                field: "actions",
                ..
            }
        ),
        "{v}"
    );

    let mut t = good.clone();
    t[3]["after"] = Value::from("ready");
    let v = check_str(&unlines(&t)).unwrap_err();
    assert!(
        matches!(v.problem, Problem::Mismatch { field: "after", .. }),
        "{v}"
    );

    let mut t = good.clone();
    t[2]["ignored"] = Value::from(true);
    let v = check_str(&unlines(&t)).unwrap_err();
    assert!(
        matches!(
            v.problem,
            Problem::Mismatch {
                field: "ignored",
                ..
            }
        ),
        "{v}"
    );

    let mut t = good.clone();
    t.remove(4);
    let v = check_str(&unlines(&t)).unwrap_err();
    assert_eq!(v.problem, Problem::Sequence { expected: 4 });

    let mut t = good.clone();
    t[0]["version"] = Value::from(TRACE_VERSION + 1);
    let v = check_str(&unlines(&t)).unwrap_err();
    assert!(matches!(v.problem, Problem::Header(_)), "{v}");

    let v = check_str(&unlines(&good[1..])).unwrap_err();
    assert!(matches!(v.problem, Problem::Header(_)), "{v}");

    let mut t = good.clone();
    t.insert(3, good[0].clone());
    let v = check_str(&unlines(&t)).unwrap_err();
    assert_eq!(v.problem, Problem::SecondHeader);

    let mut text = unlines(&good);
    text.push_str("{not json\n");
    let v = check_str(&text).unwrap_err();
    assert_eq!(v.line, 10);
    assert!(matches!(v.problem, Problem::Parse(_)), "{v}");

    assert!(check_str("").is_err());
    println!("example report: {v}");
}

/// A small deterministic generator (xorshift) for the random walks below.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: usize) -> usize {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 % n as u64) as usize
    }
}

/// 2,000 random walks through the signal model (all three workloads), each written as a trace
/// with the events its driver fed, all conform: the checker's open world contains every
/// behaviour the model explores.
#[test]
fn signal_model_walks_conform() {
    let model = SignalModel::ci();
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let mut ended = 0;
    for walk in 0..2_000 {
        let inits = model.init_states();
        let mut s = inits[walk % inits.len()].clone();
        let config = *s.drv.machine().config();
        let mut events = vec![Event::Start];
        let mut actions = Vec::new();
        for _ in 0..200 {
            actions.clear();
            model.actions(&s, &mut actions);
            if actions.is_empty() {
                break;
            }
            let a = actions[rng.below(actions.len())];
            if let Some(ev) = fed_event(&s, a) {
                events.push(ev);
            }
            s = model.next_state(&s, a).unwrap();
        }
        let text = record(config, 1, &events);
        let summary = check_str(&text).unwrap_or_else(|v| panic!("walk {walk}: {v}\n{text}"));
        if let Some((o, code)) = s.exit {
            assert_eq!(summary.outcome, Some(o));
            assert_eq!(summary.exit_code(), Some(code));
            ended += 1;
        }
    }
    assert!(ended > 1_000, "only {ended} walks reached an exit");
}

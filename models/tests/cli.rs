//! The `tenure-models` command line, run as a real process: exit codes, verdicts and the trace
//! check the lead's integration tests will call.

use std::process::Command;
use tenure::machine::{ChildStatus, Config, Event, ReadyMode, Signal};

fn cli(args: &[&str]) -> (i32, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_tenure-models"))
        .args(args)
        .output()
        .expect("run tenure-models");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.code().expect("exit code"), text)
}

/// `check signals` prints the counts and a verdict per property, and exits 0.
#[test]
fn check_prints_counts_and_verdicts() {
    let (code, text) = cli(&["check", "signals"]);
    assert_eq!(code, 0, "{text}");
    let pinned = tenure_models::catalog::pinned_count("signals").expect("pinned");
    assert!(text.contains(&format!("unique {pinned}")), "{text}");
    assert!(text.contains("states/s"), "{text}");
    assert!(
        text.contains("lease outlives the workload") && text.contains("holds"),
        "{text}"
    );
    assert!(!text.contains("VIOLATED"), "{text}");
}

/// `--mutant` prints the shortest counterexample and exits 0 when the mutant is killed.
#[test]
fn mutant_prints_its_counterexample() {
    let (code, text) = cli(&["check", "checkpoint", "--mutant", "gc-deletes-current"]);
    assert_eq!(code, 0, "{text}");
    assert!(text.contains("killed"), "{text}");
    // The store's real publish plan, step by step, up to its GC.
    assert!(text.contains("publish.current.dirfsync"), "{text}");
    // A bug planted in src/ that the model runs.
    let (code, text) = cli(&["check", "signals", "--mutant", "release-then-publish"]);
    assert_eq!(code, 0, "{text}");
    assert!(
        text.contains("killed") && text.contains("release-lease"),
        "{text}"
    );
    let (code, text) = cli(&["check", "lease", "--mutant", "no-such-mutant"]);
    assert_eq!(code, 64, "{text}");
    assert!(text.contains("no mutant"), "{text}");
}

/// `trace FILE` exits 0 for a conforming trace and 1 for one that is not, naming the step.
#[test]
fn trace_checks_files() {
    let dir = std::env::temp_dir().join(format!("tenure-models-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let events = [
        Event::Start,
        Event::LeaseGranted { epoch: 1 },
        Event::RecoveryDone,
        Event::ChildSpawned,
        Event::Stop(Signal::Int),
        Event::ChildExited(ChildStatus::Exited(0)),
        Event::CheckpointPublished,
        Event::LeaseReleased,
    ];
    let good = dir.join("good.jsonl");
    let config = Config::child(ReadyMode::Start);
    std::fs::write(&good, tenure_models::trace::record(config, 3, &events)).unwrap();
    let bad = dir.join("bad.jsonl");
    std::fs::write(&bad, tenure_models::trace::record(config, 3, &events[1..])).unwrap();
    let (code, text) = cli(&["trace", good.to_str().unwrap()]);
    assert_eq!(code, 0, "{text}");
    assert!(
        text.contains("conforms (8 steps") && text.contains("exit 130"),
        "{text}"
    );
    let (code, text) = cli(&["trace", good.to_str().unwrap(), bad.to_str().unwrap()]);
    assert_eq!(code, 1, "{text}");
    assert!(text.contains("does not conform: line 2 (seq 1)"), "{text}");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Usage errors exit 64 with the usage text.
#[test]
fn usage_errors_exit_64() {
    for args in [
        &[][..],
        &["frobnicate"][..],
        &["check", "--processes", "nine"][..],
        &["check", "--processes", "0"][..],
        &["check", "lease", "--bogus"][..],
        &["trace"][..],
    ] {
        let (code, text) = cli(args);
        assert_eq!(code, 64, "{args:?}: {text}");
        assert!(text.contains("usage:"), "{args:?}: {text}");
    }
}

//! Trace conformance (issue 6): real scenarios run through the `tenure` binary with `--trace`,
//! and every trace is replayed by the models' checker (`tenure_models::trace::check_file`),
//! which allows only what the model's single-process step relation allows. Each trace must
//! conform 100%, and end the way the scenario says.

mod common;

use common::*;
use rustix::process::Signal;
use std::path::PathBuf;
use tenure_models::trace::{Summary, check_file};

/// Checks one trace file and returns its summary, failing with the first step the model does
/// not allow.
fn conforms(trace: &PathBuf) -> Summary {
    match check_file(trace) {
        Ok(s) => {
            assert!(s.steps >= 3, "trace too short: {}", read(trace));
            s
        }
        Err(v) => panic!(
            "{} does not conform: {v:?}\n{}",
            trace.display(),
            read(trace)
        ),
    }
}

fn traced(env: &Env, name: &str, extra: &[&str]) -> (PathBuf, Vec<String>) {
    let trace = env.path(name);
    let mut args: Vec<String> = extra.iter().map(|s| s.to_string()).collect();
    args.extend(["--trace".into(), trace.to_str().unwrap().into()]);
    (trace, args)
}

fn as_strs(v: &[String]) -> Vec<&str> {
    v.iter().map(String::as_str).collect()
}

/// A normal stop: ready, SIGTERM, drain, publish, release — exit 143.
#[test]
fn normal_stop_conforms() {
    let env = Env::new();
    let (trace, args) = traced(&env, "stop.jsonl", &[]);
    let r = env.run(&as_strs(&args), &sh(TERM_CHILD, &[]));
    env.wait_event("ready", Some(r.pid()));
    r.signal(Signal::TERM);
    r.wait().expect_code(143);
    let s = conforms(&trace);
    assert_eq!(s.exit_code(), Some(143));
    assert_eq!(s.final_phase, "released(stopped/SIGTERM)");
}

/// A refused recovery: SIGTERM while a notify-mode child has not said READY=1 — exit 143,
/// phase refused.
#[test]
fn refused_recovery_conforms() {
    let env = Env::new();
    let fifo = env.fifo("gate");
    let (trace, args) = traced(&env, "refused.jsonl", &["--ready", "notify"]);
    let r = env.run(
        &as_strs(&args),
        &sh(r#"exec 3< "$1""#, &[fifo.to_str().unwrap()]),
    );
    env.wait_event("spawned", Some(r.pid()));
    r.signal(Signal::TERM);
    r.wait().expect_code(143);
    let s = conforms(&trace);
    assert!(s.final_phase.starts_with("refused("), "{}", s.final_phase);
}

/// A cancelled wait: a contender waiting for a live owner gets SIGINT — exit 130, and a
/// bounded contender gives up busy — exit 75. The owner's own trace conforms too.
#[test]
fn cancelled_and_busy_waits_conform() {
    let env = Env::new();
    let (owner_trace, args) = traced(&env, "owner.jsonl", &[]);
    let owner = env.run(&as_strs(&args), &sh(TERM_CHILD, &[]));
    env.wait_event("ready", Some(owner.pid()));
    let (wait_trace, args) = traced(&env, "waiter.jsonl", &[]);
    let waiter = env.run(&as_strs(&args), &["true"]);
    env.wait_event("waiting", Some(waiter.pid()));
    waiter.signal(Signal::INT);
    waiter.wait().expect_code(130);
    let (busy_trace, args) = traced(&env, "busy.jsonl", &["--wait", "0.2"]);
    env.run(&as_strs(&args), &["true"]).wait().expect_code(75);
    owner.signal(Signal::TERM);
    owner.wait().expect_code(143);
    assert_eq!(
        conforms(&wait_trace).final_phase,
        "cancelled(cancelled/SIGINT)"
    );
    assert_eq!(conforms(&busy_trace).exit_code(), Some(75));
    assert_eq!(conforms(&owner_trace).exit_code(), Some(143));
}

/// A crash takeover: the owner is SIGKILLed (its trace stops mid-run and still conforms as a
/// prefix); the successor, which was waiting, owns with a higher epoch and ends in order.
#[test]
fn crash_takeover_conforms() {
    let env = Env::new();
    let (dead_trace, args) = traced(&env, "dead.jsonl", &[]);
    let owner = env.run(&as_strs(&args), &sh(TERM_CHILD, &[]));
    env.wait_event("ready", Some(owner.pid()));
    let (next_trace, args) = traced(&env, "next.jsonl", &[]);
    let next = env.run(&as_strs(&args), &sh(TERM_CHILD, &[]));
    env.wait_event("waiting", Some(next.pid()));
    owner.signal(Signal::KILL);
    owner.wait();
    env.wait_event("ready", Some(next.pid()));
    next.signal(Signal::TERM);
    next.wait().expect_code(143);
    let dead = conforms(&dead_trace);
    assert_eq!(dead.outcome, None, "a killed owner never reached exit");
    assert_eq!(dead.final_phase, "ready");
    let s = conforms(&next_trace);
    assert_eq!(s.exit_code(), Some(143));
    assert!(
        read(&next_trace).contains("\"epoch\":2"),
        "{}",
        read(&next_trace)
    );
}

/// KILL after grace: a child that ignores SIGTERM is killed — exit 137.
#[test]
fn kill_after_grace_conforms() {
    let env = Env::new();
    let (trace, args) = traced(&env, "kill.jsonl", &["--grace", "0.3"]);
    let r = env.run(&as_strs(&args), &sh(STUBBORN_CHILD, &[]));
    env.wait_event("ready", Some(r.pid()));
    r.signal(Signal::TERM);
    r.wait().expect_code(137);
    let s = conforms(&trace);
    assert_eq!(s.exit_code(), Some(137));
    assert!(
        read(&trace).contains("kill-wait"),
        "the kill-wait timer was armed"
    );
}

/// Card T1: a main process that exits 0 and leaves a `setsid` grandchild ignoring TERM, then a
/// stray SIGUSR1 on the way — `main-exited`, the tree stop, SIGKILL, `tree-empty`, release,
/// exit 137; and a forking shell daemon named by its pid file (`main-adopted`) stopped by
/// SIGTERM. Both traces conform.
#[test]
fn process_tree_runs_conform() {
    let env = Env::new();
    let pidfile = env.path("gc.pid");
    let script = r#"setsid sh -c 'trap "" TERM; echo $$ > "$1"; exec sleep 1000' sh "$1" &
while [ ! -s "$1" ]; do sleep 0.01; done
trap '' USR1
read _
exit 0"#;
    let (trace, args) = traced(&env, "tree.jsonl", &["--grace", "0.3"]);
    let mut r = env.run(&as_strs(&args), &sh(script, &[pidfile.to_str().unwrap()]));
    env.wait_event("ready", Some(r.pid()));
    wait_for(
        "the grandchild's pid",
        DEADLINE,
        || {
            std::fs::read_to_string(&pidfile)
                .ok()
                .filter(|s| s.ends_with('\n'))
        },
        String::new,
    );
    r.signal(Signal::USR1);
    env.wait_event("signal-forwarded", Some(r.pid()));
    r.close_stdin();
    r.wait().expect_code(137);
    let s = conforms(&trace);
    assert_eq!(s.exit_code(), Some(137));
    let text = read(&trace);
    for ev in ["main-exited", "tree-empty", "stray"] {
        assert!(text.contains(ev), "{ev} missing from the trace:\n{text}");
    }

    let env = Env::new();
    let pid_file = env.path("daemon.pid");
    let daemon = r#"(setsid sh -c 'trap "exit 0" TERM; echo $$ > "$1"; while :; do sleep 0.02; done' sh "$1" &)
exit 0"#;
    let (trace, mut args) = traced(&env, "forking.jsonl", &["--type", "forking"]);
    args.extend(["--pidfile".into(), pid_file.to_str().unwrap().into()]);
    let r = env.run(&as_strs(&args), &sh(daemon, &[pid_file.to_str().unwrap()]));
    env.wait_event("main-adopted", Some(r.pid()));
    env.wait_event("ready", Some(r.pid()));
    r.signal(Signal::TERM);
    r.wait().expect_code(143);
    let s = conforms(&trace);
    assert_eq!(s.final_phase, "released(stopped/SIGTERM)");
    assert!(read(&trace).contains("main-adopted"));
}

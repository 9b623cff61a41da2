//! Card G6 end to end, with a child that really survives SIGKILL: `tenure run` keeps the lease
//! (invariant I7) and says `did not stop` while its child cannot be reaped, and releases and
//! exits 70 once it is.
//!
//! The unreapable child is `cat MNT/stuck` on a FUSE mount whose daemon (a thread of this test,
//! `common::fuse`) reads the lookup of `stuck` and never answers it: after a fatal signal the
//! kernel waits for the answer uninterruptibly (state `D`), so SIGKILL cannot end the process
//! until the connection is aborted. Nothing is mocked: real runner, real signals, real kernel
//! wait. Machines without FUSE (no `/dev/fuse`, no permission to mount, no `fuse` filesystem)
//! follow the rule of `common::skip`: a visible `SKIPPED:` line, or a failure under
//! `TENURE_REQUIRE_SERVERS=1` (which `.ci/run` sets after making `/dev/fuse` available).

mod common;

use common::fuse::FuseStall;
use common::*;
use rustix::process::Signal;
use std::time::{Duration, Instant};

use tenure_models::trace::check_file;

/// Asserts `later` comes after `earlier` in `ks` (both present).
fn before(ks: &[String], earlier: &str, later: &str) {
    let a = ks.iter().position(|k| k == earlier);
    let b = ks.iter().rposition(|k| k == later);
    assert!(
        matches!((a, b), (Some(a), Some(b)) if a < b),
        "expected `{earlier}` before `{later}` in {ks:?}"
    );
}

/// What `pid` has used so far: user plus system CPU time in clock ticks (fields 14 and 15 of
/// `/proc/PID/stat`, all threads) and how often its threads were switched out, voluntarily
/// (each wake-up of a sleeping loop) or not (each preemption of a busy one).
fn cpu_and_switches(pid: u32) -> (u64, u64) {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("process exists");
    let after = &stat[stat.rfind(')').expect("stat has a comm") + 2..];
    let f: Vec<&str> = after.split(' ').collect();
    // `after` starts at field 3, so field N is at index N - 3.
    let ticks = f[11].parse::<u64>().expect("utime") + f[12].parse::<u64>().expect("stime");
    let mut switches = 0;
    for task in std::fs::read_dir(format!("/proc/{pid}/task")).expect("tasks") {
        let status = std::fs::read_to_string(task.unwrap().path().join("status")).unwrap();
        for l in status.lines() {
            if let Some(n) = l
                .strip_prefix("voluntary_ctxt_switches:")
                .or_else(|| l.strip_prefix("nonvoluntary_ctxt_switches:"))
            {
                switches += n.trim().parse::<u64>().expect("a count");
            }
        }
    }
    (ticks, switches)
}

/// Mounts the stalling FUSE filesystem, or reports a skip (a failure under
/// `TENURE_REQUIRE_SERVERS=1`) and returns `None`.
fn fuse_or_skip(test: &str) -> Option<FuseStall> {
    match FuseStall::mount(DEADLINE) {
        Ok(f) => Some(f),
        Err(why) => {
            common::skip::skip(&format!("{test} (needs FUSE)"), &why.to_string());
            None
        }
    }
}

/// Card G6 (and G5, invariant I7): a child that ignores SIGTERM gets SIGKILL after the grace;
/// when even SIGKILL cannot get it reaped within the kill wait, the runner logs `killed` then
/// `did-not-stop`, says `did not stop`, and stays alive holding the lease — status shows the
/// lock held and phase `draining`, the owner record keeps its bytes, a contender is refused
/// busy (75) — without spinning (over a window of at least a second, the runner neither burns
/// CPU nor wakes up more than its periodic checks need). Once the child can finally die (the FUSE connection is
/// aborted) it is reaped, the lease is released, the runner exits 70 with a `did-not-stop` end
/// record (`killed: true`), the trace conforms to the model, and a successor acquires at once.
#[test]
fn g6_unreapable_child_keeps_the_lease_until_reaped() {
    let Some(mut fuse) = fuse_or_skip("card G6 end to end") else {
        return;
    };
    let env = Env::new();
    let trace = env.path("trace.jsonl");
    let stuck = fuse.path(common::fuse::STUCK);
    // The child ignores SIGTERM (an ignored disposition survives exec), so it is the SIGKILL
    // that it survives; until then it sleeps interruptibly in the FUSE lookup.
    let r = env.run(
        &[
            "--grace",
            "0.3",
            "--kill-wait",
            "0.5",
            "--trace",
            trace.to_str().unwrap(),
        ],
        &sh(r#"trap '' TERM; exec cat "$1""#, &[stuck.to_str().unwrap()]),
    );
    let runner = r.pid();
    let child = env.wait_event("spawned", Some(runner))["child_pid"]
        .as_u64()
        .expect("child_pid") as u32;
    env.wait_event("ready", Some(runner));
    // The daemon has read the child's lookup: from now on only an answer or an abort ends it.
    assert_eq!(
        fuse.wait_held(DEADLINE),
        child,
        "the held lookup is the supervised child's"
    );

    r.signal(Signal::TERM);
    env.wait_event("killed", Some(runner));
    // SIGKILL is pending and the process is still there, in uninterruptible sleep.
    wait_for(
        &format!("child {child} in uninterruptible sleep after SIGKILL"),
        DEADLINE,
        || (proc_state(child) == Some('D')).then_some(()),
        || {
            format!(
                "state {:?}\nevents:\n{}",
                proc_state(child),
                env.events_text()
            )
        },
    );
    let owner = env.owner_bytes();
    let did_not_stop = env.wait_event("did-not-stop", Some(runner));
    assert_eq!(did_not_stop["epoch"], 1, "{did_not_stop}");
    wait_for(
        "`did not stop` on the runner's stderr",
        DEADLINE,
        || r.stderr().contains("did not stop:").then_some(()),
        || r.stderr(),
    );
    assert!(
        r.stderr().contains("keeping the lease"),
        "the message says the lease is kept: {}",
        r.stderr()
    );
    assert_eq!(proc_state(child), Some('D'), "the child is still stuck");

    // The lease is kept while the child may still run (I7): status, owner record, contender.
    let st = env.status();
    assert_eq!(st["lock_held"], true, "{st}");
    assert_eq!(st["phase"], "draining", "{st}");
    assert_eq!(st["owner"]["pid"], runner, "{st}");
    assert_eq!(st["owner"]["epoch"], 1, "{st}");
    let contender = env.run_to_end(&["-n"], &["true"]);
    contender.expect_code(75);
    assert_eq!(contender.end()["summary"], "busy/75");
    assert_eq!(env.owner_bytes(), owner, "the owner record kept its bytes");

    // A window in which nothing may happen: a contender bounded to wait one second for the
    // lease (it must end busy, 75: the lease is kept). Over that window the runner must not
    // spin: it is woken only by the child's pidfd, a signal or its periodic root check (every
    // 500 ms), so it uses next to no CPU and is switched out only a few times a second. A
    // polling loop would be switched out (or preempted) hundreds of times a second, and a busy
    // one would use the CPU.
    let mut r = r;
    let (ticks, switches) = cpu_and_switches(runner);
    let window = Instant::now();
    let bounded = env.run_to_end(&["--wait", "1"], &["true"]);
    let elapsed = window.elapsed();
    let (ticks2, switches2) = cpu_and_switches(runner);
    bounded.expect_code(75);
    assert!(
        elapsed >= Duration::from_secs(1),
        "the contender did not wait"
    );
    let hz = rustix::param::clock_ticks_per_second() as f64;
    let cpu = (ticks2 - ticks) as f64 / hz;
    let wakeups = switches2 - switches;
    let secs = elapsed.as_secs_f64();
    eprintln!(
        "g6: while stuck, the runner used {cpu:.3} s of CPU and {wakeups} switches in {elapsed:?}"
    );
    assert!(
        cpu < secs / 4.0,
        "the runner spun while waiting: {cpu:.2} s of CPU in {elapsed:?}"
    );
    assert!(
        (wakeups as f64) < 20.0 + 10.0 * secs,
        "the runner woke up {wakeups} times in {elapsed:?}: it polls instead of waiting"
    );
    assert!(r.running(), "the runner exited while its child could run");
    assert_eq!(env.status()["lock_held"], true);
    assert_eq!(env.owner_bytes(), owner, "the owner record kept its bytes");
    // A second stop signal changes nothing either.
    r.signal(Signal::TERM);
    wait_for(
        "the second signal in the event log",
        DEADLINE,
        || {
            (env.kinds_of(runner)
                .iter()
                .filter(|k| *k == "signal")
                .count()
                == 2)
                .then_some(())
        },
        || env.events_text(),
    );
    assert!(r.running(), "a second SIGTERM ended the runner");
    assert_eq!(env.status()["lock_held"], true);

    // Let the child die: abort the FUSE connection.
    fuse.abort();
    let f = r.wait();
    f.expect_code(70);
    assert!(!alive(child), "the child was reaped");
    let end = f.end();
    assert_eq!(end["reason"], "did-not-stop", "{end}");
    assert_eq!(end["summary"], "did-not-stop/SIGKILL", "{end}");
    assert_eq!(end["killed"], true, "{end}");
    assert_eq!(end["child"], "killed by signal 9", "{end}");
    let ks = env.kinds_of(runner);
    before(&ks, "killed", "did-not-stop");
    before(&ks, "did-not-stop", "child-exited");
    before(&ks, "child-exited", "released");
    assert_eq!(
        ks.iter().filter(|k| *k == "did-not-stop").count(),
        1,
        "`did not stop` is said once: {ks:?}"
    );
    assert!(
        f.stderr.contains("tenure: released ")
            && f.stderr.contains("(epoch 1, did-not-stop/SIGKILL)"),
        "the last line says the lease was released after all: {}",
        f.stderr
    );

    // The real trace is one the model allows, ending in did-not-stop with code 70.
    let s = check_file(&trace).unwrap_or_else(|v| panic!("trace does not conform: {v:?}"));
    assert_eq!(s.exit_code(), Some(70));
    assert!(s.final_phase.contains("did-not-stop"), "{}", s.final_phase);

    // A successor acquires at once (without waiting) with the next epoch.
    let next = env.run_to_end(&["-n"], &["true"]);
    next.expect_code(0);
    assert_eq!(next.end()["epoch"], 2);
}

/// Card T2 / invariant I7 across a crash: a crashed owner's child that survives
/// SIGKILL past the successor's `--kill-wait` makes the successor refuse to start: exit 74,
/// `refused/io`, a message naming the surviving pid, its command never run, the lease released
/// (the orphan still holds no lock, the dir is free). Once the orphan can die, the next run
/// starts normally.
#[test]
fn orphan_surviving_kill_wait_makes_the_successor_refuse() {
    let Some(mut fuse) = fuse_or_skip("orphan surviving --kill-wait") else {
        return;
    };
    let env = Env::new();
    let stuck = fuse.path(common::fuse::STUCK);
    // `cat` itself is the child (no `sh -c 'exec cat'`): the registry records the child's
    // identity (pid, start time, executable) at spawn, and an exec after that changes the
    // executable, so the successor would count the orphan as a recycled pid and start anyway
    // (a gap of the first process-tree work, card T2).
    let owner = env.run(&[], &["cat", stuck.to_str().unwrap()]);
    let child = env.wait_event("spawned", Some(owner.pid()))["child_pid"]
        .as_u64()
        .expect("child_pid") as u32;
    assert_eq!(fuse.wait_held(DEADLINE), child);
    // The owner crashes: its parent-death signal SIGKILLs the child, which cannot die while
    // its FUSE request is held.
    owner.signal(Signal::KILL);
    let crashed = owner.wait();
    assert!(crashed.end.is_none());
    wait_for(
        &format!("orphan {child} in uninterruptible sleep"),
        DEADLINE,
        || (proc_state(child) == Some('D')).then_some(()),
        || format!("state {:?}", proc_state(child)),
    );

    let ran = env.path("successor-ran");
    let f = env.run_to_end(
        &["-n", "--kill-wait", "0.3"],
        &sh(r#"echo ran > "$1""#, &[ran.to_str().unwrap()]),
    );
    f.expect_code(74);
    assert_eq!(f.end()["summary"], "refused/io", "{}", f.stderr);
    assert!(
        f.stderr.contains(&format!("pid {child}")) && f.stderr.contains("survived SIGKILL"),
        "the message names the orphan: {}",
        f.stderr
    );
    assert!(!ran.exists(), "the successor started a second workload");
    assert!(!env.kinds_of(f.pid).contains(&"spawned".to_owned()));
    assert_eq!(proc_state(child), Some('D'), "the orphan is still there");
    assert_eq!(
        env.status()["lock_held"],
        false,
        "the refusal released the lease"
    );

    // Let the orphan die; the next run stops nothing and starts.
    fuse.abort();
    wait_for(
        "the orphan to die",
        DEADLINE,
        || (!alive(child)).then_some(()),
        String::new,
    );
    let next = env.run_to_end(&["-n"], &sh(r#"echo ran > "$1""#, &[ran.to_str().unwrap()]));
    next.expect_code(0);
    assert!(ran.exists(), "the next run started its workload");
}

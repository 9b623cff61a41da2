//! The workload is a process tree (cards T1–T5), through the built binary with real
//! process trees, real signals and real SIGKILL crashes: what a child backgrounds or detaches
//! with `setsid` is stopped before the lease is released, a successor never overlaps what a
//! crashed runner left, no catchable signal kills the runner, forking daemons are ready when
//! their first process exits, and only the workload can speak sd_notify.
//!
//! Both containment mechanisms are checked where the machine allows: `--cgroup off` (subreaper
//! and the inherited lock descriptor) always; the cgroup where cgroup v2 is writable. Without
//! it, the cgroup cases follow the one skip rule (tests/common/skip.rs): a `SKIPPED:` line, or a
//! failure under `TENURE_REQUIRE_SERVERS=1`, which `.ci/run` sets. Every run's trace is checked
//! against the models by the harness, so these process trees conform too.

mod common;

use common::*;
use rustix::process::Signal;
use serde_json::Value;
use std::fs;
use std::net::{TcpListener, TcpStream};
use std::os::unix::net::UnixDatagram;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::Path;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// How a run contains its workload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// A cgroup of the ownership.
    Cgroup,
    /// `--cgroup off`: subreaper and the inherited lock descriptor.
    LockFd,
}

impl Mode {
    fn args(self) -> [&'static str; 2] {
        match self {
            Mode::Cgroup => ["--cgroup", "auto"],
            Mode::LockFd => ["--cgroup", "off"],
        }
    }

    fn mechanism(self) -> &'static str {
        match self {
            Mode::Cgroup => "cgroup",
            Mode::LockFd => "lock-fd",
        }
    }
}

/// Whether a run gets a cgroup here, found by running one (the real check: root or a delegated
/// subtree, cgroup v2 mounted).
fn cgroup_available() -> bool {
    static AVAILABLE: OnceLock<bool> = OnceLock::new();
    *AVAILABLE.get_or_init(|| {
        let env = Env::new();
        let f = env.run_to_end(&[], &["true"]);
        f.expect_code(0);
        let spawned = env.wait_event("spawned", Some(f.pid));
        spawned["containment"]["mechanism"] == "cgroup"
    })
}

/// The modes to check: both, or the lock descriptor alone when no cgroup can be made (the
/// cgroup case then skips by the one rule: a `SKIPPED:` line, a failure in CI).
fn modes(test: &str) -> Vec<Mode> {
    if cgroup_available() {
        return vec![Mode::Cgroup, Mode::LockFd];
    }
    common::skip::skip(
        &format!("{test} (its cgroup case)"),
        "cgroup v2 is not writable here (run as root, or in a subtree delegated by systemd)",
    );
    vec![Mode::LockFd]
}

/// Waits until `path` holds a complete line and returns its first line.
fn wait_line(path: &Path) -> String {
    wait_for(
        &format!("a line in {}", path.display()),
        DEADLINE,
        || {
            fs::read_to_string(path)
                .ok()
                .filter(|s| s.ends_with('\n'))
                .map(|s| s.lines().next().unwrap_or_default().to_owned())
        },
        String::new,
    )
}

fn read_pid(path: &Path) -> u32 {
    wait_line(path).trim().parse().expect("a pid")
}

/// A TCP port nobody listens on right now.
fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn listening(port: u16) -> bool {
    TcpStream::connect(("127.0.0.1", port)).is_ok()
}

/// Card T1 (the issue's first example): a child that backgrounds a server and waits. When
/// `tenure stop` returns, nothing listens on the port any more.
#[test]
fn t1_background_server_is_gone_when_stop_returns() {
    for mode in modes("t1_background_server_is_gone_when_stop_returns") {
        let env = Env::new();
        let port = free_port();
        let script = r#"python3 -m http.server "$1" --bind 127.0.0.1 >/dev/null 2>&1 &
wait"#;
        let mut args = vec!["--grace", "5"];
        args.extend(mode.args());
        let r = env.run(&args, &sh(script, &[&port.to_string()]));
        wait_for(
            &format!("the server on port {port}"),
            DEADLINE,
            || listening(port).then_some(()),
            || env.events_text(),
        );
        let st = env.status();
        assert_eq!(st["containment"]["mechanism"], mode.mechanism(), "{st}");
        let procs: Vec<u32> = st["containment"]["processes"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| p.as_u64().unwrap() as u32)
            .collect();
        assert!(
            !procs.is_empty(),
            "{mode:?}: status lists the workload: {st}"
        );
        let cgroup = st["containment"]["cgroup"]
            .as_str()
            .map(std::path::PathBuf::from);
        assert_eq!(cgroup.is_some(), mode.mechanism() == "cgroup", "{st}");
        let stop = env.tool("stop", &[]);
        stop.expect_code(0);
        assert!(
            !listening(port),
            "{mode:?}: the server still listens after `tenure stop` returned"
        );
        for p in procs {
            assert!(!alive(p), "{mode:?}: pid {p} of the workload still runs");
        }
        let f = r.wait();
        f.expect_code(143);
        // The ownership's cgroup went with it.
        if let Some(cg) = cgroup {
            assert!(!cg.exists(), "{mode:?}: {} was left behind", cg.display());
        }
    }
}

/// Card T1: a child that detaches a `setsid` grandchild ignoring TERM and exits 0. The
/// grandchild gets TERM, the grace, SIGKILL; it is gone before `tenure run` returns, the lease
/// was held until then, and the end record counts it.
#[test]
fn t1_setsid_grandchild_is_gone_before_run_returns() {
    for mode in modes("t1_setsid_grandchild_is_gone_before_run_returns") {
        let env = Env::new();
        let pidfile = env.path("gc.pid");
        let script = r#"setsid sh -c 'trap "" TERM; echo $$ > "$1"; exec sleep 1000' sh "$1" &
while [ ! -s "$1" ]; do sleep 0.01; done
exit 0"#;
        let mut args = vec!["--grace", "0.5"];
        args.extend(mode.args());
        let r = env.run(&args, &sh(script, &[pidfile.to_str().unwrap()]));
        let trace = r.trace().expect("traced").to_path_buf();
        let gc = read_pid(&pidfile);
        let f = r.wait();
        // The harness checked the trace against the models; it went through the tree.
        let text = read(&trace);
        for ev in ["main-exited", "tree-empty"] {
            assert!(
                text.contains(ev),
                "{mode:?}: {ev} missing from the trace:\n{text}"
            );
        }
        assert!(
            !alive(gc),
            "{mode:?}: the grandchild outlived the run: {:?}",
            proc_state(gc)
        );
        f.expect_code(137);
        let end = f.end();
        assert_eq!(end["summary"], "killed/SIGKILL", "{end}");
        assert_eq!(end["child"], "exited 0", "{end}");
        assert_eq!(end["descendants_stopped"], 1, "{end}");
        let ks = env.kinds_of(f.pid);
        let at = |k: &str| ks.iter().position(|x| x == k).unwrap_or(usize::MAX);
        assert!(
            at("tree-remains") < at("killed") && at("killed") < at("released"),
            "{ks:?}"
        );
    }
}

/// Card T1 with `--kill-mode main`: the stop signal reaches the main process first; what it
/// leaves behind gets it once the main process exited; the drain still publishes (the main
/// process exited 0 and everything stopped in order). With the default `tree` mode both get it
/// at once.
#[test]
fn t1_kill_mode_main_signals_the_rest_after_the_main_process() {
    let env = Env::new();
    let log = env.path("order");
    let ready = env.path("ready");
    let script = r#"sh -c 'trap "echo bg >> \"$1\"; exit 0" TERM; while :; do sleep 0.02; done' sh "$1" &
trap 'echo main >> "$1"; echo ok > "$TENURE_CHECKPOINT_OUT/ok"; exit 0' TERM
echo > "$2"
while :; do sleep 0.02; done"#;
    let r = env.run(
        &["--kill-mode", "main", "--cgroup", "off"],
        &sh(script, &[log.to_str().unwrap(), ready.to_str().unwrap()]),
    );
    wait_line(&ready);
    r.signal(Signal::TERM);
    let f = r.wait();
    f.expect_code(143);
    assert_eq!(read(&log), "main\nbg\n");
    // The background loop and, perhaps, the `sleep` it was in.
    assert!(
        f.end()["descendants_stopped"].as_u64() >= Some(1),
        "{}",
        f.end()
    );
    assert!(f.stderr.contains("checkpoint"), "{}", f.stderr);
    assert_eq!(env.checkpoint_file("ok").as_deref(), Some("ok\n"));
}

/// Card T2, cgroup path: the runner is SIGKILLed while its workload lives on in a `setsid`
/// grandchild that ignores TERM. The successor ends the recorded cgroup before it starts its
/// own workload: its child never sees the grandchild alive.
#[test]
fn t2_successor_ends_the_crashed_owners_cgroup() {
    if !modes("t2_successor_ends_the_crashed_owners_cgroup").contains(&Mode::Cgroup) {
        return;
    }
    let env = Env::new();
    let pidfile = env.path("gc.pid");
    let script = r#"setsid sh -c 'trap "" TERM; echo $$ > "$1"; exec sleep 1000' sh "$1" &
read _"#;
    let r = env.run(&[], &sh(script, &[pidfile.to_str().unwrap()]));
    let gc = read_pid(&pidfile);
    env.wait_event("ready", Some(r.pid()));
    r.signal(Signal::KILL);
    r.wait();
    assert!(
        alive(gc),
        "precondition: the grandchild outlived its runner"
    );
    let out = env.path("overlap");
    let check = r#"if [ -e "/proc/$1/stat" ] && ! grep -q ') Z ' "/proc/$1/stat"; then echo overlap > "$2"; else echo clean > "$2"; fi"#;
    let f = env.run_to_end(&[], &sh(check, &[&gc.to_string(), out.to_str().unwrap()]));
    f.expect_code(0);
    assert_eq!(read(&out), "clean\n", "the successor's workload overlapped");
    assert!(!alive(gc));
    let ended = env.wait_event("previous-workload-ended", Some(f.pid));
    assert!(
        ended["pids"].as_array().unwrap().iter().any(|p| p == gc),
        "{ended}"
    );
}

/// Card T2, no cgroup: the grandchild inherited the lock descriptor, so the kernel keeps the dir
/// locked after the runner was SIGKILLed: a successor is busy, `status` names the leftover, and
/// a waiting successor starts only once the grandchild is gone.
#[test]
fn t2_inherited_lock_keeps_the_successor_out() {
    let env = Env::new();
    let pidfile = env.path("gc.pid");
    let script = r#"setsid sh -c 'trap "" TERM; echo $$ > "$1"; exec sleep 1000' sh "$1" &
read _"#;
    let r = env.run(
        &["--cgroup", "off"],
        &sh(script, &[pidfile.to_str().unwrap()]),
    );
    let gc = read_pid(&pidfile);
    env.wait_event("ready", Some(r.pid()));
    r.signal(Signal::KILL);
    r.wait();
    assert!(
        alive(gc),
        "precondition: the grandchild outlived its runner"
    );
    let busy = env.run_to_end(&["--cgroup", "off", "--wait", "0.5"], &["true"]);
    busy.expect_code(75);
    let st = env.status();
    assert_eq!(st["lock_held"], true, "{st}");
    assert_eq!(st["containment"]["mechanism"], "lock-fd", "{st}");
    assert!(
        st["containment"]["processes"]
            .as_array()
            .unwrap()
            .iter()
            .any(|p| p == gc),
        "status names the leftover holding the lock: {st}"
    );
    let text = env.tool("status", &[]);
    assert!(text.stdout.contains("leftovers:"), "{}", text.stdout);
    let out = env.path("overlap");
    let check = r#"if [ -e "/proc/$1/stat" ] && ! grep -q ') Z ' "/proc/$1/stat"; then echo overlap > "$2"; else echo clean > "$2"; fi"#;
    let mut waiting = env.run(
        &["--cgroup", "off"],
        &sh(check, &[&gc.to_string(), out.to_str().unwrap()]),
    );
    env.wait_event("waiting", Some(waiting.pid()));
    assert!(waiting.running());
    send(gc, Signal::KILL);
    waiting.close_stdin();
    let f = waiting.wait();
    f.expect_code(0);
    assert_eq!(read(&out), "clean\n", "the successor's workload overlapped");
}

/// Runs an owner (`--cgroup MODE`) whose child detaches a leftover and SIGKILLs the owner:
/// the leftover (its pid, and the file its TERM trap writes to) outlives its runner. It reads a
/// FIFO it opened read-write (it never gets input, never sees its end) and forks nothing: a
/// SIGTERM runs its trap, and only SIGKILL ends it.
fn crash_leaving_a_leftover(env: &Env, cgroup: &str) -> (u32, std::path::PathBuf) {
    let pidfile = env.path("gc.pid");
    let got = env.path("got");
    let fifo = env.fifo("never");
    let script = r#"setsid sh -c 'trap "echo term >> \"$2\"" TERM; echo $$ > "$1"; while :; do read _ <> "$3"; done' sh "$1" "$2" "$3" &
read _"#;
    let r = env.run(
        &["--cgroup", cgroup],
        &sh(
            script,
            &[
                pidfile.to_str().unwrap(),
                got.to_str().unwrap(),
                fifo.to_str().unwrap(),
            ],
        ),
    );
    let gc = read_pid(&pidfile);
    env.wait_event("ready", Some(r.pid()));
    r.signal(Signal::KILL);
    r.wait();
    assert!(
        alive(gc),
        "precondition: the grandchild outlived its runner"
    );
    (gc, got)
}

/// `tenure stop --grace 0.5` of a dir whose crashed owner left [`crash_leaving_a_leftover`]'s
/// leftover: SIGTERM (its trap ran), then SIGKILL, exit 137 (no orderly release), and the
/// leftover is gone when stop returns.
fn stop_ends_the_leftover(env: &Env, gc: u32, got: &Path) -> Finished {
    let f = env.tool("stop", &["--grace", "0.5"]);
    f.expect_code(137);
    assert!(f.stdout.contains("sent SIGTERM"), "{}", f.stdout);
    assert!(f.stdout.contains("sent SIGKILL"), "{}", f.stdout);
    assert!(
        f.stderr.contains("without an orderly release"),
        "{}",
        f.stderr
    );
    assert!(!alive(gc), "the leftover still runs after stop returned");
    assert_eq!(
        read(got),
        "term\n",
        "SIGTERM reached the leftover before SIGKILL"
    );
    f
}

/// Cards P5 and T1, no cgroup: a crashed owner's leftover keeps the dir locked through the lock
/// descriptor it inherited, and `status` says to stop it. `tenure stop` does: it sends the
/// leftover SIGTERM, then SIGKILL after its grace (in that order, card D1), and reports that the
/// owner ended without an orderly release (137). It used to wait out its grace for a record
/// naming the holder and exit 75 saying the owner was "still starting", however often it ran.
#[test]
fn p5_stop_ends_a_crashed_owners_leftovers_holding_the_lock() {
    let env = Env::new();
    let (gc, got) = crash_leaving_a_leftover(&env, "off");
    let st = env.status();
    assert_eq!(st["lock_held"], true);
    // Nobody is acquiring: the recorded owner is gone and its leftover holds the lock.
    assert_eq!(st["phase"], "stale", "{st}");
    assert_eq!(
        st["containment"]["processes"],
        serde_json::json!([gc]),
        "{st}"
    );

    let f = stop_ends_the_leftover(&env, gc, &got);
    assert!(!f.stderr.contains("still starting"), "{}", f.stderr);
    assert_eq!(env.status()["lock_held"], false);
    env.run_to_end(&["--cgroup", "off", "-n"], &["true"])
        .expect_code(0);
}

/// Cards P5 and T1 with a cgroup: a crashed owner's leftover runs on in its recorded cgroup while
/// the lock is free. `tenure stop` ends it — SIGTERM, then SIGKILL after its grace — and exits
/// 137. It used to say the dir "is not owned: nothing runs there (already stopped)", exit 0
/// and leave it running until the next owner started.
#[test]
fn p5_stop_ends_a_crashed_owners_leftovers_in_its_cgroup() {
    if !modes("p5_stop_ends_a_crashed_owners_leftovers_in_its_cgroup").contains(&Mode::Cgroup) {
        return;
    }
    let env = Env::new();
    let (gc, got) = crash_leaving_a_leftover(&env, "auto");
    let st = env.status();
    assert_eq!(st["lock_held"], false, "{st}");
    assert_eq!(st["containment"]["mechanism"], "cgroup", "{st}");

    // Card P4: a copy of the dir (its marker names the original) never acts on them.
    let copy = env.path("copy");
    cp_a(&env.dir, &copy);
    let mut c = tenure();
    c.args(["stop", "--grace", "0.5", "--dir"]).arg(&copy);
    let mut from_copy = env.start(c);
    from_copy.close_stdin();
    let from_copy = from_copy.wait();
    from_copy.expect_code(0);
    assert!(alive(gc), "stop of a copy ended the original's leftover");

    let f = stop_ends_the_leftover(&env, gc, &got);
    assert!(!f.stdout.contains("nothing runs there"), "{}", f.stdout);
    let st = env.status();
    assert_eq!(
        st["containment"]["processes"],
        serde_json::json!([]),
        "{st}"
    );
    env.run_to_end(&["-n"], &["true"]).expect_code(0);
}

/// Card T3: USR1, USR2, WINCH, QUIT, ALRM, PWR, a real-time signal and the fault signals that
/// another process sent (`kill -SEGV`, ILL, BUS, FPE, TRAP, SYS) reach the workload and the
/// runner survives them all; HUP is forwarded too by default. The same signals while the runner
/// waits for a lease change nothing.
#[test]
fn t3_stray_signals_reach_the_child_and_the_runner_survives() {
    let env = Env::new();
    let got = env.path("got");
    let ready = env.path("ready");
    let names = [
        "USR1", "USR2", "WINCH", "QUIT", "ALRM", "CONT", "PWR", "HUP", "SEGV", "ILL", "BUS", "FPE",
        "TRAP", "SYS",
    ];
    let mut script = String::new();
    for n in names {
        script.push_str(&format!("trap 'echo {n} >> \"$1\"' {n}\n"));
    }
    script.push_str(
        "trap 'echo RT >> \"$1\"' 35\ntrap 'exit 0' TERM\necho > \"$2\"\nwhile :; do sleep 0.02; done",
    );
    let mut r = env.run(
        &["--cgroup", "off"],
        &sh(&script, &[got.to_str().unwrap(), ready.to_str().unwrap()]),
    );
    wait_line(&ready);
    let sigs = [
        (Signal::USR1, "USR1"),
        (Signal::USR2, "USR2"),
        (Signal::WINCH, "WINCH"),
        (Signal::QUIT, "QUIT"),
        (Signal::ALARM, "ALRM"),
        (Signal::POWER, "PWR"),
        (Signal::HUP, "HUP"),
        (Signal::SEGV, "SEGV"),
        (Signal::ILL, "ILL"),
        (Signal::BUS, "BUS"),
        (Signal::FPE, "FPE"),
        (Signal::TRAP, "TRAP"),
        (Signal::SYS, "SYS"),
    ];
    for (sig, name) in sigs {
        r.signal(sig);
        wait_for(
            &format!("{name} at the child"),
            DEADLINE,
            || {
                fs::read_to_string(&got)
                    .ok()
                    .filter(|s| s.lines().any(|l| l == name))
            },
            || env.events_text(),
        );
        assert!(r.running(), "the runner died of {name}");
    }
    // SIGRTMIN+1 (35), by number: rustix names no real-time signal.
    rustix::process::kill_process(
        rustix::process::Pid::from_raw(r.pid() as i32).unwrap(),
        unsafe { Signal::from_raw_unchecked(35) },
    )
    .unwrap();
    wait_for(
        "SIGRTMIN+1 at the child",
        DEADLINE,
        || {
            fs::read_to_string(&got)
                .ok()
                .filter(|s| s.lines().any(|l| l == "RT"))
        },
        || env.events_text(),
    );
    assert!(r.running());
    r.signal(Signal::TERM);
    let f = r.wait();
    f.expect_code(143);
    let relayed: Vec<Value> = env
        .events()
        .into_iter()
        .filter(|e| e["pid"] == f.pid && e["kind"] == "signal-forwarded")
        .collect();
    assert!(
        relayed
            .iter()
            .any(|e| e["signal"] == "SIGUSR1" && e["target"] == "main"),
        "{relayed:?}"
    );

    // While waiting for a held lease: the waiter survives and keeps waiting.
    let holder = env.run(&[], &sh("read _", &[]));
    env.wait_event("ready", Some(holder.pid()));
    let waiter = env.run(&[], &["true"]);
    env.wait_event("waiting", Some(waiter.pid()));
    for sig in [
        Signal::USR1,
        Signal::USR2,
        Signal::WINCH,
        Signal::QUIT,
        Signal::SEGV,
        Signal::BUS,
    ] {
        waiter.signal(sig);
    }
    let st = env.wait_status("the waiter still waits", |s| {
        s["waiters"].as_array().is_some_and(|w| w.len() == 1)
    });
    assert_eq!(st["phase"], "ready");
    waiter.signal(Signal::TERM);
    waiter.wait().expect_code(143);
    holder.signal(Signal::TERM);
    holder.wait();
}

/// Card T3: one SIGINT to the runner's whole process group (Ctrl-C, systemd's
/// KillMode=control-group) reaches the child once: the child has a process group of its own,
/// and the runner forwards the signal to it.
#[test]
fn t3_group_sigint_reaches_the_child_once() {
    let env = Env::new();
    let got = env.path("got");
    let ready = env.path("ready");
    let script = r#"trap 'echo INT >> "$1"' INT
trap 'exit 0' TERM
echo > "$2"
while :; do sleep 0.02; done"#;
    let mut c = tenure();
    // Its own `--trace`: the harness then starts the command as built here (it rebuilds a
    // command to add one, which would drop the process group).
    c.arg("run")
        .arg("--trace")
        .arg(env.path("group.trace"))
        .arg("--dir")
        .arg(&env.dir)
        .args(["--grace", "1", "--"])
        .args(sh(
            script,
            &[got.to_str().unwrap(), ready.to_str().unwrap()],
        ))
        // Its own group, so the test can signal the group without signalling itself.
        .process_group(0);
    let r = env.start(c);
    wait_line(&ready);
    rustix::process::kill_process_group(
        rustix::process::Pid::from_raw(r.pid() as i32).unwrap(),
        Signal::INT,
    )
    .unwrap();
    wait_line(&got);
    // The child traps INT and keeps running: the grace ends in SIGKILL. Meanwhile a second
    // delivery (directly from the group signal) would have added a line.
    let f = r.wait();
    f.expect_code(137);
    assert_eq!(
        read(&got),
        "INT\n",
        "the child got the group's SIGINT more than once"
    );
    assert_eq!(f.end()["signal"], "SIGINT");
}

/// Card T4: a daemon whose first process forks and exits 0 is ready at that moment; with
/// `--pidfile` the daemon is the main process: USR1 reaches it, `stop` ends it and the run.
#[test]
fn t4_forking_shell_daemon_with_pid_file() {
    let env = Env::new();
    let pid_file = env.path("daemon.pid");
    let got = env.path("got");
    let script = r#"(setsid sh -c 'trap "echo USR1 >> \"$2\"" USR1; trap "exit 0" TERM; sleep 0.2; echo $$ > "$1"; while :; do sleep 0.02; done' sh "$1" "$2" &)
exit 0"#;
    let r = env.run(
        &forking(&pid_file, "20"),
        &sh(script, &[pid_file.to_str().unwrap(), got.to_str().unwrap()]),
    );
    env.wait_status("ready", |s| s["phase"] == "ready");
    let daemon = read_pid(&pid_file);
    let adopted = env.wait_event("main-adopted", Some(r.pid()));
    assert_eq!(adopted["child_pid"], daemon);
    r.signal(Signal::USR1);
    assert_eq!(wait_line(&got), "USR1");
    env.tool("stop", &[]).expect_code(0);
    assert!(!alive(daemon));
    let f = r.wait();
    f.expect_code(143);
    assert_eq!(f.end()["child"], "exited 0");
}

/// Card T4 with a real daemon: `redis-server --daemonize yes --pidfile F` under
/// `--type forking --pidfile F`: ready, `status`, `stop`, port closed. Needs the apt package
/// `redis-server`: without it the test skips by the one rule (a `SKIPPED:` line; a failure under
/// `TENURE_REQUIRE_SERVERS=1`, which `.ci/run` sets, after installing it).
#[test]
fn t4_redis_daemonize_under_type_forking() {
    let Some(redis) = which("redis-server") else {
        if std::env::var_os("TENURE_REQUIRE_SERVERS").is_some_and(|v| v == "1") {
            panic!("redis-server is not installed and TENURE_REQUIRE_SERVERS=1");
        }
        eprintln!(
            "NOTICE: t4_redis_daemonize_under_type_forking skipped: redis-server is not installed (apt-get install redis-server)"
        );
        return;
    };
    for mode in modes("t4_redis_daemonize_under_type_forking") {
        let env = Env::new();
        let port = free_port();
        let data = env.path("redis-data");
        fs::create_dir(&data).unwrap();
        let pid_file = env.path("redis.pid");
        let mut args = forking(&pid_file, "20").to_vec();
        args.extend(mode.args());
        let port_s = port.to_string();
        let r = env.run(
            &args,
            &[
                redis.to_str().unwrap(),
                "--daemonize",
                "yes",
                "--pidfile",
                pid_file.to_str().unwrap(),
                "--port",
                &port_s,
                "--bind",
                "127.0.0.1",
                "--dir",
                data.to_str().unwrap(),
                "--save",
                "",
                "--appendonly",
                "no",
                "--logfile",
                "",
            ],
        );
        let st = env.wait_status("ready", |s| s["phase"] == "ready");
        assert_eq!(st["containment"]["mechanism"], mode.mechanism(), "{st}");
        let daemon = read_pid(&pid_file);
        env.wait_event("main-adopted", Some(r.pid()));
        wait_for(
            &format!("redis on port {port}"),
            DEADLINE,
            || listening(port).then_some(()),
            || env.events_text(),
        );
        let text = env.tool("status", &[]);
        text.expect_code(0);
        assert!(text.stdout.contains("phase:      ready"), "{}", text.stdout);
        env.tool("stop", &[]).expect_code(0);
        assert!(!listening(port), "{mode:?}: redis still listens after stop");
        assert!(!alive(daemon), "{mode:?}: redis still runs after stop");
        let f = r.wait();
        f.expect_code(143);
        assert_eq!(f.end()["summary"], "stopped/SIGTERM");
    }
}

/// Cards T4 and D4: a forking daemon whose first process never exits is stopped at the
/// readiness timeout, and the message says what was awaited — the first process's exit (and
/// the pid file) — not a `READY=1` that `--type forking` never asks for.
#[test]
fn t4_a_forking_readiness_timeout_names_what_was_awaited() {
    let env = Env::new();
    let pidfile = env.path("main.pid");
    let f = env.run_to_end(
        &forking(&pidfile, "0.5"),
        &sh("read _; exec sleep 1000", &[]),
    );
    f.expect_code(69);
    assert!(f.stderr.contains("readiness timed out"), "{}", f.stderr);
    assert!(!f.stderr.contains("READY=1"), "{}", f.stderr);
    assert!(
        f.stderr.contains("first process did not exit 0"),
        "{}",
        f.stderr
    );
    assert!(f.stderr.contains(pidfile.to_str().unwrap()), "{}", f.stderr);
}

/// Card T4: the pid file is read without following a symbolic link and without waiting on a
/// FIFO. A `--pidfile` that is a link to the daemon's real pid file, or a FIFO, is reported
/// (`waiting for the pid file …: it is a symbolic link; refusing to follow it`, `… it is not a
/// regular file`) and never adopted, and the runner still handles a stop — it never waits in
/// `open` — which ends the run and the daemon.
#[test]
fn t4_a_pid_file_that_is_a_link_or_a_fifo_is_never_followed_or_waited_on() {
    for kind in ["symlink", "fifo"] {
        let env = Env::new();
        let real = env.path("real.pid");
        let pidfile = if kind == "fifo" {
            env.fifo("main.pid")
        } else {
            let p = env.path("main.pid");
            std::os::unix::fs::symlink(&real, &p).unwrap();
            p
        };
        let script = r#"(setsid sh -c 'echo $$ > "$1.tmp"; mv "$1.tmp" "$1"; exec sleep 1000' sh "$1" &)
exit 0"#;
        let r = env.run(
            &forking(&pidfile, "60"),
            &sh(script, &[real.to_str().unwrap()]),
        );
        let daemon = read_pid(&real);
        let said = if kind == "fifo" {
            "it is not a regular file"
        } else {
            "it is a symbolic link; refusing to follow it"
        };
        let line = format!("waiting for the pid file {}: {said}", pidfile.display());
        wait_for(
            &format!("{kind}: the runner to report its pid file"),
            DEADLINE,
            || r.stderr().contains(&line).then_some(()),
            || r.stderr(),
        );
        assert_eq!(env.status()["phase"], "recovering", "{kind}");
        r.signal(Signal::TERM);
        let f = r.wait();
        f.expect_code(143);
        assert!(
            !env.kinds_of(f.pid).iter().any(|k| k == "main-adopted"),
            "{kind}: the daemon was adopted through the pid file: {}",
            env.events_text()
        );
        assert!(!alive(daemon), "{kind}: the daemon outlived the run");
    }
}

/// The options of a forking daemon whose main process `pidfile` names, ready within
/// `timeout` seconds.
fn forking<'a>(pidfile: &'a Path, timeout: &'a str) -> [&'a str; 6] {
    [
        "--type",
        "forking",
        "--pidfile",
        pidfile.to_str().unwrap(),
        "--ready-timeout",
        timeout,
    ]
}

fn which(name: &str) -> Option<std::path::PathBuf> {
    std::env::var_os("PATH")?
        .to_str()?
        .split(':')
        .map(|d| Path::new(d).join(name))
        .find(|p| p.is_file())
}

/// The child's `NOTIFY_SOCKET`, read from its environment.
fn notify_socket_of(pid: u32) -> String {
    let environ = fs::read(format!("/proc/{pid}/environ")).unwrap();
    environ
        .split(|b| *b == 0)
        .find_map(|kv| kv.strip_prefix(b"NOTIFY_SOCKET="))
        .map(|v| String::from_utf8_lossy(v).into_owned())
        .expect("NOTIFY_SOCKET in the child's environment")
}

fn send_notify(socket: &str, text: &str) {
    use std::os::linux::net::SocketAddrExt;
    let addr = std::os::unix::net::SocketAddr::from_abstract_name(
        socket.strip_prefix('@').expect("abstract").as_bytes(),
    )
    .unwrap();
    UnixDatagram::unbound()
        .unwrap()
        .send_to_addr(text.as_bytes(), &addr)
        .unwrap();
}

/// Card T5: `READY=1` from a process outside the workload (the test itself, which found the
/// socket's name) is ignored with one warning line; a real `systemd-notify --ready` run inside
/// the workload (a short-lived descendant) is heard. STATUS= is relayed to the parent's socket.
#[test]
fn t5_only_the_workload_declares_readiness() {
    let env = Env::new();
    let parent = env.path("parent.sock");
    let sock = UnixDatagram::bind(&parent).unwrap();
    sock.set_nonblocking(true).unwrap();
    let gate = env.fifo("gate");
    let script = r#"read _ < "$1"
systemd-notify --status=warm --ready
trap 'exit 0' TERM
while :; do sleep 0.02; done"#;
    let mut c = tenure();
    c.arg("run")
        .arg("--dir")
        .arg(&env.dir)
        .args(["--type", "notify", "--"])
        .args(sh(script, &[gate.to_str().unwrap()]))
        .env("NOTIFY_SOCKET", &parent);
    let r = env.start(c);
    let child = env.wait_event("spawned", Some(r.pid()))["child_pid"]
        .as_u64()
        .unwrap() as u32;
    wait_blocked_in_fifo_open(child);
    let name = notify_socket_of(child);
    send_notify(&name, "READY=1");
    send_notify(&name, "READY=1");
    let rejected = env.wait_event("notify-rejected", Some(r.pid()));
    assert_eq!(rejected["sender_pid"], std::process::id());
    let st = env.status();
    assert_eq!(
        st["phase"], "recovering",
        "a stranger's READY=1 counted: {st}"
    );
    let warnings = r
        .stderr()
        .lines()
        .filter(|l| l.contains("not a process of the workload"))
        .count();
    assert_eq!(warnings, 1, "one warning line per sender:\n{}", r.stderr());
    release_fifo(&gate);
    env.wait_status("ready after the workload's READY=1", |s| {
        s["phase"] == "ready"
    });
    let mut got = Vec::new();
    let mut buf = [0u8; 512];
    wait_for(
        "READY=1 and STATUS=warm at the parent",
        DEADLINE,
        || {
            while let Ok(n) = sock.recv(&mut buf) {
                got.push(String::from_utf8_lossy(&buf[..n]).into_owned());
            }
            (got.iter().any(|m| m == "READY=1") && got.iter().any(|m| m == "STATUS=warm"))
                .then_some(())
        },
        String::new,
    );
    r.signal(Signal::TERM);
    r.wait().expect_code(143);
}

/// Card T5: a parent `NOTIFY_SOCKET` whose queue is full never stalls the runner: SIGTERM still
/// drains within grace + 1 s (a child that ignores TERM is killed after the grace).
/// Card T5 with `systemd-notify`: each sends its notice, then `BARRIER=1` with a descriptor, and
/// exits as soon as that descriptor is closed. Thirty of them queue up while the runner is
/// stopped (SIGSTOP), so it reads many of their datagrams at once: every one is accepted as the
/// workload's, none is reported as a stranger's. The runner used to close each descriptor as
/// it read the datagram and check the senders afterwards, when many had exited already (14 of
/// 30 rejected, the first `READY=1`s among them).
#[test]
fn t5_systemd_notify_senders_are_checked_before_their_barrier_closes() {
    let env = Env::new();
    let gate = env.fifo("go");
    let script = r#"read x < "$1"
i=0; while [ $i -lt 30 ]; do systemd-notify --ready & i=$((i + 1)); done
wait
read _ || true"#;
    let mut r = env.run(
        &["--type", "notify", "--ready-timeout", "60"],
        &sh(script, &[gate.to_str().unwrap()]),
    );
    let child = env.wait_event("spawned", Some(r.pid()))["child_pid"]
        .as_u64()
        .unwrap() as u32;
    wait_blocked_in_fifo_open(child);
    r.signal(Signal::STOP);
    release_fifo(&gate);
    // All thirty wait: in their send (the socket's queue is full) or for their barrier.
    wait_for(
        "thirty systemd-notify waiting on the stopped runner",
        DEADLINE,
        || {
            let waiting = fs::read_dir("/proc")
                .ok()?
                .flatten()
                .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
                .filter(|pid| {
                    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
                    let wchan =
                        fs::read_to_string(format!("/proc/{pid}/wchan")).unwrap_or_default();
                    stat.contains("(systemd-notify)")
                        && stat.rsplit(')').next().and_then(|t| t.split(' ').nth(2))
                            == Some(&child.to_string())
                        && (wchan.contains("wait_for_peer") || wchan.contains("poll"))
                })
                .count();
            (waiting == 30).then_some(())
        },
        String::new,
    );
    r.signal(Signal::CONT);
    env.wait_status("ready", |s| s["phase"] == "ready");
    r.close_stdin();
    let f = r.wait();
    f.expect_code(0);
    let rejected: Vec<Value> = env
        .events()
        .into_iter()
        .filter(|e| e["kind"] == "notify-rejected")
        .map(|e| e["sender_pid"].clone())
        .collect();
    assert!(
        rejected.is_empty(),
        "{} of the workload's systemd-notify were rejected: {rejected:?}",
        rejected.len()
    );
}

#[test]
fn t5_full_parent_socket_never_stalls() {
    let env = Env::new();
    let parent = env.path("parent.sock");
    let sock = UnixDatagram::bind(&parent).unwrap();
    let filler = UnixDatagram::unbound().unwrap();
    filler.set_nonblocking(true).unwrap();
    let mut queued = 0;
    while filler.send_to(b"FILLER=1", &parent).is_ok() {
        queued += 1;
        assert!(queued < 100_000, "the parent socket never filled up");
    }
    let armed = env.path("armed");
    // STUBBORN_CHILD, which also says when its trap is set.
    let stubborn = "trap '' TERM\n: > \"$1\"\nread _\nexit 0";
    let mut c = tenure();
    c.arg("run")
        .arg("--dir")
        .arg(&env.dir)
        .args(["--grace", "1", "--"])
        .args(sh(stubborn, &[armed.to_str().unwrap()]))
        .env("NOTIFY_SOCKET", &parent);
    let r = env.start(c);
    env.wait_event("ready", Some(r.pid()));
    // `ready` of a simple service comes at spawn, before the shell has ignored TERM: wait for
    // the child to say its trap is set, or a SIGTERM that wins the race ends it with 143.
    wait_for(
        "the child's TERM trap",
        DEADLINE,
        || armed.exists().then_some(()),
        String::new,
    );
    let t = Instant::now();
    r.signal(Signal::TERM);
    let f = r.wait();
    let took = t.elapsed();
    f.expect_code(137);
    assert!(
        took < Duration::from_secs(2),
        "SIGTERM took {took:?} with a full parent socket (grace 1 s)"
    );
    assert!(
        f.stderr.contains("cannot notify the supervisor"),
        "{}",
        f.stderr
    );
    drop(sock);
}

/// `--watchdog`: a ready workload that stops sending `WATCHDOG=1` is stopped (TERM, grace,
/// SIGKILL) and the run ends `watchdog/missed-ping` (69) without publishing; one that keeps
/// pinging runs on and ends as any other.
#[test]
fn watchdog_stops_a_silent_workload() {
    let env = Env::new();
    let script = r#"echo "$WATCHDOG_USEC" > "$1"
echo x > "$TENURE_CHECKPOINT_OUT/x"
systemd-notify --ready
trap 'exit 0' TERM
while :; do sleep 0.02; done"#;
    let usec = env.path("usec");
    let f = env.run_to_end(
        &["--type", "notify", "--watchdog", "0.4", "--grace", "2"],
        &sh(script, &[usec.to_str().unwrap()]),
    );
    f.expect_code(69);
    assert_eq!(f.end()["summary"], "watchdog/missed-ping");
    assert_eq!(read(&usec), "400000\n");
    assert!(
        env.current_bytes().is_none(),
        "a silent workload publishes nothing"
    );

    let pinger = r#"systemd-notify --ready
trap 'exit 0' TERM
while :; do systemd-notify WATCHDOG=1; sleep 0.05; done"#;
    let r = env.run(&["--type", "notify", "--watchdog", "0.5"], &sh(pinger, &[]));
    env.wait_event("ready", Some(r.pid()));
    // Three watchdog periods (a sleep showing that nothing happens while the pings come).
    std::thread::sleep(Duration::from_millis(1500));
    let mut r = r;
    assert!(r.running(), "a pinging workload was stopped");
    r.signal(Signal::TERM);
    r.wait().expect_code(143);
}

/// The workload has a process group of its own (card T3), yet with a terminal it behaves as a
/// shell's foreground job: the runner hands the terminal's foreground to the workload's group,
/// so the child reads the terminal (instead of being stopped by SIGTTIN) — here a real pty from
/// `script(1)` — and takes it back when the workload is gone.
#[test]
fn t3_the_workload_reads_the_terminal() {
    let Some(script) = which("script") else {
        common::skip::skip(
            "t3_the_workload_reads_the_terminal",
            "script(1) is not installed (util-linux)",
        );
        return;
    };
    let env = Env::new();
    let out = env.path("read");
    let after = env.path("read-after");
    let trace = env.path("tty.trace");
    // After the run, the shell that started it reads the terminal too: it can only if the
    // runner took the foreground back (a background group that reads it is stopped by SIGTTIN).
    let inner = format!(
        "{} run --trace {} --dir {} --cgroup off -- sh -c 'read x; echo got:$x > {}; sleep 0.2; echo back; exit 0'; read y; echo after:$y > {}",
        bin(),
        trace.display(),
        env.dir.display(),
        out.display(),
        after.display()
    );
    /// SIGKILLs `script` (and so the runner and its child, through the pty's hangup and the
    /// parent-death signal) if the test fails before it ended.
    struct Guard(std::process::Child);
    impl Drop for Guard {
        fn drop(&mut self) {
            if let Ok(None) = self.0.try_wait() {
                let _ = self.0.kill();
                let _ = self.0.wait();
            }
        }
    }
    let mut guard = Guard(
        std::process::Command::new(script)
            .args(["-qec", &inner, "/dev/null"])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("script(1)"),
    );
    let child = &mut guard.0;
    use std::io::Write;
    child
        .stdin
        .as_mut()
        .unwrap()
        .write_all(b"hello\nagain\n")
        .unwrap();
    let status = wait_for(
        "the run on a terminal to end",
        DEADLINE,
        || child.try_wait().unwrap(),
        || format!("read so far: {:?}", fs::read_to_string(&out).ok()),
    );
    assert_eq!(read(&out), "got:hello\n", "the child read the terminal");
    assert_eq!(
        read(&after),
        "after:again\n",
        "the shell read the terminal after the run"
    );
    assert_eq!(status.code(), Some(0));
    check_trace(&trace, status);
}

/// Card T1 through `tenure stop`'s escalation: an owner that does not stop (frozen here with
/// SIGSTOP) is SIGKILLed after `stop`'s grace, and so is the rest of its workload — its cgroup,
/// or without one the processes still holding the lock through the descriptor they inherited —
/// so when `stop` reports the lease free, the detached grandchild is gone too.
#[test]
fn t1_stop_escalation_ends_the_whole_workload() {
    for mode in modes("t1_stop_escalation_ends_the_whole_workload") {
        let env = Env::new();
        let pidfile = env.path("gc.pid");
        let script = r#"setsid sh -c 'trap "" TERM; echo $$ > "$1"; exec sleep 1000' sh "$1" &
read _"#;
        let r = env.run(&mode.args(), &sh(script, &[pidfile.to_str().unwrap()]));
        let gc = read_pid(&pidfile);
        env.wait_event("ready", Some(r.pid()));
        r.signal(Signal::STOP);
        wait_for(
            "the runner to be frozen",
            DEADLINE,
            || (proc_state(r.pid()) == Some('T')).then_some(()),
            String::new,
        );
        // The owner had to be SIGKILLed: not an orderly release, so `stop` exits 137 (card P5).
        let stop = env.tool("stop", &["--grace", "0.5"]);
        stop.expect_code(137);
        assert!(
            stop.stderr.contains("killed with SIGKILL mid-drain")
                && stop.stderr.contains("is free"),
            "{mode:?}: {}",
            stop.stderr
        );
        assert!(
            !alive(gc),
            "{mode:?}: the grandchild outlived `stop`: {}",
            stop.stdout
        );
        let f = r.wait();
        assert_eq!(
            f.status.signal(),
            Some(9),
            "{mode:?}: the runner was SIGKILLed"
        );
    }
}

//! Signals across the phases of `tenure run` (cards G1–G5, D1, D4, H7, R1; the unreapable half
//! of G6 runs end to end in tests/runner_g6.rs), through the built binary: real state dirs, real
//! children — `sh` scripts and the hostile fixtures of tests/common/hostile.rs (a child that
//! stages and then dies of the forwarded signal, exits non-zero, swallows SIGTERM, or announces
//! its own stop) — and real SIGTERM/SIGINT/SIGHUP/SIGKILL/SIGSTOP. The harness checks every
//! run's trace against the models and its end record (tests/common).

mod common;

use common::hostile::{Fixture, Hostile, STAGED, store_holds};
use common::*;
use rustix::process::Signal;
use serde_json::Value;
use std::os::unix::net::UnixDatagram;
use std::time::{Duration, Instant};
#[cfg(feature = "failpoints")]
use tenure::machine::trace::TraceLine;

/// The kinds a run wrote, in order.
fn kinds(env: &Env, pid: u32) -> Vec<String> {
    env.kinds_of(pid)
}

/// Asserts `later` comes after `earlier` in `ks` (both present).
fn before(ks: &[String], earlier: &str, later: &str) {
    let a = ks.iter().position(|k| k == earlier);
    let b = ks.iter().rposition(|k| k == later);
    assert!(
        matches!((a, b), (Some(a), Some(b)) if a < b),
        "expected `{earlier}` before `{later}` in {ks:?}"
    );
}

/// Publishes a first checkpoint holding `a` = `one` and returns CURRENT's bytes.
fn seed_checkpoint(env: &Env) -> Vec<u8> {
    env.run_to_end(&[], &sh(r#"echo one > "$TENURE_CHECKPOINT_OUT/a""#, &[]))
        .expect_code(0);
    env.current_bytes().expect("CURRENT after the first run")
}

/// The `spawned` line's child pid of run `pid`.
fn child_pid(env: &Env, pid: u32) -> u32 {
    env.wait_event("spawned", Some(pid))["child_pid"]
        .as_u64()
        .expect("child_pid") as u32
}

/// What a run must leave when a child's staged files may not be published (invariants I8,
/// I9): CURRENT's bytes and the store's durable part as they were, the staged bytes in no
/// blob, and the checkpoint still verifying.
fn assert_nothing_published(
    env: &Env,
    current: &[u8],
    store: &std::collections::BTreeMap<std::path::PathBuf, Node>,
    staged: Option<&[u8]>,
    what: &str,
) {
    assert_eq!(
        env.current_bytes().as_deref(),
        Some(current),
        "{what}: CURRENT changed"
    );
    assert_same_tree(store, &env.checkpoint_tree());
    if let Some(bytes) = staged {
        assert!(
            !store_holds(&env.dir, bytes),
            "{what}: the staged bytes reached the store"
        );
    }
    env.tool("verify", &[]).expect_code(0);
}

/// Card G1: SIGTERM/SIGINT/SIGHUP while cold, waiting for a lease held by another process (the
/// test itself holds the kernel lock, so nobody ever owned the dir): outcome *cancelled*, exit
/// 128 + N, and nothing remains (invariant I5): the state dir is what the test made of it —
/// no owner record, identity marker, epoch, registry, checkpoint store or waiter entry; at most
/// an empty waiters directory and the event log's lines were added.
#[test]
fn g1_cancel_before_owning() {
    for (sig, code, name) in [
        (Signal::TERM, 143, "SIGTERM"),
        (Signal::INT, 130, "SIGINT"),
        (Signal::HUP, 129, "SIGHUP"),
    ] {
        let env = Env::new();
        let control = env.dir.join(".tenure");
        std::fs::create_dir_all(&control).unwrap();
        use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
        std::fs::set_permissions(&env.dir, std::fs::Permissions::from_mode(0o700)).unwrap();
        std::fs::set_permissions(&control, std::fs::Permissions::from_mode(0o700)).unwrap();
        let lock = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .mode(0o600)
            .open(control.join("lock"))
            .unwrap();
        rustix::fs::flock(&lock, rustix::fs::FlockOperation::LockExclusive).unwrap();
        let made = snapshot(&env.dir);

        let r = env.run(&[], &["true"]);
        env.wait_status("a visible waiter", |s| {
            s["waiters"].as_array().is_some_and(|w| w.len() == 1) && s["phase"] == "acquiring"
        });
        r.signal(sig);
        let f = r.wait();
        f.expect_code(code);
        assert!(
            f.stderr.contains(&format!("cancelled by {name}")),
            "{}",
            f.stderr
        );
        assert_eq!(f.end()["summary"], format!("cancelled/{name}"));
        let after = snapshot(&env.dir);
        for (p, n) in &made {
            assert_eq!(after.get(p), Some(n), "{name}: {} changed", p.display());
        }
        let added: Vec<(&std::path::PathBuf, &Node)> = after
            .iter()
            .filter(|(p, _)| !made.contains_key(*p))
            .collect();
        for (p, n) in &added {
            let allowed = match p.to_str().unwrap() {
                ".tenure/waiters" => matches!(n, Node::Dir(_)),
                ".tenure/events.jsonl" => matches!(n, Node::File(..)),
                _ => false,
            };
            assert!(allowed, "{name}: the cancelled run left {}", p.display());
        }
        assert_eq!(env.status()["waiters"], Value::Array(vec![]));
        drop(lock);
    }
}

/// Cards G2 and G3 (invariant I9): SIGTERM while recovering (lease held, a `--ready notify`
/// child that has not said READY=1) refuses: exit 143 — a refusal keeps its own code even when
/// its child needed SIGKILL —, `refused/SIGTERM`, the message names the phase, no ready or
/// released line. The end record says whether SIGKILL was needed (`killed`) and how the child
/// ended, and the forwarded signals are exactly TERM, or TERM then KILL. Whatever the child
/// staged, and however it ended, nothing is published: CURRENT and the store keep their bytes,
/// the staged bytes reach no blob, the checkpoint verifies, and a successor owns at once
/// (try-once) with the next epoch and recovers the old checkpoint. Rows: a child that dies of
/// the forwarded signal, one that exits 0 when told (still refused), one that swallows SIGTERM
/// (killed after the grace), and card G2's bootstrap blocked in I/O (opening a FIFO nobody
/// writes, dying of SIGTERM or ignoring it): the runner never waits on the blocked call.
#[test]
fn g2_g3_stop_while_recovering_refuses_and_publishes_nothing() {
    #[derive(Debug)]
    enum Child {
        Fx(Hostile),
        BlockedInOpen { ignores_term: bool },
    }
    let cases = [
        (
            Child::Fx(Hostile::StagesThenDiesBySignal),
            false,
            "killed by signal 15",
            &["SIGTERM"][..],
        ),
        (
            Child::Fx(Hostile::StagesThenExits(0)),
            false,
            "exited 0",
            &["SIGTERM"][..],
        ),
        (
            Child::Fx(Hostile::StagesThenIgnoresTerm),
            true,
            "killed by signal 9",
            &["SIGTERM", "SIGKILL"][..],
        ),
        (
            Child::BlockedInOpen {
                ignores_term: false,
            },
            false,
            "killed by signal 15",
            &["SIGTERM"][..],
        ),
        (
            Child::BlockedInOpen { ignores_term: true },
            true,
            "killed by signal 9",
            &["SIGTERM", "SIGKILL"][..],
        ),
    ];
    for (child, killed, status, forwarded) in cases {
        let what = format!("{child:?}");
        let env = Env::new();
        let current = seed_checkpoint(&env);
        let store = env.checkpoint_tree();
        let args = ["--ready", "notify", "--grace", "0.5"];
        let (r, fx) = match child {
            Child::Fx(kind) => {
                let fx = Fixture::new(&env, kind);
                let r = env.run(&args, &fx.command());
                fx.wait("staged");
                (r, Some(fx))
            }
            Child::BlockedInOpen { ignores_term } => {
                let fifo = env.fifo("never-written");
                let script = if ignores_term {
                    r#"trap '' TERM; exec 3< "$1""#
                } else {
                    r#"exec 3< "$1""#
                };
                let r = env.run(&args, &sh(script, &[fifo.to_str().unwrap()]));
                wait_blocked_in_fifo_open(child_pid(&env, r.pid()));
                (r, None)
            }
        };
        let child = child_pid(&env, r.pid());
        assert_eq!(env.status()["phase"], "recovering", "{what}");
        r.signal(Signal::TERM);
        let f = r.wait();
        f.expect_code(143);
        let end = f.end();
        assert_eq!(end["summary"], "refused/SIGTERM", "{what}: {end}");
        assert_eq!(end["reason"], "refused", "{what}: {end}");
        assert_eq!(end["killed"], killed, "{what}: was SIGKILL needed? {end}");
        assert_eq!(end["child"], status, "{what}: {end}");
        assert_eq!(env.forwarded(f.pid), forwarded, "{what}");
        assert!(
            f.stderr.contains("stopped by SIGTERM in phase recovering"),
            "{what}: the message names the phase: {}",
            f.stderr
        );
        assert!(!f.stderr.contains("tenure: ready"), "{what}: {}", f.stderr);
        let ks = kinds(&env, f.pid);
        assert!(
            !ks.iter().any(|k| k == "ready" || k == "released"),
            "{what}: {ks:?}"
        );
        assert!(ks.iter().any(|k| k == "refused"), "{what}: {ks:?}");
        assert!(!alive(child), "{what}: the child survived the runner");
        assert_nothing_published(
            &env,
            &current,
            &store,
            fx.as_ref().map(Fixture::staged),
            &what,
        );
        // A successor takes over immediately (try once, no waiting) from the old checkpoint.
        let next = env.run_to_end(&["-n"], &["true"]);
        next.expect_code(0);
        assert_eq!(next.end()["epoch"], 3, "{what}");
        assert_eq!(env.checkpoint_file("a").as_deref(), Some("one\n"), "{what}");
    }
}

/// Card G3 in the verifying step: SIGTERM while the recovery worker verifies the checkpoint.
/// The worker is held at the start of its verification by the named point `recover.verify` (a
/// failpoint gate the test opens), so the order is the test's choice, not a race with the
/// verification's speed: the stop is decided while the worker is held (the trace shows the
/// refusal from `recovering(verifying)` before the gate opens), no child is ever spawned, and
/// once the worker is let go the run ends refused, 143, with CURRENT and the store's bytes
/// unchanged; the next owner takes over at once and finds no scratch left behind.
#[cfg(feature = "failpoints")]
#[test]
fn g3_refuse_while_verifying_the_checkpoint() {
    use tenure::machine::{Event, Signal as Sig};
    let env = Env::new();
    let current = seed_checkpoint(&env);
    let store = env.checkpoint_tree();
    let gate = env.fifo("verify-gate");
    let mut c = tenure();
    c.arg("run")
        .arg("--dir")
        .arg(&env.dir)
        .args(["--ready", "notify", "--"])
        .args(sh("read _", &[]))
        .env(
            "TENURE_FAILPOINTS",
            format!("recover.verify=gate:{}", gate.display()),
        );
    let mut r = env.start(c);
    env.wait_event("owned", Some(r.pid()));
    r.signal(Signal::TERM);
    let trace = r.trace().expect("a traced run").to_owned();
    wait_for(
        "the stop to be decided while the worker is held",
        DEADLINE,
        || {
            read(&trace)
                .lines()
                .find_map(|l| match serde_json::from_str(l) {
                    Ok(TraceLine::Step(s))
                        if s.event == Event::Stop(Sig::Term)
                            && s.before == "recovering(verifying)" =>
                    {
                        Some(())
                    }
                    _ => None,
                })
        },
        || read(&trace),
    );
    // The release joins the worker first: while the worker is held, the run does not end. (A
    // release that did not wait for it ends the run within milliseconds of the stop; half a
    // second of watching sees that even on a loaded machine.)
    let watch = Instant::now() + Duration::from_millis(500);
    while Instant::now() < watch {
        assert!(
            r.running(),
            "the run ended while its recovery worker was still held: the release did not join it"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    release_fifo(&gate);
    let f = r.wait();
    f.expect_code(143);
    assert_eq!(f.end()["summary"], "refused/SIGTERM");
    let ks = kinds(&env, f.pid);
    assert!(
        !ks.iter().any(|k| k == "recovered" || k == "spawned"),
        "the stop was not handled while verifying: {ks:?}"
    );
    assert!(f.stderr.contains("in phase recovering"), "{}", f.stderr);
    assert_nothing_published(&env, &current, &store, None, "verifying");
    let next = env.run_to_end(&["-n"], &["true"]);
    next.expect_code(0);
    assert_eq!(next.end()["epoch"], 3);
    assert_eq!(env.scratch_left(), Vec::<std::path::PathBuf>::new());
}

/// Exit 74, `refused/io` (spec/lifecycle.md): an I/O error while recovering — an `EIO`
/// injected at the named point `recover.verify`, as a failing disk would give it — refuses the
/// run before any child starts: the message names the dir, nothing is published, CURRENT is
/// unchanged, and the lease is released (a successor owns at once and recovers the checkpoint).
#[cfg(feature = "failpoints")]
#[test]
fn refused_io_while_recovering_exits_74() {
    let env = Env::new();
    let current = seed_checkpoint(&env);
    let store = env.checkpoint_tree();
    let mut c = tenure();
    c.arg("run")
        .arg("--dir")
        .arg(&env.dir)
        .arg("--")
        .args(sh(r#"echo two > "$TENURE_CHECKPOINT_OUT/a""#, &[]))
        .env("TENURE_FAILPOINTS", "recover.verify=eio");
    let mut r = env.start(c);
    r.close_stdin();
    let f = r.wait();
    f.expect_code(74);
    assert_eq!(f.end()["summary"], "refused/io", "{}", f.stderr);
    assert!(
        f.stderr.contains(
            &std::fs::canonicalize(&env.dir)
                .unwrap()
                .display()
                .to_string()
        ),
        "the message names the dir: {}",
        f.stderr
    );
    assert!(!kinds(&env, f.pid).contains(&"spawned".to_owned()));
    assert_nothing_published(&env, &current, &store, Some(b"two\n"), "refused/io");
    let next = env.run_to_end(&["-n"], &["true"]);
    next.expect_code(0);
    assert_eq!(next.end()["epoch"], 3);
    assert_eq!(env.checkpoint_file("a").as_deref(), Some("one\n"));
}

/// Card G4 (and D4's `--ready start`, invariant I8): a stop signal when ready drains, publishes
/// the checkpoint, then releases — exit 128 + N for SIGTERM, SIGINT and SIGHUP, and the
/// forwarded signal is the one received. The owner is ready as soon as its child is spawned;
/// the final line says the checkpoint was published and the owner released; the event log
/// shows exactly owned → recovered → spawned → ready → signal → draining → forwarded → child
/// exited → published → released → end; CURRENT names the new checkpoint, which verifies and
/// holds what the child staged; the registry holds no entry of this owner.
#[test]
fn g4_stop_when_ready_publishes_before_release() {
    // HUP is a stop signal with `--hup stop` (the default forwards it, card T3).
    for (sig, code, name, args) in [
        (Signal::TERM, 143, "SIGTERM", vec![]),
        (Signal::INT, 130, "SIGINT", vec![]),
        (Signal::HUP, 129, "SIGHUP", vec!["--hup", "stop"]),
    ] {
        let env = Env::new();
        let trap = format!(
            r#"trap 'echo "{name} $TENURE_EPOCH" > "$TENURE_CHECKPOINT_OUT/got"; exit 0' {}
: > "$1"
read _
exit 3"#,
            &name[3..]
        );
        let armed = env.path("armed");
        let r = env.run(&args, &sh(&trap, &[armed.to_str().unwrap()]));
        env.wait_event("ready", Some(r.pid()));
        env.wait_status("phase ready", |s| s["phase"] == "ready");
        wait_armed(&armed);
        r.signal(sig);
        let f = r.wait();
        f.expect_code(code);
        // A shell waiting in its builtin `read` has no process besides itself to stop.
        assert_eq!(f.end()["descendants_stopped"], 0, "{name}: {}", f.end());
        let last = f.stderr.lines().last().unwrap_or_default();
        assert!(
            last.contains("checkpoint 1 published; released"),
            "{name}: final line: {last:?}"
        );
        let order = [
            "owned",
            "recovered",
            "spawned",
            "ready",
            "signal",
            "draining",
            "signal-forwarded",
            "child-exited",
            "checkpoint-published",
            "released",
            "end",
        ];
        assert_eq!(kinds(&env, f.pid), order, "{name}: event order");
        assert_eq!(f.end()["summary"], format!("stopped/{name}"));
        assert_eq!(f.end()["killed"], false);
        assert_eq!(env.forwarded(f.pid), [name]);
        let v = env.tool("verify", &[]);
        v.expect_code(0);
        assert!(v.stdout.contains("checkpoint 1 is valid"), "{}", v.stdout);
        let st = env.status();
        assert_eq!(st["checkpoint"]["id"], 1);
        assert_eq!(st["phase"], "released");
        assert_eq!(
            st["registry"],
            Value::Array(vec![]),
            "registry entries left"
        );
        assert_eq!(env.checkpoint_file("got"), Some(format!("{name} 1\n")));
    }
}

// Card G5: after SIGTERM the owner keeps its record (same bytes, phase draining) and the lock
/// until the supervised child has exited; contenders meanwhile get `busy`; then the runner exits
/// 143 and a successor acquires at once with the next epoch.
#[test]
fn g5_lease_outlives_the_child() {
    let env = Env::new();
    let gate = env.fifo("gate");
    let script = r#"trap 'read _ < "$1"; echo late > "$TENURE_CHECKPOINT_OUT/late"; exit 0' TERM
: > "$2"
read _
exit 3"#;
    let armed = env.path("armed");
    let r = env.run(
        &["--grace", "60"],
        &sh(script, &[gate.to_str().unwrap(), armed.to_str().unwrap()]),
    );
    let child = child_pid(&env, r.pid());
    env.wait_event("ready", Some(r.pid()));
    wait_armed(&armed);
    r.signal(Signal::TERM);
    env.wait_event("signal-forwarded", Some(r.pid()));
    // The child's trap is now blocked on the gate: it runs, so the owner must hold on.
    wait_blocked_in_fifo_open(child);
    let st = env.wait_status("phase draining", |s| s["phase"] == "draining");
    assert_eq!(st["lock_held"], true);
    let record = env.owner_bytes();
    for args in [vec!["-n"], vec!["--wait", "0.3"]] {
        let c = env.run_to_end(&args, &["true"]);
        c.expect_code(75);
        assert!(c.stderr.contains("busy"), "{}", c.stderr);
    }
    // A short window in which nothing may change: it shows the record is kept while the child
    // runs (a sleep used to prove something does NOT happen, not to synchronise).
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(
        env.owner_bytes(),
        record,
        "the owner record changed while the child ran"
    );
    assert!(alive(child));
    assert!(!env.kinds_of(r.pid()).iter().any(|k| k == "released"));
    // Further stop signals while draining are ignored: nothing more is forwarded.
    r.signal(Signal::INT);
    wait_for(
        "the SIGINT to be read",
        DEADLINE,
        || {
            (env.events()
                .iter()
                .filter(|e| e["pid"] == r.pid() && e["kind"] == "signal")
                .count()
                == 2)
                .then_some(())
        },
        || env.events_text(),
    );
    release_fifo(&gate);
    let f = r.wait();
    f.expect_code(143);
    let ks = kinds(&env, f.pid);
    before(&ks, "child-exited", "released");
    assert_eq!(
        ks.iter().filter(|k| *k == "signal-forwarded").count(),
        1,
        "only the first stop is forwarded: {ks:?}"
    );
    assert_eq!(f.end()["summary"], "stopped/SIGTERM");
    let next = env.run_to_end(&["-n"], &["true"]);
    next.expect_code(0);
    assert_eq!(next.end()["epoch"], 2);
    assert_eq!(env.checkpoint_file("late").as_deref(), Some("late\n"));
}

/// Card D1 (with G4 and G6, invariant I8): SIGTERM to a ready owner is forwarded, and a child
/// that has not stopped when the grace ends gets SIGKILL — TERM, then KILL, in that order —
/// after at least the grace; the state is cleaned only once the child really stopped: during
/// the grace the phase is draining, the lock held and the child's registry entry present, and
/// `released` comes after the child's exit. What a stopped child staged is published only if
/// it exits 0: one that dies of the forwarded signal, exits non-zero, or is SIGKILLed after the
/// grace leaves CURRENT's bytes and the store as they were, and its staged bytes reach no blob.
/// The first row (exit 0 when told) is published, so the check is seen to notice a publish.
#[test]
fn d1_a_stopped_child_is_published_only_after_exit_0() {
    let cases = [
        (
            Hostile::StagesThenExits(0),
            143,
            "stopped/SIGTERM",
            false,
            "exited 0",
            &["SIGTERM"][..],
            true,
        ),
        (
            Hostile::StagesThenDiesBySignal,
            143,
            "stopped/SIGTERM",
            false,
            "killed by signal 15",
            &["SIGTERM"][..],
            false,
        ),
        (
            Hostile::StagesThenExits(3),
            143,
            "stopped/SIGTERM",
            false,
            "exited 3",
            &["SIGTERM"][..],
            false,
        ),
        (
            Hostile::StagesThenIgnoresTerm,
            137,
            "killed/SIGKILL",
            true,
            "killed by signal 9",
            &["SIGTERM", "SIGKILL"][..],
            false,
        ),
    ];
    let grace = Duration::from_millis(1500);
    for (kind, code, summary, killed, status, forwarded, published) in cases {
        let what = format!("{kind:?}");
        let env = Env::new();
        let current = seed_checkpoint(&env);
        let store = env.checkpoint_tree();
        let fx = Fixture::new(&env, kind);
        let r = env.run(&["--grace", "1.5"], &fx.command());
        let child = child_pid(&env, r.pid());
        env.wait_event("ready", Some(r.pid()));
        fx.wait("staged");
        let signalled = Instant::now();
        r.signal(Signal::TERM);
        env.wait_event("signal-forwarded", Some(r.pid()));
        if killed {
            // Inside the grace: the runner is frozen right after it forwarded SIGTERM, so the
            // state can be read before the grace can end (a stopped process's timers cannot
            // fire); SIGCONT lets the grace run out.
            r.signal(Signal::STOP);
            wait_for(
                "the runner to stop",
                DEADLINE,
                || (proc_state(r.pid()) == Some('T')).then_some(()),
                String::new,
            );
            assert!(
                !kinds(&env, r.pid()).contains(&"killed".to_owned()),
                "{what}: the grace of 1.5 s ended before the runner could be frozen"
            );
            let st = env.status();
            assert_eq!(st["phase"], "draining", "{what}: {st}");
            assert_eq!(st["lock_held"], true, "{what}: {st}");
            let instances: Vec<&Value> = st["registry"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|e| e["kind"] == "instances")
                .collect();
            assert_eq!(
                instances.len(),
                1,
                "{what}: the child's registry entry: {st}"
            );
            assert_eq!(instances[0]["pid"], child);
            assert!(alive(child));
            r.signal(Signal::CONT);
        }
        let f = r.wait();
        f.expect_code(code);
        let end = f.end();
        assert_eq!(end["summary"], summary, "{what}: {end}");
        assert_eq!(end["killed"], killed, "{what}: {end}");
        assert_eq!(end["child"], status, "{what}: {end}");
        assert_eq!(env.forwarded(f.pid), forwarded, "{what}: TERM, then KILL");
        if killed {
            assert!(
                signalled.elapsed() >= grace,
                "{what}: the grace was not waited"
            );
            assert!(
                f.stderr.contains("did not stop within the grace period"),
                "{what}: {}",
                f.stderr
            );
            before(&kinds(&env, f.pid), "killed", "child-exited");
        }
        assert!(!alive(child), "{what}");
        let ks = kinds(&env, f.pid);
        before(&ks, "child-exited", "released");
        let st = env.status();
        assert_eq!(st["registry"], Value::Array(vec![]), "{what}");
        assert_eq!(st["owner"]["phase"], "released", "{what}");
        if published {
            assert_ne!(
                env.current_bytes().unwrap(),
                current,
                "{what}: not published"
            );
            assert!(store_holds(&env.dir, fx.staged()), "{what}");
            assert_eq!(
                env.checkpoint_file(STAGED).as_deref().map(str::as_bytes),
                Some(fx.staged()),
                "{what}"
            );
        } else {
            assert_nothing_published(&env, &current, &store, Some(fx.staged()), &what);
            assert_eq!(env.checkpoint_file("a").as_deref(), Some("one\n"), "{what}");
        }
    }
}

/// Card D4: a readiness timeout stops the child — SIGTERM, then SIGKILL for one that swallows
/// it — reports `readiness timed out`, exits 69 (a refusal keeps its code when SIGKILL was
/// needed; the end record's `killed` says whether it was) and publishes nothing of what the
/// child staged.
#[test]
fn d4_readiness_timeout_stops_the_child() {
    for (kind, forwarded, killed, status) in [
        (
            Hostile::StagesThenDiesBySignal,
            &["SIGTERM"][..],
            false,
            "killed by signal 15",
        ),
        (
            Hostile::StagesThenIgnoresTerm,
            &["SIGTERM", "SIGKILL"][..],
            true,
            "killed by signal 9",
        ),
    ] {
        let what = format!("{kind:?}");
        let env = Env::new();
        let current = seed_checkpoint(&env);
        let store = env.checkpoint_tree();
        let fx = Fixture::new(&env, kind);
        let f = env
            .run(
                &[
                    "--ready",
                    "notify",
                    "--ready-timeout",
                    "0.3",
                    "--grace",
                    "0.3",
                ],
                &fx.command(),
            )
            .wait();
        f.expect_code(69);
        assert!(f.stderr.contains("readiness timed out"), "{}", f.stderr);
        let end = f.end();
        assert_eq!(end["summary"], "refused/readiness-timed-out", "{what}");
        assert_eq!(end["reason"], "refused");
        assert_eq!(end["killed"], killed, "{what}: {end}");
        assert_eq!(end["child"], status, "{what}: {end}");
        let ks = kinds(&env, f.pid);
        before(&ks, "readiness-timed-out", "child-exited");
        assert_eq!(env.forwarded(f.pid), forwarded, "{what}");
        assert_nothing_published(&env, &current, &store, Some(fx.staged()), &what);
    }
}

/// Card D4 from the other side: a systemd-style parent. The test binds a unix datagram socket
/// and starts `tenure run --ready notify` with `NOTIFY_SOCKET` pointing at it. The child waits on
/// a FIFO the test controls before it sends its own `READY=1`; until then the owner is
/// `recovering` and nothing reaches the parent; `READY=1` reaches it after, the owner is
/// `ready`, and `STOPPING=1` follows a SIGTERM.
#[test]
fn d4_systemd_parent_hears_ready_only_after_the_child() {
    let env = Env::new();
    let sock_path = env.path("notify.sock");
    let sock = UnixDatagram::bind(&sock_path).unwrap();
    sock.set_nonblocking(true).unwrap();
    let gate = env.fifo("gate");
    let mut c = tenure();
    c.arg("run")
        .arg("--dir")
        .arg(&env.dir)
        .args(["--ready", "notify", "--"])
        .args(sh(
            r#"case "$NOTIFY_SOCKET" in @tenure/notify/*) ;; *) exit 8 ;; esac
read _ < "$1"; exec "$2" demo-child"#,
            &[gate.to_str().unwrap(), bin()],
        ))
        .env("NOTIFY_SOCKET", &sock_path);
    let r = env.start(c);
    let child = child_pid(&env, r.pid());
    wait_blocked_in_fifo_open(child);
    let st = env.status();
    assert_eq!(st["phase"], "recovering", "not ready before READY=1: {st}");
    // Nothing may arrive while the child has not notified; the short window gives a wrong
    // early READY=1 the chance to show up (a sleep proving something does NOT happen).
    std::thread::sleep(Duration::from_millis(300));
    let mut buf = [0u8; 256];
    match sock.recv(&mut buf) {
        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
        other => panic!("the parent heard something before the child was ready: {other:?}"),
    }
    let released = now_ms();
    release_fifo(&gate);
    let msg = recv_within(&sock, DEADLINE);
    assert_eq!(msg, "READY=1");
    let ready = env.wait_event("ready", Some(r.pid()));
    assert!(ready["at_ms"].as_u64().unwrap() >= released);
    env.wait_status("ready after READY=1", |s| s["phase"] == "ready");
    r.signal(Signal::TERM);
    assert_eq!(recv_within(&sock, DEADLINE), "STOPPING=1");
    let f = r.wait();
    f.expect_code(143);
    // demo-child staged counter 0 + 1 (there was no checkpoint to recover).
    assert_eq!(env.checkpoint_file("counter").as_deref(), Some("1\n"));
}

/// Card D4 (`STOPPING=1`): a notify-mode child may announce its own stop. The owner
/// then drains without signalling it: phase draining with the lock held while the child still
/// runs, `STOPPING=1` relayed to the runner's own supervisor, nothing forwarded. If the child
/// then exits 0 its staged file is published and its code passes through (`exited/0`); if a
/// stop signal comes first, it is forwarded, the child dies of it, its end passes through
/// (`exited/143`) and nothing is published.
#[test]
fn d4_child_announces_its_own_stop() {
    for signal_after in [false, true] {
        let env = Env::new();
        let current = seed_checkpoint(&env);
        let store = env.checkpoint_tree();
        let sock_path = env.path("notify.sock");
        let sock = UnixDatagram::bind(&sock_path).unwrap();
        sock.set_nonblocking(true).unwrap();
        let fx = Fixture::new(&env, Hostile::SendsStopping);
        let mut c = tenure();
        c.arg("run")
            .arg("--dir")
            .arg(&env.dir)
            .args(["--ready", "notify", "--grace", "30", "--"])
            .args(fx.command())
            .env("NOTIFY_SOCKET", &sock_path);
        let r = env.start(c);
        let child = child_pid(&env, r.pid());
        assert_eq!(recv_within(&sock, DEADLINE), "READY=1");
        env.wait_event("ready", Some(r.pid()));
        fx.open_gate();
        fx.wait("stopping-sent");
        assert_eq!(recv_within(&sock, DEADLINE), "STOPPING=1");
        let draining = env.wait_event("draining", Some(r.pid()));
        assert_eq!(draining["cause"], "child-stopping", "{draining}");
        let st = env.wait_status("draining", |s| s["phase"] == "draining");
        assert_eq!(st["lock_held"], true);
        assert!(alive(child), "the child still runs");
        assert!(env.forwarded(r.pid()).is_empty(), "nothing is forwarded");
        if signal_after {
            r.signal(Signal::TERM);
        } else {
            fx.open_gate();
        }
        let f = r.wait();
        let end = f.end();
        if signal_after {
            assert_eq!(env.forwarded(f.pid), ["SIGTERM"]);
            assert_eq!(end["child"], "killed by signal 15", "{end}");
            // The workload's own end passes through (spec/lifecycle.md, `exited/N`).
            f.expect_code(143);
            assert_eq!(end["summary"], "exited/143", "{end}");
            assert_nothing_published(
                &env,
                &current,
                &store,
                Some(fx.staged()),
                "TERM after STOPPING=1",
            );
        } else {
            f.expect_code(0);
            assert_eq!(end["summary"], "exited/0", "{end}");
            assert!(env.forwarded(f.pid).is_empty());
            assert_eq!(
                env.checkpoint_file(STAGED).as_deref().map(str::as_bytes),
                Some(fx.staged())
            );
        }
        assert_eq!(end["killed"], false, "{end}");
    }
}

/// Card D4 (readiness timeout): `STOPPING=1` from a workload that never sent `READY=1` does not
/// lift `--ready-timeout`: the run is refused at the timeout (69, `refused/readiness-timed-out`),
/// as systemd ignores `STOPPING=1` while a unit starts. It began an announced drain with no
/// timer, and the runner waited for the never-ready child forever.
#[test]
fn d4_stopping_before_ready_does_not_lift_the_readiness_timeout() {
    let env = Env::new();
    let fx = Fixture::new(&env, Hostile::StopsBeforeReady);
    let mut c = tenure();
    c.arg("run")
        .arg("--dir")
        .arg(&env.dir)
        .args([
            "--ready",
            "notify",
            "--ready-timeout",
            "3",
            "--grace",
            "30",
            "--",
        ])
        .args(fx.command());
    let r = env.start(c);
    fx.wait("stopping-sent");
    let f = r.wait();
    f.expect_code(69);
    let end = f.end();
    assert_eq!(end["summary"], "refused/readiness-timed-out", "{end}");
    assert!(
        !env.events().iter().any(|e| e["kind"] == "draining"),
        "{}",
        env.events_text()
    );
    assert_eq!(env.status()["phase"], "released");
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

fn recv_within(sock: &UnixDatagram, deadline: Duration) -> String {
    let mut buf = [0u8; 512];
    wait_for(
        "a datagram on the NOTIFY_SOCKET",
        deadline,
        || match sock.recv(&mut buf) {
            Ok(n) => Some(String::from_utf8_lossy(&buf[..n]).into_owned()),
            Err(_) => None,
        },
        String::new,
    )
}

/// Card H7 through the runner: an owner whose state dir is moved away stops with exit 65 and
/// creates nothing at the old path. When ready it drains (the child is asked to stop with
/// SIGTERM, the lease is released): `stopped/root-lost`; while recovering it refuses:
/// `refused/root-lost`, and nothing the child staged is published in the moved dir.
#[test]
fn h7_moved_root_stops_the_owner() {
    for (ready, summary) in [(true, "stopped/root-lost"), (false, "refused/root-lost")] {
        let env = Env::new();
        let current = seed_checkpoint(&env);
        let fx = Fixture::new(&env, Hostile::StagesThenExits(0));
        let args: &[&str] = if ready { &[] } else { &["--ready", "notify"] };
        let mut r = env.run(args, &fx.command());
        env.wait_event("spawned", Some(r.pid()));
        fx.wait("staged");
        let phase = if ready { "ready" } else { "recovering" };
        env.wait_status(phase, |s| s["phase"] == phase);
        let moved = env.path("moved");
        std::fs::rename(&env.dir, &moved).unwrap();
        r.log_moved_to(&moved);
        let f = r.wait();
        f.expect_code(65);
        assert!(f.stderr.contains("was moved or replaced"), "{}", f.stderr);
        assert!(!env.dir.exists(), "nothing was recreated at the old path");
        let end = f.end();
        assert_eq!(end["summary"], summary, "{end}");
        let log = read(&moved.join(".tenure/events.jsonl"));
        let ks: Vec<String> = log
            .lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .filter(|e| e["pid"] == f.pid)
            .map(|e| e["kind"].as_str().unwrap_or_default().to_owned())
            .collect();
        for k in ["root-lost", "signal-forwarded", "child-exited", "end"] {
            assert!(ks.iter().any(|x| x == k), "no `{k}` in {ks:?}");
        }
        assert_eq!(ks.contains(&"released".to_owned()), ready, "{ks:?}");
        let cur = std::fs::read(moved.join("checkpoints/CURRENT")).unwrap();
        if ready {
            assert_ne!(
                cur, current,
                "a drained owner publishes what its child left"
            );
        } else {
            assert_eq!(cur, current, "a refused owner publishes nothing");
            assert!(!store_holds(&moved, fx.staged()));
        }
    }
}

/// Card R1, deterministic race: the runner is frozen (SIGSTOP) while its child exits by itself
/// and a SIGTERM arrives; on SIGCONT both are pending at once. The child's end wins: it is never
/// signalled, its exit code passes through, and the run has exactly one `end` record.
#[test]
fn r1_exited_child_is_never_signalled_when_stop_races() {
    let env = Env::new();
    let mut r = env.run(&[], &sh("read _; exit 5", &[]));
    let child = child_pid(&env, r.pid());
    env.wait_event("ready", Some(r.pid()));
    r.signal(Signal::STOP);
    wait_for(
        "the runner to stop",
        DEADLINE,
        || (proc_state(r.pid()) == Some('T')).then_some(()),
        String::new,
    );
    r.close_stdin();
    // The child has exited but its frozen parent has not reaped it yet.
    wait_for(
        "the child to become a zombie",
        DEADLINE,
        || (proc_state(child) == Some('Z')).then_some(()),
        String::new,
    );
    r.signal(Signal::TERM);
    r.signal(Signal::CONT);
    let f = r.wait();
    f.expect_code(5);
    assert_eq!(f.end()["reason"], "exited");
    assert_eq!(f.end()["summary"], "exited/5");
    let ks = kinds(&env, f.pid);
    assert!(!ks.iter().any(|k| k == "signal-forwarded"), "{ks:?}");
    assert_eq!(ks.iter().filter(|k| *k == "end").count(), 1);
}

/// Card R1, loose race: the stop and the child's own exit are sent back to back, several times.
/// Whatever the interleaving, a child is never signalled after its exit was seen, and every run
/// has exactly one `end` line with reason, code and signal.
#[test]
fn r1_stop_racing_exit_many_times() {
    let env = Env::new();
    for i in 0..6 {
        let mut r = env.run(&[], &sh("read _; exit 0", &[]));
        env.wait_event("ready", Some(r.pid()));
        if i % 2 == 0 {
            r.close_stdin();
            r.signal(Signal::TERM);
        } else {
            r.signal(Signal::TERM);
            r.close_stdin();
        }
        let f = r.wait();
        let lines: Vec<Value> = env
            .events()
            .into_iter()
            .filter(|e| e["pid"] == f.pid)
            .collect();
        let exited = lines.iter().position(|e| e["kind"] == "child-exited");
        let exited = exited.expect("the child's exit is recorded");
        assert!(
            !lines[exited..]
                .iter()
                .any(|e| e["kind"] == "signal-forwarded"),
            "signalled after its exit: {lines:?}"
        );
        let end = f.end();
        assert!(
            matches!(
                end["summary"].as_str(),
                Some("exited/0" | "stopped/SIGTERM")
            ),
            "{end}"
        );
    }
}

/// Exit codes pass through like flock(1): a child killed by someone else's SIGKILL makes the
/// runner exit 137 with `exited/137` (not `killed`: the runner did not kill it), and nothing is
/// published.
#[test]
fn child_killed_from_outside_passes_its_status_through() {
    let env = Env::new();
    let r = env.run(
        &[],
        &sh(r#"echo x > "$TENURE_CHECKPOINT_OUT/x"; read _"#, &[]),
    );
    let child = child_pid(&env, r.pid());
    env.wait_event("ready", Some(r.pid()));
    send(child, Signal::KILL);
    let f = r.wait();
    f.expect_code(137);
    assert_eq!(f.end()["summary"], "exited/137");
    assert_eq!(f.end()["killed"], false);
    assert!(
        env.current_bytes().is_none(),
        "a failed child's files are not published"
    );
}

/// Invariant I3 (card H5) through the runner: a publish naming a stale epoch is rejected without
/// effect. While a ready owner of epoch 1 runs, the dir's persisted epoch is moved to 9 behind
/// its back (standing in for a successor that can only exist if the lock was lost); on SIGTERM
/// the child's files are not published: the run ends `publish-failed` (74), CURRENT keeps its
/// bytes, and the lease is still released.
#[test]
fn i3_publish_with_a_stale_epoch_is_rejected() {
    let env = Env::new();
    let current = seed_checkpoint(&env);
    let r = env.run(&[], &sh(TERM_CHILD, &[]));
    env.wait_event("ready", Some(r.pid()));
    env.wait_child_traps_term(r.pid());
    write_private(&env.dir.join(".tenure/epoch"), b"9\n");
    r.signal(Signal::TERM);
    let f = r.wait();
    f.expect_code(74);
    assert_eq!(f.end()["reason"], "publish-failed");
    assert!(
        f.stderr.contains("CURRENT is unchanged (checkpoint 1)"),
        "{}",
        f.stderr
    );
    assert_eq!(env.current_bytes().unwrap(), current);
    assert!(env.kinds_of(f.pid).contains(&"released".to_owned()));
    env.tool("verify", &[]).expect_code(0);
}

/// The hostile-children harness itself (tests/common/hostile.rs): the grandchild fixture is a
/// real process whose parent is the supervised child, it reports itself, and it never outlives
/// its fixture (dropping the fixture SIGKILLs it if nothing else stopped it). Card T1: the
/// runner stops the grandchild with the child — the stop signal reaches the whole tree; one
/// that swallows it is SIGKILLed after the grace, and then nothing is published.
#[test]
fn hostile_grandchild_fixture_is_real_and_never_leaks() {
    for (setsid, ignores_term) in [(false, false), (true, true)] {
        let env = Env::new();
        let fx = Fixture::new(
            &env,
            Hostile::ForksGrandchild {
                setsid,
                ignores_term,
            },
        );
        let r = env.run(&["--grace", "0.5"], &fx.command());
        let child = child_pid(&env, r.pid());
        assert_eq!(fx.pid(), child, "the fixture is the runner's child");
        let g = fx.grandchild();
        let stat = std::fs::read_to_string(format!("/proc/{g}/stat")).unwrap();
        let fields: Vec<&str> = stat[stat.rfind(')').unwrap() + 2..].split(' ').collect();
        assert_eq!(
            fields[1],
            child.to_string(),
            "the grandchild's parent is the child"
        );
        let (pgid, sid) = (fields[2], fields[3]);
        assert_eq!(
            pgid == g.to_string() && sid == g.to_string(),
            setsid,
            "setsid={setsid}: pgid {pgid}, sid {sid}"
        );
        env.wait_event("ready", Some(r.pid()));
        r.signal(Signal::TERM);
        let f = r.wait();
        assert!(!alive(g), "card T1: the grandchild outlived the run");
        assert_eq!(f.end()["descendants_stopped"], 1, "{}", f.end());
        if ignores_term {
            f.expect_code(137);
            assert_eq!(f.end()["summary"], "killed/SIGKILL");
            assert!(
                !store_holds(&env.dir, fx.staged()),
                "a killed tree publishes nothing"
            );
        } else {
            f.expect_code(143);
            assert_eq!(
                env.checkpoint_file(STAGED).as_deref(),
                Some(std::str::from_utf8(fx.staged()).unwrap())
            );
        }
        drop(fx);
        wait_for(
            "the grandchild to be gone",
            DEADLINE,
            || (!alive(g)).then_some(()),
            String::new,
        );
    }
}

/// Waits until a child script has installed its trap: it creates `armed` right after. Ready
/// (the exec) comes before the shell reads its script, and a stop sent before the trap is
/// installed kills the shell instead of running the trap.
fn wait_armed(armed: &std::path::Path) {
    wait_for(
        "the child's trap to be installed",
        DEADLINE,
        || armed.exists().then_some(()),
        || format!("{} not created", armed.display()),
    );
}

/// Cards G4 and D5: a stderr nobody reads never stops the stop. The runner's stderr is a pipe
/// the test does not read, and the pipe fills in two ways: (a) the child writes 200,000 bytes to
/// its stderr, which the runner relays (three times what the pipe holds), and waits; (b) the
/// child writes to its stdout, which is the same pipe (`2>&1 |`), until it is full and the child
/// blocks. SIGTERM still reaches the child, and the owner drains and releases while the pipe
/// stays full. (The runner used to block in `write` — on the relay, or on its own `draining`
/// line — and a blocked runner handled no signal: nothing was forwarded, no grace ran out.) Once
/// the test reads the pipe, the runner exits 143, and nothing it or the child wrote is lost:
/// every relayed byte, in order before the runner's own `released` line.
#[test]
fn g4_a_stderr_nobody_reads_never_stops_the_stop() {
    use std::io::Read;
    for shared_stdout in [false, true] {
        let what = if shared_stdout {
            "the child's stdout fills the pipe"
        } else {
            "the relayed stderr fills the pipe"
        };
        let env = Env::new();
        let (read_end, write_end) =
            rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC).expect("pipe");
        let written = env.path("written");
        let script = if shared_stdout {
            r#"exec head -c 200000 /dev/zero"#
        } else {
            r#"head -c 200000 /dev/zero | tr '\0' x >&2; : > "$1"; exec sleep 600"#
        };
        let mut c = tenure();
        c.arg("run")
            .arg("--dir")
            .arg(&env.dir)
            .arg("--")
            .args(sh(script, &[written.to_str().unwrap()]))
            .stdin(std::process::Stdio::null())
            .stderr(std::process::Stdio::from(
                write_end.try_clone().expect("dup the write end"),
            ));
        if shared_stdout {
            c.stdout(std::process::Stdio::from(write_end));
        } else {
            c.stdout(std::process::Stdio::null());
            drop(write_end);
        }
        let mut runner = c.spawn().expect("spawn tenure");
        // The command keeps no copy of the write end: the runner (and its child) hold them.
        drop(c);
        let pid = runner.id();
        if shared_stdout {
            env.wait_event("ready", Some(pid));
            wait_for(
                "the child's stdout to fill the pipe",
                DEADLINE,
                || {
                    (rustix::io::ioctl_fionread(&read_end).expect("FIONREAD") >= 60 * 1024)
                        .then_some(())
                },
                String::new,
            );
        } else {
            wait_for(
                "the child to have written its stderr",
                DEADLINE,
                || written.exists().then_some(()),
                || format!("{what}: events so far:\n{}", env.events_text()),
            );
        }
        rustix::process::kill_process(
            rustix::process::Pid::from_raw(pid as i32).unwrap(),
            Signal::TERM,
        )
        .expect("SIGTERM to the runner");
        // The whole stop while nobody reads stderr: forwarded, drained, released.
        env.wait_event("released", Some(pid));
        let ks = kinds(&env, pid);
        before(&ks, "draining", "released");
        let reader = std::thread::spawn(move || {
            let mut out = Vec::new();
            std::fs::File::from(read_end)
                .read_to_end(&mut out)
                .expect("read the runner's stderr");
            out
        });
        let status = wait_for(
            "the runner to exit once its stderr is read",
            DEADLINE,
            || runner.try_wait().expect("try_wait"),
            String::new,
        );
        let out = reader.join().expect("the reader thread");
        let text = String::from_utf8_lossy(&out);
        assert_eq!(
            status.code(),
            Some(143),
            "{what}: {}",
            text.replace('\0', "")
        );
        assert!(text.contains("tenure: draining"), "{what}: {text}");
        assert!(text.contains("tenure: released"), "{what}: {text}");
        if !shared_stdout {
            // One run of the child's bytes, whole (the runner's own lines, with their random
            // temp dir names, may hold an `x` too).
            let xs = text.split(|c| c != 'x').map(str::len).max().unwrap_or(0);
            assert_eq!(xs, 200_000, "the relayed stderr lost bytes: {xs} of 200000");
            let run_end = text.find(&"x".repeat(200_000)).unwrap() + 200_000;
            let released_line = text.find("tenure: released").unwrap();
            assert!(
                run_end <= released_line,
                "out of order:\n{}",
                &text[run_end..]
            );
        }
    }
}

/// Card G4 for a stopped workload (`kill -STOP`, a terminal's ^Z): it still stops in order,
/// the stop signal followed by SIGCONT, as systemd does, so a stopped child runs its TERM
/// handler (here it
/// writes its output and exits 0: published, `stopped/SIGTERM`) instead of sitting on the
/// pending TERM until SIGKILL ends it after the grace (`killed/SIGKILL`, nothing published).
/// A HUP forwarded while ready (`--hup forward`, a reload) does not continue it.
#[test]
fn g4_a_stopped_workload_is_continued_after_the_stop_signal() {
    let env = Env::new();
    let pidfile = env.path("child.pid");
    let script = r#"trap 'echo reload >> "$2"' HUP
trap 'echo done > "$TENURE_CHECKPOINT_OUT/out"; exit 0' TERM
echo $$ > "$1"
kill -STOP $$
while :; do sleep 0.05; done"#;
    let r = env.run(
        &["--grace", "60", "--hup", "forward"],
        &sh(
            script,
            &[
                pidfile.to_str().unwrap(),
                env.path("reloads").to_str().unwrap(),
            ],
        ),
    );
    let child: u32 = wait_for(
        "the child's pid",
        DEADLINE,
        || std::fs::read_to_string(&pidfile).ok()?.trim().parse().ok(),
        String::new,
    );
    let stopped = || {
        wait_for(
            "the child to be stopped",
            DEADLINE,
            || (proc_state(child) == Some('T')).then_some(()),
            || format!("{:?}", proc_state(child)),
        )
    };
    stopped();
    // A reload asked of a stopped workload leaves it stopped.
    r.signal(Signal::HUP);
    wait_for(
        "the forwarded HUP",
        DEADLINE,
        || {
            env.events()
                .iter()
                .any(|e| e["kind"] == "signal-forwarded" && e["signal"] == "SIGHUP")
                .then_some(())
        },
        || env.events_text(),
    );
    assert_eq!(proc_state(child), Some('T'), "a reload continued the child");
    r.signal(Signal::TERM);
    let f = r.wait();
    f.expect_code(143);
    assert_eq!(f.end()["summary"], "stopped/SIGTERM", "{}", f.stderr);
    assert_eq!(f.end()["killed"], false, "{}", f.stderr);
    assert_eq!(env.checkpoint_file("out").as_deref(), Some("done\n"));
}

//! Lease and contention through the built `tenure` binary (cards L1–L5, L8–L10, H6): several
//! real runner processes on real state dirs, real SIGTERM/SIGINT/SIGKILL.

mod common;

use common::*;
use rustix::process::Signal;
use serde_json::Value;
use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The pids listed as waiters by a status snapshot.
fn waiter_pids(st: &Value) -> Vec<u64> {
    st["waiters"]
        .as_array()
        .map(|w| w.iter().filter_map(|x| x["pid"].as_u64()).collect())
        .unwrap_or_default()
}

/// Starts an owner whose child stages `stopped` on SIGTERM, and waits until it is ready.
fn ready_owner(env: &Env) -> Running {
    let r = env.run(&[], &sh(TERM_CHILD, &[]));
    env.wait_event("ready", Some(r.pid()));
    env.wait_status("phase ready", |s| s["phase"] == "ready");
    env.wait_child_traps_term(r.pid());
    r
}

/// Card L1: two runs start at once on an empty dir. Exactly one owns; the other is visibly a
/// waiter (a `waiting` line written while it waits, an entry in `status`); it owns only after
/// the first released. Both succeed; the second starts from the first's checkpoint; a later
/// run that changes nothing (nothing staged, or the same files again) leaves the checkpoint
/// store's bytes unchanged. Invariant I1: at most one owner at any moment.
#[test]
fn l1_serialised_first_start() {
    let env = Env::new();
    let seen = env.path("seen");
    let cmd = sh(COUNTER_CHILD, &[seen.to_str().unwrap()]);
    let a = env.run(&[], &cmd);
    let b = env.run(&[], &cmd);
    let owned = env.wait_event("owned", None);
    let (mut first, mut second) = if owned["pid"] == a.pid() {
        (a, b)
    } else {
        (b, a)
    };
    // The waiter says so while it waits, not afterwards.
    let waiting = env.wait_event("waiting", Some(second.pid()));
    // Started at the same moment, the waiter may find the lock held before the owner record
    // is written: then it names no owner yet.
    assert!(
        waiting["owner_pid"] == first.pid() || waiting["owner_pid"].is_null(),
        "{waiting}"
    );
    let st = env.wait_status("the second run as a waiter", |s| {
        waiter_pids(s) == [u64::from(second.pid())]
    });
    assert_eq!(st["owner"]["pid"], first.pid());
    assert!(second.running());
    let owners: Vec<Value> = env
        .events()
        .into_iter()
        .filter(|e| e["kind"] == "owned")
        .collect();
    assert_eq!(owners.len(), 1, "exactly one owns: {owners:?}");

    first.say("go");
    let f1 = first.wait();
    f1.expect_code(0);
    let published = env.wait_event("checkpoint-published", Some(f1.pid));
    env.wait_event("released", Some(f1.pid));
    let owned2 = env.wait_event("owned", Some(second.pid()));
    let at = |e: &Value| {
        e["at_ms"]
            .as_u64()
            .unwrap_or_else(|| panic!("no at_ms in {e}"))
    };
    // The first logs `released` once its release returned, after the unlock, so a fast
    // handoff may let the second log `owned` first (issue 11); what the first logs while it
    // still holds the lock — its publish — comes before the second owns.
    assert!(
        at(&owned2) >= at(&published),
        "the second owned before the first published: {owned2} {published}"
    );
    assert_eq!(owned2["epoch"], 2);
    second.say("go");
    second.wait().expect_code(0);
    assert_eq!(
        read(&seen),
        "1 0\n2 1\n",
        "the second run starts from the first's"
    );
    assert_eq!(env.checkpoint_file("counter").as_deref(), Some("2\n"));

    // A run that stages nothing, and one that stages the same file again, change nothing.
    for script in [
        "true",
        r#"cat "$TENURE_CHECKPOINT/counter" > "$TENURE_CHECKPOINT_OUT/counter""#,
    ] {
        let store = env.checkpoint_tree();
        let f = env.run_to_end(&["-n"], &sh(script, &[]));
        f.expect_code(0);
        assert!(
            env.kinds_of(f.pid)
                .contains(&"checkpoint-unchanged".to_owned()),
            "{:?}",
            env.kinds_of(f.pid)
        );
        assert_same_tree(&store, &env.checkpoint_tree());
    }
}

/// Card L2: `--wait 1` against a live owner exits non-zero (75) after about the bound with
/// `busy` and `lock and state were preserved`; the owner record's bytes are unchanged and the
/// owner keeps running; `-n` is busy at once; `-E` changes the code. Invariant I5: the loser
/// leaves no waiter entry behind.
#[test]
fn l2_bounded_loser() {
    let env = Env::new();
    let mut owner = ready_owner(&env);
    let record = env.owner_bytes();
    let t = Instant::now();
    let c = env.run_to_end(&["--wait", "1"], &["true"]);
    c.expect_code(75);
    assert!(
        t.elapsed() >= Duration::from_secs(1),
        "it did not wait the bound"
    );
    assert!(c.stderr.contains("busy"), "{}", c.stderr);
    assert!(
        c.stderr.contains("lock and state were preserved"),
        "{}",
        c.stderr
    );
    assert_eq!(c.end()["summary"], "busy/75");
    assert_eq!(env.kinds_of(c.pid), ["waiting", "busy", "end"]);
    assert_eq!(env.owner_bytes(), record, "the owner record changed");
    assert!(owner.running(), "the owner stopped");
    let st = env.status();
    assert_eq!(st["phase"], "ready");
    assert_eq!(st["owner"]["pid"], owner.pid());
    assert!(
        waiter_pids(&st).is_empty(),
        "the loser left its waiter entry"
    );

    let n = env.run_to_end(&["-n"], &["true"]);
    n.expect_code(75);
    assert!(
        n.stderr.contains("lock and state were preserved"),
        "{}",
        n.stderr
    );
    env.run_to_end(&["-n", "-E", "3"], &["true"]).expect_code(3);
    assert_eq!(env.owner_bytes(), record);

    owner.signal(Signal::TERM);
    owner.wait().expect_code(143);
}

/// Card L3: SIGTERM (or SIGINT) to a waiting contender: it exits 143 (130); the owner and its
/// record are untouched and the waiter entry is gone (invariant I5).
#[test]
fn l3_interrupted_waiter() {
    let env = Env::new();
    let mut owner = ready_owner(&env);
    let record = env.owner_bytes();
    for (sig, code, name) in [(Signal::TERM, 143, "SIGTERM"), (Signal::INT, 130, "SIGINT")] {
        let c = env.run(&[], &["true"]);
        env.wait_event("waiting", Some(c.pid()));
        env.wait_status("a waiter", |s| waiter_pids(s) == [u64::from(c.pid())]);
        c.signal(sig);
        let f = c.wait();
        f.expect_code(code);
        assert_eq!(f.end()["summary"], format!("cancelled/{name}"));
        assert_eq!(env.owner_bytes(), record, "the owner record changed");
        assert!(owner.running());
        let st = env.status();
        assert!(waiter_pids(&st).is_empty(), "waiter entry left: {st}");
        assert_eq!(st["owner"]["pid"], owner.pid());
        assert_eq!(st["phase"], "ready");
    }
    owner.signal(Signal::TERM);
    owner.wait().expect_code(143);
}

/// Card L4: two state dirs never share a lease: both owners are ready at the same time.
#[test]
fn l4_independent_dirs() {
    let (e1, e2) = (Env::new(), Env::new());
    let r1 = e1.run(&[], &sh(TERM_CHILD, &[]));
    let r2 = e2.run(&[], &sh(TERM_CHILD, &[]));
    e1.wait_status("dir 1 ready", |s| s["phase"] == "ready");
    e2.wait_status("dir 2 ready", |s| s["phase"] == "ready");
    e1.wait_child_traps_term(r1.pid());
    e2.wait_child_traps_term(r2.pid());
    // Both at once: dir 1 is still owned while dir 2 is.
    let (s1, s2) = (e1.status(), e2.status());
    assert_eq!(
        (&s1["phase"], &s2["phase"]),
        (&"ready".into(), &"ready".into())
    );
    assert_eq!(s1["owner"]["pid"], r1.pid());
    assert_eq!(s2["owner"]["pid"], r2.pid());
    assert_eq!((&s1["epoch"], &s2["epoch"]), (&1.into(), &1.into()));
    r1.signal(Signal::TERM);
    r2.signal(Signal::TERM);
    r1.wait().expect_code(143);
    r2.wait().expect_code(143);
}

/// Card L5: an owner killed with SIGKILL leaves its record (status: stale) and writes no end
/// record (its trace stops in `ready`); its child dies with it; a contender that was waiting
/// meanwhile owns at once with a higher epoch (invariant I2) and sweeps the dead owner's
/// registry entries; a later run that tries once (`-n`) owns at once too.
#[test]
fn l5_crash_takeover() {
    let env = Env::new();
    let owner = ready_owner(&env);
    let child = env.wait_event("spawned", Some(owner.pid()))["child_pid"]
        .as_u64()
        .unwrap() as u32;
    let mut next = env.run(&[], &["true"]);
    env.wait_event("waiting", Some(next.pid()));
    let record = env.owner_bytes();
    owner.signal(Signal::KILL);
    let f = owner.wait();
    assert_eq!(
        std::os::unix::process::ExitStatusExt::signal(&f.status),
        Some(9)
    );
    assert!(f.end.is_none(), "a SIGKILLed run cannot write its end");
    let dead = f.trace.as_ref().expect("the owner's trace");
    assert_eq!(dead.outcome, None, "a killed owner never reached exit");
    assert_eq!(dead.final_phase, "ready");
    wait_for(
        "the orphaned child to die (parent-death signal)",
        DEADLINE,
        || (!alive(child)).then_some(()),
        String::new,
    );
    // The waiter takes over by itself: the kernel hands it the lock.
    let owned = env.wait_event("owned", Some(next.pid()));
    assert_eq!(owned["epoch"], 2);
    next.close_stdin();
    let n = next.wait();
    n.expect_code(0);
    assert_eq!(n.end()["epoch"], 2);
    assert_ne!(env.owner_bytes(), record, "the record was replaced");
    let st = env.status();
    assert_eq!(
        st["registry"],
        Value::Array(vec![]),
        "the dead owner's entries were swept"
    );
    assert_eq!(st["owner"]["epoch"], 2);

    // The same from a stale record, with no waiter: a try-once run owns at once.
    let owner = ready_owner(&env);
    owner.signal(Signal::KILL);
    owner.wait();
    let st = env.status();
    assert_eq!(st["phase"], "stale");
    assert_eq!(st["lock_held"], false);
    assert_eq!(st["owner"]["liveness"], "dead");
    let next = env.run_to_end(&["-n"], &["true"]);
    next.expect_code(0);
    assert_eq!(next.end()["epoch"], 4);
}

/// Card L5 (recycled pid): an owner record naming a live, unrelated process (a `sleep` with
/// another start time, or the same start time and another executable) counts as dead: status
/// shows it stale / recycled, a contender owns at once, and the unrelated process is never
/// signalled (neither by the takeover nor by `tenure stop`): invariant I4.
#[test]
fn l5_recycled_pid_counts_as_dead_and_is_never_signalled() {
    let env = Env::new();
    env.run_to_end(&[], &["true"]).expect_code(0);
    let mut sleeper = Command::new("sleep")
        .arg("300")
        .stdin(Stdio::null())
        .spawn()
        .unwrap();
    let pid = sleeper.id();
    for (start_delta, exe) in [(1u64, "/usr/bin/sleep"), (0, "/usr/bin/not-sleep")] {
        let mut rec: Value = serde_json::to_value(env.owner_record()).unwrap();
        rec["phase"] = "ready".into();
        rec["identity"] = serde_json::json!({
            "pid": pid,
            "start_time": start_time(pid) + start_delta,
            "exe": exe,
        });
        write_private(
            &env.dir.join(".tenure/owner.json"),
            serde_json::to_string(&rec).unwrap().as_bytes(),
        );
        let st = env.status();
        assert_eq!(st["owner"]["liveness"], "recycled", "{st}");
        assert_eq!(st["phase"], "stale");
        let stop = env.tool("stop", &["--grace", "1"]);
        stop.expect_code(0);
        assert!(
            stop.stdout.contains("nothing was signalled"),
            "{}",
            stop.stdout
        );
        let before = env.status()["epoch"].as_u64().unwrap();
        let next = env.run_to_end(&["-n"], &["true"]);
        next.expect_code(0);
        assert_eq!(next.end()["epoch"], before + 1);
        assert!(alive(pid), "the unrelated process was signalled");
        assert!(sleeper.try_wait().unwrap().is_none());
    }
    sleeper.kill().unwrap();
    sleeper.wait().unwrap();
}

/// Trace paths that must be refused: a hard link to a file standing in for a state record
/// (holding `keep me`), and a FIFO. Returns the record, the link and the FIFO.
fn trace_traps(env: &Env) -> (PathBuf, PathBuf, PathBuf) {
    let record = env.tmp.path().join("record");
    fs::write(&record, "keep me\n").unwrap();
    let link = env.tmp.path().join("trace-link");
    fs::hard_link(&record, &link).unwrap();
    let fifo = env.tmp.path().join("trace-fifo");
    mkfifo(&fifo);
    (record, link, fifo)
}

/// Bad input loses nothing: a `--trace` path that is a hard link (here to a file standing in
/// for a state record) or a FIFO is refused before anything is written or waited on, and the
/// file behind the link keeps its bytes (the trace was opened with `O_TRUNC`, which emptied it).
#[test]
fn a_trace_path_that_is_a_hard_link_or_a_fifo_is_refused_untouched() {
    let env = Env::new();
    let (record, link, fifo) = trace_traps(&env);
    for (trace, why) in [(&link, "hard links"), (&fifo, "not a regular file")] {
        let out = tenure()
            .arg("run")
            .arg("--dir")
            .arg(&env.dir)
            .arg("--trace")
            .arg(trace)
            .args(["--", "true"])
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_ne!(out.status.code(), Some(0), "{stderr}");
        assert!(stderr.contains(why), "{stderr}");
        assert!(stderr.contains("as the trace file"), "{stderr}");
    }
    assert_eq!(fs::read_to_string(&record).unwrap(), "keep me\n");
    assert!(!env.dir.exists(), "nothing of the state dir was made");
}

/// Bad input leaves nothing behind: a `--trace` path that cannot be the trace file (its
/// directory does not exist, it is a hard link, a FIFO) fails `run` and `up` with a message
/// naming the path, and neither creates the state dir. `up` used to make the dir and its
/// `.tenure/` records (the election, `up.log`, the event log) before the owner it launched
/// refused the path.
#[test]
fn a_trace_path_that_cannot_be_opened_leaves_no_state_dir() {
    let env = Env::new();
    let missing = env.tmp.path().join("no-such-dir").join("trace.jsonl");
    let (_record, link, fifo) = trace_traps(&env);
    let around = snapshot(env.tmp.path());
    for sub in ["up", "run"] {
        for trace in [&missing, &link, &fifo] {
            let out = tenure()
                .arg(sub)
                .arg("--dir")
                .arg(&env.dir)
                .args(["--wait", "20", "--trace"])
                .arg(trace)
                .args(["--", "sleep", "100"])
                .output()
                .unwrap();
            let stderr = String::from_utf8_lossy(&out.stderr);
            let stdout = String::from_utf8_lossy(&out.stdout);
            assert!(
                !env.dir.exists(),
                "{sub} --trace {trace:?} made the state dir: {stderr}"
            );
            assert_eq!(out.status.code(), Some(74), "{sub} {trace:?}: {stderr}");
            assert!(
                stderr.contains(&format!("cannot use {} as the trace file", trace.display())),
                "{sub} {trace:?}: {stderr}"
            );
            if sub == "up" {
                let report: Value = serde_json::from_str(stdout.trim()).unwrap();
                assert_eq!(report["error"], "spawn_failed", "{report}");
                assert_eq!(report["launches"], 0, "{report}");
            }
        }
    }
    // Nothing beside the dir changed either: no trace file was left where none was.
    assert_same_tree(&around, &snapshot(env.tmp.path()));

    // The check lets a trace path that can be the trace file through: a new file (the check
    // makes and removes it; the owner makes it again) and one that exists (its content is the
    // owner's to replace).
    let existing = env.tmp.path().join("old-trace.jsonl");
    fs::write(&existing, "an earlier trace\n").unwrap();
    for trace in [env.tmp.path().join("new-trace.jsonl"), existing] {
        let f = env.tool(
            "up",
            &[
                "--wait",
                "20",
                "--trace",
                trace.to_str().unwrap(),
                "--",
                "sleep",
                "1000",
            ],
        );
        f.expect_code(0);
        env.tool("stop", &[]).expect_code(0);
        let text = fs::read_to_string(&trace).unwrap();
        assert!(
            text.contains("\"released\"") && !text.contains("an earlier trace"),
            "{}: {text}",
            trace.display()
        );
    }
}

/// Card H6: negative, zero (where it makes no sense), non-numeric, infinite and contradictory
/// options exit 64 before anything on disk changes: the state dir is not even created.
#[test]
fn h6_bad_durations_are_usage_errors_before_any_disk_change() {
    let env = Env::new();
    let around = snapshot(env.tmp.path());
    let run_cases: &[&[&str]] = &[
        &["--wait", "-1"],
        &["--wait", "abc"],
        &["--wait", "nan"],
        &["--wait", "inf"],
        &["--wait", "1e999"],
        &["--wait", ""],
        &["--wait", "1", "-n"],
        &["--grace", "0"],
        &["--grace", "-5"],
        &["--grace", "0ms"],
        &["--kill-wait", "0"],
        &["--ready", "notify", "--ready-timeout", "0"],
        &["--ready-timeout", "5"],
        &["--ready", "maybe"],
        &["--keep", "0"],
        &["--env-allow", "1BAD"],
        &["-E", "256"],
        &["--no-such-option"],
    ];
    for sub in ["run", "up"] {
        for case in run_cases {
            let out = tenure()
                .arg(sub)
                .arg("--dir")
                .arg(&env.dir)
                .args(*case)
                .args(["--", "true"])
                .output()
                .unwrap();
            let err = String::from_utf8_lossy(&out.stderr);
            assert_eq!(out.status.code(), Some(64), "{sub} {case:?}: {err}");
            assert!(err.contains("tenure --help"), "{sub} {case:?}: {err}");
            assert!(!env.dir.exists(), "{sub} {case:?} created the state dir");
        }
    }
    for (sub, case) in [
        ("stop", &["--grace", "0"][..]),
        ("stop", &["--grace", "-1"][..]),
        ("run", &[][..]),
    ] {
        let out = tenure()
            .arg(sub)
            .arg("--dir")
            .arg(&env.dir)
            .args(case)
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(64), "{sub} {case:?}");
    }
    // A trace inside the state dir would make the dir foreign: refused before it is written.
    let inside = env.dir.join("trace.jsonl");
    let out = tenure()
        .arg("run")
        .arg("--dir")
        .arg(&env.dir)
        .arg("--trace")
        .arg(&inside)
        .args(["--", "true"])
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(64),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!env.dir.exists());
    assert_same_tree(&around, &snapshot(env.tmp.path()));
    // The same options with sensible values are accepted (the checks are not blanket refusals).
    env.run_to_end(
        &["--wait", "0", "--grace", "500ms", "--kill-wait", "1"],
        &["true"],
    )
    .expect_code(0);
}

/// Runs `tenure run -n -- true` on a dir that must be refused: exit 65, the message contains
/// `needle`, no panic, and the tree is byte-for-byte what it was (modes and bytes).
fn assert_refused_unchanged(env: &Env, needle: &str) -> Finished {
    let before = snapshot(&env.dir);
    let f = env.run_to_end(&["-n"], &["true"]);
    f.expect_code(65);
    assert!(
        f.stderr.contains(needle),
        "expected {needle:?} in: {}",
        f.stderr
    );
    assert!(!f.stderr.contains("panicked"), "{}", f.stderr);
    assert_same_tree(&before, &snapshot(&env.dir));
    f
}

/// Card L8: foreign state is refused, not repaired: (a) files but no identity marker, (b) an
/// unreadable marker, (c) a marker naming another root (a copied dir). Exit 65, the tree
/// byte-for-byte unchanged (invariant I14); `init --adopt` is the explicit way past (a) and (c).
#[test]
fn l8_foreign_state_refused_not_repaired() {
    // (a) derived state, no identity.
    let env = Env::new();
    fs::create_dir(&env.dir).unwrap();
    fs::set_permissions(&env.dir, fs::Permissions::from_mode(0o700)).unwrap();
    write_private(&env.dir.join("data.txt"), b"precious\n");
    assert_refused_unchanged(&env, "derived state but no identity");
    env.tool("init", &["--adopt"]).expect_code(0);
    env.run_to_end(&["-n"], &["true"]).expect_code(0);
    assert_eq!(read(&env.dir.join("data.txt")), "precious\n");

    // (b) an unreadable marker.
    let env = Env::new();
    env.run_to_end(&[], &["true"]).expect_code(0);
    write_private(&env.dir.join(".tenure/identity.json"), b"{not-json");
    assert_refused_unchanged(&env, "identity is unreadable");

    // (c) a copy of a valid dir: its marker names the original root.
    let env = Env::new();
    env.run_to_end(&[], &sh(r#"echo x > "$TENURE_CHECKPOINT_OUT/x""#, &[]))
        .expect_code(0);
    let copy = Env::new();
    let st = Command::new("cp")
        .arg("-a")
        .arg(&env.dir)
        .arg(&copy.dir)
        .status()
        .unwrap();
    assert!(st.success());
    assert_refused_unchanged(&copy, "identity mismatch");
    copy.tool("init", &["--adopt"]).expect_code(0);
    let f = copy.run_to_end(&["-n"], &["true"]);
    f.expect_code(0);
    assert_eq!(f.end()["epoch"], 2);
    assert_eq!(copy.checkpoint_file("x").as_deref(), Some("x\n"));
}

/// An entry's inode, modification and change times (seconds, nanoseconds) and bytes.
type Stamp = (u64, i64, i64, i64, i64, Option<Vec<u8>>);

/// Every entry under `root` with its inode, modification and change times and bytes: equal
/// snapshots mean nothing was rewritten, replaced, created or removed.
fn inodes(root: &Path) -> BTreeMap<PathBuf, Stamp> {
    use std::os::unix::fs::MetadataExt;
    let mut out = BTreeMap::new();
    let mut todo = vec![root.to_path_buf()];
    while let Some(p) = todo.pop() {
        let m = fs::symlink_metadata(&p).unwrap();
        let bytes = m.is_file().then(|| fs::read(&p).unwrap());
        if m.is_dir() {
            todo.extend(fs::read_dir(&p).unwrap().map(|e| e.unwrap().path()));
        }
        let key = (
            m.ino(),
            m.mtime(),
            m.mtime_nsec(),
            m.ctime(),
            m.ctime_nsec(),
            bytes,
        );
        out.insert(p, key);
    }
    out
}

/// Card L8: `init --adopt` of a dir whose marker already names its path needs nothing and
/// does nothing: every file and directory under it keeps its inode, times and bytes, owned or
/// not, and the output says so. It printed "adopted", as if it had changed the dir.
#[test]
fn l8_init_adopt_of_a_dir_that_needs_none_changes_nothing() {
    let env = Env::new();
    env.run_to_end(&[], &sh(r#"echo x > "$TENURE_CHECKPOINT_OUT/x""#, &[]))
        .expect_code(0);
    let before = inodes(&env.dir);
    let f = env.tool("init", &["--adopt"]);
    f.expect_code(0);
    assert!(
        f.stdout.contains("needs no adoption") && f.stdout.contains("nothing was changed"),
        "{}",
        f.stdout
    );
    assert!(!f.stdout.contains("adopted"), "{}", f.stdout);
    assert_eq!(
        inodes(&env.dir),
        before,
        "init --adopt changed a dir that needs nothing"
    );
    // Owned, it needs nothing either: not a busy refusal.
    let r = env.run(&[], &["sleep", "1000"]);
    env.wait_status("owned", |st| st["phase"] == "ready");
    let f = env.tool("init", &["--adopt"]);
    f.expect_code(0);
    assert!(f.stdout.contains("needs no adoption"), "{}", f.stdout);
    r.signal(Signal::TERM);
    r.wait();
}

/// Card L9: a new state dir and its missing parents are created 0700, its records 0600; a dir or
/// record with group/world bits is refused as `permissive` and left as it is.
#[test]
fn l9_private_by_default_permissive_refused() {
    let env = Env::new();
    let nested = env.path("a/b/state");
    let mut c = tenure();
    c.arg("run").arg("--dir").arg(&nested).args(["--", "true"]);
    let mut r = env.start(c);
    r.close_stdin();
    r.wait().expect_code(0);
    for d in ["a", "a/b", "a/b/state", "a/b/state/.tenure"] {
        let mode = fs::metadata(env.path(d)).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o700, "{d} has mode {mode:o}");
    }
    for (p, node) in snapshot(&nested.join(".tenure")) {
        match node {
            Node::Dir(m) => assert_eq!(m & 0o077, 0, "{} is {m:o}", p.display()),
            Node::File(m, _) => assert_eq!(m, 0o600, "{} is {m:o}", p.display()),
            other => panic!("unexpected {}: {other:?}", p.display()),
        }
    }

    // A permissive state dir.
    let env = Env::new();
    env.run_to_end(&[], &["true"]).expect_code(0);
    fs::set_permissions(&env.dir, fs::Permissions::from_mode(0o755)).unwrap();
    assert_refused_unchanged(&env, "permissive");

    // A permissive record.
    let env = Env::new();
    env.run_to_end(&[], &["true"]).expect_code(0);
    let owner = env.dir.join(".tenure/owner.json");
    fs::set_permissions(&owner, fs::Permissions::from_mode(0o644)).unwrap();
    assert_refused_unchanged(&env, "permissive");
    assert_eq!(
        fs::metadata(&owner).unwrap().permissions().mode() & 0o777,
        0o644,
        "never silently fixed"
    );
}

/// Card L10: a record holding `{not-json` (the owner record, the epoch file) is a clear error
/// naming the file: exit 65, no panic, nothing deleted; `status` fails closed on it too (H8),
/// as LSB's "status unknown" (4).
#[test]
fn l10_corrupt_records_are_clear_errors() {
    for (file, text) in [("owner.json", "{not-json"), ("epoch", "{not-json")] {
        let env = Env::new();
        env.run_to_end(&[], &["true"]).expect_code(0);
        write_private(&env.dir.join(".tenure").join(file), text.as_bytes());
        assert_refused_unchanged(&env, file);
        let before = snapshot(&env.dir);
        let st = env.tool("status", &["--json"]);
        st.expect_code(4);
        assert!(st.stderr.contains(file), "{}", st.stderr);
        assert_same_tree(&before, &snapshot(&env.dir));
    }
}

/// Card L10 for the checkpoint: a corrupted blob makes `verify` exit 65 naming the bad file,
/// and a run refuses the dir (65) without publishing or touching the store's bytes.
#[test]
fn l10_corrupt_checkpoint_is_refused() {
    let env = Env::new();
    env.run_to_end(&[], &sh(r#"echo hello > "$TENURE_CHECKPOINT_OUT/h""#, &[]))
        .expect_code(0);
    let blob_dir = env.dir.join("checkpoints/blobs/sha256");
    let blob = fs::read_dir(&blob_dir)
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path();
    let name = blob.file_name().unwrap().to_str().unwrap().to_owned();
    fs::set_permissions(&blob, fs::Permissions::from_mode(0o600)).unwrap();
    fs::write(&blob, b"HELLO\n").unwrap();
    let mode = fs::metadata(&blob).unwrap().permissions().mode();
    let store = env.checkpoint_tree();
    let v = env.tool("verify", &[]);
    v.expect_code(65);
    assert!(
        v.stderr.contains(&name[..16]),
        "names the bad file: {}",
        v.stderr
    );
    let f = env.run_to_end(&["-n"], &["true"]);
    f.expect_code(65);
    assert_eq!(f.end()["summary"], "refused/state");
    assert_same_tree(&store, &env.checkpoint_tree());
    assert_eq!(fs::metadata(&blob).unwrap().permissions().mode(), mode);
}

/// `tenure --help` documents every subcommand, the child's environment and the exit codes the
/// tests above rely on; an unknown subcommand is a usage error (64).
#[test]
fn help_documents_commands_and_exit_codes() {
    let out = tenure().arg("--help").output().unwrap();
    assert_eq!(out.status.code(), Some(0));
    let help = String::from_utf8(out.stdout).unwrap();
    for word in [
        "tenure run",
        "tenure up",
        "tenure stop",
        "tenure status",
        "tenure verify",
        "tenure init",
        "TENURE_CHECKPOINT_OUT",
        "NOTIFY_SOCKET",
        "--env-allow",
        "--trace",
    ] {
        assert!(help.contains(word), "--help lacks {word:?}");
    }
    for code in [
        "64", "65", "69", "70", "74", "75", "126", "127", "137", "143",
    ] {
        assert!(help.contains(code), "--help lacks exit code {code}");
    }
    let bad = tenure().arg("frobnicate").output().unwrap();
    assert_eq!(bad.status.code(), Some(64));
}

/// Card L5 with invariant I7 across a crash: an owner that died without stopping its child (the
/// child outlived it, as in the instant before its parent-death signal lands) leaves the child
/// registered; the successor SIGKILLs that child through the identity-checked path, removes its
/// entry, and only then starts its own workload — two workloads never serve one dir at once.
/// The crashed owner is the library holding the lease in this test process (the state a
/// SIGKILLed runner leaves: the lock free, the records and a live child in place).
#[test]
fn l5_successor_stops_a_crashed_owners_child_first() {
    use tenure::lease::{self, AcquireOptions, Identity, WaitBound};
    use tenure::privfs::StateDir;
    let env = Env::new();
    let mut orphan = Command::new("sleep")
        .arg("300")
        .stdin(Stdio::null())
        .spawn()
        .unwrap();
    let pid = orphan.id();
    {
        let sd = StateDir::open(&env.dir, true).unwrap();
        let opts = AcquireOptions {
            wait: WaitBound::Try,
            ..AcquireOptions::default()
        };
        let mut first = lease::acquire(&sd, &opts, &mut |_| {}).unwrap();
        first
            .register_instance("child", &Identity::of_pid(pid).unwrap())
            .unwrap();
        drop(first); // the lock goes with the "crashed" owner; every record stays
    }
    let r = env.run(&[], &sh(TERM_CHILD, &[]));
    let killed = env.wait_event("orphan-killed", Some(r.pid()));
    assert_eq!(killed["orphan_pid"], pid);
    // The orphan is dead (SIGKILL, reaped by us: its parent) before the new child was spawned.
    let status = orphan.wait().unwrap();
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(status.signal(), Some(9));
    env.wait_event("ready", Some(r.pid()));
    let kinds = env.kinds_of(r.pid());
    let at = |k: &str| kinds.iter().position(|x| x == k).unwrap();
    assert!(at("orphan-killed") < at("spawned"), "{kinds:?}");
    let entries = env.status()["registry"].clone();
    let epochs: Vec<&Value> = entries
        .as_array()
        .unwrap()
        .iter()
        .map(|e| &e["epoch"])
        .collect();
    assert!(
        !epochs.is_empty() && epochs.iter().all(|e| **e == 2),
        "the orphan's entry is gone, the new owner's are there: {entries}"
    );
    r.signal(Signal::TERM);
    r.wait().expect_code(143);
}

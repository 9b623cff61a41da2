//! Issue 10, the dir's own records: epochs never repeat (card P3), records belong to their dir
//! (card P4), `stop` tells the truth (card P5). Real runner, real children, real signals.

mod common;

use common::*;
use serde_json::Value;
use std::fs;
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::process::Stdio;

/// Card P3: after five publishes, `echo 1 > .tenure/epoch` rewinds the epoch file; the next
/// owner still gets an epoch above every epoch the dir recorded (6, not 2), says so in one
/// warning line, and publishes at that epoch.
#[test]
fn p3_a_rewound_epoch_file_never_hands_out_an_epoch_twice() {
    let env = Env::new();
    let out = env.path("epochs");
    for _ in 0..5 {
        env.run_to_end(&["-n"], &sh(COUNTER_CHILD, &[out.to_str().unwrap()]))
            .expect_code(0);
    }
    let epoch_file = |d: &std::path::Path| {
        tenure::lease::epoch::parse(&std::fs::read(d.join(".tenure/epoch")).unwrap())
    };
    assert_eq!(epoch_file(&env.dir), Ok(5));
    write_private(&env.dir.join(".tenure/epoch"), b"1\n");
    let f = env.run_to_end(&["-n"], &sh(COUNTER_CHILD, &[out.to_str().unwrap()]));
    f.expect_code(0);
    let warnings: Vec<&str> = f.stderr.lines().filter(|l| l.contains("warning")).collect();
    assert_eq!(warnings.len(), 1, "{}", f.stderr);
    assert!(
        warnings[0].contains(".tenure/epoch holds epoch 1, but")
            && warnings[0].contains("records epoch 5")
            && warnings[0].contains("the next epoch is 6"),
        "{}",
        warnings[0]
    );
    let lines = read(&out);
    let last = lines.lines().last().unwrap();
    assert_eq!(last, "6 5", "the child saw epoch 6 and counter 5: {lines}");
    assert_eq!(epoch_file(&env.dir), Ok(6));
    let st = env.status();
    assert_eq!(st["checkpoint"]["epoch"], 6, "{st}");
    assert!(
        env.events().iter().any(|e| e["kind"] == "epoch-rewound"),
        "{}",
        env.events_text()
    );
    // Every epoch the dir ever handed out is distinct.
    let mut epochs: Vec<&str> = lines
        .lines()
        .map(|l| l.split(' ').next().unwrap())
        .collect();
    let n = epochs.len();
    epochs.sort();
    epochs.dedup();
    assert_eq!(epochs.len(), n, "an epoch was handed out twice: {lines}");
}

/// Cards L10 and P3: a corrupt epoch file is refused, naming the file, with a fix that works:
/// the dir is left as it was, and once the file is moved aside as the message says, the next
/// owner gets an epoch above every epoch the dir recorded. The message used to send the
/// operator to `tenure init --adopt`, which leaves the epoch file alone: every later run was
/// refused the same way.
#[test]
fn p3_a_corrupt_epoch_file_is_refused_with_a_fix_that_works() {
    let env = Env::new();
    for _ in 0..3 {
        env.run_to_end(&["-n"], &["true"]).expect_code(0);
    }
    let epoch = env.dir.join(".tenure/epoch");
    write_private(&epoch, b"");
    let before = snapshot(&env.dir);
    let f = env.run_to_end(&["-n"], &["true"]);
    f.expect_code(65);
    assert!(
        f.stderr
            .contains(&format!("{} is corrupt", epoch.display())),
        "{}",
        f.stderr
    );
    // Whatever the message names as the fix, done by hand.
    assert!(f.stderr.contains("move it aside"), "{}", f.stderr);
    assert!(!f.stderr.contains("init --adopt"), "{}", f.stderr);
    assert_same_tree(&before, &snapshot(&env.dir));
    fs::rename(&epoch, env.dir.join(".tenure/epoch.corrupt")).unwrap();
    let out = env.path("epoch-seen");
    let f = env.run_to_end(
        &["-n"],
        &sh(r#"echo "$TENURE_EPOCH" > "$1""#, &[out.to_str().unwrap()]),
    );
    f.expect_code(0);
    assert_eq!(read(&out), "4\n", "{}", f.stderr);
}

fn root_id(dir: &Path) -> String {
    let v: Value = serde_json::from_str(&read(&dir.join(".tenure/identity.json"))).unwrap();
    v["root_id"].as_str().unwrap().to_owned()
}

/// Card P4: `cp -a a a.copy; tenure init --dir a.copy --adopt; tenure run -n --dir a.copy --
/// true` while `a` is owned never signals `a`'s child. The adopted copy gets an identity of its
/// own, the records copied from `a` are cleared, and a record of `a`'s identity planted back is
/// still never acted on.
#[test]
fn p4_an_adopted_copy_never_acts_on_the_originals_records() {
    let env = Env::new();
    let mut owner = env.run(
        &[],
        &sh(
            "echo $$ > \"$1\"; read _ || true",
            &[env.path("child").to_str().unwrap()],
        ),
    );
    env.wait_status("a ready owner", |s| s["phase"] == "ready");
    let child: u32 = wait_for(
        "the child's pid",
        DEADLINE,
        || {
            fs::read_to_string(env.path("child"))
                .ok()?
                .trim()
                .parse()
                .ok()
        },
        String::new,
    );
    let copy = env.path("state.copy");
    cp_a(&env.dir, &copy);
    let copied_instance = fs::read_dir(copy.join(".tenure/registry/instances"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.to_string_lossy().ends_with("child.slot"))
        .expect("the copy holds a's instance record");
    let planted = fs::read(&copied_instance).unwrap();

    let adopt = tenure()
        .args(["init", "--adopt", "--dir"])
        .arg(&copy)
        .output()
        .unwrap();
    assert_eq!(adopt.status.code(), Some(0), "{adopt:?}");
    assert_ne!(
        root_id(&copy),
        root_id(&env.dir),
        "a copy is a dir of its own"
    );
    assert!(
        !copied_instance.exists(),
        "adopt clears the records of the old identity"
    );
    assert!(!copy.join(".tenure/owner.json").exists());

    let run = |label: &str| {
        let out = tenure()
            .args(["run", "-n", "--dir"])
            .arg(&copy)
            .args(["--", "true"])
            .stdin(Stdio::null())
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        assert_eq!(out.status.code(), Some(0), "{label}: {stderr}");
        assert!(!stderr.contains("stopped pid"), "{label}: {stderr}");
        assert!(alive(child), "{label}: a's child was signalled: {stderr}");
    };
    run("after adopt");
    // A record of a's identity that is still there (written back here, under a name this
    // dir's runner does not register) is not acted on.
    let planted_at = copied_instance.with_file_name("a-child.slot");
    write_private(&planted_at, &planted);
    run("with a's record planted back");
    assert_eq!(
        fs::read(&planted_at).unwrap(),
        planted,
        "a foreign record is not swept or vacated either"
    );

    assert!(owner.running(), "a's owner still runs");
    assert_eq!(env.status()["phase"], "ready");
    owner.close_stdin();
    owner.wait().expect_code(0);
}

/// Card P5: `stop` right after an owner took the lock, before it wrote its record (the owner
/// is held there by a failpoint gate, so the window is deterministic). With a short grace,
/// `stop` exits 75 saying the owner is starting, and signals nobody; with a longer one it
/// waits for the record, stops that owner and exits 0 after its orderly release.
#[test]
#[cfg_attr(
    not(feature = "failpoints"),
    ignore = "needs the failpoints feature (cargo test --all-features)"
)]
fn p5_stop_tells_the_truth_while_the_owner_is_starting() {
    let env = Env::new();
    // An earlier owner that released in order: its record names a pid that is gone.
    env.run_to_end(&["-n"], &["true"]).expect_code(0);
    let gate = env.fifo("gate");
    let mut c = tenure();
    c.env(
        "TENURE_FAILPOINTS",
        format!("lease.locked=gate:{}", gate.display()),
    )
    .args(["run", "--dir"])
    .arg(&env.dir)
    .args([
        "--",
        "sh",
        "-c",
        "trap 'exit 0' TERM; while :; do sleep 0.05; done",
    ]);
    let owner = env.start(c);
    let pid = owner.pid();
    // Held between taking the lock and writing its record.
    wait_blocked_in_fifo_open(pid);
    let before = env.owner_bytes();

    let f = env.tool("stop", &["--grace", "0.5"]);
    f.expect_code(75);
    assert!(f.stderr.contains("still starting"), "{}", f.stderr);
    assert!(f.stderr.contains("nothing was signalled"), "{}", f.stderr);
    assert!(!f.stdout.contains("is not owned"), "{}", f.stdout);
    assert!(alive(pid), "the starting owner was not touched");
    assert_eq!(env.owner_bytes(), before);

    let mut c = tenure();
    c.args(["stop", "--grace", "20", "--dir"]).arg(&env.dir);
    let stopper = env.start(c);
    let out = env.tmp.path().to_path_buf();
    wait_for(
        "stop to wait for the starting owner",
        DEADLINE,
        || {
            // The captured stdout files only (reading the gate FIFO would block).
            fs::read_dir(&out)
                .ok()?
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| p.extension().is_some_and(|x| x == "out"))
                .filter_map(|p| fs::read_to_string(p).ok())
                .any(|t| t.contains("still starting; waiting"))
                .then_some(())
        },
        String::new,
    );
    release_fifo(&gate);
    let f = stopper.wait();
    f.expect_code(0);
    assert!(
        f.stdout.contains("sent SIGTERM to owner pid"),
        "{}",
        f.stdout
    );
    assert!(f.stdout.contains("released"), "{}", f.stdout);
    let o = owner.wait();
    o.expect_code(143);
    assert_eq!(env.status()["phase"], "released");
}

/// Card D6 with the log written in bursts (issue 11): the workload finds its owner's `owned` and
/// `recovered` lines on file as it starts, even when the runner is held right after the spawn
/// (a gate at the instance entry's write, which only the workload opens, once it has looked).
#[test]
#[cfg_attr(
    not(feature = "failpoints"),
    ignore = "needs the failpoints feature (cargo test --all-features)"
)]
fn d6_the_log_is_on_file_before_the_workload_starts() {
    let env = Env::new();
    let gate = env.fifo("gate");
    let seen = env.path("seen");
    let log = env.dir.join(".tenure/events.jsonl");
    // $1 the log, $2 where to say what it found, $3 the gate the runner waits at.
    let script = r#"
        found=
        grep -q '"kind":"owned"' "$1" && found="$found owned"
        grep -q '"kind":"recovered"' "$1" && found="$found recovered"
        echo "$found" > "$2"
        echo go > "$3"
    "#;
    let mut c = tenure();
    c.env(
        "TENURE_FAILPOINTS",
        format!("lease.registry.write=gate:{}", gate.display()),
    )
    .args(["run", "--dir"])
    .arg(&env.dir)
    .arg("--")
    .args(sh(
        script,
        &[
            log.to_str().unwrap(),
            seen.to_str().unwrap(),
            gate.to_str().unwrap(),
        ],
    ));
    let mut owner = env.start(c);
    // The owner's own registry entry, written while acquiring, before the workload exists.
    wait_blocked_in_fifo_open(owner.pid());
    release_fifo(&gate);
    // The workload releases the next write (its instance entry, right after the spawn) itself;
    // whatever the owner writes to the registry after it (the release) is let through here.
    wait_for(
        "the workload to look at the log",
        DEADLINE,
        || fs::metadata(&seen).is_ok().then_some(()),
        String::new,
    );
    wait_for(
        "the owner to end",
        DEADLINE,
        || {
            if !owner.running() {
                return Some(());
            }
            if let Ok(mut f) = fs::OpenOptions::new()
                .write(true)
                .custom_flags(rustix::fs::OFlags::NONBLOCK.bits() as i32)
                .open(&gate)
            {
                let _ = f.write_all(b"go\n");
            }
            None
        },
        String::new,
    );
    owner.wait().expect_code(0);
    assert_eq!(
        fs::read_to_string(&seen).unwrap().trim(),
        "owned recovered",
        "the workload's view of the log as it started"
    );
}

/// Card P5: an owner whose child ignores SIGTERM past `stop`'s grace is SIGKILLed mid-drain:
/// `stop` exits with its own code (137), not 0, and says the checkpoint may be missing.
#[test]
fn p5_stop_that_had_to_kill_the_owner_says_so() {
    let env = Env::new();
    let owner = env.run(
        &["--type", "notify", "--grace", "30"],
        &sh(STUBBORN_CHILD, &[]),
    );
    env.wait_status("a ready owner", |s| s["phase"] == "ready");
    let f = env.tool("stop", &["--grace", "0.5"]);
    f.expect_code(137);
    assert!(
        f.stderr.contains("killed with SIGKILL mid-drain"),
        "{}",
        f.stderr
    );
    drop(owner);
    let st = env.status();
    assert_eq!(st["lock_held"], false, "{st}");
}

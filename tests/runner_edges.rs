//! Issue 10, the edges of the runner a user meets first: paths, standard streams that are
//! closed or whose reader went away, and the small command-line and state-file cases. Every
//! test runs the real binary against real files.

mod common;

use common::*;
use serde_json::Value;
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Command, Stdio};

fn private_dir(p: &Path) {
    fs::create_dir_all(p).unwrap();
    fs::set_permissions(p, fs::Permissions::from_mode(0o700)).unwrap();
}

/// A trailing `/` or `/.` never changes whether a symlinked state dir is refused: `--dir link`,
/// `--dir link/`, `--dir link/.` and `--dir link/./` are all refused as a symlink, by every
/// command, and the directory behind the link is left untouched.
#[test]
fn a_trailing_slash_or_dot_never_follows_a_symlinked_dir() {
    let env = Env::new();
    let real = env.path("real");
    private_dir(&real);
    std::os::unix::fs::symlink(&real, env.path("link")).unwrap();
    let link = env.path("link").display().to_string();
    for spelling in [
        link.clone(),
        format!("{link}/"),
        format!("{link}/."),
        format!("{link}/./"),
        format!("{link}//"),
    ] {
        let mut runs: Vec<Vec<&str>> = vec![
            vec!["run", "--dir", &spelling, "-n", "--", "true"],
            vec!["init", "--dir", &spelling],
            vec!["status", "--dir", &spelling],
            vec!["verify", "--dir", &spelling],
            vec!["stop", "--dir", &spelling],
        ];
        for args in runs.drain(..) {
            let out = tenure().args(&args).stdin(Stdio::null()).output().unwrap();
            let stderr = String::from_utf8_lossy(&out.stderr);
            // `status` answers in LSB's terms: a refused dir is "status unknown" (4).
            let want = if args[0] == "status" { 4 } else { 65 };
            assert_eq!(out.status.code(), Some(want), "{args:?}: {stderr}");
            assert!(stderr.contains("is a symlink"), "{args:?}: {stderr}");
        }
        assert_eq!(
            fs::read_dir(&real).unwrap().count(),
            0,
            "{spelling}: the dir behind the link was written"
        );
    }
}

/// How a standard stream of a command is broken.
#[derive(Debug, Clone, Copy)]
enum Broken {
    /// A pipe whose reader has already gone: every write fails with EPIPE.
    PipeOut,
    PipeErr,
    /// The descriptor is closed when the command starts (`>&-`).
    ClosedOut,
    ClosedErr,
}

/// Runs `tenure ARGS` with one broken stream; the other stream is captured.
fn run_broken(args: &[&str], how: Broken) -> (Option<i32>, String) {
    let dead_pipe = || {
        let (r, w) = rustix::pipe::pipe().unwrap();
        drop(r);
        Stdio::from(w)
    };
    let mut c = match how {
        Broken::PipeOut | Broken::PipeErr => {
            let mut c = tenure();
            c.args(args);
            c
        }
        // The shell closes the descriptor and execs tenure, which starts with it closed.
        Broken::ClosedOut | Broken::ClosedErr => {
            let redirect = if matches!(how, Broken::ClosedOut) {
                ">&-"
            } else {
                "2>&-"
            };
            let mut c = Command::new("sh");
            c.arg("-c")
                .arg(format!("exec \"$0\" \"$@\" {redirect}"))
                .arg(bin())
                .args(args)
                .env_remove("NOTIFY_SOCKET")
                .env_remove("TENURE_FAILPOINTS");
            c
        }
    };
    c.stdin(Stdio::null());
    let captured = match how {
        Broken::PipeOut => {
            c.stdout(dead_pipe()).stderr(Stdio::piped());
            true
        }
        Broken::PipeErr => {
            c.stderr(dead_pipe()).stdout(Stdio::piped());
            false
        }
        Broken::ClosedOut => {
            c.stderr(Stdio::piped());
            true
        }
        Broken::ClosedErr => {
            c.stdout(Stdio::piped());
            false
        }
    };
    let out = c.output().unwrap();
    let text = if captured { out.stderr } else { out.stdout };
    (
        out.status.code(),
        String::from_utf8_lossy(&text).into_owned(),
    )
}

/// Every command, with a broken and a closed stdout and stderr: no panic, the exit status of
/// what the command did (ripgrep's convention for a reader that went away), the effect done,
/// and no print ever lands in a file of the state dir (a closed descriptor is not handed to a
/// state file).
#[test]
fn every_command_survives_a_broken_or_closed_stdout_and_stderr() {
    for how in [
        Broken::PipeOut,
        Broken::PipeErr,
        Broken::ClosedOut,
        Broken::ClosedErr,
    ] {
        let env = Env::new();
        let d = env.dir.display().to_string();
        let daemon = "trap 'exit 0' TERM; while :; do sleep 0.05; done";
        let cases: Vec<(Vec<&str>, i32)> = vec![
            (vec!["--help"], 0),
            (vec!["--version"], 0),
            (vec!["init", "--dir", &d], 0),
            (vec!["run", "--dir", &d, "-n", "--", "true"], 0),
            // LSB: 3 while nothing runs, 0 while owned.
            (vec!["status", "--dir", &d], 3),
            (vec!["status", "--dir", &d, "--json"], 3),
            (vec!["verify", "--dir", &d], 0),
            (vec!["up", "--dir", &d, "--", "sh", "-c", daemon], 0),
            (vec!["status", "--dir", &d], 0),
            (vec!["stop", "--dir", &d, "--grace", "20"], 0),
            (vec!["stop", "--dir", &d], 0),
            (vec!["run", "--bogus"], 64),
            (vec!["demo"], 0),
        ];
        for (args, want) in cases {
            let (code, text) = run_broken(&args, how);
            assert!(!text.contains("panicked"), "{how:?} {args:?}: {text}");
            assert_eq!(code, Some(want), "{how:?} {args:?}: {text}");
        }
        // The effects happened, and every record of the dir still parses: no line meant for
        // a closed stream was written into one of them.
        let ends = env.events().iter().filter(|e| e["kind"] == "end").count();
        assert_eq!(ends, 2, "{how:?}: {}", env.events_text());
        let text = read(&env.dir.join(".tenure/identity.json"));
        serde_json::from_str::<Value>(&text)
            .unwrap_or_else(|e| panic!("{how:?}: identity.json is damaged ({e}): {text}"));
        let owner = fs::read(env.dir.join(".tenure/owner.json")).unwrap();
        tenure::lease::record::decode_owner(&owner)
            .unwrap_or_else(|e| panic!("{how:?}: owner.json is damaged ({e}): {owner:?}"))
            .expect("an owner record");
        let log = fs::read(env.dir.join(".tenure/events.jsonl")).unwrap();
        for line in log.split(|b| *b == b'\n').filter(|l| !l.is_empty()) {
            serde_json::from_slice::<Value>(line).unwrap_or_else(|e| {
                panic!(
                    "{how:?}: bad log line ({e}): {}",
                    String::from_utf8_lossy(line)
                )
            });
        }
        let st = env.status();
        assert_eq!(st["phase"], "released", "{how:?}: {st}");
    }
}

fn usage(args: &[&str]) -> String {
    let out = tenure().args(args).stdin(Stdio::null()).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(64), "{args:?}: {stderr}");
    stderr
}

/// `--ready bogus` names the value it refuses, plainly.
#[test]
fn ready_with_a_bogus_value_names_it() {
    let env = Env::new();
    let d = env.dir.display().to_string();
    let err = usage(&["run", "--dir", &d, "--ready", "bogus", "--", "true"]);
    assert!(
        err.contains("--ready takes `start` or `notify`, not \"bogus\""),
        "{err}"
    );
    assert!(!err.contains("Some("), "{err}");
    assert!(!env.dir.exists(), "a usage error touched the disk");
}

/// A repeated option is a usage error (64) before anything on disk changes, whatever its
/// spelling; `--env-allow` adds to a list and may be repeated.
#[test]
fn a_repeated_option_is_a_usage_error() {
    let env = Env::new();
    let d = env.dir.display().to_string();
    for args in [
        vec!["run", "--dir", &d, "--dir", &d, "--", "true"],
        vec!["run", "-d", &d, "--dir", &d, "--", "true"],
        vec![
            "run",
            "--dir",
            &d,
            "--grace",
            "1",
            "--grace=2",
            "--",
            "true",
        ],
        vec!["run", "--dir", &d, "-n", "--nonblock", "--", "true"],
        vec![
            "run",
            "--dir",
            &d,
            "-w",
            "1",
            "--timeout",
            "2",
            "--",
            "true",
        ],
        vec![
            "run", "--dir", &d, "--keep", "1", "--keep", "3", "--", "true",
        ],
        vec![
            "up", "--dir", &d, "--ready", "start", "--ready", "notify", "--", "true",
        ],
        vec!["status", "--dir", &d, "--json", "--json"],
        vec!["stop", "--dir", &d, "--grace", "1", "--grace", "1"],
        vec!["init", "--dir", &d, "--adopt", "--adopt"],
        vec!["verify", "--dir", &d, "-d", &d],
    ] {
        let err = usage(&args);
        assert!(err.contains("was given twice"), "{args:?}: {err}");
    }
    assert!(!env.dir.exists(), "a usage error touched the disk");
    let out = env.run_to_end(
        &["-n", "--env-allow", "PATH", "--env-allow", "HOME"],
        &sh(r#"[ -n "$HOME" ] && [ -n "$PATH" ]"#, &[]),
    );
    out.expect_code(0);
}

/// A duration that rounds to zero nanoseconds is zero, and a zero grace is a usage error: a
/// positive one is refused as too small, naming the smallest duration.
#[test]
fn a_duration_that_rounds_to_zero_is_zero() {
    let env = Env::new();
    let d = env.dir.display().to_string();
    for (flag, v) in [
        ("--grace", "0.0000000001"),
        ("--grace", "0.0000000001s"),
        ("--kill-wait", "0.0000000004"),
        ("--grace", "0.000000000001ms"),
    ] {
        let err = usage(&["run", "--dir", &d, flag, v, "--", "true"]);
        assert!(
            err.contains("too small: it rounds to zero nanoseconds (the smallest duration is 1ns)"),
            "{flag} {v}: {err}"
        );
    }
    let err = usage(&["stop", "--dir", &d, "--grace", "0.0000000001"]);
    assert!(err.contains("too small"), "{err}");
    assert!(!env.dir.exists());
    // One nanosecond is not zero.
    env.run_to_end(&["-n", "--grace", "0.000000001"], &["true"])
        .expect_code(0);
}

/// An event log that is a symlink or a FIFO is never written through and never silently
/// dropped: the run says so in one warning naming the file, and goes on.
#[test]
fn an_event_log_that_is_a_symlink_or_fifo_is_a_clear_warning() {
    for kind in ["symlink", "fifo"] {
        let env = Env::new();
        env.tool("init", &[]).expect_code(0);
        let log = env.dir.join(".tenure/events.jsonl");
        let _ = fs::remove_file(&log);
        let target = env.path("elsewhere");
        fs::write(&target, b"not yours\n").unwrap();
        match kind {
            "symlink" => std::os::unix::fs::symlink(&target, &log).unwrap(),
            _ => mkfifo(&log),
        }
        // Run directly: the harness's own accounting would read the log, and a FIFO blocks.
        let out = tenure()
            .args(["run", "-n", "--dir"])
            .arg(&env.dir)
            .args(["--", "true"])
            .stdin(Stdio::null())
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(0), "{kind}: {stderr}");
        let warnings: Vec<&str> = stderr
            .lines()
            .filter(|l| l.contains("warning") && l.contains("events.jsonl"))
            .collect();
        assert!(!warnings.is_empty(), "{kind}: no warning: {stderr}");
        let want = if kind == "symlink" {
            "is a symlink"
        } else {
            "is not a regular file (found a fifo)"
        };
        assert!(warnings[0].contains(want), "{kind}: {}", warnings[0]);
        assert!(
            warnings[0].contains("not logged"),
            "{kind}: {}",
            warnings[0]
        );
        assert_eq!(fs::read(&target).unwrap(), b"not yours\n");
    }
}

/// `status --json` prints JSON on a refusal too: an `error` object with the exit code and the
/// message naming the file. The codes are LSB's: a refused record means the status is unknown
/// (4); a dir that does not exist has nothing running (3).
#[test]
fn status_json_prints_an_error_object_on_a_refusal() {
    let env = Env::new();
    env.tool("init", &[]).expect_code(0);
    write_private(&env.dir.join(".tenure/owner.json"), b"{not-json");
    let f = env.tool("status", &["--json"]);
    f.expect_code(4);
    let v: Value = serde_json::from_str(&f.stdout).expect("status --json prints JSON");
    assert_eq!(v["error"]["code"], 4, "{v}");
    let msg = v["error"]["message"].as_str().unwrap();
    assert!(msg.contains("owner.json is corrupt"), "{msg}");
    // A dir that does not exist: not running, with JSON as well.
    let out = tenure()
        .args(["status", "--json", "--dir"])
        .arg(env.path("missing"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(3));
    let v: Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(v["error"]["code"], 3, "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("does not exist"),
        "{v}"
    );
}

/// Whatever a crashed run or its child left in `checkpoints/staging/` — a symlink, a FIFO, a
/// temp dir of a rename-into-place — is cleaned by the next owner, and no link is followed.
#[test]
fn leftovers_in_staging_are_cleaned_and_links_never_followed() {
    let env = Env::new();
    env.run_to_end(&["-n"], &sh("echo 1 > \"$TENURE_CHECKPOINT_OUT/x\"", &[]))
        .expect_code(0);
    let staging = env.dir.join("checkpoints/staging");
    let victim = env.path("victim");
    private_dir(&victim);
    fs::write(victim.join("keep"), b"mine").unwrap();
    std::os::unix::fs::symlink(&victim, staging.join("link-to-dir")).unwrap();
    std::os::unix::fs::symlink("/nonexistent", staging.join("dangling")).unwrap();
    mkfifo(&staging.join("fifo"));
    fs::create_dir(staging.join("abc.tmp")).unwrap();
    fs::write(staging.join("abc.tmp/half"), b"x").unwrap();
    env.run_to_end(&["-n"], &["true"]).expect_code(0);
    // The clean run parked its empty area as the one spare (issue 11); nothing else is left,
    // and nothing is in the spare.
    let left: Vec<_> = fs::read_dir(&staging)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .filter(|n| n != ".spare")
        .collect();
    assert!(left.is_empty(), "{left:?}");
    assert_eq!(fs::read_dir(staging.join(".spare")).unwrap().count(), 0);
    assert_eq!(fs::read(victim.join("keep")).unwrap(), b"mine");
}

/// Found by the `current` fuzz target: a `CURRENT` whose bytes are valid UTF-8 with a
/// multi-byte character across the end of the id made every command panic (exit 101). It is a
/// refused dir now (65), named, and left as it was.
#[test]
fn a_current_with_a_character_across_the_id_is_refused_not_a_panic() {
    let env = Env::new();
    env.run_to_end(&["-n"], &sh(r#"echo 1 > "$TENURE_CHECKPOINT_OUT/x""#, &[]))
        .expect_code(0);
    let current = env.dir.join("checkpoints/CURRENT");
    write_private(
        &current,
        b"00000000000000001c6\xc6\x9a\xcd\x9d024bc\xcc\xa6190072a88d82ee4a1092855d34c75bfa28d2855d34c75bfa28ddA50\n",
    );
    let before = snapshot(&env.dir);
    for args in [vec!["verify"], vec!["status"], vec!["status", "--json"]] {
        let f = env.tool(args[0], &args[1..]);
        assert!(!f.stderr.contains("panicked"), "{args:?}: {}", f.stderr);
        let text = format!("{}{}", f.stdout, f.stderr);
        assert!(
            text.contains("CURRENT holds a malformed checkpoint id"),
            "{args:?}: {text}"
        );
        if args[0] == "verify" {
            f.expect_code(65);
        }
    }
    let f = env.run_to_end(&["-n"], &["true"]);
    f.expect_code(65);
    assert!(
        f.stderr.contains("CURRENT holds a malformed checkpoint id"),
        "{}",
        f.stderr
    );
    let mut after = snapshot(&env.dir);
    // The refused run may log; the checkpoint store is left byte for byte.
    after.retain(|p, _| p.starts_with("checkpoints"));
    let mut before = before;
    before.retain(|p, _| p.starts_with("checkpoints"));
    assert_same_tree(&before, &after);
}

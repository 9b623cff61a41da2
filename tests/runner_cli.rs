//! The command line as an operator meets it, through the built binary: help for every command,
//! shell completions, the man page, humantime durations, `TENURE_DIR`, `--quiet`, repeated
//! options, the LSB exit codes of `status` and `stop`, the checkpoint commands (list, show,
//! rollback past a corrupted `CURRENT`) and `--user`.

mod common;

use common::*;
use serde_json::Value;
use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::process::Stdio;

fn out(args: &[&str]) -> (Option<i32>, String, String) {
    let o = tenure().args(args).stdin(Stdio::null()).output().unwrap();
    (
        o.status.code(),
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

/// Every command has its own `--help`, printed on stdout with exit 0, naming its usage and
/// its options.
#[test]
fn every_command_has_its_own_help() {
    let cases: &[(&[&str], &[&str])] = &[
        (
            &["run"],
            &[
                "Usage: tenure run",
                "--grace",
                "--type",
                "--user",
                "TENURE_DIR",
            ],
        ),
        (&["up"], &["Usage: tenure up", "--wait"]),
        (&["stop"], &["Usage: tenure stop", "--grace"]),
        (&["status"], &["Usage: tenure status", "--json"]),
        (&["verify"], &["Usage: tenure verify", "--dir"]),
        (&["init"], &["Usage: tenure init", "--adopt"]),
        (
            &["checkpoint"],
            &["Usage: tenure checkpoint", "list", "show", "rollback"],
        ),
        (
            &["checkpoint", "list"],
            &["Usage: tenure checkpoint list", "--json"],
        ),
        (
            &["checkpoint", "show"],
            &["Usage: tenure checkpoint show", "<N>"],
        ),
        (
            &["checkpoint", "rollback"],
            &["Usage: tenure checkpoint rollback", "--to", "--keep"],
        ),
        (
            &["completions"],
            &["Usage: tenure completions", "bash", "zsh", "fish"],
        ),
        (&["man"], &["Usage: tenure man"]),
        (&["demo"], &["Usage: tenure demo"]),
    ];
    for (cmd, words) in cases {
        for flag in ["--help", "-h"] {
            let mut args = cmd.to_vec();
            args.push(flag);
            let (code, stdout, stderr) = out(&args);
            assert_eq!(code, Some(0), "{args:?}: {stderr}");
            for w in *words {
                assert!(stdout.contains(w), "{args:?} lacks {w:?}:\n{stdout}");
            }
        }
    }
    // `help` output never mentions the demo's private child command.
    let (_, top, _) = out(&["--help"]);
    assert!(!top.contains("demo-child"), "{top}");
}

/// `tenure completions SHELL` prints a non-empty script for bash, zsh and fish that knows the
/// commands and their options; an unknown shell names the accepted ones.
#[test]
fn completions_for_three_shells() {
    for (shell, marker) in [
        ("bash", "_tenure()"),
        ("zsh", "#compdef tenure"),
        ("fish", "complete -c tenure"),
    ] {
        let (code, script, stderr) = out(&["completions", shell]);
        assert_eq!(code, Some(0), "{shell}: {stderr}");
        assert!(script.contains(marker), "{shell}: {script}");
        for word in ["rollback", "grace", "kill-mode", "forking"] {
            assert!(script.contains(word), "{shell} lacks {word}");
        }
    }
    let (code, _, stderr) = out(&["completions", "tcsh"]);
    assert_eq!(code, Some(64));
    assert!(
        stderr.contains("takes `bash`")
            && stderr.contains("`zsh`")
            && stderr.contains("not \"tcsh\""),
        "{stderr}"
    );
}

/// `tenure man` prints tenure(1) in roff, `tenure man run` the page of one command; `man`
/// itself renders them where it is installed.
#[test]
fn man_pages_are_generated() {
    let (code, page, stderr) = out(&["man"]);
    assert_eq!(code, Some(0), "{stderr}");
    assert!(
        page.starts_with(".ie") || page.contains(".TH tenure 1"),
        "{page}"
    );
    assert!(page.contains(".TH tenure 1"), "{page}");
    for word in [
        "checkpoint",
        "completions",
        "EXIT CODES",
        "TENURE_CHECKPOINT_OUT",
    ] {
        assert!(page.contains(word), "tenure(1) lacks {word}");
    }
    let (code, run, _) = out(&["man", "run"]);
    assert_eq!(code, Some(0));
    assert!(run.contains(".TH tenure-run 1"), "{run}");
    assert!(run.contains("\\-\\-grace"), "{run}");
    assert!(run.contains("\\-\\-user"), "{run}");
    let (code, _, stderr) = out(&["man", "nope"]);
    assert_eq!(code, Some(64));
    assert!(stderr.contains("expected one of run, up"), "{stderr}");
    if std::process::Command::new("man")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
    {
        let mut man = std::process::Command::new("man")
            .args(["-l", "-"])
            .env("MANWIDTH", "100")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        use std::io::Write;
        man.stdin.take().unwrap().write_all(run.as_bytes()).unwrap();
        let rendered = man.wait_with_output().unwrap();
        assert!(rendered.status.success());
        assert!(String::from_utf8_lossy(&rendered.stdout).contains("grace"));
    }
}

/// Durations take humantime's forms (`1h30m`, `2min 5s`) besides seconds and one unit; a bad
/// one names the forms accepted, exit 64, nothing on disk.
#[test]
fn durations_take_humantime_forms() {
    let env = Env::new();
    env.run_to_end(
        &[
            "-n",
            "--grace",
            "1h30m",
            "--kill-wait",
            "250ms",
            "--watchdog",
            "2min 5s",
        ],
        &["true"],
    )
    .expect_code(0);
    let other = Env::new();
    for bad in ["1x", "h", "1h-30m", "-1s", "1e3"] {
        let d = other.dir.display().to_string();
        let (code, _, stderr) = out(&["run", "--dir", &d, "--grace", bad, "--", "true"]);
        assert_eq!(code, Some(64), "{bad}: {stderr}");
        assert!(
            stderr.contains(&format!("--grace {bad:?}"))
                && stderr.contains("seconds (1.5) or with units (250ms, 2s, 1h30m)"),
            "{bad}: {stderr}"
        );
    }
    assert!(!other.dir.exists(), "a usage error touched the disk");
}

/// Card H6: a positive duration below the clock's resolution (it rounds to zero nanoseconds)
/// is refused as too small, naming the smallest duration, whatever its form: it was "expected a
/// duration" for `1e-10` and "must be greater than zero" for `0.0000000001`. Half a
/// nanosecond rounds up to the smallest and is taken.
#[test]
fn h6_durations_that_round_to_zero_are_too_small() {
    let env = Env::new();
    let d = env.dir.display().to_string();
    for opt in ["--watchdog", "--grace"] {
        for tiny in ["1e-10", "0.0000000001", "0.1ns", "4e-10s"] {
            let (code, _, stderr) = out(&["run", "--dir", &d, opt, tiny, "--", "true"]);
            assert_eq!(code, Some(64), "{opt} {tiny}: {stderr}");
            assert!(
                stderr.contains(&format!(
                    "{opt} {tiny:?}: too small: it rounds to zero nanoseconds (the smallest duration is 1ns)"
                )),
                "{opt} {tiny}: {stderr}"
            );
        }
    }
    // Zero itself is still zero, and the exponent forms that are not too small still say
    // which forms are taken.
    let (code, _, stderr) = out(&["run", "--dir", &d, "--grace", "0", "--", "true"]);
    assert_eq!(code, Some(64), "{stderr}");
    assert!(stderr.contains("must be greater than zero"), "{stderr}");
    let (code, _, stderr) = out(&["run", "--dir", &d, "--grace", "1e-3", "--", "true"]);
    assert_eq!(code, Some(64), "{stderr}");
    assert!(stderr.contains("expected a duration"), "{stderr}");
    assert!(!env.dir.exists(), "a usage error touched the disk");
    env.run_to_end(&["-n", "--grace", "0.5ns"], &["true"])
        .expect_code(0);
}

/// `TENURE_DIR` is the default of `--dir` for every command; an explicit `--dir` wins.
#[test]
fn tenure_dir_is_the_default_dir() {
    let env = Env::new();
    let mut c = tenure();
    c.args([
        "run",
        "-n",
        "--",
        "sh",
        "-c",
        r#"echo 7 > "$TENURE_CHECKPOINT_OUT/n""#,
    ])
    .env("TENURE_DIR", &env.dir);
    env.start(c).wait().expect_code(0);
    assert_eq!(env.checkpoint_file("n").as_deref(), Some("7\n"));
    let st = tenure()
        .args(["status", "--json"])
        .env("TENURE_DIR", &env.dir)
        .output()
        .unwrap();
    assert_eq!(st.status.code(), Some(3));
    let v: Value = serde_json::from_slice(&st.stdout).unwrap();
    assert_eq!(v["checkpoint"]["state"], "valid", "{v}");
    let other = Env::new();
    let mut c = tenure();
    c.arg("verify")
        .arg("--dir")
        .arg(&env.dir)
        .env("TENURE_DIR", &other.dir);
    let v = c.output().unwrap();
    assert_eq!(v.status.code(), Some(0));
    assert!(!other.dir.exists(), "TENURE_DIR was used despite --dir");
    // Neither: a usage error that names both.
    let (code, _, stderr) = out(&["status"]);
    assert_eq!(code, Some(64));
    assert!(
        stderr.contains("--dir DIR is required (or set TENURE_DIR)"),
        "{stderr}"
    );
}

/// `--quiet` (before or after the command) keeps warnings and errors, drops the progress.
#[test]
fn quiet_keeps_errors_only() {
    let env = Env::new();
    let loud = env.run_to_end(&["-n"], &["true"]);
    assert!(loud.stderr.contains("tenure: ready"), "{}", loud.stderr);
    let d = env.dir.display().to_string();
    for args in [
        vec!["-q", "run", "--dir", &d, "-n", "--", "true"],
        vec!["run", "--quiet", "--dir", &d, "-n", "--", "true"],
    ] {
        let (code, _, stderr) = out(&args);
        assert_eq!(code, Some(0), "{args:?}: {stderr}");
        assert_eq!(stderr, "", "{args:?}");
    }
    let (code, _, stderr) = out(&["-q", "run", "--dir", &d, "-n", "--", "/nonexistent/cmd"]);
    assert_eq!(code, Some(127));
    assert!(stderr.contains("cannot execute"), "{stderr}");
    assert!(!stderr.contains("owner of"), "{stderr}");
}

/// An option given twice is a usage error for the new commands and options as well.
#[test]
fn repeated_options_of_new_commands_are_usage_errors() {
    let env = Env::new();
    let d = env.dir.display().to_string();
    for args in [
        vec!["checkpoint", "list", "--dir", &d, "--json", "--json"],
        vec![
            "checkpoint",
            "rollback",
            "--dir",
            &d,
            "--to",
            "1",
            "--to",
            "2",
        ],
        vec![
            "run", "--dir", &d, "--user", "nobody", "--user", "nobody", "--", "true",
        ],
        vec!["-q", "status", "--dir", &d, "--quiet"],
        vec![
            "run", "--dir", &d, "--type", "notify", "--type", "simple", "--", "true",
        ],
    ] {
        let (code, _, stderr) = out(&args);
        assert_eq!(code, Some(64), "{args:?}: {stderr}");
        assert!(stderr.contains("was given twice"), "{args:?}: {stderr}");
    }
    let (code, _, stderr) = out(&[
        "run", "--dir", &d, "--type", "notify", "--ready", "start", "--", "true",
    ]);
    assert_eq!(code, Some(64));
    assert!(stderr.contains("--type and --ready"), "{stderr}");
    assert!(!env.dir.exists());
}

/// LSB codes: `status` 0 while owned, 3 when not running (released, or no dir at all), 4 when
/// refused; `stop` of a dir nothing owns (or that does not exist) is 0 and says so.
#[test]
fn status_and_stop_follow_lsb() {
    let env = Env::new();
    env.tool("status", &[]).expect_code(3);
    let s = env.tool("stop", &[]);
    s.expect_code(0);
    assert!(
        s.stdout.contains("does not exist: nothing runs there"),
        "{}",
        s.stdout
    );

    let mut owner = env.run(&[], &sh(TERM_CHILD, &[]));
    env.wait_status("ready", |s| s["phase"] == "ready");
    env.wait_child_traps_term(owner.pid());
    let st = env.tool("status", &[]);
    st.expect_code(0);
    assert!(st.stdout.contains("phase:      ready"), "{}", st.stdout);
    // Nothing was ever published here.
    assert!(st.stdout.contains("checkpoint: none\n"), "{}", st.stdout);
    owner.say("");
    owner.wait().expect_code(3);

    let st = env.tool("status", &["--json"]);
    st.expect_code(3);
    let v: Value = serde_json::from_str(&st.stdout).unwrap();
    assert_eq!(v["phase"], "released");
    let s = env.tool("stop", &[]);
    s.expect_code(0);
    assert!(
        s.stdout
            .contains("is not owned: nothing runs there (already stopped)"),
        "{}",
        s.stdout
    );

    write_private(&env.dir.join(".tenure/owner.json"), b"{not-json");
    let st = env.tool("status", &["--json"]);
    st.expect_code(4);
    let v: Value = serde_json::from_str(&st.stdout).unwrap();
    assert_eq!(v["error"]["code"], 4);
}

/// Runs `tenure checkpoint SUB --dir STATE ARGS` to its end.
fn cp(env: &Env, sub: &str, args: &[&str]) -> Finished {
    let mut c = tenure();
    c.args(["checkpoint", sub, "--dir"])
        .arg(&env.dir)
        .args(args);
    let mut r = env.start(c);
    r.close_stdin();
    r.wait()
}

/// `tenure checkpoint list --json`, parsed.
fn list(env: &Env) -> Value {
    let f = cp(env, "list", &["--json"]);
    f.expect_code(0);
    serde_json::from_str(&f.stdout).unwrap()
}

fn counter_run(env: &Env) -> Finished {
    env.run_to_end(
        &["-n"],
        &sh(
            r#"c=0; [ -n "$TENURE_CHECKPOINT" ] && c=$(cat "$TENURE_CHECKPOINT/count"); echo $((c + 1)) > "$TENURE_CHECKPOINT_OUT/count""#,
            &[],
        ),
    )
}

/// `checkpoint show N` and `checkpoint rollback --to N` of a checkpoint the dir never had: a
/// refusal that says there is no such checkpoint and where to look, and changes nothing. It
/// used to say that "CURRENT names a missing manifest" and to restore it, although CURRENT is
/// intact and names checkpoint 1.
#[test]
fn a_checkpoint_that_does_not_exist_is_named_as_such() {
    let env = Env::new();
    counter_run(&env).expect_code(0);
    let before = snapshot(&env.dir);
    let show = cp(&env, "show", &["9"]);
    let rollback = cp(&env, "rollback", &["--to", "9"]);
    for f in [&show, &rollback] {
        f.expect_code(65);
        assert!(f.stderr.contains("has no checkpoint 9"), "{}", f.stderr);
        assert!(f.stderr.contains("tenure checkpoint list"), "{}", f.stderr);
        assert!(!f.stderr.contains("CURRENT names"), "{}", f.stderr);
    }
    assert!(
        rollback.stderr.contains("nothing was changed"),
        "{}",
        rollback.stderr
    );
    assert_same_tree(&before, &snapshot(&env.dir));
}

/// `checkpoint rollback --to` the current checkpoint: the rollback owns the dir for a moment (an
/// epoch of its own) and publishes nothing. It says so — not that "nothing was changed", since
/// the epoch moved — and CURRENT is byte for byte what it was.
#[test]
fn a_rollback_to_the_current_checkpoint_publishes_nothing() {
    let env = Env::new();
    counter_run(&env).expect_code(0);
    let current = env.current_bytes();
    let f = cp(&env, "rollback", &["--to", "1"]);
    f.expect_code(0);
    assert!(f.stdout.contains("already current"), "{}", f.stdout);
    assert!(
        f.stdout
            .contains("nothing was rolled back (the rollback's ownership took epoch 2)"),
        "{}",
        f.stdout
    );
    assert_eq!(env.current_bytes(), current);
}

/// Rollback round trip: a corrupted `CURRENT` makes `run` refuse; `checkpoint list` shows
/// what verifies; a rollback to a checkpoint that does not verify changes nothing; a rollback
/// to one that does takes the lease, publishes it again under a new epoch, keeps the refused
/// one, and the next run recovers from it.
#[test]
fn rollback_past_a_corrupted_current() {
    for corruption in ["malformed CURRENT", "wrong manifest digest", "corrupt blob"] {
        let env = Env::new();
        counter_run(&env).expect_code(0);
        counter_run(&env).expect_code(0);
        assert_eq!(env.checkpoint_file("count").as_deref(), Some("2\n"));
        let current = env.dir.join("checkpoints/CURRENT");
        match corruption {
            "malformed CURRENT" => write_private(&current, b"not a pointer\n"),
            "wrong manifest digest" => {
                let text = read(&current);
                let (id, _) = text.split_once(' ').unwrap();
                write_private(&current, format!("{id} {}\n", "0".repeat(64)).as_bytes());
            }
            _ => {
                let v = list(&env);
                let two = cp(&env, "show", &["2", "--json"]);
                two.expect_code(0);
                let s: Value = serde_json::from_str(&two.stdout).unwrap();
                let digest = s["entries"][0]["sha256"].as_str().unwrap().to_owned();
                assert_eq!(v["current"], 2);
                let blob = env.dir.join("checkpoints/blobs/sha256").join(&digest);
                fs::set_permissions(&blob, std::os::unix::fs::PermissionsExt::from_mode(0o600))
                    .unwrap();
                fs::write(&blob, b"9\n").unwrap();
            }
        }
        // A malformed CURRENT names no checkpoint, so checkpoint 2 itself is the newest that
        // verifies; otherwise 2 is the refused one and 1 the newest that verifies.
        let malformed = corruption == "malformed CURRENT";
        let target: u64 = if malformed { 2 } else { 1 };
        env.run_to_end(&["-n"], &["true"]).expect_code(65);
        let v = env.tool("verify", &[]);
        v.expect_code(65);
        assert!(
            v.stderr.contains(&format!(
                "newest older checkpoint that verifies is {target}"
            )),
            "{}",
            v.stderr
        );

        let l = list(&env);
        let cps = l["checkpoints"].as_array().unwrap();
        assert_eq!(cps.len(), 2, "{corruption}: {l}");
        assert_eq!(cps[0]["id"], 1);
        assert_eq!(cps[0]["verifies"], true, "{corruption}: {l}");
        if malformed {
            assert!(l["current_error"].is_string(), "{l}");
            assert_eq!(l["current"], Value::Null);
            assert_eq!(cps[1]["verifies"], true, "{l}");
        } else {
            assert_eq!(cps[1]["current"], true, "{l}");
            assert_eq!(cps[1]["verifies"], false, "{corruption}: {l}");
            assert!(cps[1]["error"].is_string());
        }
        let text = cp(&env, "list", &[]);
        text.expect_code(0);
        assert!(text.stdout.contains("verifies"), "{}", text.stdout);

        // A rollback to the refused checkpoint, or to one that does not exist, changes nothing.
        let before = snapshot(&env.dir);
        for bad in ["2", "9"] {
            if bad == "2" && malformed {
                continue;
            }
            let f = cp(&env, "rollback", &["--to", bad]);
            f.expect_code(65);
            assert!(f.stderr.contains("nothing was changed"), "{}", f.stderr);
        }
        assert_same_tree(&before, &snapshot(&env.dir));

        let epoch_before: u64 = std::fs::read(env.dir.join(".tenure/epoch"))
            .ok()
            .and_then(|b| tenure::lease::epoch::parse(&b).ok())
            .unwrap_or(0);
        let f = cp(&env, "rollback", &["--to", &target.to_string()]);
        f.expect_code(0);
        assert!(
            f.stdout.contains(&format!(
                "checkpoint {target} is current again as checkpoint 3"
            )),
            "{}",
            f.stdout
        );
        let l = list(&env);
        assert_eq!(l["current"], 3, "{l}");
        let ids: Vec<u64> = l["checkpoints"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["id"].as_u64().unwrap())
            .collect();
        // The checkpoint CURRENT named (2; with a malformed CURRENT the newest) is kept as
        // evidence; 3 is the target's files under a new epoch.
        assert!(ids.contains(&2) && ids.contains(&3), "{l}");
        let three =
            &l["checkpoints"].as_array().unwrap()[ids.iter().position(|i| *i == 3).unwrap()];
        assert_eq!(three["verifies"], true);
        assert_eq!(three["parent"], 2, "{l}");
        assert_eq!(three["files"], 1, "{l}");
        assert!(
            three["epoch"].as_u64().unwrap() > epoch_before.max(2),
            "{three}"
        );
        env.tool("verify", &[]).expect_code(0);
        assert!(
            env.events()
                .iter()
                .any(|e| e["kind"] == "checkpoint-rolled-back" && e["to"] == target),
            "{}",
            env.events_text()
        );
        // The next run recovers from the rolled-back state.
        let next = counter_run(&env);
        if corruption == "corrupt blob" {
            // Its output, `2`, is exactly the content whose blob was corrupted: the blob is
            // the refused checkpoint's evidence, never replaced, so this publish is refused
            // and its output kept (card P1); CURRENT stays the rollback's.
            next.expect_code(74);
            assert!(
                next.stderr.contains("blob digest mismatch"),
                "{}",
                next.stderr
            );
            assert_eq!(list(&env)["current"], 3);
            // The first publish of other content collects the refused checkpoint (--keep 2
            // keeps the new one and the rollback) and its corrupt blob with it.
            env.run_to_end(
                &["-n"],
                &sh(r#"echo 5 > "$TENURE_CHECKPOINT_OUT/count""#, &[]),
            )
            .expect_code(0);
            let l = list(&env);
            let ids: Vec<u64> = l["checkpoints"]
                .as_array()
                .unwrap()
                .iter()
                .map(|c| c["id"].as_u64().unwrap())
                .collect();
            assert_eq!(ids, [3, 4], "{l}");
            counter_run(&env).expect_code(0);
            assert_eq!(env.checkpoint_file("count").as_deref(), Some("6\n"));
            continue;
        }
        next.expect_code(0);
        assert_eq!(
            env.checkpoint_file("count"),
            Some(format!("{}\n", target + 1)),
            "{corruption}"
        );
        // Rolling back to the current checkpoint changes nothing.
        let before = snapshot(&env.dir.join("checkpoints"));
        let f = cp(&env, "rollback", &["--to", "4"]);
        f.expect_code(0);
        assert!(f.stdout.contains("already current"), "{}", f.stdout);
        assert_same_tree(&before, &snapshot(&env.dir.join("checkpoints")));
    }
}

/// A rollback never runs beside an owner: with the lease held it exits busy (75) and changes
/// nothing.
#[test]
fn rollback_of_an_owned_dir_is_busy() {
    let env = Env::new();
    counter_run(&env).expect_code(0);
    counter_run(&env).expect_code(0);
    let mut owner = env.run(&[], &sh(TERM_CHILD, &[]));
    env.wait_status("ready", |s| s["phase"] == "ready");
    env.wait_child_traps_term(owner.pid());
    let before = env.current_bytes();
    let f = cp(&env, "rollback", &["--to", "1"]);
    f.expect_code(75);
    assert!(
        f.stderr.contains("is owned; nothing was changed"),
        "{}",
        f.stderr
    );
    assert_eq!(env.current_bytes(), before);
    owner.say("");
    owner.wait().expect_code(3);
    // `show` of a checkpoint lists its files.
    let s = cp(&env, "show", &["1"]);
    s.expect_code(0);
    assert!(s.stdout.contains("count"), "{}", s.stdout);
    assert!(s.stdout.contains("checkpoint 1: verifies"), "{}", s.stdout);
    // Kept failed-publish outputs are listed too.
    let failed = env.dir.join("checkpoints/failed/9");
    fs::create_dir_all(&failed).unwrap();
    let l = list(&env);
    assert_eq!(l["failed_publishes"][0]["epoch"], 9, "{l}");
    let text = cp(&env, "list", &[]);
    assert!(
        text.stdout.contains("failed publish of epoch 9"),
        "{}",
        text.stdout
    );
}

/// `checkpoint list --json` on a refused dir still prints JSON, with an `error` object.
#[test]
fn checkpoint_list_json_on_a_refusal() {
    let env = Env::new();
    let f = cp(&env, "list", &["--json"]);
    f.expect_code(65);
    let v: Value = serde_json::from_str(&f.stdout).unwrap();
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("does not exist"),
        "{v}"
    );
}

/// `--user nobody`: the child runs as nobody, writes its checkpoint through
/// `TENURE_CHECKPOINT_OUT`, reads the next one through `TENURE_CHECKPOINT`, and the state dir
/// stays the runner's (root's, private). Needs root; not root, `--user` is refused with a
/// clear error and exit 64, before anything on disk changes.
#[test]
fn user_nobody_writes_its_checkpoint() {
    let env = Env::new();
    if !rustix::process::geteuid().is_root() {
        let d = env.dir.display().to_string();
        let (code, _, stderr) = out(&["run", "--dir", &d, "--user", "nobody", "--", "true"]);
        assert_eq!(code, Some(64));
        assert!(stderr.contains("needs root"), "{stderr}");
        skip::skip(
            "user_nobody_writes_its_checkpoint",
            "it needs root to run a child as nobody",
        );
        return;
    }
    let script = r#"id -u > "$TENURE_CHECKPOINT_OUT/uid"
grep '^Groups:' /proc/self/status > "$TENURE_CHECKPOINT_OUT/groups"
c=0; [ -n "$TENURE_CHECKPOINT" ] && c=$(cat "$TENURE_CHECKPOINT/count")
mkdir "$TENURE_CHECKPOINT_OUT/sub" && echo $((c + 1)) > "$TENURE_CHECKPOINT_OUT/sub/../count""#;
    for round in 1..=2 {
        env.run_to_end(&["-n", "--user", "nobody"], &sh(script, &[]))
            .expect_code(0);
        assert_eq!(env.checkpoint_file("uid").as_deref(), Some("65534\n"));
        // nobody's groups, each once, and none of root's.
        let groups = env.checkpoint_file("groups").unwrap();
        let ids: Vec<&str> = groups["Groups:".len()..].split_whitespace().collect();
        assert!(ids.contains(&"65534"), "{groups}");
        assert!(!ids.contains(&"0"), "{groups}");
        let mut unique = ids.clone();
        unique.sort();
        unique.dedup();
        assert_eq!(unique.len(), ids.len(), "a group twice: {groups}");
        assert_eq!(
            env.checkpoint_file("count").as_deref(),
            Some(format!("{round}\n").as_str())
        );
    }
    // The state dir and everything in it stay root's.
    for p in [
        ".tenure",
        ".tenure/owner.json",
        "checkpoints",
        "checkpoints/CURRENT",
    ] {
        let m = fs::symlink_metadata(env.dir.join(p)).unwrap();
        assert_eq!(m.uid(), 0, "{p}");
    }
    for e in fs::read_dir(env.dir.join("checkpoints/blobs/sha256")).unwrap() {
        assert_eq!(e.unwrap().metadata().unwrap().uid(), 0);
    }
    // A group by name and numeric ids work too.
    env.run_to_end(
        &["-n", "--user", "65534:nogroup"],
        &sh(r#"id -g > "$TENURE_CHECKPOINT_OUT/gid""#, &[]),
    )
    .expect_code(0);
    assert_eq!(env.checkpoint_file("gid").as_deref(), Some("65534\n"));
    // Unknown names are usage errors naming the database.
    let d = env.dir.display().to_string();
    let (code, _, stderr) = out(&["run", "--dir", &d, "--user", "no-such-user-x", "--", "true"]);
    assert_eq!(code, Some(64));
    assert!(stderr.contains("no user \"no-such-user-x\""), "{stderr}");
    // Started as a user other than root, tenure refuses `--user` before touching anything.
    let fresh = Env::new();
    let o = tenure()
        .arg("run")
        .arg("--dir")
        .arg(&fresh.dir)
        .args(["--user", "nobody", "--", "true"])
        .uid(65534)
        .gid(65534)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(64), "{stderr}");
    assert!(stderr.contains("needs root"), "{stderr}");
    assert!(!fresh.dir.exists());
}

/// `run`, `init` and `up` of a state dir whose path is not UTF-8: refused (65) with a message
/// naming the dir and the fix, nothing created. They used to panic (exit 101) inside the
/// acquisition, after creating the dir, `.tenure/` and its lock file (`up` reported the
/// owner's panic as `spawn_failed`).
#[test]
fn a_state_dir_path_that_is_not_utf8_is_refused_not_a_panic() {
    use std::ffi::OsStr;
    use std::os::unix::ffi::OsStrExt;
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join(OsStr::from_bytes(b"state-\xff"));
    let cases: &[&[&str]] = &[
        &["run", "--", "true"],
        &["init"],
        &["up", "--wait", "20", "--", "sleep", "1000"],
    ];
    for args in cases {
        let o = tenure()
            .arg(args[0])
            .arg("--dir")
            .arg(&dir)
            .args(&args[1..])
            .stdin(Stdio::null())
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(65), "{args:?}: {err}");
        assert!(err.contains("not valid UTF-8"), "{args:?}: {err}");
        assert!(
            err.contains("state-"),
            "{args:?}: the message names the dir: {err}"
        );
        assert!(!err.contains("panicked"), "{args:?}: {err}");
        assert!(!dir.exists(), "{args:?} created {}", dir.display());
    }
}

/// Executables whose path is not UTF-8 never panic the runner (records hold a path as text).
/// A workload started from such a path runs, and its run ends in order: only its registry entry
/// is missing, with a warning that says why. A runner started from such a path refuses before
/// it writes any record (it could not record itself as the owner), naming the path and the fix.
/// Both used to panic (exit 101): the workload's after it had been spawned, with the lease held.
#[test]
fn an_executable_path_that_is_not_utf8_never_panics_the_runner() {
    use std::ffi::OsStr;
    use std::os::unix::ffi::OsStrExt;
    let env = Env::new();
    let bad = env.tmp.path().join(OsStr::from_bytes(b"bin-\xff"));
    fs::create_dir(&bad).unwrap();
    // A copy of sleep: the runner reads the child's identity right after the spawn, and a
    // child already gone by then (a copy of `true` on a loaded machine) has none to read, so
    // the test would not reach the registration it is about.
    let prog = bad.join("prog");
    fs::copy("/bin/sleep", &prog).unwrap();
    let f = env.run_to_end(&[], &[prog.as_os_str(), OsStr::new("2")]);
    f.expect_code(0);
    assert!(
        f.stderr.contains("cannot register the child"),
        "{}",
        f.stderr
    );
    assert!(f.stderr.contains("is not a UTF-8 path"), "{}", f.stderr);
    assert_eq!(f.end()["summary"], "exited/0");
    env.run_to_end(&["-n"], &["true"]).expect_code(0);

    // The runner itself under such a path: a link to the binary, or a copy on another
    // filesystem.
    let runner = bad.join("tenure");
    if fs::hard_link(bin(), &runner).is_err() {
        fs::copy(bin(), &runner).unwrap();
    }
    let other = env.tmp.path().join("other-state");
    let o = std::process::Command::new(&runner)
        .arg("run")
        .arg("--dir")
        .arg(&other)
        .args(["--", "true"])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_ne!(o.status.code(), Some(101), "{err}");
    assert_ne!(o.status.code(), Some(0), "{err}");
    assert!(err.contains("is not a UTF-8 path"), "{err}");
    assert!(!err.contains("panicked"), "{err}");
    assert!(
        !other.join(".tenure/owner.json").exists(),
        "an owner record was written"
    );
}

/// `status` fails closed (4, LSB "unknown", with the `error` object in JSON) on a dir the
/// runner refuses as foreign (card L8): a copy of a live owner's dir, a moved dir, derived
/// state without an identity marker. It reported them as not running (3) — for the copy with
/// the original's live owner and its workload's processes, as if they were this dir's (card
/// P4), while `stop` of the copy rightly said nothing runs there.
#[test]
fn status_fails_closed_on_a_foreign_moved_or_copied_dir() {
    let env = Env::new();
    let mut owner = env.run(&[], &sh("read _ || true", &[]));
    env.wait_status("a ready owner", |s| s["phase"] == "ready");
    let copy = env.path("copy");
    cp_a(&env.dir, &copy);
    let moved = env.path("moved");
    let foreign = env.path("foreign");
    fs::create_dir(&foreign).unwrap();
    fs::set_permissions(&foreign, fs::Permissions::from_mode(0o700)).unwrap();
    write_private(&foreign.join("data"), b"precious\n");
    for (dir, needle) in [
        (&copy, "identity mismatch"),
        (&foreign, "derived state but no identity"),
    ] {
        let before = snapshot(dir);
        let d = dir.to_str().unwrap();
        let (code, stdout, stderr) = out(&["status", "--json", "--dir", d]);
        assert_eq!(code, Some(4), "{d}: {stdout} {stderr}");
        let v: Value = serde_json::from_str(&stdout).unwrap();
        assert_eq!(v["error"]["code"], 4, "{v}");
        assert!(
            v["error"]["message"].as_str().unwrap().contains(needle),
            "{v}"
        );
        let (code, _, stderr) = out(&["status", "--dir", d]);
        assert_eq!(code, Some(4), "{d}: {stderr}");
        assert!(stderr.contains(needle), "{stderr}");
        assert_same_tree(&before, &snapshot(dir));
    }
    owner.close_stdin();
    owner.wait().expect_code(0);
    // A dir moved after its owner released.
    fs::rename(&env.dir, &moved).unwrap();
    let (code, stdout, _) = out(&["status", "--json", "--dir", moved.to_str().unwrap()]);
    assert_eq!(code, Some(4), "{stdout}");
    assert!(stdout.contains("identity mismatch"), "{stdout}");
    // The original, where it belongs, still has its status.
    fs::rename(&moved, &env.dir).unwrap();
    assert_eq!(env.status()["phase"], "released");
}

//! The runner's publish under failure, through the built binary with the `failpoints` feature
//! (cards G4, L5, R1; invariants I8, I12): at every crash point of a publish the runner is made
//! to fail the step (`eio`) or is SIGKILLed on the spot (`kill`), and the next owner takes over.
//!
//! The failures are injected by the product's own named crash points (`TENURE_FAILPOINTS`,
//! read by the `tenure` process under test only), because a failing fsync or a crash between
//! two renames cannot be produced on demand otherwise; everything else is real.

#![cfg(feature = "failpoints")]

mod common;

use common::*;
use std::os::unix::process::ExitStatusExt;
use tenure::checkpoint::{FAILPOINTS, FAILPOINTS_AFTER_RENAME, FAILPOINTS_COPY_ONLY};

/// A state dir whose checkpoint 1 holds `a` = `old`, and CURRENT's bytes.
fn seeded() -> (Env, Vec<u8>) {
    let env = Env::new();
    env.run_to_end(&[], &sh(r#"echo old > "$TENURE_CHECKPOINT_OUT/a""#, &[]))
        .expect_code(0);
    let current = env.current_bytes().unwrap();
    (env, current)
}

/// Runs an owner whose child stages `a` = `new` and exits 0, with `point=action` armed.
fn publish_with(env: &Env, point: &str, action: &str) -> Finished {
    let mut c = tenure();
    c.arg("run")
        .arg("--dir")
        .arg(&env.dir)
        // keep 1: the publish of checkpoint 2 collects checkpoint 1, so GC points are reached.
        .args(["--keep", "1", "--"])
        .args(sh(r#"echo new > "$TENURE_CHECKPOINT_OUT/a""#, &[]))
        .env("TENURE_FAILPOINTS", format!("{point}={action}"));
    // The one small file takes the batch's syncfs; for the large-blob fsync it is made large.
    if point == "publish.blob.fsync" {
        c.env("TENURE_OWN_FSYNC_MIN", "1");
    }
    // The runner adopts the staged file; the copy's own steps are reached by copying.
    if FAILPOINTS_COPY_ONLY.contains(&point) {
        c.env("TENURE_ADOPT", "0");
    }
    let mut r = env.start(c);
    r.close_stdin();
    r.wait()
}

/// Card G4 under I/O failure: an `EIO` at any publish step ends the run with 74 and
/// `publish-failed`; the final line says truthfully what CURRENT names (unchanged before the
/// rename, the new checkpoint but not durably after it); the lease is released either way and
/// the checkpoint that CURRENT names verifies. An `EIO` during the GC after the publish is
/// reported in the log and does not fail the run.
#[test]
fn g4_publish_failure_at_every_step_is_reported_truthfully() {
    for point in FAILPOINTS {
        let (env, old) = seeded();
        let f = publish_with(&env, point, "eio");
        let renamed = FAILPOINTS_AFTER_RENAME.contains(point);
        if point.starts_with("gc.") {
            f.expect_code(0);
            let published = env.wait_event("checkpoint-published", Some(f.pid));
            assert!(!published["gc_error"].is_null(), "{point}: {published}");
        } else {
            f.expect_code(74);
            assert_eq!(f.end()["reason"], "publish-failed", "{point}");
            let last = f.stderr.lines().last().unwrap_or_default().to_owned();
            if renamed {
                assert!(
                    last.contains("CURRENT names checkpoint 2 now"),
                    "{point}: {last}"
                );
            } else {
                assert!(
                    last.contains("CURRENT is unchanged (checkpoint 1)"),
                    "{point}: {last}"
                );
                assert_eq!(env.current_bytes().unwrap(), old, "{point}");
            }
        }
        // Card P1: a refused output is kept whole (the adopted file too), under its epoch.
        if !point.starts_with("gc.") {
            let kept = env.dir.join("checkpoints/failed/2/a");
            assert_eq!(
                std::fs::read_to_string(&kept).ok().as_deref(),
                Some("new\n"),
                "{point}: {}",
                kept.display()
            );
        }
        let v = env.tool("verify", &[]);
        v.expect_code(0);
        let expect = if renamed {
            "checkpoint 2 is valid"
        } else {
            "checkpoint 1 is valid"
        };
        assert!(v.stdout.contains(expect), "{point}: {}", v.stdout);
        // Released: the next owner takes over at once and reads what CURRENT names.
        let want = if renamed { "new\n" } else { "old\n" };
        assert_eq!(env.checkpoint_file("a").as_deref(), Some(want), "{point}");
    }
}

/// Cards L5 and I12 through the runner: SIGKILL at every step of a publish. The runner dies
/// without an end record; the next contender owns at once (try-once) with the next epoch;
/// CURRENT names the old checkpoint before the CURRENT rename and the new one after it, and in
/// both cases it verifies. A crash at a GC step never loses what CURRENT names (invariant I13).
#[test]
fn l5_crash_at_every_publish_step_then_takeover() {
    for point in FAILPOINTS {
        let (env, _) = seeded();
        let f = publish_with(&env, point, "kill");
        assert_eq!(
            f.status.signal(),
            Some(9),
            "{point} was not reached: {}",
            f.stderr
        );
        assert!(f.end.is_none());
        let next = env.run_to_end(&["-n"], &["true"]);
        next.expect_code(0);
        assert_eq!(next.end()["epoch"], 3, "{point}");
        env.tool("verify", &[]).expect_code(0);
        let want = if FAILPOINTS_AFTER_RENAME.contains(point) {
            "new\n"
        } else {
            "old\n"
        };
        assert_eq!(env.checkpoint_file("a").as_deref(), Some(want), "{point}");
    }
}

/// Issue 14: on a filesystem that refuses `renameat2(RENAME_NOREPLACE)` with `EINVAL` (NFS,
/// many FUSE filesystems; forced by the crash point `rename.noreplace=einval`), a first owner
/// still writes the dir's identity marker and publishes its checkpoint (blobs are renamed into
/// place without replacing), and a second owner recovers it — instead of exiting 74 with
/// "cannot rename into …/identity.json: Invalid argument". The same with hard links refused
/// too (the exclusive-copy fallback).
#[test]
fn a_filesystem_without_rename_noreplace_still_works() {
    for spec in [
        "rename.noreplace=einval",
        "rename.noreplace=einval,rename.noreplace.link=einval",
    ] {
        let env = Env::new();
        let run = |script: &str| {
            let mut c = tenure();
            c.arg("run")
                .arg("--dir")
                .arg(&env.dir)
                .arg("--")
                .args(sh(script, &[]))
                .env("TENURE_FAILPOINTS", spec);
            let mut r = env.start(c);
            r.close_stdin();
            r.wait()
        };
        run(r#"echo one > "$TENURE_CHECKPOINT_OUT/a""#).expect_code(0);
        assert!(
            env.dir.join(".tenure/identity.json").is_file(),
            "{spec}: the marker"
        );
        assert_eq!(env.checkpoint_file("a").as_deref(), Some("one\n"), "{spec}");
        run(r#"test "$(cat "$TENURE_CHECKPOINT/a")" = one && echo two > "$TENURE_CHECKPOINT_OUT/a""#)
            .expect_code(0);
        assert_eq!(env.checkpoint_file("a").as_deref(), Some("two\n"), "{spec}");
        env.tool("verify", &[]).expect_code(0);
    }
}

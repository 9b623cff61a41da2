//! Issue 10, the data path through the runner: the child's output survives every failure (card
//! P1), publish accepts only what load accepts, under the same descriptor limit (card P2), and
//! no walk recurses or holds a descriptor per level. Real runner, real children, real files.

mod common;

use common::*;
use serde_json::Value;
use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;

/// The kept output named in a failed run's stderr.
/// Publishes checkpoint 1 (`counter` = 1) in `env`; returns CURRENT's bytes.
fn seed_counter(env: &Env) -> Option<Vec<u8>> {
    env.run_to_end(
        &["-n"],
        &sh(r#"echo 1 > "$TENURE_CHECKPOINT_OUT/counter""#, &[]),
    )
    .expect_code(0);
    env.current_bytes()
}

fn kept_path(stderr: &str) -> PathBuf {
    let line = stderr
        .lines()
        .find(|l| l.contains("the child's output was kept in "))
        .unwrap_or_else(|| panic!("no kept output named:\n{stderr}"));
    let rest = line.split("kept in ").nth(1).unwrap();
    PathBuf::from(rest.split("; fix it there").next().unwrap())
}

/// The fix the failed run printed, run as a user would (through `sh -c`).
fn run_the_fix(stderr: &str) -> std::process::Output {
    let line = stderr
        .lines()
        .find(|l| l.contains("then publish it with: "))
        .unwrap();
    let cmd = line.split("then publish it with: ").nth(1).unwrap();
    let cmd = cmd.replacen("tenure ", &format!("{} ", bin()), 1);
    std::process::Command::new("sh")
        .arg("-c")
        .arg(cmd)
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

/// Card P1: a child that replaces `$TENURE_CHECKPOINT_OUT` — removes and re-creates it, or
/// writes a temp dir and renames it into place — has what the path names published.
#[test]
fn p1_a_replaced_output_dir_is_published() {
    let env = Env::new();
    env.run_to_end(
        &["-n"],
        &sh(
            r#"O="$TENURE_CHECKPOINT_OUT"; rm -rf "$O"; mkdir "$O"; echo 7 > "$O/counter""#,
            &[],
        ),
    )
    .expect_code(0);
    assert_eq!(env.checkpoint_file("counter").as_deref(), Some("7\n"));
    let f = env.run_to_end(
        &["-n"],
        &sh(
            r#"O="$TENURE_CHECKPOINT_OUT"; mkdir "$O.new" && echo 8 > "$O.new/counter" && mkdir "$O.new/sub" && echo deep > "$O.new/sub/f" && rm -rf "$O" && mv "$O.new" "$O""#,
            &[],
        ),
    );
    f.expect_code(0);
    assert!(f.stderr.contains("published"), "{}", f.stderr);
    assert_eq!(env.checkpoint_file("counter").as_deref(), Some("8\n"));
    assert_eq!(env.checkpoint_file("sub/f").as_deref(), Some("deep\n"));
}

/// Card P1: an output path replaced by a symlink is refused (74), never followed, and kept.
#[test]
fn p1_an_output_replaced_by_a_symlink_is_refused_and_kept() {
    let env = Env::new();
    let before = seed_counter(&env);
    let outside = env.path("outside");
    fs::create_dir(&outside).unwrap();
    fs::write(outside.join("secret"), b"s").unwrap();
    let f = env.run_to_end(
        &["-n"],
        &sh(
            r#"rm -rf "$TENURE_CHECKPOINT_OUT"; ln -s "$1" "$TENURE_CHECKPOINT_OUT""#,
            &[outside.to_str().unwrap()],
        ),
    );
    f.expect_code(74);
    assert!(
        f.stderr.contains("cannot publish a symlink"),
        "{}",
        f.stderr
    );
    let kept = kept_path(&f.stderr);
    assert!(kept.ends_with("checkpoints/failed/2"), "{}", kept.display());
    assert!(
        fs::symlink_metadata(&kept)
            .unwrap()
            .file_type()
            .is_symlink()
    );
    assert_eq!(env.current_bytes(), before, "CURRENT is unchanged");
    assert_eq!(fs::read(outside.join("secret")).unwrap(), b"s");
}

/// Card P1: a publish that fails (here an I/O error at the batch sync of the new blobs, as on a full disk)
/// keeps the child's output under `checkpoints/failed/<epoch>`, names it in the error and in
/// `status` (text and JSON), and the fix the message gives works; kept outputs are bounded by
/// `--keep`.
#[test]
#[cfg_attr(
    not(feature = "failpoints"),
    ignore = "needs the failpoints feature (cargo test --all-features)"
)]
fn p1_a_failed_publish_keeps_the_output_and_names_a_fix_that_works() {
    let env = Env::new();
    let failing = |n: &str| {
        let mut c = tenure();
        c.env("TENURE_FAILPOINTS", "publish.batch.syncfs=eio")
            .args(["run", "-n", "--keep", "2", "--dir"])
            .arg(&env.dir)
            .args(sh(
                r#"echo "$1" > "$TENURE_CHECKPOINT_OUT/counter"; mkdir "$TENURE_CHECKPOINT_OUT/d"; echo x > "$TENURE_CHECKPOINT_OUT/d/y""#,
                &[n],
            ));
        let f = env.start(c).wait();
        f.expect_code(74);
        f
    };
    let f = failing("41");
    assert!(f.stderr.contains("CURRENT is unchanged"), "{}", f.stderr);
    let kept = kept_path(&f.stderr);
    assert!(kept.ends_with("checkpoints/failed/1"), "{}", kept.display());
    assert_eq!(read(&kept.join("counter")), "41\n");
    assert_eq!(read(&kept.join("d/y")), "x\n");
    assert!(env.current_bytes().is_none());
    assert!(
        fs::read_dir(env.dir.join("checkpoints/staging"))
            .unwrap()
            .next()
            .is_none(),
        "the output was moved, not copied"
    );
    let end = f.end();
    assert_eq!(end["summary"], "publish-failed/74", "{end}");
    let failed_event = env
        .events()
        .into_iter()
        .find(|e| e["kind"] == "publish-failed")
        .unwrap();
    assert_eq!(failed_event["kept"], kept.display().to_string());

    let text = env.tool("status", &[]);
    assert!(
        text.stdout.contains(&format!(
            "the publish of epoch 1 failed; its output is kept in {}",
            kept.display()
        )),
        "{}",
        text.stdout
    );
    let st = env.status();
    assert_eq!(st["failed_publishes"][0]["epoch"], 1, "{st}");
    assert_eq!(
        st["failed_publishes"][0]["path"],
        kept.display().to_string(),
        "{st}"
    );

    // Bounded by --keep 2: three failures keep the newest two.
    failing("42");
    let f3 = failing("43");
    let st = env.status();
    let epochs: Vec<u64> = st["failed_publishes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["epoch"].as_u64().unwrap())
        .collect();
    assert_eq!(epochs, vec![2, 3], "{st}");
    assert!(!kept.exists(), "the oldest kept output was removed");

    // The fix printed by the last failure publishes its output.
    let out = run_the_fix(&f3.stderr);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert_eq!(env.checkpoint_file("counter").as_deref(), Some("43\n"));
    assert_eq!(env.checkpoint_file("d/y").as_deref(), Some("x\n"));
}

/// Card P1: a name the manifest cannot hold (not UTF-8) is refused with 74; the error names
/// the file where it is now kept, and after renaming it there the printed fix publishes it.
#[test]
fn p1_a_bad_name_names_the_kept_file_and_the_fix_works() {
    let env = Env::new();
    let f = env.run_to_end(
        &["-n"],
        &sh(
            r#"printf 'v\n' > "$TENURE_CHECKPOINT_OUT/$(printf 'bad\377')"; echo ok > "$TENURE_CHECKPOINT_OUT/good""#,
            &[],
        ),
    );
    f.expect_code(74);
    let kept = kept_path(&f.stderr);
    let bad = kept.join(std::ffi::OsStr::from_bytes(b"bad\xff"));
    assert!(bad.exists(), "{}", f.stderr);
    assert!(
        f.stderr.contains(&format!("{}/bad", kept.display())),
        "the error names the kept file: {}",
        f.stderr
    );
    assert!(!f.stderr.contains("staging area"), "{}", f.stderr);
    fs::rename(&bad, kept.join("bad-renamed")).unwrap();
    let out = run_the_fix(&f.stderr);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert_eq!(env.checkpoint_file("bad-renamed").as_deref(), Some("v\n"));
    assert_eq!(env.checkpoint_file("good").as_deref(), Some("ok\n"));
}

/// Card P2: what publish accepts, load accepts. A checkpoint whose manifest is larger than the
/// 8 MiB earlier versions could read (2,200 files with 4,000-byte names) publishes, verifies
/// and is recovered by the next run.
#[test]
fn p2_a_large_manifest_that_publishes_also_loads() {
    let env = Env::new();
    let script = r#"O="$TENURE_CHECKPOINT_OUT"
d="$O"
for i in 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15; do
  d="$d/$(printf '%0250d' $i)"
done
mkdir -p "$d"
i=0
while [ $i -lt 2200 ]; do echo $i > "$d/f$i"; i=$((i+1)); done
echo done > "$O/marker""#;
    env.run_to_end(&["-n"], &sh(script, &[])).expect_code(0);
    let manifests: Vec<PathBuf> = fs::read_dir(env.dir.join("checkpoints/manifests"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    let size = fs::metadata(&manifests[0]).unwrap().len();
    assert!(size > 8 << 20, "the manifest is {size} bytes");
    let v = env.tool("verify", &[]);
    v.expect_code(0);
    assert!(v.stdout.contains("2201 files"), "{}", v.stdout);
    assert_eq!(env.checkpoint_file("marker").as_deref(), Some("done\n"));
}

/// Card P2: a staging area deeper than the depth limit (256) is refused at publish with a
/// clear error, before anything durable, and kept; one exactly at the limit publishes and
/// loads.
#[test]
fn p2_deeper_than_the_limit_is_refused_at_publish() {
    let env = Env::new();
    let nest = |levels: usize| {
        format!(
            r#"d="$TENURE_CHECKPOINT_OUT"; i=1; while [ $i -lt {levels} ]; do d="$d/d"; i=$((i+1)); done; mkdir -p "$d"; echo bottom > "$d/f""#
        )
    };
    env.run_to_end(&["-n"], &sh(&nest(256), &[])).expect_code(0);
    let deep = vec!["d"; 255].join("/") + "/f";
    assert_eq!(env.checkpoint_file(&deep).as_deref(), Some("bottom\n"));
    // CURRENT, manifests and blobs; `failed/` receives the kept output.
    let durable = || {
        let mut t = env.checkpoint_tree();
        t.retain(|p, _| !p.starts_with("failed"));
        t
    };
    let before = durable();
    let f = env.run_to_end(&["-n"], &sh(&nest(257), &[]));
    f.expect_code(74);
    assert!(
        f.stderr
            .contains("257 levels deep, deeper than the 256 levels a checkpoint may nest"),
        "{}",
        f.stderr
    );
    assert_same_tree(&before, &durable());
    let kept = kept_path(&f.stderr);
    assert!(kept.join(vec!["d"; 256].join("/")).join("f").exists());
}

/// Raises nothing, lowers `RLIMIT_NOFILE` for one command: `sh -c 'ulimit -n N; exec ...'`.
fn limited(n: u32, args: &[&str], dir: &Path) -> std::process::Output {
    std::process::Command::new("sh")
        .arg("-c")
        .arg(format!("ulimit -n {n} && exec \"$0\" \"$@\""))
        .arg(bin())
        .args(
            args.iter()
                .map(|a| a.replace("{DIR}", &dir.display().to_string())),
        )
        .env_remove("TENURE_FAILPOINTS")
        .env_remove("NOTIFY_SOCKET")
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

/// Makes a chain of `levels` directories named `d` under `top` (through descriptors, since the
/// path is longer than PATH_MAX), with a file at the bottom.
fn deep_chain(top: &Path, levels: usize) {
    use rustix::fs::{CWD, Mode, OFlags, mkdirat, openat};
    let mut fd = openat(CWD, top, OFlags::DIRECTORY | OFlags::RDONLY, Mode::empty()).unwrap();
    for _ in 0..levels {
        mkdirat(&fd, "d", Mode::from_raw_mode(0o700)).unwrap();
        fd = openat(&fd, "d", OFlags::DIRECTORY | OFlags::RDONLY, Mode::empty()).unwrap();
    }
    let f = openat(
        &fd,
        "f",
        OFlags::CREATE | OFlags::WRONLY,
        Mode::from_raw_mode(0o600),
    )
    .unwrap();
    rustix::io::write(&f, b"x").unwrap();
}

/// No walk recurses or holds a descriptor per level: under `ulimit -n 64`, a 250-level
/// checkpoint publishes, verifies and is recovered (the child reads the bottom file), and a
/// leftover staging area 8,000 levels deep is cleaned by the next owner without crashing.
#[test]
fn walks_hold_few_descriptors_and_never_recurse() {
    let env = Env::new();
    let nest = r#"d="$TENURE_CHECKPOINT_OUT"; i=1; while [ $i -lt 250 ]; do d="$d/d"; i=$((i+1)); done; mkdir -p "$d"; echo bottom > "$d/f""#;
    let out = limited(
        64,
        &["run", "-n", "--dir", "{DIR}", "--", "sh", "-c", nest],
        &env.dir,
    );
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let out = limited(64, &["verify", "--dir", "{DIR}"], &env.dir);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let deep = vec!["d"; 249].join("/") + "/f";
    let read_back = format!(r#"cat "$TENURE_CHECKPOINT/{deep}" > "$1""#);
    let sink = env.path("bottom");
    let out = limited(
        64,
        &[
            "run",
            "-n",
            "--dir",
            "{DIR}",
            "--",
            "sh",
            "-c",
            &read_back,
            "sh",
            sink.to_str().unwrap(),
        ],
        &env.dir,
    );
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert_eq!(read(&sink), "bottom\n");

    // A crashed run's staging area, 8,000 levels deep.
    let leftover = env.dir.join("checkpoints/staging/0123456789abcdef");
    fs::create_dir(&leftover).unwrap();
    deep_chain(&leftover, 8000);
    let out = limited(64, &["run", "-n", "--dir", "{DIR}", "--", "true"], &env.dir);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert!(!leftover.exists());
    let st: Value = serde_json::from_slice(
        &limited(64, &["status", "--json", "--dir", "{DIR}"], &env.dir).stdout,
    )
    .unwrap();
    assert_eq!(st["checkpoint"]["state"], "valid", "{st}");
}

/// Card P1: a child that removes its output dir leaves the checkpoint as it was: the run ends
/// with the child's 0, says the checkpoint is unchanged, and CURRENT keeps its bytes (the
/// publish opens the output without a look first: a missing one is not an error).
#[test]
fn p1_an_output_dir_the_child_removed_leaves_the_checkpoint_unchanged() {
    let env = Env::new();
    let before = seed_counter(&env);
    let f = env.run_to_end(&["-n"], &sh(r#"rm -rf "$TENURE_CHECKPOINT_OUT""#, &[]));
    f.expect_code(0);
    assert!(f.stderr.contains("checkpoint unchanged"), "{}", f.stderr);
    assert_eq!(env.current_bytes(), before, "CURRENT is unchanged");
    assert_eq!(env.checkpoint_file("counter").as_deref(), Some("1\n"));
}

/// Card P1: an output dir the child replaced by a regular file or a FIFO is refused (74), named
/// by its kind, never opened for reading (a FIFO nobody writes would block), and kept under
/// `checkpoints/failed/<epoch>` as it was; CURRENT keeps its bytes.
#[test]
fn p1_an_output_replaced_by_a_file_or_fifo_is_refused_and_kept() {
    for (make, kind) in [
        (r#"echo x > "$TENURE_CHECKPOINT_OUT""#, "regular file"),
        (r#"mkfifo "$TENURE_CHECKPOINT_OUT""#, "fifo"),
    ] {
        let env = Env::new();
        let before = seed_counter(&env);
        let script = format!(r#"rm -rf "$TENURE_CHECKPOINT_OUT"; {make}"#);
        let f = env.run_to_end(&["-n"], &sh(&script, &[]));
        f.expect_code(74);
        assert!(
            f.stderr.contains(&format!("cannot publish a {kind}")),
            "{kind}: {}",
            f.stderr
        );
        let kept = kept_path(&f.stderr);
        assert!(kept.ends_with("checkpoints/failed/2"), "{}", kept.display());
        let ft = fs::symlink_metadata(&kept).unwrap().file_type();
        let want = if kind == "fifo" {
            std::os::unix::fs::FileTypeExt::is_fifo(&ft)
        } else {
            ft.is_file()
        };
        assert!(want, "{kind}: kept as {ft:?}");
        assert_eq!(env.current_bytes(), before, "{kind}: CURRENT is unchanged");
        assert_eq!(env.checkpoint_file("counter").as_deref(), Some("1\n"));
    }
}

/// Card P1: an output dir the child replaced by a regular file is refused with a message that
/// says what is wrong (the output must be a directory), and the fix the run prints works from
/// where the file was kept: the next run publishes it. It used to say that a regular file
/// cannot be published because the staging area "may hold only regular files and
/// directories", and to print `cp -a KEPT/. …`, which fails on a file.
#[test]
fn p1_an_output_replaced_by_a_file_names_a_fix_that_works() {
    let env = Env::new();
    seed_counter(&env);
    let f = env.run_to_end(
        &["-n"],
        &sh(
            r#"rm -rf "$TENURE_CHECKPOINT_OUT"; echo 7 > "$TENURE_CHECKPOINT_OUT""#,
            &[],
        ),
    );
    f.expect_code(74);
    assert!(
        f.stderr.contains("cannot publish a regular file"),
        "{}",
        f.stderr
    );
    assert!(
        !f.stderr.contains("may hold only regular files"),
        "{}",
        f.stderr
    );
    let kept = kept_path(&f.stderr);
    assert!(fs::symlink_metadata(&kept).unwrap().is_file());
    let fix = run_the_fix(&f.stderr);
    assert!(
        fix.status.success(),
        "the fix failed: {}",
        String::from_utf8_lossy(&fix.stderr)
    );
    let name = kept.file_name().unwrap().to_str().unwrap();
    assert_eq!(env.checkpoint_file(name).as_deref(), Some("7\n"));
}

/// Card P1, a child that leaves its output beside `$TENURE_CHECKPOINT_OUT`: it moves the
/// output aside and puts a symlink in its place, and writes a `.new` it never renames into
/// place. The publish is refused (74); the symlink is kept as before, and so is everything the
/// child left beside it in `staging/`, named on stderr, in the event log and in `status`, with
/// its bytes; nothing of it stays in `staging/` for the next owner to sweep. The siblings do
/// not push older kept outputs out: `--keep` counts this run's outputs as one.
#[test]
fn p1_output_left_beside_the_output_path_is_kept_and_named() {
    let env = Env::new();
    let before = seed_counter(&env);
    // An older failure, kept: it must survive this run's siblings under the default --keep (2).
    env.run_to_end(
        &["-n"],
        &sh(
            r#"rm -rf "$TENURE_CHECKPOINT_OUT"; echo x > "$TENURE_CHECKPOINT_OUT""#,
            &[],
        ),
    )
    .expect_code(74);
    let outside = env.path("outside");
    fs::create_dir(&outside).unwrap();
    let f = env.run_to_end(
        &["-n"],
        &sh(
            r#"O="$TENURE_CHECKPOINT_OUT"; echo moved > "$O/a"; mv "$O" "$O.moved" && ln -s "$1" "$O" && mkdir "$O.new" && echo new > "$O.new/b""#,
            &[outside.to_str().unwrap()],
        ),
    );
    f.expect_code(74);
    let kept = kept_path(&f.stderr);
    assert!(
        fs::symlink_metadata(&kept)
            .unwrap()
            .file_type()
            .is_symlink(),
        "{}",
        f.stderr
    );
    let line = f
        .stderr
        .lines()
        .find(|l| l.contains("beside its output; they were kept in "))
        .unwrap_or_else(|| panic!("the siblings are not named:\n{}", f.stderr));
    let beside: Vec<PathBuf> = line
        .split("they were kept in ")
        .nth(1)
        .unwrap()
        .split(", ")
        .map(PathBuf::from)
        .collect();
    assert_eq!(beside.len(), 2, "{line}");
    let mut found: Vec<String> = beside
        .iter()
        .map(|d| {
            let names: Vec<_> = fs::read_dir(d)
                .unwrap()
                .map(|e| e.unwrap().path())
                .collect();
            assert_eq!(names.len(), 1, "{}", d.display());
            fs::read_to_string(&names[0]).unwrap()
        })
        .collect();
    found.sort();
    assert_eq!(found, ["moved\n", "new\n"]);
    // Nothing of the child's is left in staging/ (at most the parked empty spare).
    let staging: Vec<_> = fs::read_dir(env.dir.join("checkpoints/staging"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n != ".spare")
        .collect();
    assert!(staging.is_empty(), "{staging:?}");
    let events = fs::read_to_string(env.dir.join(".tenure/events.jsonl")).unwrap();
    let failed = events
        .lines()
        .rfind(|l| l.contains("\"kind\":\"publish-failed\""))
        .unwrap();
    let v: Value = serde_json::from_str(failed).unwrap();
    assert_eq!(v["kept_beside"].as_array().map(Vec::len), Some(2), "{v}");
    // status lists the older failure, both siblings and the symlink.
    let st = env.status();
    let paths: Vec<String> = st["failed_publishes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["path"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(paths.len(), 4, "{st}");
    assert!(paths[0].ends_with("checkpoints/failed/2"), "{paths:?}");
    assert!(paths.contains(&kept.display().to_string()), "{paths:?}");
    for b in &beside {
        assert!(paths.contains(&b.display().to_string()), "{paths:?}");
    }
    assert_eq!(env.current_bytes(), before, "CURRENT is unchanged");
    // The next owner recovers without touching what was kept.
    env.run_to_end(&["-n"], &sh("true", &[])).expect_code(0);
    for b in &beside {
        assert!(b.exists(), "{}", b.display());
    }
}

/// Card P1 with the files build tools leave: an output file with a second name inside the
/// output, and one with a name outside it (hard links, as `cp -al` or a cache makes), beside a
/// plain one. Everything is published and loads back; the linked files are copied, not taken
/// (the name outside keeps its mode and bytes, and shares no inode with the store), and the
/// plain file becomes a read-only blob of one name once the staging area is gone.
#[test]
fn p1_output_files_with_other_names_are_copied_and_the_rest_adopted() {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let env = Env::new();
    let outside = env.path("outside-name");
    let f = env.run_to_end(
        &["-n"],
        &sh(
            r#"O="$TENURE_CHECKPOINT_OUT"
               echo shared > "$O/a" && ln "$O/a" "$O/b"
               echo exported > "$O/c" && chmod 644 "$O/c" && ln "$O/c" "$1"
               echo plain > "$O/d""#,
            &[outside.to_str().unwrap()],
        ),
    );
    f.expect_code(0);
    assert!(f.stderr.contains("published"), "{}", f.stderr);
    for (name, want) in [
        ("a", "shared\n"),
        ("b", "shared\n"),
        ("c", "exported\n"),
        ("d", "plain\n"),
    ] {
        assert_eq!(
            env.checkpoint_file(name).as_deref(),
            Some(want),
            "{name} loads back"
        );
    }
    let out = fs::metadata(&outside).unwrap();
    assert_eq!(
        out.permissions().mode() & 0o777,
        0o644,
        "the mode given back"
    );
    assert_eq!(
        out.nlink(),
        1,
        "the staged name is gone, the store took no name"
    );
    assert_eq!(fs::read(&outside).unwrap(), b"exported\n");
    let blobs = env.dir.join("checkpoints/blobs/sha256");
    let mut seen = 0;
    for e in fs::read_dir(&blobs).unwrap() {
        let m = e.unwrap().metadata().unwrap();
        assert_ne!(m.ino(), out.ino(), "the outside name's file is not a blob");
        assert_eq!(m.permissions().mode() & 0o777, 0o400);
        assert_eq!(
            m.nlink(),
            1,
            "a blob has one name once the staging area is gone"
        );
        seen += 1;
    }
    assert_eq!(seen, 3, "three distinct contents, three blobs");
}

/// `tenure run --dir STATE ARGS -- sh -c SCRIPT` as a user other than root: root reads and
/// searches every directory whatever its mode, so only another user meets a directory its
/// child made unreadable. Run as root, the runner is nobody's in a tmp made nobody's. Its
/// trace is named here: [`Env::start`] adds one by building another command, without the uid.
fn run_unprivileged(env: &Env, args: &[&str], script: &str) -> Finished {
    use std::os::unix::process::CommandExt;
    static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let mut c = tenure();
    c.arg("run")
        .arg("--trace")
        .arg(env.path(&format!("unprivileged{n}.trace")))
        .arg("--dir")
        .arg(&env.dir)
        .args(args)
        .arg("--")
        .args(sh(script, &[]));
    if rustix::process::geteuid().is_root() {
        std::os::unix::fs::chown(env.tmp.path(), Some(65534), Some(65534)).unwrap();
        c.uid(65534).gid(65534);
    }
    let mut r = env.start(c);
    r.close_stdin();
    r.wait()
}

/// Card P1: directories a child left unreadable in its output (`chmod 000`, as test suites
/// and sandboxes do) never stop the dir. The owner gives its own directories search and
/// write permission back where it must remove or keep them: the staging area of a child that
/// exited 1 is removed (the next owner's sweep used to refuse to start, exit 74, every run
/// after), an output dir the child made unreadable is kept in `failed/<epoch>` when its
/// publish is refused (it stayed in `staging/` for the next owner to remove: lost), and an
/// older kept output holding one is pruned (the prune used to fail the keep of the new one).
#[test]
fn p1_unreadable_directories_in_the_output_never_stop_the_dir() {
    let env = Env::new();
    let unreadable = r#"O="$TENURE_CHECKPOINT_OUT"
        mkdir -p "$O/d/e" && echo deep > "$O/d/e/f" && chmod 000 "$O/d/e""#;
    // A child that fails leaves an unreadable directory behind: nothing is published, and
    // the next owner removes the area and runs.
    let f = run_unprivileged(&env, &["-n"], &format!("{unreadable}\nexit 1"));
    f.expect_code(1);
    let f = run_unprivileged(
        &env,
        &["-n"],
        r#"echo 1 > "$TENURE_CHECKPOINT_OUT/counter""#,
    );
    f.expect_code(0);
    assert!(f.stderr.contains("published"), "{}", f.stderr);
    // A child that locks its whole output (mode 000) and exits 0: the publish cannot read it,
    // so it is refused, and the output is kept where the error says, whole.
    let f = run_unprivileged(
        &env,
        &["-n"],
        &format!("{unreadable}\necho 2 > \"$O/counter\" && chmod 000 \"$O\""),
    );
    f.expect_code(74);
    let kept = kept_path(&f.stderr);
    assert!(kept.ends_with("checkpoints/failed/3"), "{}", f.stderr);
    assert_eq!(fs::read(kept.join("counter")).unwrap(), b"2\n");
    // The next refused publish with `--keep 1` prunes that kept output, unreadable
    // directory and all, and keeps its own.
    let f = run_unprivileged(
        &env,
        &["-n", "--keep", "1"],
        r#"mkfifo "$TENURE_CHECKPOINT_OUT/fifo""#,
    );
    f.expect_code(74);
    let kept4 = kept_path(&f.stderr);
    assert!(kept4.ends_with("checkpoints/failed/4"), "{}", f.stderr);
    assert!(kept4.join("fifo").exists(), "{}", f.stderr);
    assert!(!kept.exists(), "failed/3 was pruned: {}", f.stderr);
    assert!(!f.stderr.contains("could not be kept"), "{}", f.stderr);
    let staging = env.dir.join("checkpoints/staging");
    let left: Vec<_> = fs::read_dir(&staging)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .filter(|n| n != ".spare")
        .collect();
    assert!(left.is_empty(), "left in staging/: {left:?}");
    let current = fs::read_to_string(env.dir.join("checkpoints/CURRENT")).unwrap();
    assert!(
        current.starts_with("00000000000000000001 "),
        "run 2's checkpoint is current: {current}"
    );
}

/// Card P1: a staged file the runner cannot read (a child's `chmod 000`, the runner not root)
/// is refused, and the error names it where it was kept, `failed/<epoch>/…`, where the fix
/// is made. It named the file in the staging area, which the keep had just renamed away.
#[test]
fn p1_an_unreadable_output_file_is_named_where_it_was_kept() {
    let env = Env::new();
    let f = run_unprivileged(
        &env,
        &["-n"],
        r#"echo x > "$TENURE_CHECKPOINT_OUT/locked" && chmod 000 "$TENURE_CHECKPOINT_OUT/locked""#,
    );
    f.expect_code(74);
    let kept = kept_path(&f.stderr);
    let named = kept.join("locked");
    assert!(
        f.stderr
            .contains(&format!("{}: Permission denied", named.display())),
        "the error names {}:\n{}",
        named.display(),
        f.stderr
    );
    assert!(!f.stderr.contains("checkpoints/staging/"), "{}", f.stderr);
    assert!(fs::symlink_metadata(&named).unwrap().is_file());
}

/// Card P1: once a refused output was renamed into `failed/`, it is kept there whatever fails
/// after — here pruning an older kept output that holds a directory of another user (a fix
/// made there with `sudo`, say). The run names where it was kept and why the prune failed; it
/// said the output "could not be kept", named the staging area it had just left, and
/// recorded that path as `kept`. Needs root, to give a directory to another user.
#[test]
fn p1_a_failed_prune_does_not_unkeep_the_new_output() {
    use std::os::unix::fs::MetadataExt;
    let env = Env::new();
    if !rustix::process::geteuid().is_root() {
        skip::skip(
            "p1_a_failed_prune_does_not_unkeep_the_new_output",
            "it needs root to give a directory to another user",
        );
        return;
    }
    let fifo = r#"mkdir "$TENURE_CHECKPOINT_OUT/sub" && mkfifo "$TENURE_CHECKPOINT_OUT/sub/f""#;
    let f = env.run_to_end(&["-n", "--keep", "1"], &sh(fifo, &[]));
    f.expect_code(74);
    let old = kept_path(&f.stderr);
    std::os::unix::fs::chown(old.join("sub"), Some(65534), Some(65534)).unwrap();
    let f = env.run_to_end(&["-n", "--keep", "1"], &sh(fifo, &[]));
    f.expect_code(74);
    assert!(!f.stderr.contains("could not be kept"), "{}", f.stderr);
    let kept = kept_path(&f.stderr);
    assert!(kept.ends_with("checkpoints/failed/2"), "{}", f.stderr);
    assert!(is_fifo(&kept.join("sub/f")), "{}", f.stderr);
    assert!(
        f.stderr.contains(&old.join("sub").display().to_string()),
        "the prune's failure is named: {}",
        f.stderr
    );
    let failed = env
        .events()
        .into_iter()
        .rfind(|e| e["kind"] == "publish-failed")
        .unwrap();
    assert_eq!(failed["kept"], kept.display().to_string(), "{failed}");
    assert_eq!(fs::metadata(old.join("sub")).unwrap().uid(), 65534);
}

/// A sparse file in the output (a database or disk image with holes) stays sparse in the
/// next run's `TENURE_CHECKPOINT`, as `cp`, `tar -S` and `rsync -S` keep holes: the view's
/// copy seeks over the zeros instead of writing them. Every run wrote the whole apparent size
/// (64 MiB here; a 2 GiB file took 2 GiB of disk and 11 s each run).
#[test]
fn a_sparse_output_file_stays_sparse_in_the_next_view() {
    let env = Env::new();
    env.run_to_end(
        &["-n"],
        &sh(
            r#"O="$TENURE_CHECKPOINT_OUT"
               printf head > "$O/img" && truncate -s 64M "$O/img" && printf tail >> "$O/img""#,
            &[],
        ),
    )
    .expect_code(0);
    let report = env.path("view-blocks");
    env.run_to_end(
        &["-n"],
        &sh(
            r#"stat -c '%s %b %B' "$TENURE_CHECKPOINT/img" > "$1"
               head -c 4 "$TENURE_CHECKPOINT/img" >> "$1"
               tail -c 4 "$TENURE_CHECKPOINT/img" >> "$1"
               cp "$TENURE_CHECKPOINT/img" "$TENURE_CHECKPOINT_OUT/img""#,
            &[report.to_str().unwrap()],
        ),
    )
    .expect_code(0);
    let text = read(&report);
    let (stat, bytes) = text.split_once('\n').unwrap();
    assert_eq!(bytes, "headtail");
    let n: Vec<u64> = stat.split(' ').map(|v| v.parse().unwrap()).collect();
    assert_eq!(n[0], 64 * 1024 * 1024 + 4, "{text}");
    let allocated = n[1] * n[2];
    assert!(
        allocated < 4 * 1024 * 1024,
        "the view's copy holds {allocated} bytes of disk for 8 bytes of data: {text}"
    );
}

/// `tenure checkpoint show` lists each file on one line whatever its name: a name with a
/// newline, an escape sequence, a quote or a backslash is shown quoted and escaped (as git
/// quotes such paths); plain names are shown as they are. A newline in a name printed a line
/// that looked like another file, and an escape sequence went to the terminal raw.
#[test]
fn checkpoint_show_quotes_names_with_control_characters() {
    let env = Env::new();
    env.run_to_end(
        &["-n"],
        &sh(
            r#"O="$TENURE_CHECKPOINT_OUT"
               echo 1 > "$O/$(printf 'a\nfake')" && echo 2 > "$O/$(printf 'red\033[31m')"
               echo 3 > "$O/plain name" && echo 4 > "$O/q\"uote""#,
            &[],
        ),
    )
    .expect_code(0);
    let o = tenure()
        .args(["checkpoint", "show", "1", "--dir"])
        .arg(&env.dir)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(o.status.success(), "{o:?}");
    let out = String::from_utf8(o.stdout).unwrap();
    assert!(!out.contains('\u{1b}'), "a raw escape: {out:?}");
    let files: Vec<&str> = out.lines().filter(|l| l.starts_with("  0")).collect();
    assert_eq!(files.len(), 4, "{out}");
    for want in [
        r#""a\nfake""#,
        r#""red\u{1b}[31m""#,
        " plain name",
        r#""q\"uote""#,
    ] {
        assert!(
            files.iter().any(|l| l.ends_with(want)),
            "no line ends with {want}: {out}"
        );
    }
}

/// Card P1 with T1: a child that exits 0 but leaves a process the stop has to SIGKILL (a
/// `setsid` grandchild ignoring TERM) is not published — the workload did not stop in order, so
/// nothing vouches that its output was complete — and its output is not lost either: it is
/// kept in `checkpoints/failed/<epoch>`, named, with a fix that publishes it. It was discarded
/// with the staging area. A child that exits 1 the same way still has its output discarded
/// (only exit 0 leaves output for a checkpoint).
#[test]
fn p1_an_exit_0_whose_tree_was_killed_keeps_its_output() {
    let env = Env::new();
    let before = seed_counter(&env);
    // $2: what the output holds (nothing if empty); $4 = file: the child replaces its output
    // directory by a file holding $2.
    let script = r#"if [ "$4" = file ]; then
  rm -rf "$TENURE_CHECKPOINT_OUT"; echo "$2" > "$TENURE_CHECKPOINT_OUT"
elif [ -n "$2" ]; then
  echo "$2" > "$TENURE_CHECKPOINT_OUT/counter"
fi
setsid sh -c 'trap "" TERM; echo $$ > "$1"; exec sleep 1000' sh "$1" &
while [ ! -s "$1" ]; do sleep 0.01; done
exit "$3""#;
    let run_as = |n: &str, code: &str, mode: &str| {
        let pidfile = env.path(&format!("gc-{n}.pid"));
        env.run_to_end(
            &["-n", "--grace", "0.5"],
            &sh(script, &[pidfile.to_str().unwrap(), n, code, mode]),
        )
    };
    let run = |n: &str, code: &str| run_as(n, code, "dir");
    let f = run("2", "0");
    f.expect_code(137);
    assert_eq!(f.end()["child"], "exited 0", "{}", f.stderr);
    assert_eq!(f.end()["summary"], "killed/SIGKILL", "{}", f.stderr);
    assert_eq!(env.current_bytes(), before, "nothing was published");
    assert!(
        f.stderr.contains("did not stop in order"),
        "the message says why: {}",
        f.stderr
    );
    let kept = kept_path(&f.stderr);
    assert!(kept.ends_with("checkpoints/failed/2"), "{}", kept.display());
    assert_eq!(fs::read(kept.join("counter")).unwrap(), b"2\n");
    assert!(
        env.kinds_of(f.pid).iter().any(|k| k == "output-kept"),
        "{:?}",
        env.kinds_of(f.pid)
    );
    assert!(
        !f.stderr.contains("beside"),
        "nothing was left beside: {}",
        f.stderr
    );

    // A main process that exited 1: nothing is kept, the staging area is removed.
    let g = run("3", "1");
    g.expect_code(137);
    assert!(!g.stderr.contains("was kept in"), "{}", g.stderr);
    assert!(!env.dir.join("checkpoints/failed/3").exists());
    assert_eq!(env.current_bytes(), before);

    // An exit 0 that left nothing in its output: nothing to keep.
    let e = run("", "0");
    e.expect_code(137);
    assert!(!e.stderr.contains("was kept in"), "{}", e.stderr);
    assert!(!env.dir.join("checkpoints/failed/4").exists());

    // An output directory replaced by a file: the file is kept, with a fix for a file.
    let h = run_as("5", "0", "file");
    h.expect_code(137);
    let file = kept_path(&h.stderr);
    assert!(file.ends_with("checkpoints/failed/5"), "{}", h.stderr);
    assert_eq!(fs::read(&file).unwrap(), b"5\n");
    assert!(h.stderr.contains("it is a file"), "{}", h.stderr);

    // The printed fix publishes what was kept.
    let out = run_the_fix(&f.stderr);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert_eq!(env.checkpoint_file("counter").as_deref(), Some("2\n"));
}

/// Card P1's refusal of a state record a child hard-linked into its output (here the epoch
/// file): the output is kept, and every later run is refused (a private record has one link)
/// until the other link is gone — so the refusal says how to find it. The `find` command it
/// prints lists the link in the kept output; once that is removed, the dir runs again.
#[test]
fn p1_a_state_record_linked_into_the_output_is_found_by_the_printed_command() {
    let env = Env::new();
    env.run_to_end(&["-n"], &["true"]).expect_code(0);
    let epoch = env.dir.join(".tenure/epoch");
    let f = env.run_to_end(
        &["-n"],
        &sh(
            r#"ln "$1" "$TENURE_CHECKPOINT_OUT/e""#,
            &[epoch.to_str().unwrap()],
        ),
    );
    f.expect_code(74);
    let kept = kept_path(&f.stderr);
    let g = env.run_to_end(&["-n"], &["true"]);
    g.expect_code(65);
    let line = g
        .stderr
        .lines()
        .find(|l| l.contains("-samefile"))
        .unwrap_or_else(|| panic!("no command to find the links: {}", g.stderr));
    let cmd = line.split('`').nth(1).unwrap();
    assert!(cmd.starts_with("find "), "{cmd}");
    let out = std::process::Command::new("sh")
        .arg("-c")
        .arg(cmd)
        .output()
        .unwrap();
    let found: Vec<PathBuf> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(PathBuf::from)
        .collect();
    assert!(found.contains(&kept.join("e")), "{cmd}: {found:?}");
    assert!(found.contains(&epoch), "{cmd}: {found:?}");
    fs::remove_file(kept.join("e")).unwrap();
    env.run_to_end(&["-n"], &["true"]).expect_code(0);
}

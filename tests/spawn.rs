//! The ways the runner starts a child (cards D3, T1): `clone3(CLONE_INTO_CGROUP)` straight
//! into the ownership's cgroup, the same `clone3` without a cgroup, and `fork` + `exec` (std)
//! entering the cgroup through `cgroup.procs` where the kernel cannot. All must behave the
//! same: the same `execvp` lookup (a script without `#!` runs with /bin/sh), the same errors
//! (`ENOENT` → 127, `EACCES` → 126), a process group of its own, the cgroup, the inherited
//! descriptor.
//!
//! The cgroup cases need a writable cgroup v2 hierarchy: without one they skip by the one rule
//! (tests/common/skip.rs: a `SKIPPED:` line, a failure under `TENURE_REQUIRE_SERVERS=1`).

mod common;

use std::ffi::OsString;
use std::fs;
use std::os::fd::{AsFd, AsRawFd};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::{Duration, Instant};
use tenure::driver::child::{Child, SpawnSpec};
use tenure::lease::cgroup::Cgroup;
use tenure::machine::{ChildStatus, ExecFailure};

fn spec(program: &Path, args: &[&str]) -> SpawnSpec {
    SpawnSpec {
        program: program.into(),
        args: args.iter().map(OsString::from).collect(),
        allow: None,
        remove: Vec::new(),
        set: vec![("SPAWN_TEST".into(), "yes".into())],
        cgroup_dir: None,
        cgroup_procs: None,
        inherit: Vec::new(),
        user: None,
        foreground: false,
    }
}

/// Writes an executable script without this process ever holding it open for writing. The tests
/// of this binary spawn children on other threads, and a child between `fork` and `exec` holds a
/// copy of every descriptor we have open: a script we were writing at that moment fails to exec
/// with `ETXTBSY`. A separate `sh` writes it instead, and is gone before we exec the script.
fn write_executable(path: &Path, text: &str) {
    use std::io::Write;
    let mut sh = std::process::Command::new("sh")
        .args(["-c", "cat > \"$1\" && chmod 700 \"$1\"", "sh"])
        .arg(path)
        .stdin(std::process::Stdio::piped())
        .spawn()
        .expect("sh");
    sh.stdin.take().unwrap().write_all(text.as_bytes()).unwrap();
    assert!(sh.wait().unwrap().success(), "writing {}", path.display());
}

fn wait_exit(c: &mut Child) -> ChildStatus {
    let end = Instant::now() + Duration::from_secs(20);
    loop {
        c.pump_stderr(false);
        if let Some(s) = c.try_reap().unwrap() {
            return s;
        }
        assert!(Instant::now() < end, "the child did not exit");
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// A cgroup for the test, or `None` after the skip rule.
fn cgroup(name: &str) -> Option<Cgroup> {
    match Cgroup::create(&format!("tenure-test-{}-{name}", std::process::id())) {
        Ok(c) => Some(c),
        Err(e) => {
            common::skip::skip(&format!("spawn {name} (needs a cgroup)"), &e.to_string());
            None
        }
    }
}

/// Runs the checks with `configure` applied to every spec (one way of spawning).
fn same_behaviour(dir: &Path, configure: &dyn Fn(&mut SpawnSpec), cg: Option<&Cgroup>) {
    let out = dir.join("out");
    // A script without `#!`: `execvp` runs it with /bin/sh.
    let script = dir.join("no-shebang");
    write_executable(
        &script,
        "echo \"$SPAWN_TEST $$ $(cut -d' ' -f5 /proc/$$/stat) $(grep ^0:: /proc/$$/cgroup)\" > \"$1\"\n",
    );
    let mut s = spec(&script, &[out.to_str().unwrap()]);
    configure(&mut s);
    let mut c = Child::spawn(&s).expect("spawn a script without #!");
    let pid = c.pid();
    assert_eq!(wait_exit(&mut c), ChildStatus::Exited(0));
    let line = fs::read_to_string(&out).unwrap();
    let fields: Vec<&str> = line.split_whitespace().collect();
    assert_eq!(
        fields[0], "yes",
        "the environment reached the child: {line}"
    );
    assert_eq!(fields[1], pid.to_string());
    assert_eq!(
        fields[2],
        pid.to_string(),
        "a process group of its own: {line}"
    );
    if let Some(cg) = cg {
        let name = cg.path().file_name().unwrap().to_str().unwrap();
        assert!(line.contains(name), "the child was in the cgroup: {line}");
    }

    let mut s = spec(&dir.join("missing"), &[]);
    configure(&mut s);
    let e = Child::spawn(&s).err().expect("a missing program fails");
    assert_eq!((e.failure, e.errno), (ExecFailure::NotFound, "ENOENT"));

    let not_exec = dir.join("not-executable");
    fs::write(&not_exec, "true\n").unwrap();
    fs::set_permissions(&not_exec, fs::Permissions::from_mode(0o600)).unwrap();
    let mut s = spec(&not_exec, &[]);
    configure(&mut s);
    let e = Child::spawn(&s).err().expect("a file without x fails");
    assert_eq!((e.failure, e.errno), (ExecFailure::NotExecutable, "EACCES"));

    // The child starts with no signal blocked and SIGPIPE at its default action, although the
    // test harness ignores SIGPIPE and the clone3 path blocks every signal in the parent while
    // the child (sharing its memory) resets handlers (issue 11).
    let mut s = spec(
        Path::new("sh"),
        &[
            "-c",
            r#"exec grep -E '^Sig(Blk|Ign):' /proc/self/status > "$1""#,
            "sh",
        ],
    );
    s.args.push(out.clone().into());
    configure(&mut s);
    let mut c = Child::spawn(&s).expect("spawn sh to read its signal state");
    assert_eq!(wait_exit(&mut c), ChildStatus::Exited(0));
    let status = fs::read_to_string(&out).unwrap();
    let mask = |name: &str| {
        let hex = status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .unwrap_or_else(|| panic!("no {name} in {status}"));
        u64::from_str_radix(hex.trim(), 16).unwrap()
    };
    assert_eq!(
        mask("SigBlk:"),
        0,
        "no signal blocked in the child: {status}"
    );
    assert_eq!(
        mask("SigIgn:") & (1 << (libc::SIGPIPE - 1)),
        0,
        "SIGPIPE at its default in the child: {status}"
    );

    // `PATH` lookup and the inherited descriptor (kept across exec, at the same number).
    let held = fs::File::open(&script).unwrap();
    let dup = rustix::io::fcntl_dupfd_cloexec(held.as_fd(), 3).unwrap();
    let mut s = spec(
        Path::new("sh"),
        &["-c", r#"[ -e /proc/$$/fd/$1 ] && echo kept > "$2""#, "sh"],
    );
    s.args.push(dup.as_raw_fd().to_string().into());
    s.args.push(out.clone().into());
    s.inherit = vec![dup.as_raw_fd()];
    configure(&mut s);
    let mut c = Child::spawn(&s).expect("spawn sh from PATH");
    assert_eq!(wait_exit(&mut c), ChildStatus::Exited(0));
    assert_eq!(fs::read_to_string(&out).unwrap(), "kept\n");
}

/// Without a cgroup: the same `clone3` (memory shared until the exec), without
/// `CLONE_INTO_CGROUP`.
#[test]
fn clone3_without_a_cgroup() {
    let tmp = tempfile::tempdir().unwrap();
    same_behaviour(tmp.path(), &|_| {}, None);
}

#[test]
fn clone3_into_the_cgroup() {
    let Some(cg) = cgroup("clone3") else { return };
    let tmp = tempfile::tempdir().unwrap();
    let dir = cg.dir_fd().as_raw_fd();
    let procs = cg.procs_fd().as_raw_fd();
    same_behaviour(
        tmp.path(),
        &|s| {
            s.cgroup_dir = Some(dir);
            s.cgroup_procs = Some(procs);
        },
        Some(&cg),
    );
    cg.remove().unwrap();
}

/// The fallback where the kernel has no `CLONE_INTO_CGROUP`: fork, then `cgroup.procs`.
#[test]
fn fork_into_the_cgroup_through_cgroup_procs() {
    let Some(cg) = cgroup("procs") else { return };
    let tmp = tempfile::tempdir().unwrap();
    let procs = cg.procs_fd().as_raw_fd();
    same_behaviour(tmp.path(), &|s| s.cgroup_procs = Some(procs), Some(&cg));
    cg.remove().unwrap();
}

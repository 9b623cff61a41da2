//! Card H7, the candidate's side: a run waiting on a state dir that is replaced meanwhile
//! refuses it instead of initialising it (the owner's side is in runner_signals.rs). Real
//! runner, real child, real renames.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const DEADLINE: Duration = Duration::from_secs(20);

fn tenure() -> Command {
    Command::new(env!("CARGO_BIN_EXE_tenure"))
}

fn owner(dir: &Path) -> Child {
    tenure()
        .args(["run", "--grace", "5", "--dir"])
        .arg(dir)
        .args([
            "--",
            "sh",
            "-c",
            "trap 'exit 0' TERM; while :; do sleep 0.02; done",
        ])
        .stdin(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// Waits until the event log of `dir` has a line of `kind` (an event wait, not a sleep).
fn wait_event(dir: &Path, kind: &str) {
    let log = dir.join(".tenure/events.jsonl");
    let start = Instant::now();
    loop {
        if let Ok(text) = std::fs::read_to_string(&log)
            && text
                .lines()
                .any(|l| l.contains(&format!("\"kind\":\"{kind}\"")))
        {
            return;
        }
        assert!(
            start.elapsed() < DEADLINE,
            "no `{kind}` event in {}",
            log.display()
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn wait_exit(c: &mut Child) -> (i32, String) {
    let start = Instant::now();
    loop {
        if let Some(st) = c.try_wait().unwrap() {
            let mut err = String::new();
            use std::io::Read;
            c.stderr.take().unwrap().read_to_string(&mut err).unwrap();
            return (st.code().unwrap_or(-1), err);
        }
        assert!(start.elapsed() < DEADLINE, "the runner did not exit");
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn state(tmp: &tempfile::TempDir) -> PathBuf {
    tmp.path().join("state")
}

/// Card H7: a candidate waiting on the dir when it is replaced refuses to go on with it, and
/// the replacement at the path is left as it is (not initialised).
#[test]
fn h7_candidate_refuses_a_replaced_dir() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = state(&tmp);
    let mut a = owner(&dir);
    wait_event(&dir, "ready");
    let mut b = owner(&dir);
    wait_event(&dir, "waiting");
    let moved = tmp.path().join("moved");
    std::fs::rename(&dir, &moved).unwrap();
    std::fs::create_dir(&dir).unwrap();
    let (code_a, err_a) = wait_exit(&mut a);
    assert_eq!(code_a, 65, "{err_a}");
    let (code_b, err_b) = wait_exit(&mut b);
    assert_eq!(code_b, 65, "the candidate must refuse: {err_b}");
    assert!(err_b.contains("moved or replaced"), "{err_b}");
    assert_eq!(
        std::fs::read_dir(&dir).unwrap().count(),
        0,
        "the replacement dir was initialised"
    );
}

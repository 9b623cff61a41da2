//! Shared helpers of the runner's integration tests: they run the built `tenure` binary against
//! real state dirs in temporary directories, with real child processes and real signals.
//!
//! Synchronisation is always an *event wait* with a generous deadline (the CI machine is a
//! loaded 2-core box): a line in the event log, a phase in `tenure status --json`, a child
//! blocked in a FIFO open, a process exit. A bare sleep is used only to show that something does
//! *not* happen within a window, and says so where it is used.
//!
//! Every finished run is checked for run accounting (card R1, invariant I10) and against the
//! models, whatever the test itself asserts:
//! - every `tenure run` is started with `--trace` (unless the test passes its own), and its trace
//!   must conform to the models' step relation (`tenure_models::trace`); a run that exited by
//!   itself must have reached `Exit` with exactly the process's exit code;
//! - a `tenure run` that wrote any event-log line wrote exactly one `end` line, as its last
//!   line, with the exit code and the trace's outcome; a process killed by a signal wrote none.

#![allow(dead_code)]

#[cfg(feature = "etcd")]
pub mod etcd;
pub mod fuse;
pub mod hostile;
pub mod skip;

use rustix::process::{Pid, Signal};
use serde_json::Value;
use std::collections::BTreeMap;
use std::ffi::OsStr;
use std::fs::{self, File};
use std::io::{Read, Write};
use std::os::unix::fs::{FileTypeExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// How long any event wait may take before the test fails.
pub const DEADLINE: Duration = Duration::from_secs(20);
/// How long a run may take to exit once it was told to.
pub const EXIT_DEADLINE: Duration = Duration::from_secs(30);
/// How often the waits look again.
const POLL: Duration = Duration::from_millis(5);

/// The built binary.
pub fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_tenure")
}

/// A `tenure` command with a clean, predictable environment for the things tenure reads.
pub fn tenure() -> Command {
    let mut c = Command::new(bin());
    c.env_remove("NOTIFY_SOCKET")
        .env_remove("TENURE_FAILPOINTS")
        .env_remove("TENURE_CHECKPOINT")
        // The default of `--dir`: a test that means it sets it itself.
        .env_remove("TENURE_DIR");
    c
}

/// Polls `probe` until it returns `Some`, or fails the test after `deadline` with `what` and the
/// context `explain` gives (e.g. the event log so far).
pub fn wait_for<T>(
    what: &str,
    deadline: Duration,
    mut probe: impl FnMut() -> Option<T>,
    explain: impl Fn() -> String,
) -> T {
    let end = Instant::now() + deadline;
    loop {
        if let Some(v) = probe() {
            return v;
        }
        if Instant::now() >= end {
            panic!(
                "timed out after {:.0?} waiting for {what}\n{}",
                deadline,
                explain()
            );
        }
        std::thread::sleep(POLL);
    }
}

/// Sends `sig` to `pid` (a real signal through kill(2)).
pub fn send(pid: u32, sig: Signal) {
    rustix::process::kill_process(Pid::from_raw(pid as i32).expect("positive pid"), sig)
        .unwrap_or_else(|e| panic!("cannot send {sig:?} to {pid}: {e}"));
}

/// The state letter of `/proc/PID/stat` (`R`, `S`, `D`, `Z`, ...), `None` when gone.
pub fn proc_state(pid: u32) -> Option<char> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after = &stat[stat.rfind(')')? + 1..];
    after.trim_start().chars().next()
}

/// Whether `pid` is a running (not zombie) process.
pub fn alive(pid: u32) -> bool {
    !matches!(proc_state(pid), None | Some('Z') | Some('X'))
}

/// Field 22 of `/proc/PID/stat` (the start time in clock ticks since boot).
pub fn start_time(pid: u32) -> u64 {
    try_start_time(pid).unwrap_or_else(|| panic!("process {pid} does not exist"))
}

/// Field 22 of `/proc/PID/stat`, `None` when the process is gone.
pub fn try_start_time(pid: u32) -> Option<u64> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after = &stat[stat.rfind(')')? + 2..];
    after.split(' ').nth(19)?.parse().ok()
}

/// Waits until `pid` is blocked opening a FIFO (the kernel's `wait_for_partner`), which is how
/// the tests know a child reached its gate.
pub fn wait_blocked_in_fifo_open(pid: u32) {
    wait_for(
        &format!("process {pid} to block opening a FIFO"),
        DEADLINE,
        || {
            let wchan = fs::read_to_string(format!("/proc/{pid}/wchan")).ok()?;
            let syscall = fs::read_to_string(format!("/proc/{pid}/syscall")).unwrap_or_default();
            // `wchan` names the wait; `syscall` (the openat number) is a fallback where wchan
            // is hidden.
            let openat = if cfg!(target_arch = "aarch64") {
                "56"
            } else {
                "257"
            };
            let blocked =
                wchan.trim() == "wait_for_partner" || syscall.split(' ').next() == Some(openat);
            (blocked && proc_state(pid) == Some('S')).then_some(())
        },
        || {
            format!(
                "state {:?}, wchan {:?}",
                proc_state(pid),
                fs::read_to_string(format!("/proc/{pid}/wchan")).ok()
            )
        },
    )
}

/// Opens `fifo` for writing once a reader has it open and writes one line: releases a child
/// blocked in `read _ < fifo`.
pub fn release_fifo(fifo: &Path) {
    let mut f = wait_for(
        &format!("a reader on {}", fifo.display()),
        DEADLINE,
        || {
            fs::OpenOptions::new()
                .write(true)
                .custom_flags(rustix::fs::OFlags::NONBLOCK.bits() as i32)
                .open(fifo)
                .ok()
        },
        String::new,
    );
    f.write_all(b"go\n").expect("write to the FIFO");
}

/// Makes a FIFO.
/// `cp -a FROM TO`: a copy of a dir with its modes, owners and times (as an operator copies a
/// state dir).
pub fn cp_a(from: &Path, to: &Path) {
    let status = std::process::Command::new("cp")
        .arg("-a")
        .arg(from)
        .arg(to)
        .status()
        .expect("cp -a");
    assert!(
        status.success(),
        "cp -a {} {}",
        from.display(),
        to.display()
    );
}

pub fn mkfifo(path: &Path) {
    rustix::fs::mknodat(
        rustix::fs::CWD,
        path,
        rustix::fs::FileType::Fifo,
        rustix::fs::Mode::from_raw_mode(0o600),
        0,
    )
    .expect("mkfifo");
}

/// One entry of a tree snapshot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Node {
    /// A directory and its permission bits.
    Dir(u32),
    /// A regular file, its permission bits and bytes.
    File(u32, Vec<u8>),
    /// A symbolic link and its target.
    Link(PathBuf),
    /// Anything else (FIFO, socket, ...), by mode.
    Other(u32),
}

/// Every entry under `root` (relative paths), with modes and bytes: two equal snapshots mean
/// the tree is byte-for-byte the same.
pub fn snapshot(root: &Path) -> BTreeMap<PathBuf, Node> {
    fn walk(root: &Path, rel: &Path, out: &mut BTreeMap<PathBuf, Node>) {
        let path = root.join(rel);
        let Ok(meta) = fs::symlink_metadata(&path) else {
            return;
        };
        let mode = meta.permissions().mode() & 0o7777;
        let ft = meta.file_type();
        if ft.is_symlink() {
            out.insert(rel.into(), Node::Link(fs::read_link(&path).unwrap()));
        } else if ft.is_dir() {
            out.insert(rel.into(), Node::Dir(mode));
            let mut names: Vec<_> = fs::read_dir(&path)
                .unwrap()
                .map(|e| e.unwrap().file_name())
                .collect();
            names.sort();
            for n in names {
                walk(root, &rel.join(n), out);
            }
        } else if ft.is_file() {
            out.insert(rel.into(), Node::File(mode, fs::read(&path).unwrap()));
        } else {
            out.insert(rel.into(), Node::Other(meta.mode()));
        }
    }
    let mut out = BTreeMap::new();
    walk(root, Path::new(""), &mut out);
    out
}

/// Asserts two snapshots are equal, naming the first differing paths.
pub fn assert_same_tree(before: &BTreeMap<PathBuf, Node>, after: &BTreeMap<PathBuf, Node>) {
    let mut diffs = Vec::new();
    for (p, n) in before {
        match after.get(p) {
            None => diffs.push(format!("removed: {}", p.display())),
            Some(m) if m != n => diffs.push(format!("changed: {}", p.display())),
            Some(_) => {}
        }
    }
    for p in after.keys().filter(|p| !before.contains_key(*p)) {
        diffs.push(format!("added: {}", p.display()));
    }
    assert!(diffs.is_empty(), "the tree changed:\n{}", diffs.join("\n"));
}

/// A test's temporary area: a state dir `state/` (not created) and room for files outside it
/// (outputs, FIFOs, captured stdio).
pub struct Env {
    pub tmp: tempfile::TempDir,
    pub dir: PathBuf,
}

impl Default for Env {
    fn default() -> Self {
        Env::new()
    }
}

impl Env {
    pub fn new() -> Env {
        let tmp = tempfile::Builder::new()
            .prefix("tenure-rt-")
            .tempdir()
            .expect("tempdir");
        let dir = tmp.path().join("state");
        Env { tmp, dir }
    }

    /// A path outside the state dir.
    pub fn path(&self, name: &str) -> PathBuf {
        self.tmp.path().join(name)
    }

    /// A FIFO outside the state dir.
    pub fn fifo(&self, name: &str) -> PathBuf {
        let p = self.path(name);
        mkfifo(&p);
        p
    }

    /// Starts `tenure run --dir STATE ARGS -- CMD...` with stdin a pipe the test holds (children
    /// that `read _` wait on it), stdout and stderr captured to files.
    pub fn run<S: AsRef<OsStr>>(&self, args: &[&str], cmd: &[S]) -> Running {
        let mut c = tenure();
        c.arg("run")
            .arg("--dir")
            .arg(&self.dir)
            .args(args)
            .arg("--");
        c.args(cmd);
        self.start(c)
    }

    /// Starts any prepared `tenure` command with captured stdio. A `tenure run` without a
    /// `--trace` of its own gets one, which [`Running::wait`] checks.
    pub fn start(&self, c: Command) -> Running {
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let out = self.path(&format!("run{n}.out"));
        let err = self.path(&format!("run{n}.err"));
        let (mut c, trace) = with_trace(c, &self.path(&format!("run{n}.trace")));
        c.stdin(Stdio::piped())
            .stdout(File::create(&out).unwrap())
            .stderr(File::create(&err).unwrap());
        let mut child = c.spawn().expect("spawn tenure");
        let stdin = child.stdin.take();
        Running {
            child,
            stdin,
            out,
            err,
            trace,
            dir: self.dir.clone(),
            started: Instant::now(),
        }
    }

    /// Runs `tenure run ... -- CMD` to its end.
    pub fn run_to_end<S: AsRef<OsStr>>(&self, args: &[&str], cmd: &[S]) -> Finished {
        let mut r = self.run(args, cmd);
        r.close_stdin();
        r.wait()
    }

    /// Runs `tenure SUB --dir STATE ARGS` (status, verify, stop, init) to its end.
    pub fn tool(&self, sub: &str, args: &[&str]) -> Finished {
        let mut c = tenure();
        c.arg(sub).arg("--dir").arg(&self.dir).args(args);
        let mut r = self.start(c);
        r.close_stdin();
        r.wait()
    }

    /// `tenure status --json`, parsed. Its exit code follows LSB: 0 while a process holds the
    /// lease, 3 when nothing does (a released or never-owned dir); it is checked against the
    /// JSON's `lock_held` here, so every test that reads the status checks the code as well.
    pub fn status(&self) -> Value {
        let f = self.tool("status", &["--json"]);
        let v: Value = serde_json::from_str(&f.stdout).expect("status prints JSON");
        let want = if v["lock_held"] == true { 0 } else { 3 };
        assert_eq!(f.code, Some(want), "status failed: {}\n{v}", f.stderr);
        v
    }

    /// Waits until `tenure status --json` satisfies `pred`.
    pub fn wait_status(&self, what: &str, pred: impl Fn(&Value) -> bool) -> Value {
        let last = std::cell::RefCell::new(Value::Null);
        wait_for(
            &format!("status: {what}"),
            DEADLINE,
            || {
                // The dir may not exist yet (the runner creates it).
                if !self.dir.join(".tenure").exists() {
                    return None;
                }
                let f = self.tool("status", &["--json"]);
                let v: Value = serde_json::from_str(&f.stdout).ok()?;
                *last.borrow_mut() = v.clone();
                pred(&v).then_some(v)
            },
            || format!("{}\nevents:\n{}", last.borrow(), self.events_text()),
        )
    }

    /// The event log's lines (a partly written last line is skipped).
    pub fn events(&self) -> Vec<Value> {
        fs::read(self.dir.join(".tenure/events.jsonl"))
            .map(|b| {
                b.split(|c| *c == b'\n')
                    .filter_map(|l| serde_json::from_slice(l).ok())
                    .collect()
            })
            .unwrap_or_default()
    }

    /// The event log as text, for failure messages.
    pub fn events_text(&self) -> String {
        fs::read_to_string(self.dir.join(".tenure/events.jsonl")).unwrap_or_default()
    }

    /// The kinds of the lines written by `pid`, in order.
    pub fn kinds_of(&self, pid: u32) -> Vec<String> {
        self.events()
            .iter()
            .filter(|e| e["pid"] == pid)
            .map(|e| e["kind"].as_str().unwrap_or_default().to_owned())
            .collect()
    }

    /// Waits until the event log has a line of `kind` (written by `pid` when given) and returns
    /// it.
    pub fn wait_event(&self, kind: &str, pid: Option<u32>) -> Value {
        wait_for(
            &format!("event `{kind}` from {pid:?}"),
            DEADLINE,
            || {
                self.events()
                    .into_iter()
                    .find(|e| e["kind"] == kind && pid.is_none_or(|p| e["pid"] == p))
            },
            || format!("events so far:\n{}", self.events_text()),
        )
    }

    /// Waits until the child that run `runner` spawned catches SIGTERM (its handler is set: bit
    /// 15 of `SigCgt` in /proc/PID/status). Ready comes at the exec, before a shell child such
    /// as [`TERM_CHILD`] has read its script: a test that stops the child right after ready
    /// must wait for this, or its SIGTERM can end the shell before the trap is set (exit 143,
    /// nothing published).
    pub fn wait_child_traps_term(&self, runner: u32) {
        let child = self.wait_event("spawned", Some(runner))["child_pid"]
            .as_u64()
            .expect("child_pid");
        let status = format!("/proc/{child}/status");
        wait_for(
            "the child's SIGTERM trap",
            DEADLINE,
            || {
                let text = std::fs::read_to_string(&status).ok()?;
                let mask = text.lines().find_map(|l| l.strip_prefix("SigCgt:"))?;
                let mask = u64::from_str_radix(mask.trim(), 16).ok()?;
                (mask & (1 << (15 - 1)) != 0).then_some(())
            },
            || {
                format!(
                    "{status} has no SIGTERM handler
{}",
                    self.events_text()
                )
            },
        );
    }

    /// The owner record's bytes.
    pub fn owner_bytes(&self) -> Vec<u8> {
        fs::read(self.dir.join(".tenure/owner.json")).expect("owner record")
    }

    /// The owner record, decoded from either format of its file.
    pub fn owner_record(&self) -> tenure::lease::OwnerRecord {
        tenure::lease::record::decode_owner(&self.owner_bytes())
            .expect("a valid owner record")
            .expect("an owner record")
    }

    /// CURRENT's bytes, if any.
    pub fn current_bytes(&self) -> Option<Vec<u8>> {
        fs::read(self.dir.join("checkpoints/CURRENT")).ok()
    }

    /// The checkpoint store's durable part (CURRENT, manifests, blobs), for byte comparisons
    /// that ignore the scratch areas (views, staging) a run may use.
    pub fn checkpoint_tree(&self) -> BTreeMap<PathBuf, Node> {
        snapshot(&self.dir.join("checkpoints"))
            .into_iter()
            .filter(|(p, _)| !p.starts_with("views") && !p.starts_with("staging"))
            .collect()
    }

    /// The signals run `pid` forwarded to its child, in order (`signal-forwarded` lines).
    pub fn forwarded(&self, pid: u32) -> Vec<String> {
        self.events()
            .iter()
            .filter(|e| e["pid"] == pid && e["kind"] == "signal-forwarded")
            .map(|e| e["signal"].as_str().unwrap_or_default().to_owned())
            .collect()
    }

    /// Every file (not directory) the checkpoint store holds outside its durable part (CURRENT,
    /// manifests, blobs): what runs left in views, staging or any other scratch area. Fails if
    /// the store itself is missing, so a renamed directory cannot make the answer vacuous.
    pub fn scratch_left(&self) -> Vec<PathBuf> {
        let store = self.dir.join("checkpoints");
        assert!(
            store.join("CURRENT").is_file(),
            "no checkpoint store with a CURRENT at {}",
            store.display()
        );
        snapshot(&store)
            .into_iter()
            .filter(|(p, n)| {
                let durable = ["CURRENT", "manifests", "blobs"]
                    .iter()
                    .any(|d| p.starts_with(d));
                !durable && !matches!(n, Node::Dir(_))
            })
            .map(|(p, _)| p)
            .collect()
    }

    /// Reads a file of the current checkpoint by running a child that copies it out of its
    /// read-only view (through the runner, so the read goes through the real recovery).
    pub fn checkpoint_file(&self, name: &str) -> Option<String> {
        let out = self.path("checkpoint-file.out");
        let _ = fs::remove_file(&out);
        let f = self.run_to_end(
            &["-n"],
            &[
                "sh",
                "-c",
                r#"if [ -n "$TENURE_CHECKPOINT" ] && [ -f "$TENURE_CHECKPOINT/$1" ]; then cat "$TENURE_CHECKPOINT/$1" > "$2"; fi"#,
                "sh",
                name,
                out.to_str().unwrap(),
            ],
        );
        assert_eq!(
            f.code,
            Some(0),
            "reading the checkpoint failed: {}",
            f.stderr
        );
        fs::read_to_string(&out).ok()
    }
}

static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);

/// For a `tenure run` command: the same command with `--trace PATH` added unless it has a
/// `--trace` already, and the trace file it writes. Other commands are returned unchanged.
fn with_trace(c: Command, path: &Path) -> (Command, Option<PathBuf>) {
    let args: Vec<&OsStr> = c.get_args().collect();
    if args.first() != Some(&OsStr::new("run")) {
        return (c, None);
    }
    let options = args.iter().take_while(|a| **a != "--");
    if let Some(i) = options.clone().position(|a| *a == "--trace") {
        let own = args.get(i + 1).map(PathBuf::from);
        return (c, own);
    }
    let mut t = Command::new(c.get_program());
    t.arg("run").arg("--trace").arg(path).args(&args[1..]);
    for (k, v) in c.get_envs() {
        match v {
            Some(v) => t.env(k, v),
            None => t.env_remove(k),
        };
    }
    if let Some(d) = c.get_current_dir() {
        t.current_dir(d);
    }
    (t, Some(path.to_path_buf()))
}

/// Checks a run's trace against the models' step relation and returns its summary; the run
/// ended with `status`. A run killed by a signal may have been cut mid-line: only a complete
/// line counts.
pub fn check_trace(path: &Path, status: ExitStatus) -> tenure_models::trace::Summary {
    let mut text = fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("the run wrote no trace {}: {e}", path.display()));
    if status.signal().is_some() && !text.ends_with('\n') {
        text.truncate(text.rfind('\n').map_or(0, |i| i + 1));
    }
    let summary = tenure_models::trace::check_str(&text).unwrap_or_else(|v| {
        panic!(
            "the run's trace {} does not conform to the models: {v}\n{text}",
            path.display()
        )
    });
    if let Some(code) = status.code() {
        assert_eq!(
            summary.exit_code().map(i32::from),
            Some(code),
            "invariant I10: the trace's outcome is the exit code ({}): {text}",
            path.display()
        );
    }
    summary
}

/// A running `tenure` process. Dropping it SIGKILLs the runner if it still runs (its child dies
/// with it: the runner sets the parent-death signal), so a failed test leaves nothing behind.
pub struct Running {
    pub child: Child,
    stdin: Option<ChildStdin>,
    out: PathBuf,
    err: PathBuf,
    trace: Option<PathBuf>,
    dir: PathBuf,
    pub started: Instant,
}

impl Running {
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Sends a real signal to the runner.
    pub fn signal(&self, sig: Signal) {
        send(self.pid(), sig);
    }

    /// Writes a line to the runner's stdin, which its child inherits (a child blocked in
    /// `read _` goes on).
    pub fn say(&mut self, line: &str) {
        let s = self.stdin.as_mut().expect("stdin still open");
        s.write_all(line.as_bytes()).unwrap();
        s.write_all(b"\n").unwrap();
        s.flush().unwrap();
    }

    /// Closes the runner's stdin (a child blocked in `read _` sees end of file).
    pub fn close_stdin(&mut self) {
        self.stdin = None;
    }

    /// Whether the runner still runs.
    pub fn running(&mut self) -> bool {
        self.child.try_wait().expect("try_wait").is_none()
    }

    /// What the runner wrote to stderr so far.
    pub fn stderr(&self) -> String {
        fs::read_to_string(&self.err).unwrap_or_default()
    }

    /// The run's trace file (`--trace`), if it is a `tenure run`.
    pub fn trace(&self) -> Option<&Path> {
        self.trace.as_deref()
    }

    /// Where the run's event log is to be read when it ends: the state dir it was started on
    /// was moved there meanwhile (card H7).
    pub fn log_moved_to(&mut self, dir: &Path) {
        self.dir = dir.to_path_buf();
    }

    /// Waits for the exit (failing the test after [`EXIT_DEADLINE`]) and checks the run's
    /// accounting and trace (see the module docs).
    pub fn wait(mut self) -> Finished {
        let pid = self.pid();
        let (err, dir) = (self.err.clone(), self.dir.clone());
        let child = &mut self.child;
        let status = wait_for(
            &format!("tenure (pid {pid}) to exit"),
            EXIT_DEADLINE,
            || child.try_wait().expect("try_wait"),
            || {
                format!(
                    "stderr:\n{}\nevents:\n{}",
                    fs::read_to_string(&err).unwrap_or_default(),
                    fs::read_to_string(dir.join(".tenure/events.jsonl")).unwrap_or_default()
                )
            },
        );
        let stderr = fs::read_to_string(&self.err).unwrap_or_default();
        // A usage error (64) stops before the trace is created.
        let summary = self
            .trace
            .as_deref()
            .filter(|t| status.code() != Some(64) || t.exists())
            .map(|t| check_trace(t, status));
        let mine: Vec<Value> = read_events(&self.dir)
            .into_iter()
            .filter(|e| e["pid"] == pid)
            .collect();
        let ends: Vec<&Value> = mine.iter().filter(|e| e["kind"] == "end").collect();
        assert!(
            ends.len() <= 1,
            "card R1: run {pid} has {} end records: {ends:?}",
            ends.len()
        );
        // `up` writes a `launching` line and no end (it is not a run); every `tenure run` that
        // opened the log ends it.
        let is_run = self.trace.is_some();
        if status.signal().is_some() && ends.is_empty() {
            // Killed before its end record: nothing more to check.
        } else if is_run && !mine.is_empty() {
            // A run that wrote its end record is one whose work was done; a SIGKILL can still
            // land between that write and the exit (`tenure stop` kills an owner that released
            // by itself an instant before, card P5): then too the end record is the last line.
            assert_eq!(
                mine.last().map(|e| &e["kind"]),
                Some(&Value::from("end")),
                "invariant I10: run {pid} wrote event-log lines but no end record last: {mine:?}\n{stderr}"
            );
        }
        let end = ends.first().map(|e| (*e).clone());
        if let Some(e) = &end {
            // (A run killed after its end record exits by the signal, not with the code.)
            if status.signal().is_none() {
                assert_eq!(
                    e["code"].as_i64(),
                    status.code().map(i64::from),
                    "invariant I10: the end record's code is the exit code: {e}"
                );
            }
            for field in ["reason", "summary", "code", "signal", "killed", "child"] {
                assert!(e.get(field).is_some(), "card R1: end lacks {field}: {e}");
            }
            if let Some(o) = summary.as_ref().and_then(|s| s.outcome) {
                assert_eq!(
                    e["summary"].as_str(),
                    Some(o.summary().as_str()),
                    "the end record says what the machine decided: {e}"
                );
            }
        }
        Finished {
            pid,
            status,
            code: status.code(),
            elapsed: self.started.elapsed(),
            stdout: fs::read_to_string(&self.out).unwrap_or_default(),
            stderr,
            end,
            trace: summary,
        }
    }
}

/// The event log's lines, the rotated generation first (an owner rotates the log at its end).
fn read_events(dir: &Path) -> Vec<Value> {
    ["events.jsonl.1", "events.jsonl"]
        .iter()
        .flat_map(|name| {
            fs::read(dir.join(".tenure").join(name))
                .map(|b| {
                    b.split(|c| *c == b'\n')
                        .filter_map(|l| serde_json::from_slice::<Value>(l).ok())
                        .collect::<Vec<_>>()
                })
                .unwrap_or_default()
        })
        .collect()
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// A finished `tenure` process.
#[derive(Debug)]
pub struct Finished {
    pub pid: u32,
    pub status: ExitStatus,
    /// The exit code (`None` when killed by a signal).
    pub code: Option<i32>,
    /// From spawn to the observed exit.
    pub elapsed: Duration,
    pub stdout: String,
    pub stderr: String,
    /// The run's `end` line, if it wrote one.
    pub end: Option<Value>,
    /// What the run's trace showed (a `tenure run` only), already checked against the models.
    pub trace: Option<tenure_models::trace::Summary>,
}

impl Finished {
    /// The `end` line, which every run that opened the event log writes.
    pub fn end(&self) -> &Value {
        self.end
            .as_ref()
            .unwrap_or_else(|| panic!("run {} wrote no end record\n{}", self.pid, self.stderr))
    }

    /// Asserts the exit code, showing stderr on failure.
    pub fn expect_code(&self, code: i32) -> &Self {
        assert_eq!(
            self.code,
            Some(code),
            "exit status {:?} (signal {:?}), stderr:\n{}",
            self.status,
            self.status.signal(),
            self.stderr
        );
        self
    }
}

/// A child that reports `$TENURE_EPOCH` and the counter it recovered to the file `$1`, waits
/// for a line on stdin, then stages `counter` = recovered + 1 and exits 0.
pub const COUNTER_CHILD: &str = r#"c=0
if [ -n "$TENURE_CHECKPOINT" ]; then c=$(cat "$TENURE_CHECKPOINT/counter"); fi
echo "$TENURE_EPOCH $c" >> "$1"
read _ || true
echo $((c + 1)) > "$TENURE_CHECKPOINT_OUT/counter""#;

/// A well-behaved service: waits on stdin; on SIGTERM stages `stopped` (its epoch) and exits 0.
pub const TERM_CHILD: &str = r#"trap 'echo "$TENURE_EPOCH" > "$TENURE_CHECKPOINT_OUT/stopped"; exit 0' TERM
read _
exit 3"#;

/// A child that ignores SIGTERM and waits on stdin (only SIGKILL or end of input stops it). Run
/// it with `--type notify`: it declares itself ready only once its trap is set, so a test that
/// waits for `ready` never sends a SIGTERM that beats the trap (and ends the child with 143).
pub const STUBBORN_CHILD: &str = r#"trap '' TERM
systemd-notify --ready
read _
exit 0"#;

/// `sh -c SCRIPT sh ARGS...` as a command line.
pub fn sh(script: &str, args: &[&str]) -> Vec<String> {
    let mut v = vec![
        "sh".to_owned(),
        "-c".to_owned(),
        script.to_owned(),
        "sh".to_owned(),
    ];
    v.extend(args.iter().map(|s| (*s).to_owned()));
    v
}

/// Writes a private file the way tenure's own records are written (0600, replaced by rename):
/// used to forge or corrupt records in refusal tests.
pub fn write_private(path: &Path, bytes: &[u8]) {
    let tmp = path.with_extension("forged");
    let mut f = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&tmp)
        .unwrap();
    f.write_all(bytes).unwrap();
    drop(f);
    fs::rename(&tmp, path).unwrap();
}

/// Reads a whole file as a string (panicking with the path).
pub fn read(path: &Path) -> String {
    let mut s = String::new();
    File::open(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .read_to_string(&mut s)
        .unwrap();
    s
}

/// Whether a file of this type is a FIFO (for assertions on test fixtures).
pub fn is_fifo(path: &Path) -> bool {
    fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_fifo())
}

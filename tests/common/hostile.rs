//! Hostile children: the workloads a supervisor must survive, as real processes.
//!
//! Each fixture is this very test binary, re-executed as `tenure run`'s child with a role in its
//! environment (the `#[ignore]`d test [`entry`] runs it), so the fixtures need nothing but the
//! test binary: no shell tricks, no Python, no `systemd-notify`. A fixture talks to its test
//! through two files outside the state dir:
//!
//! - a report file it appends lines to (`started PID`, `staged`, `ready-sent`,
//!   `stopping-sent`, `grandchild PID START`): the test waits for a line ([`Fixture::wait`]),
//!   an event wait, never a sleep;
//! - a gate FIFO it blocks on where a role has a pause ([`Fixture::open_gate`]).
//!
//! Every staging fixture leaves the file [`STAGED`] in `TENURE_CHECKPOINT_OUT` holding bytes that
//! are unique to the fixture ([`Fixture::staged`]), so a test can prove they were published, or
//! that nothing of them reached the store.
//!
//! A grandchild never outlives the test process: it watches the test's pid through a pidfd and
//! exits when the test does, and dropping the [`Fixture`] SIGKILLs it (identity-checked by its
//! start time) if it is still there.

use super::{DEADLINE, Env, alive, release_fifo, send, try_start_time, wait_for};
use std::io::Write;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// The file every staging fixture leaves in `TENURE_CHECKPOINT_OUT`.
pub const STAGED: &str = "hostile";

const ROLE: &str = "TENURE_HOSTILE";
const REPORT: &str = "TENURE_HOSTILE_REPORT";
const GATE: &str = "TENURE_HOSTILE_GATE";
const STAGE: &str = "TENURE_HOSTILE_STAGE";
const WATCH: &str = "TENURE_HOSTILE_WATCH";

/// What the child does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Hostile {
    /// Stages [`STAGED`], reports `staged`, then waits with SIGTERM's default disposition: the
    /// forwarded signal kills it (the runner sees "killed by signal 15").
    StagesThenDiesBySignal,
    /// Stages, reports `staged`, waits for SIGTERM and then exits with this code.
    StagesThenExits(u8),
    /// Stages, reports `staged`, and swallows SIGTERM: only the SIGKILL after the grace ends it.
    StagesThenIgnoresTerm,
    /// `--ready notify` only: sends `READY=1` (reports `ready-sent`), waits for the gate, sends
    /// `STOPPING=1` itself (reports `stopping-sent`), waits for the gate again, stages and
    /// exits 0. Until the second gate opens, SIGTERM has its default disposition.
    SendsStopping,
    /// Sends `STOPPING=1` before it ever sent `READY=1` (reports `stopping-sent`), then waits
    /// with SIGTERM's default disposition, never ready.
    StopsBeforeReady,
    /// Writes `bytes` bytes to stdout and to stderr at once (far beyond a 64 KiB pipe), each
    /// between marker lines, then stages and exits with `code`.
    Floods {
        /// Bytes per stream.
        bytes: usize,
        /// The exit code.
        code: u8,
    },
    /// Starts a grandchild (reports `grandchild PID START`) that lives on when the child ends,
    /// then behaves like a well-behaved service: on SIGTERM it stages and exits 0.
    ForksGrandchild {
        /// The grandchild calls `setsid` (a new session and process group).
        setsid: bool,
        /// The grandchild swallows SIGTERM.
        ignores_term: bool,
    },
}

impl Hostile {
    fn role(self) -> String {
        match self {
            Hostile::StagesThenDiesBySignal => "dies-by-signal".into(),
            Hostile::StagesThenExits(c) => format!("exits:{c}"),
            Hostile::StagesThenIgnoresTerm => "ignores-term".into(),
            Hostile::SendsStopping => "sends-stopping".into(),
            Hostile::StopsBeforeReady => "stops-before-ready".into(),
            Hostile::Floods { bytes, code } => format!("floods:{bytes}:{code}"),
            Hostile::ForksGrandchild {
                setsid,
                ignores_term,
            } => format!("forks-grandchild:{setsid}:{ignores_term}"),
        }
    }
}

/// One hostile child, prepared for one run: its command line and its report and gate files.
pub struct Fixture {
    /// What it does.
    pub kind: Hostile,
    report: PathBuf,
    gate: PathBuf,
    staged: Vec<u8>,
}

static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);

impl Fixture {
    /// A fixture whose files live in `env`'s temporary area (outside the state dir).
    pub fn new(env: &Env, kind: Hostile) -> Fixture {
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let report = env.path(&format!("hostile{n}.report"));
        std::fs::write(&report, b"").expect("create the report file");
        let gate = env.fifo(&format!("hostile{n}.gate"));
        let staged = format!(
            "{} staged by a child of test process {} (fixture {n})\n",
            kind.role(),
            std::process::id()
        )
        .into_bytes();
        Fixture {
            kind,
            report,
            gate,
            staged,
        }
    }

    /// The child's command line, for `Env::run`.
    pub fn command(&self) -> Vec<String> {
        let exe = std::env::current_exe().expect("the test binary");
        let mut c = Vec::new();
        if self.kind == Hostile::StagesThenIgnoresTerm {
            // Ignored from exec on (an ignored disposition survives exec), so a SIGTERM that
            // comes before the fixture installed its own handler does not kill it either.
            c.extend(["sh", "-c", r#"trap '' TERM; exec "$0" "$@""#].map(str::to_owned));
        }
        c.extend([
            // `env` execs the test binary, so the runner's child pid is the fixture's.
            "env".to_owned(),
            format!("{ROLE}={}", self.kind.role()),
            format!("{REPORT}={}", self.report.display()),
            format!("{GATE}={}", self.gate.display()),
            format!("{STAGE}={}", String::from_utf8_lossy(&self.staged)),
            format!("{WATCH}={}", std::process::id()),
        ]);
        c.push(exe.to_str().expect("a UTF-8 test binary path").to_owned());
        c.extend(entry_args().map(str::to_owned));
        c
    }

    /// The bytes it stages in [`STAGED`].
    pub fn staged(&self) -> &[u8] {
        &self.staged
    }

    /// The report's lines so far.
    pub fn lines(&self) -> Vec<String> {
        std::fs::read_to_string(&self.report)
            .unwrap_or_default()
            .lines()
            .map(str::to_owned)
            .collect()
    }

    /// Waits until the child reported a line starting with `what` and returns the rest of it.
    pub fn wait(&self, what: &str) -> String {
        wait_for(
            &format!("the hostile child ({:?}) to report `{what}`", self.kind),
            DEADLINE,
            || {
                self.lines()
                    .into_iter()
                    .find_map(|l| l.strip_prefix(what).map(|r| r.trim().to_owned()))
            },
            || format!("report so far: {:?}", self.lines()),
        )
    }

    /// The child's pid (from its `started` line).
    pub fn pid(&self) -> u32 {
        self.wait("started").parse().expect("a pid")
    }

    /// The grandchild's pid, once it reported itself.
    pub fn grandchild(&self) -> u32 {
        let line = self.wait("grandchild");
        line.split(' ')
            .next()
            .and_then(|p| p.parse().ok())
            .expect("grandchild PID START")
    }

    /// Lets a child blocked on its gate go on.
    pub fn open_gate(&self) {
        release_fifo(&self.gate);
    }
}

impl Drop for Fixture {
    fn drop(&mut self) {
        // A grandchild still running (the runner did not stop it) is SIGKILLed, but only if the
        // pid still names the process that reported itself (same start time).
        for line in self.lines() {
            let Some(rest) = line.strip_prefix("grandchild ") else {
                continue;
            };
            let mut it = rest.split(' ').filter_map(|x| x.parse::<u64>().ok());
            if let (Some(pid), Some(start)) = (it.next(), it.next())
                && alive(pid as u32)
                && try_start_time(pid as u32) == Some(start)
            {
                send(pid as u32, rustix::process::Signal::KILL);
            }
        }
    }
}

/// The arguments that make the test binary run [`entry`] alone.
fn entry_args() -> impl Iterator<Item = &'static str> {
    [
        "--exact",
        "common::hostile::entry",
        "--ignored",
        "--nocapture",
        "--test-threads=1",
        "--quiet",
    ]
    .into_iter()
}

/// The entry point of a hostile child (not a test of its own): does what `TENURE_HOSTILE` says
/// and exits the process.
#[test]
#[ignore = "entry point of the hostile children (tests/common/hostile.rs), run by the runner tests"]
fn entry() {
    if let Ok(role) = std::env::var(ROLE) {
        run(&role);
    }
}

fn var(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| panic!("{name} is not set"))
}

fn report(line: &str) {
    let mut f = std::fs::OpenOptions::new()
        .append(true)
        .open(var(REPORT))
        .expect("open the report file");
    // One short write with O_APPEND: lines never interleave.
    f.write_all(format!("{line}\n").as_bytes())
        .expect("append to the report file");
}

fn stage() {
    let out = PathBuf::from(var("TENURE_CHECKPOINT_OUT"));
    std::fs::write(out.join(STAGED), var(STAGE)).expect("stage the file");
    report("staged");
}

/// Blocks until the test opens the gate for writing, then reads to its end.
fn wait_gate() {
    let mut s = String::new();
    let mut f = std::fs::File::open(var(GATE)).expect("open the gate");
    let _ = std::io::Read::read_to_string(&mut f, &mut s);
}

/// Installs a SIGTERM handler (from now on SIGTERM does not kill); [`term_arrives`] waits for
/// one. Installed before the child reports anything, so a signal the test sends after a report
/// never meets the default disposition.
fn term_handler() -> signal_hook::iterator::Signals {
    signal_hook::iterator::Signals::new([signal_hook::consts::SIGTERM]).expect("a SIGTERM handler")
}

/// Blocks until a SIGTERM arrives.
fn term_arrives(mut signals: signal_hook::iterator::Signals) {
    signals.forever().next();
}

/// Swallows every SIGTERM from now on.
fn swallow_term() {
    let mut signals = signal_hook::iterator::Signals::new([signal_hook::consts::SIGTERM])
        .expect("a SIGTERM handler");
    std::thread::spawn(move || for _ in signals.forever() {});
}

fn park_forever() -> ! {
    loop {
        std::thread::park();
    }
}

fn notify(what: &str) {
    use std::os::linux::net::SocketAddrExt;
    use std::os::unix::net::{SocketAddr, UnixDatagram};
    let sock = var("NOTIFY_SOCKET");
    let addr = match sock.strip_prefix('@') {
        Some(abs) => SocketAddr::from_abstract_name(abs),
        None => SocketAddr::from_pathname(&sock),
    }
    .expect("a NOTIFY_SOCKET address");
    UnixDatagram::unbound()
        .and_then(|u| u.send_to_addr(what.as_bytes(), &addr))
        .unwrap_or_else(|e| panic!("cannot send {what} to {sock}: {e}"));
}

fn write_marked(w: &mut dyn Write, byte: u8, bytes: usize, begin: &str, end: &str) {
    let chunk = [byte; 8192];
    w.write_all(begin.as_bytes()).unwrap();
    let mut left = bytes;
    while left > 0 {
        let n = left.min(chunk.len());
        w.write_all(&chunk[..n]).unwrap();
        left -= n;
    }
    w.write_all(end.as_bytes()).unwrap();
    w.flush().unwrap();
}

fn flood(bytes: usize, code: u8) -> ! {
    // Both streams at once, from two threads: a supervisor that reads one pipe only after the
    // other is drained deadlocks here.
    let err = std::thread::spawn(move || {
        write_marked(
            &mut std::io::stderr().lock(),
            b'e',
            bytes,
            "FLOOD-ERR-BEGIN\n",
            "\nFLOOD-ERR-END\n",
        )
    });
    write_marked(
        &mut std::io::stdout().lock(),
        b'o',
        bytes,
        "FLOOD-OUT-BEGIN\n",
        "\nFLOOD-OUT-END\n",
    );
    err.join().expect("the stderr writer");
    stage();
    std::process::exit(i32::from(code))
}

fn grandchild(ignores_term: bool) -> ! {
    if ignores_term {
        swallow_term();
    }
    let me = std::process::id();
    report(&format!("grandchild {me} {}", super::start_time(me)));
    // Lives exactly as long as the test process (or until killed): never a leak.
    let watch: i32 = var(WATCH).parse().expect("the test's pid");
    let fd = rustix::process::Pid::from_raw(watch)
        .and_then(|p| rustix::process::pidfd_open(p, rustix::process::PidfdFlags::empty()).ok());
    match fd {
        Some(fd) => {
            let mut fds = [rustix::event::PollFd::new(
                &fd,
                rustix::event::PollFlags::IN,
            )];
            while rustix::event::poll(&mut fds, None).is_err() {}
            std::process::exit(0)
        }
        // The test is already gone.
        None => std::process::exit(0),
    }
}

fn forks_grandchild(setsid: bool, ignores_term: bool) -> ! {
    let term = term_handler();
    let mut c = Command::new(std::env::current_exe().expect("the test binary"));
    c.args(entry_args())
        .env(ROLE, format!("grandchild:{ignores_term}"))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    if setsid {
        // SAFETY: `setsid` is async-signal-safe and touches no memory of the parent.
        unsafe {
            c.pre_exec(|| {
                rustix::process::setsid()
                    .map(drop)
                    .map_err(std::io::Error::from)
            });
        }
    }
    let g = c.spawn().expect("spawn the grandchild");
    report(&format!("spawned-grandchild {}", g.id()));
    // The grandchild is deliberately not waited for: it outlives this process.
    std::mem::forget(g);
    term_arrives(term);
    stage();
    std::process::exit(0)
}

fn run(role: &str) -> ! {
    report(&format!("started {}", std::process::id()));
    let parts: Vec<&str> = role.split(':').collect();
    match parts.as_slice() {
        ["dies-by-signal"] => {
            stage();
            park_forever()
        }
        ["exits", code] => {
            let term = term_handler();
            stage();
            term_arrives(term);
            std::process::exit(code.parse().expect("an exit code"))
        }
        ["ignores-term"] => {
            swallow_term();
            stage();
            park_forever()
        }
        ["sends-stopping"] => {
            notify("READY=1");
            report("ready-sent");
            wait_gate();
            notify("STOPPING=1");
            report("stopping-sent");
            wait_gate();
            stage();
            std::process::exit(0)
        }
        ["stops-before-ready"] => {
            notify("STOPPING=1");
            report("stopping-sent");
            park_forever()
        }
        ["floods", bytes, code] => flood(
            bytes.parse().expect("a byte count"),
            code.parse().expect("an exit code"),
        ),
        ["forks-grandchild", setsid, ignores] => forks_grandchild(
            setsid.parse().expect("a bool"),
            ignores.parse().expect("a bool"),
        ),
        ["grandchild", ignores] => grandchild(ignores.parse().expect("a bool")),
        other => panic!("unknown hostile role {other:?}"),
    }
}

/// Whether any blob of the checkpoint store holds `bytes`: a staged file that reached the store
/// in any form (even unreferenced) is found.
pub fn store_holds(dir: &Path, bytes: &[u8]) -> bool {
    let blobs = dir.join("checkpoints/blobs");
    let mut stack = vec![blobs];
    while let Some(d) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in entries.flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else if std::fs::read(&p).is_ok_and(|b| b == bytes) {
                return true;
            }
        }
    }
    false
}

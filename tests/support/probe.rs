//! The lease probe: what a child process does when a test or the benchmark re-executes its own
//! binary with `TENURE_PROBE` set. It uses the real library against a real state dir and talks
//! to its parent through lines on stdout starting with `PROBE ` (anything else, such as the test
//! harness's own chatter, is ignored by the parent) and commands on stdin.
//!
//! Roles (arguments separated by `\x1f`, so paths may hold spaces):
//! - `hold DIR BOUND [go]`: (after reading `go` from stdin when asked) acquire with BOUND
//!   (`try`, `forever` or milliseconds); SIGTERM/SIGINT cancel the wait through a signal pipe,
//!   exactly as the runner does. Prints `PROBE waiting <message>` when it starts waiting, then
//!   `PROBE acquired <epoch>`, `PROBE busy <message>` (exit 75), `PROBE cancelled` (exit 143) or
//!   `PROBE error <message>` (exit 65). Once owning, obeys stdin: `release`, `phase <name>`,
//!   `exit` (exit without releasing, leaving the record behind); end of input releases.
//! - `stress DIR LOGDIR MODE`: wait for `go`, acquire (`try` or `wait`), and prove exclusivity:
//!   create `LOGDIR/inside` exclusively (an existing one means two owners at once: `OVERLAP` is
//!   logged), append `B pid epoch` and `E pid epoch` lines to `LOGDIR/log`, remove `inside`,
//!   release. In `try` mode the winner holds until stdin says `release`, so a round has exactly
//!   one owner; in `waithold` mode every contender waits its turn, says `acquired <epoch>` and
//!   holds until stdin says `release`, so the test decides when each ownership ends.
//! - `sigwatch FILE`: record every TERM, INT, HUP, USR1 and USR2 it receives into FILE (it never
//!   dies of them), print `PROBE ready`, and exit 0 when stdin closes.
//! - `raw DIR`: the floor for the handoff benchmark: open `DIR/.tenure/lock`, block in a plain
//!   `flock(LOCK_EX)` (after printing `PROBE blocking`), print `PROBE acquired 0`, then release
//!   when stdin closes. `rawdurable DIR` also writes the epoch by hand as tenure does (16 bytes
//!   in place, one `fdatasync`) before it says `acquired`: the durable floor.

use std::io::{BufRead, Write};
use std::os::fd::AsFd;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

use tenure::lease::{self, AcquireOptions, LeaseError, WaitBound};
use tenure::machine::PhaseKind;
use tenure::privfs::StateDir;

/// The environment variable that turns a test or bench binary into a probe.
pub const PROBE_ENV: &str = "TENURE_PROBE";
/// The separator of the probe's arguments.
pub const SEP: char = '\x1f';

fn say(line: &str) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "PROBE {line}");
    let _ = out.flush();
}

fn read_line() -> Option<String> {
    let mut s = String::new();
    match std::io::stdin().lock().read_line(&mut s) {
        Ok(0) | Err(_) => None,
        Ok(_) => Some(s.trim_end().to_owned()),
    }
}

fn bound(s: &str) -> WaitBound {
    match s {
        "try" => WaitBound::Try,
        "forever" => WaitBound::Forever,
        ms => WaitBound::For(Duration::from_millis(ms.parse().expect("bound in ms"))),
    }
}

fn parse_phase(s: &str) -> PhaseKind {
    serde_json::from_str(&format!("\"{s}\"")).expect("a lowercase phase name")
}

fn exit_for(e: &LeaseError) -> ! {
    match e {
        LeaseError::Busy { .. } => {
            say(&format!("busy {e}"));
            std::process::exit(75)
        }
        LeaseError::Cancelled { .. } => {
            say("cancelled");
            std::process::exit(143)
        }
        _ => {
            say(&format!("error {e}"));
            std::process::exit(65)
        }
    }
}

/// Runs the probe role named in `spec` and exits the process.
pub fn run(spec: &str) -> ! {
    let args: Vec<&str> = spec.split(SEP).collect();
    match args.as_slice() {
        ["hold", dir, b, rest @ ..] => hold(Path::new(dir), bound(b), rest.contains(&"go")),
        ["stress", dir, logdir, mode] => stress(Path::new(dir), Path::new(logdir), mode),
        ["sigwatch", file] => sigwatch(Path::new(file)),
        ["raw", dir] => raw(Path::new(dir), false),
        ["rawdurable", dir] => raw(Path::new(dir), true),
        other => panic!("unknown probe role {other:?}"),
    }
}

/// A pipe that SIGTERM and SIGINT write to, as the runner wires its own.
fn signal_pipe() -> UnixStream {
    let (r, w) = UnixStream::pair().expect("socketpair");
    signal_hook::low_level::pipe::register(signal_hook::consts::SIGTERM, w.try_clone().unwrap())
        .expect("register SIGTERM");
    signal_hook::low_level::pipe::register(signal_hook::consts::SIGINT, w)
        .expect("register SIGINT");
    r
}

fn hold(dir: &Path, wait: WaitBound, barrier: bool) -> ! {
    let cancel = signal_pipe();
    if barrier {
        read_line();
    }
    let sd = StateDir::open(dir, true).unwrap_or_else(|e| {
        say(&format!("error {e}"));
        std::process::exit(65)
    });
    let opts = AcquireOptions {
        wait,
        cancel: Some(cancel.as_fd()),
        phase: PhaseKind::Recovering,
        fence: None,
    };
    let mut lease = match lease::acquire(&sd, &opts, &mut |c| say(&c.to_string())) {
        Ok(l) => l,
        Err(e) => exit_for(&e),
    };
    say(&format!("acquired {}", lease.epoch()));
    loop {
        match read_line().as_deref() {
            None | Some("release") => {
                match lease.release() {
                    Ok(()) => say("released"),
                    Err(e) => say(&format!("error {e}")),
                }
                std::process::exit(0)
            }
            Some("exit") => std::process::exit(0),
            Some(cmd) if cmd.starts_with("phase ") => {
                let phase = parse_phase(&cmd["phase ".len()..]);
                match lease.set_phase(phase) {
                    Ok(()) => say(&format!("phase {}", &cmd["phase ".len()..])),
                    Err(e) => say(&format!("error {e}")),
                }
            }
            Some(other) => say(&format!("error unknown command {other}")),
        }
    }
}

fn append(path: &Path, line: &str) {
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .expect("open the shared log");
    // One write of a short line with O_APPEND: lines of concurrent writers never interleave.
    f.write_all(format!("{line}\n").as_bytes()).expect("append");
}

fn stress(dir: &Path, logdir: &Path, mode: &str) -> ! {
    let cancel = signal_pipe();
    read_line();
    let sd = StateDir::open(dir, true).expect("open state dir");
    let opts = AcquireOptions {
        wait: if mode == "try" {
            WaitBound::Try
        } else {
            WaitBound::For(Duration::from_secs(60))
        },
        cancel: Some(cancel.as_fd()),
        phase: PhaseKind::Recovering,
        fence: None,
    };
    let lease = match lease::acquire(&sd, &opts, &mut |_| {}) {
        Ok(l) => l,
        Err(e) => exit_for(&e),
    };
    let pid = std::process::id();
    let epoch = lease.epoch();
    let inside = logdir.join("inside");
    if std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&inside)
        .is_err()
    {
        append(&logdir.join("log"), &format!("OVERLAP {pid} {epoch}"));
    }
    append(&logdir.join("log"), &format!("B {pid} {epoch}"));
    if mode == "try" || mode == "waithold" {
        say(&format!("acquired {epoch}"));
        read_line();
    }
    append(&logdir.join("log"), &format!("E {pid} {epoch}"));
    let _ = std::fs::remove_file(&inside);
    lease.release().expect("release");
    std::process::exit(0)
}

fn sigwatch(file: &Path) -> ! {
    use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM, SIGUSR1, SIGUSR2};
    let mut signals =
        signal_hook::iterator::Signals::new([SIGTERM, SIGINT, SIGHUP, SIGUSR1, SIGUSR2])
            .expect("signals");
    let file = file.to_path_buf();
    std::thread::spawn(move || {
        for sig in signals.forever() {
            append(&file, &format!("got {sig}"));
            say(&format!("got {sig}"));
        }
    });
    say("ready");
    while read_line().is_some() {}
    std::process::exit(0)
}

/// Writes an epoch by hand the way tenure's acquisition makes it durable: 16 bytes in place in
/// `dir/name` (created if missing), one `fdatasync`.
pub fn hand_epoch(dir: &Path, name: &str) {
    use std::os::unix::fs::{FileExt, OpenOptionsExt};
    let f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .open(dir.join(name))
        .expect("open epoch");
    f.write_all_at(&[7u8; 16], 4096).expect("write");
    f.sync_data().expect("fdatasync");
}

fn raw(dir: &Path, durable: bool) -> ! {
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(dir.join(".tenure/lock"))
        .expect("open lock file");
    say("blocking");
    rustix::fs::flock(&f, rustix::fs::FlockOperation::LockExclusive).expect("flock");
    if durable {
        // The same durable write as a tenure acquisition: the epoch in place, one fdatasync.
        hand_epoch(&dir.join(".tenure"), "epoch");
    }
    say("acquired 0");
    while read_line().is_some() {}
    std::process::exit(0)
}

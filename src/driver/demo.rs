//! `tenure demo`: the whole lifecycle on an embedded default, in a temporary dir, in seconds.
//! A real owner runs a child that keeps a counter in its checkpoint; a contender waits; SIGTERM
//! (through the identity-checked pidfd path) drains the owner, which publishes and releases;
//! the contender takes over with a higher epoch and reads the counter. The timeline is printed
//! as it happens, and the temporary dir is removed at the end.

use super::signals::SignalIntake;
use crate::checkpoint::{CheckpointStore, StoreOptions};
use crate::lease::{self, SignalOutcome};
use crate::privfs::StateDir;
use std::io::Read;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// How long each step may take before the demo gives up.
const STEP: Duration = Duration::from_secs(20);

struct Demo {
    started: Instant,
    dir: PathBuf,
}

impl Demo {
    fn say(&self, what: &str) {
        eprintln!("[{:>6.3}s] {what}", self.started.elapsed().as_secs_f64());
    }

    fn owner(&self) -> std::io::Result<Child> {
        let exe = std::env::current_exe()?;
        Command::new(&exe)
            .args([
                "run",
                "--ready",
                "notify",
                "--ready-timeout",
                "10",
                "--grace",
                "5",
                "--dir",
            ])
            .arg(&self.dir)
            .arg("--")
            .arg(&exe)
            .arg("demo-child")
            .stdin(Stdio::null())
            .spawn()
    }

    /// Waits until `cond` holds on the dir's status (the demo's own event wait).
    fn until(&self, what: &str, cond: impl Fn(&lease::LeaseStatus) -> bool) -> Result<(), String> {
        let deadline = Instant::now() + STEP;
        loop {
            // The dir appears when the first owner opens it.
            if let Ok(d) = StateDir::open(&self.dir, false)
                && let Ok(st) = lease::status(&d)
                && cond(&st)
            {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(format!("timed out waiting for {what}"));
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

/// Runs the demo; returns the exit code (0 when every step happened as expected).
pub fn demo(intake: &SignalIntake) -> u8 {
    let base = std::env::temp_dir().join(format!("tenure-demo-{}", std::process::id()));
    let demo = Demo {
        started: Instant::now(),
        dir: base.join("state"),
    };
    let result = steps(&demo, intake);
    let _ = std::fs::remove_dir_all(&base);
    match result {
        Ok(()) => {
            demo.say(&format!("done; removed {}", base.display()));
            0
        }
        Err(e) => {
            demo.say(&format!("demo failed: {e}"));
            1
        }
    }
}

fn steps(demo: &Demo, intake: &SignalIntake) -> Result<(), String> {
    let io = |e: std::io::Error| e.to_string();
    demo.say(&format!("state dir {}", demo.dir.display()));
    demo.say("start owner A: tenure run --ready notify --dir DIR -- <counter child>");
    let mut a = demo.owner().map_err(io)?;
    demo.until("A to be ready", |s| {
        s.owner
            .as_ref()
            .is_some_and(|o| o.phase == crate::machine::PhaseKind::Ready)
            && s.held
    })?;
    demo.say("A is ready (epoch 1); start contender B on the same dir");
    let mut b = demo.owner().map_err(io)?;
    demo.until("B to be a visible waiter", |s| !s.waiters.is_empty())?;
    let st = StateDir::open(&demo.dir, false).map_err(|e| e.to_string())?;
    let owner = lease::status(&st)
        .map_err(|e| e.to_string())?
        .owner
        .ok_or("no owner record")?;
    demo.say(&format!(
        "B waits; `tenure status` lists it. Send SIGTERM to A (pid {}) through its pidfd",
        owner.identity.pid
    ));
    if intake.pending() {
        return Err("interrupted".into());
    }
    match lease::signal_owner(&owner.identity, rustix::process::Signal::TERM) {
        Ok(SignalOutcome::Delivered) => {}
        Ok(other) => return Err(format!("A was not signalled: {other:?}")),
        Err(e) => return Err(e.to_string()),
    }
    let code = wait_exit(&mut a)?;
    demo.say(&format!(
        "A drained, published its checkpoint and released (exit {code})"
    ));
    demo.until("B to own and be ready", |s| {
        s.epoch == 2
            && s.held
            && s.owner
                .as_ref()
                .is_some_and(|o| o.phase == crate::machine::PhaseKind::Ready)
    })?;
    demo.say("B took over with epoch 2 and read A's counter; stop B the same way");
    let owner = lease::status(&st)
        .map_err(|e| e.to_string())?
        .owner
        .ok_or("no owner")?;
    lease::signal_owner(&owner.identity, rustix::process::Signal::TERM)
        .map_err(|e| e.to_string())?;
    let code = wait_exit(&mut b)?;
    demo.say(&format!("B drained and released (exit {code})"));
    let store = CheckpointStore::open(&st, StoreOptions::default()).map_err(|e| e.to_string())?;
    let cp = store
        .load()
        .map_err(|e| e.to_string())?
        .ok_or("no checkpoint")?;
    let entry = cp.entry("counter").ok_or("no counter in the checkpoint")?;
    let mut text = String::new();
    store
        .open_entry(entry)
        .map_err(|e| e.to_string())?
        .read_to_string(&mut text)
        .map_err(io)?;
    demo.say(&format!(
        "checkpoint {} (published at epoch {}) verifies; counter = {}",
        cp.id.get(),
        cp.epoch,
        text.trim()
    ));
    if text.trim() != "2" {
        return Err(format!("expected counter 2, found {:?}", text.trim()));
    }
    Ok(())
}

fn wait_exit(c: &mut Child) -> Result<i32, String> {
    let deadline = Instant::now() + STEP;
    loop {
        match c.try_wait() {
            Ok(Some(s)) => return Ok(s.code().unwrap_or(-1)),
            Ok(None) => {}
            Err(e) => return Err(e.to_string()),
        }
        if Instant::now() > deadline {
            let _ = c.kill();
            return Err("an owner did not exit in time".into());
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// The demo's child (`tenure demo-child`, not for direct use): reads the counter from
/// `TENURE_CHECKPOINT`, says `READY=1` on `NOTIFY_SOCKET`, and on SIGTERM leaves counter + 1 in
/// `TENURE_CHECKPOINT_OUT` and exits 0 so it is published.
pub fn child(intake: &SignalIntake) -> u8 {
    let read = std::env::var_os("TENURE_CHECKPOINT")
        .and_then(|d| std::fs::read_to_string(PathBuf::from(d).join("counter")).ok());
    let n: u64 = read.as_deref().map_or(0, |s| s.trim().parse().unwrap_or(0));
    let epoch = std::env::var("TENURE_EPOCH").unwrap_or_default();
    eprintln!(
        "  child: epoch {epoch} recovered counter {n}; will publish {}",
        n + 1
    );
    if let Some(sock) = std::env::var_os("NOTIFY_SOCKET") {
        let s = sock.to_string_lossy().into_owned();
        let sent = std::os::unix::net::UnixDatagram::unbound().and_then(|u| {
            use std::os::linux::net::SocketAddrExt;
            let addr = match s.strip_prefix('@') {
                Some(abs) => std::os::unix::net::SocketAddr::from_abstract_name(abs)?,
                None => std::os::unix::net::SocketAddr::from_pathname(&s)?,
            };
            u.send_to_addr(b"READY=1", &addr)
        });
        if let Err(e) = sent {
            eprintln!("  child: cannot notify readiness: {e}");
            return 1;
        }
    }
    let mut fds = [rustix::event::PollFd::from_borrowed_fd(
        intake.fd(),
        rustix::event::PollFlags::IN,
    )];
    while intake.take().is_empty() {
        let _ = rustix::event::poll(&mut fds, None);
    }
    let Some(out) = std::env::var_os("TENURE_CHECKPOINT_OUT") else {
        return 1;
    };
    match std::fs::write(PathBuf::from(out).join("counter"), format!("{}\n", n + 1)) {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("  child: cannot write the checkpoint: {e}");
            1
        }
    }
}

//! `tenure up`: connect-or-spawn (card D8). If a live owner is ready, print its registration;
//! otherwise win the launch election, start one detached `tenure run` (new session, stdio to
//! `.tenure/up.log`, cwd `/`), and wait until it is ready or the deadline passes. Concurrent `up`
//! calls queue on the election, find the owner the winner launched, and all print the same
//! epoch. A failed election says why, how many launches it made, and the last 4 KiB of the
//! candidate's output.

use super::eventlog::EventLog;
use super::signals::SignalIntake;
use super::{RunOptions, child::STDERR_TAIL};
use crate::lease::{self, CONTROL_DIR, OwnerState, WaitBound};
use crate::machine::{EXIT_IO, EXIT_NOT_READY, EXIT_REFUSED, PhaseKind, ReadyMode};
use crate::privfs::StateDir;
use serde_json::json;
use std::ffi::OsString;
use std::io::{Read, Seek, SeekFrom};
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The log of detached owners inside the control folder.
pub const UP_LOG: &str = "up.log";
/// The rotated log of detached owners.
pub const UP_LOG_OLD: &str = "up.log.1";
/// How long `up` waits for readiness when `--wait` is not given.
pub const DEFAULT_DEADLINE: Duration = Duration::from_secs(30);
/// How often `up` looks at the registration while waiting.
const POLL: Duration = Duration::from_millis(10);

/// Why an election failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failure {
    /// The launched owner did not become ready before the deadline.
    StartupTimeout,
    /// An owner we did not launch holds the dir but did not become ready before the deadline.
    OwnerUnresponsive,
    /// The owner could not be launched, or it exited before it was ready.
    SpawnFailed,
    /// The launched owner refused the state dir.
    Refused,
    /// A stop signal ended the wait (the owner, if launched, keeps running).
    Interrupted,
}

impl Failure {
    /// The reason word printed in the failure report.
    pub const fn word(self) -> &'static str {
        match self {
            Failure::StartupTimeout => "startup_timeout",
            Failure::OwnerUnresponsive => "owner_unresponsive",
            Failure::SpawnFailed => "spawn_failed",
            Failure::Refused => "refused",
            Failure::Interrupted => "interrupted",
        }
    }
}

/// A duration as the runner's options take it, exactly (`1500000000ns`).
fn nanos(d: Duration) -> String {
    format!("{}ns", d.as_nanos())
}

/// The arguments of the `tenure run` that `up` launches for these options (absolute paths,
/// since the owner runs with cwd `/`). The lease wait is bounded by `up`'s own deadline.
pub fn run_args(opts: &RunOptions, dir: &std::path::Path, left: Duration) -> Vec<OsString> {
    let mut a: Vec<OsString> = vec!["run".into(), "--dir".into(), dir.into()];
    a.extend(["--wait".into(), nanos(left).into()]);
    a.extend(["--grace".into(), nanos(opts.grace).into()]);
    a.extend(["--kill-wait".into(), nanos(opts.kill_wait).into()]);
    let ty = match opts.ready {
        ReadyMode::Start => "simple",
        ReadyMode::Notify => "notify",
        ReadyMode::Forking => "forking",
    };
    a.extend(["--type".into(), ty.into()]);
    if let Some(t) = opts.ready_timeout {
        a.extend(["--ready-timeout".into(), nanos(t).into()]);
    }
    a.extend([
        "--kill-mode".into(),
        match opts.kill_mode {
            crate::machine::KillMode::Tree => "tree",
            crate::machine::KillMode::Main => "main",
        }
        .into(),
        "--hup".into(),
        match opts.hup {
            crate::machine::HupPolicy::Stop => "stop",
            crate::machine::HupPolicy::Forward => "forward",
        }
        .into(),
        "--cgroup".into(),
        match opts.cgroup {
            super::CgroupMode::Auto => "auto",
            super::CgroupMode::Off => "off",
        }
        .into(),
    ]);
    if let Some(p) = &opts.pid_file {
        let abs = std::path::absolute(p).unwrap_or_else(|_| p.clone());
        a.extend(["--pidfile".into(), abs.into()]);
    }
    if let Some(w) = opts.watchdog {
        a.extend(["--watchdog".into(), nanos(w).into()]);
    }
    if let Some(list) = &opts.env_allow {
        let joined: Vec<String> = list
            .iter()
            .map(|s| s.to_string_lossy().into_owned())
            .collect();
        a.extend(["--env-allow".into(), joined.join(",").into()]);
    }
    if let Some(u) = &opts.user {
        a.extend(["--user".into(), format!("{}:{}", u.uid, u.gid).into()]);
    }
    a.extend(["--keep".into(), opts.keep.to_string().into()]);
    #[cfg(feature = "etcd")]
    if let Some(c) = &opts.cluster {
        a.extend([
            "--lease".into(),
            c.url().into(),
            "--lease-ttl".into(),
            c.ttl.as_secs().to_string().into(),
        ]);
        if let Some(s) = &opts.store {
            let abs = std::path::absolute(s).unwrap_or_else(|_| s.clone());
            a.extend(["--store".into(), abs.into()]);
        }
    }
    a.extend(["-E".into(), opts.busy_code.to_string().into()]);
    if let Some(t) = &opts.trace {
        let abs = std::path::absolute(t).unwrap_or_else(|_| t.clone());
        a.extend(["--trace".into(), abs.into()]);
    }
    a.push("--".into());
    a.extend(opts.command.iter().cloned());
    a
}

/// Runs `tenure up`; returns the exit code.
pub fn up(opts: &RunOptions, intake: &SignalIntake) -> u8 {
    // A trace file the owner could not open is found before the dir is made or written: bad
    // input leaves nothing behind. The report is the one a launch that failed on it gave
    // (`spawn_failed`, the owner's message and exit code 74), with no launch.
    if let Some(path) = &opts.trace
        && let Err(source) = super::check_trace(path)
    {
        let e = super::DriverError::Trace {
            path: path.clone(),
            source,
        };
        log::error!("{e}");
        let _ = fail(
            Failure::SpawnFailed,
            0,
            None,
            Some((format!("tenure: {e}\n").into_bytes(), false)),
        );
        return EXIT_IO;
    }
    let dir = match StateDir::open(&opts.dir, true) {
        Ok(d) => d,
        Err(e) => {
            log::error!("{e}");
            if !e.is_refusal() {
                return EXIT_REFUSED;
            }
            // A refused dir (permissive, a symlink, not a directory) is a refused election
            // like a foreign one below: the report says so.
            let msg = format!("tenure: {e}\n").into_bytes();
            return fail(Failure::Refused, 0, None, Some((msg, false)));
        }
    };
    // Refuse foreign or corrupt state before the election writes anything into the dir: a
    // refused dir stays byte-for-byte as it was (card L8).
    if let Err(e) = lease::check(&dir) {
        log::error!("{e}");
        if !e.is_refusal() {
            return EXIT_IO;
        }
        let msg = format!("tenure: {e}\n").into_bytes();
        return fail(Failure::Refused, 0, None, Some((msg, false)));
    }
    let deadline = Instant::now()
        + match opts.wait {
            WaitBound::Forever => DEFAULT_DEADLINE,
            WaitBound::Try => Duration::ZERO,
            WaitBound::For(d) => d,
        };
    let mut launches = 0u32;
    // The first look always happens, even with `--wait 0`: a dir nobody holds gets its owner
    // launched (and left running, still starting, at the deadline) rather than a report that
    // an owner which does not exist never became ready.
    let mut first = true;
    loop {
        if intake.pending() {
            return interrupted(intake, launches);
        }
        if let Some(code) = announce_ready(&dir) {
            return code;
        }
        if Instant::now() >= deadline && !first {
            // Every launch returns below, so reaching the deadline here means an owner we did
            // not launch never became ready.
            return fail(Failure::OwnerUnresponsive, launches, None, None);
        }
        first = false;
        // Somebody owns (recovering, draining) or is acquiring: wait for it to become ready or
        // to go away; launch only when nobody holds the lease.
        let st = match lease::status(&dir) {
            Ok(s) => s,
            Err(e) => {
                log::error!("{e}");
                return EXIT_REFUSED;
            }
        };
        if st.held {
            std::thread::sleep(POLL);
            continue;
        }
        let election = match lease::elect(&dir, Some(deadline), Some(intake.fd())) {
            Ok(Some(e)) => e,
            // The deadline passed or a signal came: the top of the loop says which.
            Ok(None) => continue,
            // Retrying an election that cannot even be attempted would spin until the deadline.
            Err(e) => {
                log::error!("{e}");
                return EXIT_IO;
            }
        };
        // Under the election: look again, a previous winner may have launched meanwhile.
        if let Some(code) = announce_ready(&dir) {
            return code;
        }
        if lease::status(&dir).is_ok_and(|s| s.held) {
            drop(election);
            continue;
        }
        launches += 1;
        let left = deadline.saturating_duration_since(Instant::now());
        match launch_and_wait(opts, &dir, left, deadline, intake, launches) {
            Ok(line) => {
                println!("{line}");
                return 0;
            }
            Err((Failure::Interrupted, _, _)) => return interrupted(intake, launches),
            Err((why, code, tail)) => return fail(why, launches, code, tail),
        }
    }
}

/// Prints the registration of a live, ready owner and gives `up`'s exit code (0), or 65 when
/// the dir's records are refused; `None` while no owner is ready.
fn announce_ready(dir: &StateDir) -> Option<u8> {
    match ready_owner(dir) {
        Ok(Some(line)) => {
            println!("{line}");
            Some(0)
        }
        Ok(None) => None,
        Err(e) => {
            log::error!("{e}");
            Some(EXIT_REFUSED)
        }
    }
}

/// The registration line of a live, ready owner, if there is one.
fn ready_owner(dir: &StateDir) -> Result<Option<String>, lease::LeaseError> {
    let st = lease::status(dir)?;
    if let (OwnerState::Owned(PhaseKind::Ready), Some(o)) = (st.state(), &st.owner) {
        return Ok(Some(
            json!({"epoch": o.epoch, "pid": o.identity.pid, "phase": "ready"}).to_string(),
        ));
    }
    Ok(None)
}

type LaunchError = (Failure, Option<i32>, Option<(Vec<u8>, bool)>);

fn launch_and_wait(
    opts: &RunOptions,
    dir: &StateDir,
    left: Duration,
    deadline: Instant,
    intake: &SignalIntake,
    launch: u32,
) -> Result<String, LaunchError> {
    let control = dir
        .root()
        .ensure_dir(CONTROL_DIR, "up")
        .map_err(|_| (Failure::SpawnFailed, None, None))?;
    // One older generation is kept, like the event log; the election makes this single-writer.
    if control
        .stat(UP_LOG)
        .ok()
        .flatten()
        .is_some_and(|st| st.st_size as u64 >= super::eventlog::ROTATE_BYTES)
    {
        let _ = control.rename(UP_LOG, UP_LOG_OLD, "up");
    }
    let log = control
        .open_or_create_file(UP_LOG, "up")
        .map_err(|_| (Failure::SpawnFailed, None, None))?;
    let start = rustix::fs::fstat(&log)
        .map(|s| s.st_size as u64)
        .unwrap_or(0);
    if let Ok(flags) = rustix::fs::fcntl_getfl(&log) {
        let _ = rustix::fs::fcntl_setfl(&log, flags | rustix::fs::OFlags::APPEND);
    }
    let exe = std::env::current_exe().map_err(|_| (Failure::SpawnFailed, None, None))?;
    let out = log
        .try_clone()
        .map_err(|_| (Failure::SpawnFailed, None, None))?;
    let mut cmd = Command::new(exe);
    cmd.args(run_args(opts, dir.path(), left))
        .current_dir("/")
        .env_remove("NOTIFY_SOCKET")
        .stdin(Stdio::null())
        .stdout(Stdio::from(out))
        .stderr(Stdio::from(log));
    // SAFETY: setsid is async-signal-safe and allocates nothing; it detaches the owner from our
    // session so it outlives this command and our terminal.
    unsafe {
        cmd.pre_exec(|| rustix::process::setsid().map(|_| ()).map_err(Into::into));
    }
    let mut child = cmd.spawn().map_err(|e| {
        log::error!("cannot launch the owner: {e}");
        (Failure::SpawnFailed, None, None)
    })?;
    // Card D6: the launch is on the record, naming the owner it started.
    if let Some(mut log) = EventLog::open(dir) {
        log.write(
            "launching",
            None,
            json!({"launched_pid": child.id(), "launch": launch}),
        );
    }
    let tail = || candidate_tail(&control, start);
    loop {
        match ready_owner(dir) {
            Ok(Some(line)) => return Ok(line),
            Ok(None) => {}
            Err(_) => return Err((Failure::Refused, None, tail())),
        }
        if let Ok(Some(st)) = child.try_wait() {
            // One last look: it may have become ready and ended in between.
            let code = st.code();
            let why = match code {
                Some(65) => Failure::Refused,
                _ => Failure::SpawnFailed,
            };
            return Err((why, code, tail()));
        }
        // A signal is reported as such, not as a timeout.
        if intake.pending() {
            return Err((Failure::Interrupted, None, None));
        }
        if Instant::now() >= deadline {
            return Err((Failure::StartupTimeout, None, tail()));
        }
        std::thread::sleep(POLL);
    }
}

/// The candidate's own output: what it appended to the log since `start`, at most the last
/// 4 KiB, and whether earlier bytes were left out (exactly 4 KiB is not truncated, card D5).
fn candidate_tail(control: &crate::privfs::Dir, start: u64) -> Option<(Vec<u8>, bool)> {
    let mut f = control.open_file_optional(UP_LOG).ok()??;
    let len = rustix::fs::fstat(&f).ok()?.st_size as u64;
    let own = len.saturating_sub(start);
    let take = own.min(STDERR_TAIL as u64);
    f.seek(SeekFrom::Start(len - take)).ok()?;
    let mut buf = Vec::with_capacity(take as usize);
    f.take(take).read_to_end(&mut buf).ok()?;
    Some((buf, own > STDERR_TAIL as u64))
}

fn fail(why: Failure, launches: u32, code: Option<i32>, tail: Option<(Vec<u8>, bool)>) -> u8 {
    let (stderr, truncated) = tail
        .map(|(b, t)| (String::from_utf8_lossy(&b).into_owned(), t))
        .unwrap_or_default();
    println!(
        "{}",
        json!({
            "error": why.word(),
            "launches": launches,
            "exit_code": code,
            "stderr": stderr,
            "truncated": truncated,
        })
    );
    log::error!(
        "up failed: {} after {launches} launch(es){}",
        why.word(),
        code.map(|c| format!("; the owner exited with {c}"))
            .unwrap_or_default()
    );
    match why {
        Failure::Refused => EXIT_REFUSED,
        Failure::SpawnFailed => code
            .and_then(|c| u8::try_from(c).ok())
            .filter(|c| *c != 0)
            .unwrap_or(EXIT_NOT_READY),
        Failure::StartupTimeout | Failure::OwnerUnresponsive => EXIT_NOT_READY,
        Failure::Interrupted => 130,
    }
}

/// A stop signal ended `up`: say so (with the launches made) and exit 128 + N. An owner it
/// launched keeps running: it is detached on purpose, and `tenure stop` ends it.
fn interrupted(intake: &SignalIntake, launches: u32) -> u8 {
    let sig = intake.take().first().copied();
    println!(
        "{}",
        json!({"error": Failure::Interrupted.word(), "launches": launches,
               "signal": sig.map(|s| s.name())})
    );
    log::error!(
        "up was interrupted by {}; the owner (if any) keeps running",
        sig.map_or("a stop signal", |s| s.name())
    );
    sig.map_or(130, |s| s.exit_code())
}

//! The supervised child: spawned with a restricted environment in a process group of its own
//! (so a signal to the runner's group reaches it only through the runner, once: card T3), moved
//! into the ownership's cgroup before it execs (card T1), held by a pidfd (so it is signalled and
//! reaped by identity, never by a pid that may have been recycled), its stderr teed to ours with
//! the last 4 KiB kept (card D5).

use crate::machine::{ChildStatus, ExecFailure};
use rustix::event::{PollFd, PollFlags, poll};
use rustix::process::{Pid, PidfdFlags, WaitId, WaitIdOptions, pidfd_open, pidfd_send_signal};
use std::collections::VecDeque;
use std::ffi::{OsStr, OsString};
use std::io::{self, Read, Write};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd, RawFd};
use std::os::unix::process::CommandExt;
use std::process::{ChildStderr, Command, Stdio};

/// How many bytes of the child's stderr are kept for the end record.
pub const STDERR_TAIL: usize = 4096;

/// What to run and with which environment.
#[derive(Debug, Clone)]
pub struct SpawnSpec {
    /// The program (looked up in `PATH` like a shell does when it has no `/`).
    pub program: OsString,
    /// Its arguments.
    pub args: Vec<OsString>,
    /// When set, the child's environment is exactly these inherited variables plus `set`
    /// (card D2); otherwise it inherits everything except `remove`.
    pub allow: Option<Vec<OsString>>,
    /// Variables removed from the inherited environment.
    pub remove: Vec<OsString>,
    /// Variables set for the child (tenure's own, `NOTIFY_SOCKET`).
    pub set: Vec<(OsString, OsString)>,
    /// `cgroup.procs` of the workload's cgroup, open for writing: the child enters the cgroup
    /// (writes `0`) before it execs, so nothing it starts is ever outside.
    pub cgroup_procs: Option<RawFd>,
    /// A descriptor the child keeps across exec (the shared lock descriptor); the parent's copy
    /// is `O_CLOEXEC`, the child clears the flag on its own.
    pub inherit: Option<RawFd>,
}

/// Why the child could not be started.
#[derive(Debug, thiserror::Error)]
#[error("cannot execute {program:?}: {source} [{errno}]")]
pub struct SpawnError {
    /// The program.
    pub program: OsString,
    /// 127 (not found) or 126 (not executable).
    pub failure: ExecFailure,
    /// The errno's name, e.g. `ENOENT`.
    pub errno: &'static str,
    /// The OS error.
    #[source]
    pub source: io::Error,
}

/// A running (or exited, not yet reaped) child.
pub struct Child {
    pid: u32,
    pidfd: OwnedFd,
    stderr: Option<ChildStderr>,
    tail: VecDeque<u8>,
    dropped: bool,
    status: Option<ChildStatus>,
}

/// The errno name for the messages (`ENOENT`, ...), as operators search for it.
pub fn errno_name(e: &io::Error) -> &'static str {
    match e.raw_os_error() {
        Some(2) => "ENOENT",
        Some(13) => "EACCES",
        Some(8) => "ENOEXEC",
        Some(20) => "ENOTDIR",
        Some(21) => "EISDIR",
        Some(26) => "ETXTBSY",
        Some(40) => "ELOOP",
        Some(7) => "E2BIG",
        Some(12) => "ENOMEM",
        Some(36) => "ENAMETOOLONG",
        Some(1) => "EPERM",
        _ => "EIO",
    }
}

impl Child {
    /// Starts the child. It gets SIGKILL if this process dies first (so a crashed runner never
    /// leaves an unsupervised child behind while a successor takes the lease).
    pub fn spawn(spec: &SpawnSpec) -> Result<Child, SpawnError> {
        let mut cmd = Command::new(&spec.program);
        cmd.args(&spec.args);
        if let Some(allow) = &spec.allow {
            cmd.env_clear();
            for name in allow {
                if let Some(v) = std::env::var_os(name) {
                    cmd.env(name, v);
                }
            }
        }
        for name in &spec.remove {
            cmd.env_remove(name);
        }
        for (k, v) in &spec.set {
            cmd.env(k, v);
        }
        cmd.stdin(Stdio::inherit())
            .stdout(Stdio::inherit())
            .stderr(Stdio::piped());
        // A process group of its own: a signal to the runner's group (Ctrl-C, systemd's
        // KillMode=control-group) reaches the child only through the runner, once.
        cmd.process_group(0);
        let parent = rustix::process::getpid();
        let (procs, inherit) = (spec.cgroup_procs, spec.inherit);
        // SAFETY: the closure runs in the forked child before exec and only makes raw system
        // calls (write, fcntl, prctl, getppid) on descriptors the parent keeps open until the
        // spawn returns; they are async-signal-safe, and it allocates nothing.
        unsafe {
            cmd.pre_exec(move || {
                if let Some(fd) = procs {
                    // Into the workload's cgroup before anything else can fork.
                    rustix::io::write(BorrowedFd::borrow_raw(fd), b"0")?;
                }
                if let Some(fd) = inherit {
                    rustix::io::fcntl_setfd(
                        BorrowedFd::borrow_raw(fd),
                        rustix::io::FdFlags::empty(),
                    )?;
                }
                rustix::process::set_parent_process_death_signal(Some(
                    rustix::process::Signal::KILL,
                ))?;
                // The parent may have died between fork and prctl: then nobody would kill us.
                if rustix::process::getppid() != Some(parent) {
                    return Err(io::Error::from_raw_os_error(3));
                }
                Ok(())
            });
        }
        let mut child = cmd.spawn().map_err(|source| {
            let failure = match source.kind() {
                io::ErrorKind::NotFound => ExecFailure::NotFound,
                _ if source.raw_os_error() == Some(20) => ExecFailure::NotFound,
                _ => ExecFailure::NotExecutable,
            };
            SpawnError {
                program: spec.program.clone(),
                failure,
                errno: errno_name(&source),
                source,
            }
        })?;
        let pid = child.id();
        // We are the parent and have not reaped it, so the pid cannot have been recycled.
        let raw = Pid::from_raw(pid as i32).expect("a spawned child has a positive pid");
        let pidfd = match pidfd_open(raw, PidfdFlags::empty()) {
            Ok(fd) => fd,
            Err(e) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(SpawnError {
                    program: spec.program.clone(),
                    failure: ExecFailure::NotExecutable,
                    errno: errno_name(&e.into()),
                    source: io::Error::other("pidfd_open failed for the child"),
                });
            }
        };
        let stderr = child.stderr.take();
        if let Some(s) = &stderr {
            let _ = rustix::io::ioctl_fionbio(s, true);
        }
        // The std handle is not needed any more: the pidfd reaps. Forget it without waiting.
        drop(child);
        Ok(Child {
            pid,
            pidfd,
            stderr,
            tail: VecDeque::with_capacity(STDERR_TAIL),
            dropped: false,
            status: None,
        })
    }

    /// The child's pid (for records and messages; never used to signal it).
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// Makes `pid` the main process from now on (a forking daemon's, named by its pid file or
    /// the only child left): it must be a child of this process (the subreaper adopted it when
    /// its parent exited), so its exit status can be read. The stderr pipe stays as it was: the
    /// daemon may still write to it.
    pub fn adopt(&mut self, pid: u32) -> io::Result<()> {
        let raw = Pid::from_raw(pid as i32).ok_or_else(|| io::Error::other("pid 0"))?;
        let pidfd = pidfd_open(raw, PidfdFlags::empty())?;
        self.pid = pid;
        self.pidfd = pidfd;
        self.status = None;
        Ok(())
    }

    /// The pidfd; readable once the child exited.
    pub fn pidfd(&self) -> BorrowedFd<'_> {
        self.pidfd.as_fd()
    }

    /// The stderr pipe, while open.
    pub fn stderr_fd(&self) -> Option<BorrowedFd<'_>> {
        self.stderr.as_ref().map(|s| s.as_fd())
    }

    /// Whether the child has exited (reaped or not).
    pub fn has_exited(&self) -> bool {
        if self.status.is_some() {
            return true;
        }
        let mut fds = [PollFd::new(&self.pidfd, PollFlags::IN)];
        matches!(poll(&mut fds, Some(&rustix::time::Timespec::default())), Ok(n) if n > 0)
    }

    /// Sends `sig` through the pidfd unless the child already exited: a run that ended by itself
    /// is never signalled afterwards (card R1). Returns whether the signal was sent.
    pub fn signal(&self, sig: rustix::process::Signal) -> io::Result<bool> {
        if self.has_exited() {
            return Ok(false);
        }
        match pidfd_send_signal(&self.pidfd, sig) {
            Ok(()) => Ok(true),
            Err(rustix::io::Errno::SRCH) => Ok(false),
            Err(e) => Err(e.into()),
        }
    }

    /// Reaps the child if it exited; `None` while it runs.
    pub fn try_reap(&mut self) -> io::Result<Option<ChildStatus>> {
        if let Some(s) = self.status {
            return Ok(Some(s));
        }
        let st = rustix::process::waitid(
            WaitId::PidFd(self.pidfd.as_fd()),
            WaitIdOptions::EXITED | WaitIdOptions::NOHANG,
        )?;
        let Some(st) = st else { return Ok(None) };
        let status = if let Some(sig) = st.terminating_signal() {
            ChildStatus::Signaled(sig as u8)
        } else if let Some(code) = st.exit_status() {
            ChildStatus::Exited(code as u8)
        } else {
            return Ok(None);
        };
        self.pump_stderr();
        self.status = Some(status);
        Ok(Some(status))
    }

    /// Copies what the child wrote to stderr to our stderr and keeps the last 4 KiB. Returns
    /// false once the pipe reached end of file.
    pub fn pump_stderr(&mut self) -> bool {
        let Some(pipe) = self.stderr.as_mut() else {
            return false;
        };
        let mut buf = [0u8; 8192];
        loop {
            match pipe.read(&mut buf) {
                Ok(0) => {
                    self.stderr = None;
                    return false;
                }
                Ok(n) => {
                    let _ = io::stderr().write_all(&buf[..n]);
                    for &b in &buf[..n] {
                        if self.tail.len() == STDERR_TAIL {
                            self.tail.pop_front();
                            self.dropped = true;
                        }
                        self.tail.push_back(b);
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return true,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(_) => {
                    self.stderr = None;
                    return false;
                }
            }
        }
    }

    /// The last 4 KiB of the child's stderr and whether earlier bytes were dropped (exactly
    /// 4 KiB is not truncated).
    pub fn stderr_tail(&self) -> (Vec<u8>, bool) {
        (self.tail.iter().copied().collect(), self.dropped)
    }
}

/// Splits `KEY=VALUE` lists and checks environment variable names for `--env-allow`.
pub fn valid_env_name(name: &OsStr) -> bool {
    let b = name.as_encoded_bytes();
    !b.is_empty()
        && !b[0].is_ascii_digit()
        && b.iter().all(|c| c.is_ascii_alphanumeric() || *c == b'_')
}

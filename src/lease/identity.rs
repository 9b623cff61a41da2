//! Process identity and identity-checked signalling (cards L5, D7).
//!
//! A pid alone names whichever process currently has that number; pids recycle within seconds
//! on a busy machine. An [`Identity`] is pid + start time (field 22 of `/proc/PID/stat`, in clock
//! ticks since boot) + executable (`/proc/PID/exe`) + the pidfs inode of a pidfd where the
//! kernel has pidfs (Linux ≥ 6.9: unique per process for the life of the boot).
//!
//! To learn whether a recorded identity is still alive, or to signal it, we first open a pidfd
//! for the pid, *then* read the identity through `/proc`, and finally check that the pidfd's
//! process has not exited. The pidfd pins one process: if the pid was recycled before the pidfd
//! was opened, the `/proc` read describes the newcomer and mismatches; if the process exits
//! after, the pidfd refers to the dead process and a signal through it fails with `ESRCH` instead
//! of reaching a newcomer. A mismatch or a dead process is reported, never signalled.

use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};

use rustix::process::{Pid, PidfdFlags, Signal};
use serde::{Deserialize, Serialize};

/// The pidfs filesystem magic (`PIDFS_MAGIC`): pidfds on this filesystem have per-process inodes.
const PIDFS_MAGIC: u64 = 0x5049_4446;

/// Who a process is, precisely enough to tell it from a later process with the same pid.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Identity {
    /// The process id.
    pub pid: u32,
    /// Field 22 of `/proc/PID/stat`: start time in clock ticks after boot.
    pub start_time: u64,
    /// The executable, as `/proc/PID/exe` names it.
    pub exe: PathBuf,
    /// The pidfs inode of a pidfd for the process, where the kernel provides one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pidfs_ino: Option<u64>,
}

/// Whether a recorded identity is still running.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Liveness {
    /// The pid runs the very process that was recorded.
    Live,
    /// No process has the pid (or it has exited and awaits reaping).
    Dead,
    /// The pid is alive but belongs to another process (start time, executable or pidfs inode
    /// differ): the recorded process is dead.
    Recycled,
}

/// Errors of reading a process identity.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum IdentityError {
    /// The process does not exist (or has exited).
    #[error("process {pid} does not exist; it may have exited already")]
    NoSuchProcess {
        /// The process id.
        pid: u32,
    },
    /// `/proc/PID/stat` did not have the expected shape.
    #[error("{path} has an unexpected format ({reason}); is /proc mounted as procfs?")]
    BadStat {
        /// The `/proc` file.
        path: PathBuf,
        /// Why it could not be parsed.
        reason: &'static str,
    },
    /// A `/proc` file or a pidfd could not be read.
    #[error("cannot read {path}: {source}; is /proc mounted and the process ours?")]
    Io {
        /// The `/proc` file.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// The executable's path is not UTF-8, and records hold it as text.
    #[error(
        "the executable of process {pid}, {exe:?}, is not a UTF-8 path and cannot be recorded; run it from a path whose names are UTF-8"
    )]
    NotUtf8Exe {
        /// The process id.
        pid: u32,
        /// The executable.
        exe: PathBuf,
    },
}

/// Errors of [`signal_owner`] (a dead or recycled process is an outcome, not an error).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SignalError {
    /// The pidfd could not be opened or used for a reason other than the process being gone.
    #[error(
        "cannot signal process {pid} through a pidfd: {source}; check that it runs as your user"
    )]
    Pidfd {
        /// The process id.
        pid: u32,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// The identity of the process could not be read after opening the pidfd.
    #[error(transparent)]
    Identity(#[from] IdentityError),
}

/// What [`signal_owner`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SignalOutcome {
    /// The signal was sent through a pidfd to the process with the recorded identity.
    Delivered,
    /// The recorded process is gone; nothing was signalled.
    Dead,
    /// The pid now belongs to another process (shown when readable); nothing was signalled.
    Mismatch {
        /// The process that has the pid now, if its identity could be read.
        found: Option<Identity>,
    },
}

/// Parses field 22 (start time) of a `/proc/PID/stat` line. The command name (field 2) may hold
/// spaces and parentheses, so fields are counted after the *last* `)`.
pub fn parse_start_time(stat: &str) -> Result<u64, &'static str> {
    let close = stat.rfind(')').ok_or("no ')' after the command name")?;
    // After ')' come field 3 (state) onwards; field 22 is the 20th of those.
    let field = stat[close + 1..]
        .split_ascii_whitespace()
        .nth(22 - 3)
        .ok_or("fewer than 22 fields")?;
    field.parse::<u64>().map_err(|_| "field 22 is not a number")
}

/// Compares executables, ignoring the ` (deleted)` suffix the kernel adds when the file was
/// replaced on disk after the process started (e.g. a rebuild): it is still the same process.
fn same_exe(a: &Path, b: &Path) -> bool {
    fn strip(p: &Path) -> &[u8] {
        use std::os::unix::ffi::OsStrExt;
        let bytes = p.as_os_str().as_bytes();
        bytes.strip_suffix(b" (deleted)").unwrap_or(bytes)
    }
    strip(a) == strip(b)
}

fn pid_of(pid: u32) -> Option<Pid> {
    i32::try_from(pid).ok().and_then(Pid::from_raw)
}

fn open_pidfd(pid: u32) -> Result<Option<OwnedFd>, io::Error> {
    let Some(p) = pid_of(pid) else {
        return Ok(None);
    };
    match rustix::process::pidfd_open(p, PidfdFlags::empty()) {
        Ok(fd) => Ok(Some(fd)),
        Err(rustix::io::Errno::SRCH) => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// True when the pidfd's process has exited (the pidfd polls readable then).
fn has_exited(pidfd: BorrowedFd<'_>) -> bool {
    use rustix::event::{PollFd, PollFlags, Timespec};
    let mut fds = [PollFd::new(&pidfd, PollFlags::IN)];
    let zero = Timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    match rustix::event::poll(&mut fds, Some(&zero)) {
        Ok(n) => n > 0,
        // If we cannot tell, say "exited": callers then refuse to signal, the safe side.
        Err(_) => true,
    }
}

/// The pidfs inode of a pidfd, where the kernel has pidfs; `None` on older kernels, where every
/// pidfd shares one anonymous inode.
fn pidfs_ino(pidfd: BorrowedFd<'_>) -> Option<u64> {
    let fs = rustix::fs::fstatfs(pidfd).ok()?;
    if fs.f_type as u64 != PIDFS_MAGIC {
        return None;
    }
    rustix::fs::fstat(pidfd).ok().map(|st| st.st_ino)
}

/// Reads a small `/proc` file whole: one `read` into a buffer that holds it, then one that sees
/// the end. `read_to_string` sizes its buffer from the file's size, 0 for `/proc`, and grows it
/// from 32 bytes: six reads for `/proc/PID/stat`, each of which makes the kernel render the
/// line again (issue 11: twice on every run path).
pub(crate) fn read_small(path: &Path) -> io::Result<String> {
    use std::io::Read;
    let mut f = std::fs::File::open(path)?;
    let mut buf = Vec::with_capacity(4096);
    let mut chunk = [0u8; 4096];
    loop {
        match f.read(&mut chunk) {
            Ok(0) => break,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    String::from_utf8(buf).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
}

/// Reads pid's start time and executable through `/proc`.
fn read_proc(pid: u32) -> Result<(u64, PathBuf), IdentityError> {
    let stat_path = PathBuf::from(format!("/proc/{pid}/stat"));
    let stat = read_small(&stat_path).map_err(|e| {
        if e.kind() == io::ErrorKind::NotFound || e.raw_os_error() == Some(libc_esrch()) {
            IdentityError::NoSuchProcess { pid }
        } else {
            IdentityError::Io {
                path: stat_path.clone(),
                source: e,
            }
        }
    })?;
    let start_time = parse_start_time(&stat).map_err(|reason| IdentityError::BadStat {
        path: stat_path,
        reason,
    })?;
    let exe_path = PathBuf::from(format!("/proc/{pid}/exe"));
    let exe = match std::fs::read_link(&exe_path) {
        Ok(p) => p,
        // A zombie or kernel thread has no executable; it cannot be a recorded owner.
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            return Err(IdentityError::NoSuchProcess { pid });
        }
        Err(e) => {
            return Err(IdentityError::Io {
                path: exe_path,
                source: e,
            });
        }
    };
    Ok((start_time, exe))
}

fn libc_esrch() -> i32 {
    rustix::io::Errno::SRCH.raw_os_error()
}

impl Identity {
    /// Whether this identity can be written into a record: its executable's path is UTF-8
    /// (records are JSON, which holds a path as text).
    pub fn recordable(&self) -> Result<(), IdentityError> {
        match self.exe.to_str() {
            Some(_) => Ok(()),
            None => Err(IdentityError::NotUtf8Exe {
                pid: self.pid,
                exe: self.exe.clone(),
            }),
        }
    }

    /// The identity of the calling process.
    pub fn of_self() -> Result<Identity, IdentityError> {
        // Read once per process (a forked child has another pid and reads its own): this
        // process's identity does not change while it runs, and every acquisition records
        // it, so `/proc` is not read again on the run path (issue 11).
        static SELF: std::sync::Mutex<Option<Identity>> = std::sync::Mutex::new(None);
        let pid = std::process::id();
        let mut cached = SELF
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(me) = cached.as_ref().filter(|me| me.pid == pid) {
            return Ok(me.clone());
        }
        let me = Identity::of_pid(pid)?;
        *cached = Some(me.clone());
        Ok(me)
    }

    /// The identity of the process that currently has `pid`.
    pub fn of_pid(pid: u32) -> Result<Identity, IdentityError> {
        let pidfd = open_pidfd(pid)
            .map_err(|source| IdentityError::Io {
                path: PathBuf::from(format!("pidfd of process {pid}")),
                source,
            })?
            .ok_or(IdentityError::NoSuchProcess { pid })?;
        Identity::through_pidfd(pid, pidfd.as_fd())
    }

    /// The identity of a child this process started, read through the pidfd it holds for it
    /// (the runner's workload: no second pidfd, issue 11).
    pub(crate) fn of_child(pid: u32, pidfd: BorrowedFd<'_>) -> Result<Identity, IdentityError> {
        Identity::through_pidfd(pid, pidfd)
    }

    /// Reads the identity of the process a pidfd pins: `/proc` is read after the pidfd was
    /// opened, and the pidfd is checked afterwards, so the result describes that very process.
    fn through_pidfd(pid: u32, pidfd: BorrowedFd<'_>) -> Result<Identity, IdentityError> {
        let (start_time, exe) = read_proc(pid)?;
        if has_exited(pidfd) {
            return Err(IdentityError::NoSuchProcess { pid });
        }
        Ok(Identity {
            pid,
            start_time,
            exe,
            pidfs_ino: pidfs_ino(pidfd),
        })
    }

    /// Whether `other` (read now) is the process this identity recorded.
    pub fn matches(&self, other: &Identity) -> bool {
        self.pid == other.pid
            && self.start_time == other.start_time
            && same_exe(&self.exe, &other.exe)
            && match (self.pidfs_ino, other.pidfs_ino) {
                (Some(a), Some(b)) => a == b,
                // One side was recorded without pidfs (an older kernel): the other fields decide.
                _ => true,
            }
    }

    /// Whether the recorded process still runs (see [`Liveness`]). Never signals anything.
    pub fn liveness(&self) -> Liveness {
        match open_pidfd(self.pid) {
            Ok(None) => Liveness::Dead,
            // Without a pidfd (e.g. EPERM for a foreign process) we cannot pin the process; the
            // only safe answer for a takeover decision is to consult /proc alone.
            Err(_) => match read_proc(self.pid) {
                Ok((start_time, exe)) => {
                    if start_time == self.start_time && same_exe(&exe, &self.exe) {
                        Liveness::Live
                    } else {
                        Liveness::Recycled
                    }
                }
                Err(_) => Liveness::Dead,
            },
            Ok(Some(fd)) => match Identity::through_pidfd(self.pid, fd.as_fd()) {
                Ok(now) if self.matches(&now) => Liveness::Live,
                Ok(_) => Liveness::Recycled,
                Err(_) => Liveness::Dead,
            },
        }
    }
}

/// Sends `sig` to the process recorded as `identity`, only if it is still that process: the
/// pidfd is opened first, the identity re-read through `/proc` afterwards and compared, and the
/// signal goes through the pidfd, so a recycled pid is never signalled (cards D7, L5).
pub fn signal_owner(identity: &Identity, sig: Signal) -> Result<SignalOutcome, SignalError> {
    let pidfd = match open_pidfd(identity.pid) {
        Ok(Some(fd)) => fd,
        Ok(None) => return Ok(SignalOutcome::Dead),
        Err(source) => {
            return Err(SignalError::Pidfd {
                pid: identity.pid,
                source,
            });
        }
    };
    let now = match Identity::through_pidfd(identity.pid, pidfd.as_fd()) {
        Ok(now) => now,
        Err(IdentityError::NoSuchProcess { .. }) => return Ok(SignalOutcome::Dead),
        Err(e) => return Err(e.into()),
    };
    if !identity.matches(&now) {
        return Ok(SignalOutcome::Mismatch { found: Some(now) });
    }
    match rustix::process::pidfd_send_signal(&pidfd, sig) {
        Ok(()) => Ok(SignalOutcome::Delivered),
        // It exited between the check and the signal; the pidfd kept the signal from reaching
        // any other process.
        Err(rustix::io::Errno::SRCH) => Ok(SignalOutcome::Dead),
        Err(e) => Err(SignalError::Pidfd {
            pid: identity.pid,
            source: e.into(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn start_time_is_field_22_after_the_last_paren() {
        let line =
            "1234 (a) b) (c) S 1 1234 1234 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 987654 1000 10";
        assert_eq!(parse_start_time(line), Ok(987654));
        assert!(parse_start_time("1234 (x) S 1 2").is_err());
        assert!(parse_start_time("no paren").is_err());
    }

    #[test]
    fn self_identity_is_live_and_stable() {
        let me = Identity::of_self().unwrap();
        assert_eq!(me.pid, std::process::id());
        assert!(me.exe.is_absolute());
        assert_eq!(me.liveness(), Liveness::Live);
        assert!(me.matches(&Identity::of_self().unwrap()));
        let mut other = me.clone();
        other.start_time += 1;
        assert_eq!(other.liveness(), Liveness::Recycled);
        let mut other = me.clone();
        other.exe = PathBuf::from("/usr/bin/not-this-one");
        assert_eq!(other.liveness(), Liveness::Recycled);
    }

    #[test]
    fn deleted_suffix_is_the_same_exe() {
        assert!(same_exe(Path::new("/a/b (deleted)"), Path::new("/a/b")));
        assert!(!same_exe(Path::new("/a/b"), Path::new("/a/c")));
    }

    #[test]
    fn reaped_child_is_dead() {
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let id = Identity::of_pid(child.id()).unwrap();
        assert_eq!(id.liveness(), Liveness::Live);
        child.kill().unwrap();
        child.wait().unwrap();
        assert_eq!(id.liveness(), Liveness::Dead);
        assert_eq!(
            signal_owner(&id, Signal::TERM).unwrap(),
            SignalOutcome::Dead
        );
    }
}

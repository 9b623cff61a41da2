//! The kernel lock: the only module in tenure that calls `flock`.
//!
//! Ownership of a state dir is an exclusive `flock` on `.tenure/lock`, taken on a descriptor
//! opened `O_CLOEXEC` (a supervised child never inherits it) and held for the whole ownership.
//! The kernel drops it when the holder's last descriptor closes, including when the holder is
//! SIGKILLed, so crash takeover needs no guessing. `flock` (not a POSIX `fcntl` lock) because a
//! POSIX lock belongs to the process and vanishes when *any* descriptor of the file is closed.
//!
//! ## Waiting without a sleep-poll loop and without an uncancellable blocking call
//! A blocking `flock` cannot be cancelled except by a signal handler, and a sleep-poll loop is
//! either slow or busy. Instead a waiter watches the lock file with inotify for
//! `IN_CLOSE_WRITE | IN_CLOSE_NOWRITE` (the watch is on `/proc/self/fd/N`, the very inode it has
//! open) and `poll`s on [inotify fd, caller's cancel fd] with the remaining bound:
//!
//! 1. the watch is registered *before* the try-lock that precedes each `poll`, so a release
//!    between the try and the `poll` still leaves an event and no wake-up is lost;
//! 2. an orderly release unlocks (`LOCK_UN`) before closing, so the close event finds the lock
//!    already free;
//! 3. on a crash the kernel emits the close event *before* it drops the lock (`__fput` calls
//!    `fsnotify_close` before `locks_remove_file`), so a try right after the event can still
//!    fail: it is retried after 0.1, 1 and 5 ms;
//! 4. `poll` also wakes at least every [`SAFETY_WAKE`] to try again, a backstop for events that
//!    could still be missed (e.g. the inotify queue overflowing), not the wake-up mechanism
//!    (when the kernel refuses an inotify instance, waiting degrades to a try every
//!    [`DEGRADED_WAKE`], with a warning, instead of failing);
//! 5. the cancel fd becoming readable (or hung up) ends the wait at once; it is never read, so
//!    the caller's signal pipe keeps its bytes.
//!
//! Every close of the lock file by anyone (another waiter giving up, a `status` probe) wakes the
//! waiters too; they try, fail, and go back to `poll`.

use std::fs::File;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use rustix::event::{PollFd, PollFlags, Timespec};
use rustix::fs::{FlockOperation, inotify};

/// The longest `poll` sleeps before trying the lock again even without an event.
pub(crate) const SAFETY_WAKE: Duration = Duration::from_millis(500);

/// Pauses between the tries that follow a close event (see the module docs, step 3).
const RETRY_AFTER_EVENT: [Duration; 3] = [
    Duration::from_micros(100),
    Duration::from_millis(1),
    Duration::from_millis(5),
];

/// How a wait for the lock ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum WaitEnd {
    /// The lock is now held on the caller's descriptor.
    Acquired,
    /// The bound expired while another holder kept the lock.
    Expired,
    /// The cancel descriptor became readable.
    Cancelled,
}

fn flock(file: &File, op: FlockOperation) -> io::Result<()> {
    loop {
        match rustix::fs::flock(file, op) {
            Err(rustix::io::Errno::INTR) => continue,
            other => return other.map_err(io::Error::from),
        }
    }
}

/// One non-blocking attempt at the exclusive lock.
pub(crate) fn try_lock(file: &File) -> io::Result<bool> {
    match flock(file, FlockOperation::NonBlockingLockExclusive) {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(false),
        Err(e) => Err(e),
    }
}

/// Whether some descriptor holds the lock, without disturbing the holder: a shared
/// non-blocking attempt on the caller's own (separate) open file description, released at once.
/// While it lasts (microseconds) an exclusive try-lock by a contender would fail, which is why
/// a contender retries briefly before it reports `busy`.
pub(crate) fn probe_held(file: &File) -> io::Result<bool> {
    match flock(file, FlockOperation::NonBlockingLockShared) {
        Ok(()) => {
            flock(file, FlockOperation::Unlock)?;
            Ok(false)
        }
        Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(true),
        Err(e) => Err(e),
    }
}

/// True when `fd` is readable or hung up right now (or within `timeout`).
fn readable(fd: BorrowedFd<'_>, timeout: Duration) -> io::Result<bool> {
    let mut fds = [PollFd::new(&fd, PollFlags::IN)];
    poll(&mut fds, Some(timeout))?;
    Ok(!fds[0].revents().is_empty())
}

fn poll(fds: &mut [PollFd<'_>], timeout: Option<Duration>) -> io::Result<usize> {
    let ts = timeout.map(|d| Timespec {
        tv_sec: d.as_secs() as _,
        tv_nsec: d.subsec_nanos() as _,
    });
    match rustix::event::poll(fds, ts.as_ref()) {
        Ok(n) => Ok(n),
        // A signal interrupted the wait; the caller's loop recomputes the bound and goes on.
        Err(rustix::io::Errno::INTR) => Ok(0),
        Err(e) => Err(e.into()),
    }
}

/// How long `poll` sleeps between tries when no inotify watch could be had (degraded mode).
pub(crate) const DEGRADED_WAKE: Duration = Duration::from_millis(20);

/// An inotify watch for closes of the lock file. When the kernel refuses one (inotify instance
/// or watch limits exhausted, or no inotify at all), waiting degrades to trying every
/// [`DEGRADED_WAKE`] with a warning, rather than failing the acquisition.
#[derive(Debug)]
pub(crate) struct CloseWatch {
    inotify: Option<OwnedFd>,
    /// Hands the instance to the thread that closes it (see `Drop`).
    closer: Option<std::sync::mpsc::Sender<OwnedFd>>,
}

/// Closing an inotify instance waits for the kernel to retire its watches (an RCU grace
/// period: about 14 ms measured on the project's machine), and the watch ends the moment the
/// waiter owns: closed inline, it would be the largest cost of a handoff (issue 11). It is
/// closed on a short-lived thread instead, started when the watch is made (while the waiter
/// waits anyway), so that the handoff only hands it the descriptor; if no thread could be had,
/// it is closed inline after all.
impl Drop for CloseWatch {
    fn drop(&mut self) {
        if let Some(fd) = self.inotify.take()
            && let Some(closer) = self.closer.take()
        {
            // A closer that is gone gives the descriptor back, and it is closed here.
            let _ = closer.send(fd);
        }
    }
}

/// A thread that closes the inotify instance it is handed (or exits when the watch is dropped
/// without one).
fn closer() -> Option<std::sync::mpsc::Sender<OwnedFd>> {
    let (tx, rx) = std::sync::mpsc::channel::<OwnedFd>();
    std::thread::Builder::new()
        .name("tenure-inotify-close".into())
        .spawn(move || drop(rx.recv()))
        .ok()
        .map(|_| tx)
}

impl CloseWatch {
    /// Watches the inode `lock` has open.
    pub(crate) fn new(lock: &File, path: &Path) -> io::Result<CloseWatch> {
        match CloseWatch::watch(lock) {
            Ok(fd) => Ok(CloseWatch {
                inotify: Some(fd),
                closer: closer(),
            }),
            Err(e)
                if matches!(
                    e,
                    rustix::io::Errno::MFILE
                        | rustix::io::Errno::NFILE
                        | rustix::io::Errno::NOSPC
                        | rustix::io::Errno::NOSYS
                ) =>
            {
                log::warn!(
                    "cannot watch {} with inotify ({e}); waiting by trying every {} ms: raise fs.inotify.max_user_instances or max_user_watches",
                    path.display(),
                    DEGRADED_WAKE.as_millis()
                );
                Ok(CloseWatch {
                    inotify: None,
                    closer: None,
                })
            }
            Err(e) => Err(e.into()),
        }
    }

    fn watch(lock: &File) -> rustix::io::Result<OwnedFd> {
        let inotify =
            inotify::init(inotify::CreateFlags::CLOEXEC | inotify::CreateFlags::NONBLOCK)?;
        let target = format!("/proc/self/fd/{}", lock.as_raw_fd());
        inotify::add_watch(
            &inotify,
            target.as_str(),
            inotify::WatchFlags::CLOSE_WRITE | inotify::WatchFlags::CLOSE_NOWRITE,
        )?;
        Ok(inotify)
    }

    /// Discards queued events after a failed try: the caller tries the lock again right after
    /// (the retries that follow an event), so a release whose event is discarded here is still
    /// seen by that try, and a later one leaves an event of its own.
    fn drain(&self) {
        let Some(fd) = &self.inotify else { return };
        let mut buf = [0u8; 4096];
        while let Ok(n) = rustix::io::read(fd, &mut buf) {
            if n == 0 {
                break;
            }
        }
    }
}

/// Waits for the exclusive lock on `lock` until `deadline` (none: forever) or until `cancel`
/// becomes readable. The caller has made one failed try already and registered `watch` before
/// that try or calls this right after registering it (this function tries before sleeping).
pub(crate) fn wait(
    lock: &File,
    watch: &CloseWatch,
    deadline: Option<Instant>,
    cancel: Option<BorrowedFd<'_>>,
) -> io::Result<WaitEnd> {
    loop {
        if try_lock(lock)? {
            return Ok(WaitEnd::Acquired);
        }
        let remaining = deadline.map(|d| d.saturating_duration_since(Instant::now()));
        if remaining == Some(Duration::ZERO) {
            return Ok(WaitEnd::Expired);
        }
        let wake = if watch.inotify.is_some() {
            SAFETY_WAKE
        } else {
            DEGRADED_WAKE
        };
        let timeout = remaining.map_or(wake, |r| r.min(wake));
        let (woken, cancelled) = {
            let mut fds = Vec::with_capacity(2);
            if let Some(c) = cancel.as_ref() {
                fds.push(PollFd::new(c, PollFlags::IN));
            }
            if let Some(i) = watch.inotify.as_ref() {
                fds.push(PollFd::new(i, PollFlags::IN));
            }
            poll(&mut fds, Some(timeout))?;
            let cancelled = cancel.is_some() && !fds[0].revents().is_empty();
            let woken = watch.inotify.is_some() && !fds[fds.len() - 1].revents().is_empty();
            (woken, cancelled)
        };
        if cancelled {
            return Ok(WaitEnd::Cancelled);
        }
        if woken {
            // The lock first, the queued events after (issue 11: the handoff): a waiter that
            // wins never needs them, since its watch ends with the wait.
            if try_lock(lock)? {
                return Ok(WaitEnd::Acquired);
            }
            watch.drain();
            for pause in RETRY_AFTER_EVENT {
                if let Some(c) = cancel {
                    if readable(c, pause)? {
                        return Ok(WaitEnd::Cancelled);
                    }
                } else {
                    std::thread::sleep(pause);
                }
                if try_lock(lock)? {
                    return Ok(WaitEnd::Acquired);
                }
            }
        }
    }
}

/// True when `cancel` is readable (or hung up) right now.
pub(crate) fn is_cancelled(cancel: Option<BorrowedFd<'_>>) -> io::Result<bool> {
    match cancel {
        Some(c) => readable(c, Duration::ZERO),
        None => Ok(false),
    }
}

/// The held lock. Dropping it unlocks (`LOCK_UN`, so waiters woken by the close find it free)
/// and closes the descriptor; a failure to unlock is logged, never a panic: closing the
/// descriptor releases the lock anyway.
///
/// Once the lock was [shared](LockGuard::share) with a workload, dropping it only closes this
/// descriptor: a `flock` belongs to the open file description, so `LOCK_UN` through any
/// duplicate would free the dir while the workload's duplicates still guard it. Only an orderly
/// [`LockGuard::unlock`], once the workload is gone, unlocks.
#[derive(Debug)]
pub(crate) struct LockGuard {
    file: Option<File>,
    path: PathBuf,
    shared: bool,
}

impl LockGuard {
    /// Wraps a descriptor on which the exclusive lock was just taken.
    pub(crate) fn new(file: File, path: PathBuf) -> LockGuard {
        LockGuard {
            file: Some(file),
            path,
            shared: false,
        }
    }

    /// A duplicate of the locked descriptor (same open file description, so the same lock),
    /// `O_CLOEXEC` and numbered 3 or above, for a workload to inherit. From now on dropping the
    /// guard no longer unlocks.
    pub(crate) fn share(&mut self) -> io::Result<OwnedFd> {
        let file = self
            .file
            .as_ref()
            .ok_or_else(|| io::Error::other("the lock was already released"))?;
        let dup = rustix::io::fcntl_dupfd_cloexec(file, 3)?;
        self.shared = true;
        Ok(dup)
    }

    /// The locked descriptor (for identity checks such as `fstat`).
    pub(crate) fn fd(&self) -> Option<BorrowedFd<'_>> {
        self.file.as_ref().map(|f| f.as_fd())
    }

    /// Unlocks and closes, reporting an unlock failure to the caller.
    pub(crate) fn unlock(mut self) -> io::Result<()> {
        match self.file.take() {
            Some(file) => flock(&file, FlockOperation::Unlock),
            None => Ok(()),
        }
    }
}

impl Drop for LockGuard {
    fn drop(&mut self) {
        if let Some(file) = self.file.take()
            && !self.shared
            && let Err(e) = flock(&file, FlockOperation::Unlock)
        {
            log::warn!(
                "failed to unlock {}: {e}; closing the descriptor releases it",
                self.path.display()
            );
        }
    }
}

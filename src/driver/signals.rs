//! Signal intake. No catchable signal ends the runner by its default action (card T3): every one
//! of them is caught and becomes a readable byte on one of two self-pipes, plus a flag per signal
//! number, so the event loop can `poll` them together with the child's pidfd.
//!
//! - **Stop signals** (TERM, INT, HUP) go to the *stop pipe*. The lease wait watches it as its
//!   cancel descriptor, so a stop signal ends a wait at once (card G1); nothing else does.
//! - **Every other catchable signal** (QUIT, USR1, USR2, ALRM, WINCH, the real-time signals, ...)
//!   and SIGCHLD go to the *other pipe*: the former are relayed to the workload,
//!   SIGCHLD says that a child (the main process or an orphan the runner adopted as subreaper)
//!   changed state.
//!
//! Left alone, with their default action: SIGKILL and SIGSTOP (they cannot be caught); the
//! fault signals ILL, TRAP, BUS, FPE, SEGV and SYS (they report a bug in the runner itself, and a
//! handler that returns would re-run the faulting instruction forever); SIGPIPE (ignored by the
//! Rust runtime, so a closed stderr is an `EPIPE` error, not a signal to forward); and the job
//! control signals TSTP, TTIN, TTOU and CONT (they suspend and resume the runner, never end it;
//! SIGSTOP, their uncatchable partner, could not be relayed either).
//!
//! The flags are `std` atomics, not `crate::sync` ones: they are written from a signal handler,
//! which only `std`'s lock-free atomics are safe for. The handler sets the flag before it writes
//! the byte, so a reader woken by the byte always finds the flag.

use crate::machine::Signal;
use rustix::event::{PollFd, PollFlags, poll};
use std::io::{self, Read};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

/// SIGCHLD.
const SIGCHLD: u8 = 17;

/// The signals relayed to the workload, by number (Linux): QUIT, ABRT, USR1, USR2, ALRM, STKFLT,
/// URG, XCPU, XFSZ, VTALRM, PROF, WINCH, IO, PWR and SIGRTMIN (34) to SIGRTMAX (64).
pub const RELAYED: [u8; 45] = {
    let mut v = [0u8; 45];
    let classic = [3, 6, 10, 12, 14, 16, 23, 24, 25, 26, 27, 28, 29, 30];
    let mut i = 0;
    while i < classic.len() {
        v[i] = classic[i];
        i += 1;
    }
    let mut rt = 34;
    while rt <= 64 {
        v[i] = rt;
        i += 1;
        rt += 1;
    }
    v
};

/// What arrived besides stop signals.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Others {
    /// Signals to relay to the workload, by number, in ascending order, each at most once.
    pub relay: Vec<u8>,
    /// SIGCHLD arrived: a child changed state.
    pub child: bool,
}

/// The registered handlers and the read ends of their pipes.
pub struct SignalIntake {
    stop: UnixStream,
    other: UnixStream,
    flags: Arc<[AtomicBool; 65]>,
    ids: Vec<signal_hook::SigId>,
}

impl SignalIntake {
    /// Registers the handlers. Signals that arrived before this call were handled by the default
    /// action (the process ended), so call it first thing.
    pub fn install() -> io::Result<SignalIntake> {
        let (stop, stop_w) = UnixStream::pair()?;
        let (other, other_w) = UnixStream::pair()?;
        for s in [&stop, &stop_w, &other, &other_w] {
            // Non-blocking on both ends: a handler never blocks on a full pipe (a flag is set
            // anyway, and one byte waiting is enough to wake the reader).
            s.set_nonblocking(true)?;
        }
        let stop_w: Arc<OwnedFd> = Arc::new(stop_w.into());
        let other_w: Arc<OwnedFd> = Arc::new(other_w.into());
        let flags: Arc<[AtomicBool; 65]> =
            Arc::new(std::array::from_fn(|_| AtomicBool::new(false)));
        let mut ids = Vec::new();
        let stops = Signal::ALL.map(Signal::number);
        for n in stops.into_iter().chain(RELAYED).chain([SIGCHLD]) {
            let pipe = if stops.contains(&n) {
                stop_w.clone()
            } else {
                other_w.clone()
            };
            let flags = flags.clone();
            let action = move || {
                flags[usize::from(n)].store(true, Ordering::SeqCst);
                let _ = rustix::io::write(&*pipe, &[n]);
            };
            // SAFETY: the handler only stores to a lock-free atomic and makes one `write`
            // system call on a non-blocking descriptor it keeps alive: both are
            // async-signal-safe, and it allocates nothing.
            let id = unsafe { signal_hook::low_level::register(i32::from(n), action) }?;
            ids.push(id);
        }
        Ok(SignalIntake {
            stop,
            other,
            flags,
            ids,
        })
    }

    /// The fd that becomes readable when a stop signal arrives (not consumed by polling it): the
    /// cancel descriptor of a lease wait.
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.stop.as_fd()
    }

    /// The fd that becomes readable when any other signal arrives.
    pub fn other_fd(&self) -> BorrowedFd<'_> {
        self.other.as_fd()
    }

    fn flag(&self, n: u8) -> bool {
        self.flags[usize::from(n)].swap(false, Ordering::SeqCst)
    }

    /// Drains the stop pipe and returns the stop signals that arrived since the last call, in a
    /// fixed order (TERM, INT, HUP); each at most once per call.
    pub fn take(&self) -> Vec<Signal> {
        let mut buf = [0u8; 64];
        while matches!((&self.stop).read(&mut buf), Ok(n) if n > 0) {}
        Signal::ALL
            .into_iter()
            .filter(|s| self.flag(s.number()))
            .collect()
    }

    /// Drains the other pipe and returns what arrived since the last call.
    pub fn take_others(&self) -> Others {
        let mut buf = [0u8; 64];
        while matches!((&self.other).read(&mut buf), Ok(n) if n > 0) {}
        Others {
            relay: RELAYED.into_iter().filter(|n| self.flag(*n)).collect(),
            child: self.flag(SIGCHLD),
        }
    }

    /// Whether a stop signal is pending, without consuming it.
    pub fn pending(&self) -> bool {
        let mut fds = [PollFd::new(&self.stop, PollFlags::IN)];
        matches!(poll(&mut fds, Some(&rustix::time::Timespec::default())), Ok(n) if n > 0)
    }
}

impl Drop for SignalIntake {
    fn drop(&mut self) {
        for id in self.ids.drain(..) {
            signal_hook::low_level::unregister(id);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn relayed_signals_exclude_stops_faults_and_job_control() {
        for n in [
            1, 2, 15, 4, 5, 7, 8, 11, 31, 9, 19, 13, 17, 20, 21, 22, 32, 33,
        ] {
            assert!(!RELAYED.contains(&n), "{n} must not be relayed");
        }
        assert!(RELAYED.contains(&10) && RELAYED.contains(&12) && RELAYED.contains(&28));
        assert_eq!(RELAYED.last(), Some(&64));
    }
}

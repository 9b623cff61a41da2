//! Signal intake: SIGTERM, SIGINT and SIGHUP become readable bytes on one self-pipe plus one
//! flag per signal, so the event loop can `poll` them together with the child's pidfd, and the
//! lease wait can be cancelled by the same fd becoming readable.
//!
//! The flags are `std` atomics, not `crate::sync` ones: they are written from a signal handler,
//! which only `std`'s lock-free atomics are safe for (signal-hook requires exactly these).

use crate::machine::Signal;
use rustix::event::{PollFd, PollFlags, poll};
use std::io::{self, Read};
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::net::UnixStream;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

/// The registered handlers and the read end of their pipe.
pub struct SignalIntake {
    read: UnixStream,
    flags: [(Signal, Arc<AtomicBool>); 3],
    ids: Vec<signal_hook::SigId>,
}

impl SignalIntake {
    /// Registers handlers for the three stop signals. Signals that arrived before this call were
    /// handled by the default action (the process ended), so call it first thing.
    pub fn install() -> io::Result<SignalIntake> {
        let (read, write) = UnixStream::pair()?;
        read.set_nonblocking(true)?;
        let flags = Signal::ALL.map(|s| (s, Arc::new(AtomicBool::new(false))));
        let mut ids = Vec::new();
        for (sig, flag) in &flags {
            let n = i32::from(sig.number());
            // The flag is set before the byte is written (handlers run in registration order),
            // so a reader woken by the byte always finds the flag.
            ids.push(signal_hook::flag::register(n, flag.clone())?);
            ids.push(signal_hook::low_level::pipe::register(
                n,
                write.try_clone()?,
            )?);
        }
        Ok(SignalIntake { read, flags, ids })
    }

    /// The fd that becomes readable when a stop signal arrives (not consumed by polling it).
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.read.as_fd()
    }

    /// Drains the pipe and returns the signals that arrived since the last call, in a fixed
    /// order (TERM, INT, HUP); each at most once per call.
    pub fn take(&self) -> Vec<Signal> {
        let mut buf = [0u8; 64];
        while matches!((&self.read).read(&mut buf), Ok(n) if n > 0) {}
        self.flags
            .iter()
            .filter(|(_, f)| f.swap(false, Ordering::SeqCst))
            .map(|(s, _)| *s)
            .collect()
    }

    /// Whether a signal is pending, without consuming it.
    pub fn pending(&self) -> bool {
        let mut fds = [PollFd::new(&self.read, PollFlags::IN)];
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

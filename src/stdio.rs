//! The process's standard streams, written without ever panicking.
//!
//! `std`'s `println!` panics when a write fails ("failed printing to stdout: Broken pipe"), so
//! `tenure status | true` used to die with 101. Every print of this crate goes through
//! [`out`] and [`err`] instead (the crate root shadows `println!`, `print!`, `eprintln!` and
//! `eprint!` with macros that call them, so no call site can forget): a line that cannot be
//! written because the reader went away (`EPIPE`) or the stream is closed is dropped, and the
//! command carries on and exits with the status of what it did — ripgrep's convention for a
//! closed pipe. Output is evidence; the effect of `stop`, `run` or `init` never depends on
//! whether someone still reads it.
//!
//! [`reserve_std_fds`] runs first in `main`: a closed descriptor 0, 1 or 2 (`tenure ... >&-`)
//! would otherwise be handed out by the next `open`, and a later print would land in whatever
//! file took its number — possibly a record of the state dir. It is reopened on `/dev/null`.
//!
//! **Stderr never blocks the runner.** A stderr that nobody reads (`tenure run … 2>&1 |
//! stalled-reader`, a journal that stalls) used to block the runner in `write`, on its own
//! progress lines or on the child's stderr it relays, and a blocked runner handled no stop
//! signal: no SIGTERM forwarded, no grace, no escalation. Every write to stderr now goes out
//! only as far as the stream takes it without waiting (`poll` for `POLLOUT`, then at most
//! `PIPE_BUF` bytes, which a pipe with room takes whole); the rest waits, in order, in a queue
//! that the run's event loop writes out when the stream has room again ([`err_pending`],
//! [`flush_err_ready`]) and that the end of the run writes out waiting as long as it takes
//! ([`flush_err`]). Nothing is dropped unless the reader went away or the queue passed
//! [`ERR_QUEUE_MAX`] (then the count is kept, and said once the stream takes it). The child's
//! stderr is read only while the queue holds less than [`ERR_RELAY_ROOM`]: past that, a child
//! that writes faster than stderr is read waits in its own `write`, as it would writing to that
//! stderr itself, while the runner goes on handling signals.

use std::collections::VecDeque;
use std::fmt;
use std::io::Write;
use std::os::fd::AsFd;
use std::sync::Mutex;

/// Past this many bytes waiting for stderr, the child's stderr is not read until some were
/// written (the child waits, as a writer to a full pipe does).
pub const ERR_RELAY_ROOM: usize = 256 * 1024;

/// At most this many bytes wait for stderr; what comes beyond it is counted and dropped. Only
/// the runner's own lines can get there (the relay stops at [`ERR_RELAY_ROOM`]), plus what the
/// child's pipe still held when it exited.
pub const ERR_QUEUE_MAX: usize = 4 * 1024 * 1024;

/// What waits for stderr.
struct ErrQueue {
    bytes: VecDeque<u8>,
    /// Bytes dropped because the queue was full.
    dropped: u64,
    /// The stream failed for good (the reader went away, the descriptor is closed): nothing is
    /// written or kept any more.
    broken: bool,
}

static ERR: Mutex<ErrQueue> = Mutex::new(ErrQueue {
    bytes: VecDeque::new(),
    dropped: 0,
    broken: false,
});

fn err_queue() -> std::sync::MutexGuard<'static, ErrQueue> {
    ERR.lock().unwrap_or_else(|p| p.into_inner())
}

/// How one attempt to write to stderr went.
enum Wrote {
    /// This many bytes were taken.
    Some(usize),
    /// The stream has no room now.
    Full,
    /// The stream failed for good.
    Broken,
}

/// Writes a prefix of `bytes` to stderr if the stream has room now (or, with `wait`, once it
/// has), never more than a pipe takes without blocking.
fn write_some(bytes: &[u8], wait: bool) -> Wrote {
    use rustix::event::{PollFd, PollFlags, poll};
    let fd = rustix::stdio::stderr();
    let mut fds = [PollFd::new(&fd, PollFlags::OUT)];
    let zero = rustix::time::Timespec::default();
    match poll(&mut fds, if wait { None } else { Some(&zero) }) {
        Ok(0) => return Wrote::Full,
        Ok(_) => {}
        Err(rustix::io::Errno::INTR) => return Wrote::Full,
        Err(_) => return Wrote::Broken,
    }
    let revents = fds[0].revents();
    if revents.contains(PollFlags::NVAL) || revents.contains(PollFlags::ERR) {
        return Wrote::Broken;
    }
    if !revents.contains(PollFlags::OUT) {
        // POLLHUP alone: the reader is gone.
        return if revents.contains(PollFlags::HUP) {
            Wrote::Broken
        } else {
            Wrote::Full
        };
    }
    // PIPE_BUF: a pipe that polls writable has a free page, and takes this much whole.
    let n = bytes.len().min(4096);
    match rustix::io::write(fd.as_fd(), &bytes[..n]) {
        Ok(0) => Wrote::Full,
        Ok(n) => Wrote::Some(n),
        Err(rustix::io::Errno::AGAIN | rustix::io::Errno::INTR) => Wrote::Full,
        Err(_) => Wrote::Broken,
    }
}

impl ErrQueue {
    /// Writes what waits, in order, as far as the stream takes it (`wait`: all of it).
    fn flush(&mut self, wait: bool) {
        while !self.broken {
            if self.bytes.is_empty() {
                if self.dropped == 0 {
                    return;
                }
                let note = format!(
                    "tenure: warning: {} bytes of stderr were dropped: stderr was not read while they came\n",
                    std::mem::take(&mut self.dropped)
                );
                self.bytes.extend(note.as_bytes());
            }
            let (front, _) = self.bytes.as_slices();
            match write_some(front, wait) {
                Wrote::Some(n) => {
                    self.bytes.drain(..n);
                }
                // Waiting, a signal's interruption (or a writer beside us that took the room
                // first) only means trying again.
                Wrote::Full if wait => {}
                Wrote::Full => return,
                Wrote::Broken => {
                    self.broken = true;
                    self.bytes = VecDeque::new();
                    self.dropped = 0;
                }
            }
        }
    }

    fn push(&mut self, mut bytes: &[u8]) {
        if self.broken {
            return;
        }
        // Straight out while nothing waits ahead of it.
        while self.bytes.is_empty() && self.dropped == 0 && !bytes.is_empty() {
            match write_some(bytes, false) {
                Wrote::Some(n) => bytes = &bytes[n..],
                Wrote::Full => break,
                Wrote::Broken => {
                    self.broken = true;
                    return;
                }
            }
        }
        let room = ERR_QUEUE_MAX.saturating_sub(self.bytes.len());
        let kept = bytes.len().min(room);
        self.bytes.extend(&bytes[..kept]);
        self.dropped += (bytes.len() - kept) as u64;
    }
}

/// Writes `bytes` to stderr without ever waiting: what the stream does not take now waits in
/// the queue (see the module's notes).
pub fn err_bytes(bytes: &[u8]) {
    err_queue().push(bytes);
}

/// Whether bytes wait for stderr: the event loop then polls it for `POLLOUT` and calls
/// [`flush_err_ready`].
pub fn err_pending() -> bool {
    let q = err_queue();
    !q.broken && (!q.bytes.is_empty() || q.dropped > 0)
}

/// Whether the child's stderr may be read now: less than [`ERR_RELAY_ROOM`] bytes wait.
pub fn err_relay_room() -> bool {
    err_queue().bytes.len() < ERR_RELAY_ROOM
}

/// Writes what waits for stderr as far as the stream takes it now.
pub fn flush_err_ready() {
    err_queue().flush(false);
}

/// Writes everything that waits for stderr, waiting for the stream as long as it takes (at the
/// end of a run or a command: nothing depends on the process any more).
pub fn flush_err() {
    err_queue().flush(true);
}

/// Opens `/dev/null` on each of the descriptors 0, 1 and 2 that is closed, so that no file the
/// process opens later can take their numbers. Call it before anything else opens a file.
pub fn reserve_std_fds() {
    // rustix's descriptors, not std's handles: `std::io::stdin()` would set up its 8 KiB
    // buffer (and stdout its line buffer) only to be asked for a number.
    let fds = [
        rustix::io::fcntl_getfd(rustix::stdio::stdin()),
        rustix::io::fcntl_getfd(rustix::stdio::stdout()),
        rustix::io::fcntl_getfd(rustix::stdio::stderr()),
    ];
    for probe in fds {
        if probe == Err(rustix::io::Errno::BADF) {
            // open() returns the lowest free descriptor, which is this one: the lower ones are
            // open (handled in order) and nothing else runs yet.
            if let Ok(null) = rustix::fs::open(
                "/dev/null",
                // Not close-on-exec: the child inherits its stdio from the runner.
                rustix::fs::OFlags::RDWR,
                rustix::fs::Mode::empty(),
            ) {
                // Kept open for the life of the process, under its number.
                std::mem::forget(null);
            }
        }
    }
}

/// Writes to stdout; a failed write (closed pipe, closed stream) is dropped.
pub fn out(args: fmt::Arguments<'_>) {
    let mut s = std::io::stdout().lock();
    let _ = s.write_fmt(args);
    let _ = s.flush();
}

/// Writes to stderr without ever waiting ([`err_bytes`]); a failed write is dropped. The text is
/// formatted first and written with one `write` (stderr is unbuffered: formatting straight into it made one system call per
/// piece of the line, about ten for each progress line of `tenure run`), which also keeps a
/// line whole beside other writers of the same stream.
pub fn err(args: fmt::Arguments<'_>) {
    match args.as_str() {
        Some(text) => err_bytes(text.as_bytes()),
        None => err_bytes(args.to_string().as_bytes()),
    }
}

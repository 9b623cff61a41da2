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

use std::fmt;
use std::io::Write;

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

/// Writes to stderr; a failed write is dropped. The text is formatted first and written with
/// one `write` (stderr is unbuffered: formatting straight into it made one system call per
/// piece of the line, about ten for each progress line of `tenure run`), which also keeps a
/// line whole beside other writers of the same stream.
pub fn err(args: fmt::Arguments<'_>) {
    match args.as_str() {
        Some(text) => {
            let _ = std::io::stderr().lock().write_all(text.as_bytes());
        }
        None => {
            let text = args.to_string();
            let _ = std::io::stderr().lock().write_all(text.as_bytes());
        }
    }
}

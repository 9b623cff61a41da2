//! Named crash points for tests.
//!
//! Product code calls [`hit`] with a name such as `publish.blob.fsync` just before a step whose
//! interruption a test wants to prove harmless. Without the `failpoints` cargo feature `hit` is an
//! inlined `Ok(())`, so release builds carry no trace of it. With the feature, the action for a
//! name comes from [`configure`] (in-process tests) or else from the environment variable
//! `TENURE_FAILPOINTS` (child processes), a comma-separated list of `name=action`:
//!
//! - `abort`: `std::process::abort()` (SIGABRT, no unwinding, no destructors);
//! - `kill`: SIGKILL to the calling process, the harshest crash a process can have;
//! - `eio`: `hit` returns an `EIO` error, which the caller treats exactly as if the step itself
//!   had failed with it (for an fsync: the file is abandoned, never fsynced again);
//! - `stop`: at a [`pause`] point, the process stops itself with `SIGSTOP` until a test sends
//!   `SIGCONT` (a deterministic window between two steps).
//!
//! `crate::privfs` calls `hit` with `<label>.<step>` for every step it performs, where the caller
//! chooses the label (e.g. `publish.blob`) and the steps are `create`, `write`, `fsync`, `rename`,
//! `dirfsync`, `unlink`, `link` and `mkdir`. Callers add their own points (e.g. each GC step) by
//! calling `hit` directly.

#[cfg(feature = "failpoints")]
mod enabled {
    use std::io;
    // The configuration is test-only process-global state; loom's `Mutex` cannot live in a static,
    // and no loom test ever enables the `failpoints` feature, so std's is used directly.
    use std::sync::Mutex;

    /// What a crash point does when it is hit.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub enum Action {
        /// `std::process::abort()`.
        Abort,
        /// SIGKILL to this process.
        Kill,
        /// Return an `EIO` error from the step.
        Eio,
        /// Stop this process (`SIGSTOP`) until a test sends `SIGCONT`: for tests that must
        /// observe a state between two steps ([`pause`] points only).
        Stop,
    }

    static CONFIG: Mutex<Option<Vec<(String, Action)>>> = Mutex::new(None);

    /// Parses `name=action,name=action`; unknown actions and empty items are ignored so that a
    /// typo never turns into a crash the test did not ask for.
    pub fn parse(spec: &str) -> Vec<(String, Action)> {
        spec.split(',')
            .filter_map(|item| {
                let (name, action) = item.trim().split_once('=')?;
                let action = match action.trim() {
                    "abort" => Action::Abort,
                    "kill" => Action::Kill,
                    "eio" => Action::Eio,
                    "stop" => Action::Stop,
                    _ => return None,
                };
                Some((name.trim().to_owned(), action))
            })
            .collect()
    }

    /// Sets the in-process configuration (overriding `TENURE_FAILPOINTS`); `None` goes back to
    /// reading the environment.
    pub fn configure(spec: Option<&str>) {
        let mut guard = CONFIG
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        *guard = spec.map(parse);
    }

    fn action_for(name: &str) -> Option<Action> {
        let guard = CONFIG
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(list) = guard.as_ref() {
            return list.iter().find(|(n, _)| n == name).map(|(_, a)| *a);
        }
        drop(guard);
        let spec = std::env::var("TENURE_FAILPOINTS").ok()?;
        parse(&spec)
            .into_iter()
            .find(|(n, _)| n == name)
            .map(|(_, a)| a)
    }

    /// A point where the process may be paused by a test (`name=stop`), between two steps
    /// that are not I/O of their own (e.g. card P5: between taking the lock and writing the
    /// owner record).
    pub fn pause(name: &str) {
        if action_for(name) == Some(Action::Stop) {
            let _ = rustix::process::kill_process(
                rustix::process::getpid(),
                rustix::process::Signal::STOP,
            );
        }
    }

    /// Takes the configured action for `name`, if any.
    pub fn hit(name: &str) -> io::Result<()> {
        match action_for(name) {
            None | Some(Action::Stop) => Ok(()),
            Some(Action::Eio) => Err(io::Error::from_raw_os_error(
                rustix::io::Errno::IO.raw_os_error(),
            )),
            Some(Action::Abort) => std::process::abort(),
            Some(Action::Kill) => {
                let _ = rustix::process::kill_process(
                    rustix::process::getpid(),
                    rustix::process::Signal::KILL,
                );
                // SIGKILL is delivered before the kill syscall returns to user space; abort is
                // only here so that this branch provably never returns.
                std::process::abort()
            }
        }
    }
}

#[cfg(feature = "failpoints")]
pub use enabled::{Action, configure, hit, parse, pause};

/// Without the `failpoints` feature a pause point does nothing.
#[cfg(not(feature = "failpoints"))]
#[inline(always)]
pub fn pause(_name: &str) {}

/// Without the `failpoints` feature a crash point does nothing.
#[cfg(not(feature = "failpoints"))]
#[inline(always)]
pub fn hit(_name: &str) -> std::io::Result<()> {
    Ok(())
}

#[cfg(all(test, feature = "failpoints"))]
mod tests {
    use super::*;

    #[test]
    fn parse_ignores_unknown_actions() {
        let parsed = parse("a.write=eio, b.fsync=kill,c=bogus,,d=abort");
        assert_eq!(
            parsed,
            vec![
                ("a.write".to_owned(), Action::Eio),
                ("b.fsync".to_owned(), Action::Kill),
                ("d".to_owned(), Action::Abort),
            ]
        );
    }
}

//! Named crash points for tests.
//!
//! Product code calls [`hit`] with a name such as `publish.blob.fsync` just before a step whose
//! interruption a test wants to prove harmless. Without the `failpoints` cargo feature `hit` is an
//! inlined `Ok(())`, so release builds carry no trace of it. With the feature, the action for a
//! name comes from a `scoped` configuration (in-process tests) or else from the environment
//! variable `TENURE_FAILPOINTS` (child processes), a comma-separated list of `name=action`:
//!
//! - `abort`: `std::process::abort()` (SIGABRT, no unwinding, no destructors);
//! - `kill`: SIGKILL to the calling process, the harshest crash a process can have;
//! - `eio`: `hit` returns an `EIO` error, which the caller treats exactly as if the step itself
//!   had failed with it (for an fsync: the file is abandoned, never fsynced again);
//! - `einval`: `hit` returns an `EINVAL` error — what NFS and many FUSE filesystems answer to
//!   `renameat2(RENAME_NOREPLACE)`, which `privfs` asks the crash point `rename.noreplace`
//!   before every no-replace rename (issue 14);
//! - `exdev`: `hit` returns an `EXDEV` error — what `link` answers across filesystems (a
//!   staged file the publish cannot link into the store is copied instead);
//! - `gate:PATH`: `hit` blocks opening the FIFO `PATH` until the test opens it for writing, reads
//!   to its end, then returns `Ok(())` — a handshake that holds a step for exactly as long as the
//!   test wants (every hit blocks anew), so a race becomes an ordering the test chooses.
//!
//! The in-process configuration is one process-wide set, so `scoped` hands out one
//! configuration at a time: a test holds its `Scoped` guard while its faults are armed, and
//! another test that wants its own waits for it (tests of one binary run on parallel threads).
//!
//! `crate::privfs` calls `hit` with `<label>.<step>` for every step it performs, where the caller
//! chooses the label (e.g. `publish.blob`) and the steps are `create`, `write`, `fsync`, `rename`,
//! `dirfsync`, `unlink`, `link` and `mkdir`. Callers add their own points (e.g. each GC step) by
//! calling `hit` directly.

#[cfg(feature = "failpoints")]
mod enabled {
    use std::io;
    use std::path::PathBuf;
    // The configuration is test-only process-global state; loom's `Mutex` cannot live in a static,
    // and no loom test ever enables the `failpoints` feature, so std's is used directly.
    use std::sync::{Mutex, MutexGuard, PoisonError};

    /// What a crash point does when it is hit.
    #[derive(Debug, Clone, PartialEq, Eq)]
    pub enum Action {
        /// `std::process::abort()`.
        Abort,
        /// SIGKILL to this process.
        Kill,
        /// Return an `EIO` error from the step.
        Eio,
        /// Return an `EINVAL` error from the step.
        Einval,
        /// Return an `EXDEV` error from the step.
        Exdev,
        /// Block until the FIFO at this path is opened for writing and closed again.
        Gate(PathBuf),
    }

    static CONFIG: Mutex<Option<Vec<(String, Action)>>> = Mutex::new(None);
    /// Held by the one `Scoped` configuration in force.
    static SCOPE: Mutex<()> = Mutex::new(());

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
                    "einval" => Action::Einval,
                    "exdev" => Action::Exdev,
                    a => match a.strip_prefix("gate:") {
                        Some(path) if !path.is_empty() => Action::Gate(path.into()),
                        _ => return None,
                    },
                };
                Some((name.trim().to_owned(), action))
            })
            .collect()
    }

    /// An in-process configuration in force (overriding `TENURE_FAILPOINTS`) until it is
    /// dropped, even when the test panics.
    #[must_use = "the faults are disarmed when the guard is dropped"]
    pub struct Scoped {
        _one_at_a_time: MutexGuard<'static, ()>,
    }

    /// Arms `spec` in this process until the returned guard is dropped. Waits while another
    /// thread's configuration is in force, so two tests never see each other's faults.
    pub fn scoped(spec: &str) -> Scoped {
        let one = SCOPE.lock().unwrap_or_else(PoisonError::into_inner);
        *CONFIG.lock().unwrap_or_else(PoisonError::into_inner) = Some(parse(spec));
        Scoped {
            _one_at_a_time: one,
        }
    }

    impl Drop for Scoped {
        fn drop(&mut self) {
            // Back to the environment's configuration, before the next scope may begin.
            *CONFIG.lock().unwrap_or_else(PoisonError::into_inner) = None;
        }
    }

    fn action_for(name: &str) -> Option<Action> {
        let guard = CONFIG.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(list) = guard.as_ref() {
            return list.iter().find(|(n, _)| n == name).map(|(_, a)| a.clone());
        }
        drop(guard);
        let spec = std::env::var("TENURE_FAILPOINTS").ok()?;
        parse(&spec)
            .into_iter()
            .find(|(n, _)| n == name)
            .map(|(_, a)| a)
    }

    /// Takes the configured action for `name`, if any.
    pub fn hit(name: &str) -> io::Result<()> {
        match action_for(name) {
            None => Ok(()),
            Some(Action::Eio) => Err(io::Error::from_raw_os_error(
                rustix::io::Errno::IO.raw_os_error(),
            )),
            Some(Action::Einval) => Err(io::Error::from_raw_os_error(
                rustix::io::Errno::INVAL.raw_os_error(),
            )),
            Some(Action::Exdev) => Err(io::Error::from_raw_os_error(
                rustix::io::Errno::XDEV.raw_os_error(),
            )),
            Some(Action::Gate(path)) => {
                // Opening a FIFO for reading blocks until a writer comes; its end of file is
                // the signal to go on.
                let mut f = std::fs::File::open(&path)?;
                io::copy(&mut f, &mut io::sink())?;
                Ok(())
            }
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
pub use enabled::{Action, Scoped, hit, parse, scoped};

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
        let parsed = parse("a.write=eio, b.fsync=kill,c=bogus,,d=abort,e=gate:,f=gate:/x/y");
        assert_eq!(
            parsed,
            vec![
                ("a.write".to_owned(), Action::Eio),
                ("b.fsync".to_owned(), Action::Kill),
                ("d".to_owned(), Action::Abort),
                ("f".to_owned(), Action::Gate("/x/y".into())),
            ]
        );
    }

    /// Issue 15, item 6: two tests arming faults at once never see each other's: a second
    /// scope waits until the first is dropped, and a dropped scope disarms its faults.
    #[test]
    fn scopes_are_one_at_a_time() {
        let first = scoped("scope-test-a=eio");
        assert!(hit("scope-test-a").is_err());
        let (tx, rx) = std::sync::mpsc::channel();
        let other = std::thread::spawn(move || {
            let _second = scoped("scope-test-b=eio");
            // While the second scope is in force, the first one's fault is gone.
            tx.send((hit("scope-test-a").is_ok(), hit("scope-test-b").is_err()))
                .unwrap();
        });
        // The other thread cannot arm its faults while ours are in force: no answer yet, and
        // ours are still armed after it tried.
        assert!(
            rx.recv_timeout(std::time::Duration::from_millis(100))
                .is_err(),
            "a second scope began while the first was in force"
        );
        assert!(hit("scope-test-a").is_err());
        assert!(hit("scope-test-b").is_ok());
        drop(first);
        assert_eq!(
            rx.recv_timeout(std::time::Duration::from_secs(20)).unwrap(),
            (true, true)
        );
        other.join().unwrap();
        assert!(hit("scope-test-b").is_ok(), "a dropped scope disarms");
    }

    #[test]
    fn a_gate_holds_the_step_until_opened() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("gate");
        rustix::fs::mknodat(
            rustix::fs::CWD,
            &fifo,
            rustix::fs::FileType::Fifo,
            rustix::fs::Mode::from_raw_mode(0o600),
            0,
        )
        .unwrap();
        let _armed = scoped(&format!("scope-test-gate=gate:{}", fifo.display()));
        let (tx, rx) = std::sync::mpsc::channel();
        let stepper = std::thread::spawn(move || tx.send(hit("scope-test-gate").is_ok()).unwrap());
        // Opening the FIFO for writing blocks until the stepper has it open for reading: the
        // step waits on the gate, and goes on once the writer closes it.
        let w = std::fs::OpenOptions::new().write(true).open(&fifo).unwrap();
        assert!(rx.try_recv().is_err(), "the step passed a closed gate");
        drop(w);
        assert!(rx.recv_timeout(std::time::Duration::from_secs(20)).unwrap());
        stepper.join().unwrap();
    }
}

//! Removing scratch trees (staging areas, views, kept outputs) without recursion and with a
//! bounded number of descriptors.

use std::ffi::{OsStr, OsString};
use std::sync::mpsc::{Receiver, SyncSender, TrySendError, sync_channel};
use std::thread::{Scope, ScopedJoinHandle};
use std::time::{Duration, Instant};

use rustix::fs::Mode;

use super::{Dir, FileKind, FsError, random_hex};

/// A hoist that took this long says the tree is large: a second thread starts to share the
/// subdirectories of the top directory (a staging area of 100,000 files in 100 directories
/// took 0.65 s on one core). Small trees, the usual case, never start it. The unit tests
/// start it at the first hoist, so every removal they do runs on two threads.
const HELP_AFTER: Duration = if cfg!(test) {
    Duration::ZERO
} else {
    Duration::from_millis(2)
};

/// The second thread of a large removal: it hoists the subdirectories handed to it until the
/// sender is dropped, and stops at its first error.
struct Helper<'scope> {
    tx: SyncSender<OsString>,
    handle: ScopedJoinHandle<'scope, Result<(), FsError>>,
}

impl<'scope> Helper<'scope> {
    fn start<'env>(scope: &'scope Scope<'scope, 'env>, top: &'env Dir, label: &'env str) -> Self {
        let (tx, rx): (SyncSender<OsString>, Receiver<OsString>) = sync_channel(1);
        let handle = scope.spawn(move || {
            for name in rx {
                hoist(top, &name, label)?;
            }
            Ok(())
        });
        Helper { tx, handle }
    }

    /// Waits for the work handed over so far; its first error, if any.
    fn finish(self) -> Result<(), FsError> {
        drop(self.tx);
        self.handle
            .join()
            .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
    }
}

/// Removes the directory `name` under `parent` and everything in it. Used only for scratch
/// trees the store created or was handed (staging areas, views, kept outputs), never for
/// checkpoint state.
///
/// There is no recursion, and the descriptors and memory it uses do not depend on the depth or
/// the width of the tree (a leftover staging area 8,000 levels deep is removed like a flat
/// one): instead of descending, it *hoists*. Each subdirectory of the top directory is emptied
/// one level at a time: its files are unlinked and its own subdirectories are renamed up into
/// the top directory under fresh names, then it is removed. Every directory is renamed at most
/// once and every file unlinked once, so the work is linear in the size of the tree, and only
/// two directory descriptors are open at a time per thread. A large tree (a hoist that took
/// `HELP_AFTER`) is shared with a second thread, on a machine with more than one core. Nothing
/// ever leaves the tree (no `..`, no link is followed: a symlink is an entry like a file and is
/// unlinked). Write permission is restored on each directory first because views are made
/// read-only.
pub(super) fn remove_tree(parent: &Dir, name: &OsStr, label: &str) -> Result<(), FsError> {
    let top = match parent.open_dir_reclaiming(name) {
        Ok(d) => d,
        Err(FsError::NotFound { .. }) => return Ok(()),
        Err(e) => return Err(e),
    };
    make_writable(&top)?;
    let cores = std::thread::available_parallelism().map_or(1, usize::from);
    std::thread::scope(|scope| -> Result<(), FsError> {
        loop {
            let mut seen = false;
            // Started once a hoist proves the tree large; it takes the subdirectories this
            // thread cannot hand over without waiting and hoists them beside it. Each pass
            // waits for it before looking again, so no directory is hoisted by both threads.
            let mut helper: Option<Helper<'_>> = None;
            let pass = top.for_each_entry(|entry, kind| -> Result<bool, FsError> {
                seen = true;
                match kind {
                    FileKind::Directory => {
                        if let Some(h) = &helper {
                            match h.tx.try_send(entry.to_owned()) {
                                Ok(()) => return Ok(true),
                                // Busy: this thread hoists it. Gone (it failed): so does this
                                // thread, and the pass reports its error at the end.
                                Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) => {}
                            }
                        }
                        let began = Instant::now();
                        hoist(&top, entry, label)?;
                        if helper.is_none() && cores > 1 && began.elapsed() >= HELP_AFTER {
                            helper = Some(Helper::start(scope, &top, label));
                        }
                    }
                    FileKind::Regular
                    | FileKind::Symlink
                    | FileKind::Fifo
                    | FileKind::Socket
                    | FileKind::CharDevice
                    | FileKind::BlockDevice
                    | FileKind::Unknown => unlink_gone_ok(&top, entry, label)?,
                }
                Ok(true)
            });
            let helped = helper.map_or(Ok(()), Helper::finish);
            pass.and(helped)?;
            // Directories hoisted during the pass may not have been listed by it: go again
            // until a pass finds the top directory empty.
            if !seen {
                return Ok(());
            }
        }
    })?;
    drop(top);
    match parent.remove_dir(name, label) {
        Ok(()) | Err(FsError::NotFound { .. }) => Ok(()),
        Err(e) => Err(e),
    }
}

/// Empties the subdirectory `name` of `top` by one level (files unlinked, subdirectories
/// renamed into `top` under fresh names) and removes it.
fn hoist(top: &Dir, name: &OsStr, label: &str) -> Result<(), FsError> {
    let sub = match top.open_dir_reclaiming(name) {
        Ok(d) => d,
        Err(FsError::NotFound { .. }) => return Ok(()),
        Err(e) => return Err(e),
    };
    make_writable(&sub)?;
    loop {
        let mut seen = false;
        sub.for_each_entry(|entry, kind| -> Result<bool, FsError> {
            seen = true;
            match kind {
                FileKind::Directory => {
                    // Moving a directory to another parent rewrites its `..`, which needs
                    // write permission on it.
                    match sub.open_dir_reclaiming(entry) {
                        Ok(d) => make_writable(&d)?,
                        Err(FsError::NotFound { .. }) => return Ok(true),
                        Err(e) => return Err(e),
                    }
                    loop {
                        let fresh = format!(".rm-{}", random_hex(8));
                        match sub.rename_to(entry, top, &fresh, label, true) {
                            Ok(()) | Err(FsError::NotFound { .. }) => break,
                            Err(FsError::AlreadyExists { .. }) => continue,
                            Err(e) => return Err(e),
                        }
                    }
                }
                FileKind::Regular
                | FileKind::Symlink
                | FileKind::Fifo
                | FileKind::Socket
                | FileKind::CharDevice
                | FileKind::BlockDevice
                | FileKind::Unknown => unlink_gone_ok(&sub, entry, label)?,
            }
            Ok(true)
        })?;
        if !seen {
            break;
        }
    }
    drop(sub);
    match top.remove_dir(name, label) {
        Ok(()) | Err(FsError::NotFound { .. }) => Ok(()),
        Err(e) => Err(e),
    }
}

fn make_writable(d: &Dir) -> Result<(), FsError> {
    rustix::fs::fchmod(d, Mode::from_raw_mode(0o700))
        .map_err(|e| FsError::io("make writable", d.path().to_path_buf(), e))
}

fn unlink_gone_ok(d: &Dir, name: &OsStr, label: &str) -> Result<(), FsError> {
    match d.unlink(name, label) {
        Ok(()) | Err(FsError::NotFound { .. }) => Ok(()),
        Err(e) => Err(e),
    }
}

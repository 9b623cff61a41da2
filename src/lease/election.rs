//! The launch election of `tenure up` (card D8): a second kernel lock, on `.tenure/up.lock`,
//! held by the one `up` process that launches an owner while it waits for that owner to become
//! ready. Concurrent `up` calls queue on it, then find the owner and launch nothing.
//!
//! It uses the same lock primitives as the lease (this crate's only `flock` calls live in
//! `lock`); it is not ownership of the state dir and writes no record.

use super::{CONTROL_DIR, LeaseError, lock};
use crate::privfs::StateDir;
use std::os::fd::BorrowedFd;
use std::time::Instant;

/// The election lock file inside the control folder.
pub const ELECTION_FILE: &str = "up.lock";

/// A won election; dropping it lets the next `up` in.
#[derive(Debug)]
pub struct Election {
    _guard: lock::LockGuard,
}

/// Waits for the election lock until `deadline` (none: forever) or until `cancel` is readable.
/// `Ok(None)` when the deadline passed or the wait was cancelled.
pub fn elect(
    dir: &StateDir,
    deadline: Option<Instant>,
    cancel: Option<BorrowedFd<'_>>,
) -> Result<Option<Election>, LeaseError> {
    let control = dir.root().ensure_dir(CONTROL_DIR, "lease.control")?;
    let path = control.child_path(ELECTION_FILE);
    let file = control.open_or_create_file(ELECTION_FILE, "lease.election")?;
    let lock_err = |source| LeaseError::Lock {
        path: path.clone(),
        source,
    };
    if !lock::try_lock(&file).map_err(lock_err)? {
        let watch = lock::CloseWatch::new(&file, &path).map_err(lock_err)?;
        match lock::wait(&file, &watch, deadline, cancel).map_err(lock_err)? {
            lock::WaitEnd::Acquired => {}
            lock::WaitEnd::Expired | lock::WaitEnd::Cancelled => return Ok(None),
        }
    }
    Ok(Some(Election {
        _guard: lock::LockGuard::new(file, path),
    }))
}

//! The owner lease on a state directory (issue 3). This module is being built in steps; the
//! epoch file is the first piece, used by the checkpoint store for fencing (card H5).

pub mod epoch;

use crate::privfs::{FsError, StateDir};

/// The control folder tenure keeps inside every state dir.
pub const CONTROL_DIR: &str = ".tenure";

/// Errors of the lease boundary.
#[derive(Debug, thiserror::Error)]
pub enum LeaseError {
    /// The epoch file is missing its format or cannot grow.
    #[error(transparent)]
    Epoch(#[from] epoch::EpochError),
    /// A file or directory of the state dir was refused or could not be accessed.
    #[error(transparent)]
    Fs(#[from] FsError),
}

/// Reads the persisted epoch of a state dir without taking the lock and without writing: 0 when
/// no owner ever acquired it. The checkpoint store refuses to publish when this is newer than the
/// publisher's epoch (card H5).
pub fn read_epoch(dir: &StateDir) -> Result<u64, LeaseError> {
    match dir.root().open_dir_optional(CONTROL_DIR)? {
        None => Ok(0),
        Some(control) => Ok(epoch::read(&control)?),
    }
}

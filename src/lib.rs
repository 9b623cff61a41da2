//! tenure: the lifecycle of a single-owner local runtime.
#![forbid(unsafe_op_in_unsafe_fn)]

pub mod checkpoint;
pub mod driver;
pub mod failpoint;
pub mod host;
pub mod lease;
pub mod machine;
pub mod privfs;
pub mod sync;

//! tenure: the lifecycle of a single-owner local runtime.
#![forbid(unsafe_op_in_unsafe_fn)]

pub mod host;
pub mod machine;
pub mod sync;

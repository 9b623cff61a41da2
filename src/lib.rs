//! tenure: the lifecycle of a single-owner local runtime — one owner per state directory, a
//! cold bootstrap, recovery from the last checkpoint, serving, a drain on SIGTERM that
//! checkpoints before it lets go, and a successor that takes over safely after a crash.
//!
//! # Codemap
//! - [`machine`]: the one pure, sans-IO transition function. Phases `cold → recovering → ready →
//!   draining → released` (and terminal `cancelled`/`refused`), events in, actions out, time only
//!   as timer expiries. The library, the runner and the models all execute it; spec/ is
//!   rendered from it.
//! - [`lease`]: ownership = a kernel `flock` held for the whole ownership, plus the owner record
//!   (process identity, phase), the fencing epoch, waiter entries, the registry and the dir's
//!   identity marker. `privfs` is the private-file layer everything on disk goes through
//!   ([`StateDir`] is the opened state dir).
//! - [`checkpoint`]: content-addressed blobs, digest-checked manifests and a durable `CURRENT`.
//! - [`host`]: the thread-safe in-process handle (drain once, residencies, admission, idle exit).
//! - [`Tenure`]: the typed lifecycle for library users, built on the three above.
//! - [`driver`]: the runner's event loop (signals, child supervision, readiness, event log);
//!   `src/bin/tenure.rs` only parses arguments.
//!
//! # The public surface
//! What a library user needs is documented: the typed lifecycle and [`Host`] at the crate root,
//! the pure [`machine`] (its types are what the models and the trace format speak), the
//! checkpoint store's read side (and the owner's publish) in [`checkpoint`], the lease's status
//! and records in [`lease`], and the runner itself in [`driver`] for a program that embeds it
//! ([`driver::run`], [`driver::up`], the operator commands in [`driver::ops`]). Modules and
//! items marked `#[doc(hidden)]` (`privfs`, `failpoint`, `sync`, `stdio`, `mutant`, the
//! runner's internals under `driver`, the lease's `cgroup` and `epoch`, the store's `gc` and
//! `hash`) are there for this project's binary, tests and models: they are not part of the API
//! and change without notice. `spec/public-api.txt` lists every public item (names, not
//! signatures); `tests/public_api.rs` renders the list from the source and keeps the file
//! identical to it, so a new, renamed or removed public item is a deliberate, reviewed change
//! (`TENURE_BLESS=1 cargo test --test public_api` re-renders it).
//!
//! Diagnostics go through the [`log`](https://docs.rs/log) facade (a host routes or silences
//! them; the `tenure` binary prints them on stderr), never straight to a stream.
//!
//! Architecture invariants: the machine never performs I/O; exactly one module takes the kernel
//! lock (`lease::lock`) and one function replaces `CURRENT`; the lease is never released while a
//! supervised child may run or before the drain's checkpoint is durable; refused state is never
//! repaired.
//!
//! # The typed lifecycle
//! Each phase is a type, so an illegal order of calls does not compile. Other threads work
//! through the [`Host`] handle.
//! ```
//! use tenure::machine::{OpClass, Reason, ResidencyKind};
//! use tenure::{CheckpointFile, Options, Recovered, Tenure, WaitBound};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let tmp = tempfile::tempdir()?;
//! let cold = Tenure::open(tmp.path().join("state"), Options::default())?;
//! let host = cold.host(); // for request handlers, signal threads, ...
//!
//! // Take the lease (epoch 1 on a new dir) and recover from the last checkpoint.
//! let recovering = cold.acquire(WaitBound::Try)?;
//! let count: u64 = match recovering.read("count")? {
//!     Some(bytes) => String::from_utf8(bytes)?.parse()?,
//!     None => 0,
//! };
//! let Recovered::Ready(ready) = recovering.recovered()? else {
//!     unreachable!("nobody asked to drain yet")
//! };
//!
//! // Serve: work holds a residency; the drain waits for active ones.
//! {
//!     let _work = host.enter(OpClass::Serve, ResidencyKind::Active)?;
//! }
//!
//! // Any thread may ask to drain; the drain begins exactly once.
//! host.request_drain();
//! let draining = ready.wait_for_drain()?;
//! let released = draining.close([CheckpointFile::new("count", (count + 1).to_string())])?;
//! assert_eq!(released.outcome.reason, Reason::Stopped);
//! assert!(released.published.is_some());
//! # Ok(())
//! # }
//! ```
//!
//! Draining an owner that never acquired the lease does not compile:
//! ```compile_fail,E0599
//! use tenure::{Options, Tenure};
//! let cold = Tenure::open("/tmp/never-created", Options::default()).unwrap();
//! let draining = cold.wait_for_drain(); // no such method on Tenure<Cold>
//! ```
//! Nor does closing a ready owner without draining it first:
//! ```compile_fail,E0599
//! use tenure::{Options, Recovered, Tenure, WaitBound};
//! let cold = Tenure::open("/tmp/never-created", Options::default()).unwrap();
//! let Recovered::Ready(ready) = cold.acquire(WaitBound::Try).unwrap().recovered().unwrap() else { panic!() };
//! ready.close(Vec::new()); // `close` exists only on Tenure<Draining>
//! ```
#![forbid(unsafe_op_in_unsafe_fn)]
#![warn(missing_docs)]

// Every print of the crate goes through `stdio`, which never panics on a closed pipe or stream
// (see `stdio`). These shadow the std macros of the same names for every module declared below.
macro_rules! println {
    () => { $crate::stdio::out(format_args!("\n")) };
    ($($arg:tt)*) => { $crate::stdio::out(format_args!("{}\n", format_args!($($arg)*))) };
}
#[allow(unused_macros)]
macro_rules! print {
    ($($arg:tt)*) => { $crate::stdio::out(format_args!($($arg)*)) };
}
macro_rules! eprintln {
    () => { $crate::stdio::err(format_args!("\n")) };
    ($($arg:tt)*) => { $crate::stdio::err(format_args!("{}\n", format_args!($($arg)*))) };
}
#[allow(unused_macros)]
macro_rules! eprint {
    ($($arg:tt)*) => { $crate::stdio::err(format_args!($($arg)*)) };
}

pub mod checkpoint;
#[cfg(feature = "etcd")]
pub mod cluster;
pub mod driver;
#[doc(hidden)]
pub mod failpoint;
pub mod fsop;
mod hex;
pub mod host;
pub mod lease;
pub mod machine;
#[doc(hidden)]
pub mod mutant;
#[doc(hidden)]
pub mod privfs;
#[doc(hidden)]
pub mod stdio;
#[doc(hidden)]
pub mod sync;
mod typestate;

pub use host::{Host, Residency};
pub use lease::{LeaseError, WaitBound};
pub use privfs::{FileKind, FsError, StateDir};
pub use typestate::{
    CheckpointFile, Cold, Draining, Options, PublishFailed, Ready, Recovered, Recovering, Released,
    Tenure, TenureError, Unsettled,
};

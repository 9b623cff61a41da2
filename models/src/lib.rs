//! Formal models of the tenure lifecycle, checked with stateright. Every process in every model
//! runs the real [`tenure::machine::Machine`] inside the real driver core
//! ([`tenure::driver::core`], kept here as [`driver::Driver`]), the code the runner runs; the
//! models add only the world (an abstract kernel and filesystem, crashes, signals, timers) and
//! the properties, named after the invariants of spec/lifecycle.md.
//!
//! - [`lease`]: N processes contending for one state dir (I1–I6).
//! - [`signals`]: one owner and its supervised child under every signal interleaving (I6–I11,
//!   I16 and the obligations of the cards G1, G3, G4, G6, H2, T3).
//! - [`cluster`]: two runners on two machines contending for an etcd prefix, CURRENT fenced by
//!   revision (issue 14).
//! - [`checkpoint`]: the publish protocol over a filesystem that loses what was not fsynced
//!   (I12–I14).
//! - [`fs`]: the simulated crash filesystem the models execute the real store and lease plans
//!   on (inode-based; power loss enumerates what unsynced writes and entry ops can leave).
//! - [`trace`]: replays a JSONL trace of a real run through the single-process step relation.
//! - [`shared`]: the copy-on-write, hash-once cell that keeps model states cheap to clone and to
//!   fingerprint.
//! - [`run`]: runs a model's checker and reports what it found (used by the CLI and the tests).
//! - [`catalog`]: the CI configurations, the invariant id of each property, the mutants (of the
//!   worlds, and the bugs planted in src/), and the configurations with pinned state counts.
//! - [`spec`]: the exit-code table of spec/lifecycle.md, read as an oracle for I10.

pub mod catalog;
pub mod checkpoint;
pub mod cluster;
pub mod driver;
pub mod fs;
pub mod lease;
pub mod run;
pub mod shared;
pub mod signals;
pub mod spec;
pub mod trace;

//! Helpers the bench binaries share (each bench is its own crate, so they are included with
//! `mod common;`; not every bench uses every helper).
#![allow(dead_code)]

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The runner binary cargo built for the benches.
pub const TENURE: &str = env!("CARGO_BIN_EXE_tenure");

/// A repetition count from the environment variable `var` (a positive number), or `default`.
pub fn runs(var: &str, default: usize) -> usize {
    std::env::var(var)
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|n| *n > 0)
        .unwrap_or(default)
}

/// Milliseconds, for printing.
pub fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// Runs a command to its end (stdio discarded) and returns how long it took; a command that
/// fails fails the bench.
pub fn timed(cmd: &mut Command) -> Duration {
    let t = Instant::now();
    let st = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .expect("spawn");
    let d = t.elapsed();
    assert!(st.success(), "{cmd:?} failed: {st}");
    d
}

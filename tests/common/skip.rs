//! The one rule for tests that need something this machine may lack (FUSE, root, cgroups, a
//! real server): when it is missing the test says so on a `SKIPPED:` line and returns, unless
//! `TENURE_REQUIRE_SERVERS=1` is set — `.ci/run` sets it — which turns the skip into a failure.
//! So the README's `cargo test` still passes on a fresh machine, and CI never reports `ok` for a
//! test that did not run.
//!
//! This file needs only std and rustix: the integration tests include it through `common`, and
//! the library's unit tests (src/privfs/tests.rs) include it by path, so both follow one rule.

use std::io::Write;

/// The switch that turns a missing dependency into a test failure.
pub const REQUIRE: &str = "TENURE_REQUIRE_SERVERS";

/// Whether missing dependencies must fail the tests (`TENURE_REQUIRE_SERVERS=1`).
pub fn required() -> bool {
    std::env::var(REQUIRE).is_ok_and(|v| v == "1")
}

/// Reports that `test` cannot run here because of `why`: a visible `SKIPPED:` line, or a panic
/// when [`required`]. The caller returns right after it.
#[track_caller]
pub fn skip(test: &str, why: &str) {
    if required() {
        panic!(
            "{test} cannot run on this machine: {why}; {REQUIRE}=1 makes a missing dependency a failure (see .ci/run)"
        );
    }
    let line = format!(
        "SKIPPED: {test}: {why} (the test did not run; {REQUIRE}=1 makes this a failure)\n"
    );
    // Written to the stderr descriptor, not through `eprintln!`: the test harness captures the
    // print macros of a passing test, and a skip must be seen in the run's output.
    let _ = std::io::stderr().lock().write_all(line.as_bytes());
}

/// Whether this process runs as root (chown to another uid, mounts); reports a skip for `test`
/// when it does not, and fails under [`REQUIRE`].
#[track_caller]
pub fn have_root(test: &str) -> bool {
    if rustix::process::geteuid().is_root() {
        true
    } else {
        skip(test, "it needs root to give a file to another uid");
        false
    }
}

//! Larger configurations, run with `TENURE_LONG=1 cargo test -p tenure-models --release --test
//! long` (listed as ignored otherwise). Their counts are pinned in models/counts.txt by
//! `tenure-models pin --long`; their numbers are in models/README.md.

use tenure_models::catalog;

/// I1–I6 at N = 2 with every rename, lock and cgroup operation a step, the stopper and a
/// stop signal, timers and refused recoveries.
#[test]
#[cfg_attr(not(tenure_long), ignore = "long: set TENURE_LONG=1")]
fn lease_n2_fine_grained() {
    catalog::check_pinned("lease-n2-fine");
}

/// I1–I7 in the tree world with two crashes (an owner, its successor and the successor's
/// successor), cgroup containment.
#[test]
#[cfg_attr(not(tenure_long), ignore = "long: set TENURE_LONG=1")]
fn lease_tree_cgroup_two_crashes() {
    catalog::check_pinned("lease-tree-cgroup-two-crashes");
}

/// The same with the inherited lock descriptor.
#[test]
#[cfg_attr(not(tenure_long), ignore = "long: set TENURE_LONG=1")]
fn lease_tree_lock_fd_two_crashes() {
    catalog::check_pinned("lease-tree-lock-fd-two-crashes");
}

/// I6–I11, I16 and the cards' obligations with three signals (stop or stray).
#[test]
#[cfg_attr(not(tenure_long), ignore = "long: set TENURE_LONG=1")]
fn signals_three_signals() {
    catalog::check_pinned("signals-three-signals");
}

/// I3, I12–I14, I17 over three runs of the real store plans, `keep` = 1 and 2.
#[test]
#[cfg_attr(not(tenure_long), ignore = "long: set TENURE_LONG=1")]
fn checkpoint_three_runs() {
    catalog::check_pinned("checkpoint-three-runs");
}

/// I3, I12–I14, I17 when a power loss keeps any subset of the unsynced entry operations.
#[test]
#[cfg_attr(not(tenure_long), ignore = "long: set TENURE_LONG=1")]
fn checkpoint_any_subset() {
    catalog::check_pinned("checkpoint-any-subset");
}

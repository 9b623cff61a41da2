//! Larger configurations, run with `TENURE_LONG=1 cargo test -p tenure-models --release --test
//! long` (listed as ignored otherwise). Their numbers are in models/README.md.

use stateright::{Checker, Model};
use tenure_models::checkpoint::CheckpointModel;
use tenure_models::lease::LeaseModel;
use tenure_models::signals::SignalModel;

/// I1–I6 at N = 3 without symmetry reduction: the baseline of the reduction factor.
#[test]
#[cfg_attr(not(tenure_long), ignore = "long: set TENURE_LONG=1")]
fn lease_n3_without_symmetry() {
    let checker = LeaseModel::ci(3).checker().spawn_bfs().join();
    checker.assert_properties();
    assert_eq!(checker.unique_state_count(), 4_118_165);
}

/// I1–I6 at N = 4 with symmetry reduction.
#[test]
#[cfg_attr(not(tenure_long), ignore = "long: set TENURE_LONG=1")]
fn lease_n4_with_symmetry() {
    let checker = LeaseModel::ci(4).checker().symmetry().spawn_dfs().join();
    checker.assert_properties();
    assert_eq!(checker.unique_state_count(), 4_754_810);
}

/// I1–I6 at N = 3 with every visible action a separate step, timers and refused recoveries.
#[test]
#[cfg_attr(not(tenure_long), ignore = "long: set TENURE_LONG=1")]
fn lease_n3_fine_grained() {
    let mut m = LeaseModel::ci(3);
    m.atomic_steps = false;
    m.timers = true;
    m.recovery_failures = true;
    let checker = m.checker().symmetry().spawn_dfs().join();
    checker.assert_properties();
    assert_eq!(checker.unique_state_count(), 9_280_734);
}

/// I6–I11 and I16 with three signals (stop or stray).
#[test]
#[cfg_attr(not(tenure_long), ignore = "long: set TENURE_LONG=1")]
fn signals_three_signals() {
    let mut m = SignalModel::ci();
    m.signals = 3;
    let checker = m.checker().spawn_bfs().join();
    checker.assert_properties();
    assert_eq!(checker.unique_state_count(), 1_121_732);
}

/// I12–I14 over five runs with three crashes.
#[test]
#[cfg_attr(not(tenure_long), ignore = "long: set TENURE_LONG=1")]
fn checkpoint_five_runs_three_crashes() {
    let mut m = CheckpointModel::ci();
    m.runs = 5;
    m.crashes = 3;
    let checker = m.checker().spawn_bfs().join();
    checker.assert_properties();
    assert_eq!(checker.unique_state_count(), 203_691);
}

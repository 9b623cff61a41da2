//! The checkpoint crash model (invariants I3, I12–I14, I17): the store's real plans run on the
//! crash filesystem, with a pinned state count. The mutants of the store's code are in
//! mutants_store.rs (a binary of their own: a planted mutant is process-wide).

use stateright::{Checker, Model};
use tenure_models::catalog;
use tenure_models::checkpoint::CheckpointModel;

/// I3, I12–I14, I17 hold over three runs of the real open, load and publish plans with one
/// process crash and one power loss at any step (every outcome of the unsynced writes and
/// entry operations), one takeover during a publish and one corruption of any store file
/// between runs, for `keep` = 1 and 2. Every `sometimes` is reached: a crash keeps the old
/// checkpoint and one keeps the new, power loss loses unsynced writes, the GC deletes, a shared
/// blob is deduplicated, a corrupt checkpoint is refused, a stale publish is fenced, a successor
/// publishes after a crash, three runs publish.
#[test]
fn checkpoint_model() {
    catalog::check_pinned("checkpoint");
}

/// Without power loss the model still reaches every crash outcome it needs, but never loses an
/// unsynced write: the power-loss `sometimes` is not vacuous.
#[test]
fn no_power_loss_loses_nothing() {
    let mut m = CheckpointModel::ci();
    m.power_losses = 0;
    m.takeovers = 0;
    m.corruptions = 0;
    let checker = m.clone().checker().spawn_bfs().join();
    assert!(
        checker
            .discovery("power loss loses unsynced writes")
            .is_none()
    );
    for p in m.properties() {
        if p.expectation == stateright::Expectation::Always {
            checker.assert_no_discovery(p.name);
        }
    }
}

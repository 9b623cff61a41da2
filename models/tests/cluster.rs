//! The cluster world (issue 14, models/src/cluster.rs): two runners on two machines contend for
//! one etcd prefix through the real plans of `tenure::cluster::plan`; every property holds under
//! TTL expiry, a paused owner resumed, a partition and keep-alive loss, every `sometimes` is
//! reached. The src mutants are planted in their own test binary (tests/cluster_mutants.rs): a mutant is
//! process-wide.

use stateright::{Checker, Expectation, Model};
use tenure_models::cluster::ClusterModel;

fn check(m: ClusterModel) -> impl Checker<ClusterModel> {
    m.checker().threads(2).spawn_bfs().join()
}

/// Issue 14: all properties hold and every example is reached.
#[test]
fn cluster_world_holds() {
    let m = ClusterModel::ci();
    let c = check(m.clone());
    eprintln!(
        "cluster world: {} states, {} unique",
        c.state_count(),
        c.unique_state_count()
    );
    for p in m.properties() {
        match p.expectation {
            Expectation::Always | Expectation::Eventually => c.assert_no_discovery(p.name),
            Expectation::Sometimes => {
                assert!(c.discovery(p.name).is_some(), "not reached: {}", p.name);
            }
        }
    }
}

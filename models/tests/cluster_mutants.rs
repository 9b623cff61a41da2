//! Issue 14: each src mutant of `cluster::SRC_MUTANTS` (models/src/cluster.rs) — CURRENT
//! written with a plain put, the epoch taken from a local counter, a publish after the lease
//! was lost — is killed by its property in the cluster world. A binary of its own: a planted
//! mutant is process-wide, and tests/cluster.rs must never see one.

use stateright::{Checker, HasDiscoveries, Model};
use std::collections::BTreeSet;
use tenure_models::catalog::{self, Which};
use tenure_models::cluster::{ClusterModel, SRC_MUTANTS};

/// The mutation table (models/src/catalog.rs) lists the cluster world's mutants as this test
/// runs them: every catalogued cluster mutant is one of `SRC_MUTANTS`, and every one of those
/// is catalogued (`publish-after-lease-lost` as the signal model's row).
#[test]
fn the_catalogue_lists_the_cluster_mutants() {
    let all = catalog::src_mutants();
    for m in all.iter().filter(|m| m.model == Which::Cluster) {
        assert!(
            SRC_MUTANTS.contains(&(m.name, m.place, m.breaks)),
            "{} is catalogued but not run here",
            m.name
        );
    }
    for (name, _, _) in SRC_MUTANTS {
        assert!(
            all.iter().any(|m| m.name == *name),
            "{name} is not catalogued"
        );
    }
}

/// Issue 14: CURRENT written with a plain put, the epoch taken from a local counter, and a
/// publish after the lease was lost — each planted in src/ — are each found.
#[test]
fn cluster_src_mutants_are_killed() {
    for (name, place, breaks) in SRC_MUTANTS {
        let _planted = tenure::mutant::scoped(name);
        // The search ends at the first counterexample of the property the mutant breaks.
        let c = ClusterModel::ci()
            .checker()
            .threads(2)
            .finish_when(HasDiscoveries::AnyOf(BTreeSet::from([*breaks])))
            .spawn_bfs()
            .join();
        assert!(
            c.discovery(breaks).is_some(),
            "mutant {name} ({place}) survived: {breaks} holds"
        );
    }
}

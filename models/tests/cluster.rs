//! The cluster world (issue 14, models/src/cluster.rs): two runners on two machines contend for
//! one etcd prefix through the real plans of `tenure::cluster::plan`; every property holds under
//! TTL expiry, a paused owner resumed, a partition and keep-alive loss, every `sometimes` is
//! reached, and its unique state count is pinned (`cluster` in models/counts.txt, the CI set of
//! models/src/catalog.rs). The src mutants are planted in their own test binary
//! (tests/cluster_mutants.rs): a mutant is process-wide.

use tenure_models::catalog;

/// Issue 14: all properties hold, every example is reached, the count is the pinned one.
#[test]
fn cluster_world_holds() {
    catalog::check_pinned("cluster");
}

//! Issue 14 against a real three-member etcd cluster (tests/common/etcd.rs): the etcd client
//! over the JSON gateway, then the cluster lease of `tenure run --lease etcd://…`. Without
//! `etcd` installed every test here skips by the one rule (a failure under
//! `TENURE_REQUIRE_SERVERS=1`, which `.ci/run` sets after installing `etcd-server`).

mod common;

use common::etcd::Cluster;
use std::time::{Duration, Instant};
use tenure::cluster::etcd::{Compare, Op, WatchEvent};

/// The client: an ownership transaction creates the key only if it is absent, the key's create
/// revision is the cluster-wide fencing number, a second contender's transaction fails and
/// reads the owner instead, a watch sees the key deleted when the owner's lease is revoked, and
/// a keep-alive of a revoked lease says it is gone.
#[test]
fn etcd_client_ownership_txn_watch_and_keepalive() {
    let Some(cluster) = Cluster::start("etcd_client_ownership_txn_watch_and_keepalive") else {
        return;
    };
    let c = cluster.client();
    let key = b"t/owner".to_vec();
    let create = |lease| {
        c.txn(
            &[Compare::CreateRevision(key.clone(), 0)],
            &[Op::Put {
                key: key.clone(),
                value: b"me".to_vec(),
                lease,
            }],
            &[Op::Get(key.clone())],
        )
        .unwrap()
    };
    let (a, ttl) = c.grant(5).unwrap();
    assert_eq!(ttl, 5);
    let first = create(a);
    assert!(first.succeeded);
    let (kv, _) = c.get(&key).unwrap();
    let kv = kv.unwrap();
    assert_eq!((kv.create_revision, kv.lease), (first.revision, a));

    let (b, _) = c.grant(5).unwrap();
    let second = create(b);
    assert!(!second.succeeded, "a second owner while the first lives");
    assert_eq!(second.kvs[0].lease, a, "the failure branch reads the owner");

    let mut w = c.watch(&key, second.revision + 1).unwrap();
    assert_eq!(c.keep_alive(a).unwrap(), Some(5));
    assert!(c.revoke(a).unwrap());
    assert_eq!(c.keep_alive(a).unwrap(), None, "a revoked lease is gone");
    assert!(!c.revoke(a).unwrap(), "revoking twice finds nothing");
    let end = Instant::now() + Duration::from_secs(10);
    let deleted = loop {
        let evs = w.next(Instant::now() + Duration::from_millis(200)).unwrap();
        if let Some(WatchEvent::Delete { revision, .. }) = evs.first() {
            break *revision;
        }
        assert!(Instant::now() < end, "no delete event");
    };
    // The next owner's epoch is above everything before it.
    let third = create(b);
    assert!(third.succeeded && third.revision > deleted && deleted > first.revision);
}

/// The client fails over: with the leader killed, calls go to the other members and succeed
/// once they elected a new leader; with two of three killed, a call fails within its timeout
/// (no quorum) instead of hanging.
#[test]
fn etcd_client_survives_a_leader_and_fails_without_quorum() {
    let Some(mut cluster) =
        Cluster::start("etcd_client_survives_a_leader_and_fails_without_quorum")
    else {
        return;
    };
    let leader = cluster.wait_leader(Duration::from_secs(20));
    cluster.kill(leader);
    cluster.wait_leader(Duration::from_secs(20));
    let c = cluster.client();
    let (id, _) = c.grant(5).unwrap();
    assert_eq!(c.keep_alive(id).unwrap(), Some(5));
    let other = (0..3).find(|i| cluster.running(*i)).unwrap();
    cluster.kill(other);
    let t = Instant::now();
    let e = c.keep_alive(id).unwrap_err();
    assert!(
        tenure::cluster::etcd::unavailable(&e),
        "no quorum is unavailable: {e}"
    );
    // Each member is tried once, each within the client's timeout.
    assert!(t.elapsed() < Duration::from_secs(10), "{:?}", t.elapsed());
    cluster.restart(other);
    cluster.restart(leader);
    cluster.wait_leader(Duration::from_secs(30));
    assert!(c.get(b"x").is_ok());
}

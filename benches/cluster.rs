//! Cluster lease benchmarks (issue 14, feature `etcd`), against a real three-member etcd cluster
//! on loopback (the test harness, tests/common/etcd.rs). Prints ratios against baselines
//! measured in the same run; asserts nothing. Run: `cargo bench --features etcd --bench
//! cluster`. Knob: `CLUSTER_BENCH_N` (samples, default 30). Without `etcd` it prints a notice.
//!
//! 1. Uncontended acquire + release: the cluster lease (grant, the claim transaction, then the
//!    fenced delete and the revoke) vs the local kernel lease of a state dir (flock and three
//!    durable replaces) — the baseline.
//! 2. Handoff: a waiter (watching the owner key) takes over when the owner releases; the time
//!    from the release call to "the waiter owns".
//! 3. Failover after a crash: the owner vanishes without releasing (its keep-alive stops); the
//!    time until the waiter owns, against the TTL (the floor is the TTL itself).

// The harness serves the tests too: what only they use is unused here.
#[allow(dead_code)]
#[path = "../tests/common/etcd.rs"]
mod etcd;

/// The skip rule of the tests, for the harness: a notice (benchmarks never fail for it).
mod skip {
    pub fn skip(what: &str, why: &str) {
        println!("SKIPPED: {what}: {why}");
    }
}

use std::os::unix::fs::PermissionsExt;
use std::sync::mpsc::channel;
use std::time::{Duration, Instant};

use tenure::cluster::{self, ClusterSpec, Holder, Wait};
use tenure::lease::{self, AcquireOptions, WaitBound};
use tenure::privfs::StateDir;

fn samples() -> usize {
    std::env::var("CLUSTER_BENCH_N")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(30)
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn main() {
    let Some(cluster) = etcd::Cluster::start("the cluster benchmark") else {
        return;
    };
    let n = samples();
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("state");
    std::fs::create_dir(&dir).unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).unwrap();
    let sd = StateDir::open(&dir, true).unwrap();
    let me = Holder::me(&dir);
    let ttl = Duration::from_secs(2);
    let spec = ClusterSpec::parse(&cluster.url("bench"), ttl).unwrap();

    // 1. Uncontended acquire + release.
    let local: Vec<Duration> = (0..n)
        .map(|_| {
            let t = Instant::now();
            let opts = AcquireOptions {
                wait: WaitBound::Try,
                ..AcquireOptions::default()
            };
            let l = lease::acquire(&sd, &opts, &mut |_| {}).unwrap();
            l.release().unwrap();
            t.elapsed()
        })
        .collect();
    let remote: Vec<Duration> = (0..n)
        .map(|_| {
            let t = Instant::now();
            let l = cluster::acquire(&spec, &me, Wait::Try, None, &mut |_| {}).unwrap();
            assert!(l.release().unwrap());
            t.elapsed()
        })
        .collect();
    let (lm, cm) = (median(local), median(remote));
    println!("acquire + release, median of {n}:");
    println!("  local lease (flock + durable records)   {lm:>10.2?}  (baseline)");
    println!(
        "  cluster lease (3-member etcd)           {cm:>10.2?}  {:.2}x",
        cm.as_secs_f64() / lm.as_secs_f64()
    );

    // 2. Handoff through the watch; 3. failover after a crash, against the TTL.
    let handoff = |crash: bool| -> Duration {
        let mut owner = cluster::acquire(&spec, &me, Wait::Try, None, &mut |_| {}).unwrap();
        // Renewed every third of the TTL, as a runner's lease is.
        let (_wake, w) = cluster::wake_pair().unwrap();
        owner.keep_alive(w);
        let (tx, rx) = channel();
        let (spec2, me2) = (spec.clone(), me.clone());
        let waiter = std::thread::spawn(move || {
            let l = cluster::acquire(&spec2, &me2, Wait::Forever, None, &mut |p| {
                if matches!(p, cluster::Progress::Waiting { .. }) {
                    tx.send(()).unwrap();
                }
            })
            .unwrap();
            let at = Instant::now();
            assert!(l.release().unwrap());
            at
        });
        rx.recv().unwrap();
        // Let the waiter settle into its watch.
        std::thread::sleep(Duration::from_millis(50));
        let t = Instant::now();
        if crash {
            // Gone without a release: nothing renews the lease any more; it expires a TTL after
            // its last renewal, i.e. between 2/3 of the TTL and the TTL from now.
            drop(owner);
        } else {
            assert!(owner.release().unwrap());
        }
        waiter.join().unwrap() - t
    };
    let hn = n.min(10);
    let h = median((0..hn).map(|_| handoff(false)).collect());
    println!("handoff (release -> the waiter owns), median of {hn}: {h:.2?}");
    let fails = 3;
    let f = median((0..fails).map(|_| handoff(true)).collect());
    println!(
        "failover after a crash (-> the waiter owns), median of {fails}: {f:.2?} = {:.2}x the TTL of {ttl:?}",
        f.as_secs_f64() / ttl.as_secs_f64()
    );
}

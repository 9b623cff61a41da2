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
    // A leader that lost its quorum renews leases by itself (renewals do not go through raft)
    // until it notices and steps down, about an election timeout later: renew until refused.
    let end = Instant::now() + DEADLINE;
    let (e, took) = loop {
        let t = Instant::now();
        match c.keep_alive(id) {
            Err(e) => break (e, t.elapsed()),
            Ok(_) => {
                assert!(
                    Instant::now() < end,
                    "renewals still succeed without a quorum"
                );
                std::thread::sleep(Duration::from_millis(100));
            }
        }
    };
    assert!(
        tenure::cluster::etcd::unavailable(&e),
        "no quorum is unavailable: {e}"
    );
    // Each member is tried once, each within the client's timeout.
    assert!(took < Duration::from_secs(10), "{took:?}");
    cluster.restart(other);
    cluster.restart(leader);
    cluster.wait_leader(Duration::from_secs(30));
    assert!(c.get(b"x").is_ok());
}

// ---- the cluster lease of `tenure run --lease etcd://…` ----

use common::{DEADLINE, Env, Finished, Running, alive, sh, wait_for};
use rustix::process::Signal;
use std::path::{Path, PathBuf};
use tenure::checkpoint::format::Current;
use tenure::checkpoint::{CheckpointStore, StoreOptions};
use tenure::cluster::{ClusterSpec, ReadPointer};
use tenure::privfs::StateDir;

/// A machine of the test: its own local state dir (an [`Env`]), the cluster's lease URL and
/// the store the machines share.
struct Machine<'c> {
    env: Env,
    url: String,
    ttl: &'c str,
    store: PathBuf,
}

impl<'c> Machine<'c> {
    fn new(url: &str, ttl: &'c str, store: &Path) -> Machine<'c> {
        Machine {
            env: Env::new(),
            url: url.to_string(),
            ttl,
            store: store.to_path_buf(),
        }
    }

    fn run(&self, script: &str) -> Running {
        let store = self.store.to_str().unwrap();
        let args = [
            "--lease",
            &self.url,
            "--lease-ttl",
            self.ttl,
            "--store",
            store,
            "--grace",
            "5",
        ];
        self.env.run(&args, &sh(script, &[]))
    }

    /// The workload's pid, which the scripts below write to `pid` beside the state dir.
    fn workload_pid(&self) -> u32 {
        let p = self.env.path("pid");
        wait_for(
            "the workload's pid file",
            DEADLINE,
            || {
                std::fs::read_to_string(&p)
                    .ok()
                    .and_then(|s| s.trim().parse().ok())
            },
            || self.env.events_text(),
        )
    }

    fn epoch(&self, pid: u32) -> u64 {
        self.env.wait_event("owned", Some(pid))["epoch"]
            .as_u64()
            .unwrap()
    }
}

/// A workload that stages `f` = `what`, and runs until SIGTERM (then exits 0); it records its pid
/// once its trap is set, so a test that waited for the pid file may stop it.
fn serving(m: &Machine<'_>, what: &str) -> String {
    format!(
        "trap 'exit 0' TERM; echo {what} > \"$TENURE_CHECKPOINT_OUT/f\"; echo $$ > {pid}; while :; do sleep 0.05; done",
        pid = m.env.path("pid").display()
    )
}

/// What CURRENT on the cluster names, and the file `f` of that checkpoint in the shared store
/// (verified: the manifest's digest and every blob).
fn current_f(spec: &ClusterSpec, store: &Path) -> Option<(Current, String)> {
    let cur = tenure::cluster::read_current(spec).unwrap()?;
    let sd = StateDir::open(store, false).unwrap();
    let p = ReadPointer { spec: spec.clone() };
    let s = CheckpointStore::open(&sd, StoreOptions::default())
        .unwrap()
        .with_pointer(&p);
    let cp = s.load().unwrap().expect("CURRENT names a checkpoint");
    assert_eq!(cp.id, cur.id);
    let mut r = s.open_entry(cp.entry("f").unwrap()).unwrap();
    let mut text = String::new();
    std::io::Read::read_to_string(&mut r, &mut text).unwrap();
    Some((cur, text))
}

/// The directory the machines share for blobs and manifests: private, as every state dir.
fn shared_store() -> tempfile::TempDir {
    use std::os::unix::fs::PermissionsExt as _;
    let d = tempfile::tempdir().unwrap();
    std::fs::set_permissions(d.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
    d
}

fn spec(cluster: &Cluster, prefix: &str) -> ClusterSpec {
    ClusterSpec::parse(&cluster.url(prefix), Duration::from_secs(2)).unwrap()
}

/// Issue 14 (cards L1, L5 across machines): two runners with two local dirs and one shared
/// store contend for one prefix: exactly one owns, the other waits — visibly, as a waiter on
/// the cluster — and takes over after the owner's SIGTERM with a higher epoch, starting from
/// the checkpoint the first published.
#[test]
fn two_machines_contend_and_the_waiter_takes_over_with_a_higher_epoch() {
    let Some(cluster) = Cluster::start("two_machines_contend_and_the_waiter_takes_over") else {
        return;
    };
    let shared = shared_store();
    let url = cluster.url("svc");
    let a = Machine::new(&url, "2", shared.path());
    let b = Machine::new(&url, "2", shared.path());
    let ra = a.run(&serving(&a, "from-a"));
    let ea = a.epoch(ra.pid());
    a.env.wait_event("ready", Some(ra.pid()));
    // Staged, and its trap set.
    a.workload_pid();
    let rb = b.run(r#"test "$(cat "$TENURE_CHECKPOINT/f")" = from-a && echo from-b > "$TENURE_CHECKPOINT_OUT/f""#);
    // B's wait shows on the cluster, as a waiter, and in its own (new) dir's event log.
    let st = wait_for(
        "B to wait on the cluster",
        DEADLINE,
        || {
            let st = tenure::cluster::status(&spec(&cluster, "svc")).unwrap();
            (!st.waiters.is_empty()).then_some(st)
        },
        || b.env.events_text(),
    );
    assert_eq!(
        st.owner.as_ref().map(|(h, e)| (h.pid, *e)),
        Some((ra.pid(), ea))
    );
    assert_eq!(
        st.waiters.iter().map(|w| w.pid).collect::<Vec<_>>(),
        [rb.pid()]
    );
    let waiting = b.env.wait_event("waiting", Some(rb.pid()));
    assert_eq!(
        (&waiting["owner_pid"], &waiting["owner_epoch"]),
        (&ra.pid().into(), &ea.into())
    );
    // `status --lease` shows the cluster owner and the waiter beside the local view.
    let f = b.env.tool("status", &["--lease", &url, "--json"]);
    let v: serde_json::Value = serde_json::from_str(&f.stdout).unwrap_or_default();
    assert_eq!(v["cluster"]["owner"]["pid"], ra.pid(), "{}", f.stdout);
    assert_eq!(v["cluster"]["owner"]["epoch"], ea);
    assert_eq!(v["cluster"]["waiters"][0]["pid"], rb.pid());
    ra.signal(Signal::TERM);
    let fa = ra.wait();
    fa.expect_code(143);
    let fb = rb.wait();
    fb.expect_code(0);
    let eb = b.epoch(fb.pid);
    assert!(eb > ea, "epoch {eb} after {ea}");
    let (cur, f) = current_f(&spec(&cluster, "svc"), shared.path()).unwrap();
    assert_eq!(f, "from-b\n");
    assert_eq!(cur.id.get(), 2);
}

/// Issue 14: the owner is SIGSTOPped past its TTL; the other machine takes over and publishes;
/// on SIGCONT the first finds its lease lost: its workload is killed at once, nothing is
/// published, it exits 76 (`refused/lease-lost`), and CURRENT keeps the new owner's checkpoint.
#[test]
fn a_paused_owner_resumes_without_its_lease_and_is_stopped() {
    let Some(cluster) = Cluster::start("a_paused_owner_resumes_without_its_lease") else {
        return;
    };
    let shared = shared_store();
    let url = cluster.url("svc");
    let a = Machine::new(&url, "2", shared.path());
    let b = Machine::new(&url, "2", shared.path());
    let ra = a.run(&serving(&a, "from-a"));
    let ea = a.epoch(ra.pid());
    a.env.wait_event("ready", Some(ra.pid()));
    let workload = a.workload_pid();
    ra.signal(Signal::STOP);
    let fb = b.run_finished(r#"echo from-b > "$TENURE_CHECKPOINT_OUT/f""#);
    fb.expect_code(0);
    assert!(b.epoch(fb.pid) > ea);
    // A stop requested while it was paused is read after the loss, or drains into a publish
    // that the fence refuses: either way the end is the loss's.
    ra.signal(Signal::CONT);
    let fa = ra.wait();
    fa.expect_code(76);
    assert_eq!(fa.end()["summary"], "refused/lease-lost");
    assert!(!alive(workload), "the workload was stopped");
    assert!(
        a.env.events().iter().any(|e| e["kind"] == "lease-lost"),
        "{}",
        a.env.events_text()
    );
    let (_, f) = current_f(&spec(&cluster, "svc"), shared.path()).unwrap();
    assert_eq!(f, "from-b\n", "CURRENT holds the new owner's checkpoint");
}

/// Issue 14: an owner paused in the middle of its publish — blobs and manifest written into the
/// shared store, CURRENT not yet moved (held there by the failpoint gate
/// `publish.manifest.dirfsync`) — is SIGSTOPped past its TTL; the other machine takes over and
/// publishes; on SIGCONT the first one's move of CURRENT is refused by the cluster's fence
/// (the owner key is another epoch's): `publish-failed` says CURRENT was not moved, the run
/// exits 76 (`refused/lease-lost`), and CURRENT keeps the new owner's checkpoint.
#[cfg(feature = "failpoints")]
#[test]
fn a_paused_owners_publish_is_refused_by_the_fence() {
    let Some(cluster) = Cluster::start("a_paused_owners_publish_is_refused_by_the_fence") else {
        return;
    };
    let shared = shared_store();
    let url = cluster.url("svc");
    let a = Machine::new(&url, "2", shared.path());
    let b = Machine::new(&url, "2", shared.path());
    let gate = a.env.fifo("gate");
    let mut c = common::tenure();
    c.env(
        "TENURE_FAILPOINTS",
        format!("publish.manifest.dirfsync=gate:{}", gate.display()),
    )
    .args(["run", "--dir"])
    .arg(&a.env.dir)
    .args(["--lease", &url, "--lease-ttl", "2", "--store"])
    .arg(shared.path())
    .arg("--")
    .args(sh(r#"echo from-a > "$TENURE_CHECKPOINT_OUT/f""#, &[]));
    let ra = a.env.start(c);
    let ea = a.epoch(ra.pid());
    // Held in its publish: the manifest is in place, CURRENT not yet moved.
    common::wait_blocked_in_fifo_open(ra.pid());
    ra.signal(Signal::STOP);
    let fb = b.run_finished(r#"echo from-b > "$TENURE_CHECKPOINT_OUT/f""#);
    fb.expect_code(0);
    assert!(b.epoch(fb.pid) > ea);
    ra.signal(Signal::CONT);
    common::release_fifo(&gate);
    let fa = ra.wait();
    fa.expect_code(76);
    assert_eq!(fa.end()["summary"], "refused/lease-lost");
    let refused = a
        .env
        .events()
        .into_iter()
        .find(|e| e["kind"] == "publish-failed")
        .unwrap_or_else(|| panic!("no publish-failed: {}", a.env.events_text()));
    let why = refused["error"].as_str().unwrap();
    assert!(why.contains("CURRENT was not moved"), "{why}");
    assert!(why.contains(&format!("epoch {ea}")), "{why}");
    let (cur, f) = current_f(&spec(&cluster, "svc"), shared.path()).unwrap();
    assert_eq!(f, "from-b\n", "CURRENT holds the new owner's checkpoint");
    // A's manifest 1 stayed in the shared store (garbage); B's publish took the next id.
    assert_eq!(cur.id.get(), 2);
}

/// Issue 14: killing the etcd member that leads does not disturb the owner (a new leader is
/// elected well within the TTL, and keep-alives go to the other members); the owner drains
/// and publishes as usual afterwards.
#[test]
fn killing_the_leader_member_does_not_disturb_the_owner() {
    let Some(mut cluster) = Cluster::start("killing_the_leader_member_does_not_disturb_the_owner")
    else {
        return;
    };
    let shared = shared_store();
    let url = cluster.url("svc");
    // A TTL of 5 s: the election takes about a second, and on a loaded two-core machine the
    // renewals around it may be late by a second or two more; the test asserts that the owner
    // keeps its lease, so it leaves that headroom.
    let a = Machine::new(&url, "5", shared.path());
    let ra = a.run(&serving(&a, "from-a"));
    a.env.wait_event("ready", Some(ra.pid()));
    a.workload_pid();
    let leader = cluster.wait_leader(DEADLINE);
    cluster.kill(leader);
    cluster.wait_leader(DEADLINE);
    // A TTL and more: a lease that was not renewed through the election would be lost by now.
    std::thread::sleep(Duration::from_secs(7));
    assert!(
        !a.env.events().iter().any(|e| e["kind"] == "lease-lost"),
        "{}",
        a.env.events_text()
    );
    ra.signal(Signal::TERM);
    ra.wait().expect_code(143);
    let (_, f) = current_f(&spec(&cluster, "svc"), shared.path()).unwrap();
    assert_eq!(f, "from-a\n");
}

/// Issue 14: killing two of the three members (no quorum: nothing can renew the lease) makes
/// the owner stop its workload within the TTL and publish nothing; exit 76.
#[test]
fn losing_the_quorum_stops_the_workload_within_the_ttl() {
    let Some(mut cluster) = Cluster::start("losing_the_quorum_stops_the_workload_within_the_ttl")
    else {
        return;
    };
    let shared = shared_store();
    let url = cluster.url("svc");
    let a = Machine::new(&url, "2", shared.path());
    let ra = a.run(&serving(&a, "from-a"));
    a.env.wait_event("ready", Some(ra.pid()));
    let workload = a.workload_pid();
    cluster.kill(0);
    cluster.kill(1);
    let t = Instant::now();
    let fa = ra.wait();
    fa.expect_code(76);
    // The TTL (2 s), a renewal period, and slack for a loaded machine.
    assert!(t.elapsed() < Duration::from_secs(8), "{:?}", t.elapsed());
    assert!(!alive(workload));
    cluster.restart(0);
    cluster.restart(1);
    cluster.wait_leader(Duration::from_secs(30));
    assert!(
        tenure::cluster::read_current(&spec(&cluster, "svc"))
            .unwrap()
            .is_none(),
        "nothing was published"
    );
}

/// Issue 14 (the silent waiter of the failover checker): a runner started while the cluster
/// cannot serve — here two of three members are down, so no call can succeed — neither exits
/// nor waits silently: it logs `cluster-unavailable` (and a warning on stderr) and retries; once
/// the members are back it logs `cluster-reachable`, owns and runs as usual. With `-n` the same
/// runner gives up at once (74), naming the cluster, and its end record says so.
#[test]
fn a_runner_started_without_quorum_waits_visibly_and_owns_once_it_returns() {
    let Some(mut cluster) =
        Cluster::start("a_runner_started_without_quorum_waits_visibly_and_owns_once_it_returns")
    else {
        return;
    };
    let shared = shared_store();
    let url = cluster.url("svc");
    // A TTL of 10 s: right after two members restart, the cluster can leave a renewal
    // unanswered for a while (catching up, a new election); with 2 s the owner once lost its
    // lease in that window in CI, and with 5 s once on a machine busy with a model run (exit
    // 76 1.6 s after `owned`: the right outcome, but not what this test is about).
    let a = Machine::new(&url, "10", shared.path());
    cluster.kill(0);
    cluster.kill(1);
    let store = shared.path().to_str().unwrap();
    let f = a.env.run_to_end(
        &["--lease", &url, "--lease-ttl", "2", "--store", store, "-n"],
        &["true"],
    );
    f.expect_code(74);
    assert!(f.stderr.contains("no etcd member answered"), "{}", f.stderr);
    assert_eq!(f.end()["summary"], "refused/io");
    let ra = a.run(&serving(&a, "from-a"));
    let ev = a.env.wait_event("cluster-unavailable", Some(ra.pid()));
    assert_eq!(ev["lease"], url.as_str());
    assert_eq!(ev["retrying"], true);
    // Several times what one round of calls on every member may take: still waiting.
    std::thread::sleep(Duration::from_secs(4));
    assert!(alive(ra.pid()), "{}", ra.stderr());
    assert!(
        ra.stderr().contains("cluster unavailable, retrying"),
        "{}",
        ra.stderr()
    );
    cluster.restart(0);
    cluster.restart(1);
    cluster.wait_leader(Duration::from_secs(30));
    a.env.wait_event("cluster-reachable", Some(ra.pid()));
    a.env.wait_event("owned", Some(ra.pid()));
    a.workload_pid();
    ra.signal(Signal::TERM);
    ra.wait().expect_code(143);
    let (_, f) = current_f(&spec(&cluster, "svc"), shared.path()).unwrap();
    assert_eq!(f, "from-a\n");
}

impl Machine<'_> {
    fn run_finished(&self, script: &str) -> Finished {
        let mut r = self.run(script);
        r.close_stdin();
        r.wait()
    }
}

/// The checker workload: each owner copies the log of the checkpoint it starts from and
/// appends `EPOCH SEQ` (SEQ one more than the last line), then serves until SIGTERM; its pid
/// file is written once the line is staged and its trap set. The staging ignores SIGTERM (its
/// `cp` and `wc` too, which inherit that) and ends with a rename, so the log is staged whole or
/// not at all: a checkpoint is never a torn log. The test sends SIGTERM only once the pid file
/// exists.
fn appender(m: &Machine<'_>) -> String {
    format!(
        r#"trap '' TERM
out="$TENURE_CHECKPOINT_OUT/log"
if [ -n "$TENURE_CHECKPOINT" ] && [ -f "$TENURE_CHECKPOINT/log" ]; then cp "$TENURE_CHECKPOINT/log" "$out.new"; else : > "$out.new"; fi
n=$(wc -l < "$out.new")
echo "$TENURE_EPOCH $((n + 1))" >> "$out.new"
mv "$out.new" "$out"
trap 'exit 0' TERM
echo $$ > {pid}
while :; do sleep 0.05; done"#,
        pid = m.env.path("pid").display()
    )
}

/// What the file `name` of the checkpoint CURRENT names holds (verified), with its id.
fn current_file(spec: &ClusterSpec, store: &Path, name: &str) -> Option<(u64, String)> {
    tenure::cluster::read_current(spec).unwrap()?;
    let sd = StateDir::open(store, false).unwrap();
    let p = ReadPointer { spec: spec.clone() };
    let s = CheckpointStore::open(&sd, StoreOptions::default())
        .unwrap()
        .with_pointer(&p);
    let cp = s.load().unwrap()?;
    let mut r = s.open_entry(cp.entry(name)?).unwrap();
    let mut text = String::new();
    std::io::Read::read_to_string(&mut r, &mut text).unwrap();
    Some((cp.id.get(), text))
}

/// A small deterministic generator (the seed is printed, and `TENURE_FAILOVER_SEED` replays it).
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (self.0 >> 33) % n
    }
}

/// How long a waiter may take to own once the owner is gone: the TTL (a crashed or paused
/// owner's lease must expire first), a leader election or a member's restart, the waiter's
/// retries meanwhile, and ample slack for a loaded two-core machine. A waiter that does not own
/// by then (or ends) fails the test with its stderr and event log.
const TAKEOVER: Duration = Duration::from_secs(60);

/// The failover checker's world: two machines sharing a store, each with at most one run.
struct Checker<'c> {
    machines: [Machine<'c>; 2],
    runs: [Option<Running>; 2],
    sp: ClusterSpec,
    store: PathBuf,
    /// Every acknowledged checkpoint (its run logged `checkpoint-published`): the id, the
    /// publisher's epoch and the log it holds, in the order they were published.
    acked: Vec<(u64, u64, String)>,
}

impl Checker<'_> {
    /// Starts the appender on machine `i` (as a waiter, or the first owner); a stale pid file
    /// is removed first, as the workload writes it only once it owns and staged its line.
    fn start(&mut self, i: usize) {
        let _ = std::fs::remove_file(self.machines[i].env.path("pid"));
        self.runs[i] = Some(self.machines[i].run(&appender(&self.machines[i])));
    }

    /// Waits until machine `i`'s run owns and its workload runs: its epoch. The run must not
    /// end meanwhile (a waiter never gives up on its own, whatever the cluster does).
    fn owns(&mut self, i: usize, what: &str) -> u64 {
        let m = &self.machines[i];
        let r = self.runs[i].as_mut().expect("machine runs");
        let pid = r.pid();
        let end = Instant::now() + TAKEOVER;
        let epoch = loop {
            let owned = m
                .env
                .events()
                .into_iter()
                .find(|e| e["kind"] == "owned" && e["pid"] == pid)
                .and_then(|e| e["epoch"].as_u64());
            if let Some(e) = owned {
                break e;
            }
            let running = r.running();
            if !running || Instant::now() >= end {
                panic!(
                    "{what}: the waiter {pid} {} within {TAKEOVER:?}\nstderr:\n{}\nevents:\n{}",
                    if running { "did not own" } else { "ended" },
                    r.stderr(),
                    m.env.events_text()
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        m.env.wait_event("ready", Some(pid));
        m.workload_pid();
        epoch
    }

    /// Reads how machine `i`'s ended run `f` ended: if it logged `checkpoint-published`, the
    /// checkpoint CURRENT now names is acknowledged (its log's last line is the run's own);
    /// otherwise CURRENT is what it was `before`. An exit 76 is the loss's: a `lease-lost`
    /// event and the summary `refused/lease-lost`.
    fn ended(&mut self, i: usize, f: &Finished, epoch: u64, before: &Option<(u64, String)>) {
        let m = &self.machines[i];
        let events = m.env.events();
        let mine = |kind: &str| {
            events
                .iter()
                .find(|e| e["pid"] == f.pid && e["kind"] == kind)
                .cloned()
        };
        if f.code == Some(76) {
            assert_eq!(f.end()["summary"], "refused/lease-lost", "{}", f.stderr);
            assert!(mine("lease-lost").is_some(), "{}", m.env.events_text());
        }
        let now = current_file(&self.sp, &self.store, "log");
        match mine("checkpoint-published") {
            Some(e) => {
                let (id, log) = now.expect("CURRENT names the published checkpoint");
                assert_eq!(
                    Some(id),
                    e["checkpoint"].as_u64(),
                    "{}",
                    m.env.events_text()
                );
                let last = log.lines().last().unwrap_or_default();
                assert!(
                    last.starts_with(&format!("{epoch} ")),
                    "checkpoint {id} of epoch {epoch} ends with {last:?}"
                );
                self.acked.push((id, epoch, log));
            }
            None => assert_eq!(&now, before, "nothing was published, CURRENT did not move"),
        }
    }
}

/// Issue 14, the checker workload: two machines run the appender one after the other over
/// randomized failover rounds — the owner SIGTERMed (it publishes), SIGKILLed with its workload
/// (a machine crash: nothing published), SIGSTOPped past its TTL and resumed (exit 76, its
/// workload killed), or an etcd member killed and restarted under it.
///
/// A member restart is an election, and on a loaded machine an owner can lose its lease in one
/// (no renewal confirmed within the TTL): it then stops its workload and exits 76 without
/// publishing, and the waiter takes over. That is the lifecycle working, not a failure, so the
/// checker accepts it in any round — an owner SIGTERMed may likewise end 76 if it lost its
/// lease just before — and checks the invariants instead, strictly: every takeover has a higher
/// epoch; a waiter never ends by itself and owns within [`TAKEOVER`] once the owner is gone
/// (somebody always owns again); a run that ends without `checkpoint-published` left CURRENT
/// where it was; at the end the published log has non-decreasing epochs and consecutive
/// sequence numbers, and every acknowledged checkpoint (a `checkpoint-published` a runner
/// logged) is a prefix of it: none was lost.
/// `TENURE_FAILOVER_ROUNDS` (default 50) and `TENURE_FAILOVER_SEED` choose the run.
#[test]
fn randomized_failover_rounds_lose_no_acknowledged_checkpoint() {
    let Some(mut cluster) =
        Cluster::start("randomized_failover_rounds_lose_no_acknowledged_checkpoint")
    else {
        return;
    };
    let rounds: usize = std::env::var("TENURE_FAILOVER_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(50);
    let seed: u64 = std::env::var("TENURE_FAILOVER_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(tenure::lease::now_ms);
    eprintln!("failover: {rounds} rounds, TENURE_FAILOVER_SEED={seed}");
    let mut rng = Rng(seed);
    let shared = shared_store();
    let url = cluster.url("svc");
    // A TTL of 3 s: short enough for fifty rounds with crashes and pauses, long enough that a
    // member restart rarely costs the owner its lease (when it does, see above).
    let mut c = Checker {
        machines: [
            Machine::new(&url, "3", shared.path()),
            Machine::new(&url, "3", shared.path()),
        ],
        runs: [None, None],
        sp: spec(&cluster, "svc"),
        store: shared.path().to_path_buf(),
        acked: Vec::new(),
    };
    c.start(0);
    let mut owner = 0usize;
    let mut epoch = c.owns(0, "the first owner");
    c.start(1);
    let mut kinds = [0usize; 4];
    let mut lost_in_restart = 0usize;
    for round in 0..rounds {
        let fault = rng.below(4) as usize;
        kinds[fault] += 1;
        let other = 1 - owner;
        let workload = c.machines[owner].workload_pid();
        let before = current_file(&c.sp, &c.store, "log");
        let mut taken = None;
        let f = match fault {
            0 => {
                let r = c.runs[owner].take().unwrap();
                r.signal(Signal::TERM);
                let f = r.wait();
                // Stopped and published, or it had lost its lease under load (see above).
                assert!(matches!(f.code, Some(143 | 76)), "round {round}: {f:?}");
                if f.code == Some(143) {
                    assert!(
                        f.end()["summary"] == "stopped/SIGTERM",
                        "round {round}: {}",
                        f.end()
                    );
                }
                f
            }
            1 => {
                // The machine crashes: the runner and its workload die at once (either may be
                // gone already if the lease was lost just before).
                let r = c.runs[owner].take().unwrap();
                r.signal(Signal::KILL);
                let _ = rustix::process::kill_process(
                    rustix::process::Pid::from_raw(workload as i32).unwrap(),
                    Signal::KILL,
                );
                r.wait()
            }
            2 => {
                let r = c.runs[owner].take().unwrap();
                r.signal(Signal::STOP);
                // Resumed once the other machine owns: then it must find its lease lost.
                taken = Some(c.owns(
                    other,
                    &format!("round {round}: the takeover of a paused owner"),
                ));
                r.signal(Signal::CONT);
                let f = r.wait();
                f.expect_code(76);
                f
            }
            _ => {
                // An etcd member dies and comes back under the owner.
                let i = rng.below(3) as usize;
                cluster.kill(i);
                cluster.wait_leader(DEADLINE);
                cluster.restart(i);
                cluster.wait_leader(DEADLINE);
                let r = c.runs[owner].as_mut().unwrap();
                if r.running() {
                    continue;
                }
                lost_in_restart += 1;
                let f = c.runs[owner].take().unwrap().wait();
                assert_eq!(
                    f.code,
                    Some(76),
                    "round {round}: member {i}'s restart: {f:?}"
                );
                f
            }
        };
        if fault != 1 {
            assert!(
                !alive(workload),
                "round {round}: the ended owner's workload runs"
            );
        }
        let acked = c.acked.len();
        c.ended(owner, &f, epoch, &before);
        if f.code == Some(143) {
            assert_eq!(c.acked.len(), acked + 1, "round {round}: a stop publishes");
        }
        // The other machine takes over with a higher epoch; this one waits again.
        let next = match taken {
            Some(e) => e,
            None => c.owns(other, &format!("round {round}: the takeover")),
        };
        assert!(next > epoch, "round {round}: epoch {next} after {epoch}");
        epoch = next;
        c.start(owner);
        owner = other;
    }
    // The waiter is stopped first (a cancelled wait publishes nothing); then the last owner
    // publishes. Either may have owned meanwhile if a lease was lost: `ended` reads what each
    // did.
    for i in [1 - owner, owner] {
        let before = current_file(&c.sp, &c.store, "log");
        if i == owner {
            c.machines[i].workload_pid();
        }
        let r = c.runs[i].take().unwrap();
        // The waiter was started just now: it is stopped once it logged its first event
        // (waiting, or owned), so the stop tests a wait, not a process still starting up.
        let pid = r.pid();
        wait_for(
            "the last waiter's first event",
            DEADLINE,
            || {
                c.machines[i]
                    .env
                    .events()
                    .iter()
                    .any(|e| e["pid"] == pid)
                    .then_some(())
            },
            || c.machines[i].env.events_text(),
        );
        r.signal(Signal::TERM);
        let f = r.wait();
        let e = c.machines[i]
            .env
            .events()
            .into_iter()
            .find(|e| e["kind"] == "owned" && e["pid"] == f.pid)
            .and_then(|e| e["epoch"].as_u64())
            .unwrap_or(0);
        c.ended(i, &f, e, &before);
    }
    let (_, last) = current_file(&c.sp, &c.store, "log").expect("something was published");
    let mut prev = 0u64;
    for (i, line) in last.lines().enumerate() {
        let (e, seq) = line.split_once(' ').unwrap();
        let (e, seq): (u64, usize) = (e.parse().unwrap(), seq.parse().unwrap());
        assert_eq!(seq, i + 1, "a gap in the sequence:\n{last}");
        assert!(e >= prev, "epochs decrease:\n{last}");
        prev = e;
    }
    assert!(
        !c.acked.is_empty(),
        "the last owner's publish was acknowledged"
    );
    for (id, e, a) in &c.acked {
        assert!(
            last.starts_with(a.as_str()),
            "lost: checkpoint {id} of epoch {e} ({a:?}) is not in\n{last}"
        );
    }
    eprintln!(
        "failover: {} acknowledged checkpoints over {rounds} rounds (term {}, crash {}, pause {}, member {} of which {} cost the owner its lease)",
        c.acked.len(),
        kinds[0],
        kinds[1],
        kinds[2],
        kinds[3],
        lost_in_restart
    );
}

/// Issue 14 (card H6 for the cluster options): a lease URL that is not
/// `etcd://HOST:PORT[,…]/PREFIX`, a TTL that is not whole seconds from 2 to 3600, or `--store`
/// without `--lease` is a usage error (64) that names the fix, before anything is touched: the
/// state dir is not even created. Needs no cluster.
#[test]
fn bad_cluster_options_are_usage_errors_that_touch_nothing() {
    let env = Env::new();
    for args in [
        &["--lease", "http://127.0.0.1:2379/p"][..],
        &["--lease", "etcd://127.0.0.1:2379"],
        &["--lease", "etcd://127.0.0.1/p"],
        &["--lease", "etcd://127.0.0.1:2379/p", "--lease-ttl", "1"],
        &["--lease", "etcd://127.0.0.1:2379/p", "--lease-ttl", "2.5"],
        &["--store", "/tmp"],
    ] {
        let f = env.run_to_end(args, &["true"]);
        f.expect_code(64);
        assert!(
            f.stderr.contains("etcd://HOST:PORT")
                || f.stderr.contains("--lease-ttl")
                || f.stderr.contains("go with --lease"),
            "{args:?}: {}",
            f.stderr
        );
        assert!(!env.dir.exists(), "{args:?} created the state dir");
    }
}

/// Issue 14 (card L1 across machines): with `-n`, a runner whose prefix is owned elsewhere exits
/// busy (75) at once, names the owner, and leaves nothing on the cluster (no waiter entry, its
/// etcd lease revoked) and no owner record in its local dir.
#[test]
fn a_nonblocking_runner_exits_busy_and_leaves_nothing() {
    let Some(cluster) = Cluster::start("a_nonblocking_runner_exits_busy_and_leaves_nothing") else {
        return;
    };
    let shared = shared_store();
    let url = cluster.url("svc");
    let a = Machine::new(&url, "2", shared.path());
    let b = Machine::new(&url, "2", shared.path());
    let ra = a.run(&serving(&a, "from-a"));
    let ea = a.epoch(ra.pid());
    a.env.wait_event("ready", Some(ra.pid()));
    let store = shared.path().to_str().unwrap();
    let f = b.env.run_to_end(
        &["--lease", &url, "--lease-ttl", "2", "--store", store, "-n"],
        &["true"],
    );
    f.expect_code(75);
    assert!(f.stderr.contains("busy"), "{}", f.stderr);
    let st = tenure::cluster::status(&spec(&cluster, "svc")).unwrap();
    assert!(st.waiters.is_empty(), "{:?}", st.waiters);
    assert_eq!(st.owner.map(|(h, e)| (h.pid, e)), Some((ra.pid(), ea)));
    assert!(!b.env.dir.join(".tenure/owner.json").exists());
    // Only the owner's lease is left: the busy runner revoked its own.
    let leases = cluster
        .client()
        .call("/v3/lease/leases", &serde_json::json!({}))
        .unwrap();
    assert_eq!(
        leases["leases"].as_array().map_or(0, Vec::len),
        1,
        "{leases}"
    );
    ra.signal(Signal::TERM);
    ra.wait().expect_code(143);
}

/// Issue 14: a waiter SIGSTOPped past its TTL loses its own etcd lease (and with it its entry
/// in the waiter list); resumed, it takes a fresh lease, is listed again, and still takes over
/// with a higher epoch when the owner stops.
#[test]
fn a_paused_waiter_resumes_and_still_takes_over() {
    let Some(cluster) = Cluster::start("a_paused_waiter_resumes_and_still_takes_over") else {
        return;
    };
    let shared = shared_store();
    let url = cluster.url("svc");
    let sp = spec(&cluster, "svc");
    let a = Machine::new(&url, "2", shared.path());
    let b = Machine::new(&url, "2", shared.path());
    let ra = a.run(&serving(&a, "from-a"));
    let ea = a.epoch(ra.pid());
    a.workload_pid();
    let rb = b.run(r#"echo from-b > "$TENURE_CHECKPOINT_OUT/f""#);
    let listed = |want: bool| {
        wait_for(
            if want {
                "B listed as a waiter"
            } else {
                "B's waiter entry to expire with its lease"
            },
            DEADLINE,
            || {
                let st = tenure::cluster::status(&sp).unwrap();
                (st.waiters.iter().any(|w| w.pid == rb.pid()) == want).then_some(())
            },
            String::new,
        )
    };
    listed(true);
    rb.signal(Signal::STOP);
    listed(false);
    rb.signal(Signal::CONT);
    listed(true);
    ra.signal(Signal::TERM);
    ra.wait().expect_code(143);
    let fb = rb.wait();
    fb.expect_code(0);
    assert!(b.epoch(fb.pid) > ea);
    let (_, f) = current_f(&sp, shared.path()).unwrap();
    assert_eq!(f, "from-b\n");
}

/// Ends the detached owners `up` launched if a test fails before it stopped them (they are
/// not children of the test, so nothing else would).
struct Detached(Vec<u32>);

impl Drop for Detached {
    fn drop(&mut self) {
        for pid in &self.0 {
            if alive(*pid) {
                let _ = rustix::process::kill_process(
                    rustix::process::Pid::from_raw(*pid as i32).unwrap(),
                    Signal::KILL,
                );
            }
        }
    }
}

/// Issue 14: `tenure up --lease …`, the daemonising form, against the real cluster. `up`
/// launches one detached owner that takes the cluster lease and prints its registration with
/// the cluster's epoch (the owner key's create revision, as `status --lease` shows it); a
/// second `up` on that dir connects to it without another launch; on another machine `up` with
/// a short `--wait` fails (startup_timeout: the prefix is owned elsewhere) and its launched run
/// gives up within that bound too, leaving no waiter on the cluster; `stop --lease` ends the
/// detached owner, which publishes into the shared store; the other machine's `up` then owns
/// with a higher epoch, starting from that checkpoint.
#[test]
fn up_with_a_cluster_lease_daemonises_one_owner() {
    let Some(cluster) = Cluster::start("up_with_a_cluster_lease_daemonises_one_owner") else {
        return;
    };
    let shared = shared_store();
    let url = cluster.url("svc");
    let sp = spec(&cluster, "svc");
    let store = shared.path().to_str().unwrap();
    let a = Machine::new(&url, "2", shared.path());
    let b = Machine::new(&url, "2", shared.path());
    let mut detached = Detached(Vec::new());
    let up = |m: &Machine<'_>, wait: &str, script: &str| {
        let mut args = vec![
            "--lease",
            &url,
            "--lease-ttl",
            "2",
            "--store",
            store,
            "--wait",
            wait,
            "--",
        ];
        let cmd = sh(script, &[]);
        args.extend(cmd.iter().map(String::as_str));
        let f = m.env.tool("up", &args);
        let line: serde_json::Value =
            serde_json::from_str(f.stdout.trim()).unwrap_or_else(|_| panic!("{f:?}"));
        (f, line)
    };
    let (f, reg) = up(&a, "20", &serving(&a, "from-a"));
    f.expect_code(0);
    assert_eq!(reg["phase"], "ready", "{reg}");
    let (pid_a, ea) = (
        reg["pid"].as_u64().unwrap() as u32,
        reg["epoch"].as_u64().unwrap(),
    );
    detached.0.push(pid_a);
    a.workload_pid();
    let st = tenure::cluster::status(&sp).unwrap();
    assert_eq!(st.owner.map(|(h, e)| (h.pid, e)), Some((pid_a, ea)));
    // Connect, do not launch: the same owner, one launch on record.
    let (f, again) = up(&a, "20", "exit 7");
    f.expect_code(0);
    assert_eq!(
        (&again["pid"], &again["epoch"]),
        (&reg["pid"], &reg["epoch"])
    );
    let launches = a
        .env
        .events()
        .iter()
        .filter(|e| e["kind"] == "launching")
        .count();
    assert_eq!(launches, 1, "{}", a.env.events_text());
    // Another machine: owned elsewhere, so its launched run waits on the cluster until `up`'s
    // bound, and both give up.
    let (f, failed) = up(&b, "2", "exit 7");
    f.expect_code(69);
    assert_eq!(failed["error"], "startup_timeout", "{failed}");
    wait_for(
        "B's launched run to give up its wait",
        DEADLINE,
        || {
            let st = tenure::cluster::status(&sp).unwrap();
            st.waiters.is_empty().then_some(())
        },
        String::new,
    );
    // `stop` ends the detached owner through its local records; it drains and publishes.
    let f = a.env.tool("stop", &["--lease", &url]);
    f.expect_code(0);
    wait_for(
        "the detached owner to end",
        DEADLINE,
        || (!alive(pid_a)).then_some(()),
        || a.env.events_text(),
    );
    let end = a
        .env
        .events()
        .into_iter()
        .find(|e| e["kind"] == "end" && e["pid"] == pid_a)
        .unwrap_or_else(|| panic!("no end: {}", a.env.events_text()));
    assert_eq!(end["summary"], "stopped/SIGTERM", "{end}");
    let (_, f) = current_f(&sp, shared.path()).unwrap();
    assert_eq!(f, "from-a\n");
    // Now B's `up` owns, from A's checkpoint, with a higher epoch.
    let (f, reg_b) = up(
        &b,
        "20",
        &format!(
            r#"test "$(cat "$TENURE_CHECKPOINT/f")" = from-a || exit 3; {}"#,
            serving(&b, "from-b")
        ),
    );
    f.expect_code(0);
    let (pid_b, eb) = (
        reg_b["pid"].as_u64().unwrap() as u32,
        reg_b["epoch"].as_u64().unwrap(),
    );
    detached.0.push(pid_b);
    assert!(eb > ea, "epoch {eb} after {ea}");
    b.workload_pid();
    b.env.tool("stop", &["--lease", &url]).expect_code(0);
    wait_for(
        "B's detached owner to end",
        DEADLINE,
        || (!alive(pid_b)).then_some(()),
        || b.env.events_text(),
    );
    let (_, f) = current_f(&sp, shared.path()).unwrap();
    assert_eq!(f, "from-b\n");
}

/// Issue 14, the shared store's garbage: what a crashed or paused former owner left is removed
/// by the next owner's publish, once its fenced move of CURRENT proved every lower epoch fenced
/// for good — and nothing of its own epoch or a higher one.
///
/// A crashes in the middle of its publish (SIGKILL while held by the failpoint gate
/// `publish.batch.syncfs`: its new blobs sit in `incoming-EA/`, never moved). B takes over and
/// publishes; while B's publish is held after listing the manifests (gate
/// `publish.manifest.dirfsync`), the files a racing former owner and a newer owner would write
/// are put beside it: a manifest of A's epoch with an id above B's (what A, paused past its
/// TTL and resumed, writes after B listed — a race no test can time with real processes, so its
/// file is written here, byte for byte what the store writes), and a manifest and an
/// `incoming-EPOCH/` of a higher epoch (a newer owner's, should B have lost its lease). B's
/// publish then removes A's `incoming-EA/` and A's manifest, and keeps its own checkpoint and
/// the higher epoch's files.
#[cfg(feature = "failpoints")]
#[test]
fn a_new_owners_publish_removes_what_lower_epochs_left_in_the_shared_store() {
    use tenure::checkpoint::format::{CheckpointId, MANIFEST_FORMAT, Manifest};
    let Some(cluster) =
        Cluster::start("a_new_owners_publish_removes_what_lower_epochs_left_in_the_shared_store")
    else {
        return;
    };
    let shared = shared_store();
    let url = cluster.url("svc");
    let sp = spec(&cluster, "svc");
    let a = Machine::new(&url, "2", shared.path());
    let b = Machine::new(&url, "2", shared.path());
    let store_dir = shared.path().join("checkpoints");
    let gated = |m: &Machine<'_>, gate: &Path, at: &str, script: &str| {
        let mut c = common::tenure();
        c.env("TENURE_FAILPOINTS", format!("{at}=gate:{}", gate.display()))
            .args(["run", "--dir"])
            .arg(&m.env.dir)
            .args(["--lease", &url, "--lease-ttl", "2", "--store"])
            .arg(shared.path())
            .arg("--")
            .args(sh(script, &[]));
        m.env.start(c)
    };
    // A stages a file and exits 0: its publish copies the blob into incoming-EA/ and is held
    // before the batch's syncfs, then crashes.
    let gate_a = a.env.fifo("gate");
    let ra = gated(
        &a,
        &gate_a,
        "publish.batch.syncfs",
        r#"echo from-a > "$TENURE_CHECKPOINT_OUT/f""#,
    );
    let ea = a.epoch(ra.pid());
    common::wait_blocked_in_fifo_open(ra.pid());
    let incoming_a = store_dir.join(format!("incoming-{ea}"));
    assert!(
        std::fs::read_dir(&incoming_a).is_ok_and(|mut d| d.next().is_some()),
        "A's new blob waits in {}",
        incoming_a.display()
    );
    ra.signal(Signal::KILL);
    drop(ra.wait());
    // B takes over once A's lease expired, and publishes; held after its manifest is in place.
    let gate_b = b.env.fifo("gate");
    let rb = gated(
        &b,
        &gate_b,
        "publish.manifest.dirfsync",
        r#"echo from-b > "$TENURE_CHECKPOINT_OUT/f""#,
    );
    common::wait_blocked_in_fifo_open(rb.pid());
    let eb = b.epoch(rb.pid());
    assert!(eb > ea);
    let manifests = store_dir.join("manifests");
    let ids = |dir: &Path| -> Vec<u64> {
        let mut v: Vec<u64> = std::fs::read_dir(dir)
            .unwrap()
            .filter_map(|e| {
                let n = e.unwrap().file_name().into_string().ok()?;
                CheckpointId::from_manifest_file_name(&n).map(CheckpointId::get)
            })
            .collect();
        v.sort_unstable();
        v
    };
    let b_id = *ids(&manifests).last().expect("B's manifest is in place");
    let plant = |id: u64, epoch: u64| {
        let id = CheckpointId::new(id).unwrap();
        let m = Manifest {
            format: MANIFEST_FORMAT,
            id,
            parent: CheckpointId::new(b_id - 1),
            epoch,
            created_at_ms: tenure::lease::now_ms(),
            entries: Vec::new(),
        };
        common::write_private(&manifests.join(id.manifest_file_name()), &m.to_bytes());
    };
    plant(b_id + 1, ea);
    plant(b_id + 2, eb + 1000);
    let newer_incoming = store_dir.join(format!("incoming-{}", eb + 1000));
    std::fs::create_dir(&newer_incoming).unwrap();
    std::fs::write(newer_incoming.join("blob"), "a newer owner's").unwrap();
    common::release_fifo(&gate_b);
    let fb = rb.wait();
    fb.expect_code(0);
    let (cur, f) = current_f(&sp, shared.path()).unwrap();
    assert_eq!((cur.id.get(), f.as_str()), (b_id, "from-b\n"));
    assert!(!incoming_a.exists(), "A's incoming-{ea}/ was removed");
    assert_eq!(
        ids(&manifests),
        [b_id, b_id + 2],
        "A's manifest went; B's and the newer epoch's stayed"
    );
    assert!(
        newer_incoming.join("blob").exists(),
        "a newer epoch's incoming stays"
    );
    // The store verifies as it is.
    let v = b.env.tool(
        "verify",
        &["--lease", &url, "--store", shared.path().to_str().unwrap()],
    );
    v.expect_code(0);
}

//! A real three-member etcd cluster for the cluster-lease tests (issue 14): three `etcd`
//! processes (apt `etcd-server`) on loopback ports with data dirs in a temp dir, started,
//! killed and restarted by the test. Without `etcd` the tests skip by the one rule
//! ([`super::skip`]): a `SKIPPED:` line, a failure under `TENURE_REQUIRE_SERVERS=1`.
//!
//! Elections are tuned for tests (50 ms heartbeats, 500 ms election timeout), so that killing
//! the leader costs well under the lease TTLs the tests use.
//!
//! The machine these tests run on has two cores shared with compilers and other tests. Three
//! things keep the clusters' timing within the TTLs the tests use there, without loosening what
//! the tests assert:
//! - **One cluster at a time:** [`Cluster::start`] takes a lock of this test binary that the
//!   cluster holds until it is dropped, so the tests of a file run their clusters one after the
//!   other instead of a dozen etcd members (and their runners) fighting for two cores at once.
//! - **Data dirs on tmpfs** (`/dev/shm`, where it exists): a member fsyncs its WAL on every
//!   write, and on a disk shared with compilers an fsync can take seconds; the cluster lease
//!   is not what is tested by the disk under etcd. A member killed by the test is a process
//!   crash (its page cache survives), which is what the tests mean by it.
//! - **Generous TTLs** where a test asserts that a fault does *not* cost the owner its lease
//!   (each says so).

use std::fs::{self, File};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use tenure::cluster::etcd::Etcd;

/// One member.
struct Member {
    name: String,
    client: u16,
    peer: u16,
    data: PathBuf,
    log: PathBuf,
    child: Option<Child>,
}

/// A running cluster; every member is killed when it is dropped.
pub struct Cluster {
    _dir: tempfile::TempDir,
    members: Vec<Member>,
    token: String,
    /// Held while the cluster lives: one cluster of this test binary at a time. Declared last,
    /// so it is released after the members were killed (in `drop`) and their dirs removed.
    _one_at_a_time: MutexGuard<'static, ()>,
}

/// See the module docs: the clusters of one test binary run one at a time.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

/// A temp dir for the members' data: on tmpfs where there is one (see the module docs).
fn data_dir() -> tempfile::TempDir {
    let shm = Path::new("/dev/shm");
    if shm.is_dir()
        && let Ok(d) = tempfile::Builder::new()
            .prefix("tenure-etcd-")
            .tempdir_in(shm)
    {
        return d;
    }
    tempfile::tempdir().unwrap()
}

/// The `etcd` binary, if installed.
pub fn etcd_binary() -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|p| p.join("etcd"))
            .find(|p| p.is_file())
    })
}

/// Free loopback ports (bound, then released: the cluster binds them right after).
fn free_ports(n: usize) -> Vec<u16> {
    let ls: Vec<TcpListener> = (0..n)
        .map(|_| TcpListener::bind("127.0.0.1:0").unwrap())
        .collect();
    ls.iter().map(|l| l.local_addr().unwrap().port()).collect()
}

impl Cluster {
    /// Starts a three-member cluster and waits until it has a leader; `None` (after the skip
    /// notice) when etcd is not installed.
    pub fn start(test: &str) -> Option<Cluster> {
        let Some(bin) = etcd_binary() else {
            super::skip::skip(
                test,
                "etcd is not installed (apt-get install etcd-server etcd-client)",
            );
            return None;
        };
        // A test that failed while holding the lock poisoned it; the next one may still run.
        let one_at_a_time = ONE_AT_A_TIME
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let dir = data_dir();
        let ports = free_ports(6);
        let members: Vec<Member> = (0..3)
            .map(|i| Member {
                name: format!("m{i}"),
                client: ports[2 * i],
                peer: ports[2 * i + 1],
                data: dir.path().join(format!("m{i}.data")),
                log: dir.path().join(format!("m{i}.log")),
                child: None,
            })
            .collect();
        let token = format!(
            "tenure-{}-{}",
            std::process::id(),
            dir.path().file_name().unwrap().to_string_lossy()
        );
        let mut c = Cluster {
            _dir: dir,
            members,
            token,
            _one_at_a_time: one_at_a_time,
        };
        for i in 0..3 {
            c.spawn(&bin, i, "new");
        }
        c.wait_leader(Duration::from_secs(30));
        Some(c)
    }

    fn initial_cluster(&self) -> String {
        self.members
            .iter()
            .map(|m| format!("{}=http://127.0.0.1:{}", m.name, m.peer))
            .collect::<Vec<_>>()
            .join(",")
    }

    fn spawn(&mut self, bin: &Path, i: usize, state: &str) {
        let initial = self.initial_cluster();
        let token = self.token.clone();
        let m = &mut self.members[i];
        let log = File::options()
            .create(true)
            .append(true)
            .open(&m.log)
            .unwrap();
        let client = format!("http://127.0.0.1:{}", m.client);
        let peer = format!("http://127.0.0.1:{}", m.peer);
        let child = Command::new(bin)
            .args(["--name", &m.name, "--data-dir"])
            .arg(&m.data)
            .args(["--listen-client-urls", &client])
            .args(["--advertise-client-urls", &client])
            .args(["--listen-peer-urls", &peer])
            .args(["--initial-advertise-peer-urls", &peer])
            .args(["--initial-cluster", &initial])
            .args(["--initial-cluster-state", state])
            .args(["--initial-cluster-token", &token])
            .args(["--heartbeat-interval", "50", "--election-timeout", "500"])
            .args(["--logger", "zap", "--log-outputs", "stderr"])
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("start etcd");
        m.child = Some(child);
    }

    /// `host:port` of member `i`'s client port.
    pub fn endpoint(&self, i: usize) -> String {
        format!("127.0.0.1:{}", self.members[i].client)
    }

    /// Every member's client endpoint, comma-separated.
    pub fn endpoints(&self) -> String {
        (0..self.members.len())
            .map(|i| self.endpoint(i))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// The `--lease` URL of this cluster with `prefix`.
    pub fn url(&self, prefix: &str) -> String {
        format!("etcd://{}/{prefix}", self.endpoints())
    }

    /// A client of the whole cluster.
    pub fn client(&self) -> Etcd {
        Etcd::new(
            (0..self.members.len()).map(|i| self.endpoint(i)).collect(),
            Duration::from_secs(2),
        )
    }

    /// The index of the member that leads, as the running members agree.
    pub fn leader(&self) -> Option<usize> {
        let c = self.client();
        let mut ids = Vec::new();
        for i in 0..self.members.len() {
            if self.members[i].child.is_none() {
                ids.push(None);
                continue;
            }
            ids.push(c.member_id(&self.endpoint(i)).ok());
        }
        for i in 0..self.members.len() {
            if self.members[i].child.is_none() {
                continue;
            }
            if let Ok(l) = c.leader_seen_by(&self.endpoint(i))
                && l != 0
            {
                return ids.iter().position(|id| *id == Some(l));
            }
        }
        None
    }

    /// Waits until the running members have a leader that serves a linearizable read.
    pub fn wait_leader(&self, deadline: Duration) -> usize {
        let end = Instant::now() + deadline;
        loop {
            if let Some(l) = self.leader()
                && self.client().get(b"health-probe").is_ok()
            {
                return l;
            }
            if Instant::now() > end {
                panic!(
                    "the etcd cluster has no leader after {deadline:?}; logs:\n{}",
                    self.logs()
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// SIGKILLs member `i` and reaps it.
    pub fn kill(&mut self, i: usize) {
        if let Some(mut c) = self.members[i].child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Starts member `i` again on its data dir.
    pub fn restart(&mut self, i: usize) {
        assert!(self.members[i].child.is_none(), "member {i} runs");
        let bin = etcd_binary().expect("etcd was there at start");
        self.spawn(&bin, i, "existing");
    }

    /// Whether member `i` runs.
    pub fn running(&self, i: usize) -> bool {
        self.members[i].child.is_some()
    }

    /// The members' logs (for a failure message).
    pub fn logs(&self) -> String {
        let mut out = String::new();
        for m in &self.members {
            let text = fs::read_to_string(&m.log).unwrap_or_default();
            let tail: Vec<&str> = text.lines().rev().take(15).collect();
            out.push_str(&format!("--- {} ---\n", m.name));
            for l in tail.into_iter().rev() {
                out.push_str(l);
                out.push('\n');
            }
        }
        out
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for i in 0..self.members.len() {
            self.kill(i);
        }
    }
}

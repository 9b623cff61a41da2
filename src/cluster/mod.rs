//! The cluster lease (issue 14, feature `etcd`): the same lifecycle with the lease and CURRENT
//! on etcd, fenced by revision. spec/cluster.md is the specification; in short:
//!
//! - **Ownership** is the key `PREFIX/owner`, created under a granted etcd lease by a
//!   transaction that succeeds only if the key does not exist. Its create revision — the
//!   cluster-wide revision of that transaction, strictly increasing — is the **epoch**.
//! - **Waiters** put `PREFIX/waiters/<node>-<pid>` under their own lease (visible in `status`)
//!   and watch the owner key from the revision they read; a delete (a release, or the owner's
//!   lease expiring) sends them back to the transaction. The wait is bounded and cancellable.
//! - **Keep-alive** runs on a thread beside the driver. The lease counts as lost when the
//!   cluster says it is gone, or when no renewal was confirmed for a whole TTL counted from
//!   when the last confirmed renewal was *sent* (the cluster's own count starts later, so the
//!   owner gives up before the cluster can hand the lease to anyone else). The loss is the
//!   machine's `lease-lost` event.
//! - **CURRENT** is the key `PREFIX/current`, holding the bytes a local `CURRENT` file would
//!   hold, and moves only in a transaction that also requires `PREFIX/owner` to have this
//!   epoch's create revision ([`plan::move_current`]). A paused owner that resumes after
//!   losing its lease can write blobs and a manifest into the shared store, never move CURRENT.
//! - **Release** deletes the owner key if it is still this epoch's (the same compare) and
//!   revokes the lease.

pub mod etcd;
pub mod http;

use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::net::UnixStream;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::checkpoint::format::Current;
use crate::checkpoint::{CheckpointError, CurrentPointer};
use etcd::{Compare, Etcd, EtcdError, Op, WatchEvent};

/// The default TTL of a cluster lease (`--lease-ttl`).
pub const DEFAULT_TTL: Duration = Duration::from_secs(10);

/// Errors of the cluster lease.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ClusterError {
    /// The `--lease` URL is not `etcd://HOST:PORT[,HOST:PORT…]/PREFIX`.
    #[error(
        "{url:?} is not a cluster lease: {why}; write it as etcd://HOST:PORT[,HOST:PORT...]/PREFIX"
    )]
    BadUrl {
        /// What was given.
        url: String,
        /// What is wrong with it.
        why: String,
    },
    /// The TTL is out of range.
    #[error("--lease-ttl {ttl:?} is out of range: give whole seconds from 2 to 3600")]
    BadTtl {
        /// What was given.
        ttl: Duration,
    },
    /// The wait bound expired while another process owned the prefix.
    #[error("{url} is busy ({owner}); lock and state were preserved")]
    Busy {
        /// The lease URL.
        url: String,
        /// Who owns it.
        owner: String,
    },
    /// The caller's cancel descriptor became readable while waiting.
    #[error("waiting for {url} was cancelled; nothing was changed")]
    Cancelled {
        /// The lease URL.
        url: String,
    },
    /// The cluster could not be used.
    #[error("{url}: {source}")]
    Etcd {
        /// The lease URL.
        url: String,
        /// What failed.
        #[source]
        source: EtcdError,
    },
    /// The owner key holds something tenure did not write.
    #[error(
        "{url}: the key {key} holds {found:?}, not a tenure owner record; choose another PREFIX, or delete the key if nothing uses it"
    )]
    Foreign {
        /// The lease URL.
        url: String,
        /// The key.
        key: String,
        /// Its first bytes.
        found: String,
    },
}

impl ClusterError {
    /// Whether the error refuses state (as opposed to an unreachable cluster).
    pub fn is_refusal(&self) -> bool {
        matches!(
            self,
            ClusterError::Foreign { .. }
                | ClusterError::BadUrl { .. }
                | ClusterError::BadTtl { .. }
        )
    }
}

/// Where the cluster lease lives: `etcd://HOST:PORT[,HOST:PORT…]/PREFIX`, and its TTL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterSpec {
    /// The members' client endpoints.
    pub endpoints: Vec<String>,
    /// The key prefix (without a trailing `/`).
    pub prefix: String,
    /// The lease's TTL.
    pub ttl: Duration,
}

impl ClusterSpec {
    /// Parses and validates a `--lease` URL and `--lease-ttl`.
    pub fn parse(url: &str, ttl: Duration) -> Result<ClusterSpec, ClusterError> {
        let bad = |why: &str| ClusterError::BadUrl {
            url: url.to_string(),
            why: why.to_string(),
        };
        let rest = url
            .strip_prefix("etcd://")
            .ok_or_else(|| bad("it does not start with etcd://"))?;
        let (hosts, prefix) = rest
            .split_once('/')
            .ok_or_else(|| bad("it has no /PREFIX"))?;
        let prefix = prefix.trim_end_matches('/');
        if prefix.is_empty() {
            return Err(bad("the PREFIX is empty"));
        }
        if prefix.chars().any(|c| c.is_control() || c == ' ') {
            return Err(bad("the PREFIX holds spaces or control characters"));
        }
        let mut endpoints = Vec::new();
        for h in hosts.split(',') {
            let (host, port) = h
                .rsplit_once(':')
                .ok_or_else(|| bad(&format!("{h:?} has no :PORT")))?;
            if host.is_empty() || port.parse::<u16>().map_or(true, |p| p == 0) {
                return Err(bad(&format!("{h:?} is not HOST:PORT")));
            }
            endpoints.push(h.to_string());
        }
        if ttl.subsec_nanos() != 0 || !(2..=3600).contains(&ttl.as_secs()) {
            return Err(ClusterError::BadTtl { ttl });
        }
        Ok(ClusterSpec {
            endpoints,
            prefix: prefix.to_string(),
            ttl,
        })
    }

    /// The URL, as given (normalised).
    pub fn url(&self) -> String {
        format!("etcd://{}/{}", self.endpoints.join(","), self.prefix)
    }

    fn key(&self, name: &str) -> Vec<u8> {
        format!("{}/{name}", self.prefix).into_bytes()
    }

    /// `PREFIX/owner`.
    pub fn owner_key(&self) -> Vec<u8> {
        self.key("owner")
    }

    /// `PREFIX/current`.
    pub fn current_key(&self) -> Vec<u8> {
        self.key("current")
    }

    /// `PREFIX/waiters/`.
    pub fn waiters_prefix(&self) -> Vec<u8> {
        self.key("waiters/")
    }

    /// A client whose calls each wait at most a third of the TTL on one member (at least
    /// 200 ms), so a dead or partitioned member never holds a renewal for long.
    pub fn client(&self) -> Etcd {
        Etcd::new(
            self.endpoints.clone(),
            (self.ttl / 3).max(Duration::from_millis(200)),
        )
    }

    fn etcd_error(&self, source: EtcdError) -> ClusterError {
        ClusterError::Etcd {
            url: self.url(),
            source,
        }
    }
}

/// What the owner key and a waiter key hold: who, on which machine, with which local dir.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Holder {
    /// The machine's host name.
    pub node: String,
    /// The process.
    pub pid: u32,
    /// Its start time (field 22 of `/proc/PID/stat`).
    pub start: u64,
    /// The local state dir.
    pub dir: String,
    /// When it began to own or wait, milliseconds since the Unix epoch.
    pub since_ms: u64,
}

impl Holder {
    /// This process, for the local state dir `dir`.
    pub fn me(dir: &std::path::Path) -> Holder {
        let pid = std::process::id();
        Holder {
            node: std::fs::read_to_string("/proc/sys/kernel/hostname")
                .map(|h| h.trim().to_string())
                .unwrap_or_else(|_| "unknown".into()),
            pid,
            start: crate::lease::Identity::of_self()
                .map(|i| i.start_time)
                .unwrap_or(0),
            dir: dir.display().to_string(),
            since_ms: crate::lease::now_ms(),
        }
    }
}

impl std::fmt::Display for Holder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "pid {} on {} ({})", self.pid, self.node, self.dir)
    }
}

/// The cluster's view for `status`: the owner (with its epoch), the waiters and CURRENT.
#[derive(Debug, Clone, Serialize)]
pub struct ClusterStatus {
    /// The lease URL.
    pub url: String,
    /// The owner and its epoch, if the prefix is owned.
    pub owner: Option<(Holder, u64)>,
    /// Processes waiting for the prefix.
    pub waiters: Vec<Holder>,
    /// What CURRENT names (`<id> <sha256>`), if anything.
    pub current: Option<String>,
}

/// Reads the cluster's view of `spec`.
pub fn status(spec: &ClusterSpec) -> Result<ClusterStatus, ClusterError> {
    let c = spec.client();
    let (owner, _) = c.get(&spec.owner_key()).map_err(|e| spec.etcd_error(e))?;
    let owner = match owner {
        None => None,
        Some(kv) => Some((holder_of(spec, &kv)?, kv.create_revision as u64)),
    };
    let waiters = c
        .get_prefix(&spec.waiters_prefix())
        .map_err(|e| spec.etcd_error(e))?
        .iter()
        .filter_map(|kv| serde_json::from_slice(&kv.value).ok())
        .collect();
    let (cur, _) = c.get(&spec.current_key()).map_err(|e| spec.etcd_error(e))?;
    Ok(ClusterStatus {
        url: spec.url(),
        owner,
        waiters,
        current: cur.map(|kv| String::from_utf8_lossy(&kv.value).trim().to_string()),
    })
}

fn holder_of(spec: &ClusterSpec, kv: &etcd::Kv) -> Result<Holder, ClusterError> {
    serde_json::from_slice(&kv.value).map_err(|_| ClusterError::Foreign {
        url: spec.url(),
        key: String::from_utf8_lossy(&kv.key).into_owned(),
        found: String::from_utf8_lossy(&kv.value[..kv.value.len().min(40)]).into_owned(),
    })
}

/// A transaction of the cluster lease: the compares, the operations run when every compare
/// holds, and those run otherwise.
#[derive(Debug, Clone)]
pub struct Txn {
    /// What must hold.
    pub compare: Vec<Compare>,
    /// Run when every compare holds.
    pub success: Vec<Op>,
    /// Run otherwise.
    pub failure: Vec<Op>,
}

impl Txn {
    /// Sends the transaction to the cluster.
    pub fn run(&self, etcd: &Etcd) -> Result<etcd::TxnResult, EtcdError> {
        etcd.txn(&self.compare, &self.success, &self.failure)
    }
}

/// The cluster lease's transactions and how their answers are read, as pure functions: the
/// runner sends them to etcd, the cluster model (models/src/cluster.rs) to its etcd world, so
/// both run the same protocol.
pub mod plan {
    use super::{ClusterSpec, Compare, Op, Txn};
    use crate::cluster::etcd::{Kv, TxnResult};
    use crate::mutant;

    /// Ownership: create `PREFIX/owner` holding `holder` under `lease`, only if it does not
    /// exist; otherwise read who holds it.
    pub fn claim(spec: &ClusterSpec, holder: Vec<u8>, lease: i64) -> Txn {
        let owner = spec.owner_key();
        Txn {
            compare: vec![Compare::CreateRevision(owner.clone(), 0)],
            success: vec![Op::Put {
                key: owner.clone(),
                value: holder,
                lease,
            }],
            failure: vec![Op::Get(owner)],
        }
    }

    /// What the answer to [`claim`] means.
    #[derive(Debug, Clone, PartialEq, Eq)]
    pub enum Claim {
        /// Ours, with this epoch: the owner key's create revision.
        Owned {
            /// The fencing epoch.
            epoch: u64,
        },
        /// Another lease holds the key (this is its record).
        Held(Kv),
        /// The key was deleted between the compare and the read: try again.
        Vanished,
    }

    /// Reads the answer to [`claim`] sent with `lease`.
    pub fn claimed(r: &TxnResult, lease: i64) -> Claim {
        if r.succeeded {
            // The transaction wrote the key: its revision is the key's create revision.
            return Claim::Owned {
                epoch: r.revision as u64,
            };
        }
        match r.kvs.first() {
            None => Claim::Vanished,
            // An earlier attempt of ours succeeded but its answer was lost.
            Some(kv) if kv.lease == lease => Claim::Owned {
                epoch: kv.create_revision as u64,
            },
            Some(kv) => Claim::Held(kv.clone()),
        }
    }

    /// Moves CURRENT to `value`, only while `PREFIX/owner` has this epoch's create revision;
    /// otherwise reads the owner key (to say who holds it now).
    pub fn move_current(spec: &ClusterSpec, value: Vec<u8>, epoch: u64) -> Txn {
        let put = Op::Put {
            key: spec.current_key(),
            value,
            lease: 0,
        };
        // Mutant: CURRENT written with a plain put, without the fence.
        let compare = if mutant::on("cluster-current-plain-put") {
            Vec::new()
        } else {
            vec![Compare::CreateRevision(spec.owner_key(), epoch as i64)]
        };
        Txn {
            compare,
            success: vec![put],
            failure: vec![Op::Get(spec.owner_key())],
        }
    }

    /// Release: delete the owner key only if it is still this epoch's.
    pub fn release(spec: &ClusterSpec, epoch: u64) -> Txn {
        Txn {
            compare: vec![Compare::CreateRevision(spec.owner_key(), epoch as i64)],
            success: vec![Op::Delete(spec.owner_key())],
            failure: Vec::new(),
        }
    }
}

/// How long [`acquire`] may wait for a held prefix.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wait {
    /// Try once.
    Try,
    /// At most this long.
    For(Duration),
    /// Until the prefix is ours or the wait is cancelled.
    Forever,
}

/// An owned cluster lease.
#[derive(Debug)]
pub struct ClusterLease {
    spec: ClusterSpec,
    etcd: Etcd,
    lease: i64,
    epoch: u64,
    /// The lease is surely valid until then (a TTL from the last confirmed renewal's sending).
    valid_until: Instant,
    keeper: Option<Keeper>,
    /// Set by the keep-alive thread when the lease is lost.
    lost: Arc<LostFlag>,
}

#[derive(Debug, Default)]
struct LostFlag {
    lost: AtomicBool,
    why: std::sync::Mutex<Option<String>>,
}

#[derive(Debug)]
struct Keeper {
    stop: Arc<AtomicBool>,
    handle: JoinHandle<()>,
}

/// Whether `fd` is readable now (the cancel descriptor; never read).
fn readable(fd: BorrowedFd<'_>) -> bool {
    let mut fds = [rustix::event::PollFd::new(
        &fd,
        rustix::event::PollFlags::IN,
    )];
    matches!(
        rustix::event::poll(&mut fds, Some(&rustix::time::Timespec::default())),
        Ok(n) if n > 0
    )
}

/// What an acquisition tells its caller while it waits, as it happens.
#[derive(Debug)]
pub enum Progress<'a> {
    /// Another process owns the prefix: this one waits (told once per acquisition).
    Waiting {
        /// The owner's record.
        owner: &'a Holder,
        /// Its epoch.
        epoch: u64,
    },
    /// No member could serve a call (all unreachable, none answering in time, or none with a
    /// leader): the acquisition retries until the cluster answers, the wait bound expires or
    /// the wait is cancelled (told once per outage).
    Unavailable {
        /// The last failure.
        error: &'a EtcdError,
    },
    /// The cluster answered again after an outage.
    Reachable {
        /// How long the outage lasted.
        outage: Duration,
    },
}

/// Takes the cluster lease of `spec` for `me`: grants an etcd lease, then creates the owner
/// key under it if it is absent; while another owner holds it, waits as a visible waiter,
/// watching the key, within `wait`, cancelled by `cancel`, telling `progress` that it waits and
/// when the cluster cannot be reached. A cluster that cannot serve (a member restarting, an
/// election, an overloaded machine) is waited through like an owner is, within the same bound:
/// `Wait::Try` gives up on the first unavailable call, `Wait::For` at its bound. Every call has
/// a deadline. On any failure the granted lease is revoked, so nothing of this process remains.
pub fn acquire(
    spec: &ClusterSpec,
    me: &Holder,
    wait: Wait,
    cancel: Option<BorrowedFd<'_>>,
    progress: &mut dyn FnMut(Progress<'_>),
) -> Result<ClusterLease, ClusterError> {
    let etcd = spec.client();
    let started = Instant::now();
    let mut a = Acquisition {
        spec,
        etcd: &etcd,
        me,
        owner_value: serde_json::to_vec(me).expect("a holder serialises"),
        deadline: match wait {
            Wait::Try => Some(started),
            Wait::For(d) => Some(started + d),
            Wait::Forever => None,
        },
        cancel,
        lease: None,
        next_renewal: started,
        waiting: false,
        owner: None,
        outage: None,
    };
    let result = a.run(progress);
    let lease = a.lease.take();
    match (result, lease) {
        (Ok(epoch), Some(lease)) => Ok(ClusterLease {
            spec: spec.clone(),
            etcd,
            lease: lease.id,
            epoch,
            valid_until: lease.valid_until,
            keeper: None,
            lost: Arc::new(LostFlag::default()),
        }),
        (Ok(_), None) => unreachable!("an ownership is claimed under a granted lease"),
        (Err(e), lease) => {
            if let Some(l) = lease {
                let _ = etcd.revoke(l.id);
            }
            Err(e)
        }
    }
}

/// An etcd lease of this process and how long it is surely valid: a TTL from when its last
/// confirmed grant or renewal was *sent* (the cluster counts from later).
struct Granted {
    id: i64,
    valid_until: Instant,
}

/// The state of one [`acquire`].
struct Acquisition<'a, 'f> {
    spec: &'a ClusterSpec,
    etcd: &'a Etcd,
    me: &'a Holder,
    /// What the owner key will hold.
    owner_value: Vec<u8>,
    /// The wait bound (`None`: forever).
    deadline: Option<Instant>,
    cancel: Option<BorrowedFd<'f>>,
    /// This process's etcd lease; `None` before the grant, and after it expired while waiting
    /// (a waiter paused past its TTL, or cut off from the cluster for that long).
    lease: Option<Granted>,
    /// When the lease is renewed next (a third of the TTL after the last renewal).
    next_renewal: Instant,
    /// The waiter key is in place, under the current lease.
    waiting: bool,
    /// The owner last seen (told to the caller once, and named by a busy answer).
    owner: Option<Holder>,
    /// When the current outage began, if the last call found no member that could serve.
    outage: Option<Instant>,
}

/// Why one pass of an acquisition ended without the lease.
enum Stop {
    /// A call found no member that could serve.
    Unavailable(EtcdError),
    /// The cluster no longer knows our etcd lease: go round again with a fresh one.
    LeaseGone,
    /// The acquisition is over.
    Failed(ClusterError),
}

impl From<ClusterError> for Stop {
    fn from(e: ClusterError) -> Stop {
        Stop::Failed(e)
    }
}

impl Acquisition<'_, '_> {
    /// A call's failure: an outage, our own lease gone, or an answer that ends the
    /// acquisition.
    fn failed(&mut self, e: EtcdError) -> Stop {
        if etcd::unavailable(&e) {
            Stop::Unavailable(e)
        } else if etcd::lease_not_found(&e) {
            // Our lease expired between its renewal and this call (the process was paused in
            // between): a waiter owns nothing, so the next pass takes a fresh one.
            self.lease = None;
            Stop::LeaseGone
        } else {
            Stop::Failed(self.spec.etcd_error(e))
        }
    }

    fn run(&mut self, progress: &mut dyn FnMut(Progress<'_>)) -> Result<u64, ClusterError> {
        // The pause between attempts while the cluster cannot serve: from a tenth of a second,
        // doubling to a second, so a long outage is not made worse by a crowd of waiters.
        let mut pause = OUTAGE_PAUSE;
        loop {
            if self.cancel.is_some_and(readable) {
                return Err(ClusterError::Cancelled {
                    url: self.spec.url(),
                });
            }
            let e = match self.pass(progress) {
                Ok(Some(epoch)) => {
                    if self.waiting {
                        // Best effort: the key goes with our lease anyway once we release.
                        let _ =
                            self.etcd
                                .txn(&[], &[Op::Delete(waiter_key(self.spec, self.me))], &[]);
                    }
                    return Ok(epoch);
                }
                Ok(None) => {
                    pause = OUTAGE_PAUSE;
                    continue;
                }
                Err(Stop::Failed(e)) => return Err(e),
                Err(Stop::LeaseGone) => continue,
                Err(Stop::Unavailable(e)) => e,
            };
            if self.deadline.is_some_and(|d| Instant::now() >= d) {
                return Err(self.spec.etcd_error(e));
            }
            if self.outage.is_none() {
                self.outage = Some(Instant::now());
                progress(Progress::Unavailable { error: &e });
            }
            pause_for_outage(self.cancel, self.spec, pause)?;
            pause = (pause * 2).min(Duration::from_secs(1));
        }
    }

    /// Notes that a call was answered, ending an outage.
    fn reachable(&mut self, progress: &mut dyn FnMut(Progress<'_>)) {
        if let Some(since) = self.outage.take() {
            progress(Progress::Reachable {
                outage: since.elapsed(),
            });
        }
    }

    /// One pass: (re)grant or renew the lease as due, claim, and if the prefix is held, wait
    /// for the owner key's deletion (or the next renewal, whichever is first). `Some(epoch)`
    /// when it is ours; `None` to go round again.
    fn pass(&mut self, progress: &mut dyn FnMut(Progress<'_>)) -> Result<Option<u64>, Stop> {
        let spec = self.spec;
        let period = spec.ttl / 3;
        match &mut self.lease {
            None => {
                let sent = Instant::now();
                let (id, ttl) = self
                    .etcd
                    .grant(spec.ttl.as_secs())
                    .map_err(|e| self.failed(e))?;
                self.lease = Some(Granted {
                    id,
                    valid_until: sent + Duration::from_secs(ttl.max(0) as u64),
                });
                self.next_renewal = sent + period;
                self.waiting = false;
            }
            Some(lease) if Instant::now() >= self.next_renewal => {
                let sent = Instant::now();
                let id = lease.id;
                match self.etcd.keep_alive(id) {
                    Ok(Some(ttl)) => {
                        lease.valid_until = sent + Duration::from_secs(ttl.max(0) as u64);
                        self.next_renewal = sent + period;
                    }
                    // Our own lease expired while we waited (the process was paused, or the
                    // cluster was out of reach for a TTL): the waiter entry went with it. A
                    // waiter owns nothing, so it takes a fresh lease and waits on.
                    Ok(None) => {
                        self.lease = None;
                        self.reachable(progress);
                        return Ok(None);
                    }
                    // `next_renewal` stays due: the next pass renews first.
                    Err(e) => return Err(self.failed(e)),
                }
            }
            Some(_) => {}
        }
        let lease = self.lease.as_ref().map_or(0, |l| l.id);
        let r = plan::claim(spec, self.owner_value.clone(), lease)
            .run(self.etcd)
            .map_err(|e| self.failed(e))?;
        self.reachable(progress);
        let kv = match plan::claimed(&r, lease) {
            plan::Claim::Owned { epoch } => return Ok(Some(epoch)),
            // The key was deleted between the compare and the read: try again at once.
            plan::Claim::Vanished => return Ok(None),
            plan::Claim::Held(kv) => kv,
        };
        let holder = holder_of(spec, &kv)?;
        let first = self.owner.is_none();
        self.owner = Some(holder);
        // A try (`-n`) or an expired bound ends here, before it is told that it waits.
        self.check_deadline()?;
        if first && let Some(owner) = &self.owner {
            progress(Progress::Waiting {
                owner,
                epoch: kv.create_revision as u64,
            });
        }
        if !self.waiting {
            self.etcd
                .put(
                    &waiter_key(spec, self.me),
                    &serde_json::to_vec(self.me).expect("a holder serialises"),
                    lease,
                )
                .map_err(|e| self.failed(e))?;
            self.waiting = true;
        }
        // Watch the owner key from just after what we read: its deletion (release or expiry)
        // sends us back to the claim. The watch is given up at the next renewal, so the claim
        // is tried again at least every third of the TTL even if the member serving the watch
        // fell behind the cluster without closing the stream.
        let mut watch = self
            .etcd
            .watch(&spec.owner_key(), r.revision + 1)
            .map_err(|e| self.failed(e))?;
        loop {
            if self.cancel.is_some_and(readable) {
                return Err(Stop::Failed(ClusterError::Cancelled { url: spec.url() }));
            }
            self.check_deadline()?;
            let now = Instant::now();
            if now >= self.next_renewal {
                return Ok(None);
            }
            let slice = (now + Duration::from_millis(100)).min(self.next_renewal);
            match watch.next(slice) {
                Ok(evs) if evs.iter().any(|e| matches!(e, WatchEvent::Delete { .. })) => {
                    return Ok(None);
                }
                Ok(_) => {}
                // A broken watch (the member went away): claim again, through another member.
                Err(_) => return Ok(None),
            }
        }
    }

    /// A busy answer once the wait bound expired.
    fn check_deadline(&self) -> Result<(), ClusterError> {
        if self.deadline.is_some_and(|d| Instant::now() >= d) {
            return Err(ClusterError::Busy {
                url: self.spec.url(),
                owner: self
                    .owner
                    .as_ref()
                    .map_or_else(|| "owner unknown".into(), |h| format!("owner {h}")),
            });
        }
        Ok(())
    }
}

/// The first pause between attempts while the cluster cannot serve.
const OUTAGE_PAUSE: Duration = Duration::from_millis(100);

/// Waits `pause` while no etcd member can serve, returning early (as a cancellation) when
/// `cancel` becomes readable.
fn pause_for_outage(
    cancel: Option<BorrowedFd<'_>>,
    spec: &ClusterSpec,
    pause: Duration,
) -> Result<(), ClusterError> {
    match cancel {
        Some(fd) => {
            let mut fds = [rustix::event::PollFd::new(
                &fd,
                rustix::event::PollFlags::IN,
            )];
            let timeout = rustix::time::Timespec {
                tv_sec: pause.as_secs() as _,
                tv_nsec: pause.subsec_nanos() as _,
            };
            // An interrupted poll just ends the pause early.
            let _ = rustix::event::poll(&mut fds, Some(&timeout));
            if readable(fd) {
                return Err(ClusterError::Cancelled { url: spec.url() });
            }
        }
        None => std::thread::sleep(pause),
    }
    Ok(())
}

fn waiter_key(spec: &ClusterSpec, me: &Holder) -> Vec<u8> {
    let mut k = spec.waiters_prefix();
    k.extend_from_slice(format!("{}-{}-{}", me.node, me.pid, me.start).as_bytes());
    k
}

impl ClusterLease {
    /// The fencing epoch: the owner key's create revision.
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// The lease's spec.
    pub fn spec(&self) -> &ClusterSpec {
        &self.spec
    }

    /// Starts renewing the lease on a thread beside the driver; when it is lost, one byte is
    /// written to `wake` (the driver polls the other end) and [`ClusterLease::lost`] says why.
    pub fn keep_alive(&mut self, wake: UnixStream) {
        let stop = Arc::new(AtomicBool::new(false));
        let (spec, lease, lost) = (self.spec.clone(), self.lease, self.lost.clone());
        let valid_until = self.valid_until;
        let stop2 = stop.clone();
        let handle = std::thread::Builder::new()
            .name("tenure-keepalive".into())
            .spawn(move || keep(&spec, lease, valid_until, &stop2, &lost, wake))
            .expect("a thread can be started");
        self.keeper = Some(Keeper { stop, handle });
    }

    /// Why the lease was lost, once it was.
    pub fn lost(&self) -> Option<String> {
        if self.lost.lost.load(Ordering::SeqCst) {
            Some(
                self.lost
                    .why
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .clone()
                    .unwrap_or_default(),
            )
        } else {
            None
        }
    }

    fn stop_keeper(&mut self) {
        if let Some(k) = self.keeper.take() {
            k.stop.store(true, Ordering::SeqCst);
            let _ = k.handle.join();
        }
    }

    /// Lets go: deletes the owner key if it is still this epoch's, and revokes the lease.
    /// `Ok(true)` when the key was still ours; `Ok(false)` when the lease had already been
    /// lost (the key expired, or another owner's).
    pub fn release(mut self) -> Result<bool, ClusterError> {
        self.stop_keeper();
        let r = plan::release(&self.spec, self.epoch)
            .run(&self.etcd)
            .map_err(|e| self.spec.etcd_error(e))?;
        let _ = self.etcd.revoke(self.lease);
        Ok(r.succeeded && self.lost().is_none())
    }
}

impl Drop for ClusterLease {
    fn drop(&mut self) {
        self.stop_keeper();
    }
}

/// The keep-alive loop: renew every third of the TTL; the lease is lost when the cluster says
/// it is gone, or when no renewal was confirmed within a TTL of sending the last confirmed one.
fn keep(
    ttl_spec: &ClusterSpec,
    lease: i64,
    valid_until: Instant,
    stop: &AtomicBool,
    lost: &LostFlag,
    wake: UnixStream,
) {
    use std::io::Write as _;
    let etcd = ttl_spec.client();
    let ttl = ttl_spec.ttl;
    let period = ttl / 3;
    // Counted from the last confirmed grant or renewal before ownership (not from now: the
    // acquisition may have taken a while since).
    let mut valid_until = valid_until;
    let lose = |why: String| {
        *lost
            .why
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(why);
        lost.lost.store(true, Ordering::SeqCst);
        let _ = (&wake).write_all(b"!");
    };
    let mut next = Instant::now() + period;
    // When renewals began to fail (told once per outage).
    let mut outage: Option<Instant> = None;
    while !stop.load(Ordering::SeqCst) {
        let now = Instant::now();
        // Checked first: a process paused past its TTL finds it out here on resuming.
        if now >= valid_until {
            lose(format!(
                "no renewal was confirmed within its TTL of {}s",
                ttl.as_secs()
            ));
            return;
        }
        if now < next {
            std::thread::sleep((next - now).min(Duration::from_millis(50)));
            continue;
        }
        let sent = Instant::now();
        // A renewal that has not come through by the lease's end is no use: the call gives up
        // then (whatever members are left to try), and the check above calls the lease lost.
        match etcd.keep_alive_by(lease, Some(valid_until)) {
            Ok(Some(granted)) => {
                valid_until = sent + Duration::from_secs(granted as u64);
                next = sent + period;
                if let Some(since) = outage.take() {
                    log::info!(
                        "{}: the cluster renews the lease again after {} ms",
                        ttl_spec.url(),
                        since.elapsed().as_millis()
                    );
                }
            }
            Ok(None) => {
                lose("the cluster says it expired".into());
                return;
            }
            // No member answered in time: try again soon; the TTL decides.
            Err(e) => {
                if outage.is_none() {
                    outage = Some(sent);
                    log::warn!(
                        "{}: cluster unavailable, retrying the renewal ({} ms of the lease left): {e}",
                        ttl_spec.url(),
                        valid_until
                            .saturating_duration_since(Instant::now())
                            .as_millis()
                    );
                }
                next = Instant::now() + Duration::from_millis(100).min(period);
            }
        }
    }
}

/// Reads CURRENT on the cluster without owning it (for `status` and `verify`).
pub fn read_current(spec: &ClusterSpec) -> Result<Option<Current>, CheckpointError> {
    let (kv, _) =
        spec.client()
            .get(&spec.current_key())
            .map_err(|e| CheckpointError::PointerFailed {
                pointer: format!("{}/current", spec.url()),
                reason: e.to_string(),
            })?;
    parse_current(spec, kv)
}

fn parse_current(
    spec: &ClusterSpec,
    kv: Option<etcd::Kv>,
) -> Result<Option<Current>, CheckpointError> {
    let Some(kv) = kv else { return Ok(None) };
    Current::parse(&kv.value)
        .map(Some)
        .map_err(|reason| CheckpointError::CurrentMalformed {
            path: format!("{}/current", spec.url()).into(),
            reason,
        })
}

/// A read-only CURRENT on the cluster (for recovery, `status` and `verify`): it never moves.
#[derive(Debug, Clone)]
pub struct ReadPointer {
    /// The cluster.
    pub spec: ClusterSpec,
}

impl CurrentPointer for ReadPointer {
    fn read(&self) -> Result<Option<Current>, CheckpointError> {
        read_current(&self.spec)
    }

    fn replace(&self, _new: &Current, epoch: u64) -> Result<(), CheckpointError> {
        Err(CheckpointError::Fenced {
            pointer: format!("{}/current", self.spec.url()),
            epoch,
            reason: "a reader owns nothing".into(),
        })
    }

    fn describe(&self) -> String {
        format!("{}/current", self.spec.url())
    }
}

/// CURRENT on the cluster: `PREFIX/current`, moved only in a transaction that requires
/// `PREFIX/owner` to have this epoch's create revision.
impl CurrentPointer for ClusterLease {
    fn read(&self) -> Result<Option<Current>, CheckpointError> {
        read_current(&self.spec)
    }

    fn replace(&self, new: &Current, epoch: u64) -> Result<(), CheckpointError> {
        let spec = &self.spec;
        let r = plan::move_current(spec, new.to_bytes(), epoch)
            .run(&self.etcd)
            .map_err(|e| CheckpointError::PointerFailed {
                pointer: self.describe(),
                reason: e.to_string(),
            })?;
        if r.succeeded {
            return Ok(());
        }
        let reason = match r.kvs.first() {
            None => "the owner key is gone: the lease expired or was released".to_string(),
            Some(kv) => format!(
                "the owner key is now epoch {}'s ({})",
                kv.create_revision,
                serde_json::from_slice::<Holder>(&kv.value)
                    .map_or_else(|_| "unknown".to_string(), |h| h.to_string())
            ),
        };
        Err(CheckpointError::Fenced {
            pointer: self.describe(),
            epoch,
            reason,
        })
    }

    fn describe(&self) -> String {
        format!("{}/current", self.spec.url())
    }
}

/// The wake-up descriptor's read end, for the driver's poll.
pub fn wake_pair() -> std::io::Result<(UnixStream, UnixStream)> {
    let (a, b) = UnixStream::pair()?;
    a.set_nonblocking(true)?;
    Ok((a, b))
}

/// Drains a wake-up descriptor (so a level-triggered poll does not fire again).
pub fn drain_wake(fd: &UnixStream) {
    use std::io::Read as _;
    let mut buf = [0u8; 16];
    while matches!((&*fd).read(&mut buf), Ok(n) if n > 0) {}
    let _ = fd.as_fd();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_and_ttls_are_validated() {
        let s = ClusterSpec::parse("etcd://a:1,b:2/svc/x/", DEFAULT_TTL).unwrap();
        assert_eq!(s.endpoints, ["a:1", "b:2"]);
        assert_eq!(s.prefix, "svc/x");
        assert_eq!(s.owner_key(), b"svc/x/owner");
        assert_eq!(s.url(), "etcd://a:1,b:2/svc/x");
        for bad in [
            "http://a:1/p",
            "etcd://a:1",
            "etcd://a:1/",
            "etcd://a/p",
            "etcd://a:0/p",
            "etcd://:1/p",
            "etcd://a:1/p q",
        ] {
            let e = ClusterSpec::parse(bad, DEFAULT_TTL).unwrap_err();
            assert!(e.to_string().contains("etcd://HOST:PORT"), "{bad}: {e}");
        }
        for ttl in [
            Duration::from_secs(1),
            Duration::from_millis(2500),
            Duration::from_secs(3601),
        ] {
            assert!(matches!(
                ClusterSpec::parse("etcd://a:1/p", ttl),
                Err(ClusterError::BadTtl { .. })
            ));
        }
    }
}

//! The cluster world (issue 14): two runners on two machines contend for one prefix of an etcd
//! cluster, each with its own local dir, and publish into CURRENT on the cluster.
//!
//! Each runner is the real driver core ([`crate::driver::Driver`], the real machine inside),
//! and every transaction it sends is built by the real plans of `tenure::cluster::plan` —
//! [`plan::claim`] and [`plan::claimed`] for ownership, [`plan::move_current`] for the fenced
//! CURRENT, [`plan::release`] — and its epoch by the real [`tenure::lease::fenced_epoch`]. The
//! world is an abstract etcd that evaluates those transactions as etcd does (revisions, create
//! revisions, leases whose keys vanish when they expire) and the faults of a cluster:
//!
//! - a **TTL expiry** of any live lease at any moment (the worst clock: the cluster may expire
//!   a lease its owner still believes in);
//! - an owner **paused** (SIGSTOP, a GC pause) and resumed later, past its TTL;
//! - a **partition** between an owner and the cluster (its calls fail; a transaction may also
//!   take effect with its answer lost), healed later;
//! - a **keep-alive loss** (renewals unanswered for a TTL): the owner's `lease-lost` event,
//!   which also follows, unbudgeted, once the cluster expired the lease.
//!
//! Properties: epochs strictly increase across ownerships; no epoch moves CURRENT after a
//! higher epoch exists; a checkpoint published by epoch e is never replaced by one from an
//! epoch below e; the obligation of the local model — a lost lease stops the workload (SIGKILL
//! in the step the loss is fed) and publishes nothing. The src mutants of [`SRC_MUTANTS`]
//! (CURRENT with a plain put, the epoch from a local counter, a publish after the lease was
//! lost) are each killed by one of them (models/tests/cluster.rs).

use std::collections::BTreeMap;
use std::time::Duration;

use stateright::{Model, Property};
use tenure::cluster::ClusterSpec;
use tenure::cluster::etcd::{Compare, Kv, Op, TxnResult};
use tenure::cluster::{Txn, plan};
use tenure::machine::{
    Action, ChildStatus, Config, Event, Fault, ReadyMode, Reason, Refusal, Signal, Timer,
};

use crate::driver::{ChildView, Driver, Request};
use crate::run::Describe;

/// Epochs strictly increase across ownerships (the owner key's create revision, through
/// `fenced_epoch`).
pub const EPOCHS_INCREASE: &str = "epochs strictly increase across ownerships";
/// No epoch moves CURRENT once a higher epoch was granted.
pub const NO_LOWER_AFTER_HIGHER: &str = "no lower epoch moves CURRENT after a higher exists";
/// A checkpoint published by epoch e is never replaced by one from an epoch below e.
pub const NEVER_REPLACED_BY_LOWER: &str = "a checkpoint is never replaced by a lower epoch's";
/// The obligation: once `lease-lost` is fed, a running workload is killed in that step and
/// nothing more is published.
pub const LOST_STOPS: &str = "a lost lease stops the workload and publishes nothing";
/// Every event a runner feeds is one its core admits.
pub const LEGAL: &str = "every fed event is legal";
/// A run that lost its lease (and was not released) ends `refused/lease-lost`.
pub const LOST_ENDS_REFUSED: &str = "a lost lease ends the run refused/lease-lost";

/// The bugs planted in src/ that this model kills: name, place, and the property that fails.
pub const SRC_MUTANTS: &[(&str, &str, &str)] = &[
    (
        "cluster-current-plain-put",
        "src/cluster/mod.rs `plan::move_current`",
        NO_LOWER_AFTER_HIGHER,
    ),
    (
        "cluster-epoch-local-counter",
        "src/lease/mod.rs `fenced_epoch`",
        EPOCHS_INCREASE,
    ),
    (
        "publish-after-lease-lost",
        "src/machine/rules.rs `drain_stopping`",
        LOST_STOPS,
    ),
];

const V_EPOCH: u8 = 1;
const V_LOWER: u8 = 2;
const V_REPLACED: u8 = 4;
const V_LOST: u8 = 8;
const V_ILLEGAL: u8 = 16;
const V_LOST_END: u8 = 32;

/// The cluster world's configuration.
#[derive(Debug, Clone)]
pub struct ClusterModel {
    /// Faults the world may inject (expiries, pauses, partitions, keep-alive losses).
    pub faults: u8,
    /// SIGTERMs the world may send (one runner stops, the other takes over).
    pub terms: u8,
    /// The prefix the runners contend for.
    spec: ClusterSpec,
}

impl ClusterModel {
    /// The configuration CI checks.
    pub fn ci() -> ClusterModel {
        ClusterModel {
            faults: 2,
            terms: 1,
            spec: ClusterSpec::parse("etcd://etcd:2379/svc", Duration::from_secs(10))
                .expect("a valid lease URL"),
        }
    }
}

/// A key as the abstract etcd keeps it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Entry {
    value: Vec<u8>,
    create: i64,
    modified: i64,
    lease: i64,
}

/// The abstract etcd: one revision counter, the keys, the live leases.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Etcd {
    revision: i64,
    keys: BTreeMap<Vec<u8>, Entry>,
    /// Live lease ids (granted, neither revoked nor expired).
    leases: Vec<i64>,
    next_lease: i64,
}

impl Etcd {
    fn new() -> Etcd {
        // A fresh cluster is at revision 1.
        Etcd {
            revision: 1,
            keys: BTreeMap::new(),
            leases: Vec::new(),
            next_lease: 1,
        }
    }

    fn kv(&self, key: &[u8]) -> Option<Kv> {
        self.keys.get(key).map(|e| Kv {
            key: key.to_vec(),
            value: e.value.clone(),
            create_revision: e.create,
            mod_revision: e.modified,
            lease: e.lease,
        })
    }

    /// Evaluates a transaction as etcd does: every compare on the current store, then one
    /// branch; all its writes share one new revision.
    fn txn(&mut self, t: &Txn) -> TxnResult {
        let holds = t.compare.iter().all(|c| match c {
            Compare::CreateRevision(k, r) => self.keys.get(k).map_or(0, |e| e.create) == *r,
        });
        let ops = if holds { &t.success } else { &t.failure };
        let writes = ops.iter().any(|o| match o {
            Op::Put { .. } => true,
            Op::Delete(k) => self.keys.contains_key(k),
            Op::Get(_) => false,
        });
        if writes {
            self.revision += 1;
        }
        let rev = self.revision;
        let mut kvs = Vec::new();
        for o in ops {
            match o {
                Op::Put { key, value, lease } => {
                    let create = self.keys.get(key).map_or(rev, |e| e.create);
                    self.keys.insert(
                        key.clone(),
                        Entry {
                            value: value.clone(),
                            create,
                            modified: rev,
                            lease: *lease,
                        },
                    );
                }
                Op::Delete(k) => {
                    self.keys.remove(k);
                }
                Op::Get(k) => kvs.extend(self.kv(k)),
            }
        }
        TxnResult {
            succeeded: holds,
            revision: rev,
            kvs,
        }
    }

    fn grant(&mut self) -> i64 {
        let id = self.next_lease;
        self.next_lease += 1;
        self.leases.push(id);
        id
    }

    /// Revokes or expires a lease: its keys are deleted in one revision.
    fn end_lease(&mut self, id: i64) {
        self.leases.retain(|l| *l != id);
        let before = self.keys.len();
        self.keys.retain(|_, e| e.lease != id);
        if self.keys.len() != before {
            self.revision += 1;
        }
    }

    fn live(&self, id: i64) -> bool {
        self.leases.contains(&id)
    }
}

/// The workload of a runner.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Work {
    /// Not spawned.
    None,
    /// Running; `killed` once SIGKILL was sent.
    Running {
        /// SIGKILL was sent.
        killed: bool,
    },
    /// Exited and reaped.
    Gone,
}

/// One runner on its machine.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Node {
    /// Its driver core.
    pub drv: Driver,
    /// The etcd lease it holds (0: none).
    pub lease: i64,
    /// The epoch of its ownership (0: none yet).
    pub epoch: u64,
    /// The epoch its local dir records.
    pub recorded: u64,
    /// Stopped (SIGSTOP): takes no step.
    pub paused: bool,
    /// Cut off from the cluster: its calls fail.
    pub partitioned: bool,
    /// Its workload.
    pub work: Work,
    /// `lease-lost` was fed.
    pub lost: bool,
    /// A SIGKILL is owed to its workload (the loss was fed while it ran).
    pub owe_kill: bool,
    /// It waits for the owner key to go (it reported `lease-busy`).
    pub waiting: bool,
}

/// The state of the cluster world.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ClusterState {
    /// The cluster.
    pub etcd: Etcd,
    /// The two runners.
    pub nodes: [Node; 2],
    /// Faults still to inject.
    pub faults_left: u8,
    /// SIGTERMs still to send.
    pub terms_left: u8,
    /// The highest epoch granted so far.
    pub max_epoch: u64,
    /// The epoch of each CURRENT move, in order (at most a few).
    pub published: Vec<u8>,
    /// A publish was refused by the fence (for a `sometimes`).
    pub fenced: bool,
    /// Violations (bit set).
    pub violations: u8,
}

/// A step of the cluster world.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ClusterAction {
    /// The runner executes the next action of its step.
    Exec(u8),
    /// The runner sends the claim transaction.
    Claim(u8),
    /// A waiting runner gives up (its wait bound expired).
    WaitExpired(u8),
    /// The runner's recovery completes.
    Recover(u8),
    /// The runner spawns its workload.
    Spawn(u8),
    /// The runner sends the CURRENT transaction; `lost_answer`: partitioned after the cluster
    /// applied it.
    Publish(u8, bool),
    /// The runner's call fails (it is partitioned).
    CallFails(u8),
    /// The runner sends the release transaction.
    Release(u8),
    /// The workload exits (status 0, or SIGKILL's 9).
    WorkExits(u8),
    /// SIGTERM to the runner.
    Term(u8),
    /// An armed timer fires.
    Fire(u8, Timer),
    /// The cluster expires the runner's lease.
    Expire(u8),
    /// The runner's keep-alive gives up (`lease-lost`); `fault`: while the cluster still
    /// kept the lease.
    KeepAliveLost(u8, bool),
    /// SIGSTOP / SIGCONT.
    Pause(u8),
    /// See `Pause`.
    Resume(u8),
    /// The runner is cut off from the cluster / reconnected.
    Partition(u8),
    /// See `Partition`.
    Heal(u8),
}

impl ClusterState {
    fn feed(&mut self, n: usize, ev: Event) {
        let node = &mut self.nodes[n];
        if let Event::LeaseLost = ev {
            node.lost = true;
            node.owe_kill = matches!(node.work, Work::Running { killed: false });
        }
        if node.drv.feed(ev).is_err() {
            self.violations |= V_ILLEGAL;
        }
    }

    fn exec(&mut self, n: usize) {
        let node = &mut self.nodes[n];
        let Some(a) = node.drv.pop() else { return };
        match a {
            Action::Kill => {
                if let Work::Running { .. } = node.work {
                    node.work = Work::Running { killed: true };
                }
                node.owe_kill = false;
            }
            // The obligation: nothing is published once the lease is lost.
            Action::Publish if node.lost => self.violations |= V_LOST,
            Action::Exit(o) => {
                if node.lost && o.refusal != Some(Refusal::LeaseLost) {
                    self.violations |= V_LOST_END;
                }
            }
            Action::AcquireLease
            | Action::AbandonAcquire
            | Action::Recover
            | Action::SpawnChild
            | Action::SetPhase(_)
            | Action::ArmTimer(..)
            | Action::DisarmTimer(_)
            | Action::NotifyReady
            | Action::NotifyStopping
            | Action::BeginDrain
            | Action::Forward(..)
            | Action::Relay(..)
            | Action::ExtendTimer(..)
            | Action::Publish
            | Action::ReleaseLease
            | Action::Note(_) => {}
        }
        // A step that ends with the SIGKILL still owed broke the obligation.
        let node = &self.nodes[n];
        if node.owe_kill && node.drv.peek().is_none() {
            self.violations |= V_LOST;
        }
    }

    fn can_step(&self, n: usize) -> bool {
        let node = &self.nodes[n];
        !node.paused && !node.drv.exited()
    }
}

impl Model for ClusterModel {
    type State = ClusterState;
    type Action = ClusterAction;

    fn init_states(&self) -> Vec<ClusterState> {
        let node = || {
            let mut drv = Driver::new(Config::child(ReadyMode::Start));
            let _ = drv.feed(Event::Start).expect("a fresh core starts");
            Node {
                drv,
                lease: 0,
                epoch: 0,
                recorded: 0,
                paused: false,
                partitioned: false,
                work: Work::None,
                lost: false,
                owe_kill: false,
                waiting: false,
            }
        };
        vec![ClusterState {
            etcd: Etcd::new(),
            nodes: [node(), node()],
            faults_left: self.faults,
            terms_left: self.terms,
            max_epoch: 0,
            published: Vec::new(),
            fenced: false,
            violations: 0,
        }]
    }

    fn actions(&self, s: &ClusterState, out: &mut Vec<ClusterAction>) {
        for (i, node) in s.nodes.iter().enumerate() {
            let n = i as u8;
            // The cluster and the operator act whatever the runner does.
            if node.lease != 0 && s.etcd.live(node.lease) {
                // A lease nobody renews any more (its runner ended, or gave it up as lost)
                // expires within its TTL; any other expiry is a fault.
                let unrenewed = node.drv.exited() || node.lost;
                if unrenewed || s.faults_left > 0 {
                    out.push(ClusterAction::Expire(n));
                }
            }
            if !node.drv.exited() {
                if node.paused {
                    out.push(ClusterAction::Resume(n));
                } else if s.faults_left > 0 && node.drv.holds_lease() {
                    out.push(ClusterAction::Pause(n));
                }
                if node.partitioned {
                    out.push(ClusterAction::Heal(n));
                } else if s.faults_left > 0 && node.drv.holds_lease() {
                    out.push(ClusterAction::Partition(n));
                }
            }
            if !s.can_step(i) {
                continue;
            }
            if node.drv.peek().is_some() {
                out.push(ClusterAction::Exec(n));
                continue;
            }
            if !node.drv.between_steps() {
                continue;
            }
            match node.drv.request() {
                Some(Request::Acquire { busy }) => {
                    if node.partitioned {
                        out.push(ClusterAction::CallFails(n));
                    } else if !node.waiting || !s.etcd.keys.contains_key(&self.spec.owner_key()) {
                        // A waiter's watch wakes it when the owner key is deleted.
                        out.push(ClusterAction::Claim(n));
                    }
                    if busy {
                        out.push(ClusterAction::WaitExpired(n));
                    }
                }
                Some(Request::Recover) => out.push(ClusterAction::Recover(n)),
                Some(Request::Spawn) => out.push(ClusterAction::Spawn(n)),
                Some(Request::Publish) => {
                    if node.partitioned {
                        out.push(ClusterAction::CallFails(n));
                        out.push(ClusterAction::Publish(n, true));
                    } else {
                        out.push(ClusterAction::Publish(n, false));
                    }
                }
                Some(Request::Release) => out.push(ClusterAction::Release(n)),
                None => {}
            }
            if node.drv.child() == ChildView::Running
                && matches!(node.work, Work::Running { .. })
                && node.drv.request() != Some(Request::Spawn)
            {
                out.push(ClusterAction::WorkExits(n));
            }
            if s.terms_left > 0 && node.drv.admits(Event::Stop(Signal::Term)).is_ok() {
                out.push(ClusterAction::Term(n));
            }
            for t in node.drv.armed_timers() {
                out.push(ClusterAction::Fire(n, t));
            }
            if node.drv.admits(Event::LeaseLost).is_ok() {
                let expired = node.lease != 0 && !s.etcd.live(node.lease);
                if expired {
                    out.push(ClusterAction::KeepAliveLost(n, false));
                } else if s.faults_left > 0 {
                    out.push(ClusterAction::KeepAliveLost(n, true));
                }
            }
        }
    }

    fn next_state(&self, s: &ClusterState, action: ClusterAction) -> Option<ClusterState> {
        let mut s = s.clone();
        match action {
            ClusterAction::Exec(n) => s.exec(n as usize),
            ClusterAction::Claim(n) => {
                let n = n as usize;
                let lease = s.etcd.grant();
                let r = s.etcd.txn(&plan::claim(&self.spec, vec![n as u8], lease));
                match plan::claimed(&r, lease) {
                    plan::Claim::Owned { epoch } => {
                        let node = &mut s.nodes[n];
                        match tenure::lease::fenced_epoch(node.recorded + 1, epoch) {
                            Ok(e) => {
                                node.recorded = e;
                                node.epoch = e;
                                node.lease = lease;
                                node.waiting = false;
                                if e <= s.max_epoch {
                                    s.violations |= V_EPOCH;
                                }
                                s.max_epoch = s.max_epoch.max(e);
                                s.feed(n, Event::LeaseGranted { epoch: e });
                            }
                            Err(_) => {
                                s.etcd.end_lease(lease);
                                s.feed(n, Event::LeaseFailed(Fault::State));
                            }
                        }
                    }
                    plan::Claim::Held(_) | plan::Claim::Vanished => {
                        // The waiter keeps nothing of this attempt but its wish.
                        s.etcd.end_lease(lease);
                        if !s.nodes[n].waiting {
                            s.nodes[n].waiting = true;
                            s.feed(n, Event::LeaseBusy);
                        }
                    }
                }
            }
            ClusterAction::WaitExpired(n) => {
                s.nodes[n as usize].waiting = false;
                s.feed(n as usize, Event::WaitExpired);
            }
            ClusterAction::Recover(n) => s.feed(n as usize, Event::RecoveryDone),
            ClusterAction::Spawn(n) => {
                s.nodes[n as usize].work = Work::Running { killed: false };
                s.feed(n as usize, Event::ChildSpawned);
            }
            ClusterAction::CallFails(n) => {
                let n = n as usize;
                let ev = match s.nodes[n].drv.request() {
                    Some(Request::Acquire { .. }) => Event::LeaseFailed(Fault::Io),
                    Some(Request::Publish) => Event::CheckpointFailed,
                    _ => return None,
                };
                s.feed(n, ev);
            }
            ClusterAction::Publish(n, lost_answer) => {
                let n = n as usize;
                let epoch = s.nodes[n].epoch;
                let r = s.etcd.txn(&plan::move_current(
                    &self.spec,
                    vec![epoch as u8, n as u8],
                    epoch,
                ));
                if r.succeeded {
                    if epoch < s.max_epoch {
                        s.violations |= V_LOWER;
                    }
                    if s.published
                        .last()
                        .is_some_and(|last| u64::from(*last) > epoch)
                    {
                        s.violations |= V_REPLACED;
                    }
                    s.published.push(epoch as u8);
                } else {
                    s.fenced = true;
                }
                s.feed(
                    n,
                    if r.succeeded && !lost_answer {
                        Event::CheckpointPublished
                    } else {
                        Event::CheckpointFailed
                    },
                );
            }
            ClusterAction::Release(n) => {
                let n = n as usize;
                let (epoch, lease) = (s.nodes[n].epoch, s.nodes[n].lease);
                if s.nodes[n].partitioned {
                    // The runner warns; the lease expires by itself within its TTL.
                    s.feed(n, Event::LeaseReleased);
                    return Some(s);
                }
                let r = s.etcd.txn(&plan::release(&self.spec, epoch));
                s.etcd.end_lease(lease);
                s.nodes[n].lease = 0;
                // The runner: the key no longer this epoch's at the release is a lost lease.
                let ev = if r.succeeded && !s.nodes[n].lost {
                    Event::LeaseReleased
                } else {
                    Event::LeaseLost
                };
                s.feed(n, ev);
            }
            ClusterAction::WorkExits(n) => {
                let n = n as usize;
                let status = match s.nodes[n].work {
                    Work::Running { killed: true } => ChildStatus::Signaled(9),
                    Work::Running { killed: false } | Work::None | Work::Gone => {
                        ChildStatus::Exited(0)
                    }
                };
                s.nodes[n].work = Work::Gone;
                s.feed(n, Event::ChildExited(status));
            }
            ClusterAction::Term(n) => {
                s.terms_left -= 1;
                s.feed(n as usize, Event::Stop(Signal::Term));
            }
            ClusterAction::Fire(n, t) => s.feed(n as usize, Event::TimerExpired(t)),
            ClusterAction::Expire(n) => {
                let node = &s.nodes[n as usize];
                if !(node.drv.exited() || node.lost) {
                    s.faults_left -= 1;
                }
                let lease = s.nodes[n as usize].lease;
                s.etcd.end_lease(lease);
            }
            ClusterAction::KeepAliveLost(n, fault) => {
                if fault {
                    s.faults_left -= 1;
                }
                s.feed(n as usize, Event::LeaseLost);
            }
            ClusterAction::Pause(n) => {
                s.faults_left -= 1;
                s.nodes[n as usize].paused = true;
            }
            ClusterAction::Resume(n) => s.nodes[n as usize].paused = false,
            ClusterAction::Partition(n) => {
                s.faults_left -= 1;
                s.nodes[n as usize].partitioned = true;
            }
            ClusterAction::Heal(n) => s.nodes[n as usize].partitioned = false,
        }
        Some(s)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::always(EPOCHS_INCREASE, |_, s: &ClusterState| {
                s.violations & V_EPOCH == 0
            }),
            Property::always(NO_LOWER_AFTER_HIGHER, |_, s: &ClusterState| {
                s.violations & V_LOWER == 0
            }),
            Property::always(NEVER_REPLACED_BY_LOWER, |_, s: &ClusterState| {
                s.violations & V_REPLACED == 0
            }),
            Property::always(LOST_STOPS, |_, s: &ClusterState| s.violations & V_LOST == 0),
            Property::always(LEGAL, |_, s: &ClusterState| s.violations & V_ILLEGAL == 0),
            Property::always(LOST_ENDS_REFUSED, |_, s: &ClusterState| {
                s.violations & V_LOST_END == 0
            }),
            Property::sometimes(
                "a paused owner's publish is refused by the fence",
                |_, s: &ClusterState| s.fenced && s.nodes.iter().any(|n| n.lost),
            ),
            Property::sometimes(
                "the second owner publishes after the first",
                |_, s: &ClusterState| s.published.len() >= 2 && s.published[0] < s.published[1],
            ),
            Property::sometimes("a lost lease ends a run refused", |_, s: &ClusterState| {
                s.nodes.iter().any(|n| {
                    n.drv.machine().phase().outcome().is_some_and(|o| {
                        o.reason == Reason::Refused && o.refusal == Some(Refusal::LeaseLost)
                    })
                })
            }),
        ]
    }
}

impl Describe for ClusterModel {
    fn describe(&self, path: &[(ClusterState, Option<ClusterAction>)]) -> Vec<String> {
        path.iter()
            .filter_map(|(s, a)| {
                a.map(|a| {
                    let phases: Vec<String> = s
                        .nodes
                        .iter()
                        .map(|n| n.drv.machine().phase().label().to_string())
                        .collect();
                    format!("[{}] {a:?}", phases.join(" | "))
                })
            })
            .collect()
    }
}

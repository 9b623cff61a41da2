//! The operator commands around a run: `status`, `verify`, `init` and `stop`. They read the
//! state dir without owning it (except `init`, which takes the lease for an instant), and never
//! change a refused dir.

use crate::checkpoint::{
    CheckpointError, CheckpointId, CheckpointStore, CheckpointSummary, Published, StoreOptions,
};
use crate::lease::{
    self, AcquireOptions, Identity, LeaseStatus, Liveness, OwnerState, SignalOutcome, WaitBound,
};
use crate::machine::{EXIT_DID_NOT_STOP, EXIT_IO, EXIT_REFUSED, PhaseKind};
use crate::privfs::StateDir;
use serde::Serialize;
use std::path::Path;
use std::time::{Duration, Instant};

/// How often `stop` looks at the lock while waiting for the owner to release.
const STOP_POLL: Duration = Duration::from_millis(10);

/// The JSON shape of `tenure status --json` (documented in spec/runner.md).
#[derive(Debug, Clone, Serialize)]
#[non_exhaustive]
pub struct Status {
    /// The state dir (canonical path).
    pub dir: String,
    /// `cold`, `acquiring`, `recovering`, `ready`, `draining`, `released` or `stale`.
    pub phase: String,
    /// The persisted epoch (0 when never owned).
    pub epoch: u64,
    /// Whether some process holds the lease's kernel lock now.
    pub lock_held: bool,
    /// The recorded owner, if any.
    pub owner: Option<OwnerView>,
    /// Processes waiting for the lease.
    pub waiters: Vec<ProcessView>,
    /// Registry entries (the owner and the processes it runs).
    pub registry: Vec<RegistryView>,
    /// How the recorded owner contains its workload, and what of it still runs.
    pub containment: ContainmentView,
    /// The current checkpoint.
    pub checkpoint: CheckpointView,
    /// Outputs of failed publishes kept under `checkpoints/failed/`, oldest first (card P1).
    pub failed_publishes: Vec<FailedView>,
}

/// The output of a failed publish, kept (card P1).
#[derive(Debug, Clone, Serialize)]
#[non_exhaustive]
pub struct FailedView {
    /// The epoch of the owner whose publish failed.
    pub epoch: u64,
    /// Where its output is kept.
    pub path: String,
}

/// The containment of the recorded owner's workload as `status` shows it (spec/runner.md,
/// "Containment").
#[derive(Debug, Clone, Serialize)]
#[non_exhaustive]
pub struct ContainmentView {
    /// `cgroup`, `lock-fd` (no cgroup: the workload keeps the lock descriptor), or null when
    /// the owner record names no workload.
    pub mechanism: Option<String>,
    /// The recorded cgroup.
    pub cgroup: Option<String>,
    /// Processes of that workload that still run: the cgroup's members, or the processes that
    /// hold the lock through the descriptor they inherited.
    pub processes: Vec<u32>,
}

fn containment_view(dir: &StateDir, owner: Option<&lease::OwnerRecord>) -> ContainmentView {
    let none = ContainmentView {
        mechanism: None,
        cgroup: None,
        processes: Vec::new(),
    };
    let Some(o) = owner else { return none };
    match &o.containment {
        None => none,
        Some(lease::Containment::Cgroup(rec)) => ContainmentView {
            mechanism: Some("cgroup".into()),
            cgroup: Some(rec.path.display().to_string()),
            processes: lease::cgroup::recorded_members(rec).unwrap_or_default(),
        },
        Some(lease::Containment::LockFd) => {
            let lock = dir.path().join(lease::CONTROL_DIR).join(lease::LOCK_FILE);
            ContainmentView {
                mechanism: Some("lock-fd".into()),
                cgroup: None,
                processes: crate::driver::tree::inherited_lock_holders(&lock),
            }
        }
    }
}

/// A process as `status` shows it.
#[derive(Debug, Clone, Serialize)]
#[non_exhaustive]
pub struct ProcessView {
    /// Its pid.
    pub pid: u32,
    /// Its start time (clock ticks after boot, field 22 of /proc/PID/stat).
    pub start_time: u64,
    /// Its executable.
    pub exe: String,
    /// `live`, `dead` or `recycled`.
    pub liveness: Liveness,
    /// Since when (unix milliseconds).
    pub since_ms: u64,
}

/// The owner as `status` shows it.
#[derive(Debug, Clone, Serialize)]
#[non_exhaustive]
pub struct OwnerView {
    /// The process.
    #[serde(flatten)]
    pub process: ProcessView,
    /// The ownership's epoch.
    pub epoch: u64,
    /// The phase it last recorded.
    pub phase: PhaseKind,
}

/// A registry entry as `status` shows it.
#[derive(Debug, Clone, Serialize)]
#[non_exhaustive]
pub struct RegistryView {
    /// `leases` or `instances`.
    pub kind: String,
    /// The entry name.
    pub name: String,
    /// The epoch that wrote it.
    pub epoch: Option<u64>,
    /// The registered pid.
    pub pid: Option<u32>,
}

/// The checkpoint as `status` shows it.
#[derive(Debug, Clone, Serialize)]
#[non_exhaustive]
pub struct CheckpointView {
    /// `none`, `valid` or `invalid`.
    pub state: String,
    /// Its id.
    pub id: Option<u64>,
    /// The epoch that published it.
    pub epoch: Option<u64>,
    /// Number of files.
    pub files: Option<u64>,
    /// Total bytes.
    pub bytes: Option<u64>,
    /// Why it is invalid.
    pub error: Option<String>,
}

fn process_view(id: &Identity, since: u64) -> ProcessView {
    ProcessView {
        pid: id.pid,
        start_time: id.start_time,
        exe: id.exe.display().to_string(),
        liveness: id.liveness(),
        since_ms: since,
    }
}

/// The phase word `status` prints for a lease state.
pub fn phase_word(st: &LeaseStatus) -> String {
    match st.state() {
        OwnerState::Cold => "cold".into(),
        OwnerState::Acquiring => "acquiring".into(),
        OwnerState::Owned(p) => p.name().into(),
        OwnerState::Released => "released".into(),
        OwnerState::Stale => "stale".into(),
    }
}

fn checkpoint_view(r: Result<Option<CheckpointSummary>, CheckpointError>) -> CheckpointView {
    match r {
        Ok(None) => CheckpointView {
            state: "none".into(),
            id: None,
            epoch: None,
            files: None,
            bytes: None,
            error: None,
        },
        Ok(Some(c)) => CheckpointView {
            state: "valid".into(),
            id: Some(c.id.get()),
            epoch: Some(c.epoch),
            files: Some(c.files),
            bytes: Some(c.bytes),
            error: None,
        },
        Err(e) => CheckpointView {
            state: "invalid".into(),
            id: None,
            epoch: None,
            files: None,
            bytes: None,
            error: Some(e.to_string()),
        },
    }
}

/// Collects the status of `dir` (read-only).
pub fn collect(dir: &StateDir) -> Result<Status, lease::LeaseError> {
    let st = lease::status(dir)?;
    let (checkpoint, failed_publishes) = match CheckpointStore::open(dir, StoreOptions::default()) {
        Err(e) => (checkpoint_view(Err(e)), Vec::new()),
        Ok(store) => (
            checkpoint_view(store.load_summary()),
            store
                .failed_outputs()
                .unwrap_or_default()
                .into_iter()
                .map(|(epoch, path)| FailedView {
                    epoch,
                    path: path.display().to_string(),
                })
                .collect(),
        ),
    };
    let containment = containment_view(dir, st.owner.as_ref());
    // The lock held through a crashed owner's lock descriptor by what its workload left running
    // (no cgroup): nobody is acquiring, the recorded owner is gone (card P5).
    let phase = match st.state() {
        OwnerState::Acquiring
            if containment.mechanism.as_deref() == Some("lock-fd")
                && !containment.processes.is_empty()
                && st.owner_liveness != Some(Liveness::Live) =>
        {
            "stale".into()
        }
        _ => phase_word(&st),
    };
    Ok(Status {
        dir: dir.path().display().to_string(),
        phase,
        epoch: st.epoch,
        lock_held: st.held,
        owner: st.owner.as_ref().map(|o| OwnerView {
            process: process_view(&o.identity, o.acquired_at),
            epoch: o.epoch,
            phase: o.phase,
        }),
        waiters: st
            .waiters
            .iter()
            .filter_map(|w| w.record.as_ref())
            .map(|w| process_view(&w.identity, w.since))
            .collect(),
        registry: st
            .registry
            .iter()
            .map(|r| RegistryView {
                kind: r.kind.to_string(),
                name: r.entry.clone(),
                epoch: r.record.as_ref().map(|x| x.epoch),
                pid: r.record.as_ref().map(|x| x.identity.pid),
            })
            .collect(),
        containment,
        checkpoint,
        failed_publishes,
    })
}

fn open_existing(dir: &Path) -> Result<StateDir, u8> {
    StateDir::open(dir, false).map_err(|e| {
        log::error!("{e}");
        EXIT_REFUSED
    })
}

/// `status`'s exit code when a process holds the lease (LSB: the service is running).
pub const STATUS_OWNED: u8 = 0;
/// `status`'s exit code when nothing holds the lease, or the dir does not exist (LSB: the
/// service is not running).
pub const STATUS_NOT_RUNNING: u8 = 3;
/// `status`'s exit code when the dir or one of its records is refused, so whether anything
/// runs is unknown (LSB: status unknown). An invalid registration fails closed (card H8).
pub const STATUS_UNKNOWN: u8 = 4;

/// `tenure status`: prints the phase, epoch, owner, waiters and checkpoint. Exit codes follow
/// LSB: [`STATUS_OWNED`], [`STATUS_NOT_RUNNING`], [`STATUS_UNKNOWN`].
pub fn status(dir: &Path, json: bool) -> u8 {
    // With `--json` every answer is JSON: when there is no status to show, an `error` object
    // (`{"dir", "error": {"code", "message"}}`), so a script that parses stdout learns why
    // instead of finding nothing.
    let failed = |code: u8, message: String| {
        if code == STATUS_UNKNOWN {
            log::error!("{message}");
        } else if !json {
            println!("{message}");
        }
        if json {
            let v = serde_json::json!({
                "dir": dir.display().to_string(),
                "error": {"code": code, "message": message},
            });
            println!("{}", serde_json::to_string_pretty(&v).unwrap_or_default());
        }
        code
    };
    let d = match StateDir::open(dir, false) {
        Ok(d) => d,
        Err(e) if e.is_not_found() => {
            return failed(
                STATUS_NOT_RUNNING,
                format!("{} does not exist: nothing runs there", dir.display()),
            );
        }
        Err(e) => return failed(STATUS_UNKNOWN, e.to_string()),
    };
    // A dir the runner refuses as foreign (derived state without an identity marker, a marker
    // of another path: a copied or moved dir, card L8) has no status of its own: the records it
    // holds speak for another dir (card P4). The check reads only.
    if let Err(e) = lease::check(&d) {
        return failed(STATUS_UNKNOWN, e.to_string());
    }
    let s = match collect(&d) {
        Ok(s) => s,
        Err(e) => return failed(STATUS_UNKNOWN, e.to_string()),
    };
    let code = if s.lock_held {
        STATUS_OWNED
    } else {
        STATUS_NOT_RUNNING
    };
    if json {
        println!("{}", serde_json::to_string_pretty(&s).unwrap_or_default());
        return code;
    }
    println!("dir:        {}", s.dir);
    println!("phase:      {}", s.phase);
    println!("epoch:      {}", s.epoch);
    match &s.owner {
        Some(o) => println!(
            "owner:      pid {} ({}), epoch {}, phase {}, since {}",
            o.process.pid,
            liveness_word(o.process.liveness),
            o.epoch,
            o.phase,
            lease::format_unix_ms(o.process.since_ms)
        ),
        None => println!("owner:      none"),
    }
    match (&s.containment.mechanism, &s.containment.cgroup) {
        (Some(_), Some(cg)) => println!(
            "workload:   cgroup {cg}, {} process(es)",
            s.containment.processes.len()
        ),
        (Some(_), None) => println!(
            "workload:   no cgroup; {} process(es) besides the owner hold the lock",
            s.containment.processes.len()
        ),
        (None, _) => {}
    }
    let owner_gone = s
        .owner
        .as_ref()
        .is_some_and(|o| o.process.liveness != Liveness::Live);
    if owner_gone && !s.containment.processes.is_empty() {
        let then = match s.containment.cgroup {
            Some(_) => {
                "the next owner ends them before it starts its own workload; `tenure stop` ends them now"
            }
            None => "the dir stays locked until they exit; `tenure stop` ends them",
        };
        println!(
            "leftovers:  pids {:?} of the recorded owner's workload still run; {then}",
            s.containment.processes
        );
    }
    if s.waiters.is_empty() {
        println!("waiters:    none");
    }
    for w in &s.waiters {
        println!(
            "waiter:     pid {} ({}), since {}",
            w.pid,
            liveness_word(w.liveness),
            lease::format_unix_ms(w.since_ms)
        );
    }
    match s.checkpoint.state.as_str() {
        "valid" => println!(
            "checkpoint: {} (epoch {}, {} files, {} bytes)",
            s.checkpoint.id.unwrap_or(0),
            s.checkpoint.epoch.unwrap_or(0),
            s.checkpoint.files.unwrap_or(0),
            s.checkpoint.bytes.unwrap_or(0)
        ),
        "none" => println!("checkpoint: none"),
        _ => println!(
            "checkpoint: invalid: {}",
            s.checkpoint.error.as_deref().unwrap_or("")
        ),
    }
    for f in &s.failed_publishes {
        println!(
            "failed:     the publish of epoch {} failed; its output is kept in {}",
            f.epoch, f.path
        );
    }
    code
}

/// `tenure status --lease etcd://…` (issue 14): the cluster's owner (node, pid, epoch), its
/// waiters and CURRENT, beside this machine's local view of its state dir. Exit codes follow
/// LSB as for `status`: [`STATUS_OWNED`] when the prefix has an owner anywhere in the cluster,
/// [`STATUS_NOT_RUNNING`] when it has none, [`STATUS_UNKNOWN`] when the cluster cannot be read
/// or the local dir is refused.
#[cfg(feature = "etcd")]
pub fn cluster_status(dir: &Path, spec: &crate::cluster::ClusterSpec, json: bool) -> u8 {
    let cluster = match crate::cluster::status(spec) {
        Ok(c) => c,
        Err(e) => {
            log::error!("{e}");
            return STATUS_UNKNOWN;
        }
    };
    let local = match StateDir::open(dir, false).map(|d| collect(&d)) {
        Ok(Ok(s)) => Some(s),
        // A machine that never ran on this dir has no local view yet.
        Err(crate::privfs::FsError::NotFound { .. }) => None,
        Ok(Err(e)) => {
            log::error!("{e}");
            return STATUS_UNKNOWN;
        }
        Err(e) => {
            log::error!("{e}");
            return STATUS_UNKNOWN;
        }
    };
    // LSB, as `status`: the prefix is owned (somewhere in the cluster), or not.
    let code = if cluster.owner.is_some() {
        STATUS_OWNED
    } else {
        STATUS_NOT_RUNNING
    };
    let owner = cluster.owner.as_ref().map(|(h, epoch)| {
        serde_json::json!({"node": h.node, "pid": h.pid, "dir": h.dir, "epoch": epoch,
                           "since_ms": h.since_ms})
    });
    let waiters: Vec<serde_json::Value> = cluster
        .waiters
        .iter()
        .map(|w| serde_json::json!({"node": w.node, "pid": w.pid, "dir": w.dir, "since_ms": w.since_ms}))
        .collect();
    if json {
        let mut v = match &local {
            Some(s) => serde_json::to_value(s).unwrap_or_default(),
            None => serde_json::json!({"dir": dir.display().to_string()}),
        };
        v["cluster"] = serde_json::json!({
            "lease": cluster.url, "owner": owner, "waiters": waiters, "current": cluster.current,
        });
        println!("{}", serde_json::to_string_pretty(&v).unwrap_or_default());
        return code;
    }
    println!("lease:      {}", cluster.url);
    match &cluster.owner {
        Some((h, e)) => println!(
            "owner:      pid {} on {} ({}), epoch {e}, since {}",
            h.pid,
            h.node,
            h.dir,
            lease::format_unix_ms(h.since_ms)
        ),
        None => println!("owner:      none"),
    }
    for w in &cluster.waiters {
        println!(
            "waiter:     pid {} on {} ({}), since {}",
            w.pid,
            w.node,
            w.dir,
            lease::format_unix_ms(w.since_ms)
        );
    }
    println!(
        "current:    {}",
        cluster.current.as_deref().unwrap_or("none")
    );
    match &local {
        Some(s) => println!(
            "local:      {} phase {}, epoch {}{}",
            s.dir,
            s.phase,
            s.epoch,
            s.owner
                .as_ref()
                .map_or_else(String::new, |o| format!(", owner pid {}", o.process.pid))
        ),
        None => println!("local:      {} (never used)", dir.display()),
    }
    code
}

/// `tenure verify --lease etcd://… --store DIR` (issue 14): the checkpoint CURRENT on the
/// cluster names, verified in the shared store. Never changes anything.
#[cfg(feature = "etcd")]
pub fn cluster_verify(spec: &crate::cluster::ClusterSpec, store: &Path) -> u8 {
    let d = match open_existing(store) {
        Ok(d) => d,
        Err(code) => return code,
    };
    let pointer = crate::cluster::ReadPointer { spec: spec.clone() };
    let fail = |e: crate::checkpoint::CheckpointError| {
        log::error!("{e}");
        if e.is_corrupt_state() {
            EXIT_REFUSED
        } else {
            EXIT_IO
        }
    };
    let s = match CheckpointStore::open(&d, StoreOptions::default()) {
        Ok(s) => s.with_pointer(&pointer),
        Err(e) => return fail(e),
    };
    match s.load_summary() {
        Ok(Some(c)) => {
            println!(
                "checkpoint {} is valid: {} files, {} bytes, published at epoch {}",
                c.id.get(),
                c.files,
                c.bytes,
                c.epoch
            );
            0
        }
        Ok(None) => {
            println!("no checkpoint on {}", spec.url());
            0
        }
        Err(e) => fail(e),
    }
}

fn liveness_word(l: Liveness) -> &'static str {
    match l {
        Liveness::Live => "live",
        Liveness::Dead => "dead",
        Liveness::Recycled => "pid recycled",
    }
}

/// `tenure verify`: 0 when the current checkpoint verifies (or there is none), 65 naming the bad
/// file otherwise (74 for an I/O error). Never changes anything.
pub fn verify(dir: &Path) -> u8 {
    let d = match open_existing(dir) {
        Ok(d) => d,
        Err(code) => return code,
    };
    let store = match CheckpointStore::open(&d, StoreOptions::default()) {
        Ok(s) => s,
        Err(e) => {
            log::error!("{e}");
            return if e.is_corrupt_state() {
                EXIT_REFUSED
            } else {
                EXIT_IO
            };
        }
    };
    let report = match store.report() {
        Ok(r) => r,
        Err(e) => {
            log::error!("{e}");
            return if e.is_corrupt_state() {
                EXIT_REFUSED
            } else {
                EXIT_IO
            };
        }
    };
    match report.current {
        Ok(Some(c)) => {
            println!(
                "checkpoint {} is valid: {} files, {} bytes, published at epoch {}",
                c.id.get(),
                c.files,
                c.bytes,
                c.epoch
            );
            0
        }
        Ok(None) => {
            println!("no checkpoint in {}", d.path().display());
            0
        }
        Err(e) => {
            log::error!("{e}");
            if let Some(older) = report.newest_valid_older {
                log::error!(
                    "the newest older checkpoint that verifies is {} (epoch {}); nothing was changed",
                    older.id.get(),
                    older.epoch
                );
            }
            if e.is_corrupt_state() {
                EXIT_REFUSED
            } else {
                EXIT_IO
            }
        }
    }
}

/// `tenure init`: creates the dir and its identity marker (taking the lease for an instant), or
/// with `adopt` explicitly adopts a non-empty or moved dir — the only way past the L8 refusals.
pub fn init(dir: &Path, adopt: bool) -> u8 {
    let d = match StateDir::open(dir, true) {
        Ok(d) => d,
        Err(e) => {
            log::error!("{e}");
            return EXIT_REFUSED;
        }
    };
    if adopt {
        return match lease::adopt(&d) {
            Ok(lease::Adoption::Adopted(m)) => {
                println!("adopted {} (root id {})", d.path().display(), m.root_id);
                0
            }
            Ok(lease::Adoption::Unchanged(m)) => {
                println!(
                    "{} needs no adoption: its identity marker already names this path (root id {}); nothing was changed",
                    d.path().display(),
                    m.root_id
                );
                0
            }
            Err(e) => {
                log::error!("{e}");
                EXIT_REFUSED
            }
        };
    }
    let opts = AcquireOptions {
        wait: WaitBound::Try,
        cancel: None,
        phase: PhaseKind::Recovering,
        fence: None,
    };
    match lease::acquire(&d, &opts, &mut |_| {}) {
        Ok(l) => {
            let epoch = l.epoch();
            if let Err(e) = l.release() {
                log::error!("{e}");
                return EXIT_IO;
            }
            println!("initialised {} (epoch {epoch})", d.path().display());
            0
        }
        Err(lease::LeaseError::Busy { .. }) => {
            println!("{} is initialised and owned", d.path().display());
            0
        }
        Err(e) => {
            log::error!("{e}");
            EXIT_REFUSED
        }
    }
}

/// `stop` found the lease held but no record of its holder within the grace: the owner is
/// still starting (between taking the lock and writing its record). Nothing was signalled; run
/// `stop` again (card P5). The same code as `busy`: try again later.
pub const EXIT_STOP_STARTING: u8 = crate::machine::EXIT_BUSY;
/// The lease is free, but not by an orderly release: the owner had to be SIGKILLed after the
/// grace (mid-drain, so its checkpoint may not have been published), or it ended by itself
/// without releasing. The same code as a child killed after the grace.
pub const EXIT_STOP_KILLED: u8 = crate::machine::EXIT_KILLED;

/// Whether a record's phase is one of an owner that holds the lease (recovering, ready,
/// draining).
fn owning(phase: PhaseKind) -> bool {
    match phase {
        PhaseKind::Recovering | PhaseKind::Ready | PhaseKind::Draining => true,
        PhaseKind::Cold | PhaseKind::Released | PhaseKind::Cancelled | PhaseKind::Refused => false,
    }
}

/// Whether `o` can be the record of the process holding the lock right now: an owning phase,
/// written for this dir (card P4), naming a live process.
fn names_the_holder(st: &LeaseStatus, o: &lease::OwnerRecord) -> bool {
    let ours = st
        .identity
        .as_ref()
        .is_some_and(|m| o.root_id == Some(m.root_id));
    owning(o.phase) && ours && st.owner_liveness == Some(Liveness::Live)
}

/// Whether `o` is the record of a crashed owner (written for this dir, an owning phase, its
/// process gone) whose workload kept the lock descriptor (no cgroup): whoever holds the lock
/// through an inherited descriptor is then a leftover of that workload (card T2).
fn crashed_without_cgroup(st: &LeaseStatus, o: &lease::OwnerRecord) -> bool {
    crashed(st, o) && o.containment == Some(lease::Containment::LockFd)
}

/// Whether `o` is the record of a crashed owner: written for this dir, an owning phase, its
/// process gone. The dir's marker must name this very path: a copy that was not adopted
/// (`cp -a`) holds the original's marker and records, and never acts on the original's
/// processes (card P4).
fn crashed(st: &LeaseStatus, o: &lease::OwnerRecord) -> bool {
    let ours = st
        .identity
        .as_ref()
        .is_some_and(|m| o.root_id == Some(m.root_id) && m.path == st.dir);
    let gone = matches!(st.owner_liveness, Some(Liveness::Dead | Liveness::Recycled));
    owning(o.phase) && ours && gone
}

/// `stop` of a dir whose crashed owner's workload still runs in its recorded cgroup (cards P5,
/// T1): SIGTERM to its processes (through pidfds checked against the cgroup), then, past
/// `grace`, the cgroup's SIGKILL. The owner never released: [`EXIT_STOP_KILLED`], or 70 if
/// something survives SIGKILL.
fn stop_cgroup_leftovers(
    d: &StateDir,
    owner: &lease::OwnerRecord,
    rec: &lease::cgroup::CgroupRecord,
    root_id: &str,
    grace: Duration,
) -> u8 {
    let pid = owner.identity.pid;
    let termed = lease::cgroup::signal_recorded(rec, rustix::process::Signal::TERM);
    println!(
        "owner pid {pid} (epoch {}) of {} is gone, but its workload still runs in cgroup {}; sent SIGTERM to {} process(es): {termed:?}",
        owner.epoch,
        d.path().display(),
        rec.path.display(),
        termed.len()
    );
    let deadline = Instant::now() + grace;
    while lease::cgroup::recorded_members(rec).is_some_and(|m| !m.is_empty()) {
        if Instant::now() >= deadline {
            println!(
                "the workload of owner pid {pid} did not stop within {:.1}s; sending SIGKILL",
                grace.as_secs_f64()
            );
            match lease::cgroup::end_recorded(rec, root_id, owner.epoch, Duration::from_secs(10)) {
                Ok(lease::cgroup::EndedCgroup::Ended { killed }) => println!(
                    "sent SIGKILL to the {} process(es) of the owner's workload (cgroup {}): {killed:?}",
                    killed.len(),
                    rec.path.display()
                ),
                Ok(lease::cgroup::EndedCgroup::Gone) => {}
                Ok(lease::cgroup::EndedCgroup::Survived { pids }) => {
                    log::error!(
                        "did not stop: processes {pids:?} of the workload of owner pid {pid} survived SIGKILL in {}",
                        rec.path.display()
                    );
                    return EXIT_DID_NOT_STOP;
                }
                Err(e) => {
                    log::error!("{e}");
                    return EXIT_IO;
                }
            }
            break;
        }
        std::thread::sleep(STOP_POLL);
    }
    log::error!(
        "owner pid {pid} ended without an orderly release (its record says {}); its workload was stopped and the lease of {} is free, but its last checkpoint may not have been published",
        owner.phase,
        d.path().display()
    );
    EXIT_STOP_KILLED
}

/// `stop` of a dir that the leftovers of a crashed owner keep locked through the lock descriptor
/// they inherited (cards P5, T1): SIGTERM to them, SIGKILL after `grace` (each through a pidfd
/// checked against the lock, so a recycled pid is never signalled), until nothing holds the
/// lock. The owner never released: [`EXIT_STOP_KILLED`], or 70 if they survive SIGKILL.
fn stop_leftovers(d: &StateDir, owner: &lease::OwnerRecord, grace: Duration) -> u8 {
    let lock = d.path().join(lease::CONTROL_DIR).join(lease::LOCK_FILE);
    let pid = owner.identity.pid;
    let termed = crate::driver::tree::signal_lock_holders(&lock, rustix::process::Signal::TERM);
    println!(
        "owner pid {pid} (epoch {}) of {} is gone, but its workload still holds the lock; sent SIGTERM to {} process(es): {termed:?}",
        owner.epoch,
        d.path().display(),
        termed.len()
    );
    if !wait_released(d, owner.epoch, Instant::now() + grace) {
        println!(
            "the workload of owner pid {pid} did not let go of the lock within {:.1}s; sending SIGKILL",
            grace.as_secs_f64()
        );
        // Again until the lock is free: a process the workload started meanwhile inherited the
        // descriptor too.
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut killed: Vec<u32> = Vec::new();
        loop {
            for k in crate::driver::tree::kill_lock_holders(&lock) {
                if !killed.contains(&k) {
                    killed.push(k);
                }
            }
            if wait_released(d, owner.epoch, Instant::now() + STOP_POLL) {
                break;
            }
            if Instant::now() >= deadline {
                log::error!(
                    "did not stop: processes {:?} of the workload of owner pid {pid} still hold {} after SIGKILL",
                    crate::driver::tree::inherited_lock_holders(&lock),
                    d.path().display()
                );
                return EXIT_DID_NOT_STOP;
            }
        }
        println!(
            "sent SIGKILL to {} process(es) of the owner's workload still holding the lock: {killed:?}",
            killed.len()
        );
    }
    log::error!(
        "owner pid {pid} ended without an orderly release (its record says {}); its workload was stopped and the lease of {} is free, but its last checkpoint may not have been published",
        owner.phase,
        d.path().display()
    );
    EXIT_STOP_KILLED
}

/// How the ownership `stop` signalled ended.
enum End {
    /// Its record says `released`: the drain finished and the lease was let go in order.
    Orderly,
    /// The lock is free (or owned by a successor) but it never recorded a release.
    Unreleased(PhaseKind),
    /// It still holds the lock at the deadline.
    StillHeld,
}

/// Waits until the ownership of `owner` ends, and says how.
fn wait_end(d: &StateDir, owner: &lease::OwnerRecord, deadline: Instant) -> End {
    loop {
        if let Ok(s) = lease::status(d) {
            match &s.owner {
                Some(r) if r.token == owner.token && r.phase == PhaseKind::Released => {
                    return End::Orderly;
                }
                _ => {}
            }
            if !s.held || s.epoch != owner.epoch {
                // A successor may have overwritten the record already: the event log says
                // whether this ownership released in order.
                let released = crate::driver::eventlog::read(d).iter().any(|e| {
                    e["kind"] == "released"
                        && e["pid"] == owner.identity.pid
                        && e["epoch"] == owner.epoch
                });
                if released {
                    return End::Orderly;
                }
                let phase = s
                    .owner
                    .as_ref()
                    .filter(|r| r.token == owner.token)
                    .map_or(owner.phase, |r| r.phase);
                return End::Unreleased(phase);
            }
        }
        if Instant::now() >= deadline {
            return End::StillHeld;
        }
        std::thread::sleep(STOP_POLL);
    }
}

/// `tenure stop`: sends SIGTERM to the owner holding the lease through the identity-checked
/// pidfd path, waits for an orderly release, sends SIGKILL after `grace`, and says what it did.
/// A recorded identity that does not match the live process (a recycled pid) is never
/// signalled (card D7), nor is a record written for another dir (card P4).
///
/// It tells the truth (card P5): when the lock is held but the record does not yet name the
/// holder (an owner between taking the lock and writing its record), it waits up to `grace`
/// for that record and stops the owner it names, or exits [`EXIT_STOP_STARTING`] saying the
/// owner is starting. What a crashed owner's workload left running — holding the lock through
/// the descriptor it inherited (no cgroup), or in its recorded cgroup while the lock is free
/// (card T2) — it stops: SIGTERM, SIGKILL after `grace`.
/// Exit 0 only when no owner holds the lease or after an orderly release;
/// [`EXIT_STOP_KILLED`] when the owner or its workload had to be SIGKILLed (or it ended
/// without releasing; an owner that releases after stop killed its child is no orderly drain), 70
/// when it still holds the lease after SIGKILL, 65 for a refused dir.
pub fn stop(dir: &Path, grace: Duration) -> u8 {
    let d = match StateDir::open(dir, false) {
        Ok(d) => d,
        // Nothing can run on a dir that does not exist: stopped already, as LSB's `stop` of a
        // stopped service.
        Err(e) if e.is_not_found() => {
            println!(
                "{} does not exist: nothing runs there; nothing was signalled",
                dir.display()
            );
            return 0;
        }
        Err(e) => {
            log::error!("{e}");
            return EXIT_REFUSED;
        }
    };
    let first_look = Instant::now() + grace;
    let mut said_waiting = false;
    let (owner, marker) = loop {
        let st = match lease::status(&d) {
            Ok(s) => s,
            Err(e) => {
                log::error!("{e}");
                return EXIT_REFUSED;
            }
        };
        if !st.held {
            // What a crashed owner's workload left running in its cgroup runs on without the
            // lock, until the next owner ends it.
            if let Some(o) = st.owner.as_ref().filter(|o| crashed(&st, o))
                && let (Some(lease::Containment::Cgroup(rec)), Some(marker)) =
                    (&o.containment, st.identity.as_ref())
                && lease::cgroup::recorded_members(rec).is_some_and(|m| !m.is_empty())
            {
                return stop_cgroup_leftovers(&d, o, rec, &marker.root_id.to_string(), grace);
            }
            println!(
                "{} is not owned: nothing runs there (already stopped); nothing was signalled",
                d.path().display()
            );
            return 0;
        }
        if let Some(o) = st.owner.as_ref().filter(|o| names_the_holder(&st, o)) {
            break (o.clone(), st.identity.clone());
        }
        // A crashed owner's leftovers hold the lock: no record will ever name them.
        if let Some(o) = st.owner.as_ref().filter(|o| crashed_without_cgroup(&st, o))
            && !crate::driver::tree::inherited_lock_holders(
                &d.path().join(lease::CONTROL_DIR).join(lease::LOCK_FILE),
            )
            .is_empty()
        {
            return stop_leftovers(&d, o, grace);
        }
        if Instant::now() >= first_look {
            log::error!(
                "{} is owned, but its owner is still starting: no record names it after {:.1}s; nothing was signalled: run `tenure stop` again",
                d.path().display(),
                grace.as_secs_f64()
            );
            return EXIT_STOP_STARTING;
        }
        if !said_waiting {
            said_waiting = true;
            println!(
                "the lease of {} is held by an owner that is still starting; waiting up to {:.1}s for its record",
                d.path().display(),
                grace.as_secs_f64()
            );
        }
        std::thread::sleep(STOP_POLL);
    };
    let id = owner.identity.clone();
    let started = Instant::now();
    match lease::signal_owner(&id, rustix::process::Signal::TERM) {
        Ok(SignalOutcome::Delivered) => println!(
            "sent SIGTERM to owner pid {} (epoch {})",
            id.pid, owner.epoch
        ),
        // It ended between the look and the signal: how it ended is read below.
        Ok(SignalOutcome::Dead) | Ok(SignalOutcome::Mismatch { .. }) => {}
        Err(e) => {
            log::error!("{e}");
            return EXIT_IO;
        }
    }
    match wait_end(&d, &owner, started + grace) {
        End::Orderly => {
            println!(
                "owner pid {} released {} after {:.1}s",
                id.pid,
                d.path().display(),
                started.elapsed().as_secs_f64()
            );
            return 0;
        }
        End::Unreleased(phase) => {
            log::error!(
                "owner pid {} ended without an orderly release (its record says {phase}); the lease of {} is free, but its last checkpoint may not have been published",
                id.pid,
                d.path().display()
            );
            return EXIT_STOP_KILLED;
        }
        End::StillHeld => {}
    }
    println!(
        "owner pid {} did not release within {:.1}s; sending SIGKILL",
        id.pid,
        grace.as_secs_f64()
    );
    // Whether anything of the owner's was SIGKILLed: an owner that releases after its workload
    // was killed under it did not drain in order either (card P5: stop says it had to kill).
    let mut killed_any = false;
    // The processes the owner runs go first: killing the owner drops the lock at once, and its
    // child would otherwise still run (until its parent-death signal lands) while a successor
    // already owns the dir. Each is signalled only if its identity still matches and its entry
    // belongs to this dir.
    if let Ok(now) = lease::status(&d) {
        for r in now
            .registry
            .iter()
            .filter(|r| r.kind == lease::INSTANCES_DIR)
        {
            if let Some(rec) = r
                .record
                .as_ref()
                .filter(|rec| rec.epoch == owner.epoch && rec.root_id == owner.root_id)
                && let Ok(SignalOutcome::Delivered) =
                    lease::signal_owner(&rec.identity, rustix::process::Signal::KILL)
            {
                killed_any = true;
                println!(
                    "sent SIGKILL to the owner's {} pid {}",
                    rec.name, rec.identity.pid
                );
            }
        }
    }
    // The rest of its workload too (card T1): what its cgroup holds, if the record names one
    // that still carries the recorded identity.
    if let (Some(lease::Containment::Cgroup(rec)), Some(marker)) =
        (&owner.containment, marker.as_ref())
    {
        match lease::cgroup::end_recorded(
            rec,
            &marker.root_id.to_string(),
            owner.epoch,
            Duration::from_secs(10),
        ) {
            Ok(lease::cgroup::EndedCgroup::Ended { killed }) if !killed.is_empty() => {
                killed_any = true;
                println!(
                    "sent SIGKILL to the {} process(es) of the owner's workload (cgroup {})",
                    killed.len(),
                    rec.path.display()
                );
            }
            Ok(lease::cgroup::EndedCgroup::Survived { pids }) => log::error!(
                "processes {pids:?} of the owner's workload survived SIGKILL in {}",
                rec.path.display()
            ),
            Ok(_) => {}
            Err(e) => log::error!("{e}"),
        }
    }
    match lease::signal_owner(&id, rustix::process::Signal::KILL) {
        Ok(SignalOutcome::Delivered) => killed_any = true,
        Ok(_) => {}
        Err(e) => log::error!("{e}"),
    }
    // Without a cgroup the workload keeps a copy of the lock descriptor: whoever still holds
    // the lock once the owner is dead is a process of that workload.
    if owner.containment == Some(lease::Containment::LockFd)
        && !wait_released(&d, owner.epoch, Instant::now() + Duration::from_secs(1))
    {
        let lock = d.path().join(lease::CONTROL_DIR).join(lease::LOCK_FILE);
        let killed = crate::driver::tree::kill_lock_holders(&lock);
        if !killed.is_empty() {
            killed_any = true;
            println!(
                "sent SIGKILL to {} process(es) of the owner's workload still holding the lock: {killed:?}",
                killed.len()
            );
        }
    }
    // The kernel drops the lock when the owner (and, without a cgroup, its workload) is dead.
    match wait_end(&d, &owner, Instant::now() + Duration::from_secs(10)) {
        // Its workload was killed under it and it then released: not an orderly drain, and
        // nothing was published (a killed child never exits 0).
        End::Orderly if killed_any => {
            log::error!(
                "the workload of owner pid {} was killed with SIGKILL mid-drain; the owner released {} after it, so the lease is free, but its last checkpoint was not published",
                id.pid,
                d.path().display()
            );
            EXIT_STOP_KILLED
        }
        End::Orderly => {
            println!(
                "owner pid {} released {} just before SIGKILL",
                id.pid,
                d.path().display()
            );
            0
        }
        End::Unreleased(_) => {
            log::error!(
                "owner pid {} was killed with SIGKILL mid-drain; the lease of {} is free, but its last checkpoint may not have been published",
                id.pid,
                d.path().display()
            );
            EXIT_STOP_KILLED
        }
        End::StillHeld => {
            log::error!(
                "did not stop: owner pid {} still holds {}",
                id.pid,
                d.path().display()
            );
            EXIT_DID_NOT_STOP
        }
    }
}

/// Waits until the ownership at `epoch` no longer holds the lock.
fn wait_released(d: &StateDir, epoch: u64, deadline: Instant) -> bool {
    loop {
        match lease::status(d) {
            Ok(s) if !s.held || s.epoch != epoch => return true,
            Ok(_) => {}
            Err(_) => {}
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(STOP_POLL);
    }
}

/// A checkpoint as `tenure checkpoint list --json` shows it.
#[derive(Debug, Clone, Serialize)]
#[non_exhaustive]
pub struct ListedView {
    /// Its id.
    pub id: u64,
    /// Whether `CURRENT` names it.
    pub current: bool,
    /// The epoch that published it (from its manifest's header, when readable).
    pub epoch: Option<u64>,
    /// The checkpoint that was current when it was published.
    pub parent: Option<u64>,
    /// Publication time, unix milliseconds.
    pub created_ms: Option<u64>,
    /// Number of files.
    pub files: Option<u64>,
    /// Total bytes (known only when it verifies).
    pub bytes: Option<u64>,
    /// Whether its manifest and every blob verify: whether a load of it would succeed.
    pub verifies: bool,
    /// Why it does not verify.
    pub error: Option<String>,
}

/// The JSON shape of `tenure checkpoint list --json`.
#[derive(Debug, Clone, Serialize)]
#[non_exhaustive]
pub struct CheckpointList {
    /// The state dir (canonical path).
    pub dir: String,
    /// The id `CURRENT` names, if it can be read.
    pub current: Option<u64>,
    /// Why `CURRENT` cannot be read.
    pub current_error: Option<String>,
    /// Every checkpoint in the store, oldest first.
    pub checkpoints: Vec<ListedView>,
    /// Outputs of failed publishes kept under `checkpoints/failed/`, oldest first (card P1).
    pub failed_publishes: Vec<FailedView>,
}

/// Refuses a command on `dir`: the message on stderr and, with `json`, as an `error` object.
fn refuse_json(dir: &Path, json: bool, code: u8, message: String) -> u8 {
    log::error!("{message}");
    if json {
        let v = serde_json::json!({
            "dir": dir.display().to_string(),
            "error": {"code": code, "message": message},
        });
        println!("{}", serde_json::to_string_pretty(&v).unwrap_or_default());
    }
    code
}

fn checkpoint_code(e: &CheckpointError) -> u8 {
    if e.is_corrupt_state() {
        EXIT_REFUSED
    } else {
        EXIT_IO
    }
}

/// Collects `tenure checkpoint list` for `dir` (read-only).
pub fn list_checkpoints(dir: &StateDir) -> Result<CheckpointList, CheckpointError> {
    let store = CheckpointStore::open(dir, StoreOptions::default())?;
    let (current, current_error) = match store.read_current() {
        Ok(c) => (c.map(|c| c.id.get()), None),
        Err(e) => (None, Some(e.to_string())),
    };
    let checkpoints = store
        .list()?
        .into_iter()
        .map(|l| ListedView {
            id: l.id.get(),
            current: l.current,
            epoch: l.header.map(|h| h.epoch),
            parent: l.header.and_then(|h| h.parent).map(|p| p.get()),
            created_ms: l.header.map(|h| h.created_at_ms),
            files: l.header.map(|h| h.files),
            bytes: l.verified.as_ref().ok().map(|s| s.bytes),
            verifies: l.verified.is_ok(),
            error: l.verified.err().map(|e| e.to_string()),
        })
        .collect();
    let failed_publishes = store
        .failed_outputs()?
        .into_iter()
        .map(|(epoch, path)| FailedView {
            epoch,
            path: path.display().to_string(),
        })
        .collect();
    Ok(CheckpointList {
        dir: dir.path().display().to_string(),
        current,
        current_error,
        checkpoints,
        failed_publishes,
    })
}

/// `tenure checkpoint list`: every checkpoint with its id, epoch, time, files, size and whether
/// it verifies, and the kept outputs of failed publishes. Read-only; exit 0, or 65 (74 for an
/// I/O error) when the dir or the store cannot be read.
pub fn checkpoint_list(dir: &Path, json: bool) -> u8 {
    let d = match StateDir::open(dir, false) {
        Ok(d) => d,
        Err(e) => return refuse_json(dir, json, EXIT_REFUSED, e.to_string()),
    };
    let l = match list_checkpoints(&d) {
        Ok(l) => l,
        Err(e) => return refuse_json(dir, json, checkpoint_code(&e), e.to_string()),
    };
    if json {
        println!("{}", serde_json::to_string_pretty(&l).unwrap_or_default());
        return 0;
    }
    if let Some(e) = &l.current_error {
        println!("CURRENT is refused: {e}");
    }
    if l.checkpoints.is_empty() {
        println!("no checkpoint in {}", l.dir);
    } else {
        println!(
            "{:>6} {:>6} {:<24} {:>8} {:>12}  STATE",
            "ID", "EPOCH", "CREATED", "FILES", "BYTES"
        );
    }
    let or_dash = |v: Option<u64>| v.map_or_else(|| "-".to_owned(), |v| v.to_string());
    for c in &l.checkpoints {
        let state = match (&c.error, c.current) {
            (None, true) => "current, verifies".to_owned(),
            (None, false) => "verifies".to_owned(),
            (Some(e), true) => format!("current, refused: {e}"),
            (Some(e), false) => format!("refused: {e}"),
        };
        println!(
            "{:>6} {:>6} {:<24} {:>8} {:>12}  {state}",
            c.id,
            or_dash(c.epoch),
            c.created_ms
                .map_or_else(|| "-".to_owned(), lease::format_unix_ms),
            or_dash(c.files),
            or_dash(c.bytes),
        );
    }
    for f in &l.failed_publishes {
        println!(
            "failed publish of epoch {}: its output is kept in {}",
            f.epoch, f.path
        );
    }
    0
}

/// What `show` and `rollback` say of a checkpoint id the store has no manifest of (the store's
/// own error speaks of the one CURRENT names).
fn no_such_checkpoint(d: &StateDir, id: CheckpointId) -> String {
    format!(
        "{} has no checkpoint {} (see `tenure checkpoint list --dir {}`)",
        d.path().display(),
        id.get(),
        d.path().display()
    )
}

/// `tenure checkpoint show N`: checkpoint N's header and files, verified (read-only). Exit 0
/// when it verifies; 65 naming the bad file when it does not or does not exist (74 for an I/O
/// error).
pub fn checkpoint_show(dir: &Path, id: u64, json: bool) -> u8 {
    let d = match StateDir::open(dir, false) {
        Ok(d) => d,
        Err(e) => return refuse_json(dir, json, EXIT_REFUSED, e.to_string()),
    };
    let Some(id) = CheckpointId::new(id) else {
        return refuse_json(dir, json, EXIT_REFUSED, "checkpoint ids start at 1".into());
    };
    let store = match CheckpointStore::open(&d, StoreOptions::default()) {
        Ok(s) => s,
        Err(e) => return refuse_json(dir, json, checkpoint_code(&e), e.to_string()),
    };
    let current = store.read_current().ok().flatten().map(|c| c.id);
    let cp = match store.load_id(id) {
        Ok(cp) => cp,
        Err(e) => {
            let hint = match &e {
                CheckpointError::ManifestMissing { .. } => no_such_checkpoint(&d, id),
                _ => format!("checkpoint {} does not verify: {e}", id.get()),
            };
            return refuse_json(dir, json, checkpoint_code(&e), hint);
        }
    };
    if json {
        let v = serde_json::json!({
            "dir": d.path().display().to_string(),
            "id": cp.id.get(),
            "current": current == Some(cp.id),
            "epoch": cp.epoch,
            "parent": cp.parent.map(CheckpointId::get),
            "created_ms": cp.created_at_ms,
            "files": cp.entries.len(),
            "bytes": cp.total_size(),
            "manifest_sha256": cp.manifest_sha256.to_hex(),
            "entries": cp.entries,
        });
        println!("{}", serde_json::to_string_pretty(&v).unwrap_or_default());
        return 0;
    }
    println!(
        "checkpoint {}{}: verifies",
        cp.id.get(),
        if current == Some(cp.id) {
            " (current)"
        } else {
            ""
        }
    );
    println!("epoch:      {}", cp.epoch);
    println!(
        "parent:     {}",
        cp.parent
            .map_or_else(|| "none".to_owned(), |p| p.get().to_string())
    );
    println!("created:    {}", lease::format_unix_ms(cp.created_at_ms));
    println!("manifest:   sha256 {}", cp.manifest_sha256.to_hex());
    println!(
        "files:      {} ({} bytes)",
        cp.entries.len(),
        cp.total_size()
    );
    for e in &cp.entries {
        println!(
            "  {:04o} {:>12} {}  {}",
            e.mode,
            e.size,
            &e.sha256.to_hex()[..16],
            shown_name(&e.name)
        );
    }
    0
}

/// A file name as one line of a listing: quoted and escaped (as git quotes such paths) when
/// it holds a control character (a newline would look like another file, an escape sequence
/// would reach the terminal), a quote or a backslash; as it is otherwise.
fn shown_name(name: &str) -> std::borrow::Cow<'_, str> {
    if name
        .chars()
        .any(|c| c.is_control() || c == '"' || c == '\\')
    {
        format!("{name:?}").into()
    } else {
        name.into()
    }
}

/// `tenure checkpoint rollback --to N`: an explicit operator action that makes checkpoint N
/// current again. N is verified (before and again under the lease); the lease is taken — so no
/// run owns the dir meanwhile, and the rollback gets an epoch of its own — and N's files are
/// published as a new checkpoint through the store's publish protocol
/// ([`CheckpointStore::republish`]), fenced by that epoch. Nothing is deleted by the rollback
/// itself: the checkpoint it replaces (typically a refused one) stays in the kept chain as
/// evidence until a later garbage collection (`keep` is at least 2 here so that it survives
/// this one). Exit 0; 65 when N does not verify or the dir is refused; 75 when the lease is
/// held (`wait` bounds the wait); 74 for an I/O error; 128 + N when a signal cancels the wait.
pub fn rollback(
    dir: &Path,
    to: u64,
    wait: WaitBound,
    keep: usize,
    intake: &crate::driver::signals::SignalIntake,
) -> u8 {
    let d = match open_existing(dir) {
        Ok(d) => d,
        Err(code) => return code,
    };
    let n = to;
    let Some(to) = CheckpointId::new(to) else {
        log::error!("checkpoint ids start at 1");
        return EXIT_REFUSED;
    };
    // Checked before anything is written: a rollback to a checkpoint that does not verify
    // changes nothing, not even the epoch.
    let before = match CheckpointStore::open(&d, StoreOptions::default()) {
        Ok(store) => {
            if let Err(e) = store.load_id(to) {
                let why = match &e {
                    CheckpointError::ManifestMissing { .. } => no_such_checkpoint(&d, to),
                    _ => e.to_string(),
                };
                log::error!(
                    "cannot roll back to checkpoint {}: {why}; nothing was changed",
                    to.get()
                );
                return checkpoint_code(&e);
            }
            store.read_current()
        }
        Err(e) => {
            log::error!("{e}");
            return checkpoint_code(&e);
        }
    };
    let opts = AcquireOptions {
        wait,
        cancel: Some(intake.fd()),
        phase: PhaseKind::Recovering,
        fence: None,
    };
    let lease = match lease::acquire(&d, &opts, &mut |c| log::info!("{c}")) {
        Ok(l) => l,
        Err(lease::LeaseError::Busy { .. }) => {
            log::error!(
                "{} is owned; nothing was changed: stop its owner first (tenure stop), or wait with --wait",
                d.path().display()
            );
            return crate::machine::EXIT_BUSY;
        }
        Err(lease::LeaseError::Cancelled { .. }) => {
            let sig = intake.take().first().copied();
            log::info!("rollback cancelled while waiting for the lease; nothing was changed");
            return sig.map_or(130, |s| s.exit_code());
        }
        Err(e) => {
            log::error!("{e}");
            return if e.is_refusal() {
                EXIT_REFUSED
            } else {
                EXIT_IO
            };
        }
    };
    let epoch = lease.epoch();
    let result = CheckpointStore::open_owned(&d, StoreOptions { keep: keep.max(2) })
        .and_then(|s| s.republish(epoch, to));
    let from = match &before {
        Ok(c) => serde_json::json!(c.as_ref().map(|c| c.id.get())),
        Err(e) => serde_json::json!(e.to_string()),
    };
    let code = match &result {
        Ok(Published::New { checkpoint, gc, .. }) => {
            if let Some(mut log) = crate::driver::eventlog::EventLog::open(&d) {
                log.write(
                    "checkpoint-rolled-back",
                    Some(epoch),
                    serde_json::json!({"to": to.get(), "checkpoint": checkpoint.id.get(),
                                       "from": from, "gc_error": gc.error}),
                );
            }
            let replaced = match &before {
                Ok(Some(c)) => format!(
                    "; checkpoint {} is kept until garbage collection",
                    c.id.get()
                ),
                Ok(None) => String::new(),
                Err(e) => format!("; CURRENT was refused ({e})"),
            };
            println!(
                "checkpoint {n} is current again as checkpoint {} (epoch {epoch}){replaced}",
                checkpoint.id.get()
            );
            0
        }
        Ok(Published::Unchanged { .. }) => {
            // The rollback owned the dir for a moment (an epoch of its own), but published
            // nothing: CURRENT and the store are as they were.
            println!(
                "checkpoint {n} is already current and verifies; nothing was rolled back (the rollback's ownership took epoch {epoch})"
            );
            0
        }
        Err(e) => {
            log::error!("cannot roll back to checkpoint {n}: {e}");
            checkpoint_code(e)
        }
    };
    if let Err(e) = lease.release() {
        log::error!("releasing {}: {e}", d.path().display());
        return EXIT_IO;
    }
    code
}

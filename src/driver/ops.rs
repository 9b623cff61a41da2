//! The operator commands around a run: `status`, `verify`, `init` and `stop`. They read the
//! state dir without owning it (except `init`, which takes the lease for an instant), and never
//! change a refused dir.

use crate::checkpoint::{CheckpointError, CheckpointStore, CheckpointSummary, StoreOptions};
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
pub struct FailedView {
    /// The epoch of the owner whose publish failed.
    pub epoch: u64,
    /// Where its output is kept.
    pub path: String,
}

/// The containment of the recorded owner's workload as `status` shows it (spec/runner.md,
/// "Containment").
#[derive(Debug, Clone, Serialize)]
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
    Ok(Status {
        dir: dir.path().display().to_string(),
        phase: phase_word(&st),
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
        containment: containment_view(dir, st.owner.as_ref()),
        checkpoint,
        failed_publishes,
    })
}

fn open_existing(dir: &Path) -> Result<StateDir, u8> {
    StateDir::open(dir, false).map_err(|e| {
        eprintln!("tenure: {e}");
        EXIT_REFUSED
    })
}

/// `tenure status`: prints the phase, epoch, owner, waiters and checkpoint. Exit 0, or 65 when
/// the dir or a record is refused (an invalid registration fails closed, card H8).
pub fn status(dir: &Path, json: bool) -> u8 {
    // With `--json` a refusal is JSON too (`{"dir", "error": {"code", "message"}}`), so a
    // script that parses stdout learns why instead of finding nothing (issue 10).
    let refused = |message: String| {
        eprintln!("tenure: {message}");
        if json {
            let v = serde_json::json!({
                "dir": dir.display().to_string(),
                "error": {"code": EXIT_REFUSED, "message": message},
            });
            println!("{}", serde_json::to_string_pretty(&v).unwrap_or_default());
        }
        EXIT_REFUSED
    };
    let d = match StateDir::open(dir, false) {
        Ok(d) => d,
        Err(e) => return refused(e.to_string()),
    };
    let s = match collect(&d) {
        Ok(s) => s,
        Err(e) => return refused(e.to_string()),
    };
    if json {
        println!("{}", serde_json::to_string_pretty(&s).unwrap_or_default());
        return 0;
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
            Some(_) => "the next owner ends them before it starts its own workload",
            None => "the dir stays locked until they exit; stop them to go on",
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
    0
}

/// `tenure status --lease etcd://…` (issue 14): the cluster's owner (node, pid, epoch), its
/// waiters and CURRENT, beside this machine's local view of its state dir. Exit 0; 74 when the
/// cluster cannot be read; 65 when the local dir is refused.
#[cfg(feature = "etcd")]
pub fn cluster_status(dir: &Path, spec: &crate::cluster::ClusterSpec, json: bool) -> u8 {
    let cluster = match crate::cluster::status(spec) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("tenure: {e}");
            return if e.is_refusal() {
                EXIT_REFUSED
            } else {
                EXIT_IO
            };
        }
    };
    let local = match StateDir::open(dir, false).map(|d| collect(&d)) {
        Ok(Ok(s)) => Some(s),
        // A machine that never ran on this dir has no local view yet.
        Err(crate::privfs::FsError::NotFound { .. }) => None,
        Ok(Err(e)) => {
            eprintln!("tenure: {e}");
            return EXIT_REFUSED;
        }
        Err(e) => {
            eprintln!("tenure: {e}");
            return EXIT_REFUSED;
        }
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
        return 0;
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
    0
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
        eprintln!("tenure: {e}");
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
            eprintln!("tenure: {e}");
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
            eprintln!("tenure: {e}");
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
            eprintln!("tenure: {e}");
            if let Some(older) = report.newest_valid_older {
                eprintln!(
                    "tenure: the newest older checkpoint that verifies is {} (epoch {}); nothing was changed",
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
            eprintln!("tenure: {e}");
            return EXIT_REFUSED;
        }
    };
    if adopt {
        return match lease::adopt(&d) {
            Ok(m) => {
                println!("adopted {} (root id {})", d.path().display(), m.root_id);
                0
            }
            Err(e) => {
                eprintln!("tenure: {e}");
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
                eprintln!("tenure: {e}");
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
            eprintln!("tenure: {e}");
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

/// Whether `o` can be the record of the process holding the lock right now: an owning phase,
/// written for this dir (card P4), naming a live process.
fn names_the_holder(st: &LeaseStatus, o: &lease::OwnerRecord) -> bool {
    let owning = match o.phase {
        PhaseKind::Recovering | PhaseKind::Ready | PhaseKind::Draining => true,
        PhaseKind::Cold | PhaseKind::Released | PhaseKind::Cancelled | PhaseKind::Refused => false,
    };
    let ours = st
        .identity
        .as_ref()
        .is_some_and(|m| o.root_id == Some(m.root_id));
    owning && ours && st.owner_liveness == Some(Liveness::Live)
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
/// owner is starting. Exit 0 only when no owner holds the lease or after an orderly release;
/// [`EXIT_STOP_KILLED`] when the owner had to be SIGKILLed (or ended without releasing), 70
/// when it still holds the lease after SIGKILL, 65 for a refused dir.
pub fn stop(dir: &Path, grace: Duration) -> u8 {
    let d = match open_existing(dir) {
        Ok(d) => d,
        Err(code) => return code,
    };
    let first_look = Instant::now() + grace;
    let mut said_waiting = false;
    let (owner, marker) = loop {
        let st = match lease::status(&d) {
            Ok(s) => s,
            Err(e) => {
                eprintln!("tenure: {e}");
                return EXIT_REFUSED;
            }
        };
        if !st.held {
            println!(
                "no live owner of {}; nothing was signalled",
                d.path().display()
            );
            return 0;
        }
        if let Some(o) = st.owner.as_ref().filter(|o| names_the_holder(&st, o)) {
            break (o.clone(), st.identity.clone());
        }
        if Instant::now() >= first_look {
            eprintln!(
                "tenure: {} is owned, but its owner is still starting: no record names it after {:.1}s; nothing was signalled: run `tenure stop` again",
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
            eprintln!("tenure: {e}");
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
            eprintln!(
                "tenure: owner pid {} ended without an orderly release (its record says {phase}); the lease of {} is free, but its last checkpoint may not have been published",
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
            Ok(lease::cgroup::EndedCgroup::Ended { killed }) if !killed.is_empty() => println!(
                "sent SIGKILL to the {} process(es) of the owner's workload (cgroup {})",
                killed.len(),
                rec.path.display()
            ),
            Ok(lease::cgroup::EndedCgroup::Survived { pids }) => eprintln!(
                "tenure: processes {pids:?} of the owner's workload survived SIGKILL in {}",
                rec.path.display()
            ),
            Ok(_) => {}
            Err(e) => eprintln!("tenure: {e}"),
        }
    }
    match lease::signal_owner(&id, rustix::process::Signal::KILL) {
        Ok(SignalOutcome::Delivered) => {}
        Ok(_) => {}
        Err(e) => eprintln!("tenure: {e}"),
    }
    // Without a cgroup the workload keeps a copy of the lock descriptor: whoever still holds
    // the lock once the owner is dead is a process of that workload.
    if owner.containment == Some(lease::Containment::LockFd)
        && !wait_released(&d, owner.epoch, Instant::now() + Duration::from_secs(1))
    {
        let lock = d.path().join(lease::CONTROL_DIR).join(lease::LOCK_FILE);
        let killed = crate::driver::tree::kill_lock_holders(&lock);
        if !killed.is_empty() {
            println!(
                "sent SIGKILL to {} process(es) of the owner's workload still holding the lock: {killed:?}",
                killed.len()
            );
        }
    }
    // The kernel drops the lock when the owner (and, without a cgroup, its workload) is dead.
    match wait_end(&d, &owner, Instant::now() + Duration::from_secs(10)) {
        End::Orderly => {
            println!(
                "owner pid {} released {} just before SIGKILL",
                id.pid,
                d.path().display()
            );
            0
        }
        End::Unreleased(_) => {
            eprintln!(
                "tenure: owner pid {} was killed with SIGKILL mid-drain; the lease of {} is free, but its last checkpoint may not have been published",
                id.pid,
                d.path().display()
            );
            EXIT_STOP_KILLED
        }
        End::StillHeld => {
            eprintln!(
                "tenure: did not stop: owner pid {} still holds {}",
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

//! The operator commands around a run: `status`, `verify`, `init` and `stop`. They read the
//! state dir without owning it (except `init`, which takes the lease for an instant), and never
//! change a refused dir.

use crate::checkpoint::{Checkpoint, CheckpointError, CheckpointStore, StoreOptions};
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
    pub files: Option<usize>,
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

fn checkpoint_view(r: Result<Option<Checkpoint>, CheckpointError>) -> CheckpointView {
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
            files: Some(c.entries.len()),
            bytes: Some(c.total_size()),
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
    let checkpoint =
        checkpoint_view(CheckpointStore::open(dir, StoreOptions::default()).and_then(|s| s.load()));
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
    let d = match open_existing(dir) {
        Ok(d) => d,
        Err(code) => return code,
    };
    let s = match collect(&d) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("tenure: {e}");
            return EXIT_REFUSED;
        }
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
    0
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
                c.entries.len(),
                c.total_size(),
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

/// `tenure stop`: sends SIGTERM to the recorded owner through the identity-checked pidfd path,
/// waits for the lease to be released, sends SIGKILL after `grace`, and says what it did. A
/// recorded identity that does not match the live process (a recycled pid) is never signalled
/// (card D7). Exit 0 when the dir ends up released (or had no live owner), 70 when the owner did
/// not stop.
pub fn stop(dir: &Path, grace: Duration) -> u8 {
    let d = match open_existing(dir) {
        Ok(d) => d,
        Err(code) => return code,
    };
    let st = match lease::status(&d) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("tenure: {e}");
            return EXIT_REFUSED;
        }
    };
    let Some(owner) = st.owner.clone().filter(|_| st.held) else {
        println!(
            "no live owner of {}; nothing was signalled",
            d.path().display()
        );
        return 0;
    };
    let id = owner.identity.clone();
    let started = Instant::now();
    match lease::signal_owner(&id, rustix::process::Signal::TERM) {
        Ok(SignalOutcome::Delivered) => println!(
            "sent SIGTERM to owner pid {} (epoch {})",
            id.pid, owner.epoch
        ),
        Ok(SignalOutcome::Dead) => {
            println!(
                "the recorded owner pid {} is gone; nothing was signalled",
                id.pid
            );
            return 0;
        }
        Ok(SignalOutcome::Mismatch { .. }) => {
            println!(
                "pid {} now belongs to another process; nothing was signalled",
                id.pid
            );
            return 0;
        }
        Err(e) => {
            eprintln!("tenure: {e}");
            return EXIT_IO;
        }
    }
    if wait_released(&d, owner.epoch, started + grace) {
        println!(
            "owner pid {} released {} after {:.1}s",
            id.pid,
            d.path().display(),
            started.elapsed().as_secs_f64()
        );
        return 0;
    }
    println!(
        "owner pid {} did not release within {:.1}s; sending SIGKILL",
        id.pid,
        grace.as_secs_f64()
    );
    // The processes the owner runs go first: killing the owner drops the lock at once, and its
    // child would otherwise still run (until its parent-death signal lands) while a successor
    // already owns the dir. Each is signalled only if its identity still matches.
    if let Ok(now) = lease::status(&d) {
        for r in now
            .registry
            .iter()
            .filter(|r| r.kind == lease::INSTANCES_DIR)
        {
            if let Some(rec) = r.record.as_ref().filter(|rec| rec.epoch == owner.epoch)
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
        (&owner.containment, st.identity.as_ref())
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
    if wait_released(&d, owner.epoch, Instant::now() + Duration::from_secs(10)) {
        println!("owner pid {} was killed; the lease is free", id.pid);
        0
    } else {
        eprintln!(
            "tenure: did not stop: owner pid {} still holds {}",
            id.pid,
            d.path().display()
        );
        EXIT_DID_NOT_STOP
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

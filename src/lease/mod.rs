//! The owner lease on a state directory: kernel lock, owner record, process identity, epoch,
//! waiters, registry and the directory identity marker (cards L1–L10, D7, H5, H8).
//!
//! ## Layout of the control folder
//! ```text
//! DIR/.tenure/                 0700, created by the first contender
//!     lock                     0600, empty; the flock target (never removed)
//!     epoch                    checksummed slots: two durable reservations, one scratch slot
//!                              bumped in place at every acquisition (`epoch`)
//!     identity.json            the directory identity marker (root id, canonical path, times)
//!     owner.json               the owner record (token, epoch, acquired_at, phase, identity):
//!                              one checksummed slot, overwritten in place (`record::OWNER_SLOT`)
//!     waiters/<pid>-<start>.json           one per contender while it waits
//!     registry/leases/owner.slot           the owner (overwritten by the next; `status` shows
//!                                          it while the record is not released)
//!     registry/instances/<name>.slot       processes the owner runs, while they run; each a
//!                                          checksummed slot overwritten in place, vacant
//!                                          when nobody is registered (`record::OWNER_ENTRY`)
//! ```
//! Only the kernel lock says who owns; every file is evidence, written under the lock (except
//! waiter entries, written by each waiter about itself). The owner record and registry entries
//! carry the `root_id` of the marker: only records of this dir's identity are ever signalled or
//! swept, so a copied dir never acts on the original's processes (card P4).
//!
//! ## Cold, foreign and moved dirs (card L8)
//! A state dir is **cold** when it holds no entry other than the control folder `.tenure/`, and
//! `.tenure/` (if present) holds no identity marker. Contenders create `.tenure/`, its lock file
//! and waiter entries before anyone owns, so those never make a dir look foreign. The first owner
//! of a cold dir writes the marker under the lease, atomically (temp, fsync, rename without
//! replace, dir fsync: card L7). Every acquisition first inspects the dir *read-only* and refuses,
//! before creating anything:
//! - entries besides `.tenure/` but no marker: `derived state but no identity` (the dir holds
//!   something tenure did not create; adopt it explicitly with [`adopt`]);
//! - a marker that does not parse: `identity is unreadable`;
//! - a marker naming another canonical path: `identity mismatch` (moved or copied; [`adopt`]);
//! - a corrupt owner record or epoch file, or any file that privfs refuses (symlink, permissive,
//!   not owned, not a regular file, hard-linked).
//!
//! The inspection is repeated under the lock, since the dir may have changed while waiting.
//!
//! ## Acquisition, in order
//! 1. refuse if the caller's cancel fd is already readable;
//! 2. open `.tenure/` and open or create `.tenure/lock` (0600, `O_CLOEXEC`); when `.tenure/` is
//!    missing, inspect the dir read-only first, then create it (0700);
//! 3. try the lock; when held by another: inspect the dir read-only (if not yet), publish a
//!    waiter entry, call `on_wait` once with the owner record, and wait (see `lock` for the
//!    inotify-based wake-up) until the bound expires (`busy`), the cancel fd becomes readable
//!    (`cancelled`) or the lock is ours. (A free lock is taken before any inspection: nothing
//!    was created then but what any contender may create, and the inspection under the lock
//!    is the one that counts);
//! 4. under the lock: inspect again; write the next epoch (one above every epoch the dir
//!    records — epoch file, owner record, the names of older tenure's registry entries (an
//!    entry written in place carries its owner record's epoch), the checkpoint `CURRENT` names: card
//!    P3, [`epoch::next_after`]) in place into the epoch file's scratch slot, unsynced while it
//!    is within the reservation this boot made durable; past it, a new reservation is written
//!    in place and fdatasynced first (see [`epoch`]; a dir without the file, another boot's
//!    file or one of an older tenure gets a whole new file through a temp file instead, and its
//!    scratch slot once the folder's sync made it durable); write the marker (if the dir is cold: to a temp file,
//!    fdatasynced, renamed into place without replacing) and the owner record (its slot in
//!    place, not synced; a dir without the file gets it through a temp file and a rename); sync
//!    the control folder only if a new epoch file or marker was renamed into it; then write the registry entry (its slot in place in
//!    `registry/leases/owner.slot`; created once), sweep leftovers of dead owners and waiters (the control folder's temp files only
//!    when the inspection saw a trace of a crash: an owner record not released in order,
//!    missing or behind the epoch file) and remove our own waiter entry, none of it synced.
//!    Only then is the [`Lease`]
//!    returned, so a durable reservation covers the epoch before the caller owns (and before
//!    any child can see it).
//!
//! ## Durability (issue 11, spec/lifecycle.md "Durability")
//! A process crash keeps the page cache; only a power loss drops unsynced writes, and it ends
//! every owner, child and waiter with them. So the lease syncs only the epoch's high-water mark,
//! once per batch of epochs and boot (and, once, the marker and the folders of a new dir): the owner record, its phase updates, the release
//! record, waiter and registry entries and every sweep are written and never synced. After a
//! power loss they may be old or empty; an empty owner record reads as absent. The lease model
//! checks this with power loss (`a successor after power loss starts clean`, `epochs
//! increase`).
//!
//! ## Release, in order
//! [`Lease::release`] vacates this owner's instance entries in place, overwrites the owner record's slot
//! with phase `released` (not synced: evidence for live processes),
//! then unlocks (`LOCK_UN` before close, so a waiter woken by the close finds the lock free).
//!
//! A waiter that stops waiting for any reason removes its entry, so a cancelled or expired
//! contender leaves nothing but the `.tenure/` folder and lock file that any contender may create.

// The runner's containment and the epoch file's encoding: public for the runner and the
// tests, not part of the API (the epoch a user sees is `Lease::epoch` and `LeaseStatus`).
#[doc(hidden)]
pub mod cgroup;
mod election;
#[doc(hidden)]
pub mod epoch;
mod exec;
pub mod identity;
mod lock;
pub mod plan;
pub mod record;

use std::ffi::OsString;
use std::fmt;
use std::fs::File;
use std::io;
use std::os::fd::{BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::machine::PhaseKind;
use crate::privfs::{Dir, FsError, StateDir};

pub use election::{ELECTION_FILE, Election, elect};
pub use identity::{
    Identity, IdentityError, Liveness, SignalError, SignalOutcome, parse_start_time, signal_owner,
};
pub use record::{
    Containment, DirIdentity, OwnerRecord, RECORD_VERSION, RegistryRecord, Token, WaiterRecord,
    format_unix_ms, now_ms,
};

/// The control folder tenure keeps inside every state dir.
pub const CONTROL_DIR: &str = ".tenure";
/// The lock file inside the control folder.
pub const LOCK_FILE: &str = "lock";
/// The owner record inside the control folder.
pub const OWNER_FILE: &str = "owner.json";
/// The directory identity marker inside the control folder.
pub const IDENTITY_FILE: &str = "identity.json";
/// The folder of waiter entries inside the control folder.
pub const WAITERS_DIR: &str = "waiters";
/// The registry folder inside the control folder.
pub const REGISTRY_DIR: &str = "registry";
/// The owner entries inside the registry folder.
pub const LEASES_DIR: &str = "leases";
/// The instance entries inside the registry folder.
pub const INSTANCES_DIR: &str = "instances";

/// The largest record tenure reads; its own records are a few hundred bytes.
pub(crate) const MAX_RECORD: u64 = 64 * 1024;

/// How long an acquisition waits for the SIGKILLed processes of a crashed owner's cgroup to be
/// gone before it refuses (card T2). SIGKILL empties a cgroup in milliseconds unless a process
/// is stuck in the kernel (a dead FUSE server, a hung NFS mount).
pub const LEFTOVERS_WAIT: Duration = Duration::from_secs(5);

/// Errors of the lease boundary.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LeaseError {
    /// The wait bound expired while another process owned the dir.
    #[error("{dir} is busy ({}); lock and state were preserved", OwnerPart(.owner.as_deref()))]
    Busy {
        /// The state dir.
        dir: PathBuf,
        /// The owner's record, when it could be read.
        owner: Option<Box<OwnerRecord>>,
    },
    /// The caller's cancel fd became readable before the lease was acquired.
    #[error("waiting for {dir} was cancelled; nothing was changed")]
    Cancelled {
        /// The state dir.
        dir: PathBuf,
    },
    /// The opened state dir is no longer at its path (moved, or replaced by another dir).
    #[error(
        "{dir} was moved or replaced while tenure had it open; nothing was initialised: check which directory is the real state dir and run again"
    )]
    Moved {
        /// The state dir.
        dir: PathBuf,
    },
    /// The dir holds entries tenure did not create and has no identity marker.
    #[error(
        "{dir} holds derived state but no identity marker (found {entry:?}); if this is tenure state, adopt it explicitly with `tenure init --adopt --dir {dir}`, otherwise choose an empty dir"
    )]
    ForeignState {
        /// The state dir.
        dir: PathBuf,
        /// The first entry tenure did not create.
        entry: OsString,
    },
    /// The identity marker exists but cannot be parsed.
    #[error(
        "{path}: identity is unreadable ({reason}); nothing was changed: restore it, or move it aside and adopt the dir with `tenure init --adopt`"
    )]
    IdentityUnreadable {
        /// The identity marker.
        path: PathBuf,
        /// Why it could not be parsed.
        reason: String,
    },
    /// The identity marker names another canonical path (the dir was moved or copied).
    #[error(
        "{path}: identity mismatch: the marker names {recorded} but the dir is {actual}; if it was moved on purpose, adopt it with `tenure init --adopt --dir {actual}`"
    )]
    IdentityMismatch {
        /// The identity marker.
        path: PathBuf,
        /// The path the marker records.
        recorded: PathBuf,
        /// The dir's canonical path now.
        actual: PathBuf,
    },
    /// A newer ownership exists: the caller's epoch is stale and its request has no effect.
    #[error(
        "{dir} is now owned at epoch {current}, newer than this owner's epoch {mine}; the request was rejected without effect"
    )]
    StaleEpoch {
        /// The state dir.
        dir: PathBuf,
        /// This owner's epoch.
        mine: u64,
        /// The epoch persisted now.
        current: u64,
    },
    /// A cluster lease's epoch is not above what the local dir records (issue 14).
    #[error(
        "{dir} records epoch {recorded}, not below the cluster lease's epoch {cluster}: this dir was used with another lease (a local one, or another cluster); give the cluster lease a state dir of its own"
    )]
    EpochAhead {
        /// The state dir.
        dir: PathBuf,
        /// The highest epoch the dir records.
        recorded: u64,
        /// The cluster's epoch for this ownership.
        cluster: u64,
    },
    /// A record (owner record, registry entry) cannot be parsed.
    #[error("{path} is corrupt ({reason}); nothing was changed: inspect it, then move it aside")]
    CorruptRecord {
        /// The record.
        path: PathBuf,
        /// Why it could not be parsed.
        reason: String,
    },
    /// An instance name that cannot be a registry entry name.
    #[error("{name:?} is not a valid instance name; use letters, digits, '-' and '_' (at most 64)")]
    BadInstanceName {
        /// The name given.
        name: String,
    },
    /// The epoch file is corrupt or cannot grow.
    #[error(transparent)]
    Epoch(#[from] epoch::EpochError),
    /// A file or directory of the state dir was refused or could not be accessed.
    #[error(transparent)]
    Fs(#[from] FsError),
    /// The identity of this process could not be read.
    #[error(transparent)]
    Identity(#[from] IdentityError),
    /// A cgroup of the workload could not be created or ended.
    #[error(transparent)]
    Cgroup(#[from] cgroup::CgroupError),
    /// Processes of a crashed owner's workload survived SIGKILL in its cgroup.
    #[error(
        "{dir}: {} of the workload of epoch {epoch} (cgroup {cgroup}) survived SIGKILL; refusing to start another workload beside it: find out why it cannot die (a process stuck in the kernel, e.g. on a dead FUSE or NFS mount), then run again",
        PidList(.pids)
    )]
    LeftoversSurvived {
        /// The state dir.
        dir: PathBuf,
        /// The epoch of the crashed owner.
        epoch: u64,
        /// Its cgroup.
        cgroup: PathBuf,
        /// The processes that survived SIGKILL.
        pids: Vec<u32>,
    },
    /// The lock syscall failed for a reason other than contention.
    #[error("cannot lock {path}: {source}; check that the filesystem supports flock")]
    Lock {
        /// The lock file.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// An error of a lease plan whose state a model copied (the copy reports what the original
    /// said; see [`plan::Failure::into_error`]).
    #[error("{message}")]
    Replayed {
        /// What the original error said.
        message: String,
        /// Whether the original was a refusal (of state tenure does not understand).
        refusal: bool,
    },
    /// Waiting for the lock failed (inotify or poll).
    #[error(
        "cannot wait for {path}: {source}; check the inotify limits (fs.inotify.max_user_instances)"
    )]
    Wait {
        /// The lock file.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: io::Error,
    },
}

impl LeaseError {
    /// True when the dir's state is refused (foreign, moved, corrupt, permissive, a stale
    /// epoch): the "refused state" exit code, nothing changed. False for contention,
    /// cancellation and operating-system failures.
    pub fn is_refusal(&self) -> bool {
        match self {
            LeaseError::ForeignState { .. }
            | LeaseError::IdentityUnreadable { .. }
            | LeaseError::IdentityMismatch { .. }
            | LeaseError::CorruptRecord { .. }
            | LeaseError::Moved { .. }
            | LeaseError::StaleEpoch { .. }
            | LeaseError::EpochAhead { .. }
            | LeaseError::BadInstanceName { .. }
            | LeaseError::Epoch(_) => true,
            LeaseError::Fs(fs) => fs.is_refusal(),
            LeaseError::Replayed { refusal, .. } => *refusal,
            LeaseError::Busy { .. }
            | LeaseError::Cancelled { .. }
            | LeaseError::Identity(_)
            | LeaseError::Cgroup(_)
            | LeaseError::LeftoversSurvived { .. }
            | LeaseError::Lock { .. }
            | LeaseError::Wait { .. } => false,
        }
    }
}

/// Formats pids for messages: `pid 7`, `pids 7, 9`.
struct PidList<'a>(&'a [u32]);

impl fmt::Display for PidList<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let list: Vec<String> = self.0.iter().map(u32::to_string).collect();
        let word = if self.0.len() == 1 { "pid" } else { "pids" };
        write!(f, "{word} {}", list.join(", "))
    }
}

/// Formats the owner part of contention messages: `owner pid N, epoch E`.
struct OwnerPart<'a>(Option<&'a OwnerRecord>);

impl fmt::Display for OwnerPart<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            Some(r) => write!(f, "owner pid {}, epoch {}", r.identity.pid, r.epoch),
            None => f.write_str("owner unknown"),
        }
    }
}

/// How long `acquire` may wait for a held lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WaitBound {
    /// Try once; `busy` if held.
    Try,
    /// Wait at most this long (`Duration::ZERO` behaves as `Try`; a bound too large for the
    /// clock, such as `Duration::MAX`, as `Forever`).
    For(Duration),
    /// Wait until the lease is ours or the wait is cancelled.
    Forever,
}

impl WaitBound {
    /// `None` = forever, `Some(ZERO)` = try once, else a bound.
    pub fn from_option(d: Option<Duration>) -> WaitBound {
        match d {
            None => WaitBound::Forever,
            Some(d) if d.is_zero() => WaitBound::Try,
            Some(d) => WaitBound::For(d),
        }
    }
}

/// Options of [`acquire`].
#[derive(Debug, Clone, Copy)]
pub struct AcquireOptions<'a> {
    /// How long to wait for a held lease.
    pub wait: WaitBound,
    /// A descriptor whose readability cancels the wait (e.g. the read end of a signal pipe).
    /// It is polled, never read.
    pub cancel: Option<BorrowedFd<'a>>,
    /// The phase written into the owner record on acquisition (normally `Recovering`).
    pub phase: PhaseKind,
    /// A cluster lease's epoch (issue 14): this ownership's epoch is exactly this value — the
    /// cluster's fencing revision — instead of one above what the dir records; refused
    /// ([`LeaseError::EpochAhead`]) if the dir records this epoch or a later one.
    pub fence: Option<u64>,
}

impl Default for AcquireOptions<'_> {
    fn default() -> Self {
        AcquireOptions {
            wait: WaitBound::Forever,
            cancel: None,
            phase: PhaseKind::Recovering,
            fence: None,
        }
    }
}

/// What `on_wait` is told when the lease is found held.
#[derive(Debug, Clone)]
pub struct Contention {
    /// The state dir.
    pub dir: PathBuf,
    /// The current owner record, when readable (it is evidence: it may name a previous owner).
    pub owner: Option<OwnerRecord>,
}

impl fmt::Display for Contention {
    /// `waiting for DIR (owner pid N, epoch E, since T)`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.owner {
            Some(r) => write!(
                f,
                "waiting for {} (owner pid {}, epoch {}, since {})",
                self.dir.display(),
                r.identity.pid,
                r.epoch,
                format_unix_ms(r.acquired_at)
            ),
            None => write!(f, "waiting for {} (owner unknown)", self.dir.display()),
        }
    }
}

/// Reads a record file of the control folder whole; `Ok(None)` when absent. A file far larger
/// than any record is corrupt (named), not read.
fn read_record_bytes(dir: &Dir, name: &str) -> Result<Option<Vec<u8>>, LeaseError> {
    match dir.read_optional(name, MAX_RECORD) {
        Ok(b) => Ok(b),
        Err(FsError::TooLarge { path, len, .. }) => Err(LeaseError::CorruptRecord {
            path,
            reason: format!("{len} bytes, far larger than any record tenure writes"),
        }),
        Err(e) => Err(e.into()),
    }
}

/// Reads and parses a JSON record of the control folder; `Ok(None)` when absent.
fn read_json<T: DeserializeOwned>(dir: &Dir, name: &str) -> Result<Option<T>, LeaseError> {
    let Some(bytes) = read_record_bytes(dir, name)? else {
        return Ok(None);
    };
    record::parse(&bytes)
        .map(Some)
        .map_err(|reason| LeaseError::CorruptRecord {
            path: dir.child_path(name),
            reason,
        })
}

use plan::{is_ours, to_json};

fn check_version(path: PathBuf, version: u32) -> Result<(), LeaseError> {
    if version == RECORD_VERSION {
        Ok(())
    } else {
        Err(LeaseError::CorruptRecord {
            path,
            reason: format!("format version {version}, this tenure reads {RECORD_VERSION}"),
        })
    }
}

/// Reads the identity marker: `Ok(None)` when absent; an unparsable one is `identity is
/// unreadable`.
fn read_marker(control: &Dir) -> Result<Option<DirIdentity>, LeaseError> {
    match read_json::<DirIdentity>(control, IDENTITY_FILE) {
        Ok(Some(m)) if m.version != RECORD_VERSION => Err(LeaseError::IdentityUnreadable {
            path: control.child_path(IDENTITY_FILE),
            reason: format!("format version {}", m.version),
        }),
        Ok(m) => Ok(m),
        Err(LeaseError::CorruptRecord { path, reason }) => {
            Err(LeaseError::IdentityUnreadable { path, reason })
        }
        Err(e) => Err(e),
    }
}

/// Reads the owner record file in either format ([`record::decode_owner`]); `Ok(None)` when
/// absent, empty or torn. A read that raced the owner's rewrite of the slot (its checksum does
/// not match) is retried a few times before the slot is taken for torn.
fn read_stored_owner(control: &Dir) -> Result<Option<OwnerRecord>, LeaseError> {
    let mut tries = 0;
    loop {
        let Some(bytes) = read_record_bytes(control, OWNER_FILE)? else {
            return Ok(None);
        };
        if !record::owner_is_whole(&bytes) && tries < 3 {
            tries += 1;
            std::thread::yield_now();
            continue;
        }
        return record::decode_owner(&bytes).map_err(|reason| LeaseError::CorruptRecord {
            path: control.child_path(OWNER_FILE),
            reason,
        });
    }
}

/// Reads the owner record: `Ok(None)` when absent; corrupt is an error naming the file (L10).
fn read_owner(control: &Dir) -> Result<Option<OwnerRecord>, LeaseError> {
    // Empty: a power loss took the data of a record written without a sync (issue 11); it
    // spoke for processes the power loss ended, so it is absent (as in the plans' inspection).
    if control
        .read_optional(OWNER_FILE, MAX_RECORD)
        .is_ok_and(|b| b.is_some_and(|b| b.is_empty()))
    {
        return Ok(None);
    }
    let rec = read_stored_owner(control)?;
    if let Some(r) = &rec {
        check_version(control.child_path(OWNER_FILE), r.version)?;
    }
    Ok(rec)
}

/// Checks read-only that `dir` holds state a contender would accept: the refusals of
/// acquisition (foreign, moved or corrupt state, card L8) without creating anything, for front
/// ends such as `tenure up` that would otherwise write their own files into a refused dir.
pub fn check(dir: &StateDir) -> Result<(), LeaseError> {
    let mut lock = exec::LockIo::default();
    let mut plan = plan::Check::new(plan::CheckSteps::new(dir.path().to_path_buf()));
    plan::run(&mut plan, &mut exec::Real::new(dir, &mut lock)).map_err(plan::Failure::into_error)
}

/// Reads the owner record for a contention message; any problem just means "unknown".
fn owner_best_effort(control: &Dir) -> Option<OwnerRecord> {
    read_owner(control).ok().flatten()
}

/// Takes the lease on `dir` (see the module docs for the order of steps). `on_wait` is called
/// once, when the lease is found held and the caller is about to wait (never for
/// [`WaitBound::Try`]), so it can print the [`Contention`] and tell its machine.
pub fn acquire(
    dir: &StateDir,
    opts: &AcquireOptions<'_>,
    on_wait: &mut dyn FnMut(&Contention),
) -> Result<Lease, LeaseError> {
    acquire_for_workload(dir, opts, on_wait, false)
}

/// [`acquire`] for an owner that will run a workload of processes (the runner). With `cgroup`,
/// the ownership's cgroup (`tenure-<root id>-<epoch>`) is created under the lock and named in
/// the owner record the acquisition writes, so it is recorded before any process can enter it
/// and costs no record write of its own (take it with [`Lease::take_cgroup`]); where no cgroup
/// can be made, [`Lease::cgroup_error`] says why and the lease is returned without one.
///
/// The steps are the plan [`plan::Acquire`], run by the real executor: this function only
/// gathers what the plan must not read itself (the clock, random tokens, this process's
/// identity) and turns the plan's output into a [`Lease`].
pub fn acquire_for_workload(
    dir: &StateDir,
    opts: &AcquireOptions<'_>,
    on_wait: &mut dyn FnMut(&Contention),
    cgroup: bool,
) -> Result<Lease, LeaseError> {
    let deadline = match opts.wait {
        WaitBound::Try => Some(Instant::now()),
        // A bound too large for the clock is no bound (card H6).
        WaitBound::For(d) => Instant::now().checked_add(d),
        WaitBound::Forever => None,
    };
    let mut token = [0u8; 16];
    crate::privfs::random_bytes(&mut token)?;
    let mut fresh_root = [0u8; 16];
    crate::privfs::random_bytes(&mut fresh_root)?;
    // Recorded in the owner record, the waiter entry and the registry: refused here, before
    // anything is written, if it cannot be.
    let me = Identity::of_self()?;
    me.recordable()?;
    let input = plan::AcquireInput {
        path: dir.path().to_path_buf(),
        me,
        now: now_ms(),
        token: Token(token),
        fresh_root: Token(fresh_root),
        phase: opts.phase,
        cgroup,
        fence: opts.fence,
        session: epoch::session(dir),
        epoch_batch: epoch::BATCH,
    };
    let mut lock = exec::LockIo::default();
    let acquired = {
        let mut real = exec::Real::new(dir, &mut lock);
        real.cancel = opts.cancel;
        real.deadline = deadline;
        real.on_wait = Some(on_wait);
        plan::run(
            &mut plan::Acquire::new(plan::AcquireSteps::new(input)),
            &mut real,
        )
    }
    .map_err(plan::Failure::into_error)?;
    let cgroup = lock.cgroup.take();
    Ok(Lease {
        state: dir.try_clone()?,
        lock,
        record: acquired.record,
        orphans: acquired.orphans,
        orphan_entries: acquired.orphan_entries,
        rewound: acquired.rewound,
        previous: acquired.previous,
        root_id: acquired.root_id,
        leftovers: acquired.leftovers,
        cgroup,
        cgroup_error: acquired.cgroup_error,
        instances: Vec::new(),
    })
}

fn waiter_liveness(waiters: &Dir, name: &str) -> Liveness {
    if let Ok(Some(rec)) = read_json::<WaiterRecord>(waiters, name) {
        return rec.identity.liveness();
    }
    match record::waiter_entry_name(name) {
        Some((pid, start)) => match Identity::of_pid(pid) {
            Ok(now) if now.start_time == start => Liveness::Live,
            Ok(_) => Liveness::Recycled,
            Err(_) => Liveness::Dead,
        },
        None => Liveness::Dead,
    }
}

/// An acquired lease. Dropping it without [`Lease::release`] unlocks (the kernel lock is the
/// ownership) but leaves the record as it was, which `status` then shows as stale.
#[derive(Debug)]
pub struct Lease {
    state: StateDir,
    lock: exec::LockIo,
    record: OwnerRecord,
    orphans: Vec<RegistryRecord>,
    /// The registry entry names of `orphans`.
    orphan_entries: Vec<String>,
    rewound: Option<epoch::Rewound>,
    previous: Option<OwnerRecord>,
    root_id: Token,
    leftovers: Vec<u32>,
    cgroup: Option<cgroup::Cgroup>,
    cgroup_error: Option<String>,
    /// The instance entries this ownership registered and did not unregister (vacated by the
    /// release without listing the folder).
    instances: Vec<String>,
}

fn valid_instance_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

impl Lease {
    /// The epoch of this ownership.
    pub fn epoch(&self) -> u64 {
        self.record.epoch
    }

    /// The random token of this ownership.
    pub fn token(&self) -> Token {
        self.record.token
    }

    /// The owner record as last written.
    pub fn record(&self) -> &OwnerRecord {
        &self.record
    }

    /// The state dir this lease owns.
    pub fn state_dir(&self) -> &StateDir {
        &self.state
    }

    /// Live instances registered by an earlier owner that crashed (found at acquisition).
    pub fn orphans(&self) -> &[RegistryRecord] {
        &self.orphans
    }

    /// Set when the epoch file was behind an epoch the dir recorded elsewhere (card P3): the
    /// epoch of this ownership skipped past it. Callers warn about it in one line.
    pub fn rewound(&self) -> Option<&epoch::Rewound> {
        self.rewound.as_ref()
    }

    /// Runs one of this lease's plans on its descriptors.
    fn run<P: plan::Plan>(&mut self, plan: &mut P) -> P::Output {
        plan::run(plan, &mut exec::Real::new(&self.state, &mut self.lock))
    }

    /// Rewrites the owner record with a new phase (card H8; the plan [`plan::SetPhase`]): its
    /// slot in place, no sync (issue 11). A reader trusts the slot only when its checksum
    /// matches (and rereads one it raced); after a power loss the record may show an earlier
    /// phase or be gone,
    /// of an owner that no longer holds the lock, which `status` reports as stale anyway.
    pub fn set_phase(&mut self, phase: PhaseKind) -> Result<(), LeaseError> {
        let mut next = self.record.clone();
        next.phase = phase;
        self.run(&mut plan::SetPhase::new(plan::SetPhaseSteps::new(&next)))
            .map_err(plan::Failure::into_error)?;
        self.record = next;
        Ok(())
    }

    /// Registers a process the owner runs (e.g. the supervised child) under `name`: its slot
    /// `registry/instances/<name>.slot` is overwritten in place (created the first time). The
    /// entry is vacated by [`Lease::unregister_instance`] or [`Lease::release`], or by the next
    /// owner once the process is dead. Stop the [orphans](Lease::orphans) first
    /// ([`Lease::stop_orphans`]), as the runner does: an orphan registered under the same name
    /// has its entry in the same slot, which a registration overwrites.
    pub fn register_instance(&mut self, name: &str, identity: &Identity) -> Result<(), LeaseError> {
        if !valid_instance_name(name) {
            return Err(LeaseError::BadInstanceName {
                name: name.to_owned(),
            });
        }
        identity.recordable()?;
        let rec = RegistryRecord {
            version: RECORD_VERSION,
            epoch: self.record.epoch,
            token: self.record.token,
            name: name.to_owned(),
            identity: identity.clone(),
            since: now_ms(),
            root_id: self.record.root_id,
        };
        // Recorded before the write: a write that failed halfway may have left the entry.
        let entry = record::instance_entry(name);
        if !self.instances.contains(&entry) {
            self.instances.push(entry);
        }
        self.run(&mut plan::Register::new(plan::RegisterSteps::new(&rec)))
            .map_err(plan::Failure::into_error)
    }

    /// Removes an instance entry of this ownership: its slot is vacated in place (absent is
    /// fine).
    pub fn unregister_instance(&mut self, name: &str) -> Result<(), LeaseError> {
        if !valid_instance_name(name) {
            return Err(LeaseError::BadInstanceName {
                name: name.to_owned(),
            });
        }
        let entry = record::instance_entry(name);
        self.run(&mut plan::Remove::new(plan::RemoveSteps::vacate(
            plan::Loc::Instances,
            entry.clone(),
            "lease.registry",
        )))
        .map_err(plan::Failure::into_error)?;
        self.instances.retain(|e| *e != entry);
        Ok(())
    }

    /// Stops the live orphans an earlier, crashed owner left running (its supervised child
    /// outlived it, e.g. in the instant before the child's parent-death signal): each gets
    /// SIGKILL through the identity-checked pidfd path (a recycled pid is never signalled) and
    /// is waited for up to `bound`; its registry entry is then removed. Returns the pids it
    /// stopped, or the orphan still alive at the bound: two workloads on one state dir must
    /// never run at once, so the caller refuses to start its own.
    pub fn stop_orphans(&mut self, bound: Duration) -> Result<Vec<u32>, Box<RegistryRecord>> {
        let mut stop = plan::StopOrphans::new(plan::StopOrphansSteps::new(
            std::mem::take(&mut self.orphans),
            std::mem::take(&mut self.orphan_entries),
        ));
        let mut real = exec::Real::new(&self.state, &mut self.lock);
        real.orphan_bound = bound;
        plan::run(&mut stop, &mut real)
    }

    /// Orderly release (the plan [`plan::Release`]): removes this owner's registry entries,
    /// rewrites the owner record with phase `released`, then unlocks. The lock is released
    /// even when a step fails; the first error is returned.
    pub fn release(mut self) -> Result<(), LeaseError> {
        let mut next = self.record.clone();
        next.phase = PhaseKind::Released;
        let registered = std::mem::take(&mut self.instances);
        self.run(&mut plan::Release::new(plan::ReleaseSteps::with_instances(
            &next, registered,
        )))
        .map_err(plan::Failure::into_error)
    }

    /// The descriptor holding the kernel lock, e.g. to check in a test that it is `O_CLOEXEC`.
    pub fn lock_fd(&self) -> Option<BorrowedFd<'_>> {
        self.lock.guard.as_ref().and_then(|g| g.fd())
    }

    /// A duplicate of the lock descriptor for the workload to inherit, where no cgroup contains
    /// it (card T2): the lock belongs to the open file description, so the kernel keeps the dir
    /// locked while any process of the workload still has a copy open, even after this process
    /// was SIGKILLed (as `flock(1)` without `-o` does). The duplicate is `O_CLOEXEC` here; the
    /// child clears the flag on its copy before it execs. From now on only [`Lease::release`]
    /// unlocks — dropping the lease merely closes this process's descriptor — since `LOCK_UN`
    /// through any copy would unlock every copy while the workload may still run. The owner
    /// record says so ([`Containment::LockFd`]) from its next rewrite on (the next phase): it is
    /// evidence for `status` only, since a successor needs nothing from it.
    pub fn share_lock(&mut self) -> Result<OwnedFd, LeaseError> {
        let path = self.state.path().join(CONTROL_DIR).join(LOCK_FILE);
        let dup = match self.lock.guard.as_mut() {
            Some(g) => g.share(),
            None => Err(io::Error::other("the lease was already released")),
        }
        .map_err(|source| LeaseError::Lock { path, source })?;
        self.record.containment = Some(Containment::LockFd);
        Ok(dup)
    }

    /// The cgroup [`acquire_for_workload`] created and recorded (once; the caller owns it).
    pub fn take_cgroup(&mut self) -> Option<cgroup::Cgroup> {
        self.cgroup.take()
    }

    /// Why [`acquire_for_workload`] could not create a cgroup, when it was asked to.
    pub fn cgroup_error(&self) -> Option<&str> {
        self.cgroup_error.as_deref()
    }

    /// The state dir's root id (from its identity marker), which names this ownership's cgroup.
    pub fn root_id(&self) -> Token {
        self.root_id
    }

    /// The owner record of the ownership before this one, as found at acquisition.
    pub fn previous(&self) -> Option<&OwnerRecord> {
        self.previous.as_ref()
    }

    /// The processes of a crashed owner's workload this acquisition ended (card T2), before it
    /// replaced that owner's record.
    pub fn leftovers_ended(&self) -> &[u32] {
        &self.leftovers
    }
}

/// Reads the persisted epoch of a state dir without taking the lock and without writing: 0 when
/// no owner ever acquired it. The checkpoint store refuses to publish when this is newer than the
/// publisher's epoch (card H5).
pub fn read_epoch(dir: &StateDir) -> Result<u64, LeaseError> {
    match dir.root().open_dir_optional(CONTROL_DIR)? {
        None => Ok(0),
        Some(control) => Ok(epoch::read(&control)?),
    }
}

/// Fencing (card H5): `Ok` when `epoch` is still the newest ownership of `dir`, else
/// [`LeaseError::StaleEpoch`]. Read-only; callers check right before an effect (publishing a
/// checkpoint, retiring) that a stale owner must not have.
pub fn check_epoch(dir: &StateDir, epoch: u64) -> Result<(), LeaseError> {
    let current = read_epoch(dir)?;
    if epoch::fence(epoch, current) == Err(epoch::Fenced::Stale) {
        return Err(LeaseError::StaleEpoch {
            dir: dir.path().to_path_buf(),
            mine: epoch,
            current,
        });
    }
    Ok(())
}

/// A waiter as `status` sees it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct WaiterStatus {
    /// The entry's file name.
    pub entry: String,
    /// The entry's content, when readable.
    pub record: Option<WaiterRecord>,
    /// Whether the waiting process is still alive.
    pub liveness: Liveness,
}

/// A registry entry as `status` sees it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RegistryStatus {
    /// `leases` or `instances`.
    pub kind: &'static str,
    /// The entry's file name.
    pub entry: String,
    /// The entry's content, when readable.
    pub record: Option<RegistryRecord>,
}

/// The ownership state `status` derives from the lock probe and the owner record.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum OwnerState {
    /// Nobody ever owned the dir, and nobody holds the lock.
    Cold,
    /// The lock is held but the record does not (yet) name the holder: an acquisition is in
    /// progress.
    Acquiring,
    /// A live owner holds the lock; its record's phase.
    Owned(PhaseKind),
    /// The last owner released in order.
    Released,
    /// The record names an owner that no longer holds the lock (it crashed or dropped the lease).
    Stale,
}

/// What [`status`] found.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct LeaseStatus {
    /// The state dir.
    pub dir: PathBuf,
    /// The persisted epoch (0 when never acquired).
    pub epoch: u64,
    /// Whether some process holds the kernel lock right now.
    pub held: bool,
    /// The owner record, when present.
    pub owner: Option<OwnerRecord>,
    /// Whether the recorded owner process is alive.
    pub owner_liveness: Option<Liveness>,
    /// The directory identity marker, when present.
    pub identity: Option<DirIdentity>,
    /// Processes waiting for the lease.
    pub waiters: Vec<WaiterStatus>,
    /// Registry entries.
    pub registry: Vec<RegistryStatus>,
}

impl LeaseStatus {
    /// The ownership state derived from the lock probe and the owner record.
    pub fn state(&self) -> OwnerState {
        match (&self.owner, self.held) {
            (None, false) => OwnerState::Cold,
            (None, true) => OwnerState::Acquiring,
            (Some(r), held) => match r.phase {
                PhaseKind::Released => OwnerState::Released,
                PhaseKind::Cold
                | PhaseKind::Recovering
                | PhaseKind::Ready
                | PhaseKind::Draining
                | PhaseKind::Cancelled
                | PhaseKind::Refused => {
                    if !held {
                        OwnerState::Stale
                    } else if self.owner_liveness == Some(Liveness::Live) {
                        OwnerState::Owned(r.phase)
                    } else {
                        OwnerState::Acquiring
                    }
                }
            },
        }
    }
}

/// Reads the lease state of `dir` without taking the lock and without writing anything. Usable
/// from any process while an owner runs: the lock probe is a shared non-blocking attempt on a
/// separate open file description, released at once, which never disturbs the owner. A corrupt
/// owner record or marker is an error (an invalid registration fails closed, card H8); unreadable
/// waiter and registry entries are listed without content.
pub fn status(dir: &StateDir) -> Result<LeaseStatus, LeaseError> {
    let mut st = LeaseStatus {
        dir: dir.path().to_path_buf(),
        epoch: 0,
        held: false,
        owner: None,
        owner_liveness: None,
        identity: None,
        waiters: Vec::new(),
        registry: Vec::new(),
    };
    let Some(control) = dir.root().open_dir_optional(CONTROL_DIR)? else {
        return Ok(st);
    };
    // The lock first, then the records: an owner writes its released record before it
    // unlocks, so a lock seen free means the record read after it is the final one (read the
    // other way round, a release falling between the two reads looks like an owner that ended
    // without one).
    if let Some(lock_file) = control.open_file_optional(LOCK_FILE)? {
        st.held = probe(&lock_file, &control.child_path(LOCK_FILE))?;
    }
    st.epoch = epoch::read(&control)?;
    st.identity = read_marker(&control)?;
    st.owner = read_owner(&control)?;
    st.owner_liveness = st.owner.as_ref().map(|r| r.identity.liveness());
    if let Some(waiters) = control.open_dir_optional(WAITERS_DIR)? {
        for e in waiters.entries()? {
            let entry = e.name.to_string_lossy().into_owned();
            if entry.starts_with(crate::privfs::TEMP_PREFIX) {
                continue;
            }
            let record = read_json::<WaiterRecord>(&waiters, &entry).ok().flatten();
            let liveness = waiter_liveness(&waiters, &entry);
            st.waiters.push(WaiterStatus {
                entry,
                record,
                liveness,
            });
        }
    }
    if let Some(registry) = control.open_dir_optional(REGISTRY_DIR)? {
        for kind in [LEASES_DIR, INSTANCES_DIR] {
            let Some(d) = registry.open_dir_optional(kind)? else {
                continue;
            };
            for e in d.entries()? {
                let entry = e.name.to_string_lossy().into_owned();
                if entry.starts_with(crate::privfs::TEMP_PREFIX) {
                    continue;
                }
                let record = if record::is_registry_slot(&entry) {
                    match read_registry_slot(&d, &entry) {
                        // Vacant: the process is gone, or the ownership released.
                        Slot::Vacant => continue,
                        // The owner entry of an ownership that ended (its release leaves the
                        // entry for the next owner to overwrite).
                        Slot::Entry(r)
                            if kind == LEASES_DIR && owner_entry_ended(&st.owner, &r) =>
                        {
                            continue;
                        }
                        Slot::Entry(r) => Some(r),
                        Slot::Unreadable => None,
                    }
                } else {
                    read_json::<RegistryRecord>(&d, &entry).ok().flatten()
                };
                st.registry.push(RegistryStatus {
                    kind,
                    entry,
                    record,
                });
            }
        }
    }
    Ok(st)
}

/// Whether the owner record `owner` says that the ownership the owner entry `entry` names has
/// ended: it released in order (a released record of its epoch: the release leaves the owner
/// entry in place for the next owner to overwrite), or a later ownership's record replaced its
/// own (a successor that has not yet overwritten the entry). An owner that crashed leaves a
/// record of its epoch that is not released, and its entry is shown.
fn owner_entry_ended(owner: &Option<OwnerRecord>, entry: &RegistryRecord) -> bool {
    owner.as_ref().is_some_and(|o| {
        entry.epoch < o.epoch || (entry.epoch == o.epoch && o.phase == PhaseKind::Released)
    })
}

/// What an in-place registry entry holds, as `status` reads it.
enum Slot {
    /// No entry: vacant, never written, or torn by a power loss.
    Vacant,
    /// An entry.
    Entry(RegistryRecord),
    /// A file that cannot be read, or a checksummed entry that does not parse.
    Unreadable,
}

/// Reads an in-place registry entry ([`record::decode_registry_slot`]); a read that raced the
/// owner's rewrite of the slot is retried a few times before the slot is taken for torn.
fn read_registry_slot(dir: &Dir, name: &str) -> Slot {
    let mut tries = 0;
    loop {
        let Ok(Some(bytes)) = read_record_bytes(dir, name) else {
            return Slot::Unreadable;
        };
        if !record::registry_slot_is_whole(&bytes) && tries < 3 {
            tries += 1;
            std::thread::yield_now();
            continue;
        }
        return match record::decode_registry_slot(&bytes) {
            Ok(Some(r)) => Slot::Entry(r),
            Ok(None) => Slot::Vacant,
            Err(_) => Slot::Unreadable,
        };
    }
}

fn probe(lock_file: &File, path: &Path) -> Result<bool, LeaseError> {
    lock::probe_held(lock_file).map_err(|source| LeaseError::Lock {
        path: path.to_path_buf(),
        source,
    })
}

/// Explicitly adopts a state dir that acquisition refuses as foreign (entries but no marker) or
/// moved (a marker naming another path): under the lock (never waiting: `busy` if owned), writes
/// a marker for the dir's current canonical path, keeping the root id of a moved dir. This is the
/// only way past the L8 refusals; an unreadable marker is still refused (move it aside first).
/// A dir whose marker already names its path needs nothing: it is looked at, never written,
/// locked or created into, owned or not ([`Adoption::Unchanged`]).
pub fn adopt(dir: &StateDir) -> Result<Adoption, LeaseError> {
    // Read-only first: a marker is replaced whole (rename), so a look without the lock sees
    // one marker or another, and one naming this path is never rewritten by anyone.
    if let Some(control) = dir.root().open_dir_optional(CONTROL_DIR)?
        && let Some(m) = read_marker(&control)?
        && m.path == dir.path()
    {
        return Ok(Adoption::Unchanged(m));
    }
    let control = dir.root().ensure_dir(CONTROL_DIR, "lease.control")?;
    let lock_path = control.child_path(LOCK_FILE);
    let lock_file = control.open_or_create_file(LOCK_FILE, "lease.lock")?;
    let lock_err = |source| LeaseError::Lock {
        path: lock_path.clone(),
        source,
    };
    if !lock::try_lock(&lock_file).map_err(lock_err)? {
        std::thread::sleep(Duration::from_micros(200));
        if !lock::try_lock(&lock_file).map_err(lock_err)? {
            return Err(LeaseError::Busy {
                dir: dir.path().to_path_buf(),
                owner: owner_best_effort(&control).map(Box::new),
            });
        }
    }
    let guard = lock::LockGuard::new(lock_file, lock_path.clone());
    let now = now_ms();
    let fresh = || -> Result<DirIdentity, LeaseError> {
        let mut root_id = [0u8; 16];
        crate::privfs::random_bytes(&mut root_id)?;
        Ok(DirIdentity {
            version: RECORD_VERSION,
            root_id: Token(root_id),
            path: dir.path().to_path_buf(),
            created_at: now,
            adopted_at: Some(now),
        })
    };
    let marker = match read_marker(&control)? {
        Some(m) if m.path == dir.path() => return Ok(Adoption::Unchanged(m)),
        // The dir was copied (`cp -a a a.copy`): the original still holds the same identity at
        // its path, so the copy becomes a dir of its own (card P4).
        Some(m) if still_holds(&m) => fresh()?,
        // Moved: the identity moves with it.
        Some(m) => DirIdentity {
            path: dir.path().to_path_buf(),
            adopted_at: Some(now),
            ..m
        },
        None => fresh()?,
    };
    control.replace_durable(IDENTITY_FILE, &to_json(&marker), "lease.marker")?;
    clear_foreign_records(&control, marker.root_id)?;
    guard.unlock().map_err(lock_err)?;
    Ok(Adoption::Adopted(marker))
}

/// What [`adopt`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Adoption {
    /// The marker already named the dir's path: nothing was written.
    Unchanged(DirIdentity),
    /// A marker for the dir's path was written (a dir with no marker, or moved, or copied).
    Adopted(DirIdentity),
}

impl Adoption {
    /// The marker now in place.
    pub fn marker(&self) -> &DirIdentity {
        match self {
            Adoption::Unchanged(m) | Adoption::Adopted(m) => m,
        }
    }
}

/// Whether the dir a marker names still exists at its recorded path with the same root id.
fn still_holds(m: &DirIdentity) -> bool {
    let Ok(other) = StateDir::open(&m.path, false) else {
        return false;
    };
    let Ok(Some(control)) = other.root().open_dir_optional(CONTROL_DIR) else {
        return false;
    };
    matches!(read_marker(&control), Ok(Some(o)) if o.root_id == m.root_id)
}

/// Removes the records an adopted dir holds of another identity (card P4): the owner record,
/// registry entries and waiter entries that do not carry `root_id` name processes of the dir
/// they were copied from, and must never be signalled or shown as this dir's. Called under the
/// lock by [`adopt`], the explicit act that makes the dir this identity's.
fn clear_foreign_records(control: &Dir, root_id: Token) -> Result<(), LeaseError> {
    let gone_ok = |r: Result<(), FsError>| match r {
        Ok(()) | Err(FsError::NotFound { .. }) => Ok(()),
        Err(e) => Err(LeaseError::from(e)),
    };
    if let Ok(Some(o)) = read_stored_owner(control)
        && !is_ours(o.root_id, root_id)
    {
        gone_ok(control.unlink(OWNER_FILE, "lease.adopt"))?;
    }
    if let Some(registry) = control.open_dir_optional(REGISTRY_DIR)? {
        for kind in [LEASES_DIR, INSTANCES_DIR] {
            let Some(d) = registry.open_dir_optional(kind)? else {
                continue;
            };
            for e in d.entries()? {
                let name = e.name.to_string_lossy();
                let rec = if record::is_registry_slot(&name) {
                    match read_registry_slot(&d, &name) {
                        Slot::Entry(r) => Some(r),
                        Slot::Vacant | Slot::Unreadable => None,
                    }
                } else {
                    read_json::<RegistryRecord>(&d, &name).ok().flatten()
                };
                if !rec.is_some_and(|r| is_ours(r.root_id, root_id)) {
                    gone_ok(d.unlink(&e.name, "lease.adopt"))?;
                }
            }
        }
    }
    // Waiter entries name processes waiting for the dir they were written in.
    if let Some(w) = control.open_dir_optional(WAITERS_DIR)? {
        for e in w.entries()? {
            gone_ok(w.unlink(&e.name, "lease.adopt"))?;
        }
    }
    control.sync("lease.adopt")?;
    Ok(())
}

/// The epoch of an ownership under a cluster lease (issue 14): the cluster's fencing revision
/// `cluster`, which must not be below `next_local`, the next epoch the local dir would grant
/// (else `Err` with the epoch the dir records: the dir was used with another lease). The
/// acquisition plan ([`plan::AcquireSteps`]) and the cluster model (models/src/cluster.rs)
/// grant epochs through this function.
pub fn fenced_epoch(next_local: u64, cluster: u64) -> Result<u64, u64> {
    // Mutant: the epoch taken from the local dir's counter instead of the cluster's revision.
    if crate::mutant::on("cluster-epoch-local-counter") {
        return Ok(next_local);
    }
    if cluster >= next_local {
        Ok(cluster)
    } else {
        Err(next_local - 1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use record::{RECORD_VERSION, RegistryRecord, Token};

    fn someone(pid: u32) -> Identity {
        Identity {
            pid,
            start_time: 1,
            exe: PathBuf::from("/usr/bin/tenure"),
            pidfs_ino: None,
        }
    }

    fn owner(epoch: u64, phase: PhaseKind) -> OwnerRecord {
        OwnerRecord {
            version: RECORD_VERSION,
            token: Token([epoch as u8; 16]),
            epoch,
            acquired_at: 0,
            phase,
            identity: someone(10 + epoch as u32),
            root_id: None,
            containment: None,
        }
    }

    fn owner_entry(epoch: u64) -> RegistryRecord {
        RegistryRecord {
            version: RECORD_VERSION,
            epoch,
            token: Token([epoch as u8; 16]),
            name: "owner".into(),
            identity: someone(10 + epoch as u32),
            since: 0,
            root_id: None,
        }
    }

    /// Card H8: what `status` hides of `registry/leases/owner.slot`: the entry of an ownership that
    /// released in order (its release leaves the entry for the next owner to overwrite), and
    /// the entry of an ownership a later one replaced (a successor between its owner record and
    /// its own entry, e.g. after a crash). The entry of the current ownership, and of one that
    /// crashed (its record not released, no successor yet), are shown; so is any entry when no
    /// owner record can be read.
    #[test]
    fn status_hides_the_owner_entries_of_ended_ownerships_only() {
        let ended = |o: Option<OwnerRecord>, e: u64| owner_entry_ended(&o, &owner_entry(e));
        // Released in order.
        assert!(ended(Some(owner(3, PhaseKind::Released)), 3));
        // Superseded: a later ownership's record, in any phase, before it rewrote the entry.
        for phase in [
            PhaseKind::Recovering,
            PhaseKind::Ready,
            PhaseKind::Draining,
            PhaseKind::Released,
        ] {
            assert!(ended(Some(owner(4, phase)), 3), "{phase:?}");
        }
        // The current ownership's own entry, or a crashed one's (not released).
        for phase in [PhaseKind::Recovering, PhaseKind::Ready, PhaseKind::Draining] {
            assert!(!ended(Some(owner(3, phase)), 3), "{phase:?}");
        }
        // An entry newer than the record (the record of an older ownership still in place,
        // e.g. rewound): shown, never hidden by an older record.
        assert!(!ended(Some(owner(3, PhaseKind::Released)), 4));
        assert!(!ended(Some(owner(3, PhaseKind::Ready)), 4));
        // No owner record: nothing says the entry ended.
        assert!(!ended(None, 3));
    }
}

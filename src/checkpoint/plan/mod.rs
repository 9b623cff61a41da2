//! The store's protocols as data (design.md, "Protocols as data"; issue 12): the owned open
//! ([`OpenPlan`]), the publish ([`PublishPlan`], fenced by the epoch, with the GC of
//! [`GcPlan`] after its acknowledgement), the load and verify ([`LoadPlan`]) and the retention
//! of a failed publish's output ([`KeepFailedPlan`]) are pure step machines. Each yields one
//! [`crate::fsop::Step`] at a time ([`Plan::poll`]) and consumes its result
//! ([`Plan::handle`]); `store.rs` runs them on the real filesystem through
//! [`crate::privfs::Exec`], and the checkpoint model runs the very same plans on the models'
//! crash filesystem, with a crash possible between any two steps.
//!
//! Rules every plan keeps: it owns no descriptor (only [`crate::fsop::Fd`] numbers the executor
//! handed out); every durability step is an op of its own (`Fsync`, `SyncDir`, `SyncFs`), never
//! hidden in a helper; time, randomness and the inputs of a publish come in as data; memory
//! does not grow with the number of files (manifests are streamed through
//! [`super::format::ManifestParser`] a chunk at a time, inputs are taken one at a time, the
//! blobs of a publish are moved by listing their directory a page at a time). Every plan is
//! `Clone + Eq + Hash`, so a model state can hold it.

mod failed;
mod gc;
mod load;
mod open;
mod publish;

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use sha2::Digest as _;
use sha2::digest::common::hazmat::SerializableState;

pub use failed::KeepFailedPlan;
pub use gc::GcPlan;
pub use load::{LoadPlan, Loaded};
pub(crate) use load::{blob_mismatch, check_blob};
pub use open::{OpenPlan, SPARE_STAGING, StagingPlan};
pub use publish::{Input, OWN_FSYNC_MIN, PublishPlan, Src};

use super::error::CheckpointError;
use super::format::{CheckpointId, Digest};
use super::{BLOBS_DIR, CURRENT_FILE, MANIFESTS_DIR, SHA256_DIR};
use crate::fsop::{Done, Executor, Fd, Step};
use crate::privfs::FsError;

/// The scratch directory a publish writes its new blobs into before they are durable
/// (`checkpoints/incoming/`); only the owner's running publish uses it, and the owned open
/// removes what a crash left there.
pub const INCOMING_DIR: &str = "incoming";

/// Bytes of manifest lines a publish buffers before it writes them to the manifest's temp file.
pub const MANIFEST_SPILL: usize = 1 << 20;

/// Entries a plan asks for per listing step.
pub const LIST_PAGE: usize = 256;

/// What a plan wants next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Poll<'a> {
    /// Perform this step and hand its result to [`Plan::handle`].
    Op(Step<'a>),
    /// A read-and-verify step (`HashFile`) that may run beside the plan's other `Verify`
    /// steps, under this token: call [`Plan::dispatched`] once it is under way and hand its
    /// result to [`Plan::verified`]. A plan has at most its window of them outstanding.
    Verify(u64, Step<'a>),
    /// The publish wants its next input ([`PublishPlan::give_input`]).
    Input,
    /// Waiting for the result of an outstanding `Verify`.
    Wait,
    /// A publish into a shared store wants `CURRENT` moved to this by the cluster's pointer
    /// (its guarded transaction, issue 14): the executor's step, answered through
    /// [`PublishPlan::replaced`].
    Replace(super::format::Current),
    /// Finished; the output is ready.
    Done,
}

/// A protocol as a step machine.
pub trait Plan {
    /// The next thing the plan wants. Pure: asking twice gives the same answer.
    fn poll(&self) -> Poll<'_>;

    /// The result of the step [`Plan::poll`] gave as [`Poll::Op`]. An error ends the plan.
    fn handle(&mut self, result: Result<Done, FsError>) -> Result<(), CheckpointError>;

    /// The `Verify` step [`Plan::poll`] gave is under way.
    fn dispatched(&mut self) -> Result<(), CheckpointError> {
        unreachable!("this plan yields no verify steps")
    }

    /// The result of the `Verify` step issued under `token`. An error ends the plan.
    fn verified(
        &mut self,
        token: u64,
        result: Result<Done, FsError>,
    ) -> Result<(), CheckpointError> {
        let _ = (token, result);
        unreachable!("this plan yields no verify steps")
    }
}

/// Performs the plan's next step on `exec`, one at a time (`Verify` steps too): what the
/// models do at each step of their world, and the real store for plans without inputs.
/// Returns `Ok(false)` when the plan is done (or waits for an input).
pub fn step<P: Plan + ?Sized, E: Executor + ?Sized>(
    plan: &mut P,
    exec: &mut E,
) -> Result<bool, CheckpointError> {
    match plan.poll() {
        Poll::Op(step) => {
            let r = exec.run(step);
            plan.handle(r)?;
            Ok(true)
        }
        Poll::Verify(token, step) => {
            let r = exec.run(step);
            plan.dispatched()?;
            plan.verified(token, r)?;
            Ok(true)
        }
        Poll::Input | Poll::Done | Poll::Replace(_) => Ok(false),
        Poll::Wait => unreachable!("a plan run one step at a time never waits"),
    }
}

/// Runs a plan without inputs to its end, one step at a time.
pub fn run<P: Plan + ?Sized, E: Executor + ?Sized>(
    plan: &mut P,
    exec: &mut E,
) -> Result<(), CheckpointError> {
    while step(plan, exec)? {}
    Ok(())
}

/// The store's directories as a plan holds them: handles the executor opened.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct StoreFds {
    /// `checkpoints/`.
    pub root: Fd,
    /// `checkpoints/manifests/`.
    pub manifests: Fd,
    /// `checkpoints/blobs/sha256/`.
    pub blobs: Fd,
}

/// The store's path, for the messages of errors (every error names its file).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct StorePath(Arc<Path>);

impl StorePath {
    /// The store at `path` (`<state dir>/checkpoints`).
    pub fn new(path: impl Into<PathBuf>) -> StorePath {
        StorePath(Arc::from(path.into().into_boxed_path()))
    }

    /// The store directory.
    pub fn dir(&self) -> &Path {
        &self.0
    }

    /// `CURRENT`.
    pub fn current(&self) -> PathBuf {
        self.0.join(CURRENT_FILE)
    }

    /// A manifest file.
    pub fn manifest(&self, id: CheckpointId) -> PathBuf {
        self.0.join(MANIFESTS_DIR).join(id.manifest_file_name())
    }

    /// A blob file.
    pub fn blob(&self, d: &Digest) -> PathBuf {
        self.0.join(BLOBS_DIR).join(SHA256_DIR).join(d.to_hex())
    }

    /// A file directly in the store directory.
    pub fn child(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
}

/// A sha256 in progress that a plan can hold: compared and hashed by its serialised state.
#[derive(Clone, Default)]
pub struct HashState(sha2::Sha256);

impl HashState {
    /// Hashes more bytes.
    pub fn update(&mut self, bytes: &[u8]) {
        self.0.update(bytes);
    }

    /// The digest of the bytes so far.
    pub fn digest(&self) -> Digest {
        Digest(self.0.clone().finalize().into())
    }

    fn state(&self) -> impl AsRef<[u8]> {
        self.0.serialize()
    }
}

impl PartialEq for HashState {
    fn eq(&self, other: &HashState) -> bool {
        self.state().as_ref() == other.state().as_ref()
    }
}

impl Eq for HashState {}

impl std::hash::Hash for HashState {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.state().as_ref().hash(state);
    }
}

impl std::fmt::Debug for HashState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "HashState({})", self.digest())
    }
}

/// The handle a result carries; anything else is a protocol bug.
fn fd_of(done: &Done) -> Fd {
    done.fd()
        .unwrap_or_else(|| panic!("a handle was expected, the executor returned {done:?}"))
}

/// An op name for a string the plan holds.
fn os(s: &str) -> &OsStr {
    OsStr::new(s)
}

/// Where the sub-machine that opens a directory, creating it durably when missing, is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum EnsureAt {
    Open,
    Mkdir,
    SyncParent,
    Reopen,
}

/// Opens `parent/name`, creating it (0700) and syncing `parent` when it is missing: the
/// directory's entry is durable before anything is put in it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct Ensure {
    parent: Fd,
    name: &'static str,
    at: EnsureAt,
}

impl Ensure {
    fn new(parent: Fd, name: &'static str) -> Ensure {
        Ensure {
            parent,
            name,
            at: EnsureAt::Open,
        }
    }

    fn op(&self) -> crate::fsop::Op<'static> {
        use crate::fsop::Op;
        match self.at {
            EnsureAt::Open | EnsureAt::Reopen => Op::OpenDir {
                dir: self.parent,
                name: OsStr::new(self.name),
                any_mode: false,
            },
            EnsureAt::Mkdir => Op::Mkdir {
                dir: self.parent,
                name: OsStr::new(self.name),
            },
            EnsureAt::SyncParent => Op::SyncDir { dir: self.parent },
        }
    }

    /// The directory's handle once it is open.
    fn handle(&mut self, r: Result<Done, FsError>) -> Result<Option<Fd>, FsError> {
        match (self.at, r) {
            (EnsureAt::Open | EnsureAt::Reopen, Ok(d)) => Ok(Some(fd_of(&d))),
            (EnsureAt::Open, Err(FsError::NotFound { .. })) => {
                self.at = EnsureAt::Mkdir;
                Ok(None)
            }
            (EnsureAt::Mkdir, Ok(_)) => {
                self.at = EnsureAt::SyncParent;
                Ok(None)
            }
            // Someone else created it between our look and our mkdir: open theirs, checked.
            (EnsureAt::Mkdir, Err(FsError::AlreadyExists { .. })) => {
                self.at = EnsureAt::Reopen;
                Ok(None)
            }
            (EnsureAt::SyncParent, Ok(_)) => {
                self.at = EnsureAt::Reopen;
                Ok(None)
            }
            (_, Err(e)) => Err(e),
        }
    }
}

/// Classifies the result of reading the epoch file for the fence (card H5): the publish must
/// name exactly the persisted epoch.
fn fence(
    epoch: u64,
    control_path: &Path,
    read: Result<Option<Vec<u8>>, FsError>,
) -> Result<(), CheckpointError> {
    let path = control_path.join(crate::lease::epoch::EPOCH_FILE);
    let persisted = match read {
        Ok(None) | Err(FsError::NotFound { .. }) => 0,
        Ok(Some(bytes)) => crate::lease::epoch::parse(&bytes).map_err(|reason| {
            CheckpointError::EpochUnreadable {
                path: path.clone(),
                reason: crate::lease::epoch::EpochError::Corrupt {
                    path: path.clone(),
                    reason,
                }
                .to_string(),
            }
        })?,
        Err(FsError::TooLarge { .. }) => {
            return Err(CheckpointError::EpochUnreadable {
                path: path.clone(),
                reason: crate::lease::epoch::EpochError::Corrupt {
                    path: path.clone(),
                    reason: "too large",
                }
                .to_string(),
            });
        }
        Err(e) => {
            return Err(CheckpointError::EpochUnreadable {
                path,
                reason: e.to_string(),
            });
        }
    };
    // The one fence (card H5), shared with the lease and the lease model.
    match crate::lease::epoch::fence(epoch, persisted) {
        Ok(()) => Ok(()),
        Err(crate::lease::epoch::Fenced::Stale) => Err(CheckpointError::StaleEpoch {
            path,
            epoch,
            persisted,
        }),
        Err(crate::lease::epoch::Fenced::Unknown) => Err(CheckpointError::UnknownEpoch {
            path,
            epoch,
            persisted,
        }),
    }
}

/// Where the fence's sub-machine is: open the control directory, read the epoch file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum FenceAt {
    OpenControl,
    Read(Fd),
    CloseControl(Fd),
}

/// The fence as steps: `.tenure/` opened, `epoch` read, `.tenure/` closed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct Fence {
    epoch: u64,
    at: FenceAt,
}

/// The largest epoch file accepted (see `lease::epoch`).
const EPOCH_MAX_LEN: u64 = crate::lease::epoch::MAX_LEN;

impl Fence {
    fn new(epoch: u64) -> Fence {
        Fence {
            epoch,
            at: FenceAt::OpenControl,
        }
    }

    fn step(&self, label: &'static str) -> Step<'static> {
        use crate::fsop::Op;
        Step::new(
            label,
            match self.at {
                FenceAt::OpenControl => Op::OpenDir {
                    dir: Fd::ROOT,
                    name: OsStr::new(crate::lease::CONTROL_DIR),
                    any_mode: false,
                },
                FenceAt::Read(c) => Op::ReadFile {
                    dir: c,
                    name: OsStr::new(crate::lease::epoch::EPOCH_FILE),
                    max: EPOCH_MAX_LEN,
                },
                FenceAt::CloseControl(c) => Op::Close { fd: c },
            },
        )
    }

    /// `Ok(true)` once the fence passed.
    fn handle(
        &mut self,
        r: Result<Done, FsError>,
        store: &StorePath,
    ) -> Result<bool, CheckpointError> {
        let control = store
            .dir()
            .parent()
            .unwrap_or(store.dir())
            .join(crate::lease::CONTROL_DIR);
        match self.at {
            FenceAt::OpenControl => match r {
                Ok(d) => {
                    self.at = FenceAt::Read(fd_of(&d));
                    Ok(false)
                }
                Err(FsError::NotFound { .. }) => {
                    fence(self.epoch, &control, Ok(None))?;
                    Ok(true)
                }
                Err(e) => Err(CheckpointError::EpochUnreadable {
                    path: control.join(crate::lease::epoch::EPOCH_FILE),
                    reason: e.to_string(),
                }),
            },
            FenceAt::Read(c) => {
                let read = r.map(|d| match d {
                    Done::Data(b) => Some(b),
                    other => panic!("a read returns data, not {other:?}"),
                });
                fence(self.epoch, &control, read)?;
                self.at = FenceAt::CloseControl(c);
                Ok(false)
            }
            FenceAt::CloseControl(_) => {
                r?;
                Ok(true)
            }
        }
    }
}

#[cfg(test)]
mod tests;

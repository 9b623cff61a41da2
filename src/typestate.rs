//! The typed lifecycle for library users: `Tenure<Cold> → Tenure<Recovering> → Tenure<Ready> →
//! Tenure<Draining> → Released`, where an illegal transition does not compile.
//!
//! Every method feeds the one machine (`crate::machine`) through the shared [`Host`] handle and
//! executes the actions it returns against the real state dir: the lease (`crate::lease`) and the
//! checkpoint store (`crate::checkpoint`). The types only make the order of calls a compile-time
//! fact; the rules stay in the machine. Other threads use the [`Host`] (from [`Tenure::host`])
//! to request the drain, take residencies and deliver stop signals.

use crate::checkpoint::{
    Checkpoint, CheckpointError, CheckpointId, CheckpointStore, PublishFile, Published, Source,
    StoreOptions,
};
use crate::host::Host;
use crate::lease::{self, AcquireOptions, Lease, LeaseError, WaitBound};
use crate::machine::{
    Action, Config, DrainCause, Event, Fault, Machine, Outcome, Phase, PhaseKind, Reason, Rejected,
    RetireMode, Timer,
};
use crate::privfs::{FsError, StateDir};
use std::collections::BTreeMap;
use std::io::Read;
use std::marker::PhantomData;
use std::os::fd::BorrowedFd;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Marker: not owning yet.
#[derive(Debug)]
pub struct Cold;
/// Marker: owning, recovering from the last checkpoint.
#[derive(Debug)]
pub struct Recovering;
/// Marker: owning and serving.
#[derive(Debug)]
pub struct Ready;
/// Marker: owning and draining.
#[derive(Debug)]
pub struct Draining;

/// Options of an in-process owner. Validated by [`Tenure::open`] before anything on disk
/// changes (card H6). A duration too large for the clock (`Duration::MAX`) never runs out.
#[derive(Debug, Clone)]
pub struct Options {
    /// How long active residencies may take to settle once the drain begins (H4).
    pub grace: Duration,
    /// `Service` stays until closed; `Ephemeral` drains itself after `idle_grace` without
    /// active residencies (H3).
    pub retire: RetireMode,
    /// How long an ephemeral owner stays idle before it drains.
    pub idle_grace: Duration,
    /// How many checkpoints garbage collection keeps.
    pub keep: usize,
}

impl Default for Options {
    fn default() -> Options {
        Options {
            grace: Duration::from_secs(10),
            retire: RetireMode::Service,
            idle_grace: Duration::from_secs(30),
            keep: 2,
        }
    }
}

/// Errors of the typed lifecycle: the one error type of every [`Tenure`] method.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TenureError {
    /// An option is out of range; nothing on disk was touched.
    #[error("invalid option: {0}")]
    Config(&'static str),
    /// The state dir could not be opened or was refused.
    #[error(transparent)]
    Fs(#[from] FsError),
    /// The lease could not be acquired (busy, cancelled, refused state) or released.
    #[error(transparent)]
    Lease(#[from] LeaseError),
    /// The current checkpoint could not be read or was refused (recovery, [`Tenure::read`]).
    #[error(transparent)]
    Checkpoint(#[from] CheckpointError),
    /// Publishing the drain's checkpoint failed (refused or an I/O error): the files given to
    /// [`Tenure::close`] come back, unpublished, in [`PublishFailed::files`] (card P1); the
    /// current checkpoint is the one before the close and the lease is released.
    #[error(transparent)]
    Publish(Box<PublishFailed>),
    /// The owner ended before it could serve (a stop before it owned or while recovering, an
    /// invalid checkpoint); no lease is held and nothing was published.
    #[error("the owner ended before it could serve ({}); no lease is held and the checkpoint is unchanged", .0.summary())]
    Ended(Outcome),
    /// The drain did not settle within the grace (card H4): [`Tenure::close`] kept the lease
    /// and hands the owner back, still draining, with the original cause.
    #[error(transparent)]
    Unsettled(Box<Unsettled>),
    /// The machine rejected an event: a bug in this module, reported instead of a panic.
    #[error("internal error: {0}; please report it")]
    Internal(#[from] Rejected),
}

/// The drain did not settle within the grace: active residencies remain. The lease is kept;
/// the original cause of the drain is kept too (card H4). Call [`Tenure::close`] on `tenure`
/// again to wait more. Returned inside [`TenureError::Unsettled`].
#[derive(Debug, thiserror::Error)]
#[error(
    "the drain ({cause}) did not settle within the grace: {active} active residencies remain; the lease is kept"
)]
pub struct Unsettled {
    /// Why the drain began.
    pub cause: DrainCause,
    /// Active residencies still held.
    pub active: u32,
    /// The owner, still draining.
    pub tenure: Tenure<Draining>,
}

/// Publishing the drain's checkpoint failed: the files given to [`Tenure::close`] are handed
/// back, in their order and with their bytes, so that nothing the owner produced is lost
/// (card P1). Returned inside [`TenureError::Publish`].
#[derive(thiserror::Error)]
#[error("{error}; the {} files of the checkpoint are handed back unpublished", .files.len())]
pub struct PublishFailed {
    /// Why the publish failed.
    #[source]
    pub error: CheckpointError,
    /// The files, as given to [`Tenure::close`].
    pub files: Vec<CheckpointFile>,
}

impl PublishFailed {
    /// The files, as given to [`Tenure::close`].
    pub fn into_files(self) -> Vec<CheckpointFile> {
        self.files
    }
}

/// Names and sizes only: the bytes of a checkpoint do not belong in a debug print (an
/// `unwrap` of the error prints it).
impl std::fmt::Debug for PublishFailed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PublishFailed")
            .field("error", &self.error)
            .field(
                "files",
                &self
                    .files
                    .iter()
                    .map(|c| (c.name.as_str(), c.bytes.len()))
                    .collect::<Vec<_>>(),
            )
            .finish()
    }
}

/// A file of the next checkpoint.
#[derive(Debug, Clone)]
pub struct CheckpointFile {
    /// Its name (`dir/sub/file` allowed).
    pub name: String,
    /// Its bytes.
    pub bytes: Vec<u8>,
}

impl CheckpointFile {
    /// A file named `name` holding `bytes`.
    pub fn new(name: impl Into<String>, bytes: impl Into<Vec<u8>>) -> CheckpointFile {
        CheckpointFile {
            name: name.into(),
            bytes: bytes.into(),
        }
    }
}

/// What recovery led to.
#[derive(Debug)]
pub enum Recovered {
    /// Serving.
    Ready(Tenure<Ready>),
    /// A drain was requested before recovery completed (card H2): close now.
    Draining(Tenure<Draining>),
}

/// The end of an ownership.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct Released {
    /// How it ended.
    pub outcome: Outcome,
    /// The epoch it owned.
    pub epoch: u64,
    /// The checkpoint its drain published, if it published one.
    pub published: Option<CheckpointId>,
}

struct Core {
    dir: StateDir,
    host: Host,
    options: Options,
    lease: Option<Lease>,
    checkpoint: Option<Checkpoint>,
    timers: BTreeMap<Timer, Instant>,
    staged: Vec<CheckpointFile>,
    published: Option<CheckpointId>,
    failure: Option<TenureError>,
    outcome: Option<Outcome>,
    epoch: u64,
}

/// An owner of a state dir in lifecycle phase `S`.
pub struct Tenure<S> {
    core: Box<Core>,
    _phase: PhantomData<S>,
}

impl<S> std::fmt::Debug for Tenure<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tenure")
            .field("dir", &self.core.dir.path())
            .field("phase", &self.core.host.machine().phase().label())
            .finish()
    }
}

impl<S> Tenure<S> {
    fn into<T>(self) -> Tenure<T> {
        Tenure {
            core: self.core,
            _phase: PhantomData,
        }
    }

    /// The thread-safe handle: request the drain, take residencies, deliver stop signals.
    pub fn host(&self) -> Host {
        self.core.host.clone()
    }

    /// The state dir (canonical path).
    pub fn dir(&self) -> &Path {
        self.core.dir.path()
    }

    /// The lifecycle phase the machine is in.
    pub fn phase(&self) -> PhaseKind {
        self.core.host.phase()
    }
}

impl Tenure<Cold> {
    /// Validates `options` (nothing on disk changes if they are invalid) and opens the state
    /// dir privately, creating it and its missing parents 0700.
    pub fn open(dir: impl AsRef<Path>, options: Options) -> Result<Tenure<Cold>, TenureError> {
        if options.grace.is_zero() {
            return Err(TenureError::Config("grace must be greater than zero"));
        }
        if options.idle_grace.is_zero() {
            return Err(TenureError::Config("idle_grace must be greater than zero"));
        }
        if options.keep == 0 {
            return Err(TenureError::Config("keep must be at least 1"));
        }
        let dir = StateDir::open(dir.as_ref(), true)?;
        let mut config = Config::in_process();
        config.grace = options.grace;
        let host = Host::detached(Machine::new(config), options.retire);
        Ok(Tenure {
            core: Box::new(Core {
                dir,
                host,
                options,
                lease: None,
                checkpoint: None,
                timers: BTreeMap::new(),
                staged: Vec::new(),
                published: None,
                failure: None,
                outcome: None,
                epoch: 0,
            }),
            _phase: PhantomData,
        })
    }

    /// Takes the lease, waiting as `wait` says, then reads and verifies the current
    /// checkpoint. Fails with the lease's error when busy or refused, and with the checkpoint's
    /// error when it does not verify (the lease is then released, nothing is changed).
    pub fn acquire(self, wait: WaitBound) -> Result<Tenure<Recovering>, TenureError> {
        self.acquire_cancellable(wait, None)
    }

    /// [`Tenure::acquire`], cancelled when `cancel` becomes readable (e.g. a signal pipe).
    pub fn acquire_cancellable(
        mut self,
        wait: WaitBound,
        cancel: Option<BorrowedFd<'_>>,
    ) -> Result<Tenure<Recovering>, TenureError> {
        match self.core.feed(Event::Start, Some((wait, cancel))) {
            // A stop delivered through the host before the start cancelled the owner (card
            // G1): the machine rejects the start, and nothing on disk was touched.
            Err(TenureError::Internal(_)) if self.phase() == PhaseKind::Cancelled => {}
            r => r?,
        }
        if let Some(e) = self.core.failure.take() {
            return Err(e);
        }
        match self.phase() {
            PhaseKind::Recovering => Ok(self.into()),
            _ => Err(TenureError::Ended(self.core.ended())),
        }
    }
}

impl Tenure<Recovering> {
    /// The epoch of this ownership (fences every checkpoint it publishes).
    pub fn epoch(&self) -> u64 {
        self.core.epoch()
    }

    /// The verified current checkpoint, if there is one.
    pub fn checkpoint(&self) -> Option<&Checkpoint> {
        self.core.checkpoint.as_ref()
    }

    /// Reads the file `name` of the current checkpoint; the read verifies its digest as it goes.
    pub fn read(&self, name: &str) -> Result<Option<Vec<u8>>, TenureError> {
        let Some(cp) = &self.core.checkpoint else {
            return Ok(None);
        };
        let Some(entry) = cp.entry(name) else {
            return Ok(None);
        };
        let store = CheckpointStore::open(&self.core.dir, self.core.store_options())?;
        let mut r = store.open_entry(entry)?;
        let mut buf = Vec::with_capacity(entry.size as usize);
        r.read_to_end(&mut buf)
            .map_err(|e| CheckpointError::io(PathBuf::from(name), "read", e))?;
        Ok(Some(buf))
    }

    /// Recovery is complete: serve, or — when a drain was requested meanwhile — close (card
    /// H2: begin-drain, recover, close). A stop signal delivered while recovering refuses: the
    /// lease is released, nothing is published, and this returns [`TenureError::Ended`].
    pub fn recovered(mut self) -> Result<Recovered, TenureError> {
        // A stop may have refused the recovery meanwhile; its release is queued.
        self.core.run_pending()?;
        // A dir moved or replaced while recovering refuses (card H7).
        if self.phase() == PhaseKind::Recovering && self.core.root_moved() {
            self.core.feed(Event::RootLost, None)?;
        }
        if self.phase() != PhaseKind::Recovering {
            return Err(TenureError::Ended(self.core.ended()));
        }
        self.core.feed(Event::RecoveryDone, None)?;
        match self.phase() {
            PhaseKind::Ready => Ok(Recovered::Ready(self.into())),
            PhaseKind::Draining => Ok(Recovered::Draining(self.into())),
            _ => Err(TenureError::Ended(self.core.ended())),
        }
    }
}

impl Tenure<Ready> {
    /// The epoch of this ownership.
    pub fn epoch(&self) -> u64 {
        self.core.epoch()
    }

    /// Waits until the drain begins: a `request_drain`, a stop signal delivered through the
    /// host, — for an ephemeral owner — `idle_grace` without an active residency (card H3), or
    /// the state dir moved or replaced (card H7; looked at every half second).
    pub fn wait_for_drain(mut self) -> Result<Tenure<Draining>, TenureError> {
        let host = self.core.host.clone();
        let grace = self.core.options.idle_grace;
        let mut idle_since: Option<Instant> = None;
        loop {
            self.core.run_pending()?;
            if self.phase() != PhaseKind::Ready {
                return Ok(self.into());
            }
            if self.core.root_moved() {
                self.core.feed(Event::RootLost, None)?;
                continue;
            }
            let next_root_check = Instant::now() + crate::driver::ROOT_CHECK;
            let idle = host.residencies().idle_decision(host.retire_mode())
                == crate::machine::IdleDecision::Idle;
            if !idle {
                idle_since = None;
                // Wakes when actions are queued or the last active residency is released.
                host.wait_pending_or_idle(Some(next_root_check));
                continue;
            }
            let since = *idle_since.get_or_insert_with(Instant::now);
            if since.elapsed() >= grace {
                // Commits only if no active residency is held at this instant (one CAS).
                if !host.try_idle_exit() {
                    idle_since = None;
                }
                continue;
            }
            // A grace too large for the clock never runs out (card H6).
            let idle_end = since.checked_add(grace).unwrap_or(next_root_check);
            host.wait_pending(Some(idle_end.min(next_root_check)));
        }
    }

    /// Begins the drain now (same as `host().request_drain()` followed by
    /// [`Tenure::wait_for_drain`]).
    pub fn drain(self) -> Result<Tenure<Draining>, TenureError> {
        self.core.host.request_drain();
        self.wait_for_drain()
    }
}

impl Tenure<Draining> {
    /// The epoch of this ownership.
    pub fn epoch(&self) -> u64 {
        self.core.epoch()
    }

    /// Closes the ownership: waits (up to the grace) until no active residency is held,
    /// publishes `files` as the next checkpoint (fenced by the epoch; an empty list publishes
    /// nothing), and releases the lease. If residencies do not settle in time the lease is
    /// kept and [`TenureError::Unsettled`] returns the owner so the caller can wait more
    /// (card H4). If the publish fails the lease is released, the current checkpoint is the
    /// one before, and [`TenureError::Publish`] hands `files` back unpublished (card P1): the
    /// caller may keep them some other way.
    pub fn close(
        mut self,
        files: impl IntoIterator<Item = CheckpointFile>,
    ) -> Result<Released, TenureError> {
        let host = self.core.host.clone();
        self.core.staged = files.into_iter().collect();
        self.core.run_pending()?;
        // The grace armed when the drain began; after it expired once, each further call
        // waits one more grace.
        let armed = self.core.timers.get(&Timer::Grace).copied();
        // A grace too large for the clock is no bound (card H6): the wait ends when the
        // residencies settle.
        let deadline = armed.or_else(|| Instant::now().checked_add(self.core.options.grace));
        let settled = host.wait_settled(deadline);
        self.core.timers.remove(&Timer::Grace);
        let event = match (settled, armed) {
            (true, _) => Event::ResidenciesSettled,
            (false, Some(_)) => Event::TimerExpired(Timer::Grace),
            (false, None) => return Err(self.unsettled()),
        };
        self.core.feed(event, None)?;
        if !settled {
            return Err(self.unsettled());
        }
        self.core.released()
    }

    /// Waits for residencies to settle without a bound, then closes as [`Tenure::close`]
    /// (a failed publish hands `files` back the same way).
    pub fn close_when_settled(
        mut self,
        files: impl IntoIterator<Item = CheckpointFile>,
    ) -> Result<Released, TenureError> {
        self.core.host.wait_settled(None);
        self.core.staged = files.into_iter().collect();
        self.core.timers.remove(&Timer::Grace);
        self.core.feed(Event::ResidenciesSettled, None)?;
        self.core.released()
    }

    fn unsettled(self) -> TenureError {
        let cause = match self.core.host.machine().phase() {
            Phase::Draining { cause, .. } => cause,
            _ => DrainCause::Requested,
        };
        TenureError::Unsettled(Box::new(Unsettled {
            cause,
            active: self.core.host.residencies().active(),
            tenure: self,
        }))
    }
}

impl Core {
    /// Whether the state dir is no longer where it was opened (card H7), as the runner looks.
    fn root_moved(&self) -> bool {
        !matches!(self.dir.is_still_at_path(), Ok(true))
    }

    fn store_options(&self) -> StoreOptions {
        StoreOptions {
            keep: self.options.keep,
        }
    }

    fn epoch(&self) -> u64 {
        self.epoch
    }

    fn ended(&self) -> Outcome {
        self.outcome
            .or_else(|| self.host.machine().phase().outcome())
            .unwrap_or(Outcome::new(Reason::Refused, crate::machine::EXIT_BUSY))
    }

    /// The end of a close: the failure of a step if one failed, otherwise the release.
    fn released(&mut self) -> Result<Released, TenureError> {
        if let Some(e) = self.failure.take() {
            return Err(e);
        }
        Ok(Released {
            outcome: self.ended(),
            epoch: self.epoch,
            published: self.published,
        })
    }

    /// Feeds `event` and executes every action it (and the events they produce) return.
    fn feed(
        &mut self,
        event: Event,
        acquire: Option<(WaitBound, Option<BorrowedFd<'_>>)>,
    ) -> Result<(), TenureError> {
        self.host.feed(event)?;
        let mut acquire = acquire;
        loop {
            let actions = self.host.take_pending();
            if actions.is_empty() {
                return Ok(());
            }
            for a in actions {
                if let Some(next) = self.execute(a, &mut acquire) {
                    match self.host.feed(next) {
                        Err(_)
                            if a == Action::AcquireLease
                                && self.host.phase() == PhaseKind::Cancelled =>
                        {
                            self.withdraw_acquisition();
                        }
                        r => r?,
                    }
                }
            }
        }
    }

    /// A stop delivered through the host while `acquire` waited cancelled the owner (card
    /// G1): the machine abandoned the acquisition and rejects its answer. A lease the wait
    /// obtained is released at once, so no record of an owner that never ran is left behind,
    /// and the answer's error (busy, refused) gives way to the cancellation.
    fn withdraw_acquisition(&mut self) {
        self.failure = None;
        if let Some(l) = self.lease.take()
            && let Err(e) = l.release()
        {
            self.failure = Some(e.into());
        }
    }

    /// Executes actions queued by other threads (a drain request, a stop signal).
    fn run_pending(&mut self) -> Result<(), TenureError> {
        loop {
            let actions = self.host.take_pending();
            if actions.is_empty() {
                return Ok(());
            }
            for a in actions {
                if let Some(next) = self.execute(a, &mut None) {
                    self.host.feed(next)?;
                }
            }
        }
    }

    fn execute(
        &mut self,
        action: Action,
        acquire: &mut Option<(WaitBound, Option<BorrowedFd<'_>>)>,
    ) -> Option<Event> {
        match action {
            Action::AcquireLease => {
                let (wait, cancel) = acquire.take().unwrap_or((WaitBound::Try, None));
                let opts = AcquireOptions {
                    wait,
                    cancel,
                    phase: PhaseKind::Recovering,
                    fence: None,
                };
                match lease::acquire(&self.dir, &opts, &mut |_| {}) {
                    Ok(l) => {
                        let epoch = l.epoch();
                        self.epoch = epoch;
                        self.lease = Some(l);
                        Some(Event::LeaseGranted { epoch })
                    }
                    Err(e) => {
                        let next = match &e {
                            LeaseError::Busy { .. } => Event::WaitExpired,
                            // The caller's cancel fd only says "stop"; the library reports it as
                            // the conventional stop signal (the caller gets the lease error).
                            LeaseError::Cancelled { .. } => {
                                Event::Stop(crate::machine::Signal::Term)
                            }
                            e if e.is_refusal() => Event::LeaseFailed(Fault::State),
                            _ => Event::LeaseFailed(Fault::Io),
                        };
                        self.failure = Some(e.into());
                        Some(next)
                    }
                }
            }
            Action::AbandonAcquire => None,
            Action::SetPhase(p) => {
                if let Some(l) = &mut self.lease
                    && let Err(e) = l.set_phase(p)
                {
                    self.failure.get_or_insert(e.into());
                }
                None
            }
            Action::Recover => {
                let loaded = CheckpointStore::open_owned(&self.dir, self.store_options())
                    .and_then(|s| s.load());
                match loaded {
                    Ok(cp) => {
                        self.checkpoint = cp;
                        // In-process recovery is the host's: `recovered()` says it is done.
                        None
                    }
                    Err(e) => {
                        let fault = if e.is_corrupt_state() {
                            Fault::State
                        } else {
                            Fault::Io
                        };
                        self.failure = Some(e.into());
                        Some(Event::RecoveryFailed(fault))
                    }
                }
            }
            // A duration too large for the clock is a timer that never expires (card H6): it
            // is not kept, as after a disarm.
            Action::ArmTimer(t, d) => {
                match Instant::now().checked_add(d) {
                    Some(at) => self.timers.insert(t, at),
                    None => self.timers.remove(&t),
                };
                None
            }
            Action::ExtendTimer(t, d) => {
                match Instant::now().checked_add(d) {
                    Some(later) => {
                        if let Some(at) = self.timers.get_mut(&t) {
                            *at = (*at).max(later);
                        }
                    }
                    None => {
                        self.timers.remove(&t);
                    }
                }
                None
            }
            Action::DisarmTimer(t) => {
                self.timers.remove(&t);
                None
            }
            Action::Publish => {
                let epoch = self.epoch();
                // Read from where the caller's files are kept, so that a failed publish can
                // hand them back (card P1).
                let files: Vec<PublishFile<'_>> = self
                    .staged
                    .iter()
                    .map(|f| PublishFile {
                        name: f.name.clone(),
                        mode: 0o600,
                        source: Source::Reader(Box::new(&f.bytes[..])),
                    })
                    .collect();
                let result = CheckpointStore::attach_owned(&self.dir, self.store_options())
                    .and_then(|s| s.publish_files(epoch, files));
                let staged = std::mem::take(&mut self.staged);
                match result {
                    Ok(Published::New { checkpoint, .. }) => {
                        self.published = Some(checkpoint.id);
                        Some(Event::CheckpointPublished)
                    }
                    Ok(Published::Unchanged { .. }) => Some(Event::CheckpointSkipped),
                    Err(error) => {
                        self.failure = Some(TenureError::Publish(Box::new(PublishFailed {
                            error,
                            files: staged,
                        })));
                        Some(Event::CheckpointFailed)
                    }
                }
            }
            Action::ReleaseLease => {
                if let Some(l) = self.lease.take()
                    && let Err(e) = l.release()
                {
                    self.failure.get_or_insert(e.into());
                }
                self.timers.clear();
                Some(Event::LeaseReleased)
            }
            Action::Exit(o) => {
                self.outcome = Some(o);
                None
            }
            // No supervisor, no child and no log in-process: the host wires its own.
            Action::NotifyReady
            | Action::NotifyStopping
            | Action::BeginDrain
            | Action::Note(_)
            | Action::SpawnChild
            | Action::Forward(..)
            | Action::Relay(..)
            | Action::Kill => None,
        }
    }
}

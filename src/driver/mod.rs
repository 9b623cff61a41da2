//! The driver: executes the machine's actions against real files, signals and a child process,
//! and turns what it observes back into events. It adds no lifecycle rule: every decision is
//! `Machine::handle`'s (see spec/lifecycle.md).
//!
//! One thread runs an event loop (`poll` on the signal pipe, the child's pidfd and stderr, the
//! readiness socket and the recovery worker, with the nearest armed timer as timeout). Events
//! are fed to the machine one at a time; the actions of a step are executed in order before the
//! next event is read, so a signal that arrives during a step is handled between steps. The
//! only work done off the loop thread is reading and verifying the checkpoint (a worker thread),
//! so that a stop signal while recovering is honoured at once (card G3).
//!
//! Which event may be fed when, what is outstanding and which timers are armed is not decided
//! here but by the sans-IO driver [`core`], the same code the models and the trace checker run;
//! this loop only executes the actions and observes the world.

// The runner's own parts, public for the binary, the tests and the models only.
#[doc(hidden)]
pub mod child;
#[doc(hidden)]
pub mod core;
#[doc(hidden)]
pub mod demo;
#[doc(hidden)]
pub mod eventlog;
#[doc(hidden)]
pub mod notify;
pub mod ops;
pub mod signals;
#[doc(hidden)]
pub mod tree;
pub mod up;
pub mod user;

use crate::checkpoint::{
    CheckpointError, CheckpointId, CheckpointStore, OwnedDirs, Published, Staging, StoreOptions,
    View,
};
use crate::lease::{self, AcquireOptions, Identity, Lease, LeaseError, WaitBound};
use crate::machine::trace::{TRACE_VERSION, TraceLine};
use crate::machine::{
    Action, ChildStatus, Config, DrainCause, Event, Fault, HupPolicy, KillMode, Note, Outcome,
    Phase, PhaseKind, ReadyMode, Reason, RecoveryStep, Refusal, Signal, Target, Timer, reason_name,
    signal_name,
};
use crate::privfs::StateDir;
use child::{Child, SpawnSpec};
use core::Core;
use eventlog::EventLog;
use notify::{Notice, NotifySocket, Supervisor};
use rustix::event::{PollFd, PollFlags, poll};
use serde_json::json;
use signals::SignalIntake;
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::ffi::OsString;
use std::fs::File;
use std::io::{self, Write};
use std::os::fd::{AsFd, AsRawFd};
use std::os::unix::fs::OpenOptionsExt;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};
use tree::Tree;

/// How often an owner checks that its state dir is still where it was opened (card H7).
pub(crate) const ROOT_CHECK: Duration = Duration::from_millis(500);

/// How often a forking daemon's pid file is looked at while the owner waits for it to name the
/// main process.
const PID_FILE_CHECK: Duration = Duration::from_millis(20);

/// The largest pid file tenure reads.
const MAX_PID_FILE: usize = 64;

/// Everything `tenure run` was asked to do; validated by the caller (card H6).
#[derive(Debug, Clone)]
pub struct RunOptions {
    /// The state dir.
    pub dir: PathBuf,
    /// How long to wait for a held lease.
    pub wait: WaitBound,
    /// TERM → KILL grace.
    pub grace: Duration,
    /// KILL → `did not stop` bound.
    pub kill_wait: Duration,
    /// When the child counts as ready (`--type`).
    pub ready: ReadyMode,
    /// How long a notify-mode child may take to send `READY=1` (a forking one: to exit 0 and
    /// name its main process).
    pub ready_timeout: Option<Duration>,
    /// Where stop signals go first.
    pub kill_mode: KillMode,
    /// What SIGHUP means.
    pub hup: HupPolicy,
    /// With `--type forking`: the file the daemon writes its main pid to.
    pub pid_file: Option<PathBuf>,
    /// The interval the ready workload must send `WATCHDOG=1` within.
    pub watchdog: Option<Duration>,
    /// Whether the workload gets a cgroup where one can be made.
    pub cgroup: CgroupMode,
    /// When set, the child's environment is restricted to these names (card D2).
    pub env_allow: Option<Vec<OsString>>,
    /// Checkpoints kept by GC.
    pub keep: usize,
    /// Exit code when busy.
    pub busy_code: u8,
    /// Write every machine step here as JSONL.
    pub trace: Option<PathBuf>,
    /// Run the child as this user (`--user`; the runner must be root).
    pub user: Option<user::RunAs>,
    /// The command and its arguments.
    pub command: Vec<OsString>,
    /// The cluster lease (`--lease etcd://…`, issue 14): ownership and CURRENT live on etcd,
    /// fenced by revision; the state dir keeps the local records. `None`: the kernel lock of
    /// the state dir.
    #[cfg(feature = "etcd")]
    pub cluster: Option<crate::cluster::ClusterSpec>,
    /// Where blobs and manifests go (`--store`, with a cluster lease): a directory the
    /// cluster's machines share. `None`: the store inside the state dir.
    #[cfg(feature = "etcd")]
    pub store: Option<PathBuf>,
}

impl RunOptions {
    /// The machine configuration these options give.
    pub fn config(&self) -> Config {
        let mut c = Config::child(self.ready);
        c.grace = self.grace;
        c.kill_wait = self.kill_wait;
        c.ready_timeout = self.ready_timeout;
        c.busy_code = self.busy_code;
        c.kill_mode = self.kill_mode;
        c.hup = self.hup;
        c.watchdog = self.watchdog;
        c.pid_file = self.pid_file.is_some();
        c
    }
}

/// Whether the workload gets a cgroup (`--cgroup`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CgroupMode {
    /// One per ownership where cgroup v2 is writable; otherwise the subreaper and the inherited
    /// lock descriptor.
    Auto,
    /// Never: the subreaper and the inherited lock descriptor only.
    Off,
}

/// Failures that happen before the machine can run (the machine handles everything after).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DriverError {
    /// The trace file could not be created.
    #[error("cannot use {path} as the trace file: {source}; choose a writable path of its own")]
    Trace {
        /// The path.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// The machine rejected an event the driver fed: a driver bug, reported instead of
    /// panicking.
    #[error("internal error: {0}; please report it")]
    Rejected(String),
    /// The event loop's `poll` failed.
    #[error("cannot wait for events: {0}")]
    Poll(#[source] io::Error),
}

/// What a finished run reports.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct RunReport {
    /// The machine's outcome.
    pub outcome: Outcome,
    /// The process exit code.
    pub code: u8,
}

struct Recovered {
    checkpoint: Option<(CheckpointId, u64, u64)>,
    view: Option<View>,
    staging: Staging,
    /// The store as the recovery opened it: the publish and the release reattach it instead
    /// of opening it again (issue 11).
    dirs: Option<OwnedDirs>,
}

/// What a recovery returns: the recovered checkpoint and scratch, or the fault and message.
type Recovery = Result<Recovered, (Fault, String)>;

/// The recovery of this ownership while the machine is in `recovering`.
enum Worker {
    /// Verifying a checkpoint takes as long as the checkpoint is large: it runs on a thread so
    /// that the loop keeps reading signals, and `wake` becomes readable when it is done.
    Thread {
        wake: UnixStream,
        cancel: std::sync::Arc<std::sync::atomic::AtomicBool>,
        handle: JoinHandle<Recovery>,
    },
    /// There was no checkpoint to verify (no CURRENT), so the recovery ran on the loop's own
    /// thread (a thread, a socket pair and two context switches were a visible part of
    /// `tenure run -- true`, issue 11). Its result is fed by the next wait, after a stop signal
    /// that arrived meanwhile, exactly as if a worker thread had finished then.
    Done(Recovery),
}

impl Worker {
    /// Asks a running recovery to stop writing and waits for it; the result, if it finished.
    fn stop(self) -> Option<Recovery> {
        match self {
            Worker::Thread { cancel, handle, .. } => {
                cancel.store(true, std::sync::atomic::Ordering::SeqCst);
                handle.join().ok()
            }
            Worker::Done(r) => Some(r),
        }
    }
}

struct TraceWriter {
    file: File,
    seq: u64,
}

/// Runs one `tenure run` to its end. `intake` must have been installed before anything else so
/// that a stop signal at any moment is seen (card G1).
pub fn run(opts: &RunOptions, intake: &SignalIntake) -> Result<RunReport, DriverError> {
    // Before anything is started: every descendant the workload detaches stays the runner's,
    // so it is found, stopped and reaped (card T1).
    if let Err(e) = tree::become_subreaper() {
        log::warn!("cannot become a child subreaper: {e}");
    }
    let mut r = Runner::new(opts, intake)?;
    r.queue.push_back(Event::Start);
    let report = r.run();
    drop(r);
    // The lease is released and the workload gone: what still waits for stderr (a reader that
    // stalled) is written out now, however long that takes (see `crate::stdio`).
    crate::stdio::flush_err();
    report
}

struct Runner<'a> {
    opts: &'a RunOptions,
    intake: &'a SignalIntake,
    /// The machine and what this driver owes it (outstanding requests, armed timers).
    core: Core,
    queue: VecDeque<Event>,
    dir: Option<StateDir>,
    lease: Option<Lease>,
    child: Option<Child>,
    notify: Option<NotifySocket>,
    supervisor: Option<Supervisor>,
    /// The deadline of each timer as last armed or extended; only the ones the core says are
    /// armed count.
    deadlines: BTreeMap<Timer, Instant>,
    log: Option<EventLog>,
    trace: Option<TraceWriter>,
    worker: Option<Worker>,
    recovered: Option<Recovered>,
    published: Option<CheckpointId>,
    /// After a failed publish: what CURRENT named before it and names now (they differ when
    /// the failure came after CURRENT was renamed, e.g. its directory fsync failed).
    publish_failure: Option<(Option<CheckpointId>, Option<CheckpointId>)>,
    started: Instant,
    next_root_check: Instant,
    root_lost: bool,
    epoch: Option<u64>,
    failure: Option<String>,
    /// The status of the main process once it was reaped (cleared when a forking daemon's
    /// main process is adopted).
    child_status: Option<ChildStatus>,
    /// A live process left by a crashed owner that SIGKILL did not stop.
    orphan_alive: Option<String>,
    /// Where the output of a failed publish was kept (card P1).
    kept_output: Option<String>,
    /// The drain's publish ran (whatever its result).
    publish_ran: bool,
    /// The workload's tree (created at spawn).
    tree: Option<Tree>,
    /// The main process exited and `main-exited` was fed: waiting for `tree-empty`.
    tree_remains: bool,
    /// Senders of rejected notifications already warned about (one line each, card T5).
    rejected: BTreeSet<u32>,
    /// The workload's process group was given the terminal (taken back when it is gone).
    terminal_handed: bool,
    /// The last pid-file problem reported (so a waiting owner says it once, not every 20 ms).
    pid_file_problem: Option<String>,
    next_pid_file_check: Instant,
    /// The cluster lease, while held (issue 14).
    #[cfg(feature = "etcd")]
    cluster: Option<crate::cluster::ClusterLease>,
    /// Readable when the keep-alive thread found the cluster lease lost.
    #[cfg(feature = "etcd")]
    cluster_wake: Option<UnixStream>,
    /// The shared store's directory (`--store`), opened once the cluster lease is held.
    #[cfg(feature = "etcd")]
    shared: Option<StateDir>,
}

impl<'a> Runner<'a> {
    fn new(opts: &'a RunOptions, intake: &'a SignalIntake) -> Result<Runner<'a>, DriverError> {
        let core = Core::new(opts.config());
        let trace = match &opts.trace {
            None => None,
            Some(path) => {
                let file = open_trace(path).map_err(|source| DriverError::Trace {
                    path: path.clone(),
                    source,
                })?;
                let mut t = TraceWriter { file, seq: 0 };
                t.line(&TraceLine::Header {
                    version: TRACE_VERSION,
                    config: *core.machine().config(),
                    pid: std::process::id(),
                });
                Some(t)
            }
        };
        // Our own supervisor's socket is taken out of the environment so that the child never
        // notifies it directly: only we say when the owner is ready.
        let supervisor = Supervisor::from_env();
        Ok(Runner {
            opts,
            intake,
            core,
            queue: VecDeque::new(),
            dir: None,
            lease: None,
            child: None,
            notify: None,
            supervisor,
            deadlines: BTreeMap::new(),
            log: None,
            trace,
            worker: None,
            recovered: None,
            published: None,
            publish_failure: None,
            started: Instant::now(),
            next_root_check: Instant::now() + ROOT_CHECK,
            root_lost: false,
            epoch: None,
            failure: None,
            child_status: None,
            orphan_alive: None,
            kept_output: None,
            publish_ran: false,
            tree: None,
            tree_remains: false,
            rejected: BTreeSet::new(),
            terminal_handed: false,
            pid_file_problem: None,
            next_pid_file_check: Instant::now(),
            #[cfg(feature = "etcd")]
            cluster: None,
            #[cfg(feature = "etcd")]
            cluster_wake: None,
            #[cfg(feature = "etcd")]
            shared: None,
        })
    }

    fn run(&mut self) -> Result<RunReport, DriverError> {
        loop {
            while let Some(ev) = self.queue.pop_front() {
                if let Some(outcome) = self.step(ev)? {
                    return Ok(RunReport {
                        code: outcome.code(),
                        outcome,
                    });
                }
            }
            self.wait()?;
        }
    }

    /// Feeds one event and executes the actions; returns the outcome once the machine exits.
    fn step(&mut self, ev: Event) -> Result<Option<Outcome>, DriverError> {
        // A timer whose expiry was read in the same wake-up as an event that disarmed it, or
        // armed or extended it again, has not expired for the machine.
        if let Event::TimerExpired(t) = ev
            && (!self.core.armed(t) || self.deadlines.get(&t).is_some_and(|d| *d > Instant::now()))
        {
            return Ok(None);
        }
        // A loss noticed twice (by the keep-alive and by the release), or after the run let go,
        // is not news to the machine.
        if let Event::LeaseLost = ev
            && !self.core.holds_lease()
        {
            return Ok(None);
        }
        if let Event::ChildExited(s) = ev {
            self.child_status = Some(s);
        }
        let at_ms = self.started.elapsed().as_millis() as u64;
        let seq = self.trace.as_ref().map_or(0, |t| t.seq + 1);
        let step = self.core.feed_traced(seq, at_ms, ev);
        if let Some(t) = &mut self.trace {
            t.seq = seq;
            t.line(&TraceLine::Step(step.clone()));
        }
        if let Some(msg) = step.rejected {
            return Err(DriverError::Rejected(msg));
        }
        while let Some(action) = self.core.pop() {
            if let Some(outcome) = self.execute(action) {
                return Ok(Some(outcome));
            }
        }
        Ok(None)
    }

    fn log(&mut self, kind: &str, fields: serde_json::Value) {
        if let Some(l) = &mut self.log {
            l.write(kind, self.epoch, fields);
        }
    }

    /// Puts the event lines written so far on file: called before anything that can take time
    /// or look at the log (the recovery, the spawn, the publish, every wait), so a line is never
    /// held while the runner waits or its workload starts.
    fn flush_log(&mut self) {
        if let Some(l) = &mut self.log {
            l.flush();
        }
    }

    fn dir_display(&self) -> String {
        self.dir.as_ref().map_or_else(
            || self.opts.dir.display().to_string(),
            |d| d.path().display().to_string(),
        )
    }

    fn execute(&mut self, action: Action) -> Option<Outcome> {
        match action {
            Action::AcquireLease => self.acquire(),
            Action::AbandonAcquire => {
                // `lease::acquire` returned `Cancelled` and removed its waiter entry itself;
                // nothing else was created for this run.
            }
            Action::SetPhase(p) => {
                if let Some(l) = &mut self.lease
                    && let Err(e) = l.set_phase(p)
                {
                    log::warn!("cannot record phase {p}: {e}");
                }
            }
            Action::Recover => self.start_recovery(),
            Action::SpawnChild => self.spawn(),
            Action::ArmTimer(t, d) => {
                self.deadlines.insert(t, Instant::now() + d);
            }
            Action::ExtendTimer(t, d) => {
                let later = Instant::now() + d;
                if self.core.armed(t)
                    && let Some(at) = self.deadlines.get_mut(&t)
                {
                    *at = (*at).max(later);
                }
            }
            // The core no longer counts the timer as armed; its deadline is ignored from now on.
            Action::DisarmTimer(_) => {}
            Action::NotifyReady => self.tell_supervisor("READY=1"),
            Action::NotifyStopping => self.tell_supervisor("STOPPING=1"),
            // The runner has no in-process hook: the child is told by the forwarded signal.
            Action::BeginDrain => {}
            Action::Forward(s, t) => self.signal_workload(to_rustix(s), t, true),
            Action::Relay(n, t) => match signal_from_number(n) {
                Some(sig) => self.signal_workload(sig, t, false),
                None => log::warn!("cannot relay {}", signal_name(n)),
            },
            Action::Kill => self.signal_workload(rustix::process::Signal::KILL, Target::Tree, true),
            Action::Publish => self.publish(),
            Action::ReleaseLease => self.release(),
            Action::Note(n) => self.note(n),
            Action::Exit(o) => {
                self.finish(&o);
                return Some(o);
            }
        }
        None
    }

    fn tell_supervisor(&mut self, text: &str) {
        if let Some(s) = &self.supervisor
            && let Err(e) = s.send(text)
        {
            // Card T5: a full or missing supervisor socket is a warning, never a stall.
            log::warn!("cannot notify the supervisor ({text}): {e}");
        }
    }

    fn acquire(&mut self) {
        let dir = match StateDir::open(&self.opts.dir, true) {
            Ok(d) => d,
            Err(e) => {
                self.failure = Some(e.to_string());
                let fault = if e.is_refusal() {
                    Fault::State
                } else {
                    Fault::Io
                };
                self.queue.push_back(Event::LeaseFailed(fault));
                return;
            }
        };
        // With a cluster lease, the cluster decides who owns (and waits); the local lock then
        // only keeps this dir's records to one runner, and takes the cluster's epoch.
        #[cfg(feature = "etcd")]
        let (fence, cluster_contended) = match self.opts.cluster.clone() {
            None => (None, false),
            Some(spec) => match self.acquire_cluster(&dir, &spec) {
                (Some(epoch), contended) => (Some(epoch), contended),
                (None, _) => {
                    self.dir = Some(dir);
                    return;
                }
            },
        };
        #[cfg(not(feature = "etcd"))]
        let (fence, cluster_contended) = (None, false);
        let opts = AcquireOptions {
            wait: if fence.is_some() {
                WaitBound::Try
            } else {
                self.opts.wait
            },
            cancel: Some(self.intake.fd()),
            phase: PhaseKind::Recovering,
            fence,
        };
        let mut contended = false;
        let mut log = None;
        let want_cgroup = matches!(self.opts.cgroup, CgroupMode::Auto);
        let result = lease::acquire_for_workload(
            &dir,
            &opts,
            &mut |c| {
                log::info!("{c}");
                contended = true;
                // The dir passed the read-only inspection and its control folder exists: the
                // `waiting` line is written now, while we wait (card D6, L1), not once the wait is
                // over.
                log = EventLog::open(&dir);
                if let Some(l) = &mut log {
                    let (pid, epoch) = c.owner.as_ref().map(|o| (o.identity.pid, o.epoch)).unzip();
                    l.write(
                        "waiting",
                        None,
                        json!({"owner_pid": pid, "owner_epoch": epoch}),
                    );
                    l.flush();
                }
            },
            want_cgroup,
        );
        // A dir whose state was refused is left byte-for-byte as it was (cards L8–L10): not
        // even the event log is created or appended to.
        let refused = matches!(&result, Err(e) if e.is_refusal());
        self.log = match log {
            Some(l) => Some(l),
            // Already tried while waiting (and warned if the log file is refused).
            None if refused || contended => None,
            None if self.log.is_some() => self.log.take(),
            None => EventLog::open(&dir),
        };
        if contended {
            self.queue.push_back(Event::LeaseBusy);
        }
        // Contention on the cluster was reported already; the local lock is tried once.
        let contended = contended || cluster_contended;
        #[cfg(feature = "etcd")]
        if result.is_err() {
            self.drop_cluster();
        }
        self.dir = Some(dir);
        match result {
            Ok(mut l) => {
                self.epoch = Some(l.epoch());
                // Card P3: a rewound epoch file is one warning line, never a reused epoch.
                if let Some(r) = l.rewound() {
                    log::warn!("{r}");
                    self.log(
                        "epoch-rewound",
                        json!({"file_epoch": r.file, "recorded_epoch": r.seen.epoch,
                               "recorded_in": r.seen.path}),
                    );
                }
                self.queue
                    .push_back(Event::LeaseGranted { epoch: l.epoch() });
                // A crashed owner's child may have outlived it (invariant I7 across a crash):
                // it is stopped before this ownership starts a workload of its own.
                match l.stop_orphans(self.opts.kill_wait) {
                    Ok(pids) => {
                        for pid in pids {
                            log::warn!("stopped pid {pid}, left running by a crashed owner");
                            self.log("orphan-killed", json!({"orphan_pid": pid}));
                        }
                    }
                    Err(o) => {
                        self.orphan_alive = Some(format!(
                            "pid {} ({}) left running by the owner of epoch {} survived SIGKILL; refusing to start a second workload on {}",
                            o.identity.pid,
                            o.name,
                            o.epoch,
                            self.dir_display()
                        ));
                    }
                }
                // The rest of a crashed owner's workload, in the cgroup its record names, was
                // ended by the acquisition (card T2).
                let killed = l.leftovers_ended().to_vec();
                if !killed.is_empty() {
                    let prev_epoch = l.previous().map_or(0, |p| p.epoch);
                    log::warn!(
                        "stopped {} process(es) of the workload of epoch {prev_epoch}, left running by a crashed owner",
                        killed.len()
                    );
                    self.log(
                        "previous-workload-ended",
                        json!({"epoch_ended": prev_epoch, "pids": killed}),
                    );
                }
                self.lease = Some(l);
                self.next_root_check = Instant::now() + ROOT_CHECK;
            }
            Err(LeaseError::Busy { .. }) if !contended => {
                // Try-once found it held: contention, then the (zero) bound expired.
                if let Err(e) = &result {
                    self.failure = Some(e.to_string());
                }
                self.queue.extend([Event::LeaseBusy, Event::WaitExpired]);
            }
            Err(LeaseError::Busy { .. }) => {
                if let Err(e) = &result {
                    self.failure = Some(e.to_string());
                }
                self.queue.push_back(Event::WaitExpired);
            }
            // The signal that cancelled the wait is read by the loop and fed as `stop`.
            Err(LeaseError::Cancelled { .. }) => {}
            Err(e) => {
                let fault = if e.is_refusal() {
                    Fault::State
                } else {
                    Fault::Io
                };
                self.failure = Some(e.to_string());
                self.queue.push_back(Event::LeaseFailed(fault));
            }
        }
    }

    /// Takes the cluster lease (issue 14): waits visibly while another machine owns it, then
    /// starts its keep-alive and opens the shared store. Returns the epoch (the owner key's
    /// create revision) and whether contention was reported; `None` when the events that end
    /// the acquisition were queued.
    #[cfg(feature = "etcd")]
    fn acquire_cluster(
        &mut self,
        dir: &StateDir,
        spec: &crate::cluster::ClusterSpec,
    ) -> (Option<u64>, bool) {
        use crate::cluster::{self, ClusterError, Holder, Progress, Wait};
        let me = Holder::me(dir.path());
        let wait = match self.opts.wait {
            WaitBound::Try => Wait::Try,
            WaitBound::For(d) => Wait::For(d),
            WaitBound::Forever => Wait::Forever,
        };
        let mut contended = false;
        let mut log = None;
        let url = spec.url();
        // The local dir was only inspected by opening it; the event log is opened (with its
        // control folder, as a local waiter's lock creates it) once there is something to say
        // while the acquisition goes on — that we wait, or that the cluster cannot be reached —
        // so an operator sees it then, not once the wait is over.
        let result = cluster::acquire(spec, &me, wait, Some(self.intake.fd()), &mut |p| {
            let l = log.get_or_insert_with(|| EventLog::open_creating(dir));
            match p {
                Progress::Waiting { owner, epoch } => {
                    log::info!("waiting for {url} (owner {owner}, epoch {epoch})");
                    contended = true;
                    if let Some(l) = l {
                        l.write(
                            "waiting",
                            None,
                            json!({"owner_pid": owner.pid, "owner_node": &owner.node,
                                   "owner_epoch": epoch, "lease": url}),
                        );
                        l.flush();
                    }
                }
                Progress::Unavailable { error } => {
                    log::warn!("{url}: cluster unavailable, retrying: {error}");
                    if let Some(l) = l {
                        l.write(
                            "cluster-unavailable",
                            None,
                            json!({"lease": url, "error": error.to_string(), "retrying": true}),
                        );
                        l.flush();
                    }
                }
                Progress::Reachable { outage } => {
                    let ms = outage.as_millis() as u64;
                    log::info!("{url}: the cluster answers again after {ms} ms");
                    if let Some(l) = l {
                        l.write(
                            "cluster-reachable",
                            None,
                            json!({"lease": url, "outage_ms": ms}),
                        );
                        l.flush();
                    }
                }
            }
        });
        // A failed acquisition leaves its end record too (the dir itself was not refused).
        self.log = match log {
            Some(l) => l,
            None if result.is_err() => EventLog::open_creating(dir),
            None => None,
        };
        let mut lease = match result {
            Ok(l) => l,
            Err(ClusterError::Busy { .. }) => {
                if let Err(e) = &result {
                    self.failure = Some(e.to_string());
                }
                if !contended {
                    self.queue.push_back(Event::LeaseBusy);
                }
                self.queue.push_back(Event::WaitExpired);
                return (None, contended);
            }
            // The signal that cancelled the wait is read by the loop and fed as `stop`.
            Err(ClusterError::Cancelled { .. }) => return (None, contended),
            Err(e) => {
                let fault = if e.is_refusal() {
                    Fault::State
                } else {
                    Fault::Io
                };
                self.failure = Some(e.to_string());
                self.queue.push_back(Event::LeaseFailed(fault));
                return (None, contended);
            }
        };
        match crate::cluster::wake_pair() {
            Ok((r, w)) => {
                lease.keep_alive(w);
                self.cluster_wake = Some(r);
            }
            Err(e) => {
                self.failure = Some(format!("cannot start the keep-alive of {url}: {e}"));
                let _ = lease.release();
                self.queue.push_back(Event::LeaseFailed(Fault::Io));
                return (None, contended);
            }
        }
        let epoch = lease.epoch();
        self.cluster = Some(lease);
        if let Some(store) = &self.opts.store {
            match StateDir::open(store, true) {
                Ok(d) => self.shared = Some(d),
                Err(e) => {
                    let fault = if e.is_refusal() {
                        Fault::State
                    } else {
                        Fault::Io
                    };
                    self.failure = Some(format!("the shared store: {e}"));
                    self.drop_cluster();
                    self.queue.push_back(Event::LeaseFailed(fault));
                    return (None, contended);
                }
            }
        }
        (Some(epoch), contended)
    }

    /// Lets the cluster lease go after a failed acquisition (nothing of this ownership ran).
    #[cfg(feature = "etcd")]
    fn drop_cluster(&mut self) {
        self.cluster_wake = None;
        if let Some(c) = self.cluster.take() {
            let _ = c.release();
        }
    }

    /// The directory the checkpoint store lives in: the shared store of a cluster lease, or
    /// the state dir.
    fn store_dir(&self) -> Option<&StateDir> {
        #[cfg(feature = "etcd")]
        if self.opts.store.is_some() {
            return self.shared.as_ref();
        }
        self.dir.as_ref()
    }

    /// The store, attached for its owner; with a cluster lease, CURRENT is the cluster's.
    fn attach(&self) -> Option<Result<CheckpointStore<'_>, CheckpointError>> {
        self.attach_from(self.recovered.as_ref().and_then(|r| r.dirs.as_ref()))
    }

    /// The store, reattached from the directories this ownership's recovery opened (`dirs`)
    /// or, without them, opened again.
    fn attach_from(
        &self,
        dirs: Option<&OwnedDirs>,
    ) -> Option<Result<CheckpointStore<'_>, CheckpointError>> {
        let dir = self.store_dir()?;
        let opts = StoreOptions {
            keep: self.opts.keep,
        };
        let store = match dirs {
            Some(d) => CheckpointStore::reattach(dir, d, opts),
            None => CheckpointStore::attach_owned(dir, opts),
        };
        #[cfg(feature = "etcd")]
        if let Some(c) = &self.cluster {
            return Some(store.map(|s| s.with_pointer(c)));
        }
        Some(store)
    }

    fn start_recovery(&mut self) {
        self.flush_log();
        if let Some(msg) = self.orphan_alive.take() {
            // An orphan of a crashed owner could not be stopped: refuse before any workload.
            log::error!("{msg}");
            self.failure = Some(msg);
            self.queue.push_back(Event::RecoveryFailed(Fault::Io));
            return;
        }
        let dir = match self.store_dir().map(StateDir::try_clone) {
            Some(Ok(d)) => d,
            Some(Err(e)) => {
                self.failure = Some(e.to_string());
                self.queue.push_back(Event::RecoveryFailed(Fault::Io));
                return;
            }
            None => {
                self.queue.push_back(Event::RecoveryFailed(Fault::Io));
                return;
            }
        };
        let keep = self.opts.keep;
        #[cfg(feature = "etcd")]
        let pointer = self
            .opts
            .cluster
            .clone()
            .map(|spec| crate::cluster::ReadPointer { spec });
        #[cfg(not(feature = "etcd"))]
        let pointer: Option<NoPointer> = None;
        // Nothing to verify: no cluster pointer and no CURRENT (one `stat`; anything but
        // "not there" — a CURRENT, an error — takes the worker thread, whose recovery reports
        // it).
        let nothing_to_verify = pointer.is_none()
            && matches!(
                rustix::fs::statat(
                    dir.root(),
                    Path::new(crate::checkpoint::STORE_DIR).join(crate::checkpoint::CURRENT_FILE),
                    rustix::fs::AtFlags::SYMLINK_NOFOLLOW,
                ),
                Err(rustix::io::Errno::NOENT)
            );
        if nothing_to_verify {
            let never = std::sync::atomic::AtomicBool::new(false);
            self.worker = Some(Worker::Done(recover(&dir, keep, &never, None, true)));
            return;
        }
        let (wake, signal) = match UnixStream::pair() {
            Ok(p) => p,
            Err(e) => {
                self.failure = Some(format!("cannot start recovery: {e}"));
                self.queue.push_back(Event::RecoveryFailed(Fault::Io));
                return;
            }
        };
        // Plain std atomics: this flag is shared with one worker thread, not model-checked.
        let cancel = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flag = cancel.clone();
        let handle = std::thread::spawn(move || {
            let r = recover(
                &dir,
                keep,
                &flag,
                pointer
                    .as_ref()
                    .map(|p| p as &dyn crate::checkpoint::CurrentPointer),
                false,
            );
            let _ = (&signal).write_all(b"x");
            r
        });
        self.worker = Some(Worker::Thread {
            wake,
            cancel,
            handle,
        });
    }

    fn finish_recovery(&mut self) {
        let Some(w) = self.worker.take() else { return };
        let result = match w {
            Worker::Thread { handle, .. } => handle.join(),
            Worker::Done(r) => Ok(r),
        };
        match result {
            Ok(Ok(rec)) => {
                match rec.checkpoint {
                    Some((id, files, bytes)) => self.log(
                        "recovered",
                        json!({"checkpoint": id.get(), "files": files, "bytes": bytes}),
                    ),
                    None => self.log("recovered", json!({"checkpoint": null})),
                }
                self.recovered = Some(rec);
                self.queue.push_back(Event::RecoveryDone);
            }
            Ok(Err((fault, msg))) => {
                log::error!("{msg}");
                self.failure = Some(msg);
                self.queue.push_back(Event::RecoveryFailed(fault));
            }
            Err(_) => {
                self.failure = Some("the recovery worker panicked".into());
                self.queue.push_back(Event::RecoveryFailed(Fault::Io));
            }
        }
    }

    /// Spawns the workload. Spawning is synchronous for the machine: its answer
    /// (`ChildSpawned`/`SpawnFailed`) goes to the *front* of the queue, before any event read
    /// in the same wake-up as the one that led here (a SIGTERM read together with the end of
    /// the recovery was fed while the spawn was outstanding, a rejected event that ended the
    /// run without a release; seen as a flaky `p5_stop_tells_the_truth_while_the_owner_is_starting`).
    fn spawn(&mut self) {
        // The workload may read the log as it starts: what happened before it is on file.
        self.flush_log();
        let (program, args) = match self.opts.command.split_first() {
            Some((p, a)) => (p.clone(), a.to_vec()),
            None => (OsString::new(), Vec::new()),
        };
        let mut set: Vec<(OsString, OsString)> = Vec::new();
        if let Some(d) = &self.dir {
            set.push(("TENURE_DIR".into(), d.path().as_os_str().to_owned()));
        }
        if let Some(e) = self.epoch {
            set.push(("TENURE_EPOCH".into(), e.to_string().into()));
        }
        let mut remove: Vec<OsString> = vec![
            "NOTIFY_SOCKET".into(),
            "TENURE_CHECKPOINT".into(),
            "TENURE_LOCK_FD".into(),
            // Our own supervisor's watchdog is ours, not the child's.
            "WATCHDOG_USEC".into(),
            "WATCHDOG_PID".into(),
        ];
        // With `--user` the child cannot reach the private state dir by path: its two
        // directories become its own and are handed over as inherited descriptors.
        let handover = match (&self.opts.user, &self.recovered) {
            (Some(u), Some(rec)) => {
                match u.hand_over(rec.staging.path(), rec.view.as_ref().map(|v| v.path())) {
                    Ok(h) => Some(h),
                    Err(e) => {
                        let msg =
                            format!("cannot hand the checkpoint directories to {}: {e}", u.name);
                        log::error!("{msg}");
                        self.log(
                            "spawn-failed",
                            json!({"error": msg, "errno": child::errno_name(&e)}),
                        );
                        self.failure = Some(msg);
                        self.queue.push_front(Event::SpawnFailed(
                            crate::machine::ExecFailure::NotExecutable,
                        ));
                        return;
                    }
                }
            }
            _ => None,
        };
        if let Some(rec) = &self.recovered {
            let view = match &handover {
                Some(h) => h.view_path(),
                None => rec.view.as_ref().map(|v| v.path().as_os_str().to_owned()),
            };
            if let Some(v) = view {
                set.push(("TENURE_CHECKPOINT".into(), v));
                remove.retain(|n| n != "TENURE_CHECKPOINT");
            }
            let out = match &handover {
                Some(h) => h.out_path(),
                None => rec.staging.path().as_os_str().to_owned(),
            };
            set.push(("TENURE_CHECKPOINT_OUT".into(), out));
        }
        if let Some(w) = self.opts.watchdog {
            set.push(("WATCHDOG_USEC".into(), w.as_micros().to_string().into()));
        }
        if self.opts.ready == ReadyMode::Notify || self.opts.watchdog.is_some() {
            match NotifySocket::bind() {
                Ok(s) => {
                    set.push(("NOTIFY_SOCKET".into(), s.env_value()));
                    remove.retain(|n| n != "NOTIFY_SOCKET");
                    self.notify = Some(s);
                }
                Err(e) => log::error!("cannot create the readiness socket: {e}"),
            }
        }
        // Containment (card T1, T2): a cgroup of this ownership where one can be made,
        // recorded in the owner record before the child enters it; otherwise the workload keeps
        // a duplicate of the lock descriptor, so the dir stays locked while any of it runs.
        let cgroup = self.lease.as_mut().and_then(Lease::take_cgroup);
        let why_no_cgroup = match self.opts.cgroup {
            CgroupMode::Auto => self
                .lease
                .as_ref()
                .and_then(|l| l.cgroup_error().map(str::to_owned)),
            CgroupMode::Off => Some("--cgroup off".to_string()),
        };
        let shared_lock = match (&cgroup, &mut self.lease) {
            (None, Some(l)) => match l.share_lock() {
                Ok(fd) => Some(fd),
                Err(e) => {
                    log::warn!("cannot share the lock with the workload: {e}");
                    None
                }
            },
            _ => None,
        };
        if let Some(fd) = &shared_lock {
            set.push(("TENURE_LOCK_FD".into(), fd.as_raw_fd().to_string().into()));
        }
        let containment = match (&cgroup, &shared_lock) {
            (Some(cg), _) => json!({"mechanism": "cgroup", "cgroup": cg.path()}),
            (None, Some(fd)) => json!({"mechanism": "lock-fd", "lock_fd": fd.as_raw_fd(),
                                       "no_cgroup": why_no_cgroup}),
            (None, None) => json!({"mechanism": "subreaper", "no_cgroup": why_no_cgroup}),
        };
        let spec = SpawnSpec {
            program,
            args,
            allow: self.opts.env_allow.clone(),
            remove,
            set,
            cgroup_dir: cgroup.as_ref().map(|c| c.dir_fd().as_raw_fd()),
            cgroup_procs: cgroup.as_ref().map(|c| c.procs_fd().as_raw_fd()),
            inherit: shared_lock
                .as_ref()
                .map(|fd| fd.as_raw_fd())
                .into_iter()
                .chain(handover.iter().flat_map(user::Handover::fds))
                .collect(),
            user: self.opts.user.as_ref().map(user::RunAs::credentials),
            foreground: child::holds_terminal(),
        };
        self.terminal_handed = spec.foreground;
        let spawned = Child::spawn(&spec);
        // The child has its copy; ours would only keep the lock past our own release.
        drop(shared_lock);
        drop(handover);
        self.tree = Some(Tree::new(cgroup));
        match spawned {
            Ok(c) => {
                let pid = c.pid();
                if let (Some(l), Ok(id)) = (&mut self.lease, Identity::of_child(pid, c.pidfd()))
                    && let Err(e) = l.register_instance("child", &id)
                {
                    log::warn!("cannot register the child: {e}");
                }
                self.log(
                    "spawned",
                    json!({"child_pid": pid, "containment": containment}),
                );
                self.child = Some(c);
                self.queue.push_front(Event::ChildSpawned);
            }
            Err(e) => {
                log::error!("{e}");
                self.log(
                    "spawn-failed",
                    json!({"error": e.to_string(), "errno": e.errno}),
                );
                self.failure = Some(e.to_string());
                self.queue.push_front(Event::SpawnFailed(e.failure));
            }
        }
    }

    /// The main process while it runs and has not been reaped.
    fn main_pid(&self) -> Option<u32> {
        match (&self.child, self.child_status) {
            (Some(c), None) => Some(c.pid()),
            _ => None,
        }
    }

    /// Sends `sig` to the main process (through its pidfd) and, for [`Target::Tree`], to every
    /// other process of the workload; a `stop` signal counts the descendants it reached.
    fn signal_workload(&mut self, sig: rustix::process::Signal, target: Target, stop: bool) {
        let name = signal_name(sig.as_raw() as u8);
        let main = self.main_pid();
        let main_sent = match (&self.child, main) {
            (Some(c), Some(_)) => match c.signal(sig) {
                Ok(sent) => sent,
                Err(e) => {
                    log::warn!("cannot send {name} to the child: {e}");
                    false
                }
            },
            _ => false,
        };
        let descendants = match (target, &mut self.tree) {
            (Target::Tree, Some(t)) if sig == rustix::process::Signal::KILL => t.kill(main),
            (Target::Tree, Some(t)) => t.signal(sig, main, stop),
            (Target::Main | Target::Tree, _) => 0,
        };
        // A stopped process (`kill -STOP`, a terminal's ^Z) acts on a stop signal only once it
        // runs again: SIGCONT follows the stop signal to whatever it reached, as systemd does,
        // so the workload stops in order rather than by SIGKILL after the grace. Not after a
        // HUP forwarded while ready (`--hup forward`): that asks for a reload, not an end.
        let cont = rustix::process::Signal::CONT;
        let ending = !matches!(self.core.machine().phase(), Phase::Ready { .. });
        if stop && ending && sig != rustix::process::Signal::KILL && sig != cont {
            if main_sent
                && let Some(c) = &self.child
                && let Err(e) = c.signal(cont)
            {
                log::warn!("cannot send SIGCONT to the child: {e}");
            }
            if let (Target::Tree, Some(t)) = (target, &mut self.tree) {
                t.signal(cont, main, false);
            }
        }
        if main_sent || descendants > 0 {
            self.log(
                "signal-forwarded",
                json!({"signal": name, "child_pid": main.filter(|_| main_sent),
                       "target": match target { Target::Main => "main", Target::Tree => "tree" },
                       "descendants": descendants}),
            );
        } else {
            // Card R1: a workload that already ended is never signalled; its end is read next.
            self.log(
                "not-signalled",
                json!({"signal": name, "reason": "nothing of the workload runs"}),
            );
        }
    }

    fn publish(&mut self) {
        self.flush_log();
        self.publish_ran = true;
        let (Some(dir), Some(rec), Some(epoch)) = (&self.dir, &self.recovered, self.epoch) else {
            self.queue.push_back(Event::CheckpointSkipped);
            return;
        };
        // The output of a child that ran as another user is the runner's again before the
        // store looks at it; if that fails, the publish refuses the files it could not take
        // back and the output is kept like any refused output (card P1).
        if self.opts.user.is_some()
            && let Err(e) = user::take_back(rec.staging.path())
        {
            log::warn!("{e}");
        }
        let Some(store) = self.attach() else {
            self.queue.push_back(Event::CheckpointSkipped);
            return;
        };
        let result = store.and_then(|s| s.publish_adopting(epoch, &rec.staging));
        match result {
            Ok(Published::New {
                checkpoint,
                bytes_written,
                gc,
            }) => {
                self.published = Some(checkpoint.id);
                self.log(
                    "checkpoint-published",
                    json!({"checkpoint": checkpoint.id.get(), "files": checkpoint.files,
                           "bytes": checkpoint.bytes, "bytes_written": bytes_written,
                           "gc_error": gc.error}),
                );
                self.queue.push_back(Event::CheckpointPublished);
            }
            Ok(Published::Unchanged { current }) => {
                self.log(
                    "checkpoint-unchanged",
                    json!({"checkpoint": current.map(|c| c.get())}),
                );
                self.queue.push_back(Event::CheckpointSkipped);
            }
            Err(e) => {
                // Card P1: the child's output is never lost. The staging area (whatever its
                // path names now) is kept under `checkpoints/failed/`, and the error and the
                // fix name that place, not the staging area that no longer exists; what the
                // child left beside it in `staging/` (the output moved aside, a `.new` never
                // renamed into place) is kept there too, and named.
                let (kept, beside) = match self.attach().expect("attached above") {
                    Ok(s) => {
                        let k = s.keep_failed_with_siblings(&rec.staging, epoch);
                        let beside = report_keep(&k);
                        (k.area, beside)
                    }
                    Err(err) => (Err(err), Vec::new()),
                };
                let e = match &kept {
                    Ok(Some(k)) => e.relocate(rec.staging.path(), k),
                    _ => e,
                };
                log::error!("{e}");
                let kept = match kept {
                    Ok(Some(k)) => {
                        log::error!(
                            "the child's output was kept in {}; {}",
                            k.display(),
                            kept_fix(dir.path(), &k)
                        );
                        Some(k.display().to_string())
                    }
                    Ok(None) => None,
                    Err(err) => {
                        log::error!(
                            "the child's output could not be kept: {err}; it is still in {}, and the next owner of {} removes it",
                            rec.staging.path().display(),
                            dir.path().display()
                        );
                        Some(rec.staging.path().display().to_string())
                    }
                };
                report_beside(&beside);
                self.kept_output = kept;
                // A failure after CURRENT was renamed (its directory fsync) leaves the new
                // checkpoint current but not durable: read what CURRENT names now rather than
                // claiming it is unchanged.
                let before = rec.checkpoint.map(|(id, _, _)| id);
                let now = self
                    .attach()
                    .expect("attached above")
                    .and_then(|s| s.read_current())
                    .map(|c| c.map(|c| c.id))
                    .unwrap_or(before);
                self.publish_failure = Some((before, now));
                self.failure = Some(e.to_string());
                self.log(
                    "publish-failed",
                    json!({"error": e.to_string(), "current_before": before.map(|c| c.get()),
                           "current": now.map(|c| c.get()), "kept": self.kept_output,
                           "kept_beside": beside}),
                );
                self.queue.push_back(Event::CheckpointFailed);
            }
        }
    }

    /// Reports the keep of an output the drain did not publish although its main process
    /// exited 0 (card P1), as [`Runner::release`] made it from `staged`.
    fn keep_unpublished(&mut self, k: crate::checkpoint::KeptFailure, staged: &std::path::Path) {
        let beside = report_keep(&k);
        match &k.area {
            Ok(Some(area)) => {
                let d = std::path::PathBuf::from(self.dir_display());
                log::warn!(
                    "the child exited 0, but the workload did not stop in order, so its output was not published: the child's output was kept in {}; {}",
                    area.display(),
                    kept_fix(&d, area)
                );
                self.kept_output = Some(area.display().to_string());
            }
            Ok(None) => {}
            Err(err) => log::error!(
                "the child's unpublished output could not be kept: {err}; it is still in {}, and the next owner removes it",
                staged.display()
            ),
        }
        report_beside(&beside);
        self.log(
            "output-kept",
            json!({"reason": "not-published", "kept": self.kept_output, "kept_beside": beside}),
        );
    }

    fn release(&mut self) {
        // A recovery still running (a stop arrived while verifying) is told to stop writing and
        // joined, so nothing of this run writes into the dir after the lease is released.
        if let Some(Some(Ok(rec))) = self.worker.take().map(Worker::stop) {
            self.recovered = Some(rec);
        }
        // Scratch areas of this run go first, while we still own the dir. What a child running
        // as another user was given is taken back first (the workload is gone by now).
        if let (Some(rec), Some(_)) = (&self.recovered, &self.opts.user) {
            for p in std::iter::once(rec.staging.path()).chain(rec.view.as_ref().map(View::path)) {
                if let Err(e) = user::take_back(p) {
                    log::warn!("{e}");
                }
            }
        }
        let mut unpublished_kept = None;
        if let Some(Recovered {
            view,
            staging,
            dirs,
            ..
        }) = self.recovered.take()
            && let Some(Ok(store)) = self.attach_from(dirs.as_ref())
        {
            if let Some(v) = view {
                let _ = store.remove_view(v);
            }
            // Card P1: the output of a main process that exited 0 while serving is published
            // or kept. One the drain did not publish — the workload did not stop in order (a
            // leftover was killed) or missed its watchdog — is kept under `failed/` like a
            // refused one, and named. A recovery abandoned (a stop before the workload was
            // ready) is refused whole: what its child staged is discarded (cards G2, G3).
            let unpublished = !self.publish_ran
                && matches!(self.core.machine().phase(), Phase::Draining { .. })
                && self.child_status.is_some_and(ChildStatus::success)
                && match std::fs::read_dir(staging.path()) {
                    Ok(mut entries) => entries.next().is_some(),
                    // Replaced by a file or a link: kept as it is, like a refused output.
                    Err(e) => e.kind() != io::ErrorKind::NotFound,
                };
            match self.epoch {
                Some(epoch) if unpublished => {
                    let staged = staging.path().to_path_buf();
                    unpublished_kept =
                        Some((store.keep_failed_with_siblings(&staging, epoch), staged));
                }
                // A staging area whose publish failed was moved to `failed/` (or, if that
                // failed too, is left for the next owner's sweep): nothing is discarded then.
                _ if self.kept_output.is_none() => {
                    let _ = store.discard_staging(staging);
                }
                _ => {}
            }
        }
        if let Some((k, staged)) = unpublished_kept {
            self.keep_unpublished(k, &staged);
        }
        // The machine releases only once the whole workload is gone: the cgroup is empty.
        self.release_local();
        // The cluster lease goes last: its owner key is deleted only if it is still this
        // epoch's. Finding it gone means the lease was lost before the release.
        #[cfg(feature = "etcd")]
        if let Some(c) = self.cluster.take() {
            self.cluster_wake = None;
            let url = c.spec().url();
            match c.release() {
                Ok(true) => {}
                Ok(false) => {
                    self.failure = Some(format!(
                        "{url}: the owner key was no longer this epoch's at the release"
                    ));
                    self.queue.push_back(Event::LeaseLost);
                    return;
                }
                // The key expires with the lease within its TTL.
                Err(e) => {
                    log::warn!("releasing {url}: {e}; the lease expires by itself within its TTL")
                }
            }
        }
        self.queue.push_back(Event::LeaseReleased);
    }

    fn note(&mut self, n: Note) {
        let dir = self.dir_display();
        let epoch = self.epoch.unwrap_or(0);
        match n {
            Note::Waiting => {}
            Note::Owned(e) => {
                log::info!("owner of {dir} (epoch {e})");
                self.log("owned", json!({}));
            }
            Note::Spawned => {}
            Note::Ready => {
                log::info!("ready (epoch {epoch})");
                self.log("ready", json!({}));
            }
            Note::Draining(cause) => {
                log::info!("draining ({cause})");
                self.log("draining", json!({"cause": cause_name(cause)}));
            }
            Note::WatchdogTimedOut => {
                log::error!(
                    "watchdog timed out: the workload did not send WATCHDOG=1 in time; stopping it"
                );
                self.log("watchdog-timed-out", json!({}));
            }
            Note::TreeRemains => {
                let main = self.main_pid();
                let left: Vec<u32> = self
                    .tree
                    .as_ref()
                    .map(|t| t.members(main).into_keys().collect())
                    .unwrap_or_default();
                log::info!(
                    "the main process exited; stopping the {} process(es) it left behind before releasing {dir}",
                    left.len()
                );
                self.log("tree-remains", json!({"pids": left}));
            }
            Note::ReadinessTimedOut => {
                let what = match (self.opts.ready, &self.opts.pid_file) {
                    (ReadyMode::Notify, _) => "the child did not send READY=1 in time".to_owned(),
                    (ReadyMode::Forking, Some(f)) => format!(
                        "the daemon's first process did not exit 0, or its pid file {} did not name its main process, in time",
                        f.display()
                    ),
                    (ReadyMode::Forking, None) => {
                        "the daemon's first process did not exit 0 in time".to_owned()
                    }
                    (ReadyMode::Start, _) => "the child was not ready in time".to_owned(),
                };
                log::error!("readiness timed out: {what}");
                self.log("readiness-timed-out", json!({}));
            }
            Note::Killed if self.core.lost() => {
                log::warn!("the lease is lost; sending SIGKILL to the workload");
                self.log("killed", json!({"cause": "lease-lost"}));
            }
            Note::Killed => {
                log::warn!("the workload did not stop within the grace period; sending SIGKILL");
                self.log("killed", json!({}));
            }
            Note::DidNotStop => {
                log::error!(
                    "did not stop: a process of the workload survived SIGKILL; keeping the lease of {dir} until the whole workload is gone"
                );
                self.log("did-not-stop", json!({}));
            }
            Note::CheckpointPublished => {}
            Note::PublishFailed => {}
            Note::Released => self.log("released", json!({})),
            Note::Refused => self.log("refused", json!({"error": self.failure})),
            Note::Cancelled => self.log("cancelled", json!({})),
            Note::Busy => self.log("busy", json!({})),
            Note::LeaseLost => {
                let why = self
                    .failure
                    .clone()
                    .unwrap_or_else(|| "it expired".to_string());
                log::error!(
                    "the lease of {dir} (epoch {epoch}) was lost: {why}; stopping the workload at once, nothing more will be published"
                );
                self.log("lease-lost", json!({"error": why}));
            }
        }
    }

    /// Removes the workload's (empty) cgroup and releases the local lease: the release
    /// action's local half, and what a run whose cluster lease was lost still holds here.
    fn release_local(&mut self) {
        if let Some(t) = &self.tree {
            t.remove_cgroup();
        }
        if let Some(mut l) = self.lease.take() {
            let _ = l.unregister_instance("child");
            if let Err(e) = l.release() {
                log::error!("releasing {}: {e}", self.dir_display());
            }
        }
    }

    fn finish(&mut self, o: &Outcome) {
        // A lost lease released nothing: what this run still holds locally goes now (the
        // workload is gone), a recovery still running is stopped first, and the cluster's owner
        // key is deleted only if it is somehow still this epoch's.
        if self.core.lost() {
            if let Some(w) = self.worker.take() {
                let _ = w.stop();
            }
            self.release_local();
            #[cfg(feature = "etcd")]
            if let Some(c) = self.cluster.take() {
                let _ = c.release();
            }
        }
        let dir = self.dir_display();
        let epoch = self.epoch.unwrap_or(0);
        match o.reason {
            Reason::Busy | Reason::Cancelled => {}
            _ => {
                if let Some(l) = &mut self.log {
                    l.rotate_if_large();
                }
            }
        }
        let (tail, truncated) = match &self.child {
            Some(c) if !matches!(self.child_status, Some(s) if s.success()) => {
                let (t, tr) = c.stderr_tail();
                (Some(String::from_utf8_lossy(&t).into_owned()), tr)
            }
            _ => (None, false),
        };
        self.log(
            "end",
            json!({
                "reason": reason_name(o.reason),
                "summary": o.summary(),
                "code": o.code(),
                "signal": o.signal.map(|s| s.name()),
                "child": o.child.map(|c| c.to_string()),
                "killed": o.killed,
                "descendants_stopped": self.tree.as_ref().map_or(0, Tree::stopped),
                "stderr_tail": tail,
                "stderr_truncated": truncated,
            }),
        );
        self.flush_log();
        match o.reason {
            Reason::Exited
            | Reason::Stopped
            | Reason::Killed
            | Reason::DidNotStop
            | Reason::Watchdog => match self.published {
                Some(id) => log::info!(
                    "checkpoint {} published; released {dir} (epoch {epoch}, {})",
                    id.get(),
                    o.summary()
                ),
                None => log::info!(
                    "released {dir} (epoch {epoch}, {}); checkpoint unchanged",
                    o.summary()
                ),
            },
            Reason::PublishFailed => {
                let name = |c: Option<CheckpointId>| {
                    c.map_or_else(
                        || "no checkpoint".to_owned(),
                        |c| format!("checkpoint {}", c.get()),
                    )
                };
                match self.publish_failure {
                    Some((before, now)) if before != now => log::error!(
                        "the checkpoint was not published durably: CURRENT names {} now, but may name {} again after a crash; released {dir} (epoch {epoch})",
                        name(now),
                        name(before)
                    ),
                    Some((before, _)) => log::error!(
                        "the checkpoint could not be published; CURRENT is unchanged ({}); released {dir} (epoch {epoch})",
                        name(before)
                    ),
                    None => log::error!(
                        "the checkpoint could not be published; released {dir} (epoch {epoch})"
                    ),
                }
            }
            Reason::Refused => {
                let why = match o.refusal {
                    Some(Refusal::Signal(s)) => format!("stopped by {s} in phase recovering"),
                    Some(Refusal::ReadinessTimedOut) => {
                        "readiness timed out in phase recovering".into()
                    }
                    Some(Refusal::RootLost) => "the state dir was moved or replaced".into(),
                    Some(Refusal::NoMainPid) => {
                        "the daemon's tree ended before its pid file named a main process".into()
                    }
                    Some(Refusal::LeaseLost) => {
                        "the lease was lost while owned; the workload was stopped and nothing was released".into()
                    }
                    Some(Refusal::State) | Some(Refusal::Io) | None => self
                        .failure
                        .clone()
                        .unwrap_or_else(|| "the state was refused".into()),
                };
                log::error!("refused {dir}: {why}; checkpoint unchanged");
            }
            Reason::SpawnFailed => {
                log::error!(
                    "refused {dir}: the command could not be started; nothing was published"
                )
            }
            Reason::Cancelled => {
                let s = o.signal.map_or("a stop signal", Signal::name);
                log::info!("cancelled by {s} before owning {dir}; nothing was changed");
            }
            Reason::Busy => {
                let msg = self
                    .failure
                    .clone()
                    .unwrap_or_else(|| format!("{dir} is busy; lock and state were preserved"));
                log::error!("{msg}");
            }
        }
    }

    /// Waits for the next observation and queues the events it means.
    fn wait(&mut self) -> Result<(), DriverError> {
        self.flush_log();
        let now = Instant::now();
        let mut deadline = self.armed_deadlines().map(|(_, d)| d).min();
        let owning = self.lease.is_some();
        if owning && !self.root_lost {
            deadline = Some(deadline.map_or(self.next_root_check, |d| d.min(self.next_root_check)));
        }
        let awaiting_main = self.awaiting_main();
        if awaiting_main {
            deadline = Some(deadline.map_or(self.next_pid_file_check, |d| {
                d.min(self.next_pid_file_check)
            }));
        }
        let timeout = deadline.map(|d| {
            let left = d.saturating_duration_since(now);
            rustix::time::Timespec {
                tv_sec: left.as_secs() as i64,
                tv_nsec: i64::from(left.subsec_nanos()),
            }
        });
        let ready = {
            let mut fds: Vec<PollFd<'_>> = vec![
                PollFd::from_borrowed_fd(self.intake.fd(), PollFlags::IN),
                PollFd::from_borrowed_fd(self.intake.other_fd(), PollFlags::IN),
            ];
            let mut push = |fd, flags| {
                fds.push(PollFd::from_borrowed_fd(fd, flags));
                Some(fds.len() - 1)
            };
            let pidfd_i = match (&self.child, self.child_status) {
                (Some(c), None) => push(c.pidfd(), PollFlags::IN),
                _ => None,
            };
            // The child's stderr is read while our stderr keeps up with it; what waits for our
            // stderr goes out when it has room (a stalled reader never blocks this loop).
            let stderr_i = match self.child.as_ref().and_then(|c| c.stderr_fd()) {
                Some(fd) if crate::stdio::err_relay_room() => push(fd, PollFlags::IN),
                _ => None,
            };
            let err_out = rustix::stdio::stderr();
            let err_out_i = if crate::stdio::err_pending() {
                push(err_out, PollFlags::OUT)
            } else {
                None
            };
            let notify_i = match &self.notify {
                Some(n) => push(n.fd(), PollFlags::IN),
                None => None,
            };
            let worker_i = match &self.worker {
                Some(Worker::Thread { wake, .. }) => push(wake.as_fd(), PollFlags::IN),
                Some(Worker::Done(_)) | None => None,
            };
            #[cfg(feature = "etcd")]
            let lost_i = match &self.cluster_wake {
                Some(w) => push(w.as_fd(), PollFlags::IN),
                None => None,
            };
            #[cfg(not(feature = "etcd"))]
            let lost_i: Option<usize> = None;
            // The cgroup's `populated` flag wakes POLLPRI when the tree empties.
            let tree_i = match self.tree.as_ref().and_then(Tree::events_fd) {
                Some(fd) if self.tree_remains => push(fd, PollFlags::PRI),
                _ => None,
            };
            // A recovery that already finished on this thread is fed now: nothing blocks.
            let done = matches!(self.worker, Some(Worker::Done(_)));
            let zero = rustix::time::Timespec::default();
            let timeout = if done { Some(&zero) } else { timeout.as_ref() };
            match poll(&mut fds, timeout) {
                Ok(_) | Err(rustix::io::Errno::INTR) => {}
                Err(e) => return Err(DriverError::Poll(e.into())),
            }
            let ready = |i: Option<usize>| i.is_some_and(|i| !fds[i].revents().is_empty());
            let stop = !fds[0].revents().is_empty();
            Ready {
                stop,
                other: !fds[1].revents().is_empty(),
                pidfd: ready(pidfd_i),
                stderr: ready(stderr_i),
                err_out: ready(err_out_i),
                notify: ready(notify_i),
                // A stop that arrived while it ran is fed first, as it would have been had a
                // worker thread still been running (card G3): the next wait feeds the result.
                worker: ready(worker_i) || (done && !stop),
                tree: ready(tree_i),
                lost: ready(lost_i),
            }
        };
        if ready.err_out {
            crate::stdio::flush_err_ready();
        }
        if ready.stderr
            && let Some(c) = &mut self.child
        {
            c.pump_stderr(false);
        }
        // Readiness notices come before the exit they may precede.
        if ready.notify {
            self.take_notices();
        }
        let others = if ready.other {
            self.intake.take_others()
        } else {
            signals::Others::default()
        };
        // A main process that exited is reported before any signal that arrived with its exit,
        // so it is never signalled afterwards (card R1); and before the tree it may have left.
        if ready.pidfd {
            self.main_exited();
        }
        if self.tree_remains && (ready.tree || others.child) {
            self.check_tree();
        } else if others.child
            && let Some(t) = &self.tree
        {
            // Orphans the subreaper adopted while the main process runs.
            t.reap(self.main_pid());
        }
        if ready.worker {
            self.finish_recovery();
        }
        #[cfg(feature = "etcd")]
        if ready.lost {
            if let Some(w) = &self.cluster_wake {
                crate::cluster::drain_wake(w);
            }
            let why = self.cluster.as_ref().and_then(|c| c.lost());
            if let Some(why) = why
                && self.core.holds_lease()
            {
                self.failure = Some(why);
                self.queue.push_back(Event::LeaseLost);
                // Reported once: the descriptor is not polled again.
                self.cluster_wake = None;
            }
        }
        if ready.stop {
            for s in self.intake.take() {
                self.log("signal", json!({"signal": s.name()}));
                self.queue.push_back(Event::Stop(s));
            }
        }
        for n in others.relay {
            self.log("signal", json!({"signal": signal_name(n)}));
            self.queue.push_back(Event::Stray(n));
        }
        let now = Instant::now();
        let expired: Vec<Timer> = self
            .armed_deadlines()
            .filter(|(_, d)| *d <= now)
            .map(|(t, _)| t)
            .collect();
        for t in expired {
            self.queue.push_back(Event::TimerExpired(t));
        }
        if awaiting_main && now >= self.next_pid_file_check {
            self.next_pid_file_check = now + PID_FILE_CHECK;
            self.check_pid_file();
        }
        if self.lease.is_some() && !self.root_lost && now >= self.next_root_check {
            self.next_root_check = now + ROOT_CHECK;
            let moved = self
                .dir
                .as_ref()
                .is_some_and(|d| !matches!(d.is_still_at_path(), Ok(true)));
            if moved {
                self.root_lost = true;
                log::warn!("{} was moved or replaced while owned", self.dir_display());
                self.log("root-lost", json!({}));
                self.queue.push_back(Event::RootLost);
            }
        }
        Ok(())
    }

    /// The main process's pidfd is readable: reap it and say whether it took the whole workload
    /// with it (`child-exited`) or left processes behind (`main-exited`).
    fn main_exited(&mut self) {
        let Some(c) = &mut self.child else { return };
        let status = match c.try_reap() {
            Ok(Some(status)) => status,
            Ok(None) => return,
            Err(e) => {
                log::error!("cannot reap the child: {e}");
                return;
            }
        };
        let pid = c.pid();
        self.child_status = Some(status);
        self.log(
            "child-exited",
            json!({"status": status.to_string(), "child_pid": pid}),
        );
        let empty = match &self.tree {
            Some(t) => match t.is_empty() {
                Ok(empty) => empty,
                Err(e) => {
                    // Without a trustworthy answer the tree counts as still running: the lease
                    // must not be released on a guess.
                    log::warn!("{e}");
                    false
                }
            },
            None => true,
        };
        if empty {
            self.notify = None;
            self.give_terminal_back();
            self.queue.push_back(Event::ChildExited(status));
        } else {
            self.tree_remains = true;
            self.queue.push_back(Event::MainExited(status));
        }
    }

    /// After `main-exited`: feed `tree-empty` once the last process of the workload is gone.
    fn check_tree(&mut self) {
        let Some(t) = &self.tree else { return };
        match t.is_empty() {
            Ok(true) => {
                self.tree_remains = false;
                self.notify = None;
                self.give_terminal_back();
                self.log("tree-empty", json!({}));
                self.queue.push_back(Event::TreeEmpty);
            }
            Ok(false) => {}
            Err(e) => log::warn!("{e}"),
        }
    }

    /// The workload is gone: the terminal it was given comes back to the runner's group.
    fn give_terminal_back(&mut self) {
        if std::mem::take(&mut self.terminal_handed) {
            child::take_terminal_back();
        }
    }

    /// The deadlines of the timers the core counts as armed.
    fn armed_deadlines(&self) -> impl Iterator<Item = (Timer, Instant)> + '_ {
        self.deadlines
            .iter()
            .filter(|(t, _)| self.core.armed(**t))
            .map(|(t, d)| (*t, *d))
    }

    /// Whether the machine waits for a forking daemon's pid file to name its main process.
    fn awaiting_main(&self) -> bool {
        matches!(
            self.core.machine().phase(),
            Phase::Recovering {
                step: RecoveryStep::AwaitingMain,
                outcome: None,
                ..
            }
        )
    }

    /// Card T4: reads the pid file (`O_NOFOLLOW`, a regular file, a few bytes) and adopts the
    /// process it names as the main process if that process is a child of the runner — the
    /// daemon, adopted by the subreaper when its parent exited — and so a process of the tree
    /// whose exit status can be read. Anything else is reported once and looked at again.
    fn check_pid_file(&mut self) {
        let Some(path) = &self.opts.pid_file else {
            return;
        };
        let problem = match read_pid_file(path) {
            Err(why) => why,
            Ok(pid) => match tree::parent_of(pid) {
                Some(ppid) if ppid == std::process::id() => {
                    let adopted = match &mut self.child {
                        Some(c) => c.adopt(pid),
                        None => Err(io::Error::other("no child")),
                    };
                    match adopted {
                        Ok(()) => {
                            self.child_status = None;
                            self.tree_remains = false;
                            self.pid_file_problem = None;
                            log::info!(
                                "{} names pid {pid}, the daemon's main process",
                                path.display()
                            );
                            self.log("main-adopted", json!({"child_pid": pid}));
                            self.queue.push_back(Event::MainAdopted);
                            return;
                        }
                        Err(e) => format!("names pid {pid}, which cannot be watched: {e}"),
                    }
                }
                Some(_) => format!(
                    "names pid {pid}, which is not a process the daemon's first process left to tenure"
                ),
                None => format!("names pid {pid}, which does not run"),
            },
        };
        if self.pid_file_problem.as_deref() != Some(problem.as_str()) {
            log::info!("waiting for the pid file {}: {problem}", path.display());
            self.pid_file_problem = Some(problem);
        }
    }

    /// Reads the workload's notifications; only processes of the workload are heard (card T5).
    fn take_notices(&mut self) {
        let Some(n) = &self.notify else { return };
        // The descriptors passed along stay open until every sender was checked: a
        // `systemd-notify` exits as soon as its `BARRIER=1` descriptor is closed, and a sender
        // that is gone can no longer be found in the workload (card T5).
        let (datagrams, barriers) = n.take_holding();
        for d in datagrams {
            let accepted = d.sender.is_some_and(|pid| self.in_workload(pid));
            if !accepted {
                let pid = d.sender.unwrap_or(0);
                if self.rejected.insert(pid) {
                    log::warn!(
                        "ignored a notification from pid {pid}, which is not a process of the workload"
                    );
                    self.log("notify-rejected", json!({"sender_pid": pid}));
                }
                continue;
            }
            for notice in d.notices {
                if let Some(text) = notice.relayed() {
                    self.tell_supervisor(&text);
                }
                match notice {
                    Notice::Ready => self.queue.push_back(Event::ChildReady),
                    Notice::Stopping => self.queue.push_back(Event::ChildStopping),
                    Notice::Watchdog => self.queue.push_back(Event::ChildWatchdog),
                    Notice::ExtendTimeout(d) => {
                        self.queue.push_back(Event::ChildExtendTimeout(d));
                    }
                    Notice::Status(_) => {}
                }
            }
        }
        drop(barriers);
    }

    /// Whether `pid` is a process of the workload: in its cgroup, or a descendant of the runner.
    fn in_workload(&self, pid: u32) -> bool {
        if pid == std::process::id() {
            return false;
        }
        self.tree
            .as_ref()
            .and_then(Tree::cgroup)
            .is_some_and(|cg| cg.contains(pid))
            || tree::is_descendant(pid, std::process::id())
    }
}

/// Which descriptors `poll` found ready.
struct Ready {
    /// The cluster lease's keep-alive found it lost.
    #[cfg_attr(not(feature = "etcd"), allow(dead_code))]
    lost: bool,
    stop: bool,
    other: bool,
    pidfd: bool,
    stderr: bool,
    /// Our stderr has room for what waits for it.
    err_out: bool,
    notify: bool,
    worker: bool,
    tree: bool,
}

/// Reads a pid file without following a symlink and without blocking on a FIFO: a regular file
/// holding one positive decimal pid.
fn read_pid_file(path: &std::path::Path) -> Result<u32, String> {
    use std::io::Read;
    let fd = rustix::fs::open(
        path,
        rustix::fs::OFlags::RDONLY
            | rustix::fs::OFlags::NOFOLLOW
            | rustix::fs::OFlags::NONBLOCK
            | rustix::fs::OFlags::CLOEXEC,
        rustix::fs::Mode::empty(),
    )
    .map_err(|e| match e {
        rustix::io::Errno::NOENT => "it does not exist yet".to_string(),
        rustix::io::Errno::LOOP => "it is a symbolic link; refusing to follow it".to_string(),
        e => format!("cannot open it: {e}"),
    })?;
    let st = rustix::fs::fstat(&fd).map_err(|e| format!("cannot stat it: {e}"))?;
    if rustix::fs::FileType::from_raw_mode(st.st_mode) != rustix::fs::FileType::RegularFile {
        return Err("it is not a regular file".into());
    }
    let mut buf = [0u8; MAX_PID_FILE + 1];
    let n = File::from(fd)
        .read(&mut buf)
        .map_err(|e| format!("cannot read it: {e}"))?;
    if n > MAX_PID_FILE {
        return Err("it is larger than a pid file".into());
    }
    let text = std::str::from_utf8(&buf[..n]).map_err(|_| "it is not text".to_string())?;
    match text.trim().parse::<u32>() {
        Ok(pid) if pid > 0 => Ok(pid),
        _ if text.trim().is_empty() => Err("it is empty".into()),
        _ => Err(format!("{:?} is not a pid", text.trim())),
    }
}

/// A Linux signal number as a rustix signal (the named ones and SIGRTMIN..=SIGRTMAX).
fn signal_from_number(n: u8) -> Option<rustix::process::Signal> {
    match rustix::process::Signal::from_named_raw(i32::from(n)) {
        Some(s) => Some(s),
        // SAFETY: 34..=64 are real-time signals that glibc does not reserve (it keeps 32 and
        // 33); the value is only ever sent to another process, never handled or blocked here.
        None if (34..=64).contains(&n) => {
            Some(unsafe { rustix::process::Signal::from_raw_unchecked(i32::from(n)) })
        }
        None => None,
    }
}

/// Opens (creating, 0600) the trace file and empties it, but only once it is known to be a
/// regular file with no other name: a path that is a FIFO is never waited on, and a hard link
/// to another file — a state record, say — is refused before a byte of it is lost.
fn open_trace(path: &std::path::Path) -> io::Result<File> {
    let file = open_trace_unemptied(path, TraceCreate::IfMissing)?;
    rustix::fs::fcntl_setfl(&file, rustix::fs::OFlags::empty())?;
    file.set_len(0)?;
    Ok(file)
}

/// How [`open_trace_unemptied`] treats a missing trace file.
#[derive(Clone, Copy, PartialEq, Eq)]
enum TraceCreate {
    /// Create it (`O_CREAT`).
    IfMissing,
    /// Create it only if no file has the name (`O_EXCL`).
    New,
    /// Never create it.
    No,
}

/// Checks that `path` can be the trace file exactly as [`open_trace`] will open it, but
/// without emptying it and without leaving anything behind: an existing file is opened for
/// writing and left as it was, and a missing one is created and removed again. `tenure up`
/// calls it before it creates anything in the state dir, so a trace path that cannot work
/// leaves the dir as it was (the owner it launches would refuse it only after `up` made the
/// dir and its records).
pub(crate) fn check_trace(path: &std::path::Path) -> io::Result<()> {
    use std::os::unix::fs::MetadataExt;
    match open_trace_unemptied(path, TraceCreate::No) {
        Ok(_) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            let file = open_trace_unemptied(path, TraceCreate::New)?;
            let made = file.metadata()?;
            // Removed only while the name is still the file made here.
            if std::fs::symlink_metadata(path)
                .is_ok_and(|m| m.dev() == made.dev() && m.ino() == made.ino())
            {
                std::fs::remove_file(path)?;
            }
            Ok(())
        }
        Err(e) => Err(e),
    }
}

/// Reports what the keep of an output (card P1) could not keep beside it, and a failure after
/// the output was moved into `failed/` (it is kept there all the same); returns where what the
/// child left beside its output was kept.
fn report_keep(k: &crate::checkpoint::KeptFailure) -> Vec<String> {
    for (path, err) in &k.failures {
        log::error!(
            "what the child left beside its output, {}, could not be kept: {err}",
            path.display()
        );
    }
    if let (Ok(Some(area)), Some(err)) = (&k.area, &k.after) {
        log::warn!(
            "after the child's output was moved to {} (it is kept there): {err}",
            area.display()
        );
    }
    k.beside.iter().map(|p| p.display().to_string()).collect()
}

/// Names where what the child left beside its output was kept, if anything.
fn report_beside(beside: &[String]) {
    if !beside.is_empty() {
        log::error!(
            "the child also left files beside its output; they were kept in {}",
            beside.join(", ")
        );
    }
}

/// What to do with an output kept in `kept` (card P1), for the run of `dir`: what the child
/// left in place of its output directory may be a file of another kind, and the fix copies
/// what can be published.
fn kept_fix(dir: &std::path::Path, kept: &std::path::Path) -> String {
    let (d, k) = (dir.display(), kept.display());
    match std::fs::symlink_metadata(kept).map(|m| m.file_type()) {
        Ok(t) if t.is_dir() => format!(
            "fix it there, then publish it with: tenure run --dir {d} -- sh -c 'cp -a {k}/. \"$TENURE_CHECKPOINT_OUT\"'"
        ),
        Ok(t) if t.is_file() => format!(
            "fix it there (it is a file, where a directory of files was expected), then publish it with: tenure run --dir {d} -- sh -c 'cp {k} \"$TENURE_CHECKPOINT_OUT/\"'"
        ),
        _ => "fix it there: it is not a directory of regular files and directories, so there is nothing to publish as it is".to_owned(),
    }
}

/// The trace file, opened for writing (non-blocking, not followed if a symlink) and checked to
/// be a regular file with one name, with its content untouched.
fn open_trace_unemptied(path: &std::path::Path, create: TraceCreate) -> io::Result<File> {
    use std::os::unix::fs::MetadataExt;
    // Looked at first, so a FIFO or a device is never opened; the check after the open is
    // the one that counts.
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.file_type().is_symlink() => {
            return Err(io::Error::other("it is a symbolic link"));
        }
        Ok(m) if !m.is_file() => return Err(io::Error::other("it is not a regular file")),
        _ => {}
    }
    let file = std::fs::OpenOptions::new()
        .write(true)
        .create(create == TraceCreate::IfMissing)
        .create_new(create == TraceCreate::New)
        .mode(0o600)
        .custom_flags((rustix::fs::OFlags::NOFOLLOW | rustix::fs::OFlags::NONBLOCK).bits() as i32)
        .open(path)?;
    let st = file.metadata()?;
    if !st.is_file() {
        return Err(io::Error::other("it is not a regular file"));
    }
    if st.nlink() > 1 {
        return Err(io::Error::other(format!(
            "it has {} names (hard links), and a trace would overwrite the file behind all of them",
            st.nlink()
        )));
    }
    Ok(file)
}

impl TraceWriter {
    fn line(&mut self, line: &TraceLine) {
        if let Ok(mut text) = serde_json::to_string(line) {
            text.push('\n');
            if let Err(e) = self.file.write_all(text.as_bytes()) {
                log::warn!("cannot write the trace: {e}");
            }
        }
    }
}

/// The recovery worker: verify the current checkpoint, copy it into a read-only view for the
/// child, and make an empty staging area for the next publish.
/// `cancel` is checked before each step that writes (the view, the staging area): a recovery
/// abandoned by a stop signal stops writing before the lease is released.
/// `no_current`: the caller, holding the lease, just found no CURRENT (and has no cluster
/// pointer); that look is the recovery's answer, as it already decides that no worker thread
/// is needed, and CURRENT is not looked up a second time (issue 11).
fn recover(
    dir: &StateDir,
    keep: usize,
    cancel: &std::sync::atomic::AtomicBool,
    pointer: Option<&dyn crate::checkpoint::CurrentPointer>,
    no_current: bool,
) -> Result<Recovered, (Fault, String)> {
    let cancelled = || cancel.load(std::sync::atomic::Ordering::SeqCst);
    let abandoned = || (Fault::Io, "recovery was abandoned".to_string());
    let fail = |e: CheckpointError| {
        let fault = if e.is_corrupt_state() {
            Fault::State
        } else {
            Fault::Io
        };
        (fault, e.to_string())
    };
    let open = || match CheckpointStore::open_owned(dir, StoreOptions { keep }) {
        // Scratch that a child running as another user (`--user`) still owned when its runner
        // ended without cleaning up (a crash): taken back, so that the sweep removes it.
        Err(CheckpointError::Fs(crate::privfs::FsError::NotOwned { path, .. }))
            if user::is_scratch(dir, &path) =>
        {
            user::take_back_scratch(dir).map_err(|e| (Fault::Io, e.to_string()))?;
            Ok(CheckpointStore::open_owned(dir, StoreOptions { keep }))
        }
        other => Ok(other),
    };
    let store = match pointer {
        Some(p) => CheckpointStore::open_owned_shared(dir, StoreOptions { keep })
            .map_err(fail)?
            .with_pointer(p),
        None => open()?.map_err(fail)?,
    };
    // A named point before the checkpoint is read and verified: tests hold the worker here
    // (`gate`) to stop a run deterministically while it verifies, or fail it (`eio`).
    crate::failpoint::hit("recover.verify").map_err(|e| {
        (
            Fault::Io,
            format!(
                "cannot verify the checkpoint of {}: {e}",
                dir.path().display()
            ),
        )
    })?;
    if cancelled() {
        return Err(abandoned());
    }
    // One streaming pass verifies the checkpoint and copies it into the child's view, in
    // memory and descriptors that do not grow with its size or depth.
    let materialised = if no_current {
        None
    } else {
        store.materialise_current().map_err(fail)?
    };
    let (current, view) = match materialised {
        Some((c, v)) => (Some(c), Some(v)),
        None => (None, None),
    };
    if cancelled() {
        if let Some(v) = view {
            let _ = store.remove_view(v);
        }
        return Err(abandoned());
    }
    let staging = store.staging().map_err(fail)?;
    Ok(Recovered {
        checkpoint: current.map(|c| (c.id, c.files, c.bytes)),
        view,
        staging,
        dirs: store.owned_handles(),
    })
}

/// Without the `etcd` feature no run has a cluster pointer; this type has no value.
#[cfg(not(feature = "etcd"))]
#[derive(Debug)]
enum NoPointer {}

#[cfg(not(feature = "etcd"))]
impl crate::checkpoint::CurrentPointer for NoPointer {
    fn read(&self) -> Result<Option<crate::checkpoint::format::Current>, CheckpointError> {
        match *self {}
    }
    fn replace(
        &self,
        _: &crate::checkpoint::format::Current,
        _: u64,
    ) -> Result<(), CheckpointError> {
        match *self {}
    }
    fn describe(&self) -> String {
        match *self {}
    }
}

fn to_rustix(s: Signal) -> rustix::process::Signal {
    match s {
        Signal::Term => rustix::process::Signal::TERM,
        Signal::Int => rustix::process::Signal::INT,
        Signal::Hup => rustix::process::Signal::HUP,
    }
}

fn cause_name(c: DrainCause) -> String {
    match c {
        DrainCause::Signal(s) => s.name().to_string(),
        DrainCause::Requested => "requested".into(),
        DrainCause::ChildStopping => "child-stopping".into(),
        DrainCause::ChildExited => "child-exited".into(),
        DrainCause::RootLost => "root-lost".into(),
        DrainCause::Watchdog => "watchdog".into(),
        DrainCause::LeaseLost => "lease-lost".into(),
    }
}

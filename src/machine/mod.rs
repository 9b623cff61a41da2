//! The pure lifecycle machine: the one transition function that the library, the runner and the
//! models all execute.
//!
//! The machine is sans-IO (in the sense of quinn-proto): it reads no clock, touches no file and
//! starts no thread. The driver observes the world, turns what it sees into an [`Event`], calls
//! [`Machine::handle`] and executes the returned [`Action`]s in order. Time enters only as the
//! expiry of a [`Timer`] the machine armed. An event that is illegal in the current phase is a
//! typed [`Rejected`] error naming both; events the spec calls "ignored" return an empty
//! [`Handled`] with `ignored` set. Nothing here panics.
//!
//! The rules are a hierarchical state machine written with statig (`rules`): leaf states are
//! the steps of the phases, superstates decide what their steps share (cold, owning,
//! recovering, stopping, closing, terminal) and a root rejects whatever no state acted on. A
//! [`Machine`] is the configuration plus the generated state enum, so it stays `Copy + Eq +
//! Hash`; [`Phase`] is the public view of that state. The state tree and why each superstate
//! holds what it holds: spec/lifecycle.md, "How statig carries the rules".

mod action;
mod admission;
mod event;
mod residency;
mod rules;
pub mod table;
pub mod trace;

pub use action::{
    Action, DrainCause, EXIT_BUSY, EXIT_DID_NOT_STOP, EXIT_IO, EXIT_KILLED, EXIT_LEASE_LOST,
    EXIT_NOT_EXECUTABLE, EXIT_NOT_FOUND, EXIT_NOT_READY, EXIT_REFUSED, EXIT_USAGE, Note, Outcome,
    Reason, Refusal, Target, reason_name, refusal_name,
};
pub use admission::{NotAdmitted, OpClass, admit};
pub use event::{ChildStatus, Event, ExecFailure, Fault, Signal, Timer, signal_name};
pub use residency::{IdleDecision, Residencies, ResidencyKind, RetireMode};

use serde::{Deserialize, Serialize};
use std::fmt;
use std::time::Duration;

/// The name of a lifecycle phase, without the data the machine keeps in it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PhaseKind {
    /// Not owning: before the lease, or waiting for it.
    Cold,
    /// Owning; the checkpoint is being verified and the workload is starting.
    Recovering,
    /// Owning and serving.
    Ready,
    /// Owning; the workload is stopping and the checkpoint is being published.
    Draining,
    /// Terminal: the lease was released after an orderly end.
    Released,
    /// Terminal: stopped before owning (a stop signal, or the wait bound expired).
    Cancelled,
    /// Terminal: stopped or failed while recovering, or the state was refused.
    Refused,
}

impl PhaseKind {
    /// Every phase, in lifecycle order.
    pub const ALL: [PhaseKind; 7] = [
        PhaseKind::Cold,
        PhaseKind::Recovering,
        PhaseKind::Ready,
        PhaseKind::Draining,
        PhaseKind::Released,
        PhaseKind::Cancelled,
        PhaseKind::Refused,
    ];

    /// Whether the phase is an end: nothing leaves it.
    pub const fn is_terminal(self) -> bool {
        matches!(
            self,
            PhaseKind::Released | PhaseKind::Cancelled | PhaseKind::Refused
        )
    }

    /// Whether a process in this phase owns the lease.
    pub const fn owns(self) -> bool {
        matches!(
            self,
            PhaseKind::Recovering | PhaseKind::Ready | PhaseKind::Draining
        )
    }

    /// The lowercase name used in records, logs and the spec.
    pub const fn name(self) -> &'static str {
        phase_name(self)
    }
}

impl fmt::Display for PhaseKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(phase_name(*self))
    }
}

pub(crate) const fn phase_name(p: PhaseKind) -> &'static str {
    match p {
        PhaseKind::Cold => "cold",
        PhaseKind::Recovering => "recovering",
        PhaseKind::Ready => "ready",
        PhaseKind::Draining => "draining",
        PhaseKind::Released => "released",
        PhaseKind::Cancelled => "cancelled",
        PhaseKind::Refused => "refused",
    }
}

/// How the owner decides that its workload is ready (the runner's `--type`, after systemd's
/// `Type=`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ReadyMode {
    /// `--type simple`: ready as soon as the child is spawned.
    Start,
    /// `--type notify`: ready when the workload sends `READY=1` over `NOTIFY_SOCKET`.
    Notify,
    /// `--type forking`: the first process daemonizes; ready when it exits 0 and leaves a tree
    /// behind (and, with `--pidfile`, once the pid file names the daemon's main process). What
    /// remains of the tree is the workload.
    Forking,
}

/// Where a stop signal goes first (the runner's `--kill-mode`, after systemd's `KillMode=`).
/// Either way the lease is kept until every process of the workload is gone: what remains
/// after the main process exits gets the stop signal, the grace, then SIGKILL.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum KillMode {
    /// Every process of the workload gets the stop signal at once (systemd's
    /// `control-group`).
    Tree,
    /// The main process gets the stop signal; what remains of its tree gets it once the main
    /// process exited (systemd's `process`, without ever abandoning the rest).
    Main,
}

/// What SIGHUP means to the owner (the runner's `--hup`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum HupPolicy {
    /// HUP is a stop signal like TERM and INT.
    Stop,
    /// While ready or draining, HUP is forwarded to the workload's main process (the reload
    /// convention: `ExecReload=kill -HUP`, logrotate). While waiting and recovering it still
    /// cancels or refuses (cards G1, G3).
    Forward,
}

/// What of a child workload still runs, while it runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Running {
    /// The main process runs (with whatever descendants it has).
    Main,
    /// The main process has exited (its status is in the outcome, if it was ever known) but
    /// processes of its tree remain; or a forking daemon whose main process is not known yet.
    Tree,
}

/// What the owner runs while it owns the state dir.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Workload {
    /// The host process itself (library use): recovery is the host's, drain waits for
    /// residencies to settle.
    InProcess,
    /// A supervised child process (the runner): signals are forwarded, the child is reaped.
    Child(ReadyMode),
}

/// The machine's fixed configuration. Durations are validated by the caller (card H6): the
/// machine only carries them into [`Action::ArmTimer`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Config {
    /// What runs while owning.
    pub workload: Workload,
    /// How long the workload may take to stop before it is killed (child) or reported as not
    /// settled (in-process).
    pub grace: Duration,
    /// How long a killed child may take to be reaped before `did not stop` is reported.
    pub kill_wait: Duration,
    /// How long a notify-mode child may take to send `READY=1` (a forking one: to exit 0 and
    /// name its main process); `None` waits forever.
    pub ready_timeout: Option<Duration>,
    /// The exit code of the busy outcome (default 75, like flock's `-E`).
    pub busy_code: u8,
    /// Where stop signals go first.
    pub kill_mode: KillMode,
    /// What SIGHUP means.
    pub hup: HupPolicy,
    /// While ready, the workload must send `WATCHDOG=1` at least this often or it is stopped
    /// (`--watchdog`); `None`: no watchdog.
    pub watchdog: Option<Duration>,
    /// With [`ReadyMode::Forking`]: readiness also waits for the pid file to name the main
    /// process (`--pidfile`).
    pub pid_file: bool,
}

impl Config {
    /// Defaults of the runner: 10 s grace, 5 s kill wait, busy = 75, HUP forwarded, no
    /// watchdog; stop signals go to the whole tree, except for a forking daemon, whose main
    /// process gets them first.
    pub const fn child(ready: ReadyMode) -> Config {
        Config {
            workload: Workload::Child(ready),
            grace: Duration::from_secs(10),
            kill_wait: Duration::from_secs(5),
            ready_timeout: None,
            busy_code: EXIT_BUSY,
            kill_mode: match ready {
                ReadyMode::Forking => KillMode::Main,
                ReadyMode::Start | ReadyMode::Notify => KillMode::Tree,
            },
            hup: HupPolicy::Forward,
            watchdog: None,
            pid_file: false,
        }
    }

    /// Defaults of an in-process host: 10 s to settle residencies.
    pub const fn in_process() -> Config {
        Config {
            workload: Workload::InProcess,
            grace: Duration::from_secs(10),
            kill_wait: Duration::from_secs(5),
            ready_timeout: None,
            busy_code: EXIT_BUSY,
            kill_mode: KillMode::Tree,
            hup: HupPolicy::Stop,
            watchdog: None,
            pid_file: false,
        }
    }
}

/// Steps of the cold phase.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ColdStep {
    /// Not started.
    Idle,
    /// Trying to take the lock.
    Acquiring,
    /// The lock is held by another owner; visible as a waiter.
    Waiting,
}

/// How far stopping the workload has gone.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ChildStop {
    /// The child announced `STOPPING=1`; nothing was sent to it and no timer runs.
    Announced,
    /// A stop signal was forwarded; the grace timer runs.
    Signalled,
    /// SIGKILL was sent to every process of the workload; the kill-wait timer runs.
    Killed,
    /// A process of the workload survived SIGKILL past the kill wait; the lease is kept until
    /// the whole workload is gone.
    Unreapable,
}

/// Steps of the recovering phase.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum RecoveryStep {
    /// The checkpoint is being read and verified (and, in-process, the host recovers).
    Verifying,
    /// The child is being started.
    Spawning,
    /// The child runs; waiting for `READY=1` (a forking one: for its first process to exit).
    AwaitingReady,
    /// A forking daemon's first process exited 0; waiting for the pid file to name the main
    /// process. What remains of the tree runs.
    AwaitingMain,
    /// Recovery was abandoned; the workload is being stopped. Nothing will be published.
    Aborting(ChildStop, Running),
    /// Recovery was abandoned; the lease is being released.
    Releasing,
}

/// Steps of the draining phase.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum DrainStep {
    /// In-process: waiting for active residencies to settle; the grace timer runs.
    Settling,
    /// In-process: the grace expired with active residencies; the lease is kept until they
    /// settle.
    Unsettled,
    /// The workload is being stopped.
    Stopping(ChildStop, Running),
    /// The checkpoint is being published.
    Publishing,
    /// The lease is being released.
    Releasing,
}

/// A phase with the data the machine keeps in it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", tag = "phase")]
pub enum Phase {
    /// Not owning.
    Cold {
        /// Where in acquiring.
        step: ColdStep,
        /// A drain was requested (and begun) before the lease: recover, then close.
        drain_pending: bool,
    },
    /// Owning, recovering.
    Recovering {
        /// The ownership's epoch.
        epoch: u64,
        /// Where in recovery.
        step: RecoveryStep,
        /// A drain was requested (and begun) before recovery completed.
        drain_pending: bool,
        /// The end recorded when recovery was abandoned.
        outcome: Option<Outcome>,
    },
    /// Owning, serving.
    Ready {
        /// The ownership's epoch.
        epoch: u64,
        /// What of a child workload runs ([`Running::Main`] for an in-process host).
        running: Running,
    },
    /// Owning, draining.
    Draining {
        /// The ownership's epoch.
        epoch: u64,
        /// Why the drain began.
        cause: DrainCause,
        /// Where in the drain.
        step: DrainStep,
        /// The end being built.
        outcome: Outcome,
    },
    /// Terminal: released after an orderly end.
    Released(Outcome),
    /// Terminal: ended before owning.
    Cancelled(Outcome),
    /// Terminal: refused while or before recovering.
    Refused(Outcome),
}

impl Phase {
    /// The phase's name.
    pub const fn kind(&self) -> PhaseKind {
        match self {
            Phase::Cold { .. } => PhaseKind::Cold,
            Phase::Recovering { .. } => PhaseKind::Recovering,
            Phase::Ready { .. } => PhaseKind::Ready,
            Phase::Draining { .. } => PhaseKind::Draining,
            Phase::Released(_) => PhaseKind::Released,
            Phase::Cancelled(_) => PhaseKind::Cancelled,
            Phase::Refused(_) => PhaseKind::Refused,
        }
    }

    /// The epoch of the ownership, while owning.
    pub const fn epoch(&self) -> Option<u64> {
        match self {
            Phase::Recovering { epoch, .. }
            | Phase::Ready { epoch, .. }
            | Phase::Draining { epoch, .. } => Some(*epoch),
            Phase::Cold { .. } | Phase::Released(_) | Phase::Cancelled(_) | Phase::Refused(_) => {
                None
            }
        }
    }

    /// The outcome, once the machine ended.
    pub const fn outcome(&self) -> Option<Outcome> {
        match self {
            Phase::Released(o) | Phase::Cancelled(o) | Phase::Refused(o) => Some(*o),
            Phase::Cold { .. }
            | Phase::Recovering { .. }
            | Phase::Ready { .. }
            | Phase::Draining { .. } => None,
        }
    }

    /// A short label with the step, e.g. `draining(stopping: signalled)`, used by the spec
    /// table and traces.
    pub fn label(&self) -> String {
        match self {
            Phase::Cold {
                step,
                drain_pending,
            } => {
                let s = match step {
                    ColdStep::Idle => "idle",
                    ColdStep::Acquiring => "acquiring",
                    ColdStep::Waiting => "waiting",
                };
                format!(
                    "cold({s}{})",
                    if *drain_pending {
                        ", drain pending"
                    } else {
                        ""
                    }
                )
            }
            Phase::Recovering {
                step,
                drain_pending,
                outcome,
                ..
            } => {
                // A recovery abandoned because the lease was lost releases nothing once the
                // workload is gone: a row of its own.
                let lost = match outcome {
                    Some(o) if o.refusal == Some(Refusal::LeaseLost) => ", lease lost",
                    Some(_) | None => "",
                };
                let s = match step {
                    RecoveryStep::Verifying => "verifying".to_string(),
                    RecoveryStep::Spawning => "spawning".to_string(),
                    RecoveryStep::AwaitingReady => "awaiting ready".to_string(),
                    RecoveryStep::AwaitingMain => "awaiting main pid".to_string(),
                    RecoveryStep::Aborting(c, r) => {
                        format!(
                            "aborting: {}{}{lost}",
                            child_stop_name(*c),
                            running_suffix(*r)
                        )
                    }
                    RecoveryStep::Releasing => "releasing".to_string(),
                };
                format!(
                    "recovering({s}{})",
                    if *drain_pending {
                        ", drain pending"
                    } else {
                        ""
                    }
                )
            }
            Phase::Ready { running, .. } => match running {
                Running::Main => "ready".to_string(),
                Running::Tree => "ready(tree only)".to_string(),
            },
            Phase::Draining {
                step,
                outcome,
                cause,
                ..
            } => {
                let s = match step {
                    DrainStep::Settling => "settling".to_string(),
                    DrainStep::Unsettled => "unsettled".to_string(),
                    // Whether the main process exited 0 decides whether the drain publishes once
                    // the rest of its tree is gone, so it is part of the row.
                    DrainStep::Stopping(
                        c @ (ChildStop::Announced | ChildStop::Signalled),
                        Running::Tree,
                    ) if outcome.child.is_some_and(ChildStatus::success) => {
                        format!(
                            "stopping: {}, tree only, main exited 0",
                            child_stop_name(*c)
                        )
                    }
                    DrainStep::Stopping(c, r) => {
                        format!("stopping: {}{}", child_stop_name(*c), running_suffix(*r))
                    }
                    DrainStep::Publishing => "publishing".to_string(),
                    DrainStep::Releasing => "releasing".to_string(),
                };
                // A watchdog drain never publishes, whatever the exit: a row of its own.
                let publishing_step = matches!(
                    step,
                    DrainStep::Stopping(ChildStop::Announced | ChildStop::Signalled, _)
                );
                // A drain whose lease was lost publishes nothing more and releases nothing: a
                // row of its own in every step.
                let cause = match cause {
                    DrainCause::Watchdog if publishing_step => ", watchdog",
                    DrainCause::LeaseLost => ", lease lost",
                    DrainCause::Watchdog
                    | DrainCause::Signal(_)
                    | DrainCause::Requested
                    | DrainCause::ChildStopping
                    | DrainCause::ChildExited
                    | DrainCause::RootLost => "",
                };
                format!("draining({s}{cause})")
            }
            Phase::Released(o) => format!("released({})", o.summary()),
            Phase::Cancelled(o) => format!("cancelled({})", o.summary()),
            Phase::Refused(o) => format!("refused({})", o.summary()),
        }
    }
}

/// The label suffix of a stop step whose main process has exited.
const fn running_suffix(r: Running) -> &'static str {
    match r {
        Running::Main => "",
        Running::Tree => ", tree only",
    }
}

pub(crate) const fn child_stop_name(c: ChildStop) -> &'static str {
    match c {
        ChildStop::Announced => "announced",
        ChildStop::Signalled => "signalled",
        ChildStop::Killed => "killed",
        ChildStop::Unreapable => "unreapable",
    }
}

/// The lifecycle machine of one owner: its configuration and its state (a state of the statig
/// machine in `rules`, seen from outside as a [`Phase`]). Cheap to copy, `Eq` and `Hash`, so the
/// models can keep many of them in a state. It serialises as its configuration and phase.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(into = "MachineView", from = "MachineView")]
pub struct Machine {
    config: Config,
    state: rules::State,
}

/// How a machine is written and read: the configuration and the phase.
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
#[serde(rename = "Machine")]
struct MachineView {
    config: Config,
    phase: Phase,
}

impl From<Machine> for MachineView {
    fn from(m: Machine) -> MachineView {
        MachineView {
            config: m.config,
            phase: m.phase(),
        }
    }
}

impl From<MachineView> for Machine {
    fn from(v: MachineView) -> Machine {
        Machine::with_phase(v.config, v.phase)
    }
}

impl fmt::Debug for Machine {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Machine")
            .field("config", &self.config)
            .field("phase", &self.phase())
            .finish()
    }
}

/// An event that is illegal in the current phase. The machine is left unchanged.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("event `{event}` is not allowed in phase `{phase}` ({label})")]
pub struct Rejected {
    /// The phase the machine was in.
    pub phase: PhaseKind,
    /// The phase with its step.
    pub label: String,
    /// The rejected event.
    pub event: Event,
}

/// The result of an accepted event.
#[derive(Debug, Clone, PartialEq, Eq)]
#[must_use]
pub struct Handled {
    /// What the driver must do, in order.
    pub actions: Vec<Action>,
    /// The spec says this event is ignored in this phase: nothing changed.
    pub ignored: bool,
}

impl Machine {
    /// A new machine in `cold(idle)`.
    pub const fn new(config: Config) -> Machine {
        Machine {
            config,
            state: rules::INITIAL,
        }
    }

    /// A machine in an arbitrary phase; for renderers and models that enumerate states.
    /// A recovering phase keeps its outcome only once recovery was abandoned; an abandoned
    /// recovery without an outcome (which the rules never produce) is read as refused with no
    /// recorded cause.
    pub const fn with_phase(config: Config, phase: Phase) -> Machine {
        Machine {
            config,
            state: rules::state_of(&phase, config.busy_code),
        }
    }

    /// The configuration.
    pub const fn config(&self) -> &Config {
        &self.config
    }

    /// The current phase with its data.
    pub const fn phase(&self) -> Phase {
        rules::phase_of(&self.state)
    }

    /// The current phase's name.
    pub const fn kind(&self) -> PhaseKind {
        rules::kind_of(&self.state)
    }

    /// Whether the machine has ended.
    pub const fn is_terminal(&self) -> bool {
        self.kind().is_terminal()
    }

    /// Feed one event. On success the phase may have changed and the actions must be executed in
    /// order; on rejection nothing changed.
    pub fn handle(&mut self, event: Event) -> Result<Handled, Rejected> {
        let mut reply = rules::reply();
        let next = rules::step(self.config, self.state, &event, &mut reply);
        match reply.verdict {
            rules::Verdict::Moved => {
                self.state = next;
                Ok(Handled {
                    actions: reply.actions,
                    ignored: false,
                })
            }
            rules::Verdict::Ignored => Ok(Handled {
                actions: Vec::new(),
                ignored: true,
            }),
            rules::Verdict::Rejected => Err(Rejected {
                phase: self.kind(),
                label: self.phase().label(),
                event,
            }),
        }
    }

    /// The pure form of [`Machine::handle`]: the next machine and its actions, leaving `self`
    /// untouched.
    pub fn step(&self, event: Event) -> Result<(Machine, Handled), Rejected> {
        let mut next = *self;
        let handled = next.handle(event)?;
        Ok((next, handled))
    }
}

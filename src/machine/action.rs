//! Outputs of the machine: plain data the driver executes, in order.

use super::PhaseKind;
use super::event::{ChildStatus, ExecFailure, Signal, Timer, timer_name};
use serde::{Deserialize, Serialize};
use std::fmt;
use std::time::Duration;

/// One thing the driver must do. The driver executes a step's actions in order and reports what
/// happened as new events.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", tag = "action", content = "arg")]
#[must_use]
pub enum Action {
    /// Acquire the lease within the configured wait bound; answer with `LeaseBusy` (once, when
    /// contended), then `LeaseGranted`, `WaitExpired` or `LeaseFailed`.
    AcquireLease,
    /// Stop waiting for the lease and remove this process's waiter entry.
    AbandonAcquire,
    /// Rewrite the owner's registration (owner record) with this phase.
    SetPhase(PhaseKind),
    /// Read and verify the current checkpoint and recover from it; answer `RecoveryDone` or
    /// `RecoveryFailed`.
    Recover,
    /// Start the child with the checkpoint views in its environment; answer `ChildSpawned` or
    /// `SpawnFailed`.
    SpawnChild,
    /// Arm a timer; the driver answers `TimerExpired` when it fires unless it was disarmed.
    ArmTimer(Timer, Duration),
    /// Disarm a timer (no effect if it is not armed).
    DisarmTimer(Timer),
    /// Tell this process's own supervisor `READY=1` (sd_notify), if it has one.
    NotifyReady,
    /// Tell this process's own supervisor `STOPPING=1` (sd_notify), if it has one.
    NotifyStopping,
    /// Run the host's begin-drain hook: stop taking new work. Emitted once per ownership.
    BeginDrain,
    /// Send this stop signal to the target (through pidfds: a process that already exited is
    /// never signalled).
    Forward(Signal, Target),
    /// Send this other signal (by number: USR1, WINCH, ...) to the target.
    Relay(u8, Target),
    /// Send SIGKILL to every process of the workload.
    Kill,
    /// The timer must not fire before this much time from now (it keeps a later deadline).
    ExtendTimer(Timer, Duration),
    /// Publish the staged checkpoint, fenced by the epoch; answer `CheckpointPublished`,
    /// `CheckpointSkipped` or `CheckpointFailed`.
    Publish,
    /// Release the lease; answer `LeaseReleased`.
    ReleaseLease,
    /// Append this record to the event log.
    Note(Note),
    /// End the run with this outcome (exit code, reason); always the last action.
    Exit(Outcome),
}

/// A line of the event log (card D6). The driver adds time, epoch, pid and identity.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", tag = "note", content = "arg")]
pub enum Note {
    /// The lock is held by another owner; waiting.
    Waiting,
    /// The lease was granted with this epoch.
    Owned(u64),
    /// The child was started.
    Spawned,
    /// The owner is ready.
    Ready,
    /// The drain began.
    Draining(DrainCause),
    /// The readiness timer fired before `READY=1`.
    ReadinessTimedOut,
    /// The watchdog timer fired: no `WATCHDOG=1` in time.
    WatchdogTimedOut,
    /// The main process exited but processes of its tree remain: they are stopped (stop signal,
    /// grace, SIGKILL) before the lease is released.
    TreeRemains,
    /// The workload did not stop within the grace period and was sent SIGKILL.
    Killed,
    /// A process of the workload survived SIGKILL past the kill wait; the lease is kept until
    /// the whole workload is gone.
    DidNotStop,
    /// The drain's checkpoint is durable.
    CheckpointPublished,
    /// Publishing the checkpoint failed; CURRENT is unchanged.
    PublishFailed,
    /// The lease was released.
    Released,
    /// The run was refused (while or before recovering).
    Refused,
    /// The run was cancelled before owning.
    Cancelled,
    /// The wait bound expired against a live owner.
    Busy,
    /// The cluster lease was lost while owned: the workload is stopped at once, nothing is
    /// published and nothing released.
    LeaseLost,
}

/// Which processes of the workload a signal is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Target {
    /// The main process only.
    Main,
    /// Every process of the workload (the main process, if it still runs, and every
    /// descendant).
    Tree,
}

/// Why a drain began.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", tag = "cause", content = "signal")]
pub enum DrainCause {
    /// A stop signal arrived.
    Signal(Signal),
    /// The host asked for it (`request_drain`, idle exit).
    Requested,
    /// The child announced `STOPPING=1`.
    ChildStopping,
    /// The child exited by itself.
    ChildExited,
    /// The state dir was moved or replaced (card H7).
    RootLost,
    /// The ready workload missed its `WATCHDOG=1` ping.
    Watchdog,
    /// The cluster lease was lost: the workload is killed at once and nothing is published.
    LeaseLost,
}

/// Why a run ended: the `reason` of the run's end record (card R1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Reason {
    /// The workload ended by itself; its exit code is passed through.
    Exited,
    /// An orderly stop after a stop signal, a drain request, or a moved root.
    Stopped,
    /// The workload did not stop within the grace period and was killed.
    Killed,
    /// The child survived SIGKILL; the lease was kept until it was finally reaped.
    DidNotStop,
    /// Stopped or failed while recovering, or the state was refused. Nothing was published.
    Refused,
    /// A stop signal arrived before the lease was owned.
    Cancelled,
    /// The wait bound expired while another owner held the lease.
    Busy,
    /// The child could not be executed.
    SpawnFailed,
    /// The drain's checkpoint could not be published; CURRENT is unchanged.
    PublishFailed,
    /// The ready workload missed its watchdog ping and was stopped. Nothing was published.
    Watchdog,
}

/// Why a run was refused (details of [`Reason::Refused`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", tag = "cause", content = "signal")]
pub enum Refusal {
    /// A stop signal arrived while recovering.
    Signal(Signal),
    /// The state dir or the checkpoint was refused as foreign, corrupt or permissive.
    State,
    /// An I/O error while acquiring or recovering.
    Io,
    /// The child did not send `READY=1` in time.
    ReadinessTimedOut,
    /// The state dir was moved or replaced while recovering.
    RootLost,
    /// A forking daemon's tree ended before its pid file named a main process.
    NoMainPid,
    /// The cluster lease was lost while owned (expired, or not kept alive in time): another
    /// owner may hold it, so the workload was killed, nothing was published after the loss and
    /// nothing was released.
    LeaseLost,
}

/// How a run ended: the reason, the process exit code and the details behind them. The exit
/// codes follow the table in spec/lifecycle.md, which is rendered from [`Outcome::code`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Outcome {
    /// Why the run ended.
    pub reason: Reason,
    /// The stop signal that caused the end, if one did.
    pub signal: Option<Signal>,
    /// How the child ended, if there was one and it was reaped.
    pub child: Option<ChildStatus>,
    /// Details of a refusal.
    pub refusal: Option<Refusal>,
    /// Details of an exec failure.
    pub exec: Option<ExecFailure>,
    /// Whether the child had to be sent SIGKILL after the grace period.
    pub killed: bool,
    /// The exit code the busy outcome uses (configurable like flock's `-E`).
    pub busy_code: u8,
}

/// Exit code: command-line usage error (sysexits EX_USAGE).
pub const EXIT_USAGE: u8 = 64;
/// Exit code: the state was refused (sysexits EX_DATAERR).
pub const EXIT_REFUSED: u8 = 65;
/// Exit code: readiness timed out (sysexits EX_UNAVAILABLE).
pub const EXIT_NOT_READY: u8 = 69;
/// Exit code: the child did not stop after SIGKILL (sysexits EX_SOFTWARE).
pub const EXIT_DID_NOT_STOP: u8 = 70;
/// Exit code: an I/O error on the state dir or while publishing (sysexits EX_IOERR).
pub const EXIT_IO: u8 = 74;
/// Exit code: the lease is busy and the wait bound expired (sysexits EX_TEMPFAIL); configurable.
pub const EXIT_BUSY: u8 = 75;
/// Exit code: the cluster lease was lost while owned (sysexits EX_PROTOCOL: the cluster said
/// the lease is gone, or could not say in time that it is not).
pub const EXIT_LEASE_LOST: u8 = 76;
/// Exit code: the executable was found but could not be run.
pub const EXIT_NOT_EXECUTABLE: u8 = 126;
/// Exit code: the executable was not found.
pub const EXIT_NOT_FOUND: u8 = 127;
/// Exit code: the workload was killed after the grace period (128 + SIGKILL).
pub const EXIT_KILLED: u8 = 137;

impl Outcome {
    pub(crate) const fn new(reason: Reason, busy_code: u8) -> Outcome {
        Outcome {
            reason,
            signal: None,
            child: None,
            refusal: None,
            exec: None,
            killed: false,
            busy_code,
        }
    }

    /// The exit code of the runner for this outcome.
    pub const fn code(&self) -> u8 {
        // A refusal keeps its own code even when its child needed SIGKILL (`killed` is still
        // recorded): scripts branch on "why", and the why of a refusal is its cause.
        match self.reason {
            Reason::Exited => match self.child {
                Some(c) => c.exit_code(),
                None => 0,
            },
            Reason::Stopped => match (self.signal, self.refusal) {
                (Some(s), _) => s.exit_code(),
                (None, Some(Refusal::RootLost)) => EXIT_REFUSED,
                (None, _) => 0,
            },
            Reason::Killed => EXIT_KILLED,
            Reason::DidNotStop => EXIT_DID_NOT_STOP,
            Reason::Refused => match self.refusal {
                Some(Refusal::Signal(s)) => s.exit_code(),
                Some(Refusal::Io) => EXIT_IO,
                Some(Refusal::ReadinessTimedOut) | Some(Refusal::NoMainPid) => EXIT_NOT_READY,
                Some(Refusal::State) | Some(Refusal::RootLost) | None => EXIT_REFUSED,
                Some(Refusal::LeaseLost) => EXIT_LEASE_LOST,
            },
            Reason::Cancelled => match self.signal {
                Some(s) => s.exit_code(),
                None => EXIT_REFUSED,
            },
            Reason::Busy => self.busy_code,
            Reason::SpawnFailed => match self.exec {
                Some(ExecFailure::NotExecutable) => EXIT_NOT_EXECUTABLE,
                Some(ExecFailure::NotFound) | None => EXIT_NOT_FOUND,
            },
            Reason::PublishFailed => EXIT_IO,
            Reason::Watchdog => EXIT_NOT_READY,
        }
    }

    /// The short `reason/detail` form of the end record, e.g. `stopped/SIGTERM`,
    /// `exited/0`, `killed/SIGKILL`, `refused/state` (card R1).
    pub fn summary(&self) -> String {
        let reason = reason_name(self.reason);
        let detail = match self.reason {
            Reason::Killed | Reason::DidNotStop => "SIGKILL".to_string(),
            // The workload's own code, even when a signal was forwarded after `STOPPING=1`:
            // the record must say the code the runner exits with.
            Reason::Exited | Reason::PublishFailed => self.code().to_string(),
            Reason::Refused => match self.refusal {
                Some(Refusal::Signal(s)) => s.name().to_string(),
                Some(r) => refusal_name(r).to_string(),
                None => "state".to_string(),
            },
            Reason::SpawnFailed => match self.exec {
                Some(ExecFailure::NotExecutable) => "not-executable".to_string(),
                _ => "not-found".to_string(),
            },
            Reason::Watchdog => "missed-ping".to_string(),
            _ => match (self.signal, self.child) {
                (Some(s), _) => s.name().to_string(),
                (None, _) if matches!(self.refusal, Some(Refusal::RootLost)) => "root-lost".into(),
                (None, Some(c)) => c.exit_code().to_string(),
                (None, None) => self.code().to_string(),
            },
        };
        format!("{reason}/{detail}")
    }
}

/// The lowercase name of a reason, as written in end records and messages.
pub const fn reason_name(r: Reason) -> &'static str {
    match r {
        Reason::Exited => "exited",
        Reason::Stopped => "stopped",
        Reason::Killed => "killed",
        Reason::DidNotStop => "did-not-stop",
        Reason::Refused => "refused",
        Reason::Cancelled => "cancelled",
        Reason::Busy => "busy",
        Reason::SpawnFailed => "spawn-failed",
        Reason::PublishFailed => "publish-failed",
        Reason::Watchdog => "watchdog",
    }
}

/// The lowercase name of a refusal cause.
pub const fn refusal_name(r: Refusal) -> &'static str {
    match r {
        Refusal::Signal(_) => "signal",
        Refusal::State => "state",
        Refusal::Io => "io",
        Refusal::ReadinessTimedOut => "readiness-timed-out",
        Refusal::RootLost => "root-lost",
        Refusal::NoMainPid => "no-main-pid",
        Refusal::LeaseLost => "lease-lost",
    }
}

impl fmt::Display for Action {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Action::AcquireLease => f.write_str("acquire-lease"),
            Action::AbandonAcquire => f.write_str("abandon-acquire"),
            Action::SetPhase(p) => write!(f, "set-phase({})", super::phase_name(*p)),
            Action::Recover => f.write_str("recover"),
            Action::SpawnChild => f.write_str("spawn-child"),
            Action::ArmTimer(t, d) => write!(f, "arm({}, {:?})", timer_name(*t), d),
            Action::DisarmTimer(t) => write!(f, "disarm({})", timer_name(*t)),
            Action::NotifyReady => f.write_str("notify-ready"),
            Action::NotifyStopping => f.write_str("notify-stopping"),
            Action::BeginDrain => f.write_str("begin-drain"),
            Action::Forward(s, t) => write!(f, "forward({s}, {})", target_name(*t)),
            Action::Relay(n, t) => {
                write!(f, "relay({}, {})", super::signal_name(*n), target_name(*t))
            }
            Action::Kill => f.write_str("kill"),
            Action::ExtendTimer(t, d) => write!(f, "extend({}, {:?})", timer_name(*t), d),
            Action::Publish => f.write_str("publish"),
            Action::ReleaseLease => f.write_str("release-lease"),
            Action::Note(n) => write!(f, "note({n})"),
            Action::Exit(o) => write!(f, "exit({}, {})", o.code(), o.summary()),
        }
    }
}

impl fmt::Display for Note {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Note::Waiting => f.write_str("waiting"),
            Note::Owned(e) => write!(f, "owned epoch {e}"),
            Note::Spawned => f.write_str("spawned"),
            Note::Ready => f.write_str("ready"),
            Note::Draining(c) => write!(f, "draining: {c}"),
            Note::ReadinessTimedOut => f.write_str("readiness timed out"),
            Note::WatchdogTimedOut => f.write_str("watchdog timed out"),
            Note::TreeRemains => f.write_str("tree remains"),
            Note::Killed => f.write_str("killed"),
            Note::DidNotStop => f.write_str("did not stop"),
            Note::CheckpointPublished => f.write_str("checkpoint-published"),
            Note::PublishFailed => f.write_str("publish-failed"),
            Note::Released => f.write_str("released"),
            Note::Refused => f.write_str("refused"),
            Note::Cancelled => f.write_str("cancelled"),
            Note::Busy => f.write_str("busy"),
            Note::LeaseLost => f.write_str("lease lost"),
        }
    }
}

impl fmt::Display for DrainCause {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DrainCause::Signal(s) => write!(f, "{s}"),
            DrainCause::Requested => f.write_str("requested"),
            DrainCause::ChildStopping => f.write_str("child stopping"),
            DrainCause::ChildExited => f.write_str("child exited"),
            DrainCause::RootLost => f.write_str("root lost"),
            DrainCause::Watchdog => f.write_str("watchdog"),
            DrainCause::LeaseLost => f.write_str("lease lost"),
        }
    }
}

/// The lowercase name of a signal target.
pub const fn target_name(t: Target) -> &'static str {
    match t {
        Target::Main => "main",
        Target::Tree => "tree",
    }
}

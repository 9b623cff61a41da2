//! Inputs of the machine: everything the driver observes is turned into one of these events.

use serde::{Deserialize, Serialize};
use std::fmt;
use std::time::Duration;

/// A signal that asks the owner to stop. TERM, INT and HUP are distinct values so that the exit
/// code (128 + N) and the forwarded signal follow the one that arrived. (Whether HUP stops is
/// the configuration's [`super::HupPolicy`]; every other catchable signal is an
/// [`Event::Stray`].)
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum Signal {
    /// SIGTERM (15).
    Term,
    /// SIGINT (2).
    Int,
    /// SIGHUP (1).
    Hup,
}

impl Signal {
    /// Every stop signal, in a fixed order.
    pub const ALL: [Signal; 3] = [Signal::Term, Signal::Int, Signal::Hup];

    /// The signal number on Linux.
    pub const fn number(self) -> u8 {
        match self {
            Signal::Term => 15,
            Signal::Int => 2,
            Signal::Hup => 1,
        }
    }

    /// The conventional exit code of a process stopped by this signal: 128 + N.
    pub const fn exit_code(self) -> u8 {
        128 + self.number()
    }

    /// The stop signal with this number, if it is one.
    pub const fn from_number(n: i32) -> Option<Signal> {
        match n {
            15 => Some(Signal::Term),
            2 => Some(Signal::Int),
            1 => Some(Signal::Hup),
            _ => None,
        }
    }

    /// The signal's name, e.g. `SIGTERM`.
    pub const fn name(self) -> &'static str {
        match self {
            Signal::Term => "SIGTERM",
            Signal::Int => "SIGINT",
            Signal::Hup => "SIGHUP",
        }
    }
}

impl fmt::Display for Signal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The name of a Linux signal number, e.g. `SIGUSR1`, `SIGRTMIN+3`; `signal N` for a number
/// that names no signal.
pub fn signal_name(n: u8) -> String {
    let name = match n {
        1 => "SIGHUP",
        2 => "SIGINT",
        3 => "SIGQUIT",
        4 => "SIGILL",
        5 => "SIGTRAP",
        6 => "SIGABRT",
        7 => "SIGBUS",
        8 => "SIGFPE",
        9 => "SIGKILL",
        10 => "SIGUSR1",
        11 => "SIGSEGV",
        12 => "SIGUSR2",
        13 => "SIGPIPE",
        14 => "SIGALRM",
        15 => "SIGTERM",
        16 => "SIGSTKFLT",
        17 => "SIGCHLD",
        18 => "SIGCONT",
        19 => "SIGSTOP",
        20 => "SIGTSTP",
        21 => "SIGTTIN",
        22 => "SIGTTOU",
        23 => "SIGURG",
        24 => "SIGXCPU",
        25 => "SIGXFSZ",
        26 => "SIGVTALRM",
        27 => "SIGPROF",
        28 => "SIGWINCH",
        29 => "SIGIO",
        30 => "SIGPWR",
        31 => "SIGSYS",
        // glibc keeps 32 and 33 for itself; SIGRTMIN is 34 for every program linked with it.
        34..=64 => return format!("SIGRTMIN+{}", n - 34),
        _ => return format!("signal {n}"),
    };
    name.to_string()
}

/// How a supervised child ended, as `waitid` reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ChildStatus {
    /// The child called `exit` with this code.
    Exited(u8),
    /// The child was terminated by this signal number.
    Signaled(u8),
}

impl ChildStatus {
    /// Whether the child exited with code 0: the only status after which its checkpoint is
    /// published.
    pub const fn success(self) -> bool {
        matches!(self, ChildStatus::Exited(0))
    }

    /// The exit code a shell would report for this status (128 + N for a signal).
    pub const fn exit_code(self) -> u8 {
        match self {
            ChildStatus::Exited(c) => c,
            ChildStatus::Signaled(n) => 128u8.wrapping_add(n),
        }
    }
}

impl fmt::Display for ChildStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ChildStatus::Exited(c) => write!(f, "exited {c}"),
            ChildStatus::Signaled(n) => write!(f, "killed by signal {n}"),
        }
    }
}

/// The timers the machine arms and the driver runs. Time never enters the machine except as the
/// expiry of one of these.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Timer {
    /// Bounds how long a notify-mode child may take to send `READY=1`.
    Readiness,
    /// Bounds how long the workload may take to stop after it was asked to (then KILL).
    Grace,
    /// Bounds how long a killed workload may take to be gone (then `did not stop`).
    KillWait,
    /// Bounds the time between two `WATCHDOG=1` pings of a ready workload (`--watchdog`).
    Watchdog,
}

impl Timer {
    /// Every timer, in a fixed order.
    pub const ALL: [Timer; 4] = [
        Timer::Readiness,
        Timer::Grace,
        Timer::KillWait,
        Timer::Watchdog,
    ];
}

/// Why `exec` of the child failed; decides exit code 127 or 126 (as a shell does).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ExecFailure {
    /// The executable does not exist (`ENOENT`): exit 127.
    NotFound,
    /// The executable exists but cannot be executed (`EACCES`, `ENOEXEC`, ...): exit 126.
    NotExecutable,
}

/// Why the driver could not go on with the state dir: decides refused (65) or I/O (74).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Fault {
    /// The state was refused: foreign, corrupt, permissive or an invalid checkpoint.
    State,
    /// An operating-system error (full disk, EIO, ...).
    Io,
}

/// Everything that can happen to an owner. The driver feeds these to [`super::Machine::handle`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", tag = "event", content = "arg")]
pub enum Event {
    /// Begin: the configuration was validated and the state dir opened.
    Start,
    /// The lock is held by another owner; this process now waits (shown as a waiter).
    LeaseBusy,
    /// The lock is ours and the epoch was durably bumped to this value.
    LeaseGranted {
        /// The new ownership's fencing epoch.
        epoch: u64,
    },
    /// The wait bound expired while another owner held the lock.
    WaitExpired,
    /// Acquiring failed for another reason than contention (refused state or I/O).
    LeaseFailed(Fault),
    /// The current checkpoint verified (or there is none) and the host recovered from it.
    RecoveryDone,
    /// The current checkpoint was refused, or recovery failed.
    RecoveryFailed(Fault),
    /// The child process was started.
    ChildSpawned,
    /// The child process could not be started.
    SpawnFailed(ExecFailure),
    /// The child said `READY=1`.
    ChildReady,
    /// The child said `STOPPING=1`: it is shutting down on its own.
    ChildStopping,
    /// The workload said `WATCHDOG=1`: it is alive.
    ChildWatchdog,
    /// The workload said `EXTEND_TIMEOUT_USEC=`: the timeout of what it is doing now (starting,
    /// stopping) must not expire before this much time from now.
    ChildExtendTimeout(Duration),
    /// The main process exited and was reaped, and no other process of the workload runs: the
    /// whole workload ended.
    ChildExited(ChildStatus),
    /// The main process exited and was reaped, but processes of its tree remain (backgrounded,
    /// `setsid`, or a forking daemon's first process that left the daemon behind).
    MainExited(ChildStatus),
    /// After [`Event::MainExited`]: the last process of the workload is gone.
    TreeEmpty,
    /// A forking daemon's main process is known (named by the pid file, or the only child that
    /// remained): it is the workload's main process from now on.
    MainAdopted,
    /// A stop signal arrived for this process.
    Stop(Signal),
    /// A catchable signal the owner does not act on itself arrived (USR1, USR2, WINCH, QUIT,
    /// ...; by number): it is for the workload (card T3).
    Stray(u8),
    /// The host asked to drain (in-process `request_drain`, idle exit).
    DrainRequested,
    /// The state dir was moved or replaced while owned (card H7).
    RootLost,
    /// No active residency or in-flight request remains (in-process workload).
    ResidenciesSettled,
    /// A timer armed by the machine fired.
    TimerExpired(Timer),
    /// The drain's checkpoint was published and is durable.
    CheckpointPublished,
    /// There was nothing to publish; CURRENT was left as it was.
    CheckpointSkipped,
    /// Publishing failed (I/O or a stale epoch); CURRENT was left as it was.
    CheckpointFailed,
    /// The lease was released: registry entries removed, lock dropped.
    LeaseReleased,
    /// A cluster lease was lost while owned: it expired, or it could not be kept alive in time
    /// (a partition, a lost quorum, the owner paused past its TTL), so another owner may hold
    /// it now. It also answers an outstanding release: there is nothing left to release. A
    /// kernel lock cannot be lost; only a cluster lease feeds this.
    LeaseLost,
}

impl Event {
    /// A representative of every event kind, used to render the transition table and by the
    /// models to enumerate inputs.
    pub fn samples() -> Vec<Event> {
        let mut v = vec![
            Event::Start,
            Event::LeaseBusy,
            Event::LeaseGranted { epoch: 1 },
            Event::WaitExpired,
            Event::LeaseFailed(Fault::State),
            Event::LeaseFailed(Fault::Io),
            Event::RecoveryDone,
            Event::RecoveryFailed(Fault::State),
            Event::RecoveryFailed(Fault::Io),
            Event::ChildSpawned,
            Event::SpawnFailed(ExecFailure::NotFound),
            Event::SpawnFailed(ExecFailure::NotExecutable),
            Event::ChildReady,
            Event::ChildStopping,
            Event::ChildWatchdog,
            Event::ChildExtendTimeout(Duration::from_secs(60)),
            Event::ChildExited(ChildStatus::Exited(0)),
            Event::ChildExited(ChildStatus::Exited(3)),
            Event::ChildExited(ChildStatus::Signaled(15)),
            Event::MainExited(ChildStatus::Exited(0)),
            Event::MainExited(ChildStatus::Exited(3)),
            Event::TreeEmpty,
            Event::MainAdopted,
        ];
        v.extend(Signal::ALL.map(Event::Stop));
        v.push(Event::Stray(10));
        v.extend([
            Event::DrainRequested,
            Event::RootLost,
            Event::ResidenciesSettled,
        ]);
        v.extend(Timer::ALL.map(Event::TimerExpired));
        v.extend([
            Event::CheckpointPublished,
            Event::CheckpointSkipped,
            Event::CheckpointFailed,
            Event::LeaseReleased,
            Event::LeaseLost,
        ]);
        v
    }
}

impl fmt::Display for Event {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Event::Start => f.write_str("start"),
            Event::LeaseBusy => f.write_str("lease-busy"),
            Event::LeaseGranted { epoch } => write!(f, "lease-granted(epoch {epoch})"),
            Event::WaitExpired => f.write_str("wait-expired"),
            Event::LeaseFailed(x) => write!(f, "lease-failed({})", fault_name(*x)),
            Event::RecoveryDone => f.write_str("recovery-done"),
            Event::RecoveryFailed(x) => write!(f, "recovery-failed({})", fault_name(*x)),
            Event::ChildSpawned => f.write_str("child-spawned"),
            Event::SpawnFailed(ExecFailure::NotFound) => f.write_str("spawn-failed(not-found)"),
            Event::SpawnFailed(ExecFailure::NotExecutable) => {
                f.write_str("spawn-failed(not-executable)")
            }
            Event::ChildReady => f.write_str("child-ready"),
            Event::ChildStopping => f.write_str("child-stopping"),
            Event::ChildWatchdog => f.write_str("child-watchdog"),
            Event::ChildExtendTimeout(d) => write!(f, "child-extend-timeout({d:?})"),
            Event::ChildExited(ChildStatus::Exited(c)) => write!(f, "child-exited({c})"),
            Event::ChildExited(ChildStatus::Signaled(n)) => write!(f, "child-exited(signal {n})"),
            Event::MainExited(ChildStatus::Exited(c)) => write!(f, "main-exited({c})"),
            Event::MainExited(ChildStatus::Signaled(n)) => write!(f, "main-exited(signal {n})"),
            Event::TreeEmpty => f.write_str("tree-empty"),
            Event::MainAdopted => f.write_str("main-adopted"),
            Event::Stop(s) => write!(f, "stop({s})"),
            Event::Stray(n) => write!(f, "stray({})", signal_name(*n)),
            Event::DrainRequested => f.write_str("drain-requested"),
            Event::RootLost => f.write_str("root-lost"),
            Event::ResidenciesSettled => f.write_str("residencies-settled"),
            Event::TimerExpired(t) => write!(f, "timer-expired({})", timer_name(*t)),
            Event::CheckpointPublished => f.write_str("checkpoint-published"),
            Event::CheckpointSkipped => f.write_str("checkpoint-skipped"),
            Event::CheckpointFailed => f.write_str("checkpoint-failed"),
            Event::LeaseReleased => f.write_str("lease-released"),
            Event::LeaseLost => f.write_str("lease-lost"),
        }
    }
}

pub(crate) fn fault_name(x: Fault) -> &'static str {
    match x {
        Fault::State => "state",
        Fault::Io => "io",
    }
}

pub(crate) fn timer_name(t: Timer) -> &'static str {
    match t {
        Timer::Readiness => "readiness",
        Timer::Grace => "grace",
        Timer::KillWait => "kill-wait",
        Timer::Watchdog => "watchdog",
    }
}

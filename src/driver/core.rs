//! The driver core: the sans-IO half of every driver, shared by the runner's event loop
//! ([`super::run`]), the models and the trace checker. It turns the machine's actions into
//! requests the driver owes an answer to, and decides which events the driver may feed back
//! and when; it owns no descriptor, reads no clock and does no I/O (the split of quinn-proto's
//! `Connection` from its `ConnectionDriver`).
//!
//! A [`Core`] holds the [`Machine`] and what its driver has done so far:
//!
//! - the actions of the current step not executed yet ([`Todo`]): a step's actions are
//!   executed in order, one at a time ([`Core::pop`]), before anything else is fed, so a
//!   signal that arrives meanwhile waits in the driver's queue and is fed between steps;
//! - the requests executed and not answered yet ([`Request`]): an answer is fed only for a
//!   request that is outstanding — `LeaseBusy` (once), `LeaseGranted`, `WaitExpired` and
//!   `LeaseFailed` answer `AcquireLease`; `RecoveryDone` and `RecoveryFailed` answer `Recover`;
//!   `ChildSpawned` and `SpawnFailed` answer `SpawnChild`; `CheckpointPublished`,
//!   `CheckpointSkipped` and `CheckpointFailed` answer `Publish`; `LeaseReleased` answers
//!   `ReleaseLease`. Every request executed stays outstanding until it is answered, so two
//!   requests of one step are both owed (a step that released and then published would
//!   publish without the lease, in the runner and in every model alike). Two requests are
//!   withdrawn without an answer: `AbandonAcquire` withdraws the acquisition, and
//!   `ReleaseLease` withdraws a recovery still running (the runner cancels its worker and
//!   waits for it to stop writing before it releases);
//! - spawning is synchronous: while `SpawnChild` is outstanding nothing but its answer is fed;
//! - the armed timers: `TimerExpired(t)` needs `t` armed (by `ArmTimer`, not disarmed or fired
//!   since). The deadlines are the caller's, who has a clock;
//! - what the driver knows of its workload ([`ChildView`]): `ChildExited` and `MainExited` need
//!   a main process that runs (spawned, or adopted, and not reaped); `TreeEmpty` and
//!   `MainAdopted` need a tree whose main process was reaped while other processes remained;
//!   the workload's notifications (`ChildReady`, `ChildStopping`, `ChildWatchdog`,
//!   `ChildExtendTimeout`) need some process of it running; stop and stray signals can come at
//!   any time;
//! - `ResidenciesSettled` needs an in-process workload that is draining and whose drain hook
//!   ran (`BeginDrain`): the host waits for residencies only then;
//! - `LeaseLost` needs a lease that is held (granted, not released, not lost already): from
//!   the grant until the release is answered. It answers an outstanding `ReleaseLease` (there
//!   is nothing left to release); a recovery still running is withdrawn by the exit that
//!   follows;
//! - `Start` is the first event, and nothing is fed after `Exit`.
//!
//! A driver feeds what it observed with [`Core::feed`] (which checks these rules, then asks the
//! machine), takes the step's actions one at a time with [`Core::pop`] and executes them. The
//! runner answers requests with real files, locks and processes; a model answers them with every
//! answer its world allows; the trace checker answers them with what a real run recorded.
//! Everything else is this one piece of code. A `Core` is `Copy + Eq + Hash`, so a model keeps
//! it in its state.

use crate::machine::trace::TraceStep;
use crate::machine::{
    Action, Config, Event, Handled, Machine, PhaseKind, Rejected, Timer, Workload,
};
use std::fmt;
use std::hash::{Hash, Hasher};

/// The largest number of actions one step of the machine returns (a drain entered while a
/// readiness timer runs: disarm, begin-drain, set-phase, note, notify, forward, arm).
pub const MAX_ACTIONS: usize = 8;

/// A request the driver has outstanding: it executed the action and owes the machine its answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Request {
    /// `AcquireLease`; `busy` once `LeaseBusy` was fed.
    Acquire {
        /// Whether contention was already reported.
        busy: bool,
    },
    /// `Recover`.
    Recover,
    /// `SpawnChild`.
    Spawn,
    /// `Publish`.
    Publish,
    /// `ReleaseLease`.
    Release,
}

impl Request {
    /// Every kind of request, in lifecycle order (an acquisition with contention not reported).
    const KINDS: [Request; 5] = [
        Request::Acquire { busy: false },
        Request::Recover,
        Request::Spawn,
        Request::Publish,
        Request::Release,
    ];

    const fn bit(self) -> u8 {
        match self {
            Request::Acquire { .. } => 1,
            Request::Recover => 2,
            Request::Spawn => 4,
            Request::Publish => 8,
            Request::Release => 16,
        }
    }
}

/// The requests outstanding, one bit per kind (a kind is never owed twice), and whether an
/// outstanding acquisition already reported contention.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
struct Outstanding {
    bits: u8,
    busy: bool,
}

impl Outstanding {
    const fn has(self, r: Request) -> bool {
        self.bits & r.bit() != 0
    }

    fn add(&mut self, r: Request) {
        self.bits |= r.bit();
        if let Request::Acquire { busy } = r {
            self.busy = busy;
        }
    }

    fn remove(&mut self, r: Request) {
        self.bits &= !r.bit();
        if let Request::Acquire { .. } = r {
            self.busy = false;
        }
    }

    fn iter(self) -> impl Iterator<Item = Request> {
        Request::KINDS
            .into_iter()
            .filter(move |r| self.has(*r))
            .map(move |r| match r {
                Request::Acquire { .. } => Request::Acquire { busy: self.busy },
                other => other,
            })
    }
}

/// What the driver knows of its workload, from the events it fed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ChildView {
    /// No child was spawned in this run.
    None,
    /// The main process runs (spawned or adopted, not reaped).
    Running,
    /// The main process was reaped but other processes of its tree remain.
    Tree,
    /// The whole workload is gone.
    Reaped,
}

/// The actions of the current step that the driver has not executed yet, in order.
#[derive(Clone, Copy)]
pub struct Todo {
    actions: [Option<Action>; MAX_ACTIONS],
    next: u8,
    len: u8,
}

impl Todo {
    const EMPTY: Todo = Todo {
        actions: [None; MAX_ACTIONS],
        next: 0,
        len: 0,
    };

    fn load(actions: &[Action]) -> Todo {
        assert!(
            actions.len() <= MAX_ACTIONS,
            "the machine returned {} actions; raise MAX_ACTIONS",
            actions.len()
        );
        let mut t = Todo::EMPTY;
        for (slot, a) in t.actions.iter_mut().zip(actions) {
            *slot = Some(*a);
        }
        t.len = actions.len() as u8;
        t
    }

    /// The actions still to execute.
    pub fn remaining(&self) -> impl Iterator<Item = Action> + '_ {
        self.actions[self.next as usize..self.len as usize]
            .iter()
            .flatten()
            .copied()
    }

    /// Whether every action of the step was executed.
    pub fn is_empty(&self) -> bool {
        self.next == self.len
    }

    fn peek(&self) -> Option<Action> {
        if self.is_empty() {
            None
        } else {
            self.actions[self.next as usize]
        }
    }

    fn pop(&mut self) -> Option<Action> {
        let a = self.peek()?;
        self.next += 1;
        if self.is_empty() {
            // Executed slots carry no meaning: clear them so equal futures hash equal.
            *self = Todo::EMPTY;
        }
        Some(a)
    }
}

impl PartialEq for Todo {
    fn eq(&self, other: &Todo) -> bool {
        self.remaining().eq(other.remaining())
    }
}

impl Eq for Todo {}

impl Hash for Todo {
    fn hash<H: Hasher>(&self, state: &mut H) {
        for a in self.remaining() {
            a.hash(state);
        }
        (self.len - self.next).hash(state);
    }
}

impl fmt::Debug for Todo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.remaining()).finish()
    }
}

/// Why the driver would not feed an event now (the machine was not asked).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum NotAllowed {
    /// The run ended with `Exit`; nothing is fed afterwards.
    Exited,
    /// Actions of the previous step are still being executed.
    MidStep,
    /// `SpawnChild` is outstanding and spawning is synchronous.
    Spawning,
    /// `Start` was already fed, or another event came before it.
    StartOrder,
    /// An answer to a request the driver does not have outstanding.
    NoRequest,
    /// `LeaseBusy` was already reported for this acquisition.
    BusyTwice,
    /// A lease granted with epoch 0 (epochs start at 1).
    EpochZero,
    /// A child event without a running child.
    NoChild,
    /// A tree event (`TreeEmpty`, `MainAdopted`) without a tree whose main process exited.
    NoTree,
    /// A timer that is not armed.
    TimerNotArmed,
    /// `ResidenciesSettled` without an in-process workload whose drain began.
    NoResidencies,
    /// `LeaseLost` without a lease held (before the grant, after the release, or lost already).
    NoLease,
}

impl fmt::Display for NotAllowed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            NotAllowed::Exited => "the run already exited",
            NotAllowed::MidStep => "actions of the previous step were not all executed",
            NotAllowed::Spawning => "spawning is synchronous: only its answer can come next",
            NotAllowed::StartOrder => "`start` must be the first event, exactly once",
            NotAllowed::NoRequest => "an answer to a request the driver did not make",
            NotAllowed::BusyTwice => "`lease-busy` was already reported for this acquisition",
            NotAllowed::EpochZero => "a lease is never granted with epoch 0",
            NotAllowed::NoChild => "a child event without a running child",
            NotAllowed::NoTree => "a tree event without a tree whose main process exited",
            NotAllowed::TimerNotArmed => "a timer that is not armed fired",
            NotAllowed::NoResidencies => {
                "residencies settled without an in-process drain in progress"
            }
            NotAllowed::NoLease => "a lease lost that is not held",
        })
    }
}

/// Why feeding an event failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FeedError {
    /// The driver semantics do not allow the event now.
    NotAllowed(NotAllowed),
    /// The machine rejected the event (the driver fed something illegal in this phase).
    Rejected(Rejected),
}

impl fmt::Display for FeedError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FeedError::NotAllowed(n) => write!(f, "the driver may not feed this event now: {n}"),
            FeedError::Rejected(r) => r.fmt(f),
        }
    }
}

impl std::error::Error for FeedError {}

/// One process's machine and what its driver has done: the single-process step relation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Core {
    machine: Machine,
    todo: Todo,
    outstanding: Outstanding,
    timers: u8,
    child: ChildView,
    started: bool,
    exited: bool,
    drain_begun: bool,
    lost: bool,
}

const fn timer_bit(t: Timer) -> u8 {
    match t {
        Timer::Readiness => 1,
        Timer::Grace => 2,
        Timer::KillWait => 4,
        Timer::Watchdog => 8,
    }
}

impl Core {
    /// A driver core with a fresh machine in `cold(idle)`.
    pub const fn new(config: Config) -> Core {
        Core {
            machine: Machine::new(config),
            todo: Todo::EMPTY,
            outstanding: Outstanding {
                bits: 0,
                busy: false,
            },
            timers: 0,
            child: ChildView::None,
            started: false,
            exited: false,
            drain_begun: false,
            lost: false,
        }
    }

    /// The machine.
    pub const fn machine(&self) -> &Machine {
        &self.machine
    }

    /// The oldest kind of request outstanding, if any (in lifecycle order: acquire, recover,
    /// spawn, publish, release). Outside a faulty step at most one is.
    pub fn request(&self) -> Option<Request> {
        self.outstanding.iter().next()
    }

    /// Every request outstanding, in lifecycle order.
    pub fn requests(&self) -> impl Iterator<Item = Request> {
        self.outstanding.iter()
    }

    /// Whether a request of this kind is outstanding (for an acquisition, whatever it reported).
    pub const fn owes(&self, r: Request) -> bool {
        self.outstanding.has(r)
    }

    /// The child as the driver knows it.
    pub const fn child(&self) -> ChildView {
        self.child
    }

    /// Whether `t` is armed.
    pub const fn armed(&self, t: Timer) -> bool {
        self.timers & timer_bit(t) != 0
    }

    /// The armed timers.
    pub fn armed_timers(&self) -> impl Iterator<Item = Timer> + '_ {
        Timer::ALL.into_iter().filter(|t| self.armed(*t))
    }

    /// Whether `Exit` was executed.
    pub const fn exited(&self) -> bool {
        self.exited
    }

    /// Whether `Start` was fed.
    pub const fn started(&self) -> bool {
        self.started
    }

    /// Whether `LeaseLost` was fed: the lease is gone.
    pub const fn lost(&self) -> bool {
        self.lost
    }

    /// Whether the lease is held: granted, and neither released nor lost.
    pub fn holds_lease(&self) -> bool {
        self.machine.kind().owns() && !self.lost
    }

    /// Whether the drain hook (`BeginDrain`) ran in this run.
    pub const fn drain_begun(&self) -> bool {
        self.drain_begun
    }

    /// The actions of the current step not executed yet.
    pub const fn todo(&self) -> &Todo {
        &self.todo
    }

    /// The next action to execute, if the current step has one left.
    pub fn peek(&self) -> Option<Action> {
        self.todo.peek()
    }

    /// Whether the driver sits between steps: every action executed, the run not over. Only
    /// then can an event be fed.
    pub fn between_steps(&self) -> bool {
        self.todo.is_empty() && !self.exited
    }

    /// Whether the driver semantics allow feeding `ev` now (the machine is not asked).
    pub fn admits(&self, ev: Event) -> Result<(), NotAllowed> {
        if self.exited {
            return Err(NotAllowed::Exited);
        }
        if !self.todo.is_empty() {
            return Err(NotAllowed::MidStep);
        }
        if self.owes(Request::Spawn)
            && !matches!(ev, Event::ChildSpawned | Event::SpawnFailed(_))
            && !crate::mutant::on("core-spawn-not-synchronous")
        {
            return Err(NotAllowed::Spawning);
        }
        if matches!(ev, Event::Start) == self.started {
            return Err(NotAllowed::StartOrder);
        }
        let wants = |r: Request| {
            if self.owes(r) {
                Ok(())
            } else {
                Err(NotAllowed::NoRequest)
            }
        };
        let acquiring = Request::Acquire { busy: false };
        match ev {
            Event::Start => Ok(()),
            Event::LeaseBusy => match self.request_of_kind(acquiring) {
                Some(Request::Acquire { busy: false }) => Ok(()),
                Some(_) => Err(NotAllowed::BusyTwice),
                None => Err(NotAllowed::NoRequest),
            },
            Event::LeaseGranted { epoch } => {
                wants(acquiring)?;
                if epoch == 0 {
                    Err(NotAllowed::EpochZero)
                } else {
                    Ok(())
                }
            }
            Event::WaitExpired | Event::LeaseFailed(_) => wants(acquiring),
            Event::RecoveryDone | Event::RecoveryFailed(_) => wants(Request::Recover),
            Event::ChildSpawned | Event::SpawnFailed(_) => wants(Request::Spawn),
            Event::ChildExited(_) | Event::MainExited(_) => {
                if self.child == ChildView::Running {
                    Ok(())
                } else {
                    Err(NotAllowed::NoChild)
                }
            }
            Event::ChildReady
            | Event::ChildStopping
            | Event::ChildWatchdog
            | Event::ChildExtendTimeout(_) => {
                if matches!(self.child, ChildView::Running | ChildView::Tree) {
                    Ok(())
                } else {
                    Err(NotAllowed::NoChild)
                }
            }
            Event::TreeEmpty | Event::MainAdopted => {
                if self.child == ChildView::Tree {
                    Ok(())
                } else {
                    Err(NotAllowed::NoTree)
                }
            }
            Event::Stop(_) | Event::Stray(_) | Event::DrainRequested | Event::RootLost => Ok(()),
            // The host's control thread waits for residencies only while the drain runs.
            Event::ResidenciesSettled => {
                if matches!(self.machine.config().workload, Workload::InProcess)
                    && self.drain_begun
                    && self.machine.kind() == PhaseKind::Draining
                {
                    Ok(())
                } else {
                    Err(NotAllowed::NoResidencies)
                }
            }
            Event::TimerExpired(t) => {
                if self.armed(t) {
                    Ok(())
                } else {
                    Err(NotAllowed::TimerNotArmed)
                }
            }
            Event::CheckpointPublished | Event::CheckpointSkipped | Event::CheckpointFailed => {
                wants(Request::Publish)
            }
            Event::LeaseReleased => wants(Request::Release),
            Event::LeaseLost => {
                if self.holds_lease() {
                    Ok(())
                } else {
                    Err(NotAllowed::NoLease)
                }
            }
        }
    }

    /// The outstanding request of `kind`'s kind, with what it reported.
    fn request_of_kind(&self, kind: Request) -> Option<Request> {
        self.outstanding.iter().find(|r| r.bit() == kind.bit())
    }

    /// Feeds `ev` if the driver semantics allow it and the machine accepts it; the returned
    /// actions are now the driver's to execute, one at a time (see [`Core::pop`]). On error
    /// nothing changed.
    pub fn feed(&mut self, ev: Event) -> Result<Handled, FeedError> {
        self.admits(ev).map_err(FeedError::NotAllowed)?;
        let handled = self.machine.handle(ev).map_err(FeedError::Rejected)?;
        match ev {
            Event::Start => self.started = true,
            Event::LeaseBusy => self.outstanding.add(Request::Acquire { busy: true }),
            Event::LeaseGranted { .. } | Event::WaitExpired | Event::LeaseFailed(_) => {
                self.outstanding.remove(Request::Acquire { busy: false });
            }
            Event::RecoveryDone | Event::RecoveryFailed(_) => {
                self.outstanding.remove(Request::Recover);
            }
            Event::SpawnFailed(_) => self.outstanding.remove(Request::Spawn),
            Event::ChildSpawned => {
                self.outstanding.remove(Request::Spawn);
                self.child = ChildView::Running;
            }
            Event::CheckpointPublished | Event::CheckpointSkipped | Event::CheckpointFailed => {
                self.outstanding.remove(Request::Publish);
            }
            Event::LeaseReleased => self.outstanding.remove(Request::Release),
            Event::LeaseLost => {
                self.lost = true;
                self.outstanding.remove(Request::Release);
            }
            Event::ChildExited(_) | Event::TreeEmpty => self.child = ChildView::Reaped,
            Event::MainExited(_) => self.child = ChildView::Tree,
            Event::MainAdopted => self.child = ChildView::Running,
            Event::TimerExpired(t) => {
                if !crate::mutant::on("core-fired-timer-stays-armed") {
                    self.timers &= !timer_bit(t);
                }
            }
            Event::ChildReady
            | Event::ChildStopping
            | Event::ChildWatchdog
            | Event::ChildExtendTimeout(_)
            | Event::Stray(_)
            | Event::Stop(_)
            | Event::DrainRequested
            | Event::RootLost
            | Event::ResidenciesSettled => {}
        }
        self.todo = Todo::load(&handled.actions);
        Ok(handled)
    }

    /// Feeds `ev` as [`Core::feed`] does and describes the step for a trace: sequence number,
    /// time, the phase before and after, the actions, and the reason when the event was not fed.
    pub fn feed_traced(&mut self, seq: u64, at_ms: u64, ev: Event) -> TraceStep {
        let before = self.machine.phase().label();
        let (actions, ignored, rejected) = match self.feed(ev) {
            Ok(h) => (h.actions, h.ignored, None),
            Err(e) => (Vec::new(), false, Some(e.to_string())),
        };
        TraceStep {
            seq,
            at_ms,
            before,
            event: ev,
            after: self.machine.phase().label(),
            phase: self.machine.kind(),
            actions,
            ignored,
            rejected,
        }
    }

    /// Takes the next action of the current step and does the driver's own bookkeeping for it
    /// (outstanding requests, timers, the drain hook, the exit). Executing it against the world
    /// is the caller's part.
    pub fn pop(&mut self) -> Option<Action> {
        let a = self.todo.pop()?;
        match a {
            Action::AcquireLease => self.outstanding.add(Request::Acquire { busy: false }),
            Action::AbandonAcquire => self.outstanding.remove(Request::Acquire { busy: false }),
            Action::Recover => self.outstanding.add(Request::Recover),
            Action::SpawnChild => self.outstanding.add(Request::Spawn),
            Action::Publish => self.outstanding.add(Request::Publish),
            Action::ReleaseLease => {
                // A recovery still running is abandoned: the driver stops it before it lets go.
                if !crate::mutant::on("core-release-keeps-recovery") {
                    self.outstanding.remove(Request::Recover);
                }
                self.outstanding.add(Request::Release);
            }
            Action::ArmTimer(t, _) => self.timers |= timer_bit(t),
            Action::DisarmTimer(t) => {
                if !crate::mutant::on("core-disarm-ignored") {
                    self.timers &= !timer_bit(t);
                }
            }
            Action::BeginDrain => self.drain_begun = true,
            Action::Exit(_) => {
                self.exited = true;
                self.outstanding = Outstanding::default();
                self.timers = 0;
                self.todo = Todo::EMPTY;
            }
            Action::SetPhase(_)
            | Action::NotifyReady
            | Action::NotifyStopping
            | Action::Forward(..)
            | Action::Relay(..)
            | Action::Kill
            | Action::ExtendTimer(..)
            | Action::Note(_) => {}
        }
        Some(a)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::machine::{ChildStatus, Config, ReadyMode, Signal};

    fn fed(d: &mut Core, ev: Event) {
        let _ = d.feed(ev).unwrap();
    }

    #[test]
    fn answers_need_their_request() {
        let mut d = Core::new(Config::child(ReadyMode::Start));
        assert_eq!(
            d.admits(Event::LeaseGranted { epoch: 1 }),
            Err(NotAllowed::StartOrder)
        );
        fed(&mut d, Event::Start);
        assert_eq!(
            d.admits(Event::LeaseGranted { epoch: 1 }),
            Err(NotAllowed::MidStep)
        );
        assert_eq!(d.pop(), Some(Action::AcquireLease));
        fed(&mut d, Event::LeaseBusy);
        assert_eq!(d.admits(Event::LeaseBusy), Err(NotAllowed::MidStep));
        while d.pop().is_some() {}
        assert_eq!(d.admits(Event::LeaseBusy), Err(NotAllowed::BusyTwice));
        assert_eq!(d.admits(Event::RecoveryDone), Err(NotAllowed::NoRequest));
        fed(&mut d, Event::LeaseGranted { epoch: 1 });
        while d.pop().is_some() {}
        assert_eq!(d.request(), Some(Request::Recover));
        fed(&mut d, Event::RecoveryDone);
        assert_eq!(d.pop(), Some(Action::SpawnChild));
        // Spawning is synchronous: a stop waits for the answer.
        assert_eq!(
            d.admits(Event::Stop(Signal::Term)),
            Err(NotAllowed::Spawning)
        );
        assert_eq!(
            d.admits(Event::ChildExited(ChildStatus::Exited(0))),
            Err(NotAllowed::Spawning)
        );
        fed(&mut d, Event::ChildSpawned);
        while d.pop().is_some() {}
        assert_eq!(d.child(), ChildView::Running);
        assert_eq!(
            d.admits(Event::TimerExpired(Timer::Grace)),
            Err(NotAllowed::TimerNotArmed)
        );
        fed(&mut d, Event::Stop(Signal::Term));
        while d.pop().is_some() {}
        assert!(d.armed(Timer::Grace));
        fed(&mut d, Event::TimerExpired(Timer::Grace));
        assert!(!d.armed(Timer::Grace));
    }

    /// A release withdraws a recovery still running (the runner cancels its worker), and a
    /// request of the same step after a release is owed as well, not dropped: the divergence
    /// found when the models and the runner came to share this core, where a later request
    /// replaced an outstanding one.
    #[test]
    fn requests_of_one_step_are_all_owed() {
        let mut d = Core::new(Config::child(ReadyMode::Start));
        fed(&mut d, Event::Start);
        while d.pop().is_some() {}
        fed(&mut d, Event::LeaseGranted { epoch: 1 });
        while d.pop().is_some() {}
        assert_eq!(d.requests().collect::<Vec<_>>(), [Request::Recover]);
        fed(&mut d, Event::Stop(Signal::Term));
        while d.pop().is_some() {}
        assert_eq!(d.requests().collect::<Vec<_>>(), [Request::Release]);
        assert_eq!(d.admits(Event::RecoveryDone), Err(NotAllowed::NoRequest));

        let mut o = Outstanding::default();
        o.add(Request::Release);
        o.add(Request::Publish);
        assert_eq!(
            o.iter().collect::<Vec<_>>(),
            [Request::Publish, Request::Release]
        );
    }

    /// A feed that fails changes nothing (the core is exactly as before), whether the driver
    /// semantics refuse the event or the machine rejects it: checked for every sample event in
    /// every core state reachable in every profile, between steps and in the middle of one.
    /// Both kinds of failure must occur, so the check cannot pass vacuously.
    #[test]
    fn rejected_events_change_nothing() {
        use std::collections::{HashSet, VecDeque};
        let (mut not_allowed, mut rejected, mut states) = (0usize, 0usize, 0usize);
        for (name, config) in crate::machine::table::profiles() {
            let start = Core::new(config);
            let mut seen = HashSet::from([start]);
            let mut queue = VecDeque::from([start]);
            while let Some(d) = queue.pop_front() {
                states += 1;
                // Mid-step states too: the first action of the step not executed yet.
                let mut probes = vec![d];
                for e in Event::samples() {
                    let mut mid = d;
                    if mid.feed(e).is_ok() && !mid.todo().is_empty() {
                        probes.push(mid);
                        break;
                    }
                }
                for probe in probes {
                    for e in Event::samples() {
                        let mut after = probe;
                        match after.feed(e) {
                            Ok(_) => {
                                while after.pop().is_some() {}
                                if seen.insert(after) {
                                    queue.push_back(after);
                                }
                            }
                            Err(err) => {
                                assert_eq!(
                                    after, probe,
                                    "{name}: a failed feed of {e} ({err}) changed the core"
                                );
                                match err {
                                    FeedError::NotAllowed(_) => not_allowed += 1,
                                    FeedError::Rejected(_) => rejected += 1,
                                }
                            }
                        }
                    }
                }
            }
        }
        assert!(states > 100, "explored only {states} core states");
        assert!(
            not_allowed > 0 && rejected > 0,
            "{not_allowed} refused, {rejected} rejected"
        );
    }

    /// The core allows a drain request at any time (the machine decides what it means), and
    /// nothing after its exit.
    #[test]
    fn drain_requests_any_time_nothing_after_exit() {
        let mut d = Core::new(Config::in_process());
        fed(&mut d, Event::Start);
        while d.pop().is_some() {}
        let before = d;
        fed(&mut d, Event::DrainRequested);
        assert_ne!(d, before);
        let mut e = Core::new(Config::in_process());
        fed(&mut e, Event::Start);
        while e.pop().is_some() {}
        fed(&mut e, Event::Stop(Signal::Int));
        while e.pop().is_some() {}
        assert!(e.exited());
        assert_eq!(e.admits(Event::Start), Err(NotAllowed::Exited));
    }

    #[test]
    fn todo_equality_ignores_executed_slots() {
        let a = Todo::load(&[Action::Recover, Action::Publish]);
        let mut b = Todo::load(&[Action::AcquireLease, Action::Recover, Action::Publish]);
        b.pop();
        assert_eq!(a, b);
        let h = |t: &Todo| {
            let mut s = std::collections::hash_map::DefaultHasher::new();
            t.hash(&mut s);
            s.finish()
        };
        assert_eq!(h(&a), h(&b));
    }

    /// The trace of a step says what the driver did and, when it refused, why: a refusal by
    /// the driver semantics as well as a rejection by the machine.
    #[test]
    fn traced_steps_name_refusals() {
        let mut d = Core::new(Config::child(ReadyMode::Start));
        let s = d.feed_traced(1, 0, Event::Start);
        assert_eq!(s.actions, [Action::AcquireLease]);
        assert!(s.rejected.is_none());
        let s = d.feed_traced(2, 0, Event::LeaseReleased);
        let why = s.rejected.expect("mid-step");
        assert!(why.contains("not all executed"), "{why}");
        assert!(d.pop().is_some());
        let s = d.feed_traced(3, 0, Event::RecoveryDone);
        assert!(s.rejected.expect("no request").contains("did not make"));
    }
}

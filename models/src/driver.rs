//! The single-process step relation every model shares: the real [`Machine`] wrapped in the
//! driver semantics, and nothing else.
//!
//! The machine decides which events are legal in which phase and what to do about them. The
//! driver semantics decide only *when* the driver can feed an event at all, from what the driver
//! itself did before:
//!
//! - the actions of one step are executed in order, one at a time, before anything else is fed
//!   (a signal that arrives meanwhile is queued by the world and delivered between steps);
//! - an answer is fed only for a request the driver has outstanding: `LeaseBusy` (once),
//!   `LeaseGranted`, `WaitExpired` and `LeaseFailed` answer `AcquireLease`; `RecoveryDone` and
//!   `RecoveryFailed` answer `Recover`; `ChildSpawned` and `SpawnFailed` answer `SpawnChild`;
//!   `CheckpointPublished`, `CheckpointSkipped` and `CheckpointFailed` answer `Publish`;
//!   `LeaseReleased` answers `ReleaseLease`. A later request replaces an outstanding one (the
//!   driver abandons it), and `AbandonAcquire` withdraws an outstanding acquisition;
//! - spawning is synchronous: while `SpawnChild` is outstanding nothing but its answer is fed;
//! - `ChildExited` and `MainExited` need a main process that runs (spawned, or adopted, and not
//!   reaped); `TreeEmpty` and `MainAdopted` need a tree whose main process was reaped while
//!   other processes remained (`MainExited`); the workload's notifications (`ChildReady`,
//!   `ChildStopping`, `ChildWatchdog`, `ChildExtendTimeout`) need some process of it running;
//!   stop and stray signals can come at any time;
//! - `TimerExpired(t)` needs `t` armed (by `ArmTimer`, not yet disarmed or fired);
//! - `ResidenciesSettled` needs an in-process workload that is draining and whose drain hook
//!   ran (`BeginDrain`): the host waits for residencies only then;
//! - `Start` is the first event, and nothing is fed after `Exit`.
//!
//! The lease, signal and checkpoint models keep one [`Driver`] per process and add the world
//! (which answer the kernel gives, when a signal arrives); the trace checker replays a recorded
//! run through the same [`Driver`] with an open world, so it accepts exactly the runs some world
//! could have produced.

use std::fmt;
use std::hash::{Hash, Hasher};
use tenure::machine::{Action, Event, Handled, Machine, Rejected, Timer, Workload};

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

/// What the driver knows of its workload.
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
            .map(|a| a.expect("loaded slots hold actions"))
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
            FeedError::NotAllowed(n) => n.fmt(f),
            FeedError::Rejected(r) => r.fmt(f),
        }
    }
}

/// One process's machine and what its driver has done: the single-process step relation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Driver {
    machine: Machine,
    todo: Todo,
    request: Option<Request>,
    timers: u8,
    child: ChildView,
    started: bool,
    exited: bool,
    drain_begun: bool,
}

fn timer_bit(t: Timer) -> u8 {
    match t {
        Timer::Readiness => 1,
        Timer::Grace => 2,
        Timer::KillWait => 4,
        Timer::Watchdog => 8,
    }
}

impl Driver {
    /// A driver with a fresh machine in `cold(idle)`.
    pub fn new(config: tenure::machine::Config) -> Driver {
        Driver {
            machine: Machine::new(config),
            todo: Todo::EMPTY,
            request: None,
            timers: 0,
            child: ChildView::None,
            started: false,
            exited: false,
            drain_begun: false,
        }
    }

    /// The machine.
    pub fn machine(&self) -> &Machine {
        &self.machine
    }

    /// The request outstanding, if any.
    pub fn request(&self) -> Option<Request> {
        self.request
    }

    /// The child as the driver knows it.
    pub fn child(&self) -> ChildView {
        self.child
    }

    /// Whether `t` is armed.
    pub fn armed(&self, t: Timer) -> bool {
        self.timers & timer_bit(t) != 0
    }

    /// The armed timers.
    pub fn armed_timers(&self) -> impl Iterator<Item = Timer> + '_ {
        Timer::ALL.into_iter().filter(|t| self.armed(*t))
    }

    /// Whether `Exit` was executed.
    pub fn exited(&self) -> bool {
        self.exited
    }

    /// Whether `Start` was fed.
    pub fn started(&self) -> bool {
        self.started
    }

    /// Whether the drain hook (`BeginDrain`) ran in this run.
    pub fn drain_begun(&self) -> bool {
        self.drain_begun
    }

    /// The actions of the current step not executed yet.
    pub fn todo(&self) -> &Todo {
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
        if self.request == Some(Request::Spawn)
            && !matches!(ev, Event::ChildSpawned | Event::SpawnFailed(_))
        {
            return Err(NotAllowed::Spawning);
        }
        if matches!(ev, Event::Start) == self.started {
            return Err(NotAllowed::StartOrder);
        }
        let wants = |ok: bool| {
            if ok {
                Ok(())
            } else {
                Err(NotAllowed::NoRequest)
            }
        };
        let acquiring = matches!(self.request, Some(Request::Acquire { .. }));
        match ev {
            Event::Start => Ok(()),
            Event::LeaseBusy => match self.request {
                Some(Request::Acquire { busy: false }) => Ok(()),
                Some(Request::Acquire { busy: true }) => Err(NotAllowed::BusyTwice),
                _ => Err(NotAllowed::NoRequest),
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
            Event::RecoveryDone | Event::RecoveryFailed(_) => {
                wants(self.request == Some(Request::Recover))
            }
            Event::ChildSpawned | Event::SpawnFailed(_) => {
                wants(self.request == Some(Request::Spawn))
            }
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
                    && self.machine.kind() == tenure::machine::PhaseKind::Draining
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
                wants(self.request == Some(Request::Publish))
            }
            Event::LeaseReleased => wants(self.request == Some(Request::Release)),
        }
    }

    /// Feeds `ev` if the driver semantics allow it and the machine accepts it; the returned
    /// actions are now the driver's to execute (see [`Driver::pop`]). On error nothing changed.
    pub fn feed(&mut self, ev: Event) -> Result<Handled, FeedError> {
        self.admits(ev).map_err(FeedError::NotAllowed)?;
        let handled = self.machine.handle(ev).map_err(FeedError::Rejected)?;
        match ev {
            Event::Start => self.started = true,
            Event::LeaseBusy => self.request = Some(Request::Acquire { busy: true }),
            Event::LeaseGranted { .. }
            | Event::WaitExpired
            | Event::LeaseFailed(_)
            | Event::RecoveryDone
            | Event::RecoveryFailed(_)
            | Event::SpawnFailed(_)
            | Event::CheckpointPublished
            | Event::CheckpointSkipped
            | Event::CheckpointFailed
            | Event::LeaseReleased => self.request = None,
            Event::ChildSpawned => {
                self.request = None;
                self.child = ChildView::Running;
            }
            Event::ChildExited(_) | Event::TreeEmpty => self.child = ChildView::Reaped,
            Event::MainExited(_) => self.child = ChildView::Tree,
            Event::MainAdopted => self.child = ChildView::Running,
            Event::TimerExpired(t) => self.timers &= !timer_bit(t),
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

    /// Takes the next action of the current step and does the driver's own bookkeeping for it
    /// (outstanding request, timers, drain hook, exit). The world's part is the caller's.
    pub fn pop(&mut self) -> Option<Action> {
        let a = self.todo.pop()?;
        match a {
            Action::AcquireLease => self.request = Some(Request::Acquire { busy: false }),
            Action::AbandonAcquire => {
                if matches!(self.request, Some(Request::Acquire { .. })) {
                    self.request = None;
                }
            }
            Action::Recover => self.request = Some(Request::Recover),
            Action::SpawnChild => self.request = Some(Request::Spawn),
            Action::Publish => self.request = Some(Request::Publish),
            Action::ReleaseLease => self.request = Some(Request::Release),
            Action::ArmTimer(t, _) => self.timers |= timer_bit(t),
            Action::DisarmTimer(t) => self.timers &= !timer_bit(t),
            Action::BeginDrain => self.drain_begun = true,
            Action::Exit(_) => {
                self.exited = true;
                self.request = None;
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

    /// Replaces the machine with a fresh one in the same process, as a driver with a retry loop
    /// would. Only mutants do this: it is what invariant I6 forbids.
    pub fn restart_machine(&mut self) {
        *self = Driver::new(*self.machine.config());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tenure::machine::{Config, ReadyMode, Signal};

    fn fed(d: &mut Driver, ev: Event) {
        let _ = d.feed(ev).unwrap();
    }

    #[test]
    fn answers_need_their_request() {
        let mut d = Driver::new(Config::child(ReadyMode::Start));
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
            d.admits(Event::ChildExited(tenure::machine::ChildStatus::Exited(0))),
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

    /// A feed that fails changes nothing (the driver is exactly as before), whether the driver
    /// semantics refuse the event or the machine rejects it: checked for every sample event in
    /// every driver state reachable in every profile, between steps and in the middle of one.
    /// Both kinds of failure must occur, so the check cannot pass vacuously.
    #[test]
    fn rejected_events_change_nothing() {
        use std::collections::{HashSet, VecDeque};
        let (mut not_allowed, mut rejected, mut states) = (0usize, 0usize, 0usize);
        for (name, config) in tenure::machine::table::profiles() {
            let start = Driver::new(config);
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
                                    "{name}: a failed feed of {e} ({err}) changed the driver"
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
        assert!(states > 100, "explored only {states} driver states");
        assert!(
            not_allowed > 0 && rejected > 0,
            "{not_allowed} refused, {rejected} rejected"
        );
    }

    /// The driver allows a drain request at any time (the machine decides what it means), and
    /// nothing after its exit.
    #[test]
    fn drain_requests_any_time_nothing_after_exit() {
        let mut d = Driver::new(Config::in_process());
        fed(&mut d, Event::Start);
        while d.pop().is_some() {}
        let before = d;
        fed(&mut d, Event::DrainRequested);
        assert_ne!(d, before);
        let mut e = Driver::new(Config::in_process());
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
}

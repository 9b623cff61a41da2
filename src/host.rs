//! The in-process handle a host embeds: drain requests from any thread, stop signals, admission
//! by phase and residency guards (cards H1–H4).
//!
//! Any thread may feed the shared machine an event (`request_drain`, `stop`); the machine, under
//! one mutex, decides. The `begin-drain` action is executed at once by the thread whose event
//! produced it (it closes residencies and runs the host's hook) — the machine emits it once per
//! ownership, so the hook runs exactly once. Every other action needs the owner's files and is
//! queued for the owner's control thread (the typestate [`crate::Tenure`]), which executes it.
//!
//! Residencies are counted in one atomic word ([`Residencies`]) so that acquiring one is a
//! compare-and-swap that fails once the drain committed; this is what the loom tests check.
//! All shared state goes through [`crate::sync`].

use crate::machine::{
    Action, Event, Machine, NotAdmitted, OpClass, PhaseKind, Rejected, Residencies, ResidencyKind,
    RetireMode, Signal, admit,
};
use crate::sync::{self, Arc, AtomicU32, AtomicU64, Condvar, Mutex, Ordering};
use std::collections::VecDeque;
use std::fmt;
use std::time::{Duration, Instant};

/// The drain hook: shared, so that it runs outside its lock (a hook may set another hook). Not
/// `crate::sync`'s `Arc`: loom's cannot hold an unsized closure, and the hook is no part of
/// what the loom tests model.
type Hook = std::sync::Arc<dyn Fn() + Send + Sync>;

/// A cloneable, thread-safe handle on one owner's lifecycle.
#[derive(Clone)]
pub struct Host {
    shared: Arc<Shared>,
}

struct Shared {
    core: Mutex<Core>,
    changed: Condvar,
    residencies: AtomicU64,
    begun: AtomicU32,
    mode: RetireMode,
    hook: Mutex<Option<Hook>>,
}

struct Core {
    machine: Machine,
    pending: VecDeque<Action>,
}

impl fmt::Debug for Host {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let core = sync::lock(&self.shared.core);
        f.debug_struct("Host")
            .field("phase", &core.machine.phase().label())
            .field("residencies", &self.residencies())
            .finish()
    }
}

/// Mutations of this module that the loom tests must catch (compiled only with `--cfg loom`).
#[cfg(loom)]
#[doc(hidden)]
pub mod mutation {
    use std::sync::atomic::{AtomicU8, Ordering};

    /// A deliberately wrong variant of the handle.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    #[repr(u8)]
    pub enum Mutation {
        /// The correct code.
        None = 0,
        /// Step a copy of the machine outside the lock and store it back (load-then-store).
        StepOutsideLock = 1,
        /// Check "closed" with a load, then increment with a separate add.
        CheckThenIncrement = 2,
        /// Commit an idle exit after a load instead of a compare-and-swap.
        IdleCommitWithoutCas = 3,
    }

    // Loom runs a model's threads as coroutines on the test's own OS thread, so a thread-local
    // switch is seen by every thread of the model and by no other test.
    std::thread_local! {
        static ACTIVE: AtomicU8 = const { AtomicU8::new(0) };
    }

    /// Selects a mutation until the returned guard drops (also when a test panics).
    #[must_use]
    pub fn set(m: Mutation) -> Guard {
        ACTIVE.with(|a| a.store(m as u8, Ordering::SeqCst));
        Guard(())
    }

    /// Restores the correct code when dropped.
    pub struct Guard(());

    impl Drop for Guard {
        fn drop(&mut self) {
            ACTIVE.with(|a| a.store(Mutation::None as u8, Ordering::SeqCst));
        }
    }

    pub(crate) fn is(m: Mutation) -> bool {
        ACTIVE.with(|a| a.load(Ordering::SeqCst)) == m as u8
    }
}

#[cfg(loom)]
use mutation::{Mutation, is as mutated};

impl Host {
    /// A handle on `machine` that is not bound to a state dir: the caller executes the queued
    /// actions itself. [`crate::Tenure`] builds its handle this way; tests and models use it to
    /// exercise the concurrency without files.
    pub fn detached(machine: Machine, mode: RetireMode) -> Host {
        Host {
            shared: Arc::new(Shared {
                core: Mutex::new(Core {
                    machine,
                    pending: VecDeque::new(),
                }),
                changed: Condvar::new(),
                residencies: AtomicU64::new(Residencies::EMPTY.bits()),
                begun: AtomicU32::new(0),
                mode,
                hook: Mutex::new(None),
            }),
        }
    }

    /// Set the hook that runs when the drain begins (stop accepting work, close listeners). It
    /// runs once per ownership, on the thread whose request or signal began the drain.
    pub fn on_begin_drain(&self, hook: impl Fn() + Send + Sync + 'static) {
        *sync::lock(&self.shared.hook) = Some(std::sync::Arc::new(hook));
    }

    /// Ask the owner to drain. Callable from any thread, any number of times, before or after
    /// recovery finishes; the drain begins exactly once (card H2).
    pub fn request_drain(&self) {
        // Repeated requests are "ignored" by the machine; a rejection (e.g. after the end)
        // means there is nothing left to drain, which is what the caller wanted.
        let _ = self.feed(Event::DrainRequested);
    }

    /// A stop signal arrived (call from the thread that receives signals).
    pub fn stop(&self, signal: Signal) {
        let _ = self.feed(Event::Stop(signal));
    }

    /// The current phase.
    pub fn phase(&self) -> PhaseKind {
        sync::lock(&self.shared.core).machine.kind()
    }

    /// A copy of the current machine.
    pub fn machine(&self) -> Machine {
        sync::lock(&self.shared.core).machine
    }

    /// The epoch of the current ownership, if owning.
    pub fn epoch(&self) -> Option<u64> {
        sync::lock(&self.shared.core).machine.phase().epoch()
    }

    /// How many times the drain began (0 or 1; the loom tests assert it).
    pub fn drains_begun(&self) -> u32 {
        self.shared.begun.load(Ordering::SeqCst)
    }

    /// The residency counts and whether the drain committed.
    pub fn residencies(&self) -> Residencies {
        Residencies::from_bits(self.shared.residencies.load(Ordering::SeqCst))
    }

    /// Whether an operation of `class` is admitted now (card H1). Once the drain began, new
    /// work is rejected with `draining` even if the phase has not moved yet.
    pub fn admit(&self, class: OpClass) -> Result<(), NotAdmitted> {
        if class != OpClass::Status && self.residencies().closed() {
            return Err(NotAdmitted::Draining);
        }
        admit(self.phase(), class)
    }

    /// Take a residency for work of `class` (card H3): active ones block retirement, idle ones
    /// do not. Fails with `not ready`/`draining`/`closed` as admission says; once the drain
    /// committed no residency can be acquired. Released when the guard drops.
    pub fn enter(&self, class: OpClass, kind: ResidencyKind) -> Result<Residency, NotAdmitted> {
        admit(self.phase(), class)?;
        self.acquire(kind)?;
        Ok(Residency {
            shared: self.shared.clone(),
            kind,
        })
    }

    fn acquire(&self, kind: ResidencyKind) -> Result<(), NotAdmitted> {
        let word = &self.shared.residencies;
        #[cfg(loom)]
        if mutated(Mutation::CheckThenIncrement) {
            let now = Residencies::from_bits(word.load(Ordering::SeqCst));
            let next = now.acquire(kind)?;
            word.fetch_add(next.bits() - now.bits(), Ordering::SeqCst);
            return Ok(());
        }
        let mut cur = word.load(Ordering::SeqCst);
        loop {
            let next = Residencies::from_bits(cur).acquire(kind)?;
            match word.compare_exchange(cur, next.bits(), Ordering::SeqCst, Ordering::SeqCst) {
                Ok(_) => return Ok(()),
                Err(actual) => cur = actual,
            }
        }
    }

    /// Commit an idle exit if the owner is ephemeral and holds no active residency right now;
    /// the commit and any concurrent `enter` are ordered by one compare-and-swap, so an exit
    /// never commits while a residency is held. On success the drain is requested.
    pub fn try_idle_exit(&self) -> bool {
        if self.phase() != PhaseKind::Ready {
            return false;
        }
        let word = &self.shared.residencies;
        #[cfg(loom)]
        if mutated(Mutation::IdleCommitWithoutCas) {
            let now = Residencies::from_bits(word.load(Ordering::SeqCst));
            if now.commit_idle_exit(self.shared.mode).is_none() {
                return false;
            }
            word.fetch_or(Residencies::EMPTY.close().bits(), Ordering::SeqCst);
            self.request_drain();
            return true;
        }
        let mut cur = word.load(Ordering::SeqCst);
        loop {
            let Some(next) = Residencies::from_bits(cur).commit_idle_exit(self.shared.mode) else {
                return false;
            };
            match word.compare_exchange(cur, next.bits(), Ordering::SeqCst, Ordering::SeqCst) {
                Ok(_) => break,
                Err(actual) => cur = actual,
            }
        }
        self.request_drain();
        true
    }

    /// Feed an event to the machine from any thread. `begin-drain` runs here; every other
    /// action is queued for the control thread.
    pub fn feed(&self, event: Event) -> Result<(), Rejected> {
        let begin = {
            #[cfg(loom)]
            if mutated(Mutation::StepOutsideLock) {
                let copy = sync::lock(&self.shared.core).machine;
                let (next, handled) = copy.step(event)?;
                let mut core = sync::lock(&self.shared.core);
                core.machine = next;
                let begin = handled.actions.contains(&Action::BeginDrain);
                core.pending.extend(
                    handled
                        .actions
                        .into_iter()
                        .filter(|a| *a != Action::BeginDrain),
                );
                drop(core);
                self.after_step(begin);
                return Ok(());
            }
            let mut core = sync::lock(&self.shared.core);
            let handled = core.machine.handle(event)?;
            let mut begin = false;
            for a in handled.actions {
                match a {
                    Action::BeginDrain => begin = true,
                    other => core.pending.push_back(other),
                }
            }
            begin
        };
        self.after_step(begin);
        Ok(())
    }

    fn after_step(&self, begin: bool) {
        if begin {
            // The drain commits here: from now on no residency can be acquired.
            self.shared
                .residencies
                .fetch_or(Residencies::EMPTY.close().bits(), Ordering::SeqCst);
            self.shared.begun.fetch_add(1, Ordering::SeqCst);
            // Run outside the hook's lock: a hook that sets a hook (or anything that takes
            // it) must not wait for itself.
            let hook = sync::lock(&self.shared.hook).clone();
            if let Some(hook) = hook {
                hook();
            }
        }
        self.notify();
    }

    fn notify(&self) {
        // Taking the lock orders this notification after any waiter's check of the condition.
        drop(sync::lock(&self.shared.core));
        self.shared.changed.notify_all();
    }

    /// Take the actions queued for the control thread, in order.
    pub fn take_pending(&self) -> Vec<Action> {
        sync::lock(&self.shared.core).pending.drain(..).collect()
    }

    /// Wait until actions are queued for the control thread, or `deadline` passes (`None`
    /// waits forever). Returns whether actions are queued.
    pub fn wait_pending(&self, deadline: Option<Instant>) -> bool {
        self.wait_until(deadline, |core, _| !core.pending.is_empty())
    }

    /// Wait until no active residency is held after the drain committed, or `deadline` passes.
    pub fn wait_settled(&self, deadline: Option<Instant>) -> bool {
        self.wait_until(deadline, |_, r| r.settled())
    }

    /// Wait until actions are queued or, for an ephemeral owner, no active residency is held;
    /// or `deadline` passes.
    pub fn wait_pending_or_idle(&self, deadline: Option<Instant>) -> bool {
        let mode = self.shared.mode;
        self.wait_until(deadline, move |core, r| {
            !core.pending.is_empty() || r.idle_decision(mode) == crate::machine::IdleDecision::Idle
        })
    }

    /// The retirement mode the handle was built with.
    pub fn retire_mode(&self) -> RetireMode {
        self.shared.mode
    }

    fn wait_until(
        &self,
        deadline: Option<Instant>,
        done: impl Fn(&Core, Residencies) -> bool,
    ) -> bool {
        let mut core = sync::lock(&self.shared.core);
        loop {
            if done(&core, self.residencies()) {
                return true;
            }
            match deadline {
                None => {
                    core = self
                        .shared
                        .changed
                        .wait(core)
                        .unwrap_or_else(|e| e.into_inner());
                }
                Some(d) => {
                    let now = Instant::now();
                    if now >= d {
                        return false;
                    }
                    let wait = (d - now).min(Duration::from_secs(3600));
                    core = self
                        .shared
                        .changed
                        .wait_timeout(core, wait)
                        .unwrap_or_else(|e| e.into_inner())
                        .0;
                }
            }
        }
    }
}

/// A residency held by some work; released on drop. Dropping the last active residency wakes
/// a drain waiting to settle, and an ephemeral owner's idle watch.
#[must_use = "a residency is released as soon as it is dropped"]
pub struct Residency {
    shared: Arc<Shared>,
    kind: ResidencyKind,
}

impl Residency {
    /// The kind of this residency.
    pub fn kind(&self) -> ResidencyKind {
        self.kind
    }
}

impl fmt::Debug for Residency {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Residency")
            .field("kind", &self.kind)
            .finish()
    }
}

impl Drop for Residency {
    fn drop(&mut self) {
        let delta = Residencies::EMPTY
            .acquire(self.kind)
            .map_or(0, |r| r.bits());
        let before = self.shared.residencies.fetch_sub(delta, Ordering::SeqCst);
        let after = Residencies::from_bits(before - delta);
        if !after.blocks_retirement() {
            drop(sync::lock(&self.shared.core));
            self.shared.changed.notify_all();
        }
    }
}

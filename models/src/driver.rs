//! The single-process step relation every model shares: the real [`Machine`] inside the real
//! driver core, [`tenure::driver::core::Core`] — the code the runner's event loop runs — and
//! nothing else.
//!
//! The machine decides which events are legal in which phase and what to do about them; the
//! core decides when the driver can feed an event at all, from what the driver itself did
//! before (the actions of a step are executed in order before anything else is fed; answers come
//! only for outstanding requests; spawning is synchronous; timers fire only while armed; ... —
//! the rules are listed in the core's module documentation). A model differs from the runner only
//! in how it answers requests and what its world does meanwhile.
//!
//! The lease, signal and checkpoint models keep one [`Driver`] per process and add the world
//! (which answer the kernel gives, when a signal arrives); the trace checker replays a recorded
//! run through the same [`Driver`] with an open world, so it accepts exactly the runs some world
//! could have produced.
//!
//! [`Machine`]: tenure::machine::Machine

pub use tenure::driver::core::{
    ChildView, Core, FeedError, MAX_ACTIONS, NotAllowed, Request, Todo,
};

/// The driver core, under the name the models use for one process's driver.
pub type Driver = Core;

/// What only a mutant world does to a driver: start its machine again in the same process, as
/// a driver with a retry loop would (invariant I6 forbids it).
pub trait Restart {
    /// Replaces the core with a fresh one of the same configuration.
    fn restart_machine(&mut self);
}

impl Restart for Core {
    fn restart_machine(&mut self) {
        *self = Core::new(*self.machine().config());
    }
}

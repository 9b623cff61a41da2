//! Residency accounting (card H3), as pure values.
//!
//! Work holds *active* residencies (an in-flight request, a running job) or *idle* ones (an
//! attached but quiet client). Active residencies block retirement; idle ones do not. The
//! counts and the "closed" mark live packed in one `u64` so the in-process handle can move
//! between these values with a single compare-and-swap; every rule about them is here.

use super::NotAdmitted;
use serde::{Deserialize, Serialize};

/// The kind of a residency.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ResidencyKind {
    /// Blocks retirement: an in-flight request or a running job.
    Active,
    /// Does not block retirement: an attached client that is doing nothing.
    Idle,
}

/// How an owner retires when it has nothing to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RetireMode {
    /// Stay until closed, however idle.
    Service,
    /// Exit after an idle grace with no active residency.
    Ephemeral,
}

/// What the owner should do about idleness right now.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum IdleDecision {
    /// Keep running: a service, or active work exists, or the owner is closing anyway.
    Stay,
    /// Nothing active: start (or keep) the idle-grace clock; exit if it runs out while still
    /// idle.
    Idle,
}

const CLOSED: u64 = 1 << 63;
const ACTIVE_MASK: u64 = 0xFFFF_FFFF;
const IDLE_SHIFT: u32 = 32;
const IDLE_MASK: u64 = 0x7FFF_FFFF << IDLE_SHIFT;

/// The residency counts and the closed mark, packed in one word.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Residencies(u64);

impl Residencies {
    /// No residency, open.
    pub const EMPTY: Residencies = Residencies(0);

    /// From the packed word.
    pub const fn from_bits(bits: u64) -> Residencies {
        Residencies(bits)
    }

    /// The packed word.
    pub const fn bits(self) -> u64 {
        self.0
    }

    /// Active residencies held.
    pub const fn active(self) -> u32 {
        (self.0 & ACTIVE_MASK) as u32
    }

    /// Idle residencies held.
    pub const fn idle(self) -> u32 {
        ((self.0 & IDLE_MASK) >> IDLE_SHIFT) as u32
    }

    /// Whether the drain committed: no residency can be acquired any more.
    pub const fn closed(self) -> bool {
        self.0 & CLOSED != 0
    }

    /// Whether retirement must wait (active work exists).
    pub const fn blocks_retirement(self) -> bool {
        self.active() > 0
    }

    /// The value after acquiring one residency of `kind`, or why it is refused.
    pub const fn acquire(self, kind: ResidencyKind) -> Result<Residencies, NotAdmitted> {
        if self.closed() {
            return Err(NotAdmitted::Draining);
        }
        match kind {
            ResidencyKind::Active => Ok(Residencies(self.0 + 1)),
            ResidencyKind::Idle => Ok(Residencies(self.0 + (1 << IDLE_SHIFT))),
        }
    }

    /// The value after releasing one residency of `kind` (held, so the count is positive).
    pub const fn release(self, kind: ResidencyKind) -> Residencies {
        match kind {
            ResidencyKind::Active => Residencies(self.0 - 1),
            ResidencyKind::Idle => Residencies(self.0 - (1 << IDLE_SHIFT)),
        }
    }

    /// The value after the drain commits: closed to new residencies.
    pub const fn close(self) -> Residencies {
        Residencies(self.0 | CLOSED)
    }

    /// Whether a committed drain may go on: closed and no active residency.
    pub const fn settled(self) -> bool {
        self.closed() && !self.blocks_retirement()
    }

    /// The idle decision for an owner in `mode`.
    pub const fn idle_decision(self, mode: RetireMode) -> IdleDecision {
        match mode {
            RetireMode::Service => IdleDecision::Stay,
            RetireMode::Ephemeral if self.closed() || self.blocks_retirement() => {
                IdleDecision::Stay
            }
            RetireMode::Ephemeral => IdleDecision::Idle,
        }
    }

    /// The value after an idle exit commits, if it may: ephemeral, open and no active work at
    /// the moment of the commit. The host applies this with one compare-and-swap, so a
    /// residency acquired concurrently either happened before (and blocks the exit) or fails.
    pub const fn commit_idle_exit(self, mode: RetireMode) -> Option<Residencies> {
        match self.idle_decision(mode) {
            IdleDecision::Idle => Some(self.close()),
            IdleDecision::Stay => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Card H3: active residencies block retirement, idle ones do not; an ephemeral owner may
    /// exit only with no active residency; a service owner stays.
    #[test]
    fn h3_residencies_decide_idle_exit() {
        let r = Residencies::EMPTY;
        assert_eq!(r.idle_decision(RetireMode::Ephemeral), IdleDecision::Idle);
        assert_eq!(r.idle_decision(RetireMode::Service), IdleDecision::Stay);
        let a = r.acquire(ResidencyKind::Active).unwrap();
        assert_eq!(a.active(), 1);
        assert!(a.blocks_retirement());
        assert_eq!(a.commit_idle_exit(RetireMode::Ephemeral), None);
        let i = r.acquire(ResidencyKind::Idle).unwrap();
        assert_eq!((i.active(), i.idle()), (0, 1));
        assert!(!i.blocks_retirement());
        let exited = i.commit_idle_exit(RetireMode::Ephemeral).unwrap();
        assert!(exited.closed());
        assert_eq!(i.commit_idle_exit(RetireMode::Service), None);
        let back = a.release(ResidencyKind::Active);
        assert_eq!(back, Residencies::EMPTY);
    }

    /// Card H3: after the drain commits no residency can be acquired, and the drain is settled
    /// only when the last active residency is released.
    #[test]
    fn h3_closed_refuses_new_residencies() {
        let held = Residencies::EMPTY
            .acquire(ResidencyKind::Active)
            .unwrap()
            .acquire(ResidencyKind::Idle)
            .unwrap();
        let closed = held.close();
        assert_eq!(
            closed.acquire(ResidencyKind::Active),
            Err(NotAdmitted::Draining)
        );
        assert_eq!(
            closed.acquire(ResidencyKind::Idle),
            Err(NotAdmitted::Draining)
        );
        assert!(!closed.settled());
        let after = closed.release(ResidencyKind::Active);
        assert!(after.settled(), "idle residencies do not block retirement");
        assert_eq!(after.idle(), 1);
    }
}

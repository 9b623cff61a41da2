//! Admission by phase (card H1): which classes of operation an owner accepts in each phase.

use super::PhaseKind;
use serde::{Deserialize, Serialize};

/// A class of operation a host serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OpClass {
    /// Read-only questions about the owner (phase, epoch, health).
    Status,
    /// Work that recovery itself needs (loading state, warming caches).
    Bootstrap,
    /// Normal work, served only when ready.
    Serve,
}

impl OpClass {
    /// Every class, in a fixed order.
    pub const ALL: [OpClass; 3] = [OpClass::Status, OpClass::Bootstrap, OpClass::Serve];
}

/// Why an operation was not admitted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, thiserror::Error)]
pub enum NotAdmitted {
    /// The owner is not ready yet (cold or recovering).
    #[error("not ready: phase {0} admits only bootstrap and status operations; retry when ready")]
    NotReady(PhaseKind),
    /// The drain began; no new work is taken.
    #[error("draining: the owner stopped taking new work; send it to the next owner")]
    Draining,
    /// The owner has ended.
    #[error("closed: the owner ended ({0}); send work to the next owner")]
    Closed(PhaseKind),
}

/// Decide whether an operation of `class` is admitted in `phase`.
pub const fn admit(phase: PhaseKind, class: OpClass) -> Result<(), NotAdmitted> {
    match (phase, class) {
        (_, OpClass::Status) => Ok(()),
        (PhaseKind::Cold, OpClass::Bootstrap | OpClass::Serve) => Err(NotAdmitted::NotReady(phase)),
        (PhaseKind::Recovering, OpClass::Bootstrap) => Ok(()),
        (PhaseKind::Recovering, OpClass::Serve) => Err(NotAdmitted::NotReady(phase)),
        (PhaseKind::Ready, OpClass::Bootstrap | OpClass::Serve) => Ok(()),
        (PhaseKind::Draining, OpClass::Bootstrap | OpClass::Serve) => Err(NotAdmitted::Draining),
        (
            PhaseKind::Released | PhaseKind::Cancelled | PhaseKind::Refused,
            OpClass::Bootstrap | OpClass::Serve,
        ) => Err(NotAdmitted::Closed(phase)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Card H1: bootstrap and status are admitted while recovering, ready-only work is rejected
    /// with `not ready`, and after the drain begins new work is rejected with `draining`.
    #[test]
    fn h1_admission_by_phase() {
        assert_eq!(admit(PhaseKind::Recovering, OpClass::Bootstrap), Ok(()));
        assert_eq!(admit(PhaseKind::Recovering, OpClass::Status), Ok(()));
        let e = admit(PhaseKind::Recovering, OpClass::Serve).unwrap_err();
        assert_eq!(e, NotAdmitted::NotReady(PhaseKind::Recovering));
        assert!(e.to_string().starts_with("not ready"), "{e}");
        assert_eq!(admit(PhaseKind::Ready, OpClass::Serve), Ok(()));
        assert_eq!(admit(PhaseKind::Ready, OpClass::Bootstrap), Ok(()));
        for class in [OpClass::Serve, OpClass::Bootstrap] {
            let e = admit(PhaseKind::Draining, class).unwrap_err();
            assert_eq!(e, NotAdmitted::Draining);
            assert!(e.to_string().starts_with("draining"), "{e}");
        }
        assert_eq!(admit(PhaseKind::Draining, OpClass::Status), Ok(()));
        for p in [
            PhaseKind::Released,
            PhaseKind::Cancelled,
            PhaseKind::Refused,
        ] {
            assert_eq!(admit(p, OpClass::Serve), Err(NotAdmitted::Closed(p)));
            assert_eq!(admit(p, OpClass::Status), Ok(()));
        }
        assert_eq!(
            admit(PhaseKind::Cold, OpClass::Serve),
            Err(NotAdmitted::NotReady(PhaseKind::Cold))
        );
    }
}

//! The pure lifecycle machine (being written on main by the lead). This file currently only
//! fixes the phase names shared by every module.

use serde::{Deserialize, Serialize};

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

//! The trace format: one JSON object per line, written by the runner's `--trace FILE` (and by
//! the library), replayed by the models' conformance checker.
//!
//! The first line is a [`TraceLine::Header`] with the machine's configuration; every following
//! line is a [`TraceLine::Step`]: the event the driver fed, the phase label before and after,
//! and the actions the machine returned (or the rejection). Replaying the events from
//! `Machine::new(config)` must reproduce every step exactly.

use super::{Action, Config, Event, Machine, PhaseKind};
use serde::{Deserialize, Serialize};

/// The format version written in the header.
pub const TRACE_VERSION: u32 = 1;

/// One line of a trace.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", tag = "kind")]
pub enum TraceLine {
    /// The first line: format version, configuration, and who wrote it.
    Header {
        /// [`TRACE_VERSION`].
        version: u32,
        /// The machine's configuration.
        config: Config,
        /// The process that wrote the trace.
        pid: u32,
    },
    /// One step of the machine.
    Step(TraceStep),
}

/// One event fed to the machine and what it answered.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TraceStep {
    /// Position in the trace, from 1.
    pub seq: u64,
    /// Milliseconds since the trace began (for people; replay ignores it).
    pub at_ms: u64,
    /// The phase label before the event.
    pub before: String,
    /// The event.
    pub event: Event,
    /// The phase label after the event.
    pub after: String,
    /// The phase name after the event.
    pub phase: PhaseKind,
    /// The actions returned, in order (empty when ignored or rejected).
    pub actions: Vec<Action>,
    /// Whether the spec ignores this event here.
    #[serde(default)]
    pub ignored: bool,
    /// The rejection message, when the machine rejected the event.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rejected: Option<String>,
}

impl TraceStep {
    /// Feed `event` to `machine` and describe the step.
    pub fn record(machine: &mut Machine, seq: u64, at_ms: u64, event: Event) -> TraceStep {
        let before = machine.phase().label();
        let (actions, ignored, rejected) = match machine.handle(event) {
            Ok(h) => (h.actions, h.ignored, None),
            Err(r) => (Vec::new(), false, Some(r.to_string())),
        };
        TraceStep {
            seq,
            at_ms,
            before,
            event,
            after: machine.phase().label(),
            phase: machine.kind(),
            actions,
            ignored,
            rejected,
        }
    }
}

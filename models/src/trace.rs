//! Trace conformance: replays a JSONL trace (the format of `tenure::machine::trace`, written by
//! the runner's `--trace FILE` or by the library) through the models' single-process step
//! relation — the real machine inside the shared [`Driver`] semantics — and reports the first
//! step the model does not allow.
//!
//! A step conforms when its sequence number follows the last one, the driver semantics admit its
//! event at that point (an answer only to a request the driver made, a child event only while a
//! child runs, a timer only while armed, nothing during a spawn or after `Exit`), and the
//! machine, fed that event from the replayed phase, returns exactly the recorded phase labels,
//! actions and `ignored` flag. A trace may end anywhere (a run killed with SIGKILL writes no
//! last line); the summary says whether it reached `Exit`.
//!
//! One call checks a file: [`check_file`].

use crate::driver::{Driver, FeedError, NotAllowed};
use std::fmt;
use std::path::Path;
use tenure::machine::trace::{TRACE_VERSION, TraceLine, TraceStep};
use tenure::machine::{Action, Config, Outcome};

/// What a conforming trace showed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Summary {
    /// The configuration in the header.
    pub config: Config,
    /// The pid in the header.
    pub pid: u32,
    /// Steps replayed.
    pub steps: usize,
    /// The phase label after the last step.
    pub final_phase: String,
    /// The outcome of the `Exit` action, if the run reached it.
    pub outcome: Option<Outcome>,
}

impl Summary {
    /// The exit code the run ended with, if it reached `Exit`.
    pub fn exit_code(&self) -> Option<u8> {
        self.outcome.map(|o| o.code())
    }
}

/// Why a trace does not conform.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Problem {
    /// The file could not be read.
    Io(String),
    /// A line is not a trace line.
    Parse(String),
    /// The first line is not a header, or its version is not [`TRACE_VERSION`].
    Header(String),
    /// A header after the first line.
    SecondHeader,
    /// The sequence number is not the previous one plus one.
    Sequence {
        /// The sequence number expected.
        expected: u64,
    },
    /// The driver semantics do not allow the event here.
    NotAllowed(NotAllowed),
    /// The machine rejects the event here (the recorded rejection, if any, is included).
    Rejected(String),
    /// The recorded step differs from the replay in this field.
    Mismatch {
        /// `before`, `after`, `phase`, `actions`, `ignored` or `rejected`.
        field: &'static str,
        /// What the replay produced.
        replayed: String,
        /// What the trace recorded.
        recorded: String,
    },
}

/// The first step of a trace the model does not allow.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    /// The 1-based line of the trace.
    pub line: usize,
    /// The step's sequence number, when the line was a step.
    pub seq: Option<u64>,
    /// What is wrong.
    pub problem: Problem,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "line {}", self.line)?;
        if let Some(seq) = self.seq {
            write!(f, " (seq {seq})")?;
        }
        f.write_str(": ")?;
        match &self.problem {
            Problem::Io(e) => write!(f, "cannot read the trace: {e}"),
            Problem::Parse(e) => write!(f, "not a trace line: {e}"),
            Problem::Header(e) => write!(f, "bad header: {e}"),
            Problem::SecondHeader => f.write_str("a second header"),
            Problem::Sequence { expected } => write!(f, "expected seq {expected}"),
            Problem::NotAllowed(n) => write!(f, "the driver would not feed this event: {n}"),
            Problem::Rejected(r) => write!(f, "the machine rejects this event: {r}"),
            Problem::Mismatch {
                field,
                replayed,
                recorded,
            } => write!(
                f,
                "`{field}` differs: the model gives {replayed}, the trace says {recorded}"
            ),
        }
    }
}

impl std::error::Error for Violation {}

/// Checks the trace in `path`.
pub fn check_file(path: impl AsRef<Path>) -> Result<Summary, Violation> {
    let text = std::fs::read_to_string(path.as_ref()).map_err(|e| Violation {
        line: 0,
        seq: None,
        problem: Problem::Io(format!("{}: {e}", path.as_ref().display())),
    })?;
    check_str(&text)
}

/// Checks a trace given as JSONL text (blank lines are skipped).
pub fn check_str(text: &str) -> Result<Summary, Violation> {
    let mut lines = Vec::new();
    for (i, raw) in text.lines().enumerate() {
        if raw.trim().is_empty() {
            continue;
        }
        let parsed: TraceLine = serde_json::from_str(raw).map_err(|e| Violation {
            line: i + 1,
            seq: None,
            problem: Problem::Parse(e.to_string()),
        })?;
        lines.push((i + 1, parsed));
    }
    check_lines(&lines)
}

/// Checks parsed trace lines, each with its 1-based line number.
pub fn check_lines(lines: &[(usize, TraceLine)]) -> Result<Summary, Violation> {
    let Some((first_line, first)) = lines.first() else {
        return Err(Violation {
            line: 1,
            seq: None,
            problem: Problem::Header("the trace is empty".into()),
        });
    };
    let (config, pid) = match first {
        TraceLine::Header {
            version,
            config,
            pid,
        } => {
            if *version != TRACE_VERSION {
                return Err(Violation {
                    line: *first_line,
                    seq: None,
                    problem: Problem::Header(format!(
                        "version {version}, this checker reads {TRACE_VERSION}"
                    )),
                });
            }
            (*config, *pid)
        }
        TraceLine::Step(_) => {
            return Err(Violation {
                line: *first_line,
                seq: None,
                problem: Problem::Header("the first line is a step".into()),
            });
        }
    };
    let mut replay = Replay::new(config);
    for (line, l) in &lines[1..] {
        match l {
            TraceLine::Header { .. } => {
                return Err(Violation {
                    line: *line,
                    seq: None,
                    problem: Problem::SecondHeader,
                });
            }
            TraceLine::Step(step) => replay.step(step).map_err(|problem| Violation {
                line: *line,
                seq: Some(step.seq),
                problem,
            })?,
        }
    }
    Ok(Summary {
        config,
        pid,
        steps: replay.steps,
        final_phase: replay.driver.machine().phase().label(),
        outcome: replay.outcome,
    })
}

/// The replay of one trace: the driver and what was seen so far.
struct Replay {
    driver: Driver,
    steps: usize,
    outcome: Option<Outcome>,
}

impl Replay {
    fn new(config: Config) -> Replay {
        Replay {
            driver: Driver::new(config),
            steps: 0,
            outcome: None,
        }
    }

    fn step(&mut self, step: &TraceStep) -> Result<(), Problem> {
        let expected = self.steps as u64 + 1;
        if step.seq != expected {
            return Err(Problem::Sequence { expected });
        }
        mismatch(
            "before",
            &self.driver.machine().phase().label(),
            &step.before,
        )?;
        let handled = match self.driver.feed(step.event) {
            Ok(h) => h,
            Err(FeedError::NotAllowed(n)) => return Err(Problem::NotAllowed(n)),
            Err(FeedError::Rejected(r)) => {
                let mut msg = r.to_string();
                if let Some(rec) = &step.rejected {
                    msg.push_str(&format!(" (recorded: {rec})"));
                }
                return Err(Problem::Rejected(msg));
            }
        };
        if let Some(rec) = &step.rejected {
            return Err(Problem::Mismatch {
                field: "rejected",
                replayed: "accepted".into(),
                recorded: rec.clone(),
            });
        }
        mismatch("ignored", &handled.ignored, &step.ignored)?;
        mismatch("actions", &show(&handled.actions), &show(&step.actions))?;
        mismatch("after", &self.driver.machine().phase().label(), &step.after)?;
        mismatch("phase", &self.driver.machine().kind(), &step.phase)?;
        // The driver executes the step's actions before it feeds anything else.
        while let Some(a) = self.driver.pop() {
            if let Action::Exit(o) = a {
                self.outcome = Some(o);
            }
        }
        self.steps += 1;
        Ok(())
    }
}

fn show(actions: &[Action]) -> String {
    let parts: Vec<String> = actions.iter().map(|a| a.to_string()).collect();
    format!("[{}]", parts.join(", "))
}

fn mismatch<T: PartialEq + fmt::Debug>(
    field: &'static str,
    replayed: &T,
    recorded: &T,
) -> Result<(), Problem> {
    if replayed == recorded {
        Ok(())
    } else {
        Err(Problem::Mismatch {
            field,
            replayed: format!("{replayed:?}"),
            recorded: format!("{recorded:?}"),
        })
    }
}

/// Writes the trace of feeding `events` to a fresh machine, as the runner would: the header,
/// then one [`TraceStep::record`] per event. For tests and for turning model paths into traces.
pub fn record(config: Config, pid: u32, events: &[tenure::machine::Event]) -> String {
    let mut machine = tenure::machine::Machine::new(config);
    let mut out = serde_json::to_string(&TraceLine::Header {
        version: TRACE_VERSION,
        config,
        pid,
    })
    .expect("trace lines serialise");
    out.push('\n');
    for (i, ev) in events.iter().enumerate() {
        let step = TraceStep::record(&mut machine, i as u64 + 1, i as u64 * 10, *ev);
        out.push_str(&serde_json::to_string(&TraceLine::Step(step)).expect("serialise"));
        out.push('\n');
    }
    out
}

//! Renders the transition table of spec/transitions.md and the exit-code table of
//! spec/lifecycle.md from the machine itself, so the spec cannot drift from the rules: a test
//! compares the files with these renderings.

use super::action::{Outcome, Reason, Refusal};
use super::event::{ChildStatus, Event, ExecFailure, Signal};
use super::{Config, HupPolicy, KillMode, Machine, Phase, ReadyMode};
use std::collections::{BTreeMap, HashSet, VecDeque};
use std::fmt::Write as _;
use std::time::Duration;

/// The configurations the spec renders: the runner with each `--type` (and the other
/// `--kill-mode` and `--hup`), and an in-process host.
pub fn profiles() -> Vec<(&'static str, Config)> {
    let mut start = Config::child(ReadyMode::Start);
    start.grace = Duration::from_secs(10);
    let mut main_stop = Config::child(ReadyMode::Start);
    main_stop.kill_mode = KillMode::Main;
    main_stop.hup = HupPolicy::Stop;
    let mut notify = Config::child(ReadyMode::Notify);
    notify.ready_timeout = Some(Duration::from_secs(30));
    notify.watchdog = Some(Duration::from_secs(20));
    let mut forking = Config::child(ReadyMode::Forking);
    forking.ready_timeout = Some(Duration::from_secs(30));
    forking.pid_file = true;
    vec![
        (
            "runner, `--type simple` (kill mode tree, HUP forwarded)",
            start,
        ),
        (
            "runner, `--type simple --kill-mode main --hup stop`",
            main_stop,
        ),
        (
            "runner, `--type notify --ready-timeout 30 --watchdog 20`",
            notify,
        ),
        (
            "runner, `--type forking --pidfile F --ready-timeout 30` (kill mode main)",
            forking,
        ),
        ("in-process host", Config::in_process()),
    ]
}

/// Every machine reachable from `cold(idle)` under `config` by the sample events, in
/// breadth-first order (so the first state with a label is the shortest way to reach it).
pub fn reachable(config: Config) -> Vec<Machine> {
    let events = Event::samples();
    let start = Machine::new(config);
    let mut seen = HashSet::from([start]);
    let mut order = vec![start];
    let mut queue = VecDeque::from([start]);
    while let Some(m) = queue.pop_front() {
        for &e in &events {
            if let Ok((n, _)) = m.step(e)
                && seen.insert(n)
            {
                order.push(n);
                queue.push_back(n);
            }
        }
    }
    order
}

/// The row label of a state in the table: the phase and its step, without the data that only
/// changes numbers (signal, exit status). Terminal phases collapse to their name.
pub fn row_label(m: &Machine) -> String {
    match m.phase() {
        Phase::Released(_) => "released".into(),
        Phase::Cancelled(_) => "cancelled".into(),
        Phase::Refused(_) => "refused".into(),
        p @ (Phase::Cold { .. }
        | Phase::Recovering { .. }
        | Phase::Ready { .. }
        | Phase::Draining { .. }) => p.label(),
    }
}

/// One representative state per row label (the first reached), in lifecycle order of their
/// phases and then in reaching order.
pub fn representatives(config: Config) -> Vec<Machine> {
    let mut seen = HashSet::new();
    let mut reps: Vec<Machine> = reachable(config)
        .into_iter()
        .filter(|m| seen.insert(row_label(m)))
        .collect();
    // A stable sort keeps the breadth-first order within each phase.
    reps.sort_by_key(|m| m.kind());
    reps
}

/// What one event does in one state, reduced to what the table shows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Cell {
    /// Moves to the state with this label, doing these actions.
    Move(String, Vec<String>),
    /// Ignored by the spec.
    Ignored,
    /// Rejected as illegal.
    Rejected,
}

/// The table cell for `event` in state `m`.
pub fn cell(m: &Machine, event: Event) -> Cell {
    match m.step(event) {
        Ok((_, h)) if h.ignored => Cell::Ignored,
        Ok((n, h)) => Cell::Move(
            row_label(&n),
            h.actions.iter().map(|a| a.to_string()).collect(),
        ),
        Err(_) => Cell::Rejected,
    }
}

/// The whole of spec/transitions.md.
pub fn render() -> String {
    let mut out = String::new();
    out.push_str("# Transition table\n\n");
    out.push_str(
        "<!-- Rendered from `tenure::machine` by `tenure::machine::table::render()`. Do not edit:\n\
         run `TENURE_BLESS=1 cargo test --test spec` after changing a rule. -->\n\n",
    );
    out.push_str(
        "Every reachable state of the machine appears once per configuration, as its phase and \
         step. Each state lists what every event does: the next state and the actions in the \
         order the driver executes them; then the events the spec *ignores* (accepted, nothing \
         changes) and the events it *rejects* (a typed error naming phase and event). Data that \
         only changes numbers (which stop signal, which exit status) is shown for one \
         representative; a test checks that every other reachable state with the same row \
         behaves the same.\n\n",
    );
    out.push_str(
        "Events: `stop(SIG)` is a stop signal (HUP too, whatever `--hup` says: the machine \
         decides); `stray(SIG)` any other catchable signal; `timer-expired(T)` fires only for \
         a timer the machine armed; `child-exited(N)` is the main process exiting with code N \
         and nothing else of the workload left running, `main-exited(N)` the main process \
         exiting with processes of its tree left, `tree-empty` the last of those gone. Actions \
         send signals to the `main` process or to the whole `tree` of the workload.\n",
    );
    for (name, config) in profiles() {
        let _ = write!(out, "\n## {name}\n");
        let _ = writeln!(
            out,
            "\nConfiguration: grace {:?}, kill wait {:?}, readiness timeout {}, watchdog {}, busy code {}.",
            config.grace,
            config.kill_wait,
            config
                .ready_timeout
                .map_or("none".to_string(), |d| format!("{d:?}")),
            config
                .watchdog
                .map_or("none".to_string(), |d| format!("{d:?}")),
            config.busy_code
        );
        for m in representatives(config) {
            render_state(&mut out, &m);
        }
    }
    out
}

fn render_state(out: &mut String, m: &Machine) {
    let _ = write!(out, "\n### {}\n\n", row_label(m));
    let mut ignored = Vec::new();
    let mut rejected = Vec::new();
    let mut moves = Vec::new();
    for e in Event::samples() {
        match cell(m, e) {
            Cell::Move(next, actions) => moves.push((e, next, actions)),
            Cell::Ignored => ignored.push(format!("`{e}`")),
            Cell::Rejected => rejected.push(format!("`{e}`")),
        }
    }
    if moves.is_empty() {
        out.push_str("Terminal: nothing leaves this phase.\n");
    } else {
        out.push_str("| event | next | actions |\n|---|---|---|\n");
        for (e, next, actions) in moves {
            let actions = if actions.is_empty() {
                "—".to_string()
            } else {
                actions.join(", ")
            };
            let _ = writeln!(out, "| `{e}` | {next} | {actions} |");
        }
    }
    if !ignored.is_empty() {
        let _ = write!(out, "\nIgnored: {}.\n", ignored.join(", "));
    }
    if !rejected.is_empty() {
        let _ = write!(out, "\nRejected: {}.\n", rejected.join(", "));
    }
}

/// The outcomes the exit-code table lists, each with the words the spec uses for it.
pub fn exit_code_rows() -> Vec<(String, Outcome)> {
    let o = |reason| Outcome::new(reason, super::EXIT_BUSY);
    let mut rows: Vec<(String, Outcome)> = Vec::new();
    let mut exited = o(Reason::Exited);
    exited.child = Some(ChildStatus::Exited(3));
    rows.push((
        "the child exited by itself with code N (here 3): N".into(),
        exited,
    ));
    let mut sig_child = o(Reason::Exited);
    sig_child.child = Some(ChildStatus::Signaled(6));
    rows.push((
        "the child was killed by signal N by someone else (here 6): 128 + N".into(),
        sig_child,
    ));
    for s in Signal::ALL {
        let mut stopped = o(Reason::Stopped);
        stopped.signal = Some(s);
        rows.push((
            format!("orderly stop caused by {s}: 128 + {}", s.number()),
            stopped,
        ));
    }
    let mut requested = o(Reason::Stopped);
    requested.child = Some(ChildStatus::Exited(0));
    rows.push((
        "orderly stop requested by the host (in-process)".into(),
        requested,
    ));
    let mut moved = o(Reason::Stopped);
    moved.refusal = Some(Refusal::RootLost);
    rows.push((
        "stopped because the state dir was moved or replaced (H7)".into(),
        moved,
    ));
    let mut killed = o(Reason::Killed);
    killed.killed = true;
    killed.signal = Some(Signal::Term);
    rows.push((
        "the workload ignored the stop and was killed after the grace".into(),
        killed,
    ));
    let mut stuck = o(Reason::DidNotStop);
    stuck.killed = true;
    rows.push((
        "`did not stop`: a process of the workload survived SIGKILL past the kill wait".into(),
        stuck,
    ));
    for s in Signal::ALL {
        let mut c = o(Reason::Cancelled);
        c.signal = Some(s);
        rows.push((
            format!("cancelled by {s} before owning: 128 + {}", s.number()),
            c,
        ));
    }
    rows.push((
        "busy: the wait bound expired (settable, like flock's `-E`)".into(),
        o(Reason::Busy),
    ));
    let s = Signal::Term;
    let mut r = o(Reason::Refused);
    r.refusal = Some(Refusal::Signal(s));
    r.signal = Some(s);
    rows.push((
        format!("refused: {s} while recovering: 128 + {}", s.number()),
        r,
    ));
    let mut state = o(Reason::Refused);
    state.refusal = Some(Refusal::State);
    rows.push((
        "refused state: foreign, corrupt or permissive dir, invalid checkpoint".into(),
        state,
    ));
    let mut io = o(Reason::Refused);
    io.refusal = Some(Refusal::Io);
    rows.push((
        "refused: an I/O error while acquiring or recovering".into(),
        io,
    ));
    let mut rt = o(Reason::Refused);
    rt.refusal = Some(Refusal::ReadinessTimedOut);
    rows.push(("refused: readiness timed out".into(), rt));
    let mut nm = o(Reason::Refused);
    nm.refusal = Some(Refusal::NoMainPid);
    rows.push((
        "refused: a forking daemon's tree ended before its pid file named a main process".into(),
        nm,
    ));
    rows.push((
        "the ready workload missed its `WATCHDOG=1` ping and was stopped; nothing published".into(),
        o(Reason::Watchdog),
    ));
    let mut rl = o(Reason::Refused);
    rl.refusal = Some(Refusal::RootLost);
    rows.push((
        "refused: the state dir was moved while recovering".into(),
        rl,
    ));
    let mut ll = o(Reason::Refused);
    ll.refusal = Some(Refusal::LeaseLost);
    rows.push((
        "refused: the cluster lease was lost while owning (expired, or not kept alive in time); the workload was killed at once, nothing more published, nothing released".into(),
        ll,
    ));
    let mut nf = o(Reason::SpawnFailed);
    nf.exec = Some(ExecFailure::NotFound);
    rows.push(("the executable was not found (ENOENT)".into(), nf));
    let mut ne = o(Reason::SpawnFailed);
    ne.exec = Some(ExecFailure::NotExecutable);
    rows.push((
        "the executable could not be executed (EACCES, ENOEXEC)".into(),
        ne,
    ));
    rows.push((
        "the drain's checkpoint could not be published (CURRENT unchanged)".into(),
        o(Reason::PublishFailed),
    ));
    rows
}

/// The exit-code table of spec/lifecycle.md (between its `exit-codes` markers).
pub fn render_exit_codes() -> String {
    let mut by_code: BTreeMap<u8, Vec<(String, String)>> = BTreeMap::new();
    for (words, o) in exit_code_rows() {
        by_code
            .entry(o.code())
            .or_default()
            .push((words, o.summary()));
    }
    // Usage errors happen before there is a machine; the runner's argument parser uses this code.
    by_code.entry(super::EXIT_USAGE).or_default().push((
        "usage error: bad arguments or durations; nothing on disk changed".into(),
        String::new(),
    ));
    let mut out = String::from("| code | when | end record |\n|---|---|---|\n");
    for (code, rows) in by_code {
        for (words, summary) in rows {
            let record = if summary.is_empty() {
                "—".to_string()
            } else {
                format!("`{summary}`")
            };
            let _ = writeln!(out, "| {code} | {words} | {record} |");
        }
    }
    out
}

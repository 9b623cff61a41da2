//! The event log (card D6): JSONL lines appended to `.tenure/events.jsonl`, private, bounded by
//! rotation. Every line has the time, the kind, the epoch (when owning), the pid and the process
//! identity of the writer; the end of every run is one `end` line with reason, exit code and
//! signal (card R1).
//!
//! Waiters and cancelled runs write too (`waiting`, `busy`, `cancelled`), so lines are appended
//! with `O_APPEND`. Lines are gathered and written together by [`EventLog::flush`] (one `write`
//! for the lines of a burst, atomic for writes this short): the runner flushes before anything
//! that can take time or look at the log (waiting for the lease, the recovery, the spawn of the
//! workload, the wait for the child, the publish), and a dropped log flushes what it holds, so
//! a line is on file before the runner waits for anything after it. A run that ends at once
//! wrote nine lines with nine `write`s and now writes them with five (issue 11). Only the owner
//! rotates.

use crate::lease::{CONTROL_DIR, Identity, now_ms};
use crate::privfs::{Dir, StateDir};
use serde_json::{Map, Value, json};
use std::fs::File;
use std::io::Write;

/// The log file inside the control folder.
pub const LOG_FILE: &str = "events.jsonl";
/// The rotated log (one generation is kept).
pub const LOG_FILE_OLD: &str = "events.jsonl.1";
/// The size past which the owner rotates the log.
pub const ROTATE_BYTES: u64 = 1 << 20;

/// An open event log.
pub struct EventLog {
    control: Dir,
    file: File,
    pid: u32,
    identity: Option<Identity>,
    /// Lines written but not yet flushed.
    pending: Vec<u8>,
}

impl EventLog {
    /// Opens (creating) the log of `dir`, but only if the control folder exists: a run that
    /// never touched the dir must not create anything just to log (card G1).
    /// A log file that privfs refuses (a symlink, a FIFO, a permissive or foreign file) is
    /// not written, and says so in one warning line on stderr rather than silently.
    pub fn open(dir: &StateDir) -> Option<EventLog> {
        let control = dir.root().open_dir_optional(CONTROL_DIR).ok()??;
        let file = match control.open_or_create_file(LOG_FILE, "events") {
            Ok(f) => f,
            Err(e) => {
                log::warn!("{e}; the events of this run are not logged");
                return None;
            }
        };
        // `F_SETFL` changes only the status flags (`O_APPEND`, `O_NONBLOCK`, ...), so they are
        // set without asking for them first (issue 11): the log is a regular file, for which
        // `O_NONBLOCK` (opened with it, against a FIFO planted there) means nothing.
        rustix::fs::fcntl_setfl(&file, rustix::fs::OFlags::APPEND).ok()?;
        Some(EventLog {
            control,
            file,
            pid: std::process::id(),
            identity: Identity::of_self().ok(),
            pending: Vec::new(),
        })
    }

    /// Opens the log of `dir`, creating its control folder first if needed: for a run that is
    /// about to use the dir but waits elsewhere first (a cluster lease's waiter, which has no
    /// local lock yet). The local lease's waiter creates the same folder for its lock, so the
    /// `waiting` line is written in both cases. A refused folder is not written (the lease
    /// refuses it later, with the message that names the fix).
    #[cfg(feature = "etcd")]
    pub fn open_creating(dir: &StateDir) -> Option<EventLog> {
        dir.root().ensure_dir(CONTROL_DIR, "lease.control").ok()?;
        EventLog::open(dir)
    }

    /// Adds one line: `{"at_ms", "kind", "pid", "epoch"?, "identity", ...fields}`, on file at the
    /// next [`EventLog::flush`] (or when the log is dropped).
    pub fn write(&mut self, kind: &str, epoch: Option<u64>, fields: Value) {
        let mut line = Map::new();
        line.insert("at_ms".into(), json!(now_ms()));
        line.insert("kind".into(), json!(kind));
        line.insert("pid".into(), json!(self.pid));
        if let Some(e) = epoch {
            line.insert("epoch".into(), json!(e));
        }
        if let Some(id) = &self.identity {
            line.insert(
                "identity".into(),
                json!({"pid": id.pid, "start_time": id.start_time, "exe": id.exe}),
            );
        }
        if let Value::Object(extra) = fields {
            line.extend(extra);
        }
        let at = self.pending.len();
        if serde_json::to_writer(&mut self.pending, &Value::Object(line)).is_ok() {
            self.pending.push(b'\n');
        } else {
            self.pending.truncate(at);
        }
    }

    /// Appends the lines written since the last flush, in one `write`. Failures are reported on
    /// stderr and otherwise ignored: the log is evidence, not state.
    pub fn flush(&mut self) {
        if self.pending.is_empty() {
            return;
        }
        if let Err(e) = self.file.write_all(&self.pending) {
            log::warn!("cannot append to the event log: {e}");
        }
        self.pending.clear();
    }

    /// Rotates the log when it grew past [`ROTATE_BYTES`]; call only while owning.
    pub fn rotate_if_large(&mut self) {
        let Ok(st) = rustix::fs::fstat(&self.file) else {
            return;
        };
        // The lines not yet flushed count as written: they are flushed into this file first.
        if (st.st_size as u64).saturating_add(self.pending.len() as u64) < ROTATE_BYTES {
            return;
        }
        self.flush();
        if self
            .control
            .rename(LOG_FILE, LOG_FILE_OLD, "events")
            .is_err()
        {
            return;
        }
        if let Ok(f) = self.control.open_or_create_file(LOG_FILE, "events") {
            let _ = rustix::fs::fcntl_setfl(&f, rustix::fs::OFlags::APPEND);
            self.file = f;
        }
    }
}

impl Drop for EventLog {
    fn drop(&mut self) {
        self.flush();
    }
}

/// Reads the log lines of `dir` (current generation), for `status` and tests.
pub fn read(dir: &StateDir) -> Vec<Value> {
    let Ok(Some(control)) = dir.root().open_dir_optional(CONTROL_DIR) else {
        return Vec::new();
    };
    let Ok(Some(bytes)) = control.read_optional(LOG_FILE, 64 << 20) else {
        return Vec::new();
    };
    bytes
        .split(|b| *b == b'\n')
        .filter(|l| !l.is_empty())
        .filter_map(|l| serde_json::from_slice(l).ok())
        .collect()
}

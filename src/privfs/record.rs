//! The operation recorder (feature `failpoints` only): while recording, every step privfs
//! performs is appended to a process-global log, so a test can assert orderings that no fault
//! injector observes, such as "every rename is followed by an fsync of its directory".
//!
//! The log is process-global because a step may run on any thread; tests running in parallel
//! in one binary each start their own recording and take only the operations under their own
//! temp dir ([`take_recording_under`]).

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
// Test-only global; loom's `Mutex` cannot live in a static and loom never enables this feature.
use std::sync::Mutex;

use super::RecordKind;

/// The kind of a recorded step.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum OpKind {
    /// A file was created (`O_CREAT | O_EXCL`).
    Create,
    /// Bytes were written to a file.
    Write,
    /// A file was fsynced.
    Fsync,
    /// An entry was renamed into `dir/name` (`from` holds the source).
    Rename,
    /// The directory `dir` was fsynced (`name` is `.`).
    DirFsync,
    /// An entry was removed.
    Unlink,
    /// A hard link `dir/name` was made to `from`.
    Link,
    /// A directory was created.
    Mkdir,
    /// The whole filesystem was synced (`syncfs`; `dir` is the directory it was asked on).
    SyncFs,
}

/// One recorded step.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Op {
    /// What was done.
    pub kind: OpKind,
    /// The directory the step changed.
    pub dir: PathBuf,
    /// The entry inside `dir` (`.` for a directory fsync).
    pub name: String,
    /// For renames and links: the full source path.
    pub from: Option<PathBuf>,
}

/// The number of recordings in progress and the steps recorded while any was.
static LOG: Mutex<(usize, Vec<Op>)> = Mutex::new((0, Vec::new()));

fn log() -> std::sync::MutexGuard<'static, (usize, Vec<Op>)> {
    LOG.lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Starts a recording. Recordings may overlap (tests run in parallel threads): steps are kept
/// while at least one is in progress, and each test takes the steps under its own dir.
pub fn start_recording() {
    log().0 += 1;
}

/// Ends one recording and returns every step recorded while recordings were in progress
/// (including other tests' steps; prefer [`take_recording_under`]).
pub fn take_recording() -> Vec<Op> {
    let mut guard = log();
    let ops = guard.1.clone();
    end_one(&mut guard);
    ops
}

/// Ends one recording and returns (removing them from the log) the steps whose directory is
/// `root` or below it.
pub fn take_recording_under(root: &Path) -> Vec<Op> {
    let mut guard = log();
    let (mine, others): (Vec<Op>, Vec<Op>) = std::mem::take(&mut guard.1)
        .into_iter()
        .partition(|op| op.dir.starts_with(root));
    guard.1 = others;
    end_one(&mut guard);
    mine
}

fn end_one(guard: &mut (usize, Vec<Op>)) {
    guard.0 = guard.0.saturating_sub(1);
    if guard.0 == 0 {
        guard.1.clear();
    }
}

pub(super) fn push(kind: RecordKind, dir: &Path, name: &OsStr, from: Option<&Path>) {
    let mut guard = log();
    if guard.0 > 0 {
        let kind = match kind {
            RecordKind::Create => OpKind::Create,
            RecordKind::Write => OpKind::Write,
            RecordKind::Fsync => OpKind::Fsync,
            RecordKind::Rename => OpKind::Rename,
            RecordKind::DirFsync => OpKind::DirFsync,
            RecordKind::Unlink => OpKind::Unlink,
            RecordKind::Link => OpKind::Link,
            RecordKind::Mkdir => OpKind::Mkdir,
            RecordKind::SyncFs => OpKind::SyncFs,
        };
        guard.1.push(Op {
            kind,
            dir: dir.to_path_buf(),
            name: name.to_string_lossy().into_owned(),
            from: from.map(Path::to_path_buf),
        });
    }
}

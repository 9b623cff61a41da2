//! Keeping the output of a failed publish (card P1), as steps: the staging area — whatever its
//! name holds now, a directory, a symlink or a file — is renamed to `failed/<epoch>` (or
//! `failed/<epoch>.<n>` when that is taken), which needs no space and copies nothing; both
//! directories are synced, so the kept output outlives a power loss as the checkpoint would
//! have; then the oldest kept outputs beyond `keep` are removed.

use std::ffi::OsString;

use super::{Ensure, LIST_PAGE, Plan, Poll, fd_of, os};
use crate::checkpoint::error::CheckpointError;
use crate::checkpoint::store::failed_name;
use crate::checkpoint::{FAILED_DIR, STAGING_DIR};
use crate::fsop::{Done, Fd, Op, Step};
use crate::privfs::{FileKind, FsError};

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum At {
    Failed(Ensure),
    OpenStaging(Fd),
    OpenArea(Fd, Fd),
    MakeWritable(Fd, Fd, Fd),
    CloseArea(Fd, Fd, Fd),
    Rename(Fd, Fd),
    SyncFailed(Fd, Fd),
    SyncStaging(Fd, Fd),
    List(Fd),
    Page(Fd, Fd),
    CloseList(Fd, Fd),
    Stat(Fd),
    Remove(Fd, FileKind),
    Done,
}

/// Keeps the staging area `name` as the failed output of `epoch`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct KeepFailedPlan {
    root: Fd,
    name: String,
    epoch: u64,
    keep: usize,
    n: u32,
    target: String,
    at: At,
    kept: Option<String>,
    /// Every kept output found (epoch, n, name), for the pruning.
    all: Vec<((u64, u32), OsString)>,
}

impl KeepFailedPlan {
    /// Keeps staging area `name` of the store at `root`, then prunes to `keep` outputs.
    pub fn new(root: Fd, name: String, epoch: u64, keep: usize) -> KeepFailedPlan {
        KeepFailedPlan {
            root,
            name,
            epoch,
            keep,
            n: 0,
            target: epoch.to_string(),
            at: At::Failed(Ensure::new(root, FAILED_DIR)),
            kept: None,
            all: Vec::new(),
        }
    }

    /// The name the output is kept under in `failed/` (`None`: the area was gone), once
    /// [`Poll::Done`].
    pub fn kept(&self) -> Option<&str> {
        self.kept.as_deref()
    }

    fn prune_next(&mut self, failed: Fd) {
        self.all.sort();
        self.at = if self.all.len() > self.keep {
            At::Stat(failed)
        } else {
            At::Done
        };
    }
}

impl Plan for KeepFailedPlan {
    fn poll(&self) -> Poll<'_> {
        let op = match &self.at {
            At::Failed(e) => e.op(),
            At::OpenStaging(_) => Op::OpenDir {
                dir: self.root,
                name: os(STAGING_DIR),
                any_mode: false,
            },
            At::OpenArea(_, s) => Op::OpenDir {
                dir: *s,
                name: os(&self.name),
                any_mode: true,
            },
            // Moving a directory to another parent rewrites its `..`, which needs write
            // permission on it; a child may have left its output read-only.
            At::MakeWritable(_, _, a) => Op::Chmod {
                fd: *a,
                mode: 0o700,
            },
            At::CloseArea(_, _, a) => Op::Close { fd: *a },
            At::Rename(f, s) => Op::Rename {
                from_dir: *s,
                from: os(&self.name),
                to_dir: *f,
                to: os(&self.target),
                noreplace: true,
            },
            At::SyncFailed(f, _) => Op::SyncDir { dir: *f },
            At::SyncStaging(_, s) => Op::SyncDir { dir: *s },
            At::List(f) => Op::List { dir: *f },
            At::Page(_, l) => Op::ListNext {
                list: *l,
                max: LIST_PAGE,
            },
            At::CloseList(_, l) => Op::Close { fd: *l },
            At::Stat(f) => Op::Stat {
                dir: *f,
                name: &self.all[0].1,
            },
            At::Remove(f, kind) => match kind {
                FileKind::Directory => Op::RemoveTree {
                    dir: *f,
                    name: &self.all[0].1,
                },
                FileKind::Regular
                | FileKind::Symlink
                | FileKind::Fifo
                | FileKind::Socket
                | FileKind::CharDevice
                | FileKind::BlockDevice
                | FileKind::Unknown => Op::Unlink {
                    dir: *f,
                    name: &self.all[0].1,
                },
            },
            At::Done => return Poll::Done,
        };
        Poll::Op(Step::new("failed", op))
    }

    fn handle(&mut self, r: Result<Done, FsError>) -> Result<(), CheckpointError> {
        match self.at.clone() {
            At::Failed(mut e) => match e.handle(r)? {
                Some(fd) => self.at = At::OpenStaging(fd),
                None => self.at = At::Failed(e),
            },
            At::OpenStaging(f) => self.at = At::OpenArea(f, fd_of(&r?)),
            At::OpenArea(f, s) => {
                self.at = match r {
                    Ok(d) => At::MakeWritable(f, s, fd_of(&d)),
                    // Not a directory (a symlink or a file is kept as it is) or gone.
                    Err(_) => At::Rename(f, s),
                }
            }
            At::MakeWritable(f, s, a) => {
                // Best effort: the rename says whether it was needed.
                let _ = r;
                self.at = At::CloseArea(f, s, a);
            }
            At::CloseArea(f, s, _) => {
                r?;
                self.at = At::Rename(f, s);
            }
            At::Rename(f, s) => match r {
                Ok(_) => {
                    self.kept = Some(self.target.clone());
                    self.at = At::SyncFailed(f, s);
                }
                Err(FsError::AlreadyExists { .. }) => {
                    self.n += 1;
                    self.target = format!("{}.{}", self.epoch, self.n);
                }
                // The writer removed its area: nothing to keep.
                Err(FsError::NotFound { .. }) => self.at = At::Done,
                Err(e) => return Err(e.into()),
            },
            At::SyncFailed(f, s) => {
                r?;
                self.at = At::SyncStaging(f, s);
            }
            At::SyncStaging(f, _) => {
                r?;
                self.at = At::List(f);
            }
            At::List(f) => self.at = At::Page(f, fd_of(&r?)),
            At::Page(f, l) => {
                let Done::Entries(entries) = r? else {
                    panic!("a listing returns entries")
                };
                if entries.is_empty() {
                    self.at = At::CloseList(f, l);
                }
                for (name, _) in entries {
                    if let Some(key) = name.to_str().and_then(failed_name) {
                        self.all.push((key, name));
                    }
                }
            }
            At::CloseList(f, _) => {
                r?;
                self.prune_next(f);
            }
            At::Stat(f) => match r? {
                Done::Stat(Some(m)) => self.at = At::Remove(f, m.kind),
                Done::Stat(None) => {
                    self.all.remove(0);
                    self.prune_next(f);
                }
                other => panic!("a stat returns metadata, not {other:?}"),
            },
            At::Remove(f, _) => {
                match r {
                    Ok(_) | Err(FsError::NotFound { .. }) => {}
                    Err(e) => return Err(e.into()),
                }
                self.all.remove(0);
                self.prune_next(f);
            }
            At::Done => {}
        }
        Ok(())
    }
}

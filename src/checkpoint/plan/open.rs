//! The owner's open of the store, as steps: its directories opened, each created durably when
//! it is missing (the parent is synced after the `mkdir`, so nothing is put into a directory
//! whose own entry could vanish); with the sweep (the first open of an ownership), temp files
//! of a crashed publish removed from the store directory (synced if anything was removed; those
//! in `manifests/` are left to the next publish's GC, so that the run path never lists the
//! history) and the scratch trees of an earlier ownership removed: staging
//! areas (all but the parked spare, [`SPARE_STAGING`]), views and the blobs a crashed publish
//! left in `incoming/`. Nothing else is touched: `CURRENT`, manifests and blobs stay byte for
//! byte as they are.
//!
//! And the creation of a staging area ([`StagingPlan`]): the parked spare renamed into place
//! once it is checked empty, or a new directory. Scratch, so neither step is synced (power loss
//! kills the writer that would fill it).

use std::ffi::OsString;
use std::os::unix::ffi::OsStrExt;

use super::{Ensure, INCOMING_DIR, LIST_PAGE, Plan, Poll, StoreFds, fd_of, os};
use crate::checkpoint::error::CheckpointError;
use crate::checkpoint::{
    BLOBS_DIR, FAILED_DIR, MANIFESTS_DIR, SHA256_DIR, STAGING_DIR, STORE_DIR, VIEWS_DIR,
};
use crate::fsop::{Done, Fd, Op, Step};
use crate::privfs::{FileKind, FsError, TEMP_PREFIX};

/// The scratch directories the sweep empties.
const SCRATCH: [&str; 2] = [STAGING_DIR, VIEWS_DIR];

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum At {
    Root(Ensure),
    Manifests(Ensure),
    Blobs(Ensure),
    Sha256(Fd, Ensure),
    /// The temp sweep of directory `k` (0: the store, 1: manifests).
    TempList(usize),
    TempPage(usize, Fd),
    TempUnlink(usize, Fd),
    TempClose(usize, Fd),
    TempSync(usize),
    /// The sweep of scratch directory `k` of [`SCRATCH`].
    ScratchOpen(usize),
    ScratchList(usize, Fd),
    ScratchPage(usize, Fd, Fd),
    ScratchRemove(usize, Fd, Fd),
    ScratchCloseList(usize, Fd, Fd),
    ScratchClose(usize, Fd),
    Incoming,
    Done,
}

/// The owner's open of the store.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct OpenPlan {
    sweep: bool,
    /// The sweep of a store shared by the machines of a cluster: temp files only.
    temps_only: bool,
    at: At,
    root: Option<Fd>,
    manifests: Option<Fd>,
    blobs: Option<Fd>,
    page: Vec<(OsString, FileKind)>,
    page_pos: usize,
    removed: bool,
}

impl OpenPlan {
    /// The open; with `sweep`, the leftovers of a crashed owner are removed too.
    pub fn new(sweep: bool) -> OpenPlan {
        OpenPlan {
            sweep,
            temps_only: false,
            at: At::Root(Ensure::new(Fd::ROOT, STORE_DIR)),
            root: None,
            manifests: None,
            blobs: None,
            page: Vec::new(),
            page_pos: 0,
            removed: false,
        }
    }

    /// The store's directories, once [`Poll::Done`].
    pub fn output(&self) -> Option<StoreFds> {
        match (self.at == At::Done, self.root, self.manifests, self.blobs) {
            (true, Some(root), Some(manifests), Some(blobs)) => Some(StoreFds {
                root,
                manifests,
                blobs,
            }),
            _ => None,
        }
    }

    fn temp_dir(&self, k: usize) -> Fd {
        match k {
            0 => self.root,
            _ => self.manifests,
        }
        .expect("opened before the sweep")
    }

    /// The open of a store shared by the machines of a cluster (issue 14) for its owner: the
    /// sweep removes temp files of crashed publishes only, not staging areas, views or
    /// `incoming/` — they may be a paused former owner's, whose publish must be refused by the
    /// cluster's fence rather than find its output gone.
    pub fn temps_only(mut self) -> OpenPlan {
        self.temps_only = true;
        self
    }

    fn root(&self) -> Fd {
        self.root.expect("opened first")
    }

    fn after_dirs(&mut self) {
        self.at = if self.sweep {
            At::TempList(0)
        } else {
            At::Done
        };
    }

    /// After the temp sweep of the store directory: a store of its own goes on to the scratch
    /// directories and leaves `manifests/` unlisted — listing it costs as much as the history
    /// is long, so its temp files wait for the next publish's GC, which lists it anyway (a temp
    /// file is never named by anything). A shared store's sweep (no scratch, and a GC that
    /// leaves temps alone) lists `manifests/` as well.
    fn after_temps(&mut self, k: usize) {
        self.removed = false;
        self.at = match (k, self.temps_only) {
            (0, true) => At::TempList(1),
            (_, true) => At::Done,
            (_, false) => At::ScratchOpen(0),
        };
    }

    fn after_scratch(&mut self, k: usize) {
        self.at = if k + 1 < SCRATCH.len() {
            At::ScratchOpen(k + 1)
        } else {
            At::Incoming
        };
    }

    /// Skips to the next temp file of the page, or asks for the next page.
    fn next_temp(&mut self, k: usize, list: Fd) {
        while let Some((name, kind)) = self.page.get(self.page_pos) {
            if *kind == FileKind::Regular && name.as_bytes().starts_with(TEMP_PREFIX.as_bytes()) {
                self.at = At::TempUnlink(k, list);
                return;
            }
            self.page_pos += 1;
        }
        self.at = At::TempPage(k, list);
    }

    /// Skips the parked spare staging area (a directory named [`SPARE_STAGING`] in
    /// `staging/`, which [`StagingPlan`] checks before it hands it out) to the next entry of the
    /// page to remove, or asks for the next page.
    fn next_scratch(&mut self, k: usize, d: Fd, l: Fd) {
        while let Some((name, kind)) = self.page.get(self.page_pos) {
            let spare = SCRATCH[k] == STAGING_DIR
                && *kind == FileKind::Directory
                && name.as_bytes() == SPARE_STAGING.as_bytes();
            if !spare {
                self.at = At::ScratchRemove(k, d, l);
                return;
            }
            self.page_pos += 1;
        }
        self.at = At::ScratchPage(k, d, l);
    }

    fn take_page(&mut self, r: Result<Done, FsError>) -> Result<bool, CheckpointError> {
        let Done::Entries(entries) = r? else {
            panic!("a listing returns entries")
        };
        self.page = entries;
        self.page_pos = 0;
        Ok(!self.page.is_empty())
    }
}

impl Plan for OpenPlan {
    fn poll(&self) -> Poll<'_> {
        let label = "open";
        let sweep = "open.sweep";
        let (label, op) = match &self.at {
            At::Root(e) | At::Manifests(e) | At::Blobs(e) | At::Sha256(_, e) => (label, e.op()),
            At::TempList(k) => (
                sweep,
                Op::List {
                    dir: self.temp_dir(*k),
                },
            ),
            At::TempPage(_, l) | At::ScratchPage(_, _, l) => (
                sweep,
                Op::ListNext {
                    list: *l,
                    max: LIST_PAGE,
                },
            ),
            At::TempUnlink(k, _) => (
                sweep,
                Op::Unlink {
                    dir: self.temp_dir(*k),
                    name: &self.page[self.page_pos].0,
                },
            ),
            At::TempClose(_, fd) | At::ScratchCloseList(_, _, fd) | At::ScratchClose(_, fd) => {
                (sweep, Op::Close { fd: *fd })
            }
            At::TempSync(k) => (
                sweep,
                Op::SyncDir {
                    dir: self.temp_dir(*k),
                },
            ),
            At::ScratchOpen(k) => (
                sweep,
                Op::OpenDir {
                    dir: self.root(),
                    name: os(SCRATCH[*k]),
                    any_mode: false,
                },
            ),
            At::ScratchList(_, d) => (sweep, Op::List { dir: *d }),
            At::ScratchRemove(_, d, _) => {
                let (name, kind) = &self.page[self.page_pos];
                // Everything in these directories is scratch of an earlier ownership: staging
                // areas and views, and whatever a child left beside its area (a `rename into
                // place` temp dir, a symlink). None of it was published, and none of it is
                // ever followed: links are removed, not resolved.
                let op = match kind {
                    FileKind::Directory => Op::RemoveTree { dir: *d, name },
                    FileKind::Regular
                    | FileKind::Symlink
                    | FileKind::Fifo
                    | FileKind::Socket
                    | FileKind::CharDevice
                    | FileKind::BlockDevice
                    | FileKind::Unknown => Op::Unlink { dir: *d, name },
                };
                (sweep, op)
            }
            At::Incoming => (
                sweep,
                Op::RemoveTree {
                    dir: self.root(),
                    name: os(INCOMING_DIR),
                },
            ),
            At::Done => return Poll::Done,
        };
        Poll::Op(Step::new(label, op))
    }

    fn handle(&mut self, r: Result<Done, FsError>) -> Result<(), CheckpointError> {
        match self.at.clone() {
            At::Root(mut e) => match e.handle(r)? {
                Some(fd) => {
                    self.root = Some(fd);
                    self.at = At::Manifests(Ensure::new(fd, MANIFESTS_DIR));
                }
                None => self.at = At::Root(e),
            },
            At::Manifests(mut e) => match e.handle(r)? {
                Some(fd) => {
                    self.manifests = Some(fd);
                    self.at = At::Blobs(Ensure::new(self.root(), BLOBS_DIR));
                }
                None => self.at = At::Manifests(e),
            },
            At::Blobs(mut e) => match e.handle(r)? {
                Some(fd) => self.at = At::Sha256(fd, Ensure::new(fd, SHA256_DIR)),
                None => self.at = At::Blobs(e),
            },
            At::Sha256(parent, mut e) => match e.handle(r)? {
                Some(fd) => {
                    self.blobs = Some(fd);
                    // The `blobs/` handle itself is no longer needed.
                    self.at = At::ScratchClose(usize::MAX, parent);
                }
                None => self.at = At::Sha256(parent, e),
            },
            At::TempList(k) => self.at = At::TempPage(k, fd_of(&r?)),
            At::TempPage(k, l) => {
                if self.take_page(r)? {
                    self.next_temp(k, l);
                } else {
                    self.at = At::TempClose(k, l);
                }
            }
            At::TempUnlink(k, l) => {
                match r {
                    Ok(_) | Err(FsError::NotFound { .. }) => self.removed = true,
                    Err(e) => return Err(e.into()),
                }
                self.page_pos += 1;
                self.next_temp(k, l);
            }
            At::TempClose(k, _) => {
                r?;
                if self.removed {
                    self.at = At::TempSync(k);
                } else {
                    self.after_temps(k);
                }
            }
            At::TempSync(k) => {
                r?;
                self.after_temps(k);
            }
            At::ScratchOpen(k) => match r {
                Ok(d) => self.at = At::ScratchList(k, fd_of(&d)),
                Err(FsError::NotFound { .. }) => self.after_scratch(k),
                Err(e) => return Err(e.into()),
            },
            At::ScratchList(k, d) => self.at = At::ScratchPage(k, d, fd_of(&r?)),
            At::ScratchPage(k, d, l) => {
                if self.take_page(r)? {
                    self.next_scratch(k, d, l);
                } else {
                    self.at = At::ScratchCloseList(k, d, l);
                }
            }
            At::ScratchRemove(k, d, l) => {
                match r {
                    Ok(_) | Err(FsError::NotFound { .. }) => {}
                    Err(e) => return Err(e.into()),
                }
                self.page_pos += 1;
                self.next_scratch(k, d, l);
            }
            At::ScratchCloseList(k, d, _) => {
                r?;
                self.at = At::ScratchClose(k, d);
            }
            At::ScratchClose(k, _) => {
                r?;
                if k == usize::MAX {
                    self.after_dirs();
                } else {
                    self.after_scratch(k);
                }
            }
            At::Incoming => {
                r?;
                self.at = At::Done;
            }
            At::Done => {}
        }
        Ok(())
    }
}

/// The name, inside `staging/`, of the one empty staging area kept between ownerships (issue
/// 11): a clean release parks its empty area under this name instead of removing it, and the
/// next [`StagingPlan`] renames it to the new area's name instead of making a directory. On a
/// filesystem mounted `discard` removing a directory waits for the device (0.3–1.9 ms on the
/// reference VM: `mkdir` allocates the block that `rmdir` then discards); a rename within one
/// directory allocates and frees nothing. The owned open's sweep leaves a directory of this
/// name alone (no random name starts with a dot); [`StagingPlan`] checks that it is an empty
/// private directory of ours before it hands it out, and removes it otherwise, so a previous
/// ownership's leftovers are never a writer's output.
pub const SPARE_STAGING: &str = ".spare";

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum StagingAt {
    Failed(Ensure),
    CloseFailed(Fd),
    Staging(Ensure),
    /// `staging/.spare` renamed to the new name.
    Adopt(Fd),
    /// The adopted directory opened (checked: a directory of ours, private) ...
    AdoptOpen(Fd),
    /// ... listed ...
    AdoptList(Fd, Fd),
    /// ... its first entry read (none: empty) ...
    AdoptPage(Fd, Fd, Fd),
    /// ... and its handles closed (staging, area, listing); `true` when it was empty.
    AdoptCloseList(Fd, Fd, Fd, bool),
    AdoptClose(Fd, Fd, bool),
    /// What was adopted is not an empty private directory of ours: it is removed (a file or a
    /// link is unlinked) and a new area made, so that nothing a previous ownership left is ever
    /// handed to a writer as its own output.
    Discard(Fd, bool),
    Mkdir(Fd),
    Close(Fd),
    Done,
}

/// Creates the staging area `name` (chosen by the caller, at random in production): an empty
/// private directory under `staging/`, the parked [`SPARE_STAGING`] renamed into place when
/// there is one (and checked empty), else a new directory. The directory that keeps the
/// outputs of failed publishes is made now too, so that keeping one never needs a new
/// directory on a full disk.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct StagingPlan {
    root: Fd,
    name: String,
    at: StagingAt,
}

impl StagingPlan {
    /// The staging area `name` in the store whose directory is `root`.
    pub fn new(root: Fd, name: String) -> StagingPlan {
        StagingPlan {
            root,
            name,
            at: StagingAt::Failed(Ensure::new(root, FAILED_DIR)),
        }
    }
}

impl Plan for StagingPlan {
    fn poll(&self) -> Poll<'_> {
        let name = os(&self.name);
        let op = match &self.at {
            StagingAt::Failed(e) | StagingAt::Staging(e) => e.op(),
            StagingAt::Adopt(d) => Op::Rename {
                from_dir: *d,
                from: os(SPARE_STAGING),
                to_dir: *d,
                to: name,
                noreplace: true,
            },
            StagingAt::AdoptOpen(d) => Op::OpenDir {
                dir: *d,
                name,
                any_mode: false,
            },
            StagingAt::AdoptList(_, a) => Op::List { dir: *a },
            StagingAt::AdoptPage(_, _, l) => Op::ListNext { list: *l, max: 1 },
            StagingAt::Discard(d, true) => Op::RemoveTree { dir: *d, name },
            StagingAt::Discard(d, false) => Op::Unlink { dir: *d, name },
            StagingAt::Mkdir(d) => Op::Mkdir { dir: *d, name },
            StagingAt::AdoptCloseList(_, _, fd, _)
            | StagingAt::AdoptClose(_, fd, _)
            | StagingAt::Close(fd)
            | StagingAt::CloseFailed(fd) => Op::Close { fd: *fd },
            StagingAt::Done => return Poll::Done,
        };
        Poll::Op(Step::new("staging", op))
    }

    fn handle(&mut self, r: Result<Done, FsError>) -> Result<(), CheckpointError> {
        match self.at.clone() {
            StagingAt::Failed(mut e) => match e.handle(r)? {
                Some(fd) => self.at = StagingAt::CloseFailed(fd),
                None => self.at = StagingAt::Failed(e),
            },
            StagingAt::CloseFailed(_) => {
                r?;
                self.at = StagingAt::Staging(Ensure::new(self.root, STAGING_DIR));
            }
            StagingAt::Staging(mut e) => match e.handle(r)? {
                Some(fd) => self.at = StagingAt::Adopt(fd),
                None => self.at = StagingAt::Staging(e),
            },
            StagingAt::Adopt(d) => match r {
                Ok(_) => self.at = StagingAt::AdoptOpen(d),
                // No spare (the first run, or the last one did not end cleanly).
                Err(FsError::NotFound { .. }) => self.at = StagingAt::Mkdir(d),
                Err(e) => return Err(e.into()),
            },
            StagingAt::AdoptOpen(d) => match r {
                Ok(a) => self.at = StagingAt::AdoptList(d, fd_of(&a)),
                // A link or a file was parked there by someone else: unlinked, never followed.
                Err(FsError::Symlink { .. } | FsError::NotDirectory { .. }) => {
                    self.at = StagingAt::Discard(d, false);
                }
                // A directory that is not private (or not ours: the removal refuses it).
                Err(FsError::Permissive { .. } | FsError::NotOwned { .. }) => {
                    self.at = StagingAt::Discard(d, true);
                }
                Err(e) => return Err(e.into()),
            },
            StagingAt::AdoptList(d, a) => self.at = StagingAt::AdoptPage(d, a, fd_of(&r?)),
            StagingAt::AdoptPage(d, a, l) => {
                let Done::Entries(entries) = r? else {
                    panic!("a listing returns entries")
                };
                self.at = StagingAt::AdoptCloseList(d, a, l, entries.is_empty());
            }
            StagingAt::AdoptCloseList(d, a, _, empty) => {
                r?;
                self.at = StagingAt::AdoptClose(d, a, empty);
            }
            StagingAt::AdoptClose(d, _, empty) => {
                r?;
                self.at = if empty {
                    StagingAt::Close(d)
                } else {
                    StagingAt::Discard(d, true)
                };
            }
            StagingAt::Discard(d, _) => {
                r?;
                self.at = StagingAt::Mkdir(d);
            }
            StagingAt::Mkdir(d) => {
                r?;
                self.at = StagingAt::Close(d);
            }
            StagingAt::Close(_) => {
                r?;
                self.at = StagingAt::Done;
            }
            StagingAt::Done => {}
        }
        Ok(())
    }
}

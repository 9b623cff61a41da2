//! The real executor of the lease plans ([`super::plan`]): files through `privfs` (descriptor-
//! relative, checked, with crash points and the operation recorder), the lock through
//! [`super::lock`] (the only module that calls `flock`), processes through identity-checked
//! pidfds, cgroups through cgroupfs.
//!
//! The executor owns what the plans must not: the descriptors of the state dir and its
//! folders, of the temp files a plan wrote and has not renamed yet, of the lock file, and the
//! ownership's cgroup. A [`super::Lease`] keeps its [`Io`] and runs its later plans (phases,
//! registration, release) through it.

use std::ffi::OsStr;
use std::fs::File;
use std::io;
use std::os::fd::BorrowedFd;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use super::cgroup::{self, Cgroup};
use super::identity::{Identity, Liveness, SignalOutcome, signal_owner};
use super::lock::{self, CloseWatch, LockGuard};
use super::plan::{Exec, Loc, LockTry, Op, Res};
use super::{CONTROL_DIR, Contention, LEFTOVERS_WAIT, LOCK_FILE, LeaseError};
use crate::privfs::{Dir, FsError, StateDir};

/// How long a try-once acquisition pauses before its second and last try: a `status` probe
/// holds a shared lock for microseconds, and one short retry keeps it from turning into a
/// spurious `busy`.
const TRY_SETTLE: Duration = Duration::from_micros(200);

/// The descriptors a lease's plans work on.
#[derive(Debug)]
pub(crate) struct Io {
    state: StateDir,
    /// Opened folders, by [`Loc::index`] (the root is `state` itself).
    dirs: [Option<Dir>; 6],
    /// Temp files written and not yet renamed or removed.
    temps: Vec<(Loc, String, File)>,
    /// The lock file, opened and not (yet) locked.
    lock_file: Option<File>,
    /// The held lock.
    pub(crate) guard: Option<LockGuard>,
    /// The ownership's cgroup, once made.
    pub(crate) cgroup: Option<Cgroup>,
}

impl Io {
    /// The executor's state for `state`.
    pub(crate) fn new(state: StateDir) -> Io {
        Io {
            state,
            dirs: [None, None, None, None, None, None],
            temps: Vec::new(),
            lock_file: None,
            guard: None,
            cgroup: None,
        }
    }

    /// The state dir.
    pub(crate) fn state(&self) -> &StateDir {
        &self.state
    }

    /// Opens `loc` (and its parents) if it exists; `Ok(false)` when it does not.
    fn open(&mut self, loc: Loc) -> Result<bool, FsError> {
        if loc == Loc::Root || self.dirs[loc.index()].is_some() {
            return Ok(true);
        }
        let (parent, name) = loc.parent().expect("only the state dir has no parent");
        if !self.open(parent)? {
            return Ok(false);
        }
        let d = self
            .get(parent)
            .expect("opened just now")
            .open_dir_optional(name)?;
        let found = d.is_some();
        self.dirs[loc.index()] = d;
        Ok(found)
    }

    fn get(&self, loc: Loc) -> Option<&Dir> {
        match loc {
            Loc::Root => Some(self.state.root()),
            _ => self.dirs[loc.index()].as_ref(),
        }
    }

    /// `loc`, which must exist.
    fn need(&mut self, loc: Loc) -> Result<&Dir, FsError> {
        if !self.open(loc)? {
            return Err(FsError::NotFound {
                path: loc.path(self.state.path()),
            });
        }
        Ok(self.get(loc).expect("opened just now"))
    }

    fn take_temp(&mut self, loc: Loc, name: &str) -> Option<File> {
        let i = self
            .temps
            .iter()
            .position(|(l, n, _)| *l == loc && n == name)?;
        Some(self.temps.swap_remove(i).2)
    }

    fn lock_path(&self) -> PathBuf {
        self.state.path().join(CONTROL_DIR).join(LOCK_FILE)
    }

    /// The file operations, shared by every plan.
    fn file_op(&mut self, op: Op) -> Result<Res, FsError> {
        Ok(match op {
            Op::StillAtPath => Res::Flag(self.state.is_still_at_path()?),
            Op::List(loc) => {
                if !self.open(loc)? {
                    return Ok(Res::Listed(None));
                }
                let entries = self.get(loc).expect("opened").entries()?;
                Res::Listed(Some(
                    entries
                        .into_iter()
                        .map(|e| (e.name.to_string_lossy().into_owned(), e.kind))
                        .collect(),
                ))
            }
            Op::Read { dir, name, max } => {
                if !self.open(dir)? {
                    return Ok(Res::Bytes(None));
                }
                Res::Bytes(self.get(dir).expect("opened").read_optional(&name, max)?)
            }
            Op::Mkdir { dir, label } => {
                let (parent, name) = dir.parent().expect("the state dir exists");
                let created = self.need(parent)?.make_dir(name, label)?;
                self.dirs[dir.index()] = None;
                Res::Made(created)
            }
            Op::WriteTemp { dir, bytes, label } => {
                let d = self.need(dir)?;
                let mut tmp = d.create_temp(label)?;
                tmp.write_all(&bytes)?;
                let (name, file) = tmp.into_parts();
                let name = name.to_string_lossy().into_owned();
                self.temps.push((dir, name.clone(), file));
                Res::Temp(name)
            }
            Op::Fsync { dir, name, label } => {
                let file = self.take_temp(dir, &name);
                let d = self.need(dir)?;
                match &file {
                    Some(f) => crate::privfs::fsync_file(d, OsStr::new(&name), f, label)?,
                    // Not a file this executor wrote: open it to sync it.
                    None => {
                        let f = d.open_file(&name)?;
                        crate::privfs::fsync_file(d, OsStr::new(&name), &f, label)?;
                    }
                }
                if let Some(f) = file {
                    self.temps.push((dir, name, f));
                }
                Res::Done
            }
            Op::Rename {
                dir,
                from,
                to,
                noreplace,
                label,
            } => {
                let d = self.need(dir)?;
                d.rename_to(&from, d, &to, label, noreplace)?;
                drop(self.take_temp(dir, &from));
                Res::Done
            }
            Op::SyncDir { dir, label } => {
                self.need(dir)?.sync(label)?;
                Res::Done
            }
            Op::Unlink { dir, name, label } => {
                drop(self.take_temp(dir, &name));
                self.need(dir)?.unlink(&name, label)?;
                Res::Done
            }
            Op::CheckpointEpoch => Res::Seen(crate::checkpoint::highest_epoch(&self.state)),
            other => unreachable!("{other:?} is not a file operation"),
        })
    }
}

/// What one plan run needs besides the descriptors: the caller's cancel descriptor and wait
/// bound, its contention callback, and how long to wait for an orphan to die.
pub(crate) struct Real<'a> {
    pub(crate) io: &'a mut Io,
    pub(crate) cancel: Option<BorrowedFd<'a>>,
    pub(crate) deadline: Option<Instant>,
    pub(crate) on_wait: Option<&'a mut dyn FnMut(&Contention)>,
    pub(crate) orphan_bound: Duration,
}

impl<'a> Real<'a> {
    /// An executor for plans that neither wait nor stop orphans.
    pub(crate) fn plain(io: &'a mut Io) -> Real<'a> {
        Real {
            io,
            cancel: None,
            deadline: None,
            on_wait: None,
            orphan_bound: Duration::ZERO,
        }
    }

    fn lock_err(&self, source: io::Error) -> LeaseError {
        LeaseError::Lock {
            path: self.io.lock_path(),
            source,
        }
    }

    fn wait_err(&self, source: io::Error) -> LeaseError {
        LeaseError::Wait {
            path: self.io.lock_path(),
            source,
        }
    }

    /// The lock was just taken on the lock file: hold it as a guard. The crash point
    /// `lease.locked` lies between taking the lock and anything written under it (tests hold
    /// an owner there, `gate`, to show what `stop` and `status` see of an owner that starts).
    fn locked(&mut self, file: File) -> Result<(), LeaseError> {
        let guard = LockGuard::new(file, self.io.lock_path());
        if let Err(e) = crate::failpoint::hit("lease.locked") {
            drop(guard);
            return Err(self.lock_err(e));
        }
        self.io.guard = Some(guard);
        Ok(())
    }

    fn try_lock(&mut self) -> Result<LockTry, LeaseError> {
        let file = self
            .io
            .lock_file
            .take()
            .ok_or_else(|| self.lock_err(io::Error::other("the lock file is not open")))?;
        if lock::try_lock(&file).map_err(|e| self.lock_err(e))? {
            self.locked(file)?;
            return Ok(LockTry::Locked);
        }
        let may_wait = self.deadline.is_none_or(|d| d > Instant::now());
        if !may_wait {
            std::thread::sleep(TRY_SETTLE);
            if lock::try_lock(&file).map_err(|e| self.lock_err(e))? {
                self.locked(file)?;
                return Ok(LockTry::Locked);
            }
        }
        self.io.lock_file = Some(file);
        Ok(LockTry::Busy { may_wait })
    }

    fn wait(&mut self) -> Result<lock::WaitEnd, LeaseError> {
        let file = self
            .io
            .lock_file
            .take()
            .ok_or_else(|| self.lock_err(io::Error::other("the lock file is not open")))?;
        let path = self.io.lock_path();
        let watch = CloseWatch::new(&file, &path).map_err(|e| self.wait_err(e))?;
        let end =
            lock::wait(&file, &watch, self.deadline, self.cancel).map_err(|e| self.wait_err(e))?;
        match end {
            lock::WaitEnd::Acquired => self.locked(file)?,
            lock::WaitEnd::Expired | lock::WaitEnd::Cancelled => self.io.lock_file = Some(file),
        }
        Ok(end)
    }

    fn execute_inner(&mut self, op: Op) -> Result<Res, LeaseError> {
        Ok(match op {
            Op::Cancelled => {
                Res::Flag(lock::is_cancelled(self.cancel).map_err(|e| self.wait_err(e))?)
            }
            Op::OpenLock => {
                let file = self
                    .io
                    .need(Loc::Control)?
                    .open_or_create_file(LOCK_FILE, "lease.lock")?;
                self.io.lock_file = Some(file);
                Res::Done
            }
            Op::TryLock => Res::Lock(self.try_lock()?),
            Op::Wait => Res::Waited(self.wait()?),
            Op::Unlock => {
                self.io.lock_file = None;
                if let Some(g) = self.io.guard.take() {
                    g.unlock().map_err(|e| self.lock_err(e))?;
                }
                Res::Done
            }
            Op::Contended(owner) => {
                if let Some(f) = self.on_wait.as_mut() {
                    f(&Contention {
                        dir: self.io.state.path().to_path_buf(),
                        owner: owner.map(|o| *o),
                    });
                }
                Res::Done
            }
            Op::Liveness(id) => Res::Live(id.liveness()),
            Op::PidLiveness { pid, start } => Res::Live(match Identity::of_pid(pid) {
                Ok(now) if now.start_time == start => Liveness::Live,
                Ok(_) => Liveness::Recycled,
                Err(_) => Liveness::Dead,
            }),
            Op::Kill(id) => Res::Flag(matches!(
                signal_owner(&id, rustix::process::Signal::KILL),
                Ok(SignalOutcome::Delivered)
            )),
            Op::AwaitGone(id) => {
                let deadline = Instant::now() + self.orphan_bound;
                let mut gone = true;
                while id.liveness() == Liveness::Live {
                    if Instant::now() >= deadline {
                        gone = false;
                        break;
                    }
                    std::thread::sleep(Duration::from_millis(2));
                }
                Res::Flag(gone)
            }
            Op::EndCgroup {
                rec,
                root_id,
                epoch,
            } => Res::Ended(cgroup::end_recorded(
                &rec,
                &root_id.to_string(),
                epoch,
                LEFTOVERS_WAIT,
            )?),
            Op::CreateCgroup { name } => Res::Cgroup(match Cgroup::create(&name) {
                Ok(cg) => {
                    let rec = cg.record();
                    self.io.cgroup = Some(cg);
                    Ok(rec)
                }
                Err(e) => Err(e.to_string()),
            }),
            Op::RemoveCgroup => {
                if let Some(cg) = self.io.cgroup.take() {
                    let _ = cg.remove();
                }
                Res::Done
            }
            file_op @ (Op::StillAtPath
            | Op::List(_)
            | Op::Read { .. }
            | Op::Mkdir { .. }
            | Op::WriteTemp { .. }
            | Op::Fsync { .. }
            | Op::Rename { .. }
            | Op::SyncDir { .. }
            | Op::Unlink { .. }
            | Op::CheckpointEpoch) => self.io.file_op(file_op)?,
        })
    }
}

impl Exec for Real<'_> {
    fn execute(&mut self, op: Op) -> Res {
        match self.execute_inner(op) {
            Ok(r) => r,
            Err(e) => Res::Failed(e),
        }
    }
}

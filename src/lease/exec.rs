//! The real executor of the lease plans ([`super::plan`]): file operations through
//! [`crate::privfs::Exec`] (the executor every protocol of tenure shares: descriptor-relative,
//! checked, with crash points and the operation recorder), the lock through [`super::lock`]
//! (the only module that calls `flock`), processes through identity-checked pidfds, cgroups
//! through cgroupfs.
//!
//! What the plans must not own lives here: the lock file and the held lock, the ownership's
//! cgroup ([`LockIo`], kept by a [`super::Lease`] across its plans), the caller's cancel
//! descriptor, wait bound and contention callback.

use std::fs::File;
use std::io;
use std::os::fd::BorrowedFd;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::cgroup::{self, Cgroup};
use super::identity::{Identity, Liveness, SignalOutcome, signal_owner};
use super::lock::{self, CloseWatch, LockGuard};
use super::plan::{Exec, LeaseOp, LeaseRes, LockTry};
use super::{CONTROL_DIR, Contention, LEFTOVERS_WAIT, LOCK_FILE, LeaseError};
use crate::fsop::{Done, Executor, Op, Step};
use crate::privfs::{Dir, FsError, StateDir};

/// How long a try-once acquisition pauses before its second and last try: a `status` probe
/// holds a shared lock for microseconds, and one short retry keeps it from turning into a
/// spurious `busy`.
const TRY_SETTLE: Duration = Duration::from_micros(200);

/// The lock and the cgroup of one (prospective) ownership.
#[derive(Debug, Default)]
pub(crate) struct LockIo {
    /// The lock file, opened and not (yet) locked.
    lock_file: Option<File>,
    /// The held lock.
    pub(crate) guard: Option<LockGuard>,
    /// The ownership's cgroup, once made.
    pub(crate) cgroup: Option<Cgroup>,
    /// The close watch of a wait that ended with the lock, kept until the lease ends: handing
    /// it to its closer thread wakes that thread, which is not to happen between the wake-up
    /// and the grant (the handoff, issue 11).
    watch: Option<CloseWatch>,
    /// The directories of the control folder the plans opened while the lock was held, by
    /// path: the ownership's later plans (phase changes, registrations, the release) get a
    /// duplicate descriptor instead of opening and checking them again (issue 11). Nobody else
    /// changes the control folder's directories while the lock is held; dropped at the unlock.
    opened: Vec<(PathBuf, Arc<Dir>)>,
}

/// Runs lease plans on the real system.
pub(crate) struct Real<'a> {
    state: &'a StateDir,
    fs: crate::privfs::Exec<'a>,
    lock: &'a mut LockIo,
    /// The caller's cancel descriptor (its readability ends a wait).
    pub(crate) cancel: Option<BorrowedFd<'a>>,
    /// The wait bound (`None`: forever).
    pub(crate) deadline: Option<Instant>,
    /// Told when the lease is found held and the caller is about to wait.
    pub(crate) on_wait: Option<&'a mut dyn FnMut(&Contention)>,
    /// How long to wait for an orphan to be gone after SIGKILL.
    pub(crate) orphan_bound: Duration,
}

impl<'a> Real<'a> {
    /// An executor for `state` holding (or about to hold) the lock in `lock`.
    pub(crate) fn new(state: &'a StateDir, lock: &'a mut LockIo) -> Real<'a> {
        Real {
            state,
            fs: crate::privfs::Exec::new(state.root()),
            lock,
            cancel: None,
            deadline: None,
            on_wait: None,
            orphan_bound: Duration::ZERO,
        }
    }

    fn lock_path(&self) -> PathBuf {
        self.state.path().join(CONTROL_DIR).join(LOCK_FILE)
    }

    fn lock_err(&self, source: io::Error) -> LeaseError {
        LeaseError::Lock {
            path: self.lock_path(),
            source,
        }
    }

    fn wait_err(&self, source: io::Error) -> LeaseError {
        LeaseError::Wait {
            path: self.lock_path(),
            source,
        }
    }

    /// The lock was just taken on the lock file: hold it as a guard. The crash point
    /// `lease.locked` lies between taking the lock and anything written under it (tests hold
    /// an owner there, `gate`, to show what `stop` and `status` see of an owner that starts).
    fn locked(&mut self, file: File) -> Result<(), LeaseError> {
        let guard = LockGuard::new(file, self.lock_path());
        if let Err(e) = crate::failpoint::hit("lease.locked") {
            drop(guard);
            return Err(self.lock_err(e));
        }
        self.lock.guard = Some(guard);
        Ok(())
    }

    fn lock_file(&mut self) -> Result<File, LeaseError> {
        self.lock
            .lock_file
            .take()
            .ok_or_else(|| self.lock_err(io::Error::other("the lock file is not open")))
    }

    fn try_lock(&mut self) -> Result<LockTry, LeaseError> {
        let file = self.lock_file()?;
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
        self.lock.lock_file = Some(file);
        Ok(LockTry::Busy { may_wait })
    }

    fn wait(&mut self) -> Result<lock::WaitEnd, LeaseError> {
        let file = self.lock_file()?;
        let path = self.lock_path();
        // The watch is registered before the wait's first try, so a release in between still
        // leaves an event (see `lock`).
        let watch = CloseWatch::new(&file, &path).map_err(|e| self.wait_err(e))?;
        let end =
            lock::wait(&file, &watch, self.deadline, self.cancel).map_err(|e| self.wait_err(e))?;
        match end {
            lock::WaitEnd::Acquired => {
                self.locked(file)?;
                self.lock.watch = Some(watch);
            }
            lock::WaitEnd::Expired | lock::WaitEnd::Cancelled => self.lock.lock_file = Some(file),
        }
        Ok(end)
    }

    /// A file step; a directory the lock holder opened before is handed out again (see
    /// [`LockIo::opened`]).
    fn file(&mut self, step: Step<'_>) -> Result<Done, FsError> {
        let Op::OpenDir {
            dir,
            name,
            any_mode: false,
        } = step.op
        else {
            return self.fs.run(step);
        };
        if self.lock.guard.is_none() {
            return self.fs.run(step);
        }
        let path = self.fs.dir_path(dir).join(name);
        if let Some((_, d)) = self.lock.opened.iter().find(|(p, _)| *p == path) {
            // The same descriptor, shared: no `dup` now and no `close` when the plan is done.
            let fd = self.fs.share_dir(Arc::clone(d));
            return Ok(Done::Opened { fd, size: 0 });
        }
        let done = self.fs.run(step)?;
        if let Done::Opened { fd, .. } = &done
            && let Some(d) = self.fs.share(*fd)
        {
            self.lock.opened.push((path, d));
        }
        Ok(done)
    }

    fn execute_inner(&mut self, op: LeaseOp<'_>) -> Result<LeaseRes, LeaseError> {
        Ok(match op {
            LeaseOp::File(step) => LeaseRes::File(self.file(step)),
            LeaseOp::Cancelled => {
                LeaseRes::Flag(lock::is_cancelled(self.cancel).map_err(|e| self.wait_err(e))?)
            }
            LeaseOp::StillAtPath => LeaseRes::Flag(self.state.is_still_at_path()?),
            LeaseOp::OpenLock { dir } => {
                let file = self
                    .fs
                    .dir(dir)?
                    .open_or_create_file(LOCK_FILE, "lease.lock")?;
                self.lock.lock_file = Some(file);
                LeaseRes::Done
            }
            LeaseOp::TryLock => LeaseRes::Lock(self.try_lock()?),
            LeaseOp::Wait => LeaseRes::Waited(self.wait()?),
            LeaseOp::Unlock => {
                self.lock.opened.clear();
                self.lock.lock_file = None;
                if let Some(g) = self.lock.guard.take() {
                    g.unlock().map_err(|e| self.lock_err(e))?;
                }
                LeaseRes::Done
            }
            LeaseOp::Contended(owner) => {
                let dir = self.state.path().to_path_buf();
                if let Some(f) = self.on_wait.as_mut() {
                    f(&Contention {
                        dir,
                        owner: owner.cloned(),
                    });
                }
                LeaseRes::Done
            }
            LeaseOp::Liveness(id) => LeaseRes::Live(id.liveness()),
            LeaseOp::PidLiveness { pid, start } => LeaseRes::Live(match Identity::of_pid(pid) {
                Ok(now) if now.start_time == start => Liveness::Live,
                Ok(_) => Liveness::Recycled,
                Err(_) => Liveness::Dead,
            }),
            LeaseOp::Kill(id) => LeaseRes::Flag(matches!(
                signal_owner(id, rustix::process::Signal::KILL),
                Ok(SignalOutcome::Delivered)
            )),
            LeaseOp::AwaitGone(id) => {
                let deadline = Instant::now() + self.orphan_bound;
                let mut gone = true;
                while id.liveness() == Liveness::Live {
                    if Instant::now() >= deadline {
                        gone = false;
                        break;
                    }
                    std::thread::sleep(Duration::from_millis(2));
                }
                LeaseRes::Flag(gone)
            }
            LeaseOp::EndCgroup {
                rec,
                root_id,
                epoch,
            } => LeaseRes::Ended(cgroup::end_recorded(
                rec,
                &root_id.to_string(),
                epoch,
                LEFTOVERS_WAIT,
            )?),
            LeaseOp::CreateCgroup { name } => LeaseRes::Cgroup(match Cgroup::create(name) {
                Ok(cg) => {
                    let rec = cg.record();
                    self.lock.cgroup = Some(cg);
                    Ok(rec)
                }
                Err(e) => Err(e.to_string()),
            }),
            LeaseOp::RemoveCgroup => {
                if let Some(cg) = self.lock.cgroup.take() {
                    let _ = cg.remove();
                }
                LeaseRes::Done
            }
            LeaseOp::CheckpointEpoch => {
                LeaseRes::Seen(crate::checkpoint::highest_epoch(self.state))
            }
        })
    }
}

impl Exec for Real<'_> {
    fn execute(&mut self, op: LeaseOp<'_>) -> LeaseRes {
        match self.execute_inner(op) {
            Ok(r) => r,
            Err(e) => LeaseRes::Failed(e),
        }
    }
}

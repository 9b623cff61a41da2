//! The workload as a process tree, seen from the runner (card T1): the main process plus every
//! descendant, however it detached.
//!
//! Two mechanisms find the tree, and both are used when both are available:
//! - **The subreaper.** The runner sets `PR_SET_CHILD_SUBREAPER`, so a process whose parent dies
//!   is reparented to the runner, not to init: every descendant stays a descendant, backgrounded,
//!   `setsid` or double forked. While the runner lives the tree is exactly "the runner's
//!   descendants", found by scanning `/proc` (the kernel here has no `/proc/PID/task/*/children`),
//!   and it is empty exactly when the runner has no child left (`waitid` says `ECHILD`). The
//!   runner reaps the orphans it adopts (SIGCHLD wakes it).
//! - **The cgroup** ([`crate::lease::cgroup`]), where one could be made: its `cgroup.procs` lists
//!   the tree without racing forks, `cgroup.kill` ends it at once, `populated 0` says it is gone,
//!   and it outlives the runner for a successor to end.
//!
//! Signals to the tree go through pidfds opened for each listed process and re-checked against
//! the start time read when it was listed, so a pid that was recycled in between is never
//! signalled. The main process is signalled by the caller, through the pidfd it holds.

use crate::lease::cgroup::{Cgroup, CgroupError};
use rustix::process::{Pid, PidfdFlags, Signal, WaitId, WaitIdOptions, WaitOptions};
use std::collections::{BTreeMap, BTreeSet};
use std::io;
use std::os::fd::BorrowedFd;

/// One line of the process table: pid, parent, state letter, start time (field 22).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct ProcInfo {
    pid: u32,
    ppid: u32,
    state: char,
    start: u64,
}

fn parse_stat(stat: &str) -> Option<ProcInfo> {
    let open = stat.find('(')?;
    let close = stat.rfind(')')?;
    let pid = stat[..open].trim().parse().ok()?;
    let mut rest = stat[close + 1..].split_ascii_whitespace();
    let state = rest.next()?.chars().next()?;
    let ppid = rest.next()?.parse().ok()?;
    // Fields 5..=21 come next; the start time is field 22.
    let start = rest.nth(22 - 5)?.parse().ok()?;
    Some(ProcInfo {
        pid,
        ppid,
        state,
        start,
    })
}

fn proc_info(pid: u32) -> Option<ProcInfo> {
    parse_stat(&std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?)
}

/// Every process the kernel shows, from `/proc/[0-9]*/stat`.
fn process_table() -> Vec<ProcInfo> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(|e| {
        let name = e.ok()?.file_name();
        let pid: u32 = name.to_str()?.parse().ok()?;
        proc_info(pid)
    })
    .collect()
}

fn gone(state: char) -> bool {
    matches!(state, 'Z' | 'X' | 'x')
}

/// Makes the calling process a child subreaper: orphaned descendants are reparented to it.
pub fn become_subreaper() -> io::Result<()> {
    Ok(rustix::process::set_child_subreaper(Some(
        rustix::process::getpid(),
    ))?)
}

/// The runner's view of its workload's tree.
pub struct Tree {
    me: u32,
    cgroup: Option<Cgroup>,
    /// Processes other than the main one that were sent a stop signal or SIGKILL, by
    /// (pid, start time): the descendants the end record counts as stopped.
    stopped: BTreeSet<(u32, u64)>,
}

impl Tree {
    /// The tree of the calling process's descendants, contained by `cgroup` when there is one.
    pub fn new(cgroup: Option<Cgroup>) -> Tree {
        Tree {
            me: std::process::id(),
            cgroup,
            stopped: BTreeSet::new(),
        }
    }

    /// The cgroup, when the tree has one.
    pub fn cgroup(&self) -> Option<&Cgroup> {
        self.cgroup.as_ref()
    }

    /// `cgroup.events`, for `poll(POLLPRI)`: wakes when the cgroup empties.
    pub fn events_fd(&self) -> Option<BorrowedFd<'_>> {
        self.cgroup.as_ref().map(Cgroup::events_fd)
    }

    /// The live processes of the workload other than `main`, with their start times: the
    /// runner's descendants (by the process table) and the cgroup's members.
    pub fn members(&self, main: Option<u32>) -> BTreeMap<u32, u64> {
        let table = process_table();
        let mut children: BTreeMap<u32, Vec<&ProcInfo>> = BTreeMap::new();
        for p in &table {
            children.entry(p.ppid).or_default().push(p);
        }
        let mut out = BTreeMap::new();
        let mut queue = vec![self.me];
        while let Some(parent) = queue.pop() {
            for p in children.get(&parent).map(Vec::as_slice).unwrap_or(&[]) {
                queue.push(p.pid);
                if !gone(p.state) && Some(p.pid) != main {
                    out.insert(p.pid, p.start);
                }
            }
        }
        if let Some(cg) = &self.cgroup
            && let Ok(pids) = cg.procs()
        {
            for pid in pids {
                if Some(pid) != main
                    && pid != self.me
                    && let Some(p) = proc_info(pid)
                    && !gone(p.state)
                {
                    out.insert(pid, p.start);
                }
            }
        }
        out
    }

    /// Sends `sig` to every live process of the workload except `main` (which the caller
    /// signals through its own pidfd), each once. With `stop`, the processes signalled count as
    /// stopped descendants (a stop signal or SIGKILL; not a relayed signal). Returns how many
    /// were signalled.
    pub fn signal(&mut self, sig: Signal, main: Option<u32>, stop: bool) -> usize {
        let mut sent: BTreeSet<(u32, u64)> = BTreeSet::new();
        // A second pass catches processes forked by the ones signalled in the first.
        for _ in 0..2 {
            let mut new = 0;
            for (pid, start) in self.members(main) {
                if sent.contains(&(pid, start)) {
                    continue;
                }
                if signal_checked(pid, start, sig) {
                    sent.insert((pid, start));
                    new += 1;
                }
            }
            if new == 0 {
                break;
            }
        }
        if stop {
            self.stopped.extend(sent.iter().copied());
        }
        sent.len()
    }

    /// SIGKILLs every process of the workload except `main`: `cgroup.kill` where there is a
    /// cgroup (it reaches the main process too, which is harmless: the caller kills it anyway),
    /// and each descendant through a pidfd.
    pub fn kill(&mut self, main: Option<u32>) -> usize {
        let listed = self.members(main);
        if let Some(cg) = &self.cgroup
            && let Err(e) = cg.kill()
        {
            log::warn!("{e}");
        }
        for (pid, start) in &listed {
            self.stopped.insert((*pid, *start));
        }
        self.signal(Signal::KILL, main, true);
        listed.len()
    }

    /// How many descendants (not the main process) were sent a stop signal or SIGKILL.
    pub fn stopped(&self) -> usize {
        self.stopped.len()
    }

    /// Reaps the runner's exited children other than `main` (orphans it adopted as subreaper).
    /// `main` is the main process while it has not been reaped: its status is read through its
    /// pidfd, never taken here.
    pub fn reap(&self, main: Option<u32>) {
        match main {
            None => {
                // No unreaped main process: any exited child is an orphan.
                while let Ok(Some(_)) = rustix::process::wait(WaitOptions::NOHANG) {}
            }
            Some(main) => {
                for p in process_table() {
                    if p.ppid == self.me
                        && p.pid != main
                        && gone(p.state)
                        && let Some(pid) = Pid::from_raw(p.pid as i32)
                    {
                        let _ = rustix::process::waitpid(Some(pid), WaitOptions::NOHANG);
                    }
                }
            }
        }
    }

    /// Whether nothing of the workload remains, once the main process was reaped: the runner
    /// has no child left, and the cgroup (if any) is not populated. Reaps what it can first.
    pub fn is_empty(&self) -> Result<bool, CgroupError> {
        self.reap(None);
        let no_children = matches!(
            rustix::process::waitid(
                WaitId::All,
                WaitIdOptions::EXITED | WaitIdOptions::NOHANG | WaitIdOptions::NOWAIT
            ),
            Err(rustix::io::Errno::CHILD)
        );
        let unpopulated = match &self.cgroup {
            Some(cg) => !cg.populated()?,
            None => true,
        };
        Ok(no_children && unpopulated)
    }

    /// Removes the (empty) cgroup at release.
    pub fn remove_cgroup(&self) {
        if let Some(cg) = &self.cgroup
            && let Err(e) = cg.remove()
        {
            log::warn!("{e}");
        }
    }
}

/// Opens a pidfd for `pid`, checks that it is still the process listed with start time `start`
/// and not a zombie, and sends `sig` through the pidfd. A recycled or exited pid is skipped.
fn signal_checked(pid: u32, start: u64, sig: Signal) -> bool {
    let Some(p) = Pid::from_raw(pid as i32) else {
        return false;
    };
    let Ok(fd) = rustix::process::pidfd_open(p, PidfdFlags::empty()) else {
        return false;
    };
    match proc_info(pid) {
        Some(now) if now.start == start && !gone(now.state) => {}
        _ => return false,
    }
    rustix::process::pidfd_send_signal(&fd, sig).is_ok()
}

/// The parent of `pid`, if `pid` is a live (not zombie) process.
pub fn parent_of(pid: u32) -> Option<u32> {
    proc_info(pid).filter(|p| !gone(p.state)).map(|p| p.ppid)
}

/// Whether `pid` is a descendant of `ancestor`, by walking up its parents. `pid` itself may
/// have exited and await reaping (a notify sender that is done); its ancestors must be alive.
pub fn is_descendant(pid: u32, ancestor: u32) -> bool {
    let Some(mut at) = proc_info(pid).map(|p| p.ppid) else {
        return false;
    };
    // Bounded: a chain of parents cannot be longer than the number of processes.
    for _ in 0..4096 {
        if at == ancestor {
            return true;
        }
        match parent_of(at) {
            Some(p) if at > 1 => at = p,
            _ => return false,
        }
    }
    false
}

/// The processes that hold the `flock` on the file at `path` through a descriptor they
/// inherited — a lock some other process took (the owner whose workload kept the shared lock
/// descriptor) — from `/proc/*/fd` and the lock lines of `/proc/*/fdinfo`. The process that
/// took a lock itself (an owner, a successor) is not listed, and neither are processes that
/// merely have the file open (waiters, a `status` probe). Only what this user may inspect is
/// seen.
pub fn inherited_lock_holders(path: &std::path::Path) -> Vec<u32> {
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for e in procs.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
            continue;
        };
        let holds = fds.flatten().any(|fd| {
            std::fs::read_link(fd.path()).is_ok_and(|target| target == path)
                && std::fs::read_to_string(format!(
                    "/proc/{pid}/fdinfo/{}",
                    fd.file_name().to_string_lossy()
                ))
                .is_ok_and(|info| flock_taken_by(&info).is_some_and(|locker| locker != pid))
        });
        if holds {
            out.push(pid);
        }
    }
    out.sort_unstable();
    out
}

/// The pid a `flock` line of an fdinfo names: the process that took the lock (0 once it is
/// gone).
fn flock_taken_by(fdinfo: &str) -> Option<u32> {
    fdinfo.lines().find_map(|l| {
        let t: Vec<&str> = l.split_whitespace().collect();
        // `lock:  1: FLOCK  ADVISORY  WRITE 2643 00:2a:1234 0 EOF`
        (t.first() == Some(&"lock:") && t.get(2) == Some(&"FLOCK"))
            .then(|| t.get(5)?.parse::<i64>().ok())
            .flatten()
            .map(|p| p.max(0) as u32)
    })
}

/// SIGKILLs the processes that hold the lock on `path` through an inherited descriptor (a
/// killed owner's workload that kept the shared lock descriptor; never a process that took the
/// lock itself, such as a successor), each through a pidfd opened before its hold is checked
/// again, so a recycled pid is never signalled. Returns the pids killed.
pub fn kill_lock_holders(path: &std::path::Path) -> Vec<u32> {
    signal_lock_holders(path, Signal::KILL)
}

/// Sends `sig` to the processes that hold the lock on `path` through an inherited descriptor,
/// as [`kill_lock_holders`] does SIGKILL (the same pidfd check, so a recycled pid is never
/// signalled). Returns the pids signalled.
pub fn signal_lock_holders(path: &std::path::Path, sig: Signal) -> Vec<u32> {
    let mut killed = Vec::new();
    for pid in inherited_lock_holders(path) {
        let Some(p) = Pid::from_raw(pid as i32) else {
            continue;
        };
        let Ok(fd) = rustix::process::pidfd_open(p, PidfdFlags::empty()) else {
            continue;
        };
        // The pidfd pins the process; if it still holds the lock, it is the one listed.
        if inherited_lock_holders(path).contains(&pid)
            && rustix::process::pidfd_send_signal(&fd, sig).is_ok()
        {
            killed.push(pid);
        }
    }
    killed
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_lines_parse_past_odd_command_names() {
        let line =
            "4242 (a (b) c) S 1 4242 4242 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 987654 1 2";
        let p = parse_stat(line).unwrap();
        assert_eq!((p.pid, p.ppid, p.state, p.start), (4242, 1, 'S', 987_654));
    }

    #[test]
    fn flock_lines_name_the_locker() {
        let info =
            "pos:\t0\nflags:\t02100002\nlock:\t1: FLOCK  ADVISORY  WRITE 2643 00:2a:1234 0 EOF\n";
        assert_eq!(flock_taken_by(info), Some(2643));
        assert_eq!(flock_taken_by("pos:\t0\n"), None);
        let posix = "lock:\t1: POSIX  ADVISORY  WRITE 7 00:2a:1234 0 EOF\n";
        assert_eq!(flock_taken_by(posix), None);
    }

    #[test]
    fn own_stat_parses() {
        let me = proc_info(std::process::id()).unwrap();
        assert_eq!(me.pid, std::process::id());
        assert!(!gone(me.state));
    }
}

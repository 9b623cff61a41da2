//! One cgroup (v2) per ownership, where the kernel lets us make one: the workload's process tree
//! is contained by the kernel, not by bookkeeping (cards T1, T2).
//!
//! The cgroup is created under the runner's own cgroup (as root, or inside a subtree delegated by
//! systemd's `Delegate=yes`), named `tenure-<dir root id>-<epoch>` so that it carries the state
//! dir's identity and the ownership's epoch, and recorded in the owner record with its inode
//! number (cgroupfs inode numbers are cgroup ids, never reused while the system runs). The child
//! is moved into it before it execs, so everything it starts — backgrounded, `setsid`, double
//! forked — is born inside. `cgroup.events` says `populated 0` once no process is left (and is
//! pollable: the kernel wakes `POLLPRI` when it changes); `cgroup.kill` SIGKILLs every process in
//! it at once, forks in flight included.
//!
//! A successor (after the runner was SIGKILLed) ends the recorded cgroup before it starts a
//! workload of its own, and only if the cgroup still carries the recorded identity: a cgroupfs
//! directory at the recorded path, with the recorded name and inode. See [`end_recorded`].
//!
//! Nothing here enables controllers: membership, `cgroup.events`, `cgroup.kill` and
//! `cgroup.procs` exist in every cgroup, so a cgroup with processes (the runner's own) may have
//! children without breaking the "no internal processes" rule.

use std::fs::File;
use std::io::{self, Read};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use rustix::fs::{Mode, OFlags};
use serde::{Deserialize, Serialize};

/// `CGROUP2_SUPER_MAGIC`: the filesystem type of a cgroup v2 hierarchy.
const CGROUP2_MAGIC: u64 = 0x6367_7270;

/// The prefix of every cgroup tenure creates.
pub const CGROUP_PREFIX: &str = "tenure-";

/// The cgroup of an ownership, as the owner record names it.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct CgroupRecord {
    /// The cgroup's directory in the cgroup v2 hierarchy (absolute, e.g.
    /// `/sys/fs/cgroup/system.slice/x.service/tenure-<root id>-3`).
    pub path: PathBuf,
    /// Its inode number on cgroupfs (the cgroup id).
    pub id: u64,
}

/// Why no cgroup could be had, or an operation on one failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CgroupError {
    /// No cgroup v2 hierarchy is mounted, or this process's cgroup is not in it.
    #[error("no cgroup v2 hierarchy is mounted (hybrid or v1-only host); {0}")]
    NoHierarchy(&'static str),
    /// The cgroup directory could not be created or opened (no permission, read-only, ...).
    #[error(
        "cannot create the cgroup {path}: {source}; run as root or inside a delegated subtree (systemd `Delegate=yes`), or pass `--cgroup off`"
    )]
    Create {
        /// The cgroup's path.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// A file of the cgroup could not be read or written.
    #[error("cannot use {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: io::Error,
    },
}

fn io_err(path: &Path) -> impl Fn(rustix::io::Errno) -> CgroupError + '_ {
    move |e| CgroupError::Io {
        path: path.to_path_buf(),
        source: e.into(),
    }
}

/// Where the cgroup v2 hierarchy is mounted on a systemd host: `/sys/fs/cgroup` on a pure v2
/// host, `/sys/fs/cgroup/unified` on a hybrid one.
const WELL_KNOWN_MOUNTS: [&str; 2] = ["/sys/fs/cgroup", "/sys/fs/cgroup/unified"];

/// The mount point of the cgroup v2 hierarchy: one of the well-known mount points when `statfs`
/// says it is a cgroup v2 filesystem (one system call: the kernel renders
/// `/proc/self/mountinfo` anew for every reader, a visible part of `tenure run -- true`,
/// issue 11), else the first `cgroup2` mount of `/proc/self/mountinfo`.
pub fn unified_mount() -> Option<PathBuf> {
    WELL_KNOWN_MOUNTS
        .into_iter()
        .find(|p| rustix::fs::statfs(*p).is_ok_and(|s| s.f_type as u64 == CGROUP2_MAGIC))
        .map(PathBuf::from)
        .or_else(mountinfo_cgroup2)
}

/// Reads a small file of `/proc` whole with one `read` (the identity's reader).
fn read_proc(path: impl AsRef<Path>) -> Option<String> {
    super::identity::read_small(path.as_ref()).ok()
}

/// The first `cgroup2` mount point of `/proc/self/mountinfo`.
fn mountinfo_cgroup2() -> Option<PathBuf> {
    let text = read_proc("/proc/self/mountinfo")?;
    text.lines().find_map(|line| {
        let (pre, post) = line.split_once(" - ")?;
        if post.split(' ').next()? != "cgroup2" {
            return None;
        }
        Some(PathBuf::from(unescape_mount(pre.split(' ').nth(4)?)))
    })
}

/// Mount points in mountinfo escape space, tab, newline and backslash as octal (`\040`).
fn unescape_mount(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\'
            && i + 3 < b.len()
            && let Ok(v) = u8::from_str_radix(&s[i + 1..i + 4], 8)
        {
            out.push(v);
            i += 4;
            continue;
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The cgroup v2 path of process `pid` (the `0::` line of `/proc/PID/cgroup`), e.g.
/// `/system.slice/x.service`.
pub fn cgroup_of(pid: u32) -> Option<PathBuf> {
    let text = read_proc(format!("/proc/{pid}/cgroup"))?;
    text.lines()
        .find_map(|l| l.strip_prefix("0::"))
        .map(PathBuf::from)
}

/// The name of the cgroup of an ownership: it carries the dir's identity and the epoch.
pub fn cgroup_name(root_id: &str, epoch: u64) -> String {
    format!("{CGROUP_PREFIX}{root_id}-{epoch}")
}

/// Opens `path` as a directory without following a final symlink.
fn open_dir(path: &Path) -> rustix::io::Result<OwnedFd> {
    rustix::fs::open(
        path,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )
}

fn is_cgroup2(fd: BorrowedFd<'_>) -> bool {
    rustix::fs::fstatfs(fd).is_ok_and(|s| s.f_type as u64 == CGROUP2_MAGIC)
}

/// A cgroup this process created for its workload.
#[derive(Debug)]
pub struct Cgroup {
    path: PathBuf,
    /// The path as `/proc/PID/cgroup` shows it (relative to the hierarchy's root).
    rel: PathBuf,
    id: u64,
    dir: OwnedFd,
    events: File,
    procs: OwnedFd,
}

impl Cgroup {
    /// Creates the cgroup `name` under this process's own cgroup. A leftover of the same name
    /// is reused only when it is empty (the epoch is never handed out twice, so it can only be
    /// this ownership's own, from an attempt that failed after `mkdir`).
    pub fn create(name: &str) -> Result<Cgroup, CgroupError> {
        let mount = unified_mount().ok_or(CgroupError::NoHierarchy(
            "containment falls back to the subreaper and the inherited lock",
        ))?;
        let own = cgroup_of(std::process::id()).ok_or(CgroupError::NoHierarchy(
            "this process has no cgroup v2 path",
        ))?;
        let parent = mount.join(own.strip_prefix("/").unwrap_or(&own));
        let path = parent.join(name);
        let create = |source: io::Error| CgroupError::Create {
            path: path.clone(),
            source,
        };
        let existed = match rustix::fs::mkdir(&path, Mode::from_raw_mode(0o755)) {
            Ok(()) => false,
            Err(rustix::io::Errno::EXIST) => true,
            Err(e) => return Err(create(e.into())),
        };
        let dir = open_dir(&path).map_err(|e| create(e.into()))?;
        if !is_cgroup2(dir.as_fd()) {
            return Err(create(io::Error::other("not a cgroup v2 directory")));
        }
        let id = rustix::fs::fstat(&dir)
            .map_err(|e| create(e.into()))?
            .st_ino;
        let events = rustix::fs::openat(
            &dir,
            "cgroup.events",
            OFlags::RDONLY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| create(e.into()))?;
        let procs = rustix::fs::openat(
            &dir,
            "cgroup.procs",
            OFlags::WRONLY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| create(e.into()))?;
        let cg = Cgroup {
            path: path.clone(),
            rel: own.join(name),
            id,
            dir,
            events: File::from(events),
            procs,
        };
        // A cgroup this call made is empty; one that was there already may not be.
        if existed && cg.populated()? {
            return Err(create(io::Error::other(
                "a cgroup of this name exists and has processes",
            )));
        }
        Ok(cg)
    }

    /// What the owner record says about it.
    pub fn record(&self) -> CgroupRecord {
        CgroupRecord {
            path: self.path.clone(),
            id: self.id,
        }
    }

    /// Its path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Whether process `pid` is in this cgroup or one below it (the workload may make its own).
    pub fn contains(&self, pid: u32) -> bool {
        cgroup_of(pid).is_some_and(|c| c.starts_with(&self.rel))
    }

    /// The cgroup's directory, for `clone3(CLONE_INTO_CGROUP)`.
    pub fn dir_fd(&self) -> BorrowedFd<'_> {
        self.dir.as_fd()
    }

    /// `cgroup.procs`, open for writing: a child writes `0` to it before it execs to enter.
    pub fn procs_fd(&self) -> BorrowedFd<'_> {
        self.procs.as_fd()
    }

    /// `cgroup.events`: `poll` it for `POLLPRI`; the kernel wakes it when `populated` changes.
    pub fn events_fd(&self) -> BorrowedFd<'_> {
        self.events.as_fd()
    }

    /// Whether any process is in the cgroup (zombies are not).
    pub fn populated(&self) -> Result<bool, CgroupError> {
        let path = self.path.join("cgroup.events");
        let mut buf = [0u8; 256];
        let n = rustix::io::pread(&self.events, &mut buf, 0).map_err(io_err(&path))?;
        Ok(parse_populated(&buf[..n]))
    }

    /// The processes in the cgroup now.
    pub fn procs(&self) -> Result<Vec<u32>, CgroupError> {
        read_procs(self.dir.as_fd(), &self.path)
    }

    /// SIGKILLs every process in the cgroup (`cgroup.kill`, Linux ≥ 5.14; before that, each
    /// listed process, repeated until a pass finds none, so forks in flight are caught).
    pub fn kill(&self) -> Result<(), CgroupError> {
        kill_all(self.dir.as_fd(), &self.path)
    }

    /// Removes the (empty) cgroup.
    pub fn remove(&self) -> Result<(), CgroupError> {
        rustix::fs::rmdir(&self.path).map_err(io_err(&self.path))
    }
}

fn parse_populated(events: &[u8]) -> bool {
    String::from_utf8_lossy(events)
        .lines()
        .any(|l| l.trim() == "populated 1")
}

fn read_procs(dir: BorrowedFd<'_>, path: &Path) -> Result<Vec<u32>, CgroupError> {
    let procs = path.join("cgroup.procs");
    let fd = rustix::fs::openat(
        dir,
        "cgroup.procs",
        OFlags::RDONLY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(io_err(&procs))?;
    let mut text = String::new();
    File::from(fd)
        .read_to_string(&mut text)
        .map_err(|source| CgroupError::Io {
            path: procs.clone(),
            source,
        })?;
    Ok(text.lines().filter_map(|l| l.trim().parse().ok()).collect())
}

fn kill_all(dir: BorrowedFd<'_>, path: &Path) -> Result<(), CgroupError> {
    let kill = rustix::fs::openat(
        dir,
        "cgroup.kill",
        OFlags::WRONLY | OFlags::CLOEXEC,
        Mode::empty(),
    );
    match kill {
        Ok(fd) => {
            rustix::io::write(&fd, b"1").map_err(io_err(&path.join("cgroup.kill")))?;
            Ok(())
        }
        Err(rustix::io::Errno::NOENT) => {
            // An older kernel: kill what is listed until nothing new shows up. Processes in a
            // cgroup cannot leave it by themselves, so each pass can only find fewer or forks.
            for _ in 0..64 {
                let pids = read_procs(dir, path)?;
                if pids.is_empty() {
                    break;
                }
                for pid in pids {
                    if let Some(p) = rustix::process::Pid::from_raw(pid as i32)
                        && let Ok(fd) =
                            rustix::process::pidfd_open(p, rustix::process::PidfdFlags::empty())
                    {
                        let _ =
                            rustix::process::pidfd_send_signal(&fd, rustix::process::Signal::KILL);
                    }
                }
            }
            Ok(())
        }
        Err(e) => Err(io_err(&path.join("cgroup.kill"))(e)),
    }
}

/// The processes in the recorded cgroup, if the directory at the recorded path is still that
/// cgroup (same inode, on cgroupfs); `None` when it is gone or is another one. Read-only.
pub fn recorded_members(rec: &CgroupRecord) -> Option<Vec<u32>> {
    let dir = open_dir(&rec.path).ok()?;
    let id = rustix::fs::fstat(&dir).ok()?.st_ino;
    if !is_cgroup2(dir.as_fd()) || id != rec.id {
        return None;
    }
    read_procs(dir.as_fd(), &rec.path).ok()
}

/// Sends `sig` to each process in the recorded cgroup, if the directory at the recorded path is
/// still that cgroup (as [`recorded_members`] checks), through a pidfd opened before its
/// membership is read again, so a recycled pid is never signalled. Returns the pids signalled.
pub fn signal_recorded(rec: &CgroupRecord, sig: rustix::process::Signal) -> Vec<u32> {
    let mut sent = Vec::new();
    for pid in recorded_members(rec).unwrap_or_default() {
        let Some(p) = rustix::process::Pid::from_raw(pid as i32) else {
            continue;
        };
        let Ok(fd) = rustix::process::pidfd_open(p, rustix::process::PidfdFlags::empty()) else {
            continue;
        };
        // The pidfd pins the process; if it is still a member, it is the one listed.
        if recorded_members(rec).is_some_and(|m| m.contains(&pid))
            && rustix::process::pidfd_send_signal(&fd, sig).is_ok()
        {
            sent.push(pid);
        }
    }
    sent
}

/// What [`end_recorded`] found and did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EndedCgroup {
    /// No cgroup is at the recorded path (it was removed: it was empty), or the directory there
    /// is not the recorded one (another name or id): nothing was touched.
    Gone,
    /// The recorded cgroup was ended: these processes were SIGKILLed, it is empty and removed.
    Ended {
        /// The processes that were in it.
        killed: Vec<u32>,
    },
    /// Processes of the recorded cgroup survived SIGKILL past the bound.
    Survived {
        /// The processes still in it.
        pids: Vec<u32>,
    },
}

/// Whether `e` says the cgroup was removed under an open descriptor of it (ENODEV from a file
/// of a removed cgroup, ENOENT for a name in a removed directory).
fn removed(e: &CgroupError) -> bool {
    let CgroupError::Io { source, .. } = e else {
        return false;
    };
    [rustix::io::Errno::NODEV, rustix::io::Errno::NOENT]
        .iter()
        .any(|n| source.raw_os_error() == Some(n.raw_os_error()))
}

/// A crashed owner's workload may outlive it (card T2): ends the cgroup the owner record names,
/// if the directory there still carries the recorded identity — on cgroupfs, under the v2
/// mount, named `tenure-<root_id>-<epoch>` and with the recorded inode — by SIGKILLing it and
/// waiting up to `bound` until it is empty, then removes it.
pub fn end_recorded(
    rec: &CgroupRecord,
    root_id: &str,
    epoch: u64,
    bound: Duration,
) -> Result<EndedCgroup, CgroupError> {
    let expected = cgroup_name(root_id, epoch);
    if rec.path.file_name().and_then(|n| n.to_str()) != Some(expected.as_str()) {
        return Ok(EndedCgroup::Gone);
    }
    // Under the v2 mount [`unified_mount`] finds, or under the one mountinfo names first (where
    // an older tenure looked, should the two differ).
    if let Some(mount) = unified_mount()
        && !rec.path.starts_with(&mount)
        && !mountinfo_cgroup2().is_some_and(|m| rec.path.starts_with(m))
    {
        return Ok(EndedCgroup::Gone);
    }
    let dir = match open_dir(&rec.path) {
        Ok(d) => d,
        Err(rustix::io::Errno::NOENT | rustix::io::Errno::NOTDIR | rustix::io::Errno::LOOP) => {
            return Ok(EndedCgroup::Gone);
        }
        Err(e) => return Err(io_err(&rec.path)(e)),
    };
    let id = rustix::fs::fstat(&dir).map_err(io_err(&rec.path))?.st_ino;
    if !is_cgroup2(dir.as_fd()) || id != rec.id {
        return Ok(EndedCgroup::Gone);
    }
    let events_path = rec.path.join("cgroup.events");
    let events = rustix::fs::openat(
        &dir,
        "cgroup.events",
        OFlags::RDONLY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(io_err(&events_path))?;
    // Tests hold a `tenure stop` here while the owner removes its cgroup.
    let _ = crate::failpoint::hit("cgroup.end.opened");
    // Its owner may still be alive and remove the emptied cgroup while this looks at it (a
    // `tenure stop` racing the owner's own release): cgroupfs then answers ENODEV, or ENOENT
    // for a name in it. A removed cgroup is an empty one (`rmdir` succeeds on no other), so
    // that is the end, not an error.
    let populated = || -> Result<bool, CgroupError> {
        let mut buf = [0u8; 256];
        match rustix::io::pread(&events, &mut buf, 0) {
            Ok(n) => Ok(parse_populated(&buf[..n])),
            Err(rustix::io::Errno::NODEV) => Ok(false),
            Err(e) => Err(io_err(&events_path)(e)),
        }
    };
    let killed = match read_procs(dir.as_fd(), &rec.path) {
        Err(e) if removed(&e) => Vec::new(),
        r => r?,
    };
    if populated()? {
        match kill_all(dir.as_fd(), &rec.path) {
            Err(e) if removed(&e) => {}
            r => r?,
        }
    }
    let deadline = Instant::now() + bound;
    while populated()? {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Ok(EndedCgroup::Survived {
                pids: read_procs(dir.as_fd(), &rec.path)?,
            });
        }
        // The kernel wakes POLLPRI when `populated` changes; the timeout bounds a missed wake.
        let mut fds = [rustix::event::PollFd::new(
            &events,
            rustix::event::PollFlags::PRI,
        )];
        let step = left.min(Duration::from_millis(100));
        let ts = rustix::time::Timespec {
            tv_sec: step.as_secs() as i64,
            tv_nsec: i64::from(step.subsec_nanos()),
        };
        let _ = rustix::event::poll(&mut fds, Some(&ts));
    }
    match rustix::fs::rmdir(&rec.path) {
        Ok(()) | Err(rustix::io::Errno::NOENT) => {}
        // Emptied but busy for an instant, or a sub-cgroup the workload made: the next owner
        // finds it empty and tries again; nothing of the workload runs.
        Err(_) => {}
    }
    Ok(EndedCgroup::Ended { killed })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn populated_is_read_from_cgroup_events() {
        assert!(parse_populated(b"populated 1\nfrozen 0\n"));
        assert!(!parse_populated(b"populated 0\nfrozen 0\n"));
        assert!(!parse_populated(b""));
    }

    #[test]
    fn mount_points_are_unescaped() {
        assert_eq!(unescape_mount(r"/a\040b"), "/a b");
        assert_eq!(unescape_mount("/sys/fs/cgroup"), "/sys/fs/cgroup");
    }

    /// The well-known mount [`unified_mount`] finds with one `statfs` is a `cgroup2` mount that
    /// mountinfo lists (on a host with a v2 hierarchy; elsewhere both find none), and
    /// `/proc/self/cgroup` is read whole.
    #[test]
    fn the_fast_mount_is_a_cgroup2_mount_of_mountinfo() {
        let all: Vec<String> = read_proc("/proc/self/mountinfo")
            .expect("mountinfo")
            .lines()
            .filter_map(|l| {
                let (pre, post) = l.split_once(" - ")?;
                if post.split(' ').next()? != "cgroup2" {
                    return None;
                }
                Some(unescape_mount(pre.split(' ').nth(4)?))
            })
            .collect();
        match unified_mount() {
            Some(m) => assert!(
                all.iter().any(|a| Path::new(a) == m),
                "{m:?} not in {all:?}"
            ),
            None => assert!(all.is_empty(), "{all:?}"),
        }
        let own = read_proc("/proc/self/cgroup").expect("/proc/self/cgroup");
        assert_eq!(own, std::fs::read_to_string("/proc/self/cgroup").unwrap());
    }

    #[test]
    fn names_carry_identity_and_epoch() {
        assert_eq!(cgroup_name("ab12", 7), "tenure-ab12-7");
    }
}

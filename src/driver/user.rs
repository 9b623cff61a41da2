//! Running the workload as another user (`tenure run --user USER[:GROUP]`).
//!
//! The runner stays root and keeps the state dir private to itself (0700, owned by the runner:
//! card L9); only the child drops to the user, after it entered its cgroup and before it
//! execs (`driver::child`). The user cannot reach anything inside the state dir by path, so the
//! two directories that are the child's — its staging area (`TENURE_CHECKPOINT_OUT`) and its
//! read-only copy of the checkpoint (`TENURE_CHECKPOINT`) — are handed to it as directory
//! descriptors it inherits, named `/proc/self/fd/N`: the kernel resolves that link to the
//! directory itself, without a search of the private directories above it. Both are owned by
//! the user while the workload runs; the staging area is taken back (owned by the runner
//! again, entry by entry, never following a link) before it is published, so the store checks
//! it exactly as it checks the output of a child that ran as the runner.

use std::ffi::{CStr, CString, OsString};
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::path::Path;

use rustix::fs::{AtFlags, Mode, OFlags};

/// How deep [`chown_tree`] descends: the deepest tree a checkpoint may hold
/// ([`crate::checkpoint::Limits::DEFAULT`]); what lies deeper is refused by the publish anyway.
const MAX_DEPTH: usize = crate::checkpoint::Limits::DEFAULT.max_depth;

/// Why `--user` cannot be honoured.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum UserError {
    /// Only root can start a process as another user.
    #[error(
        "running the child as another user needs root, and the runner runs as uid {euid}; start tenure as root or drop --user"
    )]
    NotRoot {
        /// The runner's effective uid.
        euid: u32,
    },
    /// No such user.
    #[error("no user {0:?} in the user database (see `getent passwd {0}`)")]
    NoUser(String),
    /// No such group.
    #[error("no group {0:?} in the group database (see `getent group {0}`)")]
    NoGroup(String),
    /// A numeric uid without a user entry has no primary group to fall back on.
    #[error(
        "uid {0} has no entry in the user database, so it has no primary group: name one, e.g. --user {0}:{0}"
    )]
    NoPrimaryGroup(u32),
    /// The user or group database could not be read.
    #[error("cannot read the user database: {0}")]
    Lookup(#[source] io::Error),
}

/// The identity the child runs as: uid, primary gid and supplementary groups, resolved once
/// before anything on disk changes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunAs {
    /// The user's name as given, or from the user database for a numeric uid.
    pub name: String,
    /// The uid.
    pub uid: u32,
    /// The primary gid.
    pub gid: u32,
    /// Supplementary groups (the user's groups in the group database, with `gid` first).
    pub groups: Vec<u32>,
}

/// A user database entry: name, uid, primary gid.
fn passwd(by: Either<'_>) -> Result<Option<(String, u32, u32)>, UserError> {
    let mut buf = vec![0u8; 4096];
    loop {
        // SAFETY: `pwd` and `buf` outlive the call; `result` is set by it to null or to `pwd`.
        let mut pwd: libc::passwd = unsafe { std::mem::zeroed() };
        let mut result: *mut libc::passwd = std::ptr::null_mut();
        let rc = unsafe {
            match by {
                Either::Name(n) => libc::getpwnam_r(
                    n.as_ptr(),
                    &mut pwd,
                    buf.as_mut_ptr().cast(),
                    buf.len(),
                    &mut result,
                ),
                Either::Id(id) => libc::getpwuid_r(
                    id,
                    &mut pwd,
                    buf.as_mut_ptr().cast(),
                    buf.len(),
                    &mut result,
                ),
            }
        };
        if rc == libc::ERANGE && buf.len() < 1 << 20 {
            buf.resize(buf.len() * 4, 0);
            continue;
        }
        if rc != 0 {
            return Err(UserError::Lookup(io::Error::from_raw_os_error(rc)));
        }
        if result.is_null() {
            return Ok(None);
        }
        // SAFETY: on success `pw_name` points to a NUL-terminated string inside `buf`.
        let name = unsafe { CStr::from_ptr(pwd.pw_name) }
            .to_string_lossy()
            .into_owned();
        return Ok(Some((name, pwd.pw_uid, pwd.pw_gid)));
    }
}

/// A group database entry's gid.
fn group(name: &CStr) -> Result<Option<u32>, UserError> {
    let mut buf = vec![0u8; 4096];
    loop {
        // SAFETY: as in `passwd`.
        let mut grp: libc::group = unsafe { std::mem::zeroed() };
        let mut result: *mut libc::group = std::ptr::null_mut();
        let rc = unsafe {
            libc::getgrnam_r(
                name.as_ptr(),
                &mut grp,
                buf.as_mut_ptr().cast(),
                buf.len(),
                &mut result,
            )
        };
        if rc == libc::ERANGE && buf.len() < 1 << 20 {
            buf.resize(buf.len() * 4, 0);
            continue;
        }
        if rc != 0 {
            return Err(UserError::Lookup(io::Error::from_raw_os_error(rc)));
        }
        return Ok((!result.is_null()).then_some(grp.gr_gid));
    }
}

/// The groups of user `name` whose primary group is `gid` (`gid` first).
fn group_list(name: &CStr, gid: u32) -> Vec<u32> {
    let mut n: libc::c_int = 32;
    loop {
        let mut groups = vec![0 as libc::gid_t; n as usize];
        // SAFETY: `groups` has room for `n` entries; the call writes at most that many and sets
        // `n` to the number it needs.
        let rc = unsafe { libc::getgrouplist(name.as_ptr(), gid, groups.as_mut_ptr(), &mut n) };
        if rc >= 0 {
            groups.truncate(n as usize);
            if let Some(i) = groups.iter().position(|g| *g == gid) {
                groups.remove(i);
            }
            groups.insert(0, gid);
            return groups;
        }
        if n as usize <= groups.len() || n > 65536 {
            return vec![gid];
        }
    }
}

#[derive(Clone, Copy)]
enum Either<'a> {
    Name(&'a CStr),
    Id(u32),
}

fn numeric(s: &str) -> Option<u32> {
    if s.bytes().all(|b| b.is_ascii_digit()) {
        s.parse().ok()
    } else {
        None
    }
}

impl RunAs {
    /// Resolves `user` (a name or a numeric uid) and `group` (a name, a numeric gid, or the
    /// user's primary group when `None`). Only root may run a child as another user.
    pub fn resolve(user: &str, group_arg: Option<&str>) -> Result<RunAs, UserError> {
        let euid = rustix::process::geteuid().as_raw();
        if euid != 0 {
            return Err(UserError::NotRoot { euid });
        }
        let cname = |s: &str| CString::new(s).map_err(|_| UserError::NoUser(s.to_owned()));
        let entry = match numeric(user) {
            Some(uid) => passwd(Either::Id(uid))?.ok_or(uid),
            None => match passwd(Either::Name(&cname(user)?))? {
                Some(e) => Ok(e),
                None => return Err(UserError::NoUser(user.to_owned())),
            },
        };
        let gid = match group_arg {
            Some(g) => match numeric(g) {
                Some(gid) => gid,
                None => {
                    let c = CString::new(g).map_err(|_| UserError::NoGroup(g.to_owned()))?;
                    group(&c)?.ok_or_else(|| UserError::NoGroup(g.to_owned()))?
                }
            },
            None => match &entry {
                Ok((_, _, gid)) => *gid,
                Err(uid) => return Err(UserError::NoPrimaryGroup(*uid)),
            },
        };
        Ok(match entry {
            Ok((name, uid, _)) => {
                let groups = group_list(&cname(&name)?, gid);
                RunAs {
                    name,
                    uid,
                    gid,
                    groups,
                }
            }
            Err(uid) => RunAs {
                name: uid.to_string(),
                uid,
                gid,
                groups: vec![gid],
            },
        })
    }

    /// The credentials the child switches to before it execs.
    pub(crate) fn credentials(&self) -> super::child::Credentials {
        super::child::Credentials {
            uid: self.uid,
            gid: self.gid,
            groups: self.groups.clone(),
        }
    }

    /// Makes the staging area and the view (if any) the user's, and opens both for the child
    /// to inherit. Call before the spawn; nothing of the workload runs yet.
    pub(crate) fn hand_over(&self, staging: &Path, view: Option<&Path>) -> io::Result<Handover> {
        let open = |p: &Path| -> io::Result<OwnedFd> {
            Ok(rustix::fs::open(
                p,
                OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                Mode::empty(),
            )?)
        };
        let out = open(staging)?;
        chown_tree(out.as_fd(), self.uid, self.gid, staging)?;
        let view = match view {
            None => None,
            Some(v) => {
                let fd = open(v)?;
                chown_tree(fd.as_fd(), self.uid, self.gid, v)?;
                Some(fd)
            }
        };
        Ok(Handover { out, view })
    }
}

/// The child's two directories while it runs as another user.
#[derive(Debug)]
pub(crate) struct Handover {
    out: OwnedFd,
    view: Option<OwnedFd>,
}

impl Handover {
    /// `TENURE_CHECKPOINT_OUT` for the child.
    pub(crate) fn out_path(&self) -> OsString {
        proc_path(self.out.as_raw_fd())
    }

    /// `TENURE_CHECKPOINT` for the child, when there is a checkpoint.
    pub(crate) fn view_path(&self) -> Option<OsString> {
        self.view.as_ref().map(|v| proc_path(v.as_raw_fd()))
    }

    /// The descriptors the child keeps across exec.
    pub(crate) fn fds(&self) -> Vec<RawFd> {
        std::iter::once(self.out.as_raw_fd())
            .chain(self.view.as_ref().map(AsRawFd::as_raw_fd))
            .collect()
    }
}

fn proc_path(fd: RawFd) -> OsString {
    format!("/proc/self/fd/{fd}").into()
}

/// Takes a staging area back before it is published: every entry under `staging` (and the
/// area itself) is owned by the runner again. Links are never followed, so nothing outside
/// the area changes owner. An area that is gone or not a directory is left to the publish,
/// which refuses or skips it as it would for any child.
pub fn take_back(staging: &Path) -> io::Result<()> {
    let fd = match rustix::fs::open(
        staging,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    ) {
        Ok(fd) => fd,
        Err(rustix::io::Errno::NOENT | rustix::io::Errno::NOTDIR | rustix::io::Errno::LOOP) => {
            return Ok(());
        }
        Err(e) => return Err(e.into()),
    };
    let uid = rustix::process::geteuid().as_raw();
    let gid = rustix::process::getegid().as_raw();
    chown_tree(fd.as_fd(), uid, gid, staging)
}

/// Whether `path` lies in the store's scratch directories (staging areas and views) of `dir`.
pub(crate) fn is_scratch(dir: &crate::privfs::StateDir, path: &Path) -> bool {
    use crate::checkpoint::{STAGING_DIR, STORE_DIR, VIEWS_DIR};
    let store = dir.path().join(STORE_DIR);
    [STAGING_DIR, VIEWS_DIR]
        .iter()
        .any(|s| path.starts_with(store.join(s)))
}

/// Takes back everything in the store's scratch directories of `dir` (see [`take_back`]).
pub(crate) fn take_back_scratch(dir: &crate::privfs::StateDir) -> io::Result<()> {
    use crate::checkpoint::{STAGING_DIR, STORE_DIR, VIEWS_DIR};
    let store = dir.path().join(STORE_DIR);
    for s in [STAGING_DIR, VIEWS_DIR] {
        take_back(&store.join(s))?;
    }
    Ok(())
}

/// Changes the owner of the directory `top` and of everything below it, depth first, never
/// following a link (`AT_SYMLINK_NOFOLLOW`; directories are opened `O_NOFOLLOW`). Holds one
/// descriptor per level, at most [`MAX_DEPTH`] + 1.
fn chown_tree(top: BorrowedFd<'_>, uid: u32, gid: u32, shown: &Path) -> io::Result<()> {
    let owner = (
        Some(rustix::process::Uid::from_raw(uid)),
        Some(rustix::process::Gid::from_raw(gid)),
    );
    let at = |e: rustix::io::Errno, what: &str| {
        io::Error::new(
            io::Error::from(e).kind(),
            format!("cannot give {} to uid {uid}: {what}: {e}", shown.display()),
        )
    };
    rustix::fs::fchown(top, owner.0, owner.1).map_err(|e| at(e, "chown"))?;
    // Each level: its descriptor and the names still to visit in it.
    let first = rustix::fs::openat(
        top,
        ".",
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| at(e, "open"))?;
    let mut stack: Vec<(OwnedFd, Vec<(CString, bool)>)> = Vec::new();
    let names = list(&first).map_err(|e| at(e, "list"))?;
    stack.push((first, names));
    loop {
        let depth = stack.len();
        let Some((dir, names)) = stack.last_mut() else {
            break;
        };
        let Some((name, is_dir)) = names.pop() else {
            stack.pop();
            continue;
        };
        match rustix::fs::chownat(&*dir, &name, owner.0, owner.1, AtFlags::SYMLINK_NOFOLLOW) {
            Ok(()) | Err(rustix::io::Errno::NOENT) => {}
            Err(e) => return Err(at(e, "chown")),
        }
        if is_dir && depth <= MAX_DEPTH {
            match rustix::fs::openat(
                &*dir,
                &name,
                OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                Mode::empty(),
            ) {
                Ok(sub) => {
                    let names = list(&sub).map_err(|e| at(e, "list"))?;
                    stack.push((sub, names));
                }
                // Replaced by something else meanwhile: its owner was set, nothing to descend.
                Err(
                    rustix::io::Errno::NOENT | rustix::io::Errno::NOTDIR | rustix::io::Errno::LOOP,
                ) => {}
                Err(e) => return Err(at(e, "open")),
            }
        }
    }
    Ok(())
}

/// The entries of `dir` (without `.` and `..`) and whether each is a directory.
fn list(dir: &OwnedFd) -> Result<Vec<(CString, bool)>, rustix::io::Errno> {
    let mut out = Vec::new();
    for e in rustix::fs::Dir::read_from(dir)? {
        let e = e?;
        let name = e.file_name();
        if name == c"." || name == c".." {
            continue;
        }
        let is_dir = match e.file_type() {
            rustix::fs::FileType::Directory => true,
            rustix::fs::FileType::Unknown => {
                rustix::fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW)
                    .is_ok_and(|st| rustix::fs::FileType::from_raw_mode(st.st_mode).is_dir())
            }
            _ => false,
        };
        out.push((name.to_owned(), is_dir));
    }
    Ok(out)
}

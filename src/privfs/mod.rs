//! The private filesystem layer: every file tenure touches in a state dir goes through here.
//!
//! A state dir is opened once ([`StateDir::open`]), checked (`fstat`: a directory, owned by the
//! effective uid, no group or other permission bits) and from then on addressed only through
//! directory file descriptors ([`Dir`]) with `openat`-family calls, all `O_NOFOLLOW | O_CLOEXEC`.
//! That closes the classic holes of path-based code: a symlink swapped in for a record, a parent
//! renamed under our feet, a descriptor leaking into a child.
//!
//! Every file opened for reading is `fstat`ed after opening and refused unless it is a regular
//! file with no second link (a file whose only name was just replaced by a writer has zero
//! links and is a complete earlier version), owned by the effective uid and without group/other
//! bits. Every refusal is a distinct [`FsError`] variant (`symlink`, `not a regular file`, `not
//! owned`, `permissive`, `hard-linked`) that names the full path and the fix; nothing is ever
//! chmod-ed, chown-ed, deleted or rewritten to "repair" it, so a refused tree is left
//! byte-for-byte as it was.
//!
//! Writes follow the durable replace protocol: an exclusive temp file (`.tmp-<random>`, 0600) in
//! the target's directory, write, fsync, `renameat`, fsync of the directory ([`Dir::replace_durable`]
//! does all five). An fsync error consumes the file: [`TempFile::sync`] takes the temp file by
//! value, so the same descriptor can never be fsynced again (a second fsync after an error may
//! report success for data that was dropped); the temp file is then unlinked and the caller must
//! start over. A directory whose fsync failed is poisoned the same way.
//!
//! Crash points: each step calls [`crate::failpoint::hit`] with `<label>.<step>` (steps `create`,
//! `write`, `fsync`, `rename`, `dirfsync`, `unlink`, `link`, `mkdir`) where the label is chosen by
//! the caller, so a test can kill the process before any single step. With the `failpoints`
//! feature every performed step is also appended to an operation log (`start_recording`,
//! `take_recording`) so tests can prove orderings that no fault injector can observe (e.g. that a
//! rename is followed by an fsync of its directory).

use std::ffi::{OsStr, OsString};
use std::fmt;
use std::fs::File;
use std::io::{self, Read};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};

use rustix::fs::{AtFlags, FileType, Mode, OFlags, RenameFlags, Stat};

use crate::sync::{Arc, AtomicBool, Ordering};

mod exec;
#[cfg(feature = "failpoints")]
mod record;
mod scratch;

pub use exec::{Exec, hash_file_at};
#[cfg(feature = "failpoints")]
pub use record::{Op, OpKind, start_recording, take_recording, take_recording_under};

#[cfg(test)]
mod tests;

/// The prefix of every temp file privfs creates; [`Dir::remove_temp_files`] sweeps these.
pub const TEMP_PREFIX: &str = ".tmp-";

/// Errors of the private filesystem layer. Every variant names the full path it is about.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FsError {
    /// The path is a symbolic link; state dirs never follow links.
    #[error(
        "{path} is a symlink; tenure never follows links inside a state dir: replace it with the real file or directory"
    )]
    Symlink {
        /// The file or directory concerned.
        path: PathBuf,
    },
    /// The path is not a regular file (a FIFO, socket, device or directory where a file belongs).
    #[error("{path} is not a regular file (found a {found}); move it out of the state dir")]
    NotRegular {
        /// The file or directory concerned.
        path: PathBuf,
        /// What was found instead.
        found: FileKind,
    },
    /// The path is not a directory where a directory belongs.
    #[error(
        "{path} is not a directory (found a {found}); move it out of the way or choose another state dir"
    )]
    NotDirectory {
        /// The file or directory concerned.
        path: PathBuf,
        /// What was found instead.
        found: FileKind,
    },
    /// The path is owned by another user than the effective uid.
    #[error(
        "{path} is not owned by uid {euid} (owner uid {uid}); run tenure as its owner or chown it yourself"
    )]
    NotOwned {
        /// The file or directory concerned.
        path: PathBuf,
        /// Its owner's uid.
        uid: u32,
        /// The effective uid of this process.
        euid: u32,
    },
    /// The path has group or other permission bits set.
    #[error(
        "{path} is permissive (mode {mode:04o}); state is private: remove the group/other bits (chmod go-rwx) after checking nobody else wrote it"
    )]
    Permissive {
        /// The file or directory concerned.
        path: PathBuf,
        /// Its permission bits.
        mode: u32,
    },
    /// The file has more than one hard link, so someone else can change it behind our back.
    #[error(
        "{path} is hard-linked ({nlink} links); a private record has exactly one link: find the other links (`find {} -xdev -samefile {path}` — an output a child linked it into and the runner kept, in `checkpoints/failed/`, is a usual place), check its content, and remove them",
        link_search_root(.path).display()
    )]
    HardLinked {
        /// The file or directory concerned.
        path: PathBuf,
        /// Its number of hard links.
        nlink: u64,
    },
    /// The path does not exist.
    #[error("{path} does not exist; check the path or create it first")]
    NotFound {
        /// The file or directory concerned.
        path: PathBuf,
    },
    /// An exclusive create found the name already taken.
    #[error("{path} already exists; refusing to overwrite it: move it aside if it is not needed")]
    AlreadyExists {
        /// The file or directory concerned.
        path: PathBuf,
    },
    /// A file is larger than the caller's bound for it.
    #[error(
        "{path} is too large ({len} bytes, at most {max} expected); it is not a file tenure wrote: move it aside"
    )]
    TooLarge {
        /// The file or directory concerned.
        path: PathBuf,
        /// Its size in bytes.
        len: u64,
        /// The largest size expected.
        max: u64,
    },
    /// The state dir's path is not UTF-8: its identity marker could not record it.
    #[error(
        "{path} is not valid UTF-8; tenure records a state dir's path as text (in its identity marker): choose a path whose names are UTF-8"
    )]
    NotUtf8 {
        /// The path concerned (canonical where it could be resolved).
        path: PathBuf,
    },
    /// A name passed to privfs is not a single path component (a programming error).
    #[error("{name:?} is not a single path component under {dir}; use a plain file name")]
    BadName {
        /// The state dir.
        dir: PathBuf,
        /// The name given.
        name: OsString,
    },
    /// An fsync failed; the file was abandoned and must be written again from scratch.
    #[error(
        "fsync of {path} failed: {source}; the write was abandoned: free space or fix the device, then retry"
    )]
    Fsync {
        /// The file or directory concerned.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// An earlier fsync of this directory failed, so its durability can no longer be trusted.
    #[error(
        "{path} had a failed directory fsync earlier; reopen the state dir before writing again"
    )]
    Poisoned {
        /// The file or directory concerned.
        path: PathBuf,
    },
    /// Any other I/O failure, with the operation that failed.
    #[error("cannot {op} {path}: {source}; check the path and its permissions")]
    Io {
        /// The operation that failed.
        op: &'static str,
        /// The file or directory concerned.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: io::Error,
    },
}

/// Where to look for the other links of a private record: its state dir (the parent of the
/// `.tenure` or `checkpoints` folder it is in), else the folder it is in.
fn link_search_root(path: &Path) -> &Path {
    path.ancestors()
        .skip(1)
        .find(|a| {
            a.file_name()
                .is_some_and(|n| n == ".tenure" || n == "checkpoints")
        })
        .and_then(Path::parent)
        .or_else(|| path.parent())
        .unwrap_or(path)
}

/// The path field of an [`FsError`], shared or mutable as `$e` is.
macro_rules! path_of {
    ($e:expr) => {
        match $e {
            FsError::Symlink { path }
            | FsError::NotRegular { path, .. }
            | FsError::NotDirectory { path, .. }
            | FsError::NotOwned { path, .. }
            | FsError::Permissive { path, .. }
            | FsError::HardLinked { path, .. }
            | FsError::NotFound { path }
            | FsError::AlreadyExists { path }
            | FsError::TooLarge { path, .. }
            | FsError::Fsync { path, .. }
            | FsError::Poisoned { path }
            | FsError::NotUtf8 { path }
            | FsError::Io { path, .. } => path,
            FsError::BadName { dir, .. } => dir,
        }
    };
}

impl FsError {
    /// An I/O failure of `op` on `path`; a missing path and a taken name get their own
    /// variants.
    pub(crate) fn io(op: &'static str, path: PathBuf, err: impl Into<io::Error>) -> FsError {
        let source = err.into();
        match source.kind() {
            io::ErrorKind::NotFound => FsError::NotFound { path },
            io::ErrorKind::AlreadyExists => FsError::AlreadyExists { path },
            _ => FsError::Io { op, path, source },
        }
    }

    /// The path the error is about.
    pub fn path(&self) -> &Path {
        path_of!(self)
    }

    /// The path the error is about, to name it where it is now (a kept output).
    pub(crate) fn path_mut(&mut self) -> &mut PathBuf {
        path_of!(self)
    }

    /// True when the error says the path does not exist.
    pub fn is_not_found(&self) -> bool {
        matches!(self, FsError::NotFound { .. })
    }

    /// True when the state on disk is refused (a symlink, a permissive or foreign file, a
    /// record too large, a bad name): the "refused state" exit code, never repaired. False for
    /// operational failures (I/O, fsync, a missing file).
    pub fn is_refusal(&self) -> bool {
        match self {
            FsError::Symlink { .. }
            | FsError::NotRegular { .. }
            | FsError::NotDirectory { .. }
            | FsError::NotOwned { .. }
            | FsError::Permissive { .. }
            | FsError::HardLinked { .. }
            | FsError::TooLarge { .. }
            | FsError::NotUtf8 { .. }
            | FsError::BadName { .. } => true,
            FsError::NotFound { .. }
            | FsError::AlreadyExists { .. }
            | FsError::Fsync { .. }
            | FsError::Poisoned { .. }
            | FsError::Io { .. } => false,
        }
    }
}

/// The kind of a directory entry, for messages and listings.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FileKind {
    /// A regular file.
    Regular,
    /// A directory.
    Directory,
    /// A symbolic link.
    Symlink,
    /// A named pipe.
    Fifo,
    /// A unix socket.
    Socket,
    /// A character device.
    CharDevice,
    /// A block device.
    BlockDevice,
    /// Anything the kernel did not classify.
    Unknown,
}

impl FileKind {
    fn from_file_type(ft: FileType) -> FileKind {
        match ft {
            FileType::RegularFile => FileKind::Regular,
            FileType::Directory => FileKind::Directory,
            FileType::Symlink => FileKind::Symlink,
            FileType::Fifo => FileKind::Fifo,
            FileType::Socket => FileKind::Socket,
            FileType::CharacterDevice => FileKind::CharDevice,
            FileType::BlockDevice => FileKind::BlockDevice,
            FileType::Unknown => FileKind::Unknown,
        }
    }

    fn of(st: &Stat) -> FileKind {
        FileKind::from_file_type(FileType::from_raw_mode(st.st_mode))
    }

    /// The kind a `st_mode` describes.
    pub fn of_mode(mode: u32) -> FileKind {
        FileKind::from_file_type(FileType::from_raw_mode(mode))
    }
}

impl fmt::Display for FileKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            FileKind::Regular => "regular file",
            FileKind::Directory => "directory",
            FileKind::Symlink => "symlink",
            FileKind::Fifo => "fifo",
            FileKind::Socket => "socket",
            FileKind::CharDevice => "character device",
            FileKind::BlockDevice => "block device",
            FileKind::Unknown => "file of unknown type",
        })
    }
}

/// One entry of [`Dir::entries`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// The entry's name inside its directory.
    pub name: OsString,
    /// What the entry is (from `lstat`, never following links).
    pub kind: FileKind,
}

/// What a file opened for reading must look like, beyond being a private regular file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Links {
    /// Exactly one hard link: records nobody else can change behind our back.
    Single,
    /// Any number of links: content-addressed blobs that are also hard-linked into a view.
    Any,
}

/// The effective uid, read once: tenure never changes its own (only a child does, before it
/// execs), and every checked open compares against it.
fn euid() -> u32 {
    use std::sync::atomic::{AtomicU32, Ordering};
    static EUID: AtomicU32 = AtomicU32::new(u32::MAX);
    match EUID.load(Ordering::Relaxed) {
        u32::MAX => {
            let e = rustix::process::geteuid().as_raw();
            EUID.store(e, Ordering::Relaxed);
            e
        }
        e => e,
    }
}

/// Checks that `name` is one plain path component, so `openat` cannot escape its directory.
fn check_name<'n>(dir: &Path, name: &'n OsStr) -> Result<&'n OsStr, FsError> {
    let bytes = name.as_bytes();
    if bytes.is_empty()
        || bytes == b"."
        || bytes == b".."
        || bytes.contains(&b'/')
        || bytes.contains(&0)
    {
        return Err(FsError::BadName {
            dir: dir.to_path_buf(),
            name: name.to_owned(),
        });
    }
    Ok(name)
}

/// Refuses a directory that is not ours or not private.
fn check_dir_stat(path: &Path, st: &Stat) -> Result<(), FsError> {
    let kind = FileKind::of(st);
    if kind != FileKind::Directory {
        return Err(match kind {
            FileKind::Symlink => FsError::Symlink {
                path: path.to_path_buf(),
            },
            _ => FsError::NotDirectory {
                path: path.to_path_buf(),
                found: kind,
            },
        });
    }
    check_owner_mode(path, st)
}

fn check_owner_mode(path: &Path, st: &Stat) -> Result<(), FsError> {
    let euid = euid();
    if st.st_uid != euid {
        return Err(FsError::NotOwned {
            path: path.to_path_buf(),
            uid: st.st_uid,
            euid,
        });
    }
    let mode = st.st_mode & 0o7777;
    if mode & 0o077 != 0 {
        return Err(FsError::Permissive {
            path: path.to_path_buf(),
            mode,
        });
    }
    Ok(())
}

/// Refuses an entry of the wrong kind or owned by someone else; mode bits are not looked at.
fn check_kind_owner(path: &Path, st: &Stat, want: FileKind) -> Result<(), FsError> {
    let kind = FileKind::of(st);
    if kind != want {
        return Err(match (kind, want) {
            (FileKind::Symlink, _) => FsError::Symlink {
                path: path.to_path_buf(),
            },
            (_, FileKind::Directory) => FsError::NotDirectory {
                path: path.to_path_buf(),
                found: kind,
            },
            _ => FsError::NotRegular {
                path: path.to_path_buf(),
                found: kind,
            },
        });
    }
    let euid = euid();
    if st.st_uid != euid {
        return Err(FsError::NotOwned {
            path: path.to_path_buf(),
            uid: st.st_uid,
            euid,
        });
    }
    Ok(())
}

/// Refuses a file that is not a private regular file with the expected number of links.
fn check_file_stat(path: &Path, st: &Stat, links: Links) -> Result<(), FsError> {
    let kind = FileKind::of(st);
    match kind {
        FileKind::Regular => {}
        FileKind::Symlink => {
            return Err(FsError::Symlink {
                path: path.to_path_buf(),
            });
        }
        FileKind::Directory
        | FileKind::Fifo
        | FileKind::Socket
        | FileKind::CharDevice
        | FileKind::BlockDevice
        | FileKind::Unknown => {
            return Err(FsError::NotRegular {
                path: path.to_path_buf(),
                found: kind,
            });
        }
    }
    check_owner_mode(path, st)?;
    // Zero links is not a hazard: the name was removed (a writer replaced the file while we
    // looked or opened it), so nobody can reach this inode by another name. What we read is a
    // complete earlier version, as if we had opened it just before the replace.
    if links == Links::Single && st.st_nlink > 1 {
        return Err(FsError::HardLinked {
            path: path.to_path_buf(),
            nlink: st.st_nlink,
        });
    }
    Ok(())
}

/// A random hex string for temp names, so concurrent writers never collide and a name cannot be
/// predicted and pre-planted.
fn random_hex(bytes: usize) -> String {
    let mut buf = vec![0u8; bytes];
    let mut filled = 0;
    while filled < buf.len() {
        match rustix::rand::getrandom(&mut buf[filled..], rustix::rand::GetRandomFlags::empty()) {
            Ok(n) => filled += n,
            Err(rustix::io::Errno::INTR) => {}
            // getrandom cannot fail on a supported kernel once the pool is initialised; if it
            // does, fall back on the clock and pid, which are still unique enough for a temp
            // name guarded by O_EXCL.
            Err(_) => {
                let now = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map(|d| d.as_nanos())
                    .unwrap_or(0);
                let mix = now ^ ((std::process::id() as u128) << 64);
                for (i, b) in buf.iter_mut().enumerate().skip(filled) {
                    *b = (mix >> ((i % 16) * 8)) as u8;
                }
                filled = buf.len();
            }
        }
    }
    crate::hex::encode(&buf)
}

/// Fills `buf` with random bytes from the kernel (`getrandom`), for tokens and identifiers.
pub fn random_bytes(buf: &mut [u8]) -> Result<(), FsError> {
    let mut filled = 0;
    while filled < buf.len() {
        match rustix::rand::getrandom(&mut buf[filled..], rustix::rand::GetRandomFlags::empty()) {
            Ok(n) => filled += n,
            Err(rustix::io::Errno::INTR) => {}
            Err(e) => {
                return Err(FsError::io(
                    "read random bytes for",
                    PathBuf::from("getrandom"),
                    e,
                ));
            }
        }
    }
    Ok(())
}

fn record(kind: RecordKind, dir: &Path, name: &OsStr, from: Option<&Path>) {
    #[cfg(feature = "failpoints")]
    record::push(kind, dir, name, from);
    #[cfg(not(feature = "failpoints"))]
    let _ = (kind, dir, name, from);
}

/// The steps privfs performs, named for crash points and the recorder.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum RecordKind {
    Create,
    Write,
    Fsync,
    Rename,
    DirFsync,
    Unlink,
    Link,
    Mkdir,
    SyncFs,
}

impl RecordKind {
    #[cfg(feature = "failpoints")]
    fn step(self) -> &'static str {
        match self {
            RecordKind::Create => "create",
            RecordKind::Write => "write",
            RecordKind::Fsync => "fsync",
            RecordKind::Rename => "rename",
            RecordKind::DirFsync => "dirfsync",
            RecordKind::Unlink => "unlink",
            RecordKind::Link => "link",
            RecordKind::Mkdir => "mkdir",
            RecordKind::SyncFs => "syncfs",
        }
    }
}

/// The crash point `rename.noreplace`: `Err(EINVAL)` when a test makes this filesystem refuse
/// `RENAME_NOREPLACE` (failpoint action `einval`), as NFS and many FUSE filesystems do.
fn noreplace_refused() -> Result<(), rustix::io::Errno> {
    #[cfg(feature = "failpoints")]
    {
        crate::failpoint::hit("rename.noreplace")
            .map_err(|e| rustix::io::Errno::from_io_error(&e).unwrap_or(rustix::io::Errno::IO))
    }
    #[cfg(not(feature = "failpoints"))]
    {
        Ok(())
    }
}

/// The crash point `rename.noreplace.link`: any action there makes the no-replace fallback
/// find hard links refused too (a filesystem without them), so it copies.
fn noreplace_link_refused() -> io::Result<()> {
    #[cfg(feature = "failpoints")]
    {
        crate::failpoint::hit("rename.noreplace.link")
    }
    #[cfg(not(feature = "failpoints"))]
    {
        Ok(())
    }
}

/// Calls the crash point `<label>.<step>`.
fn hit(label: &str, kind: RecordKind) -> io::Result<()> {
    #[cfg(feature = "failpoints")]
    {
        crate::failpoint::hit(&format!("{label}.{}", kind.step()))
    }
    #[cfg(not(feature = "failpoints"))]
    {
        let _ = (label, kind);
        Ok(())
    }
}

/// A state directory, opened and checked once; everything else is relative to its descriptor.
#[derive(Debug)]
pub struct StateDir {
    root: Dir,
    dev: u64,
    ino: u64,
}

impl StateDir {
    /// Opens the state dir at `path`. With `create`, missing parents and the dir itself are
    /// created 0700 (existing parents are left alone). The dir itself must not be a symlink and
    /// must be a directory owned by the effective uid with no group/other bits. With `create`
    /// (an owner's open), a path that is not UTF-8 is refused before anything is created: the
    /// identity marker records the dir's path as text.
    pub fn open(path: &Path, create: bool) -> Result<StateDir, FsError> {
        // `link/` and `link/.` resolve through a symlink even with `O_NOFOLLOW` (the kernel
        // follows the last component when a slash or `.` comes after it), so the path is
        // normalised lexically first: a trailing `/` or `/.` never changes whether a symlinked
        // dir is refused.
        let normalised = normalise(path);
        let path = normalised.as_path();
        if create {
            Self::create_missing(path)?;
        }
        // Look before opening so a symlink is reported as such (open with O_NOFOLLOW and
        // O_DIRECTORY reports ELOOP or ENOTDIR depending on the kernel), then compare the opened
        // descriptor with what we looked at so a swap in between is caught too.
        let lst = rustix::fs::statat(rustix::fs::CWD, path, AtFlags::SYMLINK_NOFOLLOW)
            .map_err(|e| FsError::io("look at state dir", path.to_path_buf(), e))?;
        check_dir_stat(path, &lst)?;
        let fd = rustix::fs::openat(
            rustix::fs::CWD,
            path,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| match e {
            rustix::io::Errno::LOOP => FsError::Symlink {
                path: path.to_path_buf(),
            },
            e => FsError::io("open state dir", path.to_path_buf(), e),
        })?;
        let st = rustix::fs::fstat(&fd)
            .map_err(|e| FsError::io("stat state dir", path.to_path_buf(), e))?;
        check_dir_stat(path, &st)?;
        if (st.st_dev, st.st_ino) != (lst.st_dev, lst.st_ino) {
            return Err(FsError::Io {
                op: "open state dir",
                path: path.to_path_buf(),
                source: io::Error::other("the directory was replaced while it was being opened"),
            });
        }
        // The kernel's name for the open descriptor is the canonical path: no `..`, no links.
        let canonical = std::fs::read_link(format!("/proc/self/fd/{}", fd_raw(&fd)))
            .or_else(|_| std::fs::canonicalize(path))
            .map_err(|e| FsError::io("resolve the canonical path of", path.to_path_buf(), e))?;
        if create && canonical.to_str().is_none() {
            return Err(FsError::NotUtf8 { path: canonical });
        }
        Ok(StateDir {
            root: Dir::from_fd(fd, canonical),
            dev: st.st_dev,
            ino: st.st_ino,
        })
    }

    fn create_missing(path: &Path) -> Result<(), FsError> {
        let mut missing = Vec::new();
        let mut cur = Some(path);
        while let Some(p) = cur {
            if p.as_os_str().is_empty() {
                break;
            }
            match rustix::fs::statat(rustix::fs::CWD, p, AtFlags::SYMLINK_NOFOLLOW) {
                Ok(_) => break,
                Err(rustix::io::Errno::NOENT) => {
                    missing.push(p.to_path_buf());
                    cur = p.parent();
                }
                Err(e) => return Err(FsError::io("look at", p.to_path_buf(), e)),
            }
        }
        // Nothing is created unless all of it can be: a name longer than the filesystems'
        // limit (NAME_MAX) would fail only after its parents were made.
        if let Some(long) = missing
            .iter()
            .find(|m| m.file_name().is_some_and(|n| n.len() > 255))
        {
            return Err(FsError::io(
                "create",
                long.clone(),
                rustix::io::Errno::NAMETOOLONG,
            ));
        }
        // What is created must have a UTF-8 canonical path (see `open`): the names to create
        // and the canonical path of the existing ancestor they go under.
        if !missing.is_empty() {
            let base = match cur {
                Some(p) if !p.as_os_str().is_empty() => std::fs::canonicalize(p).ok(),
                _ => std::env::current_dir().ok(),
            };
            let names = missing
                .iter()
                .all(|m| m.file_name().is_none_or(|n| n.to_str().is_some()));
            if !names || base.is_some_and(|b| b.to_str().is_none()) {
                return Err(FsError::NotUtf8 {
                    path: path.to_path_buf(),
                });
            }
        }
        for p in missing.iter().rev() {
            if matches!(
                p.components().next_back(),
                Some(Component::ParentDir | Component::CurDir)
            ) {
                return Err(FsError::BadName {
                    dir: p.clone(),
                    name: p.as_os_str().to_owned(),
                });
            }
            hit("statedir", RecordKind::Mkdir).map_err(|e| FsError::io("create", p.clone(), e))?;
            match rustix::fs::mkdirat(rustix::fs::CWD, p.as_path(), Mode::from_raw_mode(0o700)) {
                Ok(()) | Err(rustix::io::Errno::EXIST) => {}
                Err(e) => return Err(FsError::io("create", p.clone(), e)),
            }
            let parent = p.parent().unwrap_or(Path::new("/"));
            let name = p.file_name().unwrap_or(p.as_os_str());
            record(RecordKind::Mkdir, parent, name, None);
        }
        Ok(())
    }

    /// A second handle on the same opened dir (the descriptor is duplicated, not reopened, so it
    /// names the same directory even if the path has changed since).
    pub fn try_clone(&self) -> Result<StateDir, FsError> {
        Ok(StateDir {
            root: self.root.try_clone()?,
            dev: self.dev,
            ino: self.ino,
        })
    }

    /// The canonical path the dir had when it was opened.
    pub fn path(&self) -> &Path {
        self.root.path()
    }

    /// The dir itself, for openat-family operations.
    pub fn root(&self) -> &Dir {
        &self.root
    }

    /// The device and inode of the opened dir.
    pub fn dev_ino(&self) -> (u64, u64) {
        (self.dev, self.ino)
    }

    /// Whether the canonical path still names the directory we opened (card H7: a moved or
    /// replaced root). `Ok(false)` when the path is gone or names something else.
    pub fn is_still_at_path(&self) -> Result<bool, FsError> {
        match rustix::fs::statat(rustix::fs::CWD, self.path(), AtFlags::SYMLINK_NOFOLLOW) {
            Ok(st) => Ok((st.st_dev, st.st_ino) == (self.dev, self.ino)),
            Err(rustix::io::Errno::NOENT | rustix::io::Errno::NOTDIR) => Ok(false),
            Err(e) => Err(FsError::io("look at", self.path().to_path_buf(), e)),
        }
    }
}

/// `path` without trailing slashes and without `.` components after the first one (what
/// `Path::components` yields), so the last component is the one the path names. An empty
/// result (the path was `.`-only) is `.`.
pub fn normalise(path: &Path) -> PathBuf {
    let p: PathBuf = path.components().collect();
    if p.as_os_str().is_empty() {
        PathBuf::from(".")
    } else {
        p
    }
}

fn fd_raw(fd: &OwnedFd) -> i32 {
    use std::os::fd::AsRawFd;
    fd.as_raw_fd()
}

/// A directory descriptor inside a state dir (`O_DIRECTORY`), with the path used in messages.
#[derive(Debug)]
pub struct Dir {
    fd: OwnedFd,
    path: PathBuf,
    /// Shared by every handle duplicated from this one: a failed fsync is about the
    /// directory, not the descriptor.
    poisoned: Arc<AtomicBool>,
}

impl AsFd for Dir {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

impl Dir {
    fn from_fd(fd: OwnedFd, path: PathBuf) -> Dir {
        Dir {
            fd,
            path,
            poisoned: Arc::new(AtomicBool::new(false)),
        }
    }

    /// A second handle on the same directory (a duplicated descriptor, `O_CLOEXEC`). It
    /// shares this handle's poisoning: after a failed fsync through either, neither syncs.
    pub fn try_clone(&self) -> Result<Dir, FsError> {
        let fd = self
            .fd
            .try_clone()
            .map_err(|e| FsError::io("duplicate the descriptor of", self.path.clone(), e))?;
        Ok(Dir {
            fd,
            path: self.path.clone(),
            poisoned: Arc::clone(&self.poisoned),
        })
    }

    /// The path of this directory (for messages; never used to open anything).
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The path of `name` inside this directory (for messages).
    pub fn child_path(&self, name: impl AsRef<OsStr>) -> PathBuf {
        self.path.join(name.as_ref())
    }

    fn name<'n>(&self, name: &'n OsStr) -> Result<&'n OsStr, FsError> {
        check_name(&self.path, name)
    }

    /// `lstat` of an entry: `Ok(None)` when it does not exist. Never follows a link.
    pub fn stat(&self, name: impl AsRef<OsStr>) -> Result<Option<Stat>, FsError> {
        let name = self.name(name.as_ref())?;
        match rustix::fs::statat(&self.fd, name, AtFlags::SYMLINK_NOFOLLOW) {
            Ok(st) => Ok(Some(st)),
            Err(rustix::io::Errno::NOENT) => Ok(None),
            Err(e) => Err(FsError::io("look at", self.child_path(name), e)),
        }
    }

    /// Opens an existing subdirectory and checks it (directory, ours, private).
    pub fn open_dir(&self, name: impl AsRef<OsStr>) -> Result<Dir, FsError> {
        let name = self.name(name.as_ref())?;
        let path = self.child_path(name);
        let fd = self.open_dir_fd(name, &path, check_dir_stat)?;
        let st = rustix::fs::fstat(&fd).map_err(|e| FsError::io("stat", path.clone(), e))?;
        check_dir_stat(&path, &st)?;
        Ok(Dir::from_fd(fd, path))
    }

    /// Opens the subdirectory `name` for the checks after the open. `O_DIRECTORY | O_NOFOLLOW`
    /// opens nothing but a directory (a FIFO or a device is refused before it is opened, a
    /// link is `ELOOP`), so unlike a file's open no look comes first: one syscall fewer on
    /// every directory of the run path (issue 11). When the open fails, the look names what
    /// is there with the same error the look first used to give (`check`).
    fn open_dir_fd(
        &self,
        name: &OsStr,
        path: &Path,
        check: fn(&Path, &Stat) -> Result<(), FsError>,
    ) -> Result<OwnedFd, FsError> {
        match self.open_nofollow(
            name,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            path,
        ) {
            Ok(fd) => Ok(fd),
            // Nothing by that name (`O_NOFOLLOW` answers `ELOOP` for a link, dangling or
            // not): the look would only say so again. One syscall fewer for every optional
            // directory that is absent, as `views/` and `incoming/` are on a run (issue 11).
            Err(open_err @ FsError::NotFound { .. }) => Err(open_err),
            Err(open_err) => {
                let lst = rustix::fs::statat(&self.fd, name, AtFlags::SYMLINK_NOFOLLOW)
                    .map_err(|e| FsError::io("look at", path.to_path_buf(), e))?;
                check(path, &lst)?;
                Err(open_err)
            }
        }
    }

    /// Like [`Dir::open_dir`], but `Ok(None)` when the subdirectory does not exist.
    pub fn open_dir_optional(&self, name: impl AsRef<OsStr>) -> Result<Option<Dir>, FsError> {
        match self.open_dir(name) {
            Ok(d) => Ok(Some(d)),
            Err(FsError::NotFound { .. }) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Creates a subdirectory 0700 (failing with `AlreadyExists` if the name is taken), fsyncs
    /// this directory so the new entry is durable, and opens it checked.
    pub fn create_dir(&self, name: impl AsRef<OsStr>, label: &str) -> Result<Dir, FsError> {
        let name = self.name(name.as_ref())?;
        let path = self.child_path(name);
        hit(label, RecordKind::Mkdir).map_err(|e| FsError::io("create", path.clone(), e))?;
        rustix::fs::mkdirat(&self.fd, name, Mode::from_raw_mode(0o700))
            .map_err(|e| FsError::io("create", path.clone(), e))?;
        record(RecordKind::Mkdir, &self.path, name, None);
        self.sync(label)?;
        self.open_dir(name)
    }

    /// Opens a subdirectory, creating it (0700, durably) when it is missing.
    pub fn ensure_dir(&self, name: impl AsRef<OsStr>, label: &str) -> Result<Dir, FsError> {
        let name = name.as_ref();
        match self.open_dir(name) {
            Ok(d) => Ok(d),
            Err(FsError::NotFound { .. }) => match self.create_dir(name, label) {
                Ok(d) => Ok(d),
                // Someone else created it between our look and our mkdir: open theirs, checked.
                Err(FsError::AlreadyExists { .. }) => self.open_dir(name),
                Err(e) => Err(e),
            },
            Err(e) => Err(e),
        }
    }

    /// Opens a file for reading and checks it after opening: a regular file owned by the
    /// effective uid, no group/other bits, and (for [`Links::Single`]) no second hard link.
    pub fn open_file_with(&self, name: impl AsRef<OsStr>, links: Links) -> Result<File, FsError> {
        self.open_file_stat(name.as_ref(), links).map(|(f, _)| f)
    }

    /// [`Dir::open_file_with`], also returning the size the post-open check saw (a reader
    /// sizes its buffer with it).
    fn open_file_stat(&self, name: &OsStr, links: Links) -> Result<(File, u64), FsError> {
        let name = self.name(name)?;
        let path = self.child_path(name);
        // Classify before opening so that a FIFO or a device is never opened at all (opening
        // some devices has side effects); the post-open fstat below is the check that counts.
        let lst = rustix::fs::statat(&self.fd, name, AtFlags::SYMLINK_NOFOLLOW)
            .map_err(|e| FsError::io("look at", path.clone(), e))?;
        check_file_stat(&path, &lst, links)?;
        // O_NONBLOCK: if a FIFO is swapped in after the look, opening it must not block.
        let fd = self.open_nofollow(
            name,
            OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC | OFlags::NONBLOCK | OFlags::NOCTTY,
            &path,
        )?;
        let st = rustix::fs::fstat(&fd).map_err(|e| FsError::io("stat", path.clone(), e))?;
        check_file_stat(&path, &st, links)?;
        Ok((File::from(fd), st.st_size as u64))
    }

    /// `openat` relative to this directory with the caller's flags plus `O_NOFOLLOW`; a
    /// symlink in the last component is the distinct `symlink` refusal.
    fn open_nofollow(&self, name: &OsStr, flags: OFlags, path: &Path) -> Result<OwnedFd, FsError> {
        rustix::fs::openat(&self.fd, name, flags | OFlags::NOFOLLOW, Mode::empty()).map_err(|e| {
            match e {
                rustix::io::Errno::LOOP => FsError::Symlink {
                    path: path.to_path_buf(),
                },
                e => FsError::io("open", path.to_path_buf(), e),
            }
        })
    }

    /// Opens a file a child process wrote inside a private directory (a checkpoint staging
    /// area): a regular file owned by the effective uid, never a link, but with any mode bits
    /// and any link count, because the child's umask decides those. Use it only below a
    /// directory that was itself opened checked, so nobody else could have reached the file.
    pub fn open_file_any_mode(&self, name: impl AsRef<OsStr>) -> Result<File, FsError> {
        self.open_file_any_mode_stat(name).map(|(file, _)| file)
    }

    /// [`Dir::open_file_any_mode`], with the `fstat` of the opened file it checked (its size,
    /// mode and link count, without asking again).
    pub(crate) fn open_file_any_mode_stat(
        &self,
        name: impl AsRef<OsStr>,
    ) -> Result<(File, rustix::fs::Stat), FsError> {
        let name = self.name(name.as_ref())?;
        let path = self.child_path(name);
        let lst = rustix::fs::statat(&self.fd, name, AtFlags::SYMLINK_NOFOLLOW)
            .map_err(|e| FsError::io("look at", path.clone(), e))?;
        check_kind_owner(&path, &lst, FileKind::Regular)?;
        let fd = self.open_nofollow(
            name,
            OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC | OFlags::NONBLOCK | OFlags::NOCTTY,
            &path,
        )?;
        let st = rustix::fs::fstat(&fd).map_err(|e| FsError::io("stat", path.clone(), e))?;
        check_kind_owner(&path, &st, FileKind::Regular)?;
        Ok((File::from(fd), st))
    }

    /// Opens a subdirectory a child process made inside a private directory: a directory owned
    /// by the effective uid, never a link, with any mode bits (see [`Dir::open_file_any_mode`]).
    pub fn open_dir_any_mode(&self, name: impl AsRef<OsStr>) -> Result<Dir, FsError> {
        let name = self.name(name.as_ref())?;
        let path = self.child_path(name);
        let fd = self.open_dir_fd(name, &path, |p, st| {
            check_kind_owner(p, st, FileKind::Directory)
        })?;
        let st = rustix::fs::fstat(&fd).map_err(|e| FsError::io("stat", path.clone(), e))?;
        check_kind_owner(&path, &st, FileKind::Directory)?;
        Ok(Dir::from_fd(fd, path))
    }

    /// [`Dir::open_dir_any_mode`] for a directory of a scratch tree that is about to be removed
    /// or kept (card P1): one its owner made unreadable or unsearchable (`chmod 000`, as test
    /// suites and sandboxes do) is made 0700 first, as its owner may. The mode is changed
    /// through an `O_PATH` descriptor of that very directory (never a link), by its
    /// `/proc/self/fd` name, and the directory is opened again through it.
    pub(crate) fn open_dir_reclaiming(&self, name: impl AsRef<OsStr>) -> Result<Dir, FsError> {
        let name = name.as_ref();
        match self.open_dir_any_mode(name) {
            Err(FsError::Io { source, .. })
                if source.raw_os_error() == Some(rustix::io::Errno::ACCESS.raw_os_error()) => {}
            other => return other,
        }
        let name = self.name(name)?;
        let path = self.child_path(name);
        let handle = self.open_nofollow(
            name,
            OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
            &path,
        )?;
        let st = rustix::fs::fstat(&handle).map_err(|e| FsError::io("stat", path.clone(), e))?;
        check_kind_owner(&path, &st, FileKind::Directory)?;
        let proc = format!("/proc/self/fd/{}", fd_raw(&handle));
        rustix::fs::chmod(&proc, Mode::from_raw_mode(0o700))
            .map_err(|e| FsError::io("make writable", path.clone(), e))?;
        let fd = rustix::fs::open(
            &proc,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| FsError::io("open", path.clone(), e))?;
        let again = rustix::fs::fstat(&fd).map_err(|e| FsError::io("stat", path.clone(), e))?;
        check_kind_owner(&path, &again, FileKind::Directory)?;
        Ok(Dir::from_fd(fd, path))
    }

    /// Opens a private record for reading ([`Links::Single`]).
    pub fn open_file(&self, name: impl AsRef<OsStr>) -> Result<File, FsError> {
        self.open_file_with(name, Links::Single)
    }

    /// Like [`Dir::open_file`], but `Ok(None)` when the file does not exist.
    pub fn open_file_optional(&self, name: impl AsRef<OsStr>) -> Result<Option<File>, FsError> {
        match self.open_file(name) {
            Ok(f) => Ok(Some(f)),
            Err(FsError::NotFound { .. }) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Reads a whole private record (checked as [`Dir::open_file`]), refusing one above `max`
    /// bytes; `Ok(None)` when it does not exist.
    pub fn read_optional(
        &self,
        name: impl AsRef<OsStr>,
        max: u64,
    ) -> Result<Option<Vec<u8>>, FsError> {
        let name = name.as_ref();
        let (file, size) = match self.open_file_stat(name, Links::Single) {
            Ok(f) => f,
            Err(FsError::NotFound { .. }) => return Ok(None),
            Err(e) => return Err(e),
        };
        let path = self.child_path(name);
        // Sized from the check's fstat (one byte more, so the end is seen at once): one read
        // for the bytes and one for the end, instead of a doubling buffer's many.
        // Read one byte past the bound so an oversized file is detected without reading it all.
        // The reads ask for all that is left of that capacity at once: `read_to_end` starts
        // with 8 KiB, which took three reads for the 8,240-byte epoch file (issue 11).
        let cap = size.min(max) as usize + 1;
        let mut buf = vec![0u8; cap];
        let mut len = 0;
        let mut file = file.take(max + 1);
        loop {
            if len == buf.len() {
                if buf.len() as u64 > max {
                    break;
                }
                // The file grew since its `fstat`: read on, still bounded by `max + 1`.
                buf.resize((buf.len() * 2).min((max as usize).saturating_add(1)), 0);
            }
            match file.read(&mut buf[len..]) {
                Ok(0) => break,
                Ok(n) => len += n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(FsError::io("read", path.clone(), e)),
            }
        }
        buf.truncate(len);
        if buf.len() as u64 > max {
            let len = self
                .stat(name)?
                .map(|s| s.st_size as u64)
                .unwrap_or(buf.len() as u64);
            return Err(FsError::TooLarge { path, len, max });
        }
        Ok(Some(buf))
    }

    /// Reads a whole private record; `NotFound` when it does not exist.
    pub fn read(&self, name: impl AsRef<OsStr>, max: u64) -> Result<Vec<u8>, FsError> {
        let name = name.as_ref();
        self.read_optional(name, max)?
            .ok_or_else(|| FsError::NotFound {
                path: self.child_path(name),
            })
    }

    /// Creates an exclusive temp file (`.tmp-<random>`, 0600) in this directory. Steps on it use
    /// the crash points `<label>.create|write|fsync|rename`.
    pub fn create_temp(&self, label: &str) -> Result<TempFile<'_>, FsError> {
        loop {
            let name = OsString::from(format!("{TEMP_PREFIX}{}", random_hex(8)));
            match self.create_exclusive(&name, label) {
                Ok(file) => {
                    return Ok(TempFile {
                        dir: self,
                        name,
                        label: label.to_owned(),
                        file: Some(file),
                        handed_over: false,
                    });
                }
                // 64 random bits collide only if someone planted the name; draw again.
                Err(FsError::AlreadyExists { .. }) => continue,
                Err(e) => return Err(e),
            }
        }
    }

    /// Opens `name` read-write, creating it empty (0600) if it does not exist, and checks it as
    /// [`Dir::open_file`] does (a private regular file with one link). For files that are used
    /// through their descriptor rather than their content, such as a lock file.
    pub fn open_or_create_file(
        &self,
        name: impl AsRef<OsStr>,
        label: &str,
    ) -> Result<File, FsError> {
        let name = self.name(name.as_ref())?;
        let path = self.child_path(name);
        // The file exists on every use but the first: look first, create only when it is
        // missing (an exclusive create that fails costs an `openat` on every run, issue 11),
        // and look again when someone else created it in between.
        let lst = match rustix::fs::statat(&self.fd, name, AtFlags::SYMLINK_NOFOLLOW) {
            Err(rustix::io::Errno::NOENT) => match self.create_exclusive(name, label) {
                Ok(file) => return file_rw_checked(file, &path),
                Err(FsError::AlreadyExists { .. }) => {
                    rustix::fs::statat(&self.fd, name, AtFlags::SYMLINK_NOFOLLOW)
                }
                Err(e) => return Err(e),
            },
            other => other,
        }
        .map_err(|e| FsError::io("look at", path.clone(), e))?;
        check_file_stat(&path, &lst, Links::Single)?;
        let fd = self.open_nofollow(
            name,
            OFlags::RDWR | OFlags::NOFOLLOW | OFlags::CLOEXEC | OFlags::NONBLOCK | OFlags::NOCTTY,
            &path,
        )?;
        file_rw_checked(File::from(fd), &path)
    }

    /// Opens the existing private record `name` for writing (checked as [`Dir::open_file`]:
    /// a private regular file with one link; never created, never truncated), writes `bytes`
    /// at `offset` in place (`pwrite`) and returns the file and its size after the write, so
    /// that the caller can sync it. Crash point and recorder entry: `<label>.write`. Not
    /// durable until the file is synced; until then a power loss may leave the range old, new
    /// or torn.
    pub fn write_at(
        &self,
        name: impl AsRef<OsStr>,
        offset: u64,
        bytes: &[u8],
        label: &str,
    ) -> Result<(File, u64), FsError> {
        let name = self.name(name.as_ref())?;
        let path = self.child_path(name);
        // O_NONBLOCK: a FIFO swapped in is refused by the check below, never waited on; the
        // post-open fstat is the check that counts (a device or a link is never written).
        let fd = self.open_nofollow(
            name,
            OFlags::WRONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC | OFlags::NONBLOCK | OFlags::NOCTTY,
            &path,
        )?;
        let st = rustix::fs::fstat(&fd).map_err(|e| FsError::io("stat", path.clone(), e))?;
        check_file_stat(&path, &st, Links::Single)?;
        let file = File::from(fd);
        let size = (st.st_size as u64).max(offset + bytes.len() as u64);
        hit(label, RecordKind::Write).map_err(|e| FsError::io("write", path.clone(), e))?;
        let mut done = 0;
        while done < bytes.len() {
            match rustix::io::pwrite(&file, &bytes[done..], offset + done as u64) {
                Ok(0) => {
                    return Err(FsError::io(
                        "write",
                        path,
                        io::Error::from(io::ErrorKind::WriteZero),
                    ));
                }
                Ok(n) => done += n,
                Err(rustix::io::Errno::INTR) => {}
                Err(e) => return Err(FsError::io("write", path, e)),
            }
        }
        record(RecordKind::Write, &self.path, name, None);
        Ok((file, size))
    }

    /// Creates `name` exclusively (`O_EXCL`, 0600) and returns it open for writing. The caller
    /// owns the entry from then on (it is not removed on drop).
    pub fn create_exclusive(&self, name: impl AsRef<OsStr>, label: &str) -> Result<File, FsError> {
        let name = self.name(name.as_ref())?;
        let path = self.child_path(name);
        hit(label, RecordKind::Create).map_err(|e| FsError::io("create", path.clone(), e))?;
        let fd = rustix::fs::openat(
            &self.fd,
            name,
            OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::from_raw_mode(0o600),
        )
        .map_err(|e| FsError::io("create", path.clone(), e))?;
        record(RecordKind::Create, &self.path, name, None);
        Ok(File::from(fd))
    }

    /// `renameat` within this directory, replacing `to` if it exists. Not durable until
    /// [`Dir::sync`].
    pub fn rename(
        &self,
        from: impl AsRef<OsStr>,
        to: impl AsRef<OsStr>,
        label: &str,
    ) -> Result<(), FsError> {
        self.rename_to(from, self, to, label, false)
    }

    /// `renameat` from this directory into `to_dir`; with `noreplace` the rename fails with
    /// `AlreadyExists` instead of replacing (`RENAME_NOREPLACE`). Not durable until both
    /// directories are synced.
    pub fn rename_to(
        &self,
        from: impl AsRef<OsStr>,
        to_dir: &Dir,
        to: impl AsRef<OsStr>,
        label: &str,
        noreplace: bool,
    ) -> Result<(), FsError> {
        let from = self.name(from.as_ref())?;
        let to = to_dir.name(to.as_ref())?;
        let to_path = to_dir.child_path(to);
        hit(label, RecordKind::Rename)
            .map_err(|e| FsError::io("rename into", to_path.clone(), e))?;
        let flags = if noreplace {
            RenameFlags::NOREPLACE
        } else {
            RenameFlags::empty()
        };
        // Tests force the answer of a filesystem without `RENAME_NOREPLACE` here.
        let forced = if noreplace {
            noreplace_refused()
        } else {
            Ok(())
        };
        let renamed = match forced {
            Ok(()) => rustix::fs::renameat_with(&self.fd, from, &to_dir.fd, to, flags),
            Err(e) => Err(e),
        };
        let renamed = match renamed {
            // NFS and many FUSE filesystems refuse the flag itself (issue 14): the same
            // no-replace step another way.
            Err(rustix::io::Errno::INVAL) if noreplace => {
                self.rename_noreplace_fallback(from, to_dir, to)
            }
            r => r,
        };
        renamed.map_err(|e| {
            if e == rustix::io::Errno::NOENT {
                FsError::NotFound {
                    path: self.child_path(from),
                }
            } else {
                FsError::io("rename into", to_path.clone(), e)
            }
        })?;
        record(
            RecordKind::Rename,
            &to_dir.path,
            to,
            Some(&self.child_path(from)),
        );
        Ok(())
    }

    /// `rename` without replacing, on a filesystem that refuses `RENAME_NOREPLACE` (`EINVAL`):
    /// a hard link to the new name, which fails with `EEXIST` if the name exists — the same
    /// atomic no-replace check — then the old name unlinked. Where hard links are refused too
    /// (a directory, or a filesystem without them), a file is copied into the new name created
    /// with `O_EXCL` and fsynced before the old name goes, and a directory is renamed after
    /// checking that the new name is free (only the lease holder writes these directories, so
    /// nobody can take the name in between).
    fn rename_noreplace_fallback(
        &self,
        from: &OsStr,
        to_dir: &Dir,
        to: &OsStr,
    ) -> Result<(), rustix::io::Errno> {
        use rustix::io::Errno;
        let linked = match noreplace_link_refused() {
            Ok(()) => rustix::fs::linkat(&self.fd, from, &to_dir.fd, to, AtFlags::empty()),
            Err(_) => Err(Errno::PERM),
        };
        match linked {
            Ok(()) => return rustix::fs::unlinkat(&self.fd, from, AtFlags::empty()),
            Err(Errno::PERM | Errno::OPNOTSUPP | Errno::NOSYS | Errno::MLINK | Errno::XDEV) => {}
            Err(e) => return Err(e),
        }
        let st = rustix::fs::statat(&self.fd, from, AtFlags::SYMLINK_NOFOLLOW)?;
        match rustix::fs::FileType::from_raw_mode(st.st_mode) {
            rustix::fs::FileType::Directory => {
                match rustix::fs::statat(&to_dir.fd, to, AtFlags::SYMLINK_NOFOLLOW) {
                    Ok(_) => Err(Errno::EXIST),
                    Err(Errno::NOENT) => rustix::fs::renameat(&self.fd, from, &to_dir.fd, to),
                    Err(e) => Err(e),
                }
            }
            rustix::fs::FileType::RegularFile => {
                let src = rustix::fs::openat(
                    &self.fd,
                    from,
                    OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                    Mode::empty(),
                )?;
                let dst = rustix::fs::openat(
                    &to_dir.fd,
                    to,
                    OFlags::WRONLY
                        | OFlags::CREATE
                        | OFlags::EXCL
                        | OFlags::NOFOLLOW
                        | OFlags::CLOEXEC,
                    Mode::from_raw_mode(st.st_mode & 0o777),
                )?;
                let mut out = File::from(dst);
                let copied = io::copy(&mut File::from(src), &mut out)
                    .map_err(|e| Errno::from_io_error(&e).unwrap_or(Errno::IO))
                    .and_then(|_| rustix::fs::fsync(&out));
                if let Err(e) = copied {
                    let _ = rustix::fs::unlinkat(&to_dir.fd, to, AtFlags::empty());
                    return Err(e);
                }
                rustix::fs::unlinkat(&self.fd, from, AtFlags::empty())
            }
            _ => Err(Errno::INVAL),
        }
    }

    /// fsync of this directory, making created, renamed and removed entries durable. A failure
    /// poisons the descriptor: later syncs fail with `Poisoned`.
    pub fn sync(&self, label: &str) -> Result<(), FsError> {
        if self.poisoned.load(Ordering::Acquire) {
            return Err(FsError::Poisoned {
                path: self.path.clone(),
            });
        }
        let res = hit(label, RecordKind::DirFsync)
            .and_then(|()| rustix::fs::fsync(&self.fd).map_err(io::Error::from));
        match res {
            Ok(()) => {
                record(RecordKind::DirFsync, &self.path, OsStr::new("."), None);
                Ok(())
            }
            Err(source) => {
                self.poisoned.store(true, Ordering::Release);
                Err(FsError::Fsync {
                    path: self.path.clone(),
                    source,
                })
            }
        }
    }

    /// Removes a file (not a directory). Not durable until [`Dir::sync`].
    pub fn unlink(&self, name: impl AsRef<OsStr>, label: &str) -> Result<(), FsError> {
        let name = self.name(name.as_ref())?;
        let path = self.child_path(name);
        hit(label, RecordKind::Unlink).map_err(|e| FsError::io("remove", path.clone(), e))?;
        rustix::fs::unlinkat(&self.fd, name, AtFlags::empty())
            .map_err(|e| FsError::io("remove", path.clone(), e))?;
        record(RecordKind::Unlink, &self.path, name, None);
        Ok(())
    }

    /// Removes an empty subdirectory. Not durable until [`Dir::sync`].
    pub fn remove_dir(&self, name: impl AsRef<OsStr>, label: &str) -> Result<(), FsError> {
        let name = self.name(name.as_ref())?;
        let path = self.child_path(name);
        hit(label, RecordKind::Unlink).map_err(|e| FsError::io("remove", path.clone(), e))?;
        rustix::fs::unlinkat(&self.fd, name, AtFlags::REMOVEDIR)
            .map_err(|e| FsError::io("remove", path.clone(), e))?;
        record(RecordKind::Unlink, &self.path, name, None);
        Ok(())
    }

    /// Removes the scratch tree `name` (a directory and everything below it; a missing name is
    /// fine) without recursion and with two directory descriptors at any depth: each
    /// subdirectory is emptied one level at a time, its own subdirectories hoisted up under
    /// fresh names. Links are unlinked, never followed. Nothing is synced: only for trees
    /// nothing durable refers to (staging areas, views, kept outputs).
    pub fn remove_tree(&self, name: impl AsRef<OsStr>, label: &str) -> Result<(), FsError> {
        scratch::remove_tree(self, name.as_ref(), label)
    }

    /// Hard-links `from` (in this directory) as `to` in `to_dir`, failing with `AlreadyExists` if
    /// `to` is taken. Never follows a link. Not durable until `to_dir` is synced.
    pub fn link_to(
        &self,
        from: impl AsRef<OsStr>,
        to_dir: &Dir,
        to: impl AsRef<OsStr>,
        label: &str,
    ) -> Result<(), FsError> {
        let from = self.name(from.as_ref())?;
        let to = to_dir.name(to.as_ref())?;
        let to_path = to_dir.child_path(to);
        hit(label, RecordKind::Link).map_err(|e| FsError::io("link", to_path.clone(), e))?;
        rustix::fs::linkat(&self.fd, from, &to_dir.fd, to, AtFlags::empty()).map_err(|e| {
            if e == rustix::io::Errno::NOENT {
                FsError::NotFound {
                    path: self.child_path(from),
                }
            } else {
                FsError::io("link", to_path.clone(), e)
            }
        })?;
        record(
            RecordKind::Link,
            &to_dir.path,
            to,
            Some(&self.child_path(from)),
        );
        Ok(())
    }

    /// A fresh stream over this directory's entries (its own open file description, so its
    /// position is its own): one `openat` of `.`, where `rustix::fs::Dir::read_from` first
    /// asks the flags with `fcntl` (issue 11: every listing of the run path paid for it).
    pub(crate) fn listing(&self) -> Result<rustix::fs::Dir, FsError> {
        let fd = rustix::fs::openat(
            &self.fd,
            c".",
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| FsError::io("list", self.path.clone(), e))?;
        rustix::fs::Dir::new(fd).map_err(|e| FsError::io("list", self.path.clone(), e))
    }

    /// The entries of this directory (without `.` and `..`), sorted by name, each classified by
    /// `lstat` semantics (a link is reported as a link).
    pub fn entries(&self) -> Result<Vec<Entry>, FsError> {
        let mut out = Vec::new();
        let iter = self.listing()?;
        for item in iter {
            let item = item.map_err(|e| FsError::io("list", self.path.clone(), e))?;
            let name = OsStr::from_bytes(item.file_name().to_bytes());
            if name == "." || name == ".." {
                continue;
            }
            let mut kind = FileKind::from_file_type(item.file_type());
            if kind == FileKind::Unknown {
                // Some filesystems do not fill d_type; ask lstat.
                if let Some(st) = self.stat(name)? {
                    kind = FileKind::of(&st);
                } else {
                    continue;
                }
            }
            out.push(Entry {
                name: name.to_owned(),
                kind,
            });
        }
        out.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(out)
    }

    /// Calls `f` with the name and kind of each entry (without `.` and `..`), in directory
    /// order, streaming: memory does not grow with the number of entries. `f` may remove or
    /// rename the entry it is given (entries added meanwhile may or may not be seen); it stops
    /// the listing by returning `Ok(false)`.
    pub fn for_each_entry<E: From<FsError>>(
        &self,
        mut f: impl FnMut(&OsStr, FileKind) -> Result<bool, E>,
    ) -> Result<(), E> {
        let iter = self.listing()?;
        for item in iter {
            let item = item.map_err(|e| FsError::io("list", self.path.clone(), e))?;
            let name = OsStr::from_bytes(item.file_name().to_bytes());
            if name == "." || name == ".." {
                continue;
            }
            let mut kind = FileKind::from_file_type(item.file_type());
            if kind == FileKind::Unknown {
                // Some filesystems do not fill d_type; ask lstat.
                match self.stat(name)? {
                    Some(st) => kind = FileKind::of(&st),
                    None => continue,
                }
            }
            if !f(name, kind)? {
                break;
            }
        }
        Ok(())
    }

    /// Removes temp files left by a crash (names starting with [`TEMP_PREFIX`]) and syncs the
    /// directory if any was removed; returns how many. Only the owner of the state dir may call
    /// this: a concurrent writer's temp file would be removed too.
    pub fn remove_temp_files(&self, label: &str) -> Result<usize, FsError> {
        let mut removed = 0;
        for entry in self.entries()? {
            if entry.kind == FileKind::Regular
                && entry.name.as_bytes().starts_with(TEMP_PREFIX.as_bytes())
            {
                match self.unlink(&entry.name, label) {
                    Ok(()) | Err(FsError::NotFound { .. }) => removed += 1,
                    Err(e) => return Err(e),
                }
            }
        }
        if removed > 0 {
            self.sync(label)?;
        }
        Ok(removed)
    }

    /// Durably replaces `name` with `bytes`: temp file, write, fsync, `renameat`, directory fsync.
    /// On any failure the temp file is removed, `name` keeps its old content (or is absent), and
    /// the error is returned; an fsync is never retried on the same descriptor.
    pub fn replace_durable(
        &self,
        name: impl AsRef<OsStr>,
        bytes: &[u8],
        label: &str,
    ) -> Result<(), FsError> {
        let name = self.name(name.as_ref())?;
        let mut tmp = self.create_temp(label)?;
        tmp.write_all(bytes)?;
        tmp.sync()?.rename_into(name)?;
        self.sync(label)
    }

    /// Atomically (but not durably) replaces `name` with `bytes`: temp file, write, `renameat`,
    /// no fsync. Readers see the old or the new content, never a mix; after a power loss the
    /// file may be missing or empty. Only for ephemeral evidence (waiter and registry entries)
    /// that readers tolerate losing and the next owner sweeps.
    pub fn replace_volatile(
        &self,
        name: impl AsRef<OsStr>,
        bytes: &[u8],
        label: &str,
    ) -> Result<(), FsError> {
        let name = self.name(name.as_ref())?;
        let mut tmp = self.create_temp(label)?;
        tmp.write_all(bytes)?;
        tmp.handed_over = true;
        let tmp_name = tmp.name.clone();
        drop(tmp);
        match self.rename(&tmp_name, name, label) {
            Ok(()) => Ok(()),
            Err(e) => {
                remove_abandoned(self, &tmp_name);
                Err(e)
            }
        }
    }
}

/// Checks a file opened for writing after the fact (a create may have raced with a planted file
/// only if `O_EXCL` was not used, but checking is cheap and keeps one rule for every open).
fn file_rw_checked(file: File, path: &Path) -> Result<File, FsError> {
    let st = rustix::fs::fstat(&file).map_err(|e| FsError::io("stat", path.to_path_buf(), e))?;
    check_file_stat(path, &st, Links::Single)?;
    Ok(file)
}

/// An exclusive temp file being written; removed on drop unless it was renamed into place.
#[derive(Debug)]
pub struct TempFile<'d> {
    dir: &'d Dir,
    name: OsString,
    label: String,
    file: Option<File>,
    handed_over: bool,
}

impl<'d> TempFile<'d> {
    /// The temp file's name in its directory.
    pub fn name(&self) -> &OsStr {
        &self.name
    }

    /// The full path (for messages).
    pub fn path(&self) -> PathBuf {
        self.dir.child_path(&self.name)
    }

    /// The open file, e.g. to `fchmod` a blob read-only before it is published.
    pub fn file(&self) -> &File {
        self.file
            .as_ref()
            .expect("a TempFile holds its file until it is consumed")
    }

    /// Writes all of `bytes` at the current position (crash point `<label>.write`).
    pub fn write_all(&mut self, bytes: &[u8]) -> Result<(), FsError> {
        use std::io::Write;
        let path = self.path();
        hit(&self.label, RecordKind::Write).map_err(|e| FsError::io("write", path.clone(), e))?;
        let file = self
            .file
            .as_mut()
            .expect("a TempFile holds its file until it is consumed");
        file.write_all(bytes)
            .map_err(|e| FsError::io("write", path, e))?;
        record(RecordKind::Write, &self.dir.path, &self.name, None);
        Ok(())
    }

    /// fsyncs the file (crash point `<label>.fsync`). Consumes the temp file: on error it is
    /// closed and removed, so its descriptor can never be fsynced again.
    pub fn sync(mut self) -> Result<SyncedTemp<'d>, FsError> {
        let path = self.path();
        let file = self
            .file
            .take()
            .expect("a TempFile holds its file until it is consumed");
        let res = hit(&self.label, RecordKind::Fsync)
            .and_then(|()| rustix::fs::fsync(&file).map_err(io::Error::from));
        drop(file);
        match res {
            Ok(()) => {
                record(RecordKind::Fsync, &self.dir.path, &self.name, None);
                // The entry now belongs to the `SyncedTemp`; this husk must not unlink it.
                self.handed_over = true;
                Ok(SyncedTemp {
                    dir: self.dir,
                    name: self.name.clone(),
                    label: self.label.clone(),
                    done: false,
                })
            }
            // Dropping `self` removes the abandoned temp file.
            Err(source) => Err(FsError::Fsync { path, source }),
        }
    }
}

impl Drop for TempFile<'_> {
    fn drop(&mut self) {
        self.file.take();
        if !self.handed_over {
            remove_abandoned(self.dir, &self.name);
        }
    }
}

/// Removes an abandoned temp file; failure only leaves a `.tmp-` file that the next owner sweeps.
fn remove_abandoned(dir: &Dir, name: &OsStr) {
    if rustix::fs::unlinkat(&dir.fd, name, AtFlags::empty()).is_ok() {
        record(RecordKind::Unlink, &dir.path, name, None);
    }
}

/// A temp file whose content is durable, waiting to be renamed into place.
#[derive(Debug)]
pub struct SyncedTemp<'d> {
    dir: &'d Dir,
    name: OsString,
    label: String,
    done: bool,
}

impl SyncedTemp<'_> {
    /// The temp file's name in its directory.
    pub fn name(&self) -> &OsStr {
        &self.name
    }

    /// Renames the file over `name` (crash point `<label>.rename`). The caller syncs the
    /// directory afterwards.
    pub fn rename_into(mut self, name: impl AsRef<OsStr>) -> Result<(), FsError> {
        self.dir
            .rename_to(&self.name, self.dir, name, &self.label, false)?;
        self.done = true;
        Ok(())
    }

    /// Renames the file to `name` only if `name` does not exist (`RENAME_NOREPLACE`); on
    /// `AlreadyExists` the temp file is removed and the existing file left alone.
    pub fn rename_into_new(mut self, name: impl AsRef<OsStr>) -> Result<(), FsError> {
        self.dir
            .rename_to(&self.name, self.dir, name, &self.label, true)?;
        self.done = true;
        Ok(())
    }

    /// Renames the file into another directory (same filesystem), optionally without replacing.
    pub fn rename_into_dir(
        mut self,
        to_dir: &Dir,
        name: impl AsRef<OsStr>,
        noreplace: bool,
    ) -> Result<(), FsError> {
        self.dir
            .rename_to(&self.name, to_dir, name, &self.label, noreplace)?;
        self.done = true;
        Ok(())
    }
}

impl Drop for SyncedTemp<'_> {
    fn drop(&mut self) {
        if !self.done {
            remove_abandoned(self.dir, &self.name);
        }
    }
}

//! The real executor of file operations as data ([`crate::fsop`]): every [`Op`] is performed
//! through the checked, descriptor-relative calls of this module, with the same crash points
//! and the same recorder as privfs's own methods.
//!
//! The executor owns every descriptor a protocol uses; the protocol holds [`Fd`] numbers.
//! Temp files it created and that were neither renamed nor removed when it is dropped are
//! removed then (best effort: a failed protocol leaves no `.tmp-` file behind, and whatever a
//! crash leaves the next owner sweeps); [`Exec::abandon`] drops the descriptors without that
//! cleanup, as a crash would.

use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;

use rustix::fs::{AtFlags, Mode};

use super::{Dir, FileKind, FsError, Links, RecordKind, TEMP_PREFIX, hit, random_hex, record};
use crate::checkpoint::hash;
use crate::fsop::{Check, Done, Executor, Fd, Meta, Op, Step, Summary};

/// Bytes copied between two writeback kicks of a large copy.
const WRITEBACK_KICK: u64 = 8 << 20;

/// The smallest copy whose tail is kicked into writeback when it ends. A smaller file is left
/// to the publish's one `syncfs`: a `sync_file_range` per small file submits that file's one
/// small write on its own (for a checkpoint of 100,000 small files, 100,000 system calls that
/// each allocate and submit), while the filesystem-wide flush writes them back in one sweep,
/// as it does for the plain writer + `sync -f` baseline.
const WRITEBACK_TAIL_MIN: u64 = 1 << 20;

/// What a handle holds.
enum Slot<'r> {
    Dir(Dir),
    /// A directory the caller keeps and lends for the executor's lifetime (no duplicate
    /// descriptor is made, and none is closed).
    Lent(&'r Dir),
    /// A directory shared with the caller, who keeps it beyond this executor (no duplicate
    /// descriptor; the last holder closes it).
    Shared(Arc<Dir>),
    File {
        file: File,
        path: PathBuf,
    },
    Input {
        reader: Box<dyn Read + 'r>,
        path: PathBuf,
    },
    List {
        iter: rustix::fs::Dir,
        path: PathBuf,
        /// The stream said it ended: later pages are empty without asking the kernel again.
        ended: bool,
    },
}

/// Performs [`Step`]s on the real filesystem, relative to a state dir's root (or any [`Dir`]).
pub struct Exec<'r> {
    root: &'r Dir,
    slots: Vec<Option<Slot<'r>>>,
    /// Temp files created and not yet renamed away or removed: (directory handle, name).
    temps: Vec<(Fd, OsString)>,
    buf: Vec<u8>,
    /// The effective uid, asked once per executor (every adopted file's `Sole` compares it).
    euid: Option<u32>,
}

impl std::fmt::Debug for Exec<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Exec")
            .field("root", &self.root.path())
            .field("open", &self.slots.iter().filter(|s| s.is_some()).count())
            .field("temps", &self.temps)
            .finish()
    }
}

fn is_big(size: u64) -> bool {
    size >= hash::PIPELINE_MIN
}

fn summary(s: hash::Summary) -> Summary {
    Summary {
        size: s.size,
        sha256: s.sha256.0,
    }
}

/// Starts writeback of the given range of `file` (`SYNC_FILE_RANGE_WRITE`): advice only.
fn start_writeback(file: &File, offset: u64, len: u64) {
    use std::os::fd::AsRawFd;
    // SAFETY: sync_file_range only reads its integer arguments; the descriptor is open for the
    // duration of the call because `file` is borrowed.
    unsafe {
        libc::sync_file_range(
            file.as_raw_fd(),
            offset as libc::off64_t,
            len as libc::off64_t,
            libc::SYNC_FILE_RANGE_WRITE,
        );
    }
}

impl<'r> Exec<'r> {
    /// An executor whose [`Fd::ROOT`] is `root` (a state dir's root, or a store directory).
    pub fn new(root: &'r Dir) -> Exec<'r> {
        Exec {
            root,
            slots: vec![None],
            temps: Vec::new(),
            buf: Vec::new(),
            euid: None,
        }
    }

    fn put(&mut self, slot: Slot<'r>) -> Fd {
        let i = match self.slots.iter().skip(1).position(Option::is_none) {
            Some(i) => i + 1,
            None => {
                self.slots.push(None);
                self.slots.len() - 1
            }
        };
        self.slots[i] = Some(slot);
        Fd(i as u32)
    }

    /// Hands an open file to the executor (e.g. an input of a publish), for ops that read it.
    pub fn adopt_file(&mut self, file: File, path: PathBuf) -> Fd {
        self.put(Slot::File { file, path })
    }

    /// Hands a reader to the executor (an input of a publish), for [`Op::Copy`].
    pub fn adopt_reader(&mut self, reader: Box<dyn Read + 'r>, path: PathBuf) -> Fd {
        self.put(Slot::Input { reader, path })
    }

    /// Hands an open directory to the executor.
    pub fn adopt_dir(&mut self, dir: Dir) -> Fd {
        self.put(Slot::Dir(dir))
    }

    /// Lends a directory the caller keeps open to the executor: the same handle, shared
    /// poisoning included, without the `dup` and `close` of [`Exec::adopt_dir`] (issue 11:
    /// every operation of the owned store ran on three duplicates of its directories).
    pub fn lend_dir(&mut self, dir: &'r Dir) -> Fd {
        self.put(Slot::Lent(dir))
    }

    /// Hands the executor a directory shared with the caller (see [`Exec::share`]).
    pub fn share_dir(&mut self, dir: Arc<Dir>) -> Fd {
        self.put(Slot::Shared(dir))
    }

    /// The directory of handle `fd`, made shared (in place: `fd` stays valid) so that the
    /// caller can keep it beyond this executor and hand it to a later one with
    /// [`Exec::share_dir`]; `None` when `fd` is not a directory this executor owns or shares.
    pub fn share(&mut self, fd: Fd) -> Option<Arc<Dir>> {
        let slot = self.slots.get_mut(fd.0 as usize)?;
        match slot.take() {
            Some(Slot::Dir(d)) => {
                let d = Arc::new(d);
                *slot = Some(Slot::Shared(Arc::clone(&d)));
                Some(d)
            }
            Some(Slot::Shared(d)) => {
                *slot = Some(Slot::Shared(Arc::clone(&d)));
                Some(d)
            }
            other => {
                *slot = other;
                None
            }
        }
    }

    /// Takes a directory out of the executor (e.g. one a plan opened, for its caller to keep).
    pub fn take_dir(&mut self, fd: Fd) -> Option<Dir> {
        match self.take_slot(fd) {
            Some(Slot::Dir(d)) => Some(d),
            Some(other) => {
                self.slots[fd.0 as usize] = Some(other);
                None
            }
            None => None,
        }
    }

    /// The directory behind a handle.
    pub fn dir(&self, fd: Fd) -> Result<&Dir, FsError> {
        if fd == Fd::ROOT {
            return Ok(self.root);
        }
        match self.slots.get(fd.0 as usize) {
            Some(Some(Slot::Dir(d))) => Ok(d),
            Some(Some(Slot::Lent(d))) => Ok(d),
            Some(Some(Slot::Shared(d))) => Ok(d),
            Some(Some(Slot::File { .. } | Slot::Input { .. } | Slot::List { .. }) | None)
            | None => Err(bad_handle(fd, "directory")),
        }
    }

    /// The path of a directory handle (for messages).
    pub fn dir_path(&self, fd: Fd) -> PathBuf {
        self.dir(fd)
            .map(|d| d.path().to_path_buf())
            .unwrap_or_else(|_| PathBuf::from(format!("<handle {}>", fd.0)))
    }

    fn file(&mut self, fd: Fd) -> Result<(&mut File, &Path), FsError> {
        match self.slots.get_mut(fd.0 as usize) {
            Some(Some(Slot::File { file, path })) => Ok((file, path)),
            Some(
                Some(
                    Slot::Dir(_)
                    | Slot::Lent(_)
                    | Slot::Shared(_)
                    | Slot::Input { .. }
                    | Slot::List { .. },
                )
                | None,
            )
            | None => Err(bad_handle(fd, "file")),
        }
    }

    fn untrack(&mut self, dir: Fd, name: &OsStr) {
        self.temps.retain(|(d, n)| !(*d == dir && n == name));
    }

    /// Drops every descriptor without removing the temp files created: what a crash leaves.
    pub fn abandon(mut self) {
        self.temps.clear();
    }

    fn take_slot(&mut self, fd: Fd) -> Option<Slot<'r>> {
        self.slots.get_mut(fd.0 as usize).and_then(Option::take)
    }

    fn copy(
        &mut self,
        label: &str,
        to: Fd,
        from: Fd,
        limit: Option<u64>,
        writeback: bool,
    ) -> Result<Done, FsError> {
        let mut src = self
            .take_slot(from)
            .ok_or_else(|| bad_handle(from, "input"))?;
        let res = self.copy_from(label, to, &mut src, limit, writeback);
        self.slots[from.0 as usize] = Some(src);
        res
    }

    fn copy_from(
        &mut self,
        label: &str,
        to: Fd,
        src: &mut Slot<'r>,
        limit: Option<u64>,
        writeback: bool,
    ) -> Result<Done, FsError> {
        let (reader, src_path, known): (&mut dyn Read, &Path, Option<u64>) = match src {
            Slot::File { file, path } => {
                let len = file
                    .metadata()
                    .map_err(|e| FsError::io("stat", path.clone(), e))?
                    .len();
                (file, path, Some(len))
            }
            Slot::Input { reader, path } => (reader.as_mut(), path, None),
            Slot::Dir(_) | Slot::Lent(_) | Slot::Shared(_) | Slot::List { .. } => {
                return Err(bad_handle(to, "input"));
            }
        };
        let src_path = src_path.to_path_buf();
        if self.buf.is_empty() {
            self.buf = hash::buffer();
        }
        let mut buf = std::mem::take(&mut self.buf);
        let (out, out_path) = self.file(to)?;
        let out_path = out_path.to_path_buf();
        hit(label, RecordKind::Write).map_err(|e| FsError::io("write", out_path.clone(), e))?;
        let mut kicked = 0u64;
        let mut sink = |chunk: &[u8], offset: u64| -> Result<(), FsError> {
            out.write_all(chunk)
                .map_err(|e| FsError::io("write", out_path.clone(), e))?;
            let end = offset + chunk.len() as u64;
            if writeback && end - kicked >= WRITEBACK_KICK {
                start_writeback(out, kicked, end - kicked);
                kicked = end;
            }
            Ok(())
        };
        let big = known.is_none_or(is_big);
        let res = if big {
            hash::pipe(reader, limit, &mut sink)
        } else {
            hash::copy_small(reader, limit.unwrap_or(u64::MAX), &mut buf, &mut sink)
        };
        self.buf = buf;
        let got = res.map_err(|e| match e {
            hash::PipeError::Read(e) => FsError::io("read", src_path, e),
            hash::PipeError::Sink(e) => e,
        })?;
        let (out, _) = self.file(to)?;
        if writeback && got.size > kicked && got.size >= WRITEBACK_TAIL_MIN {
            start_writeback(out, kicked, got.size - kicked);
        }
        let (dir, name) = split(&out_path);
        record(RecordKind::Write, dir, name, None);
        Ok(Done::Hashed(summary(got)))
    }

    /// Hashes `file` from its position: a large file on two threads (reading and hashing
    /// overlap, one stream at SHA-NI speed), a small one through the executor's buffer.
    fn hash_file(
        file: &mut File,
        path: &Path,
        limit: Option<u64>,
        buf: &mut Vec<u8>,
        helper: bool,
    ) -> Result<Summary, FsError> {
        let len = file
            .metadata()
            .map_err(|e| FsError::io("stat", path.to_path_buf(), e))?
            .len();
        let limit = limit.unwrap_or(u64::MAX);
        // A large file's dirty pages (a staged file the publish adopts, written by the child
        // just before) start writing back now, while the hash reads them, instead of after
        // it in the publish's flush; for a clean file (a load's verify) this finds nothing to
        // write.
        if len.min(limit) >= WRITEBACK_TAIL_MIN {
            start_writeback(file, 0, len.min(limit));
        }
        let mut r = file.take(limit);
        let got = if helper && is_big(len.min(limit)) {
            hash::digest_fast(&mut r, len.min(limit), &mut [])
        } else {
            if buf.is_empty() {
                *buf = hash::buffer();
            }
            hash::digest_reader(&mut r, buf)
        }
        .map_err(|e| FsError::io("read", path.to_path_buf(), e))?;
        Ok(summary(got))
    }

    fn create_temp(&mut self, label: &str, dir: Fd) -> Result<Done, FsError> {
        let d = self.dir(dir)?;
        loop {
            let name = OsString::from(format!("{TEMP_PREFIX}{}", random_hex(8)));
            match d.create_exclusive(&name, label) {
                Ok(file) => {
                    let path = d.child_path(&name);
                    let fd = self.put(Slot::File { file, path });
                    self.temps.push((dir, name.clone()));
                    return Ok(Done::Created { fd, name });
                }
                // 64 random bits collide only if someone planted the name; draw again.
                Err(FsError::AlreadyExists { .. }) => continue,
                Err(e) => return Err(e),
            }
        }
    }

    fn fsync(&mut self, label: &str, fd: Fd, data_only: bool) -> Result<Done, FsError> {
        let Some(Slot::File { file, path }) = self.take_slot(fd) else {
            return Err(bad_handle(fd, "file"));
        };
        let res = hit(label, RecordKind::Fsync).and_then(|()| {
            if data_only {
                rustix::fs::fdatasync(&file).map_err(io::Error::from)
            } else {
                rustix::fs::fsync(&file).map_err(io::Error::from)
            }
        });
        match res {
            Ok(()) => {
                let (dir, name) = split(&path);
                record(RecordKind::Fsync, dir, name, None);
                self.slots[fd.0 as usize] = Some(Slot::File { file, path });
                Ok(Done::Ok)
            }
            Err(source) => {
                // The file is closed (it stays out of the table) and never fsynced again; a
                // temp file is abandoned at once.
                drop(file);
                let (dir_path, name) = split(&path);
                if let Some(pos) = self.temps.iter().position(|(d, n)| {
                    n.as_os_str() == name && self.dir_path(*d).as_path() == dir_path
                }) {
                    let (d, n) = self.temps.remove(pos);
                    if let Ok(dir) = self.dir(d) {
                        remove_abandoned(dir, &n);
                    }
                }
                Err(FsError::Fsync { path, source })
            }
        }
    }

    fn list_next(&mut self, list: Fd, max: usize) -> Result<Done, FsError> {
        let Some(Some(Slot::List { iter, path, ended })) = self.slots.get_mut(list.0 as usize)
        else {
            return Err(bad_handle(list, "listing"));
        };
        let mut out = Vec::new();
        while out.len() < max && !*ended {
            let Some(item) = iter.next() else {
                *ended = true;
                break;
            };
            let item = item.map_err(|e| FsError::io("list", path.clone(), e))?;
            let name = OsStr::from_bytes(item.file_name().to_bytes());
            if name == "." || name == ".." {
                continue;
            }
            let mut kind = FileKind::from_file_type(item.file_type());
            if kind == FileKind::Unknown {
                // Some filesystems do not fill d_type; ask lstat (relative to the listing's
                // own descriptor: a `stat` does not move its position).
                let fd = iter
                    .fd()
                    .map_err(|e| FsError::io("list", path.clone(), e))?;
                match rustix::fs::statat(fd, name, AtFlags::SYMLINK_NOFOLLOW) {
                    Ok(st) => kind = FileKind::of(&st),
                    Err(rustix::io::Errno::NOENT) => continue,
                    Err(e) => return Err(FsError::io("look at", path.join(name), e)),
                }
            }
            out.push((name.to_owned(), kind));
        }
        Ok(Done::Entries(out))
    }
}

fn split(path: &Path) -> (&Path, &OsStr) {
    (
        path.parent().unwrap_or(Path::new("/")),
        path.file_name().unwrap_or(path.as_os_str()),
    )
}

fn bad_handle(fd: Fd, want: &str) -> FsError {
    FsError::Io {
        op: "use",
        path: PathBuf::from(format!("<handle {}>", fd.0)),
        source: io::Error::other(format!(
            "handle {} is not an open {want} (a protocol bug)",
            fd.0
        )),
    }
}

/// The `HashFile` step: opens `name` in `dir` (any link count: content-addressed files are
/// checked by digest, not trusted), hashes it to its end or `limit` bytes and closes it. The
/// executor runs it, and so do the threads of a parallel verify, so the step is one function.
/// With `helper`, a large file is read on this thread and hashed on a helper thread (one big
/// blob at full speed); without, it is read and hashed here (each thread of a parallel verify
/// busy with its own blob: a helper would only add threads to cores that are already full).
pub fn hash_file_at(
    dir: &Dir,
    name: &OsStr,
    limit: Option<u64>,
    buf: &mut Vec<u8>,
    helper: bool,
) -> Result<Summary, FsError> {
    let mut file = dir.open_file_with(name, Links::Any)?;
    Exec::hash_file(&mut file, &dir.child_path(name), limit, buf, helper)
}

/// Removes an abandoned temp file; failure only leaves a `.tmp-` file that the next owner
/// sweeps.
fn remove_abandoned(dir: &Dir, name: &OsStr) {
    if rustix::fs::unlinkat(dir, name, AtFlags::empty()).is_ok() {
        record(RecordKind::Unlink, dir.path(), name, None);
    }
}

impl Executor for Exec<'_> {
    fn run(&mut self, step: Step<'_>) -> Result<Done, FsError> {
        let label = step.label;
        match step.op {
            Op::OpenDir {
                dir,
                name,
                any_mode,
            } => {
                let d = self.dir(dir)?;
                let sub = if any_mode {
                    d.open_dir_reclaiming(name)?
                } else {
                    d.open_dir(name)?
                };
                Ok(Done::Opened {
                    fd: self.put(Slot::Dir(sub)),
                    size: 0,
                })
            }
            Op::Mkdir { dir, name } => {
                self.dir(dir)?.mkdir(name, label)?;
                Ok(Done::Ok)
            }
            Op::CreateTemp { dir } => self.create_temp(label, dir),
            Op::CreateNew { dir, name } => {
                let d = self.dir(dir)?;
                let file = d.create_exclusive(name, label)?;
                let path = d.child_path(name);
                Ok(Done::Created {
                    fd: self.put(Slot::File { file, path }),
                    name: name.to_owned(),
                })
            }
            Op::Open { dir, name, check } => {
                let d = self.dir(dir)?;
                let file = match check {
                    Check::Private => d.open_file_with(name, Links::Single)?,
                    Check::AnyLinks => d.open_file_with(name, Links::Any)?,
                    Check::AnyMode => d.open_file_any_mode(name)?,
                };
                let path = d.child_path(name);
                let size = file
                    .metadata()
                    .map_err(|e| FsError::io("stat", path.clone(), e))?
                    .len();
                Ok(Done::Opened {
                    fd: self.put(Slot::File { file, path }),
                    size,
                })
            }
            Op::Read { fd, max } => {
                let (file, path) = self.file(fd)?;
                let mut out = Vec::new();
                file.take(max as u64)
                    .read_to_end(&mut out)
                    .map_err(|e| FsError::io("read", path.to_path_buf(), e))?;
                Ok(Done::Data(out))
            }
            Op::ReadFile { dir, name, max } => {
                let d = self.dir(dir)?;
                Ok(Done::Data(d.read(name, max)?))
            }
            Op::Rewind { fd } => {
                let (file, path) = self.file(fd)?;
                file.seek(SeekFrom::Start(0))
                    .map_err(|e| FsError::io("seek", path.to_path_buf(), e))?;
                Ok(Done::Ok)
            }
            Op::Write { fd, bytes } => {
                let (_, path) = self.file(fd)?;
                let path = path.to_path_buf();
                hit(label, RecordKind::Write).map_err(|e| FsError::io("write", path.clone(), e))?;
                let (file, _) = self.file(fd)?;
                file.write_all(bytes)
                    .map_err(|e| FsError::io("write", path.clone(), e))?;
                let (dir, name) = split(&path);
                record(RecordKind::Write, dir, name, None);
                Ok(Done::Ok)
            }
            Op::WriteAt {
                dir,
                name,
                offset,
                bytes,
            } => {
                let d = self.dir(dir)?;
                let (file, size) = d.write_at(name, offset, bytes, label)?;
                let path = d.child_path(name);
                Ok(Done::Opened {
                    fd: self.put(Slot::File { file, path }),
                    size,
                })
            }
            Op::Copy {
                to,
                from,
                limit,
                writeback,
            } => self.copy(label, to, from, limit, writeback),
            Op::Hash { fd, limit } => {
                let mut buf = std::mem::take(&mut self.buf);
                let res = self.file(fd).and_then(|(file, path)| {
                    let path = path.to_path_buf();
                    Self::hash_file(file, &path, limit, &mut buf, true)
                });
                self.buf = buf;
                Ok(Done::Hashed(res?))
            }
            Op::HashFile { dir, name, limit } => {
                let mut buf = std::mem::take(&mut self.buf);
                let res = self
                    .dir(dir)
                    .and_then(|d| hash_file_at(d, name, limit, &mut buf, true));
                self.buf = buf;
                Ok(Done::Hashed(res?))
            }
            Op::Chmod { fd, mode } => {
                let (file, path) = self.file(fd)?;
                rustix::fs::fchmod(&*file, Mode::from_raw_mode(mode))
                    .map_err(|e| FsError::io("change the mode of", path.to_path_buf(), e))?;
                Ok(Done::Ok)
            }
            Op::Fsync { fd, data_only } => self.fsync(label, fd, data_only),
            Op::Close { fd } => {
                if fd != Fd::ROOT {
                    self.take_slot(fd);
                }
                Ok(Done::Ok)
            }
            Op::Rename {
                from_dir,
                from,
                to_dir,
                to,
                noreplace,
            } => {
                let src = self.dir(from_dir)?;
                let dst = self.dir(to_dir)?;
                src.rename_to(from, dst, to, label, noreplace)?;
                self.untrack(from_dir, from);
                Ok(Done::Ok)
            }
            Op::Unlink { dir, name } => {
                self.dir(dir)?.unlink(name, label)?;
                self.untrack(dir, name);
                Ok(Done::Ok)
            }
            Op::LinkFd { fd, to_dir, to } => {
                // Out of its slot while linked (the destination is borrowed from the table),
                // back in it whatever the outcome.
                let (file, from) = match self.take_slot(fd) {
                    Some(Slot::File { file, path }) => (file, path),
                    other => {
                        if let Some(slot) = other {
                            self.slots[fd.0 as usize] = Some(slot);
                        }
                        return Err(bad_handle(fd, "file"));
                    }
                };
                let linked = self.dir(to_dir).and_then(|dst| {
                    let to = dst.name(to)?;
                    let to_path = dst.child_path(to);
                    hit(label, RecordKind::Link)
                        .and_then(|()| link_handle(&file, dst, to).map_err(io::Error::from))
                        .map_err(|e| FsError::io("link", to_path, e))?;
                    record(RecordKind::Link, dst.path(), to, Some(&from));
                    Ok(Done::Ok)
                });
                self.slots[fd.0 as usize] = Some(Slot::File { file, path: from });
                linked
            }
            Op::Sole { fd, links } => {
                let euid = *self
                    .euid
                    .get_or_insert_with(|| rustix::process::geteuid().as_raw());
                let (file, path) = self.file(fd)?;
                let st = rustix::fs::fstat(&*file)
                    .map_err(|e| FsError::io("stat", path.to_path_buf(), e))?;
                Ok(Done::Sole(
                    st.st_nlink == links && st.st_uid == euid && no_writer(file),
                ))
            }
            Op::Rmdir { dir, name } => {
                self.dir(dir)?.remove_dir(name, label)?;
                Ok(Done::Ok)
            }
            Op::RemoveTree { dir, name } => {
                self.dir(dir)?.remove_tree(name, label)?;
                Ok(Done::Ok)
            }
            Op::SyncDir { dir } => {
                self.dir(dir)?.sync(label)?;
                Ok(Done::Ok)
            }
            Op::SyncFs { dir } => {
                let d = self.dir(dir)?;
                let res = hit(label, RecordKind::SyncFs)
                    .and_then(|()| rustix::fs::syncfs(d).map_err(io::Error::from));
                match res {
                    Ok(()) => {
                        record(RecordKind::SyncFs, d.path(), OsStr::new("."), None);
                        Ok(Done::Ok)
                    }
                    Err(source) => Err(FsError::Fsync {
                        path: d.path().to_path_buf(),
                        source,
                    }),
                }
            }
            Op::Stat { dir, name } => {
                let st = self.dir(dir)?.stat(name)?;
                Ok(Done::Stat(st.map(|st| Meta {
                    kind: FileKind::of(&st),
                    size: st.st_size as u64,
                })))
            }
            Op::List { dir } => {
                let d = self.dir(dir)?;
                let iter = d.listing()?;
                let path = d.path().to_path_buf();
                Ok(Done::Opened {
                    fd: self.put(Slot::List {
                        iter,
                        path,
                        ended: false,
                    }),
                    size: 0,
                })
            }
            Op::ListNext { list, max } => self.list_next(list, max),
        }
    }
}

impl Drop for Exec<'_> {
    fn drop(&mut self) {
        // Close every file first, then remove the temp files nobody renamed.
        for slot in &mut self.slots {
            if matches!(slot, Some(Slot::File { .. } | Slot::Input { .. })) {
                *slot = None;
            }
        }
        for (dir, name) in std::mem::take(&mut self.temps) {
            if let Ok(d) = self.dir(dir) {
                remove_abandoned(d, &name);
            }
        }
    }
}

impl Dir {
    /// `mkdir` of `name` (0700) in this directory, nothing else: the new entry is not durable
    /// until this directory is synced.
    pub fn mkdir(&self, name: impl AsRef<OsStr>, label: &str) -> Result<(), FsError> {
        let name = self.name(name.as_ref())?;
        let path = self.child_path(name);
        hit(label, RecordKind::Mkdir).map_err(|e| FsError::io("create", path.clone(), e))?;
        rustix::fs::mkdirat(&self.fd, name, Mode::from_raw_mode(0o700))
            .map_err(|e| FsError::io("create", path.clone(), e))?;
        record(RecordKind::Mkdir, &self.path, name, None);
        Ok(())
    }
}

/// Whether `linkat(AT_EMPTY_PATH)` was refused in this process (a kernel before 6.10 grants it
/// only with `CAP_DAC_READ_SEARCH`): from then on handles are linked through /proc at once.
static EMPTY_PATH_REFUSED: AtomicBool = AtomicBool::new(false);

/// Gives the file of handle `file` the name `to` in `dst` (linkat(2)): by the handle itself
/// (`AT_EMPTY_PATH`, which Linux grants the process that opened the file since 6.10, and to
/// any process with `CAP_DAC_READ_SEARCH`), else through its /proc name, which needs the path
/// walk of `/proc/self/fd/N` per link (a publish of 100,000 files links each).
fn link_handle(file: &File, dst: &Dir, to: &OsStr) -> rustix::io::Result<()> {
    if !EMPTY_PATH_REFUSED.load(Ordering::Relaxed) {
        match rustix::fs::linkat(file, c"", dst, to, AtFlags::EMPTY_PATH) {
            Err(rustix::io::Errno::NOENT) => {}
            done => return done,
        }
    }
    let proc = format!("/proc/self/fd/{}", file.as_raw_fd());
    let done = rustix::fs::linkat(
        rustix::fs::CWD,
        proc.as_str(),
        dst,
        to,
        AtFlags::SYMLINK_FOLLOW,
    );
    // Refused by the handle and linked by its /proc name: the kernel wants the capability (an
    // `ENOENT` of both is the file's own, say unlinked, and teaches nothing).
    if done.is_ok() {
        EMPTY_PATH_REFUSED.store(true, Ordering::Relaxed);
    }
    done
}

/// Whether no process holds `file` open for writing (or mapped writable): a read lease is
/// taken and given back at once, which the kernel grants only when no open file description of
/// the inode is writable. Should a writer open the file in between, the kernel starts breaking
/// the lease (its open waits for our release) and signals us: that signal is made `SIGURG`,
/// which is ignored unless handled, and the broken lease answers `false`. Leases disabled
/// (`fs.leases-enable`), unsupported by the filesystem or refused answer `false`: the caller
/// then copies.
fn no_writer(file: &File) -> bool {
    /// `F_SETSIG` (fcntl(2); the same on every Linux architecture, not exported by libc).
    const F_SETSIG: libc::c_int = 10;
    let fd = file.as_raw_fd();
    // SAFETY: fcntl with integer arguments on a descriptor this executor owns; no memory is
    // passed to the kernel.
    unsafe {
        if libc::fcntl(fd, F_SETSIG, libc::SIGURG) != 0 {
            return false;
        }
        if libc::fcntl(fd, libc::F_SETLEASE, libc::F_RDLCK) != 0 {
            return false;
        }
        let held = libc::fcntl(fd, libc::F_GETLEASE) == libc::F_RDLCK;
        libc::fcntl(fd, libc::F_SETLEASE, libc::F_UNLCK);
        held
    }
}

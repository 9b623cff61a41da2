//! File operations as data: the vocabulary the store and lease protocols speak (design.md,
//! "Protocols as data").
//!
//! A protocol (a publish, a GC, an acquisition) is a pure step machine: it yields one [`Step`] at
//! a time — an [`Op`] naming handles and names, never a descriptor — and consumes the result
//! ([`Done`] or an [`FsError`]). An [`Executor`] performs the steps: [`crate::privfs::Exec`] on
//! the real filesystem, the models' crash filesystem (`tenure_models::fs::SimFs`) on an
//! inode-based simulation that loses what was not made durable. The same step machine runs in
//! both worlds, so no operation sequence is written twice (quinn-proto's split between protocol
//! state and I/O is the model).
//!
//! Rules the vocabulary enforces:
//! - The protocol owns no descriptor. It holds [`Fd`] numbers the executor hands out; the
//!   executor owns the descriptors and closes them when told ([`Op::Close`]) or when it is
//!   dropped.
//! - Every durability step is an op of its own: [`Op::Fsync`] (a file's data), [`Op::SyncDir`]
//!   (a directory's entries), [`Op::SyncFs`] (everything on the filesystem). No other op syncs
//!   anything; in particular [`Op::Mkdir`] and [`Op::Rename`] are not durable until the
//!   directories they changed are synced.
//! - Expected outcomes are errors the protocol inspects: a missing name is
//!   [`FsError::NotFound`], a taken one [`FsError::AlreadyExists`]; everything else ends the
//!   protocol.
//!
//! Each step carries a label (`publish.blob`, `epoch`): the real executor calls the crash point
//! `<label>.<step>` before it performs the step and records it (feature `failpoints`), exactly as
//! privfs's own methods do, and the models print it in counterexamples.

use std::ffi::{OsStr, OsString};

use crate::privfs::{FileKind, FsError};

/// A handle on a file or directory the executor holds open for a protocol. The protocol keeps
/// the number; the descriptor stays with the executor.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Fd(pub u32);

impl Fd {
    /// The state dir itself, open for the executor's whole life.
    pub const ROOT: Fd = Fd(0);
}

/// How a file opened for reading is checked after it is opened (see `crate::privfs`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Check {
    /// A private regular file with one link (records).
    Private,
    /// A private regular file with any number of links (content-addressed blobs).
    AnyLinks,
    /// A regular file we own, with any mode bits and links: a file a child wrote in a private
    /// directory (a staging area).
    AnyMode,
}

/// One file operation. Names are single path components inside the directory handle given.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op<'a> {
    /// Opens the existing subdirectory `name` of `dir` ([`Done::Opened`], size 0). With
    /// `any_mode` its mode bits are not checked (a directory a child made), and one its owner
    /// made unreadable is made 0700 first (a kept output is renamed, which needs that anyway).
    OpenDir {
        /// Parent directory.
        dir: Fd,
        /// Subdirectory name.
        name: &'a OsStr,
        /// Accept any mode bits.
        any_mode: bool,
    },
    /// Creates the subdirectory `name` (0700). Not durable until `dir` is synced.
    Mkdir {
        /// Parent directory.
        dir: Fd,
        /// New name.
        name: &'a OsStr,
    },
    /// Creates an exclusive temp file (`.tmp-<unique>`, 0600) in `dir`, open for writing
    /// ([`Done::Created`]). Not durable until `dir` is synced.
    CreateTemp {
        /// Directory.
        dir: Fd,
    },
    /// Creates `name` exclusively (0600), open for writing ([`Done::Created`]).
    CreateNew {
        /// Directory.
        dir: Fd,
        /// New name.
        name: &'a OsStr,
    },
    /// Opens an existing file for reading, checked as `check` says ([`Done::Opened`] with its
    /// size).
    Open {
        /// Directory.
        dir: Fd,
        /// File name.
        name: &'a OsStr,
        /// The check after opening.
        check: Check,
    },
    /// Reads up to `max` bytes at the file's position ([`Done::Data`], empty at end of file).
    Read {
        /// An open file.
        fd: Fd,
        /// At most this many bytes.
        max: usize,
    },
    /// Reads a whole private record, refusing one above `max` bytes ([`FsError::TooLarge`]).
    ReadFile {
        /// Directory.
        dir: Fd,
        /// File name.
        name: &'a OsStr,
        /// Largest size accepted.
        max: u64,
    },
    /// Moves an open file's position back to its start.
    Rewind {
        /// An open file.
        fd: Fd,
    },
    /// Appends `bytes` at the file's position.
    Write {
        /// A file open for writing.
        fd: Fd,
        /// The bytes.
        bytes: &'a [u8],
    },
    /// Opens the existing private file `name` of `dir` for writing (never creating or
    /// truncating it), writes `bytes` at `offset` in place (`pwrite`) and returns the handle
    /// ([`Done::Opened`] with the file's size after the write), so that the write can be
    /// synced ([`Op::Fsync`]) and closed. Unlike a replace through a temp file and a rename,
    /// making it durable needs no directory sync; but until the file is synced a power loss
    /// may leave the written range old, new or torn (garbage), so a protocol that writes in
    /// place must tell a torn range from a whole one (a checksum) and keep a valid copy
    /// elsewhere (the epoch file's two slots).
    WriteAt {
        /// Directory.
        dir: Fd,
        /// File name.
        name: &'a OsStr,
        /// Where the bytes go.
        offset: u64,
        /// The bytes.
        bytes: &'a [u8],
    },
    /// Copies `from` (to its end, or to `limit` bytes) into `to` at its position while
    /// hashing the bytes ([`Done::Hashed`]). With `writeback`, writeback of the copy is started
    /// as it goes (`sync_file_range(SYNC_FILE_RANGE_WRITE)`) for a large copy; a small one is
    /// left to the later sync, which writes many small files back together. Advice that makes
    /// a later sync cheaper, never a durability step.
    Copy {
        /// A file open for writing.
        to: Fd,
        /// A file or input open for reading.
        from: Fd,
        /// Stop after this many bytes.
        limit: Option<u64>,
        /// Start writeback as the copy goes.
        writeback: bool,
    },
    /// Reads an open file to its end (or to `limit` bytes) and hashes it ([`Done::Hashed`]).
    Hash {
        /// An open file.
        fd: Fd,
        /// Stop after this many bytes.
        limit: Option<u64>,
    },
    /// Opens `name` ([`Check::AnyLinks`]), hashes it to its end or to `limit` bytes, and closes
    /// it ([`Done::Hashed`]): the read-and-verify step. Independent of every other op, so an
    /// executor may run several at once.
    HashFile {
        /// Directory.
        dir: Fd,
        /// File name.
        name: &'a OsStr,
        /// Stop after this many bytes.
        limit: Option<u64>,
    },
    /// Changes an open file's permission bits (e.g. a blob made read-only).
    Chmod {
        /// An open file.
        fd: Fd,
        /// The new bits.
        mode: u32,
    },
    /// Makes an open file's data durable (`fsync`, or `fdatasync` with `data_only`). On
    /// failure the executor closes the file: it is never fsynced again.
    Fsync {
        /// An open file.
        fd: Fd,
        /// `fdatasync` instead of `fsync`.
        data_only: bool,
    },
    /// Closes a handle.
    Close {
        /// The handle.
        fd: Fd,
    },
    /// Renames `from` in `from_dir` to `to` in `to_dir` — one atomic entry operation. With
    /// `noreplace` an existing `to` is [`FsError::AlreadyExists`]. Not durable until the
    /// directories are synced.
    Rename {
        /// Source directory.
        from_dir: Fd,
        /// Source name.
        from: &'a OsStr,
        /// Target directory.
        to_dir: Fd,
        /// Target name.
        to: &'a OsStr,
        /// Fail instead of replacing.
        noreplace: bool,
    },
    /// Gives the open file `fd` the name `to` in `to_dir` as well: a hard link to the very
    /// file the handle holds, whatever its old name names now ([`FsError::AlreadyExists`] when
    /// `to` is taken). Refused without a change where the file cannot be linked there (another
    /// filesystem, hard links not supported or not permitted). Not durable until `to_dir` is
    /// synced; the file's data is as durable as it was.
    LinkFd {
        /// An open file.
        fd: Fd,
        /// Target directory.
        to_dir: Fd,
        /// Target name.
        to: &'a OsStr,
    },
    /// Whether the open file `fd` is ours alone ([`Done::Sole`]): it has exactly `links` names
    /// and no process holds it open for writing or mapped writable (a read lease can be taken,
    /// which the kernel grants only then). Any doubt (leases unsupported or disabled, a file of
    /// another owner) answers `false`. Changes nothing.
    Sole {
        /// An open file (read-only).
        fd: Fd,
        /// The number of names it must have.
        links: u64,
    },
    /// Removes a file (not a directory). Not durable until `dir` is synced.
    Unlink {
        /// Directory.
        dir: Fd,
        /// File name.
        name: &'a OsStr,
    },
    /// Removes an empty subdirectory. Not durable until `dir` is synced.
    Rmdir {
        /// Directory.
        dir: Fd,
        /// Subdirectory name.
        name: &'a OsStr,
    },
    /// Removes a scratch tree (a directory and everything below it, links unlinked and never
    /// followed; a missing name is not an error). Only for trees nothing durable refers to:
    /// nothing of it is synced.
    RemoveTree {
        /// Directory.
        dir: Fd,
        /// The tree's name.
        name: &'a OsStr,
    },
    /// Makes a directory's entries durable (`fsync` of the directory). A failure poisons the
    /// handle.
    SyncDir {
        /// The directory.
        dir: Fd,
    },
    /// Makes everything written on the filesystem that holds `dir` durable, data and entries
    /// (`syncfs`).
    SyncFs {
        /// Any directory on that filesystem.
        dir: Fd,
    },
    /// `lstat` of an entry ([`Done::Stat`], `None` when it does not exist).
    Stat {
        /// Directory.
        dir: Fd,
        /// Entry name.
        name: &'a OsStr,
    },
    /// Starts listing `dir` ([`Done::Opened`]: a listing handle for [`Op::ListNext`]).
    List {
        /// Directory.
        dir: Fd,
    },
    /// The next at most `max` entries of a listing ([`Done::Entries`], empty at the end).
    /// Entries removed or added while listing may or may not be seen.
    ListNext {
        /// A listing handle.
        list: Fd,
        /// At most this many entries.
        max: usize,
    },
}

impl Op<'_> {
    /// The op's step name for crash points and the recorder (`<label>.<step>`).
    pub fn step_name(&self) -> &'static str {
        match self {
            Op::OpenDir { .. } => "opendir",
            Op::Mkdir { .. } => "mkdir",
            Op::CreateTemp { .. } | Op::CreateNew { .. } => "create",
            Op::Open { .. } => "open",
            Op::Read { .. } | Op::ReadFile { .. } => "read",
            Op::Rewind { .. } => "rewind",
            Op::Write { .. } | Op::WriteAt { .. } | Op::Copy { .. } => "write",
            Op::Hash { .. } | Op::HashFile { .. } => "hash",
            Op::Chmod { .. } => "chmod",
            Op::Fsync { .. } => "fsync",
            Op::Close { .. } => "close",
            Op::Rename { .. } => "rename",
            Op::Unlink { .. } | Op::Rmdir { .. } | Op::RemoveTree { .. } => "unlink",
            Op::LinkFd { .. } => "link",
            Op::Sole { .. } => "sole",
            Op::SyncDir { .. } => "dirfsync",
            Op::SyncFs { .. } => "syncfs",
            Op::Stat { .. } => "stat",
            Op::List { .. } | Op::ListNext { .. } => "list",
        }
    }

    /// Whether the op changes the filesystem (or its durability). Reads, opens, listings,
    /// hashes and closes do not.
    pub fn mutates(&self) -> bool {
        match self {
            Op::Mkdir { .. }
            | Op::CreateTemp { .. }
            | Op::CreateNew { .. }
            | Op::Write { .. }
            | Op::WriteAt { .. }
            | Op::Copy { .. }
            | Op::Chmod { .. }
            | Op::Fsync { .. }
            | Op::Rename { .. }
            | Op::LinkFd { .. }
            | Op::Unlink { .. }
            | Op::Rmdir { .. }
            | Op::RemoveTree { .. }
            | Op::SyncDir { .. }
            | Op::SyncFs { .. } => true,
            Op::OpenDir { .. }
            | Op::Open { .. }
            | Op::Read { .. }
            | Op::ReadFile { .. }
            | Op::Rewind { .. }
            | Op::Hash { .. }
            | Op::HashFile { .. }
            | Op::Close { .. }
            | Op::Sole { .. }
            | Op::Stat { .. }
            | Op::List { .. }
            | Op::ListNext { .. } => false,
        }
    }

    /// Whether the op is a sync (file, directory or filesystem).
    pub fn is_sync(&self) -> bool {
        matches!(
            self,
            Op::Fsync { .. } | Op::SyncDir { .. } | Op::SyncFs { .. }
        )
    }
}

/// A labelled op: what a protocol yields.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Step<'a> {
    /// The crash-point label (`publish.blob`).
    pub label: &'static str,
    /// The operation.
    pub op: Op<'a>,
}

impl<'a> Step<'a> {
    /// `op` under `label`.
    pub const fn new(label: &'static str, op: Op<'a>) -> Step<'a> {
        Step { label, op }
    }
}

/// The size and sha256 of bytes read or copied.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Summary {
    /// Bytes.
    pub size: u64,
    /// Their sha256.
    pub sha256: [u8; 32],
}

/// What `lstat` found.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Meta {
    /// The entry's kind.
    pub kind: FileKind,
    /// Its size in bytes.
    pub size: u64,
}

/// The result of a successful op.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Done {
    /// Done, nothing to report.
    Ok,
    /// A handle: an opened file (with its size), directory or listing (size 0).
    Opened {
        /// The new handle.
        fd: Fd,
        /// The file's size.
        size: u64,
    },
    /// A created file, open for writing.
    Created {
        /// The new handle.
        fd: Fd,
        /// Its name in its directory.
        name: OsString,
    },
    /// Bytes read.
    Data(Vec<u8>),
    /// Bytes hashed (or copied and hashed).
    Hashed(Summary),
    /// An entry's kind and size, or `None` when there is none.
    Stat(Option<Meta>),
    /// Listed entries (without `.` and `..`).
    Entries(Vec<(OsString, FileKind)>),
    /// The answer to [`Op::Sole`].
    Sole(bool),
}

impl Done {
    /// The handle of [`Done::Opened`] or [`Done::Created`].
    pub fn fd(&self) -> Option<Fd> {
        match self {
            Done::Opened { fd, .. } | Done::Created { fd, .. } => Some(*fd),
            Done::Ok
            | Done::Data(_)
            | Done::Hashed(_)
            | Done::Stat(_)
            | Done::Entries(_)
            | Done::Sole(_) => None,
        }
    }
}

/// Performs file operations: for real ([`crate::privfs::Exec`]) or on a simulated crash
/// filesystem (the models).
pub trait Executor {
    /// Performs one step and returns its result.
    fn run(&mut self, step: Step<'_>) -> Result<Done, FsError>;
}

impl<E: Executor + ?Sized> Executor for &mut E {
    fn run(&mut self, step: Step<'_>) -> Result<Done, FsError> {
        (**self).run(step)
    }
}

/// An executor that counts and records the steps it forwards (tests and models: how many
/// syncs a protocol did, in which order).
#[derive(Debug)]
pub struct Counting<E> {
    /// The executor that performs the steps.
    pub inner: E,
    /// The label and step name of every forwarded step, in order.
    pub log: Vec<(&'static str, &'static str)>,
}

impl<E> Counting<E> {
    /// Counts what `inner` performs.
    pub fn new(inner: E) -> Counting<E> {
        Counting {
            inner,
            log: Vec::new(),
        }
    }

    /// How many syncs (file, directory, filesystem) were forwarded.
    pub fn syncs(&self) -> usize {
        self.log
            .iter()
            .filter(|(_, s)| matches!(*s, "fsync" | "dirfsync" | "syncfs"))
            .count()
    }
}

impl<E: Executor> Executor for Counting<E> {
    fn run(&mut self, step: Step<'_>) -> Result<Done, FsError> {
        self.log.push((step.label, step.op.step_name()));
        self.inner.run(step)
    }
}

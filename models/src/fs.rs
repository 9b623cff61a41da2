//! A simulated crash filesystem: the executor the models run the real store and lease plans on
//! (`tenure::fsop`), and what power loss can leave of it.
//!
//! # What it models (design.md, "Protocols as data", rules 3 and 4)
//! The filesystem is **inode-based**. A file inode has its *durable* content and the *pending*
//! writes since its last fsync (each kept as the whole content after that write); what reads
//! see is the last pending content, or the durable one. A directory inode has its *live*
//! entries (what lookups see) and its *durable* entries. Every change of an entry — a create,
//! a `mkdir`, an unlink, a rename — is one *pending entry op* in one global, ordered list, and
//! names the directories it touches; a rename is a single atomic op even across two
//! directories.
//! - `fsync` of a file commits that inode's data, nothing else (not its name);
//! - `fsync` of a directory commits the pending entry ops that touch it — an op that touches
//!   two directories (a rename between them) only once both were synced;
//! - `syncfs` commits everything: every inode's data and every entry op;
//! - every other op commits nothing.
//!
//! This is weaker than ext4 or XFS (whose journals commit every earlier metadata change at any
//! fsync) and than what POSIX leaves open in practice, which is the point: a protocol that is
//! correct here does not depend on one filesystem's ordering.
//!
//! # Crashes
//! - A **process crash** ([`SimFs::crash_process`]) closes every handle and loses nothing: the
//!   page cache survives, so a successor sees everything the crashed process wrote.
//! - **Power loss** ([`SimFs::power_loss`]) enumerates every state the disk can be left in,
//!   deterministically: the durable entries plus any subset of the pending entry ops (each
//!   whole, in their order; or only a prefix of them, for [`Reorder::Prefix`]), and for each
//!   file reachable in that state the durable content plus a prefix of its pending writes (an
//!   in-place overwrite, `WriteAt`, adds one more: its range torn, see [`TORN`]). The
//!   outcomes are deduplicated and sorted (entries in name order, contents compared by their
//!   bytes), and each is normalised, so equal disks are equal states.
//!
//! Contents ([`Content`]) are shared between states and compared and hashed by their bytes;
//! inodes are shared between states until a step changes them, and each carries the hash of
//! its value ([`crate::shared::Shared`]), so a state is cheap to clone and to fingerprint.
//!
//! Modes, owners and links are not modelled (every file is a private regular file with one
//! name, every directory private): the checks privfs does on them are covered by its own tests.
//!
//! A scratch tree removed with `RemoveTree` disappears as one entry op (the real removal
//! unlinks its entries one by one; a crash in the middle leaves a partial scratch tree, which
//! nothing durable refers to and the next owner removes again).

use std::borrow::Borrow;
use std::collections::BTreeMap;
use std::ffi::{OsStr, OsString};
use std::fmt;
use std::ops::{Deref, Index};
use std::path::PathBuf;
use std::sync::Arc;

use crate::shared::Shared;
use sha2::Digest as _;
use smallvec::{SmallVec, smallvec};
use tenure::fsop::{Check, Done, Executor, Fd, Meta, Op, Step, Summary};
use tenure::privfs::{FileKind, FsError};

/// What an in-place overwrite (`WriteAt`) that a power loss interrupted may leave in the range
/// it wrote, besides the old bytes and the new ones: garbage, here every byte `0xff` (what an
/// erased flash page reads as). A reader that checks a checksum tells any garbage apart the
/// same way; one that does not reads this one as the largest number there is.
pub const TORN: u8 = 0xff;

/// An inode number.
pub type Ino = u32;

/// The inode of the root directory (the state dir).
pub const ROOT_INO: Ino = 0;

/// A file's content: shared between the states and inodes that hold it (a clone is a
/// reference count), compared, ordered and hashed by its bytes.
///
/// Kept in pages of 4 KiB (`PAGE` bytes), each without the run of equal bytes that ends it: the
/// lease's files are mostly zeros (the owner record is one 4 KiB slot, the epoch file three
/// slots a page apart) and a torn slot is a run of [`TORN`], so a rewrite of one slot copies,
/// stores and hashes the few bytes of that slot's page, not the whole file (issue 12:
/// whole-file copies, their fresh memory and their hashes were two fifths of the lease worlds'
/// search). The pages are canonical, so two contents hold the same bytes exactly when their
/// lengths and pages are equal.
#[derive(Clone)]
pub struct Content(Arc<Pages>);

/// The bytes of one page of a [`Content`].
const PAGE: usize = 4096;

struct Pages {
    len: usize,
    /// Page `i` holds the bytes from `i * PAGE` to the page's end or `len`.
    pages: SmallVec<[Page; 3]>,
    /// The bytes in one piece, made the first time a caller asks for them as a slice (only
    /// when the content is not a single page without a run, which is its own slice).
    flat: std::sync::OnceLock<Box<[u8]>>,
}

/// One page: its bytes up to the run of `tail` bytes that ends it (canonical: `tail` is the
/// page's last byte and the run is as long as it goes; `head` is `None` when the run is the
/// whole page).
#[derive(Clone, PartialEq, Eq, Hash)]
struct Page {
    head: Option<Arc<[u8]>>,
    tail: u8,
}

impl Page {
    /// The page holding `bytes` (not empty).
    fn of(bytes: &[u8]) -> Page {
        let tail = *bytes.last().expect("a page has bytes");
        // Eight bytes at a time from the end: most pages are a few bytes and then zeros.
        let run = u64::from_ne_bytes([tail; 8]);
        let word = |at: usize| u64::from_ne_bytes(bytes[at - 8..at].try_into().expect("8 bytes"));
        let mut end = bytes.len();
        while end >= 8 && word(end) == run {
            end -= 8;
        }
        while end > 0 && bytes[end - 1] == tail {
            end -= 1;
        }
        Page {
            head: (end > 0).then(|| Arc::from(&bytes[..end])),
            tail,
        }
    }

    fn head(&self) -> &[u8] {
        self.head.as_deref().unwrap_or(&[])
    }

    /// Writes the page's `len` bytes into `out` (as long).
    fn write_to(&self, out: &mut [u8]) {
        let h = self.head();
        out[..h.len()].copy_from_slice(h);
        out[h.len()..].fill(self.tail);
    }
}

impl Content {
    /// The content `bytes`.
    pub fn new(bytes: &[u8]) -> Content {
        Content(Arc::new(Pages {
            len: bytes.len(),
            pages: bytes.chunks(PAGE).map(Page::of).collect(),
            flat: std::sync::OnceLock::new(),
        }))
    }

    /// No bytes (a new file).
    pub fn empty() -> Content {
        Content::new(&[])
    }

    /// How many bytes.
    pub fn len(&self) -> usize {
        self.0.len
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.0.len == 0
    }

    /// The page `i`'s length.
    fn page_len(len: usize, i: usize) -> usize {
        (len - i * PAGE).min(PAGE)
    }

    /// The bytes when they are one page without a run (no copy needed).
    fn whole(&self) -> Option<&[u8]> {
        let p = &*self.0;
        match &p.pages[..] {
            [] => Some(&[]),
            [only] if only.head().len() == p.len => Some(only.head()),
            _ => None,
        }
    }

    /// The bytes.
    pub fn bytes(&self) -> &[u8] {
        match self.whole() {
            Some(b) => b,
            None => self
                .0
                .flat
                .get_or_init(|| self.range(0, self.0.len).into_boxed_slice()),
        }
    }

    /// `f` of the bytes, without keeping them in one piece afterwards (a content read once in
    /// a while, as the lease model reads the owner record, is not stored twice).
    pub fn with_bytes<R>(&self, f: impl FnOnce(&[u8]) -> R) -> R {
        match (self.whole(), self.0.flat.get()) {
            (Some(b), _) => f(b),
            (None, Some(flat)) => f(flat),
            (None, None) => f(&self.range(0, self.0.len)),
        }
    }

    /// The bytes from `start` to `end` (within the content), copied out.
    pub fn range(&self, start: usize, end: usize) -> Vec<u8> {
        let mut out = Vec::with_capacity(end - start);
        for (i, page) in self.0.pages.iter().enumerate() {
            let from = i * PAGE;
            let to = from + Content::page_len(self.0.len, i);
            let (a, b) = (from.max(start), to.min(end));
            if a >= b {
                continue;
            }
            // The part of the range in the page's head, then the part in its run.
            let h = page.head();
            let head_end = (from + h.len()).min(b);
            if a < head_end {
                out.extend_from_slice(&h[a - from..head_end - from]);
            }
            let run_start = a.max(from + h.len());
            if run_start < b {
                out.resize(out.len() + (b - run_start), page.tail);
            }
        }
        out
    }

    /// This content with `patch` written at `pos` (the file grows with zeros to reach it);
    /// only the pages the patch touches, or whose length changes, are made again.
    fn patched(&self, pos: usize, patch: Patch<'_>) -> Content {
        let end = pos + patch.len();
        let old_len = self.0.len;
        let new_len = old_len.max(end);
        let count = new_len.div_ceil(PAGE);
        let mut pages: SmallVec<[Page; 3]> = SmallVec::with_capacity(count);
        for i in 0..count {
            let from = i * PAGE;
            let to = from + Content::page_len(new_len, i);
            let old = self.0.pages.get(i);
            let old_to = old.map(|_| from + Content::page_len(old_len, i));
            if let Some(o) = old
                && old_to == Some(to)
                && (to <= pos || from >= end)
            {
                pages.push(o.clone());
                continue;
            }
            // The patch covers the page: nothing of the old page is left.
            if pos <= from && to <= end {
                pages.push(match patch {
                    Patch::Bytes(b) => Page::of(&b[from - pos..to - pos]),
                    Patch::Run(byte, _) => Page {
                        head: None,
                        tail: byte,
                    },
                });
                continue;
            }
            let mut buf = [0u8; PAGE];
            let page_buf = &mut buf[..to - from];
            if let (Some(o), Some(old_to)) = (old, old_to) {
                o.write_to(&mut page_buf[..old_to - from]);
            }
            let (a, b) = (pos.max(from), end.min(to));
            if a < b {
                match patch {
                    Patch::Bytes(bytes) => {
                        page_buf[a - from..b - from].copy_from_slice(&bytes[a - pos..b - pos])
                    }
                    Patch::Run(byte, _) => page_buf[a - from..b - from].fill(byte),
                }
            }
            pages.push(Page::of(page_buf));
        }
        Content(Arc::new(Pages {
            len: new_len,
            pages,
            flat: std::sync::OnceLock::new(),
        }))
    }

    /// This content with `bytes` written at `pos`.
    pub fn written(&self, pos: usize, bytes: &[u8]) -> Content {
        if pos == 0 && bytes.len() >= self.0.len {
            return Content::new(bytes);
        }
        self.patched(pos, Patch::Bytes(bytes))
    }

    /// This content with `len` bytes at `pos` set to `byte`.
    pub fn filled(&self, pos: usize, len: usize, byte: u8) -> Content {
        self.patched(pos, Patch::Run(byte, len))
    }

    /// Their sha256.
    pub fn sha256(&self) -> [u8; 32] {
        self.with_bytes(|b| sha2::Sha256::digest(b).into())
    }
}

/// What [`Content::patched`] writes: bytes, or a run of one byte this long.
#[derive(Clone, Copy)]
enum Patch<'a> {
    Bytes(&'a [u8]),
    Run(u8, usize),
}

impl Patch<'_> {
    fn len(&self) -> usize {
        match self {
            Patch::Bytes(b) => b.len(),
            Patch::Run(_, n) => *n,
        }
    }
}

impl PartialEq for Content {
    fn eq(&self, other: &Content) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
            || (self.0.len == other.0.len && self.0.pages == other.0.pages)
    }
}

impl Eq for Content {}

impl std::hash::Hash for Content {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        state.write_usize(self.0.len);
        for page in &self.0.pages {
            page.head().hash(state);
            state.write_u8(page.tail);
        }
    }
}

impl PartialOrd for Content {
    fn partial_cmp(&self, other: &Content) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Content {
    fn cmp(&self, other: &Content) -> std::cmp::Ordering {
        if Arc::ptr_eq(&self.0, &other.0) {
            return std::cmp::Ordering::Equal;
        }
        self.bytes().cmp(other.bytes())
    }
}

impl fmt::Debug for Content {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let b = self.bytes();
        if b.len() <= 48 && b.iter().all(|c| c.is_ascii_graphic() || *c == b' ') {
            write!(f, "{:?}", String::from_utf8_lossy(b))
        } else {
            let sha = self.sha256();
            write!(
                f,
                "<{} bytes, sha256 {:02x}{:02x}{:02x}{:02x}…>",
                b.len(),
                sha[0],
                sha[1],
                sha[2],
                sha[3]
            )
        }
    }
}

/// A name in a directory. Shared between the states that hold it (a clone is a reference
/// count), compared, ordered and hashed by its bytes, as an `OsString` is.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Name(Arc<OsStr>);

impl Name {
    /// The name as an `OsStr`.
    pub fn as_os_str(&self) -> &OsStr {
        &self.0
    }
}

impl Deref for Name {
    type Target = OsStr;

    fn deref(&self) -> &OsStr {
        &self.0
    }
}

impl Borrow<OsStr> for Name {
    fn borrow(&self) -> &OsStr {
        &self.0
    }
}

impl From<&OsStr> for Name {
    fn from(n: &OsStr) -> Name {
        Name(Arc::from(n))
    }
}

impl From<&str> for Name {
    fn from(n: &str) -> Name {
        Name::from(OsStr::new(n))
    }
}

impl From<OsString> for Name {
    fn from(n: OsString) -> Name {
        Name(Arc::from(n))
    }
}

impl fmt::Debug for Name {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.0, f)
    }
}

/// A directory's entries, in name order (a sorted vector kept inline up to `INLINE_ENTRIES`
/// names: directories here hold a handful, and a directory inode is copied whenever a step
/// changes it, so a copy of a small one allocates nothing but the inode).
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct Entries(SmallVec<[(Name, Ino); INLINE_ENTRIES]>);

/// Entries of a directory kept without an allocation of their own.
const INLINE_ENTRIES: usize = 4;

/// Directories an entry op waits for (one, or two for a rename between directories).
pub type Waiting = SmallVec<[Ino; 2]>;

/// The hasher of [`SimFs::normal_key`]: a multiply-rotate mix per word (the key only picks a
/// table slot; what it finds is compared whole).
#[derive(Default)]
struct KeyHasher(u64);

impl std::hash::Hasher for KeyHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.write_u64(u64::from(*b));
        }
    }

    fn write_u64(&mut self, x: u64) {
        self.0 = (self.0.rotate_left(5) ^ x).wrapping_mul(0x517c_c1b7_2722_0a95);
    }

    fn write_u8(&mut self, x: u8) {
        self.write_u64(u64::from(x));
    }

    fn write_u32(&mut self, x: u32) {
        self.write_u64(u64::from(x));
    }

    fn write_usize(&mut self, x: usize) {
        self.write_u64(x as u64);
    }
}

/// What [`SimFs::normal_key`] hashes of a name: its length and its first and last eight bytes
/// (a function of its bytes, cheaper than all of them; equal keys are compared whole).
fn name_key(n: &Name, h: &mut impl std::hash::Hasher) {
    let b = n.as_encoded_bytes();
    h.write_usize(b.len());
    if let (Some(first), Some(last)) = (b.first_chunk::<8>(), b.last_chunk::<8>()) {
        h.write_u64(u64::from_le_bytes(*first));
        h.write_u64(u64::from_le_bytes(*last));
    } else {
        h.write_u64(b.iter().fold(0, |x, c| x << 8 | u64::from(*c)));
    }
}

impl Entries {
    fn find(&self, name: &OsStr) -> Result<usize, usize> {
        self.0.binary_search_by(|(n, _)| n.as_os_str().cmp(name))
    }

    /// The inode `name` names.
    pub fn get(&self, name: &OsStr) -> Option<&Ino> {
        self.find(name).ok().map(|i| &self.0[i].1)
    }

    /// Whether `name` is an entry.
    pub fn contains_key(&self, name: &OsStr) -> bool {
        self.find(name).is_ok()
    }

    /// Makes `name` name `ino`, replacing what it named.
    pub fn insert(&mut self, name: Name, ino: Ino) {
        match self.find(&name) {
            Ok(i) => self.0[i].1 = ino,
            Err(i) => self.0.insert(i, (name, ino)),
        }
    }

    /// Removes `name`.
    pub fn remove(&mut self, name: &OsStr) {
        if let Ok(i) = self.find(name) {
            self.0.remove(i);
        }
    }

    /// The entries in name order.
    pub fn iter(&self) -> impl DoubleEndedIterator<Item = (&Name, &Ino)> {
        self.0.iter().map(|(n, i)| (n, i))
    }

    /// The names in order.
    pub fn keys(&self) -> impl DoubleEndedIterator<Item = &Name> {
        self.0.iter().map(|(n, _)| n)
    }

    /// The inodes, in name order.
    pub fn values(&self) -> impl DoubleEndedIterator<Item = &Ino> {
        self.0.iter().map(|(_, i)| i)
    }

    fn values_mut(&mut self) -> impl Iterator<Item = &mut Ino> {
        self.0.iter_mut().map(|(_, i)| i)
    }

    /// Whether there is no entry.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The number of entries.
    pub fn len(&self) -> usize {
        self.0.len()
    }
}

impl<'a> IntoIterator for &'a Entries {
    type Item = (&'a Name, &'a Ino);
    type IntoIter = std::iter::Map<
        std::slice::Iter<'a, (Name, Ino)>,
        fn(&'a (Name, Ino)) -> (&'a Name, &'a Ino),
    >;

    fn into_iter(self) -> Self::IntoIter {
        self.0.iter().map(|(n, i)| (n, i))
    }
}

impl fmt::Debug for Entries {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_map().entries(self.iter()).finish()
    }
}

/// The inode table, indexed by inode number (dense: inodes are numbered from 0 and
/// renumbered by [`SimFs::normalize`]). Each inode is shared between the states that hold it
/// unchanged: a clone of the table is one reference count per inode, and a change copies the
/// one inode it changes.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
struct Nodes(Vec<Shared<Node>>);

impl Nodes {
    fn get(&self, ino: &Ino) -> Option<&Node> {
        self.0.get(*ino as usize).map(|n| &**n)
    }

    /// The inode, to change it (copied first if another state shares it).
    fn get_mut(&mut self, ino: &Ino) -> Option<&mut Node> {
        self.0.get_mut(*ino as usize).map(Shared::make_mut)
    }

    /// Sets inode `ino`: an existing one, or the next number.
    fn insert(&mut self, ino: Ino, node: Node) {
        let i = ino as usize;
        if i == self.0.len() {
            self.0.push(Shared::new(node));
        } else {
            self.0[i] = Shared::new(node);
        }
    }

    fn len(&self) -> usize {
        self.0.len()
    }

    fn values(&self) -> impl Iterator<Item = &Node> {
        self.0.iter().map(|n| &**n)
    }

    /// Commits the pending writes of every file (copying only the files that have some).
    fn commit_all_data(&mut self) {
        for n in &mut self.0 {
            if matches!(&**n, Node::File(f) if !f.pending.is_empty())
                && let Node::File(f) = n.make_mut()
            {
                f.durable = f.data().clone();
                f.pending.clear();
            }
        }
    }
}

impl Index<&Ino> for Nodes {
    type Output = Node;

    fn index(&self, ino: &Ino) -> &Node {
        &self.0[*ino as usize]
    }
}

/// A file inode.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FileNode {
    /// Content as of the last fsync.
    pub durable: Content,
    /// The whole content after each write since, in order.
    pub pending: Vec<Content>,
}

impl FileNode {
    /// What reads see.
    pub fn data(&self) -> &Content {
        self.pending.last().unwrap_or(&self.durable)
    }
}

/// A directory inode.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct DirNode {
    /// The entries lookups see.
    pub live: Entries,
    /// The entries as of the ops committed so far.
    pub durable: Entries,
}

/// An inode.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Node {
    /// A regular file.
    File(FileNode),
    /// A directory.
    Dir(DirNode),
}

/// A change of directory entries.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum EntryOp {
    /// `name` in `dir` now names `ino` (a create or a `mkdir`).
    Add {
        /// The directory.
        dir: Ino,
        /// The new name.
        name: Name,
        /// The inode it names.
        ino: Ino,
    },
    /// `name` in `dir` is gone (an unlink, an `rmdir`, a removed scratch tree).
    Remove {
        /// The directory.
        dir: Ino,
        /// The name.
        name: Name,
    },
    /// `ino` moves from `from` in `from_dir` to `to` in `to_dir`, replacing what `to` named.
    Rename {
        /// Source directory.
        from_dir: Ino,
        /// Source name.
        from: Name,
        /// Target directory.
        to_dir: Ino,
        /// Target name.
        to: Name,
        /// The inode moved.
        ino: Ino,
    },
}

impl EntryOp {
    fn dirs(&self) -> Waiting {
        match self {
            EntryOp::Add { dir, .. } | EntryOp::Remove { dir, .. } => smallvec![*dir],
            EntryOp::Rename {
                from_dir, to_dir, ..
            } if from_dir == to_dir => smallvec![*from_dir],
            EntryOp::Rename {
                from_dir, to_dir, ..
            } => smallvec![*from_dir, *to_dir],
        }
    }

    /// Applies the op to entry maps chosen by `map` (live or durable).
    fn apply(&self, nodes: &mut Nodes, durable: bool) {
        fn entries(nodes: &mut Nodes, dir: Ino, durable: bool) -> Option<&mut Entries> {
            match nodes.get_mut(&dir) {
                Some(Node::Dir(d)) => Some(if durable { &mut d.durable } else { &mut d.live }),
                Some(Node::File(_)) | None => None,
            }
        }
        match self {
            EntryOp::Add { dir, name, ino } => {
                if let Some(e) = entries(nodes, *dir, durable) {
                    e.insert(name.clone(), *ino);
                }
            }
            EntryOp::Remove { dir, name } => {
                if let Some(e) = entries(nodes, *dir, durable) {
                    e.remove(name);
                }
            }
            EntryOp::Rename {
                from_dir,
                from,
                to_dir,
                to,
                ino,
            } => {
                if let Some(e) = entries(nodes, *from_dir, durable)
                    && e.get(from) == Some(ino)
                {
                    e.remove(from);
                }
                if let Some(e) = entries(nodes, *to_dir, durable) {
                    e.insert(to.clone(), *ino);
                }
            }
        }
    }

    fn inos(&self) -> impl Iterator<Item = Ino> {
        match self {
            EntryOp::Add { dir, ino, .. } => [Some(*dir), Some(*ino), None],
            EntryOp::Remove { dir, .. } => [Some(*dir), None, None],
            EntryOp::Rename {
                from_dir,
                to_dir,
                ino,
                ..
            } => [Some(*from_dir), Some(*to_dir), Some(*ino)],
        }
        .into_iter()
        .flatten()
    }

    /// Hashes what [`EntryOp::renumber`] by `map` would leave (see [`name_key`]).
    fn key_into(&self, map: &[Ino], h: &mut impl std::hash::Hasher) {
        let m = |i: &Ino| map[*i as usize];
        match self {
            EntryOp::Add { dir, name, ino } => {
                h.write_u8(0);
                h.write_u32(m(dir));
                name_key(name, h);
                h.write_u32(m(ino));
            }
            EntryOp::Remove { dir, name } => {
                h.write_u8(1);
                h.write_u32(m(dir));
                name_key(name, h);
            }
            EntryOp::Rename {
                from_dir,
                from,
                to_dir,
                to,
                ino,
            } => {
                h.write_u8(2);
                h.write_u32(m(from_dir));
                name_key(from, h);
                h.write_u32(m(to_dir));
                name_key(to, h);
                h.write_u32(m(ino));
            }
        }
    }

    /// Whether `other` is what [`EntryOp::renumber`] by `map` would leave of this op.
    fn is_renumbered(&self, map: &[Ino], other: &EntryOp) -> bool {
        let m = |i: &Ino| map[*i as usize];
        match (self, other) {
            (
                EntryOp::Add { dir, name, ino },
                EntryOp::Add {
                    dir: d,
                    name: n,
                    ino: i,
                },
            ) => m(dir) == *d && m(ino) == *i && name == n,
            (EntryOp::Remove { dir, name }, EntryOp::Remove { dir: d, name: n }) => {
                m(dir) == *d && name == n
            }
            (
                EntryOp::Rename {
                    from_dir,
                    from,
                    to_dir,
                    to,
                    ino,
                },
                EntryOp::Rename {
                    from_dir: fd,
                    from: f,
                    to_dir: td,
                    to: t,
                    ino: i,
                },
            ) => m(from_dir) == *fd && m(to_dir) == *td && m(ino) == *i && from == f && to == t,
            _ => false,
        }
    }

    fn renumber(&mut self, map: &[Ino]) {
        let m = |i: &mut Ino| *i = map[*i as usize];
        match self {
            EntryOp::Add { dir, ino, .. } => {
                m(dir);
                m(ino);
            }
            EntryOp::Remove { dir, .. } => m(dir),
            EntryOp::Rename {
                from_dir,
                to_dir,
                ino,
                ..
            } => {
                m(from_dir);
                m(to_dir);
                m(ino);
            }
        }
    }
}

/// An entry op not yet durable, and the directories whose sync it still waits for.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Pending {
    /// The op.
    pub op: EntryOp,
    /// Directories it touches that have not been synced since.
    pub waiting: Waiting,
}

/// A handle the executor holds for a protocol (process state: a crash closes them all).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Handle {
    /// An open file and its position.
    File {
        /// The inode.
        ino: Ino,
        /// The read/write position.
        pos: u64,
    },
    /// An open directory.
    Dir {
        /// The inode.
        ino: Ino,
    },
    /// A listing: the directory and the last name returned.
    List {
        /// The directory.
        dir: Ino,
        /// The last name returned.
        after: Option<Name>,
    },
}

/// The handles a process holds, by number, in number order: a few at a time, kept inline so
/// that copying a disk to change it (every step of a plan) allocates nothing for them (was a
/// `BTreeMap`: one node allocated and freed per copy, issue 12). Compared and ordered as the
/// map was, pair by pair in number order.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
struct Handles(SmallVec<[(u32, Handle); 8]>);

impl Handles {
    fn find(&self, n: u32) -> Result<usize, usize> {
        self.0.binary_search_by_key(&n, |(k, _)| *k)
    }

    fn contains_key(&self, n: &u32) -> bool {
        self.find(*n).is_ok()
    }

    fn get(&self, n: &u32) -> Option<&Handle> {
        self.find(*n).ok().map(|i| &self.0[i].1)
    }

    fn insert(&mut self, n: u32, h: Handle) {
        match self.find(n) {
            Ok(i) => self.0[i].1 = h,
            Err(i) => self.0.insert(i, (n, h)),
        }
    }

    fn remove(&mut self, n: &u32) {
        if let Ok(i) = self.find(*n) {
            self.0.remove(i);
        }
    }

    fn clear(&mut self) {
        self.0.clear();
    }

    fn values(&self) -> impl Iterator<Item = &Handle> {
        self.0.iter().map(|(_, h)| h)
    }

    fn values_mut(&mut self) -> impl Iterator<Item = &mut Handle> {
        self.0.iter_mut().map(|(_, h)| h)
    }
}

/// Which entry ops power loss may keep.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Reorder {
    /// Any subset of the pending entry ops (each whole, applied in order).
    Subset,
    /// A prefix of them (a filesystem whose metadata journal commits in order).
    Prefix,
}

/// A disk whose power-loss outcomes [`SimFs::power_loss_shared`] or
/// [`SimFs::power_loss_outcomes`] remembers.
struct LossEntry {
    /// The disk's inodes and pending entry ops (no handle, no writer).
    disk: SimFs,
    reorder: Reorder,
    outcomes: Arc<[PowerLoss]>,
}

/// A checker thread's power-loss outcomes by disk (its inodes and pending entry ops, and the
/// reordering): [`SimFs::power_loss_shared`] keys it by the disk as it is,
/// [`SimFs::power_loss_outcomes`] by its normal form.
type LossTable = std::collections::HashMap<u64, LossEntry, crate::run::BuildFingerprint>;

/// The outcomes `table` holds for `disk`, or else `make`'s, then remembered (the table is
/// emptied first when it holds `limit` disks): the same outcomes whether remembered or not.
fn remembered(
    table: &'static std::thread::LocalKey<std::cell::RefCell<LossTable>>,
    limit: usize,
    disk: &SimFs,
    reorder: Reorder,
    make: impl FnOnce() -> Arc<[PowerLoss]>,
) -> Arc<[PowerLoss]> {
    let key = crate::run::fingerprint(&(&disk.nodes, &disk.pending, reorder));
    let hit = table.with_borrow(|t| {
        t.get(&key)
            .filter(|e| {
                e.reorder == reorder && e.disk.pending == disk.pending && e.disk.nodes == disk.nodes
            })
            .map(|e| Arc::clone(&e.outcomes))
    });
    if let Some(outcomes) = hit {
        return outcomes;
    }
    let outcomes = make();
    table.with_borrow_mut(|t| {
        if t.len() >= limit {
            t.clear();
        }
        t.insert(
            key,
            LossEntry {
                disk: SimFs {
                    nodes: disk.nodes.clone(),
                    pending: disk.pending.clone(),
                    handles: Handles::default(),
                    writers: Vec::new(),
                },
                reorder,
                outcomes: Arc::clone(&outcomes),
            },
        );
    });
    outcomes
}

/// One outcome of a power loss ([`SimFs::power_loss_shared`]).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct PowerLoss {
    /// The disk it leaves.
    pub fs: Shared<SimFs>,
    /// Whether it lost something a process crash would have kept: the live tree differs from
    /// the one before ([`SimFs::same_tree`]).
    pub lost: bool,
}

/// The simulated filesystem and the handles of the process that uses it.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SimFs {
    nodes: Nodes,
    pending: Vec<Pending>,
    handles: Handles,
    /// Files another process holds open for writing (a writer the store does not control:
    /// [`Op::Sole`] answers `false` for them; a process crash of the store keeps them, a power
    /// loss ends them).
    writers: Vec<Ino>,
}

impl Default for SimFs {
    fn default() -> SimFs {
        SimFs::new()
    }
}

impl fmt::Debug for SimFs {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut m = f.debug_map();
        for (path, c) in self.tree() {
            match c {
                Some(c) => m.entry(&path, &c),
                None => m.entry(&path, &"<dir>"),
            };
        }
        m.finish()?;
        if !self.pending.is_empty() {
            write!(f, " pending {:?}", self.pending)?;
        }
        Ok(())
    }
}

/// The path a message names for `rel` (relative to the state dir).
fn sim_path(rel: &str) -> PathBuf {
    PathBuf::from("/sim").join(rel)
}

fn other(op: &'static str, path: PathBuf, msg: &str) -> FsError {
    FsError::Io {
        op,
        path,
        source: std::io::Error::other(msg.to_owned()),
    }
}

fn summary(bytes: &[u8]) -> Summary {
    Summary {
        size: bytes.len() as u64,
        sha256: sha2::Sha256::digest(bytes).into(),
    }
}

impl SimFs {
    /// An empty, durable state dir.
    pub fn new() -> SimFs {
        SimFs {
            nodes: Nodes(vec![Shared::new(Node::Dir(DirNode::default()))]),
            pending: Vec::new(),
            handles: Handles::default(),
            writers: Vec::new(),
        }
    }

    fn dir_node(&self, ino: Ino) -> Option<&DirNode> {
        match self.nodes.get(&ino) {
            Some(Node::Dir(d)) => Some(d),
            Some(Node::File(_)) | None => None,
        }
    }

    fn file_node(&self, ino: Ino) -> Option<&FileNode> {
        match self.nodes.get(&ino) {
            Some(Node::File(f)) => Some(f),
            Some(Node::Dir(_)) | None => None,
        }
    }

    fn file_mut(&mut self, ino: Ino) -> Option<&mut FileNode> {
        match self.nodes.get_mut(&ino) {
            Some(Node::File(f)) => Some(f),
            Some(Node::Dir(_)) | None => None,
        }
    }

    /// The path of a live inode relative to the root (`?` when it has no live name).
    pub fn path_of(&self, ino: Ino) -> String {
        if ino == ROOT_INO {
            return String::new();
        }
        // The names are collected first and spelled once the inode is found: error messages
        // of expected misses (a record not there yet) ask for paths often.
        let mut chain = Vec::new();
        if self.name_chain(ROOT_INO, ino, &mut chain) {
            chain
                .iter()
                .map(|n| n.to_string_lossy())
                .collect::<Vec<_>>()
                .join("/")
        } else {
            "?".to_owned()
        }
    }

    /// Pushes onto `chain` the live names that lead from `dir` to `ino` (depth first, in name
    /// order); `false` if none does.
    fn name_chain<'a>(&'a self, dir: Ino, ino: Ino, chain: &mut Vec<&'a Name>) -> bool {
        let Some(d) = self.dir_node(dir) else {
            return false;
        };
        for (name, child) in &d.live {
            chain.push(name);
            if *child == ino || self.name_chain(*child, ino, chain) {
                return true;
            }
            chain.pop();
        }
        false
    }

    /// The path an error about `name` in `dir` names: `/sim/<path of dir>/<name>` (`?` for a
    /// directory with no live name). Built in one buffer: plans probe for files that are not
    /// there yet, and every such miss carries its path.
    fn child_path(&self, dir: Ino, name: &OsStr) -> PathBuf {
        let mut chain = Vec::new();
        let found = dir == ROOT_INO || self.name_chain(ROOT_INO, dir, &mut chain);
        // The buffer is sized once: growing it name by name cost more than the walk.
        let len = "/sim/?/".len() + name.len() + chain.iter().map(|n| n.len() + 1).sum::<usize>();
        let mut p = PathBuf::with_capacity(len);
        p.push("/sim");
        for n in chain {
            p.push(n.as_os_str());
        }
        if !found {
            p.push("?");
        }
        p.push(name);
        p
    }

    fn fresh_ino(&self) -> Ino {
        self.nodes.len() as Ino
    }

    fn put_handle(&mut self, h: Handle) -> Fd {
        let mut n = 1;
        while self.handles.contains_key(&n) {
            n += 1;
        }
        self.handles.insert(n, h);
        Fd(n)
    }

    fn dir_of(&self, fd: Fd) -> Result<Ino, FsError> {
        if fd == Fd::ROOT {
            return Ok(ROOT_INO);
        }
        match self.handles.get(&fd.0) {
            Some(Handle::Dir { ino }) => Ok(*ino),
            Some(Handle::File { .. } | Handle::List { .. }) | None => Err(other(
                "use",
                sim_path(&format!("<handle {}>", fd.0)),
                "not an open directory (a protocol bug)",
            )),
        }
    }

    fn file_of(&self, fd: Fd) -> Result<(Ino, u64), FsError> {
        match self.handles.get(&fd.0) {
            Some(Handle::File { ino, pos }) => Ok((*ino, *pos)),
            Some(Handle::Dir { .. } | Handle::List { .. }) | None => Err(other(
                "use",
                sim_path(&format!("<handle {}>", fd.0)),
                "not an open file (a protocol bug)",
            )),
        }
    }

    fn lookup(&self, dir: Ino, name: &OsStr) -> Option<Ino> {
        self.dir_node(dir).and_then(|d| d.live.get(name).copied())
    }

    fn push_entry_op(&mut self, op: EntryOp) {
        op.apply(&mut self.nodes, false);
        let mut waiting = op.dirs();
        waiting.dedup();
        self.pending.push(Pending { op, waiting });
    }

    /// Commits the pending ops that wait for no directory any more, in order.
    fn commit_ready(&mut self) {
        let (ready, rest): (Vec<Pending>, Vec<Pending>) = std::mem::take(&mut self.pending)
            .into_iter()
            .partition(|p| p.waiting.is_empty());
        for p in ready {
            p.op.apply(&mut self.nodes, true);
        }
        self.pending = rest;
    }

    fn write_at(&mut self, ino: Ino, pos: u64, bytes: &[u8]) {
        let f = self.file_mut(ino).expect("a file handle names a file");
        let content = f.data().written(pos as usize, bytes);
        f.pending.push(content);
    }

    fn new_file(&mut self, dir: Ino, name: OsString) -> Fd {
        let ino = self.fresh_ino();
        self.nodes.insert(
            ino,
            Node::File(FileNode {
                durable: Content::empty(),
                pending: Vec::new(),
            }),
        );
        self.push_entry_op(EntryOp::Add {
            dir,
            name: name.into(),
            ino,
        });
        self.put_handle(Handle::File { ino, pos: 0 })
    }

    fn read_from(&mut self, fd: Fd, limit: Option<u64>) -> Result<Vec<u8>, FsError> {
        let (ino, pos) = self.file_of(fd)?;
        let data = self.file_node(ino).expect("a file").data();
        let start = (pos as usize).min(data.len());
        let end = match limit {
            Some(l) => (start as u64 + l).min(data.len() as u64) as usize,
            None => data.len(),
        };
        let out = data.range(start, end);
        self.handles.insert(
            fd.0,
            Handle::File {
                ino,
                pos: end as u64,
            },
        );
        Ok(out)
    }

    /// A process crash: every handle is closed, nothing written is lost.
    pub fn crash_process(&mut self) {
        self.handles.clear();
        self.normalize();
    }

    /// Whether nothing is pending: every write and entry op is durable.
    pub fn is_durable(&self) -> bool {
        self.pending.is_empty()
            && self.nodes.values().all(|n| match n {
                Node::File(f) => f.pending.is_empty(),
                Node::Dir(d) => d.live == d.durable,
            })
    }

    /// The number of pending entry ops.
    pub fn pending_entry_ops(&self) -> usize {
        self.pending.len()
    }

    /// Every disk power loss can leave now, deduplicated, normalised, sorted; each with no
    /// handle open.
    pub fn power_loss(&self, reorder: Reorder) -> Vec<SimFs> {
        self.power_loss_shared(reorder)
            .iter()
            .map(|o| SimFs::clone(&o.fs))
            .collect()
    }

    /// [`SimFs::power_loss`] with each outcome shared and marked with whether it lost
    /// something, remembered for the disks seen last by their normal form (per checker
    /// thread, a bounded table: the same outcomes whether remembered or not).
    ///
    /// The outcomes depend on the inodes and the pending entry ops alone, and not on their
    /// numbering: the disk is normalised without its handles and writers first (what only a
    /// handle names cannot survive a power loss), so disks that differ in their handles, in
    /// inodes nothing names any more or in how a running process numbered its new inodes
    /// share one entry. In the checkpoint world the ~23,000 states that may lose power hold
    /// ~5,000 such disks (a publish's steps that only open, read or write unsynced data
    /// leave the same outcomes, as do its takeovers and late writes), and with the last 1,024
    /// remembered three in four are found (keyed by the disk as it is, one in six: the
    /// table of the last 2 × 1,024 disks tried in phase 7 then cost more in memory traffic
    /// than it saved). A found state's outcomes are the very disks earlier states' power
    /// losses left, so their hashes are known and the model's verdict table finds them by
    /// pointer. The normal form is looked up without making it (its numbering, a fingerprint
    /// of it and a comparison with the remembered one, all through the renumbering:
    /// `SimFs::normal_key`, `SimFs::is_normal_form`); a copy is normalised only for a
    /// disk not found.
    pub fn power_loss_outcomes(&self, reorder: Reorder) -> Arc<[PowerLoss]> {
        thread_local! {
            static OUTCOMES: std::cell::RefCell<LossTable> = std::cell::RefCell::default();
        }
        // The key is the normal form's, computed and compared without making it (a copy of
        // the disk normalised is made only for a disk not found).
        let (key, hit) = self.with_normal_order(false, false, |map, order| {
            let key = crate::run::fingerprint(&(self.normal_key(map, order, false), reorder));
            let hit = OUTCOMES.with_borrow(|t| {
                t.get(&key)
                    .filter(|e| {
                        e.reorder == reorder && self.is_normal_form(map, order, false, &e.disk)
                    })
                    .map(|e| Arc::clone(&e.outcomes))
            });
            (key, hit)
        });
        if let Some(outcomes) = hit {
            return outcomes;
        }
        let mut disk = SimFs {
            nodes: self.nodes.clone(),
            pending: self.pending.clone(),
            handles: Handles::default(),
            writers: Vec::new(),
        };
        disk.normalize();
        let outcomes: Arc<[PowerLoss]> = disk
            .outcomes(reorder)
            .iter()
            .map(|o| PowerLoss {
                fs: interned(&o.fs),
                lost: o.lost,
            })
            .collect();
        OUTCOMES.with_borrow_mut(|t| {
            if t.len() >= 1 << 10 {
                t.clear();
            }
            t.insert(
                key,
                LossEntry {
                    disk,
                    reorder,
                    outcomes: Arc::clone(&outcomes),
                },
            );
        });
        outcomes
    }

    fn outcomes(&self, reorder: Reorder) -> Arc<[PowerLoss]> {
        self.enumerate_power_loss(reorder).into()
    }

    /// [`SimFs::power_loss`], shared: the outcomes depend only on the inodes and the pending
    /// entry ops (not on the handles), and the lease model asks for the same disk's outcomes
    /// once for its actions and again in every successor, so the outcomes of the disks seen
    /// last are remembered (per checker thread, a bounded table: the same outcomes whether
    /// remembered or not; the lease power world runs 13 times faster with it).
    pub fn power_loss_shared(&self, reorder: Reorder) -> Arc<[PowerLoss]> {
        thread_local! {
            static LOSSES: std::cell::RefCell<LossTable> = std::cell::RefCell::default();
        }
        remembered(&LOSSES, 1 << 14, self, reorder, || self.outcomes(reorder))
    }

    fn enumerate_power_loss(&self, reorder: Reorder) -> Vec<PowerLoss> {
        let n = self.pending.len();
        let choices: Vec<Vec<bool>> = match reorder {
            Reorder::Subset => (0u32..(1 << {
                assert!(n <= 16, "{n} pending entry ops: the model is too large");
                n
            }))
                .map(|mask| (0..n).map(|i| mask & (1 << i) != 0).collect())
                .collect(),
            Reorder::Prefix => (0..=n).map(|k| (0..n).map(|i| i < k).collect()).collect(),
        };
        // Per file with pending writes, the inode as each content it may hold leaves it (the
        // durable one first): built once and shared by every outcome (and their cached hashes
        // with them), as entry ops never change a file inode.
        let mut contents: Vec<Option<Vec<Shared<Node>>>> = vec![None; self.nodes.len()];
        for (ino, node) in self.nodes.0.iter().enumerate() {
            if let Node::File(f) = &**node
                && !f.pending.is_empty()
            {
                contents[ino] = Some(
                    std::iter::once(&f.durable)
                        .chain(f.pending.iter())
                        .map(|c| {
                            Shared::new(Node::File(FileNode {
                                durable: c.clone(),
                                pending: Vec::new(),
                            }))
                        })
                        .collect(),
                );
            }
        }
        // Per directory, the versions of it the outcomes hold so far: an equal one is shared,
        // not built again (so equal outcomes compare by pointer, and each version's hash is
        // computed once).
        let mut built: Vec<SmallVec<[Shared<Node>; 2]>> = vec![SmallVec::new(); self.nodes.len()];
        // Each candidate disk with the choice of entries it came from, and per choice what
        // decides whether the live tree survived whole (see `tree_match`).
        let mut candidates: Vec<(Vec<Shared<Node>>, usize)> = Vec::new();
        let mut matches: Vec<Option<Vec<(usize, Ino)>>> = Vec::new();
        // The durable entries with a prefix of the pending ops applied: each prefix is the one
        // before it plus one op (for a subset, the ops are applied to a fresh copy).
        let mut prefix = self.nodes.clone();
        let mut applied = 0;
        for keep in choices {
            let subset;
            let nodes = match reorder {
                Reorder::Prefix => {
                    let k = keep.iter().filter(|k| **k).count();
                    for p in &self.pending[applied..k] {
                        p.op.apply(&mut prefix, true);
                    }
                    applied = k;
                    &prefix
                }
                Reorder::Subset => {
                    let mut nodes = self.nodes.clone();
                    for (p, k) in self.pending.iter().zip(&keep) {
                        if *k {
                            p.op.apply(&mut nodes, true);
                        }
                    }
                    subset = nodes;
                    &subset
                }
            };
            let (base, files) = outcome_base(nodes, &contents, &mut built);
            matches.push(tree_match(self, &base, &files));
            // Each file reachable in the outcome holds each content it may hold.
            let mut states = vec![base];
            for (at, ino) in files {
                let options = contents[ino as usize].as_ref().expect("a file");
                let mut next = Vec::with_capacity(states.len() * options.len());
                for s in &states {
                    for c in options {
                        let mut s = s.clone();
                        s[at] = c.clone();
                        next.push(s);
                    }
                }
                states = next;
            }
            let choice = matches.len() - 1;
            candidates.extend(states.into_iter().map(|s| (s, choice)));
        }
        sorted_unique(candidates)
            .into_iter()
            .map(|(nodes, choice)| {
                // The live tree survived iff its shape did and every file whose content varies
                // holds what the live one does (`same_tree`, decided per choice of entries
                // once, and per disk only for the files that vary).
                let kept = matches[choice].as_ref().is_some_and(|pairs| {
                    pairs
                        .iter()
                        .all(|(at, ino)| match (&*nodes[*at], self.file_node(*ino)) {
                            (Node::File(o), Some(live)) => o.data() == live.data(),
                            _ => false,
                        })
                });
                PowerLoss {
                    fs: Shared::new(SimFs {
                        nodes: Nodes(nodes),
                        pending: Vec::new(),
                        handles: Handles::default(),
                        writers: Vec::new(),
                    }),
                    lost: !kept,
                }
            })
            .collect()
    }

    /// Renumbers inodes in a canonical order (the live tree, then the durable one, then what
    /// pending ops and handles name) and drops the ones nothing names, so that equal
    /// filesystems are equal values.
    pub fn normalize(&mut self) {
        let _ = self.normalize_map();
    }

    /// [`SimFs::normalize`], and where each inode went (`None`: nowhere, the numbering was
    /// canonical already).
    fn normalize_map(&mut self) -> Option<Vec<Ino>> {
        if self.is_canonical() {
            return None;
        }
        let n = self.nodes.len();
        let mut map = vec![Ino::MAX; n];
        let mut order = vec![0; n];
        let len = self.normal_order(true, true, &mut map, &mut order);
        order.truncate(len);
        if order.len() == n
            && order
                .iter()
                .enumerate()
                .all(|(new, old)| *old as usize == new)
        {
            return None;
        }
        let mut old: Vec<Option<Shared<Node>>> = std::mem::take(&mut self.nodes.0)
            .into_iter()
            .map(Some)
            .collect();
        let mut nodes = Vec::with_capacity(order.len());
        for o in &order {
            let mut node = old[*o as usize].take().expect("visited inodes exist");
            let moves = |d: &DirNode| {
                d.live
                    .values()
                    .chain(d.durable.values())
                    .any(|v| map[*v as usize] != *v)
            };
            if matches!(&*node, Node::Dir(d) if moves(d))
                && let Node::Dir(d) = node.make_mut()
            {
                for v in d.live.values_mut().chain(d.durable.values_mut()) {
                    *v = map[*v as usize];
                }
            }
            nodes.push(node);
        }
        self.nodes = Nodes(nodes);
        for p in &mut self.pending {
            p.op.renumber(&map);
            for w in &mut p.waiting {
                *w = map[*w as usize];
            }
        }
        for h in self.handles.values_mut() {
            match h {
                Handle::File { ino, .. } | Handle::Dir { ino } => *ino = map[*ino as usize],
                Handle::List { dir, .. } => *dir = map[*dir as usize],
            }
        }
        for w in &mut self.writers {
            *w = map[*w as usize];
        }
        Some(map)
    }

    /// The numbering [`SimFs::normalize`] gives this disk with its handles (`handles`) and
    /// its writers (`writers`) or without them, handed to `f`: `map[old]` is an inode's new
    /// number (`Ino::MAX`: dropped), `order[new]` its old one. Kept on the stack for the disks
    /// here (a few dozen inodes).
    fn with_normal_order<R>(
        &self,
        handles: bool,
        writers: bool,
        f: impl FnOnce(&[Ino], &[Ino]) -> R,
    ) -> R {
        const INLINE: usize = 64;
        let n = self.nodes.len();
        if n <= INLINE {
            let mut map = [Ino::MAX; INLINE];
            let mut order = [0; INLINE];
            let len = self.normal_order(handles, writers, &mut map[..n], &mut order[..n]);
            f(&map[..n], &order[..len])
        } else {
            let mut map = vec![Ino::MAX; n];
            let mut order = vec![0; n];
            let len = self.normal_order(handles, writers, &mut map, &mut order);
            f(&map, &order[..len])
        }
    }

    /// Fills `map` (all `Ino::MAX`, one per inode) and `order` (one per inode) with the
    /// numbering of [`SimFs::with_normal_order`]; returns how many inodes it keeps.
    fn normal_order(
        &self,
        handles: bool,
        writers: bool,
        map: &mut [Ino],
        order: &mut [Ino],
    ) -> usize {
        let mut len = 0;
        fn visit(i: Ino, map: &mut [Ino], order: &mut [Ino], len: &mut usize) {
            let m = &mut map[i as usize];
            if *m == Ino::MAX {
                *m = *len as Ino;
                order[*len] = i;
                *len += 1;
            }
        }
        visit(ROOT_INO, map, order, &mut len);
        for durable in [false, true] {
            let mut k = 0;
            while k < len {
                if let Some(d) = self.dir_node(order[k]) {
                    let entries = if durable { &d.durable } else { &d.live };
                    for child in entries.values() {
                        visit(*child, map, order, &mut len);
                    }
                }
                k += 1;
            }
        }
        for p in &self.pending {
            for i in p.op.inos() {
                visit(i, map, order, &mut len);
            }
        }
        if handles {
            for h in self.handles.values() {
                match h {
                    Handle::File { ino, .. } | Handle::Dir { ino } => {
                        visit(*ino, map, order, &mut len);
                    }
                    Handle::List { dir, .. } => visit(*dir, map, order, &mut len),
                }
            }
        }
        if writers {
            for w in &self.writers {
                visit(*w, map, order, &mut len);
            }
        }
        // Directories reached only through pending ops or handles may hold more.
        let mut k = 0;
        while k < len {
            if let Some(d) = self.dir_node(order[k]) {
                for c in d.live.values().chain(d.durable.values()) {
                    visit(*c, map, order, &mut len);
                }
            }
            k += 1;
        }
        len
    }

    /// A fingerprint of the disk [`SimFs::normal_order`]'s `map` and `order` make of this one
    /// (no handle; its writers if `writers`), computed without making it: equal such disks
    /// have equal fingerprints however their inodes were numbered.
    fn normal_key(&self, map: &[Ino], order: &[Ino], writers: bool) -> u64 {
        use std::hash::{Hash, Hasher};
        let mut h = KeyHasher::default();
        h.write_usize(order.len());
        for &o in order {
            let node = &self.nodes.0[o as usize];
            match &**node {
                // A file inode is the same value in any numbering: its cached hash.
                Node::File(_) => node.hash(&mut h),
                Node::Dir(d) => {
                    h.write_u8(1);
                    for entries in [&d.live, &d.durable] {
                        h.write_usize(entries.len());
                        for (name, ino) in entries {
                            name_key(name, &mut h);
                            h.write_u32(map[*ino as usize]);
                        }
                    }
                }
            }
        }
        h.write_usize(self.pending.len());
        for p in &self.pending {
            p.op.key_into(map, &mut h);
            h.write_usize(p.waiting.len());
            for w in &p.waiting {
                h.write_u32(map[*w as usize]);
            }
        }
        if writers {
            h.write_usize(self.writers.len());
            for w in &self.writers {
                h.write_u32(map[*w as usize]);
            }
        }
        h.finish()
    }

    /// Whether `normal` (a normal disk without handles) is the disk `map` and `order` make of
    /// this one (no handle; its writers if `writers`, else none), compared without making it.
    fn is_normal_form(&self, map: &[Ino], order: &[Ino], writers: bool, normal: &SimFs) -> bool {
        if normal.nodes.0.len() != order.len()
            || !normal.handles.0.is_empty()
            || normal.pending.len() != self.pending.len()
        {
            return false;
        }
        let same_nodes = order.iter().zip(&normal.nodes.0).all(|(&o, b)| {
            let a = &self.nodes.0[o as usize];
            match (&**a, &**b) {
                (Node::File(x), Node::File(y)) => Shared::ptr_eq(a, b) || x == y,
                (Node::Dir(x), Node::Dir(y)) => [(&x.live, &y.live), (&x.durable, &y.durable)]
                    .into_iter()
                    .all(|(ex, ey)| {
                        ex.len() == ey.len()
                            && ex
                                .iter()
                                .zip(ey.iter())
                                .all(|((nx, ix), (ny, iy))| map[*ix as usize] == *iy && nx == ny)
                    }),
                _ => false,
            }
        });
        if !same_nodes {
            return false;
        }
        let same_pending = self.pending.iter().zip(&normal.pending).all(|(p, q)| {
            p.op.is_renumbered(map, &q.op)
                && p.waiting.len() == q.waiting.len()
                && p.waiting
                    .iter()
                    .zip(&q.waiting)
                    .all(|(w, v)| map[*w as usize] == *v)
        });
        if !same_pending {
            return false;
        }
        if writers {
            self.writers.len() == normal.writers.len()
                && self
                    .writers
                    .iter()
                    .zip(&normal.writers)
                    .all(|(w, v)| map[*w as usize] == *v)
        } else {
            normal.writers.is_empty()
        }
    }

    /// What a process crash leaves of `fs` ([`SimFs::crash_process`]), shared: the disks that
    /// crashes left last are remembered per checker thread (a bounded table, by their normal
    /// form, found without making it), so equal ones are one allocation (whose hash is known,
    /// and which the checkpoint model's verdict table finds by pointer); the same value
    /// whether remembered or not.
    pub fn crashed(fs: &Shared<SimFs>) -> Shared<SimFs> {
        /// Disks remembered per thread before the table is emptied.
        const REMEMBERED: usize = 1 << 12;
        type Table = std::collections::HashMap<u64, Shared<SimFs>, crate::run::BuildFingerprint>;
        thread_local! {
            static CRASHED: std::cell::RefCell<Table> = std::cell::RefCell::default();
        }
        let (key, hit) = fs.with_normal_order(false, true, |map, order| {
            let key = fs.normal_key(map, order, true);
            let hit = CRASHED.with_borrow(|t| {
                t.get(&key)
                    .filter(|d| fs.is_normal_form(map, order, true, d))
                    .cloned()
            });
            (key, hit)
        });
        if let Some(d) = hit {
            return d;
        }
        let mut d = fs.clone();
        d.make_mut().crash_process();
        CRASHED.with_borrow_mut(|t| {
            if t.len() >= REMEMBERED {
                t.clear();
            }
            t.insert(key, d.clone());
        });
        d
    }

    /// Whether [`SimFs::normalize`] would leave every inode where it is: the same walk, without
    /// building the order, on the premise that the order is the identity so far (then an inode
    /// was seen iff its number is below the count visited, and the next new one must be the
    /// count).
    fn is_canonical(&self) -> bool {
        let n = self.nodes.len() as Ino;
        let mut count: Ino = 1;
        let visit = |i: Ino, count: &mut Ino| -> bool {
            if i < *count {
                true
            } else if i == *count {
                *count += 1;
                true
            } else {
                false
            }
        };
        for durable in [false, true] {
            let mut k = 0;
            while k < count {
                if let Some(d) = self.dir_node(k) {
                    let entries = if durable { &d.durable } else { &d.live };
                    for child in entries.values() {
                        if !visit(*child, &mut count) {
                            return false;
                        }
                    }
                }
                k += 1;
            }
        }
        for p in &self.pending {
            for i in p.op.inos() {
                if !visit(i, &mut count) {
                    return false;
                }
            }
        }
        for h in self.handles.values() {
            let i = match h {
                Handle::File { ino, .. } | Handle::Dir { ino } => *ino,
                Handle::List { dir, .. } => *dir,
            };
            if !visit(i, &mut count) {
                return false;
            }
        }
        for w in &self.writers {
            if !visit(*w, &mut count) {
                return false;
            }
        }
        let mut k = 0;
        while k < count {
            if let Some(d) = self.dir_node(k) {
                for c in d.live.values().chain(d.durable.values()) {
                    if !visit(*c, &mut count) {
                        return false;
                    }
                }
            }
            k += 1;
        }
        count == n
    }

    /// Visits every live entry under the directory `root` (whose path is `prefix`), depth
    /// first: `f` gets each entry's path (relative, `/`-separated) and node.
    fn walk(&self, root: Ino, prefix: String, mut f: impl FnMut(String, &Node)) {
        let mut stack = vec![(root, prefix)];
        while let Some((dir, prefix)) = stack.pop() {
            let Some(d) = self.dir_node(dir) else {
                continue;
            };
            for (name, child) in &d.live {
                let p = if prefix.is_empty() {
                    name.to_string_lossy().into_owned()
                } else {
                    format!("{prefix}/{}", name.to_string_lossy())
                };
                match self.nodes.get(child) {
                    Some(n @ Node::Dir(_)) => {
                        f(p.clone(), n);
                        stack.push((*child, p));
                    }
                    Some(n) => f(p, n),
                    None => {}
                }
            }
        }
    }

    /// The live tree: every path (relative, `/`-separated) with its content, or `None` for a
    /// directory.
    pub fn tree(&self) -> BTreeMap<String, Option<Content>> {
        let mut out = BTreeMap::new();
        self.walk(ROOT_INO, String::new(), |p, n| {
            out.insert(
                p,
                match n {
                    Node::File(f) => Some(f.data().clone()),
                    Node::Dir(_) => None,
                },
            );
        });
        out
    }

    /// The paths of the live files under the directory at `dir` (relative, `/`-separated, in
    /// the order of [`SimFs::tree`]): its file entries, without building the whole tree.
    pub fn file_paths(&self, dir: &str) -> Vec<String> {
        let mut out = Vec::new();
        let Some(root) = self.resolve(dir) else {
            return out;
        };
        self.walk(root, dir.trim_matches('/').to_owned(), |p, n| {
            if matches!(n, Node::File(_)) {
                out.push(p);
            }
        });
        out.sort_unstable();
        out
    }

    /// Whether the live trees of `self` and `other` are equal: the same paths, the same
    /// contents (what [`SimFs::tree`] returns for each, compared without building it).
    pub fn same_tree(&self, other: &SimFs) -> bool {
        fn same(a: &SimFs, ai: Ino, b: &SimFs, bi: Ino) -> bool {
            match (a.nodes.get(&ai), b.nodes.get(&bi)) {
                (Some(Node::File(x)), Some(Node::File(y))) => x.data() == y.data(),
                (Some(Node::Dir(x)), Some(Node::Dir(y))) => {
                    // Entries naming no inode are not in the tree.
                    let mut xs = x.live.iter().filter(|(_, i)| a.nodes.get(i).is_some());
                    let mut ys = y.live.iter().filter(|(_, i)| b.nodes.get(i).is_some());
                    loop {
                        match (xs.next(), ys.next()) {
                            (None, None) => return true,
                            (Some((xn, xi)), Some((yn, yi))) => {
                                if xn != yn || !same(a, *xi, b, *yi) {
                                    return false;
                                }
                            }
                            (Some(_), None) | (None, Some(_)) => return false,
                        }
                    }
                }
                (None, None) => true,
                _ => false,
            }
        }
        same(self, ROOT_INO, other, ROOT_INO)
    }

    /// The inode a live path (relative, `/`-separated) names.
    pub fn resolve(&self, path: &str) -> Option<Ino> {
        let mut ino = ROOT_INO;
        for part in path.split('/').filter(|p| !p.is_empty()) {
            ino = self.lookup(ino, OsStr::new(part))?;
        }
        Some(ino)
    }

    /// The content of the live file at `path`.
    pub fn read(&self, path: &str) -> Option<&[u8]> {
        self.resolve(path)
            .and_then(|i| self.file_node(i))
            .map(|f| f.data().bytes())
    }

    /// `f` of the content of the live file at `path` (see [`Content::with_bytes`]).
    pub fn read_with<R>(&self, path: &str, f: impl FnOnce(&[u8]) -> R) -> Option<R> {
        self.resolve(path)
            .and_then(|i| self.file_node(i))
            .map(|n| n.data().with_bytes(f))
    }

    /// Whether a live directory exists at `path`.
    pub fn is_dir(&self, path: &str) -> bool {
        self.resolve(path)
            .is_some_and(|i| self.dir_node(i).is_some())
    }

    /// The live names in the directory at `path` (empty if there is none).
    pub fn names(&self, path: &str) -> Vec<String> {
        self.resolve(path)
            .and_then(|i| self.dir_node(i))
            .map(|d| {
                d.live
                    .keys()
                    .map(|n| n.to_string_lossy().into_owned())
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Creates the directories of `path` that are missing, durably (test and model setup).
    pub fn mkdir_all(&mut self, path: &str) -> Ino {
        let mut ino = ROOT_INO;
        for part in path.split('/').filter(|p| !p.is_empty()) {
            ino = match self.lookup(ino, OsStr::new(part)) {
                Some(i) => i,
                None => {
                    let new = self.fresh_ino();
                    self.nodes.insert(new, Node::Dir(DirNode::default()));
                    if let Some(Node::Dir(d)) = self.nodes.get_mut(&ino) {
                        d.live.insert(part.into(), new);
                        d.durable.insert(part.into(), new);
                    }
                    new
                }
            };
        }
        ino
    }

    /// Puts a file with `bytes` at `path`, durably, creating its directories (setup, and the
    /// world's own writes: a workload filling a staging area, a byte flipped on disk).
    pub fn put_file(&mut self, path: &str, bytes: &[u8]) {
        let (dir, name) = match path.rsplit_once('/') {
            Some((d, n)) => (d, n),
            None => ("", path),
        };
        let d = self.mkdir_all(dir);
        let content = Content::new(bytes);
        match self.lookup(d, OsStr::new(name)) {
            Some(i) if self.file_node(i).is_some() => {
                *self.file_mut(i).expect("a file") = FileNode {
                    durable: content.clone(),
                    pending: Vec::new(),
                };
            }
            _ => {
                let new = self.fresh_ino();
                self.nodes.insert(
                    new,
                    Node::File(FileNode {
                        durable: content,
                        pending: Vec::new(),
                    }),
                );
                if let Some(Node::Dir(dn)) = self.nodes.get_mut(&d) {
                    dn.live.insert(name.into(), new);
                    dn.durable.insert(name.into(), new);
                }
            }
        }
        self.normalize();
    }

    /// Removes the file or tree at `path` from the disk (setup, and the world's own doing).
    pub fn remove(&mut self, path: &str) {
        let (dir, name) = match path.rsplit_once('/') {
            Some((d, n)) => (d, n),
            None => ("", path),
        };
        if let Some(d) = self.resolve(dir)
            && let Some(Node::Dir(dn)) = self.nodes.get_mut(&d)
        {
            dn.live.remove(OsStr::new(name));
            dn.durable.remove(OsStr::new(name));
        }
        self.normalize();
    }

    /// How many live names `ino` has.
    fn names_of(&self, ino: Ino) -> u64 {
        self.nodes
            .values()
            .filter_map(|n| match n {
                Node::Dir(d) => Some(d.live.values().filter(|i| **i == ino).count() as u64),
                Node::File(_) => None,
            })
            .sum()
    }

    /// Puts a file with `bytes` at `path` as a workload writes it: its directories and entry
    /// durable (setup), its data not synced.
    pub fn put_file_unsynced(&mut self, path: &str, bytes: &[u8]) {
        self.put_file(path, b"");
        let ino = self.resolve(path).expect("just put");
        self.file_mut(ino).expect("a file").pending = vec![Content::new(bytes)];
    }

    /// Another process opens the file at `path` for writing and keeps it open.
    pub fn hold_for_write(&mut self, path: &str) {
        let ino = self.resolve(path).expect("a file to hold");
        if !self.writers.contains(&ino) {
            self.writers.push(ino);
        }
    }

    /// Whether another process holds a file open for writing.
    pub fn has_writer(&self) -> bool {
        !self.writers.is_empty()
    }

    /// Every process holding a file open for writing closes it without writing.
    pub fn end_writers(&mut self) {
        if !self.writers.is_empty() {
            self.writers.clear();
            self.normalize();
        }
    }

    /// Every process holding a file open for writing appends `bytes` through its handle and
    /// closes it (a late write of a workload's leftover process).
    pub fn late_write(&mut self, bytes: &[u8]) {
        for ino in std::mem::take(&mut self.writers) {
            let end = self.file_node(ino).expect("a file").data().len() as u64;
            self.write_at(ino, end, bytes);
        }
        self.normalize();
    }

    fn temp_name(&self, dir: Ino) -> OsString {
        let d = self.dir_node(dir).expect("a directory");
        (0..)
            .map(|n| OsString::from(format!("{}{n}", tenure::privfs::TEMP_PREFIX)))
            .find(|n| !d.live.contains_key(n))
            .expect("a free temp name")
    }
}

/// The disk power loss leaves of the inodes `nodes` (whose durable entries are what survived):
/// every directory as its durable entries, every file as its durable content, numbered as
/// [`SimFs::normalize`] numbers it (breadth first from the root, entries in name order; what
/// is unreachable dropped), built in that numbering at once. Also returns, in that order, the
/// files with other contents to try (their new number and their inode in `nodes`).
/// Directories whose entries come out as an earlier version in `built` share it.
fn outcome_base(
    nodes: &Nodes,
    contents: &[Option<Vec<Shared<Node>>>],
    built: &mut [SmallVec<[Shared<Node>; 2]>],
) -> (Vec<Shared<Node>>, Vec<(usize, Ino)>) {
    let mut map = vec![Ino::MAX; nodes.len()];
    let mut order: Vec<Ino> = Vec::with_capacity(nodes.len());
    map[ROOT_INO as usize] = 0;
    order.push(ROOT_INO);
    let mut k = 0;
    while k < order.len() {
        if let Node::Dir(d) = &*nodes.0[order[k] as usize] {
            for c in d.durable.values() {
                let m = &mut map[*c as usize];
                if *m == Ino::MAX {
                    *m = order.len() as Ino;
                    order.push(*c);
                }
            }
        }
        k += 1;
    }
    let mut out = Vec::with_capacity(order.len());
    let mut files = Vec::new();
    for (new, &old) in order.iter().enumerate() {
        let node = &nodes.0[old as usize];
        if let Some(options) = &contents[old as usize] {
            out.push(options[0].clone());
            files.push((new, old));
            continue;
        }
        let Node::Dir(d) = &**node else {
            out.push(node.clone());
            continue;
        };
        let moves = d.durable.values().any(|v| map[*v as usize] != *v);
        if !moves && d.live == d.durable {
            out.push(node.clone());
            continue;
        }
        let mut entries = d.durable.clone();
        for v in entries.values_mut() {
            *v = map[*v as usize];
        }
        let versions = &mut built[old as usize];
        let dir = match versions
            .iter()
            .find(|b| matches!(&***b, Node::Dir(x) if x.live == entries))
        {
            Some(b) => b.clone(),
            None => {
                let b = Shared::new(Node::Dir(DirNode {
                    live: entries.clone(),
                    durable: entries,
                }));
                versions.push(b.clone());
                b
            }
        };
        out.push(dir);
    }
    (out, files)
}

/// Whether the live tree of `live` and the tree of the outcome `base` (built by
/// [`outcome_base`]) can be equal, as [`SimFs::same_tree`] compares them, for every content
/// of the files in `varying` (the files whose content an outcome chooses): `None` if they
/// differ whatever those hold, else the pairs (place in the outcome, live inode) whose
/// contents must also be equal.
fn tree_match(
    live: &SimFs,
    base: &[Shared<Node>],
    varying: &[(usize, Ino)],
) -> Option<Vec<(usize, Ino)>> {
    fn walk(
        a: &SimFs,
        ai: Ino,
        b: &[Shared<Node>],
        bi: usize,
        varying: &[(usize, Ino)],
        pairs: &mut Vec<(usize, Ino)>,
    ) -> bool {
        match (a.nodes.get(&ai), b.get(bi).map(|n| &**n)) {
            (Some(Node::File(x)), Some(Node::File(y))) => {
                if varying.iter().any(|(at, _)| *at == bi) {
                    pairs.push((bi, ai));
                    true
                } else {
                    x.data() == y.data()
                }
            }
            (Some(Node::Dir(x)), Some(Node::Dir(y))) => {
                // Entries naming no inode are not in the tree.
                let mut xs = x.live.iter().filter(|(_, i)| a.nodes.get(i).is_some());
                let mut ys = y.live.iter().filter(|(_, i)| b.get(**i as usize).is_some());
                loop {
                    match (xs.next(), ys.next()) {
                        (None, None) => return true,
                        (Some((xn, xi)), Some((yn, yi))) => {
                            if xn != yn || !walk(a, *xi, b, *yi as usize, varying, pairs) {
                                return false;
                            }
                        }
                        (Some(_), None) | (None, Some(_)) => return false,
                    }
                }
            }
            (None, None) => true,
            _ => false,
        }
    }
    let mut pairs = Vec::new();
    walk(live, ROOT_INO, base, ROOT_INO as usize, varying, &mut pairs).then_some(pairs)
}

/// The one allocation of the outcome disk `fs` the outcomes remembered last hold (per checker
/// thread, a bounded table; `fs` itself when none equals it): equal disks that different disks'
/// power losses leave (the publish's every step can lose everything it wrote) are then one
/// allocation, and a table that remembers something about a disk (the checkpoint model's
/// verdicts) finds it by pointer, not by comparing every inode (issue 12).
fn interned(fs: &Shared<SimFs>) -> Shared<SimFs> {
    /// Disks remembered per thread before the table is emptied.
    const REMEMBERED: usize = 1 << 14;
    type Table = std::collections::HashMap<u64, Shared<SimFs>, crate::run::BuildFingerprint>;
    thread_local! {
        static DISKS: std::cell::RefCell<Table> = std::cell::RefCell::default();
    }
    let key = crate::run::fingerprint(fs);
    DISKS.with_borrow_mut(|t| {
        if let Some(d) = t.get(&key)
            && d == fs
        {
            return d.clone();
        }
        if t.len() >= REMEMBERED {
            t.clear();
        }
        t.insert(key, fs.clone());
        fs.clone()
    })
}

/// `candidates` (inode tables of outcomes: no pending op, handle or writer; each with a tag)
/// sorted as [`SimFs`]'s order sorts them and deduplicated, keeping the first of equal ones
/// (as `sort` then `dedup` would). Each node is ranked among the nodes at its place once (equal
/// allocations are equal without a look at their values), and the tables are sorted by their
/// ranks: a table's order is its nodes' order, place by place.
fn sorted_unique<T>(candidates: Vec<(Vec<Shared<Node>>, T)>) -> Vec<(Vec<Shared<Node>>, T)> {
    let width = candidates.iter().map(|c| c.0.len()).max().unwrap_or(0);
    // Rank 0: no node at this place (a shorter table sorts first, as a shorter vector does).
    let mut ranks = vec![0u32; candidates.len() * width];
    let mut class = vec![0usize; candidates.len()];
    for at in 0..width {
        // The allocations seen at this place with their class, and one of each class.
        let mut seen: SmallVec<[(&Shared<Node>, usize); 8]> = SmallVec::new();
        let mut classes: SmallVec<[&Shared<Node>; 8]> = SmallVec::new();
        for (c, (t, _)) in candidates.iter().enumerate() {
            let Some(node) = t.get(at) else { continue };
            class[c] = match seen.iter().find(|(p, _)| Shared::ptr_eq(p, node)) {
                Some((_, k)) => *k,
                None => {
                    let k = match classes.iter().position(|d| **d == *node) {
                        Some(k) => k,
                        None => {
                            classes.push(node);
                            classes.len() - 1
                        }
                    };
                    seen.push((node, k));
                    k
                }
            };
        }
        let mut by_value: SmallVec<[usize; 8]> = (0..classes.len()).collect();
        by_value.sort_by(|a, b| classes[*a].cmp(classes[*b]));
        let mut rank_of: SmallVec<[u32; 8]> = smallvec![0; classes.len()];
        for (r, k) in by_value.iter().enumerate() {
            rank_of[*k] = r as u32 + 1;
        }
        for (c, (t, _)) in candidates.iter().enumerate() {
            if at < t.len() {
                ranks[c * width + at] = rank_of[class[c]];
            }
        }
    }
    let row = |c: usize| &ranks[c * width..(c + 1) * width];
    let mut idx: Vec<usize> = (0..candidates.len()).collect();
    idx.sort_by(|a, b| row(*a).cmp(row(*b)));
    idx.dedup_by(|a, b| row(*a) == row(*b));
    let mut candidates: Vec<Option<(Vec<Shared<Node>>, T)>> =
        candidates.into_iter().map(Some).collect();
    idx.into_iter()
        .map(|c| candidates[c].take().expect("each candidate once"))
        .collect()
}

impl Executor for SimFs {
    fn run(&mut self, step: Step<'_>) -> Result<Done, FsError> {
        match step.op {
            Op::OpenDir { dir, name, .. } => {
                let d = self.dir_of(dir)?;
                match self.lookup(d, name) {
                    None => Err(FsError::NotFound {
                        path: self.child_path(d, name),
                    }),
                    Some(i) if self.dir_node(i).is_none() => Err(FsError::NotDirectory {
                        path: self.child_path(d, name),
                        found: FileKind::Regular,
                    }),
                    Some(i) => Ok(Done::Opened {
                        fd: self.put_handle(Handle::Dir { ino: i }),
                        size: 0,
                    }),
                }
            }
            Op::Mkdir { dir, name } => {
                let d = self.dir_of(dir)?;
                if self.lookup(d, name).is_some() {
                    return Err(FsError::AlreadyExists {
                        path: self.child_path(d, name),
                    });
                }
                let ino = self.fresh_ino();
                self.nodes.insert(ino, Node::Dir(DirNode::default()));
                self.push_entry_op(EntryOp::Add {
                    dir: d,
                    name: name.into(),
                    ino,
                });
                Ok(Done::Ok)
            }
            Op::CreateTemp { dir } => {
                let d = self.dir_of(dir)?;
                let name = self.temp_name(d);
                let fd = self.new_file(d, name.clone());
                Ok(Done::Created { fd, name })
            }
            Op::CreateNew { dir, name } => {
                let d = self.dir_of(dir)?;
                if self.lookup(d, name).is_some() {
                    return Err(FsError::AlreadyExists {
                        path: self.child_path(d, name),
                    });
                }
                let fd = self.new_file(d, name.to_owned());
                Ok(Done::Created {
                    fd,
                    name: name.to_owned(),
                })
            }
            Op::Open { dir, name, check } => {
                let d = self.dir_of(dir)?;
                let _: Check = check;
                match self.lookup(d, name) {
                    None => Err(FsError::NotFound {
                        path: self.child_path(d, name),
                    }),
                    Some(i) => match self.file_node(i) {
                        None => Err(FsError::NotRegular {
                            path: self.child_path(d, name),
                            found: FileKind::Directory,
                        }),
                        Some(f) => {
                            let size = f.data().len() as u64;
                            Ok(Done::Opened {
                                fd: self.put_handle(Handle::File { ino: i, pos: 0 }),
                                size,
                            })
                        }
                    },
                }
            }
            Op::Read { fd, max } => Ok(Done::Data(self.read_from(fd, Some(max as u64))?)),
            Op::ReadFile { dir, name, max } => {
                let d = self.dir_of(dir)?;
                // The path is made only for an error (most reads find their file).
                match self.lookup(d, name).map(|i| self.file_node(i)) {
                    None => Err(FsError::NotFound {
                        path: self.child_path(d, name),
                    }),
                    Some(None) => Err(FsError::NotRegular {
                        path: self.child_path(d, name),
                        found: FileKind::Directory,
                    }),
                    Some(Some(f)) => {
                        let b = f.data();
                        if b.len() as u64 > max {
                            return Err(FsError::TooLarge {
                                path: self.child_path(d, name),
                                len: b.len() as u64,
                                max,
                            });
                        }
                        Ok(Done::Data(b.range(0, b.len())))
                    }
                }
            }
            Op::Rewind { fd } => {
                let (ino, _) = self.file_of(fd)?;
                self.handles.insert(fd.0, Handle::File { ino, pos: 0 });
                Ok(Done::Ok)
            }
            Op::Write { fd, bytes } => {
                let (ino, pos) = self.file_of(fd)?;
                self.write_at(ino, pos, bytes);
                self.handles.insert(
                    fd.0,
                    Handle::File {
                        ino,
                        pos: pos + bytes.len() as u64,
                    },
                );
                Ok(Done::Ok)
            }
            // An overwrite in place: until the file is synced a power loss may leave the range
            // old, new or torn, so the torn content is one more pending write before the new one.
            Op::WriteAt {
                dir,
                name,
                offset,
                bytes,
            } => {
                let d = self.dir_of(dir)?;
                let ino = match self.lookup(d, name) {
                    None => {
                        return Err(FsError::NotFound {
                            path: self.child_path(d, name),
                        });
                    }
                    Some(i) if self.file_node(i).is_none() => {
                        return Err(FsError::NotRegular {
                            path: self.child_path(d, name),
                            found: FileKind::Directory,
                        });
                    }
                    Some(i) => i,
                };
                let (start, end) = (offset as usize, offset as usize + bytes.len());
                let f = self.file_mut(ino).expect("a file");
                let torn = f.data().filled(start, end - start, TORN);
                f.pending.push(torn);
                self.write_at(ino, offset, bytes);
                let size = self.file_node(ino).expect("a file").data().len() as u64;
                Ok(Done::Opened {
                    fd: self.put_handle(Handle::File {
                        ino,
                        pos: end as u64,
                    }),
                    size,
                })
            }
            Op::Copy {
                to, from, limit, ..
            } => {
                let bytes = self.read_from(from, limit)?;
                let (ino, pos) = self.file_of(to)?;
                self.write_at(ino, pos, &bytes);
                self.handles.insert(
                    to.0,
                    Handle::File {
                        ino,
                        pos: pos + bytes.len() as u64,
                    },
                );
                Ok(Done::Hashed(summary(&bytes)))
            }
            Op::Hash { fd, limit } => Ok(Done::Hashed(summary(&self.read_from(fd, limit)?))),
            Op::HashFile { dir, name, limit } => {
                let d = self.dir_of(dir)?;
                match self.lookup(d, name).and_then(|i| self.file_node(i)) {
                    None => Err(FsError::NotFound {
                        path: self.child_path(d, name),
                    }),
                    Some(f) => {
                        let b = f.data().bytes();
                        let end = limit.map_or(b.len(), |l| (l as usize).min(b.len()));
                        Ok(Done::Hashed(summary(&b[..end])))
                    }
                }
            }
            // Modes are not modelled.
            Op::Chmod { fd, .. } => self.file_of(fd).map(|_| Done::Ok),
            Op::Fsync { fd, .. } => {
                let (ino, _) = self.file_of(fd)?;
                let f = self.file_mut(ino).expect("a file");
                f.durable = f.data().clone();
                f.pending.clear();
                Ok(Done::Ok)
            }
            Op::Close { fd } => {
                self.handles.remove(&fd.0);
                Ok(Done::Ok)
            }
            Op::Rename {
                from_dir,
                from,
                to_dir,
                to,
                noreplace,
            } => {
                let (fd_, td) = (self.dir_of(from_dir)?, self.dir_of(to_dir)?);
                let Some(ino) = self.lookup(fd_, from) else {
                    return Err(FsError::NotFound {
                        path: self.child_path(fd_, from),
                    });
                };
                if let Some(existing) = self.lookup(td, to) {
                    if noreplace {
                        return Err(FsError::AlreadyExists {
                            path: self.child_path(td, to),
                        });
                    }
                    if existing == ino {
                        // Renaming a file onto itself does nothing (POSIX).
                        return Ok(Done::Ok);
                    }
                    if self.dir_node(existing).is_some() || self.dir_node(ino).is_some() {
                        return Err(other(
                            "rename into",
                            self.child_path(td, to),
                            "only files are renamed over existing names here",
                        ));
                    }
                }
                self.push_entry_op(EntryOp::Rename {
                    from_dir: fd_,
                    from: from.into(),
                    to_dir: td,
                    to: to.into(),
                    ino,
                });
                Ok(Done::Ok)
            }
            Op::Unlink { dir, name } => {
                let d = self.dir_of(dir)?;
                match self.lookup(d, name) {
                    None => Err(FsError::NotFound {
                        path: self.child_path(d, name),
                    }),
                    Some(i) if self.dir_node(i).is_some() => {
                        Err(other("remove", self.child_path(d, name), "is a directory"))
                    }
                    Some(_) => {
                        self.push_entry_op(EntryOp::Remove {
                            dir: d,
                            name: name.into(),
                        });
                        Ok(Done::Ok)
                    }
                }
            }
            Op::LinkFd { fd, to_dir, to } => {
                let (ino, _) = self.file_of(fd)?;
                let td = self.dir_of(to_dir)?;
                if self.lookup(td, to).is_some() {
                    return Err(FsError::AlreadyExists {
                        path: self.child_path(td, to),
                    });
                }
                self.push_entry_op(EntryOp::Add {
                    dir: td,
                    name: to.into(),
                    ino,
                });
                Ok(Done::Ok)
            }
            Op::Sole { fd, links } => {
                let (ino, _) = self.file_of(fd)?;
                Ok(Done::Sole(
                    !self.writers.contains(&ino) && self.names_of(ino) == links,
                ))
            }
            Op::Rmdir { dir, name } => {
                let d = self.dir_of(dir)?;
                match self.lookup(d, name).map(|i| self.dir_node(i)) {
                    None => Err(FsError::NotFound {
                        path: self.child_path(d, name),
                    }),
                    Some(None) => Err(other("remove", self.child_path(d, name), "not a directory")),
                    Some(Some(sub)) if !sub.live.is_empty() => Err(other(
                        "remove",
                        self.child_path(d, name),
                        "directory not empty",
                    )),
                    Some(Some(_)) => {
                        self.push_entry_op(EntryOp::Remove {
                            dir: d,
                            name: name.into(),
                        });
                        Ok(Done::Ok)
                    }
                }
            }
            Op::RemoveTree { dir, name } => {
                let d = self.dir_of(dir)?;
                if self.lookup(d, name).is_some() {
                    self.push_entry_op(EntryOp::Remove {
                        dir: d,
                        name: name.into(),
                    });
                }
                Ok(Done::Ok)
            }
            Op::SyncDir { dir } => {
                let d = self.dir_of(dir)?;
                for p in &mut self.pending {
                    p.waiting.retain(|w| *w != d);
                }
                self.commit_ready();
                Ok(Done::Ok)
            }
            Op::SyncFs { dir } => {
                self.dir_of(dir)?;
                self.nodes.commit_all_data();
                for p in &mut self.pending {
                    p.waiting.clear();
                }
                self.commit_ready();
                Ok(Done::Ok)
            }
            Op::Stat { dir, name } => {
                let d = self.dir_of(dir)?;
                Ok(Done::Stat(self.lookup(d, name).map(
                    |i| match &self.nodes[&i] {
                        Node::File(f) => Meta {
                            kind: FileKind::Regular,
                            size: f.data().len() as u64,
                        },
                        Node::Dir(_) => Meta {
                            kind: FileKind::Directory,
                            size: 0,
                        },
                    },
                )))
            }
            Op::List { dir } => {
                let d = self.dir_of(dir)?;
                Ok(Done::Opened {
                    fd: self.put_handle(Handle::List {
                        dir: d,
                        after: None,
                    }),
                    size: 0,
                })
            }
            Op::ListNext { list, max } => {
                let Some(Handle::List { dir, after }) = self.handles.get(&list.0).cloned() else {
                    return Err(other(
                        "use",
                        sim_path(&format!("<handle {}>", list.0)),
                        "not an open listing (a protocol bug)",
                    ));
                };
                let d = self.dir_node(dir).expect("a listed directory");
                let entries: Vec<(OsString, FileKind)> = d
                    .live
                    .iter()
                    .filter(|(n, _)| after.as_ref().is_none_or(|a| *n > a))
                    .take(max)
                    .map(|(n, i)| {
                        let kind = match self.nodes.get(i) {
                            Some(Node::Dir(_)) => FileKind::Directory,
                            Some(Node::File(_)) | None => FileKind::Regular,
                        };
                        (n.to_os_string(), kind)
                    })
                    .collect();
                let after = entries
                    .last()
                    .map(|(n, _)| Name::from(n.as_os_str()))
                    .or(after);
                self.handles.insert(list.0, Handle::List { dir, after });
                Ok(Done::Entries(entries))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

    fn run(fs: &mut SimFs, op: Op<'_>) -> Done {
        fs.run(Step::new("test", op)).unwrap()
    }

    fn contents(states: &[SimFs], path: &str) -> BTreeSet<Option<Vec<u8>>> {
        states
            .iter()
            .map(|s| s.read(path).map(<[u8]>::to_vec))
            .collect()
    }

    /// A content kept in pages is its bytes: after any sequence of writes and fills (within a
    /// page, across pages, past the end, runs of zeros and of other bytes) it reads, compares,
    /// orders and hashes exactly as the plain bytes written the same way (issue 12).
    #[test]
    fn paged_contents_are_their_bytes() {
        let mut seed = 0x9e37_79b9_7f4a_7c15_u64;
        let mut next = |n: usize| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            (seed % n as u64) as usize
        };
        let mut all: Vec<(Content, Vec<u8>)> = Vec::new();
        for _ in 0..40 {
            let mut c = Content::empty();
            let mut v: Vec<u8> = Vec::new();
            for _ in 0..6 {
                let pos = [0, 7, PAGE - 3, PAGE, 2 * PAGE + 5, next(3 * PAGE)][next(6)];
                let len = [1, 3, 48, PAGE, PAGE + 9][next(5)];
                if v.len() < pos + len {
                    v.resize(pos + len, 0);
                }
                if next(3) == 0 {
                    let byte = [0, TORN, b'x'][next(3)];
                    c = c.filled(pos, len, byte);
                    v[pos..pos + len].fill(byte);
                } else {
                    let bytes: Vec<u8> = (0..len).map(|i| [0, 0, 1, TORN][(i + pos) % 4]).collect();
                    c = c.written(pos, &bytes);
                    v[pos..pos + len].copy_from_slice(&bytes);
                }
                assert_eq!(c.len(), v.len());
                assert_eq!(c.bytes(), &v[..]);
                assert_eq!(c.with_bytes(<[u8]>::to_vec), v);
                let (a, b) = (next(v.len() + 1), next(v.len() + 1));
                let (a, b) = (a.min(b), a.max(b));
                assert_eq!(c.range(a, b), v[a..b].to_vec());
                all.push((c.clone(), v.clone()));
            }
        }
        for (c, v) in &all {
            let fresh = Content::new(v);
            assert_eq!(*c, fresh);
            assert_eq!(crate::run::fingerprint(c), crate::run::fingerprint(&fresh));
        }
        for (c, v) in all.iter().step_by(7) {
            for (d, w) in all.iter().step_by(5) {
                assert_eq!(c == d, v == w);
                assert_eq!(c.cmp(d), v.cmp(w));
            }
        }
    }

    /// `file_paths` lists what `tree` lists as files under the directory, in the same order
    /// (`a-c` sorts before `a/b`, as the full paths do).
    #[test]
    fn file_paths_are_the_trees_files() {
        let mut fs = SimFs::new();
        for p in ["s/a/b", "s/a-c", "s/a/d/e", "s/z", "t/x", "s/a0"] {
            fs.put_file(p, p.as_bytes());
        }
        fs.mkdir_all("s/empty");
        let from_tree: Vec<String> = fs
            .tree()
            .into_iter()
            .filter(|(p, c)| c.is_some() && p.starts_with("s/"))
            .map(|(p, _)| p)
            .collect();
        assert_eq!(fs.file_paths("s"), from_tree);
        assert_eq!(from_tree.first().map(String::as_str), Some("s/a-c"));
        assert!(fs.file_paths("nothing").is_empty());
    }

    /// The durable replace: before the fsync the new name may hold nothing; after the fsync
    /// and before the dir fsync the rename may be lost; after both it survives.
    #[test]
    fn durable_replace_outcomes() {
        let mut fs = SimFs::new();
        fs.put_file("f", b"old");
        let Done::Created { fd, name } = run(&mut fs, Op::CreateTemp { dir: Fd::ROOT }) else {
            panic!()
        };
        run(&mut fs, Op::Write { fd, bytes: b"new" });
        let rename = |fs: &mut SimFs| {
            run(
                fs,
                Op::Rename {
                    from_dir: Fd::ROOT,
                    from: &name,
                    to_dir: Fd::ROOT,
                    to: OsStr::new("f"),
                    noreplace: false,
                },
            )
        };
        // Renamed before the fsync: "f" may be empty after power loss.
        let mut early = fs.clone();
        rename(&mut early);
        assert_eq!(
            contents(&early.power_loss(Reorder::Subset), "f"),
            BTreeSet::from([
                Some(b"old".to_vec()),
                Some(b"".to_vec()),
                Some(b"new".to_vec())
            ])
        );
        run(
            &mut fs,
            Op::Fsync {
                fd,
                data_only: false,
            },
        );
        rename(&mut fs);
        assert_eq!(
            contents(&fs.power_loss(Reorder::Subset), "f"),
            BTreeSet::from([Some(b"old".to_vec()), Some(b"new".to_vec())])
        );
        run(&mut fs, Op::SyncDir { dir: Fd::ROOT });
        assert_eq!(
            contents(&fs.power_loss(Reorder::Subset), "f"),
            BTreeSet::from([Some(b"new".to_vec())])
        );
        run(&mut fs, Op::Close { fd });
        assert!(fs.is_durable());
        // A process crash loses nothing.
        let mut crashed = early.clone();
        crashed.crash_process();
        assert_eq!(crashed.read("f"), Some(&b"new"[..]));
    }

    /// An overwrite in place: before the fsync a power loss leaves the range old, new or torn
    /// (and nothing outside it changes); after the fsync only the new bytes; no directory sync
    /// is involved.
    #[test]
    fn write_at_outcomes() {
        let mut fs = SimFs::new();
        fs.put_file("f", b"aaaabbbb");
        let Done::Opened { fd, size } = run(
            &mut fs,
            Op::WriteAt {
                dir: Fd::ROOT,
                name: OsStr::new("f"),
                offset: 4,
                bytes: b"cccc",
            },
        ) else {
            panic!()
        };
        assert_eq!(size, 8);
        assert_eq!(fs.read("f"), Some(&b"aaaacccc"[..]));
        let torn = [b'a', b'a', b'a', b'a', TORN, TORN, TORN, TORN];
        assert_eq!(
            contents(&fs.power_loss(Reorder::Prefix), "f"),
            BTreeSet::from([
                Some(b"aaaabbbb".to_vec()),
                Some(torn.to_vec()),
                Some(b"aaaacccc".to_vec())
            ])
        );
        run(
            &mut fs,
            Op::Fsync {
                fd,
                data_only: true,
            },
        );
        assert_eq!(
            contents(&fs.power_loss(Reorder::Subset), "f"),
            BTreeSet::from([Some(b"aaaacccc".to_vec())])
        );
        run(&mut fs, Op::Close { fd });
        assert!(fs.is_durable());
        assert!(matches!(
            fs.run(Step::new(
                "test",
                Op::WriteAt {
                    dir: Fd::ROOT,
                    name: OsStr::new("missing"),
                    offset: 0,
                    bytes: b"x",
                },
            )),
            Err(FsError::NotFound { .. })
        ));
    }

    /// A rename between two directories is atomic and durable only once both are synced.
    #[test]
    fn cross_directory_rename_waits_for_both_directories() {
        let mut fs = SimFs::new();
        fs.put_file("a/x", b"x");
        fs.mkdir_all("b");
        let Done::Opened { fd: a, .. } = run(
            &mut fs,
            Op::OpenDir {
                dir: Fd::ROOT,
                name: OsStr::new("a"),
                any_mode: false,
            },
        ) else {
            panic!()
        };
        let Done::Opened { fd: b, .. } = run(
            &mut fs,
            Op::OpenDir {
                dir: Fd::ROOT,
                name: OsStr::new("b"),
                any_mode: false,
            },
        ) else {
            panic!()
        };
        run(
            &mut fs,
            Op::Rename {
                from_dir: a,
                from: OsStr::new("x"),
                to_dir: b,
                to: OsStr::new("y"),
                noreplace: true,
            },
        );
        run(&mut fs, Op::SyncDir { dir: b });
        let outcomes = fs.power_loss(Reorder::Subset);
        let both: BTreeSet<(bool, bool)> = outcomes
            .iter()
            .map(|s| (s.read("a/x").is_some(), s.read("b/y").is_some()))
            .collect();
        // Never both names, never neither.
        assert_eq!(both, BTreeSet::from([(true, false), (false, true)]));
        run(&mut fs, Op::SyncDir { dir: a });
        let outcomes = fs.power_loss(Reorder::Subset);
        assert_eq!(outcomes.len(), 1);
        assert_eq!(outcomes[0].read("b/y"), Some(&b"x"[..]));
    }

    /// Issue 12: the outcomes `power_loss_outcomes` remembers for a disk's normal form are the
    /// disk's own, whether it lost something included, whatever handles it has open and however
    /// its inodes are numbered: the same disk with its handles closed and renumbered finds them,
    /// and enumerating either afresh gives the same outcomes.
    #[test]
    fn remembered_outcomes_are_the_disks_own() {
        let mut fs = SimFs::new();
        fs.put_file("f", b"old");
        fs.put_file("g", b"gone soon");
        let Done::Created { fd, name } = run(&mut fs, Op::CreateTemp { dir: Fd::ROOT }) else {
            panic!()
        };
        run(&mut fs, Op::Write { fd, bytes: b"new" });
        run(
            &mut fs,
            Op::Rename {
                from_dir: Fd::ROOT,
                from: &name,
                to_dir: Fd::ROOT,
                to: OsStr::new("f"),
                noreplace: false,
            },
        );
        // An unlinked file still open, and a new one: inodes only a handle names, and a
        // numbering no normal form has.
        let Done::Opened { fd: held, .. } = run(
            &mut fs,
            Op::Open {
                dir: Fd::ROOT,
                name: OsStr::new("g"),
                check: Check::AnyMode,
            },
        ) else {
            panic!()
        };
        run(
            &mut fs,
            Op::Unlink {
                dir: Fd::ROOT,
                name: OsStr::new("g"),
            },
        );
        let Done::Created { fd: h, .. } = run(
            &mut fs,
            Op::CreateNew {
                dir: Fd::ROOT,
                name: OsStr::new("h"),
            },
        ) else {
            panic!()
        };
        run(&mut fs, Op::Write { fd: h, bytes: b"h" });
        assert!(!fs.handles.0.is_empty() && !fs.is_canonical());
        let mut closed = fs.clone();
        closed.crash_process();
        for reorder in [Reorder::Prefix, Reorder::Subset] {
            let fresh = fs.enumerate_power_loss(reorder);
            let remembered = fs.power_loss_outcomes(reorder);
            assert_eq!(&remembered[..], &fresh[..]);
            assert!(fresh.iter().any(|o| o.lost) && fresh.iter().any(|o| !o.lost));
            let again = closed.power_loss_outcomes(reorder);
            assert!(Arc::ptr_eq(&remembered, &again));
            assert_eq!(&closed.enumerate_power_loss(reorder)[..], &again[..]);
        }
        // What a crash leaves, remembered by its normal form: the disk's own, and found again
        // (the same allocation) for a disk numbered otherwise with the same normal form.
        let crashed = SimFs::crashed(&Shared::new(fs.clone()));
        assert_eq!(*crashed, closed);
        assert!(Shared::ptr_eq(
            &crashed,
            &SimFs::crashed(&Shared::new(closed.clone()))
        ));
        // A writer survives a crash, and tells the disk apart.
        let mut held_open = fs.clone();
        held_open.hold_for_write("h");
        let mut kept = held_open.clone();
        kept.crash_process();
        let crashed_held = SimFs::crashed(&Shared::new(held_open));
        assert_eq!(*crashed_held, kept);
        assert_ne!(*crashed_held, closed);
        run(&mut fs, Op::Close { fd: held });
    }

    /// syncfs commits every inode's data and every entry op; outcomes are deduplicated and
    /// normalised (inode numbers do not tell equal disks apart).
    #[test]
    fn syncfs_commits_everything_and_outcomes_are_canonical() {
        let mut fs = SimFs::new();
        fs.mkdir_all("d");
        let Done::Opened { fd: d, .. } = run(
            &mut fs,
            Op::OpenDir {
                dir: Fd::ROOT,
                name: OsStr::new("d"),
                any_mode: false,
            },
        ) else {
            panic!()
        };
        for name in ["p", "q"] {
            let Done::Created { fd, .. } = run(
                &mut fs,
                Op::CreateNew {
                    dir: d,
                    name: OsStr::new(name),
                },
            ) else {
                panic!()
            };
            run(
                &mut fs,
                Op::Write {
                    fd,
                    bytes: name.as_bytes(),
                },
            );
            run(&mut fs, Op::Close { fd });
        }
        // Two creates, two writes: names (2 × 2) × data of the ones kept.
        let outcomes = fs.power_loss(Reorder::Subset);
        assert_eq!(outcomes.len(), 1 + 2 + 2 + 4);
        assert_eq!(fs.power_loss(Reorder::Prefix).len(), 1 + 2 + 4);
        run(&mut fs, Op::SyncFs { dir: Fd::ROOT });
        let outcomes = fs.power_loss(Reorder::Subset);
        assert_eq!(outcomes.len(), 1);
        assert_eq!(outcomes[0].read("d/q"), Some(&b"q"[..]));
        // Equal trees built in another order are equal values.
        let mut other = SimFs::new();
        other.put_file("d/q", b"q");
        other.put_file("d/p", b"p");
        other.normalize();
        assert_eq!(outcomes[0], other);
    }

    /// Listing is a cursor: entries come in name order, in pages, and a removal between pages
    /// does not skip a later entry.
    #[test]
    fn listing_pages_through_a_changing_directory() {
        let mut fs = SimFs::new();
        for n in ["a", "b", "c", "d"] {
            fs.put_file(&format!("dir/{n}"), b"");
        }
        let Done::Opened { fd: d, .. } = run(
            &mut fs,
            Op::OpenDir {
                dir: Fd::ROOT,
                name: OsStr::new("dir"),
                any_mode: false,
            },
        ) else {
            panic!()
        };
        let Done::Opened { fd: l, .. } = run(&mut fs, Op::List { dir: d }) else {
            panic!()
        };
        let Done::Entries(first) = run(&mut fs, Op::ListNext { list: l, max: 2 }) else {
            panic!()
        };
        assert_eq!(first.len(), 2);
        run(
            &mut fs,
            Op::Unlink {
                dir: d,
                name: OsStr::new("a"),
            },
        );
        let Done::Entries(rest) = run(&mut fs, Op::ListNext { list: l, max: 10 }) else {
            panic!()
        };
        let names: Vec<_> = rest
            .iter()
            .map(|(n, _)| n.to_string_lossy().into_owned())
            .collect();
        assert_eq!(names, ["c", "d"]);
    }
}

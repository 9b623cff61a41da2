//! On-disk formats of the checkpoint store: digests, checkpoint ids, entry names, the manifest
//! and the `CURRENT` pointer.
//!
//! Every parser here is strict: it accepts exactly what the matching writer produces and names
//! what is wrong otherwise. Nothing in this module touches the filesystem, so every rule can be
//! tested byte by byte.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::limits::{self, Limits};

/// The manifest format version this build writes: a header line, then one line per entry
/// (see [`ManifestReader`]), so that a manifest of any size is written and read streaming.
pub const MANIFEST_FORMAT: u32 = 2;

/// The format of earlier versions: one JSON document with every entry; still read.
pub const LEGACY_MANIFEST_FORMAT: u32 = 1;

/// The longest entry name accepted by default, in bytes (see [`Limits`]).
pub const MAX_NAME_LEN: usize = Limits::DEFAULT.max_name_len;

/// The longest single path component accepted by default, in bytes (see [`Limits`]).
pub const MAX_COMPONENT_LEN: usize = Limits::DEFAULT.max_component_len;

/// The largest manifest accepted by default, in bytes (see [`Limits`]).
pub const MAX_MANIFEST_LEN: u64 = Limits::DEFAULT.max_manifest_bytes;

/// The exact length of a well-formed `CURRENT` file: 20-digit id, a space, 64 hex digits, `\n`.
pub const CURRENT_LEN: usize = 20 + 1 + 64 + 1;

/// Why a piece of on-disk text was refused; the caller adds the file it came from.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum FormatError {
    /// The file holds no bytes at all.
    #[error("is empty")]
    Empty,
    /// The text does not end in exactly one newline.
    #[error("is not newline-terminated")]
    MissingNewline,
    /// The text has the wrong length for its format.
    #[error("has length {actual}, expected {expected}")]
    BadLength {
        /// Bytes found.
        actual: usize,
        /// Bytes the format requires.
        expected: usize,
    },
    /// A sha256 digest is not 64 lowercase hex digits.
    #[error("holds a malformed sha256 digest {0:?}")]
    BadDigest(String),
    /// A checkpoint id is not 20 decimal digits naming a non-zero u64.
    #[error("holds a malformed checkpoint id {0:?}")]
    BadId(String),
    /// The separator between id and digest is not a single space.
    #[error("does not separate id and digest by one space")]
    BadSeparator,
    /// An entry name breaks the naming rules.
    #[error("holds an invalid entry name {name:?}: {reason}")]
    BadName {
        /// The offending name.
        name: String,
        /// Which rule it breaks.
        reason: &'static str,
    },
    /// Entries are not sorted by name, or a name repeats.
    #[error("lists entries out of order or twice at {0:?}")]
    Unsorted(String),
    /// A file entry is also used as a directory by another entry.
    #[error("uses {0:?} both as a file and as a directory")]
    FileDirClash(String),
    /// A mode has bits outside the permission bits 0o777.
    #[error("holds mode {0:#o} with bits outside 0o777")]
    BadMode(u32),
    /// The manifest format version is not one this build understands.
    #[error("has format version {0}, this build understands versions 1 and 2")]
    BadVersion(u32),
    /// An entry name has more components than the limit.
    #[error(
        "holds {name:?}, {depth} levels deep, deeper than the {max} levels a checkpoint may nest"
    )]
    TooDeep {
        /// The name (at most 200 characters of it).
        name: String,
        /// Its components.
        depth: usize,
        /// The limit.
        max: usize,
    },
    /// More entries than the limit.
    #[error("holds more than the {0} files a checkpoint may hold")]
    TooManyEntries(u64),
    /// A line of a format-2 manifest is longer than any writer produces.
    #[error("has a line longer than {0} bytes")]
    LineTooLong(usize),
    /// The number of entry lines differs from the header's count (a truncated or extended
    /// manifest).
    #[error("lists {found} files, its header says {header}")]
    CountMismatch {
        /// The header's count.
        header: u64,
        /// Entry lines found.
        found: u64,
    },
    /// A manifest names itself as its own parent or a parent with a larger id.
    #[error("names parent {parent} which is not older than itself ({id})")]
    BadParent {
        /// The manifest's own id.
        id: CheckpointId,
        /// The parent it names.
        parent: CheckpointId,
    },
    /// The manifest is not valid JSON of the expected shape.
    #[error("is not a valid manifest: {0}")]
    Json(String),
    /// The manifest is larger than the limit.
    #[error("is larger than the {0} bytes a manifest may hold")]
    TooLarge(u64),
}

/// A sha256 digest, shown and stored as 64 lowercase hex digits.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Digest(pub [u8; 32]);

impl Digest {
    /// The digest as 64 lowercase hex digits.
    pub fn to_hex(&self) -> String {
        self.to_string()
    }
}

impl fmt::Display for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        crate::hex::write(f, &self.0)
    }
}

impl fmt::Debug for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Digest({self})")
    }
}

impl FromStr for Digest {
    type Err = FormatError;

    /// Accepts exactly 64 lowercase hex digits; uppercase is refused so one digest has one
    /// spelling and file names in `blobs/sha256/` are unambiguous.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        crate::hex::decode(s)
            .map(Digest)
            .ok_or_else(|| FormatError::BadDigest(s.chars().take(80).collect()))
    }
}

impl Serialize for Digest {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.to_string())
    }
}

impl<'de> Deserialize<'de> for Digest {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// A checkpoint id: a sequence number, 1 for the first checkpoint of a store and parent + 1
/// afterwards. Shown as 20 zero-padded digits so that names sort like numbers.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug)]
pub struct CheckpointId(u64);

impl CheckpointId {
    /// The id of the first checkpoint of a store.
    pub const FIRST: CheckpointId = CheckpointId(1);

    /// Builds an id from its sequence number; `None` for 0, which no checkpoint has.
    pub fn new(n: u64) -> Option<Self> {
        (n != 0).then_some(CheckpointId(n))
    }

    /// The sequence number.
    pub fn get(self) -> u64 {
        self.0
    }

    /// The id a child of this checkpoint gets; `None` once the sequence is exhausted.
    pub fn next(self) -> Option<Self> {
        self.0.checked_add(1).map(CheckpointId)
    }

    /// The manifest file name of this checkpoint inside `manifests/`.
    pub fn manifest_file_name(self) -> String {
        format!("{self}.json")
    }

    /// Parses a manifest file name (`<id>.json`); `None` for any other name.
    pub fn from_manifest_file_name(name: &str) -> Option<Self> {
        name.strip_suffix(".json")?.parse().ok()
    }
}

impl fmt::Display for CheckpointId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:020}", self.0)
    }
}

impl FromStr for CheckpointId {
    type Err = FormatError;

    /// Accepts exactly 20 ASCII digits naming a non-zero u64, the form `Display` writes.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = || FormatError::BadId(s.chars().take(40).collect());
        if s.len() != 20 || !s.bytes().all(|b| b.is_ascii_digit()) {
            return Err(bad());
        }
        let n: u64 = s.parse().map_err(|_| bad())?;
        CheckpointId::new(n).ok_or_else(bad)
    }
}

impl Serialize for CheckpointId {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.to_string())
    }
}

impl<'de> Deserialize<'de> for CheckpointId {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// One file of a checkpoint.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Entry {
    /// Relative path inside the checkpoint, components separated by `/` (see [`check_name`]).
    pub name: String,
    /// Length of the file in bytes.
    pub size: u64,
    /// sha256 of the file's bytes; also the blob's file name.
    pub sha256: Digest,
    /// Permission bits the writer gave the file (at most 0o777); views are made read-only
    /// whatever this says.
    pub mode: u32,
}

/// A manifest: the description of one checkpoint, stored as JSON in `manifests/<id>.json`.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Manifest {
    /// Format version, always [`MANIFEST_FORMAT`].
    pub format: u32,
    /// This checkpoint's id.
    pub id: CheckpointId,
    /// The checkpoint CURRENT named when this one was published; `None` for the first.
    pub parent: Option<CheckpointId>,
    /// The lease epoch of the owner that published it.
    pub epoch: u64,
    /// Publication time in milliseconds since the Unix epoch (evidence only, never compared).
    pub created_at_ms: u64,
    /// The files, sorted by name bytes, names unique.
    pub entries: Vec<Entry>,
}

impl Manifest {
    /// The header of this manifest.
    pub fn header(&self) -> Header {
        Header {
            format: MANIFEST_FORMAT,
            id: self.id,
            parent: self.parent,
            epoch: self.epoch,
            created_at_ms: self.created_at_ms,
            files: self.entries.len() as u64,
        }
    }

    /// Serialises the manifest in the current format (2): the bytes that are stored and
    /// digested.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut v = self.header().to_line();
        for e in &self.entries {
            v.extend_from_slice(&e.to_line());
        }
        v
    }

    /// Parses and validates manifest bytes of either format under the default limits; see
    /// [`ManifestReader`] for the rules. Holds every entry in memory: the store streams
    /// instead.
    pub fn parse(bytes: &[u8]) -> Result<Self, FormatError> {
        let mut r = ManifestReader::new(bytes, Limits::DEFAULT)?;
        let mut entries = Vec::new();
        while let Some(e) = r.next_entry()? {
            entries.push(e);
        }
        let h = r.header();
        Ok(Manifest {
            format: h.format,
            id: h.id,
            parent: h.parent,
            epoch: h.epoch,
            created_at_ms: h.created_at_ms,
            entries,
        })
    }

    /// Checks the rules a manifest must meet under the default limits: known format, parent
    /// older than the checkpoint, valid modes, and names that are valid, sorted, unique and
    /// never both a file and a directory.
    pub fn validate(&self) -> Result<(), FormatError> {
        if self.format != MANIFEST_FORMAT && self.format != LEGACY_MANIFEST_FORMAT {
            return Err(FormatError::BadVersion(self.format));
        }
        self.header().validate()?;
        check_entries(&self.entries)
    }

    /// Total bytes of all entries.
    pub fn total_size(&self) -> u64 {
        self.entries.iter().map(|e| e.size).sum()
    }
}

/// The first line of a format-2 manifest: everything but the entries, and how many follow.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Header {
    /// Format version ([`MANIFEST_FORMAT`]; [`LEGACY_MANIFEST_FORMAT`] for a legacy manifest).
    pub format: u32,
    /// This checkpoint's id.
    pub id: CheckpointId,
    /// The checkpoint CURRENT named when this one was published; `None` for the first.
    pub parent: Option<CheckpointId>,
    /// The lease epoch of the owner that published it.
    pub epoch: u64,
    /// Publication time in milliseconds since the Unix epoch (evidence only).
    pub created_at_ms: u64,
    /// How many entry lines follow.
    pub files: u64,
}

impl Header {
    /// The header line, newline included.
    pub fn to_line(&self) -> Vec<u8> {
        let mut v = serde_json::to_vec(self).expect("a header always serialises");
        v.push(b'\n');
        v
    }

    fn validate(&self) -> Result<(), FormatError> {
        if let Some(p) = self.parent
            && p >= self.id
        {
            return Err(FormatError::BadParent {
                id: self.id,
                parent: p,
            });
        }
        Ok(())
    }
}

impl Entry {
    /// The entry's line in a format-2 manifest, newline included.
    pub fn to_line(&self) -> Vec<u8> {
        let mut v = serde_json::to_vec(self).expect("an entry always serialises");
        v.push(b'\n');
        v
    }

    /// An upper bound of the length of the line of an entry called `name`, whatever its size
    /// and mode: what publish adds up to check a manifest's size before writing anything.
    pub fn line_bound(name: &str) -> u64 {
        let quoted = serde_json::to_vec(name).map_or(6 * name.len() + 2, |v| v.len());
        limits::ENTRY_LINE_OVERHEAD + quoted as u64 - 2
    }
}

/// The longest header line a writer produces (every number at its widest).
pub const HEADER_LINE_MAX: u64 = 160;

/// The streaming rules of a sorted list of entries, checked one entry at a time in constant
/// memory: names valid under the limits and strictly increasing by bytes, modes within 0o777,
/// no name used both as a file and as a directory, at most `max_entries` of them.
///
/// Names with a common prefix are contiguous in byte order, so a file that is also a directory
/// (`a`, then `a/b`) is found with a stack of the earlier names that are prefixes of the last
/// one (at most one per byte of a name), not a set of every name.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct EntryCheck {
    limits: Limits,
    prev: String,
    prefixes: Vec<usize>,
    count: u64,
    bytes: u64,
}

impl EntryCheck {
    /// A check of an empty list under `limits`.
    pub fn new(limits: Limits) -> EntryCheck {
        EntryCheck {
            limits,
            prev: String::new(),
            prefixes: Vec::new(),
            count: 0,
            bytes: 0,
        }
    }

    /// Checks the next entry of the list.
    pub fn push(&mut self, name: &str, mode: u32, size: u64) -> Result<(), FormatError> {
        check_name_with(name, &self.limits)?;
        if mode & !0o777 != 0 {
            return Err(FormatError::BadMode(mode));
        }
        if self.count > 0 && self.prev.as_bytes() >= name.as_bytes() {
            return Err(FormatError::Unsorted(name.to_string()));
        }
        if self.count >= self.limits.max_entries {
            return Err(FormatError::TooManyEntries(self.limits.max_entries));
        }
        let n = name.as_bytes();
        while let Some(&len) = self.prefixes.last() {
            if n.starts_with(&self.prev.as_bytes()[..len]) {
                break;
            }
            self.prefixes.pop();
        }
        if let Some(&len) = self.prefixes.last()
            && n.get(len) == Some(&b'/')
        {
            return Err(FormatError::FileDirClash(self.prev[..len].to_string()));
        }
        self.prefixes.push(n.len());
        self.prev.clear();
        self.prev.push_str(name);
        self.count += 1;
        self.bytes = self.bytes.saturating_add(size);
        Ok(())
    }

    /// Entries checked so far.
    pub fn count(&self) -> u64 {
        self.count
    }

    /// Their total size.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }
}

/// Checks a list of entries under the default limits (see [`EntryCheck`]).
pub fn check_entries(entries: &[Entry]) -> Result<(), FormatError> {
    let mut c = EntryCheck::new(Limits::DEFAULT);
    for e in entries {
        c.push(&e.name, e.mode, e.size)?;
    }
    Ok(())
}

/// Checks one entry name under the default limits (see [`check_name_with`]).
pub fn check_name(name: &str) -> Result<(), FormatError> {
    check_name_with(name, &Limits::DEFAULT)
}

/// Checks one entry name: a relative path of `/`-separated components, none empty, `.` or
/// `..`, no NUL, at most `max_component_len` bytes per component, `max_name_len` in all and
/// `max_depth` components. These rules make every name safe to re-create under a view
/// directory without escaping it.
pub fn check_name_with(name: &str, limits: &Limits) -> Result<(), FormatError> {
    let bad = |reason| {
        Err(FormatError::BadName {
            name: name.chars().take(200).collect(),
            reason,
        })
    };
    if name.is_empty() {
        return bad("it is empty");
    }
    if name.len() > limits.max_name_len {
        return bad("it is longer than a name may be (4096 bytes by default)");
    }
    if name.contains('\0') {
        return bad("it contains a NUL byte");
    }
    if name.starts_with('/') {
        return bad("it is absolute");
    }
    let mut depth = 0;
    for c in name.split('/') {
        depth += 1;
        match c {
            "" => return bad("it has an empty component"),
            "." | ".." => return bad("it has a `.` or `..` component"),
            c if c.len() > limits.max_component_len => {
                return bad("a component is longer than a component may be (255 bytes by default)");
            }
            _ => {}
        }
    }
    if depth > limits.max_depth {
        return Err(FormatError::TooDeep {
            name: name.chars().take(200).collect(),
            depth,
            max: limits.max_depth,
        });
    }
    Ok(())
}

/// What [`ManifestParser::next_item`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Parsed {
    /// More bytes are needed ([`ManifestParser::feed`]), or the end of the input.
    NeedMore,
    /// The header (first, once).
    Header(Header),
    /// The next entry, checked.
    Entry(Entry),
    /// The end: every entry was returned, the count and the end of the input were checked.
    End,
}

/// Where a [`ManifestParser`] is.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum Stage {
    /// Before the header line.
    Start,
    /// A format-1 document is being gathered to its end.
    Legacy(Vec<u8>),
    /// Entry lines of format 2.
    Entries,
    /// The entries of a format-1 document, and the next to return.
    LegacyEntries(Vec<Entry>, usize),
    /// After [`Parsed::End`] or an error.
    Done,
}

/// A push parser of a manifest of either format: bytes go in ([`ManifestParser::feed`]),
/// checked headers and entries come out ([`ManifestParser::next_item`]), every rule checked as it
/// goes with memory that does not grow with the number of entries. It does no I/O, so the
/// store's load and GC plans hold it in their state (it is `Clone + Eq + Hash`), and
/// [`ManifestReader`] is the same parser fed from a reader.
///
/// Format 2 (written by this version): a header line ([`Header`]), then exactly
/// `header.files` entry lines, each one JSON object ([`Entry`]) and a newline, sorted by name,
/// nothing after them. No line may be longer than [`limits::MAX_LINE`], and the file no larger
/// than `max_manifest_bytes`, so a hostile manifest cannot make a reader allocate without
/// bound. Format 1 (earlier versions) is one JSON document whose first line is `{`; it is read
/// whole, up to [`limits::LEGACY_MAX_MANIFEST_BYTES`], and checked by the same rules except
/// the depth and entry limits, which did not exist when it was written.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ManifestParser {
    limits: Limits,
    stage: Stage,
    header: Option<Header>,
    check: EntryCheck,
    /// Bytes fed and not consumed yet start at `pos`.
    buf: Vec<u8>,
    pos: usize,
    eof: bool,
    read: u64,
}

/// Bytes a parser is fed at a time by [`ManifestReader`] and the store's plans.
pub const PARSE_CHUNK: usize = 64 << 10;

impl ManifestParser {
    /// A parser checking `limits`.
    pub fn new(limits: Limits) -> ManifestParser {
        ManifestParser {
            limits,
            stage: Stage::Start,
            header: None,
            check: EntryCheck::new(limits),
            buf: Vec::new(),
            pos: 0,
            eof: false,
            read: 0,
        }
    }

    /// Adds input bytes; an empty `chunk` is the end of the input.
    pub fn feed(&mut self, chunk: &[u8]) {
        if chunk.is_empty() {
            self.eof = true;
            return;
        }
        if self.pos > 0 {
            self.buf.drain(..self.pos);
            self.pos = 0;
        }
        self.buf.extend_from_slice(chunk);
    }

    /// The header, once it was returned.
    pub fn header(&self) -> Option<&Header> {
        self.header.as_ref()
    }

    /// Bytes of the input consumed so far.
    pub fn bytes_read(&self) -> u64 {
        self.read
    }

    /// The next line (newline included) of the buffered input; `Ok(None)` when more input is
    /// needed or the input ended cleanly.
    fn line(&mut self) -> Result<Option<std::ops::Range<usize>>, FormatError> {
        let avail = &self.buf[self.pos..];
        let window = &avail[..avail.len().min(limits::MAX_LINE + 1)];
        let n = match window.iter().position(|b| *b == b'\n') {
            Some(i) => i + 1,
            None if window.len() > limits::MAX_LINE => window.len(),
            None if self.eof && !window.is_empty() => window.len(),
            None => return Ok(None),
        };
        let range = self.pos..self.pos + n;
        self.pos += n;
        self.read += n as u64;
        if self.read > self.limits.max_manifest_bytes {
            return Err(FormatError::TooLarge(self.limits.max_manifest_bytes));
        }
        if self.buf[range.end - 1] != b'\n' {
            return Err(if n > limits::MAX_LINE {
                FormatError::LineTooLong(limits::MAX_LINE)
            } else {
                FormatError::MissingNewline
            });
        }
        Ok(Some(range))
    }

    /// The next header or entry. After an error the parser is done.
    pub fn next_item(&mut self) -> Result<Parsed, FormatError> {
        let r = self.step();
        if r.is_err() {
            self.stage = Stage::Done;
        }
        r
    }

    fn step(&mut self) -> Result<Parsed, FormatError> {
        match &mut self.stage {
            Stage::Done => Ok(Parsed::End),
            Stage::Start => {
                let Some(range) = self.line()? else {
                    return if self.eof {
                        Err(FormatError::Empty)
                    } else {
                        Ok(Parsed::NeedMore)
                    };
                };
                if &self.buf[range.clone()] == b"{\n" {
                    self.stage = Stage::Legacy(self.buf[range].to_vec());
                    return self.step();
                }
                let header: Header = serde_json::from_slice(&self.buf[range])
                    .map_err(|e| FormatError::Json(format!("header: {e}")))?;
                if header.format != MANIFEST_FORMAT {
                    return Err(FormatError::BadVersion(header.format));
                }
                header.validate()?;
                if header.files > self.limits.max_entries {
                    return Err(FormatError::TooManyEntries(self.limits.max_entries));
                }
                self.header = Some(header);
                self.stage = Stage::Entries;
                Ok(Parsed::Header(header))
            }
            Stage::Legacy(doc) => {
                let max = limits::LEGACY_MAX_MANIFEST_BYTES;
                doc.extend_from_slice(&self.buf[self.pos..]);
                self.pos = self.buf.len();
                if doc.len() as u64 > max {
                    return Err(FormatError::TooLarge(max));
                }
                if !self.eof {
                    return Ok(Parsed::NeedMore);
                }
                let doc = std::mem::take(doc);
                self.read = doc.len() as u64;
                let m: LegacyManifest =
                    serde_json::from_slice(&doc).map_err(|e| FormatError::Json(e.to_string()))?;
                if m.format != LEGACY_MANIFEST_FORMAT {
                    return Err(FormatError::BadVersion(m.format));
                }
                let header = Header {
                    format: m.format,
                    id: m.id,
                    parent: m.parent,
                    epoch: m.epoch,
                    created_at_ms: m.created_at_ms,
                    files: m.entries.len() as u64,
                };
                header.validate()?;
                self.check = EntryCheck::new(Limits {
                    max_entries: u64::MAX,
                    max_depth: usize::MAX,
                    ..self.limits
                });
                self.header = Some(header);
                self.stage = Stage::LegacyEntries(m.entries, 0);
                Ok(Parsed::Header(header))
            }
            Stage::LegacyEntries(entries, next) => match entries.get(*next) {
                Some(e) => {
                    let e = e.clone();
                    *next += 1;
                    self.check.push(&e.name, e.mode, e.size)?;
                    Ok(Parsed::Entry(e))
                }
                None => {
                    self.stage = Stage::Done;
                    Ok(Parsed::End)
                }
            },
            Stage::Entries => {
                let files = self.header.map_or(0, |h| h.files);
                let Some(range) = self.line()? else {
                    if !self.eof {
                        return Ok(Parsed::NeedMore);
                    }
                    self.stage = Stage::Done;
                    if self.check.count() != files {
                        return Err(FormatError::CountMismatch {
                            header: files,
                            found: self.check.count(),
                        });
                    }
                    return Ok(Parsed::End);
                };
                if self.check.count() == files {
                    return Err(FormatError::CountMismatch {
                        header: files,
                        found: files + 1,
                    });
                }
                let e: Entry = serde_json::from_slice(&self.buf[range]).map_err(|err| {
                    FormatError::Json(format!("entry {}: {err}", self.check.count() + 1))
                })?;
                self.check.push(&e.name, e.mode, e.size)?;
                Ok(Parsed::Entry(e))
            }
        }
    }
}

/// A streaming reader of a manifest of either format: a [`ManifestParser`] fed from a reader.
pub struct ManifestReader<R> {
    r: R,
    parser: ManifestParser,
    header: Header,
}

/// A format-1 manifest, as earlier versions wrote it.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct LegacyManifest {
    format: u32,
    id: CheckpointId,
    parent: Option<CheckpointId>,
    epoch: u64,
    created_at_ms: u64,
    entries: Vec<Entry>,
}

impl<R: std::io::BufRead> ManifestReader<R> {
    /// Reads and checks the header (for format 1: the whole manifest).
    pub fn new(r: R, limits: Limits) -> Result<ManifestReader<R>, FormatError> {
        let mut me = ManifestReader {
            r,
            parser: ManifestParser::new(limits),
            header: Header {
                format: 0,
                id: CheckpointId::FIRST,
                parent: None,
                epoch: 0,
                created_at_ms: 0,
                files: 0,
            },
        };
        match me.pull()? {
            Parsed::Header(h) => {
                me.header = h;
                Ok(me)
            }
            Parsed::NeedMore | Parsed::Entry(_) | Parsed::End => Err(FormatError::Empty),
        }
    }

    /// The parser's next result, feeding it from the reader as needed.
    fn pull(&mut self) -> Result<Parsed, FormatError> {
        loop {
            match self.parser.next_item()? {
                Parsed::NeedMore => {
                    let chunk = self
                        .r
                        .fill_buf()
                        .map_err(|e| FormatError::Json(e.to_string()))?;
                    let n = chunk.len().min(PARSE_CHUNK);
                    self.parser.feed(&chunk[..n]);
                    self.r.consume(n);
                }
                p => return Ok(p),
            }
        }
    }

    /// The header (for format 1, built from the document).
    pub fn header(&self) -> &Header {
        &self.header
    }

    /// Bytes read so far.
    pub fn bytes_read(&self) -> u64 {
        self.parser.bytes_read()
    }

    /// The underlying reader.
    pub fn into_inner(self) -> R {
        self.r
    }

    /// The next entry, checked; `None` after the last one, once the count and the end of the
    /// input have been checked too.
    pub fn next_entry(&mut self) -> Result<Option<Entry>, FormatError> {
        match self.pull()? {
            Parsed::Entry(e) => Ok(Some(e)),
            Parsed::End => Ok(None),
            Parsed::Header(_) | Parsed::NeedMore => Err(FormatError::Json(
                "a second header where an entry belongs".into(),
            )),
        }
    }
}

/// The content of `CURRENT`: which manifest is current and the sha256 of its bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Current {
    /// The current checkpoint's id.
    pub id: CheckpointId,
    /// sha256 of the manifest file's bytes.
    pub manifest_sha256: Digest,
}

impl Current {
    /// The exact bytes stored in `CURRENT`: `<id> <sha256>\n`.
    pub fn to_bytes(&self) -> Vec<u8> {
        format!("{} {}\n", self.id, self.manifest_sha256).into_bytes()
    }

    /// Parses `CURRENT` bytes, accepting only the exact form [`Current::to_bytes`] writes.
    pub fn parse(bytes: &[u8]) -> Result<Self, FormatError> {
        if bytes.is_empty() {
            return Err(FormatError::Empty);
        }
        if bytes.last() != Some(&b'\n') {
            return Err(FormatError::MissingNewline);
        }
        if bytes.len() != CURRENT_LEN {
            return Err(FormatError::BadLength {
                actual: bytes.len(),
                expected: CURRENT_LEN,
            });
        }
        // Split on bytes, then decode each part: valid UTF-8 may hold a multi-byte character
        // across byte 20, where a split of the text would panic (found by the `current` fuzz
        // target).
        let (id, rest) = bytes[..CURRENT_LEN - 1].split_at(20);
        let id: CheckpointId = std::str::from_utf8(id)
            .map_err(|_| FormatError::BadId(String::from_utf8_lossy(id).into()))?
            .parse()?;
        let rest = std::str::from_utf8(rest)
            .map_err(|_| FormatError::BadDigest(String::from_utf8_lossy(rest).into()))?;
        let digest = rest.strip_prefix(' ').ok_or(FormatError::BadSeparator)?;
        Ok(Current {
            id,
            manifest_sha256: digest.parse()?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn d(b: u8) -> Digest {
        Digest([b; 32])
    }

    fn entry(name: &str) -> Entry {
        Entry {
            name: name.into(),
            size: 3,
            sha256: d(7),
            mode: 0o644,
        }
    }

    fn manifest(entries: Vec<Entry>) -> Manifest {
        Manifest {
            format: MANIFEST_FORMAT,
            id: CheckpointId::new(2).unwrap(),
            parent: CheckpointId::new(1),
            epoch: 4,
            created_at_ms: 1_700_000_000_000,
            entries,
        }
    }

    #[test]
    fn digest_round_trips_and_refuses_other_spellings() {
        let x = Digest([0xab; 32]);
        assert_eq!(x.to_hex().parse::<Digest>().unwrap(), x);
        assert!("AB".repeat(32).parse::<Digest>().is_err(), "uppercase");
        assert!("ab".repeat(31).parse::<Digest>().is_err(), "short");
        assert!("ab".repeat(33).parse::<Digest>().is_err(), "long");
        assert!(format!("{}g", "a".repeat(63)).parse::<Digest>().is_err());
    }

    #[test]
    fn id_is_twenty_digits_and_never_zero() {
        let id = CheckpointId::new(42).unwrap();
        assert_eq!(id.to_string(), "00000000000000000042");
        assert_eq!("00000000000000000042".parse::<CheckpointId>().unwrap(), id);
        assert!("42".parse::<CheckpointId>().is_err());
        assert!("00000000000000000000".parse::<CheckpointId>().is_err());
        assert!(
            "99999999999999999999".parse::<CheckpointId>().is_err(),
            "overflow"
        );
        assert!("+0000000000000000042".parse::<CheckpointId>().is_err());
        assert_eq!(
            CheckpointId::from_manifest_file_name("00000000000000000042.json"),
            Some(id)
        );
        assert_eq!(CheckpointId::from_manifest_file_name(".tmp.json"), None);
        assert_eq!(CheckpointId::new(u64::MAX).unwrap().next(), None);
    }

    #[test]
    fn current_round_trips() {
        let c = Current {
            id: CheckpointId::new(7).unwrap(),
            manifest_sha256: d(0x5a),
        };
        let bytes = c.to_bytes();
        assert_eq!(bytes.len(), CURRENT_LEN);
        assert_eq!(Current::parse(&bytes).unwrap(), c);
    }

    #[test]
    fn current_refuses_every_deviation() {
        let good = Current {
            id: CheckpointId::new(7).unwrap(),
            manifest_sha256: d(0x5a),
        }
        .to_bytes();
        assert_eq!(Current::parse(b""), Err(FormatError::Empty));
        assert_eq!(
            Current::parse(&good[..good.len() - 1]),
            Err(FormatError::MissingNewline)
        );
        let mut two = good.clone();
        two.push(b'\n');
        assert!(matches!(
            Current::parse(&two),
            Err(FormatError::BadLength { .. })
        ));
        let mut crlf = good[..good.len() - 1].to_vec();
        crlf.extend_from_slice(b"\r\n");
        assert!(Current::parse(&crlf).is_err());
        let mut tab = good.clone();
        tab[20] = b'\t';
        assert_eq!(Current::parse(&tab), Err(FormatError::BadSeparator));
        // Every single-byte change of a valid CURRENT is refused or names another checkpoint;
        // the store's digest check catches the latter.
        for i in 0..good.len() {
            for bit in 0..8 {
                let mut b = good.clone();
                b[i] ^= 1 << bit;
                if let Ok(c) = Current::parse(&b) {
                    assert_ne!(c, Current::parse(&good).unwrap());
                }
            }
        }
    }

    /// Found by fuzzing: a multi-byte character across byte 20 of CURRENT made
    /// the parser panic instead of refusing the file.
    #[test]
    fn current_with_a_character_across_the_id_is_refused_not_a_panic() {
        let bytes = b"00000000000000001c6\xc6\x9a\xcd\x9d024bc\xcc\xa6190072a88d82ee4a1092855d34c75bfa28d2855d34c75bfa28ddA50\n";
        assert_eq!(bytes.len(), CURRENT_LEN);
        assert!(matches!(Current::parse(bytes), Err(FormatError::BadId(_))));
        let mut id_then_char = b"0000000000000000000".to_vec();
        id_then_char.extend_from_slice("ƚ".as_bytes());
        id_then_char.extend_from_slice(&[b'a'; 64]);
        id_then_char.push(b'\n');
        assert_eq!(id_then_char.len(), CURRENT_LEN);
        assert!(matches!(
            Current::parse(&id_then_char),
            Err(FormatError::BadId(_))
        ));
    }

    #[test]
    fn manifest_round_trips() {
        let m = manifest(vec![entry("a"), entry("b/c"), entry("b/d")]);
        assert_eq!(Manifest::parse(&m.to_bytes()).unwrap(), m);
    }

    #[test]
    fn manifest_refuses_unknown_fields_and_versions() {
        let m = manifest(vec![entry("a")]);
        let text = String::from_utf8(m.to_bytes()).unwrap();
        let (header, rest) = text.split_once('\n').unwrap();
        let extra = format!("{}, \"extra\": 1}}\n{rest}", &header[..header.len() - 1]);
        assert!(matches!(
            Manifest::parse(extra.as_bytes()),
            Err(FormatError::Json(_))
        ));
        let extra_entry = text.replace("\"mode\":420}", "\"mode\":420,\"x\":1}");
        assert!(matches!(
            Manifest::parse(extra_entry.as_bytes()),
            Err(FormatError::Json(_))
        ));
        let v3 = text.replacen("\"format\":2", "\"format\":3", 1);
        assert_eq!(
            Manifest::parse(v3.as_bytes()),
            Err(FormatError::BadVersion(3))
        );
        assert_eq!(Manifest::parse(b""), Err(FormatError::Empty));
        assert!(matches!(
            Manifest::parse(b"{not-json\n"),
            Err(FormatError::Json(_))
        ));
        // Truncated at a line boundary, or with a line added: the count says so.
        let cut = format!("{header}\n");
        assert!(matches!(
            Manifest::parse(cut.as_bytes()),
            Err(FormatError::CountMismatch {
                header: 1,
                found: 0
            })
        ));
        let more = format!("{text}{}", String::from_utf8(entry("b").to_line()).unwrap());
        assert!(matches!(
            Manifest::parse(more.as_bytes()),
            Err(FormatError::CountMismatch { .. })
        ));
        // A missing final newline, or a line longer than any writer makes.
        assert_eq!(
            Manifest::parse(&text.as_bytes()[..text.len() - 1]),
            Err(FormatError::MissingNewline)
        );
        let long = format!("{header}\n{}\n", "x".repeat(limits::MAX_LINE + 10));
        assert_eq!(
            Manifest::parse(long.as_bytes()),
            Err(FormatError::LineTooLong(limits::MAX_LINE))
        );
    }

    /// Manifests of format 1, as earlier versions wrote them (one pretty-printed document),
    /// still load, with their own rules.
    #[test]
    fn legacy_manifests_still_load() {
        let entries = vec![entry("a"), entry("b/c")];
        let legacy = serde_json::json!({
            "format": 1,
            "id": "00000000000000000002",
            "parent": "00000000000000000001",
            "epoch": 4,
            "created_at_ms": 1_700_000_000_000u64,
            "entries": entries,
        });
        let mut bytes = serde_json::to_vec_pretty(&legacy).unwrap();
        bytes.push(b'\n');
        let m = Manifest::parse(&bytes).unwrap();
        assert_eq!(m.format, LEGACY_MANIFEST_FORMAT);
        assert_eq!(m.entries, entries);
        assert_eq!(m.epoch, 4);
        let mut bad = legacy.clone();
        bad["entries"] = serde_json::json!([entry("b"), entry("a")]);
        let mut bytes = serde_json::to_vec_pretty(&bad).unwrap();
        bytes.push(b'\n');
        assert!(matches!(
            Manifest::parse(&bytes),
            Err(FormatError::Unsorted(_))
        ));
    }

    /// Every limit, at and one past it.
    #[test]
    fn limits_hold_at_and_refuse_past() {
        let l = Limits::DEFAULT;
        let deep = |n: usize| vec!["d"; n].join("/");
        assert!(check_name(&deep(l.max_depth)).is_ok());
        assert!(matches!(
            check_name(&deep(l.max_depth + 1)),
            Err(FormatError::TooDeep { .. })
        ));
        let long = |n: usize| {
            let mut s = String::new();
            while s.len() < n {
                if !s.is_empty() {
                    s.push('/');
                }
                let part = (n - s.len()).min(200);
                s.push_str(&"n".repeat(part));
            }
            s
        };
        assert_eq!(long(l.max_name_len).len(), l.max_name_len);
        assert!(check_name(&long(l.max_name_len)).is_ok());
        assert!(check_name(&long(l.max_name_len + 1)).is_err());
        assert!(check_name(&"c".repeat(l.max_component_len)).is_ok());
        assert!(check_name(&"c".repeat(l.max_component_len + 1)).is_err());
        let small = Limits {
            max_entries: 2,
            ..l
        };
        let mut c = EntryCheck::new(small);
        c.push("a", 0o600, 1).unwrap();
        c.push("b", 0o600, 1).unwrap();
        assert_eq!(c.push("c", 0o600, 1), Err(FormatError::TooManyEntries(2)));
        // The longest entry line a writer can make stays under the reader's line limit.
        let worst = "\u{1}".repeat(l.max_name_len);
        assert!(Entry::line_bound(&worst) < limits::MAX_LINE as u64);
        let e = Entry {
            name: worst.clone(),
            size: u64::MAX,
            sha256: d(1),
            mode: 0o777,
        };
        assert_eq!(e.to_line().len() as u64, Entry::line_bound(&worst));
    }

    #[test]
    fn manifest_refuses_bad_parents_modes_and_order() {
        let mut m = manifest(vec![entry("a")]);
        m.parent = Some(m.id);
        assert!(matches!(m.validate(), Err(FormatError::BadParent { .. })));
        let mut m = manifest(vec![entry("a")]);
        m.entries[0].mode = 0o4755;
        assert_eq!(m.validate(), Err(FormatError::BadMode(0o4755)));
        let m = manifest(vec![entry("b"), entry("a")]);
        assert!(matches!(m.validate(), Err(FormatError::Unsorted(_))));
        let m = manifest(vec![entry("a"), entry("a")]);
        assert!(matches!(m.validate(), Err(FormatError::Unsorted(_))));
        let m = manifest(vec![entry("a"), entry("a-b"), entry("a/c")]);
        assert_eq!(m.validate(), Err(FormatError::FileDirClash("a".into())));
    }

    #[test]
    fn names_that_could_escape_a_view_are_refused() {
        for bad in ["", "/a", "a//b", "a/", "./a", "a/..", "..", "a/./b", "a\0b"] {
            assert!(check_name(bad).is_err(), "{bad:?} must be refused");
        }
        assert!(check_name(&"x".repeat(256)).is_err());
        assert!(check_name(&"x/".repeat(2049)).is_err());
        for good in ["a", "a/b", ".hidden", "a..b", "dir/sub/file.bin", "日本"] {
            assert!(check_name(good).is_ok(), "{good:?} must be accepted");
        }
    }
}

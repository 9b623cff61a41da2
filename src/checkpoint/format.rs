//! On-disk formats of the checkpoint store: digests, checkpoint ids, entry names, the manifest
//! and the `CURRENT` pointer.
//!
//! Every parser here is strict: it accepts exactly what the matching writer produces and names
//! what is wrong otherwise. Nothing in this module touches the filesystem, so every rule can be
//! tested byte by byte.

use std::collections::BTreeSet;
use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// The manifest format version this build writes and accepts.
pub const MANIFEST_FORMAT: u32 = 1;

/// The longest entry name accepted, in bytes (PATH_MAX on Linux).
pub const MAX_NAME_LEN: usize = 4096;

/// The longest single path component accepted, in bytes (NAME_MAX on Linux).
pub const MAX_COMPONENT_LEN: usize = 255;

/// The largest manifest accepted, in bytes (about 40,000 entries); a bigger file is refused
/// before it is parsed so a corrupt or hostile manifest cannot make a loader allocate without
/// bound, and loading stays within its memory budget.
pub const MAX_MANIFEST_LEN: u64 = 8 * 1024 * 1024;

/// The exact length of a well-formed `CURRENT` file: 20-digit id, a space, 64 hex digits, `\n`.
pub const CURRENT_LEN: usize = 20 + 1 + 64 + 1;

/// Why a piece of on-disk text was refused; the caller adds the file it came from.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
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
    #[error("has format version {0}, this build understands only version 1")]
    BadVersion(u32),
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
    /// The manifest is larger than [`MAX_MANIFEST_LEN`].
    #[error("is {0} bytes, larger than the 8 MiB a manifest may hold")]
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
        for b in &self.0 {
            write!(f, "{b:02x}")?;
        }
        Ok(())
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
        let bad = || FormatError::BadDigest(s.chars().take(80).collect());
        let bytes = s.as_bytes();
        if bytes.len() != 64 {
            return Err(bad());
        }
        let mut out = [0u8; 32];
        for (i, pair) in bytes.chunks_exact(2).enumerate() {
            let hi = hex_val(pair[0]).ok_or_else(bad)?;
            let lo = hex_val(pair[1]).ok_or_else(bad)?;
            out[i] = (hi << 4) | lo;
        }
        Ok(Digest(out))
    }
}

fn hex_val(c: u8) -> Option<u8> {
    match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        _ => None,
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
    /// Serialises the manifest into the bytes that are stored and digested.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut v = serde_json::to_vec_pretty(self).expect("a manifest always serialises");
        v.push(b'\n');
        v
    }

    /// Parses and validates manifest bytes; see [`Manifest::validate`] for the rules.
    pub fn parse(bytes: &[u8]) -> Result<Self, FormatError> {
        if bytes.is_empty() {
            return Err(FormatError::Empty);
        }
        if bytes.len() as u64 > MAX_MANIFEST_LEN {
            return Err(FormatError::TooLarge(bytes.len() as u64));
        }
        let m: Manifest =
            serde_json::from_slice(bytes).map_err(|e| FormatError::Json(e.to_string()))?;
        m.validate()?;
        Ok(m)
    }

    /// Checks the rules a parsed manifest must meet: known format, parent older than the
    /// checkpoint, valid modes, and names that are valid, sorted, unique and never both a file
    /// and a directory.
    pub fn validate(&self) -> Result<(), FormatError> {
        if self.format != MANIFEST_FORMAT {
            return Err(FormatError::BadVersion(self.format));
        }
        if let Some(p) = self.parent
            && p >= self.id
        {
            return Err(FormatError::BadParent {
                id: self.id,
                parent: p,
            });
        }
        check_entries(&self.entries)
    }

    /// Total bytes of all entries.
    pub fn total_size(&self) -> u64 {
        self.entries.iter().map(|e| e.size).sum()
    }
}

/// Checks a list of entries: names valid and strictly increasing, modes within 0o777, no name
/// used both as a file and as a directory.
pub fn check_entries(entries: &[Entry]) -> Result<(), FormatError> {
    let mut files: BTreeSet<&str> = BTreeSet::new();
    let mut prev: Option<&str> = None;
    for e in entries {
        check_name(&e.name)?;
        if e.mode & !0o777 != 0 {
            return Err(FormatError::BadMode(e.mode));
        }
        if let Some(p) = prev
            && p.as_bytes() >= e.name.as_bytes()
        {
            return Err(FormatError::Unsorted(e.name.clone()));
        }
        prev = Some(&e.name);
        files.insert(&e.name);
    }
    for e in entries {
        for (i, b) in e.name.bytes().enumerate() {
            if b == b'/' && files.contains(&e.name[..i]) {
                return Err(FormatError::FileDirClash(e.name[..i].to_string()));
            }
        }
    }
    Ok(())
}

/// Checks one entry name: a relative path of `/`-separated components, none empty, `.` or
/// `..`, no NUL, at most 255 bytes per component and 4096 in all. These rules make every name
/// safe to re-create under a view directory without escaping it.
pub fn check_name(name: &str) -> Result<(), FormatError> {
    let bad = |reason| {
        Err(FormatError::BadName {
            name: name.chars().take(200).collect(),
            reason,
        })
    };
    if name.is_empty() {
        return bad("it is empty");
    }
    if name.len() > MAX_NAME_LEN {
        return bad("it is longer than 4096 bytes");
    }
    if name.contains('\0') {
        return bad("it contains a NUL byte");
    }
    if name.starts_with('/') {
        return bad("it is absolute");
    }
    for c in name.split('/') {
        match c {
            "" => return bad("it has an empty component"),
            "." | ".." => return bad("it has a `.` or `..` component"),
            c if c.len() > MAX_COMPONENT_LEN => return bad("a component is longer than 255 bytes"),
            _ => {}
        }
    }
    Ok(())
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
        let text = std::str::from_utf8(&bytes[..CURRENT_LEN - 1])
            .map_err(|_| FormatError::BadId(String::from_utf8_lossy(&bytes[..20]).into()))?;
        // Byte 20 is ASCII only if the text is valid UTF-8 up to here, which from_utf8 checked.
        let (id, rest) = text.split_at(20);
        let id: CheckpointId = id.parse()?;
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
            format: 1,
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

    #[test]
    fn manifest_round_trips() {
        let m = manifest(vec![entry("a"), entry("b/c"), entry("b/d")]);
        assert_eq!(Manifest::parse(&m.to_bytes()).unwrap(), m);
    }

    #[test]
    fn manifest_refuses_unknown_fields_and_versions() {
        let m = manifest(vec![entry("a")]);
        let mut v: serde_json::Value = serde_json::from_slice(&m.to_bytes()).unwrap();
        v["extra"] = 1.into();
        assert!(matches!(
            Manifest::parse(&serde_json::to_vec(&v).unwrap()),
            Err(FormatError::Json(_))
        ));
        let mut m2 = m.clone();
        m2.format = 2;
        assert_eq!(
            Manifest::parse(&m2.to_bytes()),
            Err(FormatError::BadVersion(2))
        );
        assert_eq!(Manifest::parse(b""), Err(FormatError::Empty));
        assert!(matches!(
            Manifest::parse(b"{not-json"),
            Err(FormatError::Json(_))
        ));
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

//! The JSON records of the control folder: the owner record, the directory identity marker,
//! waiter entries and registry entries. They are evidence for `status`, `stop` and sweeping,
//! never the authority on who owns (the kernel lock is).

use std::fmt;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::cgroup::CgroupRecord;
use super::identity::Identity;
use crate::machine::PhaseKind;

/// How an ownership contains its workload (spec/runner.md, "Containment"), as its owner record
/// says. A cgroup is named by the record the acquisition writes, before any process can enter
/// it, so that a successor knows what to end (card T2); the inherited lock descriptor is
/// recorded with the next phase change, for `status` only.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", tag = "mechanism")]
pub enum Containment {
    /// A cgroup of this ownership contains the workload.
    Cgroup(CgroupRecord),
    /// No cgroup: the workload keeps a duplicate of the lock descriptor, so the kernel keeps the
    /// dir locked while any process of it holds one.
    LockFd,
}

/// The format version written into every record.
pub const RECORD_VERSION: u32 = 1;

/// A random 128-bit token naming one ownership; shown as 32 lowercase hex digits.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Token(pub [u8; 16]);

impl Token {
    /// Parses 32 lowercase hex digits.
    pub fn parse(s: &str) -> Option<Token> {
        crate::hex::decode(s).map(Token)
    }
}

impl fmt::Display for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        crate::hex::write(f, &self.0)
    }
}

impl fmt::Debug for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Token({self})")
    }
}

impl Serialize for Token {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Token {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Token, D::Error> {
        d.deserialize_string(TokenVisitor)
    }
}

/// Reads a token from a string without copying it first (records are parsed on every
/// inspection). It accepts what `String` does and fails as it does: its `expecting` is
/// `String`'s ("a string"), so a token of the wrong type is refused with the same message.
struct TokenVisitor;

impl serde::de::Visitor<'_> for TokenVisitor {
    type Value = Token;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a string")
    }

    fn visit_str<E: serde::de::Error>(self, s: &str) -> Result<Token, E> {
        Token::parse(s).ok_or_else(|| E::custom("token must be 32 lowercase hex digits"))
    }

    fn visit_bytes<E: serde::de::Error>(self, b: &[u8]) -> Result<Token, E> {
        // As `String` does: bytes are a string when they are UTF-8.
        match std::str::from_utf8(b) {
            Ok(s) => self.visit_str(s),
            Err(_) => Err(E::invalid_value(serde::de::Unexpected::Bytes(b), &self)),
        }
    }
}

/// `.tenure/owner.json`: who acquired the lease, when, with which epoch, and in which phase it
/// is. Written (durably) only while the lock is held.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct OwnerRecord {
    /// Format version ([`RECORD_VERSION`]).
    pub version: u32,
    /// The ownership's random token.
    pub token: Token,
    /// The epoch of this ownership.
    pub epoch: u64,
    /// When the lease was acquired (unix milliseconds).
    pub acquired_at: u64,
    /// The owner's lifecycle phase (`released` after an orderly release).
    pub phase: PhaseKind,
    /// The owner process.
    pub identity: Identity,
    /// The root id of the dir's identity marker when the record was written (card P4): a
    /// record copied into another dir (`cp -a`) is recognised as not this dir's and never
    /// acted on. Absent in records of older versions, which are treated as foreign.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub root_id: Option<Token>,
    /// How this ownership contains its workload (a cgroup: from the acquisition on, before any
    /// process can enter it, so that a successor can end what a crashed owner left running,
    /// card T2).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub containment: Option<Containment>,
}

/// `.tenure/identity.json`: the directory identity marker, written once by the first owner of a
/// cold dir (card L7) and checked by every later acquisition (card L8).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct DirIdentity {
    /// Format version ([`RECORD_VERSION`]).
    pub version: u32,
    /// A random 128-bit id of this state dir.
    pub root_id: Token,
    /// The canonical path of the state dir when the marker was written (or last adopted).
    pub path: PathBuf,
    /// When the marker was first written (unix milliseconds).
    pub created_at: u64,
    /// When the dir was last adopted explicitly (unix milliseconds), if ever.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub adopted_at: Option<u64>,
}

/// An entry of `.tenure/waiters/`: a contender waiting for the lease.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct WaiterRecord {
    /// Format version ([`RECORD_VERSION`]).
    pub version: u32,
    /// The waiting process.
    pub identity: Identity,
    /// When it started waiting (unix milliseconds).
    pub since: u64,
}

/// An entry of `.tenure/registry/leases/` (the owner) or `.tenure/registry/instances/` (a
/// process the owner runs on the state dir's behalf).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct RegistryRecord {
    /// Format version ([`RECORD_VERSION`]).
    pub version: u32,
    /// The epoch of the ownership that wrote the entry.
    pub epoch: u64,
    /// The token of the ownership that wrote the entry.
    pub token: Token,
    /// The entry's name (`owner` for the lease entry).
    pub name: String,
    /// The registered process.
    pub identity: Identity,
    /// When the entry was written (unix milliseconds).
    pub since: u64,
    /// The root id of the dir the entry belongs to (card P4; see [`OwnerRecord::root_id`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub root_id: Option<Token>,
}

/// Parses a JSON record of the control folder, as every reader of it does (the fuzz targets
/// call the same functions).
pub fn parse<T: serde::de::DeserializeOwned>(bytes: &[u8]) -> Result<T, String> {
    serde_json::from_slice(bytes).map_err(|e| e.to_string())
}

fn versioned(version: u32) -> Result<(), String> {
    if version == RECORD_VERSION {
        Ok(())
    } else {
        Err(format!(
            "format version {version}, this tenure reads {RECORD_VERSION}"
        ))
    }
}

/// Parses an owner record (`owner.json`) and checks its version.
pub fn parse_owner(bytes: &[u8]) -> Result<OwnerRecord, String> {
    // The compact form tenure writes is read directly; anything else goes through serde_json
    // (the same record, or the same error: see [`compact`]).
    let r: OwnerRecord = match compact::owner(bytes) {
        Some(r) => r,
        None => parse(bytes)?,
    };
    versioned(r.version)?;
    Ok(r)
}

/// The owner record file (`owner.json`) in the format written in place (issue 11): one
/// [`OWNER_SLOT`]-byte slot at offset 0 — a 16-byte header (the magic `TOR1`, the
/// payload's length as u32 LE, and the first 8 bytes of `sha256("tenure owner slot\n" ‖
/// payload)`), the record as compact JSON, and zeros to the end of the slot. Every rewrite
/// overwrites the whole slot in place with one `pwrite` (one page: a process killed in the
/// middle of it leaves the old page or the new one); no temp file, no rename, no unlink, no
/// sync. A slot whose checksum does not match was torn — by a power loss, which ended every
/// process the record could speak for, or by a rewrite a reader raced — and holds no record:
/// it is never trusted.
///
/// Older tenure wrote the file as one pretty JSON document (replaced by rename); it is still
/// read (a file starting with `{`), and overwritten in place by the next write.
pub const OWNER_SLOT: usize = 4096;

/// The bytes of the owner slot's header.
const OWNER_HEADER: usize = 16;

/// The largest record payload the slot holds; a larger record (an absurdly long executable or
/// cgroup path) is written whole, in the older format, instead.
const OWNER_CAPACITY: usize = OWNER_SLOT - OWNER_HEADER;

const OWNER_MAGIC: &[u8; 4] = b"TOR1";
const OWNER_DOMAIN: &[u8] = b"tenure owner slot\n";

/// The first 8 bytes of `sha256(domain ‖ body)`: the checksum of the lease's in-place slots
/// (the owner slot here, the epoch file's slots in `epoch.rs`).
pub(crate) fn slot_checksum(domain: &[u8], body: &[u8]) -> [u8; 8] {
    use sha2::Digest as _;
    let mut h = sha2::Sha256::new();
    h.update(domain);
    h.update(body);
    let d = h.finalize();
    let mut out = [0u8; 8];
    out.copy_from_slice(&d[..8]);
    out
}

/// A checksummed slot of `OWNER_SLOT` bytes (the owner record's, a registry entry's): `magic`,
/// the payload's length as u32 LE, the first 8 bytes of `sha256(domain ‖ payload)`, the
/// payload (written by `payload`), zeros to the end. `None` when the payload does not fit.
fn frame(magic: &[u8; 4], domain: &[u8], payload: impl FnOnce(&mut Vec<u8>)) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(OWNER_SLOT);
    out.extend_from_slice(magic);
    out.extend_from_slice(&[0; 12]);
    payload(&mut out);
    let len = out.len() - OWNER_HEADER;
    if len > OWNER_CAPACITY {
        return None;
    }
    let sum = slot_checksum(domain, &out[OWNER_HEADER..]);
    out[4..8].copy_from_slice(&(len as u32).to_le_bytes());
    out[8..16].copy_from_slice(&sum);
    out.resize(OWNER_SLOT, 0);
    Some(out)
}

/// The payload of the slot [`frame`] wrote at the start of `bytes`, if its magic and checksum
/// match (else it was torn, or never written).
fn unframe<'a>(magic: &[u8; 4], domain: &[u8], bytes: &'a [u8]) -> Option<&'a [u8]> {
    let h = bytes.get(..OWNER_HEADER)?;
    let len = u32::from_le_bytes(h[4..8].try_into().ok()?) as usize;
    if &h[..4] != magic || len > OWNER_CAPACITY {
        return None;
    }
    let payload = bytes.get(OWNER_HEADER..OWNER_HEADER + len)?;
    (h[8..16] == slot_checksum(domain, payload)).then_some(payload)
}

/// The slot holding `record` (written at offset 0); `None` when the record does not fit.
pub(crate) fn owner_slot(record: &OwnerRecord) -> Option<Vec<u8>> {
    frame(OWNER_MAGIC, OWNER_DOMAIN, |out| {
        if !compact::write_owner(out, record) {
            serde_json::to_writer(out, record).expect("records serialise infallibly");
        }
    })
}

/// The payload of the slot at the start of `bytes`, if its checksum matches.
fn owner_payload(bytes: &[u8]) -> Option<&[u8]> {
    // The mutant `lease-owner-slot-unchecked` trusts the slot as it reads: a torn one
    // (garbage) then claims a payload of garbage.
    if crate::mutant::on("lease-owner-slot-unchecked") {
        let h = bytes.get(..OWNER_HEADER)?;
        let len = u32::from_le_bytes(h[4..8].try_into().ok()?) as usize;
        let end = (OWNER_HEADER + len.min(OWNER_CAPACITY)).min(bytes.len());
        return Some(&bytes[OWNER_HEADER..end]);
    }
    unframe(OWNER_MAGIC, OWNER_DOMAIN, bytes)
}

/// Parses an owner record file in either format: `Ok(None)` when it holds no record — empty or
/// zeros (a power loss took the data of a record written without a sync) or a torn slot (see
/// [`OWNER_SLOT`]); an error names what is wrong with a record that is there.
pub fn decode_owner(bytes: &[u8]) -> Result<Option<OwnerRecord>, String> {
    if bytes.first() == Some(&b'{') {
        return parse_owner(bytes).map(Some);
    }
    match owner_payload(bytes) {
        Some(payload) => parse_owner(payload).map(Some),
        None => Ok(None),
    }
}

/// Whether `bytes` hold an owner slot whose checksum matches (or a record in the older
/// format): a reader that finds neither in a non-empty file may have raced a rewrite.
pub(crate) fn owner_is_whole(bytes: &[u8]) -> bool {
    bytes.iter().all(|&b| b == 0) || bytes.first() == Some(&b'{') || owner_payload(bytes).is_some()
}

/// The suffix of a registry entry written in place (issue 11): `registry/leases/owner.slot`
/// for the owner, `registry/instances/<name>.slot` for a process it runs. Each is one
/// [`OWNER_SLOT`]-byte slot framed like the owner record's (magic `TRG1`, its own checksum
/// domain) holding the entry as compact JSON, or nothing: a *vacant* slot (an empty payload)
/// is what an owner leaves when the process is gone or the lease released. The files are made
/// once and then only overwritten in place with one `pwrite` each — no create, no unlink per
/// run — and never synced (evidence for live processes). A slot that is all zeros, empty or
/// torn (its checksum does not match: a power loss, or a rewrite a reader raced) holds no
/// entry, like a vacant one. A record too large for the slot is written whole as JSON instead
/// (a file starting with `{`), and a later vacant slot written over its start ends it.
///
/// Older tenure created `<epoch>.json` and `<epoch>-<name>.json` per ownership and removed
/// them at release; those names are still read, swept and counted by the epoch rule.
pub const REGISTRY_SLOT_SUFFIX: &str = ".slot";
/// The owner's registry entry (in `registry/leases/`).
pub const OWNER_ENTRY: &str = "owner.slot";
const REGISTRY_MAGIC: &[u8; 4] = b"TRG1";
const REGISTRY_DOMAIN: &[u8] = b"tenure registry slot\n";

/// The in-place entry name of the instance `name` (`<name>.slot`).
pub fn instance_entry(name: &str) -> String {
    format!("{name}{REGISTRY_SLOT_SUFFIX}")
}

/// Whether a registry entry name is one written in place (`*.slot`), not an older
/// `<epoch>….json` one.
pub fn is_registry_slot(name: &str) -> bool {
    name.ends_with(REGISTRY_SLOT_SUFFIX)
}

/// The slot holding `entry`, or a vacant slot for `None`; `None` when the entry does not fit
/// (it is then written whole, as JSON).
pub fn registry_slot(entry: Option<&RegistryRecord>) -> Option<Vec<u8>> {
    frame(REGISTRY_MAGIC, REGISTRY_DOMAIN, |out| {
        if let Some(e) = entry
            && !compact::write_registry(out, e)
        {
            serde_json::to_writer(out, e).expect("records serialise infallibly");
        }
    })
}

/// Parses an in-place registry entry file: `Ok(None)` when it holds no entry — vacant, empty,
/// zeros or torn (see [`REGISTRY_SLOT_SUFFIX`]); an error names what is wrong with an entry
/// that is there (a checksummed payload, or a whole JSON record, that does not parse).
pub fn decode_registry_slot(bytes: &[u8]) -> Result<Option<RegistryRecord>, String> {
    if bytes.first() == Some(&b'{') {
        return parse(bytes).map(Some);
    }
    match unframe(REGISTRY_MAGIC, REGISTRY_DOMAIN, bytes) {
        Some([]) | None => Ok(None),
        Some(payload) => match compact::registry(payload) {
            Some(r) => Ok(Some(r)),
            None => parse(payload).map(Some),
        },
    }
}

/// Whether `bytes` hold a registry slot whose checksum matches (vacant or not), a whole JSON
/// record, or nothing at all: a reader that finds none of these may have raced a rewrite.
pub fn registry_slot_is_whole(bytes: &[u8]) -> bool {
    bytes.iter().all(|&b| b == 0)
        || bytes.first() == Some(&b'{')
        || unframe(REGISTRY_MAGIC, REGISTRY_DOMAIN, bytes).is_some()
}

/// Parses a dir identity marker (`identity.json`) and checks its version.
pub fn parse_marker(bytes: &[u8]) -> Result<DirIdentity, String> {
    let m: DirIdentity = parse(bytes)?;
    versioned(m.version)?;
    Ok(m)
}

/// The epoch a registry entry's name starts with (`<epoch>.json` or `<epoch>-<name>.json`).
pub fn registry_entry_epoch(name: &str) -> Option<u64> {
    let stem = name.strip_suffix(".json")?;
    let digits = stem.split('-').next()?;
    digits.parse().ok()
}

/// The pid and start time a waiter entry's name holds (`<pid>-<start>.json`).
pub fn waiter_entry_name(name: &str) -> Option<(u32, u64)> {
    let (p, s) = name.strip_suffix(".json")?.split_once('-')?;
    Some((p.parse().ok()?, s.parse().ok()?))
}

/// The current time in unix milliseconds.
pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// Formats unix milliseconds as an RFC 3339 UTC time (`2024-05-01T12:00:00.123Z`).
pub fn format_unix_ms(ms: u64) -> String {
    let secs = ms / 1000;
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    // Howard Hinnant's days-to-civil algorithm.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:03}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60,
        ms % 1000
    )
}

/// The compact JSON of the owner record and the registry entry as tenure writes them into their
/// slots (`serde_json::to_writer`: fields in declaration order, no whitespace), read and
/// written without serde's generic path: a lease reads the owner record on every inspection
/// and writes it on every phase change (the models do so for every state they explore).
///
/// Both directions are exact or decline: [`owner`] and [`registry`] accept only the bytes
/// serde_json writes for a record (no whitespace, no escapes, canonical numbers that fit,
/// optional fields absent rather than `null`) and return `None` for anything else, which the
/// caller then parses with serde_json — so every input is accepted or refused exactly as
/// before, with the same record or the same message. [`write_owner`] and [`write_registry`]
/// write serde_json's bytes, and decline (leaving `out` as it was) a record with a string that
/// JSON would escape or a path that is not UTF-8.
mod compact {
    use super::{Containment, Identity, OwnerRecord, RegistryRecord, Token};
    use crate::lease::cgroup::CgroupRecord;
    use crate::machine::PhaseKind;
    use std::path::PathBuf;

    /// A cursor over the bytes being read.
    struct Cur<'a> {
        b: &'a [u8],
        i: usize,
    }

    impl<'a> Cur<'a> {
        fn lit(&mut self, s: &[u8]) -> Option<()> {
            let end = self.i.checked_add(s.len())?;
            (self.b.get(self.i..end)? == s).then(|| self.i = end)
        }

        /// Whether the next bytes are `s` (consumed if so).
        fn peek_lit(&mut self, s: &[u8]) -> bool {
            self.lit(s).is_some()
        }

        /// A number as serde_json writes it: `0`, or digits without a leading zero, no sign,
        /// no fraction or exponent (the next literal fails on those), no overflow.
        fn u64(&mut self) -> Option<u64> {
            let start = self.i;
            let mut v: u64 = 0;
            while let Some(&c) = self.b.get(self.i) {
                if !c.is_ascii_digit() {
                    break;
                }
                v = v.checked_mul(10)?.checked_add(u64::from(c - b'0'))?;
                self.i += 1;
            }
            let n = self.i - start;
            (n == 1 || (n > 1 && self.b[start] != b'0')).then_some(v)
        }

        fn u32(&mut self) -> Option<u32> {
            u32::try_from(self.u64()?).ok()
        }

        /// A string without escapes or control characters, as UTF-8.
        fn str(&mut self) -> Option<&'a str> {
            self.lit(b"\"")?;
            let start = self.i;
            loop {
                match *self.b.get(self.i)? {
                    b'"' => break,
                    b'\\' | 0..=0x1f => return None,
                    _ => self.i += 1,
                }
            }
            let s = std::str::from_utf8(&self.b[start..self.i]).ok()?;
            self.i += 1;
            Some(s)
        }

        fn token(&mut self) -> Option<Token> {
            Token::parse(self.str()?)
        }

        fn phase(&mut self) -> Option<PhaseKind> {
            let s = self.str()?;
            PhaseKind::ALL.into_iter().find(|k| k.name() == s)
        }

        /// `{"pid":…,"start_time":…,"exe":"…"[,"pidfs_ino":…]}`
        fn identity(&mut self) -> Option<Identity> {
            self.lit(b"{\"pid\":")?;
            let pid = self.u32()?;
            self.lit(b",\"start_time\":")?;
            let start_time = self.u64()?;
            self.lit(b",\"exe\":")?;
            let exe = PathBuf::from(self.str()?);
            let pidfs_ino = if self.peek_lit(b",\"pidfs_ino\":") {
                Some(self.u64()?)
            } else {
                None
            };
            self.lit(b"}")?;
            Some(Identity {
                pid,
                start_time,
                exe,
                pidfs_ino,
            })
        }

        /// The optional `,"root_id":"…"` of both records: `None` when it is malformed.
        fn root_id(&mut self) -> Option<Option<Token>> {
            if self.peek_lit(b",\"root_id\":") {
                self.token().map(Some)
            } else {
                Some(None)
            }
        }

        fn end(&self) -> Option<()> {
            (self.i == self.b.len()).then_some(())
        }
    }

    /// An owner record in the compact form, or `None` (then serde_json decides).
    pub(super) fn owner(b: &[u8]) -> Option<OwnerRecord> {
        let mut c = Cur { b, i: 0 };
        c.lit(b"{\"version\":")?;
        let version = c.u32()?;
        c.lit(b",\"token\":")?;
        let token = c.token()?;
        c.lit(b",\"epoch\":")?;
        let epoch = c.u64()?;
        c.lit(b",\"acquired_at\":")?;
        let acquired_at = c.u64()?;
        c.lit(b",\"phase\":")?;
        let phase = c.phase()?;
        c.lit(b",\"identity\":")?;
        let identity = c.identity()?;
        let root_id = c.root_id()?;
        let containment = if c.peek_lit(b",\"containment\":{\"mechanism\":") {
            let m = match c.str()? {
                "lock-fd" => Containment::LockFd,
                "cgroup" => {
                    c.lit(b",\"path\":")?;
                    let path = PathBuf::from(c.str()?);
                    c.lit(b",\"id\":")?;
                    let id = c.u64()?;
                    Containment::Cgroup(CgroupRecord { path, id })
                }
                _ => return None,
            };
            c.lit(b"}")?;
            Some(m)
        } else {
            None
        };
        c.lit(b"}")?;
        c.end()?;
        Some(OwnerRecord {
            version,
            token,
            epoch,
            acquired_at,
            phase,
            identity,
            root_id,
            containment,
        })
    }

    /// A registry entry in the compact form, or `None` (then serde_json decides).
    pub(super) fn registry(b: &[u8]) -> Option<RegistryRecord> {
        let mut c = Cur { b, i: 0 };
        c.lit(b"{\"version\":")?;
        let version = c.u32()?;
        c.lit(b",\"epoch\":")?;
        let epoch = c.u64()?;
        c.lit(b",\"token\":")?;
        let token = c.token()?;
        c.lit(b",\"name\":")?;
        let name = c.str()?.to_owned();
        c.lit(b",\"identity\":")?;
        let identity = c.identity()?;
        c.lit(b",\"since\":")?;
        let since = c.u64()?;
        let root_id = c.root_id()?;
        c.lit(b"}")?;
        c.end()?;
        Some(RegistryRecord {
            version,
            epoch,
            token,
            name,
            identity,
            since,
            root_id,
        })
    }

    /// Appends a string JSON writes without escapes; `false` for one it would escape.
    fn str(out: &mut Vec<u8>, s: &str) -> bool {
        if s.bytes().any(|c| c == b'"' || c == b'\\' || c < 0x20) {
            return false;
        }
        out.push(b'"');
        out.extend_from_slice(s.as_bytes());
        out.push(b'"');
        true
    }

    fn num(out: &mut Vec<u8>, v: u64) {
        let mut buf = [0u8; 20];
        let mut i = buf.len();
        let mut v = v;
        loop {
            i -= 1;
            buf[i] = b'0' + (v % 10) as u8;
            v /= 10;
            if v == 0 {
                break;
            }
        }
        out.extend_from_slice(&buf[i..]);
    }

    fn token(out: &mut Vec<u8>, t: &Token) {
        const DIGITS: &[u8; 16] = b"0123456789abcdef";
        out.push(b'"');
        for b in t.0 {
            out.push(DIGITS[usize::from(b >> 4)]);
            out.push(DIGITS[usize::from(b & 0xf)]);
        }
        out.push(b'"');
    }

    fn path(out: &mut Vec<u8>, p: &std::path::Path) -> bool {
        p.to_str().is_some_and(|s| str(out, s))
    }

    fn root_id(out: &mut Vec<u8>, t: Option<&Token>) {
        if let Some(t) = t {
            out.extend_from_slice(b",\"root_id\":");
            token(out, t);
        }
    }

    /// Runs `write`, and takes back what it appended if it declines (returns `false`).
    fn whole(out: &mut Vec<u8>, write: impl FnOnce(&mut Vec<u8>) -> bool) -> bool {
        let start = out.len();
        let ok = write(out);
        if !ok {
            out.truncate(start);
        }
        ok
    }

    fn identity(out: &mut Vec<u8>, id: &Identity) -> bool {
        out.extend_from_slice(b"{\"pid\":");
        num(out, u64::from(id.pid));
        out.extend_from_slice(b",\"start_time\":");
        num(out, id.start_time);
        out.extend_from_slice(b",\"exe\":");
        if !path(out, &id.exe) {
            return false;
        }
        if let Some(ino) = id.pidfs_ino {
            out.extend_from_slice(b",\"pidfs_ino\":");
            num(out, ino);
        }
        out.push(b'}');
        true
    }

    /// Appends `r` as serde_json writes it; `false` (and `out` as it was) if it declines.
    pub(super) fn write_owner(out: &mut Vec<u8>, r: &OwnerRecord) -> bool {
        whole(out, |out| {
            out.extend_from_slice(b"{\"version\":");
            num(out, u64::from(r.version));
            out.extend_from_slice(b",\"token\":");
            token(out, &r.token);
            out.extend_from_slice(b",\"epoch\":");
            num(out, r.epoch);
            out.extend_from_slice(b",\"acquired_at\":");
            num(out, r.acquired_at);
            out.extend_from_slice(b",\"phase\":");
            if !str(out, r.phase.name()) {
                return false;
            }
            out.extend_from_slice(b",\"identity\":");
            if !identity(out, &r.identity) {
                return false;
            }
            root_id(out, r.root_id.as_ref());
            match &r.containment {
                None => {}
                Some(Containment::LockFd) => {
                    out.extend_from_slice(b",\"containment\":{\"mechanism\":\"lock-fd\"}");
                }
                Some(Containment::Cgroup(c)) => {
                    out.extend_from_slice(b",\"containment\":{\"mechanism\":\"cgroup\",\"path\":");
                    if !path(out, &c.path) {
                        return false;
                    }
                    out.extend_from_slice(b",\"id\":");
                    num(out, c.id);
                    out.push(b'}');
                }
            }
            out.push(b'}');
            true
        })
    }

    /// Appends `r` as serde_json writes it; `false` (and `out` as it was) if it declines.
    pub(super) fn write_registry(out: &mut Vec<u8>, r: &RegistryRecord) -> bool {
        whole(out, |out| {
            out.extend_from_slice(b"{\"version\":");
            num(out, u64::from(r.version));
            out.extend_from_slice(b",\"epoch\":");
            num(out, r.epoch);
            out.extend_from_slice(b",\"token\":");
            token(out, &r.token);
            out.extend_from_slice(b",\"name\":");
            if !str(out, &r.name) {
                return false;
            }
            out.extend_from_slice(b",\"identity\":");
            if !identity(out, &r.identity) {
                return false;
            }
            out.extend_from_slice(b",\"since\":");
            num(out, r.since);
            root_id(out, r.root_id.as_ref());
            out.push(b'}');
            true
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_round_trips() {
        let t = Token([0xab; 16]);
        assert_eq!(t.to_string(), "ab".repeat(16));
        assert_eq!(Token::parse(&t.to_string()), Some(t));
        assert_eq!(Token::parse("AB"), None);
        assert_eq!(Token::parse(&"AB".repeat(16)), None);
        let json = serde_json::to_string(&t).unwrap();
        assert_eq!(serde_json::from_str::<Token>(&json).unwrap(), t);
        assert!(serde_json::from_str::<Token>("\"xyz\"").is_err());
    }

    #[test]
    fn formats_times() {
        assert_eq!(format_unix_ms(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(format_unix_ms(951_782_400_123), "2000-02-29T00:00:00.123Z");
        assert_eq!(
            format_unix_ms(1_714_564_800_000),
            "2024-05-01T12:00:00.000Z"
        );
    }

    fn sample_owner() -> OwnerRecord {
        OwnerRecord {
            version: RECORD_VERSION,
            token: Token([1; 16]),
            epoch: 3,
            acquired_at: 5,
            phase: PhaseKind::Ready,
            identity: Identity {
                pid: 7,
                start_time: 8,
                exe: PathBuf::from("/bin/x"),
                pidfs_ino: None,
            },
            root_id: Some(Token([2; 16])),
            containment: None,
        }
    }

    /// Issue 11: the owner record's slot round-trips, fills one page, and a slot torn anywhere
    /// (garbage, or zeros) holds no record; the older whole-JSON format is still read, and a
    /// damaged one is an error.
    #[test]
    fn owner_slot_round_trips_and_torn_slots_hold_nothing() {
        let rec = sample_owner();
        let slot = owner_slot(&rec).unwrap();
        assert_eq!(slot.len(), OWNER_SLOT);
        assert_eq!(decode_owner(&slot), Ok(Some(rec.clone())));
        for at in [0, 5, 12, OWNER_HEADER + 3, OWNER_HEADER + 40] {
            let mut torn = slot.clone();
            torn[at] ^= 0xff;
            assert_eq!(decode_owner(&torn), Ok(None), "byte {at} flipped");
            assert!(!owner_is_whole(&torn));
        }
        let mut cut = slot.clone();
        cut[OWNER_HEADER + 10..].fill(0);
        assert_eq!(decode_owner(&cut), Ok(None));
        assert_eq!(decode_owner(&[0u8; OWNER_SLOT]), Ok(None));
        assert_eq!(decode_owner(b""), Ok(None));
        assert_eq!(decode_owner(&vec![0xff; OWNER_SLOT]), Ok(None));
        let legacy = serde_json::to_vec_pretty(&rec).unwrap();
        assert_eq!(decode_owner(&legacy), Ok(Some(rec.clone())));
        assert!(decode_owner(b"{not-json").is_err());
        let mut big = rec;
        big.identity.exe = PathBuf::from("/x".repeat(OWNER_SLOT));
        assert_eq!(owner_slot(&big), None);
    }

    /// Issue 11: a registry entry's slot round-trips; a vacant slot, zeros, an empty file and a
    /// slot torn anywhere hold no entry; an owner slot is not a registry slot (their checksums
    /// differ); a whole JSON record (an entry too large for a slot) is read, a damaged one is
    /// an error; a vacant slot written over the start of a whole record ends it.
    #[test]
    fn registry_slot_round_trips_and_vacant_or_torn_slots_hold_nothing() {
        let rec = RegistryRecord {
            version: RECORD_VERSION,
            epoch: 3,
            token: Token([1; 16]),
            name: "child".to_owned(),
            identity: sample_owner().identity,
            since: 9,
            root_id: Some(Token([2; 16])),
        };
        let slot = registry_slot(Some(&rec)).unwrap();
        assert_eq!(slot.len(), OWNER_SLOT);
        assert_eq!(decode_registry_slot(&slot), Ok(Some(rec.clone())));
        assert!(registry_slot_is_whole(&slot));
        let vacant = registry_slot(None).unwrap();
        assert_eq!(decode_registry_slot(&vacant), Ok(None));
        assert!(registry_slot_is_whole(&vacant));
        for at in [0, 5, 12, OWNER_HEADER + 3, OWNER_HEADER + 40] {
            let mut torn = slot.clone();
            torn[at] ^= 0xff;
            assert_eq!(decode_registry_slot(&torn), Ok(None), "byte {at} flipped");
            assert!(!registry_slot_is_whole(&torn));
        }
        assert_eq!(decode_registry_slot(&[0u8; OWNER_SLOT]), Ok(None));
        assert_eq!(decode_registry_slot(b""), Ok(None));
        let owner = owner_slot(&sample_owner()).unwrap();
        assert_eq!(decode_registry_slot(&owner), Ok(None));
        let mut whole = serde_json::to_vec_pretty(&rec).unwrap();
        assert_eq!(decode_registry_slot(&whole), Ok(Some(rec.clone())));
        assert!(decode_registry_slot(b"{not-json").is_err());
        whole.resize(2 * OWNER_SLOT, b' ');
        whole[..OWNER_SLOT].copy_from_slice(&vacant);
        assert_eq!(decode_registry_slot(&whole), Ok(None));
        let mut big = rec;
        big.identity.exe = PathBuf::from("/x".repeat(OWNER_SLOT));
        assert_eq!(registry_slot(Some(&big)), None);
        assert_eq!(instance_entry("child"), "child.slot");
        assert!(is_registry_slot(OWNER_ENTRY) && !is_registry_slot("5-child.json"));
        assert_eq!(registry_entry_epoch(OWNER_ENTRY), None);
    }

    #[test]
    fn owner_record_phase_is_lowercase() {
        let rec = OwnerRecord {
            phase: PhaseKind::Recovering,
            ..sample_owner()
        };
        let json = serde_json::to_string(&rec).unwrap();
        assert!(json.contains("\"phase\":\"recovering\""), "{json}");
        assert_eq!(serde_json::from_str::<OwnerRecord>(&json).unwrap(), rec);
    }

    mod compact_form {
        use super::super::*;
        use proptest::prelude::*;

        fn text() -> impl Strategy<Value = String> {
            // Mostly plain paths; sometimes what JSON escapes, non-ASCII, or nothing.
            prop_oneof![
                4 => "/[a-z0-9/._-]{0,20}",
                1 => "[\"\\\\\n\t\u{1}é/a]{0,6}",
                1 => Just(String::new()),
            ]
        }

        fn identity() -> impl Strategy<Value = Identity> {
            (any::<u32>(), any::<u64>(), text(), any::<Option<u64>>()).prop_map(
                |(pid, start_time, exe, pidfs_ino)| Identity {
                    pid,
                    start_time,
                    exe: PathBuf::from(exe),
                    pidfs_ino,
                },
            )
        }

        fn token() -> impl Strategy<Value = Token> {
            any::<[u8; 16]>().prop_map(Token)
        }

        fn owner() -> impl Strategy<Value = OwnerRecord> {
            let containment = prop_oneof![
                Just(None),
                Just(Some(Containment::LockFd)),
                (text(), any::<u64>()).prop_map(|(p, id)| Some(Containment::Cgroup(
                    CgroupRecord {
                        path: PathBuf::from(p),
                        id
                    }
                ))),
            ];
            (
                prop_oneof![Just(RECORD_VERSION), any::<u32>()],
                token(),
                any::<u64>(),
                any::<u64>(),
                prop::sample::select(PhaseKind::ALL.to_vec()),
                identity(),
                proptest::option::of(token()),
                containment,
            )
                .prop_map(
                    |(
                        version,
                        token,
                        epoch,
                        acquired_at,
                        phase,
                        identity,
                        root_id,
                        containment,
                    )| {
                        OwnerRecord {
                            version,
                            token,
                            epoch,
                            acquired_at,
                            phase,
                            identity,
                            root_id,
                            containment,
                        }
                    },
                )
        }

        fn registry() -> impl Strategy<Value = RegistryRecord> {
            (
                any::<u32>(),
                any::<u64>(),
                token(),
                text(),
                identity(),
                any::<u64>(),
                proptest::option::of(token()),
            )
                .prop_map(|(version, epoch, token, name, identity, since, root_id)| {
                    RegistryRecord {
                        version,
                        epoch,
                        token,
                        name,
                        identity,
                        since,
                        root_id,
                    }
                })
        }

        fn plain(s: &str) -> bool {
            !s.bytes().any(|c| c == b'"' || c == b'\\' || c < 0x20)
        }

        /// An edit of serialised bytes: a byte replaced, inserted or removed.
        fn edit(bytes: &[u8], at: usize, what: u8, byte: u8) -> Vec<u8> {
            let mut b = bytes.to_vec();
            let at = at % (b.len() + 1);
            match what % 3 {
                0 if at < b.len() => b[at] = byte,
                1 => b.insert(at, byte),
                _ if at < b.len() => {
                    b.remove(at);
                }
                _ => b.push(byte),
            }
            b
        }

        /// The serde_json reading of an owner record, as `parse_owner` was before the compact
        /// reader: the same record or the same message for every input.
        fn by_serde(b: &[u8]) -> Result<OwnerRecord, String> {
            let r: OwnerRecord = parse(b)?;
            versioned(r.version)?;
            Ok(r)
        }

        /// Every insertion of a few telling snippets at every place of an owner record's
        /// compact bytes (and every byte removed) reads as serde_json reads it: leading zeros,
        /// signs, fractions, exponents, overflow, whitespace, escapes, `null`, duplicates.
        #[test]
        fn edits_anywhere_read_as_serde_json_reads_them() {
            let mut r = super::sample_owner();
            r.identity.pidfs_ino = Some(12);
            r.containment = Some(Containment::Cgroup(CgroupRecord {
                path: PathBuf::from("/sys/fs/cgroup/t"),
                id: 4,
            }));
            let serde = serde_json::to_vec(&r).unwrap();
            let snippets: [&[u8]; 16] = [
                b"0",
                b"00",
                b"-",
                b".0",
                b"e1",
                b" ",
                b"\\",
                b"\\u0041",
                b"null",
                b"9999999999",
                b"99999999999999999999",
                b"A",
                b",\"epoch\":1",
                b"\x01",
                b"\xc3",
                b"}",
            ];
            let mut inputs = vec![serde.clone()];
            for at in 0..=serde.len() {
                for s in snippets {
                    let mut b = serde.clone();
                    b.splice(at..at, s.iter().copied());
                    inputs.push(b);
                }
                if at < serde.len() {
                    let mut b = serde.clone();
                    b.remove(at);
                    inputs.push(b);
                }
            }
            let mut fast = 0;
            for b in &inputs {
                assert_eq!(
                    parse_owner(b),
                    by_serde(b),
                    "{}",
                    String::from_utf8_lossy(b)
                );
                if let Some(x) = compact::owner(b) {
                    assert_eq!(Ok(x), parse::<OwnerRecord>(b));
                    fast += 1;
                }
            }
            // The exact bytes, and the edits that keep them a record in the compact form (a
            // digit inserted into a number, a character into a string).
            assert!(fast > 1, "{fast}");
        }

        proptest! {
            /// The compact writer writes serde_json's bytes (or declines a record with a string
            /// JSON escapes), the compact reader reads them back; and for any edit of those
            /// bytes, reading gives what serde_json gives: the same record or the same error.
            #[test]
            fn owner_records_read_and_write_as_serde_json_does(
                r in owner(),
                at in any::<usize>(),
                what in any::<u8>(),
                byte in prop::sample::select(b"{}[]\",:0123456789-.e \\abcdefnul\x01\xff".to_vec()),
            ) {
                let serde = serde_json::to_vec(&r).unwrap();
                let mut out = b"x".to_vec();
                let plain_strings = r.identity.exe.to_str().is_some_and(plain)
                    && match &r.containment {
                        Some(Containment::Cgroup(c)) => c.path.to_str().is_some_and(plain),
                        _ => true,
                    };
                prop_assert_eq!(compact::write_owner(&mut out, &r), plain_strings);
                if plain_strings {
                    prop_assert_eq!(&out[1..], &serde[..]);
                    prop_assert_eq!(compact::owner(&serde), Some(r.clone()));
                } else {
                    prop_assert_eq!(&out[..], b"x");
                }
                prop_assert_eq!(parse_owner(&serde), by_serde(&serde));
                let edited = edit(&serde, at, what, byte);
                prop_assert_eq!(parse_owner(&edited), by_serde(&edited));
                if let Some(x) = compact::owner(&edited) {
                    prop_assert_eq!(Ok(x), parse::<OwnerRecord>(&edited));
                }
            }

            /// The same for registry entries.
            #[test]
            fn registry_entries_read_and_write_as_serde_json_does(
                r in registry(),
                at in any::<usize>(),
                what in any::<u8>(),
                byte in prop::sample::select(b"{}[]\",:0123456789-.e \\abcdefnul\x01\xff".to_vec()),
            ) {
                let serde = serde_json::to_vec(&r).unwrap();
                let mut out = Vec::new();
                let plain_strings = plain(&r.name) && r.identity.exe.to_str().is_some_and(plain);
                prop_assert_eq!(compact::write_registry(&mut out, &r), plain_strings);
                if plain_strings {
                    prop_assert_eq!(&out, &serde);
                    prop_assert_eq!(compact::registry(&serde), Some(r.clone()));
                } else {
                    prop_assert!(out.is_empty());
                }
                let edited = edit(&serde, at, what, byte);
                if let Some(x) = compact::registry(&edited) {
                    prop_assert_eq!(Ok(x), parse::<RegistryRecord>(&edited));
                }
                let slot = registry_slot(Some(&r)).unwrap();
                prop_assert_eq!(decode_registry_slot(&slot), Ok(Some(r)));
            }
        }
    }
}

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
        let s = String::deserialize(d)?;
        Token::parse(&s)
            .ok_or_else(|| serde::de::Error::custom("token must be 32 lowercase hex digits"))
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
    let r: OwnerRecord = parse(bytes)?;
    versioned(r.version)?;
    Ok(r)
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

    #[test]
    fn owner_record_phase_is_lowercase() {
        let rec = OwnerRecord {
            version: RECORD_VERSION,
            token: Token([1; 16]),
            epoch: 3,
            acquired_at: 5,
            phase: PhaseKind::Recovering,
            identity: Identity {
                pid: 7,
                start_time: 8,
                exe: PathBuf::from("/bin/x"),
                pidfs_ino: None,
            },
            root_id: Some(Token([2; 16])),
            containment: None,
        };
        let json = serde_json::to_string(&rec).unwrap();
        assert!(json.contains("\"phase\":\"recovering\""), "{json}");
        assert_eq!(serde_json::from_str::<OwnerRecord>(&json).unwrap(), rec);
    }
}

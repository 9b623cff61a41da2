//! The epoch file `.tenure/epoch`: a strictly increasing u64 (issue 11, spec/lifecycle.md "The
//! epoch rule").
//!
//! The epoch fences stale owners (card H5): every acquisition bumps it under the lock before
//! `acquire` returns, and checkpoint publication refuses to proceed when the persisted epoch is
//! newer than the publisher's. A missing file means epoch 0 (no owner ever acquired).
//!
//! ## Durable in batches (the current format)
//! An epoch must never be handed out twice, even across a power loss, once a child could have
//! seen it. Syncing every epoch costs an `fdatasync` per acquisition; instead the file makes a
//! *high-water mark* durable for a batch of epochs, and the epochs inside the batch are written
//! in place without a sync:
//!
//! - two **reservation** slots (offsets 0 and [`SLOT_STRIDE`]) hold the durable high-water
//!   mark `high`: every epoch ever handed out is at most the highest valid reservation. A new
//!   reservation is written in place into the slot that does not hold the confirmed one and
//!   `fdatasync`ed before any epoch of its batch is handed out (two slots, so a torn write
//!   never takes the last durable one: LMDB's two meta pages);
//! - one **scratch** slot (offset 2 × [`SLOT_STRIDE`]) holds the current epoch, the
//!   reservation it was handed out under and the [`Session`] that wrote it (the boot id and
//!   the mount of the filesystem). It is written in place at every acquisition and never
//!   synced, and only ever after the reservation it names is durable.
//!
//! A process crash keeps the page cache, so within one session (same boot, same mount) the
//! scratch slot is exact: the next epoch is the scratch epoch plus one, without a sync, while
//! it stays within the confirmed reservation. A power loss (or a kernel crash) ends the boot;
//! a scratch slot of another session is not trusted, and the next epoch is one above the
//! highest reservation — above every epoch handed out before the power loss, whatever the
//! power loss did to the unsynced writes. That acquisition syncs the file as it found it (an
//! acquisition of this session that crashed may have left a reservation unsynced) before it
//! writes a reservation of its own. So a run costs no sync at all, except the first of a boot
//! and one in every [`batch`](super::plan::AcquireInput::epoch_batch) acquisitions.
//!
//! A slot is [`SLOT_LEN`] bytes: epoch, high (u64, little endian), the session's boot id (16
//! bytes) and mount id (u64), and the first 8 bytes of `sha256("tenure epoch slot v2\n" ‖ the
//! 40 bytes before)`. A slot whose checksum does not match is invalid (torn, never written, or
//! damaged). The slots are a page apart, so a torn write of one never touches another.
//!
//! ## Older formats, read and replaced once
//! A file that does not exist yet, one of the two-slot format of the first issue 11 tenure
//! ([`Stored::Slots`]: [`V1_FILE_LEN`] bytes, two slots of an epoch and its checksum), or one
//! of a tenure before issue 11 (one decimal number and a newline, [`Stored::Legacy`]) is
//! replaced whole once — temp file, fdatasync, rename, sync of the control folder — by a file
//! in the current format. Older tenure reads the current format as corrupt (and says so,
//! naming the file).
//!
//! Anything else — another length, no valid slot, a legacy file that does not parse — is
//! refused as corrupt, never rewritten.

use std::path::PathBuf;

use crate::privfs::{Dir, FsError};

/// The name of the epoch file inside the control folder.
pub const EPOCH_FILE: &str = "epoch";

/// The bytes of one slot of the two-slot format ([`Stored::Slots`]): the epoch and its
/// checksum.
pub const V1_SLOT_LEN: usize = 16;

/// The offset of one slot from the next: one page apart.
pub const SLOT_STRIDE: u64 = 4096;

/// The length of an epoch file in the two-slot format ([`Stored::Slots`]).
pub const V1_FILE_LEN: u64 = SLOT_STRIDE + V1_SLOT_LEN as u64;

/// The bytes of one slot of the current format: epoch, high, boot id, mount id, checksum.
pub const SLOT_LEN: usize = 48;

/// The length of an epoch file in the current format (two reservations and the scratch slot).
pub const FILE_LEN: u64 = 2 * SLOT_STRIDE + SLOT_LEN as u64;

/// The largest epoch file accepted.
pub const MAX_LEN: u64 = FILE_LEN;

/// The offset of the scratch slot.
pub const SCRATCH_OFFSET: u64 = 2 * SLOT_STRIDE;

/// How many epochs one reservation covers in the runtime (the plans take the batch as an input
/// so that the models can use a small one).
pub const BATCH: u64 = 1024;

/// What the checksum of a slot of the two-slot format covers besides the epoch.
const SLOT_DOMAIN: &[u8] = b"tenure epoch slot\n";

/// What the checksum of a slot of the current format covers besides its 40 bytes.
const SLOT_DOMAIN_V2: &[u8] = b"tenure epoch slot v2\n";

/// What tells a page cache that survived apart from one a power loss took: the boot (a power
/// loss or a kernel crash ends it) and the mount of the state dir's filesystem (a filesystem
/// that went away and came back may have lost its unsynced writes without a reboot).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Session {
    /// `/proc/sys/kernel/random/boot_id`, as 16 bytes.
    pub boot: [u8; 16],
    /// The mount id of the state dir's filesystem (`statx`; the unique one where the kernel
    /// has it).
    pub mount: u64,
}

/// One slot of the current format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Slot {
    /// The epoch (the current one in the scratch slot; the first of the batch in a
    /// reservation).
    pub epoch: u64,
    /// The high-water mark: the last epoch of the reservation.
    pub high: u64,
    /// The session that wrote the slot.
    pub session: Session,
}

/// The slots of a file in the current format (`None`: invalid).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Batched {
    /// The two reservation slots.
    pub reserved: [Option<Slot>; 2],
    /// The scratch slot.
    pub scratch: Option<Slot>,
}

/// Errors of reading or writing the epoch file.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum EpochError {
    /// The file exists but holds neither a valid slot nor `<decimal u64>\n`.
    #[error(
        "{path} is corrupt ({reason}); it must hold a valid epoch slot (or, from an older tenure, one decimal number and a newline): restore it from a backup, or move it aside (`mv {path} {path}.corrupt`): the next owner then takes an epoch above every epoch the dir records"
    )]
    Corrupt {
        /// The epoch file.
        path: PathBuf,
        /// Why it could not be parsed.
        reason: &'static str,
    },
    /// The epoch cannot grow any more.
    #[error("{path} holds the largest possible epoch; this state dir cannot be acquired again")]
    Exhausted {
        /// The epoch file.
        path: PathBuf,
    },
    /// The file could not be read or written.
    #[error(transparent)]
    Fs(#[from] FsError),
}

/// What an epoch file holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Stored {
    /// The format of a tenure before issue 11 (`<decimal>\n`), replaced whole on the next
    /// acquisition.
    Legacy(u64),
    /// The two-slot format of the first issue 11 tenure: the highest valid slot's epoch, and
    /// which slot holds it. Replaced whole on the next acquisition.
    Slots {
        /// The epoch.
        epoch: u64,
        /// The slot (0 or 1) that holds it.
        newest: usize,
    },
    /// The current format: reservations and the scratch slot (see the module docs).
    Batched(Batched),
}

impl Stored {
    /// The epoch the file holds: the scratch slot's, or (where a power loss tore it) the
    /// highest reservation's first epoch.
    pub fn epoch(self) -> u64 {
        match self {
            Stored::Legacy(e) | Stored::Slots { epoch: e, .. } => e,
            Stored::Batched(b) => match b.scratch {
                Some(s) => s.epoch,
                None => b
                    .reserved
                    .iter()
                    .flatten()
                    .map(|r| r.epoch)
                    .max()
                    .unwrap_or(0),
            },
        }
    }

    /// What an acquisition of `session` builds on: the epoch the next one must be above, and
    /// the confirmed reservation's high-water mark, under which it may hand out epochs
    /// without a sync. Only a scratch slot written in this session is trusted (the page cache
    /// that holds it survived); otherwise the base is the highest reservation, above every
    /// epoch ever handed out (module docs).
    pub fn base(self, session: Session) -> (u64, Option<u64>) {
        match self {
            Stored::Legacy(e) | Stored::Slots { epoch: e, .. } => (e, None),
            Stored::Batched(b) => match b.confirmed(session) {
                Some(s) => (s.epoch, Some(s.high)),
                None => {
                    let top = b
                        .reserved
                        .iter()
                        .chain(std::iter::once(&b.scratch))
                        .flatten()
                        .map(|r| r.high.max(r.epoch))
                        .max()
                        .unwrap_or(0);
                    (top, None)
                }
            },
        }
    }
}

impl Batched {
    /// The scratch slot, when this session wrote it and the reservation it names is there.
    pub fn confirmed(&self, session: Session) -> Option<Slot> {
        let s = self.scratch?;
        // The mutant `lease-epoch-session-unchecked` trusts a scratch slot of another boot:
        // after a power loss it may name an epoch older than one already handed out.
        let same = s.session == session || crate::mutant::on("lease-epoch-session-unchecked");
        (same && self.reserved.iter().flatten().any(|r| r.high == s.high)).then_some(s)
    }
}

/// The session of an acquisition on `dir`: this boot's id (read once per process) and the
/// mount id of the dir's filesystem. Where the boot id cannot be read, a random one for this
/// process stands in: no other process then trusts this one's scratch slot, so every
/// acquisition makes its epoch durable itself (slower, never unsafe).
pub fn session(dir: &crate::privfs::StateDir) -> Session {
    static BOOT: std::sync::OnceLock<[u8; 16]> = std::sync::OnceLock::new();
    let boot = *BOOT.get_or_init(|| {
        read_boot_id().unwrap_or_else(|| {
            log::warn!(
                "cannot read /proc/sys/kernel/random/boot_id; every acquisition syncs its epoch"
            );
            let mut b = [0u8; 16];
            let _ = crate::privfs::random_bytes(&mut b);
            b
        })
    });
    Session {
        boot,
        mount: mount_id(dir.root()).unwrap_or(0),
    }
}

/// `/proc/sys/kernel/random/boot_id` (a UUID in hex with dashes) as 16 bytes.
fn read_boot_id() -> Option<[u8; 16]> {
    let text = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").ok()?;
    let hex: Vec<u8> = text.trim().bytes().filter(|b| *b != b'-').collect();
    if hex.len() != 32 {
        return None;
    }
    let mut out = [0u8; 16];
    for (i, pair) in hex.chunks(2).enumerate() {
        let s = std::str::from_utf8(pair).ok()?;
        out[i] = u8::from_str_radix(s, 16).ok()?;
    }
    Some(out)
}

/// The mount id of the filesystem `dir` is on: the unique one (`STATX_MNT_ID_UNIQUE`, never
/// reused within a boot) where the kernel has it, else the reusable one.
fn mount_id(dir: &Dir) -> Option<u64> {
    use rustix::fs::{AtFlags, StatxFlags};
    // STATX_MNT_ID_UNIQUE (Linux 6.8); rustix 1.1 has no name for it yet.
    const MNT_ID_UNIQUE: u32 = 0x4000;
    let mask = StatxFlags::from_bits_retain(MNT_ID_UNIQUE) | StatxFlags::MNT_ID;
    let st = rustix::fs::statx(dir, "", AtFlags::EMPTY_PATH, mask).ok()?;
    let got = st.stx_mask;
    if got & (MNT_ID_UNIQUE | StatxFlags::MNT_ID.bits()) == 0 {
        return None;
    }
    // The top bit tells the unique id apart from a reused one of an older kernel.
    let unique = u64::from(got & MNT_ID_UNIQUE != 0) << 63;
    Some(st.stx_mnt_id | unique)
}

/// How an acquisition writes its epoch ([`plan_write`]).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum EpochWrite {
    /// Within the confirmed reservation: the scratch slot in place, no sync.
    Scratch(Slot),
    /// A new reservation in place into `slot` (the one not holding the confirmed
    /// reservation), fdatasynced, then the scratch slot.
    Reserve {
        /// The reservation slot written (0 or 1).
        slot: usize,
        /// The reservation.
        reservation: Slot,
    },
    /// No confirmed reservation (another session wrote the file, a power loss tore the
    /// scratch slot, an older format, no file): a whole new file with the reservation in slot
    /// 0 and no valid scratch slot, through a temp file, fdatasync, rename and a sync of the
    /// control folder; then the scratch slot in place.
    Whole {
        /// The reservation.
        reservation: Slot,
    },
}

impl EpochWrite {
    /// The scratch slot this write ends with (the epoch handed out).
    pub fn scratch(&self) -> Slot {
        match self {
            EpochWrite::Scratch(s) => *s,
            EpochWrite::Reserve { reservation, .. } | EpochWrite::Whole { reservation } => {
                *reservation
            }
        }
    }
}

/// The write that hands out `next` (from [`Stored::base`] and the epoch rule) in `session`,
/// with reservations of `batch` epochs (at least 1).
pub fn plan_write(stored: Option<Stored>, session: Session, next: u64, batch: u64) -> EpochWrite {
    let reservation = Slot {
        epoch: next,
        high: next.saturating_add(batch.max(1) - 1),
        session,
    };
    let Some(Stored::Batched(b)) = stored else {
        return EpochWrite::Whole { reservation };
    };
    let Some(confirmed) = b.confirmed(session) else {
        return EpochWrite::Whole { reservation };
    };
    if next <= confirmed.high {
        return EpochWrite::Scratch(Slot {
            epoch: next,
            high: confirmed.high,
            session,
        });
    }
    let holds = b.reserved[0].is_some_and(|r| r.high == confirmed.high);
    let slot = if holds { 1 } else { 0 };
    EpochWrite::Reserve { slot, reservation }
}

fn checksum_v1(epoch: u64) -> [u8; 8] {
    super::record::slot_checksum(SLOT_DOMAIN, &epoch.to_le_bytes())
}

fn checksum_v2(body: &[u8]) -> [u8; 8] {
    super::record::slot_checksum(SLOT_DOMAIN_V2, body)
}

/// The bytes of a slot of the two-slot format holding `epoch` (tests of the upgrade).
pub fn v1_slot(epoch: u64) -> [u8; V1_SLOT_LEN] {
    let mut out = [0u8; V1_SLOT_LEN];
    out[..8].copy_from_slice(&epoch.to_le_bytes());
    out[8..].copy_from_slice(&checksum_v1(epoch));
    out
}

/// The bytes of a slot of the current format.
pub fn slot(s: &Slot) -> [u8; SLOT_LEN] {
    let mut out = [0u8; SLOT_LEN];
    out[..8].copy_from_slice(&s.epoch.to_le_bytes());
    out[8..16].copy_from_slice(&s.high.to_le_bytes());
    out[16..32].copy_from_slice(&s.session.boot);
    out[32..40].copy_from_slice(&s.session.mount.to_le_bytes());
    let sum = checksum_v2(&out[..40]);
    out[40..].copy_from_slice(&sum);
    out
}

/// The offset of slot `i` in the file: 0 and 1 are the reservations, 2 the scratch slot.
pub const fn slot_offset(i: usize) -> u64 {
    i as u64 * SLOT_STRIDE
}

fn u64_at(bytes: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_le_bytes(bytes.get(at..at + 8)?.try_into().ok()?))
}

/// The epoch a slot of the two-slot format holds, if its checksum matches.
pub fn v1_slot_value(bytes: &[u8]) -> Option<u64> {
    let value = u64_at(bytes, 0)?;
    if crate::mutant::on("lease-epoch-slot-unchecked") {
        return Some(value);
    }
    (bytes.get(8..V1_SLOT_LEN)? == checksum_v1(value)).then_some(value)
}

/// A slot of the current format, if its checksum matches.
pub fn slot_value(bytes: &[u8]) -> Option<Slot> {
    let body = bytes.get(..40)?;
    let s = Slot {
        epoch: u64_at(bytes, 0)?,
        high: u64_at(bytes, 8)?,
        session: Session {
            boot: bytes.get(16..32)?.try_into().ok()?,
            mount: u64_at(bytes, 32)?,
        },
    };
    // The mutant `lease-epoch-slot-unchecked` takes a slot at face value: a torn one (garbage)
    // then reads as whatever numbers the garbage spells.
    if crate::mutant::on("lease-epoch-slot-unchecked") {
        return Some(s);
    }
    (bytes.get(40..SLOT_LEN)? == checksum_v2(body)).then_some(s)
}

/// Parses the content of an epoch file (any format).
pub fn decode(bytes: &[u8]) -> Result<Stored, &'static str> {
    if bytes.len() as u64 == FILE_LEN {
        let at = |i: usize| {
            let o = slot_offset(i) as usize;
            slot_value(&bytes[o..o + SLOT_LEN])
        };
        let b = Batched {
            reserved: [at(0), at(1)],
            scratch: at(2),
        };
        if b.reserved.iter().all(Option::is_none) && b.scratch.is_none() {
            return Err("no valid slot: all three are torn or damaged");
        }
        return Ok(Stored::Batched(b));
    }
    if bytes.len() as u64 != V1_FILE_LEN {
        return parse_legacy(bytes).map(Stored::Legacy);
    }
    let at = |i: usize| {
        let o = slot_offset(i) as usize;
        v1_slot_value(&bytes[o..o + V1_SLOT_LEN])
    };
    match (at(0), at(1)) {
        (None, None) => Err("no valid slot: both are torn or damaged"),
        (Some(a), Some(b)) if b > a => Ok(Stored::Slots {
            epoch: b,
            newest: 1,
        }),
        (Some(a), _) => Ok(Stored::Slots {
            epoch: a,
            newest: 0,
        }),
        (None, Some(b)) => Ok(Stored::Slots {
            epoch: b,
            newest: 1,
        }),
    }
}

/// Parses the content of an epoch file (any format) to its epoch.
pub fn parse(bytes: &[u8]) -> Result<u64, &'static str> {
    decode(bytes).map(Stored::epoch)
}

/// Parses the format of a tenure before issue 11: exactly `<decimal u64>\n`.
pub fn parse_legacy(bytes: &[u8]) -> Result<u64, &'static str> {
    let Some(digits) = bytes.strip_suffix(b"\n") else {
        return Err("no trailing newline");
    };
    if digits.is_empty() {
        return Err("no digits");
    }
    if !digits.iter().all(u8::is_ascii_digit) {
        return Err("not a decimal number");
    }
    if digits.len() > 1 && digits[0] == b'0' {
        return Err("leading zero");
    }
    std::str::from_utf8(digits)
        .ok()
        .and_then(|s| s.parse::<u64>().ok())
        .ok_or("out of range")
}

/// Reads the epoch from the control folder; 0 when the file does not exist yet.
pub fn read(control: &Dir) -> Result<u64, EpochError> {
    match control.read_optional(EPOCH_FILE, MAX_LEN) {
        Ok(None) => Ok(0),
        Ok(Some(bytes)) => parse(&bytes).map_err(|reason| EpochError::Corrupt {
            path: control.child_path(EPOCH_FILE),
            reason,
        }),
        Err(FsError::TooLarge { path, .. }) => Err(EpochError::Corrupt {
            path,
            reason: "too large",
        }),
        Err(e) => Err(e.into()),
    }
}

/// Durably replaces the epoch file with one holding `epoch` (temp, write, fsync, rename, dir
/// fsync; crash points `epoch.*`), in the two-slot format an acquisition upgrades: setup and
/// tests. Acquisitions write in place.
pub fn write(control: &Dir, epoch: u64) -> Result<(), EpochError> {
    control.replace_durable(EPOCH_FILE, &encode(epoch, None), "epoch")?;
    Ok(())
}

/// A whole epoch file in the two-slot format: `epoch` in slot 0 and `previous` (if any) in
/// slot 1 (a slot of zeros is invalid).
pub fn encode(epoch: u64, previous: Option<u64>) -> Vec<u8> {
    let mut out = vec![0u8; V1_FILE_LEN as usize];
    out[..V1_SLOT_LEN].copy_from_slice(&v1_slot(epoch));
    if let Some(p) = previous {
        let o = SLOT_STRIDE as usize;
        out[o..o + V1_SLOT_LEN].copy_from_slice(&v1_slot(p));
    }
    out
}

/// A whole epoch file in the current format: the given reservations and scratch slot (a slot
/// of zeros is invalid).
pub fn encode_batched(b: &Batched) -> Vec<u8> {
    let mut out = vec![0u8; FILE_LEN as usize];
    for (i, s) in [b.reserved[0], b.reserved[1], b.scratch].iter().enumerate() {
        if let Some(s) = s {
            let o = slot_offset(i) as usize;
            out[o..o + SLOT_LEN].copy_from_slice(&slot(s));
        }
    }
    out
}

/// The epoch the next acquisition will write: the current one plus one (nothing is written).
pub fn next(control: &Dir) -> Result<u64, EpochError> {
    read(control)?
        .checked_add(1)
        .ok_or_else(|| EpochError::Exhausted {
            path: control.child_path(EPOCH_FILE),
        })
}

/// An epoch the dir recorded outside the epoch file, and where (a manifest, a registry entry,
/// the owner record, a kept output).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Seen {
    /// The epoch.
    pub epoch: u64,
    /// The file or directory that records it.
    pub path: PathBuf,
}

/// The epoch file was behind an epoch recorded elsewhere: it was rewound (restored from an
/// old backup, edited) or lost its last write. The next epoch skips past what was seen.
#[derive(Debug, Clone, PartialEq, Eq, Hash, thiserror::Error)]
#[error(
    "{path} holds epoch {file}, but {} records epoch {}; the next epoch is {next}, above every epoch this dir has recorded",
    .seen.path.display(), .seen.epoch
)]
pub struct Rewound {
    /// The epoch file.
    pub path: PathBuf,
    /// What it held.
    pub file: u64,
    /// The highest epoch recorded elsewhere.
    pub seen: Seen,
    /// The epoch handed out instead.
    pub next: u64,
}

/// The rule that epochs never repeat (card P3, invariant I2), as one pure function so that it
/// can be run by a plan or a model: the next epoch is one above the highest epoch the dir has
/// recorded anywhere — the epoch file and every other record (`highest`). A file behind that
/// record is reported as [`Rewound`], never reused.
pub fn next_after(
    path: &std::path::Path,
    file: u64,
    highest: Option<&Seen>,
) -> Result<(u64, Option<Rewound>), EpochError> {
    let top = highest.map_or(file, |s| s.epoch.max(file));
    let next = top.checked_add(1).ok_or_else(|| EpochError::Exhausted {
        path: path.to_path_buf(),
    })?;
    let rewound = highest.filter(|s| s.epoch > file).map(|s| Rewound {
        path: path.to_path_buf(),
        file,
        seen: s.clone(),
        next,
    });
    Ok((next, rewound))
}

/// Why a request naming an epoch is fenced off (card H5).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Fenced {
    /// A newer ownership exists: the requester is a stale owner.
    Stale,
    /// The dir never granted the requester's epoch.
    Unknown,
}

/// The fence (card H5, invariant I3), as one pure function for every check and for the models:
/// a request naming `mine` may take effect only while the dir's persisted epoch is exactly
/// `mine`. An older persisted epoch was never granted to the requester; a newer one means a
/// later owner exists.
pub fn fence(mine: u64, persisted: u64) -> Result<(), Fenced> {
    // The mutant `fence-off-by-one` lets the owner just before the current one through.
    let stale = if crate::mutant::on("fence-off-by-one") {
        persisted > mine.saturating_add(1)
    } else {
        persisted > mine
    };
    if stale {
        Err(Fenced::Stale)
    } else if persisted < mine {
        Err(Fenced::Unknown)
    } else {
        Ok(())
    }
}

/// Reads the current epoch, writes the next one durably and returns it. Only the lock holder
/// may call this.
pub fn bump(control: &Dir) -> Result<u64, EpochError> {
    let current = read(control)?;
    let next = current
        .checked_add(1)
        .ok_or_else(|| EpochError::Exhausted {
            path: control.child_path(EPOCH_FILE),
        })?;
    write(control, next)?;
    Ok(next)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::privfs::StateDir;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn parse_accepts_only_canonical_decimal() {
        assert_eq!(parse(b"0\n"), Ok(0));
        assert_eq!(parse(b"42\n"), Ok(42));
        assert_eq!(parse(b"18446744073709551615\n"), Ok(u64::MAX));
        for bad in [
            &b"42"[..],
            b"\n",
            b"4 2\n",
            b"-1\n",
            b"042\n",
            b"18446744073709551616\n",
            b"42\n\n",
            b"{not-json\n",
        ] {
            assert!(parse(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn bump_is_durable_and_strictly_increasing() {
        let t = tempfile::tempdir().unwrap();
        let sd = StateDir::open(&t.path().join("s"), true).unwrap();
        let control = sd.root().ensure_dir(".tenure", "t").unwrap();
        assert_eq!(read(&control).unwrap(), 0);
        assert_eq!(bump(&control).unwrap(), 1);
        assert_eq!(bump(&control).unwrap(), 2);
        assert_eq!(read(&control).unwrap(), 2);
        let bytes = std::fs::read(t.path().join("s/.tenure/epoch")).unwrap();
        assert_eq!(bytes.len() as u64, V1_FILE_LEN);
        assert_eq!(
            decode(&bytes),
            Ok(Stored::Slots {
                epoch: 2,
                newest: 0
            })
        );
    }

    /// Issue 11: the highest valid slot wins; a torn or damaged slot (checksum mismatch) is
    /// skipped; no valid slot at all is corrupt; a legacy file reads as before.
    #[test]
    fn slots_decode_to_the_highest_valid_one() {
        let mut f = encode(7, Some(6));
        assert_eq!(
            decode(&f),
            Ok(Stored::Slots {
                epoch: 7,
                newest: 0
            })
        );
        let o = SLOT_STRIDE as usize;
        f[o..o + V1_SLOT_LEN].copy_from_slice(&v1_slot(8));
        assert_eq!(
            decode(&f),
            Ok(Stored::Slots {
                epoch: 8,
                newest: 1
            })
        );
        // Slot 1 torn (as the models' crash filesystem tears it): slot 0 holds.
        f[o..o + V1_SLOT_LEN].fill(0xff);
        assert_eq!(
            decode(&f),
            Ok(Stored::Slots {
                epoch: 7,
                newest: 0
            })
        );
        // One flipped bit in a slot is caught by its checksum.
        let mut g = encode(7, Some(6));
        g[3] ^= 0x10;
        assert_eq!(
            decode(&g),
            Ok(Stored::Slots {
                epoch: 6,
                newest: 1
            })
        );
        f[..V1_SLOT_LEN].fill(0);
        assert!(decode(&f).is_err());
        assert_eq!(decode(b"41\n"), Ok(Stored::Legacy(41)));
        assert!(decode(&f[..100]).is_err());
        assert!(decode(b"").is_err());
    }

    #[test]
    fn h5_corrupt_epoch_refused_and_kept() {
        let t = tempfile::tempdir().unwrap();
        let sd = StateDir::open(&t.path().join("s"), true).unwrap();
        let control = sd.root().ensure_dir(".tenure", "t").unwrap();
        let path = t.path().join("s/.tenure/epoch");
        std::fs::write(&path, b"seven\n").unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        let err = bump(&control).unwrap_err();
        assert!(matches!(err, EpochError::Corrupt { .. }), "{err}");
        assert!(err.to_string().contains("epoch is corrupt"), "{err}");
        assert_eq!(std::fs::read(&path).unwrap(), b"seven\n");
        std::fs::write(&path, [b'1'; 9000]).unwrap();
        assert!(matches!(
            read(&control),
            Err(EpochError::Corrupt {
                reason: "too large",
                ..
            })
        ));
    }

    #[test]
    fn next_is_above_every_recorded_epoch() {
        let p = std::path::Path::new("/s/.tenure/epoch");
        assert_eq!(next_after(p, 4, None).unwrap(), (5, None));
        let seen = Seen {
            epoch: 3,
            path: "/s/m".into(),
        };
        assert_eq!(next_after(p, 4, Some(&seen)).unwrap(), (5, None));
        let seen = Seen {
            epoch: 9,
            path: "/s/m".into(),
        };
        let (next, rewound) = next_after(p, 1, Some(&seen)).unwrap();
        assert_eq!(next, 10);
        let r = rewound.expect("a rewound file is reported");
        assert_eq!((r.file, r.next), (1, 10));
        assert!(
            r.to_string()
                .contains("holds epoch 1, but /s/m records epoch 9"),
            "{r}"
        );
        let top = Seen {
            epoch: u64::MAX,
            path: "/s/m".into(),
        };
        assert!(matches!(
            next_after(p, 1, Some(&top)),
            Err(EpochError::Exhausted { .. })
        ));
    }

    #[test]
    fn exhausted_epoch_refused() {
        let t = tempfile::tempdir().unwrap();
        let sd = StateDir::open(&t.path().join("s"), true).unwrap();
        let control = sd.root().ensure_dir(".tenure", "t").unwrap();
        write(&control, u64::MAX).unwrap();
        assert!(matches!(bump(&control), Err(EpochError::Exhausted { .. })));
        assert_eq!(read(&control).unwrap(), u64::MAX);
    }

    fn session(b: u8) -> Session {
        Session {
            boot: [b; 16],
            mount: 7,
        }
    }

    /// Issue 11: within one session the scratch slot is trusted and epochs inside the
    /// confirmed reservation need no sync; the next reservation goes into the slot that does
    /// not hold the confirmed one; another session (a power loss) builds on the highest
    /// reservation and replaces the file whole.
    #[test]
    fn batched_epochs_are_synced_once_per_reservation() {
        let now = session(1);
        let first = plan_write(None, now, 1, 4);
        let r0 = Slot {
            epoch: 1,
            high: 4,
            session: now,
        };
        assert_eq!(first, EpochWrite::Whole { reservation: r0 });
        // The whole file holds the reservation and no scratch slot; the scratch slot is
        // written once the file is durable.
        let mut b = Batched {
            reserved: [Some(r0), None],
            scratch: None,
        };
        let file = encode_batched(&b);
        assert_eq!(file.len() as u64, FILE_LEN);
        assert_eq!(decode(&file), Ok(Stored::Batched(b)));
        assert_eq!(Stored::Batched(b).base(now), (4, None));
        b.scratch = Some(first.scratch());
        let stored = decode(&encode_batched(&b)).unwrap();
        assert_eq!(stored.epoch(), 1);
        assert_eq!(stored.base(now), (1, Some(4)));
        let second = plan_write(Some(stored), now, 2, 4);
        assert_eq!(
            second,
            EpochWrite::Scratch(Slot {
                epoch: 2,
                high: 4,
                session: now
            })
        );
        b.scratch = Some(Slot {
            epoch: 4,
            high: 4,
            session: now,
        });
        let fifth = plan_write(Some(Stored::Batched(b)), now, 5, 4);
        assert_eq!(
            fifth,
            EpochWrite::Reserve {
                slot: 1,
                reservation: Slot {
                    epoch: 5,
                    high: 8,
                    session: now
                }
            }
        );
        // Another boot: the scratch slot is not trusted; the base is the highest reservation.
        let later = session(2);
        b.reserved[1] = Some(Slot {
            epoch: 5,
            high: 8,
            session: now,
        });
        b.scratch = Some(Slot {
            epoch: 6,
            high: 8,
            session: now,
        });
        assert_eq!(Stored::Batched(b).base(later), (8, None));
        assert!(matches!(
            plan_write(Some(Stored::Batched(b)), later, 9, 4),
            EpochWrite::Whole { .. }
        ));
        // A scratch slot naming a reservation that is not there is not trusted either.
        b.reserved[1] = None;
        assert_eq!(Stored::Batched(b).base(now), (8, None));
    }

    /// A reservation of one epoch (a cluster lease's, whose epoch is the cluster's revision):
    /// after another boot the base is that epoch, not a batch above it, so the cluster's next
    /// revision is still above what the dir records.
    #[test]
    fn a_reservation_of_one_epoch_ends_at_it() {
        let now = session(1);
        let EpochWrite::Whole { reservation } = plan_write(None, now, 40, 1) else {
            panic!("a new file is written whole")
        };
        assert_eq!((reservation.epoch, reservation.high), (40, 40));
        let b = Batched {
            reserved: [Some(reservation), None],
            scratch: Some(reservation),
        };
        assert_eq!(Stored::Batched(b).base(session(2)), (40, None));
        assert!(matches!(
            plan_write(Some(Stored::Batched(b)), now, 41, 1),
            EpochWrite::Reserve { slot: 1, .. }
        ));
    }

    /// A torn slot of the current format is caught by its checksum; no valid slot at all is
    /// corrupt.
    #[test]
    fn batched_slots_are_checked() {
        let s = Slot {
            epoch: 3,
            high: 9,
            session: session(5),
        };
        let mut f = encode_batched(&Batched {
            reserved: [Some(s), None],
            scratch: Some(s),
        });
        let o = slot_offset(2) as usize;
        f[o + 3] ^= 0x01;
        assert_eq!(
            decode(&f),
            Ok(Stored::Batched(Batched {
                reserved: [Some(s), None],
                scratch: None
            }))
        );
        f[..SLOT_LEN].fill(0xff);
        assert!(decode(&f).is_err());
    }
}

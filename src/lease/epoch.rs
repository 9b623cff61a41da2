//! The epoch file `.tenure/epoch`: a strictly increasing u64, kept in two checksummed slots
//! written alternately in place (issue 11, spec/lifecycle.md "The epoch rule").
//!
//! The epoch fences stale owners (card H5): every acquisition bumps it under the lock, durably,
//! before `acquire` returns, and checkpoint publication refuses to proceed when the persisted
//! epoch is newer than the publisher's. A missing file means epoch 0 (no owner ever acquired).
//!
//! ## Format
//! The file is [`FILE_LEN`] bytes: slot 0 at offset 0 and slot 1 at offset [`SLOT_STRIDE`]
//! (4096, so that the two slots never share a page or a sector: a torn write of one can never
//! touch the other). A slot is [`SLOT_LEN`] bytes: the epoch (u64, little endian) and the first
//! 8 bytes of `sha256("tenure epoch slot\n" ‖ epoch)`. A slot whose checksum does not match is
//! invalid (torn, never written, or damaged); the file's epoch is the highest valid slot's.
//!
//! ## Writing: one fdatasync, no directory sync
//! An acquisition writes the next epoch in place (`pwrite`) into the slot that does *not* hold
//! the current epoch, `fdatasync`s the file and only then grants. A power loss before the
//! fdatasync returns may leave that slot old, new or torn; the other slot still holds the
//! current epoch, which is what a reader takes, and the new epoch was never handed out. The
//! slot holding the current epoch is never overwritten, so a valid slot always survives (LMDB's
//! two meta pages, a double-buffered superblock).
//!
//! A file that does not exist yet, or one in the format of a tenure before issue 11 (one
//! decimal number and a newline, [`Stored::Legacy`]), is replaced whole once — temp file,
//! fdatasync, rename, sync of the control folder — by a file in this format: the new epoch in
//! slot 0, the previous one in slot 1. Every later acquisition writes in place.
//!
//! Anything else — another length, no valid slot, a legacy file that does not parse — is
//! refused as corrupt, never rewritten.

use std::path::PathBuf;

use crate::privfs::{Dir, FsError};

/// The name of the epoch file inside the control folder.
pub const EPOCH_FILE: &str = "epoch";

/// The bytes of one slot: the epoch and its checksum.
pub const SLOT_LEN: usize = 16;

/// The offset of slot 1 (slot 0 is at 0): one page apart.
pub const SLOT_STRIDE: u64 = 4096;

/// The length of an epoch file in the slot format.
pub const FILE_LEN: u64 = SLOT_STRIDE + SLOT_LEN as u64;

/// The largest epoch file accepted (the slot format; a legacy file is at most 21 bytes).
pub const MAX_LEN: u64 = FILE_LEN;

/// What the checksum of a slot covers besides the epoch.
const SLOT_DOMAIN: &[u8] = b"tenure epoch slot\n";

/// Errors of reading or writing the epoch file.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum EpochError {
    /// The file exists but holds neither a valid slot nor `<decimal u64>\n`.
    #[error(
        "{path} is corrupt ({reason}); it must hold a valid epoch slot (or, from an older tenure, one decimal number and a newline): restore it from a backup or run `tenure init --adopt`"
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
    /// The slot format: the highest valid slot's epoch, and which slot holds it.
    Slots {
        /// The epoch.
        epoch: u64,
        /// The slot (0 or 1) that holds it; the next epoch goes into the other one.
        newest: usize,
    },
}

impl Stored {
    /// The epoch the file holds.
    pub fn epoch(self) -> u64 {
        match self {
            Stored::Legacy(e) | Stored::Slots { epoch: e, .. } => e,
        }
    }
}

fn checksum(epoch: u64) -> [u8; 8] {
    use sha2::Digest as _;
    let mut h = sha2::Sha256::new();
    h.update(SLOT_DOMAIN);
    h.update(epoch.to_le_bytes());
    let d = h.finalize();
    let mut out = [0u8; 8];
    out.copy_from_slice(&d[..8]);
    out
}

/// The bytes of a slot holding `epoch`.
pub fn slot(epoch: u64) -> [u8; SLOT_LEN] {
    let mut out = [0u8; SLOT_LEN];
    out[..8].copy_from_slice(&epoch.to_le_bytes());
    out[8..].copy_from_slice(&checksum(epoch));
    out
}

/// The offset of slot `i` (0 or 1) in the file.
pub const fn slot_offset(i: usize) -> u64 {
    if i == 0 { 0 } else { SLOT_STRIDE }
}

/// The epoch a slot holds, if its checksum matches.
pub fn slot_value(bytes: &[u8]) -> Option<u64> {
    let value = u64::from_le_bytes(bytes.get(..8)?.try_into().ok()?);
    // The mutant `lease-epoch-slot-unchecked` takes a slot at face value: a torn one (garbage)
    // then reads as whatever number the garbage spells.
    if crate::mutant::on("lease-epoch-slot-unchecked") {
        return Some(value);
    }
    (bytes.get(8..SLOT_LEN)? == checksum(value)).then_some(value)
}

/// Parses the content of an epoch file (either format).
pub fn decode(bytes: &[u8]) -> Result<Stored, &'static str> {
    if bytes.len() as u64 != FILE_LEN {
        return parse_legacy(bytes).map(Stored::Legacy);
    }
    let at = |i: usize| {
        let o = slot_offset(i) as usize;
        slot_value(&bytes[o..o + SLOT_LEN])
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

/// Parses the content of an epoch file (either format) to its epoch.
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
/// fsync; crash points `epoch.*`): setup and tests. Acquisitions write in place.
pub fn write(control: &Dir, epoch: u64) -> Result<(), EpochError> {
    control.replace_durable(EPOCH_FILE, &encode(epoch, None), "epoch")?;
    Ok(())
}

/// A whole epoch file in the slot format: `epoch` in slot 0 and `previous` (if any) in slot 1
/// (a slot of zeros is invalid).
pub fn encode(epoch: u64, previous: Option<u64>) -> Vec<u8> {
    let mut out = vec![0u8; FILE_LEN as usize];
    out[..SLOT_LEN].copy_from_slice(&slot(epoch));
    if let Some(p) = previous {
        let o = SLOT_STRIDE as usize;
        out[o..o + SLOT_LEN].copy_from_slice(&slot(p));
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
        assert_eq!(bytes.len() as u64, FILE_LEN);
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
        f[o..o + SLOT_LEN].copy_from_slice(&slot(8));
        assert_eq!(
            decode(&f),
            Ok(Stored::Slots {
                epoch: 8,
                newest: 1
            })
        );
        // Slot 1 torn (as the models' crash filesystem tears it): slot 0 holds.
        f[o..o + SLOT_LEN].fill(0xff);
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
        f[..SLOT_LEN].fill(0);
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
        std::fs::write(&path, [b'1'; 5000]).unwrap();
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
}

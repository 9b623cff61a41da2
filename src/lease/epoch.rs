//! The epoch file `.tenure/epoch`: a strictly increasing u64 in decimal followed by `\n`.
//!
//! The epoch fences stale owners (card H5): every acquisition bumps it durably under the lock
//! before `acquire` returns, and checkpoint publication refuses to proceed when the persisted
//! epoch is newer than the publisher's. A missing file means epoch 0 (no owner ever acquired);
//! anything that is not exactly `<digits>\n` is refused as corrupt, never rewritten.

use std::path::PathBuf;

use crate::privfs::{Dir, FsError};

/// The name of the epoch file inside the control folder.
pub const EPOCH_FILE: &str = "epoch";

/// The largest epoch file accepted: 20 digits of u64 plus the newline, with some slack.
pub const MAX_LEN: u64 = 64;

/// Errors of reading or writing the epoch file.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum EpochError {
    /// The file exists but does not hold `<decimal u64>\n`.
    #[error(
        "{path} is corrupt ({reason}); it must hold one decimal number and a newline: restore it from a backup or run `tenure init --adopt`"
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

/// Parses the content of an epoch file.
pub fn parse(bytes: &[u8]) -> Result<u64, &'static str> {
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

/// Durably replaces the epoch file with `epoch` (temp, write, fsync, rename, dir fsync; crash
/// points `epoch.*`).
pub fn write(control: &Dir, epoch: u64) -> Result<(), EpochError> {
    control.replace_durable(EPOCH_FILE, &encode(epoch), "epoch")?;
    Ok(())
}

/// The file content for `epoch`.
pub fn encode(epoch: u64) -> Vec<u8> {
    format!("{epoch}\n").into_bytes()
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
        assert_eq!(bytes, b"2\n");
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
        std::fs::write(&path, [b'1'; 100]).unwrap();
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

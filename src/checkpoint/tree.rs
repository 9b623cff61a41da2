//! Directory trees inside the store: walking a staging area into flat entry names, opening a
//! nested entry, and removing scratch trees (staging areas and views).
//!
//! Everything goes through privfs descriptors; nothing here follows a symlink.

use std::fs::File;
use std::os::unix::ffi::OsStrExt;

use rustix::fs::Mode;

use super::error::CheckpointError;
use super::format::{self, FormatError};
use crate::privfs::{Dir, FileKind, FsError};

/// A regular file found in a staging area.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Staged {
    /// Relative name with `/` separators.
    pub name: String,
}

/// Walks `root` depth-first and lists its regular files by relative name, sorted by name
/// bytes. Symlinks and special files are refused; directories are descended, empty ones
/// contribute nothing.
pub(crate) fn walk(root: &Dir) -> Result<Vec<Staged>, CheckpointError> {
    let mut out = Vec::new();
    walk_into(root, "", &mut out)?;
    out.sort_by(|a, b| a.name.as_bytes().cmp(b.name.as_bytes()));
    Ok(out)
}

fn walk_into(dir: &Dir, prefix: &str, out: &mut Vec<Staged>) -> Result<(), CheckpointError> {
    for e in dir.entries()? {
        let path = dir.child_path(&e.name);
        let Ok(leaf) = std::str::from_utf8(e.name.as_bytes()) else {
            return Err(CheckpointError::BadEntryName {
                path,
                reason: FormatError::BadName {
                    name: e.name.to_string_lossy().into_owned(),
                    reason: "it is not valid UTF-8",
                },
            });
        };
        let name = format!("{prefix}{leaf}");
        // Checking the name before descending also bounds the recursion: a name can be at most
        // 4096 bytes, so the walk is at most 2048 directories deep.
        format::check_name(&name).map_err(|reason| CheckpointError::BadEntryName {
            path: path.clone(),
            reason,
        })?;
        match e.kind {
            FileKind::Regular => out.push(Staged { name }),
            FileKind::Directory => {
                let sub = dir.open_dir_any_mode(&e.name)?;
                walk_into(&sub, &format!("{name}/"), out)?;
            }
            FileKind::Symlink => return Err(unsupported(path, "symlink")),
            FileKind::Fifo => return Err(unsupported(path, "fifo")),
            FileKind::Socket => return Err(unsupported(path, "socket")),
            FileKind::CharDevice => return Err(unsupported(path, "character device")),
            FileKind::BlockDevice => return Err(unsupported(path, "block device")),
            FileKind::Unknown => return Err(unsupported(path, "file of unknown type")),
        }
    }
    Ok(())
}

fn unsupported(path: std::path::PathBuf, kind: &'static str) -> CheckpointError {
    CheckpointError::UnsupportedFile { path, kind }
}

/// Opens the staged file `name` (a `/`-separated relative name from [`walk`]) under `root`,
/// one component at a time so no component can be a symlink.
pub(crate) fn open_staged(root: &Dir, name: &str) -> Result<File, CheckpointError> {
    let mut parts: Vec<&str> = name.split('/').collect();
    let leaf = parts.pop().expect("split yields at least one part");
    let mut held: Option<Dir> = None;
    for p in parts {
        let next = held.as_ref().unwrap_or(root).open_dir_any_mode(p)?;
        held = Some(next);
    }
    Ok(held.as_ref().unwrap_or(root).open_file_any_mode(leaf)?)
}

/// Removes the directory `name` under `parent` and everything in it. Used only for scratch
/// trees the store created (staging areas and views), never for checkpoint state. Write
/// permission is restored on each directory first because views are made read-only.
pub(crate) fn remove_tree(parent: &Dir, name: &str, label: &str) -> Result<(), CheckpointError> {
    let dir = match parent.open_dir_any_mode(name) {
        Ok(d) => d,
        Err(FsError::NotFound { .. }) => return Ok(()),
        Err(e) => return Err(e.into()),
    };
    rustix::fs::fchmod(&dir, Mode::from_raw_mode(0o700))
        .map_err(|e| CheckpointError::io(dir.path(), "make writable", e.into()))?;
    for e in dir.entries()? {
        match e.kind {
            FileKind::Directory => {
                let Some(sub) = e.name.to_str() else {
                    return Err(CheckpointError::BadEntryName {
                        path: dir.child_path(&e.name),
                        reason: FormatError::BadName {
                            name: e.name.to_string_lossy().into_owned(),
                            reason: "it is not valid UTF-8",
                        },
                    });
                };
                remove_tree(&dir, sub, label)?;
            }
            FileKind::Regular
            | FileKind::Symlink
            | FileKind::Fifo
            | FileKind::Socket
            | FileKind::CharDevice
            | FileKind::BlockDevice
            | FileKind::Unknown => match dir.unlink(&e.name, label) {
                Ok(()) | Err(FsError::NotFound { .. }) => {}
                Err(err) => return Err(err.into()),
            },
        }
    }
    drop(dir);
    match parent.remove_dir(name, label) {
        Ok(()) | Err(FsError::NotFound { .. }) => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// A fresh random name for a scratch directory.
pub(crate) fn random_name() -> Result<String, CheckpointError> {
    let mut b = [0u8; 8];
    crate::privfs::random_bytes(&mut b)?;
    Ok(b.iter().map(|x| format!("{x:02x}")).collect())
}

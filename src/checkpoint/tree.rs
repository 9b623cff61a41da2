//! Directory trees inside the store: walking a staging area into flat entry names, opening a
//! nested entry, and removing scratch trees (staging areas and views).
//!
//! Everything goes through privfs descriptors; nothing here follows a symlink.

use std::ffi::OsStr;
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
/// trees the store created or was handed (staging areas, views, kept outputs), never for
/// checkpoint state.
///
/// There is no recursion, and the descriptors and memory it uses do not depend on the depth or
/// the width of the tree (a leftover staging area 8,000 levels deep is removed like a flat
/// one): instead of descending, it *hoists*. Each subdirectory of the top directory is emptied
/// one level at a time: its files are unlinked and its own subdirectories are renamed up into
/// the top directory under fresh names, then it is removed. Every directory is renamed at most
/// once and every file unlinked once, so the work is linear in the size of the tree, and only
/// two directory descriptors are open at a time. Nothing ever leaves the tree (no `..`, no
/// link is followed: a symlink is an entry like a file and is unlinked). Write permission is
/// restored on each directory first because views are made read-only.
pub(crate) fn remove_tree(
    parent: &Dir,
    name: impl AsRef<OsStr>,
    label: &str,
) -> Result<(), CheckpointError> {
    let name = name.as_ref();
    let top = match parent.open_dir_any_mode(name) {
        Ok(d) => d,
        Err(FsError::NotFound { .. }) => return Ok(()),
        Err(e) => return Err(e.into()),
    };
    make_writable(&top)?;
    loop {
        let mut seen = false;
        top.for_each_entry(|entry, kind| -> Result<bool, CheckpointError> {
            seen = true;
            match kind {
                FileKind::Directory => hoist(&top, entry, label)?,
                FileKind::Regular
                | FileKind::Symlink
                | FileKind::Fifo
                | FileKind::Socket
                | FileKind::CharDevice
                | FileKind::BlockDevice
                | FileKind::Unknown => unlink_gone_ok(&top, entry, label)?,
            }
            Ok(true)
        })?;
        // Directories hoisted during the pass may not have been listed by it: go again until
        // a pass finds the top directory empty.
        if !seen {
            break;
        }
    }
    drop(top);
    match parent.remove_dir(name, label) {
        Ok(()) | Err(FsError::NotFound { .. }) => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// Empties the subdirectory `name` of `top` by one level (files unlinked, subdirectories
/// renamed into `top` under fresh names) and removes it.
fn hoist(top: &Dir, name: &OsStr, label: &str) -> Result<(), CheckpointError> {
    let sub = match top.open_dir_any_mode(name) {
        Ok(d) => d,
        Err(FsError::NotFound { .. }) => return Ok(()),
        Err(e) => return Err(e.into()),
    };
    make_writable(&sub)?;
    loop {
        let mut seen = false;
        sub.for_each_entry(|entry, kind| -> Result<bool, CheckpointError> {
            seen = true;
            match kind {
                FileKind::Directory => {
                    // Moving a directory to another parent rewrites its `..`, which needs
                    // write permission on it.
                    match sub.open_dir_any_mode(entry) {
                        Ok(d) => make_writable(&d)?,
                        Err(FsError::NotFound { .. }) => return Ok(true),
                        Err(e) => return Err(e.into()),
                    }
                    loop {
                        let fresh = format!(".rm-{}", random_name()?);
                        match sub.rename_to(entry, top, &fresh, label, true) {
                            Ok(()) | Err(FsError::NotFound { .. }) => break,
                            Err(FsError::AlreadyExists { .. }) => continue,
                            Err(e) => return Err(e.into()),
                        }
                    }
                }
                FileKind::Regular
                | FileKind::Symlink
                | FileKind::Fifo
                | FileKind::Socket
                | FileKind::CharDevice
                | FileKind::BlockDevice
                | FileKind::Unknown => unlink_gone_ok(&sub, entry, label)?,
            }
            Ok(true)
        })?;
        if !seen {
            break;
        }
    }
    drop(sub);
    match top.remove_dir(name, label) {
        Ok(()) | Err(FsError::NotFound { .. }) => Ok(()),
        Err(e) => Err(e.into()),
    }
}

fn make_writable(d: &Dir) -> Result<(), CheckpointError> {
    rustix::fs::fchmod(d, Mode::from_raw_mode(0o700))
        .map_err(|e| CheckpointError::io(d.path(), "make writable", e.into()))
}

fn unlink_gone_ok(d: &Dir, name: &OsStr, label: &str) -> Result<(), CheckpointError> {
    match d.unlink(name, label) {
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

//! Removing scratch trees (staging areas, views, kept outputs) without recursion and with a
//! bounded number of descriptors.

use std::ffi::OsStr;

use rustix::fs::Mode;

use super::{Dir, FileKind, FsError, random_hex};

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
pub(super) fn remove_tree(parent: &Dir, name: &OsStr, label: &str) -> Result<(), FsError> {
    let top = match parent.open_dir_any_mode(name) {
        Ok(d) => d,
        Err(FsError::NotFound { .. }) => return Ok(()),
        Err(e) => return Err(e),
    };
    make_writable(&top)?;
    loop {
        let mut seen = false;
        top.for_each_entry(|entry, kind| -> Result<bool, FsError> {
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
        Err(e) => Err(e),
    }
}

/// Empties the subdirectory `name` of `top` by one level (files unlinked, subdirectories
/// renamed into `top` under fresh names) and removes it.
fn hoist(top: &Dir, name: &OsStr, label: &str) -> Result<(), FsError> {
    let sub = match top.open_dir_any_mode(name) {
        Ok(d) => d,
        Err(FsError::NotFound { .. }) => return Ok(()),
        Err(e) => return Err(e),
    };
    make_writable(&sub)?;
    loop {
        let mut seen = false;
        sub.for_each_entry(|entry, kind| -> Result<bool, FsError> {
            seen = true;
            match kind {
                FileKind::Directory => {
                    // Moving a directory to another parent rewrites its `..`, which needs
                    // write permission on it.
                    match sub.open_dir_any_mode(entry) {
                        Ok(d) => make_writable(&d)?,
                        Err(FsError::NotFound { .. }) => return Ok(true),
                        Err(e) => return Err(e),
                    }
                    loop {
                        let fresh = format!(".rm-{}", random_hex(8));
                        match sub.rename_to(entry, top, &fresh, label, true) {
                            Ok(()) | Err(FsError::NotFound { .. }) => break,
                            Err(FsError::AlreadyExists { .. }) => continue,
                            Err(e) => return Err(e),
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
        Err(e) => Err(e),
    }
}

fn make_writable(d: &Dir) -> Result<(), FsError> {
    rustix::fs::fchmod(d, Mode::from_raw_mode(0o700))
        .map_err(|e| FsError::io("make writable", d.path().to_path_buf(), e))
}

fn unlink_gone_ok(d: &Dir, name: &OsStr, label: &str) -> Result<(), FsError> {
    match d.unlink(name, label) {
        Ok(()) | Err(FsError::NotFound { .. }) => Ok(()),
        Err(e) => Err(e),
    }
}

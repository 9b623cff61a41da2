//! Directory trees inside the store, walked without recursion and with a bounded number of
//! descriptors at any depth: the staging-area walk of a publish ([`Walker`]), writing views
//! ([`ViewWriter`]) and removing scratch trees ([`remove_tree`]).
//!
//! Everything goes through privfs descriptors; nothing here follows a symlink.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;

use rustix::fs::Mode;

use super::error::CheckpointError;
use super::format::{self, FormatError};
use crate::privfs::{Dir, FileKind};

fn unsupported(path: std::path::PathBuf, kind: &'static str) -> CheckpointError {
    CheckpointError::UnsupportedFile { path, kind }
}

/// Removes the scratch tree `name` under `parent` ([`Dir::remove_tree`]).
pub(crate) fn remove_tree(
    parent: &Dir,
    name: impl AsRef<OsStr>,
    label: &str,
) -> Result<(), CheckpointError> {
    Ok(parent.remove_tree(name, label)?)
}

/// A fresh random name for a scratch directory.
pub(crate) fn random_name() -> Result<String, CheckpointError> {
    let mut b = [0u8; 8];
    crate::privfs::random_bytes(&mut b)?;
    Ok(crate::hex::encode(&b))
}

/// How many directory descriptors a [`DirCursor`] keeps open at most: the walks of the store
/// hold this many (plus two or three transient ones) whatever the depth of the tree.
pub(crate) const CURSOR_FDS: usize = 16;

/// One level of a [`DirCursor`]: a directory below the cursor's top.
#[derive(Debug)]
struct Level {
    name: std::ffi::OsString,
    dir: Option<Dir>,
    dev_ino: (u64, u64),
}

/// The path from a top directory down to the current directory of a walk, holding at most
/// [`CURSOR_FDS`] descriptors: when the path is deeper, the descriptors of the shallowest
/// levels are closed and reopened by name from the nearest open ancestor when the walk comes
/// back up, each reopened level checked against the device and inode it had (a tree that
/// changes under a walk is refused, never followed elsewhere). Memory is one name per level,
/// and names are bounded by the entry-name limit.
#[derive(Debug)]
pub(crate) struct DirCursor<'t> {
    top: &'t Dir,
    levels: Vec<Level>,
    open: usize,
}

fn dev_ino(d: &Dir) -> Result<(u64, u64), CheckpointError> {
    let st = rustix::fs::fstat(d).map_err(|e| CheckpointError::io(d.path(), "stat", e.into()))?;
    Ok((st.st_dev, st.st_ino))
}

impl<'t> DirCursor<'t> {
    pub(crate) fn new(top: &'t Dir) -> DirCursor<'t> {
        DirCursor {
            top,
            levels: Vec::new(),
            open: 0,
        }
    }

    /// Levels below the top.
    pub(crate) fn depth(&self) -> usize {
        self.levels.len()
    }

    /// Enters `dir`, a subdirectory `name` of the current directory the caller just opened.
    pub(crate) fn push(&mut self, name: &OsStr, dir: Dir) -> Result<(), CheckpointError> {
        let id = dev_ino(&dir)?;
        self.levels.push(Level {
            name: name.to_owned(),
            dir: Some(dir),
            dev_ino: id,
        });
        self.open += 1;
        self.trim(self.levels.len() - 1);
        Ok(())
    }

    /// Over the budget, closes the descriptor of the shallowest open level above `keep`.
    fn trim(&mut self, keep: usize) {
        if self.open <= CURSOR_FDS {
            return;
        }
        if let Some(l) = self.levels[..keep].iter_mut().find(|l| l.dir.is_some()) {
            l.dir = None;
            self.open -= 1;
        }
    }

    /// Leaves the current directory and returns it (opened again if its descriptor was
    /// closed).
    pub(crate) fn pop(&mut self) -> Result<Option<Dir>, CheckpointError> {
        self.current()?;
        Ok(self.pop_closed())
    }

    /// Leaves the current directory without needing its descriptor.
    pub(crate) fn pop_closed(&mut self) -> Option<Dir> {
        let l = self.levels.pop()?;
        if l.dir.is_some() {
            self.open -= 1;
        }
        l.dir
    }

    /// The current directory, reopening it (and the levels above it that are closed) by name
    /// from the nearest open ancestor if needed.
    pub(crate) fn current(&mut self) -> Result<&Dir, CheckpointError> {
        let Some(last) = self.levels.len().checked_sub(1) else {
            return Ok(self.top);
        };
        if self.levels[last].dir.is_none() {
            let start = self.levels[..last]
                .iter()
                .rposition(|l| l.dir.is_some())
                .map_or(0, |i| i + 1);
            for i in start..=last {
                let parent = match i.checked_sub(1) {
                    None => self.top,
                    Some(p) => self.levels[p].dir.as_ref().expect("opened in order"),
                };
                let d = parent.open_dir_any_mode(&self.levels[i].name)?;
                if dev_ino(&d)? != self.levels[i].dev_ino {
                    return Err(CheckpointError::io(
                        d.path(),
                        "walk",
                        std::io::Error::other("the directory was replaced during the walk"),
                    ));
                }
                self.levels[i].dir = Some(d);
                self.open += 1;
                // Stay within the budget as we go down, keeping the level just opened.
                self.trim(i);
            }
        }
        Ok(match self.levels.last() {
            Some(l) => l.dir.as_ref().expect("the current level is open"),
            None => self.top,
        })
    }
}

/// One entry of a directory listing, in an arena.
#[derive(Debug, Clone, Copy)]
struct Item {
    start: u32,
    len: u32,
    kind: FileKind,
}

/// A directory's entries, sorted so that a depth-first walk yields names in byte order of the
/// full `/`-joined names (a directory sorts as its name followed by `/`). Stored compactly
/// (one arena of names): about 16 bytes plus the name per entry.
#[derive(Debug, Default)]
struct Listing {
    arena: Vec<u8>,
    items: Vec<Item>,
    next: usize,
}

impl Listing {
    fn read(dir: &Dir) -> Result<Listing, CheckpointError> {
        let mut l = Listing::default();
        dir.for_each_entry(|name, kind| -> Result<bool, CheckpointError> {
            let b = name.as_bytes();
            l.items.push(Item {
                start: l.arena.len() as u32,
                len: b.len() as u32,
                kind,
            });
            l.arena.extend_from_slice(b);
            Ok(true)
        })?;
        let arena = &l.arena;
        let key = |it: &Item| {
            let name = &arena[it.start as usize..(it.start + it.len) as usize];
            let slash: &[u8] = if it.kind == FileKind::Directory {
                b"/"
            } else {
                b""
            };
            (name, slash)
        };
        l.items.sort_by(|a, b| {
            let (an, asl) = key(a);
            let (bn, bsl) = key(b);
            an.iter().chain(asl).cmp(bn.iter().chain(bsl))
        });
        Ok(l)
    }

    fn next(&mut self) -> Option<(&[u8], FileKind)> {
        let it = *self.items.get(self.next)?;
        self.next += 1;
        Some((
            &self.arena[it.start as usize..(it.start + it.len) as usize],
            it.kind,
        ))
    }
}

/// A regular file found by a [`Walker`].
pub(crate) struct Found {
    /// Its `/`-separated name relative to the top.
    pub name: String,
}

/// A depth-first walk of a staging area that yields its regular files in byte order of their
/// names (the manifest's order), checking each name against the limits as it goes: a name
/// that is not UTF-8 or breaks a rule, a tree deeper than the limit, a symlink or special file
/// are refused with an error naming the path. No recursion; descriptors are bounded by the
/// [`DirCursor`]; memory is the listings of the directories on the current path.
pub(crate) struct Walker<'t> {
    cursor: DirCursor<'t>,
    frames: Vec<(Listing, usize)>,
    prefix: String,
    limits: super::Limits,
}

impl<'t> Walker<'t> {
    pub(crate) fn new(top: &'t Dir, limits: super::Limits) -> Result<Walker<'t>, CheckpointError> {
        let first = Listing::read(top)?;
        Ok(Walker {
            cursor: DirCursor::new(top),
            frames: vec![(first, 0)],
            prefix: String::new(),
            limits,
        })
    }

    /// The directory holding the file [`Walker::next`] returned last.
    pub(crate) fn dir(&mut self) -> Result<&Dir, CheckpointError> {
        self.cursor.current()
    }

    /// The next regular file, or `None` at the end.
    pub(crate) fn next(&mut self) -> Result<Option<Found>, CheckpointError> {
        loop {
            let Some((listing, _)) = self.frames.last_mut() else {
                return Ok(None);
            };
            let Some((leaf, kind)) = listing.next() else {
                // Done with this directory: back to its parent's names.
                self.frames.pop();
                if let Some((_, parent_len)) = self.frames.last() {
                    self.prefix.truncate(*parent_len);
                    self.cursor.pop_closed();
                }
                continue;
            };
            let leaf = leaf.to_vec();
            let path = || {
                self.cursor
                    .top
                    .path()
                    .join(&self.prefix)
                    .join(OsStr::from_bytes(&leaf))
            };
            let Ok(leaf_str) = std::str::from_utf8(&leaf) else {
                return Err(CheckpointError::BadEntryName {
                    path: path(),
                    reason: FormatError::BadName {
                        name: String::from_utf8_lossy(&leaf).into_owned(),
                        reason: "it is not valid UTF-8",
                    },
                });
            };
            let name = format!("{}{leaf_str}", self.prefix);
            let depth = self.cursor.depth() + 1;
            match kind {
                FileKind::Regular => {
                    format::check_name_with(&name, &self.limits).map_err(|reason| {
                        CheckpointError::BadEntryName {
                            path: path(),
                            reason,
                        }
                    })?;
                    return Ok(Some(Found { name }));
                }
                FileKind::Directory => {
                    // Names under it have one more component: refuse descending past the
                    // limit unless the directory is empty (empty directories are not recorded).
                    let sub = self
                        .cursor
                        .current()?
                        .open_dir_any_mode(OsStr::from_bytes(&leaf))?;
                    let listing = Listing::read(&sub)?;
                    if listing.items.is_empty() {
                        continue;
                    }
                    let inner = format!("{name}/x");
                    if depth + 1 > self.limits.max_depth {
                        return Err(CheckpointError::BadEntryName {
                            path: path(),
                            reason: FormatError::TooDeep {
                                name: inner.chars().take(200).collect(),
                                depth: depth + 1,
                                max: self.limits.max_depth,
                            },
                        });
                    }
                    // The directory's own name must leave room for a name inside it.
                    if let Err(reason) = format::check_name_with(&inner, &self.limits) {
                        return Err(CheckpointError::BadEntryName {
                            path: path(),
                            reason,
                        });
                    }
                    self.cursor.push(OsStr::from_bytes(&leaf), sub)?;
                    self.prefix.push_str(leaf_str);
                    self.prefix.push('/');
                    let len = self.prefix.len();
                    self.frames.push((listing, len));
                }
                FileKind::Symlink => return Err(unsupported(path(), "symlink")),
                FileKind::Fifo => return Err(unsupported(path(), "fifo")),
                FileKind::Socket => return Err(unsupported(path(), "socket")),
                FileKind::CharDevice => return Err(unsupported(path(), "character device")),
                FileKind::BlockDevice => return Err(unsupported(path(), "block device")),
                FileKind::Unknown => return Err(unsupported(path(), "file of unknown type")),
            }
        }
    }
}

/// Writes a view in manifest order: the directories of the entry names are created as they
/// are first needed and made read-only (0500) as soon as the walk leaves them for good (names
/// sharing a directory are contiguous in manifest order), through a [`DirCursor`], so a view
/// of any depth takes a bounded number of descriptors.
pub(crate) struct ViewWriter<'t> {
    cursor: DirCursor<'t>,
    path: Vec<String>,
}

impl<'t> ViewWriter<'t> {
    pub(crate) fn new(top: &'t Dir) -> ViewWriter<'t> {
        ViewWriter {
            cursor: DirCursor::new(top),
            path: Vec::new(),
        }
    }

    /// The directory for entry `name` (created as needed) and the name's last component.
    pub(crate) fn dir_for<'n>(
        &mut self,
        name: &'n str,
    ) -> Result<(&Dir, &'n str), CheckpointError> {
        let (dirs, leaf) = match name.rsplit_once('/') {
            Some((d, l)) => (d.split('/').collect::<Vec<_>>(), l),
            None => (Vec::new(), name),
        };
        let common = self
            .path
            .iter()
            .zip(&dirs)
            .take_while(|(a, b)| a.as_str() == **b)
            .count();
        while self.path.len() > common {
            self.leave()?;
        }
        for comp in &dirs[common..] {
            let d = self.cursor.current()?.create_dir(comp, "view")?;
            self.cursor.push(OsStr::new(comp), d)?;
            self.path.push((*comp).to_owned());
        }
        Ok((self.cursor.current()?, leaf))
    }

    fn leave(&mut self) -> Result<(), CheckpointError> {
        if let Some(d) = self.cursor.pop()? {
            rustix::fs::fchmod(&d, Mode::from_raw_mode(0o500))
                .map_err(|e| CheckpointError::io(d.path(), "make read-only", e.into()))?;
        }
        self.path.pop();
        Ok(())
    }

    /// Makes every directory read-only, the top last.
    pub(crate) fn finish(mut self) -> Result<(), CheckpointError> {
        while !self.path.is_empty() {
            self.leave()?;
        }
        let top = self.cursor.top;
        rustix::fs::fchmod(top, Mode::from_raw_mode(0o500))
            .map_err(|e| CheckpointError::io(top.path(), "make read-only", e.into()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::privfs::StateDir;

    /// The descriptors of this process open on something below `under`: tests running
    /// beside this one in the same process open and close descriptors of their own, so
    /// counting them all made the bound below fail now and then (seen as a flaky
    /// `deep_walks_hold_a_bounded_number_of_descriptors` under `cargo test --lib`).
    fn open_fds(under: &std::path::Path) -> usize {
        std::fs::read_dir("/proc/self/fd")
            .unwrap()
            .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
            .filter(|target| target.starts_with(under))
            .count()
    }

    /// The walk of a 300-level tree holds at most [`CURSOR_FDS`] (plus a few) descriptors and
    /// finds the bottom file; removing it needs two.
    #[test]
    fn deep_walks_hold_a_bounded_number_of_descriptors() {
        let t = tempfile::tempdir().unwrap();
        let sd = StateDir::open(&t.path().join("s"), true).unwrap();
        let top = sd.root().create_dir("top", "t").unwrap();
        {
            let mut d = top.try_clone().unwrap();
            for _ in 0..300 {
                d = d.create_dir("d", "t").unwrap();
            }
            d.create_exclusive("f", "t").unwrap();
            // A file at the top after the deep branch: the walk comes back up through levels
            // whose descriptors it closed.
            top.create_exclusive("z", "t").unwrap();
        }
        let before = open_fds(t.path());
        assert!(before >= 2, "the state dir and `top` are counted: {before}");
        let limits = crate::checkpoint::Limits {
            max_depth: 1000,
            ..crate::checkpoint::Limits::DEFAULT
        };
        let mut w = Walker::new(&top, limits).unwrap();
        let mut most = 0;
        let mut found = Vec::new();
        while let Some(f) = w.next().unwrap() {
            most = most.max(open_fds(t.path()));
            found.push(f.name);
            w.dir().unwrap();
            most = most.max(open_fds(t.path()));
        }
        assert_eq!(
            found,
            vec![vec!["d"; 300].join("/") + "/f", "z".to_string()]
        );
        assert!(
            most <= before + CURSOR_FDS + 2,
            "{most} open, {before} before"
        );
        drop(w);
        // A view of the same shape: created, made read-only on the way back up.
        let view = sd.root().create_dir("view", "t").unwrap();
        let mut vw = ViewWriter::new(&view);
        for name in &found {
            let (d, leaf) = vw.dir_for(name).unwrap();
            d.create_exclusive(leaf, "t").unwrap();
            most = most.max(open_fds(t.path()));
        }
        vw.finish().unwrap();
        assert!(
            most <= before + CURSOR_FDS + 3,
            "{most} open, {before} before"
        );
        let deep_dir = t.path().join("s/view").join(vec!["d"; 300].join("/"));
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(
            std::fs::metadata(&deep_dir).unwrap().permissions().mode() & 0o777,
            0o500
        );
        remove_tree(sd.root(), "view", "t").unwrap();
        remove_tree(sd.root(), "top", "t").unwrap();
        assert!(sd.root().stat("top").unwrap().is_none());
    }
}

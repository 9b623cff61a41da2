//! The crash filesystem against the real one (design.md, "Protocols as data", rule 5): one
//! script of file operations runs on a real temp dir through `privfs::Exec` and on the
//! simulated filesystem, aborted after op k for every k (a process crash: descriptors dropped,
//! nothing cleaned up), followed by a recovery (temp files swept, records read). Every result,
//! the tree after the abort and the tree after the recovery agree.

use std::collections::BTreeMap;
use std::ffi::{OsStr, OsString};
use std::path::Path;

use tenure::fsop::{Check, Done, Executor, Fd, Op, Step};
use tenure::privfs::{Exec, FsError, StateDir, TEMP_PREFIX};
use tenure_models::fs::SimFs;

/// A result with what differs between the worlds taken out: temp names become `T<n>` in order
/// of creation, errors become their kind.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Seen {
    Ok(String),
    Err(&'static str),
}

#[derive(Default)]
struct Names {
    temps: Vec<OsString>,
}

impl Names {
    fn show(&self, name: &OsStr) -> String {
        match self.temps.iter().rposition(|t| t == name) {
            Some(i) => format!("T{i}"),
            None => name.to_string_lossy().into_owned(),
        }
    }

    fn seen(&mut self, r: &Result<Done, FsError>) -> Seen {
        match r {
            Ok(Done::Created { fd, name }) => {
                if name.to_string_lossy().starts_with(TEMP_PREFIX) {
                    self.temps.push(name.clone());
                }
                Seen::Ok(format!("created {} as {}", self.show(name), fd.0))
            }
            Ok(Done::Entries(e)) => {
                let mut names: Vec<String> = e
                    .iter()
                    .map(|(n, k)| format!("{}:{k:?}", self.show(n)))
                    .collect();
                // Readdir order is the filesystem's; the set is what counts.
                names.sort();
                Seen::Ok(format!("entries {names:?}"))
            }
            Ok(d) => Seen::Ok(format!("{d:?}")),
            Err(FsError::NotFound { .. }) => Seen::Err("not found"),
            Err(FsError::AlreadyExists { .. }) => Seen::Err("exists"),
            Err(FsError::TooLarge { .. }) => Seen::Err("too large"),
            Err(_) => Seen::Err("other"),
        }
    }
}

/// Runs at most `budget` ops of a script on `exec`, recording what each returned.
struct Runner<'e, E> {
    exec: &'e mut E,
    budget: usize,
    names: Names,
    log: Vec<Seen>,
}

impl<E: Executor> Runner<'_, E> {
    /// Runs `op`; its result is in the log.
    fn op(&mut self, op: Op<'_>) -> Option<()> {
        self.res(op).map(drop)
    }

    fn res(&mut self, op: Op<'_>) -> Option<Result<Done, FsError>> {
        if self.budget == 0 {
            return None;
        }
        self.budget -= 1;
        let r = self.exec.run(Step::new("crosscheck", op));
        let s = self.names.seen(&r);
        self.log.push(s);
        Some(r)
    }

    fn fd(&mut self, op: Op<'_>) -> Option<Fd> {
        self.res(op)?.ok()?.fd()
    }

    fn created(&mut self, op: Op<'_>) -> Option<(Fd, OsString)> {
        match self.res(op)? {
            Ok(Done::Created { fd, name }) => Some((fd, name)),
            _ => None,
        }
    }
}

const D: &str = "d";

/// The script: a durable replace, a volatile replace, exclusive creates, renames between
/// directories with and without replacing, reads, hashes, a copy, listings, removals and
/// syncs, with the expected failures among them.
fn script<E: Executor>(r: &mut Runner<'_, E>) -> Option<()> {
    let d_name = OsStr::new(D);
    r.op(Op::Mkdir {
        dir: Fd::ROOT,
        name: d_name,
    })?;
    r.op(Op::SyncDir { dir: Fd::ROOT })?;
    let d = r.fd(Op::OpenDir {
        dir: Fd::ROOT,
        name: d_name,
        any_mode: false,
    })?;
    // A durable replace.
    let (f, t) = r.created(Op::CreateTemp { dir: d })?;
    r.op(Op::Write {
        fd: f,
        bytes: b"one",
    })?;
    r.op(Op::Fsync {
        fd: f,
        data_only: false,
    })?;
    r.op(Op::Close { fd: f })?;
    r.op(Op::Rename {
        from_dir: d,
        from: &t,
        to_dir: d,
        to: OsStr::new("rec"),
        noreplace: false,
    })?;
    r.op(Op::SyncDir { dir: d })?;
    // A volatile replace in two writes, left open.
    let (g, t2) = r.created(Op::CreateTemp { dir: d })?;
    r.op(Op::Write {
        fd: g,
        bytes: b"two",
    })?;
    r.op(Op::Write {
        fd: g,
        bytes: b" more",
    })?;
    r.op(Op::Rename {
        from_dir: d,
        from: &t2,
        to_dir: d,
        to: OsStr::new("rec"),
        noreplace: false,
    })?;
    // An exclusive create, moved to another directory without replacing, twice.
    let (x, _) = r.created(Op::CreateNew {
        dir: d,
        name: OsStr::new("x"),
    })?;
    r.op(Op::CreateNew {
        dir: d,
        name: OsStr::new("x"),
    })?;
    r.op(Op::Write {
        fd: x,
        bytes: b"ex",
    })?;
    r.op(Op::Close { fd: x })?;
    for _ in 0..2 {
        r.op(Op::Rename {
            from_dir: d,
            from: OsStr::new("x"),
            to_dir: Fd::ROOT,
            to: OsStr::new("y"),
            noreplace: true,
        })?;
    }
    // Reads and hashes.
    r.op(Op::ReadFile {
        dir: d,
        name: OsStr::new("rec"),
        max: 64,
    })?;
    r.op(Op::ReadFile {
        dir: d,
        name: OsStr::new("rec"),
        max: 3,
    })?;
    r.op(Op::Stat {
        dir: Fd::ROOT,
        name: OsStr::new("y"),
    })?;
    r.op(Op::Stat {
        dir: d,
        name: OsStr::new("y"),
    })?;
    r.op(Op::HashFile {
        dir: Fd::ROOT,
        name: OsStr::new("y"),
        limit: None,
    })?;
    let y = r.fd(Op::Open {
        dir: Fd::ROOT,
        name: OsStr::new("y"),
        check: Check::Private,
    })?;
    r.op(Op::Read { fd: y, max: 1 })?;
    r.op(Op::Hash { fd: y, limit: None })?;
    r.op(Op::Rewind { fd: y })?;
    // A copy from one file into a new one.
    let (c, tc) = r.created(Op::CreateTemp { dir: d })?;
    r.op(Op::Copy {
        to: c,
        from: y,
        limit: None,
        writeback: true,
    })?;
    r.op(Op::Close { fd: y })?;
    r.op(Op::Fsync {
        fd: c,
        data_only: true,
    })?;
    r.op(Op::Rename {
        from_dir: d,
        from: &tc,
        to_dir: d,
        to: OsStr::new("copy"),
        noreplace: true,
    })?;
    // Listing, a scratch tree, removals.
    r.op(Op::Mkdir {
        dir: d,
        name: OsStr::new("scratch"),
    })?;
    let s = r.fd(Op::OpenDir {
        dir: d,
        name: OsStr::new("scratch"),
        any_mode: true,
    })?;
    let (sf, _) = r.created(Op::CreateNew {
        dir: s,
        name: OsStr::new("junk"),
    })?;
    r.op(Op::Close { fd: sf })?;
    r.op(Op::Rmdir {
        dir: d,
        name: OsStr::new("scratch"),
    })?;
    let l = r.fd(Op::List { dir: d })?;
    r.op(Op::ListNext { list: l, max: 100 })?;
    r.op(Op::ListNext { list: l, max: 100 })?;
    r.op(Op::Close { fd: l })?;
    r.op(Op::RemoveTree {
        dir: d,
        name: OsStr::new("scratch"),
    })?;
    r.op(Op::RemoveTree {
        dir: d,
        name: OsStr::new("scratch"),
    })?;
    r.op(Op::Unlink {
        dir: Fd::ROOT,
        name: OsStr::new("y"),
    })?;
    r.op(Op::Unlink {
        dir: Fd::ROOT,
        name: OsStr::new("y"),
    })?;
    r.op(Op::SyncFs { dir: d })?;
    r.op(Op::Close { fd: g })?;
    Some(())
}

/// The recovery after an abort: temp files are swept, the records read.
fn recover<E: Executor>(r: &mut Runner<'_, E>) -> Option<()> {
    let d = r.fd(Op::OpenDir {
        dir: Fd::ROOT,
        name: OsStr::new(D),
        any_mode: false,
    });
    if let Some(d) = d {
        let l = r.fd(Op::List { dir: d })?;
        let Some(Ok(Done::Entries(entries))) = r.res(Op::ListNext { list: l, max: 100 }) else {
            return None;
        };
        for (name, _) in entries {
            if name.to_string_lossy().starts_with(TEMP_PREFIX) {
                r.op(Op::Unlink {
                    dir: d,
                    name: &name,
                })?;
            }
        }
        r.op(Op::SyncDir { dir: d })?;
        for name in ["rec", "copy"] {
            r.op(Op::ReadFile {
                dir: d,
                name: OsStr::new(name),
                max: 64,
            })?;
        }
    }
    r.op(Op::ReadFile {
        dir: Fd::ROOT,
        name: OsStr::new("y"),
        max: 64,
    })?;
    Some(())
}

type Tree = BTreeMap<String, Option<Vec<u8>>>;

fn real_tree(root: &Path, names: &Names) -> Tree {
    let mut out = Tree::new();
    let mut stack = vec![(root.to_path_buf(), String::new())];
    while let Some((dir, prefix)) = stack.pop() {
        for e in std::fs::read_dir(&dir).unwrap() {
            let e = e.unwrap();
            let key = format!("{prefix}{}", names.show(&e.file_name()));
            if e.file_type().unwrap().is_dir() {
                out.insert(key.clone(), None);
                stack.push((e.path(), format!("{key}/")));
            } else {
                out.insert(key, Some(std::fs::read(e.path()).unwrap()));
            }
        }
    }
    out
}

fn sim_tree(fs: &SimFs, names: &Names) -> Tree {
    fs.tree()
        .into_iter()
        .map(|(path, c)| {
            let key = path
                .split('/')
                .map(|p| names.show(OsStr::new(p)))
                .collect::<Vec<_>>()
                .join("/");
            (key, c.map(|c| c.bytes().to_vec()))
        })
        .collect()
}

#[test]
fn simulated_and_real_agree_after_an_abort_at_every_op() {
    let total = {
        let mut fs = SimFs::new();
        let mut r = Runner {
            exec: &mut fs,
            budget: usize::MAX,
            names: Names::default(),
            log: Vec::new(),
        };
        script(&mut r).expect("the whole script runs");
        r.log.len()
    };
    assert!(total > 40, "{total} ops");
    for k in 0..=total {
        let tmp = tempfile::tempdir().unwrap();
        let state = StateDir::open(&tmp.path().join("s"), true).unwrap();
        let mut exec = Exec::new(state.root());
        let mut real = Runner {
            exec: &mut exec,
            budget: k,
            names: Names::default(),
            log: Vec::new(),
        };
        script(&mut real);
        let (real_log, real_names) = (real.log, real.names);
        exec.abandon();
        let mut fs = SimFs::new();
        let mut sim = Runner {
            exec: &mut fs,
            budget: k,
            names: Names::default(),
            log: Vec::new(),
        };
        script(&mut sim);
        let (sim_log, sim_names) = (sim.log, sim.names);
        fs.crash_process();
        assert_eq!(real_log, sim_log, "results of the first {k} ops");
        let after_abort = real_tree(state.path(), &real_names);
        assert_eq!(after_abort, sim_tree(&fs, &sim_names), "tree after {k} ops");

        // Recovery on a fresh executor (a new process).
        let mut exec = Exec::new(state.root());
        let mut real = Runner {
            exec: &mut exec,
            budget: usize::MAX,
            names: real_names,
            log: Vec::new(),
        };
        recover(&mut real);
        let (real_log, real_names) = (real.log, real.names);
        drop(exec);
        let mut sim = Runner {
            exec: &mut fs,
            budget: usize::MAX,
            names: sim_names,
            log: Vec::new(),
        };
        recover(&mut sim);
        let (sim_log, sim_names) = (sim.log, sim.names);
        assert_eq!(real_log, sim_log, "recovery after {k} ops");
        assert_eq!(
            real_tree(state.path(), &real_names),
            sim_tree(&fs, &sim_names),
            "tree after the recovery that followed {k} ops"
        );
    }
}

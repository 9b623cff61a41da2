//! Unit tests of the private filesystem layer against real files in temp dirs. Hostile inputs are
//! planted with real syscalls (symlink, mkfifo, link, chmod, chown). The chown cases need root;
//! without it they follow the integration tests' rule (tests/common/skip.rs): a visible
//! `SKIPPED:` line, or a failure under `TENURE_REQUIRE_SERVERS=1`, which `.ci/run` sets.

use super::*;
use std::collections::BTreeMap;
use std::os::unix::fs::{MetadataExt, PermissionsExt};

/// A snapshot of a tree: for each path, its kind, mode, uid and content (or link target).
fn snapshot(root: &Path) -> BTreeMap<PathBuf, (u32, u32, u64, Vec<u8>)> {
    let mut out = BTreeMap::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(p) = stack.pop() {
        let md = std::fs::symlink_metadata(&p).unwrap();
        let content = if md.file_type().is_symlink() {
            std::fs::read_link(&p).unwrap().into_os_string().into_vec()
        } else if md.is_file() {
            std::fs::read(&p).unwrap()
        } else {
            Vec::new()
        };
        if md.is_dir() {
            for e in std::fs::read_dir(&p).unwrap() {
                stack.push(e.unwrap().path());
            }
        }
        out.insert(p, (md.mode(), md.uid(), md.nlink(), content));
    }
    out
}

use std::os::unix::ffi::OsStringExt;

fn private_tempdir() -> tempfile::TempDir {
    let t = tempfile::tempdir().unwrap();
    std::fs::set_permissions(t.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
    t
}

fn write_private(path: &Path, bytes: &[u8]) {
    std::fs::write(path, bytes).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).unwrap();
}

// One rule for tests that need what the machine may lack, shared with the integration tests.
#[path = "../../tests/common/skip.rs"]
mod skip;

fn chown(path: &Path, uid: u32) {
    std::os::unix::fs::lchown(path, Some(uid), None).unwrap();
}

/// Opens the state dir and a private record in it, asserting the error and an unchanged tree.
fn assert_refused_file(t: &Path, name: &str, check: impl Fn(&FsError) -> bool) {
    let before = snapshot(t);
    let sd = StateDir::open(t, false).unwrap();
    let err = sd.root().open_file(name).unwrap_err();
    assert!(check(&err), "unexpected error: {err}");
    assert!(
        err.to_string().contains(name),
        "message names the path: {err}"
    );
    assert!(matches!(sd.root().read_optional(name, 1024), Err(ref e) if check(e)));
    drop(sd);
    assert_eq!(before, snapshot(t), "the tree was changed by a refusal");
}

#[test]
fn creates_missing_parents_private() {
    let t = private_tempdir();
    let dir = t.path().join("a/b/state");
    let sd = StateDir::open(&dir, true).unwrap();
    for p in [t.path().join("a"), t.path().join("a/b"), dir.clone()] {
        let md = std::fs::symlink_metadata(&p).unwrap();
        assert_eq!(md.mode() & 0o7777, 0o700, "{}", p.display());
    }
    assert_eq!(sd.path(), std::fs::canonicalize(&dir).unwrap());
    assert!(sd.is_still_at_path().unwrap());
}

#[test]
fn open_without_create_reports_missing() {
    let t = private_tempdir();
    let err = StateDir::open(&t.path().join("nope"), false).unwrap_err();
    assert!(matches!(err, FsError::NotFound { .. }), "{err}");
    assert!(!t.path().join("nope").exists());
}

#[test]
fn symlinked_state_dir_refused() {
    let t = private_tempdir();
    std::fs::create_dir(t.path().join("real")).unwrap();
    std::fs::set_permissions(
        t.path().join("real"),
        std::fs::Permissions::from_mode(0o700),
    )
    .unwrap();
    std::os::unix::fs::symlink("real", t.path().join("link")).unwrap();
    let before = snapshot(t.path());
    let err = StateDir::open(&t.path().join("link"), true).unwrap_err();
    assert!(matches!(err, FsError::Symlink { .. }), "{err}");
    assert!(err.to_string().contains("link"));
    assert_eq!(before, snapshot(t.path()));
}

#[test]
fn permissive_state_dir_refused() {
    let t = private_tempdir();
    let d = t.path().join("s");
    std::fs::create_dir(&d).unwrap();
    std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o755)).unwrap();
    let before = snapshot(t.path());
    let err = StateDir::open(&d, true).unwrap_err();
    assert!(
        matches!(err, FsError::Permissive { mode: 0o755, .. }),
        "{err}"
    );
    assert!(err.to_string().contains("permissive"));
    assert_eq!(before, snapshot(t.path()));
}

#[test]
fn foreign_state_dir_refused() {
    if !skip::have_root("privfs foreign_state_dir_refused") {
        return;
    }
    let t = private_tempdir();
    let d = t.path().join("s");
    std::fs::create_dir(&d).unwrap();
    std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o700)).unwrap();
    chown(&d, 4242);
    let before = snapshot(t.path());
    let err = StateDir::open(&d, false).unwrap_err();
    assert!(matches!(err, FsError::NotOwned { uid: 4242, .. }), "{err}");
    assert!(err.to_string().contains("not owned"));
    assert_eq!(before, snapshot(t.path()));
}

#[test]
fn state_dir_that_is_a_file_refused() {
    let t = private_tempdir();
    write_private(&t.path().join("f"), b"x");
    let err = StateDir::open(&t.path().join("f"), true).unwrap_err();
    assert!(
        matches!(
            err,
            FsError::NotDirectory {
                found: FileKind::Regular,
                ..
            }
        ),
        "{err}"
    );
}

#[test]
fn symlinked_record_refused() {
    let t = private_tempdir();
    write_private(&t.path().join("target"), b"{}");
    std::os::unix::fs::symlink("target", t.path().join("owner.json")).unwrap();
    assert_refused_file(t.path(), "owner.json", |e| {
        matches!(e, FsError::Symlink { .. })
    });
}

#[test]
fn fifo_record_refused_without_blocking() {
    let t = private_tempdir();
    rustix::fs::mkfifoat(
        rustix::fs::CWD,
        t.path().join("owner.json"),
        Mode::from_raw_mode(0o600),
    )
    .unwrap();
    assert_refused_file(t.path(), "owner.json", |e| {
        matches!(
            e,
            FsError::NotRegular {
                found: FileKind::Fifo,
                ..
            }
        ) && e.to_string().contains("not a regular file")
    });
}

#[test]
fn hard_linked_record_refused() {
    let t = private_tempdir();
    write_private(&t.path().join("owner.json"), b"{}");
    std::fs::hard_link(t.path().join("owner.json"), t.path().join("other")).unwrap();
    assert_refused_file(t.path(), "owner.json", |e| {
        matches!(e, FsError::HardLinked { nlink: 2, .. }) && e.to_string().contains("hard-linked")
    });
    // A blob that is hard-linked into a view on purpose is accepted when the caller says so.
    let sd = StateDir::open(t.path(), false).unwrap();
    sd.root().open_file_with("owner.json", Links::Any).unwrap();
}

#[test]
fn world_readable_record_refused() {
    let t = private_tempdir();
    write_private(&t.path().join("owner.json"), b"{}");
    std::fs::set_permissions(
        t.path().join("owner.json"),
        std::fs::Permissions::from_mode(0o644),
    )
    .unwrap();
    assert_refused_file(t.path(), "owner.json", |e| {
        matches!(e, FsError::Permissive { mode: 0o644, .. }) && e.to_string().contains("permissive")
    });
}

#[test]
fn foreign_record_refused() {
    if !skip::have_root("privfs foreign_record_refused") {
        return;
    }
    let t = private_tempdir();
    write_private(&t.path().join("owner.json"), b"{}");
    chown(&t.path().join("owner.json"), 4242);
    assert_refused_file(t.path(), "owner.json", |e| {
        matches!(e, FsError::NotOwned { uid: 4242, .. }) && e.to_string().contains("not owned")
    });
}

#[test]
fn permissive_subdir_refused() {
    let t = private_tempdir();
    std::fs::create_dir(t.path().join(".tenure")).unwrap();
    std::fs::set_permissions(
        t.path().join(".tenure"),
        std::fs::Permissions::from_mode(0o755),
    )
    .unwrap();
    let before = snapshot(t.path());
    let sd = StateDir::open(t.path(), false).unwrap();
    let err = sd.root().open_dir(".tenure").unwrap_err();
    assert!(
        matches!(err, FsError::Permissive { mode: 0o755, .. }),
        "{err}"
    );
    let err = sd.root().ensure_dir(".tenure", "t").unwrap_err();
    assert!(matches!(err, FsError::Permissive { .. }), "{err}");
    assert_eq!(before, snapshot(t.path()));
}

#[test]
fn symlinked_subdir_refused() {
    let t = private_tempdir();
    let elsewhere = private_tempdir();
    std::os::unix::fs::symlink(elsewhere.path(), t.path().join(".tenure")).unwrap();
    let before = snapshot(t.path());
    let sd = StateDir::open(t.path(), false).unwrap();
    let err = sd.root().ensure_dir(".tenure", "t").unwrap_err();
    assert!(matches!(err, FsError::Symlink { .. }), "{err}");
    assert_eq!(before, snapshot(t.path()));
    assert_eq!(std::fs::read_dir(elsewhere.path()).unwrap().count(), 0);
}

#[test]
fn file_where_a_dir_belongs_refused() {
    let t = private_tempdir();
    write_private(&t.path().join(".tenure"), b"");
    let sd = StateDir::open(t.path(), false).unwrap();
    let err = sd.root().ensure_dir(".tenure", "t").unwrap_err();
    assert!(
        matches!(
            err,
            FsError::NotDirectory {
                found: FileKind::Regular,
                ..
            }
        ),
        "{err}"
    );
}

#[test]
fn bad_names_refused() {
    let t = private_tempdir();
    let sd = StateDir::open(t.path(), false).unwrap();
    for name in ["", ".", "..", "a/b", "../x", "a\0b"] {
        let err = sd.root().replace_durable(name, b"x", "t").unwrap_err();
        assert!(matches!(err, FsError::BadName { .. }), "{name:?}: {err}");
    }
    assert_eq!(std::fs::read_dir(t.path()).unwrap().count(), 0);
}

#[test]
fn replace_durable_writes_private_file_and_leaves_no_temp() {
    let t = private_tempdir();
    let sd = StateDir::open(t.path(), false).unwrap();
    let d = sd.root().ensure_dir(".tenure", "t").unwrap();
    d.replace_durable("epoch", b"1\n", "t").unwrap();
    d.replace_durable("epoch", b"2\n", "t").unwrap();
    assert_eq!(d.read("epoch", 64).unwrap(), b"2\n");
    let md = std::fs::symlink_metadata(t.path().join(".tenure/epoch")).unwrap();
    assert_eq!(md.mode() & 0o7777, 0o600);
    assert_eq!(md.nlink(), 1);
    let names: Vec<_> = d.entries().unwrap().into_iter().map(|e| e.name).collect();
    assert_eq!(names, vec![OsString::from("epoch")]);
    let md = std::fs::symlink_metadata(t.path().join(".tenure")).unwrap();
    assert_eq!(md.mode() & 0o7777, 0o700);
}

#[test]
fn too_large_record_refused() {
    let t = private_tempdir();
    write_private(&t.path().join("big"), &[b'x'; 100]);
    let sd = StateDir::open(t.path(), false).unwrap();
    let err = sd.root().read("big", 10).unwrap_err();
    assert!(
        matches!(
            err,
            FsError::TooLarge {
                len: 100,
                max: 10,
                ..
            }
        ),
        "{err}"
    );
    assert_eq!(sd.root().read("big", 100).unwrap().len(), 100);
}

#[test]
fn temp_file_dropped_before_rename_is_removed() {
    let t = private_tempdir();
    let sd = StateDir::open(t.path(), false).unwrap();
    {
        let mut tmp = sd.root().create_temp("t").unwrap();
        tmp.write_all(b"abc").unwrap();
        assert!(t.path().join(tmp.name()).exists());
        let md = std::fs::symlink_metadata(tmp.path()).unwrap();
        assert_eq!(md.mode() & 0o7777, 0o600);
    }
    {
        let tmp = sd.root().create_temp("t").unwrap();
        let synced = tmp.sync().unwrap();
        assert!(t.path().join(synced.name()).exists());
    }
    assert_eq!(std::fs::read_dir(t.path()).unwrap().count(), 0);
}

#[test]
fn rename_noreplace_keeps_existing() {
    let t = private_tempdir();
    let sd = StateDir::open(t.path(), false).unwrap();
    sd.root().replace_durable("marker", b"first", "t").unwrap();
    let mut tmp = sd.root().create_temp("t").unwrap();
    tmp.write_all(b"second").unwrap();
    let err = tmp.sync().unwrap().rename_into_new("marker").unwrap_err();
    assert!(matches!(err, FsError::AlreadyExists { .. }), "{err}");
    assert_eq!(sd.root().read("marker", 64).unwrap(), b"first");
    assert_eq!(std::fs::read_dir(t.path()).unwrap().count(), 1);
}

#[test]
fn link_rename_unlink_and_temp_sweep() {
    let t = private_tempdir();
    let sd = StateDir::open(t.path(), false).unwrap();
    let blobs = sd.root().ensure_dir("blobs", "t").unwrap();
    let view = sd.root().ensure_dir("view", "t").unwrap();
    blobs.replace_durable("abc", b"content", "t").unwrap();
    blobs.link_to("abc", &view, "file.txt", "t").unwrap();
    view.sync("t").unwrap();
    assert!(matches!(
        blobs.open_file("abc"),
        Err(FsError::HardLinked { nlink: 2, .. })
    ));
    let mut f = view.open_file_with("file.txt", Links::Any).unwrap();
    let mut s = String::new();
    f.read_to_string(&mut s).unwrap();
    assert_eq!(s, "content");
    let err = blobs.link_to("abc", &view, "file.txt", "t").unwrap_err();
    assert!(matches!(err, FsError::AlreadyExists { .. }), "{err}");
    view.unlink("file.txt", "t").unwrap();
    blobs.rename("abc", "def", "t").unwrap();
    assert!(blobs.open_file("def").is_ok());
    let err = blobs.unlink("abc", "t").unwrap_err();
    assert!(matches!(err, FsError::NotFound { .. }), "{err}");

    // Plant two leftovers of a crash and one unrelated file; only the leftovers go.
    write_private(&t.path().join("blobs/.tmp-0011223344556677"), b"partial");
    write_private(&t.path().join("blobs/.tmp-8899aabbccddeeff"), b"");
    assert_eq!(blobs.remove_temp_files("t").unwrap(), 2);
    let names: Vec<_> = blobs
        .entries()
        .unwrap()
        .into_iter()
        .map(|e| e.name)
        .collect();
    assert_eq!(names, vec![OsString::from("def")]);
    sd.root().remove_dir("view", "t").unwrap();
    let kinds: Vec<_> = sd
        .root()
        .entries()
        .unwrap()
        .into_iter()
        .map(|e| (e.name, e.kind))
        .collect();
    assert_eq!(kinds, vec![(OsString::from("blobs"), FileKind::Directory)]);
}

#[test]
fn h7_moved_root_is_noticed() {
    let t = private_tempdir();
    let d = t.path().join("s");
    let sd = StateDir::open(&d, true).unwrap();
    assert!(sd.is_still_at_path().unwrap());
    std::fs::rename(&d, t.path().join("moved")).unwrap();
    assert!(!sd.is_still_at_path().unwrap());
    // A replacement dir at the old path is a different inode: still not ours.
    std::fs::create_dir(&d).unwrap();
    assert!(!sd.is_still_at_path().unwrap());
}

#[test]
fn random_bytes_differ() {
    let mut a = [0u8; 16];
    let mut b = [0u8; 16];
    random_bytes(&mut a).unwrap();
    random_bytes(&mut b).unwrap();
    assert_ne!(a, b);
}

#[cfg(feature = "failpoints")]
mod with_failpoints {
    use super::*;

    /// Issue 14: on a filesystem that refuses `RENAME_NOREPLACE` with `EINVAL` (NFS, many
    /// FUSE filesystems; forced here by the `rename.noreplace=einval` crash point) a no-replace
    /// rename still works, and still refuses to replace: a hard link (or, where links are
    /// refused too, an exclusive copy) then an unlink; a directory after a check.
    #[test]
    fn noreplace_rename_falls_back_when_the_flag_is_refused() {
        for spec in [
            "rename.noreplace=einval",
            "rename.noreplace=einval,rename.noreplace.link=einval",
        ] {
            let t = private_tempdir();
            let sd = StateDir::open(t.path(), false).unwrap();
            let armed = crate::failpoint::scoped(spec);
            let mut tmp = sd.root().create_temp("t").unwrap();
            tmp.write_all(b"first").unwrap();
            tmp.sync().unwrap().rename_into_new("marker").unwrap();
            let mut tmp = sd.root().create_temp("t").unwrap();
            tmp.write_all(b"second").unwrap();
            let err = tmp.sync().unwrap().rename_into_new("marker").unwrap_err();
            assert!(
                matches!(err, FsError::AlreadyExists { .. }),
                "{spec}: {err}"
            );
            // Directories: renamed when the name is free, refused when it is taken.
            let a = sd.root().ensure_dir("a", "t").unwrap();
            drop(a);
            let b = sd.root().ensure_dir("b", "t").unwrap();
            drop(b);
            let err = sd
                .root()
                .rename_to("a", sd.root(), "b", "t", true)
                .unwrap_err();
            assert!(
                matches!(err, FsError::AlreadyExists { .. }),
                "{spec}: {err}"
            );
            sd.root().rename_to("a", sd.root(), "c", "t", true).unwrap();
            drop(armed);
            assert_eq!(sd.root().read("marker", 64).unwrap(), b"first", "{spec}");
            let mut names: Vec<String> = std::fs::read_dir(t.path())
                .unwrap()
                .map(|e| e.unwrap().file_name().into_string().unwrap())
                .collect();
            names.sort();
            assert_eq!(names, ["b", "c", "marker"], "{spec}: no temp file is left");
            let mode = std::fs::metadata(t.path().join("marker"))
                .unwrap()
                .permissions()
                .mode();
            assert_eq!(mode & 0o777, 0o600, "{spec}: the copy keeps the mode");
        }
    }

    #[test]
    fn fsync_error_abandons_temp_and_keeps_old_content() {
        let t = private_tempdir();
        let sd = StateDir::open(t.path(), false).unwrap();
        sd.root()
            .replace_durable("rec", b"old", "privfs-test-eio")
            .unwrap();
        // The label is unique to this test, so the armed fault cannot hit other tests, and the
        // scope keeps other tests from replacing it meanwhile.
        let armed = crate::failpoint::scoped("privfs-test-eio2.fsync=eio");
        let res = sd.root().replace_durable("rec", b"new", "privfs-test-eio2");
        drop(armed);
        let err = res.unwrap_err();
        assert!(matches!(err, FsError::Fsync { .. }), "{err}");
        assert_eq!(sd.root().read("rec", 64).unwrap(), b"old");
        assert_eq!(
            std::fs::read_dir(t.path()).unwrap().count(),
            1,
            "the temp file was abandoned"
        );
    }

    #[test]
    fn dir_fsync_error_poisons_the_dir() {
        let t = private_tempdir();
        let sd = StateDir::open(t.path(), false).unwrap();
        let d = sd.root().ensure_dir("d", "privfs-test-poison").unwrap();
        let armed = crate::failpoint::scoped("privfs-test-poison2.dirfsync=eio");
        let res = d.sync("privfs-test-poison2");
        drop(armed);
        assert!(matches!(res, Err(FsError::Fsync { .. })));
        assert!(matches!(
            d.sync("privfs-test-poison"),
            Err(FsError::Poisoned { .. })
        ));
    }

    #[test]
    fn recorder_sees_the_durable_replace_order() {
        let t = private_tempdir();
        let sd = StateDir::open(t.path(), false).unwrap();
        start_recording();
        sd.root().replace_durable("rec", b"x", "t").unwrap();
        let ops = take_recording_under(sd.path());
        let kinds: Vec<_> = ops.iter().map(|o| o.kind).collect();
        assert_eq!(
            kinds,
            vec![
                OpKind::Create,
                OpKind::Write,
                OpKind::Fsync,
                OpKind::Rename,
                OpKind::DirFsync
            ]
        );
        assert_eq!(ops[3].name, "rec");
        assert!(
            ops[3]
                .from
                .as_ref()
                .unwrap()
                .file_name()
                .unwrap()
                .to_string_lossy()
                .starts_with(TEMP_PREFIX)
        );
        assert!(ops.iter().all(|o| o.dir == sd.path()));
    }
}

/// Regression (found by the lease stress test): a reader racing a writer's durable replace may
/// look at or open the old inode after its last link is gone; that is not a hard-linked file.
#[test]
fn reads_race_durable_replace_without_spurious_refusals() {
    let t = private_tempdir();
    let sd = StateDir::open(t.path(), false).unwrap();
    sd.root().replace_durable("rec", b"0", "t").unwrap();
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    let stop = std::sync::Arc::new(AtomicBool::new(false));
    let replaced = std::sync::Arc::new(AtomicU64::new(0));
    let writer = {
        let sd = sd.try_clone().unwrap();
        let (stop, replaced) = (stop.clone(), replaced.clone());
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                let n = replaced.load(Ordering::Relaxed) + 1;
                sd.root()
                    .replace_volatile("rec", n.to_string().as_bytes(), "t")
                    .unwrap();
                replaced.store(n, Ordering::Relaxed);
            }
        })
    };
    // Read until both many reads and many replaces happened, so the race really was run.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let mut reads = 0u64;
    while reads < 5000 || replaced.load(Ordering::Relaxed) < 2000 {
        assert!(
            std::time::Instant::now() < deadline,
            "the writer never got going"
        );
        let bytes = sd.root().read("rec", 64).unwrap();
        assert!(!bytes.is_empty());
        reads += 1;
    }
    stop.store(true, Ordering::Relaxed);
    writer.join().unwrap();
}

/// A wide and nested scratch tree is removed whole with the second thread (started at the first
/// hoist in unit tests): 24 directories of 60 files, each with a 5-deep chain of read-only
/// directories holding a file, a symlink and a FIFO at the bottom. Nothing outside it is
/// touched.
#[test]
fn remove_tree_on_two_threads_removes_every_level() {
    let t = private_tempdir();
    let top = t.path().join("scratch");
    let outside = t.path().join("outside");
    std::fs::write(&outside, b"kept").unwrap();
    for d in 0..24 {
        let dir = top.join(format!("d{d:02}"));
        std::fs::create_dir_all(&dir).unwrap();
        for f in 0..60 {
            std::fs::write(dir.join(format!("f{f}")), b"x").unwrap();
        }
        let mut deep = dir.clone();
        for l in 0..5 {
            deep = deep.join(format!("l{l}"));
            std::fs::create_dir(&deep).unwrap();
        }
        std::fs::write(deep.join("file"), b"y").unwrap();
        std::os::unix::fs::symlink(&outside, deep.join("link")).unwrap();
        rustix::fs::mknodat(
            rustix::fs::CWD,
            deep.join("fifo").as_path(),
            rustix::fs::FileType::Fifo,
            Mode::from_raw_mode(0o600),
            0,
        )
        .unwrap();
        // Read-only from the bottom up, as a view is.
        let mut p = deep.clone();
        while p != dir {
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o500)).unwrap();
            p = p.parent().unwrap().to_path_buf();
        }
    }
    std::fs::write(top.join("loose"), b"z").unwrap();
    let sd = StateDir::open(t.path(), false).unwrap();
    sd.root().remove_tree("scratch", "t").unwrap();
    assert!(!top.exists());
    assert_eq!(std::fs::read(&outside).unwrap(), b"kept");
}

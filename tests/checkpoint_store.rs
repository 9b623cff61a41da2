//! Integration tests of the checkpoint store on real files in temp dirs, and a random
//! SIGKILL harness with real child processes. Cards: G3/G4 (a bad or interrupted checkpoint is
//! refused, never replaced), L1 (a run that changes nothing leaves CURRENT's bytes), H5 (stale
//! epochs are fenced), H6 (bad options rejected).

mod checkpoint_support;

use std::io::{BufRead, BufReader, Read};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::time::{Duration, Instant};

use checkpoint_support::*;
use tenure::checkpoint::{
    CheckpointError, CheckpointStore, Digest, PublishFile, Published, Source, StoreOptions,
};

fn write_staged(root: &Path, files: &[(String, Vec<u8>)]) {
    for (n, b) in files {
        let p = root.join(n);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, b).unwrap();
    }
}

/// Card G4: what a writer leaves in a staging area, nested directories included, is what the
/// next load returns, verified.
#[test]
fn g4_staged_files_round_trip_with_nested_names() {
    let fx = Fixture::new(1);
    let sd = fx.open();
    let store = CheckpointStore::open_owned(&sd, opts()).unwrap();
    let staging = store.staging().unwrap();
    assert!(staging.path().starts_with(fx.store_dir()));
    assert_eq!(std::fs::read_dir(staging.path()).unwrap().count(), 0);
    let files = vec![
        ("a.txt".to_string(), b"alpha".to_vec()),
        ("dir/sub/deep.bin".to_string(), vec![7u8; 100_000]),
        ("dir/z".to_string(), Vec::new()),
    ];
    write_staged(staging.path(), &files);
    std::fs::create_dir(staging.path().join("empty-dir")).unwrap();
    let published = store.publish(1, &staging).unwrap();
    let Published::New {
        checkpoint,
        bytes_written,
        ..
    } = published
    else {
        panic!("expected a new checkpoint, got {published:?}")
    };
    assert_eq!(bytes_written, 100_005);
    store.discard_staging(staging).unwrap();
    assert_eq!(
        std::fs::read_dir(fx.store_dir().join("staging"))
            .unwrap()
            .count(),
        0
    );

    let ro = CheckpointStore::open(&sd, opts()).unwrap();
    let loaded = ro.load().unwrap().expect("a checkpoint");
    assert_eq!(loaded.summary(), checkpoint);
    assert_eq!(loaded.epoch, 1);
    assert_eq!(loaded.parent, None);
    assert_eq!(
        contents(&ro, &loaded),
        files,
        "empty directories are not recorded"
    );
    let current = std::fs::read_to_string(fx.store_dir().join("CURRENT")).unwrap();
    assert_eq!(
        current,
        format!("{} {}\n", loaded.id, loaded.manifest_sha256)
    );
    // Every file of the store is private.
    for (p, (mode, _)) in snapshot(&fx.store_dir()) {
        assert_eq!(mode & 0o077, 0, "{} is not private", p.display());
    }
}

/// Card L1: an empty staging area, or one holding exactly the current files, leaves CURRENT's
/// bytes (and everything else) unchanged.
#[test]
fn l1_nothing_to_publish_leaves_current_untouched() {
    let fx = Fixture::new(3);
    let sd = fx.open();
    let store = CheckpointStore::open_owned(&sd, opts()).unwrap();
    let empty = store.staging().unwrap();
    assert_eq!(
        store.publish(3, &empty).unwrap(),
        Published::Unchanged { current: None }
    );
    assert!(!fx.store_dir().join("CURRENT").exists());
    store.discard_staging(empty).unwrap();

    publish_gen(&store, 3, 1);
    let before = snapshot(&fx.state);
    let cp = store.load().unwrap().unwrap();
    let empty = store.staging().unwrap();
    assert_eq!(
        store.publish(3, &empty).unwrap(),
        Published::Unchanged {
            current: Some(cp.id)
        }
    );
    let same = store.staging().unwrap();
    write_staged(same.path(), &generation(1));
    for (n, _) in generation(1) {
        std::fs::set_permissions(same.path().join(n), std::fs::Permissions::from_mode(0o600))
            .unwrap();
    }
    assert_eq!(
        store.publish(3, &same).unwrap(),
        Published::Unchanged {
            current: Some(cp.id)
        }
    );
    store.discard_staging(empty).unwrap();
    store.discard_staging(same).unwrap();
    let mut after = snapshot(&fx.state);
    // The staging parent directory is scratch and may now exist; nothing else may differ.
    after.retain(|p, _| !p.starts_with("checkpoints/staging"));
    let mut before = before;
    before.retain(|p, _| !p.starts_with("checkpoints/staging"));
    assert_eq!(before, after);
}

/// Card H5: a publish naming an older epoch than the persisted one is refused and changes no
/// byte; so is one naming an epoch that was never granted.
#[test]
fn h5_stale_epoch_is_refused_without_effect() {
    let fx = Fixture::new(1);
    let sd = fx.open();
    let store = CheckpointStore::open_owned(&sd, opts()).unwrap();
    publish_gen(&store, 1, 1);
    set_epoch(&sd, 2); // a newer owner took over
    let staging = store.staging().unwrap();
    write_staged(staging.path(), &generation(2));
    let before = snapshot(&fx.state);
    let err = store.publish(1, &staging).unwrap_err();
    assert!(
        matches!(
            err,
            CheckpointError::StaleEpoch {
                epoch: 1,
                persisted: 2,
                ..
            }
        ),
        "{err}"
    );
    assert!(err.to_string().contains("refused"), "{err}");
    let err = store.publish(3, &staging).unwrap_err();
    assert!(
        matches!(err, CheckpointError::UnknownEpoch { epoch: 3, .. }),
        "{err}"
    );
    let files: Vec<PublishFile> = vec![PublishFile {
        name: "x".into(),
        mode: 0o600,
        source: Source::Reader(Box::new(&b"x"[..])),
    }];
    assert!(matches!(
        store.publish_files(1, files),
        Err(CheckpointError::StaleEpoch { .. })
    ));
    assert_eq!(before, snapshot(&fx.state));
    assert_eq!(
        generation_of(&store, &store.load().unwrap().unwrap()),
        1,
        "the old checkpoint is still current"
    );
    // The current owner publishes fine.
    assert!(matches!(
        store.publish(2, &staging).unwrap(),
        Published::New { .. }
    ));
}

/// Card H6: options that make no sense are rejected before anything on disk changes.
#[test]
fn h6_keep_zero_is_rejected() {
    let fx = Fixture::new(1);
    let sd = fx.open();
    let before = snapshot(&fx.state);
    let err = CheckpointStore::open_owned(&sd, StoreOptions { keep: 0 }).unwrap_err();
    assert!(matches!(err, CheckpointError::InvalidOptions(_)), "{err}");
    assert_eq!(before, snapshot(&fx.state));
}

/// A read-only open creates nothing, and refuses to publish.
#[test]
fn read_only_open_never_writes() {
    let fx = Fixture::new(1);
    let sd = fx.open();
    let before = snapshot(&fx.state);
    let ro = CheckpointStore::open(&sd, opts()).unwrap();
    assert_eq!(ro.load().unwrap(), None);
    assert!(matches!(
        ro.staging(),
        Err(CheckpointError::ReadOnly { .. })
    ));
    assert!(matches!(
        ro.publish_files(1, Vec::new()),
        Err(CheckpointError::ReadOnly { .. })
    ));
    let report = ro.report().unwrap();
    assert!(matches!(report.current, Ok(None)));
    assert!(report.newest_valid_older.is_none());
    assert_eq!(before, snapshot(&fx.state));
}

/// Dedup: a blob that already exists is not rewritten (same inode, same mtime), and only new
/// bytes are counted as written.
#[test]
fn existing_blobs_are_not_rewritten() {
    let fx = Fixture::new(1);
    let sd = fx.open();
    let store = CheckpointStore::open_owned(&sd, opts()).unwrap();
    publish_gen(&store, 1, 1);
    let cp1 = store.load().unwrap().unwrap();
    let stat_blob = |d: &Digest| {
        let md = std::fs::metadata(fx.store_dir().join("blobs/sha256").join(d.to_hex())).unwrap();
        (md.ino(), md.mtime_nsec(), md.mode() & 0o777)
    };
    let static_digest = cp1.entry("static.txt").unwrap().sha256;
    let before = stat_blob(&static_digest);
    assert_eq!(before.2, 0o400, "blobs are read-only");
    let Published::New { bytes_written, .. } = publish_gen(&store, 1, 2) else {
        panic!("generation 2 differs")
    };
    let g2: u64 = generation(2)
        .iter()
        .filter(|(n, _)| n != "static.txt")
        .map(|(_, b)| b.len() as u64)
        .sum();
    assert_eq!(bytes_written, g2);
    assert_eq!(stat_blob(&static_digest), before);
}

/// Dedup never trusts an orphan blob it did not verify: a blob left by a crashed publish (not
/// named by the current checkpoint) and corrupted since is read before reuse, and the publish is
/// refused naming it instead of referencing it — found by the checkpoint model (invariant I12).
#[test]
fn corrupted_orphan_blob_is_refused_not_reused() {
    let fx = Fixture::new(1);
    let sd = fx.open();
    let store = CheckpointStore::open_owned(&sd, opts()).unwrap();
    publish_gen(&store, 1, 1);
    let current_before = std::fs::read(fx.store_dir().join("CURRENT")).unwrap();
    // The orphan: the blob of "fresh bytes" as a crashed publish would have left it, then one
    // byte changed (same size, so only its content can tell).
    let wanted = b"fresh bytes".to_vec();
    let orphan = fx.store_dir().join("blobs/sha256").join(sha(&wanted));
    let mut rotten = wanted.clone();
    rotten[0] ^= 0x20;
    std::fs::write(&orphan, &rotten).unwrap();
    std::fs::set_permissions(&orphan, std::fs::Permissions::from_mode(0o400)).unwrap();
    let tree_before = snapshot(&fx.state);
    let files = vec![PublishFile {
        name: "fresh.txt".into(),
        mode: 0o600,
        source: Source::Reader(Box::new(std::io::Cursor::new(wanted))),
    }];
    match store.publish_files(1, files) {
        Err(CheckpointError::BlobDigestMismatch { path, .. }) => assert_eq!(path, orphan),
        other => panic!("a corrupted orphan must be refused, got {other:?}"),
    }
    assert_eq!(
        std::fs::read(fx.store_dir().join("CURRENT")).unwrap(),
        current_before
    );
    assert_eq!(std::fs::read(&orphan).unwrap(), rotten, "never repaired");
    let mut after = snapshot(&fx.state);
    after.retain(|p, _| !p.to_string_lossy().contains(".tmp-"));
    let mut before = tree_before;
    before.retain(|p, _| !p.to_string_lossy().contains(".tmp-"));
    assert_eq!(before, after, "the refused publish changed the tree");
    assert_eq!(generation_of(&store, &store.load().unwrap().unwrap()), 1);
}

/// `Source::Blob` carries an unchanged file over without reading it; a missing blob is refused.
#[test]
fn carried_blobs_are_checked_not_copied() {
    let fx = Fixture::new(1);
    let sd = fx.open();
    let store = CheckpointStore::open_owned(&sd, opts()).unwrap();
    publish_gen(&store, 1, 1);
    let cp = store.load().unwrap().unwrap();
    let payload = cp.entry("data/payload.bin").unwrap().clone();
    let files = vec![
        PublishFile {
            name: "data/payload.bin".into(),
            mode: payload.mode,
            source: Source::Blob {
                sha256: payload.sha256,
                size: payload.size,
            },
        },
        PublishFile {
            name: "counter".into(),
            mode: 0o600,
            source: Source::Reader(Box::new(&b"2\n"[..])),
        },
    ];
    let Published::New {
        checkpoint,
        bytes_written,
        ..
    } = store.publish_files(1, files).unwrap()
    else {
        panic!("new checkpoint expected")
    };
    assert_eq!(bytes_written, 2);
    let loaded = store.load().unwrap().unwrap();
    assert_eq!(loaded.entry("data/payload.bin"), Some(&payload));
    assert_eq!(loaded.summary(), checkpoint);
    let bogus = vec![PublishFile {
        name: "x".into(),
        mode: 0o600,
        source: Source::Blob {
            sha256: Digest([9; 32]),
            size: 1,
        },
    }];
    let before = snapshot(&fx.state);
    assert!(matches!(
        store.publish_files(1, bogus),
        Err(CheckpointError::CarryMissing { .. })
    ));
    // A refused publish leaves the tree as it was, temp files included (none).
    assert_eq!(before, snapshot(&fx.state));
}

/// GC keeps the last K checkpoints (default 2) and exactly the blobs they reference.
#[test]
fn gc_keeps_the_last_k_checkpoints() {
    for keep in [1usize, 2, 3] {
        let fx = Fixture::new(1);
        let sd = fx.open();
        let store = CheckpointStore::open_owned(&sd, StoreOptions { keep }).unwrap();
        for g in 1..=5 {
            let Published::New { gc, .. } = publish_gen(&store, 1, g) else {
                panic!("each generation differs")
            };
            assert_eq!(gc.error, None);
            assert_eq!(gc.kept.len(), keep.min(g as usize));
        }
        let manifests: Vec<String> = std::fs::read_dir(fx.store_dir().join("manifests"))
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        assert_eq!(manifests.len(), keep, "keep={keep}: {manifests:?}");
        // Blobs on disk = union of what the kept manifests reference.
        let mut want = std::collections::BTreeSet::new();
        for g in (5 - keep as u64 + 1)..=5 {
            for (_, b) in generation(g) {
                want.insert(sha(&b));
            }
        }
        let have: std::collections::BTreeSet<String> =
            std::fs::read_dir(fx.store_dir().join("blobs/sha256"))
                .unwrap()
                .map(|e| e.unwrap().file_name().into_string().unwrap())
                .collect();
        assert_eq!(have, want, "keep={keep}");
        assert_eq!(generation_of(&store, &store.load().unwrap().unwrap()), 5);
    }
}

/// Leftover temp files of the store directory and scratch are removed by the next owned open
/// and by nothing else; a manifest temp waits for the next publish's GC (issue 11: the run path
/// does not list the manifests); files the store did not make are left alone.
#[test]
fn owned_open_sweeps_only_temp_files_and_scratch() {
    let fx = Fixture::new(1);
    let sd = fx.open();
    {
        let store = CheckpointStore::open_owned(&sd, opts()).unwrap();
        publish_gen(&store, 1, 1);
        let staging = store.staging().unwrap();
        std::fs::write(staging.path().join("half-written"), b"x").unwrap();
        let cp = store.load().unwrap().unwrap();
        store.materialise(&cp).unwrap();
        // Both left behind, as by a crashed runner.
    }
    let d = fx.store_dir();
    // A crashed publish leaves its blobs' temp files in `incoming/` (issue 11).
    std::fs::create_dir(d.join("incoming")).unwrap();
    std::fs::set_permissions(d.join("incoming"), std::fs::Permissions::from_mode(0o700)).unwrap();
    for p in [
        d.join(".tmp-00112233"),
        d.join("manifests/.tmp-aa"),
        d.join("incoming/.tmp-bb"),
    ] {
        std::fs::write(&p, b"partial").unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).unwrap();
    }
    std::fs::write(d.join("notes.txt"), b"mine").unwrap();
    std::fs::set_permissions(d.join("notes.txt"), std::fs::Permissions::from_mode(0o600)).unwrap();
    let before = snapshot(&d);

    // A read-only open sees the same checkpoint and removes nothing.
    let ro = CheckpointStore::open(&sd, opts()).unwrap();
    assert_eq!(generation_of(&ro, &ro.load().unwrap().unwrap()), 1);
    assert_eq!(before, snapshot(&d));

    let store = CheckpointStore::open_owned(&sd, opts()).unwrap();
    assert_eq!(
        temp_files(&d),
        vec![std::path::PathBuf::from("manifests/.tmp-aa")],
        "only the manifest temp is left to the GC"
    );
    let after = snapshot(&d);
    let mut expected = before.clone();
    expected.retain(|p, _| {
        let n = p.file_name().map_or("", |n| n.to_str().unwrap());
        let temp = n.starts_with(".tmp-") && !p.starts_with("manifests");
        let scratch =
            (p.starts_with("staging") || p.starts_with("views")) && p.components().count() > 1;
        !temp && !scratch && !p.starts_with("incoming")
    });
    // Directory mtimes are not part of the snapshot, so only the removed entries differ.
    assert_eq!(after, expected);
    assert_eq!(std::fs::read(d.join("notes.txt")).unwrap(), b"mine");
    // The next publish's GC, which lists the manifests anyway, removes the manifest temp.
    publish_gen(&store, 1, 2);
    assert!(temp_files(&d).is_empty(), "{:?}", temp_files(&d));
    assert_eq!(std::fs::read(d.join("notes.txt")).unwrap(), b"mine");
}

/// A temp file an earlier version's crashed publish left among the blobs is removed by the next
/// GC, which lists that directory anyway; the owned open does not list the blobs (issue 11:
/// nothing on the run path is O(the store's size)).
#[test]
fn old_blob_temp_files_go_with_the_next_gc() {
    let fx = Fixture::new(1);
    let sd = fx.open();
    let store = CheckpointStore::open_owned(&sd, opts()).unwrap();
    publish_gen(&store, 1, 1);
    let temp = fx.store_dir().join("blobs/sha256/.tmp-bb");
    std::fs::write(&temp, b"partial").unwrap();
    std::fs::set_permissions(&temp, std::fs::Permissions::from_mode(0o600)).unwrap();
    let store = CheckpointStore::open_owned(&sd, opts()).unwrap();
    assert!(temp.exists(), "the owned open does not list the blobs");
    publish_gen(&store, 1, 2);
    assert!(!temp.exists(), "the GC removed it");
    assert_eq!(generation_of(&store, &store.load().unwrap().unwrap()), 2);
}

/// Views are verified copies, read-only, never sharing an inode with a blob: a reader that
/// makes its copy writable and writes to it cannot change the checkpoint.
#[test]
fn view_is_a_read_only_copy_that_cannot_reach_blobs() {
    let fx = Fixture::new(1);
    let sd = fx.open();
    let store = CheckpointStore::open_owned(&sd, opts()).unwrap();
    publish_gen(&store, 1, 1);
    let cp = store.load().unwrap().unwrap();
    let view = store.materialise(&cp).unwrap();
    for (name, bytes) in generation(1) {
        let p = view.path().join(&name);
        assert_eq!(std::fs::read(&p).unwrap(), bytes);
        let md = std::fs::metadata(&p).unwrap();
        assert_eq!(md.mode() & 0o777, 0o400, "{name}");
        assert_eq!(md.nlink(), 1, "{name} is not a hard link");
        let blob = fx
            .store_dir()
            .join("blobs/sha256")
            .join(cp.entry(&name).unwrap().sha256.to_hex());
        assert_ne!(md.ino(), std::fs::metadata(blob).unwrap().ino());
    }
    assert_eq!(
        std::fs::metadata(view.path().join("data")).unwrap().mode() & 0o777,
        0o500
    );
    assert_eq!(
        std::fs::metadata(view.path()).unwrap().mode() & 0o777,
        0o500
    );
    // The reader runs as our uid, so it can chmod and write: its copy changes, the blob does not.
    let victim = view.path().join("static.txt");
    std::fs::set_permissions(&victim, std::fs::Permissions::from_mode(0o600)).unwrap();
    std::fs::write(&victim, b"tampered").unwrap();
    assert_eq!(generation_of(&store, &store.load().unwrap().unwrap()), 1);
    store.remove_view(view).unwrap();
    assert_eq!(
        std::fs::read_dir(fx.store_dir().join("views"))
            .unwrap()
            .count(),
        0
    );
}

/// A corrupt blob is caught while materialising, and the partial view is removed.
#[test]
fn materialise_refuses_a_corrupt_blob() {
    let fx = Fixture::new(1);
    let sd = fx.open();
    let store = CheckpointStore::open_owned(&sd, opts()).unwrap();
    publish_gen(&store, 1, 1);
    let cp = store.load().unwrap().unwrap();
    let e = cp.entry("data/payload.bin").unwrap();
    let blob = fx.store_dir().join("blobs/sha256").join(e.sha256.to_hex());
    let mut bytes = std::fs::read(&blob).unwrap();
    bytes[1000] ^= 1;
    overwrite(&blob, &bytes);
    let err = store.materialise(&cp).unwrap_err();
    assert!(
        matches!(err, CheckpointError::BlobDigestMismatch { .. }),
        "{err}"
    );
    assert_eq!(
        std::fs::read_dir(fx.store_dir().join("views"))
            .unwrap()
            .count(),
        0
    );
    // The verifying reader refuses it too.
    let mut r = store.open_entry(e).unwrap();
    let err = r.read_to_end(&mut Vec::new()).unwrap_err();
    assert!(err.to_string().contains("blob digest mismatch"), "{err}");
}

/// Symlinks and FIFOs in a staging area are refused by name, and nothing is published.
#[test]
fn staging_refuses_links_and_special_files() {
    let fx = Fixture::new(1);
    let sd = fx.open();
    let store = CheckpointStore::open_owned(&sd, opts()).unwrap();
    publish_gen(&store, 1, 1);
    let staging = store.staging().unwrap();
    std::fs::write(staging.path().join("ok"), b"fine").unwrap();
    std::os::unix::fs::symlink("/etc/passwd", staging.path().join("link")).unwrap();
    let before = snapshot(&fx.state);
    let err = store.publish(1, &staging).unwrap_err();
    assert!(
        matches!(
            err,
            CheckpointError::UnsupportedFile {
                kind: "symlink",
                ..
            }
        ),
        "{err}"
    );
    assert!(err.to_string().contains("link"), "{err}");
    std::fs::remove_file(staging.path().join("link")).unwrap();
    rustix::fs::mkfifoat(
        rustix::fs::CWD,
        staging.path().join("fifo"),
        rustix::fs::Mode::from_raw_mode(0o600),
    )
    .unwrap();
    let err = store.publish(1, &staging).unwrap_err();
    assert!(
        matches!(err, CheckpointError::UnsupportedFile { kind: "fifo", .. }),
        "{err}"
    );
    let mut after = snapshot(&fx.state);
    after.retain(|p, _| !p.starts_with("checkpoints/staging"));
    let mut before = before;
    before.retain(|p, _| !p.starts_with("checkpoints/staging"));
    assert_eq!(before, after);
    assert_eq!(generation_of(&store, &store.load().unwrap().unwrap()), 1);
}

/// Every named refusal: each names the bad file and what is wrong, and changes nothing.
#[test]
fn refusals_name_the_file_and_the_fault() {
    type Damage = fn(&Path, &tenure::checkpoint::Checkpoint);
    let cases: Vec<(&str, Damage)> = vec![
        ("CURRENT is empty", |d, _| {
            overwrite(&d.join("CURRENT"), b"")
        }),
        ("CURRENT is not newline-terminated", |d, _| {
            let b = std::fs::read(d.join("CURRENT")).unwrap();
            overwrite(&d.join("CURRENT"), &b[..b.len() - 1]);
        }),
        ("CURRENT names a missing manifest", |d, cp| {
            std::fs::remove_file(d.join("manifests").join(cp.id.manifest_file_name())).unwrap()
        }),
        ("manifest digest mismatch", |d, cp| {
            let p = d.join("manifests").join(cp.id.manifest_file_name());
            let mut b = std::fs::read(&p).unwrap();
            b.push(b' ');
            overwrite(&p, &b);
        }),
        ("blob missing", |d, cp| {
            std::fs::remove_file(
                d.join("blobs/sha256")
                    .join(cp.entry("counter").unwrap().sha256.to_hex()),
            )
            .unwrap()
        }),
        ("blob size mismatch", |d, cp| {
            let p = d
                .join("blobs/sha256")
                .join(cp.entry("counter").unwrap().sha256.to_hex());
            overwrite(&p, b"1\n\n");
        }),
        ("blob digest mismatch", |d, cp| {
            let p = d
                .join("blobs/sha256")
                .join(cp.entry("counter").unwrap().sha256.to_hex());
            overwrite(&p, b"9\n");
        }),
        ("is a symlink", |d, _| {
            let b = std::fs::read(d.join("CURRENT")).unwrap();
            std::fs::write(d.join("elsewhere"), b).unwrap();
            std::fs::remove_file(d.join("CURRENT")).unwrap();
            std::os::unix::fs::symlink("elsewhere", d.join("CURRENT")).unwrap();
        }),
        ("is permissive", |d, _| {
            std::fs::set_permissions(d.join("CURRENT"), std::fs::Permissions::from_mode(0o644))
                .unwrap()
        }),
    ];
    for (want, damage) in cases {
        let fx = Fixture::new(1);
        let sd = fx.open();
        let store = CheckpointStore::open_owned(&sd, opts()).unwrap();
        publish_gen(&store, 1, 1);
        let cp = store.load().unwrap().unwrap();
        damage(&fx.store_dir(), &cp);
        let before = snapshot(&fx.state);
        let ro = CheckpointStore::open(&sd, opts()).unwrap();
        let err = ro.load().unwrap_err();
        let msg = err.to_string();
        assert!(msg.contains(want), "{want}: got {msg}");
        assert!(msg.contains(&fx.store_dir().display().to_string()), "{msg}");
        // And the fix: a damaged manifest or blob is restored, or an older checkpoint made
        // current.
        if want.starts_with("manifest") || want.starts_with("blob") {
            assert!(
                msg.contains("restore the file")
                    && msg.contains("`tenure checkpoint rollback --to N`"),
                "{want}: no fix named: {msg}"
            );
        }
        assert!(err.is_corrupt_state(), "{want}: {err:?}");
        assert!(!msg.ends_with('.'), "{msg}");
        // The read-only report refuses the current checkpoint the same way and changes
        // nothing either.
        let report = ro.report().unwrap();
        assert!(report.current.is_err(), "{want}");
        assert_eq!(before, snapshot(&fx.state), "{want}");
        // The owner cannot publish on top of a CURRENT or manifest it cannot trust (publish
        // checks those, not the parent's blobs, which load verifies).
        if !want.starts_with("blob") {
            let files = vec![PublishFile {
                name: "new".into(),
                mode: 0o600,
                source: Source::Reader(Box::new(&b"new"[..])),
            }];
            let err = store.publish_files(1, files).unwrap_err();
            assert!(err.to_string().contains(want), "{want}: publish gave {err}");
            // CURRENT and the parent manifest are checked before any blob is written.
            assert_eq!(before, snapshot(&fx.state), "{want}");
        }
    }
}

/// The best-effort report names the newest valid older checkpoint without loading it.
#[test]
fn report_names_the_newest_valid_older_checkpoint() {
    let fx = Fixture::new(1);
    let sd = fx.open();
    let store = CheckpointStore::open_owned(&sd, StoreOptions { keep: 3 }).unwrap();
    for g in 1..=3 {
        publish_gen(&store, 1, g);
    }
    let cp3 = store.load().unwrap().unwrap();
    // Break generation 3 in a blob only it has.
    let e = cp3.entry("counter").unwrap();
    overwrite(
        &fx.store_dir().join("blobs/sha256").join(e.sha256.to_hex()),
        b"x\n",
    );
    let before = snapshot(&fx.state);
    let ro = CheckpointStore::open(&sd, opts()).unwrap();
    let report = ro.report().unwrap();
    assert!(matches!(
        report.current,
        Err(CheckpointError::BlobDigestMismatch { .. })
    ));
    let older = report.newest_valid_older.expect("generation 2 is valid");
    assert_eq!(
        older.id.get(),
        cp3.id.get() - 1,
        "generation 2 is the one before"
    );
    assert!(ro.load().is_err(), "load never falls back");
    assert_eq!(before, snapshot(&fx.state));
}

/// Exhaustive corruption: every single-byte change of CURRENT, of the manifest and of a blob
/// of a small fixture is detected by load, and load changes nothing on disk.
#[test]
fn corruption_of_any_single_byte_is_detected() {
    let fx = Fixture::new(1);
    let sd = fx.open();
    let store = CheckpointStore::open_owned(&sd, opts()).unwrap();
    let files = vec![
        PublishFile {
            name: "a".into(),
            mode: 0o600,
            source: Source::Reader(Box::new(&b"first file"[..])),
        },
        PublishFile {
            name: "d/b".into(),
            mode: 0o640,
            source: Source::Reader(Box::new(&b"second, nested file"[..])),
        },
    ];
    store.publish_files(1, files).unwrap();
    let cp = store.load().unwrap().unwrap();
    let d = fx.store_dir();
    let targets = [
        d.join("CURRENT"),
        d.join("manifests").join(cp.id.manifest_file_name()),
        d.join("blobs/sha256")
            .join(cp.entry("d/b").unwrap().sha256.to_hex()),
    ];
    let mut total = 0;
    for target in &targets {
        let good = std::fs::read(target).unwrap();
        for i in 0..good.len() {
            for flip in [0x01u8, 0x80, 0xff] {
                let mut bad = good.clone();
                bad[i] ^= flip;
                overwrite(target, &bad);
                let before = snapshot(&fx.state);
                let ro = CheckpointStore::open(&sd, opts()).unwrap();
                let res = ro.load();
                assert!(
                    res.is_err(),
                    "{}: byte {i} ^ {flip:#x} went undetected",
                    target.display()
                );
                assert!(res.unwrap_err().is_corrupt_state());
                assert_eq!(before, snapshot(&fx.state));
                total += 1;
            }
        }
        overwrite(target, &good);
    }
    assert_eq!(store.load().unwrap().unwrap(), cp);
    println!("corruption: {total} single-byte changes, {total} detected");
}

/// Child entry point for the random kill harness (not a test by itself): publishes successive
/// generations forever, printing `acked G` after each publish returns.
#[test]
#[ignore = "child-process entry point, run by random_kill_9_never_loses_an_acknowledged_checkpoint"]
fn child_publish_loop() {
    if std::env::var(CHILD_ENV).as_deref() != Ok("loop") {
        return;
    }
    use std::io::Write;
    let state = std::env::var("TENURE_CKPT_STATE").unwrap();
    let sd = tenure::privfs::StateDir::open(Path::new(&state), false).unwrap();
    let store = CheckpointStore::open_owned(&sd, opts()).unwrap();
    let mut g = match store.load().unwrap() {
        None => 0,
        Some(cp) => generation_of(&store, &cp),
    };
    let mut out = std::io::stdout().lock();
    writeln!(out, "start {g}").unwrap();
    out.flush().unwrap();
    loop {
        g += 1;
        publish_gen(&store, 1, g);
        writeln!(out, "acked {g}").unwrap();
        out.flush().unwrap();
    }
}

/// Random kill -9 (200 trials, 1,000 with TENURE_LONG=1): a child publishes generation after
/// generation and is SIGKILLed at a random moment; afterwards the checkpoint is exactly the
/// last acknowledged generation or the one in flight, never anything else, and no temp file
/// survives the next owned open.
#[test]
fn random_kill_9_never_loses_an_acknowledged_checkpoint() {
    let trials = if long() { 1000 } else { 200 };
    let seed = seed();
    println!("random kill -9: seed {seed} (replay with TENURE_SEED={seed})");
    let mut rng = Rng(seed);
    let fx = Fixture::new(1);
    let mut violations = 0;
    let mut last_acked: Option<u64> = None;
    let mut in_flight_seen = 0;
    for trial in 0..trials {
        let mut child = spawn_child(
            "child_publish_loop",
            "loop",
            &[("TENURE_CKPT_STATE", fx.state.display().to_string())],
        );
        let stdout = child.stdout.take().unwrap();
        let mut lines = BufReader::new(stdout).lines();
        // Wait for the child to be publishing (an event, not a sleep), then kill it after a
        // random delay so the kill lands anywhere in the publish loop.
        // (libtest prints its own header lines first.)
        loop {
            let line = lines
                .next()
                .expect("child exited before publishing")
                .unwrap();
            if line.starts_with("start ") {
                break;
            }
        }
        let delay = Duration::from_micros(rng.below(40_000));
        let t = Instant::now();
        while t.elapsed() < delay {
            std::hint::spin_loop();
        }
        child.kill().unwrap();
        let status = child.wait().unwrap();
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(status.signal(), Some(9), "trial {trial}: {status:?}");
        for line in lines {
            let line = line.unwrap();
            if let Some(g) = line.strip_prefix("acked ") {
                last_acked = Some(g.parse().unwrap());
            }
        }
        let sd = fx.open();
        let ro = CheckpointStore::open(&sd, opts()).unwrap();
        let got = match ro.load() {
            Ok(Some(cp)) => Some(generation_of(&ro, &cp)),
            Ok(None) => None,
            Err(e) => {
                println!("trial {trial}: load refused: {e}");
                violations += 1;
                continue;
            }
        };
        let allowed_next = last_acked.map_or(1, |g| g + 1);
        if got != last_acked && got != Some(allowed_next) {
            println!("trial {trial}: loaded {got:?}, last acked {last_acked:?}");
            violations += 1;
        }
        if got == Some(allowed_next) {
            in_flight_seen += 1;
            last_acked = got;
        }
        drop(CheckpointStore::open_owned(&sd, opts()).unwrap());
        // A manifest temp waits for the next publish's GC (the next trial's child).
        let mut temps = temp_files(&fx.store_dir());
        temps.retain(|p| !p.starts_with("manifests"));
        if !temps.is_empty() {
            println!("trial {trial}: temp files survive an owned open: {temps:?}");
            violations += 1;
        }
    }
    println!(
        "random kill -9: {trials} trials, last acked generation {last_acked:?}, \
         {in_flight_seen} kills after CURRENT moved but before the ack, {violations} violations"
    );
    assert_eq!(violations, 0);
    assert!(last_acked.unwrap_or(0) > 0, "no publish ever completed");
}

/// Files of 4 MiB and more are hashed on a helper thread (publish, the unchanged-file probe,
/// load and views); the results must be the same as on the small-file path.
#[test]
fn large_files_round_trip_through_the_pipelined_paths() {
    let fx = Fixture::new(1);
    let sd = fx.open();
    let store = CheckpointStore::open_owned(&sd, opts()).unwrap();
    let big: Vec<u8> = (0..(9 << 20) + 7u32)
        .map(|i| (i.wrapping_mul(2654435761) >> 13) as u8)
        .collect();
    let staging = store.staging().unwrap();
    std::fs::write(staging.path().join("big.bin"), &big).unwrap();
    let Published::New { checkpoint, .. } = store.publish(1, &staging).unwrap() else {
        panic!("new checkpoint expected")
    };
    assert_eq!(
        store
            .load()
            .unwrap()
            .unwrap()
            .entry("big.bin")
            .unwrap()
            .sha256
            .to_hex(),
        sha(&big)
    );
    // Same bytes again: found unchanged by the pipelined probe, CURRENT untouched.
    assert!(matches!(
        store.publish(1, &staging).unwrap(),
        Published::Unchanged { .. }
    ));
    let cp = store.load().unwrap().unwrap();
    assert_eq!(cp.summary(), checkpoint);
    let view = store.materialise(&cp).unwrap();
    assert_eq!(std::fs::read(view.path().join("big.bin")).unwrap(), big);
    // One flipped byte deep inside is caught by the pipelined verifier.
    let blob = fx
        .store_dir()
        .join("blobs/sha256")
        .join(cp.entry("big.bin").unwrap().sha256.to_hex());
    let mut bad = big.clone();
    bad[8 << 20] ^= 0x40;
    overwrite(&blob, &bad);
    assert!(matches!(
        store.load(),
        Err(CheckpointError::BlobDigestMismatch { .. })
    ));
}

/// Child entry point (not a test by itself): with at most 64 open descriptors, publishes a
/// staging area of 300 files.
#[test]
#[ignore = "child-process entry point, run by staging_with_more_files_than_descriptors_publishes"]
fn child_many_files() {
    if std::env::var(CHILD_ENV).as_deref() != Ok("many") {
        return;
    }
    let fx = Fixture::new(1);
    let sd = fx.open();
    let store = CheckpointStore::open_owned(&sd, opts()).unwrap();
    let staging = store.staging().unwrap();
    for i in 0..300 {
        let dir = staging.path().join(format!("d{}", i % 7));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join(format!("f{i:03}")), format!("{}", i % 5)).unwrap();
    }
    use rustix::process::{Resource, getrlimit, setrlimit};
    let mut lim = getrlimit(Resource::Nofile);
    lim.current = Some(64);
    setrlimit(Resource::Nofile, lim).unwrap();
    let res = store.publish(1, &staging).unwrap();
    let Published::New { checkpoint, .. } = res else {
        panic!("new checkpoint expected")
    };
    assert_eq!(store.load().unwrap().unwrap().summary(), checkpoint);
    println!("published {}", checkpoint.files);
}

/// A staging area with more files than the process may hold open still publishes: staged files
/// are opened one at a time (run in a child so the lowered descriptor limit stays there).
#[test]
fn staging_with_more_files_than_descriptors_publishes() {
    let child = spawn_child("child_many_files", "many", &[]);
    let out = child.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains("published 300"),
        "{:?}\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Issue 11 (card P1): a publish that adopts its staging area links each new file into the
/// store instead of copying it — the blob is the staged file itself, now read-only — but copies
/// a file that is not ours alone: one another handle still holds open for writing (a late
/// write through it must not reach the checkpoint) and one with a second name. What loads is
/// what was staged, in every case.
#[test]
fn adopting_publish_links_what_is_ours_alone_and_copies_the_rest() {
    let fx = Fixture::new(1);
    let sd = fx.open();
    let store = CheckpointStore::open_owned(&sd, opts()).unwrap();
    let staging = store.staging().unwrap();
    let files = vec![
        ("adopted".to_string(), b"ours alone".to_vec()),
        ("dir/deep".to_string(), vec![3u8; 70_000]),
        ("held".to_string(), b"still open for writing".to_vec()),
        ("linked".to_string(), b"two names".to_vec()),
        ("same".to_string(), b"ours alone".to_vec()),
    ];
    write_staged(staging.path(), &files);
    std::fs::hard_link(
        staging.path().join("linked"),
        staging.path().join("linked-too"),
    )
    .unwrap();
    let mut held = std::fs::OpenOptions::new()
        .append(true)
        .open(staging.path().join("held"))
        .unwrap();
    let ino = |p: &Path| std::fs::metadata(p).unwrap().ino();
    let staged: Vec<(String, u64)> = ["adopted", "dir/deep", "held", "linked"]
        .iter()
        .map(|n| (n.to_string(), ino(&staging.path().join(n))))
        .collect();
    let published = store.publish_adopting(1, &staging).unwrap();
    let Published::New { checkpoint, .. } = published else {
        panic!("expected a new checkpoint, got {published:?}")
    };
    // The late write goes into the staged file only.
    std::io::Write::write_all(&mut held, b", and written late").unwrap();
    drop(held);

    let leases =
        std::fs::read_to_string("/proc/sys/fs/leases-enable").is_ok_and(|v| v.trim() == "1");
    let blob_of = |name: &str| {
        let content = &files.iter().find(|(n, _)| n == name).unwrap().1;
        fx.store_dir().join("blobs/sha256").join(sha(content))
    };
    for (name, staged_ino) in &staged {
        let blob = blob_of(name);
        let meta = std::fs::metadata(&blob).unwrap();
        assert_eq!(meta.permissions().mode() & 0o777, 0o400, "{name}");
        let shares = meta.ino() == *staged_ino;
        let expect = leases && (name == "adopted" || name == "dir/deep");
        assert_eq!(
            shares, expect,
            "{name}: adopted {shares}, expected {expect}"
        );
    }
    // `same` has the bytes of `adopted`: one blob, and `same` stays a file of its own.
    assert_ne!(
        ino(&staging.path().join("same")),
        ino(&blob_of("adopted")),
        "a duplicate is not adopted"
    );
    store.discard_staging(staging).unwrap();
    let ro = CheckpointStore::open(&sd, opts()).unwrap();
    let loaded = ro.load().unwrap().expect("a checkpoint");
    assert_eq!(loaded.summary(), checkpoint);
    let mut want = files.clone();
    want.insert(4, ("linked-too".to_string(), b"two names".to_vec()));
    assert_eq!(contents(&ro, &loaded), want);
    for (p, (mode, _)) in snapshot(&fx.store_dir()) {
        assert_eq!(mode & 0o077, 0, "{} is not private", p.display());
    }
}

/// Issue 11 (card P1): the plain `publish` never adopts: the staging area stays the caller's,
/// its files untouched (modes and inodes), to be changed and published again.
#[test]
fn plain_publish_leaves_the_staging_area_alone() {
    let fx = Fixture::new(1);
    let sd = fx.open();
    let store = CheckpointStore::open_owned(&sd, opts()).unwrap();
    let staging = store.staging().unwrap();
    write_staged(staging.path(), &[("a".to_string(), b"one".to_vec())]);
    let before = snapshot(staging.path());
    store.publish(1, &staging).unwrap();
    assert_eq!(snapshot(staging.path()), before);
    std::fs::write(staging.path().join("a"), b"two").unwrap();
    store.publish(1, &staging).unwrap();
    let ro = CheckpointStore::open(&sd, opts()).unwrap();
    let loaded = ro.load().unwrap().expect("a checkpoint");
    assert_eq!(
        contents(&ro, &loaded),
        vec![("a".to_string(), b"two".to_vec())]
    );
}

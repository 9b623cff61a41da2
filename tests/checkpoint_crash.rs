//! Crash and fault tests of the checkpoint store that need the `failpoints` feature:
//! the crash-point sweep (a child process dies at every named step of a publish), EIO at every
//! fsync, the recorded operation order (every create and rename is followed by an fsync of its
//! directory before publish returns), and a property test of publish/crash/GC/load sequences.
//!
//! Run with `cargo test --all-features` (or `--features failpoints`); the `[[test]]` entry
//! requires the feature, so a plain `cargo test` skips this file.

mod checkpoint_support;

use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::sync::{Mutex, MutexGuard};

use checkpoint_support::*;
use proptest::prelude::*;
use tenure::checkpoint::{
    CheckpointError, CheckpointStore, FAILPOINTS, FAILPOINTS_AFTER_RENAME, FAILPOINTS_COPY_ONLY,
    Published,
};
use tenure::privfs::{FsError, OpKind, StateDir};

/// The tests of this file publish through the same failpoint labels (`publish.blob.fsync`, ...),
/// so a fault one test arms (`failpoint::scoped`) would hit another test's publish even though
/// the scopes themselves are one at a time: every test takes this lock for its whole run.
static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> MutexGuard<'static, ()> {
    SERIAL
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// A state dir holding generations 1 and 2 (keep = 2), so publishing generation 3 writes new
/// blobs, dedups `static.txt`, and garbage-collects generation 1's manifest and blobs: every
/// crash point of [`FAILPOINTS`] is reached.
fn two_generations() -> Fixture {
    let fx = Fixture::new(1);
    let sd = fx.open();
    let store = CheckpointStore::open_owned(&sd, opts()).unwrap();
    publish_gen(&store, 1, 1);
    publish_gen(&store, 1, 2);
    fx
}

/// Child entry point (not a test by itself): publishes generation `TENURE_CKPT_GEN` through a
/// staging area, with `TENURE_FAILPOINTS` set by the parent, and prints `published` if it
/// survives.
#[test]
#[ignore = "child-process entry point, run by the crash tests"]
fn child_crash_publish() {
    if std::env::var(CHILD_ENV).as_deref() != Ok("crash") {
        return;
    }
    no_core_dumps();
    let state = std::env::var("TENURE_CKPT_STATE").unwrap();
    let g: u64 = std::env::var("TENURE_CKPT_GEN").unwrap().parse().unwrap();
    let sd = StateDir::open(Path::new(&state), false).unwrap();
    let store = CheckpointStore::open_owned(&sd, opts()).unwrap();
    let staging = store.staging().unwrap();
    for (name, bytes) in generation(g) {
        let p = staging.path().join(&name);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(&p, &bytes).unwrap();
        // Mode 0600 like `publish_gen`, so a crash-free run equals the in-process generation.
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).unwrap();
    }
    // The runner's publish: staged files are adopted (copied at the copy's own crash points).
    let res = store.publish_adopting(1, &staging);
    println!("published {res:?}");
}

/// How a crash child ended.
#[derive(Debug, PartialEq, Eq)]
enum Ended {
    Crashed,
    Completed,
}

fn run_crash_child(state: &Path, g: u64, point: &str, action: &str) -> Ended {
    let child = spawn_child(
        "child_crash_publish",
        "crash",
        &[
            ("TENURE_CKPT_STATE", state.display().to_string()),
            ("TENURE_CKPT_GEN", g.to_string()),
            ("TENURE_FAILPOINTS", format!("{point}={action}")),
            // The payload (40,000 bytes) gets its own fsync, the small files the batch's
            // syncfs: every publish takes both durability paths.
            ("TENURE_OWN_FSYNC_MIN", "32768".to_string()),
            (
                "TENURE_ADOPT",
                if FAILPOINTS_COPY_ONLY.contains(&point) {
                    "0"
                } else {
                    "1"
                }
                .to_string(),
            ),
        ],
    );
    let out = child.wait_with_output().unwrap();
    match out.status.signal() {
        Some(9) | Some(6) => Ended::Crashed,
        _ => {
            let stdout = String::from_utf8_lossy(&out.stdout);
            assert!(
                out.status.success() && stdout.contains("published Ok("),
                "child at {point} neither crashed nor published: {:?}\n{stdout}\n{}",
                out.status,
                String::from_utf8_lossy(&out.stderr)
            );
            Ended::Completed
        }
    }
}

/// Loads the current generation read-only; `Err` names why it is not a valid generation.
fn current_generation(state: &Path) -> Result<Option<u64>, String> {
    let sd = StateDir::open(state, false).map_err(|e| e.to_string())?;
    let ro = CheckpointStore::open(&sd, opts()).map_err(|e| e.to_string())?;
    match ro.load() {
        Ok(None) => Ok(None),
        Ok(Some(cp)) => {
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| generation_of(&ro, &cp)))
                .map(Some)
                .map_err(|_| format!("checkpoint {} is no generation", cp.id))
        }
        Err(e) => Err(e.to_string()),
    }
}

/// Crash-point sweep: for every named crash point, a child process publishing generation 3
/// over generation 2 dies there (SIGKILL and SIGABRT alternately), 20 runs per point (100
/// with TENURE_LONG=1). Afterwards load yields exactly generation 2 (before the CURRENT rename)
/// or 3 (after it), and the next owned open leaves no temp file.
#[test]
fn crash_point_sweep() {
    let _g = serial();
    let runs = if long() { 100 } else { 20 };
    let mut table = Vec::new();
    let mut total_violations = 0;
    for point in FAILPOINTS {
        let want = if FAILPOINTS_AFTER_RENAME.contains(point) {
            3
        } else {
            2
        };
        let mut violations = 0;
        let mut first_violation = None;
        for run in 0..runs {
            let fx = two_generations();
            let action = if run % 2 == 0 { "kill" } else { "abort" };
            let ended = run_crash_child(&fx.state, 3, point, action);
            let mut problem = None;
            if ended != Ended::Crashed {
                problem = Some("the crash point was not reached".to_string());
            }
            match current_generation(&fx.state) {
                Ok(Some(g)) if g == want => {}
                other => problem = Some(format!("load gave {other:?}, expected generation {want}")),
            }
            {
                let sd = fx.open();
                drop(CheckpointStore::open_owned(&sd, opts()).unwrap());
            }
            // A manifest temp waits for the next publish's GC (the run path does not list the
            // manifests); every other temp file is gone after the owned open.
            let mut temps = temp_files(&fx.store_dir());
            temps.retain(|p| !p.starts_with("manifests"));
            if !temps.is_empty() {
                problem = Some(format!("temp files survive an owned open: {temps:?}"));
            }
            if current_generation(&fx.state) != Ok(Some(want)) {
                problem = Some("the owned open changed the checkpoint".to_string());
            }
            if run == 0 {
                let sd = fx.open();
                let store = CheckpointStore::open_owned(&sd, opts()).unwrap();
                publish_gen_result(&store, 4).unwrap();
                let temps = temp_files(&fx.store_dir());
                if !temps.is_empty() {
                    problem = Some(format!("temp files survive the next publish: {temps:?}"));
                }
            }
            if let Some(p) = problem {
                violations += 1;
                first_violation.get_or_insert(format!("run {run} ({action}): {p}"));
            }
        }
        total_violations += violations;
        table.push((point, runs, violations, first_violation));
    }
    println!("{:<28} {:>5} {:>10}", "point", "runs", "violations");
    for (point, runs, violations, first) in &table {
        println!("{point:<28} {runs:>5} {violations:>10}");
        if let Some(f) = first {
            println!("    first: {f}");
        }
    }
    assert_eq!(total_violations, 0);
}

/// EIO at every fsync of the publish path: the publish fails with a typed error, CURRENT's
/// bytes are unchanged, no temp file is left, and the store refuses to go on after a failed
/// directory fsync (it must be reopened). EIO at the final directory fsync is reported as not
/// acknowledged, with CURRENT naming one of the two complete checkpoints.
#[test]
fn eio_at_fsync_fails_the_publish_and_leaves_current() {
    let _g = serial();
    let before_rename = [
        "publish.blob.write",
        "publish.batch.syncfs",
        "publish.incoming.dirfsync",
        "publish.blob.dirfsync",
        "publish.manifest.write",
        "publish.manifest.dirfsync",
        "publish.current.write",
        "publish.current.fsync",
        "publish.current.rename",
    ];
    for point in before_rename {
        let fx = two_generations();
        let sd = fx.open();
        let store = CheckpointStore::open_owned(&sd, opts()).unwrap();
        let current = std::fs::read(fx.store_dir().join("CURRENT")).unwrap();
        let err = {
            let _f = tenure::failpoint::scoped(&format!("{point}=eio"));
            publish_gen_result(&store, 3)
        }
        .unwrap_err();
        assert!(
            matches!(err, CheckpointError::PublishFailed { .. }),
            "{point}: {err:?}"
        );
        let msg = err.to_string();
        assert!(msg.contains("CURRENT is unchanged"), "{point}: {msg}");
        assert_eq!(
            std::fs::read(fx.store_dir().join("CURRENT")).unwrap(),
            current,
            "{point}"
        );
        assert_eq!(current_generation(&fx.state), Ok(Some(2)), "{point}");
        assert!(temp_files(&fx.store_dir()).is_empty(), "{point}");
        // A store directory whose fsync failed is poisoned: no later publish on this store may
        // trust it. (`incoming/` is made anew by every publish.)
        if point.ends_with("dirfsync") && !point.starts_with("publish.incoming") {
            let err = publish_gen_result(&store, 3).unwrap_err();
            assert!(
                matches!(
                    err,
                    CheckpointError::PublishFailed {
                        source: FsError::Poisoned { .. }
                    }
                ),
                "{point}: {err:?}"
            );
        }
        // A fresh store (a reopened state dir) publishes normally.
        let store = CheckpointStore::open_owned(&sd, opts()).unwrap();
        assert!(matches!(
            publish_gen_result(&store, 3).unwrap(),
            Published::New { .. }
        ));
        assert_eq!(current_generation(&fx.state), Ok(Some(3)), "{point}");
    }

    let fx = two_generations();
    let sd = fx.open();
    let store = CheckpointStore::open_owned(&sd, opts()).unwrap();
    let err = {
        let _f = tenure::failpoint::scoped("publish.current.dirfsync=eio");
        publish_gen_result(&store, 3)
    }
    .unwrap_err();
    assert!(
        matches!(err, CheckpointError::CurrentSyncFailed { .. }),
        "{err:?}"
    );
    assert!(err.to_string().contains("not acknowledged"), "{err}");
    let g = current_generation(&fx.state).unwrap().unwrap();
    assert!(g == 2 || g == 3, "{g}");
}

fn publish_gen_result(store: &CheckpointStore<'_>, g: u64) -> Result<Published, CheckpointError> {
    let files = generation(g);
    let list = files
        .iter()
        .map(|(n, b)| tenure::checkpoint::PublishFile {
            name: n.clone(),
            mode: 0o600,
            source: tenure::checkpoint::Source::Reader(Box::new(&b[..])),
        })
        .collect();
    store.publish_files(1, list)
}

/// Card P1: a staged file that cannot be linked into the store (`EXDEV`, as across filesystems; a
/// missing /proc or hard links refused answer alike) is copied instead, after the adoption
/// hashed it: its mode is given back, the copy starts from its first byte, and what loads is
/// what was staged, a large file (its own fsync) and a small one alike.
#[test]
fn p1_a_staged_file_that_cannot_be_linked_is_copied_whole() {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let _g = serial();
    let fx = Fixture::new(1);
    let sd = fx.open();
    let store = CheckpointStore::open_owned(&sd, opts()).unwrap();
    let staging = store.staging().unwrap();
    let files = [
        ("big".to_string(), vec![7u8; 3 << 20]),
        ("small".to_string(), b"small and staged".to_vec()),
    ];
    for (name, bytes) in &files {
        let p = staging.path().join(name);
        std::fs::write(&p, bytes).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o640)).unwrap();
    }
    let staged_ino = |n: &str| std::fs::metadata(staging.path().join(n)).unwrap().ino();
    let inos: Vec<u64> = files.iter().map(|(n, _)| staged_ino(n)).collect();
    let published = {
        let _f = tenure::failpoint::scoped("publish.adopt.link=exdev");
        store.publish_adopting(1, &staging).unwrap()
    };
    assert!(matches!(published, Published::New { .. }), "{published:?}");
    for ((name, bytes), ino) in files.iter().zip(&inos) {
        let staged = std::fs::metadata(staging.path().join(name)).unwrap();
        assert_eq!(
            staged.permissions().mode() & 0o777,
            0o640,
            "{name}: mode given back"
        );
        assert_eq!(staged.nlink(), 1, "{name}: no second name left behind");
        let blob = fx.store_dir().join("blobs/sha256").join(sha(bytes));
        let meta = std::fs::metadata(&blob).unwrap();
        assert_ne!(meta.ino(), *ino, "{name}: copied, not adopted");
        assert_eq!(
            std::fs::read(&blob).unwrap(),
            *bytes,
            "{name}: copied whole"
        );
    }
    store.discard_staging(staging).unwrap();
    let ro = CheckpointStore::open(&sd, opts()).unwrap();
    let loaded = ro.load().unwrap().expect("a checkpoint");
    assert_eq!(contents(&ro, &loaded), files.to_vec());
    assert!(temp_files(&fx.store_dir()).is_empty());
}

/// The recorded operation order of a publish (LazyFS cannot see a missing directory fsync, so
/// the order is proved from privfs's recorder), in the batched protocol of issue 11: every
/// create and rename is followed by an fsync of its directory before publish returns; the new
/// blobs' data is made durable by one `syncfs` before any of them is named in `blobs/sha256/`
/// (and the manifest's before it is named); CURRENT's temp is fsynced before its rename; blobs
/// and manifest are durable before CURRENT is replaced; GC starts only after CURRENT's
/// directory fsync, deleting manifests before blobs (GC deletions are deliberately not
/// fsynced: see `plan::GcPlan`). A publish of new files costs a fixed number of syncs,
/// whatever the number of files.
#[test]
fn recorded_publish_syncs_every_directory_it_changes() {
    let _g = serial();
    let fx = two_generations();
    let sd = fx.open();
    let store = CheckpointStore::open_owned(&sd, opts()).unwrap();
    let root = sd.path().join("checkpoints");
    tenure::privfs::start_recording();
    let res = publish_gen_result(&store, 3);
    let ops = tenure::privfs::take_recording_under(&root);
    let Published::New { gc, .. } = res.unwrap() else {
        panic!("generation 3 is new")
    };
    assert!(gc.manifests_removed == 1 && gc.blobs_removed == 2, "{gc:?}");
    for (i, op) in ops.iter().enumerate() {
        println!("{i:3} {:?} {} {}", op.kind, op.dir.display(), op.name);
    }

    let dir_fsync_after = |dir: &Path, i: usize| {
        ops[i + 1..]
            .iter()
            .position(|o| o.kind == OpKind::DirFsync && o.dir == dir)
            .map(|p| p + i + 1)
    };
    for (i, op) in ops.iter().enumerate() {
        if matches!(op.kind, OpKind::Create | OpKind::Rename) {
            assert!(
                dir_fsync_after(&op.dir, i).is_some(),
                "op {i} ({:?} {}/{}) is not followed by an fsync of its directory",
                op.kind,
                op.dir.display(),
                op.name
            );
        }
    }
    let find = |pred: &dyn Fn(&tenure::privfs::Op) -> bool| -> Vec<usize> {
        ops.iter()
            .enumerate()
            .filter(|(_, o)| pred(o))
            .map(|(i, _)| i)
            .collect()
    };
    let blobs = root.join("blobs/sha256");
    let manifests = root.join("manifests");
    let syncfs = find(&|o| o.kind == OpKind::SyncFs);
    let blob_renames = find(&|o| o.kind == OpKind::Rename && o.dir == blobs);
    let manifest_renames = find(&|o| o.kind == OpKind::Rename && o.dir == manifests);
    let current_renames = find(&|o| o.kind == OpKind::Rename && o.dir == root);
    assert_eq!(syncfs.len(), 1, "one durability batch");
    assert_eq!(blob_renames.len(), 2, "counter and payload are new");
    assert_eq!(manifest_renames.len(), 1);
    assert_eq!(current_renames.len(), 1);
    assert_eq!(ops[current_renames[0]].name, "CURRENT");
    assert!(
        syncfs[0] < blob_renames[0] && syncfs[0] < manifest_renames[0],
        "blob and manifest data are durable before they are named"
    );
    let current_tmp = ops[current_renames[0]]
        .from
        .as_ref()
        .unwrap()
        .file_name()
        .unwrap()
        .to_str()
        .unwrap()
        .to_string();
    assert!(
        ops[..current_renames[0]]
            .iter()
            .any(|o| o.kind == OpKind::Fsync && o.dir == root && o.name == current_tmp),
        "CURRENT's temp is fsynced before its rename"
    );
    let blob_sync = dir_fsync_after(&blobs, *blob_renames.last().unwrap()).unwrap();
    let manifest_sync = dir_fsync_after(&manifests, manifest_renames[0]).unwrap();
    let root_sync = dir_fsync_after(&root, current_renames[0]).unwrap();
    assert!(
        blob_sync < current_renames[0],
        "blobs durable before CURRENT"
    );
    assert!(
        manifest_sync < current_renames[0],
        "manifest durable before CURRENT"
    );
    let syncs = find(&|o| matches!(o.kind, OpKind::Fsync | OpKind::DirFsync | OpKind::SyncFs));
    assert_eq!(
        syncs.len(),
        6,
        "syncfs, the dir fsyncs of incoming/, blobs/ and manifests/, CURRENT's fsync and its \
         directory's"
    );
    let gc_unlinks = find(&|o| {
        o.kind == OpKind::Unlink
            && (o.dir == blobs || o.dir == manifests)
            && !o.name.starts_with(".tmp-")
    });
    assert_eq!(gc_unlinks.len(), 3);
    assert!(
        gc_unlinks.iter().all(|&i| i > root_sync),
        "GC only after the ack"
    );
    let first_blob_unlink =
        find(&|o| o.kind == OpKind::Unlink && o.dir == blobs && !o.name.starts_with(".tmp-"))[0];
    let manifest_unlink = find(&|o| o.kind == OpKind::Unlink && o.dir == manifests)[0];
    assert!(
        manifest_unlink < first_blob_unlink,
        "manifests are collected before their blobs"
    );
}

/// One step of the property test.
#[derive(Debug, Clone)]
enum Step {
    /// Publish the next generation in-process.
    Publish,
    /// A child publishes the next generation and dies at this crash point (index into
    /// [`FAILPOINTS`]).
    Crash(usize),
    /// An owned open (the next owner): sweeps temp files.
    Reopen,
    /// Publish the current generation again (nothing changes).
    Republish,
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        3 => Just(Step::Publish),
        3 => (0..FAILPOINTS.len()).prop_map(Step::Crash),
        1 => Just(Step::Reopen),
        1 => Just(Step::Republish),
    ]
}

/// Manifest files in the store (temp files of a crashed publish are not manifests).
fn manifest_count(fx: &Fixture) -> usize {
    std::fs::read_dir(fx.store_dir().join("manifests"))
        .map(|d| {
            d.filter(|e| {
                !e.as_ref()
                    .unwrap()
                    .file_name()
                    .to_string_lossy()
                    .starts_with(".tmp-")
            })
            .count()
        })
        .unwrap_or(0)
}

fn run_steps(steps: &[Step], keep: usize) -> Result<(), TestCaseError> {
    let fx = Fixture::new(1);
    let options = tenure::checkpoint::StoreOptions { keep };
    // The last acknowledged generation: load must return it, or a newer one whose publish was
    // interrupted after its CURRENT rename (which then becomes the one to keep).
    let mut acked: Option<u64> = None;
    let mut next = 1u64;
    for s in steps {
        let sd = fx.open();
        match s {
            Step::Publish => {
                let store = CheckpointStore::open_owned(&sd, options).unwrap();
                let res = publish_gen_result(&store, next).unwrap();
                let Published::New { gc, .. } = res else {
                    return Err(TestCaseError::fail("a new generation must publish"));
                };
                prop_assert_eq!(gc.error, None);
                // ... and no temp file anywhere (a manifest temp goes with the GC's listing).
                prop_assert!(temp_files(&fx.store_dir()).is_empty());
                // A completed GC leaves exactly the kept manifests, whatever earlier crashes
                // left behind (orphans of interrupted publishes, uncollected garbage).
                let n = manifest_count(&fx);
                prop_assert!(n <= keep, "{} manifests with keep {}", n, keep);
                acked = Some(next);
                next += 1;
            }
            Step::Crash(i) => {
                let ended = run_crash_child(&fx.state, next, FAILPOINTS[*i], "kill");
                let got = current_generation(&fx.state).map_err(TestCaseError::fail)?;
                if ended == Ended::Completed {
                    prop_assert_eq!(got, Some(next));
                } else {
                    prop_assert!(
                        got == acked || got == Some(next),
                        "after a crash at {} load gave {:?}, last acked {:?}",
                        FAILPOINTS[*i],
                        got,
                        acked
                    );
                }
                acked = got;
                next += 1;
            }
            Step::Reopen => {
                drop(CheckpointStore::open_owned(&sd, options).unwrap());
                let mut temps = temp_files(&fx.store_dir());
                temps.retain(|p| !p.starts_with("manifests"));
                prop_assert!(temps.is_empty(), "{:?}", temps);
            }
            Step::Republish => {
                if let Some(g) = acked {
                    let store = CheckpointStore::open_owned(&sd, options).unwrap();
                    let res = publish_gen_result(&store, g).unwrap();
                    prop_assert!(matches!(res, Published::Unchanged { .. }), "{:?}", res);
                }
            }
        }
        prop_assert_eq!(
            current_generation(&fx.state).map_err(TestCaseError::fail)?,
            acked
        );
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: if long() { 256 } else { 32 },
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    /// Random sequences of publish / crash (at any point, GC included) / reopen / republish
    /// never lose the last acknowledged checkpoint.
    #[test]
    fn publish_crash_gc_load_never_lose_the_last_ack(
        steps in proptest::collection::vec(step(), 1..8),
        keep in 1usize..4,
    ) {
        let _g = serial();
        run_steps(&steps, keep)?;
    }
}

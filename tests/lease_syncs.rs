//! Issue 11: the syncs of the lease, counted through privfs's operation recorder (feature
//! `failpoints`). The lease is driven in-process through the library, as the runner drives it
//! (acquire, register the child, phase updates, unregister, release), on real files in a temp
//! dir; the recorder sees every fsync, fdatasync, directory fsync and syncfs that privfs makes.
//!
//! The durability principle (spec/lifecycle.md, "Durability"): only the epoch must outlive a
//! power loss on a run that publishes nothing — its temp file's fdatasync and the sync of the
//! control folder that makes its rename durable. The owner record, its phases, the registry,
//! the waiter entries, the sweeps and the release record are written and never synced.

use std::path::Path;
use std::sync::mpsc;
use std::time::Duration;

use tenure::checkpoint::{CheckpointStore, PublishFile, Published, Source, StoreOptions};
use tenure::lease::{self, AcquireOptions, Identity, WaitBound};
use tenure::machine::PhaseKind;
use tenure::privfs::{Op, OpKind, StateDir};

/// The recorder is process-wide: the tests of this binary run one at a time.
fn serial() -> std::sync::MutexGuard<'static, ()> {
    static ONE: std::sync::Mutex<()> = std::sync::Mutex::new(());
    ONE.lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn private_tempdir() -> tempfile::TempDir {
    use std::os::unix::fs::PermissionsExt;
    let t = tempfile::tempdir().unwrap();
    std::fs::set_permissions(t.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
    t
}

fn is_sync(op: &Op) -> bool {
    matches!(op.kind, OpKind::Fsync | OpKind::DirFsync | OpKind::SyncFs)
}

fn syncs(ops: &[Op]) -> Vec<String> {
    ops.iter()
        .filter(|o| is_sync(o))
        .map(|o| format!("{:?} {}/{}", o.kind, o.dir.display(), o.name))
        .collect()
}

/// A whole ownership the way the runner has one, publishing nothing.
fn one_run(sd: &StateDir) -> u64 {
    let mut l = lease::acquire(sd, &AcquireOptions::default(), &mut |_| {
        panic!("nobody else holds this dir")
    })
    .unwrap();
    let me = Identity::of_self().unwrap();
    l.register_instance("child", &me).unwrap();
    l.set_phase(PhaseKind::Ready).unwrap();
    l.set_phase(PhaseKind::Draining).unwrap();
    l.unregister_instance("child").unwrap();
    let epoch = l.epoch();
    l.release().unwrap();
    epoch
}

/// Asserts that `ops` hold exactly the epoch's two syncs: the fdatasync of its temp file in
/// the control folder, then the control folder's sync (and no other directory's).
fn only_the_epoch(ops: &[Op], control: &Path) {
    let s = syncs(ops);
    println!("syncs: {s:#?}");
    assert_eq!(
        s.len(),
        2,
        "a run without publish syncs the epoch only: {s:#?}"
    );
    let files: Vec<&Op> = ops.iter().filter(|o| o.kind == OpKind::Fsync).collect();
    let dirs: Vec<&Op> = ops.iter().filter(|o| o.kind == OpKind::DirFsync).collect();
    assert!(
        files.len() == 1 && files[0].dir == control,
        "one fdatasync, of the epoch's temp file: {s:#?}"
    );
    assert!(
        dirs.len() == 1 && dirs[0].dir == control,
        "one directory sync, of the control folder, for the epoch's rename: {s:#?}"
    );
    // The epoch's temp file is synced before it is renamed over the epoch file, and the
    // folder after the rename.
    let fsync_at = ops.iter().position(|o| o.kind == OpKind::Fsync).unwrap();
    let rename_at = ops
        .iter()
        .position(|o| o.kind == OpKind::Rename && o.name == "epoch")
        .expect("the epoch is renamed into place");
    let dir_at = ops.iter().position(|o| o.kind == OpKind::DirFsync).unwrap();
    assert!(fsync_at < rename_at && rename_at < dir_at, "{ops:#?}");
    assert!(
        !ops.iter()
            .any(|o| o.kind == OpKind::Mkdir || (o.kind == OpKind::Create && o.name == "lock")),
        "the dir exists: nothing is created but temp files: {ops:#?}"
    );
}

/// Issue 11: once the dir exists, a run that publishes nothing makes the epoch durable and
/// nothing else (the first run of a dir also makes its new folders and marker durable).
#[test]
fn run_without_publish_syncs_only_the_epoch() {
    let _one = serial();
    let t = private_tempdir();
    let dir = t.path().join("state");
    let sd = StateDir::open(&dir, true).unwrap();
    tenure::privfs::start_recording();
    assert_eq!(one_run(&sd), 1);
    let first = tenure::privfs::take_recording_under(&dir);
    println!("first run (a new dir): {:#?}", syncs(&first));
    assert!(
        syncs(&first).len() <= 9,
        "the first run syncs the new folders and the marker, once: {:#?}",
        syncs(&first)
    );

    tenure::privfs::start_recording();
    assert_eq!(one_run(&sd), 2);
    let ops = tenure::privfs::take_recording_under(&dir);
    only_the_epoch(&ops, &dir.join(".tenure"));
}

/// Issue 11: a run that publishes adds the checkpoint's syncs (the store's business) and
/// nothing in the control folder beyond the epoch's.
#[test]
fn run_with_publish_adds_only_the_checkpoints_syncs() {
    let _one = serial();
    let t = private_tempdir();
    let dir = t.path().join("state");
    let sd = StateDir::open(&dir, true).unwrap();
    one_run(&sd);

    tenure::privfs::start_recording();
    let mut l = lease::acquire(&sd, &AcquireOptions::default(), &mut |_| {
        panic!("nobody else holds this dir")
    })
    .unwrap();
    l.set_phase(PhaseKind::Ready).unwrap();
    l.set_phase(PhaseKind::Draining).unwrap();
    let store = CheckpointStore::open_owned(&sd, StoreOptions::default()).unwrap();
    let data = b"state".to_vec();
    let files = vec![PublishFile {
        name: "a".into(),
        mode: 0o600,
        source: Source::Reader(Box::new(&data[..])),
    }];
    let published = store.publish_files(l.epoch(), files).unwrap();
    assert!(matches!(published, Published::New { .. }), "{published:?}");
    drop(store);
    l.release().unwrap();
    let ops = tenure::privfs::take_recording_under(&dir);
    let control = dir.join(".tenure");
    let in_control: Vec<Op> = ops
        .iter()
        .filter(|o| o.dir.starts_with(&control))
        .cloned()
        .collect();
    only_the_epoch(&in_control, &control);
    let store_syncs: Vec<&Op> = ops
        .iter()
        .filter(|o| is_sync(o) && !o.dir.starts_with(&control))
        .collect();
    println!("the publish's syncs: {store_syncs:#?}");
    assert!(
        !store_syncs.is_empty(),
        "a publish makes the checkpoint durable"
    );
}

/// Issue 11: a handoff — a waiter woken by the owner's release — costs the waiter the epoch's
/// syncs and nothing else, and the release none.
#[test]
fn handoff_syncs_only_the_waiters_epoch() {
    let _one = serial();
    let t = private_tempdir();
    let dir = t.path().join("state");
    let sd = StateDir::open(&dir, true).unwrap();
    one_run(&sd);

    let owner = lease::acquire(&sd, &AcquireOptions::default(), &mut |_| {
        panic!("nobody else holds this dir")
    })
    .unwrap();
    tenure::privfs::start_recording();
    let (waiting_tx, waiting_rx) = mpsc::channel();
    let waiter_dir = dir.clone();
    let waiter = std::thread::spawn(move || {
        let sd = StateDir::open(&waiter_dir, false).unwrap();
        let opts = AcquireOptions {
            wait: WaitBound::For(Duration::from_secs(120)),
            ..AcquireOptions::default()
        };
        let l = lease::acquire(&sd, &opts, &mut |_| waiting_tx.send(()).unwrap()).unwrap();
        let epoch = l.epoch();
        l.release().unwrap();
        epoch
    });
    // The waiter reports the contention before it waits; then the owner lets go.
    waiting_rx
        .recv_timeout(Duration::from_secs(120))
        .expect("the waiter reports the contention");
    let before_release = tenure::privfs::take_recording_under(&dir);
    tenure::privfs::start_recording();
    owner.release().unwrap();
    assert_eq!(waiter.join().unwrap(), 3);
    let ops = tenure::privfs::take_recording_under(&dir);
    assert!(
        syncs(&before_release).is_empty(),
        "a waiter's entry is not synced: {:#?}",
        syncs(&before_release)
    );
    only_the_epoch(&ops, &dir.join(".tenure"));
}

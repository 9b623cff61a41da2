//! Issue 11: the syncs of the lease, counted through privfs's operation recorder (feature
//! `failpoints`). The lease is driven in-process through the library, as the runner drives it
//! (acquire, register the child, phase updates, unregister, release), on real files in a temp
//! dir; the recorder sees every fsync, fdatasync, directory fsync and syncfs that privfs makes.
//!
//! The durability principle (spec/lifecycle.md, "Durability"): only the epoch must outlive a
//! power loss on a run that publishes nothing — one fdatasync of the epoch file, written in
//! place into one of its two slots (no temp file, no rename, no directory sync). The owner
//! record, its phases, the registry, the waiter entries, the sweeps and the release record are
//! written and never synced.

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

/// Asserts that `ops` hold exactly the epoch's one sync: the epoch is written in place into
/// `.tenure/epoch` (one slot of it) and fdatasynced, and no directory is synced.
fn only_the_epoch(ops: &[Op], control: &Path) {
    let s = syncs(ops);
    println!("syncs: {s:#?}");
    assert_eq!(
        s.len(),
        1,
        "a run without publish syncs the epoch only: {s:#?}"
    );
    let fsync = ops
        .iter()
        .position(|o| o.kind == OpKind::Fsync)
        .expect("the epoch is fdatasynced");
    assert!(
        ops[fsync].dir == control && ops[fsync].name == "epoch",
        "one fdatasync, of the epoch file itself: {s:#?}"
    );
    // Written in place just before: no temp file, no rename, no directory sync.
    let write = ops
        .iter()
        .position(|o| o.kind == OpKind::Write && o.dir == control && o.name == "epoch")
        .expect("the epoch is written in place");
    assert!(write < fsync, "{ops:#?}");
    assert!(
        !ops.iter()
            .any(|o| o.kind == OpKind::Rename && o.name == "epoch"),
        "the epoch file is not replaced: {ops:#?}"
    );
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

/// Issue 11, migration: a dir whose epoch file an older tenure wrote (`<decimal>\n`) is read as
/// before; the next acquisition replaces it once with the slot format (temp file, fdatasync,
/// rename, one sync of the control folder), and every acquisition after that writes in place
/// with one sync.
#[test]
fn legacy_epoch_file_is_upgraded_once() {
    use std::os::unix::fs::PermissionsExt;
    let _one = serial();
    let t = private_tempdir();
    let dir = t.path().join("state");
    let sd = StateDir::open(&dir, true).unwrap();
    assert_eq!(one_run(&sd), 1);
    // What a tenure before issue 11 leaves: one decimal number and a newline.
    let path = dir.join(".tenure/epoch");
    std::fs::remove_file(&path).unwrap();
    std::fs::write(&path, b"41\n").unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
    assert_eq!(lease::read_epoch(&sd).unwrap(), 41);

    tenure::privfs::start_recording();
    assert_eq!(one_run(&sd), 42);
    let ops = tenure::privfs::take_recording_under(&dir);
    let s = syncs(&ops);
    println!("the upgrade's syncs: {s:#?}");
    let control = dir.join(".tenure");
    assert_eq!(
        s.len(),
        2,
        "the upgrade replaces the file durably, once: {s:#?}"
    );
    assert!(
        ops.iter()
            .any(|o| o.kind == OpKind::Rename && o.dir == control && o.name == "epoch"),
        "{ops:#?}"
    );
    let bytes = std::fs::read(&path).unwrap();
    assert_eq!(bytes.len() as u64, lease::epoch::FILE_LEN);
    assert_eq!(
        lease::epoch::decode(&bytes),
        Ok(lease::epoch::Stored::Slots {
            epoch: 42,
            newest: 0
        })
    );

    tenure::privfs::start_recording();
    assert_eq!(one_run(&sd), 43);
    let ops = tenure::privfs::take_recording_under(&dir);
    only_the_epoch(&ops, &control);
    assert_eq!(lease::read_epoch(&sd).unwrap(), 43);
    // The in-place writes alternate between the two slots.
    assert_eq!(one_run(&sd), 44);
    let bytes = std::fs::read(&path).unwrap();
    assert_eq!(
        lease::epoch::decode(&bytes),
        Ok(lease::epoch::Stored::Slots {
            epoch: 44,
            newest: 0
        })
    );
}

/// Issue 11: a torn slot (what a power loss during the in-place write can leave) is skipped,
/// and the other slot's epoch is the file's; the next acquisition hands out the epoch after
/// it and rewrites the torn slot, never the valid one.
#[test]
fn torn_slot_falls_back_to_the_other() {
    let _one = serial();
    let t = private_tempdir();
    let dir = t.path().join("state");
    let sd = StateDir::open(&dir, true).unwrap();
    for want in 1..=3 {
        assert_eq!(one_run(&sd), want);
    }
    let path = dir.join(".tenure/epoch");
    let mut bytes = std::fs::read(&path).unwrap();
    let stored = lease::epoch::decode(&bytes).unwrap();
    let lease::epoch::Stored::Slots { epoch: 3, newest } = stored else {
        panic!("{stored:?}")
    };
    // Tear the newest slot as an interrupted write would (its epoch was never granted then).
    let o = lease::epoch::slot_offset(newest) as usize;
    bytes[o..o + lease::epoch::SLOT_LEN].fill(0xff);
    std::fs::write(&path, &bytes).unwrap();
    assert_eq!(lease::read_epoch(&sd).unwrap(), 2);
    // The owner record of epoch 3 is gone too (a power loss takes unsynced records).
    std::fs::remove_file(dir.join(".tenure/owner.json")).unwrap();
    assert_eq!(one_run(&sd), 3);
    let after = std::fs::read(&path).unwrap();
    assert_eq!(
        lease::epoch::decode(&after),
        Ok(lease::epoch::Stored::Slots { epoch: 3, newest })
    );
}

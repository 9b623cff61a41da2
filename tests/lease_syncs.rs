//! Issue 11: the syncs of the lease, counted through privfs's operation recorder (feature
//! `failpoints`). The lease is driven in-process through the library, as the runner drives it
//! (acquire, register the child, phase updates, unregister, release), on real files in a temp
//! dir; the recorder sees every fsync, fdatasync, directory fsync and syncfs that privfs makes.
//!
//! The durability principle (spec/lifecycle.md, "Durability"): only the epoch must outlive a
//! power loss on a run that publishes nothing, and it is made durable in batches: one
//! fdatasync of the epoch file per reservation of epochs (written in place, no temp file, no
//! rename, no directory sync), none for an epoch within the reservation this boot made
//! durable (`src/lease/epoch.rs`). The owner
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

/// Asserts that `ops` hold no sync at all, and that the epoch was written in place into
/// `.tenure/epoch` (its scratch slot): no temp file, no rename, no directory sync.
fn no_sync(ops: &[Op], control: &Path) {
    let s = syncs(ops);
    println!("syncs: {s:#?}");
    assert!(
        s.is_empty(),
        "an acquisition within the session's reservation syncs nothing: {s:#?}"
    );
    assert!(
        ops.iter()
            .any(|o| o.kind == OpKind::Write && o.dir == control && o.name == "epoch"),
        "the epoch is written in place: {ops:#?}"
    );
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

/// The epoch file's slots.
fn batched(dir: &Path) -> lease::epoch::Batched {
    let bytes = std::fs::read(dir.join(".tenure/epoch")).unwrap();
    match lease::epoch::decode(&bytes) {
        Ok(lease::epoch::Stored::Batched(b)) => b,
        other => panic!("not in the current format: {other:?}"),
    }
}

/// Asserts that the epoch file was replaced whole, durably: its temp file fdatasynced and the
/// control folder synced after the rename — two syncs in all.
fn replaced_whole(ops: &[Op], control: &Path) {
    let s = syncs(ops);
    println!("syncs: {s:#?}");
    assert_eq!(s.len(), 2, "the file is replaced durably, once: {s:#?}");
    assert!(
        ops.iter()
            .any(|o| o.kind == OpKind::Rename && o.dir == control && o.name == "epoch"),
        "{ops:#?}"
    );
}

/// Issue 11: once the dir exists, a run that publishes nothing syncs nothing: its epoch is
/// within the reservation this boot made durable (the first run of a dir makes its new
/// folders, marker and epoch file durable).
#[test]
fn run_without_publish_syncs_nothing() {
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
        "the first run syncs the new folders, the marker and the epoch file, once: {:#?}",
        syncs(&first)
    );

    tenure::privfs::start_recording();
    assert_eq!(one_run(&sd), 2);
    let ops = tenure::privfs::take_recording_under(&dir);
    no_sync(&ops, &dir.join(".tenure"));
    assert_eq!(lease::read_epoch(&sd).unwrap(), 2);
}

/// Issue 11: a run that publishes adds the checkpoint's syncs (the store's business) and
/// none in the control folder.
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
    no_sync(&in_control, &control);
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

/// Issue 11: a handoff — a waiter woken by the owner's release — costs no sync, in the
/// waiter or in the release.
#[test]
fn handoff_syncs_nothing() {
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
    no_sync(&ops, &dir.join(".tenure"));
}

/// Issue 11: the acquisition that runs past the reservation makes a new one durable: one
/// fdatasync of the epoch file, written in place into the other reservation slot (no
/// rename); the ones after it sync nothing again.
#[test]
fn a_new_reservation_costs_one_fdatasync() {
    let _one = serial();
    let t = private_tempdir();
    let dir = t.path().join("state");
    let sd = StateDir::open(&dir, true).unwrap();
    let batch = lease::epoch::BATCH;
    for want in 1..=batch {
        assert_eq!(one_run(&sd), want);
    }
    let control = dir.join(".tenure");
    tenure::privfs::start_recording();
    assert_eq!(one_run(&sd), batch + 1);
    let ops = tenure::privfs::take_recording_under(&dir);
    let s = syncs(&ops);
    assert_eq!(s.len(), 1, "one fdatasync for the new reservation: {s:#?}");
    let fsync = ops
        .iter()
        .position(|o| o.kind == OpKind::Fsync)
        .expect("the reservation is fdatasynced");
    assert!(
        ops[fsync].dir == control && ops[fsync].name == "epoch",
        "{s:#?}"
    );
    assert!(
        !ops.iter()
            .any(|o| o.kind == OpKind::Rename && o.name == "epoch"),
        "{ops:#?}"
    );
    let b = batched(&dir);
    let highs: Vec<u64> = b.reserved.iter().flatten().map(|r| r.high).collect();
    assert_eq!(highs, vec![batch, 2 * batch], "{b:?}");
    assert_eq!(
        b.scratch.map(|s| (s.epoch, s.high)),
        Some((batch + 1, 2 * batch))
    );

    tenure::privfs::start_recording();
    assert_eq!(one_run(&sd), batch + 2);
    no_sync(&tenure::privfs::take_recording_under(&dir), &control);
}

/// Issue 11: a scratch slot another session wrote (another boot: a power loss may have taken
/// its later, unsynced writes) is not trusted: the next epoch is above the highest
/// reservation, made durable in a whole new file. A torn scratch slot is treated the same.
#[test]
fn another_boot_starts_above_the_reservation() {
    let _one = serial();
    let t = private_tempdir();
    let dir = t.path().join("state");
    let sd = StateDir::open(&dir, true).unwrap();
    for want in 1..=3 {
        assert_eq!(one_run(&sd), want);
    }
    let path = dir.join(".tenure/epoch");
    let control = dir.join(".tenure");
    // What the disk can hold after a power loss: the scratch slot of the last boot, older than
    // the epoch handed out last.
    let mut b = batched(&dir);
    let mut old = b.scratch.unwrap();
    old.epoch = 1;
    old.session.boot = [0xb0; 16];
    b.scratch = Some(old);
    std::fs::write(&path, lease::epoch::encode_batched(&b)).unwrap();
    std::fs::remove_file(dir.join(".tenure/owner.json")).unwrap();
    tenure::privfs::start_recording();
    let batch = lease::epoch::BATCH;
    assert_eq!(one_run(&sd), batch + 1);
    replaced_whole(&tenure::privfs::take_recording_under(&dir), &control);
    tenure::privfs::start_recording();
    assert_eq!(one_run(&sd), batch + 2);
    no_sync(&tenure::privfs::take_recording_under(&dir), &control);

    // A torn scratch slot: the same.
    let mut bytes = std::fs::read(&path).unwrap();
    let o = lease::epoch::SCRATCH_OFFSET as usize;
    bytes[o..o + lease::epoch::SLOT_LEN].fill(0xff);
    std::fs::write(&path, &bytes).unwrap();
    assert_eq!(one_run(&sd), 2 * batch + 1);
}

/// Issue 11, migration: a dir whose epoch file an older tenure wrote — `<decimal>\n`, or the
/// two-slot format of the first issue 11 tenure — is read as before; the next acquisition
/// replaces it once with the current format (temp file, fdatasync, rename, one sync of the
/// control folder), and the acquisitions after that sync nothing.
#[test]
fn older_epoch_files_are_upgraded_once() {
    use std::os::unix::fs::PermissionsExt;
    let _one = serial();
    let t = private_tempdir();
    let dir = t.path().join("state");
    let sd = StateDir::open(&dir, true).unwrap();
    assert_eq!(one_run(&sd), 1);
    let path = dir.join(".tenure/epoch");
    let control = dir.join(".tenure");
    for (older, want) in [
        (b"41\n".to_vec(), 41),
        (lease::epoch::encode(50, Some(49)), 50),
    ] {
        std::fs::remove_file(&path).unwrap();
        std::fs::write(&path, &older).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert_eq!(lease::read_epoch(&sd).unwrap(), want);

        tenure::privfs::start_recording();
        assert_eq!(one_run(&sd), want + 1);
        replaced_whole(&tenure::privfs::take_recording_under(&dir), &control);
        let bytes = std::fs::read(&path).unwrap();
        assert_eq!(bytes.len() as u64, lease::epoch::FILE_LEN);
        let b = batched(&dir);
        assert_eq!(b.scratch.map(|s| s.epoch), Some(want + 1));

        tenure::privfs::start_recording();
        assert_eq!(one_run(&sd), want + 2);
        no_sync(&tenure::privfs::take_recording_under(&dir), &control);
        assert_eq!(lease::read_epoch(&sd).unwrap(), want + 2);
    }
}

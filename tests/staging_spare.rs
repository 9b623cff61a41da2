//! The one empty staging area kept between ownerships (issue 11, `staging/.spare`): a clean
//! discard parks an empty area instead of removing it, the next staging area is that directory
//! renamed, and whatever else is found under the spare's name — files a previous ownership or
//! anybody else left in it, a link, a file, a directory that is not private — is never handed to
//! a writer as its own output (card P1: what is published or kept is what this ownership's
//! writer left; a successor starts from an empty area). Real files in temp dirs.

mod checkpoint_support;

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;

use checkpoint_support::*;
use tenure::checkpoint::{CheckpointStore, Published};

fn entries(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    v.sort();
    v
}

fn ino(p: &Path) -> u64 {
    std::fs::symlink_metadata(p).unwrap().ino()
}

/// An empty area is parked as `.spare` and becomes the next area (the same directory, renamed:
/// nothing made, nothing removed); an area with files in it is removed as before, and only one
/// spare is kept.
#[test]
fn an_empty_area_is_parked_and_handed_out_again() {
    let fx = Fixture::new(1);
    let sd = fx.open();
    let store = CheckpointStore::open_owned(&sd, opts()).unwrap();
    let staging_dir = fx.store_dir().join("staging");
    let first = store.staging().unwrap();
    let first_ino = ino(first.path());
    store.discard_staging(first).unwrap();
    assert_eq!(entries(&staging_dir), vec![".spare"]);
    assert_eq!(ino(&staging_dir.join(".spare")), first_ino);

    let second = store.staging().unwrap();
    assert_eq!(
        ino(second.path()),
        first_ino,
        "the spare is renamed into place"
    );
    assert_eq!(entries(&staging_dir).len(), 1);
    assert!(entries(second.path()).is_empty());
    // Two areas at once: the second is made (there is no spare any more).
    let third = store.staging().unwrap();
    assert_ne!(ino(third.path()), first_ino);
    std::fs::write(third.path().join("out"), b"x").unwrap();
    store.discard_staging(second).unwrap();
    store.discard_staging(third).unwrap();
    assert_eq!(
        entries(&staging_dir),
        vec![".spare"],
        "a non-empty area is removed"
    );
    assert_eq!(ino(&staging_dir.join(".spare")), first_ino);

    // An empty area while a spare is parked already is removed, not parked twice.
    let a = store.staging().unwrap();
    let b = store.staging().unwrap();
    store.discard_staging(a).unwrap();
    store.discard_staging(b).unwrap();
    assert_eq!(entries(&staging_dir), vec![".spare"]);
}

/// The owned open's sweep leaves the spare alone (and removes every other leftover area); the
/// spare is still checked when it is handed out.
#[test]
fn the_sweep_keeps_the_spare_and_removes_the_rest() {
    let fx = Fixture::new(1);
    let sd = fx.open();
    {
        let store = CheckpointStore::open_owned(&sd, opts()).unwrap();
        let parked = store.staging().unwrap();
        store.discard_staging(parked).unwrap();
        // A crashed ownership's area, with its output.
        let left = store.staging().unwrap();
        std::fs::write(left.path().join("half"), b"x").unwrap();
        let again = store.staging().unwrap();
        store.discard_staging(again).unwrap();
    }
    let staging_dir = fx.store_dir().join("staging");
    assert_eq!(entries(&staging_dir).len(), 2);
    let _store = CheckpointStore::open_owned(&sd, opts()).unwrap();
    assert_eq!(entries(&staging_dir), vec![".spare"]);
}

/// Card P1: files found in the spare (a previous ownership's or anybody's) are never a new
/// writer's output — the spare is removed and a new empty area made; a spare that is a link
/// is unlinked and never followed; one that is a file, or a directory open to others, is
/// replaced too. Nothing outside the store is touched.
#[test]
fn a_spare_that_is_not_an_empty_private_directory_is_never_handed_out() {
    let fx = Fixture::new(1);
    let sd = fx.open();
    let store = CheckpointStore::open_owned(&sd, opts()).unwrap();
    let staging_dir = fx.store_dir().join("staging");
    let spare = staging_dir.join(".spare");
    let outside = fx.tmp.path().join("outside");
    std::fs::create_dir(&outside).unwrap();
    std::fs::write(outside.join("keep"), b"mine").unwrap();

    std::fs::create_dir(&staging_dir).unwrap();
    std::fs::set_permissions(&staging_dir, std::fs::Permissions::from_mode(0o700)).unwrap();
    // Leftover output in the spare.
    std::fs::create_dir(&spare).unwrap();
    std::fs::set_permissions(&spare, std::fs::Permissions::from_mode(0o700)).unwrap();
    std::fs::create_dir(spare.join("sub")).unwrap();
    std::fs::write(spare.join("sub/old-output"), b"previous").unwrap();
    let s = store.staging().unwrap();
    assert!(entries(s.path()).is_empty(), "{:?}", entries(s.path()));
    assert_eq!(
        entries(&staging_dir).len(),
        1,
        "{:?}",
        entries(&staging_dir)
    );
    // What is published from the new area is what the writer wrote, nothing else.
    std::fs::write(s.path().join("new"), b"fresh").unwrap();
    assert!(matches!(
        store.publish(1, &s).unwrap(),
        Published::New { .. }
    ));
    let cp = store.load().unwrap().unwrap();
    assert_eq!(
        contents(&store, &cp),
        vec![("new".into(), b"fresh".to_vec())]
    );
    store.discard_staging(s).unwrap();
    assert!(
        !spare.exists(),
        "an area with files in it is removed, not parked"
    );

    // A link to a directory outside the store.
    std::os::unix::fs::symlink(&outside, &spare).unwrap();
    let s = store.staging().unwrap();
    assert!(entries(s.path()).is_empty());
    assert!(std::fs::symlink_metadata(s.path()).unwrap().is_dir());
    assert_eq!(std::fs::read(outside.join("keep")).unwrap(), b"mine");
    assert_eq!(entries(&outside), vec!["keep"]);
    store.discard_staging(s).unwrap();
    std::fs::remove_dir(&spare).unwrap();

    // A regular file.
    std::fs::write(&spare, b"not a directory").unwrap();
    let s = store.staging().unwrap();
    assert!(std::fs::symlink_metadata(s.path()).unwrap().is_dir());
    assert!(entries(s.path()).is_empty());
    store.discard_staging(s).unwrap();
    std::fs::remove_dir(&spare).unwrap();

    // A directory others may write into.
    std::fs::create_dir(&spare).unwrap();
    std::fs::set_permissions(&spare, std::fs::Permissions::from_mode(0o777)).unwrap();
    let s = store.staging().unwrap();
    let mode = std::fs::metadata(s.path()).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o700);
    assert_eq!(
        entries(&staging_dir).len(),
        1,
        "{:?}",
        entries(&staging_dir)
    );
}

/// An area whose mode the writer opened to others is removed, not parked (a spare is always
/// private).
#[test]
fn a_permissive_area_is_removed_not_parked() {
    let fx = Fixture::new(1);
    let sd = fx.open();
    let store = CheckpointStore::open_owned(&sd, opts()).unwrap();
    let s = store.staging().unwrap();
    std::fs::set_permissions(s.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    store.discard_staging(s).unwrap();
    assert!(entries(&fx.store_dir().join("staging")).is_empty());
}

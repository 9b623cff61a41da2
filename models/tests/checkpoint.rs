//! The checkpoint crash model (invariants I12–I14) with a pinned state count, every checkpoint
//! mutant killed, and the deduplication weakness the model found.

use stateright::{Checker, Model};
use tenure_models::catalog::{self, Which};
use tenure_models::checkpoint::{CURRENT_VALID_AFTER_CRASH, CheckpointModel, Mutation};
use tenure_models::run::{self, Describe};

/// I12–I14 hold over four runs with two crashes at any file operation (any subset of the
/// un-fsynced directory operations and file data surviving) and one corruption of a file of the
/// current checkpoint, for `keep` = 1 and 2. Every `sometimes` is reached: a crash keeps the old
/// checkpoint, a crash keeps the new one, the GC deletes, a shared blob is deduplicated, a
/// corrupt checkpoint is refused, three runs publish.
#[test]
fn checkpoint_model() {
    catalog::check_pinned("checkpoint");
}

/// Found by this model (and fixed in the store): reusing an existing blob by name and size
/// without reading it lets a corrupted blob left behind by a crashed publish into the next
/// checkpoint, which is acknowledged and then refused by the load. Verifying the digest of a
/// blob before reusing it (and failing the publish on a mismatch, never rewriting it) closes
/// the hole; the CI configuration models the store as built, with the check.
#[test]
fn corrupted_leftover_blob_poisons_dedup_unless_verified() {
    let mut m = CheckpointModel::ci();
    m.corrupt_orphans = true;
    m.dedup_verifies_digest = false;
    let property = m.property(CURRENT_VALID_AFTER_CRASH);
    let path = run::shortest(&m, 5_000_000, |s| !(property.condition)(&m, s))
        .expect("the as-built dedup lets a corrupted leftover blob into a checkpoint");
    println!("counterexample, {} steps:", path.len() - 1);
    for line in m.describe(&path) {
        println!("    {line}");
    }
    m.dedup_verifies_digest = true;
    m.checker().spawn_bfs().join().assert_properties();
}

fn killed(mutation: Mutation) {
    catalog::assert_killed(Which::Checkpoint, mutation.name());
}

/// I12: without the blob directory's fsync, CURRENT can name a blob that vanished.
#[test]
fn mutant_skip_blob_dir_fsync() {
    killed(Mutation::SkipBlobDirFsync);
}

/// I12 (cards G4, L1): renaming CURRENT's temp before its fsync can leave CURRENT empty.
#[test]
fn mutant_rename_current_before_fsync() {
    killed(Mutation::RenameCurrentBeforeFsync);
}

/// I13: collecting before CURRENT's directory is synced.
#[test]
fn mutant_gc_before_dir_fsync() {
    killed(Mutation::GcBeforeDirFsync);
}

/// I13: collecting a blob a kept checkpoint shares.
#[test]
fn mutant_gc_ignores_sharing() {
    killed(Mutation::GcIgnoresSharing);
}

/// I14 (cards L8–L10): a load that repairs CURRENT.
#[test]
fn mutant_repair_on_load() {
    killed(Mutation::RepairOnLoad);
}

/// I14: a load that does not check blob digests accepts a corrupt checkpoint.
#[test]
fn mutant_skip_blob_digest() {
    killed(Mutation::SkipBlobDigest);
}

//! The mutants of the checkpoint store (src/checkpoint/): each plants one plausible bug in the
//! store's real plans with `tenure::mutant::scoped` and asserts that a checkpoint-model property
//! fails for it (the mutation table in models/README.md). They live in a test binary of their
//! own because the planted mutant is process-wide; the selection hands it to one test at a time.

use tenure_models::catalog;

fn killed(name: &str) {
    catalog::assert_src_killed(name);
}

/// Every catalogued store mutant has a test here.
#[test]
fn every_store_mutant_has_a_test() {
    let here = include_str!("mutants_store.rs");
    for m in catalog::src_mutants() {
        if m.place.starts_with("src/checkpoint/") {
            assert!(
                here.contains(&format!("killed(\"{}\")", m.name)),
                "no test for src mutant {}",
                m.name
            );
        }
    }
}

/// I12 (cards G4, L1): acknowledged before the new CURRENT's directory entry is durable; a
/// power loss brings the old pointer back after the ack.
#[test]
fn current_rename_not_synced() {
    killed("current-rename-not-synced");
}

/// I12: CURRENT names a manifest whose directory entry a power loss can drop.
#[test]
fn manifest_dir_not_synced() {
    killed("manifest-dir-not-synced");
}

/// I12, issue 11: without the batch's syncfs the new blobs' and the manifest's data are not
/// durable when CURRENT names them.
#[test]
fn batch_sync_skipped() {
    killed("batch-sync-skipped");
}

/// I12, issue 11: a large blob counted as synced by its own fsync that never ran; with no
/// `syncfs` in the batch, its data is not durable when CURRENT names it.
#[test]
fn own_blob_fsync_skipped() {
    killed("own-blob-fsync-skipped");
}

/// Issue 11: a staged file adopted while another process still holds it open for writing;
/// that process's late write alters a blob the checkpoint names.
#[test]
fn adopt_ignores_writer() {
    killed("adopt-ignores-writer");
}

/// I17, issue 11: a blob named before its data is durable survives power loss empty under its
/// digest's name, and the successor's publish fails on it.
#[test]
fn blobs_named_before_batch_sync() {
    killed("blobs-named-before-batch-sync");
}

/// I13: the GC deletes the old checkpoint while a power loss can still bring its CURRENT back.
#[test]
fn gc_before_current_sync() {
    killed("gc-before-current-sync");
}

/// I13: the GC policy deletes the manifest CURRENT names.
#[test]
fn gc_deletes_current() {
    killed("gc-deletes-current");
}

/// I14 (cards L8–L10): the load accepts a blob of the right size with the wrong digest.
#[test]
fn load_accepts_digest_mismatch() {
    killed("load-accepts-digest-mismatch");
}

/// I12: deduplication reuses a corrupted blob a crashed publish left behind, and the
/// acknowledged checkpoint names it.
#[test]
fn dedup_trusts_existing_blob() {
    killed("dedup-trusts-existing-blob");
}

/// I3: an owner one epoch behind publishes.
#[test]
fn fence_off_by_one() {
    killed("fence-off-by-one");
}

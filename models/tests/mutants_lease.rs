//! The mutants of the lease plans (src/lease/plan.rs) and the fence (src/lease/epoch.rs): each
//! plants one plausible bug in the real code with `tenure::mutant::scoped` and asserts that a
//! lease model property fails for it, the model running the very plans on the crash filesystem
//! (the mutation table in models/README.md). A test binary of their own: the planted mutant is
//! process-wide.

use tenure_models::catalog;

fn killed(name: &str) {
    catalog::assert_src_killed(name);
}

/// Every catalogued lease mutant has a test here.
#[test]
fn every_lease_mutant_has_a_test() {
    let here = include_str!("mutants_lease.rs");
    for m in catalog::src_mutants() {
        // The cluster world's mutant of `fenced_epoch` is tested in tests/cluster_mutants.rs.
        if m.place.starts_with("src/lease/") && m.model == catalog::Which::Lease {
            assert!(
                here.contains(&format!("killed(\"{}\")", m.name)),
                "no test for src mutant {}",
                m.name
            );
        }
    }
}

/// I2 (cards H5, L4): a takeover that continues the crashed owner's epoch hands it out twice.
#[test]
fn no_epoch_bump_on_takeover() {
    killed("lease-no-epoch-bump-on-takeover");
}

/// I2 (card P3): an epoch derived from a rewound epoch file alone repeats one the dir recorded.
#[test]
fn epoch_file_only() {
    killed("lease-epoch-file-only");
}

/// I2 (issue 11): an epoch of a new reservation handed out before the reservation's
/// fdatasync; a power loss takes the reservation back and a successor hands the epoch out
/// again.
#[test]
fn epoch_not_synced() {
    killed("lease-epoch-not-synced");
}

/// Issue 11: an epoch slot taken without checking its checksum: a power loss that tore the
/// in-place write leaves garbage that reads as the largest epoch, and the successor refuses.
#[test]
fn epoch_slot_unchecked() {
    killed("lease-epoch-slot-unchecked");
}

/// I17 (issue 11): the owner record is written in place without a sync; a reader that trusts
/// its slot without the checksum takes a slot a power loss tore for a corrupt record.
#[test]
fn owner_slot_unchecked() {
    killed("lease-owner-slot-unchecked");
}

/// I2 (issue 11): the epoch file's scratch slot, never synced, trusted after a power loss: it
/// can be older than an epoch already handed out, and that epoch is handed out again.
#[test]
fn epoch_session_unchecked() {
    killed("lease-epoch-session-unchecked");
}

/// Issue 11: an epoch file renamed into place without its data synced is empty after a power
/// loss, and the successor refuses the dir.
#[test]
fn epoch_data_unsynced() {
    killed("lease-epoch-data-unsynced");
}

/// Issue 11, card L7: the successor trusts the marker, so it must outlive a power loss; one
/// renamed into place unsynced is empty after it, and the dir is refused.
#[test]
fn marker_not_synced() {
    killed("lease-marker-not-synced");
}

/// Issue 11: the owner record is never synced, so a power loss can empty it; a successor that
/// refuses an empty record as corrupt never starts again.
#[test]
fn empty_record_refused() {
    killed("lease-empty-record-refused");
}

/// Card L7: an acquisition that writes a fresh marker changes the dir's identity.
#[test]
fn marker_every_acquisition() {
    killed("lease-marker-every-acquisition");
}

/// I5 (card L3): a cancelled waiter that leaves its entry behind.
#[test]
fn waiter_left_on_cancel() {
    killed("lease-waiter-left-on-cancel");
}

/// I7 (card T2): a successor that does not end the crashed owner's recorded cgroup runs its
/// workload beside the leftover.
#[test]
fn skip_leftovers() {
    killed("lease-skip-leftovers");
}

/// I7 (card T2): ending the recorded cgroup after replacing the record loses it when that
/// successor crashes in between (the bug the model found in the first implementation).
#[test]
fn leftovers_after_record() {
    killed("lease-leftovers-after-record");
}

//! Garbage-collection policy: which manifests and blobs a publish may delete once it has been
//! acknowledged.
//!
//! The policy is a pure function of what the directory holds, so it is tested without files.
//! It keeps the checkpoint `CURRENT` names and its ancestors up to `keep` checkpoints in all,
//! following parent links; it deletes every other well-formed manifest, and every blob that no
//! kept manifest lists. It deletes nothing it does not understand: a manifest file that does not
//! parse is left alone, and if any *kept* manifest cannot be read no blob is deleted at all,
//! because the blobs it lists cannot be known.

use std::collections::BTreeMap;

use super::format::{CheckpointId, Digest};

/// Default number of checkpoints kept: the current one and its parent.
pub const DEFAULT_KEEP: usize = 2;

/// Which manifests the GC keeps and deletes, in the order it must delete: manifests first, so
/// that a crash in the middle of a GC never leaves a manifest whose blobs are gone. The blobs
/// to delete are those no kept manifest names ([`is_garbage`]).
#[derive(Debug, Default, Clone, PartialEq, Eq, Hash)]
pub struct Plan {
    /// The checkpoints kept, newest first.
    pub kept: Vec<CheckpointId>,
    /// Manifests to delete.
    pub manifests: Vec<CheckpointId>,
    /// True when no blob may be deleted because a kept manifest could not be read.
    pub blobs_skipped: bool,
}

/// How a manifest file in `manifests/` looked to the collector (its header only).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Seen {
    /// Its header parsed; its id matched its file name.
    Valid {
        /// The parent it names.
        parent: Option<CheckpointId>,
    },
    /// It did not parse, or its id disagreed with its file name.
    Unreadable,
}

/// Computes which manifests to keep and delete. `current` is the id in `CURRENT` (a GC runs
/// only right after a publish, so it is always present), `manifests` maps each well-named
/// manifest file to what its header held, and `keep` is at least 1.
pub fn plan(current: CheckpointId, manifests: &BTreeMap<CheckpointId, Seen>, keep: usize) -> Plan {
    let keep = keep.max(1);
    let mut kept = Vec::new();
    let mut blobs_skipped = false;
    let mut next = Some(current);
    while let Some(id) = next {
        if kept.len() == keep {
            break;
        }
        match manifests.get(&id) {
            Some(Seen::Valid { parent }) => {
                kept.push(id);
                next = *parent;
            }
            Some(Seen::Unreadable) => {
                // A kept manifest we cannot read may list any blob.
                kept.push(id);
                blobs_skipped = true;
                next = None;
            }
            None => next = None,
        }
    }
    let manifests_del = manifests
        .iter()
        .filter(|(id, seen)| {
            // A planted bug for the mutation table: the policy also deletes what CURRENT names.
            let current_too = crate::mutant::on("gc-deletes-current") && **id == current;
            matches!(seen, Seen::Valid { .. }) && (!kept.contains(id) || current_too)
        })
        .map(|(id, _)| *id)
        .collect();
    Plan {
        kept,
        manifests: manifests_del,
        blobs_skipped,
    }
}

/// The blobs the kept checkpoints name, as a sorted list of the first 8 bytes of each digest:
/// 8 bytes per file whatever the names, so a GC after a publish of a million files stays in a
/// few megabytes. A garbage blob whose prefix equals a referenced one is kept (one more file
/// until the next GC); a referenced blob is never taken for garbage.
#[derive(Debug, Default, Clone, PartialEq, Eq, Hash)]
pub struct Referenced {
    prefixes: Vec<u64>,
}

impl Referenced {
    /// Adds a digest a kept manifest names.
    pub fn add(&mut self, d: &Digest) {
        self.prefixes.push(prefix(d));
    }

    /// Sorts and deduplicates; call once after the last [`Referenced::add`].
    pub fn seal(&mut self) {
        self.prefixes.sort_unstable();
        self.prefixes.dedup();
    }
}

fn prefix(d: &Digest) -> u64 {
    let mut b = [0u8; 8];
    b.copy_from_slice(&d.0[..8]);
    u64::from_be_bytes(b)
}

/// Whether a blob may be deleted: no kept manifest names a digest with its prefix.
pub fn is_garbage(referenced: &Referenced, d: &Digest) -> bool {
    referenced.prefixes.binary_search(&prefix(d)).is_err()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

    fn id(n: u64) -> CheckpointId {
        CheckpointId::new(n).unwrap()
    }

    fn m(parent: Option<u64>) -> Seen {
        Seen::Valid {
            parent: parent.map(id),
        }
    }

    #[test]
    fn keeps_current_and_parent_by_default() {
        let ms = BTreeMap::from([(id(1), m(None)), (id(2), m(Some(1))), (id(3), m(Some(2)))]);
        let p = plan(id(3), &ms, DEFAULT_KEEP);
        assert_eq!(p.kept, vec![id(3), id(2)]);
        assert_eq!(p.manifests, vec![id(1)]);
        assert!(!p.blobs_skipped);
    }

    #[test]
    fn orphans_of_a_crashed_publish_are_collected() {
        // Manifest 3 was renamed into place but CURRENT still named 2 when the owner died; the
        // next owner published 4 with 2 as parent.
        let ms = BTreeMap::from([(id(2), m(None)), (id(3), m(Some(2))), (id(4), m(Some(2)))]);
        let p = plan(id(4), &ms, 2);
        assert_eq!(p.kept, vec![id(4), id(2)]);
        assert_eq!(p.manifests, vec![id(3)]);
    }

    #[test]
    fn unreadable_manifests_are_never_deleted() {
        let ms = BTreeMap::from([
            (id(1), Seen::Unreadable),
            (id(2), m(None)),
            (id(3), m(Some(2))),
        ]);
        let p = plan(id(3), &ms, 1);
        assert_eq!(p.kept, vec![id(3)]);
        assert_eq!(p.manifests, vec![id(2)]);
    }

    #[test]
    fn an_unreadable_kept_manifest_stops_blob_deletion() {
        let ms = BTreeMap::from([
            (id(1), m(None)),
            (id(2), Seen::Unreadable),
            (id(3), m(Some(2))),
        ]);
        let p = plan(id(3), &ms, 3);
        assert_eq!(p.kept, vec![id(3), id(2)]);
        assert!(p.blobs_skipped);
        assert_eq!(p.manifests, vec![id(1)], "1 is not reachable from CURRENT");
    }

    #[test]
    fn keep_zero_is_treated_as_one_and_a_missing_parent_ends_the_chain() {
        let ms = BTreeMap::from([(id(5), m(Some(4)))]);
        let p = plan(id(5), &ms, 0);
        assert_eq!(p.kept, vec![id(5)]);
        assert!(p.manifests.is_empty());
        let p = plan(id(5), &ms, 10);
        assert_eq!(p.kept, vec![id(5)]);
    }

    #[test]
    fn a_referenced_blob_is_never_garbage() {
        let mut r = Referenced::default();
        let refd: BTreeSet<Digest> = (0..50u8).map(|b| Digest([b; 32])).collect();
        for d in &refd {
            r.add(d);
        }
        r.seal();
        for b in 0..=255u8 {
            let d = Digest([b; 32]);
            assert_eq!(is_garbage(&r, &d), !refd.contains(&d), "{b}");
        }
        // A garbage blob sharing a referenced prefix is kept, never the reverse.
        let mut twin = [0u8; 32];
        twin[..8].copy_from_slice(&[7; 8]);
        assert!(!is_garbage(&r, &Digest(twin)));
    }
}

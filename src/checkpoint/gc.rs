//! Garbage-collection policy: which manifests and blobs a publish may delete once it has been
//! acknowledged.
//!
//! The policy is a pure function of what the directory holds, so it is tested without files.
//! It keeps the checkpoint `CURRENT` names and its ancestors up to `keep` checkpoints in all,
//! following parent links; it deletes every other well-formed manifest, and every blob that no
//! kept manifest lists. It deletes nothing it does not understand: a manifest file that does not
//! parse is left alone, and if any *kept* manifest cannot be read no blob is deleted at all,
//! because the blobs it lists cannot be known.

use std::collections::{BTreeMap, BTreeSet};

use super::format::{CheckpointId, Digest, Manifest};

/// Default number of checkpoints kept: the current one and its parent.
pub const DEFAULT_KEEP: usize = 2;

/// What the GC may delete, in the order it must delete it: manifests first, so that a crash in
/// the middle of a GC never leaves a manifest whose blobs are gone.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Plan {
    /// The checkpoints kept, newest first.
    pub kept: Vec<CheckpointId>,
    /// Manifests to delete.
    pub manifests: Vec<CheckpointId>,
    /// Blobs to delete.
    pub blobs: Vec<Digest>,
    /// True when blob deletion was skipped because a kept manifest could not be read.
    pub blobs_skipped: bool,
}

/// How a manifest file in `manifests/` looked to the collector.
#[derive(Debug, Clone)]
pub enum Seen {
    /// It parsed and validated; its id matched its file name.
    Valid(Manifest),
    /// It did not parse, or its id disagreed with its file name.
    Unreadable,
}

/// Computes what to delete. `current` is the id in `CURRENT` (a GC runs only right after a
/// publish, so it is always present), `manifests` maps each well-named manifest file to what it
/// held, `blobs` lists the blob files present, and `keep` is at least 1.
pub fn plan(
    current: CheckpointId,
    manifests: &BTreeMap<CheckpointId, Seen>,
    blobs: &BTreeSet<Digest>,
    keep: usize,
) -> Plan {
    let keep = keep.max(1);
    let mut kept = Vec::new();
    let mut referenced = BTreeSet::new();
    let mut blobs_skipped = false;
    let mut next = Some(current);
    while let Some(id) = next {
        if kept.len() == keep {
            break;
        }
        match manifests.get(&id) {
            Some(Seen::Valid(m)) => {
                kept.push(id);
                referenced.extend(m.entries.iter().map(|e| e.sha256));
                next = m.parent;
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
        .filter(|(id, seen)| matches!(seen, Seen::Valid(_)) && !kept.contains(id))
        .map(|(id, _)| *id)
        .collect();
    let blobs_del = if blobs_skipped {
        Vec::new()
    } else {
        blobs.difference(&referenced).copied().collect()
    };
    Plan {
        kept,
        manifests: manifests_del,
        blobs: blobs_del,
        blobs_skipped,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checkpoint::format::Entry;

    fn id(n: u64) -> CheckpointId {
        CheckpointId::new(n).unwrap()
    }

    fn m(n: u64, parent: Option<u64>, blobs: &[u8]) -> Seen {
        Seen::Valid(Manifest {
            format: 1,
            id: id(n),
            parent: parent.map(id),
            epoch: 1,
            created_at_ms: 0,
            entries: blobs
                .iter()
                .enumerate()
                .map(|(i, b)| Entry {
                    name: format!("f{i}"),
                    size: 1,
                    sha256: Digest([*b; 32]),
                    mode: 0o600,
                })
                .collect(),
        })
    }

    fn blobs(bs: &[u8]) -> BTreeSet<Digest> {
        bs.iter().map(|b| Digest([*b; 32])).collect()
    }

    #[test]
    fn keeps_current_and_parent_by_default() {
        let ms = BTreeMap::from([
            (id(1), m(1, None, &[1, 2])),
            (id(2), m(2, Some(1), &[2, 3])),
            (id(3), m(3, Some(2), &[3, 4])),
        ]);
        let p = plan(id(3), &ms, &blobs(&[1, 2, 3, 4, 9]), DEFAULT_KEEP);
        assert_eq!(p.kept, vec![id(3), id(2)]);
        assert_eq!(p.manifests, vec![id(1)]);
        assert_eq!(p.blobs, blobs(&[1, 9]).into_iter().collect::<Vec<_>>());
        assert!(!p.blobs_skipped);
    }

    #[test]
    fn orphans_of_a_crashed_publish_are_collected() {
        // Manifest 3 was renamed into place but CURRENT still names 2 when the owner died; the
        // next owner published 3 again... or here 4 after adopting 2 as parent.
        let ms = BTreeMap::from([
            (id(2), m(2, None, &[2])),
            (id(3), m(3, Some(2), &[7])),
            (id(4), m(4, Some(2), &[4])),
        ]);
        let p = plan(id(4), &ms, &blobs(&[2, 4, 7]), 2);
        assert_eq!(p.kept, vec![id(4), id(2)]);
        assert_eq!(p.manifests, vec![id(3)]);
        assert_eq!(p.blobs, vec![Digest([7; 32])]);
    }

    #[test]
    fn unreadable_manifests_are_never_deleted() {
        let ms = BTreeMap::from([
            (id(1), Seen::Unreadable),
            (id(2), m(2, None, &[2])),
            (id(3), m(3, Some(2), &[3])),
        ]);
        let p = plan(id(3), &ms, &blobs(&[1, 2, 3]), 1);
        assert_eq!(p.kept, vec![id(3)]);
        assert_eq!(p.manifests, vec![id(2)]);
        assert_eq!(p.blobs, blobs(&[1, 2]).into_iter().collect::<Vec<_>>());
    }

    #[test]
    fn an_unreadable_kept_manifest_stops_blob_deletion() {
        let ms = BTreeMap::from([
            (id(1), m(1, None, &[1])),
            (id(2), Seen::Unreadable),
            (id(3), m(3, Some(2), &[3])),
        ]);
        let p = plan(id(3), &ms, &blobs(&[1, 3, 5]), 3);
        assert_eq!(p.kept, vec![id(3), id(2)]);
        assert!(p.blobs_skipped);
        assert!(p.blobs.is_empty());
        assert_eq!(p.manifests, vec![id(1)], "1 is not reachable from CURRENT");
    }

    #[test]
    fn keep_zero_is_treated_as_one_and_a_missing_parent_ends_the_chain() {
        let ms = BTreeMap::from([(id(5), m(5, Some(4), &[5]))]);
        let p = plan(id(5), &ms, &blobs(&[5]), 0);
        assert_eq!(p.kept, vec![id(5)]);
        assert!(p.blobs.is_empty() && p.manifests.is_empty());
        let p = plan(id(5), &ms, &blobs(&[5]), 10);
        assert_eq!(p.kept, vec![id(5)]);
    }
}

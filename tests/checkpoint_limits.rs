//! Card P2: publish accepts only what load accepts. A property test generates
//! staging trees at and past every limit — number of files, depth, name length, component
//! length, manifest size — and checks the round trip: what publish acknowledges, load (under
//! the same limits) returns byte for byte; what publish refuses, it refuses as a limit before
//! anything durable; and a tree within every limit is never refused.
//!
//! The limits are scaled down (a few files, a few levels) so that every boundary is reached in
//! milliseconds; they are the same `Limits` type the default store uses, and the default
//! values' own boundaries (256 levels, 4,096-byte names, 255-byte components) are checked in
//! `checkpoint::format`'s unit tests and through the runner in tests/runner_data.rs.

mod checkpoint_support;

use std::collections::BTreeSet;

use checkpoint_support::*;
use proptest::prelude::*;
use tenure::checkpoint::format::HEADER_LINE_MAX;
use tenure::checkpoint::{CheckpointError, CheckpointStore, Entry, Limits, Published};

/// A staging tree: file names (relative, `/`-separated) with their contents.
fn tree(limits: Limits) -> impl Strategy<Value = Vec<String>> {
    let component =
        proptest::string::string_regex(&format!("[a-c]{{1,{}}}", limits.max_component_len + 1))
            .unwrap();
    let name = proptest::collection::vec(component, 1..=limits.max_depth + 1)
        .prop_map(|parts| parts.join("/"));
    proptest::collection::vec(name, 0..=(limits.max_entries as usize + 2)).prop_map(|names| {
        // Drop names that would be both a file and a directory, keeping the first.
        let mut kept: Vec<String> = Vec::new();
        for n in names {
            let clash = kept.iter().any(|k| {
                k == &n || n.starts_with(&format!("{k}/")) || k.starts_with(&format!("{n}/"))
            });
            if !clash {
                kept.push(n);
            }
        }
        kept
    })
}

fn limits() -> impl Strategy<Value = Limits> {
    (1u64..=5, 1usize..=3, 1usize..=4, 3usize..=12, 0u64..=700).prop_map(
        |(entries, depth, component, name, extra)| Limits {
            max_entries: entries,
            max_depth: depth,
            max_name_len: name,
            max_component_len: component,
            max_manifest_bytes: HEADER_LINE_MAX + extra,
        },
    )
}

fn within(limits: &Limits, names: &[String]) -> bool {
    let bound: u64 = HEADER_LINE_MAX + names.iter().map(|n| Entry::line_bound(n)).sum::<u64>();
    names.len() as u64 <= limits.max_entries
        && bound <= limits.max_manifest_bytes
        && names.iter().all(|n| {
            n.len() <= limits.max_name_len
                && n.split('/').count() <= limits.max_depth
                && n.split('/').all(|c| c.len() <= limits.max_component_len)
        })
}

/// The descriptor count in `a_format1_checkpoint_1500_deep_still_loads_and_materialises` is
/// the whole process's: the other tests of this binary run on other threads and open files
/// meanwhile (it failed that way once under load), so every test here holds this lock.
static FD_QUIET: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn fd_quiet() -> std::sync::MutexGuard<'static, ()> {
    FD_QUIET
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn round_trip(limits: Limits, names: Vec<String>) -> Result<(), TestCaseError> {
    let _quiet = fd_quiet();
    let fx = Fixture::new(1);
    let sd = fx.open();
    let store = CheckpointStore::open_owned(&sd, opts())
        .unwrap()
        .with_limits(limits);
    let staging = store.staging().unwrap();
    for n in &names {
        let p = staging.path().join(n);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(&p, n.as_bytes()).unwrap();
    }
    let ok = within(&limits, &names);
    match store.publish(1, &staging) {
        Ok(Published::New { checkpoint, .. }) => {
            prop_assert!(
                ok,
                "accepted a tree past a limit: {names:?} under {limits:?}"
            );
            // Load, under the same limits, returns exactly what was staged.
            let ro = CheckpointStore::open(&sd, opts())
                .unwrap()
                .with_limits(limits);
            let loaded = ro.load().unwrap().expect("a checkpoint");
            prop_assert_eq!(loaded.summary(), checkpoint);
            let got: BTreeSet<(String, Vec<u8>)> = contents(&ro, &loaded).into_iter().collect();
            let want: BTreeSet<(String, Vec<u8>)> = names
                .iter()
                .map(|n| (n.clone(), n.as_bytes().to_vec()))
                .collect();
            prop_assert_eq!(got, want);
            let manifest = fx
                .store_dir()
                .join("manifests")
                .join(checkpoint.id.manifest_file_name());
            prop_assert!(std::fs::metadata(manifest).unwrap().len() <= limits.max_manifest_bytes);
            // And the streaming summary and the view agree.
            prop_assert_eq!(ro.load_summary().unwrap(), Some(checkpoint));
        }
        Ok(Published::Unchanged { current }) => {
            prop_assert!(names.is_empty(), "{names:?}");
            prop_assert_eq!(current, None);
        }
        Err(e) => {
            prop_assert!(
                !ok,
                "refused a tree within every limit: {e}\n{names:?} {limits:?}"
            );
            prop_assert!(
                matches!(
                    e,
                    CheckpointError::BadEntryName { .. } | CheckpointError::OverLimit { .. }
                ),
                "not a limit refusal: {e:?}"
            );
            // Refused before anything durable: no CURRENT, no manifest, no blob.
            prop_assert!(!fx.store_dir().join("CURRENT").exists());
            let blobs = std::fs::read_dir(fx.store_dir().join("blobs/sha256"))
                .unwrap()
                .count();
            prop_assert_eq!(blobs, 0, "{}", e);
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 160, ..ProptestConfig::default() })]

    /// Card P2: at and past every limit, publish accepts exactly what load accepts.
    #[test]
    fn p2_publish_accepts_only_what_load_accepts(
        (limits, names) in limits().prop_flat_map(|l| (Just(l), tree(l)))
    ) {
        round_trip(limits, names)?;
    }
}

/// The manifest-size limit exactly: a tree whose manifest bound equals the limit publishes
/// and loads; one byte less refuses it.
#[test]
fn p2_manifest_size_at_and_one_past_the_limit() {
    let names: Vec<String> = (0..5).map(|i| format!("file-{i}")).collect();
    let bound = HEADER_LINE_MAX + names.iter().map(|n| Entry::line_bound(n)).sum::<u64>();
    let at = Limits {
        max_manifest_bytes: bound,
        ..Limits::DEFAULT
    };
    round_trip(at, names.clone()).unwrap();
    let past = Limits {
        max_manifest_bytes: bound - 1,
        ..Limits::DEFAULT
    };
    round_trip(past, names).unwrap();
}

/// Old manifests still load: a format-1 manifest as earlier versions wrote it, for
/// a checkpoint 1,500 levels deep (deeper than today's publish limit, which did not exist
/// then), loads, verifies and is copied into a view with a bounded number of descriptors.
#[test]
fn a_format1_checkpoint_1500_deep_still_loads_and_materialises() {
    use sha2::Digest as _;
    let _quiet = fd_quiet();
    let fx = Fixture::new(1);
    let sd = fx.open();
    // Let the owned open create the store's directories.
    drop(CheckpointStore::open_owned(&sd, opts()).unwrap());
    let content = b"bottom\n";
    let digest: String = sha2::Sha256::digest(content)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let blob = fx.store_dir().join("blobs/sha256").join(&digest);
    std::fs::write(&blob, content).unwrap();
    let name = vec!["d"; 1500].join("/") + "/f";
    let legacy = serde_json::json!({
        "format": 1,
        "id": "00000000000000000001",
        "parent": null,
        "epoch": 1,
        "created_at_ms": 1_700_000_000_000u64,
        "entries": [{"name": name, "size": content.len(), "sha256": digest, "mode": 0o600}],
    });
    let mut bytes = serde_json::to_vec_pretty(&legacy).unwrap();
    bytes.push(b'\n');
    let manifest = fx.store_dir().join("manifests/00000000000000000001.json");
    std::fs::write(&manifest, &bytes).unwrap();
    let mdigest: String = sha2::Sha256::digest(&bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let current = fx.store_dir().join("CURRENT");
    std::fs::write(&current, format!("00000000000000000001 {mdigest}\n")).unwrap();
    use std::os::unix::fs::PermissionsExt;
    for p in [&blob, &manifest, &current] {
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o600)).unwrap();
    }
    let store = CheckpointStore::open_owned(&sd, opts()).unwrap();
    let s = store.load_summary().unwrap().unwrap();
    assert_eq!((s.files, s.bytes), (1, content.len() as u64));
    let fds = || std::fs::read_dir("/proc/self/fd").unwrap().count();
    let before = fds();
    let (_, view) = store.materialise_current().unwrap().unwrap();
    assert!(fds() <= before + 1, "the view left descriptors open");
    // Read the bottom file back one component at a time.
    let mut dir = std::fs::File::open(view.path()).unwrap();
    for _ in 0..1500 {
        let fd = rustix::fs::openat(
            &dir,
            "d",
            rustix::fs::OFlags::DIRECTORY | rustix::fs::OFlags::RDONLY,
            rustix::fs::Mode::empty(),
        )
        .unwrap();
        dir = std::fs::File::from(fd);
    }
    let f = rustix::fs::openat(
        &dir,
        "f",
        rustix::fs::OFlags::RDONLY,
        rustix::fs::Mode::empty(),
    )
    .unwrap();
    let mut got = Vec::new();
    use std::io::Read;
    std::fs::File::from(f).read_to_end(&mut got).unwrap();
    assert_eq!(got, content);
    store.remove_view(view).unwrap();
}

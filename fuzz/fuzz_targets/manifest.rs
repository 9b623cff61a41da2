//! `checkpoints/manifests/<id>.json`, both formats, through the streaming reader the store
//! uses, under the default limits and under tiny ones (so the limit checks are reached): no
//! panic, no unbounded allocation (the reader bounds lines and the file), and a manifest that
//! is accepted re-serialises (format 2) to bytes that parse to the same manifest.
#![no_main]
use libfuzzer_sys::fuzz_target;
use tenure::checkpoint::{Limits, Manifest, ManifestReader};

fn read_all(data: &[u8], limits: Limits) -> Option<Vec<tenure::checkpoint::Entry>> {
    let mut r = ManifestReader::new(data, limits).ok()?;
    let mut out = Vec::new();
    loop {
        match r.next_entry() {
            Ok(Some(e)) => out.push(e),
            Ok(None) => return Some(out),
            Err(_) => return None,
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let tiny = Limits {
        max_entries: 3,
        max_depth: 2,
        max_name_len: 16,
        max_component_len: 8,
        max_manifest_bytes: 4096,
    };
    let small = read_all(data, tiny);
    let full = read_all(data, Limits::DEFAULT);
    // What passes the tiny limits passes the default ones (limits are monotone).
    if let Some(entries) = &small {
        assert_eq!(full.as_ref(), Some(entries));
    }
    // Format 2 round-trips (a format-1 manifest may exceed limits format 2 enforces).
    if let Ok(m) = Manifest::parse(data)
        && m.format == 2
    {
        assert_eq!(Some(&m.entries), full.as_ref());
        let again = Manifest::parse(&m.to_bytes()).unwrap();
        assert_eq!(again.entries, m.entries);
        assert_eq!(
            (again.id, again.parent, again.epoch),
            (m.id, m.parent, m.epoch)
        );
    }
});

//! `.tenure/registry/{leases,instances}/...` entries and `checkpoints/failed/` names: the
//! record, and the epochs their names carry.
#![no_main]
use libfuzzer_sys::fuzz_target;
use tenure::checkpoint::{CheckpointId, failed_name};
use tenure::lease::record::{RegistryRecord, parse, registry_entry_epoch};

fuzz_target!(|data: &[u8]| {
    if let Ok(r) = parse::<RegistryRecord>(data) {
        let again: RegistryRecord = parse(&serde_json::to_vec(&r).unwrap()).unwrap();
        assert_eq!(again, r);
    }
    if let Ok(name) = std::str::from_utf8(data) {
        if let Some(e) = registry_entry_epoch(name) {
            assert_eq!(registry_entry_epoch(&format!("{e}.json")), Some(e));
        }
        if let Some((e, n)) = failed_name(name) {
            assert_eq!(failed_name(&format!("{e}.{n}")), Some((e, n)));
        }
        if let Some(id) = CheckpointId::from_manifest_file_name(name) {
            assert_eq!(id.manifest_file_name(), name);
        }
    }
});

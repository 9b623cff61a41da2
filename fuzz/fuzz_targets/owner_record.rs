//! `.tenure/owner.json`: any bytes are a record or a clear error, never a panic; a record that
//! parses serialises back to one that parses equal.
#![no_main]
use libfuzzer_sys::fuzz_target;
use tenure::lease::record::{OwnerRecord, parse_owner};

fuzz_target!(|data: &[u8]| {
    if let Ok(r) = parse_owner(data) {
        let again: OwnerRecord = parse_owner(&serde_json::to_vec(&r).unwrap()).unwrap();
        assert_eq!(again, r);
    }
});

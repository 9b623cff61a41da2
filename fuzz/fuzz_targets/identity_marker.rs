//! `.tenure/identity.json`: any bytes are a marker or a clear error; a marker round-trips.
#![no_main]
use libfuzzer_sys::fuzz_target;
use tenure::lease::record::parse_marker;

fuzz_target!(|data: &[u8]| {
    if let Ok(m) = parse_marker(data) {
        assert_eq!(parse_marker(&serde_json::to_vec(&m).unwrap()).unwrap(), m);
    }
});

//! `.tenure/epoch`: only the canonical `<decimal u64>\n` parses, and it is exactly what the
//! writer produces for that number.
#![no_main]
use libfuzzer_sys::fuzz_target;
use tenure::lease::epoch;

fuzz_target!(|data: &[u8]| {
    if let Ok(n) = epoch::parse(data) {
        assert_eq!(epoch::encode(n), data);
    }
});

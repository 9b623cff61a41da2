//! `checkpoints/CURRENT`: only the exact form the writer produces parses.
#![no_main]
use libfuzzer_sys::fuzz_target;
use tenure::checkpoint::Current;

fuzz_target!(|data: &[u8]| {
    if let Ok(c) = Current::parse(data) {
        assert_eq!(c.to_bytes(), data);
    }
});

//! `.tenure/waiters/<pid>-<start>.json`: the record and the name a waiter entry has.
#![no_main]
use libfuzzer_sys::fuzz_target;
use tenure::lease::record::{WaiterRecord, parse, waiter_entry_name};

fuzz_target!(|data: &[u8]| {
    if let Ok(r) = parse::<WaiterRecord>(data) {
        let again: WaiterRecord = parse(&serde_json::to_vec(&r).unwrap()).unwrap();
        assert_eq!(again, r);
    }
    if let Ok(name) = std::str::from_utf8(data)
        && let Some((pid, start)) = waiter_entry_name(name)
    {
        assert_eq!(
            waiter_entry_name(&format!("{pid}-{start}.json")),
            Some((pid, start))
        );
    }
});

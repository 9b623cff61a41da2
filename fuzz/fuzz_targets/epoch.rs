//! `.tenure/epoch`: a file in the current format decodes to its valid slots (and re-encodes to
//! the same slots); a file in the two-slot format decodes to its highest valid slot, and the
//! slot it names holds exactly that epoch; a file in the format of an older tenure parses only
//! as the canonical `<decimal u64>\n`; every whole file the writer produces decodes to what it
//! wrote.
#![no_main]
use libfuzzer_sys::fuzz_target;
use tenure::lease::epoch::{self, Stored};

fuzz_target!(|data: &[u8]| {
    match epoch::decode(data) {
        Ok(Stored::Legacy(n)) => assert_eq!(format!("{n}\n").as_bytes(), data),
        Ok(Stored::Slots { epoch: e, newest }) => {
            assert_eq!(data.len() as u64, epoch::V1_FILE_LEN);
            let at = |i: usize| {
                let o = epoch::slot_offset(i) as usize;
                epoch::v1_slot_value(&data[o..o + epoch::V1_SLOT_LEN])
            };
            assert_eq!(at(newest), Some(e));
            // The other slot is torn (invalid) or holds an epoch no higher.
            assert!(at(1 - newest).is_none_or(|other| other <= e));
            // The writer's whole file for that epoch (the other slot one lower) decodes to it.
            let whole = epoch::encode(e, e.checked_sub(1));
            assert_eq!(
                epoch::decode(&whole),
                Ok(Stored::Slots {
                    epoch: e,
                    newest: 0
                })
            );
        }
        Ok(Stored::Batched(b)) => {
            assert_eq!(data.len() as u64, epoch::FILE_LEN);
            assert!(b.reserved.iter().any(Option::is_some) || b.scratch.is_some());
            let whole = epoch::encode_batched(&b);
            assert_eq!(epoch::decode(&whole), Ok(Stored::Batched(b)));
        }
        Err(_) => {}
    }
});

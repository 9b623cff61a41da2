//! Lines of a `--trace` file, as the models' conformance checker reads them: a line that
//! parses round-trips, and a step line can be replayed through the machine without a panic.
#![no_main]
use libfuzzer_sys::fuzz_target;
use tenure::machine::trace::{TraceLine, TraceStep};
use tenure::machine::{Config, Machine, ReadyMode};

fuzz_target!(|data: &[u8]| {
    let Ok(line) = serde_json::from_slice::<TraceLine>(data) else {
        return;
    };
    let again: TraceLine = serde_json::from_slice(&serde_json::to_vec(&line).unwrap()).unwrap();
    assert_eq!(again, line);
    if let TraceLine::Step(step) = line {
        let mut m = Machine::new(Config::child(ReadyMode::Start));
        let _ = TraceStep::record(&mut m, step.seq, step.at_ms, step.event);
    }
});

//! Kimi's wire parser: any bytes, in any chunks, never panic; a line that parses is one JSON object.
#![no_main]

use coda_shim::adapters::kimi::{feed, wire};

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&cut, input)) = data.split_first() else { return };
    let mut lines = feed::Splitter::default();
    for piece in input.chunks(usize::from(cut % 13) + 1) {
        for line in lines.push(piece) {
            if wire::parse_line(&line).is_ok() {
                assert!(coda_shim::json::from_slice::<serde_json::Value>(&line).is_ok_and(|v| v.is_object()));
            }
        }
    }
    let _ = wire::TaskInfo::parse_file(input);
});

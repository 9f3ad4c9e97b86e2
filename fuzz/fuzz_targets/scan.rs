//! The frame check's fast walk against its exact walk: any bytes, cut at newlines into lines read one after
//! another by one stream's scanner (so a line may go on from what the one before it left), read by every
//! instruction set this CPU has, give the same verdict and the same envelope as the exact walk.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let lines: Vec<&[u8]> = data.split(|&b| b == b'\n').collect();
    coda_shim::scan::check_against_exact(&lines);
});

//! What the layer targets share: feed generated frames through a layer stack and check its properties.

use coda_shim::frame::Frame;
use coda_shim::layer::{Exits, Stack};
use libfuzzer_sys::arbitrary::{Result, Unstructured};

/// Feeds frames made by `frame` (from the client when its flag is true) through `stack` until the input
/// is used up: never a panic, untouched frames come out byte-identical, rewritten ones stay JSON-RPC.
pub fn drive(mut stack: Stack, data: &[u8], frame: fn(&mut Unstructured) -> Result<(bool, Vec<u8>)>) {
    let mut u = Unstructured::new(data);
    // An exhausted `Unstructured` keeps yielding defaults: stop when the input is used up.
    while !u.is_empty() {
        let Ok((from_client, bytes)) = frame(&mut u) else { break };
        let Ok(input) = Frame::parse(bytes.clone()) else { continue };
        let mut exits = Exits::default();
        if from_client {
            stack.from_client(input, &mut exits);
        } else {
            stack.from_agent(input, &mut exits);
        }
        for out in exits.to_agent.iter().chain(&exits.to_client) {
            if out.is_shim() {
                assert!(Frame::parse(out.bytes().to_vec()).is_ok(), "a rewritten frame is JSON-RPC");
            } else {
                assert_eq!(out.bytes(), &bytes[..], "an untouched frame is byte-identical");
            }
        }
    }
}

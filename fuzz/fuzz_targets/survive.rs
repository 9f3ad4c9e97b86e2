//! Any bytes, read as lines the way the relay reads either peer, on a thread with the 2 MiB stack of a
//! tokio worker: every line is checked, read by a layer, rewritten, serialised and dropped, and nothing
//! aborts the process (issue 13: 20 KB of `[` used to overflow the stack). Run it with long inputs and
//! the JSON dictionary (fuzz/README.md).
#![no_main]

use coda_shim::frame::Frame;
use coda_shim::coda::instruction::Instruction;
use coda_shim::json;
use coda_shim::layer::{Exits, Stack};
use coda_shim::lines::{Line, Lines};
use libfuzzer_sys::fuzz_target;
use serde_json::Value;

fn relay(data: Vec<u8>) {
    let Some((&cut, input)) = data.split_first() else { return };
    let mut stack = Stack::new(vec![Box::new(Instruction::new(&["compact"]))]);
    let mut split = Lines::new(1 << 20);
    let mut lines = Vec::new();
    for piece in input.chunks(usize::from(cut) * 64 + 1) {
        split.push(piece);
        lines.extend(std::iter::from_fn(|| split.next_line()));
    }
    lines.extend(split.finish());
    for (n, line) in lines.into_iter().enumerate() {
        let Line::Text(wire) = line else { continue };
        let text = wire[..wire.len() - 1].to_vec();
        // Every parser of peer or file data takes the same bound.
        if let Ok(v) = json::from_slice::<Value>(&text) {
            drop(serde_json::to_vec(&v));
        }
        let frame = match Frame::parse_wire(wire) {
            Ok(frame) => frame,
            Err((_, e)) => {
                assert_eq!(e.too_deep, json::too_deep(&text).is_some(), "refused for depth exactly when too deep");
                continue;
            }
        };
        assert!(json::too_deep(&text).is_none());
        let mut exits = Exits::default();
        if n % 2 == 0 {
            stack.from_client(frame, &mut exits);
        } else {
            stack.from_agent(frame, &mut exits);
        }
        for out in exits.to_agent.iter().chain(&exits.to_client) {
            assert!(Frame::parse(out.bytes().to_vec()).is_ok(), "what goes out is JSON-RPC");
            if let Ok(v) = out.value() {
                drop(serde_json::to_string(&v));
            }
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let data = data.to_vec();
    let done = std::thread::Builder::new().stack_size(2 << 20).spawn(move || relay(data)).expect("a thread");
    if let Err(panic) = done.join() {
        std::panic::resume_unwind(panic);
    }
});

//! Codex's AIR translation and failure classification, under the engine's waits layer, under any frames:
//! never panics, untouched frames are byte-identical, rewritten ones stay JSON-RPC.
#![no_main]

mod drive;

use coda_shim::adapters::codex::air;
use coda_shim::adapters::codex::failure;

use coda_shim::coda::waits::Waits;
use coda_shim::layer::Stack;
use libfuzzer_sys::arbitrary::{Result, Unstructured};
use libfuzzer_sys::fuzz_target;
use serde_json::json;

fn frame(u: &mut Unstructured) -> Result<(bool, Vec<u8>)> {
    let id: u8 = u.arbitrary()?;
    let sid = *u.choose(&["root", "child", "child:generation:2", "child:generation:x"])?;
    let text: String = u.arbitrary()?;
    let state = *u.choose(&["completed", "failed", "stopped", "cancelled", "disconnected", "running", ""])?;
    let v = match u.int_in_range(0u8..=9)? {
        0 => return Ok((u.arbitrary()?, u.arbitrary()?)),
        1 => (
            true,
            json!({"jsonrpc":"2.0","id":id,"method":"initialize","params":{"protocolVersion":1,"clientCapabilities":{"_meta":{"coda":{"waits":{}}}}}}),
        ),
        2 => (
            false,
            json!({"jsonrpc":"2.0","id":id,"result":{"protocolVersion":1,"agentCapabilities":{},"_meta":{"jetbrains":{"air":{"version":1,"capabilities":["asyncTasks","nativeSubagentSessions"]}}}}}),
        ),
        3 => (
            false,
            json!({"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"root","update":{"sessionUpdate":"async_task_spawned","asyncTaskId":text,"name":text,"canStop":true,"toolCallId":"t"}}}),
        ),
        4 => (
            false,
            json!({"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"root","update":{"sessionUpdate":"async_task_state_update","asyncTaskId":text,"state":state}}}),
        ),
        5 => (
            false,
            json!({"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"root","update":{"sessionUpdate":"subagent_spawned","subagentSessionId":sid,"name":text,"task":text,"capabilities":{}}}}),
        ),
        6 => (
            false,
            json!({"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"root","update":{"sessionUpdate":"subagent_state_update","subagentSessionId":sid,"state":state}}}),
        ),
        7 => {
            (true, json!({"jsonrpc":"2.0","id":id,"method":"_coda/wait/stop","params":{"sessionId":sid,"waitId":text}}))
        }
        8 => (true, json!({"jsonrpc":"2.0","id":id,"method":"session/prompt","params":{"sessionId":sid,"prompt":[]}})),
        _ => {
            let failure = json!({"category":*u.choose(&["limit","service","connection","policy"])?,"actions":[text]});
            (
                false,
                json!({"jsonrpc":"2.0","id":id,"result":{"stopReason":"end_turn","_meta":{"jetbrains":{"air":{"sessionFailure":failure}}}}}),
            )
        }
    };
    Ok((v.0, serde_json::to_vec(&v.1).expect("serialises")))
}

fuzz_target!(|data: &[u8]| drive::drive(
    Stack::new(vec![Box::new(Waits::new()), Box::new(air::Air::new()), Box::new(failure::Failure::new(jiff::tz::TimeZone::UTC))]),
    data,
    frame
));

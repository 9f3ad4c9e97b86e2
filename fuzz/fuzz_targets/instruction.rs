//! The session-instruction layer under any sequence of frames from both sides: never panics, frames it
//! does not touch come out byte-identical, frames it rewrites stay valid JSON-RPC.
#![no_main]

mod drive;

use coda_shim::coda::instruction::{Instruction, wrap};
use coda_shim::layer::Stack;
use libfuzzer_sys::arbitrary::{Result, Unstructured};
use libfuzzer_sys::fuzz_target;
use serde_json::json;

/// One frame, from the client (`true`) or the agent, built from templates with fuzzed holes so the
/// fuzzer reaches the layer's deeper states, or raw bytes.
fn frame(u: &mut Unstructured) -> Result<(bool, Vec<u8>)> {
    let id: u8 = u.arbitrary()?;
    let sid = format!("s{}", u.int_in_range(0u8..=3)?);
    let text: String = u.arbitrary()?;
    let v = match u.int_in_range(0u8..=10)? {
        0 => return Ok((u.arbitrary()?, u.arbitrary()?)),
        1 => (true, json!({"jsonrpc":"2.0","id":id,"method":"initialize","params":{"protocolVersion":1}})),
        2 => {
            let caps = if u.arbitrary()? { json!({"systemPrompt":{}}) } else { json!({"list":{}}) };
            let version = u.int_in_range(0u8..=3)?;
            let result = if version == 2 {
                json!({"protocolVersion":2,"capabilities":{"session":caps}})
            } else {
                json!({"protocolVersion":version,"agentCapabilities":{"sessionCapabilities":caps},"_meta":{"availableCommands":[{"name":text}]}})
            };
            (false, json!({"jsonrpc":"2.0","id":id,"result":result}))
        }
        3 => {
            let method = *u.choose(&["session/new", "session/load", "session/resume", "session/fork"])?;
            let sp = match u.int_in_range(0u8..=3)? {
                0 => json!({"mode":"append","content":[{"type":"text","text":text}]}),
                1 => serde_json::from_str(&text).unwrap_or(json!(null)),
                2 => json!({"mode":text,"content":[{"type":"text","text":"x"}]}),
                _ => json!(null),
            };
            (
                true,
                json!({"jsonrpc":"2.0","id":id,"method":method,"params":{"sessionId":sid,"cwd":"/","systemPrompt":sp}}),
            )
        }
        4 => (false, json!({"jsonrpc":"2.0","id":id,"result":{"sessionId":sid}})),
        5 => {
            let blocks = if u.arbitrary()? {
                json!([{"type":"text","text":text}])
            } else {
                json!([{"type":"image"},{"type":"text","text":text}])
            };
            (
                true,
                json!({"jsonrpc":"2.0","id":id,"method":"session/prompt","params":{"sessionId":sid,"prompt":blocks}}),
            )
        }
        6 => {
            let answer = if u.arbitrary()? { json!({"stopReason":"end_turn"}) } else { json!(null) };
            let key = if answer.is_null() { "error" } else { "result" };
            let body = if answer.is_null() { json!({"code":-32603,"message":"x"}) } else { answer };
            (false, json!({"jsonrpc":"2.0","id":id,key:body}))
        }
        7 => (
            false,
            json!({"jsonrpc":"2.0","method":"session/update","params":{"sessionId":sid,"update":{"sessionUpdate":"available_commands_update","availableCommands":[{"name":text}]}}}),
        ),
        8 => {
            let echoed = if u.arbitrary()? { wrap(&text) + &text } else { text.clone() };
            (
                false,
                json!({"jsonrpc":"2.0","method":"session/update","params":{"sessionId":sid,"update":{"sessionUpdate":"user_message_chunk","content":{"type":"text","text":echoed}}}}),
            )
        }
        9 => (false, json!({"jsonrpc":"2.0","method":"_x.ai/queue/changed","params":{"q":[wrap(&text)]}})),
        _ => (u.arbitrary()?, json!({"jsonrpc":"2.0","method":text,"params":{}})),
    };
    Ok((v.0, serde_json::to_vec(&v.1).expect("serialises")))
}

fuzz_target!(|data: &[u8]| drive::drive(Stack::new(vec![Box::new(Instruction::new(&["compact"]))]), data, frame));

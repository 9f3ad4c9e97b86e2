use std::io::Read;

use super::*;

fn rec(dir: &str, shim: bool, frame: &str) -> String {
    let shim = if shim { r#","shim":true"# } else { "" };
    format!("{{\"t\":0,\"dir\":\"{dir}\"{shim},\"frame\":{frame}}}\n")
}

fn report(lines: &[String]) -> Report {
    validate(lines.concat().as_bytes())
}

const PROMPT: &str = r#"{"jsonrpc":"2.0","id":2,"method":"session/prompt","params":{"sessionId":"s","prompt":[]}}"#;

#[test]
fn only_what_the_shim_broke_itself_is_the_shims() {
    let trace = [
        rec("client->shim", false, PROMPT),
        rec("shim->agent", false, PROMPT),
        // The agent's update breaks the schema (a title that is a number); the shim edits the frame (adds _meta)
        // and passes the break on: the agent's.
        rec(
            "agent->shim",
            false,
            r#"{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s","update":{"sessionUpdate":"tool_call","toolCallId":"t","title":5}}}"#,
        ),
        rec(
            "shim->client",
            true,
            r#"{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s","update":{"sessionUpdate":"tool_call","toolCallId":"t","title":5,"_meta":{"x":1}}}}"#,
        ),
        // A wait the shim made without its state: the shim's own.
        rec("shim->client", true, r#"{"jsonrpc":"2.0","method":"_coda/wait","params":{"sessionId":"s","waitId":"w"}}"#),
        rec("agent->shim", false, r#"{"jsonrpc":"2.0","id":2,"result":{"stopReason":"end_turn"}}"#),
        // The shim's answer is checked by the method it answers: session/prompt, whose stop reason it breaks.
        rec("shim->client", true, r#"{"jsonrpc":"2.0","id":2,"result":{"stopReason":"finished"}}"#),
    ];
    let r = report(&trace);
    let found: Vec<(usize, &str, bool, &str)> =
        r.findings.iter().map(|f| (f.line, f.whose.as_str(), f.inherited, f.at.as_str())).collect();
    assert_eq!(
        found,
        [
            (3, "agent", false, "/params/update/title"),
            (4, "shim", true, "/params/update/title"),
            (5, "shim", false, "/params"),
            (7, "shim", false, "/result/stopReason"),
        ],
        "{}",
        r.text(false)
    );
    assert_eq!(r.frames_breaking(true), 2);
    assert_eq!(r.frames_breaking(false), 4);
    assert_eq!(r.findings[2].method.as_deref(), Some("_coda/wait"));
    assert_eq!(r.findings[3].method.as_deref(), Some("session/prompt"));
    let text = r.text(true);
    assert!(text.contains("line 5 shim->client (the shim's) _coda/wait /params:"), "{text}");
    assert!(!text.contains("line 3"), "--shim-only lists only the shim's: {text}");
    assert_eq!((r.checked, r.passed), (6, 1));
}

#[test]
fn a_hostile_trace_is_read_to_its_end_and_every_bad_frame_named() {
    let deep = format!("{}1{}", "[".repeat(2000), "]".repeat(2000));
    let mut trace = Vec::new();
    trace.extend_from_slice(b"this is not a record\n");
    trace.extend_from_slice(
        rec("client->shim", false, r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":1}}"#)
            .as_bytes(),
    );
    // Invalid UTF-8 inside a frame's string: read with U+FFFD, listed, and the frame still checked.
    trace.extend_from_slice(b"{\"t\":1,\"dir\":\"client->shim\",\"frame\":{\"jsonrpc\":\"2.0\",\"method\":\"_x\",\"params\":{\"a\":\"\xff\"}}}\n");
    // The same id again while the first is open.
    trace.extend_from_slice(
        rec("client->shim", false, r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":1}}"#)
            .as_bytes(),
    );
    // 1e400 where ACP wants a protocol version (a uint16).
    trace.extend_from_slice(
        rec("shim->client", true, r#"{"jsonrpc":"2.0","id":1,"result":{"protocolVersion":1e400}}"#).as_bytes(),
    );
    // An answer to nothing.
    trace.extend_from_slice(rec("shim->client", true, r#"{"jsonrpc":"2.0","id":77,"result":{}}"#).as_bytes());
    // Nested deeper than the parser goes: the record cannot be read (listed as unreadable, not checked).
    trace.extend_from_slice(
        rec("agent->shim", false, &format!(r#"{{"jsonrpc":"2.0","method":"_x","params":{deep}}}"#)).as_bytes(),
    );
    // A batch, and a frame that is no JSON-RPC at all.
    trace.extend_from_slice(rec("agent->shim", false, r#"[{"jsonrpc":"2.0","method":"_x"}]"#).as_bytes());
    trace.extend_from_slice(rec("shim->client", true, r#"{"jsonrpc":"1.0","hello":1}"#).as_bytes());
    // One line longer than the reader keeps, then a good frame.
    let huge = std::io::repeat(b'x').take(super::super::view::read::MAX_LINE as u64 + 10);
    let tail = format!("\n{}", rec("agent->shim", false, r#"{"jsonrpc":"2.0","method":"_x/done"}"#));
    let input = std::io::BufReader::new(trace.as_slice().chain(huge).chain(tail.as_bytes()));
    let r = validate(input);
    let found: Vec<(usize, &str, &str)> =
        r.findings.iter().map(|f| (f.line, f.whose.as_str(), f.rule.as_str())).collect();
    assert_eq!(
        found,
        [
            (4, "client", rules::DUPLICATE_ID),
            (5, "shim", "acp#/$defs/ProtocolVersion/maximum"),
            (6, "shim", rules::ANSWERS_NOTHING),
            (8, "agent", rules::JSONRPC_BATCH),
            (9, "shim", rules::JSONRPC_VERSION),
            (9, "shim", rules::JSONRPC_SHAPE),
        ],
        "{}",
        r.text(false)
    );
    let bad: Vec<usize> = r.bad_lines.iter().map(|b| b.line).collect();
    assert_eq!(bad, [1, 3, 7, 10], "{:?}", r.bad_lines);
    assert_eq!(r.checked, 8, "the frame after the huge line is read too");
    assert!(r.text(false).contains("4 unreadable lines"));
}

#[test]
fn a_request_with_a_lone_surrogate_is_read_as_the_shim_reads_it() {
    // Valid JSON, not valid Unicode: the shim reads it with U+FFFD, and so does the check; its answer answers it.
    let prompt = r#"{"jsonrpc":"2.0","id":3,"method":"session/prompt","params":{"sessionId":"s","prompt":[{"type":"text","text":"a \ud800 b"}]}}"#;
    let trace = [
        rec("client->shim", false, prompt),
        rec(
            "shim->client",
            true,
            r#"{"jsonrpc":"2.0","id":3,"error":{"code":-32603,"message":"agent process exited"}}"#,
        ),
    ];
    let r = report(&trace);
    assert!(r.findings.is_empty(), "{}", r.text(false));
    assert_eq!(r.checked, 2);
}

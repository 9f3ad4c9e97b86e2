//! Request ids (issue 13, section 6): one response per request, and an id the shim writes is spelled
//! exactly as the client sent it. Ids equal in value are one id: the test agent (serde_json, like Node's
//! JSON.parse) answers a request sent as `1e0` with `1e+0` (Node's would be `1`).

use crate::support;

use support::shim;

use std::time::Duration;

use serde_json::Value;
use shim::with_test_agent;

#[test]
fn an_answer_spelled_differently_is_the_answer_and_no_second_one_follows() {
    let mut s = with_test_agent("opencode").start();
    s.send(r#"{"jsonrpc":"2.0","id":1e0,"method":"_test/echo","params":{}}"#);
    let echo = s.recv();
    assert!(echo.contains(r#""id":1e+0"#), "the agent answered in its own spelling: {echo}");
    // The agent exits without answering this one: only it is owed an error.
    s.send(r#"{"jsonrpc":"2.0","id":2,"method":"session/prompt","params":{"sessionId":"x","prompt":[{"type":"text","text":"!exit 3"}]}}"#);
    let rest = s.rest();
    assert_eq!(s.wait(Duration::from_secs(5)).code(), Some(3));
    assert_eq!(rest.len(), 1, "one error, for the request the agent did not answer: {rest:?}");
    assert!(rest[0].starts_with(r#"{"jsonrpc":"2.0","id":2,"error":{"code":-32603"#), "{}", rest[0]);
}

#[test]
fn errors_the_shim_makes_carry_the_id_as_the_client_spelled_it() {
    let mut s = with_test_agent("grok").arg("--max-frame-bytes").arg("1000").start();
    // Over the size limit: the shim answers itself.
    let big = "x".repeat(2000);
    s.send(&format!(r#"{{"jsonrpc":"2.0","id":5.0e0,"method":"_test/echo","params":{{"s":"{big}"}}}}"#));
    let too_long = s.recv();
    assert!(too_long.starts_with(r#"{"jsonrpc":"2.0","id":5.0e0,"error":{"code":-32600"#), "{too_long}");
    // The agent exits without answering: the shim's -32603 carries the id as sent, once.
    s.send(r#"{"jsonrpc":"2.0","id":1E+2,"method":"session/prompt","params":{"sessionId":"x","prompt":[{"type":"text","text":"!exit 3"}]}}"#);
    let rest = s.rest();
    assert_eq!(rest.len(), 1, "{rest:?}");
    assert!(rest[0].starts_with(r#"{"jsonrpc":"2.0","id":1E+2,"error":{"code":-32603"#), "{}", rest[0]);
    let e: Value = serde_json::from_str(&rest[0]).unwrap();
    assert_eq!(e["error"]["message"], "agent process exited with status 3");
}

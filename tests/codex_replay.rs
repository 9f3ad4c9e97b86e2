//! Replays of real codex-acp 2.6.0 recordings (`fixtures/codex/*`) through coda-codex's layers.
//!
//! Each fixture is a `--trace-file` recording of `coda-codex` driving the real codex-acp against the fake model
//! server, normalised by `acp-replay record`. The replay feeds the recorded client and agent frames, in the
//! recorded order, through the same layer stack as the binary and checks that (1) Coda receives exactly the
//! recorded frames and codex-acp exactly the recorded ones, and (2) the frames each scenario is about are
//! what Coda's protocol asks for (spelled out below, by hand).

use coda_shim::adapters::codex;

use std::path::Path;

use coda_shim::coda::identity::{Identity, Policy};
use coda_shim::coda::waits::Waits;
use coda_shim::frame::Frame;
use coda_shim::layer::{AnyLayer, Exits, Stack};
use serde_json::{Value, json};

/// The Codex CLI the recordings were made with (`@openai/codex` bundled by codex-acp 2.6.0).
const CODEX_VERSION: &str = "0.166.0";

struct Replay {
    /// What Coda received, in order.
    to_client: Vec<Value>,
}

impl Replay {
    /// The index of the first frame Coda got that is `what`.
    fn at(&self, what: &str, is: impl Fn(&Value) -> bool) -> usize {
        self.to_client.iter().position(is).unwrap_or_else(|| panic!("Coda got no {what}"))
    }

    /// A background command's two reports: opened with `title`, then ended with `end`.
    fn assert_task(&self, title: &str, end: &str) {
        let (sid, waits) = (self.session(), self.waits());
        let task = waits[0]["waitId"].clone();
        assert_eq!(
            waits,
            vec![
                json!({"sessionId":sid,"waitId":task,"kind":"task","state":"waiting","title":title,
                    "toolCallId":task,"stoppable":true}),
                json!({"sessionId":sid,"waitId":task,"state":end}),
            ]
        );
    }

    fn waits(&self) -> Vec<Value> {
        self.to_client.iter().filter(|f| f["method"] == "_coda/wait").map(|f| f["params"].clone()).collect()
    }

    /// The answer Coda got to its request `id`.
    fn answer(&self, id: u64) -> Value {
        self.to_client.iter().find(|f| f["id"] == id && f.get("method").is_none()).cloned().unwrap_or(Value::Null)
    }

    /// The `sessionId` of the session Coda created.
    fn session(&self) -> String {
        let sid = self.to_client.iter().find_map(|f| f.pointer("/result/sessionId").and_then(Value::as_str));
        sid.expect("a session/new answer").to_owned()
    }

    /// Coda never sees an AIR-only update, nor a `:generation:` session id.
    fn assert_air_consumed(&self) {
        for f in &self.to_client {
            let text = f.to_string();
            for air_only in
                ["subagent_spawned", "subagent_state_update", "async_task_spawned", "async_task_state_update"]
            {
                assert!(!text.contains(&format!("\"sessionUpdate\":\"{air_only}\"")), "Coda got {air_only}: {text}");
            }
            if let Some(sid) = f.pointer("/params/sessionId").and_then(Value::as_str) {
                assert!(!sid.contains(":generation:"), "Coda got a generation id: {text}");
            }
            assert_ne!(f["params"]["state"], "handling", "Codex has no autonomous turns: {text}");
        }
    }
}

fn frame(v: &Value) -> Frame {
    Frame::parse(v.to_string().into_bytes()).expect("a recorded frame is JSON-RPC")
}

/// One subagent run as Coda sees it: opened as `wait` of child session `child`, then done.
fn subagent_run(sid: &str, wait: &str, child: &str, title: &str, detail: &str) -> [Value; 2] {
    [
        json!({"sessionId":sid,"waitId":wait,"kind":"subagent","state":"waiting","title":title,"detail":detail,
            "stoppable":false,"childSessionId":child}),
        json!({"sessionId":sid,"waitId":wait,"state":"done"}),
    ]
}

fn assert_frames(got: &[Frame], recorded: &[Value], name: &str, peer: &str) -> Vec<Value> {
    let got: Vec<Value> = got.iter().map(|f| f.value().expect("json")).collect();
    assert_eq!(got.len(), recorded.len(), "{name}: number of frames {peer} got");
    for (i, (got, want)) in got.iter().zip(recorded).enumerate() {
        assert_eq!(got, want, "{name}: frame {i} to {peer}");
    }
    got
}

/// Replays `fixtures/codex/<name>/trace.jsonl`; both peers must get exactly the recorded frames.
fn replay(name: &str) -> Replay {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/codex").join(name).join("trace.jsonl");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    // The shim's own request ids carry its pid; the stack in this process uses this pid.
    let text = text.replace("{{SHIM_PID}}", &std::process::id().to_string());
    // As the binary stacks them: the engine's Waits, Codex's identity (its version probed), Codex's layers.
    let mut layers: Vec<Box<dyn AnyLayer>> =
        vec![Box::new(Waits::new()), Box::new(Identity::new("codex", Policy::Replace, Some(CODEX_VERSION.into())))];
    layers.extend(codex::below_identity(jiff::tz::TimeZone::UTC));
    let mut stack = Stack::new(layers);
    let mut exits = Exits::default();
    let (mut recorded_client, mut recorded_agent) = (Vec::new(), Vec::new());
    for (n, line) in text.lines().enumerate() {
        let record: Value = serde_json::from_str(line).unwrap_or_else(|e| panic!("{name} line {}: {e}", n + 1));
        let Some(f) = record.get("frame") else { continue };
        match record["dir"].as_str() {
            Some("client->shim") => stack.from_client(frame(f), &mut exits),
            Some("agent->shim") => stack.from_agent(frame(f), &mut exits),
            Some("shim->client") => recorded_client.push(f.clone()),
            Some("shim->agent") => recorded_agent.push(f.clone()),
            other => panic!("{name} line {}: unexpected dir {other:?}", n + 1),
        }
    }
    assert_frames(&exits.to_agent, &recorded_agent, name, "codex-acp");
    let r = Replay { to_client: assert_frames(&exits.to_client, &recorded_client, name, "Coda") };
    r.assert_air_consumed();
    r
}

/// The initialize answer: Codex's identity, waits declared, codex-acp's systemPrompt and steering kept.
fn check_initialize(r: &Replay, id: u64) {
    let result = &r.answer(id)["result"];
    assert_eq!(result["agentInfo"], json!({"name":"codex","version":CODEX_VERSION}));
    assert_eq!(result["agentCapabilities"]["_meta"]["coda"], json!({"waits":{}}));
    assert_eq!(result["agentCapabilities"]["sessionCapabilities"]["systemPrompt"], json!({}));
    assert_eq!(result["_meta"]["steering"], json!({"supported":true}));
}

#[test]
fn background_command_stopped_through_coda_wait_stop() {
    let r = replay("bg-stopped");
    check_initialize(&r, 1);
    r.assert_task("sleep 30; echo finished", "cancelled");
    // `{}` to Coda right after the stop was sent, before the cancelled report.
    let stop_answer = r.at("stop answer", |f| f["id"] == 4);
    let cancelled = r.at("cancelled", |f| f["params"]["state"] == "cancelled");
    assert_eq!(r.to_client[stop_answer], json!({"jsonrpc":"2.0","id":4,"result":{}}));
    assert!(stop_answer < cancelled);
}

#[test]
fn background_command_that_fails_after_the_turn() {
    let r = replay("bg-fails");
    r.assert_task("sleep 2; exit 3", "failed");
    // The failure is reported after the turn ended.
    assert!(r.at("prompt answer", |f| f["id"] == 3) < r.at("failed", |f| f["params"]["state"] == "failed"));
}

#[test]
fn subagent_that_completes() {
    let r = replay("subagent-completes");
    let waits = r.waits();
    let child = waits[0]["childSessionId"].as_str().expect("childSessionId").to_owned();
    assert_eq!(waits, subagent_run(&r.session(), &child, &child, "Worker bee", "Delegated task for Worker bee"));
    // The child's own updates reach Coda as its session.
    assert!(r.to_client.iter().any(|f| f["method"] == "session/update"
        && f["params"]["sessionId"] == child.as_str()
        && f["params"]["update"]["sessionUpdate"] == "agent_message_chunk"));
}

#[test]
fn subagent_followed_up_is_the_same_child_session_with_a_new_wait() {
    let r = replay("subagent-followup");
    let (sid, waits) = (r.session(), r.waits());
    let child = waits[0]["childSessionId"].as_str().expect("childSessionId").to_owned();
    let second = format!("{child}:generation:2");
    let run = |wait: &str| subagent_run(&sid, wait, &child, "Worker bee", "Delegated task for Worker bee");
    assert_eq!(waits, [run(&child), run(&second)].concat());
    // Generation 2's updates (recorded under `X:generation:2`) reach Coda as X.
    let raw = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/codex/subagent-followup/trace.jsonl"),
    )
    .expect("fixture");
    assert!(raw.contains(&format!("\"sessionId\":\"{second}\"")), "the recording has generation-2 traffic");
    assert!(r.to_client.iter().filter(|f| f["params"]["sessionId"] == child.as_str()).count() >= 2);
}

#[test]
fn load_of_a_session_with_finished_children_reports_no_activity() {
    let r = replay("subagent-load");
    check_initialize(&r, 5);
    assert!(r.waits().is_empty(), "{:#?}", r.waits());
    assert!(r.answer(6).get("result").is_some());
}

#[test]
fn steering_during_a_turn_is_injected_and_after_it_prompt_required() {
    let r = replay("steering");
    assert_eq!(r.answer(4), json!({"jsonrpc":"2.0","id":4,"result":{"outcome":"injected"}}));
    assert_eq!(
        r.answer(5),
        json!({"jsonrpc":"2.0","id":5,"result":{"outcome":"promptRequired","reason":"noRunningTurn"}})
    );
}

#[test]
fn upstream_errors_become_coda_failure_kinds() {
    let r = replay("upstream-errors");
    let failure = |id: u64| r.answer(id)["error"]["data"]["_meta"]["coda"]["failure"].clone();
    // 429 usage limit.
    assert_eq!(r.answer(3)["error"]["code"], -32603);
    assert!(r.answer(3)["error"]["message"].as_str().is_some_and(|m| m.contains("usage limit")));
    assert_eq!(failure(3), json!({"kind":"quota_exhausted"}));
    // 429 rate limit, 500, 503: the turn ran, the service failed.
    for (id, text) in [(4, "429 Too Many Requests"), (5, "high demand"), (6, "at capacity")] {
        assert_eq!(r.answer(id)["error"]["code"], -32603);
        assert!(r.answer(id)["error"]["message"].as_str().is_some_and(|m| m.contains(text)), "{id}");
        assert_eq!(failure(id), json!({"kind":"service_unavailable","input":"accepted"}), "{id}");
    }
    // 401 stays auth_required, never a quota.
    assert_eq!(
        r.answer(7),
        json!({"jsonrpc":"2.0","id":7,"error":{"code":-32000,"message":"Authentication required"}})
    );
}

#[test]
fn background_command_that_completes_after_the_turn() {
    let r = replay("bg-completes-after-turn");
    check_initialize(&r, 1);
    r.assert_task("sleep 4; echo finished", "done");
    let turn_end = r.at("prompt answer", |f| f["id"] == 3);
    assert!(turn_end < r.at("done", |f| f["params"]["state"] == "done"), "the command ends after the turn");
}

#[test]
fn multi_agent_v1_child_first_seen_as_generation_2() {
    let r = replay("subagent-v1-generation-2-first");
    let waits = r.waits();
    let child = waits[0]["childSessionId"].as_str().expect("childSessionId").to_owned();
    assert!(!child.contains(':'));
    let title = format!("Agent {}", &child[child.len() - 8..]);
    assert_eq!(waits, subagent_run(&r.session(), &format!("{child}:generation:2"), &child, &title, "say hi"));
}

#[test]
fn child_session_updates_and_permission_request_reach_coda_as_the_child() {
    let r = replay("subagent-child-permission");
    let waits = r.waits();
    let child = waits[0]["childSessionId"].as_str().expect("childSessionId").to_owned();
    let asked = r.at("permission request", |f| f["method"] == "session/request_permission");
    assert_eq!(r.to_client[asked]["params"]["sessionId"], child.as_str());
    // It comes after the child was announced, and the child ends after it was answered.
    assert!(r.at("wait", |f| f["method"] == "_coda/wait") < asked);
    assert_eq!(waits[1]["state"], "done");
    assert!(
        r.to_client.iter().any(
            |f| f["params"]["sessionId"] == child.as_str() && f["params"]["update"]["sessionUpdate"] == "tool_call"
        )
    );
}

#[test]
fn auto_review_verdicts_are_on_the_judged_calls() {
    let r = replay("auto-review");
    let raw =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/codex/auto-review/trace.jsonl"))
            .expect("fixture");
    assert_eq!(raw.matches("\"toolCallId\":\"guardian_assessment:").count(), 8, "codex-acp reported four reviews");
    for f in &r.to_client {
        assert!(!f.to_string().contains("guardian_assessment"), "Coda got the review's own call: {f}");
    }
    let updates: Vec<&Value> =
        r.to_client.iter().filter(|f| f["method"] == "session/update").map(|f| &f["params"]["update"]).collect();
    let call = |title: &str| {
        let start = updates.iter().position(|u| u["sessionUpdate"] == "tool_call" && u["title"] == title);
        let start = start.unwrap_or_else(|| panic!("Coda got no call `{title}`"));
        let id = updates[start]["toolCallId"].clone();
        let of_it: Vec<&Value> = updates[start..].iter().copied().filter(|u| u["toolCallId"] == id).collect();
        let reviews: Vec<Value> = of_it.iter().filter_map(|u| u.pointer("/_meta/coda/review").cloned()).collect();
        (reviews, of_it.last().map(|u| u["status"].clone()).unwrap_or_default())
    };
    let (reviews, end) = call("rm -f ../victim.txt");
    assert_eq!(
        reviews,
        [
            json!({"state": "reviewing"}),
            json!({"state": "denied", "risk": "high",
                "reason": "Deletes a file outside the workspace that the user never named"}),
        ]
    );
    assert_eq!(end, "failed");
    let (reviews, end) = call("touch made.txt");
    assert_eq!(
        reviews,
        [
            json!({"state": "reviewing"}),
            json!({"state": "approved", "risk": "low", "reason": "The user asked for this file in the workspace"}),
        ]
    );
    assert_eq!(end, "completed");
    // Two identical commands in parallel: each its own review.
    let twins: Vec<String> = updates
        .iter()
        .filter(|u| u["sessionUpdate"] == "tool_call" && u["title"] == "touch twin.txt")
        .map(|u| u["toolCallId"].as_str().expect("an id").to_owned())
        .collect();
    assert_eq!(twins.len(), 2);
    let verdict = json!({"state": "approved", "risk": "medium", "reason": "Both create one file in the workspace"});
    for id in &twins {
        let reviews: Vec<Value> = updates
            .iter()
            .filter(|u| u["toolCallId"] == id.as_str())
            .filter_map(|u| u.pointer("/_meta/coda/review").cloned())
            .collect();
        assert_eq!(reviews, [json!({"state": "reviewing"}), verdict.clone()], "{id}");
    }
}

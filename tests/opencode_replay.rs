//! Replays of real OpenCode 1.18.33 subagent recordings (`fixtures/opencode/task-*`, made by
//! `tests/opencode_live.rs`) through coda-opencode, with `acp-replay` as the CLI. The replay proves the shim
//! still sends Coda exactly what it sent live (and OpenCode exactly what it received, including the shim's
//! own `session/resume` of a child); the events the shim read from OpenCode's own server are in the fixture
//! as `agent->file` records, which the player writes where the shim reads them (`CODA_OPENCODE_EVENTS`). The
//! assertions spell out what Coda's rules ask of the recorded sequences.

use crate::support;

use support::replay as replay_support;

use coda_shim::replay::{self, Body, Dir, Record};
use serde_json::Value;

struct Replayed {
    /// What Coda received, what OpenCode received, and every record with its time.
    to_client: Vec<Value>,
    to_agent: Vec<Value>,
    records: Vec<Record>,
}

/// Replays the fixture and returns the recording.
fn replayed(scenario: &str) -> Replayed {
    let dir = replay_support::fixtures_root().join("opencode").join(scenario);
    replay_support::check("opencode", &dir).unwrap_or_else(|e| panic!("opencode/{scenario}: {e}"));
    let records = replay::load(&dir.join(replay::TRACE_FILE)).unwrap_or_else(|e| panic!("{scenario}: {e}"));
    let frames = |edge: Dir| -> Vec<Value> {
        records
            .iter()
            .filter(|r| r.edge == edge)
            .filter_map(|r| match &r.body {
                Body::Frame(text) => serde_json::from_str(text).ok(),
                _ => None,
            })
            .collect()
    };
    Replayed { to_client: frames(Dir::ShimToClient), to_agent: frames(Dir::ShimToAgent), records }
}

/// The events from OpenCode's server, with the time they were handled.
fn server_events(records: &[Record]) -> Vec<(u64, Value)> {
    records
        .iter()
        .filter_map(|r| match &r.body {
            Body::File(op) if r.edge == Dir::AgentToFile => {
                Some((r.t.unwrap_or(0), serde_json::from_str(op.data.as_deref()?).ok()?))
            }
            _ => None,
        })
        .collect()
}

/// When (ms into the recording) the first shim->client frame for which `f` holds was sent.
fn sent_at(records: &[Record], f: impl Fn(&Value) -> bool) -> Option<u64> {
    records.iter().find_map(|r| match &r.body {
        Body::Frame(text) if r.edge == Dir::ShimToClient => {
            serde_json::from_str::<Value>(text).ok().filter(|v| f(v)).map(|_| r.t.unwrap_or(0))
        }
        _ => None,
    })
}

fn waits(frames: &[Value]) -> Vec<Value> {
    frames.iter().filter(|f| f["method"] == "_coda/wait").map(|f| f["params"].clone()).collect()
}

fn states(waits: &[Value], wait_id: &Value) -> Vec<String> {
    waits.iter().filter(|w| w["waitId"] == *wait_id).filter_map(|w| w["state"].as_str().map(str::to_owned)).collect()
}

fn position(frames: &[Value], f: impl Fn(&Value) -> bool) -> usize {
    frames.iter().position(f).unwrap_or(usize::MAX)
}

fn is_resume_of(child: &str) -> impl Fn(&Value) -> bool + '_ {
    move |f: &Value| f["method"] == "session/resume" && f["params"]["sessionId"] == child
}

#[test]
fn foreground_task_is_a_subagent_wait_named_before_its_call_completes() {
    let r = replayed("task-foreground");
    let init = r.to_client.iter().find(|f| f.pointer("/result/protocolVersion").is_some()).expect("initialize answer");
    assert_eq!(init["result"]["agentCapabilities"]["_meta"]["coda"]["waits"], serde_json::json!({}));
    let w = waits(&r.to_client);
    let open = &w[0];
    assert_eq!(open["kind"], "subagent");
    assert_eq!(open["toolCallId"], open["waitId"]);
    assert_eq!(states(&w, &open["waitId"]), ["waiting", "done"]);
    let completed = r
        .to_client
        .iter()
        .find(|f| {
            f["params"]["update"]["status"] == "completed" && f["params"]["update"]["toolCallId"] == open["waitId"]
        })
        .expect("the task call's completion");
    // OpenCode's server named the child before the call's running update: the wait opens with it.
    let child = completed["params"]["update"]["rawOutput"]["metadata"]["sessionId"].as_str().expect("the child");
    assert_eq!(open["childSessionId"], child);
    let named = server_events(&r.records).into_iter().find(|(_, e)| e["type"] == "task.child").expect("task.child");
    assert_eq!(named.1["child"], child);
    assert!(r.to_agent.iter().any(is_resume_of(child)), "the child is resumed, so OpenCode forwards it");
    let answer = position(&r.to_client, |f| f["result"]["stopReason"].is_string() && f["id"] != Value::Null);
    let settled = position(&r.to_client, |f| f["params"]["state"] == "done");
    assert!(settled < answer, "settled inside the turn");
}

/// Issue 7: a permission request inside a foreground child. Without the shim's resume OpenCode never
/// forwards it and the turn hangs (`tests/opencode_live.rs` shows that live).
#[test]
fn foreground_child_permission_reaches_coda_on_the_child_session_and_the_turn_ends() {
    let r = replayed("task-foreground-child-permission");
    let w = waits(&r.to_client);
    let id = &w[0]["waitId"];
    let child = w[0]["childSessionId"].as_str().expect("named in the opening report");
    assert_eq!(states(&w, id), ["waiting", "done"]);
    let announced = position(&r.to_client, |f| f["params"]["childSessionId"] == child);
    let asked =
        position(&r.to_client, |f| f["method"] == "session/request_permission" && f["params"]["sessionId"] == child);
    let done = position(&r.to_client, |f| f["params"]["state"] == "done");
    let answer = position(&r.to_client, |f| f["id"] == 2 && f["result"]["stopReason"] == "end_turn");
    assert!(announced < asked && asked < done && done < answer, "{announced} {asked} {done} {answer}");
    // OpenCode forwarded it itself (a request of OpenCode's, not the shim's own copy) ...
    let request = &r.to_client[asked];
    assert!(request["id"].is_number(), "OpenCode's own request: {request}");
    // ... because the shim resumed the child before the child asked, and Coda's answer went back to OpenCode.
    let resumed = position(&r.to_agent, is_resume_of(child));
    let answered = position(&r.to_agent, |f| f["id"] == request["id"] && f["result"]["outcome"].is_object());
    assert!(resumed < answered && answered != usize::MAX);
    let events = server_events(&r.records);
    let named = events.iter().position(|(_, e)| e["type"] == "task.child").expect("task.child");
    let child_asked = events.iter().position(|(_, e)| e["type"] == "permission.asked").expect("permission.asked");
    assert!(named < child_asked);
    assert_eq!(events[child_asked].1["session"], child);
}

#[test]
fn background_task_child_permission_reaches_coda_and_the_result_is_handled_until_opencode_is_idle() {
    let r = replayed("task-background-child-permission");
    let w = waits(&r.to_client);
    let id = &w[0]["waitId"];
    assert_eq!(states(&w, id), ["waiting", "handling", "done"]);
    let child = w[0]["childSessionId"].as_str().expect("named in the opening report");
    // The shim resumed the child so that OpenCode forwards it.
    assert!(r.to_agent.iter().any(is_resume_of(child)));
    let announced = position(&r.to_client, |f| f["params"]["childSessionId"] == child);
    let asked =
        position(&r.to_client, |f| f["method"] == "session/request_permission" && f["params"]["sessionId"] == child);
    assert!(announced < asked && asked != usize::MAX, "the child's request comes after the child is announced");
    // The shim's own session/resume answer is not Coda's.
    assert!(!r.to_client.iter().any(|f| f["id"].as_str().is_some_and(|i| i.starts_with("coda-shim-"))));
    let turn_end = position(&r.to_client, |f| f["result"]["stopReason"].is_string());
    let handling = position(&r.to_client, |f| f["params"]["state"] == "handling");
    assert!(turn_end < handling, "handling is OpenCode's own turn after Coda's");
    // Done when OpenCode's server said the parent is idle again, not after 10 s of quiet.
    let session = w[0]["sessionId"].as_str().expect("the parent");
    let handled_at = sent_at(&r.records, |f| f["params"]["state"] == "handling").expect("handling");
    let done_at = sent_at(&r.records, |f| f["params"]["state"] == "done").expect("done");
    let idle_at = server_events(&r.records)
        .into_iter()
        .filter(|(_, e)| e["type"] == "session.status" && e["session"] == session && e["busy"] == false)
        .map(|(t, _)| t)
        .next_back()
        .expect("the parent's last idle");
    assert!(
        done_at >= idle_at && done_at - handled_at < 2_000,
        "handling {handled_at}, idle {idle_at}, done {done_at}"
    );
}

#[test]
fn follow_up_is_a_new_wait_on_the_same_child_session() {
    let r = replayed("task-follow-up");
    let w = waits(&r.to_client);
    let openings: Vec<&Value> = w.iter().filter(|p| p["kind"] == "subagent").collect();
    assert_eq!(openings.len(), 2);
    let child = openings[0]["childSessionId"].as_str().expect("the first child, named at once");
    assert_eq!(openings[1]["childSessionId"], child, "rule 5: same child session");
    assert_eq!(states(&w, &openings[0]["waitId"]), ["waiting", "done"]);
    assert_eq!(states(&w, &openings[1]["waitId"]), ["waiting", "handling", "done"]);
    assert_eq!(r.to_agent.iter().filter(|f| is_resume_of(child)(f)).count(), 1, "resumed once for both runs");
}

/// Section 插话 (`fixtures/opencode/steering`): a steer during a running command is answered `injected` once
/// OpenCode's server says a step answers the message the shim posted, before the turn's one answer; a steer
/// between turns is answered `promptRequired` with nothing posted; one into a turn Coda cancels is deleted
/// again once the session is idle, and answered `promptRequired`.
#[test]
fn steering_joins_the_running_turn_and_is_taken_back_when_the_turn_ends_first() {
    let r = replayed("steering");
    let init = r.to_client.iter().find(|f| f["id"] == "init").expect("initialize answer");
    assert_eq!(init["result"]["_meta"]["steering"], serde_json::json!({"supported": true}));
    let answer = |id: &str| position(&r.to_client, |f| f["id"] == id && f.get("method").is_none());
    let outcome = |id: &str| r.to_client[answer(id)]["result"].clone();
    assert_eq!(outcome("steer-1"), serde_json::json!({"outcome": "injected"}));
    assert!(answer("steer-1") < answer("turn-1"), "injected is answered inside the turn");
    assert_eq!(r.to_client.iter().filter(|f| f["id"] == "turn-1").count(), 1, "one answer to the turn");
    let required = serde_json::json!({"outcome": "promptRequired", "reason": "noRunningTurn"});
    assert_eq!(outcome("steer-2"), required);
    assert_eq!(outcome("steer-3"), required);
    assert!(answer("steer-3") < answer("turn-2"), "the steering answer comes first");
    assert_eq!(r.to_client[answer("turn-2")]["result"]["stopReason"], "cancelled");
    // OpenCode got none of them over ACP: the shim went through its server.
    assert!(!r.to_agent.iter().any(|f| f["method"] == "_session/steering"));
    assert_eq!(r.to_agent.iter().filter(|f| f["method"] == "session/prompt").count(), 3);
    // What the server said: the posted message is the parent of the step that answered steer-1; steer-3's
    // message was deleted after the session went idle; steer-2 posted nothing.
    let events = server_events(&r.records);
    let calls: Vec<&Value> = events.iter().map(|(_, e)| e).filter(|e| e["type"] == "steer.call").collect();
    assert_eq!(calls.iter().map(|c| c["call"].as_str().unwrap_or("")).collect::<Vec<_>>(), ["post", "post", "delete"]);
    let first = calls[0]["message"].as_str().expect("the posted message");
    assert!(events.iter().any(|(_, e)| e["type"] == "message.step" && e["parent"] == first));
    assert_eq!(calls[2]["message"], calls[1]["message"], "the message deleted is the one posted into turn-2");
    let posted = events.iter().rposition(|(_, e)| e["call"] == "post").expect("the second post");
    let deleted = events.iter().position(|(_, e)| e["call"] == "delete").expect("the delete");
    let idle = |e: &Value| e["type"] == "session.status" && e["busy"] == false;
    assert!(events[posted..deleted].iter().any(|(_, e)| idle(e)), "deleted once the session was idle");
    assert!(!events[posted..].iter().any(|(_, e)| e["parent"] == calls[1]["message"]), "no step took it");
}

// ---- Issue 24: `_coda/session/compact` and usage facts (`fixtures/opencode/compact-*`, `usage-*`). ----

fn usage_updates(frames: &[Value]) -> Vec<&Value> {
    frames.iter().filter(|f| f["params"]["update"]["sessionUpdate"] == "usage_update").collect()
}

/// The `_meta.coda` a usage update carries.
fn coda(update: &Value) -> &Value {
    &update["params"]["update"]["_meta"]["coda"]
}

/// The events file's assistant steps (OpenCode's server), non-summary ones.
fn steps(records: &[Record]) -> Vec<Value> {
    server_events(records)
        .into_iter()
        .map(|(_, e)| e)
        .filter(|e| e["type"] == "message.step" && e["summary"] != true)
        .collect()
}

fn iso(ms: u64) -> String {
    let t = std::time::UNIX_EPOCH + std::time::Duration::from_millis(ms);
    coda_shim::coda::usage::iso(t).expect("a time")
}

/// Every usage update Coda got says when the last request of the turn went out (OpenCode's own time of the
/// step's message, from the recording, so the same on any day) and its context.
#[test]
fn usage_over_a_turn_with_tool_calls_names_the_last_request_and_its_context() {
    let r = replayed("usage-tool-turn");
    let updates = usage_updates(&r.to_client);
    assert_eq!(updates.len(), 1, "one per prompt answer");
    let u = updates[0];
    let steps = steps(&r.records);
    assert!(steps.len() >= 3, "two tool steps and the closing text: {steps:?}");
    let last = steps.iter().filter(|s| s["created_ms"].is_u64()).max_by_key(|s| s["created_ms"].as_u64()).unwrap();
    assert_eq!(coda(u)["lastRequestAt"], iso(last["created_ms"].as_u64().unwrap()));
    assert_eq!(coda(u)["contextTokens"], u["params"]["update"]["used"], "the context of that request");
    let completed = steps.iter().rev().find(|s| s["tokens"].is_u64()).expect("a completed step");
    assert_eq!(coda(u)["contextTokens"], completed["tokens"]);
    assert!(coda(u).get("compactedAt").is_none());
    assert!(serde_json::to_string(coda(u)).unwrap().len() < 4096);
}

#[test]
fn compaction_between_turns_answers_with_before_and_after_and_holds_the_prompt_sent_meanwhile() {
    let r = replayed("compact-between-turns");
    let init = r.to_client.iter().find(|f| f.pointer("/result/protocolVersion").is_some()).expect("initialize");
    assert_eq!(init["result"]["agentCapabilities"]["_meta"]["coda"]["compact"], serde_json::json!({}));
    let answer = position(&r.to_client, |f| f["result"]["compacted"].is_boolean());
    let result = &r.to_client[answer]["result"];
    assert_eq!(result["compacted"], true);
    let before = usage_updates(&r.to_client)[0]["params"]["update"]["used"].clone();
    assert_eq!(result["before"], before, "before: the context of the last request");
    assert!(result["after"].as_u64().is_some_and(|a| a < before.as_u64().unwrap()), "{result}");
    // The prompt sent during it reached OpenCode only after the compaction ended.
    let prompts: Vec<usize> = r
        .records
        .iter()
        .enumerate()
        .filter(|(_, rec)| {
            rec.edge == Dir::ShimToAgent && matches!(&rec.body, Body::Frame(t) if t.contains("session/prompt"))
        })
        .map(|(i, _)| i)
        .collect();
    let summarized = r
        .records
        .iter()
        .position(|rec| matches!(&rec.body, Body::File(op) if op.data.as_deref().is_some_and(|d| d.contains("summarize.result"))))
        .expect("OpenCode's server answered the compaction");
    assert_eq!(prompts.len(), 2);
    assert!(prompts[1] > summarized, "the second prompt went on after the compaction");
    // The summary's text did not reach Coda; the shim's own usage update carries compactedAt.
    let summary = server_events(&r.records)
        .into_iter()
        .map(|(_, e)| e)
        .find(|e| e["type"] == "message.step" && e["summary"] == true && e["completed_ms"].is_u64())
        .expect("the summary step");
    let summary_id = summary["message"].as_str().unwrap();
    assert!(!r.to_client.iter().any(|f| f["params"]["update"]["messageId"] == summary_id), "a summary chunk leaked");
    let own = usage_updates(&r.to_client)
        .into_iter()
        .find(|u| coda(u).get("compactedAt").is_some())
        .expect("a usage update with compactedAt");
    // The recorder writes the facts' instants as placeholders (the replay binds each to one instant).
    let compacted_at = coda(own)["compactedAt"].as_str().unwrap_or_default();
    assert!(
        compacted_at == iso(summary["completed_ms"].as_u64().unwrap()) || compacted_at.starts_with("{{AT_"),
        "{compacted_at}"
    );
    assert_eq!(
        own["params"]["update"]["used"], result["after"],
        "OpenCode's count: the estimate until it says its own"
    );
    assert_eq!(coda(own)["contextTokens"], before, "the context of the last request, until the next one");
    let last = usage_updates(&r.to_client).into_iter().last().unwrap();
    assert_eq!(coda(last)["compactedAt"], coda(own)["compactedAt"], "kept on the next turn's update");
}

#[test]
fn compaction_during_a_turn_is_refused_and_the_turn_ends_normally() {
    let r = replayed("compact-during-turn");
    let answer = r.to_client.iter().find(|f| f["result"]["compacted"].is_boolean()).expect("the compact answer");
    assert_eq!(answer["result"]["compacted"], false);
    assert_eq!(answer["result"]["reason"], coda_shim::coda::compact::TURN_RUNNING);
    assert!(!server_events(&r.records).iter().any(|(_, e)| e["type"] == "summarize.asked"), "OpenCode was not asked");
    let end = r.to_client.iter().any(|f| f["result"]["stopReason"] == "end_turn");
    assert!(end);
}

#[test]
fn opencodes_own_compaction_inside_a_turn_shows_in_the_usage_facts_and_its_summary_does_not() {
    let r = replayed("compact-automatic");
    let events = server_events(&r.records);
    let summary = events
        .iter()
        .map(|(_, e)| e)
        .find(|e| e["type"] == "message.step" && e["summary"] == true && e["completed_ms"].is_u64())
        .expect("OpenCode summarized by itself");
    assert!(events.iter().any(|(_, e)| e["type"] == "session.compacted"));
    let summary_id = summary["message"].as_str().unwrap();
    assert!(!r.to_client.iter().any(|f| f["params"]["update"]["messageId"] == summary_id), "a summary chunk leaked");
    let after = usage_updates(&r.to_client)
        .into_iter()
        .find(|u| coda(u).get("compactedAt").is_some())
        .expect("a usage update after the compaction");
    assert_eq!(coda(after)["compactedAt"], iso(summary["completed_ms"].as_u64().unwrap()));
    assert!(coda(after)["lastRequestAt"].is_string() && coda(after)["contextTokens"].is_u64());
}

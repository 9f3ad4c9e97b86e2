//! Replays of real Grok Build 1.0.41 activity recordings (`fixtures/grok/<scenario>`, made by
//! `tests/grok_live.rs`, and a load's by `tests/facts_live.rs`) through coda-grok, with `acp-replay` as the CLI. The replay proves the shim still
//! sends Coda exactly what it sent live; the assertions spell out what those frames had to be by Coda's
//! rules ("Agent 活动").

use crate::support;

use support::replay as replay_support;

use coda_shim::replay::{self, Body, Dir};
use serde_json::{Value, json};

/// Replays the fixture and returns the frames Coda received in the recording.
fn replayed(scenario: &str) -> Vec<Value> {
    let dir = replay_support::fixtures_root().join("grok").join(scenario);
    replay_support::check("grok", &dir).unwrap_or_else(|e| panic!("grok/{scenario}: {e}"));
    let records = replay::load(&dir.join(replay::TRACE_FILE)).unwrap_or_else(|e| panic!("{scenario}: {e}"));
    records
        .into_iter()
        .filter(|r| r.edge == Dir::ShimToClient)
        .filter_map(|r| match r.body {
            Body::Frame(text) => serde_json::from_str(&text).ok(),
            _ => None,
        })
        .collect()
}

fn waits(frames: &[Value]) -> Vec<Value> {
    frames.iter().filter(|f| f["method"] == "_coda/wait").map(|f| f["params"].clone()).collect()
}

fn states(waits: &[Value], wait_id: &Value) -> Vec<String> {
    waits.iter().filter(|w| w["waitId"] == *wait_id).filter_map(|w| w["state"].as_str().map(str::to_owned)).collect()
}

/// Index of the first frame for which `f` holds.
fn position(frames: &[Value], f: impl Fn(&Value) -> bool) -> usize {
    frames.iter().position(f).unwrap_or(usize::MAX)
}

fn the_session(frames: &[Value]) -> Value {
    frames.iter().find_map(|f| f.pointer("/result/sessionId").cloned()).expect("a session/new answer")
}

#[test]
fn waits_are_declared_and_grok_messages_pass_through() {
    let frames = replayed("bg-task-wakes");
    let init = frames.iter().find(|f| f.pointer("/result/protocolVersion").is_some()).expect("initialize answer");
    assert_eq!(init["result"]["agentCapabilities"]["_meta"]["coda"]["waits"], serde_json::json!({}));
    for method in ["_x.ai/task_backgrounded", "_x.ai/task_completed", "_x.ai/session_notification"] {
        assert!(frames.iter().any(|f| f["method"] == method), "{method} is passed on");
    }
}

#[test]
fn background_command_waits_then_is_handled_in_groks_own_turn() {
    let frames = replayed("bg-task-wakes");
    let w = waits(&frames);
    let open = &w[0];
    assert_eq!(open["kind"], "task");
    assert_eq!(open["sessionId"], the_session(&frames));
    assert_eq!(open["stoppable"], true);
    let backgrounded = frames.iter().find(|f| f["method"] == "_x.ai/task_backgrounded").expect("backgrounded");
    assert_eq!(open["toolCallId"], backgrounded["params"]["update"]["tool_call_id"]);
    assert_eq!(open["waitId"], backgrounded["params"]["update"]["task_id"]);
    assert_eq!(states(&w, &open["waitId"]), ["waiting", "handling", "done"]);
    // handling starts before Grok's own turn streams, and ends after it.
    let wake = format!("task-completed-{}", open["waitId"].as_str().unwrap_or(""));
    let handling = position(&frames, |f| f["params"]["state"] == "handling");
    let done = position(&frames, |f| f["params"]["state"] == "done");
    let wake_output = position(&frames, |f| f.pointer("/params/_meta/promptId").and_then(Value::as_str) == Some(&wake));
    let wake_end = position(&frames, |f| {
        f.pointer("/params/update/prompt_id").and_then(Value::as_str) == Some(&wake)
            && f["params"]["update"]["sessionUpdate"] == "turn_completed"
    });
    assert!(
        handling < wake_output && wake_output < wake_end && wake_end < done,
        "{handling} {wake_output} {wake_end} {done}"
    );
}

#[test]
fn stopping_a_background_command_kills_it_and_reports_cancelled() {
    let frames = replayed("bg-task-stopped");
    let w = waits(&frames);
    assert_eq!(states(&w, &w[0]["waitId"]), ["waiting", "handling", "cancelled"]);
}

#[test]
fn background_subagent_has_its_child_session_and_output() {
    let frames = replayed("subagent-background");
    let w = waits(&frames);
    let open = &w[0];
    assert_eq!(open["kind"], "subagent");
    assert_eq!(states(&w, &open["waitId"]), ["waiting", "handling", "done"]);
    let child = &open["childSessionId"];
    let announced = position(&frames, |f| f["method"] == "_coda/wait" && f["params"]["childSessionId"] == *child);
    let first_child_update =
        position(&frames, |f| f["method"] == "session/update" && f["params"]["sessionId"] == *child);
    assert!(announced < first_child_update && first_child_update != usize::MAX, "announced before the child speaks");
    let spawn_call = frames
        .iter()
        .find(|f| f.pointer("/params/update/_meta/x.ai~1tool/name").and_then(Value::as_str) == Some("spawn_subagent"))
        .expect("the spawn_subagent call");
    assert_eq!(open["toolCallId"], spawn_call["params"]["update"]["toolCallId"]);
}

#[test]
fn resumed_subagent_is_a_new_wait_on_the_same_child_session() {
    let frames = replayed("subagent-foreground-then-resumed");
    let w = waits(&frames);
    let openings: Vec<&Value> = w.iter().filter(|p| p["kind"] == "subagent").collect();
    assert_eq!(openings.len(), 2);
    assert_ne!(openings[0]["waitId"], openings[1]["waitId"]);
    assert_eq!(openings[0]["childSessionId"], openings[1]["childSessionId"]);
    // Foreground: no turn of Grok's own; resumed in the background: handled.
    assert_eq!(states(&w, &openings[0]["waitId"]), ["waiting", "done"]);
    assert_eq!(states(&w, &openings[1]["waitId"]), ["waiting", "handling", "done"]);
    // Grok runs the resumed subagent in a new session of its own; Coda only ever sees the first.
    let grok_child = frames
        .iter()
        .filter(|f| f["params"]["update"]["sessionUpdate"] == "subagent_spawned")
        .filter_map(|f| f["params"]["update"]["child_session_id"].as_str().map(str::to_owned))
        .nth(1)
        .expect("the resumed subagent's own session");
    assert_ne!(Value::from(grok_child.as_str()), openings[0]["childSessionId"]);
    assert!(
        !frames.iter().any(|f| f["method"] == "session/update" && f["params"]["sessionId"] == grok_child.as_str()),
        "session/updates of the resumed run come on the first child session"
    );
}

#[test]
fn stopping_a_subagent_cancels_it() {
    let frames = replayed("subagent-stopped");
    let w = waits(&frames);
    assert_eq!(states(&w, &w[0]["waitId"]), ["waiting", "cancelled"]);
}

/// Steering (section 插话): the steer during the running command is answered `injected` before the one
/// answer of its turn, Grok's echo stays in the shim, and the steer between turns is `promptRequired` with
/// nothing sent to Grok (one `_x.ai/interject` in the whole recording).
#[test]
fn steering_during_a_command_is_injected_and_between_turns_prompt_required() {
    let frames = replayed("steering");
    let init = frames.iter().find(|f| f["id"] == "init").expect("the initialize answer");
    assert_eq!(init["result"]["_meta"]["steering"], serde_json::json!({"supported": true}));
    let answer = |id: &str| position(&frames, |f| f["id"] == id && f.get("method").is_none());
    assert_eq!(frames[answer("steer-1")]["result"], serde_json::json!({"outcome": "injected"}));
    assert!(answer("steer-1") < answer("turn-1"), "injected is answered inside its turn");
    assert_eq!(frames.iter().filter(|f| f["id"] == "turn-1").count(), 1, "one answer to the turn");
    assert_eq!(
        frames[answer("steer-2")]["result"],
        serde_json::json!({"outcome": "promptRequired", "reason": "noRunningTurn"})
    );
    assert!(frames.iter().all(|f| f["method"] != "_x.ai/session/interjection"));
    let dir = replay_support::fixtures_root().join("grok/steering");
    let to_grok = replay_support::recorded_frames(&dir, Dir::ShimToAgent);
    let interjections: Vec<_> = to_grok.iter().filter(|f| f["method"] == "_x.ai/interject").collect();
    assert_eq!(interjections.len(), 1, "the steer between turns reaches Grok never");
    let text = interjections[0]["params"]["text"].as_str().unwrap_or_default();
    assert!(text.starts_with("STEER-7c1d") && text.contains("先别改测试"), "{text}");
    assert!(!to_grok.iter().any(|f| f.to_string().contains("STEER-9e2b")));
}

/// The frames Grok sent the shim in the recording.
fn from_grok(scenario: &str) -> Vec<Value> {
    let dir = replay_support::fixtures_root().join("grok").join(scenario);
    let records = replay::load(&dir.join(replay::TRACE_FILE)).unwrap_or_else(|e| panic!("{scenario}: {e}"));
    records
        .into_iter()
        .filter(|r| r.edge == Dir::AgentToShim)
        .filter_map(|r| match r.body {
            Body::Frame(text) => serde_json::from_str(&text).ok(),
            _ => None,
        })
        .collect()
}

fn usage_updates(frames: &[Value]) -> Vec<Value> {
    frames
        .iter()
        .filter(|f| f.pointer("/params/update/sessionUpdate") == Some(&json!("usage_update")))
        .cloned()
        .collect()
}

fn ms(iso: &Value) -> i64 {
    let t: jiff::Timestamp = iso.as_str().expect("a time").parse().expect("ISO 8601");
    t.as_millisecond()
}

#[test]
fn compaction_between_turns_answers_grok_counts_and_holds_the_prompt_sent_during_it() {
    let frames = replayed("compact-between-turns");
    let init = frames.iter().find(|f| f.pointer("/result/protocolVersion").is_some()).expect("initialize answer");
    assert_eq!(init["result"]["agentCapabilities"]["_meta"]["coda"]["compact"], json!({}));
    let unknown = frames.iter().find(|f| f["id"] == "c-unknown").expect("answered");
    assert_eq!(unknown["result"], json!({"compacted": false, "reason": coda_shim::coda::compact::NOT_RUNNING}));
    let grok = from_grok("compact-between-turns");
    let done = grok
        .iter()
        .find(|f| f.pointer("/params/update/sessionUpdate") == Some(&json!("auto_compact_completed")))
        .expect("Grok's auto_compact_completed");
    let answer = frames.iter().find(|f| f["id"] == "compact").expect("answered");
    assert_eq!(
        answer["result"],
        json!({"compacted": true, "before": done["params"]["update"]["tokens_before"],
            "after": done["params"]["update"]["tokens_after"]})
    );
    // Not a turn: Grok's frames pass on, the one prompt sent during it is answered once, after it.
    assert!(frames.iter().any(|f| f == done), "auto_compact_completed is passed on");
    let at = |id: &str| position(&frames, |f| f["id"] == id && f.get("method").is_none());
    assert!(at("compact") < at("turn-2") && at("turn-2") < usize::MAX);
    assert_eq!(frames.iter().filter(|f| f["id"] == "turn-2").count(), 1);
}

#[test]
fn usage_facts_come_after_each_turn_and_the_compaction_from_groks_stamps() {
    let frames = replayed("compact-between-turns");
    let sid = the_session(&frames);
    let updates = usage_updates(&frames);
    assert_eq!(updates.len(), 3, "after turn 1, after the compaction, after turn 2: {updates:#?}");
    let grok = from_grok("compact-between-turns");
    let stamp = |key: &str| -> Vec<i64> {
        grok.iter().filter_map(|f| f.pointer(&format!("/params/_meta/{key}")).and_then(Value::as_i64)).collect()
    };
    let (turns, streams) = (stamp("turnStartMs"), stamp("streamStartMs"));
    let compacted = grok
        .iter()
        .find(|f| f.pointer("/params/update/sessionUpdate") == Some(&json!("auto_compact_completed")))
        .and_then(|f| f.pointer("/params/_meta/agentTimestampMs").and_then(Value::as_i64))
        .expect("a stamped auto_compact_completed");
    for (i, u) in updates.iter().enumerate() {
        assert_eq!(u["params"]["sessionId"], sid);
        let coda = &u["params"]["update"]["_meta"]["coda"];
        assert_eq!(coda["contextTokens"], 10, "the fake model's input tokens: {u}");
        assert_eq!(u["params"]["update"]["size"], 32000, "the fake model's window (totalContextTokens)");
        let last = ms(&coda["lastRequestAt"]);
        // Between a turn's start and the stream it started.
        assert!(turns.iter().any(|t| *t <= last) && streams.iter().any(|s| *s >= last), "{u}");
        if i == 0 {
            assert!(coda.get("compactedAt").is_none());
        } else {
            assert_eq!(ms(&coda["compactedAt"]), compacted, "Grok's own time of the compaction: {u}");
        }
    }
    assert_eq!(updates[1]["params"]["update"]["used"], json!(8), "after the compaction: Grok's tokens_after");
    assert!(ms(&updates[2]["params"]["update"]["_meta"]["coda"]["lastRequestAt"]) > compacted);
}

#[test]
fn compaction_during_a_turn_is_refused_and_grok_never_hears_of_it() {
    let frames = replayed("compact-during-turn");
    let answer = frames.iter().find(|f| f["id"] == "compact").expect("answered");
    assert_eq!(answer["result"], json!({"compacted": false, "reason": coda_shim::coda::compact::TURN_RUNNING}));
    let dir = replay_support::fixtures_root().join("grok").join("compact-during-turn");
    let records = replay::load(&dir.join(replay::TRACE_FILE)).expect("trace");
    let to_grok = records.iter().filter(|r| r.edge == Dir::ShimToAgent);
    assert!(
        !to_grok
            .filter_map(|r| match &r.body {
                Body::Frame(t) => Some(t.as_str()),
                _ => None,
            })
            .any(|t| t.contains("compact_conversation")),
        "Grok is not asked"
    );
    let updates = usage_updates(&frames);
    assert_eq!(updates.len(), 1, "one after the tool-call turn");
    let end = position(&frames, |f| f["id"] == "turn-1" && f.get("result").is_some());
    let update = position(&frames, |f| f.pointer("/params/update/sessionUpdate") == Some(&json!("usage_update")));
    assert!(update < end, "the usage_update is inside the turn it describes");
}

#[test]
fn a_turn_grok_runs_by_itself_ends_with_a_usage_update_too() {
    let frames = replayed("bg-task-wakes");
    let wake_end = position(&frames, |f| {
        f.pointer("/params/update/prompt_id").and_then(Value::as_str).is_some_and(|p| p.starts_with("task-completed-"))
            && f["params"]["update"]["sessionUpdate"] == "turn_completed"
    });
    assert!(wake_end < usize::MAX, "Grok's own turn ended");
    // Right after it (the wait's own report may come between).
    let next = frames[wake_end + 1..]
        .iter()
        .take(2)
        .find(|f| f.pointer("/params/update/sessionUpdate") == Some(&json!("usage_update")))
        .unwrap_or_else(|| panic!("no usage_update after Grok's own turn: {:#?}", &frames[wake_end..]));
    assert_eq!(next["params"]["sessionId"], the_session(&frames));
    assert!(next["params"]["update"]["_meta"]["coda"]["lastRequestAt"].is_string(), "{next}");
}

/// A session compacted in one process and loaded in a fresh one: the first usage facts after the load name the
/// compaction Grok kept in the session folder's `updates.jsonl` (which the player re-creates as the load found
/// it), at Grok's own time of it, and the turn's own request after it. The recording's instants are
/// placeholders (`{{AT_n}}`), so the replay's own frames are read from the shim's trace of it.
#[test]
fn facts_after_a_load_name_the_compaction_grok_kept_in_its_session_folder() {
    let dir = replay_support::fixtures_root().join("grok").join("load-after-compaction");
    let temp = support::temp::TempDir::new("grok-load-replay");
    let trace = temp.path().join("replay.jsonl");
    let trace_env = trace.to_str().expect("a UTF-8 path");
    replay_support::check_with_env("grok", &dir, &[("CODA_SHIM_TRACE", trace_env)])
        .unwrap_or_else(|e| panic!("grok/load-after-compaction: {e}"));
    let records = replay::load(&dir.join(replay::TRACE_FILE)).expect("the fixture");
    let file = records
        .iter()
        .find_map(|r| match &r.body {
            Body::File(op) if op.path.ends_with("/updates.jsonl") => op.data.clone(),
            _ => None,
        })
        .expect("the session folder's updates.jsonl, as the load read it");
    let compacted = file
        .lines()
        .rev()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|v| v.pointer("/params/update/sessionUpdate") == Some(&json!("auto_compact_completed")))
        .find_map(|v| v.pointer("/params/_meta/agentTimestampMs").and_then(Value::as_i64))
        .expect("a stamped auto_compact_completed in the file");
    let text = std::fs::read_to_string(&trace).expect("the shim's trace of the replay");
    let to_client: Vec<Value> = text
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|r| r["dir"] == "shim->client")
        .map(|r| r["frame"].clone())
        .collect();
    let updates = usage_updates(&to_client);
    let first = &updates.first().expect("usage facts after the load's turn")["params"]["update"]["_meta"]["coda"];
    assert_eq!(ms(&first["compactedAt"]), compacted, "Grok's own time of the compaction, from its file: {first}");
    assert!(ms(&first["lastRequestAt"]) > compacted, "the turn's own request, after it: {first}");
}

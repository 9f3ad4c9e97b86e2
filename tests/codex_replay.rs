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
use coda_shim::layer::testing::wall_start;
use coda_shim::layer::{AnyLayer, Exits, Stack};
use coda_shim::replay::{Bindings, FileOp, Normaliser, apply_file_op, match_value};
use serde_json::{Value, json};
use std::time::{Duration, Instant, SystemTime};

/// The Codex CLI the recordings were made with (`@openai/codex` bundled by codex-acp 2.6.0).
const CODEX_VERSION: &str = "0.166.0";

struct Replay {
    /// What Coda received, in order.
    to_client: Vec<Value>,
    /// What codex-acp received, in order.
    to_agent: Vec<Value>,
    /// The fixture's records (`t`, `dir`, `frame`).
    records: Vec<Value>,
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

    /// The `t` of the first record seen at `dir` for which `is` holds.
    fn t(&self, dir: &str, what: &str, is: impl Fn(&Value) -> bool) -> u64 {
        let r = self.records.iter().find(|r| r["dir"] == dir && is(&r["frame"]));
        r.and_then(|r| r["t"].as_u64()).unwrap_or_else(|| panic!("no {what} at {dir}"))
    }

    /// The `t` of the input (a client or agent frame) that made the shim send the first record at `dir` for
    /// which `is` holds: the time the shim's layers were handed.
    fn cause_t(&self, dir: &str, what: &str, is: impl Fn(&Value) -> bool) -> u64 {
        let at = self.records.iter().position(|r| r["dir"] == dir && is(&r["frame"]));
        let at = at.unwrap_or_else(|| panic!("no {what} at {dir}"));
        let input = self.records[..at].iter().rev().find(|r| r["dir"] == "client->shim" || r["dir"] == "agent->shim");
        input.and_then(|r| r["t"].as_u64()).expect("an input before it")
    }

    /// The `t`s of every record at `dir` for which `is` holds.
    fn ts(&self, dir: &str, is: impl Fn(&Value) -> bool) -> Vec<u64> {
        self.records.iter().filter(|r| r["dir"] == dir && is(&r["frame"])).filter_map(|r| r["t"].as_u64()).collect()
    }

    /// The root session's updates of kind `kind` Coda got: (index in what Coda got, update).
    fn updates(&self, kind: &str) -> Vec<(usize, Value)> {
        let sid = self.session();
        let of = |f: &Value| f["params"]["sessionId"] == sid.as_str() && f["params"]["update"]["sessionUpdate"] == kind;
        self.to_client
            .iter()
            .enumerate()
            .filter(|(_, f)| of(f))
            .map(|(i, f)| (i, f["params"]["update"].clone()))
            .collect()
    }

    /// The facts of the root usage updates that carry them, in order: each has contextTokens and lastRequestAt
    /// (Codex's `used` is the context of a main-thread request's response, or, during a compaction, of its
    /// summarising request or Codex's estimate after it, which change no fact).
    fn facts(&self) -> Vec<Value> {
        let updates = self.updates("usage_update");
        assert!(!updates.is_empty());
        updates
            .iter()
            .filter(|(_, u)| u.pointer("/_meta/coda").is_some())
            .map(|(_, u)| {
                let facts = u["_meta"]["coda"].clone();
                assert!(facts["contextTokens"].is_u64(), "{u}");
                assert!(facts["lastRequestAt"].is_string(), "{u}");
                facts
            })
            .collect()
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

/// Compares what a peer got with the recording: placeholders in the recording (`{{AT_n}}`, the usage facts'
/// instants) bind on first sight and must hold after.
fn assert_frames(got: &[Frame], recorded: &[Value], name: &str, peer: &str, bind: &mut Bindings) -> Vec<Value> {
    let got: Vec<Value> = got.iter().map(|f| f.value().clone()).collect();
    assert_eq!(got.len(), recorded.len(), "{name}: number of frames {peer} got");
    for (i, (got, want)) in got.iter().zip(recorded).enumerate() {
        if let Err(d) = match_value(want, got, bind) {
            panic!("{name}: frame {i} to {peer}: {d}\n got: {got}\nwant: {want}");
        }
    }
    got
}

/// The wall-clock time the replays start at: the recording's `t` (ms) is added to it, so that the usage facts'
/// instants are the same on every run.
fn replay_start() -> SystemTime {
    wall_start()
}

/// The instant `ms` after the replay's start, as the usage facts write it.
fn at(ms: u64) -> String {
    coda_shim::coda::usage::iso(replay_start() + Duration::from_millis(ms)).expect("an instant")
}

/// A line of a fixture being derived anew: a recorded input, or what the stack sent out for it.
enum Derived {
    Input(String),
    Output(&'static str, u64, Frame),
}

/// `value` without the usage facts (`_meta.coda` of a usage update, and a `_meta` left empty by that).
fn without_facts(value: &Value) -> Value {
    let mut v = value.clone();
    if let Some(update) = v.pointer_mut("/params/update").and_then(Value::as_object_mut)
        && let Some(meta) = update.get_mut("_meta").and_then(Value::as_object_mut)
    {
        meta.remove("coda");
        if meta.is_empty() {
            update.remove("_meta");
        }
    }
    v
}

/// The same answer (its id), or the same kind of notification (method and update kind).
fn same_message(a: &Value, b: &Value) -> bool {
    let key = |v: &Value| {
        (v.get("id").cloned(), v.get("method").cloned(), v.pointer("/params/update/sessionUpdate").cloned())
    };
    key(a) == key(b)
}

/// Writes the derived fixture: each output the recording has (equal, or equal but for the usage facts) keeps
/// its recorded line or takes the derived frame; an output the recording lacks is added where it was sent.
fn write_rederived(path: &Path, derived: Vec<Derived>, recorded: Vec<(&'static str, Value, String)>) {
    let mut queues: std::collections::HashMap<&str, std::collections::VecDeque<(Value, String)>> = Default::default();
    for (dir, v, line) in recorded {
        queues.entry(dir).or_default().push_back((v, line));
    }
    let mut lines = Vec::new();
    for d in derived {
        match d {
            Derived::Input(line) => lines.push(line),
            Derived::Output(dir, t, frame) => {
                let got = frame.value();
                let shim = if frame.is_shim() { ",\"shim\":true" } else { "" };
                let text = String::from_utf8(frame.bytes().to_vec()).expect("utf-8");
                let ours = format!("{{\"t\":{t},\"dir\":\"{dir}\"{shim},\"frame\":{text}}}");
                let recorded = queues.entry(dir).or_default();
                match recorded.front() {
                    // A frame with usage facts is always the derived one (its instants are numbered anew below).
                    Some((want, line))
                        if got.pointer("/params/update/_meta/coda").is_none()
                            && match_value(want, got, &mut Bindings::default()).is_ok() =>
                    {
                        lines.push(line.clone());
                        recorded.pop_front();
                    }
                    Some((want, line)) if without_facts(got) == *want || same_message(want, got) => {
                        // The recorded time, the frame as the shim sends it now.
                        let t = serde_json::from_str::<Value>(line).expect("json")["t"].as_u64().unwrap_or(t);
                        lines.push(format!("{{\"t\":{t},\"dir\":\"{dir}\",\"shim\":true,\"frame\":{text}}}"));
                        recorded.pop_front();
                    }
                    _ => lines.push(ours),
                }
            }
        }
    }
    let left: usize = queues.values().map(|q| q.len()).sum();
    assert_eq!(left, 0, "the recording has outputs the stack did not send: derive by hand");
    let normalised = Normaliser::default().apply(&lines.join("\n"));
    let mut records = coda_shim::replay::parse_records(&normalised).expect("records");
    coda_shim::replay::instants::placeholders(&mut records);
    std::fs::write(path, coda_shim::replay::render(&records)).expect("write the fixture");
}

/// The Codex CLI version of a fixture recorded on another Codex than codex-acp's own: its `codex-cli` stand-in
/// says it (`echo "codex-cli 0.171.0"`).
fn fixture_codex_version(trace: &Path) -> Option<String> {
    let stand_in = std::fs::read_to_string(trace.parent()?.join("codex-cli")).ok()?;
    let line = stand_in.lines().find(|l| l.starts_with("echo "))?;
    let version = line.trim_start_matches("echo ").trim_matches('"').strip_prefix("codex-cli ")?;
    Some(version.to_owned())
}

/// Replays `fixtures/codex/<name>/trace.jsonl`; both peers must get exactly the recorded frames. With
/// `CODA_REDERIVE=<name>,…` (or `all`) the fixture's shim output is written anew from this stack (the recorded peers' frames
/// kept as they are): for a change of the shim's output that needs no new recording; review the diff.
fn replay(name: &str) -> Replay {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/codex").join(name).join("trace.jsonl");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    // The shim's own request ids carry its pid; the stack in this process uses this pid. Codex's data folder (a
    // loaded thread's rollout file) is a fresh one.
    let home = tempfile::tempdir().expect("a data folder");
    let text = text
        .replace("{{SHIM_PID}}", &std::process::id().to_string())
        .replace("{{CODEX_HOME}}", &home.path().display().to_string());
    // As the binary stacks them: the engine's Waits, Codex's identity (its version probed), Codex's layers.
    let version = fixture_codex_version(&path).unwrap_or_else(|| CODEX_VERSION.into());
    let mut layers: Vec<Box<dyn AnyLayer>> =
        vec![Box::new(Waits::new()), Box::new(Identity::new("codex", Policy::Replace, Some(version)))];
    let usage = codex::usage::layer(Some(home.path().to_path_buf()), None);
    layers.extend(codex::below_identity(jiff::tz::TimeZone::UTC, coda_shim::coda::failure::RETRY_PATIENCE, usage));
    let mut stack = Stack::new(layers);
    let mut exits = Exits::default();
    let (mut recorded_client, mut recorded_agent) = (Vec::new(), Vec::new());
    let rederive = std::env::var("CODA_REDERIVE").is_ok_and(|n| n == "all" || n.split(',').any(|n| n == name));
    let (mut derived, mut seen, mut recorded_lines) = (Vec::new(), (0, 0), Vec::new());
    let start = Instant::now();
    for (n, line) in text.lines().enumerate() {
        let record: Value = serde_json::from_str(line).unwrap_or_else(|e| panic!("{name} line {}: {e}", n + 1));
        if let Some(op) = record.get("file") {
            let op: FileOp =
                serde_json::from_value(op.clone()).unwrap_or_else(|e| panic!("{name} line {}: {e}", n + 1));
            apply_file_op(&op).unwrap_or_else(|e| panic!("{name} line {}: {e}", n + 1));
            if rederive {
                derived.push(Derived::Input(line.replace(&home.path().display().to_string(), "{{CODEX_HOME}}")));
            }
            continue;
        }
        let Some(f) = record.get("frame") else {
            // The recorded shim's name and arguments.
            if rederive {
                derived.push(Derived::Input(line.to_owned()));
            }
            continue;
        };
        let t = record["t"].as_u64().unwrap_or(0);
        stack.set_time(start + Duration::from_millis(t), replay_start() + Duration::from_millis(t));
        match record["dir"].as_str() {
            Some("client->shim") => stack.from_client(frame(f), &mut exits),
            Some("agent->shim") => stack.from_agent(frame(f), &mut exits),
            Some("shim->client") => recorded_client.push(f.clone()),
            Some("shim->agent") => recorded_agent.push(f.clone()),
            other => panic!("{name} line {}: unexpected dir {other:?}", n + 1),
        }
        if rederive {
            match record["dir"].as_str() {
                Some(dir @ ("shim->agent" | "shim->client")) => {
                    let dir = if dir == "shim->agent" { "shim->agent" } else { "shim->client" };
                    recorded_lines.push((dir, f.clone(), line.to_owned()))
                }
                _ => derived.push(Derived::Input(line.to_owned())),
            }
            for (dir, frames, from) in
                [("shim->agent", &exits.to_agent, &mut seen.0), ("shim->client", &exits.to_client, &mut seen.1)]
            {
                for out in &frames[*from..] {
                    derived.push(Derived::Output(dir, t, out.clone()));
                }
                *from = frames.len();
            }
        }
    }
    if rederive {
        write_rederived(&path, derived, recorded_lines);
        panic!("{name}: rederived into {}; review the diff and run again", path.display());
    }
    let mut bind = Bindings::default();
    let to_agent = assert_frames(&exits.to_agent, &recorded_agent, name, "codex-acp", &mut bind);
    let to_client = assert_frames(&exits.to_client, &recorded_client, name, "Coda", &mut bind);
    let records = text.lines().map(|l| serde_json::from_str(l).expect("a record")).collect();
    let r = Replay { to_client, to_agent, records };
    r.assert_air_consumed();
    r
}

/// The initialize answer: Codex's identity, waits declared, codex-acp's systemPrompt and steering kept.
fn check_initialize(r: &Replay, id: u64) {
    let result = &r.answer(id)["result"];
    assert_eq!(result["agentInfo"], json!({"name":"codex","version":CODEX_VERSION}));
    assert_eq!(result["agentCapabilities"]["_meta"]["coda"], json!({"waits":{},"compact":{}}));
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
    // 503: Codex's overloaded server, a temporary failure of the service.
    assert!(r.answer(6)["error"]["message"].as_str().is_some_and(|m| m.contains("at capacity")));
    assert_eq!(failure(6), json!({"kind":"service_unavailable","input":"accepted"}));
    // 429 rate limit (any 429: it may be a quota), 500 (any): no explicit reason, plain errors Coda never retries.
    for (id, text) in [(4, "429 Too Many Requests"), (5, "high demand")] {
        assert_eq!(r.answer(id)["error"]["code"], -32603);
        assert!(r.answer(id)["error"]["message"].as_str().is_some_and(|m| m.contains(text)), "{id}");
        assert_eq!(failure(id), Value::Null, "{id}");
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
fn every_codex_fixture_replays_through_the_layers() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/codex");
    let mut names: Vec<String> = std::fs::read_dir(&dir)
        .expect("fixtures/codex")
        .filter_map(|e| e.ok())
        .filter(|e| e.path().join("trace.jsonl").is_file())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert!(names.len() >= 14, "{names:?}");
    let mut failed = Vec::new();
    for name in &names {
        if std::panic::catch_unwind(|| replay(name)).is_err() {
            failed.push(name.clone());
        }
    }
    assert!(failed.is_empty(), "{failed:?}");
}

fn is_prompt(text: &'static str) -> impl Fn(&Value) -> bool {
    move |f: &Value| f["method"] == "session/prompt" && f["params"]["prompt"][0]["text"].as_str() == Some(text)
}

fn is_update(kind: &'static str, status: &'static str) -> impl Fn(&Value) -> bool {
    move |f: &Value| f["params"]["update"]["sessionUpdate"] == kind && f["params"]["update"]["status"] == status
}

#[test]
fn compaction_between_turns_is_the_shims_own_prompt_and_the_prompt_sent_during_it_waits() {
    let r = replay("compact-between-turns");
    check_initialize(&r, 1);
    let (compact, during, refused) = (4, 5, 7);
    let answer = r.answer(compact)["result"].clone();
    assert_eq!(answer["compacted"], true);
    let before = answer["before"].as_u64().unwrap();
    // before: Codex's context when it started (as the model reported it); no after: Codex's figure after the
    // compaction is its own estimate, another measure.
    assert!(answer.get("after").is_none(), "{answer}");
    let ci = r.at("compaction start", is_update("compaction_update", "in_progress"));
    let cc = r.at("compaction end", is_update("compaction_update", "completed"));
    let used_before: Vec<u64> =
        r.updates("usage_update").iter().filter(|(i, _)| *i < ci).map(|(_, u)| u["used"].as_u64().unwrap()).collect();
    assert_eq!(used_before.last(), Some(&before));
    let used_inside: Vec<u64> = r
        .updates("usage_update")
        .iter()
        .filter(|(i, _)| ci < *i && *i < cc)
        .map(|(_, u)| u["used"].as_u64().unwrap())
        .collect();
    let after = *used_inside.last().expect("Codex's estimate after");
    assert!(after < before);
    // No turn content of the shim's prompt reached Coda, nor its answer.
    let answered = r.at("compact answer", |f| f["id"] == compact);
    for f in &r.to_client[r.at("after the prompt", |f| f["id"] == 3) + 1..answered] {
        let update = &f["params"]["update"];
        let kind = update["sessionUpdate"].as_str().unwrap_or_default();
        let turn = ["agent_message_chunk", "agent_thought_chunk", "tool_call", "tool_call_update", "plan"];
        assert!(!turn.contains(&kind) && update.pointer("/_meta/codex/threadStatus").is_none(), "{f}");
    }
    assert!(r.to_client.iter().all(|f| f["result"]["stopReason"] != "end_turn" || f["id"].is_u64()));
    // codex-acp got the shim's /compact, then (held until it was answered) Coda's prompt.
    let own = r.to_agent.iter().position(is_prompt("/compact")).expect("the shim's /compact");
    let held = r.to_agent.iter().position(|f| f["id"] == during).expect("the held prompt");
    assert!(own < held);
    assert!(
        r.t("shim->agent", "the held prompt", |f| f["id"] == during)
            >= r.t("agent->shim", "the compaction's end", is_update("compaction_update", "completed"))
    );
    assert!(answered < r.at("the held prompt's answer", |f| f["id"] == during));
    // compactedAt: when Codex said completed, on the shim's own update right after it and every one after.
    let completed_at = at(r.t("agent->shim", "completed", is_update("compaction_update", "completed")));
    let own_update = &r.to_client[cc + 1]["params"]["update"];
    assert_eq!(own_update["sessionUpdate"], "usage_update");
    assert_eq!(own_update["used"], after);
    assert_eq!(own_update["_meta"]["coda"]["compactedAt"], completed_at);
    let facts = r.facts();
    let from = facts.iter().position(|f| f.get("compactedAt").is_some()).unwrap();
    assert!(facts[from..].iter().all(|f| f["compactedAt"] == completed_at));
    // The first update of each turn names the request the forwarded prompt started.
    for text in ["[[sh:seq 1 3000]]", "after [[text:done]]"] {
        let sent = r.cause_t("shim->agent", text, is_prompt(text));
        let first = r.updates("usage_update").into_iter().find(|(i, _)| r.ts("shim->client", |_| true)[*i] >= sent);
        let (_, u) = first.expect("an update after the prompt");
        assert_eq!(u["_meta"]["coda"]["lastRequestAt"], at(sent), "{text}");
    }
    // During a turn: refused at once, nothing sent to codex-acp for it.
    assert_eq!(r.answer(refused)["result"], json!({"compacted":false,"reason":coda_shim::coda::compact::TURN_RUNNING}));
    assert_eq!(r.to_agent.iter().filter(|f| is_prompt("/compact")(f)).count(), 1);
}

#[test]
fn codex_compacting_by_itself_inside_a_turn_sets_compacted_at() {
    let r = replay("compact-automatic");
    let cc = r.at("compaction end", is_update("compaction_update", "completed"));
    let prompt = r.at("the turn's answer", |f| f["id"] == 4);
    assert!(
        r.at("compaction start", is_update("compaction_update", "in_progress")) < cc && cc < prompt,
        "inside the turn"
    );
    let completed_t = r.t("agent->shim", "completed", is_update("compaction_update", "completed"));
    let own = &r.to_client[cc + 1]["params"]["update"];
    assert_eq!(own["_meta"]["coda"]["compactedAt"], at(completed_t));
    // The request Codex goes on with starts when the compaction completed.
    let next = r.updates("usage_update").into_iter().find(|(i, _)| *i > cc + 1).expect("an update after it").1;
    assert_eq!(
        next["_meta"]["coda"],
        json!({"lastRequestAt":at(completed_t),"contextTokens":next["used"],"compactedAt":at(completed_t)})
    );
    let facts = r.facts();
    assert!(facts.iter().rev().take_while(|f| f.get("compactedAt").is_some()).count() >= 2);
}

#[test]
fn usage_facts_over_turns_with_tool_calls_name_each_request() {
    let r = replay("usage-tool-calls");
    let facts = r.facts();
    assert_eq!(facts.len(), 4, "one update per main-thread response: {facts:?}");
    let first = r.cause_t("shim->agent", "the first prompt", is_prompt("[[sh:echo one]] [[sh:echo two]]"));
    let second = r.cause_t("shim->agent", "the second prompt", is_prompt("[[sh:echo three]]"));
    let ended = |after: u64, before: u64| {
        let ts = r.ts("agent->shim", is_update("tool_call_update", "completed"));
        ts.into_iter().filter(|t| *t > after && *t < before).max().expect("a tool ended")
    };
    // The first response of each turn answers the forwarded prompt; the second, the last tool's end.
    assert_eq!(facts[0]["lastRequestAt"], at(first));
    assert_eq!(facts[1]["lastRequestAt"], at(ended(first, second)));
    assert_eq!(facts[2]["lastRequestAt"], at(second));
    assert_eq!(facts[3]["lastRequestAt"], at(ended(second, u64::MAX)));
    assert!(facts.iter().all(|f| f.get("compactedAt").is_none() && f.get("cacheTtl").is_none()));
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

//! Live: Grok Build's background commands and subagents, Coda's steering and compaction, through coda-grok,
//! recorded as fixtures.
//!
//! Opt-in: `CODA_LIVE=1 cargo test --test all grok_live::` (after `scripts/install-clis grok`); with `CODA_RECORD=1`
//! the recordings go to `fixtures/grok/<scenario>/`. Each activity scenario asserts the `_coda/wait` sequence
//! Coda got from the real CLI, then replays its recording through the same shim. `live_grok_steering` (section
//! 插话): a steer during a running tool call is answered `injected`, the model's next request carries its text
//! exactly once, and the turn ends as one `session/prompt` answer; a steer between turns is answered
//! `promptRequired` and Grok (and so the model) never sees it. `live_grok_compact_and_usage` (sections 压缩上下文,
//! 用量里的数据): `_coda/session/compact` between turns compacts (the next model request is smaller) with a
//! prompt sent during it run after it, during a turn and for an unknown session it is refused, and every root
//! `usage_update` matches the fake model's log (`lastRequestAt` within 250 ms of the request's arrival).

use crate::support;

use support::{coda_text, fake_model, live, recorder as rig, replay as replay_support, shim, temp};

use std::path::Path;
use std::time::{Duration, Instant};

use rig::{Rec, keep};
use serde_json::{Value, json};

const LONG: Duration = Duration::from_secs(60);

fn state_of(waits: &[Value], wait_id: &str) -> Vec<String> {
    waits.iter().filter(|w| w["waitId"] == wait_id).map(|w| w["state"].as_str().unwrap_or("").to_owned()).collect()
}

fn scenario(root: &Path, lc: &live::LiveCommand, name: &str, notes: &str, run: impl FnOnce(&mut Rec)) {
    let trace = root.join("traces").join(format!("{name}.jsonl"));
    std::fs::create_dir_all(trace.parent().expect("dir")).expect("traces dir");
    let mut rec = Rec::start(lc, "grok", &trace);
    run(&mut rec);
    rec.finish();
    keep("grok", name, &trace, root, notes);
}

#[test]
fn record_grok_activity() {
    if !live::wanted("grok", "live Grok recordings") {
        return;
    }
    let model = fake_model::FakeModel::start();
    let temp = temp::TempDir::new("coda-grok-activity");
    let root = temp.path().to_path_buf();
    let lc = live::prepare("grok", &model.base_url(), &root).expect("prepare Grok");

    scenario(
        &root,
        &lc,
        "bg-task-wakes",
        "run_terminal_command in the background; Grok runs a turn of its own on the result (task-completed-<id>)",
        |rec| {
            rec.new_session(true);
            rec.prompt("build it [[bg:sleep 1; echo built]]");
            let open = rec.until_wait(LONG, |w| w["kind"] == "task");
            let id = open["waitId"].as_str().expect("waitId").to_owned();
            assert_eq!(open["state"], "waiting");
            assert_eq!(open["stoppable"], true);
            assert!(open["toolCallId"].is_string() && open["outputFile"].is_string(), "{open}");
            rec.until_wait(LONG, |w| w["waitId"] == id.as_str() && w["state"] == "done");
            rec.quiet(Duration::from_millis(1500));
            assert_eq!(state_of(&rec.waits(), &id), ["waiting", "handling", "done"]);
        },
    );

    scenario(
        &root,
        &lc,
        "bg-task-stopped",
        "a background command stopped with _coda/wait/stop (_x.ai/task/kill)",
        |rec| {
            rec.new_session(true);
            rec.prompt("wait long [[bg:sleep 30]]");
            let open = rec.until_wait(LONG, |w| w["kind"] == "task");
            let id = open["waitId"].as_str().expect("waitId").to_owned();
            let answer = rec.call("_coda/wait/stop", json!({"sessionId": rec.session, "waitId": id}));
            assert_eq!(answer["result"], json!({}));
            rec.until_wait(LONG, |w| w["waitId"] == id.as_str() && w["state"] == "cancelled");
            rec.quiet(Duration::from_millis(1500));
            assert_eq!(state_of(&rec.waits(), &id), ["waiting", "handling", "cancelled"]);
        },
    );

    scenario(
        &root,
        &lc,
        "subagent-background",
        "a background subagent: its output on its child session, then Grok's own turn on its result",
        |rec| {
            rec.new_session(true);
            rec.prompt("delegate [[subagent:helper|child work [[delay:800]][[text:child result]]]]");
            let open = rec.until_wait(LONG, |w| w["kind"] == "subagent");
            let id = open["waitId"].as_str().expect("waitId").to_owned();
            let child = open["childSessionId"].as_str().expect("childSessionId").to_owned();
            assert!(open["toolCallId"].is_string(), "{open}");
            rec.until_wait(LONG, |w| w["waitId"] == id.as_str() && w["state"] == "done");
            rec.quiet(Duration::from_millis(1500));
            assert_eq!(state_of(&rec.waits(), &id), ["waiting", "handling", "done"]);
            let child_said = rec.received.iter().any(|f| {
                f["method"] == "session/update"
                    && f["params"]["sessionId"] == child.as_str()
                    && f["params"]["update"]["sessionUpdate"] == "agent_message_chunk"
            });
            assert!(child_said, "the child's output reaches Coda on the child session");
        },
    );

    scenario(
        &root,
        &lc,
        "subagent-foreground-then-resumed",
        "a foreground subagent, then resume_from it: a new wait on the same child session",
        |rec| {
            rec.new_session(true);
            rec.prompt("ask [[subagent-fg:helper|first part [[text:first result]]]]");
            let first = rec.until_wait(LONG, |w| w["kind"] == "subagent");
            let first_id = first["waitId"].as_str().expect("waitId").to_owned();
            rec.until_wait(LONG, |w| w["waitId"] == first_id.as_str() && w["state"] == "done");
            rec.quiet(Duration::from_millis(1000));
            assert_eq!(state_of(&rec.waits(), &first_id), ["waiting", "done"]);
            rec.prompt("again [[resume:last|second part [[text:second result]]]]");
            let second = rec.until_wait(LONG, |w| w["kind"] == "subagent" && w["waitId"] != first_id.as_str());
            assert_eq!(second["childSessionId"], first["childSessionId"], "rule 5: same child session");
            let second_id = second["waitId"].as_str().expect("waitId").to_owned();
            rec.until_wait(LONG, |w| w["waitId"] == second_id.as_str() && w["state"] == "done");
            rec.quiet(Duration::from_millis(1500));
        },
    );

    scenario(
        &root,
        &lc,
        "subagent-stopped",
        "a background subagent stopped with _coda/wait/stop (_x.ai/subagent/cancel)",
        |rec| {
            rec.new_session(true);
            rec.prompt("slow [[subagent:slow|child slow [[delay:20000]][[text:late]]]]");
            let open = rec.until_wait(LONG, |w| w["kind"] == "subagent");
            let id = open["waitId"].as_str().expect("waitId").to_owned();
            rec.quiet(Duration::from_millis(500));
            let answer = rec.call("_coda/wait/stop", json!({"sessionId": rec.session, "waitId": id}));
            assert_eq!(answer["result"], json!({}));
            rec.until_wait(LONG, |w| w["waitId"] == id.as_str() && w["state"] == "cancelled");
            rec.quiet(Duration::from_millis(1500));
            assert_eq!(state_of(&rec.waits(), &id), ["waiting", "cancelled"]);
        },
    );

    drop(model);
    drop(temp);
}

/// Longest wait for one answer in the steering scenario.
const ANSWER: Duration = Duration::from_secs(120);
/// What Coda steers in: several paragraphs, Markdown, Chinese, as a user types it.
const DURING: &str = "STEER-7c1d: leave the tests alone.\n\n先别改测试,只看实现:\n- the link step\n- `build.rs`";
const BETWEEN: &str = "STEER-9e2b: and after that, the iPhone target.";

struct Client {
    shim: shim::Shim,
    received: Vec<Value>,
    /// Permission requests are left unanswered (the test answers them).
    hold_permissions: bool,
}

impl Client {
    /// Reads one frame (answering permission requests with "allow once"); `None` after `wait` without one.
    fn read(&mut self, wait: Duration) -> Option<Value> {
        let line = self.shim.try_recv(wait)?;
        let v: Value = serde_json::from_str(&line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}"));
        if v["method"] == "session/request_permission" && !self.hold_permissions {
            let options = v.pointer("/params/options").and_then(Value::as_array).cloned().unwrap_or_default();
            let allow = options.iter().find(|o| o["kind"] == "allow_once").or(options.first());
            let option = allow.and_then(|o| o["optionId"].as_str()).unwrap_or("allow").to_owned();
            let outcome = json!({"outcome": {"outcome": "selected", "optionId": option}});
            self.shim.send_json(&json!({"jsonrpc": "2.0", "id": v["id"], "result": outcome}));
        }
        self.received.push(v.clone());
        Some(v)
    }

    /// Reads until a frame for which `want` holds; panics after `within`.
    fn until(&mut self, within: Duration, what: &str, want: impl Fn(&Value) -> bool) -> Value {
        let deadline = Instant::now() + within;
        while Instant::now() < deadline {
            if let Some(v) = self.read(Duration::from_millis(200))
                && want(&v)
            {
                return v;
            }
        }
        panic!("no {what} within {within:?}; stderr: {:?}", self.shim.drain_stderr());
    }

    fn send(&mut self, id: &str, method: &str, params: Value) {
        self.shim.send_json(&json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}));
    }

    fn call(&mut self, id: &str, method: &str, params: Value) -> Value {
        self.send(id, method, params);
        self.until(ANSWER, method, |v| v["id"] == id && v.get("method").is_none())
    }

    fn quiet(&mut self, gap: Duration) {
        while self.read(gap).is_some() {}
    }

    fn answers_to(&self, id: &str) -> usize {
        self.received.iter().filter(|v| v["id"] == id && v.get("method").is_none()).count()
    }
}

fn steering(session: &str, text: &str) -> Value {
    json!({"sessionId": session, "prompt": [{"type": "text", "text": text}],
        "_meta": {"steering": {"idleBehavior": "promptRequired"}}})
}

/// How often `text` is in the model request's body (as the JSON string it is sent in).
fn times_in(r: &fake_model::RecordedRequest, text: &str) -> usize {
    let quoted = serde_json::to_string(text).expect("a string");
    r.body.to_string().matches(quoted.trim_matches('"')).count()
}

#[test]
fn live_grok_steering() {
    if !live::wanted("grok", "live Grok steering") {
        return;
    }
    let model = fake_model::FakeModel::start_with(fake_model::Options { log_requests: true, dump_dir: None });
    let temp = temp::TempDir::new("coda-grok-steering");
    let root = temp.path().to_path_buf();
    let lc = live::prepare("grok", &model.base_url(), &root).expect("prepare Grok");
    let trace = root.join("steering.jsonl");
    let cmd = lc.shim_command(&replay_support::shim_binary("grok"));
    let shim = shim::Builder::from_command(cmd).arg("--trace-file").arg(&trace.display().to_string()).start();
    let mut c = Client { shim, received: Vec::new(), hold_permissions: false };

    let caps = json!({"fs": {"readTextFile": false, "writeTextFile": false}, "terminal": false,
        "_meta": {"coda": {"waits": {}}}});
    let init = c.call(
        "init",
        "initialize",
        json!({"protocolVersion": 1, "clientCapabilities": caps, "clientInfo": {"name": "coda", "version": "1.0.0"}}),
    );
    assert_eq!(init["result"]["_meta"]["steering"], json!({"supported": true}), "{init}");
    c.quiet(Duration::from_millis(1000));
    let new = c.call(
        "new",
        "session/new",
        json!({"cwd": lc.workdir.display().to_string(), "mcpServers": [],
            "systemPrompt": coda_text::system_prompt(coda_text::INSTRUCTION)}),
    );
    let sid = new["result"]["sessionId"].as_str().expect("a session").to_owned();
    c.quiet(Duration::from_millis(1500));

    // During a running tool call.
    let text = format!("{}\n\n[[sh:sleep 4; echo built]]", coda_text::FIRST_PROMPT);
    c.send("turn-1", "session/prompt", shim::prompt_params(&sid, &text));
    c.until(ANSWER, "the running command", |v| {
        v.pointer("/params/update/sessionUpdate") == Some(&json!("tool_call_update"))
            && v.pointer("/params/update/rawOutput/command").is_some()
    });
    let asked_before = model.model_requests().len();
    let answer = c.call("steer-1", "_session/steering", steering(&sid, DURING));
    assert_eq!(answer["result"], json!({"outcome": "injected"}), "{answer}");
    let end = c.until(ANSWER, "the turn's answer", |v| v["id"] == "turn-1");
    assert_eq!(end["result"]["stopReason"], "end_turn", "{end}");
    c.quiet(Duration::from_millis(2000));
    assert_eq!(c.answers_to("turn-1"), 1, "the turn ends as one session/prompt answer");
    assert_eq!(c.answers_to("steer-1"), 1);
    let steer_at = c.received.iter().position(|v| v["id"] == "steer-1").expect("answered");
    let end_at = c.received.iter().position(|v| v["id"] == "turn-1").expect("answered");
    assert!(steer_at < end_at, "injected is answered before the turn ends");
    assert!(
        !c.received.iter().any(|v| v["method"] == "_x.ai/session/interjection"),
        "Grok's echo of the message is the shim's business"
    );
    let requests = model.model_requests();
    let main: Vec<_> = requests[asked_before..].iter().filter(|r| r.origin == fake_model::Origin::Main).collect();
    let next = main.first().expect("a model request after the steer");
    assert_eq!(times_in(next, DURING), 1, "the model's next request carries the message once");
    assert!(requests.iter().all(|r| times_in(r, DURING) <= 1), "no request carries it twice");

    // Between turns.
    let seen = model.model_requests().len();
    let answer = c.call("steer-2", "_session/steering", steering(&sid, BETWEEN));
    assert_eq!(answer["result"], json!({"outcome": "promptRequired", "reason": "noRunningTurn"}), "{answer}");
    c.quiet(Duration::from_millis(3000));
    let after = model.model_requests();
    assert!(after.iter().all(|r| times_in(r, BETWEEN) == 0), "the model never sees it");
    assert!(
        after[seen..].iter().all(|r| r.origin != fake_model::Origin::Main),
        "no turn of Grok's own started: {:?}",
        after[seen..].iter().map(fake_model::summary_line).collect::<Vec<_>>()
    );
    assert!(
        !c.received.iter().any(|v| v.to_string().contains("interject-fallback-")),
        "Grok ran no turn of its own for a steering message"
    );

    c.shim.close_stdin();
    let status = c.shim.wait(Duration::from_secs(30));
    assert!(status.success(), "the shim exited with {status}");
    for r in model.model_requests() {
        eprintln!("{}", fake_model::summary_line(&r));
    }
    rig::keep(
        "grok",
        "steering",
        &trace,
        &root,
        "a steer during a running command (injected: the model's next request carries it once, one prompt answer), \
         then one between turns (promptRequired, Grok sees nothing)",
    );
    drop(model);
    drop(temp);
}

/// The compaction scenarios' shim: initialized (checking the declaration) with one new session.
fn compact_client(lc: &live::LiveCommand, trace: &Path) -> (Client, String) {
    let cmd = lc.shim_command(&replay_support::shim_binary("grok"));
    let shim = shim::Builder::from_command(cmd).arg("--trace-file").arg(&trace.display().to_string()).start();
    let mut c = Client { shim, received: Vec::new(), hold_permissions: false };
    let caps = json!({"fs": {"readTextFile": false, "writeTextFile": false}, "terminal": false,
        "_meta": {"coda": {"waits": {}}}});
    let init = c.call(
        "init",
        "initialize",
        json!({"protocolVersion": 1, "clientCapabilities": caps, "clientInfo": {"name": "coda", "version": "1.0.0"}}),
    );
    assert_eq!(init["result"]["agentCapabilities"]["_meta"]["coda"]["compact"], json!({}), "{init}");
    c.quiet(Duration::from_millis(1000));
    let new = c.call(
        "new",
        "session/new",
        json!({"cwd": lc.workdir.display().to_string(), "mcpServers": [],
            "systemPrompt": coda_text::system_prompt(coda_text::INSTRUCTION)}),
    );
    let sid = new["result"]["sessionId"].as_str().expect("a session").to_owned();
    c.quiet(Duration::from_millis(1500));
    (c, sid)
}

/// Grok's summarising request (the fake model answers it with a summary).
fn is_compaction(r: &fake_model::RecordedRequest) -> bool {
    r.body.to_string().contains("produce a faithful, concise summary of the conversation")
}

/// The main thread's model requests (not titles, not the compaction's summary).
fn main_requests(model: &fake_model::FakeModel) -> Vec<fake_model::RecordedRequest> {
    model.model_requests().into_iter().filter(|r| r.origin == fake_model::Origin::Main && !is_compaction(r)).collect()
}

fn ms_of(t: std::time::SystemTime) -> i64 {
    t.duration_since(std::time::UNIX_EPOCH).expect("after 1970").as_millis() as i64
}

fn iso_ms(s: &str) -> i64 {
    let t: jiff::Timestamp = s.parse().unwrap_or_else(|e| panic!("not ISO 8601 ({e}): {s}"));
    t.as_millisecond()
}

/// Checks every root `usage_update` Coda got against the fake model's log: `lastRequestAt` is the arrival of
/// the latest main request before it (within `bound` ms), `contextTokens` what the fake model reported for it
/// (a chat completion's 10 input tokens), `compactedAt` there after `compacted`. Returns the errors in ms.
fn check_usage(
    updates: &[(std::time::SystemTime, Value)],
    requests: &[fake_model::RecordedRequest],
    compacted: Option<(std::time::SystemTime, std::time::SystemTime)>,
) -> Vec<i64> {
    let mut errors = Vec::new();
    assert!(!updates.is_empty(), "no usage_update");
    for (received, u) in updates {
        let coda = &u["params"]["update"]["_meta"]["coda"];
        let last = requests.iter().rfind(|r| r.at <= *received).expect("a request before it");
        let at = iso_ms(coda["lastRequestAt"].as_str().unwrap_or_else(|| panic!("no lastRequestAt: {u}")));
        errors.push(at - ms_of(last.at));
        assert_eq!(coda["contextTokens"], last.input_tokens, "the fake model reports the body's size: {u}");
        assert_eq!(u["params"]["update"]["size"], 32000, "the fake model's context window: {u}");
        match compacted {
            Some((asked, answered)) if asked <= *received => {
                let when = iso_ms(coda["compactedAt"].as_str().unwrap_or_else(|| panic!("no compactedAt: {u}")));
                let (asked, answered) = (ms_of(asked), ms_of(answered));
                assert!(asked <= when && when <= answered, "compactedAt {when} not between {asked} and {answered}");
            }
            _ => assert!(coda.get("compactedAt").is_none(), "{u}"),
        }
        assert!(serde_json::to_string(coda).expect("json").len() < 4096);
    }
    errors
}

impl Client {
    /// The shim's usage updates so far, with when the test got them (approximately: when it read them).
    fn usage_updates(&self, times: &[(usize, std::time::SystemTime)]) -> Vec<(std::time::SystemTime, Value)> {
        times
            .iter()
            .filter(|(i, _)| self.received[*i].pointer("/params/update/sessionUpdate") == Some(&json!("usage_update")))
            .map(|(i, t)| (*t, self.received[*i].clone()))
            .collect()
    }

    /// Reads until a frame for which `want` holds, noting when each frame was read.
    fn until_timed(
        &mut self,
        times: &mut Vec<(usize, std::time::SystemTime)>,
        within: Duration,
        want: impl Fn(&Value) -> bool,
    ) -> Value {
        let deadline = Instant::now() + within;
        while Instant::now() < deadline {
            if let Some(v) = self.read(Duration::from_millis(200)) {
                times.push((self.received.len() - 1, std::time::SystemTime::now()));
                if want(&v) {
                    return v;
                }
            }
        }
        panic!("nothing wanted within {within:?}; stderr: {:?}", self.shim.drain_stderr());
    }
}

/// Issue 24 over the real Grok: `_coda/session/compact` between turns compacts (the next model request is
/// smaller) and a prompt sent during it runs after it; during a turn it is refused; for a session this process
/// does not have it is refused; every root `usage_update` carries facts that match the fake model's log.
#[test]
fn live_grok_compact_and_usage() {
    if !live::wanted("grok", "live Grok compaction") {
        return;
    }
    let model = fake_model::FakeModel::start_with(fake_model::Options { log_requests: true, dump_dir: None });
    let temp = temp::TempDir::new("coda-grok-compact");
    let root = temp.path().to_path_buf();
    let lc = live::prepare("grok", &model.base_url(), &root).expect("prepare Grok");
    let mut errors = Vec::new();

    // Between turns, after a turn with a tool call whose output fills the context.
    let trace = root.join("compact-between-turns.jsonl");
    let (mut c, sid) = compact_client(&lc, &trace);
    let mut times = Vec::new();
    let text = format!("{}\n\n[[sh:seq 1 3000]]", coda_text::FIRST_PROMPT);
    c.send("turn-1", "session/prompt", shim::prompt_params(&sid, &text));
    c.until_timed(&mut times, ANSWER, |v| v["id"] == "turn-1");
    let before = main_requests(&model);
    let biggest = before.last().expect("the turn's requests").body.to_string().len();
    let unknown = c.call("c-unknown", "_coda/session/compact", json!({"sessionId": "not-a-session"}));
    assert_eq!(unknown["result"]["compacted"], false, "{unknown}");
    assert_eq!(unknown["result"]["reason"], "the session is not running in this agent process");
    let asked_at = std::time::SystemTime::now();
    c.send("compact", "_coda/session/compact", json!({"sessionId": sid}));
    // Sent during the compaction: Grok gets it after.
    c.send("turn-2", "session/prompt", shim::prompt_params(&sid, "and now?"));
    let answer = c.until_timed(&mut times, ANSWER, |v| v["id"] == "compact");
    let compacted_at = std::time::SystemTime::now();
    let result = &answer["result"];
    assert_eq!(result["compacted"], true, "{answer}");
    let (b, a) = (result["before"].as_u64(), result["after"].as_u64());
    let (Some(b), Some(a)) = (b, a) else { panic!("before and after: {answer}") };
    assert!(a < b, "Grok's counts shrink: {answer}");
    let compaction = model.model_requests().into_iter().find(is_compaction).expect("Grok asked for a summary");
    c.until_timed(&mut times, ANSWER, |v| v["id"] == "turn-2");
    let turn2 = main_requests(&model).into_iter().find(|r| r.body.to_string().contains("and now?")).expect("turn 2");
    assert!(turn2.at >= compaction.at, "the prompt sent during the compaction ran after it");
    let smaller = turn2.body.to_string().len();
    assert!(smaller < biggest, "the next request is smaller: {smaller} bytes after, {biggest} before");
    c.quiet(Duration::from_millis(1500));
    let requests = main_requests(&model);
    errors.extend(check_usage(&c.usage_updates(&times), &requests, Some((asked_at, compacted_at))));
    let updates = c.usage_updates(&times).len();
    assert!(updates >= 3, "one per turn and one after the compaction: {updates}");
    c.shim.close_stdin();
    assert!(c.shim.wait(Duration::from_secs(30)).success());
    eprintln!("compaction: before {b}, after {a}; next request {smaller} bytes, the last before it {biggest}");
    rig::keep(
        "grok",
        "compact-between-turns",
        &trace,
        &root,
        "a turn with a tool call, a compaction of a session this process does not have (not running), then one \
         between turns (compacted, before/after from auto_compact_completed) with a prompt sent during it \
         (runs after it); usage_update with _meta.coda after each turn and after the compaction",
    );

    // During a turn, in a fresh home (the first scenario's permission answer may be remembered there).
    let root = root.join("during");
    let lc = live::prepare("grok", &model.base_url(), &root).expect("prepare Grok");
    let trace = root.join("compact-during-turn.jsonl");
    let (mut c, sid) = compact_client(&lc, &trace);
    let mut times = Vec::new();
    let asked = model.model_requests().iter().filter(|r| is_compaction(r)).count();
    let text = format!("{}\n\n[[sh:seq 1 50]]", coda_text::FIRST_PROMPT);
    c.send("turn-1", "session/prompt", shim::prompt_params(&sid, &text));
    // While Grok waits for Coda's answer to its permission request: what it does next waits for that answer,
    // so the replay meets the same order.
    c.hold_permissions = true;
    let ask = c.until_timed(&mut times, ANSWER, |v| v["method"] == "session/request_permission");
    c.hold_permissions = false;
    let answer = c.call("compact", "_coda/session/compact", json!({"sessionId": sid}));
    assert_eq!(
        answer["result"],
        json!({"compacted": false, "reason": "a turn is running in this session; compact between turns"})
    );
    let options = ask.pointer("/params/options").and_then(Value::as_array).cloned().unwrap_or_default();
    let allow = options.iter().find(|o| o["kind"] == "allow_once").or(options.first()).expect("an option");
    let outcome = json!({"outcome": {"outcome": "selected", "optionId": allow["optionId"]}});
    c.shim.send_json(&json!({"jsonrpc": "2.0", "id": ask["id"], "result": outcome}));
    c.until_timed(&mut times, ANSWER, |v| v["id"] == "turn-1");
    c.quiet(Duration::from_millis(1500));
    assert_eq!(model.model_requests().iter().filter(|r| is_compaction(r)).count(), asked, "Grok never compacted");
    let requests = main_requests(&model);
    errors.extend(check_usage(&c.usage_updates(&times), &requests, None));
    c.shim.close_stdin();
    assert!(c.shim.wait(Duration::from_secs(30)).success());
    rig::keep(
        "grok",
        "compact-during-turn",
        &trace,
        &root,
        "a compaction asked during a turn, while Grok waits for a permission answer (not compacted: a turn is \
         running; Grok never asked the model for a summary); the tool-call turn's usage_update",
    );

    for r in model.model_requests() {
        eprintln!("{}", fake_model::summary_line(&r));
    }
    eprintln!("lastRequestAt minus the fake model's arrival time, ms: {errors:?}");
    assert!(errors.iter().all(|e| e.abs() <= 250), "lastRequestAt off by more than 250 ms: {errors:?}");
    drop(model);
    drop(temp);
}

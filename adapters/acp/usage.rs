//! Where coda-acp's usage facts are (section 用量里的数据; the rules are [`crate::coda::usage`]'s): the agent's
//! own ACP reports, read as its profile says ([`crate::adapters::acp::profile::UsageBy`]).
//!
//! - `contextTokens`: the `used` of the agent's `usage_update`, where its profile says that counts the input of
//!   its last main-thread model request (`used = "request-context"`: Qwen Code 0.24.4 sends
//!   `usageMetadata.promptTokenCount`, for main-thread responses only). Claude Agent ACP's `used` is that input
//!   and the response's output together (`used = "context-and-output"`): no fact of Coda's, so none is said.
//! - `lastRequestAt`: where the profile names a report of it (`request-start = "qwen-duration"`: Qwen Code's
//!   empty `agent_message_chunk` just before its `usage_update` carries `_meta.durationMs`, the time since it
//!   began sending that request; a subagent's carries `_meta.parentToolCallId` and is no main-thread request).
//!   The time is the shim's clock when the chunk came, less that duration.
//! - `compactedAt`: when the agent reported a compaction completed (the shim's clock): ACP's `compaction_update`
//!   `completed` (once per `compactionId`: Claude Agent ACP sends `completed` twice), and Qwen Code's
//!   `_meta.contextCompression` `done` (its `newTokenCount` is then the `used` of the shim's own `usage_update`,
//!   sent because Qwen sends none after a compaction). Claude Agent ACP sends its own `usage_update` after one.
//! - `cacheTtl`: no agent says it over ACP.
//! - At load (`at-load`, [`AtLoad`]): what the agent keeps of the session in its own files, read inside its data
//!   folder only (a link on the way is not followed), its last [`HISTORY_MAX`](crate::coda::usage::HISTORY_MAX)
//!   bytes; a line that is no JSON record is skipped, and counted in one warning.
//!   - Qwen Code 0.24.4 (`qwen-chats`): `<data>/projects/<project>/chats/<session>.jsonl`, `<data>` being
//!     `$QWEN_RUNTIME_DIR` where set, else its data home. Each main-thread response is an `assistant` record
//!     with `usageMetadata.promptTokenCount` (the `used` of the `usage_update` it sent for it: `contextTokens`),
//!     after the `ui_telemetry` record of that response (`qwen-code.api_response`, with no `subagent_name`, the
//!     same `input_token_count`), whose `event.timestamp` less its `duration_ms` is when the request began
//!     (`lastRequestAt`; live, the `durationMs` of its ACP chunk measures from a little earlier, tens of
//!     milliseconds). Its `/compress` leaves a `system` record `chat_compression` (`compactedAt`: its
//!     `timestamp`). A runtime folder moved by its settings alone (`advanced.runtimeOutputDir`) is not found.
//!   - Claude Code (`claude-projects`, under Claude Agent ACP): `<data>/projects/<project>/<session>.jsonl`;
//!     each compaction leaves a `system` record `compact_boundary` (`compactedAt`: its `timestamp`). Its
//!     records say no main-thread request's context (the only fact its profile gives live is `compactedAt`).
//!
//! Gemini CLI sends no `usage_update` at all: its profile names no `usage`, and with no `used` and `size` of the
//! agent's the shim sends no update of its own either.

use crate::HashMap;
use std::convert::Infallible;
use std::time::{Duration, SystemTime};

use serde_json::Value;

use std::path::{Path, PathBuf};

use super::profile::{AtLoad, RequestStart, UsageBy, Used};
use crate::coda::slash_compact::{Own, Said as Compaction};
use crate::coda::usage::{Fact, Facts, Figures, LoadJob, Said, Source, UsageFacts, history_lines, in_folder, per_root};
use crate::frame::{Frame, Needle};
use crate::inside::{Folder, Kind as Entry};
use crate::layer::Cx;

/// Per root session.
#[derive(Default)]
struct Root {
    /// When its main thread's last model request began, said before the `usage_update` that counts it.
    began: Option<SystemTime>,
    /// The last compaction seen completed (ACP's `compactionId`).
    compaction: Option<String>,
}

/// An ACP agent's usage reports, read as its profile says (see the module docs).
pub struct AcpUsage {
    used: Option<Used>,
    request_start: Option<RequestStart>,
    /// The agent's own compaction report (Qwen Code's), where its profile names one.
    own: Option<Own>,
    roots: HashMap<String, Root>,
    /// What the agent keeps of a session Coda loads, and where (its data folder).
    at_load: Option<(AtLoad, PathBuf)>,
}

impl AcpUsage {
    /// `home` is the agent's data folder, where it keeps its sessions (None: nothing is read at load).
    pub fn new(usage: Option<&UsageBy>, own: Option<Own>, home: Option<PathBuf>) -> AcpUsage {
        AcpUsage {
            used: usage.map(|u| u.used),
            request_start: usage.and_then(|u| u.request_start),
            own,
            roots: HashMap::default(),
            at_load: usage.and_then(|u| u.at_load).zip(home),
        }
    }

    fn root(&mut self, session: &str, cx: &Cx) -> Option<&mut Root> {
        per_root(&mut self.roots, session, cx, |_| false)
    }
}

/// The layer for an agent whose profile says `usage` (if anything), whose own compaction report is `own`, and
/// whose data folder is `home`.
pub fn layer(usage: Option<&UsageBy>, own: Option<Own>, home: Option<PathBuf>) -> UsageFacts<AcpUsage> {
    UsageFacts::new(AcpUsage::new(usage, own, home))
}

/// The session file `<project>/<rel>` under `home/projects`, for any project folder, opened inside `home` only.
fn in_projects(home: &Path, rel: &str) -> Option<std::fs::File> {
    let projects = std::fs::canonicalize(home).ok().and_then(|h| Folder::open(&h).ok()?.folder("projects").ok())?;
    let folders = projects.entries().into_iter().filter(|(_, m)| m.kind == Entry::Folder);
    folders.into_iter().find_map(|(project, _)| projects.file(&format!("{project}/{rel}")).ok())
}

/// A record's `timestamp` (RFC 3339).
fn stamp(record: &Value, key: &str) -> Option<SystemTime> {
    record.get(key).and_then(Value::as_str).and_then(|t| t.parse::<jiff::Timestamp>().ok()).map(SystemTime::from)
}

/// The JSON records of a session file's last lines; the lines that are none are counted in one warning.
fn records(file: std::fs::File, agent: &str, wanted: &[&[u8]]) -> Vec<Value> {
    let mut bad = 0usize;
    let mut out = Vec::new();
    for line in history_lines(file) {
        if !wanted.iter().any(|w| memchr::memmem::find(&line, w).is_some()) {
            continue;
        }
        match crate::json::from_slice::<Value>(&line) {
            Ok(record) if record.is_object() => out.push(record),
            _ => bad += 1,
        }
    }
    if bad > 0 {
        tracing::warn!("{bad} line(s) of {agent}'s session file are no JSON record; skipped");
    }
    out
}

/// What Qwen Code keeps of `session` under `home` (see the module docs).
pub fn qwen_history(home: &Path, session: &str) -> Facts {
    let mut facts = Facts::default();
    let Some(file) = in_projects(home, &format!("chats/{session}.jsonl")) else { return facts };
    // The main-thread responses' starts, by their input tokens, since the last assistant record.
    let mut started: Vec<(u64, SystemTime)> = Vec::new();
    for record in records(file, "Qwen Code", &[b"\"assistant\"", b"qwen-code.api_response", b"chat_compression"]) {
        let kind = (record.get("type").and_then(Value::as_str), record.get("subtype").and_then(Value::as_str));
        match kind {
            (Some("system"), Some("ui_telemetry")) => {
                let Some(event) = record.pointer("/systemPayload/uiEvent") else { continue };
                if event.get("event.name").and_then(Value::as_str) != Some("qwen-code.api_response")
                    || event.get("subagent_name").is_some()
                {
                    continue;
                }
                let took = event.get("duration_ms").and_then(Value::as_u64).map(Duration::from_millis);
                let at = stamp(event, "event.timestamp").zip(took).and_then(|(at, took)| at.checked_sub(took));
                if let (Some(n), Some(at)) = (event.get("input_token_count").and_then(Value::as_u64), at) {
                    started.push((n, at));
                    if started.len() > 16 {
                        started.remove(0);
                    }
                }
            }
            (Some("system"), Some("chat_compression")) => {
                facts.compacted_at = stamp(&record, "timestamp").or(facts.compacted_at);
            }
            (Some("assistant"), _) => {
                let Some(n) = record.pointer("/usageMetadata/promptTokenCount").and_then(Value::as_u64) else {
                    continue;
                };
                facts.context_tokens = Some(n);
                facts.last_request_at = started.iter().rev().find(|(i, _)| *i == n).map(|(_, at)| *at);
                started.clear();
            }
            _ => {}
        }
    }
    facts
}

/// What Claude Code keeps of `session` under `home` (see the module docs).
pub fn claude_history(home: &Path, session: &str) -> Facts {
    let mut facts = Facts::default();
    let Some(file) = in_projects(home, &format!("{session}.jsonl")) else { return facts };
    for record in records(file, "Claude Code", &[b"compact_boundary"]) {
        if record.get("type").and_then(Value::as_str) == Some("system")
            && record.get("subtype").and_then(Value::as_str) == Some("compact_boundary")
        {
            facts.compacted_at = stamp(&record, "timestamp").or(facts.compacted_at);
        }
    }
    facts
}

impl Source for AcpUsage {
    type Event = Infallible;

    fn at_load(&self, session: &str, _: &Value, _: &Cx) -> Option<LoadJob> {
        let (by, home) = self.at_load.as_ref()?;
        let read = match by {
            AtLoad::QwenChats => qwen_history,
            AtLoad::ClaudeProjects => claude_history,
        };
        in_folder(Some(home), session, read)
    }

    /// The agent answered Coda's load or resume: it sends no `usage_update` for it (Qwen Code 0.24.4 does not),
    /// so the shim sends the loaded facts in one of its own, with the model's window its answer names (Qwen's
    /// `models.availableModels[]._meta.contextLimit` of its `currentModelId`).
    fn answered(&mut self, answer: &Frame, cx: &mut Cx, out: &mut Said) {
        if self.at_load.is_none() {
            return;
        }
        let Some(r) = cx.answer_to(answer) else { return };
        if !(r.is("session/load") || r.is("session/resume")) {
            return;
        }
        let Some(session) = r.session().map(str::to_owned) else { return };
        let v = answer.value();
        let Some(models) = v.pointer("/result/models") else { return };
        let current = models.get("currentModelId").and_then(Value::as_str);
        let size = models.get("availableModels").and_then(Value::as_array).and_then(|all| {
            let model =
                all.iter().find(|m| current.is_some() && m.get("modelId").and_then(Value::as_str) == current)?;
            model.pointer("/_meta/contextLimit").and_then(Value::as_u64)
        });
        if let Some(size) = size {
            out.push((session.clone(), Fact::Size(size)));
            out.push((session, Fact::Loaded));
        }
    }

    fn wants(&self, frame: &Frame) -> bool {
        match frame.session_update() {
            Some("compaction_update") => true,
            Some("agent_message_chunk") => {
                // (A `\u` escape may spell either key.)
                let holds = |key| frame.has(key) || frame.unicode_escaped();
                (self.request_start.is_some() && holds(&DURATION_MS)) || (self.own.is_some() && holds(&COMPRESSION))
            }
            _ => false,
        }
    }

    /// A chunk is looked into while a request's time or a compaction of the shim's is due.
    fn chunks_by_session(&self) -> bool {
        self.request_start.is_none() && self.own.is_none()
    }

    fn from_agent(&mut self, frame: &Frame, cx: &mut Cx, out: &mut Said) {
        let v = frame.value();
        let (Some(session), Some(update)) =
            (v.pointer("/params/sessionId").and_then(Value::as_str), v.pointer("/params/update"))
        else {
            return;
        };
        let wall = cx.wall();
        let own = self.own;
        let request_start = self.request_start;
        let Some(root) = self.root(session, cx) else { return };
        let say = |fact| (session.to_owned(), fact);
        if update.get("sessionUpdate").and_then(Value::as_str) == Some("compaction_update") {
            if update.get("status").and_then(Value::as_str) != Some("completed") {
                return;
            }
            let id = update.get("compactionId").and_then(Value::as_str).map(str::to_owned);
            if id.is_some() && root.compaction == id {
                return;
            }
            root.compaction = id;
            return out.push(say(Fact::Compacted(wall)));
        }
        if let Some(Compaction::Completed { after, .. }) = own.and_then(|read| read(update)) {
            out.push(say(Fact::Compacted(wall)));
            out.extend(after.map(|n| say(Fact::Used(n))));
            return out.push(say(Fact::Send));
        }
        let meta = update.get("_meta");
        let main = meta.is_some_and(|m| m.get("parentToolCallId").is_none() && m.get("usage").is_some());
        if request_start == Some(RequestStart::QwenDuration)
            && main
            && let Some(ms) = meta.and_then(|m| m.get("durationMs")).and_then(Value::as_u64)
        {
            root.began = wall.checked_sub(Duration::from_millis(ms));
        }
    }

    fn usage_update(&mut self, session: &str, update: &Figures<'_>, cx: &mut Cx, out: &mut Vec<Fact>) {
        let used = self.used;
        let Some(root) = self.root(session, cx) else { return };
        if let Some(at) = root.began.take() {
            out.push(Fact::Request(at));
        }
        if used == Some(Used::RequestContext)
            && let Some(n) = update.used()
        {
            out.push(Fact::Context(n));
        }
    }
}

/// The keys of Qwen's chunks the layer reads: a request's time and a compaction's counts.
static DURATION_MS: Needle = crate::needle!(b"\"durationMs\"");
static COMPRESSION: Needle = crate::needle!(b"\"contextCompression\"");

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layer::testing::{Harness, wall_start};
    use serde_json::json;

    const S: &str = "q1";

    fn qwen() -> Harness {
        let usage =
            UsageBy { used: Used::RequestContext, request_start: Some(RequestStart::QwenDuration), at_load: None };
        let mut h = Harness::of(layer(Some(&usage), Some(super::super::qwen::compression), None));
        h.from_client(json!({"jsonrpc":"2.0","id":1,"method":"session/new","params":{"cwd":"/w"}}));
        h.from_agent(json!({"jsonrpc":"2.0","id":1,"result":{"sessionId":S}}));
        h.take();
        h
    }

    fn update(session: &str, update: Value) -> Value {
        json!({"jsonrpc":"2.0","method":"session/update","params":{"sessionId":session,"update":update}})
    }

    /// Qwen Code 0.24.4's pair after a main response, as recorded.
    fn response(session: &str, used: u64, duration: u64) -> [Value; 2] {
        [
            update(
                session,
                json!({"sessionUpdate":"agent_message_chunk","content":{"type":"text","text":""},
                "_meta":{"usage":{"inputTokens":used,"outputTokens":5,"totalTokens":used + 5,"thoughtTokens":0,
                "cachedReadTokens":0},"durationMs":duration}}),
            ),
            update(session, json!({"sessionUpdate":"usage_update","used":used,"size":32000})),
        ]
    }

    fn coda(v: &Value) -> Value {
        v.pointer("/params/update/_meta/coda").cloned().unwrap_or(Value::Null)
    }

    #[test]
    fn qwen_says_the_context_and_when_its_request_began() {
        let mut h = qwen();
        h.advance(Duration::from_secs(5));
        for v in response(S, 21062, 999) {
            h.from_agent(v);
        }
        let out = h.to_client();
        assert_eq!(out.len(), 2);
        assert_eq!(coda(&out[0]), Value::Null, "the chunk goes on as it came");
        let at = crate::coda::usage::iso(wall_start() + Duration::from_millis(5000 - 999)).unwrap();
        assert_eq!(coda(&out[1]), json!({"lastRequestAt": at, "contextTokens": 21062}));
        // A subagent's chunk (parentToolCallId) is no main-thread request: the next update keeps the last one.
        h.advance(Duration::from_secs(5));
        h.from_agent(update(
            S,
            json!({"sessionUpdate":"agent_message_chunk","content":{"type":"text","text":""},
            "_meta":{"usage":{"inputTokens":7},"durationMs":10,"parentToolCallId":"call_1","subagentType":"x"}}),
        ));
        h.from_agent(update(S, json!({"sessionUpdate":"usage_update","used":21070,"size":32000})));
        assert_eq!(coda(&h.to_client()[1]), json!({"lastRequestAt": at, "contextTokens": 21070}));
    }

    /// A chunk whose key is spelled with an escape is read as the parsed frame reads it (fail closed).
    #[test]
    fn a_request_time_under_an_escaped_key_is_read() {
        let mut h = qwen();
        h.advance(Duration::from_secs(5));
        let chunk = format!(
            r#"{{"jsonrpc":"2.0","method":"session/update","params":{{"sessionId":"{S}","update":{{"sessionUpdate":"agent_message_chunk","content":{{"type":"text","text":""}},"_meta":{{"usage":{{"inputTokens":21062}},"duration\u004ds":999}}}}}}}}"#
        );
        h.agent_frame(Frame::parse(chunk.into_bytes()).expect("valid"));
        h.from_agent(update(S, json!({"sessionUpdate":"usage_update","used":21062,"size":32000})));
        let at = crate::coda::usage::iso(wall_start() + Duration::from_millis(5000 - 999)).unwrap();
        assert_eq!(coda(&h.to_client()[1]), json!({"lastRequestAt": at, "contextTokens": 21062}));
    }

    #[test]
    fn a_compaction_is_said_once_with_qwens_own_count_as_used() {
        let mut h = qwen();
        for v in response(S, 20389, 100) {
            h.from_agent(v);
        }
        let before = coda(&h.to_client()[1]);
        h.advance(Duration::from_secs(60));
        let done = update(
            S,
            json!({"sessionUpdate":"agent_message_chunk","content":{"type":"text","text":"Context compressed"},
            "_meta":{"contextCompression":{"phase":"done","originalTokenCount":20389,"newTokenCount":18039}}}),
        );
        h.from_agent(done.clone());
        let out = h.to_client();
        assert_eq!(out[0], done);
        let own = &out[1]["params"]["update"];
        assert_eq!(own["used"], 18039);
        assert_eq!(own["size"], 32000);
        let at = crate::coda::usage::iso(wall_start() + Duration::from_secs(60)).unwrap();
        assert_eq!(own["_meta"]["coda"]["compactedAt"], at);
        assert_eq!(own["_meta"]["coda"]["lastRequestAt"], before["lastRequestAt"], "still the main thread's");
        assert_eq!(own["_meta"]["coda"]["contextTokens"], 20389);
    }

    #[test]
    fn claude_says_only_its_compactions_once_each() {
        let usage = UsageBy { used: Used::ContextAndOutput, request_start: None, at_load: None };
        let mut h = Harness::of(layer(Some(&usage), None, None));
        h.from_client(json!({"jsonrpc":"2.0","id":1,"method":"session/new","params":{"cwd":"/w"}}));
        h.from_agent(json!({"jsonrpc":"2.0","id":1,"result":{"sessionId":"c1"}}));
        h.take();
        let plain = update("c1", json!({"sessionUpdate":"usage_update","used":11890,"size":200000}));
        h.from_agent(plain.clone());
        assert_eq!(h.to_client(), [plain], "nothing known: no _meta.coda at all");
        h.advance(Duration::from_secs(3));
        let done = json!({"sessionUpdate":"compaction_update","compactionId":"x","status":"completed"});
        h.from_agent(update("c1", done.clone()));
        h.advance(Duration::from_secs(1));
        h.from_agent(update("c1", done));
        h.from_agent(update("c1", json!({"sessionUpdate":"usage_update","used":2474,"size":200000})));
        let out = h.to_client();
        assert_eq!(out.len(), 3, "{out:?}");
        let at = crate::coda::usage::iso(wall_start() + Duration::from_secs(3)).unwrap();
        assert_eq!(coda(&out[2]), json!({"compactedAt": at}), "the first completed, no context of Claude's");
        // A child's compaction or usage is none of the root's.
        h.from_agent(update(
            "child",
            json!({"sessionUpdate":"compaction_update","compactionId":"y","status":"completed"}),
        ));
        let child = update("child", json!({"sessionUpdate":"usage_update","used":1,"size":2}));
        h.from_agent(child.clone());
        assert_eq!(h.to_client()[1], child);
    }

    #[test]
    fn hostile_reports_say_nothing_and_never_panic() {
        let mut h = qwen();
        for bad in [
            r#"{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"q1","update":{"sessionUpdate":"agent_message_chunk","_meta":{"usage":{},"durationMs":1e400}}}}"#,
            r#"{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"q1","update":{"sessionUpdate":"agent_message_chunk","_meta":{"usage":{},"durationMs":-5}}}}"#,
            r#"{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"q1","update":{"sessionUpdate":"agent_message_chunk","_meta":{"usage":{},"durationMs":18446744073709551615}}}}"#,
            r#"{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":["q1"],"update":{"sessionUpdate":"compaction_update","status":"completed"}}}"#,
            r#"{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"q1","update":{"sessionUpdate":"agent_message_chunk","_meta":{"contextCompression":{"phase":"done","newTokenCount":"x"}}}}}"#,
        ] {
            h.agent_frame(Frame::parse(bad.as_bytes().to_vec()).expect("a frame"));
        }
        let out = h.to_client();
        assert_eq!(out.len(), 5, "each passed on; no update of the shim's without Qwen's used and size: {out:?}");
        h.from_agent(update(S, json!({"sessionUpdate":"usage_update","used":"many","size":32000})));
        let last = h.to_client().pop().unwrap();
        assert!(coda(&last).get("lastRequestAt").is_none(), "{last}");
        assert!(coda(&last).get("contextTokens").is_none(), "{last}");
    }

    /// Qwen Code 0.24.4's chat file (its records' shapes, from a live run): a main response after its telemetry, a
    /// side request's telemetry, a `/compress`, and lines that are no record.
    fn qwen_chat(home: &std::path::Path, project: &str, session: &str) {
        let chats = home.join("projects").join(project).join("chats");
        std::fs::create_dir_all(&chats).unwrap();
        let telemetry = |at: &str, ms: u64, tokens: u64, side: bool| {
            let mut event = json!({"event.name":"qwen-code.api_response","event.timestamp":at,"duration_ms":ms,
                "input_token_count":tokens,"prompt_id":format!("{session}########1")});
            if side {
                event["subagent_name"] = json!("managed-auto-memory-extractor");
            }
            json!({"timestamp":at,"type":"system","subtype":"ui_telemetry","systemPayload":{"uiEvent":event}})
        };
        let lines = [
            telemetry("2026-12-04T13:04:01.181Z", 978, 20439, false).to_string(),
            json!({"timestamp":"2026-12-04T13:04:01.182Z","type":"assistant","usageMetadata":{"promptTokenCount":20439},
                "contextWindowSize":32000}).to_string(),
            "{not json".into(),
            telemetry("2026-12-04T13:04:02.083Z", 32, 20805, false).to_string(),
            json!({"timestamp":"2026-12-04T13:04:02.084Z","type":"assistant","usageMetadata":{"promptTokenCount":20805}})
                .to_string(),
            telemetry("2026-12-04T13:04:02.581Z", 386, 11407, true).to_string(),
            json!({"timestamp":"2026-12-04T13:04:11.901Z","type":"system","subtype":"chat_compression",
                "systemPayload":{}}).to_string(),
            "[\"assistant\"]".into(),
        ];
        std::fs::write(chats.join(format!("{session}.jsonl")), lines.join("\n") + "\n").unwrap();
    }

    #[test]
    fn qwens_chat_file_says_its_last_main_request_and_compaction() {
        let home = tempfile::tempdir().unwrap();
        let s = "23826568-55a8-4538-b406-2c5ddea47602";
        qwen_chat(home.path(), "-tmp-w", s);
        let facts = qwen_history(home.path(), s);
        let iso = crate::coda::usage::iso;
        assert_eq!(facts.context_tokens, Some(20805));
        assert_eq!(facts.last_request_at.and_then(iso).as_deref(), Some("2026-12-04T13:04:02.051Z"), "02.083 - 32 ms");
        assert_eq!(facts.compacted_at.and_then(iso).as_deref(), Some("2026-12-04T13:04:11.901Z"));
        // Another session, a path, a chat file that is a link, a project folder that is a link: nothing.
        assert_eq!(qwen_history(home.path(), "other"), Facts::default());
        let chats = home.path().join("projects/-tmp-w/chats");
        std::os::unix::fs::symlink(chats.join(format!("{s}.jsonl")), chats.join("linked.jsonl")).unwrap();
        assert_eq!(qwen_history(home.path(), "linked"), Facts::default());
        let outside = tempfile::tempdir().unwrap();
        qwen_chat(outside.path(), "p", "far");
        std::os::unix::fs::symlink(outside.path().join("projects/p"), home.path().join("projects/q")).unwrap();
        assert_eq!(qwen_history(home.path(), "far"), Facts::default());
        // Claude Code's compaction boundary.
        let project = home.path().join("projects/-tmp-c");
        std::fs::create_dir_all(&project).unwrap();
        let lines = [
            json!({"type":"user","timestamp":"2026-12-04T13:00:00.000Z"}).to_string(),
            json!({"type":"system","subtype":"compact_boundary","timestamp":"2026-12-04T13:01:02.003Z"}).to_string(),
            "compact_boundary".into(),
        ];
        std::fs::write(project.join("c1.jsonl"), lines.join("\n")).unwrap();
        let facts = claude_history(home.path(), "c1");
        assert_eq!(facts.compacted_at.and_then(iso).as_deref(), Some("2026-12-04T13:01:02.003Z"));
        assert_eq!((facts.context_tokens, facts.last_request_at), (None, None));
    }

    /// Qwen sends no `usage_update` at load: coda-acp sends the loaded facts right after its answer, with the
    /// window the answer names.
    #[test]
    fn a_qwen_load_is_answered_then_the_loaded_facts_follow() {
        let home = tempfile::tempdir().unwrap();
        let s = "q-load";
        qwen_chat(home.path(), "-tmp-w", s);
        let usage = UsageBy {
            used: Used::RequestContext,
            request_start: Some(RequestStart::QwenDuration),
            at_load: Some(AtLoad::QwenChats),
        };
        let mut h = Harness::of(layer(Some(&usage), Some(super::super::qwen::compression), Some(home.path().into())));
        h.from_client(json!({"jsonrpc":"2.0","id":1,"method":"session/load","params":{"sessionId":s,"cwd":"/w"}}));
        h.run_work();
        let answer = json!({"jsonrpc":"2.0","id":1,"result":{"models":{"currentModelId":"m","availableModels":[
            {"modelId":"other","_meta":{"contextLimit":1}},{"modelId":"m","_meta":{"contextLimit":32000}}]}}});
        h.from_agent(answer.clone());
        let out = h.to_client();
        assert_eq!(out[0], answer);
        assert_eq!(out.len(), 2, "{out:?}");
        assert_eq!(out[1]["params"]["update"]["used"], 20805);
        assert_eq!(out[1]["params"]["update"]["size"], 32000);
        assert_eq!(
            coda(&out[1]),
            json!({"compactedAt":"2026-12-04T13:04:11.901Z","contextTokens":20805,
                "lastRequestAt":"2026-12-04T13:04:02.051Z"})
        );
        // The read done after the answer: the update follows it then.
        let mut h = Harness::of(layer(Some(&usage), None, Some(home.path().into())));
        h.hold_work();
        h.from_client(json!({"jsonrpc":"2.0","id":1,"method":"session/load","params":{"sessionId":s,"cwd":"/w"}}));
        h.from_agent(answer.clone());
        assert_eq!(h.to_client(), std::slice::from_ref(&answer));
        assert_eq!(h.run_work(), 1);
        let out = h.to_client();
        assert_eq!(out.len(), 1, "{out:?}");
        assert_eq!(coda(&out[0])["contextTokens"], 20805);
        // An answer that names no window: no update of the shim's (ACP's `size` is required).
        let mut h = Harness::of(layer(Some(&usage), None, Some(home.path().into())));
        h.from_client(json!({"jsonrpc":"2.0","id":1,"method":"session/load","params":{"sessionId":s,"cwd":"/w"}}));
        h.run_work();
        h.from_agent(json!({"jsonrpc":"2.0","id":1,"result":{}}));
        assert_eq!(h.to_client().len(), 1);
    }
}

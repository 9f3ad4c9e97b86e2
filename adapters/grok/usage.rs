//! Coda's usage facts (section 用量里的数据) for Grok Build, which sends no `usage_update` at all: this layer
//! sends one of the shim's ([`Facts::update`]) for a root session at the end of each turn (Grok's own turns
//! too) and after each compaction, with `_meta.coda`.
//!
//! Where each fact comes from (Grok 1.0.41, seen live against the fake model):
//! - `contextTokens`: the last main-thread `_x.ai/session_notification` `response_completed` of the session:
//!   `input_tokens + cache_read_input_tokens + cache_creation_input_tokens` (the provider's own counts of that
//!   request's input; Grok names them as disjoint parts). `used` is that plus `output_tokens`.
//! - `size`: `session/new` (or `session/load`/`session/resume`) `models.availableModels[]._meta.totalContextTokens`
//!   of the session's current model (`models.currentModelId`, then `session/set_model` /
//!   `session/set_config_option` of `model`).
//! - `lastRequestAt`: Grok stamps its `session/update`s with `_meta.streamStartMs` (when the stream of a model
//!   response began: the request plus the model's time to its first byte), `turnStartMs` and
//!   `agentTimestampMs`. A new `streamStartMs` is a new request; it was sent right after the last thing Grok
//!   did before it: the turn's start or the latest stamped frame (a tool's result). So the request time is
//!   taken as `max(turnStartMs, latest agentTimestampMs before it)`, never after `streamStartMs`. Measured
//!   live: docs/grok.md, "Compaction and usage facts".
//! - `compactedAt`: `auto_compact_completed`'s `_meta.agentTimestampMs` (asked for or Grok's own), then a
//!   `usage_update` with `used = tokens_after`.
//! - `cacheTtl`: Grok says none; left out.
//!
//! Only sessions this process created, loaded or resumed are roots: a subagent's session never gets one. Times
//! are Grok's own stamps (its clock), so a replay gives the same facts on any day. Nothing during a
//! `session/load`/`session/resume` (replayed history).

use std::collections::HashMap;
use std::convert::Infallible;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde_json::Value;

use crate::coda::usage::Facts;
use crate::frame::{Frame, Kind};
use crate::json::View;
use crate::layer::{Cx, Layer};

const NOTIFICATION: &str = "_x.ai/session_notification";
/// `params._meta` of a frame Grok stamped with the start of a model's stream (`streamStartMs`), as the frame
/// check found it. (A search for its `S`: a `_meta` is too short for a SIMD search to pay off.)
fn stamps(frame: &Frame) -> Option<View<'_>> {
    let meta = frame.meta()?;
    let text = meta.text();
    memchr::memchr_iter(b'S', text)
        .any(|at| text[..at].ends_with(b"\"stream") && text[at..].starts_with(b"StartMs\""))
        .then_some(meta)
}

/// A model a `session/set_model` or `session/set_config_option` asked for (a note on that request).
struct ModelAsked(String);

#[derive(Default)]
struct Root {
    facts: Facts,
    /// `used` of the next `usage_update`.
    used: Option<u64>,
    /// Context window by model id, and the current model.
    sizes: HashMap<String, u64>,
    model: Option<String>,
    /// Grok's stamps (ms since the epoch): the running turn's start, the current stream, the latest frame.
    turn_start: Option<u64>,
    stream: Option<u64>,
    latest: Option<u64>,
}

impl Root {
    fn size(&self) -> Option<u64> {
        self.sizes.get(self.model.as_deref()?).copied()
    }

    /// Reads `models` of a session answer: the context window of each model, and the current one.
    fn models(&mut self, result: &Value) {
        let Some(models) = result.get("models") else { return };
        for m in models.get("availableModels").and_then(Value::as_array).into_iter().flatten() {
            let size = m.pointer("/_meta/totalContextTokens").and_then(Value::as_u64);
            if let (Some(id), Some(size)) = (m.get("modelId").and_then(Value::as_str), size) {
                self.sizes.insert(id.to_owned(), size);
            }
        }
        if let Some(current) = models.get("currentModelId").and_then(Value::as_str) {
            self.model = Some(current.to_owned());
        }
    }

    /// A stamped frame of Grok's (`session/update` `_meta`), read where it lies (one pass over `_meta`).
    fn stamped(&mut self, meta: View) {
        let (mut turn, mut stream, mut now) = (None, None, None);
        for (key, value) in meta.members() {
            if key.is("turnStartMs") {
                turn = value.as_u64();
            } else if key.is("streamStartMs") {
                stream = value.as_u64();
            } else if key.is("agentTimestampMs") {
                now = value.as_u64();
            }
        }
        if let Some(turn) = turn
            && self.turn_start != Some(turn)
        {
            self.turn_start = Some(turn);
            self.stream = None;
        }
        if let Some(stream) = stream
            && self.stream != Some(stream)
        {
            self.stream = Some(stream);
            let before = self.turn_start.max(self.latest).unwrap_or(stream);
            self.facts.last_request_at = Some(at(before.min(stream)));
        }
        if let Some(now) = now {
            self.latest = self.latest.max(Some(now));
        }
    }
}

fn at(ms: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_millis(ms)
}

#[derive(Default)]
pub struct GrokUsage {
    roots: HashMap<String, Root>,
}

impl GrokUsage {
    pub fn new() -> GrokUsage {
        GrokUsage::default()
    }

    fn is_loading(cx: &Cx, session: &str) -> bool {
        cx.open_requests().any(|r| (r.is("session/load") || r.is("session/resume")) && r.session() == Some(session))
    }

    /// The shim's `usage_update` for `session`, after the frame that changed its facts.
    fn update(&self, session: &str, cx: &mut Cx) {
        let Some(root) = self.roots.get(session) else { return };
        let (Some(used), Some(size)) = (root.used.or(root.facts.context_tokens), root.size()) else {
            tracing::debug!("no usage_update yet: Grok has not said the context or its window");
            return;
        };
        cx.to_client(root.facts.update(session, used, size));
    }

    fn answered(&mut self, frame: &Frame, cx: &mut Cx) {
        let Some(r) = cx.answer_to(frame) else { return };
        let method = r.method.to_string();
        let (session, asked) = (r.session().map(str::to_owned), r.note::<ModelAsked>().map(|m| m.0.clone()));
        let v = frame.value();
        let Some(result) = v.get("result") else { return };
        match method.as_str() {
            "session/new" => {
                let Some(s) = result.get("sessionId").and_then(Value::as_str) else { return };
                self.roots.entry(s.to_owned()).or_default().models(result);
            }
            "session/load" | "session/resume" => {
                let Some(s) = session else { return };
                self.roots.entry(s).or_default().models(result);
            }
            "session/set_model" | "session/set_config_option" => {
                if let (Some(root), Some(model)) = (session.and_then(|s| self.roots.get_mut(&s)), asked) {
                    root.model = Some(model);
                }
            }
            _ => {}
        }
    }

    /// Read where it lies: Grok's notifications of a turn carry its whole text.
    fn notification(&mut self, frame: &Frame, cx: &mut Cx) {
        let Some(session) = frame.session() else { return };
        if !self.roots.contains_key(&*session) || GrokUsage::is_loading(cx, &session) {
            return;
        }
        let root = self.roots.get_mut(&*session).expect("checked");
        let update = frame.update_value();
        let field = |k: &str| update.and_then(|u| u.get(k));
        let stamp = frame.meta().and_then(|m| m.get("agentTimestampMs")).and_then(|t| t.as_u64());
        match frame.session_update() {
            Some("response_completed") => {
                let Some(u) = field("usage") else { return };
                let n = |k: &str| u.get(k).and_then(|n| n.as_u64()).unwrap_or(0);
                let context = n("input_tokens")
                    .saturating_add(n("cache_read_input_tokens"))
                    .saturating_add(n("cache_creation_input_tokens"));
                root.facts.context_tokens = Some(context);
                root.used = Some(context.saturating_add(n("output_tokens")));
            }
            Some("auto_compact_completed") => {
                root.facts.compacted_at = Some(stamp.map(at).unwrap_or_else(|| cx.wall()));
                if let Some(after) = field("tokens_after").and_then(|n| n.as_u64()) {
                    root.used = Some(after);
                }
                self.update(&session, cx);
            }
            Some("turn_completed") => {
                root.latest = root.latest.max(stamp);
                self.update(&session, cx);
            }
            _ => {}
        }
    }
}

impl Layer for GrokUsage {
    type Timer = Infallible;
    type Event = Infallible;
    type Reply = Infallible;

    fn from_client(&mut self, frame: Frame, cx: &mut Cx) {
        if let Kind::Request { id, method } = frame.kind()
            && matches!(method.as_str(), "session/set_model" | "session/set_config_option")
        {
            let p = frame.value().get("params").unwrap_or(&Value::Null);
            let model = match method.as_str() {
                "session/set_model" => p.get("modelId"),
                _ => p.get("value").filter(|_| p.get("configId").and_then(Value::as_str) == Some("model")),
            };
            if let Some(m) = model.and_then(Value::as_str) {
                cx.note(&id.clone(), ModelAsked(m.to_owned()));
            }
        }
        cx.to_agent(frame)
    }

    fn from_agent(&mut self, frame: Frame, cx: &mut Cx) {
        match frame.kind() {
            Kind::Response { .. } => {
                self.answered(&frame, cx);
                cx.to_client(frame)
            }
            Kind::Notification { method } if method == NOTIFICATION => {
                // Grok's own notification goes first; the shim's usage_update follows it.
                let copy = frame.clone();
                cx.to_client(frame);
                if matches!(
                    copy.session_update(),
                    Some("response_completed" | "auto_compact_completed" | "turn_completed")
                ) {
                    self.notification(&copy, cx);
                }
            }
            Kind::Notification { method } if method == "session/update" => {
                if frame.session_update() == Some("usage_update") {
                    return self.stamp(frame, cx);
                }
                // The stamps and the session, from the frame check's one pass (a chunk is not parsed).
                if let Some(meta) = stamps(&frame)
                    && let Some(s) = frame.session()
                    && !GrokUsage::is_loading(cx, &s)
                    && let Some(root) = self.roots.get_mut(&*s)
                {
                    root.stamped(meta);
                }
                cx.to_client(frame)
            }
            _ => cx.to_client(frame),
        }
    }

    fn passes_from_agent(&self, frame: &Frame) -> bool {
        match frame.kind() {
            Kind::Notification { method } if method == NOTIFICATION => !matches!(
                frame.session_update(),
                Some("response_completed" | "auto_compact_completed" | "turn_completed")
            ),
            // A stamped update (Grok stamps its chunks too) may move a root's request time.
            Kind::Notification { method } if method == "session/update" => {
                frame.session_update() != Some("usage_update") && (self.roots.is_empty() || stamps(frame).is_none())
            }
            Kind::Response { .. } => false,
            _ => true,
        }
    }
}

impl GrokUsage {
    /// A `usage_update` of Grok's own (1.0.41 sends none): a root session's gets the facts.
    fn stamp(&mut self, frame: Frame, cx: &mut Cx) {
        let mut v = frame.to_value();
        let session = v.pointer("/params/sessionId").and_then(Value::as_str).map(str::to_owned);
        match session.and_then(|s| self.roots.get(&s)) {
            Some(root) if root.facts.stamp(&mut v) => cx.to_client(frame.rewritten(v)),
            _ => cx.to_client(frame),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layer::testing::Harness;
    use serde_json::json;

    const S: &str = "01a23508-7405-7612-8cc8-1d2ec4083a1a";
    const T0: u64 = 1_796_186_076_330;

    fn started() -> Harness {
        let mut h = Harness::of(GrokUsage::new());
        h.from_client(json!({"jsonrpc":"2.0","id":1,"method":"session/new","params":{"cwd":"/w","mcpServers":[]}}));
        h.to_agent();
        h.from_agent(json!({"jsonrpc":"2.0","id":1,"result":{"sessionId":S,"models":{"currentModelId":"fake",
            "availableModels":[{"modelId":"grok-4.6","_meta":{"totalContextTokens":500000}},
            {"modelId":"fake","_meta":{"totalContextTokens":32000}}]}}}));
        h.to_client();
        h
    }

    fn stamped(session: &str, update: &str, turn: u64, stream: u64, now: u64) -> Value {
        json!({"jsonrpc":"2.0","method":"session/update","params":{"_meta":{"agentTimestampMs":now,
            "streamStartMs":stream,"turnStartMs":turn,"totalTokens":15},"sessionId":session,
            "update":{"sessionUpdate":update,"toolCallId":"call_4"}}})
    }

    fn note(session: &str, update: Value, now: Option<u64>) -> Value {
        let mut v = json!({"jsonrpc":"2.0","method":NOTIFICATION,"params":{"sessionId":session,"update":update}});
        if let Some(now) = now {
            v["params"]["_meta"] = json!({"agentTimestampMs": now});
        }
        v
    }

    fn response(input: u64, read: u64, created: u64, output: u64) -> Value {
        json!({"sessionUpdate":"response_completed","usage":{"input_tokens":input,"cache_read_input_tokens":read,
            "cache_creation_input_tokens":created,"output_tokens":output,"reasoning_tokens":0}})
    }

    /// Frames reaching the client for one agent frame: the frame itself first, untouched.
    fn agent(h: &mut Harness, v: Value) -> Vec<Value> {
        h.from_agent(v.clone());
        let out = h.to_client();
        assert_eq!(out.first(), Some(&v), "Grok's own frame goes on first and untouched");
        out[1..].to_vec()
    }

    fn iso(ms: u64) -> String {
        crate::coda::usage::iso(at(ms)).unwrap()
    }

    #[test]
    fn a_tool_call_turn_ends_with_one_usage_update_carrying_the_last_requests_facts() {
        let mut h = started();
        // First request: sent at the turn's start; the stream began 12 ms later.
        assert!(agent(&mut h, stamped(S, "tool_call", T0, T0 + 12, T0 + 14)).is_empty());
        assert!(agent(&mut h, note(S, response(1000, 200, 30, 50), None)).is_empty());
        assert!(agent(&mut h, stamped(S, "tool_call_update", T0, T0 + 12, T0 + 90)).is_empty());
        // Second request: after the tool's result (the latest stamp), stream 4 ms later.
        assert!(agent(&mut h, stamped(S, "agent_message_chunk", T0, T0 + 94, T0 + 95)).is_empty());
        assert!(agent(&mut h, note(S, response(1300, 1000, 0, 20), None)).is_empty());
        let out = agent(
            &mut h,
            note(
                S,
                json!({"sessionUpdate":"turn_completed","prompt_id":"p1","stop_reason":"end_turn"}),
                Some(T0 + 120),
            ),
        );
        assert_eq!(
            out,
            vec![json!({"jsonrpc":"2.0","method":"session/update","params":{"sessionId":S,"update":{
                "sessionUpdate":"usage_update","used":2320,"size":32000,
                "_meta":{"coda":{"lastRequestAt":iso(T0 + 90),"contextTokens":2300}}}}})]
        );
    }

    #[test]
    fn the_first_request_of_a_turn_is_its_start_and_never_after_the_stream() {
        let mut h = started();
        agent(&mut h, stamped(S, "agent_message_chunk", T0, T0 + 5, T0 + 6));
        agent(&mut h, note(S, response(10, 0, 0, 5), None));
        let out = agent(&mut h, note(S, json!({"sessionUpdate":"turn_completed"}), Some(T0 + 9)));
        assert_eq!(out[0]["params"]["update"]["_meta"]["coda"]["lastRequestAt"], iso(T0));
        // Stamps out of order (a later frame before the stream's start): capped at the stream.
        let t1 = T0 + 1000;
        agent(&mut h, stamped(S, "tool_call", t1, t1 + 10, t1 + 50));
        agent(&mut h, stamped(S, "agent_message_chunk", t1, t1 + 20, t1 + 21));
        let out = agent(&mut h, note(S, json!({"sessionUpdate":"turn_completed"}), Some(t1 + 30)));
        assert_eq!(out[0]["params"]["update"]["_meta"]["coda"]["lastRequestAt"], iso(t1 + 20));
    }

    #[test]
    fn a_compaction_sends_one_with_compacted_at_and_groks_tokens_after() {
        let mut h = started();
        agent(&mut h, stamped(S, "agent_message_chunk", T0, T0 + 5, T0 + 6));
        agent(&mut h, note(S, response(10, 0, 0, 5), None));
        agent(&mut h, note(S, json!({"sessionUpdate":"turn_completed"}), Some(T0 + 9)));
        let done = json!({"sessionUpdate":"auto_compact_completed","tokens_before":15,"tokens_after":8});
        let out = agent(&mut h, note(S, done, Some(T0 + 2000)));
        assert_eq!(out.len(), 1);
        assert_eq!(out[0]["params"]["update"]["used"], 8);
        assert_eq!(
            out[0]["params"]["update"]["_meta"]["coda"],
            json!({"lastRequestAt":iso(T0),"contextTokens":10,"compactedAt":iso(T0 + 2000)})
        );
        // It stays on the next turn's.
        agent(&mut h, stamped(S, "agent_message_chunk", T0 + 3000, T0 + 3005, T0 + 3006));
        let out = agent(&mut h, note(S, json!({"sessionUpdate":"turn_completed"}), Some(T0 + 3010)));
        assert_eq!(out[0]["params"]["update"]["_meta"]["coda"]["compactedAt"], iso(T0 + 2000));
    }

    #[test]
    fn a_subagents_session_and_replayed_history_get_none() {
        let mut h = started();
        assert!(agent(&mut h, stamped("child-1", "agent_message_chunk", T0, T0 + 5, T0 + 6)).is_empty());
        assert!(agent(&mut h, note("child-1", response(10, 0, 0, 5), None)).is_empty());
        assert!(agent(&mut h, note("child-1", json!({"sessionUpdate":"turn_completed"}), Some(T0 + 9))).is_empty());
        h.from_client(json!({"jsonrpc":"2.0","id":5,"method":"session/load","params":{"sessionId":"old","cwd":"/w"}}));
        h.to_agent();
        h.from_agent(json!({"jsonrpc":"2.0","id":5,"result":{"models":{"currentModelId":"fake",
            "availableModels":[{"modelId":"fake","_meta":{"totalContextTokens":32000}}]}}}));
        h.to_client();
        h.from_client(json!({"jsonrpc":"2.0","id":6,"method":"session/load","params":{"sessionId":"old","cwd":"/w"}}));
        h.to_agent();
        assert!(agent(&mut h, note("old", json!({"sessionUpdate":"turn_completed"}), Some(T0))).is_empty());
    }

    #[test]
    fn the_window_follows_the_model_coda_sets() {
        let mut h = started();
        agent(&mut h, note(S, response(10, 0, 0, 5), None));
        h.from_client(
            json!({"jsonrpc":"2.0","id":8,"method":"session/set_model","params":{"sessionId":S,"modelId":"grok-4.6"}}),
        );
        h.to_agent();
        h.from_agent(json!({"jsonrpc":"2.0","id":8,"result":{}}));
        h.to_client();
        let out = agent(&mut h, note(S, json!({"sessionUpdate":"turn_completed"}), Some(T0)));
        assert_eq!(out[0]["params"]["update"]["size"], 500000);
        // A refused change changes nothing.
        h.from_client(json!({"jsonrpc":"2.0","id":9,"method":"session/set_config_option","params":{"sessionId":S,
            "configId":"model","value":"fake"}}));
        h.to_agent();
        h.from_agent(json!({"jsonrpc":"2.0","id":9,"error":{"code":-32602,"message":"no"}}));
        h.to_client();
        let out = agent(&mut h, note(S, json!({"sessionUpdate":"turn_completed"}), Some(T0)));
        assert_eq!(out[0]["params"]["update"]["size"], 500000);
    }

    #[test]
    fn hostile_stamps_and_counts_never_panic_or_lose_the_frame() {
        let mut h = started();
        for raw in [
            format!(
                r#"{{"jsonrpc":"2.0","method":"session/update","params":{{"_meta":{{"streamStartMs":1e400}},"sessionId":"{S}","update":{{"sessionUpdate":"agent_message_chunk"}}}}}}"#
            ),
            format!(
                r#"{{"jsonrpc":"2.0","method":"session/update","params":{{"_meta":{{"streamStartMs":-5,"turnStartMs":"x"}},"sessionId":"{S}","update":{{"sessionUpdate":"agent_message_chunk"}}}}}}"#
            ),
            format!(
                r#"{{"jsonrpc":"2.0","method":"{NOTIFICATION}","params":{{"sessionId":"{S}","update":{{"sessionUpdate":"response_completed","usage":{{"input_tokens":18446744073709551615,"cache_read_input_tokens":18446744073709551615,"output_tokens":"many"}}}}}}}}"#
            ),
            format!(
                r#"{{"jsonrpc":"2.0","method":"{NOTIFICATION}","params":{{"sessionId":"{S}","update":{{"sessionUpdate":"turn_completed","x":"\xff"}}}}}}"#
            ),
        ] {
            let Ok(frame) = Frame::parse(raw.clone().into_bytes()) else { continue };
            h.agent_frame(frame);
            let out = h.take().to_client;
            assert_eq!(out[0].bytes(), raw.as_bytes(), "passed on as it came");
        }
        // Invalid UTF-8 inside a string: read or not, the frame goes on as it came.
        let mut raw = format!(r#"{{"jsonrpc":"2.0","method":"{NOTIFICATION}","params":{{"sessionId":"{S}","update":{{"sessionUpdate":"turn_completed","x":"#).into_bytes();
        raw.extend_from_slice(b"\"\xff\xfe\"}}}");
        if let Ok(frame) = Frame::parse(raw.clone()) {
            h.agent_frame(frame);
            let out = h.take().to_client;
            assert_eq!(out[0].bytes(), &raw[..]);
        }
        // Saturated, not wrapped: the next update says the largest count.
        let out = agent(&mut h, note(S, json!({"sessionUpdate":"turn_completed"}), Some(T0)));
        assert_eq!(out[0]["params"]["update"]["_meta"]["coda"]["contextTokens"], u64::MAX);
        assert!(out[0]["params"]["update"]["_meta"]["coda"].get("lastRequestAt").is_none(), "no stamp was readable");
    }
}

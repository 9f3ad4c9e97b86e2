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
//!   live: README, "Compaction and usage facts".
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
use crate::frame::{Frame, Kind, Needle};
use crate::layer::{Cx, Layer};

const NOTIFICATION: &str = "_x.ai/session_notification";
static STREAM_START: Needle = crate::needle!(b"\"streamStartMs\"");

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

    /// A stamped frame of Grok's (`session/update` `_meta`).
    fn stamped(&mut self, meta: &Value) {
        let ms = |k: &str| meta.get(k).and_then(Value::as_u64);
        if let Some(turn) = ms("turnStartMs")
            && self.turn_start != Some(turn)
        {
            self.turn_start = Some(turn);
            self.stream = None;
        }
        if let Some(stream) = ms("streamStartMs")
            && self.stream != Some(stream)
        {
            self.stream = Some(stream);
            let before = self.turn_start.max(self.latest).unwrap_or(stream);
            self.facts.last_request_at = Some(at(before.min(stream)));
        }
        if let Some(now) = ms("agentTimestampMs") {
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

fn u64_at(v: &Value, key: &str) -> u64 {
    v.get(key).and_then(Value::as_u64).unwrap_or(0)
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
        let Ok(v) = frame.value() else { return };
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

    fn notification(&mut self, frame: &Frame, cx: &mut Cx) {
        let Ok(v) = frame.value() else { return };
        let params = v.get("params").unwrap_or(&Value::Null);
        let Some(session) = params.get("sessionId").and_then(Value::as_str) else { return };
        if !self.roots.contains_key(session) || GrokUsage::is_loading(cx, session) {
            return;
        }
        let root = self.roots.get_mut(session).expect("checked");
        let update = params.get("update").unwrap_or(&Value::Null);
        let stamp = params.pointer("/_meta/agentTimestampMs").and_then(Value::as_u64);
        match update.get("sessionUpdate").and_then(Value::as_str) {
            Some("response_completed") => {
                let Some(u) = update.get("usage") else { return };
                let context = u64_at(u, "input_tokens")
                    .saturating_add(u64_at(u, "cache_read_input_tokens"))
                    .saturating_add(u64_at(u, "cache_creation_input_tokens"));
                root.facts.context_tokens = Some(context);
                root.used = Some(context.saturating_add(u64_at(u, "output_tokens")));
            }
            Some("auto_compact_completed") => {
                root.facts.compacted_at = Some(stamp.map(at).unwrap_or_else(|| cx.wall()));
                if let Some(after) = update.get("tokens_after").and_then(Value::as_u64) {
                    root.used = Some(after);
                }
                self.update(session, cx);
            }
            Some("turn_completed") => {
                root.latest = root.latest.max(stamp);
                self.update(session, cx);
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
            && let Ok(v) = frame.value()
        {
            let p = v.get("params").unwrap_or(&Value::Null);
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
                if frame.has(&STREAM_START)
                    && let Ok(v) = frame.value()
                    && let Some(s) = v.pointer("/params/sessionId").and_then(Value::as_str)
                    && !GrokUsage::is_loading(cx, s)
                    && let (Some(root), Some(meta)) = (self.roots.get_mut(s), v.pointer("/params/_meta"))
                {
                    root.stamped(meta);
                }
                cx.to_client(frame)
            }
            _ => cx.to_client(frame),
        }
    }
}

impl GrokUsage {
    /// A `usage_update` of Grok's own (1.0.41 sends none): a root session's gets the facts.
    fn stamp(&mut self, frame: Frame, cx: &mut Cx) {
        let mut v = match frame.value() {
            Ok(v) => v,
            Err(e) => return cx.unreadable(frame, &e, false),
        };
        let session = v.pointer("/params/sessionId").and_then(Value::as_str).map(str::to_owned);
        match session.and_then(|s| self.roots.get(&s)) {
            Some(root) if root.facts.stamp(&mut v) => cx.to_client(frame.rewritten(&v)),
            _ => cx.to_client(frame),
        }
    }
}

//! Where Grok Build's usage facts are (section 用量里的数据; the rules are [`crate::coda::usage`]'s). Grok sends
//! no `usage_update` at all: the shim sends one of its own ([`Fact::Send`]) for a root session at the end of each
//! turn (Grok's own turns too) and after each compaction.
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
//! - `cacheTtl`: Grok says none.
//! - At load: Grok keeps what it said of a session in its folder (`$GROK_HOME/sessions/<cwd>/<id>/updates.jsonl`):
//!   the stamped updates (the same stamps as live: `lastRequestAt`) and `auto_compact_completed` (`compactedAt`)
//!   ([`history`]). It keeps no request's context (its `response_completed` is not in that file): `contextTokens`
//!   comes with the session's next request.
//!
//! Times are Grok's own stamps (its clock), so a replay gives the same facts on any day.

use crate::HashMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde_json::Value;

use crate::coda::usage::{Fact, Facts, LoadJob, Said, Source, UsageFacts, history_lines, per_root, plain_name};
use crate::file_log::{Direct, FileLog};
use crate::frame::{Frame, Kind};
use crate::inside::{Folder, Kind as Entry};
use crate::json::View;
use crate::layer::Cx;

const NOTIFICATION: &str = "_x.ai/session_notification";

/// A model a `session/set_model` or `session/set_config_option` asked for (a note on that request).
struct ModelAsked(String);

#[derive(Default)]
struct Root {
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

    /// A stamped frame of Grok's (`session/update` `_meta`'s stamps): the time of a new request, if it starts one.
    fn stamped(&mut self, stamps: Stamps) -> Option<SystemTime> {
        if let Some(turn) = stamps.turn
            && self.turn_start != Some(turn)
        {
            self.turn_start = Some(turn);
            self.stream = None;
        }
        let mut request = None;
        if let Some(stream) = stamps.stream
            && self.stream != Some(stream)
        {
            self.stream = Some(stream);
            let before = self.turn_start.max(self.latest).unwrap_or(stream);
            request = Some(at(before.min(stream)));
        }
        if let Some(now) = stamps.now {
            self.latest = self.latest.max(Some(now));
        }
        request
    }
}

/// Grok's stamps in a `_meta`: `turnStartMs`, `streamStartMs`, `agentTimestampMs` (ms since the epoch).
#[derive(Debug, Default, PartialEq)]
struct Stamps {
    turn: Option<u64>,
    stream: Option<u64>,
    now: Option<u64>,
}

impl Stamps {
    /// Of a parsed `_meta` (a record of Grok's session folder).
    fn of_value(meta: &Value) -> Stamps {
        let ms = |k: &str| meta.get(k).and_then(Value::as_u64);
        Stamps { turn: ms("turnStartMs"), stream: ms("streamStartMs"), now: ms("agentTimestampMs") }
    }

    /// Of a frame's `_meta` as it lies in the frame (the frame check found it): one pass over its members (of a
    /// key twice, the last, as a parsed value keeps).
    fn of_view(meta: View) -> Stamps {
        let mut stamps = Stamps::default();
        for (key, value) in meta.members() {
            let slot = if key.is("turnStartMs") {
                &mut stamps.turn
            } else if key.is("streamStartMs") {
                &mut stamps.stream
            } else if key.is("agentTimestampMs") {
                &mut stamps.now
            } else {
                continue;
            };
            *slot = value.as_u64();
        }
        stamps
    }
}

/// Whether `frame`'s `params._meta` (as the frame check found it) may hold `streamStartMs`: the key as it is
/// written (each `S` looked at), or a `\u` escape anywhere in the line (the one escape that can spell a letter:
/// read exactly then, [`Frame::unicode_escaped`]). It runs on every stamped frame.
fn may_stream(frame: &Frame) -> bool {
    frame.meta().is_some_and(|meta| {
        let text = meta.text();
        frame.unicode_escaped()
            || memchr::memchr_iter(b'S', text)
                .any(|at| text[..at].ends_with(b"\"stream") && text[at..].starts_with(b"StartMs\""))
    })
}

fn at(ms: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_millis(ms)
}

/// Where Grok's facts are (see the module's docs).
#[derive(Default)]
pub struct Grok {
    /// Grok's data folder (`$GROK_HOME`), where a loaded session's folder is.
    home: Option<PathBuf>,
    /// `CODA_GROK_RECORD`: what a load read of a session's `updates.jsonl`, for recordings.
    record: Option<FileLog>,
    roots: HashMap<String, Root>,
}

/// What Grok keeps of `session` under its data folder `home` (`sessions/<cwd>/<session>/updates.jsonl`; links are
/// not followed): the last request, by the same stamps as live, and the last compaction.
pub fn history(home: &Path, session: &str) -> Facts {
    read_history(home, session, None)
}

/// [`history`], and with `record`, what was read of the file logged as it was at Coda's load (the time handed in).
fn read_history(home: &Path, session: &str, record: Option<(Direct, SystemTime)>) -> Facts {
    let mut facts = Facts::default();
    // Inside `home` only ([`crate::inside`]): a link on the way is not followed.
    let sessions = std::fs::canonicalize(home).ok().and_then(|h| Folder::open(&h).ok()?.folder("sessions").ok());
    let Some(sessions) = sessions else { return facts };
    let cwds = sessions.entries().into_iter().filter(|(_, m)| m.kind == Entry::Folder);
    let found = cwds.into_iter().find_map(|(cwd, _)| {
        let rel = format!("{cwd}/{session}/updates.jsonl");
        Some((sessions.file(&rel).ok()?, rel))
    });
    let Some((file, rel)) = found else { return facts };
    let lines = history_lines(file);
    if let Some((log, at)) = record {
        log.opened(at, &home.join("sessions").join(rel), &lines);
    }
    let mut root = Root::default();
    for line in lines {
        let Ok(record) = crate::json::from_slice::<Value>(&line) else { continue };
        let Some(params) = record.get("params") else { continue };
        let update = params.pointer("/update/sessionUpdate").and_then(Value::as_str);
        let stamp = params.pointer("/_meta/agentTimestampMs").and_then(Value::as_u64);
        match update {
            Some("auto_compact_completed") => facts.compacted_at = stamp.map(at).or(facts.compacted_at),
            _ => {
                if let Some(request) = params.get("_meta").and_then(|m| root.stamped(Stamps::of_value(m))) {
                    facts.last_request_at = Some(request);
                }
            }
        }
    }
    facts
}

impl Grok {
    fn root(&mut self, session: &str, cx: &Cx) -> Option<&mut Root> {
        per_root(&mut self.roots, session, cx, |_| false)
    }
}

impl Source for Grok {
    type Event = std::convert::Infallible;

    fn closed(&mut self, session: &str) {
        self.roots.remove(session);
    }

    fn kept(&self) -> usize {
        self.roots.len()
    }

    fn at_load(&self, session: &str, _: &Value, cx: &Cx) -> Option<LoadJob> {
        let record = self.record.as_ref().map(|log| (log.direct(), cx.wall()));
        let (home, session) = (self.home.clone()?, plain_name(session)?.to_owned());
        Some(Box::new(move || read_history(&home, &session, record)))
    }

    fn from_client(&mut self, frame: &Frame, cx: &mut Cx, _: &mut Said) {
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
    }

    fn answered(&mut self, answer: &Frame, cx: &mut Cx, out: &mut Said) {
        let Some(r) = cx.answer_to(answer) else { return };
        let (method, named) = (r.method.to_string(), r.session().map(str::to_owned));
        let asked = r.note::<ModelAsked>().map(|m| m.0.clone());
        let v = answer.value();
        let Some(result) = v.get("result") else { return };
        let session = match method.as_str() {
            "session/new" => result.get("sessionId").and_then(Value::as_str).map(str::to_owned),
            "session/load" | "session/resume" | "session/set_model" | "session/set_config_option" => named,
            _ => None,
        };
        let Some(session) = session else { return };
        let Some(root) = self.root(&session, cx) else { return };
        match asked {
            Some(model) => root.model = Some(model),
            None => root.models(result),
        }
        if let Some(size) = root.size() {
            out.push((session, Fact::Size(size)));
        }
    }

    fn wants(&self, frame: &Frame) -> bool {
        // A stamped update (below), told first: the bulk of what Grok sends is its stamped chunks.
        if frame.is_streamed_chunk() {
            return may_stream(frame);
        }
        match frame.kind() {
            Kind::Notification { method } if method == NOTIFICATION => {
                matches!(
                    frame.session_update(),
                    Some("response_completed" | "auto_compact_completed" | "turn_completed")
                )
            }
            // A stamped update (Grok stamps its chunks too) may start a root's request: its stamps are read from
            // the frame check's one pass (a chunk is not parsed).
            Kind::Notification { method } if method == "session/update" => may_stream(frame),
            _ => false,
        }
    }

    /// A chunk is wanted by what its `_meta` holds.
    fn chunks_by_session(&self) -> bool {
        false
    }

    fn from_agent(&mut self, frame: &Frame, cx: &mut Cx, out: &mut Said) {
        if frame.is_notification("session/update") {
            // Read where they lie: a stamped chunk is not parsed.
            let (Some(session), Some(meta)) = (frame.session(), frame.meta()) else { return };
            let Some(root) = self.root(&session, cx) else { return };
            if let Some(request) = root.stamped(Stamps::of_view(meta)) {
                out.push((session.into_owned(), Fact::Request(request)));
            }
            return;
        }
        // Grok's notification of a turn, read where it lies (it carries the turn's whole text): the update's
        // fields from its place, the stamp from `_meta`'s.
        let Some(session) = frame.session() else { return };
        let session: &str = &session;
        let wall = cx.wall();
        let Some(root) = self.root(session, cx) else { return };
        let mut say = |fact| out.push((session.to_owned(), fact));
        let update = frame.update_value();
        let field = |k: &str| update.and_then(|u| u.get(k));
        let stamp = frame.meta().and_then(|m| m.get("agentTimestampMs")).and_then(|t| t.as_u64());
        match frame.session_update() {
            Some("response_completed") => {
                let Some(u) = field("usage") else { return };
                // (Its four counts in one pass over it.)
                let keys = ["input_tokens", "cache_read_input_tokens", "cache_creation_input_tokens", "output_tokens"];
                let [input, read, created, output] = u.pick(keys).map(|n| n.and_then(|n| n.as_u64()).unwrap_or(0));
                let context = input.saturating_add(read).saturating_add(created);
                say(Fact::Context(context));
                say(Fact::Used(context.saturating_add(output)));
            }
            Some("auto_compact_completed") => {
                say(Fact::Compacted(stamp.map(at).unwrap_or(wall)));
                if let Some(after) = field("tokens_after").and_then(|n| n.as_u64()) {
                    say(Fact::Used(after));
                }
                say(Fact::Send);
            }
            Some("turn_completed") => {
                root.latest = root.latest.max(stamp);
                say(Fact::Send);
            }
            _ => {}
        }
    }
}

/// coda-grok's usage facts layer.
pub type GrokUsage = UsageFacts<Grok>;

/// The layer over Grok's data folder `home` (`$GROK_HOME`, read at set-up; None: nothing is read at load),
/// logging what a load read to `record` (`CODA_GROK_RECORD`).
pub fn layer(home: Option<PathBuf>, record: Option<FileLog>) -> GrokUsage {
    UsageFacts::new(Grok { home, record, roots: HashMap::default() })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layer::testing::Harness;
    use serde_json::json;

    const S: &str = "01a23508-7405-7612-8cc8-1d2ec4083a1a";
    const T0: u64 = 1_796_186_076_330;

    /// A stamped chunk is wanted when its `_meta` holds `streamStartMs`, however the key is spelled (with a `\u`
    /// escape too), and passed by when it does not (a `_meta` shorter than the key, or the key as a value's text
    /// read and found no stamp).
    #[test]
    fn a_stamped_chunk_is_wanted_by_its_stream_stamp_however_the_key_is_spelled() {
        let chunk = |meta: &str| {
            let line = format!(
                r#"{{"jsonrpc":"2.0","method":"session/update","params":{{"sessionId":"{S}","update":{{"sessionUpdate":"agent_message_chunk","content":{{"type":"text","text":"a"}}}},"_meta":{meta}}}}}"#
            );
            Frame::parse(line.into_bytes()).expect("a frame")
        };
        for (meta, wanted) in [
            (r#"{"streamStartMs":1796186871600}"#, true),
            (r#"{"stream\u0053tartMs":1796186871600}"#, true),
            (r#"{"\u0073treamStartMs":1796186871600,"t":1}"#, true),
            (r#"{"t":1}"#, false),
            (r#"{"eventId":"e-1","agentTimestampMs":1796186871643,"turnStartMs":1796186871593}"#, false),
            (r#"{"streamStart":1}"#, false),
        ] {
            let frame = chunk(meta);
            assert!(frame.is_streamed_chunk(), "{meta}");
            assert_eq!(Grok::default().wants(&frame), wanted, "{meta}");
            if wanted {
                let stamps = Stamps::of_view(frame.meta().expect("a _meta"));
                assert_eq!(
                    stamps,
                    Stamps::of_value(frame.value().pointer("/params/_meta").expect("a _meta")),
                    "{meta}"
                );
                assert!(stamps.stream.is_some(), "{meta}");
            }
        }
    }

    /// The stamps read where they lie are those of the parsed `_meta`, and a `_meta` that holds
    /// `streamStartMs` is never passed by unread, for every recorded frame and the hostile lines.
    #[test]
    fn stamps_read_in_place_are_the_parsed_ones_for_every_recorded_and_hostile_line() {
        let mut lines = crate::frame::recorded_lines();
        lines.extend(crate::frame::hostile_lines());
        let mut read = 0;
        for line in lines {
            let Ok(frame) = Frame::parse(line) else { continue };
            let Some(meta) = frame.meta() else { continue };
            let parsed = frame.value().pointer("/params/_meta").expect("a _meta");
            let want = Stamps::of_value(parsed);
            assert_eq!(Stamps::of_view(meta), want, "{parsed}");
            if parsed.get("streamStartMs").is_some() {
                assert!(may_stream(&frame), "{parsed}");
            }
            read += usize::from(want.stream.is_some());
        }
        assert!(read > 500, "stamped frames read ({read})");
    }

    fn started() -> Harness {
        let mut h = Harness::of(layer(None, None));
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

    /// Writes session `S`'s folder under `home` with an `updates.jsonl` as Grok 1.0.41 writes it (its lines'
    /// shapes, from a live run): a stamped chunk, an automatic compaction, a later turn's chunk. Returns the folder,
    /// the file and its text.
    fn session_folder(home: &Path) -> (PathBuf, PathBuf, String) {
        let folder = home.join("sessions/%2Fwork%2Fapp").join(S);
        std::fs::create_dir_all(&folder).unwrap();
        let stamped = |turn: u64, stream: u64, now: u64| {
            json!({"timestamp":1796351380,"method":"session/update",
            "params":{"sessionId":S,"_meta":{"agentTimestampMs":now,"streamStartMs":stream,"turnStartMs":turn},
            "update":{"sessionUpdate":"agent_message_chunk"}}})
        };
        let lines = [
            stamped(T0, T0 + 12, T0 + 14),
            json!({"timestamp":1796351381,"method":"_x.ai/session/update","params":{"sessionId":S,
                "_meta":{"agentTimestampMs":T0 + 500},"update":{"sessionUpdate":"auto_compact_completed",
                "tokens_before":18980,"tokens_after":10332}}}),
            stamped(T0 + 1000, T0 + 1010, T0 + 1011),
        ];
        let text: String = lines.iter().map(|l| format!("{l}\n")).collect();
        let file = folder.join("updates.jsonl");
        std::fs::write(&file, &text).unwrap();
        (folder, file, text)
    }

    #[test]
    fn a_loaded_sessions_last_request_and_compaction_are_read_from_its_folder() {
        let home = tempfile::tempdir().unwrap();
        let (folder, _, _) = session_folder(home.path());
        let facts = history(home.path(), S);
        assert_eq!(facts.compacted_at, Some(at(T0 + 500)));
        assert_eq!(facts.last_request_at, Some(at(T0 + 1000)), "the turn's start, as live");
        assert_eq!(facts.context_tokens, None);
        assert_eq!(history(home.path(), "other"), Facts::default());
        assert_eq!(history(home.path(), ".."), Facts::default());
        // A session folder reached through a link to a folder outside is not read.
        let outside = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(outside.path().join("linked")).unwrap();
        std::fs::copy(folder.join("updates.jsonl"), outside.path().join("linked/updates.jsonl")).unwrap();
        std::os::unix::fs::symlink(outside.path(), home.path().join("sessions/%2Felsewhere")).unwrap();
        assert_eq!(history(home.path(), "linked"), Facts::default());
        std::os::unix::fs::symlink(outside.path().join("linked"), home.path().join("sessions/%2Fwork%2Fapp/linked"))
            .unwrap();
        assert_eq!(history(home.path(), "linked"), Facts::default());
    }

    /// With `CODA_GROK_RECORD`, a load logs the `updates.jsonl` it read, whole, as it was at Coda's request (the
    /// time of the request, not of the job that read it), so that a replay finds it there; a load of a session
    /// Grok keeps nothing of logs nothing.
    #[test]
    fn a_recording_logs_the_session_file_a_load_read_as_it_was_at_codas_request() {
        let home = tempfile::tempdir().unwrap();
        let (_, file, text) = session_folder(home.path());
        let log_path = home.path().join("files.jsonl");
        let log = FileLog::open("CODA_GROK_RECORD", &log_path).expect("the log");
        let mut h = Harness::of(layer(Some(home.path().to_path_buf()), Some(log)));
        h.hold_work();
        h.advance(Duration::from_millis(1500));
        let load = |id: u64, session: &str| json!({"jsonrpc":"2.0","id":id,"method":"session/load","params":{"sessionId":session,"cwd":"/work/app"}});
        h.from_client(load(1, S));
        h.advance(Duration::from_millis(700));
        h.from_client(load(2, "01a23508-0000-7612-8cc8-1d2ec4083a1a"));
        assert_eq!(h.run_work(), 2);
        drop(h);
        let logged = std::fs::read_to_string(&log_path).unwrap();
        let records: Vec<Value> = logged.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
        assert_eq!(records.len(), 1, "no record for a session without a folder: {logged}");
        let ts: jiff::Timestamp = records[0]["ts"].as_str().unwrap().parse().unwrap();
        assert_eq!(SystemTime::from(ts), crate::layer::testing::wall_start() + Duration::from_millis(1500));
        assert_eq!(
            (&records[0]["at"], &records[0]["op"], &records[0]["path"], &records[0]["data"]),
            (&json!("open"), &json!("replace"), &json!(file.to_str().unwrap()), &json!(text))
        );
    }
}

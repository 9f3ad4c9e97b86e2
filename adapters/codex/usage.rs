//! Coda's usage facts on Codex's `usage_update`s (section 用量里的数据): `_meta.coda` on every `usage_update` of
//! a root session (a subagent's are left as they are), and one of the shim's own right after a compaction.
//!
//! - `contextTokens`: the update's `used`, Codex's own measure of the context (the last model response's total
//!   tokens: what the next request carries). Exact, as Codex counts.
//! - `lastRequestAt`: Codex says when a response came, never when its request left. A request of the main
//!   thread starts when the shim forwards a `session/prompt` (Coda's, or its own `/compact`), when the last
//!   open tool call of the session ends (`tool_call_update` `completed` or `failed`: the results go back to
//!   the model), when a compaction starts (its summarising request), or when one inside a turn of Coda's
//!   completes (Codex goes on at once). Codex reports parallel tool calls one after another, so a later end in
//!   the same batch moves that start on. Codex sends one `usage_update` per response, sometimes after the
//!   tools its response asked for have ended: so the starts wait in order, and each update takes the oldest
//!   (an update with none waiting keeps the last). An estimate a little early: docs/codex.md gives the error measured
//!   against the fake model's log.
//! - `compactedAt`: when a compaction of the session completed, asked for or automatic: `compaction_update`
//!   `completed` for a client that declared `session.compaction`, else the end (`completed`) of the "Compact
//!   conversation" tool call (`_meta.jetbrains.air.contextCompaction`). Codex sends its `usage_update`s before
//!   `completed`, so the shim sends one of its own right after it, with the facts and Codex's last figures.
//! - `cacheTtl`: Codex does not say it, so it is never sent.
//!
//! Times are `cx.wall()` of the frame that tells them.

use std::collections::{HashMap, HashSet, VecDeque};
use std::convert::Infallible;
use std::time::SystemTime;

use serde_json::Value;

use super::roots::Roots;
use crate::coda::usage::Facts;
use crate::frame::{Frame, Kind, Needle};
use crate::layer::{Cx, Layer};

/// More waiting request starts than any response count could need: the oldest are dropped.
const STARTS_MAX: usize = 16;

static STATUS: Needle = crate::needle!(b"\"status\"");

/// What the shim knows of one root session.
#[derive(Debug, Default)]
struct Session {
    facts: Facts,
    /// When the requests whose responses have not been counted yet started, oldest first; whether each was
    /// started by a tool's end.
    starts: VecDeque<(SystemTime, bool)>,
    /// Tool calls running (by toolCallId): the next request starts when the last one ends.
    open_tools: HashSet<String>,
    /// Codex's last `used` and `size`.
    used: Option<u64>,
    size: Option<u64>,
    /// Tool calls that are compactions (by toolCallId).
    compaction_tools: HashSet<String>,
}

#[derive(Default)]
pub struct Usage {
    roots: Roots,
    sessions: HashMap<String, Session>,
}

/// How a compaction went, from either of Codex's two ways of telling.
#[derive(Debug, PartialEq)]
enum Compaction {
    Started,
    Completed,
    Failed,
}

impl Session {
    fn started(&mut self, at: SystemTime) {
        if self.starts.len() == STARTS_MAX {
            self.starts.pop_front();
        }
        self.starts.push_back((at, false));
    }

    /// A tool's end starts the next request: a later end of the same batch (Codex reports parallel calls one
    /// after another) moves that start on instead of adding one.
    fn tool_ended(&mut self, at: SystemTime) {
        match self.starts.back_mut() {
            Some(back) if back.1 => back.0 = at,
            _ => {
                self.started(at);
                if let Some(back) = self.starts.back_mut() {
                    back.1 = true;
                }
            }
        }
    }

    /// A new phase (a turn, a compaction) starts at `at`: what waited is no longer owed.
    fn restart(&mut self, at: Option<SystemTime>) {
        self.starts.clear();
        self.open_tools.clear();
        if let Some(at) = at {
            self.started(at);
        }
    }
}

impl Usage {
    pub fn new() -> Usage {
        Usage::default()
    }

    /// The facts known of `session` (for tests and the layers that look).
    pub fn facts(&self, session: &str) -> Option<&Facts> {
        self.sessions.get(session).map(|s| &s.facts)
    }

    fn root(&mut self, session: &str) -> Option<&mut Session> {
        if !self.roots.contains(session) {
            return None;
        }
        Some(self.sessions.entry(session.to_owned()).or_default())
    }

    /// A prompt on its way to codex-acp: the main thread's request starts now.
    fn prompt(&mut self, frame: &Frame, cx: &Cx) {
        let from_table = frame.id().and_then(|id| cx.request_of(id)).and_then(|r| r.session().map(str::to_owned));
        // The shim's own prompts (its `/compact`) are in no table: read them.
        let session = from_table
            .or_else(|| frame.value().pointer("/params/sessionId").and_then(Value::as_str).map(str::to_owned));
        let wall = cx.wall();
        if let Some(s) = session.as_deref().and_then(|s| self.root(s)) {
            s.restart(Some(wall));
        }
    }

    /// codex-acp's `usage_update`: its figures are the context's, stamped with the facts. Read where they lie
    /// and written in place (a `usage_update` is a fifth of Codex's stream).
    fn usage_update(&mut self, frame: Frame, cx: &mut Cx) {
        let session_id = frame.session().unwrap_or_default().into_owned();
        let Some(session) = self.root(&session_id) else { return cx.to_client(frame) };
        let (mut used, mut size) = (None, None);
        for (key, value) in frame.update_value().into_iter().flat_map(|u| u.members()) {
            if key.is("used") {
                used = value.as_u64();
            } else if key.is("size") {
                size = value.as_u64();
            }
        }
        if used.is_some() {
            session.used = used;
            session.facts.context_tokens = used;
        }
        session.size = size.or(session.size);
        if let Some((at, _)) = session.starts.pop_front() {
            session.facts.last_request_at = Some(at);
        }
        match session.facts.stamp_frame(&frame) {
            Some(stamped) => cx.to_client(stamped),
            None => cx.to_client(frame),
        }
    }

    fn update(&mut self, frame: Frame, cx: &mut Cx) {
        let kind = frame.session_update().unwrap_or_default();
        let wanted = match kind {
            "usage_update" | "compaction_update" => true,
            "tool_call" => true,
            "tool_call_update" => frame.has(&STATUS),
            _ => false,
        };
        if !wanted {
            return cx.to_client(frame);
        }
        if kind == "usage_update" {
            return self.usage_update(frame, cx);
        }
        // What is read of a tool call, read where it lies.
        let session_id = frame.session().unwrap_or_default().into_owned();
        let wall = cx.wall();
        let Some(session) = self.root(&session_id) else { return cx.to_client(frame) };
        let (mut status, mut id, mut meta) = (None, None, None);
        for (key, value) in frame.update_value().into_iter().flat_map(|u| u.members()) {
            if key.is("status") {
                status = value.as_str();
            } else if key.is("toolCallId") {
                id = value.as_str();
            } else if key.is("_meta") {
                meta = Some(value);
            }
        }
        let status = status.as_deref();
        let compaction = match kind {
            "compaction_update" => match status {
                Some("in_progress") => Some(Compaction::Started),
                Some("completed") => Some(Compaction::Completed),
                Some("failed") => Some(Compaction::Failed),
                _ => None,
            },
            "tool_call" | "tool_call_update" => {
                let id = id.unwrap_or_default().into_owned();
                let ended = matches!(status, Some("completed" | "failed"));
                let air_compaction = meta.and_then(|m| m.pointer(&["jetbrains", "air", "contextCompaction"]));
                if kind == "tool_call" && air_compaction.is_some() {
                    session.compaction_tools.insert(id);
                    Some(Compaction::Started)
                } else if ended && session.compaction_tools.remove(&id) {
                    Some(if status == Some("completed") { Compaction::Completed } else { Compaction::Failed })
                } else {
                    if ended {
                        // Once no tool runs, the results go back to the model: the next request starts.
                        if session.open_tools.remove(&id) && session.open_tools.is_empty() {
                            session.tool_ended(wall);
                        }
                    } else if matches!(status, Some("pending" | "in_progress")) {
                        session.open_tools.insert(id);
                    }
                    None
                }
            }
            _ => None,
        };
        match compaction {
            // The summarising request starts.
            Some(Compaction::Started) => session.restart(Some(wall)),
            Some(Compaction::Completed) => {
                session.facts.compacted_at = Some(wall);
                let own = match (session.used, session.size) {
                    (Some(used), Some(size)) => Some(session.facts.update(&session_id, used, size)),
                    _ => None,
                };
                // Compacted inside a turn of Coda's: Codex goes on with a request on the compacted context.
                let in_turn =
                    cx.open_requests().any(|r| r.is("session/prompt") && r.session() == Some(session_id.as_str()));
                session.restart(in_turn.then_some(wall));
                cx.to_client(frame);
                if let Some(own) = own {
                    cx.to_client(own);
                }
                return;
            }
            Some(Compaction::Failed) | None => {}
        }
        cx.to_client(frame)
    }
}

impl Layer for Usage {
    type Timer = Infallible;
    type Event = Infallible;
    type Reply = Infallible;

    fn from_client(&mut self, frame: Frame, cx: &mut Cx) {
        if frame.is_request("session/prompt") {
            self.prompt(&frame, cx);
        }
        cx.to_agent(frame)
    }

    fn from_agent(&mut self, frame: Frame, cx: &mut Cx) {
        match frame.kind() {
            Kind::Response { .. } => {
                self.roots.learn(&frame, cx);
                // A turn ended: nothing it started is owed any more.
                let ended = cx.answer_to(&frame).filter(|r| r.is("session/prompt")).and_then(|r| r.session());
                if let Some(s) = ended.map(str::to_owned).as_deref().and_then(|s| self.root(s)) {
                    s.restart(None);
                }
                cx.to_client(frame)
            }
            Kind::Notification { method } if method == "session/update" => self.update(frame, cx),
            _ => cx.to_client(frame),
        }
    }

    fn passes_from_agent(&self, frame: &Frame) -> bool {
        match frame.kind() {
            // The updates `update` reads (a `tool_call_update` only with a status, but it may have one).
            Kind::Notification { method } if method == "session/update" => !matches!(
                frame.session_update(),
                Some("usage_update" | "compaction_update" | "tool_call" | "tool_call_update")
            ),
            Kind::Response { .. } => false,
            _ => true,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::coda::usage::iso;
    use crate::layer::testing::{Harness, wall_start};
    use serde_json::json;
    use std::time::Duration;

    const S: &str = "root-1";

    fn at(ms: u64) -> String {
        iso(wall_start() + Duration::from_millis(ms)).unwrap()
    }

    fn started() -> Harness {
        let mut h = Harness::of(Usage::new());
        h.from_client(json!({"jsonrpc":"2.0","id":1,"method":"session/new","params":{"cwd":"/w"}}));
        h.from_agent(json!({"jsonrpc":"2.0","id":1,"result":{"sessionId":S}}));
        h.to_client();
        h.to_agent();
        h
    }

    fn update(session: &str, update: Value) -> Value {
        json!({"jsonrpc":"2.0","method":"session/update","params":{"sessionId":session,"update":update}})
    }

    fn usage(session: &str, used: Value) -> Value {
        update(session, json!({"sessionUpdate":"usage_update","used":used,"size":258400}))
    }

    fn advance(h: &mut Harness, ms: u64) {
        h.advance(Duration::from_millis(ms));
    }

    fn coda(v: &Value) -> Value {
        v["params"]["update"]["_meta"]["coda"].clone()
    }

    #[test]
    fn each_update_takes_the_oldest_request_start_and_the_last_of_parallel_tools_starts_the_next() {
        let mut h = started();
        advance(&mut h, 100);
        h.from_client(json!({"jsonrpc":"2.0","id":2,"method":"session/prompt","params":{"sessionId":S,"prompt":[]}}));
        assert_eq!(h.to_agent().len(), 1);
        advance(&mut h, 60);
        let tool = |id: &str, status: &str| {
            let kind = if status == "in_progress" { "tool_call" } else { "tool_call_update" };
            update(S, json!({"sessionUpdate":kind,"toolCallId":id,"status":status}))
        };
        // Parallel calls as Codex reports them: one after the other.
        h.from_agent(tool("c1", "in_progress"));
        h.from_agent(tool("c1", "completed"));
        h.from_agent(tool("c2", "in_progress"));
        advance(&mut h, 5);
        h.from_agent(tool("c2", "failed"));
        // The response that asked for the tools is counted after they ended: it answers the prompt's request.
        h.from_agent(usage(S, json!(10386)));
        advance(&mut h, 30);
        h.from_agent(usage(S, json!(10471)));
        // A repeat with no request waiting keeps the last.
        h.from_agent(usage(S, json!(10471)));
        let out = h.to_client();
        assert_eq!(out.len(), 7);
        assert_eq!(coda(&out[4]), json!({"lastRequestAt":at(100),"contextTokens":10386}));
        assert_eq!(coda(&out[5]), json!({"lastRequestAt":at(165),"contextTokens":10471}));
        assert_eq!(coda(&out[6]), coda(&out[5]));
        // The tool frames pass as they came.
        assert!(out[0]["params"]["update"].get("_meta").is_none());
        // The turn's answer forgets what was owed; the next prompt starts afresh.
        h.from_agent(tool("c3", "in_progress"));
        h.from_agent(json!({"jsonrpc":"2.0","id":2,"result":{"stopReason":"end_turn"}}));
        advance(&mut h, 100);
        h.from_client(json!({"jsonrpc":"2.0","id":3,"method":"session/prompt","params":{"sessionId":S,"prompt":[]}}));
        h.from_agent(usage(S, json!(10500)));
        assert_eq!(coda(h.to_client().last().unwrap())["lastRequestAt"], at(295));
    }

    #[test]
    fn the_prompt_forwarded_starts_the_request_and_a_compaction_is_recorded_with_an_update_of_the_shims() {
        let mut h = started();
        advance(&mut h, 1000);
        h.from_client(json!({"jsonrpc":"2.0","id":2,"method":"session/prompt","params":{"sessionId":S,"prompt":[]}}));
        advance(&mut h, 50);
        h.from_agent(usage(S, json!(10471)));
        assert_eq!(coda(&h.to_client()[0]), json!({"lastRequestAt":at(1000),"contextTokens":10471}));
        advance(&mut h, 1000);
        h.from_agent(update(S, json!({"sessionUpdate":"compaction_update","compactionId":"k","status":"in_progress"})));
        h.from_agent(usage(S, json!(10471)));
        h.from_agent(usage(S, json!(7479)));
        h.from_agent(usage(S, json!(7547)));
        advance(&mut h, 8);
        h.from_agent(update(S, json!({"sessionUpdate":"compaction_update","compactionId":"k","status":"completed"})));
        let out = h.to_client();
        assert_eq!(out.len(), 6, "{out:#?}");
        assert_eq!(coda(&out[3]), json!({"lastRequestAt":at(2050),"contextTokens":7547}));
        assert_eq!(out[4]["params"]["update"]["status"], "completed");
        assert_eq!(
            out[5],
            json!({"jsonrpc":"2.0","method":"session/update","params":{"sessionId":S,"update":{
                "sessionUpdate":"usage_update","used":7547,"size":258400,"_meta":{"coda":{
                "lastRequestAt":at(2050),"contextTokens":7547,"compactedAt":at(2058)}}}}})
        );
        // Later updates keep compactedAt.
        h.from_agent(usage(S, json!(7600)));
        assert_eq!(coda(&h.to_client()[0])["compactedAt"], at(2058));
    }

    #[test]
    fn a_compaction_inside_a_turn_starts_the_next_request_when_it_completes() {
        let mut h = started();
        h.from_client(json!({"jsonrpc":"2.0","id":2,"method":"session/prompt","params":{"sessionId":S,"prompt":[]}}));
        h.from_agent(usage(S, json!(10387)));
        advance(&mut h, 10);
        h.from_agent(update(S, json!({"sessionUpdate":"compaction_update","compactionId":"k","status":"in_progress"})));
        h.from_agent(usage(S, json!(7548)));
        advance(&mut h, 30);
        h.from_agent(update(S, json!({"sessionUpdate":"compaction_update","compactionId":"k","status":"completed"})));
        let own = h.to_client().pop().unwrap();
        // The shim's own update still names the summarising request.
        assert_eq!(coda(&own), json!({"lastRequestAt":at(10),"contextTokens":7548,"compactedAt":at(40)}));
        advance(&mut h, 20);
        h.from_agent(usage(S, json!(10496)));
        assert_eq!(coda(&h.to_client()[0]), json!({"lastRequestAt":at(40),"contextTokens":10496,"compactedAt":at(40)}));
    }

    #[test]
    fn the_compact_conversation_tool_call_is_a_compaction_too_and_a_failed_one_sets_nothing() {
        let mut h = started();
        h.from_agent(usage(S, json!(15)));
        let compacting = |id: &str| {
            json!({"sessionUpdate":"tool_call","toolCallId":id,"kind":"think","title":"Compact conversation",
                "status":"in_progress","_meta":{"jetbrains":{"air":{"version":1,"contextCompaction":{"version":1}}}}})
        };
        h.from_agent(update(S, compacting("t")));
        h.from_agent(update(S, json!({"sessionUpdate":"tool_call_update","toolCallId":"t","status":"failed"})));
        h.from_agent(usage(S, json!(16)));
        let out = h.to_client();
        assert_eq!(out.len(), 4);
        assert!(coda(&out[3]).get("compactedAt").is_none());
        advance(&mut h, 5);
        h.from_agent(update(S, compacting("u")));
        advance(&mut h, 5);
        h.from_agent(update(S, json!({"sessionUpdate":"tool_call_update","toolCallId":"u","status":"completed"})));
        let out = h.to_client();
        assert_eq!(out.len(), 3, "the tool frames and the shim's update");
        assert_eq!(coda(&out[2])["compactedAt"], at(10));
        assert_eq!(out[2]["params"]["update"]["used"], 16);
    }

    #[test]
    fn a_subagents_updates_and_unknown_sessions_are_left_as_they_are() {
        let mut h = started();
        let child = usage("child-thread", json!(300));
        let generation = usage("child-thread:generation:2", json!(301));
        h.from_agent(child.clone());
        h.from_agent(generation.clone());
        h.from_agent(update("child-thread", json!({"sessionUpdate":"compaction_update","status":"completed"})));
        let out = h.to_client();
        assert_eq!(
            out,
            vec![
                child,
                generation,
                update("child-thread", json!({"sessionUpdate":"compaction_update","status":"completed"}))
            ]
        );
        assert!(h.layer::<Usage>(0).facts("child-thread").is_none());
    }

    #[test]
    fn hostile_numbers_and_shapes_never_panic_and_keep_what_was_known() {
        let mut h = started();
        h.from_agent(usage(S, json!(100)));
        h.to_client();
        // 1e400, a negative, a string, a huge integer: no contextTokens from them, the frame keeps its spelling.
        for used in ["1e400", "-5", "\"lots\"", "184467440737095516160"] {
            let line = format!(
                r#"{{"jsonrpc":"2.0","method":"session/update","params":{{"sessionId":"{S}","update":{{"sessionUpdate":"usage_update","used":{used},"size":1}}}}}}"#
            );
            h.agent_frame(Frame::parse(line.into_bytes()).unwrap());
            let out = h.take().to_client;
            assert_eq!(out.len(), 1);
            let text = String::from_utf8(out[0].bytes().to_vec()).unwrap();
            assert!(text.contains(&format!("\"used\":{used}")), "{text}");
            assert!(text.contains("\"contextTokens\":100"), "{text}");
        }
        // A usage_update that is not an object, a compaction_update without a status.
        h.from_agent(json!({"jsonrpc":"2.0","method":"session/update","params":{"sessionId":S,"update":{"sessionUpdate":"usage_update","_meta":7}}}));
        h.from_agent(update(S, json!({"sessionUpdate":"compaction_update","status":{"x":1}})));
        let out = h.to_client();
        assert_eq!(coda(&out[0]), json!({"contextTokens":100}));
        assert!(h.layer::<Usage>(0).facts(S).unwrap().compacted_at.is_none());
    }

    #[test]
    fn a_lone_surrogate_is_read_as_u_fffd_a_usage_update_gets_its_facts_and_a_tool_update_passes_as_it_came() {
        let mut h = started();
        // A lone surrogate escape: the frame check accepts it, serde_json alone does not.
        let usage = format!(
            r#"{{"jsonrpc":"2.0","method":"session/update","params":{{"sessionId":"{S}","update":{{"sessionUpdate":"usage_update","used":1,"x":"\ud800"}}}}}}"#
        );
        h.agent_frame(Frame::parse(usage.into_bytes()).unwrap());
        let out = h.take().to_client;
        assert_eq!(out.len(), 1);
        let v = out[0].value();
        assert_eq!(v["params"]["update"]["_meta"]["coda"]["contextTokens"], 1, "{v}");
        assert_eq!(v["params"]["update"]["x"], "\u{FFFD}");
        assert!(std::str::from_utf8(out[0].bytes()).unwrap().contains('\u{FFFD}'), "rewritten with U+FFFD");
        let tool = format!(
            r#"{{"jsonrpc":"2.0","method":"session/update","params":{{"sessionId":"{S}","update":{{"sessionUpdate":"tool_call_update","status":"completed","x":"\ud800"}}}}}}"#
        );
        h.agent_frame(Frame::parse(tool.clone().into_bytes()).unwrap());
        assert_eq!(h.take().to_client[0].bytes(), tool.as_bytes());
    }
}

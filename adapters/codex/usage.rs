//! Where Codex's usage facts are (section 用量里的数据; the rules are [`crate::coda::usage`]'s): its
//! `usage_update`s, the times the shim sees its requests start, and its compactions.
//!
//! - `contextTokens`: the update's `used`, Codex's own measure of the context of the response it counts (the
//!   last model response's total tokens: Codex says no request's input apart from it). An update about a
//!   compaction (the summarising request's, Codex's estimate after it) counts no main-thread request and
//!   changes no fact.
//! - `lastRequestAt`: Codex says when a response came, never when its request left. A request of the main
//!   thread starts when the shim forwards Coda's `session/prompt`, when the last open tool call of the session
//!   ends (`tool_call_update` `completed` or `failed`: the results go back to the model), or when a compaction
//!   inside a turn of Coda's completes (Codex goes on at once). A compaction's summarising request is not the
//!   main thread's (the context it carried is gone after it). Codex reports parallel tool calls one after another,
//!   so a later end in the same batch moves that start on. Codex sends one `usage_update` per response, sometimes
//!   after the tools its response asked for have ended: so the starts wait in order, and each update takes the
//!   oldest (an update with none waiting keeps the last). An estimate a little early: docs/codex.md gives the
//!   error measured against the fake model's log.
//! - `compactedAt`: when a compaction of the session completed, asked for or automatic: `compaction_update`
//!   `completed` for a client that declared `session.compaction`, else the end (`completed`) of the "Compact
//!   conversation" tool call (`_meta.jetbrains.air.contextCompaction`). Codex sends its `usage_update`s before
//!   `completed`, so the shim sends one of its own right after it.
//! - `cacheTtl`: Codex does not say it.
//! - At load: Codex keeps every thread in its rollout file (`$CODEX_HOME/sessions/YYYY/MM/DD/rollout-…-<thread>.jsonl`,
//!   the thread being the ACP session): its last `compacted` line's `timestamp` is `compactedAt` ([`history`]).
//!   The file says when responses came, not when requests left: `lastRequestAt` and `contextTokens` come with the
//!   session's next request. With `CODA_CODEX_RECORD` set, what was read of the file is logged for a recording
//!   (a `replace` of it as it was when Coda's load came: `at: "open"`, fixtures/README.md), so that its replay
//!   finds the same file.
//!
//! Times are `cx.wall()` of the frame that tells them.

use crate::{HashMap, HashSet};
use std::collections::VecDeque;
use std::path::{Path, PathBuf};

use crate::inside::{Folder, Kind};
use std::time::SystemTime;

use serde_json::Value;

use crate::coda::usage::{
    Fact, Facts, Figures, LoadJob, Said, Source, UsageFacts, history_lines, per_root, plain_name,
};
use crate::file_log::{Direct, FileLog};
use crate::frame::{Frame, Needle};
use crate::layer::Cx;

/// More waiting request starts than any response count could need: the oldest are dropped.
const STARTS_MAX: usize = 16;

static STATUS: Needle = crate::needle!(b"\"status\"");

/// What the shim follows of one root session's requests.
#[derive(Debug, Default)]
struct Session {
    /// When the requests whose responses have not been counted yet started, oldest first; whether each was
    /// started by a tool's end.
    starts: VecDeque<(SystemTime, bool)>,
    /// Tool calls running (by toolCallId): the next request starts when the last one ends.
    open_tools: HashSet<String>,
    /// Tool calls that are compactions (by toolCallId).
    compaction_tools: HashSet<String>,
    /// A compaction runs: the updates are about it, not about a request of the main thread.
    compacting: bool,
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

    /// A new phase (a turn, a compaction) starts: what waited is no longer owed; `at` starts a request.
    fn restart(&mut self, at: Option<SystemTime>) {
        self.starts.clear();
        self.open_tools.clear();
        if let Some(at) = at {
            self.started(at);
        }
    }
}

/// Where Codex's facts are (see the module's docs).
#[derive(Default)]
pub struct Codex {
    /// Codex's data folder (`$CODEX_HOME`), where a loaded session's rollout file is.
    home: Option<PathBuf>,
    /// `CODA_CODEX_RECORD`: what a load read of a rollout file, for recordings.
    record: Option<FileLog>,
    sessions: HashMap<String, Session>,
}

/// The rollout file of thread `session` under Codex's data folder `home`: `sessions/YYYY/MM/DD/` (or
/// `archived_sessions/`), named `rollout-<time>-<session>.jsonl`, opened inside `home` only ([`crate::inside`]: a
/// link on the way is no folder and no rollout); with its path.
fn rollout(home: &Path, session: &str) -> Option<(PathBuf, std::fs::File)> {
    let suffix = format!("-{session}.jsonl");
    let in_day = |day: &Folder| {
        let entries = day.entries().into_iter();
        let mut rollouts =
            entries.filter(|(n, m)| m.kind == Kind::File && n.starts_with("rollout-") && n.ends_with(&suffix));
        rollouts.find_map(|(name, _)| Some((name.clone(), day.file(&name).ok()?)))
    };
    let folders = |f: &Folder| {
        let names: Vec<String> =
            f.entries().into_iter().filter(|(_, m)| m.kind == Kind::Folder).map(|(n, _)| n).collect();
        let open = |n: String| {
            let folder = f.folder(&n).ok()?;
            Some((n, folder))
        };
        names.into_iter().filter_map(open).collect::<Vec<_>>()
    };
    let home_path = home;
    let home = Folder::open(&std::fs::canonicalize(home).ok()?).ok()?;
    if let Some((name, file)) = home.folder("archived_sessions").ok().and_then(|d| in_day(&d)) {
        return Some((home_path.join("archived_sessions").join(name), file));
    }
    let sessions = home.folder("sessions").ok()?;
    for (year, year_folder) in folders(&sessions) {
        for (month, month_folder) in folders(&year_folder) {
            for (day, day_folder) in folders(&month_folder) {
                if let Some((name, file)) = in_day(&day_folder) {
                    return Some((home_path.join("sessions").join(year).join(month).join(day).join(name), file));
                }
            }
        }
    }
    None
}

/// What thread `session`'s rollout file under `home` keeps of its facts: the time of its last compaction.
pub fn history(home: &Path, session: &str) -> Facts {
    read_history(home, session, None)
}

/// [`history`], and with `record`, what was read of the file logged as it was at Coda's load (the time handed in).
fn read_history(home: &Path, session: &str, record: Option<(Direct, SystemTime)>) -> Facts {
    let Some((path, file)) = rollout(home, session) else { return Facts::default() };
    let lines = history_lines(file);
    if let Some((log, at)) = record {
        log.opened(at, &path, &lines);
    }
    let mut facts = Facts::default();
    for line in lines {
        // Only the compactions' lines are parsed.
        if memchr::memmem::find(&line, b"\"compacted\"").is_none() {
            continue;
        }
        let Ok(record) = crate::json::from_slice::<Value>(&line) else { continue };
        if record.get("type").and_then(Value::as_str) != Some("compacted") {
            continue;
        }
        let at = record.get("timestamp").and_then(Value::as_str).and_then(|t| t.parse::<jiff::Timestamp>().ok());
        if let Some(at) = at {
            facts.compacted_at = Some(SystemTime::from(at));
        }
    }
    facts
}

impl Codex {
    fn root(&mut self, session: &str, cx: &Cx) -> Option<&mut Session> {
        per_root(&mut self.sessions, session, cx, |_| false)
    }
}

impl Source for Codex {
    type Event = std::convert::Infallible;

    fn closed(&mut self, session: &str) {
        self.sessions.remove(session);
    }

    fn kept(&self) -> usize {
        self.sessions.len()
    }

    fn at_load(&self, session: &str, _: &Value, cx: &Cx) -> Option<LoadJob> {
        let record = self.record.as_ref().map(|log| (log.direct(), cx.wall()));
        let (home, session) = (self.home.clone()?, plain_name(session)?.to_owned());
        Some(Box::new(move || read_history(&home, &session, record)))
    }

    /// Coda's prompt on its way to codex-acp: the main thread's request starts now (the shim's own `/compact`
    /// starts a summarising request, no request of the main thread).
    fn from_client(&mut self, frame: &Frame, cx: &mut Cx, _: &mut Said) {
        if !frame.is_request("session/prompt") {
            return;
        }
        let Some(session) = frame.id().and_then(|id| cx.request_of(id)).and_then(|r| r.session()) else { return };
        let (session, wall) = (session.to_owned(), cx.wall());
        if let Some(s) = self.root(&session, cx) {
            s.restart(Some(wall));
            s.compacting = false;
        }
    }

    fn wants(&self, frame: &Frame) -> bool {
        match frame.session_update() {
            Some("compaction_update" | "tool_call") => true,
            // (A `\u` escape may spell the key.)
            Some("tool_call_update") => frame.has(&STATUS) || frame.unicode_escaped(),
            _ => false,
        }
    }

    fn from_agent(&mut self, frame: &Frame, cx: &mut Cx, out: &mut Said) {
        // Read where it lies (a tool call is a quarter of Codex's stream): the session from the frame check's
        // one pass, the update's fields from its members gone over once for the layers that read them.
        let Some(session_id) = frame.session() else { return };
        let session_id: &str = &session_id;
        let kind = frame.session_update().unwrap_or_default();
        let wall = cx.wall();
        let Some(session) = self.root(session_id, cx) else { return };
        let [status, tool, meta] = frame.update_pick(["status", "toolCallId", "_meta"]);
        let [status, tool] = [status, tool].map(|v| v.and_then(|v| v.as_str()));
        let status = status.as_deref();
        let compaction = match kind {
            "compaction_update" => match status {
                Some("in_progress") => Some(Compaction::Started),
                Some("completed") => Some(Compaction::Completed),
                Some("failed") => Some(Compaction::Failed),
                _ => None,
            },
            _ => {
                let id = tool.as_deref().unwrap_or_default();
                let ended = matches!(status, Some("completed" | "failed"));
                // (`_meta` gone over only for a call's start: an update's never starts a compaction.)
                let air_compaction = || meta.and_then(|m| m.pointer(&["jetbrains", "air", "contextCompaction"]));
                if kind == "tool_call" && air_compaction().is_some() {
                    session.compaction_tools.insert(id.to_owned());
                    Some(Compaction::Started)
                } else if ended && session.compaction_tools.remove(id) {
                    Some(if status == Some("completed") { Compaction::Completed } else { Compaction::Failed })
                } else {
                    if ended {
                        // Once no tool runs, the results go back to the model: the next request starts.
                        if session.open_tools.remove(id) && session.open_tools.is_empty() {
                            session.tool_ended(wall);
                        }
                    } else if matches!(status, Some("pending" | "in_progress")) && !session.open_tools.contains(id) {
                        session.open_tools.insert(id.to_owned());
                    }
                    None
                }
            }
        };
        match compaction {
            Some(Compaction::Started) => {
                session.restart(None);
                session.compacting = true;
            }
            Some(Compaction::Completed) => {
                session.compacting = false;
                // Compacted inside a turn of Coda's: Codex goes on with a request on the compacted context.
                let in_turn = cx.open_requests().any(|r| r.is("session/prompt") && r.session() == Some(session_id));
                session.restart(in_turn.then_some(wall));
                out.push((session_id.to_owned(), Fact::Compacted(wall)));
                out.push((session_id.to_owned(), Fact::Send));
            }
            Some(Compaction::Failed) => session.compacting = false,
            None => {}
        }
    }

    /// A turn ended: nothing it started is owed any more.
    fn answered(&mut self, answer: &Frame, cx: &mut Cx, _: &mut Said) {
        let ended = cx.answer_to(answer).filter(|r| r.is("session/prompt")).and_then(|r| r.session());
        if let Some(s) = ended.map(str::to_owned).as_deref().and_then(|s| self.root(s, cx)) {
            s.restart(None);
        }
    }

    fn usage_update(&mut self, session: &str, update: &Figures<'_>, cx: &mut Cx, out: &mut Vec<Fact>) {
        let Some(s) = self.root(session, cx) else { return };
        if s.compacting {
            return;
        }
        if let Some((at, _)) = s.starts.pop_front() {
            out.push(Fact::Request(at));
        }
        if let Some(used) = update.used() {
            out.push(Fact::Context(used));
        }
    }
}

/// coda-codex's usage facts layer.
pub type Usage = UsageFacts<Codex>;

/// The layer over Codex's data folder `home` (`$CODEX_HOME`, read at set-up; None: nothing is read at load),
/// logging what a load read to `record` (`CODA_CODEX_RECORD`).
pub fn layer(home: Option<PathBuf>, record: Option<FileLog>) -> Usage {
    UsageFacts::new(Codex { home, record, sessions: HashMap::default() })
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
        let mut h = Harness::of(layer(None, None));
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

    /// A tool call's end under a key spelled with an escape is read as the parsed frame reads it (fail closed).
    #[test]
    fn a_tool_calls_end_under_an_escaped_key_is_read() {
        let mut h = started();
        advance(&mut h, 100);
        h.from_client(json!({"jsonrpc":"2.0","id":2,"method":"session/prompt","params":{"sessionId":S,"prompt":[]}}));
        h.to_agent();
        advance(&mut h, 60);
        h.from_agent(update(S, json!({"sessionUpdate":"tool_call","toolCallId":"c1","status":"in_progress"})));
        h.from_agent(usage(S, json!(10386)));
        advance(&mut h, 5);
        let end = format!(
            r#"{{"jsonrpc":"2.0","method":"session/update","params":{{"sessionId":"{S}","update":{{"sessionUpdate":"tool_call_update","toolCallId":"c1","st\u0061tus":"completed"}}}}}}"#
        );
        h.agent_frame(Frame::parse(end.into_bytes()).expect("valid"));
        // The call's end starts the next request: the update after it is that request's.
        h.from_agent(usage(S, json!(10471)));
        let out = h.to_client();
        assert_eq!(coda(out.last().expect("the update")), json!({"lastRequestAt":at(165),"contextTokens":10471}));
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
        // The compaction's updates (the summarising request's, Codex's estimate after) are no request of the main
        // thread: the facts stay those of the last one.
        for u in &out[1..4] {
            assert_eq!(coda(u), json!({"lastRequestAt":at(1000),"contextTokens":10471}));
        }
        assert_eq!(out[4]["params"]["update"]["status"], "completed");
        assert_eq!(
            out[5],
            json!({"jsonrpc":"2.0","method":"session/update","params":{"sessionId":S,"update":{
                "sessionUpdate":"usage_update","used":7547,"size":258400,"_meta":{"coda":{
                "lastRequestAt":at(1000),"contextTokens":10471,"compactedAt":at(2058)}}}}})
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
        // The shim's own update names the last request of the main thread, not the summarising one.
        assert_eq!(coda(&own), json!({"lastRequestAt":at(0),"contextTokens":10387,"compactedAt":at(40)}));
        assert_eq!(own["params"]["update"]["used"], 7548, "Codex's own count after the compaction");
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

    /// A rollout file of thread `id` in `home`, compacted once, as Codex 0.166 writes it (its lines' shapes, from
    /// a live run); its path, text and lines.
    fn rollout_file(home: &Path, id: &str) -> (PathBuf, String, [Value; 4]) {
        let day = home.join("sessions/2026/12/04");
        std::fs::create_dir_all(&day).unwrap();
        let lines = [
            json!({"timestamp":"2026-12-04T02:28:58.173Z","type":"session_meta","payload":{"id":id}}),
            json!({"timestamp":"2026-12-04T02:28:58.372Z","type":"event_msg","payload":{"type":"token_count"}}),
            json!({"timestamp":"2026-12-04T02:29:00.020Z","type":"compacted","payload":{"message":"a summary"}}),
            json!({"timestamp":"2026-12-04T02:29:00.068Z","type":"event_msg","payload":{"type":"token_count"}}),
        ];
        let text: String = lines.iter().map(|l| format!("{l}\n")).collect();
        let path = day.join(format!("rollout-2026-12-04T02-28-57-{id}.jsonl"));
        std::fs::write(&path, &text).unwrap();
        (path, text, lines)
    }

    #[test]
    fn a_recording_logs_the_rollout_a_load_read_as_it_was_at_codas_request() {
        let home = tempfile::tempdir().unwrap();
        let id = "01a23ee2-229d-7e22-ad36-a46ef6f094ad";
        let (path, text, _) = rollout_file(home.path(), id);
        let log_path = home.path().join("files.jsonl");
        let log = FileLog::open("CODA_CODEX_RECORD", &log_path).expect("the log");
        let mut h = Harness::of(layer(Some(home.path().to_path_buf()), Some(log)));
        h.hold_work();
        advance(&mut h, 1500);
        let load = |id: u64, session: &str| json!({"jsonrpc":"2.0","id":id,"method":"session/load","params":{"sessionId":session,"cwd":"/w"}});
        h.from_client(load(1, id));
        // The jobs run later: the record carries the time of Coda's request.
        advance(&mut h, 700);
        h.from_client(load(2, "01a23ee2-0000-7e22-ad36-a46ef6f094ad"));
        assert_eq!(h.run_work(), 2);
        drop(h);
        let logged = std::fs::read_to_string(&log_path).unwrap();
        let records: Vec<Value> = logged.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
        assert_eq!(records.len(), 1, "no record for a thread without a rollout: {logged}");
        let ts: jiff::Timestamp = records[0]["ts"].as_str().unwrap().parse().unwrap();
        assert_eq!(SystemTime::from(ts), wall_start() + Duration::from_millis(1500));
        assert_eq!(
            (&records[0]["at"], &records[0]["op"], &records[0]["path"], &records[0]["data"]),
            (&json!("open"), &json!("replace"), &json!(path.to_str().unwrap()), &json!(text))
        );
    }

    #[test]
    fn a_loaded_threads_last_compaction_is_read_from_its_rollout_file() {
        let home = tempfile::tempdir().unwrap();
        let id = "01a23ee2-229d-7e22-ad36-a46ef6f094ad";
        let (_, _, lines) = rollout_file(home.path(), id);
        let day = home.path().join("sessions/2026/12/04");
        let facts = history(home.path(), id);
        assert_eq!(facts.compacted_at.and_then(iso).as_deref(), Some("2026-12-04T02:29:00.020Z"));
        assert_eq!((facts.last_request_at, facts.context_tokens), (None, None), "Codex keeps no request time");
        // Another thread, a name that is a path, a rollout that is a link: nothing.
        assert_eq!(history(home.path(), "01a23ee2-0000"), Facts::default());
        assert_eq!(history(home.path(), "../x"), Facts::default());
        let other = "01a23ee2-1111-7e22-ad36-a46ef6f094ad";
        std::os::unix::fs::symlink(
            day.join(format!("rollout-2026-12-04T02-28-57-{id}.jsonl")),
            day.join(format!("rollout-2026-12-04T02-29-57-{other}.jsonl")),
        )
        .unwrap();
        assert_eq!(history(home.path(), other), Facts::default());
        // A day folder that is a link to a folder outside, and a FIFO named as a rollout (never waited on).
        let outside = tempfile::tempdir().unwrap();
        let third = "01a23ee2-2222-7e22-ad36-a46ef6f094ad";
        std::fs::write(outside.path().join(format!("rollout-2026-12-05T00-00-00-{third}.jsonl")), lines[2].to_string())
            .unwrap();
        std::os::unix::fs::symlink(outside.path(), home.path().join("sessions/2026/12/05")).unwrap();
        assert_eq!(history(home.path(), third), Facts::default());
        let fourth = "01a23ee2-3333-7e22-ad36-a46ef6f094ad";
        let fifo = day.join(format!("rollout-2026-12-04T03-00-00-{fourth}.jsonl"));
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::S_IRUSR | nix::sys::stat::Mode::S_IWUSR).unwrap();
        assert_eq!(history(home.path(), fourth), Facts::default());
    }
}

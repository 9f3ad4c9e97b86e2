//! Codex's automatic approval review as Coda's `_meta.coda.review` on the judged call (section 工具调用的审核).
//!
//! What codex-acp 2.6.0 does in mode `agent` (reviewer `auto_review`), seen live against the fake model
//! (`fixtures/codex/auto-review`): a command that asks to leave the sandbox is reported as its own `tool_call`
//! (`kind: "execute"`, `status: "in_progress"`, `rawInput: {command, cwd}`); right after it, the review is
//! reported to an AIR client (the shim is one) as a second call `guardian_assessment:<reviewId>` (`kind:
//! "think"`, title "Guardian Review", `rawInput: {action: {type: "command", source, command, cwd}}`), then a
//! `tool_call_update` of it, `completed` (approved) or `failed` (denied, aborted, timed out), whose text says
//! `Status: …`, `Risk: …`, `Authorization: …` and `Rationale: …` (the rationale last; lines without a value
//! are left out). A denied command then gets `tool_call_update {status: "failed"}`. Nothing names the judged
//! call: the action's command and cwd are what tie the two together.
//!
//! The rule this layer keeps:
//! - No `guardian_assessment:` call reaches Coda.
//! - Its start is the judged call's `_meta.coda.review {state: "reviewing"}`, its end `approved` or `denied`
//!   (aborted and timed-out reviews are `denied`), with `risk` (only `low`, `medium`, `high`, `critical`) and
//!   `reason` (the rationale, at most [`REASON_MAX`] characters), as a `tool_call_update` of the judged call.
//! - The judged call is the oldest call of the session, reported and not finished, with no review yet, whose
//!   `rawInput` has the action's exact `command` and `cwd`. Two such calls at once are told apart by order
//!   only: codex-acp reports each review's start right after its call (seen live with two identical parallel
//!   calls), so a review is bound when it starts.
//! - A review whose call is not known yet waits for it: the call's own `tool_call` then carries the review (as
//!   `status: "pending"` while the review runs). A review of what no call of its own stands for (network access,
//!   a patch, an MCP call, a subcommand of a running command) is reported nowhere, and a review still waiting
//!   when the turn ends is dropped: both with a warning that quotes nothing.

use crate::HashMap;

use crate::coda::wait::{utf16_len, utf16_prefix};
use std::convert::Infallible;

use serde_json::{Map, Value, json};

use crate::frame::{Frame, Kind, Needle};
use crate::json::{self, View};
use crate::layer::{Cx, Layer};
use std::borrow::Cow;

/// The id codex-acp gives a review's call: this, then the review id.
const REVIEW_CALL: &str = "guardian_assessment:";
static REVIEW_CALL_ID: Needle = crate::needle!(REVIEW_CALL.as_bytes());
/// Longest `reason` Coda takes, in characters.
pub const REASON_MAX: usize = 4000;
/// Calls kept per session as what a review may judge, and reviews kept waiting for their call.
const KEPT: usize = 64;
/// Sessions with calls or reviews kept at most (a session's are dropped when its turn ends; past this, those
/// with nothing waiting first, then the oldest).
const SESSIONS: usize = 256;
const RISKS: [&str; 4] = ["low", "medium", "high", "critical"];
/// The actions codex-acp 2.6.0's reviewer judges; only `command` is a call of its own.
const ACTIONS: [&str; 7] =
    ["command", "execve", "writeStdin", "applyPatch", "networkAccess", "mcpToolCall", "requestPermissions"];

/// A review's verdict so far, as Coda's `_meta.coda.review`.
#[derive(Debug, Clone, PartialEq)]
struct Verdict {
    state: &'static str,
    risk: Option<&'static str>,
    reason: Option<String>,
}

impl Verdict {
    /// `_meta` of a frame that carries the verdict: `{"coda": {"review": …}}` (what [`review_update`] writes).
    #[cfg(test)]
    fn to_value(&self) -> Value {
        json::object([("coda", json::object([("review", self.review())]))])
    }

    /// The verdict as `_meta.coda.review` holds it.
    fn review(&self) -> Value {
        let mut review = Map::new();
        review.insert("state".into(), json!(self.state));
        if let Some(risk) = self.risk {
            review.insert("risk".into(), json!(risk));
        }
        if let Some(reason) = &self.reason {
            review.insert("reason".into(), json!(reason));
        }
        Value::Object(review)
    }

    fn is_final(&self) -> bool {
        self.state != "reviewing"
    }
}

/// A command call a review may judge.
#[derive(Debug)]
struct Call {
    id: String,
    command: String,
    cwd: String,
    reviewed: bool,
}

/// What a review's call id stands for.
#[derive(Debug)]
enum Review {
    /// The call it judges.
    Judges(String),
    /// A command not reported yet: its latest verdict waits for the call.
    Waiting { command: String, cwd: String, verdict: Verdict },
    /// Nothing Coda can be told about (not a command); its frames are dropped.
    Nowhere,
}

#[derive(Debug, Default)]
struct Session {
    /// Reported and not finished, oldest first.
    calls: Vec<Call>,
    /// By the review's call id, oldest first.
    reviews: Vec<(String, Review)>,
}

#[derive(Default)]
pub struct CodexReview {
    sessions: HashMap<String, Session>,
    /// The keys of `sessions`, oldest first.
    order: std::collections::VecDeque<String>,
}

/// `Status:`, `Risk:` and `Rationale:` of a review's text (its update's `content`), and the ACP status of its
/// frame (`acp`), as a verdict. `None` when the frame says nothing of the review's state.
fn verdict_of(content: Option<View<'_>>, acp: Option<&str>, is_start: bool) -> Option<Verdict> {
    let text = content.and_then(review_text);
    let mut status = None;
    let mut risk = None;
    let mut rationale = None;
    if let Some(text) = text.as_deref() {
        let mut at = 0;
        for line in text.split('\n') {
            if line.starts_with("Rationale:") {
                // The last line codex-acp writes: the rationale runs to the end of the text.
                rationale = Some(text[at + "Rationale:".len()..].trim()).filter(|r| !r.is_empty());
                break;
            }
            if let Some(s) = line.strip_prefix("Status:") {
                status = Some(s.trim());
            } else if let Some(r) = line.strip_prefix("Risk:") {
                let r = r.trim();
                risk = RISKS.into_iter().find(|k| *k == r);
                if risk.is_none() {
                    tracing::debug!("a Codex review names a risk Coda does not know; left out");
                }
            }
            at += line.len() + 1;
        }
    }
    let (state, why) = match (status, acp) {
        (Some("Approved"), _) => ("approved", None),
        (Some("Denied"), _) => ("denied", None),
        (Some("Timed out"), _) => ("denied", Some("The automatic review timed out")),
        (Some("Aborted"), _) => ("denied", Some("The automatic review was aborted")),
        (Some("In progress"), _) => ("reviewing", None),
        (_, Some("completed")) => ("approved", None),
        (_, Some("failed")) => ("denied", None),
        (_, Some("in_progress" | "pending")) => ("reviewing", None),
        _ if is_start => ("reviewing", None),
        _ => return None,
    };
    let reason = match (why, rationale) {
        (Some(why), Some(r)) => Some(format!("{why}: {r}")),
        (Some(why), None) => Some(why.to_owned()),
        (None, r) => r.map(str::to_owned),
    };
    Some(Verdict { state, risk, reason: reason.map(capped) })
}

/// What a review's frame says, of its update's members (read once for the layers that read it:
/// [`Frame::update_pick`]).
struct ReviewUpdate<'a> {
    content: Option<View<'a>>,
    status: Option<&'a str>,
    input: Option<View<'a>>,
}

/// The text block of a review's call (its `content`) that holds its verdict (`Status: …`).
fn review_text(content: View<'_>) -> Option<Cow<'_, str>> {
    content.elements().find_map(|block| {
        block.pointer(&["content", "text"]).and_then(|t| t.as_str()).filter(|t| t.starts_with("Status:"))
    })
}

/// `reason` cut to [`REASON_MAX`] characters as Coda counts them (UTF-16 units, JavaScript's `length`), an
/// ellipsis (one unit) last when it was longer.
fn capped(reason: String) -> String {
    if utf16_len(&reason) <= REASON_MAX {
        return reason;
    }
    format!("{}…", utf16_prefix(&reason, REASON_MAX - 1))
}

/// The review of the judged call `call`, as a `tool_call_update` of it: written as bytes, its members in the
/// order serde_json writes them (its `Map` is sorted) and each string escaped by serde_json (no value is built,
/// written and dropped).
fn review_update(session: &str, call: &str, verdict: &Verdict) -> Frame {
    use json::write_str as string;
    let reason = verdict.reason.as_deref();
    let mut out = Vec::with_capacity(192 + session.len() + call.len() + reason.map_or(0, str::len));
    out.extend_from_slice(br#"{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"#);
    string(&mut out, session);
    out.extend_from_slice(br#","update":{"_meta":{"coda":{"review":{"#);
    let members = [("reason", reason), ("risk", verdict.risk), ("state", Some(verdict.state))];
    for (k, (key, text)) in members.into_iter().filter_map(|(key, text)| Some((key, text?))).enumerate() {
        if k > 0 {
            out.push(b',');
        }
        out.push(b'"');
        out.extend_from_slice(key.as_bytes());
        out.extend_from_slice(b"\":");
        string(&mut out, text);
    }
    out.extend_from_slice(br#"}}},"sessionUpdate":"tool_call_update","toolCallId":"#);
    string(&mut out, call);
    out.extend_from_slice(b"}}}");
    Frame::built(out)
}

impl CodexReview {
    pub fn new() -> CodexReview {
        CodexReview::default()
    }

    /// A frame of a review's call (its update's `content`, `status` and `rawInput`): never passed on.
    fn review_frame(&mut self, session: &str, review: &str, is_start: bool, update: ReviewUpdate<'_>, cx: &mut Cx) {
        let ReviewUpdate { content, status, input } = update;
        let known = self.sessions.get(session).is_some_and(|s| s.reviews.iter().any(|(k, _)| k == review));
        if !known && !is_start {
            tracing::warn!("codex-acp updated a review whose start the shim did not see; not reported");
            return;
        }
        let Some(verdict) = verdict_of(content, status, is_start) else { return };
        let Some(s) = self.session(session) else { return };
        if !known {
            let action = input.and_then(|i| i.get("action"));
            let [kind, command, cwd] =
                action.map_or([None, None, None], |a| a.pick(["type", "command", "cwd"]).map(|v| v?.as_str()));
            let command = (kind.as_deref() == Some("command")).then_some((command.as_deref(), cwd.as_deref()));
            let entry = match command {
                Some((Some(command), Some(cwd))) => {
                    match s.calls.iter_mut().find(|c| !c.reviewed && c.command == command && c.cwd == cwd) {
                        Some(call) => {
                            call.reviewed = true;
                            Review::Judges(call.id.clone())
                        }
                        None => Review::Waiting { command: command.into(), cwd: cwd.into(), verdict: verdict.clone() },
                    }
                }
                _ => {
                    // Named only when it is one codex-acp 2.6.0 knows: the log quotes no peer content.
                    let what = kind.as_deref().and_then(|t| ACTIONS.into_iter().find(|a| *a == t));
                    tracing::warn!(
                        "Codex reviewed an action ({}) that has no tool call of its own; its verdict is not \
                         reported",
                        what.unwrap_or("of an unknown type")
                    );
                    Review::Nowhere
                }
            };
            if s.reviews.len() >= KEPT {
                tracing::warn!("more than {KEPT} Codex reviews open in one session; the oldest is forgotten");
                s.reviews.remove(0);
            }
            s.reviews.push((review.to_owned(), entry));
        }
        let final_ = verdict.is_final();
        let at = s.reviews.iter().position(|(k, _)| k == review);
        match at.map(|at| &mut s.reviews[at].1) {
            Some(Review::Judges(call)) => cx.to_client(review_update(session, call, &verdict)),
            Some(Review::Waiting { verdict: latest, .. }) => {
                *latest = verdict;
                // Kept until its call comes (or the turn ends), even when final.
                return;
            }
            _ => {}
        }
        if let (true, Some(at)) = (final_, at) {
            s.reviews.remove(at);
        }
    }

    /// A tool call that is not a review's: remembered as what a review may judge; one a review waits for
    /// carries that review.
    /// A call started: `id`, `command` and `cwd` are its `toolCallId`, `rawInput.command` and `rawInput.cwd`.
    /// A command's call started: kept, and the frame with the verdict of a review that waited for it (`None`:
    /// the frame goes on as it is).
    fn call_started(&mut self, session: &str, call: [Option<Cow<'_, str>>; 3], frame: &Frame) -> Option<Frame> {
        let [Some(id), Some(command), Some(cwd)] = call else { return None };
        let s = self.session(session)?;
        let waiting = s
            .reviews
            .iter()
            .position(|(_, r)| matches!(r, Review::Waiting { command: c, cwd: d, .. } if *c == command && *d == cwd));
        if s.calls.len() >= KEPT {
            s.calls.remove(0);
        }
        let reviewed = waiting.is_some();
        s.calls.push(Call { id: id.clone().into_owned(), command: command.into(), cwd: cwd.into(), reviewed });
        let (review, Review::Waiting { verdict, .. }) = s.reviews.remove(waiting?) else { return None };
        if !verdict.is_final() {
            s.reviews.push((review, Review::Judges(id.into_owned())));
        }
        let mut v = frame.to_value();
        if let Some(u) = v.pointer_mut("/params/update").and_then(Value::as_object_mut) {
            if !verdict.is_final() {
                u.insert("status".into(), json!("pending"));
            }
            json::object_at(json::object_at(u, "_meta"), "coda").insert("review".into(), verdict.review());
        }
        Some(frame.rewritten(v))
    }

    /// A finished call can no longer be judged.
    /// `status` and `id` are a `tool_call_update`'s `status` and `toolCallId`.
    fn call_updated(&mut self, session: &str, status: Option<&str>, id: Option<&str>) {
        let finished = matches!(status, Some("completed" | "failed"));
        if let (true, Some(id), Some(s)) = (finished, id, self.sessions.get_mut(session)) {
            s.calls.retain(|c| c.id != id);
        }
    }

    fn session_update(&mut self, frame: Frame, cx: &mut Cx) {
        let is_start = frame.session_update() == Some("tool_call");
        let session = frame.session().unwrap_or_default();
        // An update of no review's matters only to a session with calls kept (it may finish one).
        // (A `\u` escape may spell a review's id.)
        let no_review = !frame.has(&REVIEW_CALL_ID) && !frame.unicode_escaped();
        if !is_start && self.sessions.get(&*session).is_none_or(|s| s.calls.is_empty()) && no_review {
            return cx.to_client(frame);
        }
        // What is kept of a call, and a review's verdict, read where they lie.
        // (The update's members gone over once with the usage layer's look at the same call.)
        // (A review's `content` too: its verdict.)
        let [id, status, input, content] = frame.update_pick(["toolCallId", "status", "rawInput", "content"]);
        let [id, status] = [id, status].map(|v| v.and_then(|v| v.as_str()));
        if let Some(review) = id.as_deref().filter(|id| id.starts_with(REVIEW_CALL)) {
            let update = ReviewUpdate { content, status: status.as_deref(), input };
            return self.review_frame(&session, review, is_start, update, cx);
        }
        if is_start {
            let [command, cwd] = input.map_or([None; 2], |i| i.pick(["command", "cwd"])).map(|v| v?.as_str());
            let verdict = self.call_started(&session, [id, command, cwd], &frame);
            return cx.to_client(verdict.unwrap_or(frame));
        }
        self.call_updated(&session, status.as_deref(), id.as_deref());
        cx.to_client(frame)
    }

    /// What is kept of `session`'s calls and reviews (made empty when new; see [`SESSIONS`]). Always some: an
    /// `Option` as `HashMap::get_mut` gives it, looked up before a key is made (a session's calls are kept
    /// across many frames, and `entry` takes an owned key).
    fn session(&mut self, session: &str) -> Option<&mut Session> {
        if !self.sessions.contains_key(session) {
            if self.sessions.len() >= SESSIONS {
                let idle = |k: &String| self.sessions.get(k).is_none_or(|s| s.calls.is_empty() && s.reviews.is_empty());
                let at = self.order.iter().position(idle).unwrap_or(0);
                if let Some(old) = self.order.remove(at) {
                    self.sessions.remove(&old);
                }
            }
            self.order.push_back(session.to_owned());
            self.sessions.insert(session.to_owned(), Session::default());
        }
        self.sessions.get_mut(session)
    }

    /// The turn of `session` ended: reviews still waiting for their call will not get one.
    fn turn_ended(&mut self, session: &str) {
        self.order.retain(|s| s != session);
        let Some(s) = self.sessions.remove(session) else { return };
        let waiting = s.reviews.iter().filter(|(_, r)| matches!(r, Review::Waiting { .. })).count();
        if waiting > 0 {
            tracing::warn!("{waiting} Codex review(s) of a command never reported as a tool call; not reported");
        }
    }
}

impl Layer for CodexReview {
    type Timer = Infallible;
    type Event = Infallible;
    type Reply = Infallible;

    /// A closed session's reviews go with it (as at its turn's end).
    fn session_closed(&mut self, closed: &[String], _cx: &mut Cx) {
        for session in closed {
            self.turn_ended(session);
        }
    }

    fn kept(&self) -> usize {
        self.sessions.len() + self.order.len()
    }

    fn from_agent(&mut self, frame: Frame, cx: &mut Cx) {
        match frame.kind() {
            Kind::Notification { method } if method == "session/update" => match frame.session_update() {
                Some("tool_call" | "tool_call_update") => self.session_update(frame, cx),
                _ => cx.to_client(frame),
            },
            Kind::Response { .. } => {
                if let Some(r) = cx.answer_to(&frame)
                    && r.is("session/prompt")
                    && let Some(session) = r.session()
                {
                    let session = session.to_owned();
                    self.turn_ended(&session);
                }
                cx.to_client(frame)
            }
            _ => cx.to_client(frame),
        }
    }

    fn passes_from_agent(&self, frame: &Frame) -> bool {
        match frame.kind() {
            Kind::Notification { method } if method == "session/update" => {
                !matches!(frame.session_update(), Some("tool_call" | "tool_call_update"))
            }
            Kind::Response { .. } => false,
            _ => true,
        }
    }

    fn chunks_pass_by_session(&self) -> bool {
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layer::testing::Harness;

    const CWD: &str = "/w";

    fn update(update: Value) -> Value {
        json!({"jsonrpc": "2.0", "method": "session/update", "params": {"sessionId": "s1", "update": update}})
    }

    /// codex-acp's report of command call `id` running `command`.
    fn command_call(id: &str, command: &str) -> Value {
        update(json!({"sessionUpdate": "tool_call", "toolCallId": id, "kind": "execute", "title": command,
            "status": "in_progress", "rawInput": {"command": command, "cwd": CWD}}))
    }

    /// The start of review `review` of `action`, as codex-acp reports it to an AIR client.
    fn review_start(review: &str, action: Value) -> Value {
        update(json!({"sessionUpdate": "tool_call", "toolCallId": format!("{REVIEW_CALL}{review}"), "kind": "think",
            "title": "Guardian Review", "status": "in_progress", "rawInput": {"action": action},
            "content": [{"type": "content", "content": {"type": "text", "text": "Action: exec x"}},
                {"type": "content", "content": {"type": "text", "text": "Status: In progress"}}]}))
    }

    fn command_action(command: &str) -> Value {
        json!({"type": "command", "source": "unifiedExec", "command": command, "cwd": CWD})
    }

    /// The end of review `review`, with `status` and its verdict text.
    fn review_end(review: &str, status: &str, text: &str) -> Value {
        update(json!({"sessionUpdate": "tool_call_update", "toolCallId": format!("{REVIEW_CALL}{review}"),
            "status": status, "content": [{"type": "content", "content": {"type": "text", "text": "Action: exec x"}},
                {"type": "content", "content": {"type": "text", "text": text}}]}))
    }

    /// The review Coda gets on call `id`.
    fn on_call(id: &str, review: Value) -> Value {
        update(json!({"sessionUpdate": "tool_call_update", "toolCallId": id, "_meta": {"coda": {"review": review}}}))
    }

    fn harness() -> Harness {
        Harness::of(CodexReview::new())
    }

    /// The order seen live: the call, its review's start, the verdict, the call's end.
    #[test]
    fn a_review_update_is_the_line_serde_json_writes_of_its_value_whatever_its_texts() {
        let hostile = [
            "plain".to_owned(),
            "a \"quoted\" \\ path C:\\tmp\\x / </script>".to_owned(),
            (0u8..0x20).map(char::from).chain(['\u{7f}', '\u{2028}']).collect(),
            "你是 Coda 的助手。\n\n- 不要删除文件 🚫\r\n\t".to_owned(),
            String::new(),
        ];
        for text in &hostile {
            for (state, risk, reason) in [
                ("reviewing", None, None),
                ("approved", Some("low"), None),
                ("denied", Some("critical"), Some(text.clone())),
                ("denied", None, Some(text.clone())),
            ] {
                let verdict = Verdict { state, risk, reason };
                let (session, call) = (format!("s{text}"), format!("call_{text}"));
                // What the frame was built as before: a value, serialised by serde_json.
                let update = json::object([
                    ("sessionUpdate", "tool_call_update".into()),
                    ("toolCallId", call.as_str().into()),
                    ("_meta", verdict.to_value()),
                ]);
                let params = json::object([("sessionId", session.as_str().into()), ("update", update)]);
                let want = crate::frame::notification("session/update", params);
                let got = review_update(&session, &call, &verdict);
                assert_eq!(String::from_utf8_lossy(got.bytes()), String::from_utf8_lossy(want.bytes()), "{verdict:?}");
                assert_eq!(
                    (got.session().as_deref(), got.session_update()),
                    (Some(session.as_str()), Some("tool_call_update"))
                );
            }
        }
    }

    #[test]
    fn a_denied_and_an_approved_command_carry_their_verdicts() {
        let mut h = harness();
        let call = command_call("call_2", "rm -rf ../x");
        h.from_agent(call.clone());
        h.from_agent(review_start("r1", command_action("rm -rf ../x")));
        h.from_agent(review_end(
            "r1",
            "failed",
            "Status: Denied\nRisk: high\nAuthorization: low\nRationale: Deletes x",
        ));
        let end = update(json!({"sessionUpdate": "tool_call_update", "toolCallId": "call_2", "status": "failed"}));
        h.from_agent(end.clone());
        assert_eq!(
            h.to_client(),
            [
                call,
                on_call("call_2", json!({"state": "reviewing"})),
                on_call("call_2", json!({"state": "denied", "risk": "high", "reason": "Deletes x"})),
                end
            ]
        );
        h.from_agent(command_call("call_3", "touch y"));
        h.from_agent(review_start("r2", command_action("touch y")));
        h.from_agent(review_end("r2", "completed", "Status: Approved\nRisk: low\nRationale: Asked for.\nTwo lines."));
        let got = h.to_client();
        assert_eq!(
            got[2],
            on_call("call_3", json!({"state": "approved", "risk": "low", "reason": "Asked for.\nTwo lines."}))
        );
        assert!(h.to_agent().is_empty());
    }

    #[test]
    fn a_reason_over_4000_characters_is_cut_to_4000() {
        let mut h = harness();
        h.from_agent(command_call("c", "ls"));
        h.from_agent(review_start("r", command_action("ls")));
        h.to_client();
        let long = "审".repeat(REASON_MAX + 10);
        h.from_agent(review_end("r", "failed", &format!("Status: Denied\nRationale: {long}")));
        let got = h.to_client();
        let reason = got[0]["params"]["update"]["_meta"]["coda"]["review"]["reason"].as_str().expect("a reason");
        assert_eq!(reason.chars().count(), REASON_MAX);
        assert!(reason.ends_with('…') && reason.starts_with("审审"));
        // Exactly 4000 is kept whole.
        let exact = "a".repeat(REASON_MAX);
        assert_eq!(capped(exact.clone()), exact);
        // Coda counts UTF-16 units: an emoji is two, so 2000 of them are the limit and one more is over it.
        let emoji = "🙂".repeat(REASON_MAX / 2);
        assert_eq!(capped(emoji.clone()), emoji);
        let over = capped(format!("{emoji}🙂"));
        assert_eq!(utf16_len(&over), REASON_MAX - 1, "never half a pair, the ellipsis last");
        assert!(over.ends_with('…'));
    }

    #[test]
    fn the_sessions_kept_are_bounded() {
        let mut h = harness();
        for n in 0..SESSIONS + 10 {
            let session = format!("s{n}");
            let call = json!({"jsonrpc":"2.0","method":"session/update","params":{"sessionId":session,"update":{
                "sessionUpdate":"tool_call","toolCallId":"c","kind":"execute","status":"in_progress","title":"ls",
                "rawInput":{"command":"ls","cwd":"/w"}}}});
            h.from_agent(call);
        }
        h.to_client();
        let layer = h.layer::<CodexReview>(0);
        assert_eq!((layer.sessions.len(), layer.order.len()), (SESSIONS, SESSIONS));
        assert!(layer.sessions.contains_key(&format!("s{}", SESSIONS + 9)) && !layer.sessions.contains_key("s0"));
    }

    #[test]
    fn missing_lines_and_an_unknown_risk_leave_those_fields_out() {
        let mut h = harness();
        h.from_agent(command_call("c", "ls"));
        h.from_agent(review_start("r", command_action("ls")));
        h.to_client();
        // Only codex-acp's own status says how it ended; the risk is not one Coda knows.
        h.from_agent(review_end("r", "failed", "Status: Something new\nRisk: severe\nRationale:   "));
        assert_eq!(h.to_client(), [on_call("c", json!({"state": "denied"}))]);
        // No text at all.
        h.from_agent(command_call("d", "ls"));
        h.from_agent(review_start("q", command_action("ls")));
        h.from_agent(update(json!({"sessionUpdate": "tool_call_update", "toolCallId": "guardian_assessment:q",
            "status": "completed", "content": "not blocks"})));
        let got = h.to_client();
        assert_eq!(got[2], on_call("d", json!({"state": "approved"})));
        // An update that says nothing of the state changes nothing, and is not passed on.
        h.from_agent(command_call("e", "ls"));
        h.from_agent(review_start("p", command_action("ls")));
        h.to_client();
        h.from_agent(update(json!({"sessionUpdate": "tool_call_update", "toolCallId": "guardian_assessment:p"})));
        assert!(h.to_client().is_empty());
    }

    #[test]
    fn timed_out_and_aborted_reviews_are_denied() {
        let mut h = harness();
        for (n, (text, reason)) in [
            ("Status: Timed out", "The automatic review timed out"),
            ("Status: Aborted\nRationale: cancelled", "The automatic review was aborted: cancelled"),
        ]
        .into_iter()
        .enumerate()
        {
            let (call, review) = (format!("c{n}"), format!("r{n}"));
            h.from_agent(command_call(&call, "make"));
            h.from_agent(review_start(&review, command_action("make")));
            h.from_agent(review_end(&review, "failed", text));
            let got = h.to_client();
            assert_eq!(got[2], on_call(&call, json!({"state": "denied", "reason": reason})), "{text}");
        }
    }

    #[test]
    fn frames_with_a_lone_surrogate_are_read_a_reviews_kept_back_and_others_pass_byte_for_byte() {
        let mut h = harness();
        // A lone surrogate: accepted by the frame check, read as U+FFFD.
        let bad_review = br#"{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s1","update":{"sessionUpdate":"tool_call","toolCallId":"guardian_assessment:r","title":"\ud800"}}}"#;
        h.agent_frame(Frame::parse(bad_review.to_vec()).expect("a frame"));
        assert!(h.to_client().is_empty(), "a review's frame is never passed on");
        let bad_call = br#"{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s1","update":{"sessionUpdate":"tool_call","toolCallId":"c","title":"\ud800"}}}"#;
        h.agent_frame(Frame::parse(bad_call.to_vec()).expect("a frame"));
        let got = h.take().to_client;
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].bytes(), bad_call);
        // Other updates pass untouched, byte for byte (numbers keep their spelling).
        let chunk = br#"{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s1","update":{"sessionUpdate":"agent_message_chunk","n":1e400}}}"#;
        h.agent_frame(Frame::parse(chunk.to_vec()).expect("a frame"));
        assert_eq!(h.take().to_client[0].bytes(), chunk);
    }

    #[test]
    fn a_review_whose_call_never_came_is_reported_nowhere() {
        let mut h = harness();
        h.from_client(json!({"jsonrpc": "2.0", "id": 3, "method": "session/prompt",
            "params": {"sessionId": "s1", "prompt": []}}));
        h.to_agent();
        h.from_agent(review_start("r", command_action("ls")));
        h.from_agent(review_end("r", "failed", "Status: Denied\nRationale: no"));
        assert!(h.to_client().is_empty());
        let answer = json!({"jsonrpc": "2.0", "id": 3, "result": {"stopReason": "end_turn"}});
        h.from_agent(answer.clone());
        assert_eq!(h.to_client(), [answer]);
        // The turn is over: a later call of the same command is not taken for the reviewed one.
        let call = command_call("late", "ls");
        h.from_agent(call.clone());
        assert_eq!(h.to_client(), [call]);
    }

    #[test]
    fn a_review_before_its_call_is_on_the_calls_own_report() {
        let mut h = harness();
        h.from_agent(review_start("r", command_action("ls")));
        assert!(h.to_client().is_empty());
        let call = br#"{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s1","update":{"sessionUpdate":"tool_call","toolCallId":"c","kind":"execute","status":"in_progress","rawInput":{"command":"ls","cwd":"/w","n":1e400}}}}"#;
        h.agent_frame(Frame::parse(call.to_vec()).expect("a frame"));
        let got = h.take().to_client;
        let text = String::from_utf8(got[0].bytes().to_vec()).expect("utf-8");
        assert!(text.contains("1e400"), "{text}");
        let v = got[0].value();
        assert_eq!(v["params"]["update"]["status"], "pending");
        assert_eq!(v["params"]["update"]["_meta"]["coda"]["review"], json!({"state": "reviewing"}));
        h.from_agent(review_end("r", "completed", "Status: Approved"));
        assert_eq!(h.to_client(), [on_call("c", json!({"state": "approved"}))]);
        // A review that ended before its call came: the call carries the verdict, its status as it was.
        h.from_agent(review_start("q", command_action("pwd")));
        h.from_agent(review_end("q", "failed", "Status: Denied\nRisk: critical"));
        h.from_agent(command_call("d", "pwd"));
        let got = h.to_client();
        assert_eq!(got.len(), 1);
        assert_eq!(got[0]["params"]["update"]["status"], "in_progress");
        assert_eq!(
            got[0]["params"]["update"]["_meta"]["coda"]["review"],
            json!({"state": "denied", "risk": "critical"})
        );
    }

    #[test]
    fn two_identical_commands_are_judged_in_the_order_they_were_reported() {
        let mut h = harness();
        h.from_agent(command_call("a", "make"));
        h.from_agent(command_call("b", "make"));
        h.from_agent(review_start("r1", command_action("make")));
        h.from_agent(review_start("r2", command_action("make")));
        h.from_agent(review_end("r2", "completed", "Status: Approved"));
        h.from_agent(review_end("r1", "failed", "Status: Denied"));
        let got = h.to_client();
        assert_eq!(
            got[2..],
            [
                on_call("a", json!({"state": "reviewing"})),
                on_call("b", json!({"state": "reviewing"})),
                on_call("b", json!({"state": "approved"})),
                on_call("a", json!({"state": "denied"})),
            ]
        );
        // A finished call is judged no more; another cwd is another command.
        h.from_agent(update(json!({"sessionUpdate": "tool_call_update", "toolCallId": "a", "status": "failed"})));
        h.from_agent(command_call("c", "make"));
        let mut elsewhere = command_action("make");
        elsewhere["cwd"] = json!("/other");
        h.from_agent(review_start("r3", elsewhere));
        h.from_agent(review_start("r4", command_action("make")));
        let got = h.to_client();
        assert_eq!(got[2..], [on_call("c", json!({"state": "reviewing"}))]);
    }

    /// A call's end is read as a reader reads it: an id written with an escape ends the call it names.
    #[test]
    fn a_call_ended_under_an_escaped_id_is_judged_no_more() {
        let mut h = harness();
        h.from_agent(command_call("zq", "make"));
        let end = r#"{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s1","update":{"sessionUpdate":"tool_call_update","toolCallId":"z\u0071","status":"completed"}}}"#;
        h.agent_frame(Frame::parse(end.as_bytes().to_vec()).expect("a frame"));
        h.from_agent(command_call("cb", "make"));
        h.from_agent(review_start("r", command_action("make")));
        let got = h.to_client();
        assert_eq!(got.last(), Some(&on_call("cb", json!({"state": "reviewing"}))), "{got:?}");
    }

    /// An update of a review whose id is spelled with an escape is a review's: it reaches no one.
    #[test]
    fn a_reviews_update_under_an_escaped_id_reaches_no_one() {
        let mut h = harness();
        let end = r#"{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s1","update":{"sessionUpdate":"tool_call_update","toolCallId":"guardian\u005fassessment:r","status":"completed"}}}"#;
        h.agent_frame(Frame::parse(end.as_bytes().to_vec()).expect("a frame"));
        assert!(h.take().to_client.is_empty());
    }

    #[test]
    fn a_review_of_what_has_no_call_reaches_no_one() {
        let mut h = harness();
        h.from_agent(command_call("c", "curl example.com"));
        h.to_client();
        let network = json!({"type": "networkAccess", "target": "https://example.com", "host": "example.com",
            "protocol": "https", "port": 443});
        h.from_agent(review_start("n", network));
        h.from_agent(review_end("n", "failed", "Status: Denied\nRisk: medium\nRationale: exfiltration"));
        h.from_agent(review_start("m", json!({"type": "execve", "source": "shell", "program": "/bin/ls", "argv": []})));
        h.from_agent(review_start("o", Value::Null));
        assert!(h.to_client().is_empty());
        // An update of a review whose start never came is not passed on either.
        h.from_agent(review_end("unknown", "completed", "Status: Approved"));
        assert!(h.to_client().is_empty());
    }

    #[test]
    fn a_session_keeps_a_bounded_number_of_calls_and_reviews() {
        let mut h = harness();
        for n in 0..(KEPT * 3) {
            h.from_agent(command_call(&format!("c{n}"), "same"));
            h.from_agent(review_start(&format!("w{n}"), command_action(&format!("never {n}"))));
        }
        h.to_client();
        let layer = h.layer::<CodexReview>(0);
        let s = layer.sessions.get("s1").expect("the session");
        assert!(s.calls.len() <= KEPT && s.reviews.len() <= KEPT, "{} {}", s.calls.len(), s.reviews.len());
    }

    /// Thousands of frames in a fixed pseudo-random order (calls, reviews of them and of other actions, ends,
    /// turn ends, odd shapes): no review's frame reaches Coda, every other frame reaches it byte for byte, and
    /// what the layer adds is a `tool_call_update` with a readable review.
    #[test]
    fn any_order_of_calls_and_reviews_keeps_the_rules() {
        let mut h = harness();
        h.from_client(json!({"jsonrpc": "2.0", "id": 1, "method": "session/prompt",
            "params": {"sessionId": "s1", "prompt": []}}));
        h.to_agent();
        let mut seed: u64 = 0x2545_f491_4f6c_dd1d;
        let mut next = |n: u64| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed % n
        };
        let commands = ["ls", "make", "rm -rf /"];
        let statuses = ["completed", "failed", "in_progress", "pending", "odd"];
        let texts = ["Status: Approved\nRisk: low", "Status: Denied\nRationale: x", "Status: Timed out", "Risk: 3", ""];
        for _ in 0..5000 {
            let command = commands[next(3) as usize];
            let (n, r) = (next(6), format!("r{}", next(8)));
            let sent = match next(8) {
                0 | 1 => command_call(&format!("c{n}"), command),
                2 => review_start(&r, command_action(command)),
                3 => review_start(&r, json!({"type": "networkAccess", "host": 1e300})),
                4 => review_end(&r, statuses[next(5) as usize], texts[next(5) as usize]),
                5 => update(json!({"sessionUpdate": "tool_call_update", "toolCallId": format!("c{n}"),
                    "status": statuses[next(5) as usize]})),
                6 => update(json!({"sessionUpdate": "tool_call", "toolCallId": format!("{REVIEW_CALL}{r}"),
                    "rawInput": [1, {"action": null}], "content": {"content": 7}})),
                _ => json!({"jsonrpc": "2.0", "id": 1, "result": {"stopReason": "end_turn"}}),
            };
            let of_review = sent.to_string().contains(REVIEW_CALL);
            h.from_agent(sent.clone());
            if sent.get("id").is_some() {
                // The turn's answer: Coda's next prompt (a request with the id of one still open is refused).
                h.from_client(json!({"jsonrpc": "2.0", "id": 1, "method": "session/prompt",
                    "params": {"sessionId": "s1", "prompt": []}}));
                h.to_agent();
            }
            let mut passed = false;
            for got in h.to_client() {
                assert!(!got.to_string().contains(REVIEW_CALL), "{got}");
                if got == sent {
                    passed = true;
                    continue;
                }
                let update = &got["params"]["update"];
                let review = update.pointer("/_meta/coda/review").unwrap_or_else(|| panic!("{got}"));
                assert!(["reviewing", "approved", "denied"].contains(&review["state"].as_str().unwrap_or("")), "{got}");
                if update["sessionUpdate"] == "tool_call" {
                    passed = true;
                }
            }
            assert_eq!(passed, !of_review, "{sent}");
        }
    }
}

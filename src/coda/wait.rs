//! Coda's activity reports (`_coda/wait`, section "Agent 活动"): capability negotiation, field limits,
//! and a register that sends each report with only what changed and never reopens a finished wait.

use crate::HashMap;

use serde_json::{Value, json};

use crate::frame::Frame;
use crate::layer::Cx;

pub const METHOD: &str = "_coda/wait";
pub const STOP_METHOD: &str = "_coda/wait/stop";
/// Limits from the `_coda/wait` field table, in characters as Coda counts them: JavaScript's `length`, UTF-16
/// code units ([`utf16_len`]; an emoji outside the Basic Multilingual Plane is two).
pub const MAX_WAIT_ID: usize = 200;
pub const MAX_TITLE: usize = 500;
pub const MAX_DETAIL: usize = 4000;

/// `state` of a wait.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum State {
    Waiting,
    Handling,
    Done,
    Failed,
    Cancelled,
}

impl State {
    pub fn as_str(self) -> &'static str {
        match self {
            State::Waiting => "waiting",
            State::Handling => "handling",
            State::Done => "done",
            State::Failed => "failed",
            State::Cancelled => "cancelled",
        }
    }

    /// `done`, `failed` and `cancelled` are final.
    pub fn is_terminal(self) -> bool {
        matches!(self, State::Done | State::Failed | State::Cancelled)
    }
}

/// One report. `None` fields are "not said"; the register leaves out fields that did not change.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Wait {
    pub session_id: String,
    pub wait_id: String,
    pub state: Option<State>,
    pub kind: Option<String>,
    pub title: Option<String>,
    pub detail: Option<String>,
    pub stoppable: Option<bool>,
    pub child_session_id: Option<String>,
    pub model: Option<String>,
    pub output_file: Option<String>,
    pub tool_call_id: Option<String>,
}

impl Wait {
    pub fn new(session_id: &str, wait_id: &str, state: State) -> Wait {
        Wait { session_id: session_id.into(), wait_id: wait_id.into(), state: Some(state), ..Wait::default() }
    }

    /// The optional text fields, in [`TEXTS`]' order, after applying the limits.
    fn texts(&self) -> [Option<&str>; TEXTS.len()] {
        fn limited(v: &Option<String>, max: usize) -> Option<&str> {
            v.as_deref().map(|v| utf16_prefix(v, max))
        }
        [
            self.kind.as_deref(),
            limited(&self.title, MAX_TITLE),
            limited(&self.detail, MAX_DETAIL),
            self.child_session_id.as_deref(),
            self.model.as_deref(),
            self.output_file.as_deref(),
            self.tool_call_id.as_deref(),
        ]
    }
}

/// The names of the optional text fields of a report ([`Wait::texts`]).
const TEXTS: [&str; 7] = ["kind", "title", "detail", "childSessionId", "model", "outputFile", "toolCallId"];

/// A member of a report's `params` ([`line`]).
#[derive(Clone, Copy)]
enum Member {
    /// The text field at this place of [`TEXTS`].
    Text(usize),
    Session,
    WaitId,
    State,
    Stoppable,
}

/// Every member a report's `params` may have, by key in byte order: the order serde_json writes an object's
/// members in (its `Map` is sorted), so that a report reads the same whether written here or by serde_json.
const MEMBERS: [(&str, Member); TEXTS.len() + 4] = [
    ("childSessionId", Member::Text(3)),
    ("detail", Member::Text(2)),
    ("kind", Member::Text(0)),
    ("model", Member::Text(4)),
    ("outputFile", Member::Text(5)),
    ("sessionId", Member::Session),
    ("state", Member::State),
    ("stoppable", Member::Stoppable),
    ("title", Member::Text(1)),
    ("toolCallId", Member::Text(6)),
    ("waitId", Member::WaitId),
];

/// The line of a `_coda/wait` notification of `wait` with `state`, the text fields `texts` (in [`TEXTS`]'
/// order; `None`: not said) and `stoppable`: written as bytes, each string escaped by serde_json (no value is
/// built, written and dropped).
fn line(wait: &Wait, state: State, texts: [Option<&str>; TEXTS.len()], stoppable: Option<bool>) -> Vec<u8> {
    let size: usize = texts.iter().flatten().map(|t| t.len() + 24).sum();
    let mut out = Vec::with_capacity(128 + wait.session_id.len() + wait.wait_id.len() + size);
    out.extend_from_slice(br#"{"jsonrpc":"2.0","method":"_coda/wait","params":{"#);
    let mut first = true;
    for (key, member) in MEMBERS {
        let text = match member {
            Member::Text(k) => texts[k],
            Member::Session => Some(wait.session_id.as_str()),
            Member::WaitId => Some(wait.wait_id.as_str()),
            Member::State => Some(state.as_str()),
            Member::Stoppable => None,
        };
        let flag = stoppable.filter(|_| matches!(member, Member::Stoppable));
        if text.is_none() && flag.is_none() {
            continue;
        }
        if !first {
            out.push(b',');
        }
        first = false;
        out.push(b'"');
        out.extend_from_slice(key.as_bytes());
        out.extend_from_slice(b"\":");
        match (text, flag) {
            // (A string always serialises: serde_json writes into a Vec without an error.)
            (Some(text), _) => crate::json::write_str(&mut out, text),
            (None, Some(flag)) => out.extend_from_slice(if flag { b"true" } else { b"false" }),
            (None, None) => {}
        }
    }
    out.extend_from_slice(b"}}");
    out
}

/// The longest prefix of `s` with at most `max` characters (never splits a character).
pub fn truncate_chars(s: &str, max: usize) -> &str {
    match s.char_indices().nth(max) {
        Some((at, _)) => &s[..at],
        None => s,
    }
}

/// The length of `s` as JavaScript counts it (`s.length`): UTF-16 code units.
pub fn utf16_len(s: &str) -> usize {
    s.chars().map(char::len_utf16).sum()
}

/// The longest prefix of `s` of at most `units` UTF-16 code units (never splits a character: where JavaScript
/// would cut a surrogate pair in two, it ends before the pair).
pub fn utf16_prefix(s: &str, units: usize) -> &str {
    let mut used = 0;
    for (at, c) in s.char_indices() {
        used += c.len_utf16();
        if used > units {
            return &s[..at];
        }
    }
    s
}

/// Whether `initialize` params declare `clientCapabilities._meta.coda.waits`.
pub fn client_declares_waits(initialize_params: &Value) -> bool {
    initialize_params.pointer("/clientCapabilities/_meta/coda/waits").is_some_and(|w| !w.is_null())
}

/// Adds `agentCapabilities._meta.coda.waits: {}` to an `initialize` result, keeping everything else.
/// Sends the client the agent's `initialize` answer with `agentCapabilities._meta.coda.waits: {}`
/// declared; the frame as it came when it is not an answer with a result.
pub fn declare_waits_in(answer: Frame, cx: &mut Cx) {
    let mut v = answer.to_value();
    let Some(result) = v.get_mut("result") else { return cx.to_client(answer) };
    declare_waits(result);
    cx.to_client(answer.rewritten(v))
}

pub fn declare_waits(result: &mut Value) {
    let Some(result) = result.as_object_mut() else { return };
    let caps = result.entry("agentCapabilities").or_insert_with(|| json!({}));
    let Some(caps) = caps.as_object_mut() else { return };
    let meta = caps.entry("_meta").or_insert_with(|| json!({}));
    let Some(meta) = meta.as_object_mut() else { return };
    let coda = meta.entry("coda").or_insert_with(|| json!({}));
    if let Some(coda) = coda.as_object_mut() {
        coda.insert("waits".into(), json!({}));
    }
}

/// The note ([`crate::layer::Cx::note`]) a layer below [`crate::coda::waits::Waits`] leaves on the client's
/// `initialize` request when its CLI reports no activity, so that `Waits` does not declare waits in the answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WithholdWaits;

#[derive(Default)]
struct Known {
    /// The text fields last said, in [`TEXTS`]' order.
    texts: [Option<Box<str>>; TEXTS.len()],
    stoppable: Option<bool>,
    state: Option<State>,
}

/// Waits a [`Register`] remembers at most; past that the oldest ended ones are forgotten first (a wait that
/// ended long ago reporting again would be a new one), else the oldest.
pub const MAX_KNOWN: usize = 4096;

/// The key to forget of a table of waits whose keys are `order`, oldest first, once it holds more than
/// [`MAX_KNOWN`]: the oldest that `ended` says has ended, else the oldest; taken out of `order`. The one rule for
/// every such table: the [`Register`]'s and what an adapter keeps of its CLI's tasks and subagents.
pub fn forget_one<K>(order: &mut std::collections::VecDeque<K>, ended: impl Fn(&K) -> bool) -> Option<K> {
    if order.len() <= MAX_KNOWN {
        return None;
    }
    let at = order.iter().position(ended).unwrap_or(0);
    order.remove(at)
}

/// What has been reported per (session, waitId).
#[derive(Default)]
pub struct Register {
    /// By session, then by waitId (looked up without a key built).
    known: HashMap<String, HashMap<String, Known>>,
    /// The keys of `known`, oldest first.
    order: std::collections::VecDeque<(String, String)>,
}

impl Register {
    pub fn new() -> Register {
        Register::default()
    }

    /// The `_coda/wait` frame for `wait`, or `None` when it says nothing Coda would take: a first
    /// report that is terminal or has no state, anything after a terminal state, a repeat with no change,
    /// or a waitId over the limit.
    pub fn report(&mut self, wait: &Wait) -> Option<Frame> {
        if wait.wait_id.is_empty() || utf16_len(&wait.wait_id) > MAX_WAIT_ID || wait.session_id.is_empty() {
            tracing::warn!(
                "activity report dropped: waitId of {} characters (1 to {MAX_WAIT_ID}) or no sessionId",
                utf16_len(&wait.wait_id)
            );
            return None;
        }
        let (session, id) = (&wait.session_id, &wait.wait_id);
        let known = match self.known.get_mut(session).and_then(|waits| waits.get_mut(id)) {
            Some(k) if k.state.is_some_and(State::is_terminal) => return None,
            Some(k) => k,
            None if wait.state.is_none_or(State::is_terminal) => return None,
            None => {
                self.order.push_back((session.clone(), id.clone()));
                self.bound();
                self.known.entry(session.clone()).or_default().entry(id.clone()).or_default()
            }
        };
        // What changed, before anything is built: a repeat (the same call's update again) costs no allocation.
        let state = wait.state.or(known.state).unwrap_or(State::Waiting);
        let texts = wait.texts();
        let said: [bool; TEXTS.len()] =
            std::array::from_fn(|k| texts[k].is_some_and(|t| known.texts[k].as_deref() != Some(t)));
        let stoppable = wait.stoppable.filter(|&s| known.stoppable != Some(s));
        if known.state == Some(state) && !said.contains(&true) && stoppable.is_none() {
            return None;
        }
        for (k, text) in texts.iter().enumerate() {
            if let Some(text) = text.filter(|_| said[k]) {
                known.texts[k] = Some(text.into());
            }
        }
        if let Some(s) = stoppable {
            known.stoppable = Some(s);
        }
        known.state = Some(state);
        let said = std::array::from_fn(|k| texts[k].filter(|_| said[k]));
        Some(Frame::built(line(wait, state, said, stoppable)))
    }

    /// Past [`MAX_KNOWN`]: forgets the oldest ended wait, else the oldest.
    fn bound(&mut self) {
        let known = &self.known;
        let ended = |(session, id): &(String, String)| {
            known.get(session).and_then(|waits| waits.get(id)).is_some_and(|w| w.state.is_some_and(State::is_terminal))
        };
        if let Some(key) = forget_one(&mut self.order, ended) {
            if let Some(waits) = self.known.get_mut(&key.0) {
                waits.remove(&key.1);
                if waits.is_empty() {
                    self.known.remove(&key.0);
                }
            }
        }
    }

    /// Forgets the waits of the sessions `closed` says (a closed session's: nothing is reported of it again).
    pub fn forget(&mut self, closed: impl Fn(&str) -> bool) {
        self.known.retain(|session, _| !closed(session));
        self.order.retain(|(session, _)| !closed(session));
    }

    /// Whether `(session, wait_id)` was registered and has not ended.
    pub fn is_open(&self, session: &str, wait_id: &str) -> bool {
        self.known
            .get(session)
            .and_then(|waits| waits.get(wait_id))
            .is_some_and(|k| k.state.is_some_and(|s| !s.is_terminal()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(f: &Frame) -> Value {
        f.value()["params"].clone()
    }

    /// The line serde_json writes of a report with these members (its `Map` sorts them), without its newline.
    fn serde_line(members: &[(&str, Value)]) -> Vec<u8> {
        let params: serde_json::Map<String, Value> =
            members.iter().map(|(k, v)| ((*k).to_owned(), v.clone())).collect();
        serde_json::to_vec(&json!({"jsonrpc": "2.0", "method": METHOD, "params": params})).unwrap()
    }

    #[test]
    fn a_report_is_the_line_serde_json_writes_of_its_members_whatever_its_texts() {
        // The members' order is the one serde_json writes (keys by bytes), and covers every field.
        assert!(MEMBERS.windows(2).all(|w| w[0].0.as_bytes() < w[1].0.as_bytes()), "sorted");
        for (k, name) in TEXTS.iter().enumerate() {
            assert!(MEMBERS.iter().any(|(key, m)| key == name && matches!(m, Member::Text(t) if *t == k)), "{name}");
        }
        let control: String = (0u8..0x20).map(char::from).chain(['\u{7f}', '\u{2028}']).collect();
        let hostile = [
            "plain".to_owned(),
            "a \"quoted\" \\ path C:\\tmp\\x / </script>".to_owned(),
            control,
            "你是 Coda 的助手。\n\n- 不要删除文件 🚫\r\n\t".to_owned(),
            String::new(),
        ];
        for (n, text) in hostile.iter().enumerate() {
            for fields in 0u32..(1 << (TEXTS.len() + 1)) {
                let mut r = Register::new();
                let id = format!("w{n}{text}");
                let mut w =
                    Wait::new(&format!("s{text}"), &id, if fields % 3 == 0 { State::Handling } else { State::Waiting });
                let texts = [
                    &mut w.kind,
                    &mut w.title,
                    &mut w.detail,
                    &mut w.child_session_id,
                    &mut w.model,
                    &mut w.output_file,
                    &mut w.tool_call_id,
                ];
                for (k, field) in texts.into_iter().enumerate() {
                    *field = (fields & (1 << k) != 0).then(|| format!("{}{text}", TEXTS[k]));
                }
                w.stoppable = (fields & (1 << TEXTS.len()) != 0).then_some(fields % 2 == 0);
                let mut want =
                    vec![("sessionId", Value::from(w.session_id.clone())), ("waitId", Value::from(id.clone()))];
                want.push(("state", Value::from(w.state.unwrap().as_str())));
                for (k, text) in w.texts().into_iter().enumerate() {
                    want.extend(text.map(|t| (TEXTS[k], Value::from(t))));
                }
                want.extend(w.stoppable.map(|s| ("stoppable", Value::Bool(s))));
                let frame = r.report(&w).expect("a first report");
                assert_eq!(
                    String::from_utf8_lossy(frame.bytes()),
                    String::from_utf8_lossy(&serde_line(&want)),
                    "{fields:b}"
                );
                assert_eq!(frame.method(), Some(METHOD));
                assert_eq!(frame.session().as_deref(), Some(w.session_id.as_str()), "the frame check read its session");
            }
        }
    }

    #[test]
    fn never_open_with_a_terminal_state() {
        let mut r = Register::new();
        assert!(r.report(&Wait::new("s", "w", State::Done)).is_none());
        // Still not registered, so a later waiting opens it.
        assert!(r.report(&Wait::new("s", "w", State::Waiting)).is_some());
    }

    #[test]
    fn later_reports_carry_only_what_changed_and_terminal_is_final() {
        let mut r = Register::new();
        let mut w = Wait::new("s", "w", State::Waiting);
        w.kind = Some("task".into());
        w.title = Some("build".into());
        let first = r.report(&w).unwrap();
        assert_eq!(
            params(&first),
            json!({"sessionId":"s","waitId":"w","state":"waiting","kind":"task","title":"build"})
        );
        assert!(r.report(&w).is_none(), "a repeat with no change is not sent");
        w.state = Some(State::Handling);
        assert_eq!(params(&r.report(&w).unwrap()), json!({"sessionId":"s","waitId":"w","state":"handling"}));
        w.state = Some(State::Done);
        assert!(r.report(&w).is_some());
        w.state = Some(State::Waiting);
        assert!(r.report(&w).is_none(), "nothing after a terminal state");
        assert!(!r.is_open("s", "w"));
    }

    #[test]
    fn limits_count_utf16_units_as_coda_does_and_truncate_on_char_boundaries() {
        let mut r = Register::new();
        let mut w = Wait::new("s", "w", State::Waiting);
        w.title = Some("é".repeat(600));
        w.detail = Some("日".repeat(5000));
        let p = params(&r.report(&w).unwrap());
        assert_eq!(p["title"].as_str().unwrap().chars().count(), MAX_TITLE);
        assert_eq!(p["detail"].as_str().unwrap().chars().count(), MAX_DETAIL);
        // An emoji is two units in JavaScript: 400 of them are 800, so 250 fit a title.
        let mut w = Wait::new("s", "e", State::Waiting);
        w.title = Some("😀".repeat(400));
        w.detail = Some(format!("a{}", "😀".repeat(2500)));
        let p = params(&r.report(&w).unwrap());
        assert_eq!(p["title"].as_str().map(utf16_len), Some(MAX_TITLE));
        assert_eq!(p["title"].as_str().map(|t| t.chars().count()), Some(250));
        assert_eq!(p["detail"].as_str().map(utf16_len), Some(MAX_DETAIL - 1), "never half a pair");
        assert!(r.report(&Wait::new("s", &"x".repeat(201), State::Waiting)).is_none());
        assert!(r.report(&Wait::new("s", &"x".repeat(200), State::Waiting)).is_some());
        assert!(r.report(&Wait::new("s", &"😀".repeat(101), State::Waiting)).is_none(), "202 units");
        assert!(r.report(&Wait::new("s", &"😀".repeat(100), State::Waiting)).is_some());
        assert!(r.report(&Wait::new("", "w", State::Waiting)).is_none(), "sessionId is required");
    }

    #[test]
    fn each_field_is_said_when_it_changes_and_not_again() {
        let mut r = Register::new();
        let mut w = Wait::new("s", "w", State::Waiting);
        w.stoppable = Some(true);
        w.model = Some("m".into());
        assert_eq!(
            params(&r.report(&w).unwrap()),
            json!({"sessionId":"s","waitId":"w","state":"waiting","stoppable":true,"model":"m"})
        );
        w.stoppable = Some(false);
        assert_eq!(
            params(&r.report(&w).unwrap()),
            json!({"sessionId":"s","waitId":"w","state":"waiting","stoppable":false})
        );
        // A field not said keeps what was said; saying it again unchanged is no change.
        w.model = None;
        assert!(r.report(&w).is_none());
        w.model = Some("m".into());
        assert!(r.report(&w).is_none());
        // A title past its limit is compared as it is sent: the same prefix is no change.
        w.title = Some("t".repeat(MAX_TITLE + 5));
        assert_eq!(params(&r.report(&w).unwrap())["title"].as_str().map(str::len), Some(MAX_TITLE));
        w.title = Some("t".repeat(MAX_TITLE + 9));
        assert!(r.report(&w).is_none());
        r.forget(|s| s == "s");
        assert!(!r.is_open("s", "w") && r.order.is_empty() && r.known.is_empty());
    }

    #[test]
    fn the_waits_remembered_are_bounded_and_the_ended_ones_go_first() {
        let mut r = Register::new();
        r.report(&Wait::new("s", "first", State::Waiting)).unwrap();
        r.report(&Wait::new("s", "ended", State::Waiting)).unwrap();
        r.report(&Wait::new("s", "ended", State::Done)).unwrap();
        for n in 0..MAX_KNOWN - 1 {
            r.report(&Wait::new("s", &format!("w{n}"), State::Waiting)).unwrap();
        }
        assert_eq!(r.known.values().map(HashMap::len).sum::<usize>(), MAX_KNOWN);
        assert_eq!(r.order.len(), MAX_KNOWN);
        assert!(r.is_open("s", "first"), "the oldest open one is kept");
        assert!(!r.known["s"].contains_key("ended"), "the ended one went");
        r.report(&Wait::new("s", "one more", State::Waiting)).unwrap();
        assert!(!r.is_open("s", "first"), "then the oldest");
    }

    #[test]
    fn capability_negotiation() {
        assert!(client_declares_waits(&json!({"clientCapabilities":{"_meta":{"coda":{"waits":{}}}}})));
        assert!(!client_declares_waits(&json!({"clientCapabilities":{}})));
        assert!(!client_declares_waits(&json!({"clientCapabilities":{"_meta":{"coda":{"waits":null}}}})));
        let mut result = json!({"protocolVersion":1,"agentCapabilities":{"loadSession":true,"_meta":{"x":1}}});
        declare_waits(&mut result);
        assert_eq!(
            result,
            json!({"protocolVersion":1,"agentCapabilities":{"loadSession":true,"_meta":{"x":1,"coda":{"waits":{}}}}})
        );
    }
}

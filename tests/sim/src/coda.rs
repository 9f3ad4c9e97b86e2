//! The Coda player: the frames each plan step sends, as Coda sends them (the real instruction, multi-line CJK
//! prompts, ids it counts), and what Coda knows from what it received: its sessions, its open requests, the
//! permission requests waiting for it, the declarations of the `initialize` answer.

use std::collections::{HashMap, VecDeque};

use serde_json::{Value, json};

use crate::plan::{HostileFrame, Step};

/// Coda's session instruction as it really comes (several paragraphs of Markdown with CJK and an emoji).
pub const INSTRUCTION: &str = include_str!("../../../fixtures/coda-instruction.md");

/// The prompts and steering texts Coda sends (a marker `⟦p<n>⟧` is added to each).
pub const TEXTS: [&str; 8] = [
    "Could you look at the failing build?\n\nIt broke after yesterday's merge:\n- the iPhone target stops at link time\n- 测试都通过了\n\nStart with the log.",
    "先别改测试,只看实现:\n- the link step\n- `build.rs`",
    "hello",
    "请把这段代码重构一下 🧭\n\n```rust\nfn main() {}\n```",
    "/review the last commit",
    "Summarise what changed.\n\n変更点をまとめてください。",
    "line one\r\nline two\n\n\nline five",
    "a long one: lorem ipsum dolor sit amet, 这是一个很长的句子 repeated. lorem ipsum dolor sit amet, 这是一个很长的句子 repeated. lorem ipsum dolor sit amet, 这是一个很长的句子 repeated.",
];

/// A request Coda sent and has no answer to yet.
#[derive(Debug, Clone)]
pub struct Open {
    /// The id as JSON text.
    pub id: String,
    pub method: String,
    pub session: Option<String>,
    /// A prompt's or steering message's marker.
    pub marker: Option<u32>,
    pub at: u64,
    /// It reused the id of a request still open (a hostile client's): the shim refuses it at once.
    pub duplicate: bool,
}

#[derive(Default)]
pub struct Coda {
    next_id: i64,
    next_marker: u32,
    /// Whether the latest `initialize` declared `_meta.coda.waits` (None before any).
    pub waits: Option<bool>,
    pub steering_declared: bool,
    pub compact_declared: bool,
    /// Sessions the shim opened for Coda (answers to `session/new`, `session/load`).
    pub sessions: Vec<String>,
    pub open: Vec<Open>,
    /// Permission requests of the CLI waiting for Coda (their ids).
    pub permissions: VecDeque<Value>,
    /// Stoppable waits Coda was told of, by session.
    pub stoppable: HashMap<String, Vec<String>>,
    /// Child sessions announced in `_coda/wait`.
    pub children: Vec<String>,
    /// The client closed its output.
    pub closed: bool,
    /// Requests with an id that is no id (an object) whose refusal has not come yet: the shim answers each with
    /// an Invalid Request error whose id is null (JSON-RPC 2.0), which answers none of Coda's requests.
    pub refusals_due: usize,
}

/// What a step sends: its lines, and what the CLI is to do for it.
pub struct Sent {
    pub lines: Vec<String>,
    pub marker: Option<u32>,
    pub session: Option<String>,
}

fn request(id: &Value, method: &str, params: Value) -> String {
    json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}).to_string()
}

impl Coda {
    fn id(&mut self) -> Value {
        self.next_id += 1;
        json!(self.next_id)
    }

    fn marker(&mut self) -> u32 {
        self.next_marker += 1;
        self.next_marker
    }

    /// The session a step names: one Coda opened (by index), none when it has none.
    pub fn session(&self, index: u8) -> Option<String> {
        (!self.sessions.is_empty()).then(|| self.sessions[index as usize % self.sessions.len()].clone())
    }

    /// Coda's prompt of `session` that is open, if any.
    pub fn open_prompt(&self, session: &str) -> Option<&Open> {
        self.open.iter().find(|o| o.method == "session/prompt" && o.session.as_deref() == Some(session))
    }

    fn track(&mut self, id: &Value, method: &str, session: Option<String>, marker: Option<u32>, now: u64) {
        let id = id.to_string();
        let duplicate = self.open.iter().any(|o| o.id == id);
        let open = Open { id, method: method.into(), session, marker, at: now, duplicate };
        self.open.push(open);
    }

    fn send(&mut self, method: &str, session: Option<String>, params: Value, marker: Option<u32>, now: u64) -> Sent {
        let id = self.id();
        self.track(&id, method, session.clone(), marker, now);
        Sent { lines: vec![request(&id, method, params)], marker, session }
    }

    fn prompt_text(&mut self, text: u8) -> (String, u32) {
        let m = self.marker();
        (format!("{}\n⟦p{m}⟧", TEXTS[text as usize % TEXTS.len()]), m)
    }

    fn prompt(&mut self, session: String, text: u8, now: u64) -> Sent {
        let (text, m) = self.prompt_text(text);
        let params = json!({"sessionId": session, "prompt": [{"type": "text", "text": text}]});
        self.send("session/prompt", Some(session), params, Some(m), now)
    }

    /// The frames of a Coda step at `now`; `None` when Coda would not send it now (it only sends what the
    /// protocol lets it, but for steps marked hostile).
    pub fn step(&mut self, step: &Step, now: u64) -> Option<Sent> {
        let nothing = |session| Sent { lines: Vec::new(), marker: None, session };
        match step {
            Step::Initialize { waits } => {
                self.waits = Some(*waits);
                let mut caps = json!({"fs": {"readTextFile": false, "writeTextFile": false}, "terminal": false,
                    "session": {"compaction": {}}});
                if *waits {
                    caps["_meta"] = json!({"coda": {"waits": {}}});
                }
                let params = json!({"protocolVersion": 1, "clientCapabilities": caps,
                    "clientInfo": {"name": "coda", "version": "1.0.0"}});
                Some(self.send("initialize", None, params, None, now))
            }
            Step::NewSession { instruction } => {
                let mut params = json!({"cwd": "/work/app", "mcpServers": []});
                if *instruction {
                    params["systemPrompt"] =
                        json!({"mode": "append", "content": [{"type": "text", "text": INSTRUCTION}]});
                }
                Some(self.send("session/new", None, params, None, now))
            }
            Step::LoadSession { session } => {
                let s = self.session(*session)?;
                let params = json!({"sessionId": s, "cwd": "/work/app", "mcpServers": [],
                    "systemPrompt": {"mode": "append", "content": [{"type": "text", "text": INSTRUCTION}]}});
                Some(self.send("session/load", Some(s), params, None, now))
            }
            Step::Prompt { session, text, .. } => {
                let s = self.session(*session)?;
                if self.open_prompt(&s).is_some() {
                    return None; // Coda queues a message while its turn runs.
                }
                Some(self.prompt(s, *text, now))
            }
            Step::Cancel { session } => {
                let s = self.session(*session)?;
                let line = json!({"jsonrpc": "2.0", "method": "session/cancel", "params": {"sessionId": s}});
                Some(Sent { lines: vec![line.to_string()], marker: None, session: Some(s) })
            }
            Step::Steering { session, text, hostile, .. } => {
                let s = self.session(*session)?;
                if !hostile && (!self.steering_declared || self.open_prompt(&s).is_none()) {
                    return None;
                }
                if !hostile
                    && self.open.iter().any(|o| o.method == "_session/steering" && o.session.as_ref() == Some(&s))
                {
                    return None; // One steering message in flight per session.
                }
                let (text, m) = self.prompt_text(*text);
                let params = json!({"sessionId": s, "prompt": [{"type": "text", "text": text}],
                    "_meta": {"steering": {"idleBehavior": "promptRequired"}}});
                Some(self.send("_session/steering", Some(s), params, Some(m), now))
            }
            Step::Compaction { session, .. } => {
                let s = self.session(*session)?;
                if !self.compact_declared {
                    return None;
                }
                Some(self.send("_coda/session/compact", Some(s.clone()), json!({"sessionId": s}), None, now))
            }
            Step::StopWait { session } => {
                let s = self.session(*session)?;
                let wait = self.stoppable.get(&s).and_then(|w| w.last()).cloned()?;
                Some(self.send("_coda/wait/stop", Some(s.clone()), json!({"sessionId": s, "waitId": wait}), None, now))
            }
            Step::AnswerPermission { allow } => {
                let id = self.permissions.pop_front()?;
                let option = if *allow { "allow_once" } else { "reject_once" };
                let line = json!({"jsonrpc": "2.0", "id": id, "result": {"outcome": {"outcome": "selected", "optionId": option}}});
                Some(Sent { lines: vec![line.to_string()], marker: None, session: None })
            }
            Step::Hostile { frame } => Some(self.hostile(*frame, now)),
            Step::CloseStdin => {
                self.closed = true;
                Some(nothing(None))
            }
            Step::OwnTurn { .. } | Step::Die | Step::Restart => None,
        }
    }

    fn hostile(&mut self, frame: HostileFrame, now: u64) -> Sent {
        let latest = self.sessions.last().cloned().unwrap_or_else(|| "ses-nobody".into());
        let raw = |line: String| Sent { lines: vec![line], marker: None, session: None };
        match frame {
            HostileFrame::BadParams => {
                self.send("session/prompt", None, json!({"sessionId": 42, "prompt": "not blocks"}), None, now)
            }
            HostileFrame::LoneSurrogate => {
                if self.open_prompt(&latest).is_some() {
                    return raw("{\"jsonrpc\":\"2.0\",\"method\":\"_x/note\",\"params\":{\"s\":\"\\ud800\"}}".into());
                }
                let m = self.marker();
                let id = self.id();
                self.track(&id, "session/prompt", Some(latest.clone()), Some(m), now);
                let line = format!(
                    "{{\"jsonrpc\":\"2.0\",\"id\":{id},\"method\":\"session/prompt\",\"params\":{{\"sessionId\":{},\"prompt\":[{{\"type\":\"text\",\"text\":\"hello \\ud800 there \\udc00\\n⟦p{m}⟧\"}}]}}}}",
                    json!(latest)
                );
                Sent { lines: vec![line], marker: Some(m), session: Some(latest) }
            }
            HostileFrame::HugeNumber => {
                let id = self.id();
                self.track(&id, "session/set_mode", Some(latest.clone()), None, now);
                raw(format!(
                    "{{\"jsonrpc\":\"2.0\",\"id\":{id},\"method\":\"session/set_mode\",\"params\":{{\"sessionId\":{},\"modeId\":\"read-only\",\"n\":1e400,\"m\":-0.5E-999}}}}",
                    json!(latest)
                ))
            }
            HostileFrame::DeepNesting => {
                let id = self.id();
                self.track(&id, "session/set_mode", None, None, now);
                let deep = format!("{}{}", "[".repeat(2000), "]".repeat(2000));
                raw(format!("{{\"jsonrpc\":\"2.0\",\"id\":{id},\"method\":\"session/set_mode\",\"params\":{deep}}}"))
            }
            HostileFrame::ReusedId => {
                let open = self.open.first().and_then(|o| serde_json::from_str(&o.id).ok());
                let id: Value = open.unwrap_or(json!(1));
                self.track(&id, "session/set_mode", Some(latest.clone()), None, now);
                raw(request(&id, "session/set_mode", json!({"sessionId": latest, "modeId": "read-only"})))
            }
            HostileFrame::OddId => {
                let ids = [json!("s-odd"), json!(1.5), Value::Null, json!({"a": 1})];
                let id = ids[(self.next_id as usize) % ids.len()].clone();
                self.next_id += 1;
                if id.is_object() {
                    self.refusals_due += 1;
                } else {
                    self.track(&id, "session/set_mode", Some(latest.clone()), None, now);
                }
                raw(request(&id, "session/set_mode", json!({"sessionId": latest, "modeId": "read-only"})))
            }
            HostileFrame::NotJson => raw("this is not json {\"jsonrpc\":".into()),
            HostileFrame::UnknownSession => self.prompt("ses-nobody".into(), 2, now),
            HostileFrame::SecondPrompt => self.prompt(latest, 1, now),
        }
    }

    /// The process ended: its requests were answered by the exit, its permission requests and activities end
    /// with it (rule 6); the sessions stay Coda's.
    pub fn restart(&mut self) {
        self.open.clear();
        self.refusals_due = 0;
        self.permissions.clear();
        self.stoppable.clear();
        self.closed = false;
    }

    /// The answers Coda gives the permission requests still waiting when it stops acting (the cards' Stop).
    pub fn cancel_permissions(&mut self) -> Vec<String> {
        self.permissions
            .drain(..)
            .map(|id| json!({"jsonrpc": "2.0", "id": id, "result": {"outcome": {"outcome": "cancelled"}}}).to_string())
            .collect()
    }
}

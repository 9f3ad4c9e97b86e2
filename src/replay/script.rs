//! The script state machine: one side of a recording, step by step (what to send, what to expect next).

use std::fmt;

use serde_json::Value;

use super::file_op::FileOp;
use super::format::{Body, Record};
use super::homes;
use super::placeholder::{Bindings, Difference, Escape, cut, fill, match_str, match_value};
use crate::trace::Dir;

/// Which side of the recording a [`Script`] plays.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    /// The CLI: sends `agent->shim` and `agent->file`, expects `shim->agent`.
    Agent,
    /// The client: sends `client->shim`, expects `shim->client`.
    Client,
}

/// What a script wants done next.
#[derive(Debug, Clone, PartialEq)]
pub enum Step {
    /// Write this line (no newline) to the peer; `t` is its recorded time.
    Send {
        line: String,
        t: Option<u64>,
        lineno: usize,
    },
    /// Perform this file operation (placeholders filled).
    File {
        op: FileOp,
        lineno: usize,
    },
    /// Read the next frame from the peer and hand it to [`Script::received`].
    Expect,
    Done,
}

/// A frame that the recording does not have at this point.
#[derive(Debug, Clone, PartialEq)]
pub struct Mismatch {
    /// Fixture line of the recorded frame compared against (0 after the end of the recording).
    pub lineno: usize,
    pub expected: Option<String>,
    pub got: String,
    pub difference: Option<Difference>,
    /// How many recorded frames would have been accepted here.
    pub candidates: usize,
}

impl fmt::Display for Mismatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.expected {
            None => writeln!(f, "received a frame after the end of the recording")?,
            Some(_) if self.candidates > 1 => writeln!(
                f,
                "received a frame that matches none of the {} frames the recording expects here (first at line {})",
                self.candidates, self.lineno
            )?,
            Some(_) => {
                writeln!(f, "received a frame the recording does not have here (recorded at line {})", self.lineno)?
            }
        }
        if let Some(e) = &self.expected {
            writeln!(f, "  expected: {}", cut(e, 4000))?;
        }
        writeln!(f, "  got:      {}", cut(&self.got, 4000))?;
        if let Some(d) = &self.difference {
            writeln!(f, "  {d}")?;
        }
        Ok(())
    }
}

/// Values for placeholders nothing else gave.
pub type Fallback = Box<dyn Fn(&str) -> Option<String> + Send>;

/// The state machine of one side of a recording.
pub struct Script {
    records: Vec<Record>,
    side: Side,
    pos: usize,
    /// Indices of recorded frames that may arrive now.
    pending: Vec<usize>,
    /// Whether `pending` may be matched in any order.
    any_order: bool,
    pub bindings: Bindings,
    fallback: Fallback,
    /// Placeholders that could not be filled, for a warning.
    pub unknown: Vec<String>,
}

impl Script {
    /// The player's side: consecutive `shim->agent` frames may arrive in any order.
    pub fn agent(records: Vec<Record>, bindings: Bindings) -> Script {
        Script::new(records, Side::Agent, true, bindings, Box::new(env_fallback))
    }

    /// The client's side: `shim->client` frames must arrive in the recorded order.
    pub fn client(records: Vec<Record>, bindings: Bindings) -> Script {
        Script::new(records, Side::Client, false, bindings, Box::new(|_| None))
    }

    pub fn new(records: Vec<Record>, side: Side, any_order: bool, bindings: Bindings, fallback: Fallback) -> Script {
        Script { records, side, pos: 0, pending: Vec::new(), any_order, bindings, fallback, unknown: Vec::new() }
    }

    fn is_expected(&self, r: &Record) -> bool {
        match self.side {
            Side::Agent => r.edge == Dir::ShimToAgent,
            Side::Client => r.edge == Dir::ShimToClient,
        }
    }

    fn is_sent(&self, r: &Record) -> bool {
        match self.side {
            Side::Agent => matches!(r.edge, Dir::AgentToShim | Dir::AgentToFile),
            Side::Client => r.edge == Dir::ClientToShim,
        }
    }

    /// Recorded frames still expected (for messages).
    pub fn expected_now(&self) -> Vec<&Record> {
        self.pending.iter().map(|&i| &self.records[i]).collect()
    }

    /// Whether everything left to do is sending (no frame is expected any more).
    pub fn only_sends_left(&self) -> bool {
        self.pending.is_empty() && self.records[self.pos..].iter().all(|r| !self.is_expected(r))
    }

    /// The next thing to do.
    pub fn next_step(&mut self) -> Step {
        if !self.pending.is_empty() {
            return Step::Expect;
        }
        while self.pos < self.records.len() {
            let i = self.pos;
            let r = &self.records[i];
            if self.is_expected(r) {
                let run = self.records[i..].iter().take_while(|r| self.is_expected(r)).count();
                let take = if self.any_order { run } else { 1 };
                self.pending = (i..i + take).collect();
                self.pos += take;
                return Step::Expect;
            }
            self.pos += 1;
            if !self.is_sent(r) {
                continue;
            }
            let (t, lineno) = (r.t, r.lineno);
            let body = r.body.clone();
            return match body {
                Body::Frame(text) => Step::Send { line: self.fill(&text, Escape::Json), t, lineno },
                Body::Line(text) => Step::Send { line: self.fill(&text, Escape::Raw), t, lineno },
                Body::File(mut op) => {
                    op.path = self.fill(&op.path, Escape::Raw);
                    op.to = op.to.map(|to| self.fill(&to, Escape::Raw));
                    let escape = if op.path.ends_with(".json") || op.path.ends_with(".jsonl") {
                        Escape::Json
                    } else {
                        Escape::Raw
                    };
                    op.data = op.data.map(|d| self.fill(&d, escape));
                    Step::File { op, lineno }
                }
            };
        }
        Step::Done
    }

    fn fill(&mut self, text: &str, escape: Escape) -> String {
        let (out, unknown) = fill(text, escape, &mut self.bindings, &*self.fallback);
        for u in unknown {
            if !self.unknown.contains(&u) {
                self.unknown.push(u);
            }
        }
        out
    }

    /// Takes a frame from the peer; an error says how it differs from the recording.
    pub fn received(&mut self, line: &str) -> Result<(), Box<Mismatch>> {
        let got: Option<Value> = crate::json::from_str(line).ok();
        if self.pending.is_empty() {
            // Called without an Expect step: only after the end is a frame unexpected by construction.
            return Err(Box::new(Mismatch {
                lineno: 0,
                expected: None,
                got: line.to_owned(),
                difference: None,
                candidates: 0,
            }));
        }
        let mut first_diff = None;
        for (k, &i) in self.pending.iter().enumerate() {
            let r = &self.records[i];
            let ok = match (&r.body, &got) {
                (Body::Frame(text), Some(got)) => match crate::json::from_str::<Value>(text) {
                    Ok(expected) => match match_value(&expected, got, &mut self.bindings) {
                        Ok(()) => true,
                        Err(d) => {
                            first_diff.get_or_insert(d);
                            false
                        }
                    },
                    Err(_) => false,
                },
                (Body::Line(text), _) => match_str(text, line, &mut self.bindings),
                _ => false,
            };
            if ok {
                self.pending.remove(k);
                return Ok(());
            }
        }
        let r = &self.records[self.pending[0]];
        let expected = match &r.body {
            Body::Frame(t) | Body::Line(t) => t.clone(),
            Body::File(_) => String::new(),
        };
        Err(Box::new(Mismatch {
            lineno: r.lineno,
            expected: Some(expected),
            got: line.to_owned(),
            difference: first_diff,
            candidates: self.pending.len(),
        }))
    }
}

/// The player's fallback: values from its environment.
pub fn env_fallback(name: &str) -> Option<String> {
    let var = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
    match name {
        "TMPDIR" => var("TMPDIR").or_else(|| Some("/tmp".into())),
        "CWD" => std::env::current_dir().ok().map(|d| d.to_string_lossy().into_owned()),
        "CWD_URL" => env_fallback("CWD").map(|cwd| super::normalise::url_encoded(&cwd)),
        "HOME" => var(name),
        _ if homes::own_vars().contains(&name) => var(name),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::replay::file_op::{FileOpError, FileOpKind, apply_file_op};

    fn rec(edge: Dir, frame: &str) -> Record {
        Record { edge, t: None, shim: false, body: Body::Frame(frame.into()), lineno: 0 }
    }

    #[test]
    fn the_player_accepts_a_run_of_expected_frames_in_any_order_and_fills_replies() {
        let records = vec![
            rec(Dir::ClientToShim, r#"{"jsonrpc":"2.0","id":1,"method":"a"}"#),
            rec(Dir::ShimToAgent, r#"{"jsonrpc":"2.0","id":1,"method":"a","params":{"cwd":"{{CWD}}"}}"#),
            rec(Dir::ShimToAgent, r#"{"jsonrpc":"2.0","id":"coda-shim-{{SHIM_PID}}-0","method":"b"}"#),
            rec(Dir::AgentToShim, r#"{"jsonrpc":"2.0","id":"coda-shim-{{SHIM_PID}}-0","result":"{{CWD}}"}"#),
            rec(Dir::ShimToClient, r#"{"jsonrpc":"2.0","id":1,"result":{}}"#),
        ];
        let mut p = Script::new(records, Side::Agent, true, Bindings::default(), Box::new(|_| None));
        assert_eq!(p.next_step(), Step::Expect);
        p.received(r#"{"jsonrpc":"2.0","id":"coda-shim-77-0","method":"b"}"#).unwrap();
        assert_eq!(p.next_step(), Step::Expect);
        p.received(r#"{"jsonrpc":"2.0","id":1,"method":"a","params":{"cwd":"/w"}}"#).unwrap();
        match p.next_step() {
            Step::Send { line, .. } => assert_eq!(line, r#"{"jsonrpc":"2.0","id":"coda-shim-77-0","result":"/w"}"#),
            other => panic!("{other:?}"),
        }
        assert_eq!(p.next_step(), Step::Done);
        assert!(p.received("{}").unwrap_err().expected.is_none());
    }

    #[test]
    fn a_wrong_frame_is_a_mismatch_with_expected_got_and_where() {
        let records =
            vec![rec(Dir::ShimToAgent, r#"{"jsonrpc":"2.0","id":1,"method":"session/new","params":{"cwd":"/a"}}"#)];
        let mut p = Script::agent(records, Bindings::default());
        assert_eq!(p.next_step(), Step::Expect);
        let m = p.received(r#"{"jsonrpc":"2.0","id":1,"method":"session/new","params":{"cwd":"/b"}}"#).unwrap_err();
        let text = m.to_string();
        assert!(text.contains("expected: {\"jsonrpc\""), "{text}");
        assert!(text.contains("got:      {\"jsonrpc\""), "{text}");
        assert!(text.contains("first difference at /params/cwd: expected \"/a\", got \"/b\""), "{text}");
        // Not consumed: the same frame is still expected.
        assert_eq!(p.next_step(), Step::Expect);
    }

    #[test]
    fn the_client_side_expects_frames_in_recorded_order() {
        let records = vec![
            rec(Dir::ShimToClient, r#"{"jsonrpc":"2.0","method":"x"}"#),
            rec(Dir::ShimToClient, r#"{"jsonrpc":"2.0","method":"y"}"#),
            rec(Dir::ClientToShim, r#"{"jsonrpc":"2.0","method":"z"}"#),
        ];
        let mut c = Script::client(records, Bindings::default());
        assert_eq!(c.next_step(), Step::Expect);
        assert!(c.received(r#"{"jsonrpc":"2.0","method":"y"}"#).is_err());
        c.received(r#"{"jsonrpc":"2.0","method":"x"}"#).unwrap();
        assert_eq!(c.next_step(), Step::Expect);
        c.received(r#"{"jsonrpc":"2.0","method":"y"}"#).unwrap();
        assert!(matches!(c.next_step(), Step::Send { .. }), "the client frame goes only after both arrived");
    }

    #[test]
    fn file_ops_replay_into_the_bound_folder() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().to_string_lossy().into_owned();
        let records = vec![
            Record {
                edge: Dir::AgentToFile,
                t: None,
                shim: false,
                body: Body::File(FileOp {
                    op: FileOpKind::Append,
                    path: "{{DATA_HOME}}/s/wire.jsonl".into(),
                    data: Some("{\"cwd\":\"{{CWD}}\"}\n".into()),
                    base64: None,
                    to: None,
                }),
                lineno: 1,
            },
            Record {
                edge: Dir::AgentToFile,
                t: None,
                shim: false,
                body: Body::File(FileOp {
                    op: FileOpKind::Replace,
                    path: "{{DATA_HOME}}/s/out.log".into(),
                    data: None,
                    base64: Some("aGk=".into()),
                    to: None,
                }),
                lineno: 2,
            },
        ];
        let mut p = Script::new(
            records,
            Side::Agent,
            true,
            Bindings::from_iter([("DATA_HOME", root.as_str()), ("CWD", "/c\"d")]),
            Box::new(|_| None),
        );
        for _ in 0..2 {
            let Step::File { op, .. } = p.next_step() else { panic!() };
            apply_file_op(&op).unwrap();
        }
        assert_eq!(std::fs::read_to_string(dir.path().join("s/wire.jsonl")).unwrap(), "{\"cwd\":\"/c\\\"d\"}\n");
        assert_eq!(std::fs::read(dir.path().join("s/out.log")).unwrap(), b"hi");
        let bad = FileOp { op: FileOpKind::Write, path: format!("{root}/../x"), data: None, base64: None, to: None };
        let err = apply_file_op(&bad).unwrap_err();
        assert!(matches!(err, FileOpError::NotAbsolute(_)) && err.to_string().contains("without \"..\""), "{err}");
        let unbound = FileOp { op: FileOpKind::Write, path: "{{NOPE}}/x".into(), data: None, base64: None, to: None };
        let err = apply_file_op(&unbound).unwrap_err();
        assert!(matches!(err, FileOpError::Unbound(_)) && err.to_string().contains("no value"), "{err}");
    }
}

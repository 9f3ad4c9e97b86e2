//! Recordings and replay (`fixtures/README.md` describes the format).
//!
//! A fixture is a `--trace-file` recording with machine-specific values replaced by `{{NAME}}` placeholders.
//! [`Script`] walks one side of it: the agent side (the player, `acp-replay play`, which stands in for the CLI)
//! or the client side ([`check`], which drives a shim binary and compares what the client receives).
//! [`Normaliser`] and [`record`] turn a trace into a fixture.

use std::collections::BTreeMap;
use std::fmt;
use std::io::{BufRead, BufReader, Write};
use std::path::{Component, Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant, SystemTime};

use base64::Engine as _;
use serde::Deserialize;
use serde_json::Value;
use serde_json::value::RawValue;

use crate::private_file;

pub mod view;

/// The file inside a fixture folder that holds the recording.
pub const TRACE_FILE: &str = "trace.jsonl";

/// Where a record was seen.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Edge {
    ClientToShim,
    ShimToAgent,
    AgentToShim,
    ShimToClient,
    /// A session file written by the CLI.
    AgentToFile,
}

impl Edge {
    pub fn parse(s: &str) -> Option<Edge> {
        Some(match s {
            "client->shim" => Edge::ClientToShim,
            "shim->agent" => Edge::ShimToAgent,
            "agent->shim" => Edge::AgentToShim,
            "shim->client" => Edge::ShimToClient,
            "agent->file" => Edge::AgentToFile,
            _ => return None,
        })
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Edge::ClientToShim => "client->shim",
            Edge::ShimToAgent => "shim->agent",
            Edge::AgentToShim => "agent->shim",
            Edge::ShimToClient => "shim->client",
            Edge::AgentToFile => "agent->file",
        }
    }
}

/// What a record carries.
#[derive(Debug, Clone, PartialEq)]
pub enum Body {
    /// The exact JSON text of a frame (placeholders included).
    Frame(String),
    /// A line that was not JSON-RPC.
    Line(String),
    File(FileOp),
}

/// A session-file write of the CLI.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, Deserialize)]
pub struct FileOp {
    pub op: FileOpKind,
    pub path: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base64: Option<String>,
    /// The target of `rename`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub to: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FileOpKind {
    Append,
    Replace,
    Write,
    Mkdir,
    Remove,
    Rename,
}

/// One record of a fixture or trace.
#[derive(Debug, Clone, PartialEq)]
pub struct Record {
    pub edge: Edge,
    /// Milliseconds since the first record, when known.
    pub t: Option<u64>,
    pub shim: bool,
    pub body: Body,
    /// 1-based line in the file it came from (0 when built in memory).
    pub lineno: usize,
}

impl Record {
    /// The record as one fixture line.
    pub fn to_line(&self) -> String {
        let mut out = String::from("{");
        if let Some(t) = self.t {
            out.push_str(&format!("\"t\":{t},"));
        }
        out.push_str(&format!("\"dir\":\"{}\"", self.edge.as_str()));
        if self.shim {
            out.push_str(",\"shim\":true");
        }
        match &self.body {
            Body::Frame(text) => {
                out.push_str(",\"frame\":");
                out.push_str(text);
            }
            Body::Line(text) => {
                out.push_str(",\"line\":");
                out.push_str(&Value::from(text.as_str()).to_string());
            }
            Body::File(op) => {
                out.push_str(",\"file\":");
                out.push_str(&serde_json::to_string(op).unwrap_or_default());
            }
        }
        out.push('}');
        out
    }
}

#[derive(Deserialize)]
struct RawRecord {
    #[serde(default)]
    ts: Option<String>,
    #[serde(default)]
    t: Option<u64>,
    dir: String,
    #[serde(default)]
    shim: bool,
    #[serde(default)]
    frame: Option<Box<RawValue>>,
    #[serde(default)]
    line: Option<String>,
    #[serde(default)]
    file: Option<FileOp>,
}

/// Parses records (fixture lines with `t`, or raw trace lines with `ts`). Empty lines are skipped.
pub fn parse_records(text: &str) -> Result<Vec<Record>, String> {
    let mut out = Vec::new();
    let mut first_ts: Option<SystemTime> = None;
    for (i, line) in text.lines().enumerate() {
        let lineno = i + 1;
        if line.trim().is_empty() {
            continue;
        }
        let raw: RawRecord = crate::json::from_str(line).map_err(|e| format!("line {lineno}: not a record: {e}"))?;
        let edge = Edge::parse(&raw.dir).ok_or_else(|| format!("line {lineno}: unknown \"dir\" {:?}", raw.dir))?;
        let t = match (raw.t, raw.ts.as_deref()) {
            (Some(t), _) => Some(t),
            (None, Some(ts)) => {
                let at =
                    humantime::parse_rfc3339_weak(ts).map_err(|e| format!("line {lineno}: bad \"ts\" {ts:?}: {e}"))?;
                let first = *first_ts.get_or_insert(at);
                Some(at.duration_since(first).map(|d| d.as_millis() as u64).unwrap_or(0))
            }
            (None, None) => None,
        };
        let body = match (raw.frame, raw.line, raw.file) {
            (Some(frame), None, None) => Body::Frame(frame.get().to_owned()),
            (None, Some(line), None) => Body::Line(line),
            (None, None, Some(file)) => {
                if (file.data.is_some() as u8 + file.base64.is_some() as u8) > 1 {
                    return Err(format!("line {lineno}: a file record has both \"data\" and \"base64\""));
                }
                Body::File(file)
            }
            _ => return Err(format!("line {lineno}: a record needs exactly one of \"frame\", \"line\", \"file\"")),
        };
        if (edge == Edge::AgentToFile) != matches!(body, Body::File(_)) {
            return Err(format!("line {lineno}: \"file\" goes with \"dir\":\"agent->file\" and only there"));
        }
        out.push(Record { edge, t, shim: raw.shim, body, lineno });
    }
    Ok(out)
}

/// The session-file log that may sit beside `trace.jsonl` (merged by time when the folder is loaded).
pub const FILES_FILE: &str = "files.jsonl";

/// Loads a fixture folder (its `trace.jsonl`, merged with a `files.jsonl` beside it) or a trace/fixture file.
pub fn load(path: &Path) -> Result<Vec<Record>, String> {
    let file = if path.is_dir() { path.join(TRACE_FILE) } else { path.to_path_buf() };
    let text = std::fs::read_to_string(&file).map_err(|e| format!("cannot read {}: {e}", file.display()))?;
    let files = file.with_file_name(FILES_FILE);
    if path.is_dir() && files.is_file() {
        let log = std::fs::read_to_string(&files).map_err(|e| format!("cannot read {}: {e}", files.display()))?;
        // Merging needs the trace's absolute `ts`; the records are normalised already.
        return record(&text, Some(&log), &Normaliser::default()).map_err(|e| format!("{}: {e}", path.display()));
    }
    parse_records(&text).map_err(|e| format!("{}: {e}", file.display()))
}

// ---------------------------------------------------------------------------------------------------------------
// Placeholders

/// Values of `{{NAME}}` placeholders known so far.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Bindings(pub BTreeMap<String, String>);

impl Bindings {
    pub fn get(&self, name: &str) -> Option<&str> {
        self.0.get(name).map(String::as_str)
    }

    pub fn set(&mut self, name: &str, value: impl Into<String>) {
        self.0.insert(name.to_owned(), value.into());
    }

    /// Bindings from `ACP_REPLAY_BIND_<NAME>` variables.
    pub fn from_env() -> Bindings {
        let mut b = Bindings::default();
        for (key, value) in std::env::vars() {
            if let Some(name) = key.strip_prefix("ACP_REPLAY_BIND_")
                && is_name(name)
            {
                b.set(name, value);
            }
        }
        b
    }
}

fn is_name(s: &str) -> bool {
    let mut chars = s.chars();
    chars.next().is_some_and(|c| c.is_ascii_uppercase())
        && chars.all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_')
}

#[derive(Debug, PartialEq)]
enum Seg<'a> {
    Lit(&'a str),
    Var(&'a str),
}

/// Splits a pattern into literal text and `{{NAME}}` placeholders.
fn segments(pattern: &str) -> Vec<Seg<'_>> {
    let mut out = Vec::new();
    let mut rest = pattern;
    let mut lit_start = 0;
    let mut offset = 0;
    while let Some(open) = rest.find("{{") {
        let after = &rest[open + 2..];
        match after.find("}}") {
            Some(close) if is_name(&after[..close]) => {
                let at = offset + open;
                if at > lit_start {
                    out.push(Seg::Lit(&pattern[lit_start..at]));
                }
                out.push(Seg::Var(&after[..close]));
                let consumed = open + 2 + close + 2;
                offset += consumed;
                lit_start = offset;
                rest = &rest[consumed..];
            }
            _ => {
                offset += open + 1;
                rest = &rest[open + 1..];
            }
        }
    }
    if lit_start < pattern.len() {
        out.push(Seg::Lit(&pattern[lit_start..]));
    }
    out
}

fn match_segs(segs: &[Seg], text: &str, b: &mut Bindings) -> bool {
    let Some((first, rest)) = segs.split_first() else {
        return text.is_empty();
    };
    match first {
        Seg::Lit(lit) => text.strip_prefix(lit).is_some_and(|t| match_segs(rest, t, b)),
        Seg::Var(name) => {
            if let Some(value) = b.get(name) {
                let value = value.to_owned();
                return text.strip_prefix(value.as_str()).is_some_and(|t| match_segs(rest, t, b));
            }
            // Learn the shortest non-empty value that lets the rest match.
            let ends = text.char_indices().skip(1).map(|(i, _)| i).chain(std::iter::once(text.len()));
            for end in ends.filter(|&e| e > 0) {
                let mut trial = b.clone();
                trial.set(name, &text[..end]);
                if match_segs(rest, &text[end..], &mut trial) {
                    *b = trial;
                    return true;
                }
            }
            false
        }
    }
}

/// Whether `text` matches `pattern`; placeholders not yet bound are learnt into `b` (only on success).
pub fn match_str(pattern: &str, text: &str, b: &mut Bindings) -> bool {
    if !pattern.contains("{{") {
        return pattern == text;
    }
    let mut trial = b.clone();
    if match_segs(&segments(pattern), text, &mut trial) {
        *b = trial;
        true
    } else {
        false
    }
}

/// Where two frames first differ.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Difference {
    /// JSON pointer of the first difference ("" for the whole value).
    pub pointer: String,
    pub expected: String,
    pub got: String,
}

impl fmt::Display for Difference {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let at = if self.pointer.is_empty() { "the top" } else { &self.pointer };
        write!(f, "first difference at {at}: expected {}, got {}", self.expected, self.got)
    }
}

fn excerpt(v: &Value) -> String {
    cut(&v.to_string(), 400)
}

fn cut(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_owned();
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}… ({} bytes)", &s[..end], s.len())
}

fn escape_pointer(key: &str) -> String {
    key.replace('~', "~0").replace('/', "~1")
}

/// Compares `got` with the recorded `expected`; strings in `expected` may hold placeholders. Bindings learnt
/// on the way are kept only when the whole value matches.
pub fn match_value(expected: &Value, got: &Value, b: &mut Bindings) -> Result<(), Difference> {
    let mut trial = b.clone();
    let mut pointer = String::new();
    match_at(expected, got, &mut trial, &mut pointer)?;
    *b = trial;
    Ok(())
}

fn match_at(expected: &Value, got: &Value, b: &mut Bindings, pointer: &mut String) -> Result<(), Difference> {
    let differ = |pointer: &str, e: &Value, g: &Value, b: &Bindings| {
        let mut expected = excerpt(e);
        if let Value::String(s) = e
            && s.contains("{{")
        {
            let vars: Vec<String> = segments(s)
                .iter()
                .filter_map(
                    |seg| if let Seg::Var(n) = seg { b.get(n).map(|v| format!("{{{{{n}}}}} = {v:?}")) } else { None },
                )
                .collect();
            if !vars.is_empty() {
                expected = format!("{expected} (with {})", vars.join(", "));
            }
        }
        Difference { pointer: pointer.to_owned(), expected, got: excerpt(g) }
    };
    match (expected, got) {
        (Value::String(e), Value::String(g)) => {
            if match_str(e, g, b) {
                Ok(())
            } else {
                Err(differ(pointer, expected, got, b))
            }
        }
        (Value::Array(e), Value::Array(g)) => {
            for (i, (ei, gi)) in e.iter().zip(g).enumerate() {
                let len = pointer.len();
                pointer.push_str(&format!("/{i}"));
                match_at(ei, gi, b, pointer)?;
                pointer.truncate(len);
            }
            if e.len() != g.len() {
                let i = e.len().min(g.len());
                let len = pointer.len();
                pointer.push_str(&format!("/{i}"));
                let (ev, gv) = (e.get(i).cloned().unwrap_or(Value::Null), g.get(i).cloned().unwrap_or(Value::Null));
                let mut d = differ(pointer, &ev, &gv, b);
                pointer.truncate(len);
                if e.len() < g.len() {
                    d.expected = format!("no item (array of {})", e.len());
                } else {
                    d.got = format!("no item (array of {})", g.len());
                }
                return Err(d);
            }
            Ok(())
        }
        (Value::Object(e), Value::Object(g)) => {
            for (key, ev) in e {
                let len = pointer.len();
                pointer.push('/');
                pointer.push_str(&escape_pointer(key));
                match g.get(key) {
                    Some(gv) => match_at(ev, gv, b, pointer)?,
                    None => {
                        return Err(Difference {
                            pointer: pointer.clone(),
                            expected: excerpt(ev),
                            got: "no such key".into(),
                        });
                    }
                }
                pointer.truncate(len);
            }
            if let Some((key, gv)) = g.iter().find(|(k, _)| !e.contains_key(*k)) {
                return Err(Difference {
                    pointer: format!("{pointer}/{}", escape_pointer(key)),
                    expected: "no such key".into(),
                    got: excerpt(gv),
                });
            }
            Ok(())
        }
        _ if expected == got => Ok(()),
        _ => Err(differ(pointer, expected, got, b)),
    }
}

/// How a placeholder's value is escaped when filled into text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Escape {
    /// Inside JSON text: as the inside of a JSON string.
    Json,
    Raw,
}

/// Fills placeholders into `text`. A name not bound is asked of `fallback` (and bound); still unknown, it is
/// left as it is and reported in the returned list.
pub fn fill(
    text: &str,
    escape: Escape,
    b: &mut Bindings,
    fallback: &dyn Fn(&str) -> Option<String>,
) -> (String, Vec<String>) {
    if !text.contains("{{") {
        return (text.to_owned(), Vec::new());
    }
    let mut out = String::with_capacity(text.len());
    let mut unknown = Vec::new();
    for seg in segments(text) {
        match seg {
            Seg::Lit(l) => out.push_str(l),
            Seg::Var(name) => {
                let value = match b.get(name) {
                    Some(v) => Some(v.to_owned()),
                    None => fallback(name).inspect(|v| b.set(name, v.clone())),
                };
                match (value, escape) {
                    (Some(v), Escape::Raw) => out.push_str(&v),
                    (Some(v), Escape::Json) => {
                        let quoted = Value::from(v).to_string();
                        out.push_str(&quoted[1..quoted.len() - 1]);
                    }
                    (None, _) => {
                        out.push_str(&format!("{{{{{name}}}}}"));
                        if !unknown.iter().any(|u| u == name) {
                            unknown.push(name.to_owned());
                        }
                    }
                }
            }
        }
    }
    (out, unknown)
}

/// The player's fallback: values from its environment.
pub fn env_fallback(name: &str) -> Option<String> {
    let var = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
    match name {
        "HOME" | "KIMI_CODE_HOME" | "CODEX_HOME" | "GROK_HOME" => var(name),
        "TMPDIR" => var("TMPDIR").or_else(|| Some("/tmp".into())),
        "CWD" => std::env::current_dir().ok().map(|d| d.to_string_lossy().into_owned()),
        _ => None,
    }
}

// ---------------------------------------------------------------------------------------------------------------
// Scripts: one side of a recording

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
            Side::Agent => r.edge == Edge::ShimToAgent,
            Side::Client => r.edge == Edge::ShimToClient,
        }
    }

    fn is_sent(&self, r: &Record) -> bool {
        match self.side {
            Side::Agent => matches!(r.edge, Edge::AgentToShim | Edge::AgentToFile),
            Side::Client => r.edge == Edge::ClientToShim,
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

// ---------------------------------------------------------------------------------------------------------------
// File operations (the player's side of Kimi's session files)

/// Writes a whole file, private like every file the shim's tools write (src/private_file.rs).
fn write_whole(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    private_file::open(path, private_file::Write::Replace)?.write_all(bytes)
}

/// Performs a file operation whose placeholders are filled. Paths must be absolute and free of `..`.
pub fn apply_file_op(op: &FileOp) -> Result<(), String> {
    let path = checked_path(&op.path)?;
    let bytes = || -> Result<Vec<u8>, String> {
        match (&op.data, &op.base64) {
            (Some(d), None) => Ok(d.as_bytes().to_vec()),
            (None, Some(b)) => base64::engine::general_purpose::STANDARD
                .decode(b)
                .map_err(|e| format!("{}: \"base64\" is not valid base64: {e}", op.path)),
            (None, None) => Ok(Vec::new()),
            (Some(_), Some(_)) => Err(format!("{}: both \"data\" and \"base64\"", op.path)),
        }
    };
    let io = |what: &str, e: std::io::Error| format!("cannot {what} {}: {e}", path.display());
    let parent = |p: &Path| -> Result<(), String> {
        match p.parent() {
            Some(dir) => std::fs::create_dir_all(dir).map_err(|e| io("create the folder of", e)),
            None => Ok(()),
        }
    };
    match op.op {
        FileOpKind::Append => {
            parent(&path)?;
            let mut f = private_file::open(&path, private_file::Write::Append).map_err(|e| io("open", e))?;
            f.write_all(&bytes()?).map_err(|e| io("append to", e))
        }
        FileOpKind::Write => {
            parent(&path)?;
            write_whole(&path, &bytes()?).map_err(|e| io("write", e))
        }
        FileOpKind::Replace => {
            parent(&path)?;
            let mut tmp = path.clone().into_os_string();
            tmp.push(".tmp.replay");
            let tmp = PathBuf::from(tmp);
            write_whole(&tmp, &bytes()?).map_err(|e| io("write", e))?;
            std::fs::rename(&tmp, &path).map_err(|e| io("rename over", e))
        }
        FileOpKind::Mkdir => std::fs::create_dir_all(&path).map_err(|e| io("create", e)),
        FileOpKind::Remove => std::fs::remove_file(&path).map_err(|e| io("remove", e)),
        FileOpKind::Rename => {
            let to = checked_path(op.to.as_deref().ok_or_else(|| format!("{}: \"rename\" without \"to\"", op.path))?)?;
            parent(&to)?;
            std::fs::rename(&path, &to).map_err(|e| io("rename", e))
        }
    }
}

fn checked_path(p: &str) -> Result<PathBuf, String> {
    if p.contains("{{") {
        return Err(format!("{p}: a placeholder in the path has no value (set ACP_REPLAY_BIND_<NAME>)"));
    }
    let path = PathBuf::from(p);
    if !path.is_absolute() || path.components().any(|c| c == Component::ParentDir) {
        return Err(format!("{p}: file paths must be absolute, without \"..\""));
    }
    Ok(path)
}

// ---------------------------------------------------------------------------------------------------------------
// Recording: trace -> fixture

/// Replaces machine-specific values by placeholders.
#[derive(Debug, Clone, Default)]
pub struct Normaliser {
    /// (literal, placeholder name), longest literal first.
    subs: Vec<(String, String)>,
}

/// Paths of this machine that must not be committed.
const FORBIDDEN: &[&str] = &["/tmp/", "/root/", "/home/", "/work/"];

impl Normaliser {
    /// The usual substitutions for a live run in `root` (HOME = root/home, cwd = root/work, TMPDIR = root/tmp).
    pub fn for_live_root(root: &Path) -> Normaliser {
        let mut n = Normaliser::default();
        for variant in path_variants(root) {
            n.add(&format!("{variant}/home/.kimi-code"), "KIMI_CODE_HOME");
            n.add(&format!("{variant}/home"), "HOME");
            n.add(&format!("{variant}/work"), "CWD");
            n.add(&format!("{variant}/tmp"), "TMPDIR");
            n.add(&variant, "ROOT");
        }
        n
    }

    /// Adds a substitution (and its canonical spelling when it differs).
    pub fn add(&mut self, literal: &str, name: &str) {
        let literal = literal.trim_end_matches('/');
        if literal.is_empty() || !is_name(name) {
            return;
        }
        for variant in path_variants(Path::new(literal)) {
            if !self.subs.iter().any(|(l, _)| *l == variant) {
                self.subs.push((variant, name.to_owned()));
            }
        }
        self.subs.sort_by(|a, b| b.0.len().cmp(&a.0.len()).then_with(|| a.0.cmp(&b.0)));
    }

    /// Normalises one piece of text (a frame's JSON text, a line, file data).
    pub fn apply(&self, text: &str) -> String {
        let mut out = text.to_owned();
        for (literal, name) in &self.subs {
            if out.contains(literal.as_str()) {
                out = out.replace(literal.as_str(), &format!("{{{{{name}}}}}"));
            }
        }
        shim_pid(&out)
    }

    /// Names of this machine still present in `text`.
    pub fn leftovers(&self, text: &str) -> Vec<String> {
        let mut found: Vec<String> = FORBIDDEN.iter().filter(|p| text.contains(*p)).map(|p| (*p).to_owned()).collect();
        if let Ok(home) = std::env::var("HOME")
            && home.len() > 1
            && text.contains(&format!("{home}/"))
        {
            found.push(home);
        }
        found
    }
}

fn path_variants(p: &Path) -> Vec<String> {
    let mut out = vec![p.to_string_lossy().trim_end_matches('/').to_owned()];
    if let Ok(canon) = std::fs::canonicalize(p) {
        let canon = canon.to_string_lossy().trim_end_matches('/').to_owned();
        if !out.contains(&canon) {
            out.push(canon);
        }
    }
    out
}

/// `coda-shim-<pid>-` (the shim's own request ids) -> `coda-shim-{{SHIM_PID}}-`.
fn shim_pid(text: &str) -> String {
    const PREFIX: &str = "coda-shim-";
    if !text.contains(PREFIX) {
        return text.to_owned();
    }
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find(PREFIX) {
        let after = &rest[at + PREFIX.len()..];
        let digits = after.bytes().take_while(u8::is_ascii_digit).count();
        out.push_str(&rest[..at + PREFIX.len()]);
        if digits > 0 && after.as_bytes().get(digits) == Some(&b'-') {
            out.push_str("{{SHIM_PID}}");
            rest = &after[digits..];
        } else {
            rest = after;
        }
    }
    out.push_str(rest);
    out
}

/// A line of a file log beside a trace (`--files`).
#[derive(Deserialize)]
struct FileLogLine {
    ts: String,
    /// `"open"`: state that existed before the agent frame whose handling read it (a session folder found
    /// when its `session/new` answer arrived); goes before the last `agent->shim` record at or before `ts`.
    #[serde(default)]
    at: Option<String>,
    #[serde(flatten)]
    op: FileOp,
}

/// Turns trace text (and an optional file log) into fixture records, normalised.
pub fn record(trace: &str, files: Option<&str>, n: &Normaliser) -> Result<Vec<Record>, String> {
    // Absolute times: of the trace lines (parse_records makes them relative) and of the file log.
    let stamps: Vec<Option<SystemTime>> = trace
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            crate::json::from_str::<Value>(l)
                .ok()
                .and_then(|v| v.get("ts").and_then(Value::as_str).map(str::to_owned))
                .and_then(|ts| humantime::parse_rfc3339_weak(&ts).ok())
        })
        .collect();
    let trace_records = parse_records(trace)?;
    let mut file_records: Vec<(SystemTime, bool, Record)> = Vec::new();
    for (i, line) in files.unwrap_or_default().lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let f: FileLogLine =
            crate::json::from_str(line).map_err(|e| format!("file log line {}: not a record: {e}", i + 1))?;
        let ts = humantime::parse_rfc3339_weak(&f.ts)
            .map_err(|e| format!("file log line {}: bad \"ts\" {:?}: {e}", i + 1, f.ts))?;
        if ["/.index-dirty/", "/logs/", ".tmp."].iter().any(|s| f.op.path.contains(s)) {
            continue;
        }
        let r = Record { edge: Edge::AgentToFile, t: None, shim: false, body: Body::File(f.op), lineno: 0 };
        file_records.push((ts, f.at.as_deref() == Some("open"), r));
    }
    if stamps.len() != trace_records.len() || (!file_records.is_empty() && stamps.iter().any(Option::is_none)) {
        return Err("merging a file log needs the trace's \"ts\" on every record (a raw --trace-file)".into());
    }
    // Stable: writes of the same instant keep the log's order.
    file_records.sort_by_key(|(ts, _, _)| *ts);
    // Trace records keep their order; a file write goes after every trace record with the same or an earlier
    // ts, an "open" one just before the last agent frame among those.
    let mut timed: Vec<(Option<SystemTime>, Record)> = Vec::new();
    let mut pending = file_records.into_iter().peekable();
    let place = |timed: &mut Vec<(Option<SystemTime>, Record)>, fts: SystemTime, open: bool, f: Record| {
        let at = open
            .then(|| timed.iter().rposition(|(ts, r)| r.edge == Edge::AgentToShim && ts.is_some_and(|t| t <= fts)))
            .flatten();
        match at {
            Some(i) => timed.insert(i, (Some(fts), f)),
            None => timed.push((Some(fts), f)),
        }
    };
    for (r, ts) in trace_records.into_iter().zip(stamps) {
        if let Some(ts) = ts {
            while let Some((fts, open, f)) = pending.next_if(|(fts, _, _)| *fts < ts) {
                place(&mut timed, fts, open, f);
            }
        }
        timed.push((ts, r));
    }
    for (fts, open, f) in pending {
        place(&mut timed, fts, open, f);
    }
    let start = timed.iter().filter_map(|x| x.0).min();
    let mut out: Vec<Record> = Vec::new();
    for (ts, mut r) in timed {
        if let (Some(ts), Some(start)) = (ts, start) {
            r.t = ts.duration_since(start).ok().map(|d| d.as_millis() as u64);
        }
        out.push(r);
    }
    for (i, r) in out.iter_mut().enumerate() {
        r.lineno = i + 1;
        r.body = match std::mem::replace(&mut r.body, Body::Line(String::new())) {
            Body::Frame(text) => {
                let norm = n.apply(&text);
                if crate::json::from_str::<Value>(&norm).is_err() {
                    return Err(format!("record {}: the frame is no longer JSON after normalising", i + 1));
                }
                Body::Frame(norm)
            }
            Body::Line(text) => Body::Line(n.apply(&text)),
            Body::File(mut op) => {
                op.path = n.apply(&op.path);
                op.to = op.to.map(|t| n.apply(&t));
                op.data = op.data.map(|d| n.apply(&d));
                if !op.path.starts_with("{{") {
                    return Err(format!(
                        "record {}: file path {:?} is outside the placeholders' folders",
                        i + 1,
                        op.path
                    ));
                }
                Body::File(op)
            }
        };
    }
    Ok(out)
}

/// Renders records as fixture text.
pub fn render(records: &[Record]) -> String {
    let mut out = String::new();
    for r in records {
        out.push_str(&r.to_line());
        out.push('\n');
    }
    out
}

// ---------------------------------------------------------------------------------------------------------------
// Checking a shim binary against a fixture (the test side)

/// How to run [`check`].
pub struct CheckOptions {
    /// The shim binary (`coda-grok`, ...).
    pub shim: PathBuf,
    /// The player binary (`acp-replay`).
    pub player: PathBuf,
    /// `codex`, `kimi`, `grok`, `opencode`: names the `CODA_<AGENT>_COMMAND` variable.
    pub agent: String,
    /// Longest wait for one frame.
    pub timeout: Duration,
    /// Extra environment for the shim.
    pub env: Vec<(String, String)>,
}

/// What a successful check did.
#[derive(Debug, Clone)]
pub struct CheckReport {
    pub sent: usize,
    pub received: usize,
    pub elapsed: Duration,
}

/// A fresh directory under the system temp dir, removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new() -> std::io::Result<TempDir> {
        use std::sync::atomic::{AtomicU64, Ordering};
        static COUNTER: AtomicU64 = AtomicU64::new(0);
        let nanos = SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).map(|d| d.subsec_nanos()).unwrap_or(0);
        let name = format!("acp-replay-{}-{nanos}-{}", std::process::id(), COUNTER.fetch_add(1, Ordering::Relaxed));
        let dir = std::env::temp_dir().join(name);
        std::fs::create_dir_all(&dir)?;
        Ok(TempDir(dir))
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Runs the shim with the player as its child, drives the recorded client frames and compares what the client
/// receives with the recording. The error says what differed, with the shim's (and the player's) stderr.
pub fn check(fixture: &Path, opts: &CheckOptions) -> Result<CheckReport, String> {
    let records = load(fixture)?;
    let temp = TempDir::new().map_err(|e| format!("cannot make a temp dir: {e}"))?;
    let root = temp.0.clone();
    let mut bindings = Bindings::default();
    let path = |p: PathBuf| p.to_string_lossy().into_owned();
    for (name, dir) in [
        ("ROOT", root.clone()),
        ("HOME", root.join("home")),
        ("KIMI_CODE_HOME", root.join("home/.kimi-code")),
        ("CWD", root.join("work")),
        ("TMPDIR", root.join("tmp")),
    ] {
        std::fs::create_dir_all(&dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
        bindings.set(name, path(dir));
    }
    let player = std::fs::canonicalize(&opts.player).map_err(|e| format!("{}: {e}", opts.player.display()))?;
    let fixture_abs = std::fs::canonicalize(fixture).map_err(|e| format!("{}: {e}", fixture.display()))?;
    let player = shell_words::join([path(player), "play".into(), path(fixture_abs)]);
    // The shim runs in the temp work dir: a relative path would no longer name it.
    let shim = std::fs::canonicalize(&opts.shim).map_err(|e| format!("{}: {e}", opts.shim.display()))?;
    let mut cmd = Command::new(&shim);
    cmd.env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("HOME", bindings.get("HOME").unwrap_or_default())
        .env("TMPDIR", bindings.get("TMPDIR").unwrap_or_default())
        .env("KIMI_CODE_HOME", bindings.get("KIMI_CODE_HOME").unwrap_or_default())
        .env(format!("CODA_{}_COMMAND", opts.agent.to_ascii_uppercase()), player)
        .current_dir(root.join("work"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (name, value) in &bindings.0 {
        cmd.env(format!("ACP_REPLAY_BIND_{name}"), value);
    }
    // The player's own account of a failure, whole even when the shim cuts its child's stderr short.
    let report_file = root.join("player-report.txt");
    cmd.env("ACP_REPLAY_REPORT", &report_file);
    for key in ["CODA_SHIM_LOG", "ACP_REPLAY_FILE_SETTLE_MS"] {
        if let Some(v) = std::env::var_os(key) {
            cmd.env(key, v);
        }
    }
    cmd.envs(opts.env.iter().map(|(k, v)| (k, v)));
    let mut child = cmd.spawn().map_err(|e| format!("cannot start {}: {e}", opts.shim.display()))?;
    let (Some(mut stdin), Some(stdout), Some(stderr)) = (child.stdin.take(), child.stdout.take(), child.stderr.take())
    else {
        let _ = child.kill();
        return Err("the shim's pipes are missing".into());
    };
    let (tx, rx) = mpsc::channel::<Result<String, String>>();
    std::thread::spawn(move || {
        let mut r = BufReader::new(stdout);
        loop {
            let mut buf = Vec::new();
            match r.read_until(b'\n', &mut buf) {
                Ok(0) => break,
                Ok(_) => {
                    let line = String::from_utf8_lossy(&buf).trim_end_matches(['\n', '\r']).to_owned();
                    if tx.send(Ok(line)).is_err() {
                        break;
                    }
                }
                Err(e) => {
                    let _ = tx.send(Err(e.to_string()));
                    break;
                }
            }
        }
    });
    let err_thread = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = std::io::Read::read_to_string(&mut BufReader::new(stderr), &mut s);
        s
    });

    let started = Instant::now();
    let mut script = Script::client(records, bindings);
    let (mut sent, mut received) = (0, 0);
    let outcome: Result<(), String> = (|| {
        loop {
            match script.next_step() {
                Step::Send { line, lineno, .. } => {
                    stdin
                        .write_all(line.as_bytes())
                        .and_then(|_| stdin.write_all(b"\n"))
                        .and_then(|_| stdin.flush())
                        .map_err(|e| format!("cannot send the client frame of line {lineno}: {e}"))?;
                    sent += 1;
                }
                Step::File { .. } => {}
                Step::Expect => {
                    let line = match rx.recv_timeout(opts.timeout) {
                        Ok(Ok(line)) if line.trim().is_empty() => continue,
                        Ok(Ok(line)) => line,
                        Ok(Err(e)) => return Err(format!("cannot read the shim's stdout: {e}")),
                        Err(_) => {
                            let want = script.expected_now().first().map(|r| (r.lineno, r.to_line()));
                            let (lineno, want) = want.unwrap_or_default();
                            return Err(format!(
                                "no frame from the shim within {:?}; the recording expects (line {lineno}):\n  {}",
                                opts.timeout,
                                cut(&want, 4000)
                            ));
                        }
                    };
                    received += 1;
                    script.received(&line).map_err(|m| format!("the client {m}"))?;
                }
                Step::Done => return Ok(()),
            }
        }
    })();
    drop(stdin);
    let deadline = Instant::now() + opts.timeout;
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break Some(status),
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(5)),
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                break None;
            }
        }
    };
    let extra: Vec<String> = rx.try_iter().filter_map(Result::ok).filter(|l| !l.trim().is_empty()).collect();
    let stderr = err_thread.join().unwrap_or_default();
    let report = std::fs::read_to_string(&report_file).unwrap_or_default();
    let report = if report.is_empty() { String::new() } else { format!("\n--- player report ---\n{report}") };
    let with_stderr = |msg: String| format!("{}: {msg}{report}\n--- shim stderr ---\n{stderr}", fixture.display());
    outcome.map_err(&with_stderr)?;
    if let Some(first) = extra.first() {
        return Err(with_stderr(format!(
            "the client received {} frame(s) after the end of the recording; first: {}",
            extra.len(),
            cut(first, 4000)
        )));
    }
    match status {
        Some(s) if s.success() => {}
        Some(s) => return Err(with_stderr(format!("the shim exited with {s} after the recording"))),
        None => {
            return Err(with_stderr(format!("the shim did not exit within {:?} of its stdin closing", opts.timeout)));
        }
    }
    if !script.unknown.is_empty() {
        return Err(with_stderr(format!("placeholders without a value: {:?}", script.unknown)));
    }
    Ok(CheckReport { sent, received, elapsed: started.elapsed() })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn b(pairs: &[(&str, &str)]) -> Bindings {
        let mut b = Bindings::default();
        for (k, v) in pairs {
            b.set(k, *v);
        }
        b
    }

    #[test]
    fn segments_split_placeholders_only() {
        assert_eq!(segments("a{{CWD}}/b"), vec![Seg::Lit("a"), Seg::Var("CWD"), Seg::Lit("/b")]);
        assert_eq!(segments("{{x}} {{A B}}"), vec![Seg::Lit("{{x}} {{A B}}")]);
        assert_eq!(segments("{{{HOME}}}"), vec![Seg::Lit("{"), Seg::Var("HOME"), Seg::Lit("}")]);
    }

    #[test]
    fn unbound_placeholders_are_learnt_and_then_hold() {
        let mut bind = Bindings::default();
        assert!(match_str("{{CWD}}/src/main.rs", "/x/y/src/main.rs", &mut bind));
        assert_eq!(bind.get("CWD"), Some("/x/y"));
        assert!(match_str("cd {{CWD}}", "cd /x/y", &mut bind));
        assert!(!match_str("cd {{CWD}}", "cd /x/z", &mut bind));
        assert!(!match_str("{{HOME}}/a", "/h/b", &mut bind));
        assert_eq!(bind.get("HOME"), None, "a failed match learns nothing");
        assert!(match_str("coda-shim-{{SHIM_PID}}-0", "coda-shim-4711-0", &mut bind));
        assert_eq!(bind.get("SHIM_PID"), Some("4711"));
    }

    #[test]
    fn match_value_points_at_the_first_difference() {
        let mut bind = b(&[("CWD", "/w")]);
        let expected = json!({"id":1,"params":{"cwd":"{{CWD}}","list":[1,2,3]}});
        assert!(match_value(&expected, &json!({"id":1,"params":{"cwd":"/w","list":[1,2,3]}}), &mut bind).is_ok());
        let d = match_value(&expected, &json!({"id":1,"params":{"cwd":"/v","list":[1,2,3]}}), &mut bind).unwrap_err();
        assert_eq!(d.pointer, "/params/cwd");
        assert!(d.expected.contains("{{CWD}} = \"/w\""), "{d}");
        let d = match_value(&expected, &json!({"id":1,"params":{"cwd":"/w","list":[1,2]}}), &mut bind).unwrap_err();
        assert_eq!(d.pointer, "/params/list/2");
        let d = match_value(&expected, &json!({"id":1,"params":{"cwd":"/w","list":[1,2,3],"x~/":0}}), &mut bind)
            .unwrap_err();
        assert_eq!(d.pointer, "/params/x~0~1");
        let d = match_value(&expected, &json!({"id":2,"params":{}}), &mut bind).unwrap_err();
        assert_eq!(d.pointer, "/id");
        // A learnt value is kept only when the whole frame matched.
        let mut fresh = Bindings::default();
        assert!(match_value(&json!(["{{A}}", 1]), &json!(["x", 2]), &mut fresh).is_err());
        assert_eq!(fresh.get("A"), None);
    }

    #[test]
    fn fill_escapes_for_json_and_reports_unknown_names() {
        let mut bind = b(&[("HOME", "/h/\"q\"")]);
        let (out, unknown) = fill(r#"{"p":"{{HOME}}/x","q":"{{NOPE}}"}"#, Escape::Json, &mut bind, &|_| None);
        assert_eq!(out, r#"{"p":"/h/\"q\"/x","q":"{{NOPE}}"}"#);
        assert_eq!(unknown, vec!["NOPE".to_owned()]);
        let (out, _) = fill("{{TMPDIR}}/a", Escape::Raw, &mut bind, &|n| (n == "TMPDIR").then(|| "/t".into()));
        assert_eq!(out, "/t/a");
        assert_eq!(bind.get("TMPDIR"), Some("/t"), "a fallback value is bound for the rest of the run");
    }

    #[test]
    fn normaliser_replaces_longest_paths_first_and_the_shim_pid() {
        let n = Normaliser::for_live_root(Path::new("/nonexistent-root/r1"));
        let text = r#"{"cwd":"/nonexistent-root/r1/work","h":"/nonexistent-root/r1/home/.kimi-code/sessions","t":"/nonexistent-root/r1/tmp/x","r":"/nonexistent-root/r1","id":"coda-shim-123-4","s":"coda-shim-x-1"}"#;
        assert_eq!(
            n.apply(text),
            r#"{"cwd":"{{CWD}}","h":"{{KIMI_CODE_HOME}}/sessions","t":"{{TMPDIR}}/x","r":"{{ROOT}}","id":"coda-shim-{{SHIM_PID}}-4","s":"coda-shim-x-1"}"#
        );
        assert_eq!(n.leftovers("see /tmp/foo and /work/x"), vec!["/tmp/".to_owned(), "/work/".to_owned()]);
        assert!(n.leftovers("{{CWD}}/a").is_empty());
    }

    fn rec(edge: Edge, frame: &str) -> Record {
        Record { edge, t: None, shim: false, body: Body::Frame(frame.into()), lineno: 0 }
    }

    #[test]
    fn the_player_accepts_a_run_of_expected_frames_in_any_order_and_fills_replies() {
        let records = vec![
            rec(Edge::ClientToShim, r#"{"jsonrpc":"2.0","id":1,"method":"a"}"#),
            rec(Edge::ShimToAgent, r#"{"jsonrpc":"2.0","id":1,"method":"a","params":{"cwd":"{{CWD}}"}}"#),
            rec(Edge::ShimToAgent, r#"{"jsonrpc":"2.0","id":"coda-shim-{{SHIM_PID}}-0","method":"b"}"#),
            rec(Edge::AgentToShim, r#"{"jsonrpc":"2.0","id":"coda-shim-{{SHIM_PID}}-0","result":"{{CWD}}"}"#),
            rec(Edge::ShimToClient, r#"{"jsonrpc":"2.0","id":1,"result":{}}"#),
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
            vec![rec(Edge::ShimToAgent, r#"{"jsonrpc":"2.0","id":1,"method":"session/new","params":{"cwd":"/a"}}"#)];
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
            rec(Edge::ShimToClient, r#"{"jsonrpc":"2.0","method":"x"}"#),
            rec(Edge::ShimToClient, r#"{"jsonrpc":"2.0","method":"y"}"#),
            rec(Edge::ClientToShim, r#"{"jsonrpc":"2.0","method":"z"}"#),
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
    fn parses_traces_and_fixtures_and_rejects_bad_records() {
        let trace = concat!(
            r#"{"ts":"2026-01-01T00:00:00.100Z","dir":"client->shim","frame":{"jsonrpc":"2.0","id":0,"method":"initialize"}}"#,
            "\n\n",
            r#"{"ts":"2026-01-01T00:00:00.350Z","dir":"agent->shim","line":"hello"}"#,
            "\n",
            r#"{"t":5,"dir":"agent->file","file":{"op":"append","path":"{{KIMI_CODE_HOME}}/w","data":"x\n"}}"#,
        );
        let r = parse_records(trace).unwrap();
        assert_eq!(r.len(), 3);
        assert_eq!((r[0].t, r[1].t, r[2].t), (Some(0), Some(250), Some(5)));
        assert_eq!(r[0].body, Body::Frame(r#"{"jsonrpc":"2.0","id":0,"method":"initialize"}"#.into()));
        assert_eq!(r[1].lineno, 3);
        assert!(matches!(&r[2].body, Body::File(f) if f.op == FileOpKind::Append));
        assert!(parse_records(r#"{"dir":"sideways","line":"x"}"#).unwrap_err().contains("unknown \"dir\""));
        assert!(parse_records(r#"{"dir":"agent->shim"}"#).unwrap_err().contains("exactly one"));
        assert!(parse_records(r#"{"dir":"agent->shim","file":{"op":"mkdir","path":"{{HOME}}"}}"#).is_err());
        assert!(parse_records("not json").is_err());
    }

    #[test]
    fn record_normalises_and_merges_the_file_log_by_time() {
        let n = Normaliser::for_live_root(Path::new("/nonexistent-root/r2"));
        let trace = concat!(
            r#"{"ts":"2026-01-01T00:00:00.000Z","dir":"agent->shim","frame":{"jsonrpc":"2.0","id":1,"result":{"sessionId":"s"}}}"#,
            "\n",
            r#"{"ts":"2026-01-01T00:00:00.010Z","dir":"agent->shim","frame":{"jsonrpc":"2.0","method":"u","params":{"cwd":"/nonexistent-root/r2/work"}}}"#,
            "\n",
        );
        let files = concat!(
            r#"{"ts":"2026-01-01T00:00:00.005Z","op":"append","path":"/nonexistent-root/r2/home/.kimi-code/sessions/w","data":"{\"cwd\":\"/nonexistent-root/r2/work\"}\n"}"#,
            "\n",
            r#"{"ts":"2026-01-01T00:00:00.006Z","op":"write","path":"/nonexistent-root/r2/home/.kimi-code/sessions/.index-dirty/s.1"}"#,
            "\n",
            r#"{"ts":"2026-01-01T00:00:00.010Z","op":"replace","path":"/nonexistent-root/r2/home/.kimi-code/state.json","data":"{}"}"#,
        );
        let out = record(trace, Some(files), &n).unwrap();
        let edges: Vec<Edge> = out.iter().map(|r| r.edge).collect();
        assert_eq!(edges, vec![Edge::AgentToShim, Edge::AgentToFile, Edge::AgentToShim, Edge::AgentToFile]);
        assert_eq!(out.iter().map(|r| r.t).collect::<Vec<_>>(), vec![Some(0), Some(5), Some(10), Some(10)]);
        let Body::File(op) = &out[1].body else { panic!() };
        assert_eq!(op.path, "{{KIMI_CODE_HOME}}/sessions/w");
        assert_eq!(op.data.as_deref(), Some("{\"cwd\":\"{{CWD}}\"}\n"));
        assert_eq!(out[2].body, Body::Frame(r#"{"jsonrpc":"2.0","method":"u","params":{"cwd":"{{CWD}}"}}"#.into()));
        // Rendered and parsed back, the records are the same.
        let again = parse_records(&render(&out)).unwrap();
        assert_eq!(again, out);
    }

    #[test]
    fn state_read_when_a_session_opened_goes_before_the_frame_that_opened_it() {
        let trace = concat!(
            r#"{"ts":"2026-01-01T00:00:00.000Z","dir":"agent->shim","frame":{"jsonrpc":"2.0","id":1,"result":{"sessionId":"s"}}}"#,
            "\n",
            r#"{"ts":"2026-01-01T00:00:00.000Z","dir":"shim->client","frame":{"jsonrpc":"2.0","id":1,"result":{"sessionId":"s"}}}"#,
            "\n",
        );
        let files = concat!(
            r#"{"ts":"2026-01-01T00:00:00.000400Z","at":"open","op":"append","path":"{{KIMI_CODE_HOME}}/w","data":"h\n"}"#,
            "\n",
            r#"{"ts":"2026-01-01T00:00:00.000500Z","op":"append","path":"{{KIMI_CODE_HOME}}/w","data":"x\n"}"#,
        );
        let out = record(trace, Some(files), &Normaliser::default()).unwrap();
        let edges: Vec<Edge> = out.iter().map(|r| r.edge).collect();
        assert_eq!(edges, vec![Edge::AgentToFile, Edge::AgentToShim, Edge::ShimToClient, Edge::AgentToFile]);
        let fixture = concat!(r#"{"t":0,"dir":"agent->shim","line":"x"}"#, "\n");
        assert!(record(fixture, Some(files), &Normaliser::default()).unwrap_err().contains("needs the trace's"));
    }

    #[test]
    fn file_ops_replay_into_the_bound_folder() {
        let dir = TempDir::new().unwrap();
        let root = dir.0.to_string_lossy().into_owned();
        let records = vec![
            Record {
                edge: Edge::AgentToFile,
                t: None,
                shim: false,
                body: Body::File(FileOp {
                    op: FileOpKind::Append,
                    path: "{{KIMI_CODE_HOME}}/s/wire.jsonl".into(),
                    data: Some("{\"cwd\":\"{{CWD}}\"}\n".into()),
                    base64: None,
                    to: None,
                }),
                lineno: 1,
            },
            Record {
                edge: Edge::AgentToFile,
                t: None,
                shim: false,
                body: Body::File(FileOp {
                    op: FileOpKind::Replace,
                    path: "{{KIMI_CODE_HOME}}/s/out.log".into(),
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
            b(&[("KIMI_CODE_HOME", &root), ("CWD", "/c\"d")]),
            Box::new(|_| None),
        );
        for _ in 0..2 {
            let Step::File { op, .. } = p.next_step() else { panic!() };
            apply_file_op(&op).unwrap();
        }
        assert_eq!(std::fs::read_to_string(dir.0.join("s/wire.jsonl")).unwrap(), "{\"cwd\":\"/c\\\"d\"}\n");
        assert_eq!(std::fs::read(dir.0.join("s/out.log")).unwrap(), b"hi");
        let bad = FileOp { op: FileOpKind::Write, path: format!("{root}/../x"), data: None, base64: None, to: None };
        assert!(apply_file_op(&bad).unwrap_err().contains("without \"..\""));
        let unbound = FileOp { op: FileOpKind::Write, path: "{{NOPE}}/x".into(), data: None, base64: None, to: None };
        assert!(apply_file_op(&unbound).unwrap_err().contains("no value"));
    }
}

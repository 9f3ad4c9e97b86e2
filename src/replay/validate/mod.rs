//! Frames against ACP's JSON Schema and Coda's shapes: `acp-replay validate`, and the check every test runs on
//! what a shim writes.
//!
//! [`Checker`] reads a trace one record at a time and follows both conversations ([`crate::replay::rpc`]), so
//! an answer is checked against the result of the method it answers. Each frame is checked where it first
//! appears: a peer's as it came (`client->shim`, `agent->shim`), the shim's where it wrote it (`shim->agent`,
//! `shim->client` with `"shim": true`: made or changed by the shim). A frame the shim passed on untouched is
//! the peer's, already checked. A break the shim's frame only carries over from the frame it edited (the same
//! rule at the same place) is the peer's too ([`Finding::inherited`]). Only the shim's own breaks are errors
//! ([`Finding::is_shims`]); peers' are facts to report, since real CLIs break the schema in places.
//!
//! Where the checks run: [`crate::replay::check()`] (every fixture replay), `relay::testing::Pair` (every
//! `Pair` test) and the integration tests' shim runner (`tests/support/shim.rs`: every binary and live test).

pub mod rules;
pub mod schema;

use std::collections::BTreeMap;
use std::fmt;
use std::io::BufRead;

pub use schema::{ACP_SCHEMA_VERSION, Party, schemas};

use super::rpc::{Conversation, Shape, Side, shape, side_of};
use super::view::changes::{Found, Linker};
use super::view::read::{BadLine, Line, Reader, Record};
use crate::trace::Dir;
use rules::Answering;

/// Whose frame broke a rule.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Whose {
    /// The shim made or changed it.
    Shim,
    /// Coda's (or the test's client's), as it came.
    Client,
    /// The CLI's, as it came.
    Agent,
}

impl Whose {
    pub fn as_str(self) -> &'static str {
        match self {
            Whose::Shim => "shim",
            Whose::Client => "client",
            Whose::Agent => "agent",
        }
    }
}

/// One rule one frame breaks.
#[derive(Debug, Clone, PartialEq)]
pub struct Finding {
    /// The record's line in the trace.
    pub line: usize,
    pub dir: Dir,
    pub whose: Whose,
    /// The shim's frame breaks it only because the frame it edited did.
    pub inherited: bool,
    /// The frame's method, or for an answer the method it answers.
    pub method: Option<String>,
    /// Where in the frame (a JSON pointer).
    pub at: String,
    /// The rule: `acp#<schema location>`, `coda#<schema location>`, or `json-rpc#…`.
    pub rule: String,
    pub message: String,
}

impl Finding {
    /// A break of the shim's own making: an error (the rest are the peers').
    pub fn is_shims(&self) -> bool {
        self.whose == Whose::Shim && !self.inherited
    }
}

impl fmt::Display for Finding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let whose = match (self.whose, self.inherited) {
            (Whose::Shim, false) => "the shim's",
            (Whose::Shim, true) => "the shim's, as it came",
            (Whose::Client, _) => "the client's",
            (Whose::Agent, _) => "the agent's",
        };
        let at = if self.at.is_empty() { "/" } else { &self.at };
        write!(f, "line {} {} ({whose})", self.line, self.dir.as_str())?;
        if let Some(m) = &self.method {
            write!(f, " {m}")?;
        }
        write!(f, " {at}: {} [{}]", self.message, self.rule)
    }
}

/// Breaks of peer frames kept for telling inherited breaks apart, by record: a trace of broken frames the shim
/// never edits cannot make the checker hold more.
const KEPT_ORIGINS: usize = 4096;

/// Checks a trace one record at a time (see the module's docs).
#[derive(Default)]
pub struct Checker {
    conversations: [Conversation; 2],
    linker: Linker,
    /// Records pushed so far.
    index: usize,
    /// Per peer frame with breaks (by record index): where and which rule.
    origins: BTreeMap<usize, Vec<(String, String)>>,
    /// Frames checked (a peer's as it came, the shim's own), and frames only followed (passed on untouched).
    pub checked: usize,
    pub passed: usize,
    /// Lines a peer wrote that were not JSON-RPC (`"line"` records): not frames; the relay drops them.
    pub not_json: [usize; 2],
}

impl Checker {
    pub fn new() -> Checker {
        Checker::default()
    }

    /// Takes the trace's next record; returns the rules it breaks.
    pub fn push(&mut self, rec: &Record) -> Vec<Finding> {
        let i = self.index;
        self.index += 1;
        let Some((side, sender)) = side_of(rec.dir) else { return Vec::new() };
        let incoming = matches!(rec.dir, Dir::ClientToShim | Dir::AgentToShim);
        let found = self.linker.push(i, rec);
        if rec.not_json {
            self.not_json[usize::from(sender == Party::Agent)] += 1;
            return Vec::new();
        }
        let whose = match (incoming, sender, rec.shim) {
            (false, _, true) => Some(Whose::Shim),
            (false, _, false) => None,
            (true, Party::Client, _) => Some(Whose::Client),
            (true, Party::Agent, _) => Some(Whose::Agent),
        };
        let conversation = &mut self.conversations[usize::from(side == Side::Agent)];
        let Some(frame) = super::rpc::frame_of(rec) else {
            let Some(whose) = whose else { return Vec::new() };
            self.checked += 1;
            let message = "the frame is not JSON".to_owned();
            return vec![finding(rec, whose, None, rules::JSONRPC_PARSE, String::new(), message)];
        };
        // Follow the conversation, whoever's frame it is.
        let mut duplicate = None;
        let frame = frame.as_ref();
        let (method, answering) = match shape(frame) {
            Shape::Request { id, method } => {
                if !conversation.requests(sender).sent(id, method, rec.t, rec.line) {
                    duplicate = Some(id.to_string());
                }
                (Some(method.to_owned()), None)
            }
            Shape::Notification { method } => (Some(method.to_owned()), None),
            Shape::Answer { id, .. } => match conversation.requests(sender.other()).answered(id) {
                Some(open) => (Some(open.method), Some(true)),
                None => (None, Some(false)),
            },
            _ => (None, None),
        };
        let Some(whose) = whose else {
            self.passed += 1;
            return Vec::new();
        };
        self.checked += 1;
        let answering = match answering {
            Some(true) => Some(Answering::Method(method.as_deref().unwrap_or(""))),
            Some(false) => Some(Answering::Nothing),
            None => None,
        };
        let mut out: Vec<Finding> = rules::check(schemas(), frame, sender, answering)
            .into_iter()
            .map(|b| finding(rec, whose, method.clone(), &b.rule, b.at, b.message))
            .collect();
        if let Some(id) = duplicate {
            let message = format!("a request with id {id} while one with that id is still open");
            out.push(finding(rec, whose, method.clone(), rules::DUPLICATE_ID, "/id".into(), message));
        }
        if incoming {
            if !out.is_empty() {
                self.origins.insert(i, out.iter().map(|f| (f.at.clone(), f.rule.clone())).collect());
                while self.origins.len() > KEPT_ORIGINS {
                    self.origins.pop_first();
                }
            }
        } else {
            for f in &found {
                if let Found::Edited { out: o, inp, .. } = f
                    && *o == i
                {
                    let origin = self.origins.remove(inp).unwrap_or_default();
                    for finding in &mut out {
                        finding.inherited = origin.iter().any(|(at, rule)| *at == finding.at && *rule == finding.rule);
                    }
                }
            }
        }
        out
    }
}

fn finding(rec: &Record, whose: Whose, method: Option<String>, rule: &str, at: String, message: String) -> Finding {
    Finding { line: rec.line, dir: rec.dir, whose, inherited: false, method, at, rule: rule.to_owned(), message }
}

/// What `acp-replay validate` found in a trace.
#[derive(Debug, Default)]
pub struct Report {
    pub findings: Vec<Finding>,
    /// Lines of the trace that are not records (or are records altered to be read), with why.
    pub bad_lines: Vec<BadLine>,
    pub checked: usize,
    pub passed: usize,
    /// Lines that were not JSON-RPC, written by the client and by the agent.
    pub not_json: [usize; 2],
}

impl Report {
    /// Frames that break a rule, counted once each: the shim's own, and all.
    pub fn frames_breaking(&self, shim_only: bool) -> usize {
        let mut lines: Vec<usize> =
            self.findings.iter().filter(|f| !shim_only || f.is_shims()).map(|f| f.line).collect();
        lines.dedup();
        lines.len()
    }

    /// The report as `acp-replay validate` prints it: each finding, then the counts.
    pub fn text(&self, shim_only: bool) -> String {
        let mut out = String::new();
        for f in self.findings.iter().filter(|f| !shim_only || f.is_shims()) {
            out.push_str(&format!("{f}\n"));
        }
        for b in &self.bad_lines {
            out.push_str(&format!("line {}: unreadable: {} ({})\n", b.line, b.reason, b.excerpt));
        }
        let count = |w: Whose, inherited: bool| {
            let mut lines: Vec<usize> = self
                .findings
                .iter()
                .filter(|f| f.whose == w && (w != Whose::Shim || f.inherited == inherited))
                .map(|f| f.line)
                .collect();
            lines.dedup();
            lines.len()
        };
        out.push_str(&format!(
            "{} frames checked against ACP schema {ACP_SCHEMA_VERSION} and Coda's shapes ({} passed on untouched); \
             breaking a rule: {} of the shim's own, {} of the shim's carried over from the frame it edited, {} \
             of the agent's, {} of the client's; {} unreadable lines; lines that were not JSON-RPC: {} from the \
             client, {} from the agent\n",
            self.checked,
            self.passed,
            count(Whose::Shim, false),
            count(Whose::Shim, true),
            count(Whose::Agent, false),
            count(Whose::Client, false),
            self.bad_lines.len(),
            self.not_json[0],
            self.not_json[1],
        ));
        out
    }
}

/// Checks a whole trace (`--trace-file` output or a fixture's `trace.jsonl`), read one line at a time.
pub fn validate(input: impl BufRead) -> Report {
    let mut reader = Reader::new(input);
    let mut checker = Checker::new();
    let mut report = Report::default();
    for line in reader.by_ref() {
        match line {
            Line::Record(rec) => report.findings.extend(checker.push(&rec)),
            Line::Bad(b) => report.bad_lines.push(b),
        }
    }
    report.checked = checker.checked;
    report.passed = checker.passed;
    report.not_json = checker.not_json;
    report
}

#[cfg(test)]
mod tests;

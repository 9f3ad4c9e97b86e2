//! One side of a trace as `acp-replay diff` compares it: the frames a peer sent and got, each also in a form
//! with what differs between any two runs taken out (ids, times, paths of the machine).
//!
//! The client side is what Coda saw (`client->shim` sent, `shim->client` got); the agent side is what the CLI
//! saw (`shim->agent` sent, `agent->shim` got): the same conversation as if Coda had talked to the CLI directly.

use std::io::BufRead;
use std::sync::LazyLock;

use regex::Regex;
use serde_json::{Map, Value};

use crate::replay::normalise::Normaliser;
use crate::replay::view::read::{BadLine, Dir, Line, Reader};

/// Which peer's view of the conversation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Which {
    Client,
    Agent,
}

impl Which {
    pub fn parse(s: &str) -> Option<Which> {
        match s {
            "client" => Some(Which::Client),
            "agent" | "direct" => Some(Which::Agent),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Which::Client => "client",
            Which::Agent => "agent",
        }
    }

    /// Whether a record is of this side, and sent (`true`) or got by its peer.
    pub fn sent(self, dir: Dir) -> Option<bool> {
        match (self, dir) {
            (Which::Client, Dir::ClientToShim) | (Which::Agent, Dir::ShimToAgent) => Some(true),
            (Which::Client, Dir::ShimToClient) | (Which::Agent, Dir::AgentToShim) => Some(false),
            _ => None,
        }
    }
}

/// One frame of a side.
#[derive(Debug, Clone)]
pub struct Frame {
    /// 1-based line in the trace.
    pub line: usize,
    /// Milliseconds since the first record of the trace.
    pub t: f64,
    pub dir: Dir,
    /// Sent by the peer whose side this is (else got by it).
    pub sent: bool,
    /// The shim marked the record as made or edited by it.
    pub shim: bool,
    pub raw: String,
    pub frame: Value,
    /// The frame with ids, times and paths put as `{{ID}}`, `{{TIME}}`, `{{CWD}}`…
    pub norm: Value,
}

impl Frame {
    pub fn method(&self) -> &str {
        self.frame.get("method").and_then(Value::as_str).unwrap_or_default()
    }

    pub fn session(&self) -> Option<&str> {
        let p = self.frame.get("params")?;
        p.get("sessionId").and_then(Value::as_str)
    }

    /// What the frame is, for aligning: direction, method (or `answer`), the update's kind.
    pub fn key(&self) -> String {
        let update = self.frame.pointer("/params/update/sessionUpdate").and_then(Value::as_str).unwrap_or_default();
        let what = if self.method().is_empty() {
            if self.frame.get("error").is_some() { "error answer" } else { "answer" }
        } else {
            self.method()
        };
        format!("{}{what}{}{update}", if self.sent { ">" } else { "<" }, if update.is_empty() { "" } else { " " })
    }

    /// How the report names it: `session/update agent_message_chunk (got)`.
    pub fn label(&self) -> String {
        let k = self.key();
        format!("{} ({})", &k[1..], if self.sent { "sent" } else { "got" })
    }
}

/// A side of a trace, read.
#[derive(Debug, Default)]
pub struct Side {
    pub frames: Vec<Frame>,
    pub bad: Vec<BadLine>,
    pub clock: Option<f64>,
}

/// Keys whose values are ids: chosen anew in every run.
fn is_id_key(k: &str) -> bool {
    k == "id" || k.ends_with("Id") || k.ends_with("_id") || k.ends_with("ID")
}

/// Keys whose values are times.
fn is_time_key(k: &str) -> bool {
    let l = k.to_ascii_lowercase();
    ["time", "timestamp", "ts", "date", "created", "updated", "modified", "started", "ended", "elapsed"]
        .contains(&l.as_str())
        || k.ends_with("At")
        || k.ends_with("Time")
        || k.ends_with("_at")
        || k.ends_with("Ms")
        || k.ends_with("_ms")
}

static RFC3339: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"\d{4}-\d\d-\d\d[T ]\d\d:\d\d:\d\d(\.\d+)?(Z|[+-]\d\d:?\d\d)?").expect("a valid pattern")
});
static HOME: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"(/home|/Users)/[^/\s\x22\\]+|/root\b").expect("a valid pattern"));
static TMP: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"(/private)?(/tmp|/var/folders/[^\s\x22\\]+?/T)/[^/\s\x22\\]+").expect("a valid pattern")
});

/// Puts ids, times and paths of the machine as placeholders, keeping the frame's shape.
pub fn normalise(v: &Value, n: &Normaliser) -> Value {
    walk(v, None, n)
}

fn walk(v: &Value, key: Option<&str>, n: &Normaliser) -> Value {
    match v {
        Value::Object(o) => {
            let mut out = Map::new();
            for (k, x) in o {
                out.insert(k.clone(), walk(x, Some(k), n));
            }
            Value::Object(out)
        }
        Value::Array(a) => Value::Array(a.iter().map(|x| walk(x, key, n)).collect()),
        Value::String(_) | Value::Number(_) if key.is_some_and(is_id_key) => Value::String("{{ID}}".into()),
        Value::String(_) | Value::Number(_) if key.is_some_and(is_time_key) => Value::String("{{TIME}}".into()),
        Value::String(s) => {
            let s = n.apply(s);
            let s = RFC3339.replace_all(&s, "{{TIME}}");
            let s = TMP.replace_all(&s, "{{TMPDIR}}");
            Value::String(HOME.replace_all(&s, "{{HOME}}").into_owned())
        }
        other => other.clone(),
    }
}

/// Reads `which` side of the trace in `input`.
pub fn read(input: impl BufRead, which: Which) -> Side {
    let mut reader = Reader::new(input);
    let mut side = Side::default();
    let mut records = Vec::new();
    for line in reader.by_ref() {
        match line {
            Line::Bad(b) => side.bad.push(b),
            Line::Record(r) => {
                let Some(sent) = which.sent(r.dir) else { continue };
                let Some(frame) = r.frame else { continue };
                records.push((r.line, r.t, r.dir, sent, r.shim, r.raw, frame));
            }
        }
    }
    side.clock = reader.clock;
    // The session folder the trace names is the run's own: `{{CWD}}` wherever it is, and the folders beside it
    // as a recording names them (`{{HOME}}`, `{{TMPDIR}}`, `{{ROOT}}`: a live run's or `acp-replay check`'s
    // folder holds `home/`, `work/` and `tmp/`), so a fixture and a new run of it compare alike.
    let cwd = records.iter().find_map(|(.., frame)| frame.pointer("/params/cwd").and_then(Value::as_str));
    let mut n = match cwd.map(std::path::Path::new).and_then(std::path::Path::parent) {
        Some(root) if root.parent().is_some() => Normaliser::for_live_root(root),
        _ => Normaliser::default(),
    };
    for (.., frame) in &records {
        if let Some(cwd) = frame.pointer("/params/cwd").and_then(Value::as_str) {
            n.add(cwd, "CWD");
        }
    }
    side.frames = records
        .into_iter()
        .map(|(line, t, dir, sent, shim, raw, frame)| {
            let norm = normalise(&frame, &n);
            Frame { line, t, dir, sent, shim, raw, frame, norm }
        })
        .collect();
    side
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_times_and_paths_are_taken_out() {
        let v = serde_json::json!({"jsonrpc":"2.0","id":7,"method":"m","params":{"sessionId":"s1","toolCallId":"c",
            "cwd":"/home/ann/proj","updatedAt":1733000000,"text":"at 2026-12-01T11:37:16.5Z in /tmp/x1/y and /Users/bob/a",
            "n":3}});
        let mut n = Normaliser::default();
        n.add("/home/ann/proj", "CWD");
        let out = normalise(&v, &n);
        assert_eq!(
            out,
            serde_json::json!({"jsonrpc":"2.0","id":"{{ID}}","method":"m","params":{"sessionId":"{{ID}}",
                "toolCallId":"{{ID}}","cwd":"{{CWD}}","updatedAt":"{{TIME}}",
                "text":"at {{TIME}} in {{TMPDIR}}/y and {{HOME}}/a","n":3}})
        );
    }
}

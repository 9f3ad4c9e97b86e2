//! `acp-replay redact`: a copy of a trace that is safe to share.
//!
//! Texts (prompts and the session instruction, the agent's and the user's messages, file contents, tool output,
//! lines that were not JSON-RPC) become placeholders of the same shape and length class ([`shape`]); the home
//! folder's user name is replaced in every path and word; secrets are masked in every string and key
//! ([`secrets`]). Records, methods, ids, times, numbers and the order of everything are kept, so `view` and
//! `diff` work on the copy as on the trace. A line that cannot be read as a record becomes a placeholder line
//! (it stays a bad line of the same shape). The trace is read twice, a line at a time: first for the user
//! names it shows, then to write the copy.

pub mod secrets;
pub mod shape;

use std::collections::BTreeSet;
use std::io::{self, BufRead, Write};
use std::sync::LazyLock;

use regex::Regex;
use serde_json::{Map, Value};

use shape::Shaper;

use crate::replay::view::read::{MAX_LINE, next_line};

/// Texts that may be kept as they are (secrets and user names are masked in them all the same).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Keep {
    /// Prompts, the session instruction, the user's messages and session titles made from them.
    pub prompts: bool,
    /// The agent's messages and thoughts.
    pub agent: bool,
    /// Tool calls' output and input.
    pub tools: bool,
    /// File contents (read, written, session files).
    pub files: bool,
}

impl Keep {
    pub const ALL: Keep = Keep { prompts: true, agent: true, tools: true, files: true };

    /// `prompts,agent,tools,files` (or `all`).
    pub fn parse(list: &str) -> Result<Keep, String> {
        let mut k = Keep::default();
        for part in list.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            match part {
                "all" | "texts" => k = Keep::ALL,
                "prompts" => k.prompts = true,
                "agent" => k.agent = true,
                "tools" => k.tools = true,
                "files" => k.files = true,
                other => return Err(format!("--keep {other:?}: expected prompts, agent, tools, files or all")),
            }
        }
        Ok(k)
    }
}

/// What a text is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Class {
    Prompt,
    Agent,
    Tool,
    File,
}

/// What was done, in numbers.
#[derive(Debug, Default, Clone, Copy)]
pub struct Counts {
    pub records: usize,
    pub texts: usize,
    pub unreadable: usize,
}

static HOME_PATH: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"(/home/|/Users/|[A-Za-z]:\\\\?Users\\\\?)([^/\\\s\x22'<>:]+)").expect("a valid pattern")
});

/// User names too common to be anyone's (or part of every path): never replaced as words.
const NOT_NAMES: [&str; 8] = ["root", "user", "home", "work", "tmp", "shared", "runner", "admin"];

/// The user names of the trace: those under `/home/`, `/Users/` in any of its lines, and this machine's.
pub fn user_names(mut input: impl BufRead) -> io::Result<BTreeSet<String>> {
    let mut names = BTreeSet::new();
    let (mut buf, mut cut) = (Vec::new(), false);
    while next_line(&mut input, &mut buf, &mut cut)?.is_some() {
        let text = String::from_utf8_lossy(&buf);
        for c in HOME_PATH.captures_iter(&text) {
            names.insert(c[2].to_owned());
        }
    }
    for var in ["USER", "LOGNAME"] {
        if let Ok(v) = std::env::var(var) {
            names.insert(v);
        }
    }
    if let Some(home) = std::env::var_os("HOME")
        && let Some(n) = std::path::Path::new(&home).file_name()
    {
        names.insert(n.to_string_lossy().into_owned());
    }
    names.retain(|n| n.len() >= 2 && !NOT_NAMES.contains(&n.as_str()) && !n.starts_with("{{"));
    Ok(names)
}

/// Redacts one trace.
pub struct Redactor {
    keep: Keep,
    shaper: Shaper,
    names: Option<Regex>,
    pub counts: Counts,
}

fn is_id_key(k: &str) -> bool {
    k == "id" || k.ends_with("Id") || k.ends_with("_id") || k.ends_with("ID")
}

fn is_path_key(k: &str) -> bool {
    matches!(k, "path" | "cwd" | "uri" | "file" | "filePath" | "dir" | "root" | "to" | "paths" | "locations")
}

impl Redactor {
    pub fn new(keep: Keep, names: &BTreeSet<String>) -> Redactor {
        let names = (!names.is_empty()).then(|| {
            let alt: Vec<String> = names.iter().map(|n| regex::escape(n)).collect();
            Regex::new(&format!(r"(?i)\b({})\b", alt.join("|"))).expect("escaped names make a valid pattern")
        });
        Redactor { keep, shaper: Shaper::default(), names, counts: Counts::default() }
    }

    /// A string that is not a text: secrets masked, user names replaced.
    fn plain(&self, s: &str, key: Option<&str>) -> String {
        let long = !key.is_some_and(|k| is_id_key(k) || is_path_key(k));
        let masked = secrets::mask(s, long);
        let homes = HOME_PATH.replace_all(&masked, "${1}user");
        match &self.names {
            Some(re) if !key.is_some_and(|k| matches!(k, "method" | "jsonrpc")) => {
                re.replace_all(&homes, "user").into_owned()
            }
            _ => homes.into_owned(),
        }
    }

    fn text(&mut self, s: &str, class: Class) -> String {
        let kept = match class {
            Class::Prompt => self.keep.prompts,
            Class::Agent => self.keep.agent,
            Class::Tool => self.keep.tools,
            Class::File => self.keep.files,
        };
        if kept {
            return self.plain(s, None);
        }
        self.counts.texts += 1;
        self.shaper.text(s)
    }

    /// What texts under `key` are, in a frame of `method` (`update`: the `sessionUpdate` around it).
    fn class_of(key: &str, ctx: &Ctx) -> Option<Class> {
        if ctx.method.starts_with("fs/") && matches!(key, "content" | "text") {
            return Some(Class::File);
        }
        match key {
            "systemPrompt" | "instruction" | "instructions" => return Some(Class::Prompt),
            "oldText" | "newText" | "blob" | "data" => return Some(Class::File),
            "rawOutput" | "rawInput" | "output" | "stdout" | "stderr" | "aggregatedOutput" => return Some(Class::Tool),
            _ => {}
        }
        if key == "title" {
            // A session's title is made from its first prompt.
            return (ctx.update == "session_info_update" || ctx.in_sessions).then_some(Class::Prompt);
        }
        if !matches!(key, "text" | "content" | "message" | "thought" | "description") {
            return None;
        }
        Some(match ctx.update.as_str() {
            "agent_message_chunk" | "agent_thought_chunk" | "plan" => Class::Agent,
            "user_message_chunk" => Class::Prompt,
            "tool_call" | "tool_call_update" => Class::Tool,
            _ if ctx.in_prompt => Class::Prompt,
            _ if ctx.in_resource => Class::File,
            _ if ctx.method == "session/request_permission" => Class::Tool,
            _ => Class::Agent,
        })
    }

    fn walk(&mut self, v: &Value, key: Option<&str>, ctx: &Ctx, class: Option<Class>) -> Value {
        match v {
            Value::Object(o) => {
                let mut ctx = ctx.clone();
                if let Some(u) = o.get("sessionUpdate").and_then(Value::as_str) {
                    ctx.update = u.to_owned();
                }
                if o.get("type").and_then(Value::as_str) == Some("resource") || o.contains_key("resource") {
                    ctx.in_resource = true;
                }
                let mut out = Map::new();
                for (k, x) in o {
                    let mut inner = ctx.clone();
                    if k == "prompt" {
                        inner.in_prompt = true;
                    }
                    if k == "sessions" {
                        inner.in_sessions = true;
                    }
                    let c = class.or_else(|| Self::class_of(k, &inner));
                    out.insert(self.plain(k, None), self.walk(x, Some(k), &inner, c));
                }
                Value::Object(out)
            }
            Value::Array(a) => Value::Array(a.iter().map(|x| self.walk(x, key, ctx, class)).collect()),
            Value::String(s) => match class {
                Some(c)
                    if !key.is_some_and(|k| {
                        is_id_key(k) || is_path_key(k) || matches!(k, "type" | "mimeType" | "status" | "kind")
                    }) =>
                {
                    Value::String(self.text(s, c))
                }
                _ => Value::String(self.plain(s, key)),
            },
            other => other.clone(),
        }
    }

    /// The redacted copy of a frame (or a file operation: `file`).
    pub fn frame(&mut self, v: &Value) -> Value {
        let method = v.get("method").and_then(Value::as_str).unwrap_or_default();
        let ctx = Ctx { method: method.to_owned(), ..Ctx::default() };
        self.walk(v, None, &ctx, None)
    }

    /// The redacted copy of one line of a trace (without its newline).
    pub fn line(&mut self, line: &[u8]) -> String {
        let text = String::from_utf8_lossy(line);
        if text.trim().is_empty() {
            return text.into_owned();
        }
        let Ok(Value::Object(rec)) = crate::json::from_str::<Value>(&text) else {
            self.counts.unreadable += 1;
            return self.shaper.text(&text);
        };
        self.counts.records += 1;
        let mut out = Map::new();
        for (k, v) in &rec {
            let v = match k.as_str() {
                "frame" => self.frame(v),
                "line" => match v.as_str() {
                    Some(s) => Value::String(self.text(s, Class::Tool)),
                    None => self.frame(v),
                },
                "file" => {
                    let ctx = Ctx::default();
                    self.walk(v, None, &ctx, None)
                }
                "t" | "ts" | "dir" | "shim" => v.clone(),
                _ => self.walk(v, Some(k), &Ctx::default(), None),
            };
            out.insert(self.plain(k, None), v);
        }
        // Numbers as the trace spelled them (`1e400` stays `1e400`).
        let spelled = crate::json::to_vec_spelled(&Value::Object(out), &crate::json::Spellings::of(line));
        String::from_utf8(spelled).expect("serde_json writes UTF-8")
    }
}

/// Where in a frame a value is.
#[derive(Debug, Clone, Default)]
struct Ctx {
    method: String,
    update: String,
    in_prompt: bool,
    in_resource: bool,
    in_sessions: bool,
}

/// Writes the redacted copy of the trace that `reopen` reads from its start (once for each pass).
pub fn redact<R: BufRead>(
    mut reopen: impl FnMut() -> io::Result<R>,
    out: &mut impl Write,
    keep: Keep,
) -> io::Result<Counts> {
    let names = user_names(reopen()?)?;
    let mut r = Redactor::new(keep, &names);
    let mut input = reopen()?;
    let (mut buf, mut cut) = (Vec::new(), false);
    while let Some(whole) = next_line(&mut input, &mut buf, &mut cut)? {
        let line = buf.strip_suffix(b"\r").unwrap_or(&buf);
        if whole {
            out.write_all(r.line(line).as_bytes())?;
        } else {
            // Longer than any record is read: a placeholder line (what it began with is not shown).
            r.counts.unreadable += 1;
            out.write_all(format!("[a line over {} MiB, left out]", MAX_LINE >> 20).as_bytes())?;
        }
        out.write_all(b"\n")?;
    }
    out.flush()?;
    Ok(r.counts)
}

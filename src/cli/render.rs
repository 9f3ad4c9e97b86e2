//! The transcript of prompt mode: what the agent says and does, as readable lines on stdout.
//!
//! Agent text is streamed as it comes; everything else (thinking, tool calls, plans, waits, usage, the stop
//! reason) is a row of its own. Colours only when asked (stdout is a terminal and `NO_COLOR` is unset);
//! without them every kind of row still has a word in front, so a transcript reads the same in a file.

use crate::HashMap;
use std::io::Write;

use serde_json::Value;

/// How a row looks on a terminal.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Tone {
    Plain,
    Dim,
    Bold,
    Red,
    Green,
    Yellow,
    Cyan,
}

impl Tone {
    fn code(self) -> &'static str {
        match self {
            Tone::Plain => "",
            Tone::Dim => "\x1b[2m",
            Tone::Bold => "\x1b[1m",
            Tone::Red => "\x1b[31m",
            Tone::Green => "\x1b[32m",
            Tone::Yellow => "\x1b[33m",
            Tone::Cyan => "\x1b[36m",
        }
    }
}

const RESET: &str = "\x1b[0m";
const SPINNER: [char; 10] = ['⠋', '⠙', '⠹', '⠸', '⠼', '⠴', '⠦', '⠧', '⠇', '⠏'];

/// Which streamed text is being written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stream {
    Agent,
    Thought,
    /// Replayed user text (`session/load`).
    User,
}

pub struct Renderer<W: Write> {
    out: W,
    color: bool,
    /// False in `--json` mode: nothing is written.
    enabled: bool,
    /// The cursor is at the start of a line.
    at_line_start: bool,
    /// The stream text is currently being written to, with its colour open.
    stream: Option<Stream>,
    /// A spinner frame is on screen (one cell to the left of nothing: it is erased before the next output).
    spinner: Option<usize>,
    /// Tool call titles by id, for updates that carry only a status.
    tools: HashMap<String, String>,
    /// The last status shown per tool call.
    tool_status: HashMap<String, String>,
    /// The last command list shown.
    last_commands: Option<String>,
    /// The last usage facts shown (`usage_update` `_meta.coda`).
    last_facts: Option<String>,
}

impl<W: Write> Renderer<W> {
    pub fn new(out: W, color: bool, enabled: bool) -> Renderer<W> {
        Renderer {
            out,
            color,
            enabled,
            at_line_start: true,
            stream: None,
            spinner: None,
            tools: HashMap::default(),
            tool_status: HashMap::default(),
            last_commands: None,
            last_facts: None,
        }
    }

    pub fn into_inner(self) -> W {
        self.out
    }

    /// Streams agent text, thinking or replayed user text; a change of stream starts a new line.
    pub fn text(&mut self, prefix: &str, stream: Stream, text: &str) {
        if !self.enabled || text.is_empty() {
            return;
        }
        self.erase_spinner();
        let text = clean(text);
        let mut buf = String::new();
        if self.stream != Some(stream) {
            self.close_stream(&mut buf);
            if !self.at_line_start {
                buf.push('\n');
                self.at_line_start = true;
            }
            if self.color {
                buf.push_str(match stream {
                    Stream::Agent => "",
                    Stream::Thought | Stream::User => Tone::Dim.code(),
                });
            }
            self.stream = Some(stream);
        }
        for piece in text.split_inclusive('\n') {
            if self.at_line_start {
                buf.push_str(prefix);
                match stream {
                    Stream::Agent => {}
                    Stream::Thought => buf.push_str("thinking: "),
                    Stream::User => buf.push_str("user: "),
                }
            }
            buf.push_str(piece);
            self.at_line_start = piece.ends_with('\n');
        }
        self.write(&buf);
    }

    /// Clears the spinner and ends any open stream or line; the start of what goes out next.
    /// `None` when the transcript is off.
    fn fresh_line(&mut self) -> Option<String> {
        if !self.enabled {
            return None;
        }
        self.erase_spinner();
        let mut buf = String::new();
        self.close_stream(&mut buf);
        if !self.at_line_start {
            buf.push('\n');
        }
        Some(buf)
    }

    /// A line of its own.
    pub fn row(&mut self, tone: Tone, text: &str) {
        let Some(mut buf) = self.fresh_line() else { return };
        let text = clean(text);
        if self.color && tone != Tone::Plain {
            buf.push_str(tone.code());
            buf.push_str(&text);
            buf.push_str(RESET);
        } else {
            buf.push_str(&text);
        }
        buf.push('\n');
        self.at_line_start = true;
        self.write(&buf);
    }

    /// Text without a line end (a question), left open for the answer.
    pub fn ask(&mut self, text: &str) {
        let Some(mut buf) = self.fresh_line() else { return };
        buf.push_str(&clean(text));
        // The person types the answer and Enter, which ends the line on the terminal.
        self.at_line_start = true;
        self.write(&buf);
    }

    /// Shows the next spinner frame (only with colours, i.e. on a terminal).
    pub fn spin(&mut self) {
        if !self.enabled || !self.color {
            return;
        }
        let next = self.spinner.map_or(0, |i| (i + 1) % SPINNER.len());
        let mut buf = String::new();
        if self.spinner.is_some() {
            buf.push('\x08');
        }
        buf.push_str(Tone::Dim.code());
        buf.push(SPINNER[next]);
        buf.push_str(RESET);
        self.spinner = Some(next);
        self.write(&buf);
    }

    pub fn erase_spinner(&mut self) {
        if self.spinner.take().is_some() {
            self.write("\x08 \x08");
        }
    }

    /// Ends the transcript: closes an open stream and the last line.
    pub fn finish(&mut self) {
        if !self.enabled {
            return;
        }
        self.erase_spinner();
        let mut buf = String::new();
        self.close_stream(&mut buf);
        if !self.at_line_start {
            buf.push('\n');
            self.at_line_start = true;
        }
        self.write(&buf);
    }

    fn close_stream(&mut self, buf: &mut String) {
        if let Some(stream) = self.stream.take()
            && self.color
            && stream != Stream::Agent
        {
            buf.push_str(RESET);
        }
    }

    fn write(&mut self, s: &str) {
        // A closed stdout (a pipe into `head`) is not worth a panic; the session goes on.
        let _ = self.out.write_all(s.as_bytes());
        let _ = self.out.flush();
    }

    /// Renders one `session/update`'s `update` object. `prefix` marks a child session's output.
    pub fn update(&mut self, prefix: &str, update: &Value) {
        let kind = update.get("sessionUpdate").and_then(Value::as_str).unwrap_or("");
        match kind {
            "agent_message_chunk" => self.content(prefix, Stream::Agent, update.get("content")),
            "agent_thought_chunk" => self.content(prefix, Stream::Thought, update.get("content")),
            "user_message_chunk" => self.content(prefix, Stream::User, update.get("content")),
            "tool_call" => {
                let id = str_of(update, "toolCallId");
                let title = str_of(update, "title");
                let title = if title.is_empty() { id.clone() } else { title };
                self.tools.insert(id.clone(), title.clone());
                let tool_kind =
                    update.get("kind").and_then(Value::as_str).map(|k| format!(" ({k})")).unwrap_or_default();
                let status = update.get("status").and_then(Value::as_str).unwrap_or("pending");
                self.tool_status.insert(id, status.to_owned());
                let review = review(update);
                self.row(Tone::Cyan, &format!("{prefix}tool: {title}{tool_kind} {status}{review}"));
            }
            "tool_call_update" => {
                let id = str_of(update, "toolCallId");
                if let Some(title) = update.get("title").and_then(Value::as_str) {
                    self.tools.insert(id.clone(), title.to_owned());
                }
                let mut status = update.get("status").and_then(Value::as_str);
                if status.is_some() && self.tool_status.get(&id).map(String::as_str) == status {
                    status = None; // the same status again, with new content
                }
                if let Some(s) = status {
                    self.tool_status.insert(id.clone(), s.to_owned());
                }
                let review = review(update);
                if status.is_none() && review.is_empty() {
                    return; // content or raw output only: not worth a row
                }
                let title = self.tools.get(&id).cloned().unwrap_or(id);
                let status = status.map(|s| format!(" -> {s}")).unwrap_or_default();
                let tone = if status.contains("failed") { Tone::Red } else { Tone::Cyan };
                self.row(tone, &format!("{prefix}tool: {title}{status}{review}"));
            }
            "plan" => {
                self.row(Tone::Bold, &format!("{prefix}plan:"));
                for entry in update.get("entries").and_then(Value::as_array).into_iter().flatten() {
                    let mark = match entry.get("status").and_then(Value::as_str) {
                        Some("completed") => "[x]",
                        Some("in_progress") => "[~]",
                        _ => "[ ]",
                    };
                    self.row(Tone::Plain, &format!("{prefix}  {mark} {}", str_of(entry, "content")));
                }
            }
            "usage_update" => {
                let used = update.get("used").map(Value::to_string).unwrap_or_else(|| "?".into());
                let size = update.get("size").map(Value::to_string).unwrap_or_else(|| "?".into());
                let cost = update
                    .get("cost")
                    .and_then(|c| Some(format!(", cost {} {}", c.get("amount")?, c.get("currency")?.as_str()?)))
                    .unwrap_or_default();
                self.row(Tone::Dim, &format!("{prefix}usage: {used} of {size} tokens of context{cost}"));
                // Coda keeps the latest `_meta.coda`; shown when it changed.
                if let Some(facts) = usage_facts(update) {
                    let row = format!("{prefix}usage facts: {facts}");
                    if self.last_facts.as_deref() != Some(row.as_str()) {
                        self.row(Tone::Dim, &row);
                        self.last_facts = Some(row);
                    }
                }
            }
            "available_commands_update" => {
                let names: Vec<String> = update
                    .get("availableCommands")
                    .and_then(Value::as_array)
                    .into_iter()
                    .flatten()
                    .filter_map(|c| c.get("name").and_then(Value::as_str))
                    .map(|n| format!("/{n}"))
                    .collect();
                let row = format!("{prefix}commands: {}", names.join(" "));
                // Agents re-send the same list often (some after every turn); show changes only.
                if self.last_commands.as_deref() != Some(row.as_str()) {
                    self.row(Tone::Dim, &row);
                    self.last_commands = Some(row);
                }
            }
            "current_mode_update" => {
                self.row(Tone::Dim, &format!("{prefix}mode: {}", str_of(update, "currentModeId")));
            }
            "config_option_update" => {
                let options: Vec<String> = update
                    .get("configOptions")
                    .and_then(Value::as_array)
                    .into_iter()
                    .flatten()
                    .map(|o| format!("{}={}", str_of(o, "id"), short(o.get("currentValue"))))
                    .collect();
                self.row(Tone::Dim, &format!("{prefix}config: {}", options.join(", ")));
            }
            "session_info_update" => {
                if let Some(title) = update.get("title").and_then(Value::as_str) {
                    self.row(Tone::Dim, &format!("{prefix}title: {title}"));
                }
            }
            other => self.row(Tone::Dim, &format!("{prefix}update: {}", if other.is_empty() { "?" } else { other })),
        }
    }

    fn content(&mut self, prefix: &str, stream: Stream, content: Option<&Value>) {
        let Some(content) = content else { return };
        match content.get("type").and_then(Value::as_str) {
            Some("text") => self.text(prefix, stream, content.get("text").and_then(Value::as_str).unwrap_or("")),
            Some("resource_link") => self.row(Tone::Dim, &format!("{prefix}[link: {}]", str_of(content, "uri"))),
            Some(other) => self.row(Tone::Dim, &format!("{prefix}[{other}]")),
            None => {}
        }
    }
}

/// The tool call's review (`_meta.coda.review`), as a suffix.
/// `usage_update` `_meta.coda` as one line (`lastRequestAt …, contextTokens …, compactedAt …, cacheTtl …`),
/// keys Coda's workflows read first, then any other; `None` when there is none (or it is not an object).
fn usage_facts(update: &Value) -> Option<String> {
    let coda = update.pointer("/_meta/coda")?.as_object()?;
    const KNOWN: [&str; 4] = ["lastRequestAt", "contextTokens", "compactedAt", "cacheTtl"];
    let text = |v: &Value| match v {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    };
    let mut parts: Vec<String> =
        KNOWN.iter().filter_map(|k| coda.get(*k).map(|v| format!("{k} {}", text(v)))).collect();
    parts.extend(coda.iter().filter(|(k, _)| !KNOWN.contains(&k.as_str())).map(|(k, v)| format!("{k} {}", text(v))));
    let line = parts.join(", ");
    // Coda drops a `_meta.coda` over 4 KiB; a row shows its start.
    Some(match line.len() {
        0 => "none".into(),
        n if n > 400 => format!("{}…", crate::coda::wait::truncate_chars(&line, 400)),
        _ => line,
    })
}

fn review(update: &Value) -> String {
    let Some(review) = update.pointer("/_meta/coda/review") else {
        return String::new();
    };
    let state = review.get("state").and_then(Value::as_str).unwrap_or("?");
    let risk = review.get("risk").and_then(Value::as_str).map(|r| format!(", risk {r}")).unwrap_or_default();
    let reason = review.get("reason").and_then(Value::as_str).map(|r| format!(": {r}")).unwrap_or_default();
    format!(" [review {state}{risk}{reason}]")
}

fn str_of(v: &Value, key: &str) -> String {
    v.get(key).and_then(Value::as_str).unwrap_or("").to_owned()
}

fn short(v: Option<&Value>) -> String {
    match v {
        Some(Value::String(s)) => s.clone(),
        Some(v) => v.to_string(),
        None => "?".into(),
    }
}

/// Agent text may carry terminal escapes; only line ends and tabs pass, other control characters become `?`.
pub fn clean(s: &str) -> String {
    if !s.chars().any(|c| c.is_control() && c != '\n' && c != '\t') {
        return s.to_owned();
    }
    s.chars().map(|c| if c.is_control() && c != '\n' && c != '\t' { '?' } else { c }).collect()
}

/// Removes ANSI colour sequences (`ESC [ ... letter`), for tests and logs.
pub fn strip_ansi(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '\x1b' && chars.peek() == Some(&'[') {
            chars.next();
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn render(color: bool, f: impl FnOnce(&mut Renderer<Vec<u8>>)) -> String {
        let mut r = Renderer::new(Vec::new(), color, true);
        f(&mut r);
        r.finish();
        String::from_utf8(r.into_inner()).unwrap()
    }

    #[test]
    fn usage_facts_show_when_they_change() {
        let usage = |coda: Value| json!({"sessionUpdate":"usage_update","used":15,"size":32000,"_meta":{"coda":coda}});
        let out = render(false, |r| {
            let first = json!({"contextTokens":10,"lastRequestAt":"2026-12-02T04:34:36.389Z"});
            r.update("", &usage(first.clone()));
            r.update("", &usage(first));
            r.update(
                "",
                &usage(json!({"lastRequestAt":"2026-12-02T04:34:36.389Z","contextTokens":10,
                "compactedAt":"2026-12-02T04:34:38.044Z","extra":[1]})),
            );
            r.update("", &json!({"sessionUpdate":"usage_update","used":1,"size":2,"_meta":{"coda":"no"}}));
            r.update("", &usage(json!({"x": "y".repeat(5000)})));
        });
        let rows: Vec<&str> = out.lines().collect();
        assert_eq!(rows[0], "usage: 15 of 32000 tokens of context");
        assert_eq!(rows[1], "usage facts: lastRequestAt 2026-12-02T04:34:36.389Z, contextTokens 10");
        assert_eq!(rows[2], "usage: 15 of 32000 tokens of context", "the same facts again: no row");
        assert_eq!(
            rows[4],
            "usage facts: lastRequestAt 2026-12-02T04:34:36.389Z, contextTokens 10, compactedAt \
             2026-12-02T04:34:38.044Z, extra [1]"
        );
        assert_eq!(rows[5], "usage: 1 of 2 tokens of context", "a _meta.coda that is no object: no facts row");
        assert!(rows[7].starts_with("usage facts: x yyy") && rows[7].chars().count() < 450, "{}", rows[7].len());
        assert_eq!(rows.len(), 8);
    }

    #[test]
    fn streams_text_and_starts_rows_on_their_own_line() {
        let out = render(false, |r| {
            r.update("", &json!({"sessionUpdate": "agent_thought_chunk", "content": {"type": "text", "text": "hmm"}}));
            r.update("", &json!({"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": "Hel"}}));
            r.update(
                "",
                &json!({"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": "lo\nok"}}),
            );
            r.update("", &json!({"sessionUpdate": "tool_call", "toolCallId": "t1", "title": "Read", "kind": "read"}));
            r.update("", &json!({"sessionUpdate": "tool_call_update", "toolCallId": "t1", "status": "completed"}));
            r.update("", &json!({"sessionUpdate": "tool_call_update", "toolCallId": "t1", "content": []}));
            r.update("", &json!({"sessionUpdate": "tool_call_update", "toolCallId": "t1", "status": "completed"}));
        });
        assert_eq!(out, "thinking: hmm\nHello\nok\ntool: Read (read) pending\ntool: Read -> completed\n");
    }

    #[test]
    fn colours_only_when_asked_and_strip_ansi_removes_them() {
        let colored = render(true, |r| {
            r.update("", &json!({"sessionUpdate": "agent_thought_chunk", "content": {"type": "text", "text": "hmm"}}));
            r.row(Tone::Red, "stop: refusal");
        });
        assert!(colored.contains("\x1b[2m"), "{colored:?}");
        assert_eq!(strip_ansi(&colored), "thinking: hmm\nstop: refusal\n");
        let plain = render(false, |r| r.row(Tone::Red, "stop: refusal"));
        assert_eq!(plain, "stop: refusal\n");
    }

    #[test]
    fn agent_text_cannot_send_terminal_escapes() {
        let out = render(false, |r| r.text("", Stream::Agent, "a\x1b[2Jb\tc"));
        assert_eq!(out, "a?[2Jb\tc\n");
    }

    #[test]
    fn plans_and_reviews_read_as_rows() {
        let out = render(false, |r| {
            r.update(
                "",
                &json!({"sessionUpdate": "plan", "entries": [
                    {"content": "one", "status": "completed"}, {"content": "two", "status": "in_progress"},
                    {"content": "three", "status": "pending"}]}),
            );
            r.update(
                "[child c1] ",
                &json!({"sessionUpdate": "tool_call_update", "toolCallId": "x", "_meta": {"coda": {"review": {"state": "denied", "risk": "high", "reason": "no"}}}}),
            );
        });
        assert_eq!(
            out,
            "plan:\n  [x] one\n  [~] two\n  [ ] three\n[child c1] tool: x [review denied, risk high: no]\n"
        );
    }
}

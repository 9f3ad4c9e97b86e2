//! The session instruction (Coda's `systemPrompt`, section 会话指令) for a child that has no entry for it:
//! declared in `initialize`, validated on session setup, and delivered once, as a delimited text block in
//! front of the user's first real prompt. A child that declares `systemPrompt` itself gets everything
//! untouched.

use crate::{HashMap, HashSet};
use std::convert::Infallible;

use serde_json::{Value, json};

use crate::frame::{self, Frame, Id, Kind, Needle};
use crate::json;
use crate::layer::{Cx, Layer};

/// Opening and closing marker lines around the injected block.
pub const OPEN: &str = "<coda-session-instruction>";
pub const CLOSE: &str = "</coda-session-instruction>";
/// A part of the marker that no JSON encoder escapes, for a cheap byte search; agents that reflow the
/// block (a session title made from the prompt) keep it too.
pub const TOKEN_TEXT: &str = "coda-session-instruction";
/// [`TOKEN_TEXT`], its searcher built once.
pub static TOKEN: Needle = crate::needle!(TOKEN_TEXT.as_bytes());
/// Most text one instruction may carry.
pub const MAX_BYTES: usize = 256 * 1024;

/// The text block placed before the user's first prompt.
pub fn wrap(text: &str) -> String {
    format!("{OPEN}\n{text}\n{CLOSE}\n\n")
}

/// Whether a prompt text block is the injected block (as [`wrap`] makes it).
pub fn is_block(text: &str) -> bool {
    text.strip_prefix(OPEN).is_some_and(|rest| rest.starts_with('\n') && rest.trim_end().ends_with(CLOSE))
}

/// Removes every injected block from `s`, with the white space after it. `None` when there was none.
/// Lenient about the white space inside, since agents echo the prompt reflowed (a session title made
/// from it joins the lines with spaces).
pub fn strip(s: &str) -> Option<String> {
    let mut out = String::new();
    let mut rest = s;
    let mut changed = false;
    while let Some(start) = rest.find(OPEN) {
        let after = &rest[start + OPEN.len()..];
        let Some(end) = after.find(CLOSE) else { break };
        out.push_str(&rest[..start]);
        rest = after[end + CLOSE.len()..].trim_start();
        changed = true;
    }
    changed.then(|| out + rest)
}

/// [`strip`] on a string as JSON writes it (`text` between its quotes), without unescaping it: the same
/// text escaped as the agent escaped it, `None` when there was no block; `Err` when the text has an escape
/// that could spell a marker's character (`\u`, `\/`), which [`strip`] then reads unescaped. The markers
/// and their white space are the same bytes escaped or not: an escape is a backslash and one of `"\bfnrt`,
/// and a marker begins with `<`, which no backslash escapes, so a marker found in the bytes is one in the text.
fn strip_escaped(text: &[u8]) -> Result<Option<Vec<u8>>, ()> {
    static SLASH: Needle = crate::needle!(b"\\/");
    static OPENING: Needle = crate::needle!(OPEN.as_bytes());
    static CLOSING: Needle = crate::needle!(CLOSE.as_bytes());
    if frame::UNICODE_ESCAPE.is_in(text) || SLASH.is_in(text) {
        return Err(());
    }
    let (mut out, mut rest, mut changed) = (Vec::new(), text, false);
    while let Some(start) = OPENING.find(rest) {
        let after = &rest[start + OPEN.len()..];
        let Some(end) = CLOSING.find(after) else { break };
        out.extend_from_slice(&rest[..start]);
        rest = trim_start_escaped(&after[end + CLOSE.len()..]);
        changed = true;
    }
    Ok(changed.then(|| [out.as_slice(), rest].concat()))
}

/// `text` (a string's text as JSON writes it, with no `\u` escape) past the white space it starts with, as
/// [`str::trim_start`] reads white space.
fn trim_start_escaped(mut text: &[u8]) -> &[u8] {
    loop {
        let skip = match text {
            [b' ', ..] => 1,
            [b'\\', b'n' | b't' | b'r' | b'f', ..] => 2,
            [c, ..] if *c >= 0x80 => {
                // A character the frame check found valid UTF-8; a cut one ends the white space.
                let lead = &text[..text.len().min(4)];
                let valid = match std::str::from_utf8(lead) {
                    Ok(s) => s,
                    Err(e) => std::str::from_utf8(&lead[..e.valid_up_to()]).unwrap_or_default(),
                };
                match valid.chars().next() {
                    Some(ch) if ch.is_whitespace() => ch.len_utf8(),
                    _ => 0,
                }
            }
            _ => 0,
        };
        if skip == 0 {
            return text;
        }
        text = &text[skip..];
    }
}

/// What a binary honours of `systemPrompt`: `append` always; `override` where the agent declares it (and so
/// honours it: the shim passes it on to that agent untouched).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Honours {
    pub overrides: bool,
}

/// Checks a `systemPrompt` value against what the binary honours ([`Honours`]): an object whose `mode` is
/// `"append"` (or `"override"` where honoured) and whose `content` is a non-empty array of text blocks (ACP
/// defines no other block for it). `Err` says what is wrong (answered -32602, and no session is made); `Ok`
/// gives the text blocks' texts.
pub fn check(sp: &Value, honours: Honours) -> Result<Vec<&str>, String> {
    let Some(obj) = sp.as_object() else {
        return Err("systemPrompt must be an object with \"mode\" and \"content\"".into());
    };
    let modes = if honours.overrides { "\"append\" or \"override\"" } else { "\"append\"" };
    match obj.get("mode") {
        Some(Value::String(m)) if m == "append" => {}
        Some(Value::String(m)) if m == "override" && honours.overrides => {}
        Some(Value::String(m)) if m == "override" => {
            return Err("systemPrompt mode \"override\" is not supported; only \"append\" is".into());
        }
        Some(Value::String(m)) => return Err(format!("systemPrompt mode {m:?} is unknown; only {modes} is supported")),
        Some(_) => return Err(format!("systemPrompt.mode must be the string {modes}")),
        None => return Err(format!("systemPrompt.mode is required ({modes})")),
    }
    let Some(blocks) = obj.get("content").and_then(Value::as_array).filter(|b| !b.is_empty()) else {
        return Err("systemPrompt.content must be a non-empty array of text blocks".into());
    };
    let mut texts = Vec::with_capacity(blocks.len());
    for (i, block) in blocks.iter().enumerate() {
        match (block.get("type").and_then(Value::as_str), block.get("text").and_then(Value::as_str)) {
            (Some("text"), Some(text)) => texts.push(text),
            (Some("text"), None) => {
                return Err(format!("systemPrompt.content[{i}] is a text block without a string \"text\""));
            }
            (Some(other), _) => {
                return Err(format!("systemPrompt.content[{i}] has type {other:?}; only text blocks are supported"));
            }
            (None, _) => return Err(format!("systemPrompt.content[{i}] is not a content block")),
        }
    }
    Ok(texts)
}

/// Checks a `systemPrompt` value the shim delivers itself (append only, at most [`MAX_BYTES`] of text, not
/// blank) and returns the instruction text. `Err` says what is wrong.
pub fn validate(sp: &Value) -> Result<String, String> {
    let texts = check(sp, Honours { overrides: false })?;
    let total: usize = texts.iter().map(|t| t.len()).sum();
    if total > MAX_BYTES {
        return Err(format!("systemPrompt has {total} bytes of text, over the limit of {MAX_BYTES}"));
    }
    if texts.iter().all(|t| t.trim().is_empty()) {
        return Err("systemPrompt has no text".into());
    }
    Ok(texts.join("\n\n"))
}

/// What an agent's `sessionCapabilities.systemPrompt` declares, read as ACP reads it: an object declares
/// append, and override too when its `mode.override` is an object; anything else (absent, `null`, `"yes"`)
/// declares nothing.
pub fn declared(capability: Option<&Value>) -> Option<Honours> {
    let sp = capability?.as_object()?;
    let overrides = sp.get("mode").and_then(|m| m.get("override")).is_some_and(Value::is_object);
    Some(Honours { overrides })
}

#[derive(Default)]
struct Session {
    /// The instruction still to deliver.
    pending: Option<String>,
    /// A prompt carrying it is with the agent.
    in_flight: bool,
    /// Names from the latest `available_commands_update`.
    commands: Option<HashSet<String>>,
}

pub struct Instruction {
    /// Commands the agent runs without advertising them.
    builtins: &'static [&'static str],
    /// `annotations.audience` of the injected block, for a child that keeps it (an agent may store an
    /// `["assistant"]` block as a part of its own: sent to the model, replayed with the annotation).
    audience: Option<&'static [&'static str]>,
    /// The child accepts `systemPrompt` itself, and what of it.
    native: Option<Honours>,
    /// `session/new` requests carrying an instruction, by id.
    creating: HashMap<Id, String>,
    /// Prompts that carry the instruction (their session is the stack's request table's).
    carrying: HashSet<Id>,
    sessions: HashMap<String, Session>,
    /// Commands named in the initialize answer (`_meta.availableCommands`, where an agent sends them), for every session.
    initial_commands: HashSet<String>,
}

impl Instruction {
    pub fn new(builtins: &'static [&'static str]) -> Instruction {
        Instruction {
            builtins,
            audience: None,
            native: None,
            creating: HashMap::default(),
            carrying: HashSet::default(),
            sessions: HashMap::default(),
            initial_commands: HashSet::default(),
        }
    }

    /// Marks the injected block with `annotations.audience`.
    pub fn with_audience(mut self, audience: &'static [&'static str]) -> Instruction {
        self.audience = Some(audience);
        self
    }

    /// Whether the agent would run `/name`. Before the session's first command list has arrived (the
    /// agent sends it after answering `session/new`, so a quick first prompt can overtake it), any
    /// name counts: deferring the instruction by one prompt is harmless, breaking a command is not.
    fn is_command(&self, session: &Session, name: &str) -> bool {
        self.builtins.contains(&name)
            || self.initial_commands.contains(name)
            || session.commands.as_ref().is_none_or(|c| c.contains(name))
    }

    fn session_setup(&mut self, frame: Frame, cx: &mut Cx) {
        let (Some(id), Some(method)) = (frame.id().cloned(), frame.method()) else {
            return cx.to_agent(frame);
        };
        let mut value = frame.to_value();
        let params = value.get_mut("params").and_then(Value::as_object_mut);
        let Some(params) = params else {
            return cx.to_agent(frame);
        };
        let is_new = method == "session/new";
        let text = match params.get("systemPrompt") {
            None | Some(Value::Null) => None,
            Some(sp) => match validate(sp) {
                Err(why) => return refuse(&id, method, &why, cx),
                Ok(text) => Some(text),
            },
        };
        if !is_new && let Some(sid) = params.get("sessionId").and_then(Value::as_str) {
            // A restored session has had its instruction already.
            self.sessions.remove(sid);
        }
        if !params.contains_key("systemPrompt") {
            return cx.to_agent(frame);
        }
        params.remove("systemPrompt");
        if is_new && let Some(text) = text {
            self.creating.insert(id, text);
        }
        cx.to_agent(frame.rewritten(value));
    }

    /// A session's set-up for an agent that takes `systemPrompt` itself: passed on untouched, unless its
    /// `systemPrompt` asks what the agent does not honour (a mode it did not declare, content that is no text).
    fn native_setup(&mut self, honours: Honours, frame: Frame, cx: &mut Cx) {
        let (Some(id), Some(method)) = (frame.id(), frame.method()) else { return cx.to_agent(frame) };
        let sp = frame.value().pointer("/params/systemPrompt").filter(|sp| !sp.is_null());
        if let Some(Err(why)) = sp.map(|sp| check(sp, honours)) {
            let id = id.clone();
            return refuse(&id, method, &why, cx);
        }
        cx.to_agent(frame)
    }

    fn prompt(&mut self, frame: Frame, cx: &mut Cx) {
        let Some(id) = frame.id().cloned() else {
            return cx.to_agent(frame);
        };
        let mut value = frame.to_value();
        let Some(sid) = value.pointer("/params/sessionId").and_then(Value::as_str).map(str::to_owned) else {
            return cx.to_agent(frame);
        };
        let Some(session) = self.sessions.get(&sid) else {
            return cx.to_agent(frame);
        };
        let (Some(text), false) = (&session.pending, session.in_flight) else {
            return cx.to_agent(frame);
        };
        let Some(prompt) = value.pointer_mut("/params/prompt").and_then(Value::as_array_mut) else {
            return cx.to_agent(frame);
        };
        let first_text = prompt.iter().find(|b| b.get("type").and_then(Value::as_str) == Some("text"));
        if let Some(command) = first_text.and_then(|b| b.get("text")).and_then(Value::as_str).and_then(slash_name)
            && self.is_command(session, command)
        {
            // Prepending would stop the agent from recognising the command; deliver with the next prompt.
            return cx.to_agent(frame);
        }
        let mut block = json!({ "type": "text", "text": wrap(text) });
        if let Some(audience) = self.audience {
            block["annotations"] = json!({ "audience": audience });
        }
        prompt.insert(0, block);
        if let Some(s) = self.sessions.get_mut(&sid) {
            s.in_flight = true;
        }
        self.carrying.insert(id);
        cx.to_agent(frame.rewritten(value));
    }

    fn initialized(&mut self, frame: Frame, cx: &mut Cx) {
        let mut value = frame.to_value();
        let Some(result) = value.get_mut("result").and_then(Value::as_object_mut) else {
            return cx.to_client(frame);
        };
        if let Some(commands) = result.get("_meta").and_then(|m| m.get("availableCommands")) {
            self.initial_commands = command_names(commands);
        }
        let path: &[&str] = match result.get("protocolVersion").and_then(Value::as_u64) {
            Some(1) => &["agentCapabilities", "sessionCapabilities"],
            Some(2) => &["capabilities", "session"],
            _ => {
                tracing::warn!(
                    "unknown ACP protocol version in the agent's initialize answer; not declaring systemPrompt"
                );
                return cx.to_client(frame);
            }
        };
        let mut caps = &mut *result;
        for key in path {
            let entry = caps.entry(*key).or_insert_with(|| json!({}));
            if !entry.is_object() {
                *entry = json!({});
            }
            caps = entry.as_object_mut().expect("made an object above");
        }
        if let Some(honours) = declared(caps.get("systemPrompt")) {
            self.native = Some(honours);
            tracing::debug!("the agent accepts systemPrompt itself; passing it through");
            return cx.to_client(frame);
        }
        // Append only: the shim puts the text in front of the first prompt, which overrides nothing.
        caps.insert("systemPrompt".into(), json!({}));
        cx.to_client(frame.rewritten(value));
    }

    /// Reads a session's command list.
    fn commands_update(&mut self, frame: &Frame) {
        let value = frame.value();
        let Some(update) = value.pointer("/params/update") else {
            return;
        };
        if update.get("sessionUpdate").and_then(Value::as_str) != Some("available_commands_update") {
            return;
        }
        let (Some(sid), Some(commands)) =
            (value.pointer("/params/sessionId").and_then(Value::as_str), update.get("availableCommands"))
        else {
            return;
        };
        self.sessions.entry(sid.to_owned()).or_default().commands = Some(command_names(commands));
    }
}

/// Answers a session set-up `id` whose `systemPrompt` cannot be honoured with -32602: it never reaches the
/// agent, so no session is made.
fn refuse(id: &Id, method: &str, why: &str, cx: &mut Cx) {
    // The reason quotes what the client sent: at debug only.
    tracing::info!(%method, "rejected a systemPrompt the agent cannot honour with -32602");
    tracing::debug!(%method, "rejected systemPrompt: {why}");
    cx.to_client(frame::error_response(id, -32602, &format!("Invalid params: {why}"), None));
}

/// The command name of a prompt text such as "  /init focus on tests".
fn slash_name(text: &str) -> Option<&str> {
    let rest = text.trim_start().strip_prefix('/')?;
    let name = rest.split(char::is_whitespace).next()?;
    (!name.is_empty()).then_some(name)
}

fn command_names(commands: &Value) -> HashSet<String> {
    commands
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|c| c.get("name").and_then(Value::as_str))
        .map(|n| n.trim_start_matches('/').to_owned())
        .collect()
}

/// Whether a frame of the agent's is searched for an echo of the user's prompt, which must not show the
/// wrapper: the model's own streamed words (the bulk of all traffic) are no echo and go on untouched, and
/// unsearched; any other frame is, where it may hold the block ([`may_echo`]).
fn searched(frame: &Frame) -> bool {
    let streamed = matches!(frame.session_update(), Some("agent_message_chunk" | "agent_thought_chunk"));
    !streamed && may_echo(frame)
}

/// Whether `frame` may hold an injected block: the marker's text, in a line with the `<` that opens a block
/// ([`strip`] finds none without [`OPEN`]) or with a `\u` escape (which may spell it). The one-byte search
/// first: it costs half the marker's, and most frames have no `<`.
fn may_echo(frame: &Frame) -> bool {
    (frame.unicode_escaped() || memchr::memchr(b'<', frame.bytes()).is_some()) && frame.has(&TOKEN)
}

/// What is left of a frame of the agent's that holds the marker of an injected block.
enum Echo {
    /// No string held a whole block: the frame as it came.
    Kept,
    /// The frame with every block removed from each string value that held one, where it lies.
    Stripped(Frame),
    /// A `user_message_chunk` that was only the block.
    Emptied,
}

/// Removes the injected blocks from every string value of `frame` that holds one (keys are left as they are),
/// each string written again where it lies: the rest of the line goes on byte for byte, and a key that
/// appears twice is stripped in each of its values, not only in the one a parser keeps.
fn stripped(frame: &Frame) -> Echo {
    let line = frame.bytes();
    let strings = frame.view().strings_holding(&TOKEN.places(line));
    let mut edits = Vec::new();
    for range in strings {
        let quoted = &line[range.clone()];
        let clean = match strip_escaped(&quoted[1..quoted.len() - 1]) {
            Ok(clean) => clean.map(|text| [b"\"".as_slice(), &text, b"\""].concat()),
            Err(()) => json::View::of(quoted)
                .as_str()
                .as_deref()
                .and_then(strip)
                .map(|clean| serde_json::to_vec(&clean).expect("a string always serialises")),
        };
        if let Some(clean) = clean {
            edits.push((range, clean));
        }
    }
    if edits.is_empty() {
        return Echo::Kept;
    }
    // From the last to the first: the places of those before an edit do not move.
    let mut out = frame.clone();
    for (range, with) in edits.iter().rev() {
        out = out.spliced(range.clone(), with);
    }
    // A frame that names the marker where its envelope is (a method, an id, a session, the update's kind) is
    // checked again whole: a splice keeps the envelope it had.
    let named = |text: Option<&[u8]>| text.is_some_and(|t| TOKEN.is_in(t));
    if named(frame.method().map(str::as_bytes))
        || named(frame.id().map(|id| id.as_json().as_bytes()))
        || named(frame.session_update().map(str::as_bytes))
        || named(frame.session_bytes().as_deref())
    {
        out = Frame::built(out.bytes().to_vec());
    }
    let empty_chunk = out.session_update() == Some("user_message_chunk")
        && out.update_value().and_then(|u| u.pointer(&["content", "text"])).and_then(|t| t.as_str()).as_deref()
            == Some("");
    if empty_chunk { Echo::Emptied } else { Echo::Stripped(out) }
}

impl Layer for Instruction {
    type Timer = Infallible;
    type Event = Infallible;
    type Reply = Infallible;

    fn from_client(&mut self, frame: Frame, cx: &mut Cx) {
        let Kind::Request { method, .. } = frame.kind() else {
            return cx.to_agent(frame);
        };
        let setup = matches!(method.as_str(), "session/new" | "session/load" | "session/resume" | "session/fork");
        if let Some(honours) = self.native {
            return match setup {
                true => self.native_setup(honours, frame, cx),
                false => cx.to_agent(frame),
            };
        }
        match method.as_str() {
            _ if setup => self.session_setup(frame, cx),
            "session/prompt" if self.sessions.values().any(|s| s.pending.is_some()) => self.prompt(frame, cx),
            _ => cx.to_agent(frame),
        }
    }

    fn from_agent(&mut self, frame: Frame, cx: &mut Cx) {
        match frame.kind() {
            Kind::Response { id } => {
                let id = id.clone();
                let request = cx.answer_to(&frame);
                if request.is_some_and(|r| r.is("initialize")) {
                    return self.initialized(frame, cx);
                }
                let creating = self.creating.remove(&id);
                let carrying = match self.carrying.remove(&id) {
                    true => request.and_then(|r| r.session()).map(str::to_owned),
                    false => None,
                };
                if creating.is_some() || carrying.is_some() {
                    let value = frame.value();
                    if let Some(text) = creating
                        && let Some(sid) = value.pointer("/result/sessionId").and_then(Value::as_str)
                    {
                        self.sessions.entry(sid.to_owned()).or_default().pending = Some(text);
                    }
                    if let Some(s) = carrying.and_then(|sid| self.sessions.get_mut(&sid)) {
                        s.in_flight = false;
                        // Delivered only when the agent took the prompt; after an error it goes with the next
                        // one, unless the error is a failure answer saying the input entered the native
                        // session (执行失败).
                        let took = value.get("result").is_some()
                            || value.pointer("/error/data/_meta/coda/failure/input").and_then(Value::as_str)
                                == Some("accepted");
                        if took {
                            s.pending = None;
                        }
                    }
                }
            }
            Kind::Notification { method }
                if method == "session/update" && frame.session_update() == Some("available_commands_update") =>
            {
                self.commands_update(&frame);
            }
            _ => {}
        }
        if searched(&frame) {
            return match stripped(&frame) {
                Echo::Kept => cx.to_client(frame),
                Echo::Stripped(frame) => cx.to_client(frame),
                // No client ever sees the wrapper as user text; a chunk that was only the wrapper goes entirely.
                Echo::Emptied => {}
            };
        }
        cx.to_client(frame)
    }

    /// Passes what it neither reads (an answer, the agent's commands) nor searches for an echo: a frame of
    /// any other kind is read only where it may hold one, so the stack calls the layer for few of them.
    fn passes_from_agent(&self, frame: &Frame) -> bool {
        match frame.kind() {
            Kind::Response { .. } => false,
            Kind::Notification { method }
                if method == "session/update" && frame.session_update() == Some("available_commands_update") =>
            {
                false
            }
            _ => frame.is_streamed_chunk() || !searched(frame),
        }
    }

    fn chunks_pass_by_session(&self) -> bool {
        true
    }

    fn session_closed(&mut self, closed: &[String], _cx: &mut Cx) {
        for session in closed {
            self.sessions.remove(session);
        }
    }

    fn kept(&self) -> usize {
        self.sessions.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn validate_accepts_coda_shape_and_rejects_the_rest() {
        let ok = json!({"mode":"append","content":[{"type":"text","text":"be brief"}]});
        assert_eq!(validate(&ok).unwrap(), "be brief");
        let cases = [
            (json!("x"), "must be an object"),
            (json!({"mode":"override","content":[{"type":"text","text":"a"}]}), "\"override\" is not supported"),
            (json!({"mode":"replace","content":[{"type":"text","text":"a"}]}), "is unknown"),
            (json!({"content":[{"type":"text","text":"a"}]}), "mode is required"),
            (json!({"mode":"append","content":[]}), "non-empty array"),
            (json!({"mode":"append"}), "non-empty array"),
            (
                json!({"mode":"append","content":[{"type":"image","data":"","mimeType":"image/png"}]}),
                "only text blocks",
            ),
            (json!({"mode":"append","content":[{"type":"text","text":""}]}), "no text"),
            (json!({"mode":"append","content":[{"type":"text","text":"x".repeat(MAX_BYTES + 1)}]}), "over the limit"),
        ];
        for (value, want) in cases {
            let err = validate(&value).unwrap_err();
            assert!(err.contains(want), "{err} should contain {want}");
        }
    }

    #[test]
    fn strip_removes_exactly_the_wrapper() {
        let wrapped = wrap("line one\nline two");
        assert_eq!(strip(&(wrapped.clone() + "hello")).as_deref(), Some("hello"));
        assert_eq!(strip(&wrapped).as_deref(), Some(""));
        assert_eq!(strip("hello"), None);
        assert_eq!(strip(&format!("{OPEN}\nunterminated")), None);
        assert!(is_block(&wrapped));
        assert!(!is_block(&(wrapped.clone() + "hello")) && !is_block("hello") && !is_block(&format!("{OPEN} x")));
        // Reflowed into one line, as in a session title made from the prompt.
        assert_eq!(strip(&format!("{OPEN} be brief {CLOSE} hello")).as_deref(), Some("hello"));
    }

    #[test]
    fn the_injected_block_carries_the_audience_when_asked() {
        use crate::layer::{Exits, Stack};
        let mut stack = Stack::new(vec![Box::new(Instruction::new(&[]).with_audience(&["assistant"]))]);
        let mut exits = Exits::default();
        let f = |v: Value| Frame::from_value(&v);
        stack.from_client(
            f(json!({"jsonrpc":"2.0","id":1,"method":"session/new","params":{"cwd":"/w",
            "systemPrompt":{"mode":"append","content":[{"type":"text","text":"be brief"}]}}})),
            &mut exits,
        );
        stack.from_agent(f(json!({"jsonrpc":"2.0","id":1,"result":{"sessionId":"s"}})), &mut exits);
        stack.from_client(
            f(json!({"jsonrpc":"2.0","id":2,"method":"session/prompt","params":{"sessionId":"s",
            "prompt":[{"type":"text","text":"hi"}]}})),
            &mut exits,
        );
        let sent = exits.to_agent.last().map(|f| f.value().clone()).unwrap_or_default();
        assert_eq!(
            sent["params"]["prompt"],
            json!([{"type":"text","text":wrap("be brief"),"annotations":{"audience":["assistant"]}},{"type":"text","text":"hi"}])
        );
    }

    #[test]
    fn echoes_are_stripped_but_the_models_own_words_are_not() {
        use crate::layer::{Exits, Stack};
        let mut stack = Stack::new(vec![Box::new(Instruction::new(&[]))]);
        let update = |kind: &str, text: &str| {
            Frame::from_value(&json!({"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s",
                "update":{"sessionUpdate":kind,"content":{"type":"text","text":text}}}}))
        };
        let echo = wrap("be brief") + "hello";
        let mut exits = Exits::default();
        for kind in ["user_message_chunk", "agent_message_chunk", "agent_thought_chunk", "tool_call_update"] {
            stack.from_agent(update(kind, &echo), &mut exits);
        }
        let texts: Vec<Value> =
            exits.to_client.iter().map(|f| f.value()["params"]["update"]["content"]["text"].clone()).collect();
        assert_eq!(texts, [json!("hello"), json!(echo), json!(echo), json!("hello")]);
    }

    /// What the instruction layer sends on for one line of the agent's.
    fn from_agent_line(line: &str) -> Vec<Frame> {
        use crate::layer::{Exits, Stack};
        let mut stack = Stack::new(vec![Box::new(Instruction::new(&[]))]);
        let mut exits = Exits::default();
        stack.from_agent(Frame::parse(line.as_bytes().to_vec()).expect("a valid line"), &mut exits);
        exits.to_client
    }

    /// Coda's instruction as it is: several KB of Markdown paragraphs, CJK, quotes, emoji, a Windows path.
    fn instruction() -> String {
        let paragraph = "你是 Coda 的助手。回答要\u{201c}简短\u{201d}，用 \"引号\" 和 `代码`。\n\n- 不要删除文件 🚫\n- 路径: C:\\tmp\\x\n\n";
        let text = format!("# 会话指令\n\n{}", paragraph.repeat(40));
        assert!(text.len() > 4096, "several KB: {}", text.len());
        text
    }

    #[test]
    fn an_echo_is_stripped_where_it_lies_and_the_rest_of_the_line_goes_on_byte_for_byte() {
        let echo = serde_json::to_string(&(wrap(&instruction()) + "修复登录")).unwrap();
        // Numbers as the agent spelled them, keys in its order, an escape serde_json would not write.
        let line = format!(
            r#"{{"jsonrpc":"2.0","method":"_x.ai/sessions/changed","params":{{"n":1e400,"z":0.10,"a":"\u00e9","sessions":[{{"id":"s","title":{echo},"firstPrompt":{echo}}}],"t":1764633600000}}}}"#
        );
        let out = from_agent_line(&line);
        let want = line.replace(&echo, "\"修复登录\"");
        assert_eq!(out.len(), 1);
        assert_eq!(String::from_utf8_lossy(out[0].bytes()), want);
        assert_eq!(out[0].method(), Some("_x.ai/sessions/changed"));
        // The same with `<` and `>` written as escapes (an encoder that escapes HTML's characters).
        let html = echo.replace('<', "\\u003c").replace('>', "\\u003e");
        let out = from_agent_line(&line.replace(&echo, &html));
        assert_eq!(String::from_utf8_lossy(out[0].bytes()), want);
    }

    #[test]
    fn strip_escaped_is_strip_on_the_text_as_json_writes_it() {
        let block = wrap(&instruction());
        let texts = [
            "no block at all".to_owned(),
            block.clone(),
            block.clone() + "修复登录",
            format!("before {block}after"),
            format!("{block}{block}twice"),
            format!("{block}\t \r\n\u{000C}\u{3000}\u{00A0}\u{2003}spaces of every kind"),
            format!("{block}\u{0008}not space"),
            format!("{OPEN} reflowed {CLOSE}   title"),
            format!("{OPEN}\nunterminated"),
            format!("{block}é\"quoted\" \\ back\\slash"),
            format!("{OPEN}x{CLOSE}"),
            format!("a\\{OPEN}x{CLOSE} b"),
        ];
        for text in texts {
            let json = serde_json::to_string(&text).unwrap();
            let inner = &json.as_bytes()[1..json.len() - 1];
            let got = strip_escaped(inner).expect("no \\u or \\/ escape");
            let unescaped =
                got.map(|g| serde_json::from_slice::<String>(&[b"\"", g.as_slice(), b"\""].concat()).unwrap());
            assert_eq!(unescaped, strip(&text), "{text:?}");
        }
        // A marker that an escape could spell is left to `strip`.
        assert!(strip_escaped(br"\u003ccoda-session-instruction>x</coda-session-instruction>").is_err());
        assert!(strip_escaped(br"<coda-session-instruction>x<\/coda-session-instruction>").is_err());
    }

    #[test]
    fn an_echo_in_a_key_that_appears_twice_is_stripped_in_each_value() {
        // A parser keeping the last `title` saw nothing to strip, and the first went on with the instruction.
        let echo = serde_json::to_string(&(wrap(&instruction()) + "hi")).unwrap();
        let line = format!(
            r#"{{"jsonrpc":"2.0","method":"session/update","params":{{"sessionId":"s","update":{{"sessionUpdate":"session_info_update","title":{echo},"title":"plain"}}}}}}"#
        );
        let out = from_agent_line(&line);
        assert_eq!(out.len(), 1);
        let text = String::from_utf8_lossy(out[0].bytes()).into_owned();
        assert!(!text.contains(TOKEN_TEXT), "{text}");
        assert!(text.contains(r#""title":"hi","title":"plain""#), "{text}");
    }

    #[test]
    fn keys_are_not_stripped_and_a_marker_in_the_envelope_is_read_again() {
        let block = serde_json::to_string(&wrap("x")).unwrap();
        // A key that is the block stays (the value after it is stripped).
        let line = format!(r#"{{"jsonrpc":"2.0","method":"m","params":{{{block}:{block}}}}}"#);
        let out = from_agent_line(&line);
        assert_eq!(
            String::from_utf8_lossy(out[0].bytes()),
            format!(r#"{{"jsonrpc":"2.0","method":"m","params":{{{block}:""}}}}"#)
        );
        // The block as a method, a session and an id: the frame's envelope is read from what goes out.
        let method = serde_json::to_string(&(wrap("x") + "m")).unwrap();
        let line = format!(r#"{{"jsonrpc":"2.0","id":{block},"method":{method},"params":{{"sessionId":{method}}}}}"#);
        let out = from_agent_line(&line);
        assert_eq!(out[0].method(), Some("m"));
        assert_eq!(out[0].session().as_deref(), Some("m"));
        assert_eq!(out[0].id().map(Id::as_json), Some("\"\""));
        assert_eq!(out[0].value()["params"]["sessionId"], json!("m"));
    }

    #[test]
    fn an_echo_beside_a_lone_surrogate_is_stripped_and_the_frame_read_again() {
        let echo = serde_json::to_string(&(wrap(&instruction()) + "hi")).unwrap();
        let line = format!(
            r#"{{"jsonrpc":"2.0","method":"session/update","params":{{"sessionId":"s","update":{{"sessionUpdate":"user_message_chunk","content":{{"type":"text","text":{echo}}},"odd":"\ud800"}}}}}}"#
        );
        let out = from_agent_line(&line);
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].value()["params"]["update"]["content"]["text"], json!("hi"));
        assert_eq!(out[0].session().as_deref(), Some("s"));
        // Only the block: the chunk goes entirely.
        let only = serde_json::to_string(&wrap(&instruction())).unwrap();
        assert!(from_agent_line(&line.replace(&echo, &only)).is_empty());
    }

    /// A stack of the instruction layer alone with session `s` made with Coda's instruction as it is (several KB
    /// of Markdown with CJK text), as a release build runs it: a layer that says it passes a frame is not called.
    fn stack_with_session() -> (crate::layer::Stack, crate::layer::Exits) {
        let mut stack = crate::layer::Stack::new(vec![Box::new(Instruction::new(&[]))]);
        let mut exits = crate::layer::Exits::default();
        let new = json!({"jsonrpc":"2.0","id":1,"method":"session/new","params":{"cwd":"/w",
            "systemPrompt":{"mode":"append","content":[{"type":"text","text":instruction()}]}}});
        stack.from_client(Frame::from_value(&new), &mut exits);
        stack.from_agent(Frame::from_value(&json!({"jsonrpc":"2.0","id":1,"result":{"sessionId":"s"}})), &mut exits);
        (stack, exits)
    }

    /// A prompt `id` of session `s` with `text`.
    fn prompt_of_s(id: u64, text: &str) -> Frame {
        Frame::from_value(&json!({"jsonrpc":"2.0","id":id,"method":"session/prompt","params":{"sessionId":"s",
            "prompt":[{"type":"text","text":text}]}}))
    }

    /// Whether the last prompt sent to the agent carries the instruction in front of its one block.
    fn carries(exits: &crate::layer::Exits) -> bool {
        let sent = exits.to_agent.last().map(|f| f.value().clone()).unwrap_or_default();
        sent["params"]["prompt"].as_array().map_or(0, Vec::len) == 2
    }

    #[test]
    fn a_failure_answer_with_the_input_accepted_counts_as_delivered_a_plain_error_does_not() {
        let f = |v: Value| Frame::from_value(&v);
        let prompt = |id: u64| prompt_of_s(id, "hi");
        let (mut stack, mut exits) = stack_with_session();
        stack.from_client(prompt(2), &mut exits);
        assert!(carries(&exits));
        stack.from_agent(f(json!({"jsonrpc":"2.0","id":2,"error":{"code":-32603,"message":"boom"}})), &mut exits);
        stack.from_client(prompt(3), &mut exits);
        assert!(carries(&exits), "a plain error: the instruction goes again");
        let failure = json!({"jsonrpc":"2.0","id":3,"error":{"code":-32603,"message":"busy","data":{"_meta":{"coda":
            {"failure":{"kind":"service_unavailable","input":"accepted"}}}}}});
        stack.from_agent(f(failure), &mut exits);
        stack.from_client(prompt(4), &mut exits);
        assert!(!carries(&exits), "the failed turn took the input, instruction included");
    }

    /// The agent's command list is read through the stack as a release build runs it (a layer that says it
    /// passes a frame is not called there): a slash word it lists defers the instruction, a path does not.
    #[test]
    fn the_agents_commands_read_through_the_stack_tell_a_command_from_a_path() {
        let (mut stack, mut exits) = stack_with_session();
        let commands = json!({"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s","update":{
            "sessionUpdate":"available_commands_update","availableCommands":[{"name":"init","description":"x"}]}}});
        stack.from_agent(Frame::from_value(&commands), &mut exits);
        assert_eq!(exits.to_client.pop().map(|c| c.value().clone()), Some(commands), "the list goes on as it came");
        stack.from_client(prompt_of_s(2, "/init focus on tests"), &mut exits);
        assert_eq!(exits.to_agent.len(), 2, "session/new, then the prompt");
        assert!(!carries(&exits), "a command the agent lists: the instruction waits");
        stack.from_client(prompt_of_s(3, "/etc/hosts is odd"), &mut exits);
        assert_eq!(exits.to_agent.len(), 3);
        assert!(carries(&exits), "no command of the agent's: the instruction goes in front");
    }

    #[test]
    fn slash_names() {
        assert_eq!(slash_name("  /init focus"), Some("init"));
        assert_eq!(slash_name("/compact"), Some("compact"));
        assert_eq!(slash_name("/ x"), None);
        assert_eq!(slash_name("hi /init"), None);
    }
}

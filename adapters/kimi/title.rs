//! Kimi's session title, made from the user's own first prompt.
//!
//! Kimi titles a session from the text of its first prompt, cut short (seen live on Kimi 2.1.0,
//! fixtures/kimi/instruction-command-first); the prompt that carries Coda's session
//! instruction starts with the injected block, so Kimi's title would be the instruction, or the start of it
//! with the closing marker cut off. This layer sits on the agent's side of the instruction layer, sees that
//! prompt as Kimi gets it, works out the title Kimi makes from the prompt without the block, and puts it in
//! place of every title that echoes the block: `session_info_update` and `session/list` results. For a session
//! whose first prompt went by in an earlier process, the prompt is read from Kimi's own record of it (the
//! first client `turn.prompt` in the session's main wire), by a job of the engine's ([`Cx::work`]) off the
//! relay loop: the frame that needs it, and later frames of the same session, wait for it; other frames go
//! on meanwhile. A title it cannot work out (no such record, a
//! prompt part whose text Kimi rewrites in ways not reproduced here) goes out as `null`, never as the
//! instruction.

use crate::{HashMap, HashSet};
use std::collections::VecDeque;
use std::convert::Infallible;
use std::io::{BufRead, BufReader, Read};
use std::path::PathBuf;
use std::sync::{Arc, LazyLock};

use crate::coda::instruction;
use crate::coda::wait::utf16_prefix;
use crate::frame::{Frame, Kind};
use crate::layer::{Cx, Layer};
use regex::Regex;
use serde_json::Value;

/// Kimi 2.1.0 `MAX_LAST_PROMPT_LENGTH` and `MAX_TITLE_LENGTH`, in UTF-16 code units (JavaScript's
/// `String.prototype.slice`).
const MAX_PROMPT_TEXT: usize = 4000;
const MAX_TITLE: usize = 200;

/// JavaScript's `\s` (ECMAScript WhiteSpace and LineTerminator), which differs from Rust's Unicode `\s`
/// (it has U+FEFF, and not U+0085).
const JS_SPACE: &str =
    r"\t\n\x0B\x0C\r \x{A0}\x{1680}\x{2000}-\x{200A}\x{2028}\x{2029}\x{202F}\x{205F}\x{3000}\x{FEFF}";

/// Kimi's redactions before it keeps prompt text (`promptMetadataTextFromText`), in its order, with
/// JavaScript's ASCII `\b` and white space spelled out.
static REDACTIONS: LazyLock<Vec<(Regex, &'static str)>> = LazyLock::new(|| {
    let s = format!("[{JS_SPACE}]");
    let not_s = format!("[^{JS_SPACE}]");
    let b = r"(?-u:\b)";
    [
        (r"(?i)-----BEGIN [^-]*PRIVATE KEY-----[\s\S]*?-----END [^-]*PRIVATE KEY-----".to_owned(), "[redacted]"),
        (format!(r"(?i){b}(authorization){s}*:{s}*bearer{s}+{not_s}+"), "$1: Bearer [redacted]"),
        (
            format!(
                r#"(?i){b}(api[_-]?key|token|secret|password|passwd|pwd){b}{s}*[:=]{s}*(?:"[^"]*"|'[^']*'|{not_s}+)"#
            ),
            "$1=[redacted]",
        ),
        (format!(r"{b}sk-[A-Za-z0-9_-]{{12,}}{b}"), "[redacted]"),
        (format!(r"{b}[A-Za-z0-9][A-Za-z0-9+/=_-]{{39,}}{b}"), "[redacted]"),
        (r"\p{Cc}+".to_owned(), " "),
        (format!("{s}+"), " "),
    ]
    .into_iter()
    .map(|(re, with)| (Regex::new(&re).expect("a valid pattern"), with))
    .collect()
});

/// What Kimi's title from these prompt blocks is. `Unknown` when a block is of a kind whose text Kimi
/// rewrites in ways this does not reproduce.
#[derive(Debug, Clone, PartialEq)]
pub enum Made {
    /// Kimi makes this title.
    Title(String),
    /// Kimi makes no title (the prompt has no text).
    None,
    Unknown,
}

/// The parts of a session's first client prompt as Kimi recorded them, for a session this process did not
/// see prompted (`None`: not found).
/// It does I/O: the layer runs it as a job of the engine's ([`Cx::work`]), off the relay loop.
pub type FirstPrompt = Arc<dyn Fn(&str) -> Option<Vec<Value>> + Send + Sync>;

/// Most bytes of a main wire read looking for its first client prompt (it is among the first records).
const MAX_WIRE_SCAN: u64 = 8 * 1024 * 1024;

/// [`FirstPrompt`] from Kimi's files under `root`: the `input` of the first `turn.prompt` of origin `user`
/// in `<root>/sessions/*/<session>/agents/main/wire.jsonl`.
pub fn first_prompt_from_files(root: Option<PathBuf>) -> FirstPrompt {
    Arc::new(move |session| {
        let dir = crate::adapters::kimi::watch::find_session(root.as_ref()?, session)?;
        let file = std::fs::File::open(dir.join("agents/main/wire.jsonl")).ok()?;
        let mut lines = BufReader::new(file.take(MAX_WIRE_SCAN));
        let mut line = Vec::new();
        loop {
            line.clear();
            if lines.read_until(b'\n', &mut line).ok()? == 0 {
                return None;
            }
            // A cheap look before parsing: most records are no prompt.
            if memchr::memmem::find(&line, b"turn.prompt").is_none() {
                continue;
            }
            let Ok(record) = crate::json::from_slice::<Value>(&line) else { continue };
            if record.get("type").and_then(Value::as_str) == Some("turn.prompt")
                && record.pointer("/origin/kind").and_then(Value::as_str) == Some("user")
            {
                return record.get("input").and_then(Value::as_array).cloned();
            }
        }
    })
}

/// The title Kimi 2.1.0 makes from a first prompt of these ACP blocks (or the content parts Kimi made of
/// them): the texts of the blocks
/// (`acpBlocksToContentParts`, `promptPartText`) joined by line feeds, redacted, white space folded,
/// trimmed, then cut to 4000 and to 200 UTF-16 code units.
pub fn kimi_title(blocks: &[Value]) -> Made {
    let mut texts = Vec::new();
    for block in blocks {
        let text = match block.get("type").and_then(Value::as_str) {
            Some("text") => match block.get("text").and_then(Value::as_str) {
                // A lone media tag is left out, an image-compression caption is cut out: not reproduced.
                Some(t) if t.contains("path=\"") || t.contains("<system>") => return Made::Unknown,
                Some(t) => t.to_owned(),
                None => return Made::Unknown,
            },
            Some("image" | "image_url") => "[image]".to_owned(),
            Some("audio_url") => "[audio]".to_owned(),
            Some("video_url") => "[video]".to_owned(),
            Some("audio" | "think") => continue,
            Some("resource_link") => {
                let (Some(uri), Some(name)) =
                    (block.get("uri").and_then(Value::as_str), block.get("name").and_then(Value::as_str))
                else {
                    return Made::Unknown;
                };
                // A file link becomes a path reference of Kimi's own making: not reproduced.
                if uri.get(..5).is_some_and(|scheme| scheme.eq_ignore_ascii_case("file:")) {
                    return Made::Unknown;
                }
                format!("<resource_link uri=\"{}\" name=\"{}\" />", xml_attr(uri), xml_attr(name))
            }
            Some("resource") => {
                let resource = block.get("resource");
                match (
                    resource.and_then(|r| r.get("uri")).and_then(Value::as_str),
                    resource.and_then(|r| r.get("text")).and_then(Value::as_str),
                ) {
                    (Some(uri), Some(text)) => format!("<resource uri=\"{}\">{text}</resource>", xml_attr(uri)),
                    (Some(_), None) if resource.is_some_and(|r| r.get("blob").is_some()) => continue,
                    _ => return Made::Unknown,
                }
            }
            _ => return Made::Unknown,
        };
        if !text.trim_matches(|c: char| c.is_whitespace() || c == '\u{feff}').is_empty() {
            texts.push(text);
        }
    }
    let mut text = texts.join("\n");
    for (re, with) in REDACTIONS.iter() {
        if let std::borrow::Cow::Owned(changed) = re.replace_all(&text, *with) {
            text = changed;
        }
    }
    let text = text.trim_matches(' ');
    if text.is_empty() {
        return Made::None;
    }
    Made::Title(utf16_prefix(utf16_prefix(text, MAX_PROMPT_TEXT), MAX_TITLE).to_owned())
}

fn xml_attr(s: &str) -> String {
    s.replace('&', "&amp;").replace('"', "&quot;")
}

/// Whether a title Kimi reports repeats the injected block.
fn echoes_instruction(title: &str) -> bool {
    title.contains(instruction::TOKEN_TEXT)
}

pub struct Title {
    /// Sessions whose instruction-carrying prompt was seen (here or in Kimi's files): the title Kimi makes
    /// from the user's own part of it, `None` when it makes none or it is not known.
    titles: HashMap<String, Option<String>>,
    /// Sessions whose record of the first prompt is being read (a job of the engine's, off the relay loop).
    reading: HashSet<String>,
    /// Frames towards the client that wait for a title being read, and those of the same sessions behind
    /// them (a session's frames keep their order; other frames go on meanwhile).
    held: VecDeque<Held>,
    first_prompt: FirstPrompt,
}

/// What the layer does with a frame from the agent.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Handling {
    /// A `session_info_update`: its title may echo the block.
    Info,
    /// A `session/list` result: its entries' titles may.
    List,
    /// Anything else: passed on.
    Pass,
}

struct Held {
    frame: Frame,
    handling: Handling,
    /// The sessions whose titles it waits for.
    needs: Vec<String>,
    /// The sessions it is of (those it waits for among them): later frames of these wait behind it.
    sessions: Vec<String>,
}

/// Kimi's record of a session's first prompt, read by a job: what [`FirstPrompt`] found for `session`.
pub struct Recorded {
    session: String,
    blocks: Option<Vec<Value>>,
}

/// The title for a prompt whose first block is the injected one: made from the rest.
fn title_after_block(blocks: &[Value]) -> Option<String> {
    let (first, rest) = blocks.split_first()?;
    if !first.get("text").and_then(Value::as_str).is_some_and(instruction::is_block) {
        return None;
    }
    match kimi_title(rest) {
        Made::Title(t) => Some(t),
        Made::None | Made::Unknown => None,
    }
}

impl Title {
    pub fn new(first_prompt: FirstPrompt) -> Title {
        Title { titles: HashMap::default(), reading: HashSet::default(), held: VecDeque::new(), first_prompt }
    }

    /// The title that goes out in place of an echo (known by now: frames that need one wait for it).
    fn replacement(&self, session: Option<&str>) -> Value {
        session.and_then(|s| self.titles.get(s)).cloned().flatten().map_or(Value::Null, Value::String)
    }

    fn prompt(&mut self, frame: &Frame) {
        let value = frame.value();
        let (Some(session), Some(blocks)) = (
            value.pointer("/params/sessionId").and_then(Value::as_str),
            value.pointer("/params/prompt").and_then(Value::as_array),
        ) else {
            return;
        };
        let carries =
            blocks.first().and_then(|b| b.get("text")).and_then(Value::as_str).is_some_and(instruction::is_block);
        if carries {
            let made = match kimi_title(&blocks[1..]) {
                Made::Title(t) => Some(t),
                Made::None | Made::Unknown => None,
            };
            self.titles.insert(session.to_owned(), made);
        }
    }

    /// The sessions a frame is of, and those of them whose titles it needs and that are not known yet.
    fn look(&self, frame: &Frame, handling: Handling, cx: &Cx) -> (Vec<String>, Vec<String>) {
        let (sessions, echoed): (Vec<String>, Vec<String>) = match handling {
            Handling::Pass => {
                let of = match frame.kind() {
                    Kind::Response { .. } => cx.answer_to(frame).and_then(|r| r.session()).map(str::to_owned),
                    _ => frame.session().map(|s| s.into_owned()),
                };
                (of.into_iter().collect(), Vec::new())
            }
            Handling::Info => {
                // Read where they lie: the session from the frame check, the title from the update.
                let title = frame.update_value().and_then(|u| u.get("title")).and_then(|t| t.as_str());
                let echo = title.is_some_and(|t| echoes_instruction(&t));
                let session: Vec<String> = frame.session().map(|s| s.into_owned()).into_iter().collect();
                (session.clone(), if echo { session } else { Vec::new() })
            }
            Handling::List => {
                let entries = frame.value().pointer("/result/sessions").and_then(Value::as_array);
                let echoed: Vec<String> = entries
                    .into_iter()
                    .flatten()
                    .filter(|e| e.get("title").and_then(Value::as_str).is_some_and(echoes_instruction))
                    .filter_map(|e| e.get("sessionId").and_then(Value::as_str).map(str::to_owned))
                    .collect();
                (echoed.clone(), echoed)
            }
        };
        let needs = echoed.into_iter().filter(|s| !self.titles.contains_key(s)).collect();
        (sessions, needs)
    }

    /// Whether a frame of these sessions must wait behind one held.
    fn behind_held(&self, sessions: &[String]) -> bool {
        self.held.iter().any(|h| h.sessions.iter().any(|s| sessions.contains(s)))
    }

    /// Asks the engine to read Kimi's record of `session`'s first prompt (off the relay loop).
    fn read_record(&mut self, session: &str, cx: &mut Cx) {
        if !self.reading.insert(session.to_owned()) {
            return;
        }
        let (first_prompt, session) = (self.first_prompt.clone(), session.to_owned());
        cx.work(
            move || {
                let blocks = first_prompt(&session);
                Recorded { session, blocks }
            },
            Title::recorded,
        );
    }

    /// A record was read: its session's title is known; what waited for it goes on, in order.
    fn recorded(&mut self, Recorded { session, blocks }: Recorded, cx: &mut Cx) {
        self.reading.remove(&session);
        let title = blocks.and_then(|b| title_after_block(&b));
        // A prompt seen meanwhile says it as well as the record.
        self.titles.entry(session).or_insert(title);
        let mut stuck: HashSet<String> = HashSet::default();
        for h in std::mem::take(&mut self.held) {
            let ready =
                h.needs.iter().all(|s| self.titles.contains_key(s)) && !h.sessions.iter().any(|s| stuck.contains(s));
            if ready {
                self.handle(h.frame, h.handling, cx);
            } else {
                stuck.extend(h.sessions.iter().cloned());
                self.held.push_back(h);
            }
        }
    }

    fn handle(&mut self, frame: Frame, handling: Handling, cx: &mut Cx) {
        match handling {
            Handling::Info => self.info_update(frame, cx),
            Handling::List => self.list(frame, cx),
            Handling::Pass => cx.to_client(frame),
        }
    }

    /// A `session_info_update` whose title echoes the block gets the user's title, or none, written where the
    /// echo lies ([`Frame::spliced`]: the rest of the line goes on as Kimi wrote it). An update with `title`
    /// twice, one of them an echo, is written again from its parsed value, which keeps the last (replaced if
    /// an echo) and drops the others: a reader that keeps the first never sees the block.
    fn info_update(&mut self, frame: Frame, cx: &mut Cx) {
        let titles = frame.update_value().into_iter().flat_map(|u| u.members()).filter(|(k, _)| k.is("title"));
        let (mut echoes, mut count, mut last) = (false, 0, None);
        for (_, title) in titles {
            echoes |= title.as_str().is_some_and(|t| echoes_instruction(&t));
            (count, last) = (count + 1, Some(title));
        }
        if !echoes {
            return cx.to_client(frame);
        }
        if let (1, Some(cut)) = (count, last.and_then(|t| t.range_in(frame.bytes()))) {
            let with = self.replacement(frame.session().as_deref()).to_string();
            return cx.to_client(frame.spliced(cut, with.as_bytes()));
        }
        let mut value = frame.to_value();
        let session = value.pointer("/params/sessionId").and_then(Value::as_str).map(str::to_owned);
        let Some(title) = value.pointer_mut("/params/update/title") else { return cx.to_client(frame) };
        if title.as_str().is_some_and(echoes_instruction) {
            *title = self.replacement(session.as_deref());
        }
        cx.to_client(frame.rewritten(value));
    }

    /// A `session/list` result: each entry's title as in [`Title::info_update`].
    fn list(&mut self, frame: Frame, cx: &mut Cx) {
        let mut value = frame.to_value();
        let Some(sessions) = value.pointer_mut("/result/sessions").and_then(Value::as_array_mut) else {
            return cx.to_client(frame);
        };
        let mut changed = false;
        for entry in sessions.iter_mut() {
            if !entry.get("title").and_then(Value::as_str).is_some_and(echoes_instruction) {
                continue;
            }
            let session = entry.get("sessionId").and_then(Value::as_str).map(str::to_owned);
            entry["title"] = self.replacement(session.as_deref());
            changed = true;
        }
        cx.to_client(if changed { frame.rewritten(value) } else { frame })
    }
}

impl Layer for Title {
    type Timer = Infallible;
    type Event = Infallible;
    type Reply = Infallible;

    /// A closed session's title goes (a read of its record still under way ends as it would: what waits for it
    /// goes on then).
    fn session_closed(&mut self, closed: &[String], _cx: &mut Cx) {
        for session in closed {
            self.titles.remove(session);
        }
    }

    fn kept(&self) -> usize {
        self.titles.len() + self.reading.len() + self.held.len()
    }

    fn from_client(&mut self, frame: Frame, cx: &mut Cx) {
        if frame.is_request("session/prompt") {
            self.prompt(&frame);
        }
        cx.to_agent(frame)
    }

    fn from_agent(&mut self, frame: Frame, cx: &mut Cx) {
        let handling = if cx.answer_to(&frame).is_some_and(|r| r.is("session/list")) {
            Handling::List
        } else if frame.session_update() == Some("session_info_update") {
            Handling::Info
        } else {
            Handling::Pass
        };
        if handling == Handling::Pass && self.held.is_empty() {
            return cx.to_client(frame);
        }
        let (sessions, needs) = self.look(&frame, handling, cx);
        if needs.is_empty() && !self.behind_held(&sessions) {
            return self.handle(frame, handling, cx);
        }
        // Prompted in an earlier process: Kimi's record of the prompt says what the user wrote. It is read off
        // the relay loop; this frame, and later ones of its sessions, wait for it.
        for s in &needs {
            self.read_record(s, cx);
        }
        self.held.push_back(Held { frame, handling, needs, sessions });
    }

    fn passes_from_agent(&self, frame: &Frame) -> bool {
        // `Handling::Pass` with nothing held (a `session/list` result is an answer).
        self.held.is_empty()
            && !matches!(frame.kind(), Kind::Response { .. })
            && frame.session_update() != Some("session_info_update")
    }

    fn chunks_pass_by_session(&self) -> bool {
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layer::testing::Harness;
    use serde_json::json;

    fn text(t: &str) -> Value {
        json!({"type": "text", "text": t})
    }

    /// Coda's first prompt of several lines, and the title Kimi 2.1.0 made from it in a live run
    /// (tests/live_instruction.rs, a session without instruction).
    const PROMPT: &str = "Could you look at the failing build?\n\nIt broke after yesterday's merge:\n- the iPhone \
                          target stops at link time\n- 测试都通过了\n\nStart with the log. [[text:hi there]]";
    const KIMIS_TITLE: &str = "Could you look at the failing build? It broke after yesterday's merge: - the iPhone \
                               target stops at link time - 测试都通过了 Start with the log. [[text:hi there]]";

    #[test]
    fn the_title_is_kimis_own_for_the_users_prompt() {
        assert_eq!(kimi_title(&[text(PROMPT)]), Made::Title(KIMIS_TITLE.to_owned()));
    }

    #[test]
    fn kimis_length_rule_cuts_at_200_utf16_units() {
        // What Kimi 2.1.0 sent live for this prompt behind the real-size instruction: its first 200 units.
        let instruction = include_str!("../../fixtures/coda-instruction.md");
        let live = "<coda-session-instruction> # Coda client Your replies are shown in Coda, a native app on a \
                    Mac and an iPhone. The Mac window is wide and shows Markdown with tables, code blocks and \
                    images; on the iPho";
        assert_eq!(kimi_title(&[text(&instruction::wrap(instruction)), text(PROMPT)]), Made::Title(live.to_owned()));
        // Counted in UTF-16: an emoji is two units, a CJK character one; a pair is never split.
        let long = format!("{}😀x", "汉".repeat(199));
        assert_eq!(kimi_title(&[text(&long)]), Made::Title("汉".repeat(199)));
        let long = format!("{}😀x", "汉".repeat(198));
        assert_eq!(kimi_title(&[text(&long)]), Made::Title(format!("{}😀", "汉".repeat(198))));
    }

    #[test]
    fn blocks_and_redactions_as_kimi_makes_them() {
        let blocks = [
            text("  "),
            json!({"type": "image", "data": "", "mimeType": "image/png"}),
            text("token: abc123 and\u{feff}\u{7}more"),
            json!({"type": "resource", "resource": {"uri": "mem:\"a\"", "text": "body"}}),
            json!({"type": "resource", "resource": {"uri": "mem:b", "blob": "AA=="}}),
            json!({"type": "resource_link", "uri": "https://x/&y", "name": "n"}),
            text("sk-abcdefghijklmnop Authorization: Bearer xyz"),
        ];
        assert_eq!(
            kimi_title(&blocks),
            Made::Title(
                "[image] token=[redacted] and more <resource uri=\"mem:&quot;a&quot;\">body</resource> \
                 <resource_link uri=\"https://x/&amp;y\" name=\"n\" /> [redacted] Authorization: Bearer [redacted]"
                    .to_owned()
            )
        );
        assert_eq!(kimi_title(&[text(" \n ")]), Made::None);
        assert_eq!(kimi_title(&[json!({"type": "resource_link", "uri": "file:///a", "name": "a"})]), Made::Unknown);
        assert_eq!(kimi_title(&[json!({"type": "video"})]), Made::Unknown);
    }

    fn harness() -> Harness {
        Harness::of(Title::new(Arc::new(|_| None)))
    }

    fn prompt(session: &str, blocks: Value) -> Value {
        json!({"jsonrpc": "2.0", "id": 5, "method": "session/prompt",
            "params": {"sessionId": session, "prompt": blocks}})
    }

    fn info(session: &str, title: &str) -> Value {
        json!({"jsonrpc": "2.0", "method": "session/update", "params": {"sessionId": session,
            "update": {"sessionUpdate": "session_info_update", "title": title}}})
    }

    /// The titles that reached the client since the last look.
    fn titles(h: &mut Harness) -> Vec<Value> {
        h.to_client().iter().filter_map(|v| v.pointer("/params/update/title").cloned()).collect()
    }

    #[test]
    fn an_echoed_instruction_title_becomes_the_users_title() {
        let mut h = harness();
        let block = instruction::wrap("be brief\nalways");
        h.from_client(prompt("s", json!([text(&block), text("fix\nthe build")])));
        h.from_agent(info("s", "<coda-session-instruction> be brief always </coda-session-instruction> fix the"));
        h.from_agent(info("s", "<coda-session-instruction> # Coda client Your replies"));
        // A title of Kimi's own making later on (a rename) is no echo.
        h.from_agent(info("s", "Renamed"));
        assert_eq!(titles(&mut h), [json!("fix the build"), json!("fix the build"), json!("Renamed")]);
    }

    /// The echo is replaced where it lies: the rest of Kimi's line goes on byte for byte (its key order, its
    /// escapes, its spelling of numbers, `_meta` after the update), and the user's title is escaped as JSON.
    #[test]
    fn the_title_is_written_where_the_echo_lies() {
        let mut h = harness();
        let block = instruction::wrap("简短\n回答");
        h.from_client(prompt("sé", json!([text(&block), text("修一下 \"build\" \\ 😀\nnow")])));
        let line = concat!(
            r#"{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s\u00e9","update":{"title" : "#,
            r#""<coda-session-instruction> \u7b80","sessionUpdate":"session_info_update","n":1e400},"#,
            r#""_meta":{"t":1.50}}}"#
        );
        h.agent_frame(Frame::parse(line.as_bytes().to_vec()).expect("a frame"));
        let out = h.take().to_client;
        let want = line.replace(r#""<coda-session-instruction> \u7b80""#, r#""修一下 \"build\" \\ 😀 now""#);
        assert_eq!(out.iter().map(|f| String::from_utf8_lossy(f.bytes()).into_owned()).collect::<Vec<_>>(), [want]);
        // No title known: `null` in its place.
        h.agent_frame(Frame::parse(info("x", "<coda-session-instruction> a").to_string().into_bytes()).unwrap());
        assert_eq!(titles(&mut h), [Value::Null]);
    }

    /// `title` twice: a reader keeps the last; the echo is replaced there and the first goes (as parsed).
    #[test]
    fn a_title_given_twice_is_edited_as_a_reader_reads_it() {
        let mut h = harness();
        h.from_client(prompt("s", json!([text(&instruction::wrap("be brief")), text("hello")])));
        for (first, last, want) in [
            ("<coda-session-instruction> a", "Renamed", json!("Renamed")),
            ("Renamed", "<coda-session-instruction> a", json!("hello")),
        ] {
            let line = format!(
                r#"{{"jsonrpc":"2.0","method":"session/update","params":{{"sessionId":"s","update":{{"sessionUpdate":"session_info_update","title":"{first}","title":"{last}"}}}}}}"#
            );
            h.agent_frame(Frame::parse(line.into_bytes()).expect("a frame"));
            let out = h.take().to_client;
            assert_eq!(out.len(), 1);
            let text = String::from_utf8_lossy(out[0].bytes()).into_owned();
            assert!(!text.contains("coda-session-instruction"), "{text}");
            assert_eq!(out[0].value().pointer("/params/update/title"), Some(&want));
        }
    }

    /// A lone surrogate escape elsewhere in the frame: the frame is read again whole, the escape as U+FFFD.
    #[test]
    fn a_frame_with_a_lone_surrogate_gets_its_title_too() {
        let mut h = harness();
        h.from_client(prompt("s", json!([text(&instruction::wrap("be brief")), text("hello")])));
        let line = r#"{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s","update":{"sessionUpdate":"session_info_update","title":"<coda-session-instruction> a","x":"\ud800"}}}"#;
        h.agent_frame(Frame::parse(line.as_bytes().to_vec()).expect("a frame"));
        let out = h.take().to_client;
        assert_eq!(out[0].value().pointer("/params/update/title"), Some(&json!("hello")));
        assert_eq!(out[0].value().pointer("/params/update/x"), Some(&json!("\u{fffd}")));
    }

    #[test]
    fn an_unknown_title_goes_out_as_none() {
        let mut h = harness();
        // A session titled in an earlier process.
        h.from_agent(info("old", "<coda-session-instruction> # Coda client"));
        // A prompt without text of its own, and one with a block not reproduced.
        let block = instruction::wrap("be brief");
        h.from_client(prompt("a", json!([text(&block)])));
        h.from_agent(info("a", "<coda-session-instruction> be brief </coda-session-instruction>"));
        h.from_client(prompt("b", json!([text(&block), {"type": "resource_link", "uri": "file:///x", "name": "x"}])));
        h.from_agent(info("b", "<coda-session-instruction> be brief </coda-session-instruction> @x"));
        assert_eq!(titles(&mut h), [Value::Null, Value::Null, Value::Null]);
    }

    #[test]
    fn a_session_prompted_in_an_earlier_process_gets_its_title_from_kimis_record() {
        let block = instruction::wrap("be brief");
        let recorded = json!([text(&block), text("fix\nthe build")]);
        let lookup: FirstPrompt = Arc::new(move |s| (s == "old").then(|| recorded.as_array().cloned()).flatten());
        let mut h = Harness::of(Title::new(lookup));
        h.from_agent(info("old", "<coda-session-instruction> be brief </coda-session-instruction> fix"));
        h.from_agent(info("gone", "<coda-session-instruction> # Coda client"));
        assert_eq!(titles(&mut h), [json!("fix the build"), Value::Null]);
    }

    #[test]
    fn a_frame_waits_for_its_record_with_those_of_its_session_and_others_go_on() {
        let block = instruction::wrap("be brief");
        let recorded = json!([text(&block), text("fix it")]);
        let lookup: FirstPrompt = Arc::new(move |s| (s == "old").then(|| recorded.as_array().cloned()).flatten());
        let mut h = Harness::of(Title::new(lookup));
        h.hold_work();
        h.from_client(json!({"jsonrpc": "2.0", "id": 1, "method": "session/load", "params": {"sessionId": "old"}}));
        h.from_client(json!({"jsonrpc": "2.0", "id": 2, "method": "x", "params": {"sessionId": "other"}}));
        h.from_client(json!({"jsonrpc": "2.0", "id": 3, "method": "session/list", "params": {}}));
        h.to_agent();
        h.from_agent(info("old", "<coda-session-instruction> be brief </coda-session-instruction> fix"));
        let chunk = json!({"jsonrpc": "2.0", "method": "session/update", "params": {"sessionId": "old",
            "update": {"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": "hi"}}}});
        h.from_agent(chunk.clone());
        let list = json!({"jsonrpc": "2.0", "id": 3, "result": {"sessions": [
            {"sessionId": "old", "title": "<coda-session-instruction> be"}]}});
        h.from_agent(list);
        // Of the same session: the load's answer, by the request table.
        h.from_agent(json!({"jsonrpc": "2.0", "id": 1, "result": {}}));
        // Of another session, and of none: on at once, before the record is read.
        let other = json!({"jsonrpc": "2.0", "id": 2, "result": {}});
        h.from_agent(other.clone());
        let plain = json!({"jsonrpc": "2.0", "method": "_x/note", "params": {}});
        h.from_agent(plain.clone());
        assert_eq!(h.to_client(), [other, plain]);
        assert_eq!(h.work_waiting(), 1, "one read for the session, however many frames wait for it");
        h.run_work();
        let out = h.to_client();
        assert_eq!(out.len(), 4, "{out:?}");
        assert_eq!(out[0]["params"]["update"]["title"], "fix it");
        assert_eq!(out[1], chunk);
        assert_eq!(out[2]["result"]["sessions"][0]["title"], "fix it");
        assert_eq!(out[3]["id"], 1);
        // Known now: no more waiting.
        h.from_agent(info("old", "<coda-session-instruction> be"));
        assert_eq!(h.work_waiting(), 0);
        assert_eq!(titles(&mut h), [json!("fix it")]);
    }

    #[test]
    fn the_first_client_prompt_is_read_from_the_main_wire() {
        let root = tempfile::tempdir().expect("a temporary folder");
        let dir = root.path().join("sessions/wd_work_0123456789ab/session_1/agents/main");
        std::fs::create_dir_all(&dir).expect("the session folder");
        let block = instruction::wrap("be brief");
        let lines = [
            json!({"type": "metadata", "protocol_version": "1.5"}),
            json!({"type": "turn.prompt", "agentId": "main", "turnId": 0, "origin": {"kind": "skill_activation"}, "input": [text("/skill:x")]}),
            json!({"type": "turn.prompt", "agentId": "main", "turnId": 1, "origin": {"kind": "user"},
                "input": [text(&block), text("hello"), {"type": "image_url", "imageUrl": {"url": "data:"}}]}),
            json!({"type": "turn.prompt", "agentId": "main", "turnId": 2, "origin": {"kind": "user"}, "input": [text("later")]}),
        ];
        let wire: String = lines.iter().map(|l| format!("{l}\n")).collect();
        std::fs::write(dir.join("wire.jsonl"), format!("not json\n{wire}")).expect("the wire");
        let first = first_prompt_from_files(Some(root.path().to_path_buf()));
        let blocks = first("session_1").expect("found");
        assert_eq!(title_after_block(&blocks).as_deref(), Some("hello [image]"));
        assert_eq!(first("session_2"), None);
        assert_eq!(first("../session_1"), None);
    }

    #[test]
    fn odd_shapes_from_kimi_go_on_untouched() {
        let mut h = harness();
        h.from_client(json!({"jsonrpc": "2.0", "id": 1, "method": "session/list", "params": {}}));
        let odd = [
            json!({"jsonrpc": "2.0", "method": "session/update", "params": {"sessionId": "s",
                "update": {"sessionUpdate": "session_info_update", "title": 1e300}}}),
            json!({"jsonrpc": "2.0", "method": "session/update", "params": {"sessionId": 7,
                "update": {"sessionUpdate": "session_info_update"}}}),
            json!({"jsonrpc": "2.0", "id": 1, "result": {"sessions": {"title": "<coda-session-instruction>"}}}),
        ];
        h.to_agent();
        for v in &odd {
            h.from_agent(v.clone());
        }
        assert_eq!(h.to_client(), odd);
        // A prompt without a sessionId or blocks is passed on as it is.
        let bare = Frame::from_value(&json!({"jsonrpc": "2.0", "id": 2, "method": "session/prompt", "params": {}}));
        h.client_frame(bare.clone());
        assert_eq!(h.take().to_agent, [bare]);
    }

    #[test]
    fn session_list_titles_are_rewritten_the_same_way() {
        let mut h = harness();
        let block = instruction::wrap("be brief");
        h.from_client(prompt("s", json!([text(&block), text("hello")])));
        h.from_client(json!({"jsonrpc": "2.0", "id": "l", "method": "session/list", "params": {}}));
        let list = json!({"jsonrpc": "2.0", "id": "l", "result": {"nextCursor": null, "sessions": [
            {"sessionId": "s", "cwd": "/w", "title": "<coda-session-instruction> be brief </coda-session-instruction> hello", "updatedAt": null},
            {"sessionId": "old", "cwd": "/w", "title": "<coda-session-instruction> # Coda", "updatedAt": null},
            {"sessionId": "plain", "cwd": "/w", "title": "plain title", "updatedAt": null}]}});
        h.from_agent(list.clone());
        let out = h.to_client().pop().expect("the list went on");
        let got: Vec<&Value> =
            out["result"]["sessions"].as_array().expect("sessions").iter().map(|e| &e["title"]).collect();
        assert_eq!(got, [&json!("hello"), &Value::Null, &json!("plain title")]);
        // The same answer to any other request is not touched.
        h.from_client(json!({"jsonrpc": "2.0", "id": "m", "method": "_x/other", "params": {}}));
        let mut other = list.clone();
        other["id"] = json!("m");
        h.from_agent(other.clone());
        assert_eq!(h.to_client(), [other]);
    }
}

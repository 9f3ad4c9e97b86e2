//! Coda's usage facts (section 用量里的数据), once for every binary: `_meta.coda` on a root session's
//! `usage_update`, for Coda's lifecycle workflows. Where each fact comes from is the adapter's ([`Source`]); the
//! rules are this layer's ([`UsageFacts`]):
//!
//! - **Roots only**: only a session Coda opened (the engine's session table) gets facts; a subagent's session,
//!   or one this connection never opened, is passed on as it came.
//! - **Never `{}`**: a `usage_update` is stamped only when a fact is known; nothing known, it goes on untouched.
//! - **One meaning per fact**, in every binary: `lastRequestAt` is when the main thread last sent a request to
//!   the model (where the prompt cache starts: never a compaction's summarising request, a title or a side
//!   thread; ISO 8601, UTC, milliseconds); `contextTokens` the context that request carried, as the CLI or its
//!   provider counted it; `compactedAt` the last compaction that completed, asked for or automatic; `cacheTtl`
//!   only where the CLI or its provider says it (no CLI does today), never a guess.
//! - **A fact changed where the CLI sends no `usage_update`** (a compaction between turns, a CLI that sends none):
//!   the layer sends one of its own ([`Fact::Send`]), with the CLI's own `used` and `size` where it said them.
//! - **Facts at load**: a session Coda loads or resumes in a fresh process starts with what the CLI keeps of it
//!   ([`Source::at_load`]: its session files, its server), read off the relay loop while the CLI loads; the
//!   session's updates wait for it (at most [`LOAD_HOLD`]). Live facts win over loaded ones. What a CLI keeps
//!   nowhere is said in its adapter's docs. A CLI that sends no `usage_update` at load may have the loaded facts
//!   sent in one of the shim's own after its answer ([`Fact::Loaded`]).
//! - **Replayed history is no fact**: what the CLI sends while Coda's `session/load` or `session/resume` of the
//!   session is open describes the past.
//! - **Holds**: a `usage_update` whose facts are still on their way (a CLI whose records the shim reads a little
//!   after the CLI answers, [`Source::waits`]) waits at most [`HOLD`], and every frame of the CLI after it waits
//!   behind it (none is reordered); when the hold runs out, only that session is given up on.
//! - Coda drops a `_meta.coda` over 4 KiB: these facts are a few dozen bytes, and a `cacheTtl` that is not a
//!   short duration is left out.
//!
//! Bounds: one entry per root session (forgotten with the root), the frames held behind one update (released
//! within [`HOLD`] or [`LOAD_HOLD`], and at most [`HELD_MAX`]).

use crate::HashMap;
use std::collections::VecDeque;
use std::time::{Duration, Instant, SystemTime};

use serde_json::{Map, Value, json};

use crate::frame::{self, Frame, Kind};
use crate::json::View;
use crate::layer::{Cx, Layer};

/// The longest a `usage_update` waits for facts still on their way ([`Source::waits`]).
pub const HOLD: Duration = Duration::from_secs(2);

/// The longest a loaded session's updates wait for what the CLI keeps of it ([`Source::at_load`]).
pub const LOAD_HOLD: Duration = Duration::from_secs(5);

/// The most frames held behind an update: past it the hold is given up (a CLI that floods while the shim waits).
pub const HELD_MAX: usize = 10_000;

/// What Coda's workflows read of a session. `None` is a fact not known (left out, never guessed).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Facts {
    pub last_request_at: Option<SystemTime>,
    pub context_tokens: Option<u64>,
    pub compacted_at: Option<SystemTime>,
    /// An ISO 8601 duration (`PT1H`), as the CLI said it.
    pub cache_ttl: Option<String>,
}

/// The longest `cacheTtl` kept (an ISO 8601 duration is a handful of characters).
const CACHE_TTL_MAX: usize = 32;

/// `2026-10-28T01:06:12.418Z`: a time as Coda's facts carry it (UTC, milliseconds; what `toISOString()` writes).
pub fn iso(at: SystemTime) -> Option<String> {
    let at = jiff::Timestamp::try_from(at).ok()?;
    Some(match iso_digits(at) {
        Some(text) => text.iter().map(|&b| char::from(b)).collect(),
        // RFC 3339 in UTC with three digits of the second's fraction, always (a year past four digits signed).
        None => format!("{at:.3}"),
    })
}

/// [`iso`] written into `out` (quoted), without a string made for it: every usage update is stamped with one or
/// two.
fn write_iso(out: &mut Vec<u8>, at: jiff::Timestamp) {
    out.push(b'"');
    match iso_digits(at) {
        Some(text) => out.extend_from_slice(&text),
        None => out.extend_from_slice(format!("{at:.3}").as_bytes()),
    }
    out.push(b'"');
}

/// [`iso`]'s text for a year of four digits, put in digit by digit (a tenth of a formatted `Timestamp`); `None`
/// for any other year.
fn iso_digits(at: jiff::Timestamp) -> Option<[u8; 24]> {
    let t = jiff::tz::Offset::UTC.to_datetime(at);
    if !(0..=9999).contains(&t.year()) {
        return None;
    }
    let mut out = *b"0000-00-00T00:00:00.000Z";
    let mut put = |at: usize, width: usize, n: i32| {
        let mut n = n.unsigned_abs();
        for digit in out[at..at + width].iter_mut().rev() {
            *digit = b'0' + (n % 10) as u8;
            n /= 10;
        }
    };
    put(0, 4, t.year().into());
    put(5, 2, t.month().into());
    put(8, 2, t.day().into());
    put(11, 2, t.hour().into());
    put(14, 2, t.minute().into());
    put(17, 2, t.second().into());
    put(20, 3, t.subsec_nanosecond() / 1_000_000);
    Some(out)
}

impl Facts {
    /// The `_meta.coda` object, holding what is known (empty when nothing is).
    pub fn to_json(&self) -> Map<String, Value> {
        let mut coda = Map::new();
        if let Some(at) = self.last_request_at.and_then(iso) {
            coda.insert("lastRequestAt".into(), json!(at));
        }
        if let Some(n) = self.context_tokens {
            coda.insert("contextTokens".into(), json!(n));
        }
        if let Some(ttl) = self.ttl() {
            coda.insert("cacheTtl".into(), json!(ttl));
        }
        if let Some(at) = self.compacted_at.and_then(iso) {
            coda.insert("compactedAt".into(), json!(at));
        }
        coda
    }

    /// `cacheTtl` when it is a fact: an ISO 8601 duration (it starts with `P`) of at most [`CACHE_TTL_MAX`] bytes.
    fn ttl(&self) -> Option<&String> {
        self.cache_ttl.as_ref().filter(|t| t.len() <= CACHE_TTL_MAX && t.starts_with('P'))
    }

    /// What [`Facts::to_json`] holds, each when it is a fact: `cacheTtl`, `compactedAt`, `contextTokens` and
    /// `lastRequestAt` (a time jiff cannot hold is none, as [`iso`] has it).
    fn known(&self) -> (Option<&String>, Option<jiff::Timestamp>, Option<u64>, Option<jiff::Timestamp>) {
        let time = |at: Option<SystemTime>| at.and_then(|at| jiff::Timestamp::try_from(at).ok());
        let ttl = self.ttl();
        (ttl, time(self.compacted_at), self.context_tokens, time(self.last_request_at))
    }

    /// No fact is known ([`Facts::to_json`] is empty), told without writing any.
    pub fn is_empty(&self) -> bool {
        matches!(self.known(), (None, None, None, None))
    }

    /// [`Facts::to_json`] written as JSON text (its keys in the order a `Map` keeps them), without building it.
    #[cfg(test)]
    fn write_json(&self, out: &mut Vec<u8>) {
        self.write_json_kept(out, &mut Default::default());
    }

    /// [`Facts::write_json`], the text of each time taken from `times` (the compaction's, the request's) while
    /// it is the time written last.
    fn write_json_kept(&self, out: &mut Vec<u8>, [compacted, request]: &mut [IsoText; 2]) {
        let ttl = self.ttl();
        let compacted = self.compacted_at.and_then(|at| compacted.text(at));
        let (tokens, request) = (self.context_tokens, self.last_request_at.and_then(|at| request.text(at)));
        let mut first = true;
        let mut key = |out: &mut Vec<u8>, name: &str| {
            out.extend_from_slice(if first { b"{\"" } else { b",\"" });
            out.extend_from_slice(name.as_bytes());
            out.extend_from_slice(b"\":");
            first = false;
        };
        if let Some(ttl) = ttl {
            key(out, "cacheTtl");
            serde_json::to_writer(&mut *out, ttl).expect("a string always serialises");
        }
        if let Some(at) = compacted {
            key(out, "compactedAt");
            out.extend_from_slice(at);
        }
        if let Some(n) = tokens {
            key(out, "contextTokens");
            serde_json::to_writer(&mut *out, &n).expect("a number always serialises");
        }
        if let Some(at) = request {
            key(out, "lastRequestAt");
            out.extend_from_slice(at);
        }
        if first {
            out.push(b'{');
        }
        out.push(b'}');
    }

    /// [`Facts::stamp`] on a frame: the `usage_update` with the facts written in, its bytes as they were
    /// around them (the CLI's key order and number spellings kept; nothing parsed: the update's `_meta` is
    /// found by the pass that read its `figures`, [`Figures::of`]). `facts` are these facts as JSON text
    /// (`Facts::write_json`, kept per session while they stay the same). `None` for a frame that is no
    /// `usage_update`, or when no fact is known (never an empty object). A frame with a lone surrogate escape
    /// is parsed and written again, as every frame a layer edits (the escape written as U+FFFD).
    pub fn stamp_frame(&self, frame: &Frame, figures: &Figures<'_>, facts: &str) -> Option<Frame> {
        if frame.session_update() != Some("usage_update") || facts == "{}" {
            return None;
        }
        if frame.lone_surrogate() {
            return self.stamp_value(frame);
        }
        let line = frame.bytes();
        let update = figures.update?;
        // What replaces `line[cut]`: `_meta` added to `update`, `coda` added to `_meta` or its value replaced,
        // or a `_meta` that is no object replaced. A key twice (which one a reader keeps is its own choice)
        // is left to the parsed value's rules.
        // The member `name` of `v`, and whether it is the only one of that name.
        fn only<'a>(v: View<'a>, name: &str) -> (Option<View<'a>>, bool) {
            let mut found = v.members().filter(|(k, _)| k.is(name)).map(|(_, v)| v);
            let first = found.next();
            (first, found.next().is_none())
        }
        let (cut, with): (std::ops::Range<usize>, [&str; 3]) = match (figures.meta, figures.metas == 1) {
            (None, _) => {
                let end = update.range_in(line)?.end - 1;
                (end..end, [",\"_meta\":{\"coda\":", facts, "}"])
            }
            (Some(meta), true) if meta.text().first() == Some(&b'{') => match only(meta, "coda") {
                (None, _) => {
                    let end = meta.range_in(line)?.end - 1;
                    let comma = if meta.members().next().is_some() { "," } else { "" };
                    (end..end, [comma, "\"coda\":", facts])
                }
                (Some(coda), true) => (coda.range_in(line)?, [facts, "", ""]),
                (Some(_), false) => return self.stamp_value(frame),
            },
            (Some(meta), true) => (meta.range_in(line)?, ["{\"coda\":", facts, "}"]),
            (Some(_), false) => return self.stamp_value(frame),
        };
        Some(frame.spliced_parts(cut, with))
    }

    /// [`Facts::stamp`] on the frame's parsed value, written out again.
    fn stamp_value(&self, frame: &Frame) -> Option<Frame> {
        let mut v = frame.to_value();
        self.stamp(&mut v).then(|| frame.rewritten(v))
    }

    /// Writes the facts into a `session/update` `usage_update` value (its `update._meta.coda`, keeping the
    /// `_meta` keys that were there, the facts replacing a `coda` the CLI wrote). False when `frame` is no
    /// usage update, or no fact is known (left as it was: never an empty object).
    pub fn stamp(&self, frame: &mut Value) -> bool {
        let coda = self.to_json();
        if coda.is_empty() {
            return false;
        }
        let Some(update) = frame.pointer_mut("/params/update").and_then(Value::as_object_mut) else { return false };
        if update.get("sessionUpdate").and_then(Value::as_str) != Some("usage_update") {
            return false;
        }
        crate::json::object_at(update, "_meta").insert("coda".into(), Value::Object(coda));
        true
    }

    /// A `usage_update` of the shim's for `session`, for a CLI that sends none when a fact changes. `used` and
    /// `size` are ACP's required fields: the CLI's own figures where it has them.
    pub fn update(&self, session: &str, used: u64, size: u64) -> Frame {
        let mut v = json!({"jsonrpc":"2.0","method":"session/update","params":{"sessionId":session,
            "update":{"sessionUpdate":"usage_update","used":used,"size":size}}});
        self.stamp(&mut v);
        frame::Frame::from_value(&v)
    }

    /// `loaded` fills in what is not known (live facts are newer than what the CLI kept).
    fn fill(&mut self, loaded: Facts) {
        self.last_request_at = self.last_request_at.or(loaded.last_request_at);
        self.context_tokens = self.context_tokens.or(loaded.context_tokens);
        self.compacted_at = self.compacted_at.or(loaded.compacted_at);
        self.cache_ttl = self.cache_ttl.take().or(loaded.cache_ttl);
    }
}

/// One thing a CLI said of a session's facts.
#[derive(Debug, Clone, PartialEq)]
pub enum Fact {
    /// The main thread sent a request to the model (`lastRequestAt`).
    Request(SystemTime),
    /// The context of that request (`contextTokens`).
    Context(u64),
    /// A compaction completed (`compactedAt`).
    Compacted(SystemTime),
    /// The CLI's own count of its context and the model's window: the `used` and `size` of the shim's updates.
    Used(u64),
    Size(u64),
    /// A fact changed where the CLI sends no `usage_update`: the shim sends one.
    Send,
    /// The CLI answered Coda's load or resume of the session and sends no `usage_update` for it: the shim sends
    /// one with the facts loaded, once they are read (said from [`Source::answered`]; the `size` is needed too).
    Loaded,
}

/// What a [`Source`] said, by session.
pub type Said = Vec<(String, Fact)>;

/// What the CLI keeps of a session, read by a job ([`Source::at_load`]).
pub type LoadJob = Box<dyn FnOnce() -> Facts + Send>;

/// Where one CLI's usage facts are: all an adapter writes for usage facts. Each method gets the input's
/// context (the engine's tables, the time) and says facts into `out`; none emits a frame.
pub trait Source: Send + 'static {
    /// What the adapter's set-up hands in (a watch's records, a server's events).
    type Event: Send + 'static;

    /// A frame from Coda on its way to the CLI.
    fn from_client(&mut self, _frame: &Frame, _cx: &mut Cx, _out: &mut Said) {}

    /// Whether a frame from the CLI that is neither an answer nor a `usage_update` says facts (its envelope).
    fn wants(&self, _frame: &Frame) -> bool {
        false
    }

    /// Whether [`Source::wants`] answers a streamed chunk from no more than the source's state, the chunk's
    /// session and its kind (see [`Layer::chunks_pass_by_session`]); one that looks into a chunk's text or `_meta` says `false`.
    fn chunks_by_session(&self) -> bool {
        true
    }

    /// Such a frame.
    fn from_agent(&mut self, _frame: &Frame, _cx: &mut Cx, _out: &mut Said) {}

    /// The CLI's answer to one of Coda's requests.
    fn answered(&mut self, _answer: &Frame, _cx: &mut Cx, _out: &mut Said) {}

    /// A root session's `usage_update` of the CLI's, before it is stamped (its `used` and `size` are set
    /// already): the facts of that session it says, in order (no other session's; [`Fact::Send`] and
    /// [`Fact::Loaded`] mean nothing here, as the update goes out now).
    fn usage_update(&mut self, _session: &str, _update: &Figures<'_>, _cx: &mut Cx, _out: &mut Vec<Fact>) {}

    /// An event of the set-up's.
    fn on_event(&mut self, _event: Self::Event, _cx: &mut Cx, _out: &mut Said) {}

    /// Whether a `usage_update` of `session` must wait for facts still on their way (at most [`HOLD`]).
    fn waits(&self, _session: &str) -> bool {
        false
    }

    /// The wait for `session`'s facts ran out: what was awaited counts as come.
    fn waited_out(&mut self, _session: &str) {}

    /// Coda closed `session`: what the source keeps of it goes.
    fn closed(&mut self, _session: &str) {}

    /// How many entries the source keeps for sessions ([`Layer::kept`]).
    fn kept(&self) -> usize {
        0
    }

    /// The job that reads what the CLI keeps of `session`, which Coda loads or resumes with `params` (its
    /// `sessionId`, `cwd`), in the context of Coda's request; None: nothing to read.
    fn at_load(&self, _session: &str, _params: &Value, _cx: &Cx) -> Option<LoadJob> {
        None
    }
}

/// The [`LoadJob`] that reads with `read` what a CLI keeps of `session` under its data folder `home`; None without
/// a folder, or for an id that is no plain file name (empty, over 255 bytes, a path, or `.`-led): that is never
/// looked for.
pub fn in_folder(
    home: Option<&std::path::Path>,
    session: &str,
    read: fn(&std::path::Path, &str) -> Facts,
) -> Option<LoadJob> {
    let (home, session) = (home?.to_path_buf(), plain_name(session)?.to_owned());
    Some(Box::new(move || read(&home, &session)))
}

/// `session` when it can name a file or folder of it: not empty, at most 255 bytes, no `/`, `\` or NUL, not
/// starting with `.`.
pub fn plain_name(session: &str) -> Option<&str> {
    let plain = !session.is_empty()
        && session.len() <= 255
        && !session.contains(['/', '\\', '\0'])
        && !session.starts_with('.');
    plain.then_some(session)
}

/// The most of a CLI's record of a session read at load: its last 64 MiB.
pub const HISTORY_MAX: u64 = 64 << 20;

/// The lines of `file`'s last [`HISTORY_MAX`] bytes (a line cut at the start left out), for a [`LoadJob`].
pub fn history_lines(mut file: std::fs::File) -> Vec<Vec<u8>> {
    use std::io::{Read, Seek, SeekFrom};
    let Ok(len) = file.seek(SeekFrom::End(0)) else { return Vec::new() };
    let from = len.saturating_sub(HISTORY_MAX);
    if file.seek(SeekFrom::Start(from)).is_err() {
        return Vec::new();
    }
    let mut text = Vec::new();
    if file.take(HISTORY_MAX).read_to_end(&mut text).is_err() {
        return Vec::new();
    }
    let mut lines: Vec<Vec<u8>> = text.split(|b| *b == b'\n').filter(|l| !l.is_empty()).map(<[u8]>::to_vec).collect();
    if from > 0 && !lines.is_empty() {
        lines.remove(0);
    }
    lines
}

/// The figures of a `usage_update`'s `update` (ACP's `used` and `size`), read where they lie in one pass over
/// the update (of a key that appears twice, the last, as a parsed value has it): what the layer and a source
/// read of it, and where the facts' stamp goes ([`Facts::stamp_frame`]), without parsing the update.
#[derive(Debug, Clone, Copy, Default)]
pub struct Figures<'a> {
    pub used: Option<View<'a>>,
    pub size: Option<View<'a>>,
    /// The update (`None` when it is no object).
    update: Option<View<'a>>,
    /// Its `_meta`, and how many times it has one.
    meta: Option<View<'a>>,
    metas: usize,
}

impl<'a> Figures<'a> {
    /// The figures of `update` (none when it is no object).
    pub fn of(update: Option<View<'a>>) -> Figures<'a> {
        let mut figures = Figures::default();
        let Some(update) = update.filter(|u| u.text().first() == Some(&b'{')) else { return figures };
        const NAMES: [&str; 3] = ["used", "size", "_meta"];
        for (key, value) in update.members() {
            // A key as it is written, quotes and all (one with an escape compared unescaped).
            let which = match (key.escaped(), key.quoted()) {
                (false, b"\"used\"") => Some(0),
                (false, b"\"size\"") => Some(1),
                (false, b"\"_meta\"") => Some(2),
                (false, _) => None,
                (true, _) => NAMES.iter().position(|name| key.is(name)),
            };
            match which {
                Some(0) => figures.used = Some(value),
                Some(1) => figures.size = Some(value),
                Some(_) => {
                    figures.meta = Some(value);
                    figures.metas += 1;
                }
                None => {}
            }
        }
        figures.update = Some(update);
        figures
    }

    /// `used` when it is a `u64`.
    pub fn used(&self) -> Option<u64> {
        self.used.and_then(|v| v.as_u64())
    }

    /// `size` when it is a `u64`.
    pub fn size(&self) -> Option<u64> {
        self.size.and_then(|v| v.as_u64())
    }
}

/// Facts as JSON text ([`Facts::write_json`]), written again only when they changed: every `usage_update` is
/// stamped with them, and they change with a request or a compaction (a CLI's context count with nearly
/// every update: the times' text is kept apart, as they were written last).
#[derive(Default)]
struct Written {
    of: Option<Facts>,
    json: String,
    times: [IsoText; 2],
}

impl Written {
    /// The text, checked UTF-8 once each time it is written (a frame it is spliced into then needs no check
    /// of it: [`Frame::spliced_parts`]).
    fn json(&mut self, facts: &Facts) -> &str {
        if self.of.as_ref() != Some(facts) {
            let mut json = std::mem::take(&mut self.json).into_bytes();
            json.clear();
            facts.write_json_kept(&mut json, &mut self.times);
            // (JSON that serde_json and the facts wrote: UTF-8 whatever the facts say.)
            self.json = String::from_utf8(json).unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned());
            self.of = Some(facts.clone());
        }
        &self.json
    }
}

/// A time and its text as the facts write it ([`write_iso`], quoted; none for a time jiff cannot hold, which
/// is no fact), kept while the time stays the same.
#[derive(Default)]
struct IsoText(Option<(SystemTime, Option<Vec<u8>>)>);

impl IsoText {
    fn text(&mut self, at: SystemTime) -> Option<&[u8]> {
        if !matches!(&self.0, Some((kept, _)) if *kept == at) {
            let text = jiff::Timestamp::try_from(at).ok().map(|t| {
                let mut text = Vec::with_capacity(26);
                write_iso(&mut text, t);
                text
            });
            self.0 = Some((at, text));
        }
        self.0.as_ref()?.1.as_deref()
    }
}

/// Per root session.
#[derive(Default)]
struct Entry {
    facts: Facts,
    written: Written,
    used: Option<u64>,
    size: Option<u64>,
    /// The load's read of the CLI's record is under way (its round).
    loading: Option<u64>,
}

impl Entry {
    /// Keeps a fact (`Send` and `Loaded` are no fact kept: the layer answers them).
    fn set(&mut self, fact: Fact) {
        match fact {
            Fact::Request(at) => self.facts.last_request_at = Some(at),
            Fact::Context(n) => self.facts.context_tokens = Some(n),
            Fact::Compacted(at) => self.facts.compacted_at = Some(at),
            Fact::Used(n) => self.used = Some(n),
            Fact::Size(n) => self.size = Some(n),
            Fact::Send | Fact::Loaded => {}
        }
    }
}

/// A frame waiting behind a held update, or an update of the shim's to build when its turn comes.
enum Held {
    Frame(Frame),
    Own(String),
}

/// The layer's wake-ups.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Wake {
    /// The update at the front of the held frames has waited [`HOLD`].
    Hold(u64),
    /// A load's read has had [`LOAD_HOLD`].
    Load(String, u64),
}

/// Usage facts for one CLI (see the module's docs).
pub struct UsageFacts<S: Source> {
    cli: S,
    sessions: HashMap<String, Entry>,
    /// What the source says of a `usage_update`'s session (kept empty between updates: its room is reused).
    said: Vec<Fact>,
    held: VecDeque<Held>,
    /// Counts the holds and the loads (a wake-up of an earlier one finds nothing to do).
    holds: u64,
    loads: u64,
    /// Since when the update at the front of the held frames has waited: its hold ends [`HOLD`] after, however
    /// many records come meanwhile.
    since: Option<Instant>,
}

fn session_of(v: &Value) -> Option<&str> {
    v.pointer("/params/sessionId").and_then(Value::as_str)
}

/// Whether Coda's load or resume of `session` is open: what the CLI sends of it meanwhile is history.
fn loading(cx: &Cx, session: &str) -> bool {
    cx.open_requests().any(|r| (r.is("session/load") || r.is("session/resume")) && r.session() == Some(session))
}

fn is_root(cx: &Cx, session: &str) -> bool {
    cx.session(session).is_some_and(|s| s.is_root())
}

/// The entry of root session `session` in a table kept per root (made when missing; None for a session that is
/// no root): a source's, or this layer's. The table follows the engine's: a root it forgot (closed) is dropped
/// when a new one comes, so it holds at most the engine's roots (and those `keep` says).
pub fn per_root<'a, T: Default>(
    table: &'a mut HashMap<String, T>,
    session: &str,
    cx: &Cx,
    keep: impl Fn(&T) -> bool,
) -> Option<&'a mut T> {
    if !is_root(cx, session) {
        return None;
    }
    // (Looked up first: the entry is nearly always there, and `entry` would take an owned key.)
    if !table.contains_key(session) {
        table.retain(|s, t| keep(t) || is_root(cx, s));
        table.insert(session.to_owned(), T::default());
    }
    table.get_mut(session)
}

impl<S: Source> UsageFacts<S> {
    pub fn new(cli: S) -> UsageFacts<S> {
        UsageFacts {
            cli,
            sessions: HashMap::default(),
            said: Vec::new(),
            held: VecDeque::new(),
            holds: 0,
            loads: 0,
            since: None,
        }
    }

    /// The facts known of `session` (for tests).
    pub fn facts(&self, session: &str) -> Option<&Facts> {
        self.sessions.get(session).map(|e| &e.facts)
    }

    /// The CLI's facts source (for tests).
    pub fn source(&self) -> &S {
        &self.cli
    }

    fn entry(&mut self, session: &str, cx: &Cx) -> Option<&mut Entry> {
        per_root(&mut self.sessions, session, cx, |e| e.loading.is_some())
    }

    /// Applies what the source said; an update of the shim's goes out now, or behind what is held.
    fn apply(&mut self, said: Said, cx: &mut Cx) {
        let mut said = said.into_iter().peekable();
        while let Some((session, fact)) = said.next() {
            // The model's window is no history: a load's answer may say it.
            let loading = loading(cx, &session);
            let kept = |fact: &Fact| !loading || matches!(fact, Fact::Send | Fact::Loaded | Fact::Size(_));
            if !kept(&fact) {
                continue;
            }
            let held = !self.held.is_empty();
            let Some(e) = self.entry(&session, cx) else { continue };
            match fact {
                Fact::Send if held || e.loading.is_some() => self.held.push_back(Held::Own(session)),
                Fact::Send => self.own(&session, cx),
                Fact::Loaded if held || e.loading.is_some() => self.held.push_back(Held::Own(session)),
                // The load's answer is on its way out: the update goes after it.
                Fact::Loaded => self.own_after_load(&session, cx),
                fact => {
                    e.set(fact);
                    // The facts said of the same session next (a `usage_update`'s four) set in the entry found,
                    // not looked up again for each: nothing between them changes the tables.
                    let same = |(s, f): &(String, Fact)| *s == session && !matches!(f, Fact::Send | Fact::Loaded);
                    while let Some((_, fact)) = said.next_if(same) {
                        if kept(&fact) {
                            e.set(fact);
                        }
                    }
                }
            }
        }
    }

    /// The shim's `usage_update` for `session`, if a fact and the CLI's figures are known.
    fn own(&mut self, session: &str, cx: &mut Cx) {
        if !loading(cx, session) {
            self.own_after_load(session, cx);
        }
    }

    /// [`UsageFacts::own`], also while the load's answer is on its way out (the update goes after it).
    fn own_after_load(&mut self, session: &str, cx: &mut Cx) {
        let Some(e) = self.sessions.get(session) else { return };
        let (Some(used), Some(size)) = (e.used.or(e.facts.context_tokens), e.size) else {
            return tracing::debug!("no usage_update of the shim's for session {session}: the CLI's figures unknown");
        };
        if e.facts.is_empty() {
            return;
        }
        let update = e.facts.update(session, used, size);
        if let Some(s) = cx.session_mut(session) {
            s.set_used(used);
        }
        cx.to_client(update);
    }

    /// Whether a `usage_update` of `session` must wait now.
    fn must_wait(&self, session: &str) -> bool {
        self.sessions.get(session).is_some_and(|e| e.loading.is_some()) || self.cli.waits(session)
    }

    /// A frame from the CLI, in its turn (nothing held before it).
    fn handle(&mut self, frame: Frame, cx: &mut Cx) {
        let mut said = Vec::new();
        match frame.kind() {
            Kind::Response { .. } => {
                self.cli.answered(&frame, cx, &mut said);
                cx.to_client(frame);
                self.apply(said, cx);
            }
            _ if frame.session_update() == Some("usage_update") => self.usage_update(frame, cx),
            _ if self.cli.wants(&frame) => {
                let history = frame.session().is_some_and(|s| loading(cx, &s));
                // Read before it goes on, sent ahead of what the read sends: no copy kept to read after it.
                let mark = cx.mark();
                if !history {
                    self.cli.from_agent(&frame, cx, &mut said);
                    self.apply(said, cx);
                }
                cx.to_client_at(mark, frame);
            }
            _ => cx.to_client(frame),
        }
    }

    /// A `usage_update` of the CLI's: read where it lies (its session from the frame check's one pass, its
    /// figures from its `update`, [`Figures`]), its facts kept in its session's entry, found once (what the
    /// source says of it needs no session named per fact), and stamped in its bytes ([`Facts::stamp_frame`]).
    fn usage_update(&mut self, frame: Frame, cx: &mut Cx) {
        let Some(session) = frame.session().filter(|s| is_root(cx, s)) else { return cx.to_client(frame) };
        if self.must_wait(&session) {
            self.holds += 1;
            self.since = Some(cx.now());
            cx.after(HOLD, Wake::Hold(self.holds));
            self.held.push_back(Held::Frame(frame));
            return;
        }
        let update = Figures::of(frame.update_value());
        // (The CLI's own count, for a compaction's `before`: what it sent, history too.)
        if let Some(n) = update.used()
            && let Some(s) = cx.session_mut(&session)
        {
            s.set_used(n);
        }
        // What the CLI sends while Coda's load of the session is open is history: the model's window alone is
        // kept.
        let history = loading(cx, &session);
        let mut said = std::mem::take(&mut self.said);
        if !history {
            self.cli.usage_update(&session, &update, cx, &mut said);
        }
        let Some(e) = self.entry(&session, cx) else {
            said.clear();
            self.said = said;
            return cx.to_client(frame);
        };
        if let Some(n) = update.used().filter(|_| !history) {
            e.used = Some(n);
        }
        if let Some(n) = update.size() {
            e.size = Some(n);
        }
        for fact in said.drain(..) {
            e.set(fact);
        }
        let stamped = e.facts.stamp_frame(&frame, &update, e.written.json(&e.facts));
        self.said = said;
        cx.to_client(stamped.unwrap_or(frame));
    }

    /// Sends on what was held, in order, up to an update that must still wait (all of it with `out`: that
    /// update's session is given up on).
    fn release(&mut self, out: bool, cx: &mut Cx) {
        let mut give_up = out;
        while let Some(front) = self.held.front() {
            let waiting = match front {
                Held::Frame(f) => {
                    f.session().filter(|s| is_root(cx, s)).map(|s| s.into_owned()).filter(|s| self.must_wait(s))
                }
                Held::Own(s) => Some(s.clone()).filter(|s| self.sessions.get(s).is_some_and(|e| e.loading.is_some())),
            };
            if let Some(session) = waiting {
                // Its hold counts from when it began to wait at the front, not from the latest record.
                let since = *self.since.get_or_insert(cx.now());
                let left = (since + HOLD).saturating_duration_since(cx.now());
                if !give_up && !left.is_zero() {
                    self.holds += 1;
                    return cx.after(left, Wake::Hold(self.holds));
                }
                tracing::warn!(
                    "the facts of session {session}'s usage_update did not come within {HOLD:?}; sending it with the \
                     facts known"
                );
                self.cli.waited_out(&session);
                if let Some(e) = self.sessions.get_mut(&session) {
                    e.loading = None;
                }
                give_up = false;
            }
            self.since = None;
            match self.held.pop_front().expect("a front") {
                Held::Frame(f) => self.handle(f, cx),
                Held::Own(s) => self.own(&s, cx),
            }
        }
        cx.cancel(&Wake::Hold(self.holds));
    }

    /// What the CLI keeps of `session` came back.
    fn loaded(&mut self, (session, round, facts): (String, u64, Facts), cx: &mut Cx) {
        let Some(e) = self.sessions.get_mut(&session).filter(|e| e.loading == Some(round)) else { return };
        e.loading = None;
        e.facts.fill(facts);
        cx.cancel(&Wake::Load(session, round));
        self.release(false, cx);
    }
}

impl<S: Source> Layer for UsageFacts<S> {
    type Timer = Wake;
    type Event = S::Event;
    type Reply = std::convert::Infallible;

    fn from_client(&mut self, frame: Frame, cx: &mut Cx) {
        if matches!(frame.method(), Some("session/load" | "session/resume"))
            && frame.id().is_some()
            && let Some(session) = session_of(frame.value()).map(str::to_owned)
            && let Some(job) = self.cli.at_load(&session, frame.value().get("params").unwrap_or(&Value::Null), cx)
        {
            // Read while the CLI loads; the session is a root once the CLI's answer is in.
            self.loads += 1;
            let round = self.loads;
            let entry = self.sessions.entry(session.clone()).or_default();
            entry.loading = Some(round);
            cx.after(LOAD_HOLD, Wake::Load(session.clone(), round));
            cx.work(move || (session, round, job()), UsageFacts::<S>::loaded);
        }
        let mut said = Vec::new();
        self.cli.from_client(&frame, cx, &mut said);
        cx.to_agent(frame);
        self.apply(said, cx);
    }

    fn from_agent(&mut self, frame: Frame, cx: &mut Cx) {
        if !self.held.is_empty() {
            self.held.push_back(Held::Frame(frame));
            if self.held.len() > HELD_MAX {
                tracing::warn!("over {HELD_MAX} frames of the CLI waited behind a usage_update: it goes on");
                self.release(true, cx);
            }
            return;
        }
        // A load that failed opens no session: nothing waits for what the CLI kept.
        if let Some(r) = cx.answer_to(&frame).filter(|r| r.is("session/load") || r.is("session/resume"))
            && frame.value().get("result").is_none()
            && let Some(session) = r.session().map(str::to_owned)
        {
            self.sessions.remove(&session);
        }
        self.handle(frame, cx);
    }

    fn passes_from_agent(&self, frame: &Frame) -> bool {
        self.held.is_empty()
            && !matches!(frame.kind(), Kind::Response { .. })
            && frame.session_update() != Some("usage_update")
            && !self.cli.wants(frame)
    }

    fn chunks_pass_by_session(&self) -> bool {
        self.cli.chunks_by_session()
    }

    fn on_event(&mut self, event: S::Event, cx: &mut Cx) {
        let mut said = Vec::new();
        self.cli.on_event(event, cx, &mut said);
        self.apply(said, cx);
        self.release(false, cx);
    }

    /// A closed session's facts go (a load of it still being read too); frames held behind an update keep
    /// their place (they go on with the hold).
    fn session_closed(&mut self, closed: &[String], _cx: &mut Cx) {
        for session in closed {
            self.sessions.remove(session);
            self.cli.closed(session);
        }
    }

    fn kept(&self) -> usize {
        self.sessions.len() + self.cli.kept()
    }

    fn on_timer(&mut self, wake: Wake, cx: &mut Cx) {
        match wake {
            Wake::Hold(round) if round == self.holds => self.release(true, cx),
            Wake::Hold(_) => {}
            Wake::Load(session, round) => {
                if let Some(e) = self.sessions.get_mut(&session).filter(|e| e.loading == Some(round)) {
                    tracing::warn!("what the CLI keeps of session {session} was not read within {LOAD_HOLD:?}");
                    e.loading = None;
                    self.release(false, cx);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, UNIX_EPOCH};

    fn at(ms: u64) -> SystemTime {
        UNIX_EPOCH + Duration::from_millis(ms)
    }

    #[test]
    fn times_are_utc_with_milliseconds_whatever_the_zone() {
        assert_eq!(iso(at(1_793_149_572_418)).as_deref(), Some("2026-10-28T01:06:12.418Z"));
        assert_eq!(iso(at(0)).as_deref(), Some("1970-01-01T00:00:00.000Z"));
        // As jiff writes it, across years, leap days, the ends of days and of seconds, before 1970 and past 9999.
        let jiff = |t: SystemTime| jiff::Timestamp::try_from(t).ok().map(|t| format!("{t:.3}"));
        let mut ms: i64 = -62_135_596_800_000 - 86_400_000;
        while ms < 400_000_000_000_000 {
            let t = if ms >= 0 {
                UNIX_EPOCH + Duration::from_millis(ms as u64)
            } else {
                UNIX_EPOCH - Duration::from_millis(ms.unsigned_abs())
            };
            for t in [t, t + Duration::from_nanos(999_999), t + Duration::from_millis(999)] {
                assert_eq!(iso(t), jiff(t), "{ms}");
            }
            ms += 777_777_777 + ms.abs() / 40;
        }
    }

    #[test]
    fn facts_go_under_meta_coda_of_a_usage_update_and_keep_other_meta() {
        let facts = Facts {
            last_request_at: Some(at(1_793_149_572_418)),
            context_tokens: Some(53_000),
            compacted_at: Some(at(1_793_141_203_120)),
            cache_ttl: None,
        };
        let mut v = json!({"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s1","update":{
            "sessionUpdate":"usage_update","used":53000,"size":200000,"_meta":{"x":1,"coda":{"old":true}}}}});
        assert!(facts.stamp(&mut v));
        assert_eq!(
            v["params"]["update"]["_meta"],
            json!({"x":1,"coda":{"lastRequestAt":"2026-10-28T01:06:12.418Z","contextTokens":53000,
                "compactedAt":"2026-10-27T22:46:43.120Z"}})
        );
        assert!(serde_json::to_string(&v["params"]["update"]["_meta"]["coda"]).unwrap().len() < 4096);
    }

    #[test]
    fn other_frames_are_not_touched_and_a_bad_meta_is_replaced() {
        let facts = Facts { context_tokens: Some(1), ..Facts::default() };
        let mut other = json!({"params":{"update":{"sessionUpdate":"agent_message_chunk"}}});
        let before = other.clone();
        assert!(!facts.stamp(&mut other));
        assert_eq!(other, before);
        assert!(!facts.stamp(&mut json!({"params":7})));
        let mut v = json!({"params":{"update":{"sessionUpdate":"usage_update","_meta":"no"}}});
        assert!(facts.stamp(&mut v));
        assert_eq!(v["params"]["update"]["_meta"], json!({"coda":{"contextTokens":1}}));
    }

    /// The facts written into a frame's bytes give the value [`Facts::stamp`] gives, whatever the update's
    /// `_meta` is (none, an object with or without `coda`, no object, a key twice or escaped), with space
    /// anywhere, lone surrogates and numbers beyond f64.
    #[test]
    fn a_frame_stamped_in_place_reads_as_the_stamped_value() {
        let all = Facts {
            last_request_at: Some(at(1_793_149_572_418)),
            context_tokens: Some(53_000),
            compacted_at: Some(at(0)),
            cache_ttl: Some("PT1H \"\\ \u{1}".into()),
        };
        // A year before 0000 (written signed, as jiff writes it), and one past what jiff holds (no fact).
        let far = Facts {
            last_request_at: std::time::UNIX_EPOCH.checked_sub(Duration::from_secs(70_000_000_000)),
            compacted_at: std::time::UNIX_EPOCH.checked_add(Duration::from_secs(1 << 40)),
            ..Facts::default()
        };
        assert!(far.last_request_at.and_then(iso).is_some_and(|t| t.starts_with('-')));
        assert!(far.compacted_at.is_some() && far.compacted_at.and_then(iso).is_none());
        // Nothing that is a fact: a time past what jiff holds, a cache time that is no ISO 8601 duration.
        let none = Facts { compacted_at: far.compacted_at, cache_ttl: Some("1H".into()), ..Facts::default() };
        let facts = [all, Facts { context_tokens: Some(7), ..Facts::default() }, Facts::default(), far, none];
        let updates = [
            r#"{"sessionUpdate":"usage_update","used":1,"size":2}"#,
            r#"{"sessionUpdate":"usage_update"}"#,
            r#" { "sessionUpdate" : "usage_update" , "used" : 1e400 , "_meta" : { "x" : [ 1 ] } } "#,
            r#"{"_meta":{},"sessionUpdate":"usage_update"}"#,
            r#"{"_meta":{ },"sessionUpdate":"usage_update"}"#,
            r#"{"sessionUpdate":"usage_update","_meta":{"coda":{"old":true},"y":"\ud800"}}"#,
            r#"{"sessionUpdate":"usage_update","_meta":{"coda":"no","z":{"coda":1}}}"#,
            r#"{"sessionUpdate":"usage_update","_meta":"no"}"#,
            r#"{"sessionUpdate":"usage_update","_meta":null}"#,
            r#"{"sessionUpdate":"usage_update","_meta":[{"coda":1}]}"#,
            r#"{"sessionUpdate":"usage_update","_meta":{"a":1},"_meta":{"b":2}}"#,
            r#"{"sessionUpdate":"usage_update","_meta":{"coda":1,"coda":2}}"#,
            r#"{"sessionUpdate":"usage_update","_m\u0065ta":{"c\u006fda":1,"k":"v"}}"#,
        ];
        let mut spliced = 0;
        for update in updates {
            for (before, after) in [("", ""), (r#""x":"\ud83d","#, r#","w":{"update":{}}"#)] {
                let line = format!(
                    r#"{{"jsonrpc":"2.0", "method":"session/update","params":{{{before}"sessionId":"s1","update":{update}{after}}}}}"#
                );
                let frame = Frame::parse(line.clone().into_bytes()).expect("a frame");
                for facts in &facts {
                    let mut want = frame.to_value();
                    if !facts.stamp(&mut want) {
                        assert!(stamped(facts, &frame).is_none(), "nothing known: {line}");
                        continue;
                    }
                    let got = stamped(facts, &frame).expect("a usage_update");
                    assert_eq!(got.value(), &want, "{line}");
                    assert!(got.is_shim());
                    same_as_read(&got);
                    // In place, the bytes before `update` are the CLI's (parsed and written again, the space
                    // is gone).
                    let head = &line.as_bytes()[..line.find(r#""update""#).expect("an update")];
                    spliced += usize::from(got.bytes().starts_with(head));
                }
            }
        }
        // All but those with a key twice or a lone surrogate (and those with no fact known, left as they were).
        assert_eq!(spliced, 30, "stamped in place");
        let chunk = r#"{"jsonrpc":"2.0","method":"session/update","params":{"update":{"sessionUpdate":"agent_message_chunk"}}}"#;
        assert!(stamped(&Facts::default(), &Frame::parse(chunk.as_bytes().to_vec()).unwrap()).is_none());
        for facts in &facts {
            let mut text = Vec::new();
            facts.write_json(&mut text);
            assert_eq!(text == b"{}", facts.to_json().is_empty());
            assert_eq!(facts.is_empty(), facts.to_json().is_empty());
            assert_eq!(serde_json::from_slice::<Value>(&text).unwrap(), Value::Object(facts.to_json()));
        }
    }

    /// The figures read where they lie are those of the parsed update, for every frame of every recorded fixture
    /// and the hostile lines (keys twice or escaped, numbers beyond f64 or u64, figures of other types).
    #[test]
    fn figures_read_in_place_are_those_of_the_parsed_update() {
        let lines = crate::frame::lines_and_updates(
            "session/update",
            &[
                r#"{"sessionUpdate":"usage_update","used":5,"size":7,"used":6}"#,
                r#"{"sessionUpdate":"usage_update","us\u0065d":18446744073709551615,"size":18446744073709551616}"#,
                r#"{ "size" : 1.5e3 , "used" : -1 , "cost" : { "used" : 9 } }"#,
                r#"{"used":"5","size":null,"x":[{"used":1}]}"#,
                r#"{"used":1e400,"size":0.0}"#,
            ],
        );
        let mut read = 0;
        for line in lines {
            let Ok(frame) = Frame::parse(line) else { continue };
            let figures = Figures::of(frame.update_value());
            let update = frame.value().pointer("/params/update").filter(|u| u.is_object());
            let want = |k: &str| update.and_then(|u| u.get(k));
            assert_eq!(figures.used(), want("used").and_then(Value::as_u64), "{frame:?}");
            assert_eq!(figures.size(), want("size").and_then(Value::as_u64), "{frame:?}");
            assert_eq!(figures.used.map(|v| v.to_value()).as_ref(), want("used"));
            assert_eq!(figures.used.and_then(|v| v.as_f64()), want("used").and_then(Value::as_f64));
            read += usize::from(figures.used().is_some());
        }
        assert!(read > 100, "usage updates read ({read})");
    }

    /// A frame stamped in its bytes has the envelope and the places a frame read from its line has.
    /// [`Facts::stamp_frame`] with the frame's figures and the facts written now.
    fn stamped(facts: &Facts, frame: &Frame) -> Option<Frame> {
        let mut json = Vec::new();
        facts.write_json(&mut json);
        facts.stamp_frame(frame, &Figures::of(frame.update_value()), std::str::from_utf8(&json).ok()?)
    }

    /// The facts' JSON text kept between stamps is what they write now, as each of them changes, comes and
    /// goes (and comes back as it was).
    #[test]
    fn the_facts_text_kept_between_stamps_follows_every_change() {
        let mut facts = Facts::default();
        let mut written = Written::default();
        // (Times jiff cannot hold are no fact; a year before 0 is written as jiff writes it.)
        let far = SystemTime::UNIX_EPOCH + Duration::from_secs(400_000_000_000);
        let before_0 = SystemTime::UNIX_EPOCH - Duration::from_secs(70_000_000_000);
        let steps: [&dyn Fn(&mut Facts); 16] = [
            &|f| f.context_tokens = Some(1),
            &|f| f.context_tokens = Some(2),
            &|f| f.last_request_at = Some(at(1_793_149_572_418)),
            &|f| f.context_tokens = Some(3),
            &|f| f.last_request_at = Some(at(1_793_149_572_419)),
            &|f| f.compacted_at = Some(at(1)),
            &|f| f.last_request_at = Some(at(1_793_149_572_418)),
            &|f| f.cache_ttl = Some("PT1H".into()),
            &|f| f.compacted_at = Some(before_0),
            &|f| f.last_request_at = Some(far),
            &|f| f.context_tokens = Some(4),
            &|f| f.last_request_at = Some(at(1)),
            &|f| f.cache_ttl = Some("PT5M".into()),
            &|f| f.compacted_at = None,
            &|f| f.compacted_at = Some(at(1)),
            &|f| *f = Facts::default(),
        ];
        for step in steps.iter().chain(&steps) {
            step(&mut facts);
            let mut now = Vec::new();
            facts.write_json(&mut now);
            assert_eq!(written.json(&facts).as_bytes(), now, "{facts:?}");
            assert_eq!(written.json(&facts).as_bytes(), now, "{facts:?}");
        }
    }

    fn same_as_read(got: &Frame) {
        let read = Frame::built(got.bytes().to_vec());
        crate::frame::tests::reads_alike(got, &read, &String::from_utf8_lossy(got.bytes()));
    }

    /// Every `usage_update` of every recorded fixture and the hostile lines, stamped in its bytes, reads as the
    /// stamped value, with the envelope and places of a frame read from its line (`params` in any order, a
    /// session or `_meta` before or after the update, places at their length limit).
    #[test]
    fn every_recorded_usage_update_stamped_reads_as_its_line() {
        let facts = Facts {
            last_request_at: Some(at(1_793_149_572_418)),
            context_tokens: Some(53_000),
            compacted_at: None,
            cache_ttl: Some("PT1H".into()),
        };
        let mut lines = frame::recorded_lines();
        lines.extend(frame::hostile_lines());
        let long = "x".repeat(300);
        let huge = "y".repeat(usize::from(u16::MAX));
        for params in [
            format!(r#"{{"pad":"{huge}","sessionId":"s","update":{{"sessionUpdate":"usage_update"}},"_meta":{{}}}}"#),
            format!(r#"{{"pad":"{huge}","sessionId":"\u0073","update":{{"sessionUpdate":"usage_update"}}}}"#),
            format!(
                r#"{{"sessionId":"s","update":{{"sessionUpdate":"usage_update","x":"{huge}"}},"_meta":{{"a":1}}}}"#
            ),
            format!(
                r#"{{"sessionId":"s","update":{{"sessionUpdate":"usage_update","x":"{}"}},"_meta":{{}}}}"#,
                &huge[..65_400]
            ),
            format!(r#"{{"sessionId":"s","_meta":{{"m":"{huge}"}},"update":{{"sessionUpdate":"usage_update"}}}}"#),
            r#"{"update":{"sessionUpdate":"usage_update","used":1},"sessionId":"s","_meta":{"a":1}}"#.to_owned(),
            r#"{"_meta":{"a":1},"update":{"sessionUpdate":"usage_update","_meta":{"coda":{"x":1}}},"sessionId":"s\u0031"}"#.to_owned(),
            format!(r#"{{"pad":"{long}","update":{{"sessionUpdate":"usage_update","_meta":7}},"sessionId":"{long}"}}"#),
            format!(
                r#"{{"sessionId":"s","update":{{"sessionUpdate":"usage_update","_meta":{{}}}},"_meta":{{"b":"{long}"}}}}"#
            ),
        ] {
            let line = format!(r#"{{"jsonrpc":"2.0","method":"session/update","params":{params}}}"#);
            lines.push(line.into_bytes());
        }
        let mut count = 0;
        for line in lines {
            let Ok(frame) = Frame::parse(line) else { continue };
            let Some(got) = stamped(&facts, &frame) else { continue };
            let mut want = frame.to_value();
            assert!(facts.stamp(&mut want));
            assert_eq!(got.value(), &want);
            same_as_read(&got);
            count += 1;
        }
        assert!(count > 100, "usage updates stamped ({count})");
    }

    #[test]
    fn a_cache_ttl_is_written_only_when_it_looks_like_a_duration() {
        let mut f = Facts { cache_ttl: Some("PT1H".into()), ..Facts::default() };
        assert_eq!(f.to_json().get("cacheTtl"), Some(&json!("PT1H")));
        f.cache_ttl = Some("x".repeat(5000));
        assert!(f.to_json().get("cacheTtl").is_none());
    }

    #[test]
    fn only_a_plain_file_name_is_looked_for_in_a_data_folder() {
        fn kept(_: &std::path::Path, _: &str) -> Facts {
            Facts { context_tokens: Some(1), ..Facts::default() }
        }
        let home = std::path::Path::new("/nowhere");
        assert!(in_folder(None, "s1", kept).is_none(), "no folder");
        for bad in ["", ".", "..", ".hidden", "a/b", "../x", "a\\b", "a\0b", &"s".repeat(256)] {
            assert!(in_folder(Some(home), bad, kept).is_none(), "{bad:.20}");
        }
        let job = in_folder(Some(home), "019ae2f1-7c0f-7fee-8000-000000000001", kept).expect("a plain name");
        assert_eq!(job().context_tokens, Some(1));
    }

    #[test]
    fn the_shims_own_update_has_acps_fields_and_the_facts() {
        let f = Facts { context_tokens: Some(900), ..Facts::default() };
        let v = f.update("s9", 900, 128_000).value().clone();
        assert_eq!(v["params"]["sessionId"], "s9");
        assert_eq!(
            v["params"]["update"],
            json!({"sessionUpdate":"usage_update","used":900,"size":128000,"_meta":{"coda":{"contextTokens":900}}})
        );
    }

    /// A toy CLI: `fact` notifications say facts, `_test/wait` makes a session's updates wait, loads read
    /// `loaded`.
    struct Toy {
        loaded: Option<Facts>,
        waiting: crate::HashSet<String>,
    }

    impl Source for Toy {
        type Event = (String, bool);
        fn wants(&self, frame: &Frame) -> bool {
            frame.is_notification("fact")
        }
        fn from_agent(&mut self, frame: &Frame, _: &mut Cx, out: &mut Said) {
            let v = frame.value();
            let s = v["params"]["sessionId"].as_str().unwrap_or_default().to_owned();
            if let Some(n) = v["params"]["context"].as_u64() {
                out.push((s.clone(), Fact::Context(n)));
            }
            if v["params"]["send"] == true {
                out.push((s, Fact::Send));
            }
            // `said`: [session, fact, n] in order, as a source that speaks of several sessions at once.
            for said in v["params"]["said"].as_array().into_iter().flatten() {
                let (s, n) = (said[0].as_str().unwrap_or_default().to_owned(), said[2].as_u64().unwrap_or(0));
                let at = std::time::UNIX_EPOCH + Duration::from_secs(n);
                out.push((
                    s,
                    match said[1].as_str() {
                        Some("request") => Fact::Request(at),
                        Some("context") => Fact::Context(n),
                        Some("compacted") => Fact::Compacted(at),
                        Some("used") => Fact::Used(n),
                        Some("size") => Fact::Size(n),
                        _ => Fact::Send,
                    },
                ));
            }
        }
        fn on_event(&mut self, (session, wait): (String, bool), _: &mut Cx, _: &mut Said) {
            if wait {
                self.waiting.insert(session);
            } else {
                self.waiting.remove(&session);
            }
        }
        fn waits(&self, session: &str) -> bool {
            self.waiting.contains(session)
        }
        fn waited_out(&mut self, session: &str) {
            self.waiting.remove(session);
        }
        fn at_load(&self, _: &str, _: &Value, _: &Cx) -> Option<LoadJob> {
            let loaded = self.loaded.clone()?;
            Some(Box::new(move || loaded))
        }
        /// An update's `request` (seconds): when its request left, as a source reads it off the update.
        fn usage_update(&mut self, _: &str, update: &Figures<'_>, _: &mut Cx, out: &mut Vec<Fact>) {
            let request = update.update.and_then(|u| u.get("request")).and_then(|r| r.as_u64());
            out.extend(request.map(|n| Fact::Request(std::time::UNIX_EPOCH + Duration::from_secs(n))));
        }
    }

    use crate::layer::testing::Harness;

    fn toy(loaded: Option<Facts>) -> Harness {
        Harness::of(UsageFacts::new(Toy { loaded, waiting: Default::default() }))
    }

    fn usage(session: &str, used: u64) -> Value {
        json!({"jsonrpc":"2.0","method":"session/update","params":{"sessionId":session,
            "update":{"sessionUpdate":"usage_update","used":used,"size":100}}})
    }

    fn fact(session: &str, context: u64, send: bool) -> Value {
        json!({"jsonrpc":"2.0","method":"fact","params":{"sessionId":session,"context":context,"send":send}})
    }

    fn open(h: &mut Harness, id: u64, method: &str, session: &str) {
        h.from_client(json!({"jsonrpc":"2.0","id":id,"method":method,"params":{"sessionId":session,"cwd":"/w"}}));
        let result = if method == "session/new" { json!({"sessionId":session}) } else { json!({}) };
        h.from_agent(json!({"jsonrpc":"2.0","id":id,"result":result}));
        h.take();
    }

    /// What the CLI sends of a session while Coda loads it again (it is open: a root) is history: neither its
    /// `used` nor what the source reads of it is a fact; its `size`, the model's window, is kept.
    #[test]
    fn an_update_while_coda_loads_an_open_session_again_is_no_fact() {
        let mut h = toy(None);
        open(&mut h, 1, "session/new", "r");
        let update = |used: u64, size: u64, request: u64| {
            json!({"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"r",
                "update":{"sessionUpdate":"usage_update","used":used,"size":size,"request":request}}})
        };
        let at = |s: u64| iso(std::time::UNIX_EPOCH + Duration::from_secs(s)).unwrap();
        h.from_agent(update(5, 100, 7));
        assert_eq!(h.to_client()[0]["params"]["update"]["_meta"]["coda"], json!({"lastRequestAt": at(7)}));
        h.from_client(json!({"jsonrpc":"2.0","id":2,"method":"session/load","params":{"sessionId":"r","cwd":"/w"}}));
        h.take();
        h.from_agent(update(9, 200, 8));
        assert_eq!(h.to_client()[0]["params"]["update"]["_meta"]["coda"], json!({"lastRequestAt": at(7)}));
        h.from_agent(json!({"jsonrpc":"2.0","id":2,"result":{}}));
        h.take();
        // A fact said now gets an update of the shim's: the live `used`, the window the load's update said.
        h.from_agent(fact("r", 3, true));
        let out = h.to_client();
        assert_eq!(out[0], fact("r", 3, true));
        assert_eq!(
            out[1]["params"]["update"],
            json!({"sessionUpdate":"usage_update","used":5,"size":200,
                "_meta":{"coda":{"contextTokens":3,"lastRequestAt":at(7)}}})
        );
    }

    #[test]
    fn only_roots_get_facts_and_never_an_empty_object() {
        let mut h = toy(None);
        open(&mut h, 1, "session/new", "r");
        // Nothing known: the update goes on as it came.
        h.from_agent(usage("r", 5));
        assert_eq!(h.to_client(), [usage("r", 5)]);
        // A session nobody opened (a subagent's) says facts: none are kept, its update is left alone.
        h.from_agent(fact("child", 7, true));
        h.from_agent(usage("child", 7));
        assert_eq!(h.to_client(), [fact("child", 7, true), usage("child", 7)]);
        h.from_agent(fact("r", 9, true));
        let out = h.to_client();
        assert_eq!(out.len(), 2, "the CLI's frame, then the shim's update: {out:?}");
        assert_eq!(
            out[1]["params"]["update"],
            json!({"sessionUpdate":"usage_update","used":5,"size":100,
            "_meta":{"coda":{"contextTokens":9}}})
        );
    }

    /// Facts said of several sessions in one go are each set in their own session's entry, in order: a run of
    /// one session's facts is set in the entry found once, what a loading session says is skipped but its
    /// window, and an update asked for in the middle has the facts said before it only.
    #[test]
    fn facts_said_together_go_each_to_its_session_in_order() {
        let mut h = toy(None);
        open(&mut h, 1, "session/new", "a");
        open(&mut h, 2, "session/new", "b");
        // A root loaded again: its load not answered yet.
        open(&mut h, 3, "session/new", "l");
        h.from_client(json!({"jsonrpc":"2.0","id":4,"method":"session/load","params":{"sessionId":"l","cwd":"/w"}}));
        h.take();
        let said = json!([
            ["a", "used", 10],
            ["a", "size", 100],
            ["a", "context", 11],
            ["b", "context", 21],
            ["b", "size", 200],
            ["l", "context", 31],
            ["l", "size", 300],
            ["l", "used", 32],
            ["a", "request", 12],
            ["a", "send", 0],
            ["a", "context", 13],
            ["b", "compacted", 22],
            ["b", "used", 23],
            ["a", "compacted", 14],
        ]);
        h.from_agent(json!({"jsonrpc":"2.0","method":"fact","params":{"sessionId":"a","said":said}}));
        let out = h.to_client();
        assert_eq!(out.len(), 2, "the CLI's frame, then the update asked for: {out:?}");
        assert_eq!(
            out[1]["params"]["update"],
            json!({"sessionUpdate":"usage_update","used":10,"size":100,"_meta":{"coda":{
                "contextTokens":11,"lastRequestAt":"1970-01-01T00:00:12.000Z"}}}),
            "the facts said before it, not those after"
        );
        let at = |s: u64| Some(std::time::UNIX_EPOCH + Duration::from_secs(s));
        let layer = h.layer::<UsageFacts<Toy>>(0);
        let a = layer.sessions.get("a").expect("a's entry");
        assert_eq!((a.used, a.size), (Some(10), Some(100)));
        assert_eq!(
            a.facts,
            Facts { context_tokens: Some(13), last_request_at: at(12), compacted_at: at(14), cache_ttl: None }
        );
        let b = layer.sessions.get("b").expect("b's entry");
        assert_eq!((b.used, b.size), (Some(23), Some(200)));
        assert_eq!(b.facts, Facts { context_tokens: Some(21), compacted_at: at(22), ..Facts::default() });
        // The loading session: its window only (the model's window is no history).
        let l = layer.sessions.get("l").map(|l| (l.used, l.size, l.facts.clone()));
        assert_eq!(l, Some((None, Some(300), Facts::default())));
    }

    #[test]
    fn a_loaded_session_starts_with_what_the_cli_kept_and_live_facts_win() {
        let kept = Facts { context_tokens: Some(1), compacted_at: Some(std::time::UNIX_EPOCH), ..Facts::default() };
        let mut h = toy(Some(kept));
        h.hold_work();
        h.from_client(json!({"jsonrpc":"2.0","id":1,"method":"session/load","params":{"sessionId":"r","cwd":"/w"}}));
        h.from_agent(json!({"jsonrpc":"2.0","id":1,"result":{}}));
        h.from_agent(usage("r", 3));
        h.from_agent(fact("r", 4, false));
        assert_eq!(h.to_client().len(), 1, "the answer; the update waits for the read, the frame after it too");
        assert_eq!(h.run_work(), 1);
        let out = h.to_client();
        assert_eq!(
            out[0]["params"]["update"]["_meta"]["coda"],
            json!({"contextTokens":1,"compactedAt":"1970-01-01T00:00:00.000Z"})
        );
        assert_eq!(out[1], fact("r", 4, false));
        h.from_agent(usage("r", 3));
        assert_eq!(h.to_client()[0]["params"]["update"]["_meta"]["coda"]["contextTokens"], 4, "the live fact");
    }

    #[test]
    fn a_read_that_never_comes_holds_the_session_for_load_hold_only() {
        let kept = Facts { context_tokens: Some(1), ..Facts::default() };
        let mut h = toy(Some(kept));
        h.hold_work();
        h.from_client(json!({"jsonrpc":"2.0","id":1,"method":"session/load","params":{"sessionId":"r","cwd":"/w"}}));
        h.from_agent(json!({"jsonrpc":"2.0","id":1,"result":{}}));
        h.from_agent(usage("r", 3));
        h.take();
        h.advance(LOAD_HOLD);
        assert_eq!(h.to_client(), [usage("r", 3)], "sent without the facts it waited for");
    }

    #[test]
    fn records_that_come_meanwhile_do_not_lengthen_a_hold() {
        let mut h = toy(None);
        open(&mut h, 1, "session/new", "a");
        h.event(0, ("a".to_owned(), true));
        h.take();
        h.from_agent(usage("a", 1));
        h.from_agent(fact("a", 1, false));
        // Records of the CLI's that do not end the wait keep coming (a turn retrying every second).
        for _ in 0..2 {
            h.advance(HOLD / 2 - Duration::from_millis(1));
            h.event(0, ("a".to_owned(), true));
            assert!(h.to_client().is_empty());
        }
        h.advance(Duration::from_millis(2));
        assert_eq!(h.to_client().len(), 2, "the update and the frame behind it, {HOLD:?} after it came at most");
    }

    #[test]
    fn a_hold_that_runs_out_gives_up_on_that_session_only() {
        let mut h = toy(None);
        open(&mut h, 1, "session/new", "a");
        open(&mut h, 2, "session/new", "b");
        h.event(0, ("a".to_owned(), true));
        h.event(0, ("b".to_owned(), true));
        h.from_agent(fact("a", 1, false));
        h.from_agent(fact("b", 2, false));
        h.take();
        h.from_agent(usage("a", 1));
        h.advance(HOLD);
        assert_eq!(h.to_client()[0]["params"]["update"]["_meta"]["coda"]["contextTokens"], 1);
        // Session b still waits for its facts.
        h.from_agent(usage("b", 2));
        assert!(h.to_client().is_empty());
        h.event(0, ("b".to_owned(), false));
        assert_eq!(h.to_client()[0]["params"]["update"]["_meta"]["coda"]["contextTokens"], 2);
    }
}

//! One line of newline-delimited JSON-RPC 2.0, kept as the bytes it came in, plus a cheap view of its envelope.
//!
//! A frame that no layer edits is written out exactly as it was read. A layer that looks inside a frame reads
//! its `serde_json::Value` ([`Frame::value`]), parsed once per frame and shared by every layer after it; only
//! a layer that rewrites a frame serialises that one frame again.

use std::borrow::Cow;
use std::cell::OnceCell;
use std::fmt;
use std::sync::Arc;

use bytes::Bytes;
use compact_str::CompactString;
use serde_json::Value;

use crate::{json, scan};

/// A method name. Names are short, so they live inline: no allocation per frame.
pub type Method = CompactString;

/// What kind of JSON-RPC message a frame is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Kind {
    Request {
        id: Id,
        method: Method,
    },
    Notification {
        method: Method,
    },
    Response {
        id: Id,
    },
    /// A JSON-RPC batch array, forwarded whole.
    Batch,
}

/// A JSON-RPC id, kept as its JSON text: number, string or null, opaque to the shim.
///
/// The text is what the shim writes back: an answer the shim makes carries the id exactly as the peer
/// spelled it (`1e0` stays `1e0`). Two ids are the same id when they are the same JSON value: a number
/// equal in value (`1`, `1e0`, `1.0`, `10e-1`, compared exactly, in decimal, not through an f64; exponents
/// beyond ±9.2e18 count as that) or a
/// string equal once unescaped (`"a"`, `"\u0061"`). JSON-RPC peers that parse ids into numbers (Node, the
/// runtime of most agent CLIs) answer a request sent as `1e0` with `1`; that answer is for the request,
/// and matching it by value is what keeps the shim from answering the request a second time.
#[derive(Debug, Clone)]
pub struct Id(CompactString);

impl PartialEq for Id {
    fn eq(&self, other: &Id) -> bool {
        self.0 == other.0 || self.key() == other.key()
    }
}

impl Eq for Id {}

impl std::hash::Hash for Id {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.key().hash(state)
    }
}

impl Id {
    pub fn from_json(text: &str) -> Id {
        Id(CompactString::from(text.trim()))
    }

    /// A string id (used for the shim's own requests).
    pub fn string(s: &str) -> Id {
        Id(CompactString::from(Value::from(s).to_string()))
    }

    pub fn null() -> Id {
        Id(CompactString::const_new("null"))
    }

    /// The id as JSON text, ready to be spliced into a frame.
    pub fn as_json(&self) -> &str {
        &self.0
    }

    /// The id as a value, for reading it (a number may come out re-spelled: never write it back).
    pub fn to_value(&self) -> Value {
        serde_json::from_str(&self.0).unwrap_or(Value::Null)
    }

    /// One spelling per JSON value (see [`Id`]): strings unescaped and written the one way serde_json
    /// writes them, numbers as [`number_key`] writes them. Borrowed for the usual ids.
    fn key(&self) -> Cow<'_, str> {
        let text = self.0.as_str();
        match text.as_bytes().first() {
            Some(b'"') if text.contains('\\') => match serde_json::from_str::<String>(text) {
                Ok(s) => Cow::Owned(Value::from(s).to_string()),
                Err(_) => Cow::Borrowed(text),
            },
            Some(b'-' | b'0'..=b'9') => number_key(text),
            _ => Cow::Borrowed(text),
        }
    }
}

/// Integers up to this many digits are keyed as plain integers, others as `<digits>e<exponent>`.
const PLAIN_DIGITS: i64 = 40;

/// A JSON number's value as one text: sign, significant digits without leading or trailing zeros, and a
/// decimal exponent; a plain integer when it is one of at most [`PLAIN_DIGITS`] digits. Exact: no two
/// different values share a key, whatever their digits (only an exponent past an i64 saturates).
fn number_key(text: &str) -> Cow<'_, str> {
    let (negative, body) = match text.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, text),
    };
    // The usual id: an integer without leading zeros.
    let plain = !body.is_empty() && body.bytes().all(|b| b.is_ascii_digit()) && !body.starts_with('0');
    if plain && body.len() as i64 <= PLAIN_DIGITS {
        return Cow::Borrowed(text);
    }
    let (mantissa, exponent) = match body.find(['e', 'E']) {
        Some(at) => (&body[..at], &body[at + 1..]),
        None => (body, ""),
    };
    let (int, frac) = mantissa.split_once('.').unwrap_or((mantissa, ""));
    // Saturating: an exponent of a thousand digits is still one value, and the frame limit bounds it.
    let mut exp: i64 = 0;
    let (exp_negative, exp_digits) = match exponent.as_bytes().first() {
        Some(b'-') => (true, &exponent[1..]),
        Some(b'+') => (false, &exponent[1..]),
        _ => (false, exponent),
    };
    for b in exp_digits.bytes() {
        exp = exp.saturating_mul(10).saturating_add(i64::from(b.wrapping_sub(b'0')));
    }
    if exp_negative {
        exp = -exp;
    }
    exp = exp.saturating_sub(frac.len() as i64);
    let digits: String = int.chars().chain(frac.chars()).collect();
    let digits = digits.trim_start_matches('0');
    let significant = digits.trim_end_matches('0');
    if significant.is_empty() {
        return Cow::Borrowed("0");
    }
    exp = exp.saturating_add((digits.len() - significant.len()) as i64);
    let sign = if negative { "-" } else { "" };
    if exp >= 0 && significant.len() as i64 + exp <= PLAIN_DIGITS {
        Cow::Owned(format!("{sign}{significant}{}", "0".repeat(exp as usize)))
    } else {
        Cow::Owned(format!("{sign}{significant}e{exp}"))
    }
}

impl fmt::Display for Id {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A line that could not be taken as a JSON-RPC frame, with the JSON-RPC error code that says why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Invalid {
    pub code: i64,
    pub message: String,
    /// The id of the request, when it could still be read.
    pub id: Option<Id>,
    /// Refused for nesting deeper than [`json::MAX_DEPTH`], not for what it says: handled like an
    /// over-size frame (a notification is dropped, not answered). `has_method` is then read cheaply.
    pub too_deep: bool,
    pub has_method: bool,
}

/// One JSON-RPC message: its line as it came (or as the shim built it), its envelope, and its value once a
/// layer has read it.
///
/// A lone UTF-16 surrogate escape (`"\ud800"`, a low half first, a high half without its low one) is valid
/// JSON and passes the frame check, but is no Unicode text. The check notes it where it first reads the
/// line ([`scan::Escapes::lone_surrogate`]); the frame is kept and forwarded byte for byte while no layer
/// edits it; its [`Frame::value`] reads each lone half as U+FFFD REPLACEMENT CHARACTER
/// ([`json::mend_surrogates`]), so reading a frame cannot fail, and a layer that rewrites it writes U+FFFD
/// there. A lone surrogate in the method name is refused where the line is checked (there it would change
/// what the frame asks for).
#[derive(Clone)]
pub struct Frame {
    /// The line with its `\n`: a slice of the buffer it was read into, written out as it is.
    wire: Bytes,
    kind: Kind,
    /// `params.update.sessionUpdate` of a notification, read with the envelope so that layers can tell
    /// a streamed chunk from what they look for without searching the whole frame.
    update: Option<CompactString>,
    /// [`SHIM`], [`LONE_SURROGATE`], [`CHUNK`], [`SESSION`], [`SESSION_ESCAPED`], [`UNICODE`], [`UTF8`].
    flags: u8,
    /// Where `params._meta` is in the line ([`Frame::meta`]), found with the envelope: its start and length (0
    /// for none; `u16::MAX` for one as long or longer, looked for again). Small, so that the frame, which
    /// every layer moves, keeps its size.
    meta_start: u32,
    meta_len: u16,
    /// Where `params.update` is ([`Frame::update_value`]), found with the envelope, as `_meta`'s place.
    update_start: u32,
    update_len: u16,
    /// Where the text of `params.sessionId` is ([`Frame::session`]), found with the envelope: its start and
    /// length, when [`SESSION`] is set (`u8::MAX` for one as long or longer, or one that starts past 64 KiB,
    /// looked for again). Small, as the other places: a frame of more than 128 bytes is moved by a call.
    session_start: u16,
    session_len: u8,
    /// The parsed value, once a layer asked for it: one pointer, shared by a frame's clones.
    value: OnceCell<Arc<Value>>,
}

/// Built or edited by the shim, rather than read from a peer.
const SHIM: u8 = 1;
/// The frame check found a lone surrogate escape: the line is read mended ([`json::mend_surrogates`]).
const LONE_SURROGATE: u8 = 2;
/// [`Frame::is_streamed_chunk`], found with the envelope (layers ask it of every frame).
const CHUNK: u8 = 4;
/// `params.sessionId` is a string ([`Frame::session`]); with [`SESSION_ESCAPED`], one holding an escape.
const SESSION: u8 = 8;
const SESSION_ESCAPED: u8 = 16;
/// The line may hold a `\u` escape ([`Frame::unicode_escaped`]).
const UNICODE: u8 = 32;
/// The line is UTF-8, as the frame check found it: the text between two of its quotes is UTF-8 as it lies
/// ([`Frame::text_between_quotes`]), not checked again by each layer that reads a session id.
const UTF8: u8 = 64;

/// The flags of a frame whose line the frame check read (and found UTF-8).
fn noted(chunk: bool, escapes: scan::Escapes) -> u8 {
    let flag = |on: bool, flag: u8| if on { flag } else { 0 };
    UTF8 | flag(chunk, CHUNK) | flag(escapes.lone_surrogate, LONE_SURROGATE) | flag(escapes.unicode, UNICODE)
}

/// Two frames are equal when their lines and envelopes are: whether either was read yet is no difference.
impl PartialEq for Frame {
    fn eq(&self, other: &Frame) -> bool {
        self.wire == other.wire && self.kind == other.kind && self.update == other.update && self.flags == other.flags
    }
}

impl Eq for Frame {}

impl fmt::Debug for Frame {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Frame").field("kind", &self.kind).field("len", &self.bytes().len()).finish()
    }
}

impl Frame {
    /// Takes one line (without its newline) as a frame, checking that it is JSON-RPC 2.0.
    pub fn parse(mut bytes: Vec<u8>) -> Result<Frame, Invalid> {
        bytes.push(b'\n');
        Frame::parse_wire(Bytes::from(bytes)).map_err(|(_, e)| e)
    }

    /// Takes one line that ends in its `\n` as a frame, keeping the bytes where they are; hands the line
    /// back on error (for the trace and the warning). A line without its `\n` gets one (a copy): the last
    /// byte of a frame is its `\n`, in every build, so none of the line is lost.
    pub fn parse_wire(wire: Bytes) -> Result<Frame, (Bytes, Invalid)> {
        Frame::take(wire, None)
    }

    /// [`Frame::parse_wire`] for the next line of a stream, whose `reader` has seen the lines before it (see
    /// [`Reader`]: a streamed chunk is checked against the shape of the line before).
    pub fn read(wire: Bytes, reader: &mut Reader) -> Result<Frame, (Bytes, Invalid)> {
        Frame::take(wire, Some(reader))
    }

    fn take(wire: Bytes, scanner: Option<&mut Reader>) -> Result<Frame, (Bytes, Invalid)> {
        let wire = if wire.last() == Some(&b'\n') { wire } else { Bytes::from([&wire[..], b"\n"].concat()) };
        match classify(&wire[..wire.len().saturating_sub(1)], scanner) {
            Ok(Classified { kind, update, escapes, chunk, places }) => {
                Ok(Frame::with(wire, kind, update, noted(chunk, escapes), places))
            }
            Err(e) => Err((wire, e)),
        }
    }

    /// Serialises a value built by the shim (or edited by a layer) into a frame.
    pub fn from_value(value: &Value) -> Frame {
        Frame::built(serde_json::to_vec(value).expect("a serde_json::Value always serialises"))
    }

    /// A frame of a value the shim built, kept as the frame's value: the layers after the one that built it read
    /// it ([`Frame::value`]) without parsing what was just written.
    pub fn of_value(value: Value) -> Frame {
        let frame = Frame::from_value(&value);
        let _ = frame.value.set(Arc::new(value));
        frame
    }

    /// The frame a layer made by editing this frame's value ([`Frame::to_value`]): every number it left as it
    /// was keeps the peer's exact spelling (`1e400` stays `1e400`, not serde_json's `1e+400`). The new frame
    /// keeps `value` as its own, so the layers after this one do not parse it again.
    pub fn rewritten(&self, value: Value) -> Frame {
        let spellings = json::Spellings::of(self.bytes());
        let bytes = if spellings.is_empty() {
            serde_json::to_vec(&value).expect("a serde_json::Value always serialises")
        } else {
            json::to_vec_spelled(&value, &spellings)
        };
        let frame = Frame::built(bytes);
        let _ = frame.value.set(Arc::new(value));
        frame
    }

    /// This frame with `session` as its `params.sessionId` (a layer that renames a session), the rest of its
    /// line as it was: written where it lies ([`Frame::spliced`]) when the frame check noted its place and
    /// `params` has the key once; else its value edited and written again ([`Frame::rewritten`]). A frame
    /// without a `params` object is as it was.
    pub(crate) fn with_session(&self, session: &str) -> Frame {
        let mut quoted = Vec::with_capacity(session.len() + 2);
        json::write_str(&mut quoted, session);
        let text = &quoted[1..quoted.len() - 1];
        if let Some(written) = self.session_as_written()
            && !self.lone_surrogate()
            && self.view().members_at("params").filter(|(key, _)| key.is("sessionId")).count() == 1
        {
            let start = usize::from(self.session_start);
            return self.spliced(start..start + written.len(), text);
        }
        let mut value = self.to_value();
        match value.get_mut("params").and_then(Value::as_object_mut) {
            Some(params) => params.insert("sessionId".into(), session.into()),
            None => return self.clone(),
        };
        self.rewritten(value)
    }

    /// This frame with the bytes `cut` of its line replaced by `with`, for a layer that writes a field into a
    /// frame where it lies (the usage facts' stamp): `with` is JSON the shim wrote, so the line stays one JSON
    /// text whose envelope is this frame's, and the new frame takes its envelope from this one instead of
    /// checking the line again; the places of `params`' fields move with the bytes after the cut, and one that
    /// holds the cut grows with it. A cut that holds only part of a place, in a frame with a lone surrogate
    /// escape (whose mended reading may lie in the cut), or in a line that has or gets a `\u` escape (rare;
    /// [`Frame::unicode_escaped`] is exact), is read again whole ([`Frame::built`]).
    pub(crate) fn spliced(&self, cut: std::ops::Range<usize>, with: &[u8]) -> Frame {
        self.splice(cut, &[with], std::str::from_utf8(with).is_ok())
    }

    /// [`Frame::spliced`] with `with` in parts of text, written one after another (no text made of them first).
    pub(crate) fn spliced_parts<const N: usize>(&self, cut: std::ops::Range<usize>, with: [&str; N]) -> Frame {
        self.splice(cut, &with.map(str::as_bytes), true)
    }

    /// [`Frame::spliced`] with `with` in parts; `utf8` when they are (the line then stays UTF-8 if it was).
    fn splice(&self, cut: std::ops::Range<usize>, with: &[&[u8]], utf8: bool) -> Frame {
        let line = self.bytes();
        let with_len: usize = with.iter().map(|p| p.len()).sum();
        // (Room for the `\n` too: the line is not copied again for it.)
        let mut bytes = Vec::with_capacity(line.len() - cut.len() + with_len + 1);
        bytes.extend_from_slice(&line[..cut.start]);
        for part in with {
            bytes.extend_from_slice(part);
        }
        bytes.extend_from_slice(&line[cut.end..]);
        // (A `\u` escape, in the line or in what was written, with the byte on either side of it, is what a
        // check of the new line notes exactly.)
        let written = &bytes[cut.start.saturating_sub(1)..(cut.start + with_len + 1).min(bytes.len())];
        // (A line past the longest the scan reads, whose places would not fit 32 bits, is checked whole too: and
        // refused there.)
        if self.lone_surrogate() || self.unicode_escaped() || may_escape_unicode(written) || bytes.len() > scan::LONGEST
        {
            return Frame::built(bytes);
        }
        // (The line stays UTF-8 when what was written in is, in place of whole characters.)
        let starts_character = |at: usize| line.get(at).is_none_or(|&c| (c as i8) >= -0x40);
        let utf8 = match self.flags & UTF8 != 0 && utf8 && starts_character(cut.start) && starts_character(cut.end) {
            true => UTF8,
            false => 0,
        };
        let grown = with_len as i64 - cut.len() as i64;
        // A place (start, length) in the new line; None for one the cut holds only part of.
        let moved = |start: usize, len: usize| -> Option<(usize, usize)> {
            let end = start + len;
            if end <= cut.start {
                Some((start, len))
            } else if start >= cut.end {
                Some(((start as i64 + grown) as usize, len))
            } else if start <= cut.start && cut.end <= end {
                Some((start, (len as i64 + grown) as usize))
            } else {
                None
            }
        };
        // Each place as the frame keeps it: none, looked for again, or where it is.
        let place = |start: u32, len: u16| -> Option<Option<(usize, usize)>> {
            match len {
                0 => Some(None),
                u16::MAX => Some(Some((0, usize::MAX))),
                len => moved(start as usize, usize::from(len)).map(Some),
            }
        };
        let (Some(meta), Some(update)) =
            (place(self.meta_start, self.meta_len), place(self.update_start, self.update_len))
        else {
            return Frame::built(bytes);
        };
        let escaped = self.flags & SESSION_ESCAPED != 0;
        let session = match self.flags & SESSION {
            0 => None,
            // (as long as `u8::MAX`: [`Frame::with`] keeps it looked for again)
            _ if self.session_len == u8::MAX => Some(scan::Str::new(0, usize::from(u8::MAX), escaped)),
            _ => match moved(usize::from(self.session_start), usize::from(self.session_len)) {
                // A cut in the session's text: whether it has an escape now is the new text's to say.
                Some((start, len)) if start <= cut.start && cut.end <= start + usize::from(self.session_len) => {
                    Some(scan::Str::new(start, start + len, bytes[start..start + len].contains(&b'\\')))
                }
                Some((start, len)) => Some(scan::Str::new(start, start + len, escaped)),
                None => return Frame::built(bytes),
            },
        };
        // A place looked for again stays so ([`Frame::with`] keeps one as long as `u16::MAX` so).
        let range = |p: Option<(usize, usize)>| p.map(|(start, len)| scan::span(start, start.saturating_add(len)));
        let mut wire = bytes;
        wire.push(b'\n');
        Frame::with(
            Bytes::from(wire),
            self.kind.clone(),
            self.update.clone(),
            (self.flags & CHUNK) | utf8 | SHIM,
            Places { meta: range(meta), update_object: range(update), session },
        )
    }

    /// A frame from the JSON text of one message the shim built (or edited: a lone surrogate escape of the
    /// peer's that it kept is noted as in a frame read). Checked by the thread's reader of built lines
    /// ([`BUILT`]): the shim's reports and edits take turns between a few shapes, as a peer's frames do.
    pub(crate) fn built(mut bytes: Vec<u8>) -> Frame {
        // (Read alone when the reader is in use or gone: a frame built while the thread ends.)
        let read = |reader: &std::cell::RefCell<Reader>| {
            reader.try_borrow_mut().ok().map(|mut r| classify(&bytes, Some(&mut r)))
        };
        let classified = BUILT.try_with(read).ok().flatten().unwrap_or_else(|| classify(&bytes, None));
        bytes.push(b'\n');
        let wire = Bytes::from(bytes);
        let (kind, update, flags, places) = match classified {
            Ok(Classified { kind, update, chunk, places, escapes }) => {
                (kind, update, SHIM | noted(chunk, escapes), places)
            }
            // A layer built something that is not JSON-RPC; keep it as a notification-less frame so
            // nothing is lost (that may hold a `\u` escape: nothing was noted), and let the debug log say so.
            Err(e) => {
                tracing::error!(error = %e.message, "the shim built an invalid frame");
                (Kind::Notification { method: Method::default() }, None, SHIM | UNICODE, Places::default())
            }
        };
        Frame::with(wire, kind, update, flags, places)
    }

    fn with(
        wire: Bytes,
        kind: Kind,
        update: Option<CompactString>,
        mut flags: u8,
        Places { meta, update_object, session }: Places,
    ) -> Frame {
        let place = |at: Option<scan::Span>| match at {
            Some((start, end)) => (start, u16::try_from(end - start).unwrap_or(u16::MAX)),
            None => (0, 0),
        };
        let ((meta_start, meta_len), (update_start, update_len)) = (place(meta), place(update_object));
        let (session_start, session_len) = match session {
            Some(s) => {
                flags |= SESSION | if s.escaped { SESSION_ESCAPED } else { 0 };
                match (u16::try_from(s.start), u8::try_from(s.end - s.start)) {
                    (Ok(start), Ok(len)) if len < u8::MAX => (start, len),
                    _ => (0, u8::MAX),
                }
            }
            None => (0, 0),
        };
        let value = OnceCell::new();
        Frame {
            wire,
            kind,
            update,
            flags,
            meta_start,
            meta_len,
            update_start,
            update_len,
            session_start,
            session_len,
            value,
        }
    }

    /// Whether the shim built or edited this frame.
    pub fn is_shim(&self) -> bool {
        self.flags & SHIM != 0
    }

    pub fn kind(&self) -> &Kind {
        &self.kind
    }

    /// The line, without its `\n`.
    pub fn bytes(&self) -> &[u8] {
        &self.wire[..self.wire.len() - 1]
    }

    /// The line with its `\n`, as it goes out.
    pub fn into_wire(self) -> Bytes {
        self.wire
    }

    /// `params.update.sessionUpdate` of a `session/update` (or any frame whose params have one).
    pub fn session_update(&self) -> Option<&str> {
        self.update.as_deref()
    }

    /// Whether this is a `session/update` of the model's streamed words (`agent_message_chunk`,
    /// `agent_thought_chunk`): the bulk of all traffic, which most layers only pass on.
    pub fn is_streamed_chunk(&self) -> bool {
        self.flags & CHUNK != 0
    }

    /// The method of a request or notification.
    pub fn method(&self) -> Option<&str> {
        match &self.kind {
            Kind::Request { method, .. } | Kind::Notification { method } => Some(method),
            _ => None,
        }
    }

    /// The id of a request or response.
    pub fn id(&self) -> Option<&Id> {
        match &self.kind {
            Kind::Request { id, .. } | Kind::Response { id } => Some(id),
            _ => None,
        }
    }

    pub fn is_request(&self, m: &str) -> bool {
        matches!(&self.kind, Kind::Request { method, .. } if method == m)
    }

    pub fn is_notification(&self, m: &str) -> bool {
        matches!(&self.kind, Kind::Notification { method } if method == m)
    }

    /// The whole frame as a value, parsed the first time a layer asks and shared from then on (with every
    /// layer after it, and with the frame's clones). Only frames a layer looks inside pay for a parse.
    ///
    /// Never fails: it reads whatever the frame check accepted (as deep, numbers of any size), and a lone
    /// UTF-16 surrogate escape, which JSON's grammar and the frame check accept and serde_json does not, as
    /// U+FFFD (see [`Frame`]). The bytes of a frame no layer rewrites are forwarded as they came.
    pub fn value(&self) -> &Value {
        self.read_once()
    }

    /// The frame's value read where it lies ([`json::View`]): for a layer that needs a field or two of a frame
    /// it otherwise passes on, found without parsing the rest (and without [`Frame::value`]'s allocations).
    pub fn view(&self) -> json::View<'_> {
        let text = json::View::of(self.bytes()).text();
        // SAFETY: as in `Frame::view_at`; `text` is the line without the white space around it.
        unsafe { json::View::exact_in(text, self.flags & UTF8 != 0) }
    }

    /// The value whose text is the line's bytes `range` (a place the frame check or a walk of the line noted),
    /// read as a part of a UTF-8 text when the frame check found the line so ([`UTF8`]): a layer's read of a
    /// string of it is not checked again ([`json::View::as_str`]).
    fn view_at(&self, range: std::ops::Range<usize>) -> json::View<'_> {
        // SAFETY: `UTF8` is set only on a line the frame check found UTF-8, and on a splice of UTF-8 into such a
        // line in place of whole characters (`Frame::splice`); the bytes are a part of the line.
        unsafe { json::View::exact_in(&self.bytes()[range], self.flags & UTF8 != 0) }
    }

    /// `params._meta` when it is an object (the stamps some agents put on every frame: Grok's
    /// `streamStartMs`, `agentTimestampMs`), found by the frame check's one pass: its fields are read from
    /// there ([`json::View::get`]) without going over the rest of the frame.
    pub fn meta(&self) -> Option<json::View<'_>> {
        match (self.meta_start as usize, self.meta_len) {
            (_, 0) => None,
            (_, u16::MAX) => self.view().pointer(&["params", "_meta"]),
            (start, len) => Some(self.view_at(start..start + usize::from(len))),
        }
    }

    /// `params.update` when it is an object (a `session/update`'s update), found by the frame check's one
    /// pass: for a layer that reads a field or two of an update ([`json::View::get`], or several at once with
    /// [`json::View::members`]) without going over the rest of the frame.
    pub fn update_value(&self) -> Option<json::View<'_>> {
        match (self.update_start as usize, self.update_len) {
            (_, 0) => None,
            (_, u16::MAX) => self.view().pointer(&["params", "update"]).filter(|u| u.text().first() == Some(&b'{')),
            (start, len) => Some(self.view_at(start..start + usize::from(len))),
        }
    }

    /// The values of `keys` in `params.update` (as [`Frame::update_value`]'s [`json::View::pick`] finds them:
    /// of a key twice, the last), its members gone over once for every layer that asks (`Frame::pick_kept`):
    /// a tool call's update, which two or three layers read a few fields of, has its values skipped once.
    pub fn update_pick<const N: usize>(&self, keys: [&str; N]) -> [Option<json::View<'_>>; N] {
        match self.update_value() {
            Some(update) => self.pick_kept(update.members(), keys),
            None => [None; N],
        }
    }

    /// The values of `keys` in `params` ([`Frame::update_pick`]'s reading, of `params`, which the frame check
    /// lets a line have once: read from its start, [`json::View::members_at`]): a `_coda/wait` report, which the
    /// layers above the one that wrote it read (OpenCode's permission bridge, then the waits handshake), has its
    /// members gone over once. (Grok's queue, which two layers read too, is cheaper gone over by each: measured.)
    pub fn params_pick<const N: usize>(&self, keys: [&str; N]) -> [Option<json::View<'_>>; N] {
        self.pick_kept(self.view().members_at("params"), keys)
    }

    /// The values of `keys` among `members`, an object's members in this frame's line ([`json::Members::pick`]),
    /// with the places of its members kept per thread (`KEPT_MEMBERS`): the next layer that asks of the same
    /// object of the same frame (or a clone) has them without going over its values again. One object's places
    /// are kept: another object, or another frame, is gone over and kept instead.
    fn pick_kept<'a, const N: usize>(
        &'a self,
        members: json::Members<'a>,
        keys: [&str; N],
    ) -> [Option<json::View<'a>>; N] {
        let line = self.bytes();
        // (Kept by the place of the first member's key: the first key of one object only. An object without a
        // member, or no object, has nothing to go over.)
        let first = members.place_in(line).filter(|&at| line.get(at) == Some(&b'"'));
        let Some(at) = first.filter(|_| line.len() <= MEMBERS_LINE_MAX) else { return members.pick(keys) };
        let picked = KEPT_MEMBERS.try_with(|kept| {
            // (Taken by no one else: the borrow ends within this call. Were it taken, the members are gone over.)
            let mut kept = kept.try_borrow_mut().ok()?;
            let Members { line: held, at: held_at, places } = &mut *kept;
            // The line held is this frame's (or a clone's): its bytes cannot be another's while it is held.
            let same = held.as_ref().is_some_and(|h| h.as_ptr() == self.wire.as_ptr() && h.len() == self.wire.len());
            if !same || *held_at != at {
                places.clear();
                places.extend(members.clone().take(MEMBERS_MAX + 1).filter_map(|(key, value)| {
                    let key_at = json::View::exact(key.quoted()).range_in(line)?;
                    Some(MemberAt { key: key_at, escaped: key.escaped(), value: value.range_in(line)? })
                }));
                *held = Some(self.wire.clone());
                *held_at = at;
            }
            if places.len() > MEMBERS_MAX {
                return None;
            }
            let mut found = [None; N];
            for m in places.iter() {
                let key = json::Key::of(&line[m.key.clone()], m.escaped);
                if let Some(k) = keys.iter().position(|name| key.is(name)) {
                    found[k] = Some(self.view_at(m.value.clone()));
                }
            }
            Some(found)
        });
        picked.ok().flatten().unwrap_or_else(|| members.pick(keys))
    }

    /// The value of `key` in `params.update` ([`Frame::update_pick`] of one key).
    pub fn update_get(&self, key: &str) -> Option<json::View<'_>> {
        let [value] = self.update_pick([key]);
        value
    }

    /// `params.sessionId` when it is a string (the session most frames are about), found by the frame check's
    /// one pass: read as [`Frame::value`] reads it (a lone surrogate escape as U+FFFD), without parsing the
    /// frame.
    pub fn session(&self) -> Option<Cow<'_, str>> {
        if self.flags & (SESSION | SESSION_ESCAPED) == SESSION && self.session_len != u8::MAX {
            let start = usize::from(self.session_start);
            return self.text_between_quotes(start, start + usize::from(self.session_len)).map(Cow::Borrowed);
        }
        match self.session_bytes()? {
            Cow::Borrowed(text) => std::str::from_utf8(text).ok().map(Cow::Borrowed),
            Cow::Owned(text) => String::from_utf8(text).ok().map(Cow::Owned),
        }
    }

    /// The line's bytes `start..end` as text, when a quote is on either side of them: in a line the frame
    /// check found UTF-8 ([`UTF8`]), taken as they lie (a quote is ASCII, so the two are where characters
    /// start: what lies between them is UTF-8); else checked.
    fn text_between_quotes(&self, start: usize, end: usize) -> Option<&str> {
        let line = self.bytes();
        let text = line.get(start..end)?;
        let quoted = start > 0 && line[start - 1] == b'"' && line.get(end) == Some(&b'"');
        if self.flags & UTF8 != 0 && quoted {
            // SAFETY: `line` is UTF-8 (the frame check found it so; `UTF8` is set only then, and on a splice of
            // UTF-8 into such a line), and `text` starts and ends at ASCII bytes of it, where characters start.
            return Some(unsafe { std::str::from_utf8_unchecked(text) });
        }
        std::str::from_utf8(text).ok()
    }

    /// [`Frame::session`] as bytes (the same text; no UTF-8 check where it has no escape), for a layer that
    /// only looks for something in it.
    pub fn session_bytes(&self) -> Option<Cow<'_, [u8]>> {
        if self.flags & SESSION == 0 {
            return None;
        }
        let (start, len) = (usize::from(self.session_start), self.session_len);
        let unescaped = |text: Option<Cow<'_, str>>| text.map(|t| Cow::Owned(t.into_owned().into_bytes()));
        if len == u8::MAX {
            return unescaped(self.view().pointer(&["params", "sessionId"])?.as_str());
        }
        match self.flags & SESSION_ESCAPED {
            0 => Some(Cow::Borrowed(&self.bytes()[start..start + usize::from(len)])),
            _ => unescaped(json::View::exact(&self.bytes()[start - 1..=start + usize::from(len)]).as_str()),
        }
    }

    /// The text of `params.sessionId` as the line writes it (between its quotes, escapes and all), when the
    /// frame check noted where it is: two frames whose bytes here are the same are of the same session.
    pub(crate) fn session_as_written(&self) -> Option<&[u8]> {
        let len = usize::from(self.session_len);
        if self.flags & SESSION == 0 || len == usize::from(u8::MAX) {
            return None;
        }
        let start = usize::from(self.session_start);
        self.bytes().get(start..start + len)
    }

    /// Whether the frame check found a lone surrogate escape.
    pub(crate) fn lone_surrogate(&self) -> bool {
        self.flags & LONE_SURROGATE != 0
    }

    /// Whether a string of the line (a key or a value) may hold a `\u` escape, the one escape that may spell
    /// any character ([`UNICODE_ESCAPE`]): false only where none does, as the frame check found, so a key or
    /// a text a layer looks for as it is written is then found wherever it is. Noted for free where the line
    /// is checked (a search of the line would cost a layer a pass over it).
    pub fn unicode_escaped(&self) -> bool {
        self.flags & UNICODE != 0
    }

    /// [`Frame::value`] as a handle of its own, for a layer that reads the value while it passes the frame on.
    pub fn shared_value(&self) -> Arc<Value> {
        Arc::clone(self.read_once())
    }

    fn read_once(&self) -> &Arc<Value> {
        self.value.get_or_init(|| Arc::new(read(self.bytes(), self.lone_surrogate())))
    }

    /// The frame's value to edit (and hand to [`Frame::rewritten`]): a copy of the shared one when a layer
    /// read it already, else parsed for this layer alone (the frame it edits is replaced).
    pub fn to_value(&self) -> Value {
        match self.value.get() {
            Some(value) => Value::clone(value),
            None => read(self.bytes(), self.lone_surrogate()),
        }
    }

    /// Whether the raw bytes contain the needle.
    pub fn has(&self, needle: &'static Needle) -> bool {
        needle.is_in(self.bytes())
    }

    /// The value of every member whose key is `key` (a needle of the key with its quotes) as the line writes
    /// it, wherever in the line it lies, in order: `Some(text)` for a string with no escape, `None` for one
    /// with an escape (which may spell any text); a value that is no string is left out. One search of the
    /// line, for a layer that asks whether a frame may name one of many ids it keeps without reading the frame.
    /// A key spelled with a `\u` escape is not found (a caller that must not miss one asks
    /// [`Frame::unicode_escaped`] first); the key's text inside a longer key (`"a\"id"`) is found too.
    pub fn key_strings(&self, key: &'static Needle) -> impl Iterator<Item = Option<&str>> + '_ {
        let line = self.bytes();
        let space = |s: &[u8]| s.iter().position(|c| !matches!(c, b' ' | b'\t' | b'\n' | b'\r')).unwrap_or(s.len());
        key.each_in(line).filter_map(move |at| {
            // The key's closing quote follows a byte that is no backslash, so it closes a string: what follows
            // a key is a colon, and after anything else this was no key.
            let after = at + key.bytes().len();
            let rest = &line[after..];
            let colon = after + space(rest);
            let rest = line[colon..].strip_prefix(b":")?;
            let start = colon + 1 + space(rest);
            let text = line[start..].strip_prefix(b"\"")?;
            Some(match memchr::memchr2(b'"', b'\\', text) {
                Some(end) if text[end] == b'"' => self.text_between_quotes(start + 1, start + 1 + end),
                _ => None,
            })
        })
    }
}

/// `\u`: the one escape that may spell any character of a key or a value (the others spell only `"`, `\`, `/`
/// and control characters). A line without it writes every key and every other character as itself.
pub static UNICODE_ESCAPE: Needle = crate::needle!(b"\\u");

/// Whether `text` may hold a `\u` escape: a backslash before a `u` (an escaped backslash before one too: then the
/// text is read whole, which tells). A search for the backslash alone, which the shim's own JSON rarely has.
fn may_escape_unicode(text: &[u8]) -> bool {
    memchr::memchr_iter(b'\\', text).any(|at| text.get(at + 1) == Some(&b'u'))
}

/// A byte string searched for in every frame: its SIMD searcher is built once, not per search.
pub struct Needle(std::sync::LazyLock<memchr::memmem::Finder<'static>>);

impl Needle {
    pub const fn new(build: fn() -> memchr::memmem::Finder<'static>) -> Needle {
        Needle(std::sync::LazyLock::new(build))
    }

    /// Whether `haystack` (a part of a frame: a value a layer looks into) holds the needle.
    pub fn is_in(&'static self, haystack: &[u8]) -> bool {
        self.find(haystack).is_some()
    }

    /// The bytes searched for.
    pub fn bytes(&'static self) -> &'static [u8] {
        self.0.needle()
    }

    /// Where the needle first starts in `haystack`.
    pub fn find(&'static self, haystack: &[u8]) -> Option<usize> {
        self.0.find(haystack)
    }

    /// Where the needle starts in `haystack`, in order: each place after the end of the one before (a search
    /// goes on past what it found; no needle the layers look for can overlap itself in a line of JSON).
    pub fn places(&'static self, haystack: &[u8]) -> Vec<usize> {
        self.each_in(haystack).collect()
    }

    /// [`Needle::places`] one at a time.
    pub fn each_in<'h>(&'static self, haystack: &'h [u8]) -> impl Iterator<Item = usize> + 'h {
        self.0.find_iter(haystack)
    }
}

/// `static N: Needle = needle!(b"...");`
#[macro_export]
macro_rules! needle {
    ($bytes:expr) => {
        $crate::frame::Needle::new(|| ::memchr::memmem::Finder::new($bytes))
    };
}

/// Parses a frame's line. The frame check accepted it, so serde_json reads it unless it holds a lone
/// surrogate escape, which the check noted (`lone`): only then (rare) it is mended first. A line that still
/// fails is mended and read again all the same.
fn read(line: &[u8], lone: bool) -> Value {
    let mended = match lone {
        true => json::mend_surrogates(line),
        false => match json::from_slice(line) {
            Ok(value) => return value,
            Err(_) => json::mend_surrogates(line),
        },
    };
    json::from_slice(&mended).unwrap_or_else(|e| {
        // Not reached: a frame is what the frame check accepted or what serde_json wrote.
        tracing::error!(error = %e, len = line.len(), "a frame the frame check accepted does not parse");
        Value::Null
    })
}

/// Builds a JSON-RPC error response.
pub fn error_response(id: &Id, code: i64, message: &str, data: Option<Value>) -> Frame {
    let mut error = serde_json::json!({ "code": code, "message": message });
    if let Some(data) = data {
        error["data"] = data;
    }
    response(id, None, Some(&error))
}

/// Builds a JSON-RPC result response.
pub fn result_response(id: &Id, result: Value) -> Frame {
    response(id, Some(&result), None)
}

/// A response whose id is the request's id exactly as it was spelled (its JSON text spliced in).
fn response(id: &Id, result: Option<&Value>, error: Option<&Value>) -> Frame {
    #[derive(serde::Serialize)]
    struct Response<'a> {
        jsonrpc: &'static str,
        id: &'a serde_json::value::RawValue,
        #[serde(skip_serializing_if = "Option::is_none")]
        result: Option<&'a Value>,
        #[serde(skip_serializing_if = "Option::is_none")]
        error: Option<&'a Value>,
    }
    let null = serde_json::value::RawValue::NULL;
    // An id is always valid JSON (it was read by the frame check or built by the shim); null otherwise.
    let id = serde_json::from_str::<&serde_json::value::RawValue>(id.as_json()).unwrap_or(null);
    let bytes = serde_json::to_vec(&Response { jsonrpc: "2.0", id, result, error })
        .expect("a response of JSON values always serialises");
    Frame::built(bytes)
}

/// Builds a notification (its `params` moved in).
pub fn notification(method: &str, params: Value) -> Frame {
    Frame::of_value(json::object([("jsonrpc", "2.0".into()), ("method", method.into()), ("params", params)]))
}

/// What reads the frames of one stream: its [`scan::Scanner`], and what the envelopes of the shapes its lines
/// have had lately were read as (a line of a shape has the same `jsonrpc`, `method` and `sessionUpdate` as
/// every other: they are not read again), each in the place `memo_of` gives its shape.
#[derive(Debug, Default)]
pub struct Reader {
    scanner: scan::Scanner,
    memos: Vec<Option<Memo>>,
}

/// The most members of an object whose places are kept ([`Frame::pick_kept`]): a longer one is gone over per
/// layer that asks (ACP's updates and Coda's reports have a dozen at most).
const MEMBERS_MAX: usize = 64;
/// The longest line whose object's places are kept ([`Frame::pick_kept`]), and which is held with them until the
/// next is asked for.
const MEMBERS_LINE_MAX: usize = 1 << 20;

/// A member of an object of a frame as places in its line: its key with its quotes, and its value.
struct MemberAt {
    key: std::ops::Range<usize>,
    escaped: bool,
    value: std::ops::Range<usize>,
}

/// The members of the object whose first member is at `at` (a place in the line) of the frame whose line is
/// held ([`Frame::pick_kept`]).
#[derive(Default)]
struct Members {
    line: Option<Bytes>,
    at: usize,
    places: Vec<MemberAt>,
}

thread_local! {
    /// The members of the last object of a frame a layer on this thread picked from ([`Frame::pick_kept`]): that
    /// frame's line is held with them, so no other line lies where it lies while they are kept (one line, and as
    /// many places as the object has members).
    static KEPT_MEMBERS: std::cell::RefCell<Members> = std::cell::RefCell::new(Members::default());

    /// The reader of the lines the shim builds on this thread ([`Frame::built`]): it reads each as a line read
    /// alone reads ([`Reader`]), and keeps what a peer's reader keeps, bounded alike.
    static BUILT: std::cell::RefCell<Reader> = std::cell::RefCell::new(Reader::default());
}

/// How many shapes' envelopes a [`Reader`] keeps: as many as the frame check keeps shapes of.
const MEMOS: usize = scan::SHAPES;

/// The place of `shape`'s memo among `memos` (made room for): shapes are numbered one after another, so
/// the last [`MEMOS`] numbered have places of their own (one kept long among newer ones may share its place,
/// and then is read anew when the other was read last).
fn memo_of(memos: &mut Vec<Option<Memo>>, shape: u64) -> &mut Option<Memo> {
    if memos.is_empty() {
        memos.resize_with(MEMOS, || None);
    }
    &mut memos[(shape % MEMOS as u64) as usize]
}

#[derive(Debug)]
struct Memo {
    /// [`scan::Scanner::shape`].
    shape: u64,
    method: Option<Method>,
    update: Option<CompactString>,
    chunk: bool,
}

/// What the envelope says of a frame.
struct Classified {
    kind: Kind,
    /// `params.update.sessionUpdate`.
    update: Option<CompactString>,
    /// What the line's escapes are.
    escapes: scan::Escapes,
    /// A `session/update` of streamed words.
    chunk: bool,
    places: Places,
}

/// Where the fields of `params` layers read are ([`scan::Envelope`]).
#[derive(Default)]
struct Places {
    meta: Option<scan::Span>,
    update_object: Option<scan::Span>,
    session: Option<scan::Str>,
}

impl Places {
    fn of(env: &scan::Envelope) -> Places {
        Places { meta: env.meta, update_object: env.update_object, session: env.session }
    }
}

/// Reads the envelope of one line, checking the whole line (UTF-8, JSON grammar, nesting) in the same pass
/// ([`crate::scan`]), so nothing invalid is ever passed on.
fn classify(bytes: &[u8], reader: Option<&mut Reader>) -> Result<Classified, Invalid> {
    let owned;
    let (checked, memo) = match reader {
        Some(Reader { scanner, memos }) => {
            let checked = scanner.check(bytes);
            let shape = scanner.shape();
            (checked.map(|()| scanner.envelope()), shape.map(|shape| (shape, memo_of(memos, shape))))
        }
        None => {
            owned = scan::scan(bytes);
            (owned.as_ref().map_err(|e| *e), None)
        }
    };
    let env: &scan::Envelope = match checked {
        Ok(env) => env,
        Err(e) => {
            // A line nested too deep is refused for that (not for what it says) when it is JSON otherwise.
            if let Some(at) = json::too_deep(bytes) {
                if !json::brackets_close(bytes) {
                    let message =
                        format!("parse error: brackets or a string left open, deeper than {} levels", json::MAX_DEPTH);
                    return Err(Invalid { code: -32700, message, id: None, too_deep: false, has_method: false });
                }
                let (id, has_method) = sniff(&bytes[..at]);
                let message = format!("invalid request: {}", json::Error::TooDeep(at));
                return Err(Invalid { code: -32600, message, id, too_deep: true, has_method });
            }
            return Err(parse_error(e));
        }
    };
    let id = || env.id.map(|id| Id::from_json(std::str::from_utf8(&bytes[scan::range(id)]).unwrap_or("null")));
    // A line of the shape the last frame had: its envelope's strings are that frame's.
    if let Some((shape, Some(memo))) = &memo
        && memo.shape == *shape
        && let Some(kind) = match (&memo.method, id()) {
            (Some(method), Some(id)) => Some(Kind::Request { id, method: method.clone() }),
            (Some(method), None) => Some(Kind::Notification { method: method.clone() }),
            (None, Some(id)) => Some(Kind::Response { id }),
            // (a shape whose lines have neither is read no further than its envelope: never kept in a memo)
            (None, None) => None,
        }
    {
        let (update, chunk, escapes) = (memo.update.clone(), memo.chunk, env.escapes);
        return Ok(Classified { kind, update, escapes, chunk, places: Places::of(env) });
    }
    let text = |s: &scan::Str| s.text(bytes);
    // A name as the frame keeps it: the usual ones as static text (nothing copied or checked again).
    let name = |s: &scan::Str| match known(s, bytes) {
        Some(known) => Some(CompactString::const_new(known)),
        None => text(s).map(|t| CompactString::from(t.as_ref())),
    };
    match env.top {
        scan::Top::Object => {}
        scan::Top::Array { empty: true } => return Err(invalid("an empty batch is not a JSON-RPC request", None)),
        scan::Top::Array { empty: false } => {
            let escapes = env.escapes;
            let kind = Kind::Batch;
            let places = Places::default();
            return Ok(Classified { kind, update: None, escapes, chunk: false, places });
        }
        scan::Top::Other => return Err(invalid("the message is not a JSON-RPC 2.0 object", None)),
    }
    if env.mistyped {
        return Err(invalid("the message is not a JSON-RPC 2.0 object", None));
    }
    let id = id();
    if env.duplicate {
        return Err(invalid("a key of the envelope appears twice", id));
    }
    let two = |s: &scan::Str| matches!(&bytes[s.range()], b"2.0") || text(s).as_deref() == Some("2.0");
    if !env.jsonrpc.as_ref().is_some_and(two) {
        return Err(invalid("\"jsonrpc\" must be \"2.0\"", id));
    }
    if let Some(id) = &id {
        if matches!(id.as_json().as_bytes().first(), Some(b'{') | Some(b'[') | Some(b't') | Some(b'f')) {
            return Err(invalid("\"id\" must be a number, a string or null", None));
        }
    }
    let method = match &env.method {
        Some(m) => match name(m) {
            Some(m) => Some(m),
            None => return Err(invalid("the method name holds a lone UTF-16 surrogate escape", id)),
        },
        None => None,
    };
    let kind = match (method, id, env.result || env.error) {
        (Some(method), Some(id), false) => Kind::Request { id, method },
        (Some(method), None, false) => Kind::Notification { method },
        (None, Some(id), true) => Kind::Response { id },
        (_, id, _) => return Err(invalid("neither a request, a notification nor a response", id)),
    };
    let update = env.update.as_ref().and_then(name);
    let chunk = matches!(&kind, Kind::Notification { method } if method == "session/update")
        && matches!(update.as_deref(), Some("agent_message_chunk" | "agent_thought_chunk"));
    if let Some((shape, memo)) = memo {
        let method = match &kind {
            Kind::Request { method, .. } | Kind::Notification { method } => Some(method.clone()),
            _ => None,
        };
        *memo = Some(Memo { shape, method, update: update.clone(), chunk });
    }
    Ok(Classified { kind, update, escapes: env.escapes, chunk, places: Places::of(env) })
}

/// The method names and `sessionUpdate` kinds of the frames that come most often, when the string `s` of
/// `line` is one without an escape: a frame keeps them as static text (nothing copied or checked as UTF-8
/// again).
fn known(s: &scan::Str, line: &[u8]) -> Option<&'static str> {
    if s.escaped {
        return None;
    }
    let text = &line[s.range()];
    // By length first: each comparison is then one of a fixed size.
    let one = |name: &'static str| (text == name.as_bytes()).then_some(name);
    match text.len() {
        4 => one("plan"),
        9 => one("tool_call"),
        12 => one("usage_update"),
        14 => one("session/update"),
        16 => one("tool_call_update"),
        19 => one("agent_message_chunk").or_else(|| one("agent_thought_chunk")).or_else(|| one("session_info_update")),
        26 => one("_x.ai/session_notification"),
        _ => None,
    }
}

fn parse_error(e: scan::Error) -> Invalid {
    Invalid { code: -32700, message: format!("parse error: {e}"), id: None, too_deep: false, has_method: false }
}

fn invalid(message: &str, id: Option<Id>) -> Invalid {
    Invalid { code: -32600, message: format!("invalid request: {message}"), id, too_deep: false, has_method: false }
}

/// Finds the id and whether there is a method in the first bytes of a frame too large to parse, so
/// that its sender can still be answered. Best effort: looks at the first `"id"` key.
pub fn sniff(head: &[u8]) -> (Option<Id>, bool) {
    let has_method = memchr::memmem::find(head, br#""method""#).is_some();
    let id = memchr::memmem::find_iter(head, br#""id""#).find_map(|at| {
        let rest = &head[at + 4..];
        let rest = &rest[rest.iter().position(|b| !b.is_ascii_whitespace())?..];
        let rest = rest.strip_prefix(b":")?;
        // Kept as its text: the answer carries the id as the sender spelled it.
        let raw =
            serde_json::Deserializer::from_slice(rest).into_iter::<&serde_json::value::RawValue>().next()?.ok()?;
        let text = raw.get();
        matches!(text.as_bytes().first(), Some(b'"' | b'-' | b'0'..=b'9') | Some(b'n')).then(|| Id::from_json(text))
    });
    (id, has_method)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    fn kind(s: &str) -> Result<Kind, Invalid> {
        Frame::parse(s.as_bytes().to_vec()).map(|f| f.kind)
    }

    fn update(s: &str) -> Option<String> {
        Frame::parse(s.as_bytes().to_vec()).unwrap().session_update().map(str::to_owned)
    }

    #[test]
    fn reads_the_session_update_kind_with_the_envelope() {
        let chunk = r#"{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s","update":{"content":{"sessionUpdate":"no"},"sessionUpdate":"agent_message_chunk"}}}"#;
        assert_eq!(update(chunk).as_deref(), Some("agent_message_chunk"));
        assert_eq!(
            update(r#"{"jsonrpc":"2.0","method":"m","params":{"update":{"session\u0055pdate":"x"}}}"#).as_deref(),
            Some("x")
        );
        // Anything else is no kind, and still a frame.
        for other in [
            r#"{"jsonrpc":"2.0","method":"m","params":[1,{"update":{"sessionUpdate":"x"}}]}"#,
            r#"{"jsonrpc":"2.0","method":"m","params":{"update":"x"}}"#,
            r#"{"jsonrpc":"2.0","method":"m","params":{"update":{"sessionUpdate":{"a":"x"}}}}"#,
            r#"{"jsonrpc":"2.0","method":"m","params":{"sessionUpdate":"x"}}"#,
            r#"{"jsonrpc":"2.0","method":"m","params":null}"#,
            r#"{"jsonrpc":"2.0","id":1,"result":{"update":{"sessionUpdate":"x"}}}"#,
        ] {
            assert_eq!(update(other), None, "{other}");
        }
    }

    /// Frames of a stream taking turns between kinds (a chunk, a usage update, a tool call's update, a
    /// request of the agent's) are each read with what the envelope of its own shape was read as, and read
    /// as a frame alone is.
    #[test]
    fn frames_taking_turns_between_shapes_are_read_with_the_envelope_of_their_own() {
        let line = |kind: usize, n: usize| match kind {
            0 => format!(
                r#"{{"jsonrpc":"2.0","method":"session/update","params":{{"sessionId":"s","update":{{"sessionUpdate":"agent_message_chunk","content":{{"type":"text","text":"w{n}"}}}}}}}}"#
            ),
            1 => format!(
                r#"{{"jsonrpc":"2.0","method":"session/update","params":{{"sessionId":"s","update":{{"sessionUpdate":"usage_update","used":{n},"size":9}}}}}}"#
            ),
            2 => format!(
                r#"{{"jsonrpc":"2.0","method":"session/update","params":{{"sessionId":"s","update":{{"sessionUpdate":"tool_call_update","toolCallId":"c{n}","status":"s{n}"}}}}}}"#
            ),
            _ => format!(
                r#"{{"jsonrpc":"2.0","id":{n},"method":"fs/read_text_file","params":{{"sessionId":"s","path":"/p{n}"}}}}"#
            ),
        };
        let mut reader = Reader::default();
        let (mut with_memo, mut read) = (0, 0);
        for n in 0..40 {
            let kind = n % 4;
            let text = line(kind, n);
            let shapes: Vec<u64> = reader.memos.iter().flatten().map(|m| m.shape).collect();
            let got = Frame::read(Bytes::from(format!("{text}\n")), &mut reader).expect("a frame");
            with_memo += usize::from(reader.scanner.shape().is_some_and(|s| shapes.contains(&s)));
            read += 1;
            let alone = Frame::parse(text.as_bytes().to_vec()).expect("a frame");
            assert_eq!(got.kind(), alone.kind(), "{text}");
            assert_eq!(got.session_update(), alone.session_update(), "{text}");
            assert_eq!(got.is_streamed_chunk(), kind == 0, "{text}");
        }
        // The first of each kind is walked; every later one has its shape's memo.
        assert_eq!(with_memo, read - 4, "frames read with the envelope of their shape");
    }

    #[test]
    fn classifies_the_four_kinds() {
        assert_eq!(
            kind(r#"{"jsonrpc":"2.0","id":7,"method":"session/new","params":{}}"#).unwrap(),
            Kind::Request { id: Id::from_json("7"), method: "session/new".into() }
        );
        assert_eq!(
            kind(r#"{"jsonrpc":"2.0","method":"session/update","params":{}}"#).unwrap(),
            Kind::Notification { method: "session/update".into() }
        );
        assert_eq!(
            kind(r#"{"jsonrpc":"2.0","id":"a","result":null}"#).unwrap(),
            Kind::Response { id: Id::from_json("\"a\"") }
        );
        assert_eq!(kind(r#"[{"jsonrpc":"2.0","method":"x"}]"#).unwrap(), Kind::Batch);
    }

    #[test]
    fn null_id_is_a_request_not_a_notification() {
        assert_eq!(
            kind(r#"{"jsonrpc":"2.0","id":null,"method":"m"}"#).unwrap(),
            Kind::Request { id: Id::null(), method: "m".into() }
        );
    }

    #[test]
    fn escaped_method_names_are_decoded() {
        assert_eq!(
            kind(r#"{"jsonrpc":"2.0","method":"session\/update"}"#).unwrap(),
            Kind::Notification { method: "session/update".into() }
        );
    }

    #[test]
    fn rejects_what_is_not_json_rpc() {
        assert_eq!(kind("hello").unwrap_err().code, -32700);
        assert_eq!(kind(r#"{"jsonrpc":"2.0","id":1"#).unwrap_err().code, -32700);
        assert_eq!(kind("[]").unwrap_err().code, -32600);
        assert_eq!(kind("42").unwrap_err().code, -32600);
        assert_eq!(
            kind(r#"{"id":1,"method":"m"}"#).unwrap_err(),
            Invalid {
                code: -32600,
                message: "invalid request: \"jsonrpc\" must be \"2.0\"".into(),
                id: Some(Id::from_json("1")),
                too_deep: false,
                has_method: false,
            }
        );
        assert_eq!(kind(r#"{"jsonrpc":"2.0","id":{},"method":"m"}"#).unwrap_err().code, -32600);
        assert_eq!(kind(r#"{"jsonrpc":"2.0","id":3}"#).unwrap_err().id, Some(Id::from_json("3")));
    }

    #[test]
    fn invalid_utf8_is_an_error_not_a_panic() {
        let bytes = b"{\"jsonrpc\":\"2.0\",\"method\":\"\xff\"}".to_vec();
        assert_eq!(Frame::parse(bytes).unwrap_err().code, -32700);
        // Also where the envelope does not look: in params, and inside a batch.
        let in_params = b"{\"jsonrpc\":\"2.0\",\"method\":\"m\",\"params\":{\"a\":\"\xac\"}}".to_vec();
        assert_eq!(Frame::parse(in_params).unwrap_err().code, -32700);
        assert_eq!(Frame::parse(b"[\"4,\xac\xac\"]".to_vec()).unwrap_err().code, -32700);
    }

    #[test]
    fn ids_equal_in_value_are_one_id() {
        let same = |a: &str, b: &str| {
            let (a, b) = (Id::from_json(a), Id::from_json(b));
            let hash = |id: &Id| {
                use std::hash::{BuildHasher, RandomState};
                static STATE: std::sync::LazyLock<RandomState> = std::sync::LazyLock::new(RandomState::new);
                STATE.hash_one(id)
            };
            a == b && hash(&a) == hash(&b)
        };
        for (a, b) in [
            ("1", "1e0"),
            ("1", "1.0"),
            ("1", "10e-1"),
            ("100", "1E+2"),
            ("0", "-0.0e5"),
            ("-12", "-1.20e1"),
            ("1e400", "10e399"),
            ("0.5", "5e-1"),
            ("123456789012345678901234567890", "1.2345678901234567890123456789e29"),
            ("\"a\"", "\"\\u0061\""),
            ("null", "null"),
        ] {
            assert!(same(a, b), "{a} and {b} are one id");
        }
        for (a, b) in [
            ("1", "\"1\""),
            ("1", "2"),
            ("9007199254740993", "9007199254740992"),
            ("1e400", "1e401"),
            ("0.1", "1"),
            ("null", "0"),
            ("-1", "1"),
        ] {
            assert!(!same(a, b), "{a} and {b} are two ids");
        }
    }

    #[test]
    fn answers_the_shim_makes_spell_the_id_as_it_came() {
        for id in ["1e0", "1.0", "-0", "1E+2", "123456789012345678901234567890", "\"\\u0061\"", "null"] {
            let e = error_response(&Id::from_json(id), -32603, "gone", None);
            let expected = format!(r#"{{"jsonrpc":"2.0","id":{id},"error":{{"code":-32603,"message":"gone"}}}}"#);
            assert_eq!(std::str::from_utf8(e.bytes()).unwrap(), expected);
            let r = result_response(&Id::from_json(id), serde_json::json!({}));
            assert_eq!(
                std::str::from_utf8(r.bytes()).unwrap(),
                format!(r#"{{"jsonrpc":"2.0","id":{id},"result":{{}}}}"#)
            );
            assert!(r.is_shim());
        }
    }

    #[test]
    fn a_line_handed_over_without_its_newline_loses_no_byte() {
        let line = br#"{"jsonrpc":"2.0","method":"m","params":{"a":1}}"#;
        let f = Frame::parse_wire(Bytes::from_static(line)).expect("a frame");
        assert_eq!(f.bytes(), line);
        assert_eq!(f.into_wire(), [&line[..], b"\n"].concat());
        let (back, err) = Frame::parse_wire(Bytes::from_static(b"nope")).unwrap_err();
        assert_eq!((&back[..], err.code), (&b"nope\n"[..], -32700));
        // Empty stays a parse error, not a panic.
        assert_eq!(Frame::parse_wire(Bytes::new()).unwrap_err().1.code, -32700);
    }

    #[test]
    fn a_frame_is_parsed_once_and_its_value_shared() {
        let f = Frame::parse(br#"{"jsonrpc":"2.0","id":1,"method":"m","params":{"a":[1,2]}}"#.to_vec()).unwrap();
        let unread = f.clone();
        let first: *const Value = f.value();
        assert!(std::ptr::eq(first, f.value()), "read once, then the same value");
        assert!(std::ptr::eq(first, &*f.shared_value()));
        let clone = f.clone();
        assert!(std::ptr::eq(first, clone.value()), "a clone shares what was read");
        assert_eq!(f, unread, "whether a frame was read is no difference");
        // An edit is a copy: the frame it came from is unchanged.
        let mut edited = f.to_value();
        edited["params"]["b"] = Value::from(true);
        assert_eq!(f.value()["params"].get("b"), None);
        // The rewritten frame keeps the value it was written from, and its bytes read back as that value.
        let out = f.rewritten(edited.clone());
        assert!(out.is_shim());
        assert_eq!(out.value(), &edited);
        assert_eq!(&json::from_slice::<Value>(out.bytes()).unwrap(), out.value());
        // Read on a reader's thread and handled on the relay's: a frame is Send.
        fn send<T: Send>() {}
        send::<Frame>();
        // Moved through every layer: the cache is one pointer (120 bytes without it, on 64-bit targets).
        assert!(std::mem::size_of::<Frame>() <= 128, "{}", std::mem::size_of::<Frame>());
        assert_eq!(std::mem::size_of::<OnceCell<Arc<Value>>>(), 8);
    }

    #[test]
    fn a_lone_surrogate_reads_as_u_fffd_is_kept_on_the_wire_and_rewritten_as_u_fffd() {
        let line = r#"{"jsonrpc":"2.0","id":1,"method":"m","params":{"a":"x\ud800","b":"\ud83d\ude00","c":1e400}}"#;
        assert!(json::from_str::<Value>(line).is_err(), "serde_json alone refuses it");
        let f = Frame::parse(line.as_bytes().to_vec()).expect("valid JSON-RPC");
        assert!(f.lone_surrogate(), "noted where the line is checked");
        assert_eq!(f.value()["params"]["a"], "x\u{FFFD}");
        assert_eq!(f.value()["params"]["b"], "😀");
        assert_eq!(f.bytes(), line.as_bytes(), "the wire stays as it came");
        let mut v = f.to_value();
        v["params"]["d"] = Value::from(2);
        let out = f.rewritten(v);
        assert!(!out.lone_surrogate());
        let text = std::str::from_utf8(out.bytes()).unwrap();
        assert_eq!(text, r#"{"id":1,"jsonrpc":"2.0","method":"m","params":{"a":"x�","b":"😀","c":1e400,"d":2}}"#);
        // In the method name it would change what the frame asks for: refused where the line is checked.
        let named = r#"{"jsonrpc":"2.0","id":2,"method":"session/\ud800"}"#;
        assert_eq!(Frame::parse(named.as_bytes().to_vec()).unwrap_err().code, -32600);
    }

    #[test]
    fn params_meta_is_found_with_the_envelope() {
        let grok = r#"{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s","update":{"sessionUpdate":"agent_message_chunk","content":{"type":"text","text":"{\"_meta\":1}"}},"_meta":{"eventId":"s-14","agentTimestampMs":1796186871643,"streamStartMs":1796186871600}}}"#;
        let mut scanner = Reader::default();
        for _ in 0..3 {
            // The second and third time through a stream's scanner, checked against the first's shape.
            let f = Frame::read(Bytes::from(format!("{grok}\n")), &mut scanner).unwrap();
            let meta = f.meta().expect("a _meta");
            assert_eq!(meta.get("streamStartMs").and_then(|v| v.as_u64()), Some(1796186871600));
            assert_eq!(meta.get("eventId").and_then(|v| v.as_str()).as_deref(), Some("s-14"));
            assert_eq!(Some(&meta.to_value()), f.value().pointer("/params/_meta"));
        }
        for none in [
            r#"{"jsonrpc":"2.0","method":"m","params":{"update":{"_meta":{"a":1}}}}"#,
            r#"{"jsonrpc":"2.0","method":"m","params":{"_meta":[1]}}"#,
            r#"{"jsonrpc":"2.0","id":1,"result":{"_meta":{"a":1}}}"#,
            r#"[{"jsonrpc":"2.0","method":"m","params":{"_meta":{"a":1}}}]"#,
        ] {
            assert!(Frame::parse(none.as_bytes().to_vec()).unwrap().meta().is_none(), "{none}");
        }
        let built = notification("m", serde_json::json!({"_meta": {"a": 2}}));
        assert_eq!(built.meta().and_then(|m| m.get("a")).and_then(|v| v.as_u64()), Some(2));
        // A `_meta` longer than the frame keeps the place of is looked for again.
        let long = notification("m", serde_json::json!({"x": 1, "_meta": {"pad": "p".repeat(70_000), "a": 3}}));
        assert_eq!(long.meta().and_then(|m| m.get("a")).and_then(|v| v.as_u64()), Some(3));
    }

    /// Whether a frame may hold a `\u` escape is what its line holds, read alone or through a stream's reader
    /// (a line of a shape it kept checked against that shape): the escape in a key, in a value, or none but
    /// an escaped backslash before a `u`; and a frame spliced, as a read of its new line notes it.
    #[test]
    fn a_unicode_escape_is_noted_where_the_line_is_checked() {
        let chunk = |key: &str, text: &str| {
            format!(
                r#"{{"jsonrpc":"2.0","method":"session/update","params":{{"sessionId":"s","update":{{"sessionUpdate":"agent_message_chunk","{key}":{{"type":"text","text":"{text}"}}}}}}}}"#
            )
        };
        let mut reader = Reader::default();
        for (line, escaped) in [
            (chunk("content", r"caf\u00e9"), true),
            (chunk("content", "cafe"), false),
            (chunk("content", r"\\u00e9 \n 你好"), false),
            (chunk("content", r"\ud83d\ude00"), true),
            (chunk(r"cont\u0065nt", "plain"), true),
            (chunk(r"cont\u0065nt", "other"), true),
            (chunk("content", "again"), false),
        ] {
            let read = Frame::read(Bytes::from(format!("{line}\n")), &mut reader).unwrap();
            let alone = Frame::parse(line.clone().into_bytes()).unwrap();
            assert_eq!((read.unicode_escaped(), alone.unicode_escaped()), (escaped, escaped), "{line}");
        }
        let text = |f: &Frame| f.bytes().windows(5).position(|w| w == br#""abc""#).map(|at| at..at + 5).unwrap();
        let plain = Frame::parse(chunk("content", "abc").into_bytes()).unwrap();
        let spliced = plain.spliced(text(&plain), br#""\u0001""#);
        assert!(spliced.unicode_escaped() && spliced.value().pointer("/params/update/content/text").is_some());
        assert!(!plain.spliced(text(&plain), br#""\n""#).unicode_escaped());
        let escaped = Frame::parse(chunk(r"cont\u0065nt", "abc").into_bytes()).unwrap();
        assert!(escaped.spliced(text(&escaped), br#""d""#).unicode_escaped());
        // An escape made where the cut meets the line: a backslash before it and a `u` written, or a backslash
        // written last and a `u` after it; and one written in parts.
        let newline = Frame::parse(chunk("content", r"a\nb").into_bytes()).unwrap();
        let n = newline.bytes().windows(2).position(|w| w == br"\n").unwrap() + 1;
        let made = newline.spliced(n..n + 1, b"u0041");
        assert!(made.unicode_escaped(), "{:?}", String::from_utf8_lossy(made.bytes()));
        assert_eq!(made.value().pointer("/params/update/content/text"), Some(&serde_json::json!("aAb")));
        let before_u = Frame::parse(chunk("content", "u0041").into_bytes()).unwrap();
        let at = before_u.bytes().windows(5).position(|w| w == b"u0041").unwrap();
        assert!(before_u.spliced(at..at, br"\").unicode_escaped());
        let parts = plain.spliced_parts(text(&plain), ["\"x", r"\", "u0001\""]);
        assert!(parts.unicode_escaped() && parts.value().pointer("/params/update/content/text").is_some());
        let not = plain.spliced_parts(text(&plain), ["\"x", r"\\", "n\""]);
        assert!(!not.unicode_escaped() && not.value().pointer("/params/update/content/text").is_some());
    }

    #[test]
    fn the_update_is_found_with_the_envelope() {
        let mut reader = Reader::default();
        for n in 0..3 {
            // The second and third time through a stream's reader, checked against the first's shape.
            let line = format!(
                r#"{{"jsonrpc":"2.0","method":"session/update","params":{{"sessionId":"s","update":{{"sessionUpdate":"tool_call_update","toolCallId":"c{n}","status":"completed"}},"_meta":{{"n":{n}}}}}}}"#
            );
            let f = Frame::read(Bytes::from(format!("{line}\n")), &mut reader).unwrap();
            let update = f.update_value().expect("an update");
            assert_eq!(Some(&update.to_value()), f.value().pointer("/params/update"));
            assert_eq!(update.get("toolCallId").and_then(|v| v.as_str()).as_deref(), Some(format!("c{n}").as_str()));
        }
        for none in [
            r#"{"jsonrpc":"2.0","method":"m","params":{"update":[1]}}"#,
            r#"{"jsonrpc":"2.0","method":"m","params":{"update":{"a":1},"update":7}}"#,
            r#"{"jsonrpc":"2.0","method":"m","params":{"x":{"update":{"a":1}}}}"#,
            r#"{"jsonrpc":"2.0","id":1,"result":{"update":{"a":1}}}"#,
        ] {
            assert!(Frame::parse(none.as_bytes().to_vec()).unwrap().update_value().is_none(), "{none}");
        }
        let twice = r#"{"jsonrpc":"2.0","method":"m","params":{"update":7,"update":{"a":1}}}"#;
        let f = Frame::parse(twice.as_bytes().to_vec()).unwrap();
        assert_eq!(f.update_value().map(|u| u.to_value()), Some(serde_json::json!({"a": 1})));
        // An update longer than the frame keeps the place of is looked for again.
        let long = notification("m", serde_json::json!({"update": {"pad": "p".repeat(70_000), "a": 3}}));
        assert_eq!(long.update_value().and_then(|u| u.get("a")).and_then(|v| v.as_u64()), Some(3));
        let not = notification("m", serde_json::json!({"update": ["p".repeat(70_000)]}));
        assert!(not.update_value().is_none());
    }

    #[test]
    fn the_session_is_found_with_the_envelope() {
        let mut scanner = Reader::default();
        for n in 0..3 {
            // The second and third time through a stream's scanner, checked against the first's shape.
            let line = format!(
                r#"{{"jsonrpc":"2.0","method":"session/update","params":{{"sessionId":"s-{n}","update":{{"sessionUpdate":"agent_message_chunk","content":{{"type":"text","text":"t{n}"}}}}}}}}"#
            );
            let f = Frame::read(Bytes::from(format!("{line}\n")), &mut scanner).unwrap();
            assert_eq!(f.session().as_deref(), Some(format!("s-{n}").as_str()));
            assert_eq!(f.session().as_deref(), f.value().pointer("/params/sessionId").and_then(Value::as_str));
        }
        for (line, want) in [
            (r#"{"jsonrpc":"2.0","method":"m","params":{"sessionId":"a\u0062\"c"}}"#, Some("ab\"c")),
            (r#"{"jsonrpc":"2.0","method":"m","params":{"sessionId":"x\ud800"}}"#, Some("x\u{FFFD}")),
            (r#"{"jsonrpc":"2.0","method":"m","params":{"sessionId":"a","sessionId":"b"}}"#, Some("b")),
            (r#"{"jsonrpc":"2.0","method":"m","params":{"sessionId":1}}"#, None),
            (r#"{"jsonrpc":"2.0","method":"m","params":{"update":{"sessionId":"a"}}}"#, None),
            (r#"{"jsonrpc":"2.0","id":1,"result":{"sessionId":"a"}}"#, None),
        ] {
            let f = Frame::parse(line.as_bytes().to_vec()).unwrap();
            assert_eq!(f.session().as_deref(), want, "{line}");
            assert_eq!(f.session().as_deref(), f.value().pointer("/params/sessionId").and_then(Value::as_str));
        }
        for line in [
            r#"{"jsonrpc":"2.0","method":"m","params":{"sessionId":"a\u0062"}}"#,
            r#"{"jsonrpc":"2.0","method":"m","params":{"sessionId":"é"}}"#,
        ] {
            let f = Frame::parse(line.as_bytes().to_vec()).unwrap();
            assert_eq!(f.session_bytes().as_deref(), f.session().as_deref().map(str::as_bytes), "{line}");
        }
        let built = notification("m", serde_json::json!({"sessionId": "built"}));
        assert_eq!(built.session().as_deref(), Some("built"));
        // One longer than the frame keeps the place of is looked for again.
        let long = "s".repeat(70_000);
        let f = notification("m", serde_json::json!({"sessionId": long}));
        assert_eq!(f.session().as_deref(), Some(long.as_str()));
        assert_eq!(f.session_bytes().as_deref(), Some(long.as_bytes()));
    }

    /// A session id taken as it lies in a line found UTF-8 is one only while the line is: bytes that are no
    /// UTF-8 spliced into its text (no layer writes such, but `spliced` takes bytes) leave it checked, and read
    /// as none; UTF-8 spliced in (as bytes or as text in parts) reads as what it is. The same for the ids
    /// `key_strings` finds.
    #[test]
    fn an_id_read_as_it_lies_is_text_only_in_a_line_that_stays_utf8() {
        static SESSION_KEY: Needle = crate::needle!(b"\"sessionId\"");
        let line = r#"{"jsonrpc":"2.0","method":"m","params":{"sessionId":"abc","update":{"sessionUpdate":"x"}}}"#;
        let f = Frame::parse(line.as_bytes().to_vec()).unwrap();
        let at = line.find("abc").unwrap();
        for (with, want) in [(&b"\xff\xfe"[..], None), ("é日".as_bytes(), Some("aé日c")), (b"\xe6\x97", None)] {
            let spliced = f.spliced(at + 1..at + 2, with);
            assert_eq!(spliced.flags & UTF8 != 0, want.is_some(), "{with:?}");
            assert_eq!(spliced.session().as_deref(), want, "{with:?}");
            assert_eq!(spliced.key_strings(&SESSION_KEY).collect::<Vec<_>>(), [want], "{with:?}");
        }
        // Text spliced in parts (the usage facts' way) is UTF-8 by its type: the line stays so.
        let parts = f.spliced_parts(at + 1..at + 2, ["é", "", "日"]);
        assert!(parts.flags & UTF8 != 0);
        assert_eq!(parts.session().as_deref(), Some("aé日c"));
        assert_eq!(parts.key_strings(&SESSION_KEY).collect::<Vec<_>>(), [Some("aé日c")]);
        assert_eq!(f.session().as_deref(), Some("abc"));
        assert_eq!(f.key_strings(&SESSION_KEY).collect::<Vec<_>>(), [Some("abc")]);
        // UTF-8 in place of part of a character leaves the line no UTF-8: its strings, as the session id and
        // as views give them ([`json::View::as_str`]), are checked, and read as none.
        let line = r#"{"jsonrpc":"2.0","method":"m","params":{"sessionId":"a日c","update":{"sessionUpdate":"x"}}}"#;
        let f = Frame::parse(line.as_bytes().to_vec()).unwrap();
        let at = line.find("日").unwrap();
        for cut in [at + 1..at + 2, at..at + 1, at + 2..at + 3] {
            let spliced = f.spliced(cut.clone(), "é".as_bytes());
            assert_eq!(spliced.flags & UTF8, 0, "{cut:?}");
            assert_eq!(spliced.session(), None, "{cut:?}");
            assert_eq!(spliced.view().pointer(&["params", "sessionId"]).unwrap().as_str(), None, "{cut:?}");
        }
        let whole = f.spliced(at..at + 3, "é".as_bytes());
        assert!(whole.flags & UTF8 != 0);
        assert_eq!(whole.view().pointer(&["params", "sessionId"]).and_then(|v| v.as_str()).as_deref(), Some("aéc"));
    }

    /// `got` is `want` as frames go: its bytes, kind and flags, and what the frame check found where.
    pub(crate) fn reads_alike(got: &Frame, want: &Frame, what: &str) {
        assert!(got == want, "{what}");
        assert_eq!(got.kind(), want.kind(), "{what}");
        assert_eq!(got.session(), want.session(), "{what}");
        assert_eq!(got.session_bytes(), want.session_bytes(), "{what}");
        assert_eq!(got.meta(), want.meta(), "{what}");
        assert_eq!(got.update_value(), want.update_value(), "{what}");
        assert_eq!(got.session_update(), want.session_update(), "{what}");
        assert_eq!(got.is_streamed_chunk(), want.is_streamed_chunk(), "{what}");
    }

    /// A line the shim builds reads as that line alone reads (no reader), whatever was built before it on the
    /// thread: every recorded and hostile line, twice through (the second time checked against the shapes the
    /// first kept), and each again at once.
    #[test]
    fn a_built_line_reads_as_the_line_alone_whatever_was_built_before() {
        let mut lines = recorded_lines();
        lines.extend(hostile_lines());
        let mut built = 0;
        for line in lines.iter().chain(&lines).flat_map(|l| [l, l]) {
            // (While the thread's reader is held, a line is read alone.)
            let alone = BUILT.with(|reader| {
                let _held = reader.borrow_mut();
                Frame::built(line.clone())
            });
            let got = Frame::built(line.clone());
            reads_alike(&got, &alone, &String::from_utf8_lossy(line));
            built += 1;
        }
        assert!(built > 1_000, "{built}");
        // (And the thread's reader did read them: it keeps their shapes' envelopes.)
        assert!(BUILT.with(|reader| reader.borrow().memos.iter().flatten().count()) > 10);
    }

    /// [`Frame::key_strings`] is exact where it finds nothing of a value: for every recorded and hostile line
    /// with no `\u` escape, every string value of a key it is asked for, at any depth (as serde_json reads it:
    /// for a key twice, the last), is among what it finds as written, or it found a value it cannot tell.
    #[test]
    fn key_strings_miss_no_value_of_their_key() {
        static KEYS: [Needle; 4] = [
            crate::needle!(b"\"toolCallId\""),
            crate::needle!(b"\"messageId\""),
            crate::needle!(b"\"sessionId\""),
            crate::needle!(b"\"type\""),
        ];
        fn values<'v>(v: &'v Value, key: &str, out: &mut Vec<&'v str>) {
            match v {
                Value::Object(map) => {
                    out.extend(map.get(key).and_then(Value::as_str));
                    map.values().for_each(|v| values(v, key, out));
                }
                Value::Array(items) => items.iter().for_each(|v| values(v, key, out)),
                _ => {}
            }
        }
        let mut lines = recorded_lines();
        lines.extend(hostile_lines());
        for value in [r#""id""#, r#" "id" "#, r#""i\/d""#, r#""i\"d""#, r#"7"#, r#"{"toolCallId":"in"}"#, r#""""#] {
            for object in [
                format!(r#"{{"toolCallId":{value}}}"#),
                format!(r#"{{"toolCall\u0049d":{value}}}"#),
                format!("{{\"toolCallId\"\t:\n{value},\"toolCallId\":\"last\"}}"),
                format!(r#"{{"a\"toolCallId":{value},"b":"toolCallId","toolCallId" : {value}}}"#),
            ] {
                lines.push(format!(r#"{{"jsonrpc":"2.0","method":"m","params":{object}}}"#).into_bytes());
            }
        }
        let (mut checked, mut told) = (0, 0);
        for frame in lines.into_iter().filter_map(|line| Frame::parse(line).ok()) {
            // (Where the frame check found no `\u` escape, no key is spelled with one.)
            if frame.unicode_escaped() {
                continue;
            }
            for key in &KEYS {
                let name = std::str::from_utf8(&key.bytes()[1..key.bytes().len() - 1]).expect("a key");
                let mut want = Vec::new();
                values(frame.value(), name, &mut want);
                let found: Vec<Option<&str>> = frame.key_strings(key).collect();
                for v in want {
                    checked += 1;
                    let seen = found.contains(&Some(v));
                    assert!(
                        seen || found.contains(&None),
                        "{name} {v:?} in {:?}: {found:?}",
                        String::from_utf8_lossy(frame.bytes())
                    );
                    told += usize::from(seen);
                }
            }
        }
        assert!(checked > 1000 && told * 10 > checked * 9, "{told} of {checked} values found as written");
    }

    /// [`Frame::update_pick`] and [`Frame::params_pick`] find what [`json::View::pick`] finds in the update and
    /// in `params`, whichever frame or object was asked before: every recorded and hostile line, and updates
    /// with a key twice, escaped keys, more members than are kept, a line past the longest held; asked in turn
    /// of the update and of `params` of one frame, with a clone, with other frames between, and with frames of
    /// lines as long dropped and read again (no line can take a held one's place).
    #[test]
    fn an_objects_members_kept_for_the_next_layer_are_that_objects() {
        let mut lines = recorded_lines();
        lines.extend(hostile_lines());
        let many: String = (0..=MEMBERS_MAX).map(|n| format!(r#""k{n}":{n},"#)).collect();
        let update = |members: &str| {
            format!(r#"{{"jsonrpc":"2.0","method":"session/update","params":{{"sessionId":"s","update":{members}}}}}"#)
        };
        for members in [
            r#"{"status":"pending","toolCallId":"a","status":"completed"}"#.to_owned(),
            r#"{"st\u0061tus":"x","toolCallId":"\u0062","_meta":{"status":"no"},"rawInput":{"command":"ls"}}"#
                .to_owned(),
            r#" { "status" : "in_progress" , "toolCallId" : "c" } "#.to_owned(),
            format!(r#"{{{many}"status":"late"}}"#),
            format!(r#"{{"toolCallId":"big","rawOutput":"{}","status":"done"}}"#, "x".repeat(MEMBERS_LINE_MAX)),
            "{}".to_owned(),
            "[]".to_owned(),
        ] {
            lines.push(update(&members).into_bytes());
        }
        for params in [
            r#"{"sessionId":"a","waitId":"w","sessionId":"b","st\u0061te":"done"}"#.to_owned(),
            format!(r#"{{{many}"waitId":"late","update":{{"status":"x"}}}}"#),
        ] {
            lines.push(format!(r#"{{"jsonrpc":"2.0","method":"_coda/wait","params":{params}}}"#).into_bytes());
        }
        let keys = ["status", "toolCallId", "_meta", "rawInput", "sessionUpdate", "absent", "k3", "title"];
        let frames: Vec<Frame> = lines.iter().filter_map(|l| Frame::parse(l.clone()).ok()).collect();
        assert!(frames.len() > 1_000, "{}", frames.len());
        fn want<'a>(f: &'a Frame, keys: [&str; 8]) -> [Option<json::View<'a>>; 8] {
            f.update_value().map_or([None; 8], |u| u.pick(keys))
        }
        let params_keys = ["sessionId", "update", "_meta", "waitId", "absent", "entries", "k3", "state"];
        let check = |f: &Frame| {
            let want = want(f, keys);
            let line = String::from_utf8_lossy(&f.bytes()[..f.bytes().len().min(500)]);
            assert_eq!(f.update_pick(keys), want, "{line}");
            let want_params = f.view().get("params").map_or([None; 8], |p| p.pick(params_keys));
            assert_eq!(f.params_pick(params_keys), want_params, "{line}");
            assert_eq!(f.params_pick(params_keys), want_params, "{line}");
            for (key, want) in keys.into_iter().zip(want) {
                assert_eq!(f.update_get(key), want);
            }
            // Each is a part of the line's text (the frame check found it UTF-8): its strings are read as they lie.
            let picked = f.update_pick(keys).into_iter().chain(f.params_pick(params_keys)).flatten();
            let views = picked.chain([f.view()]).chain(f.update_value()).chain(f.meta());
            assert!(views.into_iter().all(|v| v.known_utf8()), "{line}");
        };
        for (n, f) in frames.iter().enumerate() {
            check(f);
            check(&f.clone());
            check(&frames[n / 2]);
            check(f);
        }
        // Lines of the same length, each read, asked and dropped: another may lie where one lay.
        for n in 0..200 {
            let f =
                Frame::parse(update(&format!(r#"{{"status":"s{:03}","toolCallId":"t{n:03}"}}"#, 999 - n)).into_bytes());
            let f = f.expect("a line");
            assert_eq!(
                f.update_get("status").and_then(|v| v.as_str()).as_deref(),
                Some(format!("s{:03}", 999 - n).as_str())
            );
            check(&f);
        }
        // The memo held is one line's, and at most as many places as are kept.
        KEPT_MEMBERS.with(|m| assert!(m.borrow().places.len() <= MEMBERS_MAX + 1));
    }

    /// A frame renamed ([`Frame::with_session`]) is its value with `params.sessionId` replaced, and reads as
    /// its own line reads (session, `_meta`, update and kind where the line has them), for every recorded and
    /// hostile line and sessions written escaped, twice, after the update, at the length the frame keeps a
    /// place of, with a lone surrogate; in place (the line's other bytes as they were) wherever it can be.
    #[test]
    fn a_renamed_session_is_the_value_renamed_and_reads_as_its_line() {
        let mut lines = recorded_lines();
        lines.extend(hostile_lines());
        let long = "s".repeat(usize::from(u8::MAX) + 1);
        for params in [
            r#"{"sessionId":"a\u0062c:1","update":{"sessionUpdate":"x","_meta":{"k":1}},"_meta":{"t":2}}"#.to_owned(),
            r#"{"update":{"sessionUpdate":"x"},"_meta":{"t":2},"sessionId":"abc:1"}"#.to_owned(),
            r#" { "sessionId" : "abc:1" , "update" : { } } "#.to_owned(),
            r#"{"sessionId":"a","sessionId":"b:1","update":{}}"#.to_owned(),
            r#"{"sessionId":"abc:1","x":"\ud800","update":{"sessionUpdate":"y"}}"#.to_owned(),
            r#"{"sessionId":1,"update":{}}"#.to_owned(),
            r#"{"update":{}}"#.to_owned(),
            r#""no object""#.to_owned(),
            format!(r#"{{"sessionId":"{long}","update":{{}}}}"#),
            format!(r#"{{"sessionId":"{}","update":{{}}}}"#, &long[1..]),
        ] {
            let line = format!(r#"{{"jsonrpc":"2.0","method":"session/update","params":{params}}}"#);
            lines.push(line.into_bytes());
        }
        lines.push(br#"{"jsonrpc":"2.0","id":3,"result":{"sessionId":"r"}}"#.to_vec());
        let (mut in_place, mut renamed) = (0, 0);
        for line in lines {
            let Ok(frame) = Frame::parse(line.clone()) else { continue };
            for session in ["abc", "", "子代理 \"q\" \\ \u{1}\n", long.as_str()] {
                let got = frame.with_session(session);
                let mut want = frame.to_value();
                let Some(params) = want.get_mut("params").and_then(Value::as_object_mut) else {
                    assert!(got == frame, "no params: as it was");
                    continue;
                };
                params.insert("sessionId".into(), session.into());
                renamed += 1;
                let what = format!("{} → {session:?}", String::from_utf8_lossy(&line));
                assert_eq!(got.value(), &want, "{what}");
                reads_alike(&got, &Frame::built(got.bytes().to_vec()), &what);
                // One `sessionId`, as the value has it (a reader that keeps the first of two reads the new one).
                let keys = got.view().members_at("params").filter(|(key, _)| key.is("sessionId")).count();
                assert_eq!(keys, 1, "{what}");
                if let Some(written) = frame.session_as_written() {
                    let start = usize::from(frame.session_start);
                    let mut text = Vec::new();
                    json::write_str(&mut text, session);
                    let spliced = [&line[..start], &text[1..text.len() - 1], &line[start + written.len()..]].concat();
                    in_place += usize::from(got.bytes() == &spliced[..]);
                }
            }
        }
        // Every recorded session/update is renamed in place (a line of another shape has no session place).
        assert!(renamed > 1_000 && in_place * 10 > renamed * 8, "{in_place} of {renamed} in place");
    }

    /// A stream's reader makes of every line what a frame check of that line alone makes of it, whatever
    /// came before (a line of the shape before it, read with what was kept of that shape's envelope).
    #[test]
    fn a_streams_reader_reads_every_line_as_the_line_alone_reads() {
        let mut lines = scan::corpus();
        // Envelopes of every kind, of one shape after another with other ids, and some refused.
        for id in ["1", "\"a\"", "null", "2.5e3", "\"\\ud800\""] {
            for line in [
                format!(r#"{{"jsonrpc":"2.0","id":{id},"method":"session/prompt","params":{{"sessionId":"s"}}}}"#),
                format!(r#"{{"jsonrpc":"2.0","id":{id},"result":{{"stopReason":"end_turn"}}}}"#),
                format!(r#"{{"jsonrpc":"2.0","id":{id},"error":{{"code":-1,"message":"m"}}}}"#),
                format!(r#"{{"jsonrpc":"2.0","id":{id},"method":"x\u002fy","params":{{}}}}"#),
                format!(r#"{{"jsonrpc":"1.0","id":{id},"method":"m"}}"#),
                format!(r#"{{"jsonrpc":"2.0","id":{id},"result":1,"method":"m"}}"#),
                format!(r#"{{"jsonrpc":"2.0","id":{id}}}"#),
                format!(r#"{{"jsonrpc":"2.0","id":{id},"method":"session/\ud800"}}"#),
                format!(r#"[{{"jsonrpc":"2.0","id":{id},"method":"m"}}]"#),
            ] {
                lines.push(line.into_bytes());
            }
        }
        let alone = |line: &[u8]| Frame::parse_wire(Bytes::from([line, b"\n"].concat())).map_err(|(_, e)| e);
        let same = |got: Result<Frame, Invalid>, want: Result<Frame, Invalid>, line: &[u8]| match (got, want) {
            (Ok(got), Ok(want)) => {
                assert!(got == want, "{}", String::from_utf8_lossy(line));
                assert_eq!(got.meta(), want.meta());
                assert_eq!(got.session(), want.session());
                assert_eq!(got.update_value(), want.update_value());
            }
            (Err(got), Err(want)) => assert_eq!((got.code, got.message, got.id), (want.code, want.message, want.id)),
            (got, want) => panic!("{}: {got:?} / {want:?}", String::from_utf8_lossy(line)),
        };
        let mut reader = Reader::default();
        let mut memo = 0;
        for (i, line) in lines.iter().enumerate() {
            // Each line after the one before it, and after itself.
            for before in [&lines[i.saturating_sub(1)], line] {
                let _ = Frame::read(Bytes::from([before, &b"\n"[..]].concat()), &mut reader);
                let shapes: Vec<u64> = reader.memos.iter().flatten().map(|m| m.shape).collect();
                let got = Frame::read(Bytes::from([line, &b"\n"[..]].concat()), &mut reader).map_err(|(_, e)| e);
                memo += usize::from(reader.scanner.shape().is_some_and(|s| shapes.contains(&s)));
                same(got, alone(line), line);
            }
        }
        assert!(memo > 10_000, "lines were read with the envelope of their shape ({memo})");
    }

    /// What a layer reads from the frame check's one pass (the session, `params._meta`, `params.update`, its
    /// kind) is what it would read of the parsed frame, for every frame of every recorded fixture (read through
    /// one stream's reader in the order recorded, and alone) and the hostile lines.
    #[test]
    fn every_recorded_and_hostile_line_reads_as_its_parsed_value() {
        let mut lines = recorded_lines();
        assert!(lines.len() > 4000, "the fixtures' frames ({})", lines.len());
        lines.extend(hostile_lines());
        let mut reader = Reader::default();
        let mut checked = 0;
        for line in &lines {
            let wire = Bytes::from([line, &b"\n"[..]].concat());
            let (Ok(streamed), Ok(alone)) = (Frame::read(wire.clone(), &mut reader), Frame::parse_wire(wire)) else {
                continue;
            };
            for f in [streamed, alone] {
                let v = f.value().clone();
                let text = |p: &str| v.pointer(p).and_then(Value::as_str);
                let object = |p: &str| v.pointer(p).filter(|m| m.is_object()).cloned();
                let what = String::from_utf8_lossy(&line[..line.len().min(300)]);
                assert_eq!(f.session().as_deref(), text("/params/sessionId"), "{what}");
                assert_eq!(f.meta().map(|m| m.to_value()), object("/params/_meta"), "{what}");
                assert_eq!(f.update_value().map(|u| u.to_value()), object("/params/update"), "{what}");
                // The spans noted are read as they are (`View::exact`): from the object's first byte to its last.
                for text in [f.meta(), f.update_value()].into_iter().flatten().map(|v| v.text()) {
                    assert!(text.first() == Some(&b'{') && text.last() == Some(&b'}'), "{what}");
                }
                // A kind spelled with a lone surrogate escape names no kind a layer acts on: it is read as none.
                let kind = text("/params/update/sessionUpdate");
                let lone_kind = f.lone_surrogate() && kind.is_some_and(|k| k.contains('\u{FFFD}'));
                if v.get("method").is_some() && v.get("id").is_none() && !lone_kind {
                    assert_eq!(f.session_update(), kind, "{what}");
                }
                checked += 1;
            }
        }
        assert!(checked > 8000, "{checked}");
    }

    /// A notification the shim builds keeps its value: what a later layer reads of it is what its bytes say.
    #[test]
    fn a_built_notification_reads_as_its_bytes() {
        let params = serde_json::json!({"sessionId":"s","text":"用户 \"q\" \u{1} \n 😀","n":[0,-1,1.5,18446744073709551615u64,
            1e300,0.1],"o":{"a":null,"b":true},"e":{}});
        let frame = notification("_coda/wait", params);
        let parsed: Value = json::from_slice(frame.bytes()).expect("JSON");
        assert_eq!(frame.value(), &parsed);
        assert_eq!(frame.method(), Some("_coda/wait"));
        assert_eq!(frame.session().as_deref(), Some("s"));
        assert!(frame.is_shim());
    }

    #[test]
    fn keeps_bytes_untouched() {
        let line = r#"{"jsonrpc":"2.0","id":1e3,"method":"x","params":{"b":1,"a":"\u00e9"}}"#;
        let f = Frame::parse(line.as_bytes().to_vec()).unwrap();
        assert_eq!(f.bytes(), line.as_bytes());
        assert_eq!(f.id().unwrap().as_json(), "1e3");
    }
}

#[cfg(test)]
mod sniff_tests {
    use super::*;

    #[test]
    fn finds_id_and_method_in_a_truncated_frame() {
        assert_eq!(
            sniff(br#"{"jsonrpc":"2.0","id":12,"method":"session/prompt","params":{"prompt":[{"te"#),
            (Some(Id::from_json("12")), true)
        );
        assert_eq!(sniff(br#"{"jsonrpc":"2.0","id" : "x","result":{"a"#), (Some(Id::from_json("\"x\"")), false));
        assert_eq!(sniff(br#"{"jsonrpc":"2.0","method":"session/update","params":{"#), (None, true));
        assert_eq!(sniff(br#"{"jsonrpc":"2.0","id":1E+2,"method":"x","params":{"#).0.unwrap().as_json(), "1E+2");
        assert_eq!(sniff(br#"{"jsonrpc":"2.0","id":{"a":1},"method":"x","params":{"#).0, None);
    }
}

/// Every frame of every recorded fixture (`fixtures/*/*/trace.jsonl`, both ways), in the order recorded: for
/// the tests that check a fast read against the parsed frame.
#[cfg(test)]
pub(crate) fn recorded_lines() -> Vec<Vec<u8>> {
    #[derive(serde::Deserialize)]
    struct Record<'a> {
        #[serde(borrow)]
        frame: Option<&'a serde_json::value::RawValue>,
    }
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures");
    let mut traces = Vec::new();
    for agent in std::fs::read_dir(&root).expect("fixtures").flatten() {
        for case in std::fs::read_dir(agent.path()).into_iter().flatten().flatten() {
            let trace = case.path().join("trace.jsonl");
            if trace.is_file() {
                traces.push(trace);
            }
        }
    }
    traces.sort();
    let mut lines = Vec::new();
    for trace in traces {
        let text = std::fs::read_to_string(&trace).expect("a trace");
        for line in text.lines() {
            if let Ok(Record { frame: Some(frame) }) = serde_json::from_str::<Record>(line) {
                lines.push(frame.get().as_bytes().to_vec());
            }
        }
    }
    lines
}

/// [`recorded_lines`] and [`hostile_lines`], then a notification `method` of session `s` for each of `updates`
/// (its `params.update`): the lines a test of an update read where it lies reads both ways.
#[cfg(test)]
pub(crate) fn lines_and_updates(method: &str, updates: &[&str]) -> Vec<Vec<u8>> {
    let mut lines = recorded_lines();
    lines.extend(hostile_lines());
    for update in updates {
        let line = format!(r#"{{"jsonrpc":"2.0","method":"{method}","params":{{"sessionId":"s","update":{update}}}}}"#);
        lines.push(line.into_bytes());
    }
    lines
}

/// Lines a hostile peer sends: the scan's corpus (cut lines, bad escapes, invalid UTF-8), numbers beyond
/// f64, nesting at and past the bound, lone surrogates in every field a layer reads, keys twice or escaped,
/// and frames whose update or `_meta` is at the length a frame keeps the place of (and one byte past it).
#[cfg(test)]
pub(crate) fn hostile_lines() -> Vec<Vec<u8>> {
    let mut lines = scan::corpus();
    let update = |params: &str| format!(r#"{{"jsonrpc":"2.0","method":"session/update","params":{params}}}"#);
    for params in [
        r#"{"sessionId":"s","update":{"sessionUpdate":"usage_update","used":1e400,"size":-1},"_meta":{"streamStartMs":1e400,"turnStartMs":"x","agentTimestampMs":1.5}}"#,
        r#"{"sessionId":"s\ud800","update":{"sessionUpdate":"agent_message_chunk\udfff"},"_meta":{"str\u0065amStartMs":5,"agentTimestampMs":7}}"#,
        r#"{"_meta":{"streamStartMs":1,"streamStartMs":2},"sessionId":"s","sessionId":"t","update":{"sessionUpdate":"a"},"update":{"sessionUpdate":"b"}}"#,
        r#"{"_meta":"no","sessionId":7,"update":[{"sessionUpdate":"x"}]}"#,
        r#"{"sessionId":"s","update":{"sessionUpdate":"tool_call","_meta":{"streamStartMs":3}},"_meta":{}}"#,
        r#" { "sessionId" : "s" , "_meta" : { "streamStartMs" : 18446744073709551616 , "turnStartMs" : 0 } } "#,
    ] {
        lines.push(update(params).into_bytes());
    }
    let depth = crate::json::MAX_DEPTH;
    for deep in [depth - 2, depth + 1] {
        let nest = format!("{}{}", "[".repeat(deep), "]".repeat(deep));
        lines.push(
            update(&format!(r#"{{"sessionId":"s","_meta":{{"a":{nest}}},"update":{{"x":{nest}}}}}"#)).into_bytes(),
        );
    }
    for len in [u16::MAX as usize - 1, u16::MAX as usize, u16::MAX as usize + 1] {
        let object = |text: &str| format!(r#"{{"sessionUpdate":"agent_message_chunk","text":"{text}"}}"#);
        let text = "x".repeat(len - object("").len());
        lines.push(
            update(&format!(r#"{{"sessionId":"s","update":{},"_meta":{{"streamStartMs":9}}}}"#, object(&text)))
                .into_bytes(),
        );
        lines.push(update(&format!(r#"{{"sessionId":"s","_meta":{},"update":{{}}}}"#, object(&text))).into_bytes());
    }
    lines
}

//! The one pass over every line a peer sends: JSON grammar, UTF-8, nesting and the envelope's fields at once.
//!
//! Every line is checked to be one JSON text before it is passed on (bad input is answered or dropped, never
//! passed on broken), and most lines are read by no layer: this check is what nearly every frame costs. It
//! walks the line once without recursion (a bit per open array or object, at most [`MAX_DEPTH`]), strings
//! eight bytes at a time, and keeps only where the envelope's fields are: `jsonrpc`, `id`, `method`,
//! `result`, `error`, `params.sessionId`, `params._meta` and `params.update.sessionUpdate`. It accepts what serde_json accepts (numbers of
//! any size, nesting up to the bound) and, as JSON's grammar does, lone UTF-16 surrogate escapes (noted, as is
//! whether any string holds a `\u` escape: [`Escapes`]).

use crate::json::MAX_DEPTH;

/// Where a string's text is: the bytes between its quotes, and whether it holds an escape. (Places in a line
/// are 32 bits: the scan refuses a line of 4 GiB or more, [`LONGEST`], and an [`Envelope`] is then small
/// enough to be copied in a few moves, as the skeleton check does for every line.)
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Str {
    pub start: u32,
    pub end: u32,
    pub escaped: bool,
}

/// The byte range of a JSON text in a line, as 32-bit places (see [`Str`]).
pub type Span = (u32, u32);

/// The longest line the scan reads (4 GiB less a byte): every place in it fits 32 bits.
pub const LONGEST: usize = u32::MAX as usize;

/// A line longer than [`LONGEST`] is refused as that, before a byte of it is read.
fn longest(line: &[u8]) -> Result<(), Error> {
    match line.len() > LONGEST {
        true => Err(Error::Syntax("the line goes on past the longest one read (4 GiB)", LONGEST)),
        false => Ok(()),
    }
}

/// `start..end` of a line the scan reads (no longer than [`LONGEST`]), as 32-bit places.
#[inline(always)]
pub(crate) fn span(start: usize, end: usize) -> Span {
    (start as u32, end as u32)
}

/// A [`Span`] as a range of the line.
#[inline(always)]
pub fn range((start, end): Span) -> std::ops::Range<usize> {
    start as usize..end as usize
}

impl Str {
    /// The string whose text is `line[start..end]` of a line the scan reads.
    #[inline(always)]
    pub(crate) fn new(start: usize, end: usize, escaped: bool) -> Str {
        Str { start: start as u32, end: end as u32, escaped }
    }

    /// The bytes of its text (between its quotes).
    #[inline(always)]
    pub fn range(&self) -> std::ops::Range<usize> {
        range((self.start, self.end))
    }

    /// The string's value, unescaped when it has to be; `None` only for a lone surrogate escape (or bytes
    /// that are not UTF-8, which no line the scan accepted has).
    pub fn text<'a>(&self, line: &'a [u8]) -> Option<std::borrow::Cow<'a, str>> {
        let text = self.range();
        if self.escaped {
            let quoted = &line[text.start - 1..=text.end];
            serde_json::from_slice::<String>(quoted).ok().map(std::borrow::Cow::Owned)
        } else {
            std::str::from_utf8(&line[text]).ok().map(std::borrow::Cow::Borrowed)
        }
    }
}

/// What the line is at its top.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Top {
    Object,
    /// An array: a batch, or `[]`.
    Array {
        empty: bool,
    },
    /// A string, number or literal.
    #[default]
    Other,
}

/// The envelope of one valid JSON text.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Envelope {
    pub top: Top,
    pub jsonrpc: Option<Str>,
    /// The byte range of the id's JSON text.
    pub id: Option<Span>,
    pub method: Option<Str>,
    pub result: bool,
    pub error: bool,
    /// `params.update.sessionUpdate` when it is a string (for a repeated key, the last).
    pub update: Option<Str>,
    /// The byte range of `params.update` when it is an object (for a repeated key, the last): where a layer
    /// reads an update's fields without going over the rest of the frame.
    pub update_object: Option<Span>,
    /// `params.sessionId` when it is a string (for a repeated key, the last): the session most frames are
    /// about, for a layer to look up without parsing the frame.
    pub session: Option<Str>,
    /// The byte range of `params._meta` when it is an object (for a repeated key, the last): where the
    /// stamps some agents put on every frame are, for a layer to read without parsing the frame.
    pub meta: Option<Span>,
    /// `jsonrpc` or `method` is there but not a string.
    pub mistyped: bool,
    /// One of the envelope's keys appears twice.
    pub duplicate: bool,
    /// What the escapes of the line's strings are.
    pub escapes: Escapes,
}

// The skeleton check copies a kept line's envelope for every line it matches: at most 128 bytes, the copy is a
// few moves, not a call to `memcpy` (92 bytes; with 64-bit places it was 176).
const _: () = assert!(std::mem::size_of::<Envelope>() <= 128);

/// What the escapes of a line's strings (keys and values) are, noted where each is checked.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Escapes {
    /// A string holds a `\u` escape: the one escape that may spell any character, so a key or a text a layer
    /// looks for as it is written may be spelled with one. False: every character of the line is as written
    /// but for quotes, backslashes, slashes and control characters.
    pub unicode: bool,
    /// A string holds a UTF-16 surrogate escape without its other half (which serde_json does not read).
    pub lone_surrogate: bool,
}

/// Why a line is not one JSON text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Error {
    /// Not JSON: what was wrong, and at which byte.
    Syntax(&'static str, usize),
    /// Nested deeper than [`MAX_DEPTH`]; at this byte the limit was passed.
    TooDeep(usize),
}

impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Error::Syntax(what, at) => write!(f, "{what} at byte {at}"),
            Error::TooDeep(_) => write!(f, "nested deeper than {MAX_DEPTH} levels"),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Field {
    Jsonrpc = 0,
    Id = 1,
    Method = 2,
    Result = 3,
    Error = 4,
    Params = 5,
    Other = 6,
}

/// A key of at most 16 bytes as two little-endian words and its length (longer keys are no name looked for).
#[derive(Clone, Copy, PartialEq, Eq)]
struct Packed(u64, u64, usize);

const fn pack(name: &[u8]) -> Packed {
    let (mut lo, mut hi, mut i) = (0u64, 0u64, 0);
    while i < name.len() {
        if i < 8 {
            lo |= (name[i] as u64) << (8 * i);
        } else {
            hi |= (name[i] as u64) << (8 * (i - 8));
        }
        i += 1;
    }
    Packed(lo, hi, name.len())
}

const JSONRPC: Packed = pack(b"jsonrpc");
const ID: Packed = pack(b"id");
const METHOD: Packed = pack(b"method");
const RESULT: Packed = pack(b"result");
const ERROR: Packed = pack(b"error");
const PARAMS: Packed = pack(b"params");
const UPDATE: Packed = pack(b"update");
const SESSION_UPDATE: Packed = pack(b"sessionUpdate");
const SESSION_ID: Packed = pack(b"sessionId");
const META: Packed = pack(b"_meta");

/// The raw bytes `line[start..end]` packed as [`pack`] does, cheaply: one or two word loads where the line
/// has the room; `None` for a key longer than 16 bytes.
#[inline(always)]
fn packed(line: &[u8], start: usize, end: usize) -> Option<Packed> {
    let len = end - start;
    if len > 16 {
        return None;
    }
    let high = if len > 8 { word(line, start + 8, len - 8) } else { 0 };
    Some(Packed(word(line, start, len.min(8)), high, len))
}

/// The `n` (at most 8) bytes at `at` as a little-endian word, one load where the line has eight bytes there.
#[inline(always)]
fn word(line: &[u8], at: usize, n: usize) -> u64 {
    let mask = if n >= 8 { u64::MAX } else { (1u64 << (8 * n)) - 1 };
    match line.get(at..at + 8) {
        Some(chunk) => u64::from_le_bytes(chunk.try_into().unwrap_or_default()) & mask,
        None => line[at..at + n].iter().rev().fold(0u64, |w, &c| w << 8 | u64::from(c)),
    }
}

/// A key as [`Packed`], unescaped first when it has an escape.
#[inline(always)]
fn key_of(line: &[u8], key: &Str) -> Option<Packed> {
    if !key.escaped {
        let text = key.range();
        return packed(line, text.start, text.end);
    }
    let text = key.text(line)?;
    let t = text.as_bytes();
    (t.len() <= 16).then(|| pack_runtime(t))
}

fn pack_runtime(t: &[u8]) -> Packed {
    let mut p = Packed(0, 0, t.len());
    for (i, &c) in t.iter().enumerate() {
        if i < 8 {
            p.0 |= u64::from(c) << (8 * i);
        } else {
            p.1 |= u64::from(c) << (8 * (i - 8));
        }
    }
    p
}

/// Why the scan stopped, as a short code (kept small: it travels in registers); see [`WHY`].
type Bad = u8;

const WHY: [&str; 11] = [
    "the text ends where a value should be",
    "not a JSON value",
    "expected a comma or the end of an array or object",
    "the text ends inside an array or object",
    "text after the JSON value",
    "expected a string key",
    "expected a colon after a key",
    "a string is not closed",
    "a control character in a string",
    "a bad escape in a string",
    "a bad number",
];
const END_BEFORE_VALUE: Bad = 0;
const NOT_A_VALUE: Bad = 1;
const NO_COMMA: Bad = 2;
const END_INSIDE: Bad = 3;
const TRAILING: Bad = 4;
const NO_KEY: Bad = 5;
const NO_COLON: Bad = 6;
const UNCLOSED: Bad = 7;
const CONTROL: Bad = 8;
const ESCAPE: Bad = 9;
const NUMBER: Bad = 10;
/// Not a syntax error: the nesting bound.
const DEEP: Bad = 255;

mod exact;
mod fast;
mod index;
mod skeleton;
pub use skeleton::SHAPES;

/// Checks that `line` is one JSON text (UTF-8, at most [`MAX_DEPTH`] deep) and reads its envelope: for a
/// line that is no part of a stream (one the shim built), so nothing is kept for a next line, and a line of
/// up to 4 KiB takes no allocation.
pub fn scan(line: &[u8]) -> Result<Envelope, Error> {
    longest(line)?;
    let blocks = line.len().div_ceil(64);
    let (mut small, mut large) = ([0u64; 64], Vec::new());
    let bits = match small.get_mut(..blocks) {
        Some(bits) => bits,
        None => {
            large.resize(blocks, 0);
            &mut large[..]
        }
    };
    let ascii = index::Classify::best().run(line, bits);
    match fast::walk(line, bits, None) {
        Some(env) if ascii || simdutf8::basic::from_utf8(line).is_ok() => Ok(env),
        _ => exact::scan(line),
    }
}

/// A buffer of bits grown past this (for a line of more than 256 KiB) is let go after the line.
const BITS_KEPT: usize = 4096;

/// [`scan`] for the lines of one stream. The instruction set is chosen once (`index::Classify::best`), the
/// buffers of a line's bits and values kept for the next, and the last lines of other shapes the walk found
/// valid are kept as `skeleton::Skeletons`: a line that is one of them with other values (the next chunk of
/// a stream, whatever its text, ids and times; the next usage update between them) is checked against it
/// instead of walked. The same result as a walk, for every line
/// (the unit tests compare the two).
#[derive(Debug)]
pub struct Scanner {
    classify: index::Classify,
    bits: Vec<u64>,
    holes: Vec<fast::Hole>,
    skeletons: skeleton::Skeletons,
    /// The envelope of the line checked last (a reference to it is what [`Scanner::checked`] returns: the
    /// envelope is too large to move cheaply).
    env: Envelope,
    /// The shape of the line checked last ([`Scanner::shape`]).
    shape: Option<u64>,
    /// Lines checked against the skeleton of the one before (the tests see that it is used).
    #[cfg(test)]
    by_skeleton: usize,
}

impl Default for Scanner {
    fn default() -> Scanner {
        Scanner {
            classify: index::Classify::best(),
            bits: Vec::new(),
            holes: Vec::new(),
            skeletons: Default::default(),
            env: Envelope::default(),
            shape: None,
            #[cfg(test)]
            by_skeleton: 0,
        }
    }
}

impl Scanner {
    /// Checks that `line` is one JSON text (UTF-8, at most [`MAX_DEPTH`] deep) and reads its envelope.
    pub fn checked(&mut self, line: &[u8]) -> Result<&Envelope, Error> {
        self.check(line)?;
        Ok(&self.env)
    }

    /// [`Scanner::checked`], the envelope left for [`Scanner::envelope`].
    pub fn check(&mut self, line: &[u8]) -> Result<(), Error> {
        if let Err(e) = longest(line) {
            self.shape = None;
            return Err(e);
        }
        if !self.run(line) {
            self.shape = None;
            // Why not: the exact walk says (and has the last word).
            self.env = exact::scan(line)?;
        }
        Ok(())
    }

    /// The envelope of the line [`Scanner::check`] found valid last.
    pub fn envelope(&self) -> &Envelope {
        &self.env
    }

    /// The shape of the line checked last, when it has one: lines of one shape have the same bytes but in
    /// their values, and the same envelope but for where its strings are, the id's value and
    /// [`Envelope::escapes`] (so what a reader makes of the envelope's `jsonrpc`, `method` and
    /// `sessionUpdate` holds for every line of the shape). A new shape has another number.
    pub fn shape(&self) -> Option<u64> {
        self.shape
    }

    /// [`Scanner::checked`] by the fast walk alone: `None` for a line it refuses.
    fn fast(&mut self, line: &[u8]) -> Option<Envelope> {
        self.run(line).then_some(self.env)
    }

    /// [`Scanner::fast`] with the envelope left in `self.env`: false for a line the fast walk refuses.
    fn run(&mut self, line: &[u8]) -> bool {
        let blocks = line.len().div_ceil(64);
        if self.bits.len() < blocks {
            self.bits.resize(blocks, 0);
        }
        let ascii = self.classify.run(line, &mut self.bits[..blocks]);
        let utf8 = |line| ascii || simdutf8::basic::from_utf8(line).is_ok();
        let bits = &self.bits[..blocks];
        let walked = if let Some(shape) = self.skeletons.check(line, bits, &mut self.holes, &mut self.env) {
            #[cfg(test)]
            {
                self.by_skeleton += 1;
            }
            self.shape = Some(shape);
            None
        } else if line.len() > skeleton::KEPT {
            Some(fast::walk(line, bits, None))
        } else {
            self.holes.clear();
            Some(fast::walk(line, bits, Some(&mut self.holes)))
        };
        let valid = match walked {
            None => utf8(line),
            Some(Some(env)) if utf8(line) => {
                self.env = env;
                // (A longer line is not kept, and leaves the skeletons as they were.)
                self.shape = match line.len() <= skeleton::KEPT {
                    true => self.skeletons.keep(line, &self.holes, &self.env),
                    false => None,
                };
                true
            }
            Some(_) => {
                self.shape = None;
                false
            }
        };
        if self.bits.len() > BITS_KEPT {
            self.bits = Vec::new();
        }
        if self.holes.capacity() > BITS_KEPT {
            self.holes = Vec::new();
        }
        valid
    }
}

/// For the fuzz target (`fuzz/fuzz_targets/scan.rs`): panics unless the fast walk (each instruction set this
/// CPU has, from the start and through one stream's scanner after each line before it) reads every line as
/// the exact walk does.
#[doc(hidden)]
pub fn check_against_exact(lines: &[&[u8]]) {
    for (name, classify) in index::Classify::all() {
        let mut stream = Scanner { classify, ..Scanner::default() };
        for line in lines {
            let exact = exact::scan(line).ok();
            let fresh = Scanner { classify, ..Scanner::default() }.fast(line);
            let streamed = stream.fast(line);
            assert!(
                fresh == exact && streamed == exact,
                "{name}: the fast walk reads {:?} as {fresh:?} (in a stream {streamed:?}), the exact walk as {exact:?}",
                String::from_utf8_lossy(line)
            );
        }
    }
}

/// Lines a stream may send after one another, good and bad in every way the walk knows (for the tests of
/// what reads frames with a scanner).
#[cfg(test)]
pub(crate) fn corpus() -> Vec<Vec<u8>> {
    tests::corpus()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Value;

    fn valid(text: &[u8]) -> bool {
        scan(text).is_ok()
    }

    #[test]
    fn accepts_what_serde_json_accepts_and_refuses_the_rest() {
        for good in [
            &br#"{"a":[1,-0,0.5,1e400,-2E-7,3.0e+2,true,false,null,"x\"\\\/\b\f\n\r\t\u00e9\ud83d\ude00",{}],"b":{}}"#
                [..],
            b" [ ] ",
            b"\"\xe4\xbd\xa0\xe5\xa5\xbd\"",
            b"0",
            b"{\"\xe4\xbd\xa0\":\"\xf0\x9f\x98\x80 and a long string of more than eight bytes\"}",
            b"[\"\\\\\",\"\\\\\\\"\"]",
        ] {
            assert!(valid(good), "{}", String::from_utf8_lossy(good));
            assert!(serde_json::from_slice::<Value>(good).is_ok());
        }
        for bad in [
            &b""[..],
            b" ",
            b"{",
            b"[1,]",
            b"[1 2]",
            b"{\"a\" 1}",
            b"{\"a\":1,}",
            b"{1:2}",
            b"01",
            b"1.",
            b"-",
            b".5",
            b"1e",
            b"+1",
            b"tru",
            b"nul",
            b"\"abc",
            b"\"a\tb\"",
            b"\"\\x\"",
            b"\"\\u12G4\"",
            b"\"\xff\"",
            b"\"\xc0\xaf\"",
            b"\"\xed\xa0\x80\"",
            b"[1]]",
            b"{}{}",
            b"[\"]",
            b"{\"a\":1]",
            b"[1}",
            b"\x0b1",
        ] {
            assert!(!valid(bad), "{}", String::from_utf8_lossy(bad));
            assert!(serde_json::from_slice::<Value>(bad).is_err(), "{}", String::from_utf8_lossy(bad));
        }
    }

    #[test]
    fn finds_specials_at_every_offset() {
        for at in 0..90 {
            for c in [b'"', b'\\', b'\n', 0x1f] {
                let mut s = vec![b'x'; 100];
                s[at] = c;
                assert_eq!(exact::special(&s, 0), Some(at));
                s[at] = 0x80;
                assert_eq!(exact::special(&s, 0), None);
            }
        }
    }

    /// A line longer than the longest one read ([`LONGEST`]: its places would not fit 32 bits) is refused as
    /// that by both ways in, before a byte of it is read (the zeroed buffer's pages are never touched).
    #[test]
    fn a_line_past_the_longest_one_read_is_refused_before_it_is_read() {
        let line = vec![0u8; LONGEST + 1];
        let refused = Error::Syntax("the line goes on past the longest one read (4 GiB)", LONGEST);
        assert_eq!(scan(&line), Err(refused));
        let mut scanner = Scanner::default();
        assert!(scanner.check(br#"{"jsonrpc":"2.0","method":"m"}"#).is_ok());
        assert_eq!(scanner.check(&line), Err(refused));
        assert_eq!(scanner.shape(), None);
    }

    #[test]
    fn notes_lone_surrogates() {
        for (text, lone) in [
            (r#""\ud800""#, true),
            (r#""\udc00x""#, true),
            (r#""\ud800\u0041""#, true),
            (r#""\ud83d\ude00""#, false),
            (r#""\u0041""#, false),
        ] {
            assert_eq!(scan(text.as_bytes()).unwrap().escapes.lone_surrogate, lone, "{text}");
        }
    }

    /// A `\u` escape is noted wherever it is (a key, a value, a text with escapes of one character before it in
    /// its block of 64 bytes), and nothing else is: a backslash escaped before a `u` is no `\u` escape.
    #[test]
    fn notes_unicode_escapes() {
        let after_short = format!(r#"["{}\u00e9"]"#, r#"\n\""#.repeat(20));
        let short_only = format!(r#"["{}u00e9"]"#, r"\n\\".repeat(20));
        for (text, unicode) in [
            (r#""\u00e9""#, true),
            (r#"{"k\u0065y":1}"#, true),
            (r#"["a\ud83d\ude00"]"#, true),
            (r#"{"jsonrpc":"2.0","method":"m","params":{"sessionId":"s\u0031"}}"#, true),
            (r#""\\\u0041""#, true),
            (&after_short, true),
            (r#""\\u0041""#, false),
            (r#""a\n\"\/\\\t\b\f\r""#, false),
            (r#"{"u":"été 你好","\\":"\\\\u"}"#, false),
            (&short_only, false),
        ] {
            assert_eq!(scan(text.as_bytes()).unwrap().escapes.unicode, unicode, "{text}");
            assert_eq!(exact::scan(text.as_bytes()).unwrap().escapes.unicode, unicode, "{text}");
        }
    }

    #[test]
    fn bounds_the_nesting() {
        let deep = "[".repeat(MAX_DEPTH) + &"]".repeat(MAX_DEPTH);
        assert!(valid(deep.as_bytes()));
        let over = "[".repeat(MAX_DEPTH + 1) + &"]".repeat(MAX_DEPTH + 1);
        assert_eq!(scan(over.as_bytes()), Err(Error::TooDeep(MAX_DEPTH)));
    }

    #[test]
    fn reads_the_envelope() {
        let line = br#"{"jsonrpc":"2.0","id": 7 ,"method":"m","params":{"update":{"x":{"sessionUpdate":"no"},"sessionUpdate":"yes"}}}"#;
        let env = scan(line).unwrap();
        assert_eq!(env.top, Top::Object);
        assert_eq!(&line[range(env.id.unwrap())], b"7");
        assert_eq!(env.method.unwrap().text(line).unwrap(), "m");
        assert_eq!(env.jsonrpc.unwrap().text(line).unwrap(), "2.0");
        assert_eq!(env.update.unwrap().text(line).unwrap(), "yes");
        assert!(!env.result && !env.error && !env.duplicate && !env.mistyped);
        let dup = scan(br#"{"jsonrpc":"2.0","id":1,"i\u0064":2,"result":{}}"#).unwrap();
        assert!(dup.duplicate && dup.result);
        assert!(scan(br#"{"jsonrpc":2,"method":"m"}"#).unwrap().mistyped);
        assert_eq!(scan(b"[]").unwrap().top, Top::Array { empty: true });
        assert_eq!(scan(b"[{}]").unwrap().top, Top::Array { empty: false });
    }

    /// Lines a stream may send after one another: streamed chunks (Grok's with `_meta` after `update`), and
    /// lines that share some of a chunk's start and then go wrong in every way the walk knows.
    pub(super) fn corpus() -> Vec<Vec<u8>> {
        let chunk = |text: &str| {
            format!(
                r#"{{"jsonrpc":"2.0","method":"session/update","params":{{"sessionId":"s","update":{{"sessionUpdate":"agent_message_chunk","content":{{"type":"text","text":"{text}"}}}}}}}}"#
            )
            .into_bytes()
        };
        let stamped = |text: &str, n: u64| {
            format!(
                r#"{{"jsonrpc":"2.0","method":"session/update","params":{{"sessionId":"01a2","update":{{"sessionUpdate":"agent_message_chunk","content":{{"type":"text","text":"{text}"}}}},"_meta":{{"eventId":"01a2-{n}","agentTimestampMs":{},"streamStartMs":1796186871643}}}}}}"#,
                1796186871643 + n
            )
            .into_bytes()
        };
        let mut lines = vec![
            chunk("hello"),
            chunk("你好, world \u{1F600}"),
            chunk(r#"a \"quoted\" \\ \u00e9 \ud800 word"#),
            chunk(""),
            stamped("one", 1),
            stamped("two and more", 2),
            stamped(r#"\ud83d\ude00 \n"#, 3),
            br#"{"jsonrpc":"2.0","id":3,"result":{"stopReason":"end_turn"}}"#.to_vec(),
            br#"{"jsonrpc":"2.0","method":"session/update","params":{"update":{"sessionUpdate":"x","sessionUpdate":"y"}}}"#
                .to_vec(),
            br#"{"jsonrpc":"2.0","id":"a","method":"m","params":[1,{"k":"v"},"s"]}"#.to_vec(),
            b"[\"a\",\"b\"]".to_vec(),
            b"\"just a string\"".to_vec(),
            br#"{"jsonrpc":"2.0","id":["a","b"],"method":"m"}"#.to_vec(),
            br#" { "jsonrpc" : "2.0" , "id" : 1e0 , "method" : "m" , "params" : { "update" : { "sessionUpdate" : "s" } } } "#
                .to_vec(),
            b"{\"jsonrpc\":\"2.0\",\"method\":\"session\\/update\",\"p\\u0061rams\":{\"upd\\u0061te\":{\"session\\u0055pdate\":\"k\"}}}"
                .to_vec(),
        ];
        let base = chunk("text of the chunk");
        let suffixes: [&[u8]; 22] = [
            b"more\"}}}}",
            b"x\",\"n\":1e400}}}}",
            b"x\",\"n\":-0.5E-999,\"m\":01}}}}",
            b"x\"]}",
            b"x\"}}},\"method\":\"again\"}",
            b"x\"},\"id\":1}",
            b"x\"},\"jsonrpc\":\"2.0\"}",
            b"\"}}}}",
            b"x\"}}}} ",
            b"x\"}}}}}",
            b"x\"}}}",
            b"x\"}}}},1",
            b"x\\ud800\"}}}}",
            b"x\\q\"}}}}",
            b"x\x01\"}}}}",
            b"\xff\xfe\"}}}}",
            b"\xe4\xbd\xa0\"}}}}",
            b"x\",\"id\":1}}}}",
            b"x\"},\"sessionUpdate\":\"late\"}},\"id\":9,\"result\":1}",
            b"x\",\"deep\":[[[[[[[[[[]]]]]]]]]]}}}}",
            b"x",
            b"",
        ];
        let cut = [base.clone(), stamped("cut", 4), lines[7].clone(), lines[9].clone(), lines[12].clone()];
        for line in &cut {
            for at in 0..=line.len() {
                for suffix in suffixes {
                    lines.push([&line[..at], suffix].concat());
                }
            }
        }
        // Each byte of a chunk and of a stamped chunk replaced by each byte the walk tells apart, and by bytes
        // that are no UTF-8 there (a lone continuation byte, a character's first byte without the rest).
        // Each follows the line it was made from (a stream's scanner checks it against that line's shape).
        for line in [chunk("你好 x"), stamped("a", 5)] {
            for at in 0..line.len() {
                for c in b"\"\\{}[]:, x0-e.\x01\x7f\x80\xbf\xe4\xed\xf0\xff" {
                    let mut bad = line.clone();
                    bad[at] = *c;
                    lines.push(line.clone());
                    lines.push(bad);
                }
            }
        }
        // Escapes and control characters at every offset of a string that crosses blocks of 64 bytes.
        for at in 0..140 {
            for escape in
                [&b"\\\""[..], b"\\\\", b"\\u00e9", b"\\ud800", b"\\ud83d\\ude00", b"\\udc00", b"\\x", b"\\u12", b"\n"]
            {
                let mut text = vec![b'a'; 140];
                text.splice(at..at, escape.iter().copied());
                lines.push([&br#"{"jsonrpc":"2.0","method":"m","params":{"text":""#[..], &text, b"\"}}"].concat());
            }
        }
        // Lone surrogates where the envelope is read.
        for (key, value) in [("jsonrpc", r#""\ud800""#), ("method", r#""m\udfff""#), ("id", r#""\ud800""#)] {
            lines.push(format!(r#"{{"jsonrpc":"2.0","{key}":{value},"method":"m"}}"#).into_bytes());
        }
        lines.push(br#"{"jsonrpc":"2.0","method":"m","params":{"update":{"sessionUpdate":"\udbff"}}}"#.to_vec());
        // Frames of one shape whose values take more or fewer bytes, with the envelope's strings before,
        // between and after them (a stream's scanner checks each against the one before).
        for shape in 0..6 {
            for text in ["a", "abc", "", "\\n\\u00e9", "あい"] {
                for n in [1, 1000, 7] {
                    lines.push(match shape {
                        0 => format!(r#"{{"params":{{"text":"{text}","n":{n},"update":{{"sessionUpdate":"k"}}}},"method":"m","id":{n},"jsonrpc":"2.0"}}"#),
                        1 => format!(r#"{{"jsonrpc":"2.0","id":"{text}","method":"m{text}","params":{{"n":{n},"update":{{"t":"{text}","sessionUpdate":"k"}}}}}}"#),
                        // `_meta` with no value that changes, after one that does; and other objects after it.
                        2 => format!(r#"{{"jsonrpc":"2.0","method":"m","params":{{"s":"{text}","_meta":{{"a":true,"b":{{}}}},"x":{{"y":[{{}}]}},"n":{n}}}}}"#),
                        3 => format!(r#"{{"jsonrpc":"2.0","method":"m","params":{{"_meta":{{"t":{n},"u":"{text}"}},"_meta":null,"x":{{}}}}}}"#),
                        // The session id, a hole of its own wherever it is.
                        4 => format!(r#"{{"jsonrpc":"2.0","method":"session/update","params":{{"sessionId":"{text}","update":{{"sessionUpdate":"k","n":{n}}},"sessionId":"s{n}"}},"id":{n}}}"#),
                        _ => format!(r#"{{"jsonrpc":"2.0","method":"m","params":{{"_meta":{{}},"update":{{"_meta":{{"t":"{text}"}}}},"_meta":{{"v":[{n}]}}}}}}"#),
                    }.into_bytes());
                }
            }
        }
        // Empty containers where the envelope is read: what follows them is not in `params` or `update`.
        for line in [
            r#"{"jsonrpc":"2.0","method":"m","params":{},"x":{"update":{"sessionUpdate":"no"}}}"#,
            r#"{"jsonrpc":"2.0","method":"m","params":[],"x":{"update":{"sessionUpdate":"no"}}}"#,
            r#"{"jsonrpc":"2.0","method":"m","params":{"update":{},"x":{"sessionUpdate":"no"}}}"#,
            r#"{"jsonrpc":"2.0","method":"m","params":{"update":[],"x":{"sessionUpdate":"no"}}}"#,
            r#"{"jsonrpc":"2.0","method":"m","params":{"update":{"a":{}},"x":{"sessionUpdate":"no"}}}"#,
            r#"{"jsonrpc":"2.0","method":"m","params":{"update":{"a":[]},"sessionUpdate":"no"}}"#,
            r#"{"jsonrpc":"2.0","id":{},"method":"m"}"#,
            r#"{"jsonrpc":"2.0","id":[ ],"method":"m"}"#,
        ] {
            lines.push(line.as_bytes().to_vec());
        }
        // `params.sessionId` where the envelope reads it, and where it does not.
        for line in [
            r#"{"jsonrpc":"2.0","method":"m","params":{"sessionId":"a","sessionId":"b"}}"#,
            r#"{"jsonrpc":"2.0","method":"m","params":{"sessionId":"a","sessionId":7}}"#,
            r#"{"jsonrpc":"2.0","method":"m","params":{"session\u0049d":"esc\u0061ped","update":{"sessionId":"no"}}}"#,
            r#"{"jsonrpc":"2.0","method":"m","sessionId":"top","params":{"x":{"sessionId":"deep"}}}"#,
            r#"{"jsonrpc":"2.0","method":"m","params":[{"sessionId":"in an array"}]}"#,
            r#"{"jsonrpc":"2.0","method":"m","params":{"sessionId":"\ud800"}}"#,
            r#"{"jsonrpc":"2.0","id":1,"result":{"sessionId":"a result's"}}"#,
        ] {
            lines.push(line.as_bytes().to_vec());
        }
        // Arrays of numbers (a tool's output as bytes), of every length and form, good and bad.
        for n in ["0", "7", "12", "123", "1234", "-1", "0.5", "1e2", "10E+1", "01", "00", "1.", "-", "0x1", "1 ", " 2"]
        {
            for (open, close) in [("[", "]"), ("{\"a\":", "}")] {
                lines.push(format!("{open}{n}{close}").into_bytes());
                lines.push(format!("[{n},{n},[{n}],{{\"k\":{n}}}]").into_bytes());
            }
            // Inside a container, after small integers read one after another (each form after a run of
            // them, and a run cut by it), and such a run ended by a brace or by nothing.
            lines.push(format!(r#"{{"a":[1,22,{n},255,{n}],"b":[[0,{n}],[{n},7]]}}"#).into_bytes());
            lines.push(format!(r#"{{"a":[1,2,3,{n}}}"#).into_bytes());
            lines.push(format!(r#"{{"a":[1,2,3,{n}}}]}}"#).into_bytes());
            lines.push(format!(r#"{{"a":[1,2,3,{n},"#).into_bytes());
            lines.push(format!(r#"[0,[9,8,{n},7]]"#).into_bytes());
        }
        // The same in lines longer than a skeleton keeps (their numbers are no holes: read sixteen bytes a
        // step), each form after runs of every length (so it falls at every place in a step).
        let run = |k: usize| -> String { (0..k).map(|j| ["1,", "22,", "0,", "255,", "9,"][j % 5]).collect() };
        let long = run(skeleton::KEPT * 2 / 5);
        // (And what a step must not take for a digit or a comma: nothing, the bytes beside `0` and `9`, a
        // byte whose low seven bits are a digit's.)
        for n in ["0", "7", "12", "123", "1234", "-1", "0.5", "1e2", "01", "00", "1 ", "", "/", ":", "\u{b1}", "+"] {
            for k in 0..9 {
                lines.push(format!(r#"{{"a":[{long}{}{n},{}7],"b":1}}"#, run(k), run(k)).into_bytes());
            }
        }
        lines.push(format!("[[{long}0,{}]]", "1".repeat(20)).into_bytes());
        lines.push(format!("[[{long}5,,6]]").into_bytes());
        lines.push(format!("[[{long}5]]").into_bytes());
        // Lines longer than a skeleton keeps.
        let long = format!("{{\"pad\":\"{}\",\"a\":{{\"b\":{{\"c\":{{\"text\":\"", "あ".repeat(skeleton::KEPT / 3));
        lines.push(format!("{long}a\"}}}}}}}}").into_bytes());
        lines.push(format!("{long}b\"}}}}}}}}").into_bytes());
        // Nesting at the bound and past it, of arrays and of objects, and around 64 levels (a word of bits).
        for depth in [MAX_DEPTH - 1, MAX_DEPTH, MAX_DEPTH + 1, 63, 64, 65] {
            lines.push(("[".repeat(depth) + "\"s\"" + &"]".repeat(depth)).into_bytes());
            lines.push(("{\"a\":".repeat(depth) + "\"s\"" + &"}".repeat(depth)).into_bytes());
        }
        lines.push(("[".repeat(70) + "\"t\"" + &"]".repeat(69)).into_bytes());
        // Huge lines: a long string (more blocks than a buffer of bits keeps), a long array, a long number.
        lines.push(chunk(&"x".repeat(300 << 10)));
        lines.push(chunk(&"é\\n".repeat(100 << 10)));
        lines.push(format!("[{}0]", "0,".repeat(50_000)).into_bytes());
        lines.push(format!("[1{}]", "0".repeat(100_000)).into_bytes());
        lines
    }

    /// A string's escapes are checked a block of 64 bytes at a time: runs of one to six backslashes, each
    /// followed by every kind of byte an escape may have after it (and by the string's end), at every place of
    /// two blocks, alone and among other escapes, read as the exact walk reads them.
    #[test]
    fn runs_of_escapes_at_every_place_of_a_block_read_as_the_exact_walk_reads_them() {
        let after = ["n", "\"", "/", "u00e9", "ud800", "ud83d\\ude00", "ud800x", "x", "\u{1}", "u12", "", "\"]"];
        let mut lines = Vec::new();
        for place in 0..140 {
            for run in 1..=6 {
                for next in after {
                    let text = format!("{}{}{next}", "a".repeat(place), "\\".repeat(run));
                    lines.push(format!("{{\"text\":\"{text} tail\"}}"));
                    lines.push(format!("{{\"text\":\"{text}\\t\\n\\\"{}\"}}", "\\n".repeat(place % 40)));
                    lines.push(format!("[\"{}{text}\u{2}\"]", "\\n".repeat(place / 2)));
                }
            }
        }
        let refs: Vec<&[u8]> = lines.iter().map(String::as_bytes).collect();
        check_against_exact(&refs);
        let valid = refs.iter().filter(|l| scan(l).is_ok()).count();
        assert!(valid > 5_000 && valid < refs.len() - 5_000, "good and bad escapes: {valid} of {} valid", refs.len());
    }

    #[test]
    fn the_fast_walk_reads_every_line_as_the_exact_walk_does() {
        let lines = corpus();
        let refs: Vec<&[u8]> = lines.iter().map(Vec::as_slice).collect();
        check_against_exact(&refs);
        // And so does a line that fails, through `checked`: its error is the exact walk's.
        for line in &lines {
            assert_eq!(scan(line), exact::scan(line));
        }
        assert!(lines.iter().filter(|l| scan(l).is_ok()).count() > 2_000, "valid lines are in the corpus too");
    }

    /// The envelope's `_meta` is what a parse finds at `params._meta` when that is an object, its `session`
    /// what it finds at `params.sessionId` when that is a string, its `update_object` `params.update` when
    /// that is an object.
    #[test]
    fn notes_where_params_meta_the_session_and_the_update_are() {
        let (mut meta, mut session, mut update) = (0, 0, 0);
        for line in corpus() {
            let Ok(env) = exact::scan(&line) else { continue };
            let Ok(value) = crate::json::from_slice::<Value>(&crate::json::mend_surrogates(&line)) else { continue };
            let want = value.pointer("/params/_meta").filter(|m| m.is_object());
            let got = env.meta.map(|meta| {
                serde_json::from_slice::<Value>(&crate::json::mend_surrogates(&line[range(meta)])).unwrap()
            });
            assert_eq!(got.as_ref(), want, "{}", String::from_utf8_lossy(&line));
            meta += usize::from(got.is_some());
            let want = value.pointer("/params/sessionId").and_then(Value::as_str);
            let got = env.session.map(|s| {
                let text = s.range();
                let quoted = crate::json::mend_surrogates(&line[text.start - 1..=text.end]);
                serde_json::from_slice::<String>(&quoted).unwrap()
            });
            assert_eq!(got.as_deref(), want, "{}", String::from_utf8_lossy(&line));
            session += usize::from(got.is_some());
            let want = value.pointer("/params/update").filter(|u| u.is_object());
            let got = env.update_object.map(|update| {
                serde_json::from_slice::<Value>(&crate::json::mend_surrogates(&line[range(update)])).unwrap()
            });
            assert_eq!(got.as_ref(), want, "{}", String::from_utf8_lossy(&line));
            update += usize::from(got.is_some());
        }
        assert!(meta > 100, "lines with a _meta are in the corpus ({meta})");
        assert!(session > 100, "lines with a session id are in the corpus ({session})");
        assert!(update > 1000, "lines with an update are in the corpus ({update})");
    }

    /// A stream that stays in one session checks its lines with the session id as fixed bytes (no hole), and
    /// still reads the session where it is in each line; a line of another session (written plainly or
    /// escaped, longer or shorter, before or after the update) is read as a walk reads it, and a stream that
    /// goes between sessions gets a hole for them.
    #[test]
    fn the_session_of_a_stream_moves_with_its_line_and_another_session_is_read_anew() {
        let line = |session: &str, text: &str, meta_first: bool| {
            let update = format!(
                r#""update":{{"sessionUpdate":"agent_message_chunk","content":{{"type":"text","text":"{text}"}}}}"#
            );
            let (a, b) = if meta_first {
                (r#""_meta":{"t":1}"#.to_owned(), update)
            } else {
                (update, r#""_meta":{"t":2}"#.to_owned())
            };
            format!(r#"{{"jsonrpc":"2.0","method":"session/update","params":{{{a},"sessionId":"{session}",{b}}}}}"#)
                .into_bytes()
        };
        let sessions =
            ["s-1", "s-1", "s-1", "s-22", "s-1", "s-1", r"s\u002d1", "s-1", "", "s-333", "s-1", "s-22", "s-1"];
        for meta_first in [false, true] {
            for (name, classify) in index::Classify::all() {
                let mut scanner = Scanner { classify, ..Scanner::default() };
                for (k, session) in sessions.iter().enumerate() {
                    let text = "x".repeat(k * 7 % 23);
                    let line = line(session, &text, meta_first);
                    let env = scanner.fast(&line);
                    assert_eq!(env, exact::scan(&line).ok(), "{name}: {}", String::from_utf8_lossy(&line));
                    let read = env.and_then(|e| e.session).map(|s| s.text(&line).map(|t| t.into_owned()));
                    assert_eq!(read, Some(Some(session.replace(r"\u002d", "-"))), "{name}: line {k}");
                }
                assert!(scanner.by_skeleton >= 8, "{name}: the skeleton was used ({} times)", scanner.by_skeleton);
            }
        }
        // A stream whose sessions take turns, two lines each (a subagent's chunks between its parent's): once
        // it has had two, the session id stays a hole, and only the first line and the first change are walked.
        for (name, classify) in index::Classify::all() {
            let mut scanner = Scanner { classify, ..Scanner::default() };
            let n = 40;
            for k in 0..n {
                let session = if k / 2 % 2 == 0 { "parent-0001" } else { "child-02" };
                let line = line(session, &"y".repeat(k % 5), false);
                assert_eq!(scanner.fast(&line), exact::scan(&line).ok(), "{name}: {}", String::from_utf8_lossy(&line));
            }
            assert_eq!(scanner.by_skeleton, n - 2, "{name}: lines checked against the skeleton");
        }
    }

    /// A stream whose frames take turns between templates (a chunk, a usage update, a tool call's update, a
    /// status, each with its own values every time) walks the first line of each and checks every other
    /// against its template's skeleton, reading each as a walk does; once more templates take turns than
    /// skeletons are kept, each line is walked (the one it had was let go for a newer one) and still read
    /// the same.
    #[test]
    fn a_stream_that_takes_turns_between_shapes_checks_each_against_its_own() {
        let template = |shape: usize, n: usize| {
            let update = match shape % 4 {
                0 => format!(r#""sessionUpdate":"agent_message_chunk","content":{{"type":"text","text":"w{n}"}}"#),
                1 => format!(r#""sessionUpdate":"usage_update","used":{n},"size":{}"#, 1000 + n),
                2 => format!(r#""sessionUpdate":"tool_call_update","toolCallId":"c{n}","status":"s{n}""#),
                _ => format!(r#""sessionUpdate":"session_info_update","_meta":{{"t":{n},"e":"e{n}"}}"#),
            };
            // Shapes past the first four: the same updates with a key of their own after them.
            let extra = if shape < 4 { String::new() } else { format!(r#","k{shape}":{n}"#) };
            format!(r#"{{"jsonrpc":"2.0","method":"session/update","params":{{"sessionId":"s","update":{{{update}{extra}}}}}}}"#)
                .into_bytes()
        };
        for (name, classify) in index::Classify::all() {
            for shapes in [4, skeleton::SHAPES, skeleton::SHAPES + 1] {
                let mut scanner = Scanner { classify, ..Scanner::default() };
                let rounds = 6;
                let mut numbers = std::collections::HashMap::new();
                for round in 0..rounds {
                    for shape in 0..shapes {
                        let line = template(shape, round * 7 + shape);
                        let env = scanner.fast(&line);
                        assert_eq!(env, exact::scan(&line).ok(), "{name}: {}", String::from_utf8_lossy(&line));
                        let number = scanner.shape().expect("a line of a shape");
                        // Lines of one template have one shape number while it is kept; of two, two.
                        if shapes <= skeleton::SHAPES {
                            assert_eq!(*numbers.entry(shape).or_insert(number), number, "{name}: shape {shape}");
                        }
                    }
                }
                // (Four take turns in every stream of a CLI's: their lines are checked whatever else is kept.)
                let checked = if shapes == 4 || shapes <= skeleton::SHAPES { (rounds - 1) * shapes } else { 0 };
                assert_eq!(scanner.by_skeleton, checked, "{name}: {shapes} shapes taking turns");
                let distinct: std::collections::HashSet<_> = numbers.values().collect();
                assert_eq!(distinct.len(), numbers.len(), "{name}: each template its own shape");
            }
        }
    }

    /// As many templates as are kept taking turns, each with a value that stays the same for two lines in a
    /// row (so a skeleton learns it as no hole) and then changes (a tool call's status): a line of a template
    /// whose skeleton had learnt another value is walked once, and its skeleton kept in the place of the one
    /// of its template (the status a hole from then on), not beside it; from then on each line is checked.
    #[test]
    fn a_template_whose_fixed_value_changes_keeps_one_skeleton() {
        let line = |shape: usize, n: usize, status: &str| {
            format!(
                r#"{{"jsonrpc":"2.0","method":"session/update","params":{{"sessionId":"s","update":{{"sessionUpdate":"tool_call_update","toolCallId":"c{n}","status":"{status}","k{shape}":{n}}}}}}}"#
            )
            .into_bytes()
        };
        for (name, classify) in index::Classify::all() {
            let mut scanner = Scanner { classify, ..Scanner::default() };
            let statuses = ["pending", "pending", "in_progress", "in_progress", "pending", "pending", "completed"];
            let mut walked = vec![0; statuses.len()];
            for (round, status) in statuses.iter().enumerate() {
                for shape in 0..skeleton::SHAPES {
                    let line = line(shape, round * 1000 + shape, status);
                    let before = scanner.by_skeleton;
                    assert_eq!(
                        scanner.fast(&line),
                        exact::scan(&line).ok(),
                        "{name}: {}",
                        String::from_utf8_lossy(&line)
                    );
                    walked[round] += usize::from(scanner.by_skeleton == before);
                }
            }
            // The first line of each template, and the first whose status is not the one learnt.
            let shapes = skeleton::SHAPES;
            assert_eq!(walked, [shapes, 0, shapes, 0, 0, 0, 0], "{name}: lines walked in each round");
        }
    }

    /// A peer sending long lines of ever other shapes, each all holes (an array of numbers as long as a
    /// skeleton keeps): the skeletons let go of the ones had longest ago, holding no more than their
    /// bound and the last one kept, and every line is still read as a walk reads it.
    #[test]
    fn the_skeletons_of_long_lines_of_many_shapes_hold_no_more_than_their_bound() {
        let mut scanner = Scanner::default();
        let mut most = 0;
        for k in 0..2 * skeleton::SHAPES {
            let line = format!(r#"{{"jsonrpc":"2.0","method":"m{k}","params":{{"b":[{}1]}}}}"#, "1,".repeat(8000));
            assert!(line.len() <= skeleton::KEPT);
            assert_eq!(scanner.fast(line.as_bytes()), exact::scan(line.as_bytes()).ok());
            assert!(scanner.shape().is_some(), "line {k} kept");
            let (held, one) = scanner.skeletons.held();
            assert!(held <= skeleton::HELD + one, "line {k}: {held} bytes held, {one} the most one holds");
            most = most.max(held);
        }
        assert!(most > skeleton::HELD / 2, "the bound was reached ({most})");
    }

    #[test]
    fn a_stream_scanner_reads_every_line_as_a_walk_from_the_start_would() {
        let lines = corpus();
        let fresh: Vec<_> = lines.iter().map(|l| exact::scan(l).ok()).collect();
        // Each line after each other line, through one scanner: what it remembered of the one before never
        // changes what it makes of the next.
        for (name, classify) in index::Classify::all() {
            let mut scanner = Scanner { classify, ..Scanner::default() };
            for (i, next) in lines.iter().enumerate() {
                // Every line after the one before it (in the corpus, mostly the same line with another
                // byte or cut elsewhere), every third after a sample of the others, and every line after
                // itself (twice: the second time it is checked against what the first left).
                let others = lines.iter().step_by(if i % 3 == 0 { 97 } else { usize::MAX });
                for before in lines[i.saturating_sub(1)..=i].iter().chain(others).chain([next, next]) {
                    let _ = scanner.fast(before);
                    let got = scanner.fast(next);
                    assert_eq!(
                        got,
                        fresh[i],
                        "{name}: {} after {}",
                        String::from_utf8_lossy(next),
                        String::from_utf8_lossy(before)
                    );
                }
            }
            assert!(scanner.by_skeleton > 10_000, "{name}: the skeleton was used ({} times)", scanner.by_skeleton);
            // Three lines in a row through a new scanner: the first is walked and kept, the second checked
            // against it (and the skeleton kept again from it, with holes only where the two differ), the
            // third checked against that.
            let mut learnt = 0;
            for i in 2..lines.len() {
                let mut scanner = Scanner { classify, ..Scanner::default() };
                for (k, line) in lines[i - 2..=i].iter().enumerate() {
                    assert_eq!(
                        scanner.fast(line),
                        fresh[i - 2 + k],
                        "{name}: {} after {}",
                        String::from_utf8_lossy(line),
                        String::from_utf8_lossy(&lines[i - 2])
                    );
                }
                learnt += usize::from(scanner.by_skeleton == 2);
            }
            assert!(learnt > 1_000, "{name}: a learnt skeleton checked the third line ({learnt} times)");
        }
    }
}

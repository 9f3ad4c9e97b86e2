//! The one pass over every line a peer sends: JSON grammar, UTF-8, nesting and the envelope's fields at once.
//!
//! Every line is checked to be one JSON text before it is passed on (bad input is answered or dropped, never
//! passed on broken), and most lines are read by no layer: this check is what nearly every frame costs. It
//! walks the line once without recursion (a bit per open array or object, at most [`MAX_DEPTH`]), strings
//! eight bytes at a time, and keeps only where the envelope's fields are: `jsonrpc`, `id`, `method`,
//! `result`, `error`, and `params.update.sessionUpdate`. It accepts what serde_json accepts (numbers of
//! any size, nesting up to the bound) and, as JSON's grammar does, lone UTF-16 surrogate escapes (noted).

use crate::json::MAX_DEPTH;

/// Where a string's text is: the bytes between its quotes, and whether it holds an escape.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Str {
    pub start: usize,
    pub end: usize,
    pub escaped: bool,
}

impl Str {
    /// The string's value, unescaped when it has to be; `None` only for a lone surrogate escape.
    /// [`Str::text`] on the line as text (as [`Scanner::checked`] hands it back): no second UTF-8 check.
    pub fn in_text<'a>(&self, line: &'a str) -> Option<std::borrow::Cow<'a, str>> {
        if self.escaped {
            serde_json::from_str::<String>(line.get(self.start - 1..=self.end)?).ok().map(std::borrow::Cow::Owned)
        } else {
            line.get(self.start..self.end).map(std::borrow::Cow::Borrowed)
        }
    }

    pub fn text<'a>(&self, line: &'a [u8]) -> Option<std::borrow::Cow<'a, str>> {
        if self.escaped {
            let quoted = &line[self.start - 1..=self.end];
            serde_json::from_slice::<String>(quoted).ok().map(std::borrow::Cow::Owned)
        } else {
            std::str::from_utf8(&line[self.start..self.end]).ok().map(std::borrow::Cow::Borrowed)
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
    pub id: Option<(usize, usize)>,
    pub method: Option<Str>,
    pub result: bool,
    pub error: bool,
    /// `params.update.sessionUpdate` when it is a string (for a repeated key, the last).
    pub update: Option<Str>,
    /// `jsonrpc` or `method` is there but not a string.
    pub mistyped: bool,
    /// One of the envelope's keys appears twice.
    pub duplicate: bool,
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
        return packed(line, key.start, key.end);
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

/// Checks that `line` is one JSON text (UTF-8, at most [`MAX_DEPTH`] deep) and reads its envelope.
pub fn scan(line: &[u8]) -> Result<Envelope, Error> {
    Scanner::default().checked(line).map(|(_, env)| env)
}

/// Where a walk stood at the opening quote of a line's last value, a string nested less than 64 deep: all
/// it needs to go on from there.
#[derive(Debug, Clone, Copy)]
struct Resume {
    /// The quote's byte; `usize::MAX` for no such point.
    i: usize,
    depth: usize,
    object: bool,
    /// The bits of the open containers (`objects[0]` of the walk: the rest are zero below 64).
    objects: u64,
    field: Field,
    seen: u8,
    id_start: usize,
    top_object: bool,
    params: bool,
    update: bool,
    update_key: bool,
    kind_key: bool,
    env: Envelope,
}

impl Resume {
    const NONE: Resume = Resume {
        i: usize::MAX,
        depth: 0,
        object: false,
        objects: 0,
        field: Field::Other,
        seen: 0,
        id_start: usize::MAX,
        top_object: false,
        params: false,
        update: false,
        update_key: false,
        kind_key: false,
        env: Envelope {
            top: Top::Other,
            jsonrpc: None,
            id: None,
            method: None,
            result: false,
            error: false,
            update: None,
            mistyped: false,
            duplicate: false,
            lone_surrogate: false,
        },
    };
}

/// Prefixes longer than this are not kept: the memo is for the short envelope before a chunk's text.
const MEMO_MAX: usize = 4096;

/// [`scan`] for the lines of one stream, remembering where the last full walk stood at its line's last
/// value, when that was a string. Streamed chunks repeat the line before them up to their text (`{"jsonrpc":"2.0","method":
/// "session/update","params":{"sessionId":…,"update":{"sessionUpdate":"agent_message_chunk","content":
/// {"type":"text","text":"`): when a line's bytes up to that point are the remembered ones, the walk over
/// them would be the same walk, so it goes on from the remembered state and walks only the rest (UTF-8 is
/// checked for the whole line, by SIMD: cheaper than checking the envelope's strings one by one). The same
/// result as a walk from the start, for every line (the unit tests compare the two).
#[derive(Debug)]
pub struct Scanner {
    /// The bytes up to and including the remembered quote.
    prefix: Vec<u8>,
    at: Resume,
}

impl Default for Scanner {
    fn default() -> Scanner {
        Scanner { prefix: Vec::new(), at: Resume::NONE }
    }
}

impl Scanner {
    /// Checks that `line` is one JSON text (UTF-8, at most [`MAX_DEPTH`] deep) and reads its envelope;
    /// hands back the line as text too.
    pub fn checked<'a>(&mut self, line: &'a [u8]) -> Result<(&'a str, Envelope), Error> {
        let text = match simdutf8::compat::from_utf8(line) {
            Ok(text) => text,
            Err(e) => return Err(Error::Syntax("invalid UTF-8", e.valid_up_to())),
        };
        let mut at = 0;
        let mut save = Resume::NONE;
        let resume = self.at.i;
        let walked = if resume < line.len() && line[..=resume] == self.prefix[..] {
            walk(line, Some(&self.at), &mut save, &mut at)
        } else {
            let walked = walk(line, None, &mut save, &mut at);
            if walked.is_ok() && save.i < MEMO_MAX {
                self.prefix.clear();
                self.prefix.extend_from_slice(&line[..=save.i]);
                self.at = save;
            }
            walked
        };
        match walked {
            Ok(env) => Ok((text, env)),
            Err(DEEP) => Err(Error::TooDeep(at)),
            Err(why) => Err(Error::Syntax(WHY[usize::from(why)], at)),
        }
    }
}

#[inline(always)]
fn skip_ws(b: &[u8], mut i: usize) -> usize {
    while let Some(b' ' | b'\t' | b'\n' | b'\r') = b.get(i) {
        i += 1;
    }
    i
}

/// The walk itself, from the start or from `from`; notes in `save` where it stood at the line's last value
/// when that is a string nested less than 64 deep. On failure `at` is where it stopped.
fn walk(b: &[u8], from: Option<&Resume>, save: &mut Resume, at: &mut usize) -> Result<Envelope, Bad> {
    let r = from.copied().unwrap_or(Resume::NONE);
    let mut env = r.env;
    let mut i = r.i;
    if from.is_none() {
        i = skip_ws(b, 0);
        env.top = match b.get(i) {
            Some(b'{') => Top::Object,
            Some(b'[') => Top::Array { empty: b.get(skip_ws(b, i + 1)) == Some(&b']') },
            _ => Top::Other,
        };
    }
    let top_object = from.map_or(env.top == Top::Object, |r| r.top_object);
    let mut depth = r.depth;
    // Whether the innermost open container is an object.
    let mut object = r.object;
    // One bit per open container, set for an object.
    let mut objects = [0u64; MAX_DEPTH / 64 + 1];
    objects[0] = r.objects;
    // The top object's key whose value comes next; where the id's value began.
    let mut field = r.field;
    let mut seen = r.seen;
    let mut id_start = r.id_start;
    // The container at depth 2 is `params`, an object; the one at depth 3 is its `update`, an object; the
    // last key read in `params` was `update`, the last in `update` `sessionUpdate`.
    let (mut params, mut update, mut update_key, mut kind_key) = (r.params, r.update, r.update_key, r.kind_key);

    macro_rules! fail {
        ($why:expr) => {{
            *at = i;
            return Err($why);
        }};
    }
    // An object's key and its colon, at `i`; notes the keys the envelope is made of.
    macro_rules! key {
        () => {{
            if b.get(i) != Some(&b'"') {
                fail!(NO_KEY);
            }
            let key = match string(b, i + 1, &mut env.lone_surrogate) {
                Ok(s) => s,
                Err(why) => fail!(why),
            };
            i = key.end + 1;
            // Only the keys of the top object, of `params` and of `update` are looked at, and only one
            // of a length some name has.
            let len = key.end - key.start;
            if depth == 1 && matches!(len, 2 | 5 | 6 | 7) || key.escaped && depth <= 3 {
                if depth == 1 {
                    field = match key_of(b, &key) {
                        Some(JSONRPC) => Field::Jsonrpc,
                        Some(ID) => Field::Id,
                        Some(METHOD) => Field::Method,
                        Some(RESULT) => Field::Result,
                        Some(ERROR) => Field::Error,
                        Some(PARAMS) => Field::Params,
                        _ => Field::Other,
                    };
                    if field != Field::Other {
                        let bit = 1u8 << (field as u8);
                        env.duplicate |= seen & bit != 0;
                        seen |= bit;
                        env.result |= field == Field::Result;
                        env.error |= field == Field::Error;
                    }
                }
            } else if depth == 1 {
                field = Field::Other;
            }
            if depth == 2 && params {
                update_key = (len == 6 || key.escaped) && key_of(b, &key) == Some(UPDATE);
                if update_key {
                    env.update = None;
                }
            } else if depth == 3 && update {
                kind_key = (len == 13 || key.escaped) && key_of(b, &key) == Some(SESSION_UPDATE);
                if kind_key {
                    env.update = None;
                }
            }
            if b.get(i) != Some(&b':') {
                i = skip_ws(b, i);
                if b.get(i) != Some(&b':') {
                    fail!(NO_COLON);
                }
            }
            i += 1;
        }};
    }

    'value: loop {
        if b.get(i).is_some_and(|&c| c <= b' ') {
            i = skip_ws(b, i);
        }
        let Some(&c) = b.get(i) else { fail!(END_BEFORE_VALUE) };
        if depth == 1 && top_object {
            match field {
                Field::Id => id_start = i,
                Field::Jsonrpc | Field::Method if c != b'"' => env.mistyped = true,
                _ => {}
            }
        }
        match c {
            b'{' | b'[' => {
                if depth == MAX_DEPTH {
                    fail!(DEEP);
                }
                object = c == b'{';
                if object {
                    if depth == 1 && field == Field::Params && top_object {
                        params = true;
                    } else if depth == 2 && params && update_key {
                        update = true;
                    }
                }
                depth += 1;
                let (word, bit) = (depth / 64, 1u64 << (depth % 64));
                if object {
                    objects[word] |= bit;
                } else {
                    objects[word] &= !bit;
                }
                i = skip_ws(b, i + 1);
                let close = if object { b'}' } else { b']' };
                if b.get(i) == Some(&close) {
                    i += 1;
                    match depth {
                        2 => params = false,
                        3 => update = false,
                        _ => {}
                    }
                    depth -= 1;
                    object = objects[depth / 64] & (1 << (depth % 64)) != 0;
                } else {
                    if object {
                        key!();
                    }
                    continue 'value;
                }
            }
            b'"' => {
                let lone_before = env.lone_surrogate;
                let s = match string(b, i + 1, &mut env.lone_surrogate) {
                    Ok(s) => s,
                    Err(why) => fail!(why),
                };
                // The line's last value, when it is a string (a chunk's text): where the next line may
                // go on from. The state is the one at the quote, before the string was read.
                if depth < 64 && from.is_none() && closers_only(b, s.end + 1) {
                    let mut env = env;
                    env.lone_surrogate = lone_before;
                    *save = Resume {
                        i,
                        depth,
                        object,
                        objects: objects[0],
                        field,
                        seen,
                        id_start,
                        top_object,
                        params,
                        update,
                        update_key,
                        kind_key,
                        env,
                    };
                }
                i = s.end + 1;
                if depth == 1 && top_object {
                    match field {
                        Field::Jsonrpc => env.jsonrpc = Some(s),
                        Field::Method => env.method = Some(s),
                        _ => {}
                    }
                } else if depth == 3 && update && kind_key {
                    env.update = Some(s);
                }
            }
            b'-' | b'0'..=b'9' => match number(b, i) {
                Some(end) => i = end,
                None => fail!(NUMBER),
            },
            b't' | b'f' | b'n' => {
                let word: &[u8] = match c {
                    b't' => b"true",
                    b'f' => b"false",
                    _ => b"null",
                };
                if !b[i..].starts_with(word) {
                    fail!(NOT_A_VALUE);
                }
                i += word.len();
            }
            _ => fail!(NOT_A_VALUE),
        }
        // After a value: a comma and the next, the end of containers, or the end of the text.
        loop {
            if depth == 1 && id_start != usize::MAX {
                env.id = Some((id_start, i));
                id_start = usize::MAX;
            }
            if depth == 0 {
                if skip_ws(b, i) != b.len() {
                    fail!(TRAILING);
                }
                return Ok(env);
            }
            let mut c = b.get(i).copied();
            if c.is_some_and(|c| c <= b' ') {
                i = skip_ws(b, i);
                c = b.get(i).copied();
            }
            match c {
                Some(b',') => {
                    i += 1;
                    if object {
                        if b.get(i).is_some_and(|&c| c <= b' ') {
                            i = skip_ws(b, i);
                        }
                        key!();
                    }
                    continue 'value;
                }
                Some(b'}') if object => {}
                Some(b']') if !object => {}
                Some(_) => fail!(NO_COMMA),
                None => fail!(END_INSIDE),
            }
            i += 1;
            match depth {
                2 => params = false,
                3 => update = false,
                _ => {}
            }
            depth -= 1;
            object = objects[depth / 64] & (1 << (depth % 64)) != 0;
        }
    }
}

/// Whether nothing but the ends of arrays and objects (and space) follows `at`: the value before it was the
/// line's last. Most values are followed by a comma, and this stops at the first byte.
#[inline(always)]
fn closers_only(b: &[u8], at: usize) -> bool {
    b.get(at..).is_some_and(|rest| rest.iter().all(|c| matches!(c, b'}' | b']' | b' ' | b'\t' | b'\n' | b'\r')))
}

/// The string whose text begins at `start` (after its opening quote).
#[inline(always)]
fn string(b: &[u8], start: usize, lone: &mut bool) -> Result<Str, Bad> {
    let mut i = start;
    let mut escaped = false;
    loop {
        i = match special(b, i) {
            Some(at) => at,
            None => return Err(UNCLOSED),
        };
        match b[i] {
            b'"' => return Ok(Str { start, end: i, escaped }),
            b'\\' => {
                escaped = true;
                i = escape(b, i, lone).ok_or(ESCAPE)?;
            }
            _ => return Err(CONTROL),
        }
    }
}

/// The escape whose backslash is at `at`; returns where the string goes on.
fn escape(b: &[u8], at: usize, lone: &mut bool) -> Option<usize> {
    match b.get(at + 1)? {
        b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't' => Some(at + 2),
        b'u' => {
            let unit = hex4(b, at + 2)?;
            match unit {
                0xD800..=0xDBFF => {
                    let low = match b.get(at + 6..at + 8) {
                        Some(b"\\u") => hex4(b, at + 8),
                        _ => None,
                    };
                    if low.is_some_and(|l| (0xDC00..=0xDFFF).contains(&l)) {
                        Some(at + 12)
                    } else {
                        *lone = true;
                        Some(at + 6)
                    }
                }
                0xDC00..=0xDFFF => {
                    *lone = true;
                    Some(at + 6)
                }
                _ => Some(at + 6),
            }
        }
        _ => None,
    }
}

/// Where the number at `start` ends; `None` when it is not one by JSON's grammar.
#[inline(always)]
fn number(b: &[u8], start: usize) -> Option<usize> {
    let digits = |mut i: usize| {
        while b.get(i).is_some_and(u8::is_ascii_digit) {
            i += 1;
        }
        i
    };
    let mut i = start + usize::from(b.get(start) == Some(&b'-'));
    i = match b.get(i) {
        Some(b'0') => i + 1,
        Some(b'1'..=b'9') => digits(i + 1),
        _ => return None,
    };
    if b.get(i) == Some(&b'.') {
        let end = digits(i + 1);
        if end == i + 1 {
            return None;
        }
        i = end;
    }
    if let Some(b'e' | b'E') = b.get(i) {
        i += 1;
        if let Some(b'+' | b'-') = b.get(i) {
            i += 1;
        }
        let end = digits(i);
        if end == i {
            return None;
        }
        i = end;
    }
    Some(i)
}

fn hex4(b: &[u8], at: usize) -> Option<u16> {
    let digits = b.get(at..at + 4)?;
    let mut n = 0u16;
    for &d in digits {
        n = n << 4 | u16::from((d as char).to_digit(16)? as u8);
    }
    Some(n)
}

/// The first `"`, `\` or control character at or after `i`. Short strings (most keys and values) are searched
/// eight bytes per step (each test finds the lowest byte that matches exactly; a false match can only sit
/// above a true one); past 16 bytes, a SIMD search for the quote or backslash and a vectorised check that no
/// control character lies before it.
#[inline(always)]
fn special(b: &[u8], mut i: usize) -> Option<usize> {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGH: u64 = 0x8080_8080_8080_8080;
    for _ in 0..2 {
        let Some(chunk) = b.get(i..i + 8) else {
            return b.get(i..)?.iter().position(|&c| c == b'"' || c == b'\\' || c < 0x20).map(|p| i + p);
        };
        let w = u64::from_le_bytes(chunk.try_into().unwrap_or_default());
        let zero = |x: u64| x.wrapping_sub(ONES) & !x & HIGH;
        let hits = zero(w ^ (ONES * u64::from(b'"')))
            | zero(w ^ (ONES * u64::from(b'\\')))
            | (w.wrapping_sub(ONES * 0x20) & !w & HIGH);
        if hits != 0 {
            return Some(i + (hits.trailing_zeros() / 8) as usize);
        }
        i += 8;
    }
    let found = memchr::memchr2(b'"', b'\\', &b[i..]).map(|p| i + p);
    let before = &b[i..found.unwrap_or(b.len())];
    let control = before.chunks(64).any(|c| c.iter().fold(false, |any, &x| any | (x < 0x20)));
    if control {
        return before.iter().position(|&c| c < 0x20).map(|p| i + p);
    }
    found
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
                assert_eq!(special(&s, 0), Some(at));
                s[at] = 0x80;
                assert_eq!(special(&s, 0), None);
            }
        }
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
            assert_eq!(scan(text.as_bytes()).unwrap().lone_surrogate, lone, "{text}");
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
        let (a, b) = env.id.unwrap();
        assert_eq!(&line[a..b], b"7");
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

    /// Lines a stream may send after one another: streamed chunks, and lines that share some of a chunk's
    /// start and then go wrong in every way the walk knows.
    fn corpus() -> Vec<Vec<u8>> {
        let chunk = |text: &str| {
            format!(
                r#"{{"jsonrpc":"2.0","method":"session/update","params":{{"sessionId":"s","update":{{"sessionUpdate":"agent_message_chunk","content":{{"type":"text","text":"{text}"}}}}}}}}"#
            )
            .into_bytes()
        };
        let mut lines = vec![
            chunk("hello"),
            chunk("你好, world \u{1F600}"),
            chunk(r#"a \"quoted\" \\ \u00e9 \ud800 word"#),
            chunk(""),
            br#"{"jsonrpc":"2.0","id":3,"result":{"stopReason":"end_turn"}}"#.to_vec(),
            br#"{"jsonrpc":"2.0","method":"session/update","params":{"update":{"sessionUpdate":"x","sessionUpdate":"y"}}}"#
                .to_vec(),
            br#"{"jsonrpc":"2.0","id":"a","method":"m","params":[1,{"k":"v"},"s"]}"#.to_vec(),
            b"[\"a\",\"b\"]".to_vec(),
            b"\"just a string\"".to_vec(),
            br#"{"jsonrpc":"2.0","id":["a","b"],"method":"m"}"#.to_vec(),
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
        for line in [base.clone(), lines[4].clone(), lines[6].clone(), lines[9].clone()] {
            for cut in 0..=line.len() {
                for suffix in suffixes {
                    lines.push([&line[..cut], suffix].concat());
                }
            }
        }
        // A prefix longer than the memo keeps, before a chunk's text.
        let long = format!("{{\"pad\":\"{}\",\"text\":\"", "あ".repeat(MEMO_MAX));
        lines.push(format!("{long}a\"}}").into_bytes());
        lines.push(format!("{long}b\"}}").into_bytes());
        let deep = "[".repeat(MAX_DEPTH) + "\"s\"" + &"]".repeat(MAX_DEPTH);
        lines.push(deep.clone().into_bytes());
        lines.push(("[".repeat(MAX_DEPTH + 1) + "\"s\"" + &"]".repeat(MAX_DEPTH + 1)).into_bytes());
        lines.push(("[".repeat(70) + "\"s\"" + &"]".repeat(70)).into_bytes());
        lines.push(("[".repeat(70) + "\"t\"" + &"]".repeat(69)).into_bytes());
        lines
    }

    #[test]
    fn a_stream_scanner_reads_every_line_as_a_walk_from_the_start_would() {
        let lines = corpus();
        let fresh: Vec<_> = lines.iter().map(|l| scan(l)).collect();
        // Each line after each other line, through one scanner: what it remembered of the one before never
        // changes what it makes of the next.
        let mut scanner = Scanner::default();
        let mut resumed = 0;
        for (i, next) in lines.iter().enumerate() {
            for before in lines.iter().step_by(61) {
                let _ = scanner.checked(before);
                let (at, prefix) = (scanner.at.i, scanner.prefix.clone());
                let got = scanner.checked(next).map(|(_, env)| env);
                resumed += usize::from(at < next.len() && next[..=at] == prefix[..]);
                assert_eq!(
                    got,
                    fresh[i],
                    "{} after {}",
                    String::from_utf8_lossy(next),
                    String::from_utf8_lossy(before)
                );
            }
        }
        assert!(resumed > 1_000, "the memo was used ({resumed} times)");
    }
}

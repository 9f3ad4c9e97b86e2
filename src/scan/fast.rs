//! The walk every line takes: the grammar and the envelope in one pass, a string found in one step from the
//! bits of its blocks ([`super::index`]), a number's digits eight at a time. It says only whether the line is
//! valid; why one is not, the exact walk says ([`super::exact`]).

use super::exact::{escape, skip_ws};
use super::*;

/// The string whose text begins at `start` (after its opening quote), found from the line's bits (see
/// [`super::index`]): where its closing quote is and whether it has an escape, checking that no control character is in it and that its escapes
/// are JSON's (noting a `\u` escape and a lone surrogate in `notes`).
#[inline(always)]
pub(super) fn string(b: &[u8], bits: &[u64], start: usize, notes: &mut Escapes) -> Option<(usize, bool)> {
    let (mut i, mut escaped) = (start, false);
    loop {
        let word = *bits.get(i / 64)?;
        let special = word >> (i % 64);
        if special == 0 {
            i = (i / 64 + 1) * 64;
            continue;
        }
        let at = i + special.trailing_zeros() as usize;
        match b[at] {
            b'"' => return Some((at, escaped)),
            b'\\' => {
                escaped = true;
                // The escapes of one character (a text's newlines and quotes: many in a file's content) all at
                // once where the rest of the block has three quotes, backslashes or control characters or more,
                // else in one step each; `\u` and what is no escape by the exact walk's rules.
                let rest = special >> (at - i);
                let second = rest & (rest - 1);
                let bulk = if second & second.wrapping_sub(1) != 0 { escapes(b, word, at) } else { None };
                i = match bulk {
                    Some(past) => past,
                    None => match b.get(at + 1) {
                        Some(&c) if SHORT_ESCAPE[usize::from(c)] => at + 2,
                        _ => escape(b, at, notes)?,
                    },
                };
            }
            _ => return None,
        }
    }
}

/// Where to go on from the backslash at `at`, which begins an escape, once every escape of one character from
/// there on in its 64-byte block is checked: the next quote or control character no backslash escapes (the
/// block's `special` bits, see [`super::index`]), the backslash of the next escape that is none of one
/// character (a `\u`, or no escape), the backslash of an escape whose character is in the next block, or the
/// block's end, whichever comes first. `None` where that is `at` itself, where the block does not lie whole in
/// the line, or off x86_64: the caller then takes the escape at `at` alone. Which bytes a backslash escapes is
/// told from the block's backslashes by [`crate::json::escaped_bits`] (`at` begins an escape, so no backslash
/// before it counts).
#[inline(always)]
fn escapes(b: &[u8], special: u64, at: usize) -> Option<usize> {
    #[cfg(target_arch = "x86_64")]
    {
        let base = at & !63;
        let block = b.get(base..base + 64)?;
        let from = !0u64 << (at - base);
        let backslashes = (0..4).fold(0u64, |m, k| {
            let sixteen = crate::json::sixteen_of(&block[16 * k..16 * k + 16], [b'\\']);
            m | u64::from(sixteen) << (16 * k)
        }) & from;
        let (escaped, carry) = crate::json::escaped_bits(backslashes, false);
        // A backslash in the block's last byte that begins an escape escapes a byte of the next block.
        let mut end = if carry { 63 } else { 64 };
        let stops = special & !backslashes & !escaped & from;
        if stops != 0 {
            end = end.min(stops.trailing_zeros() as usize);
        }
        let mut each = escaped & (!0u64).checked_shr(64 - end as u32).unwrap_or(0);
        while each != 0 {
            let k = each.trailing_zeros() as usize;
            if !SHORT_ESCAPE[usize::from(block[k])] {
                // Its backslash, for the one-escape path.
                end = k - 1;
                break;
            }
            each &= each - 1;
        }
        Some(base + end).filter(|&past| past > at)
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (b, special, at);
        None
    }
}

/// The bytes that make an escape of one character after a backslash: `"`, `\`, `/`, `b`, `f`, `n`, `r`, `t`.
static SHORT_ESCAPE: [bool; 256] = {
    let mut table = [false; 256];
    let mut k = 0;
    while k < 8 {
        table[b"\"\\/bfnrt"[k] as usize] = true;
        k += 1;
    }
    table
};

/// Where the run of ASCII digits at `i` ends, eight bytes per step.
#[inline(always)]
fn digits(b: &[u8], mut i: usize) -> usize {
    const ONES: u64 = 0x0101_0101_0101_0101;
    while let Some(eight) = b.get(i..i + 8) {
        // A digit's byte XOR 0x30 is at most 9: its high nibble is zero, and adding 6 keeps it so. A byte
        // that carries out of the addition is no digit itself, and a carry moves only to bytes above it.
        let t = u64::from_le_bytes(eight.try_into().unwrap_or_default()) ^ (ONES * 0x30);
        let other = (t | t.wrapping_add(ONES * 6)) & (ONES * 0xF0);
        if other != 0 {
            return i + (other.trailing_zeros() / 8) as usize;
        }
        i += 8;
    }
    while b.get(i).is_some_and(u8::is_ascii_digit) {
        i += 1;
    }
    i
}

/// Where the integer of at most three digits at `start` ends when a comma or a container's end follows it
/// (the elements of an array of bytes, small counts: a tool's output may be thousands of them); `None` for
/// anything else, which [`scalar`] reads.
#[inline(always)]
fn short_integer(b: &[u8], start: usize) -> Option<usize> {
    let mut end = start + 1;
    match *b.get(start)? {
        b'0' => {}
        b'1'..=b'9' => {
            while end < start + 3 && b.get(end).is_some_and(u8::is_ascii_digit) {
                end += 1;
            }
        }
        _ => return None,
    }
    matches!(b.get(end), Some(b',' | b']' | b'}')).then_some(end)
}

/// Past a run of integers in an array from the comma at `i`, sixteen bytes a step, for a line whose numbers
/// are no holes (a tool's output as bytes in a line too long to keep a skeleton of): where a comma the run
/// reaches is (`i` itself when the first sixteen bytes are not such a run). In a step every byte is a digit
/// or a comma (an ASCII byte: the line's UTF-8 is checked apart, but a run is whole by itself), no comma
/// follows another and no number after a comma starts with a zero and goes on; the number after the step's
/// last comma may go on past it, so the next step starts at that comma. Whatever is not such a run (a sign,
/// a fraction, the array's end) is left to the walk. By SSE2 on x86_64, by words of 128 bits elsewhere.
// A call of its own: inlined, it makes the walk's string loop slower (Kimi's recorded stream: +220 per frame).
#[inline(never)]
fn integer_run(b: &[u8], i: usize) -> usize {
    #[cfg(target_arch = "x86_64")]
    {
        integer_run_sse2(b, i)
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        integer_run_words(b, i)
    }
}

/// The rule of a step of [`integer_run`], from the marks of its sixteen bytes (`digit`, `comma`, `zero`: a
/// mark `unit` bits wide per byte, the step's first byte lowest; `all`, every byte marked): how many bytes
/// it goes, to its last comma; `None` where the run ends.
macro_rules! run_step {
    ($digit:expr, $comma:expr, $zero:expr, $all:expr, $unit:expr) => {{
        let (digit, comma, zero, all, unit) = ($digit, $comma, $zero, $all, $unit);
        // A byte's neighbours: `<< unit` moves each mark to the byte after it in the line, `>> unit` before.
        let leading_zero = zero & (comma << unit) & (digit >> unit);
        let first = all & !(all << unit);
        let run = digit | comma == all && comma & first != 0 && comma & (comma >> unit) == 0 && leading_zero == 0;
        // The last comma's byte: past the first, or no step.
        let last = (comma.leading_zeros() ^ (all.leading_zeros() + 16 * unit - 1)) / unit;
        (run && last > 0).then_some(last as usize)
    }};
}

#[cfg(target_arch = "x86_64")]
fn integer_run_sse2(b: &[u8], mut i: usize) -> usize {
    use std::arch::x86_64::*;
    while let Some(step) = b.get(i..i + 16) {
        // SAFETY: SSE2 is part of every x86_64 CPU; the load reads the sixteen bytes of `step`.
        let [digit, comma, zero] = unsafe {
            let v = _mm_loadu_si128(step.as_ptr().cast());
            // A digit less '0' is at most 9 (unsigned).
            let d = _mm_sub_epi8(v, _mm_set1_epi8(b'0' as i8));
            let digit = _mm_cmpeq_epi8(_mm_min_epu8(d, _mm_set1_epi8(9)), d);
            let comma = _mm_cmpeq_epi8(v, _mm_set1_epi8(b',' as i8));
            let zero = _mm_cmpeq_epi8(v, _mm_set1_epi8(b'0' as i8));
            [digit, comma, zero].map(|m| _mm_movemask_epi8(m) as u32)
        };
        match run_step!(digit, comma, zero, 0xFFFF_u32, 1) {
            Some(last) => i += last,
            None => break,
        }
    }
    i
}

/// [`integer_run`] by words of 128 bits (the marks are each byte's high bit; exact: no carry crosses a byte).
#[cfg_attr(target_arch = "x86_64", allow(dead_code))]
fn integer_run_words(b: &[u8], mut i: usize) -> usize {
    const ONES: u128 = 0x0101_0101_0101_0101_0101_0101_0101_0101;
    const HIGH: u128 = ONES * 0x80;
    const LOW: u128 = ONES * 0x7F;
    // The bytes of `w` that are `c`.
    let eq = |w: u128, c: u8| {
        let t = w ^ (ONES * u128::from(c));
        !(((t & LOW) + LOW) | t) & HIGH
    };
    while let Some(step) = b.get(i..i + 16) {
        let w = u128::from_le_bytes(step.try_into().unwrap_or_default());
        // Each byte's low seven bits with its high bit set: subtracting a byte's worth borrows from none.
        let x = (w & LOW) | HIGH;
        let digit = x.wrapping_sub(ONES * 0x30) & !x.wrapping_sub(ONES * 0x3A) & !w & HIGH;
        match run_step!(digit, eq(w, b','), eq(w, b'0'), HIGH, 8) {
            Some(last) => i += last,
            None => break,
        }
    }
    i
}

/// Where the number, `true`, `false` or `null` at `start` ends; `None` when there is none by JSON's grammar.
#[inline(never)]
fn scalar(b: &[u8], start: usize) -> Option<usize> {
    let word: &[u8] = match b[start] {
        b't' => b"true",
        b'f' => b"false",
        b'n' => b"null",
        _ => return number(b, start),
    };
    b[start..].starts_with(word).then_some(start + word.len())
}

/// Where the number at `start` ends; `None` when it is not one by JSON's grammar.
#[inline(always)]
pub(super) fn number(b: &[u8], start: usize) -> Option<usize> {
    let mut i = start + usize::from(b.get(start) == Some(&b'-'));
    i = match b.get(i) {
        Some(b'0') => i + 1,
        Some(b'1'..=b'9') => digits(b, i + 1),
        _ => return None,
    };
    if b.get(i) == Some(&b'.') {
        let end = digits(b, i + 1);
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
        let end = digits(b, i);
        if end == i {
            return None;
        }
        i = end;
    }
    Some(i)
}

/// Space between tokens (JSON's four), which agents seldom write: out of the walk's way.
#[inline(never)]
#[cold]
fn space(b: &[u8], i: usize) -> usize {
    skip_ws(b, i)
}

/// The `n` (at most 8) bytes at `at` as a little-endian word: one load where the line has eight bytes there
/// (a key is followed by at least its quote and a colon and a value).
#[inline(always)]
fn word(b: &[u8], at: usize, n: usize) -> u64 {
    let mask = u64::MAX >> (64 - 8 * n);
    match b.get(at..at + 8) {
        Some(eight) => u64::from_le_bytes(eight.try_into().unwrap_or_default()) & mask,
        None => b[at..at + n].iter().rev().fold(0, |w, &c| w << 8 | u64::from(c)),
    }
}

const fn name(text: &[u8]) -> u64 {
    pack(text).0
}

const ID_WORD: u64 = name(b"id");
const ERROR_WORD: u64 = name(b"error");
const METHOD_WORD: u64 = name(b"method");
const RESULT_WORD: u64 = name(b"result");
const PARAMS_WORD: u64 = name(b"params");
const JSONRPC_WORD: u64 = name(b"jsonrpc");
const UPDATE_WORD: u64 = name(b"update");
const META_WORD: u64 = name(b"_meta");
const SESSION_U_WORD: u64 = name(b"sessionU");
const SESSION_I_WORD: u64 = name(b"sessionI");
const PDATE_WORD: u64 = name(b"pdate");

/// The envelope as the walk reads it, as the exact walk does: the top object's key whose value comes next
/// (only an object at depth 1 has keys there, so it is the top), the keys seen, where the id's value began;
/// the container at depth 2 is `params`, an object, and the one at depth 3 its `update`, an object; the last
/// key read in `params` was `update`, the last in `update` `sessionUpdate`. Touched only at depth 3 and above.
#[derive(Debug, Clone, Copy)]
struct Reading {
    env: Envelope,
    field: Field,
    seen: u8,
    id_start: Option<usize>,
    params: bool,
    update: bool,
    update_key: bool,
    kind_key: bool,
    /// The last key read in `params` was `sessionId`.
    session_key: bool,
    /// Where the object at depth 3 that is `params.update` began.
    update_start: Option<usize>,
    /// The last key read in `params` was `_meta`; where the object at depth 3 that is its value began.
    meta_key: bool,
    meta_start: Option<usize>,
}

impl Reading {
    fn new() -> Reading {
        Reading {
            env: Envelope::default(),
            field: Field::Other,
            seen: 0,
            id_start: None,
            params: false,
            update: false,
            update_key: false,
            kind_key: false,
            session_key: false,
            update_start: None,
            meta_key: false,
            meta_start: None,
        }
    }

    /// The key at `start..end` of an object at `depth` (at most 3), without escapes (else [`Reading::escaped_key`]).
    #[inline(always)]
    fn key(&mut self, b: &[u8], depth: usize, start: usize, end: usize) {
        let len = end - start;
        match depth {
            1 => {
                let field = match len {
                    2 | 5 | 6 | 7 => match (len, word(b, start, len)) {
                        (2, ID_WORD) => Field::Id,
                        (5, ERROR_WORD) => Field::Error,
                        (6, METHOD_WORD) => Field::Method,
                        (6, RESULT_WORD) => Field::Result,
                        (6, PARAMS_WORD) => Field::Params,
                        (7, JSONRPC_WORD) => Field::Jsonrpc,
                        _ => Field::Other,
                    },
                    _ => Field::Other,
                };
                self.top_key(field);
            }
            2 if self.params => {
                self.update_key(len == 6 && word(b, start, 6) == UPDATE_WORD);
                self.meta_key(len == 5 && word(b, start, 5) == META_WORD);
                self.session_key(len == 9 && word(b, start, 8) == SESSION_I_WORD && b[start + 8] == b'd');
            }
            3 if self.update => {
                let kind = len == 13 && word(b, start, 8) == SESSION_U_WORD && word(b, start + 8, 5) == PDATE_WORD;
                self.kind_key(kind);
            }
            _ => {}
        }
    }

    /// A key with an escape, unescaped first (see [`key_of`]).
    #[inline(never)]
    #[cold]
    fn escaped_key(&mut self, b: &[u8], depth: usize, key: Str) {
        let name = key_of(b, &key);
        match depth {
            1 => self.top_key(match name {
                Some(JSONRPC) => Field::Jsonrpc,
                Some(ID) => Field::Id,
                Some(METHOD) => Field::Method,
                Some(RESULT) => Field::Result,
                Some(ERROR) => Field::Error,
                Some(PARAMS) => Field::Params,
                _ => Field::Other,
            }),
            2 if self.params => {
                self.update_key(name == Some(UPDATE));
                self.meta_key(name == Some(META));
                self.session_key(name == Some(SESSION_ID));
            }
            3 if self.update => self.kind_key(name == Some(SESSION_UPDATE)),
            _ => {}
        }
    }

    #[inline(always)]
    fn top_key(&mut self, field: Field) {
        if field != Field::Other {
            let bit = 1u8 << (field as u8);
            self.env.duplicate |= self.seen & bit != 0;
            self.seen |= bit;
            self.env.result |= field == Field::Result;
            self.env.error |= field == Field::Error;
        }
        self.field = field;
    }

    #[inline(always)]
    fn meta_key(&mut self, is: bool) {
        self.meta_key = is;
        if is {
            self.env.meta = None;
        }
    }

    #[inline(always)]
    fn session_key(&mut self, is: bool) {
        self.session_key = is;
        if is {
            self.env.session = None;
        }
    }

    #[inline(always)]
    fn update_key(&mut self, is: bool) {
        self.update_key = is;
        if is {
            self.env.update = None;
            self.env.update_object = None;
        }
    }

    #[inline(always)]
    fn kind_key(&mut self, is: bool) {
        self.kind_key = is;
        if is {
            self.env.update = None;
        }
    }

    /// A value of the top object begins at `i` with `c`.
    #[inline(always)]
    fn top_value(&mut self, c: u8, i: usize) {
        match self.field {
            Field::Id => self.id_start = Some(i),
            Field::Jsonrpc | Field::Method if c != b'"' => self.env.mistyped = true,
            _ => {}
        }
    }

    /// A value of the top object ended at `i`.
    #[inline(always)]
    fn top_end(&mut self, i: usize) {
        if let Some(start) = self.id_start.take() {
            self.env.id = Some(super::span(start, i));
        }
    }

    /// The string `s`, a value at `depth` (at most 3).
    #[inline(always)]
    fn string(&mut self, depth: usize, s: Str) {
        match depth {
            1 if self.field == Field::Jsonrpc => self.env.jsonrpc = Some(s),
            1 if self.field == Field::Method => self.env.method = Some(s),
            2 if self.params && self.session_key => self.env.session = Some(s),
            3 if self.update && self.kind_key => self.env.update = Some(s),
            _ => {}
        }
    }

    /// An object opens at `i`, at `depth` (at most 2).
    #[inline(always)]
    fn open(&mut self, depth: usize, i: usize) {
        match depth {
            1 if self.field == Field::Params => self.params = true,
            2 if self.params && self.update_key => (self.update, self.update_start) = (true, Some(i)),
            2 if self.params && self.meta_key => self.meta_start = Some(i),
            _ => {}
        }
    }

    /// The container at `depth` (2 or 3) closes; `i` is past it.
    #[inline(always)]
    fn close(&mut self, depth: usize, i: usize) {
        match depth {
            2 => self.params = false,
            _ => {
                self.update = false;
                if let Some(start) = self.update_start.take() {
                    self.env.update_object = Some(super::span(start, i));
                }
                if let Some(start) = self.meta_start.take() {
                    self.env.meta = Some(super::span(start, i));
                }
            }
        }
    }
}

/// A value of a line the next line may change (see [`super::skeleton`]): a string's text, between its
/// quotes, or a number.
#[derive(Debug, Clone, Copy)]
pub(super) struct Hole {
    pub(super) start: usize,
    pub(super) end: usize,
    pub(super) string: bool,
    /// What the envelope reads it as: [`ROLE_ID`], [`ROLE_SESSION`], or nothing (0).
    pub(super) role: u8,
    /// Which of the envelope's strings (a bit each: `jsonrpc`, `method`, `sessionUpdate`) and ends of
    /// `params._meta` and `params.update` (and the session id, when it is no hole) lie in the bytes before it,
    /// where a skeleton keeps them ([`super::skeleton`]).
    pub(super) moved: u8,
}

/// A [`Hole`] that is the id's value.
pub(super) const ROLE_ID: u8 = 1;
/// A [`Hole`] that is `params.sessionId`'s text.
pub(super) const ROLE_SESSION: u8 = 2;

/// Where the walk is: what comes at `i`.
#[derive(Clone, Copy, PartialEq, Eq)]
enum At {
    /// A value.
    Value,
    /// An object's members (a key, its colon and its value), from the first or after a comma.
    Members,
    /// What follows a value in a container (a comma or the container's end).
    After,
}

/// Whether `line` is one JSON text at most [`MAX_DEPTH`] deep (its UTF-8 aside), with its envelope as the
/// exact walk reads it; `bits` are the line's from [`super::index`]. `holes` (when given) gets the line's
/// string values and numbers, in order. `None` for a line that is not.
///
/// Most of a frame is members of objects whose values are strings or numbers: those are walked by one tight
/// loop (key, colon, value, comma); the walk leaves it only where a container opens or closes.
#[inline(never)]
pub(super) fn walk(b: &[u8], bits: &[u64], mut holes: Option<&mut Vec<Hole>>) -> Option<Envelope> {
    // Whether the innermost open container is an object; one bit per open container, set for an object.
    let mut objects = [0u64; MAX_DEPTH / 64 + 1];
    let (mut depth, mut object, mut r) = (0, false, Reading::new());
    let mut i = skip_ws(b, 0);
    r.env.top = match b.get(i) {
        Some(b'{') => Top::Object,
        Some(b'[') => Top::Array { empty: b.get(skip_ws(b, i + 1)) == Some(&b']') },
        _ => Top::Other,
    };
    let mut at = At::Value;
    // The byte at `i`, past any space.
    macro_rules! byte {
        () => {{
            let mut c = *b.get(i)?;
            if c <= b' ' {
                i = space(b, i);
                c = *b.get(i)?;
            }
            c
        }};
    }
    // The string value whose opening quote is at `i`; `i` then after its closing quote.
    macro_rules! string_value {
        () => {{
            let start = i + 1;
            let (end, escaped) = string(b, bits, start, &mut r.env.escapes)?;
            i = end + 1;
            if depth <= 3 && depth > 0 {
                r.string(depth, Str::new(start, end, escaped));
            }
            if let Some(holes) = holes.as_mut() {
                holes.push(Hole { start, end, string: true, role: 0, moved: 0 });
            }
        }};
    }
    // The number, `true`, `false` or `null` at `i`; `i` then after it.
    macro_rules! scalar {
        () => {{
            let start = i;
            i = match short_integer(b, i) {
                Some(end) => end,
                None => scalar(b, i)?,
            };
            if let Some(holes) = holes.as_mut().filter(|_| b[start] != b't' && b[start] != b'f' && b[start] != b'n') {
                holes.push(Hole { start, end: i, string: false, role: 0, moved: 0 });
            }
        }};
    }
    // The container at `depth` ends at `i`.
    macro_rules! close {
        () => {{
            i += 1;
            if depth & !1 == 2 {
                r.close(depth, i);
            }
            depth -= 1;
            object = objects[depth / 64] & (1 << (depth % 64)) != 0;
            if depth == 0 {
                return (space(b, i) == b.len()).then_some(r.env);
            }
        }};
    }
    loop {
        match at {
            At::Members => loop {
                if byte!() != b'"' {
                    return None;
                }
                let start = i + 1;
                let (end, escaped) = string(b, bits, start, &mut r.env.escapes)?;
                if depth <= 3 {
                    if escaped {
                        r.escaped_key(b, depth, Str::new(start, end, escaped));
                    } else {
                        r.key(b, depth, start, end);
                    }
                }
                i = end + 1;
                if byte!() != b':' {
                    return None;
                }
                i += 1;
                let c = byte!();
                if depth == 1 {
                    r.top_value(c, i);
                }
                match c {
                    b'"' => string_value!(),
                    b'{' | b'[' => {
                        at = At::Value;
                        break;
                    }
                    _ => scalar!(),
                }
                if depth == 1 {
                    r.top_end(i);
                }
                match byte!() {
                    b',' => i += 1,
                    b'}' => {
                        close!();
                        at = At::After;
                        break;
                    }
                    _ => return None,
                }
            },
            At::Value => {
                let c = byte!();
                if depth == 1 && !object {
                    // (an element of the top array: no field of the envelope)
                } else if depth == 1 {
                    r.top_value(c, i);
                }
                match c {
                    b'"' => {
                        string_value!();
                        if depth == 0 {
                            return (space(b, i) == b.len()).then_some(r.env);
                        }
                    }
                    b'{' | b'[' => {
                        if depth == MAX_DEPTH {
                            return None;
                        }
                        object = c == b'{';
                        if object && depth <= 2 {
                            r.open(depth, i);
                        }
                        depth += 1;
                        let (word, bit) = (depth / 64, 1u64 << (depth % 64));
                        if object {
                            objects[word] |= bit;
                        } else {
                            objects[word] &= !bit;
                        }
                        i += 1;
                        // `{` + 2 is `}`, `[` + 2 is `]`.
                        if byte!() == c + 2 {
                            close!();
                        } else {
                            at = if object { At::Members } else { At::Value };
                            continue;
                        }
                    }
                    _ => {
                        scalar!();
                        if depth == 0 {
                            return (space(b, i) == b.len()).then_some(r.env);
                        }
                        // An array of small integers (a tool's output as bytes: tens of thousands of them)
                        // one after another, each a hole; the first that is none goes the long way.
                        if !object && depth > 1 {
                            if holes.is_none() {
                                i = integer_run(b, i);
                            }
                            while b.get(i) == Some(&b',') {
                                let Some(end) = short_integer(b, i + 1) else { break };
                                if let Some(holes) = holes.as_mut() {
                                    holes.push(Hole { start: i + 1, end, string: false, role: 0, moved: 0 });
                                }
                                i = end;
                            }
                        }
                    }
                }
                at = At::After;
            }
            At::After => loop {
                if depth == 1 {
                    r.top_end(i);
                }
                match byte!() {
                    b',' => {
                        i += 1;
                        at = if object { At::Members } else { At::Value };
                        break;
                    }
                    c if c == if object { b'}' } else { b']' } => close!(),
                    _ => return None,
                }
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Both ways of reading a run go as far from the first commas of every line of the corpus (each a step
    /// of its own alignment), and from every comma of runs with each byte value at each place of a step.
    #[test]
    fn a_run_of_integers_ends_at_the_same_comma_by_words_as_by_this_machines_vectors() {
        let mut lines = crate::scan::corpus();
        let base = b"[1,22,0,255,9,1,22,0,255,9,1,22,0,255,9,1,22,0,255,9,1,22,0,255,9]".to_vec();
        for place in 1..40 {
            for byte in 0..=255u8 {
                let mut line = base.clone();
                line[place] = byte;
                lines.push(line);
            }
        }
        let mut went = 0;
        for line in &lines {
            for (at, _) in line.iter().enumerate().filter(|(_, c)| **c == b',').take(48) {
                let (words, here) = (integer_run_words(line, at), integer_run(line, at));
                assert_eq!(words, here, "from byte {at} of {}", String::from_utf8_lossy(line));
                went += usize::from(here > at);
            }
        }
        assert!(went > 10_000, "runs are read: {went}");
    }
}

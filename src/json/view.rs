//! A value of a frame read where it lies: a layer that needs a field or two of a frame it otherwise passes
//! on (a session id, a time in `_meta`) finds them in the frame's bytes, which the frame check accepted, and
//! walks only the objects on the way there, skipping every other value without reading it. Parsing the
//! whole frame into a `serde_json::Value` ([`crate::frame::Frame::value`]) costs an allocation per string
//! and per object of the frame; this costs a pass over the bytes up to the end of the object holding the
//! field.
//!
//! It reads as a `Value` reads: of a key that appears twice in an object, the last; a lone UTF-16 surrogate
//! escape in a string as U+FFFD ([`super::mend_surrogates`]); numbers as serde_json (with its
//! `arbitrary_precision`) reads them. The unit tests compare the two on every value of a corpus.

use std::borrow::Cow;

#[cfg(target_arch = "x86_64")]
mod wide;

/// A JSON value as its text in a line the frame check accepted (anything else reads as no value).
#[derive(Clone, Copy)]
pub struct View<'a> {
    text: &'a [u8],
    /// `text` is a part of a UTF-8 text ([`View::of_str`], and every view cut from such a view): a string in it lies
    /// between two ASCII quotes, where that text's characters start and end, so its text is UTF-8 as it lies
    /// and [`View::as_str`] does not check it again.
    utf8: bool,
}

/// Two views are equal when their texts are (whether either is known UTF-8 is no difference).
impl PartialEq for View<'_> {
    fn eq(&self, other: &View<'_>) -> bool {
        self.text == other.text
    }
}

impl Eq for View<'_> {}

impl std::fmt::Debug for View<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "View({})", String::from_utf8_lossy(self.text))
    }
}

/// JSON's space.
fn space(c: u8) -> bool {
    matches!(c, b' ' | b'\t' | b'\n' | b'\r')
}

/// Where the first of `needles` is in `b` at or after `at`. Most of what a view skips is a few bytes long (a
/// key, a short value, the text between two escapes), so the first 32 bytes are searched without a call: on
/// x86_64 sixteen at a time by SSE2 (every x86_64 has it; fewer than sixteen left, in the sixteen that end `b`),
/// elsewhere eight at a time in a word (each test finds the lowest byte that matches exactly: a false match
/// can only sit above a true one); past them, by memchr's SIMD search.
#[inline(always)]
fn find<const N: usize>(b: &[u8], mut at: usize, needles: [u8; N]) -> Option<usize> {
    #[cfg(target_arch = "x86_64")]
    {
        for _ in 0..2 {
            let Some(sixteen) = b.get(at..at + 16) else { break };
            let found = sixteen_of(sixteen, needles);
            if found != 0 {
                return Some(at + found.trailing_zeros() as usize);
            }
            at += 16;
        }
        // Fewer than sixteen bytes left: the sixteen that end `b`, those before `at` let go.
        if let Some(from) = b.len().checked_sub(16).filter(|&from| at > from) {
            let found = sixteen_of(&b[from..], needles) >> (at - from).min(16);
            return (found != 0).then(|| at + found.trailing_zeros() as usize);
        }
    }
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGH: u64 = 0x8080_8080_8080_8080;
    let words = if cfg!(target_arch = "x86_64") && at + 16 <= b.len() { 0 } else { 4 };
    for _ in 0..words {
        let Some(eight) = b.get(at..at + 8) else { break };
        let w = u64::from_le_bytes(eight.try_into().unwrap_or_default());
        let mut found = 0;
        for n in needles {
            let x = w ^ (ONES * u64::from(n));
            found |= x.wrapping_sub(ONES) & !x & HIGH;
        }
        if found != 0 {
            return Some(at + (found.trailing_zeros() / 8) as usize);
        }
        at += 8;
    }
    let rest = b.get(at..)?;
    let found = match needles.as_slice() {
        [a] => memchr::memchr(*a, rest),
        [a, b] => memchr::memchr2(*a, *b, rest),
        [a, b, c] => memchr::memchr3(*a, *b, *c, rest),
        _ => rest.iter().position(|c| needles.contains(c)),
    };
    found.map(|k| at + k)
}

/// Whether `a` and `b` are the same bytes, 16 at a time: for the short texts compared on every frame (a key,
/// what lies between two values: a few dozen bytes at most), where a call to `memcmp` costs more than the
/// comparison.
#[inline(always)]
pub(crate) fn same(a: &[u8], b: &[u8]) -> bool {
    let n = a.len();
    if n != b.len() {
        return false;
    }
    // The `K` bytes at `at` of each, as one number.
    fn at<const K: usize>(x: &[u8], at: usize) -> [u8; K] {
        x[at..at + K].try_into().unwrap_or([0; K])
    }
    match n {
        0 => true,
        1..4 => a[0] == b[0] && a[n - 1] == b[n - 1] && a[n / 2] == b[n / 2],
        // The first and the last words, overlapping when `n` is no multiple of their size.
        4..8 => at::<4>(a, 0) == at::<4>(b, 0) && at::<4>(a, n - 4) == at::<4>(b, n - 4),
        8..16 => at::<8>(a, 0) == at::<8>(b, 0) && at::<8>(a, n - 8) == at::<8>(b, n - 8),
        // Sixteen bytes a step, the last step overlapping the one before when `n` is no multiple of sixteen.
        // (A loop of indices: as iterators over chunks, some of the places this is inlined in made it calls.)
        _ => {
            let word = |x: &[u8], i: usize| u128::from_ne_bytes(at(x, i));
            let mut i = 0;
            while i + 16 < n {
                if word(a, i) != word(b, i) {
                    return false;
                }
                i += 16;
            }
            word(a, n - 16) == word(b, n - 16)
        }
    }
}

/// Of a block of 64 bytes whose backslashes are `backslashes` (a bit each, the first byte lowest), the bytes a
/// backslash escapes, given whether the block's first byte is escaped (`carried`: a backslash ending the block
/// before began an escape); with whether the next block's first byte is. Within a run of backslashes every
/// other one, counting from the run's first, escapes the byte after it; so a run's escaped bytes are those of
/// one parity, the other one's where the run starts at an odd byte. Adding each odd run's first bit to the
/// backslashes carries through that run to the byte after it, which turns the parity of exactly those runs
/// (simdjson's way): a few word operations however many backslashes the block has, where a step per backslash
/// costs a file's content (a `\n` every few bytes) a branch each.
// (The skips that use it are x86_64's; the rule is tested on every target.)
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
#[inline(always)]
pub(crate) fn escaped_bits(backslashes: u64, carried: bool) -> (u64, bool) {
    const EVEN: u64 = 0x5555_5555_5555_5555;
    // A backslash the block before escapes escapes nothing.
    let backslashes = backslashes & !u64::from(carried);
    let follows = backslashes << 1 | u64::from(carried);
    let odd_starts = backslashes & !EVEN & !follows;
    let (turned, carry) = odd_starts.overflowing_add(backslashes);
    ((EVEN ^ turned << 1) & follows, carry)
}

/// The bytes of `sixteen` that are one of `needles`, a bit each (the first byte lowest), by SSE2.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub(crate) fn sixteen_of<const N: usize>(sixteen: &[u8], needles: [u8; N]) -> u32 {
    use std::arch::x86_64::*;
    // SAFETY: SSE2 is part of every x86_64 CPU; the load reads the sixteen bytes of `sixteen`, whose length
    // its caller took from a range of sixteen.
    unsafe {
        let v = _mm_loadu_si128(sixteen.as_ptr().cast());
        let mut found = _mm_setzero_si128();
        for n in needles {
            found = _mm_or_si128(found, _mm_cmpeq_epi8(v, _mm_set1_epi8(n as i8)));
        }
        _mm_movemask_epi8(found) as u32
    }
}

/// The bytes of `sixteen` at most `max`, a bit each (the first byte lowest), by SSE2.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn sixteen_at_most(sixteen: &[u8], max: u8) -> u32 {
    use std::arch::x86_64::*;
    // SAFETY: SSE2 is part of every x86_64 CPU; the load reads the sixteen bytes of `sixteen`, whose length
    // its caller took from a range of sixteen.
    unsafe {
        let v = _mm_loadu_si128(sixteen.as_ptr().cast());
        _mm_movemask_epi8(_mm_cmpeq_epi8(_mm_min_epu8(v, _mm_set1_epi8(max as i8)), v)) as u32
    }
}

/// The sixteen bytes of `b` from `at`, or, fewer being left, the sixteen that end `b` and how many of them lie
/// before `at` (their bits shifted out by the caller): an object's last member, which a view of the object
/// reaches within sixteen bytes of its end, is looked at in one compare too. `None` when `b` is shorter.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn sixteen_from(b: &[u8], at: usize) -> Option<(&[u8], u32)> {
    match b.get(at..at + 16) {
        Some(sixteen) => Some((sixteen, 0)),
        None => {
            let from = b.len().checked_sub(16)?;
            // (`at` past `from`: else the sixteen from it were there. Past the end, every bit goes.)
            Some((&b[from..], (at - from).min(16) as u32))
        }
    }
}

/// Where the string whose text begins at `at` (after its opening quote) ends: its closing quote.
fn string_end(b: &[u8], at: usize) -> Option<usize> {
    string_end_escaped(b, at).map(|(end, _)| end)
}

/// [`string_end`], and whether the string has an escape (found on the way, where a key's compare would
/// otherwise look for one again). Most strings a view skips end within sixteen bytes and have no escape: on
/// x86_64 that is one compare where the string is, and the loop is a call of its own (where fewer than sixteen
/// bytes are left, too).
#[inline(always)]
fn string_end_escaped(b: &[u8], at: usize) -> Option<(usize, bool)> {
    #[cfg(target_arch = "x86_64")]
    if let Some((sixteen, before)) = sixteen_from(b, at) {
        let found = sixteen_of(sixteen, [b'"', b'\\']) >> before;
        let end = at + found.trailing_zeros() as usize;
        if found != 0 && b[end] == b'"' {
            return Some((end, false));
        }
    }
    string_end_loop(b, at)
}

/// [`string_end_escaped`] past its first sixteen bytes: 64 bytes a step by AVX2 where the CPU has it
/// ([`wide`]), else escape by escape (on x86_64 a call of its own).
#[cfg_attr(target_arch = "x86_64", inline(never))]
#[cfg_attr(not(target_arch = "x86_64"), inline(always))]
fn string_end_loop(b: &[u8], at: usize) -> Option<(usize, bool)> {
    #[cfg(target_arch = "x86_64")]
    if wide::available() {
        // SAFETY: the CPU has AVX2.
        return unsafe { wide::string_end(b, at) };
    }
    string_end_each(b, at)
}

/// [`string_end_escaped`] escape by escape.
#[inline(always)]
fn string_end_each(b: &[u8], mut at: usize) -> Option<(usize, bool)> {
    let mut escaped = false;
    loop {
        at = find(b, at, [b'"', b'\\'])?;
        match b[at] {
            b'"' => return Some((at, escaped)),
            _ => (at, escaped) = (at + 2, true),
        }
    }
}

/// Where the value that starts at `at` ends (one past its last byte). Inlined where a member's value is
/// skipped: most are strings; a container is a call of its own.
#[inline(always)]
fn value_end(b: &[u8], at: usize) -> Option<usize> {
    let (open, close) = match *b.get(at)? {
        b'"' => return Some(string_end(b, at + 1)? + 1),
        b'{' => (b'{', b'}'),
        b'[' => (b'[', b']'),
        _ => {
            // A number or a literal: in a valid text what follows one is a comma, a closing bracket or space
            // (all space is below `!`). On x86_64 sixteen bytes at once by SSE2 (most are a few digits), else a
            // byte at a time.
            #[cfg(target_arch = "x86_64")]
            if let Some((sixteen, before)) = sixteen_from(b, at) {
                let ends = (sixteen_of(sixteen, [b',', b'}', b']']) | sixteen_at_most(sixteen, b' ')) >> before;
                if ends != 0 {
                    return Some(at + ends.trailing_zeros() as usize);
                }
            }
            let mut end = at;
            while b.get(end).is_some_and(|&c| c > b' ' && !matches!(c, b',' | b'}' | b']')) {
                end += 1;
            }
            return Some(end);
        }
    };
    #[cfg(target_arch = "x86_64")]
    {
        if wide::available() {
            // SAFETY: the CPU has AVX2.
            unsafe { wide::container_end(b, at, [open, close]) }
        } else {
            container_end_sse2(b, at, [open, close])
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        container_end(b, at, [open, close], 0)
    }
}

/// Where the container whose bracket `open` is at or after `i` ends (one past its `close`), `depth` of its
/// brackets open before `i`, `i` outside a string: found bracket by bracket. Brackets of the other kind are
/// balanced inside, and strings are skipped whole.
fn container_end(b: &[u8], mut i: usize, [open, close]: [u8; 2], mut depth: usize) -> Option<usize> {
    loop {
        i = find(b, i, [b'"', open, close])?;
        match b[i] {
            b'"' => i = string_end(b, i + 1)?,
            c if c == open => depth += 1,
            _ => {
                depth -= 1;
                if depth == 0 {
                    return Some(i + 1);
                }
            }
        }
        i += 1;
    }
}

/// Of a step's `brackets` outside strings (a bit per byte, the first lowest), those of them that open a
/// container `opens`: the place of the one that closes the container, `depth` of its brackets open before the
/// step (counted on through the step when none does).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn closing(mut brackets: u64, opens: u64, depth: &mut usize) -> Option<usize> {
    while brackets != 0 {
        let k = brackets.trailing_zeros();
        if opens >> k & 1 == 1 {
            *depth += 1;
        } else {
            *depth -= 1;
            if *depth == 0 {
                return Some(k as usize);
            }
        }
        brackets &= brackets - 1;
    }
    None
}

/// [`container_end`] from the container's bracket at `at`, sixteen bytes a step by SSE2 while they hold no
/// backslash: the bytes in strings are those between a quote and the next (a prefix XOR of the quotes' bits,
/// carried from step to step), and the brackets outside them are counted in order; fewer than sixteen bytes
/// left, the sixteen that end `b` (those gone over let go). From a step with a backslash on, bracket by
/// bracket.
#[cfg(target_arch = "x86_64")]
#[inline(never)]
fn container_end_sse2(b: &[u8], at: usize, [open, close]: [u8; 2]) -> Option<usize> {
    let (mut i, mut depth, mut in_string) = (at, 0usize, 0u32);
    loop {
        // The step's bits, the first byte at `i` lowest, and how many bytes it covers.
        let (sixteen, skip) = match b.get(i..i + 16) {
            Some(sixteen) => (sixteen, 0),
            None if i < b.len() && b.len() >= 16 => (&b[b.len() - 16..], i + 16 - b.len()),
            None => break,
        };
        let width = 16 - skip;
        let [quotes, backslashes, opens, closes] = [b'"', b'\\', open, close].map(|c| sixteen_of(sixteen, [c]) >> skip);
        if backslashes != 0 {
            break;
        }
        // Each byte from an opening quote up to its closing one (not the closing quote itself).
        let mut strings = quotes;
        for shift in [1, 2, 4, 8] {
            strings ^= strings << shift;
        }
        strings = (strings ^ in_string) & 0xFFFF;
        if let Some(k) = closing(u64::from((opens | closes) & !strings), opens.into(), &mut depth) {
            return Some(i + k + 1);
        }
        in_string = if strings >> (width - 1) & 1 == 1 { 0xFFFF } else { 0 };
        i += width;
    }
    if in_string != 0 {
        i = string_end(b, i)? + 1;
    }
    container_end(b, i, [open, close], depth)
}

/// The text of `v` when it is a string (unescaped, as [`View::as_str`]); `None` for no value or any other.
pub fn str_of(v: Option<View<'_>>) -> Option<Cow<'_, str>> {
    v?.as_str()
}

/// Appends `text` as a JSON string, escaped as serde_json escapes it (for a line the shim writes as bytes).
pub(crate) fn write_str(out: &mut Vec<u8>, text: &str) {
    // (A string always serialises: serde_json writes into a Vec without an error.)
    let _ = serde_json::to_writer(out, text);
}

fn skip_space(b: &[u8], mut at: usize) -> usize {
    while b.get(at).is_some_and(|&c| space(c)) {
        at += 1;
    }
    at
}

impl<'a> View<'a> {
    /// The value `text` is (a line the frame check accepted, or any valid JSON text).
    pub fn of(text: &'a [u8]) -> View<'a> {
        let start = skip_space(text, 0);
        let end = text.len() - text.iter().rev().take_while(|&&c| space(c)).count();
        View { text: text.get(start..end.max(start)).unwrap_or_default(), utf8: false }
    }

    /// [`View::of`] a text known to be UTF-8 (a line the frame check found so): its strings are read as
    /// they lie, without a UTF-8 check each time a layer reads one ([`View::as_str`]).
    pub fn of_str(text: &'a str) -> View<'a> {
        View { utf8: true, ..View::of(text.as_bytes()) }
    }

    /// The value `text` is, when it has no white space around it (an object or a string whose place the
    /// frame check noted, from its first byte to its last): [`View::of`] without the look for white space.
    pub(crate) fn exact(text: &'a [u8]) -> View<'a> {
        View { text, utf8: false }
    }

    /// [`View::exact`], of bytes that are a part of a UTF-8 text when `utf8` (as [`View::of_str`]; a part
    /// cut anywhere: the strings in it lie between ASCII quotes).
    ///
    /// # Safety
    ///
    /// With `utf8`, `text` must be a part of a text that is UTF-8: [`View::as_str`] takes the bytes between
    /// two of its quotes as they lie.
    pub(crate) unsafe fn exact_in(text: &'a [u8], utf8: bool) -> View<'a> {
        View { text, utf8 }
    }

    /// Whether the view is a part of a text known UTF-8 (for a test of where views are made).
    #[cfg(test)]
    pub(crate) fn known_utf8(&self) -> bool {
        self.utf8
    }

    /// The value's JSON text, as it is in the frame.
    pub fn text(&self) -> &'a [u8] {
        self.text
    }

    /// Where this value lies in `whole`, the text it was read from (a frame's line): its byte range there;
    /// `None` when it is not a part of `whole`.
    pub fn range_in(&self, whole: &[u8]) -> Option<std::ops::Range<usize>> {
        let start = (self.text.as_ptr() as usize).checked_sub(whole.as_ptr() as usize)?;
        let end = start.checked_add(self.text.len())?;
        (end <= whole.len()).then_some(start..end)
    }

    /// The value of `key` in this object (of a key that appears more than once, the last); `None` when
    /// this is no object or has no such key.
    pub fn get(&self, key: &str) -> Option<View<'a>> {
        self.members().filter(|(k, _)| k.is(key)).last().map(|(_, v)| v)
    }

    /// The values of `keys` in this object, in one pass over its members (of a key that appears more than
    /// once, the last, as [`View::get`]); each `None` when this is no object or has no such key.
    pub fn pick<const N: usize>(&self, keys: [&str; N]) -> [Option<View<'a>>; N] {
        picked(&mut self.members(), keys)
    }

    /// The members of this object, in their order (none when this is no object): for a layer that reads
    /// several fields of one object in one pass (of a key that appears more than once, each, the last last).
    pub fn members(&self) -> Members<'a> {
        let b = self.text;
        let at = if b.first() == Some(&b'{') { skip_space(b, 1) } else { b.len() };
        Members { b, at, utf8: self.utf8 }
    }

    /// The members of the object that is the value of `key` in this object, read from that value's start
    /// without going over it first (none when there is no such key or its value is no object). Of a key that
    /// appears twice, the first: for a key the frame check lets appear only once (a frame's `params`), one
    /// pass over its object where [`View::get`] and [`View::members`] take two.
    pub fn members_at(&self, key: &str) -> Members<'a> {
        let b = self.text;
        let mut at = if b.first() == Some(&b'{') { skip_space(b, 1) } else { b.len() };
        while b.get(at) == Some(&b'"') {
            let Some((end, escaped)) = string_end_escaped(b, at + 1) else { break };
            let start = skip_space(b, skip_space(b, end + 1) + 1);
            if (Key { quoted: &b[at..=end], escaped }).is(key) {
                // The object's members up to its closing brace: the text after it is never reached.
                let inner = &b[start.min(b.len())..];
                let at = if inner.first() == Some(&b'{') { skip_space(inner, 1) } else { inner.len() };
                return Members { b: inner, at, utf8: self.utf8 };
            }
            let Some(stop) = value_end(b, start) else { break };
            let after = skip_space(b, stop);
            at = if b.get(after) == Some(&b',') { skip_space(b, after + 1) } else { b.len() };
        }
        Members { b: &[], at: 0, utf8: false }
    }

    /// The value at `path` (keys of objects, from this one down).
    pub fn pointer(&self, path: &[&str]) -> Option<View<'a>> {
        path.iter().try_fold(*self, |v, key| v.get(key))
    }

    /// A string's text, unescaped (a lone surrogate escape as U+FFFD); `None` for any other value.
    pub fn as_str(&self) -> Option<Cow<'a, str>> {
        let inner = self.text.strip_prefix(b"\"")?.strip_suffix(b"\"")?;
        if !inner.contains(&b'\\') {
            if self.utf8 {
                // SAFETY: `self.text` is a part of a UTF-8 text (`utf8` is set only by `View::of_str` and
                // `View::exact_in`, whose caller vouches for it, and on views cut from such a view), and `inner`
                // lies between two of its quotes: an ASCII byte of UTF-8 is a whole character, so `inner`
                // starts and ends where characters do, and is UTF-8.
                return Some(Cow::Borrowed(unsafe { std::str::from_utf8_unchecked(inner) }));
            }
            return std::str::from_utf8(inner).ok().map(Cow::Borrowed);
        }
        let mended = super::mend_surrogates(self.text);
        serde_json::from_slice::<String>(&mended).ok().map(Cow::Owned)
    }

    /// The strings of this value that are values, not keys, and hold a byte of `at` (places in this value's
    /// text, in order), each as the range of its text with its quotes: for a layer that edits a few strings
    /// of a frame where they lie. One pass over the strings up to the last place; other bytes are skipped.
    pub fn strings_holding(&self, at: &[usize]) -> Vec<std::ops::Range<usize>> {
        let (b, mut found) = (self.text, Vec::new());
        let (mut i, mut next) = (0, 0);
        while let Some(&place) = at.get(next) {
            // Outside a string, a quote only opens one.
            let Some(open) = find(b, i, [b'"']) else { break };
            let Some(close) = string_end(b, open + 1) else { break };
            i = close + 1;
            if place > close {
                continue;
            }
            if place > open && b.get(skip_space(b, i)) != Some(&b':') {
                found.push(open..i);
            }
            while at.get(next).is_some_and(|&p| p <= close) {
                next += 1;
            }
        }
        found
    }

    /// A number that is a `u64` as serde_json reads one (digits only, no sign, fraction or exponent).
    pub fn as_u64(&self) -> Option<u64> {
        if self.text.is_empty() {
            return None;
        }
        // Digit by digit: a sign, a fraction, an exponent or a value past `u64::MAX` is none.
        self.text.iter().try_fold(0u64, |n, &c| match c {
            b'0'..=b'9' => n.checked_mul(10)?.checked_add(u64::from(c - b'0')),
            _ => None,
        })
    }

    /// A number as an `f64`, as serde_json (with its `arbitrary_precision`) reads one: any number whose value
    /// is finite as an `f64`; `None` for any other value.
    pub fn as_f64(&self) -> Option<f64> {
        if !matches!(self.text.first(), Some(b'-' | b'0'..=b'9')) {
            return None;
        }
        std::str::from_utf8(self.text).ok()?.parse::<f64>().ok().filter(|f| f.is_finite())
    }

    /// The elements of this array, in their order (none when this is no array).
    pub fn elements(&self) -> Elements<'a> {
        let b = self.text;
        let at = if b.first() == Some(&b'[') { skip_space(b, 1) } else { b.len() };
        Elements { b, at, utf8: self.utf8 }
    }

    /// For each element of this array, in their order, the values of `keys` in it as [`View::pick`] finds them
    /// (all `None` for an element that is no object): one pass over the array, where [`View::elements`] and a
    /// pick of each would go over an object element twice (to find its end, then its members).
    pub fn elements_pick<const N: usize>(&self, keys: [&'a str; N]) -> ElementPicks<'a, N> {
        let b = self.text;
        let at = if b.first() == Some(&b'[') { skip_space(b, 1) } else { b.len() };
        ElementPicks { b, at, keys, utf8: self.utf8 }
    }

    /// `true` or `false`.
    pub fn as_bool(&self) -> Option<bool> {
        match self.text {
            b"true" => Some(true),
            b"false" => Some(false),
            _ => None,
        }
    }

    pub fn is_null(&self) -> bool {
        self.text == b"null"
    }

    /// The value parsed, for a layer that reads a small part of a frame as a `serde_json::Value` (as
    /// [`crate::frame::Frame::value`] reads the whole).
    pub fn to_value(&self) -> serde_json::Value {
        let mended = super::mend_surrogates(self.text);
        super::from_slice(&mended).unwrap_or(serde_json::Value::Null)
    }
}

/// The members of an object ([`View::members`]).
#[derive(Clone)]
pub struct Members<'a> {
    b: &'a [u8],
    /// Where the next member's key is.
    at: usize,
    /// `b` is a part of a UTF-8 text (as [`View`]'s `utf8`).
    utf8: bool,
}

impl<'a> Members<'a> {
    /// The values of `keys` among the members left ([`View::pick`] of them).
    pub fn pick<const N: usize>(mut self, keys: [&str; N]) -> [Option<View<'a>>; N] {
        picked(&mut self, keys)
    }

    /// Where the next member is, as a place in `whole` (the text this one's was cut from); `None` when it is
    /// no part of it. Two object reads of one text with the same place read the same members.
    pub fn place_in(&self, whole: &[u8]) -> Option<usize> {
        let at = (self.b.as_ptr() as usize).checked_sub(whole.as_ptr() as usize)?.checked_add(self.at)?;
        (at <= whole.len()).then_some(at)
    }
}

impl<'a> Iterator for Members<'a> {
    type Item = (Key<'a>, View<'a>);

    fn next(&mut self) -> Option<(Key<'a>, View<'a>)> {
        let b = self.b;
        if b.get(self.at) != Some(&b'"') {
            return None;
        }
        let (end, escaped) = string_end_escaped(b, self.at + 1)?;
        let key = Key { quoted: &b[self.at..=end], escaped };
        // The colon, then the value (most lines have no space around either).
        let start = match b.get(end + 1..end + 3) {
            Some(&[b':', c]) if !space(c) => end + 2,
            _ => skip_space(b, skip_space(b, end + 1) + 1),
        };
        let stop = value_end(b, start)?;
        self.at = match b.get(stop..stop + 2) {
            Some(&[b',', b'"']) => stop + 1,
            _ => {
                // (After the last member, the object's closing brace: where [`ElementPicks`] goes on from.)
                let after = skip_space(b, stop);
                if b.get(after) == Some(&b',') { skip_space(b, after + 1) } else { after }
            }
        };
        Some((key, View { text: &b[start..stop], utf8: self.utf8 }))
    }
}

/// The elements of an array ([`View::elements`]).
pub struct Elements<'a> {
    b: &'a [u8],
    /// Where the next element is.
    at: usize,
    /// `b` is a part of a UTF-8 text (as [`View`]'s `utf8`).
    utf8: bool,
}

impl<'a> Iterator for Elements<'a> {
    type Item = View<'a>;

    fn next(&mut self) -> Option<View<'a>> {
        let b = self.b;
        let start = self.at;
        // The end of the text, or the `]` of an empty array.
        if b.get(start).is_none_or(|&c| c == b']') {
            return None;
        }
        let stop = value_end(b, start)?;
        let after = skip_space(b, stop);
        self.at = if b.get(after) == Some(&b',') { skip_space(b, after + 1) } else { b.len() };
        Some(View { text: &b[start..stop], utf8: self.utf8 })
    }
}

/// The values of `keys` among `members`, gone over to their end (of a key that appears more than once, the last).
fn picked<'a, const N: usize>(members: &mut Members<'a>, keys: [&str; N]) -> [Option<View<'a>>; N] {
    let mut found = [None; N];
    for (key, value) in members {
        if let Some(k) = keys.iter().position(|name| key.is(name)) {
            found[k] = Some(value);
        }
    }
    found
}

/// The picks of an array's elements ([`View::elements_pick`]).
pub struct ElementPicks<'a, const N: usize> {
    b: &'a [u8],
    /// Where the next element is.
    at: usize,
    keys: [&'a str; N],
    /// `b` is a part of a UTF-8 text (as [`View`]'s `utf8`).
    utf8: bool,
}

impl<'a, const N: usize> Iterator for ElementPicks<'a, N> {
    type Item = [Option<View<'a>>; N];

    fn next(&mut self) -> Option<[Option<View<'a>>; N]> {
        let b = self.b;
        let start = self.at;
        if b.get(start).is_none_or(|&c| c == b']') {
            return None;
        }
        let (found, stop) = if b[start] == b'{' {
            // The object's members, its end where they end (its closing brace), each value skipped once.
            let mut members = Members { b, at: skip_space(b, start + 1), utf8: self.utf8 };
            let found = picked(&mut members, self.keys);
            if b.get(members.at) != Some(&b'}') {
                return None;
            }
            (found, members.at + 1)
        } else {
            ([None; N], value_end(b, start)?)
        };
        let after = skip_space(b, stop);
        self.at = if b.get(after) == Some(&b',') { skip_space(b, after + 1) } else { b.len() };
        Some(found)
    }
}

/// A member's key ([`View::members`]).
#[derive(Clone, Copy)]
pub struct Key<'a> {
    /// With its quotes.
    quoted: &'a [u8],
    /// It has an escape (is compared unescaped).
    escaped: bool,
}

impl<'a> Key<'a> {
    /// A key as its text with its quotes, and whether that holds an escape.
    pub(crate) fn of(quoted: &'a [u8], escaped: bool) -> Key<'a> {
        Key { quoted, escaped }
    }

    /// The key's text with its quotes, as it is in the frame.
    pub(crate) fn quoted(&self) -> &'a [u8] {
        self.quoted
    }

    pub(crate) fn escaped(&self) -> bool {
        self.escaped
    }

    /// Whether the key is `name` (unescaped first when it has an escape).
    ///
    /// Inlined: most names are constants, whose length then picks the compare (`same`) where it is built, and
    /// a key is compared with several on every member of a frame a layer reads.
    #[inline]
    pub fn is(&self, name: &str) -> bool {
        match self.escaped {
            false => same(&self.quoted[1..self.quoted.len() - 1], name.as_bytes()),
            true => self.unescaped_is(name),
        }
    }

    /// [`Key::is`] of a key with an escape (seldom: a call of its own).
    #[cold]
    #[inline(never)]
    fn unescaped_is(&self, name: &str) -> bool {
        View::exact(self.quoted).as_str().as_deref() == Some(name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The escaped bytes of `bits` (a step's backslashes), one byte after another.
    fn escaped_one_by_one(backslashes: u64, carried: bool) -> (u64, bool) {
        let (mut out, mut next) = (0u64, carried);
        for k in 0..64 {
            if next {
                out |= 1 << k;
                next = false;
            } else if backslashes >> k & 1 == 1 {
                next = true;
            }
        }
        (out, next)
    }

    /// `same` says two texts are the same bytes exactly when they are: every length up to several of its steps,
    /// a byte changed at each place, and texts of other lengths.
    #[test]
    fn same_is_equality_of_bytes() {
        for n in 0..80 {
            let a: Vec<u8> = (0..n).map(|k| b'a' + (k % 26) as u8).collect();
            assert!(same(&a, &a.clone()), "{n} bytes");
            for k in 0..n {
                let mut b = a.clone();
                b[k] ^= 0x20;
                assert!(!same(&a, &b), "{n} bytes, byte {k} changed");
            }
            if n > 0 {
                assert!(!same(&a, &a[..n - 1]), "{n} bytes and one fewer");
            }
        }
    }

    #[test]
    fn escapes_are_those_a_byte_by_byte_walk_finds() {
        // Every pattern of the low and of the high sixteen bits, runs across the middle, and a carry in.
        let mut patterns: Vec<u64> = (0..1u64 << 16).flat_map(|p| [p, p << 48, p << 24, p | p << 48]).collect();
        patterns.extend([u64::MAX, u64::MAX - 1, u64::MAX >> 1, 0x5555_5555_5555_5555, 0xAAAA_AAAA_AAAA_AAAA]);
        for p in patterns {
            for carried in [false, true] {
                assert_eq!(escaped_bits(p, carried), escaped_one_by_one(p, carried), "{p:#066b} {carried}");
            }
        }
    }

    use serde_json::Value;

    /// The name of `key` among the keys of `object` (unescaped), or `?`.
    fn want_key(object: &Value, key: &Key<'_>) -> String {
        object.as_object().and_then(|o| o.keys().find(|k| key.is(k))).cloned().unwrap_or_else(|| "?".into())
    }

    /// Every path to a value of `value` (keys of objects only, as a `View` goes), with a key no object has.
    fn paths(value: &Value, path: &mut Vec<String>, out: &mut Vec<Vec<String>>) {
        out.push(path.clone());
        let mut absent = path.clone();
        absent.push("absent".into());
        out.push(absent);
        if let Value::Object(map) = value {
            for (k, v) in map {
                path.push(k.clone());
                paths(v, path, out);
                path.pop();
            }
        }
    }

    /// Where each bracket and each opening quote of the valid JSON text `b` is, outside strings, found byte by
    /// byte.
    fn starts(b: &[u8]) -> (Vec<usize>, Vec<usize>) {
        let (mut brackets, mut quotes, mut inside, mut escaped) = (Vec::new(), Vec::new(), false, false);
        for (k, &c) in b.iter().enumerate() {
            match (inside, c) {
                (true, _) if escaped => escaped = false,
                (true, b'\\') => escaped = true,
                (true, b'"') => inside = false,
                (false, b'"') => {
                    inside = true;
                    quotes.push(k);
                }
                (false, b'{' | b'[') => brackets.push(k),
                _ => {}
            }
        }
        (brackets, quotes)
    }

    /// Where each number and literal outside a string starts, byte by byte.
    fn scalars(b: &[u8]) -> Vec<usize> {
        let (mut found, mut inside, mut escaped) = (Vec::new(), false, false);
        for (k, &c) in b.iter().enumerate() {
            match (inside, c) {
                (true, _) if escaped => escaped = false,
                (true, b'\\') => escaped = true,
                (true, b'"') => inside = false,
                (false, b'"') => inside = true,
                (false, b'-' | b'0'..=b'9' | b't' | b'f' | b'n')
                    if k == 0 || matches!(b[k - 1], b':' | b',' | b'[' | b' ' | b'\t' | b'\n' | b'\r') =>
                {
                    found.push(k)
                }
                _ => {}
            }
        }
        found
    }

    #[test]
    fn every_skip_ends_each_string_and_container_where_a_byte_by_byte_walk_ends_it() {
        // The frame check's lines, good ones only, and long ones: strings and containers of every length
        // around the steps of 16 and 64 bytes, runs of backslashes across them, at every place from a line's end.
        let mut lines: Vec<Vec<u8>> =
            crate::scan::corpus().into_iter().filter(|l| serde_json::from_slice::<Value>(l).is_ok()).collect();
        for n in (0..140).step_by(3) {
            for odd in [r#"\""#, r#"\\"#, "]", "}", r#"\\\""#, r#"\\\\\""#, r#"\\\\\\"#, r#"\\]\\\\}\"["#, "é漢"] {
                let text = format!("{}{odd}{}", "x".repeat(n), "y".repeat(n % 11));
                let line =
                    format!(r#"{{"a":"{text}","b":{{"c":["{text}",{{"d":"{text}"}}],"e":[[[]]]}},"f":"{text}"}}"#);
                for pad in [0, 1, 31, 63] {
                    lines.push(format!(r#"[{}{line},"{text}",{{}}]"#, " ".repeat(pad)).into_bytes());
                }
            }
            // An object whose last members are numbers and literals, as a view of it (its text alone) ends.
            let digits = "9".repeat(n % 23 + 1);
            for last in [&*digits, "-0.5e-3", "true", "false", "null"] {
                lines.push(format!(r#"{{"sessionUpdate":"usage_update","used":{digits},"size":{last}}}"#).into_bytes());
                lines.push(format!(r#"{{"k":[{last},{digits} , {last}]}}"#).into_bytes());
                lines.push(format!(r#"{{"k":{last}}}"#).into_bytes());
                lines.push(last.as_bytes().to_vec());
            }
        }
        let mut compared = [0usize; 3];
        for b in &lines {
            let (brackets, quotes) = starts(b);
            for at in brackets {
                let pair = if b[at] == b'{' { [b'{', b'}'] } else { [b'[', b']'] };
                let want = container_end(b, at, pair, 0);
                assert!(want.is_some(), "{}", String::from_utf8_lossy(b));
                #[cfg(target_arch = "x86_64")]
                {
                    assert_eq!(container_end_sse2(b, at, pair), want, "{} at {at}", String::from_utf8_lossy(b));
                    if wide::available() {
                        // SAFETY: the CPU has AVX2.
                        let wide = unsafe { wide::container_end(b, at, pair) };
                        assert_eq!(wide, want, "{} at {at}", String::from_utf8_lossy(b));
                    }
                }
                assert_eq!(value_end(b, at), want);
                compared[0] += 1;
            }
            for at in quotes {
                let want = string_end_each(b, at + 1);
                assert!(want.is_some(), "{}", String::from_utf8_lossy(b));
                assert_eq!(string_end_escaped(b, at + 1), want, "{} at {at}", String::from_utf8_lossy(b));
                assert_eq!(string_end_loop(b, at + 1), want, "{} at {at}", String::from_utf8_lossy(b));
                compared[1] += 1;
            }
            // Numbers and literals, up to a comma, a closing bracket or space, or the text's end.
            for at in scalars(b) {
                let want = at + b[at..].iter().take_while(|&&c| c > b' ' && !matches!(c, b',' | b'}' | b']')).count();
                assert_eq!(value_end(b, at), Some(want), "{} at {at}", String::from_utf8_lossy(b));
                compared[2] += 1;
            }
        }
        assert!(compared.iter().all(|&n| n > 10_000), "{compared:?}");
    }

    #[test]
    fn pick_reads_each_key_as_get_does() {
        let text = br#"{"a":1,"b":{"c":2},"a":"last","\u0064":[3]}"#;
        let v = View::of(text);
        let [a, b, d, none] = v.pick(["a", "b", "d", "none"]);
        assert_eq!([a, b, d, none], [v.get("a"), v.get("b"), v.get("d"), None]);
        assert_eq!(a.map(|a| a.text()), Some(br#""last""#.as_slice()));
        assert_eq!(View::of(b"[1]").pick(["a"]), [None]);
    }

    #[test]
    fn strings_holding_finds_the_value_strings_around_places_not_keys() {
        let text = br#"{"k\"ey":"a\"b\\","n":[1,"xy",{"q":"zz"}],"x":"x","last":"\u00e9t\u00e9"}"#;
        let v = View::of(text);
        let find = |what: &str| text.windows(what.len()).position(|w| w == what.as_bytes()).unwrap();
        let quoted = |r: std::ops::Range<usize>| String::from_utf8_lossy(&text[r]).into_owned();
        // A place in a key, in a value with escapes, in an array, in a nested object's value, in the last.
        let places = [find("ey"), find(r#"b\\"#), find("xy") + 1, find("zz"), find(r#"t\u"#)];
        let found: Vec<String> = v.strings_holding(&places).into_iter().map(quoted).collect();
        assert_eq!(found, [r#""a\"b\\""#, r#""xy""#, r#""zz""#, r#""\u00e9t\u00e9""#]);
        // Two places in one string give it once; a place outside any string gives none.
        assert_eq!(v.strings_holding(&[find("xy"), find("xy") + 1]).len(), 1);
        assert!(v.strings_holding(&[find("[1"), find("[1") + 1]).is_empty());
        assert!(v.strings_holding(&[]).is_empty());
    }

    #[test]
    fn reads_every_value_as_a_parsed_value_has_it() {
        let lines = [
            r#"{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"01a2","update":{"sessionUpdate":"agent_message_chunk","content":{"type":"text","text":"a \"b\" {c} [d] \\ e"}},"_meta":{"totalTokens":135,"eventId":"01a2-14","agentTimestampMs":1796186871643,"streamStartMs":1796186871643,"chunkId":1}}}"#,
            r#" { "a" : { "b" : [ 1 , { "c" : "}" } ] , "d" : -0.5e-3 } , "e" : null , "f" : true , "g" : false } "#,
            r#"{"k":1,"k":{"x":2},"k\u0032":"escaped key","k2":"plain","s":"x\ud800y","t":"\ud83d\ude00","u":"\n\t\/"}"#,
            r#"{"big":18446744073709551616,"max":18446744073709551615,"neg":-1,"exp":1e3,"frac":1.0,"zero":0,"huge":1e400}"#,
            r#"{"nested":{"nested":{"nested":{"a":[{"b":"]"},"[",{}],"z":{}}}},"e":[],"o":{}}"#,
            r#"[{"a":1}]"#,
            r#"{"q":[ {"a":1,"a":"two" } , {"k" : "x\"}" , "n":[1,{"a":0}]},{}, 7, "s", [ {"a":3} ],{ "c":{"a":4}} ]}"#,
            r#"{"e":[ ],"f":[[1,[2]] , "x\"]" ,{"a":[]},-1.5e3,null,true],"g":[ "]" ],"h":["\ud800",1e400]}"#,
            r#""just a string""#,
            "12",
            // Numbers and literals that end an array, with sixteen bytes and more after them, and fewer.
            r#"{"n":[1,22,333,-4.5e1,true,false,null],"m":[7],"l":[null ],"pad":"xxxxxxxxxxxxxxxxxxxxxxxxxxxx"}"#,
            r#"{"n":[1,22,333,-4.5e1,true,false,null],"m":[7]}"#,
            // Coda's instruction: Markdown with CJK text, in strings of every place.
            "{\"systemPrompt\":\"# 角色\\n\\n你是 Coda 的助手。\\n- 用中文回答\\n- `é` ✓\",\"日本\":[\"語\",{\"키\":\"값\"}],\"e\":\"é\"}",
        ];
        // Strings and containers of every length around the word and the 32 bytes searched in words, with
        // escapes, quotes and brackets at every place in them.
        let mut made = Vec::new();
        for n in 0..80 {
            // (Runs of one to six backslashes before a quote, a bracket or a letter: a run may cross a step.)
            for odd in [
                r#"\""#,
                r#"\\"#,
                "]",
                "}",
                "{",
                "[",
                r#"\u00e9"#,
                "\\n",
                r#"\\\""#,
                r#"\\\\\""#,
                r#"\\\\\\"#,
                r#"\\]\\\\}\"["#,
                r#"\\\\\\\"\\\\\\}\n{"#,
            ] {
                let text = format!("{}{odd}{}", "x".repeat(n), "y".repeat(n % 7));
                made.push(format!(
                    r#"{{"a":"{text}","b":{{"c":["{text}",{{"d":"{text}"}}],"e":[]}},"f":"{text}","a":1}}"#
                ));
            }
        }
        // (Each line read as bytes and as a text known UTF-8, whose strings are taken as they lie.)
        let views = |line: &'static str| [View::of(line.as_bytes()), View::of_str(line)];
        let made: &'static [String] = made.leak();
        for view in lines.iter().copied().chain(made.iter().map(String::as_str)).flat_map(views) {
            let line = std::str::from_utf8(view.text).unwrap();
            let value: Value = super::super::from_slice(&super::super::mend_surrogates(line.as_bytes())).unwrap();
            let mut all = Vec::new();
            paths(&value, &mut Vec::new(), &mut all);
            for path in all {
                let keys: Vec<&str> = path.iter().map(String::as_str).collect();
                let want = keys.iter().try_fold(&value, |v, k| v.get(k));
                let got = view.pointer(&keys);
                // A view cut from a text known UTF-8 is known so (its strings are read without a check).
                assert_eq!(got.map(|g| g.utf8), got.map(|_| view.utf8), "{line} at {keys:?}");
                assert_eq!(got.map(|g| g.to_value()).as_ref(), want, "{line} at {keys:?}");
                assert_eq!(got.and_then(|g| g.as_str()).as_deref(), want.and_then(Value::as_str), "{keys:?}");
                assert_eq!(got.and_then(|g| g.as_u64()), want.and_then(Value::as_u64), "{line} at {keys:?}");
                assert_eq!(got.and_then(|g| g.as_bool()), want.and_then(Value::as_bool), "{keys:?}");
                assert_eq!(got.is_some_and(|g| g.is_null()), want.is_some_and(Value::is_null), "{keys:?}");
                // An object's members, read in one pass with the last of a repeated key kept, are its keys
                // and values.
                if let Some(Value::Object(want)) = want {
                    let mut read = serde_json::Map::new();
                    for (key, value) in got.expect("an object").members() {
                        let name = want.keys().find(|k| key.is(k)).expect("a key of the object");
                        read.insert(name.clone(), value.to_value());
                    }
                    assert_eq!(&read, want, "{line} at {keys:?}");
                } else {
                    assert_eq!(got.map(|g| g.members().count()), got.map(|_| 0), "{line} at {keys:?}");
                }
                // An array's elements are its values.
                if let Some(Value::Array(want)) = want {
                    let read: Vec<Value> = got.expect("an array").elements().map(|e| e.to_value()).collect();
                    assert_eq!(&read, want, "{line} at {keys:?}");
                }
                assert_eq!(got.and_then(|g| g.as_f64()), want.and_then(Value::as_f64), "{line} at {keys:?}");
                // The members of each member that is an object, read from its start, are its members (of a key
                // that appears twice, the first: compared where a key appears once).
                if let Some(Value::Object(want)) = want {
                    let view = got.expect("an object");
                    for (name, value) in want {
                        let once = view.members().filter(|(k, _)| k.is(name)).count() == 1;
                        let read: Vec<(String, Value)> =
                            view.members_at(name).map(|(k, v)| (want_key(value, &k), v.to_value())).collect();
                        let parsed: Vec<(String, Value)> = view
                            .get(name)
                            .into_iter()
                            .flat_map(|v| v.members())
                            .map(|(k, v)| (want_key(value, &k), v.to_value()))
                            .collect();
                        if once {
                            assert_eq!(read, parsed, "{line} at {keys:?} {name}");
                        }
                    }
                    assert_eq!(view.members_at("absent").count(), 0);
                }
                // Each element's picks, in one pass over the array, are what a pick of each element finds.
                if let Some(got) = got {
                    let names = ["a", "c", "k", "n", "k2"];
                    let each: Vec<_> = got.elements().map(|e| e.pick(names).map(|v| v.map(|v| v.text()))).collect();
                    let picks: Vec<_> = got.elements_pick(names).map(|p| p.map(|v| v.map(|v| v.text()))).collect();
                    assert_eq!(picks, each, "{line} at {keys:?}");
                    let known = |v: View<'_>| v.utf8 == view.utf8;
                    assert!(got.elements().all(known), "{line} at {keys:?}");
                    assert!(got.elements_pick(names).flatten().flatten().all(known), "{line} at {keys:?}");
                    assert!(got.members().all(|(_, v)| known(v)), "{line} at {keys:?}");
                    let firsts = got.members().map(|(k, _)| k.quoted).collect::<Vec<_>>();
                    for name in firsts.iter().filter_map(|k| std::str::from_utf8(&k[1..k.len() - 1]).ok()) {
                        assert!(got.members_at(name).all(|(_, v)| known(v)), "{line} at {keys:?}");
                    }
                }
                // An array's elements, read in one pass, are its values.
                let elements: Option<Vec<Value>> = got.map(|g| g.elements().map(|e| e.to_value()).collect());
                match want {
                    Some(Value::Array(want)) => assert_eq!(elements.as_ref(), Some(want), "{line} at {keys:?}"),
                    _ => assert_eq!(elements.map(|e| e.len()), got.map(|_| 0), "{line} at {keys:?}"),
                }
            }
        }
    }
}

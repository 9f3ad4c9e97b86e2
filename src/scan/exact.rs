//! The exact walk: byte by byte, saying why a line is not JSON and where. Every line [`super::fast`] refuses
//! is walked again here for the answer to its sender; it is also what the unit tests hold the fast walk to.

use super::*;

/// Checks that `line` is one JSON text (UTF-8, at most [`MAX_DEPTH`] deep) and reads its envelope, saying
/// exactly why not and where.
pub(super) fn scan(line: &[u8]) -> Result<Envelope, Error> {
    if let Err(e) = simdutf8::compat::from_utf8(line) {
        return Err(Error::Syntax("invalid UTF-8", e.valid_up_to()));
    }
    let mut at = 0;
    match walk(line, &mut at) {
        Ok(env) => Ok(env),
        Err(DEEP) => Err(Error::TooDeep(at)),
        Err(why) => Err(Error::Syntax(WHY[usize::from(why)], at)),
    }
}

#[inline(always)]
pub(super) fn skip_ws(b: &[u8], mut i: usize) -> usize {
    while let Some(b' ' | b'\t' | b'\n' | b'\r') = b.get(i) {
        i += 1;
    }
    i
}

/// The walk itself, byte by byte; on failure `at` is where it stopped.
fn walk(b: &[u8], at: &mut usize) -> Result<Envelope, Bad> {
    let mut env = Envelope::default();
    let mut i = skip_ws(b, 0);
    env.top = match b.get(i) {
        Some(b'{') => Top::Object,
        Some(b'[') => Top::Array { empty: b.get(skip_ws(b, i + 1)) == Some(&b']') },
        _ => Top::Other,
    };
    let top_object = env.top == Top::Object;
    let mut depth = 0;
    // Whether the innermost open container is an object.
    let mut object = false;
    // One bit per open container, set for an object.
    let mut objects = [0u64; MAX_DEPTH / 64 + 1];
    // The top object's key whose value comes next; where the id's value began.
    let mut field = Field::Other;
    let mut seen = 0u8;
    let mut id_start = usize::MAX;
    // The container at depth 2 is `params`, an object; the one at depth 3 is its `update`, an object; the
    // last key read in `params` was `update`, the last in `update` `sessionUpdate`.
    let (mut params, mut update, mut update_key, mut kind_key) = (false, false, false, false);
    // The last key read in `params` was `_meta`; where the object at depth 3 that is its value began.
    let (mut meta_key, mut meta_start) = (false, usize::MAX);
    // Where the object at depth 3 that is `params.update` began.
    let mut update_start = usize::MAX;
    // The last key read in `params` was `sessionId`.
    let mut session_key = false;

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
            let key = match string(b, i + 1, &mut env.escapes) {
                Ok(s) => s,
                Err(why) => fail!(why),
            };
            i = key.range().end + 1;
            // Only the keys of the top object, of `params` and of `update` are looked at, and only one
            // of a length some name has.
            let len = key.range().len();
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
                    env.update_object = None;
                }
                meta_key = (len == 5 || key.escaped) && key_of(b, &key) == Some(META);
                if meta_key {
                    env.meta = None;
                }
                session_key = (len == 9 || key.escaped) && key_of(b, &key) == Some(SESSION_ID);
                if session_key {
                    env.session = None;
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
                        (update, update_start) = (true, i);
                    } else if depth == 2 && params && meta_key {
                        meta_start = i;
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
                        3 => {
                            update = false;
                            if update_start != usize::MAX {
                                env.update_object =
                                    Some(super::span(std::mem::replace(&mut update_start, usize::MAX), i));
                            }
                            if meta_start != usize::MAX {
                                env.meta = Some(super::span(std::mem::replace(&mut meta_start, usize::MAX), i));
                            }
                        }
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
                let s = match string(b, i + 1, &mut env.escapes) {
                    Ok(s) => s,
                    Err(why) => fail!(why),
                };
                i = s.range().end + 1;
                if depth == 1 && top_object {
                    match field {
                        Field::Jsonrpc => env.jsonrpc = Some(s),
                        Field::Method => env.method = Some(s),
                        _ => {}
                    }
                } else if depth == 2 && params && session_key {
                    env.session = Some(s);
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
                env.id = Some(super::span(id_start, i));
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
                3 => {
                    update = false;
                    if update_start != usize::MAX {
                        env.update_object = Some(super::span(std::mem::replace(&mut update_start, usize::MAX), i));
                    }
                    if meta_start != usize::MAX {
                        env.meta = Some(super::span(std::mem::replace(&mut meta_start, usize::MAX), i));
                    }
                }
                _ => {}
            }
            depth -= 1;
            object = objects[depth / 64] & (1 << (depth % 64)) != 0;
        }
    }
}

/// The string whose text begins at `start` (after its opening quote).
#[inline(always)]
fn string(b: &[u8], start: usize, notes: &mut Escapes) -> Result<Str, Bad> {
    let mut i = start;
    let mut escaped = false;
    loop {
        i = match special(b, i) {
            Some(at) => at,
            None => return Err(UNCLOSED),
        };
        match b[i] {
            b'"' => return Ok(Str::new(start, i, escaped)),
            b'\\' => {
                escaped = true;
                i = escape(b, i, notes).ok_or(ESCAPE)?;
            }
            _ => return Err(CONTROL),
        }
    }
}

/// The escape whose backslash is at `at`, noted in `notes`; returns where the string goes on.
pub(super) fn escape(b: &[u8], at: usize, notes: &mut Escapes) -> Option<usize> {
    match b.get(at + 1)? {
        b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't' => Some(at + 2),
        b'u' => {
            notes.unicode = true;
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
                        notes.lone_surrogate = true;
                        Some(at + 6)
                    }
                }
                0xDC00..=0xDFFF => {
                    notes.lone_surrogate = true;
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
pub(super) fn special(b: &[u8], mut i: usize) -> Option<usize> {
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

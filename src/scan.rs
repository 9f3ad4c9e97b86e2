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
    pub fn text<'a>(&self, line: &'a [u8]) -> Option<std::borrow::Cow<'a, str>> {
        if self.escaped {
            let quoted = &line[self.start - 1..=self.end];
            serde_json::from_slice::<String>(quoted).ok().map(std::borrow::Cow::Owned)
        } else {
            std::str::from_utf8(&line[self.start..self.end]).ok().map(std::borrow::Cow::Borrowed)
        }
    }

    fn is(&self, line: &[u8], name: &str) -> bool {
        if self.escaped { self.text(line).is_some_and(|t| t == name) } else { &line[self.start..self.end] == name.as_bytes() }
    }
}

/// What the line is at its top.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Top {
    Object,
    /// An array: a batch, or `[]`.
    Array { empty: bool },
    /// A string, number or literal.
    #[default]
    Other,
}

/// The envelope of one valid JSON text.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
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

#[derive(Clone, Copy, PartialEq, Eq)]
enum Field {
    Jsonrpc,
    Id,
    Method,
    Result,
    Error,
    Params,
    Other,
}

const FIELDS: [(&str, Field); 6] = [
    ("jsonrpc", Field::Jsonrpc),
    ("id", Field::Id),
    ("method", Field::Method),
    ("result", Field::Result),
    ("error", Field::Error),
    ("params", Field::Params),
];

struct Scanner<'a> {
    b: &'a [u8],
    i: usize,
    depth: usize,
    /// One bit per open container, set for an object.
    objects: [u64; MAX_DEPTH / 64 + 1],
    env: Envelope,
    /// The top object's key whose value is being read.
    field: Field,
    seen: u8,
    id_start: Option<usize>,
    /// The container at depth 2 is `params`, an object; the one at depth 3 is its `update`, an object.
    params: bool,
    update: bool,
    /// The last key read in `params` was `update`; the last in `update` was `sessionUpdate`.
    update_key: bool,
    kind_key: bool,
}

type Step<T = ()> = Result<T, Error>;

/// Checks that `line` is one JSON text (UTF-8, at most [`MAX_DEPTH`] deep) and reads its envelope.
pub fn scan(line: &[u8]) -> Result<Envelope, Error> {
    if let Err(e) = simdutf8::compat::from_utf8(line) {
        return Err(Error::Syntax("invalid UTF-8", e.valid_up_to()));
    }
    let mut s = Scanner {
        b: line,
        i: 0,
        depth: 0,
        objects: [0; MAX_DEPTH / 64 + 1],
        env: Envelope::default(),
        field: Field::Other,
        seen: 0,
        id_start: None,
        params: false,
        update: false,
        update_key: false,
        kind_key: false,
    };
    s.run()?;
    Ok(s.env)
}

impl Scanner<'_> {
    fn run(&mut self) -> Step {
        let b = self.b;
        self.ws();
        self.env.top = match b.get(self.i) {
            Some(b'{') => Top::Object,
            Some(b'[') => {
                let mut j = self.i + 1;
                while matches!(b.get(j), Some(b' ' | b'\t' | b'\n' | b'\r')) {
                    j += 1;
                }
                Top::Array { empty: b.get(j) == Some(&b']') }
            }
            _ => Top::Other,
        };
        'value: loop {
            self.ws();
            let Some(&c) = b.get(self.i) else { return Err(self.syntax("the text ends where a value should be")) };
            let depth = self.depth;
            if depth == 1 && self.env.top == Top::Object {
                match self.field {
                    Field::Id => self.id_start = Some(self.i),
                    Field::Jsonrpc | Field::Method if c != b'"' => self.env.mistyped = true,
                    _ => {}
                }
            }
            match c {
                b'{' => {
                    self.open(true)?;
                    if depth == 1 && self.field == Field::Params && self.env.top == Top::Object {
                        self.params = true;
                    } else if depth == 2 && self.params && self.update_key {
                        self.update = true;
                    }
                    self.ws();
                    if b.get(self.i) == Some(&b'}') {
                        self.i += 1;
                        self.close();
                    } else {
                        self.key()?;
                        continue 'value;
                    }
                }
                b'[' => {
                    self.open(false)?;
                    self.ws();
                    if b.get(self.i) == Some(&b']') {
                        self.i += 1;
                        self.close();
                    } else {
                        continue 'value;
                    }
                }
                b'"' => {
                    let s = self.string()?;
                    if depth == 1 && self.env.top == Top::Object {
                        match self.field {
                            Field::Jsonrpc => self.env.jsonrpc = Some(s),
                            Field::Method => self.env.method = Some(s),
                            _ => {}
                        }
                    } else if depth == 3 && self.update && self.kind_key {
                        self.env.update = Some(s);
                    }
                }
                b'-' | b'0'..=b'9' => self.number()?,
                b't' => self.literal(b"true")?,
                b'f' => self.literal(b"false")?,
                b'n' => self.literal(b"null")?,
                _ => return Err(self.syntax("not a JSON value")),
            }
            // After a value: a comma and the next, the end of containers, or the end of the text.
            loop {
                if self.depth == 1
                    && let Some(start) = self.id_start.take()
                {
                    self.env.id = Some((start, self.i));
                }
                self.ws();
                if self.depth == 0 {
                    break 'value;
                }
                let object = self.in_object();
                match b.get(self.i) {
                    Some(b',') => {
                        self.i += 1;
                        if object {
                            self.ws();
                            self.key()?;
                        }
                        continue 'value;
                    }
                    Some(b'}') if object => {
                        self.i += 1;
                        self.close();
                    }
                    Some(b']') if !object => {
                        self.i += 1;
                        self.close();
                    }
                    Some(_) => return Err(self.syntax("expected a comma or the end of an array or object")),
                    None => return Err(self.syntax("the text ends inside an array or object")),
                }
            }
        }
        if self.i != b.len() {
            return Err(self.syntax("text after the JSON value"));
        }
        Ok(())
    }

    fn syntax(&self, what: &'static str) -> Error {
        Error::Syntax(what, self.i)
    }

    fn ws(&mut self) {
        while let Some(b' ' | b'\t' | b'\n' | b'\r') = self.b.get(self.i) {
            self.i += 1;
        }
    }

    fn in_object(&self) -> bool {
        self.objects[self.depth / 64] & (1 << (self.depth % 64)) != 0
    }

    fn open(&mut self, object: bool) -> Step {
        if self.depth == MAX_DEPTH {
            return Err(Error::TooDeep(self.i));
        }
        self.i += 1;
        self.depth += 1;
        let (word, bit) = (self.depth / 64, 1u64 << (self.depth % 64));
        if object { self.objects[word] |= bit } else { self.objects[word] &= !bit }
        Ok(())
    }

    fn close(&mut self) {
        match self.depth {
            2 => self.params = false,
            3 => self.update = false,
            _ => {}
        }
        self.depth -= 1;
    }

    /// An object's key and its colon; notes the keys the envelope is made of.
    fn key(&mut self) -> Step {
        if self.b.get(self.i) != Some(&b'"') {
            return Err(self.syntax("expected a string key"));
        }
        let key = self.string()?;
        let b = self.b;
        match self.depth {
            1 => {
                self.field = FIELDS.iter().find(|(name, _)| key.is(b, name)).map_or(Field::Other, |(_, f)| *f);
                if self.field != Field::Other {
                    let bit = 1u8 << (self.field as u8);
                    self.env.duplicate |= self.seen & bit != 0;
                    self.seen |= bit;
                    match self.field {
                        Field::Result => self.env.result = true,
                        Field::Error => self.env.error = true,
                        _ => {}
                    }
                }
            }
            2 if self.params => {
                self.update_key = key.is(b, "update");
                if self.update_key {
                    self.env.update = None;
                }
            }
            3 if self.update => {
                self.kind_key = key.is(b, "sessionUpdate");
                if self.kind_key {
                    self.env.update = None;
                }
            }
            _ => {}
        }
        self.ws();
        if b.get(self.i) != Some(&b':') {
            return Err(self.syntax("expected a colon after a key"));
        }
        self.i += 1;
        Ok(())
    }

    /// The string whose opening quote is at `self.i`; leaves `self.i` after its closing quote.
    fn string(&mut self) -> Step<Str> {
        let b = self.b;
        let start = self.i + 1;
        let mut i = start;
        let mut escaped = false;
        loop {
            i = special(b, i).ok_or(Error::Syntax("a string is not closed", start - 1))?;
            match b[i] {
                b'"' => break,
                b'\\' => {
                    escaped = true;
                    i = self.escape(i)?;
                }
                _ => return Err(Error::Syntax("a control character in a string", i)),
            }
        }
        self.i = i + 1;
        Ok(Str { start, end: i, escaped })
    }

    /// The escape whose backslash is at `at`; returns where the string goes on.
    fn escape(&mut self, at: usize) -> Step<usize> {
        let b = self.b;
        match b.get(at + 1) {
            Some(b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't') => Ok(at + 2),
            Some(b'u') => {
                let unit = hex4(b, at + 2).ok_or(Error::Syntax("a bad \\u escape", at))?;
                match unit {
                    0xD800..=0xDBFF => {
                        let low = match b.get(at + 6..at + 8) {
                            Some(b"\\u") => hex4(b, at + 8),
                            _ => None,
                        };
                        if low.is_some_and(|l| (0xDC00..=0xDFFF).contains(&l)) {
                            Ok(at + 12)
                        } else {
                            self.env.lone_surrogate = true;
                            Ok(at + 6)
                        }
                    }
                    0xDC00..=0xDFFF => {
                        self.env.lone_surrogate = true;
                        Ok(at + 6)
                    }
                    _ => Ok(at + 6),
                }
            }
            _ => Err(Error::Syntax("a bad escape in a string", at)),
        }
    }

    fn number(&mut self) -> Step {
        let b = self.b;
        let digits = |mut i: usize| {
            while b.get(i).is_some_and(u8::is_ascii_digit) {
                i += 1;
            }
            i
        };
        let mut i = self.i + usize::from(b.get(self.i) == Some(&b'-'));
        i = match b.get(i) {
            Some(b'0') => i + 1,
            Some(b'1'..=b'9') => digits(i + 1),
            _ => return Err(Error::Syntax("a bad number", self.i)),
        };
        if b.get(i) == Some(&b'.') {
            let end = digits(i + 1);
            if end == i + 1 {
                return Err(Error::Syntax("a bad number", self.i));
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
                return Err(Error::Syntax("a bad number", self.i));
            }
            i = end;
        }
        self.i = i;
        Ok(())
    }

    fn literal(&mut self, word: &[u8]) -> Step {
        if !self.b[self.i..].starts_with(word) {
            return Err(self.syntax("not a JSON value"));
        }
        self.i += word.len();
        Ok(())
    }
}

fn hex4(b: &[u8], at: usize) -> Option<u16> {
    let digits = b.get(at..at + 4)?;
    let mut n = 0u16;
    for &d in digits {
        n = n << 4 | u16::from((d as char).to_digit(16)? as u8);
    }
    Some(n)
}

/// The first `"`, `\` or control character at or after `i`: eight bytes per step (each test finds the lowest
/// byte that matches exactly; a false match can only sit above a true one).
fn special(b: &[u8], mut i: usize) -> Option<usize> {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGH: u64 = 0x8080_8080_8080_8080;
    while let Some(chunk) = b.get(i..i + 8) {
        let w = u64::from_le_bytes(chunk.try_into().unwrap_or_default());
        let zero = |x: u64| x.wrapping_sub(ONES) & !x & HIGH;
        let hits = zero(w ^ (ONES * u64::from(b'"'))) | zero(w ^ (ONES * u64::from(b'\\'))) | (w.wrapping_sub(ONES * 0x20) & !w & HIGH);
        if hits != 0 {
            return Some(i + (hits.trailing_zeros() / 8) as usize);
        }
        i += 8;
    }
    b.get(i..)?.iter().position(|&c| c == b'"' || c == b'\\' || c < 0x20).map(|p| i + p)
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
            &br#"{"a":[1,-0,0.5,1e400,-2E-7,3.0e+2,true,false,null,"x\"\\\/\b\f\n\r\t\u00e9\ud83d\ude00",{}],"b":{}}"#[..],
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
        for at in 0..20 {
            for c in [b'"', b'\\', b'\n', 0x1f] {
                let mut s = vec![b'x'; 24];
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
}

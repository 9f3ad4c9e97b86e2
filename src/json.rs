//! Reading JSON that a peer or a file supplied, with one bound on nesting for the whole shim.
//!
//! The parsers (sonic-rs for a field of a request, serde_json for layers, files and records) recurse once per
//! array or object level, and so do dropping and serialising a `serde_json::Value`. A line far under the
//! size limit (20 KB of `[`) would overflow a thread's stack and abort the process, so every line is
//! measured here before any recursive parser sees it. [`MAX_DEPTH`] levels fit a 2 MiB thread stack
//! (a tokio worker's) several times over; docs/guarantees.md ("Limits on what a peer sends") says the limit.

use crate::HashMap;
use std::fmt;

use serde::de::DeserializeOwned;

mod view;
pub use view::{Elements, Key, Members, View, str_of};
#[cfg(target_arch = "x86_64")]
pub(crate) use view::{escaped_bits, sixteen_of};
pub(crate) use view::{same, write_str};

/// Deepest nesting of arrays and objects accepted anywhere: far above any real ACP frame (a tool's JSON
/// output a few dozen levels deep), and a few hundred KiB of stack for the deepest recursion (serde_json's
/// parse, about 350 bytes per level in a release build).
pub const MAX_DEPTH: usize = 1000;

/// Why JSON text could not be read.
#[derive(Debug)]
pub enum Error {
    /// Nested deeper than [`MAX_DEPTH`]: at this byte the limit was passed.
    TooDeep(usize),
    Json(serde_json::Error),
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::TooDeep(_) => write!(f, "nested deeper than {MAX_DEPTH} levels"),
            Error::Json(e) => write!(f, "{e}"),
        }
    }
}

impl std::error::Error for Error {}

/// Where `text` (JSON, or anything) first nests deeper than [`MAX_DEPTH`] arrays and objects, brackets in
/// strings not counted; `None` when it does not. Invalid JSON is measured as far as it looks like JSON: a
/// parser stops at the first invalid byte, so it never nests deeper than counted here.
///
/// On the per-frame path: a line shorter than the limit, or with fewer opening brackets than it (one
/// vectorised count), is not walked at all.
pub fn too_deep(text: &[u8]) -> Option<usize> {
    if text.len() <= MAX_DEPTH || count_openings(text) <= MAX_DEPTH {
        return None;
    }
    deepest(text)
}

/// `[` and `{` anywhere in `text`: an upper bound of its nesting. Counted in byte-sized lanes so that the
/// loop can be vectorised.
fn count_openings(text: &[u8]) -> usize {
    text.chunks(255)
        .map(|chunk| usize::from(chunk.iter().fold(0u8, |n, &b| n + u8::from((b == b'[') | (b == b'{')))))
        .sum()
}

/// The exact walk: depth outside strings; a string is skipped by searching for its closing quote (one not
/// preceded by an odd run of backslashes).
fn deepest(text: &[u8]) -> Option<usize> {
    let mut depth = 0usize;
    let mut i = 0;
    while i < text.len() {
        match text[i] {
            b'"' => loop {
                i += 1;
                i += memchr::memchr(b'"', text.get(i..)?)?;
                let backslashes = text[..i].iter().rev().take_while(|&&b| b == b'\\').count();
                if backslashes % 2 == 0 {
                    break;
                }
            },
            b'[' | b'{' => {
                depth += 1;
                if depth > MAX_DEPTH {
                    return Some(i);
                }
            }
            b']' | b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
        i += 1;
    }
    None
}

/// Where the string whose opening quote is at `open` ends: the index of its closing quote (one not escaped
/// by an odd run of backslashes), or `None` when the text ends first.
pub(crate) fn string_end(text: &[u8], open: usize) -> Option<usize> {
    let mut i = open;
    loop {
        i += 1;
        i += memchr::memchr(b'"', text.get(i..)?)?;
        let backslashes = text[..i].iter().rev().take_while(|&&b| b == b'\\').count();
        if backslashes % 2 == 0 {
            return Some(i);
        }
    }
}

/// Whether every bracket of `text` (outside strings) is closed and never closed twice, and every string
/// ends: what any JSON text does. A line too deep to parse that fails this is not JSON at all (a parse
/// error to its sender), rather than JSON over the limit. Walks the whole text: only for lines over the limit.
pub fn brackets_close(text: &[u8]) -> bool {
    let mut depth = 0usize;
    let mut i = 0;
    while i < text.len() {
        match text[i] {
            b'"' => match string_end(text, i) {
                Some(end) => i = end,
                None => return false,
            },
            b'[' | b'{' => depth += 1,
            b']' | b'}' => match depth.checked_sub(1) {
                Some(d) => depth = d,
                None => return false,
            },
            _ => {}
        }
        i += 1;
    }
    depth == 0
}

/// Parses JSON from a peer or a file into `T` (a `serde_json::Value` most often): at most [`MAX_DEPTH`]
/// deep, numbers kept with all their digits (serde_json's `arbitrary_precision`).
pub fn from_slice<T: DeserializeOwned>(text: &[u8]) -> Result<T, Error> {
    if let Some(at) = too_deep(text) {
        return Err(Error::TooDeep(at));
    }
    let mut de = serde_json::Deserializer::from_slice(text);
    // Bounded above instead: serde_json's own limit (128) would refuse what the frame check accepted.
    de.disable_recursion_limit();
    let value = T::deserialize(&mut de).map_err(Error::Json)?;
    de.end().map_err(Error::Json)?;
    Ok(value)
}

/// [`from_slice`] for text.
pub fn from_str<T: DeserializeOwned>(text: &str) -> Result<T, Error> {
    from_slice(text.as_bytes())
}

/// `text` with every UTF-16 surrogate escape that is not half of a pair (`\ud800` alone, a low half first, a
/// high half followed by anything but a low one) written `\ufffd`, U+FFFD REPLACEMENT CHARACTER, as a
/// decoder of UTF-16 would; pairs, and everything else, kept. Each escape is as long as its replacement,
/// so every byte stays where it was. JSON's grammar allows lone surrogate escapes and serde_json refuses
/// them: this is what [`crate::frame::Frame::value`] reads such a frame as. Borrowed when there is none.
///
/// Escapes are read as a JSON string reads them: `\\ud800` is an escaped backslash and the text `ud800`.
/// Outside strings there are no backslashes in JSON; in text that is not JSON nothing panics.
pub fn mend_surrogates(text: &[u8]) -> std::borrow::Cow<'_, [u8]> {
    // The code unit of the `\uXXXX` escape at `at`, if there is one.
    let unit = |at: usize| -> Option<u16> {
        match text.get(at..at + 6)? {
            [b'\\', b'u', hex @ ..] if hex.iter().all(u8::is_ascii_hexdigit) => {
                Some(hex.iter().fold(0u16, |n, &h| n << 4 | (h as char).to_digit(16).unwrap_or(0) as u16))
            }
            _ => None,
        }
    };
    let mut mended: Option<Vec<u8>> = None;
    let mut i = 0;
    while let Some(at) = text.get(i..).and_then(|rest| memchr::memchr(b'\\', rest)) {
        i += at;
        let Some(u) = unit(i) else {
            // Any other escape is two bytes (`\\`, `\"`, `\n`, …): its second byte opens no escape.
            i += 2;
            continue;
        };
        let low = |u: u16| (0xDC00..=0xDFFF).contains(&u);
        let width = match u {
            0xD800..=0xDBFF if unit(i + 6).is_some_and(low) => 12,
            0xD800..=0xDFFF => {
                mended.get_or_insert_with(|| text.to_vec())[i..i + 6].copy_from_slice(b"\\ufffd");
                6
            }
            _ => 6,
        };
        i += width;
    }
    match mended {
        Some(m) => std::borrow::Cow::Owned(m),
        None => std::borrow::Cow::Borrowed(text),
    }
}

/// How the numbers of a peer's text were spelled where serde_json spells them otherwise. Reading keeps every
/// digit (`arbitrary_precision`) but writes an exponent one way (`1e400` and `1E400` become `1e+400`); a frame a
/// layer rewrites gets back the peer's spelling of each number it did not change through [`to_vec_spelled`].
#[derive(Default)]
pub struct Spellings(HashMap<String, Option<String>>);

impl Spellings {
    /// The exponent numbers of `text` (outside strings) that serde_json would write otherwise. Empty, and no
    /// allocation, for text without one: nearly every frame.
    pub fn of(text: &[u8]) -> Spellings {
        let mut found = Spellings::default();
        let mut i = 0;
        while i < text.len() {
            match text[i] {
                b'"' => match string_end(text, i) {
                    Some(end) => i = end,
                    None => return found,
                },
                b'-' | b'0'..=b'9' => {
                    let start = i;
                    while i < text.len() && matches!(text[i], b'-' | b'+' | b'.' | b'e' | b'E' | b'0'..=b'9') {
                        i += 1;
                    }
                    found.note(&text[start..i]);
                    continue;
                }
                _ => {}
            }
            i += 1;
        }
        found
    }

    fn note(&mut self, token: &[u8]) {
        let Some(e) = token.iter().position(|&b| b == b'e' || b == b'E') else { return };
        let Ok(token) = std::str::from_utf8(token) else { return };
        let signed = matches!(token.as_bytes().get(e + 1), Some(b'+' | b'-'));
        let written = format!("{}e{}{}", &token[..e], if signed { "" } else { "+" }, &token[e + 1..]);
        if written == token {
            return;
        }
        // Two spellings of one written form: which one a number had is lost, so it keeps serde_json's.
        let entry = self.0.entry(written).or_insert_with(|| Some(token.to_owned()));
        if entry.as_deref() != Some(token) {
            *entry = None;
        }
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// Writes `value` as compact JSON, each number spelled as in [`Spellings`] where it was read from.
pub fn to_vec_spelled(value: &serde_json::Value, spellings: &Spellings) -> Vec<u8> {
    struct Spelled<'a>(&'a Spellings);
    impl serde_json::ser::Formatter for Spelled<'_> {
        fn write_number_str<W: ?Sized + std::io::Write>(&mut self, w: &mut W, number: &str) -> std::io::Result<()> {
            match self.0.0.get(number) {
                Some(Some(original)) => w.write_all(original.as_bytes()),
                _ => w.write_all(number.as_bytes()),
            }
        }
    }
    let mut out = Vec::new();
    let mut serializer = serde_json::Serializer::with_formatter(&mut out, Spelled(spellings));
    serde::Serialize::serialize(value, &mut serializer).expect("a serde_json::Value always serialises");
    out
}

/// An object of `members`, in their order, each value moved in: for a frame the shim builds around values it
/// holds (`json!` would copy each such value through a serializer).
pub fn object<const N: usize>(members: [(&str, serde_json::Value); N]) -> serde_json::Value {
    serde_json::Value::Object(members.into_iter().map(|(key, value)| (key.to_owned(), value)).collect())
}

/// The object at `key` of `map`, made (or put in place of a value that is no object) when missing: the one
/// place a layer writes into a nested object of a frame (`_meta`, `_meta.coda`).
pub fn object_at<'a>(
    map: &'a mut serde_json::Map<String, serde_json::Value>,
    key: &str,
) -> &'a mut serde_json::Map<String, serde_json::Value> {
    let slot = map.entry(key).or_insert_with(|| serde_json::Value::Object(serde_json::Map::new()));
    if !slot.is_object() {
        *slot = serde_json::Value::Object(serde_json::Map::new());
    }
    match slot {
        serde_json::Value::Object(m) => m,
        _ => unreachable!("made an object above"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Value;

    fn nest(levels: usize) -> String {
        let odd = levels % 2;
        format!("{}{}1{}{}", "[".repeat(odd), "[{\"a\":".repeat(levels / 2), "}]".repeat(levels / 2), "]".repeat(odd))
    }

    #[test]
    fn measures_nesting_outside_strings() {
        assert_eq!(too_deep(nest(MAX_DEPTH).as_bytes()), None);
        let over = nest(MAX_DEPTH + 2);
        // The 1001st opening bracket: the '[' of the 501st `[{"a":`.
        assert_eq!(too_deep(over.as_bytes()), Some(6 * 500));
        // Unclosed counts too (a parser recurses before it finds the end missing).
        assert!(too_deep("[".repeat(20_000).as_bytes()).is_some());
        assert!(too_deep("{\"a\":".repeat(20_000).as_bytes()).is_some());
        // Brackets in strings, escaped quotes included, are text.
        let in_string = format!("[\"\\\"{}\\\\\",1]", "[".repeat(5000));
        assert_eq!(too_deep(in_string.as_bytes()), None);
        let after_string = format!("[\"\\\\\"{}", "[".repeat(5000));
        assert!(too_deep(after_string.as_bytes()).is_some());
        // An unterminated string ends the walk: nothing after it can be parsed.
        assert_eq!(too_deep(format!("[\"{}", "[".repeat(5000)).as_bytes()), None);
        assert_eq!(too_deep(format!("{}\"{}\\", "[".repeat(10), "[".repeat(1000)).as_bytes()), None);
    }

    #[test]
    fn tells_unclosed_brackets_and_strings_from_closed_ones() {
        assert!(brackets_close(nest(MAX_DEPTH + 2).as_bytes()));
        assert!(brackets_close(br#"{"a":"]]}{[\"","b":[]}"#));
        assert!(!brackets_close("[".repeat(100_000).as_bytes()));
        assert!(!brackets_close(format!("{}1", "{\"a\":".repeat(5000)).as_bytes()));
        assert!(!brackets_close(b"[]]"));
        assert!(!brackets_close(b"[\"abc]"));
        assert!(!brackets_close(b"[\"abc\\\"]"));
    }

    #[test]
    fn parses_up_to_the_limit_and_refuses_beyond() {
        let v: Value = from_str(&nest(MAX_DEPTH)).expect("at the limit");
        assert!(v.is_array());
        assert!(matches!(from_str::<Value>(&nest(MAX_DEPTH + 2)), Err(Error::TooDeep(_))));
        assert!(matches!(from_str::<Value>("[1] x"), Err(Error::Json(_))));
    }

    #[test]
    fn numbers_keep_their_digits() {
        let text = r#"[1e400,-0,1.50,123456789012345678901234567890,1e-7]"#;
        let v: Value = from_str(text).unwrap();
        // serde_json writes an exponent with its sign: 1e400 comes out as 1e+400, the same number.
        assert_eq!(v.to_string(), r#"[1e+400,-0,1.50,123456789012345678901234567890,1e-7]"#);
    }

    /// Parsing, serialising and dropping a value at the limit fit the 2 MiB stack of a tokio worker,
    /// as does the envelope check of a frame that deep.
    #[test]
    fn a_value_at_the_limit_fits_a_worker_stack() {
        let text = format!(r#"{{"jsonrpc":"2.0","method":"m","params":{}}}"#, nest(MAX_DEPTH - 1));
        let done = std::thread::Builder::new()
            .stack_size(2 << 20)
            .spawn(move || {
                let frame = crate::frame::Frame::parse(text.clone().into_bytes()).expect("a frame at the limit");
                let v: Value = frame.value().clone();
                let again = serde_json::to_string(&v).unwrap();
                drop(v);
                again == text
            })
            .unwrap()
            .join();
        assert!(matches!(done, Ok(true)));
    }

    #[test]
    fn a_rewritten_number_keeps_the_peers_spelling() {
        let text = br#"{"a":1e400,"b":[2E5,-3.50e-7,7e+1,"1e9"],"c":1.50,"d":-0,"e":123456789012345678901234567890}"#;
        let spellings = Spellings::of(text);
        let mut value: Value = from_slice(text).unwrap();
        value["f"] = Value::from("added");
        let out = String::from_utf8(to_vec_spelled(&value, &spellings)).unwrap();
        assert_eq!(
            out,
            r#"{"a":1e400,"b":[2E5,-3.50e-7,7e+1,"1e9"],"c":1.50,"d":-0,"e":123456789012345678901234567890,"f":"added"}"#
        );
        assert!(Spellings::of(br#"{"a":1,"b":"1e5","c":1e+5}"#).is_empty());
    }

    #[test]
    fn lone_surrogate_escapes_are_mended_and_pairs_kept() {
        let mend = |text: &str| String::from_utf8(mend_surrogates(text.as_bytes()).into_owned()).unwrap();
        for (text, mended) in [
            // Pairs, either case, and every other escape, kept (and borrowed).
            (r#"["\ud83d\ude00"]"#, r#"["\ud83d\ude00"]"#),
            (r#"["\uD83D\uDE00","\uDbFf\uDfFf"]"#, r#"["\uD83D\uDE00","\uDbFf\uDfFf"]"#),
            (r#"["\u00e9\n\"\\\/","\uFFFD","\ud7ff\ue000"]"#, r#"["\u00e9\n\"\\\/","\uFFFD","\ud7ff\ue000"]"#),
            // A lone high half, a lone low half, either case, anywhere in the string.
            (r#"["\ud800"]"#, r#"["\ufffd"]"#),
            (r#"["a\uDC00b"]"#, r#"["a\ufffdb"]"#),
            (r#"{"\udbff":"\uDFFF"}"#, r#"{"\ufffd":"\ufffd"}"#),
            // A reversed pair is two lone halves; a high half before another high half is lone.
            (r#"["\udc00\ud800"]"#, r#"["\ufffd\ufffd"]"#),
            (r#"["\ud800\ud800\udc00"]"#, r#"["\ufffd\ud800\udc00"]"#),
            // A high half followed by text, by another escape, or by the end of the string.
            (r#"["\ud800x\udc00"]"#, r#"["\ufffdx\ufffd"]"#),
            (r#"["\ud800\n","\ud800\u0041"]"#, r#"["\ufffd\n","\ufffd\u0041"]"#),
            (r#"["\ud800","\udc00"]"#, r#"["\ufffd","\ufffd"]"#),
            // An escaped backslash followed by `ud800` is text, not an escape; after it, an escape is one.
            (r#"["\\ud800"]"#, r#"["\\ud800"]"#),
            (r#"["\\\ud800","\\\\ud800"]"#, r#"["\\\ufffd","\\\\ud800"]"#),
            (r#"["\\\\\ud800\\"]"#, r#"["\\\\\ufffd\\"]"#),
        ] {
            assert_eq!(mend(text), mended, "{text}");
            let value: Value = from_str(&mend(text)).expect("serde_json reads what is mended");
            assert_eq!(value.to_string().contains('\u{FFFD}'), mended.to_lowercase().contains("ufffd"), "{text}");
            if text == mended {
                assert!(matches!(mend_surrogates(text.as_bytes()), std::borrow::Cow::Borrowed(_)), "{text}");
            }
        }
        // Text that is not JSON, cut anywhere, never panics.
        for text in
            [r#"["\ud800\ud"#, r#"["\ud8"#, "\\", "\\u", r#""\ud800\"#, r#"\\\"#, r#"\u+fff"#, r#"\ud800\u+c00"#]
        {
            let mended = mend_surrogates(text.as_bytes());
            assert_eq!(mended.len(), text.len(), "{text}");
        }
        assert_eq!(&*mend_surrogates(br"\ud800\u+c00"), br"\ufffd\u+c00");
        assert_eq!(&*mend_surrogates(br"\ud800\ud"), br"\ufffd\ud");
    }

    #[test]
    fn two_spellings_of_one_written_form_keep_serde_jsons() {
        let text = br#"[1e5,1E5,2e5]"#;
        let value: Value = from_slice(text).unwrap();
        let out = String::from_utf8(to_vec_spelled(&value, &Spellings::of(text))).unwrap();
        assert_eq!(out, "[1e+5,1e+5,2e5]");
    }
}

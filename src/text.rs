//! The one text cutter: a prefix of a string bounded in the unit a limit is written in, never splitting a
//! character. Peer text the shim quotes (an upstream's reason, a label) is cut here, nowhere else.
//!
//! Coda counts its limits in UTF-16 code units (JavaScript's `length`), Rust strings count bytes, people
//! count characters: each limit says its unit.

use std::borrow::Cow;

/// The unit a length limit counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unit {
    /// UTF-8 bytes (what a Rust `str` and a buffer hold).
    Bytes,
    /// Unicode scalar values.
    Chars,
    /// UTF-16 code units (what JavaScript's `length` counts: a character beyond U+FFFF is two).
    Utf16,
}

impl Unit {
    fn of(self, c: char) -> usize {
        match self {
            Unit::Bytes => c.len_utf8(),
            Unit::Chars => 1,
            Unit::Utf16 => c.len_utf16(),
        }
    }
}

/// How long `s` is in `unit`.
pub fn len(s: &str, unit: Unit) -> usize {
    match unit {
        Unit::Bytes => s.len(),
        _ => s.chars().map(|c| unit.of(c)).sum(),
    }
}

/// The longest prefix of `s` at most `max` long in `unit` (a character that would cross the limit is left out
/// whole).
pub fn prefix(s: &str, max: usize, unit: Unit) -> &str {
    if unit == Unit::Bytes {
        if s.len() <= max {
            return s;
        }
        let mut end = max;
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        return &s[..end];
    }
    let mut used = 0;
    for (at, c) in s.char_indices() {
        used += unit.of(c);
        if used > max {
            return &s[..at];
        }
    }
    s
}

/// `s` cut to at most `max` in `unit`, with `…` after it where it was cut (the mark is not counted).
pub fn cut(s: &str, max: usize, unit: Unit) -> Cow<'_, str> {
    let kept = prefix(s, max, unit);
    if kept.len() == s.len() { Cow::Borrowed(s) } else { Cow::Owned(format!("{kept}…")) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_unit_cuts_at_a_character_boundary() {
        assert_eq!(cut("short", 10, Unit::Bytes), "short");
        assert_eq!(cut("ééé", 3, Unit::Bytes), "é…");
        assert_eq!(cut("ééé", 2, Unit::Chars), "éé…");
        // U+1F600 is one character, four bytes, two UTF-16 units.
        let s = "a\u{1F600}b";
        assert_eq!(prefix(s, 2, Unit::Utf16), "a");
        assert_eq!(prefix(s, 3, Unit::Utf16), "a\u{1F600}");
        assert_eq!(prefix(s, 2, Unit::Chars), "a\u{1F600}");
        assert_eq!(prefix(s, 4, Unit::Bytes), "a");
        assert_eq!((len(s, Unit::Bytes), len(s, Unit::Chars), len(s, Unit::Utf16)), (6, 3, 4));
        assert_eq!(cut(&"x".repeat(20_000), 2000, Unit::Bytes).len(), 2000 + '…'.len_utf8());
        assert_eq!(cut("", 0, Unit::Utf16), "");
        assert_eq!(cut("ab", 0, Unit::Chars), "…");
    }
}

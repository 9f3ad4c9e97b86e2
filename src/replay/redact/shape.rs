//! Placeholders for texts: the same lines, indentation and Markdown markers, each line's length rounded up to a
//! power of two, filled with words that depend on the text (equal texts get equal placeholders, different ones
//! almost surely different ones, through a hash keyed anew on each run, so nothing can be looked up).

use std::hash::{BuildHasher, Hasher};

const WORDS: [&str; 16] = [
    "lorem", "ipsum", "dolor", "sit", "amet", "elit", "sed", "do", "tempor", "magna", "aliqua", "enim", "minim",
    "quis", "nisi", "velit",
];

/// The length class of `n` characters: the next power of two (at least 4).
pub fn class(n: usize) -> usize {
    if n == 0 { 0 } else { n.next_power_of_two().max(4) }
}

/// Makes placeholders; one per redaction run.
pub struct Shaper {
    key: std::collections::hash_map::RandomState,
}

impl Default for Shaper {
    fn default() -> Shaper {
        Shaper { key: std::collections::hash_map::RandomState::new() }
    }
}

/// The start of a line that shows its shape: indentation, list and heading markers, a fence, a quote.
fn marker(line: &str) -> usize {
    let trimmed = line.trim_start();
    let indent = line.len() - trimmed.len();
    let mut n = 0;
    let b = trimmed.as_bytes();
    if trimmed.starts_with("```") {
        n = 3;
    } else {
        while n < b.len() && matches!(b[n], b'#' | b'>' | b'-' | b'*' | b'+' | b'|') {
            n += 1;
        }
        if n == 0 {
            let digits = b.iter().take_while(|c| c.is_ascii_digit()).count();
            if digits > 0 && b.get(digits) == Some(&b'.') {
                n = digits + 1;
            }
        }
        while n < b.len() && b[n] == b' ' {
            n += 1;
        }
    }
    indent + n
}

impl Shaper {
    /// The placeholder of `text`.
    pub fn text(&self, text: &str) -> String {
        let mut h = self.key.build_hasher();
        h.write(text.as_bytes());
        let mut seed = h.finish();
        let mut out = String::with_capacity(text.len() + 16);
        for (k, line) in text.split('\n').enumerate() {
            if k > 0 {
                out.push('\n');
            }
            let keep = marker(line);
            out.push_str(&line[..keep]);
            let want = class(line[keep..].chars().count());
            let start = out.len();
            while out.len() - start < want {
                if out.len() > start {
                    out.push(' ');
                }
                seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                out.push_str(WORDS[(seed >> 60) as usize]);
            }
            out.truncate(start + want);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn placeholders_keep_lines_markers_and_the_length_class() {
        let s = Shaper::default();
        let text = "# 标题 heading\n\n- a list item with secret words\n  1. nested\n```\ncode();\n```";
        let out = s.text(text);
        let lines: Vec<&str> = out.split('\n').collect();
        assert_eq!(lines.len(), 7);
        assert!(lines[0].starts_with("# ") && lines[1].is_empty() && lines[2].starts_with("- "), "{out}");
        assert!(lines[3].starts_with("  1. ") && lines[4] == "```" && lines[6] == "```", "{out}");
        assert_eq!(lines[2].len() - 2, class("a list item with secret words".len()));
        assert!(!out.contains("secret") && !out.contains("标题") && !out.contains("code"));
        assert_eq!(s.text(text), out, "equal texts, equal placeholders");
        assert_ne!(s.text("another text of its own"), s.text("another text of its owm"));
        assert_eq!(class(0), 0);
        assert_eq!(class(5), 8);
        assert_eq!(class(1000), 1024);
    }
}

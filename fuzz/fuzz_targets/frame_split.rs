//! Line splitting: any bytes, cut into any chunks, give the same non-blank lines as a plain split,
//! over-long lines reported with their length,
//! never more than the limit kept, never a panic.
#![no_main]

use coda_shim::lines::{Line, Lines};
use libfuzzer_sys::fuzz_target;

const MAX: usize = 64;

fuzz_target!(|data: &[u8]| {
    let Some((&cut, input)) = data.split_first() else { return };
    let chunk = usize::from(cut % 17) + 1;
    let mut split = Lines::new(MAX);
    let mut got = Vec::new();
    for piece in input.chunks(chunk) {
        split.push(piece);
        got.extend(std::iter::from_fn(|| split.next_line()));
    }
    got.extend(split.finish());

    // (the raw line, the line as it should come out)
    let want: Vec<(&[u8], Line)> = input
        .split(|&b| b == b'\n')
        .map(|raw| (raw, raw.strip_suffix(b"\r").unwrap_or(raw)))
        // A blank line is skipped, unless it is over the limit (then it is reported like any other).
        .filter(|(_, l)| l.len() > MAX || !l.iter().all(u8::is_ascii_whitespace))
        .map(|(raw, l)| {
            let line = if l.len() > MAX {
                Line::TooLong { head: l.to_vec(), len: l.len() }
            } else {
                Line::Text([l, b"\n"].concat().into())
            };
            (raw, line)
        })
        .collect();
    assert_eq!(got.len(), want.len());
    for (g, (raw, w)) in got.iter().zip(&want) {
        match (g, w) {
            (Line::Text(a), Line::Text(b)) => assert_eq!(a, b),
            (Line::TooLong { head, len }, Line::TooLong { len: want_len, .. }) => {
                assert_eq!(len, want_len);
                // The head is what was buffered when the line went over: the start of the raw line.
                assert!(raw.starts_with(head) && head.len() <= 4096);
            }
            _ => panic!("kinds differ: {g:?} vs {w:?}"),
        }
    }
});

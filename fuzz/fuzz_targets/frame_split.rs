//! Line splitting: any bytes, cut into any chunks, give the same non-blank lines as a plain split,
//! over-long lines reported with their length,
//! never more than the limit kept, never a panic.
#![no_main]

use coda_shim::lines::{Line, Splitter};
use libfuzzer_sys::fuzz_target;

const MAX: usize = 64;

fuzz_target!(|data: &[u8]| {
    let Some((&cut, input)) = data.split_first() else { return };
    let chunk = usize::from(cut % 17) + 1;
    let mut split = Splitter::new(MAX);
    let mut got = Vec::new();
    for piece in input.chunks(chunk) {
        let mut rest = piece;
        while !rest.is_empty() {
            let (used, line) = split.feed(rest);
            assert!(used > 0 && used <= rest.len());
            rest = &rest[used..];
            got.extend(line);
        }
    }
    got.extend(split.finish());

    let want: Vec<Line> = input
        .split(|&b| b == b'\n')
        .map(|l| l.strip_suffix(b"\r").unwrap_or(l))
        // A blank line is skipped, unless it is over the limit (then it is reported like any other).
        .filter(|l| l.len() > MAX || !l.iter().all(u8::is_ascii_whitespace))
        .map(|l| if l.len() > MAX { Line::TooLong { head: l.to_vec(), len: l.len() } } else { Line::Text(l.to_vec()) })
        .collect();
    assert_eq!(got.len(), want.len());
    for (g, w) in got.iter().zip(&want) {
        match (g, w) {
            (Line::Text(a), Line::Text(b)) => assert_eq!(a, b),
            (Line::TooLong { head, len }, Line::TooLong { head: full, len: want_len }) => {
                assert_eq!(len, want_len);
                assert!(full.starts_with(head) && head.len() <= MAX.max(4096));
            }
            _ => panic!("kinds differ: {g:?} vs {w:?}"),
        }
    }
});

//! [`super`]'s skips 64 bytes a step by AVX2, on the CPUs that have it: the end of a container and of a string
//! found from one bit per byte of the step's quotes, backslashes and brackets (simdjson's first stage, walked
//! as far as the end sought). The escaped bytes are told from the backslashes' bits ([`crate::json::escaped_bits`],
//! carried across steps); the bytes inside strings are a prefix XOR of the quotes no backslash escapes,
//! carried from step to step. Without AVX2, [`super`]'s SSE2 and byte-wise skips.

use std::arch::x86_64::*;

/// Whether this CPU has AVX2 (std keeps the answer after the first ask).
#[inline(always)]
pub(super) fn available() -> bool {
    std::arch::is_x86_feature_detected!("avx2")
}

/// Bytes past the end of the text read as this (no quote, backslash or bracket).
const PAD: u8 = b' ';

/// The bits of a step of 64 bytes from `i` of `b`: of each of `needles` (the byte at `i` lowest), and how many
/// bytes the step covers: 64, or what is left of `b` (read as the 64 that end `b`, those before `i` let go, or
/// copied into a padded block when `b` is shorter). `None` at the end of `b`.
#[target_feature(enable = "avx2")]
#[inline]
fn step<const N: usize>(b: &[u8], i: usize, needles: [u8; N]) -> Option<([u64; N], usize)> {
    let (block, skip): (&[u8], usize) = match b.get(i..i + 64) {
        Some(block) => (block, 0),
        None if i >= b.len() => return None,
        None if b.len() >= 64 => (&b[b.len() - 64..], i + 64 - b.len()),
        None => {
            let mut padded = [PAD; 64];
            padded[..b.len() - i].copy_from_slice(&b[i..]);
            return Some((masks(&padded, needles), b.len() - i));
        }
    };
    Some((masks(block, needles).map(|m| m >> skip), 64 - skip))
}

/// The bits of each of `needles` in the 64 bytes `block`.
#[target_feature(enable = "avx2")]
#[inline]
fn masks<const N: usize>(block: &[u8], needles: [u8; N]) -> [u64; N] {
    assert!(block.len() >= 64);
    // SAFETY: two unaligned loads of 32 bytes within the 64 of `block`.
    let (low, high) =
        unsafe { (_mm256_loadu_si256(block.as_ptr().cast()), _mm256_loadu_si256(block.as_ptr().add(32).cast())) };
    needles.map(|n| {
        let n = _mm256_set1_epi8(n as i8);
        let [l, h] = [low, high].map(|v| u64::from(_mm256_movemask_epi8(_mm256_cmpeq_epi8(v, n)) as u32));
        l | h << 32
    })
}

/// The bytes from each opening quote up to its closing one (not the closing quote itself) of a step whose
/// quotes no backslash escapes are `quotes`, `inside` when the step starts inside a string: with whether the
/// next starts inside one.
#[inline(always)]
fn strings(quotes: u64, inside: bool) -> (u64, bool) {
    let mut strings = quotes;
    for shift in [1, 2, 4, 8, 16, 32] {
        strings ^= strings << shift;
    }
    if inside {
        strings = !strings;
    }
    (strings, strings >> 63 == 1)
}

/// Where the container whose bracket is at `at` ends (one past its closing bracket `close`), brackets of the
/// other kind balanced inside and strings skipped whole; `None` when `b` ends first.
///
/// # Safety
/// Only where [`available`] says the CPU has AVX2.
#[target_feature(enable = "avx2")]
pub(super) unsafe fn container_end(b: &[u8], at: usize, [open, close]: [u8; 2]) -> Option<usize> {
    let (mut i, mut depth, mut inside, mut carried) = (at, 0usize, false, false);
    loop {
        let ([quotes, backslashes, opens, closes], width) = step(b, i, [b'"', b'\\', open, close])?;
        let (escaped, carry) = crate::json::escaped_bits(backslashes, carried);
        let (in_strings, next_inside) = strings(quotes & !escaped, inside);
        if let Some(k) = super::closing((opens | closes) & !in_strings, opens, &mut depth) {
            return Some(i + k + 1);
        }
        (i, inside, carried) = (i + width, next_inside, carry);
    }
}

/// Where the string whose text begins at `at` (after its opening quote) ends, its closing quote, and whether
/// the string has an escape; `None` when `b` ends first.
///
/// # Safety
/// Only where [`available`] says the CPU has AVX2.
#[target_feature(enable = "avx2")]
pub(super) unsafe fn string_end(b: &[u8], at: usize) -> Option<(usize, bool)> {
    let (mut i, mut carried, mut any) = (at, false, false);
    loop {
        let ([quotes, backslashes], width) = step(b, i, [b'"', b'\\'])?;
        let (escaped, carry) = crate::json::escaped_bits(backslashes, carried);
        let ends = quotes & !escaped;
        if ends != 0 {
            let k = ends.trailing_zeros();
            // (A backslash of this step before the quote, or of a step before: an escape carried into this
            // one is a backslash of the step before.)
            let before = if k == 0 { 0 } else { u64::MAX >> (64 - k) };
            return Some((i + k as usize, any || backslashes & before != 0));
        }
        any |= backslashes != 0;
        (i, carried) = (i + width, carry);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strings_are_the_bytes_between_quotes_carried_across_steps() {
        for (quotes, inside) in [(0b1001u64, false), (0b1001, true), (1 << 63, false), (0, true), (0b10, false)] {
            let (mut want, mut within) = (0u64, inside);
            for k in 0..64 {
                if quotes >> k & 1 == 1 {
                    within = !within;
                }
                // The opening quote is inside, the closing one not.
                if within {
                    want |= 1 << k;
                }
            }
            assert_eq!(strings(quotes, inside), (want, within), "{quotes:#b} {inside}");
        }
    }
}

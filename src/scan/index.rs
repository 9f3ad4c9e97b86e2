//! The first stage of [`super`]'s walk: which bytes of a line are quotes, backslashes, control characters or
//! not ASCII, 64 bytes at a time, as one bit per byte (simdjson's "stage 1", without its string mask: the
//! walk finds a string's end as the lowest quote or backslash bit after its start).
//!
//! One function per instruction set, chosen once at run time ([`Classify::best`]): AVX2 where the CPU has it,
//! else SSE2 (every x86_64 has it); NEON on aarch64 (every aarch64 has it); elsewhere eight bytes at a time in
//! a `u64`. Every one of them gives the same bits as the portable one (the unit tests compare them; the NEON
//! one under `qemu-aarch64`, `scripts/test-aarch64`).

/// Bytes past the end of a line read as this (a space: no quote, backslash, control character or high byte).
const PAD: u8 = b' ';

/// Fills `out` (one word per 64 bytes of `line`, the last block padded with spaces) with the bits of
/// `line`: bit `k` of a word is set when byte `k` of its block is a quote, a backslash or a control
/// character (below 0x20); true when the line is ASCII.
#[derive(Clone, Copy)]
pub struct Classify(fn(&[u8], &mut [u64]) -> bool);

impl std::fmt::Debug for Classify {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Classify")
    }
}

impl Classify {
    /// The fastest this CPU runs.
    pub fn best() -> Classify {
        #[cfg(target_arch = "x86_64")]
        let best = if std::arch::is_x86_feature_detected!("avx2") { Classify(x86::avx2) } else { Classify(x86::sse2) };
        #[cfg(target_arch = "aarch64")]
        let best = Classify(arm::neon);
        #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
        let best = Classify(portable);
        best
    }

    /// Every implementation this CPU runs, by name (for the tests that compare them).
    pub fn all() -> Vec<(&'static str, Classify)> {
        #[allow(unused_mut)]
        let mut all = vec![("portable", Classify(portable))];
        #[cfg(target_arch = "x86_64")]
        {
            all.push(("sse2", Classify(x86::sse2)));
            if std::arch::is_x86_feature_detected!("avx2") {
                all.push(("avx2", Classify(x86::avx2)));
            }
        }
        #[cfg(target_arch = "aarch64")]
        all.push(("neon", Classify(arm::neon)));
        all
    }

    /// [`Classify`] for `line` into `out`, which has room for `line.len().div_ceil(64)` words.
    #[inline(always)]
    pub fn run(self, line: &[u8], out: &mut [u64]) -> bool {
        (self.0)(line, out)
    }
}

/// Runs `$one` on each 64-byte block of `$line` (a slice of exactly 64 bytes) and puts the bits it returns
/// in `$out`, a word per block. The last block, when it is short, is read as the line's last 64 bytes (its bits
/// shifted down to where the block starts; the bytes past the end read as none), or, in a line shorter than
/// that, copied into a padded buffer. A macro rather than a function taking a closure: a closure does not
/// take the instruction set of the function it is written in, and its intrinsics would be calls.
macro_rules! each {
    ($line:expr, $out:expr, |$bytes:ident| $one:expr) => {{
        let (line, out): (&[u8], &mut [u64]) = ($line, $out);
        let mut blocks = line.chunks_exact(64);
        let mut words = out.iter_mut();
        for (block, word) in (&mut blocks).zip(&mut words) {
            let $bytes: &[u8] = block;
            *word = $one;
        }
        let rest = blocks.remainder().len();
        if let Some(word) = words.next().filter(|_| rest > 0) {
            *word = if line.len() >= 64 {
                let $bytes: &[u8] = &line[line.len() - 64..];
                ($one) >> (64 - rest)
            } else {
                let mut padded = [PAD; 64];
                padded[..rest].copy_from_slice(line);
                let $bytes: &[u8] = &padded;
                $one
            };
        }
    }};
}

/// Eight bytes at a time in a `u64`, exactly (no carry crosses a byte): the reference for the others.
pub fn portable(line: &[u8], out: &mut [u64]) -> bool {
    const HIGH: u64 = 0x8080_8080_8080_8080;
    let mut any = 0;
    each!(line, out, |bytes| {
        const LOW7: u64 = 0x7F7F_7F7F_7F7F_7F7F;
        const ONES: u64 = 0x0101_0101_0101_0101;
        // The high bit of each byte of `x` that is zero.
        let zero = |x: u64| !(((x & LOW7) + LOW7) | x) & HIGH;
        // The high bits of the eight bytes as the low eight bits (each partial product lands on a bit of its
        // own, so none carries).
        let gather = |m: u64| (m >> 7).wrapping_mul(0x0102_0408_1020_4080) >> 56;
        let mut bits = 0;
        for (k, eight) in bytes.chunks_exact(8).enumerate() {
            let w = u64::from_le_bytes(eight.try_into().unwrap_or_default());
            any |= w;
            let special =
                zero(w ^ (ONES * u64::from(b'"'))) | zero(w ^ (ONES * u64::from(b'\\'))) | zero(w & (ONES * 0xE0));
            bits |= gather(special) << (8 * k);
        }
        bits
    });
    any & HIGH == 0
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::PAD;
    use std::arch::x86_64::*;

    /// The masks of a block's two halves as one word. Through an opaque value: LLVM otherwise sees the two
    /// masks as vectors of 32 booleans, joins them, and takes the 64 apart bit by bit (a few hundred
    /// instructions per block instead of a dozen).
    #[inline(always)]
    fn join(low: u32, high: u32) -> u64 {
        u64::from(low) | u64::from(std::hint::black_box(high)) << 32
    }

    pub fn sse2(line: &[u8], out: &mut [u64]) -> bool {
        // SAFETY: SSE2 is part of every x86_64 CPU.
        unsafe { sse2_blocks(line, out) }
    }

    /// Quotes, backslashes and control characters of 16 bytes.
    #[target_feature(enable = "sse2")]
    #[inline]
    fn sse2_special(v: __m128i) -> u32 {
        let (quote, backslash, below) = (_mm_set1_epi8(b'"' as i8), _mm_set1_epi8(b'\\' as i8), _mm_set1_epi8(0x1F));
        let special = _mm_or_si128(
            _mm_or_si128(_mm_cmpeq_epi8(v, quote), _mm_cmpeq_epi8(v, backslash)),
            _mm_cmpeq_epi8(_mm_min_epu8(v, below), v),
        );
        u32::from(_mm_movemask_epi8(special) as u16)
    }

    #[target_feature(enable = "sse2")]
    fn sse2_blocks(line: &[u8], out: &mut [u64]) -> bool {
        let mut any = _mm_setzero_si128();
        each!(line, out, |bytes| {
            // SAFETY: four unaligned loads of 16 bytes within the 64.
            let v: [__m128i; 4] =
                std::array::from_fn(|k| unsafe { _mm_loadu_si128(bytes.as_ptr().add(16 * k).cast()) });
            any = _mm_or_si128(any, _mm_or_si128(_mm_or_si128(v[0], v[1]), _mm_or_si128(v[2], v[3])));
            let m = [sse2_special(v[0]), sse2_special(v[1]), sse2_special(v[2]), sse2_special(v[3])];
            join(m[0] | m[1] << 16, m[2] | m[3] << 16)
        });
        _mm_movemask_epi8(any) == 0
    }

    pub fn avx2(line: &[u8], out: &mut [u64]) -> bool {
        // SAFETY: chosen only where the CPU has AVX2 (`Classify::best`, `Classify::all`).
        unsafe { avx2_blocks(line, out) }
    }

    /// Quotes, backslashes and control characters of 32 bytes.
    #[target_feature(enable = "avx2")]
    #[inline]
    fn avx2_special(v: __m256i) -> u32 {
        let quote = _mm256_set1_epi8(b'"' as i8);
        let backslash = _mm256_set1_epi8(b'\\' as i8);
        let below = _mm256_set1_epi8(0x1F);
        let special = _mm256_or_si256(
            _mm256_or_si256(_mm256_cmpeq_epi8(v, quote), _mm256_cmpeq_epi8(v, backslash)),
            _mm256_cmpeq_epi8(_mm256_min_epu8(v, below), v),
        );
        _mm256_movemask_epi8(special) as u32
    }

    #[target_feature(enable = "avx2")]
    fn avx2_blocks(line: &[u8], out: &mut [u64]) -> bool {
        let mut any = _mm256_setzero_si256();
        each!(line, out, |bytes| {
            // SAFETY: two unaligned loads of 32 bytes within the 64.
            let (low, high) = unsafe {
                (_mm256_loadu_si256(bytes.as_ptr().cast()), _mm256_loadu_si256(bytes.as_ptr().add(32).cast()))
            };
            any = _mm256_or_si256(any, _mm256_or_si256(low, high));
            join(avx2_special(low), avx2_special(high))
        });
        _mm256_movemask_epi8(any) == 0
    }
}

#[cfg(target_arch = "aarch64")]
mod arm {
    use super::PAD;
    use std::arch::aarch64::*;

    pub fn neon(line: &[u8], out: &mut [u64]) -> bool {
        // SAFETY: NEON is part of every aarch64 CPU Rust targets.
        unsafe { neon_blocks(line, out) }
    }

    #[target_feature(enable = "neon")]
    fn neon_blocks(line: &[u8], out: &mut [u64]) -> bool {
        // Byte k of a 16-byte lane keeps bit k % 8; three pairwise additions then sum each run of eight
        // bytes into one byte of the 64-bit mask (no two bits meet, so no sum carries).
        let weights: [u8; 16] = [1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128];
        // SAFETY: 16 bytes of a local array.
        let weights = unsafe { vld1q_u8(weights.as_ptr()) };
        let (quote, backslash, space) = (vdupq_n_u8(b'"'), vdupq_n_u8(b'\\'), vdupq_n_u8(0x20));
        let mut any = vdupq_n_u8(0);
        each!(line, out, |bytes| {
            let mut m = [vdupq_n_u8(0); 4];
            for (k, m) in m.iter_mut().enumerate() {
                // SAFETY: 16 bytes at 16 * k of 64.
                let v = unsafe { vld1q_u8(bytes.as_ptr().add(16 * k)) };
                any = vorrq_u8(any, v);
                let special = vorrq_u8(vorrq_u8(vceqq_u8(v, quote), vceqq_u8(v, backslash)), vcltq_u8(v, space));
                *m = vandq_u8(special, weights);
            }
            let ab = vpaddq_u8(vpaddq_u8(m[0], m[1]), vpaddq_u8(m[2], m[3]));
            vgetq_lane_u64(vreinterpretq_u64_u8(vpaddq_u8(ab, ab)), 0)
        });
        vmaxvq_u8(any) < 0x80
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each byte value at each position, and lines of every length around the block size: the same bits
    /// from every implementation as from a byte-by-byte reading.
    #[test]
    fn every_implementation_gives_the_bits_of_each_byte() {
        let by_byte = |line: &[u8]| -> (Vec<u64>, bool) {
            let blocks = line.len().div_ceil(64);
            let bits = (0..blocks)
                .map(|k| {
                    (0..64).fold(0u64, |bits, bit| {
                        let c = line.get(k * 64 + bit).copied().unwrap_or(PAD);
                        bits | u64::from(c == b'"' || c == b'\\' || c < 0x20) << bit
                    })
                })
                .collect();
            (bits, line.is_ascii())
        };
        let mut lines: Vec<Vec<u8>> = Vec::new();
        for c in 0..=255u8 {
            for at in [0, 1, 7, 8, 15, 16, 31, 32, 33, 63, 64, 100, 127] {
                let mut line = vec![b'a'; 128];
                line[at] = c;
                line[(at + 17) % 128] = c.wrapping_mul(7);
                lines.push(line);
            }
        }
        let mut seed = 0x9E37_79B9_7F4A_7C15u64;
        for len in [0, 1, 63, 64, 65, 127, 128, 129, 200, 511, 512, 513, 1000] {
            for _ in 0..8 {
                lines.push(
                    (0..len)
                        .map(|_| {
                            seed ^= seed << 13;
                            seed ^= seed >> 7;
                            seed ^= seed << 17;
                            b"\"\\\x00\x1f \x7f\x80\xff{a\x20\x21\x5b\x5d"[(seed % 14) as usize]
                        })
                        .collect(),
                );
            }
        }
        for (name, classify) in Classify::all() {
            for line in &lines {
                // One word more than the line needs: it is left as it was.
                let mut got = vec![7; line.len().div_ceil(64) + 1];
                let ascii = classify.run(line, &mut got);
                let (want, want_ascii) = by_byte(line);
                assert_eq!(got.pop(), Some(7), "{name}: {line:?}");
                assert_eq!((got, ascii), (want, want_ascii), "{name}: {line:?}");
            }
        }
    }
}

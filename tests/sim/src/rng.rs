//! The one seeded generator of a run (fastrand's wyrand, pinned by Cargo.lock): every choice and delay of both
//! players comes from it, so a seed is a run.

pub struct Rng(fastrand::Rng);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(fastrand::Rng::with_seed(seed))
    }

    /// A number in `0..n` (n > 0).
    pub fn below(&mut self, n: u32) -> u32 {
        self.0.u32(0..n)
    }

    /// A number in `lo..hi` (lo < hi).
    pub fn range(&mut self, lo: u32, hi: u32) -> u32 {
        self.0.u32(lo..hi)
    }

    /// True `percent` times in a hundred.
    pub fn chance(&mut self, percent: u32) -> bool {
        self.below(100) < percent
    }
}

use std::sync::atomic::{AtomicU64, Ordering};

/// Generates fast, non-cryptographic random numbers (wyrand), shareable between threads.
///
/// The state is one `AtomicU64` advanced with a single `fetch_add`, so drawing never
/// locks, never allocates and never loops; concurrent callers get distinct values. Good
/// enough for jitter and sampling, not for anything secret.
#[derive(Debug)]
pub struct FastRng(AtomicU64);

const WY_INCREMENT: u64 = 0xa076_1d64_78bd_642f;
const WY_XOR: u64 = 0xe703_7ed1_a0b4_28db;

impl FastRng {
    /// A generator with a fixed seed (reproducible sequences, for tests).
    pub const fn with_seed(seed: u64) -> Self {
        Self(AtomicU64::new(seed))
    }

    /// Restarts the sequence at `seed` (tests that need a component's jitter fixed).
    #[cfg(test)]
    pub(crate) fn reseed(&self, seed: u64) {
        self.0.store(seed, Ordering::Relaxed);
    }

    /// A generator seeded from the operating system's randomness.
    pub fn new() -> Self {
        Self::with_seed(rand::random())
    }

    /// A uniformly distributed `u64`.
    pub fn next_u64(&self) -> u64 {
        let s = self.0.fetch_add(WY_INCREMENT, Ordering::Relaxed).wrapping_add(WY_INCREMENT);
        let t = u128::from(s) * u128::from(s ^ WY_XOR);
        ((t >> 64) as u64) ^ (t as u64)
    }

    /// A uniformly distributed integer in `0..bound` (0 when `bound` is 0), by the
    /// multiply-shift method (no division, no loop).
    pub fn below(&self, bound: u64) -> u64 {
        ((u128::from(self.next_u64()) * u128::from(bound)) >> 64) as u64
    }

    /// A uniformly distributed float in `[0, 1)`.
    pub fn next_f64(&self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }
}

impl Default for FastRng {
    fn default() -> Self {
        Self::new()
    }
}

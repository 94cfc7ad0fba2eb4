use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};
use std::time::Duration;

use super::FastRng;

/// How a backoff delay is drawn below its exponential ceiling.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Jitter {
    /// `uniform(0, ceiling)`: AWS "full jitter", the default; spreads retries of many
    /// clients so they do not arrive together.
    Full,
    /// Exactly the ceiling. Deterministic; for tests and for callers that jitter elsewhere.
    None,
}

/// Computes retry delays: exponential growth with full jitter.
///
/// `delay(n) = uniform(0, min(cap, base × 2^n))` for the `n`-th retry (0-based), after
/// AWS's "Exponential Backoff And Jitter" (full jitter). Base and cap can be changed live;
/// drawing a delay never allocates or locks.
#[derive(Debug)]
pub struct Backoff {
    base_ns: AtomicU64,
    cap_ns: AtomicU64,
    jitter: AtomicU8,
    rng: FastRng,
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

impl Backoff {
    /// A full-jitter backoff with `base` and `cap`, seeded from the OS.
    pub fn new(base: Duration, cap: Duration) -> Self {
        Self::with_rng(base, cap, Jitter::Full, FastRng::new())
    }

    /// A backoff with an explicit jitter mode and random source.
    pub fn with_rng(base: Duration, cap: Duration, jitter: Jitter, rng: FastRng) -> Self {
        let b = Self { base_ns: AtomicU64::new(0), cap_ns: AtomicU64::new(0), jitter: AtomicU8::new(0), rng };
        b.set(base, cap, jitter);
        b
    }

    /// Changes base, cap and jitter for the delays drawn from now on.
    pub fn set(&self, base: Duration, cap: Duration, jitter: Jitter) {
        self.base_ns.store(nanos(base), Ordering::Relaxed);
        self.cap_ns.store(nanos(cap), Ordering::Relaxed);
        self.jitter.store(matches!(jitter, Jitter::None) as u8, Ordering::Relaxed);
    }

    /// Restarts the jitter's random sequence at `seed` (tests).
    #[cfg(test)]
    pub(crate) fn reseed(&self, seed: u64) {
        self.rng.reseed(seed);
    }

    /// The jitter mode.
    pub fn jitter(&self) -> Jitter {
        if self.jitter.load(Ordering::Relaxed) == 1 { Jitter::None } else { Jitter::Full }
    }

    /// The ceiling of the `n`-th retry's delay: `min(cap, base × 2^n)`, saturating.
    pub fn ceiling(&self, n: u32) -> Duration {
        let base = self.base_ns.load(Ordering::Relaxed);
        let cap = self.cap_ns.load(Ordering::Relaxed);
        let grown = if n >= 64 { u64::MAX } else { base.saturating_mul(1u64 << n) };
        Duration::from_nanos(grown.min(cap))
    }

    /// The delay before the `n`-th retry (0-based): `uniform(0, ceiling(n))` with full
    /// jitter, `ceiling(n)` without.
    pub fn delay(&self, n: u32) -> Duration {
        let ceiling = self.ceiling(n);
        if self.jitter.load(Ordering::Relaxed) == 1 {
            return ceiling;
        }
        Duration::from_nanos(self.rng.below(nanos(ceiling)))
    }
}

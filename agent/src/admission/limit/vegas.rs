use std::time::Duration;

use crate::policy::{self, defaults as d};
use crate::retry::FastRng;

use super::Sample;

/// `max(1, ⌊log10 n⌋)`: upstream's `Log10RootIntFunction` (baseline 0).
pub(crate) fn log10_root(n: u32) -> u32 {
    n.checked_ilog10().unwrap_or(0).max(1)
}

/// Estimates the queue at the service from how far the round trip is above its no-load
/// value, and keeps it between two thresholds (Netflix concurrency-limits `VegasLimit`,
/// TCP Vegas; same parameter names and defaults, with `log10` =
/// `max(1, ⌊log10 limit⌋)`).
///
/// Per window: `queue = ⌈limit × (1 − rtt_noload / rtt)⌉`; on a drop
/// `limit − log10(limit)`; else, when busy enough (`in_flight × 2 ≥ limit`): `queue ≤
/// log10` → `limit + 6·log10`; `queue < 3·log10` → `limit + log10`; `queue > 6·log10` →
/// `limit − log10`; otherwise unchanged. Then clamped to `[min, max]` and smoothed
/// (`smoothing`, Vegas default 1.0). `rtt_noload` is the smallest RTT seen; every
/// `probe_multiplier × limit × jitter` windows (jitter uniform in `[0.5, 1)`) it is
/// measured afresh (at the first window that may teach it, see below).
///
/// Deliberate differences: the no-load RTT is taken from each window's *smallest* round
/// trip (not its average), so a probe during an overload does not adopt an inflated
/// baseline and let the limit climb (upstream issue #165), and a probe waits for a window
/// that may teach a baseline ([`teaches_baseline`](super::teaches_baseline), the rule of
/// AIMD and Gradient2: under a sustained overload even the smallest round trip of a window
/// holds queueing, and adopting it let the limit creep up); a window whose average RTT
/// reached ¾ of `timeout` counts as a drop (slow answers are a signal, see
/// [`slowness`](super::slowness)); the lower bound is `min_limit` (upstream: 1).
#[derive(Clone, Debug)]
pub struct Vegas {
    estimated: f64,
    rtt_noload: Duration,
    min: u32,
    max: u32,
    smoothing: f64,
    timeout: Duration,
    probe_multiplier: f64,
    probe_count: u32,
    probe_jitter: f64,
    rng_seed: u64,
}

impl PartialEq for Vegas {
    fn eq(&self, other: &Self) -> bool {
        self.estimated == other.estimated && self.rtt_noload == other.rtt_noload
    }
}

impl Vegas {
    /// Starts at `initial_limit` clamped into `[min_limit, max_limit]`, with a random probe
    /// jitter.
    pub fn new(settings: &policy::Limit) -> Self {
        Self::with_seed(settings, settings.initial_limit, rand::random())
    }

    /// Starts at `limit` (clamped), drawing probe jitter from a generator seeded with
    /// `seed` (reproducible, for tests).
    pub fn with_seed(settings: &policy::Limit, limit: u32, seed: u64) -> Self {
        let (min, max) = super::bounds(settings);
        let mut v = Self {
            estimated: f64::from(limit.clamp(min, max)),
            rtt_noload: Duration::ZERO,
            min,
            max,
            smoothing: settings.smoothing.unwrap_or(d::VEGAS_SMOOTHING),
            timeout: settings.timeout,
            probe_multiplier: f64::from(d::VEGAS_PROBE_MULTIPLIER),
            probe_count: 0,
            probe_jitter: 1.0,
            rng_seed: seed,
        };
        v.reset_probe_jitter();
        v
    }

    fn reset_probe_jitter(&mut self) {
        let rng = FastRng::with_seed(self.rng_seed);
        self.probe_jitter = 0.5 + rng.next_f64() * 0.5;
        self.rng_seed = rng.next_u64();
    }

    /// The current limit.
    pub fn limit(&self) -> u32 {
        self.estimated as u32
    }

    /// The no-load round trip (zero before the first sample).
    pub fn rtt_noload(&self) -> Duration {
        self.rtt_noload
    }

    /// Applies one window of samples; returns the new limit.
    pub fn update(&mut self, s: &Sample) -> u32 {
        let estimated = self.estimated;
        self.probe_count += 1;
        if self.probe_jitter * self.probe_multiplier * estimated <= f64::from(self.probe_count)
            && super::teaches_baseline(s, estimated as u32, self.min, self.timeout, self.rtt_noload)
        {
            self.reset_probe_jitter();
            self.probe_count = 0;
            self.rtt_noload = s.min_rtt;
            return estimated as u32;
        }
        if self.rtt_noload.is_zero() || s.min_rtt < self.rtt_noload {
            self.rtt_noload = s.min_rtt;
            return estimated as u32;
        }
        let dropped = s.dropped || super::slow_as_a_drop(s.rtt, self.timeout);
        let log = f64::from(log10_root(estimated as u32));
        let new = if dropped {
            estimated - log
        } else if f64::from(s.in_flight) * 2.0 < estimated {
            return estimated as u32;
        } else {
            let rtt = s.rtt.as_nanos().max(1) as f64;
            let queue = (estimated * (1.0 - self.rtt_noload.as_nanos() as f64 / rtt)).ceil();
            let (alpha, beta, threshold) = (3.0 * log, 6.0 * log, log);
            if queue <= threshold {
                estimated + beta
            } else if queue < alpha {
                estimated + log
            } else if queue > beta {
                estimated - log
            } else {
                return estimated as u32;
            }
        };
        let clamped = new.clamp(f64::from(self.min), f64::from(self.max));
        self.estimated = (1.0 - self.smoothing) * estimated + self.smoothing * clamped;
        self.estimated as u32
    }
}

use std::time::Duration;

use crate::policy::{self, defaults as d};

use super::Sample;

/// Samples averaged arithmetically before the long RTT becomes an exponential average
/// (upstream's `ExpAvgMeasurement` warm-up).
const WARMUP_SAMPLES: u32 = 10;

/// Estimates the limit from the ratio of the long-term to the short-term round trip
/// (Netflix concurrency-limits `Gradient2Limit`, same parameter names and defaults).
///
/// Per window, with `short` the window's average RTT and `long` an exponential average of
/// past windows (`long_window` samples, arithmetic over the first ten):
///
/// * `gradient = clamp(rtt_tolerance × long / short, 0.5, 1)`;
/// * `new = limit × gradient + queue_size`, then
///   `limit = limit × (1 − smoothing) + new × smoothing`, clamped to `[min, max]`;
/// * when `long / short > 2` (latency came back down after a long overload) `long` is
///   multiplied by 0.95 so it follows quickly;
/// * while the service uses less than half the limit (`in_flight < limit / 2`) the limit
///   does not move (it is app-limited: no evidence either way).
///
/// Deliberate differences, each from a misbehaviour reported upstream:
/// * a window with a drop takes the largest decrease (`gradient = 0.5`): upstream ignores
///   drops, whose near-zero RTT then *raises* the limit (issue #176);
/// * slow answers are a signal, not only timeouts: the gradient is at most
///   `1 − slowness / 2` ([`slowness`](super::slowness): 0 up to half of `timeout`, 1 at
///   it), so a window at the timeout is a drop and a service answering every request just
///   under it backs off instead of growing to the maximum (issue #137, where only
///   `rtt ≥ timeout` counted);
/// * the long RTT learns only from windows that may teach a baseline
///   ([`teaches_baseline`](super::teaches_baseline), AIMD's rule too): not busy, or at
///   `min_limit`, or faster than the long RTT — and then at most `rtt_tolerance × long`
///   from one window. Upstream learns every window, so under a sustained overload the
///   long RTT absorbs the queueing, the gradient returns to 1 and the limit climbs back to
///   the maximum (issue #88; a 4-worker service under 250 clients went from 11 to 107 in
///   five minutes). A lasting change of the service's own latency is still learnt when the
///   limit has room again or reaches its minimum.
#[derive(Clone, Debug, PartialEq)]
pub struct Gradient2 {
    estimated: f64,
    long_rtt_ns: f64,
    samples: u32,
    min: u32,
    max: u32,
    smoothing: f64,
    factor: f64,
    tolerance: f64,
    queue_size: f64,
    timeout: Duration,
}

impl Gradient2 {
    /// Starts at `initial_limit` clamped into `[min_limit, max_limit]`.
    pub fn new(settings: &policy::Limit) -> Self {
        Self::starting_at(settings, settings.initial_limit)
    }

    /// Starts at `limit` (clamped), with no RTT history.
    pub fn starting_at(settings: &policy::Limit, limit: u32) -> Self {
        let (min, max) = super::bounds(settings);
        Self {
            estimated: f64::from(limit.clamp(min, max)),
            long_rtt_ns: 0.0,
            samples: 0,
            min,
            max,
            smoothing: settings.smoothing.unwrap_or(d::LIMIT_SMOOTHING),
            factor: 2.0 / (f64::from(settings.long_window) + 1.0),
            tolerance: settings.rtt_tolerance,
            queue_size: f64::from(settings.queue_size),
            timeout: settings.timeout,
        }
    }

    /// The current limit.
    pub fn limit(&self) -> u32 {
        self.estimated as u32
    }

    /// The long-term RTT estimate (zero before the first sample).
    pub fn long_rtt(&self) -> Duration {
        Duration::from_nanos(self.long_rtt_ns as u64)
    }

    fn learn(&mut self, short: f64) -> f64 {
        if self.samples < WARMUP_SAMPLES {
            self.samples += 1;
            let n = f64::from(self.samples);
            self.long_rtt_ns = (self.long_rtt_ns * (n - 1.0) + short) / n;
        } else {
            let bounded = short.min(self.long_rtt_ns * self.tolerance);
            self.long_rtt_ns = self.long_rtt_ns * (1.0 - self.factor) + bounded * self.factor;
        }
        self.long_rtt_ns
    }

    /// Applies one window of samples; returns the new limit.
    pub fn update(&mut self, s: &Sample) -> u32 {
        let estimated = self.estimated;
        let slowness = super::slowness(s.rtt, self.timeout);
        let gradient = if s.dropped || slowness >= 1.0 {
            0.5
        } else {
            let short = (s.rtt.as_nanos() as f64).max(1.0);
            if super::teaches_baseline(s, estimated as u32, self.min, self.timeout, self.long_rtt()) {
                self.learn(short);
            }
            let long = self.long_rtt_ns;
            if long / short > 2.0 {
                self.long_rtt_ns *= 0.95;
            }
            if f64::from(s.in_flight) < estimated / 2.0 {
                return estimated as u32;
            }
            (self.tolerance * long / short).clamp(0.5, 1.0).min(1.0 - slowness / 2.0)
        };
        let target = estimated * gradient + self.queue_size;
        let smoothed = estimated * (1.0 - self.smoothing) + target * self.smoothing;
        self.estimated = smoothed.clamp(f64::from(self.min), f64::from(self.max));
        self.estimated as u32
    }
}

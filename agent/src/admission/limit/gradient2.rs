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
/// * a window with a drop, or whose average RTT reached `timeout`, takes the largest
///   decrease (`gradient = 0.5`) and its RTT is not learned: upstream ignores drops, whose
///   near-zero RTT then *raises* the limit (issue #176), and a service answering every
///   request at a constant timeout looked healthy and grew to the maximum (issue #137);
/// * the long RTT learns at most `rtt_tolerance × long` from one window, so a sustained
///   overload cannot drag the baseline up at full speed and let the limit drift back to
///   the maximum (the drift of issue #88 and PR #134's discussion); a lasting change of the
///   baseline is still followed, more slowly.
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
        let gradient = if s.dropped || s.rtt >= self.timeout {
            0.5
        } else {
            let short = (s.rtt.as_nanos() as f64).max(1.0);
            let long = self.learn(short);
            if long / short > 2.0 {
                self.long_rtt_ns *= 0.95;
            }
            if f64::from(s.in_flight) < estimated / 2.0 {
                return estimated as u32;
            }
            (self.tolerance * long / short).clamp(0.5, 1.0)
        };
        let target = estimated * gradient + self.queue_size;
        let smoothed = estimated * (1.0 - self.smoothing) + target * self.smoothing;
        self.estimated = smoothed.clamp(f64::from(self.min), f64::from(self.max));
        self.estimated as u32
    }
}

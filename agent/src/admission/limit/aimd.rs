use crate::policy;

use super::Sample;

/// Adjusts a concurrency limit by additive increase, multiplicative decrease (Netflix
/// concurrency-limits `AIMDLimit`, same parameter names and defaults).
///
/// Per window: on a drop, or when the window's average round trip exceeds `timeout`,
/// `limit × backoff_ratio` (truncated); otherwise, when the service was busy enough to
/// need the limit (`in_flight × 2 ≥ limit`), `limit + 1`; else unchanged. The result is
/// clamped to `[min_limit, max_limit]`. Upstream once also halved the limit whenever it
/// reached the maximum, which made it oscillate (its issue #155, removed in #174); this
/// rule never does.
#[derive(Clone, Debug, PartialEq)]
pub struct Aimd {
    limit: u32,
    min: u32,
    max: u32,
    backoff_ratio: f64,
    timeout: std::time::Duration,
}

impl Aimd {
    /// Starts at `initial_limit` clamped into `[min_limit, max_limit]`.
    pub fn new(settings: &policy::Limit) -> Self {
        Self::starting_at(settings, settings.initial_limit)
    }

    /// Starts at `limit` (clamped) with the other parameters from `settings`.
    pub fn starting_at(settings: &policy::Limit, limit: u32) -> Self {
        let (min, max) = super::bounds(settings);
        Self {
            limit: limit.clamp(min, max),
            min,
            max,
            backoff_ratio: settings.backoff_ratio,
            timeout: settings.timeout,
        }
    }

    /// The current limit.
    pub fn limit(&self) -> u32 {
        self.limit
    }

    /// Applies one window of samples; returns the new limit.
    pub fn update(&mut self, s: &Sample) -> u32 {
        let mut limit = self.limit;
        if s.dropped || s.rtt > self.timeout {
            limit = (f64::from(limit) * self.backoff_ratio) as u32;
        } else if u64::from(s.in_flight) * 2 >= u64::from(limit) {
            limit = limit.saturating_add(1);
        }
        self.limit = limit.clamp(self.min, self.max);
        self.limit
    }
}

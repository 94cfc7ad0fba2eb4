use std::time::Duration;

use crate::policy;

use super::Sample;

/// Adjusts a concurrency limit by additive increase, multiplicative decrease (Netflix
/// concurrency-limits `AIMDLimit`, same parameter names and defaults, plus a latency
/// signal).
///
/// Per window, with `busy` = the service needed the limit (`in_flight × 2 ≥ limit`):
/// on a drop, when the window's average round trip reaches ¾ of `timeout` (slow answers
/// are a signal, see [`slowness`](super::slowness)), or when the limit
/// was reached (`in_flight ≥ limit`) and the average round trip exceeds `rtt_tolerance ×`
/// the no-load round trip (below), `limit × backoff_ratio` (truncated); otherwise, when
/// busy, `limit + 1`; else unchanged. The result is clamped to `[min_limit, max_limit]`.
/// Latency only counts when the limit was reached: a round trip that grows while the
/// limit has room (a slower mix of requests, a slow dependency) is not caused by
/// admitting too much, and lowering the limit would only shed.
///
/// **No-load round trip**: the average round trip of the last window that may teach it
/// ([`teaches_baseline`](super::teaches_baseline), the rule Gradient2 follows too): not
/// busy, or at `min_limit`, or faster than the estimate; never a window with a drop or a
/// slow one. (Learning only from the minimum and from
/// faster windows was measured too: no better on the harness, and one unusually fast
/// window would then push the limit down to its minimum before it is corrected.)
///
/// Why the latency signal (not upstream): upstream AIMD backs off only on drops and on a
/// fixed `timeout` (5 s). A service that queues in its own thread pool behind the limit
/// answers slowly but never drops, so that rule climbs to `max_limit` and the queue it
/// cannot see grows (docs/benchmarks.md, "Overload"). Upstream once also halved the limit
/// whenever it reached the maximum, which made it oscillate (its issue #155, removed in
/// #174); this rule never does.
#[derive(Clone, Debug, PartialEq)]
pub struct Aimd {
    limit: u32,
    min: u32,
    max: u32,
    backoff_ratio: f64,
    timeout: Duration,
    tolerance: f64,
    noload: Duration,
}

impl Aimd {
    /// Starts at `initial_limit` clamped into `[min_limit, max_limit]`.
    pub fn new(settings: &policy::Limit) -> Self {
        Self::starting_at(settings, settings.initial_limit)
    }

    /// Starts at `limit` (clamped) with the other parameters from `settings`, with no
    /// round trip learnt.
    pub fn starting_at(settings: &policy::Limit, limit: u32) -> Self {
        let (min, max) = super::bounds(settings);
        Self {
            limit: limit.clamp(min, max),
            min,
            max,
            backoff_ratio: settings.backoff_ratio,
            timeout: settings.timeout,
            tolerance: settings.rtt_tolerance,
            noload: Duration::ZERO,
        }
    }

    /// The current limit.
    pub fn limit(&self) -> u32 {
        self.limit
    }

    /// The no-load round trip learnt so far (zero before the first window).
    pub fn rtt_noload(&self) -> Duration {
        self.noload
    }

    /// Applies one window of samples; returns the new limit.
    pub fn update(&mut self, s: &Sample) -> u32 {
        let old = self.limit;
        let busy = u64::from(s.in_flight) * 2 >= u64::from(old);
        let too_slow = super::slow_as_a_drop(s.rtt, self.timeout);
        let slow = s.in_flight >= old
            && !self.noload.is_zero()
            && s.rtt.as_secs_f64() > self.tolerance * self.noload.as_secs_f64();
        let mut limit = old;
        if s.dropped || too_slow || slow {
            limit = (f64::from(limit) * self.backoff_ratio) as u32;
        } else if busy {
            limit = limit.saturating_add(1);
        }
        self.limit = limit.clamp(self.min, self.max);
        if super::teaches_baseline(s, old, self.min, self.timeout, self.noload) {
            self.noload = s.rtt;
        }
        self.limit
    }
}

//! Windowed health counts the agent reports to the server: per dependency (and inbound
//! route), what its calls ended as since the previous status report.
//!
//! The hot path increments atomics and allocates nothing; the report builder swaps them
//! back to 0 ([`HealthCounters::take`]), so every report carries the delta of its window
//! and the server sums windows. The latency table ([`LATENCY_BOUNDS_MS`]) is the one both
//! sides use: the server estimates percentiles from it.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

use crate::proto::HealthWindow;

/// Upper bounds, in milliseconds, of the latency buckets of a [`HealthWindow`]: bucket
/// `i` counts calls that took at most `LATENCY_BOUNDS_MS[i]` and more than the bound
/// before it; one more bucket counts the calls past the last bound.
pub const LATENCY_BOUNDS_MS: [u64; 12] = [1, 2, 5, 10, 20, 50, 100, 200, 500, 1_000, 2_000, 5_000];
/// Entries of `latency_buckets` in a [`HealthWindow`]: one per bound, and the overflow.
pub const LATENCY_BUCKETS: usize = LATENCY_BOUNDS_MS.len() + 1;
/// `kind` of the window of an outgoing dependency.
pub const KIND_DEPENDENCY: &str = "dependency";
/// `kind` of the window of an inbound route.
pub const KIND_ROUTE: &str = "route";
/// Most windows one status report carries (the server keeps no more either); subjects
/// past it are reported in a later window, their counts kept meanwhile.
pub const MAX_HEALTH_WINDOWS: usize = 256;

/// How one call ended, for its window. A call is one of these exactly once.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum HealthOutcome {
    /// The dependency answered, and the answer was judged a success.
    Success,
    /// The dependency failed (its error, an answer judged a failure, an injected fault).
    Failure,
    /// The last attempt ran past its per-attempt timeout.
    Timeout,
    /// Refused on this machine before or instead of reaching the dependency: kill switch,
    /// open breaker, full bulkhead, client-side throttle, deadline already spent, a refusal
    /// from inside the attempt. Not the dependency's failure.
    Shed,
}

/// The counters of one subject (dependency or route) since the last report.
#[derive(Debug, Default)]
pub(crate) struct HealthCounters {
    successes: AtomicU64,
    failures: AtomicU64,
    timeouts: AtomicU64,
    shed: AtomicU64,
    fallbacks: AtomicU64,
    latency: [AtomicU64; LATENCY_BUCKETS],
    /// Breaker opens counted so far (a running total read from the breakers when a report
    /// is built); the report carries the difference with `opens_reported`.
    opens_reported: AtomicU64,
}

/// The bucket of a call that took `elapsed`.
#[inline]
pub fn latency_bucket(elapsed: Duration) -> usize {
    let us = elapsed.as_micros();
    LATENCY_BOUNDS_MS.partition_point(|&b| u128::from(b) * 1_000 < us)
}

/// Calls of one outcome per window whose latency is always measured; past them, one call
/// in [`LATENCY_STRIDE`] is, and counts for that many in its bucket.
pub(crate) const LATENCY_MEASURED_ALL: u64 = 64;
/// Past [`LATENCY_MEASURED_ALL`], the calls of one outcome per latency reading (a power of two).
pub(crate) const LATENCY_STRIDE: u64 = 8;

impl HealthCounters {
    /// Counts one call, and says how many calls its latency stands for in the window's
    /// buckets: 0 when it is not to be measured (refused calls take no time worth
    /// reporting, and would hide the dependency's own), 1 for each of the first
    /// [`LATENCY_MEASURED_ALL`] calls of its outcome in the window, then [`LATENCY_STRIDE`]
    /// for every [`LATENCY_STRIDE`]th one and 0 for the rest. The buckets so stay an
    /// estimate of every call's latency (their sum is the count of calls that reached the
    /// dependency, give or take the stride) while a busy dependency reads the clock at the
    /// end of one call in eight: a clock read costs about as much as the rest of a call's
    /// accounting.
    #[inline]
    pub(crate) fn count(&self, outcome: HealthOutcome) -> u64 {
        let cell = match outcome {
            HealthOutcome::Success => &self.successes,
            HealthOutcome::Failure => &self.failures,
            HealthOutcome::Timeout => &self.timeouts,
            HealthOutcome::Shed => {
                self.shed.fetch_add(1, Relaxed);
                return 0;
            }
        };
        let before = cell.fetch_add(1, Relaxed);
        if before < LATENCY_MEASURED_ALL {
            1
        } else if before & (LATENCY_STRIDE - 1) == 0 {
            LATENCY_STRIDE
        } else {
            0
        }
    }

    /// Adds a latency reading standing for `weight` calls (what [`HealthCounters::count`]
    /// said).
    #[inline]
    pub(crate) fn latency(&self, elapsed: Duration, weight: u64) {
        self.latency[latency_bucket(elapsed)].fetch_add(weight, Relaxed);
    }

    /// Counts one call whose latency is known: [`HealthCounters::count`], then its reading.
    #[cfg(test)]
    pub(crate) fn record(&self, outcome: HealthOutcome, elapsed: Duration) {
        let weight = self.count(outcome);
        if weight > 0 {
            self.latency(elapsed, weight);
        }
    }

    /// Counts an answer a fallback gave instead of the dependency.
    #[inline]
    pub(crate) fn fallback(&self) {
        self.fallbacks.fetch_add(1, Relaxed);
    }

    /// The window since the last call, swapping every counter back to 0; `None` when
    /// nothing happened (no window is sent for an idle subject). `opens_total` is the
    /// running total of breaker opens of the subject.
    pub(crate) fn take(
        &self,
        kind: &str,
        name: &str,
        window_ms: u64,
        opens_total: u64,
    ) -> Option<HealthWindow> {
        let before = self.opens_reported.swap(opens_total, Relaxed);
        let breaker_opens = opens_total.saturating_sub(before);
        let successes = self.successes.swap(0, Relaxed);
        let failures = self.failures.swap(0, Relaxed);
        let timeouts = self.timeouts.swap(0, Relaxed);
        let shed = self.shed.swap(0, Relaxed);
        let fallbacks = self.fallbacks.swap(0, Relaxed);
        let latency_buckets: Vec<u64> = self.latency.iter().map(|c| c.swap(0, Relaxed)).collect();
        let calls = successes + failures + timeouts + shed;
        if calls == 0 && fallbacks == 0 && breaker_opens == 0 {
            return None;
        }
        Some(HealthWindow {
            kind: kind.to_string(),
            name: name.to_string(),
            window_ms,
            calls,
            successes,
            failures,
            timeouts,
            fallbacks,
            shed,
            breaker_opens,
            latency_buckets,
            revision: 0,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_follow_the_bounds_inclusive_above() {
        assert_eq!(latency_bucket(Duration::ZERO), 0);
        assert_eq!(latency_bucket(Duration::from_millis(1)), 0);
        assert_eq!(latency_bucket(Duration::from_micros(1_001)), 1);
        assert_eq!(latency_bucket(Duration::from_millis(5)), 2);
        assert_eq!(latency_bucket(Duration::from_millis(5_000)), LATENCY_BUCKETS - 2);
        assert_eq!(latency_bucket(Duration::from_millis(5_001)), LATENCY_BUCKETS - 1);
        assert_eq!(latency_bucket(Duration::from_secs(3_600)), LATENCY_BUCKETS - 1);
    }

    /// Every report carries the delta since the previous one, and an idle subject none.
    #[test]
    fn a_window_is_the_delta_since_the_last_take() {
        let c = HealthCounters::default();
        assert!(c.take(KIND_DEPENDENCY, "db", 10_000, 0).is_none());
        c.record(HealthOutcome::Success, Duration::from_millis(3));
        c.record(HealthOutcome::Success, Duration::from_millis(3));
        c.record(HealthOutcome::Failure, Duration::from_millis(40));
        c.record(HealthOutcome::Timeout, Duration::from_millis(250));
        c.record(HealthOutcome::Shed, Duration::from_millis(9_000));
        c.fallback();
        let w = c.take(KIND_DEPENDENCY, "db", 10_000, 2).unwrap();
        assert_eq!((w.calls, w.successes, w.failures, w.timeouts, w.shed), (5, 2, 1, 1, 1));
        assert_eq!((w.fallbacks, w.breaker_opens, w.window_ms), (1, 2, 10_000));
        assert_eq!(w.latency_buckets.len(), LATENCY_BUCKETS);
        assert_eq!(w.latency_buckets[2], 2, "3 ms");
        assert_eq!(w.latency_buckets[5], 1, "40 ms");
        assert_eq!(w.latency_buckets[8], 1, "250 ms");
        assert_eq!(w.latency_buckets.iter().sum::<u64>(), 4, "no latency for the shed call");
        assert!(c.take(KIND_DEPENDENCY, "db", 10_000, 2).is_none(), "nothing new, opens unchanged");
        let w = c.take(KIND_DEPENDENCY, "db", 10_000, 3).unwrap();
        assert_eq!((w.calls, w.breaker_opens), (0, 1));
    }

    /// A busy window measures one call in eight past the first 64 of an outcome, each
    /// reading counting for eight: the buckets still add up to the calls, and a new
    /// window measures every call again.
    #[test]
    fn a_busy_window_samples_latency_and_keeps_its_total() {
        let c = HealthCounters::default();
        let mut measured = 0;
        for i in 0..1_000u64 {
            let weight = c.count(HealthOutcome::Success);
            if weight > 0 {
                measured += 1;
                // The slow calls are the sampled ones past the first 64: their weight shows.
                let ms = if i >= LATENCY_MEASURED_ALL { 40 } else { 3 };
                c.latency(Duration::from_millis(ms), weight);
            }
        }
        assert_eq!(measured, 64 + (1_000 - 64) / 8, "every call of the first 64, then one in 8");
        let w = c.take(KIND_DEPENDENCY, "db", 10_000, 0).unwrap();
        assert_eq!(w.successes, 1_000);
        assert_eq!(w.latency_buckets.iter().sum::<u64>(), 1_000, "the readings stand for every call");
        assert_eq!((w.latency_buckets[2], w.latency_buckets[5]), (64, 936));
        assert_eq!(c.count(HealthOutcome::Success), 1, "a new window measures every call again");
        assert_eq!(c.count(HealthOutcome::Shed), 0, "a refusal is never measured");
    }
}

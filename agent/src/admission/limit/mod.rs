//! Concurrency limit algorithms (Netflix concurrency-limits semantics and parameter
//! names): [`Aimd`], [`Gradient2`], [`Vegas`] and a fixed limit, each a pure update rule
//! over one [`Sample`] per window, plus the lock-free windowing that feeds them.

mod aimd;
mod gradient2;
mod vegas;
mod window;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use arc_swap::ArcSwap;
use tokio::time::Instant;

pub use aimd::Aimd;
pub use gradient2::Gradient2;
pub use vegas::Vegas;
use window::Window;

use crate::policy::{self, LimitAlgorithm};

/// Under a fixed limit, one admitted request in this many has its service time measured
/// (a power of two, as every stride: see [`Limiter::sample_stride`]).
pub(crate) const FIXED_SAMPLE_EVERY: u64 = 16;

/// What one window of finished requests tells a limit algorithm.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Sample {
    /// Average round trip (admission to completion) of the window's requests.
    pub rtt: Duration,
    /// Shortest round trip in the window.
    pub min_rtt: Duration,
    /// Most requests in flight at once during the window (counted at admission).
    pub in_flight: u32,
    /// Whether any request of the window ended as an overload signal (a 503/504 or gRPC
    /// UNAVAILABLE / RESOURCE_EXHAUSTED / DEADLINE_EXCEEDED answer, or
    /// [`Outcome::Dropped`](super::Outcome::Dropped) through the plain API).
    pub dropped: bool,
}

/// How slow a window's average round trip was against the limit's `timeout`: 0 up to half
/// the timeout, rising linearly to 1 at the timeout. Slow answers are an overload signal
/// before they become timeouts: a service that answers everything just under the timeout
/// is not healthy, yet a rule that only counts `rtt ≥ timeout` as a drop grows its limit
/// to the maximum there (upstream Gradient2 issue #137). Gradient2 caps its gradient at
/// `1 − slowness / 2` (0.5, a drop's, at the timeout); AIMD and Vegas treat a window of
/// slowness ≥ 1/2 (¾ of the timeout) as a drop.
pub(crate) fn slowness(rtt: Duration, timeout: Duration) -> f64 {
    let (rtt, timeout) = (rtt.as_secs_f64(), timeout.as_secs_f64());
    if timeout <= 0.0 {
        return 1.0;
    }
    ((rtt - timeout / 2.0) / (timeout / 2.0)).clamp(0.0, 1.0)
}

/// Whether a window is slow enough to count as a drop for AIMD and Vegas (see
/// [`slowness`]).
pub(crate) fn slow_as_a_drop(rtt: Duration, timeout: Duration) -> bool {
    slowness(rtt, timeout) >= 0.5
}

/// Whether a window's average round trip may teach a limit its baseline — the no-load
/// round trip it compares windows with (AIMD's `rtt_noload`, Gradient2's long RTT): a
/// window with no drop and no slowness that was not busy (more than half of `limit` to
/// spare), or ran at `min` (the least concurrency the limit allows: its latency is the best
/// the rule can get), or was faster than the baseline, or when there is no baseline yet.
/// Busy windows above the minimum never raise the baseline, so a sustained overload cannot
/// drag it up and let the limit drift to the maximum (Gradient2's drift, upstream issue
/// #88), while a lasting change of the service's own latency is learnt as soon as the limit
/// has room again or is at its minimum.
pub(crate) fn teaches_baseline(
    s: &Sample,
    limit: u32,
    min: u32,
    timeout: Duration,
    baseline: Duration,
) -> bool {
    let busy = u64::from(s.in_flight) * 2 >= u64::from(limit);
    !s.dropped
        && slowness(s.rtt, timeout) == 0.0
        && (!busy || limit <= min || baseline.is_zero() || s.rtt < baseline)
}

/// `[min_limit, max_limit]`, made consistent if a caller passes unvalidated settings.
fn bounds(settings: &policy::Limit) -> (u32, u32) {
    let min = settings.min_limit.max(1);
    (min, settings.max_limit.max(min))
}

/// One limit algorithm with its state.
#[derive(Clone, Debug)]
pub(crate) enum Rule {
    Fixed(u32),
    Aimd(Aimd),
    Gradient2(Gradient2),
    Vegas(Vegas),
}

impl Rule {
    /// A fresh rule for `settings`, starting at `start` (the initial limit, or the limit in
    /// force when only parameters changed).
    pub(crate) fn new(settings: &policy::Limit, start: u32, seed: u64) -> Self {
        match settings.algorithm {
            LimitAlgorithm::Fixed => Rule::Fixed(settings.initial_limit.max(1)),
            LimitAlgorithm::Aimd => Rule::Aimd(Aimd::starting_at(settings, start)),
            LimitAlgorithm::Gradient2 => Rule::Gradient2(Gradient2::starting_at(settings, start)),
            LimitAlgorithm::Vegas => Rule::Vegas(Vegas::with_seed(settings, start, seed)),
        }
    }

    pub(crate) fn limit(&self) -> u32 {
        match self {
            Rule::Fixed(l) => *l,
            Rule::Aimd(r) => r.limit(),
            Rule::Gradient2(r) => r.limit(),
            Rule::Vegas(r) => r.limit(),
        }
        .max(1)
    }

    fn update(&mut self, s: &Sample) -> u32 {
        match self {
            Rule::Fixed(l) => *l,
            Rule::Aimd(r) => r.update(s),
            Rule::Gradient2(r) => r.update(s),
            Rule::Vegas(r) => r.update(s),
        }
        .max(1)
    }
}

/// The adaptive part of admission: turns finished requests into limit updates, one per
/// window, without a lock on the request path (samples are atomics; the rule state is
/// swapped by whichever thread closes a window, guarded by a flag it only tries to take).
#[derive(Debug)]
pub(crate) struct Limiter {
    rule: ArcSwap<Rule>,
    settings: ArcSwap<policy::Limit>,
    adaptive: AtomicBool,
    window: Window,
    updating: AtomicBool,
    seed: u64,
}

impl Limiter {
    pub(crate) fn new(settings: &policy::Limit, seed: u64) -> Self {
        let rule = Rule::new(settings, settings.initial_limit, seed);
        Self {
            adaptive: AtomicBool::new(!matches!(rule, Rule::Fixed(_))),
            rule: ArcSwap::from_pointee(rule),
            settings: ArcSwap::from_pointee(settings.clone()),
            window: Window::new(Instant::now()),
            updating: AtomicBool::new(false),
            seed,
        }
    }

    /// The limit the rule holds now.
    pub(crate) fn limit(&self) -> u32 {
        self.rule.load().limit()
    }

    /// Whether the limit adapts.
    #[cfg(test)]
    pub(crate) fn is_adaptive(&self) -> bool {
        self.adaptive.load(Ordering::Relaxed)
    }

    /// One admitted request in this many has its service time measured: the window's
    /// stride for an adaptive limit, [`FIXED_SAMPLE_EVERY`] for a fixed one (which only
    /// needs the routes' expected service times). Always a power of two: a request is
    /// measured when `seq & (stride - 1) == 0`.
    #[inline]
    pub(crate) fn sample_stride(&self) -> u64 {
        if self.adaptive.load(Ordering::Relaxed) { self.window.stride() } else { FIXED_SAMPLE_EVERY }
    }

    /// The algorithm in force.
    pub(crate) fn algorithm(&self) -> LimitAlgorithm {
        self.settings.load().algorithm
    }

    /// Records a finished request. Returns the new limit when this call closed a window.
    pub(crate) fn record(&self, now: Instant, rtt: Duration, in_flight: u32, dropped: bool) -> Option<u32> {
        if !self.adaptive.load(Ordering::Relaxed) || !self.window.add(now, rtt, in_flight, dropped) {
            return None;
        }
        if self.updating.compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed).is_err() {
            return None;
        }
        let out = self.window.close(now).map(|sample| {
            let mut rule = Rule::clone(&self.rule.load());
            let limit = rule.update(&sample);
            self.rule.store(Arc::new(rule));
            limit
        });
        self.updating.store(false, Ordering::Release);
        out
    }

    /// Applies new settings; returns the limit to enforce. Unchanged settings keep the
    /// rule and its history; a new algorithm (or a fixed limit) starts from
    /// `initial_limit`; new parameters for the same adaptive algorithm start from the
    /// limit in force, clamped to the new bounds. Requests in flight are never touched.
    pub(crate) fn reconfigure(&self, settings: &policy::Limit) -> u32 {
        // Settings change rarely and a window update holds the flag for well under a
        // microsecond: wait for it rather than lose either change.
        while self.updating.compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed).is_err() {
            std::thread::yield_now();
        }
        let old = self.settings.load_full();
        if *old != *settings {
            let current = self.rule.load().limit();
            let start = if old.algorithm == settings.algorithm && settings.algorithm != LimitAlgorithm::Fixed
            {
                current
            } else {
                settings.initial_limit
            };
            let rule = Rule::new(settings, start, self.seed);
            self.adaptive.store(!matches!(rule, Rule::Fixed(_)), Ordering::Relaxed);
            self.rule.store(Arc::new(rule));
            self.settings.store(Arc::new(settings.clone()));
        }
        let limit = self.rule.load().limit();
        self.updating.store(false, Ordering::Release);
        limit
    }
}

#[cfg(test)]
mod tests;

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

use tokio::time::Instant;

use super::Sample;
use crate::policy::defaults as d;

/// Accumulates the samples of one window between two limit updates, lock-free (Netflix
/// `WindowedLimit` with an average sample window).
///
/// Any thread adds; the thread that finds the window due and wins the limiter's update
/// flag takes the aggregate. A sample landing while the fields are being reset may count
/// in the next window instead: harmless for an average.
#[derive(Debug)]
pub(crate) struct Window {
    epoch: Instant,
    next_close_ns: AtomicU64,
    count: AtomicU32,
    sum_ns: AtomicU64,
    min_ns: AtomicU64,
    max_in_flight: AtomicU32,
    drops: AtomicU32,
    /// One admitted request in this many is measured (see [`Window::stride`]).
    stride: AtomicU64,
}

/// Samples a window aims at: enough for a stable average, few enough that a busy service
/// reads the clock for a small share of its requests.
const TARGET_SAMPLES: u64 = 64;
/// Largest measuring stride.
const MAX_STRIDE: u64 = 32;

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

impl Window {
    pub(crate) fn new(now: Instant) -> Self {
        Self {
            epoch: now,
            next_close_ns: AtomicU64::new(nanos(d::LIMIT_WINDOW_MIN_TIME)),
            count: AtomicU32::new(0),
            sum_ns: AtomicU64::new(0),
            min_ns: AtomicU64::new(u64::MAX),
            max_in_flight: AtomicU32::new(0),
            drops: AtomicU32::new(0),
            stride: AtomicU64::new(1),
        }
    }

    fn since_epoch(&self, now: Instant) -> u64 {
        nanos(now.saturating_duration_since(self.epoch))
    }

    /// Which admitted requests are measured: those whose sequence number is a multiple of
    /// this, a power of two. Starts at 1 (every request) and is set at each window close so
    /// that a window holds `TARGET_SAMPLES` to twice as many measurements (at most one
    /// request in `MAX_STRIDE`): a quiet service measures everything, a busy one a sample.
    pub(crate) fn stride(&self) -> u64 {
        self.stride.load(Ordering::Relaxed)
    }

    /// Adds one finished request; returns whether the window is due to close.
    pub(crate) fn add(&self, now: Instant, rtt: Duration, in_flight: u32, dropped: bool) -> bool {
        let rtt_ns = nanos(rtt).max(1);
        self.count.fetch_add(1, Ordering::Relaxed);
        self.sum_ns.fetch_add(rtt_ns, Ordering::Relaxed);
        self.min_ns.fetch_min(rtt_ns, Ordering::Relaxed);
        self.max_in_flight.fetch_max(in_flight, Ordering::Relaxed);
        if dropped {
            self.drops.fetch_add(1, Ordering::Relaxed);
        }
        self.since_epoch(now) >= self.next_close_ns.load(Ordering::Relaxed)
    }

    /// Closes the window (the caller holds the limiter's update flag): resets the
    /// aggregate, schedules the next close at `2 × smallest RTT` clamped to
    /// [`LIMIT_WINDOW_MIN_TIME`](d::LIMIT_WINDOW_MIN_TIME)..=[`LIMIT_WINDOW_MAX_TIME`](d::LIMIT_WINDOW_MAX_TIME),
    /// and returns the sample, or `None` when it held fewer than
    /// [`LIMIT_WINDOW_MIN_SAMPLES`](d::LIMIT_WINDOW_MIN_SAMPLES) requests (discarded, as
    /// upstream does, so a few probes cannot set the no-load RTT).
    pub(crate) fn close(&self, now: Instant) -> Option<Sample> {
        let count = self.count.swap(0, Ordering::Relaxed);
        let sum = self.sum_ns.swap(0, Ordering::Relaxed);
        let min = self.min_ns.swap(u64::MAX, Ordering::Relaxed);
        let in_flight = self.max_in_flight.swap(0, Ordering::Relaxed);
        let drops = self.drops.swap(0, Ordering::Relaxed);
        let arrivals = u64::from(count) * self.stride();
        // A power of two, so that choosing the measured requests is a mask, not a division
        // (a 64-bit division costs more than the rest of an admission).
        let stride = (arrivals / TARGET_SAMPLES).clamp(1, MAX_STRIDE);
        self.stride.store(1 << stride.ilog2(), Ordering::Relaxed);
        let length = Duration::from_nanos(min.saturating_mul(2))
            .clamp(d::LIMIT_WINDOW_MIN_TIME, d::LIMIT_WINDOW_MAX_TIME);
        self.next_close_ns.store(self.since_epoch(now).saturating_add(nanos(length)), Ordering::Relaxed);
        (count >= d::LIMIT_WINDOW_MIN_SAMPLES).then(|| Sample {
            rtt: Duration::from_nanos(sum / u64::from(count)),
            min_rtt: Duration::from_nanos(min),
            in_flight,
            dropped: drops > 0,
        })
    }
}

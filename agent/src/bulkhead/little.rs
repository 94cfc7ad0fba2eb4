use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::time::Instant;

/// Headroom of the Little's-law size (agent-semantics §4).
pub(super) const HEADROOM: f64 = 2.0;
/// Weight of a new sample in the moving averages.
const ALPHA: f64 = 0.2;
/// Shortest interval over which an arrival rate is measured.
const RATE_INTERVAL: Duration = Duration::from_secs(1);

/// What a bulkhead measured and what size it suggests.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LittleEstimate {
    /// Arrivals per second (admitted and rejected), exponentially weighted.
    pub arrival_rate: f64,
    /// Typical time a permit is held, exponentially weighted over sampled calls.
    pub latency: Duration,
    /// Little's law with headroom: `ceil(arrival_rate × latency × 2)`, at least 1;
    /// 0 while nothing has been measured.
    pub suggested: u32,
}

/// Measures arrival rate and latency for Little's law, lock-free. Arrivals are counted by
/// the bulkhead; latency is sampled on one call in 16, so most calls never read the clock.
#[derive(Debug)]
pub(super) struct Little {
    origin: Instant,
    /// Start of the current rate interval (ns since origin) and arrivals counted then.
    interval_start_ns: AtomicU64,
    arrivals_at_start: AtomicU64,
    rate_bits: AtomicU64,
    latency_bits: AtomicU64,
}

fn ewma(cell: &AtomicU64, sample: f64) {
    let _ = cell.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |bits| {
        let old = f64::from_bits(bits);
        let new = if old == 0.0 { sample } else { old + ALPHA * (sample - old) };
        Some(new.to_bits())
    });
}

impl Little {
    pub(super) fn new() -> Self {
        Self {
            origin: Instant::now(),
            interval_start_ns: AtomicU64::new(0),
            arrivals_at_start: AtomicU64::new(0),
            rate_bits: AtomicU64::new(0),
            latency_bits: AtomicU64::new(0),
        }
    }

    /// Records one sampled holding time and, once per interval, the arrival rate.
    pub(super) fn sample(&self, started: Instant, arrivals: u64) {
        let now = Instant::now();
        ewma(&self.latency_bits, now.saturating_duration_since(started).as_secs_f64());
        self.tick(now, arrivals);
    }

    pub(super) fn tick(&self, now: Instant, arrivals: u64) {
        let now_ns = u64::try_from(now.saturating_duration_since(self.origin).as_nanos()).unwrap_or(u64::MAX);
        let start = self.interval_start_ns.load(Ordering::Acquire);
        let elapsed = now_ns.saturating_sub(start);
        if elapsed < RATE_INTERVAL.as_nanos() as u64 {
            return;
        }
        if self.interval_start_ns.compare_exchange(start, now_ns, Ordering::AcqRel, Ordering::Acquire).is_ok()
        {
            let before = self.arrivals_at_start.swap(arrivals, Ordering::AcqRel);
            let rate = arrivals.saturating_sub(before) as f64 / (elapsed as f64 / 1e9);
            ewma(&self.rate_bits, rate);
        }
    }

    pub(super) fn estimate(&self) -> LittleEstimate {
        let arrival_rate = f64::from_bits(self.rate_bits.load(Ordering::Relaxed));
        let latency = f64::from_bits(self.latency_bits.load(Ordering::Relaxed));
        let suggested = if arrival_rate > 0.0 && latency > 0.0 {
            (arrival_rate * latency * HEADROOM).ceil().clamp(1.0, u32::MAX as f64) as u32
        } else {
            0
        };
        LittleEstimate { arrival_rate, latency: Duration::from_secs_f64(latency), suggested }
    }
}

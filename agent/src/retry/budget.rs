use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::time::Instant;

use crate::metrics_names::{self as names, Labels, LateCounter};
use crate::policy;

/// Fixed-point unit of the bucket: one token is a million micro-tokens, so ratios such as
/// 0.6 are exact and deposits never drift by float rounding.
const TOKEN: u64 = 1_000_000;

/// `tokens` in micro-tokens, rounded down: a deposit or a capacity rounded up would let
/// retries exceed the configured share by half a micro-token per success (a property test
/// found 64 withdrawals where the bound was 63.99996).
fn micro(tokens: f64) -> u64 {
    if tokens.is_finite() && tokens > 0.0 {
        // The product of a decimal ratio and 1e6 can land a hair below the whole number
        // it means (0.07 × 1e6 = 69999.99999999999): allow for that before rounding down.
        (tokens * TOKEN as f64 + 1e-6).floor().min(u64::MAX as f64) as u64
    } else {
        0
    }
}

/// Bounds retries to a share of successful traffic: a token bucket per dependency.
///
/// Each success deposits `ratio` tokens (ratio 0..1) up to `capacity`; each retry
/// withdraws one whole token with an atomic check-and-withdraw, so concurrent retriers can
/// never overdraw it (RT-1: ratio 0.6 allows at most about 60 % extra attempts, never
/// 100 %). With less than one token, a floor of `min_retries_per_sec` (a GCRA rate limit,
/// burst `max(1, ⌊rate⌋)`) still lets a trickle through so a recovered dependency is
/// noticed; past that, retries stop and `budget_exhausted` is counted.
///
/// The bucket starts full, as gRPC retry throttling does. Differences from gRPC
/// throttling (which halves on failure, 1 token per failure, retries allowed above half
/// capacity) and Finagle (a time-windowed deposit/withdraw ledger): Levee charges only
/// retries, never first attempts, deposits only on success, and has no half-capacity
/// threshold — a retry needs one whole token.
///
/// Deposit is a single load when the bucket is full (the steady state), a CAS otherwise.
#[derive(Debug)]
pub struct RetryBudget {
    tokens: AtomicU64,
    ratio: AtomicU64,
    capacity: AtomicU64,
    /// Floor: GCRA emission interval in ns (0 = no floor), its burst tolerance in ns, and
    /// the theoretical arrival time in ns since `origin`.
    floor_interval_ns: AtomicU64,
    floor_tolerance_ns: AtomicU64,
    floor_tat_ns: AtomicU64,
    origin: Instant,
    exhausted: LateCounter,
}

impl RetryBudget {
    /// A full bucket with the given settings (metrics not registered).
    pub fn new(settings: &policy::RetryBudgetPolicy) -> Self {
        Self::build(settings, LateCounter::noop())
    }

    /// As [`RetryBudget::new`], counting exhaustion in
    /// [`RETRY_BUDGET_EXHAUSTED`](crate::metrics_names::RETRY_BUDGET_EXHAUSTED) with `labels`.
    pub fn with_metrics(settings: &policy::RetryBudgetPolicy, labels: &Labels) -> Self {
        Self::build(settings, LateCounter::new(labels, names::RETRY_BUDGET_EXHAUSTED))
    }

    /// Registers the exhaustion counter with a recorder installed since the budget was
    /// built (CB-9).
    pub(crate) fn publish_metrics(&self) {
        self.exhausted.publish();
    }

    fn build(settings: &policy::RetryBudgetPolicy, exhausted: LateCounter) -> Self {
        let b = Self {
            tokens: AtomicU64::new(micro(settings.capacity)),
            ratio: AtomicU64::new(0),
            capacity: AtomicU64::new(0),
            floor_interval_ns: AtomicU64::new(0),
            floor_tolerance_ns: AtomicU64::new(0),
            floor_tat_ns: AtomicU64::new(0),
            origin: Instant::now(),
            exhausted,
        };
        b.update(settings);
        b
    }

    /// Applies new settings live. The tokens held are kept (clamped to a smaller
    /// capacity), and so is the floor's rate history.
    pub fn update(&self, settings: &policy::RetryBudgetPolicy) {
        let cap = micro(settings.capacity);
        self.ratio.store(micro(settings.ratio), Ordering::Relaxed);
        self.capacity.store(cap, Ordering::Relaxed);
        let _ = self.tokens.fetch_update(Ordering::AcqRel, Ordering::Acquire, |t| (t > cap).then_some(cap));
        let rate = settings.min_retries_per_sec;
        if rate.is_finite() && rate > 0.0 {
            let interval = (1e9 / rate).clamp(1.0, u64::MAX as f64 / 4.0) as u64;
            let burst = rate.floor().max(1.0) as u64;
            self.floor_interval_ns.store(interval, Ordering::Relaxed);
            self.floor_tolerance_ns.store(interval.saturating_mul(burst - 1), Ordering::Relaxed);
        } else {
            self.floor_interval_ns.store(0, Ordering::Relaxed);
        }
    }

    /// Records a success: deposits `ratio` tokens, up to `capacity`.
    pub fn deposit(&self) {
        let cap = self.capacity.load(Ordering::Relaxed);
        let mut t = self.tokens.load(Ordering::Relaxed);
        if t >= cap {
            return;
        }
        let ratio = self.ratio.load(Ordering::Relaxed);
        loop {
            let new = t.saturating_add(ratio).min(cap);
            match self.tokens.compare_exchange_weak(t, new, Ordering::AcqRel, Ordering::Relaxed) {
                Ok(_) => return,
                Err(cur) if cur >= cap => return,
                Err(cur) => t = cur,
            }
        }
    }

    /// Tries to pay for one retry: one whole token, else one unit of the
    /// `min_retries_per_sec` floor. Returns `false` (and counts `budget_exhausted`) when
    /// neither is available; the caller must then not retry.
    pub fn try_withdraw(&self) -> bool {
        let ok =
            self.tokens.fetch_update(Ordering::AcqRel, Ordering::Acquire, |t| t.checked_sub(TOKEN)).is_ok()
                || self.try_floor();
        if !ok {
            self.exhausted.increment(1);
        }
        ok
    }

    fn try_floor(&self) -> bool {
        let interval = self.floor_interval_ns.load(Ordering::Relaxed);
        if interval == 0 {
            return false;
        }
        let tolerance = self.floor_tolerance_ns.load(Ordering::Relaxed);
        let now = u64::try_from(Instant::now().saturating_duration_since(self.origin).as_nanos())
            .unwrap_or(u64::MAX);
        self.floor_tat_ns
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |tat| {
                let start = tat.max(now);
                (start <= now.saturating_add(tolerance)).then(|| start.saturating_add(interval))
            })
            .is_ok()
    }

    /// Tokens currently in the bucket (whole and fractional).
    pub fn tokens(&self) -> f64 {
        self.tokens.load(Ordering::Relaxed) as f64 / TOKEN as f64
    }

    /// How many retries the floor allows in `elapsed` at most (burst plus rate × time);
    /// the bound the property tests check withdrawals against.
    pub fn floor_allowance(&self, elapsed: Duration) -> u64 {
        let interval = self.floor_interval_ns.load(Ordering::Relaxed);
        if interval == 0 {
            return 0;
        }
        let burst = self.floor_tolerance_ns.load(Ordering::Relaxed) / interval + 1;
        burst + u64::try_from(elapsed.as_nanos() / u128::from(interval)).unwrap_or(u64::MAX)
    }
}

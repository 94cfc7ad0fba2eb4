use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::time::Instant;

use super::FastRng;
use crate::metrics_names::LateCounter;
use crate::policy;
use crate::policy::defaults::THROTTLE_MIN_REQUESTS;

/// Buckets of the sliding window (each `window / BUCKETS` long).
const BUCKETS: usize = 20;

/// `refusal_period` when the window holds no refusal (the quiet state).
const QUIET: u64 = u64::MAX;

/// Refuses a call locally because the backend has been rejecting much of this client's
/// traffic; not retryable (retrying would defeat the throttle).
///
/// Opaque on purpose (tower style): find it with `downcast_ref::<Throttled>()`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Throttled(());

impl fmt::Display for Throttled {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("throttled locally: the backend is rejecting most requests")
    }
}

impl std::error::Error for Throttled {}

#[derive(Debug, Default)]
struct Bucket {
    /// Index of the bucket period these counts belong to.
    period: AtomicU64,
    requests: AtomicU64,
    accepts: AtomicU64,
}

/// Client-side adaptive throttling (Google SRE book, "Handling Overload"): over a sliding
/// window the client counts `requests` and `accepts` (calls the backend served, i.e. did
/// not reject for overload), and refuses a new call locally with probability
/// `max(0, (requests − K × accepts) / (requests + 1))`.
///
/// While the backend accepts everything nothing is refused; once it rejects more than
/// `1 − 1/K` of the traffic, the client stops sending the excess (K = 2: half) so the
/// backend does not spend its capacity rejecting; as accepts come back, so does the
/// traffic. `K` and the window come from the policy (`client_throttle`: 2 and 2 minutes).
/// Nothing is refused while the window holds fewer than
/// [`THROTTLE_MIN_REQUESTS`](crate::policy::defaults::THROTTLE_MIN_REQUESTS) (20) requests.
///
/// A request is counted when its outcome is known — refused locally
/// ([`try_acquire`](Self::try_acquire)), or answered ([`record`](Self::record)) — not when
/// it is sent: counted at send, the first burst of concurrent calls to a backend (each one a
/// request, none answered yet) would throttle itself (`c` calls in flight give the next
/// one `p = c / (c + 1)`). A call abandoned before its answer counts for nothing.
///
/// Lock-free: the window is a ring of 20 atomic buckets, rotated by whichever call first
/// notices a new period; the random draw is one atomic add. While the window holds no
/// refusal (the usual state) the window is not consulted and the clock is not read: a
/// call costs one atomic load, an answer two loads and a store (no locked instruction); the answers of that quiet
/// time are moved into the window when the next refusal comes (spread evenly over the time
/// since they were last moved, when that is longer than the window).
pub struct AdaptiveThrottle {
    epoch: Instant,
    bucket_ns: AtomicU64,
    k_bits: AtomicU64,
    buckets: [Bucket; BUCKETS],
    /// Period of the latest refusal (an answer that was not an accept, or a local
    /// refusal); [`QUIET`] when the window holds none.
    refusal_period: AtomicU64,
    /// Answers (all accepts) since the quiet state began, not yet in the window.
    quiet_accepts: AtomicU64,
    /// When the quiet state began, in ns since `epoch`.
    quiet_since_ns: AtomicU64,
    rng: FastRng,
    throttled: AtomicU64,
    throttled_counter: LateCounter,
}

impl fmt::Debug for AdaptiveThrottle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (requests, accepts) = self.counts();
        f.debug_struct("AdaptiveThrottle")
            .field("k", &self.k())
            .field("requests", &requests)
            .field("accepts", &accepts)
            .finish_non_exhaustive()
    }
}

impl AdaptiveThrottle {
    /// A throttle with `settings` (`k`, `window`), random draws seeded from the OS.
    pub fn new(settings: &policy::ClientThrottle) -> Self {
        Self::with_seed(settings, rand::random())
    }

    /// As [`new`](Self::new) with a seeded generator (reproducible decisions, for tests).
    pub fn with_seed(settings: &policy::ClientThrottle, seed: u64) -> Self {
        let t = Self {
            epoch: Instant::now(),
            bucket_ns: AtomicU64::new(1),
            k_bits: AtomicU64::new(0),
            buckets: Default::default(),
            refusal_period: AtomicU64::new(QUIET),
            quiet_accepts: AtomicU64::new(0),
            quiet_since_ns: AtomicU64::new(0),
            rng: FastRng::with_seed(seed),
            throttled: AtomicU64::new(0),
            throttled_counter: LateCounter::noop(),
        };
        t.update(settings);
        t
    }

    /// As [`new`](Self::new), counting local refusals in
    /// [`CLIENT_THROTTLED`](crate::metrics_names::CLIENT_THROTTLED) with `labels`.
    pub fn with_metrics(settings: &policy::ClientThrottle, labels: &crate::metrics_names::Labels) -> Self {
        let mut t = Self::new(settings);
        t.throttled_counter = LateCounter::new(labels, crate::metrics_names::CLIENT_THROTTLED);
        t
    }

    /// Registers the refusal counter with a recorder installed since the throttle was
    /// built (CB-9).
    pub(crate) fn publish_metrics(&self) {
        self.throttled_counter.publish();
    }

    /// Applies new settings live. A new window length restarts the counts.
    pub fn update(&self, settings: &policy::ClientThrottle) {
        self.k_bits.store(settings.k.to_bits(), Ordering::Relaxed);
        let bucket = (settings.window.as_nanos() / BUCKETS as u128).max(1);
        let bucket = u64::try_from(bucket).unwrap_or(u64::MAX);
        if self.bucket_ns.swap(bucket, Ordering::Relaxed) != bucket {
            for b in &self.buckets {
                b.period.store(u64::MAX, Ordering::Relaxed);
                b.requests.store(0, Ordering::Relaxed);
                b.accepts.store(0, Ordering::Relaxed);
            }
            self.refusal_period.store(QUIET, Ordering::Relaxed);
            self.quiet_accepts.store(0, Ordering::Relaxed);
            self.quiet_since_ns.store(self.ns(Instant::now()), Ordering::Relaxed);
        }
    }

    /// Restarts the random draws at `seed` (tests of a stack that built the throttle).
    #[cfg(test)]
    pub(crate) fn reseed(&self, seed: u64) {
        self.rng.reseed(seed);
    }

    /// `K`.
    pub fn k(&self) -> f64 {
        f64::from_bits(self.k_bits.load(Ordering::Relaxed))
    }

    fn ns(&self, now: Instant) -> u64 {
        u64::try_from(now.saturating_duration_since(self.epoch).as_nanos()).unwrap_or(u64::MAX)
    }

    fn period(&self, now: Instant) -> u64 {
        self.ns(now) / self.bucket_ns.load(Ordering::Relaxed)
    }

    fn bucket(&self, now: Instant) -> &Bucket {
        let period = self.period(now);
        let b = &self.buckets[(period % BUCKETS as u64) as usize];
        let seen = b.period.load(Ordering::Acquire);
        if seen != period
            && b.period.compare_exchange(seen, period, Ordering::AcqRel, Ordering::Acquire).is_ok()
        {
            // A count racing with this reset may be lost: one request in a window.
            b.requests.store(0, Ordering::Relaxed);
            b.accepts.store(0, Ordering::Relaxed);
        }
        b
    }

    /// `(requests, accepts)` over the window ending now (answers of the quiet state
    /// included).
    pub fn counts(&self) -> (u64, u64) {
        let now = Instant::now();
        let (r, a) = self.window_counts(now);
        let q =
            if self.refusal_period.load(Ordering::Acquire) == QUIET { self.quiet_in_window(now) } else { 0 };
        (r + q, a + q)
    }

    fn window_counts(&self, now: Instant) -> (u64, u64) {
        let period = self.period(now);
        let oldest = period.saturating_sub(BUCKETS as u64 - 1);
        self.buckets
            .iter()
            .filter(|b| (oldest..=period).contains(&b.period.load(Ordering::Acquire)))
            .fold((0, 0), |(r, a), b| {
                (r + b.requests.load(Ordering::Relaxed), a + b.accepts.load(Ordering::Relaxed))
            })
    }

    /// The quiet answers that fall in the window ending `now`, assuming they came evenly
    /// since the quiet state began.
    fn quiet_in_window(&self, now: Instant) -> u64 {
        let q = self.quiet_accepts.load(Ordering::Relaxed);
        let quiet_for = self.ns(now).saturating_sub(self.quiet_since_ns.load(Ordering::Relaxed));
        let window = self.bucket_ns.load(Ordering::Relaxed).saturating_mul(BUCKETS as u64);
        if quiet_for <= window {
            q
        } else {
            (u128::from(q) * u128::from(window) / u128::from(quiet_for)) as u64
        }
    }

    /// Whether the window holds a refusal at `now`; leaves the quiet state on `refusal`
    /// (moving the quiet answers into the window) and enters it when the latest refusal
    /// has left the window.
    fn refusals_in_window(&self, now: Instant, refusal: bool) -> bool {
        let period = self.period(now);
        let last = self.refusal_period.load(Ordering::Acquire);
        if refusal {
            if last == QUIET {
                let q = self.quiet_in_window(now);
                self.quiet_accepts.store(0, Ordering::Relaxed);
                let b = self.bucket(now);
                b.requests.fetch_add(q, Ordering::Relaxed);
                b.accepts.fetch_add(q, Ordering::Relaxed);
            }
            self.refusal_period.store(period, Ordering::Release);
            return true;
        }
        if last == QUIET {
            return false;
        }
        if period.saturating_sub(last) >= BUCKETS as u64 {
            if self.refusal_period.compare_exchange(last, QUIET, Ordering::AcqRel, Ordering::Relaxed).is_ok()
            {
                self.quiet_accepts.store(0, Ordering::Relaxed);
                self.quiet_since_ns.store(self.ns(now), Ordering::Relaxed);
            }
            return false;
        }
        true
    }

    /// The probability that the next call is refused locally:
    /// `max(0, (requests − K × accepts) / (requests + 1))` over the window, 0 while it
    /// holds fewer than [`THROTTLE_MIN_REQUESTS`](crate::policy::defaults::THROTTLE_MIN_REQUESTS).
    pub fn reject_probability(&self) -> f64 {
        let (requests, accepts) = self.counts();
        if requests < THROTTLE_MIN_REQUESTS {
            return 0.0;
        }
        probability(requests, accepts, self.k())
    }

    /// Decides whether to send a call, refusing it locally with the
    /// [`reject_probability`](Self::reject_probability) (a refused call counts as a
    /// request). Report the answer of a call that was sent with [`record`](Self::record).
    ///
    /// # Errors
    /// [`Throttled`] when the call must not be sent.
    #[inline]
    pub fn try_acquire(&self) -> Result<(), Throttled> {
        if self.refusal_period.load(Ordering::Relaxed) == QUIET {
            return Ok(());
        }
        self.decide()
    }

    #[cold]
    fn decide(&self) -> Result<(), Throttled> {
        let now = Instant::now();
        if !self.refusals_in_window(now, false) {
            return Ok(());
        }
        let (requests, accepts) = self.window_counts(now);
        if requests < THROTTLE_MIN_REQUESTS {
            return Ok(());
        }
        let p = probability(requests, accepts, self.k());
        if p > 0.0 && self.rng.next_f64() < p {
            self.bucket(now).requests.fetch_add(1, Ordering::Relaxed);
            self.refusals_in_window(now, true);
            self.throttled.fetch_add(1, Ordering::Relaxed);
            self.throttled_counter.increment(1);
            return Err(Throttled(()));
        }
        Ok(())
    }

    /// The answer of a call that was sent: `accepted` when the backend served it
    /// (answered anything but an overload rejection: a 2xx, a 404 and a 500 all count; a
    /// 429/503, gRPC RESOURCE_EXHAUSTED / UNAVAILABLE, or no answer at all do not).
    #[inline]
    pub fn record(&self, accepted: bool) {
        if accepted && self.refusal_period.load(Ordering::Relaxed) == QUIET {
            // A load and a store, not a read-modify-write: this runs on every successful
            // call, where a locked add costs more than the rest of the throttle, and the
            // count is an estimate already (spread evenly over the quiet time). Two answers
            // recorded at the same instant on two threads may count once; an undercount
            // only makes the window remember fewer accepts when a refusal comes.
            let q = self.quiet_accepts.load(Ordering::Relaxed);
            self.quiet_accepts.store(q.saturating_add(1), Ordering::Relaxed);
            return;
        }
        self.record_slow(accepted);
    }

    #[cold]
    fn record_slow(&self, accepted: bool) {
        let now = Instant::now();
        self.refusals_in_window(now, !accepted);
        if self.refusal_period.load(Ordering::Acquire) == QUIET {
            // The latest refusal has just left the window: back to the quiet count.
            self.quiet_accepts.fetch_add(1, Ordering::Relaxed);
            return;
        }
        let b = self.bucket(now);
        b.requests.fetch_add(1, Ordering::Relaxed);
        if accepted {
            b.accepts.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Calls refused locally so far.
    pub fn throttled(&self) -> u64 {
        self.throttled.load(Ordering::Relaxed)
    }

    /// The window length in force.
    pub fn window(&self) -> Duration {
        Duration::from_nanos(self.bucket_ns.load(Ordering::Relaxed).saturating_mul(BUCKETS as u64))
    }
}

/// `max(0, (requests − k × accepts) / (requests + 1))`.
pub fn probability(requests: u64, accepts: u64, k: f64) -> f64 {
    let r = requests as f64;
    ((r - k * accepts as f64) / (r + 1.0)).max(0.0)
}

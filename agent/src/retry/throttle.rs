use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};

use metrics::Counter;
use tokio::time::Instant;

use crate::policy;
use crate::retry::FastRng;

/// Buckets of the sliding window (each `window / BUCKETS` long).
const BUCKETS: usize = 20;

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
/// window the client counts `requests` (every call it wanted to make, including the ones
/// it refused itself) and `accepts` (calls the backend served, i.e. did not reject for
/// overload), and refuses a new call locally with probability
/// `max(0, (requests − K × accepts) / (requests + 1))`.
///
/// While the backend accepts everything nothing is refused; once it rejects more than
/// `1 − 1/K` of the traffic, the client stops sending the excess (K = 2: half) so the
/// backend does not spend its capacity rejecting; as accepts come back, so does the
/// traffic. `K` and the window come from the policy (`client_throttle`: 2 and 2 minutes).
///
/// Lock-free: the window is a ring of 20 atomic buckets, rotated by
/// whichever call first notices a new period; the random draw is one atomic add.
pub struct AdaptiveThrottle {
    epoch: Instant,
    bucket_ns: AtomicU64,
    k_bits: AtomicU64,
    buckets: [Bucket; BUCKETS],
    rng: FastRng,
    throttled: AtomicU64,
    throttled_counter: Counter,
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
            rng: FastRng::with_seed(seed),
            throttled: AtomicU64::new(0),
            throttled_counter: Counter::noop(),
        };
        t.update(settings);
        t
    }

    /// As [`new`](Self::new), counting local refusals in
    /// [`CLIENT_THROTTLED`](crate::metrics_names::CLIENT_THROTTLED) with `labels`.
    pub fn with_metrics(settings: &policy::ClientThrottle, labels: &crate::metrics_names::Labels) -> Self {
        let mut t = Self::new(settings);
        t.throttled_counter = labels.counter(crate::metrics_names::CLIENT_THROTTLED);
        t
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
        }
    }

    /// `K`.
    pub fn k(&self) -> f64 {
        f64::from_bits(self.k_bits.load(Ordering::Relaxed))
    }

    fn period(&self, now: Instant) -> u64 {
        let ns = u64::try_from(now.saturating_duration_since(self.epoch).as_nanos()).unwrap_or(u64::MAX);
        ns / self.bucket_ns.load(Ordering::Relaxed)
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

    /// `(requests, accepts)` over the window ending now.
    pub fn counts(&self) -> (u64, u64) {
        self.counts_at(Instant::now())
    }

    fn counts_at(&self, now: Instant) -> (u64, u64) {
        let period = self.period(now);
        let oldest = period.saturating_sub(BUCKETS as u64 - 1);
        self.buckets
            .iter()
            .filter(|b| (oldest..=period).contains(&b.period.load(Ordering::Acquire)))
            .fold((0, 0), |(r, a), b| {
                (r + b.requests.load(Ordering::Relaxed), a + b.accepts.load(Ordering::Relaxed))
            })
    }

    /// The probability that the next call is refused locally:
    /// `max(0, (requests − K × accepts) / (requests + 1))` over the window.
    pub fn reject_probability(&self) -> f64 {
        let (requests, accepts) = self.counts();
        probability(requests, accepts, self.k())
    }

    /// Decides whether to send a call: counts it as a request, and refuses it locally with
    /// the [`reject_probability`](Self::reject_probability). Call
    /// [`record_accept`](Self::record_accept) when the backend then serves it.
    ///
    /// # Errors
    /// [`Throttled`] when the call must not be sent.
    pub fn try_acquire(&self) -> Result<(), Throttled> {
        let now = Instant::now();
        let (requests, accepts) = self.counts_at(now);
        self.bucket(now).requests.fetch_add(1, Ordering::Relaxed);
        let p = probability(requests, accepts, self.k());
        if p > 0.0 && self.rng.next_f64() < p {
            self.throttled.fetch_add(1, Ordering::Relaxed);
            self.throttled_counter.increment(1);
            return Err(Throttled(()));
        }
        Ok(())
    }

    /// The backend accepted a call (answered anything but an overload rejection: a 2xx,
    /// a 404 and a 500 all count; a 429/503 or gRPC RESOURCE_EXHAUSTED / UNAVAILABLE does
    /// not).
    pub fn record_accept(&self) {
        self.bucket(Instant::now()).accepts.fetch_add(1, Ordering::Relaxed);
    }

    /// Calls refused locally so far.
    pub fn throttled(&self) -> u64 {
        self.throttled.load(Ordering::Relaxed)
    }
}

/// `max(0, (requests − k × accepts) / (requests + 1))`.
pub fn probability(requests: u64, accepts: u64, k: f64) -> f64 {
    let r = requests as f64;
    ((r - k * accepts as f64) / (r + 1.0)).max(0.0)
}

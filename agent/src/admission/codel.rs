use std::time::Duration;

use tokio::time::Instant;

/// Tracks whether the admission queue is in a standing-queue (overloaded) state, CoDel
/// style as Facebook's "Fail at Scale" applies RFC 8289 to server queues.
///
/// The queue is *overloaded* when it has not been empty for a whole `interval` (100 ms by
/// default), and stays so until a whole `interval` has passed since it last dropped a
/// waiter ([`dropped`](Self::dropped): waited past its timeout, or pushed out of a full
/// queue). A queued request normally may wait `interval`; while overloaded only `target`
/// (5 ms): a standing queue is drained by dropping what waited longest, while a burst that
/// drains within an interval is absorbed. The same state switches the queue to LIFO
/// (adaptive LIFO). RFC 8289 drops at a rate growing with the time spent above `target`;
/// the fixed short timeout is the server-queue variant the article and "Fail at Scale"
/// describe.
///
/// Why drops hold the state: the short timeout empties an overloaded queue by itself, and
/// an empty queue restarts the clock. Were that the end of the overload, the queue would
/// swing between the two states under a steady overload, letting waiters wait the whole
/// `interval` half of the time — the latency the state exists to avoid. A queue that
/// empties because its waiters were served, with nobody dropped for an interval, was not
/// overloaded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CoDel {
    target: Duration,
    interval: Duration,
    last_empty: Instant,
    last_drop: Option<Instant>,
}

impl CoDel {
    /// An empty queue at `now`.
    pub fn new(target: Duration, interval: Duration, now: Instant) -> Self {
        Self { target, interval, last_empty: now, last_drop: None }
    }

    /// Changes `target` and `interval`, keeping when the queue was last empty.
    pub fn set(&mut self, target: Duration, interval: Duration) {
        self.target = target;
        self.interval = interval;
    }

    /// Tells the controller the queue length at `now`; call it whenever the length
    /// changes (an empty queue resets the overload clock).
    pub fn observe(&mut self, now: Instant, queue_len: usize) {
        if queue_len == 0 {
            self.last_empty = now;
        }
    }

    /// A waiter was dropped at `now` (waited past its timeout, or pushed out of a full
    /// queue): the queue stays overloaded for an `interval` from now.
    pub fn dropped(&mut self, now: Instant) {
        self.last_drop = Some(now);
    }

    /// Whether the queue has been non-empty for at least `interval`, or dropped a waiter
    /// less than an `interval` ago.
    pub fn is_overloaded(&self, now: Instant) -> bool {
        now.saturating_duration_since(self.last_empty) >= self.interval
            || self.last_drop.is_some_and(|d| now.saturating_duration_since(d) < self.interval)
    }

    /// How long a queued request may wait at `now`: `target` while overloaded, else
    /// `interval`.
    pub fn timeout(&self, now: Instant) -> Duration {
        if self.is_overloaded(now) { self.target } else { self.interval }
    }

    /// The instant the overload state begins if the queue stays non-empty (when not
    /// overloaded now).
    pub fn overloaded_at(&self) -> Instant {
        self.last_empty + self.interval
    }

    /// `interval`: the timeout of waiters the short timeout does not apply to.
    pub fn interval(&self) -> Duration {
        self.interval
    }
}

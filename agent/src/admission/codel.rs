use std::time::Duration;

use tokio::time::Instant;

/// Tracks whether the admission queue is in a standing-queue (overloaded) state, CoDel
/// style as Facebook's "Fail at Scale" applies RFC 8289 to server queues.
///
/// The queue is *overloaded* when it has not been empty for a whole `interval` (100 ms by
/// default). A queued request normally may wait `interval`; while overloaded only
/// `target` (5 ms): a standing queue is drained by dropping what waited longest, while a
/// burst that drains within an interval is absorbed. The same state switches the queue
/// to LIFO (adaptive LIFO). RFC 8289 drops at a rate growing with the time spent above
/// `target`; the fixed short timeout is the server-queue variant the article and "Fail at
/// Scale" describe.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CoDel {
    target: Duration,
    interval: Duration,
    last_empty: Instant,
}

impl CoDel {
    /// An empty queue at `now`.
    pub fn new(target: Duration, interval: Duration, now: Instant) -> Self {
        Self { target, interval, last_empty: now }
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

    /// Whether the queue has been non-empty for at least `interval`.
    pub fn is_overloaded(&self, now: Instant) -> bool {
        now.saturating_duration_since(self.last_empty) >= self.interval
    }

    /// How long a queued request may wait at `now`: `target` while overloaded, else
    /// `interval`.
    pub fn timeout(&self, now: Instant) -> Duration {
        if self.is_overloaded(now) { self.target } else { self.interval }
    }

    /// The instant the overload state begins if the queue stays non-empty.
    pub fn overloaded_at(&self) -> Instant {
        self.last_empty + self.interval
    }

    /// `interval`: the timeout of waiters the short timeout does not apply to.
    pub fn interval(&self) -> Duration {
        self.interval
    }
}

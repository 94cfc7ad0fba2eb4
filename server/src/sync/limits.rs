//! The bound on new streams per second, so a mass reconnect cannot overwhelm the server.

/// Default bound on new streams per second. At 2,000 a restart re-admits 10,000 agents in
/// about 5 s of admission (13 s to all re-synced, measured: docs/benchmarks.md); at 500 the
/// admission alone took 20 s and the refused agents' backoff stretched it to 43 s.
pub const NEW_STREAMS_PER_SEC: u32 = 2_000;

/// Token bucket bounding new streams per second.
#[derive(Debug)]
pub(super) struct StreamLimiter {
    rate: f64,
    state: tokio::sync::Mutex<(f64, tokio::time::Instant)>,
}

impl StreamLimiter {
    pub(super) fn new(rate: u32) -> Self {
        let rate = f64::from(rate.max(1));
        StreamLimiter { rate, state: tokio::sync::Mutex::new((rate, tokio::time::Instant::now())) }
    }

    pub(super) async fn try_take(&self) -> bool {
        let mut s = self.state.lock().await;
        let now = tokio::time::Instant::now();
        let refill = now.duration_since(s.1).as_secs_f64() * self.rate;
        s.0 = (s.0 + refill).min(self.rate);
        s.1 = now;
        if s.0 >= 1.0 {
            s.0 -= 1.0;
            true
        } else {
            false
        }
    }
}

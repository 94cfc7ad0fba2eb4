//! Timings of the sync client, each a named default.

use std::time::Duration;

/// Heartbeat interval assumed until the server announces its own (`Heartbeat.interval_ms`).
pub const DEFAULT_HEARTBEAT_INTERVAL: Duration = Duration::from_secs(15);
/// Heartbeat intervals without any message after which the stream is considered dead.
pub const DEFAULT_MISSED_HEARTBEATS: u32 = 3;
/// Largest heartbeat interval accepted from a server (a larger announced value is capped).
pub const MAX_HEARTBEAT_INTERVAL: Duration = Duration::from_secs(600);
/// First reconnect backoff ceiling (attempt 0 waits uniform(0, 1 s)).
pub const DEFAULT_BACKOFF_BASE: Duration = Duration::from_secs(1);
/// Growth of the backoff ceiling per failed attempt.
pub const DEFAULT_BACKOFF_FACTOR: f64 = 1.6;
/// Largest backoff ceiling.
pub const DEFAULT_BACKOFF_CAP: Duration = Duration::from_secs(60);
/// Upper bound of the random delay before reconnecting after an established stream drops
/// or the server says `GoAway`, so a server restart does not bring every agent back in
/// the same second.
pub const DEFAULT_RECONNECT_JITTER: Duration = Duration::from_secs(1);
/// Wait after the server refuses the agent's token (`UNAUTHENTICATED` /
/// `PERMISSION_DENIED`); the actual wait is uniform in ±[`UNAUTHORIZED_JITTER`] of it.
pub const DEFAULT_UNAUTHORIZED_BACKOFF: Duration = Duration::from_secs(300);
/// Relative jitter of the unauthorized backoff (0.2 = ±20 %).
pub const UNAUTHORIZED_JITTER: f64 = 0.2;
/// Interval of the status reports sent to the server.
pub const DEFAULT_STATUS_INTERVAL: Duration = Duration::from_secs(10);
/// Smallest gap between a status report and the extra one sent because a breaker changed
/// state, or a dependency or feature started or stopped being served by a fallback: the
/// server's service page shows the change within about this long, and a flapping breaker
/// adds at most one report per gap to the stream.
pub const DEFAULT_MIN_REPORT_GAP: Duration = Duration::from_secs(1);
/// Interval at which the staleness gauges are refreshed while nothing happens.
pub const DEFAULT_METRICS_INTERVAL: Duration = Duration::from_secs(5);
/// Time limit of establishing a connection (TCP + HTTP/2).
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// HTTP/2 PING interval (CP-10: the server's keepalive policy must accept it).
pub const DEFAULT_HTTP2_KEEPALIVE_INTERVAL: Duration = Duration::from_secs(30);
/// Time to wait for a PING acknowledgement before closing the connection.
pub const DEFAULT_HTTP2_KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(10);
/// TCP keepalive idle time.
pub const DEFAULT_TCP_KEEPALIVE: Duration = Duration::from_secs(60);
/// Stream attempts in a row that fail before any message, after which the client polls
/// over HTTP (when an `http_fallback` URL is set).
pub const DEFAULT_HTTP_FALLBACK_AFTER: u32 = 3;
/// How long the client polls over HTTP before trying the stream again.
pub const DEFAULT_HTTP_FALLBACK_PERIOD: Duration = Duration::from_secs(60);
/// Wait of one HTTP long-poll (the server caps it at 30 s).
pub const DEFAULT_HTTP_LONG_POLL: Duration = Duration::from_secs(25);

/// Timings of the sync client, each with its named default (the `DEFAULT_*` constants of
/// this module); tests shrink them.
#[derive(Clone, Debug, PartialEq)]
pub struct SyncClientSettings {
    /// Heartbeat interval assumed until the server announces one.
    /// Default: [`DEFAULT_HEARTBEAT_INTERVAL`].
    pub heartbeat_interval: Duration,
    /// Intervals without any message after which the stream is dead (CP-5).
    /// Default: [`DEFAULT_MISSED_HEARTBEATS`].
    pub missed_heartbeats: u32,
    /// First backoff ceiling; attempt `n` waits uniform(0, min(cap, base × factorⁿ)).
    /// Default: [`DEFAULT_BACKOFF_BASE`].
    pub backoff_base: Duration,
    /// Growth of the ceiling per failed attempt.
    /// Default: [`DEFAULT_BACKOFF_FACTOR`].
    pub backoff_factor: f64,
    /// Largest backoff ceiling, however many attempts failed.
    /// Default: [`DEFAULT_BACKOFF_CAP`].
    pub backoff_cap: Duration,
    /// Upper bound of the random delay after an established stream drops or `GoAway`.
    /// Default: [`DEFAULT_RECONNECT_JITTER`].
    pub reconnect_jitter: Duration,
    /// Wait after an authorization failure (jittered ±[`UNAUTHORIZED_JITTER`]) (CP-7).
    /// Default: [`DEFAULT_UNAUTHORIZED_BACKOFF`].
    pub unauthorized_backoff: Duration,
    /// Interval of the status reports sent to the server.
    /// Default: [`DEFAULT_STATUS_INTERVAL`].
    pub status_interval: Duration,
    /// Smallest gap between a report and the extra report of a change to breakers,
    /// fallbacks or degraded features (sent at once when the last report is older).
    /// Default: [`DEFAULT_MIN_REPORT_GAP`].
    pub min_report_gap: Duration,
    /// Interval of the staleness-gauge refreshes (`levee_config_age_seconds`).
    /// Default: [`DEFAULT_METRICS_INTERVAL`].
    pub metrics_interval: Duration,
    /// Time limit of establishing a connection.
    /// Default: [`DEFAULT_CONNECT_TIMEOUT`].
    pub connect_timeout: Duration,
    /// HTTP/2 PING interval; pings are sent while idle too.
    /// Default: [`DEFAULT_HTTP2_KEEPALIVE_INTERVAL`].
    pub http2_keepalive_interval: Duration,
    /// Wait for a PING acknowledgement before the connection is closed.
    /// Default: [`DEFAULT_HTTP2_KEEPALIVE_TIMEOUT`].
    pub http2_keepalive_timeout: Duration,
    /// TCP keepalive idle time of the connection to the server.
    /// Default: [`DEFAULT_TCP_KEEPALIVE`].
    pub tcp_keepalive: Duration,
    /// Base URL of the server's HTTP API (`http://levee:8080`) for the long-poll fallback
    /// where gRPC is blocked; `None` (default): no fallback.
    pub http_fallback: Option<String>,
    /// Stream attempts in a row failing before the fallback is used (0: never).
    /// Default: [`DEFAULT_HTTP_FALLBACK_AFTER`].
    pub http_fallback_after: u32,
    /// Time spent polling over HTTP before the stream is tried again.
    /// Default: [`DEFAULT_HTTP_FALLBACK_PERIOD`].
    pub http_fallback_period: Duration,
    /// Wait of one long-poll (at most 30 s, the server's cap).
    /// Default: [`DEFAULT_HTTP_LONG_POLL`].
    pub http_long_poll: Duration,
}

impl Default for SyncClientSettings {
    fn default() -> Self {
        Self {
            heartbeat_interval: DEFAULT_HEARTBEAT_INTERVAL,
            missed_heartbeats: DEFAULT_MISSED_HEARTBEATS,
            backoff_base: DEFAULT_BACKOFF_BASE,
            backoff_factor: DEFAULT_BACKOFF_FACTOR,
            backoff_cap: DEFAULT_BACKOFF_CAP,
            reconnect_jitter: DEFAULT_RECONNECT_JITTER,
            unauthorized_backoff: DEFAULT_UNAUTHORIZED_BACKOFF,
            status_interval: DEFAULT_STATUS_INTERVAL,
            min_report_gap: DEFAULT_MIN_REPORT_GAP,
            metrics_interval: DEFAULT_METRICS_INTERVAL,
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            http2_keepalive_interval: DEFAULT_HTTP2_KEEPALIVE_INTERVAL,
            http2_keepalive_timeout: DEFAULT_HTTP2_KEEPALIVE_TIMEOUT,
            tcp_keepalive: DEFAULT_TCP_KEEPALIVE,
            http_fallback: None,
            http_fallback_after: DEFAULT_HTTP_FALLBACK_AFTER,
            http_fallback_period: DEFAULT_HTTP_FALLBACK_PERIOD,
            http_long_poll: DEFAULT_HTTP_LONG_POLL,
        }
    }
}

/// The sync client's reconnect backoff: exponential with full jitter, failed attempt `n`
/// (from 0) waits uniform(0, min(cap, base × factorⁿ)); reset only after a message arrived
/// on a stream. Unlike the retry stage's [`Backoff`](crate::retry::Backoff) (factor 2,
/// shared by concurrent calls, no state) it grows by `backoff_factor` (default 1.6, as
/// gRPC's connection backoff) and counts its own attempts.
#[derive(Clone, Debug)]
pub(crate) struct ReconnectBackoff {
    base: Duration,
    factor: f64,
    cap: Duration,
    attempt: u32,
}

impl ReconnectBackoff {
    pub(crate) fn new(s: &SyncClientSettings) -> Self {
        Self { base: s.backoff_base, factor: s.backoff_factor.max(1.0), cap: s.backoff_cap, attempt: 0 }
    }

    /// Ceiling of the next delay.
    pub(crate) fn ceiling(&self) -> Duration {
        let grown = self.base.as_secs_f64() * self.factor.powi(self.attempt.min(1000) as i32);
        Duration::from_secs_f64(grown.min(self.cap.as_secs_f64()))
    }

    /// The next delay (uniform in [0, ceiling]); counts the attempt.
    pub(crate) fn next_delay(&mut self) -> Duration {
        let ceiling = self.ceiling();
        self.attempt = self.attempt.saturating_add(1);
        uniform(Duration::ZERO, ceiling)
    }

    pub(crate) fn reset(&mut self) {
        self.attempt = 0;
    }
}

/// A uniformly random duration in `[lo, hi]`.
pub(crate) fn uniform(lo: Duration, hi: Duration) -> Duration {
    use rand::Rng;
    if hi <= lo {
        return lo;
    }
    let x: f64 = rand::rng().random_range(0.0..=1.0);
    lo + (hi - lo).mul_f64(x)
}

/// The wait after an authorization failure: `base` ± [`UNAUTHORIZED_JITTER`].
pub(crate) fn unauthorized_delay(base: Duration) -> Duration {
    uniform(base.mul_f64(1.0 - UNAUTHORIZED_JITTER), base.mul_f64(1.0 + UNAUTHORIZED_JITTER))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_ceiling_grows_by_factor_up_to_cap_and_resets() {
        let mut b = ReconnectBackoff::new(&SyncClientSettings::default());
        let mut ceilings = Vec::new();
        for _ in 0..12 {
            ceilings.push(b.ceiling().as_millis());
            let d = b.next_delay();
            assert!(d <= Duration::from_millis(*ceilings.last().unwrap() as u64 + 1), "{d:?}");
        }
        assert_eq!(&ceilings[..5], &[1000, 1600, 2560, 4096, 6553]);
        assert_eq!(ceilings[11], 60_000, "{ceilings:?}");
        b.reset();
        assert_eq!(b.ceiling(), Duration::from_secs(1));
    }

    #[test]
    fn full_jitter_spreads_over_the_whole_range() {
        let s = SyncClientSettings { backoff_base: Duration::from_secs(10), ..SyncClientSettings::default() };
        let delays: Vec<Duration> = (0..400).map(|_| ReconnectBackoff::new(&s).next_delay()).collect();
        assert!(delays.iter().all(|d| *d <= Duration::from_secs(10)));
        // Full jitter: some land in the bottom and some in the top tenth.
        assert!(delays.iter().any(|d| *d < Duration::from_secs(1)));
        assert!(delays.iter().any(|d| *d > Duration::from_secs(9)));
    }

    #[test]
    fn unauthorized_delay_stays_within_twenty_percent() {
        for _ in 0..200 {
            let d = unauthorized_delay(Duration::from_secs(300));
            assert!(d >= Duration::from_secs(240) && d <= Duration::from_secs(360), "{d:?}");
        }
    }
}

//! Why a stream was refused, and the log that says so without flooding.

use std::collections::HashMap;
use std::time::Duration;

use tonic::Status;

/// At most one log line per refusal reason per this interval (the others are counted in
/// `levee_server_streams_refused_total` and summed into the next line).
pub const REFUSAL_LOG_INTERVAL: Duration = Duration::from_secs(10);

/// Why a stream was refused, for the rate-limited log and the metric label.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(super) enum Refusal {
    ShuttingDown,
    Rate,
    Unauthenticated,
    Unavailable,
    Hello,
    Scope,
}

impl Refusal {
    fn label(self) -> &'static str {
        match self {
            Refusal::ShuttingDown => "shutting_down",
            Refusal::Rate => "rate",
            Refusal::Unauthenticated => "unauthenticated",
            Refusal::Unavailable => "database_unavailable",
            Refusal::Hello => "bad_hello",
            Refusal::Scope => "scope",
        }
    }
}

/// Logs stream refusals, structured, at most once per reason per
/// [`REFUSAL_LOG_INTERVAL`] (a mass reconnect refused by the rate limit is one line every
/// few seconds with a count, not thousands).
#[derive(Debug, Default)]
pub(super) struct RefusalLog {
    #[allow(clippy::disallowed_types)] // short critical section, never held across an await
    last: std::sync::Mutex<HashMap<Refusal, (tokio::time::Instant, u64)>>,
}

impl RefusalLog {
    /// Counts a refusal and logs it unless one of its reason was logged within the
    /// interval. Returns the number of refusals the line it wrote summed up, `None` when
    /// it wrote none.
    pub(super) fn refused(
        &self,
        why: Refusal,
        status: &Status,
        peer: Option<std::net::SocketAddr>,
    ) -> Option<u64> {
        self.refused_at(tokio::time::Instant::now(), why, status, peer)
    }

    fn refused_at(
        &self,
        now: tokio::time::Instant,
        why: Refusal,
        status: &Status,
        peer: Option<std::net::SocketAddr>,
    ) -> Option<u64> {
        metrics::counter!("levee_server_streams_refused_total", "reason" => why.label()).increment(1);
        let suppressed = {
            let mut m = self.last.lock().unwrap_or_else(|e| e.into_inner());
            match m.get_mut(&why) {
                Some((at, n)) if now.duration_since(*at) < REFUSAL_LOG_INTERVAL => {
                    *n += 1;
                    return None;
                }
                Some((at, n)) => {
                    *at = now;
                    std::mem::take(n)
                }
                None => {
                    m.insert(why, (now, 0));
                    0
                }
            }
        };
        let peer = peer.map(|p| p.to_string()).unwrap_or_default();
        let code = format!("{:?}", status.code());
        match why {
            Refusal::Unavailable | Refusal::ShuttingDown | Refusal::Rate => tracing::warn!(
                reason = why.label(), code = %code, detail = %status.message(), peer = %peer,
                suppressed_since_last = suppressed, "agent stream refused"
            ),
            _ => tracing::info!(
                reason = why.label(), code = %code, detail = %status.message(), peer = %peer,
                suppressed_since_last = suppressed, "agent stream refused"
            ),
        }
        Some(suppressed)
    }
}

#[cfg(test)]
mod tests {
    use super::{REFUSAL_LOG_INTERVAL, Refusal, RefusalLog};

    /// A refusal storm is one log line per reason per interval, the next one saying how
    /// many were not logged; another reason is logged on its own.
    #[test]
    fn refusals_are_logged_once_per_reason_per_interval_with_the_count() {
        let log = RefusalLog::default();
        let t0 = tokio::time::Instant::now();
        let busy = tonic::Status::unavailable("too many new streams");
        assert_eq!(log.refused_at(t0, Refusal::Rate, &busy, None), Some(0));
        for _ in 0..99 {
            assert_eq!(log.refused_at(t0, Refusal::Rate, &busy, None), None);
        }
        let bad = tonic::Status::unauthenticated("agent token refused");
        assert_eq!(log.refused_at(t0, Refusal::Unauthenticated, &bad, None), Some(0));
        let later = t0 + REFUSAL_LOG_INTERVAL;
        assert_eq!(log.refused_at(later, Refusal::Rate, &busy, None), Some(99));
        assert_eq!(log.refused_at(later, Refusal::Rate, &busy, None), None);
    }
}

use std::time::{Duration, SystemTime};

/// Longest `Retry-After` honoured; a larger value is treated as absent (a misconfigured or
/// hostile server must not park a client for days).
pub const MAX_RETRY_AFTER: Duration = Duration::from_secs(3600);

/// Parses a `Retry-After` header value (RFC 9110 §10.2.3): either delay-seconds (ASCII
/// digits) or an HTTP-date, relative to the wall-clock `now`.
///
/// Returns the delay to wait; a date in the past gives zero. Returns `None` for a
/// malformed value, a negative or fractional number, or anything above
/// [`MAX_RETRY_AFTER`]. Never panics.
pub fn parse_retry_after(value: &[u8], now: SystemTime) -> Option<Duration> {
    let text = std::str::from_utf8(value).ok()?.trim();
    if text.is_empty() {
        return None;
    }
    let delay = if text.bytes().all(|b| b.is_ascii_digit()) {
        // More than 10 digits is far beyond the maximum anyway.
        if text.len() > 10 {
            return None;
        }
        Duration::from_secs(text.parse().ok()?)
    } else {
        let at = httpdate::parse_http_date(text).ok()?;
        at.duration_since(now).unwrap_or(Duration::ZERO)
    };
    (delay <= MAX_RETRY_AFTER).then_some(delay)
}

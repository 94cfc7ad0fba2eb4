use http::{HeaderMap, HeaderValue};

use super::ErrorKind;

/// Header (and gRPC metadata key) marking an outgoing request that its sender will retry.
///
/// A service that receives a marked request does not retry its own outgoing calls for it,
/// except once for a connection-level failure that never reached the peer: retries happen
/// on one layer only, so three layers of 3 attempts cost 3 (+1) calls at the bottom, not 27.
pub const RETRIED_HEADER: &str = "levee-retried";

/// Marks an outgoing request as one the agent will retry (sets `levee-retried: 1`).
pub fn mark_outgoing(headers: &mut HeaderMap) {
    headers.insert(RETRIED_HEADER, HeaderValue::from_static("1"));
}

/// Whether an inbound request carries the retry marker.
pub fn inbound_is_marked(headers: &HeaderMap) -> bool {
    headers.contains_key(RETRIED_HEADER)
}

/// Whether "retry on one layer" allows another attempt.
///
/// Inputs: `inbound_retried` (the inbound request was marked), `attempts_made` so far,
/// and the last error's kind. Unmarked requests are not restricted here. Marked ones get
/// exactly one extra attempt, and only after a first attempt that failed to connect
/// ([`ErrorKind::Connect`]: the peer never saw the request).
pub fn one_layer_allows(inbound_retried: bool, attempts_made: u32, last: &ErrorKind) -> bool {
    !inbound_retried || (attempts_made == 1 && last.never_reached_peer())
}

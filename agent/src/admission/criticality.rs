use http::HeaderMap;

use crate::deadline::{CRITICALITY_HEADER, parse_criticality};
use crate::policy::Criticality;

/// The criticality of an inbound request: the `levee-criticality` header (HTTP) or
/// metadata entry (gRPC, the same HTTP/2 header) when it carries exactly one SRE name
/// (`CRITICAL_PLUS`, `CRITICAL`, `SHEDDABLE_PLUS`, `SHEDDABLE`, case-insensitive), lowered
/// to `max` when it claims more; otherwise `default` (the route's).
///
/// An absent, unknown, empty, non-UTF-8 or repeated value falls back to `default`: a
/// caller sending two values is not trusted with either. Never panics.
pub fn from_headers(headers: &HeaderMap, default: Criticality, max: Criticality) -> Criticality {
    let mut values = headers.get_all(CRITICALITY_HEADER).iter();
    match (values.next(), values.next()) {
        // `Criticality` orders highest first: the larger of the two is the less critical.
        (Some(v), None) => parse_criticality(v.as_bytes()).map_or(default, |c| c.max(max)),
        _ => default,
    }
}

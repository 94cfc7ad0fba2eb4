use http::HeaderMap;

use super::route::{OVERFLOW_ROUTE, UNMATCHED_ROUTE};
use crate::deadline::{CRITICALITY_HEADER, parse_criticality};
use crate::policy::{Criticality, Inbound};

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

/// The criticality of a request to `route` that carries none (agent-semantics §5, issue
/// IN-8): the route's in the policy (`inbound.routes.<route>.criticality`), else
/// `inbound.default_criticality`, else by the request, so that the default policy sheds
/// bulk traffic before the traffic a service cannot lose:
///
/// * routes of the safe methods (`"GET …"`, `"HEAD …"`, `"OPTIONS …"`): SHEDDABLE_PLUS —
///   reads, which a client can repeat;
/// * requests that match no route ([`UNMATCHED_ROUTE`], [`OVERFLOW_ROUTE`]): SHEDDABLE;
/// * everything else — other methods (`POST /checkout`), gRPC methods, plain API names:
///   CRITICAL.
///
/// Health probes never reach this: their routes are exempt. One line of policy makes a
/// read critical: `inbound.routes."GET /cart".criticality: CRITICAL`.
pub fn route_criticality(inbound: &Inbound, route: &str) -> Criticality {
    if let Some(c) = inbound.routes.get(route).and_then(|r| r.criticality).or(inbound.default_criticality) {
        return c;
    }
    if route == UNMATCHED_ROUTE || route == OVERFLOW_ROUTE {
        return Criticality::Sheddable;
    }
    match route.split_once(' ').map(|(method, _)| method) {
        Some("GET" | "HEAD" | "OPTIONS") => Criticality::SheddablePlus,
        _ => Criticality::Critical,
    }
}

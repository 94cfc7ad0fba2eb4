//! Inbound admission: concurrency limits, criticality, a CoDel queue with adaptive LIFO,
//! operator levers and shadow mode, protecting a service from its own clients
//! (agent-semantics §5).
//!
//! One [`Admission`] engine per service ([`Agent::admission`](crate::Agent::admission)),
//! shared by the tower [`AdmissionLayer`] for servers (axum, hyper, tonic) and the plain
//! API ([`Admission::admit`] → [`AdmissionPermit`]). docs/agent-guide.md shows this
//! example too (both are compiled as doctests):
//!
//! ```
//! # use axum::routing::{get, post};
//! # use levee_agent::AdmissionRequest;
//! # use levee_agent::policy::Criticality;
//! # async fn example(agent: levee_agent::Agent) {
//! let app = axum::Router::new()
//!     .route("/quote/{sku}", get(|| async { "42" }))
//!     .route("/orders", post(|| async { "created" }))
//!     .route("/healthz", get(|| async { "ok" })) // never shed
//!     .layer(agent.admission_layer()); // Router::layer: the matched template is known
//!
//! // Anything else (a queue consumer, a custom protocol): the plain API.
//! let admission = agent.admission(); // the same engine: one limit for the whole service
//! let req = AdmissionRequest::new("CONSUME orders").criticality(Criticality::SheddablePlus);
//! match admission.admit(&req).await {
//!     Ok(permit) => { /* do the work; dropping the permit records its latency */ drop(permit) }
//!     Err(rejected) => { /* overloaded: rejected.reason(), rejected.retry_after() */ }
//! }
//! # let _: axum::Router = app;
//! # }
//! ```
//!
//! # Order
//! Each request, outside in:
//! 1. **Route** by template ([`route_key`]), never the raw path; a gRPC method path the
//!    service has not answered yet (nor the policy named) shares [`UNMATCHED_ROUTE`], so
//!    clients cannot fill the table (IN-7); at most [`MAX_TRACKED_ROUTES`] routes, later
//!    ones share [`OVERFLOW_ROUTE`] (counted).
//! 2. **Exempt routes** ([`DEFAULT_EXEMPT_PATHS`], [`Admission::exempt`]: health,
//!    readiness, metrics) are admitted without a slot: never shed.
//! 3. **Read-only mode**: a route marked `mutating` is refused while the read-only flag is
//!    on (also in shadow mode: it is a deliberate switch, not a policy on trial).
//! 4. **Operator shedding**: `shed_sheddable_percent` of SHEDDABLE and SHEDDABLE_PLUS.
//! 5. **Deadline** (only one a caller sent: a request without one is never dropped for
//!    lack of time): an expired deadline is refused; while the service is busy (the
//!    request would have to wait for a slot), so is one shorter than the route's expected
//!    service time. An idle service refuses no route for its learned service time (IN-4).
//! 6. **CRITICAL_PLUS** is admitted even past the limit (never shed; it still counts in
//!    flight, so it pushes lower criticalities into the queue).
//! 7. **Concurrency limit** (fixed, AIMD, Gradient2, Vegas — [`limit`]): a free slot is
//!    taken at once when nobody waits.
//! 8. **Queue**: otherwise the request waits, highest criticality first; an arrival finding
//!    the queue full displaces the oldest waiter of a lower criticality, else is refused.
//!    CoDel ([`CoDel`]) bounds the wait and switches the queue to LIFO while overloaded.
//!
//! In shadow mode steps 4–8 decide and count but reject nothing: a would-be rejection is
//! admitted without a slot (so later decisions are those enforce mode would make), and a
//! request that would have waited is admitted at once and counted as `would_queue`.

mod codel;
mod criticality;
mod engine;
mod error;
mod future;
mod layer;
pub mod limit;
mod permit;
mod queue;
mod reason;
mod response;
mod route;
mod service;
mod status;

/// Client-side throttling lives with the outgoing side (`retry`), which enforces it.
pub use crate::retry::{AdaptiveThrottle, Throttled, throttle_probability};
pub use codel::CoDel;
pub use criticality::{from_headers as criticality_from_headers, route_criticality};
pub use engine::{Admission, AdmissionRequest};
pub use error::{RETRY_AFTER_OVERLOAD, RETRY_AFTER_READ_ONLY, Rejected};
pub use future::{Admit, ResponseFuture};
pub use layer::AdmissionLayer;
pub use permit::{AdmissionPermit, Outcome};
pub use reason::Reason;
pub use response::AdmissionBody;
pub use route::{
    DEFAULT_EXEMPT_PATHS, MAX_TRACKED_ROUTES, OVERFLOW_ROUTE, RouteKey, RouteTemplate, UNMATCHED_ROUTE,
    route_key,
};
pub use service::AdmissionService;
pub use status::{AdmissionStatus, RouteStatus, ShedCount};

#[cfg(test)]
mod tests;

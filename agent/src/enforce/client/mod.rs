//! The tower path: [`DependencyLayer`] enforces a dependency's policy around any client
//! `tower::Service` (hyper, tonic, a `reqwest::Client`, …), laid out as tower's
//! `limit/concurrency`:
//!
//! * `layer.rs` — [`DependencyLayer`], which applies the service;
//! * `service.rs` — [`DependencyService`], which runs each request through the one
//!   enforcement function (`run.rs`), exactly as [`Dependency::call`](super::Dependency::call);
//! * `future.rs` — [`ResponseFuture`], its response future (pin-projected);
//! * `policy.rs` — [`CallPolicy`], what the stack makes of a request and of a result
//!   (operation, idempotency, replay, propagation headers, judgement, the response handed
//!   back), with ready-made [`ErrorPolicy`], [`HttpPolicy`] and [`GrpcPolicy`];
//! * `body.rs` — [`AttemptBody`], an HTTP response body bounded by its attempt's deadline.
//!
//! # The attempt covers the body
//! An HTTP response is judged at its head, but the caller still has to read the body. With
//! [`HttpPolicy`] and [`GrpcPolicy`] the body comes back as an [`AttemptBody`]: reading it
//! fails with [`AttemptTimeout`](super::AttemptTimeout) once the attempt's deadline
//! (min(attempt timeout, remaining budget − reserve, non-critical cap)) has passed, so a
//! body that arrives late cannot hold the caller past its attempt timeout or its deadline.

mod body;
mod future;
mod layer;
mod policy;
mod service;

pub use body::AttemptBody;
pub use future::ResponseFuture;
pub use layer::DependencyLayer;
pub use policy::{
    Attempt, CallPolicy, ErrorPolicy, GrpcPolicy, HttpPolicy, Operation, OperationFrom, ReplayBody,
    ReplayRequest, propagate,
};
pub use service::DependencyService;

#[cfg(feature = "reqwest-middleware")]
pub(crate) use policy::http_status_judgement;

//! Levee agent: embed it in a service to receive its resilience policy and kill switches
//! from a Levee server and enforce them locally.
//!
//! The crate holds the [`policy`] model shared with the server, the generated sync
//! protocol ([`proto`]), and the enforcement and sync machinery.

pub mod breaker;
pub mod bulkhead;
pub mod deadline;
pub mod fallback;
pub mod fault;
pub mod metrics_names;
pub mod outlier;
pub mod policy;
pub mod retry;

/// Generated types and stubs of the `levee.sync.v1` gRPC protocol.
#[allow(missing_docs, missing_debug_implementations, clippy::all)]
pub mod proto {
    tonic::include_proto!("levee.sync.v1");
}

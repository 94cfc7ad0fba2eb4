//! Middleware that gives every inbound request its request context: the deadline, the
//! criticality and the upstream retry marker, read from the request's headers and the
//! service's policy, so outgoing calls made while handling it are bounded by it.
//!
//! Headers read: `grpc-timeout` (gRPC) or `levee-deadline-ms` (relative milliseconds) for
//! the budget — capped by the policy's `max_deadline`, `default_deadline` (or the route's
//! `deadline`) when absent or malformed; `levee-criticality` (SRE names) — else the route's
//! ([`route_criticality`]); `levee-retried` — the caller already
//! retries this request, so outgoing calls made for it are not retried again (retry on one
//! layer). Routes are matched by template (`"GET /quote/{sku}"`: axum's `MatchedPath`, a
//! [`RouteTemplate`](crate::admission::RouteTemplate) extension, or a gRPC method path; see
//! [`route_key`]), never by raw path. [`Agent::admission_layer`] does all of this too, and
//! admits the request.

use std::fmt;
use std::task::{Context, Poll};

use tower::{Layer, Service};

use crate::Agent;
use crate::admission::{criticality_from_headers, route_criticality, route_key};
use crate::deadline::{self, RequestContext};
use crate::retry::inbound_is_marked;

/// Applies [`InboundContext`]. Build with [`Agent::inbound_layer`].
#[derive(Clone)]
pub struct InboundContextLayer {
    agent: Agent,
}

impl fmt::Debug for InboundContextLayer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("InboundContextLayer").finish_non_exhaustive()
    }
}

impl InboundContextLayer {
    /// A layer reading the policy of `agent`.
    pub fn new(agent: Agent) -> Self {
        Self { agent }
    }
}

impl Agent {
    /// A tower layer for the service's inbound side (axum, hyper, tonic): gives each
    /// request its deadline, criticality and retry marker from its headers and this
    /// agent's policy (see [`crate::inbound`]).
    // Defined here rather than in `agent.rs`: the layer wraps an `Agent`, so this module
    // depends on `agent` and `agent` must not depend back on it.
    pub fn inbound_layer(&self) -> InboundContextLayer {
        InboundContextLayer::new(self.clone())
    }
}

impl<S> Layer<S> for InboundContextLayer {
    type Service = InboundContext<S>;

    fn layer(&self, inner: S) -> Self::Service {
        InboundContext { inner, agent: self.agent.clone() }
    }
}

/// Runs the inner service inside the request's context (see the module docs).
#[derive(Clone)]
pub struct InboundContext<S> {
    inner: S,
    agent: Agent,
}

impl<S: fmt::Debug> fmt::Debug for InboundContext<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("InboundContext").field("inner", &self.inner).finish_non_exhaustive()
    }
}

/// The request context an inbound request with these parts gets under `agent`'s policy.
pub fn context_for<B>(agent: &Agent, req: &http::Request<B>) -> RequestContext {
    let config = agent.config();
    let policy = &config.policy;
    let key = route_key(req);
    let route = policy.inbound.routes.get(key.as_str());
    let default_budget = route.and_then(|r| r.deadline).unwrap_or(policy.default_deadline);
    let headers = req.headers();
    let route_criticality = route_criticality(&policy.inbound, key.as_str());
    let criticality =
        criticality_from_headers(headers, route_criticality, policy.inbound.max_header_criticality);
    let (deadline, from_caller) = deadline::inbound_budget(headers, policy.max_deadline, default_budget);
    RequestContext { deadline, from_caller, criticality, inbound_retried: inbound_is_marked(headers) }
}

impl<S, B> Service<http::Request<B>> for InboundContext<S>
where
    S: Service<http::Request<B>>,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = std::pin::Pin<Box<dyn std::future::Future<Output = Result<S::Response, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        let ctx = context_for(&self.agent, &req);
        let fut = self.inner.call(req);
        Box::pin(deadline::with_context(ctx, fut))
    }
}

use std::task::{Context, Poll};

use http::{Request, Response};
use tower::Service;

use super::engine::Start;
use super::future::{Confirm, ResponseFuture};
use super::permit::{CoreRef, Outcome};
use super::response::AdmissionBody;
use super::route::{UNMATCHED_ROUTE, is_grpc, route_key_known};
use super::{Admission, criticality};
use crate::deadline::{RequestContext, inbound_budget, scope};
use crate::retry::inbound_is_marked;

/// Admits every request of a server before it reaches the inner service, and runs the
/// admitted ones inside their request context (deadline, criticality, retry marker — what
/// [`InboundContext`](crate::InboundContext) does, so this layer replaces it).
///
/// Per request: the route is its template (see [`route_key`](super::route_key); a gRPC
/// method path the service has not answered yet counts as `_unmatched`, so a client cannot
/// fill the route table with paths of its choice), the
/// criticality comes from `levee-criticality` (capped by
/// `inbound.max_header_criticality`, else the route's), the deadline from `grpc-timeout` /
/// `levee-deadline-ms` (else the route's or the service's default, which bounds the
/// outgoing calls but never gets the request dropped for lack of time). A rejected request is
/// answered at once — HTTP 503 with `Retry-After` and a problem+json body; gRPC
/// RESOURCE_EXHAUSTED (UNAVAILABLE in read-only mode) with `grpc-retry-pushback-ms` —
/// without calling the inner service. The inner service's errors pass through unchanged.
///
/// A finished request's latency feeds the concurrency limit; a 503/504 answer (or gRPC
/// UNAVAILABLE / RESOURCE_EXHAUSTED / DEADLINE_EXCEEDED) counts as a drop; a request
/// whose future is dropped (client gone) or whose inner service errs counts for nothing.
#[derive(Clone, Debug)]
pub struct AdmissionService<S> {
    inner: S,
    admission: Admission,
}

impl<S> AdmissionService<S> {
    /// Wraps `inner`.
    pub fn new(inner: S, admission: Admission) -> Self {
        Self { inner, admission }
    }

    /// The inner service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The inner service, mutably.
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    /// Unwraps the inner service.
    pub fn into_inner(self) -> S {
        self.inner
    }
}

impl<S, B, RB> Service<Request<B>> for AdmissionService<S>
where
    S: Service<Request<B>, Response = Response<RB>> + Clone,
{
    type Response = Response<AdmissionBody<RB>>;
    type Error = S::Error;
    type Future = ResponseFuture<S, Request<B>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        let admission = &self.admission;
        let settings = admission.settings();
        let (key, known) = route_key_known(&req);
        // A gRPC method path is the client's word: it gets a slot of its own only once
        // the service has answered it (IN-7).
        let (entry, confirm) = match known {
            true => (admission.route(&settings, key.as_str()), None),
            false => match admission.tracked_route(&settings, key.as_str()) {
                Some(entry) => (entry, None),
                None => (
                    admission.route(&settings, UNMATCHED_ROUTE),
                    Some(Box::new(Confirm { admission: admission.clone(), key })),
                ),
            },
        };
        let grpc = is_grpc(&req);
        let headers = req.headers();
        let budget = entry.deadline.unwrap_or(settings.default_deadline);
        let (deadline, from_caller) = inbound_budget(headers, settings.max_deadline, budget);
        let ctx = RequestContext {
            deadline,
            from_caller,
            criticality: criticality::from_headers(
                headers,
                entry.criticality,
                settings.inbound.max_header_criticality,
            ),
            inbound_retried: inbound_is_marked(headers),
        };
        let owner = || CoreRef::Shared(admission.core().clone());
        match admission.start(
            &settings,
            &entry,
            ctx.criticality,
            // Only a deadline the caller sent can make a request not worth serving.
            from_caller.then_some(deadline),
            true,
            Outcome::Ignore,
            owner,
        ) {
            Start::Admitted(permit) => {
                let fut = self.inner.call(req);
                ResponseFuture::running(scope(ctx, fut), permit, grpc, confirm)
            }
            Start::Rejected(r) => ResponseFuture::rejected(r, grpc),
            Start::Queued(wait) => {
                // The readiness reserved by `poll_ready` belongs to `self.inner`: move it
                // into the future and keep a fresh clone here (tower's usual pattern).
                let clone = self.inner.clone();
                let svc = std::mem::replace(&mut self.inner, clone);
                ResponseFuture::queued(wait, svc, req, ctx, grpc, confirm)
            }
        }
    }
}

//! Tower middleware that enforces a dependency's policy around a client service (hyper,
//! tonic, a tower-wrapped reqwest, …): the same stages in the same order as
//! [`Dependency::call`](super::Dependency::call).

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use http::{HeaderMap, HeaderValue};
use tower::{Layer, Service, ServiceExt};

use super::{Dependency, Judgement, NotReplayable, run};
use crate::BoxError;
use crate::deadline::{self, CRITICALITY_HEADER, DEADLINE_MS_HEADER, GRPC_TIMEOUT_HEADER};
use crate::retry::{Classify, ErrorKind, HttpStatusError, Idempotency, RETRIED_HEADER, classify_error};

/// A request that can be sent again for a retry.
pub trait ReplayRequest: Sized {
    /// A copy for another attempt, or `None` when this request cannot be replayed (then
    /// the call gets exactly one attempt).
    fn replay(&self) -> Option<Self>;
}

/// An HTTP request body that may be sent again: buffered bodies can, streaming ones
/// (tonic's, hyper's `Incoming`) cannot.
pub trait ReplayBody: Sized {
    /// A copy of the body for another attempt, or `None` when it cannot be replayed.
    fn replay_body(&self) -> Option<Self>;
}

macro_rules! replay_body_by_clone {
    ($($t:ty),* $(,)?) => {
        $(impl ReplayBody for $t {
            fn replay_body(&self) -> Option<Self> {
                Some(self.clone())
            }
        })*
    };
}

replay_body_by_clone!(
    (),
    String,
    Vec<u8>,
    bytes::Bytes,
    &'static str,
    &'static [u8],
    http_body_util::Full<bytes::Bytes>,
    http_body_util::Empty<bytes::Bytes>,
);

/// tonic's request body is a stream: a call through the layer on a tonic `Channel` gets
/// one attempt (use [`Dependency::call`](super::Dependency::call) around the generated
/// client for retried gRPC calls: the request message can be cloned there).
impl ReplayBody for tonic::body::Body {
    fn replay_body(&self) -> Option<Self> {
        None
    }
}

impl<B: ReplayBody> ReplayRequest for http::Request<B> {
    fn replay(&self) -> Option<Self> {
        let mut r = http::Request::new(self.body().replay_body()?);
        *r.method_mut() = self.method().clone();
        *r.uri_mut() = self.uri().clone();
        *r.version_mut() = self.version();
        *r.headers_mut() = self.headers().clone();
        Some(r)
    }
}

macro_rules! replay_by_clone {
    ($($t:ty),* $(,)?) => {
        $(impl ReplayRequest for $t {
            fn replay(&self) -> Option<Self> {
                Some(self.clone())
            }
        })*
    };
}

replay_by_clone!((), bool, u8, u16, u32, u64, i32, i64, usize, String, Vec<u8>, bytes::Bytes);

/// Decides, per request and per result, what the enforcement stack makes of them.
pub trait Judge<Req, Res>: Clone + Send + Sync + 'static {
    /// Whether the request may be repeated; `None` = decide by the operation name and
    /// policy.
    fn idempotent(&self, _req: &Req) -> Option<bool> {
        None
    }

    /// Called on each outgoing attempt (after any replay) to add propagation headers.
    fn prepare(&self, _req: &mut Req, _will_retry: bool) {}

    /// How an attempt's result turns out (see [`Judgement`]).
    fn judge(&self, result: &Result<Res, BoxError>) -> Judgement;
}

/// The default judge: `Ok` is success; errors are classified by walking their source
/// chain ([`classify_error`]: Levee's own rejections, timeouts, I/O errors, gRPC status).
#[derive(Clone, Copy, Debug, Default)]
pub struct ErrorJudge;

impl<Req, Res> Judge<Req, Res> for ErrorJudge {
    fn judge(&self, result: &Result<Res, BoxError>) -> Judgement {
        match result {
            Ok(_) => Judgement::Success,
            Err(e) => Judgement::failure(classify_error(e.as_ref())),
        }
    }
}

/// Judge for HTTP clients (`http::Request` → `http::Response`): idempotency from the
/// method and an `Idempotency-Key` header; a response with status 408, 429 or 5xx is a
/// failure (its `Retry-After` honoured); errors are classified by their source chain. Each
/// attempt carries the remaining deadline (`levee-deadline-ms`), the criticality
/// (`levee-criticality`) and, when the stack will retry it, the `levee-retried` marker so
/// the service called does not retry again (retry on one layer).
#[derive(Clone, Copy, Debug, Default)]
pub struct HttpJudge;

/// Adds the propagation headers to an outgoing request's headers: the remaining deadline
/// as `levee-deadline-ms` (and `grpc-timeout`), the criticality, and the retry marker when
/// `will_retry` or when the inbound request carried it.
pub fn propagate(headers: &mut HeaderMap, will_retry: bool) {
    if let Some(ctx) = deadline::current() {
        if let Ok(v) = HeaderValue::from_str(&ctx.deadline.to_header_ms()) {
            headers.insert(DEADLINE_MS_HEADER, v);
        }
        if let Ok(v) = HeaderValue::from_str(&ctx.deadline.to_grpc_timeout()) {
            headers.insert(GRPC_TIMEOUT_HEADER, v);
        }
        headers.insert(
            CRITICALITY_HEADER,
            HeaderValue::from_static(deadline::format_criticality(ctx.criticality)),
        );
    }
    // A layer above retries this chain when this call retries or the inbound request was
    // itself marked: either way the services further down must not retry (one layer).
    if will_retry || deadline::current().is_some_and(|c| c.inbound_retried) {
        headers.insert(RETRIED_HEADER, HeaderValue::from_static("1"));
    }
}

impl<B, RB> Judge<http::Request<B>, http::Response<RB>> for HttpJudge
where
    B: 'static,
    RB: 'static,
{
    fn idempotent(&self, req: &http::Request<B>) -> Option<bool> {
        Some(Idempotency::for_request(req.method(), req.headers(), None).is_idempotent())
    }

    fn prepare(&self, req: &mut http::Request<B>, will_retry: bool) {
        propagate(req.headers_mut(), will_retry);
    }

    fn judge(&self, result: &Result<http::Response<RB>, BoxError>) -> Judgement {
        match result {
            Ok(res) => http_status_judgement(res.status(), res.headers()),
            Err(e) => Judgement::failure(classify_error(e.as_ref())),
        }
    }
}

/// 408, 429 and 5xx are failures, with their `Retry-After`; anything else is a success
/// for the stack (a 404 is the caller's problem, not the dependency's health).
fn http_status_judgement(status: http::StatusCode, headers: &HeaderMap) -> Judgement {
    match HttpStatusError::from_parts(status, headers) {
        Some(e) => Judgement::Failure { kind: e.error_kind(), retry_after: e.retry_after() },
        None => Judgement::Success,
    }
}

/// A `reqwest::Request` replays when its body is buffered (`try_clone`); a streaming
/// body gets one attempt.
#[cfg(feature = "reqwest")]
impl ReplayRequest for reqwest::Request {
    fn replay(&self) -> Option<Self> {
        self.try_clone()
    }
}

/// [`HttpJudge`] for a `reqwest::Client` used as a tower service (feature `reqwest`): the
/// same rules as for `http` requests.
#[cfg(feature = "reqwest")]
impl Judge<reqwest::Request, reqwest::Response> for HttpJudge {
    fn idempotent(&self, req: &reqwest::Request) -> Option<bool> {
        Some(Idempotency::for_request(req.method(), req.headers(), None).is_idempotent())
    }

    fn prepare(&self, req: &mut reqwest::Request, will_retry: bool) {
        propagate(req.headers_mut(), will_retry);
    }

    fn judge(&self, result: &Result<reqwest::Response, BoxError>) -> Judgement {
        match result {
            Ok(res) => http_status_judgement(res.status(), res.headers()),
            Err(e) => Judgement::failure(classify_error(e.as_ref())),
        }
    }
}

/// Judge for a tower layer on a gRPC channel (tonic `Channel`, `http::Request` →
/// `http::Response`): a response whose headers carry a non-zero `grpc-status` (a
/// "Trailers-Only" answer, which is how servers send errors produced before any message:
/// UNAVAILABLE, RESOURCE_EXHAUSTED, interceptor refusals, …) is judged by that code, with
/// `grpc-retry-pushback-ms` honoured (gRPC A6); a non-200 HTTP status is judged as HTTP;
/// transport errors by their source chain. Each attempt carries `grpc-timeout` (the
/// remaining deadline), the criticality and the retry marker.
///
/// A status sent in real trailers after a response message is not visible at this layer
/// (the body has not been read yet): it reaches the caller, but counts as a success for the
/// breaker. gRPC methods are not idempotent by name; mark them in the policy
/// (`operations."/pkg.Service/Get".idempotent: true`). Requests through a tonic channel
/// cannot be replayed (streaming body), so they get one attempt; for retried gRPC calls use
/// [`Dependency::call`](super::Dependency::call) around the generated client.
#[derive(Clone, Copy, Debug, Default)]
pub struct GrpcJudge;

impl<B, RB> Judge<http::Request<B>, http::Response<RB>> for GrpcJudge
where
    B: 'static,
    RB: 'static,
{
    fn prepare(&self, req: &mut http::Request<B>, will_retry: bool) {
        propagate(req.headers_mut(), will_retry);
    }

    fn judge(&self, result: &Result<http::Response<RB>, BoxError>) -> Judgement {
        match result {
            Ok(res) => {
                if res.status() != http::StatusCode::OK {
                    return Judgement::failure(ErrorKind::HttpStatus(res.status().as_u16()));
                }
                let headers = res.headers();
                let code = headers
                    .get("grpc-status")
                    .and_then(|v| v.to_str().ok())
                    .and_then(|v| v.parse::<i32>().ok())
                    .map(tonic::Code::from_i32);
                let Some(code) = code.filter(|c| *c != tonic::Code::Ok) else {
                    return Judgement::Success;
                };
                // gRPC A6: a pushback ≥ 0 allows a retry after that delay; negative or
                // malformed forbids it.
                let pushback = headers
                    .get("grpc-retry-pushback-ms")
                    .and_then(|v| v.to_str().ok())
                    .and_then(|v| v.parse::<i64>().ok());
                let delay =
                    pushback.and_then(|ms| u64::try_from(ms).ok()).map(std::time::Duration::from_millis);
                Judgement::Failure {
                    kind: ErrorKind::Grpc { code, pushback: delay.is_some() },
                    retry_after: delay,
                }
            }
            Err(e) => Judgement::failure(classify_error(e.as_ref())),
        }
    }
}

/// Applies [`DependencyService`] to a service.
#[derive(Clone, Debug)]
pub struct DependencyLayer<J = ErrorJudge> {
    dependency: Dependency,
    operation: Option<Arc<str>>,
    judge: J,
}

impl DependencyLayer {
    /// A layer for `dependency` with the default [`ErrorJudge`], enforcing the
    /// dependency-level policy.
    pub fn new(dependency: Dependency) -> Self {
        Self { dependency, operation: None, judge: ErrorJudge }
    }
}

impl<J> DependencyLayer<J> {
    /// Enforces the per-operation overrides of `operation` (a route template or method
    /// name) instead of the dependency-level policy.
    pub fn operation(mut self, operation: impl Into<Arc<str>>) -> Self {
        self.operation = Some(operation.into());
        self
    }

    /// Uses `judge` to classify requests and results (e.g. [`HttpJudge`]).
    pub fn judge<J2>(self, judge: J2) -> DependencyLayer<J2> {
        DependencyLayer { dependency: self.dependency, operation: self.operation, judge }
    }
}

impl<S, J: Clone> Layer<S> for DependencyLayer<J> {
    type Service = DependencyService<S, J>;

    fn layer(&self, inner: S) -> Self::Service {
        DependencyService {
            inner,
            dependency: self.dependency.clone(),
            operation: self.operation.clone(),
            judge: self.judge.clone(),
        }
    }
}

/// Enforces a dependency's policy (kill switch, deadline, bulkhead, retry, circuit
/// breaker, per-attempt timeout, injected faults) around every request to the inner
/// service.
///
/// Errors are boxed, tower style: [`KillSwitched`](super::KillSwitched),
/// [`BreakerOpen`](crate::breaker::BreakerOpen), [`BulkheadFull`](crate::bulkhead::BulkheadFull),
/// [`DeadlineError`](super::DeadlineError), [`AttemptTimeout`](super::AttemptTimeout) and
/// [`InjectedFault`](super::InjectedFault) are found with `downcast_ref`; the inner
/// service's errors pass through unchanged. Retries need the request to implement
/// [`ReplayRequest`].
#[derive(Clone)]
pub struct DependencyService<S, J = ErrorJudge> {
    inner: S,
    dependency: Dependency,
    operation: Option<Arc<str>>,
    judge: J,
}

impl<S: fmt::Debug, J> fmt::Debug for DependencyService<S, J> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DependencyService")
            .field("inner", &self.inner)
            .field("dependency", &self.dependency.name())
            .field("operation", &self.operation)
            .finish()
    }
}

impl<S> DependencyService<S> {
    /// Wraps `inner` with the policy of `dependency` and the default judge.
    pub fn new(inner: S, dependency: Dependency) -> Self {
        Self { inner, dependency, operation: None, judge: ErrorJudge }
    }
}

impl<S, J> DependencyService<S, J> {
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

/// The response future of [`DependencyService`].
pub type ResponseFuture<T> = Pin<Box<dyn Future<Output = Result<T, BoxError>> + Send>>;

impl<S, J, Req> Service<Req> for DependencyService<S, J>
where
    S: Service<Req> + Clone + Send + Sync + 'static,
    S::Future: Send + 'static,
    S::Response: Send + 'static,
    S::Error: Into<BoxError>,
    J: Judge<Req, S::Response>,
    Req: ReplayRequest + Send + 'static,
{
    type Response = S::Response;
    type Error = BoxError;
    type Future = ResponseFuture<S::Response>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        // Readiness is awaited per attempt (on a clone), inside the enforcement stages, so
        // a saturated inner service is bounded by the bulkhead and the attempt timeout.
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Req) -> Self::Future {
        let dependency = self.dependency.clone();
        let operation = self.operation.clone();
        let judge = self.judge.clone();
        let inner = self.inner.clone();
        Box::pin(async move {
            let view = dependency.view();
            let op: &str = operation.as_deref().unwrap_or(dependency.name());
            let idempotent = judge.idempotent(&req);
            let mut will_retry = view.will_retry(op, idempotent);
            // Keep a pristine copy for later attempts before the first one goes out. A
            // request that cannot be replayed gets exactly one attempt, and its own error.
            let mut original = if will_retry { req.replay() } else { None };
            let replayable = !will_retry || original.is_some();
            will_retry &= replayable;
            let mut first = Some(req);
            let attempt = || {
                let next = match first.take() {
                    Some(r) => Some(r),
                    // Borrowed mutably so the future only needs `Req: Send`, not `Sync`.
                    None => original.as_mut().and_then(|r| r.replay()),
                };
                let mut svc = inner.clone();
                let judge = judge.clone();
                async move {
                    let Some(mut req) = next else {
                        return Err(Box::new(NotReplayable::new()) as BoxError);
                    };
                    judge.prepare(&mut req, will_retry);
                    let svc = svc.ready().await.map_err(Into::into)?;
                    svc.call(req).await.map_err(Into::into)
                }
            };
            let judge_fn = |r: &Result<S::Response, BoxError>| judge.judge(r);
            run::run_observed(&view, op, idempotent, replayable, attempt, judge_fn, &|_| {})
                .await
                .map_err(super::CallError::into_box)
        })
    }
}

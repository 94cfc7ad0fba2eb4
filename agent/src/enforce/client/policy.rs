//! [`CallPolicy`]: what the tower path makes of a request and of a result — the request's
//! operation, whether it may be repeated and how, the headers each attempt carries, the
//! judgement of each attempt, and the response handed back. Modelled on tower's
//! `retry::Policy`: one trait a service may implement, with ready-made policies for
//! HTTP ([`HttpPolicy`]) and gRPC ([`GrpcPolicy`]) and a generic one ([`ErrorPolicy`]).

use std::borrow::Cow;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use http::{HeaderMap, HeaderValue};

use super::AttemptBody;
use crate::BoxError;
use crate::deadline::{self, CRITICALITY_HEADER, DEADLINE_MS_HEADER, Deadline, GRPC_TIMEOUT_HEADER};
use crate::enforce::{AttemptTimeout, Judgement};
use crate::retry::{Classify, ErrorKind, HttpStatusError, Idempotency, RETRIED_HEADER, classify_error};

/// The operation a request belongs to: a route template or a gRPC method
/// (`"GET /price/{sku}"`, `"/shop.Pricing/Quote"`), which selects the policy's
/// `operations.<name>` overrides, names the metrics' `operation` label and, by its HTTP
/// method, decides idempotency when the policy does not.
///
/// Set per request as an `http::Request` extension (read by [`HttpPolicy`] and
/// [`GrpcPolicy`]), taken from the request path by [`GrpcPolicy`], per layer with
/// [`DependencyLayer::operation`](super::DependencyLayer::operation), or computed from the
/// request with [`DependencyLayer::operation_from`](super::DependencyLayer::operation_from).
/// A `&'static str` and a request path ([`Operation::from_path`]) cost no allocation.
///
/// Names are not bounded here: the metrics label a dependency's first
/// [`MAX_LABELLED_OPERATIONS`](crate::enforce::MAX_LABELLED_OPERATIONS) (64) distinct
/// operations by name and every later one as
/// [`OTHER_OPERATION`](crate::enforce::OTHER_OPERATION) (`_other`), whose calls are counted
/// like any other; only operations named in the policy get guards of their own.
#[derive(Clone, Debug)]
pub struct Operation(Repr);

#[derive(Clone, Debug)]
enum Repr {
    Name(Cow<'static, str>),
    /// A request path: a reference-counted copy of the URI's bytes (for a path from
    /// `PathAndQuery::from_static`, as tonic's generated clients use, not even a count).
    Path(http::uri::PathAndQuery),
}

impl Operation {
    /// An operation named by a string literal (no allocation).
    pub const fn from_static(name: &'static str) -> Self {
        Self(Repr::Name(Cow::Borrowed(name)))
    }

    /// The operation named by a request's path (`/pkg.Service/Method` for gRPC), without
    /// its query; shares the URI's bytes instead of copying them.
    pub fn from_path(path: &http::uri::PathAndQuery) -> Self {
        Self(Repr::Path(path.clone()))
    }

    /// The operation's name.
    pub fn as_str(&self) -> &str {
        match &self.0 {
            Repr::Name(n) => n,
            Repr::Path(p) => p.path(),
        }
    }
}

impl PartialEq for Operation {
    fn eq(&self, other: &Self) -> bool {
        self.as_str() == other.as_str()
    }
}

impl Eq for Operation {}

impl std::hash::Hash for Operation {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.as_str().hash(state);
    }
}

impl From<&'static str> for Operation {
    fn from(name: &'static str) -> Self {
        Self::from_static(name)
    }
}

impl From<String> for Operation {
    fn from(name: String) -> Self {
        Self(Repr::Name(Cow::Owned(name)))
    }
}

impl fmt::Display for Operation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The gRPC method a request path names, `/pkg.Service/Method` (two non-empty segments),
/// as an [`Operation`]; `None` for any other path.
pub(crate) fn grpc_method(uri: &http::Uri) -> Option<Operation> {
    let pq = uri.path_and_query()?;
    let (service, method) = pq.path().strip_prefix('/')?.split_once('/')?;
    (!service.is_empty() && !method.is_empty() && !method.contains('/')).then(|| Operation::from_path(pq))
}

/// The attempt that produced a response, for [`CallPolicy::finish`]: its deadline
/// (min(attempt timeout, remaining request budget − reserve, non-critical cap), as an
/// absolute instant) and the error to raise when reading the response runs past it.
#[derive(Clone, Debug)]
pub struct Attempt {
    dependency: Arc<str>,
    deadline: Deadline,
    timeout: Duration,
}

impl Attempt {
    pub(crate) fn new(dependency: Arc<str>, deadline: Deadline, timeout: Duration) -> Self {
        Self { dependency, deadline, timeout }
    }

    /// When the attempt's time is up.
    pub fn deadline(&self) -> Deadline {
        self.deadline
    }

    /// The attempt's time limit, as computed when it started.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// The error of a response read that ran past [`deadline`](Self::deadline).
    pub fn timeout_error(&self) -> AttemptTimeout {
        AttemptTimeout::new(self.dependency.clone(), self.timeout)
    }
}

/// What the tower path makes of requests and results (tower's `retry::Policy` is the
/// model). Implement it for a client whose requests or answers the ready-made policies do
/// not know; every method but [`clone_request`](Self::clone_request),
/// [`judge`](Self::judge) and [`finish`](Self::finish) has a default.
///
/// Per request, [`DependencyService`](super::DependencyService) asks for the
/// [`operation`](Self::operation) and [`idempotent`](Self::idempotent), keeps a
/// [`clone_request`](Self::clone_request) copy when a retry may follow, calls
/// [`prepare`](Self::prepare) on each attempt (inside the attempt, so the request context
/// is the attempt's own), [`judge`](Self::judge)s each result, and hands the final answer
/// through [`finish`](Self::finish).
pub trait CallPolicy<Req, Res>: Clone + Send + Sync + 'static {
    /// What the caller gets for an answer: `Res` itself, or `Res` with its body bounded by
    /// the attempt (as [`HttpPolicy`] does).
    type Response;

    /// The request's operation; `None` = the layer's, else the dependency as a whole.
    fn operation(&self, _req: &Req) -> Option<Operation> {
        None
    }

    /// Whether the request may be repeated; `None` = decide by the operation name and
    /// policy.
    fn idempotent(&self, _req: &Req) -> Option<bool> {
        None
    }

    /// A copy for another attempt, or `None` when the request cannot be sent twice (then
    /// the call gets exactly one attempt).
    fn clone_request(&self, req: &Req) -> Option<Req>;

    /// Called on each outgoing attempt (after any replay) to add propagation headers;
    /// `will_retry` says whether this stack retries the call.
    fn prepare(&self, _req: &mut Req, _will_retry: bool) {}

    /// How an attempt's result turns out (see [`Judgement`]).
    fn judge(&self, result: Result<&Res, &BoxError>) -> Judgement;

    /// The answer handed to the caller, made from the last attempt's `response`.
    fn finish(&self, response: Res, attempt: &Attempt) -> Self::Response;
}

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
/// one attempt (use [`Dependency::call`](crate::Dependency::call) around the generated
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

/// The generic policy: `Ok` is success; errors are classified by walking their source
/// chain ([`classify_error`]: Levee's own rejections, timeouts, I/O errors, gRPC status);
/// requests replay by [`ReplayRequest`]; answers are handed back as they are.
#[derive(Clone, Copy, Debug, Default)]
pub struct ErrorPolicy;

impl<Req: ReplayRequest + 'static, Res> CallPolicy<Req, Res> for ErrorPolicy {
    type Response = Res;

    fn clone_request(&self, req: &Req) -> Option<Req> {
        req.replay()
    }

    fn judge(&self, result: Result<&Res, &BoxError>) -> Judgement {
        match result {
            Ok(_) => Judgement::Success,
            Err(e) => Judgement::failure(classify_error(e.as_ref())),
        }
    }

    fn finish(&self, response: Res, _attempt: &Attempt) -> Res {
        response
    }
}

/// The policy for HTTP clients (`http::Request` → `http::Response`, and
/// `reqwest::Request` → `reqwest::Response` under feature `reqwest`).
///
/// * operation: the request's [`Operation`] extension, if any;
/// * idempotency: from the method and an `Idempotency-Key` header;
/// * replay: a buffered body replays ([`ReplayBody`]), a streaming one gets one attempt;
/// * each attempt carries the attempt's deadline (`levee-deadline-ms`, `grpc-timeout`),
///   the criticality (`levee-criticality`) and, when the stack will retry it, the
///   `levee-retried` marker so the service called does not retry again (retry on one
///   layer) — see [`propagate`];
/// * judgement: a response with status 408, 429 or 5xx is a failure, its `Retry-After`
///   honoured; errors are classified by their source chain;
/// * the answer: the body is an [`AttemptBody`], whose reading fails once the attempt's
///   deadline has passed; a `reqwest::Request` gets the attempt's remaining time as its
///   own timeout, which reqwest applies up to the end of the body.
#[derive(Clone, Copy, Debug, Default)]
pub struct HttpPolicy;

/// Adds the propagation headers to an outgoing request's headers: the request context's
/// deadline as `levee-deadline-ms` (and `grpc-timeout`), the criticality, and the retry
/// marker when `will_retry` or when the inbound request carried it.
///
/// Inside an attempt (in the future given to [`Dependency::call`](crate::Dependency::call)
/// or through the tower layer) the context is the attempt's own, so the callee is told
/// min(remaining budget − reserve, attempt timeout): it must not outwork its caller.
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

impl<B, RB> CallPolicy<http::Request<B>, http::Response<RB>> for HttpPolicy
where
    B: ReplayBody + 'static,
    RB: 'static,
{
    type Response = http::Response<AttemptBody<RB>>;

    fn operation(&self, req: &http::Request<B>) -> Option<Operation> {
        req.extensions().get::<Operation>().cloned()
    }

    fn idempotent(&self, req: &http::Request<B>) -> Option<bool> {
        Some(Idempotency::for_request(req.method(), req.headers(), None).is_idempotent())
    }

    fn clone_request(&self, req: &http::Request<B>) -> Option<http::Request<B>> {
        req.replay()
    }

    fn prepare(&self, req: &mut http::Request<B>, will_retry: bool) {
        propagate(req.headers_mut(), will_retry);
    }

    fn judge(&self, result: Result<&http::Response<RB>, &BoxError>) -> Judgement {
        match result {
            Ok(res) => http_status_judgement(res.status(), res.headers()),
            Err(e) => Judgement::failure(classify_error(e.as_ref())),
        }
    }

    fn finish(&self, response: http::Response<RB>, attempt: &Attempt) -> Self::Response {
        response.map(|body| AttemptBody::new(body, attempt))
    }
}

/// 408, 429 and 5xx are failures, with their `Retry-After`; anything else is a success
/// for the stack (a 404 is the caller's problem, not the dependency's health).
pub(crate) fn http_status_judgement(status: http::StatusCode, headers: &HeaderMap) -> Judgement {
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

/// The time left in the running attempt (its request context's deadline), as the timeout
/// of a reqwest request: reqwest applies it until the body has been read.
#[cfg(feature = "reqwest")]
fn bound_reqwest(req: &mut reqwest::Request) {
    if let Some(d) = deadline::current_deadline() {
        let left = d.remaining().max(Duration::from_millis(1));
        let t = req.timeout_mut();
        *t = Some(t.map_or(left, |own| own.min(left)));
    }
}

/// [`HttpPolicy`] for a `reqwest::Client` used as a tower service (feature `reqwest`): the
/// same rules as for `http` requests; the body read is bounded by reqwest's own timeout,
/// set to what is left of the attempt.
#[cfg(feature = "reqwest")]
impl CallPolicy<reqwest::Request, reqwest::Response> for HttpPolicy {
    type Response = reqwest::Response;

    fn idempotent(&self, req: &reqwest::Request) -> Option<bool> {
        Some(Idempotency::for_request(req.method(), req.headers(), None).is_idempotent())
    }

    fn clone_request(&self, req: &reqwest::Request) -> Option<reqwest::Request> {
        req.try_clone()
    }

    fn prepare(&self, req: &mut reqwest::Request, will_retry: bool) {
        propagate(req.headers_mut(), will_retry);
        bound_reqwest(req);
    }

    fn judge(&self, result: Result<&reqwest::Response, &BoxError>) -> Judgement {
        match result {
            Ok(res) => http_status_judgement(res.status(), res.headers()),
            Err(e) => Judgement::failure(classify_error(e.as_ref())),
        }
    }

    fn finish(&self, response: reqwest::Response, _attempt: &Attempt) -> reqwest::Response {
        response
    }
}

/// The policy for a tower layer on a gRPC channel (tonic `Channel`, `http::Request` →
/// `http::Response`): a response whose headers carry a non-zero `grpc-status` (a
/// "Trailers-Only" answer, which is how servers send errors produced before any message:
/// UNAVAILABLE, RESOURCE_EXHAUSTED, interceptor refusals, …) is judged by that code, with
/// `grpc-retry-pushback-ms` honoured (gRPC A6); a non-200 HTTP status is judged as HTTP;
/// transport errors by their source chain. Each attempt carries `grpc-timeout` (the
/// attempt's deadline), the criticality and the retry marker. The operation is the
/// request's [`Operation`] extension, else the gRPC method its path names
/// (`/pkg.Service/Method`, so `operations."/pkg.Service/Method"` overrides apply per call
/// on one layer), else the layer's; the response body is an [`AttemptBody`] (a stream that
/// outlives the attempt's deadline fails).
///
/// A status sent in real trailers after a response message is not visible at this layer
/// (the body has not been read yet): it reaches the caller, but counts as a success for the
/// breaker. gRPC methods are not idempotent by name; mark them in the policy
/// (`operations."/pkg.Service/Get".idempotent: true`). Requests through a tonic channel
/// cannot be replayed (streaming body), so they get one attempt; for retried gRPC calls use
/// [`Dependency::call`](crate::Dependency::call) around the generated client.
#[derive(Clone, Copy, Debug, Default)]
pub struct GrpcPolicy;

impl<B, RB> CallPolicy<http::Request<B>, http::Response<RB>> for GrpcPolicy
where
    B: ReplayBody + 'static,
    RB: 'static,
{
    type Response = http::Response<AttemptBody<RB>>;

    fn operation(&self, req: &http::Request<B>) -> Option<Operation> {
        req.extensions().get::<Operation>().cloned().or_else(|| grpc_method(req.uri()))
    }

    fn clone_request(&self, req: &http::Request<B>) -> Option<http::Request<B>> {
        req.replay()
    }

    fn prepare(&self, req: &mut http::Request<B>, will_retry: bool) {
        propagate(req.headers_mut(), will_retry);
    }

    fn judge(&self, result: Result<&http::Response<RB>, &BoxError>) -> Judgement {
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
                let delay = pushback.and_then(|ms| u64::try_from(ms).ok()).map(Duration::from_millis);
                Judgement::Failure {
                    kind: ErrorKind::Grpc { code, pushback: delay.is_some() },
                    retry_after: delay,
                }
            }
            Err(e) => Judgement::failure(classify_error(e.as_ref())),
        }
    }

    fn finish(&self, response: http::Response<RB>, attempt: &Attempt) -> Self::Response {
        response.map(|body| AttemptBody::new(body, attempt))
    }
}

/// A policy whose operation is computed from the request by `F` (see
/// [`DependencyLayer::operation_from`](super::DependencyLayer::operation_from)); the rest
/// is `P`'s.
#[derive(Clone)]
pub struct OperationFrom<P, F> {
    pub(super) policy: P,
    pub(super) f: F,
}

impl<P: fmt::Debug, F> fmt::Debug for OperationFrom<P, F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OperationFrom").field("policy", &self.policy).finish_non_exhaustive()
    }
}

impl<Req, Res, P, F> CallPolicy<Req, Res> for OperationFrom<P, F>
where
    P: CallPolicy<Req, Res>,
    F: Fn(&Req) -> Option<Operation> + Clone + Send + Sync + 'static,
{
    type Response = P::Response;

    fn operation(&self, req: &Req) -> Option<Operation> {
        self.policy.operation(req).or_else(|| (self.f)(req))
    }

    fn idempotent(&self, req: &Req) -> Option<bool> {
        self.policy.idempotent(req)
    }

    fn clone_request(&self, req: &Req) -> Option<Req> {
        self.policy.clone_request(req)
    }

    fn prepare(&self, req: &mut Req, will_retry: bool) {
        self.policy.prepare(req, will_retry);
    }

    fn judge(&self, result: Result<&Res, &BoxError>) -> Judgement {
        self.policy.judge(result)
    }

    fn finish(&self, response: Res, attempt: &Attempt) -> Self::Response {
        self.policy.finish(response, attempt)
    }
}

//! [`LeveeMiddleware`]: a dependency's policy on every request of a
//! `reqwest_middleware::ClientWithMiddleware` (feature `reqwest-middleware`).

use http::Extensions;
use reqwest::ResponseBuilderExt;
use reqwest_middleware::{Error, Middleware, Next};

use super::client::http_status_judgement;
use super::{CallError, Dependency, Judgement, Operation, propagate, run};
use crate::retry::{Classify, ErrorKind, Idempotency, classify_error};

/// A `reqwest-middleware` middleware that enforces a dependency's policy on every request
/// sent through the client, so that
///
/// ```no_run
/// # async fn f(agent: levee_agent::Agent) -> Result<(), reqwest_middleware::Error> {
/// let pricing = reqwest_middleware::ClientBuilder::new(reqwest::Client::new())
///     .with(agent.dependency("pricing").middleware())
///     .build();
/// let body = pricing.get("http://127.0.0.1:3001/price/alice").send().await?.text().await?;
/// # Ok(()) }
/// ```
///
/// runs through the whole enforcement stack (kill switch → deadline → bulkhead → retry →
/// client-side throttle → circuit breaker → attempt timeout) with nothing at the call site:
///
/// * each attempt carries the attempt's deadline (`levee-deadline-ms`, `grpc-timeout`:
///   min(remaining budget − reserve, attempt timeout)), the criticality and, when this
///   stack will retry the call, the `levee-retried` marker;
/// * 408, 429 and 5xx answers are failures (retried when the method is idempotent, with
///   `Retry-After` honoured); connection errors and timeouts are classified by kind;
/// * **the body is read inside the attempt**: the middleware buffers it before the
///   attempt ends, so the attempt timeout and the deadline cover a body that arrives late,
///   and a body that fails is judged (and retried) like any failed attempt. The response
///   handed back holds the buffered body; it is not for streaming downloads.
///
/// The operation is the request's [`Operation`] extension
/// (`.with_extension(Operation::from_static("GET /price/{user}"))`), else the one given
/// with [`operation`](Self::operation), else the dependency as a whole. Enforcement's own
/// errors come back as `reqwest_middleware::Error::Middleware` holding the opaque error;
/// ask any error [`refusal()`](super::Refused::refusal) (trait [`Refused`](super::Refused))
/// for whether Levee refused the call and why, rather than downcasting. The client's
/// errors come back unchanged, and a failure answer (5xx…) that survived the retries comes
/// back as `Ok`: [`Dependency::send_or_fallback`] folds all three channels into one result
/// with a fallback.
#[derive(Clone, Debug)]
pub struct LeveeMiddleware {
    dependency: Dependency,
    operation: Option<Operation>,
}

impl LeveeMiddleware {
    /// The middleware for `dependency` (also `dependency.middleware()`).
    pub fn new(dependency: Dependency) -> Self {
        Self { dependency, operation: None }
    }

    /// The operation of requests that do not carry an [`Operation`] extension.
    pub fn operation(mut self, operation: impl Into<Operation>) -> Self {
        self.operation = Some(operation.into());
        self
    }
}

impl Dependency {
    /// A `reqwest-middleware` middleware enforcing this dependency's policy (feature
    /// `reqwest-middleware`; see [`LeveeMiddleware`]).
    pub fn middleware(&self) -> LeveeMiddleware {
        LeveeMiddleware::new(self.clone())
    }

    /// Sends `request` — built on a client whose middleware enforces this dependency
    /// ([`middleware`](Self::middleware)) — and reads the answer with `read`; when any of
    /// it fails, answers from `fallback` instead. Reports the value and its level as
    /// [`call_or_fallback`](Self::call_or_fallback) does (and counts it for the degraded
    /// time of the dependency's fallback the same way).
    ///
    /// One result for the middleware path's three failure channels: Levee refused or ended
    /// the call (`cause` is then the matching [`CallError`] variant; [`Refused::refusal`]
    /// says why), the client failed (`CallError::Inner`), or the dependency answered a
    /// failure (408, 429, 5xx) after any retries (`CallError::Inner` holding an
    /// [`HttpStatusError`](crate::retry::HttpStatusError)); a `read` that fails (a body
    /// that does not decode) falls back too.
    ///
    /// ```no_run
    /// # async fn f(agent: levee_agent::Agent) {
    /// let recommendations = agent.dependency("recommendations");
    /// let client = reqwest_middleware::ClientBuilder::new(reqwest::Client::new())
    ///     .with(recommendations.middleware())
    ///     .build();
    /// let picks = recommendations
    ///     .send_or_fallback(
    ///         client.get("http://127.0.0.1:3002/recommendations/alice"),
    ///         |res| res.json::<Vec<String>>(),
    ///         |_cause| async { vec!["bestseller-1".to_string()] },
    ///     )
    ///     .await;
    /// println!("{:?} at level {:?}", picks.value, picks.level);
    /// # }
    /// ```
    ///
    /// [`Refused::refusal`]: super::Refused::refusal
    pub async fn send_or_fallback<T, R, RFut, G, GFut>(
        &self,
        request: reqwest_middleware::RequestBuilder,
        read: R,
        fallback: G,
    ) -> super::WithFallback<T, Error>
    where
        R: FnOnce(reqwest::Response) -> RFut,
        RFut: std::future::Future<Output = Result<T, reqwest::Error>>,
        G: FnOnce(&CallError<Error>) -> GFut,
        GFut: std::future::Future<Output = T>,
    {
        let answer = match request.send().await {
            Err(e) => Err(call_error(e)),
            Ok(res) => match crate::retry::HttpStatusError::from_parts(res.status(), res.headers()) {
                Some(status) => Err(CallError::Inner(Error::middleware(status))),
                None => read(res).await.map_err(|e| CallError::Inner(Error::Reqwest(e))),
            },
        };
        let view = self.view();
        match answer {
            Ok(value) => {
                view.state.fallback.fresh();
                super::WithFallback { value, level: crate::policy::FallbackLevel::Fresh, cause: None }
            }
            Err(cause) => {
                let level = view.policy.fallback;
                let value = fallback(&cause).await;
                view.state.fallback.served(level);
                super::WithFallback { value, level, cause: Some(cause) }
            }
        }
    }
}

/// The [`CallError`] a middleware error stands for: enforcement's own errors back as their
/// variants (the middleware hands them out boxed in `Error::Middleware`), anything else as
/// `Inner`.
fn call_error(e: Error) -> CallError<Error> {
    let Error::Middleware(e) = e else { return CallError::Inner(e) };
    macro_rules! unbox {
        ($e:ident, $($ty:ty => $variant:expr),+ $(,)?) => {
            $(let $e = match $e.downcast::<$ty>() {
                Ok(v) => return $variant(v),
                Err(e) => e,
            };)+
        };
    }
    unbox!(e,
        super::KillSwitched => CallError::KillSwitched,
        crate::breaker::BreakerOpen => CallError::BreakerOpen,
        crate::bulkhead::BulkheadFull => CallError::BulkheadFull,
        crate::retry::Throttled => CallError::Throttled,
        super::AttemptTimeout => CallError::Timeout,
        super::InjectedFault => CallError::Injected,
        super::DeadlineError => |d| CallError::DeadlineExceeded(d, None),
    );
    CallError::Inner(Error::Middleware(e))
}

/// Why one attempt through the middleware failed: the client's error, or the body read.
struct AttemptError(Error);

impl Classify for AttemptError {
    fn error_kind(&self) -> ErrorKind {
        match &self.0 {
            Error::Reqwest(e) => e.error_kind(),
            Error::Middleware(e) => classify_error(e.as_ref()),
        }
    }
}

/// Reads the whole body of `res` and rebuilds the response around the bytes, keeping
/// status, version, headers and URL.
async fn buffered(res: reqwest::Response) -> Result<reqwest::Response, Error> {
    let status = res.status();
    let version = res.version();
    let url = res.url().clone();
    let headers = res.headers().clone();
    let bytes = res.bytes().await?;
    let mut out = http::Response::builder().status(status).version(version).url(url);
    if let Some(h) = out.headers_mut() {
        *h = headers;
    }
    let out = out.body(bytes).map_err(Error::middleware)?;
    Ok(reqwest::Response::from(out))
}

fn into_error(e: CallError<AttemptError>) -> Error {
    match e {
        CallError::Inner(AttemptError(e)) => e,
        CallError::KillSwitched(e) => Error::middleware(e),
        CallError::BulkheadFull(e) => Error::middleware(e),
        CallError::BreakerOpen(e) => Error::middleware(e),
        CallError::Timeout(e) => Error::middleware(e),
        CallError::Throttled(e) => Error::middleware(e),
        CallError::Injected(e) => Error::middleware(e),
        CallError::DeadlineExceeded(d, last) => {
            let last = last.map(|l| match *l {
                CallError::Inner(AttemptError(e)) => crate::BoxError::from(e),
                other => into_error(other).into(),
            });
            Error::middleware(super::DeadlineError::new(d.why, last))
        }
    }
}

#[async_trait::async_trait]
impl Middleware for LeveeMiddleware {
    async fn handle(
        &self,
        req: reqwest::Request,
        extensions: &mut Extensions,
        next: Next<'_>,
    ) -> reqwest_middleware::Result<reqwest::Response> {
        let operation = extensions.get::<Operation>().cloned().or_else(|| self.operation.clone());
        let view = self.dependency.view();
        let op: &str = operation.as_ref().map_or(self.dependency.name(), Operation::as_str);
        let idempotent = Some(Idempotency::for_request(req.method(), req.headers(), None).is_idempotent());
        let mut will_retry = view.will_retry(op, idempotent);
        let mut original = if will_retry { req.try_clone() } else { None };
        let replayable = !will_retry || original.is_some();
        will_retry &= replayable;
        let mut first = Some(req);
        let extensions = &*extensions;
        let attempt = || {
            // Borrowed mutably so the future only needs `Request: Send`, not `Sync`.
            let next_req = first.take().or_else(|| original.as_mut().and_then(|r| r.try_clone()));
            let next = next.clone();
            // Each attempt runs the rest of the chain on its own copy of the extensions.
            let mut ext = extensions.clone();
            async move {
                let Some(mut req) = next_req else {
                    return Err(AttemptError(Error::middleware(super::NotReplayable::new())));
                };
                // Inside the attempt: the request context is the attempt's own. The
                // attempt's timer (around this whole future, body included) bounds it.
                propagate(req.headers_mut(), will_retry);
                let res = next.run(req, &mut ext).await.map_err(AttemptError)?;
                buffered(res).await.map_err(AttemptError)
            }
        };
        let judge = |r: &Result<reqwest::Response, AttemptError>| match r {
            Ok(res) => http_status_judgement(res.status(), res.headers()),
            Err(e) => Judgement::failure(e.error_kind()),
        };
        run::run_observed(&view, op, idempotent, replayable, attempt, judge, &|_| {})
            .await
            .map_err(into_error)
    }
}

//! [`DependencyService`]: a dependency's policy around every request to a client service.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use pin_project_lite::pin_project;
use tower::Service;

use super::{Attempt, CallPolicy, ErrorPolicy, Operation, ResponseFuture};
use crate::BoxError;
use crate::enforce::run::{Attempts, Run};
use crate::enforce::{Dependency, Judgement, NotReplayable};

/// Enforces a dependency's policy (kill switch, deadline, bulkhead, retry, circuit
/// breaker, per-attempt timeout, injected faults) around every request to the inner
/// service, in the order of [`Dependency::call`].
///
/// Each request's operation is the policy's ([`CallPolicy::operation`], e.g. an
/// [`Operation`] request extension), else the layer's, else the dependency as a whole.
/// Errors are boxed, tower style: [`KillSwitched`](crate::enforce::KillSwitched),
/// [`BreakerOpen`](crate::breaker::BreakerOpen), [`BulkheadFull`](crate::bulkhead::BulkheadFull),
/// [`DeadlineError`](crate::enforce::DeadlineError),
/// [`AttemptTimeout`](crate::enforce::AttemptTimeout) and
/// [`InjectedFault`](crate::enforce::InjectedFault) are found with `downcast_ref`; the inner
/// service's errors pass through unchanged. Retries need the policy to
/// [`clone_request`](CallPolicy::clone_request).
#[derive(Clone)]
pub struct DependencyService<S, P = ErrorPolicy> {
    inner: S,
    dependency: Dependency,
    operation: Option<Operation>,
    policy: P,
}

impl<S: fmt::Debug, P> fmt::Debug for DependencyService<S, P> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DependencyService")
            .field("inner", &self.inner)
            .field("dependency", &self.dependency.name())
            .field("operation", &self.operation)
            .finish()
    }
}

impl<S> DependencyService<S> {
    /// Wraps `inner` with the policy of `dependency` and the default [`ErrorPolicy`].
    pub fn new(inner: S, dependency: Dependency) -> Self {
        Self { inner, dependency, operation: None, policy: ErrorPolicy }
    }
}

impl<S, P> DependencyService<S, P> {
    pub(super) fn with_parts(
        inner: S,
        dependency: Dependency,
        operation: Option<Operation>,
        policy: P,
    ) -> Self {
        Self { inner, dependency, operation, policy }
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

impl<S, P, Req> Service<Req> for DependencyService<S, P>
where
    S: Service<Req> + Clone + Send + Sync + 'static,
    S::Future: Send + 'static,
    S::Response: Send + 'static,
    S::Error: Into<BoxError>,
    P: CallPolicy<Req, S::Response>,
    P::Response: Send + 'static,
    Req: Send + 'static,
{
    type Response = P::Response;
    type Error = BoxError;
    type Future = ResponseFuture<S, P, Req>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        // Readiness is awaited per attempt (on a clone), inside the enforcement stages, so
        // a saturated inner service is bounded by the bulkhead and the attempt timeout.
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Req) -> Self::Future {
        let view = self.dependency.view();
        let operation = self.policy.operation(&req).or_else(|| self.operation.clone());
        let op: &str = operation.as_ref().map_or(&*view.name, Operation::as_str);
        let idempotent = self.policy.idempotent(&req);
        let mut will_retry = view.will_retry(op, idempotent);
        // Keep a pristine copy for later attempts before the first one goes out. A request
        // that cannot be replayed gets exactly one attempt, and its own error.
        let original = if will_retry { self.policy.clone_request(&req) } else { None };
        let replayable = !will_retry || original.is_some();
        will_retry &= replayable;
        let attempts = TowerAttempts {
            inner: self.inner.clone(),
            policy: self.policy.clone(),
            first: Some(req),
            original,
            will_retry,
            name: view.name.clone(),
        };
        ResponseFuture::new(Run::new(view, operation, idempotent, replayable, attempts), self.policy.clone())
    }
}

/// The attempts of one request on the tower path: the request itself first, then copies of
/// the pristine one kept for retries.
pub(crate) struct TowerAttempts<S, P, Req> {
    inner: S,
    policy: P,
    first: Option<Req>,
    original: Option<Req>,
    will_retry: bool,
    name: Arc<str>,
}

impl<S, P, Req> fmt::Debug for TowerAttempts<S, P, Req> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TowerAttempts").field("will_retry", &self.will_retry).finish_non_exhaustive()
    }
}

impl<S, P, Req> Attempts for TowerAttempts<S, P, Req>
where
    S: Service<Req> + Clone,
    S::Error: Into<BoxError>,
    P: CallPolicy<Req, S::Response>,
{
    type Output = (S::Response, Attempt);
    type Error = BoxError;
    type Future = TowerAttempt<S, P, Req>;

    fn attempt(&mut self) -> Self::Future {
        let req = match self.first.take() {
            Some(r) => Some(r),
            None => self.original.as_ref().and_then(|r| self.policy.clone_request(r)),
        };
        TowerAttempt {
            call: None,
            svc: self.inner.clone(),
            policy: self.policy.clone(),
            req,
            will_retry: self.will_retry,
            name: self.name.clone(),
            attempt: None,
        }
    }

    fn judge(&self, result: &Result<(S::Response, Attempt), BoxError>) -> Judgement {
        self.policy.judge(result.as_ref().map(|(res, _)| res))
    }
}

pin_project! {
    /// One attempt on the tower path: the inner service made ready (on a clone), then its
    /// call. Runs inside the attempt's request context, so [`CallPolicy::prepare`] sees the
    /// attempt's own deadline.
    pub(crate) struct TowerAttempt<S: Service<Req>, P, Req> {
        #[pin]
        call: Option<S::Future>,
        svc: S,
        policy: P,
        req: Option<Req>,
        will_retry: bool,
        name: Arc<str>,
        attempt: Option<Attempt>,
    }
}

impl<S: Service<Req>, P, Req> fmt::Debug for TowerAttempt<S, P, Req> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TowerAttempt").field("called", &self.call.is_some()).finish_non_exhaustive()
    }
}

impl<S, P, Req> Future for TowerAttempt<S, P, Req>
where
    S: Service<Req>,
    S::Error: Into<BoxError>,
    P: CallPolicy<Req, S::Response>,
{
    type Output = Result<(S::Response, Attempt), BoxError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        if this.call.is_none() {
            if this.req.is_none() {
                return Poll::Ready(Err(Box::new(NotReplayable::new())));
            }
            if this.attempt.is_none() {
                // Inside the attempt the request context is the attempt's own: its deadline
                // is the one to propagate and to bound the answer by.
                let until = crate::deadline::current_deadline()
                    .unwrap_or_else(|| crate::deadline::Deadline::after(std::time::Duration::ZERO));
                *this.attempt = Some(Attempt::new(this.name.clone(), until, until.remaining()));
            }
            std::task::ready!(this.svc.poll_ready(cx)).map_err(Into::into)?;
            let Some(mut req) = this.req.take() else { unreachable!("checked above") };
            this.policy.prepare(&mut req, *this.will_retry);
            this.call.set(Some(this.svc.call(req)));
        }
        let Some(call) = this.call.as_pin_mut() else { unreachable!("set above") };
        let res = std::task::ready!(call.poll(cx)).map_err(Into::into)?;
        let Some(attempt) = this.attempt.take() else { unreachable!("set before the call") };
        Poll::Ready(Ok((res, attempt)))
    }
}

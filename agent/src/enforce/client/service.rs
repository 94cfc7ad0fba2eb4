//! [`DependencyService`]: a dependency's policy around every request to a client service.

use std::fmt;
use std::task::{Context, Poll};

use tower::{Service, ServiceExt};

use super::{Attempt, CallPolicy, ErrorPolicy, Operation, ResponseFuture};
use crate::BoxError;
use crate::enforce::{CallError, Dependency, NotReplayable, run};

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
    type Future = ResponseFuture<P::Response>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        // Readiness is awaited per attempt (on a clone), inside the enforcement stages, so
        // a saturated inner service is bounded by the bulkhead and the attempt timeout.
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Req) -> Self::Future {
        let dependency = self.dependency.clone();
        let operation = self.policy.operation(&req).or_else(|| self.operation.clone());
        let policy = self.policy.clone();
        let inner = self.inner.clone();
        ResponseFuture::new(Box::pin(async move {
            let view = dependency.view();
            let op: &str = operation.as_ref().map_or(dependency.name(), Operation::as_str);
            let idempotent = policy.idempotent(&req);
            let mut will_retry = view.will_retry(op, idempotent);
            // Keep a pristine copy for later attempts before the first one goes out. A
            // request that cannot be replayed gets exactly one attempt, and its own error.
            let mut original = if will_retry { policy.clone_request(&req) } else { None };
            let replayable = !will_retry || original.is_some();
            will_retry &= replayable;
            let mut first = Some(req);
            let attempt = || {
                let next = match first.take() {
                    Some(r) => Some(r),
                    // Borrowed mutably so the future only needs `Req: Send`, not `Sync`.
                    None => original.as_mut().and_then(|r| policy.clone_request(r)),
                };
                let mut svc = inner.clone();
                let policy = policy.clone();
                let name = view.name.clone();
                async move {
                    let Some(mut req) = next else {
                        return Err(Box::new(NotReplayable::new()) as BoxError);
                    };
                    // Inside the attempt the request context is the attempt's own: its
                    // deadline is the one to propagate and to bound the answer by.
                    let until = crate::deadline::current_deadline()
                        .unwrap_or_else(|| crate::deadline::Deadline::after(std::time::Duration::ZERO));
                    let attempt = Attempt::new(name, until, until.remaining());
                    policy.prepare(&mut req, will_retry);
                    let svc = svc.ready().await.map_err(Into::into)?;
                    let res = svc.call(req).await.map_err(Into::into)?;
                    Ok((res, attempt))
                }
            };
            let judge =
                |r: &Result<(S::Response, Attempt), BoxError>| policy.judge(r.as_ref().map(|(res, _)| res));
            let (res, attempt) =
                run::run_observed(&view, op, idempotent, replayable, attempt, judge, &|_| {})
                    .await
                    .map_err(CallError::into_box)?;
            Ok(policy.finish(res, &attempt))
        }))
    }
}

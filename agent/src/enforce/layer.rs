//! Tower middleware that enforces a dependency's policy around a service.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use tower::{Layer, Service};

use super::{Dependency, NotReplayable, run};
use crate::BoxError;

/// Applies [`DependencyService`] to a service: the tower form of
/// [`Dependency::call`](super::Dependency::call), same stages, same order.
#[derive(Clone, Debug)]
pub struct DependencyLayer {
    dependency: Dependency,
    operation: Option<Arc<str>>,
}

impl DependencyLayer {
    /// A layer for `dependency`, enforcing the dependency-level policy.
    pub fn new(dependency: Dependency) -> Self {
        Self { dependency, operation: None }
    }

    /// Enforces the per-operation overrides of `operation` (a route template or method
    /// name) instead of the dependency-level policy.
    pub fn operation(mut self, operation: impl Into<Arc<str>>) -> Self {
        self.operation = Some(operation.into());
        self
    }
}

impl<S> Layer<S> for DependencyLayer {
    type Service = DependencyService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        DependencyService { inner, dependency: self.dependency.clone(), operation: self.operation.clone() }
    }
}

/// Enforces a dependency's policy (kill switch, per-attempt timeout, and the stages to
/// come) around every request to the inner service.
///
/// Errors are boxed: [`KillSwitched`](super::KillSwitched) and
/// [`AttemptTimeout`](super::AttemptTimeout) are found with `downcast_ref`; the inner
/// service's errors pass through unchanged.
#[derive(Clone)]
pub struct DependencyService<S> {
    inner: S,
    dependency: Dependency,
    operation: Option<Arc<str>>,
}

impl<S: fmt::Debug> fmt::Debug for DependencyService<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DependencyService")
            .field("inner", &self.inner)
            .field("dependency", &self.dependency.name())
            .field("operation", &self.operation)
            .finish()
    }
}

impl<S> DependencyService<S> {
    /// Wraps `inner` with the policy of `dependency`.
    pub fn new(inner: S, dependency: Dependency) -> Self {
        Self { inner, dependency, operation: None }
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

/// The response future of [`DependencyService`].
pub type ResponseFuture<T> = Pin<Box<dyn Future<Output = Result<T, BoxError>> + Send>>;

impl<S, Req> Service<Req> for DependencyService<S>
where
    S: Service<Req> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Response: Send + 'static,
    S::Error: Into<BoxError>,
    Req: Send + 'static,
{
    type Response = S::Response;
    type Error = BoxError;
    type Future = ResponseFuture<S::Response>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, req: Req) -> Self::Future {
        let operation = self.operation.as_deref().unwrap_or(self.dependency.name());
        let plan = self.dependency.plan(operation);
        // Call the instance that was driven to readiness; leave a fresh clone in its place.
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let mut req = Some(req);
        Box::pin(async move {
            let attempt = || {
                let fut = req.take().map(|r| inner.call(r));
                async move {
                    match fut {
                        Some(f) => f.await.map_err(Into::into),
                        None => Err(Box::new(NotReplayable::new()) as BoxError),
                    }
                }
            };
            run(plan, attempt).await.map_err(super::CallError::into_box)
        })
    }
}

//! [`DependencyLayer`]: applies [`DependencyService`] to a client service.

use tower::Layer;

use super::policy::OperationFrom;
use super::{DependencyService, ErrorPolicy, Operation};
use crate::enforce::Dependency;

/// Applies [`DependencyService`] to a service: `dependency.layer()` (or
/// [`DependencyLayer::new`]), with a [`CallPolicy`](super::CallPolicy) chosen by
/// [`policy`](Self::policy) (default [`ErrorPolicy`]).
#[derive(Clone, Debug)]
pub struct DependencyLayer<P = ErrorPolicy> {
    dependency: Dependency,
    operation: Option<Operation>,
    policy: P,
}

impl DependencyLayer {
    /// A layer for `dependency` with the default [`ErrorPolicy`], enforcing the
    /// dependency-level policy unless a request names its operation.
    pub fn new(dependency: Dependency) -> Self {
        Self { dependency, operation: None, policy: ErrorPolicy }
    }
}

impl<P> DependencyLayer<P> {
    /// The operation of requests that do not name one themselves (through the policy's
    /// [`operation`](super::CallPolicy::operation), e.g. an [`Operation`] request
    /// extension): a route template or method name whose per-operation overrides apply.
    pub fn operation(mut self, operation: impl Into<Operation>) -> Self {
        self.operation = Some(operation.into());
        self
    }

    /// Takes each request's operation from `f` when the policy finds none on the request
    /// itself (an [`Operation`] extension), before the layer's own: e.g.
    /// `|req: &http::Request<_>| Some(route_of(req.uri()))`.
    pub fn operation_from<F>(self, f: F) -> DependencyLayer<OperationFrom<P, F>> {
        DependencyLayer {
            dependency: self.dependency,
            operation: self.operation,
            policy: OperationFrom { policy: self.policy, f },
        }
    }

    /// Uses `policy` to classify requests and results (e.g. [`HttpPolicy`](super::HttpPolicy)).
    pub fn policy<P2>(self, policy: P2) -> DependencyLayer<P2> {
        DependencyLayer { dependency: self.dependency, operation: self.operation, policy }
    }
}

impl<S, P: Clone> Layer<S> for DependencyLayer<P> {
    type Service = DependencyService<S, P>;

    fn layer(&self, inner: S) -> Self::Service {
        DependencyService::with_parts(
            inner,
            self.dependency.clone(),
            self.operation.clone(),
            self.policy.clone(),
        )
    }
}

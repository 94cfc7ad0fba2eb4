//! [`ResponseFuture`]: the response future of [`DependencyService`](super::DependencyService).

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use pin_project_lite::pin_project;
use tower::Service;

use super::service::{TowerAttempt, TowerAttempts};
use super::{CallPolicy, Operation};
use crate::BoxError;
use crate::enforce::DepView;
use crate::enforce::run::Run;

/// The enforcement stages of one request on the tower path.
pub(super) type TowerRun<S, P, Req> =
    Run<Arc<DepView>, Option<Operation>, TowerAttempts<S, P, Req>, TowerAttempt<S, P, Req>>;

pin_project! {
    /// The response future of [`DependencyService`](super::DependencyService) around a
    /// service `S` with policy `P` for requests `Req`: resolves to the policy's response
    /// ([`CallPolicy::Response`]), or a boxed error (enforcement's own, found with
    /// `downcast_ref`, or the inner service's).
    ///
    /// It holds the enforcement stages inline, as the same hand-written state machine
    /// [`Dependency::call`](crate::Dependency::call) runs (the enforcement function
    /// `run.rs`), so a request that finds a free bulkhead slot allocates nothing here on
    /// success (the inner service's own future and body aside). Waiting for a bulkhead slot
    /// boxes the wait.
    pub struct ResponseFuture<S, P, Req>
    where
        S: Service<Req>,
    {
        #[pin]
        run: TowerRun<S, P, Req>,
        policy: P,
    }
}

impl<S: Service<Req>, P, Req> ResponseFuture<S, P, Req> {
    pub(super) fn new(run: TowerRun<S, P, Req>, policy: P) -> Self {
        Self { run, policy }
    }
}

impl<S: Service<Req>, P, Req> fmt::Debug for ResponseFuture<S, P, Req> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResponseFuture").finish_non_exhaustive()
    }
}

impl<S, P, Req> Future for ResponseFuture<S, P, Req>
where
    S: Service<Req> + Clone,
    S::Error: Into<BoxError>,
    P: CallPolicy<Req, S::Response>,
{
    type Output = Result<P::Response, BoxError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let out = std::task::ready!(this.run.poll(cx));
        Poll::Ready(match out {
            Ok((res, attempt)) => Ok(this.policy.finish(res, &attempt)),
            Err(e) => Err(e.into_box()),
        })
    }
}

//! [`ResponseFuture`]: the response future of [`DependencyService`](super::DependencyService).

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use pin_project_lite::pin_project;

use crate::BoxError;

pin_project! {
    /// The response future of [`DependencyService`](super::DependencyService): resolves to
    /// the policy's response, or a boxed error (enforcement's own, found with
    /// `downcast_ref`, or the inner service's).
    ///
    /// The enforcement stages run as one `async` state machine (the enforcement function
    /// `run.rs`, shared with [`Dependency::call`](crate::Dependency::call)), held here on
    /// the heap: one allocation per request on the tower path.
    pub struct ResponseFuture<T> {
        #[pin]
        inner: Pin<Box<dyn Future<Output = Result<T, BoxError>> + Send>>,
    }
}

impl<T> ResponseFuture<T> {
    pub(super) fn new(inner: Pin<Box<dyn Future<Output = Result<T, BoxError>> + Send>>) -> Self {
        Self { inner }
    }
}

impl<T> fmt::Debug for ResponseFuture<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResponseFuture").finish_non_exhaustive()
    }
}

impl<T> Future for ResponseFuture<T> {
    type Output = Result<T, BoxError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        self.project().inner.poll(cx)
    }
}

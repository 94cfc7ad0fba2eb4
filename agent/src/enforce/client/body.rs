//! An HTTP response body bounded by the deadline of the attempt that produced it.

use std::pin::Pin;
use std::task::{Context, Poll};

use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;
use tokio::time::{Instant, Sleep};

use super::Attempt;
use crate::BoxError;

pin_project! {
    /// A response body whose reading fails with
    /// [`AttemptTimeout`](crate::enforce::AttemptTimeout) once the deadline of the attempt
    /// that produced the response has passed (min(attempt timeout, remaining request
    /// budget − reserve, non-critical cap)): a body that arrives late holds the caller no
    /// longer than its head could have.
    ///
    /// The timer is created only when a read has to wait; a body that is there already
    /// costs one comparison. Errors of the inner body are boxed, tower style.
    #[derive(Debug)]
    pub struct AttemptBody<B> {
        #[pin]
        inner: B,
        #[pin]
        sleep: Option<Sleep>,
        attempt: Attempt,
        timed_out: bool,
    }
}

impl<B> AttemptBody<B> {
    pub(crate) fn new(inner: B, attempt: &Attempt) -> Self {
        Self { inner, sleep: None, attempt: attempt.clone(), timed_out: false }
    }

    /// The inner body, without the bound.
    pub fn into_inner(self) -> B {
        self.inner
    }
}

impl<B> Body for AttemptBody<B>
where
    B: Body,
    B::Error: Into<BoxError>,
{
    type Data = B::Data;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, BoxError>>> {
        let mut this = self.project();
        if *this.timed_out {
            return Poll::Ready(None);
        }
        if let Poll::Ready(frame) = this.inner.poll_frame(cx) {
            return Poll::Ready(frame.map(|r| r.map_err(Into::into)));
        }
        if this.sleep.is_none() {
            this.sleep.set(Some(tokio::time::sleep_until(this.attempt.deadline().instant())));
        }
        let expired = match this.sleep.as_pin_mut() {
            Some(s) => s.poll(cx).is_ready(),
            None => Instant::now() >= this.attempt.deadline().instant(),
        };
        if expired {
            *this.timed_out = true;
            return Poll::Ready(Some(Err(Box::new(this.attempt.timeout_error()))));
        }
        Poll::Pending
    }

    fn is_end_stream(&self) -> bool {
        self.timed_out || self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

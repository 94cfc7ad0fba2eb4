use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use http::Response;
use http_body_util::Either;
use pin_project_lite::pin_project;
use tokio::task::futures::TaskLocalFuture;
use tower::Service;

use super::Rejected;
use super::permit::{AdmissionPermit, Outcome};
use super::queue::Wait;
use super::response::{AdmissionBody, rejection};
use super::route::{RouteKey, is_unimplemented};
use crate::deadline::RequestContext;
use crate::health::HealthOutcome;

pin_project! {
    /// The future of [`Admission::admit`](super::Admission::admit): ready at once when the
    /// request was admitted or refused without waiting (no allocation), else waiting in
    /// the queue. Dropping it leaves the queue.
    #[must_use = "futures do nothing unless polled"]
    pub struct Admit {
        #[pin]
        state: AdmitState,
    }
}

pin_project! {
    #[project = AdmitProj]
    enum AdmitState {
        Ready { result: Option<Result<AdmissionPermit<'static>, Rejected>> },
        Waiting { #[pin] wait: Wait },
    }
}

impl std::fmt::Debug for Admit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Admit").finish_non_exhaustive()
    }
}

impl Admit {
    pub(crate) fn ready(result: Result<AdmissionPermit<'static>, Rejected>) -> Self {
        Self { state: AdmitState::Ready { result: Some(result) } }
    }

    pub(crate) fn waiting(wait: Wait) -> Self {
        Self { state: AdmitState::Waiting { wait } }
    }
}

impl Future for Admit {
    type Output = Result<AdmissionPermit<'static>, Rejected>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project().state.project() {
            AdmitProj::Ready { result } => Poll::Ready(result.take().expect("Admit polled after completion")),
            AdmitProj::Waiting { wait } => wait.poll(cx),
        }
    }
}

/// How a finished request counts for the limit: a 503/504 answer, or a gRPC
/// UNAVAILABLE, RESOURCE_EXHAUSTED or DEADLINE_EXCEEDED status sent in the response
/// headers (Trailers-Only), is the service saying it is overloaded (a drop); an error of
/// the inner service says nothing about load; anything else is a success.
fn outcome<B, E>(result: &Result<Response<B>, E>) -> Outcome {
    match result {
        Err(_) => Outcome::Ignore,
        Ok(res) => {
            let status = res.status().as_u16();
            let grpc_overload =
                res.headers().get("grpc-status").is_some_and(|v| matches!(v.as_bytes(), b"4" | b"8" | b"14"));
            if status == 503 || status == 504 || grpc_overload { Outcome::Dropped } else { Outcome::Success }
        }
    }
}

/// How a finished request counts in its route's health window: the inner service's
/// error, a 5xx answer or a gRPC UNKNOWN, RESOURCE_EXHAUSTED, INTERNAL, UNAVAILABLE or
/// DATA_LOSS status in the response headers is a failure; a 504 or gRPC
/// DEADLINE_EXCEEDED a timeout; anything else (4xx included: the caller's mistake, not the
/// route's) a success. A gRPC status sent only in the trailers of a streamed answer is not
/// seen here: such a call counts by its HTTP status.
fn served<B, E>(result: &Result<Response<B>, E>) -> HealthOutcome {
    let Ok(res) = result else { return HealthOutcome::Failure };
    let grpc = res.headers().get("grpc-status").map(http::HeaderValue::as_bytes);
    match (res.status().as_u16(), grpc) {
        (504, _) | (_, Some(b"4")) => HealthOutcome::Timeout,
        (500..=599, _) | (_, Some(b"2" | b"8" | b"13" | b"14" | b"15")) => HealthOutcome::Failure,
        _ => HealthOutcome::Success,
    }
}

pin_project! {
    /// Response future of [`AdmissionService`](super::AdmissionService): answers a
    /// rejection at once, waits in the queue, or runs the inner service's future inside
    /// the request context while holding the permit.
    #[must_use = "futures do nothing unless polled"]
    pub struct ResponseFuture<S, Req>
    where
        S: Service<Req>,
    {
        #[pin]
        state: State<S, Req>,
        grpc: bool,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<S, Req>
    where
        S: Service<Req>,
    {
        Queued { #[pin] wait: Wait, svc: Option<S>, req: Option<Req>, ctx: RequestContext, confirm: Option<Box<Confirm>> },
        Readying { permit: Option<AdmissionPermit<'static>>, svc: Option<S>, req: Option<Req>, ctx: RequestContext, confirm: Option<Box<Confirm>> },
        Running { #[pin] fut: TaskLocalFuture<RequestContext, S::Future>, permit: Option<AdmissionPermit<'static>>, confirm: Option<Box<Confirm>> },
        Rejected { rejected: Option<Rejected> },
    }
}

impl<S: Service<Req>, Req> std::fmt::Debug for ResponseFuture<S, Req> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ResponseFuture").field("grpc", &self.grpc).finish_non_exhaustive()
    }
}

/// A gRPC method the client named and the service has not answered yet: tracked under its
/// own name once the service answers it with anything but UNIMPLEMENTED (IN-7).
pub(crate) struct Confirm {
    pub(crate) admission: super::Admission,
    pub(crate) key: RouteKey,
}

impl Confirm {
    fn answered<B, E>(&self, result: &Result<Response<B>, E>) {
        if let Ok(res) = result
            && !is_unimplemented(res)
        {
            self.admission.confirm(self.key.as_str());
        }
    }
}

impl<S: Service<Req>, Req> ResponseFuture<S, Req> {
    pub(crate) fn running(
        fut: TaskLocalFuture<RequestContext, S::Future>,
        permit: AdmissionPermit<'static>,
        grpc: bool,
        confirm: Option<Box<Confirm>>,
    ) -> Self {
        Self { state: State::Running { fut, permit: Some(permit), confirm }, grpc }
    }

    pub(crate) fn rejected(rejected: Rejected, grpc: bool) -> Self {
        Self { state: State::Rejected { rejected: Some(rejected) }, grpc }
    }

    pub(crate) fn queued(
        wait: Wait,
        svc: S,
        req: Req,
        ctx: RequestContext,
        grpc: bool,
        confirm: Option<Box<Confirm>>,
    ) -> Self {
        Self { state: State::Queued { wait, svc: Some(svc), req: Some(req), ctx, confirm }, grpc }
    }
}

impl<S, Req, B> Future for ResponseFuture<S, Req>
where
    S: Service<Req, Response = Response<B>>,
{
    type Output = Result<Response<AdmissionBody<B>>, S::Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        loop {
            match this.state.as_mut().project() {
                StateProj::Queued { wait, svc, req, ctx, confirm } => match ready!(wait.poll(cx)) {
                    Ok(permit) => {
                        let next = State::Readying {
                            permit: Some(permit),
                            svc: svc.take(),
                            req: req.take(),
                            ctx: *ctx,
                            confirm: confirm.take(),
                        };
                        this.state.set(next);
                    }
                    Err(r) => return Poll::Ready(Ok(rejection(&r, *this.grpc))),
                },
                StateProj::Readying { permit, svc, req, ctx, confirm } => {
                    let s = svc.as_mut().expect("service present until called");
                    ready!(s.poll_ready(cx))?;
                    let fut = s.call(req.take().expect("request present until called"));
                    let next = State::Running {
                        fut: crate::deadline::scope(*ctx, fut),
                        permit: permit.take(),
                        confirm: confirm.take(),
                    };
                    this.state.set(next);
                }
                StateProj::Running { fut, permit, confirm } => {
                    let result = ready!(fut.poll(cx));
                    if let Some(mut p) = permit.take() {
                        p.set_outcome(outcome(&result));
                        p.set_served(served(&result));
                    }
                    if let Some(c) = confirm.take() {
                        c.answered(&result);
                    }
                    return Poll::Ready(result.map(|res| res.map(Either::Left)));
                }
                StateProj::Rejected { rejected } => {
                    let r = rejected.take().expect("polled after completion");
                    return Poll::Ready(Ok(rejection(&r, *this.grpc)));
                }
            }
        }
    }
}

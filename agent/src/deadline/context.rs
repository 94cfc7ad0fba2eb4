use std::future::Future;

use crate::policy::Criticality;

use super::Deadline;

tokio::task_local! {
    static CONTEXT: RequestContext;
}

/// Carries what an inbound request hands down to the outgoing calls made for it.
///
/// Installed for a future with [`with_context`] / [`with_deadline`] and read anywhere
/// inside it with [`current`]; outgoing layers propagate it as headers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RequestContext {
    /// The request's deadline.
    pub deadline: Deadline,
    /// Whether somebody asked for `deadline`: the caller (a `grpc-timeout` or
    /// `levee-deadline-ms` header) or the code that installed the context. `false` when it
    /// is only the service's default budget for a request that came without one: it still
    /// bounds the outgoing calls, but admission never drops such a request as one it could
    /// not serve in time (nobody would have given up on it).
    pub from_caller: bool,
    /// The request's criticality (SRE names), propagated downstream.
    pub criticality: Criticality,
    /// Whether the inbound request was marked as retried by its caller
    /// ([`RETRIED_HEADER`](crate::retry::RETRIED_HEADER)); outgoing calls then do not retry
    /// (retry on one layer).
    pub inbound_retried: bool,
}

impl RequestContext {
    /// A context with `deadline` (asked for: `from_caller`), criticality CRITICAL and no
    /// retry marker.
    pub fn new(deadline: Deadline) -> Self {
        Self { deadline, from_caller: true, criticality: Criticality::default(), inbound_retried: false }
    }
}

/// Runs `fut` with `ctx` as its request context (visible through [`current`]).
pub async fn with_context<F: Future>(ctx: RequestContext, fut: F) -> F::Output {
    CONTEXT.scope(ctx, fut).await
}

/// `fut` with `ctx` as its request context, as a nameable future (for tower response
/// futures, which cannot hold an `async fn`'s anonymous type).
pub fn scope<F: Future>(
    ctx: RequestContext,
    fut: F,
) -> tokio::task::futures::TaskLocalFuture<RequestContext, F> {
    CONTEXT.scope(ctx, fut)
}

/// Runs `fut` with `deadline`, keeping the rest of the enclosing context (criticality,
/// retry marker) when there is one. A deadline later than the enclosing one is ignored:
/// a callee never gets more time than its caller.
pub async fn with_deadline<F: Future>(deadline: Deadline, fut: F) -> F::Output {
    let ctx = match current() {
        Some(outer) => RequestContext { deadline: outer.deadline.min(deadline), from_caller: true, ..outer },
        None => RequestContext::new(deadline),
    };
    CONTEXT.scope(ctx, fut).await
}

/// The request context of the running task, if one was installed.
pub fn current() -> Option<RequestContext> {
    CONTEXT.try_with(|c| *c).ok()
}

/// The deadline of the running task's request, if any.
pub fn current_deadline() -> Option<Deadline> {
    current().map(|c| c.deadline)
}

/// The deadline of the running task's request when somebody asked for it (see
/// [`RequestContext::from_caller`]).
pub(crate) fn caller_deadline() -> Option<Deadline> {
    current().filter(|c| c.from_caller).map(|c| c.deadline)
}

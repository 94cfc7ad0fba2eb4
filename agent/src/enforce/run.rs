//! The one function that fixes the order of enforcement.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use pin_project_lite::pin_project;

use tokio::time::Instant;

use super::guards::CallOutcome;
use super::{AttemptTimeout, CallError, DeadlineError, DepView, InjectedFault, Judgement, KillSwitched};
use crate::breaker::{BreakerOpen, Outcome};
use crate::bulkhead::BulkheadError;
use crate::deadline;
use crate::fault::FaultDecision;
use crate::retry::{CallInfo, Classify, ErrorKind, RetryError, Throttled};

/// Why one attempt did not succeed.
pub(crate) enum AttemptFailure<T, E> {
    /// The dependency answered, but the answer is a failure (e.g. an HTTP 503 response).
    Value(T, ErrorKind, Option<Duration>),
    /// The dependency's error.
    Inner(E, ErrorKind, Option<Duration>),
    BreakerOpen(BreakerOpen),
    Timeout(AttemptTimeout),
    /// No time left for an attempt (remaining ≤ reserve).
    NoBudget,
    Injected(InjectedFault),
    /// Refused locally by the client-side throttle.
    Throttled(Throttled),
}

impl<T, E> Classify for AttemptFailure<T, E> {
    fn error_kind(&self) -> ErrorKind {
        match self {
            AttemptFailure::Value(_, k, _) | AttemptFailure::Inner(_, k, _) => *k,
            AttemptFailure::BreakerOpen(_) => ErrorKind::BreakerOpen,
            AttemptFailure::Timeout(_) => ErrorKind::AttemptTimeout,
            AttemptFailure::NoBudget => ErrorKind::DeadlineExceeded,
            AttemptFailure::Injected(f) => f.kind(),
            // A local overload rejection: not retryable, not the dependency's failure.
            AttemptFailure::Throttled(_) => ErrorKind::BulkheadFull,
        }
    }

    fn retry_after(&self) -> Option<Duration> {
        match self {
            AttemptFailure::Value(_, _, r) | AttemptFailure::Inner(_, _, r) => *r,
            _ => None,
        }
    }
}

pin_project! {
    /// A per-attempt timeout that costs little when the attempt is ready at once: the
    /// timer is created only if the first poll is pending.
    struct LazyTimeout<F> {
        #[pin]
        fut: F,
        #[pin]
        sleep: Option<tokio::time::Sleep>,
        until: Instant,
    }
}

impl<F: Future> Future for LazyTimeout<F> {
    type Output = Option<F::Output>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        if let Poll::Ready(v) = this.fut.poll(cx) {
            return Poll::Ready(Some(v));
        }
        if this.sleep.is_none() {
            this.sleep.set(Some(tokio::time::sleep_until(*this.until)));
        }
        match this.sleep.as_pin_mut() {
            Some(s) => s.poll(cx).map(|()| None),
            None => Poll::Pending,
        }
    }
}

fn outcome_of(kind: ErrorKind) -> Outcome {
    if kind.is_dependency_failure() { Outcome::Failure } else { Outcome::Success }
}

/// Whether an operation is idempotent by its name when nothing says otherwise: route
/// templates starting with `GET`, `HEAD`, `OPTIONS`, `PUT`, `DELETE` or `TRACE` are;
/// everything else (POST, PATCH, gRPC methods, bare names) is not.
pub fn idempotent_by_name(operation: &str) -> bool {
    let method = operation.split(' ').next().unwrap_or("");
    matches!(method, "GET" | "HEAD" | "OPTIONS" | "PUT" | "DELETE" | "TRACE")
}

/// Runs one call through every enforcement stage, in order. This is the only place that
/// decides the order; [`Dependency::call`](super::Dependency::call),
/// [`Dependency::call_or_fallback`](super::Dependency::call_or_fallback) and
/// [`DependencyService`](super::DependencyService) all come through here.
///
/// # Order
/// Outside → in, each stage wrapping the next (inbound admission runs before, in the
/// service's own inbound layer):
///
/// 1. **kill switch** — an off switch rejects with [`KillSwitched`] before anything else:
///    no permit taken, no attempt made, nothing recorded;
/// 2. **deadline** — an already expired request deadline fails at once with
///    `DeadlineExceeded`, without a round trip;
/// 3. **bulkhead** — a permit per (dependency, operation), waited for at most `max_wait`
///    and never past the deadline, re-checked against the deadline once granted, held for
///    the whole call including retries, released on drop;
/// 4. **retry** — re-runs the stages below: only idempotent operations, only retryable
///    errors, never when the inbound request was already retried upstream (retry on one
///    layer), full-jitter backoff that must fit the remaining deadline, `Retry-After`
///    honoured when it fits, and a retry budget that must have a token;
/// 5. **client-side throttle** — per dependency (SRE book, "Handling Overload"): while the
///    dependency rejects much of this client's traffic for overload, an attempt is refused
///    locally with probability `max(0, (requests − K × accepts) / (requests + 1))`
///    ([`AdaptiveThrottle`](crate::retry::AdaptiveThrottle), `K` from
///    `policy.client_throttle`). Every attempt counts, retries included; a refusal
///    (`Throttled`) is not retryable, not charged to the budget, and comes before the
///    breaker so it neither takes a half-open probe nor counts as the dependency's failure;
/// 6. **circuit breaker** — inside the retry, so it records **every** attempt, and an open
///    breaker rejects the attempt with `BreakerOpen`, which is not retryable and not
///    charged to the budget: the retry loop ends at once (CB-5). A half-open probe is one
///    attempt;
/// 7. **per-attempt timeout** — min(attempt timeout, remaining − reserve, and the
///    non-critical cap for a non-critical dependency); injected faults (game days) act
///    inside it, so breakers, retries and the throttle see them as the real failure. The
///    attempt runs under its own request context whose deadline is that instant: it is what
///    [`propagate`](super::propagate) tells the callee and what bounds a response body on
///    the tower path;
/// 8. **the call** — `attempt()`; its answer tells the throttle whether the dependency
///    accepted it or rejected it for overload ([`ErrorKind::throttle_answer`]; no answer
///    counts for nothing there).
///
/// The source article draws the breaker outside the retry, but its own reasons — the
/// breaker must see each failed attempt, and no retry may run while it is open — need it
/// inside; with it outside, one breaker outcome stands for a whole retried sequence and a
/// half-open probe becomes several attempts.
pub(crate) async fn run<T, E, F, Fut, J>(
    view: &DepView,
    operation: &str,
    idempotent_hint: Option<bool>,
    attempt: F,
    judge: J,
) -> Result<T, CallError<E>>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, E>>,
    J: Fn(&Result<T, E>) -> Judgement,
{
    run_observed(view, operation, idempotent_hint, true, attempt, judge, &|_| {}).await
}

/// [`run`], telling `observe` the outcome of every attempt that reached the dependency
/// (the same outcome the circuit breaker records: timeouts and injected failures are
/// failures). Attempts refused locally (open breaker, no budget) are not reported. Used
/// by outlier detection to judge the endpoint each attempt went to. `replayable: false`
/// (a request whose body cannot be sent twice) allows one attempt whatever the policy.
pub(crate) async fn run_observed<T, E, F, Fut, J, O>(
    view: &DepView,
    operation: &str,
    idempotent_hint: Option<bool>,
    replayable: bool,
    mut attempt: F,
    judge: J,
    observe: &O,
) -> Result<T, CallError<E>>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, E>>,
    J: Fn(&Result<T, E>) -> Judgement,
    O: Fn(Outcome),
{
    let scope = view.scope(operation);
    let guards = &*scope.guards;
    let calls = view.calls(operation, scope);
    // 1. kill switch
    if !view.enabled {
        calls.count(CallOutcome::KillSwitched);
        return Err(CallError::KillSwitched(KillSwitched::new(view.name.clone())));
    }
    // 2. deadline
    let ctx = deadline::current();
    let deadline = ctx.map(|c| c.deadline);
    // The clock is read once here; the first attempt reuses the reading when nothing
    // waited in between (each read costs tens of ns on the success path).
    let now = deadline.map(|_| Instant::now());
    if let (Some(d), Some(now)) = (deadline, now)
        && now >= d.instant()
    {
        calls.count(CallOutcome::DeadlineExceeded);
        return Err(CallError::DeadlineExceeded(
            DeadlineError::new("the request's deadline had passed before the call", None),
            None,
        ));
    }
    // 3. bulkhead
    // A free slot is taken without another deadline check (stage 2 has just made it);
    // waiting for one goes through `acquire`, which re-checks the deadline once granted.
    let mut first_now = now;
    let immediate = guards.bulkhead.try_acquire().ok();
    let permit = match immediate {
        Some(p) => Ok(p),
        None => {
            first_now = None;
            guards.bulkhead.acquire(deadline).await
        }
    };
    let _permit = match permit {
        Ok(p) => p,
        Err(BulkheadError::Full(e)) => {
            calls.count(CallOutcome::BulkheadFull);
            return Err(CallError::BulkheadFull(e));
        }
        Err(BulkheadError::DeadlineExceeded(_)) => {
            calls.count(CallOutcome::DeadlineExceeded);
            return Err(CallError::DeadlineExceeded(
                DeadlineError::new("the deadline passed while waiting for a bulkhead slot", None),
                None,
            ));
        }
    };
    // 4. retry
    let idempotent = scope.idempotent.or(idempotent_hint).unwrap_or_else(|| idempotent_by_name(operation));
    let info = CallInfo {
        idempotent: idempotent && replayable && !view.retries_paused,
        deadline,
        reserve: view.reserve,
        inbound_retried: ctx.is_some_and(|c| c.inbound_retried),
    };
    let judge = &judge;
    let throttle = &view.state.throttle;
    let result = guards
        .retrier
        .run(info, |n| {
            // 5. client-side throttle, then 6. circuit breaker (only asked when the
            // throttle lets the attempt through).
            let permit = throttle.try_acquire().map(|()| guards.breaker.try_acquire());
            // 7. per-attempt timeout (and faults inside it)
            let start = first_now.filter(|_| n == 1).unwrap_or_else(Instant::now);
            let budget = match deadline {
                Some(d) => d.attempt_budget_at(
                    start,
                    scope.attempt_timeout,
                    view.reserve,
                    view.criticality,
                    view.non_critical_cap,
                ),
                None => Ok(view.cap(scope.attempt_timeout)),
            };
            // The attempt runs under its own deadline, `start + budget` =
            // min(remaining − reserve, attempt timeout, non-critical cap): what
            // `propagate` sends the callee (it must not outwork its caller) and what a
            // tower layer bounds the response body by.
            let attempt_ctx = budget.as_ref().ok().map(|b| deadline::RequestContext {
                deadline: deadline::Deadline::at(start + *b),
                criticality: ctx.map(|c| c.criticality).unwrap_or_default(),
                inbound_retried: ctx.is_some_and(|c| c.inbound_retried),
            });
            let fault = if view.faults_active && matches!(permit, Ok(Ok(_))) {
                view.state.faults.decide(&view.name, operation)
            } else {
                FaultDecision::None
            };
            // 8. the call: only created when it will be awaited.
            let fut = match (&permit, &budget, fault.error_kind()) {
                (Ok(Ok(_)), Ok(_), None) => Some(attempt()),
                _ => None,
            };
            async move {
                let permit =
                    permit.map_err(AttemptFailure::Throttled)?.map_err(AttemptFailure::BreakerOpen)?;
                let Ok(budget) = budget else {
                    // Dropping the permit unrecorded: the attempt never happened.
                    return Err(AttemptFailure::NoBudget);
                };
                if let Some(kind) = fault.error_kind() {
                    permit.record(outcome_of(kind), Duration::ZERO);
                    observe(outcome_of(kind));
                    if let Some(accepted) = kind.throttle_answer() {
                        throttle.record(accepted);
                    }
                    return Err(AttemptFailure::Injected(InjectedFault::new(view.name.clone(), kind)));
                }
                let (Some(fut), Some(attempt_ctx)) = (fut, attempt_ctx) else {
                    return Err(AttemptFailure::NoBudget);
                };
                // The breaker's durations are measured only when it needs them (slow-call
                // detection).
                let start = scope.measure.then_some(start);
                let out = LazyTimeout {
                    fut: deadline::scope(attempt_ctx, async {
                        if let FaultDecision::Delay(d) = fault {
                            tokio::time::sleep(d).await;
                        }
                        fut.await
                    }),
                    sleep: None,
                    until: attempt_ctx.deadline.instant(),
                }
                .await
                .ok_or(());
                let elapsed = start.map(|s| s.elapsed()).unwrap_or(Duration::ZERO);
                match out {
                    Err(_) => {
                        permit.record(Outcome::Failure, elapsed);
                        observe(Outcome::Failure);
                        Err(AttemptFailure::Timeout(AttemptTimeout::new(view.name.clone(), budget)))
                    }
                    Ok(r) => match judge(&r) {
                        Judgement::Success => {
                            permit.record(Outcome::Success, elapsed);
                            observe(Outcome::Success);
                            throttle.record(true);
                            r.map_err(|e| AttemptFailure::Inner(e, ErrorKind::Other, None))
                        }
                        Judgement::Failure { kind, retry_after } => {
                            permit.record(outcome_of(kind), elapsed);
                            observe(outcome_of(kind));
                            if let Some(accepted) = kind.throttle_answer() {
                                throttle.record(accepted);
                            }
                            Err(match r {
                                Ok(v) => AttemptFailure::Value(v, kind, retry_after),
                                Err(e) => AttemptFailure::Inner(e, kind, retry_after),
                            })
                        }
                    },
                }
            }
        })
        .await;
    match result {
        Ok(v) => {
            calls.count(CallOutcome::Ok);
            Ok(v)
        }
        Err(RetryError { last, reason, attempts }) => {
            let deadline_stop = reason.is_deadline();
            let (outcome, err) = match last {
                AttemptFailure::Value(v, _, _) => {
                    calls.count(CallOutcome::Failed);
                    return Ok(v);
                }
                AttemptFailure::Inner(e, _, _) => (CallOutcome::Failed, CallError::Inner(e)),
                AttemptFailure::BreakerOpen(e) => (CallOutcome::BreakerOpen, CallError::BreakerOpen(e)),
                AttemptFailure::Timeout(e) => (CallOutcome::Timeout, CallError::Timeout(e)),
                AttemptFailure::Injected(e) => (CallOutcome::Injected, CallError::Injected(e)),
                AttemptFailure::Throttled(e) => (CallOutcome::Throttled, CallError::Throttled(e)),
                AttemptFailure::NoBudget => {
                    calls.count(CallOutcome::DeadlineExceeded);
                    let why = format!(
                        "no time left for attempt {} (remaining budget does not exceed the {:?} reserve)",
                        attempts, view.reserve
                    );
                    return Err(CallError::DeadlineExceeded(DeadlineError::new(why, None), None));
                }
            };
            if deadline_stop {
                calls.count(CallOutcome::DeadlineExceeded);
                let why = format!("{reason} after {attempts} attempt(s)");
                return Err(CallError::DeadlineExceeded(DeadlineError::new(why, None), Some(Box::new(err))));
            }
            calls.count(outcome);
            Err(err)
        }
    }
}

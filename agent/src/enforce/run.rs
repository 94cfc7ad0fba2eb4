//! The one function that fixes the order of enforcement.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use std::ops::Deref;

use pin_project_lite::pin_project;
use tokio::task::futures::TaskLocalFuture;
use tokio::time::Instant;

use super::guards::{CallCounters, CallOutcome};
use super::{
    AttemptTimeout, CallError, CallsAt, DeadlineError, DepView, InjectedFault, Judgement, KillSwitched,
    Scope, ScopeAt,
};
use crate::breaker::{BreakerOpen, DetachedBreakerPermit, Outcome};
use crate::bulkhead::{BulkheadError, DetachedBulkheadPermit};
use crate::deadline;
use crate::fault::FaultDecision;
use crate::health::HealthOutcome;
use crate::retry::{CallInfo, Classify, Decision, ErrorKind, Throttled};

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
    // The first word, compared in place: asked on every call, so no search for the space.
    let name = operation.as_bytes();
    let is = |method: &[u8]| name.starts_with(method) && name.get(method.len()).is_none_or(|&c| c == b' ');
    is(b"GET") || is(b"HEAD") || is(b"OPTIONS") || is(b"PUT") || is(b"DELETE") || is(b"TRACE")
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
///    counts for nothing there). An attempt ended by a refusal made on this machine
///    ([`ErrorKind::is_local_refusal`]: another dependency's full bulkhead or open breaker
///    inside it, a `load_shed` below the layer, a deadline) is not the dependency's
///    outcome: its breaker permit is handed back unrecorded (IN-6).
///
/// The source article draws the breaker outside the retry, but its own reasons — the
/// breaker must see each failed attempt, and no retry may run while it is open — need it
/// inside; with it outside, one breaker outcome stands for a whole retried sequence and a
/// half-open probe becomes several attempts.
#[allow(clippy::type_complexity)]
pub(crate) fn run<'v, T, E, F, Fut, J>(
    view: &'v DepView,
    operation: &'v str,
    idempotent_hint: Option<bool>,
    attempt: F,
    judge: J,
) -> Run<&'v DepView, &'v str, Closures<F, J, fn(Outcome)>, Fut>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, E>>,
    J: Fn(&Result<T, E>) -> Judgement,
{
    Run::new(view, operation, idempotent_hint, true, Closures { attempt, judge, observe: ignore })
}

fn ignore(_: Outcome) {}

/// [`run`], telling `observe` the outcome of every attempt that reached the dependency
/// (the same outcome the circuit breaker records: timeouts and injected failures are
/// failures). Attempts refused locally (open breaker, no budget) are not reported. Used
/// by outlier detection to judge the endpoint each attempt went to. `replayable: false`
/// (a request whose body cannot be sent twice) allows one attempt whatever the policy.
pub(crate) fn run_observed<'v, T, E, F, Fut, J, O>(
    view: &'v DepView,
    operation: &'v str,
    idempotent_hint: Option<bool>,
    replayable: bool,
    attempt: F,
    judge: J,
    observe: O,
) -> Run<&'v DepView, &'v str, Closures<F, J, O>, Fut>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, E>>,
    J: Fn(&Result<T, E>) -> Judgement,
    O: Fn(Outcome),
{
    Run::new(view, operation, idempotent_hint, replayable, Closures { attempt, judge, observe })
}

/// What [`Run`] calls: one attempt's future, its judgement, and who hears each outcome.
pub(crate) trait Attempts {
    type Output;
    type Error;
    type Future: Future<Output = Result<Self::Output, Self::Error>>;

    /// The next attempt (called only when it will be awaited).
    fn attempt(&mut self) -> Self::Future;

    /// How an attempt's result turns out.
    fn judge(&self, result: &Result<Self::Output, Self::Error>) -> Judgement;

    /// The outcome of an attempt that reached the dependency (see [`run_observed`]).
    fn observe(&self, _outcome: Outcome) {}
}

/// [`Attempts`] made of closures (the plain call and the middleware).
pub(crate) struct Closures<F, J, O> {
    attempt: F,
    judge: J,
    observe: O,
}

impl<F, Fut, T, E, J, O> Attempts for Closures<F, J, O>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, E>>,
    J: Fn(&Result<T, E>) -> Judgement,
    O: Fn(Outcome),
{
    type Output = T;
    type Error = E;
    type Future = Fut;

    fn attempt(&mut self) -> Fut {
        (self.attempt)()
    }

    fn judge(&self, result: &Result<T, E>) -> Judgement {
        (self.judge)(result)
    }

    fn observe(&self, outcome: Outcome) {
        (self.observe)(outcome);
    }
}

/// The operation a [`Run`] enforces: a borrowed name, or a tower request's own (`None` =
/// the dependency as a whole).
pub(crate) trait OperationName {
    fn operation<'a>(&'a self, dependency: &'a str) -> &'a str;
}

impl OperationName for &str {
    fn operation<'a>(&'a self, _dependency: &'a str) -> &'a str {
        self
    }
}

impl OperationName for Option<super::Operation> {
    fn operation<'a>(&'a self, dependency: &'a str) -> &'a str {
        self.as_ref().map_or(dependency, super::Operation::as_str)
    }
}

pin_project! {
    /// An injected delay, then the attempt (the sleep is created on the first poll).
    pub(crate) struct Delayed<F> {
        delay: Option<Duration>,
        #[pin]
        sleep: Option<tokio::time::Sleep>,
        #[pin]
        fut: F,
    }
}

impl<F: Future> Future for Delayed<F> {
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let mut this = self.project();
        if let Some(d) = this.delay.take() {
            this.sleep.set(Some(tokio::time::sleep(d)));
        }
        if let Some(sleep) = this.sleep.as_mut().as_pin_mut() {
            std::task::ready!(sleep.poll(cx));
            this.sleep.set(None);
        }
        this.fut.poll(cx)
    }
}

type AttemptFuture<Fut> = LazyTimeout<TaskLocalFuture<deadline::RequestContext, Delayed<Fut>>>;

/// Waiting for a bulkhead slot (the only stage that allocates: a caller that finds a free
/// slot never waits).
type SlotWait = Pin<Box<dyn Future<Output = Result<DetachedBulkheadPermit, BulkheadError>> + Send>>;

pin_project! {
    #[project = StageProj]
    enum Stage<Fut> {
        Start,
        Slot { wait: SlotWait },
        Attempt { #[pin] fut: AttemptFuture<Fut> },
        Backoff { #[pin] sleep: tokio::time::Sleep },
        Done,
    }
}

pin_project! {
    /// One call through every enforcement stage (see [`run`] for the order), as a
    /// hand-written state machine: it can be named (the tower path's response future holds
    /// it inline) and allocates nothing on the success path. Stages: start (kill switch,
    /// deadline, bulkhead slot) → [waiting for a slot] → attempt → [backoff → attempt]… →
    /// done. Its permits are held detached from the guards (which the view owns) and given
    /// back when the call ends or the future is dropped.
    pub(crate) struct Run<V, Op, A, Fut>
    where
        V: Deref<Target = DepView>,
        Op: OperationName,
    {
        #[pin]
        stage: Stage<Fut>,
        core: Core<V, Op, A>,
    }
}

/// The state of a [`Run`] besides its stage.
struct Core<V: Deref<Target = DepView>, Op: OperationName, A> {
    view: V,
    op: Op,
    attempts: A,
    idempotent_hint: Option<bool>,
    replayable: bool,
    /// Where the operation's scope and call counters are in the view: found by name once,
    /// at the start (each lookup by name costs a hash of it).
    scope_at: ScopeAt,
    calls_at: CallsAt,
    ctx: Option<deadline::RequestContext>,
    /// The clock read at the start, reused by the first attempt when nothing waited.
    first_now: Option<Instant>,
    /// When the call began (the same reading), for its latency in the health window.
    call_start: Option<Instant>,
    info: CallInfo,
    /// Attempts started (the running one included).
    n: u32,
    slot: Option<DetachedBulkheadPermit>,
    breaker: Option<DetachedBreakerPermit>,
    /// The running attempt's budget and (when the breaker measures durations) start.
    budget: Duration,
    started: Option<Instant>,
}

impl<V: Deref<Target = DepView>, Op: OperationName, A> Drop for Core<V, Op, A> {
    fn drop(&mut self) {
        // A call dropped mid-flight gives its slot back and releases an unreported probe,
        // exactly as dropping the permits themselves would.
        if self.slot.is_none() && self.breaker.is_none() {
            return;
        }
        let guards = &*self.view.scope_by(self.scope_at).guards;
        if let Some(p) = self.breaker.take() {
            drop(guards.breaker.reattach(p));
        }
        if let Some(p) = self.slot.take() {
            drop(guards.bulkhead.reattach(p));
        }
    }
}

/// What the start stage leads to.
enum Begin<E> {
    Attempt,
    Wait(SlotWait),
    Fail(CallError<E>),
}

impl<V, Op, A> Run<V, Op, A, A::Future>
where
    V: Deref<Target = DepView>,
    Op: OperationName,
    A: Attempts,
{
    pub(crate) fn new(view: V, op: Op, idempotent_hint: Option<bool>, replayable: bool, attempts: A) -> Self {
        Self {
            stage: Stage::Start,
            core: Core {
                view,
                op,
                attempts,
                idempotent_hint,
                replayable,
                scope_at: ScopeAt::Dependency,
                calls_at: CallsAt::Scope,
                ctx: None,
                first_now: None,
                call_start: None,
                info: CallInfo {
                    idempotent: false,
                    deadline: None,
                    reserve: Duration::ZERO,
                    inbound_retried: false,
                },
                n: 0,
                slot: None,
                breaker: None,
                budget: Duration::ZERO,
                started: None,
            },
        }
    }
}

impl<V, Op, A> Core<V, Op, A>
where
    V: Deref<Target = DepView>,
    Op: OperationName,
    A: Attempts,
{
    /// 1. kill switch, 2. deadline, 3. bulkhead (a free slot at once).
    fn begin(&mut self) -> Begin<A::Error> {
        let view = &*self.view;
        let operation = self.op.operation(&view.name);
        self.scope_at = view.scope_at(operation);
        self.calls_at = view.calls_at(operation, self.scope_at);
        let scope = view.scope_by(self.scope_at);
        let calls = view.calls_by(self.calls_at, scope);
        // 1. kill switch
        if !view.enabled {
            self.count(calls, CallOutcome::KillSwitched, CallOutcome::KillSwitched);
            return Begin::Fail(CallError::KillSwitched(KillSwitched::new(view.name.clone())));
        }
        // 2. deadline
        let ctx = deadline::current();
        self.ctx = ctx;
        let deadline = ctx.map(|c| c.deadline);
        // The clock is read once here; the first attempt reuses the reading when nothing
        // waited in between (each read costs tens of ns on the success path). It is also
        // the start of the call's latency in its health window.
        let now = Instant::now();
        self.call_start = Some(now);
        if let Some(d) = deadline
            && now >= d.instant()
        {
            self.count(calls, CallOutcome::DeadlineExceeded, CallOutcome::DeadlineExceeded);
            return Begin::Fail(CallError::DeadlineExceeded(
                DeadlineError::new("the request's deadline had passed before the call", None),
                None,
            ));
        }
        // 4. retry: what the retry stage needs to know, fixed for the whole call.
        let idempotent =
            scope.idempotent.or(self.idempotent_hint).unwrap_or_else(|| idempotent_by_name(operation));
        self.info = CallInfo {
            idempotent: idempotent && self.replayable && !view.retries_paused,
            deadline,
            reserve: view.reserve,
            inbound_retried: ctx.is_some_and(|c| c.inbound_retried),
        };
        // 3. bulkhead
        // A free slot is taken without another deadline check (stage 2 has just made it);
        // waiting for one goes through `acquire`, which re-checks the deadline once granted.
        match scope.guards.bulkhead.try_acquire() {
            Ok(p) => {
                self.slot = Some(p.detach());
                self.first_now = Some(now);
                Begin::Attempt
            }
            Err(_) => {
                let guards = scope.guards.clone();
                Begin::Wait(Box::pin(async move {
                    guards.bulkhead.acquire(deadline).await.map(crate::bulkhead::BulkheadPermit::detach)
                }))
            }
        }
    }

    /// The end of the wait for a bulkhead slot.
    fn slot_granted(
        &mut self,
        r: Result<DetachedBulkheadPermit, BulkheadError>,
    ) -> Result<(), CallError<A::Error>> {
        let calls = self.calls();
        match r {
            Ok(p) => {
                self.slot = Some(p);
                Ok(())
            }
            Err(BulkheadError::Full(e)) => {
                self.count(calls, CallOutcome::BulkheadFull, CallOutcome::BulkheadFull);
                Err(CallError::BulkheadFull(e))
            }
            Err(BulkheadError::DeadlineExceeded(_)) => {
                self.count(calls, CallOutcome::DeadlineExceeded, CallOutcome::DeadlineExceeded);
                Err(CallError::DeadlineExceeded(
                    DeadlineError::new("the deadline passed while waiting for a bulkhead slot", None),
                    None,
                ))
            }
        }
    }

    fn scope(&self) -> &Scope {
        self.view.scope_by(self.scope_at)
    }

    fn calls(&self) -> &CallCounters {
        self.view.calls_by(self.calls_at, self.scope())
    }

    /// Counts the end of the call: `outcome` in `levee_calls_total`, and in the
    /// dependency's health window as `health` says (the outcome of the last attempt when
    /// the deadline stopped the retries after the dependency failed: a dependency that
    /// times out every attempt is failing, not shed).
    fn count(&self, calls: &CallCounters, outcome: CallOutcome, health: CallOutcome) {
        calls.count(outcome);
        let health = match health {
            CallOutcome::Ok => HealthOutcome::Success,
            CallOutcome::Failed | CallOutcome::Injected => HealthOutcome::Failure,
            CallOutcome::Timeout => HealthOutcome::Timeout,
            CallOutcome::KillSwitched
            | CallOutcome::BreakerOpen
            | CallOutcome::BulkheadFull
            | CallOutcome::DeadlineExceeded
            | CallOutcome::Throttled
            | CallOutcome::RefusedLocally => HealthOutcome::Shed,
        };
        let counters = &self.view.state.health;
        let weight = counters.count(health);
        if weight > 0 {
            let elapsed = self.call_start.map_or(Duration::ZERO, |start| start.elapsed());
            counters.latency(elapsed, weight);
        }
    }

    /// Starts attempt `n + 1`: 5. client-side throttle, 6. circuit breaker, 7. per-attempt
    /// timeout and faults, 8. the call. An attempt refused locally fails at once.
    #[allow(clippy::type_complexity)]
    fn start_attempt(&mut self) -> Result<AttemptFuture<A::Future>, AttemptFailure<A::Output, A::Error>> {
        self.n += 1;
        let n = self.n;
        let view = &*self.view;
        let scope = view.scope_by(self.scope_at);
        let guards = &*scope.guards;
        let throttle = &view.state.throttle;
        let ctx = self.ctx;
        let deadline = self.info.deadline;
        // 5. client-side throttle, then 6. circuit breaker (only asked when the throttle
        // lets the attempt through).
        throttle.try_acquire().map_err(AttemptFailure::Throttled)?;
        let permit = guards.breaker.try_acquire().map_err(AttemptFailure::BreakerOpen)?;
        // 7. per-attempt timeout (and faults inside it)
        let start = self.first_now.take().filter(|_| n == 1).unwrap_or_else(Instant::now);
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
        // Dropping the permit unrecorded: the attempt never happened.
        let Ok(budget) = budget else { return Err(AttemptFailure::NoBudget) };
        let fault = if view.faults_active {
            view.state.faults.decide(&view.name, self.op.operation(&view.name))
        } else {
            FaultDecision::None
        };
        if let Some(kind) = fault.error_kind() {
            permit.record(outcome_of(kind), Duration::ZERO);
            self.attempts.observe(outcome_of(kind));
            if let Some(accepted) = kind.throttle_answer() {
                throttle.record(accepted);
            }
            return Err(AttemptFailure::Injected(InjectedFault::new(view.name.clone(), kind)));
        }
        // The attempt runs under its own deadline, `start + budget` = min(remaining −
        // reserve, attempt timeout, non-critical cap): what `propagate` sends the callee
        // (it must not outwork its caller) and what a tower layer bounds the response body
        // by.
        let until = deadline::Deadline::at(start + budget);
        let attempt_ctx = deadline::RequestContext {
            deadline: until,
            // The attempt is abandoned at `until`, whoever set the request's deadline.
            from_caller: true,
            criticality: ctx.map(|c| c.criticality).unwrap_or_default(),
            inbound_retried: ctx.is_some_and(|c| c.inbound_retried),
        };
        // The breaker's durations are measured only when it needs them (slow-call
        // detection).
        self.started = scope.measure.then_some(start);
        self.budget = budget;
        self.breaker = Some(permit.detach());
        // 8. the call: only created when it will be awaited.
        let delay = match fault {
            FaultDecision::Delay(d) => Some(d),
            _ => None,
        };
        let fut = self.attempts.attempt();
        Ok(LazyTimeout {
            fut: deadline::scope(attempt_ctx, Delayed { delay, sleep: None, fut }),
            sleep: None,
            until: until.instant(),
        })
    }

    /// Judges and records the end of the running attempt (`None`: its timeout fired).
    #[allow(clippy::type_complexity)]
    fn end_attempt(
        &mut self,
        out: Option<Result<A::Output, A::Error>>,
    ) -> Result<A::Output, AttemptFailure<A::Output, A::Error>> {
        let elapsed = self.started.take().map(|s| s.elapsed()).unwrap_or(Duration::ZERO);
        let view = &*self.view;
        let guards = &*view.scope_by(self.scope_at).guards;
        let throttle = &view.state.throttle;
        let Some(detached) = self.breaker.take() else {
            unreachable!("an attempt runs with its breaker permit")
        };
        let permit = guards.breaker.reattach(detached);
        let Some(r) = out else {
            permit.record(Outcome::Failure, elapsed);
            self.attempts.observe(Outcome::Failure);
            return Err(AttemptFailure::Timeout(AttemptTimeout::new(view.name.clone(), self.budget)));
        };
        match self.attempts.judge(&r) {
            Judgement::Success => {
                permit.record(Outcome::Success, elapsed);
                self.attempts.observe(Outcome::Success);
                throttle.record(true);
                r.map_err(|e| AttemptFailure::Inner(e, ErrorKind::Other, None))
            }
            Judgement::Failure { kind, retry_after } => {
                if kind.is_local_refusal() {
                    // Refused on this machine from inside the attempt (another
                    // dependency's bulkhead or breaker, a `load_shed` below this layer, a
                    // deadline): nothing to say about this dependency. Dropped unrecorded,
                    // the permit hands a half-open probe back (IN-6).
                    drop(permit);
                } else {
                    permit.record(outcome_of(kind), elapsed);
                    self.attempts.observe(outcome_of(kind));
                    if let Some(accepted) = kind.throttle_answer() {
                        throttle.record(accepted);
                    }
                }
                Err(match r {
                    Ok(v) => AttemptFailure::Value(v, kind, retry_after),
                    Err(e) => AttemptFailure::Inner(e, kind, retry_after),
                })
            }
        }
    }

    /// The retry stage's answer to a failed attempt: a backoff, or the call's result.
    fn after_failure(
        &mut self,
        last: AttemptFailure<A::Output, A::Error>,
    ) -> Result<Duration, Result<A::Output, CallError<A::Error>>> {
        let view = &*self.view;
        let (reason, attempts) = match self.scope().guards.retrier.next_step(&self.info, self.n, &last) {
            Decision::RetryAfter(delay) => return Ok(delay),
            Decision::Stop(reason) => (reason, self.n),
        };
        let calls = self.calls();
        let deadline_stop = reason.is_deadline();
        let failed = |kind: ErrorKind| {
            if kind.is_local_refusal() { CallOutcome::RefusedLocally } else { CallOutcome::Failed }
        };
        let (outcome, err) = match last {
            AttemptFailure::Value(v, kind, _) => {
                self.count(calls, failed(kind), failed(kind));
                return Err(Ok(v));
            }
            AttemptFailure::Inner(e, kind, _) => (failed(kind), CallError::Inner(e)),
            AttemptFailure::BreakerOpen(e) => (CallOutcome::BreakerOpen, CallError::BreakerOpen(e)),
            AttemptFailure::Timeout(e) => (CallOutcome::Timeout, CallError::Timeout(e)),
            AttemptFailure::Injected(e) => (CallOutcome::Injected, CallError::Injected(e)),
            AttemptFailure::Throttled(e) => (CallOutcome::Throttled, CallError::Throttled(e)),
            AttemptFailure::NoBudget => {
                self.count(calls, CallOutcome::DeadlineExceeded, CallOutcome::DeadlineExceeded);
                let why = format!(
                    "no time left for attempt {} (remaining budget does not exceed the {:?} reserve)",
                    attempts, view.reserve
                );
                return Err(Err(CallError::DeadlineExceeded(DeadlineError::new(why, None), None)));
            }
        };
        if deadline_stop {
            self.count(calls, CallOutcome::DeadlineExceeded, outcome);
            let why = format!("{reason} after {attempts} attempt(s)");
            return Err(Err(CallError::DeadlineExceeded(DeadlineError::new(why, None), Some(Box::new(err)))));
        }
        self.count(calls, outcome, outcome);
        Err(Err(err))
    }

    /// The call ends: the slot is given back.
    fn finish(&mut self) {
        if let Some(p) = self.slot.take() {
            drop(self.scope().guards.bulkhead.reattach(p));
        }
    }
}

impl<V, Op, A> Future for Run<V, Op, A, A::Future>
where
    V: Deref<Target = DepView>,
    Op: OperationName,
    A: Attempts,
{
    type Output = Result<A::Output, CallError<A::Error>>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        let core = this.core;
        loop {
            // Each arm either returns or says what follows: the result of an attempt that
            // ended (or was refused) now, or a new attempt to start.
            let ended = match this.stage.as_mut().project() {
                StageProj::Start => match core.begin() {
                    Begin::Attempt => None,
                    Begin::Wait(wait) => {
                        this.stage.set(Stage::Slot { wait });
                        continue;
                    }
                    Begin::Fail(e) => {
                        this.stage.set(Stage::Done);
                        return Poll::Ready(Err(e));
                    }
                },
                StageProj::Slot { wait } => {
                    let r = std::task::ready!(wait.as_mut().poll(cx));
                    if let Err(e) = core.slot_granted(r) {
                        this.stage.set(Stage::Done);
                        return Poll::Ready(Err(e));
                    }
                    None
                }
                StageProj::Attempt { fut } => {
                    let out = std::task::ready!(fut.poll(cx));
                    Some(core.end_attempt(out))
                }
                StageProj::Backoff { sleep } => {
                    std::task::ready!(sleep.poll(cx));
                    None
                }
                StageProj::Done => panic!("`Run` polled after completion"),
            };
            let result = match ended {
                Some(r) => r,
                None => match core.start_attempt() {
                    Ok(fut) => {
                        this.stage.set(Stage::Attempt { fut });
                        continue;
                    }
                    Err(refused) => Err(refused),
                },
            };
            match result {
                Ok(v) => {
                    core.scope().guards.retrier.budget().deposit();
                    core.count(core.calls(), CallOutcome::Ok, CallOutcome::Ok);
                    core.finish();
                    this.stage.set(Stage::Done);
                    return Poll::Ready(Ok(v));
                }
                Err(last) => match core.after_failure(last) {
                    Ok(delay) => this.stage.set(Stage::Backoff { sleep: tokio::time::sleep(delay) }),
                    Err(out) => {
                        core.finish();
                        this.stage.set(Stage::Done);
                        return Poll::Ready(out);
                    }
                },
            }
        }
    }
}

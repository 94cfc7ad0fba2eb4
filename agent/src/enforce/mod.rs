//! Local enforcement of a dependency's policy around outgoing calls.
//!
//! [`Dependency`] is the handle (`agent.dependency("recommendations")`); its
//! [`call`](Dependency::call) wraps any future, [`call_or_fallback`](Dependency::call_or_fallback)
//! adds a fallback, and [`DependencyLayer`] does the same for any `tower::Service`. All three
//! go through `run.rs` (its `Run` future), the one place that decides the order of
//! enforcement.
//!
//! The hot path reads the dependency's resolved view with one lock-free `arc-swap` load
//! and takes no lock; the view is rewritten whenever a snapshot is applied or a flag
//! changes.

mod client;
mod error;
mod guards;
mod judgement;
#[cfg(feature = "reqwest-middleware")]
mod middleware;
mod run;

#[cfg(test)]
mod stack_tests;
#[cfg(test)]
mod tests;

use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use tokio::time::Instant;

pub use client::{
    Attempt, AttemptBody, CallPolicy, DependencyLayer, DependencyService, ErrorPolicy, GrpcPolicy,
    HttpPolicy, Operation, OperationFrom, ReplayBody, ReplayRequest, ResponseFuture, propagate,
};
pub use error::{
    AttemptTimeout, CallError, DeadlineError, InjectedFault, KillSwitched, NotReplayable, Refusal, Refused,
};
#[cfg(feature = "reqwest-middleware")]
pub use middleware::LeveeMiddleware;
pub use run::idempotent_by_name;

pub(crate) use guards::DepState;
use guards::Guards;
pub use guards::{MAX_LABELLED_OPERATIONS, OTHER_OPERATION};
pub use judgement::Judgement;

use crate::applied::ResolveCtx;
use crate::breaker::{BreakerSnapshot, CircuitBreaker, State as BreakerState};
use crate::policy::{self, BreakerOverrideState, DependencyCriticality, FallbackLevel};
use crate::registry::{Registry, Resolve};
use crate::retry::Classify;

/// Per-call settings of one (dependency, operation) scope and its guards.
#[derive(Debug)]
pub(crate) struct Scope {
    /// Call counters labelled with this operation when its guards are the dependency's
    /// (labelled with the dependency).
    pub(crate) calls: Option<guards::CallCounters>,
    pub(crate) attempt_timeout: Duration,
    /// Whether attempt durations are needed (slow-call detection on).
    pub(crate) measure: bool,
    pub(crate) idempotent: Option<bool>,
    pub(crate) guards: Arc<Guards>,
}

/// A dependency's policy as resolved for the hot path: rebuilt on every apply, while the
/// guards it points to live on in [`DepState`].
#[derive(Debug)]
pub(crate) struct DepView {
    pub(crate) name: Arc<str>,
    pub(crate) policy: Arc<policy::DependencyPolicy>,
    /// Whether the kill switch lets calls through.
    pub(crate) enabled: bool,
    pub(crate) criticality: DependencyCriticality,
    pub(crate) reserve: Duration,
    pub(crate) non_critical_cap: Duration,
    pub(crate) retries_paused: bool,
    pub(crate) faults_active: bool,
    pub(crate) state: Arc<DepState>,
    default_scope: Scope,
    /// The scopes of the operations the policy names, found by name through `op_index`
    /// once per call ([`ScopeAt`]) and by position after that.
    ops: Vec<(Box<str>, Scope)>,
    op_index: HashMap<Box<str>, u32>,
}

/// Where a call's [`Scope`] is in its [`DepView`]: looked up by name once per call, the
/// later stages of the call go straight to it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ScopeAt {
    /// The dependency's own (an operation without settings of its own).
    Dependency,
    /// `ops[i]`.
    Op(u32),
}

/// Where a call's `levee_calls_total` counters are, found once per call (see
/// [`DepView::calls_at`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum CallsAt {
    /// The scope's own: an operation with settings of its own, or the dependency itself.
    Scope,
    /// The dependency's per-operation table (see [`guards::OperationCalls`]).
    Operation(guards::OperationSlot),
}

impl DepView {
    /// Whether a call of `operation` may be retried now: idempotent (policy, else
    /// `hint`, else by name), more than one attempt configured, retries not paused, and
    /// the inbound request not already retried upstream (retry on one layer). The same
    /// rule as the retry stage of [`run`](run::run).
    pub(crate) fn will_retry(&self, operation: &str, hint: Option<bool>) -> bool {
        let scope = self.scope(operation);
        scope.idempotent.or(hint).unwrap_or_else(|| idempotent_by_name(operation))
            && scope.guards.retrier.policy().max_attempts() > 1
            && !self.retries_paused
            && !crate::deadline::current().is_some_and(|c| c.inbound_retried)
    }

    fn resolve_with(name: &Arc<str>, state: &Arc<DepState>, ctx: &ResolveCtx<'_>) -> (Self, Option<Instant>) {
        let config = &ctx.applied.config;
        let defaults = ctx.defaults;
        let from_server = config.policy.dependencies.get(&**name);
        let policy =
            from_server.or_else(|| defaults.policy.dependencies.get(&**name)).cloned().unwrap_or_default();
        let (enabled, mut wake) = ctx.switch_on(policy.enabled_flag.as_deref());
        let mut wake_at = |at: Instant| wake = Some(wake.map_or(at, |w: Instant| w.min(at)));
        // Service-wide settings come from whichever config supplied the dependency.
        let service_policy = if from_server.is_some() { &config.policy } else { &defaults.policy };
        // Operator levers (retries paused) until their expiry, scheduled like the rest.
        let (levers, levers_end) = ctx.levers();
        if let Some(at) = levers_end {
            wake_at(at);
        }
        let dep_guards = state.dependency_guards(&policy);
        let mut ops = HashMap::new();
        for (op, o) in &policy.operations {
            let timeout = o.attempt_timeout.unwrap_or(policy.attempt_timeout);
            let guards = if o.retry.is_some() || o.circuit_breaker.is_some() || o.bulkhead.is_some() {
                state.operation_guards(
                    op,
                    o.retry.as_ref().unwrap_or(&policy.retry),
                    o.circuit_breaker.as_ref().unwrap_or(&policy.circuit_breaker),
                    o.bulkhead.as_ref().unwrap_or(&policy.bulkhead),
                    timeout,
                )
            } else {
                dep_guards.clone()
            };
            let measure =
                o.circuit_breaker.as_ref().unwrap_or(&policy.circuit_breaker).slow_call_duration.is_some();
            let calls = Arc::ptr_eq(&guards, &dep_guards).then(|| state.operation_calls(op).clone());
            ops.insert(
                op.as_str(),
                Scope { calls, attempt_timeout: timeout, measure, idempotent: o.idempotent, guards },
            );
        }
        // Operator overrides of breakers. Each ends at its expiry, scheduled like a flag's
        // (CP-11): the housekeeping timer re-resolves at that instant, so breaker state,
        // readiness and the status report change then, not at the next call.
        let mut overridden: Vec<*const Guards> = Vec::new();
        for (o, until) in ctx.applied.breaker_overrides().filter(|(o, _)| *o.dependency == **name) {
            let g = match &o.operation {
                Some(op) => ops
                    .get(op.as_str())
                    .map(|s: &Scope| s.guards.clone())
                    .unwrap_or_else(|| dep_guards.clone()),
                None => dep_guards.clone(),
            };
            match until {
                Some(u) if u <= ctx.now => expire_override(&g.breaker, o.state, u),
                _ => {
                    g.breaker.set_override(Some(o.state), until);
                    overridden.push(Arc::as_ptr(&g));
                    if let Some(u) = until {
                        wake_at(u);
                    }
                }
            }
        }
        let all_guards = std::iter::once(dep_guards.clone()).chain(ops.values().map(|s| s.guards.clone()));
        for g in all_guards {
            if !overridden.contains(&Arc::as_ptr(&g)) {
                g.breaker.set_override(None::<BreakerOverrideState>, None);
            }
        }
        // Fault rules, each until its expiry (scheduled the same way).
        let mut rules = Vec::new();
        if config.faults_allowed {
            for (rule, until) in ctx.applied.fault_rules().filter(|(f, _)| *f.dependency == **name) {
                if until > ctx.now {
                    rules.push(rule.clone());
                    wake_at(until);
                }
            }
        }
        let faults_active = !rules.is_empty();
        let ops: Vec<(Box<str>, Scope)> = ops.into_iter().map(|(op, scope)| (op.into(), scope)).collect();
        let op_index = ops.iter().enumerate().map(|(i, (op, _))| (op.clone(), i as u32)).collect();
        state.faults.update(rules, config.faults_allowed);
        state.throttle.update(&service_policy.client_throttle);
        let view = DepView {
            name: name.clone(),
            criticality: policy.criticality,
            reserve: service_policy.reserve,
            non_critical_cap: service_policy.non_critical_cap,
            retries_paused: service_policy.inbound.with_levers(levers).retries_paused,
            faults_active,
            state: state.clone(),
            default_scope: Scope {
                calls: None,
                attempt_timeout: policy.attempt_timeout,
                measure: policy.circuit_breaker.slow_call_duration.is_some(),
                idempotent: None,
                guards: dep_guards,
            },
            op_index,
            ops,
            policy: Arc::new(policy),
            enabled,
        };
        (view, wake)
    }

    /// Where the `levee_calls_total` counters of a call of `operation` in scope `at` are:
    /// labelled with the operation whenever one is given (the dependency's name for the
    /// dependency as a whole), whether or not the policy configures it.
    #[inline]
    pub(crate) fn calls_at(&self, operation: &str, at: ScopeAt) -> CallsAt {
        if at != ScopeAt::Dependency || operation == &*self.name {
            // A scope of its own is labelled with its operation already.
            return CallsAt::Scope;
        }
        CallsAt::Operation(self.state.operation_slot(operation))
    }

    /// The counters [`calls_at`](Self::calls_at) found, `scope` being the call's.
    #[inline]
    pub(crate) fn calls_by<'a>(&'a self, at: CallsAt, scope: &'a Scope) -> &'a guards::CallCounters {
        match at {
            CallsAt::Scope => scope.calls.as_ref().unwrap_or(&scope.guards.calls),
            CallsAt::Operation(slot) => self.state.operation_calls_at(slot),
        }
    }

    /// The scope of `operation`: its own when the policy names it, else the dependency's.
    #[inline]
    pub(crate) fn scope(&self, operation: &str) -> &Scope {
        self.scope_by(self.scope_at(operation))
    }

    /// Where the scope of `operation` is (see [`scope`](Self::scope)).
    #[inline]
    pub(crate) fn scope_at(&self, operation: &str) -> ScopeAt {
        if self.ops.is_empty() {
            return ScopeAt::Dependency;
        }
        self.op_index.get(operation).map_or(ScopeAt::Dependency, |&i| ScopeAt::Op(i))
    }

    /// The scope [`scope_at`](Self::scope_at) found.
    #[inline]
    pub(crate) fn scope_by(&self, at: ScopeAt) -> &Scope {
        match at {
            ScopeAt::Dependency => &self.default_scope,
            ScopeAt::Op(i) => self.ops.get(i as usize).map_or(&self.default_scope, |(_, s)| s),
        }
    }

    /// The per-attempt timeout without a request deadline: the configured one, capped for
    /// a non-critical dependency.
    #[inline]
    pub(crate) fn cap(&self, configured: Duration) -> Duration {
        self.criticality.attempt_cap(configured, self.non_critical_cap)
    }
}

/// Ends the operator override of `breaker` that expired at `until`, now rather than at the
/// breaker's next call. The breaker clears an expired override itself (reason
/// `override_expired`) when it is asked for a permit, so it is asked — only while it is in
/// the expired override's state: that is a forced state, in which asking takes no probe
/// and, once the override has expired, rejects nothing. A permit obtained is dropped
/// unrecorded, which counts neither way. In any other state the override is gone already,
/// or replaced by another, and the caller clears it.
fn expire_override(breaker: &CircuitBreaker, state: BreakerOverrideState, until: Instant) {
    let forced = match state {
        BreakerOverrideState::ForcedOpen => BreakerState::ForcedOpen,
        BreakerOverrideState::ForcedClosed => BreakerState::ForcedClosed,
        BreakerOverrideState::Disabled => BreakerState::Disabled,
    };
    if breaker.state() == forced {
        // Same state: only the expiry the breaker checks is set (to `until`, passed).
        breaker.set_override(Some(state), Some(until));
        drop(breaker.try_acquire());
    }
}

impl Resolve for DepView {
    const KIND: &'static str = "dependency";
    const CAP: usize = MAX_TRACKED_DEPENDENCIES;
    const OVERFLOW: &'static str = OVERFLOW_DEPENDENCY;

    fn resolve(name: &Arc<str>, previous: Option<&Self>, ctx: &ResolveCtx<'_>) -> (Self, Option<Instant>) {
        let state = match previous {
            Some(p) => p.state.clone(),
            None => Arc::new(DepState::new(name.clone(), ctx.changes.clone())),
        };
        Self::resolve_with(name, &state, ctx)
    }

    fn configured(name: &str, ctx: &ResolveCtx<'_>) -> bool {
        ctx.applied.config.policy.dependencies.contains_key(name)
            || ctx.defaults.policy.dependencies.contains_key(name)
    }
}

/// Every dependency handle of one agent, by name.
pub(crate) type DepRegistry = Registry<DepView>;

/// Most dependencies one agent tracks one by one; past it, a dependency the policy does
/// not name shares the [`OVERFLOW_DEPENDENCY`] (its own guards, the default policy),
/// counted in `levee_tracking_overflow_total{kind="dependency"}` and, per call, in
/// `levee_calls_total` under that name — never a silent bypass of protection (see
/// [`Dependency`] for what an unknown dependency gets).
pub const MAX_TRACKED_DEPENDENCIES: usize = 1024;
/// The name under which dependencies past [`MAX_TRACKED_DEPENDENCIES`] are tracked.
pub const OVERFLOW_DEPENDENCY: &str = "_overflow";

impl Registry<DepView> {
    /// The handle of dependency `name` (see [`Registry::slot`]).
    pub(crate) fn handle(&self, name: &str, ctx: &ResolveCtx<'_>) -> Dependency {
        let (name, slot) = self.slot(name, ctx);
        Dependency { name, slot }
    }

    /// Samples every dependency's gauges (breaker state, bulkhead in use) and registers its
    /// series with a recorder installed since they were built (the agent's metrics tick,
    /// CB-9).
    pub(crate) fn publish_metrics(&self) {
        for (_, slot) in self.all().iter() {
            let view = slot.load();
            view.default_scope.guards.publish_metrics();
            for (_, scope) in &view.ops {
                if !Arc::ptr_eq(&scope.guards, &view.default_scope.guards) {
                    scope.guards.publish_metrics();
                }
            }
            view.state.faults.publish_metrics();
            view.state.throttle.publish_metrics();
        }
    }

    /// Adds every breaker and bulkhead (dependency-level and per operation) to a status
    /// report, with the Little's-law bulkhead size suggestion.
    pub(crate) fn contribute(&self, report: &mut crate::proto::StatusReport) {
        for (name, slot) in self.all().iter() {
            let view = slot.load();
            let mut scopes: Vec<(String, Arc<Guards>)> =
                vec![(String::new(), view.default_scope.guards.clone())];
            for (op, scope) in &view.ops {
                if !Arc::ptr_eq(&scope.guards, &view.default_scope.guards) {
                    scopes.push((op.to_string(), scope.guards.clone()));
                }
            }
            if let Some((level, since_ms)) = view.state.fallback.current() {
                report.fallbacks.push(crate::proto::DependencyFallback {
                    dependency: name.to_string(),
                    level: level.as_str().to_string(),
                    since_ms,
                });
            }
            for (op, g) in scopes {
                let b = g.breaker.snapshot();
                report.breakers.push(crate::proto::BreakerStatus {
                    dependency: name.to_string(),
                    operation: op.clone(),
                    state: b.state.as_str().to_string(),
                    transitions: b.transitions.iter().map(|t| t.count).sum(),
                    last_transition_reason: b.last_reason.map(|r| r.as_str().to_string()).unwrap_or_default(),
                    failure_rate: b.failure_rate,
                    slow_call_rate: b.slow_call_rate,
                });
                let est = g.bulkhead.estimate();
                // Client-side throttling, per dependency (reported with its own scope).
                let throttled = view.state.throttle.throttled();
                if op.is_empty() && throttled > 0 {
                    report.counters.push(crate::proto::Counter {
                        name: format!("client_throttled{{dependency={:?}}}", name.as_ref() as &str),
                        value: throttled,
                    });
                }
                report.bulkheads.push(crate::proto::BulkheadStatus {
                    dependency: name.to_string(),
                    operation: op,
                    max_concurrent: g.bulkhead.max_concurrent(),
                    in_use: g.bulkhead.in_flight(),
                    suggested_size: f64::from(est.suggested),
                });
            }
        }
    }

    /// Appends the health window of every dependency that saw calls since the last
    /// report (`window_ms` long), at most `room` of them; the others keep their counts for
    /// a later report.
    pub(crate) fn health(&self, window_ms: u64, room: usize, out: &mut Vec<crate::proto::HealthWindow>) {
        for (name, slot) in self.all().iter() {
            if out.len() >= room {
                return;
            }
            let view = slot.load();
            let opens: u64 = std::iter::once(&view.default_scope.guards)
                .chain(
                    view.ops
                        .iter()
                        .map(|(_, s)| &s.guards)
                        .filter(|g| !Arc::ptr_eq(g, &view.default_scope.guards)),
                )
                .flat_map(|g| g.breaker.snapshot().transitions)
                .filter(|t| t.to == BreakerState::Open)
                .map(|t| t.count)
                .sum();
            if let Some(w) = view.state.health.take(crate::health::KIND_DEPENDENCY, name, window_ms, opens) {
                out.push(w);
            }
        }
    }

    /// Whether every **critical** dependency can be called now: switched on and its
    /// breaker not open. Non-critical dependencies never affect readiness.
    pub(crate) fn critical_ready(&self) -> bool {
        self.all().iter().all(|(_, slot)| {
            let view = slot.load();
            if view.criticality != DependencyCriticality::Critical {
                return true;
            }
            let state = view.default_scope.guards.breaker.state();
            view.enabled && !matches!(state, BreakerState::Open | BreakerState::ForcedOpen)
        })
    }
}

/// A handle on one outgoing dependency. Cheap to clone; every call reads the dependency's
/// current policy with one lock-free load.
///
/// An unknown dependency (named neither in the applied snapshot nor in the compiled-in
/// defaults) is enforced with [`policy::DependencyPolicy::default()`].
#[derive(Clone)]
pub struct Dependency {
    name: Arc<str>,
    slot: Arc<ArcSwap<DepView>>,
}

impl fmt::Debug for Dependency {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Dependency").field("name", &self.name).field("enabled", &self.is_enabled()).finish()
    }
}

impl Dependency {
    /// The name the dependency is tracked under: the one asked for, or
    /// [`OVERFLOW_DEPENDENCY`] past [`MAX_TRACKED_DEPENDENCIES`].
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The dependency's current policy (from the applied snapshot, else the compiled-in
    /// defaults, else [`policy::DependencyPolicy::default()`]).
    pub fn policy(&self) -> Arc<policy::DependencyPolicy> {
        self.slot.load().policy.clone()
    }

    /// Whether the kill switch currently lets calls through: the `enabled_flag`'s value
    /// (server value, else the declared default of a handle with that key, else `true`);
    /// `true` without an `enabled_flag`.
    pub fn is_enabled(&self) -> bool {
        self.slot.load().enabled
    }

    /// The configured per-attempt timeout of `operation`: the operation's override, else
    /// the dependency's (before deadline, reserve and non-critical cap are applied).
    pub fn attempt_timeout(&self, operation: &str) -> Duration {
        self.slot.load().scope(operation).attempt_timeout
    }

    /// A point-in-time view of the circuit breaker of `operation`'s scope (the
    /// dependency's unless the operation has its own breaker).
    pub fn breaker(&self, operation: &str) -> BreakerSnapshot {
        self.slot.load().scope(operation).guards.breaker.snapshot()
    }

    /// Calls in flight in the bulkhead of `operation`'s scope, and its current size.
    pub fn bulkhead_usage(&self, operation: &str) -> (u32, u32) {
        let view = self.slot.load();
        let b = &view.scope(operation).guards.bulkhead;
        (b.in_flight(), b.max_concurrent())
    }

    /// Little's-law size suggestion of the bulkhead of `operation`'s scope.
    pub fn bulkhead_estimate(&self, operation: &str) -> crate::bulkhead::LittleEstimate {
        self.slot.load().scope(operation).guards.bulkhead.estimate()
    }

    /// Tokens left in the retry budget of `operation`'s scope.
    pub fn retry_budget_tokens(&self, operation: &str) -> f64 {
        self.slot.load().scope(operation).guards.retrier.budget().tokens()
    }

    /// Whether a call of `operation` would be retried on failure now (idempotent by name
    /// or policy, more than one attempt configured, retries not paused). Services using
    /// [`call`](Self::call) with their own HTTP client pass this to
    /// [`propagate`] so the service called does not retry again.
    pub fn will_retry(&self, operation: &str) -> bool {
        self.slot.load().will_retry(operation, None)
    }

    pub(crate) fn view(&self) -> Arc<DepView> {
        self.slot.load_full()
    }

    /// Calls the dependency under its whole policy, in the order fixed by the enforcement
    /// function (see the crate docs, `# Order`): kill switch → deadline → bulkhead → retry
    /// → client-side throttle → circuit breaker → per-attempt timeout → `attempt()`.
    ///
    /// Inputs: `operation` (a route template or method name such as
    /// `"GET /recommendations/{user}"`; selects per-operation overrides and decides
    /// idempotency by its HTTP method unless the policy says otherwise), and `attempt`,
    /// which makes the future of one attempt and is called again for each retry. Errors are
    /// classified by their [`Classify`] implementation (retryable? a dependency failure?).
    /// The deadline comes from the task's request context
    /// ([`deadline::with_deadline`](crate::deadline::with_deadline)).
    ///
    /// # Errors
    /// * [`CallError::KillSwitched`] — the kill switch is off; `attempt` was not called.
    /// * [`CallError::DeadlineExceeded`] — no time left (before the call, while waiting for
    ///   the bulkhead, or for the next retry), chained to the last error.
    /// * [`CallError::BulkheadFull`] — no slot within `max_wait`.
    /// * [`CallError::BreakerOpen`] — the breaker rejects calls; no attempt was made.
    /// * [`CallError::Timeout`] — the last attempt ran past its per-attempt timeout.
    /// * [`CallError::Injected`] — a fault-injection rule failed the last attempt.
    /// * [`CallError::Throttled`] — the client-side throttle refused the last attempt
    ///   locally (the dependency has been rejecting much of this client's traffic).
    /// * [`CallError::Inner`] — the dependency's own error, after any retries.
    pub async fn call<T, E, F, Fut>(&self, operation: &str, attempt: F) -> Result<T, CallError<E>>
    where
        E: Classify,
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, E>>,
    {
        // The view is borrowed for the call through an `arc-swap` guard, not cloned out of
        // it: a clone and its drop are two read-modify-writes of a reference count every
        // thread calling this dependency shares. (A thread holding many guards at once gets
        // clones from `arc-swap` itself: never worse than cloning here.)
        let view = self.slot.load();
        run::run(&view, operation, None, attempt, Judgement::classify).await
    }

    /// As [`call`](Self::call), with the caller judging each attempt's result (for
    /// answers that are failures although they are `Ok`, such as an HTTP 503 response) and
    /// stating idempotency when the operation name cannot (`None` = by name and policy).
    /// When retries end on such an answer, it is returned as `Ok`.
    pub async fn call_judged<T, E, F, Fut, J>(
        &self,
        operation: &str,
        idempotent: Option<bool>,
        attempt: F,
        judge: J,
    ) -> Result<T, CallError<E>>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, E>>,
        J: Fn(&Result<T, E>) -> Judgement,
    {
        let view = self.slot.load();
        run::run(&view, operation, idempotent, attempt, judge).await
    }

    /// Calls the dependency and, when that fails for any reason (kill switch, open
    /// breaker, full bulkhead, deadline, timeout, error), answers from `fallback` instead.
    ///
    /// Returns the value and where it came from: [`WithFallback::level`] is
    /// [`FallbackLevel::Fresh`] for the dependency's answer and the dependency's configured
    /// `fallback` level otherwise, with the cause in [`WithFallback::cause`]. The fallback gets
    /// the error by reference, runs outside the primary's bulkhead, retries and breaker,
    /// and should be cheap (a cached or static value).
    pub async fn call_or_fallback<T, E, F, Fut, G, GFut>(
        &self,
        operation: &str,
        attempt: F,
        fallback: G,
    ) -> WithFallback<T, E>
    where
        E: Classify,
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, E>>,
        G: FnOnce(&CallError<E>) -> GFut,
        GFut: Future<Output = T>,
    {
        let view = self.slot.load();
        let level = view.policy.fallback;
        match run::run(&view, operation, None, attempt, Judgement::classify).await {
            Ok(value) => {
                view.state.fallback.fresh();
                WithFallback { value, level: FallbackLevel::Fresh, cause: None }
            }
            Err(e) => {
                let value = fallback(&e).await;
                view.state.fallback.served(level);
                view.state.health.fallback();
                WithFallback { value, level, cause: Some(e) }
            }
        }
    }

    /// A stale-if-error cache sized for this dependency (`STALE_CACHE_ENTRIES` entries,
    /// values served up to the dependency's `stale_max_age`), for
    /// [`call_stale_if_error`](Self::call_stale_if_error). Create it once and keep it.
    pub fn stale_cache<K: std::hash::Hash + Eq, V: Clone>(&self) -> crate::fallback::StaleCache<K, V> {
        let view = self.slot.load();
        crate::fallback::StaleCache::new(
            crate::policy::defaults::STALE_CACHE_ENTRIES as usize,
            view.policy.stale_max_age,
        )
    }

    /// The STALE fallback level done for the caller (RFC 5861 `stale-if-error`): calls
    /// the dependency as [`call`](Self::call); a fresh answer is stored in `cache` under
    /// `key` and returned at level FRESH; when the call fails for any reason (kill switch
    /// included), the last good answer for `key` is returned at level STALE if it is no
    /// older than the dependency's `stale_max_age` (the current policy's, applied to the
    /// cache on each failure).
    ///
    /// Storing a fresh answer clones it and allocates one cache entry.
    ///
    /// # Errors
    /// The call's [`CallError`] when there is no stale answer young enough: the caller
    /// goes on down its fallback chain (GENERIC, EMPTY_MARKED, …).
    pub async fn call_stale_if_error<K, T, E, F, Fut>(
        &self,
        cache: &crate::fallback::StaleCache<K, T>,
        key: K,
        operation: &str,
        attempt: F,
    ) -> Result<WithFallback<T, E>, CallError<E>>
    where
        K: std::hash::Hash + Eq,
        T: Clone,
        E: Classify,
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, E>>,
    {
        match self.call(operation, attempt).await {
            Ok(value) => {
                self.slot.load().state.fallback.fresh();
                cache.put(key, value.clone());
                Ok(WithFallback { value, level: FallbackLevel::Fresh, cause: None })
            }
            Err(e) => {
                let view = self.slot.load();
                cache.set_max_staleness(view.policy.stale_max_age);
                match cache.get_if_error(&key) {
                    Some(stale) => {
                        view.state.fallback.served(FallbackLevel::Stale);
                        view.state.health.fallback();
                        Ok(WithFallback { value: stale.value, level: FallbackLevel::Stale, cause: Some(e) })
                    }
                    None => Err(e),
                }
            }
        }
    }

    /// A pool of endpoints of this dependency (replicas, hosts, channels) with outlier
    /// detection under the dependency's `outlier_detection` settings (Envoy defaults when
    /// the policy has none), for [`call_balanced`](Self::call_balanced). Create it once
    /// and keep it; it registers the `levee_outlier_*` metrics for this dependency.
    pub fn endpoints<P>(&self, endpoints: Vec<P>) -> Endpoints<P> {
        let view = self.slot.load_full();
        let settings = view.policy.outlier_detection.clone().unwrap_or_default();
        let labels = crate::metrics_names::Labels::dependency_wide(&view.name);
        Endpoints {
            detector: crate::outlier::OutlierDetector::with_metrics(&settings, endpoints, &labels),
            applied: ArcSwap::new(view.policy.clone()),
        }
    }

    /// As [`call`](Self::call), spreading attempts over the endpoints of `pool`: each
    /// attempt goes to the next endpoint round robin that outlier detection has not
    /// ejected (so a retry normally lands on another endpoint), and each attempt's outcome
    /// — as the circuit breaker judges it, timeouts included — is recorded for the
    /// endpoint it went to. An endpoint failing `consecutive_errors` times in a row is
    /// ejected for `base_ejection_time × times ejected`; never more than
    /// `max_ejection_percent` of the pool, and never the whole pool.
    ///
    /// `attempt` gets the chosen endpoint. Errors as [`call`](Self::call).
    ///
    /// # Panics
    /// When `pool` has no endpoints.
    pub async fn call_balanced<P, T, E, F, Fut>(
        &self,
        pool: &Endpoints<P>,
        operation: &str,
        mut attempt: F,
    ) -> Result<T, CallError<E>>
    where
        E: Classify,
        F: FnMut(&P) -> Fut,
        Fut: Future<Output = Result<T, E>>,
    {
        assert!(!pool.detector.is_empty(), "call_balanced on an empty endpoint pool");
        let view = self.slot.load();
        pool.follow(&view.policy);
        let current = std::cell::Cell::new(0usize);
        let observe = |outcome: crate::breaker::Outcome| {
            pool.detector.record(current.get(), outcome == crate::breaker::Outcome::Success);
        };
        run::run_observed(
            &view,
            operation,
            None,
            true,
            || {
                let (index, endpoint) = pool.detector.pick().expect("the pool is not empty");
                current.set(index);
                attempt(endpoint)
            },
            Judgement::classify,
            &observe,
        )
        .await
    }

    /// A tower layer enforcing this dependency's policy around a service; the operation
    /// is the dependency as a whole unless set with [`DependencyLayer::operation`].
    pub fn layer(&self) -> DependencyLayer {
        DependencyLayer::new(self.clone())
    }
}

/// What a call with a fallback returns ([`Dependency::call_or_fallback`],
/// [`Dependency::call_stale_if_error`]): the value, the level that produced it, and why
/// the fallback answered.
#[derive(Debug)]
pub struct WithFallback<T, E> {
    /// The answer: the dependency's, or the fallback's.
    pub value: T,
    /// [`FallbackLevel::Fresh`] for the dependency's answer; the dependency's configured
    /// fallback level when the fallback answered.
    pub level: FallbackLevel,
    /// Why the fallback answered; `None` when the dependency did.
    pub cause: Option<CallError<E>>,
}

impl<T, E> WithFallback<T, E> {
    /// Whether the value came from the fallback.
    pub fn is_degraded(&self) -> bool {
        self.cause.is_some()
    }
}

/// Endpoints of one dependency with their outlier-detection state; see
/// [`Dependency::endpoints`] and [`Dependency::call_balanced`].
#[derive(Debug)]
pub struct Endpoints<P> {
    detector: crate::outlier::OutlierDetector<P>,
    /// The dependency policy whose settings the detector has (held, so a new policy is
    /// told apart by pointer).
    applied: ArcSwap<policy::DependencyPolicy>,
}

impl<P> Endpoints<P> {
    /// The outlier detector: ejection state per endpoint ([`OutlierDetector::status`]).
    ///
    /// [`OutlierDetector::status`]: crate::outlier::OutlierDetector::status
    pub fn detector(&self) -> &crate::outlier::OutlierDetector<P> {
        &self.detector
    }

    /// Applies the dependency's current `outlier_detection` settings when the policy
    /// changed since the last call (one pointer comparison otherwise).
    fn follow(&self, policy: &Arc<policy::DependencyPolicy>) {
        if !Arc::ptr_eq(&self.applied.load(), policy) {
            self.applied.store(policy.clone());
            self.detector.update(&policy.outlier_detection.clone().unwrap_or_default());
        }
    }
}

//! Each dependency's view: its policy resolved for the hot path (scopes per operation,
//! guards, kill switch, operator overrides and fault rules) whenever a snapshot is applied
//! or a flag changes, and what the registry of views reports (metrics, status, health,
//! readiness).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::guards::{self, DepState, Guards};
use super::{Dependency, idempotent_by_name};
use crate::applied::ResolveCtx;
use crate::breaker::{CircuitBreaker, State as BreakerState};
use crate::policy::{self, BreakerOverrideState, DependencyCriticality};
use crate::registry::{Registry, Resolve};

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
    /// rule as the retry stage of [`run`](super::run::run).
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
            let mine = |f: &policy::FaultRule| *f.dependency == **name && f.applies_to(ctx.instance_id);
            for (rule, until) in ctx.applied.fault_rules().filter(|(f, _)| mine(f)) {
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
        Dependency::new(name, slot)
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

//! The stateful enforcement objects of a dependency, kept across configuration updates.
//!
//! A [`Guards`] bundle (circuit breaker, bulkhead, retrier with its budget, call counters)
//! exists per (dependency, operation) scope: the dependency as a whole, plus each operation
//! that overrides its retry, breaker or bulkhead. New settings are applied with `update`,
//! which keeps windows, budgets and permits when the relevant settings did not change.

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use metrics::Counter;

use crate::breaker::CircuitBreaker;
use crate::bulkhead::Bulkhead;
use crate::fault::FaultInjector;
use crate::metrics_names::{self as names, Labels};
use crate::policy;
use crate::retry::{AdaptiveThrottle, Retrier, RetryBudget};

/// Outcome label values of [`CALLS`](crate::metrics_names::CALLS), in counter order.
pub(crate) const OUTCOMES: [&str; 9] = [
    "ok",
    "failed",
    "timeout",
    "kill_switched",
    "breaker_open",
    "bulkhead_full",
    "deadline_exceeded",
    "injected",
    "throttled",
];

/// Index into [`OUTCOMES`].
#[derive(Clone, Copy, Debug)]
pub(crate) enum CallOutcome {
    Ok = 0,
    Failed = 1,
    Timeout = 2,
    KillSwitched = 3,
    BreakerOpen = 4,
    BulkheadFull = 5,
    DeadlineExceeded = 6,
    Injected = 7,
    Throttled = 8,
}

/// Breaker, bulkhead and retrier of one scope.
pub(crate) struct Guards {
    pub(crate) labels: Labels,
    pub(crate) breaker: CircuitBreaker,
    pub(crate) bulkhead: Bulkhead,
    pub(crate) retrier: Retrier,
    calls: [Counter; 9],
}

impl fmt::Debug for Guards {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Guards")
            .field("dependency", &self.labels.dependency())
            .field("operation", &self.labels.operation())
            .field("breaker", &self.breaker.state())
            .field("bulkhead_in_flight", &self.bulkhead.in_flight())
            .finish()
    }
}

impl Guards {
    pub(crate) fn new(
        dependency: &str,
        operation: &str,
        retry: &policy::Retry,
        breaker: &policy::CircuitBreakerPolicy,
        bulkhead: &policy::BulkheadPolicy,
        attempt_timeout: Duration,
    ) -> Self {
        let labels = Labels::new(dependency, operation);
        let budget = Arc::new(RetryBudget::with_metrics(&retry.budget, &labels));
        let calls = OUTCOMES.map(|o| labels.counter_with(names::CALLS, &[(names::LABEL_OUTCOME, o)]));
        Guards {
            breaker: CircuitBreaker::with_metrics(breaker, attempt_timeout, labels.clone()),
            bulkhead: Bulkhead::with_metrics(bulkhead, &labels),
            retrier: Retrier::with_budget(retry, budget, &labels),
            calls,
            labels,
        }
    }

    pub(crate) fn update(
        &self,
        retry: &policy::Retry,
        breaker: &policy::CircuitBreakerPolicy,
        bulkhead: &policy::BulkheadPolicy,
        attempt_timeout: Duration,
    ) {
        self.retrier.update(retry);
        self.breaker.update(breaker);
        self.breaker.set_attempt_timeout(attempt_timeout);
        self.bulkhead.update(bulkhead);
    }

    #[inline]
    pub(crate) fn count(&self, outcome: CallOutcome) {
        self.calls[outcome as usize].increment(1);
    }
}

/// Everything stateful about one dependency: its own guards, those of operations with
/// their own overrides, its fault injector, and its client-side throttle (one per
/// dependency: it judges the backend as a whole, whatever the operation).
pub(crate) struct DepState {
    pub(crate) name: Arc<str>,
    pub(crate) guards: ArcSwap<Option<Arc<Guards>>>,
    pub(crate) ops: ArcSwap<HashMap<Arc<str>, Arc<Guards>>>,
    pub(crate) faults: FaultInjector,
    pub(crate) fallback: OnFallback,
    pub(crate) throttle: AdaptiveThrottle,
}

/// Whether a dependency is being served by its fallback, and since when: set by the first
/// answer a fallback gave, cleared by the next fresh answer. Reported to the server (the
/// fleet view shows dependencies on a fallback, not only degradation-matrix features).
#[derive(Debug, Default)]
pub(crate) struct OnFallback {
    /// Wall-clock ms since the epoch when the period began (for people); 0: fresh.
    since_ms: std::sync::atomic::AtomicI64,
    /// The `FallbackLevel` of the latest fallback answer, as its `u8`.
    level: std::sync::atomic::AtomicU8,
}

impl OnFallback {
    /// A fresh answer: ends the period (one load when there is none).
    #[inline]
    pub(crate) fn fresh(&self) {
        use std::sync::atomic::Ordering::Relaxed;
        if self.since_ms.load(Relaxed) != 0 {
            self.since_ms.store(0, Relaxed);
        }
    }

    /// A fallback answered at `level`: starts the period unless one is running.
    pub(crate) fn served(&self, level: policy::FallbackLevel) {
        use std::sync::atomic::Ordering::Relaxed;
        self.level.store(level as u8, Relaxed);
        if self.since_ms.load(Relaxed) == 0 {
            let now = crate::policy::Timestamp::now().unix_ms().max(1);
            let _ = self.since_ms.compare_exchange(0, now, Relaxed, Relaxed);
        }
    }

    /// `(level, since_ms)` while on a fallback.
    pub(crate) fn current(&self) -> Option<(policy::FallbackLevel, i64)> {
        use std::sync::atomic::Ordering::Relaxed;
        let since = self.since_ms.load(Relaxed);
        const LEVELS: [policy::FallbackLevel; 5] = [
            policy::FallbackLevel::Fresh,
            policy::FallbackLevel::Stale,
            policy::FallbackLevel::Generic,
            policy::FallbackLevel::EmptyMarked,
            policy::FallbackLevel::FeatureError,
        ];
        let level = LEVELS[usize::from(self.level.load(Relaxed)).min(LEVELS.len() - 1)];
        (since != 0).then_some((level, since))
    }
}

impl fmt::Debug for DepState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DepState")
            .field("name", &self.name)
            .field("operations", &self.ops.load().len())
            .finish()
    }
}

impl DepState {
    pub(crate) fn new(name: Arc<str>) -> Self {
        let labels = Labels::new(&name, &name);
        let faults = FaultInjector::with_metrics(&labels);
        let throttle = AdaptiveThrottle::with_metrics(&policy::ClientThrottle::default(), &labels);
        DepState {
            name,
            guards: ArcSwap::from_pointee(None),
            ops: ArcSwap::from_pointee(HashMap::new()),
            faults,
            fallback: OnFallback::default(),
            throttle,
        }
    }

    /// The dependency-level guards, created with `policy` on first use and updated to it
    /// afterwards.
    pub(crate) fn dependency_guards(&self, policy: &policy::DependencyPolicy) -> Arc<Guards> {
        if let Some(g) = self.guards.load().as_ref() {
            g.update(&policy.retry, &policy.circuit_breaker, &policy.bulkhead, policy.attempt_timeout);
            return g.clone();
        }
        let g = Arc::new(Guards::new(
            &self.name,
            &self.name,
            &policy.retry,
            &policy.circuit_breaker,
            &policy.bulkhead,
            policy.attempt_timeout,
        ));
        self.guards.store(Arc::new(Some(g.clone())));
        g
    }

    /// The guards of an operation with its own overrides, created or updated.
    pub(crate) fn operation_guards(
        &self,
        operation: &str,
        retry: &policy::Retry,
        breaker: &policy::CircuitBreakerPolicy,
        bulkhead: &policy::BulkheadPolicy,
        attempt_timeout: Duration,
    ) -> Arc<Guards> {
        if let Some(g) = self.ops.load().get(operation) {
            g.update(retry, breaker, bulkhead, attempt_timeout);
            return g.clone();
        }
        let g = Arc::new(Guards::new(&self.name, operation, retry, breaker, bulkhead, attempt_timeout));
        let key: Arc<str> = operation.into();
        self.ops.rcu(|m| {
            let mut m = HashMap::clone(m);
            m.entry(key.clone()).or_insert_with(|| g.clone());
            m
        });
        self.ops.load().get(operation).cloned().unwrap_or(g)
    }
}

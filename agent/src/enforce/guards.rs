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
use crate::retry::{Retrier, RetryBudget};

/// Outcome label values of [`CALLS`](crate::metrics_names::CALLS), in counter order.
pub(crate) const OUTCOMES: [&str; 8] = [
    "ok",
    "failed",
    "timeout",
    "kill_switched",
    "breaker_open",
    "bulkhead_full",
    "deadline_exceeded",
    "injected",
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
}

/// The `levee_calls_total` counters of one (dependency, operation) label pair, one per
/// outcome, registered once. Cheap to clone.
#[derive(Clone)]
pub(crate) struct CallCounters(Arc<[Counter; 8]>);

impl CallCounters {
    fn new(labels: &Labels) -> Self {
        Self(Arc::new(OUTCOMES.map(|o| labels.counter_with(names::CALLS, &[(names::LABEL_OUTCOME, o)]))))
    }

    #[inline]
    pub(crate) fn count(&self, outcome: CallOutcome) {
        self.0[outcome as usize].increment(1);
    }
}

impl fmt::Debug for CallCounters {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("CallCounters")
    }
}

/// Most operations of one dependency whose calls are counted under their own `operation`
/// label without being named in the policy; past it they share [`OTHER_OPERATION`].
pub const MAX_LABELLED_OPERATIONS: usize = 64;
/// The `operation` label of calls past [`MAX_LABELLED_OPERATIONS`].
pub const OTHER_OPERATION: &str = "_other";

/// Breaker, bulkhead and retrier of one scope.
pub(crate) struct Guards {
    pub(crate) labels: Labels,
    pub(crate) breaker: CircuitBreaker,
    pub(crate) bulkhead: Bulkhead,
    pub(crate) retrier: Retrier,
    pub(crate) calls: CallCounters,
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
        let calls = CallCounters::new(&labels);
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
}

/// Everything stateful about one dependency: its own guards, those of operations with
/// their own overrides, and its fault injector.
pub(crate) struct DepState {
    pub(crate) name: Arc<str>,
    pub(crate) guards: ArcSwap<Option<Arc<Guards>>>,
    pub(crate) ops: ArcSwap<HashMap<Arc<str>, Arc<Guards>>>,
    /// Call counters of operations that share the dependency's guards, by operation.
    op_calls: ArcSwap<HashMap<Arc<str>, CallCounters>>,
    pub(crate) faults: FaultInjector,
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
        let faults = FaultInjector::with_metrics(&Labels::new(&name, &name));
        DepState {
            name,
            guards: ArcSwap::from_pointee(None),
            ops: ArcSwap::from_pointee(HashMap::new()),
            op_calls: ArcSwap::from_pointee(HashMap::new()),
            faults,
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

    /// The call counters labelled with `operation`, for an operation without guards of
    /// its own: registered on its first call (one allocation, then a lock-free lookup),
    /// at most [`MAX_LABELLED_OPERATIONS`] per dependency, the rest under
    /// [`OTHER_OPERATION`].
    pub(crate) fn operation_calls(&self, operation: &str) -> CallCounters {
        let map = self.op_calls.load();
        if let Some(c) = map.get(operation) {
            return c.clone();
        }
        let label = if map.len() >= MAX_LABELLED_OPERATIONS { OTHER_OPERATION } else { operation };
        if let Some(c) = map.get(label) {
            return c.clone();
        }
        drop(map);
        let counters = CallCounters::new(&Labels::new(&self.name, label));
        let key: Arc<str> = label.into();
        self.op_calls.rcu(|m| {
            let mut m = HashMap::clone(m);
            m.entry(key.clone()).or_insert_with(|| counters.clone());
            m
        });
        self.op_calls.load().get(label).cloned().unwrap_or(counters)
    }
}

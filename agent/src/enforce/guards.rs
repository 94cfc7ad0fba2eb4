//! The stateful enforcement objects of a dependency, kept across configuration updates.
//!
//! A [`Guards`] bundle (circuit breaker, bulkhead, retrier with its budget, call counters)
//! exists per (dependency, operation) scope: the dependency as a whole, plus each operation
//! that overrides its retry, breaker or bulkhead. New settings are applied with `update`,
//! which keeps windows, budgets and permits when the relevant settings did not change.

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use arc_swap::ArcSwap;
use metrics::Counter;

use crate::applied::StatusChanges;
use crate::breaker::CircuitBreaker;
use crate::bulkhead::Bulkhead;
use crate::fault::FaultInjector;
use crate::health::HealthCounters;
use crate::metrics_names::{self as names, Labels};
use crate::policy;
use crate::retry::{AdaptiveThrottle, Retrier, RetryBudget};

/// Outcome label values of [`CALLS`](crate::metrics_names::CALLS), in counter order.
pub(crate) const OUTCOMES: [&str; 10] = [
    "ok",
    "failed",
    "timeout",
    "kill_switched",
    "breaker_open",
    "bulkhead_full",
    "deadline_exceeded",
    "injected",
    "throttled",
    "refused_locally",
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
    /// An attempt ended by a refusal made on this machine from inside it (another
    /// dependency's bulkhead or breaker, a `load_shed` below the layer): not this
    /// dependency's failure.
    RefusedLocally = 9,
}

/// The `levee_calls_total` counters of one (dependency, operation) label pair, one per
/// outcome, each registered once, late (see [`late`](names::late)). Cheap to clone.
#[derive(Clone)]
pub(crate) struct CallCounters(Arc<(Labels, [OnceLock<Counter>; OUTCOMES.len()])>);

impl CallCounters {
    fn new(labels: &Labels) -> Self {
        let c = Self(Arc::new((labels.clone(), Default::default())));
        if names::recorder_installed() {
            c.publish();
        }
        c
    }

    #[inline]
    pub(crate) fn count(&self, outcome: CallOutcome) {
        if let Some(c) = self.counter(outcome as usize) {
            c.increment(1);
        }
    }

    #[inline]
    fn counter(&self, i: usize) -> Option<&Counter> {
        let (labels, cells) = &*self.0;
        names::late(&cells[i], || labels.counter_with(names::CALLS, &[(names::LABEL_OUTCOME, OUTCOMES[i])]))
    }

    /// Registers every outcome's series if a recorder is installed and they are not yet.
    pub(crate) fn publish(&self) {
        for i in 0..OUTCOMES.len() {
            self.counter(i);
        }
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
        changes: &Arc<StatusChanges>,
    ) -> Self {
        // Calls carry the operation they named (the dependency's name for a call of the
        // dependency as a whole); the guards of the dependency-wide scope serve every
        // operation without settings of its own, and say so with `operation="*"`.
        let calls = CallCounters::new(&Labels::new(dependency, operation));
        let labels = if operation == dependency {
            Labels::dependency_wide(dependency)
        } else {
            Labels::new(dependency, operation)
        };
        let budget = Arc::new(RetryBudget::with_metrics(&retry.budget, &labels));
        Guards {
            breaker: CircuitBreaker::with_metrics(breaker, attempt_timeout, labels.clone())
                .reporting_to(changes.clone()),
            bulkhead: Bulkhead::with_metrics(bulkhead, &labels),
            retrier: Retrier::with_budget(retry, budget, &labels),
            calls,
            labels,
        }
    }

    /// Registers every series of this scope with a recorder installed since it was built,
    /// and samples its gauges (the agent's metrics tick).
    pub(crate) fn publish_metrics(&self) {
        self.breaker.publish_metrics();
        self.bulkhead.publish_metrics();
        self.retrier.publish_metrics();
        self.calls.publish();
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
/// their own overrides, its fault injector, and its client-side throttle (one per
/// dependency: it judges the backend as a whole, whatever the operation).
pub(crate) struct DepState {
    pub(crate) name: Arc<str>,
    pub(crate) guards: ArcSwap<Option<Arc<Guards>>>,
    pub(crate) ops: ArcSwap<HashMap<Arc<str>, Arc<Guards>>>,
    /// Call counters of operations that share the dependency's guards, by operation.
    op_calls: OperationCalls,
    pub(crate) faults: FaultInjector,
    pub(crate) fallback: OnFallback,
    pub(crate) throttle: AdaptiveThrottle,
    /// What its calls ended as since the last status report (one window per dependency,
    /// whatever the operation).
    pub(crate) health: HealthCounters,
    changes: Arc<StatusChanges>,
}

/// Whether a dependency is being served by its fallback, and since when: set by the first
/// answer a fallback gave, cleared by the next fresh answer. Reported to the server (the
/// fleet view shows dependencies on a fallback, not only degradation-matrix features).
/// Starting or ending a period (and a change of level within one) signals `changes`, so
/// the sync client reports it soon.
#[derive(Debug)]
pub(crate) struct OnFallback {
    /// Wall-clock ms since the epoch when the period began (for people); 0: fresh.
    since_ms: std::sync::atomic::AtomicI64,
    /// The `FallbackLevel` of the latest fallback answer, as its `u8`.
    level: std::sync::atomic::AtomicU8,
    changes: Arc<StatusChanges>,
}

impl OnFallback {
    pub(crate) fn new(changes: Arc<StatusChanges>) -> Self {
        Self { since_ms: Default::default(), level: Default::default(), changes }
    }

    /// A fresh answer: ends the period (one load when there is none).
    #[inline]
    pub(crate) fn fresh(&self) {
        use std::sync::atomic::Ordering::Relaxed;
        if self.since_ms.load(Relaxed) != 0 && self.since_ms.swap(0, Relaxed) != 0 {
            self.changes.changed();
        }
    }

    /// A fallback answered at `level`: starts the period unless one is running.
    pub(crate) fn served(&self, level: policy::FallbackLevel) {
        use std::sync::atomic::Ordering::Relaxed;
        let level_changed =
            self.level.load(Relaxed) != level as u8 && self.level.swap(level as u8, Relaxed) != level as u8;
        let started = self.since_ms.load(Relaxed) == 0 && {
            let now = crate::policy::Timestamp::now().unix_ms().max(1);
            self.since_ms.compare_exchange(0, now, Relaxed, Relaxed).is_ok()
        };
        if level_changed || started {
            self.changes.changed();
        }
    }

    /// `(level, since_ms)` while on a fallback.
    pub(crate) fn current(&self) -> Option<(policy::FallbackLevel, i64)> {
        use std::sync::atomic::Ordering::Relaxed;
        let since = self.since_ms.load(Relaxed);
        // The level was stored as its rank (`level as u8`).
        let levels = policy::FallbackLevel::ALL;
        let level = levels[usize::from(self.level.load(Relaxed)).min(levels.len() - 1)];
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
    /// `changes` is signalled by the dependency's breakers and fallback period.
    pub(crate) fn new(name: Arc<str>, changes: Arc<StatusChanges>) -> Self {
        let labels = Labels::dependency_wide(&name);
        let faults = FaultInjector::with_metrics(&labels);
        let throttle = AdaptiveThrottle::with_metrics(&policy::ClientThrottle::default(), &labels);
        DepState {
            name,
            guards: ArcSwap::from_pointee(None),
            ops: ArcSwap::from_pointee(HashMap::new()),
            op_calls: OperationCalls::new(),
            faults,
            fallback: OnFallback::new(changes.clone()),
            health: HealthCounters::default(),
            changes,
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
            &self.changes,
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
        let g = Arc::new(Guards::new(
            &self.name,
            operation,
            retry,
            breaker,
            bulkhead,
            attempt_timeout,
            &self.changes,
        ));
        let key: Arc<str> = operation.into();
        self.ops.rcu(|m| {
            let mut m = HashMap::clone(m);
            m.entry(key.clone()).or_insert_with(|| g.clone());
            m
        });
        self.ops.load().get(operation).cloned().unwrap_or(g)
    }

    /// The call counters labelled with `operation`, for an operation without guards of
    /// its own (see [`OperationCalls`]).
    pub(crate) fn operation_calls(&self, operation: &str) -> &CallCounters {
        self.operation_calls_at(self.operation_slot(operation))
    }

    /// Where the counters of `operation` are in its table, registering it on first sight.
    #[inline]
    pub(crate) fn operation_slot(&self, operation: &str) -> OperationSlot {
        self.op_calls.find(&self.name, operation)
    }

    /// The counters [`operation_slot`](Self::operation_slot) found.
    #[inline]
    pub(crate) fn operation_calls_at(&self, slot: OperationSlot) -> &CallCounters {
        self.op_calls.at(&self.name, slot)
    }
}

/// Where an operation's counters are in an [`OperationCalls`] table.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct OperationSlot(u32);

/// [`OperationSlot`] of the shared [`OTHER_OPERATION`] counters.
const OTHER_SLOT: u32 = u32::MAX;

/// An operation's name and its call counters.
type NamedCounters = (Box<str>, CallCounters);

/// Call counters per operation name, found without a lock or an allocation once
/// registered: a fixed open-addressed table of [`MAX_LABELLED_OPERATIONS`] write-once
/// slots, probed from an FNV-1a hash of the name. A name is registered on its first call
/// (one allocation); past the table's size, names share [`OTHER_OPERATION`].
///
/// The slot found last is remembered (`hint`): a dependency called with one operation
/// again and again (the usual case) finds it with one comparison of the name, without
/// hashing it (a hash costs a multiplication per byte of the name, in sequence).
pub(crate) struct OperationCalls {
    slots: Box<[OnceLock<NamedCounters>]>,
    other: OnceLock<CallCounters>,
    hint: AtomicU32,
}

impl OperationCalls {
    fn new() -> Self {
        Self {
            slots: (0..MAX_LABELLED_OPERATIONS).map(|_| OnceLock::new()).collect(),
            other: OnceLock::new(),
            hint: AtomicU32::new(0),
        }
    }

    /// The slot of `operation`, registered in it on first sight.
    #[inline]
    fn find(&self, dependency: &str, operation: &str) -> OperationSlot {
        let hint = self.hint.load(Ordering::Relaxed);
        // A hint is only a place to look first: the name found there is compared.
        if let Some((name, _)) = self.slots.get(hint as usize).and_then(OnceLock::get)
            && **name == *operation
        {
            return OperationSlot(hint);
        }
        self.probe(dependency, operation)
    }

    fn probe(&self, dependency: &str, operation: &str) -> OperationSlot {
        let n = self.slots.len();
        let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
        for b in operation.bytes() {
            hash = (hash ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3);
        }
        let start = (hash % n as u64) as usize;
        for i in 0..n {
            let at = (start + i) % n;
            // Slots are written once and never emptied: a name is always found at the
            // first slot of its probe sequence holding it, and never registered twice.
            let (name, _) = self.slots[at]
                .get_or_init(|| (operation.into(), CallCounters::new(&Labels::new(dependency, operation))));
            if **name == *operation {
                let at = at as u32;
                self.hint.store(at, Ordering::Relaxed);
                return OperationSlot(at);
            }
        }
        OperationSlot(OTHER_SLOT)
    }

    /// The counters at `slot` (found by [`find`](Self::find)).
    #[inline]
    fn at(&self, dependency: &str, slot: OperationSlot) -> &CallCounters {
        match self.slots.get(slot.0 as usize).and_then(OnceLock::get) {
            Some((_, counters)) => counters,
            None => self.other.get_or_init(|| CallCounters::new(&Labels::new(dependency, OTHER_OPERATION))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fallback_period_signals_its_start_level_changes_and_end_only() {
        let changes = Arc::new(StatusChanges::default());
        let on = OnFallback::new(changes.clone());
        on.fresh();
        assert_eq!(changes.generation(), 0);
        on.served(policy::FallbackLevel::Stale);
        assert_eq!(changes.generation(), 1, "period started");
        on.served(policy::FallbackLevel::Stale);
        assert_eq!(changes.generation(), 1, "no signal per fallback answer");
        on.served(policy::FallbackLevel::Generic);
        assert_eq!(changes.generation(), 2, "another level");
        on.fresh();
        on.fresh();
        assert_eq!(changes.generation(), 3, "period ended, once");
        assert!(on.current().is_none());
    }
}

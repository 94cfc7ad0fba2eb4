//! Names of the metrics the agent's enforcement primitives emit (prefix `levee_`), their
//! label keys, and [`Labels`], which registers pre-bound handles once per
//! (dependency, operation) so no call ever looks a metric up by name.
//!
//! Everything goes through the `metrics` facade: install any recorder (the examples use
//! the Prometheus exporter); with none installed the handles are no-ops.

use std::sync::Arc;

use metrics::{Counter, Gauge, Label};

/// Label key: dependency name.
pub const LABEL_DEPENDENCY: &str = "dependency";
/// Label key: operation name (a route template, never a raw path).
pub const LABEL_OPERATION: &str = "operation";
/// Label key: state a breaker left.
pub const LABEL_FROM: &str = "from";
/// Label key: state a breaker entered.
pub const LABEL_TO: &str = "to";
/// Label key: why something happened (a transition reason, a stop reason).
pub const LABEL_REASON: &str = "reason";
/// Label key: fallback level that produced a result.
pub const LABEL_LEVEL: &str = "level";
/// Label key: product feature (degradation matrix row).
pub const LABEL_FEATURE: &str = "feature";
/// Label key: kind of injected fault (`delay`, `abort`, `connection_error`).
pub const LABEL_FAULT: &str = "fault";
/// Label key: inbound route (a route template or gRPC method path, never a raw path).
pub const LABEL_ROUTE: &str = "route";
/// Label key: request criticality (`CRITICAL_PLUS`, `CRITICAL`, `SHEDDABLE_PLUS`,
/// `SHEDDABLE`).
pub const LABEL_CRITICALITY: &str = "criticality";
/// Label: how a call ended. `ok`; `failed` (the dependency's own failure, after any
/// retries); `timeout` (the last attempt's timeout); `injected` (a fault rule); and the
/// refusals made on this machine before any attempt reached the dependency:
/// `kill_switched`, `breaker_open`, `bulkhead_full`, `deadline_exceeded`, `throttled`
/// (client-side throttle); `refused_locally`: an attempt ended from inside by a refusal
/// made on this machine (another dependency's bulkhead or breaker, a tower `load_shed`
/// below the layer) — not a failure of this dependency.
pub const LABEL_OUTCOME: &str = "outcome";

/// Counter: calls through the enforcement stack, labelled `dependency`, `operation` and
/// `outcome`. A call answered by a fallback counts here by why the primary failed; the
/// fallback's level is counted in [`FEATURE_RESULTS`] (degraded is not success).
pub const CALLS: &str = "levee_calls_total";
/// Gauge: breaker state, 0 CLOSED, 1 OPEN, 2 HALF_OPEN, 3 FORCED_OPEN, 4 FORCED_CLOSED,
/// 5 DISABLED.
pub const BREAKER_STATE: &str = "levee_breaker_state";
/// Counter: breaker transitions, labelled `from`, `to`, `reason`.
pub const BREAKER_TRANSITIONS: &str = "levee_breaker_transitions_total";
/// Counter: calls rejected by an open (or forced-open) breaker.
pub const BREAKER_REJECTED: &str = "levee_breaker_rejected_total";
/// Counter: retries made (attempts after the first).
pub const RETRIES: &str = "levee_retries_total";
/// Counter: retries refused because the retry budget was empty.
pub const RETRY_BUDGET_EXHAUSTED: &str = "levee_retry_budget_exhausted_total";
/// Gauge: calls holding a bulkhead permit.
pub const BULKHEAD_IN_USE: &str = "levee_bulkhead_in_use";
/// Counter: calls refused by a full bulkhead (after the bounded wait).
pub const BULKHEAD_REJECTED: &str = "levee_bulkhead_rejected_total";
/// Gauge: Little's-law suggested bulkhead size (rps × latency × 2).
pub const BULKHEAD_SUGGESTED: &str = "levee_bulkhead_suggested_size";
/// Counter: endpoint ejections by outlier detection.
pub const OUTLIER_EJECTIONS: &str = "levee_outlier_ejections_total";
/// Gauge: endpoints currently ejected.
pub const OUTLIER_EJECTED: &str = "levee_outlier_ejected";
/// Counter: feature results by fallback level (`level` = FRESH, STALE, ...).
pub const FEATURE_RESULTS: &str = "levee_feature_results_total";
/// Gauge: seconds a feature has been living on a fallback (0 when fresh).
pub const FEATURE_DEGRADED_SECONDS: &str = "levee_feature_degraded_seconds";
/// Counter: faults injected, labelled `fault`.
pub const FAULTS_INJECTED: &str = "levee_faults_injected_total";

/// Gauge: the inbound concurrency limit.
pub const ADMISSION_LIMIT: &str = "levee_admission_limit";
/// Gauge: inbound requests holding an admission slot (updated on limit changes and queue
/// activity, not per request).
pub const ADMISSION_IN_FLIGHT: &str = "levee_admission_in_flight";
/// Gauge: inbound requests waiting in the admission queue.
pub const ADMISSION_QUEUE_LENGTH: &str = "levee_admission_queue_length";
/// Histogram, seconds: how long admitted requests waited in the queue.
pub const ADMISSION_QUEUE_DELAY: &str = "levee_admission_queue_delay_seconds";
/// Gauge: 1 while the admission queue is overloaded (non-empty for a CoDel interval).
pub const ADMISSION_OVERLOADED: &str = "levee_admission_overloaded";
/// Counter: inbound requests rejected, labelled `route`, `criticality` and `reason`
/// (`limit`, `queue_full`, `displaced`, `queue_timeout`, `deadline`, `operator`,
/// `read_only`, `flushed`).
pub const ADMISSION_SHED: &str = "levee_admission_shed_total";
/// Counter: in shadow mode, inbound requests that would have been rejected (same labels
/// as [`ADMISSION_SHED`]).
pub const ADMISSION_SHADOW_SHED: &str = "levee_admission_shadow_shed_total";
/// Counter: inbound requests of routes seen after the route cap, tracked as `_overflow`.
pub const ADMISSION_ROUTE_OVERFLOW: &str = "levee_admission_route_overflow_total";
/// Counter: outgoing calls refused locally by client-side adaptive throttling.
pub const CLIENT_THROTTLED: &str = "levee_client_throttled_total";

/// Identifies a (dependency, operation) in metrics and registers its handles.
///
/// Cheap to clone. Registration happens at construction of a primitive (and, for rare
/// events such as breaker transitions, once per kind of event), never per call.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Labels {
    dependency: Arc<str>,
    operation: Arc<str>,
}

impl Labels {
    /// Labels for `operation` of `dependency` (use the dependency name again, or `"*"`,
    /// for a dependency-level primitive).
    pub fn new(dependency: &str, operation: &str) -> Self {
        Self { dependency: dependency.into(), operation: operation.into() }
    }

    /// The `dependency` label's value.
    pub fn dependency(&self) -> &str {
        &self.dependency
    }

    /// The `operation` label's value (the dependency's name for the dependency as a whole).
    pub fn operation(&self) -> &str {
        &self.operation
    }

    fn base(&self) -> Vec<Label> {
        vec![
            Label::new(LABEL_DEPENDENCY, self.dependency.to_string()),
            Label::new(LABEL_OPERATION, self.operation.to_string()),
        ]
    }

    /// Registers a counter `name` with these labels plus `extra`.
    pub fn counter_with(&self, name: &'static str, extra: &[(&'static str, &'static str)]) -> Counter {
        let mut labels = self.base();
        labels.extend(extra.iter().map(|(k, v)| Label::new(*k, *v)));
        metrics::counter!(name, labels)
    }

    /// Registers a counter `name` with these labels.
    pub fn counter(&self, name: &'static str) -> Counter {
        self.counter_with(name, &[])
    }

    /// Registers a gauge `name` with these labels.
    pub fn gauge(&self, name: &'static str) -> Gauge {
        metrics::gauge!(name, self.base())
    }
}

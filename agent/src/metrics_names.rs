//! Names of every metric the agent emits (prefix `levee_`): its own configuration and sync
//! stream, and its enforcement primitives with their label keys; and [`Labels`], which
//! registers pre-bound handles once per (dependency, operation) so no call ever looks a
//! metric up by name.
//!
//! Everything goes through the `metrics` facade: install any recorder (the examples use
//! the Prometheus exporter), before or after the agent is built — handles are bound to the
//! recorder when one is there ([`late`], CB-9); with none installed they do nothing.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};

use metrics::{Counter, Gauge, Label};

// The agent's own series: the configuration it applies and its sync stream. Each carries
// the labels `environment` and `service`.

/// Gauge: revision of the applied configuration (0 = compiled-in defaults).
pub const CONFIG_REVISION: &str = "levee_config_revision";
/// Gauge, seconds: time since the applied configuration was last confirmed by the server
/// (applied from a live snapshot, or named as current by a heartbeat). While it never was
/// (compiled-in defaults), the time since the agent started.
pub const CONFIG_AGE_SECONDS: &str = "levee_config_age_seconds";
/// Gauge with a `source` label (`live`, `cache`, `default`): 1 for the current source, 0
/// for the others.
pub const CONFIG_SOURCE: &str = "levee_config_source";
/// Gauge: 1 while a sync stream is established, else 0.
pub const SYNC_CONNECTED: &str = "levee_sync_connected";
/// Counter with a `reason` label: cache files that could not be used or written.
/// Reasons: `io`, `malformed`, `schema`, `mismatch`, `hash`, `invalid`, `write`.
pub const CACHE_ERRORS_TOTAL: &str = "levee_cache_errors_total";
/// Counter: snapshots received from the server and rejected (NACKed).
pub const SNAPSHOTS_REJECTED_TOTAL: &str = "levee_snapshots_rejected_total";
/// Counter with a `kind` label (`dependency`, `feature`): handles asked for past the cap of
/// names an agent tracks (`MAX_TRACKED_DEPENDENCIES`, `MAX_TRACKED_FEATURES`) whose name
/// the policy does not configure; each shares the `_overflow` entry of its kind.
pub const TRACKING_OVERFLOW_TOTAL: &str = "levee_tracking_overflow_total";

// The enforcement primitives' series, labelled per dependency and operation.

/// Label key: dependency name.
pub const LABEL_DEPENDENCY: &str = "dependency";
/// Label key: operation name (a route template, never a raw path). On breaker, bulkhead,
/// retry and throttle series it names the scope of the guard: an operation with settings
/// of its own, or [`ALL_OPERATIONS`] for the dependency-wide guard every other operation
/// shares; on [`CALLS`] it is always the operation the call named.
pub const LABEL_OPERATION: &str = "operation";
/// The `operation` label of a dependency-wide guard (breaker, bulkhead, retry budget):
/// every operation of the dependency without settings of its own.
pub const ALL_OPERATIONS: &str = "*";
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
/// Gauge: calls holding a bulkhead permit, sampled on the agent's metrics tick
/// (`SyncClientSettings::metrics_interval`).
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
/// Gauge: 1 while the admission queue is overloaded (CoDel: non-empty for an interval, or a
/// waiter dropped within the last interval).
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

/// Set once a recorder has been seen (a recorder, once installed, stays): until then a
/// handle that is not bound yet costs one load to stay unbound.
static RECORDER: AtomicBool = AtomicBool::new(false);

/// Whether a metrics recorder is installed for this thread (global, or local to it).
///
/// The `metrics` facade answers with its no-op recorder, a zero-sized type, until one is;
/// every real recorder holds state. Asked when a primitive is built, on the agent's
/// metrics tick, and by a handle not bound yet once some recorder was seen.
pub fn recorder_installed() -> bool {
    let installed = metrics::with_recorder(|r| std::mem::size_of_val(r) != 0);
    if installed {
        RECORDER.store(true, Ordering::Relaxed);
    }
    installed
}

/// The handle in `cell`, registered with `register` the first time it is needed once a
/// recorder is installed; `None` before (the use is dropped, as a no-op handle would).
///
/// A handle registered while no recorder is installed is a no-op for good: binding late
/// is what lets a recorder installed after `Agent::build` receive every series (CB-9).
/// A bound handle costs one atomic load more than a plain one.
#[inline]
pub(crate) fn late<H>(cell: &OnceLock<H>, register: impl FnOnce() -> H) -> Option<&H> {
    match cell.get() {
        Some(h) => Some(h),
        None => bind(cell, register),
    }
}

#[cold]
fn bind<H>(cell: &OnceLock<H>, register: impl FnOnce() -> H) -> Option<&H> {
    (RECORDER.load(Ordering::Relaxed) && recorder_installed()).then(|| cell.get_or_init(register))
}

/// A series `name` with `labels` (and one more label, if any), bound to the recorder late
/// (see [`late`]): [`LateCounter`], [`LateGauge`].
#[derive(Debug)]
pub(crate) struct Late<H> {
    key: Option<(Labels, &'static str, Option<ExtraLabel>)>,
    cell: OnceLock<H>,
}

/// One more label of a series: key and value.
pub(crate) type ExtraLabel = (&'static str, &'static str);

/// A counter bound to the recorder late.
pub(crate) type LateCounter = Late<Counter>;
/// A gauge bound to the recorder late.
pub(crate) type LateGauge = Late<Gauge>;

/// How a handle of one kind is registered.
pub(crate) trait Register: Sized {
    fn register(labels: &Labels, name: &'static str, extra: Option<ExtraLabel>) -> Self;
}

impl Register for Counter {
    fn register(labels: &Labels, name: &'static str, extra: Option<ExtraLabel>) -> Self {
        labels.counter_with(name, extra.as_slice())
    }
}

impl Register for Gauge {
    fn register(labels: &Labels, name: &'static str, extra: Option<ExtraLabel>) -> Self {
        let mut l = labels.base();
        l.extend(extra.map(|(k, v)| Label::new(k, v)));
        metrics::gauge!(name, l)
    }
}

impl<H: Register> Late<H> {
    /// Registered now when a recorder is installed, else once one is.
    pub(crate) fn new(labels: &Labels, name: &'static str) -> Self {
        Self::with(labels, name, None)
    }

    /// As [`new`](Self::new), with one more label.
    pub(crate) fn with(
        labels: &Labels,
        name: &'static str,
        extra: Option<(&'static str, &'static str)>,
    ) -> Self {
        let h = Self { key: Some((labels.clone(), name, extra)), cell: OnceLock::new() };
        if recorder_installed() {
            h.publish();
        }
        h
    }

    /// A handle that records nothing (a primitive built without metrics).
    pub(crate) fn noop() -> Self {
        Self { key: None, cell: OnceLock::new() }
    }

    /// `handle`, as it is.
    pub(crate) fn bound(handle: H) -> Self {
        Self { key: None, cell: OnceLock::from(handle) }
    }

    #[inline]
    pub(crate) fn get(&self) -> Option<&H> {
        match (self.cell.get(), &self.key) {
            (Some(h), _) => Some(h),
            (None, Some((labels, name, extra))) => late(&self.cell, || H::register(labels, name, *extra)),
            (None, None) => None,
        }
    }

    /// Registers the series if a recorder is installed and it is not yet.
    pub(crate) fn publish(&self) {
        self.get();
    }
}

impl Late<Counter> {
    #[inline]
    pub(crate) fn increment(&self, n: u64) {
        if let Some(c) = self.get() {
            c.increment(n);
        }
    }
}

impl Late<Gauge> {
    #[inline]
    pub(crate) fn set(&self, v: f64) {
        if let Some(g) = self.get() {
            g.set(v);
        }
    }
}

/// Identifies a (dependency, operation) in metrics and registers its handles.
///
/// Cheap to clone. Registration happens once per handle — when the primitive is built if a
/// recorder is installed, else at its first use after one is ([`late`]) — never per call.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Labels {
    dependency: Arc<str>,
    operation: Arc<str>,
}

impl Labels {
    /// Labels for `operation` of `dependency` (see [`Labels::dependency_wide`] for a
    /// dependency-level primitive).
    pub fn new(dependency: &str, operation: &str) -> Self {
        Self { dependency: dependency.into(), operation: operation.into() }
    }

    /// Labels of a dependency-wide primitive: `operation` = [`ALL_OPERATIONS`].
    pub fn dependency_wide(dependency: &str) -> Self {
        Self::new(dependency, ALL_OPERATIONS)
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

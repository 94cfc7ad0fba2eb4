//! Names of the metrics the agent exports through the [`metrics`] facade.
//!
//! Every series carries the labels `environment` and `service`. Install any `metrics`
//! recorder (the examples use the Prometheus exporter) to collect them.

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

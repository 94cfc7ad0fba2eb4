//! The serde types of a service's configuration.
//!
//! Every struct rejects unknown fields and fills absent ones from
//! [`defaults`](super::defaults). Durations are strings with units (`"300ms"`, `"15s"`,
//! `"5m"`), ratios are numbers in `0..=1`, percentages are numbers in `0..=100`, and
//! expiries are RFC 3339 timestamps. [`ServiceConfig::validate`] checks every range.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::defaults as d;
use super::timestamp::Timestamp;

macro_rules! duration_default {
    ($($name:ident => $value:expr),* $(,)?) => {
        $(const fn $name() -> Duration { $value })*
    };
}

duration_default! {
    default_deadline => d::DEFAULT_DEADLINE,
    max_deadline => d::MAX_DEADLINE,
    reserve => d::RESERVE,
    non_critical_cap => d::NON_CRITICAL_CAP,
    attempt_timeout => d::ATTEMPT_TIMEOUT,
    fallback_timeout => d::FALLBACK_TIMEOUT,
    stale_max_age => d::STALE_MAX_AGE,
    retry_base => d::RETRY_BASE,
    retry_cap => d::RETRY_CAP,
    wait_in_open => d::BREAKER_WAIT_IN_OPEN,
    max_wait_in_open => d::BREAKER_MAX_WAIT_IN_OPEN,
    bulkhead_max_wait => d::BULKHEAD_MAX_WAIT,
    outlier_interval => d::OUTLIER_INTERVAL,
    outlier_base_ejection => d::OUTLIER_BASE_EJECTION_TIME,
    limit_timeout => d::LIMIT_TIMEOUT,
    codel_target => d::CODEL_TARGET,
    codel_interval => d::CODEL_INTERVAL,
    alert_after => d::ALERT_AFTER,
}

const fn yes() -> bool {
    true
}

/// Everything an agent receives for one (environment, service): the body of a snapshot.
///
/// The server assembles it from the stored policy, flags, fault rules and breaker
/// overrides; the agent validates it with [`ServiceConfig::validate`] before applying it.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ServiceConfig {
    /// Deadlines, dependencies, inbound admission and the degradation matrix.
    pub policy: Policy,
    /// Flags (kill switches and tunables) by key.
    pub flags: BTreeMap<String, Flag>,
    /// Fault-injection rules for game days; each expires.
    pub faults: Vec<FaultRule>,
    /// Operator overrides of circuit breakers.
    pub breaker_overrides: Vec<BreakerOverride>,
    /// Whether the environment permits fault injection; faults are ignored otherwise.
    pub faults_allowed: bool,
}

/// The resilience policy of one service: what `PUT .../policy` takes.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Policy {
    /// Inbound budget when the caller sends none (e.g. `"1s"`).
    #[serde(with = "humantime_serde", default = "default_deadline")]
    #[cfg_attr(feature = "openapi", schema(value_type = String, example = "800ms"))]
    pub default_deadline: Duration,
    /// Cap on any inbound budget, whatever the caller sends.
    #[serde(with = "humantime_serde", default = "max_deadline")]
    #[cfg_attr(feature = "openapi", schema(value_type = String, example = "5s"))]
    pub max_deadline: Duration,
    /// Time kept back from outgoing calls to build a degraded answer.
    #[serde(with = "humantime_serde", default = "reserve")]
    #[cfg_attr(feature = "openapi", schema(value_type = String, example = "50ms"))]
    pub reserve: Duration,
    /// Most any non-critical dependency may take per attempt.
    #[serde(with = "humantime_serde", default = "non_critical_cap")]
    #[cfg_attr(feature = "openapi", schema(value_type = String, example = "80ms"))]
    pub non_critical_cap: Duration,
    /// Outgoing dependencies by name.
    pub dependencies: BTreeMap<String, Dependency>,
    /// Inbound admission: concurrency limit, queue, criticality, shedding.
    pub inbound: Inbound,
    /// Product features, what they depend on and what users get when that fails.
    pub degradation_matrix: Vec<MatrixRow>,
    /// Keys of bool flags that only the service's compiled-in defaults define (a handle
    /// declared in code, `agent.flag_bool(key, default)`, or the defaults' `flags`), which
    /// an `enabled_flag` may therefore name although the server stores no such flag.
    /// Every other `enabled_flag` must name a bool flag of the service: a typo is refused,
    /// never a kill switch that silently does nothing (OPS-1). Absent = none.
    #[serde(default, skip_serializing_if = "BTreeSet::is_empty")]
    pub compiled_in_flags: BTreeSet<String>,
}

impl Policy {
    /// Every kill switch the policy names: the path of the `enabled_flag` field (relative
    /// to the policy, e.g. `dependencies.pricing.enabled_flag` or
    /// `degradation_matrix[0].enabled_flag`), what it switches (`dependency pricing`,
    /// `feature Checkout`) and the flag key, dependencies first.
    pub fn flag_references(&self) -> Vec<FlagReference<'_>> {
        let deps = self.dependencies.iter().filter_map(|(name, d)| {
            Some(FlagReference {
                path: format!("dependencies.{name}.enabled_flag"),
                switches: format!("dependency {name}"),
                key: d.enabled_flag.as_deref()?,
            })
        });
        let rows = self.degradation_matrix.iter().enumerate().filter_map(|(i, r)| {
            Some(FlagReference {
                path: format!("degradation_matrix[{i}].enabled_flag"),
                switches: format!("feature {}", r.feature),
                key: r.enabled_flag.as_deref()?,
            })
        });
        deps.chain(rows).collect()
    }
}

/// One `enabled_flag` of a policy (see [`Policy::flag_references`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FlagReference<'a> {
    /// Path of the `enabled_flag` field, relative to the policy.
    pub path: String,
    /// What the flag switches, in words: `dependency <name>` or `feature <name>`.
    pub switches: String,
    /// The flag key named.
    pub key: &'a str,
}

impl Default for Policy {
    fn default() -> Self {
        Self {
            default_deadline: d::DEFAULT_DEADLINE,
            max_deadline: d::MAX_DEADLINE,
            reserve: d::RESERVE,
            non_critical_cap: d::NON_CRITICAL_CAP,
            dependencies: BTreeMap::new(),
            inbound: Inbound::default(),
            degradation_matrix: Vec::new(),
            compiled_in_flags: BTreeSet::new(),
        }
    }
}

/// Whether the service can work without a dependency.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub enum DependencyCriticality {
    /// The service cannot answer without it; it may use the whole remaining budget and
    /// counts for readiness.
    #[default]
    Critical,
    /// The service degrades without it; its attempts are capped by `non_critical_cap`.
    NonCritical,
}

/// One outgoing dependency.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Dependency {
    /// Critical or non-critical.
    pub criticality: DependencyCriticality,
    /// Key of a bool flag; while that flag is `false` the dependency is switched off
    /// (calls are not made and go straight to the fallback). `None` = no kill switch.
    pub enabled_flag: Option<String>,
    /// Time limit of one attempt; finite.
    #[serde(with = "humantime_serde", default = "attempt_timeout")]
    #[cfg_attr(feature = "openapi", schema(value_type = String, example = "300ms"))]
    pub attempt_timeout: Duration,
    /// Retry policy.
    pub retry: Retry,
    /// Circuit breaker policy.
    pub circuit_breaker: CircuitBreaker,
    /// Bulkhead (bounded concurrency) policy.
    pub bulkhead: Bulkhead,
    /// What callers get when the dependency fails or is switched off.
    pub fallback: FallbackLevel,
    /// Oldest value the STALE level may serve.
    #[serde(with = "humantime_serde", default = "stale_max_age")]
    #[cfg_attr(feature = "openapi", schema(value_type = String, example = "10m"))]
    pub stale_max_age: Duration,
    /// Time limit of the fallback itself.
    #[serde(with = "humantime_serde", default = "fallback_timeout")]
    #[cfg_attr(feature = "openapi", schema(value_type = String, example = "50ms"))]
    pub fallback_timeout: Duration,
    /// Per-endpoint outlier detection (Envoy semantics); off when absent.
    pub outlier_detection: Option<OutlierDetection>,
    /// Per-operation overrides, keyed by operation name (a route template, never a raw path).
    pub operations: BTreeMap<String, Operation>,
}

impl Default for Dependency {
    fn default() -> Self {
        Self {
            criticality: DependencyCriticality::Critical,
            enabled_flag: None,
            attempt_timeout: d::ATTEMPT_TIMEOUT,
            retry: Retry::default(),
            circuit_breaker: CircuitBreaker::default(),
            bulkhead: Bulkhead::default(),
            fallback: FallbackLevel::FeatureError,
            stale_max_age: d::STALE_MAX_AGE,
            fallback_timeout: d::FALLBACK_TIMEOUT,
            outlier_detection: None,
            operations: BTreeMap::new(),
        }
    }
}

/// Overrides for one operation of a dependency; absent fields inherit the dependency's.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Operation {
    /// Whether the operation may be retried; `None` = decided by the method (GET, HEAD,
    /// OPTIONS, PUT, DELETE are idempotent; POST only with an idempotency key).
    pub idempotent: Option<bool>,
    /// Time limit of one attempt.
    #[serde(with = "humantime_serde::option", default)]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<String>, example = "200ms"))]
    pub attempt_timeout: Option<Duration>,
    /// Retry policy of this operation.
    pub retry: Option<Retry>,
    /// Circuit breaker of this operation (its own state).
    pub circuit_breaker: Option<CircuitBreaker>,
    /// Bulkhead of this operation (its own permits).
    pub bulkhead: Option<Bulkhead>,
}

/// Retry with exponential backoff and full jitter, limited by a retry budget.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Retry {
    /// Attempts in total including the first; 1 = no retry. Allowed 1..=10.
    pub max_attempts: u32,
    /// Base delay: attempt n waits uniform(0, min(cap, base × 2^n)).
    #[serde(with = "humantime_serde", default = "retry_base")]
    #[cfg_attr(feature = "openapi", schema(value_type = String, example = "50ms"))]
    pub base: Duration,
    /// Largest delay.
    #[serde(with = "humantime_serde", default = "retry_cap")]
    #[cfg_attr(feature = "openapi", schema(value_type = String, example = "2s"))]
    pub cap: Duration,
    /// Token bucket bounding retries to a share of successful traffic.
    pub budget: RetryBudget,
}

impl Default for Retry {
    fn default() -> Self {
        Self {
            max_attempts: d::RETRY_MAX_ATTEMPTS,
            base: d::RETRY_BASE,
            cap: d::RETRY_CAP,
            budget: RetryBudget::default(),
        }
    }
}

/// Retry budget: a token bucket per dependency (compare gRPC retry throttling, Finagle).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct RetryBudget {
    /// Tokens each success deposits; a retry costs 1. Ratio 0..=1.
    pub ratio: f64,
    /// Most tokens the bucket holds. Allowed 1..=10000.
    pub capacity: f64,
    /// Retries per second allowed even with an empty bucket. Allowed 0..=1000.
    pub min_retries_per_sec: f64,
}

impl Default for RetryBudget {
    fn default() -> Self {
        Self {
            ratio: d::RETRY_BUDGET_RATIO,
            capacity: d::RETRY_BUDGET_CAPACITY,
            min_retries_per_sec: d::RETRY_BUDGET_MIN_PER_SEC,
        }
    }
}

/// Sliding window of a circuit breaker.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub enum Window {
    /// The last `size` calls. Allowed 1..=10000.
    Count {
        /// Calls in the window.
        size: u32,
    },
    /// The calls of the last `seconds` seconds, in one-second buckets. Allowed 1..=3600.
    Time {
        /// Seconds in the window.
        seconds: u32,
    },
}

impl Default for Window {
    fn default() -> Self {
        Window::Count { size: d::BREAKER_WINDOW_CALLS }
    }
}

/// Circuit breaker (resilience4j semantics and names).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct CircuitBreaker {
    /// `false` turns the breaker off for this dependency.
    #[serde(default = "yes")]
    pub enabled: bool,
    /// Count- or time-based sliding window.
    pub window: Window,
    /// Calls the window must hold before the breaker may trip. Allowed 1..=10000.
    pub minimum_calls: u32,
    /// Failure rate at or above which the breaker opens. Ratio 0..=1 (exclusive of 0).
    pub failure_rate_threshold: f64,
    /// A call lasting at least this long is slow; `None` = slow-call detection off.
    #[serde(with = "humantime_serde::option", default)]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<String>, example = "250ms"))]
    pub slow_call_duration: Option<Duration>,
    /// Slow-call rate at or above which the breaker opens. Ratio 0..=1.
    pub slow_call_rate_threshold: f64,
    /// First open period; doubles on each consecutive open.
    #[serde(with = "humantime_serde", default = "wait_in_open")]
    #[cfg_attr(feature = "openapi", schema(value_type = String, example = "15s"))]
    pub wait_in_open: Duration,
    /// Cap of the open period.
    #[serde(with = "humantime_serde", default = "max_wait_in_open")]
    #[cfg_attr(feature = "openapi", schema(value_type = String, example = "5m"))]
    pub max_wait_in_open: Duration,
    /// Probe calls let through in HALF_OPEN. Allowed 1..=100.
    pub half_open_probes: u32,
    /// How long a HALF_OPEN probe may stay out without reporting before it counts as failed
    /// and the breaker reopens; `None` = twice the attempt timeout. Time with no probe out
    /// never counts: a rarely called dependency still closes its breaker.
    #[serde(with = "humantime_serde::option", default)]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<String>, example = "2s"))]
    pub max_wait_in_half_open: Option<Duration>,
}

impl Default for CircuitBreaker {
    fn default() -> Self {
        Self {
            enabled: true,
            window: Window::default(),
            minimum_calls: d::BREAKER_MINIMUM_CALLS,
            failure_rate_threshold: d::BREAKER_FAILURE_RATE_THRESHOLD,
            slow_call_duration: None,
            slow_call_rate_threshold: d::BREAKER_SLOW_CALL_RATE_THRESHOLD,
            wait_in_open: d::BREAKER_WAIT_IN_OPEN,
            max_wait_in_open: d::BREAKER_MAX_WAIT_IN_OPEN,
            half_open_probes: d::BREAKER_HALF_OPEN_PROBES,
            max_wait_in_half_open: None,
        }
    }
}

/// Bulkhead: bounded concurrency with a bounded wait.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Bulkhead {
    /// Concurrent calls admitted. Allowed 1..=100000.
    pub max_concurrent: u32,
    /// Longest wait for a slot (`0ms` = fail fast); also bounded by the deadline.
    #[serde(with = "humantime_serde", default = "bulkhead_max_wait")]
    #[cfg_attr(feature = "openapi", schema(value_type = String, example = "10ms"))]
    pub max_wait: Duration,
}

impl Default for Bulkhead {
    fn default() -> Self {
        Self { max_concurrent: d::BULKHEAD_MAX_CONCURRENT, max_wait: d::BULKHEAD_MAX_WAIT }
    }
}

/// Per-endpoint outlier detection (Envoy semantics).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct OutlierDetection {
    /// Consecutive errors that eject an endpoint. Allowed 1..=1000.
    pub consecutive_errors: u32,
    /// Analysis interval.
    #[serde(with = "humantime_serde", default = "outlier_interval")]
    #[cfg_attr(feature = "openapi", schema(value_type = String, example = "10s"))]
    pub interval: Duration,
    /// Ejection time = base × number of times the endpoint was ejected.
    #[serde(with = "humantime_serde", default = "outlier_base_ejection")]
    #[cfg_attr(feature = "openapi", schema(value_type = String, example = "30s"))]
    pub base_ejection_time: Duration,
    /// Most of the pool ever ejected at once, in percent 0..=100.
    pub max_ejection_percent: u32,
}

impl Default for OutlierDetection {
    fn default() -> Self {
        Self {
            consecutive_errors: d::OUTLIER_CONSECUTIVE_ERRORS,
            interval: d::OUTLIER_INTERVAL,
            base_ejection_time: d::OUTLIER_BASE_EJECTION_TIME,
            max_ejection_percent: d::OUTLIER_MAX_EJECTION_PERCENT,
        }
    }
}

/// Fallback levels, best to worst.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub enum FallbackLevel {
    /// The normal, fresh answer.
    Fresh,
    /// A cached answer served on error (RFC 5861 stale-if-error), no older than `stale_max_age`.
    Stale,
    /// A static, non-personal answer supplied by the service.
    Generic,
    /// An explicit "unavailable" marker; never a fake empty value.
    EmptyMarked,
    /// A clear error for this feature only.
    #[default]
    FeatureError,
}

impl FallbackLevel {
    /// The level as an upper-case label (`"STALE"`), used in metrics and status reports.
    pub const fn as_str(self) -> &'static str {
        match self {
            FallbackLevel::Fresh => "FRESH",
            FallbackLevel::Stale => "STALE",
            FallbackLevel::Generic => "GENERIC",
            FallbackLevel::EmptyMarked => "EMPTY_MARKED",
            FallbackLevel::FeatureError => "FEATURE_ERROR",
        }
    }
}

/// Request criticality (names from Google's SRE book), highest first.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub enum Criticality {
    /// Most important; shed last.
    CriticalPlus,
    /// Default for user-facing requests.
    #[default]
    Critical,
    /// Can be shed under load; a retry later is acceptable.
    SheddablePlus,
    /// Shed first (batch, prefetch).
    Sheddable,
}

/// Algorithm of the inbound concurrency limit (Netflix concurrency-limits).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub enum LimitAlgorithm {
    /// A fixed limit (`initial_limit`).
    Fixed,
    /// Additive increase, multiplicative decrease.
    #[default]
    Aimd,
    /// Gradient of long vs short RTT.
    Gradient2,
    /// TCP Vegas-style queue estimate.
    Vegas,
}

/// Inbound concurrency limit; parameter names follow Netflix concurrency-limits.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Limit {
    /// Which algorithm adjusts the limit.
    pub algorithm: LimitAlgorithm,
    /// Starting limit (the limit itself for `fixed`). Allowed 1..=100000.
    pub initial_limit: u32,
    /// Lower bound. Allowed 1..=100000.
    pub min_limit: u32,
    /// Upper bound. Allowed 1..=100000, at least `min_limit`.
    pub max_limit: u32,
    /// AIMD decrease factor on a drop. Ratio 0.5..1 (exclusive of 1).
    pub backoff_ratio: f64,
    /// AIMD: a round trip longer than this counts as a drop.
    #[serde(with = "humantime_serde", default = "limit_timeout")]
    #[cfg_attr(feature = "openapi", schema(value_type = String, example = "5s"))]
    pub timeout: Duration,
    /// Gradient2/Vegas smoothing. Ratio 0..=1 (exclusive of 0).
    pub smoothing: f64,
    /// Gradient2 long window, in samples. Allowed 1..=100000.
    pub long_window: u32,
    /// Gradient2 RTT tolerance. Allowed 1..=10.
    pub rtt_tolerance: f64,
    /// Gradient2 queue size headroom. Allowed 0..=10000.
    pub queue_size: u32,
}

impl Default for Limit {
    fn default() -> Self {
        Self {
            algorithm: LimitAlgorithm::Aimd,
            initial_limit: d::LIMIT_INITIAL,
            min_limit: d::LIMIT_MIN,
            max_limit: d::LIMIT_MAX,
            backoff_ratio: d::LIMIT_BACKOFF_RATIO,
            timeout: d::LIMIT_TIMEOUT,
            smoothing: d::LIMIT_SMOOTHING,
            long_window: d::LIMIT_LONG_WINDOW,
            rtt_tolerance: d::LIMIT_RTT_TOLERANCE,
            queue_size: d::LIMIT_QUEUE_SIZE,
        }
    }
}

/// Bounded queue in front of the limit, managed CoDel-style with adaptive LIFO.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Queue {
    /// Most requests waiting. Allowed 0..=100000.
    pub max_len: u32,
    /// CoDel target delay: the short queue timeout while overloaded.
    #[serde(with = "humantime_serde", default = "codel_target")]
    #[cfg_attr(feature = "openapi", schema(value_type = String, example = "5ms"))]
    pub codel_target: Duration,
    /// CoDel interval: the normal queue timeout, and how long the queue must stay
    /// non-empty to count as overloaded.
    #[serde(with = "humantime_serde", default = "codel_interval")]
    #[cfg_attr(feature = "openapi", schema(value_type = String, example = "100ms"))]
    pub codel_interval: Duration,
    /// Serve the newest waiter first while overloaded.
    #[serde(default = "yes")]
    pub adaptive_lifo: bool,
}

impl Default for Queue {
    fn default() -> Self {
        Self {
            max_len: d::QUEUE_MAX_LEN,
            codel_target: d::CODEL_TARGET,
            codel_interval: d::CODEL_INTERVAL,
            adaptive_lifo: true,
        }
    }
}

/// Admission settings of one inbound route (named by its template, e.g. `"POST /orders"`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Route {
    /// Criticality when the request carries none.
    pub criticality: Criticality,
    /// Inbound budget of this route when the caller sends none.
    #[serde(with = "humantime_serde::option", default)]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<String>, example = "500ms"))]
    pub deadline: Option<Duration>,
}

/// Inbound admission.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Inbound {
    /// Concurrency limit.
    pub limit: Limit,
    /// Queue in front of the limit.
    pub queue: Queue,
    /// Per-route settings by route template.
    pub routes: BTreeMap<String, Route>,
    /// Criticality of requests that carry none and match no route.
    pub default_criticality: Criticality,
    /// Operator lever: percentage 0..=100 of SHEDDABLE and SHEDDABLE_PLUS traffic to shed.
    pub shed_sheddable_percent: f64,
    /// Operator lever: no outgoing retries at all while set.
    pub retries_paused: bool,
}

/// One row of the degradation matrix.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct MatrixRow {
    /// Product feature, in words users would recognise.
    pub feature: String,
    /// Dependencies the feature needs (names from `dependencies`).
    pub dependencies: Vec<String>,
    /// What users get when a dependency fails.
    pub on_failure: FallbackLevel,
    /// Business owner of the decision.
    #[serde(default)]
    pub owner: String,
    /// Where the decision is recorded (ADR, ticket).
    #[serde(default)]
    pub decision: String,
    /// Alert when the feature has lived on a fallback longer than this.
    #[serde(with = "humantime_serde", default = "alert_after")]
    #[cfg_attr(feature = "openapi", schema(value_type = String, example = "30m"))]
    pub alert_after: Duration,
    /// Key of a bool flag; while `false` the feature is forced onto its fallback.
    #[serde(default)]
    pub enabled_flag: Option<String>,
}

/// Type of a flag's value.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub enum FlagType {
    /// `true` / `false`.
    Bool,
    /// A signed 64-bit integer.
    Int,
    /// A finite 64-bit float.
    Float,
    /// A UTF-8 string.
    String,
    /// Any JSON value.
    Json,
}

impl FlagType {
    /// Lower-case name, as in JSON.
    pub const fn as_str(self) -> &'static str {
        match self {
            FlagType::Bool => "bool",
            FlagType::Int => "int",
            FlagType::Float => "float",
            FlagType::String => "string",
            FlagType::Json => "json",
        }
    }

    /// Whether `value` is a value of this type.
    pub fn accepts(self, value: &serde_json::Value) -> bool {
        match self {
            FlagType::Bool => value.is_boolean(),
            FlagType::Int => value.is_i64() || value.is_u64() && value.as_i64().is_some(),
            FlagType::Float => value.as_f64().is_some_and(f64::is_finite),
            FlagType::String => value.is_string(),
            FlagType::Json => true,
        }
    }
}

/// What an agent does with a flag value while it cannot reach the server.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum StalePolicy {
    /// Keep the last value for as long as needed (right for kill switches).
    #[default]
    Hold,
    /// Revert to the compiled-in default once the configuration is older than this.
    RevertAfter(#[serde(with = "humantime_serde")] Duration),
}

/// Percentage rollout of a flag's value, keyed by a caller-supplied key.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Rollout {
    /// Share of keys, in percent 0..=100, that see `value`; the rest see the default.
    pub percent: f64,
}

/// A flag: a kill switch or a tunable.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Flag {
    /// Value type.
    #[serde(rename = "type")]
    pub kind: FlagType,
    /// Current value; must match `type`.
    #[cfg_attr(feature = "openapi", schema(value_type = Object))]
    pub value: serde_json::Value,
    /// What the flag does, for the operator who flips it.
    #[serde(default)]
    pub description: String,
    /// Team or person responsible.
    #[serde(default)]
    pub owner: String,
    /// After this instant the value reverts to the service's default (server and agent side).
    #[serde(default)]
    pub expires_at: Option<Timestamp>,
    /// Behaviour while the agent cannot reach the server: `"hold"` or `{"revert_after": "1h"}`.
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(value_type = Object, example = json!("hold")))]
    pub stale: StalePolicy,
    /// Optional gradual rollout.
    #[serde(default)]
    pub rollout: Option<Rollout>,
}

/// What a fault rule does to an attempt.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub enum FaultAction {
    /// Delays the attempt (inside the attempt timeout).
    Delay {
        /// Added latency.
        #[serde(with = "humantime_serde")]
        #[cfg_attr(feature = "openapi", schema(value_type = String, example = "2s"))]
        delay: Duration,
    },
    /// Fails the attempt with this HTTP status (gRPC callers see the mapped code).
    Abort {
        /// HTTP status 400..=599.
        status: u16,
    },
    /// Fails the attempt as a connection error (retryable).
    ConnectionError,
}

/// A fault-injection rule for game days.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct FaultRule {
    /// Identifier, unique within the service.
    pub id: String,
    /// Dependency the rule applies to.
    pub dependency: String,
    /// Operation; `None` = every operation of the dependency.
    #[serde(default)]
    pub operation: Option<String>,
    /// What happens.
    pub action: FaultAction,
    /// Share of attempts affected, in percent 0..=100.
    pub percent: f64,
    /// Mandatory: the rule stops by itself after this instant, even offline.
    pub expires_at: Timestamp,
}

/// State forced on a breaker by an operator.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub enum BreakerOverrideState {
    /// Every call is rejected as if OPEN.
    ForcedOpen,
    /// Every call passes; outcomes are still recorded.
    ForcedClosed,
    /// Breaker off: calls pass and nothing is recorded.
    Disabled,
}

/// An operator override of one breaker.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct BreakerOverride {
    /// Dependency whose breaker is overridden.
    pub dependency: String,
    /// Operation; `None` = the dependency-level breaker.
    #[serde(default)]
    pub operation: Option<String>,
    /// Forced state.
    pub state: BreakerOverrideState,
    /// The override ends by itself after this instant (server and agent side).
    #[serde(default)]
    pub expires_at: Option<Timestamp>,
    /// Why it was set.
    #[serde(default)]
    pub reason: String,
}

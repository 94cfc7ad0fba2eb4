//! The serde types of a service's configuration.
//!
//! Every struct rejects unknown fields and fills absent ones from
//! [`defaults`](super::defaults) (one named constant each). Durations are strings with
//! units (`"300ms"`, `"15s"`, `"5m"`), ratios are numbers in `0..=1`, percentages are
//! numbers in `0..=100`, and expiries are RFC 3339 timestamps.
//!
//! The allowed range of each field is stated once, by validation
//! ([`ServiceConfig::validate`], `validate.rs`), whose error names the field's path, the
//! value and the range; the field docs here do not repeat it.

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
    throttle_window => d::THROTTLE_WINDOW,
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
    /// Operator levers set for a limited time (by an emergency profile), replacing the
    /// policy's `inbound` levers until their expiry; absent = the policy's values.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub levers: Option<LeverOverride>,
}

/// The resilience policy of one service: what `PUT .../policy` takes.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Policy {
    /// Inbound budget when the caller sends none (e.g. `"1s"`).
    #[serde(with = "super::duration", default = "default_deadline")]
    #[cfg_attr(feature = "openapi", schema(value_type = crate::policy::duration::Text, example = "800ms"))]
    pub default_deadline: Duration,
    /// Cap on any inbound budget, whatever the caller sends.
    #[serde(with = "super::duration", default = "max_deadline")]
    #[cfg_attr(feature = "openapi", schema(value_type = crate::policy::duration::Text, example = "5s"))]
    pub max_deadline: Duration,
    /// Time kept back from outgoing calls to build a degraded answer.
    #[serde(with = "super::duration", default = "reserve")]
    #[cfg_attr(feature = "openapi", schema(value_type = crate::policy::duration::Text, example = "50ms"))]
    pub reserve: Duration,
    /// Most any non-critical dependency may take per attempt.
    #[serde(with = "super::duration", default = "non_critical_cap")]
    #[cfg_attr(feature = "openapi", schema(value_type = crate::policy::duration::Text, example = "80ms"))]
    pub non_critical_cap: Duration,
    /// Outgoing dependencies by name.
    pub dependencies: BTreeMap<String, DependencyPolicy>,
    /// Inbound admission: concurrency limit, queue, criticality, shedding.
    pub inbound: Inbound,
    /// Product features, what they depend on and what users get when that fails.
    pub degradation_matrix: Vec<MatrixRow>,
    /// Client-side adaptive throttling of outgoing calls (SRE book, "Handling Overload").
    pub client_throttle: ClientThrottle,
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
            client_throttle: ClientThrottle::default(),
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

impl DependencyCriticality {
    /// The time limit of one attempt without a request deadline: `configured`, capped by
    /// the policy's `non_critical_cap` for a non-critical dependency. The one statement of
    /// that cap, for the agent's enforcement and for what the server says over xDS.
    #[inline]
    pub fn attempt_cap(self, configured: Duration, non_critical_cap: Duration) -> Duration {
        match self {
            DependencyCriticality::NonCritical => configured.min(non_critical_cap),
            DependencyCriticality::Critical => configured,
        }
    }
}

/// The policy of one outgoing dependency (the runtime handle is
/// [`Dependency`](crate::Dependency)).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
// The API document keeps the schema name it always had.
#[cfg_attr(feature = "openapi", schema(as = Dependency))]
pub struct DependencyPolicy {
    /// Whether the service can answer without it: decides readiness and the
    /// non-critical cap on attempt timeouts.
    pub criticality: DependencyCriticality,
    /// Key of a bool flag; while that flag is `false` the dependency is switched off
    /// (calls are not made and go straight to the fallback). `None` = no kill switch.
    pub enabled_flag: Option<String>,
    /// Time limit of one attempt; finite.
    #[serde(with = "super::duration", default = "attempt_timeout")]
    #[cfg_attr(feature = "openapi", schema(value_type = crate::policy::duration::Text, example = "300ms"))]
    pub attempt_timeout: Duration,
    /// Retries of an attempt that failed; operations may override.
    pub retry: Retry,
    /// The breaker shared by the dependency's operations (an operation that overrides it
    /// gets its own).
    pub circuit_breaker: CircuitBreakerPolicy,
    /// Concurrent calls allowed, shared like the breaker.
    pub bulkhead: BulkheadPolicy,
    /// What callers get when the dependency fails or is switched off.
    pub fallback: FallbackLevel,
    /// Oldest value the STALE level may serve.
    #[serde(with = "super::duration", default = "stale_max_age")]
    #[cfg_attr(feature = "openapi", schema(value_type = crate::policy::duration::Text, example = "10m"))]
    pub stale_max_age: Duration,
    /// Time limit of the fallback itself.
    #[serde(with = "super::duration", default = "fallback_timeout")]
    #[cfg_attr(feature = "openapi", schema(value_type = crate::policy::duration::Text, example = "50ms"))]
    pub fallback_timeout: Duration,
    /// Per-endpoint outlier detection (Envoy semantics); off when absent.
    pub outlier_detection: Option<OutlierDetection>,
    /// Per-operation overrides, keyed by operation name (a route template, never a raw path).
    pub operations: BTreeMap<String, Operation>,
}

impl Default for DependencyPolicy {
    fn default() -> Self {
        Self {
            criticality: DependencyCriticality::Critical,
            enabled_flag: None,
            attempt_timeout: d::ATTEMPT_TIMEOUT,
            retry: Retry::default(),
            circuit_breaker: CircuitBreakerPolicy::default(),
            bulkhead: BulkheadPolicy::default(),
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
    /// Time limit of one attempt; `None` = the dependency's.
    #[serde(with = "super::duration::option", default)]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<crate::policy::duration::Text>, example = "200ms"))]
    pub attempt_timeout: Option<Duration>,
    /// Retries of this operation; `None` = the dependency's.
    pub retry: Option<Retry>,
    /// Circuit breaker of this operation (its own state).
    pub circuit_breaker: Option<CircuitBreakerPolicy>,
    /// Bulkhead of this operation (its own permits).
    pub bulkhead: Option<BulkheadPolicy>,
}

/// Retry with exponential backoff and full jitter, limited by a retry budget.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Retry {
    /// Attempts in total including the first; 1 = no retry.
    pub max_attempts: u32,
    /// Base delay: attempt n waits uniform(0, min(cap, base × 2^n)).
    #[serde(with = "super::duration", default = "retry_base")]
    #[cfg_attr(feature = "openapi", schema(value_type = crate::policy::duration::Text, example = "50ms"))]
    pub base: Duration,
    /// Ceiling of every backoff delay (`cap` in `base`'s formula).
    #[serde(with = "super::duration", default = "retry_cap")]
    #[cfg_attr(feature = "openapi", schema(value_type = crate::policy::duration::Text, example = "2s"))]
    pub cap: Duration,
    /// Token bucket bounding retries to a share of successful traffic.
    pub budget: RetryBudgetPolicy,
}

impl Default for Retry {
    fn default() -> Self {
        Self {
            max_attempts: d::RETRY_MAX_ATTEMPTS,
            base: d::RETRY_BASE,
            cap: d::RETRY_CAP,
            budget: RetryBudgetPolicy::default(),
        }
    }
}

/// Retry budget: a token bucket per dependency (compare gRPC retry throttling, Finagle).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
// The API document keeps the schema name it always had.
#[cfg_attr(feature = "openapi", schema(as = RetryBudget))]
pub struct RetryBudgetPolicy {
    /// Tokens each success deposits (a ratio); a retry costs 1.
    pub ratio: f64,
    /// Most tokens the bucket holds.
    pub capacity: f64,
    /// Retries per second allowed even with an empty bucket.
    pub min_retries_per_sec: f64,
}

impl Default for RetryBudgetPolicy {
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
    /// The last `size` calls.
    Count {
        /// Calls in the window.
        size: u32,
    },
    /// The calls of the last `seconds` seconds, in one-second buckets.
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
// The API document keeps the schema name it always had.
#[cfg_attr(feature = "openapi", schema(as = CircuitBreaker))]
pub struct CircuitBreakerPolicy {
    /// `false` turns the breaker off for this dependency.
    #[serde(default = "yes")]
    pub enabled: bool,
    /// The calls whose outcomes decide: the last N calls, or the last N seconds.
    pub window: Window,
    /// Calls the window must hold before the breaker may trip.
    pub minimum_calls: u32,
    /// Failure rate (a ratio) at or above which the breaker opens.
    pub failure_rate_threshold: f64,
    /// A call lasting at least this long is slow; `None` = slow-call detection off.
    #[serde(with = "super::duration::option", default)]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<crate::policy::duration::Text>, example = "250ms"))]
    pub slow_call_duration: Option<Duration>,
    /// Slow-call rate (a ratio) at or above which the breaker opens; 1 = only when every
    /// call is slow.
    pub slow_call_rate_threshold: f64,
    /// First open period; doubles on each consecutive open.
    #[serde(with = "super::duration", default = "wait_in_open")]
    #[cfg_attr(feature = "openapi", schema(value_type = crate::policy::duration::Text, example = "15s"))]
    pub wait_in_open: Duration,
    /// Longest open period, however many consecutive opens.
    #[serde(with = "super::duration", default = "max_wait_in_open")]
    #[cfg_attr(feature = "openapi", schema(value_type = crate::policy::duration::Text, example = "5m"))]
    pub max_wait_in_open: Duration,
    /// Probe calls let through in HALF_OPEN, one attempt each.
    pub half_open_probes: u32,
    /// How long a HALF_OPEN probe may stay out without reporting before it counts as failed
    /// and the breaker reopens; `None` = twice the attempt timeout. Time with no probe out
    /// never counts: a rarely called dependency still closes its breaker.
    #[serde(with = "super::duration::option", default)]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<crate::policy::duration::Text>, example = "2s"))]
    pub max_wait_in_half_open: Option<Duration>,
}

impl Default for CircuitBreakerPolicy {
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
// The API document keeps the schema name it always had.
#[cfg_attr(feature = "openapi", schema(as = Bulkhead))]
pub struct BulkheadPolicy {
    /// Concurrent calls admitted.
    pub max_concurrent: u32,
    /// Longest wait for a slot (`0ms` = fail fast); also bounded by the deadline.
    #[serde(with = "super::duration", default = "bulkhead_max_wait")]
    #[cfg_attr(feature = "openapi", schema(value_type = crate::policy::duration::Text, example = "10ms"))]
    pub max_wait: Duration,
}

impl Default for BulkheadPolicy {
    fn default() -> Self {
        Self { max_concurrent: d::BULKHEAD_MAX_CONCURRENT, max_wait: d::BULKHEAD_MAX_WAIT }
    }
}

/// Per-endpoint outlier detection (Envoy semantics).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct OutlierDetection {
    /// Consecutive errors that eject an endpoint.
    pub consecutive_errors: u32,
    /// How often ejections are re-evaluated (ejected endpoints whose time is up return).
    #[serde(with = "super::duration", default = "outlier_interval")]
    #[cfg_attr(feature = "openapi", schema(value_type = crate::policy::duration::Text, example = "10s"))]
    pub interval: Duration,
    /// Ejection time = base × number of times the endpoint was ejected.
    #[serde(with = "super::duration", default = "outlier_base_ejection")]
    #[cfg_attr(feature = "openapi", schema(value_type = crate::policy::duration::Text, example = "30s"))]
    pub base_ejection_time: Duration,
    /// Most of the pool ever ejected at once, in percent (never the whole pool).
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
    /// Every level, best to worst.
    pub const ALL: [FallbackLevel; 5] = [
        FallbackLevel::Fresh,
        FallbackLevel::Stale,
        FallbackLevel::Generic,
        FallbackLevel::EmptyMarked,
        FallbackLevel::FeatureError,
    ];

    /// Position in [`FallbackLevel::ALL`]: 0 is the best level, and a larger rank a worse
    /// one (the order `Ord` compares by).
    pub const fn rank(self) -> usize {
        self as usize
    }

    /// The level [`FallbackLevel::as_str`] spells `word`, if any (how a status report and
    /// an experiment's probe name it).
    pub fn parse(word: &str) -> Option<FallbackLevel> {
        Self::ALL.into_iter().find(|l| l.as_str() == word)
    }

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
    /// Starting limit (the limit itself for `fixed`).
    pub initial_limit: u32,
    /// The limit never goes below it (`minLimit`).
    pub min_limit: u32,
    /// The limit never goes above it (`maxLimit`).
    pub max_limit: u32,
    /// AIMD decrease factor on a drop (`backoffRatio`, a ratio).
    pub backoff_ratio: f64,
    /// AIMD: a round trip longer than this counts as a drop.
    #[serde(with = "super::duration", default = "limit_timeout")]
    #[cfg_attr(feature = "openapi", schema(value_type = crate::policy::duration::Text, example = "5s"))]
    pub timeout: Duration,
    /// Gradient2/Vegas smoothing: how much of the new estimate replaces the limit at each
    /// update (a ratio); `None` = the algorithm's own default (Gradient2 0.2, Vegas 1.0, as
    /// Netflix concurrency-limits).
    pub smoothing: Option<f64>,
    /// Gradient2 long window, in samples.
    pub long_window: u32,
    /// RTT tolerance (a factor). Gradient2: how much longer than the long-term RTT a
    /// short-term RTT may be before the limit shrinks. AIMD: how much longer than the
    /// no-load RTT a window that reached the limit may be before it counts as a drop.
    pub rtt_tolerance: f64,
    /// Gradient2 queue size headroom, in requests.
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
            smoothing: None,
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
    /// Most requests waiting; 0 = no queue.
    pub max_len: u32,
    /// CoDel target delay: the short queue timeout while overloaded.
    #[serde(with = "super::duration", default = "codel_target")]
    #[cfg_attr(feature = "openapi", schema(value_type = crate::policy::duration::Text, example = "5ms"))]
    pub codel_target: Duration,
    /// CoDel interval: the normal queue timeout, and how long the queue must stay
    /// non-empty to count as overloaded.
    #[serde(with = "super::duration", default = "codel_interval")]
    #[cfg_attr(feature = "openapi", schema(value_type = crate::policy::duration::Text, example = "100ms"))]
    pub codel_interval: Duration,
    /// Serve the newest waiter first while overloaded.
    #[serde(default = "yes")]
    pub adaptive_lifo: bool,
    /// Operator lever: raising this number (any change) makes every agent reject all the
    /// requests waiting in its queue once (reason `flushed`). Requests arriving afterwards
    /// queue normally.
    pub flush_generation: u64,
}

impl Default for Queue {
    fn default() -> Self {
        Self {
            max_len: d::QUEUE_MAX_LEN,
            codel_target: d::CODEL_TARGET,
            codel_interval: d::CODEL_INTERVAL,
            adaptive_lifo: true,
            flush_generation: 0,
        }
    }
}

/// Admission settings of one inbound route (named by its template, e.g. `"POST /orders"`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Route {
    /// Criticality when the request carries none. Absent: `inbound.default_criticality`,
    /// else the classification by the request (see [`Inbound::default_criticality`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub criticality: Option<Criticality>,
    /// Inbound budget of this route when the caller sends none.
    #[serde(with = "super::duration::option", default)]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<crate::policy::duration::Text>, example = "500ms"))]
    pub deadline: Option<Duration>,
    /// The route changes data: while the read-only flag is on, it answers 503.
    pub mutating: bool,
}

/// Whether inbound admission rejects what it decides to reject.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub enum AdmissionMode {
    /// Decisions are enforced: rejected requests get 503 / RESOURCE_EXHAUSTED.
    #[default]
    Enforce,
    /// Every decision is computed and counted ("would have shed"), nothing is rejected:
    /// for trying a limit on production traffic before enforcing it.
    Shadow,
}

/// Inbound admission: the limit, its queue, criticality per route, the mode (enforce or
/// shadow) and the operator levers.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Inbound {
    /// How many inbound requests run at once.
    pub limit: Limit,
    /// Queue in front of the limit.
    pub queue: Queue,
    /// Per-route settings by route template.
    pub routes: BTreeMap<String, Route>,
    /// Criticality of requests that carry none and whose route names none. Absent (the
    /// default): by the request, so that an overload sheds bulk traffic first without any
    /// configuration — routes of the safe methods (`GET`, `HEAD`, `OPTIONS`) are
    /// SHEDDABLE_PLUS, other methods and gRPC methods CRITICAL, requests that match no
    /// route (`_unmatched`, `_overflow`) SHEDDABLE; health probes are never shed at all.
    /// Set, every such route gets it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default_criticality: Option<Criticality>,
    /// Operator lever: percentage of SHEDDABLE and SHEDDABLE_PLUS traffic to shed.
    pub shed_sheddable_percent: f64,
    /// Operator lever: no outgoing retries at all while set.
    pub retries_paused: bool,
    /// `enforce` (default) or `shadow` (decide and count, reject nothing).
    pub mode: AdmissionMode,
    /// Highest criticality a caller may claim with the `levee-criticality` header; a higher
    /// claim is lowered to it (a route's own default is not capped).
    pub max_header_criticality: Criticality,
    /// Operator lever: key of a bool flag; while it is `true` the service is read-only and
    /// routes marked `mutating` answer 503. The service reads the same flag for its own
    /// logic. `None` = no read-only mode.
    pub read_only_flag: Option<String>,
}

impl Default for Inbound {
    fn default() -> Self {
        Self {
            limit: Limit::default(),
            queue: Queue::default(),
            routes: BTreeMap::new(),
            default_criticality: None,
            shed_sheddable_percent: 0.0,
            retries_paused: false,
            mode: AdmissionMode::default(),
            max_header_criticality: d::MAX_HEADER_CRITICALITY,
            read_only_flag: None,
        }
    }
}

impl Inbound {
    /// These settings with the levers of `levers` in force: each lever it sets replaces
    /// the policy's (`inbound_limit` becomes a `fixed` limit of that many requests, the
    /// adaptive settings kept for when it ends). Borrowed when nothing changes. Whether
    /// `levers` is still in force (its expiry) is for the caller to decide.
    pub fn with_levers(&self, levers: Option<&LeverOverride>) -> std::borrow::Cow<'_, Inbound> {
        use std::borrow::Cow;
        let Some(l) = levers else { return Cow::Borrowed(self) };
        let mut out = self.clone();
        if let Some(p) = l.shed_sheddable_percent {
            out.shed_sheddable_percent = p;
        }
        if let Some(paused) = l.retries_paused {
            out.retries_paused = paused;
        }
        if let Some(n) = l.inbound_limit {
            out.limit = Limit { algorithm: LimitAlgorithm::Fixed, initial_limit: n, ..out.limit };
        }
        Cow::Owned(out)
    }
}

/// Client-side adaptive throttling (SRE book, "Handling Overload"): a client rejects a
/// call locally with probability `max(0, (requests − k × accepts) / (requests + 1))` over
/// the last `window`, so a backend that is shedding is not hammered by rejections.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ClientThrottle {
    /// Multiplier `K`: requests may exceed accepts by this factor before any local
    /// rejection (2 = the book's default; lower is more aggressive). Allowed 1..=10.
    pub k: f64,
    /// Length of the sliding window of request and accept counts.
    #[serde(with = "super::duration", default = "throttle_window")]
    #[cfg_attr(feature = "openapi", schema(value_type = crate::policy::duration::Text, example = "2m"))]
    pub window: Duration,
}

impl Default for ClientThrottle {
    fn default() -> Self {
        Self { k: d::THROTTLE_K, window: d::THROTTLE_WINDOW }
    }
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
    /// Where the owner's runbook for this feature is (a URL or a page name): what the
    /// people on call read when it degrades, shown next to a game day's report. Left out
    /// of the snapshot when empty, so a snapshot without one is what it was before.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub runbook: String,
    /// Alert when the feature has lived on a fallback longer than this.
    #[serde(with = "super::duration", default = "alert_after")]
    #[cfg_attr(feature = "openapi", schema(value_type = crate::policy::duration::Text, example = "30m"))]
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

    /// Reads `text`, a value a person typed in a form or on a command line, as a value of
    /// this type: `true` or `false`, a whole number (64-bit), a finite number, the text
    /// itself (kept exactly, blanks included) or a JSON document. Blanks around the
    /// non-string kinds are ignored.
    ///
    /// The error says what the type takes, e.g. `is a bool flag: the value must be true or
    /// false`; the caller names the flag and quotes the text.
    pub fn parse_text(self, text: &str) -> Result<serde_json::Value, String> {
        let t = text.trim();
        match self {
            FlagType::Bool => match t {
                "true" => Ok(true.into()),
                "false" => Ok(false.into()),
                _ => Err("is a bool flag: the value must be true or false".into()),
            },
            FlagType::Int => t
                .parse::<i64>()
                .map(Into::into)
                .map_err(|_| "is an int flag: the value must be a whole number".into()),
            FlagType::Float => t
                .parse::<f64>()
                .ok()
                .and_then(serde_json::Number::from_f64)
                .map(serde_json::Value::Number)
                .ok_or_else(|| "is a float flag: the value must be a finite number".into()),
            FlagType::String => Ok(serde_json::Value::String(text.to_string())),
            FlagType::Json => {
                serde_json::from_str(t).map_err(|e| format!("is a json flag: the value must be JSON ({e})"))
            }
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
    RevertAfter(#[serde(with = "super::duration")] Duration),
}

/// `"hold"` or `{"revert_after": <Duration>}`, as serde writes [`StalePolicy`] (utoipa's
/// derive cannot name the schema of a tuple variant's field).
#[cfg(feature = "openapi")]
impl utoipa::PartialSchema for StalePolicy {
    fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
        use utoipa::ToSchema;
        use utoipa::openapi::schema::{AdditionalProperties, ObjectBuilder, OneOfBuilder, Type};
        use utoipa::openapi::{Ref, RefOr};
        let duration = super::duration::Text::name();
        let hold = ObjectBuilder::new().schema_type(Type::String).enum_values(Some(["hold"]));
        let revert = ObjectBuilder::new()
            .schema_type(Type::Object)
            .property("revert_after", RefOr::Ref(Ref::from_schema_name(duration)))
            .required("revert_after")
            .additional_properties(Some(AdditionalProperties::FreeForm(false)));
        OneOfBuilder::new()
            .item(hold)
            .item(revert)
            .description(Some("`\"hold\"` (keep the last value) or `{\"revert_after\": \"1h\"}`"))
            .into()
    }
}

#[cfg(feature = "openapi")]
impl utoipa::ToSchema for StalePolicy {
    fn schemas(schemas: &mut Vec<(String, utoipa::openapi::RefOr<utoipa::openapi::schema::Schema>)>) {
        use utoipa::PartialSchema;
        schemas.push((super::duration::Text::name().into(), super::duration::Text::schema()));
    }
}

/// Percentage rollout of a flag's value, keyed by a caller-supplied key.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Rollout {
    /// Share of keys, in percent, that see `value`; the rest see the default.
    pub percent: f64,
}

/// A flag: a kill switch or a tunable.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Flag {
    /// The type of `value` (JSON field `type`); a handle declared with another type gets
    /// its default.
    #[serde(rename = "type")]
    pub kind: FlagType,
    /// Current value; must match `type`.
    #[cfg_attr(feature = "openapi", schema(value_type = Value))]
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
    #[cfg_attr(feature = "openapi", schema(example = json!("hold")))]
    pub stale: StalePolicy,
    /// Gradual rollout by caller key; `None` = everyone sees `value`.
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
        #[serde(with = "super::duration")]
        #[cfg_attr(feature = "openapi", schema(value_type = crate::policy::duration::Text, example = "2s"))]
        delay: Duration,
    },
    /// Fails the attempt with this HTTP status (gRPC callers see the mapped code).
    Abort {
        /// HTTP status answered instead of calling (a status the policy's validation allows;
        /// the decoder takes any `u16`).
        #[cfg_attr(feature = "openapi", schema(minimum = 0, maximum = 65535))]
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
    /// What the rule does to an affected attempt.
    pub action: FaultAction,
    /// Share of attempts affected, in percent.
    pub percent: f64,
    /// Mandatory: the rule stops by itself after this instant, even offline.
    pub expires_at: Timestamp,
    /// The agent instances (their announced instance ids) the rule applies to; empty (the
    /// default, and then not written) = every instance. An experiment's blast radius.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub instances: Vec<String>,
}

impl FaultRule {
    /// Whether the rule applies to the agent instance `instance_id`.
    pub fn applies_to(&self, instance_id: &str) -> bool {
        self.instances.is_empty() || self.instances.iter().any(|i| i == instance_id)
    }
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
    /// The state forced until `expires_at` or until the override is deleted.
    pub state: BreakerOverrideState,
    /// The override ends by itself after this instant (server and agent side).
    #[serde(default)]
    pub expires_at: Option<Timestamp>,
    /// Why it was set, for the audit log and the operators who find it.
    #[serde(default)]
    pub reason: String,
}

/// Operator levers set until an instant (by an emergency profile): each lever given
/// replaces the policy's value (`policy.inbound`) until `expires_at`, after which the
/// policy's value is back by itself — on the server (the expiry sweep removes it) and in
/// the agent (a timer), even while the agent cannot reach the server. Absent levers keep
/// the policy's value.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct LeverOverride {
    /// Percentage of SHEDDABLE and SHEDDABLE_PLUS traffic to shed, instead of
    /// `policy.inbound.shed_sheddable_percent`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shed_sheddable_percent: Option<f64>,
    /// `true` pauses every outgoing retry of the service, instead of
    /// `policy.inbound.retries_paused`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retries_paused: Option<bool>,
    /// A fixed inbound concurrency limit, in requests, replacing the policy's (adaptive or
    /// fixed) limit; requests in flight when it changes are never dropped.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub inbound_limit: Option<u32>,
    /// Mandatory: the levers end by themselves after this instant, even offline.
    pub expires_at: Timestamp,
    /// Why they were set (`profile NAME: reason` for a profile's), for the operators who
    /// find them.
    #[serde(default)]
    pub reason: String,
}

//! Every default of the policy model, as a named constant.
//!
//! Sources: agent-semantics of Levee; resilience4j for the circuit breaker and bulkhead
//! defaults; AWS "Exponential Backoff And Jitter" and gRPC retry throttling for retries;
//! Netflix concurrency-limits for the adaptive limit; RFC 8289 (CoDel) for the queue;
//! Envoy for outlier detection.

use std::time::Duration;

use super::model::Criticality;

/// Inbound budget used when the caller sends no deadline.
pub const DEFAULT_DEADLINE: Duration = Duration::from_secs(1);
/// Cap on any inbound deadline, whatever the caller sends.
pub const MAX_DEADLINE: Duration = Duration::from_secs(10);
/// Time kept back from every outgoing call so the service can still build a degraded answer.
pub const RESERVE: Duration = Duration::from_millis(50);
/// Most a non-critical dependency may take from the remaining budget.
pub const NON_CRITICAL_CAP: Duration = Duration::from_millis(80);

/// Per-attempt timeout when none is configured (never infinite).
pub const ATTEMPT_TIMEOUT: Duration = Duration::from_secs(1);
/// Time limit of a fallback (it must be cheaper than the primary path).
pub const FALLBACK_TIMEOUT: Duration = Duration::from_millis(50);
/// Oldest value the STALE fallback level may serve (RFC 5861 stale-if-error window).
pub const STALE_MAX_AGE: Duration = Duration::from_secs(600);
/// Entries kept in each dependency's stale-if-error cache.
pub const STALE_CACHE_ENTRIES: u32 = 1024;

/// Attempts in total, the first one included.
pub const RETRY_MAX_ATTEMPTS: u32 = 3;
/// Base delay of the exponential backoff.
pub const RETRY_BASE: Duration = Duration::from_millis(50);
/// Largest backoff delay.
pub const RETRY_CAP: Duration = Duration::from_secs(2);
/// Tokens a success deposits in the retry budget.
pub const RETRY_BUDGET_RATIO: f64 = 0.1;
/// Most tokens the retry budget holds.
pub const RETRY_BUDGET_CAPACITY: f64 = 10.0;
/// Retries allowed per second even with an empty budget, so recovery is noticed.
pub const RETRY_BUDGET_MIN_PER_SEC: f64 = 1.0;

/// Calls in a count-based sliding window.
pub const BREAKER_WINDOW_CALLS: u32 = 100;
/// Seconds in a time-based sliding window.
pub const BREAKER_WINDOW_SECONDS: u32 = 10;
/// Calls the window must hold before the breaker may trip.
pub const BREAKER_MINIMUM_CALLS: u32 = 20;
/// Failure rate (ratio 0..1) at or above which the breaker opens.
pub const BREAKER_FAILURE_RATE_THRESHOLD: f64 = 0.5;
/// Slow-call rate (ratio 0..1) at or above which the breaker opens; 1.0 with no
/// `slow_call_duration` means slow-call detection is off.
pub const BREAKER_SLOW_CALL_RATE_THRESHOLD: f64 = 1.0;
/// First open period.
pub const BREAKER_WAIT_IN_OPEN: Duration = Duration::from_secs(15);
/// Cap of the exponentially growing open period.
pub const BREAKER_MAX_WAIT_IN_OPEN: Duration = Duration::from_secs(300);
/// Probe calls let through in HALF_OPEN.
pub const BREAKER_HALF_OPEN_PROBES: u32 = 3;

/// Concurrent calls a bulkhead admits (as resilience4j).
pub const BULKHEAD_MAX_CONCURRENT: u32 = 25;
/// How long a call may wait for a bulkhead slot (0 = fail fast).
pub const BULKHEAD_MAX_WAIT: Duration = Duration::ZERO;

/// Outlier detection: consecutive errors that eject an endpoint (Envoy `consecutive_5xx`).
pub const OUTLIER_CONSECUTIVE_ERRORS: u32 = 5;
/// Outlier detection: analysis interval.
pub const OUTLIER_INTERVAL: Duration = Duration::from_secs(10);
/// Outlier detection: base ejection time, multiplied by the number of ejections.
pub const OUTLIER_BASE_EJECTION_TIME: Duration = Duration::from_secs(30);
/// Outlier detection: most of the pool ever ejected, in percent (never the whole pool).
pub const OUTLIER_MAX_EJECTION_PERCENT: u32 = 50;

/// Adaptive limit: starting limit (Netflix concurrency-limits `initialLimit`).
pub const LIMIT_INITIAL: u32 = 20;
/// Adaptive limit: lower bound (`minLimit`).
pub const LIMIT_MIN: u32 = 20;
/// Adaptive limit: upper bound (`maxLimit` / `maxConcurrency`).
pub const LIMIT_MAX: u32 = 200;
/// AIMD: multiplicative decrease on a drop (`backoffRatio`).
pub const LIMIT_BACKOFF_RATIO: f64 = 0.9;
/// AIMD: a round trip longer than this counts as a drop (`timeout`).
pub const LIMIT_TIMEOUT: Duration = Duration::from_secs(5);
/// Gradient2: smoothing of the limit (`smoothing`).
pub const LIMIT_SMOOTHING: f64 = 0.2;
/// Vegas: smoothing of the limit (`smoothing`; 1.0 = the new estimate replaces the limit).
pub const VEGAS_SMOOTHING: f64 = 1.0;
/// Vegas: the no-load RTT is re-measured every `probeMultiplier × limit × jitter(0.5..1)`
/// updates (`probeMultiplier`).
pub const VEGAS_PROBE_MULTIPLIER: u32 = 30;
/// Gradient2: samples in the long RTT window (`longWindow`).
pub const LIMIT_LONG_WINDOW: u32 = 600;
/// Gradient2: tolerated ratio of short to long RTT (`rttTolerance`); AIMD: tolerated ratio
/// of a window's RTT at the limit to the no-load RTT (Levee's latency signal for AIMD).
pub const LIMIT_RTT_TOLERANCE: f64 = 1.5;
/// Gradient2: headroom added to the limit (`queueSize`).
pub const LIMIT_QUEUE_SIZE: u32 = 4;

/// Requests queued in front of the limit.
pub const QUEUE_MAX_LEN: u32 = 100;
/// CoDel target queue delay (RFC 8289 / "Fail at Scale").
pub const CODEL_TARGET: Duration = Duration::from_millis(5);
/// CoDel interval.
pub const CODEL_INTERVAL: Duration = Duration::from_millis(100);
/// Adaptive limits update once per window of samples (Netflix `WindowedLimit`): a window
/// lasts twice its smallest round trip, at least this long.
pub const LIMIT_WINDOW_MIN_TIME: Duration = Duration::from_millis(100);
/// Longest window of samples between two limit updates.
pub const LIMIT_WINDOW_MAX_TIME: Duration = Duration::from_secs(1);
/// Fewest samples a window needs to update the limit (a sparser window is discarded).
pub const LIMIT_WINDOW_MIN_SAMPLES: u32 = 10;
/// Highest criticality a caller may claim in the `levee-criticality` header.
pub const MAX_HEADER_CRITICALITY: Criticality = Criticality::Critical;

/// Client-side throttling: multiplier `K` of accepted requests (SRE book default).
pub const THROTTLE_K: f64 = 2.0;
/// Client-side throttling: sliding window of request and accept counts (SRE book: the
/// last two minutes).
pub const THROTTLE_WINDOW: Duration = Duration::from_secs(120);
/// Client-side throttling refuses nothing while its window holds fewer answers than this
/// (as a breaker's `minimum_calls`): with the book's formula alone, one rejection of a
/// quiet dependency (1 request, 0 accepts) would refuse half of the next attempts —
/// including the retry of that very call.
pub const THROTTLE_MIN_REQUESTS: u64 = 20;

/// How long a feature may live on a fallback before the server alerts.
pub const ALERT_AFTER: Duration = Duration::from_secs(900);

/// Most dependencies one service policy may name (bounded cardinality).
pub const MAX_DEPENDENCIES: usize = 256;
/// Most operations per dependency.
pub const MAX_OPERATIONS: usize = 64;
/// Most flags per service.
pub const MAX_FLAGS: usize = 1024;
/// Most degradation-matrix rows per service.
pub const MAX_MATRIX_ROWS: usize = 256;
/// Most fault rules per service.
pub const MAX_FAULTS: usize = 64;
/// Most instances one fault rule names (`FaultRule::instances`).
pub const MAX_FAULT_INSTANCES: usize = 1000;
/// Longest instance id a fault rule names, in bytes (the server's bound on the ids agents
/// announce).
pub const MAX_INSTANCE_ID_BYTES: usize = 128;
/// Most breaker overrides per service.
pub const MAX_BREAKER_OVERRIDES: usize = 256;
/// Most inbound routes per service.
pub const MAX_ROUTES: usize = 512;
/// Largest serialized flag value, in bytes.
pub const MAX_FLAG_VALUE_BYTES: usize = 16 * 1024;
/// Deepest nesting of arrays and objects in a flag value (`[]` and `{}` are 1, a scalar 0).
pub const MAX_FLAG_VALUE_DEPTH: usize = 32;

// Budgets of a whole snapshot, checked by `policy::accept` before anything is decoded. The
// counts above bound each list; these bound what no count does (a thousand flags of 16 KiB
// each) and keep every body far inside what the decoder and the transport take: serde_json
// refuses nesting past 128 levels, tonic messages past 4 MiB.

/// Largest snapshot body (canonical JSON, as stored, hashed and sent), in bytes.
pub const MAX_SNAPSHOT_BYTES: usize = 1024 * 1024;
/// Deepest nesting of arrays and objects in a snapshot body (`{}` is 1). A flag value
/// at [`MAX_FLAG_VALUE_DEPTH`] sits 3 levels down (`{"flags": {"key": {"value": …}}}`),
/// and the deepest policy field 8.
pub const MAX_BODY_DEPTH: usize = 64;
/// Largest message of the sync protocol, in bytes, in both directions: what the agent's
/// gRPC client decodes and the server's gRPC service encodes and decodes. Equal to tonic's
/// default receive limit, which every agent version so far has had, so a server never
/// sends a message that an older agent cannot receive either. A `Snapshot` message is its
/// body plus a few hundred bytes, well under this once the body is under
/// [`MAX_SNAPSHOT_BYTES`].
pub const MAX_MESSAGE_BYTES: usize = 4 * 1024 * 1024;

// The budgets keep their room, whatever they are changed to.
const _: () =
    assert!(MAX_FLAG_VALUE_DEPTH + 3 <= MAX_BODY_DEPTH, "a flag value at its limit fits the body's");
const _: () = assert!(MAX_BODY_DEPTH < 128, "serde_json refuses nesting past 128 levels");
const _: () = assert!(2 * MAX_SNAPSHOT_BYTES <= MAX_MESSAGE_BYTES, "a snapshot at its budget fits a message");

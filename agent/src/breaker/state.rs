use std::fmt;

use super::WindowCounts;

/// State of a circuit breaker (serialized as [`State::as_str`] spells it).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum State {
    /// Calls pass; outcomes fill the sliding window.
    Closed,
    /// Calls are rejected until the open period ends.
    Open,
    /// A fixed number of probe calls test the dependency.
    HalfOpen,
    /// Operator override: every call is rejected.
    ForcedOpen,
    /// Operator override: every call passes; outcomes are recorded, nothing trips.
    ForcedClosed,
    /// Operator override: the breaker is off; nothing is recorded.
    Disabled,
}

impl State {
    /// Every state, in the order of its gauge value.
    pub const ALL: [State; 6] = [
        State::Closed,
        State::Open,
        State::HalfOpen,
        State::ForcedOpen,
        State::ForcedClosed,
        State::Disabled,
    ];

    pub(crate) const fn index(self) -> usize {
        self as usize
    }

    pub(crate) const fn from_index(i: u64) -> State {
        match i {
            0 => State::Closed,
            1 => State::Open,
            2 => State::HalfOpen,
            3 => State::ForcedOpen,
            4 => State::ForcedClosed,
            _ => State::Disabled,
        }
    }

    /// The state [`State::as_str`] spells `word`, if any (how a status report names it).
    pub fn parse(word: &str) -> Option<State> {
        Self::ALL.into_iter().find(|s| s.as_str() == word)
    }

    /// Upper-case name as resilience4j spells it (`HALF_OPEN`).
    pub const fn as_str(self) -> &'static str {
        match self {
            State::Closed => "CLOSED",
            State::Open => "OPEN",
            State::HalfOpen => "HALF_OPEN",
            State::ForcedOpen => "FORCED_OPEN",
            State::ForcedClosed => "FORCED_CLOSED",
            State::Disabled => "DISABLED",
        }
    }
}

impl fmt::Display for State {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why a breaker changed state (serialized as [`TransitionReason::as_str`] spells it).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum TransitionReason {
    /// CLOSED → OPEN: failure rate reached its threshold.
    FailureRate,
    /// CLOSED → OPEN: slow-call rate reached its threshold.
    SlowCallRate,
    /// OPEN → HALF_OPEN: the open period ended (noticed lazily by the next call).
    OpenElapsed,
    /// HALF_OPEN → OPEN: a probe failed.
    ProbeFailed,
    /// HALF_OPEN → OPEN: a probe was slow.
    ProbeSlow,
    /// HALF_OPEN → OPEN: the probes did not all come back within `max_wait_in_half_open`
    /// (CB-1).
    HalfOpenTimeout,
    /// HALF_OPEN → CLOSED: every probe succeeded.
    ProbesSucceeded,
    /// Any → FORCED_*/DISABLED: an operator override was set.
    OverrideSet,
    /// FORCED_*/DISABLED → CLOSED: the override was removed.
    OverrideCleared,
    /// FORCED_*/DISABLED → CLOSED: the override reached its expiry.
    OverrideExpired,
}

impl TransitionReason {
    pub(crate) const ALL: [TransitionReason; 10] = [
        TransitionReason::FailureRate,
        TransitionReason::SlowCallRate,
        TransitionReason::OpenElapsed,
        TransitionReason::ProbeFailed,
        TransitionReason::ProbeSlow,
        TransitionReason::HalfOpenTimeout,
        TransitionReason::ProbesSucceeded,
        TransitionReason::OverrideSet,
        TransitionReason::OverrideCleared,
        TransitionReason::OverrideExpired,
    ];

    pub(crate) const fn index(self) -> usize {
        self as usize
    }

    /// snake_case label, as reported to the server and in metrics.
    pub const fn as_str(self) -> &'static str {
        match self {
            TransitionReason::FailureRate => "failure_rate",
            TransitionReason::SlowCallRate => "slow_call_rate",
            TransitionReason::OpenElapsed => "open_elapsed",
            TransitionReason::ProbeFailed => "probe_failed",
            TransitionReason::ProbeSlow => "probe_slow",
            TransitionReason::HalfOpenTimeout => "half_open_timeout",
            TransitionReason::ProbesSucceeded => "probes_succeeded",
            TransitionReason::OverrideSet => "override_set",
            TransitionReason::OverrideCleared => "override_cleared",
            TransitionReason::OverrideExpired => "override_expired",
        }
    }
}

impl fmt::Display for TransitionReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// How many times a breaker went from one state to another.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Transition {
    /// State left.
    pub from: State,
    /// State entered.
    pub to: State,
    /// Times it happened.
    pub count: u64,
}

/// A point-in-time view of a breaker, for status reports and tests; serializes (serde) for
/// a service's own status page, e.g. `{"state": "HALF_OPEN", "generation": 3, "window":
/// {"calls": 20, "failures": 11, "slow": 0}, "failure_rate": 0.55, …, "reasons":
/// [["failure_rate", 1]], "last_reason": "open_elapsed"}`.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct BreakerSnapshot {
    /// Current state.
    pub state: State,
    /// Generation: incremented on every transition, and in HALF_OPEN each time the wait
    /// is armed for a new cohort of probes.
    pub generation: u64,
    /// Calls, failures and slow calls in the sliding window.
    pub window: WindowCounts,
    /// Failure rate of the window, ratio 0..1 (0 when empty).
    pub failure_rate: f64,
    /// Slow-call rate of the window, ratio 0..1 (0 when empty).
    pub slow_call_rate: f64,
    /// Opens since the breaker last closed (drives the exponential open period).
    pub consecutive_opens: u32,
    /// Probe permits still free (HALF_OPEN only, else 0).
    pub half_open_free: u32,
    /// Transitions so far, per (from, to), non-zero ones only.
    pub transitions: Vec<Transition>,
    /// Transitions so far, per reason, non-zero ones only.
    pub reasons: Vec<(TransitionReason, u64)>,
    /// Reason of the most recent transition.
    pub last_reason: Option<TransitionReason>,
}

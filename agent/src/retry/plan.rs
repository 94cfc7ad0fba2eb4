use std::fmt;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use super::{Backoff, FastRng, Jitter};
use crate::policy;

/// What to do after a failed attempt.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Decision {
    /// Retry after waiting this long.
    RetryAfter(Duration),
    /// Do not retry; return the last error, for this reason.
    Stop(StopReason),
}

/// Why a retry loop stopped (carried by [`RetryError`](super::RetryError)).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StopReason {
    /// `max_attempts` attempts were made.
    AttemptsExhausted {
        /// The configured total, first attempt included.
        max_attempts: u32,
    },
    /// The error is not retryable (including `BreakerOpen`, `BulkheadFull`,
    /// `KillSwitched`, `DeadlineExceeded`).
    NotRetryable,
    /// The operation is not idempotent.
    NotIdempotent,
    /// The inbound request was already retried upstream (retry on one layer).
    RetriedUpstream,
    /// The retry budget had no token (and the floor none either).
    BudgetExhausted,
    /// The backoff delay does not fit the remaining deadline (RT-2).
    DeadlineTooShort {
        /// The delay that would have been slept.
        delay: Duration,
        /// Time an attempt could still use.
        remaining: Duration,
    },
    /// The server's `Retry-After` does not fit the remaining deadline (RT-3).
    RetryAfterBeyondDeadline {
        /// What the server asked for.
        retry_after: Duration,
        /// Time an attempt could still use.
        remaining: Duration,
    },
}

impl StopReason {
    /// Whether the stop is the deadline's doing: the retry loop then reports
    /// `DeadlineExceeded` chained to the last error.
    pub const fn is_deadline(&self) -> bool {
        matches!(self, StopReason::DeadlineTooShort { .. } | StopReason::RetryAfterBeyondDeadline { .. })
    }

    /// A short snake_case label for metrics.
    pub const fn as_str(&self) -> &'static str {
        match self {
            StopReason::AttemptsExhausted { .. } => "attempts_exhausted",
            StopReason::NotRetryable => "not_retryable",
            StopReason::NotIdempotent => "not_idempotent",
            StopReason::RetriedUpstream => "retried_upstream",
            StopReason::BudgetExhausted => "budget_exhausted",
            StopReason::DeadlineTooShort { .. } => "deadline_too_short",
            StopReason::RetryAfterBeyondDeadline { .. } => "retry_after_beyond_deadline",
        }
    }
}

impl fmt::Display for StopReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StopReason::AttemptsExhausted { max_attempts } => write!(f, "all {max_attempts} attempts failed"),
            StopReason::NotRetryable => f.write_str("error is not retryable"),
            StopReason::NotIdempotent => f.write_str("operation is not idempotent"),
            StopReason::RetriedUpstream => f.write_str("request is already retried upstream"),
            StopReason::BudgetExhausted => f.write_str("retry budget exhausted"),
            StopReason::DeadlineTooShort { delay, remaining } => {
                write!(f, "next retry delay {delay:?} does not fit the remaining {remaining:?}")
            }
            StopReason::RetryAfterBeyondDeadline { retry_after, remaining } => {
                write!(
                    f,
                    "server asked to retry after {retry_after:?}, more than the remaining {remaining:?}"
                )
            }
        }
    }
}

/// Decides whether and when to retry: attempts cap and full-jitter backoff, honouring a
/// server's `Retry-After` only when it fits the deadline.
#[derive(Debug)]
pub struct RetryPolicy {
    max_attempts: AtomicU32,
    backoff: Backoff,
}

impl RetryPolicy {
    /// A policy from the model's [`policy::Retry`] (its budget is separate:
    /// [`RetryBudget`](super::RetryBudget)).
    pub fn new(settings: &policy::Retry) -> Self {
        Self::with_backoff(settings.max_attempts, Backoff::new(settings.base, settings.cap))
    }

    /// A policy with an explicit backoff (e.g. seeded, or without jitter in tests).
    pub fn with_backoff(max_attempts: u32, backoff: Backoff) -> Self {
        Self { max_attempts: AtomicU32::new(max_attempts.max(1)), backoff }
    }

    /// A policy without jitter: every delay is its ceiling. Deterministic, for tests.
    pub fn without_jitter(settings: &policy::Retry) -> Self {
        Self::with_backoff(
            settings.max_attempts,
            Backoff::with_rng(settings.base, settings.cap, Jitter::None, FastRng::with_seed(0)),
        )
    }

    /// Applies new settings live (nothing to keep: the policy holds no state).
    pub fn update(&self, settings: &policy::Retry) {
        self.max_attempts.store(settings.max_attempts.max(1), Ordering::Relaxed);
        self.backoff.set(settings.base, settings.cap, self.backoff.jitter());
    }

    /// Total attempts allowed, the first included.
    pub fn max_attempts(&self) -> u32 {
        self.max_attempts.load(Ordering::Relaxed)
    }

    /// The backoff that draws the delays of [`plan_next`](Self::plan_next).
    pub fn backoff(&self) -> &Backoff {
        &self.backoff
    }

    /// Plans the step after a failed, retryable attempt.
    ///
    /// Inputs: `attempts_made` (≥ 1), `remaining` — the time a next attempt could still
    /// use (remaining deadline minus the reserve; `Duration::MAX` without a deadline) —
    /// and the server's `retry_after`, if any.
    ///
    /// Stops when the attempts are used up, when the server's `Retry-After` is not shorter
    /// than `remaining` (RT-3), or when the drawn backoff delay is not shorter than
    /// `remaining` (RT-2): never sleep and then fail. Otherwise retries after the server's
    /// delay when given, else after `backoff.delay(attempts_made − 1)`.
    /// Pure apart from drawing the jitter.
    pub fn plan_next(
        &self,
        attempts_made: u32,
        remaining: Duration,
        retry_after: Option<Duration>,
    ) -> Decision {
        let max_attempts = self.max_attempts();
        if attempts_made >= max_attempts {
            return Decision::Stop(StopReason::AttemptsExhausted { max_attempts });
        }
        if let Some(retry_after) = retry_after {
            if retry_after >= remaining {
                return Decision::Stop(StopReason::RetryAfterBeyondDeadline { retry_after, remaining });
            }
            return Decision::RetryAfter(retry_after);
        }
        let delay = self.backoff.delay(attempts_made.saturating_sub(1));
        if delay >= remaining {
            return Decision::Stop(StopReason::DeadlineTooShort { delay, remaining });
        }
        Decision::RetryAfter(delay)
    }
}

use std::error::Error as StdError;
use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use metrics::Counter;

use super::{Classify, Decision, RetryBudget, RetryPolicy, StopReason, one_layer_allows};
use crate::deadline::{self, Deadline};
use crate::metrics_names::{self as names, Labels, LateCounter};
use crate::policy;

/// What the retry loop needs to know about one call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CallInfo {
    /// Whether the operation may be repeated ([`Idempotency`](super::Idempotency)).
    pub idempotent: bool,
    /// The request deadline; `None` = no deadline (then only attempts and budget limit).
    pub deadline: Option<Deadline>,
    /// Time kept back from the deadline for building a degraded answer: a retry must
    /// fit in `remaining − reserve`.
    pub reserve: Duration,
    /// The inbound request was marked as retried upstream (retry on one layer).
    pub inbound_retried: bool,
}

impl CallInfo {
    /// Reads deadline and the upstream retry marker from the task's request context
    /// ([`deadline::current`]), with the given idempotency and reserve.
    pub fn from_context(idempotent: bool, reserve: Duration) -> Self {
        let ctx = deadline::current();
        Self {
            idempotent,
            deadline: ctx.map(|c| c.deadline),
            reserve,
            inbound_retried: ctx.is_some_and(|c| c.inbound_retried),
        }
    }
}

/// Returns the last attempt's error with why the loop stopped.
///
/// When the stop is the deadline's doing ([`RetryError::is_deadline_exceeded`]) it reads
/// as `deadline exceeded: ...`, with the last attempt's error as its `source()` (RT-2,
/// RT-3: the message says why). Otherwise [`RetryError::into_inner`] gives back the
/// original error, as a caller without retries would have seen it.
#[derive(Debug)]
pub struct RetryError<E> {
    /// The last attempt's error.
    pub last: E,
    /// Why no further attempt was made.
    pub reason: StopReason,
    /// Attempts made, the first included.
    pub attempts: u32,
}

impl<E> RetryError<E> {
    /// Whether the deadline ended the loop (the caller should report `DeadlineExceeded`).
    pub fn is_deadline_exceeded(&self) -> bool {
        self.reason.is_deadline()
    }

    /// The last attempt's error.
    pub fn into_inner(self) -> E {
        self.last
    }
}

impl<E: fmt::Display> fmt::Display for RetryError<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_deadline_exceeded() {
            write!(
                f,
                "deadline exceeded: {} after {} attempt(s); last error: {}",
                self.reason, self.attempts, self.last
            )
        } else {
            write!(f, "{} after {} attempt(s): {}", self.reason, self.attempts, self.last)
        }
    }
}

impl<E: StdError + 'static> StdError for RetryError<E> {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        Some(&self.last)
    }
}

/// Runs attempts of a call with retries: classification, idempotency, retry on one layer,
/// the deadline, the budget, then full-jitter backoff.
///
/// A local rejection such as `BreakerOpen` is not retryable, so an open breaker ends the
/// loop at once without charging the budget (CB-5). The budget is charged only when a
/// retry will really happen (after the deadline check), and every success deposits.
/// Sleeping uses `tokio::time::sleep`.
#[derive(Debug)]
pub struct Retrier {
    policy: RetryPolicy,
    budget: Arc<RetryBudget>,
    retries: LateCounter,
}

impl Retrier {
    /// A retrier with `settings` and its own budget (metrics not registered).
    pub fn new(settings: &policy::Retry) -> Self {
        Self {
            policy: RetryPolicy::new(settings),
            budget: Arc::new(RetryBudget::new(&settings.budget)),
            retries: LateCounter::noop(),
        }
    }

    /// A retrier with `settings` sharing `budget` (one budget per dependency), counting
    /// retries in [`RETRIES`](crate::metrics_names::RETRIES).
    pub fn with_budget(settings: &policy::Retry, budget: Arc<RetryBudget>, labels: &Labels) -> Self {
        Self { policy: RetryPolicy::new(settings), budget, retries: LateCounter::new(labels, names::RETRIES) }
    }

    /// A retrier from explicit parts.
    pub fn with_parts(policy: RetryPolicy, budget: Arc<RetryBudget>, retries: Counter) -> Self {
        Self { policy, budget, retries: LateCounter::bound(retries) }
    }

    /// Registers the retry and budget counters with a recorder installed since they were
    /// built (CB-9).
    pub(crate) fn publish_metrics(&self) {
        self.retries.publish();
        self.budget.publish_metrics();
    }

    /// Applies new settings live: the policy is replaced, the budget keeps its tokens.
    pub fn update(&self, settings: &policy::Retry) {
        self.policy.update(settings);
        self.budget.update(&settings.budget);
    }

    /// Attempts cap and backoff (replaced on [`update`](Self::update)).
    pub fn policy(&self) -> &RetryPolicy {
        &self.policy
    }

    /// The retry budget, possibly shared with other retriers of the dependency (it keeps
    /// its tokens on [`update`](Self::update)).
    pub fn budget(&self) -> &Arc<RetryBudget> {
        &self.budget
    }

    /// Decides what follows a failed attempt (everything but the sleep); charges the
    /// budget when the answer is a retry.
    pub fn next_step<E: Classify>(&self, info: &CallInfo, attempts_made: u32, err: &E) -> Decision {
        let kind = err.error_kind();
        if !kind.is_retryable() {
            return Decision::Stop(StopReason::NotRetryable);
        }
        if !info.idempotent {
            return Decision::Stop(StopReason::NotIdempotent);
        }
        if !one_layer_allows(info.inbound_retried, attempts_made, &kind) {
            return Decision::Stop(StopReason::RetriedUpstream);
        }
        let remaining = match info.deadline {
            Some(d) => d.remaining().saturating_sub(info.reserve),
            None => Duration::MAX,
        };
        let decision = self.policy.plan_next(attempts_made, remaining, err.retry_after());
        if let Decision::RetryAfter(_) = decision {
            if !self.budget.try_withdraw() {
                return Decision::Stop(StopReason::BudgetExhausted);
            }
            self.retries.increment(1);
        }
        decision
    }

    /// Runs `attempt(n)` (n = 1, 2, …) until it succeeds or a [`StopReason`] applies.
    ///
    /// # Errors
    /// [`RetryError`] with the last attempt's error and the reason.
    pub async fn run<T, E, F, Fut>(&self, info: CallInfo, mut attempt: F) -> Result<T, RetryError<E>>
    where
        E: Classify,
        F: FnMut(u32) -> Fut,
        Fut: Future<Output = Result<T, E>>,
    {
        let mut n = 1;
        loop {
            match attempt(n).await {
                Ok(v) => {
                    self.budget.deposit();
                    return Ok(v);
                }
                Err(e) => match self.next_step(&info, n, &e) {
                    Decision::Stop(reason) => return Err(RetryError { last: e, reason, attempts: n }),
                    Decision::RetryAfter(delay) => {
                        tokio::time::sleep(delay).await;
                        n += 1;
                    }
                },
            }
        }
    }
}

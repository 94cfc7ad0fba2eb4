//! What the enforcement stack makes of one attempt's result.

use std::time::Duration;

use crate::retry::{Classify, ErrorKind};

/// How one attempt that reached the dependency turned out, as a judge sees it: what the
/// circuit breaker records and what the retry stage decides on. A judge maps a result to
/// it: [`CallPolicy::judge`](super::CallPolicy::judge) for the tower layer, the `judge` of
/// [`Dependency::call_judged`](super::Dependency::call_judged), or
/// [`Judgement::classify`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Judgement {
    /// The dependency did its job: the breaker records a success and no retry follows.
    /// The result reaches the caller as it is (an `Err` judged a success, such as a
    /// "not found", as [`CallError::Inner`](super::CallError::Inner)).
    Success,
    /// A failure: the breaker records it when `kind` is the dependency's fault
    /// ([`ErrorKind::is_dependency_failure`]); the retry stage retries it when `kind` is
    /// retryable and the operation idempotent.
    Failure {
        /// What kind of failure.
        kind: ErrorKind,
        /// The delay the server asked for before the next attempt (`Retry-After`, gRPC
        /// pushback), honoured when it fits the deadline.
        retry_after: Option<Duration>,
    },
}

impl Judgement {
    /// A failure of `kind` without a server-requested delay.
    pub const fn failure(kind: ErrorKind) -> Self {
        Judgement::Failure { kind, retry_after: None }
    }

    /// Whether the attempt succeeded.
    pub const fn is_success(&self) -> bool {
        matches!(self, Judgement::Success)
    }

    /// The judgement by the error's [`Classify`] implementation, as
    /// [`Dependency::call`](super::Dependency::call) judges: `Ok` is a success, an error
    /// a failure of its kind, with its `retry_after`.
    pub fn classify<T, E: Classify>(result: &Result<T, E>) -> Self {
        match result {
            Ok(_) => Judgement::Success,
            Err(e) => Judgement::Failure { kind: e.error_kind(), retry_after: e.retry_after() },
        }
    }
}

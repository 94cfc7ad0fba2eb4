//! Retries: exponential backoff with full jitter, a retry budget, the classification of
//! what may be retried, `Retry-After`, and "retry on one layer" (agent-semantics §2).
//!
//! The pieces compose in [`Retrier::run`]; each is usable alone:
//! [`Backoff`] (AWS "Exponential Backoff And Jitter", full jitter),
//! [`RetryBudget`] (a token bucket in the manner of gRPC retry throttling and Finagle's
//! `RetryBudget`), [`Idempotency`] and [`ErrorKind`] (what may be retried),
//! [`parse_retry_after`] (RFC 9110 §10.2.3), and the pure [`RetryPolicy::plan_next`].
//! [`AdaptiveThrottle`] is the SRE book's client-side adaptive throttling, which the
//! enforcement stack applies to every attempt (before the circuit breaker).

mod backoff;
mod budget;
mod classify;
mod one_layer;
mod plan;
mod retry_after;
mod rng;
mod run;
mod throttle;

pub use crate::failure::ErrorKind;
pub use backoff::{Backoff, Jitter};
pub use budget::RetryBudget;
pub use classify::{Classify, HttpStatusError, IDEMPOTENCY_KEY_HEADER, Idempotency, classify_error};
pub use one_layer::{RETRIED_HEADER, inbound_is_marked, mark_outgoing, one_layer_allows};
pub use plan::{Decision, RetryPolicy, StopReason};
pub use retry_after::{MAX_RETRY_AFTER, parse_retry_after};
pub use rng::FastRng;
pub use run::{CallInfo, Retrier, RetryError};
pub use throttle::{AdaptiveThrottle, Throttled, probability as throttle_probability};

#[cfg(test)]
mod tests;
#[cfg(test)]
mod throttle_tests;

//! Circuit breaker with resilience4j semantics, lock-free on the closed path.
//!
//! [`CircuitBreaker`] has the states CLOSED, OPEN and HALF_OPEN plus the operator
//! overrides FORCED_OPEN, FORCED_CLOSED and DISABLED ([`State`]). A call takes a
//! [`BreakerPermit`] with [`CircuitBreaker::try_acquire`] and reports its [`Outcome`]
//! with [`BreakerPermit::record`]; a permit dropped unrecorded is a cancelled call.
//! Every permit is tagged with the state generation it was taken in, so a late result
//! never decides a later state (CB-3) and failures arriving while OPEN never extend the
//! open period (CB-7).

mod error;
mod machine;
mod metrics;
mod state;
mod window;

pub use error::BreakerOpen;
pub(crate) use machine::DetachedBreakerPermit;
pub use machine::{BreakerPermit, CircuitBreaker, Outcome};
pub use state::{BreakerSnapshot, State, Transition, TransitionReason};
pub use window::WindowCounts;

#[cfg(test)]
mod tests;

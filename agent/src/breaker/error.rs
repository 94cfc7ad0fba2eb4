use std::fmt;

/// Rejects a call because the circuit breaker is OPEN, FORCED_OPEN, or HALF_OPEN with
/// all its probe permits taken.
///
/// Not retryable and not charged to the retry budget: the retry loop ends at once and the
/// caller goes to its fallback. Opaque on purpose (tower style): find it with
/// `downcast_ref::<BreakerOpen>()`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BreakerOpen(());

impl BreakerOpen {
    pub(crate) const fn new() -> Self {
        Self(())
    }
}

impl fmt::Display for BreakerOpen {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("circuit breaker is open")
    }
}

impl std::error::Error for BreakerOpen {}

use std::fmt;

use crate::deadline::DeadlineExceeded;

/// Rejects a call because the bulkhead had no free slot within its bounded wait.
///
/// Raised locally: not retryable, not a failure of the dependency. Opaque on purpose
/// (tower style): find it with `downcast_ref::<BulkheadFull>()`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BulkheadFull(());

impl BulkheadFull {
    pub(crate) const fn new() -> Self {
        Self(())
    }
}

impl fmt::Display for BulkheadFull {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("bulkhead is full")
    }
}

impl std::error::Error for BulkheadFull {}

/// Why [`Bulkhead::acquire`](super::Bulkhead::acquire) gave no permit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BulkheadError {
    /// No slot freed up within `max_wait`.
    Full(BulkheadFull),
    /// The request deadline passed while waiting, or had passed when the slot came.
    DeadlineExceeded(DeadlineExceeded),
}

impl fmt::Display for BulkheadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BulkheadError::Full(e) => e.fmt(f),
            BulkheadError::DeadlineExceeded(e) => e.fmt(f),
        }
    }
}

impl std::error::Error for BulkheadError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            BulkheadError::Full(e) => Some(e),
            BulkheadError::DeadlineExceeded(e) => Some(e),
        }
    }
}

impl BulkheadError {
    /// Boxes the inner opaque error, so `downcast_ref::<BulkheadFull>()` /
    /// `downcast_ref::<DeadlineExceeded>()` find it directly (tower style).
    pub fn into_boxed(self) -> Box<dyn std::error::Error + Send + Sync> {
        match self {
            BulkheadError::Full(e) => Box::new(e),
            BulkheadError::DeadlineExceeded(e) => Box::new(e),
        }
    }
}

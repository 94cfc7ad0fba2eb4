//! Errors raised by enforcement itself (not by the dependency): [`CallError`], which the
//! plain API returns, and [`NotReplayable`]. The opaque structs a stage raises
//! (`KillSwitched`, `AttemptTimeout`, `DeadlineError`, `InjectedFault`) are defined in the
//! crate's leaf `failure` module, so `retry`'s classifier can recognize them, and are
//! re-exported here.

use std::fmt;
use std::time::Duration;

pub use crate::failure::{AttemptTimeout, DeadlineError, InjectedFault, KillSwitched};

use crate::breaker::BreakerOpen;
use crate::bulkhead::BulkheadFull;
use crate::retry::{Classify, ErrorKind, Throttled};

/// A tower service was asked for a second attempt but requests of this stack cannot be
/// replayed (raised only if a retry stage is configured for a non-replayable request).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NotReplayable(());

impl NotReplayable {
    pub(crate) fn new() -> Self {
        Self(())
    }
}

impl fmt::Display for NotReplayable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("request cannot be sent a second time")
    }
}

impl std::error::Error for NotReplayable {}

/// Why a call through [`Dependency::call`](super::Dependency::call) did not produce the
/// dependency's answer.
///
/// Local rejections (`KillSwitched`, `BreakerOpen`, `BulkheadFull`, `DeadlineExceeded`,
/// `Throttled`) never reached the dependency and are never retried.
#[derive(Debug)]
#[non_exhaustive]
pub enum CallError<E> {
    /// The kill switch is off; the future was never polled.
    KillSwitched(KillSwitched),
    /// The bulkhead had no free slot within `max_wait` (and the deadline).
    BulkheadFull(BulkheadFull),
    /// The circuit breaker is open (or forced open); no attempt was made.
    BreakerOpen(BreakerOpen),
    /// The deadline expired, or the next retry would not fit in it; with the last
    /// attempt's error when there was one.
    DeadlineExceeded(DeadlineError, Option<Box<CallError<E>>>),
    /// The (last) attempt exceeded its per-attempt timeout; its future was dropped.
    Timeout(AttemptTimeout),
    /// A fault-injection rule failed the (last) attempt.
    Injected(InjectedFault),
    /// The client-side throttle refused the (last) attempt locally: the dependency has
    /// been rejecting much of this client's traffic. Not retried.
    Throttled(Throttled),
    /// The dependency's own error, unchanged.
    Inner(E),
}

impl<E> CallError<E> {
    /// Whether the call never reached the dependency (rejected locally).
    pub fn is_local(&self) -> bool {
        matches!(
            self,
            CallError::KillSwitched(_)
                | CallError::BulkheadFull(_)
                | CallError::BreakerOpen(_)
                | CallError::DeadlineExceeded(..)
                | CallError::Throttled(_)
        )
    }

    /// The dependency's own error, if that is what this is.
    pub fn into_inner(self) -> Option<E> {
        match self {
            CallError::Inner(e) => Some(e),
            _ => None,
        }
    }

    /// Converts into a boxed error: enforcement errors as their opaque structs, the
    /// dependency's error as itself (what the tower layer returns).
    pub fn into_box(self) -> crate::BoxError
    where
        E: Into<crate::BoxError>,
    {
        match self {
            CallError::KillSwitched(e) => Box::new(e),
            CallError::BulkheadFull(e) => Box::new(e),
            CallError::BreakerOpen(e) => Box::new(e),
            CallError::DeadlineExceeded(e, last) => {
                Box::new(DeadlineError::new(e.why, last.map(|l| l.into_box())))
            }
            CallError::Timeout(e) => Box::new(e),
            CallError::Injected(e) => Box::new(e),
            CallError::Throttled(e) => Box::new(e),
            CallError::Inner(e) => e.into(),
        }
    }
}

impl<E: fmt::Display> fmt::Display for CallError<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CallError::KillSwitched(e) => e.fmt(f),
            CallError::BulkheadFull(e) => e.fmt(f),
            CallError::BreakerOpen(e) => e.fmt(f),
            CallError::DeadlineExceeded(e, last) => {
                e.fmt(f)?;
                match last {
                    Some(l) => write!(f, "; last error: {l}"),
                    None => Ok(()),
                }
            }
            CallError::Timeout(e) => e.fmt(f),
            CallError::Injected(e) => e.fmt(f),
            CallError::Throttled(e) => e.fmt(f),
            CallError::Inner(e) => e.fmt(f),
        }
    }
}

impl<E: std::error::Error + 'static> std::error::Error for CallError<E> {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            CallError::Inner(e) => Some(e),
            CallError::DeadlineExceeded(_, Some(last)) => Some(&**last),
            _ => None,
        }
    }
}

impl<E: Classify> Classify for CallError<E> {
    fn error_kind(&self) -> ErrorKind {
        use CallError as C;
        match self {
            C::KillSwitched(_) => ErrorKind::KillSwitched,
            C::BulkheadFull(_) => ErrorKind::BulkheadFull,
            C::BreakerOpen(_) => ErrorKind::BreakerOpen,
            C::DeadlineExceeded(..) => ErrorKind::DeadlineExceeded,
            C::Timeout(_) => ErrorKind::AttemptTimeout,
            C::Injected(f) => f.kind(),
            C::Throttled(_) => ErrorKind::BulkheadFull,
            C::Inner(e) => e.error_kind(),
        }
    }

    fn retry_after(&self) -> Option<Duration> {
        match self {
            CallError::Inner(e) => e.retry_after(),
            _ => None,
        }
    }
}

//! Errors raised by enforcement itself (not by the dependency).
//!
//! Small opaque structs, tower style: the tower layer boxes them, callers find them with
//! `downcast_ref`, so error types do not change when the layer order does. The plain API
//! wraps them in [`CallError`].

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use crate::breaker::BreakerOpen;
use crate::bulkhead::BulkheadFull;

/// The dependency is switched off by its kill switch (`enabled_flag` is `false`); the call
/// was not made. Not retryable.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KillSwitched {
    dependency: Arc<str>,
}

impl KillSwitched {
    pub(crate) fn new(dependency: Arc<str>) -> Self {
        Self { dependency }
    }

    /// Name of the dependency that is switched off.
    pub fn dependency(&self) -> &str {
        &self.dependency
    }
}

impl fmt::Display for KillSwitched {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "dependency `{}` is switched off by its kill switch", self.dependency)
    }
}

impl std::error::Error for KillSwitched {}

/// One attempt took longer than its per-attempt timeout and was abandoned (its future
/// dropped). Retryable.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AttemptTimeout {
    dependency: Arc<str>,
    timeout: Duration,
}

impl AttemptTimeout {
    pub(crate) fn new(dependency: Arc<str>, timeout: Duration) -> Self {
        Self { dependency, timeout }
    }

    /// Name of the dependency.
    pub fn dependency(&self) -> &str {
        &self.dependency
    }

    /// The per-attempt timeout that elapsed.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }
}

impl fmt::Display for AttemptTimeout {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "attempt to `{}` timed out after {:?}", self.dependency, self.timeout)
    }
}

impl std::error::Error for AttemptTimeout {}

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

/// An attempt failed because a fault-injection rule said so (game days): it behaves like
/// the real failure it imitates (an HTTP status or a connection error) for retries and
/// breakers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InjectedFault {
    dependency: Arc<str>,
    kind: crate::retry::ErrorKind,
}

impl InjectedFault {
    pub(crate) fn new(dependency: Arc<str>, kind: crate::retry::ErrorKind) -> Self {
        Self { dependency, kind }
    }

    /// The failure imitated.
    pub fn kind(&self) -> crate::retry::ErrorKind {
        self.kind
    }
}

impl fmt::Display for InjectedFault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "injected fault on `{}`: {:?}", self.dependency, self.kind)
    }
}

impl std::error::Error for InjectedFault {}

/// The request's deadline left no time for (another) attempt. `why` says what ran out;
/// `source()` is the last attempt's error, when there was one (RT-2, RT-3).
#[derive(Debug)]
pub struct DeadlineError {
    why: String,
    last: Option<crate::BoxError>,
}

impl DeadlineError {
    pub(crate) fn new(why: impl Into<String>, last: Option<crate::BoxError>) -> Self {
        Self { why: why.into(), last }
    }

    /// What ran out, in words.
    pub fn why(&self) -> &str {
        &self.why
    }
}

impl fmt::Display for DeadlineError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "deadline exceeded: {}", self.why)?;
        if let Some(last) = &self.last {
            write!(f, "; last error: {last}")?;
        }
        Ok(())
    }
}

impl std::error::Error for DeadlineError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.last.as_deref().map(|e| e as &(dyn std::error::Error + 'static))
    }
}

/// Why a call through [`Dependency::call`](super::Dependency::call) did not produce the
/// dependency's answer.
///
/// Local rejections (`KillSwitched`, `BreakerOpen`, `BulkheadFull`, `DeadlineExceeded`)
/// never reached the dependency and are never retried.
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
                Box::new(DeadlineError { why: e.why, last: last.map(|l| l.into_box()) })
            }
            CallError::Timeout(e) => Box::new(e),
            CallError::Injected(e) => Box::new(e),
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

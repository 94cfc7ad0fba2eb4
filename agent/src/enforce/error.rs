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

/// Why Levee ended a call itself instead of handing back the dependency's answer — the
/// one question to ask of any error the enforcement stack returns, whichever path it came
/// from (the plain API's [`CallError`], the tower layer's boxed error, the reqwest
/// middleware's `reqwest_middleware::Error`): see [`Refused::refusal`].
///
/// Serialized in snake_case, the spelling of the `outcome` label of `levee_calls_total`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum Refusal {
    /// The dependency's kill switch is off: the call was not made.
    KillSwitched,
    /// Its circuit breaker is open: no attempt was made.
    BreakerOpen,
    /// Its bulkhead had no free slot in time: no attempt was made.
    BulkheadFull,
    /// The client-side throttle refused the attempt: the dependency has been rejecting
    /// much of this client's traffic.
    Throttled,
    /// The request's deadline ran out, before the call or between attempts.
    DeadlineExceeded,
    /// The (last) attempt outlived its per-attempt timeout and was abandoned: the
    /// dependency saw it, but Levee gave up on the answer.
    Timeout,
    /// A fault-injection rule (game day) failed the (last) attempt.
    Injected,
}

impl Refusal {
    /// The refusal `err` carries, itself or in its `source()` chain: one of the errors
    /// enforcement raises ([`KillSwitched`], `BreakerOpen`, `BulkheadFull`, `Throttled`,
    /// [`DeadlineError`], [`AttemptTimeout`], [`InjectedFault`], the deadline's
    /// `DeadlineExceeded`). `None` for the dependency's own errors.
    pub fn of(err: &(dyn std::error::Error + 'static)) -> Option<Self> {
        let mut cur = Some(err);
        while let Some(e) = cur {
            let found = if e.is::<KillSwitched>() {
                Some(Refusal::KillSwitched)
            } else if e.is::<BreakerOpen>() {
                Some(Refusal::BreakerOpen)
            } else if e.is::<BulkheadFull>() {
                Some(Refusal::BulkheadFull)
            } else if e.is::<Throttled>() {
                Some(Refusal::Throttled)
            } else if e.is::<DeadlineError>() || e.is::<crate::deadline::DeadlineExceeded>() {
                Some(Refusal::DeadlineExceeded)
            } else if e.is::<AttemptTimeout>() {
                Some(Refusal::Timeout)
            } else if e.is::<InjectedFault>() {
                Some(Refusal::Injected)
            } else {
                None
            };
            if found.is_some() {
                return found;
            }
            cur = e.source();
        }
        None
    }

    /// Whether the dependency never saw the call (everything but [`Refusal::Timeout`]).
    pub const fn before_the_dependency(self) -> bool {
        !matches!(self, Refusal::Timeout)
    }

    /// The snake_case name (`"breaker_open"`), as serialized and as the `outcome` label.
    pub const fn as_str(self) -> &'static str {
        match self {
            Refusal::KillSwitched => "kill_switched",
            Refusal::BreakerOpen => "breaker_open",
            Refusal::BulkheadFull => "bulkhead_full",
            Refusal::Throttled => "throttled",
            Refusal::DeadlineExceeded => "deadline_exceeded",
            Refusal::Timeout => "timeout",
            Refusal::Injected => "injected",
        }
    }
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// "Was this refused by Levee, and why?" — implemented by every error type the enforcement
/// stack hands back: [`CallError`] (plain API), `BoxError` (the tower layer) and, with the
/// `reqwest-middleware` feature, `reqwest_middleware::Error`.
///
/// ```
/// use levee_agent::{Refusal, Refused};
/// # fn check(err: levee_agent::CallError<std::io::Error>) {
/// match err.refusal() {
///     Some(Refusal::BreakerOpen | Refusal::KillSwitched) => { /* serve the fallback at once */ }
///     Some(why) => eprintln!("levee refused the call: {why}"),
///     None => eprintln!("the dependency failed: {err}"),
/// }
/// # }
/// ```
pub trait Refused {
    /// Why Levee ended the call itself; `None` when the error is the dependency's (or the
    /// client's) own.
    fn refusal(&self) -> Option<Refusal>;
}

impl<E> Refused for CallError<E> {
    fn refusal(&self) -> Option<Refusal> {
        match self {
            CallError::KillSwitched(_) => Some(Refusal::KillSwitched),
            CallError::BulkheadFull(_) => Some(Refusal::BulkheadFull),
            CallError::BreakerOpen(_) => Some(Refusal::BreakerOpen),
            CallError::DeadlineExceeded(..) => Some(Refusal::DeadlineExceeded),
            CallError::Timeout(_) => Some(Refusal::Timeout),
            CallError::Injected(_) => Some(Refusal::Injected),
            CallError::Throttled(_) => Some(Refusal::Throttled),
            CallError::Inner(_) => None,
        }
    }
}

impl Refused for crate::BoxError {
    fn refusal(&self) -> Option<Refusal> {
        Refusal::of(self.as_ref())
    }
}

#[cfg(feature = "reqwest-middleware")]
impl Refused for reqwest_middleware::Error {
    fn refusal(&self) -> Option<Refusal> {
        match self {
            // `Error` is transparent over the `anyhow::Error`, whose own `source()` skips
            // the error it wraps: look at that error first.
            reqwest_middleware::Error::Middleware(e) => Refusal::of(e.as_ref()),
            reqwest_middleware::Error::Reqwest(_) => None,
        }
    }
}

//! The vocabulary of a failed attempt, shared by the patterns and by enforcement: what
//! kind of failure it was ([`ErrorKind`]: retryable? the dependency's fault?) and the
//! errors enforcement raises itself (kill switch, attempt timeout, deadline, injected
//! fault).
//!
//! A leaf: it imports nothing from the crate, so the classifier in `retry` recognizes
//! enforcement's own errors without depending on `enforce`, which depends on `retry`.
//! The public paths are `retry::ErrorKind` and `enforce::{KillSwitched, …}`.
//!
//! The errors are small opaque structs, tower style: the tower layer boxes them, callers
//! find them with `downcast_ref`, so error types do not change when the layer order does.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

/// What kind of failure an attempt ended with, as far as retries and breakers care.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorKind {
    /// The connection could not be established (refused, DNS, TLS handshake): the peer
    /// never saw the request.
    Connect,
    /// The connection broke during the exchange (reset, aborted, closed early): the peer
    /// may have seen the request.
    Reset,
    /// The per-attempt timeout fired.
    AttemptTimeout,
    /// The peer answered with this HTTP status (only failures are classified).
    HttpStatus(u16),
    /// The peer answered with this gRPC status code; `pushback` is true when the server
    /// sent retry pushback allowing a retry (`grpc-retry-pushback-ms` ≥ 0).
    Grpc {
        /// The status code.
        code: tonic::Code,
        /// Server pushback allows a retry.
        pushback: bool,
    },
    /// Rejected locally by an open circuit breaker.
    BreakerOpen,
    /// Rejected locally by a full bulkhead or an overloaded limiter (a tower `load_shed`'s
    /// `Overloaded`, the client-side throttle).
    BulkheadFull,
    /// Rejected locally because a kill switch turned the dependency off.
    KillSwitched,
    /// The request's deadline has passed (or left no budget for an attempt).
    DeadlineExceeded,
    /// Anything else: not retried, counted as a dependency failure.
    Other,
}

impl ErrorKind {
    /// Whether an error of this kind may be retried (given an idempotent operation):
    /// connect and reset errors, attempt timeouts, HTTP 408, 429, 502, 503, 504, gRPC
    /// UNAVAILABLE, and RESOURCE_EXHAUSTED with server pushback. Never the local
    /// rejections (`BreakerOpen`, `BulkheadFull`, `KillSwitched`), `DeadlineExceeded`, other
    /// 4xx, or anything unknown.
    pub const fn is_retryable(&self) -> bool {
        match self {
            ErrorKind::Connect | ErrorKind::Reset | ErrorKind::AttemptTimeout => true,
            ErrorKind::HttpStatus(s) => matches!(*s, 408 | 429 | 502 | 503 | 504),
            ErrorKind::Grpc { code, pushback } => {
                matches!(code, tonic::Code::Unavailable)
                    || (*pushback && matches!(code, tonic::Code::ResourceExhausted))
            }
            ErrorKind::BreakerOpen
            | ErrorKind::BulkheadFull
            | ErrorKind::KillSwitched
            | ErrorKind::DeadlineExceeded
            | ErrorKind::Other => false,
        }
    }

    /// Whether the request certainly never reached the peer (a retry cannot duplicate
    /// work): only [`ErrorKind::Connect`].
    pub const fn never_reached_peer(&self) -> bool {
        matches!(self, ErrorKind::Connect)
    }

    /// What a failed attempt tells client-side throttling: `Some(false)` for an overload
    /// rejection by the peer (HTTP 429 / 503, gRPC RESOURCE_EXHAUSTED / UNAVAILABLE),
    /// `Some(true)` for any other answer (the peer accepted the request, even if it then
    /// failed it), `None` when there was no answer (connect or reset error, attempt timeout,
    /// a local rejection): the circuit breaker judges those, the throttle counts nothing.
    pub const fn throttle_answer(&self) -> Option<bool> {
        match self {
            ErrorKind::HttpStatus(s) => Some(!matches!(*s, 429 | 503)),
            ErrorKind::Grpc { code, .. } => {
                Some(!matches!(code, tonic::Code::ResourceExhausted | tonic::Code::Unavailable))
            }
            ErrorKind::Other => Some(true),
            ErrorKind::Connect
            | ErrorKind::Reset
            | ErrorKind::AttemptTimeout
            | ErrorKind::BreakerOpen
            | ErrorKind::BulkheadFull
            | ErrorKind::KillSwitched
            | ErrorKind::DeadlineExceeded => None,
        }
    }

    /// Whether the failure was produced on this machine rather than by the dependency: an
    /// open breaker, a full bulkhead or overloaded limiter, a kill switch, a deadline that
    /// ran out. Such an outcome — also when it ends an attempt from inside, e.g. another
    /// dependency's bulkhead refusing a call made during the attempt — says nothing about
    /// the dependency: a circuit breaker records it neither way and hands a half-open probe
    /// back, outlier detection and the client-side throttle ignore it (IN-6).
    pub const fn is_local_refusal(&self) -> bool {
        matches!(
            self,
            ErrorKind::BreakerOpen
                | ErrorKind::BulkheadFull
                | ErrorKind::KillSwitched
                | ErrorKind::DeadlineExceeded
        )
    }

    /// Whether a circuit breaker should count this as a failure of the dependency (the
    /// default of agent-semantics §3): transport errors, attempt timeouts, 5xx, 408, 429,
    /// gRPC UNAVAILABLE, DEADLINE_EXCEEDED, INTERNAL, UNKNOWN, RESOURCE_EXHAUSTED and
    /// DATA_LOSS, and unknown errors. Client errors (other 4xx, gRPC client-side codes) and
    /// local rejections are not the dependency's fault.
    pub const fn is_dependency_failure(&self) -> bool {
        match self {
            ErrorKind::Connect | ErrorKind::Reset | ErrorKind::AttemptTimeout | ErrorKind::Other => true,
            ErrorKind::HttpStatus(s) => *s >= 500 || *s == 408 || *s == 429,
            ErrorKind::Grpc { code, .. } => matches!(
                code,
                tonic::Code::Unavailable
                    | tonic::Code::DeadlineExceeded
                    | tonic::Code::Internal
                    | tonic::Code::Unknown
                    | tonic::Code::ResourceExhausted
                    | tonic::Code::DataLoss
            ),
            ErrorKind::BreakerOpen
            | ErrorKind::BulkheadFull
            | ErrorKind::KillSwitched
            | ErrorKind::DeadlineExceeded => false,
        }
    }
}

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

/// An attempt failed because a fault-injection rule said so (game days): it behaves like
/// the real failure it imitates (an HTTP status or a connection error) for retries and
/// breakers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InjectedFault {
    dependency: Arc<str>,
    kind: ErrorKind,
}

impl InjectedFault {
    pub(crate) fn new(dependency: Arc<str>, kind: ErrorKind) -> Self {
        Self { dependency, kind }
    }

    /// The failure imitated.
    pub fn kind(&self) -> ErrorKind {
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
    pub(crate) why: String,
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

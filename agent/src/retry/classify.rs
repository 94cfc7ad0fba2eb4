use std::error::Error as StdError;
use std::io;
use std::time::Duration;

use http::{HeaderMap, Method};

use crate::breaker::BreakerOpen;
use crate::bulkhead::BulkheadFull;
use crate::deadline::DeadlineExceeded;
use crate::failure::{AttemptTimeout, DeadlineError, ErrorKind, InjectedFault, KillSwitched};

/// Header carrying an idempotency key; a POST that has one may be retried.
pub const IDEMPOTENCY_KEY_HEADER: &str = "idempotency-key";

/// Whether repeating an operation is safe.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Idempotency {
    /// Repeating it has the same effect as doing it once: may be retried.
    Idempotent,
    /// May have effects each time: never retried.
    NonIdempotent,
}

impl Idempotency {
    /// Decides from an HTTP method (agent-semantics §2): GET, HEAD, OPTIONS, PUT, DELETE
    /// (and TRACE) are idempotent; POST only with an idempotency key; other methods (PATCH,
    /// CONNECT, extensions) are not. `explicit` — the operation's configured `idempotent`
    /// flag — wins when set.
    pub fn for_method(method: &Method, has_idempotency_key: bool, explicit: Option<bool>) -> Self {
        let yes = match explicit {
            Some(v) => v,
            None => {
                matches!(
                    *method,
                    Method::GET
                        | Method::HEAD
                        | Method::OPTIONS
                        | Method::PUT
                        | Method::DELETE
                        | Method::TRACE
                ) || (*method == Method::POST && has_idempotency_key)
            }
        };
        if yes { Idempotency::Idempotent } else { Idempotency::NonIdempotent }
    }

    /// As [`Idempotency::for_method`], looking for [`IDEMPOTENCY_KEY_HEADER`] in `headers`.
    pub fn for_request(method: &Method, headers: &HeaderMap, explicit: Option<bool>) -> Self {
        Self::for_method(method, headers.contains_key(IDEMPOTENCY_KEY_HEADER), explicit)
    }

    /// Whether a retry is allowed by idempotency.
    pub const fn is_idempotent(self) -> bool {
        matches!(self, Idempotency::Idempotent)
    }
}

/// Classifies an error for the retry loop.
pub trait Classify {
    /// The kind of failure.
    fn error_kind(&self) -> ErrorKind;

    /// A server-requested delay before the next attempt (`Retry-After`, gRPC pushback).
    fn retry_after(&self) -> Option<Duration> {
        None
    }
}

impl Classify for ErrorKind {
    fn error_kind(&self) -> ErrorKind {
        *self
    }
}

impl Classify for Box<dyn StdError + Send + Sync> {
    fn error_kind(&self) -> ErrorKind {
        classify_error(self.as_ref())
    }

    fn retry_after(&self) -> Option<Duration> {
        let mut cur: Option<&(dyn StdError + 'static)> = Some(self.as_ref());
        while let Some(e) = cur {
            if let Some(status) = e.downcast_ref::<tonic::Status>() {
                return grpc_pushback(status).filter(|d| *d <= super::MAX_RETRY_AFTER);
            }
            cur = e.source();
        }
        None
    }
}

impl Classify for io::Error {
    fn error_kind(&self) -> ErrorKind {
        classify_error(self)
    }
}

impl Classify for tonic::Status {
    fn error_kind(&self) -> ErrorKind {
        ErrorKind::Grpc { code: self.code(), pushback: grpc_pushback(self).is_some() }
    }

    fn retry_after(&self) -> Option<Duration> {
        grpc_pushback(self).filter(|d| *d <= super::MAX_RETRY_AFTER)
    }
}

fn grpc_pushback(status: &tonic::Status) -> Option<Duration> {
    let v = status.metadata().get("grpc-retry-pushback-ms")?.to_str().ok()?;
    v.parse::<u64>().ok().map(Duration::from_millis)
}

/// Classifies any error by walking its `source()` chain: Levee's own rejections
/// ([`BreakerOpen`], [`BulkheadFull`], [`DeadlineExceeded`]), tokio's timeout `Elapsed`
/// (attempt timeout), `std::io::Error` kinds, and `tonic::Status`. Unknown errors are
/// [`ErrorKind::Other`].
pub fn classify_error(err: &(dyn StdError + 'static)) -> ErrorKind {
    let mut cur = Some(err);
    while let Some(e) = cur {
        if e.is::<BreakerOpen>() {
            return ErrorKind::BreakerOpen;
        }
        if e.is::<BulkheadFull>() {
            return ErrorKind::BulkheadFull;
        }
        if e.is::<DeadlineExceeded>() {
            return ErrorKind::DeadlineExceeded;
        }
        if e.is::<tokio::time::error::Elapsed>() || e.is::<AttemptTimeout>() {
            return ErrorKind::AttemptTimeout;
        }
        if e.is::<KillSwitched>() {
            return ErrorKind::KillSwitched;
        }
        if e.is::<DeadlineError>() {
            return ErrorKind::DeadlineExceeded;
        }
        if let Some(f) = e.downcast_ref::<InjectedFault>() {
            return f.kind();
        }
        if let Some(io) = e.downcast_ref::<io::Error>() {
            use io::ErrorKind as K;
            match io.kind() {
                K::ConnectionRefused
                | K::NotFound
                | K::AddrNotAvailable
                | K::HostUnreachable
                | K::NetworkUnreachable => {
                    return ErrorKind::Connect;
                }
                K::ConnectionReset
                | K::ConnectionAborted
                | K::BrokenPipe
                | K::UnexpectedEof
                | K::NotConnected => {
                    return ErrorKind::Reset;
                }
                K::TimedOut => return ErrorKind::AttemptTimeout,
                _ => {}
            }
            // A custom io::Error hides its payload from `source()`; look inside.
            if let Some(inner) = io.get_ref() {
                let kind = classify_error(inner);
                if kind != ErrorKind::Other {
                    return kind;
                }
            }
        }
        if let Some(status) = e.downcast_ref::<tonic::Status>() {
            let pushback = grpc_pushback(status).is_some();
            return ErrorKind::Grpc { code: status.code(), pushback };
        }
        cur = e.source();
    }
    ErrorKind::Other
}

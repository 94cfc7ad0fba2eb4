use std::error::Error as StdError;
use std::io;
use std::time::Duration;

use http::{HeaderMap, Method, StatusCode};

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

    /// The delay asked for by the first [`HttpStatusError`] (`Retry-After`) or
    /// `tonic::Status` (gRPC pushback) in the source chain.
    fn retry_after(&self) -> Option<Duration> {
        let mut cur: Option<&(dyn StdError + 'static)> = Some(self.as_ref());
        while let Some(e) = cur {
            if let Some(status) = e.downcast_ref::<tonic::Status>() {
                return grpc_pushback(status).filter(|d| *d <= super::MAX_RETRY_AFTER);
            }
            if let Some(http) = e.downcast_ref::<HttpStatusError>() {
                return http.retry_after;
            }
            cur = e.source();
        }
        None
    }
}

/// An HTTP answer that is a failure of the dependency — 408, 429 or any 5xx — with the
/// server's `Retry-After` (seconds or HTTP date, at most [`MAX_RETRY_AFTER`](super::MAX_RETRY_AFTER)).
///
/// Return it from an attempt when the response is at hand, so the retry waits as long as
/// the server asked: [`HttpStatusError::check`] (feature `reqwest`) is `error_for_status`
/// for what the stack counts as failures, keeping `Retry-After`, which a `reqwest::Error`
/// cannot carry. Other statuses (2xx, 3xx, and 4xx such as 404) are answers, not
/// failures. Classified as [`ErrorKind::HttpStatus`], also inside a boxed error.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HttpStatusError {
    status: StatusCode,
    retry_after: Option<Duration>,
}

impl HttpStatusError {
    /// The failure `status` stands for, with `Retry-After` from `headers`; `None` when the
    /// status is not a failure of the dependency. The one rule for HTTP answers, used by
    /// [`HttpPolicy`](crate::HttpPolicy) too.
    pub fn from_parts(status: StatusCode, headers: &HeaderMap) -> Option<Self> {
        if !ErrorKind::HttpStatus(status.as_u16()).is_dependency_failure() {
            return None;
        }
        let retry_after = headers
            .get(http::header::RETRY_AFTER)
            .and_then(|v| super::parse_retry_after(v.as_bytes(), std::time::SystemTime::now()));
        Some(Self { status, retry_after })
    }

    /// `Err` with the failure when `res` is one (408, 429, 5xx), else `res` unchanged.
    #[cfg(feature = "reqwest")]
    pub fn check(res: reqwest::Response) -> Result<reqwest::Response, Self> {
        match Self::from_parts(res.status(), res.headers()) {
            Some(e) => Err(e),
            None => Ok(res),
        }
    }

    /// The status the dependency answered.
    pub fn status(&self) -> StatusCode {
        self.status
    }
}

impl std::fmt::Display for HttpStatusError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "the dependency answered HTTP {}", self.status)
    }
}

impl StdError for HttpStatusError {}

impl Classify for HttpStatusError {
    fn error_kind(&self) -> ErrorKind {
        ErrorKind::HttpStatus(self.status.as_u16())
    }

    fn retry_after(&self) -> Option<Duration> {
        self.retry_after
    }
}

/// A `reqwest` error (feature `reqwest`), classified by [`classify_error`]: a status (from
/// `error_for_status`) as [`ErrorKind::HttpStatus`], a connection that could not be made
/// as [`ErrorKind::Connect`], reqwest's own timeout as [`ErrorKind::AttemptTimeout`], and
/// anything else by its source chain (a reset connection is [`ErrorKind::Reset`]). A
/// `reqwest::Error` keeps no headers, so it has no `Retry-After`; use
/// [`HttpStatusError::check`] for that.
#[cfg(feature = "reqwest")]
impl Classify for reqwest::Error {
    fn error_kind(&self) -> ErrorKind {
        classify_error(self)
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
/// ([`BreakerOpen`], [`BulkheadFull`], [`DeadlineExceeded`], kill switch, throttle, the
/// errors of a nested call), tower's `load_shed` `Overloaded` (a local refusal, as
/// [`ErrorKind::BulkheadFull`]), tokio's timeout `Elapsed`
/// (attempt timeout), [`HttpStatusError`], `reqwest::Error` (feature `reqwest`: status,
/// connect, timeout), `std::io::Error` kinds, and `tonic::Status`. Unknown errors are
/// [`ErrorKind::Other`].
pub fn classify_error(err: &(dyn StdError + 'static)) -> ErrorKind {
    let mut cur = Some(err);
    while let Some(e) = cur {
        if e.is::<BreakerOpen>() {
            return ErrorKind::BreakerOpen;
        }
        // A local throttle refusal, or tower's `load_shed` refusing for a layer below it, is
        // a local overload rejection, like a full bulkhead.
        if e.is::<BulkheadFull>()
            || e.is::<super::Throttled>()
            || e.is::<tower::load_shed::error::Overloaded>()
        {
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
        if let Some(h) = e.downcast_ref::<HttpStatusError>() {
            return h.error_kind();
        }
        #[cfg(feature = "reqwest")]
        if let Some(r) = e.downcast_ref::<reqwest::Error>() {
            // A connect timeout is both: the peer never saw the request, say so.
            if r.is_connect() {
                return ErrorKind::Connect;
            }
            if r.is_timeout() {
                return ErrorKind::AttemptTimeout;
            }
            if let Some(status) = r.status() {
                return ErrorKind::HttpStatus(status.as_u16());
            }
            // Otherwise its sources say more (a reset connection is an io::Error there).
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

use std::fmt;
use std::time::Duration;

use super::Reason;
use crate::policy::Criticality;

/// How long a client is asked to wait before retrying after an overload rejection
/// (`Retry-After`, gRPC `grpc-retry-pushback-ms`).
pub const RETRY_AFTER_OVERLOAD: Duration = Duration::from_secs(1);
/// How long a client is asked to wait before retrying a write refused in read-only mode.
pub const RETRY_AFTER_READ_ONLY: Duration = Duration::from_secs(30);

/// Refuses a request at admission: the service is overloaded (or read-only for this
/// route), and the request was not started.
///
/// Opaque on purpose (tower style): ask [`reason`](Self::reason),
/// [`http_status`](Self::http_status), [`retry_after`](Self::retry_after).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Rejected {
    reason: Reason,
    criticality: Criticality,
}

impl Rejected {
    pub(crate) const fn new(reason: Reason, criticality: Criticality) -> Self {
        Self { reason, criticality }
    }

    /// Why the request was refused.
    pub fn reason(&self) -> Reason {
        self.reason
    }

    /// The criticality the request was admitted (refused) with.
    pub fn criticality(&self) -> Criticality {
        self.criticality
    }

    /// When the client may try again: [`RETRY_AFTER_READ_ONLY`] in read-only mode, else
    /// [`RETRY_AFTER_OVERLOAD`].
    pub fn retry_after(&self) -> Duration {
        match self.reason {
            Reason::ReadOnly => RETRY_AFTER_READ_ONLY,
            _ => RETRY_AFTER_OVERLOAD,
        }
    }

    /// The HTTP status to answer with: 503 Service Unavailable. (429 is for quotas, which
    /// admission does not enforce.)
    pub fn http_status(&self) -> http::StatusCode {
        http::StatusCode::SERVICE_UNAVAILABLE
    }

    /// The gRPC status to answer with: UNAVAILABLE in read-only mode (the method is off
    /// for now), RESOURCE_EXHAUSTED for every overload reason (the server's capacity is
    /// exhausted; the pushback says when to retry).
    pub fn grpc_code(&self) -> tonic::Code {
        match self.reason {
            Reason::ReadOnly => tonic::Code::Unavailable,
            _ => tonic::Code::ResourceExhausted,
        }
    }
}

impl fmt::Display for Rejected {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.reason {
            Reason::ReadOnly => f.write_str("the service is read-only; this route changes data"),
            r => write!(f, "overloaded: request shed ({r})"),
        }
    }
}

impl std::error::Error for Rejected {}

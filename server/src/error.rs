//! The one error type of the HTTP API, answered as `application/problem+json` (RFC 9457).
//!
//! Client mistakes map to 4xx with a message a person understands (what was wrong, in which
//! field, what is allowed). Anything unexpected is logged with its cause and answered as a
//! 500 that leaks nothing.

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use levee_agent::policy::{FieldError, PolicyError};
use serde::Serialize;

/// Media type of every error body.
pub const PROBLEM_JSON: &str = "application/problem+json";

/// An API error.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// 400: the request could not be understood (malformed JSON, bad parameter).
    #[error("{detail}")]
    BadRequest {
        /// What was wrong.
        detail: String,
        /// Offending fields, when known.
        errors: Vec<FieldError>,
    },
    /// 422: well-formed but semantically invalid; lists every bad field.
    #[error("{detail}")]
    Invalid {
        /// Summary.
        detail: String,
        /// Every bad field.
        errors: Vec<FieldError>,
    },
    /// 401: no, expired or tampered credentials.
    #[error("{0}")]
    Unauthorized(String),
    /// 403: authenticated but not allowed.
    #[error("{0}")]
    Forbidden(String),
    /// 404: no such resource.
    #[error("{0}")]
    NotFound(String),
    /// 409: `If-Match` did not match; carries the current revision.
    #[error("revision conflict: you sent If-Match {expected}, the current revision is {current}")]
    Conflict {
        /// What the client sent.
        expected: u64,
        /// What the server has.
        current: u64,
    },
    /// 409: the resource already exists.
    #[error("{0}")]
    AlreadyExists(String),
    /// 413: body larger than the limit.
    #[error("request body is larger than the limit of {limit} bytes")]
    TooLarge {
        /// The limit in bytes.
        limit: usize,
    },
    /// 415: wrong content type.
    #[error("{0}")]
    UnsupportedMediaType(String),
    /// 428: a precondition header is required.
    #[error("{0}")]
    PreconditionRequired(String),
    /// 429: too many attempts.
    #[error("{0}")]
    TooManyRequests(String),
    /// 405: method not allowed on this path.
    #[error("method not allowed on this resource")]
    MethodNotAllowed,
    /// 500: a bug or an unavailable database; details only in the log.
    #[error("internal error")]
    Internal(#[source] anyhow::Error),
}

impl ApiError {
    /// Shorthand for a 400 without field errors.
    pub fn bad_request(detail: impl Into<String>) -> Self {
        ApiError::BadRequest { detail: detail.into(), errors: Vec::new() }
    }

    /// 400 naming one field.
    pub fn bad_field(path: &str, value: impl Into<String>, message: impl Into<String>) -> Self {
        let e = FieldError { path: path.into(), value: value.into(), message: message.into() };
        ApiError::BadRequest { detail: format!("invalid request: {e}"), errors: vec![e] }
    }

    /// 422 naming one field.
    pub fn invalid_field(path: &str, value: impl Into<String>, message: impl Into<String>) -> Self {
        let e = FieldError { path: path.into(), value: value.into(), message: message.into() };
        ApiError::Invalid { detail: format!("invalid value: {e}"), errors: vec![e] }
    }

    /// Maps a policy decode/validation error, prefixing field paths with `prefix`.
    pub fn from_policy(err: PolicyError, prefix: &str) -> Self {
        let mut errors = err.field_errors();
        if !prefix.is_empty() {
            for e in &mut errors {
                e.path = if e.path.is_empty() || e.path == "." {
                    prefix.to_string()
                } else {
                    format!("{prefix}.{}", e.path)
                };
            }
        }
        let n = errors.len();
        match err {
            PolicyError::Malformed { .. } => {
                ApiError::BadRequest { detail: format!("malformed request body: {}", errors[0]), errors }
            }
            PolicyError::Invalid(_) => ApiError::Invalid {
                detail: format!(
                    "{n} invalid field{}: {}",
                    if n == 1 { "" } else { "s" },
                    errors.iter().map(ToString::to_string).collect::<Vec<_>>().join("; ")
                ),
                errors,
            },
        }
    }

    fn status(&self) -> StatusCode {
        match self {
            ApiError::BadRequest { .. } => StatusCode::BAD_REQUEST,
            ApiError::Invalid { .. } => StatusCode::UNPROCESSABLE_ENTITY,
            ApiError::Unauthorized(_) => StatusCode::UNAUTHORIZED,
            ApiError::Forbidden(_) => StatusCode::FORBIDDEN,
            ApiError::NotFound(_) => StatusCode::NOT_FOUND,
            ApiError::Conflict { .. } | ApiError::AlreadyExists(_) => StatusCode::CONFLICT,
            ApiError::TooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            ApiError::UnsupportedMediaType(_) => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            ApiError::PreconditionRequired(_) => StatusCode::PRECONDITION_REQUIRED,
            ApiError::TooManyRequests(_) => StatusCode::TOO_MANY_REQUESTS,
            ApiError::MethodNotAllowed => StatusCode::METHOD_NOT_ALLOWED,
            ApiError::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    fn kind(&self) -> &'static str {
        match self {
            ApiError::BadRequest { .. } => "bad-request",
            ApiError::Invalid { .. } => "validation-failed",
            ApiError::Unauthorized(_) => "unauthorized",
            ApiError::Forbidden(_) => "forbidden",
            ApiError::NotFound(_) => "not-found",
            ApiError::Conflict { .. } => "revision-conflict",
            ApiError::AlreadyExists(_) => "already-exists",
            ApiError::TooLarge { .. } => "body-too-large",
            ApiError::UnsupportedMediaType(_) => "unsupported-media-type",
            ApiError::PreconditionRequired(_) => "precondition-required",
            ApiError::TooManyRequests(_) => "too-many-requests",
            ApiError::MethodNotAllowed => "method-not-allowed",
            ApiError::Internal(_) => "internal",
        }
    }
}

impl From<anyhow::Error> for ApiError {
    fn from(e: anyhow::Error) -> Self {
        ApiError::Internal(e)
    }
}

impl From<sqlx::Error> for ApiError {
    fn from(e: sqlx::Error) -> Self {
        ApiError::Internal(e.into())
    }
}

/// The problem document (RFC 9457) with Levee's extension members.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct Problem {
    /// URI naming the problem type (`urn:levee:problem:<kind>`).
    #[serde(rename = "type")]
    pub kind: String,
    /// Short summary of the problem type.
    pub title: String,
    /// HTTP status.
    pub status: u16,
    /// What went wrong, for a person.
    pub detail: String,
    /// Every offending field, with its path, value and what is allowed.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub errors: Vec<FieldError>,
    /// On a revision conflict: the current revision (send it as `If-Match` after re-reading).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub current_revision: Option<u64>,
}

/// An internal error's cause for the log: its whole chain, each cause once (anyhow's
/// `{:#}` repeats a cause whose error already prints it, as sqlx's I/O errors do).
pub fn internal_cause(cause: &anyhow::Error) -> levee_agent::report::ErrorChain<'_> {
    levee_agent::report::ErrorChain(cause.as_ref())
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = self.status();
        if let ApiError::Internal(cause) = &self {
            tracing::error!(error = %internal_cause(cause), "internal error answering a request");
        }
        let (errors, current_revision) = match &self {
            ApiError::BadRequest { errors, .. } | ApiError::Invalid { errors, .. } => (errors.clone(), None),
            ApiError::Conflict { current, .. } => (Vec::new(), Some(*current)),
            _ => (Vec::new(), None),
        };
        let problem = Problem {
            kind: format!("urn:levee:problem:{}", self.kind()),
            title: status.canonical_reason().unwrap_or("error").to_string(),
            status: status.as_u16(),
            detail: self.to_string(),
            errors,
            current_revision,
        };
        let mut res = (status, axum::Json(problem)).into_response();
        res.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static(PROBLEM_JSON));
        if let ApiError::Conflict { current, .. } = &self
            && let Ok(v) = HeaderValue::from_str(&format!("\"{current}\""))
        {
            res.headers_mut().insert(header::ETAG, v);
        }
        if let ApiError::Unauthorized(_) = &self {
            res.headers_mut()
                .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer realm=\"levee\""));
        }
        res
    }
}

/// Result alias for handlers.
pub type ApiResult<T> = Result<T, ApiError>;

#[cfg(test)]
mod tests {
    use super::*;

    /// sqlx's I/O error prints its source in its own message; the logged chain says it once.
    #[test]
    fn internal_cause_prints_each_cause_once() {
        let io = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "connection refused");
        let cause = anyhow::Error::new(sqlx::Error::Io(io)).context("loading the latest snapshot");
        assert_eq!(
            internal_cause(&cause).to_string(),
            "loading the latest snapshot: error communicating with database: connection refused"
        );
    }
}

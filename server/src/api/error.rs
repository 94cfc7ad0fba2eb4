//! The one error type of the HTTP API, answered as `application/problem+json` (RFC 9457).
//!
//! Client mistakes map to 4xx with a message a person understands (what was wrong, in which
//! field, what is allowed). Anything unexpected is logged with its cause and answered as a
//! 500 that leaks nothing.

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use levee_agent::ofrep::ErrorCode;
use levee_agent::policy::{FieldError, PolicyError, ValidationErrors};
use serde::Serialize;

use crate::actions::{
    BadInput, Broken, ChangeError, CreateError, Forbidden, Missing, ProfileUndo, ReasonError, TokenError,
};
use crate::auth::LoginError;
use crate::db::Unreadable;

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
        /// The count and every bad field, for a person.
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
    /// 409: a whole-service write or deletion would undo what the active emergency profile
    /// set; carries the profile and the flag paths.
    #[error("{detail}")]
    ProfileWouldUndo {
        /// What, whose, until when, and how to proceed.
        detail: String,
        /// The profile and what the write would undo.
        undo: ProfileUndo,
    },
    /// 409: an approved change request's target changed since it was proposed; the approval
    /// is void and nothing was applied.
    #[error("{0}")]
    ApprovalVoid(String),
    /// 409: a staged rollout is in progress and the write would change what it stages, or
    /// the rollout is not in a state for the step asked.
    #[error("{0}")]
    Rollout(String),
    /// 409: the token to rotate is revoked or expired (mint a new one).
    #[error("{0}")]
    TokenEnded(String),
    /// 409: a stored revision does not decode with this server version.
    #[error("{0}; if it is the current revision, roll back to one that reads (POST .../rollback)")]
    Unreadable(Unreadable),
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
    /// 429 with a `Retry-After` (seconds): a throttled login.
    #[error("{detail}")]
    Throttled {
        /// What to tell the caller.
        detail: String,
        /// Seconds until an attempt is checked again.
        retry_after_s: u64,
    },
    /// 400 or 404 of an OFREP evaluation: a problem whose extension members `key`,
    /// `errorCode` and `errorDetails` are the protocol's own, so OFREP providers read it.
    #[error("{}", .0.error_details)]
    Ofrep(levee_agent::ofrep::Failure),
    /// 405: method not allowed on this path.
    #[error("method not allowed on this resource")]
    MethodNotAllowed,
    /// 503: the database cannot be reached now; retry shortly (`Retry-After`). The cause
    /// is for the log only.
    #[error("the database is unavailable; retry in a few seconds")]
    Unavailable(String),
    /// 500: a bug; details only in the log.
    #[error("internal error")]
    Internal(#[source] anyhow::Error),
}

/// `Retry-After` of a 503 answered while the database is away, in seconds.
pub const UNAVAILABLE_RETRY_AFTER_SECS: u32 = 2;

impl ApiError {
    /// Shorthand for a 400 without field errors.
    pub fn bad_request(detail: impl Into<String>) -> Self {
        ApiError::BadRequest { detail: detail.into(), errors: Vec::new() }
    }

    /// 400 naming one field.
    pub fn bad_field(path: &str, value: impl Into<String>, message: impl Into<String>) -> Self {
        BadInput::new(path, value, message).into()
    }

    /// 422 listing every bad field of a document.
    pub fn invalid(errors: ValidationErrors) -> Self {
        let n = errors.0.len();
        ApiError::Invalid {
            detail: format!("{n} invalid field{}: {errors}", if n == 1 { "" } else { "s" }),
            errors: errors.0,
        }
    }

    /// 503 for a database that cannot be reached; the cause goes to the log.
    pub fn unavailable(cause: impl Into<String>) -> Self {
        ApiError::Unavailable(cause.into())
    }

    /// A storage failure: 503 when the database is unreachable, 400 for text it cannot
    /// store (a NUL character on PostgreSQL), else 500.
    pub fn storage(cause: anyhow::Error) -> Self {
        if crate::db::is_unstorable_text(&cause) {
            ApiError::bad_request("the request contains a NUL character, which names and texts cannot hold")
        } else if crate::db::is_unavailable(&cause) {
            ApiError::Unavailable(internal_cause(&cause).to_string())
        } else {
            ApiError::Internal(cause)
        }
    }

    /// 422 naming the one value refused.
    fn invalid_field(e: FieldError) -> Self {
        ApiError::Invalid { detail: format!("invalid value: {e}"), errors: vec![e] }
    }

    /// Maps a decoding or validation error of a request body.
    pub fn from_policy(err: PolicyError) -> Self {
        match err {
            PolicyError::Malformed { .. } => {
                let errors = err.field_errors();
                let more = match errors.len() {
                    1 => String::new(),
                    2 => " (and 1 more problem, listed in errors)".to_string(),
                    n => format!(" (and {} more problems, listed in errors)", n - 1),
                };
                ApiError::BadRequest {
                    detail: format!("malformed request body: {}{more}", errors[0]),
                    errors,
                }
            }
            PolicyError::Invalid(v) => ApiError::invalid(v),
            PolicyError::Refused(e) => ApiError::invalid_field(e),
        }
    }

    fn status(&self) -> StatusCode {
        match self {
            ApiError::BadRequest { .. } => StatusCode::BAD_REQUEST,
            ApiError::Invalid { .. } => StatusCode::UNPROCESSABLE_ENTITY,
            ApiError::Unauthorized(_) => StatusCode::UNAUTHORIZED,
            ApiError::Forbidden(_) => StatusCode::FORBIDDEN,
            ApiError::NotFound(_) => StatusCode::NOT_FOUND,
            ApiError::Conflict { .. }
            | ApiError::AlreadyExists(_)
            | ApiError::ProfileWouldUndo { .. }
            | ApiError::ApprovalVoid(_)
            | ApiError::Rollout(_)
            | ApiError::Unreadable(_)
            | ApiError::TokenEnded(_) => StatusCode::CONFLICT,
            ApiError::TooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            ApiError::UnsupportedMediaType(_) => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            ApiError::PreconditionRequired(_) => StatusCode::PRECONDITION_REQUIRED,
            ApiError::TooManyRequests(_) | ApiError::Throttled { .. } => StatusCode::TOO_MANY_REQUESTS,
            ApiError::MethodNotAllowed => StatusCode::METHOD_NOT_ALLOWED,
            ApiError::Ofrep(f) => {
                StatusCode::from_u16(f.error_code.status()).unwrap_or(StatusCode::BAD_REQUEST)
            }
            ApiError::Unavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
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
            ApiError::ProfileWouldUndo { .. } => "profile-would-undo",
            ApiError::ApprovalVoid(_) => "approval-void",
            ApiError::Unreadable(_) => "revision-unreadable",
            ApiError::Rollout(_) => "rollout-conflict",
            ApiError::TokenEnded(_) => "token-ended",
            ApiError::TooLarge { .. } => "body-too-large",
            ApiError::UnsupportedMediaType(_) => "unsupported-media-type",
            ApiError::PreconditionRequired(_) => "precondition-required",
            ApiError::TooManyRequests(_) | ApiError::Throttled { .. } => "too-many-requests",
            ApiError::MethodNotAllowed => "method-not-allowed",
            ApiError::Ofrep(f) if f.error_code == ErrorCode::FlagNotFound => "flag-not-found",
            ApiError::Ofrep(_) => "bad-evaluation-request",
            ApiError::Unavailable(_) => "unavailable",
            ApiError::Internal(_) => "internal",
        }
    }
}

impl From<anyhow::Error> for ApiError {
    fn from(e: anyhow::Error) -> Self {
        ApiError::storage(e)
    }
}

impl From<sqlx::Error> for ApiError {
    fn from(e: sqlx::Error) -> Self {
        ApiError::storage(e.into())
    }
}

impl From<BadInput> for ApiError {
    fn from(e: BadInput) -> Self {
        match e.1 {
            Broken::Form => ApiError::BadRequest { detail: e.to_string(), errors: vec![e.0] },
            Broken::Rule => ApiError::invalid_field(e.0),
        }
    }
}

impl From<ReasonError> for ApiError {
    fn from(e: ReasonError) -> Self {
        BadInput::from(e).into()
    }
}

impl From<Forbidden> for ApiError {
    fn from(e: Forbidden) -> Self {
        ApiError::Forbidden(e.to_string())
    }
}

impl From<Missing> for ApiError {
    fn from(m: Missing) -> Self {
        ApiError::NotFound(m.to_string())
    }
}

impl From<crate::web::NotInEnvironment> for ApiError {
    fn from(e: crate::web::NotInEnvironment) -> Self {
        ApiError::NotFound(e.to_string())
    }
}

impl From<ChangeError> for ApiError {
    fn from(e: ChangeError) -> Self {
        match e {
            ChangeError::Forbidden(f) => f.into(),
            ChangeError::NotFound(m) => m.into(),
            ChangeError::Conflict { expected, current } => ApiError::Conflict { expected, current },
            ChangeError::Invalid(v) => ApiError::invalid(v),
            ChangeError::InvalidField(f) => ApiError::invalid_field(f),
            e @ ChangeError::FaultsNotAllowed { .. } => ApiError::Forbidden(e.to_string()),
            e @ ChangeError::ProfileActive { .. } => ApiError::AlreadyExists(e.to_string()),
            e @ ChangeError::ApprovalVoid { .. } => ApiError::ApprovalVoid(e.to_string()),
            ChangeError::ProfileWouldUndo { env, undo } => {
                let detail = ChangeError::ProfileWouldUndo { env, undo: undo.clone() }.to_string();
                ApiError::ProfileWouldUndo { detail, undo }
            }
            e @ (ChangeError::ApprovalRequired { .. }
            | ChangeError::NotProposer { .. }
            | ChangeError::AuthorGone { .. }
            | ChangeError::SelfApproval { .. }) => ApiError::Forbidden(e.to_string()),
            ChangeError::Unreadable(u) => ApiError::Unreadable(u),
            ChangeError::Rollout(why) => ApiError::Rollout(why),
            ChangeError::Storage(cause) => ApiError::storage(cause),
        }
    }
}

impl From<Unreadable> for ApiError {
    fn from(e: Unreadable) -> Self {
        ApiError::Unreadable(e)
    }
}

impl From<CreateError> for ApiError {
    fn from(e: CreateError) -> Self {
        match e {
            CreateError::Forbidden(f) => f.into(),
            CreateError::NotFound(m) => m.into(),
            CreateError::AlreadyExists(x) => ApiError::AlreadyExists(x.to_string()),
            CreateError::Invalid(v) => ApiError::invalid(v),
            CreateError::Refused(e) => (*e).into(),
            CreateError::Storage(cause) => ApiError::storage(cause),
        }
    }
}

impl From<TokenError> for ApiError {
    fn from(e: TokenError) -> Self {
        match e {
            TokenError::Forbidden(f) => f.into(),
            TokenError::InvalidField(f) => ApiError::invalid_field(f),
            TokenError::NotFound(m) => m.into(),
            TokenError::Ended(e) => ApiError::TokenEnded(e.to_string()),
            TokenError::Storage(cause) => ApiError::storage(cause),
        }
    }
}

impl From<LoginError> for ApiError {
    fn from(e: LoginError) -> Self {
        match e {
            LoginError::WrongCredentials => ApiError::Unauthorized(e.to_string()),
            LoginError::TooManyAttempts(t) => ApiError::Throttled {
                detail: e.to_string(),
                retry_after_s: t.retry_after.as_secs_f64().ceil().max(1.0) as u64,
            },
            LoginError::Internal(cause) => ApiError::storage(cause),
        }
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
    /// The HTTP status code, as in the response line.
    pub status: u16,
    /// What went wrong, for a person.
    pub detail: String,
    /// Every offending field, with its path, value and what is allowed.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub errors: Vec<FieldError>,
    /// On a revision conflict: the current revision (send it as `If-Match` after re-reading).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub current_revision: Option<u64>,
    /// On a write refused because it would undo what the active emergency profile set
    /// (`profile-would-undo`): the profile (name, who applied it, until when) and the flag
    /// paths the write would undo. Revert the profile, or send `override_profile` with a
    /// reason.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub profile: Option<ProfileUndo>,
    /// OFREP evaluations: the flag's key (absent when the whole request failed).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    /// OFREP evaluations: the protocol's error code.
    #[serde(rename = "errorCode", skip_serializing_if = "Option::is_none")]
    pub error_code: Option<ErrorCode>,
    /// OFREP evaluations: the protocol's error details (the same text as `detail`).
    #[serde(rename = "errorDetails", skip_serializing_if = "Option::is_none")]
    pub error_details: Option<String>,
}

/// An internal error's cause for the log: its whole chain, each cause once (anyhow's
/// `{:#}` repeats a cause whose error already prints it, as sqlx's I/O errors do).
pub fn internal_cause(cause: &anyhow::Error) -> levee_agent::report::ErrorChain<'_> {
    levee_agent::report::ErrorChain(cause.as_ref())
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = self.status();
        match &self {
            ApiError::Internal(cause) => {
                tracing::error!(error = %internal_cause(cause), "internal error answering a request");
            }
            ApiError::Unavailable(cause) => {
                tracing::warn!(error = %cause, "database unavailable answering a request");
            }
            _ => {}
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
            profile: match &self {
                ApiError::ProfileWouldUndo { undo, .. } => Some(undo.clone()),
                _ => None,
            },
            key: match &self {
                ApiError::Ofrep(f) => f.key.clone(),
                _ => None,
            },
            error_code: match &self {
                ApiError::Ofrep(f) => Some(f.error_code),
                _ => None,
            },
            error_details: match &self {
                ApiError::Ofrep(f) => Some(f.error_details.clone()),
                _ => None,
            },
        };
        let mut res = (status, axum::Json(problem)).into_response();
        res.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static(PROBLEM_JSON));
        if let ApiError::Conflict { current, .. } = &self
            && let Ok(v) = HeaderValue::from_str(&format!("\"{current}\""))
        {
            res.headers_mut().insert(header::ETAG, v);
        }
        if let ApiError::Unavailable(_) = &self {
            res.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from(UNAVAILABLE_RETRY_AFTER_SECS));
        }
        if let ApiError::Throttled { retry_after_s, .. } = &self {
            res.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from(*retry_after_s));
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

//! Extractors: authentication, JSON bodies with path-aware errors, request context.

use axum::extract::{FromRequest, FromRequestParts, Request};
use axum::http::header;
use axum::http::request::Parts;
use serde::de::DeserializeOwned;

use super::AppState;
use crate::auth::{AuthError, Principal, authenticate_api};
use crate::db::{AuditCtx, Role};
use crate::error::ApiError;

/// Name of the UI session cookie.
pub const SESSION_COOKIE: &str = "levee_session";

/// An authenticated caller (bearer token, or the UI session cookie for safe methods only).
#[derive(Clone, Debug)]
pub struct Auth {
    /// Who.
    pub principal: Principal,
    /// Through which door: `api`, `cli` or `ui`.
    pub via: &'static str,
}

impl Auth {
    /// Refuses with 403 unless the caller has at least `role`.
    pub fn require(&self, role: Role) -> Result<(), ApiError> {
        if self.principal.role >= role {
            Ok(())
        } else {
            Err(ApiError::Forbidden(format!(
                "this action needs the {} role; you are {}",
                role.as_str(),
                self.principal.role.as_str()
            )))
        }
    }
}

/// Reads a cookie value from the request headers.
pub fn cookie<'a>(parts: &'a Parts, name: &str) -> Option<&'a str> {
    parts
        .headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|kv| kv.trim().split_once('='))
        .find(|(k, _)| *k == name)
        .map(|(_, v)| v)
}

impl FromRequestParts<AppState> for Auth {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, Self::Rejection> {
        let (token, via) = match parts.headers.get(header::AUTHORIZATION) {
            Some(v) => {
                let v = v
                    .to_str()
                    .map_err(|_| ApiError::Unauthorized("malformed Authorization header".into()))?;
                let t = v
                    .strip_prefix("Bearer ")
                    .or_else(|| v.strip_prefix("bearer "))
                    .ok_or_else(|| ApiError::Unauthorized("Authorization must be `Bearer <token>`".into()))?;
                let via = match parts.headers.get("x-levee-client").and_then(|v| v.to_str().ok()) {
                    Some("cli") => "cli",
                    _ => "api",
                };
                (t.trim().to_string(), via)
            }
            None => match cookie(parts, SESSION_COOKIE) {
                // The session cookie reads the API from the browser; a change through the
                // API needs a bearer token, so a forged cross-site request can never
                // carry the operator's authority (the UI's own forms have CSRF tokens).
                Some(_) if !parts.method.is_safe() => {
                    return Err(ApiError::Unauthorized(
                        "changes through the API need an Authorization: Bearer token; the UI session cookie only reads"
                            .into(),
                    ));
                }
                Some(c) => (c.to_string(), "ui"),
                None => {
                    return Err(ApiError::Unauthorized(
                        "missing bearer token: log in with POST /api/v1/auth/login".into(),
                    ));
                }
            },
        };
        let principal = authenticate_api(&state.keys, &state.store, &token).await.map_err(|e| match e {
            AuthError::Expired => ApiError::Unauthorized("token expired: log in again".into()),
            AuthError::Revoked => ApiError::Unauthorized("token revoked".into()),
            AuthError::UserGone => ApiError::Unauthorized("user is disabled or no longer exists".into()),
            AuthError::Missing => ApiError::Unauthorized("missing bearer token".into()),
            AuthError::Invalid(_) => ApiError::Unauthorized("invalid token".into()),
        })?;
        Ok(Auth { principal, via })
    }
}

/// Request id (set by the request-id layer) for the audit log.
#[derive(Clone, Debug)]
pub struct RequestCtx {
    /// The `x-request-id` value.
    pub request_id: String,
}

impl FromRequestParts<AppState> for RequestCtx {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _: &AppState) -> Result<Self, Self::Rejection> {
        let request_id = parts
            .headers
            .get("x-request-id")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .chars()
            .take(64)
            .collect();
        Ok(RequestCtx { request_id })
    }
}

impl RequestCtx {
    /// Audit context for a mutation by `auth` with `reason`, refusing an empty reason.
    pub fn audit(&self, auth: &Auth, reason: &str) -> Result<AuditCtx, ApiError> {
        let reason = reason.trim();
        if reason.is_empty() {
            return Err(ApiError::bad_field("reason", "\"\"", "a reason is required for every change"));
        }
        if reason.len() > 1000 {
            return Err(ApiError::bad_field(
                "reason",
                format!("{} bytes", reason.len()),
                "must be at most 1000 bytes",
            ));
        }
        Ok(AuditCtx {
            actor: auth.principal.actor.clone(),
            via: auth.via.to_string(),
            request_id: self.request_id.clone(),
            reason: reason.to_string(),
        })
    }
}

/// A JSON body decoded with path-aware errors: 415 without a JSON content type, 413 past
/// the body limit, 400 naming the field for malformed JSON, wrong types or unknown fields.
#[derive(Debug)]
pub struct ApiJson<T>(pub T);

impl<T: DeserializeOwned> FromRequest<AppState> for ApiJson<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &AppState) -> Result<Self, Self::Rejection> {
        let ct = req.headers().get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).unwrap_or("");
        let mime = ct.split(';').next().unwrap_or("").trim().to_ascii_lowercase();
        if mime != "application/json" && !(mime.starts_with("application/") && mime.ends_with("+json")) {
            return Err(ApiError::UnsupportedMediaType(format!(
                "expected Content-Type: application/json, got {:?}",
                if ct.is_empty() { "nothing" } else { ct }
            )));
        }
        let limit = state.max_body_bytes;
        let bytes = axum::body::to_bytes(req.into_body(), limit).await.map_err(|e| {
            let too_large = std::error::Error::source(&e)
                .and_then(|s| s.downcast_ref::<http_body_util::LengthLimitError>())
                .is_some()
                || e.to_string().contains("length limit");
            if too_large {
                ApiError::TooLarge { limit }
            } else {
                ApiError::bad_request("could not read the request body")
            }
        })?;
        levee_agent::policy::decode_json::<T>(&bytes).map(ApiJson).map_err(|e| ApiError::from_policy(e, ""))
    }
}

//! `POST /api/v1/auth/login` and `POST /api/v1/auth/logout`.

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use levee_agent::policy::Timestamp;
use serde::{Deserialize, Serialize};

use super::{ApiError, ApiJson, ApiResult, Auth};
use crate::actions::{LoginAttempt, Via};
use crate::db::Role;
use crate::web::{AppState, ClientAddr, RequestId};

/// Body of `POST /auth/login`.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct LoginRequest {
    /// Login name.
    pub username: String,
    /// The user's password.
    pub password: String,
}

/// A new session.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct LoginResponse {
    /// Bearer token (JWT, HS256, audience `levee-api`).
    pub token: String,
    /// Always `Bearer`.
    pub token_type: &'static str,
    /// When the token stops working (RFC 3339).
    pub expires_at: Timestamp,
    /// What the user may do.
    pub role: Role,
}

/// Exchanges a username and password for a session token (12 h). Failed logins are
/// throttled per (account, client address) and per client address, never per account
/// alone: 429 with the wait in `Retry-After`, and the password is not checked meanwhile.
#[utoipa::path(post, path = "/api/v1/auth/login", tag = "auth", request_body = LoginRequest,
    responses((status = 200, body = LoginResponse), (status = 401, body = super::Problem),
              (status = 429, body = super::Problem)))]
pub async fn login(
    State(state): State<AppState>,
    ClientAddr(client): ClientAddr,
    RequestId(request_id): RequestId,
    ApiJson(req): ApiJson<LoginRequest>,
) -> ApiResult<Json<LoginResponse>> {
    let attempt =
        LoginAttempt { username: &req.username, password: &req.password, client, via: Via::Api, request_id };
    let session = state.actions.login(&state.logins, attempt).await?;
    Ok(Json(LoginResponse {
        token: session.token,
        token_type: "Bearer",
        expires_at: Timestamp::from_unix_ms((session.expires_at as i64).saturating_mul(1000)),
        role: session.role,
    }))
}

/// Ends the caller's session token before its expiry: it is refused from now on. An API
/// token has no session to end (403): it is revoked with `DELETE /api/v1/tokens/{id}`.
#[utoipa::path(post, path = "/api/v1/auth/logout", tag = "auth",
    responses((status = 204, description = "the session token no longer works"),
              (status = 401, body = super::Problem),
              (status = 403, body = super::Problem, description = "an API token, not a session")),
    security(("bearer" = [])))]
pub async fn logout(State(state): State<AppState>, auth: Auth) -> ApiResult<StatusCode> {
    if auth.principal.actor.starts_with("token:") {
        return Err(ApiError::Forbidden(
            "this is an API token, not a session: revoke it with DELETE /api/v1/tokens/{id}".into(),
        ));
    }
    state.actions.end_session(&auth.principal.jti).await?;
    Ok(StatusCode::NO_CONTENT)
}

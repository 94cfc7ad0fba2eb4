//! `POST /api/v1/auth/login` and `POST /api/v1/auth/logout`.

use std::collections::HashMap;
use std::time::Duration;

use axum::Json;
use axum::extract::State;
use serde::{Deserialize, Serialize};
use tokio::time::Instant;

use super::{ApiJson, AppState, Auth};
use crate::auth::verify_password;
use crate::db::Role;
use crate::error::{ApiError, ApiResult};

/// Failed logins allowed per username within [`LOGIN_WINDOW`].
pub const LOGIN_MAX_FAILURES: u32 = 10;
/// Window of the failed-login count.
pub const LOGIN_WINDOW: Duration = Duration::from_secs(300);

/// Counts failed logins per username.
#[derive(Debug, Default)]
pub struct LoginLimiter {
    failures: tokio::sync::Mutex<HashMap<String, (u32, Instant)>>,
}

impl LoginLimiter {
    /// Whether another attempt for `user` is allowed now.
    pub async fn allowed(&self, user: &str) -> bool {
        let mut m = self.failures.lock().await;
        match m.get(user) {
            Some((n, since)) if since.elapsed() < LOGIN_WINDOW => *n < LOGIN_MAX_FAILURES,
            Some(_) => {
                m.remove(user);
                true
            }
            None => true,
        }
    }

    /// Records a failure.
    pub async fn failed(&self, user: &str) {
        let mut m = self.failures.lock().await;
        if m.len() > 100_000 {
            m.retain(|_, (_, since)| since.elapsed() < LOGIN_WINDOW);
        }
        let e = m.entry(user.to_string()).or_insert((0, Instant::now()));
        if e.1.elapsed() >= LOGIN_WINDOW {
            *e = (0, Instant::now());
        }
        e.0 += 1;
    }

    /// Clears the count after a success.
    pub async fn succeeded(&self, user: &str) {
        self.failures.lock().await.remove(user);
    }
}

/// Login request.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct LoginRequest {
    /// Username.
    pub username: String,
    /// Password.
    pub password: String,
}

/// Login answer.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct LoginResponse {
    /// Bearer token (JWT, HS256, audience `levee-api`).
    pub token: String,
    /// Always `Bearer`.
    pub token_type: &'static str,
    /// Expiry, seconds since the epoch.
    pub expires_at: u64,
    /// Role of the user.
    pub role: Role,
}

/// Checks username and password and returns a session token.
pub(crate) async fn check_login(
    state: &AppState,
    username: &str,
    password: &str,
) -> ApiResult<LoginResponse> {
    if username.is_empty() || username.len() > 64 || password.len() > 1024 {
        return Err(ApiError::Unauthorized("wrong username or password".into()));
    }
    if !state.logins.allowed(username).await {
        return Err(ApiError::TooManyRequests(format!(
            "too many failed logins for this user; try again in {} minutes",
            LOGIN_WINDOW.as_secs() / 60
        )));
    }
    let user = state.store.user(username).await?;
    // Verify against a dummy hash when the user is unknown, so timing does not tell.
    let (phc, known) = match &user {
        Some(u) if !u.disabled => (u.password_hash.clone(), true),
        _ => (DUMMY_HASH.to_string(), false),
    };
    let ok = verify_password(password.to_string(), phc).await && known;
    let Some(user) = user.filter(|_| ok) else {
        state.logins.failed(username).await;
        return Err(ApiError::Unauthorized("wrong username or password".into()));
    };
    state.logins.succeeded(username).await;
    let (token, expires_at) = state.keys.session(&user.username, user.role)?;
    Ok(LoginResponse { token, token_type: "Bearer", expires_at, role: user.role })
}

const DUMMY_HASH: &str =
    "$argon2id$v=19$m=19456,t=2,p=1$c29tZXNhbHRzb21lc2FsdA$Jr1h7BO0U6A4lR2UMmNGZhbNvnxKkPfJuLx9c/7nQg8";

/// Exchanges a username and password for a session token (12 h).
#[utoipa::path(post, path = "/api/v1/auth/login", tag = "auth", request_body = LoginRequest,
    responses((status = 200, body = LoginResponse), (status = 401, body = crate::error::Problem),
              (status = 429, body = crate::error::Problem)))]
pub async fn login(
    State(state): State<AppState>,
    ApiJson(req): ApiJson<LoginRequest>,
) -> ApiResult<Json<LoginResponse>> {
    check_login(&state, &req.username, &req.password).await.map(Json)
}

/// Ends the caller's session token before its expiry: it is refused from now on. API
/// tokens are revoked with `DELETE /api/v1/tokens/{id}` instead.
#[utoipa::path(post, path = "/api/v1/auth/logout", tag = "auth",
    responses((status = 204, description = "the session token no longer works"),
              (status = 400, body = crate::error::Problem), (status = 401, body = crate::error::Problem)),
    security(("bearer" = [])))]
pub async fn logout(State(state): State<AppState>, auth: Auth) -> ApiResult<axum::http::StatusCode> {
    if auth.principal.actor.starts_with("token:") {
        return Err(ApiError::bad_request(
            "this is an API token, not a session: revoke it with DELETE /api/v1/tokens/{id}",
        ));
    }
    end_session(&state, &auth.principal.jti).await?;
    Ok(axum::http::StatusCode::NO_CONTENT)
}

/// Records a session token as ended (kept until it would have expired anyway).
pub async fn end_session(state: &AppState, jti: &str) -> ApiResult<()> {
    let until = crate::db::now_ms() + crate::auth::SESSION_TTL.as_millis() as i64;
    state.store.revoke_session(jti, until).await?;
    Ok(())
}

//! API and agent tokens, and users (admin).

use std::time::Duration;

use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use serde::{Deserialize, Serialize};

use super::envs::valid_name;
use super::{ApiJson, AppState, Auth, RequestCtx};
use crate::auth::{TOKEN_TTL, hash_password};
use crate::db::{AuditRow, Role, TokenKind, TokenRow, now_ms};
use crate::error::{ApiError, ApiResult};

/// Body of `POST /tokens`.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateToken {
    /// `api` (automation, with a role) or `agent` (sync, scoped to environment + services).
    pub kind: TokenKind,
    /// Human name, e.g. `checkout-prod` or `deploy-bot`.
    pub name: String,
    /// Role of an API token (default viewer).
    #[serde(default)]
    pub role: Option<Role>,
    /// Environment of an agent token.
    #[serde(default)]
    pub environment: Option<String>,
    /// Services of an agent token.
    #[serde(default)]
    pub services: Vec<String>,
    /// Lifetime, e.g. `90d` (default 365 days, at most 10 years).
    #[serde(default, with = "humantime_serde::option")]
    #[schema(value_type = Option<String>, example = "90d")]
    pub expires_in: Option<Duration>,
    /// Why.
    pub reason: String,
}

/// A freshly minted token: the only time its secret is shown.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct MintedToken {
    /// Token metadata.
    #[serde(flatten)]
    pub meta: TokenRow,
    /// The bearer token. Store it now; it is not shown again.
    pub token: String,
}

fn audit_row(
    auth: &Auth,
    ctx: &RequestCtx,
    reason: &str,
    action: &str,
    target: &str,
    after: Option<String>,
) -> AuditRow {
    AuditRow {
        at: now_ms(),
        actor: auth.principal.actor.clone(),
        via: auth.via.to_string(),
        request_id: ctx.request_id.clone(),
        action: action.into(),
        target: target.into(),
        outcome: "ok".into(),
        reason: reason.into(),
        after,
        ..Default::default()
    }
}

/// Mints a token (admin).
#[utoipa::path(post, path = "/api/v1/tokens", tag = "tokens", request_body = CreateToken,
    responses((status = 201, body = MintedToken), (status = 400, body = crate::error::Problem),
              (status = 403, body = crate::error::Problem)))]
pub async fn create(
    State(s): State<AppState>,
    auth: Auth,
    ctx: RequestCtx,
    ApiJson(req): ApiJson<CreateToken>,
) -> ApiResult<(StatusCode, Json<MintedToken>)> {
    auth.require(Role::Admin)?;
    let audit = ctx.audit(&auth, &req.reason)?;
    valid_name("name", &req.name)?;
    let ttl = req.expires_in.unwrap_or(TOKEN_TTL);
    if ttl < Duration::from_secs(60) || ttl > Duration::from_secs(10 * 365 * 86400) {
        return Err(ApiError::bad_field(
            "expires_in",
            humantime::format_duration(ttl).to_string(),
            "must be between 1m and 3650d",
        ));
    }
    let now = now_ms();
    let row = match req.kind {
        TokenKind::Agent => {
            let env = req.environment.clone().ok_or_else(|| {
                ApiError::bad_field("environment", "", "an agent token needs an environment")
            })?;
            valid_name("environment", &env)?;
            if req.services.is_empty() || req.services.len() > 100 {
                return Err(ApiError::bad_field("services", "[]", "an agent token needs 1 to 100 services"));
            }
            for (i, svc) in req.services.iter().enumerate() {
                valid_name(&format!("services[{i}]"), svc)?;
            }
            if req.role.is_some() {
                return Err(ApiError::bad_field("role", "", "agent tokens have no role; omit it"));
            }
            if s.store.environment(&env).await?.is_none() {
                return Err(ApiError::invalid_field(
                    "environment",
                    format!("{env:?}"),
                    "no such environment",
                ));
            }
            TokenRow {
                id: uuid::Uuid::new_v4().to_string(),
                kind: TokenKind::Agent,
                name: req.name.clone(),
                role: None,
                environment: Some(env),
                services: req.services.clone(),
                created_by: auth.principal.actor.clone(),
                created_at: now,
                expires_at: now + ttl.as_millis() as i64,
                revoked_at: None,
            }
        }
        TokenKind::Api => {
            if req.environment.is_some() || !req.services.is_empty() {
                return Err(ApiError::bad_field(
                    "environment",
                    "",
                    "API tokens are not scoped to services; omit it",
                ));
            }
            TokenRow {
                id: uuid::Uuid::new_v4().to_string(),
                kind: TokenKind::Api,
                name: req.name.clone(),
                role: Some(req.role.unwrap_or(Role::Viewer)),
                environment: None,
                services: Vec::new(),
                created_by: auth.principal.actor.clone(),
                created_at: now,
                expires_at: now + ttl.as_millis() as i64,
                revoked_at: None,
            }
        }
    };
    let token = s.keys.mint(&row)?;
    s.store.insert_token(&row).await?;
    let meta = serde_json::to_string(&row).ok();
    s.store
        .append_audit(&audit_row(
            &auth,
            &ctx,
            &audit.reason,
            "token.create",
            &format!("token {}", row.name),
            meta,
        ))
        .await?;
    Ok((StatusCode::CREATED, Json(MintedToken { meta: row, token })))
}

/// Lists tokens (admin); secrets are never shown again.
#[utoipa::path(get, path = "/api/v1/tokens", tag = "tokens", responses((status = 200, body = [TokenRow])))]
pub async fn list(State(s): State<AppState>, auth: Auth) -> ApiResult<Json<Vec<TokenRow>>> {
    auth.require(Role::Admin)?;
    Ok(Json(s.store.tokens().await?))
}

/// Query of `DELETE /tokens/{id}`.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
pub struct RevokeQuery {
    /// Why (required).
    pub reason: Option<String>,
}

/// Revokes a token at once (admin): its agent streams are refused from the next connect.
#[utoipa::path(delete, path = "/api/v1/tokens/{id}", tag = "tokens", params(("id" = String, Path), RevokeQuery),
    responses((status = 204), (status = 404, body = crate::error::Problem)))]
pub async fn revoke(
    State(s): State<AppState>,
    auth: Auth,
    ctx: RequestCtx,
    Path(id): Path<String>,
    axum::extract::Query(q): axum::extract::Query<RevokeQuery>,
) -> ApiResult<StatusCode> {
    auth.require(Role::Admin)?;
    let audit = ctx.audit(&auth, q.reason.as_deref().unwrap_or(""))?;
    if !s.store.revoke_token(&id).await? {
        return Err(ApiError::NotFound(format!("no token {id:?}")));
    }
    s.store
        .append_audit(&audit_row(&auth, &ctx, &audit.reason, "token.revoke", &format!("token {id}"), None))
        .await?;
    Ok(StatusCode::NO_CONTENT)
}

/// A user as listed.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct UserInfo {
    /// Username.
    pub username: String,
    /// Role.
    pub role: Role,
    /// Disabled.
    pub disabled: bool,
    /// Created at, ms.
    pub created_at: i64,
}

/// Body of `POST /users`.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateUser {
    /// Username.
    pub username: String,
    /// Password (at least 12 characters).
    pub password: String,
    /// Role.
    pub role: Role,
    /// Why.
    pub reason: String,
}

/// Lists users (admin).
#[utoipa::path(get, path = "/api/v1/users", tag = "users", responses((status = 200, body = [UserInfo])))]
pub async fn list_users(State(s): State<AppState>, auth: Auth) -> ApiResult<Json<Vec<UserInfo>>> {
    auth.require(Role::Admin)?;
    Ok(Json(
        s.store
            .users()
            .await?
            .into_iter()
            .map(|u| UserInfo {
                username: u.username,
                role: u.role,
                disabled: u.disabled,
                created_at: u.created_at,
            })
            .collect(),
    ))
}

/// Creates a user (admin).
#[utoipa::path(post, path = "/api/v1/users", tag = "users", request_body = CreateUser,
    responses((status = 201, body = UserInfo), (status = 409, body = crate::error::Problem)))]
pub async fn create_user(
    State(s): State<AppState>,
    auth: Auth,
    ctx: RequestCtx,
    ApiJson(req): ApiJson<CreateUser>,
) -> ApiResult<(StatusCode, Json<UserInfo>)> {
    auth.require(Role::Admin)?;
    let audit = ctx.audit(&auth, &req.reason)?;
    valid_name("username", &req.username)?;
    if req.password.chars().count() < 12 || req.password.len() > 1024 {
        return Err(ApiError::bad_field("password", "", "must be 12 to 1024 characters long"));
    }
    let hash = hash_password(req.password).await?;
    if !s.store.create_user(&req.username, &hash, req.role).await? {
        return Err(ApiError::AlreadyExists(format!("user {:?} already exists", req.username)));
    }
    let after = serde_json::json!({"username": req.username, "role": req.role}).to_string();
    s.store
        .append_audit(&audit_row(
            &auth,
            &ctx,
            &audit.reason,
            "user.create",
            &format!("user {}", req.username),
            Some(after),
        ))
        .await?;
    Ok((
        StatusCode::CREATED,
        Json(UserInfo { username: req.username, role: req.role, disabled: false, created_at: now_ms() }),
    ))
}

//! API and agent tokens, and users (admin).

use std::time::Duration;

use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use serde::{Deserialize, Serialize};

use super::{ApiJson, ApiQuery, ApiResult, Auth};
use crate::actions::{Action, NewToken, NewUser, Reason, Rotation, UserChange};
use crate::db::{Role, TokenKind, TokenRow, now_ms};
use crate::web::{AppState, RequestId};

/// Body of `POST /tokens`.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateToken {
    /// `api` (automation, with a role), `agent` (sync, scoped to environment + services) or
    /// `flags` (OFREP flag evaluation only, scoped like an agent token).
    pub kind: TokenKind,
    /// A name for people, e.g. `checkout-prod` or `deploy-bot` (the rule for names is in
    /// the 400 answer to a bad one).
    pub name: String,
    /// Role of an API token; default viewer. An agent token has none.
    #[serde(default)]
    pub role: Option<Role>,
    /// The one environment an agent or flags token may read; required for those.
    #[serde(default)]
    pub environment: Option<String>,
    /// The services an agent or flags token may read; required for those.
    #[serde(default)]
    pub services: Vec<String>,
    /// Lifetime, e.g. `30d`; default 90 days (the allowed range is in the 422 answer).
    #[serde(default, with = "levee_agent::policy::duration::option")]
    #[schema(value_type = Option<levee_agent::policy::duration::Text>, example = "90d")]
    pub expires_in: Option<Duration>,
    /// Why, recorded in the audit log; required.
    pub reason: String,
}

/// A freshly minted token: the only time its secret is shown.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct MintedToken {
    /// What is stored about the token.
    #[serde(flatten)]
    pub meta: TokenRow,
    /// The bearer token. Store it now; it is not shown again.
    pub token: String,
}

/// Mints a token (admin).
#[utoipa::path(post, path = "/api/v1/tokens", tag = "tokens", request_body = CreateToken,
    responses((status = 201, body = MintedToken), (status = 400, body = super::Problem),
              (status = 403, body = super::Problem)))]
pub async fn create(
    State(s): State<AppState>,
    auth: Auth,
    rid: RequestId,
    ApiJson(req): ApiJson<CreateToken>,
) -> ApiResult<(StatusCode, Json<MintedToken>)> {
    let by = auth.actor(Action::TokenCreate, &rid)?;
    let reason = Reason::parse(&req.reason)?;
    let new = NewToken::new(
        req.kind,
        &req.name,
        req.role,
        req.environment.as_deref(),
        &req.services,
        req.expires_in,
    )?;
    let minted = s.actions.create_token(&by, &reason, new).await?;
    Ok((StatusCode::CREATED, Json(MintedToken { meta: minted.row, token: minted.token })))
}

/// Lists tokens (admin); secrets are never shown again.
#[utoipa::path(get, path = "/api/v1/tokens", tag = "tokens", responses((status = 200, body = [TokenRow])))]
pub async fn list(State(s): State<AppState>, auth: Auth) -> ApiResult<Json<Vec<TokenRow>>> {
    auth.require(Role::Admin)?;
    Ok(Json(s.store.tokens().await?))
}

/// Query of `DELETE /tokens/{id}`.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct RevokeQuery {
    /// Why, recorded in the audit log; required.
    pub reason: Option<String>,
}

/// Revokes a token at once (admin): its agent streams are refused from the next connect.
#[utoipa::path(delete, path = "/api/v1/tokens/{id}", tag = "tokens", params(("id" = String, Path), RevokeQuery),
    responses((status = 204), (status = 404, body = super::Problem)))]
pub async fn revoke(
    State(s): State<AppState>,
    auth: Auth,
    rid: RequestId,
    Path(id): Path<String>,
    ApiQuery(q): ApiQuery<RevokeQuery>,
) -> ApiResult<StatusCode> {
    let by = auth.actor(Action::TokenRevoke, &rid)?;
    let reason = Reason::parse(q.reason.as_deref().unwrap_or(""))?;
    s.actions.revoke_token(&by, &reason, &id).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Body of `POST /tokens/{id}/rotate`.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RotateToken {
    /// How long the old token keeps working beside the new one, e.g. `1h` (default) or
    /// `0s` to end it now; at most 30 days, never past its own expiry.
    #[serde(default, with = "levee_agent::policy::duration::option")]
    #[schema(value_type = Option<levee_agent::policy::duration::Text>, example = "1h")]
    pub overlap: Option<Duration>,
    /// Lifetime of the new token, e.g. `90d`; default: the old token's lifetime.
    #[serde(default, with = "levee_agent::policy::duration::option")]
    #[schema(value_type = Option<levee_agent::policy::duration::Text>, example = "90d")]
    pub expires_in: Option<Duration>,
    /// Why, recorded in the audit log; required.
    pub reason: String,
}

/// A rotation: the new token (its secret shown this once) and the old one, whose
/// `revoked_at` is the end of the overlap.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct RotatedToken {
    /// The new token, of the old one's kind, name and scope.
    #[serde(flatten)]
    pub minted: MintedToken,
    /// The old token as it is now.
    pub replaced: TokenRow,
}

/// Rotates a token (admin): mints one of the same kind, name and scope and ends the old
/// one after `overlap`, so every instance can move to the new token without a restart
/// while the old one still works. Agent streams opened with the old token end when the
/// overlap does (on every replica).
#[utoipa::path(post, path = "/api/v1/tokens/{id}/rotate", tag = "tokens", request_body = RotateToken,
    params(("id" = String, Path)),
    responses((status = 201, body = RotatedToken), (status = 400, body = super::Problem),
              (status = 403, body = super::Problem), (status = 404, body = super::Problem),
              (status = 409, body = super::Problem)))]
pub async fn rotate(
    State(s): State<AppState>,
    auth: Auth,
    rid: RequestId,
    Path(id): Path<String>,
    ApiJson(req): ApiJson<RotateToken>,
) -> ApiResult<(StatusCode, Json<RotatedToken>)> {
    let by = auth.actor(Action::TokenRotate, &rid)?;
    let reason = Reason::parse(&req.reason)?;
    let rotation = Rotation::new(req.overlap, req.expires_in)?;
    let rotated = s.actions.rotate_token(&by, &reason, &id, rotation).await?;
    Ok((
        StatusCode::CREATED,
        Json(RotatedToken {
            minted: MintedToken { meta: rotated.minted.row, token: rotated.minted.token },
            replaced: rotated.replaced,
        }),
    ))
}

/// A user as listed.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct UserInfo {
    /// Login name.
    pub username: String,
    /// What the user may do.
    pub role: Role,
    /// A disabled user cannot log in and its sessions stop working.
    pub disabled: bool,
    /// Creation time (RFC 3339).
    #[serde(with = "levee_agent::policy::rfc3339")]
    #[schema(value_type = String, format = DateTime)]
    pub created_at: i64,
}

/// Body of `POST /users`.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateUser {
    /// Login name (the rule for names is in the 400 answer to a bad one).
    pub username: String,
    /// The password (its allowed length is in the 400 answer to a bad one).
    pub password: String,
    /// What the user may do.
    pub role: Role,
    /// Why, recorded in the audit log; required.
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
    responses((status = 201, body = UserInfo), (status = 409, body = super::Problem)))]
pub async fn create_user(
    State(s): State<AppState>,
    auth: Auth,
    rid: RequestId,
    ApiJson(req): ApiJson<CreateUser>,
) -> ApiResult<(StatusCode, Json<UserInfo>)> {
    let by = auth.actor(Action::UserCreate, &rid)?;
    let reason = Reason::parse(&req.reason)?;
    let (username, role) = (req.username.clone(), req.role);
    let new = NewUser::new(&req.username, req.password, req.role)?;
    s.actions.create_user(&by, &reason, new).await?;
    Ok((StatusCode::CREATED, Json(UserInfo { username, role, disabled: false, created_at: now_ms() })))
}

/// Body of `PATCH /users/{username}`.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct UpdateUser {
    /// A new password (its allowed length is in the 400 answer to a bad one).
    #[serde(default)]
    pub password: Option<String>,
    /// A new role.
    #[serde(default)]
    pub role: Option<Role>,
    /// `true` disables the user (it cannot log in), `false` enables it again. Nobody can
    /// disable or demote themselves.
    #[serde(default)]
    pub disabled: Option<bool>,
    /// Why, recorded in the audit log; required.
    pub reason: String,
}

/// Changes a user's password, role and/or whether it is disabled (admin). Audited as
/// `user.update` (never the password); every session the user had open ends at once.
#[utoipa::path(patch, path = "/api/v1/users/{username}", tag = "users", request_body = UpdateUser,
    params(("username" = String, Path)),
    responses((status = 204), (status = 400, body = super::Problem), (status = 403, body = super::Problem),
              (status = 404, body = super::Problem)))]
pub async fn update_user(
    State(s): State<AppState>,
    auth: Auth,
    rid: RequestId,
    Path(username): Path<String>,
    ApiJson(req): ApiJson<UpdateUser>,
) -> ApiResult<StatusCode> {
    let by = auth.actor(Action::UserUpdate, &rid)?;
    let reason = Reason::parse(&req.reason)?;
    let change = UserChange::new(&username, req.password, req.role, req.disabled)?;
    s.actions.update_user(&by, &reason, change).await?;
    Ok(StatusCode::NO_CONTENT)
}

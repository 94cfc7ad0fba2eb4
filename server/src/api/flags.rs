//! Flags (kill switches and tunables) of a service.

use std::collections::BTreeMap;

use axum::Json;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use levee_agent::policy::{Flag, FlagType, Rollout, ServiceConfig, StalePolicy, Timestamp};
use serde::Deserialize;

use super::envs::valid_name;
use super::services::{commit, if_match, write_response};
use super::{ApiJson, AppState, Auth, RequestCtx};
use crate::db::{Change, Parts, Role};
use crate::error::{ApiError, ApiResult};

/// Body of `PUT .../flags/{key}`: the whole flag plus a reason.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PutFlag {
    /// Value type.
    #[serde(rename = "type")]
    pub kind: FlagType,
    /// Value, of that type.
    #[schema(value_type = Object)]
    pub value: serde_json::Value,
    /// What the flag does.
    #[serde(default)]
    pub description: String,
    /// Owner.
    #[serde(default)]
    pub owner: String,
    /// The flag is removed (agents fall back to their default) after this instant.
    #[serde(default)]
    pub expires_at: Option<Timestamp>,
    /// Behaviour while an agent is offline: `"hold"` or `{"revert_after": "1h"}`.
    #[serde(default)]
    #[schema(value_type = Object, example = json!("hold"))]
    pub stale: StalePolicy,
    /// Gradual rollout (bool flags).
    #[serde(default)]
    pub rollout: Option<Rollout>,
    /// Why.
    pub reason: String,
}

/// Body of `PATCH .../flags/{key}`: flip the value, keep the rest.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PatchFlag {
    /// New value, of the flag's type.
    #[schema(value_type = Object)]
    pub value: serde_json::Value,
    /// New expiry (omit to keep the current one).
    #[serde(default)]
    pub expires_at: Option<Timestamp>,
    /// Why.
    pub reason: String,
}

/// Query of `DELETE .../flags/{key}`.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
pub struct ReasonQuery {
    /// Why (required).
    pub reason: Option<String>,
}

async fn current_flags(s: &AppState, env: &str, svc: &str) -> ApiResult<BTreeMap<String, Flag>> {
    let snap = s
        .store
        .latest_snapshot(env, svc)
        .await?
        .ok_or_else(|| ApiError::NotFound(format!("no service {svc:?} in environment {env:?}")))?;
    let cfg: ServiceConfig = serde_json::from_str(&snap.body).map_err(|e| ApiError::Internal(e.into()))?;
    Ok(cfg.flags)
}

/// Flags of a service.
#[utoipa::path(get, path = "/api/v1/environments/{env}/services/{svc}/flags", tag = "flags",
    params(("env" = String, Path), ("svc" = String, Path)),
    responses((status = 200, body = BTreeMap<String, Flag>), (status = 404, body = crate::error::Problem)))]
pub async fn list(
    State(s): State<AppState>,
    _a: Auth,
    Path((env, svc)): Path<(String, String)>,
) -> ApiResult<Json<BTreeMap<String, Flag>>> {
    Ok(Json(current_flags(&s, &env, &svc).await?))
}

/// One flag.
#[utoipa::path(get, path = "/api/v1/environments/{env}/services/{svc}/flags/{key}", tag = "flags",
    params(("env" = String, Path), ("svc" = String, Path), ("key" = String, Path)),
    responses((status = 200, body = Flag), (status = 404, body = crate::error::Problem)))]
pub async fn get_one(
    State(s): State<AppState>,
    _a: Auth,
    Path((env, svc, key)): Path<(String, String, String)>,
) -> ApiResult<Json<Flag>> {
    current_flags(&s, &env, &svc)
        .await?
        .remove(&key)
        .map(Json)
        .ok_or_else(|| ApiError::NotFound(format!("no flag {key:?} in service {svc:?}")))
}

/// Creates or replaces a flag (operator). Pushed to agents at once.
#[utoipa::path(put, path = "/api/v1/environments/{env}/services/{svc}/flags/{key}", tag = "flags",
    request_body = PutFlag,
    params(("env" = String, Path), ("svc" = String, Path), ("key" = String, Path),
           ("If-Match" = Option<String>, Header, description = "Optional: current revision")),
    responses((status = 200, body = super::services::WriteResult), (status = 409, body = crate::error::Problem),
              (status = 422, body = crate::error::Problem)))]
pub async fn put(
    State(s): State<AppState>,
    auth: Auth,
    ctx: RequestCtx,
    headers: HeaderMap,
    Path((env, svc, key)): Path<(String, String, String)>,
    ApiJson(req): ApiJson<PutFlag>,
) -> ApiResult<Response> {
    auth.require(Role::Operator)?;
    valid_name("key", &key)?;
    let expected = if_match(&headers, false)?;
    let audit = ctx.audit(&auth, &req.reason)?;
    let flag = Flag {
        kind: req.kind,
        value: req.value,
        description: req.description,
        owner: req.owner,
        expires_at: req.expires_at,
        stale: req.stale,
        rollout: req.rollout,
    };
    if let Err(v) = flag.validate() {
        return Err(ApiError::from_policy(v.into(), ""));
    }
    let target = format!("flag {key}");
    let change = Change { env: &env, service: &svc, action: "flag.set", target: &target, expected };
    let (c, lints) = commit(&s, change, &audit, |p| {
        let before = p.flags.get(&key).and_then(|f| serde_json::to_string(f).ok());
        let after = serde_json::to_string(&flag).ok();
        p.flags.insert(key.clone(), flag);
        Ok((before, after))
    })
    .await?;
    Ok(write_response(c, lints, StatusCode::OK))
}

/// Changes a flag's value (one-click switch), keeping its metadata (operator).
#[utoipa::path(patch, path = "/api/v1/environments/{env}/services/{svc}/flags/{key}", tag = "flags",
    request_body = PatchFlag,
    params(("env" = String, Path), ("svc" = String, Path), ("key" = String, Path),
           ("If-Match" = Option<String>, Header, description = "Optional: current revision")),
    responses((status = 200, body = super::services::WriteResult), (status = 404, body = crate::error::Problem),
              (status = 422, body = crate::error::Problem)))]
pub async fn patch(
    State(s): State<AppState>,
    auth: Auth,
    ctx: RequestCtx,
    headers: HeaderMap,
    Path((env, svc, key)): Path<(String, String, String)>,
    ApiJson(req): ApiJson<PatchFlag>,
) -> ApiResult<Response> {
    auth.require(Role::Operator)?;
    let expected = if_match(&headers, false)?;
    let audit = ctx.audit(&auth, &req.reason)?;
    let target = format!("flag {key}");
    let change = Change { env: &env, service: &svc, action: "flag.set", target: &target, expected };
    let (c, lints) =
        commit(&s, change, &audit, |p| set_flag_value(p, &svc, &key, req.value, req.expires_at)).await?;
    Ok(write_response(c, lints, StatusCode::OK))
}

/// The edit behind a one-click switch (API `PATCH` and the UI): replaces the value of an
/// existing flag, checking its type, and its expiry when one is given. Returns the flag's
/// JSON before and after, for the audit row.
pub(crate) fn set_flag_value(
    p: &mut Parts,
    svc: &str,
    key: &str,
    value: serde_json::Value,
    expires_at: Option<Timestamp>,
) -> Result<(Option<String>, Option<String>), ApiError> {
    let flag = p.flags.get_mut(key).ok_or_else(|| {
        ApiError::NotFound(format!("no flag {key:?} in service {svc:?}; create it with PUT"))
    })?;
    let before = serde_json::to_string(flag).ok();
    if !flag.kind.accepts(&value) {
        return Err(ApiError::invalid_field(
            "value",
            value.to_string(),
            format!("must be a {} value, as the flag's type says", flag.kind.as_str()),
        ));
    }
    flag.value = value;
    if expires_at.is_some() {
        flag.expires_at = expires_at;
    }
    Ok((before, serde_json::to_string(flag).ok()))
}

/// Deletes a flag (operator); agents fall back to their compiled-in default.
#[utoipa::path(delete, path = "/api/v1/environments/{env}/services/{svc}/flags/{key}", tag = "flags",
    params(("env" = String, Path), ("svc" = String, Path), ("key" = String, Path), ReasonQuery),
    responses((status = 200, body = super::services::WriteResult), (status = 404, body = crate::error::Problem)))]
pub async fn delete(
    State(s): State<AppState>,
    auth: Auth,
    ctx: RequestCtx,
    headers: HeaderMap,
    Path((env, svc, key)): Path<(String, String, String)>,
    Query(q): Query<ReasonQuery>,
) -> ApiResult<Response> {
    auth.require(Role::Operator)?;
    let expected = if_match(&headers, false)?;
    let audit = ctx.audit(&auth, q.reason.as_deref().unwrap_or(""))?;
    let target = format!("flag {key}");
    let change = Change { env: &env, service: &svc, action: "flag.delete", target: &target, expected };
    let (c, lints) = commit(&s, change, &audit, |p| {
        let old = p
            .flags
            .remove(&key)
            .ok_or_else(|| ApiError::NotFound(format!("no flag {key:?} in service {svc:?}")))?;
        Ok((serde_json::to_string(&old).ok(), None))
    })
    .await?;
    Ok(write_response(c, lints, StatusCode::OK))
}

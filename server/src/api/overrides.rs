//! Breaker overrides and fault-injection rules.

use axum::Json;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use levee_agent::policy::{
    BreakerOverride, BreakerOverrideState, FaultAction, FaultRule, ServiceConfig, Timestamp,
};
use serde::Deserialize;

use super::envs::valid_name;
use super::flags::ReasonQuery;
use super::services::{commit, if_match, write_response};
use super::{ApiJson, AppState, Auth, RequestCtx};
use crate::db::{Change, Parts, Role};
use crate::error::{ApiError, ApiResult};

/// Body of `PUT .../breaker-overrides/{dependency}`.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PutOverride {
    /// Operation; omit for the dependency-level breaker.
    #[serde(default)]
    pub operation: Option<String>,
    /// Forced state.
    pub state: BreakerOverrideState,
    /// The override ends by itself after this instant.
    #[serde(default)]
    pub expires_at: Option<Timestamp>,
    /// Why.
    pub reason: String,
}

/// Query of `DELETE .../breaker-overrides/{dependency}`.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
pub struct DeleteOverrideQuery {
    /// Operation; omit for the dependency-level breaker.
    pub operation: Option<String>,
    /// Why (required).
    pub reason: Option<String>,
}

/// Body of `PUT .../faults/{id}`.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PutFault {
    /// Dependency.
    pub dependency: String,
    /// Operation; omit for all.
    #[serde(default)]
    pub operation: Option<String>,
    /// What happens.
    pub action: FaultAction,
    /// Share of attempts affected, percent 0..=100.
    pub percent: f64,
    /// Mandatory expiry.
    pub expires_at: Timestamp,
    /// Why.
    pub reason: String,
}

async fn current(s: &AppState, env: &str, svc: &str) -> ApiResult<ServiceConfig> {
    let snap = s
        .store
        .latest_snapshot(env, svc)
        .await?
        .ok_or_else(|| ApiError::NotFound(format!("no service {svc:?} in environment {env:?}")))?;
    serde_json::from_str(&snap.body).map_err(|e| ApiError::Internal(e.into()))
}

/// Breaker overrides of a service.
#[utoipa::path(get, path = "/api/v1/environments/{env}/services/{svc}/breaker-overrides", tag = "overrides",
    params(("env" = String, Path), ("svc" = String, Path)), responses((status = 200, body = [BreakerOverride])))]
pub async fn list_overrides(
    State(s): State<AppState>,
    _a: Auth,
    Path((env, svc)): Path<(String, String)>,
) -> ApiResult<Json<Vec<BreakerOverride>>> {
    Ok(Json(current(&s, &env, &svc).await?.breaker_overrides))
}

/// Forces a breaker open, closed or disabled (operator), optionally until an expiry.
#[utoipa::path(put, path = "/api/v1/environments/{env}/services/{svc}/breaker-overrides/{dep}", tag = "overrides",
    request_body = PutOverride, params(("env" = String, Path), ("svc" = String, Path), ("dep" = String, Path)),
    responses((status = 200, body = super::services::WriteResult), (status = 422, body = crate::error::Problem)))]
pub async fn put_override(
    State(s): State<AppState>,
    auth: Auth,
    ctx: RequestCtx,
    headers: HeaderMap,
    Path((env, svc, dep)): Path<(String, String, String)>,
    ApiJson(req): ApiJson<PutOverride>,
) -> ApiResult<Response> {
    auth.require(Role::Operator)?;
    let expected = if_match(&headers, false)?;
    let audit = ctx.audit(&auth, &req.reason)?;
    if let Some(exp) = req.expires_at
        && exp <= Timestamp::now()
    {
        return Err(ApiError::invalid_field("expires_at", exp.to_string(), "must be in the future"));
    }
    let o = BreakerOverride {
        dependency: dep.clone(),
        operation: req.operation.clone(),
        state: req.state,
        expires_at: req.expires_at,
        reason: audit.reason.clone(),
    };
    let target =
        format!("breaker {dep}{}", req.operation.as_deref().map(|o| format!(" {o}")).unwrap_or_default());
    let change = Change { env: &env, service: &svc, action: "breaker.override", target: &target, expected };
    let (c, lints) = commit(&s, change, &audit, |p| Ok(set_override(p, o))).await?;
    Ok(write_response(c, lints, StatusCode::OK))
}

/// The edit that sets a breaker override (API and UI). Returns the override's JSON before
/// and after, for the audit row.
pub(crate) fn set_override(p: &mut Parts, o: BreakerOverride) -> (Option<String>, Option<String>) {
    let k = (o.dependency.clone(), o.operation.clone().unwrap_or_default());
    let before = p.overrides.get(&k).and_then(|o| serde_json::to_string(o).ok());
    let after = serde_json::to_string(&o).ok();
    p.overrides.insert(k, o);
    (before, after)
}

/// The edit that removes a breaker override (API and UI); 404 when there is none.
pub(crate) fn remove_override(
    p: &mut Parts,
    dep: &str,
    operation: Option<&str>,
) -> Result<(Option<String>, Option<String>), ApiError> {
    let k = (dep.to_string(), operation.unwrap_or_default().to_string());
    let old = p
        .overrides
        .remove(&k)
        .ok_or_else(|| ApiError::NotFound(format!("no override on breaker {dep:?}")))?;
    Ok((serde_json::to_string(&old).ok(), None))
}

/// Removes a breaker override (operator).
#[utoipa::path(delete, path = "/api/v1/environments/{env}/services/{svc}/breaker-overrides/{dep}", tag = "overrides",
    params(("env" = String, Path), ("svc" = String, Path), ("dep" = String, Path), DeleteOverrideQuery),
    responses((status = 200, body = super::services::WriteResult), (status = 404, body = crate::error::Problem)))]
pub async fn delete_override(
    State(s): State<AppState>,
    auth: Auth,
    ctx: RequestCtx,
    headers: HeaderMap,
    Path((env, svc, dep)): Path<(String, String, String)>,
    Query(q): Query<DeleteOverrideQuery>,
) -> ApiResult<Response> {
    auth.require(Role::Operator)?;
    let expected = if_match(&headers, false)?;
    let audit = ctx.audit(&auth, q.reason.as_deref().unwrap_or(""))?;
    let target = format!("breaker {dep}");
    let change =
        Change { env: &env, service: &svc, action: "breaker.override.delete", target: &target, expected };
    let (c, lints) = commit(&s, change, &audit, |p| remove_override(p, &dep, q.operation.as_deref())).await?;
    Ok(write_response(c, lints, StatusCode::OK))
}

/// Fault rules of a service.
#[utoipa::path(get, path = "/api/v1/environments/{env}/services/{svc}/faults", tag = "faults",
    params(("env" = String, Path), ("svc" = String, Path)), responses((status = 200, body = [FaultRule])))]
pub async fn list_faults(
    State(s): State<AppState>,
    _a: Auth,
    Path((env, svc)): Path<(String, String)>,
) -> ApiResult<Json<Vec<FaultRule>>> {
    Ok(Json(current(&s, &env, &svc).await?.faults))
}

/// Creates or replaces a fault rule (operator; only where the environment allows faults).
#[utoipa::path(put, path = "/api/v1/environments/{env}/services/{svc}/faults/{id}", tag = "faults",
    request_body = PutFault, params(("env" = String, Path), ("svc" = String, Path), ("id" = String, Path)),
    responses((status = 200, body = super::services::WriteResult), (status = 403, body = crate::error::Problem),
              (status = 422, body = crate::error::Problem)))]
pub async fn put_fault(
    State(s): State<AppState>,
    auth: Auth,
    ctx: RequestCtx,
    headers: HeaderMap,
    Path((env, svc, id)): Path<(String, String, String)>,
    ApiJson(req): ApiJson<PutFault>,
) -> ApiResult<Response> {
    auth.require(Role::Operator)?;
    valid_name("id", &id)?;
    let expected = if_match(&headers, false)?;
    let audit = ctx.audit(&auth, &req.reason)?;
    let envrow = s
        .store
        .environment(&env)
        .await?
        .ok_or_else(|| ApiError::NotFound(format!("no environment {env:?}")))?;
    if !envrow.allow_faults {
        return Err(ApiError::Forbidden(format!(
            "environment {env:?} does not allow fault injection (allow_faults is false)"
        )));
    }
    if req.expires_at <= Timestamp::now() {
        return Err(ApiError::invalid_field(
            "expires_at",
            req.expires_at.to_string(),
            "must be in the future",
        ));
    }
    let rule = FaultRule {
        id: id.clone(),
        dependency: req.dependency,
        operation: req.operation,
        action: req.action,
        percent: req.percent,
        expires_at: req.expires_at,
    };
    let target = format!("fault {id}");
    let change = Change { env: &env, service: &svc, action: "fault.set", target: &target, expected };
    let (c, lints) = commit(&s, change, &audit, |p| {
        let before = p.faults.get(&id).and_then(|f| serde_json::to_string(f).ok());
        let after = serde_json::to_string(&rule).ok();
        p.faults.insert(id.clone(), rule);
        Ok((before, after))
    })
    .await?;
    Ok(write_response(c, lints, StatusCode::OK))
}

/// Removes a fault rule (operator).
#[utoipa::path(delete, path = "/api/v1/environments/{env}/services/{svc}/faults/{id}", tag = "faults",
    params(("env" = String, Path), ("svc" = String, Path), ("id" = String, Path), ReasonQuery),
    responses((status = 200, body = super::services::WriteResult), (status = 404, body = crate::error::Problem)))]
pub async fn delete_fault(
    State(s): State<AppState>,
    auth: Auth,
    ctx: RequestCtx,
    headers: HeaderMap,
    Path((env, svc, id)): Path<(String, String, String)>,
    Query(q): Query<ReasonQuery>,
) -> ApiResult<Response> {
    auth.require(Role::Operator)?;
    let expected = if_match(&headers, false)?;
    let audit = ctx.audit(&auth, q.reason.as_deref().unwrap_or(""))?;
    let target = format!("fault {id}");
    let change = Change { env: &env, service: &svc, action: "fault.delete", target: &target, expected };
    let (c, lints) = commit(&s, change, &audit, |p| {
        let old = p.faults.remove(&id).ok_or_else(|| ApiError::NotFound(format!("no fault rule {id:?}")))?;
        Ok((serde_json::to_string(&old).ok(), None))
    })
    .await?;
    Ok(write_response(c, lints, StatusCode::OK))
}

//! Breaker overrides and fault-injection rules.

use axum::Json;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use levee_agent::policy::{BreakerOverride, BreakerOverrideState, FaultAction, FaultRule, Timestamp};
use serde::Deserialize;

use super::flags::ReasonQuery;
use super::services::{current_config, if_match, write_response};
use super::{ApiJson, ApiQuery, ApiResult, Auth};
use crate::actions::{Action, Name, NewFaultRule, NewOverride, Reason, ServiceAt};
use crate::web::{AppState, RequestId};

/// Body of `PUT .../breaker-overrides/{dependency}`.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PutOverride {
    /// Operation whose breaker is forced; omit for the dependency-level breaker.
    #[serde(default)]
    pub operation: Option<String>,
    /// The forced state.
    pub state: BreakerOverrideState,
    /// The override ends by itself after this instant (must be in the future); default
    /// never.
    #[serde(default)]
    pub expires_at: Option<Timestamp>,
    /// Why, recorded in the audit log and in the override agents report; required.
    pub reason: String,
}

/// Query of `DELETE .../breaker-overrides/{dependency}`.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct DeleteOverrideQuery {
    /// Operation whose override is removed; omit for the dependency-level breaker.
    pub operation: Option<String>,
    /// Why, recorded in the audit log; required.
    pub reason: Option<String>,
}

/// Body of `PUT .../faults/{id}`: a fault rule (its ranges are those of the policy's
/// validation, named in a 422 answer).
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PutFault {
    /// Dependency whose calls are affected.
    pub dependency: String,
    /// Operation affected; omit for all of the dependency's.
    #[serde(default)]
    pub operation: Option<String>,
    /// What happens to an affected attempt.
    pub action: FaultAction,
    /// Share of attempts affected, in percent.
    pub percent: f64,
    /// The rule ends by itself after this instant (required, must be in the future).
    pub expires_at: Timestamp,
    /// The agent instances (instance ids, as the fleet lists them) it applies to; omit for
    /// every instance.
    #[serde(default)]
    pub instances: Vec<String>,
    /// Why, recorded in the audit log; required.
    pub reason: String,
}

/// Breaker overrides of a service.
#[utoipa::path(get, path = "/api/v1/environments/{env}/services/{svc}/breaker-overrides", tag = "overrides",
    params(("env" = String, Path), ("svc" = String, Path)), responses((status = 200, body = [BreakerOverride])))]
pub async fn list_overrides(
    State(s): State<AppState>,
    _a: Auth,
    Path((env, svc)): Path<(String, String)>,
) -> ApiResult<Json<Vec<BreakerOverride>>> {
    Ok(Json(current_config(&s, &env, &svc).await?.breaker_overrides))
}

/// Forces a breaker open, closed or disabled (operator), optionally until an expiry.
#[utoipa::path(put, path = "/api/v1/environments/{env}/services/{svc}/breaker-overrides/{dep}", tag = "overrides",
    request_body = PutOverride, params(("env" = String, Path), ("svc" = String, Path), ("dep" = String, Path)),
    responses((status = 200, body = super::services::WriteResult), (status = 422, body = super::Problem)))]
pub async fn put_override(
    State(s): State<AppState>,
    auth: Auth,
    rid: RequestId,
    headers: HeaderMap,
    Path((env, svc, dep)): Path<(String, String, String)>,
    ApiJson(req): ApiJson<PutOverride>,
) -> ApiResult<Response> {
    let by = auth.actor(Action::BreakerOverride, &rid)?;
    let at = ServiceAt::new(env, svc, if_match(&headers, false)?);
    let reason = Reason::parse(&req.reason)?;
    let new = NewOverride {
        dependency: dep,
        operation: req.operation,
        state: req.state,
        expires_at: req.expires_at,
    };
    let written = s.actions.set_breaker_override(&by, &reason, &at, new).await?;
    Ok(write_response(written, StatusCode::OK))
}

/// Removes a breaker override (operator).
#[utoipa::path(delete, path = "/api/v1/environments/{env}/services/{svc}/breaker-overrides/{dep}", tag = "overrides",
    params(("env" = String, Path), ("svc" = String, Path), ("dep" = String, Path), DeleteOverrideQuery),
    responses((status = 200, body = super::services::WriteResult), (status = 404, body = super::Problem)))]
pub async fn delete_override(
    State(s): State<AppState>,
    auth: Auth,
    rid: RequestId,
    headers: HeaderMap,
    Path((env, svc, dep)): Path<(String, String, String)>,
    ApiQuery(q): ApiQuery<DeleteOverrideQuery>,
) -> ApiResult<Response> {
    let by = auth.actor(Action::BreakerOverrideDelete, &rid)?;
    let at = ServiceAt::new(env, svc, if_match(&headers, false)?);
    let reason = Reason::parse(q.reason.as_deref().unwrap_or(""))?;
    let written = s.actions.remove_breaker_override(&by, &reason, &at, &dep, q.operation.as_deref()).await?;
    Ok(write_response(written, StatusCode::OK))
}

/// Fault rules of a service.
#[utoipa::path(get, path = "/api/v1/environments/{env}/services/{svc}/faults", tag = "faults",
    params(("env" = String, Path), ("svc" = String, Path)), responses((status = 200, body = [FaultRule])))]
pub async fn list_faults(
    State(s): State<AppState>,
    _a: Auth,
    Path((env, svc)): Path<(String, String)>,
) -> ApiResult<Json<Vec<FaultRule>>> {
    Ok(Json(current_config(&s, &env, &svc).await?.faults))
}

/// Creates or replaces a fault rule (operator; only where the environment allows faults).
#[utoipa::path(put, path = "/api/v1/environments/{env}/services/{svc}/faults/{id}", tag = "faults",
    request_body = PutFault, params(("env" = String, Path), ("svc" = String, Path), ("id" = String, Path)),
    responses((status = 200, body = super::services::WriteResult), (status = 403, body = super::Problem),
              (status = 422, body = super::Problem)))]
pub async fn put_fault(
    State(s): State<AppState>,
    auth: Auth,
    rid: RequestId,
    headers: HeaderMap,
    Path((env, svc, id)): Path<(String, String, String)>,
    ApiJson(req): ApiJson<PutFault>,
) -> ApiResult<Response> {
    let by = auth.actor(Action::FaultSet, &rid)?;
    let id = Name::parse("id", &id)?;
    let at = ServiceAt::new(env, svc, if_match(&headers, false)?);
    let reason = Reason::parse(&req.reason)?;
    let new = NewFaultRule {
        dependency: req.dependency,
        operation: req.operation,
        action: req.action,
        percent: req.percent,
        expires_at: req.expires_at,
        instances: req.instances,
    };
    let written = s.actions.set_fault_rule(&by, &reason, &at, &id, new).await?;
    Ok(write_response(written, StatusCode::OK))
}

/// Removes a fault rule (operator).
#[utoipa::path(delete, path = "/api/v1/environments/{env}/services/{svc}/faults/{id}", tag = "faults",
    params(("env" = String, Path), ("svc" = String, Path), ("id" = String, Path), ReasonQuery),
    responses((status = 200, body = super::services::WriteResult), (status = 404, body = super::Problem)))]
pub async fn delete_fault(
    State(s): State<AppState>,
    auth: Auth,
    rid: RequestId,
    headers: HeaderMap,
    Path((env, svc, id)): Path<(String, String, String)>,
    ApiQuery(q): ApiQuery<ReasonQuery>,
) -> ApiResult<Response> {
    let by = auth.actor(Action::FaultDelete, &rid)?;
    let at = ServiceAt::new(env, svc, if_match(&headers, false)?);
    let reason = Reason::parse(q.reason.as_deref().unwrap_or(""))?;
    let written = s.actions.delete_fault_rule(&by, &reason, &at, &id).await?;
    Ok(write_response(written, StatusCode::OK))
}

//! Flags (kill switches and tunables) of a service.

use std::collections::BTreeMap;

use axum::Json;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use levee_agent::policy::{Flag, FlagType, Rollout, StalePolicy, Timestamp};
use serde::{Deserialize, Serialize};

use super::services::{if_match, write_response};
use super::{ApiError, ApiJson, ApiQuery, ApiResult, Auth};
use crate::actions::{Action, ChangeError, Missing, Name, Reason, ServiceAt};
use crate::web::{AppState, RequestId};

/// Body of `PUT .../flags/{key}`: the whole flag plus a reason.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PutFlag {
    /// Type of the value: `bool`, `int`, `float`, `string` or `json`.
    #[serde(rename = "type")]
    pub kind: FlagType,
    /// The value, of that type.
    #[schema(value_type = Value)]
    pub value: serde_json::Value,
    /// What the flag does, for people; default empty.
    #[serde(default)]
    pub description: String,
    /// Who to ask about it; default empty.
    #[serde(default)]
    pub owner: String,
    /// The value is temporary until this instant; default never. At its expiry the server
    /// puts back the flag as it was before it was given an expiry (see `GET
    /// .../temporary-flags`), or removes it when it was created with one; agents fall back
    /// to their compiled-in default at that instant until they receive the flag put back.
    #[serde(default)]
    pub expires_at: Option<Timestamp>,
    /// Behaviour while an agent is offline: `"hold"` (default) or `{"revert_after": "1h"}`.
    #[serde(default)]
    #[schema(example = json!("hold"))]
    pub stale: StalePolicy,
    /// Gradual rollout (bool flags only); default none (everyone gets `value`).
    #[serde(default)]
    pub rollout: Option<Rollout>,
    /// Why, recorded in the audit log; required.
    pub reason: String,
}

/// Body of `PATCH .../flags/{key}`: flip the value (and set its expiry), keep the rest.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PatchFlag {
    /// New value, of the flag's type.
    #[schema(value_type = Value)]
    pub value: serde_json::Value,
    /// New expiry, in the future: the value is temporary, and at this instant the server
    /// puts back the flag as it was before the first temporary flip (a second flip keeps
    /// that original). Omitted or `null`, the new value is permanent (an expiry left by an
    /// earlier temporary flip is removed, and with it what the flag would have gone back to).
    #[serde(default)]
    pub expires_at: Option<Timestamp>,
    /// Why, recorded in the audit log; required.
    pub reason: String,
}

/// Query of a `DELETE` that needs only a reason.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct ReasonQuery {
    /// Why, recorded in the audit log; required.
    pub reason: Option<String>,
}

async fn current_flags(s: &AppState, env: &str, svc: &str) -> ApiResult<BTreeMap<String, Flag>> {
    Ok(super::services::current_config(s, env, svc).await?.flags)
}

/// Flags of a service.
#[utoipa::path(get, path = "/api/v1/environments/{env}/services/{svc}/flags", tag = "flags",
    params(("env" = String, Path), ("svc" = String, Path)),
    responses((status = 200, body = BTreeMap<String, Flag>), (status = 404, body = super::Problem)))]
pub async fn list(
    State(s): State<AppState>,
    _a: Auth,
    Path((env, svc)): Path<(String, String)>,
) -> ApiResult<Json<BTreeMap<String, Flag>>> {
    Ok(Json(current_flags(&s, &env, &svc).await?))
}

/// A flag whose value is temporary and that goes back to an earlier flag at its expiry.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct TemporaryFlag {
    /// The flag's key.
    pub key: String,
    /// The flag in force now, as agents receive it; its `expires_at` is when the temporary
    /// value ends.
    pub flag: Flag,
    /// The flag as it was before it was given an expiry, which the server puts back then:
    /// what the service declares (`levee export` writes this one).
    pub restores: Flag,
}

/// The flags of a service whose value is temporary (`levee flip … --for`, a `PUT`/`PATCH`
/// with `expires_at`, an emergency profile) and that go back to an earlier flag at their
/// expiry. A flag created with an expiry is not listed: it is removed then.
#[utoipa::path(get, path = "/api/v1/environments/{env}/services/{svc}/temporary-flags", tag = "flags",
    params(("env" = String, Path), ("svc" = String, Path)),
    responses((status = 200, body = [TemporaryFlag]), (status = 404, body = super::Problem)))]
pub async fn temporary(
    State(s): State<AppState>,
    _a: Auth,
    Path((env, svc)): Path<(String, String)>,
) -> ApiResult<Json<Vec<TemporaryFlag>>> {
    current_flags(&s, &env, &svc).await?;
    let decode = |body: &str| serde_json::from_str::<Flag>(body).map_err(|e| ApiError::Internal(e.into()));
    let mut out = Vec::new();
    for (key, flag, restores) in s.store.temporary_flags(&env, &svc).await? {
        out.push(TemporaryFlag { key, flag: decode(&flag)?, restores: decode(&restores)? });
    }
    Ok(Json(out))
}

/// One flag: its type, value, expiry, offline behaviour and rollout.
#[utoipa::path(get, path = "/api/v1/environments/{env}/services/{svc}/flags/{key}", tag = "flags",
    params(("env" = String, Path), ("svc" = String, Path), ("key" = String, Path)),
    responses((status = 200, body = Flag), (status = 404, body = super::Problem)))]
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
    responses((status = 200, body = super::services::WriteResult), (status = 409, body = super::Problem),
              (status = 422, body = super::Problem)))]
pub async fn put(
    State(s): State<AppState>,
    auth: Auth,
    rid: RequestId,
    headers: HeaderMap,
    Path((env, svc, key)): Path<(String, String, String)>,
    ApiJson(req): ApiJson<PutFlag>,
) -> ApiResult<Response> {
    let by = auth.actor(Action::FlagSet, &rid)?;
    let key = Name::parse("key", &key)?;
    let at = ServiceAt::new(env, svc, if_match(&headers, false)?);
    let reason = Reason::parse(&req.reason)?;
    let flag = Flag {
        kind: req.kind,
        value: req.value,
        description: req.description,
        owner: req.owner,
        expires_at: req.expires_at,
        stale: req.stale,
        rollout: req.rollout,
    };
    let written = s.actions.set_flag(&by, &reason, &at, &key, flag).await?;
    Ok(write_response(written, StatusCode::OK))
}

/// Changes a flag's value (one-click switch), keeping its metadata (operator).
#[utoipa::path(patch, path = "/api/v1/environments/{env}/services/{svc}/flags/{key}", tag = "flags",
    request_body = PatchFlag,
    params(("env" = String, Path), ("svc" = String, Path), ("key" = String, Path),
           ("If-Match" = Option<String>, Header, description = "Optional: current revision")),
    responses((status = 200, body = super::services::WriteResult), (status = 404, body = super::Problem),
              (status = 422, body = super::Problem)))]
pub async fn patch(
    State(s): State<AppState>,
    auth: Auth,
    rid: RequestId,
    headers: HeaderMap,
    Path((env, svc, key)): Path<(String, String, String)>,
    ApiJson(req): ApiJson<PatchFlag>,
) -> ApiResult<Response> {
    let by = auth.actor(Action::FlagSet, &rid)?;
    let at = ServiceAt::new(env, svc, if_match(&headers, false)?);
    let reason = Reason::parse(&req.reason)?;
    match s.actions.set_flag_value(&by, &reason, &at, &key, req.value, req.expires_at).await {
        Ok(written) => Ok(write_response(written, StatusCode::OK)),
        Err(ChangeError::NotFound(m @ Missing::Flag { .. })) => {
            Err(ApiError::NotFound(format!("{m}; create it with PUT")))
        }
        Err(e) => Err(e.into()),
    }
}

/// Deletes a flag (operator); agents fall back to their compiled-in default.
#[utoipa::path(delete, path = "/api/v1/environments/{env}/services/{svc}/flags/{key}", tag = "flags",
    params(("env" = String, Path), ("svc" = String, Path), ("key" = String, Path), ReasonQuery),
    responses((status = 200, body = super::services::WriteResult), (status = 404, body = super::Problem)))]
pub async fn delete(
    State(s): State<AppState>,
    auth: Auth,
    rid: RequestId,
    headers: HeaderMap,
    Path((env, svc, key)): Path<(String, String, String)>,
    ApiQuery(q): ApiQuery<ReasonQuery>,
) -> ApiResult<Response> {
    let by = auth.actor(Action::FlagDelete, &rid)?;
    let at = ServiceAt::new(env, svc, if_match(&headers, false)?);
    let reason = Reason::parse(q.reason.as_deref().unwrap_or(""))?;
    let written = s.actions.delete_flag(&by, &reason, &at, &key).await?;
    Ok(write_response(written, StatusCode::OK))
}

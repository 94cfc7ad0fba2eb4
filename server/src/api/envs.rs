//! Environments.

use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use serde::Deserialize;

use super::{ApiError, ApiJson, ApiResult, Auth};
use crate::actions::{Action, NewEnvironment, Reason};
use crate::db::EnvironmentRow;
use crate::web::{AppState, RequestId};

/// Body of `POST /environments`.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateEnvironment {
    /// A name (the rule for names is in the 400 answer to a bad one).
    pub name: String,
    /// Free text shown in lists; default empty.
    #[serde(default)]
    pub description: String,
    /// Whether fault-injection rules may be applied in this environment; default false.
    #[serde(default)]
    pub allow_faults: bool,
    /// Why, recorded in the audit log; required.
    pub reason: String,
}

/// Lists environments by name.
#[utoipa::path(get, path = "/api/v1/environments", tag = "environments",
    responses((status = 200, body = [EnvironmentRow]), (status = 401, body = super::Problem)))]
pub async fn list(State(s): State<AppState>, _auth: Auth) -> ApiResult<Json<Vec<EnvironmentRow>>> {
    Ok(Json(s.store.environments().await?))
}

/// One environment: its description and whether it allows faults.
#[utoipa::path(get, path = "/api/v1/environments/{env}", tag = "environments",
    params(("env" = String, Path, description = "Environment name")),
    responses((status = 200, body = EnvironmentRow), (status = 404, body = super::Problem)))]
pub async fn get_one(
    State(s): State<AppState>,
    _auth: Auth,
    Path(env): Path<String>,
) -> ApiResult<Json<EnvironmentRow>> {
    s.store
        .environment(&env)
        .await?
        .map(Json)
        .ok_or_else(|| ApiError::NotFound(format!("no environment {env:?}")))
}

/// Creates an environment (admin).
#[utoipa::path(post, path = "/api/v1/environments", tag = "environments", request_body = CreateEnvironment,
    responses((status = 201, body = EnvironmentRow), (status = 409, body = super::Problem),
              (status = 403, body = super::Problem)))]
pub async fn create(
    State(s): State<AppState>,
    auth: Auth,
    rid: RequestId,
    ApiJson(req): ApiJson<CreateEnvironment>,
) -> ApiResult<(StatusCode, Json<EnvironmentRow>)> {
    let by = auth.actor(Action::EnvironmentCreate, &rid)?;
    let new = NewEnvironment::new(&req.name, req.description, req.allow_faults)?;
    let reason = Reason::parse(&req.reason)?;
    let row = s.actions.create_environment(&by, &reason, new).await?;
    Ok((StatusCode::CREATED, Json(row)))
}

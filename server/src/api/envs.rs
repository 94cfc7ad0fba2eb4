//! Environments.

use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use levee_agent::policy::check_name;
use serde::Deserialize;

use super::{ApiJson, AppState, Auth, RequestCtx};
use crate::db::{AuditRow, EnvironmentRow, Role, now_ms};
use crate::error::{ApiError, ApiResult};

/// Body of `POST /environments`.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateEnvironment {
    /// Name: 1..=64 of `a-z 0-9 . _ -`.
    pub name: String,
    /// Free text.
    #[serde(default)]
    pub description: String,
    /// Whether fault-injection rules may be applied in this environment.
    #[serde(default)]
    pub allow_faults: bool,
    /// Why it is created.
    pub reason: String,
}

/// Checks a name path or body field.
pub(crate) fn valid_name(field: &str, v: &str) -> ApiResult<()> {
    check_name(v).map_err(|m| ApiError::bad_field(field, format!("{v:?}"), m))
}

/// Lists environments.
#[utoipa::path(get, path = "/api/v1/environments", tag = "environments",
    responses((status = 200, body = [EnvironmentRow]), (status = 401, body = crate::error::Problem)))]
pub async fn list(State(s): State<AppState>, _auth: Auth) -> ApiResult<Json<Vec<EnvironmentRow>>> {
    Ok(Json(s.store.environments().await?))
}

/// One environment.
#[utoipa::path(get, path = "/api/v1/environments/{env}", tag = "environments",
    params(("env" = String, Path, description = "Environment name")),
    responses((status = 200, body = EnvironmentRow), (status = 404, body = crate::error::Problem)))]
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
    responses((status = 201, body = EnvironmentRow), (status = 409, body = crate::error::Problem),
              (status = 403, body = crate::error::Problem)))]
pub async fn create(
    State(s): State<AppState>,
    auth: Auth,
    ctx: RequestCtx,
    ApiJson(req): ApiJson<CreateEnvironment>,
) -> ApiResult<(StatusCode, Json<EnvironmentRow>)> {
    auth.require(Role::Admin)?;
    valid_name("name", &req.name)?;
    if req.description.len() > 1000 {
        return Err(ApiError::bad_field(
            "description",
            format!("{} bytes", req.description.len()),
            "must be at most 1000 bytes",
        ));
    }
    let audit = ctx.audit(&auth, &req.reason)?;
    if !s.store.create_environment(&req.name, &req.description, req.allow_faults).await? {
        return Err(ApiError::AlreadyExists(format!("environment {:?} already exists", req.name)));
    }
    s.store
        .append_audit(&AuditRow {
            at: now_ms(),
            actor: audit.actor,
            via: audit.via,
            request_id: audit.request_id,
            action: "environment.create".into(),
            environment: Some(req.name.clone()),
            service: None,
            target: req.name.clone(),
            outcome: "ok".into(),
            reason: audit.reason,
            after: Some(
                serde_json::json!({"description": req.description, "allow_faults": req.allow_faults})
                    .to_string(),
            ),
            ..Default::default()
        })
        .await?;
    let row = s
        .store
        .environment(&req.name)
        .await?
        .ok_or_else(|| ApiError::Internal(anyhow::anyhow!("vanished")))?;
    Ok((StatusCode::CREATED, Json(row)))
}

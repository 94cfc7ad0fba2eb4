//! Fleet: agents of a service and the NACKs they sent.

use axum::Json;
use axum::extract::{Path, State};

use super::{ApiResult, Auth};
use crate::db::{AgentRow, NackRow};
use crate::web::AppState;

/// Agent instances of a service with the revision each acknowledged.
#[utoipa::path(get, path = "/api/v1/environments/{env}/services/{svc}/agents", tag = "fleet",
    params(("env" = String, Path), ("svc" = String, Path)), responses((status = 200, body = [AgentRow])))]
pub async fn agents(
    State(s): State<AppState>,
    _a: Auth,
    Path((env, svc)): Path<(String, String)>,
) -> ApiResult<Json<Vec<AgentRow>>> {
    Ok(Json(s.store.agents(&env, &svc).await?))
}

/// Snapshots agents rejected, with their reasons, newest first.
#[utoipa::path(get, path = "/api/v1/environments/{env}/services/{svc}/nacks", tag = "fleet",
    params(("env" = String, Path), ("svc" = String, Path)), responses((status = 200, body = [NackRow])))]
pub async fn nacks(
    State(s): State<AppState>,
    _a: Auth,
    Path((env, svc)): Path<(String, String)>,
) -> ApiResult<Json<Vec<NackRow>>> {
    Ok(Json(s.store.nacks(&env, &svc).await?))
}

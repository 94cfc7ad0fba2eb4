//! Fleet: agents of a service and the NACKs they sent.

use axum::Json;
use axum::extract::{Path, State};

use super::ApiError;
use super::{ApiResult, Auth};
use crate::db::{AgentRow, NackRow, Propagation};
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

/// How far a revision has reached: "N of M" (connected agents on it or later, of those
/// connected), and the time from its commit to each agent's ACK with p50, p99 and max.
#[utoipa::path(get, path = "/api/v1/environments/{env}/services/{svc}/revisions/{rev}/propagation", tag = "fleet",
    params(("env" = String, Path), ("svc" = String, Path), ("rev" = u64, Path)),
    responses((status = 200, body = Propagation), (status = 404, body = super::Problem)))]
pub async fn propagation(
    State(s): State<AppState>,
    _a: Auth,
    Path((env, svc, rev)): Path<(String, String, u64)>,
) -> ApiResult<Json<Propagation>> {
    s.store
        .propagation(&env, &svc, rev)
        .await?
        .map(Json)
        .ok_or_else(|| ApiError::NotFound(format!("no revision {rev} of service {svc:?} in {env:?}")))
}

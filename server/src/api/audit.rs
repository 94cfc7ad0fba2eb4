//! The audit log.

use axum::Json;
use axum::extract::State;
use levee_agent::policy::Timestamp;
use serde::Deserialize;

use super::services::page_limit;
use super::{ApiQuery, ApiResult, Auth};
use crate::db::{AuditFilter, AuditRow};
use crate::web::AppState;

/// Filters of `GET /audit`.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct AuditQuery {
    /// Only entries of this environment.
    pub environment: Option<String>,
    /// Only entries of this service.
    pub service: Option<String>,
    /// Only entries by this actor (a username or `token:<name>`).
    pub actor: Option<String>,
    /// Only entries at or after this time (RFC 3339, e.g. `2026-12-01T12:00:00Z`).
    #[param(value_type = Option<String>, format = DateTime)]
    pub since: Option<Timestamp>,
    /// Only entries at or before this time (RFC 3339).
    #[param(value_type = Option<String>, format = DateTime)]
    pub until: Option<Timestamp>,
    /// The next page: entries older than this id (the last id of the previous page).
    pub before_id: Option<i64>,
    /// Most entries (default 100; the allowed range is in the 400 answer).
    pub limit: Option<i64>,
    /// Only entries of this action (`flag.set`) or family of actions (`flag`: `flag.set`
    /// and `flag.delete`; `auth`: every login row).
    pub action: Option<String>,
}

/// Audit entries, newest first: who, when, from where, what, why and outcome; `before` and
/// `after` are JSON values of the target (never a message), `detail` says in words why an
/// attempt was refused or what a revert restored.
#[utoipa::path(get, path = "/api/v1/audit", tag = "audit", params(AuditQuery),
    responses((status = 200, body = [AuditRow]), (status = 400, body = super::Problem)))]
pub async fn list(
    State(s): State<AppState>,
    _a: Auth,
    ApiQuery(q): ApiQuery<AuditQuery>,
) -> ApiResult<Json<Vec<AuditRow>>> {
    let limit = page_limit(q.limit)?;
    let f = AuditFilter {
        since: q.since.map(Timestamp::unix_ms),
        until: q.until.map(Timestamp::unix_ms),
        environment: q.environment,
        service: q.service,
        actor: q.actor,
        before_id: q.before_id,
        limit,
        action: q.action,
        exclude_action: None,
    };
    Ok(Json(s.store.audit(&f).await?))
}

//! Staged rollouts: an environment's rollout setting, its rollouts with the cohort beside
//! the rest, and the operator's steps (promote, pause, resume, abort).

use axum::Json;
use axum::extract::{Path, State};
use serde::Deserialize;

use super::{ApiJson, ApiQuery, ApiResult, Auth};
use crate::actions::{Action, Reason, RolloutDetail};
use crate::db::{RolloutRow, RolloutSettings};
use crate::web::{AppState, RequestId};
use levee_agent::policy::Timestamp;

/// Body of `PUT .../rollout-settings`.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PutSettings {
    /// The setting.
    pub settings: RolloutSettings,
    /// Why, recorded in the audit log; required.
    pub reason: String,
}

/// Body of an operator's step.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct StepBody {
    /// Why, recorded in the audit log; required.
    pub reason: String,
}

/// Query of the list.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
pub struct ListQuery {
    /// Only the rollouts of this service.
    pub service: Option<String>,
}

/// The rollout setting of an environment: which kinds of change are staged by default and
/// the plan they follow (no setting: every change is immediate).
#[utoipa::path(get, path = "/api/v1/environments/{env}/rollout-settings", tag = "rollouts",
    params(("env" = String, Path)), responses((status = 200, body = RolloutSettings)))]
pub async fn get_settings(
    State(s): State<AppState>,
    _a: Auth,
    Path(env): Path<String>,
) -> ApiResult<Json<RolloutSettings>> {
    Ok(Json(s.actions.rollout_settings(&env).await?))
}

/// Sets the rollout setting of an environment (admin). `staged` may hold `policy` only:
/// flag flips, breaker overrides and emergency profiles are always immediate.
#[utoipa::path(put, path = "/api/v1/environments/{env}/rollout-settings", tag = "rollouts",
    request_body = PutSettings, params(("env" = String, Path)),
    responses((status = 200, body = RolloutSettings)))]
pub async fn put_settings(
    State(s): State<AppState>,
    auth: Auth,
    rid: RequestId,
    Path(env): Path<String>,
    ApiJson(req): ApiJson<PutSettings>,
) -> ApiResult<Json<RolloutSettings>> {
    let by = auth.actor(Action::RolloutSettings, &rid)?;
    let reason = Reason::parse(&req.reason)?;
    Ok(Json(s.actions.set_rollout_settings(&by, &reason, &env, req.settings).await?))
}

/// Rollouts of an environment (or of one service), newest first, at most 100.
#[utoipa::path(get, path = "/api/v1/environments/{env}/rollouts", tag = "rollouts",
    params(("env" = String, Path), ListQuery), responses((status = 200, body = [RolloutRow])))]
pub async fn list(
    State(s): State<AppState>,
    _a: Auth,
    Path(env): Path<String>,
    ApiQuery(q): ApiQuery<ListQuery>,
) -> ApiResult<Json<Vec<RolloutRow>>> {
    s.actions.rollout_settings(&env).await?;
    Ok(Json(s.store.rollouts(&env, q.service.as_deref(), 100).await?))
}

/// One rollout: its stage and plan, the cohort beside the rest, every instance, and the
/// halt rule's verdict read now (each dependency and route of either side: both sides'
/// counts, whether it is judged and whether the cohort does worse; readiness; NACKs).
#[utoipa::path(get, path = "/api/v1/environments/{env}/rollouts/{id}", tag = "rollouts",
    params(("env" = String, Path), ("id" = i64, Path)), responses((status = 200, body = RolloutDetail)))]
pub async fn get_one(
    State(s): State<AppState>,
    _a: Auth,
    Path((env, id)): Path<(String, i64)>,
) -> ApiResult<Json<RolloutDetail>> {
    let r = s.actions.rollout(&env, id).await?;
    let sides = crate::rollout::sides(&s.health, &s.store, &r, Timestamp::now().unix_ms()).await?;
    let verdict = s.actions.rollout_verdict(&r, sides).await?;
    Ok(Json(s.actions.rollout_detail(r, verdict).await?))
}

/// The operator's steps.
#[derive(Clone, Copy)]
enum Verb {
    Promote,
    Pause,
    Resume,
    Abort,
}

async fn run(
    s: AppState,
    auth: Auth,
    rid: RequestId,
    (env, id): (String, i64),
    req: StepBody,
    verb: Verb,
) -> ApiResult<Json<RolloutRow>> {
    let action = match verb {
        Verb::Promote => Action::RolloutPromote,
        Verb::Pause => Action::RolloutPause,
        Verb::Resume => Action::RolloutResume,
        Verb::Abort => Action::RolloutAbort,
    };
    let by = auth.actor(action, &rid)?;
    let reason = Reason::parse(&req.reason)?;
    let row = match verb {
        Verb::Promote => s.actions.promote_rollout(&by, &reason, &env, id).await?,
        Verb::Pause => s.actions.pause_rollout(&by, &reason, &env, id).await?,
        Verb::Resume => s.actions.resume_rollout(&by, &reason, &env, id).await?,
        Verb::Abort => {
            s.actions.abort_rollout(&by, &reason, &env, id).await?;
            s.actions.rollout(&env, id).await?
        }
    };
    Ok(Json(row))
}

/// Starts the rollout's next stage now, without waiting for its bake time; at the last stage,
/// completes it: the candidate becomes every instance's (operator).
#[utoipa::path(post, path = "/api/v1/environments/{env}/rollouts/{id}/promote", tag = "rollouts",
    request_body = StepBody, params(("env" = String, Path), ("id" = i64, Path)),
    responses((status = 200, body = RolloutRow),
              (status = 409, body = super::Problem,
               description = "rollout-conflict: the rollout is not in a state for this step, or moved meanwhile")))]
pub async fn promote(
    State(s): State<AppState>,
    auth: Auth,
    rid: RequestId,
    Path((env, id)): Path<(String, i64)>,
    ApiJson(req): ApiJson<StepBody>,
) -> ApiResult<Json<RolloutRow>> {
    run(s, auth, rid, (env, id), req, Verb::Promote).await
}

/// Pauses the rollout: no next stage until resumed; a halt still applies (operator).
#[utoipa::path(post, path = "/api/v1/environments/{env}/rollouts/{id}/pause", tag = "rollouts",
    request_body = StepBody, params(("env" = String, Path), ("id" = i64, Path)),
    responses((status = 200, body = RolloutRow),
              (status = 409, body = super::Problem,
               description = "rollout-conflict: the rollout is not in a state for this step, or moved meanwhile")))]
pub async fn pause(
    State(s): State<AppState>,
    auth: Auth,
    rid: RequestId,
    Path((env, id)): Path<(String, i64)>,
    ApiJson(req): ApiJson<StepBody>,
) -> ApiResult<Json<RolloutRow>> {
    run(s, auth, rid, (env, id), req, Verb::Pause).await
}

/// Resumes a paused rollout; its stage bakes again from now (operator).
#[utoipa::path(post, path = "/api/v1/environments/{env}/rollouts/{id}/resume", tag = "rollouts",
    request_body = StepBody, params(("env" = String, Path), ("id" = i64, Path)),
    responses((status = 200, body = RolloutRow),
              (status = 409, body = super::Problem,
               description = "rollout-conflict: the rollout is not in a state for this step, or moved meanwhile")))]
pub async fn resume(
    State(s): State<AppState>,
    auth: Auth,
    rid: RequestId,
    Path((env, id)): Path<(String, i64)>,
    ApiJson(req): ApiJson<StepBody>,
) -> ApiResult<Json<RolloutRow>> {
    run(s, auth, rid, (env, id), req, Verb::Resume).await
}

/// Aborts the rollout: a new revision puts the policy it started from back for every instance
/// (operator). Not gated by approval rules: it only undoes a staged change.
#[utoipa::path(post, path = "/api/v1/environments/{env}/rollouts/{id}/abort", tag = "rollouts",
    request_body = StepBody, params(("env" = String, Path), ("id" = i64, Path)),
    responses((status = 200, body = RolloutRow),
              (status = 409, body = super::Problem,
               description = "rollout-conflict: the rollout is not in a state for this step, or moved meanwhile")))]
pub async fn abort(
    State(s): State<AppState>,
    auth: Auth,
    rid: RequestId,
    Path((env, id)): Path<(String, i64)>,
    ApiJson(req): ApiJson<StepBody>,
) -> ApiResult<Json<RolloutRow>> {
    run(s, auth, rid, (env, id), req, Verb::Abort).await
}

//! Experiments: start one (its spec and a reason), list them, read one with its readings
//! and timeline, stop one. The run is `crate::experiments`; every change is an action.

use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::requests::RequestView;
use super::{ApiError, ApiJson, ApiQuery, ApiResult, Auth};
use crate::actions::{Action, Reason, Started};
use crate::auth::Principal;
use crate::db::{ExperimentRow, ExperimentState, RequestRow};
use crate::experiments::game_day::{self, GameDayReport};
use crate::experiments::report::TimelineEvent;
use crate::experiments::{ExperimentSpec, Reading};
use crate::web::{AppState, RequestId};

/// An experiment and where it is.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct ExperimentView {
    pub id: i64,
    pub name: String,
    pub environment: String,
    pub service: String,
    /// The spec as submitted.
    #[schema(value_type = Object)]
    pub spec: Value,
    pub state: ExperimentState,
    /// `passed`, `failed` or `aborted` once done; `null` before.
    pub verdict: Option<String>,
    /// Why, in words.
    pub why: Option<String>,
    /// The fault rule it sets in the service.
    pub fault_id: String,
    /// The instances given the fault (ids as the fleet lists them); `null` before.
    pub instances: Option<Vec<String>>,
    pub created_by: String,
    #[serde(with = "levee_agent::policy::rfc3339")]
    #[schema(value_type = String, format = DateTime)]
    pub created_at: i64,
    pub reason: String,
    /// When the fault was set.
    #[serde(with = "levee_agent::policy::rfc3339::option")]
    #[schema(value_type = Option<String>, format = DateTime)]
    pub injected_at: Option<i64>,
    /// When the fault ends by itself on every agent, whatever happens to the server.
    #[serde(with = "levee_agent::policy::rfc3339::option")]
    #[schema(value_type = Option<String>, format = DateTime)]
    pub fault_expires_at: Option<i64>,
    /// When the server removed it.
    #[serde(with = "levee_agent::policy::rfc3339::option")]
    #[schema(value_type = Option<String>, format = DateTime)]
    pub fault_removed_at: Option<i64>,
    #[serde(with = "levee_agent::policy::rfc3339::option")]
    #[schema(value_type = Option<String>, format = DateTime)]
    pub ended_at: Option<i64>,
    /// Who asked it to stop, when and why.
    pub stop_requested_by: Option<String>,
    #[serde(with = "levee_agent::policy::rfc3339::option")]
    #[schema(value_type = Option<String>, format = DateTime)]
    pub stop_requested_at: Option<i64>,
    pub stop_reason: Option<String>,
    /// A game day: people in the loop, what it injected hidden from them until it ends.
    pub game_day: bool,
    /// `true` when what it injected is hidden from the caller (a game day still running,
    /// seen by someone other than its starter or an admin): `name`, `spec`, `reason`,
    /// `instances` and the fault's times are left out, and the report has no probes,
    /// readings or game-day measures yet.
    pub hidden: bool,
}

impl From<ExperimentRow> for ExperimentView {
    fn from(e: ExperimentRow) -> Self {
        ExperimentView {
            game_day: crate::actions::is_game_day(&e),
            hidden: false,
            fault_id: crate::actions::experiment_fault_id(e.id),
            id: e.id,
            name: e.name,
            environment: e.environment,
            service: e.service,
            spec: serde_json::from_str(&e.spec).unwrap_or(Value::Null),
            state: e.state,
            verdict: e.verdict,
            why: e.why,
            instances: e.instances.and_then(|i| serde_json::from_str(&i).ok()),
            created_by: e.created_by,
            created_at: e.created_at,
            reason: e.reason,
            injected_at: e.injected_at,
            fault_expires_at: e.fault_expires_at,
            fault_removed_at: e.fault_removed_at,
            ended_at: e.ended_at,
            stop_requested_by: e.stop_requested_by,
            stop_requested_at: e.stop_requested_at,
            stop_reason: e.stop_reason,
        }
    }
}

/// An experiment with its readings and timeline: its report.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct ExperimentReport {
    pub experiment: ExperimentView,
    /// The probes in words, in the order of each reading's values.
    pub probes: Vec<String>,
    /// Every reading, oldest first.
    pub readings: Vec<Reading>,
    pub timeline: Vec<TimelineEvent>,
    /// A game day's measures of the team (`null` for other experiments, and while hidden
    /// from the caller).
    pub game_day: Option<GameDayReport>,
}

/// Body of `POST /api/v1/experiments`.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct StartExperiment {
    pub experiment: ExperimentSpec,
    /// Why, recorded in the audit log; required.
    pub reason: String,
}

/// Body of `POST /api/v1/experiments/{id}/stop`.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct StopExperiment {
    /// Why, recorded in the audit log; required.
    pub reason: String,
}

/// Query of the list.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
pub struct ListQuery {
    /// Only the experiments of this environment.
    pub environment: Option<String>,
    /// Only the experiments of this service.
    pub service: Option<String>,
}

/// What `POST /experiments` answers where the environment's approval rules cover
/// experiments: nothing started; a change request proposes it.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct ExperimentPending {
    /// What happens next, in words.
    pub message: String,
    /// The request proposing the experiment: a second person approves it, then applying it
    /// (`POST /environments/{env}/change-requests/{id}/apply`) starts exactly this
    /// definition (its `experiment_id` names the experiment).
    pub change_request: RequestView,
}

/// Starts an experiment (operator): the baseline is measured first, and nothing is
/// injected unless the hypothesis held. Answers at once; follow it with `GET .../{id}`.
/// Where the environment's approval rules cover experiments, nothing starts: 202 with the
/// change request proposing it (break-glass, `X-Levee-Break-Glass: <reason>`, starts it at
/// once, audited as a bypass).
#[utoipa::path(post, path = "/api/v1/experiments", tag = "experiments", request_body = StartExperiment,
    responses((status = 201, body = ExperimentView),
              (status = 202, body = ExperimentPending, description = "approval required: proposed as a change request, not started"),
              (status = 400, body = super::Problem),
              (status = 404, body = super::Problem), (status = 409, body = super::Problem),
              (status = 422, body = super::Problem)))]
pub async fn start(
    State(s): State<AppState>,
    auth: Auth,
    rid: RequestId,
    ApiJson(req): ApiJson<StartExperiment>,
) -> ApiResult<Response> {
    let by = auth.actor(Action::ExperimentStart, &rid)?;
    let reason = Reason::parse(&req.reason)?;
    match s.experiments.start(&by, &reason, req.experiment).await? {
        Started::Running(id) => {
            let e = s
                .store
                .experiment(id)
                .await?
                .ok_or_else(|| ApiError::NotFound(format!("no experiment {id}")))?;
            Ok((StatusCode::CREATED, Json(ExperimentView::from(e))).into_response())
        }
        Started::Pending(r) => {
            let message = pending_message(&r);
            Ok((StatusCode::ACCEPTED, Json(ExperimentPending { message, change_request: (*r).into() }))
                .into_response())
        }
    }
}

/// What happens to an experiment proposed for approval, in words (the API's and the UI's).
pub fn pending_message(r: &RequestRow) -> String {
    format!(
        "approval pending: the approval rules of environment {} cover experiments, so nothing started; \
         change request {} proposes experiment {}, and starts it once another person approves it and it is applied",
        r.environment, r.id, r.target
    )
}

/// The last 100 experiments, newest first.
#[utoipa::path(get, path = "/api/v1/experiments", tag = "experiments", params(ListQuery),
    responses((status = 200, body = [ExperimentView])))]
pub async fn list(
    State(s): State<AppState>,
    a: Auth,
    ApiQuery(q): ApiQuery<ListQuery>,
) -> ApiResult<Json<Vec<ExperimentView>>> {
    let rows = s.store.experiments(q.environment.as_deref(), q.service.as_deref()).await?;
    Ok(Json(rows.into_iter().map(|e| view_for(e, &a.principal)).collect()))
}

/// One experiment with its readings and timeline.
#[utoipa::path(get, path = "/api/v1/experiments/{id}", tag = "experiments", params(("id" = i64, Path)),
    responses((status = 200, body = ExperimentReport), (status = 404, body = super::Problem)))]
pub async fn get_one(
    State(s): State<AppState>,
    a: Auth,
    Path(id): Path<i64>,
) -> ApiResult<Json<ExperimentReport>> {
    Ok(Json(report(&s, id, &a.principal).await?))
}

/// Asks a running experiment to stop (operator): it aborts at its next reading and
/// removes its fault.
#[utoipa::path(post, path = "/api/v1/experiments/{id}/stop", tag = "experiments", request_body = StopExperiment,
    params(("id" = i64, Path)),
    responses((status = 200, body = ExperimentView), (status = 404, body = super::Problem)))]
pub async fn stop(
    State(s): State<AppState>,
    auth: Auth,
    rid: RequestId,
    Path(id): Path<i64>,
    ApiJson(req): ApiJson<StopExperiment>,
) -> ApiResult<Json<ExperimentView>> {
    let by = auth.actor(Action::ExperimentStop, &rid)?;
    let reason = Reason::parse(&req.reason)?;
    Ok(Json(view_for(s.actions.stop_experiment(&by, &reason, id).await?, &auth.principal)))
}

/// Experiment `e` as `who` may see it: a game day still running shows players only that
/// it runs, where, by whom and since when (see [`ExperimentView::hidden`]).
pub fn view_for(mut e: ExperimentRow, who: &Principal) -> ExperimentView {
    let shown = crate::actions::sees_injected(&e, who);
    if !shown {
        crate::actions::hide_injected(&mut e);
    }
    let mut v = ExperimentView::from(e);
    if !shown {
        // Only a running game day is hidden (its spec, which says so, is left out).
        v.game_day = true;
        v.hidden = true;
        v.fault_id = String::new();
    }
    v
}

/// The report of experiment `id` as `who` may see it.
///
/// # Errors
/// 404 when there is no such experiment.
pub async fn report(s: &AppState, id: i64, who: &Principal) -> ApiResult<ExperimentReport> {
    let e = s.store.experiment(id).await?.ok_or_else(|| ApiError::NotFound(format!("no experiment {id}")))?;
    if !crate::actions::sees_injected(&e, who) {
        let started = TimelineEvent {
            at: e.created_at,
            event: "started".into(),
            by: Some(e.created_by.clone()),
            detail: "game day: what it injected is shown when it ends".into(),
        };
        let experiment = view_for(e, who);
        return Ok(ExperimentReport {
            experiment,
            probes: Vec::new(),
            readings: Vec::new(),
            timeline: vec![started],
            game_day: None,
        });
    }
    let mut r = crate::experiments::report::report(&e, s.store.experiment_readings(id).await?)?;
    let game_day = if crate::actions::is_game_day(&e) {
        let g = game_day::report(&s.store, &e, r.spec.as_ref(), &r.readings).await?;
        game_day::moments(&g, &mut r.timeline);
        Some(g)
    } else {
        None
    };
    Ok(ExperimentReport {
        experiment: e.into(),
        probes: r.probes,
        readings: r.readings,
        timeline: r.timeline,
        game_day,
    })
}

//! Scheduled changes of an environment: a flag value, a policy or a profile application at
//! a time, with an optional automatic revert, or an experiment started at a time;
//! rescheduled or cancelled while pending.

use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use levee_agent::policy::{Policy, Timestamp};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::flags::ReasonQuery;
use super::requests::{change_kind, need};
use super::{ApiJson, ApiQuery, ApiResult, Auth};
use crate::actions::{Action, NewSchedule, Planned, Reason};
use crate::db::{ChangeKind, ScheduledRow, ScheduledState};
use crate::experiments::{ExperimentSpec, new_experiment};
use crate::web::{AppState, RequestId, of_environment};

/// A scheduled change and how it ended.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct ScheduledView {
    pub id: i64,
    /// The service of a flag, policy or experiment change; `null` for a profile.
    pub service: Option<String>,
    /// `flag`, `policy`, `profile` or `experiment`.
    pub kind: String,
    /// The flag key, `policy`, the profile name, or the experiment's name.
    pub target: String,
    /// What is set: the flag value, the policy, `{"expires_at": …}` of a profile, or the
    /// experiment's spec.
    #[schema(value_type = Object)]
    pub value: Value,
    /// When it is applied.
    #[serde(with = "levee_agent::policy::rfc3339")]
    #[schema(value_type = String, format = DateTime)]
    pub run_at: i64,
    /// When what it replaced is put back; `null`: never (a profile ends at its expiry).
    #[serde(with = "levee_agent::policy::rfc3339::option")]
    #[schema(value_type = Option<String>, format = DateTime)]
    pub revert_at: Option<i64>,
    /// The scheduled change this one reverts.
    pub reverts: Option<i64>,
    /// The service's revision when it was scheduled; the target must be unchanged since,
    /// else the change ends as `conflict` without being applied.
    pub base_revision: Option<u64>,
    pub state: ScheduledState,
    pub created_by: String,
    /// The break-glass reason it was scheduled with, if any: when it runs where its kind
    /// needs approval, it is applied as a bypass (audited then) instead of refused.
    pub break_glass: Option<String>,
    #[serde(with = "levee_agent::policy::rfc3339")]
    #[schema(value_type = String, format = DateTime)]
    pub created_at: i64,
    pub reason: String,
    /// What happened: the revision made, the conflict, the error.
    pub outcome: Option<String>,
    /// The revision it made.
    pub revision: Option<u64>,
    /// The experiment a scheduled experiment started (`GET /experiments/{id}`).
    pub experiment_id: Option<i64>,
    /// When it ended (applied, conflict, failed, cancelled).
    #[serde(with = "levee_agent::policy::rfc3339::option")]
    #[schema(value_type = Option<String>, format = DateTime)]
    pub finished_at: Option<i64>,
    /// The server replica that claimed it last to run it (its run id); `null` while it
    /// was never claimed.
    pub claimed_by: Option<String>,
    /// Until when that claim holds: a change still `running` after it (its replica died)
    /// is taken over by another replica. `null` while never claimed.
    #[serde(with = "levee_agent::policy::rfc3339::option")]
    #[schema(value_type = Option<String>, format = DateTime)]
    pub claim_expires_at: Option<i64>,
}

impl From<ScheduledRow> for ScheduledView {
    fn from(c: ScheduledRow) -> Self {
        ScheduledView {
            id: c.id,
            service: c.service,
            kind: c.kind.as_str().to_string(),
            target: c.target,
            value: serde_json::from_str(&c.payload).unwrap_or(Value::Null),
            run_at: c.run_at,
            revert_at: c.revert_at,
            reverts: c.reverts,
            base_revision: c.base_revision,
            state: c.state,
            created_by: c.created_by,
            break_glass: c.break_glass,
            created_at: c.created_at,
            reason: c.reason,
            outcome: c.outcome,
            revision: c.revision,
            experiment_id: c.experiment_id,
            finished_at: c.finished_at,
            claimed_by: c.claimed_by,
            claim_expires_at: c.claim_expires_at,
        }
    }
}

/// Body of `POST .../scheduled-changes`. `kind` says which fields it needs: `flag` —
/// `service`, `flag`, `value`; `policy` — `service`, `policy`; `profile` — `profile` and
/// `revert_at` (its expiry); `experiment` — `experiment` (as `POST /experiments` takes it;
/// no `revert_at`: it ends by itself).
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct NewScheduled {
    /// `flag`, `policy`, `profile` or `experiment`.
    pub kind: String,
    #[serde(default)]
    pub service: Option<String>,
    /// The flag's key.
    #[serde(default)]
    pub flag: Option<String>,
    /// The flag's new value.
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    pub value: Option<Value>,
    /// The new policy.
    #[serde(default)]
    pub policy: Option<Policy>,
    /// The profile to apply.
    #[serde(default)]
    pub profile: Option<String>,
    /// The experiment to start, in the environment of the path.
    #[serde(default)]
    pub experiment: Option<ExperimentSpec>,
    /// When to apply it (in the future).
    pub run_at: Timestamp,
    /// When to put back what it replaced (after `run_at`); for a profile, its expiry.
    #[serde(default)]
    pub revert_at: Option<Timestamp>,
    /// Why, recorded in the audit log; required.
    pub reason: String,
}

/// Body of `PATCH .../scheduled-changes/{id}`: a new time for a pending change.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Reschedule {
    pub run_at: Timestamp,
    /// The change's automatic revert (a profile's expiry): left out, it is kept as it is
    /// (422 if it would then come before `run_at`); a time moves it; `null` drops it (not
    /// for a profile, which needs an end).
    #[serde(default, deserialize_with = "present")]
    #[schema(value_type = Option<String>, format = DateTime)]
    pub revert_at: Option<Option<Timestamp>>,
    /// Why, recorded in the audit log; required.
    pub reason: String,
}

/// Query of the list.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct ListQuery {
    /// Only the changes of this service.
    pub service: Option<String>,
}

/// A field that is present, `null` included (`Some(None)`); absent is `None` (`default`).
fn present<'de, D: serde::Deserializer<'de>, T: Deserialize<'de>>(
    d: D,
) -> Result<Option<Option<T>>, D::Error> {
    Option::<T>::deserialize(d).map(Some)
}

/// Scheduled changes: pending ones by time, then the last 100 that ended, newest first.
#[utoipa::path(get, path = "/api/v1/environments/{env}/scheduled-changes", tag = "schedule",
    params(("env" = String, Path), ListQuery), responses((status = 200, body = [ScheduledView])))]
pub async fn list(
    State(s): State<AppState>,
    a: Auth,
    Path(env): Path<String>,
    ApiQuery(q): ApiQuery<ListQuery>,
) -> ApiResult<Json<Vec<ScheduledView>>> {
    let rows = s.store.scheduled_changes(&env, q.service.as_deref()).await?;
    seen(&s, rows, &a).await
}

/// One scheduled change.
#[utoipa::path(get, path = "/api/v1/environments/{env}/scheduled-changes/{id}", tag = "schedule",
    params(("env" = String, Path), ("id" = i64, Path)),
    responses((status = 200, body = ScheduledView), (status = 404, body = super::Problem)))]
pub async fn get_one(
    State(s): State<AppState>,
    a: Auth,
    Path((env, id)): Path<(String, i64)>,
) -> ApiResult<Json<ScheduledView>> {
    let c = in_env(&s, &env, id).await?;
    one_seen(&s, c, &a).await
}

/// Schedules a change (operator, and the role of the change itself).
#[utoipa::path(post, path = "/api/v1/environments/{env}/scheduled-changes", tag = "schedule",
    request_body = NewScheduled, params(("env" = String, Path)),
    responses((status = 201, body = ScheduledView), (status = 404, body = super::Problem),
              (status = 422, body = super::Problem)))]
pub async fn create(
    State(s): State<AppState>,
    auth: Auth,
    rid: RequestId,
    Path(env): Path<String>,
    ApiJson(req): ApiJson<NewScheduled>,
) -> ApiResult<(StatusCode, Json<ScheduledView>)> {
    let by = auth.actor(Action::ScheduleCreate, &rid)?;
    let reason = Reason::parse(&req.reason)?;
    let kind = req.kind.as_str();
    let change = match change_kind(kind)? {
        ChangeKind::Flag => Planned::Flag {
            service: need(req.service, "service", kind)?,
            key: need(req.flag, "flag", kind)?,
            value: need(req.value, "value", kind)?,
        },
        ChangeKind::Policy => Planned::Policy {
            service: need(req.service, "service", kind)?,
            policy: Box::new(need(req.policy, "policy", kind)?),
        },
        ChangeKind::Profile => Planned::Profile { name: need(req.profile, "profile", kind)? },
        ChangeKind::Experiment => {
            Planned::Experiment(Box::new(new_experiment(&need(req.experiment, "experiment", kind)?)?))
        }
    };
    let new = NewSchedule { env, change, run_at: req.run_at, revert_at: req.revert_at };
    let c = s.actions.schedule_change(&by, &reason, new).await?;
    Ok((StatusCode::CREATED, Json(c.into())))
}

/// Moves a pending change to another time (operator): the old time no longer exists; its
/// revert is kept unless `revert_at` says otherwise. Where the change's kind needs approval,
/// moving it does too (403, or `X-Levee-Break-Glass`).
#[utoipa::path(patch, path = "/api/v1/environments/{env}/scheduled-changes/{id}", tag = "schedule",
    request_body = Reschedule, params(("env" = String, Path), ("id" = i64, Path)),
    responses((status = 200, body = ScheduledView), (status = 404, body = super::Problem),
              (status = 422, body = super::Problem)))]
pub async fn reschedule(
    State(s): State<AppState>,
    auth: Auth,
    rid: RequestId,
    Path((env, id)): Path<(String, i64)>,
    ApiJson(req): ApiJson<Reschedule>,
) -> ApiResult<Json<ScheduledView>> {
    let by = auth.actor(Action::ScheduleUpdate, &rid)?;
    let reason = Reason::parse(&req.reason)?;
    in_env(&s, &env, id).await?;
    let c = s.actions.reschedule_change(&by, &reason, id, Some(req.run_at), req.revert_at).await?;
    one_seen(&s, c, &auth).await
}

/// Cancels a pending change (operator).
#[utoipa::path(delete, path = "/api/v1/environments/{env}/scheduled-changes/{id}", tag = "schedule",
    params(("env" = String, Path), ("id" = i64, Path), ReasonQuery),
    responses((status = 200, body = ScheduledView), (status = 404, body = super::Problem)))]
pub async fn cancel(
    State(s): State<AppState>,
    auth: Auth,
    rid: RequestId,
    Path((env, id)): Path<(String, i64)>,
    ApiQuery(q): ApiQuery<ReasonQuery>,
) -> ApiResult<Json<ScheduledView>> {
    let by = auth.actor(Action::ScheduleCancel, &rid)?;
    let reason = Reason::parse(q.reason.as_deref().unwrap_or(""))?;
    in_env(&s, &env, id).await?;
    let c = s.actions.reschedule_change(&by, &reason, id, None, None).await?;
    one_seen(&s, c, &auth).await
}

/// Scheduled changes as the caller may see them: a scheduled game day hides what it would
/// inject from its players (`actions::scheduled_as_seen`).
async fn seen(s: &AppState, rows: Vec<ScheduledRow>, a: &Auth) -> ApiResult<Json<Vec<ScheduledView>>> {
    let rows = crate::actions::scheduled_as_seen(&s.store, rows, &a.principal).await?;
    Ok(Json(rows.into_iter().map(Into::into).collect()))
}

async fn one_seen(s: &AppState, c: ScheduledRow, a: &Auth) -> ApiResult<Json<ScheduledView>> {
    let Json(mut v) = seen(s, vec![c], a).await?;
    Ok(Json(v.pop().expect("one row in, one out")))
}

async fn in_env(s: &AppState, env: &str, id: i64) -> ApiResult<ScheduledRow> {
    Ok(of_environment(s.store.scheduled(id).await?, env, id)?)
}

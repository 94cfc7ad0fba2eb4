//! Four-eyes: the kinds of change that need approval per environment, and change requests
//! (propose, edit, approve with the diff reviewed, reject, apply exactly what was approved).
//! Break-glass is the `X-Levee-Break-Glass: <reason>` header on the change itself.

use std::time::Duration;

use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use levee_agent::policy::Policy;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::{ApiError, ApiJson, ApiResult, Auth};
use crate::actions::{Action, BadInput, Proposal, Reason, request_sides};
use crate::db::{ChangeKind, RequestRow, RequestState};
use crate::diff::{DiffEntry, json_diff};
use crate::experiments::{ExperimentSpec, new_experiment};
use crate::web::{AppState, RequestId, of_environment};

/// The kinds of change that need an approved change request in an environment.
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ApprovalRules {
    /// Any of `policy` (a service's policy), `flag` (a service's flags), `profile`
    /// (applying an emergency profile), `experiment` (starting an experiment). A rule
    /// covers what a write changes, whatever endpoint carries it.
    pub kinds: Vec<String>,
}

/// Body of `PUT .../approval-rules`.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PutApprovalRules {
    pub kinds: Vec<String>,
    /// Why, recorded in the audit log; required.
    pub reason: String,
}

/// A change request with the diff its reviewer approves.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct RequestView {
    pub id: i64,
    /// `flag`, `policy`, `profile` or `experiment`.
    pub kind: String,
    pub service: Option<String>,
    /// The flag key, `policy`, the profile name, or the experiment's name.
    pub target: String,
    /// What is proposed: the flag value, the policy, `{"expires_in_ms": …}`, or the
    /// experiment's whole definition.
    #[schema(value_type = Object)]
    pub proposed: Value,
    /// Every difference from the target as it was when proposed to what applying makes.
    pub diff: Vec<DiffEntry>,
    /// The service's revision the diff is against.
    pub base_revision: Option<u64>,
    /// Bumped by every edit; an approval names the version approved.
    pub version: u64,
    pub state: RequestState,
    pub proposed_by: String,
    #[serde(with = "levee_agent::policy::rfc3339")]
    #[schema(value_type = String, format = DateTime)]
    pub proposed_at: i64,
    pub reason: String,
    pub approved_by: Option<String>,
    #[serde(with = "levee_agent::policy::rfc3339::option")]
    #[schema(value_type = Option<String>, format = DateTime)]
    pub approved_at: Option<i64>,
    pub approved_version: Option<u64>,
    /// Why it was approved or rejected.
    pub decided_reason: Option<String>,
    pub applied_by: Option<String>,
    #[serde(with = "levee_agent::policy::rfc3339::option")]
    #[schema(value_type = Option<String>, format = DateTime)]
    pub applied_at: Option<i64>,
    /// The revision applying made.
    pub revision: Option<u64>,
    /// What happened when it was applied (or why it conflicted).
    pub outcome: Option<String>,
    /// The experiment applying it started (`GET /experiments/{id}`).
    pub experiment_id: Option<i64>,
}

impl From<RequestRow> for RequestView {
    fn from(r: RequestRow) -> Self {
        let (before, after) = request_sides(&r);
        RequestView {
            id: r.id,
            diff: json_diff(&before, &after),
            proposed: serde_json::from_str(&r.payload).unwrap_or(Value::Null),
            kind: r.kind.as_str().to_string(),
            service: r.service,
            target: r.target,
            base_revision: r.base_revision,
            version: r.version,
            state: r.state,
            proposed_by: r.proposed_by,
            proposed_at: r.proposed_at,
            reason: r.reason,
            approved_by: r.approved_by,
            approved_at: r.approved_at,
            approved_version: r.approved_version,
            decided_reason: r.decided_reason,
            applied_by: r.applied_by,
            applied_at: r.applied_at,
            revision: r.revision,
            outcome: r.outcome,
            experiment_id: r.experiment_id,
        }
    }
}

/// Body of `POST .../change-requests` and of an edit. `kind` says which fields it needs:
/// `flag` — `service`, `flag`, `value`; `policy` — `service`, `policy`; `profile` —
/// `profile`, `expires_in`; `experiment` — `experiment` (as `POST /experiments` takes it,
/// which proposes one by itself where a rule covers experiments).
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ProposeBody {
    pub kind: String,
    #[serde(default)]
    pub service: Option<String>,
    #[serde(default)]
    pub flag: Option<String>,
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    pub value: Option<Value>,
    #[serde(default)]
    pub policy: Option<Policy>,
    #[serde(default)]
    pub profile: Option<String>,
    /// How long the profile stays applied once the request is applied, e.g. `"2h"`.
    #[serde(default, with = "levee_agent::policy::duration::option")]
    #[schema(value_type = Option<levee_agent::policy::duration::Text>, example = "2h")]
    pub expires_in: Option<Duration>,
    #[serde(default)]
    pub experiment: Option<ExperimentSpec>,
    /// Why, recorded in the audit log and shown to the reviewer; required.
    pub reason: String,
}

/// Body of `POST .../approve`.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ApproveBody {
    /// The version reviewed (409 when the request was edited since).
    pub version: u64,
    /// Why, recorded in the audit log; required.
    pub reason: String,
}

/// Body of `POST .../reject` and `POST .../apply`.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct DecideBody {
    /// Why, recorded in the audit log; required.
    pub reason: String,
}

/// `field` of a change request or scheduled change of `kind`, which that kind requires
/// (a rule between fields: 422).
pub(super) fn need<T>(v: Option<T>, field: &str, kind: &str) -> ApiResult<T> {
    v.ok_or_else(|| BadInput::rule(field, "", format!("required for a {kind} change")).into())
}

/// The kind a request body names, or its refusal naming the kinds there are (the document
/// lists them as an enum).
pub(super) fn change_kind(kind: &str) -> ApiResult<ChangeKind> {
    ChangeKind::parse(kind)
        .map_err(|_| ApiError::bad_field("kind", format!("{kind:?}"), ChangeKind::allowed()))
}

fn proposal(b: ProposeBody) -> ApiResult<Proposal> {
    let kind = b.kind.as_str();
    Ok(match change_kind(kind)? {
        ChangeKind::Flag => Proposal::Flag {
            service: need(b.service, "service", kind)?,
            key: need(b.flag, "flag", kind)?,
            value: need(b.value, "value", kind)?,
        },
        ChangeKind::Policy => Proposal::Policy {
            service: need(b.service, "service", kind)?,
            policy: Box::new(need(b.policy, "policy", kind)?),
        },
        ChangeKind::Profile => Proposal::Profile {
            name: need(b.profile, "profile", kind)?,
            lasts: need(b.expires_in, "expires_in", kind)?,
        },
        ChangeKind::Experiment => {
            let spec = need(b.experiment, "experiment", kind)?;
            Proposal::Experiment(Box::new(new_experiment(&spec)?))
        }
    })
}

async fn in_env(s: &AppState, env: &str, id: i64) -> ApiResult<RequestRow> {
    Ok(of_environment(s.store.request(id).await?, env, id)?)
}

/// The kinds of change that need approval in an environment.
#[utoipa::path(get, path = "/api/v1/environments/{env}/approval-rules", tag = "change-requests",
    params(("env" = String, Path)), responses((status = 200, body = ApprovalRules)))]
pub async fn get_rules(
    State(s): State<AppState>,
    _a: Auth,
    Path(env): Path<String>,
) -> ApiResult<Json<ApprovalRules>> {
    Ok(Json(ApprovalRules { kinds: words(&s.store.approval_kinds(&env).await?) }))
}

/// Sets the kinds of change that need approval in an environment (admin).
#[utoipa::path(put, path = "/api/v1/environments/{env}/approval-rules", tag = "change-requests",
    request_body = PutApprovalRules, params(("env" = String, Path)),
    responses((status = 200, body = ApprovalRules), (status = 422, body = super::Problem)))]
pub async fn put_rules(
    State(s): State<AppState>,
    auth: Auth,
    rid: RequestId,
    Path(env): Path<String>,
    ApiJson(req): ApiJson<PutApprovalRules>,
) -> ApiResult<Json<ApprovalRules>> {
    let by = auth.actor(Action::ApprovalRules, &rid)?;
    let reason = Reason::parse(&req.reason)?;
    let kinds = words(&s.actions.set_approval_rules(&by, &reason, &env, req.kinds).await?);
    Ok(Json(ApprovalRules { kinds }))
}

/// Change requests of an environment: open and approved first.
#[utoipa::path(get, path = "/api/v1/environments/{env}/change-requests", tag = "change-requests",
    params(("env" = String, Path)), responses((status = 200, body = [RequestView])))]
pub async fn list(
    State(s): State<AppState>,
    _a: Auth,
    Path(env): Path<String>,
) -> ApiResult<Json<Vec<RequestView>>> {
    Ok(Json(s.store.requests(&env).await?.into_iter().map(Into::into).collect()))
}

/// One change request, with the diff to review.
#[utoipa::path(get, path = "/api/v1/environments/{env}/change-requests/{id}", tag = "change-requests",
    params(("env" = String, Path), ("id" = i64, Path)),
    responses((status = 200, body = RequestView), (status = 404, body = super::Problem)))]
pub async fn get_one(
    State(s): State<AppState>,
    _a: Auth,
    Path((env, id)): Path<(String, i64)>,
) -> ApiResult<Json<RequestView>> {
    Ok(Json(in_env(&s, &env, id).await?.into()))
}

/// Proposes a change for review (the role of the change itself).
#[utoipa::path(post, path = "/api/v1/environments/{env}/change-requests", tag = "change-requests",
    request_body = ProposeBody, params(("env" = String, Path)),
    responses((status = 201, body = RequestView), (status = 422, body = super::Problem)))]
pub async fn create(
    State(s): State<AppState>,
    auth: Auth,
    rid: RequestId,
    Path(env): Path<String>,
    ApiJson(req): ApiJson<ProposeBody>,
) -> ApiResult<(StatusCode, Json<RequestView>)> {
    let by = auth.actor(Action::RequestCreate, &rid)?;
    let reason = Reason::parse(&req.reason)?;
    let p = proposal(req)?;
    let r = s.actions.propose(&by, &reason, &env, p).await?;
    Ok((StatusCode::CREATED, Json(r.into())))
}

/// Replaces what a request proposes (its proposer only): a new version; an approval is void.
#[utoipa::path(put, path = "/api/v1/environments/{env}/change-requests/{id}", tag = "change-requests",
    request_body = ProposeBody, params(("env" = String, Path), ("id" = i64, Path)),
    responses((status = 200, body = RequestView), (status = 403, body = super::Problem)))]
pub async fn edit(
    State(s): State<AppState>,
    auth: Auth,
    rid: RequestId,
    Path((env, id)): Path<(String, i64)>,
    ApiJson(req): ApiJson<ProposeBody>,
) -> ApiResult<Json<RequestView>> {
    let by = auth.actor(Action::RequestUpdate, &rid)?;
    let reason = Reason::parse(&req.reason)?;
    in_env(&s, &env, id).await?;
    let p = proposal(req)?;
    Ok(Json(s.actions.edit_request(&by, &reason, id, p).await?.into()))
}

/// Approves the version reviewed (not by its proposer).
#[utoipa::path(post, path = "/api/v1/environments/{env}/change-requests/{id}/approve", tag = "change-requests",
    request_body = ApproveBody, params(("env" = String, Path), ("id" = i64, Path)),
    responses((status = 200, body = RequestView), (status = 403, body = super::Problem),
              (status = 409, body = super::Problem)))]
pub async fn approve(
    State(s): State<AppState>,
    auth: Auth,
    rid: RequestId,
    Path((env, id)): Path<(String, i64)>,
    ApiJson(req): ApiJson<ApproveBody>,
) -> ApiResult<Json<RequestView>> {
    let by = auth.actor(Action::RequestApprove, &rid)?;
    let reason = Reason::parse(&req.reason)?;
    in_env(&s, &env, id).await?;
    Ok(Json(s.actions.approve_request(&by, &reason, id, req.version).await?.into()))
}

/// Rejects (or withdraws) a request.
#[utoipa::path(post, path = "/api/v1/environments/{env}/change-requests/{id}/reject", tag = "change-requests",
    request_body = DecideBody, params(("env" = String, Path), ("id" = i64, Path)),
    responses((status = 200, body = RequestView), (status = 404, body = super::Problem)))]
pub async fn reject(
    State(s): State<AppState>,
    auth: Auth,
    rid: RequestId,
    Path((env, id)): Path<(String, i64)>,
    ApiJson(req): ApiJson<DecideBody>,
) -> ApiResult<Json<RequestView>> {
    let by = auth.actor(Action::RequestReject, &rid)?;
    let reason = Reason::parse(&req.reason)?;
    in_env(&s, &env, id).await?;
    Ok(Json(s.actions.reject_request(&by, &reason, id).await?.into()))
}

/// Applies an approved request exactly as approved; a target changed since its proposal
/// (a flag, a policy, a profile's definition), or an approver since disabled or demoted, is
/// a 409 `approval-void` and the request ends as `conflict`.
#[utoipa::path(post, path = "/api/v1/environments/{env}/change-requests/{id}/apply", tag = "change-requests",
    request_body = DecideBody, params(("env" = String, Path), ("id" = i64, Path)),
    responses((status = 200, body = RequestView), (status = 404, body = super::Problem),
              (status = 409, body = super::Problem, description = "approval-void: what was approved \
               changed since, or its approver can no longer approve it; nothing was applied")))]
pub async fn apply(
    State(s): State<AppState>,
    auth: Auth,
    rid: RequestId,
    Path((env, id)): Path<(String, i64)>,
    ApiJson(req): ApiJson<DecideBody>,
) -> ApiResult<Json<RequestView>> {
    let by = auth.actor(Action::RequestApply, &rid)?;
    let reason = Reason::parse(&req.reason)?;
    in_env(&s, &env, id).await?;
    Ok(Json(s.experiments.apply_request(&by, &reason, id).await?.into()))
}

/// Kinds as the API writes them.
fn words(kinds: &[ChangeKind]) -> Vec<String> {
    kinds.iter().map(|k| k.as_str().to_string()).collect()
}

//! Services, their policy, snapshot, history, diff and rollback.

use std::collections::BTreeMap;

use axum::Json;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use levee_agent::policy::{Flag, Lint, Policy, ServiceConfig};
use serde::{Deserialize, Serialize};

use super::{ApiError, ApiJson, ApiQuery, ApiResult, Auth};
use crate::actions::{Action, Declared, Missing, NewService, Reason, ReasonError, ServiceAt, Written};
use crate::advice::{self, BulkheadSizing};
use crate::db::{RevisionMeta, SnapshotRow};
use crate::diff::{DiffEntry, json_diff};
use crate::web::{AppState, RequestId};

/// A service as listed.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct ServiceSummary {
    /// Environment the service belongs to.
    pub environment: String,
    /// Name, unique in its environment.
    pub name: String,
    /// Free text given at creation.
    pub description: String,
    /// Current revision; the first is 1 and every change that alters the service makes the next.
    pub revision: u64,
    /// Last change (RFC 3339).
    #[serde(with = "levee_agent::policy::rfc3339")]
    #[schema(value_type = String, format = DateTime)]
    pub updated_at: i64,
}

/// One service as the API shows it: the summary, what the server advises about its
/// policy, and the size Little's law suggests for each bulkhead.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct ServiceView {
    #[serde(flatten)]
    pub summary: ServiceSummary,
    /// Warnings about the current policy: its own lints and those that need the
    /// environment and the agents' reports (chains of retries, bulkhead sizes, readiness,
    /// features on a fallback past their alert).
    pub lints: Vec<Lint>,
    /// Every bulkhead of the policy with the Little's-law size its connected agents
    /// measured (`suggested_size`), next to the configured `max_concurrent`.
    pub bulkheads: Vec<BulkheadSizing>,
}

/// Body of `PUT /environments/{env}/services/{svc}`: what the service declares, as a
/// manifest holds it.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PutService {
    /// Free text shown in lists; default empty.
    #[serde(default)]
    pub description: String,
    /// The whole policy (fields left out take their defaults).
    pub policy: Policy,
    /// Every flag by key; a flag of the service that is not here is deleted. Default none.
    #[serde(default)]
    pub flags: BTreeMap<String, Flag>,
    /// Why, recorded in the audit log; required.
    pub reason: String,
    /// Why this write may undo what the emergency profile active in the environment set
    /// (a flag it switched that this write changes or removes). Without it such a write is
    /// refused (409 `profile-would-undo`); with it, it goes through and the audit row's
    /// reason says `REASON (overrides emergency profile NAME: WHY)`.
    #[serde(default)]
    pub override_profile: Option<String>,
    /// `true`: deliver a policy change as a staged rollout; `false`: at once. Absent: as the
    /// environment's rollout setting says. Flags are always delivered at once.
    #[serde(default)]
    pub staged: Option<bool>,
}

/// Query of `DELETE /environments/{env}/services/{svc}`.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct DeleteServiceQuery {
    /// Why, recorded in the audit log; required.
    pub reason: Option<String>,
    /// Why the deletion may undo what the emergency profile active in the environment set
    /// in the service; without it such a deletion is refused (409 `profile-would-undo`), with
    /// it the audit row's reason says `REASON (overrides emergency profile NAME: WHY)`.
    pub override_profile: Option<String>,
}

/// The `override_profile` of a request: absent, or a reason (never empty).
fn override_reason(text: Option<&str>) -> ApiResult<Option<Reason>> {
    text.map(|t| {
        Reason::parse(t).map_err(|e| match e {
            ReasonError::Missing => ApiError::bad_field(
                "override_profile",
                "\"\"",
                "must say why the emergency profile may be undone (it is recorded in the audit log)",
            ),
            ReasonError::TooLong { chars } => {
                ApiError::bad_field("override_profile", format!("{chars} characters"), e.to_string())
            }
        })
    })
    .transpose()
}

/// Body of `POST /environments/{env}/services`.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateService {
    /// A name (the rule for names is in the 400 answer to a bad one), unique in the
    /// environment.
    pub name: String,
    /// Free text shown in lists; default empty.
    #[serde(default)]
    pub description: String,
    /// The first policy; every default when absent.
    #[serde(default)]
    pub policy: Option<Policy>,
    /// The first flags, by key; default none.
    #[serde(default)]
    pub flags: BTreeMap<String, Flag>,
    /// Why, recorded in the audit log; required.
    pub reason: String,
}

/// Answer of every write that produces a revision.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct WriteResult {
    /// Environment of the service.
    pub environment: String,
    pub service: String,
    /// Revision now current (also the `ETag`; send it as `If-Match` with the next change).
    pub revision: u64,
    /// SHA-256 hex of its snapshot body: the hash agents verify and acknowledge.
    pub hash: String,
    /// `false` when the request changed nothing (no new revision).
    pub changed: bool,
    /// Warnings about the resulting policy.
    pub lints: Vec<Lint>,
    /// The staged rollout this write started (a staged policy change), moved (an immediate
    /// change during it: `stable_revision` is what instances outside its cohort got) or
    /// ended; absent otherwise.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rollout: Option<crate::db::RolloutRow>,
}

/// `GET .../policy` answer.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct PolicyDocument {
    /// Environment of the service.
    pub environment: String,
    pub service: String,
    /// Revision the policy was read at (also the `ETag`; send it back as `If-Match`).
    pub revision: u64,
    pub policy: Policy,
    /// Warnings about the policy.
    pub lints: Vec<Lint>,
}

/// Body of `PUT .../policy`.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PutPolicy {
    /// The whole new policy (fields left out take their defaults).
    pub policy: Policy,
    /// Why, recorded in the audit log; required.
    pub reason: String,
    /// `true`: deliver the change as a staged rollout (cohort first, then wider stages,
    /// halted if the cohort does worse); `false`: to every instance at once. Absent: as the
    /// environment's rollout setting says.
    #[serde(default)]
    pub staged: Option<bool>,
}

/// A stored snapshot: one revision of what agents receive.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct SnapshotDocument {
    /// Environment of the service.
    pub environment: String,
    pub service: String,
    pub revision: u64,
    /// SHA-256 hex of the canonical body.
    pub hash: String,
    /// When it was written (RFC 3339).
    #[serde(with = "levee_agent::policy::rfc3339")]
    #[schema(value_type = String, format = DateTime)]
    pub created_at: i64,
    /// The body: what agents receive.
    pub config: ServiceConfig,
}

/// Body of `POST .../rollback`.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Rollback {
    /// Revision whose content becomes current again (as a new revision).
    pub to_revision: u64,
    /// Why, recorded in the audit log; required.
    pub reason: String,
}

/// Query of `GET .../revisions`.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct RevisionsQuery {
    /// Most entries (default 100; the allowed range is in the 400 answer).
    pub limit: Option<i64>,
}

/// Query of `GET .../revisions/{rev}/diff`.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct DiffQuery {
    /// Revision to compare with (default: the one before).
    pub against: Option<u64>,
}

/// Diff between two revisions.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct RevisionDiff {
    /// Older revision (0: the empty configuration before the first).
    pub from: u64,
    /// Newer revision (the one asked for).
    pub to: u64,
    /// Every changed leaf, in path order.
    pub changes: Vec<DiffEntry>,
}

/// Most entries of one history or audit page.
pub(super) const MAX_PAGE: i64 = 1000;

/// Checks the `limit` of a history or audit page (default 100).
pub(super) fn page_limit(limit: Option<i64>) -> ApiResult<i64> {
    let limit = limit.unwrap_or(100);
    if !(1..=MAX_PAGE).contains(&limit) {
        return Err(ApiError::bad_field(
            "limit",
            limit.to_string(),
            format!("must be between 1 and {MAX_PAGE}"),
        ));
    }
    Ok(limit)
}

/// Parses `If-Match`: `"5"`, `5`, `W/"5"` → Some(5); `*` → None. Absent → Err(428) when
/// `required`, Ok(None) otherwise.
/// The form of an `If-Match` value [`if_match`] reads, for the OpenAPI document: `*`, or a
/// revision number, quoted or not, weak (`W/`) or not.
pub(super) const IF_MATCH_PATTERN: &str = r#"^(\*|(W/)?"?[0-9]{1,19}"?)$"#;

pub(super) fn if_match(headers: &HeaderMap, required: bool) -> ApiResult<Option<u64>> {
    let Some(v) = headers.get(header::IF_MATCH) else {
        return if required {
            Err(ApiError::PreconditionRequired(
                "send If-Match with the revision you read (GET the resource; its ETag), or `*` to overwrite"
                    .into(),
            ))
        } else {
            Ok(None)
        };
    };
    let s = v.to_str().map_err(|_| ApiError::bad_field("If-Match", "", "must be ASCII"))?.trim();
    if s == "*" {
        return Ok(None);
    }
    let inner = s.strip_prefix("W/").unwrap_or(s);
    let inner = inner.strip_prefix('"').unwrap_or(inner);
    let inner = inner.strip_suffix('"').unwrap_or(inner);
    let digits = !inner.is_empty() && inner.len() <= 19 && inner.bytes().all(|b| b.is_ascii_digit());
    digits.then(|| inner.parse::<u64>().ok()).flatten().map(Some).ok_or_else(|| {
        ApiError::bad_field("If-Match", format!("{s:?}"), "must be a revision number such as \"5\", or *")
    })
}

fn etag(rev: u64) -> HeaderValue {
    HeaderValue::from_str(&format!("\"{rev}\"")).expect("digits are a valid header")
}

/// The answer to a write that produces a revision: [`WriteResult`] with the new `ETag`.
pub(super) fn write_response(w: Written, status: StatusCode) -> Response {
    let rev = w.snapshot.revision;
    let body = WriteResult {
        environment: w.snapshot.environment,
        service: w.snapshot.service,
        revision: rev,
        hash: w.snapshot.hash,
        changed: w.changed,
        lints: w.lints,
        rollout: w.rollout,
    };
    (status, [(header::ETAG, etag(rev))], Json(body)).into_response()
}

/// 404 for a service that does not exist (or was deleted), in the actions' words.
fn no_service(env: &str, svc: &str) -> ApiError {
    Missing::Service { env: env.to_string(), service: svc.to_string() }.into()
}

pub(super) async fn service_or_404(s: &AppState, env: &str, svc: &str) -> ApiResult<crate::db::ServiceRow> {
    s.store.service(env, svc).await?.ok_or_else(|| no_service(env, svc))
}

/// The newest snapshot of a service, or 404.
pub(super) async fn latest_or_404(s: &AppState, env: &str, svc: &str) -> ApiResult<SnapshotRow> {
    s.store.latest_snapshot(env, svc).await?.ok_or_else(|| no_service(env, svc))
}

/// The configuration agents have now (the newest snapshot's body), or 404.
pub(super) async fn current_config(s: &AppState, env: &str, svc: &str) -> ApiResult<ServiceConfig> {
    Ok(latest_or_404(s, env, svc).await?.config()?)
}

/// Lists the services of an environment.
#[utoipa::path(get, path = "/api/v1/environments/{env}/services", tag = "services",
    params(("env" = String, Path)), responses((status = 200, body = [ServiceSummary]), (status = 404, body = super::Problem)))]
pub async fn list(
    State(s): State<AppState>,
    _a: Auth,
    Path(env): Path<String>,
) -> ApiResult<Json<Vec<ServiceSummary>>> {
    if s.store.environment(&env).await?.is_none() {
        return Err(ApiError::NotFound(format!("no environment {env:?}")));
    }
    let rows = s.store.services(&env).await?;
    Ok(Json(
        rows.into_iter()
            .map(|r| ServiceSummary {
                environment: r.environment,
                name: r.name,
                description: r.description,
                revision: r.revision,
                updated_at: r.updated_at,
            })
            .collect(),
    ))
}

/// One service with its current revision (also as `ETag`), the server's advice on its
/// policy and the Little's-law size of each bulkhead.
#[utoipa::path(get, path = "/api/v1/environments/{env}/services/{svc}", tag = "services",
    params(("env" = String, Path), ("svc" = String, Path)),
    responses((status = 200, body = ServiceView), (status = 404, body = super::Problem)))]
pub async fn get_one(
    State(s): State<AppState>,
    _a: Auth,
    Path((env, svc)): Path<(String, String)>,
) -> ApiResult<Response> {
    let r = service_or_404(&s, &env, &svc).await?;
    let policy = stored_policy(&r)?;
    let lints = advice::for_service(&s.store, &env, &svc, &policy).await?;
    let bulkheads = advice::bulkheads(&policy, &s.store.agents(&env, &svc).await?);
    let rev = r.revision;
    let summary = ServiceSummary {
        environment: r.environment,
        name: r.name,
        description: r.description,
        revision: r.revision,
        updated_at: r.updated_at,
    };
    Ok(([(header::ETAG, etag(rev))], Json(ServiceView { summary, lints, bulkheads })).into_response())
}

fn stored_policy(r: &crate::db::ServiceRow) -> ApiResult<Policy> {
    serde_json::from_str(&r.policy).map_err(|e| ApiError::Internal(e.into()))
}

/// Replaces what the service declares — description, policy and every flag — in one
/// revision, as `levee apply` does (operator); fault rules and breaker overrides stay.
/// Requires `If-Match` (409 with the current revision on mismatch). While an emergency
/// profile is active in the environment and set flags of the service, a write that would
/// change or remove one of them is refused unless `override_profile` says why.
#[utoipa::path(put, path = "/api/v1/environments/{env}/services/{svc}", tag = "services",
    request_body = PutService, params(("env" = String, Path), ("svc" = String, Path),
        ("If-Match" = String, Header, description = "Revision read, e.g. \"5\", or * to overwrite")),
    responses((status = 200, body = WriteResult), (status = 404, body = super::Problem),
              (status = 409, body = super::Problem, description = "revision-conflict: the service \
               moved past If-Match (`current_revision`); or profile-would-undo: the write would \
               undo flags the active emergency profile set (`profile`: name, applied_by, \
               expires_at, undoes) — revert the profile, or send override_profile with a reason"),
              (status = 422, body = super::Problem),
              (status = 428, body = super::Problem)))]
pub async fn put_service(
    State(s): State<AppState>,
    auth: Auth,
    rid: RequestId,
    headers: HeaderMap,
    Path((env, svc)): Path<(String, String)>,
    ApiJson(req): ApiJson<PutService>,
) -> ApiResult<Response> {
    let by = auth.actor(Action::ServiceApply, &rid)?;
    let at = ServiceAt::new(env, svc, if_match(&headers, true)?).staged(req.staged);
    let reason = Reason::parse(&req.reason)?;
    let declared = Declared::new(req.description, req.policy, req.flags)?;
    let why = override_reason(req.override_profile.as_deref())?;
    let written = s.actions.apply_service(&by, &reason, &at, declared, why.as_ref()).await?;
    Ok(write_response(written, StatusCode::OK))
}

/// Deletes a service (operator): it leaves lists and reads, its flags, fault rules and
/// overrides go. Its history stays readable by revision number, a service created again
/// under its name continues its revisions, and its agents keep the configuration they
/// have. Requires `If-Match`. While an emergency profile active in the environment set
/// flags of the service, deleting it (which undoes them) is refused unless
/// `override_profile` says why.
#[utoipa::path(delete, path = "/api/v1/environments/{env}/services/{svc}", tag = "services",
    params(("env" = String, Path), ("svc" = String, Path), DeleteServiceQuery,
        ("If-Match" = String, Header, description = "Revision read, e.g. \"5\", or * to delete whatever it is")),
    responses((status = 204, description = "deleted"), (status = 404, body = super::Problem),
              (status = 409, body = super::Problem, description = "revision-conflict: the service \
               moved past If-Match (`current_revision`); or profile-would-undo: the active emergency \
               profile set flags of the service (`profile`: name, applied_by, expires_at, undoes) — \
               revert the profile, or send override_profile with a reason"),
              (status = 428, body = super::Problem)))]
pub async fn delete_service(
    State(s): State<AppState>,
    auth: Auth,
    rid: RequestId,
    headers: HeaderMap,
    Path((env, svc)): Path<(String, String)>,
    ApiQuery(q): ApiQuery<DeleteServiceQuery>,
) -> ApiResult<StatusCode> {
    let by = auth.actor(Action::ServiceDelete, &rid)?;
    let at = ServiceAt::new(env, svc, if_match(&headers, true)?);
    let reason = Reason::parse(q.reason.as_deref().unwrap_or(""))?;
    let why = override_reason(q.override_profile.as_deref())?;
    s.actions.delete_service(&by, &reason, &at, why.as_ref()).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// The policy with its revision (also as `ETag`).
#[utoipa::path(get, path = "/api/v1/environments/{env}/services/{svc}/policy", tag = "services",
    params(("env" = String, Path), ("svc" = String, Path)),
    responses((status = 200, body = PolicyDocument), (status = 404, body = super::Problem)))]
pub async fn get_policy(
    State(s): State<AppState>,
    _a: Auth,
    Path((env, svc)): Path<(String, String)>,
) -> ApiResult<Response> {
    let r = service_or_404(&s, &env, &svc).await?;
    let policy = stored_policy(&r)?;
    let lints = advice::for_service(&s.store, &env, &svc, &policy).await?;
    let doc = PolicyDocument { environment: env, service: svc, revision: r.revision, policy, lints };
    Ok(([(header::ETAG, etag(r.revision))], Json(doc)).into_response())
}

/// Warnings about the current policy: its own lints and the server's advice (see the
/// service view).
#[utoipa::path(get, path = "/api/v1/environments/{env}/services/{svc}/lint", tag = "services",
    params(("env" = String, Path), ("svc" = String, Path)), responses((status = 200, body = [Lint])))]
pub async fn get_lint(
    State(s): State<AppState>,
    _a: Auth,
    Path((env, svc)): Path<(String, String)>,
) -> ApiResult<Json<Vec<Lint>>> {
    let r = service_or_404(&s, &env, &svc).await?;
    let policy = stored_policy(&r)?;
    Ok(Json(advice::for_service(&s.store, &env, &svc, &policy).await?))
}

fn snapshot_doc(snap: SnapshotRow) -> ApiResult<SnapshotDocument> {
    let config = snap.config()?;
    Ok(SnapshotDocument {
        environment: snap.environment,
        service: snap.service,
        revision: snap.revision,
        hash: snap.hash,
        created_at: snap.created_at,
        config,
    })
}

/// The current snapshot: exactly what agents receive.
#[utoipa::path(get, path = "/api/v1/environments/{env}/services/{svc}/snapshot", tag = "services",
    params(("env" = String, Path), ("svc" = String, Path)),
    responses((status = 200, body = SnapshotDocument), (status = 404, body = super::Problem)))]
pub async fn get_snapshot(
    State(s): State<AppState>,
    _a: Auth,
    Path((env, svc)): Path<(String, String)>,
) -> ApiResult<Response> {
    // A deleted service keeps its snapshots (its history) but has no current one.
    service_or_404(&s, &env, &svc).await?;
    let snap = latest_or_404(&s, &env, &svc).await?;
    let rev = snap.revision;
    Ok(([(header::ETAG, etag(rev))], Json(snapshot_doc(snap)?)).into_response())
}

/// Revision history, newest first.
#[utoipa::path(get, path = "/api/v1/environments/{env}/services/{svc}/revisions", tag = "history",
    params(("env" = String, Path), ("svc" = String, Path), RevisionsQuery),
    responses((status = 200, body = [RevisionMeta])))]
pub async fn list_revisions(
    State(s): State<AppState>,
    _a: Auth,
    Path((env, svc)): Path<(String, String)>,
    ApiQuery(q): ApiQuery<RevisionsQuery>,
) -> ApiResult<Json<Vec<RevisionMeta>>> {
    let limit = page_limit(q.limit)?;
    service_or_404(&s, &env, &svc).await?;
    Ok(Json(s.store.revisions(&env, &svc, limit).await?))
}

async fn revision_or_404(s: &AppState, env: &str, svc: &str, rev: u64) -> ApiResult<SnapshotRow> {
    s.store
        .revision(env, svc, rev)
        .await?
        .ok_or_else(|| ApiError::NotFound(format!("no revision {rev} of service {svc:?} in {env:?}")))
}

/// One stored revision.
#[utoipa::path(get, path = "/api/v1/environments/{env}/services/{svc}/revisions/{rev}", tag = "history",
    params(("env" = String, Path), ("svc" = String, Path), ("rev" = u64, Path)),
    responses((status = 200, body = SnapshotDocument), (status = 404, body = super::Problem)))]
pub async fn get_revision(
    State(s): State<AppState>,
    _a: Auth,
    Path((env, svc, rev)): Path<(String, String, u64)>,
) -> ApiResult<Json<SnapshotDocument>> {
    Ok(Json(snapshot_doc(revision_or_404(&s, &env, &svc, rev).await?)?))
}

/// What changed between two revisions.
#[utoipa::path(get, path = "/api/v1/environments/{env}/services/{svc}/revisions/{rev}/diff", tag = "history",
    params(("env" = String, Path), ("svc" = String, Path), ("rev" = u64, Path), DiffQuery),
    responses((status = 200, body = RevisionDiff), (status = 404, body = super::Problem)))]
pub async fn diff_revision(
    State(s): State<AppState>,
    _a: Auth,
    Path((env, svc, rev)): Path<(String, String, u64)>,
    ApiQuery(q): ApiQuery<DiffQuery>,
) -> ApiResult<Json<RevisionDiff>> {
    let against = q.against.unwrap_or(rev.saturating_sub(1));
    let new = revision_or_404(&s, &env, &svc, rev).await?;
    let old_body = if against == 0 {
        serde_json::to_value(ServiceConfig::default()).map_err(|e| ApiError::Internal(e.into()))?
    } else {
        revision_or_404(&s, &env, &svc, against).await?.value()?
    };
    let new_body = new.value()?;
    Ok(Json(RevisionDiff { from: against, to: rev, changes: json_diff(&old_body, &new_body) }))
}

/// Creates a service with its first revision (operator).
#[utoipa::path(post, path = "/api/v1/environments/{env}/services", tag = "services", request_body = CreateService,
    params(("env" = String, Path)),
    responses((status = 201, body = WriteResult), (status = 409, body = super::Problem),
              (status = 422, body = super::Problem)))]
pub async fn create(
    State(s): State<AppState>,
    auth: Auth,
    rid: RequestId,
    Path(env): Path<String>,
    ApiJson(req): ApiJson<CreateService>,
) -> ApiResult<Response> {
    let by = auth.actor(Action::ServiceCreate, &rid)?;
    let new = NewService::new(&req.name, req.description, req.policy.unwrap_or_default(), req.flags)?;
    let reason = Reason::parse(&req.reason)?;
    let written = s.actions.create_service(&by, &reason, &env, new).await?;
    Ok(write_response(written, StatusCode::CREATED))
}

/// Replaces the policy (operator). Requires `If-Match` (409 with the current revision on
/// mismatch).
#[utoipa::path(put, path = "/api/v1/environments/{env}/services/{svc}/policy", tag = "services",
    request_body = PutPolicy, params(("env" = String, Path), ("svc" = String, Path),
        ("If-Match" = String, Header, description = "Revision read, e.g. \"5\", or * to overwrite")),
    responses((status = 200, body = WriteResult), (status = 409, body = super::Problem),
              (status = 422, body = super::Problem), (status = 428, body = super::Problem)))]
pub async fn put_policy(
    State(s): State<AppState>,
    auth: Auth,
    rid: RequestId,
    headers: HeaderMap,
    Path((env, svc)): Path<(String, String)>,
    ApiJson(req): ApiJson<PutPolicy>,
) -> ApiResult<Response> {
    let by = auth.actor(Action::PolicyUpdate, &rid)?;
    let at = ServiceAt::new(env, svc, if_match(&headers, true)?).staged(req.staged);
    let reason = Reason::parse(&req.reason)?;
    let written = s.actions.update_policy(&by, &reason, &at, req.policy).await?;
    Ok(write_response(written, StatusCode::OK))
}

/// Makes the content of an older revision current again, as a new revision (operator).
#[utoipa::path(post, path = "/api/v1/environments/{env}/services/{svc}/rollback", tag = "history",
    request_body = Rollback, params(("env" = String, Path), ("svc" = String, Path),
        ("If-Match" = Option<String>, Header, description = "Optional: current revision")),
    responses((status = 200, body = WriteResult), (status = 404, body = super::Problem),
              (status = 409, body = super::Problem)))]
pub async fn rollback(
    State(s): State<AppState>,
    auth: Auth,
    rid: RequestId,
    headers: HeaderMap,
    Path((env, svc)): Path<(String, String)>,
    ApiJson(req): ApiJson<Rollback>,
) -> ApiResult<Response> {
    let by = auth.actor(Action::Rollback, &rid)?;
    let at = ServiceAt::new(env, svc, if_match(&headers, false)?);
    let reason = Reason::parse(&req.reason)?;
    let written = s.actions.rollback(&by, &reason, &at, req.to_revision).await?;
    Ok(write_response(written, StatusCode::OK))
}

#[cfg(test)]
mod tests {
    use axum::http::{HeaderMap, HeaderValue, header};

    use super::{IF_MATCH_PATTERN, if_match};

    /// The documented form of `If-Match` is what `if_match` reads.
    #[test]
    fn the_documented_if_match_pattern_agrees_with_the_parser() {
        let pattern = regex::Regex::new(IF_MATCH_PATTERN).unwrap();
        for value in [
            "*",
            "5",
            "\"5\"",
            "W/\"5\"",
            "W/5",
            "\"5",
            "0",
            "9999999999999999999",
            "99999999999999999999",
            "",
            "null",
            "\"\"",
            "W/",
            "*5",
            "5*",
            "-1",
            "+5",
            "5.0",
            "\"\"5\"\"",
            "w/\"5\"",
            "1 2",
        ] {
            let mut headers = HeaderMap::new();
            headers.insert(header::IF_MATCH, HeaderValue::from_str(value).unwrap());
            assert_eq!(if_match(&headers, true).is_ok(), pattern.is_match(value), "{value:?}");
        }
    }
}

//! Emergency profiles of an environment: definitions (versioned), applying one until an
//! expiry, and reverting the active one.

use std::collections::BTreeMap;
use std::time::Duration;

use axum::Json;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use levee_agent::policy::Timestamp;
use serde::{Deserialize, Serialize};

use super::flags::ReasonQuery;
use super::services::if_match;
use super::{ApiError, ApiJson, ApiQuery, ApiResult, Auth};
use crate::actions::{
    Action, BadInput, Name, Profile, ProfileService, ProfileSpec, Reason, activation_services,
};
use crate::db::ActivationRow;
use crate::web::{AppState, RequestId};

/// A profile: its current version and definition.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct ProfileView {
    /// Name, unique in the environment.
    pub name: String,
    /// Bumped by every change (the `ETag`; send it as `If-Match`).
    pub version: u64,
    /// When the current version was written.
    #[serde(with = "levee_agent::policy::rfc3339")]
    #[schema(value_type = String, format = DateTime)]
    pub updated_at: i64,
    /// Who wrote it.
    pub updated_by: String,
    /// What it sets.
    pub definition: ProfileSpec,
}

impl From<Profile> for ProfileView {
    fn from(p: Profile) -> Self {
        ProfileView {
            name: p.row.name,
            version: p.row.version,
            updated_at: p.row.updated_at,
            updated_by: p.row.updated_by,
            definition: p.spec,
        }
    }
}

/// An application of a profile: who applied it, why, since and until when.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct ActivationView {
    /// The profile applied.
    pub profile: String,
    /// Its version applied.
    pub version: u64,
    /// When it was applied.
    #[serde(with = "levee_agent::policy::rfc3339")]
    #[schema(value_type = String, format = DateTime)]
    pub applied_at: i64,
    /// Who applied it.
    pub applied_by: String,
    /// Why.
    pub reason: String,
    /// When it reverts by itself (on the server, and in every agent even offline).
    #[serde(with = "levee_agent::policy::rfc3339")]
    #[schema(value_type = String, format = DateTime)]
    pub expires_at: i64,
    /// The services it changed.
    pub services: Vec<String>,
    /// When it was reverted; `null` while active.
    #[serde(with = "levee_agent::policy::rfc3339::option")]
    #[schema(value_type = Option<String>, format = DateTime)]
    pub reverted_at: Option<i64>,
    /// Who reverted it (`levee` at its expiry).
    pub reverted_by: Option<String>,
    /// Why it was reverted.
    pub revert_reason: Option<String>,
}

impl From<ActivationRow> for ActivationView {
    fn from(a: ActivationRow) -> Self {
        ActivationView {
            services: activation_services(&a),
            profile: a.profile,
            version: a.version,
            applied_at: a.applied_at,
            applied_by: a.applied_by,
            reason: a.reason,
            expires_at: a.expires_at,
            reverted_at: a.reverted_at,
            reverted_by: a.reverted_by,
            revert_reason: a.revert_reason,
        }
    }
}

/// Body of `PUT .../profiles/{name}`: the definition and the reason.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PutProfile {
    /// What the profile is for and when to use it.
    #[serde(default)]
    pub description: String,
    /// What it sets, by service name.
    pub services: BTreeMap<String, ProfileService>,
    /// Why, recorded in the audit log; required.
    pub reason: String,
}

/// Body of `POST .../profiles/{name}/apply`: until when (exactly one of `expires_at` and
/// `expires_in`) and why.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ApplyProfile {
    /// The profile reverts by itself at this instant (in the future, at most 7 days ahead).
    #[serde(default)]
    pub expires_at: Option<Timestamp>,
    /// Or: it reverts by itself after this long, e.g. `"2h"`.
    #[serde(default, with = "levee_agent::policy::duration::option")]
    #[schema(value_type = Option<levee_agent::policy::duration::Text>, example = "2h")]
    pub expires_in: Option<Duration>,
    /// Why, recorded in the audit log and shown on the service pages; required.
    pub reason: String,
}

/// Body of `POST .../active-profile/revert`.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RevertProfile {
    /// Why, recorded in the audit log; required.
    pub reason: String,
}

fn with_etag(status: StatusCode, view: ProfileView) -> Response {
    let etag = format!("\"{}\"", view.version);
    (status, [(header::ETAG, etag)], Json(view)).into_response()
}

/// Profiles of an environment.
#[utoipa::path(get, path = "/api/v1/environments/{env}/profiles", tag = "profiles",
    params(("env" = String, Path)), responses((status = 200, body = [ProfileView])))]
pub async fn list(
    State(s): State<AppState>,
    _a: Auth,
    Path(env): Path<String>,
) -> ApiResult<Json<Vec<ProfileView>>> {
    let rows = s.store.profiles(&env).await?;
    let views = rows.into_iter().map(|r| Profile::of(r).map(ProfileView::from)).collect::<Result<_, _>>()?;
    Ok(Json(views))
}

/// One profile, with its version as `ETag`.
#[utoipa::path(get, path = "/api/v1/environments/{env}/profiles/{name}", tag = "profiles",
    params(("env" = String, Path), ("name" = String, Path)),
    responses((status = 200, body = ProfileView), (status = 404, body = super::Problem)))]
pub async fn get_one(
    State(s): State<AppState>,
    _a: Auth,
    Path((env, name)): Path<(String, String)>,
) -> ApiResult<Response> {
    let row = s
        .store
        .profile(&env, &name)
        .await?
        .ok_or_else(|| ApiError::NotFound(format!("no profile {name:?} in environment {env:?}")))?;
    Ok(with_etag(StatusCode::OK, Profile::of(row)?.into()))
}

/// Creates or replaces a profile (operator) as its next version. `If-Match` with the
/// version read refuses a lost update (409); `If-Match: "0"` creates only.
#[utoipa::path(put, path = "/api/v1/environments/{env}/profiles/{name}", tag = "profiles",
    request_body = PutProfile, params(("env" = String, Path), ("name" = String, Path)),
    responses((status = 200, body = ProfileView), (status = 201, body = ProfileView),
              (status = 409, body = super::Problem), (status = 422, body = super::Problem)))]
pub async fn put(
    State(s): State<AppState>,
    auth: Auth,
    rid: RequestId,
    headers: HeaderMap,
    Path((env, name)): Path<(String, String)>,
    ApiJson(req): ApiJson<PutProfile>,
) -> ApiResult<Response> {
    let by = auth.actor(Action::ProfileSet, &rid)?;
    let name = Name::parse("name", &name)?;
    let reason = Reason::parse(&req.reason)?;
    let base = if_match(&headers, false)?;
    let spec = ProfileSpec { description: req.description, services: req.services };
    let p = s.actions.put_profile(&by, &reason, &env, &name, &spec, base).await?;
    let status = if p.row.version == 1 { StatusCode::CREATED } else { StatusCode::OK };
    Ok(with_etag(status, p.into()))
}

/// Deletes a profile (operator); its versions stay in the audit log.
#[utoipa::path(delete, path = "/api/v1/environments/{env}/profiles/{name}", tag = "profiles",
    params(("env" = String, Path), ("name" = String, Path), ReasonQuery),
    responses((status = 204), (status = 404, body = super::Problem)))]
pub async fn delete(
    State(s): State<AppState>,
    auth: Auth,
    rid: RequestId,
    Path((env, name)): Path<(String, String)>,
    ApiQuery(q): ApiQuery<ReasonQuery>,
) -> ApiResult<StatusCode> {
    let by = auth.actor(Action::ProfileDelete, &rid)?;
    let reason = Reason::parse(q.reason.as_deref().unwrap_or(""))?;
    s.actions.delete_profile(&by, &reason, &env, &name).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Applies a profile to its environment until an expiry (operator): one new revision per
/// service it names, pushed at once; every entry carries the expiry, so agents drop it by
/// themselves even while the server is unreachable. 409 while another profile is active.
#[utoipa::path(post, path = "/api/v1/environments/{env}/profiles/{name}/apply", tag = "profiles",
    request_body = ApplyProfile, params(("env" = String, Path), ("name" = String, Path)),
    responses((status = 200, body = ActivationView), (status = 404, body = super::Problem),
              (status = 409, body = super::Problem), (status = 422, body = super::Problem)))]
pub async fn apply(
    State(s): State<AppState>,
    auth: Auth,
    rid: RequestId,
    Path((env, name)): Path<(String, String)>,
    ApiJson(req): ApiJson<ApplyProfile>,
) -> ApiResult<Json<ActivationView>> {
    let by = auth.actor(Action::ProfileApply, &rid)?;
    let reason = Reason::parse(&req.reason)?;
    let expires_at = match (req.expires_at, req.expires_in) {
        (Some(t), None) => t,
        (None, Some(d)) => {
            Timestamp::from_unix_ms(Timestamp::now().unix_ms().saturating_add(d.as_millis() as i64))
        }
        _ => {
            return Err(
                BadInput::rule("expires_at", "", "give exactly one of expires_at and expires_in").into()
            );
        }
    };
    let a = s.actions.apply_profile(&by, &reason, &env, &name, expires_at).await?;
    Ok(Json(a.into()))
}

/// The profile active in an environment (404 when none is).
#[utoipa::path(get, path = "/api/v1/environments/{env}/active-profile", tag = "profiles",
    params(("env" = String, Path)),
    responses((status = 200, body = ActivationView), (status = 404, body = super::Problem)))]
pub async fn active(
    State(s): State<AppState>,
    _a: Auth,
    Path(env): Path<String>,
) -> ApiResult<Json<ActivationView>> {
    let a = s
        .store
        .active_profile(&env)
        .await?
        .ok_or_else(|| ApiError::NotFound(format!("no profile is active in environment {env:?}")))?;
    Ok(Json(a.into()))
}

/// Applications of profiles in an environment, newest first (the last 100).
#[utoipa::path(get, path = "/api/v1/environments/{env}/profile-activations", tag = "profiles",
    params(("env" = String, Path)), responses((status = 200, body = [ActivationView])))]
pub async fn activations(
    State(s): State<AppState>,
    _a: Auth,
    Path(env): Path<String>,
) -> ApiResult<Json<Vec<ActivationView>>> {
    Ok(Json(s.store.activations(&env, 100).await?.into_iter().map(Into::into).collect()))
}

/// The answer of a revert: the application reverted, and what the revert left as it is.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct RevertedView {
    #[serde(flatten)]
    pub activation: ActivationView,
    /// Per service, what the revert did not restore, in the words of the service's
    /// `profile.revert` audit row: an entry changed since the profile set it ("flag
    /// recommendations.enabled changed since the profile set it; left as it is"), or a
    /// service whose write failed. Empty when everything was restored.
    pub left: BTreeMap<String, Vec<String>>,
}

/// Reverts the active profile (operator): every entry it set is restored to what it
/// replaced, unless changed since (listed in `left`).
#[utoipa::path(post, path = "/api/v1/environments/{env}/active-profile/revert", tag = "profiles",
    request_body = RevertProfile, params(("env" = String, Path)),
    responses((status = 200, body = RevertedView), (status = 404, body = super::Problem)))]
pub async fn revert(
    State(s): State<AppState>,
    auth: Auth,
    rid: RequestId,
    Path(env): Path<String>,
    ApiJson(req): ApiJson<RevertProfile>,
) -> ApiResult<Json<RevertedView>> {
    let by = auth.actor(Action::ProfileRevert, &rid)?;
    let reason = Reason::parse(&req.reason)?;
    let r = s.actions.revert_profile(&by, &reason, &env).await?;
    Ok(Json(RevertedView { activation: r.activation.into(), left: r.left }))
}

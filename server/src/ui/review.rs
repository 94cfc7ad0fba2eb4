//! Scheduled changes and change requests of an environment, without JavaScript.
//!
//! `GET /ui/environments/{env}/scheduled`: pending changes by time (each with a cancel form)
//! and those that ended (applied, conflict with its reason, failed, cancelled); a form to
//! schedule a flag value with an optional revert.
//!
//! `GET /ui/environments/{env}/requests`: change requests with the diff to review; approve
//! (not one's own), reject, apply an approved one; a form to propose a flag value.
//!
//! Both forms name the flag by choosing it from the environment's flags (never typed by
//! hand), and a refused form comes back as it was typed.

use askama::Template;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Redirect, Response};
use levee_agent::policy::Timestamp;
use serde::Deserialize;

use super::error::UiError;
use super::page::{Layout, Page, When, seg, time};
use super::session::{Posted, UiUser, reason};
use crate::actions::{Action, ChangeError, NewSchedule, Planned, Proposal, request_sides};
use crate::db::{RequestRow, RequestState, ScheduledRow};
use crate::diff::json_diff;
use crate::web::{AppState, RequestId, of_environment};

/// Query after a change: what was done.
#[derive(Debug, Deserialize)]
pub struct DoneQuery {
    pub(super) done: Option<String>,
}

fn says(e: ChangeError) -> Result<String, UiError> {
    match e {
        ChangeError::Invalid(v) => Ok(v.0.iter().map(|f| f.to_string()).collect::<Vec<_>>().join("; ")),
        e @ (ChangeError::InvalidField(_)
        | ChangeError::Conflict { .. }
        | ChangeError::NotFound(_)
        | ChangeError::ApprovalRequired { .. }
        | ChangeError::SelfApproval { .. }
        | ChangeError::NotProposer { .. }
        | ChangeError::ProfileActive { .. }) => Ok(e.to_string()),
        e => Err(e.into()),
    }
}

/// Reads a flag value typed in a form: JSON (`false`, `3`, `"text"`), else the text itself.
fn typed_value(text: &str) -> serde_json::Value {
    serde_json::from_str(text.trim()).unwrap_or_else(|_| serde_json::Value::String(text.to_string()))
}

/// A flag of the environment as a form offers it: `service/key` (a service name has no
/// `/`), in words with its type and value.
pub(super) struct FlagChoice {
    value: String,
    label: String,
    selected: bool,
}

/// Every flag of every service of `env`, `chosen` selected. A service whose revision does
/// not read is left out (its page says why).
async fn flag_choices(s: &AppState, env: &str, chosen: &str) -> Result<Vec<FlagChoice>, UiError> {
    let mut out = Vec::new();
    for row in s.store.services(env).await? {
        let Some(snap) = s.store.latest_snapshot(env, &row.name).await? else { continue };
        let Ok(cfg) = snap.config() else { continue };
        for (key, f) in &cfg.flags {
            let value = format!("{}/{key}", row.name);
            let now: String = f.value.to_string().chars().take(40).collect();
            out.push(FlagChoice {
                label: format!("{}: {key} ({}, now {now})", row.name, f.kind.as_str()),
                selected: value == chosen,
                value,
            });
        }
    }
    Ok(out)
}

/// The service and flag of a chosen `service/key`.
fn flag_target(target: &str) -> Result<(String, String), String> {
    target
        .split_once('/')
        .map(|(s, k)| (s.to_string(), k.to_string()))
        .ok_or_else(|| "flag: choose one of the environment's flags".to_string())
}

/// Reads "in how long" (`30m`, `2h`) as a time from now.
fn from_now(field: &str, text: &str) -> Result<Option<Timestamp>, String> {
    let t = text.trim();
    if t.is_empty() {
        return Ok(None);
    }
    let d = levee_agent::policy::duration::parse(t).map_err(|m| format!("{field}: {m}"))?;
    Ok(Some(Timestamp::from_unix_ms(Timestamp::now().unix_ms().saturating_add(d.as_millis() as i64))))
}

// ---- scheduled changes ------------------------------------------------------------------

struct ScheduledView {
    id: i64,
    what: String,
    value: String,
    run_at: When,
    revert_at: Option<When>,
    state: &'static str,
    by: String,
    reason: String,
    outcome: String,
}

impl ScheduledView {
    fn of(c: &ScheduledRow) -> Self {
        let svc = c.service.as_deref().map(|s| format!("{s}: ")).unwrap_or_default();
        ScheduledView {
            id: c.id,
            what: format!("{svc}{}", describe_scheduled(c)),
            value: c.payload.chars().take(200).collect(),
            run_at: time(c.run_at),
            revert_at: c.revert_at.map(time),
            state: c.state.as_str(),
            by: c.created_by.clone(),
            reason: c.reason.clone(),
            outcome: c.outcome.clone().unwrap_or_default(),
        }
    }
}

fn describe_scheduled(c: &ScheduledRow) -> String {
    crate::actions::describe(c)
}

#[derive(Template)]
#[template(path = "scheduled.html")]
struct ScheduledPage {
    layout: Layout,
    env: String,
    csrf: String,
    can_operate: bool,
    changes: Vec<ScheduledView>,
    flags: Vec<FlagChoice>,
    /// The form as typed (shown again after a refusal).
    form: ScheduleForm,
    notice: Option<String>,
    error: Option<String>,
}

async fn scheduled_page(
    s: &AppState,
    user: &UiUser,
    env: &str,
    notice: Option<String>,
    error: Option<String>,
    form: ScheduleForm,
) -> Result<Response, UiError> {
    s.store.environment(env).await?.ok_or_else(|| UiError::NotFound(format!("no environment {env:?}")))?;
    let changes = s.store.scheduled_changes(env, None).await?;
    // A scheduled game day hides what it would inject from its players.
    let changes = crate::actions::scheduled_as_seen(&s.store, changes, &user.principal).await?;
    let changes = changes.iter().map(ScheduledView::of).collect();
    let flags = flag_choices(s, env, &form.target).await?;
    let status = if error.is_some() { StatusCode::BAD_REQUEST } else { StatusCode::OK };
    let page = ScheduledPage {
        layout: user.layout(),
        env: env.to_string(),
        csrf: user.csrf.clone(),
        can_operate: user.principal.role >= Action::ScheduleCreate.role(),
        changes,
        flags,
        form,
        notice,
        error,
    };
    Ok(Page::with_status(status, page).into_response())
}

/// `GET /ui/environments/{env}/scheduled`.
pub async fn scheduled(
    State(s): State<AppState>,
    user: UiUser,
    Path(env): Path<String>,
    Query(q): Query<DoneQuery>,
) -> Result<Response, UiError> {
    scheduled_page(&s, &user, &env, q.done, None, ScheduleForm::default()).await
}

/// Form scheduling a flag value.
#[derive(Debug, Default, Deserialize)]
pub struct ScheduleForm {
    /// `service/key`.
    #[serde(default)]
    target: String,
    #[serde(default)]
    value: String,
    /// In how long (`30m`).
    #[serde(default)]
    run_in: String,
    /// Revert after how long from now (`2h`); empty: never.
    #[serde(default)]
    revert_in: String,
    #[serde(default)]
    reason: String,
}

/// `POST /ui/environments/{env}/scheduled`.
pub async fn schedule(
    State(s): State<AppState>,
    rid: RequestId,
    Path(env): Path<String>,
    Posted { user, form }: Posted<ScheduleForm>,
) -> Result<Response, UiError> {
    let by = user.actor(Action::ScheduleCreate, &rid)?;
    let parsed = (|| {
        let (service, key) = flag_target(&form.target)?;
        let why = reason(&form.reason)?;
        let run_at = from_now("run in", &form.run_in)?.ok_or("run in: required (e.g. 30m)")?;
        Ok::<_, String>((service, key, why, run_at, from_now("revert in", &form.revert_in)?))
    })();
    let (service, key, why, run_at, revert_at) = match parsed {
        Ok(p) => p,
        Err(m) => return scheduled_page(&s, &user, &env, None, Some(m), form).await,
    };
    let change = Planned::Flag { service, key, value: typed_value(&form.value) };
    let new = NewSchedule { env: env.clone(), change, run_at, revert_at };
    match s.actions.schedule_change(&by, &why, new).await {
        Ok(c) => {
            let msg = format!("Scheduled change {} for {}", c.id, time(c.run_at));
            Ok(Redirect::to(&format!("/ui/environments/{}/scheduled?done={}", seg(&env), seg(&msg)))
                .into_response())
        }
        Err(e) => scheduled_page(&s, &user, &env, None, Some(says(e)?), form).await,
    }
}

/// Form cancelling a scheduled change.
#[derive(Debug, Deserialize)]
pub struct CancelForm {
    #[serde(default)]
    reason: String,
}

/// `POST /ui/environments/{env}/scheduled/{id}/cancel`.
pub async fn cancel(
    State(s): State<AppState>,
    rid: RequestId,
    Path((env, id)): Path<(String, i64)>,
    Posted { user, form }: Posted<CancelForm>,
) -> Result<Response, UiError> {
    let by = user.actor(Action::ScheduleCancel, &rid)?;
    let why = match reason(&form.reason) {
        Ok(r) => r,
        Err(m) => return scheduled_page(&s, &user, &env, None, Some(m), ScheduleForm::default()).await,
    };
    of_environment(s.store.scheduled(id).await?, &env, id)?;
    match s.actions.reschedule_change(&by, &why, id, None, None).await {
        Ok(_) => {
            let msg = format!("Cancelled scheduled change {id}");
            Ok(Redirect::to(&format!("/ui/environments/{}/scheduled?done={}", seg(&env), seg(&msg)))
                .into_response())
        }
        Err(e) => scheduled_page(&s, &user, &env, None, Some(says(e)?), ScheduleForm::default()).await,
    }
}

// ---- change requests --------------------------------------------------------------------

struct RequestView {
    id: i64,
    what: String,
    version: u64,
    state: &'static str,
    by: String,
    at: When,
    reason: String,
    /// path, before, after
    diff: Vec<(String, String, String)>,
    approved_by: String,
    outcome: String,
    /// The user may approve it (not theirs, open).
    approvable: bool,
    /// The user proposed it.
    mine: bool,
}

impl RequestView {
    fn of(r: &RequestRow, user: &UiUser) -> Self {
        let (before, after) = request_sides(r);
        let show = |v: Option<serde_json::Value>| v.map(|v| v.to_string()).unwrap_or_else(|| "—".into());
        RequestView {
            id: r.id,
            what: describe(r),
            version: r.version,
            state: r.state.as_str(),
            by: r.proposed_by.clone(),
            at: time(r.proposed_at),
            reason: r.reason.clone(),
            diff: json_diff(&before, &after)
                .into_iter()
                .map(|d| (d.path, show(d.before), show(d.after)))
                .collect(),
            approved_by: r.approved_by.clone().unwrap_or_default(),
            outcome: r.outcome.clone().unwrap_or_default(),
            approvable: r.state == RequestState::Open && r.proposed_by != user.principal.actor,
            mine: r.proposed_by == user.principal.actor,
        }
    }
}

fn describe(r: &RequestRow) -> String {
    crate::actions::describe_request(r)
}

#[derive(Template)]
#[template(path = "requests.html")]
struct RequestsPage {
    layout: Layout,
    env: String,
    csrf: String,
    can_operate: bool,
    kinds: Vec<&'static str>,
    requests: Vec<RequestView>,
    flags: Vec<FlagChoice>,
    /// The proposal form as typed (shown again after a refusal).
    form: ProposeForm,
    notice: Option<String>,
    error: Option<String>,
}

async fn requests_page(
    s: &AppState,
    user: &UiUser,
    env: &str,
    notice: Option<String>,
    error: Option<String>,
    form: ProposeForm,
) -> Result<Response, UiError> {
    s.store.environment(env).await?.ok_or_else(|| UiError::NotFound(format!("no environment {env:?}")))?;
    let requests = s.store.requests(env).await?.iter().map(|r| RequestView::of(r, user)).collect();
    let status = if error.is_some() { StatusCode::BAD_REQUEST } else { StatusCode::OK };
    let page = RequestsPage {
        layout: user.layout(),
        env: env.to_string(),
        csrf: user.csrf.clone(),
        can_operate: user.principal.role >= Action::RequestCreate.role(),
        kinds: s.store.approval_kinds(env).await?.iter().map(|k| k.as_str()).collect(),
        requests,
        flags: flag_choices(s, env, &form.target).await?,
        form,
        notice,
        error,
    };
    Ok(Page::with_status(status, page).into_response())
}

/// `GET /ui/environments/{env}/requests`.
pub async fn requests(
    State(s): State<AppState>,
    user: UiUser,
    Path(env): Path<String>,
    Query(q): Query<DoneQuery>,
) -> Result<Response, UiError> {
    requests_page(&s, &user, &env, q.done, None, ProposeForm::default()).await
}

/// Form proposing a flag value.
#[derive(Debug, Default, Deserialize)]
pub struct ProposeForm {
    /// `service/key`.
    #[serde(default)]
    target: String,
    #[serde(default)]
    value: String,
    #[serde(default)]
    reason: String,
}

/// `POST /ui/environments/{env}/requests`.
pub async fn propose(
    State(s): State<AppState>,
    rid: RequestId,
    Path(env): Path<String>,
    Posted { user, form }: Posted<ProposeForm>,
) -> Result<Response, UiError> {
    let by = user.actor(Action::RequestCreate, &rid)?;
    let parsed = flag_target(&form.target).and_then(|t| Ok((t, reason(&form.reason)?)));
    let ((service, key), why) = match parsed {
        Ok(p) => p,
        Err(m) => return requests_page(&s, &user, &env, None, Some(m), form).await,
    };
    let p = Proposal::Flag { service, key, value: typed_value(&form.value) };
    match s.actions.propose(&by, &why, &env, p).await {
        Ok(r) => done(&env, format!("Proposed change request {}", r.id)),
        Err(e) => requests_page(&s, &user, &env, None, Some(says(e)?), form).await,
    }
}

fn done(env: &str, msg: String) -> Result<Response, UiError> {
    Ok(Redirect::to(&format!("/ui/environments/{}/requests?done={}", seg(env), seg(&msg))).into_response())
}

/// Form of a decision on a request.
#[derive(Debug, Deserialize)]
pub struct DecideForm {
    /// `approve`, `reject` or `apply`.
    decision: String,
    /// The version shown (for an approval).
    #[serde(default)]
    version: u64,
    #[serde(default)]
    reason: String,
}

/// `POST /ui/environments/{env}/requests/{id}`: approve, reject or apply.
pub async fn decide(
    State(s): State<AppState>,
    rid: RequestId,
    Path((env, id)): Path<(String, i64)>,
    Posted { user, form }: Posted<DecideForm>,
) -> Result<Response, UiError> {
    let action = match form.decision.as_str() {
        "approve" => Action::RequestApprove,
        "reject" => Action::RequestReject,
        "apply" => Action::RequestApply,
        other => {
            return Err(UiError::BadRequest(format!("decision {other:?} is not approve, reject or apply")));
        }
    };
    let by = user.actor(action, &rid)?;
    let why = match reason(&form.reason) {
        Ok(r) => r,
        Err(m) => return requests_page(&s, &user, &env, None, Some(m), ProposeForm::default()).await,
    };
    of_environment(s.store.request(id).await?, &env, id)?;
    let res = match action {
        Action::RequestApprove => s.actions.approve_request(&by, &why, id, form.version).await,
        Action::RequestReject => s.actions.reject_request(&by, &why, id).await,
        _ => s.experiments.apply_request(&by, &why, id).await,
    };
    match res {
        Ok(r) => done(&env, format!("Change request {id} is {}", r.state)),
        Err(e) => requests_page(&s, &user, &env, None, Some(says(e)?), ProposeForm::default()).await,
    }
}

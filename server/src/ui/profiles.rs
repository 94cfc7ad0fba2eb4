//! `GET /ui/environments/{env}/profiles`: the emergency profiles of an environment — the
//! active one (who applied it, why, since and until when) with its revert form, each
//! profile's definition (flags, breakers, faults, read-only mode and the operator levers,
//! one line each) with an apply form (duration + confirmation + reason), the profile
//! builder (`profile_form.rs`: pick flags, breakers and levers per service; starter
//! profiles; an existing profile opened to change it), and, for what the builder does not
//! cover (fault rules, operations, non-bool flags), the JSON definition. Forms work
//! without JavaScript.

use askama::Template;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Redirect, Response};
use levee_agent::policy::{ServiceConfig, Timestamp};
use serde::Deserialize;

use super::approval::{self, Gate, Mode};
use super::error::UiError;
use super::page::{Layout, Page, When, seg, time};
use super::profile_form::{self, Builder, STARTERS, starter};
use super::session::{Posted, UiUser, reason};
use crate::actions::{Action, ChangeError, Name, Profile, ProfileSpec, Proposal, activation_services};
use crate::db::{ActivationRow, ChangeKind};
use crate::web::{AppState, RequestId};

/// The profile active in an environment, as the profiles page and the service page show it.
pub struct ActiveView {
    pub profile: String,
    pub version: u64,
    pub since: When,
    pub by: String,
    pub reason: String,
    pub until: When,
    pub services: Vec<String>,
}

impl ActiveView {
    pub fn of(a: &ActivationRow) -> ActiveView {
        ActiveView {
            profile: a.profile.clone(),
            version: a.version,
            since: time(a.applied_at),
            by: a.applied_by.clone(),
            reason: a.reason.clone(),
            until: time(a.expires_at),
            services: activation_services(a),
        }
    }
}

struct ProfileView {
    name: String,
    version: u64,
    updated: When,
    by: String,
    description: String,
    /// What it sets, one line per entry.
    entries: Vec<String>,
    json: String,
}

fn entries(spec: &ProfileSpec) -> Vec<String> {
    let mut out = Vec::new();
    for (svc, s) in &spec.services {
        for (k, v) in &s.flags {
            out.push(format!("{svc}: flag {k} = {v}"));
        }
        if s.read_only {
            out.push(format!("{svc}: read-only mode"));
        }
        for b in &s.breakers {
            let op = b.operation.as_deref().map(|o| format!(" {o}")).unwrap_or_default();
            out.push(format!("{svc}: breaker {}{op} {}", b.dependency, super::service::state_label(b.state)));
        }
        for f in &s.faults {
            out.push(format!("{svc}: fault {} on {} ({} %)", f.id, f.dependency, f.percent));
        }
        if let Some(p) = s.shed_sheddable_percent {
            out.push(format!("{svc}: shed {p} % of SHEDDABLE and SHEDDABLE_PLUS traffic"));
        }
        if s.pause_retries {
            out.push(format!("{svc}: all outgoing retries paused"));
        }
        if let Some(n) = s.inbound_limit {
            out.push(format!("{svc}: inbound limit fixed at {n}"));
        }
    }
    out
}

#[derive(Template)]
#[template(path = "profiles.html")]
struct ProfilesPage {
    layout: Layout,
    env: String,
    csrf: String,
    can_operate: bool,
    active: Option<ActiveView>,
    profiles: Vec<ProfileView>,
    /// The builder, filled from a starter, a profile or what was posted.
    builder: Builder,
    builder_reason: String,
    starters: Vec<(&'static str, &'static str, &'static str)>,
    /// The JSON form as typed, and what was wrong with it.
    form_name: String,
    form_json: String,
    form_reason: String,
    /// An example definition over the environment's own services, as the JSON box's
    /// placeholder.
    example: String,
    /// Which form `error` belongs to: `builder` or `json`.
    error_in: &'static str,
    error: Option<String>,
    notice: Option<String>,
}

/// Query of the profiles page: after a change, what was done; a starter profile or an
/// existing profile to open in the builder.
#[derive(Debug, Default, Deserialize)]
pub struct ProfilesQuery {
    done: Option<String>,
    #[serde(default)]
    starter: String,
    #[serde(default)]
    edit: String,
}

/// The services of `env` with their current configuration (a service whose revision does
/// not read is left out: its page says why).
async fn services(s: &AppState, env: &str) -> Result<Vec<(String, ServiceConfig)>, UiError> {
    let mut out = Vec::new();
    for row in s.store.services(env).await? {
        if let Some(snap) = s.store.latest_snapshot(env, &row.name).await?
            && let Ok(cfg) = snap.config()
        {
            out.push((row.name, cfg));
        }
    }
    Ok(out)
}

/// What the page shows in its forms besides the stored state.
#[derive(Default)]
struct Shown {
    /// The builder as it should appear (`None`: empty).
    builder: Option<Builder>,
    builder_reason: String,
    /// The JSON form as typed: name, definition, reason.
    json: (String, String, String),
    error_in: &'static str,
}

async fn render(
    s: &AppState,
    user: &UiUser,
    env: &str,
    shown: Shown,
    error: Option<String>,
    notice: Option<String>,
) -> Result<Response, UiError> {
    s.store.environment(env).await?.ok_or_else(|| UiError::NotFound(format!("no environment {env:?}")))?;
    let services = services(s, env).await?;
    let example = starter("dependencies-off", &services)
        .filter(|spec| !spec.services.is_empty())
        .or_else(|| starter("shed-load", &services))
        .filter(|spec| !spec.services.is_empty())
        .map(|spec| serde_json::to_string_pretty(&spec).unwrap_or_default())
        .unwrap_or_else(|| {
            r#"{"description": "…", "services": {"SERVICE": {"flags": {"FLAG": false}}}}"#.into()
        });
    let mut profiles = Vec::new();
    for row in s.store.profiles(env).await? {
        let p = Profile::of(row)?;
        profiles.push(ProfileView {
            name: p.row.name.clone(),
            version: p.row.version,
            updated: time(p.row.updated_at),
            by: p.row.updated_by.clone(),
            description: p.spec.description.clone(),
            entries: entries(&p.spec),
            json: serde_json::to_string_pretty(&p.spec).unwrap_or_default(),
        });
    }
    let status = if error.is_some() { StatusCode::BAD_REQUEST } else { StatusCode::OK };
    let page = ProfilesPage {
        layout: user.layout(),
        env: env.to_string(),
        csrf: user.csrf.clone(),
        can_operate: user.principal.role >= Action::ProfileApply.role(),
        active: s.store.active_profile(env).await?.as_ref().map(ActiveView::of),
        profiles,
        builder: shown.builder.unwrap_or_else(|| Builder::of("", &ProfileSpec::default(), &services)),
        builder_reason: shown.builder_reason,
        starters: STARTERS.to_vec(),
        form_name: shown.json.0,
        form_json: shown.json.1,
        form_reason: shown.json.2,
        example,
        error_in: shown.error_in,
        error,
        notice,
    };
    Ok(Page::with_status(status, page).into_response())
}

fn profiles_url(env: &str) -> String {
    format!("/ui/environments/{}/profiles", seg(env))
}

/// `GET /ui/environments/{env}/profiles`.
pub async fn page(
    State(s): State<AppState>,
    user: UiUser,
    Path(env): Path<String>,
    axum::extract::Query(q): axum::extract::Query<ProfilesQuery>,
) -> Result<Response, UiError> {
    let mut shown = Shown::default();
    if !q.starter.is_empty() {
        let services = services(&s, &env).await?;
        let spec = starter(&q.starter, &services)
            .ok_or_else(|| UiError::NotFound(format!("there is no starter profile {:?}", q.starter)))?;
        shown.builder = Some(Builder::of(&q.starter, &spec, &services));
    } else if !q.edit.is_empty() {
        let row =
            s.store.profile(&env, &q.edit).await?.ok_or_else(|| {
                UiError::NotFound(format!("no profile {:?} in environment {env:?}", q.edit))
            })?;
        let p = Profile::of(row)?;
        shown.builder = Some(Builder::of(&q.edit, &p.spec, &services(&s, &env).await?));
    }
    render(&s, &user, &env, shown, None, q.done).await
}

/// The profiles page with the builder as posted and what is wrong with it.
async fn build_again(
    s: &AppState,
    user: &UiUser,
    env: &str,
    built: &profile_form::Built,
    form: &[(String, String)],
    error: String,
) -> Result<Response, UiError> {
    let services = services(s, env).await?;
    let shown = Shown {
        builder: Some(profile_form::shown_again(built, form, &services)),
        builder_reason: built.reason.clone(),
        error_in: "builder",
        ..Shown::default()
    };
    render(s, user, env, shown, Some(error), None).await
}

/// `POST /ui/environments/{env}/profiles/build`: creates or replaces a profile from the
/// builder's fields.
pub async fn build(
    State(s): State<AppState>,
    rid: RequestId,
    Path(env): Path<String>,
    Posted { user, form }: Posted<Vec<(String, String)>>,
) -> Result<Response, UiError> {
    let by = user.actor(Action::ProfileSet, &rid)?;
    let built = profile_form::read(&form);
    let again = |error: String| build_again(&s, &user, &env, &built, &form, error);
    let name = match Name::parse("name", &built.name) {
        Ok(n) => n,
        Err(e) => return again(e.to_string()).await,
    };
    let spec = match &built.spec {
        Ok(spec) => spec.clone(),
        Err(m) => return again(m.clone()).await,
    };
    let why = match reason(&built.reason) {
        Ok(r) => r,
        Err(m) => return again(m).await,
    };
    match s.actions.put_profile(&by, &why, &env, &name, &spec, None).await {
        Ok(p) => Ok(Redirect::to(&format!(
            "{}?done=Saved+profile+{}+as+version+{}#profile-{}",
            profiles_url(&env),
            seg(name.as_str()),
            p.row.version,
            seg(name.as_str())
        ))
        .into_response()),
        Err(e) => again(says(e)?).await,
    }
}

/// Form creating or replacing a profile.
#[derive(Debug, Deserialize)]
pub struct SaveForm {
    name: String,
    definition: String,
    #[serde(default)]
    reason: String,
}

/// What went wrong with a change, for the form: field errors listed.
fn says(e: ChangeError) -> Result<String, UiError> {
    match e {
        ChangeError::Invalid(v) => Ok(v.0.iter().map(|f| f.to_string()).collect::<Vec<_>>().join("; ")),
        e @ (ChangeError::InvalidField(_)
        | ChangeError::NotFound(_)
        | ChangeError::ProfileActive { .. }
        | ChangeError::ApprovalRequired { .. }
        | ChangeError::Conflict { .. }) => Ok(e.to_string()),
        e => Err(e.into()),
    }
}

/// `POST /ui/environments/{env}/profiles`: creates or replaces a profile.
pub async fn save(
    State(s): State<AppState>,
    rid: RequestId,
    Path(env): Path<String>,
    Posted { user, form }: Posted<SaveForm>,
) -> Result<Response, UiError> {
    let by = user.actor(Action::ProfileSet, &rid)?;
    let typed = || Shown {
        json: (form.name.clone(), form.definition.clone(), form.reason.clone()),
        error_in: "json",
        ..Shown::default()
    };
    let name = match Name::parse("name", form.name.trim()) {
        Ok(n) => n,
        Err(e) => return render(&s, &user, &env, typed(), Some(e.to_string()), None).await,
    };
    let spec: ProfileSpec = match levee_agent::policy::decode_json(form.definition.as_bytes()) {
        Ok(spec) => spec,
        Err(e) => return render(&s, &user, &env, typed(), Some(format!("definition: {e}")), None).await,
    };
    let why = match reason(&form.reason) {
        Ok(r) => r,
        Err(m) => return render(&s, &user, &env, typed(), Some(m), None).await,
    };
    match s.actions.put_profile(&by, &why, &env, &name, &spec, None).await {
        Ok(p) => Ok(Redirect::to(&format!(
            "{}?done=Saved+profile+{}+as+version+{}",
            profiles_url(&env),
            seg(name.as_str()),
            p.row.version
        ))
        .into_response()),
        Err(e) => render(&s, &user, &env, typed(), Some(says(e)?), None).await,
    }
}

/// Form applying a profile (both steps: the confirmation shows it again with a reason).
#[derive(Debug, Deserialize)]
pub struct ApplyForm {
    /// How long, e.g. `2h`.
    #[serde(rename = "for")]
    lasts: String,
    #[serde(default)]
    reason: String,
    /// The application, its proposal, or break-glass (confirmation step only).
    #[serde(default)]
    mode: Mode,
}

#[derive(Template)]
#[template(path = "profile_confirm.html")]
struct ConfirmPage {
    layout: Layout,
    env: String,
    csrf: String,
    name: String,
    version: u64,
    lasts: String,
    until: String,
    entries: Vec<String>,
    reason: String,
    error: Option<String>,
    gate: Option<Gate>,
}

async fn confirm_page(
    s: &AppState,
    user: &UiUser,
    env: &str,
    name: &str,
    form: &ApplyForm,
    error: Option<String>,
    refused: Option<Gate>,
) -> Result<Response, UiError> {
    let row = s
        .store
        .profile(env, name)
        .await?
        .ok_or_else(|| UiError::NotFound(format!("no profile {name:?} in environment {env:?}")))?;
    let p = Profile::of(row)?;
    let until = match levee_agent::policy::duration::parse(form.lasts.trim()) {
        Ok(d) => time(Timestamp::now().unix_ms() + d.as_millis() as i64).to_string(),
        Err(m) => return Err(UiError::BadRequest(format!("for: {m}"))),
    };
    let page = ConfirmPage {
        layout: user.layout(),
        env: env.to_string(),
        csrf: user.csrf.clone(),
        name: name.to_string(),
        version: p.row.version,
        lasts: form.lasts.trim().to_string(),
        until,
        entries: entries(&p.spec),
        reason: form.reason.clone(),
        error: error.clone(),
        gate: match refused {
            Some(g) => Some(g),
            None => approval::gate(s, user, env, &[ChangeKind::Profile], true).await?,
        },
    };
    let status = if error.is_some() {
        StatusCode::BAD_REQUEST
    } else if page.gate.as_ref().is_some_and(|g| g.refused) {
        StatusCode::FORBIDDEN
    } else {
        StatusCode::OK
    };
    Ok(Page::with_status(status, page).into_response())
}

/// `GET …/profiles/{name}/confirm?for=…`: what applying the profile changes (an alarm's
/// "apply emergency profile" lever leads here); changes nothing.
pub async fn confirm(
    State(s): State<AppState>,
    user: UiUser,
    Path((env, name)): Path<(String, String)>,
    axum::extract::Query(form): axum::extract::Query<ApplyForm>,
) -> Result<Response, UiError> {
    user.require(Action::ProfileApply)?;
    confirm_page(&s, &user, &env, &name, &form, None, None).await
}

/// `POST …/profiles/{name}/apply`: applies the profile for the duration confirmed.
pub async fn apply(
    State(s): State<AppState>,
    rid: RequestId,
    Path((env, name)): Path<(String, String)>,
    Posted { user, form }: Posted<ApplyForm>,
) -> Result<Response, UiError> {
    let by = user.actor(Action::ProfileApply, &rid)?;
    let why = match reason(&form.reason) {
        Ok(r) => r,
        Err(m) => return confirm_page(&s, &user, &env, &name, &form, Some(m), None).await,
    };
    let d = levee_agent::policy::duration::parse(form.lasts.trim())
        .map_err(|m| UiError::BadRequest(format!("for: {m}")))?;
    if form.mode == Mode::Propose {
        let r =
            s.actions.propose(&by, &why, &env, Proposal::Profile { name: name.clone(), lasts: d }).await?;
        return Ok(approval::proposed(&env, r.id));
    }
    let by = form.mode.actor(by, &why);
    let until = Timestamp::from_unix_ms(Timestamp::now().unix_ms().saturating_add(d.as_millis() as i64));
    match s.actions.apply_profile(&by, &why, &env, &name, until).await {
        Ok(a) => {
            tracing::info!(actor = %by.name, environment = %env, profile = %name, "profile applied from the UI");
            let msg = format!("Applied profile {} until {}", a.profile, time(a.expires_at));
            Ok(Redirect::to(&format!("{}?done={}", profiles_url(&env), seg(&msg))).into_response())
        }
        Err(e @ ChangeError::ApprovalRequired { .. }) => {
            let gate = approval::refused(e, &user, true)?;
            confirm_page(&s, &user, &env, &name, &form, None, Some(gate)).await
        }
        Err(e) => {
            let m = says(e)?;
            confirm_page(&s, &user, &env, &name, &form, Some(m), None).await
        }
    }
}

/// Form reverting the active profile.
#[derive(Debug, Deserialize)]
pub struct RevertForm {
    #[serde(default)]
    reason: String,
}

/// `POST /ui/environments/{env}/profiles/revert`: reverts the active profile.
pub async fn revert(
    State(s): State<AppState>,
    rid: RequestId,
    Path(env): Path<String>,
    Posted { user, form }: Posted<RevertForm>,
) -> Result<Response, UiError> {
    let by = user.actor(Action::ProfileRevert, &rid)?;
    let why = match reason(&form.reason) {
        Ok(r) => r,
        Err(m) => return render(&s, &user, &env, Shown::default(), Some(m), None).await,
    };
    let r = s.actions.revert_profile(&by, &why, &env).await?;
    let mut msg = format!("Reverted profile {}", r.activation.profile);
    for (svc, notes) in &r.left {
        msg.push_str(&format!("; {svc}: {}", notes.join("; ")));
    }
    Ok(Redirect::to(&format!("{}?done={}", profiles_url(&env), seg(&msg))).into_response())
}

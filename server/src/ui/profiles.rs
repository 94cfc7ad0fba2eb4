//! `GET /ui/environments/{env}/profiles`: the emergency profiles of an environment — the
//! active one (who applied it, why, since and until when) with its revert form, each
//! profile's definition (flags, breakers, faults, read-only mode and the operator levers,
//! one line each) with an apply form (duration + confirmation + reason), and a form
//! to create or replace a profile from its JSON definition. Forms work without JavaScript.

use askama::Template;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Redirect, Response};
use levee_agent::policy::Timestamp;
use serde::Deserialize;

use super::error::UiError;
use super::page::{Layout, Page, When, seg, time};
use super::session::{Posted, UiUser, reason};
use crate::actions::{Action, ChangeError, Name, Profile, ProfileSpec, activation_services};
use crate::db::ActivationRow;
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
    /// The create/replace form as typed, and what was wrong with it.
    form_name: String,
    form_json: String,
    form_reason: String,
    error: Option<String>,
    notice: Option<String>,
}

/// Query of the profiles page after a change.
#[derive(Debug, Deserialize)]
pub struct ProfilesQuery {
    done: Option<String>,
}

const EXAMPLE: &str = r#"{
  "description": "Payment provider down: stop calling it, go read-only",
  "services": {
    "checkout": {
      "flags": {"payments.enabled": false},
      "breakers": [{"dependency": "payments", "state": "forced_open"}],
      "read_only": false,
      "shed_sheddable_percent": 50,
      "pause_retries": true,
      "inbound_limit": 200
    }
  }
}"#;

async fn render(
    s: &AppState,
    user: &UiUser,
    env: &str,
    form: (String, String, String),
    error: Option<String>,
    notice: Option<String>,
) -> Result<Response, UiError> {
    s.store.environment(env).await?.ok_or_else(|| UiError::NotFound(format!("no environment {env:?}")))?;
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
        form_name: form.0,
        form_json: if form.1.is_empty() { EXAMPLE.to_string() } else { form.1 },
        form_reason: form.2,
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
    render(&s, &user, &env, Default::default(), None, q.done).await
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
    let typed = (form.name.clone(), form.definition.clone(), form.reason.clone());
    let name = match Name::parse("name", form.name.trim()) {
        Ok(n) => n,
        Err(e) => return render(&s, &user, &env, typed, Some(e.to_string()), None).await,
    };
    let spec: ProfileSpec = match levee_agent::policy::decode_json(form.definition.as_bytes()) {
        Ok(spec) => spec,
        Err(e) => return render(&s, &user, &env, typed, Some(format!("definition: {e}")), None).await,
    };
    let why = match reason(&form.reason) {
        Ok(r) => r,
        Err(m) => return render(&s, &user, &env, typed, Some(m), None).await,
    };
    match s.actions.put_profile(&by, &why, &env, &name, &spec, None).await {
        Ok(p) => Ok(Redirect::to(&format!(
            "{}?done=Saved+profile+{}+as+version+{}",
            profiles_url(&env),
            seg(name.as_str()),
            p.row.version
        ))
        .into_response()),
        Err(e) => render(&s, &user, &env, typed, Some(says(e)?), None).await,
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
}

async fn confirm_page(
    s: &AppState,
    user: &UiUser,
    env: &str,
    name: &str,
    form: &ApplyForm,
    error: Option<String>,
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
    };
    let status = if error.is_some() { StatusCode::BAD_REQUEST } else { StatusCode::OK };
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
    confirm_page(&s, &user, &env, &name, &form, None).await
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
        Err(m) => return confirm_page(&s, &user, &env, &name, &form, Some(m)).await,
    };
    let d = levee_agent::policy::duration::parse(form.lasts.trim())
        .map_err(|m| UiError::BadRequest(format!("for: {m}")))?;
    let until = Timestamp::from_unix_ms(Timestamp::now().unix_ms().saturating_add(d.as_millis() as i64));
    match s.actions.apply_profile(&by, &why, &env, &name, until).await {
        Ok(a) => {
            tracing::info!(actor = %by.name, environment = %env, profile = %name, "profile applied from the UI");
            let msg = format!("Applied profile {} until {}", a.profile, time(a.expires_at));
            Ok(Redirect::to(&format!("{}?done={}", profiles_url(&env), seg(&msg))).into_response())
        }
        Err(e) => {
            let m = says(e)?;
            confirm_page(&s, &user, &env, &name, &form, Some(m)).await
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
        Err(m) => return render(&s, &user, &env, Default::default(), Some(m), None).await,
    };
    let r = s.actions.revert_profile(&by, &why, &env).await?;
    let mut msg = format!("Reverted profile {}", r.activation.profile);
    for (svc, notes) in &r.left {
        msg.push_str(&format!("; {svc}: {}", notes.join("; ")));
    }
    Ok(Redirect::to(&format!("{}?done={}", profiles_url(&env), seg(&msg))).into_response())
}

//! Changes made from the service page, each in two steps without JavaScript:
//!
//! 1. the switch (or override form, or an alarm's lever) opens a `…/confirm` page, which
//!    changes nothing and shows what will change, what it does to the service, and asks
//!    for a reason;
//! 2. that page's form posts to the change route, which refuses an empty reason, then
//!    takes the [action](crate::actions) (a new revision, audited with `via = "ui"`, pushed
//!    to agents at once) and redirects to the service page, which follows the new revision
//!    through the fleet.
//!
//! The confirmation page carries the revision it showed; the change is made only if the
//! service is still at that revision (the action's `ServiceAt::base`, the API's
//! `If-Match`), so nobody confirms a state that is no longer true.
//!
//! A confirmation page changes nothing, so it is an address (`GET …/confirm?…`): the
//! levers of an alarm link straight to it, and reloading it shows it again.
//!
//! Where the change needs an approved change request, the same page offers to propose it
//! or to break the glass (see `approval.rs`), and a change refused for want of approval
//! comes back to it with the reason kept.

use std::time::Duration;

use askama::Template;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Redirect, Response};
use levee_agent::policy::{
    BreakerOverride, BreakerOverrideState, Flag, FlagType, ServiceConfig, Timestamp, check_operation,
};
use serde::Deserialize;

use super::approval::{self, Gate, Mode};
use super::error::UiError;
use super::page::{Layout, Page, duration, seg, service_url, time};
use super::service::{load, state_label, switched_by, value_text};
use super::session::{Posted, UiUser, reason};
use crate::actions::{Action, ChangeError, Name, NewOverride, Proposal, ServiceAt, Written};
use crate::db::ChangeKind;
use crate::web::{AppState, RequestId};

#[derive(Template)]
#[template(path = "confirm.html")]
struct ConfirmPage {
    layout: Layout,
    env: String,
    svc: String,
    csrf: String,
    title: String,
    /// What is being changed, as label/value rows.
    facts: Vec<(String, String)>,
    /// What the change does to the service, in words.
    effects: Vec<String>,
    /// Where the confirmed form posts.
    action: String,
    /// Fields carried over to the change route.
    hidden: Vec<(&'static str, String)>,
    button: String,
    reason: String,
    error: Option<String>,
    /// Set when the change needs approval: what the form offers instead of the change.
    gate: Option<Gate>,
}

struct Confirm {
    title: String,
    facts: Vec<(String, String)>,
    effects: Vec<String>,
    action: String,
    hidden: Vec<(&'static str, String)>,
    button: String,
    gate: Option<Gate>,
}

impl Confirm {
    fn page(self, user: &UiUser, env: &str, svc: &str, reason: &str, error: Option<String>) -> ConfirmPage {
        ConfirmPage {
            layout: user.layout(),
            env: env.to_string(),
            svc: svc.to_string(),
            csrf: user.csrf.clone(),
            title: self.title,
            facts: self.facts,
            effects: self.effects,
            action: self.action,
            hidden: self.hidden,
            button: self.button,
            reason: reason.to_string(),
            error,
            gate: self.gate,
        }
    }
}

/// Where to go after a change: the rollout page of a change it staged, which follows the
/// cohort and the rest; else the service page, following the new revision.
pub(super) fn after_change(env: &str, svc: &str, c: &Written) -> Response {
    let url = match super::rollouts::started_by(env, c) {
        Some(url) => url,
        None if c.changed => format!("{}?changed={}#propagation", service_url(env, svc), c.snapshot.revision),
        None => format!("{}?unchanged=1", service_url(env, svc)),
    };
    Redirect::to(&url).into_response()
}

/// A note for the confirmation page when the service moved on since its page was loaded.
fn moved_on(seen: u64, current: u64) -> Option<String> {
    (seen != current).then(|| {
        format!(
            "The service changed since you opened its page (you saw revision {seen}, it is now at {current}). \
             The values below are the current ones; check them before confirming."
        )
    })
}

const PUSH_NOTE: &str = "The change becomes a new revision, is pushed to every connected agent of the service \
                         at once, and is recorded in the audit log with your name and reason.";

/// Shows the confirmation page again, reason kept, after the change was refused for want
/// of approval: with the ways on (propose, break-glass).
fn needs_approval(
    mut confirm: Confirm,
    gate: Gate,
    user: &UiUser,
    env: &str,
    svc: &str,
    reason: &str,
) -> Response {
    confirm.gate = Some(gate);
    Page::with_status(StatusCode::FORBIDDEN, confirm.page(user, env, svc, reason, None)).into_response()
}

/// Shows the confirmation page again with `error`, keeping the reason typed so far.
fn refuse(confirm: Confirm, user: &UiUser, env: &str, svc: &str, reason: &str, error: String) -> Response {
    Page::with_status(StatusCode::BAD_REQUEST, confirm.page(user, env, svc, reason, Some(error)))
        .into_response()
}

// ---- flags ----------------------------------------------------------------------------

/// Form of a flag switch and of its confirmation.
#[derive(Debug, Deserialize)]
pub struct FlagChange {
    /// New value as typed (`true`/`false` for bool flags).
    value: String,
    /// Revision of the service the form was shown at.
    revision: u64,
    /// Why (confirmation step only).
    #[serde(default)]
    reason: String,
    /// The change, its proposal, or break-glass (confirmation step only).
    #[serde(default)]
    mode: Mode,
}

/// Reads a value typed in a form for a flag of type `kind`; the error names the flag and
/// quotes the text.
fn parse_value(key: impl std::fmt::Display, kind: FlagType, text: &str) -> Result<serde_json::Value, String> {
    kind.parse_text(text).map_err(|m| format!("flag {key} {m} (got {text:?})"))
}

/// What switching bool flag `key` to `on` does, in words.
fn switch_effects(cfg: &ServiceConfig, key: &str, on: bool) -> Vec<String> {
    let mut out = Vec::new();
    for (name, d) in cfg.policy.dependencies.iter().filter(|(_, d)| d.enabled_flag.as_deref() == Some(key)) {
        out.push(if on {
            format!("Dependency {name} is switched back on: calls to it resume.")
        } else {
            format!(
                "Dependency {name} is switched off: no calls are made to it; callers get its fallback ({}).",
                d.fallback.as_str()
            )
        });
    }
    for r in cfg.policy.degradation_matrix.iter().filter(|r| r.enabled_flag.as_deref() == Some(key)) {
        out.push(if on {
            format!("Feature {} is back to normal.", r.feature)
        } else {
            format!("Feature {} is forced onto its fallback ({}).", r.feature, r.on_failure.as_str())
        });
    }
    out
}

async fn flag_confirm(
    s: &AppState,
    user: &UiUser,
    env: &str,
    svc: &str,
    key: &str,
    f: &FlagChange,
) -> Result<(Confirm, u64, serde_json::Value), UiError> {
    let loaded = load(s, env, svc).await?;
    let cfg = &loaded.config;
    let flag =
        cfg.flags.get(key).ok_or_else(|| UiError::NotFound(format!("no flag {key:?} in service {svc:?}")))?;
    let new = parse_value(key, flag.kind, &f.value).map_err(UiError::BadRequest)?;
    let current = loaded.row.revision;
    let mut effects = Vec::new();
    if let Some(m) = moved_on(f.revision, current) {
        effects.push(m);
    }
    if new == flag.value {
        effects.push("This is already the flag's value: confirming changes nothing.".into());
    } else if let Some(on) = new.as_bool() {
        effects.extend(switch_effects(cfg, key, on));
        if switched_by(cfg, key).is_empty() {
            effects.push(format!("Code reading flag {key} sees {new} from now on."));
        }
    }
    effects.push(PUSH_NOTE.into());
    let mut facts = vec![
        ("Service".to_string(), format!("{env} / {svc} (revision {current})")),
        ("Flag".to_string(), key.to_string()),
    ];
    if !flag.description.is_empty() {
        facts.push(("What it does".into(), flag.description.clone()));
    }
    facts.push(("Current value".into(), value_text(flag)));
    let mut shown = flag.clone();
    shown.value = new.clone();
    facts.push(("New value".into(), value_text(&shown)));
    let confirm = Confirm {
        title: format!("Change flag {key}"),
        facts,
        effects,
        action: format!("{}/flags/{}", service_url(env, svc), seg(key)),
        hidden: vec![("value", f.value.clone()), ("revision", current.to_string())],
        button: format!("Set {key} to {}", value_text(&shown)),
        gate: approval::gate(s, user, env, &[ChangeKind::Flag], true).await?,
    };
    Ok((confirm, current, new))
}

/// `GET …/flags/{key}/confirm?value=…&revision=…`: what switching the flag will do;
/// asks for a reason. Changes nothing.
pub async fn confirm_flag(
    State(s): State<AppState>,
    user: UiUser,
    Path((env, svc, key)): Path<(String, String, String)>,
    Query(form): Query<FlagChange>,
) -> Result<Response, UiError> {
    user.require(Action::FlagSet)?;
    let (confirm, _, _) = flag_confirm(&s, &user, &env, &svc, &key, &form).await?;
    Ok(Page::ok(confirm.page(&user, &env, &svc, "", None)).into_response())
}

/// `POST …/flags/{key}`: sets the flag's value (confirmed, with a reason).
pub async fn apply_flag(
    State(s): State<AppState>,
    rid: RequestId,
    Path((env, svc, key)): Path<(String, String, String)>,
    Posted { user, form }: Posted<FlagChange>,
) -> Result<Response, UiError> {
    let by = user.actor(Action::FlagSet, &rid)?;
    let reason = match reason(&form.reason) {
        Ok(r) => r,
        Err(msg) => {
            let (confirm, _, _) = flag_confirm(&s, &user, &env, &svc, &key, &form).await?;
            return Ok(refuse(confirm, &user, &env, &svc, &form.reason, msg));
        }
    };
    let loaded = load(&s, &env, &svc).await?;
    let kind = loaded
        .config
        .flags
        .get(&key)
        .map(|f| f.kind)
        .ok_or_else(|| UiError::NotFound(format!("no flag {key:?} in service {svc:?}")))?;
    let value = parse_value(&key, kind, &form.value).map_err(UiError::BadRequest)?;
    if form.mode == Mode::Propose {
        let p = Proposal::Flag { service: svc.clone(), key: key.clone(), value };
        let r = s.actions.propose(&by, &reason, &env, p).await?;
        return Ok(approval::proposed(&env, r.id));
    }
    let by = form.mode.actor(by, &reason);
    let at = ServiceAt::new(&env, &svc, Some(form.revision));
    let w = match s.actions.set_flag_value(&by, &reason, &at, &key, value, None).await {
        Ok(w) => w,
        Err(e) => {
            let gate = approval::refused(e, &user, true)?;
            let (confirm, _, _) = flag_confirm(&s, &user, &env, &svc, &key, &form).await?;
            return Ok(needs_approval(confirm, gate, &user, &env, &svc, &form.reason));
        }
    };
    tracing::info!(actor = %by.name, environment = %env, service = %svc, flag = %key, revision = w.snapshot.revision, "flag changed from the UI");
    Ok(after_change(&env, &svc, &w))
}

// ---- new flags, deleted flags -----------------------------------------------------------

/// Form of a new flag ("Add a flag…" on the service page) and of its confirmation.
#[derive(Debug, Deserialize)]
pub struct NewFlagForm {
    key: String,
    /// `bool`, `int`, `float`, `string` or `json`.
    #[serde(rename = "type")]
    kind: String,
    value: String,
    #[serde(default)]
    description: String,
    revision: u64,
    #[serde(default)]
    reason: String,
    #[serde(default)]
    mode: Mode,
}

async fn new_flag_confirm(
    s: &AppState,
    user: &UiUser,
    env: &str,
    svc: &str,
    f: &NewFlagForm,
) -> Result<(Confirm, Name, Flag), UiError> {
    let loaded = load(s, env, svc).await?;
    let bad = UiError::BadRequest;
    let key = Name::parse("key", f.key.trim()).map_err(|e| bad(e.to_string()))?;
    if loaded.config.flags.contains_key(key.as_str()) {
        return Err(bad(format!(
            "service {svc} already has a flag {key}: change it from its row on the service page"
        )));
    }
    let kind: FlagType = serde_json::from_value(serde_json::Value::String(f.kind.clone()))
        .map_err(|_| bad(format!("type {:?} is not one of bool, int, float, string, json", f.kind)))?;
    let value = parse_value(&key, kind, &f.value).map_err(bad)?;
    let flag = Flag {
        kind,
        value,
        description: f.description.trim().to_string(),
        owner: String::new(),
        expires_at: None,
        stale: Default::default(),
        rollout: None,
    };
    let current = loaded.row.revision;
    let mut effects: Vec<String> = moved_on(f.revision, current).into_iter().collect();
    effects.push(format!(
        "Code reading flag {key} sees {} from now on, instead of the default compiled into the service.",
        value_text(&flag)
    ));
    effects.push(PUSH_NOTE.into());
    let confirm = Confirm {
        title: format!("Add flag {key}"),
        facts: vec![
            ("Service".into(), format!("{env} / {svc} (revision {current})")),
            ("Flag".into(), key.to_string()),
            ("Type".into(), kind.as_str().to_string()),
            ("Value".into(), value_text(&flag)),
            ("What it does".into(), flag.description.clone()),
        ],
        effects,
        action: format!("{}/new-flag", service_url(env, svc)),
        hidden: vec![
            ("key", key.to_string()),
            ("type", f.kind.clone()),
            ("value", f.value.clone()),
            ("description", flag.description.clone()),
            ("revision", current.to_string()),
        ],
        button: format!("Add flag {key}"),
        gate: approval::gate(s, user, env, &[ChangeKind::Flag], false).await?,
    };
    Ok((confirm, key, flag))
}

/// `GET …/new-flag/confirm?key=…&type=…&value=…&description=…&revision=…`: what adding
/// the flag does; asks for a reason. Changes nothing.
pub async fn confirm_new_flag(
    State(s): State<AppState>,
    user: UiUser,
    Path((env, svc)): Path<(String, String)>,
    Query(form): Query<NewFlagForm>,
) -> Result<Response, UiError> {
    user.require(Action::FlagSet)?;
    let (confirm, _, _) = new_flag_confirm(&s, &user, &env, &svc, &form).await?;
    Ok(Page::ok(confirm.page(&user, &env, &svc, "", None)).into_response())
}

/// `POST …/new-flag`: adds the flag (confirmed, with a reason).
pub async fn apply_new_flag(
    State(s): State<AppState>,
    rid: RequestId,
    Path((env, svc)): Path<(String, String)>,
    Posted { user, form }: Posted<NewFlagForm>,
) -> Result<Response, UiError> {
    let by = user.actor(Action::FlagSet, &rid)?;
    let (confirm, key, flag) = new_flag_confirm(&s, &user, &env, &svc, &form).await?;
    let reason = match reason(&form.reason) {
        Ok(r) => r,
        Err(msg) => return Ok(refuse(confirm, &user, &env, &svc, &form.reason, msg)),
    };
    let by = form.mode.actor(by, &reason);
    let at = ServiceAt::new(&env, &svc, Some(form.revision));
    let w = match s.actions.set_flag(&by, &reason, &at, &key, flag).await {
        Ok(w) => w,
        Err(e) => {
            let gate = approval::refused(e, &user, false)?;
            return Ok(needs_approval(confirm, gate, &user, &env, &svc, &form.reason));
        }
    };
    tracing::info!(actor = %by.name, environment = %env, service = %svc, flag = %key, revision = w.snapshot.revision, "flag added from the UI");
    Ok(after_change(&env, &svc, &w))
}

/// Form of a flag deletion and of its confirmation.
#[derive(Debug, Deserialize)]
pub struct FlagRemoval {
    revision: u64,
    #[serde(default)]
    reason: String,
    #[serde(default)]
    mode: Mode,
}

async fn flag_removal_confirm(
    s: &AppState,
    user: &UiUser,
    env: &str,
    svc: &str,
    key: &str,
    f: &FlagRemoval,
) -> Result<Confirm, UiError> {
    let loaded = load(s, env, svc).await?;
    let cfg = &loaded.config;
    let flag =
        cfg.flags.get(key).ok_or_else(|| UiError::NotFound(format!("no flag {key:?} in service {svc:?}")))?;
    let current = loaded.row.revision;
    let mut effects: Vec<String> = moved_on(f.revision, current).into_iter().collect();
    let users = switched_by(cfg, key);
    if users.is_empty() {
        effects
            .push(format!("Code reading flag {key} gets the default compiled into the service from now on."));
    } else {
        effects.push(format!(
            "The policy refers to {key} ({}): deleting it is refused until the policy no longer does.",
            users.join(", ")
        ));
    }
    effects.push(PUSH_NOTE.into());
    Ok(Confirm {
        title: format!("Delete flag {key}"),
        facts: vec![
            ("Service".into(), format!("{env} / {svc} (revision {current})")),
            ("Flag".into(), key.to_string()),
            ("Value now".into(), value_text(flag)),
            ("What it does".into(), flag.description.clone()),
        ],
        effects,
        action: format!("{}/flags/{}/delete", service_url(env, svc), seg(key)),
        hidden: vec![("revision", current.to_string())],
        button: format!("Delete flag {key}"),
        gate: approval::gate(s, user, env, &[ChangeKind::Flag], false).await?,
    })
}

/// `GET …/flags/{key}/delete/confirm?revision=…`: what deleting the flag does; asks for a
/// reason. Changes nothing.
pub async fn confirm_delete_flag(
    State(s): State<AppState>,
    user: UiUser,
    Path((env, svc, key)): Path<(String, String, String)>,
    Query(form): Query<FlagRemoval>,
) -> Result<Response, UiError> {
    user.require(Action::FlagDelete)?;
    let confirm = flag_removal_confirm(&s, &user, &env, &svc, &key, &form).await?;
    Ok(Page::ok(confirm.page(&user, &env, &svc, "", None)).into_response())
}

/// `POST …/flags/{key}/delete`: deletes the flag (confirmed, with a reason).
pub async fn apply_delete_flag(
    State(s): State<AppState>,
    rid: RequestId,
    Path((env, svc, key)): Path<(String, String, String)>,
    Posted { user, form }: Posted<FlagRemoval>,
) -> Result<Response, UiError> {
    let by = user.actor(Action::FlagDelete, &rid)?;
    let confirm = flag_removal_confirm(&s, &user, &env, &svc, &key, &form).await?;
    let reason = match reason(&form.reason) {
        Ok(r) => r,
        Err(msg) => return Ok(refuse(confirm, &user, &env, &svc, &form.reason, msg)),
    };
    let by = form.mode.actor(by, &reason);
    let at = ServiceAt::new(&env, &svc, Some(form.revision));
    let w = match s.actions.delete_flag(&by, &reason, &at, &key).await {
        Ok(w) => w,
        Err(e @ ChangeError::ApprovalRequired { .. }) => {
            let gate = approval::refused(e, &user, false)?;
            return Ok(needs_approval(confirm, gate, &user, &env, &svc, &form.reason));
        }
        Err(ChangeError::Invalid(v)) => {
            let why = v.0.iter().map(|f| f.to_string()).collect::<Vec<_>>().join("; ");
            return Ok(refuse(confirm, &user, &env, &svc, &form.reason, format!("not deleted: {why}")));
        }
        Err(e) => return Err(e.into()),
    };
    tracing::info!(actor = %by.name, environment = %env, service = %svc, flag = %key, revision = w.snapshot.revision, "flag deleted from the UI");
    Ok(after_change(&env, &svc, &w))
}

// ---- breaker overrides ----------------------------------------------------------------

/// Form of a breaker override and of its confirmation.
#[derive(Debug, Deserialize)]
pub struct OverrideChange {
    dependency: String,
    /// Operation; empty for the dependency-level breaker.
    #[serde(default)]
    operation: String,
    /// `forced_open`, `forced_closed` or `disabled`.
    state: String,
    /// How long the override lasts (`30m`, `2h`); empty for no expiry.
    #[serde(default)]
    expires_in: String,
    revision: u64,
    #[serde(default)]
    reason: String,
    #[serde(default)]
    mode: Mode,
}

struct OverrideRequest {
    dependency: String,
    operation: Option<String>,
    state: BreakerOverrideState,
    lasts: Option<Duration>,
}

fn parse_override(f: &OverrideChange, cfg: &ServiceConfig, svc: &str) -> Result<OverrideRequest, UiError> {
    let bad = UiError::BadRequest;
    if !cfg.policy.dependencies.contains_key(&f.dependency) {
        return Err(bad(format!("service {svc} has no dependency {:?}", f.dependency)));
    }
    let operation = match f.operation.trim() {
        "" => None,
        op => {
            check_operation(op).map_err(|m| bad(format!("operation {op:?}: {m}")))?;
            Some(op.to_string())
        }
    };
    let state = serde_json::from_value(serde_json::Value::String(f.state.clone())).map_err(|_| {
        bad(format!("state {:?} is not one of forced_open, forced_closed, disabled", f.state))
    })?;
    let lasts = match f.expires_in.trim() {
        "" => None,
        t => match levee_agent::policy::duration::parse(t) {
            Ok(d) if !d.is_zero() => Some(d),
            _ => return Err(bad(format!("expires in {t:?} is not a duration such as 30m, 2h or 1d"))),
        },
    };
    Ok(OverrideRequest { dependency: f.dependency.clone(), operation, state, lasts })
}

fn breaker_name(dep: &str, op: Option<&str>) -> String {
    match op {
        Some(op) => format!("{dep} (operation {op})"),
        None => dep.to_string(),
    }
}

fn current_override<'a>(cfg: &'a ServiceConfig, dep: &str, op: Option<&str>) -> Option<&'a BreakerOverride> {
    cfg.breaker_overrides.iter().find(|o| o.dependency == dep && o.operation.as_deref() == op)
}

async fn override_confirm(
    s: &AppState,
    env: &str,
    svc: &str,
    f: &OverrideChange,
) -> Result<(Confirm, OverrideRequest), UiError> {
    let loaded = load(s, env, svc).await?;
    let cfg = &loaded.config;
    let req = parse_override(f, cfg, svc)?;
    let current = loaded.row.revision;
    let name = breaker_name(&req.dependency, req.operation.as_deref());
    let fallback = cfg.policy.dependencies.get(&req.dependency).map(|d| d.fallback.as_str()).unwrap_or("?");
    let mut effects: Vec<String> = moved_on(f.revision, current).into_iter().collect();
    effects.push(match req.state {
        BreakerOverrideState::ForcedOpen => format!(
            "Every call to {name} is rejected as if its breaker were open; callers get the fallback ({fallback})."
        ),
        BreakerOverrideState::ForcedClosed => {
            format!("Every call to {name} goes through, even while it fails; outcomes are still recorded.")
        }
        BreakerOverrideState::Disabled => {
            format!("The breaker of {name} is off: calls go through and nothing is recorded.")
        }
    });
    effects.push(match req.lasts {
        Some(d) => format!(
            "The override ends by itself {} after you confirm (agents enforce that too).",
            duration(d)
        ),
        None => "The override has no expiry: it stays until someone removes it.".to_string(),
    });
    effects.push(PUSH_NOTE.into());
    let now_state = current_override(cfg, &req.dependency, req.operation.as_deref())
        .map(|o| state_label(o.state).to_string())
        .unwrap_or_else(|| "no override (the breaker decides on its own)".into());
    let until = match req.lasts {
        Some(d) => format!(
            "{} (about {})",
            duration(d),
            time(Timestamp::now().unix_ms() + d.as_millis() as i64).short
        ),
        None => "never".into(),
    };
    let confirm = Confirm {
        title: format!("Override the breaker of {name}"),
        facts: vec![
            ("Service".into(), format!("{env} / {svc} (revision {current})")),
            ("Breaker".into(), name.clone()),
            ("Now".into(), now_state),
            ("New state".into(), state_label(req.state).into()),
            ("Expires after".into(), until),
        ],
        effects,
        action: format!("{}/breakers", service_url(env, svc)),
        hidden: vec![
            ("dependency", f.dependency.clone()),
            ("operation", f.operation.trim().to_string()),
            ("state", f.state.clone()),
            ("expires_in", f.expires_in.trim().to_string()),
            ("revision", current.to_string()),
        ],
        button: format!("Force {name} {}", state_label(req.state)),
        gate: None,
    };
    Ok((confirm, req))
}

/// `GET …/breakers/confirm?dependency=…&state=…&expires_in=…&revision=…`: what the
/// override will do (an alarm's "force the breaker open" lever leads here); asks for a
/// reason. Changes nothing.
pub async fn confirm_override(
    State(s): State<AppState>,
    user: UiUser,
    Path((env, svc)): Path<(String, String)>,
    Query(form): Query<OverrideChange>,
) -> Result<Response, UiError> {
    user.require(Action::BreakerOverride)?;
    let (confirm, _) = override_confirm(&s, &env, &svc, &form).await?;
    Ok(Page::ok(confirm.page(&user, &env, &svc, "", None)).into_response())
}

/// `POST …/breakers`: sets the override (confirmed, with a reason).
pub async fn apply_override(
    State(s): State<AppState>,
    rid: RequestId,
    Path((env, svc)): Path<(String, String)>,
    Posted { user, form }: Posted<OverrideChange>,
) -> Result<Response, UiError> {
    let by = user.actor(Action::BreakerOverride, &rid)?;
    let (confirm, req) = override_confirm(&s, &env, &svc, &form).await?;
    let reason = match reason(&form.reason) {
        Ok(r) => r,
        Err(msg) => return Ok(refuse(confirm, &user, &env, &svc, &form.reason, msg)),
    };
    let new = NewOverride {
        dependency: req.dependency,
        operation: req.operation,
        state: req.state,
        expires_at: req
            .lasts
            .map(|d| Timestamp::from_unix_ms(Timestamp::now().unix_ms() + d.as_millis() as i64)),
    };
    let breaker = breaker_name(&new.dependency, new.operation.as_deref());
    let by = form.mode.actor(by, &reason);
    let at = ServiceAt::new(&env, &svc, Some(form.revision));
    let w = match s.actions.set_breaker_override(&by, &reason, &at, new).await {
        Ok(w) => w,
        Err(e) => {
            let gate = approval::refused(e, &user, false)?;
            return Ok(needs_approval(confirm, gate, &user, &env, &svc, &form.reason));
        }
    };
    tracing::info!(actor = %by.name, environment = %env, service = %svc, %breaker, revision = w.snapshot.revision, "breaker override set from the UI");
    Ok(after_change(&env, &svc, &w))
}

/// Form of an override removal and of its confirmation.
#[derive(Debug, Deserialize)]
pub struct OverrideRemoval {
    dependency: String,
    #[serde(default)]
    operation: String,
    revision: u64,
    #[serde(default)]
    reason: String,
    #[serde(default)]
    mode: Mode,
}

async fn removal_confirm(
    s: &AppState,
    env: &str,
    svc: &str,
    f: &OverrideRemoval,
) -> Result<Confirm, UiError> {
    let loaded = load(s, env, svc).await?;
    let cfg = &loaded.config;
    let op = Some(f.operation.trim()).filter(|o| !o.is_empty());
    let name = breaker_name(&f.dependency, op);
    let o = current_override(cfg, &f.dependency, op)
        .ok_or_else(|| UiError::NotFound(format!("there is no override on the breaker of {name}")))?;
    let current = loaded.row.revision;
    let mut effects: Vec<String> = moved_on(f.revision, current).into_iter().collect();
    effects.push(format!("The breaker of {name} decides on its own again, from the calls it sees."));
    effects.push(PUSH_NOTE.into());
    Ok(Confirm {
        title: format!("Remove the override of {name}"),
        facts: vec![
            ("Service".into(), format!("{env} / {svc} (revision {current})")),
            ("Breaker".into(), name.clone()),
            ("Forced state".into(), state_label(o.state).into()),
            ("Set because".into(), o.reason.clone()),
            (
                "Expires".into(),
                o.expires_at.map(|t| time(t.unix_ms()).to_string()).unwrap_or_else(|| "never".into()),
            ),
        ],
        effects,
        action: format!("{}/breakers/remove", service_url(env, svc)),
        hidden: vec![
            ("dependency", f.dependency.clone()),
            ("operation", f.operation.trim().to_string()),
            ("revision", current.to_string()),
        ],
        button: format!("Remove the override of {name}"),
        gate: None,
    })
}

/// `GET …/breakers/remove/confirm?dependency=…&operation=…&revision=…`: what removing the
/// override does; asks for a reason. Changes nothing.
pub async fn confirm_remove_override(
    State(s): State<AppState>,
    user: UiUser,
    Path((env, svc)): Path<(String, String)>,
    Query(form): Query<OverrideRemoval>,
) -> Result<Response, UiError> {
    user.require(Action::BreakerOverrideDelete)?;
    let confirm = removal_confirm(&s, &env, &svc, &form).await?;
    Ok(Page::ok(confirm.page(&user, &env, &svc, "", None)).into_response())
}

/// `POST …/breakers/remove`: removes the override (confirmed, with a reason).
pub async fn apply_remove_override(
    State(s): State<AppState>,
    rid: RequestId,
    Path((env, svc)): Path<(String, String)>,
    Posted { user, form }: Posted<OverrideRemoval>,
) -> Result<Response, UiError> {
    let by = user.actor(Action::BreakerOverrideDelete, &rid)?;
    let reason = match reason(&form.reason) {
        Ok(r) => r,
        Err(msg) => {
            let confirm = removal_confirm(&s, &env, &svc, &form).await?;
            return Ok(refuse(confirm, &user, &env, &svc, &form.reason, msg));
        }
    };
    let op = Some(form.operation.trim()).filter(|o| !o.is_empty());
    let breaker = breaker_name(&form.dependency, op);
    let by = form.mode.actor(by, &reason);
    let at = ServiceAt::new(&env, &svc, Some(form.revision));
    let w = match s.actions.remove_breaker_override(&by, &reason, &at, &form.dependency, op).await {
        Ok(w) => w,
        Err(e) => {
            let gate = approval::refused(e, &user, false)?;
            let confirm = removal_confirm(&s, &env, &svc, &form).await?;
            return Ok(needs_approval(confirm, gate, &user, &env, &svc, &form.reason));
        }
    };
    tracing::info!(actor = %by.name, environment = %env, service = %svc, %breaker, revision = w.snapshot.revision, "breaker override removed from the UI");
    Ok(after_change(&env, &svc, &w))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_value_typed_in_a_form_follows_the_flag_type_and_its_error_names_the_flag() {
        assert_eq!(parse_value("k", FlagType::Int, " 42 "), Ok(42.into()));
        assert_eq!(
            parse_value("k", FlagType::Bool, "no"),
            Err(r#"flag k is a bool flag: the value must be true or false (got "no")"#.into())
        );
    }
}

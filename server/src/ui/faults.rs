//! `GET /ui/environments/{env}/faults`: fault rules for game days — the active ones of every
//! service of the environment with an "end now" form, and a form creating one, whose expiry
//! is mandatory (a duration from now). Forms work without JavaScript; each change is the
//! fault action (`fault.set` / `fault.delete`), audited with the reason.

use askama::Template;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Redirect, Response};
use levee_agent::policy::{FaultAction, Timestamp};
use serde::Deserialize;

use super::error::UiError;
use super::page::{Layout, Page, When, seg, time};
use super::session::{Posted, UiUser, reason};
use crate::actions::{Action, ChangeError, Name, NewFaultRule, ServiceAt};
use crate::web::{AppState, RequestId};

struct RuleView {
    service: String,
    id: String,
    dependency: String,
    operation: String,
    action: String,
    percent: f64,
    expires: When,
}

#[derive(Template)]
#[template(path = "faults.html")]
struct FaultsPage {
    layout: Layout,
    env: String,
    csrf: String,
    can_operate: bool,
    allowed: bool,
    rules: Vec<RuleView>,
    services: Vec<String>,
    notice: Option<String>,
    error: Option<String>,
}

/// Query after a change.
#[derive(Debug, Deserialize)]
pub struct DoneQuery {
    done: Option<String>,
}

fn action_text(a: &FaultAction) -> String {
    match a {
        FaultAction::Delay { delay } => format!("delay {}", super::page::duration(*delay)),
        FaultAction::Abort { status } => format!("abort with {status}"),
        FaultAction::ConnectionError => "connection error".into(),
    }
}

async fn render(
    s: &AppState,
    user: &UiUser,
    env: &str,
    notice: Option<String>,
    error: Option<String>,
) -> Result<Response, UiError> {
    let e = s
        .store
        .environment(env)
        .await?
        .ok_or_else(|| UiError::NotFound(format!("no environment {env:?}")))?;
    let mut rules = Vec::new();
    let mut services = Vec::new();
    for svc in s.store.services(env).await? {
        services.push(svc.name.clone());
        let Some(snap) = s.store.latest_snapshot(env, &svc.name).await? else { continue };
        // A service whose current revision cannot be read has no rule to list here; its
        // own page says why.
        let Ok(cfg) = snap.config() else { continue };
        // A running game day's fault rule is listed to its starter and admins only.
        let hidden: Vec<String> = crate::actions::running_game_days(&s.store, env, &svc.name)
            .await?
            .iter()
            .filter(|g| !crate::actions::sees_injected(g, &user.principal))
            .map(|g| crate::actions::experiment_fault_id(g.id))
            .collect();
        for f in cfg.faults.into_iter().filter(|f| !hidden.contains(&f.id)) {
            rules.push(RuleView {
                service: svc.name.clone(),
                id: f.id,
                dependency: f.dependency,
                operation: f.operation.unwrap_or_default(),
                action: action_text(&f.action),
                percent: f.percent,
                expires: time(f.expires_at.unix_ms()),
            });
        }
    }
    let status = if error.is_some() { StatusCode::BAD_REQUEST } else { StatusCode::OK };
    let page = FaultsPage {
        layout: user.layout(),
        env: env.to_string(),
        csrf: user.csrf.clone(),
        can_operate: user.principal.role >= Action::FaultSet.role(),
        allowed: e.allow_faults,
        rules,
        services,
        notice,
        error,
    };
    Ok(Page::with_status(status, page).into_response())
}

fn done(env: &str, msg: &str) -> Response {
    Redirect::to(&format!("/ui/environments/{}/faults?done={}", seg(env), seg(msg))).into_response()
}

fn says(e: ChangeError) -> Result<String, UiError> {
    match e {
        ChangeError::Invalid(v) => Ok(v.0.iter().map(|f| f.to_string()).collect::<Vec<_>>().join("; ")),
        e @ (ChangeError::InvalidField(_)
        | ChangeError::NotFound(_)
        | ChangeError::FaultsNotAllowed { .. }
        | ChangeError::ApprovalRequired { .. }) => Ok(e.to_string()),
        e => Err(e.into()),
    }
}

/// `GET /ui/environments/{env}/faults`.
pub async fn page(
    State(s): State<AppState>,
    user: UiUser,
    Path(env): Path<String>,
    Query(q): Query<DoneQuery>,
) -> Result<Response, UiError> {
    render(&s, &user, &env, q.done, None).await
}

/// Form creating a fault rule.
#[derive(Debug, Deserialize)]
pub struct NewRuleForm {
    service: String,
    id: String,
    dependency: String,
    #[serde(default)]
    operation: String,
    /// `delay`, `abort` or `connection_error`.
    kind: String,
    /// The delay (`2s`) or the HTTP status (`503`); empty for a connection error.
    #[serde(default)]
    param: String,
    percent: String,
    /// How long the rule lasts (mandatory), e.g. `30m`.
    lasts: String,
    #[serde(default)]
    reason: String,
}

fn parse_rule(f: &NewRuleForm) -> Result<(Name, NewFaultRule), String> {
    let id = Name::parse("id", f.id.trim()).map_err(|e| e.to_string())?;
    let param = f.param.trim();
    let action = match f.kind.as_str() {
        "delay" => FaultAction::Delay {
            delay: levee_agent::policy::duration::parse(param).map_err(|m| format!("delay: {m}"))?,
        },
        "abort" => FaultAction::Abort {
            status: param
                .parse()
                .map_err(|_| format!("status: {param:?} is not an HTTP status such as 503"))?,
        },
        "connection_error" => FaultAction::ConnectionError,
        k => return Err(format!("action {k:?} is not delay, abort or connection_error")),
    };
    let percent =
        f.percent.trim().parse::<f64>().map_err(|_| format!("percent: {:?} is not a number", f.percent))?;
    let t = f.lasts.trim();
    if t.is_empty() {
        return Err("expires in: required — every fault rule ends by itself (e.g. 30m)".into());
    }
    let d = levee_agent::policy::duration::parse(t).map_err(|m| format!("expires in: {m}"))?;
    let expires_at = Timestamp::from_unix_ms(Timestamp::now().unix_ms().saturating_add(d.as_millis() as i64));
    let op = f.operation.trim();
    let new = NewFaultRule {
        dependency: f.dependency.trim().to_string(),
        operation: (!op.is_empty()).then(|| op.to_string()),
        action,
        percent,
        expires_at,
        instances: Vec::new(),
    };
    Ok((id, new))
}

/// `POST /ui/environments/{env}/faults`: creates (or replaces) a fault rule.
pub async fn create(
    State(s): State<AppState>,
    rid: RequestId,
    Path(env): Path<String>,
    Posted { user, form }: Posted<NewRuleForm>,
) -> Result<Response, UiError> {
    let by = user.actor(Action::FaultSet, &rid)?;
    let parsed = reason(&form.reason).and_then(|r| Ok((r, parse_rule(&form)?)));
    let (why, (id, new)) = match parsed {
        Ok(p) => p,
        Err(m) => return render(&s, &user, &env, None, Some(m)).await,
    };
    let at = ServiceAt::new(&env, form.service.trim(), None);
    match s.actions.set_fault_rule(&by, &why, &at, &id, new).await {
        Ok(w) => Ok(done(
            &env,
            &format!("Fault rule {id} set in {} (revision {})", at.service, w.snapshot.revision),
        )),
        Err(e) => render(&s, &user, &env, None, Some(says(e)?)).await,
    }
}

/// Form ending a fault rule early.
#[derive(Debug, Deserialize)]
pub struct EndForm {
    #[serde(default)]
    reason: String,
}

/// `POST /ui/environments/{env}/faults/{svc}/{id}/end`: removes a fault rule now.
pub async fn end(
    State(s): State<AppState>,
    rid: RequestId,
    Path((env, svc, id)): Path<(String, String, String)>,
    Posted { user, form }: Posted<EndForm>,
) -> Result<Response, UiError> {
    let by = user.actor(Action::FaultDelete, &rid)?;
    let why = match reason(&form.reason) {
        Ok(r) => r,
        Err(m) => return render(&s, &user, &env, None, Some(m)).await,
    };
    let at = ServiceAt::new(&env, &svc, None);
    match s.actions.delete_fault_rule(&by, &why, &at, &id).await {
        Ok(_) => Ok(done(&env, &format!("Fault rule {id} of {svc} ended"))),
        Err(e) => render(&s, &user, &env, None, Some(says(e)?)).await,
    }
}

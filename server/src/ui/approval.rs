//! Four-eyes in the browser.
//!
//! A confirmation page whose change needs an approved change request in its environment
//! (the environment's approval rules) says so before anything is tried, and its one form
//! offers the two ways on, with the reason typed once: **propose** the change as a change
//! request (the same change, for someone else to approve), or — where the role allows it —
//! **break the glass**: apply it now without approval, audited as a bypass with the reason.
//! The action decides: a change refused for want of approval (the rules changed, or cover
//! more than the page knew) shows its confirmation page again with the reason kept and the
//! same two offers, never a bare error page.
//!
//! `GET /ui/environments/{env}/approval-rules`: which kinds of change need approval, and
//! for an admin the form that sets them (audited as `approval.rules`).

use askama::Template;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Redirect, Response};
use serde::Deserialize;

use super::error::UiError;
use super::page::{Layout, Page, seg};
use super::review::DoneQuery;
use super::session::{Posted, UiUser, reason};
use crate::actions::{Action, Actor, Approval, ChangeError, Reason};
use crate::db::ChangeKind;
use crate::web::{AppState, RequestId};

/// How a confirmed change is asked for: the change itself, a change request proposing it,
/// or the change at once without approval (break-glass).
#[derive(Clone, Copy, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Mode {
    /// The change itself (refused where its kind needs approval).
    #[default]
    Direct,
    /// Propose it as a change request.
    Propose,
    /// Apply it now without approval, with the reason as the bypass's reason.
    BreakGlass,
}

impl Mode {
    /// The actor of the change in this mode: a break-glass change carries its reason.
    pub fn actor(self, mut by: Actor, why: &Reason) -> Actor {
        if self == Mode::BreakGlass {
            by.approval = Approval::BreakGlass(why.as_str().to_string());
        }
        by
    }
}

/// What a confirmation page says and offers when its change needs approval.
#[derive(Clone, Debug)]
pub struct Gate {
    pub env: String,
    /// The kind of change that needs approval (`flag`, `policy`, `profile`).
    pub kind: ChangeKind,
    /// The change can be proposed as a change request from this page.
    pub can_propose: bool,
    /// The user's role may break the glass.
    pub can_break_glass: bool,
    /// The change was tried and refused for want of approval.
    pub refused: bool,
    /// Why this change cannot be proposed from its page, when it cannot.
    pub no_proposal: Option<String>,
}

impl Gate {
    /// The same gate, saying why the change cannot be proposed from its page.
    pub fn unproposable(mut self, why: impl Into<String>) -> Gate {
        self.can_propose = false;
        self.no_proposal = Some(why.into());
        self
    }
}

/// The gate of a change of `kinds` (what it changes, `actions::kinds_changed`) in `env` as
/// the environment's rules stand, for the confirmation page to say before anything is tried
/// (the action still decides): the first of them that needs approval.
pub async fn gate(
    s: &AppState,
    user: &UiUser,
    env: &str,
    kinds: &[ChangeKind],
    can_propose: bool,
) -> Result<Option<Gate>, UiError> {
    let gated = s.store.approval_kinds(env).await?;
    let kind = kinds.iter().copied().find(|k| gated.contains(k));
    Ok(kind.map(|kind| offer(user, env, kind, can_propose, false)))
}

/// The offer of a confirmation page whose change needs approval of `kind`.
pub fn offer(user: &UiUser, env: &str, kind: ChangeKind, can_propose: bool, refused: bool) -> Gate {
    Gate {
        env: env.to_string(),
        kind,
        can_propose: can_propose && user.principal.role >= Action::RequestCreate.role(),
        can_break_glass: user.principal.role >= Action::ApprovalBypass.role(),
        refused,
        no_proposal: None,
    }
}

/// The refusal of a change for want of approval, as the gate its page shows again with
/// the reason kept; any other error as it is.
pub fn refused(e: ChangeError, user: &UiUser, can_propose: bool) -> Result<Gate, UiError> {
    match e {
        ChangeError::ApprovalRequired { env, kind } => Ok(offer(user, &env, kind, can_propose, true)),
        e => Err(e.into()),
    }
}

/// Where a proposed change request is shown.
pub fn proposed(env: &str, id: i64) -> Response {
    let msg = format!("Proposed change request {id}: someone else must approve it before it is applied");
    Redirect::to(&format!("/ui/environments/{}/requests?done={}#request-{id}", seg(env), seg(&msg)))
        .into_response()
}

// ---- the approval-rules page ------------------------------------------------------------

struct KindView {
    name: &'static str,
    /// What a change of this kind is, in words.
    covers: &'static str,
    on: bool,
}

fn covers(kind: ChangeKind) -> &'static str {
    match kind {
        ChangeKind::Flag => {
            "flag values: switches, kill switches, any flag a change sets (a flip, an apply, a rollback)"
        }
        ChangeKind::Policy => {
            "the policy: edits, whole-service applies, rollbacks, creating or deleting a service"
        }
        ChangeKind::Profile => "applying an emergency profile",
        ChangeKind::Experiment => {
            "starting an experiment (its fault injected into some of a service's instances)"
        }
    }
}

#[derive(Template)]
#[template(path = "approval_rules.html")]
struct RulesPage {
    layout: Layout,
    env: String,
    csrf: String,
    can_set: bool,
    kinds: Vec<KindView>,
    reason: String,
    notice: Option<String>,
    error: Option<String>,
}

async fn rules_page(
    s: &AppState,
    user: &UiUser,
    env: &str,
    shown: Option<(&RulesForm, String)>,
    notice: Option<String>,
) -> Result<Response, UiError> {
    s.store.environment(env).await?.ok_or_else(|| UiError::NotFound(format!("no environment {env:?}")))?;
    let stored = s.store.approval_kinds(env).await?;
    let kinds = ChangeKind::ALL
        .iter()
        .map(|&k| KindView {
            name: k.as_str(),
            covers: covers(k),
            on: match &shown {
                Some((f, _)) => f.chosen().contains(&k),
                None => stored.contains(&k),
            },
        })
        .collect();
    let status = if shown.is_some() { StatusCode::BAD_REQUEST } else { StatusCode::OK };
    let page = RulesPage {
        layout: user.layout(),
        env: env.to_string(),
        csrf: user.csrf.clone(),
        can_set: user.principal.role >= Action::ApprovalRules.role(),
        kinds,
        reason: shown.as_ref().map(|(f, _)| f.reason.clone()).unwrap_or_default(),
        notice,
        error: shown.map(|(_, e)| e),
    };
    Ok(Page::with_status(status, page).into_response())
}

/// `GET /ui/environments/{env}/approval-rules`.
pub async fn rules(
    State(s): State<AppState>,
    user: UiUser,
    Path(env): Path<String>,
    Query(q): Query<DoneQuery>,
) -> Result<Response, UiError> {
    rules_page(&s, &user, &env, None, q.done).await
}

/// Form setting the approval rules: one checkbox per kind.
#[derive(Debug, Default, Deserialize)]
pub struct RulesForm {
    #[serde(default)]
    policy: Option<String>,
    #[serde(default)]
    flag: Option<String>,
    #[serde(default)]
    profile: Option<String>,
    #[serde(default)]
    experiment: Option<String>,
    #[serde(default)]
    reason: String,
}

impl RulesForm {
    fn chosen(&self) -> Vec<ChangeKind> {
        [
            (ChangeKind::Policy, &self.policy),
            (ChangeKind::Flag, &self.flag),
            (ChangeKind::Profile, &self.profile),
            (ChangeKind::Experiment, &self.experiment),
        ]
        .into_iter()
        .filter(|(_, v)| v.is_some())
        .map(|(k, _)| k)
        .collect()
    }
}

/// `POST /ui/environments/{env}/approval-rules`: sets the kinds that need approval.
pub async fn set_rules(
    State(s): State<AppState>,
    rid: RequestId,
    Path(env): Path<String>,
    Posted { user, form }: Posted<RulesForm>,
) -> Result<Response, UiError> {
    let by = user.actor(Action::ApprovalRules, &rid)?;
    let why = match reason(&form.reason) {
        Ok(r) => r,
        Err(m) => return rules_page(&s, &user, &env, Some((&form, m)), None).await,
    };
    let kinds = form.chosen().iter().map(|k| k.as_str().to_string()).collect();
    let set = match s.actions.set_approval_rules(&by, &why, &env, kinds).await {
        Ok(set) => set,
        Err(ChangeError::InvalidField(f)) => {
            return rules_page(&s, &user, &env, Some((&form, f.to_string())), None).await;
        }
        Err(e) => return Err(e.into()),
    };
    let msg = if set.is_empty() {
        "Saved: no kind of change needs approval".to_string()
    } else {
        format!(
            "Saved: {} changes need an approved change request",
            set.iter().map(|k| k.as_str()).collect::<Vec<_>>().join(", ")
        )
    };
    Ok(Redirect::to(&format!("/ui/environments/{}/approval-rules?done={}", seg(&env), seg(&msg)))
        .into_response())
}

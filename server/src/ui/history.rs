//! Revision history with the diff of each revision, and one-click rollback: a
//! confirmation page (what the rollback changes, a reason) followed by the rollback action
//! based on the revision the confirmation showed. Where the rollback changes a kind that
//! needs approval, the confirmation offers to propose it or to break the glass
//! (`approval.rs`), as a flip's does.

use askama::Template;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use levee_agent::policy::{Policy, ServiceConfig};
use serde::Deserialize;
use serde_json::Value;

use super::approval::{self, Gate, Mode};
use super::edit::{DiffRow, diff_rows};
use super::error::UiError;
use super::page::{Layout, Page, When, service_url, time};
use super::session::{Posted, UiUser, reason};
use crate::actions::{Action, ChangeError, Proposal, ServiceAt, config_kinds_changed};
use crate::db::Unreadable;
use crate::diff::{DiffEntry, json_diff};
use crate::web::{AppState, RequestId};

/// Revisions listed on the history page.
pub const HISTORY_PAGE_REVISIONS: i64 = 50;

struct RevisionView {
    revision: u64,
    at: When,
    actor: String,
    reason: String,
    hash: String,
    current: bool,
    /// What this revision changed from the one before it.
    diff: Vec<DiffRow>,
    /// Why this server cannot read the revision (then there is no diff, and no rollback
    /// to it); `None` when it reads.
    unreadable: Option<String>,
}

#[derive(Template)]
#[template(path = "history.html")]
struct HistoryPage {
    layout: Layout,
    env: String,
    svc: String,
    base: String,
    can_operate: bool,
    revision: u64,
    revisions: Vec<RevisionView>,
}

/// Revision `revision`'s configuration as JSON: `None` when it was never stored, an
/// [`Unreadable`] when it does not decode with this version.
async fn body(
    s: &AppState,
    env: &str,
    svc: &str,
    revision: u64,
) -> Result<Option<Result<Value, Unreadable>>, UiError> {
    Ok(s.store.revision(env, svc, revision).await?.map(|r| r.value()))
}

/// What a revision with nothing before it (the first) made: every leaf of `v` as added,
/// by its path, as a change's diff lists them (an empty object or list is a leaf).
fn created(v: &Value) -> Vec<DiffEntry> {
    fn walk(path: String, v: &Value, out: &mut Vec<DiffEntry>) {
        let join = |k: &str| if path.is_empty() { k.to_string() } else { format!("{path}.{k}") };
        match v {
            Value::Object(o) if !o.is_empty() => o.iter().for_each(|(k, v)| walk(join(k), v, out)),
            Value::Array(a) if !a.is_empty() => {
                a.iter().enumerate().for_each(|(i, v)| walk(format!("{path}[{i}]"), v, out))
            }
            _ => out.push(DiffEntry { path, op: "added", before: None, after: Some(v.clone()) }),
        }
    }
    let mut out = Vec::new();
    walk(String::new(), v, &mut out);
    out
}

/// `GET …/history`: the newest revisions, each with what it changed.
pub async fn page(
    State(s): State<AppState>,
    user: UiUser,
    Path((env, svc)): Path<(String, String)>,
) -> Result<Response, UiError> {
    let row = s
        .store
        .service(&env, &svc)
        .await?
        .ok_or_else(|| UiError::NotFound(format!("no service {svc:?} in environment {env:?}")))?;
    let metas = s.store.revisions(&env, &svc, HISTORY_PAGE_REVISIONS).await?;
    let mut revisions = Vec::with_capacity(metas.len());
    for m in metas {
        let (this, unreadable) = match body(&s, &env, &svc, m.revision).await? {
            Some(Ok(v)) => (Some(v), None),
            Some(Err(u)) => (None, Some(u.reason)),
            None => (Some(Value::Null), None),
        };
        let before = match this {
            Some(_) if m.revision > 1 => body(&s, &env, &svc, m.revision - 1).await?.and_then(Result::ok),
            _ => None,
        };
        revisions.push(RevisionView {
            revision: m.revision,
            at: time(m.created_at),
            actor: m.actor,
            reason: m.reason,
            hash: m.hash,
            current: m.revision == row.revision,
            diff: this
                .map(|this| match &before {
                    Some(before) => diff_rows(json_diff(before, &this)),
                    None => diff_rows(created(&this)),
                })
                .unwrap_or_default(),
            unreadable,
        });
    }
    let page = HistoryPage {
        layout: user.layout(),
        base: service_url(&env, &svc),
        can_operate: user.principal.role >= Action::Rollback.role(),
        revision: row.revision,
        revisions,
        env,
        svc,
    };
    Ok(Page::ok(page).into_response())
}

/// Form of a rollback and of its confirmation.
#[derive(Debug, Deserialize)]
pub struct RollbackForm {
    /// The revision whose content becomes current again.
    to: u64,
    /// The revision the page showed as current.
    revision: u64,
    #[serde(default)]
    reason: String,
    /// The rollback, its proposal, or break-glass.
    #[serde(default)]
    mode: Mode,
}

#[derive(Template)]
#[template(path = "rollback.html")]
struct RollbackPage {
    layout: Layout,
    env: String,
    svc: String,
    base: String,
    csrf: String,
    to: u64,
    revision: u64,
    diff: Vec<DiffRow>,
    reason: String,
    error: Option<String>,
    note: Option<String>,
    /// Set when the rollback needs approval: what the form offers instead.
    gate: Option<Gate>,
}

/// A rollback from `now` to `to` as a change request: a request carries a whole policy,
/// one flag value or a profile, so only a rollback that changes nothing but the policy is
/// one (the policy of `to`); `Err` says why this one is not.
fn as_proposal(now: &ServiceConfig, to: &ServiceConfig) -> Result<Policy, String> {
    let json = |c: &ServiceConfig| serde_json::to_value(c).unwrap_or(Value::Null);
    let mut others: Vec<String> = json_diff(&json(now), &json(to))
        .into_iter()
        .map(|d| d.path.split(['.', '[']).next().unwrap_or_default().to_string())
        .filter(|top| top != "policy")
        .collect();
    others.sort_unstable();
    others.dedup();
    if others.is_empty() {
        return Ok(to.policy.clone());
    }
    Err(format!(
        "A change request carries a policy, one flag value or an emergency profile; this rollback changes {}, \
         so it cannot be proposed as one. Propose the policy from the policy editor and each flag value \
         from the change requests page instead.",
        others.join(", ")
    ))
}

async fn rollback_page(
    s: &AppState,
    user: &UiUser,
    env: &str,
    svc: &str,
    f: &RollbackForm,
    error: Option<String>,
    refused: Option<Gate>,
) -> Result<RollbackPage, UiError> {
    let row = s
        .store
        .service(env, svc)
        .await?
        .ok_or_else(|| UiError::NotFound(format!("no service {svc:?} in environment {env:?}")))?;
    let target = s
        .store
        .revision(env, svc, f.to)
        .await?
        .ok_or_else(|| UiError::NotFound(format!("no revision {} of service {svc:?}", f.to)))?
        .config()?;
    let now = s.store.revision(env, svc, row.revision).await?.and_then(|r| r.config().ok());
    let json = |c: &ServiceConfig| serde_json::to_value(c).unwrap_or(Value::Null);
    let note = (f.revision != row.revision).then(|| {
        format!(
            "The service changed since you opened its history (you saw revision {}, it is now at {}): the diff \
             below is against revision {}.",
            f.revision, row.revision, row.revision
        )
    });
    // What the rules say before anything is tried (the action decides; a current revision
    // that does not read leaves it to the action).
    let gate = match (refused, &now) {
        (Some(g), _) => Some(g),
        (None, Some(now)) => approval::gate(s, user, env, &config_kinds_changed(now, &target), true).await?,
        (None, None) => None,
    };
    let gate = match (gate, &now) {
        (Some(g), Some(now)) => match as_proposal(now, &target) {
            Ok(_) => Some(g),
            Err(why) => Some(g.unproposable(why)),
        },
        (Some(g), None) => Some(g.unproposable(
            "The current revision does not read, so there is nothing to compare a proposal with.",
        )),
        (None, _) => None,
    };
    Ok(RollbackPage {
        layout: user.layout(),
        env: env.to_string(),
        svc: svc.to_string(),
        base: service_url(env, svc),
        csrf: user.csrf.clone(),
        to: f.to,
        revision: row.revision,
        diff: diff_rows(json_diff(&now.as_ref().map(json).unwrap_or(Value::Null), &json(&target))),
        reason: f.reason.clone(),
        error,
        note,
        gate,
    })
}

/// `GET …/rollback/confirm?to=…&revision=…`: what rolling back to revision `to` changes;
/// asks for a reason. Changes nothing.
pub async fn confirm(
    State(s): State<AppState>,
    user: UiUser,
    Path((env, svc)): Path<(String, String)>,
    Query(form): Query<RollbackForm>,
) -> Result<Response, UiError> {
    user.require(Action::Rollback)?;
    Ok(Page::ok(rollback_page(&s, &user, &env, &svc, &form, None, None).await?).into_response())
}

/// `POST …/rollback`: makes revision `to`'s content current again as a new revision; or
/// proposes it as a change request, or applies it by break-glass, where it needs approval.
pub async fn apply(
    State(s): State<AppState>,
    rid: RequestId,
    Path((env, svc)): Path<(String, String)>,
    Posted { user, form }: Posted<RollbackForm>,
) -> Result<Response, UiError> {
    let by = user.actor(Action::Rollback, &rid)?;
    let reason = match reason(&form.reason) {
        Ok(r) => r,
        Err(msg) => {
            let page = rollback_page(&s, &user, &env, &svc, &form, Some(msg), None).await?;
            return Ok(Page::with_status(StatusCode::BAD_REQUEST, page).into_response());
        }
    };
    if form.mode == Mode::Propose {
        return propose(&s, &by, &reason, (&env, &svc), &form).await;
    }
    let by = form.mode.actor(by, &reason);
    let at = ServiceAt::new(&env, &svc, Some(form.revision));
    let w = match s.actions.rollback(&by, &reason, &at, form.to).await {
        Ok(w) => w,
        Err(e @ ChangeError::ApprovalRequired { .. }) => {
            let gate = approval::refused(e, &user, true)?;
            let page = rollback_page(&s, &user, &env, &svc, &form, None, Some(gate)).await?;
            return Ok(Page::with_status(StatusCode::FORBIDDEN, page).into_response());
        }
        Err(e) => return Err(e.into()),
    };
    tracing::info!(actor = ?by.name, environment = ?env, service = ?svc, to = form.to, revision = w.snapshot.revision, "rolled back from the UI");
    Ok(super::changes::after_change(&env, &svc, &w))
}

/// Proposes the rollback as a change request of revision `to`'s policy, when that is all
/// it changes from the revision the confirmation showed.
async fn propose(
    s: &AppState,
    by: &crate::actions::Actor,
    reason: &crate::actions::Reason,
    (env, svc): (&str, &str),
    form: &RollbackForm,
) -> Result<Response, UiError> {
    let row = s
        .store
        .service(env, svc)
        .await?
        .ok_or_else(|| UiError::NotFound(format!("no service {svc:?} in environment {env:?}")))?;
    if row.revision != form.revision {
        return Err(ChangeError::Conflict { expected: form.revision, current: row.revision }.into());
    }
    let config = |n: u64| async move {
        s.store
            .revision(env, svc, n)
            .await?
            .ok_or_else(|| UiError::NotFound(format!("no revision {n} of service {svc:?}")))?
            .config()
            .map_err(UiError::from)
    };
    let policy =
        as_proposal(&config(row.revision).await?, &config(form.to).await?).map_err(UiError::BadRequest)?;
    let p = Proposal::Policy { service: svc.to_string(), policy: Box::new(policy) };
    let r = s.actions.propose(by, reason, env, p).await?;
    Ok(approval::proposed(env, r.id))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_revision_lists_every_leaf_it_created() {
        let v = serde_json::json!({"policy": {"dependencies": {"pay": {"attempt_timeout": "80ms"}}, "routes": []},
            "flags": {"a": {"value": true}}, "faults": [{"id": "x"}]});
        let paths: Vec<(String, String)> =
            created(&v).into_iter().map(|e| (e.path, e.after.unwrap().to_string())).collect();
        assert_eq!(
            paths,
            [
                ("faults[0].id".to_string(), "\"x\"".to_string()),
                ("flags.a.value".into(), "true".into()),
                ("policy.dependencies.pay.attempt_timeout".into(), "\"80ms\"".into()),
                ("policy.routes".into(), "[]".into()),
            ]
        );
    }
}

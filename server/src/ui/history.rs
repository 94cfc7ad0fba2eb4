//! Revision history with the diff of each revision, and one-click rollback: a
//! confirmation page (what the rollback changes, a reason) followed by the rollback action
//! based on the revision the confirmation showed.

use askama::Template;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Redirect, Response};
use serde::Deserialize;
use serde_json::Value;

use super::edit::{DiffRow, diff_rows};
use super::error::UiError;
use super::page::{Layout, Page, When, service_url, time};
use super::session::{Posted, UiUser, reason};
use crate::actions::{Action, ServiceAt};
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
}

async fn rollback_page(
    s: &AppState,
    user: &UiUser,
    env: &str,
    svc: &str,
    f: &RollbackForm,
    error: Option<String>,
) -> Result<RollbackPage, UiError> {
    let row = s
        .store
        .service(env, svc)
        .await?
        .ok_or_else(|| UiError::NotFound(format!("no service {svc:?} in environment {env:?}")))?;
    let target = body(s, env, svc, f.to)
        .await?
        .ok_or_else(|| UiError::NotFound(format!("no revision {} of service {svc:?}", f.to)))??;
    let now = body(s, env, svc, row.revision).await?.and_then(Result::ok).unwrap_or(Value::Null);
    let note = (f.revision != row.revision).then(|| {
        format!(
            "The service changed since you opened its history (you saw revision {}, it is now at {}): the diff \
             below is against revision {}.",
            f.revision, row.revision, row.revision
        )
    });
    Ok(RollbackPage {
        layout: user.layout(),
        env: env.to_string(),
        svc: svc.to_string(),
        base: service_url(env, svc),
        csrf: user.csrf.clone(),
        to: f.to,
        revision: row.revision,
        diff: diff_rows(json_diff(&now, &target)),
        reason: f.reason.clone(),
        error,
        note,
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
    Ok(Page::ok(rollback_page(&s, &user, &env, &svc, &form, None).await?).into_response())
}

/// `POST …/rollback`: makes revision `to`'s content current again as a new revision.
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
            let page = rollback_page(&s, &user, &env, &svc, &form, Some(msg)).await?;
            return Ok(Page::with_status(StatusCode::BAD_REQUEST, page).into_response());
        }
    };
    let at = ServiceAt::new(&env, &svc, Some(form.revision));
    let w = s.actions.rollback(&by, &reason, &at, form.to).await?;
    tracing::info!(actor = ?by.name, environment = ?env, service = ?svc, to = form.to, revision = w.snapshot.revision, "rolled back from the UI");
    let url = if w.changed {
        format!("{}?changed={}#propagation", service_url(&env, &svc), w.snapshot.revision)
    } else {
        format!("{}?unchanged=1", service_url(&env, &svc))
    };
    Ok(Redirect::to(&url).into_response())
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

//! `GET /ui/audit`: the audit log, newest first, filtered by environment, service, actor
//! and kind of action (changes only, without the logins that swamp it; refusals; one
//! family such as `flag`).

use askama::Template;
use axum::extract::{Query, State};
use serde::Deserialize;

use super::error::UiError;
use super::page::{Layout, Page, When, time};
use super::session::UiUser;
use crate::db::{AuditFilter, AuditOutcome};
use crate::web::AppState;

/// The action filter's choices: (value, label). `changes` is every row but the logins
/// (`auth.*`);
/// any other value is an action or a family of actions (`flag`: `flag.set`, `flag.delete`).
pub const ACTION_CHOICES: [(&str, &str); 13] = [
    ("", "every action"),
    ("changes", "changes (no logins)"),
    ("access.refused", "refusals for a lack of role"),
    ("flag", "flags"),
    ("breaker", "breaker overrides"),
    ("policy", "policy edits"),
    ("service", "services (create, apply, rollback, delete)"),
    ("profile", "emergency profiles"),
    ("request", "change requests"),
    ("approval", "approval rules and break-glass"),
    ("schedule", "scheduled changes"),
    ("fault", "fault injection"),
    ("auth", "logins"),
];

/// Entries per page.
pub const AUDIT_PAGE_SIZE: i64 = 100;

/// Filters of the audit page; empty fields mean "any".
#[derive(Debug, Default, Deserialize)]
pub struct AuditQuery {
    #[serde(default)]
    environment: String,
    #[serde(default)]
    service: String,
    #[serde(default)]
    actor: String,
    /// One of [`ACTION_CHOICES`]' values; empty: every action.
    #[serde(default)]
    action: String,
    /// Page: entries older than this id.
    #[serde(default)]
    before_id: String,
}

struct EntryView {
    id: i64,
    at: When,
    actor: String,
    via: &'static str,
    action: String,
    scope: String,
    target: String,
    outcome: &'static str,
    ok: bool,
    reason: String,
    revision: String,
    before: String,
    after: String,
    detail: String,
}

#[derive(Template)]
#[template(path = "audit.html")]
struct AuditPage {
    layout: Layout,
    environment: String,
    service: String,
    actor: String,
    action: String,
    actions: Vec<(&'static str, &'static str)>,
    entries: Vec<EntryView>,
    /// Query string of the next (older) page, when there may be one.
    older: Option<String>,
}

fn some(s: &str) -> Option<String> {
    Some(s.trim().to_string()).filter(|s| !s.is_empty())
}

/// `GET /ui/audit`.
pub async fn page(
    State(s): State<AppState>,
    user: UiUser,
    Query(q): Query<AuditQuery>,
) -> Result<Page<impl Template>, UiError> {
    let before_id = match some(&q.before_id) {
        None => None,
        Some(b) => Some(
            b.parse::<i64>().map_err(|_| UiError::BadRequest(format!("before_id {b:?} is not a number")))?,
        ),
    };
    let action = q.action.trim();
    if !ACTION_CHOICES.iter().any(|(v, _)| *v == action) {
        let allowed: Vec<&str> = ACTION_CHOICES.iter().skip(1).map(|(v, _)| *v).collect();
        return Err(UiError::BadRequest(format!(
            "action {action:?} is not one of: {} (or empty for every action)",
            allowed.join(", ")
        )));
    }
    let (action_filter, exclude_action) = match action {
        "" => (None, None),
        "changes" => (None, Some("auth.%".to_string())),
        a => (Some(a.to_string()), None),
    };
    let f = AuditFilter {
        environment: some(&q.environment),
        service: some(&q.service),
        actor: some(&q.actor),
        before_id,
        limit: AUDIT_PAGE_SIZE,
        action: action_filter,
        exclude_action,
        ..Default::default()
    };
    let rows = s.store.audit(&f).await?;
    let older = match rows.last() {
        Some(last) if rows.len() as i64 == AUDIT_PAGE_SIZE => Some(
            serde_urlencoded::to_string([
                ("environment", q.environment.trim()),
                ("service", q.service.trim()),
                ("actor", q.actor.trim()),
                ("action", action),
                ("before_id", &last.id.to_string()),
            ])
            .map_err(|e| UiError::Internal(e.into()))?,
        ),
        _ => None,
    };
    let entries = rows
        .into_iter()
        .map(|r| EntryView {
            id: r.id,
            at: time(r.at),
            actor: r.actor,
            via: r.via.as_str(),
            action: r.action,
            scope: match (&r.environment, &r.service) {
                (Some(e), Some(s)) => format!("{e} / {s}"),
                (Some(e), None) => e.clone(),
                _ => String::new(),
            },
            target: r.target,
            ok: r.outcome == AuditOutcome::Ok,
            outcome: r.outcome.as_str(),
            reason: r.reason,
            revision: r.revision.map(|v| v.to_string()).unwrap_or_default(),
            before: r.before.unwrap_or_default(),
            after: r.after.unwrap_or_default(),
            detail: r.detail.unwrap_or_default(),
        })
        .collect();
    Ok(Page::ok(AuditPage {
        layout: user.layout(),
        environment: q.environment.trim().to_string(),
        service: q.service.trim().to_string(),
        actor: q.actor.trim().to_string(),
        action: action.to_string(),
        actions: ACTION_CHOICES.to_vec(),
        entries,
        older,
    }))
}

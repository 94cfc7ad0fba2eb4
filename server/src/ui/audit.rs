//! `GET /ui/audit`: the audit log, newest first, filtered by environment, service and actor.

use askama::Template;
use axum::extract::{Query, State};
use serde::Deserialize;

use super::error::UiError;
use super::page::{Layout, Page, When, time};
use super::session::UiUser;
use crate::db::AuditFilter;
use crate::web::AppState;

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
    /// Page: entries older than this id.
    #[serde(default)]
    before_id: String,
}

struct EntryView {
    id: i64,
    at: When,
    actor: String,
    via: String,
    action: String,
    scope: String,
    target: String,
    outcome: String,
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
    let f = AuditFilter {
        environment: some(&q.environment),
        service: some(&q.service),
        actor: some(&q.actor),
        before_id,
        limit: AUDIT_PAGE_SIZE,
        ..Default::default()
    };
    let rows = s.store.audit(&f).await?;
    let older = match rows.last() {
        Some(last) if rows.len() as i64 == AUDIT_PAGE_SIZE => Some(
            serde_urlencoded::to_string([
                ("environment", q.environment.trim()),
                ("service", q.service.trim()),
                ("actor", q.actor.trim()),
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
            via: r.via,
            action: r.action,
            scope: match (&r.environment, &r.service) {
                (Some(e), Some(s)) => format!("{e} / {s}"),
                (Some(e), None) => e.clone(),
                _ => String::new(),
            },
            target: r.target,
            ok: r.outcome == "ok",
            outcome: r.outcome,
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
        entries,
        older,
    }))
}

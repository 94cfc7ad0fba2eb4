//! The service page's live part: `GET …/live` streams server-sent events (one `state` event
//! whenever what it shows changes, checked every [`LIVE_INTERVAL`]) that `live.js` writes
//! into the page with `textContent` only. Without JavaScript the page shows the same state
//! as rendered and reloads itself while a change is spreading.

use std::convert::Infallible;
use std::time::Duration;

use axum::extract::{Path, State};
use axum::response::sse::{Event, KeepAlive, Sse};
use futures::Stream;
use levee_agent::policy::{ServiceConfig, Timestamp};
use serde::Serialize;

use super::alarms;
use super::error::UiError;
use super::fleet::AgentReport;
use super::session::UiUser;
use crate::web::AppState;

/// How often the live stream looks for changes.
pub const LIVE_INTERVAL: Duration = Duration::from_secs(1);

/// What the live part of a service page shows.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct LiveState {
    /// Current revision.
    pub revision: u64,
    /// "N of M agents applied revision R", in words.
    pub summary: String,
    /// Connected agents on the current revision or later.
    pub applied: usize,
    /// Connected agents.
    pub connected: usize,
    /// Propagation of the current revision (commit to ACK), in words; empty when no agent ACKed it.
    pub latency: String,
    /// NACKs of the current revision: "instance: reason".
    pub nacks: Vec<String>,
    /// Breakers open on connected agents.
    pub open_breakers: Vec<String>,
    /// Dependencies and features on a fallback, with since when.
    pub fallbacks: Vec<String>,
    /// Every agent: "name: revision R (source)".
    pub agents: Vec<String>,
    /// What is abnormal now (the banner), in words.
    pub alarms: Vec<String>,
}

/// Reads the live state of a service.
///
/// # Errors
/// The database failed, or there is no such service.
pub async fn state(s: &AppState, env: &str, svc: &str) -> Result<LiveState, UiError> {
    let not_found = || UiError::NotFound(format!("no service {svc:?} in environment {env:?}"));
    let row = s.store.service(env, svc).await?.ok_or_else(not_found)?;
    let snap = s.store.latest_snapshot(env, svc).await?.ok_or_else(not_found)?;
    let cfg: ServiceConfig = serde_json::from_str(&snap.body)
        .map_err(|e| UiError::Internal(anyhow::anyhow!("stored snapshot does not decode: {e}")))?;
    let agents = s.store.agents(env, svc).await?;
    let nacks = s.store.nacks(env, svc).await?;
    let live: Vec<_> = agents.iter().filter(|a| a.connected).collect();
    let applied = live.iter().filter(|a| a.applied_revision >= row.revision).count();
    let summary = if live.is_empty() {
        format!("Revision {}: delivered to no agent (none is connected).", row.revision)
    } else {
        format!("{applied} of {} agents applied revision {}.", live.len(), row.revision)
    };
    let latency = match s.store.propagation(env, svc, row.revision).await? {
        Some(p) if p.acked > 0 => format!(
            "Commit to ACK: p50 {}, p99 {}, max {} over {} ACK{}.",
            super::page::duration(p.p50.unwrap_or_default()),
            super::page::duration(p.p99.unwrap_or_default()),
            super::page::duration(p.max.unwrap_or_default()),
            p.acked,
            if p.acked == 1 { "" } else { "s" }
        ),
        _ => String::new(),
    };
    let mut open_breakers = Vec::new();
    let mut fallbacks = Vec::new();
    for a in &live {
        let r = AgentReport::of(a);
        for b in r.open_breakers {
            open_breakers.push(format!("{b} on {}", a.instance_id));
        }
        for (dep, level, since) in r.fallbacks {
            fallbacks.push(format!("dependency {dep} on {level} since {since} ({})", a.instance_id));
        }
        for (f, level, since) in r.degraded_since {
            fallbacks.push(format!("feature {f} on {level} since {since} ({})", a.instance_id));
        }
    }
    let now = Timestamp::now();
    Ok(LiveState {
        revision: row.revision,
        summary,
        applied,
        connected: live.len(),
        latency,
        nacks: nacks
            .iter()
            .filter(|n| n.revision == row.revision)
            .map(|n| format!("{} rejected revision {}: {}", n.instance_id, n.revision, n.error_detail))
            .collect(),
        open_breakers,
        fallbacks,
        agents: agents
            .iter()
            .map(|a| {
                let source = if a.source.is_empty() { "source not reported yet" } else { a.source.as_str() };
                format!("{}: revision {} ({source})", a.instance_id, a.applied_revision)
            })
            .collect(),
        alarms: alarms::for_service(env, svc, &cfg, row.revision, &agents, &nacks, now)
            .list
            .into_iter()
            .map(|a| a.text)
            .collect(),
    })
}

/// `GET …/live`: server-sent `state` events (JSON of [`LiveState`]) whenever it changes.
pub async fn events(
    State(s): State<AppState>,
    _user: UiUser,
    axum::extract::Path((env, svc)): Path<(String, String)>,
) -> Result<Sse<impl Stream<Item = Result<Event, Infallible>>>, UiError> {
    let first = state(&s, &env, &svc).await?;
    let stream = async_stream::stream! {
        let mut last = first;
        if let Ok(e) = Event::default().event("state").json_data(&last) {
            yield Ok(e);
        }
        let mut tick = tokio::time::interval(LIVE_INTERVAL);
        tick.tick().await;
        // The stream ends as soon as the server stops: graceful shutdown waits for every
        // open response, and this one would never end by itself (the browser reconnects).
        let mut stop = s.shutdown.clone();
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                () = crate::shutdown::stopped(&mut stop) => break,
            }
            match state(&s, &env, &svc).await {
                Ok(now) if now != last => {
                    if let Ok(e) = Event::default().event("state").json_data(&now) {
                        yield Ok(e);
                    }
                    last = now;
                }
                Ok(_) => {}
                // The service went away or the database failed: end; the browser retries.
                Err(_) => break,
            }
        }
    };
    Ok(Sse::new(stream).keep_alive(KeepAlive::default()))
}

//! Pages that follow the fleet without a reload: the overview (`GET /ui/live`), an
//! environment (`GET /ui/environments/{env}/live`) and a service (`GET …/live`) each have
//! a stream of server-sent events: one `state` event ([`LiveState`]) at once and one
//! whenever what the page would show has changed, checked every [`LIVE_INTERVAL`].
//!
//! The event carries a fingerprint (`token`) of every status the page derives from its one
//! read (alarms and their levers, propagation, breakers, agents); `live.js` compares it
//! with the one the page was rendered with and, when it differs, fetches the page again
//! and puts its `data-live` sections in place of the old ones. The server renders every
//! status, once, from one read: nothing on the page can disagree with the rest, and no
//! script writes markup (the sections come from the same escaped templates). Without
//! JavaScript the page shows the state as rendered and reloads itself while a change is
//! spreading.

use std::convert::Infallible;
use std::hash::{Hash, Hasher};
use std::time::Duration;

use axum::extract::{Path, State};
use axum::response::sse::{Event, KeepAlive, Sse};
use futures::Stream;
use serde::Serialize;

use super::alarms;
use super::error::UiError;
use super::fleet::FleetSummary;
use super::session::UiUser;
use super::status::{Propagation, ServiceFacts, breaker_column};
use crate::web::AppState;

/// How often a live stream looks for changes.
pub const LIVE_INTERVAL: Duration = Duration::from_secs(1);

/// What a live stream says: the service's propagation (zero for the overview and an
/// environment) and the fingerprint of the page's state.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct LiveState {
    /// Current revision (a service page).
    pub revision: u64,
    /// "N of M agents applied revision R.", in words (a service page).
    pub summary: String,
    /// Connected agents on the current revision or later.
    pub applied: usize,
    /// Connected agents.
    pub connected: usize,
    /// Fingerprint of every status the page shows; a page rendered from the same state
    /// carries the same one.
    pub token: String,
}

/// The fingerprint of `view`.
fn token(view: &impl Hash) -> String {
    // SipHash with fixed keys: the same state gives the same token in every process.
    let mut h = std::hash::DefaultHasher::new();
    view.hash(&mut h);
    format!("{:016x}", h.finish())
}

/// The live state of a service page, from its one read.
pub fn of_service(f: &ServiceFacts) -> LiveState {
    let p = Propagation::of(f.row.revision, f);
    let agents: Vec<_> = f
        .agents
        .iter()
        .map(|a| {
            (
                &a.instance_id,
                a.connected,
                a.applied_revision,
                &a.source,
                a.status.as_ref().map(|s| s.to_string()),
                a.last_seen / 60_000,
            )
        })
        .collect();
    let view = (
        f.row.revision,
        &p,
        alarms::for_service(f),
        breaker_column(f).into_iter().collect::<Vec<_>>(),
        agents,
        f.nacks.len(),
        &f.latency,
        f.active.as_ref().map(|a| a.id),
    );
    LiveState {
        revision: f.row.revision,
        summary: p.summary(),
        applied: p.acked,
        connected: p.connected,
        token: token(&view),
    }
}

/// The live state of an environment page (its alarms and each service's fleet).
///
/// # Errors
/// The database failed; no such environment.
pub async fn of_environment(s: &AppState, env: &str) -> Result<LiveState, UiError> {
    s.store.environment(env).await?.ok_or_else(|| UiError::NotFound(format!("no environment {env:?}")))?;
    let alarms = alarms::for_environment(s, env).await?;
    let mut fleet = Vec::new();
    for r in s.store.services(env).await? {
        let agents = s.store.agents(env, &r.name).await?;
        let nacks = s.store.nacks(env, &r.name).await?;
        fleet.push((r.name, r.revision, FleetSummary::new(r.revision, &agents, &nacks)));
    }
    let pending = s.store.requests(env).await?.iter().filter(|r| r.state.is_pending()).count();
    Ok(LiveState { token: token(&(alarms, fleet, pending)), ..quiet() })
}

/// The live state of the overview (every environment's alarms, active profile and
/// change requests waiting).
///
/// # Errors
/// The database failed.
pub async fn of_overview(s: &AppState) -> Result<LiveState, UiError> {
    let mut view = Vec::new();
    for e in s.store.environments().await? {
        let alarms = alarms::for_environment(s, &e.name).await?;
        let pending = s.store.requests(&e.name).await?.iter().filter(|r| r.state.is_pending()).count();
        let services = s.store.services(&e.name).await?.len();
        view.push((e.name, services, alarms, pending));
    }
    Ok(LiveState { token: token(&view), ..quiet() })
}

fn quiet() -> LiveState {
    LiveState { revision: 0, summary: String::new(), applied: 0, connected: 0, token: String::new() }
}

/// What a stream follows.
#[derive(Clone)]
enum Scope {
    Overview,
    Environment(String),
    Service(String, String),
}

async fn read(s: &AppState, scope: &Scope) -> Result<LiveState, UiError> {
    match scope {
        Scope::Overview => of_overview(s).await,
        Scope::Environment(env) => of_environment(s, env).await,
        Scope::Service(env, svc) => Ok(of_service(&ServiceFacts::load(s, env, svc).await?)),
    }
}

async fn stream(
    s: AppState,
    scope: Scope,
) -> Result<Sse<impl Stream<Item = Result<Event, Infallible>>>, UiError> {
    let first = read(&s, &scope).await?;
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
            match read(&s, &scope).await {
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

/// `GET /ui/live`: the overview's events.
pub async fn overview(
    State(s): State<AppState>,
    _user: UiUser,
) -> Result<Sse<impl Stream<Item = Result<Event, Infallible>>>, UiError> {
    stream(s, Scope::Overview).await
}

/// `GET /ui/environments/{env}/live`: an environment page's events.
pub async fn environment(
    State(s): State<AppState>,
    _user: UiUser,
    Path(env): Path<String>,
) -> Result<Sse<impl Stream<Item = Result<Event, Infallible>>>, UiError> {
    stream(s, Scope::Environment(env)).await
}

/// `GET …/live`: a service page's events.
pub async fn events(
    State(s): State<AppState>,
    _user: UiUser,
    Path((env, svc)): Path<(String, String)>,
) -> Result<Sse<impl Stream<Item = Result<Event, Infallible>>>, UiError> {
    stream(s, Scope::Service(env, svc)).await
}

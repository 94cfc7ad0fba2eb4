//! `GET /` (environments) and `GET /ui/environments/{env}` (its services at a glance).
//! Both start with what is abnormal in their scope, each alarm with its levers, follow
//! the fleet live (`live.rs`), and show the active emergency profile and the change
//! requests waiting for a decision.

use askama::Template;
use axum::extract::{Path, State};

use super::alarms::{self, Alarms};
use super::error::UiError;
use super::fleet::FleetSummary;
use super::live::LiveState;
use super::page::{Layout, Page, When, time};
use super::session::UiUser;
use crate::web::AppState;

/// An emergency profile active in an environment, as the overview shows it.
struct ActiveProfile {
    name: String,
    by: String,
    reason: String,
    until: When,
}

struct EnvView {
    name: String,
    description: String,
    allow_faults: bool,
    services: usize,
    active: Option<ActiveProfile>,
    /// Change requests open or approved, not yet applied.
    waiting: usize,
}

#[derive(Template)]
#[template(path = "environments.html")]
struct EnvironmentsPage {
    layout: Layout,
    can_operate: bool,
    is_admin: bool,
    environments: Vec<EnvView>,
    alarms: Alarms,
    alarms_scope: &'static str,
    live: LiveState,
}

/// Change requests of `env` waiting for a decision or to be applied.
pub async fn waiting_requests(s: &AppState, env: &str) -> Result<usize, UiError> {
    Ok(s.store.requests(env).await?.iter().filter(|r| r.state.is_pending()).count())
}

/// `GET /`: the environments.
pub async fn environments(State(s): State<AppState>, user: UiUser) -> Result<Page<impl Template>, UiError> {
    let mut environments = Vec::new();
    let mut all = Alarms::default();
    for e in s.store.environments().await? {
        let services = s.store.services(&e.name).await?.len();
        all.extend_prefixed(&e.name, alarms::for_environment(&s, &e.name).await?);
        let active = s.store.active_profile(&e.name).await?.map(|a| ActiveProfile {
            name: a.profile,
            by: a.applied_by,
            reason: a.reason,
            until: time(a.expires_at),
        });
        environments.push(EnvView {
            waiting: waiting_requests(&s, &e.name).await?,
            name: e.name,
            description: e.description,
            allow_faults: e.allow_faults,
            services,
            active,
        });
    }
    Ok(Page::ok(EnvironmentsPage {
        live: super::live::of_overview(&s).await?,
        layout: user.layout(),
        can_operate: user.can_operate(),
        is_admin: user.principal.role >= crate::actions::Action::EnvironmentCreate.role(),
        environments,
        alarms: all.sorted(),
        alarms_scope: "in any environment",
    }))
}

struct ServiceView {
    name: String,
    description: String,
    revision: u64,
    updated_at: When,
    fleet: FleetSummary,
}

#[derive(Template)]
#[template(path = "environment.html")]
struct EnvironmentPage {
    layout: Layout,
    can_operate: bool,
    env: String,
    description: String,
    allow_faults: bool,
    services: Vec<ServiceView>,
    alarms: Alarms,
    alarms_scope: &'static str,
    waiting: usize,
    live: LiveState,
}

/// `GET /ui/environments/{env}`: every service with its revision and how the fleet took it.
pub async fn services(
    State(s): State<AppState>,
    user: UiUser,
    Path(env): Path<String>,
) -> Result<Page<impl Template>, UiError> {
    let e = s
        .store
        .environment(&env)
        .await?
        .ok_or_else(|| UiError::NotFound(format!("no environment {env:?}")))?;
    let mut services = Vec::new();
    for r in s.store.services(&env).await? {
        let agents = s.store.agents(&env, &r.name).await?;
        let nacks = s.store.nacks(&env, &r.name).await?;
        services.push(ServiceView {
            fleet: FleetSummary::new(r.revision, &agents, &nacks),
            name: r.name,
            description: r.description,
            revision: r.revision,
            updated_at: time(r.updated_at),
        });
    }
    let alarms = alarms::for_environment(&s, &env).await?;
    Ok(Page::ok(EnvironmentPage {
        live: super::live::of_environment(&s, &env).await?,
        waiting: waiting_requests(&s, &env).await?,
        alarms,
        alarms_scope: "in this environment",
        layout: user.layout(),
        can_operate: user.can_operate(),
        env: e.name,
        description: e.description,
        allow_faults: e.allow_faults,
        services,
    }))
}

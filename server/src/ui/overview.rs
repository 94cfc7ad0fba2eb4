//! `GET /` (environments) and `GET /ui/environments/{env}` (its services at a glance).

use askama::Template;
use axum::extract::{Path, State};

use super::alarms::{self, Alarms};
use super::error::UiError;
use super::fleet::FleetSummary;
use super::page::{Layout, Page, time};
use super::session::UiUser;
use crate::web::AppState;

struct EnvView {
    name: String,
    description: String,
    allow_faults: bool,
    services: usize,
}

#[derive(Template)]
#[template(path = "environments.html")]
struct EnvironmentsPage {
    layout: Layout,
    environments: Vec<EnvView>,
    alarms: Alarms,
    alarms_scope: &'static str,
}

/// `GET /`: the environments.
pub async fn environments(State(s): State<AppState>, user: UiUser) -> Result<Page<impl Template>, UiError> {
    let mut environments = Vec::new();
    let mut all = Alarms::default();
    let now = levee_agent::policy::Timestamp::now();
    for e in s.store.environments().await? {
        let services = s.store.services(&e.name).await?.len();
        all.extend_prefixed(&e.name, alarms::for_environment(&s, &e.name, now).await?);
        environments.push(EnvView {
            name: e.name,
            description: e.description,
            allow_faults: e.allow_faults,
            services,
        });
    }
    Ok(Page::ok(EnvironmentsPage {
        layout: user.layout(),
        environments,
        alarms: all.sorted(),
        alarms_scope: "in any environment",
    }))
}

struct ServiceView {
    name: String,
    description: String,
    revision: u64,
    updated_at: String,
    fleet: FleetSummary,
}

#[derive(Template)]
#[template(path = "environment.html")]
struct EnvironmentPage {
    layout: Layout,
    env: String,
    description: String,
    allow_faults: bool,
    services: Vec<ServiceView>,
    alarms: Alarms,
    alarms_scope: &'static str,
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
    let alarms = alarms::for_environment(&s, &env, levee_agent::policy::Timestamp::now()).await?;
    Ok(Page::ok(EnvironmentPage {
        alarms,
        alarms_scope: "in this environment",
        layout: user.layout(),
        env: e.name,
        description: e.description,
        allow_faults: e.allow_faults,
        services,
    }))
}

//! `GET /ui/environments/{env}/services/{svc}`: one service — its dependencies and their
//! policies, the degradation matrix, flags with their switches, breaker overrides, the
//! agents with the revision each applied, NACKs, and how far the last change has spread.

use askama::Template;
use axum::extract::{Path, Query, State};
use axum::http::HeaderMap;
use levee_agent::policy::{
    BreakerOverrideState, DependencyCriticality, DependencyPolicy, Flag, FlagType, ServiceConfig, Window,
};
use serde::Deserialize;

use super::admission::AdmissionView;
use super::alarms::{self, Alarms};
use super::error::UiError;
use super::fleet::AgentReport;
use super::live::LiveState;
use super::page::{Layout, Page, When, duration, percent, service_url, time};
use super::session::UiUser;
use super::status::{BreakerCell, Propagation, ServiceFacts, breaker_column};
use crate::advice::BulkheadSizing;
use crate::db::{AgentRow, ServiceRow};
use crate::web::AppState;

/// How often the page reloads itself while a change is still spreading (no JavaScript).
pub const PROPAGATION_REFRESH_SECS: u32 = 2;

/// Query of the service page: set after a change so the page follows its propagation.
#[derive(Debug, Deserialize)]
pub struct ServiceQuery {
    /// Revision created by the change just made.
    changed: Option<String>,
    /// Set when the change requested was already in effect.
    unchanged: Option<String>,
}

/// A service's stored state, loaded once per request.
pub struct Loaded {
    /// The services row (current revision).
    pub row: ServiceRow,
    /// The current snapshot body.
    pub config: ServiceConfig,
}

/// Loads a service and its current snapshot, or 404.
pub async fn load(s: &AppState, env: &str, svc: &str) -> Result<Loaded, UiError> {
    let not_found = || UiError::NotFound(format!("no service {svc:?} in environment {env:?}"));
    let row = s.store.service(env, svc).await?.ok_or_else(not_found)?;
    let snap = s.store.latest_snapshot(env, svc).await?.ok_or_else(not_found)?;
    let config = snap.config()?;
    Ok(Loaded { row, config })
}

/// A kill switch as shown next to what it switches.
pub struct SwitchView {
    /// Key of the bool flag.
    pub flag: String,
    /// `on`, `off`, or why neither (compiled into the service, missing flag, not a bool).
    pub state: String,
    /// CSS class of the state: `ok` only for a switch that is on, `bad` for one that is
    /// off or that cannot work (OPS-1), `warn` for one the server cannot switch.
    pub class: &'static str,
}

/// The state of the kill switch `key` in words. A reference to a flag the service does not
/// define, or to a flag that is not a bool, is shown as a problem, never as fine (OPS-1):
/// validation refuses both, but a snapshot stored before that rule may still hold one.
pub fn switch_view(cfg: &ServiceConfig, key: &str) -> SwitchView {
    let (state, class) = match cfg.flags.get(key) {
        Some(f) if f.kind == FlagType::Bool => match f.value.as_bool() {
            Some(true) => ("on".to_string(), "ok"),
            _ => ("off".to_string(), "bad"),
        },
        Some(f) => {
            (format!("broken: not a bool flag ({}), this switch does nothing", f.kind.as_str()), "bad")
        }
        None if cfg.policy.compiled_in_flags.contains(key) => (
            "compiled into the service: agents use its default; define the flag here to switch it"
                .to_string(),
            "warn",
        ),
        None => ("broken: no such flag, this switch does nothing".to_string(), "bad"),
    };
    SwitchView { flag: key.to_string(), state, class }
}

struct DepView {
    name: String,
    critical: bool,
    attempt_timeout: String,
    retry: String,
    breaker: String,
    /// The breaker as the connected agents report it (live).
    breaker_now: BreakerCell,
    bulkhead: String,
    /// What Little's law says of the bulkhead's size, from the agents' traffic.
    bulkhead_advice: Option<String>,
    fallback: &'static str,
    kill_switch: Option<SwitchView>,
    overrides: Vec<String>,
    operations: usize,
}

fn dep_view(
    name: &str,
    d: &DependencyPolicy,
    cfg: &ServiceConfig,
    breaker_now: BreakerCell,
    sizing: Option<&BulkheadSizing>,
) -> DepView {
    let retry = if d.retry.max_attempts <= 1 {
        "no retry".to_string()
    } else {
        format!(
            "{} attempts, backoff {}…{}",
            d.retry.max_attempts,
            duration(d.retry.base),
            duration(d.retry.cap)
        )
    };
    let b = &d.circuit_breaker;
    let breaker = if b.enabled {
        let window = match b.window {
            Window::Count { size } => format!("last {size} calls"),
            Window::Time { seconds } => format!("last {seconds} s"),
        };
        let slow = match b.slow_call_duration {
            Some(s) => format!(", or ≥ {} slower than {}", percent(b.slow_call_rate_threshold), duration(s)),
            None => String::new(),
        };
        format!(
            "opens at ≥ {} failures{slow} of the {window} (min {} calls); open {}…{}",
            percent(b.failure_rate_threshold),
            b.minimum_calls,
            duration(b.wait_in_open),
            duration(b.max_wait_in_open)
        )
    } else {
        "off".to_string()
    };
    let overrides = cfg
        .breaker_overrides
        .iter()
        .filter(|o| o.dependency == name)
        .map(|o| match &o.operation {
            Some(op) => format!("{op}: {}", state_label(o.state)),
            None => state_label(o.state).to_string(),
        })
        .collect();
    let bulkhead_advice = sizing.and_then(|z| {
        let n = z.suggested_size?;
        Some(format!(
            "Little's law: {n} for the traffic its agents see ({} in flight now over {} agent{})",
            z.in_use,
            z.instances,
            if z.instances == 1 { "" } else { "s" }
        ))
    });
    DepView {
        name: name.to_string(),
        critical: d.criticality == DependencyCriticality::Critical,
        attempt_timeout: duration(d.attempt_timeout),
        retry,
        breaker,
        breaker_now,
        bulkhead: format!(
            "{} concurrent, wait ≤ {}",
            d.bulkhead.max_concurrent,
            duration(d.bulkhead.max_wait)
        ),
        bulkhead_advice,
        fallback: d.fallback.as_str(),
        kill_switch: d.enabled_flag.as_deref().map(|k| switch_view(cfg, k)),
        overrides,
        operations: d.operations.len(),
    }
}

/// Upper-case label of an override state.
pub fn state_label(s: BreakerOverrideState) -> &'static str {
    match s {
        BreakerOverrideState::ForcedOpen => "FORCED_OPEN",
        BreakerOverrideState::ForcedClosed => "FORCED_CLOSED",
        BreakerOverrideState::Disabled => "DISABLED",
    }
}

/// The one-click switch of a bool flag.
struct Flip {
    /// Value it sets.
    value: &'static str,
    /// Text of the button.
    label: &'static str,
}

struct FlagView {
    key: String,
    kind: &'static str,
    value: String,
    description: String,
    owner: String,
    expires: Option<When>,
    /// For bool flags: what the one-click switch does.
    flip: Option<Flip>,
    off: bool,
    used_by: Vec<String>,
}

/// A flag's value as an operator types it: strings bare, everything else as JSON.
pub fn value_text(f: &Flag) -> String {
    match &f.value {
        serde_json::Value::String(s) if f.kind == FlagType::String => s.clone(),
        v => v.to_string(),
    }
}

fn flag_view(key: &str, f: &Flag, cfg: &ServiceConfig) -> FlagView {
    let flip = match (f.kind, f.value.as_bool()) {
        (FlagType::Bool, Some(true)) => Some(Flip { value: "false", label: "Turn off" }),
        (FlagType::Bool, _) => Some(Flip { value: "true", label: "Turn on" }),
        _ => None,
    };
    FlagView {
        key: key.to_string(),
        kind: f.kind.as_str(),
        value: value_text(f),
        description: f.description.clone(),
        owner: f.owner.clone(),
        expires: f.expires_at.map(|t| time(t.unix_ms())),
        flip,
        off: f.kind == FlagType::Bool && f.value.as_bool() == Some(false),
        used_by: switched_by(cfg, key),
    }
}

/// What the bool flag `key` switches: dependencies and matrix features that name it.
pub fn switched_by(cfg: &ServiceConfig, key: &str) -> Vec<String> {
    cfg.policy.flag_references().into_iter().filter(|r| r.key == key).map(|r| r.switches).collect()
}

struct MatrixView {
    feature: String,
    dependencies: String,
    on_failure: &'static str,
    owner: String,
    decision: String,
    /// Where the owner's runbook is, as written (shown escaped).
    runbook: String,
    /// Whether `runbook` is a web address, shown as a link; anything else (a page name,
    /// another scheme) is shown as text only.
    runbook_link: bool,
    alert_after: String,
    switch: Option<SwitchView>,
    /// On its fallback on a connected agent longer than `alert_after`: since when.
    past_alert: Option<When>,
}

struct OverrideView {
    dependency: String,
    operation: String,
    state: &'static str,
    expires: Option<When>,
    reason: String,
}

struct AgentView {
    instance: String,
    version: String,
    connected: bool,
    /// The newer instance that took its place, for a disconnected one.
    replaced_by: Option<String>,
    last_seen: When,
    applied_revision: u64,
    on_current: bool,
    source: String,
    breakers: String,
    degraded: String,
}

fn agent_view(a: &AgentRow, current: u64, replaced_by: Option<String>) -> AgentView {
    let r = AgentReport::of(a);
    AgentView {
        instance: a.instance_id.clone(),
        version: a.agent_version.clone(),
        connected: a.connected,
        replaced_by,
        last_seen: time(a.last_seen),
        applied_revision: a.applied_revision,
        on_current: a.applied_revision == current,
        source: r.source,
        breakers: r.breakers.join(", "),
        degraded: r.degraded.iter().map(|(f, l)| format!("{f} ({l})")).collect::<Vec<_>>().join(", "),
    }
}

struct NackView {
    instance: String,
    revision: u64,
    detail: String,
    at: When,
}

/// A staged rollout in progress, as the service page announces it.
struct RolloutLine {
    id: i64,
    url: String,
    state: String,
    stage: usize,
    stages: usize,
    candidate: u64,
    stable: u64,
}

#[derive(Template)]
#[template(path = "service.html")]
struct ServicePage {
    layout: Layout,
    env: String,
    svc: String,
    /// Path of this page (encoded), the base of the forms' actions.
    base: String,
    description: String,
    revision: u64,
    hash: String,
    updated_at: When,
    can_operate: bool,
    /// Set right after a change made from this page.
    change: Option<Propagation>,
    unchanged: bool,
    refresh_secs: u32,
    current: Propagation,
    /// Commit-to-ACK times of the current revision, in words.
    latency: String,
    /// NACKs of the current revision, "instance: reason".
    current_nacks: Vec<String>,
    /// The server's advice: the policy's own lints and those that need the environment
    /// and the agents' reports.
    lints: Vec<(String, String)>,
    /// What makes the stored snapshot invalid under this server's validation (a revision an
    /// older server stored, e.g. a kill switch naming no flag): shown as problems.
    problems: Vec<(String, String)>,
    dependencies: Vec<DepView>,
    dependency_names: Vec<String>,
    matrix: Vec<MatrixView>,
    flags: Vec<FlagView>,
    overrides: Vec<OverrideView>,
    agents: Vec<AgentView>,
    nacks: Vec<NackView>,
    /// The emergency profile active in the environment, if any.
    profile: Option<super::profiles::ActiveView>,
    /// The service's staged rollout in progress, if any.
    rollout: Option<RolloutLine>,
    alarms: Alarms,
    alarms_scope: &'static str,
    faults: Vec<FaultView>,
    /// The game days running on the service.
    game_days: Vec<GameDayLine>,
    /// The live stream's state (its fingerprint tells `live.js` when to fetch the page).
    live: LiveState,
    live_src: String,
    /// Inbound admission: the policy and what the agents report (shadow counts included).
    admission: AdmissionView,
    /// What each dependency's calls and each route's requests did in the last minute.
    health: Vec<HealthView>,
}

/// One dependency or route in the health section, in words.
struct HealthView {
    kind: &'static str,
    name: String,
    calls: u64,
    /// Share of the calls that reached it that failed or timed out, and its CSS class.
    failing: String,
    failing_class: &'static str,
    failures: u64,
    timeouts: u64,
    /// Share refused on the agents' machines (kill switch, breaker, bulkhead, admission).
    shed: String,
    fallbacks: u64,
    breaker_opens: u64,
    p50: String,
    p99: String,
}

impl HealthView {
    fn of((kind, name): &(crate::health::SubjectKind, String), t: &crate::health::HealthTotals) -> Self {
        use super::alarms::{HEALTH_BAD_SHARE, HEALTH_MIN_CALLS, HEALTH_WARN_SHARE};
        let reached = t.successes + t.failures + t.timeouts;
        let rate = t.error_rate();
        let ms = |v: Option<f64>| v.map_or_else(|| "—".to_string(), |ms| format!("≤ {ms} ms"));
        Self {
            kind: kind.as_str(),
            name: name.clone(),
            calls: t.calls,
            failing: percent(rate),
            failing_class: match rate {
                _ if reached < HEALTH_MIN_CALLS => "",
                r if r >= HEALTH_BAD_SHARE => "bad",
                r if r >= HEALTH_WARN_SHARE => "warn",
                _ => "",
            },
            failures: t.failures,
            timeouts: t.timeouts,
            shed: percent(t.shed_rate()),
            fallbacks: t.fallbacks,
            breaker_opens: t.breaker_opens,
            p50: ms(t.p50_ms()),
            p99: ms(t.p99_ms()),
        }
    }
}

/// A game day running on the service, as the viewer may see it.
struct GameDayLine {
    id: i64,
    by: String,
    since: When,
    /// Whether the viewer may see what it injected (its starter, an admin).
    shown: bool,
}

struct FaultView {
    id: String,
    target: String,
    action: String,
    percent: f64,
    expires: When,
}

/// Whether the request is a person opening the page (a navigation, or a client that does
/// not say), not the live script fetching it again to swap its sections: only the former
/// is a game day's look at the service.
fn opened_by_a_person(headers: &HeaderMap) -> bool {
    headers.get("sec-fetch-dest").is_none_or(|d| d.as_bytes() == b"document")
}

/// `GET /ui/environments/{env}/services/{svc}`.
pub async fn page(
    State(s): State<AppState>,
    user: UiUser,
    Path((env, svc)): Path<(String, String)>,
    Query(q): Query<ServiceQuery>,
    headers: HeaderMap,
) -> Result<Page<impl Template>, UiError> {
    let f = ServiceFacts::load(&s, &env, &svc).await?;
    if opened_by_a_person(&headers) {
        s.actions.record_game_day_look(&f.game_days, &user.principal).await?;
    }
    let snap_hash = s.store.latest_snapshot(&env, &svc).await?.map(|r| r.hash).unwrap_or_default();
    let (row, cfg, now) = (&f.row, &f.cfg, f.now);
    let change = q.changed.as_deref().and_then(|c| c.parse::<u64>().ok()).map(|r| Propagation::of(r, &f));
    let past = crate::advice::features_past_alert(&cfg.policy, &f.agents, now);
    let environment = {
        let mut e = crate::advice::environment(&s.store, &env).await?;
        e.insert(svc.clone(), cfg.policy.clone());
        e
    };
    let lints = crate::advice::advise(&svc, &cfg.policy, &environment, &f.agents, now);
    let sizing = crate::advice::bulkheads(&cfg.policy, &f.agents);
    let mut breakers = breaker_column(&f);
    let replaced = f.replaced();
    let rollout =
        s.store.rollouts(&env, Some(&svc), 1).await?.into_iter().find(|r| r.active()).map(|r| RolloutLine {
            url: super::rollouts::url(&env, r.id),
            id: r.id,
            state: r.state.to_string(),
            stage: r.stage + 1,
            stages: r.plan.stages.len(),
            candidate: r.candidate_revision,
            stable: r.stable_revision,
        });
    let page = ServicePage {
        health: f.health.iter().map(|(k, t)| HealthView::of(k, t)).collect(),
        rollout,
        profile: f.active.as_ref().map(super::profiles::ActiveView::of),
        live: super::live::of_service(&f),
        live_src: format!("{}/live", service_url(&env, &svc)),
        alarms: alarms::for_service(&f),
        alarms_scope: "in this service",
        game_days: f
            .game_days
            .iter()
            .map(|e| GameDayLine {
                id: e.id,
                by: e.created_by.clone(),
                since: time(e.created_at),
                shown: crate::actions::sees_injected(e, &user.principal),
            })
            .collect(),
        faults: cfg
            .faults
            .iter()
            .chain(f.game_day_faults.iter().filter(|fr| {
                f.game_days.iter().any(|e| {
                    crate::actions::experiment_fault_id(e.id) == fr.id
                        && crate::actions::sees_injected(e, &user.principal)
                })
            }))
            .filter(|fr| fr.expires_at > now)
            .map(|fr| FaultView {
                id: fr.id.clone(),
                target: match &fr.operation {
                    Some(op) => format!("{} {op}", fr.dependency),
                    None => fr.dependency.clone(),
                },
                action: serde_json::to_string(&fr.action).unwrap_or_default(),
                percent: fr.percent,
                expires: time(fr.expires_at.unix_ms()),
            })
            .collect(),
        layout: user.layout(),
        can_operate: user.can_operate(),
        change,
        unchanged: q.unchanged.is_some(),
        refresh_secs: PROPAGATION_REFRESH_SECS,
        current: Propagation::of(row.revision, &f),
        latency: f.latency.clone(),
        current_nacks: f
            .nacks
            .iter()
            .filter(|n| n.revision == row.revision)
            .map(|n| format!("{}: {}", n.instance_id, n.error_detail))
            .collect(),
        lints: lints.into_iter().map(|l| (l.path, l.message)).collect(),
        problems: cfg
            .validate()
            .err()
            .map(|v| v.0)
            .unwrap_or_default()
            .into_iter()
            .map(|e| (e.path, e.message))
            .collect(),
        dependencies: cfg
            .policy
            .dependencies
            .iter()
            .map(|(n, d)| {
                let now = breakers.remove(n).unwrap_or(BreakerCell { text: String::new(), class: "muted" });
                let z = sizing.iter().find(|z| z.dependency == *n && z.operation.is_none());
                dep_view(n, d, cfg, now, z)
            })
            .collect(),
        dependency_names: cfg.policy.dependencies.keys().cloned().collect(),
        matrix: cfg
            .policy
            .degradation_matrix
            .iter()
            .enumerate()
            .map(|(i, r)| MatrixView {
                past_alert: past.iter().find(|p| p.row == i).map(|p| time(p.since.unix_ms())),
                feature: r.feature.clone(),
                dependencies: r.dependencies.join(", "),
                on_failure: r.on_failure.as_str(),
                owner: r.owner.clone(),
                decision: r.decision.clone(),
                runbook: r.runbook.clone(),
                runbook_link: is_web_address(&r.runbook),
                alert_after: duration(r.alert_after),
                switch: r.enabled_flag.as_deref().map(|k| switch_view(cfg, k)),
            })
            .collect(),
        flags: cfg.flags.iter().map(|(k, fl)| flag_view(k, fl, cfg)).collect(),
        overrides: cfg
            .breaker_overrides
            .iter()
            .map(|o| OverrideView {
                dependency: o.dependency.clone(),
                operation: o.operation.clone().unwrap_or_default(),
                state: state_label(o.state),
                expires: o.expires_at.map(|t| time(t.unix_ms())),
                reason: o.reason.clone(),
            })
            .collect(),
        agents: f
            .agents
            .iter()
            .map(|a| agent_view(a, row.revision, replaced.get(&a.instance_id).cloned()))
            .collect(),
        admission: AdmissionView::new(
            &cfg.policy.inbound,
            cfg.levers.as_ref().filter(|l| l.expires_at > now),
            &f.agents,
        ),
        nacks: f
            .nacks
            .iter()
            .map(|n| NackView {
                instance: n.instance_id.clone(),
                revision: n.revision,
                detail: n.error_detail.clone(),
                at: time(n.at),
            })
            .collect(),
        base: service_url(&env, &svc),
        description: row.description.clone(),
        revision: row.revision,
        hash: snap_hash,
        updated_at: time(row.updated_at),
        env,
        svc,
    };
    Ok(Page::ok(page))
}

/// Whether `text` is an http(s) address, the only runbooks shown as links: a link of any
/// other scheme (`javascript:`, `data:`) would run or show something other than a page.
fn is_web_address(text: &str) -> bool {
    let rest = ["https://", "http://"].iter().find_map(|p| {
        text.get(..p.len()).filter(|head| head.eq_ignore_ascii_case(p)).map(|_| &text[p.len()..])
    });
    rest.is_some_and(|r| !r.is_empty() && !text.chars().any(|c| c.is_whitespace() || c.is_control()))
}

#[cfg(test)]
mod tests {
    use super::is_web_address;

    #[test]
    fn only_http_and_https_addresses_are_runbook_links() {
        for link in ["https://runbooks.example.com/recs", "HTTP://wiki/On-call?a=1&b=2"] {
            assert!(is_web_address(link), "{link}");
        }
        for text in [
            "",
            "https://",
            "javascript:alert(1)",
            "data:text/html,x",
            "wiki: Growth/On call",
            "https://a b",
            "ftp://files/runbook",
            "//runbooks.example.com",
        ] {
            assert!(!is_web_address(text), "{text}");
        }
    }
}

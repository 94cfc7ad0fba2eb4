//! Advice on a service's policy from what only the server knows: the other services of its
//! environment and what its agents report. It adds four lints of control-plane.md §4 to
//! the policy's own (`levee_agent::policy::lint`), and the Little's-law size of every
//! bulkhead; the API answers them on every write, on `GET .../lint`, in the service view
//! and in the plan of `levee apply`.
//!
//! | code | rule (source article) | what the server reads |
//! | --- | --- | --- |
//! | `retries_on_several_layers` | retry on one layer of a chain | a dependency named like a service of the environment is a link of a chain; retries configured on two consecutive links |
//! | `bulkhead_far_from_littles_law` | bulkhead = rate × normal latency × headroom | each connected agent's `suggested_size` (Little's law with ×2 headroom) for the bulkhead |
//! | `readiness_on_non_critical` | readiness does not depend on non-critical dependencies | a `critical` dependency (it decides readiness) that the policy itself says the service can do without |
//! | `fallback_longer_than_alert` | alert when a feature lives on a fallback longer than N | `degraded_since` of each feature in connected agents' reports vs the matrix row's `alert_after` |
//!
//! Every function here is pure: the caller reads the store and hands in what it read.

use std::collections::BTreeMap;
use std::time::Duration;

use levee_agent::policy::{
    DependencyCriticality, DependencyPolicy, FallbackLevel, Lint, Policy, Timestamp, lint,
};
use serde::{Deserialize, Serialize};

use crate::db::{AgentRow, Reader};

/// A bulkhead whose configured size is more than this many times the Little's-law size
/// (which already has ×2 headroom) isolates nothing: a slow dependency still takes that
/// many callers.
pub const BULKHEAD_TOO_LARGE_FACTOR: f64 = 4.0;

/// The part of an agent's status report (stored JSON, written by `sync`) that advice reads.
/// What agents send is untrusted: fields that do not decode count as absent.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct Report {
    features: Vec<FeatureReport>,
    bulkheads: Vec<BulkheadReport>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct FeatureReport {
    feature: String,
    level: String,
    degraded_since: Option<Timestamp>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct BulkheadReport {
    dependency: String,
    operation: String,
    in_use: u32,
    suggested_size: f64,
}

/// The status reports of the agents connected now (a disconnected agent's report is old).
fn reports(agents: &[AgentRow]) -> Vec<Report> {
    agents
        .iter()
        .filter(|a| a.connected)
        .filter_map(|a| a.status.as_ref())
        .map(|s| Report::deserialize(s).unwrap_or_default())
        .collect()
}

/// One bulkhead of a service, with the size Little's law suggests for the traffic its
/// agents see.
#[derive(Clone, Debug, PartialEq, Serialize, utoipa::ToSchema)]
pub struct BulkheadSizing {
    /// The dependency.
    pub dependency: String,
    /// The operation with its own bulkhead; absent for the dependency's.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub operation: Option<String>,
    /// Concurrent calls the policy admits per instance (`max_concurrent`).
    pub max_concurrent: u32,
    /// Little's law for the busiest connected instance: ceil(arrivals/s × normal latency
    /// × 2); absent while no connected agent has measured traffic through it.
    pub suggested_size: Option<u32>,
    /// Calls in flight now, summed over connected instances.
    pub in_use: u32,
    /// Connected instances that reported this bulkhead.
    pub instances: usize,
}

/// Every bulkhead of `policy` (each dependency's, and each operation's that has its own)
/// with what connected agents report about it.
pub fn bulkheads(policy: &Policy, agents: &[AgentRow]) -> Vec<BulkheadSizing> {
    let reports = reports(agents);
    let mut out = Vec::new();
    for (name, dep) in &policy.dependencies {
        let own = dep.operations.iter().filter_map(|(op, o)| Some((Some(op.as_str()), o.bulkhead.as_ref()?)));
        for (op, bulkhead) in std::iter::once((None, &dep.bulkhead)).chain(own) {
            let seen: Vec<&BulkheadReport> = reports
                .iter()
                .flat_map(|r| &r.bulkheads)
                .filter(|b| b.dependency == *name && b.operation == op.unwrap_or(""))
                .collect();
            let suggested = seen
                .iter()
                .map(|b| b.suggested_size)
                .filter(|s| s.is_finite() && *s >= 1.0)
                .fold(None, |m: Option<f64>, s| Some(m.map_or(s, |m| m.max(s))));
            out.push(BulkheadSizing {
                dependency: name.clone(),
                operation: op.map(str::to_string),
                max_concurrent: bulkhead.max_concurrent,
                suggested_size: suggested.map(|s| s.ceil().min(f64::from(u32::MAX)) as u32),
                in_use: seen.iter().map(|b| b.in_use).fold(0u32, u32::saturating_add),
                instances: seen.len(),
            });
        }
    }
    out
}

/// Every lint of service `service` whose policy is `policy`: its own lints, then the
/// four that need its environment (`environment`: every service's policy by name, as
/// stored or as a plan would make it) and its connected agents' reports, at `now`.
pub fn advise(
    service: &str,
    policy: &Policy,
    environment: &BTreeMap<String, Policy>,
    agents: &[AgentRow],
    now: Timestamp,
) -> Vec<Lint> {
    let mut out = lint(policy);
    out.extend(retries_on_several_layers(service, policy, environment));
    out.extend(bulkhead_lints(policy, agents));
    out.extend(readiness_on_non_critical(policy));
    out.extend(fallback_longer_than_alert(policy, agents, now));
    out
}

/// The policy of every service of `env`, by name, as stored.
///
/// # Errors
/// The store's, or a stored policy that no longer decodes.
pub async fn environment(store: &Reader, env: &str) -> anyhow::Result<BTreeMap<String, Policy>> {
    let mut out = BTreeMap::new();
    for row in store.services(env).await? {
        out.insert(row.name, serde_json::from_str(&row.policy)?);
    }
    Ok(out)
}

/// [`advise`] on `service` of `env` with `policy` (its current one, or one about to be
/// written), the environment and the agents as stored now.
///
/// # Errors
/// The store's.
pub async fn for_service(
    store: &Reader,
    env: &str,
    service: &str,
    policy: &Policy,
) -> anyhow::Result<Vec<Lint>> {
    let mut environment = environment(store, env).await?;
    environment.insert(service.to_string(), policy.clone());
    let agents = store.agents(env, service).await?;
    Ok(advise(service, policy, &environment, &agents, Timestamp::now()))
}

/// What a write answers about the policy it made: [`advise`] without the agents' reports
/// — the policy's own lints and those of its environment. The lints from reports
/// (`bulkhead_far_from_littles_law`, `fallback_longer_than_alert`) describe the fleet, not
/// the write, and cost a read of every agent row of the service (~1 s at 10,000 agents,
/// `levee-bench propagation`); they are on the service view and `/lint` ([`for_service`]).
///
/// # Errors
/// The store's.
pub async fn for_write(
    store: &Reader,
    env: &str,
    service: &str,
    policy: &Policy,
) -> anyhow::Result<Vec<Lint>> {
    let mut environment = environment(store, env).await?;
    environment.insert(service.to_string(), policy.clone());
    Ok(advise(service, policy, &environment, &[], Timestamp::now()))
}

fn fmt(d: Duration) -> String {
    levee_agent::policy::duration::format(d)
}

/// The most attempts a dependency's calls may make: its own retry or any operation's.
fn attempts(dep: &DependencyPolicy) -> u32 {
    dep.operations
        .values()
        .filter_map(|o| o.retry.as_ref())
        .map(|r| r.max_attempts)
        .chain([dep.retry.max_attempts])
        .max()
        .unwrap_or(1)
}

/// The dependencies of `policy` that retry, with their attempts.
fn retrying(policy: &Policy) -> Vec<(&str, u32)> {
    policy.dependencies.iter().map(|(n, d)| (n.as_str(), attempts(d))).filter(|(_, a)| *a > 1).collect()
}

fn list(items: &[(&str, u32)]) -> String {
    items.iter().map(|(n, a)| format!("{n} ({a} attempts)")).collect::<Vec<_>>().join(", ")
}

/// Retries on two consecutive links of a chain, seen from both ends: this service retries
/// a dependency that is a service of the environment which retries its own dependencies
/// (the warning is on this service's retry of it); and services of the environment retry
/// their calls to this one while it retries its dependencies (the warning is on its own
/// retries). A service that names itself is no chain.
fn retries_on_several_layers(
    service: &str,
    policy: &Policy,
    environment: &BTreeMap<String, Policy>,
) -> Vec<Lint> {
    let mut out = Vec::new();
    for (name, dep) in &policy.dependencies {
        let outer = attempts(dep);
        let Some(callee) = environment.get(name).filter(|_| name != service) else { continue };
        let inner = retrying(callee);
        if outer <= 1 || inner.is_empty() {
            continue;
        }
        let worst = inner.iter().map(|(_, a)| outer * a).max().unwrap_or(outer);
        out.push(Lint {
            path: format!("dependencies.{name}.retry"),
            code: "retries_on_several_layers",
            message: format!(
                "{service} retries {name} ({outer} attempts) and {name} retries its own dependencies too: {}; \
                 one failure deep in the chain can cost up to {worst} calls. Retry on one layer of a chain \
                 (usually the outermost, which knows the budget) and set max_attempts: 1 on the others",
                list(&inner)
            ),
        });
    }
    let own = retrying(policy);
    if own.is_empty() {
        return out;
    }
    let callers: Vec<(&str, u32)> = environment
        .iter()
        .filter(|(caller, _)| caller.as_str() != service)
        .filter_map(|(caller, p)| Some((caller.as_str(), attempts(p.dependencies.get(service)?))))
        .filter(|(_, a)| *a > 1)
        .collect();
    if callers.is_empty() {
        return out;
    }
    for (name, a) in &own {
        out.push(Lint {
            path: format!("dependencies.{name}.retry"),
            code: "retries_on_several_layers",
            message: format!(
                "{service} retries {name} ({a} attempts) while its callers retry {service} too: {}; the \
                 attempts multiply down the chain. Retry on one layer of a chain and set max_attempts: 1 \
                 on the others",
                list(&callers)
            ),
        });
    }
    out
}

/// A bulkhead far from the Little's-law size its busiest connected instance suggests:
/// smaller than it (healthy peaks are refused), or more than
/// [`BULKHEAD_TOO_LARGE_FACTOR`] times it (it no longer isolates).
fn bulkhead_lints(policy: &Policy, agents: &[AgentRow]) -> Vec<Lint> {
    let mut out = Vec::new();
    for b in bulkheads(policy, agents) {
        let Some(suggested) = b.suggested_size else { continue };
        let path = match &b.operation {
            None => format!("dependencies.{}.bulkhead.max_concurrent", b.dependency),
            Some(op) => format!("dependencies.{}.operations.{op}.bulkhead.max_concurrent", b.dependency),
        };
        let size = f64::from(b.max_concurrent);
        let why = if b.max_concurrent < suggested {
            "smaller: it refuses healthy traffic at peaks"
        } else if size > BULKHEAD_TOO_LARGE_FACTOR * f64::from(suggested) {
            "far larger: a slow dependency still ties up that many callers, so it isolates little"
        } else {
            continue;
        };
        out.push(Lint {
            path,
            code: "bulkhead_far_from_littles_law",
            message: format!(
                "max_concurrent is {} but Little's law for the observed traffic suggests {suggested} \
                 (arrival rate × normal latency × 2, busiest of {} connected instance{}); the bulkhead is {why}",
                b.max_concurrent,
                b.instances,
                if b.instances == 1 { "" } else { "s" }
            ),
        });
    }
    out
}

/// Why the policy says the service can answer without `dep`, if it does.
fn expendable(policy: &Policy, name: &str, dep: &DependencyPolicy) -> Option<String> {
    if dep.fallback != FallbackLevel::FeatureError {
        return Some(format!("its fallback serves {:?} answers", dep.fallback.as_str()));
    }
    if let Some(flag) = &dep.enabled_flag {
        return Some(format!(
            "it has a kill switch ({flag}), and switching it off would take every instance out of rotation"
        ));
    }
    let rows: Vec<_> =
        policy.degradation_matrix.iter().filter(|r| r.dependencies.iter().any(|d| d == name)).collect();
    if !rows.is_empty() && rows.iter().all(|r| r.on_failure != FallbackLevel::FeatureError) {
        let features = rows.iter().map(|r| r.feature.as_str()).collect::<Vec<_>>().join(", ");
        return Some(format!("every feature that needs it degrades without it ({features})"));
    }
    None
}

/// A dependency marked `critical` — so the service reports not ready while it is switched
/// off or its breaker is open — that the policy itself says the service can do without.
fn readiness_on_non_critical(policy: &Policy) -> Vec<Lint> {
    policy
        .dependencies
        .iter()
        .filter(|(_, d)| d.criticality == DependencyCriticality::Critical)
        .filter_map(|(name, dep)| {
            let why = expendable(policy, name, dep)?;
            Some(Lint {
                path: format!("dependencies.{name}.criticality"),
                code: "readiness_on_non_critical",
                message: format!(
                    "{name} is critical, so the readiness of every instance depends on it, yet the service can \
                     answer without it: {why}. When it fails the load balancer removes the whole service \
                     instead of letting it degrade; mark it non_critical"
                ),
            })
        })
        .collect()
}

/// A degradation-matrix feature living on its fallback, on connected instances, for longer
/// than its row's `alert_after`.
#[derive(Clone, Debug, PartialEq)]
pub struct PastAlert {
    /// Index of the matrix row.
    pub row: usize,
    /// The feature, as its row names it.
    pub feature: String,
    /// Level of the oldest period (`GENERIC`, …).
    pub level: String,
    /// When the oldest period on a connected instance began.
    pub since: Timestamp,
    /// How long that is, at the time asked.
    pub lived: Duration,
    /// The row's threshold.
    pub alert_after: Duration,
    /// Connected instances past the threshold.
    pub instances_over: usize,
    /// Connected instances reporting.
    pub instances: usize,
}

/// Every matrix feature on its fallback past its row's `alert_after` at `now`, from the
/// connected agents' reports: the one statement of that rule (the lint, the pages'
/// banners, the server metric and the webhook all read it).
pub fn features_past_alert(policy: &Policy, agents: &[AgentRow], now: Timestamp) -> Vec<PastAlert> {
    let reports = reports(agents);
    let mut out = Vec::new();
    for (i, row) in policy.degradation_matrix.iter().enumerate() {
        let since: Vec<(Timestamp, &str)> = reports
            .iter()
            .flat_map(|r| &r.features)
            .filter(|f| f.feature == row.feature && f.level != FallbackLevel::Fresh.as_str())
            .filter_map(|f| Some((f.degraded_since?, f.level.as_str())))
            .collect();
        let Some((oldest, level)) = since.iter().min_by_key(|(t, _)| *t).copied() else { continue };
        let lived = Duration::from_millis(u64::try_from(now.unix_ms() - oldest.unix_ms()).unwrap_or(0));
        if lived <= row.alert_after {
            continue;
        }
        let over = since
            .iter()
            .filter(|(t, _)| now.unix_ms() - t.unix_ms() > row.alert_after.as_millis() as i64)
            .count();
        out.push(PastAlert {
            row: i,
            feature: row.feature.clone(),
            level: level.to_string(),
            since: oldest,
            lived,
            alert_after: row.alert_after,
            instances_over: over,
            instances: reports.len(),
        });
    }
    out
}

/// A feature living on its fallback, on a connected instance, for longer than its matrix
/// row's `alert_after`.
fn fallback_longer_than_alert(policy: &Policy, agents: &[AgentRow], now: Timestamp) -> Vec<Lint> {
    features_past_alert(policy, agents, now)
        .into_iter()
        .map(|p| {
            let row = &policy.degradation_matrix[p.row];
            Lint {
                path: format!("degradation_matrix[{}].alert_after", p.row),
                code: "fallback_longer_than_alert",
                message: format!(
                    "feature {} has lived on its fallback ({}) since {}, for {} ({} of {} connected \
                     instance{} past the threshold), longer than its alert_after ({}): a fallback nobody acts on is \
                     a silent outage; fix {} or decide with {} that this is the new normal",
                    row.feature,
                    p.level,
                    p.since,
                    fmt(Duration::from_secs(p.lived.as_secs())),
                    p.instances_over,
                    p.instances,
                    if p.instances == 1 { "" } else { "s" },
                    fmt(row.alert_after),
                    row.dependencies.join(", "),
                    if row.owner.is_empty() { "the feature's owner" } else { &row.owner }
                ),
            }
        })
        .collect()
}

#[cfg(test)]
mod tests;

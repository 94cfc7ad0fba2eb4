//! "What is on fire, at a glance": what is abnormal right now in a page's scope, shown at
//! the top of the overview, an environment and a service, each with a link to where to act.
//!
//! Abnormal means: a kill switch off; a breaker forced by an operator or open on an agent;
//! a dependency served by its fallback or a matrix feature on one (past its `alert_after`:
//! highlighted); an active fault rule; an active emergency profile ([`Alarms::push`] is the
//! slot for them); agents disconnected or NACKing; a revision not applied by every
//! connected agent, or delivered to none.

use std::collections::{BTreeMap, BTreeSet};

use levee_agent::policy::{FlagType, ServiceConfig, Timestamp};

use super::fleet::AgentReport;
use super::page::{seg, service_url};
use super::service::state_label;
use crate::advice::features_past_alert;
use crate::db::{AgentRow, NackRow};
use crate::web::AppState;

/// How bad an alarm is (its CSS class).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Severity {
    /// Something is off or failing now: `bad`.
    Bad,
    /// Not as configured or not yet everywhere: `warn`.
    Warn,
}

/// One abnormal thing, in words, with where to act.
#[derive(Clone, Debug)]
pub struct Alarm {
    /// `bad` or `warn`.
    pub severity: Severity,
    /// What is abnormal (plain text; the template escapes it).
    pub text: String,
    /// Where to act (a local path with an anchor).
    pub href: String,
    /// Text of the link.
    pub action: &'static str,
}

impl Alarm {
    /// The CSS class of its severity.
    pub fn class(&self) -> &'static str {
        match self.severity {
            Severity::Bad => "bad",
            Severity::Warn => "warn",
        }
    }
}

/// The alarms of one scope, worst first.
#[derive(Clone, Debug, Default)]
pub struct Alarms {
    /// The alarms.
    pub list: Vec<Alarm>,
}

impl Alarms {
    /// Adds an alarm. The slot for what other parts of the console know is abnormal
    /// (an active emergency profile: its name, who applied it, until when).
    pub fn push(&mut self, severity: Severity, text: String, href: String, action: &'static str) {
        self.list.push(Alarm { severity, text, href, action });
    }

    /// Adds every alarm of `other`, each text prefixed with `prefix` (a service name).
    pub fn extend_prefixed(&mut self, prefix: &str, other: Alarms) {
        for mut a in other.list {
            a.text = format!("{prefix}: {}", a.text);
            self.list.push(a);
        }
    }

    /// Sorts worst first (stable: the order of discovery within a severity).
    pub fn sorted(mut self) -> Alarms {
        self.list.sort_by_key(|a| a.severity);
        self
    }

    /// Whether nothing is abnormal.
    pub fn is_empty(&self) -> bool {
        self.list.is_empty()
    }
}

/// `n thing` or `n things`.
fn count(n: usize, thing: &str) -> String {
    if n == 1 { format!("1 {thing}") } else { format!("{n} {thing}s") }
}

/// What is abnormal in one service now: its stored configuration (`cfg` at `revision`),
/// its agents (connected and recently disconnected) and their NACKs.
pub fn for_service(
    env: &str,
    svc: &str,
    cfg: &ServiceConfig,
    revision: u64,
    agents: &[AgentRow],
    nacks: &[NackRow],
    now: Timestamp,
) -> Alarms {
    let base = service_url(env, svc);
    let mut out = Alarms::default();

    // Kill switches off, or naming no usable flag.
    for r in cfg.policy.flag_references() {
        let href = format!("{base}#flag-{}", seg(r.key));
        match cfg.flags.get(r.key) {
            Some(f) if f.kind == FlagType::Bool && f.value.as_bool() == Some(true) => {}
            Some(f) if f.kind == FlagType::Bool => out.push(
                Severity::Bad,
                format!("kill switch {} is OFF: {} is switched off", r.key, r.switches),
                href,
                "turn it on",
            ),
            None if cfg.policy.compiled_in_flags.contains(r.key) => {}
            _ => out.push(
                Severity::Bad,
                format!("kill switch {} of {} names no bool flag: it does nothing", r.key, r.switches),
                format!("{base}#problems"),
                "see the problem",
            ),
        }
    }

    // Breakers forced by an operator.
    for o in &cfg.breaker_overrides {
        let what = match &o.operation {
            Some(op) => format!("{} {op}", o.dependency),
            None => o.dependency.clone(),
        };
        let until = o.expires_at.map(|t| format!(" until {t}")).unwrap_or_else(|| " with no expiry".into());
        let why = if o.reason.is_empty() { String::new() } else { format!(" ({})", o.reason) };
        out.push(
            Severity::Warn,
            format!("breaker of {what} forced {}{until}{why}", state_label(o.state)),
            format!("{base}#overrides"),
            "remove the override",
        );
    }

    // Fault rules (game days).
    for f in cfg.faults.iter().filter(|f| f.expires_at > now) {
        let what = match &f.operation {
            Some(op) => format!("{} {op}", f.dependency),
            None => f.dependency.clone(),
        };
        let on = if cfg.faults_allowed { "" } else { " (ignored: this environment does not allow faults)" };
        out.push(
            Severity::Warn,
            format!(
                "fault rule {} injects into {}% of calls to {what} until {}{on}",
                f.id, f.percent, f.expires_at
            ),
            format!("{base}#faults"),
            "see the fault rules",
        );
    }

    // What the connected agents report.
    let live: Vec<&AgentRow> = agents.iter().filter(|a| a.connected).collect();
    let mut open: BTreeMap<String, usize> = BTreeMap::new();
    let mut fallbacks: BTreeMap<String, (String, String, usize)> = BTreeMap::new();
    let mut features: BTreeMap<String, (String, String, usize)> = BTreeMap::new();
    for a in &live {
        let r = AgentReport::of(a);
        for b in r.open_breakers {
            *open.entry(b).or_default() += 1;
        }
        for (dep, level, since) in r.fallbacks {
            let e = fallbacks.entry(dep).or_insert((level, since.clone(), 0));
            e.2 += 1;
            if !since.is_empty() && (e.1.is_empty() || since < e.1) {
                e.1 = since;
            }
        }
        for (feature, level, since) in r.degraded_since {
            let e = features.entry(feature).or_insert((level, since.clone(), 0));
            e.2 += 1;
            if !since.is_empty() && (e.1.is_empty() || since < e.1) {
                e.1 = since;
            }
        }
    }
    let n = live.len();
    for (b, k) in open {
        out.push(
            Severity::Bad,
            format!("breaker {b} is OPEN on {k} of {n} connected agents"),
            format!("{base}#agents"),
            "see the agents",
        );
    }
    for (dep, (level, since, k)) in fallbacks {
        let since = if since.is_empty() { String::new() } else { format!(" since {since}") };
        out.push(
            Severity::Warn,
            format!(
                "dependency {dep} is served by its fallback ({level}){since} on {k} of {n} connected agents"
            ),
            format!("{base}#agents"),
            "see the agents",
        );
    }
    let past: BTreeMap<String, _> =
        features_past_alert(&cfg.policy, agents, now).into_iter().map(|p| (p.feature.clone(), p)).collect();
    for (feature, (level, since, k)) in features {
        let since_text = if since.is_empty() { String::new() } else { format!(" since {since}") };
        match past.get(&feature) {
            Some(p) => out.push(
                Severity::Bad,
                format!(
                    "feature {feature} has been on its fallback ({level}){since_text} on {k} of {n} connected agents, \
                     longer than its alert_after ({})",
                    levee_agent::policy::duration::format(p.alert_after)
                ),
                format!("{base}#matrix"),
                "see the degradation matrix",
            ),
            None if cfg.policy.degradation_matrix.iter().any(|r| r.feature == feature) => out.push(
                Severity::Warn,
                format!("feature {feature} is on its fallback ({level}){since_text} on {k} of {n} connected agents"),
                format!("{base}#matrix"),
                "see the degradation matrix",
            ),
            // Reported by agents from the matrix compiled into the service: the policy has no
            // row to point at (the page would say "no degradation matrix" right below).
            None => out.push(
                Severity::Warn,
                format!(
                    "feature {feature} is on its fallback ({level}){since_text} on {k} of {n} connected agents \
                     (from the service's compiled-in matrix; the policy has no row for it)"
                ),
                format!("{base}#agents"),
                "see the agents",
            ),
        }
    }

    // Agents: disconnected, NACKing, behind.
    let gone = agents.iter().filter(|a| !a.connected).count();
    if gone > 0 {
        out.push(
            Severity::Warn,
            format!("{} disconnected (listed until they age out)", count(gone, "agent")),
            format!("{base}#agents"),
            "see the agents",
        );
    }
    let nacked: BTreeSet<&str> =
        nacks.iter().filter(|x| x.revision == revision).map(|x| x.instance_id.as_str()).collect();
    if let Some(first) = nacks.iter().find(|x| x.revision == revision) {
        out.push(
            Severity::Bad,
            format!(
                "{} rejected revision {revision}, e.g. {}: {}",
                count(nacked.len(), "agent"),
                first.instance_id,
                first.error_detail
            ),
            format!("{base}#nacks"),
            "see the NACKs",
        );
    }
    let applied = live.iter().filter(|a| a.applied_revision >= revision).count();
    if n == 0 {
        out.push(
            Severity::Warn,
            format!("revision {revision} is delivered to no agent: none is connected"),
            format!("{base}#agents"),
            "see the agents",
        );
    } else if applied < n {
        out.push(
            Severity::Warn,
            format!("revision {revision} is applied by only {applied} of {n} connected agents"),
            format!("{base}#propagation"),
            "follow the propagation",
        );
    }
    out.sorted()
}

/// What is abnormal in every service of `env`, each alarm prefixed with its service.
///
/// # Errors
/// The database failed.
pub async fn for_environment(s: &AppState, env: &str, now: Timestamp) -> anyhow::Result<Alarms> {
    let mut out = Alarms::default();
    for r in s.store.services(env).await? {
        let Some(snap) = s.store.latest_snapshot(env, &r.name).await? else { continue };
        let Ok(cfg) = serde_json::from_str::<ServiceConfig>(&snap.body) else { continue };
        let agents = s.store.agents(env, &r.name).await?;
        let nacks = s.store.nacks(env, &r.name).await?;
        out.extend_prefixed(&r.name, for_service(env, &r.name, &cfg, r.revision, &agents, &nacks, now));
    }
    Ok(out.sorted())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn agent(id: &str, connected: bool, rev: u64, status: serde_json::Value) -> AgentRow {
        AgentRow {
            environment: "prod".into(),
            service: "checkout".into(),
            instance_id: id.into(),
            agent_version: "0.1.0".into(),
            connected,
            connected_at: 1,
            last_seen: 1,
            applied_revision: rev,
            applied_hash: String::new(),
            source: if connected { "live".into() } else { "disconnected".into() },
            status: Some(status),
        }
    }

    fn config() -> ServiceConfig {
        serde_json::from_value(serde_json::json!({
            "policy": {
                "dependencies": {"recommendations": {"criticality": "non_critical",
                    "enabled_flag": "recommendations.enabled", "fallback": "generic"}},
                "degradation_matrix": [{"feature": "cart", "dependencies": ["recommendations"],
                    "on_failure": "generic", "alert_after": "5m"}]
            },
            "flags": {"recommendations.enabled": {"type": "bool", "value": false}},
            "breaker_overrides": [{"dependency": "recommendations", "state": "forced_open", "reason": "incident 42"}]
        }))
        .unwrap()
    }

    #[test]
    fn a_quiet_service_has_no_alarm_and_a_burning_one_says_everything() {
        let now = Timestamp::from_unix_ms(1_800_000_000_000);
        let quiet: ServiceConfig = serde_json::from_value(serde_json::json!({})).unwrap();
        let ok = [agent("web-1", true, 3, serde_json::json!({}))];
        assert!(for_service("prod", "checkout", &quiet, 3, &ok, &[], now).is_empty());

        let an_hour_ago = Timestamp::from_unix_ms(now.unix_ms() - 3_600_000).to_rfc3339();
        let agents = [
            agent(
                "web-1",
                true,
                3,
                serde_json::json!({
                    "breakers": [{"dependency": "payments", "state": "OPEN"}],
                    "fallbacks": [{"dependency": "recommendations", "level": "GENERIC", "since": an_hour_ago}],
                    "features": [{"feature": "cart", "level": "GENERIC", "degraded_since": an_hour_ago}]}),
            ),
            agent("web-2", true, 2, serde_json::json!({})),
            agent("web-3", false, 3, serde_json::json!({})),
        ];
        let nacks = [NackRow {
            environment: "prod".into(),
            service: "checkout".into(),
            instance_id: "web-2".into(),
            revision: 3,
            error_detail: "bad <b>".into(),
            at: 1,
        }];
        let a = for_service("prod", "checkout", &config(), 3, &agents, &nacks, now);
        let texts: Vec<(&str, &str)> = a.list.iter().map(|a| (a.class(), a.text.as_str())).collect();
        let has = |class: &str, needle: &str| texts.iter().any(|(c, t)| *c == class && t.contains(needle));
        assert!(has("bad", "kill switch recommendations.enabled is OFF"), "{texts:#?}");
        assert!(
            has("warn", "breaker of recommendations forced FORCED_OPEN with no expiry (incident 42)"),
            "{texts:#?}"
        );
        assert!(has("bad", "breaker payments is OPEN on 1 of 2 connected agents"), "{texts:#?}");
        assert!(has("warn", "dependency recommendations is served by its fallback (GENERIC)"), "{texts:#?}");
        assert!(has("bad", "feature cart has been on its fallback (GENERIC)"), "{texts:#?}");
        assert!(has("bad", "1 agent rejected revision 3, e.g. web-2: bad <b>"), "{texts:#?}");
        assert!(has("warn", "1 agent disconnected"), "{texts:#?}");
        assert!(has("warn", "revision 3 is applied by only 1 of 2 connected agents"), "{texts:#?}");
        assert!(a.list.windows(2).all(|w| w[0].severity <= w[1].severity), "worst first");
        assert!(a.list[0].href.starts_with("/ui/environments/prod/services/checkout#"));

        // No agent at all: a warning, never a success.
        let a = for_service("prod", "checkout", &quiet, 3, &[], &[], now);
        assert_eq!(a.list.len(), 1);
        assert_eq!(a.list[0].class(), "warn");
        assert!(a.list[0].text.contains("delivered to no agent"));
    }

    /// Found by a newcomer: a feature reported on its fallback pointed to "the degradation
    /// matrix" while the same page said the policy had none (the feature came from the
    /// matrix compiled into the service).
    #[test]
    fn a_feature_the_policy_has_no_row_for_points_to_the_agents_not_the_matrix() {
        let now = Timestamp::from_unix_ms(1_800_000_000_000);
        let agents = [agent(
            "web-1",
            true,
            3,
            serde_json::json!({"features": [{"feature": "Personal recommendations", "level": "GENERIC",
                "degraded_since": Timestamp::from_unix_ms(now.unix_ms() - 60_000).to_rfc3339()}]}),
        )];
        let a = for_service("prod", "checkout", &config(), 3, &agents, &[], now);
        let row =
            a.list.iter().find(|a| a.text.contains("feature Personal recommendations")).expect("listed");
        assert!(row.text.contains("compiled-in matrix"), "{}", row.text);
        assert!(row.href.ends_with("#agents"), "{}", row.href);
    }
}

//! "What is on fire, at a glance": what is abnormal right now in a page's scope, shown at
//! the top of the overview, an environment and a service, each with a link to where it is
//! and the levers that apply, straight to their confirmation page (a reason and one more
//! click make the change).
//!
//! Abnormal means: a kill switch off; a breaker forced by an operator or open on an agent;
//! a dependency served by its fallback or a matrix feature on one (past its `alert_after`:
//! highlighted); an active fault rule; an active emergency profile; agents lost (a
//! disconnected agent a newer one replaced is not) or NACKing; a revision not applied by
//! every connected agent, or delivered to none.
//!
//! What follows from an operator's own lever is said once, with the lever: a dependency
//! switched off is served by its fallback and its breaker, which sees no call, keeps the
//! state it had (an OPEN breaker there is frozen, not news); a breaker forced open reads
//! FORCED_OPEN on every agent.

use std::collections::{BTreeMap, BTreeSet};

use levee_agent::breaker::State;
use levee_agent::policy::{BreakerOverrideState, FlagType, Timestamp};

use super::fleet::AgentReport;
use super::page::{When, percent, seg, service_url, time};
use super::service::state_label;
use super::status::ServiceFacts;
use crate::actions::ProfileSpec;
use crate::advice::features_past_alert;
use crate::health::SubjectKind;
use crate::web::AppState;

/// How long a breaker forced open from an alarm's lever lasts, as the confirmation page
/// proposes it (the operator may change it there).
pub const LEVER_OVERRIDE_FOR: &str = "1h";
/// How long a profile applied from an alarm's lever lasts, as proposed.
pub const LEVER_PROFILE_FOR: &str = "1h";

/// How bad an alarm is (its CSS class).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize)]
pub enum Severity {
    /// Something is off or failing now: `bad`.
    Bad,
    /// Not as configured or not yet everywhere: `warn`.
    Warn,
}

/// A change that may stop what an alarm reports: a link to its confirmation page, which
/// changes nothing until confirmed with a reason.
#[derive(Clone, Debug, PartialEq, Eq, Hash, serde::Serialize)]
pub struct Lever {
    /// What it does, e.g. `switch recommendations off`.
    pub label: String,
    /// The confirmation page (a local path with its query).
    pub href: String,
}

/// One abnormal thing, in words, with where to look and what to pull.
#[derive(Clone, Debug, PartialEq, Eq, Hash, serde::Serialize)]
pub struct Alarm {
    /// `bad` or `warn`.
    pub severity: Severity,
    /// What is abnormal (plain text; the template escapes it).
    pub text: String,
    /// Where to look (a local path with an anchor).
    pub href: String,
    /// Text of the link.
    pub action: &'static str,
    /// Changes that apply, for those whose role allows them.
    pub levers: Vec<Lever>,
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

/// Fewest calls of a dependency (or requests of a route) in [`RECENT_HEALTH`](super::status::RECENT_HEALTH) for their
/// outcomes to raise an alarm: below it, one failure would read as a large share.
pub const HEALTH_MIN_CALLS: u64 = 20;
/// Share of the calls that reached a dependency (or requests a route served) that failed
/// or timed out from which it is an alarm: a warning, and bad from [`HEALTH_BAD_SHARE`].
pub const HEALTH_WARN_SHARE: f64 = 0.05;
/// See [`HEALTH_WARN_SHARE`].
pub const HEALTH_BAD_SHARE: f64 = 0.25;

/// What the agents' health windows say is failing now: a dependency whose calls, or a
/// route whose requests, failed or timed out in at least [`HEALTH_WARN_SHARE`] of
/// [`HEALTH_MIN_CALLS`] or more in [`RECENT_HEALTH`](super::status::RECENT_HEALTH); a route whose requests admission
/// refused as often (load shedding protects the service, but callers see it). Calls
/// refused on the agents' machines (kill switch, open breaker) are not failures: their
/// own alarms say why.
fn health_alarms(f: &ServiceFacts, base: &str, out: &mut Alarms) {
    let minute = "in the last minute";
    for ((kind, name), t) in &f.health {
        let reached = t.successes + t.failures + t.timeouts;
        let failing = t.error_rate();
        if reached >= HEALTH_MIN_CALLS && failing >= HEALTH_WARN_SHARE {
            let severity = if failing >= HEALTH_BAD_SHARE { Severity::Bad } else { Severity::Warn };
            let (what, unit, levers) = match kind {
                SubjectKind::Dependency => ("dependency", "calls", dependency_levers(f, name)),
                SubjectKind::Route => ("route", "requests", Vec::new()),
            };
            out.push_with(
                severity,
                format!(
                    "{what} {name}: {} of {reached} {unit} failed or timed out {minute} ({} failed, {} timed out)",
                    percent(failing),
                    t.failures,
                    t.timeouts
                ),
                format!("{base}#health"),
                "see its health",
                levers,
            );
        }
        if *kind == SubjectKind::Route && t.calls >= HEALTH_MIN_CALLS && t.shed_rate() >= HEALTH_WARN_SHARE {
            out.push(
                Severity::Warn,
                format!(
                    "route {name}: admission refused {} of {} requests {minute} (load shedding)",
                    percent(t.shed_rate()),
                    t.calls
                ),
                format!("{base}#health"),
                "see its health",
            );
        }
    }
}

/// The alarms of one scope, worst first.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, serde::Serialize)]
pub struct Alarms {
    /// The alarms.
    pub list: Vec<Alarm>,
}

impl Alarms {
    /// Adds an alarm without levers.
    pub fn push(&mut self, severity: Severity, text: String, href: String, action: &'static str) {
        self.list.push(Alarm { severity, text, href, action, levers: Vec::new() });
    }

    /// Adds an alarm with the levers that apply.
    pub fn push_with(
        &mut self,
        severity: Severity,
        text: String,
        href: String,
        action: &'static str,
        levers: Vec<Lever>,
    ) {
        self.list.push(Alarm { severity, text, href, action, levers });
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

/// `path?query` with the query's values encoded.
fn with_query(path: String, query: &[(&str, &str)]) -> String {
    match serde_urlencoded::to_string(query) {
        Ok(q) if !q.is_empty() => format!("{path}?{q}"),
        _ => path,
    }
}

/// The lever setting bool flag `key` to `on`.
fn flag_lever(f: &ServiceFacts, key: &str, on: bool, label: String) -> Lever {
    let rev = f.row.revision.to_string();
    let path = format!("{}/flags/{}/confirm", service_url(&f.env, &f.svc), seg(key));
    Lever {
        label,
        href: with_query(path, &[("value", if on { "true" } else { "false" }), ("revision", &rev)]),
    }
}

/// The levers that stop the damage a failing dependency does: switch it off (its kill
/// switch, when it has one that is on), force its breaker open for a while (unless an
/// override already holds it), and each emergency profile that does either for it.
fn dependency_levers(f: &ServiceFacts, dep: &str) -> Vec<Lever> {
    let mut out = Vec::new();
    let d = f.cfg.policy.dependencies.get(dep);
    if let Some(key) = d.and_then(|d| d.enabled_flag.as_deref()) {
        let on = f
            .cfg
            .flags
            .get(key)
            .is_some_and(|fl| fl.kind == FlagType::Bool && fl.value.as_bool() == Some(true));
        if on {
            out.push(flag_lever(f, key, false, format!("switch {dep} off ({key})")));
        }
    }
    let overridden = f.cfg.breaker_overrides.iter().any(|o| o.dependency == dep && o.operation.is_none());
    if d.is_some() && !overridden {
        let rev = f.row.revision.to_string();
        let path = format!("{}/breakers/confirm", service_url(&f.env, &f.svc));
        out.push(Lever {
            label: format!("force the breaker of {dep} open for {LEVER_OVERRIDE_FOR}"),
            href: with_query(
                path,
                &[
                    ("dependency", dep),
                    ("state", "forced_open"),
                    ("expires_in", LEVER_OVERRIDE_FOR),
                    ("revision", &rev),
                ],
            ),
        });
    }
    for (name, spec) in &f.profiles {
        if profile_stops(spec, f, dep) {
            let path = format!("/ui/environments/{}/profiles/{}/confirm", seg(&f.env), seg(name));
            out.push(Lever {
                label: format!("apply emergency profile {name}"),
                href: with_query(path, &[("for", LEVER_PROFILE_FOR)]),
            });
        }
    }
    out
}

/// Whether profile `spec` switches dependency `dep` of the facts' service off or forces its
/// breaker open.
fn profile_stops(spec: &ProfileSpec, f: &ServiceFacts, dep: &str) -> bool {
    let Some(s) = spec.services.get(&f.svc) else { return false };
    let key = f.cfg.policy.dependencies.get(dep).and_then(|d| d.enabled_flag.as_deref());
    let switches_off =
        key.is_some_and(|k| s.flags.get(k).and_then(serde_json::Value::as_bool) == Some(false));
    let forces_open =
        s.breakers.iter().any(|b| b.dependency == dep && b.state == BreakerOverrideState::ForcedOpen);
    switches_off || forces_open
}

/// Merges per-agent (level, since) into (level, earliest since, agents).
fn tally(into: &mut BTreeMap<String, (String, String, usize)>, key: String, level: String, since: String) {
    let e = into.entry(key).or_insert((level, since.clone(), 0));
    e.2 += 1;
    if !since.is_empty() && (e.1.is_empty() || since < e.1) {
        e.1 = since;
    }
}

/// ` for 12 min (since 19:31:02 UTC)` of an RFC 3339 time reported by agents; empty when
/// it does not read.
fn since_text(since: &str, now: Timestamp) -> String {
    match Timestamp::parse(since) {
        Some(t) => {
            format!(" since {}", When::at(t.unix_ms(), now.unix_ms()))
        }
        None => String::new(),
    }
}

/// What is abnormal in one service now, with the levers that apply.
pub fn for_service(f: &ServiceFacts) -> Alarms {
    let (cfg, now, revision) = (&f.cfg, f.now, f.row.revision);
    let base = service_url(&f.env, &f.svc);
    let mut out = Alarms::default();

    // What the connected agents report.
    let live: Vec<_> = f.connected().collect();
    let reports: Vec<AgentReport> = live.iter().map(|a| AgentReport::of(a)).collect();
    let mut open: BTreeMap<String, usize> = BTreeMap::new();
    let mut fallbacks = BTreeMap::new();
    let mut features = BTreeMap::new();
    for r in &reports {
        for b in &r.breaker_states {
            if matches!(b.state, Some(State::Open | State::HalfOpen | State::ForcedOpen)) {
                let name = if b.operation.is_empty() {
                    b.dependency.clone()
                } else {
                    format!("{} {}", b.dependency, b.operation)
                };
                // Forced open by an override of the policy: the override's alarm says it.
                let forced = cfg.breaker_overrides.iter().any(|o| {
                    o.dependency == b.dependency
                        && o.operation.as_deref().unwrap_or("") == b.operation
                        && o.state == BreakerOverrideState::ForcedOpen
                });
                if !(b.state == Some(State::ForcedOpen) && forced) {
                    *open.entry(name).or_default() += 1;
                }
            }
        }
        for (dep, level, since) in r.fallbacks.clone() {
            tally(&mut fallbacks, dep, level, since);
        }
        for (feature, level, since) in r.degraded_since.clone() {
            tally(&mut features, feature, level, since);
        }
    }
    let n = live.len();

    // Kill switches off, or naming no usable flag. A dependency switched off says, with its
    // switch, what its frozen breaker does (and its fallback is what switching off means).
    // One alarm per switch, naming everything it switches.
    let mut switches: BTreeMap<&str, Vec<String>> = BTreeMap::new();
    for r in cfg.policy.flag_references() {
        switches.entry(r.key).or_default().push(r.switches);
    }
    for (key, what) in switches {
        let href = format!("{base}#flag-{}", seg(key));
        let what_text = what.join(" and ");
        match cfg.flags.get(key) {
            Some(fl) if fl.kind == FlagType::Bool && fl.value.as_bool() == Some(true) => {}
            Some(fl) if fl.kind == FlagType::Bool => {
                let mut frozen = String::new();
                for dep in what.iter().filter_map(|w| w.strip_prefix("dependency ")) {
                    if let Some(k) = open.remove(dep) {
                        frozen.push_str(&format!(
                            "; the breaker of {dep} was OPEN on {k} of {n} agents when calls stopped and stays so, \
                             frozen: no call reaches it, so whether it healed shows only once it is switched back on"
                        ));
                    }
                    fallbacks.remove(dep);
                }
                let verb = if what.len() == 1 { "is" } else { "are" };
                let lever = flag_lever(f, key, true, format!("turn {key} back on"));
                out.push_with(
                    Severity::Bad,
                    format!("kill switch {key} is OFF: {what_text} {verb} switched off{frozen}"),
                    href,
                    "see the flag",
                    vec![lever],
                );
            }
            None if cfg.policy.compiled_in_flags.contains(key) => {}
            _ => out.push(
                Severity::Bad,
                format!("kill switch {key} of {what_text} names no bool flag: it does nothing"),
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
        let until = o
            .expires_at
            .map(|t| format!(" until {}", When::at(t.unix_ms(), now.unix_ms())))
            .unwrap_or_else(|| " with no expiry".into());
        let why = if o.reason.is_empty() { String::new() } else { format!(" ({})", o.reason) };
        if o.state == BreakerOverrideState::ForcedOpen {
            fallbacks.remove(&o.dependency);
        }
        let rev = revision.to_string();
        let lever = Lever {
            label: format!("remove the override of {what}"),
            href: with_query(
                format!("{base}/breakers/remove/confirm"),
                &[
                    ("dependency", &o.dependency),
                    ("operation", o.operation.as_deref().unwrap_or("")),
                    ("revision", &rev),
                ],
            ),
        };
        out.push_with(
            Severity::Warn,
            format!("breaker of {what} forced {}{until}{why}", state_label(o.state)),
            format!("{base}#overrides"),
            "see the overrides",
            vec![lever],
        );
    }

    // Game days: that one runs, never what it injected (its fault rule is not in `cfg`).
    for g in &f.game_days {
        out.push(
            Severity::Warn,
            format!(
                "a game day is running, started by {} {}: what it injected is hidden until it ends",
                g.created_by,
                When::at(g.created_at, now.unix_ms())
            ),
            base.clone(),
            "see the service",
        );
    }

    // Fault rules.
    for fr in cfg.faults.iter().filter(|fr| fr.expires_at > now) {
        let what = match &fr.operation {
            Some(op) => format!("{} {op}", fr.dependency),
            None => fr.dependency.clone(),
        };
        let on = if cfg.faults_allowed { "" } else { " (ignored: this environment does not allow faults)" };
        out.push(
            Severity::Warn,
            format!(
                "fault rule {} injects into {}% of calls to {what} until {}{on}",
                fr.id,
                fr.percent,
                When::at(fr.expires_at.unix_ms(), now.unix_ms())
            ),
            format!("{base}#faults"),
            "see the fault rules",
        );
    }

    for (b, k) in open {
        let dep = b.split(' ').next().unwrap_or(&b).to_string();
        out.push_with(
            Severity::Bad,
            format!("breaker {b} is OPEN on {k} of {n} connected agents"),
            format!("{base}#dep-{}", seg(&dep)),
            "see the dependency",
            dependency_levers(f, &dep),
        );
    }
    for (dep, (level, since, k)) in fallbacks {
        out.push_with(
            Severity::Warn,
            format!(
                "dependency {dep} is served by its fallback ({level}){} on {k} of {n} connected agents",
                since_text(&since, now)
            ),
            format!("{base}#dep-{}", seg(&dep)),
            "see the dependency",
            dependency_levers(f, &dep),
        );
    }
    health_alarms(f, &base, &mut out);
    let past: BTreeMap<String, _> = features_past_alert(&cfg.policy, &f.agents, now)
        .into_iter()
        .map(|p| (p.feature.clone(), p))
        .collect();
    for (feature, (level, since, k)) in features {
        let since_text = since_text(&since, now);
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

    // Agents: lost (disconnected and not replaced), NACKing, behind.
    let replaced = f.replaced();
    let lost: Vec<&str> = f
        .agents
        .iter()
        .filter(|a| !a.connected && !replaced.contains_key(&a.instance_id))
        .map(|a| a.instance_id.as_str())
        .collect();
    if let Some(first) = lost.first() {
        out.push(
            Severity::Warn,
            format!(
                "{} disconnected and not replaced by a newer one (e.g. {first}; listed until it ages out an hour after it was last seen)",
                count(lost.len(), "agent")
            ),
            format!("{base}#agents"),
            "see the agents",
        );
    }
    let nacked: BTreeSet<&str> =
        f.nacks.iter().filter(|x| x.revision == revision).map(|x| x.instance_id.as_str()).collect();
    if let Some(first) = f.nacks.iter().find(|x| x.revision == revision) {
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

/// The alarm of an active emergency profile (its lever: the revert form of the profiles
/// page).
pub fn active_profile(env: &str, a: &crate::db::ActivationRow) -> Alarm {
    Alarm {
        severity: Severity::Warn,
        text: format!(
            "emergency profile {} is active: applied by {} (“{}”) until {}",
            a.profile,
            a.applied_by,
            a.reason,
            time(a.expires_at)
        ),
        href: format!("/ui/environments/{}/profiles#active", seg(env)),
        action: "see the profile",
        levers: vec![Lever {
            label: format!("revert {}", a.profile),
            href: format!("/ui/environments/{}/profiles#active", seg(env)),
        }],
    }
}

/// What is abnormal in every service of `env`, each alarm prefixed with its service, and
/// the active emergency profile.
///
/// # Errors
/// The database failed.
pub async fn for_environment(s: &AppState, env: &str) -> Result<Alarms, super::error::UiError> {
    let mut out = Alarms::default();
    let context = ServiceFacts::context(s, env).await?;
    if let Some(a) = &context.active {
        out.list.push(active_profile(env, a));
    }
    for r in s.store.services(env).await? {
        match ServiceFacts::load_in(s, &context, env, &r.name).await {
            Ok(facts) => out.extend_prefixed(&r.name, for_service(&facts)),
            // Deleted meanwhile.
            Err(super::error::UiError::NotFound(_)) => {}
            Err(super::error::UiError::Unreadable(u)) => out.push(
                Severity::Bad,
                format!("{}: revision {} cannot be read by this server ({})", r.name, u.revision, u.reason),
                format!("{}/history", service_url(env, &r.name)),
                "roll back",
            ),
            Err(e @ super::error::UiError::Internal(_)) => return Err(e),
            Err(e) => out.push(
                Severity::Bad,
                format!("{}: its current revision cannot be shown: {e}", r.name),
                service_url(env, &r.name),
                "see the service",
            ),
        }
    }
    Ok(out.sorted())
}

#[cfg(test)]
mod tests {
    use levee_agent::policy::ServiceConfig;

    use super::*;
    use crate::db::{AgentRow, NackRow};
    use crate::ui::status::facts_for_test;

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

    fn config(json: serde_json::Value) -> ServiceConfig {
        serde_json::from_value(json).unwrap()
    }

    fn burning() -> ServiceConfig {
        config(serde_json::json!({
            "policy": {
                "dependencies": {
                    "recommendations": {"criticality": "non_critical",
                        "enabled_flag": "recommendations.enabled", "fallback": "generic"},
                    "payments": {}},
                "degradation_matrix": [{"feature": "cart", "dependencies": ["recommendations"],
                    "on_failure": "generic", "alert_after": "5m"}]
            },
            "flags": {"recommendations.enabled": {"type": "bool", "value": false}},
            "breaker_overrides": [{"dependency": "recommendations", "state": "forced_open", "reason": "incident 42"}]
        }))
    }

    fn texts(a: &Alarms) -> Vec<(&'static str, String)> {
        a.list.iter().map(|a| (a.class(), a.text.clone())).collect()
    }

    fn totals(successes: u64, failures: u64, timeouts: u64, shed: u64) -> crate::health::HealthTotals {
        crate::health::HealthTotals {
            calls: successes + failures + timeouts + shed,
            successes,
            failures,
            timeouts,
            shed,
            ..Default::default()
        }
    }

    /// Failing calls raise an alarm from 5 % of 20 or more (bad from 25 %); refusals on the
    /// agents' machines do not (their own alarms say why), except a route's admission
    /// refusals, which callers see.
    #[test]
    fn the_agents_health_raises_alarms_past_its_thresholds() {
        let connected = vec![agent("web-1", true, 3, serde_json::json!({}))];
        let mut f = facts_for_test(config(serde_json::json!({})), 3, connected, Vec::new());
        let dep = |n: &str| (SubjectKind::Dependency, n.to_string());
        let route = |n: &str| (SubjectKind::Route, n.to_string());
        f.health = BTreeMap::from([
            (dep("few"), totals(10, 9, 0, 0)),
            (dep("fine"), totals(96, 4, 0, 0)),
            (dep("flaky"), totals(95, 3, 2, 0)),
            (dep("down"), totals(30, 5, 5, 0)),
            (dep("switched-off"), totals(0, 0, 0, 500)),
            (route("GET /a"), totals(90, 0, 0, 10)),
            (route("GET /b"), totals(20, 0, 0, 1)),
        ]);
        assert_eq!(
            texts(&for_service(&f)),
            vec![
                ("bad", "dependency down: 25% of 40 calls failed or timed out in the last minute (5 failed, 5 timed out)".into()),
                ("warn", "dependency flaky: 5% of 100 calls failed or timed out in the last minute (3 failed, 2 timed out)".into()),
                ("warn", "route GET /a: admission refused 10% of 100 requests in the last minute (load shedding)".into()),
            ]
        );
    }

    #[test]
    fn a_quiet_service_has_no_alarm_and_a_burning_one_says_everything_once() {
        let quiet = config(serde_json::json!({}));
        let ok = vec![agent("web-1", true, 3, serde_json::json!({}))];
        assert!(for_service(&facts_for_test(quiet.clone(), 3, ok, Vec::new())).is_empty());

        let now = Timestamp::from_unix_ms(1_800_000_000_000);
        let an_hour_ago = Timestamp::from_unix_ms(now.unix_ms() - 3_600_000).to_rfc3339();
        let agents = vec![
            agent(
                "web-1",
                true,
                3,
                serde_json::json!({
                    "breakers": [{"dependency": "payments", "state": "OPEN"},
                                 {"dependency": "recommendations", "state": "FORCED_OPEN"}],
                    "fallbacks": [{"dependency": "recommendations", "level": "GENERIC", "since": an_hour_ago}],
                    "features": [{"feature": "cart", "level": "GENERIC", "degraded_since": an_hour_ago}]}),
            ),
            agent("web-2", true, 2, serde_json::json!({})),
            agent("web-3", false, 3, serde_json::json!({})),
        ];
        let nacks = vec![NackRow {
            environment: "prod".into(),
            service: "checkout".into(),
            instance_id: "web-2".into(),
            revision: 3,
            error_detail: "bad <b>".into(),
            at: 1,
        }];
        let a = for_service(&facts_for_test(burning(), 3, agents, nacks));
        let texts = texts(&a);
        let has = |class: &str, needle: &str| texts.iter().any(|(c, t)| *c == class && t.contains(needle));
        assert!(has("bad", "kill switch recommendations.enabled is OFF"), "{texts:#?}");
        assert!(
            has("warn", "breaker of recommendations forced FORCED_OPEN with no expiry (incident 42)"),
            "{texts:#?}"
        );
        assert!(has("bad", "breaker payments is OPEN on 1 of 2 connected agents"), "{texts:#?}");
        assert!(has("bad", "feature cart has been on its fallback (GENERIC) since"), "{texts:#?}");
        assert!(has("bad", "1 agent rejected revision 3, e.g. web-2: bad <b>"), "{texts:#?}");
        assert!(has("warn", "1 agent disconnected and not replaced"), "{texts:#?}");
        assert!(has("warn", "revision 3 is applied by only 1 of 2 connected agents"), "{texts:#?}");
        // Said once: the switch and the override already say why recommendations is on its
        // fallback and reads FORCED_OPEN.
        assert!(!texts.iter().any(|(_, t)| t.contains("dependency recommendations is served")), "{texts:#?}");
        assert!(!texts.iter().any(|(_, t)| t.contains("breaker recommendations is OPEN")), "{texts:#?}");
        assert!(a.list.windows(2).all(|w| w[0].severity <= w[1].severity), "worst first");
        assert!(a.list[0].href.starts_with("/ui/environments/prod/services/checkout#"));

        // No agent at all: a warning, never a success.
        let a = for_service(&facts_for_test(quiet, 3, Vec::new(), Vec::new()));
        assert_eq!(a.list.len(), 1);
        assert_eq!(a.list[0].class(), "warn");
        assert!(a.list[0].text.contains("delivered to no agent"));
    }

    /// The alarm line carries the levers that stop the damage, each straight to its
    /// confirmation page.
    #[test]
    fn an_open_breaker_offers_the_switch_the_forced_breaker_and_a_matching_profile() {
        let cfg = config(serde_json::json!({
            "policy": {"dependencies": {"recommendations": {"enabled_flag": "recommendations.enabled"}}},
            "flags": {"recommendations.enabled": {"type": "bool", "value": true}}
        }));
        let agents = vec![agent(
            "web-1",
            true,
            7,
            serde_json::json!({"breakers": [{"dependency": "recommendations", "state": "OPEN"}]}),
        )];
        let mut f = facts_for_test(cfg, 7, agents, Vec::new());
        let spec: ProfileSpec = serde_json::from_value(serde_json::json!({
            "services": {"checkout": {"flags": {"recommendations.enabled": false}}}}))
        .unwrap();
        let unrelated: ProfileSpec = serde_json::from_value(serde_json::json!({
            "services": {"search": {"read_only": true}}}))
        .unwrap();
        f.profiles = vec![("recs-down".into(), spec), ("search-ro".into(), unrelated)];
        let a = for_service(&f);
        let open =
            a.list.iter().find(|a| a.text.starts_with("breaker recommendations is OPEN")).expect("alarm");
        let levers: Vec<(&str, &str)> =
            open.levers.iter().map(|l| (l.label.as_str(), l.href.as_str())).collect();
        assert_eq!(
            levers,
            vec![
                (
                    "switch recommendations off (recommendations.enabled)",
                    "/ui/environments/prod/services/checkout/flags/recommendations.enabled/confirm?value=false&revision=7"
                ),
                (
                    "force the breaker of recommendations open for 1h",
                    "/ui/environments/prod/services/checkout/breakers/confirm?dependency=recommendations&state=forced_open&expires_in=1h&revision=7"
                ),
                (
                    "apply emergency profile recs-down",
                    "/ui/environments/prod/profiles/recs-down/confirm?for=1h"
                ),
            ]
        );
    }

    /// Switched off, the dependency's breaker sees no call: its OPEN is frozen, said with the
    /// switch, never as a separate red alarm.
    #[test]
    fn a_switched_off_dependency_reports_its_frozen_breaker_with_the_switch() {
        let cfg = config(serde_json::json!({
            "policy": {"dependencies": {"recommendations": {"enabled_flag": "recommendations.enabled"}}},
            "flags": {"recommendations.enabled": {"type": "bool", "value": false}}
        }));
        let agents = vec![agent(
            "web-1",
            true,
            4,
            serde_json::json!({"breakers": [{"dependency": "recommendations", "state": "OPEN"}],
                "fallbacks": [{"dependency": "recommendations", "level": "GENERIC", "since": ""}]}),
        )];
        let a = for_service(&facts_for_test(cfg, 4, agents, Vec::new()));
        assert_eq!(a.list.len(), 1, "{:#?}", texts(&a));
        assert!(a.list[0].text.contains("stays so, frozen"), "{}", a.list[0].text);
        assert_eq!(a.list[0].levers[0].label, "turn recommendations.enabled back on");
    }

    /// A feature reported on its fallback whose row is not in the stored policy comes from
    /// the matrix compiled into the service: the alarm points to the agents, not to "the
    /// degradation matrix" the same page says the policy does not have.
    #[test]
    fn a_feature_the_policy_has_no_row_for_points_to_the_agents_not_the_matrix() {
        let now = Timestamp::from_unix_ms(1_800_000_000_000);
        let agents = vec![agent(
            "web-1",
            true,
            3,
            serde_json::json!({"features": [{"feature": "Personal recommendations", "level": "GENERIC",
                "degraded_since": Timestamp::from_unix_ms(now.unix_ms() - 60_000).to_rfc3339()}]}),
        )];
        let a = for_service(&facts_for_test(burning(), 3, agents, Vec::new()));
        let row =
            a.list.iter().find(|a| a.text.contains("feature Personal recommendations")).expect("listed");
        assert!(row.text.contains("compiled-in matrix"), "{}", row.text);
        assert!(row.href.ends_with("#agents"), "{}", row.href);
    }

    /// A restarted instance leaves its old row behind for an hour; it is not a lost agent.
    #[test]
    fn a_replaced_instance_is_not_abnormal() {
        let quiet = config(serde_json::json!({}));
        let old = AgentRow {
            connected_at: 10,
            last_seen: 50,
            ..agent("web-1-00000001", false, 3, serde_json::json!({}))
        };
        let new = AgentRow { connected_at: 60, ..agent("web-1-00000002", true, 3, serde_json::json!({})) };
        let a = for_service(&facts_for_test(quiet, 3, vec![old, new], Vec::new()));
        assert!(a.is_empty(), "{:#?}", texts(&a));
    }
}

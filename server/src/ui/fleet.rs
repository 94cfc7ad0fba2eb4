//! What the fleet says about a service: who is connected, who applied which revision, who
//! rejected it, and what the agents' last status reports show (open breakers, features on a
//! fallback).

use std::collections::{BTreeMap, BTreeSet};

use levee_agent::breaker::State;
use levee_agent::policy::FallbackLevel;

use crate::db::{AgentRow, NackRow};

/// Breaker states that count as "open" in the overview.
const OPEN_STATES: [State; 2] = [State::Open, State::ForcedOpen];

/// Summary of a service's agents.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct FleetSummary {
    /// Instances with a stream open now.
    pub connected: usize,
    /// Connected instances that applied the current revision.
    pub acked: usize,
    /// Instances that rejected the current revision.
    pub nacked_current: usize,
    /// Every NACK on record.
    pub nacks_total: usize,
    /// Breakers open on at least one connected instance (`dependency` or `dependency operation`).
    pub open_breakers: Vec<String>,
    /// Features living on a fallback on at least one connected instance, with the level.
    pub degraded: Vec<String>,
    /// Dependencies served by their fallback on at least one connected instance, with the
    /// level.
    pub fallbacks: Vec<String>,
}

impl FleetSummary {
    /// Summarizes `agents` and `nacks` against the service's current `revision`.
    pub fn new(revision: u64, agents: &[AgentRow], nacks: &[NackRow]) -> FleetSummary {
        let live: Vec<&AgentRow> = agents.iter().filter(|a| a.connected).collect();
        let mut open = BTreeSet::new();
        let mut degraded = BTreeMap::new();
        let mut fallbacks = BTreeMap::new();
        for a in &live {
            let report = AgentReport::of(a);
            open.extend(report.open_breakers);
            for (feature, level) in report.degraded {
                degraded.entry(feature).or_insert(level);
            }
            for (dep, level, _) in report.fallbacks {
                fallbacks.entry(dep).or_insert(level);
            }
        }
        FleetSummary {
            connected: live.len(),
            acked: live.iter().filter(|a| a.applied_revision == revision).count(),
            nacked_current: nacks
                .iter()
                .filter(|n| n.revision == revision)
                .map(|n| &n.instance_id)
                .collect::<BTreeSet<_>>()
                .len(),
            nacks_total: nacks.len(),
            open_breakers: open.into_iter().collect(),
            degraded: degraded.into_iter().map(|(f, l)| format!("{f} ({l})")).collect(),
            fallbacks: fallbacks.into_iter().map(|(d, l)| format!("{d} ({l})")).collect(),
        }
    }
}

/// One breaker as an agent reported it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct BreakerReport {
    /// The dependency.
    pub dependency: String,
    /// The operation with its own breaker; empty for the dependency's.
    pub operation: String,
    /// Its state; `None` for a word this server does not know (an agent newer than it).
    pub state: Option<State>,
    /// Share of failed calls in its window, 0..=1 (0 when not reported).
    pub failure_rate: f64,
}

impl BreakerReport {
    /// The state in the agent's word (`HALF_OPEN`).
    pub fn word(&self) -> &'static str {
        self.state.map_or("an unknown state", State::as_str)
    }
}

/// What one agent's last status report says, in words.
#[derive(Clone, Debug, Default)]
pub struct AgentReport {
    /// Where its configuration comes from: `live`, `cache` or `default`; `disconnected`
    /// when its stream is closed (never `live` then).
    pub source: String,
    /// Every breaker it reported, closed ones included.
    pub breaker_states: Vec<BreakerReport>,
    /// Breakers not CLOSED, as `name: STATE`.
    pub breakers: Vec<String>,
    /// Breakers OPEN or FORCED_OPEN.
    pub open_breakers: Vec<String>,
    /// Features on a fallback: (feature, level).
    pub degraded: Vec<(String, String)>,
    /// Dependencies served by their fallback: (dependency, level, since as RFC 3339).
    pub fallbacks: Vec<(String, String, String)>,
    /// Features on a fallback with when it began: (feature, level, since as RFC 3339).
    pub degraded_since: Vec<(String, String, String)>,
}

impl AgentReport {
    /// Reads the status JSON stored for an agent (missing or odd fields are skipped).
    pub fn of(a: &AgentRow) -> AgentReport {
        let mut r = AgentReport { source: a.source.clone(), ..AgentReport::default() };
        let Some(status) = &a.status else { return r };
        for b in status["breakers"].as_array().into_iter().flatten() {
            let word = b["state"].as_str().unwrap_or("");
            if word.is_empty() {
                continue;
            }
            let dep = b["dependency"].as_str().unwrap_or("?");
            let report = BreakerReport {
                dependency: dep.to_string(),
                operation: b["operation"].as_str().unwrap_or("").to_string(),
                state: State::parse(word),
                failure_rate: b["failure_rate"].as_f64().filter(|f| f.is_finite()).unwrap_or(0.0),
            };
            let (state, word) = (report.state, report.word());
            r.breaker_states.push(report);
            if state == Some(State::Closed) {
                continue;
            }
            let name = match b["operation"].as_str() {
                Some(op) if !op.is_empty() => format!("{dep} {op}"),
                _ => dep.to_string(),
            };
            if state.is_some_and(|s| OPEN_STATES.contains(&s)) {
                r.open_breakers.push(name.clone());
            }
            r.breakers.push(format!("{name}: {word}"));
        }
        for f in status["features"].as_array().into_iter().flatten() {
            let level = f["level"].as_str().unwrap_or("");
            let degraded = f["degraded_since"].as_str().is_some_and(|s| !s.is_empty());
            if degraded && !level.is_empty() && level != FallbackLevel::Fresh.as_str() {
                let feature = f["feature"].as_str().unwrap_or("?").to_string();
                let since = f["degraded_since"].as_str().unwrap_or("").to_string();
                r.degraded.push((feature.clone(), level.to_string()));
                r.degraded_since.push((feature, level.to_string(), since));
            }
        }
        for f in status["fallbacks"].as_array().into_iter().flatten() {
            r.fallbacks.push((
                f["dependency"].as_str().unwrap_or("?").to_string(),
                f["level"].as_str().unwrap_or("").to_string(),
                f["since"].as_str().unwrap_or("").to_string(),
            ));
        }
        r
    }
}

/// Disconnected agents that a newer connected agent has taken the place of: gone
/// instance → the instance that replaced it.
///
/// A restarted or rescheduled instance comes back under a new name (the agent adds random
/// digits to it), so its old row stays, disconnected, until it ages out an hour later.
/// Such a row is not a lost instance: each disconnected agent is paired with a connected
/// agent that connected after it had connected (an instance started later), one each,
/// preferring one of the same name but for the random suffix (the same pod or host come
/// back), then the earliest such newcomer. A disconnected agent left without a partner is
/// an instance the fleet lost.
pub fn replacements(agents: &[AgentRow]) -> BTreeMap<String, String> {
    let mut gone: Vec<&AgentRow> = agents.iter().filter(|a| !a.connected).collect();
    gone.sort_by_key(|a| (a.last_seen, a.connected_at));
    let mut fresh: Vec<&AgentRow> = agents.iter().filter(|a| a.connected).collect();
    fresh.sort_by_key(|a| a.connected_at);
    let mut taken = BTreeSet::new();
    let mut out = BTreeMap::new();
    for g in gone {
        let newer = |a: &&&AgentRow| a.connected_at > g.connected_at && !taken.contains(&a.instance_id);
        let pick = fresh
            .iter()
            .filter(newer)
            .find(|a| stem(&a.instance_id) == stem(&g.instance_id))
            .or_else(|| fresh.iter().find(newer));
        if let Some(a) = pick {
            taken.insert(a.instance_id.clone());
            out.insert(g.instance_id.clone(), a.instance_id.clone());
        }
    }
    out
}

/// An instance name without the random suffix the agent adds (`checkout-web-1-3f9a0c12` →
/// `checkout-web-1`).
fn stem(instance: &str) -> &str {
    match instance.rsplit_once('-') {
        Some((stem, suffix)) if suffix.len() == 8 && suffix.bytes().all(|b| b.is_ascii_hexdigit()) => stem,
        _ => instance,
    }
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
            source: String::new(),
            status: Some(status),
        }
    }

    #[test]
    fn counts_only_connected_agents_and_reads_their_reports() {
        let agents = [
            agent(
                "a",
                true,
                3,
                serde_json::json!({"source": "live",
                "breakers": [{"dependency": "pay", "operation": "", "state": "OPEN"},
                             {"dependency": "recs", "operation": "", "state": "CLOSED"}],
                "features": [{"feature": "recommendations", "level": "GENERIC", "degraded_since": "2026-12-01T12:00:00Z"},
                             {"feature": "cart", "level": "FRESH", "degraded_since": null}]}),
            ),
            agent("b", true, 2, serde_json::json!({})),
            agent("c", false, 3, serde_json::json!({"breakers": [{"dependency": "x", "state": "OPEN"}]})),
        ];
        let nacks = [NackRow {
            environment: "prod".into(),
            service: "checkout".into(),
            instance_id: "b".into(),
            revision: 3,
            error_detail: "bad".into(),
            at: 1,
        }];
        let s = FleetSummary::new(3, &agents, &nacks);
        assert_eq!((s.connected, s.acked, s.nacked_current, s.nacks_total), (2, 1, 1, 1));
        assert_eq!(s.open_breakers, vec!["pay".to_string()]);
        assert_eq!(s.degraded, vec!["recommendations (GENERIC)".to_string()]);
    }

    fn at(id: &str, connected: bool, connected_at: i64, last_seen: i64) -> AgentRow {
        AgentRow { connected_at, last_seen, ..agent(id, connected, 1, serde_json::json!({})) }
    }

    #[test]
    fn a_restarted_instance_is_replaced_and_a_lost_one_is_not() {
        // web-1 restarted (same stem, new suffix); web-2 was rescheduled under a new name;
        // web-3 crashed and nothing took its place.
        let agents = [
            at("web-1-00000001", false, 100, 500),
            at("web-1-00000002", true, 510, 900),
            at("web-2-0000000a", false, 100, 600),
            at("web-9-0000000b", true, 450, 900),
            at("web-3-0000000c", false, 100, 700),
            at("web-4-0000000d", true, 100, 900),
        ];
        let r = replacements(&agents);
        assert_eq!(r.get("web-1-00000001").map(String::as_str), Some("web-1-00000002"));
        assert_eq!(r.get("web-2-0000000a").map(String::as_str), Some("web-9-0000000b"));
        assert_eq!(r.get("web-3-0000000c"), None, "web-4 is older than web-3: it replaced nothing");
        assert_eq!(r.len(), 2);
        assert_eq!(stem("checkout-web-1-3f9a0c12"), "checkout-web-1");
        assert_eq!(stem("checkout"), "checkout");
    }
}

//! One read of a service's state, from which every status its page shows is derived: the
//! alarms and their levers (`alarms.rs`), how far the current revision has spread, each
//! dependency's breaker as the connected agents report it, the agents. The page renders
//! from one [`ServiceFacts`], and the live stream (`live.rs`) reads a new one each turn and
//! says when what the page would show has changed, so no part of the page can contradict
//! another (a banner saying "applied by 0 of 1" over a panel saying "1 of 1").

use std::collections::BTreeMap;

use levee_agent::breaker::State;
use levee_agent::policy::{FaultRule, FlagType, ServiceConfig, Timestamp};

use super::error::UiError;
use super::fleet::{AgentReport, BreakerReport, replacements};
use super::page::{When, duration, percent};
use super::service::{Loaded, load, state_label};
use crate::actions::{Profile, ProfileSpec};
use crate::db::{ActivationRow, AgentRow, ExperimentRow, NackRow, ServiceRow};
use crate::health::{HealthTotals, SubjectKind};
use crate::web::AppState;

/// What is known of one service at one moment.
pub struct ServiceFacts {
    pub env: String,
    pub svc: String,
    /// The services row (current revision).
    pub row: ServiceRow,
    /// The current snapshot body.
    pub cfg: ServiceConfig,
    /// Agents connected now and those disconnected in the last hour.
    pub agents: Vec<AgentRow>,
    pub nacks: Vec<NackRow>,
    /// The environment's emergency profiles, offered as levers; empty while one is active
    /// (applying another is refused then).
    pub profiles: Vec<(String, ProfileSpec)>,
    /// The profile active in the environment.
    pub active: Option<ActivationRow>,
    /// Commit-to-ACK times of the current revision, in words; empty before the first ACK.
    pub latency: String,
    pub now: Timestamp,
    /// What the agents' calls to each dependency and requests on each route did recently
    /// (the 10-second slots of the last [`RECENT_HEALTH`], every revision summed).
    pub health: BTreeMap<(SubjectKind, String), HealthTotals>,
    /// The game days running on the service, oldest first.
    pub game_days: Vec<ExperimentRow>,
    /// Their fault rules, taken out of `cfg.faults`: no alarm or list names them; the
    /// service page shows them to whom may see what a game day injected.
    pub game_day_faults: Vec<FaultRule>,
}

/// How far back the service page and its alarms read the agents' health windows.
pub const RECENT_HEALTH: std::time::Duration = std::time::Duration::from_secs(60);

/// What the services of one environment share: its active profile and the profiles
/// offered as levers (none while one is active: applying another is refused then).
pub struct EnvContext {
    pub active: Option<ActivationRow>,
    pub profiles: Vec<(String, ProfileSpec)>,
}

impl ServiceFacts {
    /// Reads what the services of `env` share.
    ///
    /// # Errors
    /// The database failed.
    pub async fn context(s: &AppState, env: &str) -> Result<EnvContext, UiError> {
        let active = s.store.active_profile(env).await?;
        let mut profiles = Vec::new();
        if active.is_none() {
            for p in s.store.profiles(env).await? {
                // A profile that no longer decodes is shown (and refused) on its own page.
                if let Ok(p) = Profile::of(p) {
                    profiles.push((p.row.name.clone(), p.spec));
                }
            }
        }
        Ok(EnvContext { active, profiles })
    }

    /// Reads a service's state, or 404.
    ///
    /// # Errors
    /// No such service; the database failed.
    pub async fn load(s: &AppState, env: &str, svc: &str) -> Result<ServiceFacts, UiError> {
        let context = Self::context(s, env).await?;
        let mut facts = Self::load_in(s, &context, env, svc).await?;
        facts.latency = match s.store.propagation(env, svc, facts.row.revision).await? {
            Some(p) if p.acked > 0 => format!(
                "Commit to ACK: p50 {}, p99 {}, max {} over {} ACK{}.",
                duration(p.p50.unwrap_or_default()),
                duration(p.p99.unwrap_or_default()),
                duration(p.max.unwrap_or_default()),
                p.acked,
                if p.acked == 1 { "" } else { "s" }
            ),
            _ => String::new(),
        };
        Ok(facts)
    }

    /// Reads a service's state in an environment whose shared part is `context` (without
    /// the propagation latency, which only its own page shows).
    ///
    /// # Errors
    /// No such service; the database failed.
    pub async fn load_in(
        s: &AppState,
        context: &EnvContext,
        env: &str,
        svc: &str,
    ) -> Result<ServiceFacts, UiError> {
        let Loaded { row, config: mut cfg } = load(s, env, svc).await?;
        let game_days = crate::actions::running_game_days(&s.store, env, svc).await?;
        let ids: Vec<String> = game_days.iter().map(|e| crate::actions::experiment_fault_id(e.id)).collect();
        let (game_day_faults, faults) = cfg.faults.into_iter().partition(|f| ids.contains(&f.id));
        cfg.faults = faults;
        let agents = s.store.agents(env, svc).await?;
        let nacks = s.store.nacks(env, svc).await?;
        let now = Timestamp::now();
        let since = now.unix_ms() - RECENT_HEALTH.as_millis() as i64;
        let mut health: BTreeMap<(SubjectKind, String), HealthTotals> = BTreeMap::new();
        for r in s.health.by_revision_and_subject(env, svc, since).await?.into_values() {
            for (k, t) in r.subjects {
                health.entry(k).or_default().add(&t);
            }
        }
        Ok(ServiceFacts {
            health,
            env: env.to_string(),
            svc: svc.to_string(),
            row,
            cfg,
            agents,
            nacks,
            profiles: context.profiles.clone(),
            active: context.active.clone(),
            latency: String::new(),
            now,
            game_days,
            game_day_faults,
        })
    }

    /// The agents with a stream open now.
    pub fn connected(&self) -> impl Iterator<Item = &AgentRow> {
        self.agents.iter().filter(|a| a.connected)
    }

    /// Dependencies switched off by their kill switch (a bool flag of the service that is
    /// off): no calls are made to them.
    pub fn switched_off(&self, dependency: &str) -> Option<&str> {
        let key = self.cfg.policy.dependencies.get(dependency)?.enabled_flag.as_deref()?;
        let f = self.cfg.flags.get(key)?;
        (f.kind == FlagType::Bool && f.value.as_bool() == Some(false)).then_some(key)
    }

    /// Disconnected agents a newer one replaced (see [`replacements`]).
    pub fn replaced(&self) -> BTreeMap<String, String> {
        replacements(&self.agents)
    }
}

/// How far a revision has spread through the connected agents.
#[derive(Clone, Debug, PartialEq, Eq, Hash, serde::Serialize)]
pub struct Propagation {
    pub revision: u64,
    pub connected: usize,
    /// Connected agents on this revision or a later one.
    pub acked: usize,
    /// Agents that rejected this revision.
    pub nacked: usize,
    /// Still waiting for some connected agent.
    pub pending: bool,
}

impl Propagation {
    /// How far `revision` has spread, from `facts`.
    pub fn of(revision: u64, facts: &ServiceFacts) -> Propagation {
        let connected = facts.connected().count();
        let acked = facts.connected().filter(|a| a.applied_revision >= revision).count();
        let nacked = facts
            .nacks
            .iter()
            .filter(|n| n.revision == revision)
            .map(|n| &n.instance_id)
            .collect::<std::collections::BTreeSet<_>>()
            .len();
        Propagation { revision, connected, acked, nacked, pending: acked + nacked < connected }
    }

    /// "N of M agents applied revision R." in words (no agent: delivered to none).
    pub fn summary(&self) -> String {
        if self.connected == 0 {
            format!("Revision {}: delivered to no agent (none is connected).", self.revision)
        } else {
            format!("{} of {} agents applied revision {}.", self.acked, self.connected, self.revision)
        }
    }
}

/// A dependency's breaker as the page shows it, from the override and the agents' reports.
#[derive(Clone, Debug, PartialEq, Eq, Hash, serde::Serialize)]
pub struct BreakerCell {
    /// In words: `CLOSED on 2 of 2 agents`, `OPEN on 1 of 2 agents (failures 62%)`, …
    pub text: String,
    /// `ok`, `warn`, `bad` or `muted`.
    pub class: &'static str,
}

/// The live breaker column of the dependencies table: each dependency's breaker (its own,
/// not its operations') as the connected agents report it.
///
/// A dependency switched off by its kill switch receives no call, so its breaker keeps
/// the state it had when calls stopped: an OPEN breaker there is frozen, and says nothing
/// about whether the dependency healed. It is shown as such, never as a live red OPEN.
pub fn breaker_column(facts: &ServiceFacts) -> BTreeMap<String, BreakerCell> {
    let connected: Vec<&AgentRow> = facts.connected().collect();
    let reports: Vec<AgentReport> = connected.iter().map(|a| AgentReport::of(a)).collect();
    let mut out = BTreeMap::new();
    for (name, dep) in &facts.cfg.policy.dependencies {
        let seen: Vec<&BreakerReport> = reports
            .iter()
            .flat_map(|r| &r.breaker_states)
            .filter(|b| b.dependency == *name && b.operation.is_empty())
            .collect();
        let forced =
            facts.cfg.breaker_overrides.iter().find(|o| o.dependency == *name && o.operation.is_none());
        let cell = if let Some(o) = forced {
            let until = o
                .expires_at
                .map(|t| format!(" until {}", When::at(t.unix_ms(), facts.now.unix_ms())))
                .unwrap_or_default();
            BreakerCell { text: format!("{} by an operator{until}", state_label(o.state)), class: "warn" }
        } else if !dep.circuit_breaker.enabled {
            BreakerCell { text: "no breaker (off in the policy)".into(), class: "muted" }
        } else if connected.is_empty() {
            BreakerCell { text: "unknown: no agent is connected".into(), class: "muted" }
        } else if seen.is_empty() {
            BreakerCell { text: "not reported yet (no call made)".into(), class: "muted" }
        } else {
            // By the state's word, so the cell lists them in alphabetical order.
            let mut states: BTreeMap<&str, (usize, f64, bool)> = BTreeMap::new();
            for b in &seen {
                let e = states.entry(b.word()).or_default();
                e.0 += 1;
                e.1 = e.1.max(b.failure_rate);
                e.2 = b.state == Some(State::Closed);
            }
            let n = connected.len();
            let open = seen.iter().any(|b| matches!(b.state, Some(State::Open | State::HalfOpen)));
            let text = states
                .iter()
                .map(|(state, (k, rate, closed))| {
                    let rate = if !*closed && *rate > 0.0 {
                        format!(" (failures {})", percent(*rate))
                    } else {
                        String::new()
                    };
                    format!("{state} on {k} of {n} agent{}{rate}", if n == 1 { "" } else { "s" })
                })
                .collect::<Vec<_>>()
                .join(", ");
            match facts.switched_off(name) {
                Some(key) if open => BreakerCell {
                    text: format!(
                        "{text}, frozen: {key} switched {name} off, so no call reaches it and the breaker \
                         cannot see whether it healed; it probes again once switched back on"
                    ),
                    class: "muted",
                },
                Some(key) => {
                    BreakerCell { text: format!("{text}; no calls: switched off by {key}"), class: "muted" }
                }
                None if open => BreakerCell { text, class: "bad" },
                None => BreakerCell { text, class: "ok" },
            }
        };
        out.insert(name.clone(), cell);
    }
    out
}

/// Facts of prod/checkout at `revision` for unit tests, at a fixed moment.
#[cfg(test)]
pub fn facts_for_test(
    cfg: ServiceConfig,
    revision: u64,
    agents: Vec<AgentRow>,
    nacks: Vec<NackRow>,
) -> ServiceFacts {
    ServiceFacts {
        env: "prod".into(),
        svc: "checkout".into(),
        row: ServiceRow {
            environment: "prod".into(),
            name: "checkout".into(),
            description: String::new(),
            revision,
            policy: String::new(),
            created_at: 1,
            updated_at: 1,
        },
        cfg,
        agents,
        nacks,
        profiles: Vec::new(),
        active: None,
        latency: String::new(),
        now: Timestamp::from_unix_ms(1_800_000_000_000),
        health: BTreeMap::new(),
        game_days: Vec::new(),
        game_day_faults: Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::db::AgentRow;

    fn facts(cfg: serde_json::Value, agents: Vec<AgentRow>) -> ServiceFacts {
        facts_for_test(serde_json::from_value(cfg).unwrap(), 3, agents, Vec::new())
    }

    fn agent(id: &str, breakers: serde_json::Value) -> AgentRow {
        AgentRow {
            environment: "prod".into(),
            service: "checkout".into(),
            instance_id: id.into(),
            agent_version: "0.1.0".into(),
            connected: true,
            connected_at: 1,
            last_seen: 1,
            applied_revision: 3,
            applied_hash: String::new(),
            source: "live".into(),
            status: Some(serde_json::json!({ "breakers": breakers })),
        }
    }

    #[test]
    fn the_breaker_column_is_live_and_says_when_an_open_breaker_is_frozen() {
        let policy =
            serde_json::json!({"dependencies": {"recs": {"enabled_flag": "recs.enabled"}, "pay": {}}});
        let open = serde_json::json!([{"dependency": "recs", "state": "OPEN", "failure_rate": 0.625},
                                      {"dependency": "pay", "state": "CLOSED"}]);
        let on = facts(
            serde_json::json!({"policy": policy, "flags": {"recs.enabled": {"type": "bool", "value": true}}}),
            vec![agent("a", open.clone()), agent("b", serde_json::json!([]))],
        );
        let col = breaker_column(&on);
        assert_eq!(col["recs"].text, "OPEN on 1 of 2 agents (failures 62.5%)");
        assert_eq!(col["recs"].class, "bad");
        assert_eq!((col["pay"].text.as_str(), col["pay"].class), ("CLOSED on 1 of 2 agents", "ok"));

        let off = facts(
            serde_json::json!({"policy": policy, "flags": {"recs.enabled": {"type": "bool", "value": false}}}),
            vec![agent("a", open)],
        );
        let col = breaker_column(&off);
        assert!(col["recs"].text.contains("frozen: recs.enabled switched recs off"), "{:?}", col["recs"]);
        assert_eq!(col["recs"].class, "muted", "never a live red OPEN");

        let none = facts(serde_json::json!({"policy": policy}), Vec::new());
        assert_eq!(breaker_column(&none)["pay"].text, "unknown: no agent is connected");
    }
}

//! What the service page shows of inbound admission: the policy (mode, limit, queue,
//! levers, with the levers an emergency profile set until its expiry in force) and, from the connected agents' last status reports, the limit and load of
//! each instance and what was shed — or, in shadow mode, would have been — by route,
//! criticality and reason, plus the calls each dependency's client-side throttle refused.
//!
//! The agents' counters are untrusted input: only the names the agent writes
//! (`levee_agent::admission::AdmissionStatus::contribute`) are read, label values are
//! checked against their closed sets (criticality, reason) or bounded (route, dependency:
//! [`MAX_LABEL`] bytes), at most [`MAX_STATUS_COUNTERS`] counters of each report are looked at,
//! and at most [`MAX_ROWS`] rows are shown; askama escapes what is printed.

use std::collections::BTreeMap;

use levee_agent::policy::{AdmissionMode, Inbound, LeverOverride, LimitAlgorithm};

use super::page::{duration, percent};
use crate::db::{AgentRow, MAX_STATUS_COUNTERS};

/// Longest route or dependency name read from a counter, in bytes.
pub const MAX_LABEL: usize = 200;
/// Most shed rows (and throttle rows) shown.
pub const MAX_ROWS: usize = 100;

const CRITICALITIES: [&str; 4] = ["CRITICAL_PLUS", "CRITICAL", "SHEDDABLE_PLUS", "SHEDDABLE"];
const REASONS: [&str; 8] =
    ["limit", "queue_full", "displaced", "queue_timeout", "deadline", "operator", "read_only", "flushed"];

/// One connected agent's admission figures.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct InstanceAdmission {
    pub instance: String,
    pub limit: u64,
    pub in_flight: u64,
    pub queued: u64,
    pub overloaded: bool,
    pub shadow: bool,
    pub route_overflow: u64,
}

/// Requests shed (and would-be shed) on one route, of one criticality, for one reason,
/// summed over the connected agents.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ShedRow {
    pub route: String,
    pub criticality: &'static str,
    pub reason: &'static str,
    pub shed: u64,
    pub would_shed: u64,
}

/// The admission section of the service page.
#[derive(Clone, Debug, Default)]
pub struct AdmissionView {
    /// `enforce` or `shadow` (the policy's mode).
    pub mode: &'static str,
    pub shadow: bool,
    /// The policy in words: limit, queue, levers.
    pub limit: String,
    pub queue: String,
    pub levers: Vec<String>,
    /// Levers set for a limited time (by a profile): until when and why.
    pub lever_override: Option<(super::page::When, String)>,
    pub instances: Vec<InstanceAdmission>,
    pub sheds: Vec<ShedRow>,
    /// Rows left out past [`MAX_ROWS`].
    pub sheds_omitted: usize,
    /// Total would-be rejections over every route (shadow mode).
    pub would_shed_total: u64,
    /// Calls refused locally by client-side throttling, per dependency.
    pub throttled: Vec<(String, u64)>,
}

/// Reads `name` as `kind{route="…",criticality="…",reason="…"}` with `kind` one of the
/// two shed counters; `None` for anything else (a bad label means the counter is skipped).
fn parse_shed(name: &str) -> Option<(bool, String, &'static str, &'static str)> {
    let (shadow, rest) = if let Some(r) = name.strip_prefix("admission_would_shed{route=") {
        (true, r)
    } else {
        (false, name.strip_prefix("admission_shed{route=")?)
    };
    let (route, rest) = quoted(rest)?;
    let rest = rest.strip_prefix(",criticality=\"")?;
    let (criticality, rest) = rest.split_once('"')?;
    let rest = rest.strip_prefix(",reason=\"")?;
    let (reason, rest) = rest.split_once('"')?;
    if rest != "}" {
        return None;
    }
    let criticality = CRITICALITIES.into_iter().find(|c| *c == criticality)?;
    let reason = REASONS.into_iter().find(|r| *r == reason)?;
    Some((shadow, route, criticality, reason))
}

/// `client_throttled{dependency="…"}` → the dependency.
fn parse_throttled(name: &str) -> Option<String> {
    let (dep, rest) = quoted(name.strip_prefix("client_throttled{dependency=")?)?;
    (rest == "}").then_some(dep)
}

/// A double-quoted string as the agent writes it (Rust `{:?}`: `\"` and `\\` escaped) at
/// the start of `s`, and what follows; `None` when it is not closed within
/// [`MAX_LABEL`] bytes or is empty.
fn quoted(s: &str) -> Option<(String, &str)> {
    let body = s.strip_prefix('"')?;
    let mut out = String::new();
    let mut chars = body.char_indices();
    while let Some((i, c)) = chars.next() {
        if out.len() > MAX_LABEL {
            return None;
        }
        match c {
            '"' => return (!out.is_empty()).then(|| (out, &body[i + 1..])),
            '\\' => match chars.next() {
                Some((_, e @ ('"' | '\\'))) => out.push(e),
                Some((_, 'n')) => out.push(' '),
                Some((_, e)) => {
                    out.push('\\');
                    out.push(e);
                }
                None => return None,
            },
            c if c.is_control() => out.push(' '),
            c => out.push(c),
        }
    }
    None
}

fn algorithm(a: LimitAlgorithm) -> &'static str {
    match a {
        LimitAlgorithm::Fixed => "fixed",
        LimitAlgorithm::Aimd => "AIMD",
        LimitAlgorithm::Gradient2 => "Gradient2",
        LimitAlgorithm::Vegas => "Vegas",
    }
}

impl AdmissionView {
    /// The section for `inbound` with the lever override `overridden` in force (the caller
    /// passes it only before its expiry) and the last reports of `agents` (connected ones
    /// only).
    pub fn new(inbound: &Inbound, overridden: Option<&LeverOverride>, agents: &[AgentRow]) -> Self {
        let l = &inbound.limit;
        let policy_limit = match l.algorithm {
            LimitAlgorithm::Fixed => format!("fixed at {}", l.initial_limit),
            a => format!("{} from {} within {}…{}", algorithm(a), l.initial_limit, l.min_limit, l.max_limit),
        };
        let limit = match overridden.and_then(|l| l.inbound_limit) {
            Some(n) => format!("fixed at {n} by an operator lever (the policy's: {policy_limit})"),
            None => policy_limit,
        };
        let effective = inbound.with_levers(overridden);
        let inbound = &*effective;
        let q = &inbound.queue;
        let queue = if q.max_len == 0 {
            "none: a request past the limit is refused at once".to_string()
        } else {
            format!(
                "up to {} waiting, CoDel target {} / interval {}{}",
                q.max_len,
                duration(q.codel_target),
                duration(q.codel_interval),
                if q.adaptive_lifo { ", LIFO while overloaded" } else { "" }
            )
        };
        let mut levers = Vec::new();
        if inbound.shed_sheddable_percent > 0.0 {
            levers.push(format!(
                "shedding {} of SHEDDABLE and SHEDDABLE_PLUS traffic",
                percent(inbound.shed_sheddable_percent / 100.0)
            ));
        }
        if inbound.retries_paused {
            levers.push("all outgoing retries paused".to_string());
        }
        if let Some(flag) = &inbound.read_only_flag {
            levers.push(format!("read-only mode follows flag {flag}"));
        }
        let shadow = inbound.mode == AdmissionMode::Shadow;
        let mut view = AdmissionView {
            mode: if shadow { "shadow" } else { "enforce" },
            shadow,
            limit,
            queue,
            levers,
            lever_override: overridden.map(|l| (super::page::time(l.expires_at.unix_ms()), l.reason.clone())),
            ..Default::default()
        };
        let mut sheds: BTreeMap<(String, &'static str, &'static str), (u64, u64)> = BTreeMap::new();
        let mut throttled: BTreeMap<String, u64> = BTreeMap::new();
        for a in agents.iter().filter(|a| a.connected) {
            let Some(counters) = a.status.as_ref().and_then(|s| s["counters"].as_object()) else { continue };
            let mut inst = InstanceAdmission { instance: a.instance_id.clone(), ..Default::default() };
            let mut any = false;
            for (name, value) in counters.iter().take(MAX_STATUS_COUNTERS) {
                let Some(v) = value.as_u64() else { continue };
                match name.as_str() {
                    "admission_limit" => inst.limit = v,
                    "admission_in_flight" => inst.in_flight = v,
                    "admission_queued" => inst.queued = v,
                    "admission_overloaded" => inst.overloaded = v != 0,
                    "admission_shadow" => inst.shadow = v != 0,
                    "admission_route_overflow" => inst.route_overflow = v,
                    n => {
                        if let Some((shadow, route, c, r)) = parse_shed(n) {
                            let e = sheds.entry((route, c, r)).or_default();
                            if shadow {
                                e.1 = e.1.saturating_add(v);
                            } else {
                                e.0 = e.0.saturating_add(v);
                            }
                        } else if let Some(dep) = parse_throttled(n) {
                            let e = throttled.entry(dep).or_default();
                            *e = e.saturating_add(v);
                        }
                        continue;
                    }
                }
                any = true;
            }
            if any {
                view.instances.push(inst);
            }
        }
        let mut rows: Vec<ShedRow> = sheds
            .into_iter()
            .map(|((route, criticality, reason), (shed, would_shed))| ShedRow {
                route,
                criticality,
                reason,
                shed,
                would_shed,
            })
            .collect();
        view.would_shed_total = rows.iter().map(|r| r.would_shed).fold(0, u64::saturating_add);
        rows.sort_by_key(|r| std::cmp::Reverse(r.shed.max(r.would_shed)));
        view.sheds_omitted = rows.len().saturating_sub(MAX_ROWS);
        rows.truncate(MAX_ROWS);
        view.sheds = rows;
        view.throttled = throttled.into_iter().take(MAX_ROWS).collect();
        view
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn agent(id: &str, connected: bool, counters: serde_json::Value) -> AgentRow {
        AgentRow {
            environment: "prod".into(),
            service: "checkout".into(),
            instance_id: id.into(),
            agent_version: "0.1.0".into(),
            connected,
            connected_at: 1,
            last_seen: 1,
            applied_revision: 1,
            applied_hash: String::new(),
            source: if connected { "live".into() } else { "disconnected".into() },
            status: Some(serde_json::json!({ "counters": counters })),
        }
    }

    #[test]
    fn shadow_counts_of_the_connected_agents_are_summed_by_route_criticality_and_reason() {
        let shed = r#"admission_would_shed{route="GET /quote/{sku}",criticality="SHEDDABLE",reason="limit"}"#;
        let agents = [
            agent(
                "a",
                true,
                serde_json::json!({"admission_limit": 20, "admission_in_flight": 7, "admission_shadow": 1,
                                   "admission_overloaded": 1, shed: 40,
                                   "client_throttled{dependency=\"pricing\"}": 3}),
            ),
            agent("b", true, serde_json::json!({"admission_limit": 30, shed: 2})),
            agent("gone", false, serde_json::json!({"admission_limit": 99, shed: 1000})),
        ];
        let inbound = Inbound { mode: AdmissionMode::Shadow, ..Inbound::default() };
        let v = AdmissionView::new(&inbound, None, &agents);
        assert_eq!((v.mode, v.would_shed_total), ("shadow", 42));
        assert_eq!(
            v.sheds,
            [ShedRow {
                route: "GET /quote/{sku}".into(),
                criticality: "SHEDDABLE",
                reason: "limit",
                shed: 0,
                would_shed: 42
            }]
        );
        assert_eq!(v.instances.len(), 2);
        assert_eq!(
            (v.instances[0].limit, v.instances[0].in_flight, v.instances[0].overloaded),
            (20, 7, true)
        );
        assert_eq!(v.throttled, [("pricing".to_string(), 3)]);
    }

    /// What an agent sends is untrusted: unknown criticalities or reasons, unclosed or
    /// over-long routes, odd values and trailing junk are skipped, never shown.
    #[test]
    fn hostile_counter_names_are_skipped() {
        let long =
            format!(r#"admission_shed{{route="{}",criticality="CRITICAL",reason="limit"}}"#, "x".repeat(500));
        let agents = [agent(
            "a",
            true,
            serde_json::json!({
                r#"admission_shed{route="GET /a",criticality="ROOT",reason="limit"}"#: 1,
                r#"admission_shed{route="GET /a",criticality="CRITICAL",reason="because"}"#: 1,
                r#"admission_shed{route="GET /a,criticality="CRITICAL",reason="limit"}"#: 1,
                r#"admission_shed{route="GET /a",criticality="CRITICAL",reason="limit"}x"#: 1,
                r#"admission_shed{route="",criticality="CRITICAL",reason="limit"}"#: 1,
                r#"admission_shed{route="GET /a",criticality="CRITICAL",reason="limit"}"#: -5,
                long: 1,
                r#"admission_shed{route="<script>\"x\\",criticality="CRITICAL",reason="limit"}"#: 2,
            }),
        )];
        let v = AdmissionView::new(&Inbound::default(), None, &agents);
        assert_eq!(v.sheds.len(), 1, "{:?}", v.sheds);
        // Kept as text (askama escapes it when printed), quotes unescaped once.
        assert_eq!(v.sheds[0].route, "<script>\"x\\");
        assert_eq!(v.sheds[0].shed, 2);
        assert_eq!(v.mode, "enforce");
    }

    #[test]
    fn quoted_reads_escapes_and_refuses_unclosed_strings() {
        assert_eq!(quoted(r#""a\"b",rest"#), Some(("a\"b".to_string(), ",rest")));
        assert_eq!(quoted(r#""open"#), None);
        assert_eq!(quoted(r#""""#), None);
        assert_eq!(parse_throttled(r#"client_throttled{dependency="pay"}"#), Some("pay".into()));
        assert_eq!(parse_throttled(r#"client_throttled{dependency="pay"}}"#), None);
    }
}

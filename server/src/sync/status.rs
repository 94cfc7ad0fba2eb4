//! What is kept of an agent's status report: every agent string bounded and escaped
//! (SEC-2), merged with what the session itself knows.
//!
//! A report is printed once, when what it shows changes ([`Shown::take`] compares the
//! agent's own message first): an agent reports every 10 s and ACKs every revision, and at
//! 10,000 agents converting each report to JSON, and printing it again with each ACK, was a
//! tenth of the server's CPU (docs/benchmarks.md, "Control plane").

use std::collections::HashMap;
use std::fmt::Write as _;

use levee_agent::proto::StatusReport;

use crate::agent_text;
use crate::db::DISCONNECTED_SOURCE;

use super::session::ServiceState;

/// What the agent's row shows of its last status report: the parts of the message it is
/// built from (to tell an unchanged report without converting it) and its JSON members,
/// printed once.
#[derive(Debug, Default)]
pub(super) struct Shown {
    /// The report's breakers, features, counters, bulkheads and fallbacks as the agent
    /// sent them; every other field empty (the health windows go to `crate::health`, the
    /// revision and source are the session's).
    parts: StatusReport,
    /// [`status_value`] of `parts`, printed without its braces (empty: no member).
    members: String,
}

impl Shown {
    /// Keeps what `report` shows if it differs from what `shown` holds, taking its lists
    /// out of it; `true` when it did (the row must be written).
    pub(super) fn take(shown: &mut Option<Shown>, report: &mut StatusReport) -> bool {
        let parts = StatusReport {
            breakers: std::mem::take(&mut report.breakers),
            features: std::mem::take(&mut report.features),
            counters: std::mem::take(&mut report.counters),
            bulkheads: std::mem::take(&mut report.bulkheads),
            fallbacks: std::mem::take(&mut report.fallbacks),
            ..StatusReport::default()
        };
        // A NaN rate is never equal to itself: such a report is written each time, as a
        // changed one (correct, only not skipped).
        if shown.as_ref().is_some_and(|s| s.parts == parts) {
            return false;
        }
        let printed = status_value(&parts).to_string();
        let members =
            printed.strip_prefix('{').and_then(|m| m.strip_suffix('}')).unwrap_or_default().to_string();
        *shown = Some(Shown { parts, members });
        true
    }
}

impl ServiceState {
    /// The status stored for the agent: its last report with `applied_revision` and
    /// `source` set to what the session knows, so the fleet row's top-level fields and
    /// its status never disagree. A closed stream's source is `disconnected`. The report's
    /// own members were printed when it changed; only these two are printed here.
    pub(super) fn status_json(&self, connected: bool) -> String {
        let source = if connected { self.source.as_str() } else { DISCONNECTED_SOURCE };
        let members = self.report.as_ref().map_or("", |r| r.members.as_str());
        let mut out = String::with_capacity(members.len() + 64);
        let source = serde_json::Value::from(source);
        let _ = write!(out, "{{\"applied_revision\":{},\"source\":{source}", self.applied_revision);
        if !members.is_empty() {
            out.push(',');
            out.push_str(members);
        }
        out.push('}');
        out
    }
}

/// The status report as stored: every string bounded and escaped, every word from a fixed
/// vocabulary either known or [`agent_text::UNRECOGNIZED`], lists capped (SEC-2). Its
/// health windows are not part of it: they go to `crate::health`; nor are the revision and
/// the source, which the session knows (`ServiceState::status_json`).
pub(super) fn status_value(r: &StatusReport) -> serde_json::Value {
    use crate::db::{MAX_COUNTER_NAME, MAX_STATUS_COUNTERS};
    use agent_text::{MAX_REASON_CHARS, MAX_REPORT_ENTRIES as N, name, one_of, text};
    serde_json::json!({
        "breakers": r.breakers.iter().take(N).map(|b| serde_json::json!({
            "dependency": name(&b.dependency), "operation": name(&b.operation),
            "state": one_of(&b.state, agent_text::BREAKER_STATES),
            "transitions": b.transitions,
            "last_transition_reason": text(&b.last_transition_reason, MAX_REASON_CHARS),
            "failure_rate": finite(b.failure_rate), "slow_call_rate": finite(b.slow_call_rate),
        })).collect::<Vec<_>>(),
        "features": r.features.iter().take(N).map(|f| serde_json::json!({
            "feature": name(&f.feature), "level": one_of(&f.level, agent_text::FEATURE_LEVELS),
            "degraded_since": (f.degraded_since_ms > 0)
                .then(|| levee_agent::policy::Timestamp::from_unix_ms(f.degraded_since_ms)),
        })).collect::<Vec<_>>(),
        "bulkheads": r.bulkheads.iter().take(N).map(|b| serde_json::json!({
            "dependency": name(&b.dependency), "operation": name(&b.operation),
            "max_concurrent": b.max_concurrent, "in_use": b.in_use,
            "suggested_size": finite(b.suggested_size),
        })).collect::<Vec<_>>(),
        // At most MAX_STATUS_COUNTERS counters are kept, none with a name longer than
        // MAX_COUNTER_NAME bytes, escaped like every agent string (the admission section of
        // the service page reads them; ui/admission.rs checks their labels).
        "counters": r.counters.iter()
            .filter(|c| c.name.len() <= MAX_COUNTER_NAME)
            .take(MAX_STATUS_COUNTERS)
            .map(|c| (text(&c.name, MAX_COUNTER_NAME), c.value))
            .collect::<HashMap<_, _>>(),
        "fallbacks": r.fallbacks.iter().take(N).map(|f| serde_json::json!({
            "dependency": name(&f.dependency),
            "level": one_of(&f.level, agent_text::FEATURE_LEVELS),
            "since": (f.since_ms > 0).then(|| levee_agent::policy::Timestamp::from_unix_ms(f.since_ms)),
        })).collect::<Vec<_>>(),
    })
}

/// A rate an agent reported, or `null` for NaN and infinities (which JSON cannot hold).
fn finite(v: f64) -> Option<f64> {
    v.is_finite().then_some(v)
}

#[cfg(test)]
mod tests {
    use levee_agent::proto::{FeatureStatus, StatusReport};

    /// The fleet API shows an agent's status report as JSON: the time a feature went onto
    /// its fallback is RFC 3339 like every other time of the API, `null` while it is fresh.
    #[test]
    fn status_json_writes_degraded_since_as_rfc3339() {
        let report = StatusReport {
            features: vec![
                FeatureStatus {
                    feature: "recs".into(),
                    level: "GENERIC".into(),
                    degraded_since_ms: 1_764_590_400_000,
                },
                FeatureStatus { feature: "cart".into(), level: "FRESH".into(), degraded_since_ms: 0 },
            ],
            ..StatusReport::default()
        };
        let json = super::status_value(&report);
        assert_eq!(json["features"][0]["degraded_since"], "2025-12-01T12:00:00.000Z");
        assert_eq!(json["features"][1]["degraded_since"], serde_json::Value::Null);
        assert!(json["features"][0].get("degraded_since_ms").is_none());
    }

    /// A report is kept (and the row written) only when what the row shows changed: the
    /// same breakers and features with other health windows, revision or source are the
    /// same report; the health windows are left in the message for `crate::health`.
    #[test]
    fn only_a_report_that_shows_something_new_is_kept() {
        use levee_agent::proto::{BreakerStatus, HealthWindow};
        let report = |state: &str, calls: u64, revision: u64| StatusReport {
            service: "checkout".into(),
            applied_revision: revision,
            source: "live".into(),
            breakers: vec![BreakerStatus {
                dependency: "pricing".into(),
                state: state.into(),
                ..BreakerStatus::default()
            }],
            health: vec![HealthWindow {
                kind: "dependency".into(),
                name: "pricing".into(),
                calls,
                ..HealthWindow::default()
            }],
            ..StatusReport::default()
        };
        let mut shown = None;
        let mut first = report("CLOSED", 3, 1);
        assert!(super::Shown::take(&mut shown, &mut first));
        assert_eq!(first.health.len(), 1, "the health windows stay in the message");
        assert!(first.breakers.is_empty(), "the lists are taken, not copied");
        assert!(!super::Shown::take(&mut shown, &mut report("CLOSED", 9, 2)));
        assert!(super::Shown::take(&mut shown, &mut report("OPEN", 9, 2)));
        assert!(!super::Shown::take(&mut shown, &mut report("OPEN", 0, 2)));
    }

    /// The stored status is the report's JSON with the session's revision and source, as
    /// one object: the members printed once when the report changed, the two fields with
    /// each write (a closed stream's source is `disconnected`).
    #[test]
    fn status_json_is_the_report_with_the_sessions_revision_and_source() {
        use levee_agent::proto::FeatureStatus;
        let mut st = super::super::session::ServiceState::new(7, "h7".into(), Default::default());
        st.source = "live".into();
        let empty: serde_json::Value = serde_json::from_str(&st.status_json(true)).unwrap();
        assert_eq!(empty, serde_json::json!({"applied_revision": 7, "source": "live"}));
        let mut report = StatusReport {
            applied_revision: 6,
            source: "cache".into(),
            features: vec![FeatureStatus {
                feature: "recs\"\n".into(),
                level: "FRESH".into(),
                degraded_since_ms: 0,
            }],
            ..StatusReport::default()
        };
        let mut expected = super::status_value(&report);
        assert!(super::Shown::take(&mut st.report, &mut report));
        expected["applied_revision"] = 7.into();
        expected["source"] = "live".into();
        let stored: serde_json::Value = serde_json::from_str(&st.status_json(true)).unwrap();
        assert_eq!(stored, expected);
        expected["source"] = crate::db::DISCONNECTED_SOURCE.into();
        let closed: serde_json::Value = serde_json::from_str(&st.status_json(false)).unwrap();
        assert_eq!(closed, expected);
    }
}

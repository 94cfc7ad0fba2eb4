//! What is kept of an agent's status report: every agent string bounded and escaped
//! (SEC-2), merged with what the session itself knows.

use std::collections::HashMap;

use crate::agent_text;
use crate::db::DISCONNECTED_SOURCE;

use super::session::ServiceState;

impl ServiceState {
    /// The status stored for the agent: its last report with `applied_revision` and
    /// `source` set to what the session knows, so the fleet row's top-level fields and
    /// its status never disagree. A closed stream's source is `disconnected`.
    pub(super) fn status_json(&self, connected: bool) -> String {
        let mut v = self.report.clone().unwrap_or_else(|| serde_json::json!({}));
        v["applied_revision"] = self.applied_revision.into();
        v["source"] = if connected { self.source.clone() } else { DISCONNECTED_SOURCE.to_string() }.into();
        v.to_string()
    }
}

/// The status report as stored: every string bounded and escaped, every word from a fixed
/// vocabulary either known or [`agent_text::UNRECOGNIZED`], lists capped (SEC-2). Its
/// health windows are not part of it: they go to `crate::health`.
pub(super) fn status_value(r: &levee_agent::proto::StatusReport) -> serde_json::Value {
    use crate::db::{MAX_COUNTER_NAME, MAX_STATUS_COUNTERS};
    use agent_text::{MAX_REASON_CHARS, MAX_REPORT_ENTRIES as N, name, one_of, text};
    serde_json::json!({
        "applied_revision": r.applied_revision,
        "source": one_of(&r.source, agent_text::SOURCES),
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
}

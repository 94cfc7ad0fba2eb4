//! What the agents report, read for each probe of a hypothesis: the health windows of the
//! instances' last reports (`health`, the one source of health) for success rates, p99
//! and readiness, and the fleet's status reports for feature levels.

use std::time::Duration;

use super::judge::Observed;
use levee_agent::policy::FallbackLevel;

use super::spec::{ExperimentSpec, Probe};
use crate::db::Store;
use crate::health::{Health, SubjectFilter, SubjectKind};

/// An instance's last report counts when it is at most this old: a reading sums the last
/// report (the counts since its report before) of every instance that reported within it.
/// Agents report every 10 s by default, so a reading is as fresh as that.
pub const READING_WINDOW: Duration = Duration::from_secs(15);

/// One observation per probe of `spec`, in its order, at `now_ms`.
///
/// # Errors
/// The health task has ended or the fleet could not be read.
pub async fn observe(
    health: &Health,
    store: &Store,
    spec: &ExperimentSpec,
    now_ms: i64,
) -> anyhow::Result<Vec<Observed>> {
    let since = now_ms - READING_WINDOW.as_millis() as i64;
    let (env, svc) = (spec.environment.as_str(), spec.service.as_str());
    let mut out = Vec::with_capacity(spec.hypothesis.len());
    let mut agents = None;
    for probe in &spec.hypothesis {
        let observed = match probe {
            Probe::SuccessRate { .. } | Probe::P99 { .. } => {
                let Some(s) = probe.subject() else {
                    out.push(Observed::Nothing);
                    continue;
                };
                let filter = match (s.route, s.dependency) {
                    (Some(r), _) => SubjectFilter::One(SubjectKind::Route, r.to_string()),
                    (None, Some(d)) => SubjectFilter::One(SubjectKind::Dependency, d.to_string()),
                    (None, None) => {
                        out.push(Observed::Nothing);
                        continue;
                    }
                };
                let t = health.by_instance(env, svc, since, &filter, |_| true).await?;
                if matches!(probe, Probe::SuccessRate { .. }) {
                    if t.calls == 0 {
                        Observed::Nothing
                    } else {
                        Observed::SuccessRate(t.successes as f64 * 100.0 / t.calls as f64)
                    }
                } else {
                    t.p99_ms().map_or(Observed::Nothing, Observed::P99Ms)
                }
            }
            Probe::Ready(_) => {
                let t = health.by_instance(env, svc, since, &SubjectFilter::All, |_| true).await?;
                Observed::NotReady { not_ready: t.not_ready, instances: t.instances }
            }
            Probe::FeatureLevel { feature, .. } => {
                if agents.is_none() {
                    agents = Some(store.agents(env, svc).await?);
                }
                let statuses =
                    agents.iter().flatten().filter(|a| a.connected).filter_map(|a| a.status.as_ref());
                worst_level(statuses, feature).map_or(Observed::Nothing, Observed::Level)
            }
        };
        out.push(observed);
    }
    Ok(out)
}

/// The worst level any of the status reports gives `feature`; an unknown word counts as
/// worst of all.
fn worst_level<'a>(statuses: impl Iterator<Item = &'a serde_json::Value>, feature: &str) -> Option<String> {
    let mut worst: Option<(usize, String)> = None;
    for v in statuses {
        let Some(features) = v.get("features").and_then(|f| f.as_array()) else { continue };
        for f in features.iter().filter(|f| f.get("feature").and_then(|n| n.as_str()) == Some(feature)) {
            let level = f.get("level").and_then(|l| l.as_str()).unwrap_or("").to_string();
            let rank = FallbackLevel::parse(&level).map_or(FallbackLevel::ALL.len(), FallbackLevel::rank);
            if worst.as_ref().is_none_or(|(r, _)| rank > *r) {
                worst = Some((rank, level));
            }
        }
    }
    worst.map(|(_, l)| l)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_worst_level_of_every_report_counts() {
        use serde_json::json;
        let a = json!({"features":[{"feature":"recs","level":"FRESH"},{"feature":"other","level":"FEATURE_ERROR"}]});
        let b = json!({"features":[{"feature":"recs","level":"GENERIC"}]});
        let c = json!({"features":[]});
        assert_eq!(worst_level([&a, &b, &c].into_iter(), "recs").as_deref(), Some("GENERIC"));
        assert_eq!(worst_level([&a].into_iter(), "recs").as_deref(), Some("FRESH"));
        assert_eq!(worst_level([&c, &json!("odd")].into_iter(), "recs"), None);
        let odd = json!({"features":[{"feature":"recs","level":"UNRECOGNIZED"}]});
        assert_eq!(worst_level([&a, &odd].into_iter(), "recs").as_deref(), Some("UNRECOGNIZED"));
    }
}

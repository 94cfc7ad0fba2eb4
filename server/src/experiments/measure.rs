//! What the agents report, read for each probe of a hypothesis: the health windows the
//! instances reported during the reading's period (`health`, the one source of health) for
//! success rates, p99 and readiness, and the fleet's status reports for feature levels.
//!
//! The rule of a reading's period (docs/experiments.md, "Readings"): a reading sums the
//! windows every instance reported since the experiment's previous *complete* reading (the
//! first reading: the last [`READING_WINDOW`]). It is complete when every instance
//! reporting — one that reported within the last [`READING_WINDOW`] — reported in that
//! period; an incomplete reading has no data for its health probes, and the next reading's
//! period starts where this one's did. So a reading never judges the fleet by some
//! instances' newest calls and others' older ones, nor by an instance's calls from before
//! the previous reading, whichever instance happened to report last.

use std::time::Duration;

use super::judge::Observed;
use levee_agent::policy::FallbackLevel;

use super::spec::{ExperimentSpec, Probe};
use crate::db::Store;
use crate::health::{Health, InstanceReports, SubjectFilter, SubjectKind, sum_reports};

/// How far back an experiment's first reading looks, and how recently an instance must
/// have reported to be one a reading waits for. Agents report every 10 s by default.
pub const READING_WINDOW: Duration = Duration::from_secs(15);

/// What one reading saw.
#[derive(Clone, Debug, PartialEq)]
pub struct Observation {
    /// One observation per probe of the hypothesis, in its order.
    pub observed: Vec<Observed>,
    /// Every instance reporting reported in the period: the next reading's period starts
    /// at this reading.
    pub complete: bool,
}

/// Whether every instance in `instances` (those reporting) reported in the period.
pub fn complete(instances: &[InstanceReports]) -> bool {
    instances.iter().all(|i| !i.reports.is_empty())
}

/// One observation per probe of `spec` at `now_ms`, over the period after `from_ms`.
///
/// # Errors
/// The health task has ended or the fleet could not be read.
pub async fn observe(
    health: &Health,
    store: &Store,
    spec: &ExperimentSpec,
    from_ms: i64,
    now_ms: i64,
) -> anyhow::Result<Observation> {
    let live_since = now_ms - READING_WINDOW.as_millis() as i64;
    let (env, svc) = (spec.environment.as_str(), spec.service.as_str());
    let mut instances = health.reported(env, svc, from_ms, live_since).await?;
    // A report that arrived after `now_ms` (while this was asked) belongs to the next
    // period: counted once, there.
    for i in &mut instances {
        i.reports.retain(|r| r.at_ms <= now_ms);
    }
    let complete = complete(&instances);
    let mut out = Vec::with_capacity(spec.hypothesis.len());
    let mut agents = None;
    for probe in &spec.hypothesis {
        let observed = match probe {
            Probe::FeatureLevel { feature, .. } => {
                if agents.is_none() {
                    agents = Some(store.agents(env, svc).await?);
                }
                let statuses =
                    agents.iter().flatten().filter(|a| a.connected).filter_map(|a| a.status.as_ref());
                worst_level(statuses, feature).map_or(Observed::Nothing, Observed::Level)
            }
            _ => health_observed(probe, &instances),
        };
        out.push(observed);
    }
    Ok(Observation { observed: out, complete })
}

/// What the reports of `instances` in the period say of a health probe (success rate,
/// p99, readiness): nothing when the period is not [`complete`], when no call of its
/// subject was reported in it, or for a feature-level probe.
fn health_observed(probe: &Probe, instances: &[InstanceReports]) -> Observed {
    if !complete(instances) {
        return Observed::Nothing;
    }
    let filter = match (probe, probe.subject()) {
        (Probe::Ready(_), _) => {
            let t = sum_reports(instances, &SubjectFilter::All);
            return Observed::NotReady { not_ready: t.not_ready, instances: t.instances };
        }
        (Probe::SuccessRate { .. } | Probe::P99 { .. }, Some(s)) => match (s.route, s.dependency) {
            (Some(r), _) => SubjectFilter::One(SubjectKind::Route, r.to_string()),
            (None, Some(d)) => SubjectFilter::One(SubjectKind::Dependency, d.to_string()),
            (None, None) => return Observed::Nothing,
        },
        _ => return Observed::Nothing,
    };
    let t = sum_reports(instances, &filter);
    match probe {
        Probe::SuccessRate { .. } if t.calls == 0 => Observed::Nothing,
        Probe::SuccessRate { .. } => Observed::SuccessRate(t.successes as f64 * 100.0 / t.calls as f64),
        _ => t.p99_ms().map_or(Observed::Nothing, Observed::P99Ms),
    }
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
    use levee_agent::health::LATENCY_BUCKETS;

    use super::*;
    use crate::health::{HealthTotals, Reported, Window};

    /// A report at `at_ms` of `calls` calls to `recs`, each in latency bucket `bucket`.
    fn report(at_ms: i64, calls: u64, bucket: usize, not_ready: bool) -> Reported {
        let mut counts = HealthTotals { calls, successes: calls, ..HealthTotals::default() };
        counts.latency_buckets = vec![0; LATENCY_BUCKETS];
        counts.latency_buckets[bucket] = calls;
        let windows =
            vec![Window { kind: SubjectKind::Dependency, name: "recs".into(), counts, cut_from: None }];
        Reported { at_ms, not_ready, windows }
    }

    fn instance(name: &str, reports: Vec<Reported>) -> InstanceReports {
        InstanceReports { instance_id: name.into(), last_at_ms: 0, reports }
    }

    fn p99() -> Probe {
        Probe::P99 { route: None, dependency: Some("recs".into()), at_most: Duration::from_millis(200) }
    }

    /// Every report of the period counts, of every instance: a slow instance's calls are
    /// not hidden by a fast one that reported last.
    #[test]
    fn a_reading_sums_every_window_of_its_period() {
        // Bucket 3 ≤ 10 ms; bucket 8 ≤ 500 ms.
        let fast = instance("a", vec![report(1, 50, 3, false), report(2, 50, 3, false)]);
        let slow = instance("b", vec![report(1, 2, 8, false)]);
        assert_eq!(health_observed(&p99(), &[fast.clone(), slow.clone()]), Observed::P99Ms(500.0));
        assert_eq!(health_observed(&p99(), std::slice::from_ref(&fast)), Observed::P99Ms(10.0));
        let rate = Probe::SuccessRate { route: None, dependency: Some("recs".into()), at_least: 99.0 };
        assert_eq!(health_observed(&rate, &[fast, slow]), Observed::SuccessRate(100.0));
    }

    /// An instance reporting but silent in the period makes the reading incomplete: no
    /// data for any health probe, whatever the others reported.
    #[test]
    fn an_instance_silent_in_the_period_leaves_the_reading_without_data() {
        let fast = instance("a", vec![report(1, 50, 3, false)]);
        let silent = instance("b", vec![]);
        let both = [fast.clone(), silent];
        assert!(!complete(&both));
        assert_eq!(health_observed(&p99(), &both), Observed::Nothing);
        assert_eq!(health_observed(&Probe::Ready(true), &both), Observed::Nothing);
        assert!(complete(&[]), "no instance reporting: nothing to wait for");
        assert_eq!(
            health_observed(&Probe::Ready(true), &[]),
            Observed::NotReady { not_ready: 0, instances: 0 }
        );
        // A complete period without a call of the subject: no data for it.
        let idle = instance("c", vec![report(1, 0, 3, false)]);
        assert_eq!(health_observed(&p99(), std::slice::from_ref(&idle)), Observed::Nothing);
        // Readiness: an instance not ready in any of its reports of the period counts.
        let flapping = instance("d", vec![report(1, 1, 3, true), report(2, 1, 3, false)]);
        assert_eq!(
            health_observed(&Probe::Ready(true), &[fast, flapping]),
            Observed::NotReady { not_ready: 1, instances: 2 }
        );
    }

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

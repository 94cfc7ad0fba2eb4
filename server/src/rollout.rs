//! Staged rollouts: the rules. Which instances are in a rollout's cohort, which snapshot an
//! instance is served, how a stage's cohort covers its instances, and when the cohort's
//! health halts the rollout. Pure functions over what the callers read; the state lives in
//! the database (`db::RolloutRow`) and each replica's hub.
//!
//! The cohort is deterministic from the instance id: an instance's bucket is
//! `levee_agent::flags::rollout_bucket` (the flags' rollout hash, one copy of it) of its
//! instance name (the id without the per-process suffix) under a key naming the rollout, and it is in the cohort when the bucket is below the
//! stage's threshold. Thresholds only grow during a rollout, so an instance never leaves
//! the cohort, and a restart under the same id keeps it; a rollout of another change draws
//! another cohort.

use std::sync::Arc;

use levee_agent::flags::{ROLLOUT_BUCKETS, rollout_bucket};

use crate::db::{Plan, RolloutRow, SnapshotRow};

/// The bucket of `instance` (an id agents announce) in rollout `row`
/// (`0..ROLLOUT_BUCKETS`), drawn from its instance name (`levee_agent::instance_name_of`:
/// the id without the random suffix a process adds), so a restarted instance keeps it.
pub fn cohort_bucket(row: &RolloutRow, instance: &str) -> u64 {
    let key = format!("levee-rollout/{}/{}/{}", row.environment, row.service, row.id);
    rollout_bucket(&key, levee_agent::instance_name_of(instance))
}

/// Whether `instance` is in the cohort of `row` now.
pub fn in_cohort(row: &RolloutRow, instance: &str) -> bool {
    cohort_bucket(row, instance) < row.threshold
}

/// The snapshot `instance` is to have, from the newest snapshot (`latest`) and the
/// service's newest rollout with its stable snapshot (`rollout`): `None` while what this
/// replica holds cannot say (the stream offers nothing until it can). `instance` is `None`
/// for a client that does not say who it is (the HTTP fallback without an id), which is
/// never in a cohort.
///
/// While a rollout is in progress, an instance outside its cohort gets only the stable
/// snapshot, never the newest (the candidate). Once it ended by a revert, the newest
/// snapshot is served only when it is that revert or newer.
pub fn serve(
    latest: Option<Arc<SnapshotRow>>,
    rollout: Option<(&RolloutRow, Option<&Arc<SnapshotRow>>)>,
    instance: Option<&str>,
) -> Option<Arc<SnapshotRow>> {
    let latest = latest?;
    let Some((row, stable)) = rollout else { return Some(latest) };
    if row.active() {
        if instance.is_some_and(|i| in_cohort(row, i)) {
            return Some(latest);
        }
        return stable.cloned();
    }
    match row.revert_revision {
        Some(revert) if latest.revision < revert => None,
        _ => Some(latest),
    }
}

/// The threshold of stage `stage` of `row` given the instances connected now: its percent
/// of the buckets, widened to cover at least its `instances` (and at least one) of
/// `connected`, lowest buckets first, and never below the current threshold.
pub fn stage_threshold(row: &RolloutRow, stage: usize, connected: &[String]) -> u64 {
    let plan = &row.plan;
    let share = plan.stage_threshold(stage);
    if share >= ROLLOUT_BUCKETS {
        return ROLLOUT_BUCKETS;
    }
    let want = plan.stages.get(stage).map_or(1, |s| s.instances.max(1)) as usize;
    let mut buckets: Vec<u64> = connected.iter().map(|i| cohort_bucket(row, i)).collect();
    buckets.sort_unstable();
    buckets.dedup();
    let cover = match want.min(buckets.len()) {
        0 => 0,
        n => buckets[n - 1] + 1,
    };
    share.max(cover).max(if stage == row.stage { row.threshold } else { 0 })
}

/// One side of a comparison: the cohort or the rest, over the same time.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Side {
    /// Calls made (dependencies and inbound routes).
    pub calls: u64,
    /// Of which failed or timed out.
    pub bad: u64,
}

impl Side {
    /// Bad calls per call; 0 without calls.
    pub fn error_rate(&self) -> f64 {
        if self.calls == 0 { 0.0 } else { self.bad as f64 / self.calls as f64 }
    }
}

/// What a rollout is judged on.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Evidence {
    pub cohort: Side,
    pub rest: Side,
    /// Cohort instances that NACKed the candidate.
    pub nacks: u64,
}

/// Why the cohort is worse than the plan tolerates, or `None`.
pub fn halt_reason(plan: &Plan, e: &Evidence) -> Option<String> {
    if e.nacks > plan.max_nacks {
        return Some(format!(
            "{} cohort instance{} rejected the candidate (NACK); the plan tolerates {}",
            e.nacks,
            if e.nacks == 1 { "" } else { "s" },
            plan.max_nacks
        ));
    }
    if e.cohort.calls >= plan.min_calls.max(1) {
        let (c, r) = (e.cohort.error_rate(), e.rest.error_rate());
        if c - r > plan.max_error_rate_increase {
            return Some(format!(
                "the cohort's error rate is {:.1} % over {} calls against {:.1} % for the rest over {} calls: \
                 more than the {:.1} points the plan tolerates",
                c * 100.0,
                e.cohort.calls,
                r * 100.0,
                e.rest.calls,
                plan.max_error_rate_increase * 100.0
            ));
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::db::Stage;

    fn row(threshold: u64) -> RolloutRow {
        RolloutRow {
            id: 7,
            environment: "prod".into(),
            service: "checkout".into(),
            state: "running".into(),
            stable_revision: 3,
            candidate_revision: 4,
            base_policy: "{}".into(),
            plan: Plan::default(),
            stage: 0,
            threshold,
            stage_started_at: 0,
            version: 1,
            created_at: 0,
            created_by: "alice".into(),
            reason: "r".into(),
            ended_at: None,
            outcome: None,
            revert_revision: None,
        }
    }

    fn snap(rev: u64) -> Arc<SnapshotRow> {
        Arc::new(SnapshotRow {
            environment: "prod".into(),
            service: "checkout".into(),
            revision: rev,
            hash: format!("h{rev}"),
            body: "{}".into(),
            created_at: 0,
        })
    }

    #[test]
    fn the_cohort_is_a_fixed_function_of_the_instance_and_only_grows() {
        let ids: Vec<String> = (0..1000).map(|i| format!("pod-{i}")).collect();
        let r = row(50_000);
        let inside: Vec<&String> = ids.iter().filter(|i| in_cohort(&r, i)).collect();
        // 5 % of 1000, give or take the hash.
        assert!((25..=75).contains(&inside.len()), "{}", inside.len());
        // Same answer every time; a wider threshold keeps every member.
        assert!(inside.iter().all(|i| in_cohort(&r, i)));
        let wider = row(250_000);
        assert!(inside.iter().all(|i| in_cohort(&wider, i)));
        // Another rollout draws another cohort.
        let other = RolloutRow { id: 8, ..row(50_000) };
        assert_ne!(inside, ids.iter().filter(|i| in_cohort(&other, i)).collect::<Vec<_>>());
    }

    #[test]
    fn a_restarted_instance_keeps_its_bucket() {
        let r = row(0);
        assert_eq!(cohort_bucket(&r, "pod-3-0a1b2c3d"), cohort_bucket(&r, "pod-3-99887766"));
        assert_eq!(cohort_bucket(&r, "pod-3-0a1b2c3d"), cohort_bucket(&r, "pod-3"));
        assert_ne!(cohort_bucket(&r, "pod-3-0a1b2c3d"), cohort_bucket(&r, "pod-4-0a1b2c3d"));
        assert_eq!(levee_agent::instance_name_of("pod-3-XYZ"), "pod-3-XYZ");
    }

    #[test]
    fn outside_the_cohort_only_the_stable_snapshot_is_served() {
        let r = row(0);
        let stable = snap(3);
        assert_eq!(serve(Some(snap(4)), Some((&r, Some(&stable))), Some("a")).unwrap().revision, 3);
        assert!(serve(Some(snap(4)), Some((&r, None)), Some("a")).is_none());
        assert_eq!(serve(Some(snap(4)), Some((&r, Some(&stable))), None).unwrap().revision, 3);
        let all = row(ROLLOUT_BUCKETS);
        assert_eq!(serve(Some(snap(4)), Some((&all, Some(&stable))), Some("a")).unwrap().revision, 4);
        // Ended by the revert at 5: the candidate is never served while 5 is not here.
        let ended = RolloutRow { state: "halted".into(), revert_revision: Some(5), ..row(0) };
        assert!(serve(Some(snap(4)), Some((&ended, None)), Some("a")).is_none());
        assert_eq!(serve(Some(snap(5)), Some((&ended, None)), Some("a")).unwrap().revision, 5);
        assert_eq!(serve(Some(snap(4)), None, Some("a")).unwrap().revision, 4);
    }

    #[test]
    fn a_stage_covers_at_least_one_connected_instance() {
        let r = row(Plan::default().stage_threshold(0));
        let connected: Vec<String> = (0..3).map(|i| format!("pod-{i}")).collect();
        let t = stage_threshold(&r, 0, &connected);
        let inside = connected.iter().filter(|i| cohort_bucket(&r, i) < t).count();
        assert!(inside >= 1);
        // Nobody connected: the percent alone.
        assert_eq!(stage_threshold(&r, 0, &[]), 50_000);
        // A stage of 2 instances covers 2 of 3.
        let plan = Plan {
            stages: vec![Stage { percent: 0, instances: 2 }, Stage { percent: 100, instances: 0 }],
            ..Plan::default()
        };
        let r2 = RolloutRow { plan, threshold: 0, ..row(0) };
        let t = stage_threshold(&r2, 0, &connected);
        assert_eq!(connected.iter().filter(|i| cohort_bucket(&r2, i) < t).count(), 2);
        assert_eq!(stage_threshold(&r2, 1, &connected), ROLLOUT_BUCKETS);
    }

    #[test]
    fn halts_on_nacks_and_on_a_worse_error_rate_only() {
        let plan = Plan::default();
        let side = |calls, bad| Side { calls, bad };
        assert!(halt_reason(&plan, &Evidence { nacks: 1, ..Default::default() }).is_some());
        let bad = Evidence { cohort: side(100, 40), rest: side(1000, 10), nacks: 0 };
        assert!(halt_reason(&plan, &bad).unwrap().contains("40.0 %"));
        // Too few calls to judge, or no worse than the rest.
        assert_eq!(halt_reason(&plan, &Evidence { cohort: side(5, 5), ..Default::default() }), None);
        assert_eq!(
            halt_reason(&plan, &Evidence { cohort: side(100, 12), rest: side(100, 10), nacks: 0 }),
            None
        );
    }
}

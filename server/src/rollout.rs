//! Staged rollouts: the rules. Which instances are in a rollout's cohort, which snapshot an
//! instance is served, how a stage's cohort covers its instances, and when the cohort's
//! health halts the rollout (`halt_reason`, the one rule). Pure functions over what the
//! callers read, and `sides`, which reads a rollout's health as that rule compares it; the
//! state lives in the database (`db::RolloutRow`) and each replica's hub.
//!
//! The cohort is deterministic from the instance id: an instance's bucket is
//! `levee_agent::flags::rollout_bucket` (the flags' rollout hash, one copy of it) of its
//! instance name (the id without the per-process suffix) under a key naming the rollout, and it is in the cohort when the bucket is below the
//! stage's threshold. Thresholds only grow during a rollout, so an instance never leaves
//! the cohort, and a restart under the same id keeps it; a rollout of another change draws
//! another cohort.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use levee_agent::flags::{ROLLOUT_BUCKETS, rollout_bucket};
use levee_agent::policy::Policy;

use crate::db::{Plan, Reader, RolloutRow, SnapshotRow};
use crate::health::{Health, HealthTotals, RevisionTotals, SubjectKind};

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

/// How many standard errors of the difference the cohort's share must exceed the rest's
/// by, besides the plan's `max_error_rate_increase`, before it halts: a small cohort's
/// chance bad luck does not halt, a consistent difference does within a few dozen calls.
pub const HALT_STANDARD_ERRORS: f64 = 3.0;
/// Instance reports (an instance counts once per 10-second health slot it reported in)
/// the cohort must have made before its readiness is judged.
pub const MIN_READINESS_SLOTS: u64 = 3;
/// How far back a rollout's health is summed (never before the rollout started): what
/// the candidate did lately, at a cost that does not grow with a long bake.
pub const HEALTH_LOOKBACK: Duration = Duration::from_secs(15 * 60);

/// One side of a comparison: the cohort (the revisions carrying the candidate policy) or
/// the rest (those carrying the policy it replaces), over the same time.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Side {
    /// What the calls of each dependency and inbound route did.
    pub subjects: BTreeMap<(SubjectKind, String), HealthTotals>,
    /// Instance reports: one per instance and 10-second slot it reported in.
    pub instance_slots: u64,
    /// Of which it said it was not ready.
    pub not_ready_slots: u64,
}

impl Side {
    /// Adds the health of one revision.
    pub fn add(&mut self, t: &RevisionTotals) {
        self.instance_slots += t.instance_slots;
        self.not_ready_slots += t.not_ready_slots;
        for (subject, totals) in &t.subjects {
            self.subjects.entry(subject.clone()).or_default().add(totals);
        }
    }
}

/// What a rollout is judged on.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Evidence {
    pub cohort: Side,
    pub rest: Side,
    /// Cohort instances that NACKed the candidate.
    pub nacks: u64,
    /// Connected instances outside the cohort now. With none (a stage that covers the whole
    /// fleet) the rest's figures can only come from earlier minutes, under other traffic,
    /// so health is not compared: the stages before judged the candidate against instances
    /// running beside it, and only NACKs halt.
    pub rest_instances: u64,
}

/// Calls of a subject that did not succeed: failed, timed out, or shed on the agent's
/// machine (an open breaker sheds, so its openings count through the calls it refused;
/// a fallback answers one of these, so it is counted with them).
pub fn unsuccessful(t: &HealthTotals) -> u64 {
    t.failures + t.timeouts + t.shed
}

/// Whether `bad` of `n` (the cohort) is worse than `rest_bad` of `rest_n` beyond what
/// `max_increase` tolerates: the cohort's share exceeds the rest's by more than
/// `max_increase` and by more than [`HALT_STANDARD_ERRORS`] standard errors of the
/// difference. A rest without any is taken as a share of 0 known exactly.
fn worse(bad: u64, n: u64, rest_bad: u64, rest_n: u64, max_increase: f64) -> bool {
    if n == 0 {
        return false;
    }
    let share = |bad: u64, n: u64| if n == 0 { 0.0 } else { bad as f64 / n as f64 };
    let (c, r) = (share(bad, n), share(rest_bad, rest_n));
    let variance = |p: f64, n: u64| if n == 0 { 0.0 } else { p * (1.0 - p) / n as f64 };
    let se = (variance(c, n) + variance(r, rest_n)).sqrt();
    c - r > max_increase && c - r > HALT_STANDARD_ERRORS * se
}

/// `bad` of `n` in percent (0 of none).
pub fn percent(bad: u64, n: u64) -> f64 {
    if n == 0 { 0.0 } else { bad as f64 * 100.0 / n as f64 }
}

/// What the calls of one dependency or route did, in words: the share that did not
/// succeed and each outcome that counts (the rollout page shows each side so).
pub fn calls_in_words(t: &HealthTotals) -> String {
    if t.calls == 0 {
        return "no calls".to_string();
    }
    format!(
        "{:.1} % of {} calls did not succeed ({} failed, {} timed out, {} shed; {} fallbacks, {} breaker openings)",
        percent(unsuccessful(t), t.calls),
        t.calls,
        t.failures,
        t.timeouts,
        t.shed,
        t.fallbacks,
        t.breaker_opens
    )
}

/// How one dependency or inbound route of the cohort compares with the rest's.
#[derive(Clone, Debug, PartialEq, serde::Serialize, utoipa::ToSchema)]
pub struct SubjectVerdict {
    pub kind: SubjectKind,
    pub name: String,
    pub cohort: HealthTotals,
    pub rest: HealthTotals,
    /// Whether the rule compares it: instances run outside the cohort and the cohort
    /// called it at least `min_calls` times.
    pub judged: bool,
    /// Whether the cohort does worse on it than the plan tolerates.
    pub worse: bool,
}

/// Everything the halt rule looked at and what it concluded: each subject either side
/// called, readiness, NACKs, and the reason of a halt.
#[derive(Clone, Debug, PartialEq, serde::Serialize, utoipa::ToSchema)]
pub struct Verdict {
    /// Every dependency and route of either side, in order of kind and name.
    pub subjects: Vec<SubjectVerdict>,
    /// Whether health is compared at all (some connected instance runs outside the
    /// cohort); without, only NACKs halt.
    pub health_compared: bool,
    /// Whether the cohort made enough instance reports for its readiness to be judged,
    /// and whether it is worse.
    pub readiness_judged: bool,
    pub readiness_worse: bool,
    /// Whether the cohort's NACKs exceed what the plan tolerates.
    pub nacks_worse: bool,
    /// Why the rollout halts (or would, read now), in words ([`halt_reason`]); `None`:
    /// it does not.
    pub reason: Option<String>,
}

/// The halt rule applied to `e` under `plan`, subject by subject; [`halt_reason`] is its
/// conclusion. The rule:
///
/// * more cohort instances NACKed the candidate than `max_nacks`;
/// * for a dependency or inbound route the cohort called at least `min_calls` times (at
///   least once), its share of calls that did not succeed (failed, timed out or shed)
///   exceeds the rest's on the same subject by more than `max_error_rate_increase`, and
///   by more than [`HALT_STANDARD_ERRORS`] standard errors;
/// * over at least [`MIN_READINESS_SLOTS`] instance reports, the cohort's share of
///   reports saying "not ready" exceeds the rest's the same way.
///
/// Health is compared only while instances run outside the cohort (`rest_instances`).
pub fn judge(plan: &Plan, e: &Evidence) -> Verdict {
    let tolerance = plan.max_error_rate_increase;
    let health_compared = e.rest_instances > 0;
    let none = HealthTotals::default();
    let mut keys: Vec<&(SubjectKind, String)> =
        e.cohort.subjects.keys().chain(e.rest.subjects.keys()).collect();
    keys.sort();
    keys.dedup();
    let subjects: Vec<SubjectVerdict> = keys
        .into_iter()
        .map(|key| {
            let c = e.cohort.subjects.get(key).unwrap_or(&none);
            let r = e.rest.subjects.get(key).unwrap_or(&none);
            let judged = health_compared && c.calls >= plan.min_calls.max(1);
            SubjectVerdict {
                kind: key.0,
                name: key.1.clone(),
                cohort: c.clone(),
                rest: r.clone(),
                judged,
                worse: judged && worse(unsuccessful(c), c.calls, unsuccessful(r), r.calls, tolerance),
            }
        })
        .collect();
    let (c, r) = (&e.cohort, &e.rest);
    let readiness_judged = health_compared && c.instance_slots >= MIN_READINESS_SLOTS;
    let readiness_worse = readiness_judged
        && worse(c.not_ready_slots, c.instance_slots, r.not_ready_slots, r.instance_slots, tolerance);
    let nacks_worse = e.nacks > plan.max_nacks;
    let reason = if nacks_worse {
        Some(format!(
            "{} cohort instance{} rejected the candidate (NACK); the plan tolerates {}",
            e.nacks,
            if e.nacks == 1 { "" } else { "s" },
            plan.max_nacks
        ))
    } else if let Some(v) = subjects.iter().find(|v| v.worse) {
        let (c, r) = (&v.cohort, &v.rest);
        Some(format!(
            "{} {}: {:.1} % of the cohort's {} calls did not succeed ({} failed, {} timed out, {} shed; \
             {} fallbacks, {} breaker openings) against {:.1} % of the rest's {}: more than the {:.1} points \
             the plan tolerates",
            v.kind.as_str(),
            v.name,
            percent(unsuccessful(c), c.calls),
            c.calls,
            c.failures,
            c.timeouts,
            c.shed,
            c.fallbacks,
            c.breaker_opens,
            percent(unsuccessful(r), r.calls),
            r.calls,
            tolerance * 100.0
        ))
    } else if readiness_worse {
        Some(format!(
            "the cohort's instances said they were not ready in {} of {} reports ({:.1} %) against {} of {} \
             ({:.1} %) for the rest: more than the {:.1} points the plan tolerates",
            c.not_ready_slots,
            c.instance_slots,
            percent(c.not_ready_slots, c.instance_slots),
            r.not_ready_slots,
            r.instance_slots,
            percent(r.not_ready_slots, r.instance_slots),
            tolerance * 100.0
        ))
    } else {
        None
    };
    Verdict { subjects, health_compared, readiness_judged, readiness_worse, nacks_worse, reason }
}

/// Why the cohort is worse than the plan tolerates, or `None`: the one rule of a halt,
/// as [`judge`] states it.
pub fn halt_reason(plan: &Plan, e: &Evidence) -> Option<String> {
    judge(plan, e).reason
}

/// The cohort's and the rest's health in rollout `r` since it started (at most
/// [`HEALTH_LOOKBACK`] before `now_ms`), from every replica's agents: each revision the
/// agents reported on counts for the side whose policy it carries — the candidate's (the
/// cohort), or the one the rollout started from (the rest); a revision with another
/// policy counts for neither. An immediate change during the rollout writes a revision
/// of each, so both sides keep their history across it.
///
/// # Errors
/// The database could not be read.
pub async fn sides(
    health: &Health,
    store: &Reader,
    r: &RolloutRow,
    now_ms: i64,
) -> anyhow::Result<(Side, Side)> {
    let since = r.created_at.max(now_ms - HEALTH_LOOKBACK.as_millis() as i64);
    let per_revision = health.by_revision_and_subject(&r.environment, &r.service, since).await?;
    let (mut cohort, mut rest) = (Side::default(), Side::default());
    let base: Option<Policy> = serde_json::from_str(&r.base_policy).ok();
    let mut candidate: Option<Option<Policy>> = None;
    for (revision, totals) in &per_revision {
        let side = if *revision == r.candidate_revision {
            Some(&mut cohort)
        } else if *revision == r.stable_revision {
            Some(&mut rest)
        } else {
            let policy = store
                .revision(&r.environment, &r.service, *revision)
                .await?
                .and_then(|s| s.config().ok())
                .map(|c| c.policy);
            if candidate.is_none() {
                candidate = Some(
                    store
                        .revision(&r.environment, &r.service, r.candidate_revision)
                        .await?
                        .and_then(|s| s.config().ok())
                        .map(|c| c.policy),
                );
            }
            match policy {
                Some(p) if Some(&p) == base.as_ref() => Some(&mut rest),
                Some(p) if Some(&p) == candidate.as_ref().and_then(Option::as_ref) => Some(&mut cohort),
                _ => None,
            }
        };
        if let Some(side) = side {
            side.add(totals);
        }
    }
    Ok((cohort, rest))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::db::{RolloutState, Stage};

    fn row(threshold: u64) -> RolloutRow {
        RolloutRow {
            id: 7,
            environment: "prod".into(),
            service: "checkout".into(),
            state: RolloutState::Running,
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
        let ended = RolloutRow { state: RolloutState::Halted, revert_revision: Some(5), ..row(0) };
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

    /// A side whose `subject` dependency made `calls` calls of which `failed` failed and
    /// `shed` were refused locally, over `slots` instance reports, `not_ready` of them not
    /// ready.
    fn side(calls: u64, failed: u64, shed: u64, slots: u64, not_ready: u64) -> Side {
        let totals = HealthTotals {
            calls,
            successes: calls - failed - shed,
            failures: failed,
            shed,
            ..HealthTotals::default()
        };
        let mut subjects = BTreeMap::new();
        if calls > 0 {
            subjects.insert((SubjectKind::Dependency, "pricing".to_string()), totals);
        }
        Side { subjects, instance_slots: slots, not_ready_slots: not_ready }
    }

    fn judge(cohort: Side, rest: Side) -> Option<String> {
        halt_reason(&Plan::default(), &Evidence { cohort, rest, nacks: 0, rest_instances: 3 })
    }

    #[test]
    fn a_stage_over_the_whole_fleet_is_judged_on_nacks_only() {
        // The same figures that halt beside a running rest do not once nothing runs beside it.
        let (cohort, rest) = (side(20, 20, 0, 0, 0), side(1000, 10, 0, 0, 0));
        assert!(judge(cohort.clone(), rest.clone()).is_some());
        let alone = Evidence { cohort, rest, nacks: 0, rest_instances: 0 };
        assert_eq!(halt_reason(&Plan::default(), &alone), None);
        assert!(halt_reason(&Plan::default(), &Evidence { nacks: 1, ..alone }).unwrap().contains("NACK"));
    }

    #[test]
    fn halts_on_nacks() {
        let plan = Plan::default();
        assert!(halt_reason(&plan, &Evidence { nacks: 1, ..Default::default() }).unwrap().contains("NACK"));
        let tolerant = Plan { max_nacks: 1, ..Plan::default() };
        assert_eq!(halt_reason(&tolerant, &Evidence { nacks: 1, ..Default::default() }), None);
    }

    #[test]
    fn halts_when_a_subject_does_worse_in_the_cohort_beyond_the_threshold_and_chance() {
        // Every call times out, fails or is shed in the cohort: the first 20 calls decide.
        let why = judge(side(20, 20, 0, 0, 0), side(1000, 10, 0, 0, 0)).expect("halted");
        assert!(why.starts_with("dependency pricing: 100.0 % of the cohort's 20 calls"), "{why}");
        assert!(why.contains("against 1.0 % of the rest's 1000"), "{why}");
        // Shed calls count (an open breaker, a full bulkhead): the same verdict.
        assert!(judge(side(40, 0, 40, 0, 0), side(1000, 0, 0, 0, 0)).is_some());
        // 40 % against 1 % over 100 calls: far beyond chance.
        assert!(judge(side(100, 40, 0, 0, 0), side(1000, 10, 0, 0, 0)).is_some());
        // A subject the rest never called: taken against 0.
        assert!(judge(side(30, 30, 0, 0, 0), Side::default()).is_some());
    }

    #[test]
    fn a_small_sample_or_a_small_difference_does_not_halt() {
        // Fewer calls than min_calls (20), all failed.
        assert_eq!(judge(side(19, 19, 0, 0, 0), side(1000, 0, 0, 0, 0)), None);
        // Within the 5 points the plan tolerates.
        assert_eq!(judge(side(100, 12, 0, 0, 0), side(100, 10, 0, 0, 0)), None);
        // 30 % against 10 % over 20 calls: past the 5 points, but 6 of 20 happens by chance
        // when the rest sees 10 % (the standard error is about 10 points).
        assert_eq!(judge(side(20, 6, 0, 0, 0), side(1000, 100, 0, 0, 0)), None);
        // The same shares over 200 calls are no longer chance.
        assert!(judge(side(200, 60, 0, 0, 0), side(1000, 100, 0, 0, 0)).is_some());
        // No worse than the rest (a dependency down for everyone).
        assert_eq!(judge(side(100, 100, 0, 0, 0), side(1000, 1000, 0, 0, 0)), None);
    }

    #[test]
    fn readiness_halts_over_enough_reports_only() {
        let why = judge(side(0, 0, 0, 3, 3), side(0, 0, 0, 40, 0)).expect("halted");
        assert!(why.contains("not ready in 3 of 3 reports (100.0 %) against 0 of 40"), "{why}");
        // Two reports are too few; one not ready of six is chance.
        assert_eq!(judge(side(0, 0, 0, 2, 2), side(0, 0, 0, 40, 0)), None);
        assert_eq!(judge(side(0, 0, 0, 6, 1), side(0, 0, 0, 40, 0)), None);
    }

    #[test]
    fn the_verdict_shows_every_subject_of_either_side_and_which_one_halts() {
        let mut cohort = side(40, 40, 0, 3, 0);
        cohort.subjects.insert(
            (SubjectKind::Route, "GET /".into()),
            HealthTotals { calls: 5, successes: 5, ..HealthTotals::default() },
        );
        let mut rest = side(1000, 0, 0, 40, 0);
        rest.subjects.insert(
            (SubjectKind::Dependency, "search".into()),
            HealthTotals { calls: 9, successes: 9, ..HealthTotals::default() },
        );
        let e = Evidence { cohort, rest, nacks: 0, rest_instances: 3 };
        let v = super::judge(&Plan::default(), &e);
        let lines: Vec<(&str, bool, bool)> =
            v.subjects.iter().map(|s| (s.name.as_str(), s.judged, s.worse)).collect();
        // Dependencies before routes; a subject only the rest called is shown, not judged;
        // one the cohort called fewer than min_calls times is not judged either.
        assert_eq!(lines, [("pricing", true, true), ("search", false, false), ("GET /", false, false)]);
        assert!(v.health_compared && v.readiness_judged && !v.readiness_worse && !v.nacks_worse);
        assert_eq!(v.reason, halt_reason(&Plan::default(), &e));
        assert!(v.reason.unwrap().starts_with("dependency pricing:"));
        // Nothing runs beside the cohort: nothing judged on health, the reason is NACKs'.
        let alone = super::judge(&Plan::default(), &Evidence { rest_instances: 0, nacks: 1, ..e });
        assert!(!alone.health_compared && alone.subjects.iter().all(|s| !s.judged && !s.worse));
        assert!(alone.nacks_worse && alone.reason.unwrap().contains("NACK"));
    }

    #[test]
    fn a_side_sums_its_revisions() {
        let mut t = RevisionTotals { instance_slots: 2, not_ready_slots: 1, ..Default::default() };
        t.subjects.insert(
            (SubjectKind::Route, "GET /".into()),
            HealthTotals { calls: 3, successes: 3, ..HealthTotals::default() },
        );
        let mut s = Side::default();
        s.add(&t);
        s.add(&t);
        assert_eq!((s.instance_slots, s.not_ready_slots), (4, 2));
        assert_eq!(s.subjects[&(SubjectKind::Route, "GET /".to_string())].calls, 6);
    }
}

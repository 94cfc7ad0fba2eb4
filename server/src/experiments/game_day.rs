//! Game days: an experiment with people in the loop. What it injected is hidden from the
//! players while it runs (`crate::actions::sees_injected`); its report measures the team:
//! when the first person opened the affected service's page (time to detect), when the
//! first lever was pulled and by whom (time to mitigate, from the audit log), and when the
//! hypothesis held again (time to recover), every one from the moment the fault was
//! injected, next to the runbooks of the features the fault hits.

use std::time::Duration;

use levee_agent::policy::{ServiceConfig, Timestamp, duration};
use serde::Serialize;

use super::judge::Reading;
use super::report::TimelineEvent;
use super::spec::ExperimentSpec;
use crate::actions::LEVER_ACTIONS;
use crate::db::{AuditFilter, AuditOutcome, AuditRow, ExperimentRow, GameDayView, Reader};

/// Most audit rows of one lever action read for a game day (its first is what counts).
const LEVER_ROWS: i64 = 1000;

/// A person's first look at the service.
#[derive(Clone, Debug, PartialEq, Serialize, utoipa::ToSchema)]
pub struct Looked {
    #[serde(with = "levee_agent::policy::rfc3339")]
    #[schema(value_type = String, format = DateTime)]
    pub at: i64,
    pub by: String,
}

/// A lever pulled during the game day: an audit row.
#[derive(Clone, Debug, PartialEq, Serialize, utoipa::ToSchema)]
pub struct Lever {
    #[serde(with = "levee_agent::policy::rfc3339")]
    #[schema(value_type = String, format = DateTime)]
    pub at: i64,
    pub by: String,
    /// The audit row's action: `flag.set`, `breaker.override`, `profile.apply`,
    /// `request.apply`.
    pub action: String,
    /// What it changed (the flag key, the dependency, the profile).
    pub target: String,
    /// The audit row's id.
    pub audit_id: i64,
}

/// The runbook of a feature the fault hits: a degradation-matrix row naming the faulted
/// dependency.
#[derive(Clone, Debug, PartialEq, Serialize, utoipa::ToSchema)]
pub struct Runbook {
    pub feature: String,
    pub owner: String,
    /// Empty when the row names none.
    pub runbook: String,
    /// Where the degradation decision is recorded.
    pub decision: String,
}

/// How fast the team reacted. Every time is counted from `injected_at`; `null` when it
/// has not happened (yet).
#[derive(Clone, Debug, PartialEq, Serialize, utoipa::ToSchema)]
pub struct GameDayReport {
    #[serde(with = "levee_agent::policy::rfc3339::option")]
    #[schema(value_type = Option<String>, format = DateTime)]
    pub injected_at: Option<i64>,
    /// The first person other than the starter to open the service's page after the fault
    /// was injected.
    pub first_look: Option<Looked>,
    /// Everyone's first look, earliest first.
    pub looks: Vec<Looked>,
    /// The first lever pulled on the service (or an emergency profile applied to its
    /// environment) after the fault was injected.
    pub first_lever: Option<Lever>,
    /// Every lever pulled, oldest first.
    pub levers: Vec<Lever>,
    /// The first reading, from the injection on, at which a probe was violated.
    #[serde(with = "levee_agent::policy::rfc3339::option")]
    #[schema(value_type = Option<String>, format = DateTime)]
    pub first_violation_at: Option<i64>,
    /// The first reading after that at which no probe was violated and at least one held.
    #[serde(with = "levee_agent::policy::rfc3339::option")]
    #[schema(value_type = Option<String>, format = DateTime)]
    pub recovered_at: Option<i64>,
    /// `first_look` − `injected_at` (a duration, `"12s 345ms"`).
    #[serde(with = "levee_agent::policy::duration::option")]
    #[schema(value_type = Option<String>, example = "12s 345ms")]
    pub time_to_detect: Option<Duration>,
    /// `first_lever` − `injected_at` (a duration, `"12s 345ms"`).
    #[serde(with = "levee_agent::policy::duration::option")]
    #[schema(value_type = Option<String>, example = "12s 345ms")]
    pub time_to_mitigate: Option<Duration>,
    /// `recovered_at` − `injected_at` (a duration, `"12s 345ms"`).
    #[serde(with = "levee_agent::policy::duration::option")]
    #[schema(value_type = Option<String>, example = "12s 345ms")]
    pub time_to_recover: Option<Duration>,
    /// The runbooks of the features whose dependency the fault hit.
    pub runbooks: Vec<Runbook>,
    /// The above in words, a line each (what `levee experiment get` prints).
    pub summary: Vec<String>,
}

/// The report of game day `e` from the people's first looks, the audit rows of levers in
/// its environment since the injection (any order), its readings and the service's
/// configuration. Pure.
pub fn compute(
    e: &ExperimentRow,
    spec: Option<&ExperimentSpec>,
    looks: &[GameDayView],
    audit: &[AuditRow],
    readings: &[Reading],
    cfg: Option<&ServiceConfig>,
) -> GameDayReport {
    let injected = e.injected_at;
    let end = e.ended_at.unwrap_or(i64::MAX);
    let during = |at: i64| injected.is_some_and(|i| at >= i && at <= end);
    let looks: Vec<Looked> = looks
        .iter()
        .filter(|v| during(v.at) && v.viewer != e.created_by)
        .map(|v| Looked { at: v.at, by: v.viewer.clone() })
        .collect();
    let mut levers: Vec<Lever> = audit
        .iter()
        .filter(|a| {
            during(a.at) && a.outcome == AuditOutcome::Ok && LEVER_ACTIONS.contains(&a.action.as_str())
        })
        .filter(|a| a.environment.as_deref() == Some(e.environment.as_str()))
        .filter(|a| match a.service.as_deref() {
            Some(s) => s == e.service,
            // An emergency profile is applied to the whole environment.
            None => a.action == "profile.apply",
        })
        .map(|a| Lever {
            at: a.at,
            by: a.actor.clone(),
            action: a.action.clone(),
            target: a.target.clone(),
            audit_id: a.id,
        })
        .collect();
    levers.sort_by_key(|l| (l.at, l.audit_id));
    let mut first_violation_at = None;
    let mut recovered_at = None;
    for r in readings.iter().filter(|r| during(r.at)) {
        let violated = !r.violated().is_empty();
        match first_violation_at {
            None if violated => first_violation_at = Some(r.at),
            Some(_) if !violated && r.holds.contains(&Some(true)) => {
                recovered_at = Some(r.at);
                break;
            }
            _ => {}
        }
    }
    let since = |at: Option<i64>| at.zip(injected).map(|(a, i)| Duration::from_millis((a - i).max(0) as u64));
    let runbooks = match (spec, cfg) {
        (Some(spec), Some(cfg)) => cfg
            .policy
            .degradation_matrix
            .iter()
            .filter(|row| row.dependencies.contains(&spec.fault.dependency))
            .map(|row| Runbook {
                feature: row.feature.clone(),
                owner: row.owner.clone(),
                runbook: row.runbook.clone(),
                decision: row.decision.clone(),
            })
            .collect(),
        _ => Vec::new(),
    };
    let mut r = GameDayReport {
        injected_at: injected,
        time_to_detect: since(looks.first().map(|l| l.at)),
        time_to_mitigate: since(levers.first().map(|l| l.at)),
        time_to_recover: since(recovered_at),
        first_look: looks.first().cloned(),
        first_lever: levers.first().cloned(),
        looks,
        levers,
        first_violation_at,
        recovered_at,
        runbooks,
        summary: Vec::new(),
    };
    r.summary = summary(&r);
    r
}

/// The report in words: the three times with who did what, then the runbooks.
fn summary(r: &GameDayReport) -> Vec<String> {
    let time = |d: Option<Duration>| d.map_or_else(|| "not yet".to_string(), duration::format);
    let at = |ms: i64| Timestamp::from_unix_ms(ms).to_string();
    let mut out = Vec::new();
    if r.injected_at.is_none() {
        out.push("game day: nothing injected yet; the times count from the injection".to_string());
    }
    let look =
        r.first_look.as_ref().map(|l| format!(" ({} opened the service's page at {})", l.by, at(l.at)));
    out.push(format!("time to detect   {}{}", time(r.time_to_detect), look.unwrap_or_default()));
    let lever =
        r.first_lever.as_ref().map(|l| format!(" ({}: {} of {} at {})", l.by, l.action, l.target, at(l.at)));
    out.push(format!("time to mitigate {}{}", time(r.time_to_mitigate), lever.unwrap_or_default()));
    let held = match (r.recovered_at, r.first_violation_at) {
        (Some(t), _) => format!(" (the hypothesis held again at {})", at(t)),
        (None, None) if r.injected_at.is_some() => " (the hypothesis has not been violated)".to_string(),
        _ => String::new(),
    };
    out.push(format!("time to recover  {}{held}", time(r.time_to_recover)));
    for b in &r.runbooks {
        let owner = if b.owner.is_empty() { "no owner recorded" } else { &b.owner };
        let book = if b.runbook.is_empty() { "no runbook recorded" } else { &b.runbook };
        out.push(format!("runbook of {} ({owner}): {book}", b.feature));
    }
    out
}

/// The report of game day `e` as stored now (see [`compute`]).
///
/// # Errors
/// The store could not be read.
pub async fn report(
    store: &Reader,
    e: &ExperimentRow,
    spec: Option<&ExperimentSpec>,
    readings: &[Reading],
) -> anyhow::Result<GameDayReport> {
    let looks = store.game_day_views(e.id).await?;
    let mut audit = Vec::new();
    if let Some(since) = e.injected_at {
        for action in LEVER_ACTIONS {
            let f = AuditFilter {
                environment: Some(e.environment.clone()),
                since: Some(since),
                until: e.ended_at,
                limit: LEVER_ROWS,
                action: Some(action.to_string()),
                ..Default::default()
            };
            audit.extend(store.audit(&f).await?);
        }
    }
    let cfg = store.latest_snapshot(&e.environment, &e.service).await?.and_then(|s| s.config().ok());
    Ok(compute(e, spec, &looks, &audit, readings, cfg.as_ref()))
}

/// A game day's moments in its timeline (`report.timeline`): each person's first look
/// (`looked`), each lever pulled (`lever`) and the hypothesis holding again (`recovered`).
pub fn moments(g: &GameDayReport, out: &mut Vec<TimelineEvent>) {
    let ev = |at: i64, event: &str, by: Option<&str>, detail: String| TimelineEvent {
        at,
        event: event.into(),
        by: by.map(Into::into),
        detail,
    };
    for l in &g.looks {
        out.push(ev(l.at, "looked", Some(&l.by), "opened the service's page".into()));
    }
    for l in &g.levers {
        out.push(ev(
            l.at,
            "lever",
            Some(&l.by),
            format!("{} {} (audit row {})", l.action, l.target, l.audit_id),
        ));
    }
    if let Some(at) = g.recovered_at {
        out.push(ev(at, "recovered", None, "the hypothesis held again".into()));
    }
    out.sort_by_key(|t| t.at);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::experiments::Phase;

    fn row() -> ExperimentRow {
        ExperimentRow {
            id: 7,
            environment: "prod".into(),
            service: "checkout".into(),
            created_by: "admin".into(),
            injected_at: Some(10_000),
            ended_at: Some(100_000),
            ..Default::default()
        }
    }

    fn audit(id: i64, at: i64, action: &str, service: Option<&str>, outcome: AuditOutcome) -> AuditRow {
        AuditRow {
            id,
            at,
            actor: format!("user{id}"),
            action: action.into(),
            environment: Some("prod".into()),
            service: service.map(Into::into),
            target: "recommendations.enabled".into(),
            outcome,
            ..Default::default()
        }
    }

    fn reading(at: i64, holds: Vec<Option<bool>>) -> Reading {
        Reading { at, phase: Phase::Injected, values: vec![None; holds.len()], holds }
    }

    /// The first look by someone other than the starter, the first lever of the service
    /// or its environment's profile, and the first reading with nothing violated after the
    /// first violation, each from the injection; what falls outside the game day is not
    /// counted.
    #[test]
    fn detect_mitigate_recover_are_counted_from_the_injection() {
        let looks = [
            GameDayView { viewer: "early".into(), at: 9_000 },
            GameDayView { viewer: "admin".into(), at: 11_000 },
            GameDayView { viewer: "bob".into(), at: 14_000 },
            GameDayView { viewer: "carol".into(), at: 15_000 },
        ];
        let rows = [
            audit(1, 9_500, "flag.set", Some("checkout"), AuditOutcome::Ok),
            audit(2, 16_000, "flag.set", Some("other"), AuditOutcome::Ok),
            audit(3, 17_000, "flag.set", Some("checkout"), AuditOutcome::Rejected),
            audit(5, 21_000, "flag.set", Some("checkout"), AuditOutcome::Ok),
            audit(4, 19_000, "profile.apply", None, AuditOutcome::Ok),
            audit(6, 20_000, "fault.set", Some("checkout"), AuditOutcome::Ok),
        ];
        let readings = [
            reading(10_500, vec![Some(true), None]),
            reading(12_000, vec![Some(false), None]),
            reading(13_000, vec![None, None]),
            reading(22_000, vec![None, Some(true)]),
            reading(23_000, vec![Some(true), Some(true)]),
        ];
        let r = compute(&row(), None, &looks, &rows, &readings, None);
        assert_eq!(r.first_look, Some(Looked { at: 14_000, by: "bob".into() }));
        assert_eq!(r.looks.len(), 2);
        let first = r.first_lever.clone().unwrap();
        assert_eq!((first.at, first.action.as_str(), first.by.as_str()), (19_000, "profile.apply", "user4"));
        assert_eq!(r.levers.iter().map(|l| l.audit_id).collect::<Vec<_>>(), [4, 5]);
        assert_eq!((r.first_violation_at, r.recovered_at), (Some(12_000), Some(22_000)));
        let s = Duration::from_secs;
        assert_eq!(
            (r.time_to_detect, r.time_to_mitigate, r.time_to_recover),
            (Some(s(4)), Some(s(9)), Some(s(12)))
        );
        assert_eq!(
            r.summary[0],
            "time to detect   4s (bob opened the service's page at 1970-01-01T00:00:14.000Z)"
        );
        assert_eq!(
            r.summary[1],
            "time to mitigate 9s (user4: profile.apply of recommendations.enabled at 1970-01-01T00:00:19.000Z)"
        );
    }

    /// Before the fault is injected nothing is measured; a hypothesis never violated
    /// never "recovers".
    #[test]
    fn nothing_is_measured_before_the_injection_or_without_a_violation() {
        let mut e = row();
        e.injected_at = None;
        let looks = [GameDayView { viewer: "bob".into(), at: 14_000 }];
        let rows = [audit(1, 15_000, "flag.set", Some("checkout"), AuditOutcome::Ok)];
        let r = compute(&e, None, &looks, &rows, &[reading(12_000, vec![Some(false)])], None);
        assert_eq!((r.first_look, r.first_lever, r.first_violation_at), (None, None, None));
        let r = compute(&row(), None, &[], &[], &[reading(12_000, vec![Some(true)])], None);
        assert_eq!((r.first_violation_at, r.recovered_at, r.time_to_recover), (None, None, None));
        assert_eq!(r.summary[2], "time to recover  not yet (the hypothesis has not been violated)");
    }
}

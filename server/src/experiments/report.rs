//! An experiment's report from its stored row and readings: the probes in words, the
//! readings, and the timeline of what happened. The API serves it; the console draws it.

use std::collections::BTreeSet;

use serde::Serialize;
use serde_json::Value;

use super::judge::{Phase, Reading};
use super::spec::ExperimentSpec;
use crate::db::{ExperimentReadingRow, ExperimentRow};

/// One moment of an experiment's timeline.
#[derive(Clone, Debug, PartialEq, Serialize, utoipa::ToSchema)]
pub struct TimelineEvent {
    #[serde(with = "levee_agent::policy::rfc3339")]
    #[schema(value_type = String, format = DateTime)]
    pub at: i64,
    /// `started`, `injected`, `violated` (a probe's first violated reading of a phase),
    /// `stop_requested`, `fault_removed`, `ended`; a game day's `looked` (a person's first
    /// view of the service's page), `lever` (a lever pulled) and `recovered`.
    pub event: String,
    /// Who, for `started` and `stop_requested`.
    pub by: Option<String>,
    /// What, in words.
    pub detail: String,
}

/// What a report holds beside the experiment itself.
#[derive(Clone, Debug)]
pub struct Report {
    /// The spec as stored (`None` if this server cannot read it).
    pub spec: Option<ExperimentSpec>,
    /// The probes in words, in the order of each reading's values.
    pub probes: Vec<String>,
    /// Every reading, oldest first.
    pub readings: Vec<Reading>,
    pub timeline: Vec<TimelineEvent>,
}

/// The phase a stored reading names.
///
/// # Errors
/// A word no phase has, naming the column.
pub fn parse_phase(word: &str) -> anyhow::Result<Phase> {
    [Phase::Baseline, Phase::Injected, Phase::Recovery]
        .into_iter()
        .find(|p| p.as_str() == word)
        .ok_or_else(|| anyhow::anyhow!("experiment_readings.phase {word:?} is not one this server knows"))
}

/// The report of experiment `e` with its stored `readings`.
///
/// # Errors
/// A stored reading this server cannot read (its phase or its body).
pub fn report(e: &ExperimentRow, readings: Vec<ExperimentReadingRow>) -> anyhow::Result<Report> {
    let spec: Option<ExperimentSpec> = serde_json::from_str(&e.spec).ok();
    let probes: Vec<String> = spec.iter().flat_map(|s| s.hypothesis.iter().map(|p| p.describe())).collect();
    let readings = readings
        .into_iter()
        .map(|r| {
            let body: Value = serde_json::from_str(&r.reading)?;
            let part = |k: &str| body.get(k).cloned().unwrap_or(Value::Null);
            Ok(Reading {
                at: r.at,
                phase: parse_phase(&r.phase)?,
                values: serde_json::from_value(part("values"))?,
                holds: serde_json::from_value(part("holds"))?,
            })
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    let timeline = timeline(e, &probes, &readings);
    Ok(Report { spec, probes, readings, timeline })
}

/// The experiment's moments, in time order: from its row, and the first violated reading
/// of each probe in each phase.
fn timeline(e: &ExperimentRow, probes: &[String], readings: &[Reading]) -> Vec<TimelineEvent> {
    let ev = |at: i64, event: &str, by: Option<&str>, detail: String| TimelineEvent {
        at,
        event: event.into(),
        by: by.map(Into::into),
        detail,
    };
    let mut out = vec![ev(e.created_at, "started", Some(&e.created_by), e.reason.clone())];
    if let Some(at) = e.injected_at {
        let on = e.instances.as_deref().unwrap_or("[]");
        out.push(ev(at, "injected", None, format!("fault set on instances {on}")));
    }
    let mut seen = BTreeSet::new();
    for r in readings {
        for i in r.violated() {
            if seen.insert((i, r.phase)) {
                let what = probes.get(i).cloned().unwrap_or_default();
                let value = r.values.get(i).cloned().flatten().map(|v| v.to_string()).unwrap_or_default();
                out.push(ev(r.at, "violated", None, format!("{what}: {value}")));
            }
        }
    }
    if let (Some(at), Some(by)) = (e.stop_requested_at, &e.stop_requested_by) {
        out.push(ev(at, "stop_requested", Some(by), e.stop_reason.clone().unwrap_or_default()));
    }
    if let Some(at) = e.fault_removed_at {
        out.push(ev(at, "fault_removed", None, "fault rule removed".into()));
    }
    if let Some(at) = e.ended_at {
        let verdict = e.verdict.clone().unwrap_or_default();
        out.push(ev(at, "ended", None, format!("{verdict}: {}", e.why.clone().unwrap_or_default())));
    }
    out.sort_by_key(|t| t.at);
    out
}

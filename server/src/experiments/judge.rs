//! Judging the steady-state hypothesis: what each probe's reading means (holds, violated,
//! or no data), the abort rule (violated without a break for `abort_after`), and the
//! verdict. Pure functions over readings, so the rules are tested without a server.

use std::time::Duration;

use levee_agent::policy::FallbackLevel;
use serde::{Deserialize, Serialize};

use super::spec::{ExperimentSpec, Probe};

/// Where in the experiment a reading was taken.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, utoipa::ToSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    /// Before anything is injected.
    Baseline,
    /// While the fault is injected.
    Injected,
    /// After the fault ended.
    Recovery,
}

impl Phase {
    /// The word of the phase (as serde writes it, and as readings are stored).
    pub const fn as_str(self) -> &'static str {
        match self {
            Phase::Baseline => "baseline",
            Phase::Injected => "injected",
            Phase::Recovery => "recovery",
        }
    }
}

/// One reading of every probe, in the hypothesis' order.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Reading {
    /// When, ms since the epoch (served as RFC 3339).
    #[serde(with = "levee_agent::policy::rfc3339")]
    #[schema(value_type = String, format = DateTime)]
    pub at: i64,
    pub phase: Phase,
    /// Each probe's value: success rate in percent, p99 in ms, the worst feature level (its
    /// word), instances not ready; `null` when the agents reported nothing to judge.
    #[schema(value_type = Vec<Option<serde_json::Value>>)]
    pub values: Vec<Option<serde_json::Value>>,
    /// Each probe: held (`true`), violated (`false`), no data (`null`).
    pub holds: Vec<Option<bool>>,
}

/// What the agents reported for one probe at one instant (read by `measure.rs`).
#[derive(Clone, Debug, PartialEq)]
pub enum Observed {
    /// Nothing to judge: no call, no instance reporting the feature.
    Nothing,
    /// Share of calls answered with success, percent.
    SuccessRate(f64),
    /// p99 latency, ms.
    P99Ms(f64),
    /// The worst level any instance serves the feature at.
    Level(String),
    /// Instances that said they were not ready, of those reporting.
    NotReady { not_ready: u64, instances: u64 },
}

/// Whether `observed` satisfies `probe`; `None` when there is nothing to judge.
pub fn holds(probe: &Probe, observed: &Observed) -> Option<bool> {
    match (probe, observed) {
        (_, Observed::Nothing) => None,
        (Probe::SuccessRate { at_least, .. }, Observed::SuccessRate(v)) => Some(*v >= *at_least),
        (Probe::P99 { at_most, .. }, Observed::P99Ms(v)) => Some(*v <= at_most.as_secs_f64() * 1000.0),
        (Probe::FeatureLevel { at_least, .. }, Observed::Level(l)) => {
            // An unknown word (an agent's UNRECOGNIZED) is not a level that holds; a better
            // level orders first.
            let (seen, wanted) = (FallbackLevel::parse(l), FallbackLevel::parse(at_least));
            Some(seen.zip(wanted).is_some_and(|(seen, wanted)| seen <= wanted))
        }
        (Probe::Ready(_), Observed::NotReady { instances: 0, .. }) => None,
        (Probe::Ready(_), Observed::NotReady { not_ready, .. }) => Some(*not_ready == 0),
        // A reading of another kind than the probe: nothing that can be judged.
        _ => None,
    }
}

/// The value of `observed` as shown in a reading.
pub fn value(observed: &Observed) -> Option<serde_json::Value> {
    let round = |v: f64| (v * 1000.0).round() / 1000.0;
    match observed {
        Observed::Nothing => None,
        Observed::SuccessRate(v) | Observed::P99Ms(v) => Some(serde_json::json!(round(*v))),
        Observed::Level(l) => Some(serde_json::json!(l)),
        Observed::NotReady { not_ready, .. } => Some(serde_json::json!(not_ready)),
    }
}

/// The reading of every probe of `spec` from what was observed.
pub fn reading(spec: &ExperimentSpec, at: i64, phase: Phase, observed: &[Observed]) -> Reading {
    let holds = spec.hypothesis.iter().zip(observed).map(|(p, o)| holds(p, o)).collect();
    Reading { at, phase, values: observed.iter().map(value).collect(), holds }
}

impl Reading {
    /// The probes this reading found violated (their indexes).
    pub fn violated(&self) -> Vec<usize> {
        self.holds.iter().enumerate().filter(|(_, h)| **h == Some(false)).map(|(i, _)| i).collect()
    }
}

/// Whether the baseline allows injecting: every probe had data and no reading of the
/// baseline violated it. `Err` says why not, in words.
pub fn baseline_ok(spec: &ExperimentSpec, readings: &[Reading]) -> Result<(), String> {
    let base: Vec<&Reading> = readings.iter().filter(|r| r.phase == Phase::Baseline).collect();
    for (i, probe) in spec.hypothesis.iter().enumerate() {
        if let Some(r) = base.iter().find(|r| r.holds.get(i) == Some(&Some(false))) {
            return Err(format!(
                "the hypothesis did not hold before injecting: {} was {} — nothing was injected",
                probe.describe(),
                shown(r.values.get(i).cloned().flatten())
            ));
        }
        if !base.iter().any(|r| r.holds.get(i).is_some_and(Option::is_some)) {
            return Err(format!(
                "no data for {} before injecting (no instance reported it) — nothing was injected",
                probe.describe()
            ));
        }
    }
    Ok(())
}

fn shown(v: Option<serde_json::Value>) -> String {
    match v {
        Some(serde_json::Value::String(s)) => s,
        Some(v) => v.to_string(),
        None => "unknown".into(),
    }
}

/// The abort rule while the fault is injected: the hypothesis violated (any probe) at
/// every reading for `abort_after`, without a reading in between where it held. A
/// reading with no data neither breaks nor extends a run of violations.
#[derive(Clone, Debug)]
pub struct AbortRule {
    abort_after: Duration,
    violated_since: Option<i64>,
}

impl AbortRule {
    pub fn new(abort_after: Duration) -> AbortRule {
        AbortRule { abort_after, violated_since: None }
    }

    /// Takes a reading; `Some(why)` when the experiment must abort now.
    pub fn observe(&mut self, spec: &ExperimentSpec, r: &Reading) -> Option<String> {
        let violated = r.violated();
        let all_held = r.holds.iter().all(|h| *h == Some(true));
        if violated.is_empty() {
            if all_held {
                self.violated_since = None;
            }
            return None;
        }
        let since = *self.violated_since.get_or_insert(r.at);
        let lasted = Duration::from_millis((r.at - since).max(0) as u64);
        (lasted >= self.abort_after).then(|| {
            let what: Vec<String> = violated
                .iter()
                .map(|&i| format!("{} was {}", spec.hypothesis[i].describe(), shown(r.values[i].clone())))
                .collect();
            format!(
                "the hypothesis was violated for {} (abort after {}): {}",
                levee_agent::policy::duration::format(lasted),
                levee_agent::policy::duration::format(self.abort_after),
                what.join("; ")
            )
        })
    }
}

/// How an experiment ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    /// The hypothesis held while the fault was injected and after.
    Passed,
    /// It was violated, not long enough to abort, or it did not hold again after.
    Failed,
    /// Ended early: the hypothesis was violated for `abort_after`, someone stopped it,
    /// it could not start (baseline, blast radius), or the server running it stopped.
    Aborted,
}

impl Verdict {
    pub fn as_str(self) -> &'static str {
        match self {
            Verdict::Passed => "passed",
            Verdict::Failed => "failed",
            Verdict::Aborted => "aborted",
        }
    }
}

/// The verdict of an experiment that ran its whole course, with why.
pub fn verdict(spec: &ExperimentSpec, readings: &[Reading]) -> (Verdict, String) {
    let during: Vec<&Reading> = readings.iter().filter(|r| r.phase == Phase::Injected).collect();
    for (i, probe) in spec.hypothesis.iter().enumerate() {
        if let Some(r) = during.iter().find(|r| r.holds.get(i) == Some(&Some(false))) {
            let n = during.iter().filter(|r| r.holds.get(i) == Some(&Some(false))).count();
            return (
                Verdict::Failed,
                format!(
                    "{} was violated during the fault ({} of {} readings; first {}), not long enough to abort",
                    probe.describe(),
                    n,
                    during.len(),
                    shown(r.values[i].clone())
                ),
            );
        }
    }
    // Each probe is judged after the fault on the last reading that had data for it: a
    // reading whose period no instance reported in says nothing, and must neither pass
    // nor fail the recovery.
    let after: Vec<&Reading> = readings.iter().filter(|r| r.phase == Phase::Recovery).collect();
    let mut unmeasured = Vec::new();
    for (i, probe) in spec.hypothesis.iter().enumerate() {
        match after.iter().rev().find(|r| r.holds.get(i).is_some_and(Option::is_some)) {
            Some(r) if r.holds[i] == Some(false) => {
                return (
                    Verdict::Failed,
                    format!(
                        "the hypothesis did not hold again after the fault: {} was {}",
                        probe.describe(),
                        shown(r.values[i].clone())
                    ),
                );
            }
            Some(_) => {}
            None if !after.is_empty() => unmeasured.push(probe.describe()),
            None => {}
        }
    }
    let judged: usize = during.iter().filter(|r| r.holds.iter().any(Option::is_some)).count();
    let mut why = format!("the hypothesis held at each of {judged} readings during the fault and after it");
    if !unmeasured.is_empty() {
        why.push_str(&format!(
            "; not measured after the fault (no instance reported it then): {}",
            unmeasured.join(", ")
        ));
    }
    (Verdict::Passed, why)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec() -> ExperimentSpec {
        serde_saphyr::from_str(
            r#"
name: e
environment: prod
service: checkout
fault: {dependency: recommendations, action: {type: delay, delay: 2s}}
duration: 30s
abort_after: 3s
hypothesis:
  - success_rate: {route: "/checkout/{user}", at_least: 99}
  - p99: {route: "/checkout/{user}", at_most: 300ms}
  - feature_level: {feature: recommendations, at_least: GENERIC}
  - ready: true
"#,
        )
        .unwrap()
    }

    fn good() -> Vec<Observed> {
        vec![
            Observed::SuccessRate(100.0),
            Observed::P99Ms(50.0),
            Observed::Level("FRESH".into()),
            Observed::NotReady { not_ready: 0, instances: 2 },
        ]
    }

    #[test]
    fn each_probe_is_judged_on_its_reading() {
        let s = spec();
        let r = reading(&s, 0, Phase::Baseline, &good());
        assert_eq!(r.holds, vec![Some(true); 4]);
        let bad = vec![
            Observed::SuccessRate(98.9),
            Observed::P99Ms(300.1),
            Observed::Level("EMPTY_MARKED".into()),
            Observed::NotReady { not_ready: 1, instances: 2 },
        ];
        assert_eq!(reading(&s, 0, Phase::Injected, &bad).violated(), vec![0, 1, 2, 3]);
        let none = vec![
            Observed::Nothing,
            Observed::Nothing,
            Observed::Nothing,
            Observed::NotReady { not_ready: 0, instances: 0 },
        ];
        assert_eq!(reading(&s, 0, Phase::Injected, &none).holds, vec![None; 4]);
        assert_eq!(holds(&s.hypothesis[2], &Observed::Level("GENERIC".into())), Some(true));
        assert_eq!(holds(&s.hypothesis[2], &Observed::Level("UNRECOGNIZED".into())), Some(false));
    }

    /// A baseline that fails, or has no data for a probe, injects nothing, and says why.
    #[test]
    fn the_baseline_must_hold_with_data_for_every_probe() {
        let s = spec();
        let ok = reading(&s, 0, Phase::Baseline, &good());
        assert_eq!(baseline_ok(&s, std::slice::from_ref(&ok)), Ok(()));
        let mut slow = good();
        slow[1] = Observed::P99Ms(900.0);
        let bad = reading(&s, 1000, Phase::Baseline, &slow);
        let why = baseline_ok(&s, &[ok.clone(), bad]).unwrap_err();
        assert!(why.contains("p99 of route /checkout/{user} <= 300ms was 900"), "{why}");
        assert!(why.contains("nothing was injected"), "{why}");
        let mut quiet = good();
        quiet[0] = Observed::Nothing;
        let why = baseline_ok(&s, &[reading(&s, 0, Phase::Baseline, &quiet)]).unwrap_err();
        assert!(why.starts_with("no data for success rate"), "{why}");
    }

    /// Aborts once violated for abort_after without a break; a reading that held resets
    /// the run, one with no data does not.
    #[test]
    fn the_abort_rule_wants_an_unbroken_run_of_violations() {
        let s = spec();
        let mut slow = good();
        slow[1] = Observed::P99Ms(2000.0);
        let mut nothing = good();
        nothing[1] = Observed::Nothing;
        let mut rule = AbortRule::new(Duration::from_secs(3));
        let at = |ms: i64, o: &[Observed]| reading(&s, ms, Phase::Injected, o);
        assert_eq!(rule.observe(&s, &at(0, &slow)), None);
        assert_eq!(rule.observe(&s, &at(2000, &good())), None); // held: the run restarts
        assert_eq!(rule.observe(&s, &at(3000, &slow)), None);
        assert_eq!(rule.observe(&s, &at(4000, &nothing)), None); // no data: no break
        assert_eq!(rule.observe(&s, &at(5000, &slow)), None);
        let why = rule.observe(&s, &at(6000, &slow)).unwrap();
        assert!(why.contains("violated for 3s (abort after 3s)"), "{why}");
        assert!(why.contains("p99 of route /checkout/{user} <= 300ms was 2000"), "{why}");
        // abort_after 0: the first violated reading aborts.
        assert!(AbortRule::new(Duration::ZERO).observe(&s, &at(0, &slow)).is_some());
    }

    #[test]
    fn the_verdict_says_why() {
        let s = spec();
        let base = reading(&s, 0, Phase::Baseline, &good());
        let during = reading(&s, 1000, Phase::Injected, &good());
        let after = reading(&s, 2000, Phase::Recovery, &good());
        let (v, why) = verdict(&s, &[base.clone(), during.clone(), after.clone()]);
        assert_eq!(v, Verdict::Passed, "{why}");
        let mut blip = good();
        blip[0] = Observed::SuccessRate(90.0);
        let (v, why) = verdict(&s, &[base.clone(), reading(&s, 1000, Phase::Injected, &blip), after]);
        assert_eq!(v, Verdict::Failed);
        assert!(why.contains("1 of 1 readings; first 90"), "{why}");
        let (v, why) =
            verdict(&s, &[base.clone(), during.clone(), reading(&s, 2000, Phase::Recovery, &blip)]);
        assert_eq!(v, Verdict::Failed);
        assert!(why.contains("did not hold again after"), "{why}");
        // A last reading without data (nobody reported in its period) judges nothing: the
        // recovery is judged on the last one that had data, violated or not.
        let mut quiet = good();
        quiet[0] = Observed::Nothing;
        let late = [
            base.clone(),
            during.clone(),
            reading(&s, 2000, Phase::Recovery, &blip),
            reading(&s, 3000, Phase::Recovery, &quiet),
        ];
        let (v, why) = verdict(&s, &late);
        assert_eq!(v, Verdict::Failed, "{why}");
        assert!(why.contains("did not hold again after"), "{why}");
        let recovered = [base.clone(), during.clone(), reading(&s, 2000, Phase::Recovery, &quiet)];
        let (v, why) = verdict(&s, &recovered);
        assert_eq!(v, Verdict::Passed, "{why}");
        assert!(why.contains("not measured after the fault"), "{why}");
        let (v, why) = verdict(&s, &[base, during, reading(&s, 2000, Phase::Recovery, &good())]);
        assert_eq!(v, Verdict::Passed);
        assert!(!why.contains("not measured"), "{why}");
    }
}

//! What an experiment is: its target, fault, blast radius, duration and steady-state
//! hypothesis, as written in a file or a request body, and the checks of its ranges.

use std::time::Duration;

use levee_agent::policy::{FallbackLevel, FaultAction, FieldError, check_name, duration};
use serde::{Deserialize, Serialize};

/// Longest fault an experiment injects.
pub const MAX_DURATION: Duration = Duration::from_secs(3600);
/// Shortest fault an experiment injects.
pub const MIN_DURATION: Duration = Duration::from_secs(1);
/// Longest baseline or recovery measurement.
pub const MAX_PHASE: Duration = Duration::from_secs(600);
/// Most probes in a hypothesis.
pub const MAX_PROBES: usize = 16;
/// Longest description, in bytes.
pub const MAX_DESCRIPTION: usize = 1000;

/// An experiment as submitted (`levee experiment run FILE`, `POST .../experiments`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ExperimentSpec {
    /// A name for people (the experiment's id is assigned by the server).
    pub name: String,
    /// What it is for.
    #[serde(default)]
    pub description: String,
    pub environment: String,
    pub service: String,
    /// The fault injected: a fault rule of the service, set by the experiment.
    pub fault: FaultSpec,
    /// Which instances get the fault.
    #[serde(default)]
    pub blast_radius: BlastRadius,
    /// How long the fault stays injected (1s..=1h); the fault rule expires by itself at the
    /// end of it, so agents end it even if the server is unreachable.
    #[serde(with = "duration")]
    #[schema(value_type = levee_agent::policy::duration::Text, example = "60s")]
    pub duration: Duration,
    /// How long the hypothesis is measured before anything is injected (0..=10min); no
    /// fault is injected unless it held.
    #[serde(with = "duration", default = "default_phase")]
    #[schema(value_type = levee_agent::policy::duration::Text, example = "10s")]
    pub baseline: Duration,
    /// How long it is measured after the fault ended (0..=10min).
    #[serde(with = "duration", default = "default_phase")]
    #[schema(value_type = levee_agent::policy::duration::Text, example = "10s")]
    pub recovery: Duration,
    /// The experiment aborts by itself once the hypothesis has been violated this long
    /// without a break (0s = at the first violated reading; at most `duration`).
    #[serde(with = "duration", default = "default_abort_after")]
    #[schema(value_type = levee_agent::policy::duration::Text, example = "5s")]
    pub abort_after: Duration,
    /// The steady-state hypothesis: every probe must hold (1..=16 probes).
    pub hypothesis: Vec<Probe>,
    /// A game day: people are in the loop. What is injected is hidden from everyone but
    /// its starter and admins until it ends, and the report says how fast the team
    /// looked, pulled a lever and recovered (docs/experiments.md, "Game days").
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub game_day: bool,
}

fn default_phase() -> Duration {
    Duration::from_secs(10)
}

fn default_abort_after() -> Duration {
    Duration::from_secs(5)
}

/// The fault of an experiment: the fields of a fault rule without its id and expiry.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct FaultSpec {
    /// The dependency whose calls are affected.
    pub dependency: String,
    /// The operation affected; absent for all of the dependency's.
    #[serde(default)]
    pub operation: Option<String>,
    pub action: FaultAction,
    /// Share of attempts affected, in percent (0..=100).
    #[serde(default = "hundred")]
    pub percent: f64,
}

fn hundred() -> f64 {
    100.0
}

/// Which instances get the fault, chosen deterministically among those connected when it
/// starts (by a hash of the experiment's id and the instance id). Never every instance
/// unless `all` says so: a choice that would cover them all is refused.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum BlastRadius {
    /// This many instances (at least 1).
    Instances(u32),
    /// This share of the instances, in percent (above 0, below 100), rounded up.
    Percent(f64),
    /// Every instance, said explicitly.
    All(bool),
}

impl Default for BlastRadius {
    fn default() -> Self {
        BlastRadius::Instances(1)
    }
}

impl BlastRadius {
    /// How many of `connected` instances it covers; `Err` says why it cannot be applied.
    pub fn count(&self, connected: usize) -> Result<usize, String> {
        if connected == 0 {
            return Err("no instance of the service is connected".into());
        }
        let n = match *self {
            BlastRadius::All(_) => return Ok(connected),
            BlastRadius::Instances(n) => n as usize,
            BlastRadius::Percent(p) => ((p / 100.0) * connected as f64).ceil() as usize,
        };
        if n >= connected {
            return Err(format!(
                "the blast radius would cover every instance ({n} of {connected} connected); write `blast_radius: {{all: true}}` to allow it"
            ));
        }
        Ok(n.max(1))
    }
}

/// One measure of the steady-state hypothesis, on what the agents report.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum Probe {
    /// Share of calls answered with success (shed and timed-out calls count against it),
    /// in percent, over every instance.
    SuccessRate {
        /// An inbound route template, e.g. `/checkout/{user}` (or `dependency`).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        route: Option<String>,
        /// A dependency (or `route`).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        dependency: Option<String>,
        /// Lowest share that holds, percent (0..=100).
        at_least: f64,
    },
    /// 99th percentile latency (approximated by the agents' latency buckets).
    P99 {
        /// An inbound route template (or `dependency`).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        route: Option<String>,
        /// A dependency (or `route`).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        dependency: Option<String>,
        /// Highest p99 that holds.
        #[serde(with = "duration")]
        #[schema(value_type = levee_agent::policy::duration::Text, example = "300ms")]
        at_most: Duration,
    },
    /// A degradation-matrix feature is served at this level or better on every instance
    /// (FRESH > STALE > GENERIC > EMPTY_MARKED > FEATURE_ERROR).
    FeatureLevel {
        feature: String,
        /// The worst level that holds: a word of `FallbackLevel::as_str`.
        at_least: String,
    },
    /// Every instance that reports says it is ready.
    Ready(bool),
}

/// The route or dependency a probe names (exactly one of them, checked by
/// [`ExperimentSpec::check`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SubjectSpec<'a> {
    pub route: Option<&'a str>,
    pub dependency: Option<&'a str>,
}

/// Longest route template or dependency name a probe may name.
pub const MAX_SUBJECT: usize = 200;

impl Probe {
    /// The route or dependency of a success-rate or p99 probe.
    pub fn subject(&self) -> Option<SubjectSpec<'_>> {
        match self {
            Probe::SuccessRate { route, dependency, .. } | Probe::P99 { route, dependency, .. } => {
                Some(SubjectSpec { route: route.as_deref(), dependency: dependency.as_deref() })
            }
            _ => None,
        }
    }

    /// The probe in words, e.g. `success rate of route /checkout/{user} >= 99 %`.
    pub fn describe(&self) -> String {
        match self {
            Probe::SuccessRate { at_least, .. } => {
                format!(
                    "success rate of {} >= {at_least} %",
                    self.subject().map(|s| s.describe()).unwrap_or_default()
                )
            }
            Probe::P99 { at_most, .. } => format!(
                "p99 of {} <= {}",
                self.subject().map(|s| s.describe()).unwrap_or_default(),
                duration::format(*at_most)
            ),
            Probe::FeatureLevel { feature, at_least } => format!("feature {feature} at {at_least} or better"),
            Probe::Ready(_) => "every instance ready".into(),
        }
    }
}

impl SubjectSpec<'_> {
    /// `route /x` or `dependency y`.
    pub fn describe(&self) -> String {
        match (self.route, self.dependency) {
            (Some(r), _) => format!("route {r}"),
            (None, Some(d)) => format!("dependency {d}"),
            (None, None) => "nothing".into(),
        }
    }

    fn check(&self, path: &str, errors: &mut Vec<FieldError>) {
        match (self.route, self.dependency) {
            (Some(_), Some(_)) | (None, None) => errors.push(err(
                path,
                "",
                "name exactly one of `route` (an inbound route template) or `dependency`",
            )),
            (Some(r), None) => {
                if r.is_empty() || r.len() > MAX_SUBJECT || r.chars().any(char::is_control) {
                    errors.push(err(
                        &format!("{path}.route"),
                        &format!("{r:?}"),
                        &format!("must be a route template of 1..={MAX_SUBJECT} printable characters"),
                    ));
                }
            }
            (None, Some(d)) => {
                if let Err(m) = check_name(d) {
                    errors.push(err(&format!("{path}.dependency"), &format!("{d:?}"), m));
                }
            }
        }
    }
}

fn err(path: &str, value: &str, message: &str) -> FieldError {
    FieldError { path: path.into(), value: value.into(), message: message.into() }
}

impl ExperimentSpec {
    /// Every problem of the spec's ranges, each with its path (empty: it is valid). The
    /// fault's own fields are checked again by the fault rule's validation when it is set.
    pub fn check(&self) -> Vec<FieldError> {
        let mut e = Vec::new();
        for (path, v) in
            [("name", &self.name), ("environment", &self.environment), ("service", &self.service)]
        {
            if let Err(m) = check_name(v) {
                e.push(err(path, &format!("{v:?}"), m));
            }
        }
        if self.description.len() > MAX_DESCRIPTION {
            e.push(err(
                "description",
                &format!("{} bytes", self.description.len()),
                &format!("must be at most {MAX_DESCRIPTION} bytes"),
            ));
        }
        if let Err(m) = check_name(&self.fault.dependency) {
            e.push(err("fault.dependency", &format!("{:?}", self.fault.dependency), m));
        }
        if let Some(op) = &self.fault.operation
            && let Err(m) = check_name(op)
        {
            e.push(err("fault.operation", &format!("{op:?}"), m));
        }
        if !(0.0..=100.0).contains(&self.fault.percent) {
            e.push(err("fault.percent", &self.fault.percent.to_string(), "must be between 0 and 100"));
        }
        match self.blast_radius {
            BlastRadius::Instances(0) => {
                e.push(err("blast_radius.instances", "0", "must be at least 1"));
            }
            BlastRadius::Percent(p) if !(p > 0.0 && p < 100.0) => e.push(err(
                "blast_radius.percent",
                &p.to_string(),
                "must be above 0 and below 100 (write `all: true` for every instance)",
            )),
            BlastRadius::All(false) => {
                e.push(err(
                    "blast_radius.all",
                    "false",
                    "must be true when given (or use `instances` / `percent`)",
                ));
            }
            _ => {}
        }
        let range = |e: &mut Vec<FieldError>, path: &str, d: Duration, lo: Duration, hi: Duration| {
            if d < lo || d > hi {
                e.push(err(
                    path,
                    &duration::format(d),
                    &format!("must be between {} and {}", duration::format(lo), duration::format(hi)),
                ));
            }
        };
        range(&mut e, "duration", self.duration, MIN_DURATION, MAX_DURATION);
        range(&mut e, "baseline", self.baseline, Duration::ZERO, MAX_PHASE);
        range(&mut e, "recovery", self.recovery, Duration::ZERO, MAX_PHASE);
        range(&mut e, "abort_after", self.abort_after, Duration::ZERO, self.duration.max(Duration::ZERO));
        if self.hypothesis.is_empty() || self.hypothesis.len() > MAX_PROBES {
            e.push(err(
                "hypothesis",
                &format!("{} probes", self.hypothesis.len()),
                &format!("must have 1..={MAX_PROBES} probes"),
            ));
        }
        for (i, p) in self.hypothesis.iter().enumerate() {
            let path = format!("hypothesis[{i}]");
            match p {
                Probe::SuccessRate { at_least, .. } => {
                    if let Some(subject) = p.subject() {
                        subject.check(&format!("{path}.success_rate"), &mut e);
                    }
                    if !(0.0..=100.0).contains(at_least) {
                        e.push(err(
                            &format!("{path}.success_rate.at_least"),
                            &at_least.to_string(),
                            "must be between 0 and 100",
                        ));
                    }
                }
                Probe::P99 { at_most, .. } => {
                    if let Some(subject) = p.subject() {
                        subject.check(&format!("{path}.p99"), &mut e);
                    }
                    range(
                        &mut e,
                        &format!("{path}.p99.at_most"),
                        *at_most,
                        Duration::from_millis(1),
                        Duration::from_secs(600),
                    );
                }
                Probe::FeatureLevel { feature, at_least } => {
                    if let Err(m) = check_name(feature) {
                        e.push(err(&format!("{path}.feature_level.feature"), &format!("{feature:?}"), m));
                    }
                    if FallbackLevel::parse(at_least).is_none() {
                        e.push(err(
                            &format!("{path}.feature_level.at_least"),
                            &format!("{at_least:?}"),
                            &format!(
                                "must be one of {}",
                                FallbackLevel::ALL.map(FallbackLevel::as_str).join(", ")
                            ),
                        ));
                    }
                }
                Probe::Ready(false) => {
                    e.push(err(&format!("{path}.ready"), "false", "must be true when given"))
                }
                Probe::Ready(true) => {}
            }
        }
        e
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(yaml: &str) -> ExperimentSpec {
        serde_saphyr::from_str(yaml).unwrap()
    }

    const GOOD: &str = r#"
name: recs-slow
environment: prod
service: checkout
fault: {dependency: recommendations, action: {type: delay, delay: 2s}}
duration: 30s
abort_after: 5s
hypothesis:
  - success_rate: {route: "/checkout/{user}", at_least: 99}
  - p99: {route: "/checkout/{user}", at_most: 300ms}
  - feature_level: {feature: recommendations, at_least: GENERIC}
  - ready: true
"#;

    #[test]
    fn a_spec_reads_from_yaml_with_its_defaults() {
        let s = spec(GOOD);
        assert_eq!(s.check(), vec![]);
        assert_eq!(s.blast_radius, BlastRadius::Instances(1));
        assert_eq!((s.baseline, s.recovery), (Duration::from_secs(10), Duration::from_secs(10)));
        assert_eq!(s.fault.percent, 100.0);
        assert_eq!(s.hypothesis[1].describe(), "p99 of route /checkout/{user} <= 300ms");
        assert_eq!(s.hypothesis[3], Probe::Ready(true));
        // JSON is the same document.
        let json = serde_json::to_string(&s).unwrap();
        assert_eq!(serde_json::from_str::<ExperimentSpec>(&json).unwrap(), s);
    }

    #[test]
    fn every_bad_field_is_named_with_its_range() {
        let mut s = spec(GOOD);
        s.name = "Bad Name".into();
        s.duration = Duration::from_secs(7200);
        s.blast_radius = BlastRadius::Percent(100.0);
        s.hypothesis.push(Probe::SuccessRate {
            route: Some("/a".into()),
            dependency: Some("b".into()),
            at_least: 101.0,
        });
        s.hypothesis.push(Probe::FeatureLevel { feature: "recs".into(), at_least: "GOOD".into() });
        let paths: Vec<String> = s.check().into_iter().map(|e| e.path).collect();
        assert_eq!(
            paths,
            [
                "name",
                "blast_radius.percent",
                "duration",
                "hypothesis[4].success_rate",
                "hypothesis[4].success_rate.at_least",
                "hypothesis[5].feature_level.at_least"
            ]
        );
        let e = serde_saphyr::from_str::<ExperimentSpec>(
            "name: x\nenvironment: p\nservice: s\nfault: {dependency: d, action: {type: delay, delay: 1s}}\nduration: 1s\nhypothesis: []\nextra: 1\n",
        );
        assert!(e.is_err());
    }

    /// Never every instance unless said; a share rounds up; one instance at least.
    #[test]
    fn the_blast_radius_never_covers_every_instance_unless_said() {
        assert_eq!(BlastRadius::Instances(1).count(3), Ok(1));
        assert!(BlastRadius::Instances(1).count(1).unwrap_err().contains("every instance (1 of 1"));
        assert_eq!(BlastRadius::Percent(50.0).count(3), Ok(2));
        assert_eq!(BlastRadius::Percent(10.0).count(4), Ok(1));
        assert!(BlastRadius::Percent(90.0).count(2).is_err());
        assert_eq!(BlastRadius::All(true).count(2), Ok(2));
        assert!(BlastRadius::All(true).count(0).unwrap_err().contains("no instance"));
    }
}

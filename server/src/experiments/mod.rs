//! Experiments (issue 23, article §10): a fault injected into some instances of a service
//! for a while, with a steady-state hypothesis on what the agents report, measured before
//! (baseline), during and after; aborted when the hypothesis is violated for the stated
//! time; ended with a verdict.
//!
//! * `spec.rs`: what an experiment is (target, fault, blast radius, duration, hypothesis)
//!   and the checks of its ranges, each error naming its path;
//! * `judge.rs`: a probe's reading (holds, violated, no data), the baseline rule (nothing is
//!   injected unless every probe held, with data), the abort rule (violated without a
//!   break for `abort_after`) and the verdict with why. Pure;
//! * `measure.rs`: a reading of each probe from the agents' health reports (`crate::health`,
//!   the one source of health) and the fleet's status reports;
//! * `report.rs`: an experiment's report (probes in words, readings, timeline) from what
//!   is stored, for the API and the console;
//! * `run.rs`: one experiment's run on the replica that started it, and the watchdog that
//!   ends the runs of a replica that stopped and starts the scheduled experiments due.
//!
//! Every change an experiment makes is an action (`crate::actions`): its start (roles,
//! approval rules and audit as any change), its fault set and removed as a fault rule of the
//! service under its author's name, its stop and its end. The blast radius reaches the
//! agents as the fault rule's `instances` (`levee_agent::policy::FaultRule::applies_to`),
//! and the rule's `expires_at` ends it on every agent by itself, server or not.

pub mod game_day;
pub mod judge;
pub mod measure;
pub mod report;
pub mod run;
pub mod spec;

use std::time::Duration;

use levee_agent::policy::{FaultRule, Timestamp, ValidationErrors};
use tokio::sync::watch;

pub use judge::{AbortRule, Observed, Phase, Reading, Verdict};
pub use spec::{BlastRadius, ExperimentSpec, FaultSpec, Probe};

use crate::actions::{Actions, Actor, ChangeError, NewExperiment, Reason, Started, experiment_fault_id};
use crate::db::{ChangeKind, RequestRow, Store, now_ms};
use crate::health::Health;

/// How often a run reads the hypothesis.
pub const READING_INTERVAL: Duration = Duration::from_secs(1);

/// This replica's experiments: starts runs, and ends those of a replica that stopped.
/// Cheap to clone.
#[derive(Clone, Debug)]
pub struct Experiments {
    store: Store,
    actions: Actions,
    health: Health,
    shutdown: watch::Receiver<bool>,
    every: Duration,
}

impl Experiments {
    /// The experiments of this replica over `store`, changing through `actions`, reading
    /// `health`; runs end (aborted, their fault removed) once `shutdown` is set.
    pub fn new(
        store: Store,
        actions: Actions,
        health: Health,
        shutdown: watch::Receiver<bool>,
    ) -> Experiments {
        Experiments { store, actions, health, shutdown, every: READING_INTERVAL }
    }

    /// Starts experiment `spec` as `by` (an action: role, approval rules, audit) and runs
    /// it on this replica. Returns at once ([`Started::Running`] with its id: the run
    /// measures the baseline first); where the environment's approval rules cover
    /// experiments, nothing starts: [`Started::Pending`] with the change request proposing
    /// it ([`Experiments::apply_request`] starts it once approved).
    ///
    /// # Errors
    /// [`ChangeError::Invalid`] with every bad field of the spec (the fault's as the
    /// service's configuration would take it, under `fault.`); what
    /// [`Actions::start_experiment`] refuses.
    pub async fn start(
        &self,
        by: &Actor,
        reason: &Reason,
        spec: ExperimentSpec,
    ) -> Result<Started, ChangeError> {
        let new = new_experiment(&spec)?;
        let started = self.actions.start_experiment(by, reason, &new).await?;
        if let Started::Running(id) = started {
            tokio::spawn(run::run(self.clone(), id, spec));
        }
        Ok(started)
    }

    /// Applies approved change request `id` ([`Actions::apply_request`]); an experiment's
    /// is started and run on this replica. Every application of a request goes through
    /// here, so an experiment approved is never recorded without its run.
    ///
    /// # Errors
    /// What [`Actions::apply_request`] refuses; a stored experiment request whose
    /// definition this server cannot read.
    pub async fn apply_request(
        &self,
        by: &Actor,
        reason: &Reason,
        id: i64,
    ) -> Result<RequestRow, ChangeError> {
        let proposed = match self.store.request(id).await? {
            Some(r) if r.kind == ChangeKind::Experiment => {
                let spec: ExperimentSpec = serde_json::from_str(&r.payload).map_err(anyhow::Error::from)?;
                Some((new_experiment(&spec)?, spec))
            }
            _ => None,
        };
        let applied = self.actions.apply_request(by, reason, id, proposed.as_ref().map(|(n, _)| n)).await?;
        if let (Some(eid), Some((_, spec))) = (applied.experiment_id, proposed) {
            tokio::spawn(run::run(self.clone(), eid, spec));
        }
        Ok(applied)
    }

    /// Ends, every third of [`run::ORPHAN_AFTER`], the experiments whose replica stopped
    /// recording readings, and starts, every [`SCHEDULE_INTERVAL`], the scheduled
    /// experiments due ([`Experiments::start_due`]), until `shutdown` is set.
    pub async fn watchdog(self) {
        run::watchdog(self).await;
    }

    /// Starts the scheduled experiments due at `now` that this replica claims, each as
    /// its author is now and under the approval rules in force now
    /// ([`Actions::start_due_experiment`]), and runs them here. Returns the experiments
    /// started.
    ///
    /// # Errors
    /// [`ChangeError::Storage`] when the due changes cannot be listed.
    pub async fn start_due(&self, now: Timestamp) -> Result<Vec<i64>, ChangeError> {
        let mut started = Vec::new();
        for (id, kind) in self.store.due_changes(now.unix_ms()).await? {
            if kind != ChangeKind::Experiment {
                continue;
            }
            let mut spec = None;
            let read = |payload: &str| {
                let s: ExperimentSpec = serde_json::from_str(payload).map_err(anyhow::Error::from)?;
                let new = new_experiment(&s)?;
                spec = Some(s);
                Ok(new)
            };
            let eid = self.actions.start_due_experiment(id, now, read).await?;
            if let (Some(eid), Some(spec)) = (eid, spec) {
                tokio::spawn(run::run(self.clone(), eid, spec));
                started.push(eid);
            }
        }
        Ok(started)
    }
}

/// How often the scheduled experiments due are looked for, as the sweeper looks for the
/// other scheduled changes (`crate::sweeper::EXPIRY_SWEEP_INTERVAL`).
pub const SCHEDULE_INTERVAL: Duration = Duration::from_secs(1);

/// The experiment `spec` defines, as an action starts or proposes it: its spec checked
/// (every bad field, by path), stored as JSON (what an approval binds to), and the fault
/// rule it will set (on every instance, expiring after its duration) for the service's
/// checks.
///
/// # Errors
/// [`ChangeError::Invalid`] with every bad field of the spec.
pub fn new_experiment(spec: &ExperimentSpec) -> Result<NewExperiment, ChangeError> {
    let errors = spec.check();
    if !errors.is_empty() {
        return Err(ChangeError::Invalid(ValidationErrors(errors)));
    }
    let fault = FaultRule {
        id: experiment_fault_id(0),
        dependency: spec.fault.dependency.clone(),
        operation: spec.fault.operation.clone(),
        action: spec.fault.action.clone(),
        percent: spec.fault.percent,
        expires_at: Timestamp::from_unix_ms(now_ms() + spec.duration.as_millis() as i64),
        instances: Vec::new(),
    };
    Ok(NewExperiment {
        environment: spec.environment.clone(),
        service: spec.service.clone(),
        name: spec.name.clone(),
        spec: serde_json::to_string(spec).map_err(anyhow::Error::from)?,
        fault,
    })
}

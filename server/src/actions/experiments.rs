//! Experiments as audited changes: starting one (`experiment.start`), asking one to stop
//! (`experiment.stop`), and its end with the verdict (`experiment.end`, by the server).
//! Its fault is set and removed by the fault actions under its author's name and role
//! ([`Actions::experiment_actor`]), so it is audited, validated and pushed like any fault
//! rule. The run itself (measuring, deciding) lives in `crate::experiments`.

use levee_agent::policy::{FaultRule, FieldError, ValidationErrors};
use serde_json::json;

use super::{Action, Actions, Actor, ChangeError, Missing, Proposal, Reason, audit_row};
use crate::db::{AuditRow, ChangeKind, ExperimentRow, ExperimentState, RequestRow, Role, now_ms};

/// An experiment to start, its spec checked by the caller (`crate::experiments`).
#[derive(Clone, Debug, PartialEq)]
pub struct NewExperiment {
    pub environment: String,
    pub service: String,
    pub name: String,
    /// The spec as JSON, stored as submitted: what a change request proposing it holds and
    /// its approval binds to.
    pub spec: String,
    /// The fault rule it will set (on every instance, expiring after its duration): checked
    /// now against the service's configuration as a fault rule write would be, so a fault
    /// the service would refuse is refused before anything runs.
    pub fault: FaultRule,
}

/// The id of the fault rule experiment `id` sets in its service.
pub fn experiment_fault_id(id: i64) -> String {
    format!("experiment-{id}")
}

/// What starting an experiment did.
#[derive(Clone, Debug)]
pub enum Started {
    /// Started: the experiment's id (its run measures the baseline first).
    Running(i64),
    /// The environment's approval rules cover experiments: nothing started; this change
    /// request proposes it, for a second person to approve and anyone to apply then.
    Pending(Box<RequestRow>),
}

impl Actions {
    /// Starts experiment `new` as `by`: records it in state `baseline`, run by this
    /// replica (audited as `experiment.start`), unless the environment's approval rules
    /// cover experiments; then proposes it as a change request instead
    /// ([`Started::Pending`]), which starts it once approved and applied
    /// ([`Actions::apply_request`]). Break-glass starts it at once, audited as a bypass.
    ///
    /// # Errors
    /// [`ChangeError`]: the actor's role; no such environment or service;
    /// [`ChangeError::FaultsNotAllowed`] where the environment allows no fault;
    /// [`ChangeError::Invalid`] when the service would
    /// refuse the fault (paths under `fault.`).
    pub async fn start_experiment(
        &self,
        by: &Actor,
        reason: &Reason,
        new: &NewExperiment,
    ) -> Result<Started, ChangeError> {
        by.may(Action::ExperimentStart)?;
        self.check_experiment(new).await?;
        let target = format!("experiment {}", new.name);
        match self.four_eyes(by, &new.environment).await?.admit(&[ChangeKind::Experiment]) {
            Err(ChangeError::ApprovalRequired { .. }) => {
                let p = Proposal::Experiment(Box::new(new.clone()));
                let r = self.propose(by, reason, &new.environment, p).await?;
                return Ok(Started::Pending(Box::new(r)));
            }
            Err(e) => return Err(e),
            Ok(Some(bypass)) => {
                self.record_bypass(by, &new.environment, Some(&new.service), &target, &bypass, None).await?
            }
            Ok(None) => {}
        }
        Ok(Started::Running(self.insert_experiment(by, reason, new).await?))
    }

    /// Refuses an experiment that could not run: no such environment or service, an
    /// environment that allows no fault, a fault the service would refuse.
    pub(super) async fn check_experiment(&self, new: &NewExperiment) -> Result<(), ChangeError> {
        let env =
            self.store.environment(&new.environment).await?.ok_or_else(|| {
                ChangeError::NotFound(Missing::Environment { env: new.environment.clone() })
            })?;
        if !env.allow_faults {
            return Err(ChangeError::FaultsNotAllowed { env: new.environment.clone() });
        }
        let Some(snap) = self.store.latest_snapshot(&new.environment, &new.service).await? else {
            return Err(ChangeError::NotFound(Missing::Service {
                env: new.environment.clone(),
                service: new.service.clone(),
            }));
        };
        let mut cfg = snap.config()?;
        cfg.faults.retain(|f| f.id != new.fault.id);
        cfg.faults.push(new.fault.clone());
        if let Err(ValidationErrors(errors)) = cfg.validate() {
            let prefix = format!("faults[{}]", cfg.faults.len() - 1);
            let mine: Vec<FieldError> = errors
                .into_iter()
                .filter_map(|e| {
                    let rest = e.path.strip_prefix(&prefix)?;
                    Some(FieldError { path: format!("fault{rest}"), ..e })
                })
                .collect();
            if !mine.is_empty() {
                return Err(ChangeError::Invalid(ValidationErrors(mine)));
            }
        }
        Ok(())
    }

    /// Records experiment `new` (checked, admitted) in state `baseline`, run by this
    /// replica, with its `experiment.start` audit row. Returns its id.
    pub(super) async fn insert_experiment(
        &self,
        by: &Actor,
        reason: &Reason,
        new: &NewExperiment,
    ) -> Result<i64, ChangeError> {
        let (row, audit) = self.experiment_row(by, reason, new);
        Ok(self.store.insert_experiment(&row, &audit).await?)
    }

    /// Experiment `new` started by `by` as this replica records it (state `baseline`, run
    /// here), and its `experiment.start` audit row.
    pub(super) fn experiment_row(
        &self,
        by: &Actor,
        reason: &Reason,
        new: &NewExperiment,
    ) -> (ExperimentRow, AuditRow) {
        let now = now_ms();
        let row = ExperimentRow {
            environment: new.environment.clone(),
            service: new.service.clone(),
            name: new.name.clone(),
            spec: new.spec.clone(),
            state: ExperimentState::Baseline,
            created_by: by.name.clone(),
            created_role: by.role.as_str().into(),
            created_at: now,
            reason: reason.as_str().into(),
            replica: self.replica.to_string(),
            heartbeat_at: now,
            ..Default::default()
        };
        let mut audit = audit_row(by, reason, Action::ExperimentStart, format!("experiment {}", new.name));
        audit.environment = Some(new.environment.clone());
        audit.service = Some(new.service.clone());
        audit.after = Some(new.spec.clone());
        (row, audit)
    }

    /// Asks experiment `id` to stop (audited as `experiment.stop`): its run aborts at its
    /// next reading and removes the fault.
    ///
    /// # Errors
    /// [`ChangeError`]: the actor's role; [`Missing::Experiment`] when there is no such
    /// experiment still running (or someone asked already).
    pub async fn stop_experiment(
        &self,
        by: &Actor,
        reason: &Reason,
        id: i64,
    ) -> Result<ExperimentRow, ChangeError> {
        by.may(Action::ExperimentStop)?;
        let missing = || ChangeError::NotFound(Missing::Experiment { id });
        let e = self.store.experiment(id).await?.ok_or_else(missing)?;
        let mut audit =
            audit_row(by, reason, Action::ExperimentStop, format!("experiment {} (experiment {id})", e.name));
        audit.environment = Some(e.environment.clone());
        audit.service = Some(e.service.clone());
        if !self.store.request_experiment_stop(id, &by.name, now_ms(), reason.as_str(), &audit).await? {
            return Err(missing());
        }
        self.store.experiment(id).await?.ok_or_else(missing)
    }

    /// Records the end of experiment `id` with its verdict (audited as `experiment.end`
    /// by the server). `false` when it had ended already.
    ///
    /// # Errors
    /// [`ChangeError::Storage`].
    pub async fn finish_experiment(
        &self,
        e: &ExperimentRow,
        verdict: &str,
        why: &str,
    ) -> Result<bool, ChangeError> {
        let reason = Reason::by_server(format!("experiment {} {verdict}", e.id));
        let mut audit = audit_row(
            &Actor::server(),
            &reason,
            Action::ExperimentEnd,
            format!("experiment {} (experiment {})", e.name, e.id),
        );
        audit.environment = Some(e.environment.clone());
        audit.service = Some(e.service.clone());
        audit.after = Some(json!({"verdict": verdict}).to_string());
        audit.detail = Some(why.to_string());
        Ok(self.store.finish_experiment(e.id, verdict, why, now_ms(), &audit).await?)
    }

    /// The actor an experiment's fault is set and removed as: its author, with the role
    /// the author had when starting it, via the server. The start passed the approval
    /// rules; its fault is part of it, not a change of its own (as an expiry is).
    pub fn experiment_actor(e: &ExperimentRow) -> Actor {
        Actor {
            name: e.created_by.clone(),
            role: Role::parse(&e.created_role).unwrap_or(Role::Viewer),
            via: super::Via::Server,
            request_id: format!("experiment-{}", e.id),
            approval: super::Approval::Upkeep,
            user: None,
            person: None,
            token: None,
        }
    }

    /// The reason recorded on the fault changes of experiment `e`.
    pub fn experiment_reason(e: &ExperimentRow, what: &str) -> Reason {
        Reason::by_server(format!("experiment {} ({}): {what}", e.id, e.name))
    }
}

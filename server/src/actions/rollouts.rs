//! Staged rollouts: the environment's setting, the operator's steps (promote, pause,
//! resume, abort) and the server's own (the next stage after the bake time, the halt when
//! the cohort is worse than the rest). A rollout starts with a staged policy write
//! (`db::Staging`); the rules are `crate::rollout`'s.

use levee_agent::policy::Policy;

use super::{Action, Actions, Actor, ChangeError, Missing, Reason, ServiceAt, Written};
use crate::db::{
    AuditDiff, ChangeKind, RolloutRow, RolloutSettings, RolloutState, STAGEABLE_KINDS, Staging, Step, Subject,
};
use crate::rollout::{self, Evidence, Side};

/// One instance of the service, as the rollout sees it.
#[derive(Debug, serde::Serialize, utoipa::ToSchema)]
pub struct InstanceView {
    pub instance_id: String,
    /// Whether it is in the cohort (gets the candidate).
    pub in_cohort: bool,
    /// Whether its stream is open.
    pub connected: bool,
    /// The revision it applied.
    pub applied_revision: u64,
    /// Whether it NACKed the candidate.
    pub nacked: bool,
}

/// One side of the comparison.
#[derive(Debug, Default, serde::Serialize, utoipa::ToSchema)]
pub struct SideView {
    /// Connected instances on this side.
    pub instances: usize,
    /// Of which applied the revision this side is served (candidate or stable).
    pub on_revision: usize,
    /// Instances on this side that NACKed the candidate.
    pub nacks: usize,
}

/// A rollout with its cohort beside the rest of the fleet.
#[derive(Debug, serde::Serialize, utoipa::ToSchema)]
pub struct RolloutDetail {
    pub rollout: RolloutRow,
    /// The cohort (served `candidate_revision`).
    pub cohort: SideView,
    /// The rest (served `stable_revision`).
    pub rest: SideView,
    /// Every instance the fleet view lists (connected, or recently seen).
    pub instances: Vec<InstanceView>,
    /// The halt rule read now on the health of both sides since the rollout began (at
    /// most `rollout::HEALTH_LOOKBACK`), subject by subject: what the server's own turn
    /// judges, and the rollout page shows.
    pub verdict: rollout::Verdict,
}

/// A halt the server decided, as POSTed to the alert webhook.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct Halted {
    /// `rollout_halted`.
    pub event: &'static str,
    pub environment: String,
    pub service: String,
    pub rollout: i64,
    /// The stage it was at (1-based) and the number of stages.
    pub stage: usize,
    pub stages: usize,
    /// The revision the cohort had and the one that put the previous policy back.
    pub candidate_revision: u64,
    pub revert_revision: u64,
    /// Why, in words.
    pub reason: String,
    /// When (RFC 3339).
    pub at: String,
}

impl Actions {
    /// `r` with its cohort beside the rest, every instance the fleet view lists and the
    /// halt rule's `verdict` (`rollout_verdict`), read now.
    pub async fn rollout_detail(
        &self,
        r: RolloutRow,
        verdict: rollout::Verdict,
    ) -> anyhow::Result<RolloutDetail> {
        let agents = self.store.agents(&r.environment, &r.service).await?;
        let nacking = self.store.nacking_instances(&r.environment, &r.service, r.candidate_revision).await?;
        let (mut cohort, mut rest) = (SideView::default(), SideView::default());
        let mut instances = Vec::with_capacity(agents.len());
        for a in agents {
            let in_cohort = rollout::in_cohort(&r, &a.instance_id);
            let nacked = nacking.contains(&a.instance_id);
            let (side, served) =
                if in_cohort { (&mut cohort, r.candidate_revision) } else { (&mut rest, r.stable_revision) };
            if a.connected {
                side.instances += 1;
                if a.applied_revision >= served {
                    side.on_revision += 1;
                }
            }
            if nacked {
                side.nacks += 1;
            }
            instances.push(InstanceView {
                instance_id: a.instance_id,
                in_cohort,
                connected: a.connected,
                applied_revision: a.applied_revision,
                nacked,
            });
        }
        Ok(RolloutDetail { rollout: r, cohort, rest, instances, verdict })
    }

    /// The rollout setting of `env`.
    ///
    /// # Errors
    /// [`ChangeError::NotFound`] for an environment that does not exist.
    pub async fn rollout_settings(&self, env: &str) -> Result<RolloutSettings, ChangeError> {
        self.store
            .environment(env)
            .await?
            .ok_or_else(|| ChangeError::NotFound(Missing::Environment { env: env.to_string() }))?;
        Ok(self.store.rollout_settings(env).await?)
    }

    /// Sets which kinds of change `env` stages by default and the plan they follow
    /// (audited as `rollout.settings`, before and after the setting).
    ///
    /// # Errors
    /// [`ChangeError::InvalidField`] for a kind that cannot be staged or a plan out of its
    /// ranges (the first problem, naming the field and the range); not found; forbidden.
    pub async fn set_rollout_settings(
        &self,
        by: &Actor,
        reason: &Reason,
        env: &str,
        settings: RolloutSettings,
    ) -> Result<RolloutSettings, ChangeError> {
        by.may(Action::RolloutSettings)?;
        for (i, kind) in settings.staged.iter().enumerate() {
            if !ChangeKind::parse(kind).is_ok_and(|k| STAGEABLE_KINDS.contains(&k)) {
                return Err(invalid(
                    format!("staged[{i}]"),
                    kind.clone(),
                    "one of: policy (flag flips, breaker overrides and emergency profiles are always immediate)",
                ));
            }
        }
        check_plan(&settings.plan, "plan.")?;
        let before = self.rollout_settings(env).await?;
        let mut audit =
            super::audit_row(by, reason, Action::RolloutSettings, format!("rollout settings of {env}"));
        audit.environment = Some(env.to_string());
        audit.before = serde_json::to_string(&before).ok();
        audit.after = serde_json::to_string(&settings).ok();
        self.store.set_rollout_settings(env, &settings, &audit).await?;
        Ok(settings)
    }

    /// Rollout `id` of `env`.
    ///
    /// # Errors
    /// [`ChangeError::NotFound`] when there is no such rollout in `env`.
    pub async fn rollout(&self, env: &str, id: i64) -> Result<RolloutRow, ChangeError> {
        match self.store.rollout(id).await? {
            Some(r) if r.environment == env => Ok(r),
            _ => Err(ChangeError::NotFound(Missing::Rollout { env: env.to_string(), id })),
        }
    }

    /// Moves rollout `id` to its next stage now, without waiting for the bake time; at
    /// the last stage, completes it (the candidate becomes everyone's). Audited as
    /// `rollout.promote`.
    ///
    /// # Errors
    /// [`ChangeError::Rollout`] when it is not in progress (or moved meanwhile); not found;
    /// forbidden.
    pub async fn promote_rollout(
        &self,
        by: &Actor,
        reason: &Reason,
        env: &str,
        id: i64,
    ) -> Result<RolloutRow, ChangeError> {
        by.may(Action::RolloutPromote)?;
        let r = self.rollout(env, id).await?;
        if !r.active() {
            return Err(not_in_progress(&r));
        }
        let step = self.next_step(&r).await?;
        self.step(by, reason, Action::RolloutPromote, &r, step).await
    }

    /// Pauses rollout `id`: no next stage until resumed (a halt still applies). Audited as
    /// `rollout.pause`.
    ///
    /// # Errors
    /// As [`Actions::promote_rollout`]; a rollout that is not running.
    pub async fn pause_rollout(
        &self,
        by: &Actor,
        reason: &Reason,
        env: &str,
        id: i64,
    ) -> Result<RolloutRow, ChangeError> {
        by.may(Action::RolloutPause)?;
        let r = self.rollout(env, id).await?;
        if r.state != RolloutState::Running {
            return Err(ChangeError::Rollout(format!("rollout {id} is {}, not running", r.state)));
        }
        self.step(by, reason, Action::RolloutPause, &r, Step::Pause).await
    }

    /// Resumes paused rollout `id`; its stage bakes again from now. Audited as
    /// `rollout.resume`.
    ///
    /// # Errors
    /// As [`Actions::promote_rollout`]; a rollout that is not paused.
    pub async fn resume_rollout(
        &self,
        by: &Actor,
        reason: &Reason,
        env: &str,
        id: i64,
    ) -> Result<RolloutRow, ChangeError> {
        by.may(Action::RolloutPause)?;
        let r = self.rollout(env, id).await?;
        if r.state != RolloutState::Paused {
            return Err(ChangeError::Rollout(format!("rollout {id} is {}, not paused", r.state)));
        }
        self.step(by, reason, Action::RolloutResume, &r, Step::Resume).await
    }

    /// Aborts rollout `id`: a new revision puts the policy it started from back for every
    /// instance, and ends it as `aborted` in the same transaction (audited as
    /// `rollout.abort`). Never gated by approval rules: it only undoes a staged change.
    ///
    /// # Errors
    /// As [`Actions::promote_rollout`].
    pub async fn abort_rollout(
        &self,
        by: &Actor,
        reason: &Reason,
        env: &str,
        id: i64,
    ) -> Result<Written, ChangeError> {
        by.may(Action::RolloutAbort)?;
        let r = self.rollout(env, id).await?;
        if !r.active() {
            return Err(not_in_progress(&r));
        }
        let outcome = format!("aborted by {}: {}", by.name, reason.as_str());
        self.revert(by, reason, Action::RolloutAbort, &r, RolloutState::Aborted, outcome).await
    }

    /// Ends `r` as `state` with a revision that puts its base policy back.
    async fn revert(
        &self,
        by: &Actor,
        reason: &Reason,
        action: Action,
        r: &RolloutRow,
        state: RolloutState,
        outcome: String,
    ) -> Result<Written, ChangeError> {
        let base: Policy =
            serde_json::from_str(&r.base_policy).map_err(|e| ChangeError::Storage(e.into()))?;
        // Putting back the policy the rollout started from undoes a staged change that passed
        // the approval rules when it was written: upkeep, not a change of its own kind.
        let by = &Actor { approval: super::Approval::Upkeep, ..by.clone() };
        let mut at = ServiceAt::new(&r.environment, &r.service, None);
        at.staging = Staging::Ends { id: r.id, state, outcome };
        let target = format!("rollout {}", r.id);
        self.write(by, reason, action, &at, &target, Subject::Policy, move |p| {
            let diff = AuditDiff::of(Some(&p.policy), Some(&base));
            p.policy = base;
            Ok(diff)
        })
        .await
    }

    /// What promoting `r` now does: the next stage (its cohort covering the instances
    /// connected now), or completion at the last.
    async fn next_step(&self, r: &RolloutRow) -> Result<Step, ChangeError> {
        if r.stage + 1 >= r.plan.stages.len() {
            return Ok(Step::Complete);
        }
        let connected = self.connected(r).await?;
        Ok(Step::Advance { threshold: rollout::stage_threshold(r, r.stage + 1, &connected) })
    }

    async fn connected(&self, r: &RolloutRow) -> anyhow::Result<Vec<String>> {
        Ok(self
            .store
            .agents(&r.environment, &r.service)
            .await?
            .into_iter()
            .filter(|a| a.connected)
            .map(|a| a.instance_id)
            .collect())
    }

    async fn step(
        &self,
        by: &Actor,
        reason: &Reason,
        action: Action,
        r: &RolloutRow,
        step: Step,
    ) -> Result<RolloutRow, ChangeError> {
        let target = format!("rollout {}", r.id);
        let mut audit = super::audit_row(by, reason, action, target);
        audit.environment = Some(r.environment.clone());
        audit.service = Some(r.service.clone());
        audit.before = serde_json::to_string(&stage_json(r)).ok();
        audit.detail = Some(describe(&step, r));
        let Some(after) = self.store.step_rollout(r.id, r.version, step, &audit).await? else {
            return Err(ChangeError::Rollout(format!(
                "rollout {} changed meanwhile (another step or replica); read it again",
                r.id
            )));
        };
        self.publish_rollout(&after).await?;
        Ok(after)
    }

    /// Publishes `r` as stored to this replica's agent streams (with its stable snapshot).
    async fn publish_rollout(&self, r: &RolloutRow) -> anyhow::Result<()> {
        let d = self.store.delivery(&r.environment, &r.service).await?;
        self.hub.publish_delivery(d);
        Ok(())
    }

    /// One turn of the server's own steps over every rollout in progress: halts one whose
    /// cohort is worse than the plan tolerates (returned, for the webhook), widens a
    /// stage's cohort to the instances it must cover, starts the next stage of one whose
    /// stage baked, completes one whose last stage baked. Several replicas may run it: each
    /// step applies only to the version it read, so one of them takes it.
    ///
    /// # Errors
    /// The database failed reading the rollouts; a failure on one rollout is logged and
    /// the others still run.
    ///
    /// `health` reads the outcome counts the agents reported for a rollout: the cohort's
    /// (the candidate's revisions) and the rest's (the stable ones), as
    /// `rollout::sides` reads them.
    pub async fn drive_rollouts<F, Fut>(&self, now_ms: i64, health: F) -> anyhow::Result<Vec<Halted>>
    where
        F: Fn(RolloutRow) -> Fut,
        Fut: std::future::Future<Output = anyhow::Result<(Side, Side)>>,
    {
        let mut halted = Vec::new();
        for r in self.store.active_rollouts().await? {
            let sides = match health(r.clone()).await {
                Ok(sides) => sides,
                Err(e) => {
                    tracing::warn!(rollout = r.id, error = %e, "reading the health of a rollout");
                    (Side::default(), Side::default())
                }
            };
            match self.drive(&r, now_ms, sides).await {
                Ok(Some(h)) => halted.push(h),
                Ok(None) => {}
                Err(e) => tracing::warn!(rollout = r.id, error = %e, "driving a rollout"),
            }
        }
        Ok(halted)
    }

    async fn drive(
        &self,
        r: &RolloutRow,
        now_ms: i64,
        sides: (Side, Side),
    ) -> Result<Option<Halted>, ChangeError> {
        let server = Actor::server();
        let connected = self.connected(r).await?;
        let evidence = self.evidence(r, sides.clone(), &connected).await?;
        if let Some(why) = rollout::halt_reason(&r.plan, &evidence) {
            let reason = Reason::parse(&format!("automatic halt: {why}"))
                .unwrap_or_else(|_| Reason::parse("automatic halt").expect("a valid reason"));
            let outcome = format!("halted by the server: {why}");
            let written =
                self.revert(&server, &reason, Action::RolloutHalt, r, RolloutState::Halted, outcome).await?;
            tracing::warn!(environment = %r.environment, service = %r.service, rollout = r.id, reason = %why, "rollout halted");
            metrics::counter!("levee_server_rollouts_halted_total").increment(1);
            return Ok(Some(Halted {
                event: "rollout_halted",
                environment: r.environment.clone(),
                service: r.service.clone(),
                rollout: r.id,
                stage: r.stage + 1,
                stages: r.plan.stages.len(),
                candidate_revision: r.candidate_revision,
                revert_revision: written.snapshot.revision,
                reason: why,
                at: levee_agent::policy::Timestamp::from_unix_ms(now_ms).to_rfc3339(),
            }));
        }
        let widened = rollout::stage_threshold(r, r.stage, &connected);
        if widened > r.threshold {
            let reason =
                Reason::parse("the stage covers the instances its plan names").expect("a valid reason");
            let r = self
                .step(&server, &reason, Action::RolloutStage, r, Step::Widen { threshold: widened })
                .await?;
            return Box::pin(self.drive(&r, now_ms, sides)).await;
        }
        let baked = now_ms.saturating_sub(r.stage_started_at) >= r.plan.bake.as_millis() as i64;
        if r.state == RolloutState::Running && baked {
            let step = self.next_step(r).await?;
            let reason = Reason::parse("the stage baked without a halt").expect("a valid reason");
            self.step(&server, &reason, Action::RolloutStage, r, step).await?;
        }
        Ok(None)
    }

    /// What the halt rule concludes on `r` now, subject by subject, from the health of its
    /// two `sides` (`rollout::sides`) and the fleet as it is: what the rollout page shows
    /// beside the rest, the same judgement the server's own turn makes.
    ///
    /// # Errors
    /// The database could not be read.
    pub async fn rollout_verdict(
        &self,
        r: &RolloutRow,
        sides: (Side, Side),
    ) -> anyhow::Result<rollout::Verdict> {
        let connected = self.connected(r).await?;
        let evidence = self.evidence(r, sides, &connected).await?;
        Ok(rollout::judge(&r.plan, &evidence))
    }

    /// What `r` is judged on now: the cohort's NACKs of the candidate, the outcome counts
    /// of both sides and how many of the `connected` instances run outside the cohort.
    async fn evidence(
        &self,
        r: &RolloutRow,
        (cohort, rest): (Side, Side),
        connected: &[String],
    ) -> anyhow::Result<Evidence> {
        let nacking = self.store.nacking_instances(&r.environment, &r.service, r.candidate_revision).await?;
        let nacks = nacking.iter().filter(|i| rollout::in_cohort(r, i)).count() as u64;
        let rest_instances = connected.iter().filter(|i| !rollout::in_cohort(r, i)).count() as u64;
        Ok(Evidence { cohort, rest, nacks, rest_instances })
    }
}

fn invalid(path: String, value: String, message: &str) -> ChangeError {
    ChangeError::InvalidField(levee_agent::policy::FieldError { path, value, message: message.to_string() })
}

/// The first problem of `plan`, its path under `prefix`.
pub(crate) fn check_plan(plan: &crate::db::Plan, prefix: &str) -> Result<(), ChangeError> {
    match plan.problems().into_iter().next() {
        Some((path, value, range)) => Err(invalid(format!("{prefix}{path}"), value, range)),
        None => Ok(()),
    }
}

fn not_in_progress(r: &RolloutRow) -> ChangeError {
    ChangeError::Rollout(format!("rollout {} is {}: it is no longer in progress", r.id, r.state))
}

fn stage_json(r: &RolloutRow) -> serde_json::Value {
    serde_json::json!({"state": r.state, "stage": r.stage + 1, "stages": r.plan.stages.len(), "threshold": r.threshold})
}

fn describe(step: &Step, r: &RolloutRow) -> String {
    let n = r.plan.stages.len();
    match step {
        Step::Advance { threshold } => format!(
            "stage {} of {n} starts: the cohort is {:.2} % of the instances' buckets",
            r.stage + 2,
            *threshold as f64 / 10_000.0
        ),
        Step::Widen { threshold } => format!(
            "stage {} of {n} covers more instances: {:.2} % of the buckets",
            r.stage + 1,
            *threshold as f64 / 10_000.0
        ),
        Step::Pause => format!("paused at stage {} of {n}", r.stage + 1),
        Step::Resume => format!("resumed at stage {} of {n}", r.stage + 1),
        Step::Complete => format!("completed: revision {} is every instance's", r.candidate_revision),
    }
}

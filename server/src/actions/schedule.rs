//! Scheduled changes: a flag value, a policy or a profile application, due at a time, with
//! an optional automatic revert; or an experiment, started when due.
//!
//! A change is stored (it survives a restart) with what its target looked like when it was
//! scheduled. When it is due, one replica claims it ([`Store::claim_change`], a conditional
//! UPDATE) with a lease of [`SCHEDULE_LEASE`], and runs it as its author (via `server`) as
//! the author is then — a user's or an API token's current role, nothing at all when the
//! user is disabled or the token revoked — under the approval rules in force then (a change
//! scheduled with break-glass passes them as a bypass, audited at run time): if
//! the target changed since it was scheduled, the change is not applied and its conflict is
//! recorded and audited instead; otherwise it is applied through the ordinary action (so the
//! audit log lists it as that action, applied). A revert is itself a scheduled change,
//! created when the change is applied, expecting the value the change set; a profile's
//! revert is its expiry. Rescheduling or cancelling changes the stored job itself, so the
//! old time no longer exists anywhere.
//!
//! A change whose replica died mid-run stays `running` until its lease expires; then the
//! next run claims it again (exactly one, conditionally on the previous claimer) and either
//! applies it, or — when the target already holds what the change sets, because the dead
//! run applied it before dying — records it as applied without applying it twice and
//! schedules its revert if that is missing. The takeover is audited once, as
//! `schedule.run` naming the replica whose lease expired, and logged. A run records its
//! end only while it still holds the claim.
//!
//! An experiment is claimed, checked and started the same way, by
//! [`Actions::start_due_experiment`], which `crate::experiments` calls since it runs what
//! starts; [`Actions::run_due_changes`] leaves experiments to it. The change's end and the
//! experiment are recorded in one transaction, conditionally on the claim, so a change
//! taken over never starts a second experiment.
//!
//! [`Store::claim_change`]: crate::db::Store::claim_change

use levee_agent::policy::{FieldError, Policy, ServiceConfig, Timestamp};
use serde_json::{Value, json};

use super::overrides::in_future;
use super::{Action, Actions, Actor, ChangeError, Missing, NewExperiment, Reason, ServiceAt, audit_row};
use crate::db::{AuditOutcome, AuditRow, ChangeKind, Claimed, Role, ScheduledRow, ScheduledState, now_ms};

/// How long a claim on a scheduled change holds. Far longer than a run takes (a few
/// database writes); a change still running after it is taken over by another run.
pub const SCHEDULE_LEASE: std::time::Duration = std::time::Duration::from_secs(60);

/// What a scheduled change does.
#[derive(Clone, Debug, PartialEq)]
pub enum Planned {
    /// Sets the value of an existing flag of a service.
    Flag { service: String, key: String, value: Value },
    /// Replaces the policy of a service.
    Policy { service: String, policy: Box<Policy> },
    /// Applies a profile of the environment until the change's `revert_at` (required).
    Profile { name: String },
    /// Starts an experiment (its spec checked by `crate::experiments`); it ends by itself
    /// after its duration, so it has no `revert_at`.
    Experiment(Box<NewExperiment>),
}

/// A change to schedule.
#[derive(Clone, Debug)]
pub struct NewSchedule {
    pub env: String,
    pub change: Planned,
    /// When it is applied (in the future).
    pub run_at: Timestamp,
    /// When what it replaced is put back (after `run_at`); required for a profile.
    pub revert_at: Option<Timestamp>,
}

fn bad(path: &str, value: impl Into<String>, message: impl Into<String>) -> ChangeError {
    ChangeError::InvalidField(FieldError { path: path.into(), value: value.into(), message: message.into() })
}

/// How a run ended: the state recorded, what happened, the revision made.
struct Ran {
    state: ScheduledState,
    outcome: String,
    revision: Option<u64>,
}

impl Ran {
    fn failed(e: &ChangeError) -> Ran {
        let state = match e {
            ChangeError::Conflict { .. } | ChangeError::ProfileActive { .. } => ScheduledState::Conflict,
            _ => ScheduledState::Failed,
        };
        Ran { state, outcome: e.to_string(), revision: None }
    }
}

impl Actions {
    async fn current(&self, env: &str, svc: &str) -> Result<(u64, ServiceConfig), ChangeError> {
        let snap = self.store.latest_snapshot(env, svc).await?;
        let svc_row = self.store.service(env, svc).await?;
        match (snap, svc_row) {
            (Some(s), Some(_)) => Ok((s.revision, s.config()?)),
            _ => Err(ChangeError::NotFound(Missing::Service { env: env.into(), service: svc.into() })),
        }
    }

    /// Schedules `new` (audited as `schedule.create`): checked now as it would be applied,
    /// stored with what its target looks like now.
    ///
    /// # Errors
    /// [`ChangeError`]: the role of the change itself; [`ChangeError::InvalidField`] on
    /// `run_at` / `revert_at`; what the change refers to missing; an invalid value.
    pub async fn schedule_change(
        &self,
        by: &Actor,
        reason: &Reason,
        new: NewSchedule,
    ) -> Result<ScheduledRow, ChangeError> {
        by.may(Action::ScheduleCreate)?;
        in_future("run_at", new.run_at)?;
        if let Some(r) = new.revert_at
            && r <= new.run_at
        {
            return Err(bad("revert_at", r.to_string(), "must be after run_at"));
        }
        let env = new.env.clone();
        let mut row = ScheduledRow {
            environment: env.clone(),
            run_at: new.run_at.unix_ms(),
            revert_at: new.revert_at.map(|t| t.unix_ms()),
            state: ScheduledState::Pending,
            created_by: by.name.clone(),
            created_role: by.role.as_str().into(),
            created_user: by.user.clone(),
            created_token: by.token.clone(),
            break_glass: match &by.approval {
                super::Approval::BreakGlass(why) => Some(why.clone()),
                _ => None,
            },
            created_at: now_ms(),
            reason: reason.as_str().into(),
            ..Default::default()
        };
        match &new.change {
            Planned::Flag { service, key, value } => {
                by.may(Action::FlagSet)?;
                self.gate(by, &env, ChangeKind::Flag, &format!("flag {key}")).await?;
                let (rev, cfg) = self.current(&env, service).await?;
                let flag = cfg.flags.get(key).ok_or_else(|| {
                    ChangeError::NotFound(Missing::Flag { service: service.clone(), key: key.clone() })
                })?;
                flag.kind.check("value", value).map_err(ChangeError::InvalidField)?;
                row.service = Some(service.clone());
                row.kind = ChangeKind::Flag;
                row.target = key.clone();
                row.payload = value.to_string();
                row.expected = Some(json!(flag).to_string());
                row.base_revision = Some(rev);
            }
            Planned::Policy { service, policy } => {
                by.may(Action::PolicyUpdate)?;
                self.gate(by, &env, ChangeKind::Policy, &format!("policy of {service}")).await?;
                let (rev, cfg) = self.current(&env, service).await?;
                let expected = json!(cfg.policy).to_string();
                let next = ServiceConfig { policy: (**policy).clone(), ..cfg };
                next.validate().map_err(ChangeError::Invalid)?;
                row.service = Some(service.clone());
                row.kind = ChangeKind::Policy;
                row.target = "policy".into();
                row.payload = json!(policy).to_string();
                row.expected = Some(expected);
                row.base_revision = Some(rev);
            }
            Planned::Profile { name } => {
                by.may(Action::ProfileApply)?;
                self.gate(by, &env, ChangeKind::Profile, &format!("profile {name}")).await?;
                self.store.profile(&env, name).await?.ok_or_else(|| {
                    ChangeError::NotFound(Missing::Profile { env: env.clone(), name: name.clone() })
                })?;
                let Some(until) = new.revert_at else {
                    return Err(bad("revert_at", "", "a profile needs an end: give revert_at (its expiry)"));
                };
                row.kind = ChangeKind::Profile;
                row.target = name.clone();
                row.payload = json!({"expires_at": until}).to_string();
                row.revert_at = None; // the profile's expiry is its revert, in the agents too
            }
            Planned::Experiment(exp) => {
                by.may(Action::ExperimentStart)?;
                if exp.environment != env {
                    return Err(bad(
                        "environment",
                        format!("{:?}", exp.environment),
                        format!("must be the scheduled change's environment ({env})"),
                    ));
                }
                if let Some(r) = new.revert_at {
                    return Err(bad(
                        "revert_at",
                        r.to_string(),
                        "an experiment ends by itself after its duration: leave revert_at out",
                    ));
                }
                self.gate(by, &env, ChangeKind::Experiment, &format!("experiment {}", exp.name)).await?;
                self.check_experiment(exp).await?;
                row.service = Some(exp.service.clone());
                row.kind = ChangeKind::Experiment;
                row.target = exp.name.clone();
                row.payload = exp.spec.clone();
            }
        }
        let mut audit = audit_row(by, reason, Action::ScheduleCreate, describe(&row));
        audit.environment = Some(env.clone());
        audit.service = row.service.clone();
        audit.after = Some(
            json!({"run_at": new.run_at, "revert_at": new.revert_at, "payload": serde_json::from_str::<Value>(&row.payload).unwrap_or(Value::Null)})
                .to_string(),
        );
        row.id = self.store.schedule(&row, Some(&audit)).await?;
        Ok(row)
    }

    /// Moves pending change `id` to `run_at`, audited as `schedule.update`; or cancels it
    /// when `run_at` is `None` (`schedule.cancel`). `revert_at` says what becomes of its
    /// automatic revert (a profile's expiry): `None` keeps it, `Some(None)` drops it (not for
    /// a profile, which needs an end), `Some(Some(t))` moves it to `t`. The audit row records
    /// both times before and after.
    ///
    /// Moving a change is a change too: where its kind needs approval it is refused like
    /// the change itself (or audited as a bypass); the rules are applied again when it runs.
    ///
    /// # Errors
    /// [`ChangeError`]: [`Missing::ScheduledChange`] when there is no pending change `id`;
    /// [`ChangeError::InvalidField`] on the times (a kept revert that would come before
    /// the new `run_at` names `revert_at`); [`ChangeError::ApprovalRequired`].
    pub async fn reschedule_change(
        &self,
        by: &Actor,
        reason: &Reason,
        id: i64,
        run_at: Option<Timestamp>,
        revert_at: Option<Option<Timestamp>>,
    ) -> Result<ScheduledRow, ChangeError> {
        let action = if run_at.is_some() { Action::ScheduleUpdate } else { Action::ScheduleCancel };
        by.may(action)?;
        let missing = || ChangeError::NotFound(Missing::ScheduledChange { id });
        let c = self
            .store
            .scheduled(id)
            .await?
            .filter(|c| c.state == ScheduledState::Pending)
            .ok_or_else(missing)?;
        let target = format!("{} (scheduled change {id})", describe(&c));
        // What it reverts at now: a profile's end is its expiry, in its payload.
        let mut payload: Value = serde_json::from_str(&c.payload).unwrap_or(Value::Null);
        let old_revert = if c.kind == ChangeKind::Profile {
            payload["expires_at"].as_str().and_then(Timestamp::parse)
        } else {
            c.revert_at.map(Timestamp::from_unix_ms)
        };
        let new_revert = match revert_at {
            None => old_revert,
            Some(t) => t,
        };
        let mut new_payload = None;
        if let Some(at) = run_at {
            self.gate(by, &c.environment, c.kind, &target).await?;
            in_future("run_at", at)?;
            match new_revert {
                Some(r) if r <= at => {
                    let message = if revert_at.is_none() {
                        format!(
                            "the change's revert at {r} would come before its new run_at; give a later \
                             revert_at{}",
                            if c.kind == ChangeKind::Profile { "" } else { ", or null to drop the revert" }
                        )
                    } else {
                        "must be after run_at".to_string()
                    };
                    return Err(bad("revert_at", r.to_string(), message));
                }
                None if c.kind == ChangeKind::Profile => {
                    return Err(bad(
                        "revert_at",
                        "null",
                        "a profile needs an end: give revert_at (its expiry)",
                    ));
                }
                _ => {}
            }
            if c.kind == ChangeKind::Profile
                && let Some(r) = new_revert
                && new_revert != old_revert
            {
                payload["expires_at"] = json!(r);
                new_payload = Some(payload.to_string());
            }
        }
        let mut audit = audit_row(by, reason, action, target);
        audit.environment = Some(c.environment.clone());
        audit.service = c.service.clone();
        audit.before =
            Some(json!({"run_at": Timestamp::from_unix_ms(c.run_at), "revert_at": old_revert}).to_string());
        audit.after = run_at.map(|t| json!({"run_at": t, "revert_at": new_revert}).to_string());
        let revert = if c.kind == ChangeKind::Profile { None } else { new_revert.map(|t| t.unix_ms()) };
        let (run_ms, payload) = (run_at.map(|t| t.unix_ms()), new_payload.as_deref());
        if !self.store.reschedule(id, run_ms, revert, payload, &audit).await? {
            return Err(missing());
        }
        self.store.scheduled(id).await?.ok_or_else(missing)
    }

    /// Runs every scheduled change due at `now`, and every one whose claim expired, that
    /// this replica claims (see the module documentation). Returns how many ran (applied or
    /// not).
    ///
    /// # Errors
    /// [`ChangeError::Storage`] when the due changes cannot be listed.
    pub async fn run_due_changes(&self, now: Timestamp) -> Result<usize, ChangeError> {
        let mut n = 0;
        let until = now.unix_ms() + SCHEDULE_LEASE.as_millis() as i64;
        for (id, kind) in self.store.due_changes(now.unix_ms()).await? {
            // An experiment starts a run, which `crate::experiments` owns: it claims and
            // starts due experiments itself (`start_due_experiment`).
            if kind == ChangeKind::Experiment {
                continue;
            }
            let Some(claimed) = self.store.claim_change(id, &self.replica, now.unix_ms(), until).await?
            else {
                continue;
            };
            if let Some(dead) = &claimed.reclaimed_from {
                tracing::warn!(id, previous = %dead, "scheduled change left running by an expired claim: taking it over");
            }
            let ran = self.run_change(&claimed).await;
            match self.store.finish_change(id, &self.replica, ran.state, &ran.outcome, ran.revision).await {
                Ok(true) => {}
                Ok(false) => {
                    tracing::error!(id, outcome = %ran.outcome, "scheduled change taken over by another run before this one recorded its end")
                }
                Err(e) => tracing::error!(error = ?e, id, "recording how a scheduled change ended"),
            }
            n += 1;
        }
        Ok(n)
    }

    /// Claims scheduled experiment `id` when it is due at `now` (or its claim expired) and
    /// starts it as its author is now, under the approval rules in force now (see the
    /// module documentation): recorded in state `baseline`, run by this replica, in the
    /// transaction that records the change as applied. `new` reads the experiment from the
    /// change's payload (its spec, checked as `crate::experiments` checks one). Returns the
    /// experiment's id, for the caller to run it; `None` when another
    /// replica holds the change, or when it did not start: its end (`failed`, with why)
    /// is then recorded and audited as `schedule.run`.
    ///
    /// # Errors
    /// [`ChangeError::Storage`] when the change cannot be claimed.
    pub async fn start_due_experiment(
        &self,
        id: i64,
        now: Timestamp,
        new: impl FnOnce(&str) -> Result<NewExperiment, ChangeError>,
    ) -> Result<Option<i64>, ChangeError> {
        let until = now.unix_ms() + SCHEDULE_LEASE.as_millis() as i64;
        let Some(claimed) = self.store.claim_change(id, &self.replica, now.unix_ms(), until).await? else {
            return Ok(None);
        };
        let c = &claimed.change;
        if let Some(dead) = &claimed.reclaimed_from {
            tracing::warn!(id, previous = %dead, "scheduled experiment left running by an expired claim: taking it over");
        }
        let reason = Reason::by_server(format!("{} (scheduled change {})", c.reason, c.id));
        let by = match self.author_now(c).await {
            Ok(by) => by,
            Err(e) => {
                self.not_started(&self.author(c, Role::Viewer), &reason, &claimed, &e).await;
                return Ok(None);
            }
        };
        let started: Result<Option<i64>, ChangeError> = async {
            by.may(Action::ExperimentStart)?;
            let exp = new(&c.payload)?;
            self.gate(&by, &c.environment, ChangeKind::Experiment, &format!("experiment {}", exp.name))
                .await?;
            self.check_experiment(&exp).await?;
            let (row, audit) = self.experiment_row(&by, &reason, &exp);
            Ok(self.store.insert_scheduled_experiment(&row, &audit, c.id, &self.replica).await?)
        }
        .await;
        match started {
            Ok(Some(eid)) => Ok(Some(eid)),
            Ok(None) => {
                tracing::error!(
                    id,
                    "scheduled experiment taken over by another run before this one started it"
                );
                Ok(None)
            }
            Err(e) => {
                self.not_started(&by, &reason, &claimed, &e).await;
                Ok(None)
            }
        }
    }

    /// Records and audits that scheduled experiment `claimed` did not start, for `e`.
    async fn not_started(&self, by: &Actor, reason: &Reason, claimed: &Claimed, e: &ChangeError) {
        let c = &claimed.change;
        let mut ran = Ran::failed(e);
        ran.outcome = format!("not started: {}", ran.outcome);
        if let Some(dead) = &claimed.reclaimed_from {
            ran.outcome = format!("taken over after the claim of {dead} expired: {}", ran.outcome);
        }
        self.audit_run(by, reason, c, &ran).await;
        match self.store.finish_change(c.id, &self.replica, ran.state, &ran.outcome, None).await {
            Ok(true) => {}
            Ok(false) => {
                tracing::error!(id = c.id, outcome = %ran.outcome, "scheduled experiment taken over by another run before this one recorded its end")
            }
            Err(e) => tracing::error!(error = ?e, id = c.id, "recording how a scheduled experiment ended"),
        }
    }

    /// Schedules the revert of applied change `c`, due at its `revert_at`: it puts `before`
    /// back, expecting `after` (the target as `c` left it, made at `revision`).
    async fn schedule_revert(
        &self,
        c: &ScheduledRow,
        at: i64,
        before: &Value,
        after: Option<String>,
        revision: u64,
    ) -> Result<i64, ChangeError> {
        let revert = ScheduledRow {
            environment: c.environment.clone(),
            service: c.service.clone(),
            kind: c.kind,
            target: c.target.clone(),
            payload: before.to_string(),
            expected: after,
            base_revision: Some(revision),
            run_at: at,
            reverts: Some(c.id),
            state: ScheduledState::Pending,
            created_by: c.created_by.clone(),
            created_role: c.created_role.clone(),
            created_user: c.created_user.clone(),
            created_token: c.created_token.clone(),
            created_at: now_ms(),
            reason: format!("revert of scheduled change {}: {}", c.id, c.reason),
            ..Default::default()
        };
        Ok(self.store.schedule(&revert, None).await?)
    }

    /// When taking over `c`: whether its target already holds what `c` sets (the dead run
    /// applied it), and then how the run ends, its revert scheduled if missing.
    async fn already_applied(
        &self,
        c: &ScheduledRow,
        rev: u64,
        now: Option<&str>,
        dead: &str,
    ) -> Result<Option<Ran>, ChangeError> {
        let parse = |t: &str| serde_json::from_str::<Value>(t).ok();
        let (Some(now), Some(expected)) = (now.and_then(parse), c.expected.as_deref().and_then(parse)) else {
            return Ok(None);
        };
        let payload = parse(&c.payload).unwrap_or(Value::Null);
        let (set, before) = if c.kind == ChangeKind::Flag {
            let mut set = expected.clone();
            set["value"] = payload;
            (set, expected["value"].clone())
        } else {
            (payload, expected)
        };
        if now != set {
            return Ok(None);
        }
        let mut outcome =
            format!("already in place at revision {rev} when the claim of {dead} expired: not applied again");
        if let Some(at) = c.revert_at {
            match self.store.revert_of(c.id).await? {
                Some(id) => outcome.push_str(&format!("; its revert is scheduled change {id}")),
                None => {
                    let id = self.schedule_revert(c, at, &before, Some(now.to_string()), rev).await?;
                    outcome.push_str(&format!("; its revert is scheduled change {id}"));
                }
            }
        }
        Ok(Some(Ran { state: ScheduledState::Applied, outcome, revision: None }))
    }

    async fn run_change(&self, claimed: &Claimed) -> Ran {
        let c = &claimed.change;
        let dead = claimed.reclaimed_from.as_deref();
        let reason = Reason::by_server(format!("{} (scheduled change {})", c.reason, c.id));
        let by = match self.author_now(c).await {
            Ok(by) => by,
            Err(e) => {
                let by = self.author(c, Role::Viewer);
                let mut ran = Ran::failed(&e);
                if let Some(dead) = dead {
                    ran.outcome = format!("taken over after the claim of {dead} expired: {}", ran.outcome);
                }
                self.audit_run(&by, &reason, c, &ran).await;
                return ran;
            }
        };
        let conflict = |what: String, rev: u64| {
            let base = c.base_revision.unwrap_or(0);
            format!(
                "{what} changed since the change was scheduled (at revision {base}, now {rev}): not applied"
            )
        };
        let res: Result<Ran, ChangeError> = async {
            match c.kind {
                ChangeKind::Flag | ChangeKind::Policy => {
                    let svc = c.service.clone().unwrap_or_default();
                    let (rev, cfg) = self.current(&c.environment, &svc).await?;
                    let now = if c.kind == ChangeKind::Flag {
                        cfg.flags.get(&c.target).map(|f| json!(f).to_string())
                    } else {
                        Some(json!(cfg.policy).to_string())
                    };
                    if let Some(dead) = dead
                        && now != c.expected
                        && let Some(ran) = self.already_applied(c, rev, now.as_deref(), dead).await?
                    {
                        return Ok(ran);
                    }
                    if now != c.expected {
                        let what =
                            if c.kind == ChangeKind::Flag { format!("flag {}", c.target) } else { "the policy".into() };
                        return Ok(Ran { state: ScheduledState::Conflict, outcome: conflict(what, rev), revision: None });
                    }
                    let at = ServiceAt::new(&c.environment, svc.clone(), Some(rev));
                    let payload: Value =
                        serde_json::from_str(&c.payload).map_err(|e| ChangeError::Storage(e.into()))?;
                    let (written, before, after) = if c.kind == ChangeKind::Flag {
                        let before = cfg.flags.get(&c.target).map(|f| f.value.clone()).unwrap_or(Value::Null);
                        let w = self.set_flag_value(&by, &reason, &at, &c.target, payload, None).await?;
                        let cfg = w.snapshot.config()?;
                        (w, before, cfg.flags.get(&c.target).map(|f| json!(f).to_string()))
                    } else {
                        let policy: Policy =
                            serde_json::from_value(payload).map_err(|e| ChangeError::Storage(e.into()))?;
                        let before = json!(cfg.policy);
                        let w = self.update_policy(&by, &reason, &at, policy).await?;
                        let cfg = w.snapshot.config()?;
                        (w, before, Some(json!(cfg.policy).to_string()))
                    };
                    let mut outcome = format!("applied as revision {}", written.snapshot.revision);
                    if let Some(at) = c.revert_at {
                        let id = self.schedule_revert(c, at, &before, after, written.snapshot.revision).await?;
                        outcome.push_str(&format!("; its revert is scheduled change {id}"));
                    }
                    Ok(Ran { state: ScheduledState::Applied, outcome, revision: Some(written.snapshot.revision) })
                }
                ChangeKind::Profile => {
                    if let Some(dead) = dead
                        && let Some(a) = self.store.active_profile(&c.environment).await?
                        && a.profile == c.target
                        && a.applied_by == c.created_by
                        && a.applied_at >= c.created_at
                    {
                        return Ok(Ran {
                            state: ScheduledState::Applied,
                            outcome: format!(
                                "profile {} already active when the claim of {dead} expired: not applied again",
                                a.profile
                            ),
                            revision: None,
                        });
                    }
                    let until = serde_json::from_str::<Value>(&c.payload)
                        .ok()
                        .and_then(|v| v["expires_at"].as_str().and_then(Timestamp::parse))
                        .ok_or_else(|| {
                            ChangeError::Storage(anyhow::anyhow!("scheduled profile without expiry"))
                        })?;
                    let a = self.apply_profile(&by, &reason, &c.environment, &c.target, until).await?;
                    Ok(Ran {
                        state: ScheduledState::Applied,
                        outcome: format!("profile {} applied until {until}", a.profile),
                        revision: None,
                    })
                }
                // Never claimed here (`run_due_changes` leaves them to
                // `start_due_experiment`, whose run needs `crate::experiments`).
                ChangeKind::Experiment => Ok(Ran {
                    state: ScheduledState::Failed,
                    outcome: "an experiment is started by start_due_experiment: not applied".into(),
                    revision: None,
                }),
            }
        }
        .await;
        let mut ran = res.unwrap_or_else(|e| Ran::failed(&e));
        if let Some(dead) = dead {
            ran.outcome = format!("taken over after the claim of {dead} expired: {}", ran.outcome);
        }
        if ran.state != ScheduledState::Applied || dead.is_some() {
            // Not applied: audited as what happened, never as applied. A takeover is
            // audited too (once: only one run claims it), whatever its outcome.
            self.audit_run(&by, &reason, c, &ran).await;
        }
        ran
    }

    async fn audit_run(&self, by: &Actor, reason: &Reason, c: &ScheduledRow, ran: &Ran) {
        let mut audit: AuditRow = audit_row(
            by,
            reason,
            Action::ScheduleRun,
            format!("{} (scheduled change {})", describe(c), c.id),
        );
        audit.environment = Some(c.environment.clone());
        audit.service = c.service.clone();
        // A run ends applied, conflict or failed (`Ran`); nothing else is a run's end.
        audit.outcome = match ran.state {
            ScheduledState::Applied => AuditOutcome::Ok,
            ScheduledState::Conflict => AuditOutcome::Conflict,
            _ => AuditOutcome::Failed,
        };
        // The scheduled change is the target: its state as this run claimed it and as
        // the run left it; what happened, in words, is the detail.
        audit.before = Some(json!({"state": c.state}).to_string());
        audit.after = Some(json!({"state": ran.state}).to_string());
        audit.detail = Some(ran.outcome.clone());
        if let Err(e) = self.store.append_audit(&audit).await {
            tracing::error!(error = ?e, id = c.id, "auditing a scheduled change that did not apply");
        }
    }

    /// The author of `c` acting with `role`, via `server`, with the break-glass reason it
    /// was scheduled with, if any.
    fn author(&self, c: &ScheduledRow, role: Role) -> Actor {
        Actor {
            name: c.created_by.clone(),
            role,
            via: super::Via::Server,
            request_id: format!("scheduled-{}", c.id),
            approval: match &c.break_glass {
                Some(why) => super::Approval::BreakGlass(why.clone()),
                None => super::Approval::None,
            },
            user: None,
            person: c.created_user.clone(),
            token: c.created_token.clone(),
        }
    }

    /// The author of `c` as they are now: a user's role now (a disabled or deleted user
    /// runs nothing), an API token's role now (a revoked or expired token runs nothing),
    /// else the role recorded when it was scheduled. The automatic revert of an applied
    /// change is upkeep: it puts back what the change replaced, and only if nobody changed
    /// it since, so it runs whatever became of its author.
    async fn author_now(&self, c: &ScheduledRow) -> Result<Actor, ChangeError> {
        let scheduled = Role::parse(&c.created_role).unwrap_or(Role::Viewer);
        if c.reverts.is_some() {
            return Ok(Actor { approval: super::Approval::Upkeep, ..self.author(c, scheduled) });
        }
        let role = if let Some(u) = &c.created_user {
            match self.store.user(u).await? {
                Some(u) if !u.disabled => u.role,
                _ => {
                    return Err(ChangeError::AuthorGone { what: format!("user {u} is disabled or deleted") });
                }
            }
        } else if let Some(t) = &c.created_token {
            match self.store.token(t).await? {
                Some(t) if !t.revoked(now_ms()) && t.expires_at > now_ms() => t.role.unwrap_or(Role::Viewer),
                Some(t) => {
                    return Err(ChangeError::AuthorGone {
                        what: format!("token {} is revoked or expired", t.name),
                    });
                }
                None => return Err(ChangeError::AuthorGone { what: "its token no longer exists".into() }),
            }
        } else {
            scheduled
        };
        Ok(self.author(c, role))
    }
}

/// What a scheduled change targets, in words: `flag KEY`, `policy`, `profile NAME`,
/// `experiment NAME`.
pub fn describe(c: &ScheduledRow) -> String {
    match c.kind {
        ChangeKind::Flag => format!("flag {}", c.target),
        ChangeKind::Profile => format!("profile {}", c.target),
        ChangeKind::Policy => "policy".into(),
        ChangeKind::Experiment => format!("experiment {}", c.target),
    }
}

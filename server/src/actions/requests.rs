//! Four-eyes: per environment an admin chooses which kinds of change — `policy` (a
//! service's policy), `flag` (a service's flags), `profile` (applying an emergency profile),
//! `experiment` (starting an experiment) — need an approved change request.
//!
//! A rule covers what a write *changes*, whatever action or object carries it: every write
//! of a service's configuration compares its parts before and after ([`kinds_changed`],
//! called by `Actions::write` and by service creation and deletion), so a whole-service
//! apply, a rollback, an emergency profile or a delete-and-create that changes a flag needs
//! what a flip needs. A change of a gated kind is refused ([`ChangeError::ApprovalRequired`])
//! unless it is the application of an approved request, or break-glass: the actor gives a
//! reason for bypassing review ([`Approval::BreakGlass`]), and the change is applied at once
//! and audited twice — as itself and as `approval.bypass` with outcome `bypass`, which the
//! audit page highlights. Only the server's upkeep ([`Approval::Upkeep`]: expiries, putting
//! back what an emergency profile replaced) is not a change of its own.
//!
//! A request records the change and what its target looked like when it was proposed (for
//! a profile, the version and hash of its definition). The proposer — the person behind
//! whatever session or token proposed it — cannot approve it; an approval names the version
//! approved, and any edit makes a new version and voids the approval; applying requires the
//! approved version and an unchanged target (a flag, policy or profile edited since voids
//! the approval: the request ends as `conflict`, [`ChangeError::ApprovalVoid`]), so what is
//! applied is exactly what was reviewed.
//!
//! An experiment where a rule covers them is proposed by starting it
//! (`Actions::start_experiment`); the request holds its whole definition, and applying the
//! approved version starts exactly that definition.

use std::collections::BTreeMap;
use std::time::Duration;

use levee_agent::policy::{FieldError, Policy, ServiceConfig, Timestamp};
use serde_json::{Value, json};

use super::{Action, Actions, Actor, ChangeError, Missing, NewExperiment, Reason, ServiceAt, audit_row};
use crate::db::{AuditOutcome, AuditRow, ChangeKind, Parts, RequestRow, RequestState, now_ms};

/// How an actor's change relates to four-eyes review.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum Approval {
    /// An ordinary change: refused where its kind needs approval.
    #[default]
    None,
    /// The application of approved change request `id`.
    Request(i64),
    /// Break-glass: applied at once without review, for this reason (audited as a bypass).
    BreakGlass(String),
    /// The server's own upkeep: an expiry, or putting back what an emergency profile
    /// replaced (its revert, by hand or at its end). It restores what was there before the
    /// change that passed the rules, so it is not a change of its own kind.
    Upkeep,
}

/// The kinds of approval rule a write of a service from `before` to `after` falls under
/// (`None`: the service does not exist on that side, as for a creation or a deletion):
/// `policy` when the policy differs, `flag` when any flag is added, removed or changed. The
/// one statement of "a rule covers what a write changes".
pub(super) fn kinds_changed(before: Option<&Parts>, after: Option<&Parts>) -> Vec<ChangeKind> {
    let empty = BTreeMap::new();
    let mut kinds = Vec::new();
    if before.map(|p| &p.policy) != after.map(|p| &p.policy) {
        kinds.push(ChangeKind::Policy);
    }
    if before.map_or(&empty, |p| &p.flags) != after.map_or(&empty, |p| &p.flags) {
        kinds.push(ChangeKind::Flag);
    }
    kinds
}

/// `kinds_changed` between two snapshot bodies of a service: the kinds of approval rule
/// that making `to` current again instead of `now` falls under (a rollback), for a page to
/// say before the change is tried.
pub fn config_kinds_changed(now: &ServiceConfig, to: &ServiceConfig) -> Vec<ChangeKind> {
    let parts = |c: &ServiceConfig| Parts::from_config(c.clone(), false);
    kinds_changed(Some(&parts(now)), Some(&parts(to)))
}

/// The approval rules of an environment as they apply to one actor's change.
#[derive(Clone, Debug)]
pub(super) struct FourEyes {
    env: String,
    /// The kinds that need approval there; empty when this change is exempt (an approved
    /// request's application, the server's upkeep).
    kinds: Vec<ChangeKind>,
    approval: Approval,
}

/// A change applied by break-glass: the gated kinds it changed and the reason given.
#[derive(Clone, Debug)]
pub(super) struct Bypass {
    kinds: Vec<ChangeKind>,
    why: Reason,
}

impl FourEyes {
    /// How a change of `changed` kinds passes: `None` when none of them needs approval,
    /// the [`Bypass`] to audit when the actor breaks the glass.
    ///
    /// # Errors
    /// [`ChangeError::ApprovalRequired`] naming the first gated kind;
    /// [`ChangeError::InvalidField`] on `break_glass` without a reason.
    pub(super) fn admit(&self, changed: &[ChangeKind]) -> Result<Option<Bypass>, ChangeError> {
        let gated: Vec<ChangeKind> = changed.iter().copied().filter(|k| self.kinds.contains(k)).collect();
        let Some(&first) = gated.first() else { return Ok(None) };
        let Approval::BreakGlass(why) = &self.approval else {
            return Err(ChangeError::ApprovalRequired { env: self.env.clone(), kind: first });
        };
        let why = Reason::parse(why).map_err(|e| {
            ChangeError::InvalidField(FieldError {
                path: "break_glass".into(),
                value: String::new(),
                message: format!("break-glass needs a reason: {e}"),
            })
        })?;
        Ok(Some(Bypass { kinds: gated, why }))
    }
}

/// A proposed change.
#[derive(Clone, Debug, PartialEq)]
pub enum Proposal {
    /// A new value of an existing flag.
    Flag { service: String, key: String, value: Value },
    /// A new policy.
    Policy { service: String, policy: Box<Policy> },
    /// Applying a profile for a duration.
    Profile { name: String, lasts: Duration },
    /// Starting an experiment, checked by `crate::experiments` (its spec is the payload).
    Experiment(Box<NewExperiment>),
}

impl Actions {
    /// The approval rules of `env` as they apply to `by`'s change, read now.
    pub(super) async fn four_eyes(&self, by: &Actor, env: &str) -> Result<FourEyes, ChangeError> {
        let exempt = matches!(by.approval, Approval::Request(_) | Approval::Upkeep);
        let kinds = if exempt { Vec::new() } else { self.store.approval_kinds(env).await? };
        Ok(FourEyes { env: env.to_string(), kinds, approval: by.approval.clone() })
    }

    /// Audits a change applied by break-glass as `approval.bypass` (outcome `bypass`),
    /// naming the kinds it changed; `revision` is the revision it made, if any.
    pub(super) async fn record_bypass(
        &self,
        by: &Actor,
        env: &str,
        service: Option<&str>,
        target: &str,
        b: &Bypass,
        revision: Option<u64>,
    ) -> Result<(), ChangeError> {
        let kinds = b.kinds.iter().map(|k| k.as_str()).collect::<Vec<_>>().join(", ");
        let mut audit = audit_row(by, &b.why, Action::ApprovalBypass, format!("{kinds}: {target}"));
        audit.environment = Some(env.to_string());
        audit.service = service.map(str::to_string);
        audit.outcome = AuditOutcome::Bypass;
        audit.revision = revision.map(|r| r as i64);
        self.store.append_audit(&audit).await?;
        tracing::warn!(actor = %by.name, environment = env, kinds, target, "break-glass: change applied without approval");
        Ok(())
    }

    /// Audits an action refused by [`Actions::gate`] for want of approval as the action it
    /// attempted, outcome `rejected` and the refusal as `detail`, as a refused write is
    /// (`Store::mutate`): a refused profile application during an incident is on the
    /// record. A failure to audit is logged.
    pub(super) async fn record_approval_refused(
        &self,
        by: &Actor,
        env: &str,
        service: Option<&str>,
        action: Action,
        target: &str,
        refusal: &ChangeError,
    ) {
        tracing::warn!(actor = %by.name, environment = env, service, target, "refused: approval required");
        let mut audit = audit_row(by, &Reason::by_server(String::new()), action, target.to_string());
        audit.environment = Some(env.to_string());
        audit.service = service.map(str::to_string);
        audit.outcome = AuditOutcome::Rejected;
        audit.detail = Some(refusal.to_string());
        if let Err(e) = self.store.append_audit(&audit).await {
            tracing::error!(error = %e, environment = env, "auditing a refusal for want of approval");
        }
    }

    /// Refuses `by`'s action of `kind` in `env` when that kind needs approval there, unless
    /// it applies an approved request or breaks the glass (audited as `approval.bypass`):
    /// for what is gated as an action rather than by the content it changes (applying a
    /// profile, scheduling or moving a change). What the action then writes is checked
    /// again by content ([`kinds_changed`]).
    pub(super) async fn gate(
        &self,
        by: &Actor,
        env: &str,
        kind: ChangeKind,
        target: &str,
    ) -> Result<(), ChangeError> {
        let admitted = self.four_eyes(by, env).await?.admit(&[kind]);
        if let Err(e @ ChangeError::ApprovalRequired { .. }) = &admitted {
            self.record_approval_refused(by, env, None, underlying_kind(kind), target, e).await;
        }
        if let Some(b) = admitted? {
            self.record_bypass(by, env, None, target, &b, None).await?;
        }
        Ok(())
    }

    /// Sets the kinds of change that need approval in `env` (admin; audited as
    /// `approval.rules`).
    ///
    /// # Errors
    /// [`ChangeError`]: an unknown kind is refused naming it.
    pub async fn set_approval_rules(
        &self,
        by: &Actor,
        reason: &Reason,
        env: &str,
        kinds: Vec<String>,
    ) -> Result<Vec<ChangeKind>, ChangeError> {
        by.may(Action::ApprovalRules)?;
        self.store
            .environment(env)
            .await?
            .ok_or_else(|| ChangeError::NotFound(Missing::Environment { env: env.to_string() }))?;
        let mut kinds = kinds
            .iter()
            .enumerate()
            .map(|(i, k)| {
                ChangeKind::parse(k).map_err(|_| {
                    ChangeError::InvalidField(FieldError {
                        path: format!("kinds[{i}]"),
                        value: format!("{k:?}"),
                        message: ChangeKind::allowed(),
                    })
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        kinds.sort_by_key(|k| k.as_str());
        kinds.dedup();
        let mut audit = audit_row(by, reason, Action::ApprovalRules, "approval rules".into());
        audit.environment = Some(env.to_string());
        audit.before = Some(json!(self.store.approval_kinds(env).await?).to_string());
        audit.after = Some(json!(kinds).to_string());
        self.store.set_approval_kinds(env, &kinds, &audit).await?;
        Ok(kinds)
    }

    /// The target of a proposal as it is now: (JSON of it, the service's revision).
    async fn target_now(
        &self,
        env: &str,
        kind: ChangeKind,
        service: Option<&str>,
        target: &str,
    ) -> Result<(Option<String>, Option<u64>), ChangeError> {
        let Some(svc) = service else {
            // A profile is applied as its definition is at apply time: the approval binds to
            // the definition reviewed, by version and hash.
            let row = self.store.profile(env, target).await?.ok_or_else(|| {
                ChangeError::NotFound(Missing::Profile { env: env.into(), name: target.into() })
            })?;
            return Ok((Some(profile_content(&row)), None));
        };
        let snap = self.store.latest_snapshot(env, svc).await?;
        let (Some(snap), Some(_)) = (snap, self.store.service(env, svc).await?) else {
            return Err(ChangeError::NotFound(Missing::Service { env: env.into(), service: svc.into() }));
        };
        let cfg = snap.config()?;
        let json = match kind {
            ChangeKind::Flag => cfg.flags.get(target).map(|f| json!(f).to_string()),
            ChangeKind::Policy | ChangeKind::Profile => Some(json!(cfg.policy).to_string()),
            // An experiment changes nothing it could find moved: the approval binds to its
            // definition (the payload, by version), checked again when it starts.
            ChangeKind::Experiment => None,
        };
        Ok((json, Some(snap.revision)))
    }

    /// Checks `p` as it would be applied now; returns (kind, service, target, payload JSON).
    async fn check_proposal(
        &self,
        env: &str,
        p: &Proposal,
    ) -> Result<(ChangeKind, Option<String>, String, String), ChangeError> {
        match p {
            Proposal::Flag { service, key, value } => {
                let (flag, _) = self.target_now(env, ChangeKind::Flag, Some(service), key).await?;
                let flag: levee_agent::policy::Flag =
                    flag.and_then(|f| serde_json::from_str(&f).ok()).ok_or_else(|| {
                        ChangeError::NotFound(Missing::Flag { service: service.clone(), key: key.clone() })
                    })?;
                flag.kind.check("value", value).map_err(ChangeError::InvalidField)?;
                Ok((ChangeKind::Flag, Some(service.clone()), key.clone(), value.to_string()))
            }
            Proposal::Policy { service, policy } => {
                let snap = self.store.latest_snapshot(env, service).await?.ok_or_else(|| {
                    ChangeError::NotFound(Missing::Service { env: env.into(), service: service.clone() })
                })?;
                let cfg = snap.config()?;
                ServiceConfig { policy: (**policy).clone(), ..cfg }
                    .validate()
                    .map_err(ChangeError::Invalid)?;
                Ok((ChangeKind::Policy, Some(service.clone()), "policy".into(), json!(policy).to_string()))
            }
            Proposal::Profile { name, lasts } => {
                self.store.profile(env, name).await?.ok_or_else(|| {
                    ChangeError::NotFound(Missing::Profile { env: env.into(), name: name.clone() })
                })?;
                if lasts.is_zero() || *lasts > super::MAX_PROFILE_DURATION {
                    return Err(ChangeError::InvalidField(FieldError {
                        path: "expires_in".into(),
                        value: format!("{lasts:?}"),
                        message: "must be more than 0 and at most 7 days".into(),
                    }));
                }
                Ok((
                    ChangeKind::Profile,
                    None,
                    name.clone(),
                    json!({"expires_in_ms": lasts.as_millis() as u64}).to_string(),
                ))
            }
            Proposal::Experiment(new) => {
                if new.environment != env {
                    return Err(ChangeError::InvalidField(FieldError {
                        path: "environment".into(),
                        value: format!("{:?}", new.environment),
                        message: format!("must be the change request's environment ({env})"),
                    }));
                }
                self.check_experiment(new).await?;
                Ok((ChangeKind::Experiment, Some(new.service.clone()), new.name.clone(), new.spec.clone()))
            }
        }
    }

    /// Proposes a change (audited as `request.create`); its author needs the role of the
    /// change itself.
    ///
    /// # Errors
    /// [`ChangeError`]: what it refers to missing; an invalid value or policy.
    pub async fn propose(
        &self,
        by: &Actor,
        reason: &Reason,
        env: &str,
        p: Proposal,
    ) -> Result<RequestRow, ChangeError> {
        by.may(Action::RequestCreate)?;
        by.may(underlying(&p))?;
        let (kind, service, target, payload) = self.check_proposal(env, &p).await?;
        let (expected, base_revision) = self.target_now(env, kind, service.as_deref(), &target).await?;
        let mut row = RequestRow {
            environment: env.to_string(),
            service,
            kind,
            target,
            payload,
            expected,
            base_revision,
            version: 1,
            state: RequestState::Open,
            proposed_by: by.name.clone(),
            proposed_person: Some(by.person()),
            proposed_at: now_ms(),
            reason: reason.as_str().into(),
            ..Default::default()
        };
        let mut audit = audit_row(by, reason, Action::RequestCreate, describe_request(&row));
        audit.environment = Some(env.to_string());
        audit.service = row.service.clone();
        audit.after = Some(row.payload.clone());
        row.id = self.store.create_request(&row, &audit).await?;
        Ok(row)
    }

    fn request_missing(id: i64) -> ChangeError {
        ChangeError::NotFound(Missing::ChangeRequest { id })
    }

    async fn transition(
        &self,
        old: &RequestRow,
        next: RequestRow,
        mut audit: AuditRow,
    ) -> Result<RequestRow, ChangeError> {
        audit.environment = Some(old.environment.clone());
        audit.service = old.service.clone();
        audit.target = format!("{} (change request {})", describe_request(old), old.id);
        if !self.store.update_request(old.id, old.version, old.state, &next, &audit).await? {
            let now = self.store.request(old.id).await?.ok_or_else(|| Self::request_missing(old.id))?;
            return Err(ChangeError::Conflict { expected: old.version, current: now.version });
        }
        Ok(next)
    }

    /// Replaces what request `id` proposes (its proposer only; audited as
    /// `request.update`): a new version, against the target as it is now; an approval it
    /// had is void.
    ///
    /// # Errors
    /// [`ChangeError`]: [`Missing::ChangeRequest`] unless open or approved;
    /// [`ChangeError::NotProposer`].
    pub async fn edit_request(
        &self,
        by: &Actor,
        reason: &Reason,
        id: i64,
        p: Proposal,
    ) -> Result<RequestRow, ChangeError> {
        by.may(Action::RequestUpdate)?;
        let old = self
            .store
            .request(id)
            .await?
            .filter(|r| r.state.is_pending())
            .ok_or_else(|| Self::request_missing(id))?;
        if old.proposed_by != by.name && !by.is(&proposer(&old)) {
            return Err(ChangeError::NotProposer { id, proposer: old.proposed_by });
        }
        let (kind, service, target, payload) = self.check_proposal(&old.environment, &p).await?;
        if (kind, service.as_deref(), target.as_str())
            != (old.kind, old.service.as_deref(), old.target.as_str())
        {
            return Err(ChangeError::InvalidField(FieldError {
                path: "kind".into(),
                value: kind.to_string(),
                message: format!(
                    "a request keeps its target ({}); propose a new one instead",
                    describe_request(&old)
                ),
            }));
        }
        let (expected, base_revision) =
            self.target_now(&old.environment, kind, service.as_deref(), &target).await?;
        let next = RequestRow {
            payload,
            expected,
            base_revision,
            version: old.version + 1,
            state: RequestState::Open,
            approved_by: None,
            approved_at: None,
            approved_version: None,
            decided_reason: None,
            ..old.clone()
        };
        let mut audit = audit_row(by, reason, Action::RequestUpdate, String::new());
        audit.before =
            Some(json!({"version": old.version, "state": old.state, "payload": old.payload}).to_string());
        audit.after = Some(json!({"version": next.version, "approval_voided": old.state == RequestState::Approved, "payload": next.payload}).to_string());
        self.transition(&old, next, audit).await
    }

    /// Approves version `version` of request `id` (anyone with the change's role but its
    /// proposer; audited as `request.approve`).
    ///
    /// # Errors
    /// [`ChangeError`]: [`ChangeError::SelfApproval`]; [`ChangeError::Conflict`] when the
    /// request is at another version than the one reviewed.
    pub async fn approve_request(
        &self,
        by: &Actor,
        reason: &Reason,
        id: i64,
        version: u64,
    ) -> Result<RequestRow, ChangeError> {
        by.may(Action::RequestApprove)?;
        let old = self
            .store
            .request(id)
            .await?
            .filter(|r| r.state == RequestState::Open)
            .ok_or_else(|| Self::request_missing(id))?;
        by.may(underlying_kind(old.kind))?;
        // The person, not the name: a token the proposer minted is the proposer too.
        if old.proposed_by == by.name || by.is(&proposer(&old)) {
            return Err(ChangeError::SelfApproval { id });
        }
        if old.version != version {
            return Err(ChangeError::Conflict { expected: version, current: old.version });
        }
        let next = RequestRow {
            state: RequestState::Approved,
            approved_by: Some(by.name.clone()),
            approved_at: Some(now_ms()),
            approved_version: Some(version),
            decided_reason: Some(reason.as_str().into()),
            ..old.clone()
        };
        let mut audit = audit_row(by, reason, Action::RequestApprove, String::new());
        audit.after = Some(json!({"version": version, "payload": old.payload}).to_string());
        self.transition(&old, next, audit).await
    }

    /// Rejects request `id` (audited as `request.reject`); its proposer may withdraw it so.
    ///
    /// # Errors
    /// [`ChangeError`]: [`Missing::ChangeRequest`] unless open or approved.
    pub async fn reject_request(
        &self,
        by: &Actor,
        reason: &Reason,
        id: i64,
    ) -> Result<RequestRow, ChangeError> {
        by.may(Action::RequestReject)?;
        let old = self
            .store
            .request(id)
            .await?
            .filter(|r| r.state.is_pending())
            .ok_or_else(|| Self::request_missing(id))?;
        let next = RequestRow {
            state: RequestState::Rejected,
            decided_reason: Some(reason.as_str().into()),
            ..old.clone()
        };
        self.transition(&old, next, audit_row(by, reason, Action::RequestReject, String::new())).await
    }

    /// Applies approved request `id` exactly as approved (audited as the change itself, and
    /// as `request.apply`). A target changed since the proposal ends the request as
    /// `conflict`, unapplied. An `experiment` request is started as `experiment`, the
    /// experiment its payload defines (read by `crate::experiments`, which runs it; the
    /// request's `experiment_id` names it).
    ///
    /// # Errors
    /// [`ChangeError`]: [`Missing::ChangeRequest`] unless approved;
    /// [`ChangeError::Conflict`] when the target moved (the request is then `conflict`);
    /// [`ChangeError::InvalidField`] on an `experiment` request without `experiment`, or
    /// with one that is not its payload.
    pub async fn apply_request(
        &self,
        by: &Actor,
        reason: &Reason,
        id: i64,
        experiment: Option<&NewExperiment>,
    ) -> Result<RequestRow, ChangeError> {
        by.may(Action::RequestApply)?;
        let old = self
            .store
            .request(id)
            .await?
            .filter(|r| r.state == RequestState::Approved)
            .ok_or_else(|| Self::request_missing(id))?;
        by.may(underlying_kind(old.kind))?;
        if old.approved_version != Some(old.version) {
            return Err(Self::request_missing(id)); // cannot happen: an edit reopens it
        }
        // An approval holds while its approver could still give it: a user disabled,
        // deleted or demoted below the change's role since no longer approves it. (An
        // approval through an API token is judged when given: its name is all that is kept.)
        if let Some(approver) = old.approved_by.as_deref().filter(|a| !a.starts_with("token:")) {
            let needed = underlying_kind(old.kind).role();
            match self.store.user(approver).await? {
                Some(u) if !u.disabled && u.role >= needed => {}
                _ => {
                    let outcome = format!(
                        "approved by {approver}, who can no longer approve it (disabled, deleted or below the {} \
                         role): the approval is void",
                        needed.as_str()
                    );
                    return Err(self.void(by, reason, &old, outcome).await?);
                }
            }
        }
        let env = old.environment.clone();
        let (now, rev) = self.target_now(&env, old.kind, old.service.as_deref(), &old.target).await?;
        if now != old.expected {
            let outcome = match old.kind {
                ChangeKind::Profile => format!(
                    "{} was edited since the request was proposed: the approval is void",
                    describe_request(&old)
                ),
                ChangeKind::Flag | ChangeKind::Policy | ChangeKind::Experiment => format!(
                    "{} changed since the request was proposed (at revision {}, now {}): the approval is \
                     void",
                    describe_request(&old),
                    old.base_revision.unwrap_or(0),
                    rev.unwrap_or(0)
                ),
            };
            return Err(self.void(by, reason, &old, outcome).await?);
        }
        let applier = Actor { approval: Approval::Request(id), ..by.clone() };
        let why = Reason::by_server(format!(
            "{} (change request {id}, approved by {})",
            old.reason,
            old.approved_by.clone().unwrap_or_default()
        ));
        let payload: Value =
            serde_json::from_str(&old.payload).map_err(|e| ChangeError::Storage(e.into()))?;
        let mut experiment_id = None;
        let revision = match old.kind {
            ChangeKind::Flag => {
                let at = ServiceAt::new(&env, old.service.clone().unwrap_or_default(), rev);
                Some(
                    self.set_flag_value(&applier, &why, &at, &old.target, payload, None)
                        .await?
                        .snapshot
                        .revision,
                )
            }
            ChangeKind::Policy => {
                let at = ServiceAt::new(&env, old.service.clone().unwrap_or_default(), rev);
                let policy: Policy =
                    serde_json::from_value(payload).map_err(|e| ChangeError::Storage(e.into()))?;
                Some(self.update_policy(&applier, &why, &at, policy).await?.snapshot.revision)
            }
            ChangeKind::Profile => {
                let ms = payload["expires_in_ms"].as_i64().unwrap_or(0);
                let until = Timestamp::from_unix_ms(now_ms().saturating_add(ms));
                let version = old
                    .expected
                    .as_deref()
                    .and_then(|e| serde_json::from_str::<Value>(e).ok())
                    .and_then(|e| e["version"].as_u64());
                let applied = self.apply_profile_as(&applier, &why, &env, &old.target, until, version).await;
                if let Err(ChangeError::Conflict { .. }) = applied {
                    // Edited between the check above and the application.
                    let outcome = format!(
                        "{} was edited since the request was proposed: the approval is void",
                        describe_request(&old)
                    );
                    return Err(self.void(by, reason, &old, outcome).await?);
                }
                applied?;
                None
            }
            ChangeKind::Experiment => {
                // Exactly the definition approved: the caller read it from the payload.
                let new = experiment.filter(|n| n.spec == old.payload && n.environment == env).ok_or_else(
                    || {
                        ChangeError::InvalidField(FieldError {
                            path: "experiment".into(),
                            value: String::new(),
                            message: format!("is not the definition change request {id} approved"),
                        })
                    },
                )?;
                self.check_experiment(new).await?;
                experiment_id = Some(self.insert_experiment(&applier, &why, new).await?);
                None
            }
        };
        let next = RequestRow {
            state: RequestState::Applied,
            applied_by: Some(by.name.clone()),
            applied_at: Some(now_ms()),
            revision,
            outcome: Some(match (revision, experiment_id) {
                (Some(r), _) => format!("applied as revision {r}"),
                (None, Some(e)) => format!("started as experiment {e}"),
                (None, None) => "applied".into(),
            }),
            experiment_id,
            ..old.clone()
        };
        let mut audit = audit_row(by, reason, Action::RequestApply, String::new());
        audit.revision = revision.map(|r| r as i64);
        self.transition(&old, next, audit).await
    }
}

/// The person who proposed `r` (`proposed_by` for a request from before it was recorded).
fn proposer(r: &RequestRow) -> String {
    r.proposed_person.clone().unwrap_or_else(|| r.proposed_by.clone())
}

impl Actions {
    /// Ends approved request `old` as `conflict` because its approval no longer covers it
    /// (`outcome` says why; audited as `request.apply` with outcome `conflict`), and returns
    /// the error to answer.
    async fn void(
        &self,
        by: &Actor,
        reason: &Reason,
        old: &RequestRow,
        outcome: String,
    ) -> Result<ChangeError, ChangeError> {
        let next =
            RequestRow { state: RequestState::Conflict, outcome: Some(outcome.clone()), ..old.clone() };
        let mut audit = audit_row(by, reason, Action::RequestApply, String::new());
        audit.outcome = AuditOutcome::Conflict;
        audit.detail = Some(outcome.clone());
        self.transition(old, next, audit).await?;
        Ok(ChangeError::ApprovalVoid { id: old.id, what: describe_request(old), why: outcome })
    }
}

/// The action a proposal would take.
fn underlying(p: &Proposal) -> Action {
    match p {
        Proposal::Flag { .. } => Action::FlagSet,
        Proposal::Policy { .. } => Action::PolicyUpdate,
        Proposal::Profile { .. } => Action::ProfileApply,
        Proposal::Experiment(_) => Action::ExperimentStart,
    }
}

fn underlying_kind(kind: ChangeKind) -> Action {
    match kind {
        ChangeKind::Flag => Action::FlagSet,
        ChangeKind::Profile => Action::ProfileApply,
        ChangeKind::Policy => Action::PolicyUpdate,
        ChangeKind::Experiment => Action::ExperimentStart,
    }
}

/// What a profile request binds to: the version and content hash of the definition.
fn profile_content(row: &crate::db::ProfileRow) -> String {
    json!({"version": row.version, "hash": levee_agent::policy::content_hash(row.body.as_bytes())})
        .to_string()
}

/// What a request targets, in words: `flag KEY of SERVICE`, `policy of SERVICE`, `profile NAME`.
pub fn describe_request(r: &RequestRow) -> String {
    let svc = r.service.as_deref().unwrap_or_default();
    match r.kind {
        ChangeKind::Flag => format!("flag {} of {svc}", r.target),
        ChangeKind::Profile => format!("profile {}", r.target),
        ChangeKind::Policy => format!("policy of {svc}"),
        ChangeKind::Experiment => format!("experiment {} of {svc}", r.target),
    }
}

/// The target of a request before and after it, as JSON, for the reviewer's diff: the flag
/// or policy as it was when proposed and as it would be; a profile's application (the
/// profile, the version of its definition the approval binds to, how long it stays); an
/// experiment's whole definition (nothing before it).
pub fn request_sides(r: &RequestRow) -> (Value, Value) {
    let before: Value =
        r.expected.as_deref().and_then(|e| serde_json::from_str(e).ok()).unwrap_or(Value::Null);
    let payload: Value = serde_json::from_str(&r.payload).unwrap_or(Value::Null);
    match r.kind {
        ChangeKind::Flag => {
            let mut after = before.clone();
            if let Some(o) = after.as_object_mut() {
                o.insert("value".into(), payload);
            }
            (before, after)
        }
        ChangeKind::Profile => (
            json!({}),
            json!({"profile": r.target, "version": before["version"], "expires_in_ms": payload["expires_in_ms"]}),
        ),
        ChangeKind::Policy => (before, payload),
        ChangeKind::Experiment => (json!({}), payload),
    }
}

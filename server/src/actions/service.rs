//! Services: creating one, replacing its policy, rolling it back.

use std::collections::BTreeMap;

use levee_agent::policy::{Flag, Policy, ValidationErrors, canonical_json};

use super::profiles::overriding;
use super::{
    Action, Actions, Actor, BadInput, ChangeError, CreateError, Existing, Missing, Name, Reason, ServiceAt,
    Written, profile_undo,
};
use crate::db::{AuditDiff, AuditOutcome, AuditRow, Change, MutateError, Parts, Staging, Subject};

/// A service to create: its first revision holds `policy` and `flags`.
#[derive(Clone, Debug)]
pub struct NewService {
    /// Its name in the environment.
    pub name: Name,
    /// Free text shown in lists.
    pub description: String,
    /// The first policy.
    pub policy: Policy,
    /// The first flags, by key.
    pub flags: BTreeMap<String, Flag>,
}

impl NewService {
    /// Checks the form of a new service (its `name`).
    ///
    /// # Errors
    /// [`BadInput`] on the field `name`.
    pub fn new(
        name: &str,
        description: String,
        policy: Policy,
        flags: BTreeMap<String, Flag>,
    ) -> Result<NewService, BadInput> {
        Ok(NewService { name: Name::parse("name", name)?, description, policy, flags })
    }
}

/// What a service declares, as a manifest holds it (`levee apply`): everything agents
/// receive except the operational state (fault rules, breaker overrides), plus its
/// description.
#[derive(Clone, Debug)]
pub struct Declared {
    /// Free text shown in lists (not sent to agents).
    pub description: String,
    /// The whole policy.
    pub policy: Policy,
    /// Every flag, by key: a flag of the service that is not here is deleted.
    pub flags: BTreeMap<String, Flag>,
}

impl Declared {
    /// Checks the form of a declared service (the description's length and characters).
    ///
    /// # Errors
    /// [`BadInput`] on the field `description`.
    pub fn new(
        description: String,
        policy: Policy,
        flags: BTreeMap<String, Flag>,
    ) -> Result<Declared, BadInput> {
        super::check_text("description", &description)?;
        Ok(Declared { description, policy, flags })
    }
}

/// Puts the paths of `errors` under `prefix` (`retry.max_attempts` → `policy.retry.max_attempts`).
fn under(prefix: &str, mut errors: ValidationErrors) -> ValidationErrors {
    for e in &mut errors.0 {
        e.path = if e.path.is_empty() || e.path == "." {
            prefix.to_string()
        } else {
            format!("{prefix}.{}", e.path)
        };
    }
    errors
}

impl Actions {
    /// Creates a service in `env` with its first revision (1), audited as
    /// `service.create` with the snapshot as `after`, and publishes it.
    ///
    /// # Errors
    /// [`CreateError`]: no such environment, a service of that name exists, the
    /// configuration does not validate (checked before the database is touched).
    pub async fn create_service(
        &self,
        by: &Actor,
        reason: &Reason,
        env: &str,
        new: NewService,
    ) -> Result<Written, CreateError> {
        by.may(Action::ServiceCreate)?;
        let environment = self
            .store
            .environment(env)
            .await?
            .ok_or_else(|| CreateError::NotFound(Missing::Environment { env: env.to_string() }))?;
        let parts = Parts {
            policy: new.policy,
            flags: new.flags,
            faults: BTreeMap::new(),
            overrides: BTreeMap::new(),
            faults_allowed: environment.allow_faults,
            levers: None,
            restores: BTreeMap::new(),
        };
        let config = parts.config();
        config.validate().map_err(CreateError::Invalid)?;
        if let Err(ChangeError::InvalidField(e)) = super::flags::all_expire_in_future(&config.flags) {
            return Err(CreateError::Invalid(ValidationErrors(vec![e])));
        }
        let diff = AuditDiff { after: String::from_utf8(canonical_json(&config)).ok(), ..Default::default() };
        let name = new.name.as_str();
        // A new service sets a policy and its flags where there were none: the same rules
        // as changing them, or deleting a service and creating it again would pass any. A
        // name already taken is answered as such first, whatever the rules.
        if self.store.service(env, name).await?.is_some() {
            return Err(CreateError::AlreadyExists(Existing::Service {
                env: env.to_string(),
                name: name.to_string(),
            }));
        }
        let admitted =
            self.four_eyes(by, env).await?.admit(&super::requests::kinds_changed(None, Some(&parts)));
        let bypass = match admitted {
            Ok(b) => b,
            Err(e) => {
                let mut audit = super::audit_row(by, reason, Action::ServiceCreate, name.to_string());
                audit.environment = Some(env.to_string());
                audit.service = Some(name.to_string());
                return Err(self.refuse_audited(audit, e).await.into());
            }
        };
        let change = Change {
            env,
            service: name,
            action: Action::ServiceCreate.name(),
            target: name,
            subject: Subject::Config,
            expected: None,
            staging: Staging::Immediate,
        };
        match self.store.create_service(change, &new.description, parts, diff, &by.audit_ctx(reason)).await {
            Ok(Some(c)) => {
                let written = self.publish(c).await;
                if let Some(b) = bypass {
                    let rev = Some(written.snapshot.revision);
                    if let Err(e) = self.record_bypass(by, env, Some(name), name, &b, rev).await {
                        tracing::error!(error = %e, environment = env, service = name, "auditing a break-glass change");
                    }
                }
                Ok(written)
            }
            Ok(None) => Err(CreateError::AlreadyExists(Existing::Service {
                env: env.to_string(),
                name: name.to_string(),
            })),
            Err(MutateError::NoEnvironment(env)) => Err(CreateError::NotFound(Missing::Environment { env })),
            Err(MutateError::Invalid(v)) => Err(CreateError::Invalid(v)),
            Err(MutateError::Db(e)) => Err(CreateError::Storage(e)),
            Err(MutateError::Refused(never)) => match never {},
            Err(
                e @ (MutateError::NoService { .. } | MutateError::Conflict { .. } | MutateError::Rollout(_)),
            ) => Err(CreateError::Storage(anyhow::anyhow!("creating a service: {e}"))),
        }
    }

    /// Replaces the policy of `at`'s service (audited as `policy.update`, before and after
    /// the policy).
    ///
    /// # Errors
    /// [`ChangeError`]; the paths of an invalid policy start with `policy.`.
    pub async fn update_policy(
        &self,
        by: &Actor,
        reason: &Reason,
        at: &ServiceAt,
        policy: Policy,
    ) -> Result<Written, ChangeError> {
        by.may(Action::PolicyUpdate)?;
        policy.validate().map_err(|v| ChangeError::Invalid(under("policy", v)))?;
        self.write(by, reason, Action::PolicyUpdate, at, "policy", Subject::Policy, move |p| {
            let diff = AuditDiff::of(Some(&p.policy), Some(&policy));
            p.policy = policy;
            Ok(diff)
        })
        .await
    }

    /// Replaces what `at`'s service declares with `declared`, in one revision (audited as
    /// `service.apply`, before and after the policy and flags); fault rules and breaker
    /// overrides stay. A new description is stored beside it (no revision: agents do not
    /// receive it), audited as `service.apply` on target `description`.
    ///
    /// When the emergency profile active in the environment covers the service and the
    /// write would change or remove a flag it set ([`profile_undo`]), the write is refused
    /// ([`ChangeError::ProfileWouldUndo`], audited as rejected) unless `override_profile`
    /// says why; then it goes through, its reason recorded as `REASON (overrides emergency
    /// profile NAME: WHY)`.
    ///
    /// # Errors
    /// [`ChangeError`]; the paths of an invalid configuration start with `policy.` or
    /// `flags.`.
    pub async fn apply_service(
        &self,
        by: &Actor,
        reason: &Reason,
        at: &ServiceAt,
        declared: Declared,
        override_profile: Option<&Reason>,
    ) -> Result<Written, ChangeError> {
        by.may(Action::ServiceApply)?;
        let Declared { description, policy, flags } = declared;
        super::flags::all_expire_in_future(&flags)?;
        let current = self.store.service(&at.env, &at.service).await?.ok_or_else(|| {
            ChangeError::NotFound(Missing::Service { env: at.env.clone(), service: at.service.clone() })
        })?;
        let active = self.store.active_profile(&at.env).await?;
        let undo = |stored: &BTreeMap<String, Flag>, flags: &BTreeMap<String, Flag>| {
            active.as_ref().and_then(|a| profile_undo(a, &at.service, stored, Some(flags)))
        };
        // Told to override: the reason says so when the write undoes something (checked
        // against the configuration as stored now; the write itself is based on `at.base`).
        let reason = match override_profile {
            Some(why) if active.is_some() => {
                let stored = self.stored_flags(at).await?;
                overriding(undo(&stored, &flags), &at.env, reason, Some(why))?
            }
            _ => reason.clone(),
        };
        let mut written = self
            .write(by, &reason, Action::ServiceApply, at, "policy and flags", Subject::Declared, |p| {
                if override_profile.is_none() {
                    overriding(undo(&p.flags, &flags), &at.env, &reason, None)?;
                }
                let old = p.clone();
                let profile = super::profiles::profile_flag_keys(active.as_ref(), &at.service);
                let (flags, back_to) = super::flags::over_temporary(&p.flags, &p.restores, &profile, flags);
                p.policy = policy;
                p.flags = flags;
                p.restores.extend(back_to);
                Ok(AuditDiff::between(&Subject::Declared, &old, p))
            })
            .await?;
        if current.description != description {
            let mut audit = super::audit_row(by, &reason, Action::ServiceApply, "description".to_string());
            audit.environment = Some(at.env.clone());
            audit.service = Some(at.service.clone());
            audit.before = serde_json::to_string(&current.description).ok();
            audit.after = serde_json::to_string(&description).ok();
            audit.revision = Some(written.snapshot.revision as i64);
            if !self.store.set_description(&at.env, &at.service, &description, &audit).await? {
                return Err(ChangeError::NotFound(Missing::Service {
                    env: at.env.clone(),
                    service: at.service.clone(),
                }));
            }
            written.changed = true;
        }
        Ok(written)
    }

    /// Deletes `at`'s service if it is still at `at.base` (audited as `service.delete`,
    /// with the last configuration as `before`). Its revision history stays readable by
    /// number, and a service created again under the name continues its revisions; agents
    /// keep the configuration they have.
    ///
    /// Deleting a service the active emergency profile set flags in undoes them all: refused
    /// ([`ChangeError::ProfileWouldUndo`], audited as rejected) unless `override_profile`
    /// says why, as for [`Actions::apply_service`].
    ///
    /// # Errors
    /// [`ChangeError`]: no such service, or a conflict with `at.base`.
    pub async fn delete_service(
        &self,
        by: &Actor,
        reason: &Reason,
        at: &ServiceAt,
        override_profile: Option<&Reason>,
    ) -> Result<(), ChangeError> {
        by.may(Action::ServiceDelete)?;
        let last = self.store.latest_snapshot(&at.env, &at.service).await?;
        let mut audit = super::audit_row(by, reason, Action::ServiceDelete, at.service.clone());
        audit.environment = Some(at.env.clone());
        audit.service = Some(at.service.clone());
        audit.before = last.as_ref().map(|s| s.body.clone());
        // Deleting removes the policy and the flags new instances would receive: gated as
        // changing them (a service that is not there is not found, whatever the rules).
        let stored = match (&last, self.store.service(&at.env, &at.service).await?) {
            (Some(last), Some(_)) => Some(Parts::from_config(last.config()?, false)),
            _ => {
                return Err(ChangeError::NotFound(Missing::Service {
                    env: at.env.clone(),
                    service: at.service.clone(),
                }));
            }
        };
        let bypass = match self
            .four_eyes(by, &at.env)
            .await?
            .admit(&super::requests::kinds_changed(stored.as_ref(), None))
        {
            Ok(b) => b,
            Err(e) => return Err(self.refuse_audited(audit, e).await),
        };
        if let (Some(active), Some(last)) = (self.store.active_profile(&at.env).await?, &last) {
            let cfg = last.config()?;
            let undo = profile_undo(&active, &at.service, &cfg.flags, None);
            match overriding(undo, &at.env, reason, override_profile) {
                Ok(r) => audit.reason = r.as_str().to_string(),
                Err(e) => return Err(self.refuse_audited(audit, e).await),
            }
        }
        self.store.delete_service(&at.env, &at.service, at.base, &audit).await.map_err(|e| match e {
            MutateError::NoService { env, service } => {
                ChangeError::NotFound(Missing::Service { env, service })
            }
            MutateError::Conflict { expected, current } => ChangeError::Conflict { expected, current },
            MutateError::Db(e) => ChangeError::Storage(e),
            e @ (MutateError::NoEnvironment(_)
            | MutateError::Invalid(_)
            | MutateError::Refused(_)
            | MutateError::Rollout(_)) => ChangeError::Storage(anyhow::anyhow!("deleting a service: {e}")),
        })?;
        if let Some(b) = bypass
            && let Err(e) = self.record_bypass(by, &at.env, Some(&at.service), &at.service, &b, None).await
        {
            tracing::error!(error = %e, environment = %at.env, service = %at.service, "auditing a break-glass change");
        }
        Ok(())
    }

    /// Audits `audit` (a creation or deletion as it would have been) as refused by `e`,
    /// the service unchanged, and returns `e`.
    async fn refuse_audited(&self, audit: AuditRow, e: ChangeError) -> ChangeError {
        let refused = AuditRow {
            outcome: AuditOutcome::Rejected,
            after: audit.before.clone(),
            before: audit.before.clone(),
            detail: Some(e.to_string()),
            ..audit
        };
        if let Err(a) = self.store.append_audit(&refused).await {
            tracing::error!(error = ?a, "could not audit a refused change");
        }
        e
    }

    /// The flags of `at`'s service as stored now.
    async fn stored_flags(&self, at: &ServiceAt) -> Result<BTreeMap<String, Flag>, ChangeError> {
        let snap = self.store.latest_snapshot(&at.env, &at.service).await?.ok_or_else(|| {
            ChangeError::NotFound(Missing::Service { env: at.env.clone(), service: at.service.clone() })
        })?;
        Ok(snap.config()?.flags)
    }

    /// Makes the content of revision `to` of `at`'s service current again, as a new
    /// revision (audited as `service.rollback`, before and after the whole configuration).
    ///
    /// # Errors
    /// [`ChangeError`]; [`Missing::Revision`] when `to` was never stored.
    pub async fn rollback(
        &self,
        by: &Actor,
        reason: &Reason,
        at: &ServiceAt,
        to: u64,
    ) -> Result<Written, ChangeError> {
        by.may(Action::Rollback)?;
        let old = self.store.revision(&at.env, &at.service, to).await?.ok_or_else(|| {
            ChangeError::NotFound(Missing::Revision {
                env: at.env.clone(),
                service: at.service.clone(),
                revision: to,
            })
        })?;
        let config = old.config()?;
        let target = format!("revision {to}");
        self.write(by, reason, Action::Rollback, at, &target, Subject::Config, move |p| {
            let before = p.config();
            *p = Parts::from_config(config, p.faults_allowed);
            Ok(AuditDiff::of(Some(&before), Some(&p.config())))
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use levee_agent::policy::FieldError;

    use super::*;

    #[test]
    fn paths_are_put_under_the_prefix() {
        let e = |path: &str| FieldError { path: path.into(), value: String::new(), message: "m".into() };
        let v = under("policy", ValidationErrors(vec![e("retry.max_attempts"), e("."), e("")]));
        let paths: Vec<&str> = v.0.iter().map(|e| e.path.as_str()).collect();
        assert_eq!(paths, ["policy.retry.max_attempts", "policy", "policy"]);
    }
}

//! Services: creating one, replacing its policy, rolling it back.

use std::collections::BTreeMap;

use levee_agent::policy::{Flag, Policy, ServiceConfig, ValidationErrors, canonical_json};

use super::{
    Action, Actions, Actor, BadInput, ChangeError, CreateError, Existing, Missing, Name, Reason, ServiceAt,
    Written,
};
use crate::db::{AuditDiff, Change, MutateError, Parts};

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
        };
        let config = parts.config();
        config.validate().map_err(CreateError::Invalid)?;
        let diff = AuditDiff { before: None, after: String::from_utf8(canonical_json(&config)).ok() };
        let name = new.name.as_str();
        let change =
            Change { env, service: name, action: Action::ServiceCreate.name(), target: name, expected: None };
        match self.store.create_service(change, &new.description, parts, diff, &by.audit_ctx(reason)).await {
            Ok(Some(c)) => Ok(self.publish(c)),
            Ok(None) => Err(CreateError::AlreadyExists(Existing::Service {
                env: env.to_string(),
                name: name.to_string(),
            })),
            Err(MutateError::NoEnvironment(env)) => Err(CreateError::NotFound(Missing::Environment { env })),
            Err(MutateError::Invalid(v)) => Err(CreateError::Invalid(v)),
            Err(MutateError::Db(e)) => Err(CreateError::Storage(e)),
            Err(MutateError::Refused(never)) => match never {},
            Err(e @ (MutateError::NoService { .. } | MutateError::Conflict { .. })) => {
                Err(CreateError::Storage(anyhow::anyhow!("creating a service: {e}")))
            }
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
        self.write(by, reason, Action::PolicyUpdate, at, "policy", move |p| {
            let diff = AuditDiff::of(Some(&p.policy), Some(&policy));
            p.policy = policy;
            Ok(diff)
        })
        .await
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
        let config: ServiceConfig =
            serde_json::from_str(&old.body).map_err(|e| ChangeError::Storage(e.into()))?;
        let target = format!("revision {to}");
        self.write(by, reason, Action::Rollback, at, &target, move |p| {
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

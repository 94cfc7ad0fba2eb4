//! Fault-injection rules, where the environment allows them.

use levee_agent::policy::{FaultAction, FaultRule};

use super::overrides::in_future;
use super::{Action, Actions, Actor, ChangeError, Missing, Name, Reason, ServiceAt, Written};
use crate::db::{AuditDiff, Subject};

/// A fault rule to set; its fields are those of the policy's `FaultRule`, whose validation
/// states their ranges.
#[derive(Clone, Debug)]
pub struct NewFaultRule {
    /// The dependency whose calls are affected.
    pub dependency: String,
    /// The operation affected; `None` for all of the dependency's.
    pub operation: Option<String>,
    /// What happens to an affected attempt.
    pub action: FaultAction,
    /// Share of attempts affected, in percent.
    pub percent: f64,
    /// When the rule ends by itself (mandatory).
    pub expires_at: levee_agent::policy::Timestamp,
    /// The instances it applies to; empty = every instance.
    pub instances: Vec<String>,
}

impl Actions {
    /// Creates or replaces fault rule `id` of `at`'s service (audited as `fault.set`).
    ///
    /// # Errors
    /// [`ChangeError`]: no such environment; [`ChangeError::FaultsNotAllowed`];
    /// [`ChangeError::InvalidField`] on `expires_at` when it is not in the future.
    pub async fn set_fault_rule(
        &self,
        by: &Actor,
        reason: &Reason,
        at: &ServiceAt,
        id: &Name,
        new: NewFaultRule,
    ) -> Result<Written, ChangeError> {
        by.may(Action::FaultSet)?;
        let env = self
            .store
            .environment(&at.env)
            .await?
            .ok_or_else(|| ChangeError::NotFound(Missing::Environment { env: at.env.clone() }))?;
        if !env.allow_faults {
            return Err(ChangeError::FaultsNotAllowed { env: at.env.clone() });
        }
        in_future("expires_at", new.expires_at)?;
        let rule = FaultRule {
            id: id.as_str().to_string(),
            dependency: new.dependency,
            operation: new.operation,
            action: new.action,
            percent: new.percent,
            expires_at: new.expires_at,
            instances: new.instances,
        };
        let target = format!("fault {id}");
        self.write(by, reason, Action::FaultSet, at, &target, Subject::Fault(rule.id.clone()), move |p| {
            let diff = AuditDiff::of(p.faults.get(&rule.id), Some(&rule));
            p.faults.insert(rule.id.clone(), rule);
            Ok(diff)
        })
        .await
    }

    /// Removes fault rule `id` (audited as `fault.delete`).
    ///
    /// # Errors
    /// [`ChangeError`]: [`Missing::FaultRule`].
    pub async fn delete_fault_rule(
        &self,
        by: &Actor,
        reason: &Reason,
        at: &ServiceAt,
        id: &str,
    ) -> Result<Written, ChangeError> {
        let target = format!("fault {id}");
        self.write(by, reason, Action::FaultDelete, at, &target, Subject::Fault(id.to_string()), |p| {
            let old = p
                .faults
                .remove(id)
                .ok_or_else(|| ChangeError::NotFound(Missing::FaultRule { id: id.to_string() }))?;
            Ok(AuditDiff::of(Some(&old), None))
        })
        .await
    }
}

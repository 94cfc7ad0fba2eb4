//! Breaker overrides: forcing a breaker open, closed or off.

use levee_agent::policy::{BreakerOverride, BreakerOverrideState, FieldError, Timestamp};

use super::{Action, Actions, Actor, ChangeError, Missing, Reason, ServiceAt, Written};
use crate::db::{AuditDiff, Subject};

/// A breaker override to set.
#[derive(Clone, Debug)]
pub struct NewOverride {
    /// The dependency whose breaker is forced.
    pub dependency: String,
    /// The operation whose breaker is forced; `None` for the dependency-level breaker.
    pub operation: Option<String>,
    /// The forced state.
    pub state: BreakerOverrideState,
    /// When the override ends by itself (server and agents); `None`: when removed.
    pub expires_at: Option<Timestamp>,
}

/// Refuses an expiry that is not in the future.
pub(super) fn in_future(path: &str, t: Timestamp) -> Result<(), ChangeError> {
    if t <= Timestamp::now() {
        return Err(ChangeError::InvalidField(FieldError {
            path: path.into(),
            value: t.to_string(),
            message: "must be in the future".into(),
        }));
    }
    Ok(())
}

impl Actions {
    /// Forces a breaker of `at`'s service (audited as `breaker.override`); the reason is
    /// also stored in the override, which agents report.
    ///
    /// # Errors
    /// [`ChangeError`]; [`ChangeError::InvalidField`] on `expires_at` when it is not in the
    /// future.
    pub async fn set_breaker_override(
        &self,
        by: &Actor,
        reason: &Reason,
        at: &ServiceAt,
        new: NewOverride,
    ) -> Result<Written, ChangeError> {
        by.may(Action::BreakerOverride)?;
        if let Some(t) = new.expires_at {
            in_future("expires_at", t)?;
        }
        let target = format!(
            "breaker {}{}",
            new.dependency,
            new.operation.as_deref().map(|o| format!(" {o}")).unwrap_or_default()
        );
        let o = BreakerOverride {
            dependency: new.dependency,
            operation: new.operation,
            state: new.state,
            expires_at: new.expires_at,
            reason: reason.as_str().to_string(),
        };
        let k = (o.dependency.clone(), o.operation.clone().unwrap_or_default());
        let subject = Subject::Breaker(k.0.clone(), k.1.clone());
        self.write(by, reason, Action::BreakerOverride, at, &target, subject, move |p| {
            let diff = AuditDiff::of(p.overrides.get(&k), Some(&o));
            p.overrides.insert(k, o);
            Ok(diff)
        })
        .await
    }

    /// Removes the override of the breaker of `dependency` (and `operation`, if given)
    /// (audited as `breaker.override.delete`): the breaker decides on its own again.
    ///
    /// # Errors
    /// [`ChangeError`]: [`Missing::BreakerOverride`].
    pub async fn remove_breaker_override(
        &self,
        by: &Actor,
        reason: &Reason,
        at: &ServiceAt,
        dependency: &str,
        operation: Option<&str>,
    ) -> Result<Written, ChangeError> {
        let target = format!("breaker {dependency}");
        let k = (dependency.to_string(), operation.unwrap_or_default().to_string());
        let subject = Subject::Breaker(k.0.clone(), k.1.clone());
        self.write(by, reason, Action::BreakerOverrideDelete, at, &target, subject, |p| {
            let old = p.overrides.remove(&k).ok_or_else(|| {
                ChangeError::NotFound(Missing::BreakerOverride { dependency: dependency.to_string() })
            })?;
            Ok(AuditDiff::of(Some(&old), None))
        })
        .await
    }
}

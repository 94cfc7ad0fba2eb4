//! Flags: kill switches and tunables.

use levee_agent::policy::{FieldError, Flag, Timestamp};

use super::overrides::in_future;
use super::{Action, Actions, Actor, ChangeError, Missing, Name, Reason, ServiceAt, Written};
use crate::db::{AuditDiff, Subject};

impl Actions {
    /// Creates or replaces flag `key` of `at`'s service (audited as `flag.set`).
    ///
    /// # Errors
    /// [`ChangeError`]; an invalid flag lists its bad fields.
    pub async fn set_flag(
        &self,
        by: &Actor,
        reason: &Reason,
        at: &ServiceAt,
        key: &Name,
        flag: Flag,
    ) -> Result<Written, ChangeError> {
        by.may(Action::FlagSet)?;
        flag.validate().map_err(ChangeError::Invalid)?;
        expires_in_future("expires_at", flag.expires_at)?;
        let target = format!("flag {key}");
        self.gate(by, &at.env, "flag", &target).await?;
        let key = key.as_str().to_string();
        self.write(by, reason, Action::FlagSet, at, &target, Subject::Flag(key.clone()), move |p| {
            let diff = AuditDiff::of(p.flags.get(&key), Some(&flag));
            p.flags.insert(key, flag);
            Ok(diff)
        })
        .await
    }

    /// The one-click switch: replaces the value of the existing flag `key` and its expiry,
    /// keeping the rest (audited as `flag.set`). `expires_at: None` makes the value
    /// permanent: switching back after a temporary flip (`levee flip … --for 2h`) settles
    /// the flag instead of leaving the old expiry to remove it later.
    ///
    /// # Errors
    /// [`ChangeError`]: [`Missing::Flag`]; [`ChangeError::InvalidField`] on `value` when it
    /// does not have the flag's type, on `expires_at` when it is not in the future.
    pub async fn set_flag_value(
        &self,
        by: &Actor,
        reason: &Reason,
        at: &ServiceAt,
        key: &str,
        value: serde_json::Value,
        expires_at: Option<Timestamp>,
    ) -> Result<Written, ChangeError> {
        expires_in_future("expires_at", expires_at)?;
        let target = format!("flag {key}");
        self.gate(by, &at.env, "flag", &target).await?;
        self.write(by, reason, Action::FlagSet, at, &target, Subject::Flag(key.to_string()), |p| {
            let flag = p.flags.get_mut(key).ok_or_else(|| {
                ChangeError::NotFound(Missing::Flag { service: at.service.clone(), key: key.to_string() })
            })?;
            if !flag.kind.accepts(&value) {
                return Err(ChangeError::InvalidField(FieldError {
                    path: "value".into(),
                    value: value.to_string(),
                    message: format!("must be a {} value, as the flag's type says", flag.kind.as_str()),
                }));
            }
            let before = flag.clone();
            flag.value = value;
            flag.expires_at = expires_at;
            Ok(AuditDiff::of(Some(&before), Some(flag)))
        })
        .await
    }

    /// Deletes flag `key` (audited as `flag.delete`); agents fall back to their compiled-in
    /// default.
    ///
    /// # Errors
    /// [`ChangeError`]: [`Missing::Flag`].
    pub async fn delete_flag(
        &self,
        by: &Actor,
        reason: &Reason,
        at: &ServiceAt,
        key: &str,
    ) -> Result<Written, ChangeError> {
        let target = format!("flag {key}");
        self.gate(by, &at.env, "flag", &target).await?;
        self.write(by, reason, Action::FlagDelete, at, &target, Subject::Flag(key.to_string()), |p| {
            let old = p.flags.remove(key).ok_or_else(|| {
                ChangeError::NotFound(Missing::Flag { service: at.service.clone(), key: key.to_string() })
            })?;
            Ok(AuditDiff::of(Some(&old), None))
        })
        .await
    }
}

/// A flag's expiry, when it has one, is in the future: one already past would have the
/// flag removed at once by the expiry sweeper (and a manifest carrying it re-created and
/// removed on every apply). `path` names the field in errors.
pub(super) fn expires_in_future(path: &str, expires_at: Option<Timestamp>) -> Result<(), ChangeError> {
    expires_at.map_or(Ok(()), |t| in_future(path, t))
}

/// [`expires_in_future`] for every flag of a declared set, the paths under `flags.<key>`.
pub(crate) fn all_expire_in_future<'a>(
    flags: impl IntoIterator<Item = (&'a String, &'a Flag)>,
) -> Result<(), ChangeError> {
    for (key, flag) in flags {
        expires_in_future(&format!("flags.{key}.expires_at"), flag.expires_at)?;
    }
    Ok(())
}

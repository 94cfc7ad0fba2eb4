//! Flags: kill switches and tunables.

use levee_agent::policy::{FieldError, Flag, Timestamp};

use super::{Action, Actions, Actor, ChangeError, Missing, Name, Reason, ServiceAt, Written};
use crate::db::AuditDiff;

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
        let target = format!("flag {key}");
        self.gate(by, &at.env, "flag", &target).await?;
        let key = key.as_str().to_string();
        self.write(by, reason, Action::FlagSet, at, &target, move |p| {
            let diff = AuditDiff::of(p.flags.get(&key), Some(&flag));
            p.flags.insert(key, flag);
            Ok(diff)
        })
        .await
    }

    /// The one-click switch: replaces the value of the existing flag `key`, and its expiry
    /// when `expires_at` is given, keeping the rest (audited as `flag.set`).
    ///
    /// # Errors
    /// [`ChangeError`]: [`Missing::Flag`]; [`ChangeError::InvalidField`] on `value` when it
    /// does not have the flag's type.
    pub async fn set_flag_value(
        &self,
        by: &Actor,
        reason: &Reason,
        at: &ServiceAt,
        key: &str,
        value: serde_json::Value,
        expires_at: Option<Timestamp>,
    ) -> Result<Written, ChangeError> {
        let target = format!("flag {key}");
        self.gate(by, &at.env, "flag", &target).await?;
        self.write(by, reason, Action::FlagSet, at, &target, |p| {
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
            let before = serde_json::to_string(flag).ok();
            flag.value = value;
            if expires_at.is_some() {
                flag.expires_at = expires_at;
            }
            Ok(AuditDiff { before, after: serde_json::to_string(flag).ok() })
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
        self.write(by, reason, Action::FlagDelete, at, &target, |p| {
            let old = p.flags.remove(key).ok_or_else(|| {
                ChangeError::NotFound(Missing::Flag { service: at.service.clone(), key: key.to_string() })
            })?;
            Ok(AuditDiff::of(Some(&old), None))
        })
        .await
    }
}

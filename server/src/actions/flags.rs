//! Flags: kill switches and tunables.

use std::collections::BTreeMap;

use levee_agent::policy::{Flag, Timestamp};

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
        self.write(by, reason, Action::FlagSet, at, &target, Subject::Flag(key.to_string()), |p| {
            let flag = p.flags.get_mut(key).ok_or_else(|| {
                ChangeError::NotFound(Missing::Flag { service: at.service.clone(), key: key.to_string() })
            })?;
            flag.kind.check("value", &value).map_err(ChangeError::InvalidField)?;
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
        self.write(by, reason, Action::FlagDelete, at, &target, Subject::Flag(key.to_string()), |p| {
            let old = p.flags.remove(key).ok_or_else(|| {
                ChangeError::NotFound(Missing::Flag { service: at.service.clone(), key: key.to_string() })
            })?;
            Ok(AuditDiff::of(Some(&old), None))
        })
        .await
    }
}

/// The one rule of what a temporary flag value goes back to at its expiry, applied after
/// every write of a service (`Actions::write`) from the flags and memory before it
/// (`flags`, `restores`) and the flags the write leaves (`written`):
///
/// - a flag given an expiry it did not have (`levee flip … --for`, a `PUT`/`PATCH` with
///   `expires_at`, a profile) is remembered as it was, so its expiry puts it back instead of
///   deleting it;
/// - while it stays temporary (a new flip with `--for`, a profile over it), the ORIGINAL
///   flag stays remembered: a temporary value never becomes what the flag returns to;
/// - a flag written without an expiry (the operator decided the value, an apply, a profile
///   revert, the expiry's own restore) or deleted is forgotten;
/// - a flag that was created with an expiry has nothing to go back to, and expires as ever
///   (removed; a kill switch then falls back to the compiled-in default).
pub(super) fn remembered(
    flags: &BTreeMap<String, Flag>,
    restores: &BTreeMap<String, Flag>,
    written: &BTreeMap<String, Flag>,
) -> BTreeMap<String, Flag> {
    written
        .iter()
        .filter(|(_, f)| f.expires_at.is_some())
        .filter_map(|(k, _)| {
            let before = restores.get(k).or_else(|| flags.get(k).filter(|f| f.expires_at.is_none()));
            before.map(|f| (k.clone(), f.clone()))
        })
        .collect()
}

/// What a declared set of flags (an apply) does to the flags under a temporary value
/// (`restores`: what they go back to; `profile`: the keys the active emergency profile set,
/// which follow the profile's own rule instead): such a flag keeps its temporary value in
/// force until its expiry, and what the apply declares for it (without an expiry) becomes
/// what it goes back to — a merge during an incident never switches a flipped kill switch
/// back. Returns the flags to write and the new values to go back to; a flag
/// the apply leaves out or declares with an expiry of its own is written as declared.
pub(crate) fn over_temporary(
    current: &BTreeMap<String, Flag>,
    restores: &BTreeMap<String, Flag>,
    profile: &[String],
    mut declared: BTreeMap<String, Flag>,
) -> (BTreeMap<String, Flag>, BTreeMap<String, Flag>) {
    let mut back_to = BTreeMap::new();
    for (key, before) in restores {
        if profile.contains(key) {
            continue;
        }
        let (Some(now), Some(wanted)) = (current.get(key), declared.get(key)) else { continue };
        if now.expires_at.is_none() || wanted.expires_at.is_some() {
            continue;
        }
        if wanted != before {
            back_to.insert(key.clone(), wanted.clone());
        }
        declared.insert(key.clone(), now.clone());
    }
    (declared, back_to)
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

#[cfg(test)]
mod tests {
    use super::*;

    fn flag(v: i64, expires: Option<i64>) -> Flag {
        Flag {
            expires_at: expires.map(Timestamp::from_unix_ms),
            ..serde_json::from_str(&format!(r#"{{"type":"int","value":{v}}}"#)).unwrap()
        }
    }

    fn map(entries: &[(&str, Flag)]) -> BTreeMap<String, Flag> {
        entries.iter().map(|(k, f)| (k.to_string(), f.clone())).collect()
    }

    #[test]
    fn a_flip_remembers_the_original_until_a_permanent_write() {
        let none = BTreeMap::new();
        let declared = map(&[("k", flag(1, None))]);
        // A flip with an expiry remembers the flag as it was.
        let flipped = map(&[("k", flag(2, Some(10)))]);
        let mem = remembered(&declared, &none, &flipped);
        assert_eq!(mem, declared);
        // A second flip while the first is pending keeps the original.
        let again = map(&[("k", flag(3, Some(20)))]);
        assert_eq!(remembered(&flipped, &mem, &again), declared);
        // A write without expiry, or a delete, forgets it.
        assert!(remembered(&again, &mem, &map(&[("k", flag(3, None))])).is_empty());
        assert!(remembered(&again, &mem, &none).is_empty());
        // A flag created with an expiry has nothing to go back to.
        assert!(remembered(&none, &none, &flipped).is_empty());
        // Other flags of the write are untouched.
        let two = map(&[("k", flag(2, Some(10))), ("other", flag(5, None))]);
        assert_eq!(remembered(&two, &mem, &two), declared);
    }
}

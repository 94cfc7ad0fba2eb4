//! Expiry: the server removes flags, fault rules, breaker overrides and levers whose time is
//! up, and puts back a flag whose temporary value ends (see `flags::remembered`).
//! Agents expire them locally too, so this matters for what the server shows and pushes.

use levee_agent::policy::Timestamp;

use super::{Action, Actions, Actor, ChangeError, Reason, ServiceAt};
use crate::db::{AuditDiff, Entries, Parts, Subject};

impl Actions {
    /// Removes every flag, fault rule, breaker override and lever override expired at `now`
    /// (a flag with a temporary value goes back to the flag it was instead), one revision
    /// per service that had any (audited as `expiry` by `levee` via `server`: the entries
    /// it changed as they were and as they are, see [`AuditDiff::entries`], and what it did
    /// in words as `detail`). A service that fails is logged and left for the next pass.
    /// (Which entries expired is known only inside the write: a refused expiry, whose
    /// configuration would not validate, records `{}` as its value.)
    /// Returns how many services changed.
    ///
    /// # Errors
    /// [`ChangeError::Storage`] when the services with expired entries cannot be listed.
    pub async fn expire(&self, now: Timestamp) -> Result<usize, ChangeError> {
        let due = self.store.services_with_expired(now.unix_ms()).await?;
        let by = Actor::server();
        let reason = Reason::by_server(format!("expired (checked at {now})"));
        let mut changed = 0;
        for (env, service) in due {
            let at = ServiceAt::new(env, service, None);
            let res = self
                .write(
                    &by,
                    &reason,
                    Action::Expiry,
                    &at,
                    "expired entries",
                    Subject::Entries(Entries::default()),
                    |p| Ok(remove_expired(p, now)),
                )
                .await;
            match res {
                Ok(w) => changed += usize::from(w.changed),
                Err(e) => {
                    tracing::warn!(error = %e, environment = %at.env, service = %at.service, "expiry sweep failed")
                }
            }
        }
        Ok(changed)
    }
}

/// Removes what expired at `now` from `p`, except a flag the server remembers as it was
/// before its temporary value (`Parts::restores`, see `flags::remembered`): that flag is put
/// back, in this same revision. The audit's `before` holds the changed entries as they were
/// (and the policy, when a kill switch reverts to its compiled-in default), `after` the same
/// entries now (`null`: gone; a restored flag: its value again), `detail` what was done in
/// words.
fn remove_expired(p: &mut Parts, now: Timestamp) -> AuditDiff {
    let old = p.clone();
    let mut removed = Vec::new();
    let mut restored = Vec::new();
    let switches: std::collections::BTreeSet<String> =
        p.policy.flag_references().into_iter().map(|r| r.key.to_string()).collect();
    let mut reverted = Vec::new();
    let expired: Vec<String> = p
        .flags
        .iter()
        .filter(|(_, f)| f.expires_at.is_some_and(|e| e <= now))
        .map(|(k, _)| k.clone())
        .collect();
    for k in expired {
        match p.restores.remove(&k) {
            Some(back) => {
                restored
                    .push(format!("flag {k} back to {} (its value before the temporary one)", back.value));
                p.flags.insert(k, back);
            }
            None => {
                p.flags.remove(&k);
                removed.push(format!("flag {k}"));
                if switches.contains(&k) {
                    reverted.push(k);
                }
            }
        }
    }
    // An expired kill switch reverts to the service's compiled-in default: the policy says
    // so, or its reference would dangle (OPS-1).
    let mut detail = Vec::new();
    for k in reverted {
        detail.push(format!("kill switch {k} now declared in policy.compiled_in_flags"));
        p.policy.compiled_in_flags.insert(k);
    }
    p.faults.retain(|id, f| {
        let keep = f.expires_at > now;
        if !keep {
            removed.push(format!("fault {id}"));
        }
        keep
    });
    p.overrides.retain(|(d, _), o| {
        let keep = o.expires_at.is_none_or(|e| e > now);
        if !keep {
            removed.push(format!("breaker override {d}"));
        }
        keep
    });
    if p.levers.as_ref().is_some_and(|l| l.expires_at <= now) {
        removed.push("levers".to_string());
        p.levers = None;
    }
    if !restored.is_empty() {
        detail.insert(0, format!("restored {}", restored.join(", ")));
    }
    if !removed.is_empty() {
        detail.insert(0, format!("removed {}", removed.join(", ")));
    }
    AuditDiff::entries(&old, p).with_detail(detail.join("; "))
}

#[cfg(test)]
mod tests {
    use levee_agent::policy::{BreakerOverride, BreakerOverrideState, Flag, ServiceConfig};

    use super::*;

    #[test]
    fn only_what_expired_is_removed_and_listed() {
        let now = Timestamp::from_unix_ms(1_000_000);
        let at = |ms: i64| Some(Timestamp::from_unix_ms(ms));
        let flag = |expires_at| Flag {
            expires_at,
            ..serde_json::from_str(r#"{"type":"bool","value":true}"#).unwrap()
        };
        let mut p = Parts::from_config(ServiceConfig::default(), false);
        p.flags.insert("gone".into(), flag(at(1_000_000)));
        p.flags.insert("later".into(), flag(at(1_000_001)));
        p.flags.insert("forever".into(), flag(None));
        let o = |dep: &str, expires_at| BreakerOverride {
            dependency: dep.into(),
            operation: None,
            state: BreakerOverrideState::ForcedOpen,
            expires_at,
            reason: "r".into(),
        };
        p.overrides.insert(("pay".into(), String::new()), o("pay", at(999_999)));
        p.overrides.insert(("ship".into(), String::new()), o("ship", None));
        p.levers = Some(
            serde_json::from_str(r#"{"retries_paused": true, "expires_at": "1970-01-01T00:16:40Z"}"#)
                .unwrap(),
        );
        let diff = remove_expired(&mut p, now);
        assert_eq!(p.flags.keys().collect::<Vec<_>>(), ["forever", "later"]);
        assert_eq!(p.overrides.len(), 1);
        assert_eq!(p.levers, None);
        let value = |s: Option<String>| serde_json::from_str::<serde_json::Value>(&s.unwrap()).unwrap();
        let gone = serde_json::to_value(flag(at(1_000_000))).unwrap();
        let pay = serde_json::to_value(o("pay", at(999_999))).unwrap();
        assert_eq!(
            value(diff.before),
            serde_json::json!({"flags": {"gone": gone}, "breaker_overrides": {"pay": pay},
                "levers": {"retries_paused": true, "expires_at": "1970-01-01T00:16:40.000Z", "reason": ""}})
        );
        assert_eq!(
            value(diff.after),
            serde_json::json!({"flags": {"gone": null}, "breaker_overrides": {"pay": null}, "levers": null})
        );
        assert_eq!(diff.detail.as_deref(), Some("removed flag gone, breaker override pay, levers"));
    }

    #[test]
    fn a_temporary_value_goes_back_to_the_remembered_flag_in_the_same_revision() {
        let now = Timestamp::from_unix_ms(1_000_000);
        let flag = |v: bool, expires_at| Flag {
            expires_at,
            ..serde_json::from_str(&format!(r#"{{"type":"bool","value":{v}}}"#)).unwrap()
        };
        let cfg: ServiceConfig = serde_json::from_str(
            r#"{"policy": {"dependencies": {"recs": {"enabled_flag": "recs.enabled"}}}}"#,
        )
        .unwrap();
        let mut p = Parts::from_config(cfg, false);
        p.flags.insert("recs.enabled".into(), flag(false, Some(now)));
        p.restores.insert("recs.enabled".into(), flag(true, None));
        p.flags.insert("made.temporary".into(), flag(true, Some(now)));
        let diff = remove_expired(&mut p, now);
        assert_eq!(p.flags.get("recs.enabled"), Some(&flag(true, None)));
        assert!(p.restores.is_empty());
        assert!(p.policy.compiled_in_flags.is_empty(), "the kill switch names a flag again");
        let value = |s: Option<String>| serde_json::from_str::<serde_json::Value>(&s.unwrap()).unwrap();
        assert_eq!(
            value(diff.after),
            serde_json::json!({"flags": {"made.temporary": null,
                "recs.enabled": serde_json::to_value(flag(true, None)).unwrap()}})
        );
        assert_eq!(value(diff.before)["flags"]["recs.enabled"]["value"], serde_json::json!(false));
        assert_eq!(
            diff.detail.as_deref(),
            Some(
                "removed flag made.temporary; restored flag recs.enabled back to true (its value before the temporary one)"
            )
        );
    }
}

//! Emergency profiles: named, pre-agreed sets of overrides per environment (flag values and
//! kill switches, forced breakers, fault rules, read-only mode, and the operator levers:
//! shedding sheddable traffic, pausing retries, a fixed inbound limit), versioned and
//! audited, applied or reverted in one action.
//!
//! Applying a profile writes one revision per service it names. Every entry it sets carries
//! the profile's expiry as its `expires_at` (flags, breaker overrides, fault rules and the
//! snapshot's `levers` all have one), so an agent drops the entries by itself at that instant even while the server
//! is unreachable (the agent's one wall-clock conversion, `applied::wall_to_monotonic`).
//! What each entry replaced is kept with the activation; a revert — by hand, or by the
//! sweeper at the expiry ([`Actions::expire_profiles`], which runs before the expiry of
//! single entries) — restores it, unless someone changed that entry since.

use std::collections::BTreeMap;
use std::time::Duration;

use levee_agent::policy::{
    BreakerOverride, BreakerOverrideState, FaultAction, FaultRule, FieldError, Flag, FlagType, LeverOverride,
    StalePolicy, Timestamp, ValidationErrors, check_name,
};
use serde::{Deserialize, Serialize};

use super::overrides::in_future;
use super::{Action, Actions, Actor, ChangeError, Missing, Name, Reason, ServiceAt, audit_row};
use crate::db::{
    ActivationRow, AuditDiff, AuditRow, ChangeKind, Entries, Parts, ProfileRow, Subject, now_ms,
};

/// The longest a profile may stay applied: it must be renewed (applied again) after that.
pub const MAX_PROFILE_DURATION: Duration = Duration::from_secs(7 * 24 * 3600);

/// What an emergency profile sets, per service of its environment.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ProfileSpec {
    /// What the profile is for and when to use it.
    #[serde(default)]
    pub description: String,
    /// What it sets, by service name.
    pub services: BTreeMap<String, ProfileService>,
}

/// What a profile sets in one service. Every entry ends with the profile (its expiry or
/// its revert).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields, default)]
pub struct ProfileService {
    /// Values of existing flags by key: a kill switch is switched off with `false`.
    #[schema(value_type = Object)]
    pub flags: BTreeMap<String, serde_json::Value>,
    /// Breakers forced.
    pub breakers: Vec<ProfileBreaker>,
    /// Fault rules (only where the environment allows faults).
    pub faults: Vec<ProfileFault>,
    /// Turns on the flag named by the policy's `inbound.read_only_flag` (routes marked
    /// `mutating` answer 503).
    pub read_only: bool,
    /// Percentage (0–100) of SHEDDABLE and SHEDDABLE_PLUS inbound traffic the service sheds
    /// instead of its policy's `inbound.shed_sheddable_percent`; omit to keep the policy's.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub shed_sheddable_percent: Option<f64>,
    /// `true` pauses every outgoing retry of the service.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub pause_retries: bool,
    /// A fixed inbound concurrency limit (1–100000 requests) replacing the policy's limit;
    /// requests in flight are never dropped. Omit to keep the policy's.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub inbound_limit: Option<u32>,
}

impl ProfileService {
    /// The entries this sets, as far as the definition names them (the read-only flag is
    /// named by the service's policy: see [`ProfileSet::entries`] for what was set).
    fn entries(&self) -> Entries {
        Entries {
            flags: self.flags.keys().cloned().collect(),
            faults: self.faults.iter().map(|f| f.id.clone()).collect(),
            breakers: self
                .breakers
                .iter()
                .map(|b| (b.dependency.clone(), b.operation.clone().unwrap_or_default()))
                .collect(),
            levers: self.shed_sheddable_percent.is_some()
                || self.pause_retries
                || self.inbound_limit.is_some(),
            policy: false,
        }
    }

    /// The lever override this sets, until `expires` (`None` when it sets no lever).
    fn levers(&self, expires: Timestamp, reason: String) -> Option<LeverOverride> {
        let l = LeverOverride {
            shed_sheddable_percent: self.shed_sheddable_percent,
            retries_paused: self.pause_retries.then_some(true),
            inbound_limit: self.inbound_limit,
            expires_at: expires,
            reason,
        };
        let any =
            l.shed_sheddable_percent.is_some() || l.retries_paused.is_some() || l.inbound_limit.is_some();
        any.then_some(l)
    }
}

/// A breaker a profile forces.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ProfileBreaker {
    /// Dependency whose breaker is forced.
    pub dependency: String,
    /// Operation; omit for the dependency-level breaker.
    #[serde(default)]
    pub operation: Option<String>,
    /// The forced state.
    pub state: BreakerOverrideState,
}

/// A fault rule a profile sets; it expires with the profile.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ProfileFault {
    /// Identifier, unique within the service.
    pub id: String,
    /// Dependency whose calls are affected.
    pub dependency: String,
    /// Operation; omit for every operation of the dependency.
    #[serde(default)]
    pub operation: Option<String>,
    /// What happens to an affected attempt.
    pub action: FaultAction,
    /// Share of attempts affected, in percent.
    pub percent: f64,
}

/// One entry a profile set: its key, what it replaced (`None`: nothing) and what it set.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
struct SetEntry<K, T> {
    key: K,
    before: Option<T>,
    set: T,
}

/// What a profile set in one service, and what it replaced.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
struct ProfileSet {
    flags: Vec<SetEntry<String, Flag>>,
    breakers: Vec<SetEntry<(String, String), BreakerOverride>>,
    faults: Vec<SetEntry<String, FaultRule>>,
    /// The service's lever override (one per service, so no key).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    levers: Option<SetEntry<(), LeverOverride>>,
}

impl ProfileSet {
    /// The entries the profile set in the service: the audit row's subject when it is
    /// applied and reverted.
    fn entries(&self) -> Entries {
        Entries {
            flags: self.flags.iter().map(|s| s.key.clone()).collect(),
            faults: self.faults.iter().map(|s| s.key.clone()).collect(),
            breakers: self.breakers.iter().map(|s| s.key.clone()).collect(),
            levers: self.levers.is_some(),
            policy: false,
        }
    }
}

/// A profile reverted: the activation, and per service what the revert left as it is (an
/// entry changed since the profile set it, a service whose write failed), in the words of
/// its audit row's detail.
#[derive(Clone, Debug)]
pub struct Reverted {
    pub activation: ActivationRow,
    pub left: BTreeMap<String, Vec<String>>,
}

/// An application of a profile as the environment's audit rows record it (`after` of
/// `profile.apply`, `before` of `profile.revert`): profile, version, expiry and the
/// services it changed.
fn activation_value(a: &ActivationRow) -> String {
    serde_json::json!({
        "profile": a.profile,
        "version": a.version,
        "expires_at": Timestamp::from_unix_ms(a.expires_at),
        "services": activation_services(a),
    })
    .to_string()
}

/// A stored profile with its decoded definition.
#[derive(Clone, Debug)]
pub struct Profile {
    pub row: ProfileRow,
    pub spec: ProfileSpec,
}

impl Profile {
    /// Decodes a stored row.
    ///
    /// # Errors
    /// A row that does not decode (written by a newer server) is a storage error.
    pub fn of(row: ProfileRow) -> Result<Profile, ChangeError> {
        let spec = serde_json::from_str(&row.body).map_err(|e| ChangeError::Storage(e.into()))?;
        Ok(Profile { row, spec })
    }
}

/// The services an application of a profile changed (so far, while it is being applied).
pub fn activation_services(a: &ActivationRow) -> Vec<String> {
    serde_json::from_str::<BTreeMap<String, serde_json::Value>>(&a.saved)
        .map(|m| m.into_keys().collect())
        .unwrap_or_default()
}

/// The flags an application of a profile set, per service (what a whole-service write of
/// flags would undo; breakers, faults and levers are not part of a manifest).
/// The flag keys the active profile `a` set in `service` (none when it does not cover it).
pub fn profile_flag_keys(a: Option<&ActivationRow>, service: &str) -> Vec<String> {
    a.and_then(|a| activation_flags(a).remove(service)).unwrap_or_default()
}

fn activation_flags(a: &ActivationRow) -> BTreeMap<String, Vec<String>> {
    serde_json::from_str::<BTreeMap<String, ProfileSet>>(&a.saved)
        .map(|m| m.into_iter().map(|(svc, s)| (svc, s.flags.into_iter().map(|f| f.key).collect())).collect())
        .unwrap_or_default()
}

/// An active emergency profile that covers a service, and what of it a whole-service
/// write would undo.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct ProfileUndo {
    /// The profile.
    pub name: String,
    /// Who applied it.
    pub applied_by: String,
    /// When it reverts by itself.
    #[serde(with = "levee_agent::policy::rfc3339")]
    #[schema(value_type = String, format = DateTime)]
    pub expires_at: i64,
    /// The flags it set in the service that the write would change or remove, as paths
    /// (`flags.recommendations.enabled`); empty when the write leaves them alone.
    pub undoes: Vec<String>,
}

/// What a whole-service write of `service` would undo of the profile applied by `a`: the
/// flags `a` set there that the write changes — from `before` to `after` — or removes
/// (`after` `None`: the service is deleted). `None` when the profile does not cover the
/// service. The one statement of this rule: the plan reports it, and whole-service writes
/// and deletions refuse on it ([`Actions::apply_service`], [`Actions::delete_service`]).
/// Breakers, faults and levers are not part of what such a write declares.
pub fn profile_undo(
    a: &ActivationRow,
    service: &str,
    before: &BTreeMap<String, Flag>,
    after: Option<&BTreeMap<String, Flag>>,
) -> Option<ProfileUndo> {
    let set = activation_flags(a).remove(service)?;
    let undoes = set
        .into_iter()
        .filter(|k| after.is_none_or(|after| before.get(k) != after.get(k)))
        .map(|k| format!("flags.{k}"))
        .collect();
    Some(ProfileUndo {
        name: a.profile.clone(),
        applied_by: a.applied_by.clone(),
        expires_at: a.expires_at,
        undoes,
    })
}

/// The reason a write that undoes `undo` is recorded with when told to override it (`why`,
/// `None`: not told to), or the refusal ([`ChangeError::ProfileWouldUndo`]). A write that
/// undoes nothing keeps `reason`.
pub(super) fn overriding(
    undo: Option<ProfileUndo>,
    env: &str,
    reason: &Reason,
    why: Option<&Reason>,
) -> Result<Reason, ChangeError> {
    match (undo.filter(|u| !u.undoes.is_empty()), why) {
        (None, _) => Ok(reason.clone()),
        (Some(u), Some(why)) => Ok(Reason::by_server(format!(
            "{reason} (overrides emergency profile {}: {why})",
            u.name,
            reason = reason.as_str(),
            why = why.as_str()
        ))),
        (Some(u), None) => Err(ChangeError::ProfileWouldUndo { env: env.to_string(), undo: u }),
    }
}

/// Prefixes every error path of a service's configuration with `prefix.`; a lever's
/// (`levers.shed_sheddable_percent`) becomes the profile's field of the same name under
/// `prefix` (`prefix.shed_sheddable_percent`).
fn under(prefix: &str, e: ValidationErrors) -> ValidationErrors {
    let path = |p: &str| match p.strip_prefix("levers.") {
        Some(lever) => format!("{prefix}.{lever}"),
        None => format!("{prefix}.{p}"),
    };
    ValidationErrors(e.0.into_iter().map(|f| FieldError { path: path(&f.path), ..f }).collect())
}

fn field(path: String, value: impl Into<String>, message: impl Into<String>) -> FieldError {
    FieldError { path, value: value.into(), message: message.into() }
}

/// Sets what `svc` of profile `profile` says in `p`, every entry expiring at `expires`, and
/// returns what it replaced. `path` is where the service's definition is (`services.NAME`).
fn apply_to(
    p: &mut Parts,
    svc: &ProfileService,
    profile: &str,
    reason: &str,
    expires: Timestamp,
    path: &str,
) -> Result<ProfileSet, ChangeError> {
    let mut errors = Vec::new();
    let mut saved = ProfileSet::default();
    let mut set_flag =
        |p: &mut Parts, key: &str, value: &serde_json::Value, fpath: String, errors: &mut Vec<_>| {
            let before = p.flags.get(key).cloned();
            let set = match &before {
                Some(f) => {
                    if let Err(e) = f.kind.check(&fpath, value) {
                        errors.push(e);
                        return;
                    }
                    Flag { value: value.clone(), expires_at: Some(expires), rollout: None, ..f.clone() }
                }
                None => Flag {
                    kind: FlagType::Bool,
                    value: value.clone(),
                    description: format!("read-only mode, set by profile {profile}"),
                    owner: String::new(),
                    expires_at: Some(expires),
                    stale: StalePolicy::Hold,
                    rollout: None,
                },
            };
            p.flags.insert(key.to_string(), set.clone());
            saved.flags.push(SetEntry { key: key.to_string(), before, set });
        };
    for (key, value) in &svc.flags {
        let fpath = format!("{path}.flags.{key}");
        if !p.flags.contains_key(key) {
            errors.push(field(fpath, format!("{key:?}"), "no such flag in the service"));
            continue;
        }
        set_flag(p, key, value, fpath, &mut errors);
    }
    if svc.read_only {
        match p.policy.inbound.read_only_flag.clone() {
            Some(key) => {
                set_flag(p, &key, &serde_json::Value::Bool(true), format!("{path}.read_only"), &mut errors)
            }
            None => errors.push(field(
                format!("{path}.read_only"),
                "true",
                "the service's policy names no inbound.read_only_flag",
            )),
        }
    }
    for b in &svc.breakers {
        let key = (b.dependency.clone(), b.operation.clone().unwrap_or_default());
        let set = BreakerOverride {
            dependency: b.dependency.clone(),
            operation: b.operation.clone(),
            state: b.state,
            expires_at: Some(expires),
            reason: format!("profile {profile}: {reason}"),
        };
        let before = p.overrides.insert(key.clone(), set.clone());
        saved.breakers.push(SetEntry { key, before, set });
    }
    if !svc.faults.is_empty() && !p.faults_allowed {
        errors.push(field(format!("{path}.faults"), "", "the environment does not allow fault injection"));
    }
    for f in &svc.faults {
        let set = FaultRule {
            id: f.id.clone(),
            dependency: f.dependency.clone(),
            operation: f.operation.clone(),
            action: f.action.clone(),
            percent: f.percent,
            expires_at: expires,
            instances: Vec::new(),
        };
        let before = p.faults.insert(f.id.clone(), set.clone());
        saved.faults.push(SetEntry { key: f.id.clone(), before, set });
    }
    if let Some(set) = svc.levers(expires, format!("profile {profile}: {reason}")) {
        let before = p.levers.replace(set.clone());
        saved.levers = Some(SetEntry { key: (), before, set });
    }
    if !errors.is_empty() {
        return Err(ChangeError::Invalid(ValidationErrors(errors)));
    }
    // The whole configuration must still validate (a dependency the breaker or fault names,
    // percent ranges…); its paths are reported under the service's definition, a lever's
    // under the profile's own field of the same name.
    p.config().validate().map_err(|e| ChangeError::Invalid(under(path, e)))?;
    Ok(saved)
}

/// What a revert did in one service: a note per entry, and the notes of the entries it
/// left as they are (changed since the profile set them).
#[derive(Debug, Default)]
struct RevertNotes {
    all: Vec<String>,
    left: Vec<String>,
}

impl RevertNotes {
    fn push(&mut self, note: String, left: bool) {
        if left {
            self.left.push(note.clone());
        }
        self.all.push(note);
    }
}

/// Restores what `saved` replaced, entry by entry, unless the entry was changed since the
/// profile set it (then it is left as it is and named in the notes).
fn restore(p: &mut Parts, saved: &ProfileSet) -> RevertNotes {
    fn back<K: Ord + Clone, T: PartialEq + Clone>(
        map: &mut BTreeMap<K, T>,
        swap: &SetEntry<K, T>,
        what: String,
        notes: &mut RevertNotes,
    ) {
        // An entry that expired on the server (gone) is restored too.
        if map.get(&swap.key).is_none_or(|now| *now == swap.set) {
            match &swap.before {
                Some(b) => map.insert(swap.key.clone(), b.clone()),
                None => map.remove(&swap.key),
            };
            notes.push(format!("{what} restored"), false);
        } else {
            notes.push(format!("{what} changed since the profile set it; left as it is"), true);
        }
    }
    let mut notes = RevertNotes::default();
    for s in &saved.flags {
        back(&mut p.flags, s, format!("flag {}", s.key), &mut notes);
    }
    for s in &saved.breakers {
        back(&mut p.overrides, s, format!("breaker override {}", s.key.0), &mut notes);
    }
    for s in &saved.faults {
        back(&mut p.faults, s, format!("fault {}", s.key), &mut notes);
    }
    if let Some(s) = &saved.levers {
        // As `back`, for the one lever override of the service.
        if p.levers.as_ref().is_none_or(|now| *now == s.set) {
            p.levers = s.before.clone();
            notes.push("levers restored".to_string(), false);
        } else {
            notes.push("levers changed since the profile set them; left as they are".to_string(), true);
        }
    }
    notes
}

impl ProfileSpec {
    /// Checks the definition against the environment as it is now: each service exists,
    /// each flag exists and takes the value, and applying it would make a valid
    /// configuration of every service. Reports every bad field, with its path.
    async fn check(&self, actions: &Actions, env: &str) -> Result<(), ChangeError> {
        let mut errors = Vec::new();
        let far = Timestamp::from_unix_ms(now_ms() + MAX_PROFILE_DURATION.as_millis() as i64);
        let environment = actions
            .store
            .environment(env)
            .await?
            .ok_or_else(|| ChangeError::NotFound(Missing::Environment { env: env.to_string() }))?;
        if let Err(m) = super::check_text("description", &self.description) {
            errors.push(m.0);
        }
        for (name, svc) in &self.services {
            let path = format!("services.{name}");
            if let Err(m) = check_name(name) {
                errors.push(field(path, format!("{name:?}"), m));
                continue;
            }
            let Some(snap) = actions.store.latest_snapshot(env, name).await? else {
                errors.push(field(
                    path,
                    format!("{name:?}"),
                    format!("no service {name:?} in environment {env:?}"),
                ));
                continue;
            };
            if actions.store.service(env, name).await?.is_none() {
                errors.push(field(
                    path,
                    format!("{name:?}"),
                    format!("no service {name:?} in environment {env:?}"),
                ));
                continue;
            }
            let cfg = snap.config()?;
            let mut parts = Parts::from_config(cfg, environment.allow_faults);
            match apply_to(&mut parts, svc, "check", "check", far, &path) {
                Ok(_) => {}
                Err(ChangeError::Invalid(v)) => errors.extend(v.0),
                Err(e) => return Err(e),
            }
        }
        if errors.is_empty() { Ok(()) } else { Err(ChangeError::Invalid(ValidationErrors(errors))) }
    }
}

impl Actions {
    /// Creates or replaces profile `name` of `env` as its next version (audited as
    /// `profile.set`). `base` is the version the caller read (0: must not exist yet).
    ///
    /// # Errors
    /// [`ChangeError`]: [`ChangeError::Invalid`] with every bad field of the definition;
    /// [`ChangeError::Conflict`] with the current version when `base` is not it.
    pub async fn put_profile(
        &self,
        by: &Actor,
        reason: &Reason,
        env: &str,
        name: &Name,
        spec: &ProfileSpec,
        base: Option<u64>,
    ) -> Result<Profile, ChangeError> {
        by.may(Action::ProfileSet)?;
        spec.check(self, env).await?;
        let before = self.store.profile(env, name.as_str()).await?;
        let body = serde_json::to_string(spec).map_err(|e| ChangeError::Storage(e.into()))?;
        let mut audit = audit_row(by, reason, Action::ProfileSet, format!("profile {name}"));
        audit.environment = Some(env.to_string());
        audit.before = before.map(|b| b.body);
        audit.after = Some(body.clone());
        match self.store.put_profile(env, name.as_str(), &body, base, &audit).await? {
            Ok(row) => Ok(Profile { row, spec: spec.clone() }),
            Err(moved) => Err(ChangeError::Conflict { expected: base.unwrap_or(0), current: moved.current }),
        }
    }

    /// Deletes profile `name` of `env` (audited as `profile.delete`; its versions stay).
    ///
    /// # Errors
    /// [`ChangeError`]: [`Missing::Profile`].
    pub async fn delete_profile(
        &self,
        by: &Actor,
        reason: &Reason,
        env: &str,
        name: &str,
    ) -> Result<(), ChangeError> {
        by.may(Action::ProfileDelete)?;
        let before = self.store.profile(env, name).await?;
        let missing =
            || ChangeError::NotFound(Missing::Profile { env: env.to_string(), name: name.to_string() });
        let before = before.ok_or_else(missing)?;
        let mut audit = audit_row(by, reason, Action::ProfileDelete, format!("profile {name}"));
        audit.environment = Some(env.to_string());
        audit.before = Some(before.body);
        if self.store.delete_profile(env, name, &audit).await? { Ok(()) } else { Err(missing()) }
    }

    /// Applies profile `name` to `env` until `expires_at` (audited as `profile.apply`: one
    /// revision per service it names, and a row for the environment). At most one profile
    /// is active per environment.
    ///
    /// # Errors
    /// [`ChangeError`]: [`Missing::Profile`]; [`ChangeError::ProfileActive`];
    /// [`ChangeError::InvalidField`] on `expires_at` when it is not in the future or further
    /// than [`MAX_PROFILE_DURATION`]; a service refusing its part (nothing stays applied).
    pub async fn apply_profile(
        &self,
        by: &Actor,
        reason: &Reason,
        env: &str,
        name: &str,
        expires_at: Timestamp,
    ) -> Result<ActivationRow, ChangeError> {
        self.apply_profile_as(by, reason, env, name, expires_at, None).await
    }

    /// [`Actions::apply_profile`] of the profile at `version` (`None`: whatever is
    /// stored): [`ChangeError::Conflict`] when it is at another one, nothing applied.
    pub(super) async fn apply_profile_as(
        &self,
        by: &Actor,
        reason: &Reason,
        env: &str,
        name: &str,
        expires_at: Timestamp,
        version: Option<u64>,
    ) -> Result<ActivationRow, ChangeError> {
        by.may(Action::ProfileApply)?;
        self.gate(by, env, ChangeKind::Profile, &format!("profile {name}")).await?;
        in_future("expires_at", expires_at)?;
        let max = now_ms() + MAX_PROFILE_DURATION.as_millis() as i64;
        if expires_at.unix_ms() > max {
            return Err(ChangeError::InvalidField(field(
                "expires_at".into(),
                expires_at.to_string(),
                "must be at most 7 days ahead (--for 7d at most); an active profile cannot be extended: \
                 to keep it in force longer, apply it again once it has ended or been reverted",
            )));
        }
        let profile = self.store.profile(env, name).await?.ok_or_else(|| {
            ChangeError::NotFound(Missing::Profile { env: env.to_string(), name: name.to_string() })
        })?;
        if let Some(v) = version
            && profile.version != v
        {
            return Err(ChangeError::Conflict { expected: v, current: profile.version });
        }
        let profile = Profile::of(profile)?;
        // What the application changes decides the approval it needs (a profile that sets
        // flags needs what a flag change needs), refused here before anything is recorded;
        // each service's write checks it again against what it replaces.
        let mut changed = Vec::new();
        for (svc, spec) in &profile.spec.services {
            if let Some(snap) = self.store.latest_snapshot(env, svc).await? {
                let old = Parts::from_config(snap.config()?, false);
                let mut new = old.clone();
                if apply_to(&mut new, spec, name, reason.as_str(), expires_at, svc).is_ok() {
                    changed.extend(super::requests::kinds_changed(Some(&old), Some(&new)));
                }
            }
        }
        changed.dedup();
        self.four_eyes(by, env).await?.admit(&changed)?;
        let mut row = ActivationRow {
            id: 0,
            environment: env.to_string(),
            profile: name.to_string(),
            version: profile.row.version,
            applied_at: now_ms(),
            applied_by: by.name.clone(),
            reason: reason.as_str().to_string(),
            expires_at: expires_at.unix_ms(),
            saved: String::new(),
            reverted_at: None,
            reverted_by: None,
            revert_reason: None,
        };
        let Some(id) = self.store.start_activation(&row).await? else {
            let active = self.store.active_profile(env).await?.map(|a| a.profile).unwrap_or_default();
            return Err(ChangeError::ProfileActive { env: env.to_string(), active });
        };
        row.id = id;
        let target = format!("profile {name}");
        let mut saved: BTreeMap<String, ProfileSet> = BTreeMap::new();
        for (svc, spec) in &profile.spec.services {
            let path = format!("services.{svc}");
            let mut out = None;
            let at = ServiceAt::new(env, svc.clone(), None);
            let subject = Subject::Entries(spec.entries());
            let res = self
                .write(by, reason, Action::ProfileApply, &at, &target, subject, |p| {
                    let old = p.clone();
                    let s = apply_to(p, spec, name, reason.as_str(), expires_at, &path)?;
                    let diff = AuditDiff::between(&Subject::Entries(s.entries()), &old, p);
                    out = Some(s);
                    Ok(diff)
                })
                .await;
            let res = res.and_then(|_| {
                let s = out.take().expect("the edit ran");
                saved.insert(svc.clone(), s);
                serde_json::to_string(&saved).map_err(|e| ChangeError::Storage(e.into()))
            });
            let res = match res {
                Ok(json) => self.store.save_activation(id, &json, None).await.map_err(ChangeError::Storage),
                Err(e) => Err(e),
            };
            if let Err(e) = res {
                // Nothing of the profile stays: undo the services already written.
                let undo = Reason::by_server(format!("applying profile {name} failed in service {svc}: {e}"));
                row.saved = serde_json::to_string(&saved).unwrap_or_default();
                if let Err(u) = self.undo(by, &undo, &row, None).await {
                    tracing::error!(error = %u, environment = env, profile = name, "undoing a failed profile application");
                }
                return Err(e);
            }
        }
        row.saved = serde_json::to_string(&saved).map_err(|e| ChangeError::Storage(e.into()))?;
        let mut audit = audit_row(by, reason, Action::ProfileApply, target);
        audit.environment = Some(env.to_string());
        audit.after = Some(activation_value(&row));
        self.store.save_activation(id, &row.saved, Some(&audit)).await?;
        Ok(row)
    }

    /// Reverts the profile active in `env` (audited as `profile.revert`): every entry it set
    /// is restored to what it replaced, unless changed since (named in the answer's `left`).
    ///
    /// # Errors
    /// [`ChangeError`]: [`Missing::ActiveProfile`].
    pub async fn revert_profile(
        &self,
        by: &Actor,
        reason: &Reason,
        env: &str,
    ) -> Result<Reverted, ChangeError> {
        by.may(Action::ProfileRevert)?;
        let missing = || ChangeError::NotFound(Missing::ActiveProfile { env: env.to_string() });
        let active = self.store.active_profile(env).await?.ok_or_else(missing)?;
        let mut audit = audit_row(by, reason, Action::ProfileRevert, format!("profile {}", active.profile));
        audit.environment = Some(env.to_string());
        audit.before = Some(activation_value(&active));
        self.undo(by, reason, &active, Some(&audit)).await?.ok_or_else(missing)
    }

    /// Reverts every profile whose expiry is at or before `now` (by `levee` via `server`,
    /// audited as `profile.revert`). With several replicas, one claims each. Returns how
    /// many were reverted.
    ///
    /// # Errors
    /// [`ChangeError::Storage`] when the expired profiles cannot be listed.
    pub async fn expire_profiles(&self, now: Timestamp) -> Result<usize, ChangeError> {
        let by = Actor::server();
        let mut n = 0;
        for a in self.store.expired_activations(now.unix_ms()).await? {
            let reason = Reason::by_server(format!(
                "profile {} expired at {}",
                a.profile,
                Timestamp::from_unix_ms(a.expires_at)
            ));
            let mut audit = audit_row(&by, &reason, Action::ProfileRevert, format!("profile {}", a.profile));
            audit.environment = Some(a.environment.clone());
            audit.before = Some(activation_value(&a));
            match self.undo(&by, &reason, &a, Some(&audit)).await {
                Ok(Some(_)) => n += 1,
                Ok(None) => {}
                Err(e) => {
                    tracing::warn!(error = %e, environment = %a.environment, profile = %a.profile, "profile expiry failed")
                }
            }
        }
        Ok(n)
    }

    /// Claims the revert of `a` (`None`: another caller or replica already did) and
    /// restores each service. A service that fails is logged: what the profile set expires
    /// there by itself.
    async fn undo(
        &self,
        by: &Actor,
        reason: &Reason,
        a: &ActivationRow,
        audit: Option<&AuditRow>,
    ) -> Result<Option<Reverted>, ChangeError> {
        let Some(claimed) = self.store.claim_revert(a.id, &by.name, reason.as_str(), audit).await? else {
            return Ok(None);
        };
        let mut left = BTreeMap::new();
        // What this caller knows was saved (a failed application passes it in `a`).
        let json = if a.saved.is_empty() { &claimed.saved } else { &a.saved };
        let saved: BTreeMap<String, ProfileSet> = serde_json::from_str(json).unwrap_or_default();
        let target = format!("profile {}", a.profile);
        // Putting back what the profile replaced is upkeep, not a change of its own: it
        // restores only entries nobody changed since, to what they were before.
        let by = &Actor { approval: super::Approval::Upkeep, ..by.clone() };
        for (svc, s) in &saved {
            let at = ServiceAt::new(&a.environment, svc.clone(), None);
            let subject = Subject::Entries(s.entries());
            let res = self
                .write(by, reason, Action::ProfileRevert, &at, &target, subject.clone(), |p| {
                    let old = p.clone();
                    let notes = restore(p, s);
                    let diff = AuditDiff::between(&subject, &old, p).with_detail(notes.all.join("; "));
                    if !notes.left.is_empty() {
                        left.insert(svc.clone(), notes.left);
                    }
                    Ok(diff)
                })
                .await;
            if let Err(e) = res {
                tracing::warn!(error = %e, environment = %a.environment, service = %svc, profile = %a.profile,
                    "reverting a profile in a service failed; its entries expire by themselves");
                left.insert(
                    svc.clone(),
                    vec![format!("not reverted ({e}); its entries end at their expiry")],
                );
            }
        }
        Ok(Some(Reverted { activation: claimed, left }))
    }
}

#[cfg(test)]
mod tests {
    use levee_agent::policy::ServiceConfig;

    use super::*;

    fn parts() -> Parts {
        let cfg: ServiceConfig = serde_json::from_str(
            r#"{"policy": {"dependencies": {"pay": {"enabled_flag": "pay.enabled"}},
                           "inbound": {"read_only_flag": "ro"}},
                "flags": {"pay.enabled": {"type": "bool", "value": true}}}"#,
        )
        .unwrap();
        Parts::from_config(cfg, false)
    }

    fn spec() -> ProfileService {
        serde_json::from_str(
            r#"{"flags": {"pay.enabled": false}, "read_only": true,
                "breakers": [{"dependency": "pay", "state": "forced_open"}],
                "shed_sheddable_percent": 40, "pause_retries": true, "inbound_limit": 25}"#,
        )
        .unwrap()
    }

    #[test]
    fn applying_sets_every_entry_with_the_expiry_and_restoring_undoes_it() {
        let mut p = parts();
        let orig = p.clone();
        let exp = Timestamp::from_unix_ms(now_ms() + 60_000);
        let saved = apply_to(&mut p, &spec(), "storm", "why", exp, "services.shop").unwrap();
        assert_eq!(p.flags["pay.enabled"].value, serde_json::json!(false));
        assert_eq!(p.flags["pay.enabled"].expires_at, Some(exp));
        assert_eq!(p.flags["ro"].value, serde_json::json!(true));
        assert_eq!(p.overrides[&("pay".to_string(), String::new())].expires_at, Some(exp));
        let levers = p.levers.clone().unwrap();
        assert_eq!(
            (levers.shed_sheddable_percent, levers.retries_paused, levers.inbound_limit, levers.expires_at),
            (Some(40.0), Some(true), Some(25), exp)
        );
        assert_eq!(levers.reason, "profile storm: why");
        let notes = restore(&mut p, &saved);
        assert!(notes.left.is_empty());
        assert_eq!(p, orig, "{:?}", notes.all);
    }

    #[test]
    fn an_entry_changed_since_is_left_and_one_expired_is_restored() {
        let mut p = parts();
        let exp = Timestamp::from_unix_ms(now_ms() + 60_000);
        let saved = apply_to(&mut p, &spec(), "storm", "why", exp, "services.shop").unwrap();
        p.flags.get_mut("pay.enabled").unwrap().value = serde_json::json!(true);
        p.flags.get_mut("pay.enabled").unwrap().expires_at = None;
        p.overrides.clear(); // expired on the server
        p.levers.as_mut().unwrap().inbound_limit = Some(7); // changed by someone else
        let RevertNotes { all: notes, left } = restore(&mut p, &saved);
        assert_eq!(
            left,
            [
                "flag pay.enabled changed since the profile set it; left as it is",
                "levers changed since the profile set them; left as they are"
            ]
        );
        assert!(notes.iter().any(|n| n == "levers changed since the profile set them; left as they are"));
        assert_eq!(p.levers.as_ref().unwrap().inbound_limit, Some(7));
        assert!(
            notes.iter().any(|n| n == "flag pay.enabled changed since the profile set it; left as it is"),
            "{notes:?}"
        );
        assert!(p.overrides.is_empty());
        assert!(!p.flags.contains_key("ro"));
    }

    #[test]
    fn bad_entries_are_named_by_their_path() {
        let mut p = parts();
        let bad: ProfileService = serde_json::from_str(
            r#"{"flags": {"nope": true, "pay.enabled": 3},
                "faults": [{"id": "f", "dependency": "pay", "action": {"type": "connection_error"}, "percent": 5}]}"#,
        )
        .unwrap();
        let exp = Timestamp::from_unix_ms(now_ms() + 60_000);
        let Err(ChangeError::Invalid(v)) = apply_to(&mut p, &bad, "x", "y", exp, "services.shop") else {
            panic!()
        };
        let paths: Vec<_> = v.0.iter().map(|e| e.path.as_str()).collect();
        assert_eq!(
            paths,
            ["services.shop.flags.nope", "services.shop.flags.pay.enabled", "services.shop.faults"]
        );
    }

    #[test]
    fn a_lever_out_of_range_is_named_by_the_profiles_field_with_the_range() {
        let mut p = parts();
        let bad: ProfileService =
            serde_json::from_str(r#"{"shed_sheddable_percent": 150, "inbound_limit": 0}"#).unwrap();
        let exp = Timestamp::from_unix_ms(now_ms() + 60_000);
        let Err(ChangeError::Invalid(v)) = apply_to(&mut p, &bad, "x", "y", exp, "services.shop") else {
            panic!()
        };
        let got: Vec<_> = v.0.iter().map(|e| (e.path.as_str(), e.message.as_str())).collect();
        assert_eq!(
            got,
            [
                ("services.shop.shed_sheddable_percent", "must be between 0 and 100 percent"),
                ("services.shop.inbound_limit", "must be between 1 and 100000"),
            ]
        );
    }
}

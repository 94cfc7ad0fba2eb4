//! A service's editable parts — policy, flags, fault rules, breaker overrides, levers and
//! the flags' restores — and their rows: read inside a revision's write transaction, and
//! what an edit changed written back (`mutate.rs` holds that transaction).

use std::collections::BTreeMap;

use levee_agent::policy::{BreakerOverride, FaultRule, Flag, LeverOverride, Policy, ServiceConfig};
use sqlx::{AnyConnection as Conn, Row};

/// The editable parts of a service, loaded inside the write transaction.
#[derive(Clone, Debug, PartialEq)]
pub struct Parts {
    pub policy: Policy,
    /// Flags by key.
    pub flags: BTreeMap<String, Flag>,
    /// Fault rules by id.
    pub faults: BTreeMap<String, FaultRule>,
    /// Breaker overrides by (dependency, operation or "" for the dependency-level breaker).
    pub overrides: BTreeMap<(String, String), BreakerOverride>,
    /// Whether the environment permits faults (its `allow_faults`).
    pub faults_allowed: bool,
    /// Operator levers until their expiry (set by a profile).
    pub levers: Option<LeverOverride>,
    /// Server-side only, never in the snapshot: for a flag whose value is temporary (it has
    /// an `expires_at`), the flag as it was before, which its expiry puts back. Kept up to
    /// date by every write (`actions::flags::remembered`).
    pub restores: BTreeMap<String, Flag>,
}

impl Parts {
    /// The snapshot body these parts make.
    pub fn config(&self) -> ServiceConfig {
        ServiceConfig {
            policy: self.policy.clone(),
            flags: self.flags.clone(),
            faults: self.faults.values().cloned().collect(),
            breaker_overrides: self.overrides.values().cloned().collect(),
            faults_allowed: self.faults_allowed,
            levers: self.levers.clone(),
        }
    }

    /// Parts restored from a stored snapshot body (for rollback).
    pub fn from_config(cfg: ServiceConfig, faults_allowed: bool) -> Parts {
        Parts {
            policy: cfg.policy,
            flags: cfg.flags,
            faults: cfg.faults.into_iter().map(|f| (f.id.clone(), f)).collect(),
            overrides: cfg
                .breaker_overrides
                .into_iter()
                .map(|o| ((o.dependency.clone(), o.operation.clone().unwrap_or_default()), o))
                .collect(),
            faults_allowed,
            levers: cfg.levers,
            restores: BTreeMap::new(),
        }
    }
}

/// The parts of service `service` of `env`, whose stored policy is `policy_json`.
pub(super) async fn load_parts(
    conn: &mut Conn,
    env: &str,
    service: &str,
    policy_json: &str,
    faults_allowed: bool,
) -> anyhow::Result<Parts> {
    let policy: Policy = serde_json::from_str(policy_json)?;
    let mut flags = BTreeMap::new();
    for r in sqlx::query("SELECT key, body FROM flags WHERE environment = $1 AND service = $2")
        .bind(env)
        .bind(service)
        .fetch_all(&mut *conn)
        .await?
    {
        let key: String = r.try_get("key")?;
        let body: String = r.try_get("body")?;
        flags.insert(key, serde_json::from_str(&body)?);
    }
    let mut faults = BTreeMap::new();
    for r in sqlx::query("SELECT id, body FROM faults WHERE environment = $1 AND service = $2")
        .bind(env)
        .bind(service)
        .fetch_all(&mut *conn)
        .await?
    {
        let id: String = r.try_get("id")?;
        let body: String = r.try_get("body")?;
        faults.insert(id, serde_json::from_str(&body)?);
    }
    let mut overrides = BTreeMap::new();
    for r in sqlx::query(
        "SELECT dependency, operation, body FROM breaker_overrides WHERE environment = $1 AND service = $2",
    )
    .bind(env)
    .bind(service)
    .fetch_all(&mut *conn)
    .await?
    {
        let dep: String = r.try_get("dependency")?;
        let op: String = r.try_get("operation")?;
        let body: String = r.try_get("body")?;
        overrides.insert((dep, op), serde_json::from_str(&body)?);
    }
    let levers = sqlx::query("SELECT body FROM levers WHERE environment = $1 AND service = $2")
        .bind(env)
        .bind(service)
        .fetch_optional(&mut *conn)
        .await?
        .map(|r| serde_json::from_str(&r.try_get::<String, _>("body")?).map_err(anyhow::Error::from))
        .transpose()?;
    let mut restores = BTreeMap::new();
    for r in sqlx::query("SELECT key, body FROM flag_restores WHERE environment = $1 AND service = $2")
        .bind(env)
        .bind(service)
        .fetch_all(&mut *conn)
        .await?
    {
        let key: String = r.try_get("key")?;
        let body: String = r.try_get("body")?;
        restores.insert(key, serde_json::from_str(&body)?);
    }
    Ok(Parts { policy, flags, faults, overrides, faults_allowed, levers, restores })
}

/// Writes the differences between `old` and `new` parts.
pub(super) async fn store_parts(
    conn: &mut Conn,
    env: &str,
    service: &str,
    old: &Parts,
    new: &Parts,
    now: i64,
) -> anyhow::Result<()> {
    if old.policy != new.policy {
        sqlx::query("UPDATE services SET policy = $1 WHERE environment = $2 AND name = $3")
            .bind(serde_json::to_string(&new.policy)?)
            .bind(env)
            .bind(service)
            .execute(&mut *conn)
            .await?;
    }
    for key in gone(&old.flags, &new.flags) {
        sqlx::query("DELETE FROM flags WHERE environment = $1 AND service = $2 AND key = $3")
            .bind(env)
            .bind(service)
            .bind(key)
            .execute(&mut *conn)
            .await?;
    }
    for (key, flag) in changed(&old.flags, &new.flags) {
        sqlx::query(
            "INSERT INTO flags (environment, service, key, body, expires_at, updated_at) VALUES ($1, $2, $3, $4, $5, $6) \
             ON CONFLICT (environment, service, key) DO UPDATE SET body = excluded.body, \
             expires_at = excluded.expires_at, updated_at = excluded.updated_at",
        )
        .bind(env)
        .bind(service)
        .bind(key)
        .bind(serde_json::to_string(flag)?)
        .bind(flag.expires_at.map(|t| t.unix_ms()))
        .bind(now)
        .execute(&mut *conn)
        .await?;
    }
    for id in gone(&old.faults, &new.faults) {
        sqlx::query("DELETE FROM faults WHERE environment = $1 AND service = $2 AND id = $3")
            .bind(env)
            .bind(service)
            .bind(id)
            .execute(&mut *conn)
            .await?;
    }
    for (id, f) in changed(&old.faults, &new.faults) {
        sqlx::query(
            "INSERT INTO faults (environment, service, id, body, expires_at) VALUES ($1, $2, $3, $4, $5) \
             ON CONFLICT (environment, service, id) DO UPDATE SET body = excluded.body, expires_at = excluded.expires_at",
        )
        .bind(env)
        .bind(service)
        .bind(id)
        .bind(serde_json::to_string(f)?)
        .bind(f.expires_at.unix_ms())
        .execute(&mut *conn)
        .await?;
    }
    for (dep, op) in gone(&old.overrides, &new.overrides) {
        sqlx::query(
            "DELETE FROM breaker_overrides WHERE environment = $1 AND service = $2 AND dependency = $3 AND operation = $4",
        )
        .bind(env)
        .bind(service)
        .bind(dep)
        .bind(op)
        .execute(&mut *conn)
        .await?;
    }
    for ((dep, op), o) in changed(&old.overrides, &new.overrides) {
        sqlx::query(
            "INSERT INTO breaker_overrides (environment, service, dependency, operation, body, expires_at) \
             VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT (environment, service, dependency, operation) \
             DO UPDATE SET body = excluded.body, expires_at = excluded.expires_at",
        )
        .bind(env)
        .bind(service)
        .bind(dep)
        .bind(op)
        .bind(serde_json::to_string(o)?)
        .bind(o.expires_at.map(|t| t.unix_ms()))
        .execute(&mut *conn)
        .await?;
    }
    if old.levers != new.levers {
        match &new.levers {
            None => {
                sqlx::query("DELETE FROM levers WHERE environment = $1 AND service = $2")
                    .bind(env)
                    .bind(service)
                    .execute(&mut *conn)
                    .await?;
            }
            Some(l) => {
                sqlx::query(
                    "INSERT INTO levers (environment, service, body, expires_at) VALUES ($1, $2, $3, $4) \
                     ON CONFLICT (environment, service) DO UPDATE SET body = excluded.body, \
                     expires_at = excluded.expires_at",
                )
                .bind(env)
                .bind(service)
                .bind(serde_json::to_string(l)?)
                .bind(l.expires_at.unix_ms())
                .execute(&mut *conn)
                .await?;
            }
        }
    }
    for key in gone(&old.restores, &new.restores) {
        sqlx::query("DELETE FROM flag_restores WHERE environment = $1 AND service = $2 AND key = $3")
            .bind(env)
            .bind(service)
            .bind(key)
            .execute(&mut *conn)
            .await?;
    }
    for (key, flag) in changed(&old.restores, &new.restores) {
        sqlx::query(
            "INSERT INTO flag_restores (environment, service, key, body) VALUES ($1, $2, $3, $4) \
             ON CONFLICT (environment, service, key) DO UPDATE SET body = excluded.body",
        )
        .bind(env)
        .bind(service)
        .bind(key)
        .bind(serde_json::to_string(flag)?)
        .execute(&mut *conn)
        .await?;
    }
    Ok(())
}

/// The keys of `old` that `new` no longer has: their rows are deleted.
fn gone<'a, K: Ord, V>(old: &'a BTreeMap<K, V>, new: &'a BTreeMap<K, V>) -> impl Iterator<Item = &'a K> {
    old.keys().filter(|k| !new.contains_key(*k))
}

/// The entries of `new` that `old` did not have or had otherwise: their rows are written,
/// the others left as they are.
fn changed<'a, K: Ord, V: PartialEq>(
    old: &'a BTreeMap<K, V>,
    new: &'a BTreeMap<K, V>,
) -> impl Iterator<Item = (&'a K, &'a V)> {
    new.iter().filter(|(k, v)| old.get(*k) != Some(*v))
}

/// Whether environment `env` permits faults (its `allow_faults`).
pub(super) async fn faults_allowed(conn: &mut Conn, env: &str) -> anyhow::Result<bool> {
    let row = sqlx::query("SELECT allow_faults FROM environments WHERE name = $1")
        .bind(env)
        .fetch_one(conn)
        .await?;
    Ok(row.try_get::<i64, _>("allow_faults")? != 0)
}

/// The parts of a service as stored now; `None` when it does not exist (or is deleted).
pub(super) async fn load_current(conn: &mut Conn, env: &str, service: &str) -> anyhow::Result<Option<Parts>> {
    let row = sqlx::query(
        "SELECT policy FROM services WHERE environment = $1 AND name = $2 AND deleted_at IS NULL",
    )
    .bind(env)
    .bind(service)
    .fetch_optional(&mut *conn)
    .await?;
    let Some(row) = row else { return Ok(None) };
    let policy: String = row.try_get("policy")?;
    let allow = faults_allowed(conn, env).await?;
    Ok(Some(load_parts(conn, env, service, &policy, allow).await?))
}

/// The current revision of a service that exists (and is not deleted).
pub(super) async fn current_revision(conn: &mut Conn, env: &str, name: &str) -> anyhow::Result<Option<u64>> {
    let row = sqlx::query(
        "SELECT revision FROM services WHERE environment = $1 AND name = $2 AND deleted_at IS NULL",
    )
    .bind(env)
    .bind(name)
    .fetch_optional(&mut *conn)
    .await?;
    Ok(row.map(|r| r.try_get::<i64, _>("revision")).transpose()?.map(|r| r as u64))
}

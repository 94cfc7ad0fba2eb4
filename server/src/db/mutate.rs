//! The single write path for everything an agent receives.

use std::collections::BTreeMap;

use levee_agent::policy::{
    BreakerOverride, FaultRule, Flag, Policy, ServiceConfig, ValidationErrors, canonical_json, content_hash,
};
use sqlx::{AnyConnection, AnyConnection as Conn, Row};

use super::{AuditRow, Backend, NOTIFY_CHANNEL, SnapshotRow, Store, now_ms};

/// Who is changing what, why, and through which door.
#[derive(Clone, Debug)]
pub struct AuditCtx {
    /// Username, `token:<name>` or `levee`.
    pub actor: String,
    /// `api`, `ui`, `cli` or `server`.
    pub via: String,
    /// Request id.
    pub request_id: String,
    /// Mandatory reason.
    pub reason: String,
}

/// The editable parts of a service, loaded inside the write transaction.
#[derive(Clone, Debug, PartialEq)]
pub struct Parts {
    /// The policy.
    pub policy: Policy,
    /// Flags by key.
    pub flags: BTreeMap<String, Flag>,
    /// Fault rules by id.
    pub faults: BTreeMap<String, FaultRule>,
    /// Breaker overrides by (dependency, operation or "").
    pub overrides: BTreeMap<(String, String), BreakerOverride>,
    /// Whether the environment permits faults.
    pub faults_allowed: bool,
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
        }
    }
}

/// Result of a committed mutation.
#[derive(Clone, Debug)]
pub struct Committed {
    /// The snapshot now current (new, or the unchanged current one).
    pub snapshot: SnapshotRow,
    /// `false` when the edit changed nothing (no revision was created).
    pub changed: bool,
}

/// Why a mutation did not commit.
#[derive(Debug, thiserror::Error)]
pub enum MutateError {
    /// No such environment or service.
    #[error("not found: {0}")]
    NotFound(String),
    /// `If-Match` mismatch.
    #[error("revision conflict: expected {expected}, current {current}")]
    Conflict {
        /// What the client sent.
        expected: u64,
        /// What is stored.
        current: u64,
    },
    /// The edit itself refused (bad target, missing resource…).
    #[error("{0}")]
    Rejected(crate::error::ApiError),
    /// The resulting configuration is invalid.
    #[error("{0}")]
    Invalid(ValidationErrors),
    /// Database failure.
    #[error(transparent)]
    Db(#[from] anyhow::Error),
}

impl From<sqlx::Error> for MutateError {
    fn from(e: sqlx::Error) -> Self {
        MutateError::Db(e.into())
    }
}

pub(crate) async fn insert_audit(conn: &mut AnyConnection, row: &AuditRow) -> anyhow::Result<()> {
    sqlx::query(
        "INSERT INTO audit (at, actor, via, request_id, action, environment, service, target, outcome, reason, \
         before, after, revision) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13)",
    )
    .bind(row.at)
    .bind(&row.actor)
    .bind(&row.via)
    .bind(&row.request_id)
    .bind(&row.action)
    .bind(row.environment.clone())
    .bind(row.service.clone())
    .bind(&row.target)
    .bind(&row.outcome)
    .bind(&row.reason)
    .bind(row.before.clone())
    .bind(row.after.clone())
    .bind(row.revision)
    .execute(conn)
    .await?;
    Ok(())
}

async fn load_parts(
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
    Ok(Parts { policy, flags, faults, overrides, faults_allowed })
}

/// Writes the differences between `old` and `new` parts.
async fn store_parts(
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
    for key in old.flags.keys().filter(|k| !new.flags.contains_key(*k)) {
        sqlx::query("DELETE FROM flags WHERE environment = $1 AND service = $2 AND key = $3")
            .bind(env)
            .bind(service)
            .bind(key)
            .execute(&mut *conn)
            .await?;
    }
    for (key, flag) in &new.flags {
        if old.flags.get(key) != Some(flag) {
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
    }
    for id in old.faults.keys().filter(|k| !new.faults.contains_key(*k)) {
        sqlx::query("DELETE FROM faults WHERE environment = $1 AND service = $2 AND id = $3")
            .bind(env)
            .bind(service)
            .bind(id)
            .execute(&mut *conn)
            .await?;
    }
    for (id, f) in &new.faults {
        if old.faults.get(id) != Some(f) {
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
    }
    for (dep, op) in old.overrides.keys().filter(|k| !new.overrides.contains_key(*k)) {
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
    for ((dep, op), o) in &new.overrides {
        if old.overrides.get(&(dep.clone(), op.clone())) != Some(o) {
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
    }
    Ok(())
}

/// Description of one mutation for the audit log.
#[derive(Clone, Debug)]
pub struct Change<'a> {
    /// Environment.
    pub env: &'a str,
    /// Service.
    pub service: &'a str,
    /// `policy.update`, `flag.set`, …
    pub action: &'a str,
    /// Target inside the service.
    pub target: &'a str,
    /// `If-Match` revision, if any.
    pub expected: Option<u64>,
}

impl Store {
    /// Applies `edit` to a service's parts in one transaction: bumps the revision counter
    /// row (checking `expected` for optimistic concurrency), validates the resulting
    /// configuration, stores the changed parts, the full snapshot and its hash, appends the
    /// audit row and — on PostgreSQL — a NOTIFY delivered after commit.
    ///
    /// `edit` returns the JSON (before, after) of what it changed, for the audit row. When
    /// the edit changes nothing, nothing is written and `changed` is false.
    ///
    /// Refused attempts (conflict, invalid) are audited too, with their outcome.
    pub async fn mutate<F>(
        &self,
        change: Change<'_>,
        ctx: &AuditCtx,
        edit: F,
    ) -> Result<Committed, MutateError>
    where
        F: FnOnce(&mut Parts) -> Result<(Option<String>, Option<String>), crate::error::ApiError>,
    {
        let result = self.mutate_inner(&change, ctx, edit).await;
        let outcome = match &result {
            Ok(_) => None,
            Err(MutateError::Conflict { .. }) => Some("conflict"),
            Err(MutateError::Invalid(_)) | Err(MutateError::Rejected(_)) => Some("rejected"),
            Err(_) => None,
        };
        if let Some(outcome) = outcome {
            let detail = match &result {
                Err(e) => Some(e.to_string()),
                _ => None,
            };
            let row = AuditRow {
                at: now_ms(),
                actor: ctx.actor.clone(),
                via: ctx.via.clone(),
                request_id: ctx.request_id.clone(),
                action: change.action.to_string(),
                environment: Some(change.env.to_string()),
                service: Some(change.service.to_string()),
                target: change.target.to_string(),
                outcome: outcome.to_string(),
                reason: ctx.reason.clone(),
                before: None,
                after: detail,
                revision: None,
                ..Default::default()
            };
            if let Err(e) = self.append_audit(&row).await {
                tracing::error!(error = ?e, "could not audit a refused change");
            }
        }
        result
    }

    async fn mutate_inner<F>(
        &self,
        change: &Change<'_>,
        ctx: &AuditCtx,
        edit: F,
    ) -> Result<Committed, MutateError>
    where
        F: FnOnce(&mut Parts) -> Result<(Option<String>, Option<String>), crate::error::ApiError>,
    {
        let (env, service) = (change.env, change.service);
        let _g = self.write_guard().await;
        let mut tx = self.pool.begin().await?;
        let now = now_ms();
        // The counter row is written first: the transaction holds the write lock from here on.
        let bumped = match change.expected {
            Some(exp) => {
                sqlx::query(
                    "UPDATE services SET revision = revision + 1, updated_at = $1 \
                 WHERE environment = $2 AND name = $3 AND revision = $4 RETURNING revision, policy",
                )
                .bind(now)
                .bind(env)
                .bind(service)
                .bind(exp as i64)
                .fetch_optional(&mut *tx)
                .await?
            }
            None => {
                sqlx::query(
                    "UPDATE services SET revision = revision + 1, updated_at = $1 \
                 WHERE environment = $2 AND name = $3 RETURNING revision, policy",
                )
                .bind(now)
                .bind(env)
                .bind(service)
                .fetch_optional(&mut *tx)
                .await?
            }
        };
        let Some(bumped) = bumped else {
            let current = sqlx::query("SELECT revision FROM services WHERE environment = $1 AND name = $2")
                .bind(env)
                .bind(service)
                .fetch_optional(&mut *tx)
                .await?;
            drop(tx);
            return match (current, change.expected) {
                (Some(row), Some(expected)) => {
                    let cur: i64 = row.try_get("revision")?;
                    Err(MutateError::Conflict { expected, current: cur as u64 })
                }
                _ => Err(MutateError::NotFound(format!("service {service:?} in environment {env:?}"))),
            };
        };
        let revision = bumped.try_get::<i64, _>("revision")? as u64;
        let policy_json: String = bumped.try_get("policy")?;
        let allow = sqlx::query("SELECT allow_faults FROM environments WHERE name = $1")
            .bind(env)
            .fetch_one(&mut *tx)
            .await?
            .try_get::<i64, _>("allow_faults")?
            != 0;
        let old = load_parts(&mut tx, env, service, &policy_json, allow).await?;
        let mut new = old.clone();
        let (before, after) = edit(&mut new).map_err(MutateError::Rejected)?;
        let cfg = new.config();
        cfg.validate().map_err(MutateError::Invalid)?;
        let body = canonical_json(&cfg);
        let hash = content_hash(&body);
        let body = String::from_utf8(body).map_err(|e| MutateError::Db(e.into()))?;

        let prev = sqlx::query(
            "SELECT hash FROM revisions WHERE environment = $1 AND service = $2 ORDER BY revision DESC LIMIT 1",
        )
        .bind(env)
        .bind(service)
        .fetch_optional(&mut *tx)
        .await?;
        if let Some(prev) = &prev
            && prev.try_get::<String, _>("hash")? == hash
        {
            // Nothing changed: roll back the counter bump, answer with the current snapshot.
            tx.rollback().await?;
            drop(_g);
            let snap = self
                .latest_snapshot(env, service)
                .await?
                .ok_or_else(|| MutateError::NotFound(format!("service {service:?}")))?;
            return Ok(Committed { snapshot: snap, changed: false });
        }

        store_parts(&mut tx, env, service, &old, &new, now).await?;
        sqlx::query(
            "INSERT INTO revisions (environment, service, revision, hash, body, created_at, actor, reason) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8)",
        )
        .bind(env)
        .bind(service)
        .bind(revision as i64)
        .bind(&hash)
        .bind(&body)
        .bind(now)
        .bind(&ctx.actor)
        .bind(&ctx.reason)
        .execute(&mut *tx)
        .await?;
        let audit = AuditRow {
            at: now,
            actor: ctx.actor.clone(),
            via: ctx.via.clone(),
            request_id: ctx.request_id.clone(),
            action: change.action.to_string(),
            environment: Some(env.to_string()),
            service: Some(service.to_string()),
            target: change.target.to_string(),
            outcome: "ok".to_string(),
            reason: ctx.reason.clone(),
            before,
            after,
            revision: Some(revision as i64),
            ..Default::default()
        };
        insert_audit(&mut tx, &audit).await?;
        if self.backend == Backend::Postgres {
            let payload =
                serde_json::json!({"environment": env, "service": service, "revision": revision}).to_string();
            sqlx::query("SELECT pg_notify($1, $2)")
                .bind(NOTIFY_CHANNEL)
                .bind(payload)
                .execute(&mut *tx)
                .await?;
        }
        tx.commit().await?;
        Ok(Committed {
            snapshot: SnapshotRow {
                environment: env.to_string(),
                service: service.to_string(),
                revision,
                hash,
                body,
                created_at: now,
            },
            changed: true,
        })
    }

    /// Creates a service with its first revision (1). Returns `None` when it exists.
    pub async fn create_service(
        &self,
        env: &str,
        name: &str,
        description: &str,
        parts: &Parts,
        ctx: &AuditCtx,
    ) -> Result<Option<SnapshotRow>, MutateError> {
        let cfg = parts.config();
        cfg.validate().map_err(MutateError::Invalid)?;
        let _g = self.write_guard().await;
        let mut tx = self.pool.begin().await?;
        let now = now_ms();
        let env_exists = sqlx::query("SELECT allow_faults FROM environments WHERE name = $1")
            .bind(env)
            .fetch_optional(&mut *tx)
            .await?;
        if env_exists.is_none() {
            return Err(MutateError::NotFound(format!("environment {env:?}")));
        }
        let inserted = sqlx::query(
            "INSERT INTO services (environment, name, description, revision, policy, created_at, updated_at) \
             VALUES ($1, $2, $3, $4, $5, $6, $7) ON CONFLICT (environment, name) DO NOTHING",
        )
        .bind(env)
        .bind(name)
        .bind(description)
        .bind(1i64)
        .bind(serde_json::to_string(&parts.policy).map_err(|e| MutateError::Db(e.into()))?)
        .bind(now)
        .bind(now)
        .execute(&mut *tx)
        .await?;
        if inserted.rows_affected() == 0 {
            return Ok(None);
        }
        let empty = Parts {
            policy: parts.policy.clone(),
            ..Parts::from_config(ServiceConfig::default(), parts.faults_allowed)
        };
        store_parts(&mut tx, env, name, &empty, parts, now).await?;
        let body = canonical_json(&cfg);
        let hash = content_hash(&body);
        let body = String::from_utf8(body).map_err(|e| MutateError::Db(e.into()))?;
        sqlx::query(
            "INSERT INTO revisions (environment, service, revision, hash, body, created_at, actor, reason) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8)",
        )
        .bind(env)
        .bind(name)
        .bind(1i64)
        .bind(&hash)
        .bind(&body)
        .bind(now)
        .bind(&ctx.actor)
        .bind(&ctx.reason)
        .execute(&mut *tx)
        .await?;
        let audit = AuditRow {
            at: now,
            actor: ctx.actor.clone(),
            via: ctx.via.clone(),
            request_id: ctx.request_id.clone(),
            action: "service.create".to_string(),
            environment: Some(env.to_string()),
            service: Some(name.to_string()),
            target: name.to_string(),
            outcome: "ok".to_string(),
            reason: ctx.reason.clone(),
            before: None,
            after: Some(body.clone()),
            revision: Some(1),
            ..Default::default()
        };
        insert_audit(&mut tx, &audit).await?;
        if self.backend == Backend::Postgres {
            let payload = serde_json::json!({"environment": env, "service": name, "revision": 1}).to_string();
            sqlx::query("SELECT pg_notify($1, $2)")
                .bind(NOTIFY_CHANNEL)
                .bind(payload)
                .execute(&mut *tx)
                .await?;
        }
        tx.commit().await?;
        Ok(Some(SnapshotRow {
            environment: env.to_string(),
            service: name.to_string(),
            revision: 1,
            hash,
            body,
            created_at: now,
        }))
    }
}

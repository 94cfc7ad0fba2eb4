//! Durable storage over SQLite (embedded default) or PostgreSQL (several replicas).
//!
//! One `Store` speaks both through sqlx's `Any` driver; the SQL is written to run on both
//! (numbered `$n` placeholders in first-use order, BIGINT millisecond times, TEXT JSON).
//! Each backend has its own migrations folder. Every change to what agents receive goes
//! through [`Store::mutate`] (a new service through [`Store::create_service`]), which bumps
//! the per-service revision counter row inside the same transaction as the change, stores
//! the full snapshot with its hash and appends the audit row — so history, diff and
//! rollback are exact and no update is ever lost.
//!
//! The store knows nothing of who may do what or of HTTP: its errors are storage outcomes
//! (not found, conflict, invalid, the caller's own refusal, database failure).

mod mutate;
mod rows;

pub use mutate::{AuditCtx, AuditDiff, Change, Committed, MutateError, Parts};
pub use rows::*;

use std::str::FromStr;
use std::time::Duration;

use anyhow::Context;
use sqlx::any::{AnyConnectOptions, AnyPoolOptions};
use sqlx::migrate::Migrator;
use sqlx::{AnyPool, Executor, Row};

static SQLITE_MIGRATIONS: Migrator = sqlx::migrate!("../migrations/sqlite");
static POSTGRES_MIGRATIONS: Migrator = sqlx::migrate!("../migrations/postgres");

/// Which database the store talks to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    /// Embedded SQLite file: a single replica.
    Sqlite,
    /// PostgreSQL: several replicas fan out through LISTEN/NOTIFY.
    Postgres,
}

/// Channel used for cross-replica change notifications.
pub const NOTIFY_CHANNEL: &str = "levee_changes";

/// How long an agent whose stream closed stays in the fleet list (UI and API) after it was
/// last seen; a reconnect under the same instance id brings it back.
pub const DISCONNECTED_AGENTS_KEPT_FOR: std::time::Duration = std::time::Duration::from_secs(3600);

/// The store. Cheap to clone.
#[derive(Clone, Debug)]
pub struct Store {
    pool: AnyPool,
    backend: Backend,
    /// SQLite has one writer; serializing writes here avoids SQLITE_BUSY upgrades.
    write_lock: std::sync::Arc<tokio::sync::Mutex<()>>,
}

/// Current time in milliseconds since the Unix epoch.
pub fn now_ms() -> i64 {
    levee_agent::policy::Timestamp::now().unix_ms()
}

impl Store {
    /// Connects to `url` (`sqlite://path?mode=rwc` or `postgres://…`) and applies migrations.
    ///
    /// SQLite runs in WAL mode with `synchronous=FULL`, foreign keys on and a busy timeout,
    /// so acknowledged writes survive `kill -9`.
    pub async fn connect(url: &str) -> anyhow::Result<Store> {
        sqlx::any::install_default_drivers();
        let backend = if url.starts_with("sqlite:") {
            Backend::Sqlite
        } else if url.starts_with("postgres:") || url.starts_with("postgresql:") {
            Backend::Postgres
        } else {
            anyhow::bail!("unsupported database URL {url:?}: expected sqlite:… or postgres://…");
        };
        let opts = AnyConnectOptions::from_str(url).context("parsing the database URL")?;
        let mut pool_opts = AnyPoolOptions::new().acquire_timeout(Duration::from_secs(10));
        pool_opts = match backend {
            Backend::Sqlite => pool_opts.max_connections(8).after_connect(|conn, _| {
                Box::pin(async move {
                    conn.execute("PRAGMA journal_mode = WAL").await?;
                    conn.execute("PRAGMA synchronous = FULL").await?;
                    conn.execute("PRAGMA foreign_keys = ON").await?;
                    conn.execute("PRAGMA busy_timeout = 10000").await?;
                    Ok(())
                })
            }),
            Backend::Postgres => pool_opts.max_connections(16),
        };
        let pool =
            pool_opts.connect_with(opts).await.with_context(|| format!("connecting to {}", redact(url)))?;
        let store = Store { pool, backend, write_lock: Default::default() };
        store.migrate().await?;
        Ok(store)
    }

    /// Applies pending migrations of this backend.
    pub async fn migrate(&self) -> anyhow::Result<()> {
        let m = match self.backend {
            Backend::Sqlite => &SQLITE_MIGRATIONS,
            Backend::Postgres => &POSTGRES_MIGRATIONS,
        };
        m.run(&self.pool).await.context("running database migrations")?;
        Ok(())
    }

    /// The backend in use.
    pub fn backend(&self) -> Backend {
        self.backend
    }

    /// The pool (for tests and the PostgreSQL listener).
    pub fn pool(&self) -> &AnyPool {
        &self.pool
    }

    /// Closes every connection of the pool (waiting for those in use).
    pub async fn close(&self) {
        self.pool.close().await;
    }

    /// Whether the database answers (used by `/readyz`).
    pub async fn ping(&self) -> bool {
        sqlx::query("SELECT 1").execute(&self.pool).await.is_ok()
    }

    pub(crate) async fn write_guard(&self) -> Option<tokio::sync::MutexGuard<'_, ()>> {
        match self.backend {
            Backend::Sqlite => Some(self.write_lock.lock().await),
            Backend::Postgres => None,
        }
    }

    // ---- settings ---------------------------------------------------------------------

    /// Returns the setting `key`, storing `init()` first if it is absent (race-free).
    pub async fn setting_or_init(&self, key: &str, init: impl FnOnce() -> String) -> anyhow::Result<String> {
        let _g = self.write_guard().await;
        let v = init();
        sqlx::query("INSERT INTO settings (key, value) VALUES ($1, $2) ON CONFLICT (key) DO NOTHING")
            .bind(key)
            .bind(v)
            .execute(&self.pool)
            .await?;
        let row =
            sqlx::query("SELECT value FROM settings WHERE key = $1").bind(key).fetch_one(&self.pool).await?;
        Ok(row.try_get("value")?)
    }

    // ---- users -------------------------------------------------------------------------

    /// Creates a user, with its audit row in the same transaction when one is given.
    /// Returns `false` when the username is taken (nothing is written).
    pub async fn create_user(
        &self,
        username: &str,
        password_hash: &str,
        role: Role,
        audit: Option<&AuditRow>,
    ) -> anyhow::Result<bool> {
        let _g = self.write_guard().await;
        let mut tx = self.pool.begin().await?;
        let res = sqlx::query(
            "INSERT INTO users (username, password_hash, role, disabled, created_at) VALUES ($1, $2, $3, $4, $5) \
             ON CONFLICT (username) DO NOTHING",
        )
        .bind(username)
        .bind(password_hash)
        .bind(role.as_str())
        .bind(0i64)
        .bind(now_ms())
        .execute(&mut *tx)
        .await?;
        if res.rows_affected() != 1 {
            return Ok(false);
        }
        if let Some(audit) = audit {
            mutate::insert_audit(&mut tx, audit).await?;
        }
        tx.commit().await?;
        Ok(true)
    }

    /// Replaces a user's password hash and role. Returns `false` when there is no such user.
    pub async fn update_user(
        &self,
        username: &str,
        password_hash: Option<&str>,
        role: Option<Role>,
    ) -> anyhow::Result<bool> {
        let _g = self.write_guard().await;
        let mut affected = 0;
        if let Some(h) = password_hash {
            affected += sqlx::query("UPDATE users SET password_hash = $1 WHERE username = $2")
                .bind(h)
                .bind(username)
                .execute(&self.pool)
                .await?
                .rows_affected();
        }
        if let Some(r) = role {
            affected += sqlx::query("UPDATE users SET role = $1 WHERE username = $2")
                .bind(r.as_str())
                .bind(username)
                .execute(&self.pool)
                .await?
                .rows_affected();
        }
        Ok(affected > 0)
    }

    /// Looks a user up by name.
    pub async fn user(&self, username: &str) -> anyhow::Result<Option<UserRow>> {
        let row = sqlx::query(
            "SELECT id, username, password_hash, role, disabled, created_at FROM users WHERE username = $1",
        )
        .bind(username)
        .fetch_optional(&self.pool)
        .await?;
        row.map(|r| UserRow::from_row(&r)).transpose()
    }

    /// Lists users by name.
    pub async fn users(&self) -> anyhow::Result<Vec<UserRow>> {
        let rows = sqlx::query(
            "SELECT id, username, password_hash, role, disabled, created_at FROM users ORDER BY username",
        )
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(UserRow::from_row).collect()
    }

    // ---- tokens ------------------------------------------------------------------------

    /// Records a minted token and its audit row, in one transaction.
    pub async fn insert_token(&self, t: &TokenRow, audit: &AuditRow) -> anyhow::Result<()> {
        let _g = self.write_guard().await;
        let mut tx = self.pool.begin().await?;
        sqlx::query(
            "INSERT INTO tokens (id, kind, name, role, environment, services, created_by, created_at, expires_at, revoked_at) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)",
        )
        .bind(&t.id)
        .bind(t.kind.as_str())
        .bind(&t.name)
        .bind(t.role.map(|r| r.as_str().to_string()))
        .bind(t.environment.clone())
        .bind(serde_json::to_string(&t.services)?)
        .bind(&t.created_by)
        .bind(t.created_at)
        .bind(t.expires_at)
        .bind(t.revoked_at)
        .execute(&mut *tx)
        .await?;
        mutate::insert_audit(&mut tx, audit).await?;
        tx.commit().await?;
        Ok(())
    }

    /// Looks a token up by id (`jti`).
    pub async fn token(&self, id: &str) -> anyhow::Result<Option<TokenRow>> {
        let row = sqlx::query(
            "SELECT id, kind, name, role, environment, services, created_by, created_at, expires_at, revoked_at \
             FROM tokens WHERE id = $1",
        )
        .bind(id).fetch_optional(&self.pool).await?;
        row.map(|r| TokenRow::from_row(&r)).transpose()
    }

    /// Ends a session token before its expiry (`expires_at`, ms since the epoch); purges
    /// rows of sessions that have expired anyway.
    pub async fn revoke_session(&self, jti: &str, expires_at: i64) -> anyhow::Result<()> {
        let _g = self.write_guard().await;
        let mut tx = self.pool.begin().await?;
        sqlx::query("DELETE FROM revoked_sessions WHERE expires_at < $1")
            .bind(now_ms())
            .execute(&mut *tx)
            .await?;
        sqlx::query(
            "INSERT INTO revoked_sessions (jti, expires_at) VALUES ($1, $2) ON CONFLICT (jti) DO NOTHING",
        )
        .bind(jti)
        .bind(expires_at)
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(())
    }

    /// Whether a session token was ended by logging out.
    pub async fn session_revoked(&self, jti: &str) -> anyhow::Result<bool> {
        let row = sqlx::query("SELECT 1 AS one FROM revoked_sessions WHERE jti = $1")
            .bind(jti)
            .fetch_optional(&self.pool)
            .await?;
        Ok(row.is_some())
    }

    /// Lists tokens, newest first.
    pub async fn tokens(&self) -> anyhow::Result<Vec<TokenRow>> {
        let rows = sqlx::query(
            "SELECT id, kind, name, role, environment, services, created_by, created_at, expires_at, revoked_at \
             FROM tokens ORDER BY created_at DESC",
        )
        .fetch_all(&self.pool).await?;
        rows.iter().map(TokenRow::from_row).collect()
    }

    /// Revokes a token (a revoked one keeps its first revocation time) and appends its audit
    /// row, in one transaction. Returns `false` when there is no such token (nothing is
    /// written).
    pub async fn revoke_token(&self, id: &str, audit: &AuditRow) -> anyhow::Result<bool> {
        let _g = self.write_guard().await;
        let mut tx = self.pool.begin().await?;
        let res = sqlx::query("UPDATE tokens SET revoked_at = $1 WHERE id = $2 AND revoked_at IS NULL")
            .bind(now_ms())
            .bind(id)
            .execute(&mut *tx)
            .await?;
        if res.rows_affected() == 0
            && sqlx::query("SELECT 1 AS one FROM tokens WHERE id = $1")
                .bind(id)
                .fetch_optional(&mut *tx)
                .await?
                .is_none()
        {
            return Ok(false);
        }
        mutate::insert_audit(&mut tx, audit).await?;
        tx.commit().await?;
        Ok(true)
    }

    // ---- environments and services ----------------------------------------------------

    /// Creates an environment and appends its audit row, in one transaction. Returns `None`
    /// when one of that name exists (nothing is written).
    pub async fn create_environment(
        &self,
        name: &str,
        description: &str,
        allow_faults: bool,
        audit: &AuditRow,
    ) -> anyhow::Result<Option<EnvironmentRow>> {
        let _g = self.write_guard().await;
        let mut tx = self.pool.begin().await?;
        let created_at = now_ms();
        let res = sqlx::query(
            "INSERT INTO environments (name, description, allow_faults, created_at) VALUES ($1, $2, $3, $4) \
             ON CONFLICT (name) DO NOTHING",
        )
        .bind(name)
        .bind(description)
        .bind(i64::from(allow_faults))
        .bind(created_at)
        .execute(&mut *tx)
        .await?;
        if res.rows_affected() != 1 {
            return Ok(None);
        }
        mutate::insert_audit(&mut tx, audit).await?;
        tx.commit().await?;
        Ok(Some(EnvironmentRow {
            name: name.to_string(),
            description: description.to_string(),
            allow_faults,
            created_at,
        }))
    }

    /// Lists environments by name.
    pub async fn environments(&self) -> anyhow::Result<Vec<EnvironmentRow>> {
        let rows =
            sqlx::query("SELECT name, description, allow_faults, created_at FROM environments ORDER BY name")
                .fetch_all(&self.pool)
                .await?;
        rows.iter().map(EnvironmentRow::from_row).collect()
    }

    /// The environment `name`, if it exists.
    pub async fn environment(&self, name: &str) -> anyhow::Result<Option<EnvironmentRow>> {
        let row = sqlx::query(
            "SELECT name, description, allow_faults, created_at FROM environments WHERE name = $1",
        )
        .bind(name)
        .fetch_optional(&self.pool)
        .await?;
        row.map(|r| EnvironmentRow::from_row(&r)).transpose()
    }

    /// Lists the services of an environment by name.
    pub async fn services(&self, env: &str) -> anyhow::Result<Vec<ServiceRow>> {
        let rows = sqlx::query(
            "SELECT environment, name, description, revision, policy, created_at, updated_at FROM services \
             WHERE environment = $1 AND deleted_at IS NULL ORDER BY name",
        )
        .bind(env)
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(ServiceRow::from_row).collect()
    }

    /// Service `name` of `env` with its current revision, if it exists.
    pub async fn service(&self, env: &str, name: &str) -> anyhow::Result<Option<ServiceRow>> {
        let row = sqlx::query(
            "SELECT environment, name, description, revision, policy, created_at, updated_at FROM services \
             WHERE environment = $1 AND name = $2 AND deleted_at IS NULL",
        )
        .bind(env)
        .bind(name)
        .fetch_optional(&self.pool)
        .await?;
        row.map(|r| ServiceRow::from_row(&r)).transpose()
    }

    /// Flags of a service by key.
    pub async fn flags(&self, env: &str, service: &str) -> anyhow::Result<Vec<(String, String)>> {
        let rows =
            sqlx::query("SELECT key, body FROM flags WHERE environment = $1 AND service = $2 ORDER BY key")
                .bind(env)
                .bind(service)
                .fetch_all(&self.pool)
                .await?;
        rows.iter().map(|r| Ok((r.try_get("key")?, r.try_get("body")?))).collect()
    }

    // ---- revisions -----------------------------------------------------------------------

    /// Revision history of a service, newest first, at most `limit`.
    pub async fn revisions(&self, env: &str, service: &str, limit: i64) -> anyhow::Result<Vec<RevisionMeta>> {
        let rows = sqlx::query(
            "SELECT revision, hash, created_at, actor, reason FROM revisions \
             WHERE environment = $1 AND service = $2 ORDER BY revision DESC LIMIT $3",
        )
        .bind(env)
        .bind(service)
        .bind(limit)
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(RevisionMeta::from_row).collect()
    }

    /// Revision `revision` of a service, if it was stored.
    pub async fn revision(
        &self,
        env: &str,
        service: &str,
        revision: u64,
    ) -> anyhow::Result<Option<SnapshotRow>> {
        let row = sqlx::query(
            "SELECT environment, service, revision, hash, body, created_at FROM revisions \
             WHERE environment = $1 AND service = $2 AND revision = $3",
        )
        .bind(env)
        .bind(service)
        .bind(revision as i64)
        .fetch_optional(&self.pool)
        .await?;
        row.map(|r| SnapshotRow::from_row(&r)).transpose()
    }

    /// The newest stored snapshot of a service.
    pub async fn latest_snapshot(&self, env: &str, service: &str) -> anyhow::Result<Option<SnapshotRow>> {
        let row = sqlx::query(
            "SELECT environment, service, revision, hash, body, created_at FROM revisions \
             WHERE environment = $1 AND service = $2 ORDER BY revision DESC LIMIT 1",
        )
        .bind(env)
        .bind(service)
        .fetch_optional(&self.pool)
        .await?;
        row.map(|r| SnapshotRow::from_row(&r)).transpose()
    }

    /// Snapshots created after `after_ms` or newer than the given revisions: the catch-up
    /// query of the PostgreSQL listener. Returns (environment, service, revision) of every
    /// service's current revision.
    pub async fn current_revisions(&self) -> anyhow::Result<Vec<(String, String, u64)>> {
        let rows =
            sqlx::query("SELECT environment, name, revision FROM services").fetch_all(&self.pool).await?;
        rows.iter()
            .map(|r| {
                let rev: i64 = r.try_get("revision")?;
                Ok((r.try_get("environment")?, r.try_get("name")?, rev as u64))
            })
            .collect()
    }

    // ---- audit -------------------------------------------------------------------------

    /// Appends an audit row outside of a mutation (e.g. a refused attempt).
    pub async fn append_audit(&self, row: &AuditRow) -> anyhow::Result<()> {
        let _g = self.write_guard().await;
        let mut conn = self.pool.acquire().await?;
        mutate::insert_audit(&mut conn, row).await
    }

    /// Audit rows matching the filter, newest first.
    pub async fn audit(&self, f: &AuditFilter) -> anyhow::Result<Vec<AuditRow>> {
        // Every filter is optional; `$n IS NULL OR col = $n` keeps one static statement.
        let rows = sqlx::query(
            "SELECT id, at, actor, via, request_id, action, environment, service, target, outcome, reason, \
             before, after, revision FROM audit \
             WHERE ($1 IS NULL OR environment = $1) AND ($2 IS NULL OR service = $2) \
             AND ($3 IS NULL OR actor = $3) AND ($4 IS NULL OR at >= $4) AND ($5 IS NULL OR at <= $5) \
             AND ($6 IS NULL OR id < $6) \
             ORDER BY id DESC LIMIT $7",
        )
        .bind(f.environment.clone())
        .bind(f.service.clone())
        .bind(f.actor.clone())
        .bind(f.since)
        .bind(f.until)
        .bind(f.before_id)
        .bind(f.limit)
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(AuditRow::from_row).collect()
    }

    // ---- fleet -------------------------------------------------------------------------

    /// Writes a batch of agent state changes in one transaction.
    pub async fn write_fleet(&self, batch: &[FleetEvent]) -> anyhow::Result<()> {
        if batch.is_empty() {
            return Ok(());
        }
        let _g = self.write_guard().await;
        let mut tx = self.pool.begin().await?;
        for ev in batch {
            match ev {
                FleetEvent::Upsert(a) => {
                    sqlx::query(
                        "INSERT INTO agents (environment, service, instance_id, agent_version, connected, connected_at, \
                         last_seen, applied_revision, applied_hash, status) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10) \
                         ON CONFLICT (environment, service, instance_id) DO UPDATE SET agent_version = excluded.agent_version, \
                         connected = excluded.connected, connected_at = excluded.connected_at, last_seen = excluded.last_seen, \
                         applied_revision = excluded.applied_revision, applied_hash = excluded.applied_hash, \
                         status = COALESCE(excluded.status, agents.status)",
                    )
                    .bind(&a.environment)
                    .bind(&a.service)
                    .bind(&a.instance_id)
                    .bind(&a.agent_version)
                    .bind(i64::from(a.connected))
                    .bind(a.connected_at)
                    .bind(a.last_seen)
                    .bind(a.applied_revision as i64)
                    .bind(&a.applied_hash)
                    .bind(a.status.clone())
                    .execute(&mut *tx)
                    .await?;
                }
                FleetEvent::Ack(a) => {
                    sqlx::query(
                        "INSERT INTO acks (environment, service, revision, instance_id, acked_at) \
                         VALUES ($1, $2, $3, $4, $5) ON CONFLICT (environment, service, revision, instance_id) \
                         DO NOTHING",
                    )
                    .bind(&a.environment)
                    .bind(&a.service)
                    .bind(a.revision as i64)
                    .bind(&a.instance_id)
                    .bind(a.acked_at)
                    .execute(&mut *tx)
                    .await?;
                }
                FleetEvent::Nack(n) => {
                    sqlx::query(
                        "INSERT INTO nacks (environment, service, instance_id, revision, error_detail, at) \
                         VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT (environment, service, instance_id, revision) \
                         DO UPDATE SET error_detail = excluded.error_detail, at = excluded.at",
                    )
                    .bind(&n.environment)
                    .bind(&n.service)
                    .bind(&n.instance_id)
                    .bind(n.revision as i64)
                    .bind(&n.error_detail)
                    .bind(n.at)
                    .execute(&mut *tx)
                    .await?;
                }
            }
        }
        tx.commit().await?;
        Ok(())
    }

    /// Marks every agent of this server as disconnected (at start-up, for SQLite's single
    /// replica, whose previous process cannot have live streams).
    pub async fn mark_all_disconnected(&self) -> anyhow::Result<()> {
        let _g = self.write_guard().await;
        sqlx::query("UPDATE agents SET connected = $1").bind(0i64).execute(&self.pool).await?;
        Ok(())
    }

    /// Agents of a service, most recently seen first: the connected ones and those
    /// disconnected for less than [`DISCONNECTED_AGENTS_KEPT_FOR`].
    pub async fn agents(&self, env: &str, service: &str) -> anyhow::Result<Vec<AgentRow>> {
        let shown_since = now_ms() - DISCONNECTED_AGENTS_KEPT_FOR.as_millis() as i64;
        let rows = sqlx::query(
            "SELECT environment, service, instance_id, agent_version, connected, connected_at, last_seen, \
             applied_revision, applied_hash, status FROM agents WHERE environment = $1 AND service = $2 \
             AND (connected <> 0 OR last_seen >= $3) ORDER BY last_seen DESC LIMIT 1000",
        )
        .bind(env)
        .bind(service)
        .bind(shown_since)
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(AgentRow::from_row).collect()
    }

    /// How far revision `revision` of a service has reached ([`Propagation`]), or `None`
    /// when it was never stored.
    pub async fn propagation(
        &self,
        env: &str,
        service: &str,
        revision: u64,
    ) -> anyhow::Result<Option<Propagation>> {
        let Some(rev) = self.revision(env, service, revision).await? else { return Ok(None) };
        let rows = sqlx::query(
            "SELECT instance_id, acked_at FROM acks WHERE environment = $1 AND service = $2 AND revision = $3 \
             ORDER BY acked_at LIMIT 10000",
        )
        .bind(env)
        .bind(service)
        .bind(revision as i64)
        .fetch_all(&self.pool)
        .await?;
        let mut acks = Vec::with_capacity(rows.len());
        for r in &rows {
            let acked_at: i64 = r.try_get("acked_at")?;
            acks.push(AgentAck {
                instance_id: r.try_get("instance_id")?,
                acked_at,
                latency_ms: (acked_at - rev.created_at).max(0),
            });
        }
        let mut lat: Vec<i64> = acks.iter().map(|a| a.latency_ms).collect();
        lat.sort_unstable();
        let agents = self.agents(env, service).await?;
        let live = agents.iter().filter(|a| a.connected);
        Ok(Some(Propagation {
            environment: env.to_string(),
            service: service.to_string(),
            revision,
            committed_at: rev.created_at,
            applied: live.clone().filter(|a| a.applied_revision >= revision).count(),
            connected: live.count(),
            acked: acks.len(),
            p50_ms: percentile(&lat, 50.0),
            p99_ms: percentile(&lat, 99.0),
            max_ms: lat.last().copied(),
            acks,
        }))
    }

    /// NACKs of a service, newest first.
    pub async fn nacks(&self, env: &str, service: &str) -> anyhow::Result<Vec<NackRow>> {
        let rows = sqlx::query(
            "SELECT environment, service, instance_id, revision, error_detail, at FROM nacks \
             WHERE environment = $1 AND service = $2 ORDER BY at DESC LIMIT 1000",
        )
        .bind(env)
        .bind(service)
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(NackRow::from_row).collect()
    }

    /// Revisions newer than `above` that this agent instance NACKed (read once when its
    /// stream opens, so a reconnecting agent is not sent them again).
    pub async fn nacked_revisions(
        &self,
        env: &str,
        service: &str,
        instance: &str,
        above: u64,
    ) -> anyhow::Result<Vec<u64>> {
        let rows = sqlx::query(
            "SELECT revision FROM nacks WHERE environment = $1 AND service = $2 AND instance_id = $3 \
             AND revision > $4",
        )
        .bind(env)
        .bind(service)
        .bind(instance)
        .bind(above as i64)
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(|r| Ok(r.try_get::<i64, _>("revision")? as u64)).collect()
    }

    /// Expired flags, fault rules and breaker overrides as (environment, service) pairs.
    pub async fn services_with_expired(&self, now: i64) -> anyhow::Result<Vec<(String, String)>> {
        let rows = sqlx::query(
            "SELECT environment, service FROM faults WHERE expires_at <= $1 \
             UNION SELECT environment, service FROM breaker_overrides WHERE expires_at IS NOT NULL AND expires_at <= $1 \
             UNION SELECT environment, service FROM flags WHERE expires_at IS NOT NULL AND expires_at <= $1",
        )
        .bind(now)
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(|r| Ok((r.try_get("environment")?, r.try_get("service")?))).collect()
    }
}

/// Hides the password of a database URL for logs.
pub fn redact(url: &str) -> String {
    match (url.find("://"), url.find('@')) {
        (Some(s), Some(at)) if at > s => {
            let creds = &url[s + 3..at];
            match creds.find(':') {
                Some(c) => format!("{}{}:***{}", &url[..s + 3], &creds[..c], &url[at..]),
                None => url.to_string(),
            }
        }
        _ => url.to_string(),
    }
}

//! Environments and their services as stored: the flags, the revisions and their snapshots,
//! and what expires on its own (temporary flags, fault rules, overrides, levers).

use sqlx::{AnyConnection, Row};

use super::{
    AuditRow, EnvironmentRow, Reader, RevisionMeta, ServiceRow, SnapshotRow, Store, audit, now_ms, timed,
};

impl Reader {
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
        let mut conn = self.pool.acquire().await?;
        revision_in(&mut conn, env, service, revision).await
    }

    /// The newest stored snapshot of a service.
    pub async fn latest_snapshot(&self, env: &str, service: &str) -> anyhow::Result<Option<SnapshotRow>> {
        let _t = timed("latest_snapshot");
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

    /// The flags of `service` whose value is temporary and that go back to an earlier flag
    /// at their expiry: (key, the flag in force as JSON, the flag it goes back to as JSON),
    /// by key, read in one statement.
    pub async fn temporary_flags(
        &self,
        env: &str,
        service: &str,
    ) -> anyhow::Result<Vec<(String, String, String)>> {
        let rows = sqlx::query(
            "SELECT r.key AS key, f.body AS flag, r.body AS restores FROM flag_restores r \
             JOIN flags f ON f.environment = r.environment AND f.service = r.service AND f.key = r.key \
             WHERE r.environment = $1 AND r.service = $2 ORDER BY r.key",
        )
        .bind(env)
        .bind(service)
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(|r| Ok((r.try_get("key")?, r.try_get("flag")?, r.try_get("restores")?))).collect()
    }

    /// Expired flags, fault rules, breaker overrides and levers as (environment, service) pairs.
    pub async fn services_with_expired(&self, now: i64) -> anyhow::Result<Vec<(String, String)>> {
        let rows = sqlx::query(
            "SELECT environment, service FROM faults WHERE expires_at <= $1 \
             UNION SELECT environment, service FROM breaker_overrides WHERE expires_at IS NOT NULL AND expires_at <= $1 \
             UNION SELECT environment, service FROM flags WHERE expires_at IS NOT NULL AND expires_at <= $1 \
             UNION SELECT environment, service FROM levers WHERE expires_at <= $1",
        )
        .bind(now)
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(|r| Ok((r.try_get("environment")?, r.try_get("service")?))).collect()
    }
}

impl Store {
    /// Stores a setting of environment `env` as JSON with `audit` in one transaction:
    /// `upsert` writes ($1 environment, $2 the JSON, $3 when, $4 by whom) into the
    /// setting's table.
    pub(super) async fn set_environment_setting(
        &self,
        upsert: &'static str,
        env: &str,
        json: String,
        audit: &AuditRow,
    ) -> anyhow::Result<()> {
        let _g = self.write_guard().await;
        let mut tx = self.pool.begin().await?;
        sqlx::query(upsert).bind(env).bind(json).bind(now_ms()).bind(&audit.actor).execute(&mut *tx).await?;
        audit::insert_audit(&mut tx, audit).await?;
        tx.commit().await?;
        Ok(())
    }

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
        audit::insert_audit(&mut tx, audit).await?;
        tx.commit().await?;
        Ok(Some(EnvironmentRow {
            name: name.to_string(),
            description: description.to_string(),
            allow_faults,
            created_at,
        }))
    }
}

/// Revision `revision` of a service, if it was stored, read on `conn` (a transaction reads
/// the revisions it is writing).
pub(super) async fn revision_in(
    conn: &mut AnyConnection,
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
    .fetch_optional(conn)
    .await?;
    row.map(|r| SnapshotRow::from_row(&r)).transpose()
}

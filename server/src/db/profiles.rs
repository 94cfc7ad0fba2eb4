//! Emergency profiles (versioned definitions per environment) and their activations.

use sqlx::Row;
use sqlx::any::AnyRow;

use super::{AuditRow, Reader, Store, audit, now_ms};

/// The current version of a profile; `body` is its JSON definition.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProfileRow {
    pub environment: String,
    pub name: String,
    /// 1 for the first version, bumped by every change.
    pub version: u64,
    /// JSON of the definition.
    pub body: String,
    /// ms since the epoch.
    pub updated_at: i64,
    pub updated_by: String,
}

impl ProfileRow {
    fn from_row(r: &AnyRow) -> anyhow::Result<Self> {
        Ok(ProfileRow {
            environment: r.try_get("environment")?,
            name: r.try_get("name")?,
            version: r.try_get::<i64, _>("version")? as u64,
            body: r.try_get("body")?,
            updated_at: r.try_get("updated_at")?,
            updated_by: r.try_get("updated_by")?,
        })
    }
}

/// One application of a profile to an environment.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ActivationRow {
    /// Assigned by the database.
    pub id: i64,
    pub environment: String,
    pub profile: String,
    /// The profile version applied.
    pub version: u64,
    /// ms since the epoch.
    pub applied_at: i64,
    pub applied_by: String,
    pub reason: String,
    /// ms since the epoch: the profile reverts by itself then.
    pub expires_at: i64,
    /// JSON of what each entry set replaced, per service (the actions' `ProfileSet`).
    pub saved: String,
    /// Set once reverted (by hand or at expiry); `None` while active.
    pub reverted_at: Option<i64>,
    pub reverted_by: Option<String>,
    pub revert_reason: Option<String>,
}

macro_rules! activation_columns {
    () => {
        "id, environment, profile, version, applied_at, applied_by, reason, expires_at, \
     saved, reverted_at, reverted_by, revert_reason"
    };
}

impl ActivationRow {
    fn from_row(r: &AnyRow) -> anyhow::Result<Self> {
        Ok(ActivationRow {
            id: r.try_get("id")?,
            environment: r.try_get("environment")?,
            profile: r.try_get("profile")?,
            version: r.try_get::<i64, _>("version")? as u64,
            applied_at: r.try_get("applied_at")?,
            applied_by: r.try_get("applied_by")?,
            reason: r.try_get("reason")?,
            expires_at: r.try_get("expires_at")?,
            saved: r.try_get("saved")?,
            reverted_at: r.try_get("reverted_at")?,
            reverted_by: r.try_get("reverted_by")?,
            revert_reason: r.try_get("revert_reason")?,
        })
    }
}

/// A profile write refused because the profile is not at the version the caller read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct VersionMoved {
    /// The version stored now; 0 when there is no such profile.
    pub current: u64,
}

impl Reader {
    /// Profiles of an environment, by name.
    pub async fn profiles(&self, env: &str) -> anyhow::Result<Vec<ProfileRow>> {
        let rows = sqlx::query(
            "SELECT environment, name, version, body, updated_at, updated_by FROM profiles \
             WHERE environment = $1 ORDER BY name",
        )
        .bind(env)
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(ProfileRow::from_row).collect()
    }

    /// Profile `name` of `env`, if it exists.
    pub async fn profile(&self, env: &str, name: &str) -> anyhow::Result<Option<ProfileRow>> {
        let row = sqlx::query(
            "SELECT environment, name, version, body, updated_at, updated_by FROM profiles \
             WHERE environment = $1 AND name = $2",
        )
        .bind(env)
        .bind(name)
        .fetch_optional(&self.pool)
        .await?;
        row.map(|r| ProfileRow::from_row(&r)).transpose()
    }

    /// Version `version` of a profile, as it was stored (the current one included).
    pub async fn profile_version(
        &self,
        env: &str,
        name: &str,
        version: u64,
    ) -> anyhow::Result<Option<String>> {
        let row = sqlx::query(
            "SELECT body FROM profile_versions WHERE environment = $1 AND name = $2 AND version = $3",
        )
        .bind(env)
        .bind(name)
        .bind(version as i64)
        .fetch_optional(&self.pool)
        .await?;
        Ok(row.map(|r| r.try_get("body")).transpose()?)
    }

    /// The profile active in `env` now (applied and not reverted), if any.
    pub async fn active_profile(&self, env: &str) -> anyhow::Result<Option<ActivationRow>> {
        let row = sqlx::query(concat!(
            "SELECT ",
            activation_columns!(),
            " FROM profile_activations WHERE environment = $1 AND reverted_at IS NULL"
        ))
        .bind(env)
        .fetch_optional(&self.pool)
        .await?;
        row.map(|r| ActivationRow::from_row(&r)).transpose()
    }

    /// Applications of profiles in `env`, newest first, at most `limit`.
    pub async fn activations(&self, env: &str, limit: i64) -> anyhow::Result<Vec<ActivationRow>> {
        let rows = sqlx::query(concat!(
            "SELECT ",
            activation_columns!(),
            " FROM profile_activations WHERE environment = $1 ORDER BY id DESC LIMIT $2"
        ))
        .bind(env)
        .bind(limit)
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(ActivationRow::from_row).collect()
    }

    /// Active profiles whose expiry is at or before `now`.
    pub async fn expired_activations(&self, now: i64) -> anyhow::Result<Vec<ActivationRow>> {
        let rows = sqlx::query(concat!(
            "SELECT ",
            activation_columns!(),
            " FROM profile_activations WHERE reverted_at IS NULL AND expires_at <= $1 \
             ORDER BY id"
        ))
        .bind(now)
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(ActivationRow::from_row).collect()
    }
}

impl Store {
    /// Creates or replaces profile `name` of `env` with `body`, as the next version, keeping
    /// every version, with its audit row, in one transaction. `expected` is the version the
    /// caller read (0: the profile must not exist yet); `None` writes over any.
    pub async fn put_profile(
        &self,
        env: &str,
        name: &str,
        body: &str,
        expected: Option<u64>,
        audit: &AuditRow,
    ) -> anyhow::Result<Result<ProfileRow, VersionMoved>> {
        let _g = self.write_guard().await;
        let mut tx = self.pool.begin().await?;
        let now = now_ms();
        let current = sqlx::query("SELECT version FROM profiles WHERE environment = $1 AND name = $2")
            .bind(env)
            .bind(name)
            .fetch_optional(&mut *tx)
            .await?
            .map(|r| r.try_get::<i64, _>("version"))
            .transpose()?
            .map_or(0, |v| v as u64);
        if expected.is_some_and(|e| e != current) {
            return Ok(Err(VersionMoved { current }));
        }
        // Versions continue after a delete: the highest ever stored, plus one.
        let last = sqlx::query(
            "SELECT MAX(version) AS v FROM profile_versions WHERE environment = $1 AND name = $2",
        )
        .bind(env)
        .bind(name)
        .fetch_one(&mut *tx)
        .await?
        .try_get::<Option<i64>, _>("v")?
        .unwrap_or(0);
        let version = last + 1;
        let updated = if current == 0 {
            sqlx::query(
                "INSERT INTO profiles (environment, name, version, body, updated_at, updated_by) \
                 VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT DO NOTHING",
            )
            .bind(env)
            .bind(name)
            .bind(version)
            .bind(body)
            .bind(now)
            .bind(&audit.actor)
            .execute(&mut *tx)
            .await?
        } else {
            sqlx::query(
                "UPDATE profiles SET version = $1, body = $2, updated_at = $3, updated_by = $4 \
                 WHERE environment = $5 AND name = $6 AND version = $7",
            )
            .bind(version)
            .bind(body)
            .bind(now)
            .bind(&audit.actor)
            .bind(env)
            .bind(name)
            .bind(current as i64)
            .execute(&mut *tx)
            .await?
        };
        if updated.rows_affected() != 1 {
            // Another replica wrote it between our read and our write.
            return Ok(Err(VersionMoved { current: current + 1 }));
        }
        sqlx::query(
            "INSERT INTO profile_versions (environment, name, version, body, created_at, actor, reason) \
             VALUES ($1, $2, $3, $4, $5, $6, $7)",
        )
        .bind(env)
        .bind(name)
        .bind(version)
        .bind(body)
        .bind(now)
        .bind(&audit.actor)
        .bind(&audit.reason)
        .execute(&mut *tx)
        .await?;
        audit::insert_audit(&mut tx, audit).await?;
        tx.commit().await?;
        Ok(Ok(ProfileRow {
            environment: env.to_string(),
            name: name.to_string(),
            version: version as u64,
            body: body.to_string(),
            updated_at: now,
            updated_by: audit.actor.clone(),
        }))
    }

    /// Deletes profile `name` of `env` (its versions stay) with its audit row. `false` when
    /// there is no such profile (nothing is written).
    pub async fn delete_profile(&self, env: &str, name: &str, audit: &AuditRow) -> anyhow::Result<bool> {
        let _g = self.write_guard().await;
        let mut tx = self.pool.begin().await?;
        let res = sqlx::query("DELETE FROM profiles WHERE environment = $1 AND name = $2")
            .bind(env)
            .bind(name)
            .execute(&mut *tx)
            .await?;
        if res.rows_affected() == 0 {
            return Ok(false);
        }
        audit::insert_audit(&mut tx, audit).await?;
        tx.commit().await?;
        Ok(true)
    }

    /// Records that `row`'s profile is being applied (its `id` and `saved` are ignored):
    /// the environment's one active slot is taken here. `None` when another profile is
    /// active in the environment (nothing is written).
    pub async fn start_activation(&self, row: &ActivationRow) -> anyhow::Result<Option<i64>> {
        let _g = self.write_guard().await;
        let id = sqlx::query(
            "INSERT INTO profile_activations (environment, profile, version, applied_at, applied_by, reason, \
             expires_at, saved) VALUES ($1, $2, $3, $4, $5, $6, $7, $8) ON CONFLICT DO NOTHING RETURNING id",
        )
        .bind(&row.environment)
        .bind(&row.profile)
        .bind(row.version as i64)
        .bind(row.applied_at)
        .bind(&row.applied_by)
        .bind(&row.reason)
        .bind(row.expires_at)
        .bind("{}")
        .fetch_optional(&self.pool)
        .await?;
        Ok(id.map(|r| r.try_get::<i64, _>("id")).transpose()?)
    }

    /// Stores what the activation `id` replaced so far; with `audit`, in the same
    /// transaction (the audit row of a completed application).
    pub async fn save_activation(
        &self,
        id: i64,
        saved: &str,
        audit: Option<&AuditRow>,
    ) -> anyhow::Result<()> {
        let _g = self.write_guard().await;
        let mut tx = self.pool.begin().await?;
        sqlx::query("UPDATE profile_activations SET saved = $1 WHERE id = $2")
            .bind(saved)
            .bind(id)
            .execute(&mut *tx)
            .await?;
        if let Some(a) = audit {
            audit::insert_audit(&mut tx, a).await?;
        }
        tx.commit().await?;
        Ok(())
    }

    /// Claims the revert of activation `id`: marks it reverted by `by` for `reason` unless it
    /// already was (a conditional UPDATE, so with several replicas exactly one claims it),
    /// with `audit` in the same transaction. Returns the activation as it was when claimed;
    /// `None` when it was already reverted or does not exist.
    pub async fn claim_revert(
        &self,
        id: i64,
        by: &str,
        reason: &str,
        audit: Option<&AuditRow>,
    ) -> anyhow::Result<Option<ActivationRow>> {
        let _g = self.write_guard().await;
        let mut tx = self.pool.begin().await?;
        let res = sqlx::query(
            "UPDATE profile_activations SET reverted_at = $1, reverted_by = $2, revert_reason = $3 \
             WHERE id = $4 AND reverted_at IS NULL",
        )
        .bind(now_ms())
        .bind(by)
        .bind(reason)
        .bind(id)
        .execute(&mut *tx)
        .await?;
        if res.rows_affected() != 1 {
            return Ok(None);
        }
        let row =
            sqlx::query(concat!("SELECT ", activation_columns!(), " FROM profile_activations WHERE id = $1"))
                .bind(id)
                .fetch_one(&mut *tx)
                .await?;
        let row = ActivationRow::from_row(&row)?;
        if let Some(a) = audit {
            audit::insert_audit(&mut tx, a).await?;
        }
        tx.commit().await?;
        Ok(Some(row))
    }
}

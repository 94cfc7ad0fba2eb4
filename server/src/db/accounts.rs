//! People who sign in: users (password hash, role) and the sessions ended before their expiry.

use super::{AuditRow, Reader, Role, Store, UserRow, audit, now_ms, timed};

impl Reader {
    /// Looks a user up by name.
    pub async fn user(&self, username: &str) -> anyhow::Result<Option<UserRow>> {
        let _t = timed("user");
        let row = sqlx::query(
            "SELECT id, username, password_hash, role, disabled, created_at, session_epoch FROM users WHERE username = $1",
        )
        .bind(username)
        .fetch_optional(&self.pool)
        .await?;
        row.map(|r| UserRow::from_row(&r)).transpose()
    }

    /// Lists users by name.
    pub async fn users(&self) -> anyhow::Result<Vec<UserRow>> {
        let rows = sqlx::query(
            "SELECT id, username, password_hash, role, disabled, created_at, session_epoch FROM users ORDER BY username",
        )
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(UserRow::from_row).collect()
    }

    /// Whether a session token was ended by logging out.
    pub async fn session_revoked(&self, jti: &str) -> anyhow::Result<bool> {
        let row = sqlx::query("SELECT 1 AS one FROM revoked_sessions WHERE jti = $1")
            .bind(jti)
            .fetch_optional(&self.pool)
            .await?;
        Ok(row.is_some())
    }
}

impl Store {
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
            audit::insert_audit(&mut tx, audit).await?;
        }
        tx.commit().await?;
        Ok(true)
    }

    /// Replaces a user's password hash, role and/or disabled flag and bumps its session epoch (ending
    /// every session it had open), with its audit row in the same transaction when one is
    /// given. Returns `false` when there is no such user (nothing is written).
    pub async fn update_user(
        &self,
        username: &str,
        password_hash: Option<&str>,
        role: Option<Role>,
        disabled: Option<bool>,
        audit: Option<&AuditRow>,
    ) -> anyhow::Result<bool> {
        let _g = self.write_guard().await;
        let mut tx = self.pool.begin().await?;
        let res = sqlx::query(
            "UPDATE users SET password_hash = COALESCE($1, password_hash), role = COALESCE($2, role), \
             disabled = COALESCE($3, disabled), session_epoch = session_epoch + 1 WHERE username = $4",
        )
        .bind(password_hash)
        .bind(role.map(Role::as_str))
        .bind(disabled.map(i64::from))
        .bind(username)
        .execute(&mut *tx)
        .await?;
        if res.rows_affected() != 1 {
            return Ok(false);
        }
        if let Some(audit) = audit {
            audit::insert_audit(&mut tx, audit).await?;
        }
        tx.commit().await?;
        Ok(true)
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
}

//! API and agent tokens: minted, listed, revoked, rotated with an overlap (`TokenRow::revoked`
//! is the one rule of whether a token still works).

use sqlx::Row;

use super::{AuditRow, Reader, Store, TokenRow, audit, now_ms, timed};

/// Inserts a token row (minted or a rotation's new token).
async fn insert_token_row(conn: &mut sqlx::AnyConnection, t: &TokenRow) -> anyhow::Result<()> {
    sqlx::query(
        "INSERT INTO tokens (id, kind, name, role, environment, services, created_by, created_at, expires_at, revoked_at, \
         person) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)",
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
    .bind(t.person.clone())
    .execute(conn)
    .await?;
    Ok(())
}

/// A rotation asked of a token that no longer works (revoked, or expired): a new token of
/// its scope is minted, not rotated from it.
#[derive(Debug, thiserror::Error)]
#[error("token {id} ended at {}: mint a new token instead of rotating this one", levee_agent::policy::Timestamp::from_unix_ms(*at))]
pub struct TokenEnded {
    /// The token's id.
    pub id: String,
    /// When it stopped working (ms since the epoch).
    pub at: i64,
}

impl Reader {
    /// Looks a token up by id (`jti`).
    pub async fn token(&self, id: &str) -> anyhow::Result<Option<TokenRow>> {
        let _t = timed("token");
        let row = sqlx::query(
            "SELECT id, kind, name, role, environment, services, created_by, created_at, expires_at, revoked_at, \
             person FROM tokens WHERE id = $1",
        )
        .bind(id).fetch_optional(&self.pool).await?;
        row.map(|r| TokenRow::from_row(&r)).transpose()
    }

    /// Lists tokens, newest first.
    pub async fn tokens(&self) -> anyhow::Result<Vec<TokenRow>> {
        let rows = sqlx::query(
            "SELECT id, kind, name, role, environment, services, created_by, created_at, expires_at, revoked_at, \
             person FROM tokens ORDER BY created_at DESC",
        )
        .fetch_all(&self.pool).await?;
        rows.iter().map(TokenRow::from_row).collect()
    }

    /// Ids and revocation times (ms) of tokens revoked at or after `since` (ms) and by now:
    /// a revocation a rotation scheduled is listed once its time has come.
    pub async fn tokens_revoked_since(&self, since: i64) -> anyhow::Result<Vec<(String, i64)>> {
        let rows =
            sqlx::query("SELECT id, revoked_at FROM tokens WHERE revoked_at >= $1 AND revoked_at <= $2")
                .bind(since)
                .bind(now_ms())
                .fetch_all(&self.pool)
                .await?;
        rows.iter().map(|r| Ok((r.try_get("id")?, r.try_get("revoked_at")?))).collect()
    }
}

impl Store {
    /// Records a minted token and its audit row, in one transaction.
    pub async fn insert_token(&self, t: &TokenRow, audit: &AuditRow) -> anyhow::Result<()> {
        let _g = self.write_guard().await;
        let mut tx = self.pool.begin().await?;
        insert_token_row(&mut tx, t).await?;
        audit::insert_audit(&mut tx, audit).await?;
        tx.commit().await?;
        Ok(())
    }

    /// Revokes a token now (a revoked one keeps its first revocation time; one whose
    /// rotation's overlap is still running ends now) and appends its audit row, in one
    /// transaction. Returns `false` when there is no such token (nothing is written).
    pub async fn revoke_token(&self, id: &str, audit: &AuditRow) -> anyhow::Result<bool> {
        let _g = self.write_guard().await;
        let mut tx = self.pool.begin().await?;
        let now = now_ms();
        let res = sqlx::query(
            "UPDATE tokens SET revoked_at = $1 WHERE id = $2 AND (revoked_at IS NULL OR revoked_at > $1)",
        )
        .bind(now)
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
        audit::insert_audit(&mut tx, audit).await?;
        tx.commit().await?;
        Ok(true)
    }

    /// A rotation, in one transaction: token `old` (read again here, and refused when it is
    /// gone or already ended) is revoked at `ends_at` (ms; an earlier scheduled end is
    /// kept), `new` is recorded, then the audit row. Returns the old token as it is now, or
    /// `None` when there is no such token.
    ///
    /// # Errors
    /// [`TokenEnded`] (in the chain) when `old` is revoked or expired at `now`; storage.
    pub async fn rotate_token(
        &self,
        old: &str,
        ends_at: i64,
        new: &TokenRow,
        audit: &AuditRow,
    ) -> anyhow::Result<Option<TokenRow>> {
        let _g = self.write_guard().await;
        let mut tx = self.pool.begin().await?;
        let select = "SELECT id, kind, name, role, environment, services, created_by, created_at, \
                      expires_at, revoked_at, person FROM tokens WHERE id = $1";
        let Some(before) = sqlx::query(select).bind(old).fetch_optional(&mut *tx).await? else {
            return Ok(None);
        };
        let before = TokenRow::from_row(&before)?;
        let now = now_ms();
        if before.revoked(now) || before.expires_at <= now {
            return Err(TokenEnded { at: before.ends_at(), id: before.id }.into());
        }
        sqlx::query(
            "UPDATE tokens SET revoked_at = $1 WHERE id = $2 AND (revoked_at IS NULL OR revoked_at > $1)",
        )
        .bind(ends_at)
        .bind(old)
        .execute(&mut *tx)
        .await?;
        insert_token_row(&mut tx, new).await?;
        let after = sqlx::query(select).bind(old).fetch_one(&mut *tx).await?;
        let after = TokenRow::from_row(&after)?;
        audit::insert_audit(&mut tx, audit).await?;
        tx.commit().await?;
        Ok(Some(after))
    }
}

//! The audit log: appended in the transaction of the change it records, read with filters.

use super::{AuditFilter, AuditRow, Reader, Store, mutate, timed};

impl Reader {
    /// Audit rows matching the filter, newest first.
    pub async fn audit(&self, f: &AuditFilter) -> anyhow::Result<Vec<AuditRow>> {
        let _t = timed("audit_read");
        // Every filter is optional; `$n IS NULL OR col = $n` keeps one static statement.
        let rows = sqlx::query(
            "SELECT id, at, actor, via, request_id, action, environment, service, target, outcome, reason, \
             before, after, revision, detail FROM audit \
             WHERE ($1 IS NULL OR environment = $1) AND ($2 IS NULL OR service = $2) \
             AND ($3 IS NULL OR actor = $3) AND ($4 IS NULL OR at >= $4) AND ($5 IS NULL OR at <= $5) \
             AND ($6 IS NULL OR id < $6) \
             AND ($8 IS NULL OR action = $8 OR action LIKE $8 || '.%') AND ($9 IS NULL OR action NOT LIKE $9) \
             ORDER BY id DESC LIMIT $7",
        )
        .bind(f.environment.clone())
        .bind(f.service.clone())
        .bind(f.actor.clone())
        .bind(f.since)
        .bind(f.until)
        .bind(f.before_id)
        .bind(f.limit)
        .bind(f.action.clone())
        .bind(f.exclude_action.clone())
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(AuditRow::from_row).collect()
    }
}

impl Store {
    /// Appends an audit row outside of a mutation (e.g. a refused attempt).
    pub async fn append_audit(&self, row: &AuditRow) -> anyhow::Result<()> {
        let _g = self.write_guard().await;
        let mut conn = self.pool.acquire().await?;
        mutate::insert_audit(&mut conn, row).await
    }
}

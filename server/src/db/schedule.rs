//! Scheduled changes: stored jobs, claimed by one replica when due.

use sqlx::Row;
use sqlx::any::AnyRow;

use super::{AuditRow, Store, mutate, now_ms};

/// One scheduled change.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct ScheduledRow {
    /// Assigned by the database.
    pub id: i64,
    pub environment: String,
    /// The service of a flag or policy change; `None` for a profile.
    pub service: Option<String>,
    /// `flag`, `policy` or `profile`.
    pub kind: String,
    /// The flag key, `policy`, or the profile name.
    pub target: String,
    /// JSON of what is set: the flag value, the policy, or `{"expires_at": …}` of a profile.
    pub payload: String,
    /// JSON of the target as it was when the change was scheduled (flag, policy); a
    /// different value at run time is a conflict.
    pub expected: Option<String>,
    /// The service's revision when the change was scheduled.
    pub base_revision: Option<u64>,
    /// ms since the epoch.
    pub run_at: i64,
    /// When to put back what the change replaced (ms since the epoch), if ever.
    pub revert_at: Option<i64>,
    /// The change this one reverts.
    pub reverts: Option<i64>,
    /// `pending`, `running`, `applied`, `conflict`, `failed` or `cancelled`.
    pub state: String,
    pub created_by: String,
    /// The role of its author, which the change is applied with.
    pub created_role: String,
    pub created_at: i64,
    pub reason: String,
    /// Who ran it (the replica's actor name).
    pub claimed_by: Option<String>,
    pub finished_at: Option<i64>,
    /// What happened, in words (the conflict, the error).
    pub outcome: Option<String>,
    /// The revision the change made.
    pub revision: Option<u64>,
}

macro_rules! scheduled_columns {
    () => {
        "id, environment, service, kind, target, payload, expected, base_revision, run_at, revert_at, \
     reverts, state, created_by, created_role, created_at, reason, claimed_by, finished_at, outcome, revision"
    };
}

impl ScheduledRow {
    fn from_row(r: &AnyRow) -> anyhow::Result<Self> {
        Ok(ScheduledRow {
            id: r.try_get("id")?,
            environment: r.try_get("environment")?,
            service: r.try_get("service")?,
            kind: r.try_get("kind")?,
            target: r.try_get("target")?,
            payload: r.try_get("payload")?,
            expected: r.try_get("expected")?,
            base_revision: r.try_get::<Option<i64>, _>("base_revision")?.map(|v| v as u64),
            run_at: r.try_get("run_at")?,
            revert_at: r.try_get("revert_at")?,
            reverts: r.try_get("reverts")?,
            state: r.try_get("state")?,
            created_by: r.try_get("created_by")?,
            created_role: r.try_get("created_role")?,
            created_at: r.try_get("created_at")?,
            reason: r.try_get("reason")?,
            claimed_by: r.try_get("claimed_by")?,
            finished_at: r.try_get("finished_at")?,
            outcome: r.try_get("outcome")?,
            revision: r.try_get::<Option<i64>, _>("revision")?.map(|v| v as u64),
        })
    }
}

impl Store {
    /// Stores a pending change (its `id` and state fields are ignored) with its audit row,
    /// in one transaction. Returns its id.
    pub async fn schedule(&self, c: &ScheduledRow, audit: Option<&AuditRow>) -> anyhow::Result<i64> {
        let _g = self.write_guard().await;
        let mut tx = self.pool.begin().await?;
        let id: i64 = sqlx::query(
            "INSERT INTO scheduled_changes (environment, service, kind, target, payload, expected, base_revision, \
             run_at, revert_at, reverts, state, created_by, created_role, created_at, reason) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, 'pending', $11, $12, $13, $14) RETURNING id",
        )
        .bind(&c.environment)
        .bind(c.service.clone())
        .bind(&c.kind)
        .bind(&c.target)
        .bind(&c.payload)
        .bind(c.expected.clone())
        .bind(c.base_revision.map(|v| v as i64))
        .bind(c.run_at)
        .bind(c.revert_at)
        .bind(c.reverts)
        .bind(&c.created_by)
        .bind(&c.created_role)
        .bind(c.created_at)
        .bind(&c.reason)
        .fetch_one(&mut *tx)
        .await?
        .try_get("id")?;
        if let Some(a) = audit {
            let mut a = a.clone();
            a.target = format!("{} (scheduled change {id})", a.target);
            mutate::insert_audit(&mut tx, &a).await?;
        }
        tx.commit().await?;
        Ok(id)
    }

    /// Scheduled change `id`.
    pub async fn scheduled(&self, id: i64) -> anyhow::Result<Option<ScheduledRow>> {
        let row =
            sqlx::query(concat!("SELECT ", scheduled_columns!(), " FROM scheduled_changes WHERE id = $1"))
                .bind(id)
                .fetch_optional(&self.pool)
                .await?;
        row.map(|r| ScheduledRow::from_row(&r)).transpose()
    }

    /// Scheduled changes of an environment (of one service, if given): pending ones by time,
    /// then the last 100 finished, newest first.
    pub async fn scheduled_changes(
        &self,
        env: &str,
        service: Option<&str>,
    ) -> anyhow::Result<Vec<ScheduledRow>> {
        let pending = sqlx::query(concat!(
            "SELECT ",
            scheduled_columns!(),
            " FROM scheduled_changes WHERE environment = $1 AND ($2 IS NULL OR service = $2) \
             AND state IN ('pending', 'running') ORDER BY run_at, id"
        ))
        .bind(env)
        .bind(service)
        .fetch_all(&self.pool)
        .await?;
        let done = sqlx::query(concat!(
            "SELECT ",
            scheduled_columns!(),
            " FROM scheduled_changes WHERE environment = $1 AND ($2 IS NULL OR service = $2) \
             AND state NOT IN ('pending', 'running') ORDER BY id DESC LIMIT 100"
        ))
        .bind(env)
        .bind(service)
        .fetch_all(&self.pool)
        .await?;
        pending.iter().chain(done.iter()).map(ScheduledRow::from_row).collect()
    }

    /// Ids of pending changes due at `now`, oldest first.
    pub async fn due_changes(&self, now: i64) -> anyhow::Result<Vec<i64>> {
        let rows = sqlx::query(
            "SELECT id FROM scheduled_changes WHERE state = 'pending' AND run_at <= $1 ORDER BY run_at, id",
        )
        .bind(now)
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(|r| Ok(r.try_get("id")?)).collect()
    }

    /// Claims pending change `id` for `by` if it is due at `now`: a conditional UPDATE, so
    /// with several replicas exactly one gets it. The change as claimed, or `None`.
    pub async fn claim_change(&self, id: i64, by: &str, now: i64) -> anyhow::Result<Option<ScheduledRow>> {
        let _g = self.write_guard().await;
        let res = sqlx::query(
            "UPDATE scheduled_changes SET state = 'running', claimed_by = $1 \
             WHERE id = $2 AND state = 'pending' AND run_at <= $3",
        )
        .bind(by)
        .bind(id)
        .bind(now)
        .execute(&self.pool)
        .await?;
        if res.rows_affected() != 1 {
            return Ok(None);
        }
        drop(_g);
        self.scheduled(id).await
    }

    /// Records how a claimed change ended: `applied` (with the revision it made),
    /// `conflict` or `failed`, with what happened in words.
    pub async fn finish_change(
        &self,
        id: i64,
        state: &str,
        outcome: &str,
        revision: Option<u64>,
    ) -> anyhow::Result<()> {
        let _g = self.write_guard().await;
        sqlx::query(
            "UPDATE scheduled_changes SET state = $1, outcome = $2, revision = $3, finished_at = $4 WHERE id = $5",
        )
        .bind(state)
        .bind(outcome)
        .bind(revision.map(|r| r as i64))
        .bind(now_ms())
        .bind(id)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    /// Moves pending change `id` to `run_at` (and `revert_at`), or cancels it (`run_at`
    /// `None`), with its audit row, in one transaction: the old job no longer exists. `false`
    /// when it is not pending any more (nothing is written).
    pub async fn reschedule(
        &self,
        id: i64,
        run_at: Option<i64>,
        revert_at: Option<i64>,
        audit: &AuditRow,
    ) -> anyhow::Result<bool> {
        let _g = self.write_guard().await;
        let mut tx = self.pool.begin().await?;
        let res = match run_at {
            Some(at) => {
                sqlx::query(
                    "UPDATE scheduled_changes SET run_at = $1, revert_at = $2 WHERE id = $3 AND state = 'pending'",
                )
                .bind(at)
                .bind(revert_at)
                .bind(id)
                .execute(&mut *tx)
                .await?
            }
            None => {
                sqlx::query(
                    "UPDATE scheduled_changes SET state = 'cancelled', finished_at = $1, outcome = $2 \
                     WHERE id = $3 AND state = 'pending'",
                )
                .bind(now_ms())
                .bind(format!("cancelled by {}: {}", audit.actor, audit.reason))
                .bind(id)
                .execute(&mut *tx)
                .await?
            }
        };
        if res.rows_affected() != 1 {
            return Ok(false);
        }
        mutate::insert_audit(&mut tx, audit).await?;
        tx.commit().await?;
        Ok(true)
    }
}

//! Scheduled changes: stored jobs, claimed by one replica when due.

use sqlx::Row;
use sqlx::any::AnyRow;

use super::{AuditRow, ChangeKind, Reader, Store, audit, now_ms};

stored_words! {
    /// Where a scheduled change is: `pending` until its time, `running` while a replica holds
    /// its claim, then `applied`, `conflict` (its target changed since it was scheduled),
    /// `failed` or `cancelled`.
    pub enum ScheduledState in "scheduled_changes.state" {
        #[default]
        Pending => "pending",
        Running => "running",
        Applied => "applied",
        Conflict => "conflict",
        Failed => "failed",
        Cancelled => "cancelled",
    }
}

/// One scheduled change.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct ScheduledRow {
    /// Assigned by the database.
    pub id: i64,
    pub environment: String,
    /// The service of a flag or policy change; `None` for a profile.
    pub service: Option<String>,
    pub kind: ChangeKind,
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
    pub state: ScheduledState,
    pub created_by: String,
    /// The role of its author when it was scheduled; a change scheduled by a user or an API
    /// token runs with that user's or token's role at run time instead.
    pub created_role: String,
    /// The user who scheduled it (a session of that user).
    pub created_user: Option<String>,
    /// The API token it was scheduled through (its id).
    pub created_token: Option<String>,
    /// The break-glass reason it was scheduled with: the approval rules in force when it
    /// runs let it through as a bypass (audited then) instead of refusing it.
    pub break_glass: Option<String>,
    pub created_at: i64,
    pub reason: String,
    /// The replica that claimed it last (its run id, see `Actions::replica`).
    pub claimed_by: Option<String>,
    /// Until when that claim holds (ms since the epoch); a change still `running` after it
    /// is claimed again by another run.
    pub claim_expires_at: Option<i64>,
    pub finished_at: Option<i64>,
    /// What happened, in words (the conflict, the error).
    pub outcome: Option<String>,
    /// The revision the change made.
    pub revision: Option<u64>,
    /// The experiment a scheduled experiment started.
    pub experiment_id: Option<i64>,
}

macro_rules! scheduled_columns {
    () => {
        "id, environment, service, kind, target, payload, expected, base_revision, run_at, revert_at, \
     reverts, state, created_by, created_role, created_at, reason, claimed_by, claim_expires_at, finished_at, \
     outcome, revision, created_user, created_token, break_glass, experiment_id"
    };
}

/// A change claimed by [`Store::claim_change`].
#[derive(Clone, Debug)]
pub struct Claimed {
    pub change: ScheduledRow,
    /// The claimer whose lease expired, when the change was taken over from a run that
    /// never finished it; `None` for a change claimed when due.
    pub reclaimed_from: Option<String>,
}

impl ScheduledRow {
    fn from_row(r: &AnyRow) -> anyhow::Result<Self> {
        Ok(ScheduledRow {
            id: r.try_get("id")?,
            environment: r.try_get("environment")?,
            service: r.try_get("service")?,
            kind: ChangeKind::parse(r.try_get("kind")?)?,
            target: r.try_get("target")?,
            payload: r.try_get("payload")?,
            expected: r.try_get("expected")?,
            base_revision: r.try_get::<Option<i64>, _>("base_revision")?.map(|v| v as u64),
            run_at: r.try_get("run_at")?,
            revert_at: r.try_get("revert_at")?,
            reverts: r.try_get("reverts")?,
            state: ScheduledState::parse(r.try_get("state")?)?,
            created_by: r.try_get("created_by")?,
            created_role: r.try_get("created_role")?,
            created_at: r.try_get("created_at")?,
            reason: r.try_get("reason")?,
            claimed_by: r.try_get("claimed_by")?,
            claim_expires_at: r.try_get("claim_expires_at")?,
            finished_at: r.try_get("finished_at")?,
            outcome: r.try_get("outcome")?,
            revision: r.try_get::<Option<i64>, _>("revision")?.map(|v| v as u64),
            created_user: r.try_get("created_user")?,
            created_token: r.try_get("created_token")?,
            break_glass: r.try_get("break_glass")?,
            experiment_id: r.try_get("experiment_id")?,
        })
    }
}

impl Reader {
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

    /// Ids and kinds of changes to run at `now`, oldest first: pending ones that are due,
    /// and running ones whose claim expired (or has no expiry: claimed before leases
    /// existed).
    pub async fn due_changes(&self, now: i64) -> anyhow::Result<Vec<(i64, ChangeKind)>> {
        let rows = sqlx::query(
            "SELECT id, kind FROM scheduled_changes WHERE (state = 'pending' AND run_at <= $1) \
             OR (state = 'running' AND (claim_expires_at IS NULL OR claim_expires_at <= $1)) ORDER BY run_at, id",
        )
        .bind(now)
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(|r| Ok((r.try_get("id")?, ChangeKind::parse(r.try_get("kind")?)?))).collect()
    }

    /// The pending or finished change that reverts change `id`, if one was scheduled.
    pub async fn revert_of(&self, id: i64) -> anyhow::Result<Option<i64>> {
        let row = sqlx::query("SELECT id FROM scheduled_changes WHERE reverts = $1")
            .bind(id)
            .fetch_optional(&self.pool)
            .await?;
        Ok(row.map(|r| r.try_get("id")).transpose()?)
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
             run_at, revert_at, reverts, state, created_by, created_role, created_at, reason, created_user, \
             created_token, break_glass) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, 'pending', $11, $12, $13, $14, $15, $16, $17) \
             RETURNING id",
        )
        .bind(&c.environment)
        .bind(c.service.clone())
        .bind(c.kind.as_str())
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
        .bind(c.created_user.clone())
        .bind(c.created_token.clone())
        .bind(c.break_glass.clone())
        .fetch_one(&mut *tx)
        .await?
        .try_get("id")?;
        if let Some(a) = audit {
            let mut a = a.clone();
            a.target = format!("{} (scheduled change {id})", a.target);
            audit::insert_audit(&mut tx, &a).await?;
        }
        tx.commit().await?;
        Ok(id)
    }

    /// Claims change `id` for `by` until `until` if, at `now`, it is pending and due, or
    /// running with an expired claim: a conditional UPDATE (on the previous claimer, for a
    /// running one), so with several replicas exactly one gets it. The change as claimed,
    /// or `None`.
    pub async fn claim_change(
        &self,
        id: i64,
        by: &str,
        now: i64,
        until: i64,
    ) -> anyhow::Result<Option<Claimed>> {
        let Some(before) = self.scheduled(id).await? else { return Ok(None) };
        let _g = self.write_guard().await;
        let res =
            match (before.state, &before.claimed_by) {
                (ScheduledState::Pending, _) => sqlx::query(
                    "UPDATE scheduled_changes SET state = 'running', claimed_by = $1, claim_expires_at = $2 \
                     WHERE id = $3 AND state = 'pending' AND run_at <= $4",
                )
                .bind(by)
                .bind(until)
                .bind(id)
                .bind(now)
                .execute(&self.pool)
                .await?,
                (ScheduledState::Running, Some(previous)) => {
                    sqlx::query(
                        "UPDATE scheduled_changes SET claimed_by = $1, claim_expires_at = $2 \
                     WHERE id = $3 AND state = 'running' AND claimed_by = $4 \
                     AND (claim_expires_at IS NULL OR claim_expires_at <= $5)",
                    )
                    .bind(by)
                    .bind(until)
                    .bind(id)
                    .bind(previous)
                    .bind(now)
                    .execute(&self.pool)
                    .await?
                }
                _ => return Ok(None),
            };
        if res.rows_affected() != 1 {
            return Ok(None);
        }
        drop(_g);
        let reclaimed_from =
            (before.state == ScheduledState::Running).then(|| before.claimed_by.clone().unwrap_or_default());
        Ok(self.scheduled(id).await?.map(|change| Claimed { change, reclaimed_from }))
    }

    /// Records how a change claimed by `by` ended: `applied` (with the revision it made),
    /// `conflict` or `failed`, with what happened in words. `false` (nothing written) when
    /// `by` no longer holds the claim: its lease expired and another run took it over.
    pub async fn finish_change(
        &self,
        id: i64,
        by: &str,
        state: ScheduledState,
        outcome: &str,
        revision: Option<u64>,
    ) -> anyhow::Result<bool> {
        let _g = self.write_guard().await;
        let res = sqlx::query(
            "UPDATE scheduled_changes SET state = $1, outcome = $2, revision = $3, finished_at = $4 \
             WHERE id = $5 AND state = 'running' AND claimed_by = $6",
        )
        .bind(state.as_str())
        .bind(outcome)
        .bind(revision.map(|r| r as i64))
        .bind(now_ms())
        .bind(id)
        .bind(by)
        .execute(&self.pool)
        .await?;
        Ok(res.rows_affected() == 1)
    }

    /// Moves pending change `id` to `run_at` with `revert_at` (and `payload`, when given:
    /// a profile's expiry is in it), or cancels it (`run_at` `None`), with its audit row,
    /// in one transaction: the old job no longer exists. `false` when it is not pending any
    /// more (nothing is written).
    pub async fn reschedule(
        &self,
        id: i64,
        run_at: Option<i64>,
        revert_at: Option<i64>,
        payload: Option<&str>,
        audit: &AuditRow,
    ) -> anyhow::Result<bool> {
        let _g = self.write_guard().await;
        let mut tx = self.pool.begin().await?;
        let res = match run_at {
            Some(at) => sqlx::query(
                "UPDATE scheduled_changes SET run_at = $1, revert_at = $2, payload = COALESCE($3, payload) \
                     WHERE id = $4 AND state = 'pending'",
            )
            .bind(at)
            .bind(revert_at)
            .bind(payload.map(str::to_string))
            .bind(id)
            .execute(&mut *tx)
            .await?,
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
        audit::insert_audit(&mut tx, audit).await?;
        tx.commit().await?;
        Ok(true)
    }
}

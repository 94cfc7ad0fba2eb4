//! Experiments: one row per run (its spec, where it is, its verdict) and its readings of
//! the hypothesis, one row per reading.

use sqlx::Row;
use sqlx::any::AnyRow;

use super::{AuditRow, Reader, Store, audit};

stored_words! {
    /// Where an experiment is: measuring the `baseline` (nothing injected), its fault
    /// `injected`, watching the `recovery` once the fault is gone, or `done` (its verdict
    /// recorded).
    pub enum ExperimentState in "experiments.state" {
        #[default]
        Baseline => "baseline",
        Injected => "injected",
        Recovery => "recovery",
        Done => "done",
    }
}

impl ExperimentState {
    /// Still running (not `done`): what can be stopped, and what the watchdog watches.
    pub const fn is_running(self) -> bool {
        !matches!(self, Self::Done)
    }
}

/// One experiment run.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct ExperimentRow {
    /// Assigned by the database.
    pub id: i64,
    pub environment: String,
    pub service: String,
    pub name: String,
    /// The spec as submitted (JSON).
    pub spec: String,
    pub state: ExperimentState,
    /// `passed`, `failed` or `aborted` once done.
    pub verdict: Option<String>,
    /// Why, in words.
    pub why: Option<String>,
    /// JSON list of the instances given the fault; empty list: every instance.
    pub instances: Option<String>,
    pub created_by: String,
    /// The role of its author, which the fault is set and removed with.
    pub created_role: String,
    /// ms since the epoch.
    pub created_at: i64,
    pub reason: String,
    pub injected_at: Option<i64>,
    /// When the fault rule expires by itself (agents end it then even offline).
    pub fault_expires_at: Option<i64>,
    pub fault_removed_at: Option<i64>,
    pub ended_at: Option<i64>,
    /// Who asked it to stop, when, and why.
    pub stop_requested_by: Option<String>,
    pub stop_requested_at: Option<i64>,
    pub stop_reason: Option<String>,
    /// The server replica running it and its last sign of life.
    pub replica: String,
    pub heartbeat_at: i64,
}

macro_rules! experiment_columns {
    () => {
        "id, environment, service, name, spec, state, verdict, why, instances, created_by, \
         created_role, created_at, reason, injected_at, fault_expires_at, fault_removed_at, ended_at, \
         stop_requested_by, stop_requested_at, stop_reason, replica, heartbeat_at"
    };
}

impl ExperimentRow {
    fn from_row(r: &AnyRow) -> anyhow::Result<Self> {
        Ok(ExperimentRow {
            id: r.try_get("id")?,
            environment: r.try_get("environment")?,
            service: r.try_get("service")?,
            name: r.try_get("name")?,
            spec: r.try_get("spec")?,
            state: ExperimentState::parse(r.try_get("state")?)?,
            verdict: r.try_get("verdict")?,
            why: r.try_get("why")?,
            instances: r.try_get("instances")?,
            created_by: r.try_get("created_by")?,
            created_role: r.try_get("created_role")?,
            created_at: r.try_get("created_at")?,
            reason: r.try_get("reason")?,
            injected_at: r.try_get("injected_at")?,
            fault_expires_at: r.try_get("fault_expires_at")?,
            fault_removed_at: r.try_get("fault_removed_at")?,
            ended_at: r.try_get("ended_at")?,
            stop_requested_by: r.try_get("stop_requested_by")?,
            stop_requested_at: r.try_get("stop_requested_at")?,
            stop_reason: r.try_get("stop_reason")?,
            replica: r.try_get("replica")?,
            heartbeat_at: r.try_get("heartbeat_at")?,
        })
    }
}

/// One stored reading of an experiment's hypothesis.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExperimentReadingRow {
    pub at: i64,
    pub phase: String,
    /// JSON `{"values": [...], "holds": [...]}`.
    pub reading: String,
}

/// What an experiment's run records when it moves on.
#[derive(Clone, Debug, Default)]
pub struct ExperimentUpdate {
    pub state: Option<ExperimentState>,
    pub instances: Option<String>,
    pub injected_at: Option<i64>,
    pub fault_expires_at: Option<i64>,
    pub fault_removed_at: Option<i64>,
}

impl Reader {
    /// Experiment `id`.
    pub async fn experiment(&self, id: i64) -> anyhow::Result<Option<ExperimentRow>> {
        let row = sqlx::query(concat!("SELECT ", experiment_columns!(), " FROM experiments WHERE id = $1"))
            .bind(id)
            .fetch_optional(&self.pool)
            .await?;
        row.map(|r| ExperimentRow::from_row(&r)).transpose()
    }

    /// The last 100 experiments, newest first, of an environment and service when given.
    pub async fn experiments(
        &self,
        env: Option<&str>,
        service: Option<&str>,
    ) -> anyhow::Result<Vec<ExperimentRow>> {
        let rows = sqlx::query(concat!(
            "SELECT ",
            experiment_columns!(),
            " FROM experiments WHERE ($1 IS NULL OR environment = $1) AND ($2 IS NULL OR service = $2) \
             ORDER BY id DESC LIMIT 100"
        ))
        .bind(env)
        .bind(service)
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(ExperimentRow::from_row).collect()
    }

    /// Experiments not done whose replica showed no sign of life since `before`.
    pub async fn orphaned_experiments(&self, before: i64) -> anyhow::Result<Vec<ExperimentRow>> {
        let rows = sqlx::query(concat!(
            "SELECT ",
            experiment_columns!(),
            " FROM experiments WHERE state <> $2 AND heartbeat_at < $1 ORDER BY id"
        ))
        .bind(before)
        .bind(ExperimentState::Done.as_str())
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(ExperimentRow::from_row).collect()
    }

    /// The readings of experiment `id`, oldest first.
    pub async fn experiment_readings(&self, id: i64) -> anyhow::Result<Vec<ExperimentReadingRow>> {
        let rows = sqlx::query(
            "SELECT at, phase, reading FROM experiment_readings WHERE experiment_id = $1 ORDER BY at, phase",
        )
        .bind(id)
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|r| {
                Ok(ExperimentReadingRow {
                    at: r.try_get("at")?,
                    phase: r.try_get("phase")?,
                    reading: r.try_get("reading")?,
                })
            })
            .collect()
    }
}

impl Store {
    /// Stores a new experiment (its `id` is ignored) with its audit row, in one
    /// transaction. Returns its id.
    pub async fn insert_experiment(&self, e: &ExperimentRow, audit: &AuditRow) -> anyhow::Result<i64> {
        let id = self.insert_experiment_of(e, audit, None).await?;
        Ok(id.expect("an experiment of no scheduled change is always stored"))
    }

    /// Stores experiment `e` started by scheduled change `change`, which `claimer` holds,
    /// with its audit row, and records the change's end (`applied`, "started as experiment
    /// N"), in one transaction: a change is never recorded without its experiment,
    /// nor an experiment started twice by a change. Returns its id; `None`, nothing
    /// written, when `claimer` no longer holds the claim (another run took it over).
    pub async fn insert_scheduled_experiment(
        &self,
        e: &ExperimentRow,
        audit: &AuditRow,
        change: i64,
        claimer: &str,
    ) -> anyhow::Result<Option<i64>> {
        self.insert_experiment_of(e, audit, Some((change, claimer))).await
    }

    async fn insert_experiment_of(
        &self,
        e: &ExperimentRow,
        audit: &AuditRow,
        change: Option<(i64, &str)>,
    ) -> anyhow::Result<Option<i64>> {
        let _g = self.write_guard().await;
        let mut tx = self.pool.begin().await?;
        let id: i64 = sqlx::query(
            "INSERT INTO experiments (environment, service, name, spec, state, created_by, created_role, \
             created_at, reason, replica, heartbeat_at) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11) RETURNING id",
        )
        .bind(&e.environment)
        .bind(&e.service)
        .bind(&e.name)
        .bind(&e.spec)
        .bind(e.state.as_str())
        .bind(&e.created_by)
        .bind(&e.created_role)
        .bind(e.created_at)
        .bind(&e.reason)
        .bind(&e.replica)
        .bind(e.heartbeat_at)
        .fetch_one(&mut *tx)
        .await?
        .try_get("id")?;
        if let Some((change, claimer)) = change {
            let res = sqlx::query(
                "UPDATE scheduled_changes SET state = 'applied', outcome = $1, experiment_id = $2, \
                 finished_at = $3 WHERE id = $4 AND state = 'running' AND claimed_by = $5",
            )
            .bind(format!("started as experiment {id}"))
            .bind(id)
            .bind(e.created_at)
            .bind(change)
            .bind(claimer)
            .execute(&mut *tx)
            .await?;
            if res.rows_affected() != 1 {
                tx.rollback().await?;
                return Ok(None);
            }
        }
        let mut a = audit.clone();
        a.target = format!("{} (experiment {id})", a.target);
        audit::insert_audit(&mut tx, &a).await?;
        tx.commit().await?;
        Ok(Some(id))
    }

    /// Records a reading of experiment `id` and its replica's sign of life (`at`).
    pub async fn add_experiment_reading(
        &self,
        id: i64,
        at: i64,
        phase: &str,
        reading: &str,
    ) -> anyhow::Result<()> {
        let _g = self.write_guard().await;
        let mut tx = self.pool.begin().await?;
        sqlx::query(
            "INSERT INTO experiment_readings (experiment_id, at, phase, reading) VALUES ($1, $2, $3, $4)",
        )
        .bind(id)
        .bind(at)
        .bind(phase)
        .bind(reading)
        .execute(&mut *tx)
        .await?;
        sqlx::query("UPDATE experiments SET heartbeat_at = $2 WHERE id = $1")
            .bind(id)
            .bind(at)
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(())
    }

    /// Records what the run of experiment `id` did (only the fields given).
    pub async fn update_experiment(&self, id: i64, u: &ExperimentUpdate) -> anyhow::Result<()> {
        let _g = self.write_guard().await;
        sqlx::query(
            "UPDATE experiments SET state = COALESCE($2, state), instances = COALESCE($3, instances), \
             injected_at = COALESCE($4, injected_at), fault_expires_at = COALESCE($5, fault_expires_at), \
             fault_removed_at = COALESCE($6, fault_removed_at) WHERE id = $1",
        )
        .bind(id)
        .bind(u.state.map(ExperimentState::as_str))
        .bind(u.instances.clone())
        .bind(u.injected_at)
        .bind(u.fault_expires_at)
        .bind(u.fault_removed_at)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    /// Records that `by` asked experiment `id` to stop, with its audit row, if it is not
    /// done and nobody asked before. `false` when it was done or already asked.
    pub async fn request_experiment_stop(
        &self,
        id: i64,
        by: &str,
        at: i64,
        reason: &str,
        audit: &AuditRow,
    ) -> anyhow::Result<bool> {
        let _g = self.write_guard().await;
        let mut tx = self.pool.begin().await?;
        let n = sqlx::query(
            "UPDATE experiments SET stop_requested_by = $2, stop_requested_at = $3, stop_reason = $4 \
             WHERE id = $1 AND state <> $5 AND stop_requested_at IS NULL",
        )
        .bind(id)
        .bind(by)
        .bind(at)
        .bind(reason)
        .bind(ExperimentState::Done.as_str())
        .execute(&mut *tx)
        .await?
        .rows_affected();
        if n == 1 {
            audit::insert_audit(&mut tx, audit).await?;
        }
        tx.commit().await?;
        Ok(n == 1)
    }

    /// Ends experiment `id` with its verdict and audit row, unless it is done already
    /// (`false`: another run recorded its end first).
    pub async fn finish_experiment(
        &self,
        id: i64,
        verdict: &str,
        why: &str,
        at: i64,
        audit: &AuditRow,
    ) -> anyhow::Result<bool> {
        let _g = self.write_guard().await;
        let mut tx = self.pool.begin().await?;
        let n = sqlx::query(
            "UPDATE experiments SET state = $5, verdict = $2, why = $3, ended_at = $4 WHERE id = $1 AND state <> $5",
        )
        .bind(id)
        .bind(verdict)
        .bind(why)
        .bind(at)
        .bind(ExperimentState::Done.as_str())
        .execute(&mut *tx)
        .await?
        .rows_affected();
        if n == 1 {
            audit::insert_audit(&mut tx, audit).await?;
        }
        tx.commit().await?;
        Ok(n == 1)
    }
}

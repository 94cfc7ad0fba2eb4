//! Four-eyes: which kinds of change need approval per environment, and change requests.

use sqlx::Row;
use sqlx::any::AnyRow;

use super::{AuditRow, Reader, Store, audit};

stored_words! {
    /// Where a change request is: `open` (waiting for a second person), `approved` (that
    /// version may be applied), then `applied`, `rejected`, or `conflict` (its target
    /// changed under it).
    pub enum RequestState in "change_requests.state" {
        #[default]
        Open => "open",
        Approved => "approved",
        Applied => "applied",
        Rejected => "rejected",
        Conflict => "conflict",
    }
}

stored_words! {
    /// A kind of change an approval rule names: what a write changes (`policy`, `flag`) or
    /// what an action applies (`profile`, `experiment`: starting one). Change requests,
    /// scheduled changes and an environment's approval rules store it.
    pub enum ChangeKind in "change kind" {
        #[default]
        Policy => "policy",
        Flag => "flag",
        Profile => "profile",
        Experiment => "experiment",
    }
}

impl ChangeKind {
    /// The refusal of a word no kind has, as the API and the CLI show it.
    pub fn allowed() -> String {
        let words: Vec<&str> = Self::ALL.iter().map(|k| k.as_str()).collect();
        format!("must be one of {}", words.join(", "))
    }
}

impl RequestState {
    /// Still waiting to be decided or applied (`open` or `approved`): what the landing page
    /// counts and what a second request on the same target conflicts with.
    pub const fn is_pending(self) -> bool {
        matches!(self, Self::Open | Self::Approved)
    }
}

/// One change request.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct RequestRow {
    pub id: i64,
    pub environment: String,
    /// The service of a flag or policy change; `None` for a profile.
    pub service: Option<String>,
    pub kind: ChangeKind,
    /// The flag key, `policy`, or the profile name.
    pub target: String,
    /// JSON of what is proposed (the flag value, the policy, `{"expires_in": …}`).
    pub payload: String,
    /// JSON of the target when proposed (or last edited); a different target at apply time
    /// is a conflict.
    pub expected: Option<String>,
    pub base_revision: Option<u64>,
    /// Bumped by every edit.
    pub version: u64,
    pub state: RequestState,
    pub proposed_by: String,
    /// The person behind the proposer (`Actor::person`); `None` on requests proposed before
    /// it was recorded (`proposed_by` stands in).
    pub proposed_person: Option<String>,
    pub proposed_at: i64,
    pub reason: String,
    pub approved_by: Option<String>,
    pub approved_at: Option<i64>,
    /// The version approved: only that version may be applied.
    pub approved_version: Option<u64>,
    /// Why it was approved or rejected.
    pub decided_reason: Option<String>,
    pub applied_by: Option<String>,
    pub applied_at: Option<i64>,
    pub revision: Option<u64>,
    pub outcome: Option<String>,
    /// The experiment applying an `experiment` request started.
    pub experiment_id: Option<i64>,
}

macro_rules! request_columns {
    () => {
        "id, environment, service, kind, target, payload, expected, base_revision, version, state, \
     proposed_by, proposed_at, reason, approved_by, approved_at, approved_version, decided_reason, applied_by, \
     applied_at, revision, outcome, proposed_person, experiment_id"
    };
}

impl RequestRow {
    fn from_row(r: &AnyRow) -> anyhow::Result<Self> {
        let u = |v: Option<i64>| v.map(|v| v as u64);
        Ok(RequestRow {
            id: r.try_get("id")?,
            environment: r.try_get("environment")?,
            service: r.try_get("service")?,
            kind: ChangeKind::parse(r.try_get("kind")?)?,
            target: r.try_get("target")?,
            payload: r.try_get("payload")?,
            expected: r.try_get("expected")?,
            base_revision: u(r.try_get("base_revision")?),
            version: r.try_get::<i64, _>("version")? as u64,
            state: RequestState::parse(r.try_get("state")?)?,
            proposed_by: r.try_get("proposed_by")?,
            proposed_at: r.try_get("proposed_at")?,
            reason: r.try_get("reason")?,
            approved_by: r.try_get("approved_by")?,
            approved_at: r.try_get("approved_at")?,
            approved_version: u(r.try_get("approved_version")?),
            decided_reason: r.try_get("decided_reason")?,
            applied_by: r.try_get("applied_by")?,
            applied_at: r.try_get("applied_at")?,
            revision: u(r.try_get("revision")?),
            outcome: r.try_get("outcome")?,
            proposed_person: r.try_get("proposed_person")?,
            experiment_id: r.try_get("experiment_id")?,
        })
    }
}

impl Reader {
    /// The kinds of change that need approval in `env` (stored as a JSON array of words);
    /// none when no rule was set.
    pub async fn approval_kinds(&self, env: &str) -> anyhow::Result<Vec<ChangeKind>> {
        let row = sqlx::query("SELECT kinds FROM approval_rules WHERE environment = $1")
            .bind(env)
            .fetch_optional(&self.pool)
            .await?;
        match row {
            Some(r) => serde_json::from_str::<Vec<String>>(&r.try_get::<String, _>("kinds")?)?
                .iter()
                .map(|w| ChangeKind::parse(w))
                .collect(),
            None => Ok(Vec::new()),
        }
    }

    /// Change request `id`.
    pub async fn request(&self, id: i64) -> anyhow::Result<Option<RequestRow>> {
        let row = sqlx::query(concat!("SELECT ", request_columns!(), " FROM change_requests WHERE id = $1"))
            .bind(id)
            .fetch_optional(&self.pool)
            .await?;
        row.map(|r| RequestRow::from_row(&r)).transpose()
    }

    /// Change requests of `env`: open and approved first, then the last 100 others.
    pub async fn requests(&self, env: &str) -> anyhow::Result<Vec<RequestRow>> {
        let rows = sqlx::query(concat!(
            "SELECT ",
            request_columns!(),
            " FROM change_requests WHERE environment = $1 ORDER BY \
             CASE WHEN state IN ('open', 'approved') THEN 0 ELSE 1 END, id DESC LIMIT 200"
        ))
        .bind(env)
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(RequestRow::from_row).collect()
    }
}

impl Store {
    /// Sets the kinds of change that need approval in `env`, with its audit row.
    pub async fn set_approval_kinds(
        &self,
        env: &str,
        kinds: &[ChangeKind],
        audit: &AuditRow,
    ) -> anyhow::Result<()> {
        self.set_environment_setting(
            "INSERT INTO approval_rules (environment, kinds, updated_at, updated_by) VALUES ($1, $2, $3, $4) \
             ON CONFLICT (environment) DO UPDATE SET kinds = excluded.kinds, updated_at = excluded.updated_at, \
             updated_by = excluded.updated_by",
            env,
            serde_json::to_string(kinds)?,
            audit,
        )
        .await
    }

    /// Stores a new open request (version 1) with its audit row. Returns its id.
    pub async fn create_request(&self, r: &RequestRow, audit: &AuditRow) -> anyhow::Result<i64> {
        let _g = self.write_guard().await;
        let mut tx = self.pool.begin().await?;
        let id: i64 = sqlx::query(
            "INSERT INTO change_requests (environment, service, kind, target, payload, expected, base_revision, \
             version, state, proposed_by, proposed_at, reason, proposed_person) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, 1, 'open', $8, $9, $10, $11) RETURNING id",
        )
        .bind(&r.environment)
        .bind(r.service.clone())
        .bind(r.kind.as_str())
        .bind(&r.target)
        .bind(&r.payload)
        .bind(r.expected.clone())
        .bind(r.base_revision.map(|v| v as i64))
        .bind(&r.proposed_by)
        .bind(r.proposed_at)
        .bind(&r.reason)
        .bind(r.proposed_person.clone())
        .fetch_one(&mut *tx)
        .await?
        .try_get("id")?;
        let mut a = audit.clone();
        a.target = format!("{} (change request {id})", a.target);
        audit::insert_audit(&mut tx, &a).await?;
        tx.commit().await?;
        Ok(id)
    }

    /// Replaces request `id` by `next` if it is still at `version` in state `from` (a
    /// conditional UPDATE: of two concurrent transitions one wins), with its audit row.
    /// `false` when it moved (nothing is written).
    pub async fn update_request(
        &self,
        id: i64,
        version: u64,
        from: RequestState,
        next: &RequestRow,
        audit: &AuditRow,
    ) -> anyhow::Result<bool> {
        let _g = self.write_guard().await;
        let mut tx = self.pool.begin().await?;
        let res = sqlx::query(
            "UPDATE change_requests SET payload = $1, expected = $2, base_revision = $3, version = $4, state = $5, \
             approved_by = $6, approved_at = $7, approved_version = $8, decided_reason = $9, applied_by = $10, \
             applied_at = $11, revision = $12, outcome = $13, experiment_id = $17 \
             WHERE id = $14 AND version = $15 AND state = $16",
        )
        .bind(&next.payload)
        .bind(next.expected.clone())
        .bind(next.base_revision.map(|v| v as i64))
        .bind(next.version as i64)
        .bind(next.state.as_str())
        .bind(next.approved_by.clone())
        .bind(next.approved_at)
        .bind(next.approved_version.map(|v| v as i64))
        .bind(next.decided_reason.clone())
        .bind(next.applied_by.clone())
        .bind(next.applied_at)
        .bind(next.revision.map(|v| v as i64))
        .bind(next.outcome.clone())
        .bind(id)
        .bind(version as i64)
        .bind(from.as_str())
        .bind(next.experiment_id)
        .execute(&mut *tx)
        .await?;
        if res.rows_affected() != 1 {
            return Ok(false);
        }
        audit::insert_audit(&mut tx, audit).await?;
        tx.commit().await?;
        Ok(true)
    }
}

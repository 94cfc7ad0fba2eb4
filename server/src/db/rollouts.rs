//! Staged rollouts as stored: the plan an environment stages with, and each rollout's
//! stage, cohort threshold and the two revisions it serves (see `migrations/*/0019`).
//!
//! A staged change is the service's newest revision (the *candidate*, what its stored parts
//! hold); instances outside the cohort are served the *stable* revision, which carries the
//! policy the rollout started from. Only the policy is staged: an immediate change written
//! during a rollout (a flip, an override, a profile) produces a stable revision with it and
//! a candidate revision with it, so the whole fleet gets it at once and the cohort keeps
//! the staged policy (`mutate::write_revision`).

use std::time::Duration;

use levee_agent::flags::ROLLOUT_BUCKETS;
use levee_agent::policy::Policy;
use serde::{Deserialize, Serialize};
use sqlx::any::AnyRow;
use sqlx::{AnyConnection, Row};

use super::{AuditRow, Backend, ChangeKind, NOTIFY_CHANNEL, Reader, SnapshotRow, Store, audit, now_ms};

stored_words! {
    /// Where a rollout is. `running` and `paused` are in progress (at most one per service);
    /// `halted` (by the server, on the cohort's health), `aborted` (by a person, or its
    /// service deleted) and `completed` have ended.
    pub enum RolloutState in "rollouts.state" {
        #[default]
        Running => "running",
        Paused => "paused",
        Halted => "halted",
        Aborted => "aborted",
        Completed => "completed",
    }
}

impl RolloutState {
    /// Still in progress: `running` or `paused`.
    pub const fn is_active(self) -> bool {
        matches!(self, Self::Running | Self::Paused)
    }
}

/// Most stages of a plan.
pub const MAX_STAGES: usize = 10;
/// Shortest bake time of a stage.
pub const MIN_BAKE: Duration = Duration::from_secs(1);
/// Longest bake time of a stage.
pub const MAX_BAKE: Duration = Duration::from_secs(7 * 24 * 3600);
/// Default stages: 5 %, 25 %, 50 %, 100 % (each covering at least one connected instance).
pub const DEFAULT_STAGES: [u32; 4] = [5, 25, 50, 100];
/// Default bake time of a stage.
pub const DEFAULT_BAKE: Duration = Duration::from_secs(300);
/// Default: the cohort may do worse than the rest by at most 5 points.
pub const DEFAULT_MAX_ERROR_RATE_INCREASE: f64 = 0.05;
/// Default: a dependency or route is judged once the cohort made this many calls to it.
pub const DEFAULT_MIN_CALLS: u64 = 20;
/// Default: NACKs of the candidate by cohort instances tolerated (the first one halts).
pub const DEFAULT_MAX_NACKS: u64 = 0;
/// Kinds of change an environment stages when it has no setting of its own: policy
/// changes (flag flips, breaker overrides and emergency profiles are always immediate).
pub const DEFAULT_STAGED: [ChangeKind; 1] = [ChangeKind::Policy];
/// Connected instances a service needs for a change to be staged by the environment's
/// setting: a cohort and at least one instance beside it to compare it with. With fewer,
/// such a change is delivered at once: a lone instance would be a cohort judged on its
/// NACKs alone, waiting through every stage's bake time, and the policy could not change
/// again meanwhile. A write that asks for staging (`"staged": true`) is staged whatever
/// the count.
pub const MIN_INSTANCES_TO_STAGE: u64 = 2;

/// One stage: the share of the service's instances that get the candidate. `percent` of
/// the rollout buckets, and at least `instances` connected instances (the lowest buckets
/// first); at least one instance whatever the numbers say.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Stage {
    /// Percent of the instances, 0–100 (100: the whole fleet, the last stage).
    #[serde(default)]
    pub percent: u32,
    /// At least this many connected instances (0–10 000).
    #[serde(default)]
    pub instances: u32,
}

/// How a staged change is delivered: stages, how long each bakes, and when it halts.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(as = RolloutPlan)]
pub struct Plan {
    /// Stages in order; the last covers 100 %. 1–10 stages, shares never decreasing.
    #[serde(default = "default_stages")]
    pub stages: Vec<Stage>,
    /// How long each stage runs before the next starts (`"5m"`, `"30s"`), 1 s – 7 days.
    #[serde(with = "levee_agent::policy::duration", default = "default_bake")]
    #[schema(value_type = levee_agent::policy::duration::Text, example = "5m")]
    pub bake: Duration,
    /// Halt when, on a dependency or inbound route, the cohort's share of calls that did
    /// not succeed (failed, timed out or shed), or its share of reports saying not ready,
    /// exceeds the rest's by more than this (0–1) and by more than three standard errors
    /// (`rollout::halt_reason`).
    #[serde(default = "default_increase")]
    pub max_error_rate_increase: f64,
    /// Calls the cohort must have made to a dependency or route before it is judged on
    /// it (0–10^9).
    #[serde(default = "default_min_calls")]
    pub min_calls: u64,
    /// NACKs of the candidate by cohort instances tolerated before a halt (0–10 000).
    #[serde(default = "default_max_nacks")]
    pub max_nacks: u64,
}

fn default_stages() -> Vec<Stage> {
    DEFAULT_STAGES.iter().map(|&percent| Stage { percent, instances: 0 }).collect()
}
fn default_bake() -> Duration {
    DEFAULT_BAKE
}
fn default_increase() -> f64 {
    DEFAULT_MAX_ERROR_RATE_INCREASE
}
fn default_min_calls() -> u64 {
    DEFAULT_MIN_CALLS
}
fn default_max_nacks() -> u64 {
    DEFAULT_MAX_NACKS
}

impl Default for Plan {
    fn default() -> Self {
        Plan {
            stages: default_stages(),
            bake: DEFAULT_BAKE,
            max_error_rate_increase: DEFAULT_MAX_ERROR_RATE_INCREASE,
            min_calls: DEFAULT_MIN_CALLS,
            max_nacks: DEFAULT_MAX_NACKS,
        }
    }
}

impl Plan {
    /// Every problem of the plan as (field path, value, allowed range).
    pub fn problems(&self) -> Vec<(String, String, &'static str)> {
        let mut out = Vec::new();
        if self.stages.is_empty() || self.stages.len() > MAX_STAGES {
            out.push(("stages".into(), format!("{} stages", self.stages.len()), "1 to 10 stages"));
        }
        let mut last = 0u32;
        for (i, s) in self.stages.iter().enumerate() {
            if s.percent > 100 {
                out.push((format!("stages[{i}].percent"), s.percent.to_string(), "0 to 100"));
            } else if s.percent < last {
                out.push((
                    format!("stages[{i}].percent"),
                    s.percent.to_string(),
                    "at least the percent of the stage before",
                ));
            }
            last = last.max(s.percent);
            if s.instances > 10_000 {
                out.push((format!("stages[{i}].instances"), s.instances.to_string(), "0 to 10000"));
            }
        }
        if let Some(s) = self.stages.last()
            && s.percent != 100
        {
            out.push((
                format!("stages[{}].percent", self.stages.len() - 1),
                s.percent.to_string(),
                "100 in the last stage (it covers the whole fleet)",
            ));
        }
        if self.bake < MIN_BAKE || self.bake > MAX_BAKE {
            out.push((
                "bake".into(),
                levee_agent::policy::duration::format(self.bake),
                "1s to 7 days (168h)",
            ));
        }
        if !(0.0..=1.0).contains(&self.max_error_rate_increase) {
            out.push(("max_error_rate_increase".into(), self.max_error_rate_increase.to_string(), "0 to 1"));
        }
        if self.min_calls > 1_000_000_000 {
            out.push(("min_calls".into(), self.min_calls.to_string(), "0 to 1000000000"));
        }
        if self.max_nacks > 10_000 {
            out.push(("max_nacks".into(), self.max_nacks.to_string(), "0 to 10000"));
        }
        out
    }

    /// The cohort threshold a stage starts with, in rollout buckets: its percent of them
    /// (the driver widens it to its `instances` and to at least one connected instance).
    pub fn stage_threshold(&self, stage: usize) -> u64 {
        let percent = self.stages.get(stage).map_or(100, |s| s.percent.min(100));
        u64::from(percent) * (ROLLOUT_BUCKETS / 100)
    }
}

/// An environment's rollout setting: which kinds of change are staged when the write does
/// not say, and the plan they are staged with.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RolloutSettings {
    /// Kinds staged by default: `policy` (the only kind that can be staged; flag flips,
    /// breaker overrides and emergency profiles are always immediate). Empty: immediate.
    /// Default (and when left out): `["policy"]`.
    #[serde(default = "default_staged")]
    pub staged: Vec<String>,
    /// The plan staged changes follow.
    #[serde(default)]
    pub plan: Plan,
}

fn default_staged() -> Vec<String> {
    DEFAULT_STAGED.iter().map(|k| k.as_str().to_string()).collect()
}

impl RolloutSettings {
    /// Whether a change of `kind` is staged when the write does not say.
    pub fn stages(&self, kind: ChangeKind) -> bool {
        self.staged.iter().any(|k| ChangeKind::parse(k).is_ok_and(|k| k == kind))
    }
}

impl Default for RolloutSettings {
    fn default() -> Self {
        RolloutSettings { staged: default_staged(), plan: Plan::default() }
    }
}

/// The kinds of change a rollout can stage.
pub const STAGEABLE_KINDS: [ChangeKind; 1] = [ChangeKind::Policy];

/// Whether a write is staged.
#[derive(Clone, Debug, Default, PartialEq)]
pub enum Staging {
    /// As the environment's setting says.
    #[default]
    Default,
    /// Staged (a policy change starts a rollout), with this plan or the environment's.
    Staged(Option<Plan>),
    /// Delivered to every instance at once.
    Immediate,
    /// The write that ends rollout `id` (its revert): it may change the policy while the
    /// rollout is in progress, and ends it in the same transaction as `state` (`halted`
    /// or `aborted`) with `outcome`.
    Ends { id: i64, state: RolloutState, outcome: String },
}

/// One rollout.
#[derive(Clone, Debug, PartialEq, Serialize, utoipa::ToSchema)]
pub struct RolloutRow {
    pub id: i64,
    pub environment: String,
    pub service: String,
    pub state: RolloutState,
    /// The revision instances outside the cohort are served.
    pub stable_revision: u64,
    /// The revision the cohort is served (the service's newest).
    pub candidate_revision: u64,
    /// The policy instances outside the cohort keep.
    #[serde(skip)]
    pub base_policy: String,
    pub plan: Plan,
    /// Index of the current stage in `plan.stages`.
    pub stage: usize,
    /// The cohort now, in rollout buckets out of 1 000 000: an instance whose bucket is
    /// below is in it.
    pub threshold: u64,
    /// When the current stage started (RFC 3339).
    #[serde(with = "levee_agent::policy::rfc3339")]
    #[schema(value_type = String, format = DateTime)]
    pub stage_started_at: i64,
    /// Bumped by every change of the row; a replica keeps the highest it has seen.
    pub version: i64,
    #[serde(with = "levee_agent::policy::rfc3339")]
    #[schema(value_type = String, format = DateTime)]
    pub created_at: i64,
    pub created_by: String,
    pub reason: String,
    /// When it ended (RFC 3339).
    #[serde(with = "levee_agent::policy::rfc3339::option")]
    #[schema(value_type = Option<String>, format = DateTime)]
    pub ended_at: Option<i64>,
    /// Why it ended, in words.
    pub outcome: Option<String>,
    /// The revision that put the stable policy back for everyone (halted, aborted).
    pub revert_revision: Option<u64>,
}

impl RolloutRow {
    /// Whether it is in progress (`running` or `paused`).
    pub fn active(&self) -> bool {
        self.state.is_active()
    }

    fn from_row(r: &AnyRow) -> anyhow::Result<Self> {
        let plan: String = r.try_get("plan")?;
        Ok(RolloutRow {
            id: r.try_get("id")?,
            environment: r.try_get("environment")?,
            service: r.try_get("service")?,
            state: RolloutState::parse(r.try_get("state")?)?,
            stable_revision: r.try_get::<i64, _>("stable_revision")? as u64,
            candidate_revision: r.try_get::<i64, _>("candidate_revision")? as u64,
            base_policy: r.try_get("base_policy")?,
            plan: serde_json::from_str(&plan)?,
            stage: r.try_get::<i64, _>("stage")? as usize,
            threshold: r.try_get::<i64, _>("threshold")? as u64,
            stage_started_at: r.try_get("stage_started_at")?,
            version: r.try_get("version")?,
            created_at: r.try_get("created_at")?,
            created_by: r.try_get("created_by")?,
            reason: r.try_get("reason")?,
            ended_at: r.try_get("ended_at")?,
            outcome: r.try_get("outcome")?,
            revert_revision: r.try_get::<Option<i64>, _>("revert_revision")?.map(|v| v as u64),
        })
    }
}

const COLUMNS: &str = "id, environment, service, state, stable_revision, candidate_revision, base_policy, plan, \
     stage, threshold, stage_started_at, version, created_at, created_by, reason, ended_at, outcome, revert_revision";

/// A rollout in progress with the stable snapshot it serves outside the cohort: what a
/// replica needs to choose an instance's revision without the database.
#[derive(Clone, Debug)]
pub struct Delivery {
    /// The service's newest snapshot (the candidate while a rollout is in progress).
    pub latest: Option<SnapshotRow>,
    /// The service's newest rollout (in progress or ended) and, while in progress, its
    /// stable snapshot.
    pub rollout: Option<(RolloutRow, Option<SnapshotRow>)>,
}

/// The rollout of `env`/`service` in progress, read inside a write's transaction.
pub(super) async fn active_in(
    conn: &mut AnyConnection,
    env: &str,
    service: &str,
) -> anyhow::Result<Option<RolloutRow>> {
    let sql = format!(
        "SELECT {COLUMNS} FROM rollouts WHERE environment = $1 AND service = $2 AND state IN ('running', 'paused')"
    );
    let row = sqlx::query(sqlx::AssertSqlSafe(sql)).bind(env).bind(service).fetch_optional(conn).await?;
    row.map(|r| RolloutRow::from_row(&r)).transpose()
}

/// Rollout `id`, read inside a write's transaction.
pub(super) async fn row_in(conn: &mut AnyConnection, id: i64) -> anyhow::Result<Option<RolloutRow>> {
    let sql = format!("SELECT {COLUMNS} FROM rollouts WHERE id = $1");
    let row = sqlx::query(sqlx::AssertSqlSafe(sql)).bind(id).fetch_optional(conn).await?;
    row.map(|r| RolloutRow::from_row(&r)).transpose()
}

/// The environment's rollout setting, read inside a write's transaction.
pub(super) async fn settings_in(conn: &mut AnyConnection, env: &str) -> anyhow::Result<RolloutSettings> {
    let row = sqlx::query("SELECT body FROM rollout_settings WHERE environment = $1")
        .bind(env)
        .fetch_optional(conn)
        .await?;
    match row {
        Some(r) => Ok(serde_json::from_str(&r.try_get::<String, _>("body")?)?),
        None => Ok(RolloutSettings::default()),
    }
}

/// How many instances of `env`/`service` are connected now (their replica's lease runs),
/// read inside a write's transaction.
pub(super) async fn connected_in(conn: &mut AnyConnection, env: &str, service: &str) -> anyhow::Result<u64> {
    let row = sqlx::query(
        "SELECT COUNT(*) AS n FROM agents WHERE environment = $1 AND service = $2 AND connected <> 0 \
         AND lease_until > $3",
    )
    .bind(env)
    .bind(service)
    .bind(now_ms())
    .fetch_one(conn)
    .await?;
    Ok(row.try_get::<i64, _>("n")? as u64)
}

/// What a rollout's start records.
pub(super) struct NewRollout<'a> {
    pub env: &'a str,
    pub service: &'a str,
    pub stable_revision: u64,
    pub candidate_revision: u64,
    pub base_policy: &'a Policy,
    pub plan: &'a Plan,
    pub now: i64,
    pub actor: &'a str,
    pub reason: &'a str,
}

/// Inserts a rollout in progress at its first stage; returns its id.
pub(super) async fn insert_in(conn: &mut AnyConnection, r: NewRollout<'_>) -> anyhow::Result<i64> {
    let row = sqlx::query(
        "INSERT INTO rollouts (environment, service, state, stable_revision, candidate_revision, base_policy, plan, \
         stage, threshold, stage_started_at, version, created_at, created_by, reason) \
         VALUES ($1, $2, 'running', $3, $4, $5, $6, 0, $7, $8, 1, $8, $9, $10) RETURNING id",
    )
    .bind(r.env)
    .bind(r.service)
    .bind(r.stable_revision as i64)
    .bind(r.candidate_revision as i64)
    .bind(serde_json::to_string(r.base_policy)?)
    .bind(serde_json::to_string(r.plan)?)
    .bind(r.plan.stage_threshold(0) as i64)
    .bind(r.now)
    .bind(r.actor)
    .bind(r.reason)
    .fetch_one(conn)
    .await?;
    Ok(row.try_get("id")?)
}

/// Moves rollout `id`'s two revisions (an immediate change written during it).
pub(super) async fn move_revisions_in(
    conn: &mut AnyConnection,
    id: i64,
    stable: u64,
    candidate: u64,
) -> anyhow::Result<()> {
    sqlx::query(
        "UPDATE rollouts SET stable_revision = $1, candidate_revision = $2, version = version + 1 WHERE id = $3",
    )
    .bind(stable as i64)
    .bind(candidate as i64)
    .bind(id)
    .execute(conn)
    .await?;
    Ok(())
}

/// Ends rollout `id` as `state` with `outcome`; `revert` is the revision that put the
/// stable policy back, if one was written.
pub(super) async fn end_in(
    conn: &mut AnyConnection,
    id: i64,
    state: RolloutState,
    outcome: &str,
    revert: Option<u64>,
    now: i64,
) -> anyhow::Result<()> {
    sqlx::query(
        "UPDATE rollouts SET state = $1, outcome = $2, revert_revision = $3, ended_at = $4, version = version + 1 \
         WHERE id = $5",
    )
    .bind(state.as_str())
    .bind(outcome)
    .bind(revert.map(|r| r as i64))
    .bind(now)
    .bind(id)
    .execute(conn)
    .await?;
    Ok(())
}

/// Tells the other replicas (PostgreSQL) that the rollout of a service changed.
pub(super) async fn notify_in(
    conn: &mut AnyConnection,
    backend: Backend,
    env: &str,
    service: &str,
) -> anyhow::Result<()> {
    if backend == Backend::Postgres {
        let payload =
            serde_json::json!({"environment": env, "service": service, "rollout": true}).to_string();
        sqlx::query("SELECT pg_notify($1, $2)").bind(NOTIFY_CHANNEL).bind(payload).execute(conn).await?;
    }
    Ok(())
}

/// A change of a rollout in progress that makes no revision (a stage, a pause, the end).
#[derive(Clone, Debug)]
pub enum Step {
    /// The next stage starts with this threshold.
    Advance {
        threshold: u64,
    },
    /// The current stage's cohort widens to this threshold (a stage in instances).
    Widen {
        threshold: u64,
    },
    Pause,
    Resume,
    /// The last stage baked: the candidate is everyone's.
    Complete,
}

impl Reader {
    /// The rollout with this id.
    pub async fn rollout(&self, id: i64) -> anyhow::Result<Option<RolloutRow>> {
        let sql = format!("SELECT {COLUMNS} FROM rollouts WHERE id = $1");
        let row = sqlx::query(sqlx::AssertSqlSafe(sql)).bind(id).fetch_optional(&self.pool).await?;
        row.map(|r| RolloutRow::from_row(&r)).transpose()
    }

    /// Rollouts of a service (`service` given) or of an environment, newest first.
    pub async fn rollouts(
        &self,
        env: &str,
        service: Option<&str>,
        limit: i64,
    ) -> anyhow::Result<Vec<RolloutRow>> {
        let sql = format!(
            "SELECT {COLUMNS} FROM rollouts WHERE environment = $1 AND ($2 = '' OR service = $2) \
             ORDER BY id DESC LIMIT $3"
        );
        let rows = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(env)
            .bind(service.unwrap_or(""))
            .bind(limit)
            .fetch_all(&self.pool)
            .await?;
        rows.iter().map(RolloutRow::from_row).collect()
    }

    /// Every rollout in progress.
    pub async fn active_rollouts(&self) -> anyhow::Result<Vec<RolloutRow>> {
        let sql = format!("SELECT {COLUMNS} FROM rollouts WHERE state IN ('running', 'paused') ORDER BY id");
        let rows = sqlx::query(sqlx::AssertSqlSafe(sql)).fetch_all(&self.pool).await?;
        rows.iter().map(RolloutRow::from_row).collect()
    }

    /// The newest snapshot of a service and its newest rollout (with the stable snapshot
    /// while in progress), read in one transaction so they agree: a rollout that started
    /// or ended is seen with the revision that started or ended it.
    pub async fn delivery(&self, env: &str, service: &str) -> anyhow::Result<Delivery> {
        let mut tx = self.pool.begin().await?;
        if self.backend == Backend::Postgres {
            sqlx::query("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ").execute(&mut *tx).await?;
        }
        let snapshot = |rev: Option<u64>| {
            let sql = match rev {
                Some(_) => {
                    "SELECT environment, service, revision, hash, body, created_at FROM revisions \
                     WHERE environment = $1 AND service = $2 AND revision = $3"
                }
                None => {
                    "SELECT environment, service, revision, hash, body, created_at FROM revisions \
                     WHERE environment = $1 AND service = $2 AND revision > $3 ORDER BY revision DESC LIMIT 1"
                }
            };
            sqlx::query(sql).bind(env).bind(service).bind(rev.map_or(-1, |r| r as i64))
        };
        let latest =
            snapshot(None).fetch_optional(&mut *tx).await?.map(|r| SnapshotRow::from_row(&r)).transpose()?;
        let sql = format!(
            "SELECT {COLUMNS} FROM rollouts WHERE environment = $1 AND service = $2 ORDER BY id DESC LIMIT 1"
        );
        let row =
            sqlx::query(sqlx::AssertSqlSafe(sql)).bind(env).bind(service).fetch_optional(&mut *tx).await?;
        let rollout = match row.map(|r| RolloutRow::from_row(&r)).transpose()? {
            Some(r) if r.active() => {
                let stable = snapshot(Some(r.stable_revision))
                    .fetch_optional(&mut *tx)
                    .await?
                    .map(|r| SnapshotRow::from_row(&r))
                    .transpose()?;
                Some((r, stable))
            }
            Some(r) => Some((r, None)),
            None => None,
        };
        tx.commit().await?;
        Ok(Delivery { latest, rollout })
    }

    /// The rollout setting of an environment (the default when none was set).
    pub async fn rollout_settings(&self, env: &str) -> anyhow::Result<RolloutSettings> {
        let mut conn = self.pool.acquire().await?;
        settings_in(&mut conn, env).await
    }

    /// NACKs of `revision` of a service by instance (one per instance).
    pub async fn nacking_instances(
        &self,
        env: &str,
        service: &str,
        revision: u64,
    ) -> anyhow::Result<Vec<String>> {
        let rows = sqlx::query(
            "SELECT DISTINCT instance_id FROM nacks WHERE environment = $1 AND service = $2 AND revision = $3",
        )
        .bind(env)
        .bind(service)
        .bind(revision as i64)
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(|r| Ok(r.try_get("instance_id")?)).collect()
    }

    /// The instances that acknowledged `revision` of a service (its ACK history).
    pub async fn acking_instances(
        &self,
        env: &str,
        service: &str,
        revision: u64,
    ) -> anyhow::Result<Vec<String>> {
        let rows = sqlx::query(
            "SELECT instance_id FROM acks WHERE environment = $1 AND service = $2 AND revision = $3 ORDER BY instance_id",
        )
        .bind(env)
        .bind(service)
        .bind(revision as i64)
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(|r| Ok(r.try_get("instance_id")?)).collect()
    }
}

impl Store {
    /// Sets the rollout setting of an environment, with `audit` in the same transaction.
    pub async fn set_rollout_settings(
        &self,
        env: &str,
        settings: &RolloutSettings,
        audit: &AuditRow,
    ) -> anyhow::Result<()> {
        self.set_environment_setting(
            "INSERT INTO rollout_settings (environment, body, updated_at, updated_by) VALUES ($1, $2, $3, $4) \
             ON CONFLICT (environment) DO UPDATE SET body = excluded.body, updated_at = excluded.updated_at, \
             updated_by = excluded.updated_by",
            env,
            serde_json::to_string(settings)?,
            audit,
        )
        .await
    }

    /// Takes `step` on rollout `id` if it is still at `version` (another replica or an
    /// operator may have moved it): returns the row after the step, `None` when it moved.
    /// Audited with `audit` (its revision set to the candidate) in the same transaction.
    pub async fn step_rollout(
        &self,
        id: i64,
        version: i64,
        step: Step,
        audit: &AuditRow,
    ) -> anyhow::Result<Option<RolloutRow>> {
        let _g = self.write_guard().await;
        let mut tx = self.pool.begin().await?;
        let now = now_ms();
        // Each statement names the rollout and its version last; the values before are the step's.
        let (sql, values): (&str, Vec<i64>) = match step {
            Step::Advance { threshold } => (
                "UPDATE rollouts SET stage = stage + 1, threshold = $1, stage_started_at = $2, version = version + 1 \
                 WHERE id = $3 AND version = $4 AND state = 'running'",
                vec![threshold as i64, now],
            ),
            Step::Widen { threshold } => (
                "UPDATE rollouts SET threshold = $1, version = version + 1 \
                 WHERE id = $2 AND version = $3 AND state IN ('running', 'paused')",
                vec![threshold as i64],
            ),
            Step::Pause => (
                "UPDATE rollouts SET state = 'paused', version = version + 1 \
                 WHERE id = $1 AND version = $2 AND state = 'running'",
                vec![],
            ),
            Step::Resume => (
                "UPDATE rollouts SET state = 'running', stage_started_at = $1, version = version + 1 \
                 WHERE id = $2 AND version = $3 AND state = 'paused'",
                vec![now],
            ),
            Step::Complete => (
                "UPDATE rollouts SET state = 'completed', ended_at = $1, outcome = 'completed: every instance has the candidate', \
                 version = version + 1 WHERE id = $2 AND version = $3 AND state IN ('running', 'paused')",
                vec![now],
            ),
        };
        let mut q = sqlx::query(sql);
        for v in values {
            q = q.bind(v);
        }
        let done = q.bind(id).bind(version).execute(&mut *tx).await?;
        if done.rows_affected() == 0 {
            return Ok(None);
        }
        let sql = format!("SELECT {COLUMNS} FROM rollouts WHERE id = $1");
        let row = sqlx::query(sqlx::AssertSqlSafe(sql)).bind(id).fetch_one(&mut *tx).await?;
        let row = RolloutRow::from_row(&row)?;
        let audit = AuditRow { at: now, revision: Some(row.candidate_revision as i64), ..audit.clone() };
        audit::insert_audit(&mut tx, &audit).await?;
        notify_in(&mut tx, self.backend, &row.environment, &row.service).await?;
        tx.commit().await?;
        Ok(Some(row))
    }
}

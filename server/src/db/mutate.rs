//! The single path that writes a revision: everything an agent receives changes here. The
//! service's parts it edits and their rows are `parts.rs`; what its audit row says it
//! changed is `audit.rs`.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::fmt::Display;

use levee_agent::policy::{
    Flag, SCHEMA_VERSION, ServiceConfig, ValidationErrors, accept, canonical_json, content_hash,
};
use sqlx::{AnyConnection, Row};

use super::audit::insert_audit;
use super::parts::{current_revision, faults_allowed, load_current, load_parts, store_parts};
use super::rollouts::{self, NewRollout, RolloutRow, RolloutState, Staging};
use super::{
    AuditDiff, AuditOutcome, AuditRow, Backend, ChangeKind, NOTIFY_CHANNEL, Parts, SnapshotRow, Store,
    Subject, now_ms, services,
};

/// Who is changing what, why, and through which door: the audit row's `actor`, `via`,
/// `request_id` and `reason`.
#[derive(Clone, Debug)]
pub struct AuditCtx {
    /// A username, `token:<name>`, or `levee` for the server.
    pub actor: String,
    pub via: super::Via,
    /// The request's `x-request-id`; empty outside a request.
    pub request_id: String,
    /// Why; never empty.
    pub reason: String,
}

/// Result of a committed mutation.
#[derive(Clone, Debug)]
pub struct Committed {
    /// The snapshot now current (new, or the unchanged current one).
    pub snapshot: SnapshotRow,
    /// `false` when the edit changed nothing (no revision was created).
    pub changed: bool,
    /// The rollout the write started, moved or ended, as it is after the write, with the
    /// stable snapshot it serves outside its cohort while in progress: published to the
    /// hub with the snapshot.
    pub rollout: Option<(RolloutRow, Option<SnapshotRow>)>,
}

/// Why a revision was not written. `E` is the edit's own refusal.
#[derive(Debug, thiserror::Error)]
pub enum MutateError<E = Infallible> {
    /// The environment does not exist.
    #[error("no environment {0:?}")]
    NoEnvironment(String),
    /// The service does not exist.
    #[error("no service {service:?} in environment {env:?}")]
    NoService { env: String, service: String },
    /// The service is not at the expected revision.
    #[error("revision conflict: expected {expected}, current {current}")]
    Conflict {
        /// The revision the change was based on.
        expected: u64,
        /// The revision stored now.
        current: u64,
    },
    /// The edit refused (bad target, missing entry…).
    #[error("{0}")]
    Refused(E),
    /// The resulting configuration does not validate, or is one agents would refuse
    /// (`levee_agent::policy::accept`: over the size or depth budget).
    #[error("{0}")]
    Invalid(ValidationErrors),
    /// A staged rollout of the service's policy is in progress and the write would change
    /// the policy (promote or abort it first), or the rollout a revert ends is over.
    #[error("{0}")]
    Rollout(String),
    /// The database failed; the cause is for the log.
    #[error(transparent)]
    Db(#[from] anyhow::Error),
}

impl<E> From<sqlx::Error> for MutateError<E> {
    fn from(e: sqlx::Error) -> Self {
        MutateError::Db(e.into())
    }
}

/// Description of one mutation for the audit log.
#[derive(Clone, Debug)]
pub struct Change<'a> {
    pub env: &'a str,
    pub service: &'a str,
    /// The audit row's `action`: `policy.update`, `flag.set`, …
    pub action: &'a str,
    /// The audit row's `target`: what inside the service (`flag checkout.enabled`, `policy`).
    pub target: &'a str,
    /// The target as a part of the service, whose value a refused attempt records as its
    /// `before` and `after` (unchanged).
    pub subject: Subject,
    /// The revision the change was based on (`If-Match`); `None` for whatever is current.
    pub expected: Option<u64>,
    /// Whether a policy change is staged (a rollout) or reaches every instance at once.
    pub staging: Staging,
}

/// The audit row of a write that went through (`ok`), at `revision`.
fn written_row(ctx: &AuditCtx, change: &Change<'_>, now: i64, diff: AuditDiff, revision: i64) -> AuditRow {
    AuditRow {
        at: now,
        actor: ctx.actor.clone(),
        via: ctx.via,
        request_id: ctx.request_id.clone(),
        action: change.action.to_string(),
        environment: Some(change.env.to_string()),
        service: Some(change.service.to_string()),
        target: change.target.to_string(),
        outcome: AuditOutcome::Ok,
        reason: ctx.reason.clone(),
        before: diff.before,
        after: diff.after,
        detail: diff.detail,
        revision: Some(revision),
        ..Default::default()
    }
}

/// Where a revision write starts: the transaction holding the service's counter row, the
/// revision being written and the parts it replaces.
struct OpenRevision<'t> {
    tx: sqlx::Transaction<'t, sqlx::Any>,
    revision: u64,
    old: Parts,
    now: i64,
}

impl Store {
    /// Applies `edit` to a service's parts in one transaction: bumps the revision counter
    /// row (checking `expected` for optimistic concurrency), then writes the revision
    /// (`write_revision`, the one path that writes a revision).
    ///
    /// `edit` returns what it changed, for the audit row. When the edit changes nothing,
    /// nothing is written and `changed` is false.
    ///
    /// Refused attempts (conflict, invalid, refused by the edit) are audited too, with
    /// their outcome, the error as `detail`, and the value of `change.subject` as stored
    /// (when the attempt was refused) as both `before` and `after`: nothing changed.
    pub async fn mutate<E, F>(
        &self,
        change: Change<'_>,
        ctx: &AuditCtx,
        edit: F,
    ) -> Result<Committed, MutateError<E>>
    where
        E: Display,
        F: FnOnce(&mut Parts) -> Result<AuditDiff, E>,
    {
        let _t = super::timed("mutate");
        let mut seen = None;
        let result = self.mutate_inner(&change, ctx, &mut seen, edit).await;
        let outcome = match &result {
            Err(MutateError::Conflict { .. }) => Some(AuditOutcome::Conflict),
            Err(MutateError::Invalid(_) | MutateError::Refused(_) | MutateError::Rollout(_)) => {
                Some(AuditOutcome::Rejected)
            }
            _ => None,
        };
        if let (Some(outcome), Err(e)) = (outcome, &result) {
            let value = seen.and_then(|p: Parts| change.subject.value(&p)).map(|v| v.to_string());
            let row = AuditRow {
                at: now_ms(),
                actor: ctx.actor.clone(),
                via: ctx.via,
                request_id: ctx.request_id.clone(),
                action: change.action.to_string(),
                environment: Some(change.env.to_string()),
                service: Some(change.service.to_string()),
                target: change.target.to_string(),
                outcome,
                reason: ctx.reason.clone(),
                before: value.clone(),
                after: value,
                detail: Some(e.to_string()),
                revision: None,
                ..Default::default()
            };
            if let Err(e) = self.append_audit(&row).await {
                tracing::error!(error = ?e, "could not audit a refused change");
            }
        }
        result
    }

    /// [`Store::mutate`]; a refused attempt leaves the parts as stored when it was refused
    /// in `seen`.
    async fn mutate_inner<E, F>(
        &self,
        change: &Change<'_>,
        ctx: &AuditCtx,
        seen: &mut Option<Parts>,
        edit: F,
    ) -> Result<Committed, MutateError<E>>
    where
        F: FnOnce(&mut Parts) -> Result<AuditDiff, E>,
    {
        let (env, service) = (change.env, change.service);
        let guard = self.write_guard().await;
        let mut tx = self.pool.begin().await?;
        let now = now_ms();
        // The counter row is written first: the transaction holds the write lock from here on.
        let bumped = match change.expected {
            Some(exp) => {
                sqlx::query(
                    "UPDATE services SET revision = revision + 1, updated_at = $1 \
                 WHERE environment = $2 AND name = $3 AND revision = $4 AND deleted_at IS NULL \
                 RETURNING revision, policy",
                )
                .bind(now)
                .bind(env)
                .bind(service)
                .bind(exp as i64)
                .fetch_optional(&mut *tx)
                .await?
            }
            None => {
                sqlx::query(
                    "UPDATE services SET revision = revision + 1, updated_at = $1 \
                 WHERE environment = $2 AND name = $3 AND deleted_at IS NULL RETURNING revision, policy",
                )
                .bind(now)
                .bind(env)
                .bind(service)
                .fetch_optional(&mut *tx)
                .await?
            }
        };
        let no_service = || MutateError::NoService { env: env.to_string(), service: service.to_string() };
        let Some(bumped) = bumped else {
            let current = current_revision(&mut tx, env, service).await?;
            return match (current, change.expected) {
                (Some(current), Some(expected)) => {
                    *seen = load_current(&mut tx, env, service).await?;
                    Err(MutateError::Conflict { expected, current })
                }
                _ => Err(no_service()),
            };
        };
        let revision = bumped.try_get::<i64, _>("revision")? as u64;
        let policy_json: String = bumped.try_get("policy")?;
        let allow = faults_allowed(&mut tx, env).await?;
        let old = load_parts(&mut tx, env, service, &policy_json, allow).await?;
        match self
            .write_revision(OpenRevision { tx, revision, old, now }, change, ctx, true, seen, edit)
            .await?
        {
            Some(committed) => Ok(committed),
            None => {
                // Nothing changed: the counter bump was rolled back; answer with the current snapshot.
                drop(guard);
                let snapshot = self.latest_snapshot(env, service).await?.ok_or_else(no_service)?;
                Ok(Committed { snapshot, changed: false, rollout: None })
            }
        }
    }

    /// Creates a service with its first revision (1) holding `parts`, audited with `diff`.
    /// Returns `None` when a service of that name exists (nothing is written).
    ///
    /// A service of that name that was deleted comes back with the next revision of its
    /// old counter instead of 1: its agents, which never apply a lower revision than the
    /// one they hold, take the new configuration.
    pub async fn create_service(
        &self,
        change: Change<'_>,
        description: &str,
        parts: Parts,
        diff: AuditDiff,
        ctx: &AuditCtx,
    ) -> Result<Option<Committed>, MutateError> {
        let (env, name) = (change.env, change.service);
        let _t = super::timed("create_service");
        let _g = self.write_guard().await;
        let mut tx = self.pool.begin().await?;
        let now = now_ms();
        let env_exists = sqlx::query("SELECT allow_faults FROM environments WHERE name = $1")
            .bind(env)
            .fetch_optional(&mut *tx)
            .await?;
        if env_exists.is_none() {
            return Err(MutateError::NoEnvironment(env.to_string()));
        }
        let inserted = sqlx::query(
            "INSERT INTO services (environment, name, description, revision, policy, created_at, updated_at) \
             VALUES ($1, $2, $3, $4, $5, $6, $7) ON CONFLICT (environment, name) DO NOTHING",
        )
        .bind(env)
        .bind(name)
        .bind(description)
        .bind(1i64)
        .bind(serde_json::to_string(&parts.policy).map_err(|e| MutateError::Db(e.into()))?)
        .bind(now)
        .bind(now)
        .execute(&mut *tx)
        .await?;
        let revision = if inserted.rows_affected() == 1 {
            1
        } else {
            let revived = sqlx::query(
                "UPDATE services SET deleted_at = NULL, description = $1, policy = $2, revision = revision + 1, \
                 updated_at = $3 WHERE environment = $4 AND name = $5 AND deleted_at IS NOT NULL RETURNING revision",
            )
            .bind(description)
            .bind(serde_json::to_string(&parts.policy).map_err(|e| MutateError::Db(e.into()))?)
            .bind(now)
            .bind(env)
            .bind(name)
            .fetch_optional(&mut *tx)
            .await?;
            match revived {
                Some(row) => row.try_get::<i64, _>("revision")? as u64,
                None => return Ok(None),
            }
        };
        // The row holds the policy already; the first revision adds everything else.
        let old = Parts {
            policy: parts.policy.clone(),
            ..Parts::from_config(ServiceConfig::default(), parts.faults_allowed)
        };
        let start = OpenRevision { tx, revision, old, now };
        let written = self
            .write_revision(start, &change, ctx, false, &mut None, |p| {
                *p = parts;
                Ok::<_, Infallible>(diff)
            })
            .await?;
        Ok(written)
    }

    /// Deletes service `name` of `env` if it is at revision `expected` (`None`: whatever
    /// it is at), with `audit` in the same transaction. The service leaves every list and
    /// read, its flags, fault rules and breaker overrides are removed; its row keeps the
    /// revision counter and its history stays (see [`Store::create_service`]). Agents of
    /// the service keep the last configuration they applied.
    pub async fn delete_service(
        &self,
        env: &str,
        name: &str,
        expected: Option<u64>,
        audit: &AuditRow,
    ) -> Result<(), MutateError> {
        let _g = self.write_guard().await;
        let mut tx = self.pool.begin().await?;
        let now = now_ms();
        let Some(current) = current_revision(&mut tx, env, name).await? else {
            return Err(MutateError::NoService { env: env.to_string(), service: name.to_string() });
        };
        if let Some(expected) = expected
            && expected != current
        {
            return Err(MutateError::Conflict { expected, current });
        }
        sqlx::query(
            "UPDATE services SET deleted_at = $1, updated_at = $1 WHERE environment = $2 AND name = $3",
        )
        .bind(now)
        .bind(env)
        .bind(name)
        .execute(&mut *tx)
        .await?;
        // A rollout in progress ends with the service: agents keep what they applied, and a
        // service created again under the name starts without one.
        if let Some(r) = rollouts::active_in(&mut tx, env, name).await? {
            rollouts::end_in(
                &mut tx,
                r.id,
                RolloutState::Aborted,
                "aborted: the service was deleted",
                None,
                now,
            )
            .await?;
            rollouts::notify_in(&mut tx, self.backend, env, name).await?;
        }
        for table in ["flags", "faults", "breaker_overrides", "levers", "flag_restores"] {
            sqlx::query(sqlx::AssertSqlSafe(format!(
                "DELETE FROM {table} WHERE environment = $1 AND service = $2"
            )))
            .bind(env)
            .bind(name)
            .execute(&mut *tx)
            .await?;
        }
        insert_audit(&mut tx, &AuditRow { at: now, revision: Some(current as i64), ..audit.clone() }).await?;
        tx.commit().await?;
        Ok(())
    }

    /// Sets the description of service `name` of `env` (text for people, not part of what
    /// agents receive, so no revision), with `audit` in the same transaction. Returns
    /// whether the service exists.
    pub async fn set_description(
        &self,
        env: &str,
        name: &str,
        description: &str,
        audit: &AuditRow,
    ) -> anyhow::Result<bool> {
        let _g = self.write_guard().await;
        let mut tx = self.pool.begin().await?;
        let updated = sqlx::query(
            "UPDATE services SET description = $1 WHERE environment = $2 AND name = $3 AND deleted_at IS NULL",
        )
        .bind(description)
        .bind(env)
        .bind(name)
        .execute(&mut *tx)
        .await?;
        if updated.rows_affected() == 0 {
            return Ok(false);
        }
        insert_audit(&mut tx, audit).await?;
        tx.commit().await?;
        Ok(true)
    }

    /// The one path that writes a revision, from `start`: applies `edit` to the parts,
    /// validates the whole configuration and refuses bytes agents would not accept
    /// (`levee_agent::policy::accept`), and — unless `skip_unchanged` finds the same hash
    /// as the newest revision, which rolls back and returns `None` — stores the changed
    /// parts, the snapshot with its hash, the audit row and, on PostgreSQL, a NOTIFY that
    /// is delivered after the commit. A refused edit or an invalid result leaves the parts
    /// it started from in `seen`.
    async fn write_revision<E, F>(
        &self,
        start: OpenRevision<'_>,
        change: &Change<'_>,
        ctx: &AuditCtx,
        skip_unchanged: bool,
        seen: &mut Option<Parts>,
        edit: F,
    ) -> Result<Option<Committed>, MutateError<E>>
    where
        F: FnOnce(&mut Parts) -> Result<AuditDiff, E>,
    {
        let OpenRevision { mut tx, revision, old, now } = start;
        let (env, service) = (change.env, change.service);
        let mut new = old.clone();
        let mut diff = match edit(&mut new) {
            Ok(diff) => diff,
            Err(e) => {
                *seen = Some(old);
                return Err(MutateError::Refused(e));
            }
        };
        let cfg = new.config();
        if let Err(v) = cfg.validate() {
            *seen = Some(old);
            return Err(MutateError::Invalid(v));
        }
        let body = canonical_json(&cfg);
        // The exact bytes agents will receive, judged by the agents' own rule (size and
        // depth budgets, decoding, validation): a revision an agent of this version would
        // reject is never stored. `validate()` above already named every bad field it sees.
        if let Err(e) = accept(SCHEMA_VERSION, &body) {
            *seen = Some(old);
            return Err(MutateError::Invalid(ValidationErrors(e.field_errors())));
        }
        let hash = content_hash(&body);
        let body = String::from_utf8(body).map_err(|e| MutateError::Db(e.into()))?;

        if skip_unchanged {
            let prev = sqlx::query(
                "SELECT hash FROM revisions WHERE environment = $1 AND service = $2 ORDER BY revision DESC LIMIT 1",
            )
            .bind(env)
            .bind(service)
            .fetch_optional(&mut *tx)
            .await?;
            if let Some(prev) = &prev
                && prev.try_get::<String, _>("hash")? == hash
            {
                // No new revision: the counter bump is rolled back. What a temporary flag
                // goes back to is the server's own and may still have changed (an apply
                // over a flip): stored on its own, under the same write guard; everything
                // else of `new` equals `old` (same hash).
                tx.rollback().await?;
                if old.restores != new.restores {
                    let mut tx = self.pool.begin().await?;
                    store_parts(&mut tx, env, service, &old, &new, now).await?;
                    // Audited like any write, its values being what each changed flag
                    // goes back to (null: nothing), at the revision still current.
                    let side = |p: &Parts| {
                        let keys = old.restores.keys().chain(new.restores.keys());
                        let changed = keys.filter(|k| old.restores.get(*k) != new.restores.get(*k));
                        let m: BTreeMap<&String, Option<&Flag>> =
                            changed.map(|k| (k, p.restores.get(k))).collect();
                        serde_json::json!({ "goes_back_to": m }).to_string()
                    };
                    let detail = "what flags under a temporary value go back to at their expiry; no new \
                                  revision (agents receive nothing new)";
                    let diff = AuditDiff {
                        before: Some(side(&old)),
                        after: Some(side(&new)),
                        detail: Some(detail.to_string()),
                    };
                    let audit = written_row(ctx, change, now, diff, revision as i64 - 1);
                    insert_audit(&mut tx, &audit).await?;
                    tx.commit().await?;
                }
                return Ok(None);
            }
        }

        // The rollout this write starts, continues (an immediate change during it) or ends.
        let lines = match self.rollout_lines(&mut tx, change, &old, &new).await {
            Ok(lines) => lines,
            Err(e) => {
                *seen = Some(old);
                return Err(e);
            }
        };
        let mut candidate = revision;
        let mut stable = None;
        if let Lines::Start(_) | Lines::Continue(_) = &lines {
            // Instances outside the cohort get this write over the policy they keep.
            let base = match &lines {
                Lines::Continue(r) => {
                    serde_json::from_str(&r.base_policy).map_err(|e| MutateError::Db(e.into()))?
                }
                _ => old.policy.clone(),
            };
            let stable_cfg = ServiceConfig { policy: base, ..cfg.clone() };
            let stable_body = canonical_json(&stable_cfg);
            if let Err(v) = stable_cfg.validate() {
                *seen = Some(old);
                return Err(MutateError::Invalid(v));
            }
            if let Err(e) = accept(SCHEMA_VERSION, &stable_body) {
                *seen = Some(old);
                return Err(MutateError::Invalid(ValidationErrors(e.field_errors())));
            }
            let stable_hash = content_hash(&stable_body);
            // The stable line so far: the rollout's, or the newest revision for a start.
            let prev = match &lines {
                Lines::Continue(r) => services::revision_in(&mut tx, env, service, r.stable_revision).await?,
                _ => sqlx::query(
                    "SELECT environment, service, revision, hash, body, created_at FROM revisions \
                     WHERE environment = $1 AND service = $2 ORDER BY revision DESC LIMIT 1",
                )
                .bind(env)
                .bind(service)
                .fetch_optional(&mut *tx)
                .await?
                .map(|r| SnapshotRow::from_row(&r))
                .transpose()?,
            };
            let prev = prev.map(|p| (p.revision, p.hash));
            match prev {
                Some((rev, hash)) if hash == stable_hash => stable = Some(rev),
                _ => {
                    // A revision of its own, below the candidate's: both lines move forward.
                    let body = String::from_utf8(stable_body).map_err(|e| MutateError::Db(e.into()))?;
                    insert_revision(&mut tx, env, service, revision, &stable_hash, &body, now, ctx).await?;
                    let bumped = sqlx::query(
                        "UPDATE services SET revision = revision + 1 WHERE environment = $1 AND name = $2 \
                         RETURNING revision",
                    )
                    .bind(env)
                    .bind(service)
                    .fetch_one(&mut *tx)
                    .await?;
                    candidate = bumped.try_get::<i64, _>("revision")? as u64;
                    stable = Some(revision);
                }
            }
        }
        let stable_revision = stable.unwrap_or(revision);
        let words = match &lines {
            Lines::None => None,
            Lines::Start(_) => Some(format!(
                "staged: instances outside the rollout's cohort keep the previous policy (revision \
                 {stable_revision}); the cohort gets revision {candidate}"
            )),
            Lines::Continue(r) => Some(format!(
                "delivered to every instance during rollout {}: revision {stable_revision} outside its cohort \
                 (the policy they keep), revision {candidate} in it",
                r.id
            )),
            Lines::End(r, _, outcome) => Some(format!("rollout {}: {outcome}", r.id)),
        };
        if let Some(words) = words {
            diff.detail = Some(match diff.detail.take() {
                Some(d) => format!("{d}; {words}"),
                None => words,
            });
        }

        store_parts(&mut tx, env, service, &old, &new, now).await?;
        insert_revision(&mut tx, env, service, candidate, &hash, &body, now, ctx).await?;
        insert_audit(&mut tx, &written_row(ctx, change, now, diff, candidate as i64)).await?;
        let rollout_id = match &lines {
            Lines::None => None,
            Lines::Start(plan) => Some(
                rollouts::insert_in(
                    &mut tx,
                    NewRollout {
                        env,
                        service,
                        stable_revision,
                        candidate_revision: candidate,
                        base_policy: &old.policy,
                        plan,
                        now,
                        actor: &ctx.actor,
                        reason: &ctx.reason,
                    },
                )
                .await?,
            ),
            Lines::Continue(r) => {
                rollouts::move_revisions_in(&mut tx, r.id, stable_revision, candidate).await?;
                Some(r.id)
            }
            Lines::End(r, state, outcome) => {
                rollouts::end_in(&mut tx, r.id, *state, outcome, Some(candidate), now).await?;
                Some(r.id)
            }
        };
        if self.backend == Backend::Postgres {
            let payload = serde_json::json!({"environment": env, "service": service, "revision": candidate})
                .to_string();
            sqlx::query("SELECT pg_notify($1, $2)")
                .bind(NOTIFY_CHANNEL)
                .bind(payload)
                .execute(&mut *tx)
                .await?;
        }
        let rollout = match rollout_id {
            Some(id) => {
                let row = rollouts::row_in(&mut tx, id).await?;
                let stable_snap = match (&stable, &row) {
                    (Some(rev), Some(r)) if r.active() => {
                        services::revision_in(&mut tx, env, service, *rev).await?
                    }
                    _ => None,
                };
                row.map(|r| (r, stable_snap))
            }
            None => None,
        };
        tx.commit().await?;
        let snapshot = SnapshotRow {
            environment: env.to_string(),
            service: service.to_string(),
            revision: candidate,
            hash,
            body,
            created_at: now,
        };
        Ok(Some(Committed { snapshot, changed: true, rollout }))
    }

    /// What a write does to the service's rollout: refuses a policy change while one is
    /// in progress (unless it is the revert that ends it), and starts one for a staged
    /// policy change.
    async fn rollout_lines<E>(
        &self,
        tx: &mut AnyConnection,
        change: &Change<'_>,
        old: &Parts,
        new: &Parts,
    ) -> Result<Lines, MutateError<E>> {
        let (env, service) = (change.env, change.service);
        let active = rollouts::active_in(tx, env, service).await?;
        let policy_changed = old.policy != new.policy;
        Ok(match (&change.staging, active) {
            (Staging::Ends { id, state, outcome }, Some(r)) if r.id == *id => {
                Lines::End(r, *state, outcome.clone())
            }
            (Staging::Ends { id, .. }, _) => {
                return Err(MutateError::Rollout(format!("rollout {id} is no longer in progress")));
            }
            (_, Some(r)) if policy_changed => {
                return Err(MutateError::Rollout(format!(
                    "a staged rollout of the policy of {service:?} is in progress (rollout {}, stage {} of {}): \
                     promote or abort it before changing the policy (POST \
                     /api/v1/environments/{env}/rollouts/{}/promote or /abort)",
                    r.id,
                    r.stage + 1,
                    r.plan.stages.len(),
                    r.id
                )));
            }
            (_, Some(r)) => Lines::Continue(r),
            (Staging::Staged(plan), None) if policy_changed => match plan {
                Some(plan) => Lines::Start(plan.clone()),
                None => Lines::Start(rollouts::settings_in(tx, env).await?.plan),
            },
            (Staging::Default, None) if policy_changed => {
                let settings = rollouts::settings_in(tx, env).await?;
                if settings.stages(ChangeKind::Policy)
                    && rollouts::connected_in(tx, env, service).await? >= rollouts::MIN_INSTANCES_TO_STAGE
                {
                    Lines::Start(settings.plan)
                } else {
                    Lines::None
                }
            }
            _ => Lines::None,
        })
    }
}

/// What a write does to a rollout (see `Store::rollout_lines`).
enum Lines {
    None,
    Start(rollouts::Plan),
    Continue(RolloutRow),
    End(RolloutRow, RolloutState, String),
}

/// Inserts one revision row.
#[allow(clippy::too_many_arguments)]
async fn insert_revision(
    tx: &mut AnyConnection,
    env: &str,
    service: &str,
    revision: u64,
    hash: &str,
    body: &str,
    now: i64,
    ctx: &AuditCtx,
) -> anyhow::Result<()> {
    sqlx::query(
        "INSERT INTO revisions (environment, service, revision, hash, body, created_at, actor, reason) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8)",
    )
    .bind(env)
    .bind(service)
    .bind(revision as i64)
    .bind(hash)
    .bind(body)
    .bind(now)
    .bind(&ctx.actor)
    .bind(&ctx.reason)
    .execute(tx)
    .await?;
    Ok(())
}

//! The fleet as the replicas see it: one row per connected agent (its status report, the
//! revision it ACKed), the replicas' leases, ACK propagation and NACKs per revision.

use sqlx::Row;

use super::{
    AckRow, AgentAck, AgentRow, AgentUpsert, Backend, NackRow, Propagation, Reader, Store, now_ms,
    percentile, push_values, timed,
};

/// Most agent rows per upsert statement of the fleet writer (12 parameters each: well
/// under SQLite's 32,766 and PostgreSQL's 65,535).
pub const FLEET_ROWS_PER_STATEMENT: usize = 500;
/// Most rows per statement of the fleet writer on SQLite, where each statement is its own
/// transaction and holds the store's write lock: a revision waits for at most this many
/// rows (500 took 50–200 ms on the loaded 2-core VM, 100 a fifth of it).
pub const FLEET_ROWS_PER_SQLITE_TURN: usize = 100;

/// Most counters of one agent status report stored in [`AgentRow::status`] (the sync
/// writer keeps no more; the service page reads no more, whatever an older row holds).
pub const MAX_STATUS_COUNTERS: usize = 4096;
/// Longest counter name of a stored status report, in bytes (a longer one is dropped).
pub const MAX_COUNTER_NAME: usize = 512;

/// Most ACKs a [`Propagation`] lists one by one (the fastest); its counts and percentiles
/// cover them all.
pub const MAX_ACKS_LISTED: usize = 1000;

/// How long an agent whose stream closed stays in the fleet list (UI and API) after it was
/// last seen; a reconnect under the same instance id brings it back.
pub const DISCONNECTED_AGENTS_KEPT_FOR: std::time::Duration = std::time::Duration::from_secs(3600);

impl Reader {
    /// Agents of a service (every connected one: a fleet of 10,000 is counted whole, and
    /// those disconnected for less than [`DISCONNECTED_AGENTS_KEPT_FOR`]), most recently
    /// seen first. `connected` is true only while the holder's lease runs.
    pub async fn agents(&self, env: &str, service: &str) -> anyhow::Result<Vec<AgentRow>> {
        let shown_since = now_ms() - DISCONNECTED_AGENTS_KEPT_FOR.as_millis() as i64;
        let rows = sqlx::query(
            "SELECT environment, service, instance_id, agent_version, connected, connected_at, last_seen, \
             applied_revision, applied_hash, status, lease_until FROM agents WHERE environment = $1 AND service = $2 \
             AND (connected <> 0 OR last_seen >= $3) ORDER BY last_seen DESC",
        )
        .bind(env)
        .bind(service)
        .bind(shown_since)
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(AgentRow::from_row).collect()
    }

    /// How far revision `revision` of a service has reached ([`Propagation`]), or `None`
    /// when it was never stored.
    pub async fn propagation(
        &self,
        env: &str,
        service: &str,
        revision: u64,
    ) -> anyhow::Result<Option<Propagation>> {
        let Some(rev) = self.revision(env, service, revision).await? else { return Ok(None) };
        let rows = sqlx::query(
            "SELECT instance_id, acked_at FROM acks WHERE environment = $1 AND service = $2 AND revision = $3 \
             ORDER BY acked_at",
        )
        .bind(env)
        .bind(service)
        .bind(revision as i64)
        .fetch_all(&self.pool)
        .await?;
        let mut acks = Vec::with_capacity(rows.len());
        for r in &rows {
            let acked_at: i64 = r.try_get("acked_at")?;
            acks.push(AgentAck {
                instance_id: r.try_get("instance_id")?,
                acked_at,
                latency: ms(acked_at - rev.created_at),
            });
        }
        // Every ACK counts in `acked` and the percentiles; the list itself is cut to the
        // fastest MAX_ACKS_LISTED, so a fleet of tens of thousands stays a small answer.
        let mut lat: Vec<i64> = acks.iter().map(|a| a.latency.as_millis() as i64).collect();
        lat.sort_unstable();
        let acked = acks.len();
        acks.truncate(MAX_ACKS_LISTED);
        let agents = self.agents(env, service).await?;
        let live = agents.iter().filter(|a| a.connected);
        Ok(Some(Propagation {
            environment: env.to_string(),
            service: service.to_string(),
            revision,
            committed_at: rev.created_at,
            applied: live.clone().filter(|a| a.applied_revision >= revision).count(),
            connected: live.count(),
            acked,
            p50: percentile(&lat, 50.0).map(ms),
            p99: percentile(&lat, 99.0).map(ms),
            max: lat.last().copied().map(ms),
            acks,
        }))
    }

    /// NACKs of a service, newest first (the newest per instance and revision).
    pub async fn nacks(&self, env: &str, service: &str) -> anyhow::Result<Vec<NackRow>> {
        let rows = sqlx::query(
            "SELECT environment, service, instance_id, revision, error_detail, at FROM nacks \
             WHERE environment = $1 AND service = $2 ORDER BY at DESC",
        )
        .bind(env)
        .bind(service)
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(NackRow::from_row).collect()
    }

    /// Revisions newer than `above` that this agent instance NACKed (read once when its
    /// stream opens, so a reconnecting agent is not sent them again).
    pub async fn nacked_revisions(
        &self,
        env: &str,
        service: &str,
        instance: &str,
        above: u64,
    ) -> anyhow::Result<Vec<u64>> {
        let rows = sqlx::query(
            "SELECT revision FROM nacks WHERE environment = $1 AND service = $2 AND instance_id = $3 \
             AND revision > $4",
        )
        .bind(env)
        .bind(service)
        .bind(instance)
        .bind(above as i64)
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(|r| Ok(r.try_get::<i64, _>("revision")? as u64)).collect()
    }
}

impl Store {
    /// Writes a batch of agent state changes: the upserts as multi-row statements of at most
    /// [`FLEET_ROWS_PER_STATEMENT`] rows ([`FLEET_ROWS_PER_SQLITE_TURN`] on SQLite; one row
    /// per agent: the caller coalesces several events of one agent into its newest), then
    /// the NACKs and the first ACK of each revision per instance. Every written row takes `replica` as its holder and
    /// `lease_until` (ms since the epoch) as its lease. A disconnect reported by a replica
    /// that no longer holds the agent (it reconnected elsewhere meanwhile) changes nothing.
    ///
    /// On PostgreSQL the batch is one transaction. On SQLite, whose writers take turns on
    /// the store's (fair) write lock, each statement is its own transaction under its own
    /// turn: a revision written meanwhile waits for one statement, not for the batch of a
    /// whole fleet's ACKs. An error leaves the earlier statements written; the caller
    /// retries the batch, and every statement is idempotent (upserts of the newest state,
    /// ACKs `DO NOTHING`, NACKs keyed by revision).
    pub async fn write_fleet(
        &self,
        upserts: &[AgentUpsert],
        nacks: &[NackRow],
        acks: &[AckRow],
        replica: &str,
        lease_until: i64,
    ) -> anyhow::Result<()> {
        let _t = timed("write_fleet");
        let rows = match self.backend {
            Backend::Sqlite => FLEET_ROWS_PER_SQLITE_TURN,
            Backend::Postgres => FLEET_ROWS_PER_STATEMENT,
        };
        let mut statements = Vec::new();
        for chunk in upserts.chunks(rows) {
            let mut sql = String::from(
                "INSERT INTO agents (environment, service, instance_id, agent_version, connected, connected_at, \
                 last_seen, applied_revision, applied_hash, status, replica, lease_until) VALUES ",
            );
            push_values(&mut sql, self.backend, chunk.len(), 12);
            sql.push_str(
                " ON CONFLICT (environment, service, instance_id) DO UPDATE SET agent_version = excluded.agent_version, \
                 connected = excluded.connected, connected_at = excluded.connected_at, last_seen = excluded.last_seen, \
                 applied_revision = excluded.applied_revision, applied_hash = excluded.applied_hash, \
                 status = COALESCE(excluded.status, agents.status), replica = excluded.replica, \
                 lease_until = excluded.lease_until \
                 WHERE excluded.connected = 1 OR agents.replica = excluded.replica",
            );
            let mut q = sqlx::query(sqlx::AssertSqlSafe(sql));
            for a in chunk {
                q = q
                    .bind(&a.environment)
                    .bind(&a.service)
                    .bind(&a.instance_id)
                    .bind(&a.agent_version)
                    .bind(i64::from(a.connected))
                    .bind(a.connected_at)
                    .bind(a.last_seen)
                    .bind(a.applied_revision as i64)
                    .bind(&a.applied_hash)
                    .bind(a.status.clone())
                    .bind(replica)
                    .bind(if a.connected { lease_until } else { 0 });
            }
            statements.push(q);
        }
        for n in nacks {
            statements.push(
                sqlx::query(sqlx::AssertSqlSafe(
                    "INSERT INTO nacks (environment, service, instance_id, revision, error_detail, at) \
                     VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT (environment, service, instance_id, revision) \
                     DO UPDATE SET error_detail = excluded.error_detail, at = excluded.at"
                        .to_string(),
                ))
                .bind(&n.environment)
                .bind(&n.service)
                .bind(&n.instance_id)
                .bind(n.revision as i64)
                .bind(&n.error_detail)
                .bind(n.at),
            );
        }
        // ACKs in multi-row statements too: a flip reaching 10,000 agents is 20 statements
        // on PostgreSQL (100 on SQLite), not 10,000.
        for chunk in acks.chunks(rows) {
            let mut sql = String::from(
                "INSERT INTO acks (environment, service, revision, instance_id, acked_at) VALUES ",
            );
            push_values(&mut sql, self.backend, chunk.len(), 5);
            sql.push_str(" ON CONFLICT (environment, service, revision, instance_id) DO NOTHING");
            let mut q = sqlx::query(sqlx::AssertSqlSafe(sql));
            for a in chunk {
                q = q
                    .bind(&a.environment)
                    .bind(&a.service)
                    .bind(a.revision as i64)
                    .bind(&a.instance_id)
                    .bind(a.acked_at);
            }
            statements.push(q);
        }
        if statements.is_empty() {
            return Ok(());
        }
        match self.backend {
            Backend::Sqlite => {
                for q in statements {
                    // A statement outside a transaction commits on its own.
                    let _g = self.write_guard().await;
                    q.execute(&self.pool).await?;
                }
            }
            Backend::Postgres => {
                let mut tx = self.pool.begin().await?;
                for q in statements {
                    q.execute(&mut *tx).await?;
                }
                tx.commit().await?;
            }
        }
        Ok(())
    }

    /// Extends to `lease_until` (ms since the epoch) the lease of every agent `replica`
    /// holds a stream of: one statement, however many agents. Returns how many rows.
    pub async fn renew_leases(&self, replica: &str, lease_until: i64) -> anyhow::Result<u64> {
        let _g = self.write_guard().await;
        let res = sqlx::query("UPDATE agents SET lease_until = $1 WHERE replica = $2 AND connected = 1")
            .bind(lease_until)
            .bind(replica)
            .execute(&self.pool)
            .await?;
        Ok(res.rows_affected())
    }

    /// Marks every agent of this server as disconnected (at start-up, for SQLite's single
    /// replica, whose previous process cannot have live streams).
    pub async fn mark_all_disconnected(&self) -> anyhow::Result<()> {
        let _g = self.write_guard().await;
        sqlx::query("UPDATE agents SET connected = $1").bind(0i64).execute(&self.pool).await?;
        Ok(())
    }
}

/// Milliseconds as a duration, a negative count (clocks of two replicas) as zero.
fn ms(v: i64) -> std::time::Duration {
    std::time::Duration::from_millis(u64::try_from(v).unwrap_or(0))
}

//! Rows of `health_windows`: agents' health summed per replica, service, revision,
//! 10-second slot and subject, written by the health flusher (`crate::health`), never per
//! report.

use levee_agent::health::{KIND_DEPENDENCY, KIND_ROUTE};
use sqlx::Row;

use super::{Backend, Reader, Store, push_values, timed};

/// What a health window is about: the agents' word of a window's kind, stored as such.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum SubjectKind {
    /// An outgoing dependency of the service.
    Dependency,
    /// An inbound route of the service (template or gRPC method).
    Route,
}

impl SubjectKind {
    /// The word of the wire and the database.
    pub fn as_str(self) -> &'static str {
        match self {
            SubjectKind::Dependency => KIND_DEPENDENCY,
            SubjectKind::Route => KIND_ROUTE,
        }
    }

    /// The kind `word` names; `None` for a word this server does not know (an agent's or
    /// a newer replica's).
    pub fn parse(word: &str) -> Option<SubjectKind> {
        match word {
            KIND_DEPENDENCY => Some(SubjectKind::Dependency),
            KIND_ROUTE => Some(SubjectKind::Route),
            _ => None,
        }
    }
}

/// One row of `health_windows`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HealthRow {
    pub replica: String,
    pub environment: String,
    pub service: String,
    pub revision: u64,
    pub slot_ms: i64,
    /// `None` (stored as an empty word, as `name`) for the row that carries the slot's
    /// instance counts.
    pub kind: Option<SubjectKind>,
    pub name: String,
    pub calls: u64,
    pub successes: u64,
    pub failures: u64,
    pub timeouts: u64,
    pub fallbacks: u64,
    pub shed: u64,
    pub breaker_opens: u64,
    /// Calls per latency bucket (`levee_agent::health::LATENCY_BOUNDS_MS`).
    pub latency: Vec<u64>,
    pub instances: u64,
    pub not_ready: u64,
}

/// Columns per row of the upsert.
const COLS: usize = 17;
/// Rows per statement: 17 parameters each, under SQLite's 32,766.
const ROWS_PER_STATEMENT: usize = 500;
/// Rows per statement on SQLite, where each holds the store's write lock (as the fleet
/// writer's).
const ROWS_PER_SQLITE_TURN: usize = 100;

impl Reader {
    /// Every replica's rows of one service whose slot starts at or after `from_ms`. A row
    /// of a kind this server does not know (written by a newer replica) is left out, as
    /// its agents' windows of that kind would have been: the rest still answer.
    pub async fn health_rows(
        &self,
        env: &str,
        service: &str,
        from_ms: i64,
    ) -> anyhow::Result<Vec<HealthRow>> {
        let _t = timed("health_rows");
        let rows = sqlx::query(
            "SELECT replica, environment, service, revision, slot_ms, kind, name, calls, successes, failures, \
             timeouts, fallbacks, shed, breaker_opens, latency, instances, not_ready FROM health_windows \
             WHERE environment = $1 AND service = $2 AND slot_ms >= $3",
        )
        .bind(env)
        .bind(service)
        .bind(from_ms)
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .filter_map(|r| {
                let kind = match r.try_get::<String, _>("kind") {
                    Ok(word) if word.is_empty() => None,
                    Ok(word) => Some(SubjectKind::parse(&word)?),
                    Err(e) => return Some(Err(e.into())),
                };
                Some(health_row(r, kind))
            })
            .collect()
    }
}

fn health_row(r: &sqlx::any::AnyRow, kind: Option<SubjectKind>) -> anyhow::Result<HealthRow> {
    let n = |c: &str| -> anyhow::Result<u64> { Ok(r.try_get::<i64, _>(c)?.max(0) as u64) };
    let latency: String = r.try_get("latency")?;
    Ok(HealthRow {
        replica: r.try_get("replica")?,
        environment: r.try_get("environment")?,
        service: r.try_get("service")?,
        revision: n("revision")?,
        slot_ms: r.try_get("slot_ms")?,
        kind,
        name: r.try_get("name")?,
        calls: n("calls")?,
        successes: n("successes")?,
        failures: n("failures")?,
        timeouts: n("timeouts")?,
        fallbacks: n("fallbacks")?,
        shed: n("shed")?,
        breaker_opens: n("breaker_opens")?,
        latency: serde_json::from_str(&latency).unwrap_or_default(),
        instances: n("instances")?,
        not_ready: n("not_ready")?,
    })
}

impl Store {
    /// Writes `rows`, each replacing the row of its key: a slot's rows are rewritten as it
    /// fills, so a retry never counts twice.
    pub async fn write_health(&self, rows: &[HealthRow]) -> anyhow::Result<()> {
        let _t = timed("write_health");
        let per = match self.backend {
            Backend::Sqlite => ROWS_PER_SQLITE_TURN,
            Backend::Postgres => ROWS_PER_STATEMENT,
        };
        for chunk in rows.chunks(per) {
            let mut sql = String::from(
                "INSERT INTO health_windows (replica, environment, service, revision, slot_ms, kind, name, calls, \
                 successes, failures, timeouts, fallbacks, shed, breaker_opens, latency, instances, not_ready) VALUES ",
            );
            push_values(&mut sql, self.backend, chunk.len(), COLS);
            sql.push_str(
                " ON CONFLICT (replica, environment, service, revision, slot_ms, kind, name) DO UPDATE SET \
                 calls = excluded.calls, successes = excluded.successes, failures = excluded.failures, \
                 timeouts = excluded.timeouts, fallbacks = excluded.fallbacks, shed = excluded.shed, \
                 breaker_opens = excluded.breaker_opens, latency = excluded.latency, \
                 instances = excluded.instances, not_ready = excluded.not_ready",
            );
            let mut q = sqlx::query(sqlx::AssertSqlSafe(sql));
            for r in chunk {
                let latency = serde_json::to_string(&r.latency)?;
                q = q
                    .bind(&r.replica)
                    .bind(&r.environment)
                    .bind(&r.service)
                    .bind(r.revision as i64)
                    .bind(r.slot_ms)
                    .bind(r.kind.map_or("", SubjectKind::as_str))
                    .bind(&r.name)
                    .bind(r.calls as i64)
                    .bind(r.successes as i64)
                    .bind(r.failures as i64)
                    .bind(r.timeouts as i64)
                    .bind(r.fallbacks as i64)
                    .bind(r.shed as i64)
                    .bind(r.breaker_opens as i64)
                    .bind(latency)
                    .bind(r.instances as i64)
                    .bind(r.not_ready as i64);
            }
            let _g = self.write_guard().await;
            q.execute(&self.pool).await?;
        }
        Ok(())
    }

    /// Deletes the rows of slots that started before `before_ms`. Returns how many.
    pub async fn prune_health(&self, before_ms: i64) -> anyhow::Result<u64> {
        let _g = self.write_guard().await;
        let res = sqlx::query("DELETE FROM health_windows WHERE slot_ms < $1")
            .bind(before_ms)
            .execute(&self.pool)
            .await?;
        Ok(res.rows_affected())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(kind: Option<SubjectKind>, name: &str) -> HealthRow {
        HealthRow {
            replica: "a".into(),
            environment: "prod".into(),
            service: "checkout".into(),
            revision: 1,
            slot_ms: 10_000,
            kind,
            name: name.into(),
            calls: 3,
            successes: 3,
            failures: 0,
            timeouts: 0,
            fallbacks: 0,
            shed: 0,
            breaker_opens: 0,
            latency: vec![3],
            instances: u64::from(kind.is_none()),
            not_ready: 0,
        }
    }

    /// The kinds read back as written, the instance-count row as `None`; a kind a newer
    /// replica wrote is left out, not an error that would hide every other row.
    #[tokio::test(flavor = "current_thread")]
    async fn kinds_read_back_and_an_unknown_kind_is_left_out() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::connect(&format!("sqlite://{}?mode=rwc", dir.path().join("t.db").display()))
            .await
            .unwrap();
        let rows = vec![
            row(None, ""),
            row(Some(SubjectKind::Dependency), "db"),
            row(Some(SubjectKind::Route), "GET /"),
        ];
        store.write_health(&rows).await.unwrap();
        sqlx::query(
            "INSERT INTO health_windows (replica, environment, service, revision, slot_ms, kind, name, calls, \
             successes, failures, timeouts, fallbacks, shed, breaker_opens, latency, instances, not_ready) \
             VALUES ('b', 'prod', 'checkout', 1, 10000, 'queue', 'q', 1, 1, 0, 0, 0, 0, 0, '[1]', 0, 0)",
        )
        .execute(&store.pool)
        .await
        .unwrap();
        let mut read = store.health_rows("prod", "checkout", 0).await.unwrap();
        read.sort_by(|a, b| (a.kind, &a.name).cmp(&(b.kind, &b.name)));
        assert_eq!(read, rows);
    }
}

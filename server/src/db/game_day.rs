//! Game days: the experiments still running on a service, and when each person first
//! opened that service's page during one (one row per game day and person).

use sqlx::Row;

use super::{Reader, Store};

/// A person's first look at a game day's service.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GameDayView {
    /// The user, as the audit log names them.
    pub viewer: String,
    /// ms since the epoch.
    pub at: i64,
}

impl Reader {
    /// The ids of the experiments of `env`/`service` that have not ended, oldest first.
    pub async fn running_experiment_ids(&self, env: &str, service: &str) -> anyhow::Result<Vec<i64>> {
        let rows = sqlx::query(
            "SELECT id FROM experiments WHERE environment = $1 AND service = $2 AND ended_at IS NULL ORDER BY id",
        )
        .bind(env)
        .bind(service)
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(|r| Ok(r.try_get("id")?)).collect()
    }

    /// Each person's first view of game day `id`'s service, earliest first.
    pub async fn game_day_views(&self, id: i64) -> anyhow::Result<Vec<GameDayView>> {
        let rows =
            sqlx::query("SELECT viewer, at FROM game_day_views WHERE experiment_id = $1 ORDER BY at, viewer")
                .bind(id)
                .fetch_all(&self.pool)
                .await?;
        rows.iter().map(|r| Ok(GameDayView { viewer: r.try_get("viewer")?, at: r.try_get("at")? })).collect()
    }
}

impl Store {
    /// Records `viewer`'s first view of game day `id`'s service at `at`; a later view of
    /// the same person changes nothing. `true` when this was their first.
    pub async fn record_game_day_view(&self, id: i64, viewer: &str, at: i64) -> anyhow::Result<bool> {
        let _g = self.write_guard().await;
        let n = sqlx::query(
            "INSERT INTO game_day_views (experiment_id, viewer, at) VALUES ($1, $2, $3) \
             ON CONFLICT (experiment_id, viewer) DO NOTHING",
        )
        .bind(id)
        .bind(viewer)
        .bind(at)
        .execute(&self.pool)
        .await?
        .rows_affected();
        Ok(n == 1)
    }
}

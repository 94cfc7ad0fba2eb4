//! `levee-bench writes`: sustained flag writes per second through the API (each one a new
//! revision with its audit entry), from `--clients` concurrent API clients for `--secs`,
//! on SQLite or PostgreSQL. Target: ≥ 500 writes/s on SQLite.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use clap::Args as ClapArgs;
use serde_json::json;

use super::api::Api;
use super::server::{PgDatabase, Server, Spawn};
use super::{Common, percentiles_ms};

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Db {
    Sqlite,
    Postgres,
}

#[derive(Debug, ClapArgs)]
pub struct Args {
    #[command(flatten)]
    pub common: Common,
    #[arg(long, value_enum, default_value_t = Db::Sqlite)]
    pub db: Db,
    /// Concurrent API clients (each on its own connection).
    #[arg(long, default_value_t = 8)]
    pub clients: usize,
    /// Seconds of writing; default 10, 2 with --smoke.
    #[arg(long)]
    pub secs: Option<f64>,
    /// The PostgreSQL server for `--db postgres` (loopback); a fresh database is created on
    /// it and dropped.
    #[arg(long, default_value = "postgres://postgres@127.0.0.1:5432")]
    pub postgres: String,
}

pub async fn run(a: Args) -> anyhow::Result<serde_json::Value> {
    let secs = Duration::from_secs_f64(a.secs.unwrap_or(if a.common.smoke { 2.0 } else { 10.0 }));
    let data = tempfile::tempdir()?;
    let mut spawn = Spawn::new(&a.common.server_bin()?, data.path());
    let db = match a.db {
        Db::Sqlite => None,
        Db::Postgres => {
            let db = PgDatabase::create(&a.postgres)?;
            spawn = spawn.env("LEVEE_DATABASE_URL", db.url());
            Some(db)
        }
    };
    let server = Server::start(&spawn).await?;
    let api = Api::login(&server.base()).await?;
    api.seed().await?;
    let ok = Arc::new(AtomicU64::new(0));
    let failed = Arc::new(AtomicU64::new(0));
    let until = tokio::time::Instant::now() + secs;
    let start = tokio::time::Instant::now();
    let mut tasks = Vec::new();
    for c in 0..a.clients {
        // Its own client: its own connection pool.
        let mut api = Api::login(&server.base()).await?;
        api.client = reqwest::Client::new();
        let (ok, failed) = (ok.clone(), failed.clone());
        tasks.push(tokio::spawn(async move {
            let mut lat = Vec::new();
            let mut on = c % 2 == 0;
            while tokio::time::Instant::now() < until {
                let t = tokio::time::Instant::now();
                match api.flip(on).await {
                    Ok(_) => {
                        ok.fetch_add(1, Ordering::Relaxed);
                        lat.push(t.elapsed().as_secs_f64() * 1000.0);
                    }
                    Err(e) => {
                        if failed.fetch_add(1, Ordering::Relaxed) < 3 {
                            eprintln!("write failed: {e:#}");
                        }
                    }
                }
                on = !on;
            }
            lat
        }));
    }
    let mut lat = Vec::new();
    for t in tasks {
        lat.extend(t.await?);
    }
    let elapsed = start.elapsed().as_secs_f64();
    let ok = ok.load(Ordering::Relaxed);
    server.stop().await?;
    drop(db);
    Ok(json!({
        "mode": "writes", "smoke": a.common.smoke,
        "db": match a.db { Db::Sqlite => "sqlite", Db::Postgres => "postgres" },
        "clients": a.clients, "seconds": (elapsed * 100.0).round() / 100.0,
        "writes_ok": ok, "writes_failed": failed.load(Ordering::Relaxed),
        "writes_per_sec": (ok as f64 / elapsed).round(),
        "latency": percentiles_ms(&lat),
    }))
}

//! `levee-bench replicas`: two `levee` replicas on one fresh PostgreSQL database; flips
//! written on replica A, N agents connected to replica B; for each flip, the time from A's
//! answer until the last agent on B applied it. Target: cross-replica p99 ≤ 1 s.

use std::time::Duration;

use clap::Args as ClapArgs;
use serde_json::json;

use super::api::Api;
use super::fleet::Fleet;
use super::server::{PgDatabase, Server, Spawn};
use super::{Common, SETUP_STREAMS_PER_SEC, percentiles_ms};

#[derive(Debug, ClapArgs)]
pub struct Args {
    #[command(flatten)]
    pub common: Common,
    /// Agents on replica B; default 100, 10 with --smoke.
    #[arg(long)]
    pub agents: Option<usize>,
    /// Flips measured; default 50, 5 with --smoke.
    #[arg(long)]
    pub flips: Option<usize>,
    /// The PostgreSQL server (loopback); a fresh database is created on it and dropped.
    #[arg(long, default_value = "postgres://postgres@127.0.0.1:5432")]
    pub postgres: String,
}

pub async fn run(a: Args) -> anyhow::Result<serde_json::Value> {
    let n = a.agents.unwrap_or(if a.common.smoke { 10 } else { 100 });
    let flips = a.flips.unwrap_or(if a.common.smoke { 5 } else { 50 });
    let db = PgDatabase::create(&a.postgres)?;
    let bin = a.common.server_bin()?;
    let (da, dbb) = (tempfile::tempdir()?, tempfile::tempdir()?);
    let spawn = |dir: &std::path::Path| {
        Spawn::new(&bin, dir)
            .env("LEVEE_DATABASE_URL", db.url())
            .env("LEVEE_NEW_STREAMS_PER_SEC", SETUP_STREAMS_PER_SEC)
    };
    let ra = Server::start(&spawn(da.path())).await?;
    let rb = Server::start(&spawn(dbb.path())).await?;
    let api = Api::login(&ra.base()).await?;
    api.seed().await?;
    let token = api.agent_token().await?;
    let fleet = Fleet::start(&a.common, &rb.grpc_url(), &token, n)?;
    fleet.wait_synced(1, Duration::from_secs(120)).await?;
    let f = fleet.measure_flips(&api, flips, "of B (written on A)").await?;
    fleet.shutdown().await;
    ra.stop().await?;
    rb.stop().await?;
    drop(db);
    Ok(json!({
        "mode": "replicas", "smoke": a.common.smoke, "agents": n, "flips": flips,
        "cross_replica": percentiles_ms(&f.after_answer),
        "from_request_to_last_agent": percentiles_ms(&f.from_request),
        "api_answer": percentiles_ms(&f.api_answer),
    }))
}

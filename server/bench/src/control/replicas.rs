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
    let mut samples = Vec::with_capacity(flips);
    let (mut from_request, mut api_ms) = (Vec::new(), Vec::new());
    for i in 0..flips {
        // The revision the write will make is the next one: watch the agents while the
        // request is in flight (the server pushes before it answers).
        let rev = fleet.agents[0].current().revision + 1;
        let sent = tokio::time::Instant::now();
        let (written, total) = tokio::join!(
            async { (api.flip(i % 2 == 1).await, sent.elapsed().as_secs_f64() * 1000.0) },
            fleet.time_to_all(sent, rev, Duration::from_secs(60))
        );
        let (written, answered) = (written.0?, written.1);
        anyhow::ensure!(written == rev, "the write made revision {written}, not the next one ({rev})");
        let total = total?;
        // From the answer; 0 when every agent had it before the API answered.
        let ms = (total - answered).max(0.0);
        from_request.push(total);
        api_ms.push(answered);
        eprintln!("flip {i}: revision {rev} written on A, on all {n} agents of B after {ms:.1} ms");
        samples.push(ms);
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    fleet.shutdown().await;
    ra.stop().await?;
    rb.stop().await?;
    drop(db);
    Ok(json!({
        "mode": "replicas", "smoke": a.common.smoke, "agents": n, "flips": flips,
        "cross_replica": percentiles_ms(&samples),
        "from_request_to_last_agent": percentiles_ms(&from_request),
        "api_answer": percentiles_ms(&api_ms),
    }))
}

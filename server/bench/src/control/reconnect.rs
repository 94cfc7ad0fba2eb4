//! `levee-bench reconnect --agents N`: N agents synced, the server stopped with SIGTERM
//! (GoAway to every stream) and started again on the same ports and database, then a flip;
//! measures the time from the new server's "listening" until every agent has a stream and
//! the new revision, the streams the server refused meanwhile (its
//! `levee_server_streams_refused_total`), its peak memory, and the new streams per second
//! it admitted. Target: all re-synced within 30 s after a restart with 10,000 agents, no
//! error storm.

use std::time::Duration;

use clap::Args as ClapArgs;
use serde_json::json;

use super::fleet::Fleet;
use super::server::Server;
use super::{Common, SETUP_STREAMS_PER_SEC, Setup};

#[derive(Debug, ClapArgs)]
pub struct Args {
    #[command(flatten)]
    pub common: Common,
    /// Agents (streams); default 10,000, 50 with --smoke.
    #[arg(long)]
    pub agents: Option<usize>,
    /// `LEVEE_NEW_STREAMS_PER_SEC` of the restarted server; default: the server's default.
    #[arg(long)]
    pub new_streams_per_sec: Option<u32>,
}

pub async fn run(a: Args) -> anyhow::Result<serde_json::Value> {
    let n = a.agents.unwrap_or(if a.common.smoke { 50 } else { 10_000 });
    let s = Setup::sqlite(&a.common, &[("LEVEE_NEW_STREAMS_PER_SEC", SETUP_STREAMS_PER_SEC)]).await?;
    let fleet = Fleet::start(&a.common, &s.server.grpc_url(), &s.token, n)?;
    fleet.wait_synced(1, Duration::from_secs(300)).await?;
    eprintln!("{n} agents synced; restarting the server");
    // The same ports and data, the admission setting under test.
    let mut spawn = s.spawn.clone();
    spawn.http = s.server.http.to_string();
    spawn.grpc = s.server.grpc.to_string();
    spawn.env.retain(|(k, _)| k != "LEVEE_NEW_STREAMS_PER_SEC");
    if let Some(r) = a.new_streams_per_sec {
        spawn = spawn.env("LEVEE_NEW_STREAMS_PER_SEC", r.to_string());
    }
    let stopped = tokio::time::Instant::now();
    s.server.stop().await?;
    let down = stopped.elapsed();
    let server = Server::start(&spawn).await?;
    let up = tokio::time::Instant::now();
    let api = super::api::Api::login(&server.base()).await?;
    let rev = api.flip(false).await?;
    let timeout = Duration::from_secs(if a.common.smoke { 60 } else { 600 });
    fleet.wait_synced(rev, timeout).await?;
    let resynced = up.elapsed();
    let refused = server.counter(&api.client, "levee_server_streams_refused_total").await;
    let (_, hwm) = server.rss_kib();
    fleet.shutdown().await;
    server.stop().await?;
    Ok(json!({
        "mode": "reconnect", "smoke": a.common.smoke, "agents": n,
        "new_streams_per_sec_setting": a.new_streams_per_sec,
        "stop_seconds": (down.as_secs_f64() * 100.0).round() / 100.0,
        "resync_seconds": (resynced.as_secs_f64() * 100.0).round() / 100.0,
        "streams_refused": refused,
        "admitted_streams_per_sec": (n as f64 / resynced.as_secs_f64()).round(),
        "server_peak_rss_mib": hwm / 1024,
    }))
}

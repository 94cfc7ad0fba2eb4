//! `levee-bench streams --agents N`: server resident memory and CPU with N idle agent
//! streams (agents with the default sync settings: heartbeats, status every 10 s, metrics
//! every 5 s — what "idle" costs in production). Targets: 10,000 streams with RSS ≤ 400 MB
//! and idle CPU ≤ 5 % (of one core).

use std::time::Duration;

use clap::Args as ClapArgs;
use serde_json::json;

use super::fleet::Fleet;
use super::{Common, SETUP_STREAMS_PER_SEC, Setup};

#[derive(Debug, ClapArgs)]
pub struct Args {
    #[command(flatten)]
    pub common: Common,
    /// Agents (streams); default 10,000, 50 with --smoke. Needs about 2 × N file
    /// descriptors here and N in the server (the harness raises its soft limit to the hard one).
    #[arg(long)]
    pub agents: Option<usize>,
    /// Seconds of idle CPU measured once all are connected; default 30, 2 with --smoke.
    #[arg(long)]
    pub idle_secs: Option<f64>,
}

pub async fn run(a: Args) -> anyhow::Result<serde_json::Value> {
    let n = a.agents.unwrap_or(if a.common.smoke { 50 } else { 10_000 });
    let idle = Duration::from_secs_f64(a.idle_secs.unwrap_or(if a.common.smoke { 2.0 } else { 30.0 }));
    let s = Setup::sqlite(&a.common, &[("LEVEE_NEW_STREAMS_PER_SEC", SETUP_STREAMS_PER_SEC)]).await?;
    // Baseline: the server after one agent synced.
    let one = Fleet::start(&a.common, &s.server.grpc_url(), &s.token, 1)?;
    one.wait_synced(1, Duration::from_secs(30)).await?;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let (base, _) = s.server.rss_kib();
    let fleet = Fleet::start(&a.common, &s.server.grpc_url(), &s.token, n)?;
    let connect = fleet.wait_synced(1, Duration::from_secs(300)).await?;
    eprintln!("{n} agents synced in {:.1} s; settling", connect.as_secs_f64());
    // Let the connection burst's allocations settle and every agent send its first reports.
    tokio::time::sleep(if a.common.smoke { Duration::from_secs(1) } else { Duration::from_secs(12) }).await;
    let cpu0 = s.server.cpu_seconds();
    let t0 = tokio::time::Instant::now();
    tokio::time::sleep(idle).await;
    let cpu = (s.server.cpu_seconds() - cpu0) / t0.elapsed().as_secs_f64() * 100.0;
    let (rss, hwm) = s.server.rss_kib();
    let connected = fleet.connected();
    let per_stream = rss.saturating_sub(base) as f64 * 1024.0 / n as f64;
    fleet.shutdown().await;
    one.shutdown().await;
    s.server.stop().await?;
    Ok(json!({
        "mode": "streams", "smoke": a.common.smoke, "agents": n, "connected": connected,
        "calls_per_sec": a.common.calls_per_sec(),
        "server_rss_mib": (rss as f64 / 1024.0 * 10.0).round() / 10.0,
        "server_base_rss_mib": (base as f64 / 1024.0 * 10.0).round() / 10.0,
        "server_peak_rss_mib": (hwm as f64 / 1024.0 * 10.0).round() / 10.0,
        "bytes_per_stream": per_stream.round(),
        "idle_cpu_percent": (cpu * 10.0).round() / 10.0,
        "idle_seconds": idle.as_secs_f64(),
        "connect_seconds": (connect.as_secs_f64() * 100.0).round() / 100.0,
    }))
}

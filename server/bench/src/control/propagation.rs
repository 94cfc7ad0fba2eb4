//! `levee-bench propagation --agents N`: N agents connected, the flag flipped through the
//! API `--flips` times one after the other; for each flip, the time until the last agent
//! applied the new revision (the agent then persists it to its cache and ACKs), from the
//! API's answer and from the request, and the API's answer time. Reports p50/p99/max over
//! the flips. Targets: p99 ≤ 50 ms at 1,000 agents,
//! ≤ 500 ms at 10,000.

use std::time::Duration;

use clap::Args as ClapArgs;
use serde_json::json;

use super::fleet::Fleet;
use super::{Common, SETUP_STREAMS_PER_SEC, Setup, percentiles_ms};

#[derive(Debug, ClapArgs)]
pub struct Args {
    #[command(flatten)]
    pub common: Common,
    /// Agents (streams); default 1,000, 20 with --smoke.
    #[arg(long)]
    pub agents: Option<usize>,
    /// Flips measured; default 50, 5 with --smoke.
    #[arg(long)]
    pub flips: Option<usize>,
}

pub async fn run(a: Args) -> anyhow::Result<serde_json::Value> {
    let n = a.agents.unwrap_or(if a.common.smoke { 20 } else { 1_000 });
    let flips = a.flips.unwrap_or(if a.common.smoke { 5 } else { 50 });
    let s = Setup::sqlite(&a.common, &[("LEVEE_NEW_STREAMS_PER_SEC", SETUP_STREAMS_PER_SEC)]).await?;
    let fleet = Fleet::start(&a.common, &s.server.grpc_url(), &s.token, n)?;
    let connect = fleet.wait_synced(1, Duration::from_secs(120)).await?;
    eprintln!("{n} agents synced in {:.1} s", connect.as_secs_f64());
    tokio::time::sleep(Duration::from_secs(1)).await;
    let f = fleet.measure_flips(&s.api, flips, "of the server").await?;
    let (rss, hwm) = s.server.rss_kib();
    fleet.shutdown().await;
    s.server.stop().await?;
    Ok(json!({
        "mode": "propagation", "smoke": a.common.smoke, "agents": n, "flips": flips,
        "cache": !a.common.no_cache, "calls_per_sec": a.common.calls_per_sec(),
        "last_agent_applied": percentiles_ms(&f.after_answer),
        "from_request_to_last_agent": percentiles_ms(&f.from_request),
        "api_answer": percentiles_ms(&f.api_answer),
        "connect_seconds": (connect.as_secs_f64() * 100.0).round() / 100.0,
        "server_rss_mib": rss / 1024, "server_peak_rss_mib": hwm / 1024,
    }))
}

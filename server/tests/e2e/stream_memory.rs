//! Measurement, not a check (ignored by default): resident memory of the `levee` binary
//! per idle agent stream, for docs/operations.md. Run:
//!   cargo test --release -p levee-server --test e2e stream_memory -- --ignored --nocapture
//! LEVEE_MEASURE_STREAMS sets the number of streams (default 2,000; each is a TCP
//! connection of its own, as with real agents; the process needs twice as many file
//! descriptors).

use std::time::Duration;

use levee_agent::proto::{ServerMessage, server_message};
use tokio_stream::StreamExt;

use crate::control_plane::open;
use crate::support::{Api, BinServer};

fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status.lines().find(|l| l.starts_with("VmRSS:")).unwrap();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a measurement; run explicitly"]
async fn stream_memory_per_idle_agent_stream() {
    let n: usize = std::env::var("LEVEE_MEASURE_STREAMS").ok().and_then(|v| v.parse().ok()).unwrap_or(2_000);
    let data = tempfile::tempdir().unwrap();
    let server = BinServer::start_with(
        data.path(),
        "127.0.0.1:0",
        "127.0.0.1:0",
        &[("LEVEE_NEW_STREAMS_PER_SEC", "100000"), ("LEVEE_HEARTBEAT_INTERVAL", "15s")],
    )
    .await;
    let pid = server.child.id().unwrap();
    let api = Api::login(&format!("http://{}", server.http)).await;
    api.seed().await;
    let token = api.agent_token("prod", &["checkout"]).await;
    let grpc = format!("http://{}", server.grpc);
    let mut streams = Vec::with_capacity(n);
    // Warm up: one stream, then the baseline.
    let mut first = open(&grpc, &token, "prod", "checkout", "warm", 0).await.unwrap();
    first.rx.next().await.unwrap().unwrap();
    tokio::time::sleep(Duration::from_secs(1)).await;
    let base = rss_kib(pid);
    let started = tokio::time::Instant::now();
    for i in 0..n {
        let mut s = open(&grpc, &token, "prod", "checkout", &format!("m-{i}"), 0).await.unwrap();
        match s.rx.next().await {
            Some(Ok(ServerMessage { kind: Some(server_message::Kind::Snapshot(_)) })) => {}
            other => panic!("stream {i}: {other:?}"),
        }
        streams.push(s);
    }
    let opened = started.elapsed();
    tokio::time::sleep(Duration::from_secs(3)).await;
    let loaded = rss_kib(pid);
    let per_stream = (loaded.saturating_sub(base)) as f64 * 1024.0 / n as f64;
    println!(
        "{{\"streams\": {n}, \"rss_base_kib\": {base}, \"rss_kib\": {loaded}, \"bytes_per_stream\": {per_stream:.0}, \"open_seconds\": {:.2}}}",
        opened.as_secs_f64()
    );
    drop(streams);
    server.kill().await;
}

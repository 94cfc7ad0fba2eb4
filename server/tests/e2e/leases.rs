//! Agent liveness is a lease renewed by the replica holding the stream
//! (control-plane.md §3): the agents of a replica killed with SIGKILL stop counting as
//! connected once their lease runs out, as seen from another replica.

use std::time::Duration;

use reqwest::Method;

use crate::helpers::{JWT_SECRET, TestApp, postgres_url};
use crate::support::{Api, BinServer, agent, wait_until};

/// (instance, connected) of the agents of prod/checkout, read through replica `app`.
async fn connected(app: &TestApp) -> Vec<(String, bool)> {
    let (_, _, body) =
        app.call(Method::GET, "/api/v1/environments/prod/services/checkout/agents", None).await;
    body.as_array()
        .unwrap()
        .iter()
        .map(|a| (a["instance_id"].as_str().unwrap().to_string(), a["connected"].as_bool().unwrap()))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_replicas_agents_stop_counting_as_connected_after_their_lease() {
    let Some(url) = postgres_url().await else { return };
    let a = TestApp::spawn_with(Some(url.clone())).await;
    let api = Api::login(&a.base).await;
    api.seed().await;
    let token = api.agent_token("prod", &["checkout"]).await;
    let dir = tempfile::tempdir().unwrap();
    let b = BinServer::start_with(
        dir.path(),
        "127.0.0.1:0",
        "127.0.0.1:0",
        &[("LEVEE_DATABASE_URL", &url), ("LEVEE_JWT_SECRET", JWT_SECRET), ("LEVEE_AGENT_LEASE", "2s")],
    )
    .await;
    let agent = agent(&format!("http://{}", b.grpc), &token, &dir.path().join("cache"));
    agent.wait_for_initial_sync(Duration::from_secs(10)).await.expect("syncs through replica b");
    let id = agent.instance_id().to_string();

    let start = tokio::time::Instant::now();
    loop {
        if connected(&a).await.contains(&(id.clone(), true)) {
            break;
        }
        assert!(start.elapsed() < Duration::from_secs(10), "replica a never saw the agent connected");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Renewed: still connected well past one lease.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(
        connected(&a).await.contains(&(id.clone(), true)),
        "the lease is renewed while b holds the stream"
    );

    b.kill().await;
    let killed = tokio::time::Instant::now();
    loop {
        if connected(&a).await.contains(&(id.clone(), false)) {
            break;
        }
        assert!(
            killed.elapsed() < Duration::from_secs(5),
            "still connected {:?} after the kill",
            killed.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    wait_until("the agent to notice", Duration::from_secs(10), || !agent.status().connected).await;
    agent.shutdown().await;
}

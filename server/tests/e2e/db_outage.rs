//! A database blip must not silence kill switches (control-plane.md §3): while PostgreSQL
//! is away, agents are never told their token is bad (they would back off for minutes),
//! the API answers 503 problem+json at once, and the replica serves agents what it holds
//! in memory; once it is back, a flip reaches every agent within seconds and the fleet
//! view is right. Each test stops and starts a PostgreSQL of its own.

use std::time::Duration;

use reqwest::{Method, StatusCode};
use serde_json::json;
use tonic::Code;

use crate::control_plane::open;
use crate::helpers::{TestApp, assert_problem};
use crate::private_pg::PrivatePg;
use crate::support::{Api, agent, wait_until};

/// PATCHes the kill switch until the API accepts it (the pool reconnects after an
/// outage); returns the new revision. Panics after `within`.
async fn flip_when_back(app: &TestApp, on: bool, within: Duration) -> u64 {
    let start = tokio::time::Instant::now();
    loop {
        let (status, _, body) = app
            .call(
                Method::PATCH,
                "/api/v1/environments/prod/services/checkout/flags/recommendations.enabled",
                Some(json!({"value": on, "reason": "db outage test"})),
            )
            .await;
        if status.is_success() {
            return body["revision"].as_u64().unwrap();
        }
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "only 503 while the database returns: {body}");
        assert!(
            start.elapsed() < within,
            "the API did not accept a flip within {within:?} of the database's return"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The fleet view of prod/checkout: (instance, connected, applied revision) of each agent.
async fn fleet(app: &TestApp) -> Option<Vec<(String, bool, u64)>> {
    let (status, _, body) =
        app.call(Method::GET, "/api/v1/environments/prod/services/checkout/agents", None).await;
    if status != StatusCode::OK {
        return None;
    }
    Some(
        body.as_array()
            .unwrap()
            .iter()
            .map(|a| {
                (
                    a["instance_id"].as_str().unwrap().to_string(),
                    a["connected"].as_bool().unwrap(),
                    a["applied_revision"].as_u64().unwrap(),
                )
            })
            .collect(),
    )
}

/// Polls the fleet view until every one of `instances` is connected at `revision`.
async fn wait_fleet(app: &TestApp, instances: &[&str], revision: u64, within: Duration) {
    let start = tokio::time::Instant::now();
    loop {
        let view = fleet(app).await;
        if let Some(v) = &view
            && instances.iter().all(|i| v.iter().any(|(id, c, r)| id == i && *c && *r == revision))
        {
            return;
        }
        assert!(start.elapsed() < within, "fleet view not right after {within:?}: {view:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// PostgreSQL stopped while agents connect: an agent whose token this replica verified
/// before is accepted from memory and served the snapshot it holds; an agent whose token
/// it never saw gets UNAVAILABLE and retries on its short backoff (not the 300 s
/// "revoked" one). The API answers 503 problem+json within the pool's acquire timeout and
/// `/readyz` within its bound. PostgreSQL comes back: a flip reaches all three agents
/// within seconds and the fleet view shows each connected at that revision.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn db_outage_agent_connecting_while_postgres_is_down_is_not_refused() {
    let Some(pg) = PrivatePg::start() else { return };
    let app = TestApp::spawn_with(Some(pg.url())).await;
    let api = Api::login(&app.base).await;
    api.seed().await;
    let seen = api.agent_token("prod", &["checkout"]).await;
    let fresh = api.agent_token("prod", &["checkout"]).await;
    let dir = tempfile::tempdir().unwrap();
    let a = agent(&app.grpc, &seen, &dir.path().join("a"));
    a.wait_for_initial_sync(Duration::from_secs(10)).await.expect("a syncs");
    let rev = a.status().revision;
    assert!(rev > 0);

    pg.stop();

    // The API: 503 problem+json with Retry-After, never 401, within the acquire timeout.
    let t = tokio::time::Instant::now();
    let (status, headers, body) =
        app.call(Method::GET, "/api/v1/environments/prod/services/checkout", None).await;
    assert_problem(status, &headers, &body, StatusCode::SERVICE_UNAVAILABLE);
    assert!(headers.contains_key("retry-after"), "{headers:?}");
    assert!(
        t.elapsed() < levee_server::db::ACQUIRE_TIMEOUT + Duration::from_secs(2),
        "503 took {:?}",
        t.elapsed()
    );
    // /readyz: 503 within its bound.
    let t = tokio::time::Instant::now();
    let res = app.client.get(app.url("/readyz")).send().await.unwrap();
    assert_eq!(res.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert!(
        t.elapsed() < levee_server::app::READYZ_TIMEOUT + Duration::from_millis(500),
        "{:?}",
        t.elapsed()
    );

    // A restarted agent with the verified token: accepted from memory, served the snapshot.
    let b = agent(&app.grpc, &seen, &dir.path().join("b"));
    b.wait_for_initial_sync(Duration::from_secs(10)).await.expect("b is served from memory");
    assert_eq!(b.status().revision, rev);
    // An agent whose token this replica never verified: UNAVAILABLE, not UNAUTHENTICATED.
    let refused = open(&app.grpc, &fresh, "prod", "checkout", "raw-fresh", 0).await.err().expect("refused");
    assert_eq!(refused.code(), Code::Unavailable, "{refused:?}");
    let c = agent(&app.grpc, &fresh, &dir.path().join("c"));
    wait_until("c to see the refusal", Duration::from_secs(10), || c.status().last_error.is_some()).await;
    let err = c.status().last_error.unwrap();
    assert!(err.contains("Unavailable") && !err.contains("Unauthenticated"), "{err}");

    pg.start_again();
    let flipped = flip_when_back(&app, false, Duration::from_secs(10)).await;
    for (name, ag) in [("a", &a), ("b", &b), ("c", &c)] {
        wait_until(&format!("agent {name} to apply the flip"), Duration::from_secs(10), || {
            ag.status().revision == flipped
        })
        .await;
        assert!(!ag.flag_bool("recommendations.enabled", true).get(), "{name} enforces the flip");
    }
    let ids = [a.instance_id(), b.instance_id(), c.instance_id()];
    wait_fleet(&app, &ids, flipped, Duration::from_secs(5)).await;
    for ag in [a, b, c] {
        ag.shutdown().await;
    }
    app.server.unwrap().shutdown().await;
}

/// PostgreSQL stopped while agents are connected: the streams stay up and the agents keep
/// their configuration; an agent that starts during the outage is served from memory and
/// its connection and ACK — written while the database is away — are kept and written
/// once it is back (nothing acknowledged is lost); a flip then reaches every agent within
/// seconds, and the fleet view is right.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn db_outage_connected_agents_keep_their_streams_and_no_ack_is_lost() {
    let Some(pg) = PrivatePg::start() else { return };
    let app = TestApp::spawn_with(Some(pg.url())).await;
    let api = Api::login(&app.base).await;
    api.seed().await;
    let token = api.agent_token("prod", &["checkout"]).await;
    let dir = tempfile::tempdir().unwrap();
    let agents: Vec<_> =
        (0..3).map(|i| agent(&app.grpc, &token, &dir.path().join(format!("a{i}")))).collect();
    for a in &agents {
        a.wait_for_initial_sync(Duration::from_secs(10)).await.expect("initial sync");
    }
    let before = api.set_recommendations(false).await;
    for a in &agents {
        wait_until("the flip before the outage", Duration::from_secs(5), || a.status().revision == before)
            .await;
    }
    pg.stop();
    let late = agent(&app.grpc, &token, &dir.path().join("late"));
    late.wait_for_initial_sync(Duration::from_secs(10)).await.expect("served from memory");
    assert_eq!(late.status().revision, before);

    // While it is away the agents keep their streams and their configuration.
    tokio::time::sleep(Duration::from_secs(2)).await;
    for a in &agents {
        let s = a.status();
        assert!(s.connected, "stream kept through the outage: {s:?}");
        assert_eq!(s.revision, before);
        assert!(!a.flag_bool("recommendations.enabled", true).get());
    }

    pg.start_again();
    // What the late agent did while the database was away reaches it.
    wait_fleet(&app, &[late.instance_id()], before, Duration::from_secs(10)).await;
    let agents: Vec<_> = agents.into_iter().chain([late]).collect();
    let ids: Vec<&str> = agents.iter().map(|a| a.instance_id()).collect();
    let after = flip_when_back(&app, true, Duration::from_secs(10)).await;
    for a in &agents {
        wait_until("the flip after the outage", Duration::from_secs(10), || a.status().revision == after)
            .await;
        assert!(a.flag_bool("recommendations.enabled", false).get());
    }
    wait_fleet(&app, &ids, after, Duration::from_secs(5)).await;
    for a in agents {
        a.shutdown().await;
    }
    app.server.unwrap().shutdown().await;
}

/// PostgreSQL restarted under two running replicas: writes go through replica `a`, the
/// agents hang on replica `b`. After the restart `b` reconnects its `LISTEN` connection,
/// catches up and fans out every change committed meanwhile — several in a row, the last
/// one wins — to its agents within seconds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn db_outage_postgres_restart_under_two_replicas_fans_out_changes_committed_meanwhile() {
    let Some(pg) = PrivatePg::start() else { return };
    let a = TestApp::spawn_with(Some(pg.url())).await;
    let b = TestApp::spawn_with(Some(pg.url())).await;
    let api = Api::login(&a.base).await;
    api.seed().await;
    let token = api.agent_token("prod", &["checkout"]).await;
    let dir = tempfile::tempdir().unwrap();
    let agents: Vec<_> = (0..3).map(|i| agent(&b.grpc, &token, &dir.path().join(format!("a{i}")))).collect();
    for ag in &agents {
        ag.wait_for_initial_sync(Duration::from_secs(10)).await.expect("initial sync through b");
    }

    pg.stop();
    pg.start_again();
    // Committed through a while b may still be reconnecting.
    let mut last = 0;
    for on in [false, true, false] {
        last = flip_when_back(&a, on, Duration::from_secs(10)).await;
    }
    for ag in &agents {
        wait_until("b to fan out the changes committed through a", Duration::from_secs(10), || {
            ag.status().revision == last
        })
        .await;
        assert!(!ag.flag_bool("recommendations.enabled", true).get());
    }
    let ids: Vec<&str> = agents.iter().map(|ag| ag.instance_id()).collect();
    wait_fleet(&a, &ids, last, Duration::from_secs(5)).await;
    for ag in agents {
        ag.shutdown().await;
    }
    b.server.unwrap().shutdown().await;
    a.server.unwrap().shutdown().await;
}

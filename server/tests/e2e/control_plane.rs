//! Sync protocol scenarios against the real server: NACKs (CP-4), bad payloads (CP-3),
//! refused agents (CP-7), corrupt caches (CP-2).

use std::time::Duration;

use levee_agent::Source;
use levee_agent::proto::levee_sync_client::LeveeSyncClient;
use levee_agent::proto::{
    AgentMessage, Hello, Nack, ServerMessage, ServiceState, agent_message, server_message,
};
use levee_server::db::SnapshotRow;
use reqwest::Method;
use tokio::sync::mpsc;
use tokio_stream::StreamExt;
use tokio_stream::wrappers::ReceiverStream;
use tonic::Code;
use tonic::metadata::MetadataValue;

use crate::helpers::TestApp;
use crate::support::{Api, agent, wait_until};

/// A hand-driven agent: sends what the test says, hands back what the server sends.
pub(crate) struct RawAgent {
    pub(crate) tx: mpsc::Sender<AgentMessage>,
    pub(crate) rx: tonic::Streaming<ServerMessage>,
}

pub(crate) async fn open(
    grpc: &str,
    token: &str,
    env: &str,
    service: &str,
    instance: &str,
    applied: u64,
) -> Result<RawAgent, tonic::Status> {
    // A connection that cannot be made is what gRPC calls UNAVAILABLE.
    let mut client = LeveeSyncClient::connect(grpc.to_string())
        .await
        .map_err(|e| tonic::Status::unavailable(format!("cannot connect: {e}")))?;
    let (tx, rx) = mpsc::channel(8);
    tx.send(AgentMessage {
        kind: Some(agent_message::Kind::Hello(Hello {
            instance_id: instance.into(),
            agent_version: "raw-test".into(),
            environment: env.into(),
            services: vec![ServiceState {
                name: service.into(),
                applied_revision: applied,
                hash: String::new(),
            }],
        })),
    })
    .await
    .unwrap();
    let mut req = tonic::Request::new(ReceiverStream::new(rx));
    req.metadata_mut().insert("authorization", MetadataValue::try_from(format!("Bearer {token}")).unwrap());
    let rx = client.sync(req).await?.into_inner();
    Ok(RawAgent { tx, rx })
}

impl RawAgent {
    /// Next snapshot within `within`, skipping heartbeats; None when none came.
    pub(crate) async fn next_snapshot(&mut self, within: Duration) -> Option<levee_agent::proto::Snapshot> {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            match tokio::time::timeout_at(deadline, self.rx.next()).await {
                Ok(Some(Ok(ServerMessage { kind: Some(server_message::Kind::Snapshot(s)) }))) => {
                    return Some(s);
                }
                Ok(Some(Ok(_))) => continue,
                Ok(Some(Err(e))) => panic!("stream error: {e}"),
                Ok(None) | Err(_) => return None,
            }
        }
    }
}

/// Stores a snapshot body directly (as a buggy or older server could) and pushes it.
async fn push_raw_body(app: &TestApp, body: &str) -> u64 {
    let store = app.store();
    let row = sqlx::query("UPDATE services SET revision = revision + 1 WHERE environment = 'prod' AND name = 'checkout' RETURNING revision")
        .fetch_one(store.pool())
        .await
        .unwrap();
    let rev: i64 = sqlx::Row::try_get(&row, "revision").unwrap();
    let hash = levee_agent::policy::content_hash(body.as_bytes());
    sqlx::query("INSERT INTO revisions (environment, service, revision, hash, body, created_at, actor, reason) VALUES ('prod', 'checkout', $1, $2, $3, 0, 'test', 'raw')")
        .bind(rev)
        .bind(&hash)
        .bind(body)
        .execute(store.pool())
        .await
        .unwrap();
    let snap = SnapshotRow {
        environment: "prod".into(),
        service: "checkout".into(),
        revision: rev as u64,
        hash,
        body: body.into(),
        created_at: 0,
    };
    assert!(app.server.as_ref().unwrap().hub.publish(snap));
    rev as u64
}

/// CP-4: a NACKed revision is recorded with its reason, visible in the API, and never sent
/// again to that agent — not on the same stream, not after a reconnect — until the config
/// changes again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cp_4_nacked_revision_is_visible_and_never_resent() {
    let app = TestApp::spawn().await;
    let api = Api::login(&app.base).await;
    api.seed().await;
    let token = api.agent_token("prod", &["checkout"]).await;

    let mut raw = open(&app.grpc, &token, "prod", "checkout", "raw-1", 0).await.unwrap();
    let snap = raw.next_snapshot(Duration::from_secs(5)).await.expect("initial snapshot");
    assert_eq!(snap.revision, 1);
    raw.tx
        .send(AgentMessage {
            kind: Some(agent_message::Kind::Nack(Nack {
                service: "checkout".into(),
                revision: 1,
                nonce: snap.nonce,
                error_detail: "policy.dependencies.x: test rejection".into(),
            })),
        })
        .await
        .unwrap();
    let nacks = "/environments/prod/services/checkout/nacks";
    let mut shown = serde_json::Value::Null;
    for _ in 0..200 {
        shown = api.send(Method::GET, nacks, None).await;
        if !shown.as_array().unwrap().is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(shown[0]["revision"], 1, "{shown}");
    assert_eq!(shown[0]["instance_id"], "raw-1");
    assert_eq!(shown[0]["error_detail"], "policy.dependencies.x: test rejection");

    // Republishing the same revision on this replica does not resend it.
    let cur = app.store().latest_snapshot("prod", "checkout").await.unwrap().unwrap();
    app.server.as_ref().unwrap().hub.publish(cur);
    assert!(raw.next_snapshot(Duration::from_millis(1500)).await.is_none(), "NACKed revision was resent");
    drop(raw);

    // Reconnecting with the same instance id: still not resent.
    let mut again = open(&app.grpc, &token, "prod", "checkout", "raw-1", 0).await.unwrap();
    assert!(
        again.next_snapshot(Duration::from_millis(1500)).await.is_none(),
        "NACKed revision resent after reconnect"
    );
    // A change of config is sent.
    let rev = api.set_recommendations(false).await;
    let next = again.next_snapshot(Duration::from_secs(5)).await.expect("new revision after a change");
    assert_eq!(next.revision, rev);
}

/// CP-4 with a real agent: a snapshot the agent cannot accept (here: stored by a buggy
/// writer, bypassing validation) is NACKed once with a readable reason, the last good
/// config stays in force, and the next good revision is applied.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cp_4_real_agent_nacks_invalid_snapshot_and_keeps_last_good() {
    let app = TestApp::spawn().await;
    let api = Api::login(&app.base).await;
    api.seed().await;
    let token = api.agent_token("prod", &["checkout"]).await;
    let cache = tempfile::tempdir().unwrap();
    let agent = agent(&app.grpc, &token, cache.path());
    agent.wait_for_initial_sync(Duration::from_secs(10)).await.unwrap();
    let rev = api.set_recommendations(false).await;
    let recs = agent.dependency("recommendations");
    wait_until("flip", Duration::from_secs(1), || !recs.is_enabled()).await;

    let bad = push_raw_body(
        &app,
        r#"{"policy":{"dependencies":{"recommendations":{"retry":{"max_attempts":99}}}}}"#,
    )
    .await;
    wait_until("the NACK", Duration::from_secs(5), || agent.status().last_nack.is_some()).await;
    let nack = agent.status().last_nack.unwrap();
    assert_eq!(nack.revision, bad);
    assert!(nack.detail.contains("max_attempts"), "{}", nack.detail);
    assert_eq!(agent.status().revision, rev, "last good config must stay");
    assert!(!recs.is_enabled());
    let mut shown = serde_json::Value::Null;
    for _ in 0..200 {
        shown = api.send(Method::GET, "/environments/prod/services/checkout/nacks", None).await;
        if !shown.as_array().unwrap().is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(shown[0]["error_detail"].as_str().unwrap().contains("max_attempts"), "{shown}");

    let good = api.set_recommendations(true).await;
    // The handles enforce a revision before the status names it: both within the bound.
    wait_until("the next good revision", Duration::from_secs(1), || {
        recs.is_enabled() && agent.status().revision == good
    })
    .await;
    agent.shutdown().await;
}

/// CP-3: a missing, null or unparsable body never clears the rules; an explicit, valid,
/// empty configuration is applied.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cp_3_null_or_garbage_payload_never_clears_rules_but_explicit_empty_config_applies() {
    let app = TestApp::spawn().await;
    let api = Api::login(&app.base).await;
    api.seed().await;
    let token = api.agent_token("prod", &["checkout"]).await;
    let cache = tempfile::tempdir().unwrap();
    let agent = agent(&app.grpc, &token, cache.path());
    agent.wait_for_initial_sync(Duration::from_secs(10)).await.unwrap();
    let rev = api.set_recommendations(false).await;
    let recs = agent.dependency("recommendations");
    wait_until("flip", Duration::from_secs(1), || !recs.is_enabled()).await;

    for body in ["", "null", "{\"policy\": ", "[]"] {
        let bad = push_raw_body(&app, body).await;
        let what = format!("the NACK of body {body:?} (revision {bad})");
        wait_until(&what, Duration::from_secs(5), || {
            agent.status().last_nack.as_ref().is_some_and(|n| n.revision == bad)
        })
        .await;
        assert_eq!(agent.status().revision, rev, "body {body:?} replaced the config");
        assert!(!recs.is_enabled(), "body {body:?} cleared the kill switch");
        assert_eq!(agent.config().flags.len(), 1);
    }

    // Explicitly empty, valid and versioned: applied. (The policy goes first: a flag that
    // is still a kill switch of the policy cannot be deleted, OPS-1.)
    api.send_with(
        Method::PUT,
        "/environments/prod/services/checkout/policy",
        Some(serde_json::json!({"policy": {}, "reason": "empty on purpose"})),
        &[("if-match", "*")],
    )
    .await;
    let v = api
        .send(
            Method::DELETE,
            "/environments/prod/services/checkout/flags/recommendations.enabled?reason=empty",
            None,
        )
        .await;
    let empty_rev = v["revision"].as_u64().unwrap();
    wait_until("the empty config", Duration::from_secs(1), || agent.status().revision == empty_rev).await;
    let cfg = agent.config();
    assert!(cfg.flags.is_empty() && cfg.policy.dependencies.is_empty(), "{cfg:?}");
    // With the server's rules gone, the compiled-in defaults govern: recommendations is on.
    assert!(recs.is_enabled());
    agent.shutdown().await;
}

/// CP-7: a revoked or wrong-scope token gets a clear refusal; the agent reports it and
/// keeps enforcing what it has.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cp_7_revoked_and_wrong_scope_tokens_are_refused_clearly() {
    let app = TestApp::spawn().await;
    let api = Api::login(&app.base).await;
    api.seed().await;
    let token = api.agent_token("prod", &["checkout"]).await;
    // Tokens are minted only for services that exist.
    api.send(
        Method::POST,
        "/environments/prod/services",
        Some(serde_json::json!({"name": "payments", "reason": "e2e", "policy": {"dependencies": {}}})),
    )
    .await;
    let other = api.agent_token("prod", &["payments"]).await;

    let err =
        open(&app.grpc, &other, "prod", "checkout", "i1", 0).await.err().expect("wrong service refused");
    assert_eq!(err.code(), Code::PermissionDenied);
    assert!(err.message().contains("\"checkout\""), "{}", err.message());
    let err = open(&app.grpc, &token, "staging", "checkout", "i1", 0)
        .await
        .err()
        .expect("wrong environment refused");
    assert_eq!(err.code(), Code::PermissionDenied);
    let err =
        open(&app.grpc, "not-a-jwt", "prod", "checkout", "i1", 0).await.err().expect("garbage token refused");
    assert_eq!(err.code(), Code::Unauthenticated);
    let api_token = api.token.clone();
    let err =
        open(&app.grpc, &api_token, "prod", "checkout", "i1", 0).await.err().expect("API token refused");
    assert_eq!(err.code(), Code::Unauthenticated);

    // Revoke the good token: new streams are refused with a message naming the cause.
    let tokens = api.send(Method::GET, "/tokens", None).await;
    let id = tokens.as_array().unwrap().iter().find(|t| t["services"][0] == "checkout").unwrap()["id"]
        .as_str()
        .unwrap()
        .to_string();
    api.send(Method::DELETE, &format!("/tokens/{id}?reason=leaked"), None).await;
    let err =
        open(&app.grpc, &token, "prod", "checkout", "i1", 0).await.err().expect("revoked token refused");
    assert_eq!(err.code(), Code::Unauthenticated);
    assert!(err.message().contains("revoked"), "{}", err.message());

    // A real agent with the revoked token: reports the refusal, enforces its defaults.
    let cache = tempfile::tempdir().unwrap();
    let agent = agent(&app.grpc, &token, cache.path());
    wait_until("the refusal to be reported", Duration::from_secs(5), || agent.status().last_error.is_some())
        .await;
    let status = agent.status();
    assert!(status.last_error.as_deref().unwrap().contains("revoked"), "{status:?}");
    assert_eq!(status.source, Source::Default);
    assert!(!status.connected);
    agent.shutdown().await;
}

/// CP-2: the newest cache file is truncated mid-write; an agent started while the server
/// is unreachable uses the newest valid generation; with every file garbage it uses the
/// compiled-in defaults. Startup is never blocked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cp_2_corrupt_cache_uses_newest_valid_generation_or_defaults() {
    let app = TestApp::spawn().await;
    let api = Api::login(&app.base).await;
    api.seed().await;
    let token = api.agent_token("prod", &["checkout"]).await;
    let cache = tempfile::tempdir().unwrap();
    let live = agent(&app.grpc, &token, cache.path());
    live.wait_for_initial_sync(Duration::from_secs(10)).await.unwrap();
    let off = api.set_recommendations(false).await;
    wait_until("rev off", Duration::from_secs(1), || live.status().revision == off).await;
    let on = api.set_recommendations(true).await;
    wait_until("rev on", Duration::from_secs(1), || live.status().revision == on).await;
    live.shutdown().await;

    let dir = cache.path().join("prod").join("checkout");
    let mut files: Vec<_> = std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().path()).collect();
    files.sort();
    assert!(files.len() >= 2, "{files:?}");
    let newest = files.last().unwrap().clone();
    let bytes = std::fs::read(&newest).unwrap();
    std::fs::write(&newest, &bytes[..bytes.len() / 2]).unwrap();

    let unreachable = "http://127.0.0.1:9"; // discard port: nothing listens
    let a = agent(unreachable, &token, cache.path());
    let s = a.status();
    assert_eq!((s.source, s.revision), (Source::Cache, off), "{s:?}");
    assert!(!a.dependency("recommendations").is_enabled());
    a.shutdown().await;

    for f in &files {
        std::fs::write(f, b"\x00garbage{{{").unwrap();
    }
    let b = agent(unreachable, &token, cache.path());
    let s = b.status();
    assert_eq!((s.source, s.revision), (Source::Default, 0), "{s:?}");
    assert!(b.dependency("recommendations").is_enabled(), "compiled-in default is on");
    b.shutdown().await;
}

/// CP-8: two replicas on one PostgreSQL. A change committed on replica A reaches an agent
/// connected to replica B through NOTIFY; with every LISTEN connection killed at the moment
/// of the next change, the change still reaches it (catch-up after re-LISTEN, safety poll).
/// Skipped without PostgreSQL, unless LEVEE_REQUIRE_POSTGRES (CI) makes that a failure.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cp_8_lost_notification_still_reaches_the_other_replicas_agents() {
    let Some(url) = crate::helpers::postgres_url().await else { return };
    let a = TestApp::spawn_with(Some(url.clone())).await;
    let b = TestApp::spawn_with(Some(url.clone())).await;
    let api = Api::login(&a.base).await;
    api.seed().await;
    let token = api.agent_token("prod", &["checkout"]).await;
    let cache = tempfile::tempdir().unwrap();
    let agent = agent(&b.grpc, &token, cache.path());
    agent.wait_for_initial_sync(Duration::from_secs(10)).await.unwrap();
    let recs = agent.dependency("recommendations");

    let off = api.set_recommendations(false).await;
    let took = wait_until("the change from replica A via NOTIFY", Duration::from_secs(2), || {
        agent.status().revision == off
    })
    .await;
    println!("replica A write -> agent on replica B applied: {took:?}");
    assert!(!recs.is_enabled());

    // Keep killing every LISTEN connection of this database for a while (each replica
    // re-LISTENs at once), and commit on A in the middle of it: the NOTIFY is very likely
    // to find no listener on B, so only the catch-up after re-LISTEN can deliver it.
    sqlx::any::install_default_drivers();
    let pool = sqlx::any::AnyPoolOptions::new().max_connections(1).connect(&url).await.unwrap();
    let killer = tokio::spawn(async move {
        let mut killed = 0i64;
        let until = tokio::time::Instant::now() + Duration::from_millis(600);
        while tokio::time::Instant::now() < until {
            killed += sqlx::query_scalar::<_, i64>(
                "SELECT COUNT(*) FROM (SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
                 WHERE datname = current_database() AND query ILIKE 'LISTEN%') AS t",
            )
            .fetch_one(&pool)
            .await
            .unwrap();
        }
        killed
    });
    tokio::time::sleep(Duration::from_millis(150)).await;
    let on = api.set_recommendations(true).await;
    let killed = killer.await.unwrap();
    assert!(killed >= 2, "LISTEN connections were killed ({killed})");
    wait_until("the change committed while LISTEN was down", Duration::from_secs(10), || {
        agent.status().revision == on
    })
    .await;
    assert!(recs.is_enabled());
    agent.shutdown().await;
}

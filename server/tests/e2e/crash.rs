//! Crash safety (targets.md, "Reliability"): the real `levee` binary killed with SIGKILL
//! during 1,000 concurrent writes loses no write it acknowledged — each is stored with its
//! audit row and the revision chain has no gap — on SQLite and on PostgreSQL; and agents
//! connected to a killed server keep enforcing, then re-sync after its restart without a
//! NACK.

use std::collections::{BTreeMap, HashSet};
use std::time::Duration;

use reqwest::StatusCode;
use serde_json::json;
use sqlx::Row;

use crate::helpers::{ADMIN_PASSWORD, postgres_url};
use crate::support::{Api, BinServer, agent, wait_until};

/// Services written concurrently (each write bumps one service's revision).
const SERVICES: usize = 10;
/// Writes started at once, over [`CLIENTS`] connection pools.
const WRITES: usize = 1_000;
/// HTTP clients (separate connection pools) the writes are spread over.
const CLIENTS: usize = 8;
/// Acknowledged writes after which the server is killed (the rest are in flight).
const KILL_AFTER: usize = 300;

async fn start(data: &std::path::Path, db: Option<&str>, http: &str, grpc: &str) -> BinServer {
    let env: Vec<(&str, &str)> = db.map(|u| vec![("LEVEE_DATABASE_URL", u)]).unwrap_or_default();
    BinServer::start_with(data, http, grpc, &env).await
}

/// Seeds SERVICES services with one int flag each (every write sets a new value, so each
/// one is a new revision); returns an admin token.
async fn seed(base: &str) -> String {
    let api = Api::login(base).await;
    api.send(reqwest::Method::POST, "/environments", Some(json!({"name": "prod", "reason": "crash test"})))
        .await;
    for i in 0..SERVICES {
        api.send(
            reqwest::Method::POST,
            "/environments/prod/services",
            Some(json!({"name": format!("svc{i}"), "reason": "crash test",
                        "flags": {"f": {"type": "int", "value": -1}}})),
        )
        .await;
    }
    api.token
}

/// Starts WRITES flag writes at once, kills the server after KILL_AFTER were acknowledged,
/// and returns every acknowledged one as (service, revision, reason).
async fn write_until_killed(server: BinServer, token: &str) -> Vec<(String, u64, String)> {
    let base = format!("http://{}", server.http);
    let clients: Vec<reqwest::Client> = (0..CLIENTS).map(|_| reqwest::Client::new()).collect();
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    for k in 0..WRITES {
        let client = clients[k % CLIENTS].clone();
        let (tx, token, base) = (tx.clone(), token.to_string(), base.clone());
        tokio::spawn(async move {
            let service = format!("svc{}", k % SERVICES);
            let reason = format!("write {k}");
            let res = client
                .patch(format!("{base}/api/v1/environments/prod/services/{service}/flags/f"))
                .bearer_auth(&token)
                .json(&json!({"value": k, "reason": reason}))
                .send()
                .await;
            // Acknowledged = a 2xx whose body was read in full.
            if let Ok(res) = res
                && res.status().is_success()
                && let Ok(body) = res.json::<serde_json::Value>().await
            {
                let _ = tx.send((service, body["revision"].as_u64().unwrap(), reason));
            }
        });
    }
    drop(tx);
    let mut acked = Vec::new();
    while acked.len() < KILL_AFTER {
        acked.push(tokio::time::timeout(Duration::from_secs(60), rx.recv()).await.unwrap().unwrap());
    }
    server.kill().await;
    // Answers that arrived before the kill took effect count as acknowledged too.
    while let Some(a) = rx.recv().await {
        acked.push(a);
    }
    assert!(acked.len() < WRITES, "the kill came after every write finished: nothing was in flight");
    eprintln!("{} of {WRITES} writes acknowledged before the kill", acked.len());
    acked
}

/// Every acknowledged write is stored with its reason and its audit row; per service the
/// revisions run 1..=current without a gap, each with exactly one `flag.set` or
/// `service.create` audit row naming it.
async fn check_store(url: &str, acked: &[(String, u64, String)]) {
    sqlx::any::install_default_drivers();
    let pool = sqlx::any::AnyPoolOptions::new().max_connections(1).connect(url).await.unwrap();
    let mut revisions: BTreeMap<(String, u64), String> = BTreeMap::new();
    for r in sqlx::query("SELECT service, revision, reason FROM revisions WHERE environment = 'prod'")
        .fetch_all(&pool)
        .await
        .unwrap()
    {
        let rev: i64 = r.try_get("revision").unwrap();
        revisions.insert((r.try_get("service").unwrap(), rev as u64), r.try_get("reason").unwrap());
    }
    let mut audited: BTreeMap<(String, u64), usize> = BTreeMap::new();
    let mut audit_reasons = HashSet::new();
    for r in sqlx::query(
        "SELECT service, revision, reason FROM audit WHERE environment = 'prod' AND revision IS NOT NULL \
         AND outcome = 'ok'",
    )
    .fetch_all(&pool)
    .await
    .unwrap()
    {
        let rev: i64 = r.try_get("revision").unwrap();
        let service: String = r.try_get("service").unwrap();
        *audited.entry((service.clone(), rev as u64)).or_default() += 1;
        audit_reasons.insert((service, rev as u64, r.try_get::<String, _>("reason").unwrap()));
    }
    for (service, rev, reason) in acked {
        assert_eq!(
            revisions.get(&(service.clone(), *rev)),
            Some(reason),
            "acknowledged write {reason:?} ({service} revision {rev}) is missing"
        );
        assert!(
            audit_reasons.contains(&(service.clone(), *rev, reason.clone())),
            "acknowledged write {reason:?} has no audit row"
        );
    }
    for i in 0..SERVICES {
        let service = format!("svc{i}");
        let row = sqlx::query("SELECT revision FROM services WHERE environment = 'prod' AND name = $1")
            .bind(&service)
            .fetch_one(&pool)
            .await
            .unwrap();
        let current = row.try_get::<i64, _>("revision").unwrap() as u64;
        for rev in 1..=current {
            assert!(revisions.contains_key(&(service.clone(), rev)), "{service}: revision {rev} missing");
            assert_eq!(
                audited.get(&(service.clone(), rev)),
                Some(&1),
                "{service}: revision {rev} audit rows"
            );
        }
        assert!(!revisions.contains_key(&(service.clone(), current + 1)), "{service}: beyond the counter");
    }
    pool.close().await;
}

async fn kill_during_writes(db: Option<String>) {
    let data = tempfile::tempdir().unwrap();
    let server = start(data.path(), db.as_deref(), "127.0.0.1:0", "127.0.0.1:0").await;
    let (http, grpc) = (server.http, server.grpc);
    let token = seed(&format!("http://{http}")).await;
    let acked = write_until_killed(server, &token).await;
    // The server starts again on what was written (SQLite recovers its WAL) …
    let server = start(data.path(), db.as_deref(), &http.to_string(), &grpc.to_string()).await;
    let res = reqwest::Client::new()
        .post(format!("http://{http}/api/v1/auth/login"))
        .json(&json!({"username": "admin", "password": ADMIN_PASSWORD}))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    server.kill().await;
    // … and every acknowledged write is in it.
    let url = db.unwrap_or_else(|| format!("sqlite://{}", data.path().join("levee.db").display()));
    check_store(&url, &acked).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crash_kill_9_during_1000_concurrent_writes_loses_no_acknowledged_write_sqlite() {
    kill_during_writes(None).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crash_kill_9_during_1000_concurrent_writes_loses_no_acknowledged_write_postgres() {
    let Some(url) = postgres_url().await else { return };
    kill_during_writes(Some(url)).await;
}

/// Agents connected to a server killed with SIGKILL keep enforcing what they applied; when
/// it is back they re-sync by themselves — the change committed just before the kill and
/// one made after the restart both apply — and none of them NACKs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crash_kill_9_with_agents_connected_they_keep_enforcing_and_resync_without_nack() {
    let data = tempfile::tempdir().unwrap();
    let server = BinServer::start(data.path(), "127.0.0.1:0", "127.0.0.1:0").await;
    let (http, grpc) = (server.http, server.grpc);
    let api = Api::login(&format!("http://{http}")).await;
    api.seed().await;
    let token = api.agent_token("prod", &["checkout"]).await;
    let caches = tempfile::tempdir().unwrap();
    let agents: Vec<_> = (0..5)
        .map(|i| agent(&format!("http://{grpc}"), &token, &caches.path().join(format!("a{i}"))))
        .collect();
    for a in &agents {
        a.wait_for_initial_sync(Duration::from_secs(10)).await.expect("initial sync");
    }
    let off = api.set_recommendations(false).await;
    server.kill().await;
    for a in &agents {
        wait_until("the agent to notice the kill", Duration::from_secs(10), || !a.status().connected).await;
        // Whether the flip arrived before the kill or not, the agent enforces what it has.
        let s = a.status();
        assert!(s.revision == off || s.revision == off - 1, "{s:?}");
        assert_eq!(a.dependency("recommendations").is_enabled(), s.revision != off);
    }

    let server = BinServer::start(data.path(), &http.to_string(), &grpc.to_string()).await;
    for a in &agents {
        wait_until("the committed flip to reach every agent", Duration::from_secs(10), || {
            a.status().revision == off
        })
        .await;
        assert!(!a.dependency("recommendations").is_enabled());
    }
    let api = Api::login(&format!("http://{http}")).await;
    let on = api.set_recommendations(true).await;
    for a in &agents {
        wait_until("the flip after the restart", Duration::from_secs(5), || a.status().revision == on).await;
        assert!(a.dependency("recommendations").is_enabled());
        assert!(a.status().last_nack.is_none(), "{:?}", a.status());
    }
    let nacks = api.send(reqwest::Method::GET, "/environments/prod/services/checkout/nacks", None).await;
    assert_eq!(nacks, json!([]), "no agent NACKed");
    for a in agents {
        a.shutdown().await;
    }
    server.kill().await;
}

//! The deployment's promise through its own load balancer: two replicas on PostgreSQL
//! behind Debian's `haproxy` started with the repository's `deploy/haproxy.cfg` (only the
//! addresses substituted). While the database is unreachable the replicas leave the API
//! backend (`/readyz`) but stay in the agents' one (`/readyz/agents`): a **new** agent
//! connecting through HAProxy gets the current configuration, the API answers 503
//! problem+json with `Retry-After`, and everything converges once the database is back.
//!
//! Needs the `haproxy` binary (or LEVEE_TEST_HAPROXY naming it): skipped without it unless
//! LEVEE_REQUIRE_HAPROXY is set (CI sets it), then it fails.

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::helpers::TestApp;
use crate::private_pg::PrivatePg;
use crate::support::{Api, agent, wait_until};

/// What HAProxy's own 503 says (deploy/haproxy.cfg, `http-error status 503`): seen only
/// when no replica is left in the API backend.
const NO_REPLICA: &str = "no levee replica can take this request now";

fn find_haproxy() -> Option<PathBuf> {
    if let Ok(p) = std::env::var("LEVEE_TEST_HAPROXY") {
        return Some(PathBuf::from(p));
    }
    ["/usr/sbin/haproxy", "/usr/bin/haproxy", "/usr/local/sbin/haproxy"]
        .into_iter()
        .map(PathBuf::from)
        .find(|p| p.exists())
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// Replaces every `from` in `text` by `to`, insisting that `from` is there: a change of
/// deploy/haproxy.cfg that this substitution no longer matches fails the test instead of
/// running HAProxy on addresses nobody listens on.
fn substitute(text: &str, from: &str, to: &str) -> String {
    assert!(text.contains(from), "deploy/haproxy.cfg no longer contains {from:?}");
    text.replace(from, to)
}

/// HAProxy on `deploy/haproxy.cfg` with the compose names of the replicas replaced by the
/// loopback addresses of `a` and `b`; stopped on drop.
struct Haproxy {
    _child: tokio::process::Child,
    _dir: tempfile::TempDir,
    api: String,
    agents: String,
}

impl Haproxy {
    async fn start(exe: &std::path::Path, a: &TestApp, b: &TestApp) -> Haproxy {
        let cfg = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../deploy/haproxy.cfg"))
            .expect("deploy/haproxy.cfg");
        let (api_port, agents_port) = (free_port(), free_port());
        let mut cfg = substitute(&cfg, "bind :8080", &format!("bind 127.0.0.1:{api_port}"));
        cfg = substitute(&cfg, "bind :8081", &format!("bind 127.0.0.1:{agents_port}"));
        for (name, app) in [("levee-1", a), ("levee-2", b)] {
            let server = app.server.as_ref().unwrap();
            let (http, grpc) = (server.http_addr, server.grpc_addr);
            cfg = substitute(
                &cfg,
                &format!("{name}:8081 proto h2 check port 8080"),
                &format!("{grpc} proto h2 check port {}", http.port()),
            );
            cfg = substitute(&cfg, &format!("{name}:8080"), &http.to_string());
        }
        assert!(
            !cfg.contains("levee-1:") && !cfg.contains("levee-2:"),
            "an address left unsubstituted:\n{cfg}"
        );
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("haproxy.cfg");
        std::fs::write(&path, &cfg).unwrap();
        let log = dir.path().join("haproxy.log");
        let mut child = tokio::process::Command::new(exe)
            .arg("-db") // foreground
            .arg("-f")
            .arg(&path)
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .kill_on_drop(true)
            .spawn()
            .expect("haproxy starts");
        let client = reqwest::Client::new();
        let start = tokio::time::Instant::now();
        loop {
            if let Some(status) = child.try_wait().unwrap() {
                panic!("haproxy exited ({status}): {}", std::fs::read_to_string(&log).unwrap_or_default());
            }
            if let Ok(r) = client.get(format!("http://127.0.0.1:{api_port}/healthz")).send().await
                && r.status() == StatusCode::OK
            {
                break;
            }
            assert!(
                start.elapsed() < Duration::from_secs(20),
                "HAProxy did not forward /healthz within 20 s"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Haproxy {
            _child: child,
            _dir: dir,
            api: format!("http://127.0.0.1:{api_port}"),
            agents: format!("http://127.0.0.1:{agents_port}"),
        }
    }
}

/// A GET of the service through `base` with the admin token: status, headers, body.
async fn get_service(
    client: &reqwest::Client,
    base: &str,
    token: &str,
) -> (StatusCode, reqwest::header::HeaderMap, String) {
    let res = client
        .get(format!("{base}/api/v1/environments/prod/services/checkout"))
        .bearer_auth(token)
        .send()
        .await
        .unwrap();
    let (status, headers) = (res.status(), res.headers().clone());
    (status, headers, res.text().await.unwrap())
}

/// Two replicas on a PostgreSQL of the test's own behind HAProxy: the database stopped,
/// every replica still answers `/readyz/agents` 200 and `/readyz` 503, HAProxy takes both
/// out of the API backend (its own 503 problem+json with `Retry-After` proves it) and
/// keeps them in the agents' backend, so an agent that starts now — through HAProxy, with
/// an empty cache — is served the configuration committed before the outage. The
/// database back, a flip made through HAProxy reaches the old agents and the new one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn db_outage_new_agent_is_served_through_haproxy_while_postgres_is_unreachable() {
    let Some(exe) = find_haproxy() else {
        assert!(
            std::env::var("LEVEE_REQUIRE_HAPROXY").is_err(),
            "LEVEE_REQUIRE_HAPROXY is set but no haproxy binary was found (apt-get install haproxy)"
        );
        eprintln!("no haproxy binary: skipping the HAProxy database-outage test");
        return;
    };
    let Some(pg) = PrivatePg::start() else { return };
    let a = TestApp::spawn_with(Some(pg.url())).await;
    let b = TestApp::spawn_with(Some(pg.url())).await;
    let lb = Haproxy::start(&exe, &a, &b).await;
    let api = Api::login(&lb.api).await;
    api.seed().await;
    let token = api.agent_token("prod", &["checkout"]).await;

    // One agent on each replica, so each has verified the service's token (a replica
    // accepts a token from memory only once it has checked it against the database).
    let dir = tempfile::tempdir().unwrap();
    let on_a = agent(&a.grpc, &token, &dir.path().join("on-a"));
    let on_b = agent(&b.grpc, &token, &dir.path().join("on-b"));
    for ag in [&on_a, &on_b] {
        ag.wait_for_initial_sync(Duration::from_secs(10)).await.expect("initial sync");
    }
    let before = api.set_recommendations(false).await;
    for ag in [&on_a, &on_b] {
        wait_until("the flip before the outage", Duration::from_secs(10), || ag.status().revision == before)
            .await;
    }

    pg.stop();

    // Each replica: ready for agents, not for writes.
    for app in [&a, &b] {
        let agents = app.client.get(app.url("/readyz/agents")).send().await.unwrap();
        assert_eq!(agents.status(), StatusCode::OK, "/readyz/agents while the database is away");
        let writes = app.client.get(app.url("/readyz")).send().await.unwrap();
        assert_eq!(writes.status(), StatusCode::SERVICE_UNAVAILABLE, "/readyz while the database is away");
    }

    // Through HAProxy the API answers 503 problem+json with Retry-After all along: first
    // from a replica, then — once its checks took both replicas out — from HAProxy itself.
    let start = tokio::time::Instant::now();
    loop {
        let (status, headers, body) = get_service(&api.client, &lb.api, &api.token).await;
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
        assert!(headers.contains_key("retry-after"), "no Retry-After: {headers:?} {body}");
        let ct = headers.get("content-type").and_then(|v| v.to_str().ok()).unwrap_or("");
        assert!(ct.starts_with("application/problem+json"), "content type {ct:?}: {body}");
        let problem: Value = serde_json::from_str(&body).expect("a JSON problem");
        assert_eq!(problem["status"], json!(503), "{body}");
        if body.contains(NO_REPLICA) {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "HAProxy kept a replica in the API backend: {body}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // A new agent, through HAProxy, from an empty cache: served the current configuration.
    let new = agent(&lb.agents, &token, &dir.path().join("new"));
    new.wait_for_initial_sync(Duration::from_secs(15))
        .await
        .expect("a new agent is served through HAProxy while the database is away");
    assert_eq!(new.status().revision, before);
    assert!(!new.flag_bool("recommendations.enabled", true).get(), "the new agent obeys the kill switch");

    // The database back: a flip through HAProxy reaches every agent.
    pg.start_again();
    let start = tokio::time::Instant::now();
    let after = loop {
        let res = api
            .client
            .patch(format!(
                "{}/api/v1/environments/prod/services/checkout/flags/recommendations.enabled",
                lb.api
            ))
            .bearer_auth(&api.token)
            .json(&json!({"value": true, "reason": "database back"}))
            .send()
            .await
            .unwrap();
        let status = res.status();
        let body: Value = res.json().await.unwrap_or(Value::Null);
        if status.is_success() {
            break body["revision"].as_u64().unwrap();
        }
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "only 503 while the database returns: {body}");
        assert!(start.elapsed() < Duration::from_secs(30), "no replica took the flip within 30 s: {body}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    for (name, ag) in [("on-a", &on_a), ("on-b", &on_b), ("new", &new)] {
        wait_until(&format!("agent {name} to apply the flip"), Duration::from_secs(15), || {
            ag.status().revision == after
        })
        .await;
        assert!(ag.flag_bool("recommendations.enabled", false).get(), "{name} enforces the flip");
    }
    let (status, _, body) = get_service(&api.client, &lb.api, &api.token).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    for ag in [on_a, on_b, new] {
        ag.shutdown().await;
    }
    drop(lb);
    b.server.unwrap().shutdown().await;
    a.server.unwrap().shutdown().await;
}

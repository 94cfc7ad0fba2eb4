//! Server `/metrics`: the names documented in docs/operations.md are the names the server
//! exports (a live server with a real agent, a push, an ACK, a NACK and a revoked token),
//! and the Grafana dashboard in deploy/ uses only names that exist (server or agent).

use std::collections::BTreeSet;
use std::time::Duration;

use levee_agent::proto::{AgentMessage, Nack, agent_message};
use levee_server::Server;
use levee_server::config::{Secret, Settings};
use reqwest::Method;

use crate::control_plane::open;
use crate::helpers::{ADMIN_PASSWORD, JWT_SECRET};
use crate::support::{Api, agent, recorder, wait_until};

const ROOT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/..");

/// Metric names of the table in docs/operations.md's "Server metrics" section.
fn documented_server_metrics() -> BTreeSet<String> {
    let doc = std::fs::read_to_string(format!("{ROOT}/docs/operations.md")).unwrap();
    let section = doc.split("## Server metrics").nth(1).expect("a Server metrics section");
    let section = section.split("\n## ").next().unwrap();
    section
        .lines()
        .filter_map(|l| l.strip_prefix("| `levee_server_"))
        .map(|rest| format!("levee_server_{}", rest.split('`').next().unwrap()))
        .collect()
}

/// Base names in a Prometheus exposition (histogram series folded into their name).
fn exported(text: &str) -> BTreeSet<String> {
    text.lines()
        .filter(|l| l.starts_with("# TYPE "))
        .map(|l| l.split_whitespace().nth(2).unwrap().to_string())
        .collect()
}

/// Every `levee_*` name the agent defines (metrics_names.rs).
fn agent_metrics() -> BTreeSet<String> {
    ["agent/src/metrics_names.rs"]
        .iter()
        .flat_map(|f| {
            let src = std::fs::read_to_string(format!("{ROOT}/{f}")).unwrap();
            src.lines()
                .filter(|l| l.trim_start().starts_with("pub const ") && l.contains("\"levee_"))
                .map(|l| l.split('"').nth(1).unwrap().to_string())
                .collect::<Vec<_>>()
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_metrics_are_the_documented_ones() {
    let handle = recorder();
    let dir = tempfile::tempdir().unwrap();
    let mut settings = Settings::for_dir(dir.path());
    settings.admin_password = Some(Secret::new(ADMIN_PASSWORD));
    settings.jwt_secret = Some(Secret::new(JWT_SECRET));
    let server = Server::start(settings, Some(handle)).await.unwrap();
    let base = format!("http://{}", server.http_addr);
    let grpc = format!("http://{}", server.grpc_addr);
    let api = Api::login(&base).await;
    api.seed().await;
    let minted = api
        .send(
            Method::POST,
            "/tokens",
            Some(serde_json::json!({"kind": "agent", "name": "m", "environment": "prod",
                "services": ["checkout"], "reason": "metrics"})),
        )
        .await;
    let token = minted["token"].as_str().unwrap();
    // A real agent: a push and an ACK, then a change propagated to it.
    let cache = tempfile::tempdir().unwrap();
    let real = agent(&grpc, token, cache.path());
    real.wait_for_initial_sync(Duration::from_secs(10)).await.unwrap();
    let rev = api.set_recommendations(false).await;
    wait_until("the agent applies the change", Duration::from_secs(10), || real.status().revision == rev)
        .await;
    // A NACK, then the token revoked under an open stream.
    let mut raw = open(&grpc, token, "prod", "checkout", "metrics-raw", 0).await.unwrap();
    let snap = raw.next_snapshot(Duration::from_secs(5)).await.unwrap();
    raw.tx
        .send(AgentMessage {
            kind: Some(agent_message::Kind::Nack(Nack {
                service: "checkout".into(),
                revision: snap.revision,
                nonce: snap.nonce,
                error_detail: "metrics test".into(),
            })),
        })
        .await
        .unwrap();
    let id = minted["id"].as_str().unwrap();
    api.send(Method::DELETE, &format!("/tokens/{id}?reason=metrics"), None).await;

    let client = reqwest::Client::new();
    let mut text;
    let required = [
        "levee_server_http_request_duration_seconds",
        "levee_server_streams",
        "levee_server_snapshots_sent_total",
        "levee_server_acks_total",
        "levee_server_nacks_total",
        "levee_server_propagation_seconds",
        "levee_server_db_query_duration_seconds",
        "levee_server_audit_writes_total",
        "levee_server_streams_ended_total",
    ];
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let res = client.get(format!("{base}/metrics")).send().await.unwrap();
        assert_eq!(res.status(), 200);
        assert!(res.headers()["content-type"].to_str().unwrap().starts_with("text/plain"));
        text = res.text().await.unwrap();
        let names = exported(&text);
        if required.iter().all(|r| names.contains(*r)) {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "missing: {:?}\n{text}",
            required.iter().filter(|r| !names.contains(**r)).collect::<Vec<_>>()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let documented = documented_server_metrics();
    for r in required {
        assert!(documented.contains(r), "{r} is exported but not in docs/operations.md");
    }
    // Everything the server exports is documented (other tests' servers share the recorder,
    // which only adds more of the same names).
    for name in exported(&text).iter().filter(|n| n.starts_with("levee_server_")) {
        assert!(documented.contains(name), "{name} is exported but not documented");
    }
    // Every documented name is emitted somewhere in the server's source.
    let mut src = String::new();
    for entry in walk(&format!("{ROOT}/server/src")) {
        src.push_str(&std::fs::read_to_string(entry).unwrap());
    }
    for name in &documented {
        assert!(src.contains(&format!("\"{name}\"")), "{name} is documented but never emitted");
    }
    // Latency is by route template, never by raw path.
    assert!(text.contains(r#"route="/api/v1/environments/{env}/services/{svc}/flags/{key}""#), "{text}");
    assert!(!text.contains(r#"route="/api/v1/environments/prod"#));
    assert!(text.contains("levee_server_propagation_seconds_bucket{le="), "a histogram, not a summary");
    drop(real);
    server.shutdown().await;
}

fn walk(dir: &str) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            out.extend(walk(p.to_str().unwrap()));
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
    out
}

/// deploy/grafana/levee.json parses, and every metric its queries use is a documented
/// server metric or one the agent defines.
#[test]
fn grafana_dashboard_uses_only_metrics_that_exist() {
    let text = std::fs::read_to_string(format!("{ROOT}/deploy/grafana/levee.json")).unwrap();
    let dash: serde_json::Value = serde_json::from_str(&text).expect("the dashboard is JSON");
    let known: BTreeSet<String> = documented_server_metrics().into_iter().chain(agent_metrics()).collect();
    assert!(known.contains("levee_calls_total") && known.contains("levee_server_acks_total"));
    let mut exprs = Vec::new();
    fn collect(v: &serde_json::Value, out: &mut Vec<String>) {
        match v {
            serde_json::Value::Object(m) => {
                if let Some(e) = m.get("expr").and_then(|e| e.as_str()) {
                    out.push(e.to_string());
                }
                m.values().for_each(|v| collect(v, out));
            }
            serde_json::Value::Array(a) => a.iter().for_each(|v| collect(v, out)),
            _ => {}
        }
    }
    collect(&dash, &mut exprs);
    assert!(exprs.len() >= 15, "{exprs:?}");
    let mut used = BTreeSet::new();
    for e in &exprs {
        for (i, _) in e.match_indices("levee_") {
            let name: String = e[i..]
                .chars()
                .take_while(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '_')
                .collect();
            let base = ["_bucket", "_count", "_sum"]
                .iter()
                .find_map(|s| name.strip_suffix(s).filter(|b| known.contains(*b)))
                .map(str::to_string)
                .unwrap_or(name.clone());
            assert!(known.contains(&base), "{name} in {e:?} is not a metric Levee exports");
            used.insert(base);
        }
    }
    for server_metric in ["levee_server_http_request_duration_seconds", "levee_server_propagation_seconds"] {
        assert!(used.contains(server_metric), "the dashboard shows {server_metric}");
    }
    assert!(used.iter().any(|n| !n.starts_with("levee_server_")), "the dashboard shows agent metrics too");
}

/// `/metrics` protected both ways: with `ops_addr` it is served there (with the probes) and
/// no longer on the HTTP address; with `metrics_token` it answers 401 without the bearer
/// token, 401 with a wrong one, and the exposition with the right one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_move_to_the_ops_address_and_ask_for_the_token() {
    const TOKEN: &str = "scrape-token-0123456789";
    let dir = tempfile::tempdir().unwrap();
    let mut settings = Settings::for_dir(dir.path());
    settings.admin_password = Some(Secret::new(ADMIN_PASSWORD));
    settings.jwt_secret = Some(Secret::new(JWT_SECRET));
    settings.ops_addr = Some("127.0.0.1:0".parse().unwrap());
    settings.metrics_token = Some(Secret::new(TOKEN));
    let server = Server::start(settings, Some(recorder())).await.unwrap();
    let http = format!("http://{}", server.http_addr);
    let ops = format!("http://{}", server.ops_addr.expect("the operations address is bound"));
    let client = reqwest::Client::new();
    let get = |url: String, token: Option<&'static str>| {
        let mut req = client.get(url);
        if let Some(t) = token {
            req = req.bearer_auth(t);
        }
        async move {
            let res = req.send().await.unwrap();
            (res.status().as_u16(), res.text().await.unwrap())
        }
    };
    assert_eq!(get(format!("{http}/metrics"), Some(TOKEN)).await.0, 404, "metrics left the HTTP address");
    assert_eq!(get(format!("{ops}/metrics"), None).await.0, 401);
    assert_eq!(get(format!("{ops}/metrics"), Some("scrape-token-wrong-value")).await.0, 401);
    let (status, text) = get(format!("{ops}/metrics"), Some(TOKEN)).await;
    assert_eq!(status, 200);
    assert!(text.contains("# TYPE "), "{text}");
    for probe in ["/healthz", "/readyz", "/readyz/agents"] {
        assert_eq!(get(format!("{ops}{probe}"), None).await.0, 200, "{probe} on the operations address");
        assert_eq!(get(format!("{http}{probe}"), None).await.0, 200, "{probe} on the HTTP address");
    }
    server.shutdown().await;
}

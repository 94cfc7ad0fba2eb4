//! The fleet view against a real agent (names, applied revision and source agreeing
//! between the row and its status report, disconnected agents never "live"), propagation
//! latency per revision, and the alert_after watcher with its webhook.

use std::sync::Arc;
use std::time::Duration;

use axum::Json;
use axum::http::StatusCode as AxumStatus;
use levee_agent::policy::Timestamp;
use levee_agent::{Agent, SyncClientSettings};
use levee_server::alerts::{AlertWatcher, FallbackAlert, PAST_ALERT_GAUGE, deliver};
use levee_server::db::AgentUpsert;
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

use crate::helpers::TestApp;

const AGENTS: &str = "/environments/prod/services/checkout/agents";

fn agent(app: &TestApp, token: &str, name: &str, cache: &std::path::Path) -> Agent {
    Agent::builder(&app.grpc, token, "prod", "checkout")
        .cache_dir(cache)
        .instance_name(name)
        .sync_settings(SyncClientSettings {
            backoff_base: Duration::from_millis(50),
            backoff_cap: Duration::from_millis(300),
            reconnect_jitter: Duration::from_millis(50),
            ..SyncClientSettings::default()
        })
        .build()
        .expect("agent builds")
}

/// Polls the fleet API until `pred` holds for the agent whose id starts with `name`.
async fn wait_agent(app: &TestApp, name: &str, what: &str, pred: impl Fn(&Value) -> bool) -> Value {
    let start = tokio::time::Instant::now();
    loop {
        let (s, _, b) = app.api(Method::GET, AGENTS, None).await;
        assert_eq!(s, StatusCode::OK, "{b}");
        if let Some(a) = b.as_array().unwrap().iter().find(|a| {
            a["instance_id"].as_str().is_some_and(|i| i.starts_with(&format!("{name}-"))) && pred(a)
        }) {
            return a.clone();
        }
        assert!(start.elapsed() < Duration::from_secs(20), "timed out waiting for {what}: {b:#}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The fleet row's top-level fields and its status report agree from the first moment,
/// name the agent, and never say `live` once the stream is closed; the commit-to-ACK time
/// of the revision pushed is recorded.
#[tokio::test]
async fn fleet_row_and_status_agree_and_propagation_is_recorded() {
    let app = TestApp::spawn().await;
    app.seed().await;
    let token = app.agent_token("checkout").await;
    let rev = app.snapshot().await["revision"].as_u64().unwrap();
    let cache = tempfile::tempdir().unwrap();
    let a = agent(&app, &token, "web-a", cache.path());
    let row = wait_agent(&app, "web-a", "the agent live on the current revision", |a| {
        a["connected"] == true && a["source"] == "live" && a["applied_revision"] == rev
    })
    .await;
    assert_eq!(row["status"]["source"], "live", "{row:#}");
    assert_eq!(row["status"]["applied_revision"], row["applied_revision"], "{row:#}");

    let (s, _, p) = app
        .api(Method::GET, &format!("/environments/prod/services/checkout/revisions/{rev}/propagation"), None)
        .await;
    assert_eq!(s, StatusCode::OK, "{p}");
    assert_eq!(
        (p["applied"].as_u64(), p["connected"].as_u64(), p["acked"].as_u64()),
        (Some(1), Some(1), Some(1)),
        "{p:#}"
    );
    let ms =
        |v: &Value| levee_agent::policy::duration::parse(v.as_str().expect("a duration string")).unwrap();
    assert!(ms(&p["max"]) >= ms(&p["p50"]), "{p:#}");
    assert!(ms(&p["acks"][0]["latency"]) <= ms(&p["max"]), "{p:#}");
    assert!(p["acks"][0]["instance_id"].as_str().unwrap().starts_with("web-a-"));
    assert!(p["committed_at"].as_str().unwrap().ends_with('Z'), "RFC 3339: {p:#}");
    let (s, _, _) =
        app.api(Method::GET, "/environments/prod/services/checkout/revisions/999/propagation", None).await;
    assert_eq!(s, StatusCode::NOT_FOUND);

    a.shutdown().await;
    let row = wait_agent(&app, "web-a", "the closed stream", |a| a["connected"] == false).await;
    assert_eq!((&row["source"], &row["status"]["source"]), (&json!("disconnected"), &json!("disconnected")));

    // The next process (a restart): from its cache, then confirmed live, row and report agreeing.
    let b = agent(&app, &token, "web-b", cache.path());
    let row =
        wait_agent(&app, "web-b", "the restarted agent", |a| a["connected"] == true && a["source"] == "live")
            .await;
    assert_eq!(row["status"]["applied_revision"], row["applied_revision"], "{row:#}");
    assert_eq!(row["applied_revision"], rev);
    let page = app.logged_in("admin").await.get("/ui/environments/prod/services/checkout").await;
    assert!(page.body.contains("web-b-") && page.body.contains("disconnected"), "{}", page.body);
    // The restarted instance took the old one's place: listed as replaced, not abnormal.
    assert!(page.body.contains("no: replaced by <code>web-b-"), "{}", page.body);
    assert!(!page.body.contains("disconnected and not replaced"), "{}", page.body);
    b.shutdown().await;
}

/// A feature on its fallback past its row's alert_after: one transition when it crosses,
/// none while it stays, one when it ends; the gauge follows; the webhook POST is retried
/// until the receiver takes it.
#[tokio::test]
async fn alert_after_transitions_reach_the_gauge_and_the_webhook_once_each() {
    let app = TestApp::spawn().await;
    app.seed().await;
    let store = app._server.store.clone();
    let now = Timestamp::now();
    let an_hour_ago = Timestamp::from_unix_ms(now.unix_ms() - 3_600_000);
    // Written as one replica's fleet writer would, its lease running for a minute.
    let lease_until = now.unix_ms() + 60_000;
    let report = |degraded: bool| AgentUpsert {
        environment: "prod".into(),
        service: "checkout".into(),
        instance_id: "web-1-0000aaaa".into(),
        agent_version: "test".into(),
        connected: true,
        connected_at: now.unix_ms(),
        last_seen: now.unix_ms(),
        applied_revision: 1,
        applied_hash: String::new(),
        status: Some(
            json!({"applied_revision": 1, "source": "live", "features": [{
                    "feature": "product recommendations",
                    "level": if degraded { "GENERIC" } else { "FRESH" },
                    "degraded_since": degraded.then(|| an_hour_ago.to_rfc3339())}]})
            .to_string(),
        ),
    };
    store.write_fleet(&[report(true)], &[], &[], "replica-test", lease_until).await.unwrap();

    // A receiver that refuses the first POST.
    let got: Arc<tokio::sync::Mutex<Vec<Value>>> = Arc::default();
    let seen = got.clone();
    let receiver = axum::Router::new().route(
        "/hook",
        axum::routing::post(move |Json(v): Json<Value>| {
            let seen = seen.clone();
            async move {
                let mut g = seen.lock().await;
                g.push(v);
                if g.len() == 1 { AxumStatus::INTERNAL_SERVER_ERROR } else { AxumStatus::NO_CONTENT }
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/hook", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, receiver).await.unwrap() });

    let mut w = AlertWatcher::default();
    let events = w.check(&store, now).await.unwrap();
    assert_eq!(events.len(), 1, "{events:?}");
    let e = &events[0];
    assert_eq!(
        (e.event.as_str(), e.feature.as_str(), e.level.as_str()),
        ("fallback_past_alert_after", "product recommendations", "GENERIC")
    );
    assert_eq!(e.since.as_deref(), Some(an_hour_ago.to_rfc3339().as_str()));
    let recorder = metrics_exporter_prometheus::PrometheusBuilder::new().build_recorder();
    let handle = recorder.handle();
    metrics::with_local_recorder(&recorder, || AlertWatcher::publish(&events));
    let text = handle.render();
    assert!(
        text.contains(&format!(
            "{PAST_ALERT_GAUGE}{{environment=\"prod\",service=\"checkout\",feature=\"product recommendations\"}} 1"
        )),
        "{text}"
    );
    assert!(deliver(&reqwest::Client::new(), &url, e).await, "delivered after a retry");
    {
        let g = got.lock().await;
        assert_eq!(g.len(), 2, "one refused attempt, then the delivery");
        assert_eq!(g[1]["event"], "fallback_past_alert_after");
        assert_eq!(g[1]["environment"], "prod");
        assert_eq!(g[1]["alert_after"], "15m");
    }

    assert!(w.check(&store, now).await.unwrap().is_empty(), "no transition while it stays past");
    store.write_fleet(&[report(false)], &[], &[], "replica-test", lease_until).await.unwrap();
    let events = w.check(&store, now).await.unwrap();
    assert_eq!(events.len(), 1);
    assert_eq!(events[0].event, FallbackAlert::Resolved);
    metrics::with_local_recorder(&recorder, || AlertWatcher::publish(&events));
    assert!(handle.render().contains("feature=\"product recommendations\"} 0"), "{}", handle.render());
}

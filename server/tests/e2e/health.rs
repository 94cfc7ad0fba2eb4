//! Agents' health reports (issue 18 item 3) with the real server and real agents: the
//! windows of their status reports summed per revision and per instance, shown by
//! `GET .../health`, written to `health_windows` by the flusher and read back by another
//! replica over the same database.

use std::time::Duration;

use levee_agent::health::LATENCY_BUCKETS;
use levee_agent::{Agent, SyncClientSettings};
use levee_server::health::{Health, SubjectFilter, SubjectKind};
use reqwest::Method;
use serde_json::Value;

use crate::helpers::TestApp;
use crate::support::{Api, fast_sync};

/// An agent of `prod/checkout` reporting every 100 ms, named `name`.
fn reporting_agent(app: &TestApp, token: &str, name: &str) -> Agent {
    Agent::builder(&app.grpc, token, "prod", "checkout")
        .defaults(crate::checkout_app::safe_defaults())
        .instance_name(name)
        .sync_settings(SyncClientSettings {
            status_interval: Duration::from_millis(100),
            min_report_gap: Duration::from_millis(50),
            ..fast_sync()
        })
        .build()
        .expect("agent builds")
}

/// `ok` successful and `failed` failed calls of `recommendations` (no retries: a POST).
async fn calls(agent: &Agent, ok: usize, failed: usize) {
    let recs = agent.dependency("recommendations");
    for _ in 0..ok {
        let r = recs.call("POST /recs", || async { Ok::<_, std::io::Error>(()) }).await;
        assert!(r.is_ok());
    }
    for _ in 0..failed {
        let r = recs.call("POST /recs", || async { Err::<(), _>(std::io::Error::other("down")) }).await;
        assert!(r.is_err());
    }
}

/// The figures of `recommendations` on `revision` in the API's answer, once its calls
/// reach `calls` (waiting up to 10 s).
async fn recs_on(api: &Api, revision: u64, calls: u64) -> (Value, Value) {
    let mut last = Value::Null;
    for _ in 0..1000 {
        let v = api.send(Method::GET, "/environments/prod/services/checkout/health", None).await;
        if let Some(rev) = v["revisions"].as_array().unwrap().iter().find(|r| r["revision"] == revision)
            && let Some(s) = rev["subjects"]
                .as_array()
                .unwrap()
                .iter()
                .find(|s| s["kind"] == "dependency" && s["name"] == "recommendations")
            && s["totals"]["calls"].as_u64() == Some(calls)
        {
            return (rev.clone(), s.clone());
        }
        last = v;
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("recommendations on revision {revision} never reached {calls} calls: {last}");
}

on_both_backends! {
/// Two agents call a dependency; their reports are summed per revision (successes,
/// failures, latency, instances), a flip starts a new revision whose calls are shed by
/// the kill switch and counted there, and the sums survive in `health_windows`: a second
/// replica over the same database reads the same totals.
async fn health_reports_are_summed_per_revision_and_instance_and_persisted(app) {
    let api = Api::login(&app.base).await;
    api.seed().await;
    let token = api.agent_token("prod", &["checkout"]).await;
    let a = reporting_agent(&app, &token, "pod-a");
    let b = reporting_agent(&app, &token, "pod-b");
    a.wait_for_initial_sync(Duration::from_secs(10)).await.unwrap();
    b.wait_for_initial_sync(Duration::from_secs(10)).await.unwrap();
    let first = a.status().revision;

    calls(&a, 7, 3).await;
    calls(&b, 5, 0).await;
    let (rev, recs) = recs_on(&api, first, 15).await;
    assert_eq!(recs["totals"]["successes"], 12, "{recs}");
    assert_eq!(recs["totals"]["failures"], 3, "{recs}");
    assert_eq!(recs["totals"]["shed"], 0, "{recs}");
    assert_eq!(recs["error_rate"], 0.2, "{recs}");
    assert_eq!(recs["totals"]["latency_buckets"].as_array().unwrap().len(), LATENCY_BUCKETS);
    assert_eq!(recs["totals"]["latency_buckets"][0], 15, "in-process calls take under 1 ms: {recs}");
    assert_eq!(recs["p99"], "1ms", "{recs}");
    assert_eq!(rev["instances"], 2, "{rev}");
    assert_eq!(rev["not_ready"], 0, "{rev}");
    assert_eq!(rev["dependencies"]["totals"]["calls"], 15, "{rev}");

    // Per instance: the last report of each.
    let server = app.server.as_ref().unwrap();
    let instances = server.health.instances("prod", "checkout", 0).await.unwrap();
    assert_eq!(instances.len(), 2);

    // The kill switch: calls are shed locally, counted on the new revision.
    let off = api.set_recommendations(false).await;
    let recs_handle = a.dependency("recommendations");
    crate::support::wait_until("the flip", Duration::from_secs(5), || !recs_handle.is_enabled()).await;
    for _ in 0..4 {
        let r = recs_handle.call("POST /recs", || async { Ok::<_, std::io::Error>(()) }).await;
        assert!(matches!(r, Err(levee_agent::enforce::CallError::KillSwitched(_))), "{r:?}");
    }
    let (_, shed) = recs_on(&api, off, 4).await;
    assert_eq!(shed["totals"]["shed"], 4, "{shed}");
    assert_eq!(shed["totals"]["successes"], 0, "{shed}");
    assert_eq!(shed["shed_rate"], 1.0, "{shed}");
    assert_eq!(shed["p99"], Value::Null, "no latency for refused calls: {shed}");

    // Persisted by the flusher; another replica reads it from the database.
    server.health.flush().await.unwrap();
    let other = Health::spawn(app.store().clone(), "replica-other", levee_server::shutdown::never()).0;
    let by_rev = other
        .by_revision("prod", "checkout", 0, &SubjectFilter::One(SubjectKind::Dependency, "recommendations".into()))
        .await
        .unwrap();
    assert_eq!((by_rev[&first].calls, by_rev[&first].failures), (15, 3), "{by_rev:?}");
    assert_eq!(by_rev[&first].instances, 2, "{by_rev:?}");
    assert_eq!(by_rev[&off].shed, 4, "{by_rev:?}");
    a.shutdown().await;
    b.shutdown().await;
}
}

on_both_backends! {
/// Issue 20: a status report that says nothing new is not written again (at 10,000 agents
/// every 10 s that was 1,000 upserts a second): an idle agent reporting every 100 ms keeps
/// the row stored when it connected, while a report that changes something (its breaker
/// opened) is stored at once.
async fn unchanged_status_reports_are_not_written_again(app) {
    let api = Api::login(&app.base).await;
    api.seed().await;
    let token = api.agent_token("prod", &["checkout"]).await;
    let a = reporting_agent(&app, &token, "pod-a");
    a.wait_for_initial_sync(Duration::from_secs(10)).await.unwrap();
    // The row once the agent is live (its first report after the ACK says so).
    let mut stored = None;
    for _ in 0..500 {
        let rows = app.store().agents("prod", "checkout").await.unwrap();
        if let Some(r) = rows.into_iter().find(|r| r.connected && r.source == "live") {
            stored = Some(r);
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let stored = stored.expect("the agent's row");
    // Ten more reports, each the same.
    tokio::time::sleep(Duration::from_millis(1_000)).await;
    let rows = app.store().agents("prod", "checkout").await.unwrap();
    assert_eq!(rows[0].last_seen, stored.last_seen, "unchanged reports were written again");

    // A change is stored at once: failures open the breaker of `pricing` (20 calls at least).
    let pricing = a.dependency("pricing");
    for _ in 0..30 {
        let _ = pricing.call("POST /price", || async { Err::<(), _>(std::io::Error::other("down")) }).await;
    }
    let mut seen = false;
    for _ in 0..500 {
        let rows = app.store().agents("prod", "checkout").await.unwrap();
        if rows[0].status.as_ref().is_some_and(|s| s.to_string().contains("\"OPEN\"")) {
            seen = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(seen, "the open breaker was not stored");
    a.shutdown().await;
}
}

/// Waits (up to 10 s) until the server has a report of an instance on `revision`.
async fn reported_on(server: &levee_server::Server, revision: u64) {
    for _ in 0..1000 {
        if server
            .health
            .instances("prod", "checkout", 0)
            .await
            .unwrap()
            .iter()
            .any(|i| i.revision == revision)
        {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("no report on revision {revision}");
}

on_both_backends! {
/// The calls an agent made under one revision count for that revision even when its next
/// report comes after it switched: the agent cuts its windows at the switch and sends them
/// naming the revision they ran under. Here no periodic report separates three failed
/// calls from a flip (the report interval is an hour), yet the flip's revision shows none
/// of them — without the cut, its first window would lend it the old revision's failures.
async fn calls_before_a_switch_count_for_the_revision_they_ran_under(app) {
    let api = Api::login(&app.base).await;
    api.seed().await;
    let token = api.agent_token("prod", &["checkout"]).await;
    let a = Agent::builder(&app.grpc, &token, "prod", "checkout")
        .defaults(crate::checkout_app::safe_defaults())
        .instance_name("pod-a")
        .sync_settings(SyncClientSettings { status_interval: Duration::from_secs(3_600), ..fast_sync() })
        .build()
        .expect("agent builds");
    a.wait_for_initial_sync(Duration::from_secs(10)).await.unwrap();
    let first = a.status().revision;
    // The server has the instance on `first` (its report after the ACK), with nothing counted.
    let server = app.server.as_ref().unwrap();
    reported_on(server, first).await;

    calls(&a, 0, 3).await;
    let off = api.set_recommendations(false).await;
    let recs = a.dependency("recommendations");
    crate::support::wait_until("the flip", Duration::from_secs(5), || !recs.is_enabled()).await;
    let (_, before) = recs_on(&api, first, 3).await;
    assert_eq!(before["totals"]["failures"], 3, "{before}");
    // The report that followed the switch named `off`; none of the failures went there.
    reported_on(server, off).await;
    let v = api.send(Method::GET, "/environments/prod/services/checkout/health", None).await;
    let on_off = v["revisions"].as_array().unwrap().iter().find(|r| r["revision"] == off);
    let failures_on_off = on_off.map_or(0, |r| r["dependencies"]["totals"]["failures"].as_u64().unwrap());
    assert_eq!(failures_on_off, 0, "{v}");
    a.shutdown().await;
}
}

//! CD-2 with the real server and a real agent: a revision no agent can receive is never
//! sent, and the server records the NACK the agent cannot send; one over the snapshot
//! budget is NACKed by the agent itself; neither makes the agent reconnect.

use std::time::Duration;

use levee_agent::policy::defaults::{MAX_MESSAGE_BYTES, MAX_SNAPSHOT_BYTES};
use reqwest::Method;
use serde_json::{Value, json};

use crate::helpers::TestApp;
use crate::support::{Api, agent, wait_until};

/// A valid configuration of about `bytes` bytes (string flags of 15 kB) besides the
/// kill switch, as a server without the budget could have stored it.
fn legacy_body(bytes: usize) -> String {
    let blob = "x".repeat(15_000);
    let mut flags: serde_json::Map<String, Value> = (0..bytes / 15_000 + 1)
        .map(|i| (format!("blob-{i}"), json!({"type": "string", "value": blob})))
        .collect();
    flags.insert("recommendations.enabled".into(), json!({"type": "bool", "value": true}));
    json!({"flags": flags}).to_string()
}

/// Stores `body` as the next revision straight into the database and hands it to the
/// streams, as a commit would.
async fn push_legacy(app: &TestApp, body: &str) -> u64 {
    let revision = app.store_raw_revision(body).await;
    let snap = app.store().latest_snapshot("prod", "checkout").await.unwrap().unwrap();
    assert_eq!(snap.revision, revision);
    app.server.as_ref().unwrap().hub.publish(snap);
    revision
}

/// The NACKs the API shows for `revision`, waiting up to 5 s for the first.
async fn nacks_of(api: &Api, revision: u64) -> Vec<Value> {
    for _ in 0..500 {
        let all = api.send(Method::GET, "/environments/prod/services/checkout/nacks", None).await;
        let of: Vec<Value> =
            all.as_array().unwrap().iter().filter(|n| n["revision"] == revision).cloned().collect();
        if !of.is_empty() {
            return of;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("no NACK of revision {revision} shown");
}

/// The connected agent's instance and when its stream opened (the fleet writer stores it
/// within a batch interval).
async fn stream_of(app: &TestApp) -> (String, i64) {
    for _ in 0..500 {
        let rows = app.store().agents("prod", "checkout").await.unwrap();
        if let Some(a) = rows.iter().find(|a| a.connected) {
            return (a.instance_id.clone(), a.connected_at);
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("no connected agent stored");
}

on_both_backends! {
/// CD-2: a stored revision larger than an agent receives (stored before the budget held)
/// is not sent; the server records a NACK for the agent with the sizes, and the agent
/// stays connected on its last good configuration — no reconnect loop, where it used to
/// fail on the transport limit, reconnect and record nothing. A revision over the
/// snapshot budget but within the transport is NACKed by the agent's own rule. The next
/// good revision reaches it on the same stream.
async fn cd_2_undeliverable_and_over_budget_revisions_are_nacked_per_revision_without_reconnects(app) {
    let api = Api::login(&app.base).await;
    api.seed().await;
    let token = api.agent_token("prod", &["checkout"]).await;
    let cache = tempfile::tempdir().unwrap();
    let agent = agent(&app.grpc, &token, cache.path());
    agent.wait_for_initial_sync(Duration::from_secs(10)).await.unwrap();
    let first = agent.status().revision;
    let stream = stream_of(&app).await;

    let huge = legacy_body(MAX_MESSAGE_BYTES);
    let undeliverable = push_legacy(&app, &huge).await;
    let nacks = nacks_of(&api, undeliverable).await;
    assert_eq!(nacks.len(), 1, "{nacks:?}");
    assert_eq!(nacks[0]["instance_id"], stream.0.as_str());
    let detail = nacks[0]["error_detail"].as_str().unwrap();
    assert!(detail.starts_with("not sent: the snapshot message is "), "{detail}");
    assert!(detail.contains(&format!("over the {MAX_MESSAGE_BYTES} bytes an agent receives")), "{detail}");

    let large = legacy_body(MAX_SNAPSHOT_BYTES + 50_000);
    let over_budget = push_legacy(&app, &large).await;
    let nacks = nacks_of(&api, over_budget).await;
    let detail = nacks[0]["error_detail"].as_str().unwrap();
    assert!(detail.contains(&format!("must be at most {MAX_SNAPSHOT_BYTES} bytes")), "{detail}");
    assert!(detail.contains("largest parts: flags"), "{detail}");
    let status = agent.status();
    assert_eq!(status.revision, first, "the last good configuration stays");
    assert_eq!(status.last_nack.map(|n| n.revision), Some(over_budget));

    let good = api.set_recommendations(false).await;
    let recs = agent.dependency("recommendations");
    wait_until("the next good revision", Duration::from_secs(5), || agent.status().revision == good).await;
    assert!(!recs.is_enabled());
    let status = agent.status();
    assert!(status.connected && status.last_error.is_none(), "{status:?}");
    let now = stream_of(&app).await;
    assert_eq!(now, stream, "the agent never reconnected");
    agent.shutdown().await;
}
}

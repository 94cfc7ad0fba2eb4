//! Agent token rotation without restarting instances: `POST /tokens/{id}/rotate` mints a
//! token of the same scope and schedules the old one's end; within the overlap both open
//! streams, at its end every stream of the old token ends, and an agent reading its token
//! from a file reconnects with the file's new token at once (not after the long wait of a
//! refused token).

use std::time::Duration;

use levee_agent::Agent;
use levee_agent::policy::Timestamp;
use reqwest::Method;
use tokio_stream::StreamExt;
use tonic::Code;

use crate::control_plane::open;
use crate::support::{Api, fast_sync};

fn file_agent(grpc: &str, token_file: &std::path::Path, cache: &std::path::Path) -> Agent {
    Agent::builder(grpc, "", "prod", "checkout")
        .token_file(token_file)
        .cache_dir(cache)
        .defaults(crate::checkout_app::safe_defaults())
        .sync_settings(fast_sync())
        .build()
        .expect("agent builds")
}

async fn rotate(api: &Api, id: &str, overlap: &str) -> serde_json::Value {
    api.send(
        Method::POST,
        &format!("/tokens/{id}/rotate"),
        Some(serde_json::json!({"overlap": overlap, "reason": "rotation drill"})),
    )
    .await
}

/// Whether the server counts `instance` connected, and since when (ms).
async fn fleet_row(api: &Api, instance: &str) -> (bool, i64) {
    let start = tokio::time::Instant::now();
    loop {
        let v = api.send(Method::GET, "/environments/prod/services/checkout/agents", None).await;
        if let Some(row) = v.as_array().unwrap().iter().find(|r| r["instance_id"] == instance) {
            return (row["connected"].as_bool().unwrap(), ms(&row["connected_at"]));
        }
        assert!(start.elapsed() < Duration::from_secs(10), "{instance} never listed: {v}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn ms(v: &serde_json::Value) -> i64 {
    Timestamp::parse(v.as_str().unwrap()).unwrap().unix_ms()
}

on_both_backends! {
/// Both tokens open streams during the overlap; at its end (brought forward by a second
/// rotation) the old token's stream ends on every replica, the file agent comes back with
/// the file's token at once, and the old token is refused and cannot be rotated again.
async fn rotation_overlaps_then_ends_the_old_token_and_the_agent_follows_its_file(app) {
    let api = Api::login(&app.base).await;
    api.seed().await;
    let minted = api
        .send(
            Method::POST,
            "/tokens",
            Some(serde_json::json!({"kind": "agent", "name": "checkout-prod", "environment": "prod",
                "services": ["checkout"], "expires_in": "90d", "reason": "e2e"})),
        )
        .await;
    let (t1, id1) = (minted["token"].as_str().unwrap(), minted["id"].as_str().unwrap());
    let dir = tempfile::tempdir().unwrap();
    let token_file = dir.path().join("token");
    std::fs::write(&token_file, format!("{t1}\n")).unwrap();
    let a = file_agent(&app.grpc, &token_file, &dir.path().join("cache"));
    a.wait_for_initial_sync(Duration::from_secs(10)).await.expect("first sync with the file's token");

    // An overlap of an hour: a second token of the same scope, and the first one still works.
    let before = Timestamp::now().unix_ms();
    let r = rotate(&api, id1, "1h").await;
    let (t2, id2) = (r["token"].as_str().unwrap(), r["id"].as_str().unwrap());
    assert_ne!(id1, id2);
    assert_eq!(r["name"], "checkout-prod");
    assert_eq!(
        (r["environment"].as_str(), r["services"].clone()),
        (Some("prod"), serde_json::json!(["checkout"]))
    );
    let lifetime = ms(&r["expires_at"]) - ms(&r["created_at"]);
    assert_eq!(lifetime, 90 * 86_400_000, "the new token lives as long as the old one did");
    assert_eq!(r["replaced"]["id"], id1);
    let ends = ms(&r["replaced"]["revoked_at"]);
    assert!(ends >= before + 3_600_000 && ends <= Timestamp::now().unix_ms() + 3_600_000, "{r}");
    let mut old_stream = open(&app.grpc, t1, "prod", "checkout", "raw-old", 0)
        .await
        .expect("the old token works in the overlap");
    open(&app.grpc, t2, "prod", "checkout", "raw-new", 0).await.expect("the new token works at once");
    assert!(a.status().connected, "the running agent keeps its stream");
    let (connected, first_connected_at) = fleet_row(&api, a.instance_id()).await;
    assert!(connected);
    let audit = api.send(Method::GET, "/audit?limit=5", None).await;
    let row = audit
        .as_array()
        .expect("audit rows")
        .iter()
        .find(|r| r["action"] == "token.rotate")
        .unwrap_or_else(|| panic!("no token.rotate row: {audit}"));
    assert_eq!(row["target"], "token checkout-prod", "{row}");
    assert!(row["before"].to_string().contains(id1) && row["after"].to_string().contains(id2), "{row}");

    // The instance gets the new token through its file; nothing changes until the old
    // token ends. A second rotation moves its end to a second from now (an end is only
    // ever brought forward).
    std::fs::write(&token_file, format!("{t2}\n")).unwrap();
    let r = rotate(&api, id1, "1s").await;
    assert!(ms(&r["replaced"]["revoked_at"]) <= Timestamp::now().unix_ms() + 1_000, "{r}");
    let ended = tokio::time::timeout(Duration::from_secs(15), async {
        loop {
            match old_stream.rx.next().await {
                Some(Ok(_)) => continue,
                Some(Err(status)) => return Some(status),
                None => return None,
            }
        }
    })
    .await
    .expect("the old token's stream ends when its overlap does")
    .expect("ended with a status");
    assert_eq!(ended.code(), Code::Unauthenticated, "{ended}");
    // The file agent's stream was refused too, and it came back with the file's token (the
    // old one is refused from now on): well before the five minutes a refused token waits.
    let start = tokio::time::Instant::now();
    loop {
        let (connected, at) = fleet_row(&api, a.instance_id()).await;
        if connected && at > first_connected_at {
            break;
        }
        assert!(start.elapsed() < Duration::from_secs(15), "the agent did not come back with the new token");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let refused = open(&app.grpc, t1, "prod", "checkout", "raw-old", 0).await.err().expect("refused");
    assert_eq!(refused.code(), Code::Unauthenticated);

    // A token that ended cannot be rotated: 409 token-ended.
    let res = api
        .client
        .post(format!("{}/api/v1/tokens/{id1}/rotate", app.base))
        .bearer_auth(&api.token)
        .json(&serde_json::json!({"reason": "again"}))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 409);
    let p: serde_json::Value = res.json().await.unwrap();
    assert_eq!(p["type"], "urn:levee:problem:token-ended", "{p}");
    a.shutdown().await;
}
}

//! HTTP fallback for agents where gRPC is blocked (control-plane.md §2): after a
//! configured number of failed stream attempts the agent long-polls the snapshot over
//! HTTP (same token and scope) and applies flips from there; once gRPC passes again it
//! returns to the stream.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use levee_agent::{Agent, SyncClientSettings};
use reqwest::{Method, StatusCode};
use tokio::net::{TcpListener, TcpStream};

use crate::helpers::TestApp;
use crate::support::{Api, fast_sync, wait_until};

/// A "firewall" in front of the gRPC port: while closed it accepts connections and drops
/// them at once; while open it forwards them. Returns its address and its switch.
async fn firewall(target: std::net::SocketAddr) -> (std::net::SocketAddr, Arc<AtomicBool>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let open = Arc::new(AtomicBool::new(false));
    let gate = open.clone();
    tokio::spawn(async move {
        while let Ok((mut inbound, _)) = listener.accept().await {
            if !gate.load(Ordering::SeqCst) {
                drop(inbound);
                continue;
            }
            tokio::spawn(async move {
                if let Ok(mut outbound) = TcpStream::connect(target).await {
                    let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                }
            });
        }
    });
    (addr, open)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn blocked_grpc_agent_polls_over_http_then_returns_to_the_stream() {
    let app = TestApp::spawn().await;
    let api = Api::login(&app.base).await;
    api.seed().await;
    let token = api.agent_token("prod", &["checkout"]).await;
    let grpc: std::net::SocketAddr = app.grpc.trim_start_matches("http://").parse().unwrap();
    let (blocked, open) = firewall(grpc).await;
    let dir = tempfile::tempdir().unwrap();
    let agent = Agent::builder(format!("http://{blocked}"), &token, "prod", "checkout")
        .cache_dir(dir.path())
        .sync_settings(SyncClientSettings {
            http_fallback: Some(app.base.clone()),
            http_fallback_after: 2,
            http_fallback_period: Duration::from_secs(1),
            http_long_poll: Duration::from_millis(300),
            ..fast_sync()
        })
        .build()
        .unwrap();

    // gRPC blocked: the configuration arrives over HTTP.
    agent.wait_for_initial_sync(Duration::from_secs(10)).await.expect("initial sync over HTTP");
    assert!(!agent.status().connected, "no stream: {:?}", agent.status());
    let off = api.set_recommendations(false).await;
    wait_until("the flip over HTTP", Duration::from_secs(5), || agent.status().revision == off).await;
    assert!(!agent.flag_bool("recommendations.enabled", true).get());

    // gRPC passes again: back on the stream, and flips arrive through it.
    open.store(true, Ordering::SeqCst);
    wait_until("the agent to return to the stream", Duration::from_secs(10), || agent.status().connected)
        .await;
    let on = api.set_recommendations(true).await;
    wait_until("the flip over the stream", Duration::from_secs(5), || agent.status().revision == on).await;
    assert!(agent.status().connected);
    agent.shutdown().await;
}

/// The fallback endpoint keeps the token's scope, answers 304 when nothing is newer
/// within the wait, and caps the wait.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_fallback_endpoint_keeps_scope_and_answers_not_modified() {
    let app = TestApp::spawn().await;
    app.seed().await;
    let (token, _) = app.agent_token(&["checkout"]).await;
    let url = app.url("/api/v1/sync/prod/checkout");
    let res = app.client.get(&url).bearer_auth(&token).send().await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    let etag = res.headers()["etag"].to_str().unwrap().to_string();
    assert_eq!(etag, "\"1\"");
    let started = tokio::time::Instant::now();
    let res = app
        .client
        .get(format!("{url}?wait=200ms"))
        .bearer_auth(&token)
        .header("if-none-match", &etag)
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::NOT_MODIFIED);
    assert!(started.elapsed() >= Duration::from_millis(200));
    // Another service, an API token, no token, a wait past the cap (a rule the document states in words: 422).
    let (s, _, _) = app.call_as(&token, Method::GET, "/api/v1/sync/prod/payments", None, &[]).await;
    assert_eq!(s, StatusCode::FORBIDDEN);
    let (s, _, _) = app.call(Method::GET, "/api/v1/sync/prod/checkout", None).await;
    assert_eq!(s, StatusCode::UNAUTHORIZED);
    let res = app.client.get(&url).send().await.unwrap();
    assert_eq!(res.status(), StatusCode::UNAUTHORIZED);
    let (s, _, _) = app.call_as(&token, Method::GET, "/api/v1/sync/prod/checkout?wait=5m", None, &[]).await;
    assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY);
}

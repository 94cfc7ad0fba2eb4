//! The API does not depend on the agent streams: agent sync runs on a runtime of its own,
//! and a flip is answered and stored while that runtime cannot run anything at all (its
//! only worker blocked on purpose), then reaches the agents once it runs again.

use std::time::Duration;

use crate::helpers::TestApp;
use crate::support::{Api, agent, wait_until};

/// Blocks every worker of the server's sync runtime until the returned senders are
/// dropped, and returns once they are blocked.
async fn block_sync_runtime(app: &TestApp, threads: usize) -> Vec<std::sync::mpsc::Sender<()>> {
    let rt = app.server.as_ref().unwrap().sync_runtime().clone();
    let barrier = std::sync::Arc::new(std::sync::Barrier::new(threads + 1));
    let mut release = Vec::new();
    for _ in 0..threads {
        let barrier = barrier.clone();
        let (tx, released) = std::sync::mpsc::channel::<()>();
        release.push(tx);
        // Each task holds its worker until released: a worker blocked in one task takes
        // no other, so `threads` of them hold every worker (and the I/O driver with them).
        rt.spawn(async move {
            barrier.wait();
            let _ = released.recv();
        });
    }
    tokio::task::spawn_blocking(move || {
        barrier.wait();
    })
    .await
    .unwrap();
    release
}

on_both_backends! {
    async fn a_flip_is_answered_and_stored_while_the_streams_cannot_run(app) with |s| s.sync_threads = 1; {
        let api = Api::login(&app.base).await;
        api.seed().await;
        let token = api.agent_token("prod", &["checkout"]).await;
        let cache = tempfile::tempdir().unwrap();
        let agent = agent(&app.grpc, &token, cache.path());
        agent.wait_for_initial_sync(Duration::from_secs(10)).await.expect("initial sync");
        let recommendations = agent.dependency("recommendations");
        assert!(recommendations.is_enabled());
        let before = agent.status().revision;

        let release = block_sync_runtime(&app, 1).await;
        // Nothing of agent sync can run now. The flip is answered (the bound only turns a hang
        // into a failure; it is not a latency target) and stored.
        let rev = tokio::time::timeout(Duration::from_secs(30), api.set_recommendations(false))
            .await
            .expect("the flip is answered while the sync runtime is blocked");
        assert!(rev > before);
        let flag =
            api.send(reqwest::Method::GET, "/environments/prod/services/checkout/flags/recommendations.enabled", None)
                .await;
        assert_eq!(flag["value"], false, "{flag}");
        // A second write too: the first did not leave the API waiting on the streams.
        let rev2 = tokio::time::timeout(Duration::from_secs(30), api.set_recommendations(true))
            .await
            .expect("a second flip is answered while the sync runtime is blocked");
        assert_eq!(rev2, rev + 1);
        // The push is not done: the streams' runtime has run nothing since the block.
        assert_eq!(agent.status().revision, before, "the agent got a revision while sync was blocked");

        drop(release);
        wait_until("the agent to apply the flips once sync runs again", Duration::from_secs(10), || {
            agent.status().revision == rev2
        })
        .await;
        assert!(recommendations.is_enabled());
        agent.shutdown().await;
    }
}

//! Graceful shutdown: a stopping server refuses new streams before anything else (no
//! token check, no database read) and tells connected agents it is stopping, so they back
//! off instead of treating the `GoAway` as a success.

use std::time::Duration;

use levee_agent::proto::{ServerMessage, server_message};
use tokio_stream::StreamExt;
use tonic::Code;

use crate::control_plane::open;
use crate::helpers::TestApp;
use crate::support::Api;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stopping_server_refuses_new_streams_first_and_says_it_is_stopping() {
    let mut app = TestApp::spawn().await;
    let api = Api::login(&app.base).await;
    api.seed().await;
    let token = api.agent_token("prod", &["checkout"]).await;
    let mut raw = open(&app.grpc, &token, "prod", "checkout", "raw-1", 0).await.expect("stream opens");

    let stopping = tokio::spawn(app.server.take().unwrap().shutdown());
    // The connected agent is told the server is stopping (not merely rebalancing).
    let go_away = tokio::time::timeout(Duration::from_secs(5), async {
        loop {
            match raw.rx.next().await {
                Some(Ok(ServerMessage { kind: Some(server_message::Kind::GoAway(g)) })) => return g,
                Some(Ok(_)) => continue,
                other => panic!("stream ended without GoAway: {other:?}"),
            }
        }
    })
    .await
    .expect("GoAway within 5 s");
    assert!(go_away.shutting_down, "{go_away:?}");

    // From now on a new stream is refused before its token is read: a bad token gets
    // UNAVAILABLE (or no connection at all), never UNAUTHENTICATED.
    match open(&app.grpc, "not-a-token", "prod", "checkout", "raw-2", 0).await {
        Ok(_) => panic!("a stopping server accepted a new stream"),
        Err(status) => assert_eq!(status.code(), Code::Unavailable, "{status:?}"),
    }
    stopping.await.unwrap();
}

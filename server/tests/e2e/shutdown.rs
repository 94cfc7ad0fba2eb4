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

/// Longest time from SIGTERM to the process' exit with live streams open (docs/operations.md
/// states the figure measured with this test).
const EXIT_BOUND: Duration = Duration::from_secs(1);

/// A UI session cookie (`levee_session=…`) of admin on the server at `base`, through the
/// login form as a browser gets it.
async fn ui_session(client: &reqwest::Client, base: &str) -> String {
    let form = client.get(format!("{base}/login")).send().await.unwrap();
    let nonce = form
        .headers()
        .get_all("set-cookie")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .find_map(|c| c.split(';').next().filter(|kv| kv.starts_with("levee_login=")).map(str::to_string))
        .expect("the login form sets its nonce cookie");
    let body = form.text().await.unwrap();
    let needle = "name=\"csrf\" value=\"";
    let start = body.find(needle).expect("a csrf field") + needle.len();
    let csrf = &body[start..start + body[start..].find('"').unwrap()];
    let res = client
        .post(format!("{base}/login"))
        .header("cookie", nonce)
        .header("origin", base)
        .header("sec-fetch-site", "same-origin")
        .header("content-type", "application/x-www-form-urlencoded")
        .body(
            serde_urlencoded::to_string([
                ("csrf", csrf),
                ("next", "/"),
                ("username", "admin"),
                ("password", crate::helpers::ADMIN_PASSWORD),
            ])
            .unwrap(),
        )
        .send()
        .await
        .unwrap();
    res.headers()
        .get_all("set-cookie")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .find_map(|c| c.split(';').next().filter(|kv| kv.starts_with("levee_session=")).map(str::to_string))
        .unwrap_or_else(|| panic!("login set no session cookie ({})", res.status()))
}

/// The real binary with the service page's live event stream open and three agents
/// connected: SIGTERM ends the event stream and the agent streams at once and the process
/// exits within [`EXIT_BOUND`] (an open event stream used to hold it for the 5 s drain
/// bound, on every replica of a rolling restart).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_with_live_events_and_agent_streams_open_exits_within_a_second() {
    let dir = tempfile::tempdir().unwrap();
    let mut server = crate::support::BinServer::start(dir.path(), "127.0.0.1:0", "127.0.0.1:0").await;
    let base = format!("http://{}", server.http);
    let grpc = format!("http://{}", server.grpc);
    let api = Api::login(&base).await;
    api.seed().await;
    let token = api.agent_token("prod", &["checkout"]).await;
    let agents: Vec<_> = (0..3)
        .map(|i| crate::support::agent(&grpc, &token, &dir.path().join(format!("agent-{i}"))))
        .collect();
    for a in &agents {
        a.wait_for_initial_sync(Duration::from_secs(10)).await.expect("agent syncs");
    }

    // No redirects followed: the session cookie comes with the login's 303.
    let client = reqwest::Client::builder().redirect(reqwest::redirect::Policy::none()).build().unwrap();
    let cookie = ui_session(&client, &base).await;
    let live = client
        .get(format!("{base}/ui/environments/prod/services/checkout/live"))
        .header("cookie", cookie)
        .send()
        .await
        .unwrap();
    assert_eq!(live.status(), reqwest::StatusCode::OK);
    let mut events = live;
    let first = events.chunk().await.unwrap().expect("a first event");
    assert!(String::from_utf8_lossy(&first).contains("event: state"), "{first:?}");

    let pid = server.child.id().expect("running").to_string();
    let sent = tokio::time::Instant::now();
    assert!(std::process::Command::new("kill").args(["-TERM", &pid]).status().unwrap().success());
    let status = tokio::time::timeout(Duration::from_secs(10), server.child.wait())
        .await
        .expect("levee exits after SIGTERM")
        .unwrap();
    let took = sent.elapsed();
    eprintln!("levee exited {took:?} after SIGTERM with an event stream and 3 agent streams open");
    assert!(status.success(), "{status}");
    assert!(took < EXIT_BOUND, "exit took {took:?}, more than {EXIT_BOUND:?}");
    // The event stream ended (it did not hang on a dead socket).
    let rest = tokio::time::timeout(Duration::from_secs(2), async {
        while let Ok(Some(_)) = events.chunk().await {}
    })
    .await;
    assert!(rest.is_ok(), "the event stream did not end");
    for a in agents {
        a.shutdown().await;
    }
}

//! Where the agent's token and server come from: a token file read again (a rotated token
//! reaches a running instance without a restart) and several server addresses tried in
//! turn.

use std::time::Duration;

use levee_agent::proto::{GoAway, server_message};
use levee_agent::{Agent, TOKEN_FILE_POLL};
use tokio::time::Instant;
use tonic::Status;

use crate::support::*;

fn file_agent(url: &str, token_file: &std::path::Path, cache: &std::path::Path) -> Agent {
    Agent::builder(url, "", ENV, SERVICE)
        .token_file(token_file)
        .cache_dir(cache)
        .sync_settings(settings())
        .build()
        .expect("agent builds")
}

/// A refused token waits five minutes before the next attempt (CP-7), unless the token
/// file meanwhile holds another token: the agent reads it every `TOKEN_FILE_POLL` while
/// refused and comes back with it at once.
#[tokio::test(start_paused = true)]
async fn token_file_rotation_ends_the_refused_wait() {
    init_tracing();
    let dir = tempfile::tempdir().unwrap();
    let token_file = dir.path().join("token");
    std::fs::write(&token_file, "an-ended-token\n").unwrap();
    let mut server = TestServer::start().await;
    let a = file_agent(&server.url(), &token_file, &dir.path().join("cache"));
    let refused_at = match server.next("a refusal").await {
        Event::Refused { at } => at,
        other => panic!("expected a refusal, got {other:?}"),
    };
    // The new token reaches the instance's file (a mounted secret updated).
    std::fs::write(&token_file, format!("{TOKEN}\n")).unwrap();
    let (_, at, _conn) = server.connected().await;
    let waited = at - refused_at;
    assert!(
        waited <= TOKEN_FILE_POLL + Duration::from_millis(1_300),
        "came back after {waited:?}, not within a poll of the file"
    );
    a.shutdown().await;
}

/// The end of a rotation's overlap ends the old token's stream (`UNAUTHENTICATED`, as a
/// revocation); an agent whose token file already holds the new token reconnects with it
/// after the reconnect jitter alone. A change of the file alone does not cut a working
/// stream.
#[tokio::test(start_paused = true)]
async fn a_rotated_token_is_taken_from_the_file_when_the_old_one_ends() {
    init_tracing();
    let dir = tempfile::tempdir().unwrap();
    let token_file = dir.path().join("token");
    std::fs::write(&token_file, TOKEN).unwrap();
    let mut server = TestServer::start().await;
    server.accept_tokens(&[TOKEN, "rotated-token"]);
    let a = file_agent(&server.url(), &token_file, &dir.path().join("cache"));
    let (_, _, conn) = server.connected().await;
    conn.heartbeat(0, Duration::from_secs(5)).await;

    std::fs::write(&token_file, "rotated-token\n").unwrap();
    tokio::time::sleep(Duration::from_secs(10)).await;
    assert!(
        !server.drain().iter().any(|e| matches!(e, Event::Connected { .. })),
        "a new token in the file does not cut the stream the old one opened"
    );
    assert!(a.status().connected);

    // The overlap ends: the old token is refused from now on and its stream ends.
    server.accept_tokens(&["rotated-token"]);
    let ended = Instant::now();
    conn.end(Status::unauthenticated("agent token revoked")).await;
    let (_, at, _conn) = server.connected().await;
    assert!(at - ended <= Duration::from_millis(1_200), "came back after {:?}", at - ended);
    a.shutdown().await;
}

/// With several addresses, an attempt that fails before any message moves to the next
/// one, and so does a replica that says it is stopping; the agent stays on the one that
/// answers.
#[tokio::test(start_paused = true)]
async fn fallback_servers_are_tried_in_turn() {
    init_tracing();
    let dir = tempfile::tempdir().unwrap();
    let dead = dead_address().await;
    let mut first = TestServer::start().await;
    let mut second = TestServer::start().await;
    let start = Instant::now();
    let a = Agent::builder(format!("http://{dead}"), TOKEN, ENV, SERVICE)
        .fallback_server(first.url())
        .fallback_server(second.url())
        .cache_dir(dir.path())
        .sync_settings(settings())
        .build()
        .expect("agent builds");
    let (_, at, conn) = first.connected().await;
    assert!(at - start <= Duration::from_millis(1_200), "the dead address cost {:?}", at - start);
    conn.heartbeat(0, Duration::from_secs(5)).await;

    let stopping = Instant::now();
    conn.send(server_message::Kind::GoAway(GoAway {
        reason: "server shutting down".into(),
        shutting_down: true,
    }))
    .await;
    let (_, at, _conn) = second.connected().await;
    assert!(at - stopping <= Duration::from_millis(2_200), "moved after {:?}", at - stopping);
    assert!(
        !first.drain().iter().any(|e| matches!(e, Event::Connected { .. })),
        "the stopping replica is not asked again first"
    );
    a.shutdown().await;
}

#[test]
fn build_refuses_an_unreadable_token_file_or_a_fallback_of_another_scheme() {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let _guard = rt.enter();
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("none");
    let err =
        Agent::builder("http://127.0.0.1:1", "", ENV, SERVICE).token_file(&missing).build().unwrap_err();
    assert!(matches!(err, levee_agent::BuildError::TokenFile { .. }), "{err}");
    assert!(err.to_string().contains("none"), "{err}");
    let err = Agent::builder("http://127.0.0.1:1", TOKEN, ENV, SERVICE)
        .fallback_server("https://127.0.0.1:2")
        .build()
        .unwrap_err();
    assert!(matches!(err, levee_agent::BuildError::TlsMismatch { .. }), "{err}");
}

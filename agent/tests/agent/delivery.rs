//! CD-2: what an agent does with a message it cannot use — over the size or depth budget,
//! of another schema version, or larger than the transport takes.

use std::time::Duration;

use levee_agent::policy::defaults::{MAX_BODY_DEPTH, MAX_MESSAGE_BYTES, MAX_SNAPSHOT_BYTES};
use levee_agent::{Agent, Source};
use tokio::time::Instant;

use crate::support::{self, *};

/// A valid body of about `bytes` bytes: one string flag per 15 kB.
fn body_of(bytes: usize) -> String {
    let blob = "x".repeat(15_000);
    let flags: Vec<String> = (0..bytes / 15_000 + 1)
        .map(|i| format!(r#""blob-{i}": {{"type": "string", "value": "{blob}"}}"#))
        .collect();
    format!(r#"{{"flags": {{{}}}}}"#, flags.join(", "))
}

/// A JSON flag whose value nests `levels` arrays.
fn deep_flag(levels: usize) -> String {
    format!(
        r#"{{"flags": {{"deep": {{"type": "json", "value": {}{}}}}}}}"#,
        "[".repeat(levels),
        "]".repeat(levels)
    )
}

/// CD-2: a snapshot over the size budget (but within the transport's limit), one nested
/// past the depth budget and one of an unknown schema version are each NACKed once on the
/// stream that brought them, with the budget in the reason; the stream stays up, the last
/// good configuration stays, and the next good revision is applied on the same stream.
#[tokio::test(start_paused = true)]
async fn cd_2_snapshots_over_the_budgets_or_of_another_schema_are_nacked_on_the_stream() {
    init_tracing();
    let dir = tempfile::tempdir().unwrap();
    let mut server = TestServer::start().await;
    let a = agent(&server.url(), dir.path());
    let flag = a.flag_bool("recommendations.enabled", true);
    let (_, _, conn) = server.connected().await;
    conn.snapshot(1, RULES).await;
    assert_eq!(server.ack().await.0, 1);

    let large = body_of(MAX_SNAPSHOT_BYTES + 1);
    assert!(large.len() > MAX_SNAPSHOT_BYTES && large.len() < MAX_MESSAGE_BYTES);
    let mut other_schema = support::snapshot(4, "{}");
    other_schema.schema_version += 1;
    let cases = [
        (support::snapshot(2, &large), format!("must be at most {MAX_SNAPSHOT_BYTES} bytes")),
        (
            support::snapshot(3, &deep_flag(125)),
            format!(
                "flags.deep.value[0][0][0][0][0]…: must nest arrays and objects at most {MAX_BODY_DEPTH} levels deep (got 128 levels)"
            ),
        ),
        (other_schema, "schema_version".to_string()),
    ];
    for (snap, reason) in cases {
        let revision = snap.revision;
        let nonce = conn.snapshot_raw(snap).await;
        let (r, n, detail) = server.nack().await;
        assert_eq!((r, n), (revision, nonce));
        assert!(detail.contains(&reason), "revision {revision}: {detail}");
        let status = a.status();
        assert_eq!((status.revision, status.source), (1, Source::Live), "rules kept after {revision}");
        assert_eq!(status.last_nack.map(|n| n.revision), Some(revision));
        assert!(!flag.get());
    }
    conn.snapshot(5, "{}").await;
    assert_eq!(server.ack().await.0, 5);
    let others: Vec<Event> =
        server.drain().into_iter().filter(|e| matches!(e, Event::Connected { .. } | Event::Closed)).collect();
    assert!(others.is_empty(), "one stream throughout: {others:?}");
    a.shutdown().await;
}

/// CD-2: a message larger than the transport takes cannot be read, and the stream cannot
/// go on past it. The agent NACKs the revision the server's heartbeat announced, with the
/// limit in the reason, keeps its configuration, and counts the stream as a failed
/// attempt: with the HTTP fallback after 2 failed attempts, two such streams send it to
/// HTTP for the whole fallback period, where a stream on which messages were received
/// would have been reopened within a second.
#[tokio::test(start_paused = true)]
async fn cd_2_a_message_over_the_transport_limit_is_nacked_and_counted_as_a_failed_attempt() {
    init_tracing();
    let dir = tempfile::tempdir().unwrap();
    let mut server = TestServer::start().await;
    let http = dead_address().await;
    let mut settings = support::settings();
    settings.http_fallback = Some(format!("http://{http}"));
    settings.http_fallback_after = 2;
    let a = Agent::builder(server.url(), TOKEN, ENV, SERVICE)
        .cache_dir(dir.path())
        .sync_settings(settings.clone())
        .build()
        .unwrap();
    let (_, _, conn) = server.connected().await;
    conn.snapshot(1, RULES).await;
    assert_eq!(server.ack().await.0, 1);

    let huge = body_of(MAX_MESSAGE_BYTES);
    let mut ended = Vec::new();
    for attempt in 0..2 {
        let conn = if attempt == 0 {
            conn.clone()
        } else {
            let (hello, _, conn) = server.connected().await;
            assert_eq!(hello.services[0].applied_revision, 1);
            conn
        };
        conn.heartbeat(2, Duration::from_secs(15)).await;
        conn.snapshot(2, &huge).await;
        let (revision, _, detail) = server.nack().await;
        assert_eq!(revision, 2);
        assert!(detail.contains("could not be received"), "{detail}");
        assert!(detail.contains(&format!("at most {MAX_MESSAGE_BYTES} bytes")), "{detail}");
        ended.push(Instant::now());
        let status = a.status();
        assert_eq!((status.revision, status.last_nack.map(|n| n.revision)), (1, Some(2)));
    }
    let (hello, at, _conn) = server.connected().await;
    assert_eq!(hello.services[0].applied_revision, 1);
    let gap = at - ended[1];
    assert!(gap >= settings.http_fallback_period, "stream tried again after {gap:?}, before the HTTP period");
    assert_eq!(a.current().revision, 1);
    a.shutdown().await;
}

//! Agent-level tests: a real agent against a real in-process tonic server over TCP on
//! 127.0.0.1, with the tokio clock paused so protocol timings (heartbeats, backoff) are
//! virtual and exact to within a few [`support::TICK`]s (see
//! [`support::clock_granularity`] for why a tick is needed with real sockets).

#[cfg(feature = "axum")]
mod admission;
mod architecture;
mod clients;
mod delivery;
mod local_refusals;
mod support;
mod tokens;

use std::sync::Arc;
use std::time::Duration;

use levee_agent::cache::DiskCache;
use levee_agent::policy::{Timestamp, content_hash};
use levee_agent::proto::{GoAway, StatusReport, server_message};
use levee_agent::{Agent, CallError, Source, StatusContributor};
use support::*;
use tokio::time::Instant;

fn prometheus() -> metrics_exporter_prometheus::PrometheusRecorder {
    metrics_exporter_prometheus::PrometheusBuilder::new().build_recorder()
}

/// The value of a series whose line contains every `part`, from a Prometheus rendering.
fn series(rendered: &str, name: &str, parts: &[&str]) -> Option<f64> {
    rendered
        .lines()
        .filter(|l| l.starts_with(name) && !l.starts_with('#'))
        .find(|l| parts.iter().all(|p| l.contains(p)))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

/// CP-1: the server is unreachable and the service restarts: the agent starts from its
/// disk cache (not from the defaults), at once; when the server comes back the agent
/// announces the cached revision and the server's confirmation makes it live.
#[tokio::test(start_paused = true)]
async fn cp_1_restart_during_outage_starts_from_cache() {
    init_tracing();
    let dir = tempfile::tempdir().unwrap();

    // First life: the server pushes revision 5 and the agent persists it.
    let mut server = TestServer::start().await;
    let addr = server.addr;
    let first = agent(&server.url(), dir.path());
    let (hello, _, conn) = server.connected().await;
    assert_eq!(hello.services[0].applied_revision, 0, "a fresh agent on defaults announces revision 0");
    assert_eq!(hello.services[0].hash, "");
    conn.snapshot(5, RULES).await;
    assert_eq!(server.ack().await.0, 5);
    first.shutdown().await;
    drop(first);
    server.stop().await;

    // Second life, server down.
    let started = Instant::now();
    let second = Agent::builder(format!("http://{addr}"), TOKEN, ENV, SERVICE)
        .cache_dir(dir.path())
        .sync_settings(settings())
        .build()
        .unwrap();
    assert_eq!(started.elapsed(), Duration::ZERO, "build never waits for the server");
    let status = second.status();
    assert_eq!((status.source, status.revision), (Source::Cache, 5));
    assert_eq!(status.hash, content_hash(RULES.as_bytes()));
    assert!(status.age.is_some(), "a cached snapshot has an age");
    assert!(!status.connected);
    assert!(!second.flag_bool("recommendations.enabled", true).get(), "the cached kill switch holds");
    assert_eq!(second.flag_int("search.max_results", 50).get(), 20);
    let recs = second.dependency("recommendations");
    assert_eq!(recs.attempt_timeout("GET /x"), Duration::from_millis(250));
    assert!(matches!(
        recs.call("GET /x", || async { Ok::<_, std::io::Error>(1) }).await,
        Err(CallError::KillSwitched(_))
    ));
    let waited = second.wait_for_initial_sync(Duration::from_secs(2)).await.unwrap_err();
    assert_eq!(waited.enforcing, Source::Cache);
    assert!(second.readiness(), "readiness never depends on the control plane by default");

    // The server comes back on the same address.
    let mut server = TestServer::start_on(addr).await;
    let (hello, _, conn) = server.connected().await;
    assert_eq!(hello.environment, ENV);
    assert_eq!(hello.services[0].name, SERVICE);
    assert_eq!(hello.services[0].applied_revision, 5, "a cache-sourced revision counts");
    assert_eq!(hello.services[0].hash, content_hash(RULES.as_bytes()));
    conn.heartbeat(5, Duration::from_secs(15)).await;
    second.wait_for_initial_sync(Duration::from_secs(5)).await.expect("confirmed by the heartbeat");
    let status = second.status();
    assert_eq!((status.source, status.revision, status.connected), (Source::Live, 5, true));
    assert!(status.age.unwrap() < Duration::from_secs(1));
    second.shutdown().await;
}

/// CP-2: the newest cache files are truncated, garbage, and of an older schema: startup
/// is not blocked, each is counted with its reason, and the newest valid generation is
/// used; with no valid generation at all, the compiled-in defaults are.
#[tokio::test(start_paused = true)]
async fn cp_2_corrupt_cache_truncated_garbage_old_schema_use_newest_valid_or_defaults() {
    init_tracing();
    let recorder = prometheus();
    let handle = recorder.handle();
    let _guard = metrics::set_default_local_recorder(&recorder);
    let dir = tempfile::tempdir().unwrap();
    let cache = DiskCache::new(dir.path(), ENV, SERVICE);
    cache.store(1, &content_hash(RULES.as_bytes()), RULES, Timestamp::now()).unwrap();
    let path = |rev: u64| cache.dir().join(format!("rev-{rev:020}.json"));
    let valid = std::fs::read(path(1)).unwrap();
    std::fs::write(path(2), &valid[..valid.len() - 40]).unwrap(); // truncated mid-write
    std::fs::write(path(3), b"\x00\x9f garbage \xff").unwrap(); // garbage
    let old_schema =
        String::from_utf8(valid.clone()).unwrap().replace("\"schema_version\":1", "\"schema_version\":0");
    assert_ne!(old_schema.as_bytes(), &valid[..]);
    std::fs::write(path(4), old_schema.replace("\"revision\":1", "\"revision\":4")).unwrap();

    let dead = dead_address().await;
    let a = agent(&format!("http://{dead}"), dir.path());
    let status = a.status();
    assert_eq!((status.source, status.revision), (Source::Cache, 1), "newest valid generation");
    assert!(!a.flag_bool("recommendations.enabled", true).get());
    let rendered = handle.render();
    for reason in ["malformed", "schema"] {
        let expected = if reason == "malformed" { 2.0 } else { 1.0 };
        assert_eq!(
            series(&rendered, "levee_cache_errors_total", &[&format!("reason=\"{reason}\"")]),
            Some(expected),
            "{reason}:\n{rendered}"
        );
    }
    a.shutdown().await;

    // No valid generation left: defaults, never a panic.
    std::fs::write(path(1), b"{\"schema_version\":1,\"environment\":").unwrap();
    let a = agent(&format!("http://{dead}"), dir.path());
    let status = a.status();
    assert_eq!((status.source, status.revision, status.age), (Source::Default, 0, None));
    assert!(a.flag_bool("recommendations.enabled", true).get(), "compiled-in default");
    assert_eq!(
        series(&handle.render(), "levee_config_source", &["source=\"default\""]),
        Some(1.0),
        "source gauge shows the defaults"
    );
    a.shutdown().await;
}

/// CP-3: an empty, null, unparsable or hash-broken body never clears the rules; a valid,
/// explicitly empty configuration `{}` is applied.
#[tokio::test(start_paused = true)]
async fn cp_3_empty_or_null_payload_never_clears_rules() {
    init_tracing();
    let dir = tempfile::tempdir().unwrap();
    let mut server = TestServer::start().await;
    let a = agent(&server.url(), dir.path());
    let flag = a.flag_bool("recommendations.enabled", true);
    let recs = a.dependency("recommendations");
    let (_, _, conn) = server.connected().await;
    conn.snapshot(1, RULES).await;
    assert_eq!(server.ack().await.0, 1);
    assert!(!flag.get());

    let mut broken_hash = support::snapshot(5, "{}");
    broken_hash.hash = content_hash(b"something else");
    let mut missing_body = support::snapshot(6, "");
    missing_body.hash = String::new();
    let cases: Vec<(levee_agent::proto::Snapshot, &str)> = vec![
        (support::snapshot(2, ""), "empty body"),
        (support::snapshot(3, "null"), "body is not a valid configuration"),
        (support::snapshot(4, "{\"policy\": {\"dependen"), "body is not a valid configuration"),
        (broken_hash, "body hash mismatch"),
        (missing_body, "body hash mismatch"),
    ];
    for (snap, reason) in cases {
        let revision = snap.revision;
        let nonce = conn.snapshot_raw(snap).await;
        let (r, n, detail) = server.nack().await;
        assert_eq!((r, n), (revision, nonce));
        assert!(detail.contains(reason), "revision {revision}: {detail}");
        let status = a.status();
        assert_eq!(
            (status.revision, status.source),
            (1, Source::Live),
            "rules kept after revision {revision}"
        );
        assert!(!flag.get());
        assert_eq!(recs.attempt_timeout("x"), Duration::from_millis(250));
    }

    conn.snapshot(7, "{}").await;
    assert_eq!(server.ack().await.0, 7);
    assert_eq!(a.status().revision, 7);
    assert!(a.config().policy.dependencies.is_empty(), "an explicit empty config is applied");
    assert!(flag.get(), "its flag is gone: compiled-in default");
    assert_eq!(recs.attempt_timeout("x"), levee_agent::policy::defaults::ATTEMPT_TIMEOUT);
    a.shutdown().await;
}

/// CP-4: an invalid snapshot is NACKed once with the validation errors, the last good
/// configuration stays, nothing is written to the cache, and the next valid revision is
/// applied.
#[tokio::test(start_paused = true)]
async fn cp_4_invalid_snapshot_is_nacked_once_and_last_good_kept() {
    init_tracing();
    let recorder = prometheus();
    let handle = recorder.handle();
    let _guard = metrics::set_default_local_recorder(&recorder);
    let dir = tempfile::tempdir().unwrap();
    let mut server = TestServer::start().await;
    let a = agent(&server.url(), dir.path());
    let (_, _, conn) = server.connected().await;
    conn.snapshot(1, RULES).await;
    server.ack().await;

    let invalid = r#"{"policy":{"dependencies":{"pricing":{"retry":{"max_attempts":11},"bulkhead":{"max_concurrent":0}}}}}"#;
    let nonce = conn.snapshot(2, invalid).await;
    let (revision, n, detail) = server.nack().await;
    assert_eq!((revision, n), (2, nonce));
    assert!(
        detail.contains("policy.dependencies.pricing.retry.max_attempts: must be between 1 and 10 (got 11)"),
        "{detail}"
    );
    assert!(
        detail.contains("policy.dependencies.pricing.bulkhead.max_concurrent"),
        "every bad field: {detail}"
    );
    let status = a.status();
    assert_eq!(status.revision, 1);
    assert_eq!(status.last_nack.as_ref().map(|n| n.revision), Some(2));
    assert_eq!(status.last_nack.unwrap().detail, detail);

    // A minute of heartbeats: the NACK is not repeated, nothing else is sent but status reports.
    for _ in 0..4 {
        conn.heartbeat(2, Duration::from_secs(15)).await;
        tokio::time::sleep(Duration::from_secs(15)).await;
    }
    let extra: Vec<_> = server.drain().into_iter().filter(|e| !matches!(e, Event::Status(_))).collect();
    assert!(extra.is_empty(), "no further ACK/NACK: {extra:?}");
    assert_eq!(series(&handle.render(), "levee_snapshots_rejected_total", &[]), Some(1.0), "counted once");
    let cached = DiskCache::new(dir.path(), ENV, SERVICE).load().snapshot.unwrap();
    assert_eq!(cached.revision, 1, "the rejected snapshot was never written to the cache");

    conn.snapshot(3, "{}").await;
    assert_eq!(server.ack().await.0, 3);
    assert_eq!(DiskCache::new(dir.path(), ENV, SERVICE).load().snapshot.unwrap().revision, 3);
    a.shutdown().await;
}

/// Monotonic apply: a lower revision (a stale replica) is refused and never applied, the
/// same revision with the same hash is acknowledged without change.
#[tokio::test(start_paused = true)]
async fn monotonic_apply_never_goes_back() {
    init_tracing();
    let dir = tempfile::tempdir().unwrap();
    let mut server = TestServer::start().await;
    let a = agent(&server.url(), dir.path());
    let (_, _, conn) = server.connected().await;
    conn.snapshot(5, RULES).await;
    assert_eq!(server.ack().await.0, 5);
    let applied_at = a.current().applied_at;

    conn.snapshot(3, "{}").await;
    let (revision, _, detail) = server.nack().await;
    assert_eq!(revision, 3);
    assert!(detail.contains("older than the applied revision 5"), "{detail}");
    conn.snapshot(5, "{}").await;
    let (revision, _, detail) = server.nack().await;
    assert_eq!(revision, 5);
    assert!(detail.contains("already applied"), "{detail}");
    conn.snapshot(5, RULES).await;
    assert_eq!(server.ack().await.0, 5, "the same revision and hash is acknowledged");

    let current = a.current();
    assert_eq!((current.revision, current.applied_at), (5, applied_at), "nothing re-applied");
    assert!(!current.config.policy.dependencies.is_empty());
    a.shutdown().await;
}

/// CP-5: the server stops sending on an open stream; after 3 missed heartbeat intervals
/// the agent reconnects (within its jittered delay), announcing what it has applied, and
/// its staleness grows meanwhile.
#[tokio::test(start_paused = true)]
async fn cp_5_silent_stream_reconnects_after_missed_heartbeats() {
    init_tracing();
    let dir = tempfile::tempdir().unwrap();
    let mut server = TestServer::start().await;
    let a = agent(&server.url(), dir.path());
    let (_, _, conn) = server.connected().await;
    conn.snapshot(2, RULES).await;
    server.ack().await;
    let interval = Duration::from_secs(4);
    conn.heartbeat(2, interval).await;
    settle().await;
    let silent_since = Instant::now();
    assert!(a.status().connected);

    // The server is now silent; the TCP connection stays up.
    let (hello, at, _conn2) = server.connected().await;
    let gap = at - silent_since;
    assert!(gap >= 3 * interval, "reconnected after {gap:?}, before 3 intervals of silence");
    assert!(gap <= 3 * interval + Duration::from_millis(1_300), "reconnected only after {gap:?}");
    assert_eq!(hello.services[0].applied_revision, 2);
    assert!(a.status().age.unwrap() >= 3 * interval, "staleness shows the gap");
    drop(conn);
    a.shutdown().await;
}

/// CP-7: a refused token gets a clear error and a long backoff (5 min ± 20 %), never a
/// retry storm.
#[tokio::test(start_paused = true)]
async fn cp_7_unauthorized_agent_backs_off_long() {
    init_tracing();
    let dir = tempfile::tempdir().unwrap();
    let mut server = TestServer::start().await;
    server.refuse_all();
    let start = Instant::now();
    let a = agent(&server.url(), dir.path());
    let mut refusals = Vec::new();
    while refusals.len() < 4 {
        match server.next("a refusal").await {
            Event::Refused { at } => refusals.push(at - start),
            other => panic!("unexpected {other:?}"),
        }
    }
    assert!(refusals[0] < Duration::from_secs(1), "first attempt at once: {refusals:?}");
    for pair in refusals.windows(2) {
        let gap = pair[1] - pair[0];
        assert!(gap >= Duration::from_secs(240), "gap {gap:?} shorter than 5 min - 20 %: {refusals:?}");
        assert!(gap <= Duration::from_millis(360_300), "gap {gap:?} longer than 5 min + 20 %: {refusals:?}");
    }
    let status = a.status();
    assert!(!status.connected);
    let error = status.last_error.unwrap();
    assert!(error.contains("Unauthenticated") && error.contains("token revoked"), "{error}");
    assert_eq!(status.source, Source::Default, "enforcement goes on with what it has");
    a.shutdown().await;
}

/// CP-9: deleting a flag on the server makes every handle fall back to its compiled-in
/// default, not keep the deleted value.
#[tokio::test(start_paused = true)]
async fn cp_9_deleted_flag_falls_back_to_compiled_default() {
    init_tracing();
    let dir = tempfile::tempdir().unwrap();
    let mut server = TestServer::start().await;
    let a = agent(&server.url(), dir.path());
    let enabled = a.flag_bool("recommendations.enabled", true);
    let max = a.flag_int("search.max_results", 50);
    let (_, _, conn) = server.connected().await;
    conn.snapshot(1, RULES).await;
    server.ack().await;
    assert_eq!((enabled.get(), max.get()), (false, 20));

    // The kill switch still names the deleted flag, so the policy must declare it as living
    // in the service's compiled-in defaults (OPS-1), as the server requires.
    let without_flags =
        RULES.split("\"flags\"").next().unwrap().trim_end().trim_end_matches(',').to_string() + "}";
    let without_flags = without_flags
        .replace(r#""policy": {"#, r#""policy": {"compiled_in_flags": ["recommendations.enabled"], "#);
    levee_agent::policy::decode_config(without_flags.as_bytes()).expect("still a valid config");
    conn.snapshot(2, &without_flags).await;
    assert_eq!(server.ack().await.0, 2);
    assert_eq!((enabled.get(), max.get()), (true, 50), "deleted flags: compiled-in defaults");
    assert!(a.dependency("recommendations").is_enabled(), "kill switch follows the declared default");
    a.shutdown().await;
}

/// CP-11: an operator override and a fault rule expire while the server is unreachable.
/// Both end at their expiry with no call made: the critical dependency's breaker leaves
/// FORCED_OPEN (reason `override_expired`), readiness comes back at that moment, the next
/// status report shows it, and the dependency under the fault rule is called normally.
#[tokio::test(start_paused = true)]
async fn cp_11_override_and_fault_rule_expire_on_time_while_offline() {
    use levee_agent::breaker::{State, TransitionReason};
    init_tracing();
    let dir = tempfile::tempdir().unwrap();
    let mut server = TestServer::start().await;
    let addr = server.addr;
    let a = agent(&server.url(), dir.path());
    let payments = a.dependency("payments");
    let search = a.dependency("search");
    let (_, _, conn) = server.connected().await;
    let (t0, wall) = (Instant::now(), Timestamp::now());
    let at = |secs: i64| Timestamp::from_unix_ms(wall.unix_ms() + secs * 1000).to_rfc3339();
    let body = format!(
        r#"{{"policy": {{"dependencies": {{
              "payments": {{"criticality": "critical"}},
              "search": {{"criticality": "non_critical", "retry": {{"max_attempts": 1}}}}}}}},
            "breaker_overrides": [{{"dependency": "payments", "state": "forced_open",
                                    "expires_at": "{}", "reason": "game day"}}],
            "faults_allowed": true,
            "faults": [{{"id": "drill", "dependency": "search", "action": {{"type": "abort", "status": 503}},
                         "percent": 100, "expires_at": "{}"}}]}}"#,
        at(30),
        at(40),
    );
    conn.snapshot(1, &body).await;
    server.ack().await;
    let search_once = || search.call("GET /q", || async { Ok::<_, std::io::Error>("results") });
    assert_eq!(payments.breaker("").state, State::ForcedOpen);
    assert!(!a.readiness(), "a critical dependency forced open");
    assert!(matches!(search_once().await, Err(CallError::Injected(_))));

    server.stop().await;
    tokio::time::sleep_until(t0 + Duration::from_secs(29)).await;
    assert_eq!(payments.breaker("").state, State::ForcedOpen, "not expired yet");
    assert!(!a.readiness());

    // No call to `payments` from here on: the expiry alone must change everything.
    tokio::time::sleep_until(t0 + Duration::from_secs(31)).await;
    let breaker = payments.breaker("");
    assert_eq!(breaker.state, State::Closed, "the override ended at its expiry, offline");
    assert_eq!(breaker.last_reason, Some(TransitionReason::OverrideExpired));
    assert!(a.readiness(), "ready again at the expiry, not at the next call");
    assert_eq!(a.status().source, Source::Live, "still the same snapshot, only older");

    tokio::time::sleep_until(t0 + Duration::from_secs(41)).await;
    assert_eq!(search_once().await.unwrap(), "results", "the fault rule ended at its expiry");

    // The server comes back: the first status report already shows the breaker closed.
    let mut server = TestServer::start_on(addr).await;
    let (_, _, _conn) = server.connected().await;
    let report = loop {
        if let Event::Status(s) = server.next("a status report").await {
            break s;
        }
    };
    let b = report.breakers.iter().find(|b| b.dependency == "payments").expect("payments reported");
    assert_eq!((b.state.as_str(), b.last_transition_reason.as_str()), ("CLOSED", "override_expired"));
    a.shutdown().await;
}

/// `GoAway` makes the agent reconnect after a random delay of at most 1 s.
#[tokio::test(start_paused = true)]
async fn go_away_reconnects_with_jitter() {
    init_tracing();
    let dir = tempfile::tempdir().unwrap();
    let mut server = TestServer::start().await;
    let a = agent(&server.url(), dir.path());
    let (_, _, conn) = server.connected().await;
    let sent = Instant::now();
    conn.send(server_message::Kind::GoAway(GoAway { reason: "draining".into(), shutting_down: false })).await;
    let (_, at, _) = server.connected().await;
    assert!(at - sent <= Duration::from_millis(1200), "reconnected after {:?}", at - sent);
    a.shutdown().await;
}

/// `GoAway` from a server that is shutting down is not a success: the agent waits at
/// least `reconnect_jitter` and then a backoff draw (uniform up to the first backoff
/// ceiling), instead of coming straight back to a port that is closing.
#[tokio::test(start_paused = true)]
async fn go_away_on_shutdown_backs_off() {
    init_tracing();
    let dir = tempfile::tempdir().unwrap();
    let mut server = TestServer::start().await;
    let a = agent(&server.url(), dir.path());
    let (_, _, conn) = server.connected().await;
    let sent = Instant::now();
    conn.send(server_message::Kind::GoAway(GoAway {
        reason: "server shutting down".into(),
        shutting_down: true,
    }))
    .await;
    let (_, at, _) = server.connected().await;
    let waited = at - sent;
    assert!(waited >= Duration::from_secs(1), "reconnected after {waited:?}");
    assert!(waited <= Duration::from_millis(2200), "reconnected after {waited:?}");
    a.shutdown().await;
}

struct Breakers;

impl StatusContributor for Breakers {
    fn contribute(&self, report: &mut StatusReport) {
        report.breakers.push(levee_agent::proto::BreakerStatus {
            dependency: "pricing".into(),
            state: "OPEN".into(),
            ..Default::default()
        });
    }
}

/// Status reports go out at once on a new stream, again whenever the applied revision or
/// its source changes, and every 10 s, with the applied revision, source and what the
/// contributors add; `refuse_until_fresh` holds readiness until the server confirmed.
#[tokio::test(start_paused = true)]
async fn status_reports_and_refuse_until_fresh() {
    init_tracing();
    let dir = tempfile::tempdir().unwrap();
    let mut server = TestServer::start().await;
    let a = Agent::builder(server.url(), TOKEN, ENV, SERVICE)
        .cache_dir(dir.path())
        .refuse_until_fresh(true)
        .build()
        .unwrap();
    assert!(!a.readiness() && !a.is_fresh());
    a.add_status_contributor(Arc::new(Breakers));
    let (_, connected_at, conn) = server.connected().await;
    let first = match server.next("the first status report").await {
        Event::Status(s) => s,
        other => panic!("expected a status report at once, got {other:?}"),
    };
    assert!(Instant::now() - connected_at < Duration::from_millis(100), "first report at connect");
    assert_eq!((first.applied_revision, first.source.as_str()), (0, "default"));
    conn.snapshot(4, RULES).await;
    // The report of the change, then the ACK (persisted first), in either order.
    let mut changed = None;
    let mut acked = false;
    while changed.is_none() || !acked {
        match server.next("the ACK and the report of the change").await {
            Event::Status(s) => changed = Some(s),
            Event::Ack { revision: 4, .. } => acked = true,
            other => panic!("unexpected {other:?}"),
        }
    }
    let changed = changed.unwrap();
    assert_eq!((changed.applied_revision, changed.source.as_str()), (4, "live"));
    assert!(a.readiness() && a.is_fresh());
    let report = loop {
        if let Event::Status(s) = server.next("a periodic status report").await {
            break s;
        }
    };
    let after = Instant::now() - connected_at;
    assert!(
        after >= Duration::from_millis(9_900) && after < Duration::from_millis(10_300),
        "periodic report after {after:?}"
    );
    assert_eq!(
        (report.service.as_str(), report.applied_revision, report.source.as_str()),
        (SERVICE, 4, "live")
    );
    assert_eq!(report.breakers.len(), 1);
    assert_eq!(report.breakers[0].state, "OPEN");
    a.shutdown().await;
}

/// CP-10: an idle stream survives: heartbeats only every 60 s, so the agent's HTTP/2
/// keepalive pings (every 30 s of silence, 10 s to answer) run in between; ten minutes
/// pass on one stream without a reconnect.
#[tokio::test(start_paused = true)]
async fn cp_10_idle_stream_survives_keepalive() {
    init_tracing();
    let dir = tempfile::tempdir().unwrap();
    let mut server = TestServer::start().await;
    let a = agent(&server.url(), dir.path());
    let (_, _, conn) = server.connected().await;
    conn.snapshot(1, "{}").await;
    server.ack().await;
    for _ in 0..10 {
        conn.heartbeat(1, Duration::from_secs(60)).await;
        tokio::time::sleep(Duration::from_secs(60)).await;
    }
    let events = server.drain();
    let reconnects = events.iter().filter(|e| matches!(e, Event::Connected { .. } | Event::Closed)).count();
    assert_eq!(reconnects, 0, "{events:?}");
    let reports = events.iter().filter(|e| matches!(e, Event::Status(_))).count();
    assert!((59..=60).contains(&reports), "a status report every 10 s for 600 s: {reports}");
    let status = a.status();
    assert!(status.connected && status.last_error.is_none());
    assert!(status.age.unwrap() < Duration::from_secs(61), "heartbeats keep confirming: {:?}", status.age);
    a.shutdown().await;
}

/// Reconnect backoff: while every stream fails before any message (the server answers
/// UNAVAILABLE), attempt n waits at most min(60 s, 1 s × 1.6ⁿ) — full jitter, growing, never
/// reset; once a stream delivers a message, the next drop reconnects within 1 s again.
#[tokio::test(start_paused = true)]
async fn reconnect_backoff_grows_with_full_jitter_and_resets_after_a_message() {
    init_tracing();
    let recorder = prometheus();
    let handle = recorder.handle();
    let _guard = metrics::set_default_local_recorder(&recorder);
    let dir = tempfile::tempdir().unwrap();
    let mut server = TestServer::start().await;
    server.unavailable(true);
    let a = agent(&server.url(), dir.path());
    let mut attempts = Vec::new();
    while attempts.len() < 12 {
        if let Event::Unavailable { at } = server.next("an attempt").await {
            attempts.push(at);
        }
    }
    let slack = Duration::from_millis(100);
    for (n, pair) in attempts.windows(2).enumerate() {
        let ceiling = Duration::from_secs_f64((1.6f64.powi(n as i32)).min(60.0));
        let gap = pair[1] - pair[0];
        assert!(gap <= ceiling + slack, "attempt {n}: waited {gap:?}, ceiling {ceiling:?}");
    }
    let status = a.status();
    assert!(!status.connected);
    assert!(status.last_error.unwrap().contains("Unavailable"));
    assert_eq!(series(&handle.render(), "levee_sync_connected", &[]), Some(0.0));

    server.unavailable(false);
    let (_, _, conn) = server.connected().await;
    conn.heartbeat(0, Duration::from_secs(15)).await;
    settle().await;
    assert_eq!(series(&handle.render(), "levee_sync_connected", &[]), Some(1.0));
    let dropped = Instant::now();
    drop(conn); // the server ends the stream after a message arrived
    let (_, at, _) = server.connected().await;
    assert!(
        at - dropped <= Duration::from_millis(1_100),
        "backoff reset: reconnected after {:?}",
        at - dropped
    );
    assert_eq!(series(&handle.render(), "levee_config_revision", &[]), Some(0.0));
    a.shutdown().await;
}

const FLAPPING: &str = r#"{"policy": {"dependencies": {"pricing": {
    "retry": {"max_attempts": 1},
    "circuit_breaker": {"window": {"type": "count", "size": 10}, "minimum_calls": 3,
                        "failure_rate_threshold": 0.5, "wait_in_open": "100ms",
                        "max_wait_in_open": "100ms", "half_open_probes": 1}}}}}"#;

/// The next status report (skipping anything else) and when it arrived.
async fn next_report(server: &mut TestServer, what: &str) -> (StatusReport, Instant) {
    loop {
        if let Event::Status(s) = server.next(what).await {
            return (s, Instant::now());
        }
    }
}

fn pricing_state(report: &StatusReport) -> Option<&str> {
    report.breakers.iter().find(|b| b.dependency == "pricing").map(|b| b.state.as_str())
}

async fn fail_once(pricing: &levee_agent::Dependency) {
    let refused = || async { Err::<(), _>(std::io::Error::from(std::io::ErrorKind::ConnectionRefused)) };
    assert!(pricing.call("GET /price", refused).await.is_err());
}

/// A breaker opening is reported at once, not at the next periodic report (10 s); more
/// transitions within `min_report_gap` (1 s) make one more report at the end of the gap,
/// not one each; with no transition there are only the periodic reports.
#[tokio::test(start_paused = true)]
async fn breaker_transitions_are_reported_promptly_and_debounced() {
    use levee_agent::breaker::State;
    init_tracing();
    let dir = tempfile::tempdir().unwrap();
    let mut server = TestServer::start().await;
    let a = agent(&server.url(), dir.path());
    let pricing = a.dependency("pricing");
    let (_, connected_at, conn) = server.connected().await;
    let (first, _) = next_report(&mut server, "the first status report").await;
    assert_eq!(pricing_state(&first), Some("CLOSED"));
    conn.snapshot(1, FLAPPING).await;
    let (_, _) = next_report(&mut server, "the report of the change").await;
    server.ack().await;

    // Away from the periodic reports (at 0, 10, 20 s after connecting).
    tokio::time::sleep_until(connected_at + Duration::from_secs(3)).await;
    assert!(server.drain().is_empty(), "nothing between the reports");
    for _ in 0..3 {
        fail_once(&pricing).await;
    }
    let opened_at = Instant::now();
    assert_eq!(pricing.breaker("").state, State::Open);
    let (report, at) = next_report(&mut server, "the report of the open breaker").await;
    assert!(at - opened_at < Duration::from_millis(100), "reported after {:?}", at - opened_at);
    assert_eq!(pricing_state(&report), Some("OPEN"));

    // Flapping within the gap: OPEN → HALF_OPEN → OPEN, five times over about 0.6 s.
    for _ in 0..5 {
        tokio::time::sleep(Duration::from_millis(120)).await;
        fail_once(&pricing).await;
    }
    assert_eq!(pricing.breaker("").state, State::Open);
    let flapped_at = Instant::now();
    assert!(flapped_at - at < Duration::from_secs(1));
    let (report, next) = next_report(&mut server, "the report after the flapping").await;
    let gap = next - at;
    assert!(
        gap >= Duration::from_millis(1_000) && gap < Duration::from_millis(1_100),
        "one report at the end of the gap, {gap:?} after the last"
    );
    assert_eq!(pricing_state(&report), Some("OPEN"));
    let pricing_status = report.breakers.iter().find(|b| b.dependency == "pricing").unwrap();
    assert_eq!(pricing_status.transitions, 11, "it did flap: one opening, five times there and back");

    // No transition from here on: only the periodic reports, at 10 and 20 s.
    let (_, periodic) = next_report(&mut server, "the periodic report").await;
    let since = periodic - connected_at;
    assert!(
        since >= Duration::from_millis(9_900) && since < Duration::from_millis(10_300),
        "the next report is the periodic one: {since:?}"
    );
    tokio::time::sleep_until(connected_at + Duration::from_millis(19_500)).await;
    assert!(server.drain().is_empty(), "no report between the periodic ones");
    let (_, periodic) = next_report(&mut server, "the second periodic report").await;
    let since = periodic - connected_at;
    assert!(since >= Duration::from_millis(19_900) && since < Duration::from_millis(20_300), "{since:?}");
    a.shutdown().await;
}

/// CB-9: a metrics recorder installed after the agent is built, and after a dependency
/// handle made calls, still receives every series: breaker state and rejections, bulkhead,
/// retries, calls — on the agent's next metrics tick or the series' next use.
#[tokio::test(start_paused = true)]
async fn cb_9_a_recorder_installed_after_build_receives_every_series() {
    let body = r#"{"policy": {"dependencies": {"p": {
        "retry": {"max_attempts": 2, "base": "1ms", "cap": "2ms"},
        "bulkhead": {"max_concurrent": 1},
        "circuit_breaker": {"window": {"type": "count", "size": 10}, "minimum_calls": 4,
                            "failure_rate_threshold": 0.5, "wait_in_open": "60s"}}}}}"#;
    let cfg = levee_agent::policy::decode_config(body.as_bytes()).unwrap();
    let agent = Agent::builder("http://127.0.0.1:9", TOKEN, ENV, SERVICE).defaults(cfg).build().unwrap();
    let p = agent.dependency("p");
    p.call("p", || async { Ok::<_, std::io::Error>(()) }).await.unwrap();

    // The service installs its recorder only now.
    let recorder = prometheus();
    let handle = recorder.handle();
    let _guard = metrics::set_default_local_recorder(&recorder);
    tokio::time::advance(levee_agent::sync::DEFAULT_METRICS_INTERVAL + Duration::from_millis(1)).await;
    settle().await;
    let rendered = handle.render();
    let scope = ["dependency=\"p\"", "operation=\"*\""];
    assert_eq!(series(&rendered, "levee_breaker_state", &scope), Some(0.0), "{rendered}");
    assert_eq!(series(&rendered, "levee_bulkhead_in_use", &scope), Some(0.0), "{rendered}");
    for name in ["levee_breaker_rejected_total", "levee_bulkhead_rejected_total", "levee_retries_total"] {
        assert_eq!(series(&rendered, name, &scope), Some(0.0), "{name}: {rendered}");
    }

    // Events after the install are counted: a full bulkhead, retried failures that open
    // the breaker, a call it refuses.
    let held = {
        let p = p.clone();
        tokio::spawn(
            async move { p.call("GET /p", std::future::pending::<Result<(), std::io::Error>>).await },
        )
    };
    tokio::task::yield_now().await;
    assert!(p.call("GET /p", || async { Ok::<_, std::io::Error>(()) }).await.is_err());
    held.abort();
    let _ = held.await;
    let refused = || async { Err::<(), _>(std::io::Error::from(std::io::ErrorKind::ConnectionRefused)) };
    for _ in 0..2 {
        let _ = p.call("GET /p", refused).await;
    }
    assert!(p.call("GET /p", || async { Ok::<_, std::io::Error>(()) }).await.is_err());
    let rendered = handle.render();
    assert_eq!(series(&rendered, "levee_bulkhead_rejected_total", &scope), Some(1.0), "{rendered}");
    assert_eq!(series(&rendered, "levee_breaker_state", &scope), Some(1.0), "OPEN: {rendered}");
    assert_eq!(series(&rendered, "levee_retries_total", &scope), Some(2.0), "{rendered}");
    assert!(series(&rendered, "levee_breaker_rejected_total", &scope) >= Some(1.0), "{rendered}");
    assert!(series(&rendered, "levee_breaker_transitions_total", &["to=\"OPEN\""]).is_some(), "{rendered}");
    let calls = |outcome: &str| {
        series(&rendered, "levee_calls_total", &["dependency=\"p\"", "operation=\"GET /p\"", outcome])
    };
    // The first failing call failed; the second ended on its retry, refused by the breaker
    // it had just opened, as did the last call.
    assert_eq!(calls("outcome=\"failed\""), Some(1.0), "{rendered}");
    assert_eq!(calls("outcome=\"breaker_open\""), Some(2.0), "{rendered}");
    assert_eq!(calls("outcome=\"bulkhead_full\""), Some(1.0), "{rendered}");
    agent.shutdown().await;
}

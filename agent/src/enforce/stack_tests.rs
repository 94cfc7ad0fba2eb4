//! The whole outbound stack: order properties and scenarios that need every stage.

use std::fmt;
use std::io;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use tokio::time::Instant;

use super::*;
use crate::breaker::State;
use crate::deadline::{Deadline, RequestContext, with_context, with_deadline};
use crate::flags::tests::{apply, shared_with};
use crate::policy::FallbackLevel;
use crate::retry::ErrorKind;
use crate::state::Shared;

fn dep(shared: &Shared, name: &str) -> Dependency {
    shared.with_ctx(|ctx| shared.deps.handle(name, ctx))
}

fn refused() -> io::Error {
    io::Error::from(io::ErrorKind::ConnectionRefused)
}

/// A dependency `p` with retries (3 attempts, 10 ms base), a count-window breaker
/// (window 10, minimum 3, 50 %), a bulkhead of 2, and `extra` merged into its policy.
fn policy(extra: &str) -> String {
    format!(
        r#"{{"policy": {{"dependencies": {{"p": {{
            "attempt_timeout": "300ms",
            "retry": {{"max_attempts": 3, "base": "10ms", "cap": "40ms"}},
            "circuit_breaker": {{"window": {{"type": "count", "size": 10}}, "minimum_calls": 3,
                                 "failure_rate_threshold": 0.5, "wait_in_open": "1s"}},
            "bulkhead": {{"max_concurrent": 2}}{extra}}}}}}}}}"#
    )
}

/// Order property 1: the breaker sits inside the retry loop and records every attempt.
#[tokio::test(start_paused = true)]
async fn order_breaker_records_every_attempt_of_a_retried_call() {
    let shared = shared_with(&policy(""));
    let d = dep(&shared, "p");
    let attempts = AtomicU32::new(0);
    let r = d
        .call("GET /x", || {
            attempts.fetch_add(1, Ordering::SeqCst);
            async { Err::<(), _>(refused()) }
        })
        .await;
    assert!(matches!(r, Err(CallError::Inner(_))), "{r:?}");
    assert_eq!(attempts.load(Ordering::SeqCst), 3, "three attempts");
    let b = d.breaker("GET /x");
    assert_eq!(b.window.calls, 3, "the breaker saw each attempt, not one outcome per call");
    assert_eq!(b.state, State::Open, "3 failures of 3 reach the 50 % threshold");
}

/// Order property 2 (CB-5 through the stack): while the breaker is open no attempt and no
/// retry runs, and the retry budget is not charged.
#[tokio::test(start_paused = true)]
async fn cb_5_open_breaker_ends_the_call_at_once_without_attempt_or_budget_charge() {
    let shared = shared_with(&policy(""));
    let d = dep(&shared, "p");
    for _ in 0..3 {
        let _ = d.call("GET /x", || async { Err::<(), _>(refused()) }).await;
        if d.breaker("GET /x").state == State::Open {
            break;
        }
    }
    assert_eq!(d.breaker("GET /x").state, State::Open);
    let tokens = d.retry_budget_tokens("GET /x");
    let attempts = AtomicU32::new(0);
    let started = Instant::now();
    let r = d
        .call("GET /x", || {
            attempts.fetch_add(1, Ordering::SeqCst);
            async { Ok::<_, io::Error>(()) }
        })
        .await;
    assert!(matches!(r, Err(CallError::BreakerOpen(_))), "{r:?}");
    assert_eq!(attempts.load(Ordering::SeqCst), 0);
    assert_eq!(started.elapsed(), Duration::ZERO, "no backoff sleep");
    assert_eq!(d.retry_budget_tokens("GET /x"), tokens, "budget untouched");
}

/// The kill switch comes first: a switched-off dependency is refused even with a full
/// bulkhead and an open breaker.
#[tokio::test(start_paused = true)]
async fn order_kill_switch_before_bulkhead_and_breaker() {
    let body = policy(r#", "enabled_flag": "p.on""#)
        .replace(r#"{"policy""#, r#"{"flags": {"p.on": {"type": "bool", "value": true}}, "policy""#);
    let shared = shared_with(&body);
    let d = dep(&shared, "p");
    // Fill the bulkhead with two hung calls.
    let d1 = d.clone();
    let d2 = d.clone();
    let h1 =
        tokio::spawn(async move { d1.call("GET /x", std::future::pending::<Result<(), io::Error>>).await });
    let h2 =
        tokio::spawn(async move { d2.call("GET /x", std::future::pending::<Result<(), io::Error>>).await });
    tokio::task::yield_now().await;
    assert_eq!(d.bulkhead_usage("GET /x").0, 2);
    let r = d.call("GET /x", || async { Ok::<_, io::Error>(()) }).await;
    assert!(matches!(r, Err(CallError::BulkheadFull(_))), "{r:?}");
    apply(&shared, 2, &body.replace(r#""value": true"#, r#""value": false"#));
    let r = d.call("GET /x", || async { Ok::<_, io::Error>(()) }).await;
    assert!(matches!(r, Err(CallError::KillSwitched(_))), "kill switch decides first: {r:?}");
    h1.abort();
    h2.abort();
}

/// BH at the stack level: a full bulkhead rejects at once (max_wait 0), the rejected call
/// is neither attempted nor retried, and permits come back when calls end.
#[tokio::test(start_paused = true)]
async fn full_bulkhead_rejects_without_attempt_and_frees_on_completion() {
    let shared = shared_with(&policy(""));
    let d = dep(&shared, "p");
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let d1 = d.clone();
    let holder = tokio::spawn(async move {
        d1.call("GET /x", || async {
            tokio::time::sleep(Duration::from_millis(100)).await;
            Ok::<_, io::Error>(())
        })
        .await
    });
    let d2 = d.clone();
    let holder2 = tokio::spawn(async move {
        let _ = tx.send(());
        d2.call("GET /x", || async {
            tokio::time::sleep(Duration::from_millis(100)).await;
            Ok::<_, io::Error>(())
        })
        .await
    });
    rx.await.unwrap();
    tokio::task::yield_now().await;
    let attempts = AtomicU32::new(0);
    let r = d
        .call("GET /x", || {
            attempts.fetch_add(1, Ordering::SeqCst);
            async { Ok::<_, io::Error>(()) }
        })
        .await;
    assert!(matches!(r, Err(CallError::BulkheadFull(_))), "{r:?}");
    assert_eq!(attempts.load(Ordering::SeqCst), 0);
    holder.await.unwrap().unwrap();
    holder2.await.unwrap().unwrap();
    assert_eq!(d.bulkhead_usage("GET /x").0, 0);
    d.call("GET /x", || async { Ok::<_, io::Error>(()) }).await.unwrap();
}

/// RT-2 through the stack: 120 ms left, the next backoff could be up to 200 ms: stop now
/// with DeadlineExceeded carrying the last error, without sleeping.
#[tokio::test(start_paused = true)]
async fn rt_2_stack_stops_instead_of_sleeping_past_the_deadline() {
    let body = policy("").replace(r#""base": "10ms", "cap": "40ms""#, r#""base": "200ms", "cap": "2s""#);
    let body = body.replace(r#""policy": {"#, r#""policy": {"reserve": "0ms", "#);
    // The backoff before retry n is uniform(0, 200 ms·2ⁿ): against a 120 ms deadline a
    // delay may fit or not. Each seed fixes one sequence of delays; together they cover a
    // stop before the first retry, a stop before the second, and three attempts that fit.
    let mut stops = [0u32; 4];
    for seed in 0..32 {
        let shared = shared_with(&body);
        let d = dep(&shared, "p");
        d.view().scope("GET /x").guards.retrier.policy().backoff().reseed(seed);
        let started = Instant::now();
        let attempts = AtomicU32::new(0);
        let r = with_deadline(Deadline::after(Duration::from_millis(120)), async {
            d.call("GET /x", || {
                attempts.fetch_add(1, Ordering::SeqCst);
                async { Err::<(), _>(refused()) }
            })
            .await
        })
        .await;
        let (elapsed, attempts) = (started.elapsed(), attempts.load(Ordering::SeqCst));
        assert!(elapsed <= Duration::from_millis(120), "seed {seed}: slept past the deadline: {elapsed:?}");
        match r {
            Err(CallError::DeadlineExceeded(e, last)) => {
                assert!(attempts < 3, "seed {seed}: a deadline stop comes before the last attempt");
                assert!(e.why().contains("does not fit"), "seed {seed}: {}", e.why());
                assert!(
                    matches!(last.as_deref(), Some(CallError::Inner(_))),
                    "seed {seed}: chained to the last error"
                );
            }
            Err(CallError::Inner(_)) => assert_eq!(attempts, 3, "seed {seed}: every delay fitted"),
            other => panic!("seed {seed}: expected DeadlineExceeded or the last error, got {other:?}"),
        }
        stops[attempts as usize] += 1;
    }
    assert!(stops[1..].iter().all(|n| *n > 0), "every outcome is exercised: {stops:?}");
}

/// The per-attempt timeout is min(configured, remaining − reserve).
#[tokio::test(start_paused = true)]
async fn attempt_timeout_is_capped_by_the_deadline_minus_reserve() {
    let body = policy("").replace(r#""max_attempts": 3"#, r#""max_attempts": 1"#);
    let shared = shared_with(&body.replace(r#""policy": {"#, r#""policy": {"reserve": "50ms", "#));
    let d = dep(&shared, "p");
    let started = Instant::now();
    let r = with_deadline(Deadline::after(Duration::from_millis(200)), async {
        d.call("GET /x", std::future::pending::<Result<(), io::Error>>).await
    })
    .await;
    match r {
        Err(CallError::Timeout(t)) => assert_eq!(t.timeout(), Duration::from_millis(150)),
        other => panic!("expected Timeout, got {other:?}"),
    }
    assert_eq!(started.elapsed(), Duration::from_millis(150), "50 ms kept for the degraded answer");
    // An expired deadline fails at once, without calling.
    let r = with_deadline(Deadline::after(Duration::ZERO), async {
        d.call("GET /x", || async { Ok::<_, io::Error>(()) }).await
    })
    .await;
    assert!(matches!(r, Err(CallError::DeadlineExceeded(..))), "{r:?}");
}

/// A non-critical dependency never gets more than the non-critical cap per attempt.
#[tokio::test(start_paused = true)]
async fn non_critical_dependency_is_capped() {
    let body =
        policy(r#", "criticality": "non_critical""#).replace(r#""max_attempts": 3"#, r#""max_attempts": 1"#);
    let shared = shared_with(&body.replace(r#""policy": {"#, r#""policy": {"non_critical_cap": "80ms", "#));
    let d = dep(&shared, "p");
    let started = Instant::now();
    let r = d.call("GET /x", std::future::pending::<Result<(), io::Error>>).await;
    assert!(matches!(r, Err(CallError::Timeout(_))));
    assert_eq!(started.elapsed(), Duration::from_millis(80));
}

/// Only idempotent operations are retried; POST is not, unless the policy says so.
#[tokio::test(start_paused = true)]
async fn post_is_not_retried_unless_marked_idempotent() {
    // A breaker that cannot trip within this test's 7 attempts isolates idempotency.
    let body = policy(r#", "operations": {"POST /safe": {"idempotent": true}}"#)
        .replace(r#""minimum_calls": 3"#, r#""minimum_calls": 10"#);
    let shared = shared_with(&body);
    let d = dep(&shared, "p");
    for (op, expected) in [("POST /orders", 1), ("POST /safe", 3), ("GET /x", 3)] {
        let attempts = AtomicU32::new(0);
        let _ = d
            .call(op, || {
                attempts.fetch_add(1, Ordering::SeqCst);
                async { Err::<(), _>(refused()) }
            })
            .await;
        assert_eq!(attempts.load(Ordering::SeqCst), expected, "{op}");
    }
}

/// Retry on one layer: a request already retried upstream gets no retries here, except one
/// for a connection failure that never reached the peer.
#[tokio::test(start_paused = true)]
async fn retried_inbound_request_is_not_retried_again() {
    let shared = shared_with(&policy(""));
    let d = dep(&shared, "p");
    let ctx = RequestContext {
        inbound_retried: true,
        ..RequestContext::new(Deadline::after(Duration::from_secs(5)))
    };
    for (err, expected) in [(io::ErrorKind::ConnectionReset, 1), (io::ErrorKind::ConnectionRefused, 2)] {
        let attempts = AtomicU32::new(0);
        let _ = with_context(ctx, async {
            d.call("GET /x", || {
                attempts.fetch_add(1, Ordering::SeqCst);
                async move { Err::<(), _>(io::Error::from(err)) }
            })
            .await
        })
        .await;
        assert_eq!(attempts.load(Ordering::SeqCst), expected, "{err:?}");
    }
}

/// Fault injection acts inside the attempt timeout: an injected abort is a real failure
/// for retries and the breaker; an injected delay longer than the timeout is a timeout.
#[tokio::test(start_paused = true)]
async fn injected_faults_behave_like_real_failures() {
    let faults = |action: &str| {
        policy("").replace(
            r#"{"policy""#,
            &format!(
                r#"{{"faults_allowed": true, "faults": [{{"id": "f", "dependency": "p", "action": {action},
                   "percent": 100, "expires_at": "2999-01-01T00:00:00Z"}}], "policy""#
            ),
        )
    };
    let shared = shared_with(&faults(r#"{"type": "abort", "status": 503}"#));
    let d = dep(&shared, "p");
    let attempts = AtomicU32::new(0);
    let r = d
        .call("GET /x", || {
            attempts.fetch_add(1, Ordering::SeqCst);
            async { Ok::<_, io::Error>(()) }
        })
        .await;
    match r {
        Err(CallError::Injected(f)) => assert_eq!(f.kind(), ErrorKind::HttpStatus(503)),
        other => panic!("expected Injected, got {other:?}"),
    }
    assert_eq!(attempts.load(Ordering::SeqCst), 0, "the real call is not made");
    assert_eq!(d.breaker("GET /x").window.calls, 3, "each injected failure recorded");

    let shared = shared_with(&faults(r#"{"type": "delay", "delay": "2s"}"#));
    let d = dep(&shared, "p");
    let started = Instant::now();
    let r = d.call("POST /once", || async { Ok::<_, io::Error>(()) }).await;
    assert!(matches!(r, Err(CallError::Timeout(_))), "{r:?}");
    assert_eq!(started.elapsed(), Duration::from_millis(300));

    // Not allowed in this environment: nothing fires.
    let shared = shared_with(
        &faults(r#"{"type": "abort", "status": 503}"#)
            .replace(r#""faults_allowed": true"#, r#""faults_allowed": false"#),
    );
    let d = dep(&shared, "p");
    d.call("GET /x", || async { Ok::<_, io::Error>(()) }).await.unwrap();
}

/// A fault rule naming instances (an experiment's blast radius) acts on those agents only;
/// an agent with no instance id yet is not one of them.
#[tokio::test(start_paused = true)]
async fn a_fault_rule_naming_instances_acts_on_those_only() {
    let named = policy("").replace(
        r#"{"policy""#,
        r#"{"faults_allowed": true, "faults": [{"id": "f", "dependency": "p", "action": {"type": "abort", "status": 503},
           "percent": 100, "expires_at": "2999-01-01T00:00:00Z", "instances": ["checkout-a1"]}], "policy""#,
    );
    for (instance, injected) in [(Some("checkout-a1"), true), (Some("checkout-b2"), false), (None, false)] {
        let shared = shared_with(&named);
        if let Some(id) = instance {
            shared.instance_id.set(id.to_string()).unwrap();
            shared.refresh();
        }
        let d = dep(&shared, "p");
        let r = d.call("GET /x", || async { Ok::<_, io::Error>(()) }).await;
        assert_eq!(matches!(r, Err(CallError::Injected(_))), injected, "{instance:?}: {r:?}");
    }
}

/// Operator levers: a forced-open override rejects every call; pausing retries makes one
/// attempt only.
#[tokio::test(start_paused = true)]
async fn operator_overrides_and_paused_retries() {
    let forced = policy("").replace(
        r#"{"policy""#,
        r#"{"breaker_overrides": [{"dependency": "p", "state": "forced_open", "reason": "drill"}], "policy""#,
    );
    let shared = shared_with(&forced);
    let d = dep(&shared, "p");
    let r = d.call("GET /x", || async { Ok::<_, io::Error>(()) }).await;
    assert!(matches!(r, Err(CallError::BreakerOpen(_))), "{r:?}");
    assert_eq!(d.breaker("GET /x").state, State::ForcedOpen);
    apply(&shared, 2, &policy(""));
    assert_eq!(d.breaker("GET /x").state, State::Closed, "override removed → back to normal");
    d.call("GET /x", || async { Ok::<_, io::Error>(()) }).await.unwrap();

    let paused = policy("").replace(r#""policy": {"#, r#""policy": {"inbound": {"retries_paused": true}, "#);
    apply(&shared, 3, &paused);
    let attempts = AtomicU32::new(0);
    let _ = d
        .call("GET /x", || {
            attempts.fetch_add(1, Ordering::SeqCst);
            async { Err::<(), _>(refused()) }
        })
        .await;
    assert_eq!(attempts.load(Ordering::SeqCst), 1);
}

/// State survives a config update that does not change the relevant settings.
#[tokio::test(start_paused = true)]
async fn breaker_state_survives_unrelated_updates() {
    let shared = shared_with(&policy(""));
    let d = dep(&shared, "p");
    let _ = d.call("GET /x", || async { Err::<(), _>(refused()) }).await;
    assert_eq!(d.breaker("GET /x").state, State::Open);
    apply(&shared, 2, &policy(r#", "fallback": "generic""#));
    assert_eq!(d.breaker("GET /x").state, State::Open, "a fallback change does not reset the breaker");
}

/// The tower layer with the HTTP judge: a 503 response is a retryable failure; after the
/// attempts run out the last response is returned as is; a 404 is not retried.
#[tokio::test(start_paused = true)]
async fn http_layer_retries_5xx_responses_and_returns_the_last_one() {
    use tower::{Layer, Service, ServiceExt};
    let shared = shared_with(&policy(""));
    let d = dep(&shared, "p");
    let hits = Arc::new(AtomicU32::new(0));
    let h = hits.clone();
    let inner = tower::service_fn(move |req: http::Request<String>| {
        let n = h.fetch_add(1, Ordering::SeqCst);
        async move {
            assert_eq!(req.headers().get("levee-retried").map(|v| v.as_bytes()), Some(&b"1"[..]));
            let status = if req.uri().path() == "/missing" {
                404
            } else if n < 1 {
                503
            } else {
                200
            };
            Ok::<_, io::Error>(http::Response::builder().status(status).body(String::new()).unwrap())
        }
    });
    let mut svc = d.layer().policy(HttpPolicy).layer(inner);
    let req = http::Request::get("http://p/ok").body(String::new()).unwrap();
    let res = svc.ready().await.unwrap().call(req).await.unwrap();
    assert_eq!(res.status(), 200);
    assert_eq!(hits.load(Ordering::SeqCst), 2, "one 503, then the retry succeeded");
    let req = http::Request::get("http://p/missing").body(String::new()).unwrap();
    let res = svc.ready().await.unwrap().call(req).await.unwrap();
    assert_eq!(res.status(), 404);
    assert_eq!(hits.load(Ordering::SeqCst), 3, "404 is not retried");
}

const OUTLIERS: &str = r#", "outlier_detection": {"consecutive_errors": 2, "interval": "100ms",
                            "base_ejection_time": "1s", "max_ejection_percent": 50}"#;

/// Outlier detection through the stack: attempts go round robin; a retry lands on the next
/// endpoint; an endpoint failing twice in a row is ejected and gets no traffic until its
/// ejection time is over.
#[tokio::test(start_paused = true)]
async fn balanced_calls_eject_a_failing_endpoint_and_retry_on_another() {
    let shared = shared_with(&policy(OUTLIERS));
    let d = dep(&shared, "p");
    let pool = d.endpoints(vec![0usize, 1, 2]);
    let hits: [AtomicU32; 3] = Default::default();
    let call = || {
        d.call_balanced(&pool, "GET /x", |&ep| {
            hits[ep].fetch_add(1, Ordering::SeqCst);
            async move { if ep == 1 { Err(refused()) } else { Ok(ep) } }
        })
    };
    for _ in 0..10 {
        let r = call().await;
        assert!(matches!(r, Ok(0 | 2)), "a retry moves to a healthy endpoint: {r:?}");
    }
    let hits_now = hits.each_ref().map(|h| h.load(Ordering::SeqCst));
    assert_eq!(hits_now[1], 2, "endpoint 1 is ejected after its second consecutive failure");
    assert_eq!(
        hits_now[0] + hits_now[2],
        10,
        "every call ended on a healthy endpoint, two of them by a retry"
    );
    assert!(pool.detector().is_ejected(1));
    assert_eq!(pool.detector().ejected_count(), 1);

    // Ejection over (1 s × 1) and swept: endpoint 1 is back in rotation.
    tokio::time::advance(Duration::from_millis(1200)).await;
    for _ in 0..3 {
        let _ = call().await;
    }
    assert_eq!(hits[1].load(Ordering::SeqCst), 3, "back in the pool after its ejection time");
}

/// A hanging endpoint is judged by its attempt timeouts like any failure: after one
/// timeout (consecutive_errors 1) it is ejected and later calls go straight to the other.
#[tokio::test(start_paused = true)]
async fn balanced_calls_count_attempt_timeouts_against_the_endpoint() {
    let extra = OUTLIERS.replace(r#""consecutive_errors": 2"#, r#""consecutive_errors": 1"#);
    let shared = shared_with(&policy(&extra));
    let d = dep(&shared, "p");
    let pool = d.endpoints(vec!["hangs", "ok"]);
    let call = || {
        d.call_balanced(&pool, "GET /x", |&ep| async move {
            if ep == "hangs" {
                std::future::pending::<()>().await;
            }
            Ok::<_, io::Error>(ep)
        })
    };
    let started = Instant::now();
    assert_eq!(call().await.unwrap(), "ok");
    assert!(started.elapsed() >= Duration::from_millis(300), "the first attempt timed out");
    assert!(pool.detector().is_ejected(0));
    let started = Instant::now();
    assert_eq!(call().await.unwrap(), "ok");
    assert_eq!(started.elapsed(), Duration::ZERO, "no attempt is sent to the ejected endpoint");
}

/// New settings from the server reach an existing pool on its next call.
#[tokio::test(start_paused = true)]
async fn balanced_pool_follows_outlier_settings_from_a_new_snapshot() {
    let shared = shared_with(&policy(OUTLIERS));
    let d = dep(&shared, "p");
    let pool = d.endpoints(vec![0usize, 1]);
    apply(
        &shared,
        2,
        &policy(&OUTLIERS.replace(r#""max_ejection_percent": 50"#, r#""max_ejection_percent": 0"#)),
    );
    for _ in 0..6 {
        let _ = d
            .call_balanced(
                &pool,
                "POST /x",
                |&ep| async move { if ep == 1 { Err(refused()) } else { Ok(()) } },
            )
            .await;
    }
    assert_eq!(pool.detector().max_ejected(), 0);
    assert!(!pool.detector().is_ejected(1), "max_ejection_percent 0 from the new snapshot: nobody ejected");
}

/// STALE through the stack: a fresh answer is kept; when the dependency fails, the kept
/// answer is served at level STALE while it is younger than `stale_max_age`; after that
/// the call's error comes back for the next fallback level.
#[tokio::test(start_paused = true)]
async fn stale_if_error_serves_the_last_good_answer_within_its_max_age() {
    let shared = shared_with(&policy(r#", "stale_max_age": "10s""#));
    let d = dep(&shared, "p");
    let cache = d.stale_cache::<&str, u32>();
    let up = AtomicU32::new(1);
    let call = || {
        d.call_stale_if_error(&cache, "alice", "GET /recs/{user}", || {
            let ok = up.load(Ordering::SeqCst) == 1;
            async move { if ok { Ok(7u32) } else { Err(refused()) } }
        })
    };
    let fresh = call().await.unwrap();
    assert_eq!((fresh.value, fresh.level, fresh.is_degraded()), (7, FallbackLevel::Fresh, false));

    up.store(0, Ordering::SeqCst);
    tokio::time::advance(Duration::from_secs(9)).await;
    let stale = call().await.unwrap();
    assert_eq!((stale.value, stale.level), (7, FallbackLevel::Stale));
    // The call failed after two refused attempts opened the breaker (window 3, 50 %).
    assert!(matches!(stale.cause, Some(CallError::BreakerOpen(_))), "the cause is kept: {:?}", stale.cause);

    tokio::time::advance(Duration::from_secs(2)).await;
    assert!(call().await.is_err(), "11 s old is past stale_max_age: the error comes back");
    let other =
        d.call_stale_if_error(&cache, "bob", "GET /recs/{user}", || async { Err::<u32, _>(refused()) }).await;
    assert!(other.is_err(), "nothing kept for bob");
}

/// A dependency `t` with one attempt per call (unless `retry` says otherwise), a breaker
/// that never trips in these tests, and `client_throttle` settings `throttle`.
fn throttled_policy(throttle: &str, retry: &str) -> String {
    format!(
        r#"{{"policy": {{{throttle}"dependencies": {{"t": {{
            "attempt_timeout": "300ms",
            "retry": {retry},
            "circuit_breaker": {{"window": {{"type": "count", "size": 10000}}, "minimum_calls": 10000}}}}}}}}}}"#
    )
}

fn unavailable() -> crate::retry::HttpStatusError {
    crate::retry::HttpStatusError::from_parts(http::StatusCode::SERVICE_UNAVAILABLE, &http::HeaderMap::new())
        .expect("503 is a failure")
}

/// Runs `n` calls answered by `answer` (when an attempt is made); returns how many
/// attempts reached the dependency and how many calls were refused with `Throttled`.
async fn calls<T>(d: &Dependency, n: u32, answer: fn() -> Result<(), T>) -> (u32, u32)
where
    T: crate::retry::Classify + fmt::Debug,
{
    let attempts = AtomicU32::new(0);
    let mut throttled = 0;
    for _ in 0..n {
        let r = d
            .call("GET /x", || {
                attempts.fetch_add(1, Ordering::SeqCst);
                std::future::ready(answer())
            })
            .await;
        throttled += u32::from(matches!(r, Err(CallError::Throttled(_))));
    }
    (attempts.load(Ordering::SeqCst), throttled)
}

/// Client-side throttling in the stack (SRE book, "Handling Overload"), with the values
/// worked out by hand. K = 2 (the default). After 20 accepted calls, a backend rejecting
/// everything: before call j (j rejections so far) p = max(0, (20 + j − 2·20) / (21 + j)),
/// 0 for j ≤ 20, so 21 rejected calls are all sent. Then every call is a request and none
/// an accept, whether refused locally or sent: before the i-th further call (i from 0)
/// p = (i + 1) / (i + 42), so the expected number sent of 1,000 is
/// Σ 41 / (i + 42) = 41 · (H(1041) − H(41)) ≈ 132 (standard deviation ≈ 11; the draws are
/// seeded, the bounds are ±4.5 σ). A refusal is `Throttled`: not retried, never seen by
/// the breaker, counted in the status report; a window later the throttle is quiet again.
#[tokio::test(start_paused = true)]
async fn client_throttle_refuses_only_past_k_times_the_accepts_and_forgets_after_its_window() {
    let shared = shared_with(&throttled_policy("", r#"{"max_attempts": 1}"#));
    let d = dep(&shared, "t");
    d.view().state.throttle.reseed(17);
    assert_eq!(d.view().state.throttle.k(), 2.0, "K defaults to 2");
    assert_eq!(calls::<io::Error>(&d, 20, || Ok(())).await, (20, 0));
    assert_eq!(calls(&d, 21, || Err(unavailable())).await, (21, 0), "p = 0 while j ≤ 20");
    let (sent, refused) = calls(&d, 1000, || Err(unavailable())).await;
    assert_eq!(sent + refused, 1000, "a call is either sent once or refused");
    assert!((82..=182).contains(&sent), "≈ 132 of 1,000 sent, got {sent}");
    assert_eq!(
        d.breaker("GET /x").window.calls,
        u64::from(20 + 21 + sent),
        "refusals never reach the breaker"
    );
    let report = shared.status_report();
    let counter = report.counters.iter().find(|c| c.name == r#"client_throttled{dependency="t"}"#);
    assert_eq!(counter.map(|c| c.value), Some(u64::from(refused)));
    // The window (2 minutes) forgets the rejections: nothing is refused any more.
    tokio::time::advance(Duration::from_secs(121)).await;
    assert_eq!(calls::<io::Error>(&d, 100, || Ok(())).await, (100, 0));
}

/// K comes from `policy.client_throttle`, changed live; with K = 3 a backend may reject
/// twice as much as it accepts before any local refusal: after 20 accepts,
/// p = max(0, (20 + j − 3·20) / (21 + j)) = 0 for j ≤ 40, so 41 rejected calls are sent.
#[tokio::test(start_paused = true)]
async fn client_throttle_k_comes_from_the_policy() {
    let shared = shared_with(&throttled_policy(r#""client_throttle": {"k": 3}, "#, r#"{"max_attempts": 1}"#));
    let d = dep(&shared, "t");
    assert_eq!(d.view().state.throttle.k(), 3.0);
    assert_eq!(calls::<io::Error>(&d, 20, || Ok(())).await, (20, 0));
    assert_eq!(calls(&d, 41, || Err(unavailable())).await, (41, 0), "p = 0 while j ≤ 40");
    apply(&shared, 2, &throttled_policy(r#""client_throttle": {"k": 1}, "#, r#"{"max_attempts": 1}"#));
    assert_eq!(d.view().state.throttle.k(), 1.0, "changed live, counts kept");
    assert!((d.view().state.throttle.reject_probability() - 41.0 / 62.0).abs() < 1e-12);
}

/// The callee is told what its caller will wait, not the whole request budget:
/// min(remaining − reserve, attempt timeout) — on the tower path (`HttpPolicy` headers)
/// and on the plain path (`propagate` inside the attempt future). Before, a non-critical
/// dependency with an 80 ms attempt timeout was sent the request's 999 ms.
#[tokio::test(start_paused = true)]
async fn propagated_deadline_is_the_attempt_deadline_not_the_request_budget() {
    use tower::{Layer, Service, ServiceExt};
    let shared = shared_with(r#"{"policy": {"dependencies": {"p": {"attempt_timeout": "80ms"}}}}"#);
    let d = dep(&shared, "p");
    let sent = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let s = sent.clone();
    let inner = tower::service_fn(move |req: http::Request<String>| {
        let ms = req.headers()["levee-deadline-ms"].to_str().unwrap().parse::<u64>().unwrap();
        s.store(ms, Ordering::SeqCst);
        async move { Ok::<_, io::Error>(http::Response::new(String::new())) }
    });
    let mut svc = d.layer().policy(HttpPolicy).layer(inner);
    let ctx = RequestContext::new(Deadline::after(Duration::from_millis(1000)));
    with_context(ctx, async {
        let req = http::Request::get("http://p/x").body(String::new()).unwrap();
        svc.ready().await.unwrap().call(req).await.unwrap();
    })
    .await;
    assert_eq!(sent.load(Ordering::SeqCst), 80, "the attempt timeout, not the 1000 ms budget");

    // Plain path: the budget minus the reserve when that is shorter than the timeout.
    let reserve = crate::policy::defaults::RESERVE;
    let budget = reserve + Duration::from_millis(30);
    let header = with_deadline(Deadline::after(budget), async {
        d.call("GET /x", || async {
            let mut h = http::HeaderMap::new();
            propagate(&mut h, false);
            Ok::<_, io::Error>(h)
        })
        .await
        .unwrap()
    })
    .await;
    assert_eq!(header["levee-deadline-ms"], "30", "remaining {budget:?} − reserve {reserve:?}");
    assert_eq!(header["levee-criticality"], "CRITICAL");

    // Without a request deadline the callee still learns the attempt timeout.
    let header = d
        .call("GET /x", || async {
            let mut h = http::HeaderMap::new();
            propagate(&mut h, false);
            Ok::<_, io::Error>(h)
        })
        .await
        .unwrap();
    assert_eq!(header["levee-deadline-ms"], "80");
}

/// The tower path takes the operation per request: an `Operation` extension first, then
/// the layer's `operation_from`, then the layer's fixed operation; each selects its own
/// scope (here `GET /a` has a breaker of its own).
#[tokio::test(start_paused = true)]
async fn tower_operation_is_taken_per_request() {
    use tower::{Layer, Service, ServiceExt};
    let own_breaker = r#", "operations": {"GET /a": {"circuit_breaker": {"window": {"type": "count", "size": 10},
        "minimum_calls": 3, "failure_rate_threshold": 0.5, "wait_in_open": "1s"}}}"#;
    let shared = shared_with(&policy(own_breaker));
    let d = dep(&shared, "p");
    let inner = tower::service_fn(|_: http::Request<String>| async {
        Ok::<_, io::Error>(http::Response::new(String::new()))
    });
    let mut svc = d
        .layer()
        .operation("GET /layer")
        .policy(HttpPolicy)
        .operation_from(|req: &http::Request<String>| {
            (req.uri().path() == "/b").then(|| Operation::from_static("GET /a"))
        })
        .layer(inner);
    let mut with_ext = http::Request::get("http://p/x").body(String::new()).unwrap();
    with_ext.extensions_mut().insert(Operation::from_static("GET /a"));
    for req in [
        with_ext,
        http::Request::get("http://p/b").body(String::new()).unwrap(),
        http::Request::get("http://p/c").body(String::new()).unwrap(),
    ] {
        assert_eq!(svc.ready().await.unwrap().call(req).await.unwrap().status(), 200);
    }
    assert_eq!(d.breaker("GET /a").window.calls, 2, "the extension and operation_from chose GET /a");
    assert_eq!(d.breaker("GET /layer").window.calls, 1, "the layer's operation: the dependency's scope");
}

/// The tower path's future holds its state machine inline, with its bulkhead slot and
/// breaker permit detached from the guards: a request dropped mid-attempt must still give
/// the slot back and free its half-open probe, exactly as a dropped plain call does.
#[tokio::test(start_paused = true)]
async fn a_dropped_tower_call_gives_back_its_slot_and_its_probe() {
    use tower::{Layer, Service};
    let shared = shared_with(&policy(""));
    let d = dep(&shared, "p");
    for _ in 0..3 {
        let _ = d.call("GET /x", || async { Err::<(), _>(refused()) }).await;
    }
    assert_eq!(d.breaker("GET /x").state, State::Open);
    tokio::time::advance(Duration::from_millis(1100)).await;
    let mut svc = d
        .layer()
        .operation("GET /x")
        .layer(tower::service_fn(|_: u32| std::future::pending::<Result<u32, io::Error>>()));
    let free = |d: &Dependency| d.breaker("GET /x").half_open_free;
    let mut fut = Box::pin(svc.call(1));
    assert!(futures::poll!(&mut fut).is_pending());
    assert_eq!(d.bulkhead_usage("GET /x").0, 1, "the attempt holds a slot");
    assert_eq!(d.breaker("GET /x").state, State::HalfOpen);
    let while_probing = free(&d);
    drop(fut);
    assert_eq!(d.bulkhead_usage("GET /x").0, 0, "the dropped call gave its slot back");
    assert_eq!(free(&d), while_probing + 1, "and its unreported probe");
    let r = d.call("GET /x", || async { Ok::<_, io::Error>(()) }).await;
    assert!(r.is_ok(), "{r:?}");
}

/// The `retries_paused` lever of `levers` stops retries until its expiry only: at that
/// instant, with no server and no call in between, the policy's retries are back.
#[tokio::test(start_paused = true)]
async fn paused_retries_resume_at_the_levers_expiry_without_the_server() {
    use crate::flags::tests::{advance, timers};
    use crate::policy::Timestamp;
    let expires = Timestamp::from_unix_ms(Timestamp::now().unix_ms() + 60_000).to_rfc3339();
    let body = policy("").replacen(
        r#"{"policy""#,
        &format!(r#"{{"levers": {{"retries_paused": true, "expires_at": "{expires}"}}, "policy""#),
        1,
    );
    let shared = shared_with(&body);
    let _timers = timers(&shared);
    let d = dep(&shared, "p");
    let attempts = |d: Dependency| async move {
        let n = AtomicU32::new(0);
        // The first attempt fails, a retry succeeds.
        let _ = d
            .call("GET /x", || {
                let first = n.fetch_add(1, Ordering::SeqCst) == 0;
                async move { if first { Err(refused()) } else { Ok(()) } }
            })
            .await;
        n.load(Ordering::SeqCst)
    };
    assert_eq!(attempts(d.clone()).await, 1, "retries paused by the lever");
    advance(Duration::from_secs(61)).await;
    assert_eq!(attempts(d.clone()).await, 2, "the lever expired: retried as the policy says");
}

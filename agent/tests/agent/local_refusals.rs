//! IN-6: refusals made on this machine are not a dependency's outcome. Inside an attempt to
//! dependency `p`, a call refused locally — another dependency's full bulkhead, open
//! breaker or kill switch, a deadline that ran out, a tower `load_shed` below `p`'s layer —
//! neither closes nor opens `p`'s breaker, and a half-open probe it consumed is handed
//! back. Through the public API (`Dependency::call`) and the tower layer, paused clock.

use std::io;
use std::sync::Arc;
use std::time::Duration;

use levee_agent::breaker::State;
use levee_agent::deadline::{Deadline, with_deadline};
use levee_agent::policy::decode_config;
use levee_agent::{Agent, CallError, Dependency};
use tokio::sync::Semaphore;
use tower::{ServiceBuilder, ServiceExt};

/// `p`: one attempt per call, a count-window breaker (minimum 3 calls, 50 %, 1 s open, one
/// half-open probe); `q`: a bulkhead of one; `off`: switched off by its kill switch.
const POLICY: &str = r#"{
  "flags": {"off.enabled": {"type": "bool", "value": false}},
  "policy": {"dependencies": {
    "p": {"retry": {"max_attempts": 1}, "attempt_timeout": "5s",
          "circuit_breaker": {"window": {"type": "count", "size": 10}, "minimum_calls": 3,
                              "failure_rate_threshold": 0.5, "wait_in_open": "1s",
                              "half_open_probes": 1}},
    "q": {"retry": {"max_attempts": 1}, "bulkhead": {"max_concurrent": 1}},
    "off": {"enabled_flag": "off.enabled"}}}}"#;

fn agent() -> Agent {
    let cfg = decode_config(POLICY.as_bytes()).expect("valid test policy");
    Agent::builder("http://127.0.0.1:9", "no-token", "test", "in-6").defaults(cfg).build().unwrap()
}

fn refused() -> io::Error {
    io::Error::from(io::ErrorKind::ConnectionRefused)
}

/// Opens `p`'s breaker with three refused connections, waits out the open period and
/// returns with the breaker due to go HALF_OPEN on the next call.
async fn open_then_wait(p: &Dependency) {
    for _ in 0..3 {
        let _ = p.call("p", || async { Err::<(), _>(refused()) }).await;
    }
    assert_eq!(p.breaker("p").state, State::Open);
    tokio::time::advance(Duration::from_millis(1001)).await;
}

/// Holds `q`'s only bulkhead slot until the returned task is aborted.
async fn fill_q(q: &Dependency) -> tokio::task::JoinHandle<()> {
    let q = q.clone();
    let held = tokio::spawn(async move {
        let _ = q.call("q", std::future::pending::<Result<(), io::Error>>).await;
    });
    tokio::task::yield_now().await;
    held
}

/// The issue's case: `q`'s full bulkhead refuses a call made inside `p`'s half-open probe.
/// Nothing reached `p`: the breaker stays HALF_OPEN with its probe back, and the next call
/// is the probe that decides.
#[tokio::test(start_paused = true)]
async fn in_6_another_dependencys_full_bulkhead_does_not_close_a_half_open_breaker() {
    let agent = agent();
    let (p, q) = (agent.dependency("p"), agent.dependency("q"));
    open_then_wait(&p).await;
    let held = fill_q(&q).await;
    let r = p.call("p", || async { q.call("q", || async { Ok::<_, io::Error>("q's answer") }).await }).await;
    match r {
        Err(CallError::Inner(CallError::BulkheadFull(_))) => {}
        other => panic!("q's refusal comes back unchanged: {other:?}"),
    }
    let b = p.breaker("p");
    assert_eq!(b.state, State::HalfOpen, "a local refusal must not close the breaker");
    assert_eq!(b.half_open_free, 1, "the probe is handed back");
    // The real probe decides: a failure reopens (a consumed probe would have refused it).
    let r = p.call("p", || async { Err::<(), _>(refused()) }).await;
    assert!(matches!(r, Err(CallError::Inner(_))), "the probe was let through: {r:?}");
    assert_eq!(p.breaker("p").state, State::Open);
    held.abort();
}

/// Local refusals of every kind inside `p`'s attempts, many of them: `p`'s breaker stays
/// CLOSED with an empty window (they would be 100 % failures, or successes, otherwise).
#[tokio::test(start_paused = true)]
async fn in_6_local_refusals_never_open_or_fill_a_breaker() {
    let agent = agent();
    let (p, q, off, s) =
        (agent.dependency("p"), agent.dependency("q"), agent.dependency("off"), agent.dependency("s"));
    let held = fill_q(&q).await;
    for _ in 0..5 {
        // Another dependency's full bulkhead.
        let r = p.call("p", || async { q.call("q", || async { Ok::<_, io::Error>(()) }).await }).await;
        assert!(matches!(r, Err(CallError::Inner(CallError::BulkheadFull(_)))), "{r:?}");
        // Another dependency's kill switch.
        let r = p.call("p", || async { off.call("off", || async { Ok::<_, io::Error>(()) }).await }).await;
        assert!(matches!(r, Err(CallError::Inner(CallError::KillSwitched(_)))), "{r:?}");
        // A deadline that ran out before a nested call.
        let r = p
            .call("p", || async {
                with_deadline(
                    Deadline::after(Duration::ZERO),
                    s.call("s", || async { Ok::<_, io::Error>(()) }),
                )
                .await
            })
            .await;
        assert!(matches!(r, Err(CallError::Inner(CallError::DeadlineExceeded(..)))), "{r:?}");
    }
    let b = p.breaker("p");
    assert_eq!((b.state, b.window.calls), (State::Closed, 0), "{b:?}");
    held.abort();
}

/// Another dependency's open breaker inside `p`'s half-open probe: not `p`'s outcome.
#[tokio::test(start_paused = true)]
async fn in_6_another_dependencys_open_breaker_inside_a_probe_hands_it_back() {
    let agent = agent();
    let p = agent.dependency("p");
    let r_dep = agent.dependency("r");
    // `r` takes the defaults (minimum 20 calls): open it with enough refused connections.
    for _ in 0..40 {
        let _ = r_dep.call("r", || async { Err::<(), _>(refused()) }).await;
        if r_dep.breaker("r").state == State::Open {
            break;
        }
    }
    assert_eq!(r_dep.breaker("r").state, State::Open);
    open_then_wait(&p).await;
    let r = p.call("p", || async { r_dep.call("r", || async { Ok::<_, io::Error>(()) }).await }).await;
    assert!(matches!(r, Err(CallError::Inner(CallError::BreakerOpen(_)))), "{r:?}");
    let b = p.breaker("p");
    assert_eq!((b.state, b.half_open_free), (State::HalfOpen, 1), "{b:?}");
    // A successful probe closes it.
    p.call("p", || async { Ok::<_, io::Error>(()) }).await.unwrap();
    assert_eq!(p.breaker("p").state, State::Closed);
}

/// The tower path: `load_shed` + a concurrency limit of one below `p`'s layer. While the
/// limit is taken, the layer's calls get tower's `Overloaded`: a local refusal, not `p`'s
/// failure — three of them no longer open the breaker, and in HALF_OPEN one no longer
/// reopens it (which doubled the open period): the probe is handed back.
#[tokio::test(start_paused = true)]
async fn in_6_tower_load_shed_below_the_layer_is_not_a_dependency_failure() {
    let agent = agent();
    let p = agent.dependency("p");
    let gate = Arc::new(Semaphore::new(0));
    let inner = {
        let gate = gate.clone();
        tower::service_fn(move |fail: bool| {
            let gate = gate.clone();
            async move {
                if fail {
                    return Err(refused());
                }
                gate.acquire().await.unwrap().forget();
                Ok::<_, io::Error>("answer")
            }
        })
    };
    // The limit's clones share one slot; `limited` is also called around `p`'s layer.
    let limited = ServiceBuilder::new().load_shed().concurrency_limit(1).service(inner);
    let svc = ServiceBuilder::new().layer(p.layer().operation("p")).service(limited.clone());
    let holder = tokio::spawn(limited.clone().oneshot(false));
    tokio::task::yield_now().await;
    for _ in 0..5 {
        let e = svc.clone().oneshot(false).await.unwrap_err();
        assert!(e.is::<tower::load_shed::error::Overloaded>(), "{e}");
    }
    let b = p.breaker("p");
    assert_eq!((b.state, b.window.calls), (State::Closed, 0), "{b:?}");
    gate.add_permits(1);
    assert_eq!(holder.await.unwrap().unwrap(), "answer");

    // Open the breaker with real failures, wait for HALF_OPEN, take the limit again.
    for _ in 0..3 {
        let _ = svc.clone().oneshot(true).await;
    }
    assert_eq!(p.breaker("p").state, State::Open);
    tokio::time::advance(Duration::from_millis(1001)).await;
    let holder = tokio::spawn(limited.clone().oneshot(false));
    tokio::task::yield_now().await;
    let e = svc.clone().oneshot(false).await.unwrap_err();
    assert!(e.is::<tower::load_shed::error::Overloaded>(), "{e}");
    let b = p.breaker("p");
    assert_eq!((b.state, b.half_open_free), (State::HalfOpen, 1), "{b:?}");
    assert_eq!(b.consecutive_opens, 1, "not reopened: the open period did not double");
    gate.add_permits(1);
    holder.await.unwrap().unwrap();
    // The probe that reaches `p` decides.
    let answer = svc.clone().oneshot(false);
    gate.add_permits(1);
    assert_eq!(answer.await.unwrap(), "answer");
    assert_eq!(p.breaker("p").state, State::Closed);
}

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tokio::time::Instant;
use tower::{Layer, Service, ServiceExt};

use super::*;
use crate::flags::tests::{apply, shared_with};
use crate::policy::FallbackLevel;
use crate::state::Shared;

const POLICY: &str = r#"{
  "policy": {"dependencies": {
    "recommendations": {"criticality": "critical", "enabled_flag": "recommendations.enabled",
                        "attempt_timeout": "300ms", "fallback": "generic", "retry": {"max_attempts": 1},
                        "operations": {"GET /fast": {"attempt_timeout": "100ms"}}}
  }},
  "flags": {"recommendations.enabled": {"type": "bool", "value": true}}
}"#;

fn dep(shared: &Shared, name: &str) -> Dependency {
    shared.with_ctx(|ctx| shared.deps.handle(name, ctx))
}

fn switched_off() -> String {
    POLICY.replace(r#""value": true"#, r#""value": false"#)
}

/// Counts drops of the future that owns it.
struct DropCount(Arc<AtomicUsize>);

impl Drop for DropCount {
    fn drop(&mut self) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

/// A future that never completes; counts its polls in `polls` and its drop in `polls`'
/// sibling counter `drops`.
fn counted_pending_with_drop(
    polls: &Arc<AtomicUsize>,
    drops: &Arc<AtomicUsize>,
) -> impl Future<Output = Result<u32, std::io::Error>> + use<> {
    let polls = polls.clone();
    let guard = DropCount(drops.clone());
    std::future::poll_fn(move |_| {
        let _keep = &guard;
        polls.fetch_add(1, Ordering::SeqCst);
        std::task::Poll::Pending
    })
}

/// A future that never completes and counts how often it was polled.
fn counted_pending(polls: &Arc<AtomicUsize>) -> impl Future<Output = Result<u32, std::io::Error>> + use<> {
    counted_pending_with_drop(polls, &Arc::new(AtomicUsize::new(0)))
}

#[tokio::test(start_paused = true)]
async fn kill_switch_refuses_without_calling_or_polling() {
    let shared = shared_with(&switched_off());
    let d = dep(&shared, "recommendations");
    let (calls, polls) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let started = Instant::now();
    let r = d
        .call("GET /recommendations", || {
            calls.fetch_add(1, Ordering::SeqCst);
            counted_pending(&polls)
        })
        .await;
    match r {
        Err(CallError::KillSwitched(e)) => assert_eq!(e.dependency(), "recommendations"),
        other => panic!("expected KillSwitched, got {other:?}"),
    }
    assert_eq!(calls.load(Ordering::SeqCst), 0, "attempt closure not called");
    assert_eq!(polls.load(Ordering::SeqCst), 0, "future never polled");
    assert_eq!(started.elapsed(), Duration::ZERO, "refused at once, before the attempt timeout");

    // Flipped back on: the same handle lets calls through.
    apply(&shared, 2, POLICY);
    assert!(d.is_enabled());
    let r = d.call("GET /recommendations", || async { Ok::<_, std::io::Error>(7) }).await;
    assert_eq!(r.unwrap(), 7);
}

#[tokio::test(start_paused = true)]
async fn kill_switch_uses_declared_default_when_the_flag_is_absent_else_enabled() {
    // The server has no such flag: the policy declares it as compiled into the service.
    let no_flag = POLICY
        .replace(r#""flags": {"recommendations.enabled": {"type": "bool", "value": true}}"#, r#""flags": {}"#)
        .replace(r#""policy": {"#, r#""policy": {"compiled_in_flags": ["recommendations.enabled"], "#);
    let shared = shared_with(&no_flag);
    let d = dep(&shared, "recommendations");
    assert!(d.is_enabled(), "no flag and no declaration: enabled");
    let handle = shared.with_ctx(|ctx| shared.flags.declare_bool("recommendations.enabled", false, ctx));
    shared.refresh();
    assert!(!handle.get());
    assert!(!d.is_enabled(), "the declared default (false) decides while the server has no value");
    let r = d.call("x", || async { Ok::<_, std::io::Error>(()) }).await;
    assert!(matches!(r, Err(CallError::KillSwitched(_))));
    apply(&shared, 2, POLICY);
    assert!(d.is_enabled(), "the server value (true) wins over the declared default");
}

/// The race behind a kill switch that was ignored for a heartbeat interval: a handle built
/// from the state read just before a push was installed. Registration re-resolves the slot.
#[test]
fn a_handle_registered_while_a_snapshot_is_installed_sees_the_new_snapshot() {
    let shared = shared_with(POLICY);
    let off = switched_off();
    let stale = shared.with_ctx(|ctx| {
        apply(&shared, 2, &off); // the push lands after the state was read
        shared.deps.handle("recommendations", ctx)
    });
    assert!(stale.is_enabled(), "the interleaving under test: built from the pre-push state");
    let handle = shared.dependency_handle("recommendations");
    assert!(!handle.is_enabled() && !stale.is_enabled(), "both handles share the re-resolved slot");
}

#[tokio::test(start_paused = true)]
async fn attempt_timeout_uses_operation_override_then_dependency_value() {
    let shared = shared_with(POLICY);
    let d = dep(&shared, "recommendations");
    for (op, expected) in [("GET /fast", 100), ("GET /other", 300)] {
        let (polls, drops) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        let started = Instant::now();
        let r = d.call(op, || counted_pending_with_drop(&polls, &drops)).await;
        let elapsed = started.elapsed();
        match r {
            Err(CallError::Timeout(t)) => assert_eq!(t.timeout(), Duration::from_millis(expected)),
            other => panic!("expected Timeout, got {other:?}"),
        }
        assert_eq!(elapsed, Duration::from_millis(expected), "{op}");
        assert!(polls.load(Ordering::SeqCst) >= 1, "the attempt ran");
        assert_eq!(drops.load(Ordering::SeqCst), 1, "the attempt was dropped at the timeout");
    }
    // An answer inside the limit passes, errors pass through unchanged.
    let ok = d
        .call("GET /fast", || async {
            tokio::time::sleep(Duration::from_millis(99)).await;
            Ok::<_, std::io::Error>("in time")
        })
        .await;
    assert_eq!(ok.unwrap(), "in time");
    let err = d.call("GET /fast", || async { Err::<(), _>(std::io::Error::other("boom")) }).await;
    match err {
        Err(CallError::Inner(e)) => assert_eq!(e.to_string(), "boom"),
        other => panic!("expected Inner, got {other:?}"),
    }
}

#[tokio::test(start_paused = true)]
async fn unknown_dependency_gets_compiled_in_defaults() {
    let shared = shared_with(POLICY);
    let d = dep(&shared, "never-configured");
    assert_eq!(*d.policy(), crate::policy::DependencyPolicy::default());
    assert_eq!(d.attempt_timeout("any"), crate::policy::defaults::ATTEMPT_TIMEOUT);
    assert!(d.is_enabled());
}

/// The order of enforcement: the kill switch is checked before the attempt timeout is
/// armed, so a switched-off dependency fails as `KillSwitched` even when the attempt
/// would also time out.
#[tokio::test(start_paused = true)]
async fn order_kill_switch_rejects_before_the_attempt_timeout() {
    let shared =
        shared_with(&switched_off().replace(r#""attempt_timeout": "300ms""#, r#""attempt_timeout": "1ms""#));
    let d = dep(&shared, "recommendations");
    let polls = Arc::new(AtomicUsize::new(0));
    let r = d.call("GET /x", || counted_pending(&polls)).await;
    assert!(matches!(r, Err(CallError::KillSwitched(_))), "{r:?}");
}

#[tokio::test(start_paused = true)]
async fn call_or_fallback_reports_level_and_cause() {
    let shared = shared_with(POLICY);
    let d = dep(&shared, "recommendations");
    let fresh = d
        .call_or_fallback(
            "GET /x",
            || async { Ok::<_, std::io::Error>(vec!["personal"]) },
            |_| async { vec!["top"] },
        )
        .await;
    assert_eq!(
        (fresh.value.clone(), fresh.level, fresh.is_degraded()),
        (vec!["personal"], FallbackLevel::Fresh, false)
    );

    let slow = d
        .call_or_fallback(
            "GET /fast",
            || async {
                tokio::time::sleep(Duration::from_secs(5)).await;
                Ok::<_, std::io::Error>(vec!["personal"])
            },
            |e| {
                let timed_out = matches!(e, CallError::Timeout(_));
                async move { if timed_out { vec!["top"] } else { vec![] } }
            },
        )
        .await;
    assert_eq!(slow.value, vec!["top"]);
    assert_eq!(slow.level, FallbackLevel::Generic);
    assert!(matches!(slow.cause, Some(CallError::Timeout(_))));

    apply(&shared, 2, &switched_off());
    let off = d.call_or_fallback("GET /x", || async { Ok::<_, std::io::Error>(1) }, |_| async { 0 }).await;
    assert_eq!((off.value, off.level), (0, FallbackLevel::Generic));
    assert!(matches!(off.cause, Some(CallError::KillSwitched(_))));
}

#[tokio::test(start_paused = true)]
async fn tower_layer_boxes_errors_as_opaque_structs() {
    let shared = shared_with(POLICY);
    let d = dep(&shared, "recommendations");
    let calls = Arc::new(AtomicUsize::new(0));
    let c = calls.clone();
    let inner = tower::service_fn(move |req: u64| {
        c.fetch_add(1, Ordering::SeqCst);
        async move {
            match req {
                0 => Err(std::io::Error::other("inner failure")),
                1 => {
                    tokio::time::sleep(Duration::from_secs(10)).await;
                    Ok(1)
                }
                n => Ok(n * 2),
            }
        }
    });
    let mut svc = d.layer().operation("GET /fast").layer(inner);

    assert_eq!(svc.ready().await.unwrap().call(21).await.unwrap(), 42);
    let e = svc.ready().await.unwrap().call(0).await.unwrap_err();
    assert_eq!(e.downcast_ref::<std::io::Error>().unwrap().to_string(), "inner failure");
    let started = Instant::now();
    let e = svc.ready().await.unwrap().call(1).await.unwrap_err();
    assert_eq!(e.downcast_ref::<AttemptTimeout>().unwrap().timeout(), Duration::from_millis(100));
    assert_eq!(started.elapsed(), Duration::from_millis(100));
    assert_eq!(calls.load(Ordering::SeqCst), 3);

    apply(&shared, 2, &switched_off());
    let e = svc.ready().await.unwrap().call(21).await.unwrap_err();
    assert_eq!(e.downcast_ref::<KillSwitched>().unwrap().dependency(), "recommendations");
    assert_eq!(e.to_string(), "dependency `recommendations` is switched off by its kill switch");
    assert_eq!(calls.load(Ordering::SeqCst), 3, "inner service not called while switched off");
}

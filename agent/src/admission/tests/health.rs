//! Every route's health window: how its requests ended since the last status report —
//! served (a success, a failure or a timeout, as the answer said), refused by admission
//! (shed), or not counted (probes, cancelled requests) — as the rollout's and the
//! experiments' rules read them on the server.

use std::convert::Infallible;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::Full;
use tower::{Layer, ServiceExt};

use super::*;
use crate::health::{KIND_ROUTE, LATENCY_BUCKETS};
use crate::proto::HealthWindow;

type Body = Full<Bytes>;

/// A service answering the status (and `grpc-status` header) the request's path names,
/// after the milliseconds its query names: `/answer/500?30`.
fn service()
-> impl tower::Service<Request<Body>, Response = Response<Body>, Error = Infallible, Future: Send> + Clone {
    tower::service_fn(|req: Request<Body>| async move {
        let ms: u64 = req.uri().query().and_then(|q| q.parse().ok()).unwrap_or(0);
        tokio::time::sleep(Duration::from_millis(ms)).await;
        let last = req.uri().path().rsplit('/').next().unwrap_or_default().to_string();
        let mut res = Response::new(Full::new(Bytes::new()));
        match last.strip_prefix("grpc") {
            Some(code) => {
                res.headers_mut().insert("grpc-status", code.parse().unwrap());
            }
            None => *res.status_mut() = StatusCode::from_u16(last.parse().unwrap()).unwrap(),
        }
        Ok(res)
    })
}

fn request(path: &str, template: &str) -> Request<Body> {
    let mut r = Request::get(path).body(Full::new(Bytes::new())).unwrap();
    r.extensions_mut().insert(RouteTemplate(template.into()));
    r
}

fn windows(a: &Admission, window_ms: u64) -> Vec<HealthWindow> {
    let mut out = Vec::new();
    a.health(window_ms, crate::health::MAX_HEALTH_WINDOWS, &mut out);
    out.sort_by(|x, y| x.name.cmp(&y.name));
    out
}

fn counts(w: &HealthWindow) -> (u64, u64, u64, u64, u64) {
    (w.calls, w.successes, w.failures, w.timeouts, w.shed)
}

#[tokio::test(start_paused = true)]
async fn each_answer_counts_in_its_routes_window_as_the_answer_says() {
    let a = engine(r#"{"limit": {"algorithm": "fixed", "initial_limit": 10}}"#);
    let svc = a.layer().layer(service());
    for (path, template) in [
        ("/ok/200?30", "/ok/{s}"),
        ("/ok/200?30", "/ok/{s}"),
        ("/ok/404", "/ok/{s}"),
        ("/bad/500", "/bad/{s}"),
        ("/bad/503", "/bad/{s}"),
        ("/bad/504", "/bad/{s}"),
        ("/bad/grpc14", "/bad/{s}"),
        ("/bad/grpc4", "/bad/{s}"),
        ("/bad/grpc0", "/bad/{s}"),
        ("/healthz/200", "/healthz"),
    ] {
        svc.clone().oneshot(request(path, template)).await.unwrap();
    }
    let w = windows(&a, 10_000);
    assert_eq!(w.len(), 2, "a probe route counts nothing: {w:?}");
    let (bad, ok) = (&w[0], &w[1]);
    assert_eq!((bad.kind.as_str(), bad.name.as_str(), bad.window_ms), (KIND_ROUTE, "GET /bad/{s}", 10_000));
    assert_eq!(counts(bad), (6, 1, 3, 2, 0), "500, 503, grpc 14 fail; 504, grpc 4 time out; grpc 0 succeeds");
    assert_eq!(ok.name, "GET /ok/{s}");
    assert_eq!(counts(ok), (3, 3, 0, 0, 0), "a 404 is the caller's mistake, not the route's");
    // A fixed limit measures one admission in FIXED_SAMPLE_EVERY, each reading standing
    // for that many: the engine's first request was one, and took 30 ms.
    assert_eq!(ok.latency_buckets.len(), LATENCY_BUCKETS);
    let stride = super::super::limit::FIXED_SAMPLE_EVERY;
    assert_eq!(ok.latency_buckets[5], stride, "one 30 ms reading standing for {stride} requests: {ok:?}");
    assert_eq!(ok.latency_buckets.iter().sum::<u64>(), stride);
    assert_eq!((ok.fallbacks, ok.breaker_opens), (0, 0));
    assert!(windows(&a, 10_000).is_empty(), "the next window starts from 0");
}

#[tokio::test(start_paused = true)]
async fn refusals_count_as_shed_and_cancelled_requests_count_nowhere() {
    let a = engine(r#"{"limit": {"algorithm": "fixed", "initial_limit": 1}, "queue": {"max_len": 0}}"#);
    let svc = a.layer().layer(service());
    // A request holding the only slot for a second, then dropped before its answer.
    let mut slow = Box::pin(svc.clone().oneshot(request("/slow/200?1000", "/slow/{s}")));
    assert!(futures::poll!(&mut slow).is_pending());
    for _ in 0..3 {
        let res = svc.clone().oneshot(request("/ok/200", "/ok/{s}")).await.unwrap();
        assert_eq!(res.status(), StatusCode::SERVICE_UNAVAILABLE);
    }
    drop(slow);
    svc.clone().oneshot(request("/ok/200", "/ok/{s}")).await.unwrap();
    let w = windows(&a, 1_000);
    assert_eq!(w.len(), 1, "the cancelled request's route has no window: {w:?}");
    assert_eq!(counts(&w[0]), (4, 1, 0, 0, 3));
    assert_eq!(w[0].latency_buckets.iter().sum::<u64>(), 0, "refusals take no time worth reporting");
}

#[tokio::test(start_paused = true)]
async fn shadow_mode_counts_the_answer_of_a_request_it_would_have_refused() {
    let a = engine(
        r#"{"mode": "shadow", "limit": {"algorithm": "fixed", "initial_limit": 1}, "queue": {"max_len": 0}}"#,
    );
    let _busy = a.try_admit(&req("GET /ok/{s}", Criticality::Critical)).unwrap();
    let svc = a.layer().layer(service());
    svc.clone().oneshot(request("/ok/500", "/ok/{s}")).await.unwrap();
    drop(_busy);
    let w = windows(&a, 1_000);
    assert_eq!(counts(&w[0]), (2, 1, 1, 0, 0), "served in shadow mode: counted by its answer, not as shed");
}

#[tokio::test(start_paused = true)]
async fn the_plain_api_counts_a_success_unless_told_otherwise() {
    let a = engine(r#"{"limit": {"algorithm": "fixed", "initial_limit": 10}}"#);
    drop(a.try_admit(&req("GET /a", Criticality::Critical)).unwrap());
    let mut failed = a.try_admit(&req("GET /a", Criticality::Critical)).unwrap();
    failed.set_failed();
    drop(failed);
    let mut overloaded = a.try_admit(&req("GET /a", Criticality::Critical)).unwrap();
    overloaded.set_outcome(Outcome::Dropped);
    drop(overloaded);
    let mut ignored = a.try_admit(&req("GET /a", Criticality::Critical)).unwrap();
    ignored.set_outcome(Outcome::Ignore);
    drop(ignored);
    let w = windows(&a, 1_000);
    assert_eq!(counts(&w[0]), (3, 1, 2, 0, 0));
}

/// A permit names its route by the engine's slot table; a state with no slot (the table's
/// room taken by states that lost registration races) is held by the permit instead, and
/// counts the request's end all the same.
#[tokio::test]
async fn a_route_state_without_a_slot_still_counts() {
    use super::route::{NO_SLOT, RouteSlots, RouteState};
    let slots = RouteSlots::default();
    let first = slots.state("GET /a");
    assert!(std::ptr::eq(slots.get(first.slot()).unwrap(), &*first), "the slot keeps the state itself");
    let mut made = 1;
    while slots.state("GET /b").slot() != NO_SLOT {
        made += 1;
    }
    assert!(made > super::MAX_TRACKED_ROUTES, "room for every tracked route and more: {made}");
    assert!(slots.get(NO_SLOT).is_none());

    let a = engine(r#"{"limit": {"algorithm": "fixed", "initial_limit": 10}}"#);
    let unslotted = std::sync::Arc::new(RouteState::new("GET /c"));
    assert_eq!(unslotted.slot(), NO_SLOT);
    let (in_flight, _) = a.core().try_acquire().expect("a free slot");
    let permit = AdmissionPermit::counted(
        super::permit::CoreRef::Borrowed(a.core()),
        &unslotted,
        None,
        Criticality::Critical,
        in_flight,
        Outcome::Success,
    );
    drop(permit);
    assert_eq!(a.core().in_flight(), 0, "the slot is given back");
    let w = unslotted.health.take(KIND_ROUTE, "GET /c", 1, 0).expect("counted");
    assert_eq!(counts(&w), (1, 1, 0, 0, 0));
}

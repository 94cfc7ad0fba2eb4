//! IN-4 idle lockout: a route is never refused while the service is idle, whatever its
//! requests did before. A request with no deadline header has no caller's deadline; a
//! learned service time never locks a route out (it is only used while the service is
//! busy, one sample moves it little, and refusals wear it down).

use std::convert::Infallible;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::Full;
use proptest::prelude::*;
use tower::{Layer, ServiceExt};

use super::*;
use crate::deadline::{Deadline, RequestContext, with_context};

type Body = Full<Bytes>;

/// A handler that takes as many milliseconds as its path says (`/work/1500`).
fn timed_service()
-> impl tower::Service<Request<Body>, Response = Response<Body>, Error = Infallible, Future: Send> + Clone {
    tower::service_fn(|req: Request<Body>| async move {
        let ms: u64 = req.uri().path().rsplit('/').next().unwrap().parse().unwrap();
        tokio::time::sleep(Duration::from_millis(ms)).await;
        Ok(Response::new(Full::new(Bytes::from_static(b"done"))))
    })
}

fn request(ms: u64, deadline_ms: Option<u64>) -> Request<Body> {
    let mut b = Request::get(format!("/work/{ms}"));
    if let Some(d) = deadline_ms {
        b = b.header("levee-deadline-ms", d.to_string());
    }
    let mut r = b.body(Full::new(Bytes::new())).unwrap();
    r.extensions_mut().insert(RouteTemplate("/work/{ms}".into()));
    r
}

fn expected(a: &Admission) -> Duration {
    a.status().routes.iter().find(|r| r.route == "GET /work/{ms}").unwrap().expected_service_time
}

/// The default policy, no deadline header, a handler that takes 1.5 s (longer than the
/// default deadline of 1 s), one request at a time: every request is served, also ten
/// minutes later.
#[tokio::test(start_paused = true)]
async fn in_4_a_request_without_a_deadline_header_is_never_refused_for_time() {
    let a = Admission::with_seed(&policy::Inbound::default(), 42);
    let svc = a.layer().layer(timed_service());
    for round in 0..2 {
        for i in 0..5 {
            let res = svc.clone().oneshot(request(1500, None)).await.unwrap();
            assert_eq!(res.status(), StatusCode::OK, "round {round}, request {i}");
        }
        assert!(expected(&a) >= Duration::from_millis(1400), "the service time was learned");
        tokio::time::advance(Duration::from_secs(600)).await;
    }
    assert!(a.status().routes.iter().all(|r| r.shed.is_empty()), "{:?}", a.status());
}

/// A 10 ms route where one request took 9 s: callers sending a 1 s deadline are served
/// again at once — one sample moves the estimate by 1/8, not to 1.1 s.
#[tokio::test(start_paused = true)]
async fn in_4_one_slow_request_does_not_lock_its_route_out() {
    let a = Admission::with_seed(&policy::Inbound::default(), 42);
    let svc = a.layer().layer(timed_service());
    for _ in 0..20 {
        assert_eq!(svc.clone().oneshot(request(10, Some(1000))).await.unwrap().status(), StatusCode::OK);
    }
    assert_eq!(expected(&a), 10 * MS);
    assert_eq!(svc.clone().oneshot(request(9000, Some(10_000))).await.unwrap().status(), StatusCode::OK);
    assert!(expected(&a) < 12 * MS, "one 9 s sample moved the estimate to {:?}", expected(&a));
    for _ in 0..20 {
        assert_eq!(svc.clone().oneshot(request(10, Some(1000))).await.unwrap().status(), StatusCode::OK);
    }
    assert!(expected(&a).abs_diff(10 * MS) < Duration::from_micros(1), "{:?}", expected(&a));
}

/// Even when the very first measurement of a route was the outlier (no earlier samples to
/// weigh it against), an idle service serves the route's next requests, and they bring
/// the estimate down.
#[tokio::test(start_paused = true)]
async fn in_4_an_outlier_first_sample_refuses_nothing_while_idle() {
    let a = Admission::with_seed(&policy::Inbound::default(), 42);
    let svc = a.layer().layer(timed_service());
    assert_eq!(svc.clone().oneshot(request(9000, Some(10_000))).await.unwrap().status(), StatusCode::OK);
    assert_eq!(expected(&a), Duration::from_secs(9));
    for i in 0..20 {
        let res = svc.clone().oneshot(request(10, Some(1000))).await.unwrap();
        assert_eq!(res.status(), StatusCode::OK, "request {i} after the outlier");
    }
    assert!(expected(&a) < 11 * MS, "{:?}", expected(&a));
}

/// While the service is busy, a caller's deadline shorter than the route's expected time
/// is refused (serving it would take a slot from requests that can finish); each such
/// refusal wears the estimate down, so a route whose estimate exceeds every caller's
/// deadline is measured again even if the service never becomes idle.
#[tokio::test(start_paused = true)]
async fn in_4_refusals_while_busy_wear_an_estimate_down() {
    let a = engine(r#"{"limit": {"algorithm": "fixed", "initial_limit": 2}, "queue": {"max_len": 0}}"#);
    let p = a.try_admit(
        &req("GET /slow", Criticality::Critical).deadline(Deadline::after(Duration::from_secs(60))),
    );
    tokio::time::advance(Duration::from_secs(9)).await;
    drop(p.unwrap());
    assert_eq!(a.status().routes[0].expected_service_time, Duration::from_secs(9));
    // Busy: both slots held by another route.
    let _busy = [
        a.try_admit(&req("GET /other", Criticality::Critical)).unwrap(),
        a.try_admit(&req("GET /other", Criticality::Critical)).unwrap(),
    ];
    let one_second =
        || req("GET /slow", Criticality::CriticalPlus).deadline(Deadline::after(Duration::from_secs(1)));
    let mut refused = 0;
    while let Err(r) = a.try_admit(&one_second()) {
        assert_eq!(r.reason(), Reason::Deadline);
        refused += 1;
        assert!(refused < 200, "still refused after {refused} refusals");
    }
    // ln(9) / ln(64/63) ≈ 139 refusals bring 9 s under 1 s.
    assert!(refused > 100, "{refused}");
}

/// The plain API: a deadline counts only when somebody asked for it — the request's own,
/// or a request context's that came from the caller, not the service's default budget.
#[tokio::test(start_paused = true)]
async fn in_4_the_default_budget_of_a_context_is_not_a_callers_deadline() {
    let a = engine(r#"{"limit": {"algorithm": "fixed", "initial_limit": 1}, "queue": {"max_len": 0}}"#);
    let p = a.try_admit(&req("GET /slow", Criticality::Critical)).unwrap();
    tokio::time::advance(50 * MS).await;
    drop(p);
    let _busy = a.try_admit(&req("GET /other", Criticality::Critical)).unwrap();
    let default_budget =
        RequestContext { from_caller: false, ..RequestContext::new(Deadline::after(10 * MS)) };
    let r = with_context(default_budget, async {
        a.try_admit(&req("GET /slow", Criticality::CriticalPlus)).map(drop)
    })
    .await;
    assert!(r.is_ok(), "a default budget must not make the request too late: {r:?}");
    let sent = RequestContext::new(Deadline::after(10 * MS));
    let r = with_context(sent, async { a.try_admit(&req("GET /slow", Criticality::CriticalPlus)).map(drop) })
        .await;
    assert_eq!(r.unwrap_err().reason(), Reason::Deadline);
}

/// One step of a request sequence.
#[derive(Clone, Debug)]
enum Step {
    /// A request arrives: route, criticality, the caller's deadline (ms, if any), how long
    /// the service takes (ms), how it ends, and whether it may wait in the queue.
    Arrive { route: usize, crit: usize, deadline: Option<u64>, service: u64, outcome: usize, wait: bool },
    /// Time passes (ms).
    Advance(u64),
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        3 => (0..3usize, 0..4usize, proptest::option::of(0..3000u64), prop_oneof![0..50u64, 0..20_000u64], 0..3usize, any::<bool>())
            .prop_map(|(route, crit, deadline, service, outcome, wait)| Step::Arrive {
                route, crit, deadline, service, outcome, wait
            }),
        1 => (0..5000u64).prop_map(Step::Advance),
    ]
}

const ROUTES: [&str; 3] = ["GET /a", "GET /b", "POST /c"];
const CRITS: [Criticality; 4] =
    [Criticality::CriticalPlus, Criticality::Critical, Criticality::SheddablePlus, Criticality::Sheddable];
const OUTCOMES: [Outcome; 3] = [Outcome::Success, Outcome::Dropped, Outcome::Ignore];
const LIMITS: [&str; 4] = [
    r#"{"algorithm": "fixed", "initial_limit": 2}"#,
    r#"{"algorithm": "aimd", "initial_limit": 3, "min_limit": 1, "max_limit": 4, "timeout": "1s"}"#,
    r#"{"algorithm": "gradient2", "initial_limit": 3, "min_limit": 1, "max_limit": 4, "timeout": "1s"}"#,
    r#"{"algorithm": "vegas", "initial_limit": 3, "min_limit": 1, "max_limit": 4, "timeout": "1s"}"#,
];

/// Runs `steps` against an engine; after each one, if nothing is in flight nor waiting,
/// every route must admit a request of every criticality, with or without a deadline.
fn idle_never_refuses(limit: usize, steps: &[Step]) -> Result<(), TestCaseError> {
    let rt = tokio::runtime::Builder::new_current_thread().enable_time().start_paused(true).build().unwrap();
    rt.block_on(async {
        let a = engine(&format!(r#"{{"limit": {}, "queue": {{"max_len": 4}}}}"#, LIMITS[limit]));
        let mut tasks = Vec::new();
        for s in steps {
            match *s {
                Step::Arrive { route, crit, deadline, service, outcome, wait } => {
                    let a = a.clone();
                    tasks.push(tokio::spawn(async move {
                        let mut r = req(ROUTES[route], CRITS[crit]);
                        if let Some(ms) = deadline {
                            r = r.deadline(Deadline::after(Duration::from_millis(ms)));
                        }
                        let permit = if wait { a.admit(&r).await } else { a.try_admit(&r) };
                        if let Ok(mut p) = permit {
                            tokio::time::sleep(Duration::from_millis(service)).await;
                            p.set_outcome(OUTCOMES[outcome]);
                        }
                    }));
                }
                Step::Advance(ms) => tokio::time::advance(Duration::from_millis(ms)).await,
            }
            settle().await;
            let s = a.status();
            if s.in_flight == 0 && s.queued == 0 {
                for route in ROUTES {
                    for c in CRITS {
                        for d in [None, Some(Deadline::after(MS))] {
                            let mut r = req(route, c);
                            if let Some(d) = d {
                                r = r.deadline(d);
                            }
                            match a.try_admit(&r) {
                                Ok(mut p) => p.set_outcome(Outcome::Ignore),
                                Err(e) => prop_assert!(
                                    false,
                                    "idle service refused {route} {c:?} (deadline {d:?}): {e}; {:?}",
                                    a.status()
                                ),
                            }
                        }
                    }
                }
            }
        }
        for t in tasks {
            t.abort();
        }
        Ok(())
    })
}

proptest! {
    // A fixed seed: the suite is the same every run; a failing case found once is kept in
    // proptest-regressions/ and replayed first.
    #![proptest_config(proptest::test_runner::Config {
        rng_seed: proptest::test_runner::RngSeed::Fixed(0x006c_6576_6565),
        cases: 128,
        ..proptest::test_runner::Config::default()
    })]

    /// IN-4: no sequence of requests (any routes, criticalities, deadlines, service times,
    /// outcomes, any limit algorithm) makes admission refuse a request while nothing is
    /// in flight.
    #[test]
    fn in_4_no_sequence_of_requests_locks_a_route_out_of_an_idle_service(
        limit in 0..LIMITS.len(),
        steps in proptest::collection::vec(step(), 1..60),
    ) {
        idle_never_refuses(limit, &steps)?;
    }
}

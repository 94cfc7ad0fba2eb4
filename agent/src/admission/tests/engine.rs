use std::time::Duration;

use http::{HeaderMap, HeaderValue};

use super::*;
use crate::deadline::{Deadline, inbound_deadline};

const FIXED_2_NO_QUEUE: &str =
    r#"{"limit": {"algorithm": "fixed", "initial_limit": 2}, "queue": {"max_len": 0}}"#;

#[tokio::test]
async fn a_free_slot_is_taken_at_once_and_given_back_on_drop() {
    let a = engine(FIXED_2_NO_QUEUE);
    let p1 = a.try_admit(&req("GET /x", Criticality::Critical)).unwrap();
    let p2 = a.admit(&req("GET /x", Criticality::Sheddable)).await.unwrap();
    assert!(p1.is_counted() && p2.is_counted());
    assert_eq!(a.status().in_flight, 2);
    let r = a.try_admit(&req("GET /x", Criticality::Critical)).unwrap_err();
    assert_eq!(r.reason(), Reason::Limit);
    assert_eq!(r.http_status(), http::StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(r.retry_after(), RETRY_AFTER_OVERLOAD);
    assert_eq!(r.to_string(), "overloaded: request shed (limit)");
    drop(p1);
    assert_eq!(a.status().in_flight, 1);
    let _p3 = a.try_admit(&req("GET /x", Criticality::Critical)).unwrap();
    let s = a.status();
    let x = s.routes.iter().find(|r| r.route == "GET /x").unwrap();
    assert_eq!(
        x.shed,
        vec![ShedCount { criticality: Criticality::Critical, reason: Reason::Limit, count: 1 }]
    );
}

#[tokio::test]
async fn critical_plus_and_exempt_routes_are_never_shed() {
    let a = engine(FIXED_2_NO_QUEUE);
    let _busy = [
        a.try_admit(&req("GET /x", Criticality::Critical)).unwrap(),
        a.try_admit(&req("GET /x", Criticality::Critical)).unwrap(),
    ];
    // CRITICAL_PLUS goes past the limit and counts in flight.
    let vip = a.try_admit(&req("GET /x", Criticality::CriticalPlus)).unwrap();
    assert!(vip.is_counted());
    assert_eq!(a.status().in_flight, 3);
    // Probes, whatever their method and criticality, take no slot at all.
    for route in ["GET /healthz", "GET /readyz", "HEAD /metrics", "/grpc.health.v1.Health/Check"] {
        let p = a.try_admit(&req(route, Criticality::Sheddable)).unwrap();
        assert!(!p.is_counted(), "{route}");
    }
    a.exempt("/status");
    assert!(!a.try_admit(&req("GET /status", Criticality::Sheddable)).unwrap().is_counted());
    assert_eq!(a.try_admit(&req("GET /other", Criticality::Sheddable)).unwrap_err().reason(), Reason::Limit);
    assert_eq!(a.status().in_flight, 3);
}

#[tokio::test]
async fn route_default_criticality_comes_from_the_policy() {
    let a = engine(
        r#"{"limit": {"algorithm": "fixed", "initial_limit": 1}, "queue": {"max_len": 0},
            "default_criticality": "SHEDDABLE",
            "routes": {"POST /orders": {"criticality": "CRITICAL_PLUS"}}}"#,
    );
    let _busy = a.try_admit(&AdmissionRequest::new("GET /browse")).unwrap();
    let r = a.try_admit(&AdmissionRequest::new("GET /browse")).unwrap_err();
    assert_eq!(r.criticality(), Criticality::Sheddable);
    let order = a.try_admit(&AdmissionRequest::new("POST /orders")).unwrap();
    assert_eq!(order.criticality(), Criticality::CriticalPlus);
}

#[test]
fn hostile_criticality_values_fall_back_to_the_route_default_and_claims_are_capped() {
    let route = Criticality::SheddablePlus;
    let cap = Criticality::Critical;
    let check = |values: &[&[u8]], want: Criticality| {
        let mut h = HeaderMap::new();
        for v in values {
            h.append("levee-criticality", HeaderValue::from_bytes(v).unwrap());
        }
        assert_eq!(criticality_from_headers(&h, route, cap), want, "{values:?}");
    };
    check(&[], route);
    check(&[b"SHEDDABLE"], Criticality::Sheddable);
    check(&[b" critical "], Criticality::Critical);
    // A claim above the cap is lowered to it.
    check(&[b"CRITICAL_PLUS"], Criticality::Critical);
    for bad in
        [&b"-1"[..], b"999999999999999999999", b"NaN", b"URGENT", b"", b"\xff\xfe", b"CRITICAL;SHEDDABLE"]
    {
        check(&[bad], route);
    }
    // Repeated: trusted with neither value.
    check(&[b"SHEDDABLE", b"SHEDDABLE"], route);
    check(&[b"CRITICAL", b"SHEDDABLE"], route);
}

#[tokio::test(start_paused = true)]
async fn hostile_deadline_values_fall_back_to_the_default_budget() {
    let default = Duration::from_millis(700);
    let max = Duration::from_secs(5);
    let check = |pairs: &[(&'static str, &[u8])], want: Duration| {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(*k, HeaderValue::from_bytes(v).unwrap());
        }
        assert_eq!(inbound_deadline(&h, max, default).remaining(), want, "{pairs:?}");
    };
    for bad in [&b"-5"[..], b"1e9", b"abc", b"", b"\xff", b"12345678901234567890"] {
        check(&[("levee-deadline-ms", bad)], default);
        check(&[("grpc-timeout", bad)], default);
    }
    check(&[("levee-deadline-ms", b"99999999999")], max);
    check(&[("levee-deadline-ms", b"100"), ("levee-deadline-ms", b"200")], default);
    check(&[("grpc-timeout", b"100m"), ("grpc-timeout", b"100m"), ("levee-deadline-ms", b"300")], 300 * MS);
}

#[tokio::test(start_paused = true)]
async fn a_request_that_cannot_finish_before_its_deadline_is_dropped_while_the_service_is_busy() {
    let a = engine(r#"{"limit": {"algorithm": "fixed", "initial_limit": 4}, "queue": {"max_len": 0}}"#);
    // Learn the route's service time: 50 ms.
    let p = a
        .try_admit(&req("GET /slow", Criticality::Critical).deadline(Deadline::after(Duration::from_secs(1))))
        .unwrap();
    tokio::time::advance(50 * MS).await;
    drop(p);
    let s = a.status();
    assert_eq!(s.routes.iter().find(|r| r.route == "GET /slow").unwrap().expected_service_time, 50 * MS);
    let short = || req("GET /slow", Criticality::CriticalPlus).deadline(Deadline::after(30 * MS));
    // Idle: a free slot costs nobody anything, the request is served (IN-4).
    a.try_admit(&short()).unwrap().set_outcome(Outcome::Ignore);
    // An expired deadline is refused whatever the load.
    let expired = req("GET /other", Criticality::CriticalPlus).deadline(Deadline::after(Duration::ZERO));
    assert_eq!(a.try_admit(&expired).unwrap_err().reason(), Reason::Deadline);
    // Busy: every slot taken.
    let _busy: Vec<_> =
        (0..4).map(|_| a.try_admit(&req("GET /other", Criticality::Critical)).unwrap()).collect();
    assert_eq!(a.try_admit(&short()).unwrap_err().reason(), Reason::Deadline);
    let fits = req("GET /slow", Criticality::CriticalPlus).deadline(Deadline::after(80 * MS));
    assert!(a.try_admit(&fits).is_ok());
    // The deadline of the task's request context is used when none is given.
    let ctx = crate::deadline::RequestContext::new(Deadline::after(10 * MS));
    let r = crate::deadline::with_context(ctx, async {
        a.try_admit(&req("GET /slow", Criticality::CriticalPlus)).map(|_| ())
    })
    .await;
    assert_eq!(r.unwrap_err().reason(), Reason::Deadline);
}

#[tokio::test]
async fn the_operator_lever_sheds_the_given_share_of_sheddable_traffic_only() {
    let a =
        engine(r#"{"limit": {"algorithm": "fixed", "initial_limit": 100}, "shed_sheddable_percent": 30}"#);
    let mut shed = [0u32; 4];
    for c in
        [Criticality::CriticalPlus, Criticality::Critical, Criticality::SheddablePlus, Criticality::Sheddable]
    {
        for _ in 0..10_000 {
            if let Err(r) = a.try_admit(&req("GET /x", c)) {
                assert_eq!(r.reason(), Reason::Operator);
                shed[super::super::reason::crit_index(c)] += 1;
            }
        }
    }
    assert_eq!(&shed[..2], &[0, 0]);
    for n in &shed[2..] {
        assert!((2800..=3200).contains(n), "{shed:?}");
    }
    a.update(&inbound(
        r#"{"limit": {"algorithm": "fixed", "initial_limit": 100}, "shed_sheddable_percent": 100}"#,
    ));
    assert!(a.try_admit(&req("GET /x", Criticality::Sheddable)).is_err());
    a.update(&inbound(r#"{"limit": {"algorithm": "fixed", "initial_limit": 100}}"#));
    assert!(a.try_admit(&req("GET /x", Criticality::Sheddable)).is_ok());
}

#[tokio::test]
async fn route_names_are_templates_and_the_number_tracked_is_bounded() {
    let a = engine(r#"{"routes": {"GET /quote/{sku}": {"criticality": "SHEDDABLE"}}}"#);
    let mut r = http::Request::get("/quote/123?x=1").body(()).unwrap();
    assert_eq!(route_key(&r).as_str(), UNMATCHED_ROUTE, "a raw path is never a route");
    r.extensions_mut().insert(RouteTemplate("/quote/{sku}".into()));
    assert_eq!(route_key(&r).as_str(), "GET /quote/{sku}");
    let grpc = http::Request::post("/shop.Pricing/Quote")
        .header("content-type", "application/grpc+proto")
        .body(())
        .unwrap();
    assert_eq!(route_key(&grpc).as_str(), "/shop.Pricing/Quote");
    let not_a_method =
        http::Request::post("/a/b/c").header("content-type", "application/grpc").body(()).unwrap();
    assert_eq!(route_key(&not_a_method).as_str(), UNMATCHED_ROUTE);
    let mut long = http::Request::get("/").body(()).unwrap();
    long.extensions_mut().insert(RouteTemplate("x".repeat(300).into()));
    assert_eq!(route_key(&long).as_str(), UNMATCHED_ROUTE);

    for i in 0..MAX_TRACKED_ROUTES + 5 {
        drop(a.try_admit(&req(&format!("GET /r{i}"), Criticality::Critical)).unwrap());
    }
    // Probes past the cap are still exempt.
    assert!(!a.try_admit(&req("GET /healthz", Criticality::Sheddable)).unwrap().is_counted());
    let s = a.status();
    assert_eq!(s.tracked_routes, MAX_TRACKED_ROUTES);
    // One policy route plus 1023 new ones fit; 6 requests went to `_overflow`.
    assert_eq!(s.route_overflow, 7);
    assert!(s.routes.iter().all(|r| r.route != "GET /r1024"));
}

#[tokio::test]
async fn read_only_mode_refuses_mutating_routes_from_the_agents_flag_even_in_shadow_mode() {
    let cfg: crate::policy::ServiceConfig = crate::policy::decode_config(
        br#"{"policy": {"inbound": {"mode": "shadow", "read_only_flag": "checkout.read_only",
              "routes": {"POST /orders": {"mutating": true}}}},
             "flags": {"checkout.read_only": {"type": "bool", "value": true}}}"#,
    )
    .unwrap();
    let agent = crate::Agent::builder("http://127.0.0.1:9", "t", "test", "ro").defaults(cfg).build().unwrap();
    let a = agent.admission();
    assert!(a.read_only());
    let r = a.try_admit(&AdmissionRequest::new("POST /orders")).unwrap_err();
    assert_eq!(r.reason(), Reason::ReadOnly);
    assert_eq!(r.retry_after(), RETRY_AFTER_READ_ONLY);
    assert_eq!(r.grpc_code(), tonic::Code::Unavailable);
    assert!(r.to_string().contains("read-only"));
    assert!(a.try_admit(&AdmissionRequest::new("GET /orders")).is_ok());
    // The same engine for every caller, reported in the agent's status report.
    assert_eq!(agent.admission().status().routes, a.status().routes);
    let report = agent.current(); // keep the agent alive while reading
    drop(report);
    let mut rep = crate::proto::StatusReport::default();
    a.status().contribute(&mut rep);
    assert!(rep.counters.iter().any(|c| c.name
        == r#"admission_shed{route="POST /orders",criticality="CRITICAL",reason="read_only"}"#
        && c.value == 1));
    assert!(rep.counters.iter().any(|c| c.name == "admission_shadow" && c.value == 1));
}

/// An agent's config whose operator levers (`levers`, as an emergency profile sets them)
/// end `secs` from now: everything sheddable shed, a fixed limit of 2 instead of the
/// policy's 50.
fn with_levers_for(secs: i64) -> String {
    let wall = crate::policy::Timestamp::now().unix_ms();
    let expires = crate::policy::Timestamp::from_unix_ms(wall + secs * 1000).to_rfc3339();
    format!(
        r#"{{"policy": {{"inbound": {{"limit": {{"algorithm": "fixed", "initial_limit": 50}},
                                   "queue": {{"max_len": 0}}}}}},
            "levers": {{"shed_sheddable_percent": 100, "inbound_limit": 2,
                        "expires_at": "{expires}", "reason": "profile storm: test"}}}}"#
    )
}

/// The levers of an agent's config end at their expiry by themselves, with no server and
/// no new snapshot: shedding stops and the limit returns to the policy's. Requests in
/// flight across both changes of the limit keep their slots.
#[tokio::test(start_paused = true)]
async fn operator_levers_end_at_their_expiry_without_the_server() {
    use crate::flags::tests::{advance, shared_with, timers};
    let shared =
        shared_with(r#"{"policy": {"inbound": {"limit": {"algorithm": "fixed", "initial_limit": 50}}}}"#);
    let _timers = timers(&shared);
    let a = Admission::for_agent(shared.clone(), &tokio::runtime::Handle::current());
    let held: Vec<_> = (0..3).map(|_| a.try_admit(&req("GET /x", Criticality::Critical)).unwrap()).collect();
    assert_eq!(a.status().limit, 50);

    crate::flags::tests::apply(&shared, 2, &with_levers_for(60));
    let r = a.try_admit(&req("GET /x", Criticality::Sheddable)).unwrap_err();
    assert_eq!(r.reason(), Reason::Operator, "every sheddable request shed");
    let s = a.status();
    assert_eq!((s.limit, s.in_flight), (2, 3), "the lever's limit; the 3 in flight keep running");
    assert_eq!(a.try_admit(&req("GET /x", Criticality::Critical)).unwrap_err().reason(), Reason::Limit);

    advance(Duration::from_secs(59)).await;
    assert_eq!(a.status().limit, 2, "not expired yet");
    assert!(a.try_admit(&req("GET /x", Criticality::Sheddable)).is_err());

    // No server, no snapshot: the expiry alone ends the levers.
    advance(Duration::from_secs(2)).await;
    let s = a.status();
    assert_eq!((s.limit, s.in_flight), (50, 3), "back to the policy's limit, nothing dropped");
    assert!(a.try_admit(&req("GET /x", Criticality::Sheddable)).is_ok(), "shedding stopped");
    assert!(a.try_admit(&req("GET /x", Criticality::Critical)).is_ok());
    drop(held);
    assert_eq!(a.status().in_flight, 0);
}

/// A config applied after its levers expired (a cached snapshot read at startup) enforces
/// the policy's values at once.
#[tokio::test(start_paused = true)]
async fn operator_levers_already_expired_when_applied_do_nothing() {
    let shared = crate::flags::tests::shared_with(&with_levers_for(-1));
    let a = Admission::for_agent(shared.clone(), &tokio::runtime::Handle::current());
    assert_eq!(a.status().limit, 50);
    assert!(a.try_admit(&req("GET /x", Criticality::Sheddable)).is_ok());
}

/// A service shows admission on its own status page: the status serializes with the names
/// the status report and metrics use, durations as the policy spells them.
#[tokio::test(start_paused = true)]
async fn the_status_serializes_for_a_status_page() {
    let a = engine(r#"{"limit": {"algorithm": "fixed", "initial_limit": 1}, "queue": {"max_len": 0}}"#);
    let p = a.try_admit(&req("GET /cart", Criticality::Critical)).unwrap();
    tokio::time::advance(12 * MS).await;
    drop(p);
    let _busy = a.try_admit(&req("GET /cart", Criticality::Critical)).unwrap();
    assert!(a.try_admit(&req("GET /cart", Criticality::SheddablePlus)).is_err());
    let v = serde_json::to_value(a.status()).unwrap();
    assert_eq!(
        (v["mode"].as_str(), v["algorithm"].as_str(), v["limit"].as_u64()),
        (Some("enforce"), Some("fixed"), Some(1))
    );
    let route = &v["routes"][0];
    assert_eq!(route["route"], "GET /cart");
    assert_eq!(route["expected_service_time"], "12ms");
    assert_eq!(route["shed"][0]["criticality"], "SHEDDABLE_PLUS");
    assert_eq!(route["shed"][0]["reason"], "limit");
}

//! IN-8 protection out of the box: with the default policy and no criticality header
//! anywhere, an overload sheds bulk traffic before the traffic a service cannot lose, and
//! never health probes; one line of policy marks a route critical.

use std::convert::Infallible;

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode};
use http_body_util::Full;
use tower::{Layer, ServiceExt};

use super::*;

type Body = Full<Bytes>;

/// Handlers that take 20 ms (health probes answer at once).
fn shop()
-> impl tower::Service<Request<Body>, Response = Response<Body>, Error = Infallible, Future: Send> + Clone {
    tower::service_fn(|req: Request<Body>| async move {
        if req.uri().path() != "/healthz" {
            tokio::time::sleep(20 * MS).await;
        }
        Ok(Response::new(Full::new(Bytes::from_static(b"ok"))))
    })
}

/// A request as a router that knows `template` would name it (`None`: no route matched).
fn request(method: Method, path: &str, template: Option<&str>) -> Request<Body> {
    let mut r = Request::builder().method(method).uri(path).body(Full::new(Bytes::new())).unwrap();
    if let Some(t) = template {
        r.extensions_mut().insert(RouteTemplate(t.into()));
    }
    r
}

/// The issue's case: a burst of 300 requests at once on the default limit (20) and queue
/// (100), one in ten a checkout, no header anywhere. Every checkout is served; browsing
/// absorbs the shedding; the health probe sent in the middle of it is answered.
#[tokio::test(start_paused = true)]
async fn in_8_the_default_policy_sheds_browsing_before_checkout() {
    let a = Admission::with_seed(&policy::Inbound::default(), 42);
    let svc = a.layer().layer(shop());
    let mut checkout = Vec::new();
    let mut browse = Vec::new();
    for i in 0..300 {
        if i % 10 == 9 {
            let r = request(Method::POST, "/checkout", Some("/checkout"));
            checkout.push(tokio::spawn(svc.clone().oneshot(r)));
        } else {
            let r = request(Method::GET, &format!("/browse/{i}"), Some("/browse/{id}"));
            browse.push(tokio::spawn(svc.clone().oneshot(r)));
        }
        if i == 150 {
            let probe =
                svc.clone().oneshot(request(Method::GET, "/healthz", Some("/healthz"))).await.unwrap();
            assert_eq!(probe.status(), StatusCode::OK, "a health probe is never shed");
        }
    }
    for (i, c) in checkout.into_iter().enumerate() {
        assert_eq!(c.await.unwrap().unwrap().status(), StatusCode::OK, "checkout {i}");
    }
    let mut shed = 0;
    for b in browse {
        if b.await.unwrap().unwrap().status() == StatusCode::SERVICE_UNAVAILABLE {
            shed += 1;
        }
    }
    assert!(shed >= 100, "browsing absorbs the shedding: {shed} of 270 shed");
    let s = a.status();
    let route = |name: &str| s.routes.iter().find(|r| r.route == name).unwrap();
    assert!(route("POST /checkout").shed.is_empty(), "{:?}", route("POST /checkout"));
    assert!(route("GET /browse/{id}").shed.iter().all(|c| c.criticality == Criticality::SheddablePlus));
}

/// The classification, and the one line of policy that changes it.
#[tokio::test]
async fn in_8_reads_are_sheddable_plus_writes_critical_unrouted_sheddable_unless_the_policy_says() {
    let check = |a: &Admission, route: &str, want: Criticality| {
        let p = a.try_admit(&AdmissionRequest::new(route)).unwrap();
        assert_eq!(p.criticality(), want, "{route}");
    };
    let a = engine("{}");
    check(&a, "GET /cart", Criticality::SheddablePlus);
    check(&a, "HEAD /cart", Criticality::SheddablePlus);
    check(&a, "OPTIONS /cart", Criticality::SheddablePlus);
    check(&a, "POST /checkout", Criticality::Critical);
    check(&a, "DELETE /cart/{id}", Criticality::Critical);
    check(&a, "/shop.Checkout/Pay", Criticality::Critical);
    check(&a, "CONSUME orders", Criticality::Critical);
    check(&a, UNMATCHED_ROUTE, Criticality::Sheddable);
    // One line marks a read critical.
    let a = engine(r#"{"routes": {"GET /cart": {"criticality": "CRITICAL"}}}"#);
    check(&a, "GET /cart", Criticality::Critical);
    check(&a, "GET /browse", Criticality::SheddablePlus);
    // A route entry that says nothing of criticality keeps the classification.
    let a = engine(r#"{"routes": {"GET /browse": {"deadline": "300ms"}}}"#);
    check(&a, "GET /browse", Criticality::SheddablePlus);
    // `default_criticality` set: every route that names none gets it.
    let a = engine(r#"{"default_criticality": "CRITICAL"}"#);
    check(&a, "GET /browse", Criticality::Critical);
    check(&a, UNMATCHED_ROUTE, Criticality::Critical);
    // The tower layer names an unrouted request `_unmatched`: SHEDDABLE.
    let svc = engine("{}").layer().layer(tower::service_fn(|_: Request<Body>| async {
        let ctx = crate::deadline::current().unwrap();
        Ok::<_, Infallible>(Response::new(Full::new(Bytes::from(crate::deadline::format_criticality(
            ctx.criticality,
        )))))
    }));
    let res = svc.oneshot(request(Method::POST, "/nowhere", None)).await.unwrap();
    assert_eq!(http_body_util::BodyExt::collect(res.into_body()).await.unwrap().to_bytes(), "SHEDDABLE");
}

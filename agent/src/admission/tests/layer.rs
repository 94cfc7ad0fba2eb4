//! The tower layer in front of an in-process service: rejections as HTTP and gRPC
//! answers, the request context installed for admitted requests, outcomes fed to the
//! limit, and (with the `axum` feature) route templates from axum's router.

use std::convert::Infallible;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use tower::{Layer, ServiceExt};

use super::*;
use crate::deadline;

type Body = Full<Bytes>;

/// A service answering with `status` and echoing the request context it runs in.
fn service(
    status: StatusCode,
) -> impl tower::Service<Request<Body>, Response = Response<Body>, Error = Infallible, Future: Send> + Clone {
    tower::service_fn(move |_req: Request<Body>| async move {
        let ctx = deadline::current().expect("the layer installs the request context");
        let text = format!(
            "{} {}",
            deadline::format_criticality(ctx.criticality),
            ctx.deadline.remaining().as_millis()
        );
        let mut res = Response::new(Full::new(Bytes::from(text)));
        *res.status_mut() = status;
        Ok(res)
    })
}

fn request(path: &str, template: &str, headers: &[(&str, &str)]) -> Request<Body> {
    let mut b = Request::get(path);
    for (k, v) in headers {
        b = b.header(*k, *v);
    }
    let mut r = b.body(Full::new(Bytes::new())).unwrap();
    r.extensions_mut().insert(RouteTemplate(template.into()));
    r
}

async fn text<B: BodyExt<Error: std::fmt::Debug>>(res: Response<B>) -> String {
    String::from_utf8(res.into_body().collect().await.unwrap().to_bytes().to_vec()).unwrap()
}

#[tokio::test(start_paused = true)]
async fn admitted_requests_run_in_their_context_and_rejections_are_explicit() {
    let a = engine(
        r#"{"limit": {"algorithm": "fixed", "initial_limit": 1}, "queue": {"max_len": 0},
            "routes": {"GET /items/{id}": {"criticality": "SHEDDABLE", "deadline": "300ms"}}}"#,
    );
    let svc = a.layer().layer(service(StatusCode::OK));
    let res = svc.clone().oneshot(request("/items/1", "/items/{id}", &[])).await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(text(res).await, "SHEDDABLE 300");
    let res = svc
        .clone()
        .oneshot(request(
            "/items/1",
            "/items/{id}",
            &[("levee-criticality", "critical"), ("levee-deadline-ms", "120")],
        ))
        .await
        .unwrap();
    assert_eq!(text(res).await, "CRITICAL 120");

    // Saturate the only slot, then every other request is answered 503 at once.
    let _busy = a.try_admit(&req("GET /items/{id}", Criticality::Critical)).unwrap();
    let res = svc.clone().oneshot(request("/items/2", "/items/{id}", &[])).await.unwrap();
    assert_eq!(res.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(res.headers()["retry-after"], "1");
    assert_eq!(res.headers()["content-type"], "application/problem+json");
    let body: serde_json::Value = serde_json::from_str(&text(res).await).unwrap();
    assert_eq!(body["status"], 503);
    assert!(body["detail"].as_str().unwrap().contains("concurrency limit"));

    // gRPC: a Trailers-Only answer with the pushback.
    let mut grpc = Request::post("/shop.Pricing/Quote")
        .header("content-type", "application/grpc")
        .body(Full::new(Bytes::new()))
        .unwrap();
    grpc.headers_mut().insert("te", "trailers".parse().unwrap());
    let res = svc.clone().oneshot(grpc).await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(res.headers()["grpc-status"], "8");
    assert_eq!(res.headers()["grpc-retry-pushback-ms"], "1000");
    assert_eq!(res.headers()["content-type"], "application/grpc");
    // A gRPC method the service never answered is the client's word: counted under
    // `_unmatched` (IN-7).
    let s = a.status();
    assert!(s.routes.iter().any(|r| r.route == UNMATCHED_ROUTE && r.shed.len() == 1), "{:?}", s.routes);
}

#[tokio::test(start_paused = true)]
async fn overload_answers_of_the_service_lower_an_aimd_limit() {
    let a =
        engine(r#"{"limit": {"algorithm": "aimd", "initial_limit": 50, "min_limit": 1, "max_limit": 100}}"#);
    let svc = a.layer().layer(service(StatusCode::SERVICE_UNAVAILABLE));
    // One window of ≥ 10 samples over 100 ms, all of them drops: 50 × 0.9 = 45.
    for _ in 0..12 {
        let res = svc.clone().oneshot(request("/x", "/x", &[])).await.unwrap();
        assert_eq!(res.status(), StatusCode::SERVICE_UNAVAILABLE);
        tokio::time::advance(10 * MS).await;
    }
    assert_eq!(a.status().limit, 45);
}

#[cfg(feature = "axum")]
#[tokio::test]
async fn axum_routes_are_named_by_their_matched_template() {
    use axum::routing::{get, post};
    let a = engine(r#"{"routes": {"GET /quote/{sku}": {"criticality": "SHEDDABLE"}}}"#);
    let app = axum::Router::new()
        .route(
            "/quote/{sku}",
            get(|| async { deadline::format_criticality(deadline::current().unwrap().criticality) }),
        )
        .route("/orders", post(|| async { "ok" }))
        .layer(a.layer());
    for sku in ["a", "b", "c"] {
        let res = app
            .clone()
            .oneshot(Request::get(format!("/quote/{sku}")).body(axum::body::Body::empty()).unwrap())
            .await
            .unwrap();
        assert_eq!(text(res).await, "SHEDDABLE");
    }
    let res =
        app.clone().oneshot(Request::post("/orders").body(axum::body::Body::empty()).unwrap()).await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    let routes: Vec<_> = a.status().routes.into_iter().map(|r| r.route).collect();
    assert_eq!(routes, ["GET /quote/{sku}", "POST /orders"], "templates only, never raw paths");
}

/// The inbound context layer finds a route's settings by template too: a route deadline
/// for `GET /quote/{sku}` applies to `/quote/123` (it never did while routes were keyed by
/// raw path).
#[tokio::test(start_paused = true)]
async fn the_inbound_context_applies_route_settings_by_template() {
    let cfg: crate::policy::ServiceConfig = crate::policy::decode_config(
        br#"{"policy": {"inbound": {"routes": {"GET /quote/{sku}": {"deadline": "250ms", "criticality": "SHEDDABLE"}}}}}"#,
    )
    .unwrap();
    let agent =
        crate::Agent::builder("http://127.0.0.1:9", "t", "test", "inbound").defaults(cfg).build().unwrap();
    let ctx = crate::inbound::context_for(&agent, &request("/quote/123", "/quote/{sku}", &[]));
    assert_eq!((ctx.deadline.remaining(), ctx.criticality), (250 * MS, Criticality::Sheddable));
    // Without a template the request matches no route: the service's default deadline,
    // and SHEDDABLE, the default policy's class of unrouted requests (IN-8).
    let raw = Request::get("/quote/123").body(()).unwrap();
    let ctx = crate::inbound::context_for(&agent, &raw);
    assert_eq!((ctx.deadline.remaining(), ctx.criticality), (Duration::from_secs(1), Criticality::Sheddable));
    #[cfg(feature = "axum")]
    {
        let app = axum::Router::new()
            .route(
                "/quote/{sku}",
                axum::routing::get(|| async {
                    deadline::current().unwrap().deadline.remaining().as_millis().to_string()
                }),
            )
            .layer(agent.inbound_layer());
        let res =
            app.oneshot(Request::get("/quote/9").body(axum::body::Body::empty()).unwrap()).await.unwrap();
        assert_eq!(text(res).await, "250");
    }
}

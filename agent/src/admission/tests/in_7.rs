//! IN-7 route label flood: requests to thousands of distinct unrouted paths, gRPC content
//! type or not, share one slot; routes the service knows are tracked under their own name
//! whatever arrived first.

use std::convert::Infallible;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use tower::{Layer, ServiceExt};

use super::*;

type Body = Full<Bytes>;

/// A gRPC server that knows one method, `/shop.Cart/Get`, and answers any other path
/// UNIMPLEMENTED in its headers (Trailers-Only), as tonic's router does. Echoes the
/// criticality its request runs with.
fn grpc_server()
-> impl tower::Service<Request<Body>, Response = Response<Body>, Error = Infallible, Future: Send> + Clone {
    tower::service_fn(|req: Request<Body>| async move {
        let criticality =
            crate::deadline::format_criticality(crate::deadline::current().unwrap().criticality);
        let mut res = Response::new(Full::new(Bytes::from(criticality)));
        res.headers_mut().insert("content-type", "application/grpc".parse().unwrap());
        if !matches!(req.uri().path(), "/shop.Cart/Get" | "/shop.Pay/Charge") {
            res.headers_mut().insert("grpc-status", "12".parse().unwrap());
        }
        Ok(res)
    })
}

fn grpc(path: &str) -> Request<Body> {
    Request::post(path).header("content-type", "application/grpc").body(Full::new(Bytes::new())).unwrap()
}

async fn criticality_of(res: Response<impl http_body::Body<Error: std::fmt::Debug>>) -> String {
    String::from_utf8(res.into_body().collect().await.unwrap().to_bytes().to_vec()).unwrap()
}

/// The issue's case: 2,000 distinct gRPC paths (and as many plain HTTP ones) before the
/// service's real method is ever called. None takes a slot; the real method, once
/// answered, is tracked under its own name, not `_overflow`.
#[tokio::test]
async fn in_7_a_flood_of_unrouted_paths_shares_one_slot_and_real_routes_keep_theirs() {
    let a = engine("{}");
    let svc = a.layer().layer(grpc_server());
    for i in 0..2000 {
        let res = svc.clone().oneshot(grpc(&format!("/evil.Flood{i}/Fill"))).await.unwrap();
        assert_eq!(res.headers()["grpc-status"], "12");
        let res =
            svc.clone().oneshot(Request::get(format!("/junk/{i}")).body(Full::new(Bytes::new())).unwrap());
        assert_eq!(res.await.unwrap().status(), StatusCode::OK);
    }
    let s = a.status();
    assert_eq!(
        s.tracked_routes,
        1,
        "only `_unmatched`: {:?}",
        s.routes.iter().map(|r| &r.route).collect::<Vec<_>>()
    );
    assert_eq!(s.route_overflow, 0);
    // The real method: its first request shares `_unmatched` (SHEDDABLE by default, the
    // service has not vouched for it yet); answered, it is tracked and classified as a
    // gRPC method (CRITICAL).
    assert_eq!(criticality_of(svc.clone().oneshot(grpc("/shop.Cart/Get")).await.unwrap()).await, "SHEDDABLE");
    assert_eq!(criticality_of(svc.clone().oneshot(grpc("/shop.Cart/Get")).await.unwrap()).await, "CRITICAL");
    let s = a.status();
    assert_eq!(s.tracked_routes, 2);
    assert!(s.routes.iter().any(|r| r.route == "/shop.Cart/Get"), "{:?}", s.routes);
    assert_eq!(s.route_overflow, 0);
}

/// A method the policy names is tracked from its first request, with the policy's
/// settings.
#[tokio::test]
async fn in_7_a_method_the_policy_names_is_tracked_from_its_first_request() {
    let a = engine(r#"{"routes": {"/shop.Pay/Charge": {"criticality": "CRITICAL_PLUS"}}}"#);
    let svc = a.layer().layer(grpc_server());
    assert_eq!(criticality_of(svc.oneshot(grpc("/shop.Pay/Charge")).await.unwrap()).await, "CRITICAL_PLUS");
}

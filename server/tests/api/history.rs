use reqwest::{Method, StatusCode};
use serde_json::json;

on_both_backends! {
async fn revisions_diff_and_rollback_are_exact(app) {
    app.seed().await;
    let svc = "/api/v1/environments/prod/services/checkout";
    let (s, _, _) = app
        .call(
            Method::PATCH,
            &format!("{svc}/flags/recommendations.enabled"),
            Some(json!({"value": false, "reason": "incident 42"})),
        )
        .await;
    assert_eq!(s, StatusCode::OK);
    let (_, _, revs) = app.call(Method::GET, &format!("{svc}/revisions"), None).await;
    let revs = revs.as_array().unwrap();
    assert_eq!(revs.len(), 2);
    assert_eq!((revs[0]["revision"].as_u64(), revs[0]["reason"].as_str()), (Some(2), Some("incident 42")));
    let (_, _, diff) = app.call(Method::GET, &format!("{svc}/revisions/2/diff"), None).await;
    assert_eq!(
        diff["changes"],
        json!([{"path": "flags.recommendations.enabled.value", "op": "changed", "before": true, "after": false}])
    );
    let (s, _, b) = app
        .call(
            Method::POST,
            &format!("{svc}/rollback"),
            Some(json!({"to_revision": 1, "reason": "recovered"})),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{b}");
    assert_eq!(b["revision"].as_u64(), Some(3));
    let (_, _, r1) = app.call(Method::GET, &format!("{svc}/revisions/1"), None).await;
    let (_, _, r3) = app.call(Method::GET, &format!("{svc}/revisions/3"), None).await;
    assert_eq!(r1["config"], r3["config"]);
    assert_eq!(r1["hash"], r3["hash"], "same content, same hash");
    let (s, _, _) = app.call(Method::GET, &format!("{svc}/revisions/9"), None).await;
    assert_eq!(s, StatusCode::NOT_FOUND);
}
}

on_both_backends! {
async fn openapi_document_lists_the_api(app) {
    let res = app.client.get(app.url("/api/v1/openapi.json")).send().await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    let doc: serde_json::Value = res.json().await.unwrap();
    let paths = doc["paths"].as_object().unwrap();
    for p in [
        "/api/v1/auth/login",
        "/api/v1/environments/{env}/services/{svc}/policy",
        "/api/v1/environments/{env}/services/{svc}/flags/{key}",
        "/api/v1/environments/{env}/services/{svc}/rollback",
        "/api/v1/audit",
        "/api/v1/tokens",
    ] {
        assert!(paths.contains_key(p), "missing {p}");
    }
    assert!(doc["components"]["schemas"].get("Policy").is_some());
}
}

on_both_backends! {
async fn health_and_readiness(app) {
    assert_eq!(app.client.get(app.url("/healthz")).send().await.unwrap().status(), StatusCode::OK);
    assert_eq!(app.client.get(app.url("/readyz")).send().await.unwrap().status(), StatusCode::OK);
}
}

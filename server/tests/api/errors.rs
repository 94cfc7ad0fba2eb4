//! Bad input gets a clear 4xx problem+json, never a 5xx.

use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

use crate::helpers::{TestApp, assert_problem};

async fn raw(
    app: &TestApp,
    method: Method,
    path: &str,
    ct: Option<&str>,
    body: Vec<u8>,
) -> (StatusCode, reqwest::header::HeaderMap, Value) {
    let mut req = app.client.request(method, app.url(path)).bearer_auth(&app.token).body(body);
    if let Some(ct) = ct {
        req = req.header("content-type", ct);
    }
    let res = req.send().await.unwrap();
    let (s, h) = (res.status(), res.headers().clone());
    let text = res.text().await.unwrap();
    (s, h, serde_json::from_str(&text).unwrap_or(Value::String(text)))
}

on_both_backends! {
async fn malformed_json_names_the_position(app) {
    let (s, h, b) =
        raw(&app, Method::POST, "/api/v1/environments", Some("application/json"), b"{\"name\": ".to_vec())
            .await;
    assert_problem(s, &h, &b, StatusCode::BAD_REQUEST);
    assert!(b["detail"].as_str().unwrap().contains("line 1"), "{b}");
}
}

on_both_backends! {
async fn unknown_field_is_named(app) {
    app.seed().await;
    let (s, h, b) = app
        .call_as(
            &app.token,
            Method::PUT,
            "/api/v1/environments/prod/services/checkout/policy",
            Some(json!({"reason": "x", "policy": {"dependencies": {"p": {"retry": {"max_attempt": 2}}}}})),
            &[("if-match", "*")],
        )
        .await;
    assert_problem(s, &h, &b, StatusCode::BAD_REQUEST);
    assert_eq!(b["errors"][0]["path"], json!("policy.dependencies.p.retry.max_attempt"), "{b}");
}
}

on_both_backends! {
async fn out_of_range_values_list_every_field_with_the_allowed_range(app) {
    app.seed().await;
    let (s, h, b) = app
        .call_as(
            &app.token,
            Method::PUT,
            "/api/v1/environments/prod/services/checkout/policy",
            Some(json!({"reason": "x", "policy": {"dependencies": {"p": {
                "retry": {"max_attempts": 50},
                "circuit_breaker": {"failure_rate_threshold": 7},
                "bulkhead": {"max_concurrent": 0}}}}})),
            &[("if-match", "*")],
        )
        .await;
    assert_problem(s, &h, &b, StatusCode::UNPROCESSABLE_ENTITY);
    let paths: Vec<&str> =
        b["errors"].as_array().unwrap().iter().map(|e| e["path"].as_str().unwrap()).collect();
    assert_eq!(
        paths,
        vec![
            "policy.dependencies.p.retry.max_attempts",
            "policy.dependencies.p.circuit_breaker.failure_rate_threshold",
            "policy.dependencies.p.bulkhead.max_concurrent"
        ]
    );
    assert_eq!(b["errors"][0]["message"], json!("must be between 1 and 10"));
    assert_eq!(b["errors"][0]["value"], json!("50"));
}
}

on_both_backends! {
async fn oversize_body_is_413_problem(app) {
    let big = format!("{{\"name\":\"x\",\"reason\":\"{}\"}}", "a".repeat(200 * 1024));
    let (s, h, b) =
        raw(&app, Method::POST, "/api/v1/environments", Some("application/json"), big.into_bytes()).await;
    assert_problem(s, &h, &b, StatusCode::PAYLOAD_TOO_LARGE);
    assert!(b["detail"].as_str().unwrap().contains("65536"), "{b}");
}
}

on_both_backends! {
async fn wrong_content_type_is_415_and_wrong_method_is_405(app) {
    let (s, h, b) =
        raw(&app, Method::POST, "/api/v1/environments", Some("text/plain"), b"name=x".to_vec()).await;
    assert_problem(s, &h, &b, StatusCode::UNSUPPORTED_MEDIA_TYPE);
    let (s, h, b) = raw(&app, Method::DELETE, "/api/v1/environments", None, vec![]).await;
    assert_problem(s, &h, &b, StatusCode::METHOD_NOT_ALLOWED);
    let (s, h, b) = raw(&app, Method::GET, "/api/v1/nope", None, vec![]).await;
    assert_problem(s, &h, &b, StatusCode::NOT_FOUND);
}
}

on_both_backends! {
async fn missing_reason_and_missing_if_match_are_refused(app) {
    app.seed().await;
    let (s, h, b) = app
        .call(
            Method::PATCH,
            "/api/v1/environments/prod/services/checkout/flags/recommendations.enabled",
            Some(json!({"value": false, "reason": "  "})),
        )
        .await;
    assert_problem(s, &h, &b, StatusCode::BAD_REQUEST);
    assert_eq!(b["errors"][0]["path"], json!("reason"));
    let (s, h, b) = app
        .call(
            Method::PUT,
            "/api/v1/environments/prod/services/checkout/policy",
            Some(json!({"reason": "x", "policy": {}})),
        )
        .await;
    assert_problem(s, &h, &b, StatusCode::PRECONDITION_REQUIRED);
}
}

on_both_backends! {
/// A battery of hostile inputs: none may produce a 5xx.
async fn hostile_inputs_never_yield_5xx(app) {
    app.seed().await;
    let bodies: Vec<Vec<u8>> = vec![
        b"".to_vec(),
        b"null".to_vec(),
        b"[]".to_vec(),
        b"\"x\"".to_vec(),
        b"{\"policy\": null, \"reason\": \"x\"}".to_vec(),
        b"{\"policy\": {\"default_deadline\": \"-5s\"}, \"reason\": \"x\"}".to_vec(),
        b"{\"policy\": {\"default_deadline\": \"99999999999999999999s\"}, \"reason\": \"x\"}".to_vec(),
        b"{\"policy\": {\"dependencies\": {\"\\u0000\": {}}}, \"reason\": \"x\"}".to_vec(),
        b"{\"policy\": {\"dependencies\": {\"p\": {\"retry\": {\"max_attempts\": -1}}}}, \"reason\": \"x\"}".to_vec(),
        b"{\"policy\": {\"dependencies\": {\"p\": {\"retry\": {\"max_attempts\": 1e400}}}}, \"reason\": \"x\"}".to_vec(),
        b"{\"policy\": {\"inbound\": {\"shed_sheddable_percent\": \"NaN\"}}, \"reason\": \"x\"}".to_vec(),
        vec![0xff, 0xfe, 0x00, 0x01],
        b"{\"type\":\"bool\",\"value\":{\"a\":[[[[[[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]]]]]]},\"reason\":\"x\"}".to_vec(),
        format!("{{\"reason\":\"<script>alert(1)</script>\",\"policy\":{{\"degradation_matrix\":[{{\"feature\":\"{}\",\"dependencies\":[\"x\"],\"on_failure\":\"generic\"}}]}}}}", "é".repeat(300)).into_bytes(),
    ];
    let paths = [
        (Method::PUT, "/api/v1/environments/prod/services/checkout/policy"),
        (Method::PUT, "/api/v1/environments/prod/services/checkout/flags/k"),
        (Method::PATCH, "/api/v1/environments/prod/services/checkout/flags/recommendations.enabled"),
        (Method::POST, "/api/v1/environments/prod/services"),
        (Method::POST, "/api/v1/environments/prod/services/checkout/rollback"),
        (Method::PUT, "/api/v1/environments/prod/services/checkout/faults/f1"),
        (Method::PUT, "/api/v1/environments/prod/services/checkout/breaker-overrides/recommendations"),
        (Method::POST, "/api/v1/tokens"),
        (Method::POST, "/api/v1/users"),
    ];
    for (m, p) in &paths {
        for body in &bodies {
            let res = app
                .client
                .request(m.clone(), app.url(p))
                .bearer_auth(&app.token)
                .header("content-type", "application/json")
                .header("if-match", "*")
                .body(body.clone())
                .send()
                .await
                .unwrap();
            let status = res.status();
            let text = res.text().await.unwrap();
            assert!(
                status.is_client_error(),
                "{m} {p} with {:?} → {status}: {text}",
                String::from_utf8_lossy(body)
            );
        }
    }
    for p in [
        "/api/v1/environments/%00/services",
        "/api/v1/environments/prod/services/checkout/revisions/-1",
        "/api/v1/environments/prod/services/checkout/revisions/99999999999999999999999",
        "/api/v1/environments/prod/services/checkout/revisions?limit=0",
        "/api/v1/environments/prod/services/checkout/revisions/1/diff?against=abc",
        "/api/v1/audit?since=yesterday",
        "/api/v1/audit?limit=100000",
        "/api/v1/audit?unknown=1",
    ] {
        let (s, _, b) = app.call(Method::GET, p, None).await;
        assert!(s.is_client_error(), "GET {p} → {s}: {b}");
    }
}
}

/// A value of the wrong type names the allowed range, and the other fields of the body
/// that cannot be decoded are listed with it (each is skipped in turn).
#[tokio::test]
async fn a_wrong_type_names_the_range_and_the_other_bad_fields() {
    let app = TestApp::spawn().await;
    app.seed().await;
    let (s, h, b) = app
        .call_as(
            &app.token,
            Method::PUT,
            "/api/v1/environments/prod/services/checkout/policy",
            Some(json!({"reason": "x", "policy": {"dependencies": {"p": {
                "retry": {"max_attempts": -1}, "bulkhead": {"max_concurrent": 2.5}, "colour": "blue"}}}})),
            &[("if-match", "*")],
        )
        .await;
    assert_problem(s, &h, &b, StatusCode::BAD_REQUEST);
    let errors = b["errors"].as_array().unwrap();
    let paths: Vec<&str> = errors.iter().map(|e| e["path"].as_str().unwrap()).collect();
    assert_eq!(
        paths,
        // In the order of the body's keys (json! sorts them).
        [
            "policy.dependencies.p.bulkhead.max_concurrent",
            "policy.dependencies.p.colour",
            "policy.dependencies.p.retry.max_attempts"
        ],
        "{b}"
    );
    assert!(
        errors[0]["message"].as_str().unwrap().contains("expected a whole number; must be between 1 and"),
        "{b}"
    );
    assert_eq!(errors[0]["value"], json!("2.5"), "{b}");
    assert_eq!(errors[1]["value"], json!("\"blue\""), "{b}");
    assert!(
        errors[2]["message"].as_str().unwrap().contains("expected a whole number; must be between 1 and 10"),
        "{b}"
    );
    assert_eq!(errors[2]["value"], json!("-1"), "{b}");
    assert!(b["detail"].as_str().unwrap().ends_with("(and 2 more problems, listed in errors)"), "{b}");
}

//! OFREP on the server (docs/ofrep.md): single evaluation of a kill switch and its flip,
//! bulk evaluation with ETag / 304, every error code in problem+json, and the flags
//! token's scope, on both backends. The OpenFeature providers of three languages read it
//! in `tests/e2e/ofrep.rs`.

use reqwest::header::HeaderMap;
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

use crate::helpers::{TestApp, assert_problem};

const SWITCH: &str = "recommendations.enabled";
const SINGLE: &str = "/api/v1/ofrep/v1/evaluate/flags";

impl TestApp {
    /// Mints a flags token for environment `prod` and `services`; returns (token, id).
    pub async fn flags_token(&self, services: &[&str]) -> (String, String) {
        let (s, _, b) = self
            .call(
                Method::POST,
                "/api/v1/tokens",
                Some(json!({"kind": "flags", "name": "ofrep", "environment": "prod", "services": services, "reason": "test"})),
            )
            .await;
        assert_eq!(s, StatusCode::CREATED, "{b}");
        (b["token"].as_str().unwrap().to_string(), b["id"].as_str().unwrap().to_string())
    }

    /// Rotates token `id` with `overlap`.
    async fn rotate_token(&self, id: &str, overlap: &str) -> (StatusCode, HeaderMap, Value) {
        self.call(
            Method::POST,
            &format!("/api/v1/tokens/{id}/rotate"),
            Some(json!({"overlap": overlap, "reason": "rotation drill"})),
        )
        .await
    }

    async fn flip(&self, on: bool) {
        let (s, _, b) = self
            .call(
                Method::PATCH,
                &format!("/api/v1/environments/prod/services/checkout/flags/{SWITCH}"),
                Some(json!({"value": on, "reason": "test flip"})),
            )
            .await;
        assert_eq!(s, StatusCode::OK, "{b}");
    }

    /// POSTs raw `body` to an OFREP path with `token`.
    async fn ofrep(
        &self,
        token: &str,
        path: &str,
        body: &str,
        headers: &[(&str, &str)],
    ) -> (StatusCode, reqwest::header::HeaderMap, Value) {
        let mut req = self.client.post(self.url(path)).bearer_auth(token).body(body.to_string());
        req = req.header("content-type", "application/json");
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        let res = req.send().await.unwrap();
        let (status, headers) = (res.status(), res.headers().clone());
        let text = res.text().await.unwrap();
        (status, headers, serde_json::from_str(&text).unwrap_or(Value::String(text)))
    }
}

fn assert_ofrep_error(
    status: StatusCode,
    headers: &HeaderMap,
    body: &Value,
    expected: StatusCode,
    code: &str,
) {
    assert_problem(status, headers, body, expected);
    assert_eq!(body["errorCode"], code, "{body}");
    assert!(body["errorDetails"].as_str().is_some_and(|d| !d.is_empty()), "{body}");
}

on_both_backends! {
    /// A single evaluation reads the kill switch as stored and sees a flip at once.
    async fn ofrep_single_evaluation_reads_a_kill_switch(app) {
        app.seed().await;
        let (token, _) = app.flags_token(&["checkout"]).await;
        let one = format!("{SINGLE}/{SWITCH}");
        let (s, h, b) = app.ofrep(&token, &one, r#"{"context":{"targetingKey":"user-1"}}"#, &[]).await;
        assert_eq!(s, StatusCode::OK, "{b}");
        assert_eq!(h["content-type"], "application/json");
        assert_eq!(b, json!({"key": SWITCH, "value": true, "reason": "STATIC", "variant": "value", "metadata": {"type": "bool"}}));
        app.flip(false).await;
        let (s, _, b) = app.ofrep(&token, &one, "{}", &[]).await;
        assert_eq!((s, &b["value"]), (StatusCode::OK, &json!(false)), "{b}");
    }
}

on_both_backends! {
    /// Bulk evaluation with ETag: 304 while the answer is the same, a new tag after a flip.
    async fn ofrep_bulk_evaluation_has_an_etag(app) {
        app.seed().await;
        let (token, _) = app.flags_token(&["checkout"]).await;
        let body = r#"{"context":{"targetingKey":"user-1"}}"#;
        let (s, h, b) = app.ofrep(&token, SINGLE, body, &[]).await;
        assert_eq!(s, StatusCode::OK, "{b}");
        assert_eq!(b["flags"], json!([{"key": SWITCH, "value": true, "reason": "STATIC", "variant": "value", "metadata": {"type": "bool"}}]));
        assert_eq!(b["metadata"]["service"], "checkout");
        let tag = h["etag"].to_str().unwrap().to_string();
        let (s, h, _) = app.ofrep(&token, SINGLE, body, &[("if-none-match", &tag)]).await;
        assert_eq!(s, StatusCode::NOT_MODIFIED);
        assert_eq!(h["etag"].to_str().unwrap(), tag);
        app.flip(false).await;
        let (s, h, b) = app.ofrep(&token, SINGLE, body, &[("if-none-match", &tag)]).await;
        assert_eq!(s, StatusCode::OK, "{b}");
        assert_ne!(h["etag"].to_str().unwrap(), tag);
        assert_eq!(b["flags"][0]["value"], false);
    }
}

/// Every OFREP error code Levee answers, as problem+json with the protocol's members.
#[tokio::test]
async fn ofrep_error_codes() {
    let app = TestApp::spawn().await;
    app.seed().await;
    let (token, _) = app.flags_token(&["checkout"]).await;
    let one = format!("{SINGLE}/{SWITCH}");

    let (s, h, b) = app.ofrep(&token, &format!("{SINGLE}/nope"), "{}", &[]).await;
    assert_ofrep_error(s, &h, &b, StatusCode::NOT_FOUND, "FLAG_NOT_FOUND");
    assert_eq!(b["key"], "nope");
    let (s, h, b) = app.ofrep(&token, &one, "not json", &[]).await;
    assert_ofrep_error(s, &h, &b, StatusCode::BAD_REQUEST, "PARSE_ERROR");
    assert_eq!(b["key"], SWITCH);
    let (s, h, b) = app.ofrep(&token, &one, r#"{"context":[1]}"#, &[]).await;
    assert_ofrep_error(s, &h, &b, StatusCode::BAD_REQUEST, "INVALID_CONTEXT");
    let (s, h, b) = app.ofrep(&token, SINGLE, r#"{"context":{"targetingKey":7}}"#, &[]).await;
    assert_ofrep_error(s, &h, &b, StatusCode::BAD_REQUEST, "INVALID_CONTEXT");
    assert!(b["errorDetails"].as_str().unwrap().contains("targetingKey"), "{b}");

    // A rollout needs a targeting key; with one, the key decides.
    let (s, _, b) = app
        .call(
            Method::PUT,
            "/api/v1/environments/prod/services/checkout/flags/gradual",
            Some(json!({"type": "bool", "value": true, "rollout": {"percent": 50}, "reason": "test"})),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{b}");
    let gradual = format!("{SINGLE}/gradual");
    let (s, h, b) = app.ofrep(&token, &gradual, r#"{"context":{}}"#, &[]).await;
    assert_ofrep_error(s, &h, &b, StatusCode::BAD_REQUEST, "TARGETING_KEY_MISSING");
    let mut reasons = std::collections::BTreeSet::new();
    for i in 0..40 {
        let body = format!(r#"{{"context":{{"targetingKey":"user-{i}"}}}}"#);
        let (s, _, b) = app.ofrep(&token, &gradual, &body, &[]).await;
        assert_eq!(s, StatusCode::OK, "{b}");
        match b["reason"].as_str().unwrap() {
            "SPLIT" => assert_eq!(b["value"], true),
            "DEFAULT" => assert!(b.get("value").is_none(), "{b}"),
            other => panic!("{other}: {b}"),
        }
        reasons.insert(b["reason"].as_str().unwrap().to_string());
    }
    assert_eq!(reasons.len(), 2, "40 keys fall on both sides of a 50 % rollout");
    // In a bulk answer, the failure is the flag's own; the others still answer.
    let (s, _, b) = app.ofrep(&token, SINGLE, "{}", &[]).await;
    assert_eq!(s, StatusCode::OK, "{b}");
    assert_eq!(b["flags"][0]["errorCode"], "TARGETING_KEY_MISSING", "{b}");
    assert_eq!(b["flags"][1]["value"], true, "{b}");
}

/// A flags token reads flags of its services and nothing else; no other token reads
/// flags over OFREP.
#[tokio::test]
async fn ofrep_flags_tokens_are_scoped_and_read_only() {
    let app = TestApp::spawn().await;
    app.seed().await;
    let (s, _, b) = app
        .call(
            Method::POST,
            "/api/v1/environments/prod/services",
            Some(json!({"name": "search", "reason": "test", "policy": {}, "flags": {"fast": {"type": "bool", "value": true}}})),
        )
        .await;
    assert_eq!(s, StatusCode::CREATED, "{b}");
    let one = format!("{SINGLE}/{SWITCH}");
    let (flags, flags_id) = app.flags_token(&["checkout"]).await;
    let (agent, _) = app.agent_token(&["checkout"]).await;

    // Not an admin session, not an agent token; a flags token calls nothing else.
    for other in [&app.token, &agent] {
        let (s, h, b) = app.ofrep(other, &one, "{}", &[]).await;
        assert_problem(s, &h, &b, StatusCode::UNAUTHORIZED);
    }
    let (s, h, b) = app.ofrep("", &one, "{}", &[]).await;
    assert_problem(s, &h, &b, StatusCode::UNAUTHORIZED);
    let (s, h, b) = app.call_as(&flags, Method::GET, "/api/v1/environments", None, &[]).await;
    assert_problem(s, &h, &b, StatusCode::UNAUTHORIZED);
    let (s, h, b) = app.call_as(&flags, Method::GET, "/api/v1/sync/prod/checkout", None, &[]).await;
    assert_problem(s, &h, &b, StatusCode::UNAUTHORIZED);

    // X-API-Key is the other way providers send a token.
    let res = app.client.post(app.url(&one)).header("x-api-key", &flags).body("{}").send().await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);

    let (s, h, b) = app.ofrep(&flags, &one, r#"{"context":{"service":"search"}}"#, &[]).await;
    assert_problem(s, &h, &b, StatusCode::FORBIDDEN);
    let (both, _) = app.flags_token(&["checkout", "search"]).await;
    let (s, h, b) = app.ofrep(&both, &one, "{}", &[]).await;
    assert_ofrep_error(s, &h, &b, StatusCode::BAD_REQUEST, "INVALID_CONTEXT");
    assert!(b["errorDetails"].as_str().unwrap().contains("context.service"), "{b}");
    let (s, _, b) =
        app.ofrep(&both, &format!("{SINGLE}/fast"), r#"{"context":{"service":"search"}}"#, &[]).await;
    assert_eq!((s, &b["value"]), (StatusCode::OK, &json!(true)), "{b}");

    // A flags token has no role (a rule between kind and role: 422, naming the field), and a
    // revoked one reads nothing.
    let (s, _, b) = app
        .call(
            Method::POST,
            "/api/v1/tokens",
            Some(json!({"kind": "flags", "name": "x", "role": "admin", "environment": "prod", "services": ["checkout"], "reason": "t"})),
        )
        .await;
    assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{b}");
    assert_eq!(b["errors"][0]["path"], "role", "{b}");
    let (s, _, b) = app.call(Method::DELETE, &format!("/api/v1/tokens/{flags_id}?reason=done"), None).await;
    assert_eq!(s, StatusCode::NO_CONTENT, "{b}");
    let (s, h, b) = app.ofrep(&flags, &one, "{}", &[]).await;
    assert_problem(s, &h, &b, StatusCode::UNAUTHORIZED);
}

on_both_backends! {
    /// A flags token rotates as an agent token does: the new one, of the same kind and
    /// scope, reads at once; the old one keeps reading during the overlap and is refused
    /// from its end (TokenRow::revoked, the rule of every door), whether the overlap is
    /// cut short by a revocation or is `0s`.
    async fn ofrep_flags_tokens_rotate_with_an_overlap(app) {
        app.seed().await;
        let one = format!("{SINGLE}/{SWITCH}");
        let (first, first_id) = app.flags_token(&["checkout"]).await;
        let (s, _, b) = app.rotate_token(&first_id, "1h").await;
        assert_eq!(s, StatusCode::CREATED, "{b}");
        assert_eq!((b["kind"].as_str(), b["name"].as_str()), (Some("flags"), Some("ofrep")), "{b}");
        assert_eq!((&b["environment"], &b["services"]), (&json!("prod"), &json!(["checkout"])), "{b}");
        assert_eq!(b["replaced"]["id"], first_id.as_str(), "{b}");
        assert!(b["replaced"]["revoked_at"].is_string(), "the end of the overlap: {b}");
        let (second, second_id) = (b["token"].as_str().unwrap().to_string(), b["id"].as_str().unwrap().to_string());
        for token in [&first, &second] {
            let (s, _, b) = app.ofrep(token, &one, "{}", &[]).await;
            assert_eq!(s, StatusCode::OK, "both tokens read during the overlap: {b}");
        }
        // Still a flags token: the sync stream's HTTP fallback refuses it.
        let (s, h, b) = app.call_as(&second, Method::GET, "/api/v1/sync/prod/checkout", None, &[]).await;
        assert_problem(s, &h, &b, StatusCode::UNAUTHORIZED);

        // Revoking the old token ends its overlap now.
        let (s, _, b) = app.call(Method::DELETE, &format!("/api/v1/tokens/{first_id}?reason=moved"), None).await;
        assert_eq!(s, StatusCode::NO_CONTENT, "{b}");
        let (s, h, b) = app.ofrep(&first, &one, "{}", &[]).await;
        assert_problem(s, &h, &b, StatusCode::UNAUTHORIZED);
        let (s, _, b) = app.ofrep(&second, &one, "{}", &[]).await;
        assert_eq!(s, StatusCode::OK, "{b}");

        // An overlap of 0s ends the old token at once; an overlap past 30 days is a range
        // the document states in words (422, naming the field); an ended token is not
        // rotated (409).
        let (s, _, b) = app.rotate_token(&second_id, "31d").await;
        assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{b}");
        assert_eq!(b["errors"][0]["path"], "overlap", "{b}");
        let (s, _, b) = app.rotate_token(&second_id, "0s").await;
        assert_eq!(s, StatusCode::CREATED, "{b}");
        let third = b["token"].as_str().unwrap().to_string();
        let (s, h, b) = app.ofrep(&second, &one, "{}", &[]).await;
        assert_problem(s, &h, &b, StatusCode::UNAUTHORIZED);
        let (s, _, b) = app.ofrep(&third, &one, "{}", &[]).await;
        assert_eq!(s, StatusCode::OK, "{b}");
        let (s, h, b) = app.rotate_token(&second_id, "1h").await;
        assert_problem(s, &h, &b, StatusCode::CONFLICT);
        assert_eq!(b["type"], "urn:levee:problem:token-ended", "{b}");
    }
}

use levee_server::auth::{AUDIENCE_API, Claims, Door, ISSUER, Keys};
use levee_server::db::Role;
use reqwest::{Method, StatusCode};
use serde_json::json;

use crate::helpers::{JWT_SECRET, TestApp, assert_problem};

fn sign(claims: &Claims) -> String {
    Keys::new(JWT_SECRET.as_bytes()).unwrap().sign(claims).unwrap()
}

fn claims(exp: u64, aud: &str) -> Claims {
    Claims {
        sub: "admin".into(),
        iss: ISSUER.into(),
        aud: aud.into(),
        exp,
        iat: 1,
        jti: "t".into(),
        kind: "session".into(),
        role: Some(Role::Admin),
        env: None,
        services: vec![],
        epoch: None,
    }
}

#[tokio::test]
async fn wrong_password_is_401_and_repeated_failures_are_429() {
    let app = TestApp::spawn().await;
    for _ in 0..10 {
        let res = app
            .client
            .post(app.url("/api/v1/auth/login"))
            .json(&json!({"username": "admin", "password": "nope"}))
            .send()
            .await
            .unwrap();
        assert_eq!(res.status(), StatusCode::UNAUTHORIZED);
    }
    let res = app
        .client
        .post(app.url("/api/v1/auth/login"))
        .json(&json!({"username": "admin", "password": "nope"}))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
}

#[tokio::test]
async fn missing_expired_tampered_alg_confused_and_wrong_audience_tokens_are_refused() {
    let app = TestApp::spawn().await;
    // Missing.
    let res = app.client.get(app.url("/api/v1/environments")).send().await.unwrap();
    let (s, h) = (res.status(), res.headers().clone());
    assert_problem(s, &h, &res.json().await.unwrap(), StatusCode::UNAUTHORIZED);

    let expired = sign(&claims(1000, AUDIENCE_API));
    let wrong_aud = sign(&claims(u64::MAX / 2, "levee-agent"));
    let mut tampered = app.token.clone();
    tampered.pop();
    tampered.push(if app.token.ends_with('A') { 'B' } else { 'A' });
    // alg=none with the admin payload and no signature.
    let payload = app.token.split('.').nth(1).unwrap();
    let none = format!("eyJhbGciOiJub25lIiwidHlwIjoiSldUIn0.{payload}.");
    // HS512 with the same secret: the algorithm is pinned to HS256.
    let hs512 = {
        let key = jsonwebtoken::EncodingKey::from_secret(JWT_SECRET.as_bytes()).unwrap();
        jsonwebtoken::encode(
            &jsonwebtoken::Header::new(jsonwebtoken::Algorithm::HS512),
            &claims(u64::MAX / 2, AUDIENCE_API),
            &key,
        )
        .unwrap()
    };
    for (name, tok) in [
        ("expired", expired),
        ("wrong audience", wrong_aud),
        ("tampered", tampered),
        ("alg none", none),
        ("HS512", hs512),
    ] {
        let (s, h, b) = app.call_as(&tok, Method::GET, "/api/v1/environments", None, &[]).await;
        assert_problem(s, &h, &b, StatusCode::UNAUTHORIZED);
        assert!(h.get("www-authenticate").is_some(), "{name}: no WWW-Authenticate");
    }
}

#[tokio::test]
async fn viewer_cannot_flip_a_switch_and_revoked_api_token_stops_working() {
    let app = TestApp::spawn().await;
    app.seed().await;
    let (s, _, b) = app
        .call(
            Method::POST,
            "/api/v1/tokens",
            Some(json!({"kind": "api", "name": "ro", "role": "viewer", "reason": "t"})),
        )
        .await;
    assert_eq!(s, StatusCode::CREATED, "{b}");
    let viewer = b["token"].as_str().unwrap().to_string();
    let id = b["id"].as_str().unwrap().to_string();
    let (s, h, b) = app
        .call_as(
            &viewer,
            Method::PATCH,
            "/api/v1/environments/prod/services/checkout/flags/recommendations.enabled",
            Some(json!({"value": false, "reason": "try"})),
            &[],
        )
        .await;
    assert_problem(s, &h, &b, StatusCode::FORBIDDEN);
    // The flag did not change.
    let (_, _, f) = app
        .call(Method::GET, "/api/v1/environments/prod/services/checkout/flags/recommendations.enabled", None)
        .await;
    assert_eq!(f["value"], json!(true));
    // Viewer can read.
    let (s, _, _) = app.call_as(&viewer, Method::GET, "/api/v1/environments", None, &[]).await;
    assert_eq!(s, StatusCode::OK);
    let (s, _, _) = app.call(Method::DELETE, &format!("/api/v1/tokens/{id}?reason=leaked"), None).await;
    assert_eq!(s, StatusCode::NO_CONTENT);
    let (s, h, b) = app.call_as(&viewer, Method::GET, "/api/v1/environments", None, &[]).await;
    assert_problem(s, &h, &b, StatusCode::UNAUTHORIZED);
}

#[tokio::test]
async fn agent_tokens_cannot_call_the_api() {
    let app = TestApp::spawn().await;
    app.seed().await;
    let (agent, _) = app.agent_token(&["checkout"]).await;
    let (s, h, b) = app.call_as(&agent, Method::GET, "/api/v1/environments", None, &[]).await;
    assert_problem(s, &h, &b, StatusCode::UNAUTHORIZED);
}

/// The UI session cookie may read the API from the browser, but never change anything
/// through it: a change needs a bearer token, so a forged cross-site request carries no
/// authority even if a browser sent the cookie along.
#[tokio::test]
async fn session_cookie_reads_the_api_but_cannot_change_it() {
    let app = TestApp::spawn().await;
    let (ui_session, _) =
        Keys::new(JWT_SECRET.as_bytes()).unwrap().session("admin", Role::Admin, 0, Door::Ui).unwrap();
    let cookie = format!("levee_session={ui_session}");
    let read =
        app.client.get(app.url("/api/v1/environments")).header("cookie", &cookie).send().await.unwrap();
    assert_eq!(read.status(), StatusCode::OK);
    let res = app
        .client
        .post(app.url("/api/v1/environments"))
        .header("cookie", &cookie)
        .json(&json!({"name": "forged", "reason": "csrf"}))
        .send()
        .await
        .unwrap();
    let (s, h) = (res.status(), res.headers().clone());
    let b: serde_json::Value = res.json().await.unwrap();
    assert_problem(s, &h, &b, StatusCode::UNAUTHORIZED);
    assert!(b["detail"].as_str().unwrap().contains("Bearer"), "{b}");
    let (_, _, envs) = app.call(Method::GET, "/api/v1/environments", None).await;
    assert!(envs.as_array().unwrap().iter().all(|e| e["name"] != "forged"), "nothing was created: {envs}");
}

/// `POST /auth/logout` ends a session token at once; an API token is told how it is
/// revoked instead.
#[tokio::test]
async fn logout_ends_the_session_token_and_api_tokens_are_revoked_elsewhere() {
    let app = TestApp::spawn().await;
    let session = app.login("admin", crate::helpers::ADMIN_PASSWORD).await;
    let (s, _, _) = app.call_as(&session, Method::GET, "/api/v1/environments", None, &[]).await;
    assert_eq!(s, StatusCode::OK);
    let (s, _, _) = app.call_as(&session, Method::POST, "/api/v1/auth/logout", None, &[]).await;
    assert_eq!(s, StatusCode::NO_CONTENT);
    let (s, h, b) = app.call_as(&session, Method::GET, "/api/v1/environments", None, &[]).await;
    assert_problem(s, &h, &b, StatusCode::UNAUTHORIZED);
    assert!(b["detail"].as_str().unwrap().contains("revoked"), "{b}");
    // Other sessions of the same user are not affected.
    let (s, _, _) = app.call(Method::GET, "/api/v1/environments", None).await;
    assert_eq!(s, StatusCode::OK);

    let (_, _, t) = app
        .call(
            Method::POST,
            "/api/v1/tokens",
            Some(json!({"kind": "api", "name": "bot", "role": "viewer", "reason": "test"})),
        )
        .await;
    let api_token = t["token"].as_str().expect("api token").to_string();
    let (s, h, b) = app.call_as(&api_token, Method::POST, "/api/v1/auth/logout", None, &[]).await;
    assert_problem(s, &h, &b, StatusCode::BAD_REQUEST);
    assert!(b["detail"].as_str().unwrap().contains("DELETE /api/v1/tokens"), "{b}");
}

use levee_server::auth::{AUDIENCE_API, Claims, Door, ISSUER, Keys};
use levee_server::db::Role;
use reqwest::{Method, StatusCode};
use serde_json::json;

use levee_server::auth::{LOGIN_ADDRESS_FREE_FAILURES, LOGIN_FREE_FAILURES, LOGIN_MAX_DELAY};

use crate::helpers::{ADMIN_PASSWORD, JWT_SECRET, TestApp, assert_problem};

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

/// A client whose connections come from `addr` (any 127.x.y.z is this machine's loopback).
fn client_from(addr: &str) -> reqwest::Client {
    reqwest::Client::builder().local_address(addr.parse::<std::net::IpAddr>().unwrap()).build().unwrap()
}

async fn try_login(c: &reqwest::Client, app: &TestApp, user: &str, password: &str) -> reqwest::Response {
    c.post(app.url("/api/v1/auth/login"))
        .json(&json!({"username": user, "password": password}))
        .send()
        .await
        .unwrap()
}

#[tokio::test]
async fn wrong_password_is_401_and_repeated_failures_are_429() {
    let app = TestApp::spawn().await;
    for _ in 0..LOGIN_FREE_FAILURES {
        assert_eq!(try_login(&app.client, &app, "admin", "nope").await.status(), StatusCode::UNAUTHORIZED);
    }
    // Past the free failures every failure starts a wait (1 s, 2 s, … at most 30 s):
    // an attempt during it is 429 with the wait in Retry-After.
    let mut throttled = None;
    for _ in 0..20 {
        let res = try_login(&app.client, &app, "admin", "nope").await;
        if res.status() == StatusCode::TOO_MANY_REQUESTS {
            throttled = Some(res);
            break;
        }
        assert_eq!(res.status(), StatusCode::UNAUTHORIZED);
    }
    let res = throttled.expect("a 429 once failures pile up");
    let retry: u64 = res.headers()["retry-after"].to_str().unwrap().parse().unwrap();
    assert!((1..=LOGIN_MAX_DELAY.as_secs()).contains(&retry), "Retry-After {retry}");
    let (s, h) = (res.status(), res.headers().clone());
    let body: serde_json::Value = res.json().await.unwrap();
    assert_problem(s, &h, &body, StatusCode::TOO_MANY_REQUESTS);
    assert!(body["detail"].as_str().unwrap().contains("try again in"), "{body}");
}

/// SEC-1: wrong passwords for `admin` from one address slow down that address only; the
/// owner logs in from another address with the right password at once, during the
/// attack. Spraying one password over many usernames from one address is throttled too.
/// Logins, failures, throttling and refused (403) actions are in the audit log with the
/// client address.
#[tokio::test]
async fn sec_1_wrong_passwords_from_anyone_never_lock_the_owner_out() {
    let app = TestApp::spawn().await;
    let attacker = client_from("127.0.0.2");
    let owner = client_from("127.0.0.3");
    let sprayer = client_from("127.0.0.4");

    let mut statuses = Vec::new();
    for _ in 0..40 {
        let s = try_login(&attacker, &app, "admin", "guess").await.status();
        statuses.push(s);
        if s == StatusCode::TOO_MANY_REQUESTS {
            break;
        }
    }
    assert_eq!(statuses.last(), Some(&StatusCode::TOO_MANY_REQUESTS), "the attacker is slowed: {statuses:?}");
    // Even the right password waits on the attacker's address (no oracle while throttled)…
    assert_eq!(
        try_login(&attacker, &app, "admin", ADMIN_PASSWORD).await.status(),
        StatusCode::TOO_MANY_REQUESTS
    );
    // …but the owner, elsewhere, is in at once.
    let res = try_login(&owner, &app, "admin", ADMIN_PASSWORD).await;
    assert_eq!(res.status(), StatusCode::OK, "the owner must not be locked out");

    // Spraying: one guess per username from one address.
    let mut sprayed = Vec::new();
    for i in 0..60 {
        let s = try_login(&sprayer, &app, &format!("user{i}"), "Winter2026!").await.status();
        sprayed.push(s);
        if s == StatusCode::TOO_MANY_REQUESTS {
            break;
        }
    }
    assert_eq!(sprayed.last(), Some(&StatusCode::TOO_MANY_REQUESTS), "spraying is limited: {sprayed:?}");
    assert!(
        sprayed.len() > LOGIN_ADDRESS_FREE_FAILURES as usize,
        "not before the free failures: {sprayed:?}"
    );
    assert_eq!(try_login(&owner, &app, "admin", ADMIN_PASSWORD).await.status(), StatusCode::OK);

    // A viewer refused a change: 403, audited.
    let (s, _, b) = app
        .call(
            Method::POST,
            "/api/v1/users",
            Some(json!({"username": "vic", "password": "a-long-enough-password", "role": "viewer", "reason": "test"})),
        )
        .await;
    assert_eq!(s, StatusCode::CREATED, "{b}");
    let viewer = app.login("vic", "a-long-enough-password").await;
    let (s, _, _) = app
        .call_as(
            &viewer,
            Method::POST,
            "/api/v1/environments",
            Some(json!({"name": "x", "reason": "try"})),
            &[],
        )
        .await;
    assert_eq!(s, StatusCode::FORBIDDEN);

    let audit = |actor: &'static str| {
        let app = &app;
        async move {
            let (s, _, b) = app.call(Method::GET, &format!("/api/v1/audit?actor={actor}"), None).await;
            assert_eq!(s, StatusCode::OK, "{b}");
            b.as_array().unwrap().clone()
        }
    };
    let rows = audit("admin").await;
    let has = |rows: &[serde_json::Value], action: &str, client: &str| {
        rows.iter().any(|r| {
            r["action"] == action
                && r["detail"].as_str().is_some_and(|d| {
                    d == format!("from {client}")
                        || d.starts_with(&format!("from {client}: further logins wait "))
                })
                && r["before"].is_null()
                && r["after"].is_null()
        })
    };
    assert!(has(&rows, "auth.login_failed", "127.0.0.2"), "{rows:#?}");
    assert!(has(&rows, "auth.login_throttled", "127.0.0.2"), "{rows:#?}");
    assert!(has(&rows, "auth.login", "127.0.0.3"), "{rows:#?}");
    assert!(rows.iter().all(|r| r["via"] == "api"));
    let sprayed_rows = audit("user0").await;
    assert!(has(&sprayed_rows, "auth.login_failed", "127.0.0.4"), "{sprayed_rows:#?}");
    // The refusal is written off the request path: wait for it (bounded).
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let rows = audit("vic").await;
        if let Some(r) = rows.iter().find(|r| r["action"] == "access.refused") {
            assert_eq!(r["outcome"], "forbidden");
            assert_eq!(r["target"], "POST /api/v1/environments");
            assert_eq!(r["detail"], "environment.create needs role admin; the actor has role viewer");
            assert_eq!((&r["before"], &r["after"]), (&json!(null), &json!(null)), "{r}");
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "no access.refused row: {rows:#?}");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
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
    assert_problem(s, &h, &b, StatusCode::FORBIDDEN);
    assert!(b["detail"].as_str().unwrap().contains("DELETE /api/v1/tokens"), "{b}");
}

on_both_backends! {
    /// A JWT secret the operator gives is never written to the database (a copy of the
    /// database, a backup included, holds no key that signs tokens); only a server started
    /// without one generates and stores its own.
    async fn a_given_jwt_secret_is_not_stored(app) {
        let row = sqlx::query("SELECT value FROM settings WHERE key = 'jwt_secret'")
            .fetch_optional(app.store().pool())
            .await
            .unwrap();
        assert!(row.is_none(), "the operator's JWT secret was written to the database");
    }
}

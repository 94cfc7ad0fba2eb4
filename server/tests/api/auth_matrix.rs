//! The auth test matrix (targets.md, "Reliability and security"): one test per way in,
//! each refused with the status a client can act on. The CSRF-less form post and the XSS
//! payloads are UI tests (`tests/ui/security.rs`); the agent token syncing another service
//! is here, over real gRPC.

use levee_agent::proto::levee_sync_client::LeveeSyncClient;
use levee_agent::proto::{AgentMessage, Hello, ServiceState, agent_message};
use levee_server::auth::{AUDIENCE_API, AUDIENCE_UI, Claims, Door, ISSUER, Keys};
use levee_server::db::Role;
use reqwest::{Method, StatusCode};
use serde_json::json;
use tokio_stream::wrappers::ReceiverStream;
use tonic::Code;
use tonic::metadata::MetadataValue;

use crate::helpers::{ADMIN_PASSWORD, Db, JWT_SECRET, TestApp, assert_problem};

const ENVS: &str = "/api/v1/environments";
const FLAG: &str = "/api/v1/environments/prod/services/checkout/flags/recommendations.enabled";

fn keys() -> Keys {
    Keys::new(JWT_SECRET.as_bytes()).unwrap()
}

fn admin_claims() -> Claims {
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs();
    Claims {
        sub: "admin".into(),
        iss: ISSUER.into(),
        aud: AUDIENCE_API.into(),
        exp: now + 3600,
        iat: now,
        jti: "matrix".into(),
        kind: "session".into(),
        role: Some(Role::Admin),
        env: None,
        services: vec![],
        epoch: Some(0),
    }
}

/// 401 problem+json with a `WWW-Authenticate` challenge, for a read with `token`.
async fn assert_refused(app: &TestApp, token: &str) -> serde_json::Value {
    let (s, h, b) = app.call_as(token, Method::GET, ENVS, None, &[]).await;
    assert_problem(s, &h, &b, StatusCode::UNAUTHORIZED);
    assert!(h.get("www-authenticate").is_some(), "no WWW-Authenticate: {b}");
    b
}

#[tokio::test]
async fn auth_no_token_is_401() {
    let app = TestApp::spawn().await;
    let res = app.client.get(app.url(ENVS)).send().await.unwrap();
    let (s, h) = (res.status(), res.headers().clone());
    let b = res.json().await.unwrap();
    assert_problem(s, &h, &b, StatusCode::UNAUTHORIZED);
    assert!(b["detail"].as_str().unwrap().contains("missing bearer token"), "{b}");
}

#[tokio::test]
async fn auth_expired_token_is_401() {
    let app = TestApp::spawn().await;
    // Past the documented leeway (EXPIRY_LEEWAY, 5 s).
    let mut c = admin_claims();
    c.exp = c.iat - 60;
    let b = assert_refused(&app, &keys().sign(&c).unwrap()).await;
    assert!(b["detail"].as_str().unwrap().contains("expired"), "{b}");
}

#[tokio::test]
async fn auth_tampered_signature_is_401() {
    let app = TestApp::spawn().await;
    let good = keys().sign(&admin_claims()).unwrap();
    let (s, _, _) = app.call_as(&good, Method::GET, ENVS, None, &[]).await;
    assert_eq!(s, StatusCode::OK, "the untampered token works");
    let mut sig: Vec<u8> = good.rsplit('.').next().unwrap().bytes().collect();
    sig[3] = if sig[3] == b'A' { b'B' } else { b'A' };
    let head = &good[..good.rfind('.').unwrap()];
    assert_refused(&app, &format!("{head}.{}", String::from_utf8(sig).unwrap())).await;
}

#[tokio::test]
async fn auth_alg_none_is_401() {
    let app = TestApp::spawn().await;
    let good = keys().sign(&admin_claims()).unwrap();
    let payload = good.split('.').nth(1).unwrap();
    // {"alg":"none","typ":"JWT"}, the admin payload, no signature.
    assert_refused(&app, &format!("eyJhbGciOiJub25lIiwidHlwIjoiSldUIn0.{payload}.")).await;
}

#[tokio::test]
async fn auth_wrong_secret_is_401() {
    let app = TestApp::spawn().await;
    let other = Keys::new(b"another-secret-another-secret-another-secret").unwrap();
    assert_refused(&app, &other.sign(&admin_claims()).unwrap()).await;
}

#[tokio::test]
async fn auth_wrong_audience_is_401() {
    let app = TestApp::spawn().await;
    let mut c = admin_claims();
    c.aud = "levee-agent".into();
    assert_refused(&app, &keys().sign(&c).unwrap()).await;
}

#[tokio::test]
async fn auth_wrong_issuer_is_401() {
    let app = TestApp::spawn().await;
    let mut c = admin_claims();
    c.iss = "someone-else".into();
    assert_refused(&app, &keys().sign(&c).unwrap()).await;
}

#[tokio::test]
async fn auth_viewer_mutating_is_403() {
    let app = TestApp::spawn().await;
    app.seed().await;
    let (s, _, b) = app
        .call(
            Method::POST,
            "/api/v1/users",
            Some(
                json!({"username": "vera", "password": "viewer-password-1", "role": "viewer", "reason": "t"}),
            ),
        )
        .await;
    assert_eq!(s, StatusCode::CREATED, "{b}");
    let vera = app.login("vera", "viewer-password-1").await;
    let (s, h, b) =
        app.call_as(&vera, Method::PATCH, FLAG, Some(json!({"value": false, "reason": "try"})), &[]).await;
    assert_problem(s, &h, &b, StatusCode::FORBIDDEN);
    assert!(b["detail"].as_str().unwrap().contains("needs the operator role"), "{b}");
    let (_, _, flag) = app.call(Method::GET, FLAG, None).await;
    assert_eq!(flag["value"], true, "unchanged");
}

#[tokio::test]
async fn auth_operator_managing_users_is_403() {
    let app = TestApp::spawn().await;
    let (s, _, b) = app
        .call(
            Method::POST,
            "/api/v1/users",
            Some(json!({"username": "olivia", "password": "operator-password", "role": "operator", "reason": "t"})),
        )
        .await;
    assert_eq!(s, StatusCode::CREATED, "{b}");
    let olivia = app.login("olivia", "operator-password").await;
    let attempts = [
        (
            Method::POST,
            "/api/v1/users".to_string(),
            json!({"username": "mallory", "password": "mallory-password", "role": "admin", "reason": "t"}),
        ),
        (
            Method::PATCH,
            "/api/v1/users/olivia".to_string(),
            json!({"role": "admin", "reason": "promote myself"}),
        ),
        (
            Method::PATCH,
            "/api/v1/users/admin".to_string(),
            json!({"password": "taken-over-password", "reason": "t"}),
        ),
        (
            Method::POST,
            "/api/v1/tokens".to_string(),
            json!({"kind": "api", "name": "mine", "role": "admin", "reason": "t"}),
        ),
    ];
    for (m, path, body) in attempts {
        let (s, h, b) = app.call_as(&olivia, m.clone(), &path, Some(body), &[]).await;
        assert_problem(s, &h, &b, StatusCode::FORBIDDEN);
        assert!(b["detail"].as_str().unwrap().contains("needs the admin role"), "{m} {path}: {b}");
    }
    let (s, h, b) = app.call_as(&olivia, Method::GET, "/api/v1/users", None, &[]).await;
    assert_problem(s, &h, &b, StatusCode::FORBIDDEN);
    app.login("admin", ADMIN_PASSWORD).await;
}

#[tokio::test]
async fn auth_agent_token_on_the_api_is_401() {
    let app = TestApp::spawn().await;
    app.seed().await;
    let (agent, _) = app.agent_token(&["checkout"]).await;
    assert_refused(&app, &agent).await;
    let (s, h, b) =
        app.call_as(&agent, Method::PATCH, FLAG, Some(json!({"value": false, "reason": "x"})), &[]).await;
    assert_problem(s, &h, &b, StatusCode::UNAUTHORIZED);
}

/// An agent token scoped to `checkout` cannot open a stream for `payments` (which exists),
/// nor for its own service in another environment.
#[tokio::test]
async fn auth_agent_token_of_one_service_syncing_another_is_permission_denied() {
    let app = TestApp::spawn().await;
    app.seed().await;
    let (s, _, b) = app
        .call(
            Method::POST,
            "/api/v1/environments/prod/services",
            Some(json!({"name": "payments", "reason": "t", "policy": {"dependencies": {}}})),
        )
        .await;
    assert_eq!(s, StatusCode::CREATED, "{b}");
    let (token, _) = app.agent_token(&["checkout"]).await;
    for (env, service) in [("prod", "payments"), ("staging", "checkout")] {
        let err = sync_hello(&app.grpc, &token, env, service).await.expect_err("refused");
        assert_eq!(err.code(), Code::PermissionDenied, "{env}/{service}: {err}");
    }
    // Its own service works.
    sync_hello(&app.grpc, &token, "prod", "checkout").await.expect("its own service syncs");
}

async fn sync_hello(grpc: &str, token: &str, env: &str, service: &str) -> Result<(), tonic::Status> {
    let mut client = LeveeSyncClient::connect(grpc.to_string()).await.expect("connect");
    let (tx, rx) = tokio::sync::mpsc::channel(1);
    tx.send(AgentMessage {
        kind: Some(agent_message::Kind::Hello(Hello {
            instance_id: "matrix-1".into(),
            agent_version: "0.1.0".into(),
            environment: env.into(),
            services: vec![ServiceState { name: service.into(), applied_revision: 0, hash: String::new() }],
        })),
    })
    .await
    .unwrap();
    let mut req = tonic::Request::new(ReceiverStream::new(rx));
    req.metadata_mut().insert("authorization", MetadataValue::try_from(format!("Bearer {token}")).unwrap());
    client.sync(req).await.map(|_| ())
}

/// A UI session (the cookie's token) is not a bearer token of the API, and an API session
/// or token put in the cookie does not open the UI.
#[tokio::test]
async fn auth_ui_session_is_not_an_api_token_and_api_tokens_do_not_open_the_ui() {
    let app = TestApp::spawn().await;
    let (ui, _) = keys().session("admin", Role::Admin, 0, Door::Ui).unwrap();
    let b = assert_refused(&app, &ui).await;
    assert_eq!(b["detail"], "invalid token", "{b}");
    let mut c = admin_claims();
    c.aud = AUDIENCE_UI.into();
    assert_refused(&app, &keys().sign(&c).unwrap()).await;
    // The API session in the UI cookie: the UI asks to log in.
    let no_redirect = reqwest::Client::builder().redirect(reqwest::redirect::Policy::none()).build().unwrap();
    for token in [app.token.as_str(), ui.as_str()] {
        let res = no_redirect
            .get(app.url("/ui/audit"))
            .header("cookie", format!("levee_session={token}"))
            .send()
            .await
            .unwrap();
        if token == ui {
            assert_eq!(res.status(), StatusCode::OK, "the UI session opens the UI");
        } else {
            assert_eq!(res.status(), StatusCode::SEE_OTHER, "an API session is not a UI session");
            assert!(res.headers()["location"].to_str().unwrap().starts_with("/login"));
        }
    }
}

/// A password or role change is audited (never the password) and ends every session the
/// user had open; the new password opens a new one.
#[tokio::test]
async fn auth_password_and_role_changes_are_audited_and_end_sessions() {
    password_and_role_changes(TestApp::spawn().await).await;
}

#[tokio::test]
async fn auth_password_and_role_changes_are_audited_and_end_sessions_on_postgres() {
    if let Some(app) = TestApp::spawn_on(Db::Postgres).await {
        password_and_role_changes(app).await;
    }
}

async fn password_and_role_changes(app: TestApp) {
    let (s, _, b) = app
        .call(
            Method::POST,
            "/api/v1/users",
            Some(json!({"username": "olivia", "password": "operator-password", "role": "operator", "reason": "t"})),
        )
        .await;
    assert_eq!(s, StatusCode::CREATED, "{b}");
    let before = app.login("olivia", "operator-password").await;
    let (s, _, _) = app.call_as(&before, Method::GET, ENVS, None, &[]).await;
    assert_eq!(s, StatusCode::OK);
    let (s, _, b) = app
        .call(
            Method::PATCH,
            "/api/v1/users/olivia",
            Some(json!({"password": "a-brand-new-password", "reason": "rotated after a leak"})),
        )
        .await;
    assert_eq!(s, StatusCode::NO_CONTENT, "{b}");
    let b = assert_refused(&app, &before).await;
    assert!(b["detail"].as_str().unwrap().contains("revoked"), "{b}");
    let res = app
        .client
        .post(app.url("/api/v1/auth/login"))
        .json(&json!({"username": "olivia", "password": "operator-password"}))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::UNAUTHORIZED, "the old password is gone");
    let after = app.login("olivia", "a-brand-new-password").await;
    let (s, _, _) = app.call_as(&after, Method::GET, ENVS, None, &[]).await;
    assert_eq!(s, StatusCode::OK);
    // A role change ends sessions too.
    let (s, _, b) = app
        .call(Method::PATCH, "/api/v1/users/olivia", Some(json!({"role": "viewer", "reason": "demoted"})))
        .await;
    assert_eq!(s, StatusCode::NO_CONTENT, "{b}");
    assert_refused(&app, &after).await;
    let (s, _, audit) = app.call(Method::GET, "/api/v1/audit?actor=admin", None).await;
    assert_eq!(s, StatusCode::OK, "{audit}");
    let rows: Vec<&serde_json::Value> =
        audit.as_array().unwrap().iter().filter(|r| r["action"] == "user.update").collect();
    assert_eq!(rows.len(), 2, "{audit}");
    let text = audit.to_string();
    assert!(!text.contains("a-brand-new-password") && !text.contains("argon2"), "{text}");
    assert!(
        rows.iter().any(|r| r["after"]["password_changed"] == true && r["reason"] == "rotated after a leak")
    );
    assert!(rows.iter().any(|r| r["before"]["role"] == "operator" && r["after"]["role"] == "viewer"));
    // Bad input names the field; an unknown user is 404.
    let (s, h, b) = app
        .call(Method::PATCH, "/api/v1/users/olivia", Some(json!({"password": "short", "reason": "t"})))
        .await;
    assert_problem(s, &h, &b, StatusCode::BAD_REQUEST);
    let (s, h, b) =
        app.call(Method::PATCH, "/api/v1/users/nobody", Some(json!({"role": "admin", "reason": "t"}))).await;
    assert_problem(s, &h, &b, StatusCode::NOT_FOUND);

    // Disabling ends the sessions and refuses logins until enabled again; audited.
    let session = app.login("olivia", "a-brand-new-password").await;
    let (s, _, b) = app
        .call(
            Method::PATCH,
            "/api/v1/users/olivia",
            Some(json!({"disabled": true, "reason": "left the company"})),
        )
        .await;
    assert_eq!(s, StatusCode::NO_CONTENT, "{b}");
    assert_refused(&app, &session).await;
    let login = |password: &'static str| {
        app.client
            .post(app.url("/api/v1/auth/login"))
            .json(&json!({"username": "olivia", "password": password}))
            .send()
    };
    assert_eq!(login("a-brand-new-password").await.unwrap().status(), StatusCode::UNAUTHORIZED);
    let (_, _, users) = app.call(Method::GET, "/api/v1/users", None).await;
    assert!(
        users.as_array().unwrap().iter().any(|u| u["username"] == "olivia" && u["disabled"] == true),
        "{users}"
    );
    let (s, _, b) = app
        .call(Method::PATCH, "/api/v1/users/olivia", Some(json!({"disabled": false, "reason": "came back"})))
        .await;
    assert_eq!(s, StatusCode::NO_CONTENT, "{b}");
    assert_eq!(login("a-brand-new-password").await.unwrap().status(), StatusCode::OK);
    let (_, _, audit) = app.call(Method::GET, "/api/v1/audit?actor=admin", None).await;
    assert!(
        audit.as_array().unwrap().iter().any(|r| r["action"] == "user.update"
            && r["reason"] == "left the company"
            && r["before"]["disabled"] == false
            && r["after"]["disabled"] == true),
        "{audit}"
    );
    // Nobody disables or demotes themselves: the answer names the field.
    for (body, field) in [
        (json!({"disabled": true, "reason": "t"}), "disabled"),
        (json!({"role": "operator", "reason": "t"}), "role"),
    ] {
        let (s, h, b) = app.call(Method::PATCH, "/api/v1/users/admin", Some(body)).await;
        assert_problem(s, &h, &b, StatusCode::UNPROCESSABLE_ENTITY);
        assert_eq!(b["errors"][0]["path"], field, "{b}");
        assert!(b.to_string().contains(field) && b.to_string().contains("yourself"), "{b}");
    }
    let (s, _, _) = app.call(Method::GET, ENVS, None).await;
    assert_eq!(s, StatusCode::OK, "the admin is still an admin");

    // "Oneself" is the user's own session, never a name that happens to be the same: an
    // API token named like the user, or a local admin (`levee users set` run where `USER`
    // is unset is recorded as `local`) may disable and demote that user.
    let (s, _, b) = app
        .call(
            Method::POST,
            "/api/v1/users",
            Some(json!({"username": "local", "password": "a-long-enough-password", "role": "admin", "reason": "t"})),
        )
        .await;
    assert_eq!(s, StatusCode::CREATED, "{b}");
    let (s, _, t) = app
        .call(
            Method::POST,
            "/api/v1/tokens",
            Some(json!({"kind": "api", "name": "local", "role": "admin", "reason": "t"})),
        )
        .await;
    assert_eq!(s, StatusCode::CREATED, "{t}");
    let token = t["token"].as_str().unwrap().to_string();
    let (s, _, b) = app
        .call_as(
            &token,
            Method::PATCH,
            "/api/v1/users/local",
            Some(json!({"role": "operator", "reason": "t"})),
            &[],
        )
        .await;
    assert_eq!(s, StatusCode::NO_CONTENT, "a token named like the user is not that user: {b}");
    let actions = &app.server.as_ref().unwrap().actions;
    let change =
        levee_server::actions::UserChange::new("local", None, Some(Role::Viewer), Some(true)).unwrap();
    let why = levee_server::actions::Reason::parse("offboarding").unwrap();
    actions
        .update_user(&levee_server::actions::Actor::local("local"), &why, change)
        .await
        .expect("a local admin named like the user is not that user");
}

/// An agent token is minted only for an environment and services that exist.
#[tokio::test]
async fn auth_tokens_are_minted_only_for_existing_environments_and_services() {
    let app = TestApp::spawn().await;
    app.seed().await;
    for (env, services, field) in
        [("nowhere", vec!["checkout"], "environment"), ("prod", vec!["checkout", "not-yet"], "services[1]")]
    {
        let (s, h, b) = app
            .call(
                Method::POST,
                "/api/v1/tokens",
                Some(json!({"kind": "agent", "name": "t", "environment": env, "services": services, "reason": "t"})),
            )
            .await;
        assert!(s.is_client_error(), "{s}: {b}");
        assert_problem(s, &h, &b, s);
        assert!(b.to_string().contains(field), "names {field}: {b}");
    }
    let (s, _, _) = app.call(Method::GET, "/api/v1/tokens", None).await;
    assert_eq!(s, StatusCode::OK);
}

//! Router-level tests: the whole HTTP surface from `levee_server::app`, called with
//! `tower::ServiceExt::oneshot` — no socket, no gRPC, no sweeper; a real SQLite store.

use axum::Router;
use axum::body::Body;
use axum::http::{Method, Request, StatusCode, header};
use levee_server::auth::{Keys, hash_password};
use levee_server::db::{AuditFilter, Role, Store};
use levee_server::hub::Hub;
use levee_server::web::AppState;
use serde_json::{Value, json};
use tower::ServiceExt;

use crate::helpers::{ADMIN_PASSWORD, JWT_SECRET};

struct Oneshot {
    app: Router,
    store: Store,
    hub: Hub,
    _dir: tempfile::TempDir,
}

struct Answer {
    status: StatusCode,
    headers: axum::http::HeaderMap,
    body: Value,
}

impl Oneshot {
    /// The application over a fresh SQLite store with user `admin`; nothing else runs.
    async fn new() -> Oneshot {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::connect(&levee_server::config::sqlite_url(dir.path())).await.unwrap();
        let hash = hash_password(ADMIN_PASSWORD.into()).await.unwrap();
        assert!(store.create_user("admin", &hash, Role::Admin, None).await.unwrap());
        let hub = Hub::default();
        let keys = Keys::new(JWT_SECRET.as_bytes()).unwrap();
        let state = AppState::new(store.clone(), keys, hub.clone(), 64 * 1024, None);
        Oneshot { app: levee_server::app(state), store, hub, _dir: dir }
    }

    async fn send(&self, req: Request<Body>) -> Answer {
        let res = self.app.clone().oneshot(req).await.unwrap();
        let (status, headers) = (res.status(), res.headers().clone());
        let bytes = axum::body::to_bytes(res.into_body(), usize::MAX).await.unwrap();
        let text = String::from_utf8_lossy(&bytes).into_owned();
        Answer { status, headers, body: serde_json::from_str(&text).unwrap_or(Value::String(text)) }
    }

    async fn json(&self, method: Method, path: &str, token: Option<&str>, body: Value) -> Answer {
        let mut req =
            Request::builder().method(method).uri(path).header(header::CONTENT_TYPE, "application/json");
        if let Some(t) = token {
            req = req.header(header::AUTHORIZATION, format!("Bearer {t}"));
        }
        self.send(req.body(Body::from(body.to_string())).unwrap()).await
    }

    async fn login(&self) -> String {
        let a = self
            .json(
                Method::POST,
                "/api/v1/auth/login",
                None,
                json!({"username": "admin", "password": ADMIN_PASSWORD}),
            )
            .await;
        assert_eq!(a.status, StatusCode::OK, "{}", a.body);
        a.body["token"].as_str().unwrap().to_string()
    }
}

impl Oneshot {
    /// Environment `prod` with service `checkout` (one bool flag `k`, on): revision 1.
    async fn create_prod_checkout(&self, token: &str) {
        let env = self
            .json(Method::POST, "/api/v1/environments", Some(token), json!({"name": "prod", "reason": "r"}))
            .await;
        assert_eq!(env.status, StatusCode::CREATED, "{}", env.body);
        let create = self
            .json(
                Method::POST,
                "/api/v1/environments/prod/services",
                Some(token),
                json!({"name": "checkout", "reason": "r", "flags": {"k": {"type": "bool", "value": true}}}),
            )
            .await;
        assert_eq!(create.status, StatusCode::CREATED, "{}", create.body);
    }
}

fn get(path: &str) -> Request<Body> {
    Request::builder().uri(path).body(Body::empty()).unwrap()
}

fn content_type(a: &Answer) -> &str {
    a.headers.get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).unwrap_or("")
}

#[tokio::test]
async fn probes_answer_with_a_request_id() {
    let app = Oneshot::new().await;
    let health = app.send(get("/healthz")).await;
    assert_eq!((health.status, health.body), (StatusCode::OK, json!("ok")));
    assert!(health.headers.contains_key("x-request-id"), "every response carries a request id");
    let ready = app.send(get("/readyz")).await;
    assert_eq!((ready.status, ready.body), (StatusCode::OK, json!("ready")));
    let metrics = app.send(get("/metrics")).await;
    assert_eq!(metrics.status, StatusCode::NOT_FOUND, "no exporter installed in this state");
}

#[tokio::test]
async fn unknown_api_paths_and_methods_are_problem_json() {
    let app = Oneshot::new().await;
    let missing = app.send(get("/api/v1/no-such-thing")).await;
    assert_eq!(missing.status, StatusCode::NOT_FOUND);
    assert_eq!(content_type(&missing), "application/problem+json");
    assert_eq!(missing.body["type"], "urn:levee:problem:not-found");
    let wrong = app
        .send(
            Request::builder().method(Method::PATCH).uri("/api/v1/environments").body(Body::empty()).unwrap(),
        )
        .await;
    assert_eq!(wrong.status, StatusCode::METHOD_NOT_ALLOWED);
    assert_eq!(content_type(&wrong), "application/problem+json");
    assert!(wrong.headers.get(header::ALLOW).is_some(), "405 keeps axum's Allow header");
}

#[tokio::test]
async fn the_api_refuses_an_unauthenticated_call_and_the_ui_sends_it_to_the_login() {
    let app = Oneshot::new().await;
    let api = app.send(get("/api/v1/environments")).await;
    assert_eq!(api.status, StatusCode::UNAUTHORIZED);
    assert_eq!(content_type(&api), "application/problem+json");
    assert_eq!(api.headers.get(header::WWW_AUTHENTICATE).unwrap(), "Bearer realm=\"levee\"");
    let ui = app.send(get("/ui/audit")).await;
    assert_eq!(ui.status, StatusCode::SEE_OTHER);
    assert_eq!(ui.headers.get(header::LOCATION).unwrap(), "/login?next=%2Fui%2Faudit");
    let page = app.send(get("/no-such-page")).await;
    assert_eq!(page.status, StatusCode::NOT_FOUND);
    assert!(content_type(&page).starts_with("text/html"), "the UI's own 404 page");
}

#[tokio::test]
async fn a_write_through_the_router_is_audited_with_its_request_id_and_published_once() {
    let app = Oneshot::new().await;
    let token = app.login().await;
    assert!(app.hub.current("prod", "checkout").is_none());
    app.create_prod_checkout(&token).await;
    assert_eq!(app.hub.current("prod", "checkout").unwrap().revision, 1, "creating publishes revision 1");

    let flip = Request::builder()
        .method(Method::PATCH)
        .uri("/api/v1/environments/prod/services/checkout/flags/k")
        .header(header::CONTENT_TYPE, "application/json")
        .header(header::AUTHORIZATION, format!("Bearer {token}"))
        .header("x-request-id", "flip-42")
        .body(Body::from(json!({"value": false, "reason": "incident"}).to_string()))
        .unwrap();
    let flip = app.send(flip).await;
    assert_eq!(flip.status, StatusCode::OK, "{}", flip.body);
    assert_eq!(flip.headers.get("x-request-id").unwrap(), "flip-42");
    let published = app.hub.current("prod", "checkout").unwrap();
    assert_eq!((published.revision, published.hash.as_str()), (2, flip.body["hash"].as_str().unwrap()));

    let audit = app.store.audit(&AuditFilter { limit: 10, ..Default::default() }).await.unwrap();
    let row = audit.iter().find(|r| r.action == "flag.set").expect("the flip is audited");
    assert_eq!(
        (row.request_id.as_str(), row.via.as_str(), row.reason.as_str()),
        ("flip-42", "api", "incident")
    );
    assert_eq!(row.revision, Some(2));
}

/// Propagation counts every ACK, however large the fleet: `acked` and the percentiles
/// cover all 1,200 agents while the listed ACKs stop at the fastest `MAX_ACKS_LISTED`
/// (the query once stopped at a fixed number of rows, so a big fleet never looked done).
#[tokio::test]
async fn propagation_counts_every_ack_of_a_large_fleet_and_lists_the_fastest() {
    use levee_server::db::{AckRow, MAX_ACKS_LISTED};
    let app = Oneshot::new().await;
    let token = app.login().await;
    app.create_prod_checkout(&token).await;
    let committed = app.store.propagation("prod", "checkout", 1).await.unwrap().unwrap().committed_at;

    const FLEET: usize = 1200;
    // Agent i ACKs i ms after the commit: the fastest listed is agent 0, the slowest 1199.
    let acks: Vec<AckRow> = (0..FLEET)
        .map(|i| AckRow {
            environment: "prod".into(),
            service: "checkout".into(),
            revision: 1,
            instance_id: format!("agent-{i:04}"),
            acked_at: committed + i as i64,
        })
        .collect();
    app.store.write_fleet(&[], &[], &acks, "replica-a", committed + 60_000).await.unwrap();

    let a = app
        .send(
            Request::builder()
                .uri("/api/v1/environments/prod/services/checkout/revisions/1/propagation")
                .header(header::AUTHORIZATION, format!("Bearer {token}"))
                .body(Body::empty())
                .unwrap(),
        )
        .await;
    assert_eq!(a.status, StatusCode::OK, "{}", a.body);
    assert_eq!(a.body["acked"], FLEET, "every ACK is counted");
    assert_eq!(a.body["max"], "1s 199ms", "the slowest ACK is beyond the listed ones");
    let listed = a.body["acks"].as_array().unwrap();
    assert_eq!(listed.len(), MAX_ACKS_LISTED);
    assert_eq!(listed[0]["instance_id"], "agent-0000");
    assert_eq!(listed[MAX_ACKS_LISTED - 1]["instance_id"], format!("agent-{:04}", MAX_ACKS_LISTED - 1));
}

//! Test harness: a real server on loopback port 0 with a fresh database per test.

pub use crate::backends::{Db, postgres_url};
use levee_server::config::{Secret, Settings};
use levee_server::{Server, db::Store};
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

pub const ADMIN_PASSWORD: &str = "admin-password-for-tests";
/// The password of the users [`TestApp::user`] creates.
pub const USER_PASSWORD: &str = "a-long-enough-password";
pub const JWT_SECRET: &str = "test-secret-test-secret-test-secret-0123456789";

#[allow(dead_code)]
pub struct TestApp {
    pub server: Option<Server>,
    pub base: String,
    pub grpc: String,
    pub client: reqwest::Client,
    pub token: String,
    _dir: tempfile::TempDir,
}

impl TestApp {
    pub async fn spawn() -> TestApp {
        Self::spawn_on(Db::Sqlite).await.expect("sqlite always available")
    }

    /// Spawns on the given database; None when PostgreSQL is not available here.
    pub async fn spawn_on(db: Db) -> Option<TestApp> {
        Self::spawn_on_with(db, |_| {}).await
    }

    /// [`TestApp::spawn_on`] with settings changed by `tune` before the server starts.
    pub async fn spawn_on_with(db: Db, tune: impl FnOnce(&mut Settings)) -> Option<TestApp> {
        let url = match db {
            Db::Sqlite => None,
            Db::Postgres => Some(postgres_url().await?),
        };
        Some(Self::spawn_tuned(url, tune).await)
    }

    /// Spawns a server on `database_url` (None = its own SQLite file). Several servers on
    /// one PostgreSQL URL are replicas of one control plane.
    pub async fn spawn_with(database_url: Option<String>) -> TestApp {
        Self::spawn_tuned(database_url, |_| {}).await
    }

    async fn spawn_tuned(database_url: Option<String>, tune: impl FnOnce(&mut Settings)) -> TestApp {
        if std::env::var("TEST_LOG").is_ok() {
            let filter = std::env::var("TEST_LOG").unwrap_or_default();
            let _ = tracing_subscriber::fmt()
                .with_env_filter(if filter.is_empty() { "info".to_string() } else { filter })
                .try_init();
        }
        let dir = tempfile::tempdir().unwrap();
        let mut settings = Settings::for_dir(dir.path());
        if let Some(url) = database_url {
            settings.database_url = Secret::new(url);
        }
        settings.admin_password = Some(Secret::new(ADMIN_PASSWORD));
        settings.jwt_secret = Some(Secret::new(JWT_SECRET));
        settings.max_body_bytes = 64 * 1024;
        tune(&mut settings);
        let server = Server::start(settings, None).await.expect("server starts");
        let base = format!("http://{}", server.http_addr);
        let grpc = format!("http://{}", server.grpc_addr);
        let client = reqwest::Client::new();
        let mut app = TestApp { server: Some(server), base, grpc, client, token: String::new(), _dir: dir };
        app.token = app.login("admin", ADMIN_PASSWORD).await;
        app
    }

    #[allow(dead_code)]
    pub fn store(&self) -> &Store {
        &self.server.as_ref().unwrap().store
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{}", self.base, path)
    }

    /// Creates user `name` with `role` and [`USER_PASSWORD`]; returns its session token.
    pub async fn user(&self, name: &str, role: &str) -> String {
        let body = json!({"username": name, "password": USER_PASSWORD, "role": role, "reason": "test"});
        let (s, _, b) = self.call(Method::POST, "/api/v1/users", Some(body)).await;
        assert_eq!(s, StatusCode::CREATED, "{b}");
        self.login(name, USER_PASSWORD).await
    }

    pub async fn login(&self, user: &str, password: &str) -> String {
        let res = self
            .client
            .post(self.url("/api/v1/auth/login"))
            .json(&json!({"username": user, "password": password}))
            .send()
            .await
            .unwrap();
        assert_eq!(res.status(), StatusCode::OK, "login of {user} failed");
        res.json::<Value>().await.unwrap()["token"].as_str().unwrap().to_string()
    }

    /// Sends a JSON request with the admin token; returns status, headers and body.
    pub async fn call(
        &self,
        method: Method,
        path: &str,
        body: Option<Value>,
    ) -> (StatusCode, reqwest::header::HeaderMap, Value) {
        self.call_as(&self.token, method, path, body, &[]).await
    }

    pub async fn call_as(
        &self,
        token: &str,
        method: Method,
        path: &str,
        body: Option<Value>,
        headers: &[(&str, &str)],
    ) -> (StatusCode, reqwest::header::HeaderMap, Value) {
        let mut req = self.client.request(method, self.url(path)).bearer_auth(token);
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        if let Some(b) = body {
            req = req.json(&b);
        }
        let res = req.send().await.unwrap();
        let status = res.status();
        let headers = res.headers().clone();
        let text = res.text().await.unwrap();
        let value = serde_json::from_str(&text).unwrap_or(Value::String(text));
        (status, headers, value)
    }

    /// Creates environment `prod` (faults allowed) and service `checkout` with one flag.
    pub async fn seed(&self) {
        self.seed_with_switch_until(None).await;
    }

    /// [`TestApp::seed`], the kill switch created with `expires_at` when given (a flag
    /// created with an expiry has no earlier flag to go back to: it is removed then).
    pub async fn seed_with_switch_until(&self, expires_at: Option<String>) {
        let mut switch = json!({"type": "bool", "value": true, "description": "kill switch"});
        if let Some(t) = expires_at {
            switch["expires_at"] = json!(t);
        }
        let (s, _, b) = self
            .call(
                Method::POST,
                "/api/v1/environments",
                Some(json!({"name": "prod", "allow_faults": true, "reason": "test"})),
            )
            .await;
        assert_eq!(s, StatusCode::CREATED, "{b}");
        let (s, _, b) = self
            .call(
                Method::POST,
                "/api/v1/environments/prod/services",
                Some(json!({
                    "name": "checkout",
                    "reason": "test",
                    "policy": {"dependencies": {"recommendations": {"criticality": "non_critical",
                        "enabled_flag": "recommendations.enabled", "attempt_timeout": "80ms", "fallback": "generic"}}},
                    "flags": {"recommendations.enabled": switch}
                })),
            )
            .await;
        assert_eq!(s, StatusCode::CREATED, "{b}");
    }

    /// Stores `body` as the next revision of prod/checkout straight into the database, as
    /// a server of another version could have; returns the revision.
    pub async fn store_raw_revision(&self, body: &str) -> u64 {
        let pool = self.store().pool();
        let row = sqlx::query(
            "UPDATE services SET revision = revision + 1 WHERE environment = 'prod' AND name = 'checkout' \
             RETURNING revision",
        )
        .fetch_one(pool)
        .await
        .unwrap();
        let revision: i64 = sqlx::Row::try_get(&row, "revision").unwrap();
        sqlx::query(
            "INSERT INTO revisions (environment, service, revision, hash, body, created_at, actor, reason) \
             VALUES ('prod', 'checkout', $1, $2, $3, 0, 'test', 'raw')",
        )
        .bind(revision)
        .bind(levee_agent::policy::content_hash(body.as_bytes()))
        .bind(body)
        .execute(pool)
        .await
        .unwrap();
        revision as u64
    }

    /// Mints an agent token for environment `prod` and the given services.
    pub async fn agent_token(&self, services: &[&str]) -> (String, String) {
        let (s, _, b) = self
            .call(
                Method::POST,
                "/api/v1/tokens",
                Some(json!({"kind": "agent", "name": "agent-test", "environment": "prod", "services": services, "reason": "test"})),
            )
            .await;
        assert_eq!(s, StatusCode::CREATED, "{b}");
        (b["token"].as_str().unwrap().to_string(), b["id"].as_str().unwrap().to_string())
    }
}

/// Asserts a problem+json error with the given status and returns its body.
pub fn assert_problem(
    status: StatusCode,
    headers: &reqwest::header::HeaderMap,
    body: &Value,
    expected: StatusCode,
) {
    assert_eq!(status, expected, "body: {body}");
    let ct = headers.get("content-type").and_then(|v| v.to_str().ok()).unwrap_or("");
    assert_eq!(ct, "application/problem+json", "body: {body}");
    assert_eq!(body["status"].as_u64(), Some(u64::from(expected.as_u16())), "body: {body}");
    assert!(body["detail"].as_str().is_some_and(|d| !d.is_empty()), "problem without detail: {body}");
}

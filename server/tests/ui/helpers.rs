//! Test harness: a real server on loopback port 0 with a fresh SQLite database per test,
//! and a tiny "browser" that keeps cookies, reads the anti-CSRF token out of pages and posts
//! forms the way a browser does (same-origin `Origin` and `Sec-Fetch-Site`).

use std::collections::BTreeMap;

use std::time::Duration;

use levee_agent::{Agent, SyncClientSettings};
use levee_server::Server;
use levee_server::config::{Secret, Settings};
use reqwest::header::HeaderMap;
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

pub const ADMIN_PASSWORD: &str = "admin-password-for-tests";
pub const JWT_SECRET: &str = "test-secret-test-secret-test-secret-0123456789";
/// Password given to every user the tests create.
pub const PASSWORD: &str = "a-long-enough-password";
/// The text askama renders for `<script>alert(1)</script>`.
pub const ESCAPED_SCRIPT: &str = "&#60;script&#62;alert(1)&#60;/script&#62;";
pub const RAW_SCRIPT: &str = "<script>alert(1)</script>";

pub struct TestApp {
    pub _server: Server,
    pub base: String,
    pub grpc: String,
    /// Does not follow redirects, so tests see every 303 and its cookies.
    pub client: reqwest::Client,
    /// Admin bearer token for the API.
    pub token: String,
    _dir: tempfile::TempDir,
}

impl TestApp {
    pub async fn spawn() -> TestApp {
        Self::spawn_with(None).await
    }

    /// Spawns on the given database; None when PostgreSQL is not available here.
    pub async fn spawn_on(db: crate::backends::Db) -> Option<TestApp> {
        let url = match db {
            crate::backends::Db::Sqlite => None,
            crate::backends::Db::Postgres => Some(crate::backends::postgres_url().await?),
        };
        Some(Self::spawn_with(url).await)
    }

    /// Spawns a server on `database_url` (None = its own SQLite file).
    pub async fn spawn_with(database_url: Option<String>) -> TestApp {
        if std::env::var("TEST_LOG").is_ok() {
            let _ = tracing_subscriber::fmt().with_env_filter("info").try_init();
        }
        let dir = tempfile::tempdir().unwrap();
        let mut settings = Settings::for_dir(dir.path());
        if let Some(url) = database_url {
            settings.database_url = Secret::new(url);
        }
        settings.admin_password = Some(Secret::new(ADMIN_PASSWORD));
        settings.jwt_secret = Some(Secret::new(JWT_SECRET));
        settings.max_body_bytes = 64 * 1024;
        let server = Server::start(settings, None).await.expect("server starts");
        let base = format!("http://{}", server.http_addr);
        let grpc = format!("http://{}", server.grpc_addr);
        let client = reqwest::Client::builder().redirect(reqwest::redirect::Policy::none()).build().unwrap();
        let mut app = TestApp { _server: server, base, grpc, client, token: String::new(), _dir: dir };
        let (s, _, b) = app
            .api(Method::POST, "/auth/login", Some(json!({"username": "admin", "password": ADMIN_PASSWORD})))
            .await;
        assert_eq!(s, StatusCode::OK, "{b}");
        app.token = b["token"].as_str().unwrap().to_string();
        app
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{}", self.base, path)
    }

    /// Calls the JSON API as the admin.
    pub async fn api(
        &self,
        method: Method,
        path: &str,
        body: Option<Value>,
    ) -> (StatusCode, HeaderMap, Value) {
        self.api_with(method, path, body, &[]).await
    }

    pub async fn api_with(
        &self,
        method: Method,
        path: &str,
        body: Option<Value>,
        headers: &[(&str, &str)],
    ) -> (StatusCode, HeaderMap, Value) {
        let mut req = self.client.request(method, self.url(&format!("/api/v1{path}")));
        if !self.token.is_empty() {
            req = req.bearer_auth(&self.token);
        }
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
        (status, headers, serde_json::from_str(&text).unwrap_or(Value::String(text)))
    }

    /// Creates a user with `role` (and [`PASSWORD`]).
    pub async fn user(&self, name: &str, role: &str) {
        let (s, _, b) = self
            .api(
                Method::POST,
                "/users",
                Some(json!({"username": name, "password": PASSWORD, "role": role, "reason": "test"})),
            )
            .await;
        assert_eq!(s, StatusCode::CREATED, "{b}");
    }

    /// An agent token for prod/`service`.
    pub async fn agent_token(&self, service: &str) -> String {
        let (s, _, t) = self
            .api(
                Method::POST,
                "/tokens",
                Some(json!({"kind": "agent", "name": format!("{service}-agent"), "environment": "prod",
                    "services": [service], "reason": "test"})),
            )
            .await;
        assert_eq!(s, StatusCode::CREATED, "{t}");
        t["token"].as_str().unwrap().to_string()
    }

    /// An agent of prod/`service` with a token of its own, synced, that reports its status
    /// every 100 ms and reconnects within 300 ms.
    pub async fn reporting_agent(&self, service: &str, cache: &std::path::Path) -> Agent {
        let agent = Agent::builder(&self.grpc, &self.agent_token(service).await, "prod", service)
            .cache_dir(cache)
            .sync_settings(SyncClientSettings {
                status_interval: Duration::from_millis(100),
                backoff_base: Duration::from_millis(50),
                backoff_cap: Duration::from_millis(300),
                reconnect_jitter: Duration::from_millis(50),
                ..SyncClientSettings::default()
            })
            .build()
            .expect("agent builds");
        agent.wait_for_initial_sync(Duration::from_secs(10)).await.expect("initial sync");
        agent
    }

    /// Environment `prod` with service `checkout`: dependency `recommendations` behind the
    /// kill switch `recommendations.enabled`, dependency `payments`, a matrix row, two flags.
    pub async fn seed(&self) {
        let (s, _, b) = self
            .api(
                Method::POST,
                "/environments",
                Some(json!({"name": "prod", "allow_faults": true, "reason": "test"})),
            )
            .await;
        assert_eq!(s, StatusCode::CREATED, "{b}");
        let (s, _, b) = self
            .api(
                Method::POST,
                "/environments/prod/services",
                Some(json!({
                    "name": "checkout",
                    "reason": "test",
                    "policy": {
                        "dependencies": {
                            "recommendations": {"criticality": "non_critical", "enabled_flag": "recommendations.enabled",
                                "attempt_timeout": "80ms", "fallback": "generic"},
                            "payments": {"attempt_timeout": "300ms", "retry": {"max_attempts": 2}}
                        },
                        "degradation_matrix": [{"feature": "product recommendations", "dependencies": ["recommendations"],
                            "on_failure": "generic", "owner": "growth team", "enabled_flag": "recommendations.enabled"}]
                    },
                    "flags": {
                        "recommendations.enabled": {"type": "bool", "value": true, "description": "kill switch of recommendations"},
                        "checkout.max_items": {"type": "int", "value": 50, "description": "cart size limit"}
                    }
                })),
            )
            .await;
        assert_eq!(s, StatusCode::CREATED, "{b}");
    }

    /// The snapshot agents receive for prod/checkout.
    pub async fn snapshot(&self) -> Value {
        let (s, _, b) = self.api(Method::GET, "/environments/prod/services/checkout/snapshot", None).await;
        assert_eq!(s, StatusCode::OK, "{b}");
        b
    }

    /// Value of the kill switch in the current snapshot.
    pub async fn kill_switch(&self) -> Value {
        self.snapshot().await["config"]["flags"]["recommendations.enabled"]["value"].clone()
    }

    /// Audit rows, newest first.
    pub async fn audit(&self) -> Vec<Value> {
        let (s, _, b) = self.api(Method::GET, "/audit?environment=prod&service=checkout", None).await;
        assert_eq!(s, StatusCode::OK, "{b}");
        b.as_array().unwrap().clone()
    }

    /// A browser with no cookies yet.
    pub fn browser(&self) -> Browser<'_> {
        Browser { app: self, cookies: BTreeMap::new() }
    }

    /// A browser logged in as `user` (with [`PASSWORD`], or the admin password for `admin`).
    pub async fn logged_in(&self, user: &str) -> Browser<'_> {
        let mut b = self.browser();
        let password = if user == "admin" { ADMIN_PASSWORD } else { PASSWORD };
        let res = b.login(user, password).await;
        assert_eq!(res.status, StatusCode::SEE_OTHER, "login of {user}: {}", res.body);
        assert!(b.cookies.contains_key("levee_session"));
        b
    }
}

/// One HTTP answer.
#[derive(Debug)]
pub struct Page {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: String,
    /// Raw `Set-Cookie` values.
    pub set_cookies: Vec<String>,
}

impl Page {
    pub fn location(&self) -> &str {
        self.headers.get("location").and_then(|v| v.to_str().ok()).unwrap_or("")
    }

    /// The value of the first hidden field `name` on the page.
    pub fn field(&self, name: &str) -> Option<String> {
        let needle = format!("name=\"{name}\" value=\"");
        let start = self.body.find(&needle)? + needle.len();
        let end = self.body[start..].find('"')? + start;
        Some(self.body[start..end].to_string())
    }

    /// The anti-CSRF token embedded in the page's forms.
    pub fn csrf(&self) -> String {
        self.field("csrf").unwrap_or_else(|| panic!("no csrf field on the page: {}", self.body))
    }

    pub fn set_cookie(&self, name: &str) -> Option<&str> {
        self.set_cookies.iter().map(String::as_str).find(|c| c.starts_with(&format!("{name}=")))
    }
}

pub struct Browser<'a> {
    pub app: &'a TestApp,
    pub cookies: BTreeMap<String, String>,
}

impl Browser<'_> {
    fn cookie_header(&self) -> String {
        self.cookies.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join("; ")
    }

    async fn send(&mut self, req: reqwest::RequestBuilder) -> Page {
        let req = if self.cookies.is_empty() { req } else { req.header("cookie", self.cookie_header()) };
        let res = req.send().await.unwrap();
        let status = res.status();
        let headers = res.headers().clone();
        let set_cookies: Vec<String> =
            headers.get_all("set-cookie").iter().map(|v| v.to_str().unwrap().to_string()).collect();
        for c in &set_cookies {
            let pair = c.split(';').next().unwrap();
            let (k, v) = pair.split_once('=').unwrap();
            if c.contains("Max-Age=0") {
                self.cookies.remove(k);
            } else {
                self.cookies.insert(k.to_string(), v.to_string());
            }
        }
        let body = res.text().await.unwrap();
        Page { status, headers, body, set_cookies }
    }

    pub async fn get(&mut self, path: &str) -> Page {
        let req = self.app.client.get(self.app.url(path));
        self.send(req).await
    }

    /// Posts a form the way a browser does from one of the server's own pages.
    pub async fn post(&mut self, path: &str, fields: &[(&str, &str)]) -> Page {
        let origin = self.app.base.clone();
        self.post_with(path, fields, &[("origin", &origin), ("sec-fetch-site", "same-origin")]).await
    }

    /// Posts a form with exactly the given extra headers.
    pub async fn post_with(&mut self, path: &str, fields: &[(&str, &str)], headers: &[(&str, &str)]) -> Page {
        let mut req = self
            .app
            .client
            .post(self.app.url(path))
            .header("content-type", "application/x-www-form-urlencoded")
            .body(serde_urlencoded::to_string(fields).unwrap());
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        self.send(req).await
    }

    /// Opens the login page and submits it.
    pub async fn login(&mut self, user: &str, password: &str) -> Page {
        let form = self.get("/login").await;
        assert_eq!(form.status, StatusCode::OK, "{}", form.body);
        let csrf = form.csrf();
        self.post("/login", &[("csrf", &csrf), ("next", "/"), ("username", user), ("password", password)])
            .await
    }
}

pub const SERVICE: &str = "/ui/environments/prod/services/checkout";
pub const KILL_SWITCH: &str = "/ui/environments/prod/services/checkout/flags/recommendations.enabled";

//! Helpers: agents with test-sized timings, the `levee` binary as a child process, waits.

use std::net::SocketAddr;
use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use levee_agent::{Agent, SyncClientSettings};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

/// Sync timings shrunk so reconnects happen within a test's patience, in real time.
pub fn fast_sync() -> SyncClientSettings {
    SyncClientSettings {
        backoff_base: Duration::from_millis(50),
        backoff_cap: Duration::from_millis(300),
        reconnect_jitter: Duration::from_millis(50),
        connect_timeout: Duration::from_secs(2),
        ..SyncClientSettings::default()
    }
}

/// Starts an agent for `prod/checkout` with the example's safe defaults.
pub fn agent(grpc: &str, token: &str, cache: &Path) -> Agent {
    Agent::builder(grpc, token, "prod", "checkout")
        .cache_dir(cache)
        .defaults(crate::checkout_app::safe_defaults())
        .sync_settings(fast_sync())
        .build()
        .expect("agent builds")
}

/// Polls `cond` every 5 ms until it holds; panics with `what` after `timeout`.
/// Returns how long it took.
pub async fn wait_until(what: &str, timeout: Duration, mut cond: impl FnMut() -> bool) -> Duration {
    let start = tokio::time::Instant::now();
    while !cond() {
        assert!(start.elapsed() < timeout, "timed out after {timeout:?} waiting for {what}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    start.elapsed()
}

/// The `levee` binary running as a child process (so it can be killed with SIGKILL).
pub struct BinServer {
    pub child: Child,
    pub http: SocketAddr,
    pub grpc: SocketAddr,
}

/// `levee serve` on the given addresses (port 0 picks free ones) with its data in
/// `data_dir` (SQLite), logging at `log` to a pipe.
pub fn levee_serve(data_dir: &Path, http: &str, grpc: &str, log: &str) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_levee"));
    cmd.arg("serve")
        .env("LEVEE_DATA_DIR", data_dir)
        .env("LEVEE_HTTP_ADDR", http)
        .env("LEVEE_GRPC_ADDR", grpc)
        .env("LEVEE_ADMIN_PASSWORD", crate::helpers::ADMIN_PASSWORD)
        .env("LEVEE_LOG", log)
        .env_remove("LEVEE_DATABASE_URL")
        .stdout(Stdio::piped())
        .kill_on_drop(true);
    cmd
}

impl BinServer {
    /// Starts `levee serve` on the given addresses (port 0 picks free ones).
    pub async fn start(data_dir: &Path, http: &str, grpc: &str) -> BinServer {
        Self::start_with(data_dir, http, grpc, &[]).await
    }

    /// As [`start`](Self::start), with more environment variables (`LEVEE_DATABASE_URL`
    /// for a replica on PostgreSQL, …).
    pub async fn start_with(data_dir: &Path, http: &str, grpc: &str, env: &[(&str, &str)]) -> BinServer {
        let mut cmd = levee_serve(data_dir, http, grpc, "warn");
        cmd.env("LEVEE_HEARTBEAT_INTERVAL", "1s");
        for (k, v) in env {
            cmd.env(k, v);
        }
        let mut child = cmd.stderr(Stdio::inherit()).spawn().expect("levee binary starts");
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let line = tokio::time::timeout(Duration::from_secs(30), async {
            while let Some(l) = lines.next_line().await.unwrap() {
                if l.starts_with("levee listening:") {
                    return l;
                }
            }
            panic!("levee exited before listening");
        })
        .await
        .expect("levee prints its addresses");
        // "levee listening: http://A (API, UI)  grpc://B (agent sync)"
        let http = line.split("http://").nth(1).unwrap().split_whitespace().next().unwrap().parse().unwrap();
        let grpc = line.split("grpc://").nth(1).unwrap().split_whitespace().next().unwrap().parse().unwrap();
        tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
        BinServer { child, http, grpc }
    }

    /// SIGKILL: no graceful shutdown, no GoAway.
    pub async fn kill(mut self) {
        self.child.kill().await.expect("kill");
        let _ = self.child.wait().await;
    }
}

/// A thin API client for a server at `base`, logged in as admin.
pub struct Api {
    pub base: String,
    pub client: reqwest::Client,
    pub token: String,
}

impl Api {
    pub async fn login(base: &str) -> Api {
        let client = reqwest::Client::new();
        let res = client
            .post(format!("{base}/api/v1/auth/login"))
            .json(&serde_json::json!({"username": "admin", "password": crate::helpers::ADMIN_PASSWORD}))
            .send()
            .await
            .unwrap();
        assert!(res.status().is_success());
        let token = res.json::<serde_json::Value>().await.unwrap()["token"].as_str().unwrap().to_string();
        Api { base: base.to_string(), client, token }
    }

    pub async fn send(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<serde_json::Value>,
    ) -> serde_json::Value {
        self.send_with(method, path, body, &[]).await
    }

    pub async fn send_with(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<serde_json::Value>,
        headers: &[(&str, &str)],
    ) -> serde_json::Value {
        let mut req = self
            .client
            .request(method.clone(), format!("{}/api/v1{path}", self.base))
            .bearer_auth(&self.token);
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        if let Some(b) = body {
            req = req.json(&b);
        }
        let res = req.send().await.unwrap();
        let status = res.status();
        let v: serde_json::Value = res.json().await.unwrap_or(serde_json::Value::Null);
        assert!(status.is_success(), "{method} {path} → {status}: {v}");
        v
    }

    /// Environment `prod` and service `checkout` with the kill switch on.
    pub async fn seed(&self) {
        self.seed_env(serde_json::json!({"name": "prod", "reason": "e2e"})).await;
    }

    /// [`Api::seed`] in an environment that allows fault injection.
    pub async fn seed_allowing_faults(&self) {
        self.seed_env(serde_json::json!({"name": "prod", "allow_faults": true, "reason": "e2e"})).await;
    }

    async fn seed_env(&self, env: serde_json::Value) {
        use reqwest::Method;
        self.send(Method::POST, "/environments", Some(env)).await;
        self.send(
            Method::POST,
            "/environments/prod/services",
            Some(serde_json::json!({
                "name": "checkout", "reason": "e2e",
                "policy": {"dependencies": {
                    "pricing": {"criticality": "critical", "attempt_timeout": "300ms"},
                    "recommendations": {"criticality": "non_critical", "attempt_timeout": "80ms", "fallback": "generic",
                                        "enabled_flag": "recommendations.enabled"}}},
                "flags": {"recommendations.enabled": {"type": "bool", "value": true}}
            })),
        )
        .await;
    }

    pub async fn agent_token(&self, env: &str, services: &[&str]) -> String {
        let v = self
            .send(
                reqwest::Method::POST,
                "/tokens",
                Some(serde_json::json!({"kind": "agent", "name": "e2e", "environment": env, "services": services, "reason": "e2e"})),
            )
            .await;
        v["token"].as_str().unwrap().to_string()
    }

    /// Sets the kill switch; returns the new revision.
    pub async fn set_recommendations(&self, on: bool) -> u64 {
        let v = self
            .send(
                reqwest::Method::PATCH,
                "/environments/prod/services/checkout/flags/recommendations.enabled",
                Some(serde_json::json!({"value": on, "reason": "e2e flip"})),
            )
            .await;
        v["revision"].as_u64().unwrap()
    }

    /// Checkout's policy for a game day on recommendations: a call to it may take a second
    /// per attempt, so a fault's latency shows in the calls' p99; the degradation matrix
    /// names the feature's owner and runbook.
    pub async fn game_day_policy(&self) {
        self.send_with(
            reqwest::Method::PUT,
            "/environments/prod/services/checkout/policy",
            Some(serde_json::json!({"reason": "e2e game day", "staged": false, "policy": {"dependencies": {
                "pricing": {"criticality": "critical", "attempt_timeout": "300ms"},
                "recommendations": {"criticality": "non_critical", "attempt_timeout": "1s", "fallback": "generic",
                                    "enabled_flag": "recommendations.enabled"}},
                "degradation_matrix": [{"feature": "Personal recommendations", "dependencies": ["recommendations"],
                    "on_failure": "generic", "owner": "growth team",
                    "runbook": "https://runbooks.example.com/growth/recommendations"}]}})),
            &[("if-match", "*")],
        )
        .await;
    }
}

/// A game day on checkout under [`Api::game_day_policy`]: recommendations 400 ms slower on
/// one instance, so the p99 of checkout's calls to it leaves 200 ms; it does not abort by
/// itself before the players act.
pub fn recs_slow_game_day() -> serde_json::Value {
    serde_json::json!({
        "name": "recs-slow", "environment": "prod", "service": "checkout", "game_day": true,
        "fault": {"dependency": "recommendations", "action": {"type": "delay", "delay": "400ms"}},
        "blast_radius": {"instances": 1},
        "duration": "2m", "baseline": "1s", "recovery": "1s", "abort_after": "2m",
        "hypothesis": [{"p99": {"dependency": "recommendations", "at_most": "200ms"}}, {"ready": true}],
    })
}

/// The process-wide Prometheus recorder of this test binary, built as `levee serve` builds
/// it and also rendered by the example's `/metrics` (one process, one global recorder).
pub fn recorder() -> metrics_exporter_prometheus::PrometheusHandle {
    static HANDLE: std::sync::OnceLock<metrics_exporter_prometheus::PrometheusHandle> =
        std::sync::OnceLock::new();
    HANDLE
        .get_or_init(|| {
            let h = levee_server::app::prometheus_builder().install_recorder().expect("the first recorder");
            crate::checkout_app::adopt_metrics_handle(h.clone());
            h
        })
        .clone()
}

/// Starts the example's dependencies and checkout around `agent`; returns the checkout URL
/// and the recommendations control.
pub async fn start_example(agent: &Agent) -> (String, std::sync::Arc<crate::checkout_app::RecsControl>) {
    recorder();
    let any: SocketAddr = "127.0.0.1:0".parse().unwrap();
    let control = std::sync::Arc::new(crate::checkout_app::RecsControl::default());
    let pricing = crate::checkout_app::start_pricing(any).await.unwrap();
    let recs = crate::checkout_app::start_recommendations(any, control.clone()).await.unwrap();
    let checkout = crate::checkout_app::start_checkout(any, agent, pricing, recs).await.unwrap();
    (format!("http://{checkout}"), control)
}

pub async fn page(url: &str) -> crate::checkout_app::CheckoutPage {
    let res = reqwest::get(format!("{url}/checkout/alice")).await.unwrap();
    assert!(res.status().is_success(), "checkout answered {}", res.status());
    res.json().await.unwrap()
}

/// One checkout instance under real traffic: an agent named `name` reporting its health
/// every 100 ms, the example's checkout with its own pricing and recommendations around
/// it (recommendations answering in 20 ms), and a client calling it every 10 ms.
pub struct Shop {
    pub name: String,
    pub agent: Agent,
}

pub async fn shop(
    grpc: &str,
    token: &str,
    cache: &Path,
    name: &str,
    stop: &tokio::sync::watch::Receiver<bool>,
) -> Shop {
    shop_reporting_every(grpc, token, cache, name, stop, Duration::from_millis(100)).await
}

/// [`shop`] with its agent reporting its health every `status_interval`: a window long
/// enough to hold several of its slowest calls.
pub async fn shop_reporting_every(
    grpc: &str,
    token: &str,
    cache: &Path,
    name: &str,
    stop: &tokio::sync::watch::Receiver<bool>,
    status_interval: Duration,
) -> Shop {
    let agent = Agent::builder(grpc, token, "prod", "checkout")
        .instance_name(name)
        .cache_dir(cache.join(name))
        .defaults(crate::checkout_app::safe_defaults())
        .sync_settings(levee_agent::SyncClientSettings {
            status_interval,
            min_report_gap: Duration::from_millis(50),
            ..fast_sync()
        })
        .build()
        .expect("agent builds");
    agent.wait_for_initial_sync(Duration::from_secs(10)).await.unwrap();
    let (url, recs) = start_example(&agent).await;
    recs.delay_ms.store(20, std::sync::atomic::Ordering::Relaxed);
    let mut stop = stop.clone();
    tokio::spawn(async move {
        let client = reqwest::Client::new();
        let mut tick = tokio::time::interval(Duration::from_millis(10));
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                _ = stop.changed() => return,
            }
            // Whatever checkout answers: the agent counts what its calls did.
            let _ = client.get(format!("{url}/checkout/alice")).send().await;
        }
    });
    Shop { name: name.to_string(), agent }
}

//! Experiments end to end (issue 23 item 1): a real server on SQLite and on PostgreSQL,
//! three checkout instances of the real example under real traffic, their agents reporting
//! their health, experiments started through the API and through `levee experiment run
//! --wait`.
//!
//! * a hypothesis already failing → `aborted`, nothing injected (no `fault.set`);
//! * a fault the service absorbs (recommendations answering 503: checkout serves its
//!   fallback) on one instance → `passed`, exit code 0;
//! * a fault that breaks the hypothesis (pricing answering 503 — checkout has no fallback
//!   for it — against "pricing calls succeed ≥ 99 %") on one instance → `aborted` within
//!   `abort_after` of the first violated reading,
//!   exit code 4, and the fault gone from every agent within a second of its removal;
//! * throughout, an agent outside the blast radius never has a call failed by the fault
//!   (checked on the agents themselves), and the one inside does;
//! * the server killed mid-experiment → the agents end the fault at its expiry;
//! * a scheduled experiment starts at its time, by the server's own clock, and reaches
//!   its verdict.

use std::collections::BTreeMap;
use std::sync::Arc;

use std::time::Duration;
use tokio::sync::Mutex;

use levee_agent::policy::Timestamp;
use levee_agent::{Agent, CallError};
use reqwest::Method;
use serde_json::{Value, json};

use crate::helpers::TestApp;
use crate::support::{Api, BinServer, Shop, fast_sync, shop, start_example};

/// An experiment on one instance of checkout, readings every second around it.
fn experiment(name: &str, fault: Value, hypothesis: Value, duration: &str) -> Value {
    json!({
        "name": name, "environment": "prod", "service": "checkout",
        "fault": fault, "blast_radius": {"instances": 1},
        "duration": duration, "baseline": "1s", "recovery": "1s", "abort_after": "1s",
        "hypothesis": hypothesis,
    })
}

fn answers_503(dependency: &str) -> Value {
    json!({"dependency": dependency, "action": {"type": "abort", "status": 503}})
}

/// Checkout's calls to pricing succeed (it has no fallback for them: a failed call is a
/// failed page) and every instance is ready.
fn pricing_holds() -> Value {
    json!([{"success_rate": {"dependency": "pricing", "at_least": 99}}, {"ready": true}])
}

/// Pricing's breaker disabled: a call the fault fails is failed by the fault, never
/// refused by a breaker the fault opened, so a probe sees exactly when the fault acts.
async fn without_pricing_breaker(api: &Api) {
    api.send(
        Method::PUT,
        "/environments/prod/services/checkout/breaker-overrides/pricing",
        Some(json!({"state": "disabled", "reason": "e2e: see the fault itself"})),
    )
    .await;
}

/// Polls the report until the experiment is done.
async fn finished(api: &Api, id: i64, within: Duration) -> Value {
    let until = tokio::time::Instant::now() + within;
    loop {
        let r = api.send(Method::GET, &format!("/experiments/{id}"), None).await;
        if r["experiment"]["state"] == "done" {
            return r;
        }
        assert!(tokio::time::Instant::now() < until, "experiment {id} not done within {within:?}: {r}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// What a call through `agent`'s `dependency` says of the fault: `Some(true)` failed by
/// it, `Some(false)` answered, `None` refused before it could tell (the client-side
/// throttle, after many failures).
async fn probe(agent: &Agent, dependency: &str) -> Option<bool> {
    match agent.dependency(dependency).call("probe", || async { Ok::<(), std::io::Error>(()) }).await {
        Ok(()) => Some(false),
        Err(CallError::Injected(_)) => Some(true),
        Err(_) => None,
    }
}

/// Per instance id, the last wall-clock time (ms) a probe call of `dependency` was failed
/// by an injected fault; every agent is probed every 20 ms until the watch is dropped.
struct Watch {
    seen: Arc<Mutex<BTreeMap<String, i64>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Watch {
    fn start(agents: Vec<Agent>, dependency: &'static str) -> Watch {
        let seen: Arc<Mutex<BTreeMap<String, i64>>> = Arc::default();
        let out = seen.clone();
        let task = tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_millis(20));
            loop {
                tick.tick().await;
                for a in &agents {
                    if probe(a, dependency).await == Some(true) {
                        out.lock().await.insert(a.instance_id().to_string(), Timestamp::now().unix_ms());
                    }
                }
            }
        });
        Watch { seen, task }
    }

    async fn stop(self) -> BTreeMap<String, i64> {
        self.task.abort();
        self.seen.lock().await.clone()
    }
}

/// Runs `levee experiment run FILE --wait` against `api`'s server; (exit code, id).
async fn run_cli(api: &Api, spec: &Value) -> (i32, i64, String) {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("experiment.yaml");
    std::fs::write(&file, serde_json::to_string_pretty(spec).unwrap()).unwrap();
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_levee"))
        .args(["experiment", "run"])
        .arg(&file)
        .args(["--reason", "e2e after deploy", "--wait"])
        .env("LEVEE_SERVER", &api.base)
        .env("LEVEE_TOKEN", &api.token)
        .env("LEVEE_CREDENTIALS", dir.path().join("none"))
        .output()
        .await
        .expect("levee runs");
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    let id = stdout
        .lines()
        .find_map(|l| l.strip_prefix("experiment ")?.split_whitespace().next()?.parse::<i64>().ok())
        .unwrap_or_else(|| panic!("no id in: {stdout}\n{}", String::from_utf8_lossy(&out.stderr)));
    (out.status.code().unwrap_or(-1), id, stdout)
}

fn ms(v: &Value) -> i64 {
    Timestamp::parse(v.as_str().unwrap_or_else(|| panic!("a time: {v}"))).unwrap().unix_ms()
}

/// The instance ids an experiment gave its fault.
fn chosen(r: &Value) -> Vec<String> {
    serde_json::from_value(r["experiment"]["instances"].clone()).unwrap()
}

/// Every instance outside the blast radius never had a call failed by the fault; the one
/// inside did.
fn only_the_blast_radius_saw_it(seen: &BTreeMap<String, i64>, shops: &[Shop], r: &Value) {
    let inside = chosen(r);
    assert_eq!(inside.len(), 1, "{r:#}");
    for s in shops {
        let id = s.agent.instance_id();
        assert_eq!(
            seen.contains_key(id),
            inside.iter().any(|i| i == id),
            "{id}: seen {seen:?}, chosen {inside:?}"
        );
    }
}

/// Waits until the agents have reported calls to `dependency` (up to 10 s).
async fn reported_calls(api: &Api, dependency: &str) {
    let mut last = Value::Null;
    for _ in 0..1000 {
        let v = api.send(Method::GET, "/environments/prod/services/checkout/health", None).await;
        let calls: u64 = v["revisions"]
            .as_array()
            .into_iter()
            .flatten()
            .flat_map(|r| r["subjects"].as_array().into_iter().flatten())
            .filter(|s| s["kind"] == "dependency" && s["name"] == dependency)
            .filter_map(|s| s["totals"]["calls"].as_u64())
            .sum();
        if calls > 0 {
            return;
        }
        last = v;
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("no call to {dependency} reported in 10 s: {last}");
}

/// Checkout in an environment allowing faults, pricing's breaker disabled, and a shop (an
/// instance of the example under real traffic) per name.
struct Fleet {
    api: Api,
    shops: Vec<Shop>,
    stop_tx: tokio::sync::watch::Sender<bool>,
    _caches: tempfile::TempDir,
}

impl Fleet {
    async fn start(app: &TestApp, names: &[&str]) -> Fleet {
        let api = Api::login(&app.base).await;
        api.seed_allowing_faults().await;
        without_pricing_breaker(&api).await;
        let token = api.agent_token("prod", &["checkout"]).await;
        let caches = tempfile::tempdir().unwrap();
        let (stop_tx, stop) = tokio::sync::watch::channel(false);
        let mut shops = Vec::new();
        for name in names {
            shops.push(shop(&app.grpc, &token, caches.path(), name, &stop).await);
        }
        Fleet { api, shops, stop_tx, _caches: caches }
    }

    /// Stops the traffic and the agents.
    async fn end(self) {
        let _ = self.stop_tx.send(true);
        for s in self.shops {
            s.agent.shutdown().await;
        }
    }
}

async fn verdicts_on_real_agents(db: crate::backends::Db) {
    let Some(app) = TestApp::spawn_on(db).await else { return };
    let fleet = Fleet::start(&app, &["shop-a", "shop-b", "shop-c"]).await;
    let (api, shops) = (&fleet.api, &fleet.shops);
    let agents = || shops.iter().map(|s| s.agent.clone()).collect::<Vec<_>>();

    // 1. A hypothesis that fails before anything is injected: recommendations answer in
    // 20 ms, so their p99 is never 1 ms. Nothing is injected. The agents have reported
    // calls to recommendations before it starts, so its first reading (the last 15 s) has
    // them whatever the machine's speed.
    reported_calls(api, "recommendations").await;
    let impossible = json!([{"p99": {"dependency": "recommendations", "at_most": "1ms"}}]);
    let spec = experiment("impossible", answers_503("pricing"), impossible, "10s");
    let v = api.send(Method::POST, "/experiments", Some(json!({"experiment": spec, "reason": "e2e"}))).await;
    let watch = Watch::start(agents(), "pricing");
    let r = finished(api, v["id"].as_i64().unwrap(), Duration::from_secs(30)).await;
    let e = &r["experiment"];
    assert_eq!(e["verdict"], "aborted", "{r:#}");
    let why = e["why"].as_str().unwrap();
    assert!(
        why.contains("p99 of dependency recommendations <= 1ms was ") && why.contains("nothing was injected"),
        "{why}"
    );
    assert!(e["injected_at"].is_null() && e["instances"].is_null(), "{r:#}");
    let faults = api.send(Method::GET, "/audit?service=checkout&action=fault", None).await;
    assert_eq!(faults.as_array().map(Vec::len), Some(0), "a fault was set: {faults}");
    assert!(watch.stop().await.is_empty());

    // 2. Recommendations answering 503 on one instance: checkout serves its fallback, its
    // pricing calls go on. Passed; `run --wait` exits 0.
    let watch = Watch::start(agents(), "recommendations");
    let spec = experiment("recs-down", answers_503("recommendations"), pricing_holds(), "3s");
    let (code, id, out) = run_cli(api, &spec).await;
    let seen = watch.stop().await;
    let r = api.send(Method::GET, &format!("/experiments/{id}"), None).await;
    assert_eq!((code, r["experiment"]["verdict"].as_str()), (0, Some("passed")), "{out}\n{r:#}");
    let events: Vec<&str> =
        r["timeline"].as_array().unwrap().iter().map(|e| e["event"].as_str().unwrap()).collect();
    assert_eq!(events, ["started", "injected", "fault_removed", "ended"], "{r:#}");
    let phases: Vec<&str> =
        r["readings"].as_array().unwrap().iter().map(|x| x["phase"].as_str().unwrap()).collect();
    for phase in ["baseline", "injected", "recovery"] {
        assert!(phases.contains(&phase), "no {phase} reading: {r:#}");
    }
    only_the_blast_radius_saw_it(&seen, shops, &r);

    // 3. Pricing answering 503 on one instance: a third of its calls fail. Aborted within
    // abort_after (1 s) of the first violated reading, plus one reading interval and the
    // write; `run --wait` exits 4; the fault left every agent within a second.
    let watch = Watch::start(agents(), "pricing");
    let spec = experiment("pricing-down", answers_503("pricing"), pricing_holds(), "60s");
    let (code, id, out) = run_cli(api, &spec).await;
    let seen = watch.stop().await;
    let r = api.send(Method::GET, &format!("/experiments/{id}"), None).await;
    let e = &r["experiment"];
    assert_eq!((code, e["verdict"].as_str()), (4, Some("aborted")), "{out}\n{r:#}");
    assert!(e["why"].as_str().unwrap().contains("violated for"), "{r:#}");
    let first_violation = r["timeline"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["event"] == "violated")
        .map(|t| ms(&t["at"]))
        .expect("a violation in the timeline");
    let removed = ms(&e["fault_removed_at"]);
    let after = removed - first_violation;
    assert!((1_000..=3_000).contains(&after), "fault removed {after} ms after the first violation: {r:#}");
    assert!(removed < ms(&e["fault_expires_at"]) - 50_000, "removed by the abort, not by its expiry");
    only_the_blast_radius_saw_it(&seen, shops, &r);
    for (instance, last) in &seen {
        assert!(
            *last <= removed + 1_000,
            "{instance} still had the fault {} ms after its removal",
            last - removed
        );
    }
    let audit = api.send(Method::GET, "/audit?service=checkout&action=experiment", None).await;
    let actions: Vec<&str> =
        audit.as_array().unwrap().iter().map(|a| a["action"].as_str().unwrap()).collect();
    assert_eq!(actions.iter().filter(|a| **a == "experiment.start").count(), 3, "{audit:#}");
    assert_eq!(actions.iter().filter(|a| **a == "experiment.end").count(), 3, "{audit:#}");

    fleet.end().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ex_1_verdicts_on_real_agents_and_only_the_blast_radius_sees_the_fault_sqlite() {
    verdicts_on_real_agents(crate::backends::Db::Sqlite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ex_1_verdicts_on_real_agents_and_only_the_blast_radius_sees_the_fault_postgres() {
    verdicts_on_real_agents(crate::backends::Db::Postgres).await;
}

/// A scheduled experiment is started by the server itself at its time (no test hook: the
/// experiments' task, by the clock) and runs to its verdict on the agents.
async fn scheduled_on_real_agents(db: crate::backends::Db) {
    let Some(app) = TestApp::spawn_on(db).await else { return };
    let fleet = Fleet::start(&app, &["shop-a", "shop-b"]).await;
    let api = &fleet.api;

    let run_at = Timestamp::from_unix_ms(Timestamp::now().unix_ms() + 3_000);
    let spec = experiment("recs-down-nightly", answers_503("recommendations"), pricing_holds(), "2s");
    let body = json!({"kind": "experiment", "experiment": spec, "run_at": run_at, "reason": "nightly"});
    let c = api.send(Method::POST, "/environments/prod/scheduled-changes", Some(body)).await;
    let url = format!("/environments/prod/scheduled-changes/{}", c["id"]);
    let until = tokio::time::Instant::now() + Duration::from_secs(30);
    let c = loop {
        let c = api.send(Method::GET, &url, None).await;
        if c["state"] != "pending" && c["state"] != "running" {
            break c;
        }
        assert!(tokio::time::Instant::now() < until, "not started within 30 s: {c}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(c["state"], "applied", "{c}");
    let id = c["experiment_id"].as_i64().unwrap_or_else(|| panic!("no experiment: {c}"));
    let r = finished(api, id, Duration::from_secs(30)).await;
    assert_eq!(r["experiment"]["verdict"], "passed", "{r:#}");
    // Started at its time: not before, and within the task's interval (1 s) and a write.
    let late = ms(&r["experiment"]["created_at"]) - run_at.unix_ms();
    assert!((0..=2_000).contains(&late), "started {late} ms after its time: {r:#}");
    assert_eq!(r["experiment"]["created_by"], "admin", "{r:#}");
    assert_eq!(r["experiment"]["instances"].as_array().map(Vec::len), Some(1), "{r:#}");

    fleet.end().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ex_3_a_scheduled_experiment_starts_at_its_time_and_reaches_its_verdict_sqlite() {
    scheduled_on_real_agents(crate::backends::Db::Sqlite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ex_3_a_scheduled_experiment_starts_at_its_time_and_reaches_its_verdict_postgres() {
    scheduled_on_real_agents(crate::backends::Db::Postgres).await;
}

/// The server killed mid-experiment (SIGKILL: nothing removes the fault): the agent ends
/// it by itself at its expiry.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ex_2_server_killed_mid_experiment_agents_end_the_fault_at_its_expiry() {
    let data = tempfile::tempdir().unwrap();
    let server = BinServer::start(data.path(), "127.0.0.1:0", "127.0.0.1:0").await;
    let api = Api::login(&format!("http://{}", server.http)).await;
    api.seed_allowing_faults().await;
    without_pricing_breaker(&api).await;
    let token = api.agent_token("prod", &["checkout"]).await;
    let cache = tempfile::tempdir().unwrap();
    let agent = Agent::builder(format!("http://{}", server.grpc), &token, "prod", "checkout")
        .cache_dir(cache.path())
        .defaults(crate::checkout_app::safe_defaults())
        .sync_settings(levee_agent::SyncClientSettings {
            status_interval: Duration::from_millis(200),
            ..fast_sync()
        })
        .build()
        .expect("agent builds");
    agent.wait_for_initial_sync(Duration::from_secs(10)).await.expect("initial sync");
    let (_url, _recs) = start_example(&agent).await;
    // Readiness is reported without traffic; the fault on pricing does not change it.
    let spec = json!({
        "name": "killed", "environment": "prod", "service": "checkout",
        "fault": answers_503("pricing"), "blast_radius": {"all": true},
        "duration": "4s", "baseline": "1s", "recovery": "0s", "abort_after": "4s",
        "hypothesis": [{"ready": true}],
    });
    let v = api.send(Method::POST, "/experiments", Some(json!({"experiment": spec, "reason": "e2e"}))).await;
    let id = v["id"].as_i64().unwrap();
    let until = tokio::time::Instant::now() + Duration::from_secs(20);
    while probe(&agent, "pricing").await != Some(true) {
        assert!(tokio::time::Instant::now() < until, "the fault never reached the agent");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // The agents may have the fault before the run records when it expires.
    let expires = loop {
        let r = api.send(Method::GET, &format!("/experiments/{id}"), None).await;
        if !r["experiment"]["fault_expires_at"].is_null() {
            break ms(&r["experiment"]["fault_expires_at"]);
        }
        assert!(tokio::time::Instant::now() < until, "the run never recorded its fault: {r:#}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    server.kill().await;
    let give_up = tokio::time::Instant::now() + Duration::from_secs(10);
    while probe(&agent, "pricing").await != Some(false) {
        assert!(tokio::time::Instant::now() < give_up, "the fault outlived its expiry on the agent");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let late = Timestamp::now().unix_ms() - expires;
    assert!((-100..=1_000).contains(&late), "the fault ended {late} ms from its expiry");
    agent.shutdown().await;
}

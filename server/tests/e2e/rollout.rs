//! Staged rollouts with real agents (issue 18 item 2, CD-5, CD-6): a staged policy change
//! reaches the cohort only, an immediate change during it reaches everyone, an abort puts
//! the previous policy back for all, an instance joining mid-rollout gets its cohort's
//! revision (and keeps it after a restart), and a server killed mid-rollout resumes it at
//! its stage. Which agent received what is read from the ACK history.

use std::collections::BTreeSet;
use std::path::Path;
use std::time::Duration;

use levee_agent::Agent;
use levee_server::rollout::cohort_bucket;
use reqwest::Method;
use serde_json::{Value, json};

use crate::helpers::TestApp;
use crate::support::{Api, BinServer, fast_sync, wait_until};

/// An agent of `prod/checkout` named `name` (its cohort is drawn from the name).
fn named_agent(grpc: &str, token: &str, cache: &Path, name: &str) -> Agent {
    Agent::builder(grpc, token, "prod", "checkout")
        .instance_name(name)
        .cache_dir(cache.join(name))
        .defaults(crate::checkout_app::safe_defaults())
        .sync_settings(fast_sync())
        .build()
        .expect("agent builds")
}

/// Stages policy changes of `prod` with two stages: two instances, then everyone, each
/// baking for `bake`.
async fn stage_policies(api: &Api, bake: &str) {
    api.send(
        Method::PUT,
        "/environments/prod/rollout-settings",
        Some(json!({"reason": "e2e", "settings": {"staged": ["policy"], "plan": {
            "stages": [{"percent": 0, "instances": 2}, {"percent": 100}], "bake": bake}}})),
    )
    .await;
}

/// Writes a policy whose pricing timeout is `ms` (staged as the environment says); returns
/// the write's answer.
async fn write_policy(api: &Api, ms: u64) -> Value {
    let current = api.send(Method::GET, "/environments/prod/services/checkout/policy", None).await;
    let rev = current["revision"].as_u64().unwrap().to_string();
    let mut policy = current["policy"].clone();
    policy["dependencies"]["pricing"]["attempt_timeout"] = json!(format!("{ms}ms"));
    api.send_with(
        Method::PUT,
        "/environments/prod/services/checkout/policy",
        Some(json!({"policy": policy, "reason": "e2e staged change"})),
        &[("if-match", &format!("\"{rev}\""))],
    )
    .await
}

async fn rollout(api: &Api, id: i64) -> Value {
    api.send(Method::GET, &format!("/environments/prod/rollouts/{id}"), None).await
}

/// Polls rollout `id` until it is no longer running (halted, aborted or completed);
/// returns it as last read.
async fn wait_ended(api: &Api, id: i64) -> Value {
    for _ in 0..3000 {
        let r = rollout(api, id).await;
        if r["rollout"]["state"] != "running" {
            return r;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("rollout {id} was still running after 30 s: {}", rollout(api, id).await);
}

/// Waits until the rollout's stage covers two connected instances and each of them applied
/// the candidate; returns the rollout.
async fn cohort_of_two(api: &Api, id: i64) -> Value {
    for _ in 0..1000 {
        let r = rollout(api, id).await;
        if r["cohort"]["instances"] == 2 && r["cohort"]["on_revision"] == 2 {
            return r;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("the cohort never covered two instances: {}", rollout(api, id).await);
}

fn names_in_cohort(r: &Value) -> BTreeSet<String> {
    r["instances"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|i| i["in_cohort"] == true)
        .map(|i| levee_agent::instance_name_of(i["instance_id"].as_str().unwrap()).to_string())
        .collect()
}

/// Instance names that ACKed any of `revisions`.
async fn ackers(store: &levee_server::db::Store, revisions: &[u64]) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for &rev in revisions {
        for i in store.acking_instances("prod", "checkout", rev).await.unwrap() {
            out.insert(levee_agent::instance_name_of(&i).to_string());
        }
    }
    out
}

async fn wait_revision(agents: &[(String, Agent)], want: impl Fn(&str) -> u64, what: &str) {
    for (name, a) in agents {
        let want = want(name);
        wait_until(&format!("{name} on revision {want} ({what})"), Duration::from_secs(10), || {
            a.status().revision == want
        })
        .await;
    }
}

on_both_backends! {
/// A staged policy change reaches the cohort only; a flag flip during the rollout reaches
/// every instance at once (the rest over the policy they keep); an abort puts the previous
/// policy back for all in one revision. No instance outside the cohort ever ACKed a
/// revision of the candidate line.
async fn staged_policy_reaches_the_cohort_only_flips_reach_everyone_and_abort_reverts(app) {
    let api = Api::login(&app.base).await;
    api.seed().await;
    stage_policies(&api, "1h").await;
    let token = api.agent_token("prod", &["checkout"]).await;
    let caches = tempfile::tempdir().unwrap();
    let agents: Vec<(String, Agent)> = (0..5)
        .map(|i| {
            let name = format!("pod-{i}");
            let a = named_agent(&app.grpc, &token, caches.path(), &name);
            (name, a)
        })
        .collect();
    for (_, a) in &agents {
        a.wait_for_initial_sync(Duration::from_secs(10)).await.unwrap();
    }
    let before = agents[0].1.status().revision;
    for _ in 0..500 {
        if app.store().agents("prod", "checkout").await.unwrap().iter().filter(|a| a.connected).count() == 5 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }

    let written = write_policy(&api, 250).await;
    let id = written["rollout"]["id"].as_i64().expect("the write started a rollout");
    let candidate = written["revision"].as_u64().unwrap();
    assert_eq!(written["rollout"]["stable_revision"], before, "{written}");
    let r = cohort_of_two(&api, id).await;
    let cohort = names_in_cohort(&r);
    assert_eq!(cohort.len(), 2, "{r}");
    wait_revision(&agents, |n| if cohort.contains(n) { candidate } else { before }, "staged").await;

    // The emergency lane during the rollout: everyone gets the flip at once.
    let flipped = api.set_recommendations(false).await;
    let r = rollout(&api, id).await;
    let (stable2, candidate2) =
        (r["rollout"]["stable_revision"].as_u64().unwrap(), r["rollout"]["candidate_revision"].as_u64().unwrap());
    assert_eq!(candidate2, flipped);
    assert!(stable2 > candidate && stable2 < candidate2, "{r}");
    wait_revision(&agents, |n| if cohort.contains(n) { candidate2 } else { stable2 }, "flip").await;
    for (_, a) in &agents {
        assert!(!a.dependency("recommendations").is_enabled(), "the flip reached every instance");
    }

    // Abort: one revision with the previous policy for every instance.
    let aborted = api
        .send(Method::POST, &format!("/environments/prod/rollouts/{id}/abort"), Some(json!({"reason": "e2e"})))
        .await;
    assert_eq!(aborted["state"], "aborted", "{aborted}");
    let revert = aborted["revert_revision"].as_u64().unwrap();
    wait_revision(&agents, |_| revert, "abort").await;
    let stable_hash = app.store().revision("prod", "checkout", stable2).await.unwrap().unwrap().hash;
    assert_eq!(agents[0].1.status().hash, stable_hash, "the revert is the stable content");

    let outside = ackers(app.store(), &[candidate, candidate2]).await;
    assert!(outside.is_subset(&cohort), "instances outside the cohort ACKed the candidate: {outside:?} vs {cohort:?}");
    // Every stage and decision is audited.
    let audit = api.send(Method::GET, "/audit?service=checkout", None).await;
    let actions: Vec<&str> = audit.as_array().unwrap().iter().filter_map(|a| a["action"].as_str()).collect();
    for want in ["rollout.stage", "rollout.abort"] {
        assert!(actions.contains(&want), "{want} audited: {actions:?}");
    }
    for (_, a) in agents {
        a.shutdown().await;
    }
}
}

on_both_backends! {
/// CD-5: an instance that starts during a staged rollout gets its cohort's revision, and
/// keeps the same cohort after a restart (a new process under the same instance name).
async fn cd_5_an_instance_joining_mid_rollout_gets_its_cohorts_revision_across_restarts(app) {
    let api = Api::login(&app.base).await;
    api.seed().await;
    stage_policies(&api, "1h").await;
    let token = api.agent_token("prod", &["checkout"]).await;
    let caches = tempfile::tempdir().unwrap();
    let first: Vec<(String, Agent)> =
        (0..3).map(|i| (format!("pod-{i}"), named_agent(&app.grpc, &token, caches.path(), &format!("pod-{i}")))).collect();
    for (_, a) in &first {
        a.wait_for_initial_sync(Duration::from_secs(10)).await.unwrap();
    }
    let before = first[0].1.status().revision;
    for _ in 0..500 {
        if app.store().agents("prod", "checkout").await.unwrap().iter().filter(|a| a.connected).count() == 3 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let written = write_policy(&api, 250).await;
    let id = written["rollout"]["id"].as_i64().unwrap();
    let candidate = written["revision"].as_u64().unwrap();
    cohort_of_two(&api, id).await;
    let row = app.store().rollout(id).await.unwrap().unwrap();
    // A name inside the cohort's buckets and one outside, for instances not started yet.
    let name_where = |inside: bool| {
        (10..10_000).map(|i| format!("late-{i}")).find(|n| (cohort_bucket(&row, n) < row.threshold) == inside).unwrap()
    };
    for (name, want) in [(name_where(true), candidate), (name_where(false), before)] {
        for round in 0..2 {
            let a = named_agent(&app.grpc, &token, caches.path(), &name);
            a.wait_for_initial_sync(Duration::from_secs(10)).await.unwrap();
            wait_until(&format!("{name} (start {round}) on revision {want}"), Duration::from_secs(10), || {
                a.status().revision == want
            })
            .await;
            a.shutdown().await;
        }
    }
    for (_, a) in first {
        a.shutdown().await;
    }
}
}

/// CD-6: the server is killed (SIGKILL) during a staged rollout and starts again: the
/// rollout resumes at its stage, every agent stays on its side's revision, and promoting
/// it then starts the last stage: everyone gets the candidate.
async fn restart_mid_rollout(db: Option<String>) {
    let data = tempfile::tempdir().unwrap();
    let start = |http: String, grpc: String| {
        let env: Vec<(&str, String)> = db.iter().map(|u| ("LEVEE_DATABASE_URL", u.clone())).collect();
        let data = data.path().to_path_buf();
        async move {
            let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
            BinServer::start_with(&data, &http, &grpc, &env).await
        }
    };
    let server = start("127.0.0.1:0".into(), "127.0.0.1:0".into()).await;
    let (http, grpc) = (server.http, server.grpc);
    let base = format!("http://{http}");
    let api = Api::login(&base).await;
    api.seed().await;
    stage_policies(&api, "1h").await;
    let token = api.agent_token("prod", &["checkout"]).await;
    let caches = tempfile::tempdir().unwrap();
    let agents: Vec<(String, Agent)> = (0..4)
        .map(|i| {
            (
                format!("pod-{i}"),
                named_agent(&format!("http://{grpc}"), &token, caches.path(), &format!("pod-{i}")),
            )
        })
        .collect();
    for (_, a) in &agents {
        a.wait_for_initial_sync(Duration::from_secs(10)).await.unwrap();
    }
    let before = agents[0].1.status().revision;
    for _ in 0..500 {
        let fleet = api.send(Method::GET, "/environments/prod/services/checkout/agents", None).await;
        if fleet.as_array().unwrap().iter().filter(|a| a["connected"] == true).count() == 4 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let written = write_policy(&api, 250).await;
    let id = written["rollout"]["id"].as_i64().unwrap();
    let candidate = written["revision"].as_u64().unwrap();
    let r = cohort_of_two(&api, id).await;
    let cohort = names_in_cohort(&r);
    wait_revision(&agents, |n| if cohort.contains(n) { candidate } else { before }, "staged").await;

    server.kill().await;
    let server = start(http.to_string(), grpc.to_string()).await;
    let api = Api::login(&base).await;
    for (_, a) in &agents {
        wait_until("the agent back on the restarted server", Duration::from_secs(20), || {
            a.status().connected
        })
        .await;
    }
    let r = rollout(&api, id).await;
    assert_eq!(
        (r["rollout"]["state"].as_str(), r["rollout"]["stage"].as_u64()),
        (Some("running"), Some(0)),
        "{r}"
    );
    assert_eq!(names_in_cohort(&r), cohort, "the same cohort after the restart");
    // No agent was moved to the wrong side while the server came back.
    wait_revision(&agents, |n| if cohort.contains(n) { candidate } else { before }, "after the restart")
        .await;

    let promoted = api
        .send(
            Method::POST,
            &format!("/environments/prod/rollouts/{id}/promote"),
            Some(json!({"reason": "e2e"})),
        )
        .await;
    assert_eq!(
        (promoted["state"].as_str(), promoted["stage"].as_u64()),
        (Some("running"), Some(1)),
        "{promoted}"
    );
    wait_revision(&agents, |_| candidate, "the last stage: everyone").await;
    for (_, a) in agents {
        a.shutdown().await;
    }
    server.kill().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cd_6_a_server_restart_mid_rollout_resumes_it_at_its_stage_sqlite() {
    restart_mid_rollout(None).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cd_6_a_server_restart_mid_rollout_resumes_it_at_its_stage_postgres() {
    let Some(url) = crate::helpers::postgres_url().await else { return };
    restart_mid_rollout(Some(url)).await;
}

/// The API refuses a policy change while a rollout is in progress, naming the rollout and
/// what to do; a bad plan names the field and its range.
#[tokio::test]
async fn a_policy_change_during_a_rollout_and_a_bad_plan_are_refused_with_what_to_do() {
    let app = TestApp::spawn().await;
    let api = Api::login(&app.base).await;
    api.seed().await;
    let bad = app
        .client
        .put(app.url("/api/v1/environments/prod/rollout-settings"))
        .bearer_auth(&api.token)
        .json(&json!({"reason": "e2e", "settings": {"staged": ["policy"], "plan": {"stages": [{"percent": 50}]}}}))
        .send()
        .await
        .unwrap();
    assert_eq!(bad.status(), 422);
    let body: Value = bad.json().await.unwrap();
    assert!(body["detail"].as_str().unwrap().contains("stages[0].percent"), "{body}");
    stage_policies(&api, "1h").await;
    // No instance is connected: the write asks for staging (the setting alone would deliver
    // it at once, with no instance beside a cohort to compare it with).
    let current = api.send(Method::GET, "/environments/prod/services/checkout/policy", None).await;
    let mut staged = current["policy"].clone();
    staged["dependencies"]["pricing"]["attempt_timeout"] = json!("250ms");
    let written = api
        .send_with(
            Method::PUT,
            "/environments/prod/services/checkout/policy",
            Some(json!({"policy": staged, "reason": "e2e staged change", "staged": true})),
            &[("if-match", &format!("\"{}\"", current["revision"]))],
        )
        .await;
    assert!(written["rollout"]["id"].is_i64(), "{written}");
    let current = api.send(Method::GET, "/environments/prod/services/checkout/policy", None).await;
    let res = app
        .client
        .put(app.url("/api/v1/environments/prod/services/checkout/policy"))
        .bearer_auth(&api.token)
        .header("if-match", format!("\"{}\"", current["revision"]))
        .json(&json!({"policy": current["policy"], "reason": "another", "staged": false}))
        .send()
        .await
        .unwrap();
    // The same policy: nothing changes, nothing refused.
    assert_eq!(res.status(), 200);
    let mut other = current["policy"].clone();
    other["dependencies"]["pricing"]["attempt_timeout"] = json!("200ms");
    let res = app
        .client
        .put(app.url("/api/v1/environments/prod/services/checkout/policy"))
        .bearer_auth(&api.token)
        .header("if-match", format!("\"{}\"", current["revision"]))
        .json(&json!({"policy": other, "reason": "another"}))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 409);
    let body: Value = res.json().await.unwrap();
    assert_eq!(body["type"], "urn:levee:problem:rollout-conflict", "{body}");
    assert!(body["detail"].as_str().unwrap().contains("promote or abort"), "{body}");
}

/// Writes a policy whose recommendations attempt timeout is `timeout` (staged as the
/// environment says); returns the write's answer.
async fn write_recs_timeout(api: &Api, timeout: &str) -> Value {
    let current = api.send(Method::GET, "/environments/prod/services/checkout/policy", None).await;
    let rev = current["revision"].as_u64().unwrap().to_string();
    let mut policy = current["policy"].clone();
    policy["dependencies"]["recommendations"]["attempt_timeout"] = json!(timeout);
    api.send_with(
        Method::PUT,
        "/environments/prod/services/checkout/policy",
        Some(json!({"policy": policy, "reason": "e2e staged change"})),
        &[("if-match", &format!("\"{rev}\""))],
    )
    .await
}

/// A receiver of the alert webhook: its URL and what it was POSTed.
async fn webhook() -> (String, std::sync::Arc<tokio::sync::Mutex<Vec<Value>>>) {
    let got: std::sync::Arc<tokio::sync::Mutex<Vec<Value>>> = Default::default();
    let seen = got.clone();
    let receiver = axum::Router::new().route(
        "/hook",
        axum::routing::post(move |axum::Json(v): axum::Json<Value>| {
            let seen = seen.clone();
            async move {
                seen.lock().await.push(v);
                axum::http::StatusCode::NO_CONTENT
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/hook", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, receiver).await.unwrap() });
    (url, got)
}

/// CD-4 and issue 18's end-to-end rollout: five checkout instances under real traffic. A
/// staged change that times out every recommendations call is halted by the server while
/// it is in the canary cohort (two instances), on the agents' health alone, and reverted
/// for everyone; no instance outside the cohort ever ACKed it; the halt is audited and
/// POSTed to the webhook. Then a good change completes every stage with the same traffic.
async fn bad_change_halted_at_the_canary_good_change_completes(db: crate::backends::Db) {
    let (hook, posted) = webhook().await;
    let Some(app) =
        TestApp::spawn_on_with(db, |s| s.alert_webhook_url = Some(levee_server::config::Secret::new(hook)))
            .await
    else {
        return;
    };
    let api = Api::login(&app.base).await;
    api.seed().await;
    stage_policies(&api, "1h").await;
    let token = api.agent_token("prod", &["checkout"]).await;
    let caches = tempfile::tempdir().unwrap();
    let (stop_tx, stop) = tokio::sync::watch::channel(false);
    let mut shops = Vec::new();
    for i in 0..5 {
        shops.push(crate::support::shop(&app.grpc, &token, caches.path(), &format!("pod-{i}"), &stop).await);
    }
    let agents: Vec<(String, Agent)> = shops.iter().map(|s| (s.name.clone(), s.agent.clone())).collect();
    connected(&app, 5).await;

    // The bad change: recommendations answer in 20 ms, the candidate gives them 1 ms.
    let written = write_recs_timeout(&api, "1ms").await;
    let id = written["rollout"]["id"].as_i64().expect("the write started a rollout");
    let candidate = written["revision"].as_u64().unwrap();
    let halted = wait_ended(&api, id).await;
    assert_eq!(halted["rollout"]["state"], "halted", "{halted}");
    assert_eq!(halted["rollout"]["stage"], 0, "halted in the canary stage: {halted}");
    let outcome = halted["rollout"]["outcome"].as_str().unwrap();
    assert!(outcome.contains("dependency recommendations:"), "{outcome}");
    assert!(outcome.contains("did not succeed"), "{outcome}");
    let cohort = names_in_cohort(&halted);
    assert_eq!(cohort.len(), 2, "{halted}");
    let revert = halted["rollout"]["revert_revision"].as_u64().unwrap();
    wait_revision(&agents, |_| revert, "the revert").await;

    // The canary received it; nobody else ever did.
    let received = ackers(app.store(), &[candidate]).await;
    assert!(!received.is_empty(), "the cohort applied the candidate before the halt");
    assert!(
        received.is_subset(&cohort),
        "instances outside the cohort ACKed the candidate: {received:?} vs {cohort:?}"
    );
    let audit = api.send(Method::GET, "/audit?service=checkout&action=rollout.halt", None).await;
    let halt = &audit.as_array().unwrap()[0];
    assert_eq!(halt["actor"], "levee", "{halt}");
    let mut hooked = Vec::new();
    for _ in 0..1000 {
        hooked = posted.lock().await.clone();
        if !hooked.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let event = hooked.first().expect("the halt was POSTed to the webhook");
    assert_eq!(event["event"], "rollout_halted", "{event}");
    assert_eq!(
        (event["rollout"].as_i64(), event["revert_revision"].as_u64()),
        (Some(id), Some(revert)),
        "{event}"
    );
    assert!(event["reason"].as_str().unwrap().contains("recommendations"), "{event}");

    // The good change, baking 1 s per stage, under the same traffic: every stage, then done.
    stage_policies(&api, "1s").await;
    let written = write_recs_timeout(&api, "150ms").await;
    let id = written["rollout"]["id"].as_i64().expect("the write started a rollout");
    let candidate = written["revision"].as_u64().unwrap();
    let done = wait_ended(&api, id).await;
    assert_eq!(done["rollout"]["state"], "completed", "{done}");
    wait_revision(&agents, |_| candidate, "the completed rollout").await;
    let audit = api.send(Method::GET, "/audit?service=checkout&action=rollout.stage", None).await;
    let stages: Vec<&str> = audit
        .as_array()
        .unwrap()
        .iter()
        .filter(|a| a["target"] == format!("rollout {id}"))
        .filter_map(|a| a["detail"].as_str())
        .collect();
    assert!(stages.iter().any(|d| d.starts_with("stage 2 of 2 starts")), "{stages:?}");
    assert!(stages.iter().any(|d| d.starts_with("completed")), "{stages:?}");

    let _ = stop_tx.send(true);
    for s in shops {
        s.agent.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cd_4_a_bad_change_is_halted_at_the_canary_and_a_good_one_completes_sqlite() {
    bad_change_halted_at_the_canary_good_change_completes(crate::backends::Db::Sqlite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cd_4_a_bad_change_is_halted_at_the_canary_and_a_good_one_completes_postgres() {
    bad_change_halted_at_the_canary_good_change_completes(crate::backends::Db::Postgres).await;
}

/// A staged change that hurts only the service's own inbound route — it sheds every GET
/// as operator load shedding, while the dependencies stay healthy (the cohort just stops
/// calling them) — is halted at the canary on the route's health windows, which the agents'
/// admission layer counts, and reverted; nobody outside the cohort received it. SQLite
/// only: the route windows take the storage path of the dependency windows that CD-4 runs
/// on both backends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_change_that_hurts_only_an_inbound_route_is_halted_at_the_canary() {
    let app = TestApp::spawn_on(crate::backends::Db::Sqlite).await.expect("SQLite is always available");
    let api = Api::login(&app.base).await;
    api.seed().await;
    stage_policies(&api, "1h").await;
    let token = api.agent_token("prod", &["checkout"]).await;
    let caches = tempfile::tempdir().unwrap();
    let (stop_tx, stop) = tokio::sync::watch::channel(false);
    let mut shops = Vec::new();
    for i in 0..5 {
        shops.push(crate::support::shop(&app.grpc, &token, caches.path(), &format!("pod-{i}"), &stop).await);
    }
    let agents: Vec<(String, Agent)> = shops.iter().map(|s| (s.name.clone(), s.agent.clone())).collect();
    connected(&app, 5).await;

    let current = api.send(Method::GET, "/environments/prod/services/checkout/policy", None).await;
    let rev = current["revision"].as_u64().unwrap().to_string();
    let mut policy = current["policy"].clone();
    policy["inbound"]["shed_sheddable_percent"] = json!(100.0);
    let written = api
        .send_with(
            Method::PUT,
            "/environments/prod/services/checkout/policy",
            Some(json!({"policy": policy, "reason": "e2e: shed every GET"})),
            &[("if-match", &format!("\"{rev}\""))],
        )
        .await;
    let id = written["rollout"]["id"].as_i64().expect("the write started a rollout");
    let candidate = written["revision"].as_u64().unwrap();
    let halted = wait_ended(&api, id).await;
    assert_eq!(halted["rollout"]["state"], "halted", "{halted}");
    assert_eq!(halted["rollout"]["stage"], 0, "halted in the canary stage: {halted}");
    let outcome = halted["rollout"]["outcome"].as_str().unwrap();
    // Not quite 100 %: the cohort's first window on the candidate holds a few requests
    // served before it arrived.
    assert!(outcome.contains(": route GET /checkout/{user}: "), "{outcome}");
    assert!(outcome.contains(" shed;"), "{outcome}");
    assert!(outcome.contains("against 0.0 % of the rest's"), "{outcome}");
    // The API shows the rule's reading subject by subject, both sides' counts.
    let route = halted["verdict"]["subjects"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["kind"] == "route" && s["name"] == "GET /checkout/{user}")
        .unwrap_or_else(|| panic!("the route in the verdict: {halted}"));
    assert_eq!((&route["judged"], &route["worse"]), (&json!(true), &json!(true)), "{route}");
    assert!(route["cohort"]["shed"].as_u64().unwrap() > 0, "{route}");
    assert_eq!(route["rest"]["shed"], 0, "{route}");
    assert_eq!(halted["verdict"]["health_compared"], true, "{halted}");
    let cohort = names_in_cohort(&halted);
    assert_eq!(cohort.len(), 2, "{halted}");
    let revert = halted["rollout"]["revert_revision"].as_u64().unwrap();
    wait_revision(&agents, |_| revert, "the revert").await;
    let received = ackers(app.store(), &[candidate]).await;
    assert!(!received.is_empty(), "the cohort applied the candidate before the halt");
    assert!(received.is_subset(&cohort), "outside the cohort: {received:?} vs {cohort:?}");

    let _ = stop_tx.send(true);
    for s in shops {
        s.agent.shutdown().await;
    }
}

/// Waits until the server counts `n` connected instances of prod/checkout.
async fn connected(app: &TestApp, n: usize) {
    for _ in 0..1000 {
        if app.store().agents("prod", "checkout").await.unwrap().iter().filter(|a| a.connected).count() == n {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("the server never counted {n} connected instances");
}

on_both_backends! {
/// Policy changes are staged by default (an environment without a setting stages them),
/// once the service has two connected instances: a cohort and one beside it. With one
/// instance the change is delivered at once (a rollout would judge it on its NACKs alone
/// while blocking the next policy change for every stage's bake time), and a write that
/// says `"staged": false` is immediate whatever the count. Flag flips are never staged.
async fn policy_changes_are_staged_by_default_once_two_instances_are_connected(app) {
    let api = Api::login(&app.base).await;
    api.seed().await;
    let settings = api.send(Method::GET, "/environments/prod/rollout-settings", None).await;
    assert_eq!(settings["staged"], json!(["policy"]), "{settings}");
    let token = api.agent_token("prod", &["checkout"]).await;
    let caches = tempfile::tempdir().unwrap();
    let first = named_agent(&app.grpc, &token, caches.path(), "pod-0");
    first.wait_for_initial_sync(Duration::from_secs(10)).await.unwrap();
    connected(&app, 1).await;

    // One instance: at once.
    let written = write_policy(&api, 250).await;
    assert!(written["rollout"].is_null(), "{written}");
    let rev = written["revision"].as_u64().unwrap();
    wait_until("pod-0 on the change", Duration::from_secs(10), || first.status().revision == rev).await;

    // Two instances: staged with the default plan (5 % first, at least one instance).
    let second = named_agent(&app.grpc, &token, caches.path(), "pod-1");
    second.wait_for_initial_sync(Duration::from_secs(10)).await.unwrap();
    connected(&app, 2).await;
    let written = write_policy(&api, 260).await;
    let id = written["rollout"]["id"].as_i64().expect("staged by default");
    assert_eq!(written["rollout"]["plan"]["stages"][0]["percent"], 5, "{written}");
    assert_eq!(written["rollout"]["stable_revision"], rev, "{written}");
    // A flip meanwhile is not staged: both instances get it.
    let flipped = api.set_recommendations(false).await;
    for a in [&first, &second] {
        wait_until("the flip on both instances", Duration::from_secs(10), || {
            !a.dependency("recommendations").is_enabled()
        })
        .await;
    }
    let r = rollout(&api, id).await;
    assert_eq!(r["rollout"]["candidate_revision"], flipped, "{r}");
    api.send(Method::POST, &format!("/environments/prod/rollouts/{id}/abort"), Some(json!({"reason": "e2e"})))
        .await;

    // "staged": false: at once, two instances or not.
    let current = api.send(Method::GET, "/environments/prod/services/checkout/policy", None).await;
    let mut policy = current["policy"].clone();
    policy["dependencies"]["pricing"]["attempt_timeout"] = json!("270ms");
    let written = api
        .send_with(
            Method::PUT,
            "/environments/prod/services/checkout/policy",
            Some(json!({"policy": policy, "reason": "e2e immediate", "staged": false})),
            &[("if-match", &format!("\"{}\"", current["revision"]))],
        )
        .await;
    assert!(written["rollout"].is_null(), "{written}");
    let rev = written["revision"].as_u64().unwrap();
    for a in [&first, &second] {
        wait_until("the immediate change on both", Duration::from_secs(10), || a.status().revision == rev).await;
    }
    first.shutdown().await;
    second.shutdown().await;
}
}

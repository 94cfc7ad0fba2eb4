//! Experiments are changes that approval rules cover (issue 23): where an environment's
//! rule names `experiment`, starting one proposes it as a change request instead; a second
//! person approves that exact definition, applying it starts exactly that definition; an
//! edit voids the approval; break-glass starts at once, audited as a bypass; and
//! `levee experiment run` says approval is pending (exit 5), or with `--wait` waits for the
//! decision (rejected: exit 6; approved: applies it and exits with the verdict) — on SQLite
//! and on PostgreSQL. A scheduled experiment is gated when scheduled and again when it
//! starts, as its author is then.

use levee_agent::policy::Timestamp;
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

use crate::helpers::{TestApp, assert_problem};

const REQS: &str = "/api/v1/environments/prod/change-requests";

async fn rules(app: &TestApp, kinds: &[&str]) {
    let body = json!({"kinds": kinds, "reason": "game days are changes too"});
    let (s, _, b) = app.call(Method::PUT, "/api/v1/environments/prod/approval-rules", Some(body)).await;
    assert_eq!(s, StatusCode::OK, "{b}");
}

/// An experiment on checkout: no agent reports here, so once started its baseline has no
/// data and it ends `aborted` with nothing injected.
fn spec(name: &str, duration: &str) -> Value {
    json!({
        "name": name, "environment": "prod", "service": "checkout",
        "fault": {"dependency": "recommendations", "action": {"type": "abort", "status": 503}},
        "blast_radius": {"instances": 1},
        "duration": duration, "baseline": "0s", "recovery": "0s", "abort_after": "1s",
        "hypothesis": [{"ready": true}],
    })
}

fn start(spec: Value) -> Value {
    json!({"experiment": spec, "reason": "after the deploy"})
}

async fn audit_actions(app: &TestApp) -> Vec<Value> {
    let (_, _, a) = app.call(Method::GET, "/api/v1/audit?environment=prod&limit=50", None).await;
    a.as_array().unwrap().clone()
}

on_both_backends! {
async fn starting_an_experiment_where_a_rule_covers_them_proposes_it_for_a_second_person(app) {
    app.seed().await;
    let alice = app.user("alice", "operator").await;
    let bob = app.user("bob", "operator").await;
    let vic = app.user("vic", "viewer").await;

    // No rule: an operator starts it at once.
    let (s, _, e) = app.call_as(&alice, Method::POST, "/api/v1/experiments", Some(start(spec("free", "5s"))), &[]).await;
    assert_eq!(s, StatusCode::CREATED, "{e}");

    // The rules form takes the new kind; the API lists it.
    rules(&app, &["experiment"]).await;
    let (_, _, r) = app.call(Method::GET, "/api/v1/environments/prod/approval-rules", None).await;
    assert_eq!(r["kinds"], json!(["experiment"]));

    // A viewer may not even propose one.
    let (s, _, b) = app.call_as(&vic, Method::POST, "/api/v1/experiments", Some(start(spec("v", "5s"))), &[]).await;
    assert_eq!(s, StatusCode::FORBIDDEN, "{b}");

    // Starting proposes: 202, nothing started, the request holds the whole definition.
    let (s, _, p) =
        app.call_as(&alice, Method::POST, "/api/v1/experiments", Some(start(spec("recs-down", "5s"))), &[]).await;
    assert_eq!(s, StatusCode::ACCEPTED, "{p}");
    let msg = p["message"].as_str().unwrap();
    assert!(msg.starts_with("approval pending") && msg.contains("nothing started"), "{msg}");
    let req = &p["change_request"];
    assert_eq!((req["kind"].as_str(), req["state"].as_str()), (Some("experiment"), Some("open")), "{p}");
    assert_eq!((req["service"].as_str(), req["target"].as_str()), (Some("checkout"), Some("recs-down")));
    assert_eq!(req["proposed"]["duration"], "5s", "{p}");
    assert!(req["experiment_id"].is_null());
    let diff = req["diff"].as_array().unwrap();
    assert!(diff.iter().any(|d| d["path"].as_str().is_some_and(|p| p.contains("fault"))), "{p}");
    let (_, _, list) = app.call(Method::GET, "/api/v1/experiments?environment=prod", None).await;
    assert_eq!(list.as_array().unwrap().len(), 1, "only the first one started: {list}");
    let url = format!("{REQS}/{}", req["id"]);

    // Nobody approves their own; a viewer approves nothing; applying before approval is 404.
    let ok = json!({"version": 1, "reason": "reviewed the blast radius"});
    let (s, h, b) = app.call_as(&alice, Method::POST, &format!("{url}/approve"), Some(ok.clone()), &[]).await;
    assert_problem(s, &h, &b, StatusCode::FORBIDDEN);
    let (s, _, b) = app.call_as(&vic, Method::POST, &format!("{url}/approve"), Some(ok.clone()), &[]).await;
    assert_eq!(s, StatusCode::FORBIDDEN, "{b}");
    let apply = json!({"reason": "go"});
    let (s, _, b) = app.call_as(&alice, Method::POST, &format!("{url}/apply"), Some(apply.clone()), &[]).await;
    assert_eq!(s, StatusCode::NOT_FOUND, "{b}");

    // Approved, then edited by its proposer (a longer run): the approval is void, and the
    // edited definition needs its own.
    let (s, _, b) = app.call_as(&bob, Method::POST, &format!("{url}/approve"), Some(ok.clone()), &[]).await;
    assert_eq!((s, b["state"].as_str()), (StatusCode::OK, Some("approved")), "{b}");
    let edit = json!({"kind": "experiment", "experiment": spec("recs-down", "50s"), "reason": "longer"});
    let (s, _, b) = app.call_as(&alice, Method::PUT, &url, Some(edit), &[]).await;
    assert_eq!((s, b["state"].as_str(), b["version"].as_u64()), (StatusCode::OK, Some("open"), Some(2)), "{b}");
    let (s, _, b) = app.call_as(&alice, Method::POST, &format!("{url}/apply"), Some(apply.clone()), &[]).await;
    assert_eq!(s, StatusCode::NOT_FOUND, "the edit voided the approval: {b}");
    let ok2 = json!({"version": 2, "reason": "50 s is fine"});
    let (s, _, b) = app.call_as(&bob, Method::POST, &format!("{url}/approve"), Some(ok2), &[]).await;
    assert_eq!(s, StatusCode::OK, "{b}");

    // Applying starts exactly the definition approved (version 2).
    let (s, _, b) = app.call_as(&alice, Method::POST, &format!("{url}/apply"), Some(apply.clone()), &[]).await;
    assert_eq!((s, b["state"].as_str()), (StatusCode::OK, Some("applied")), "{b}");
    let id = b["experiment_id"].as_i64().expect("the experiment it started");
    assert_eq!(b["outcome"], format!("started as experiment {id}"));
    let (s, _, r) = app.call(Method::GET, &format!("/api/v1/experiments/{id}"), None).await;
    assert_eq!(s, StatusCode::OK, "{r}");
    assert_eq!(r["experiment"]["spec"]["duration"], "50s", "{r}");
    assert_eq!(r["experiment"]["spec"], b["proposed"], "{r}");
    assert_eq!(r["experiment"]["created_by"], "alice");
    let (s, _, b) = app.call_as(&alice, Method::POST, &format!("{url}/apply"), Some(apply), &[]).await;
    assert_eq!(s, StatusCode::NOT_FOUND, "applied once: {b}");

    // On the record: the proposal, both approvals, the start naming the request and its approver.
    let rows = audit_actions(&app).await;
    let started = rows
        .iter()
        .find(|a| a["action"] == "experiment.start" && a["target"].as_str().unwrap().contains(&format!("(experiment {id})")))
        .unwrap_or_else(|| panic!("no experiment.start of {id}: {rows:#?}"));
    let why = started["reason"].as_str().unwrap();
    assert!(why.contains("change request") && why.contains("approved by bob"), "{why}");
    assert!(rows.iter().any(|a| a["action"] == "request.create" && a["target"].as_str().unwrap().contains("experiment recs-down of checkout")), "{rows:#?}");

    // Break-glass starts at once, audited as a bypass naming the experiment.
    let (s, _, e) = app
        .call_as(&alice, Method::POST, "/api/v1/experiments", Some(start(spec("urgent", "5s"))),
            &[("x-levee-break-glass", "incident 42: verify the fallback now")])
        .await;
    assert_eq!(s, StatusCode::CREATED, "{e}");
    let rows = audit_actions(&app).await;
    let bypass = rows.iter().find(|a| a["action"] == "approval.bypass").expect("a bypass row");
    assert_eq!(bypass["outcome"], "bypass");
    assert!(bypass["target"].as_str().unwrap().contains("experiment: experiment urgent"), "{bypass}");

    // Scheduling one is a change of that kind too: refused without approval, taken with
    // break-glass, which lets it through at run time as a bypass audited then.
    let later = Timestamp::from_unix_ms(Timestamp::now().unix_ms() + HOUR);
    let (s, _, b) = app.call_as(&alice, Method::POST, SCHED, Some(scheduled(spec("later", "5s"), later)), &[]).await;
    assert_eq!(s, StatusCode::FORBIDDEN, "{b}");
    let (s, _, c) = app
        .call_as(&alice, Method::POST, SCHED, Some(scheduled(spec("later", "5s"), later)),
            &[("x-levee-break-glass", "incident 42: verify the fallback tonight")])
        .await;
    assert_eq!(s, StatusCode::CREATED, "{c}");
    let started = start_due(&app, later).await;
    assert_eq!(started.len(), 1, "{c}");
    let rows = audit_actions(&app).await;
    let bypasses = rows.iter().filter(|a| a["action"] == "approval.bypass" && a["target"].as_str().unwrap().contains("experiment later")).count();
    assert_eq!(bypasses, 2, "scheduled and run as a bypass: {rows:#?}");
}
}

const SCHED: &str = "/api/v1/environments/prod/scheduled-changes";
const HOUR: i64 = 3_600_000;

fn scheduled(spec: Value, run_at: Timestamp) -> Value {
    json!({"kind": "experiment", "experiment": spec, "run_at": run_at, "reason": "nightly game day"})
}

/// Starts the scheduled experiments due at `t` (the test chooses the time instead of
/// waiting; the server's own task only starts those due by the clock).
async fn start_due(app: &TestApp, t: Timestamp) -> Vec<i64> {
    app.server.as_ref().unwrap().experiments.start_due(t).await.unwrap()
}

async fn get_change(app: &TestApp, as_: Option<&str>, id: i64) -> Value {
    let url = format!("{SCHED}/{id}");
    let (s, _, c) = match as_ {
        Some(who) => app.call_as(who, Method::GET, &url, None, &[]).await,
        None => app.call(Method::GET, &url, None).await,
    };
    assert_eq!(s, StatusCode::OK, "{c}");
    c
}

on_both_backends! {
/// A scheduled experiment starts once when due, as its author is then: a user demoted
/// meanwhile starts nothing; a scheduled game day hides what it would inject from players.
async fn a_scheduled_experiment_starts_when_due_as_its_author_is_then(app) {
    app.seed().await;
    let alice = app.user("alice", "operator").await;
    let bob = app.user("bob", "operator").await;
    let vic = app.user("vic", "viewer").await;
    let run_at = Timestamp::from_unix_ms(Timestamp::now().unix_ms() + HOUR);

    // What the scheduler refuses, by field.
    let mut body = scheduled(spec("later", "5s"), run_at);
    body.as_object_mut().unwrap().remove("experiment");
    let (s, h, b) = app.call_as(&alice, Method::POST, SCHED, Some(body), &[]).await;
    assert_problem(s, &h, &b, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(b["errors"][0]["path"], "experiment", "{b}");
    let mut body = scheduled(spec("later", "5s"), run_at);
    body["revert_at"] = json!(Timestamp::from_unix_ms(run_at.unix_ms() + HOUR));
    let (s, h, b) = app.call_as(&alice, Method::POST, SCHED, Some(body), &[]).await;
    assert_problem(s, &h, &b, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(b["errors"][0]["path"], "revert_at", "{b}");
    let mut elsewhere = spec("later", "5s");
    elsewhere["environment"] = json!("staging");
    let (s, h, b) = app.call_as(&alice, Method::POST, SCHED, Some(scheduled(elsewhere, run_at)), &[]).await;
    assert_problem(s, &h, &b, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(b["errors"][0]["path"], "environment", "{b}");
    let mut bad = spec("later", "5s");
    bad["duration"] = json!("0s");
    let (s, h, b) = app.call_as(&alice, Method::POST, SCHED, Some(scheduled(bad, run_at)), &[]).await;
    assert_problem(s, &h, &b, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(b["errors"][0]["path"], "duration", "{b}");
    let (s, _, b) = app.call_as(&vic, Method::POST, SCHED, Some(scheduled(spec("later", "5s"), run_at)), &[]).await;
    assert_eq!(s, StatusCode::FORBIDDEN, "{b}");

    // Alice's starts at its time, once, as alice.
    let (s, _, c) = app.call_as(&alice, Method::POST, SCHED, Some(scheduled(spec("later", "5s"), run_at)), &[]).await;
    assert_eq!(s, StatusCode::CREATED, "{c}");
    assert_eq!((c["kind"].as_str(), c["target"].as_str(), c["service"].as_str()), (Some("experiment"), Some("later"), Some("checkout")), "{c}");
    assert_eq!(c["value"]["duration"], "5s", "{c}");
    let alices = c["id"].as_i64().unwrap();
    // Bob's is scheduled while he is an operator, then he is demoted.
    let (s, _, c) = app.call_as(&bob, Method::POST, SCHED, Some(scheduled(spec("demoted", "5s"), run_at)), &[]).await;
    assert_eq!(s, StatusCode::CREATED, "{c}");
    let bobs = c["id"].as_i64().unwrap();
    let (s, _, b) = app.call(Method::PATCH, "/api/v1/users/bob", Some(json!({"role": "viewer", "reason": "moved teams"}))).await;
    assert_eq!(s, StatusCode::NO_CONTENT, "{b}");

    assert!(start_due(&app, Timestamp::from_unix_ms(run_at.unix_ms() - 1)).await.is_empty(), "not due yet");
    let started = start_due(&app, run_at).await;
    assert_eq!(started.len(), 1, "alice's only: {started:?}");
    assert!(start_due(&app, run_at).await.is_empty(), "started once");
    let id = started[0];
    let c = get_change(&app, None, alices).await;
    assert_eq!((c["state"].as_str(), c["experiment_id"].as_i64()), (Some("applied"), Some(id)), "{c}");
    assert_eq!(c["outcome"], format!("started as experiment {id}"), "{c}");
    let (_, _, r) = app.call(Method::GET, &format!("/api/v1/experiments/{id}"), None).await;
    assert_eq!((r["experiment"]["name"].as_str(), r["experiment"]["created_by"].as_str()), (Some("later"), Some("alice")), "{r}");
    assert!(r["experiment"]["reason"].as_str().unwrap().contains(&format!("(scheduled change {alices})")), "{r}");

    // Bob's did not start: failed, saying why, audited as its run.
    let c = get_change(&app, None, bobs).await;
    assert_eq!((c["state"].as_str(), c["experiment_id"].as_i64()), (Some("failed"), None), "{c}");
    assert!(c["outcome"].as_str().unwrap().starts_with("not started: "), "{c}");
    let rows = audit_actions(&app).await;
    assert!(!rows.iter().any(|a| a["action"] == "experiment.start" && a["target"].as_str().unwrap().contains("demoted")), "{rows:#?}");
    let run = rows
        .iter()
        .find(|a| a["action"] == "schedule.run" && a["target"].as_str().unwrap().contains(&format!("(scheduled change {bobs})")))
        .unwrap_or_else(|| panic!("no schedule.run of {bobs}: {rows:#?}"));
    assert_eq!((run["outcome"].as_str(), run["actor"].as_str()), (Some("failed"), Some("bob")), "{run}");

    // A scheduled game day: players see that one is scheduled, not what it injects.
    let mut gd = spec("recs-slow", "5s");
    gd["game_day"] = json!(true);
    let (s, _, c) = app.call_as(&alice, Method::POST, SCHED, Some(scheduled(gd, run_at)), &[]).await;
    assert_eq!(s, StatusCode::CREATED, "{c}");
    let gid = c["id"].as_i64().unwrap();
    for who in [None, Some(alice.as_str())] {
        let c = get_change(&app, who, gid).await;
        assert_eq!((c["target"].as_str(), c["value"]["name"].as_str()), (Some("recs-slow"), Some("recs-slow")), "{c}");
    }
    let c = get_change(&app, Some(&vic), gid).await;
    assert_eq!((c["target"].as_str(), c["value"].is_null(), c["reason"].as_str()), (Some("game day"), true, Some("")), "{c}");
    let (_, _, list) = app.call_as(&vic, Method::GET, SCHED, None, &[]).await;
    assert!(!list.to_string().contains("recs-slow"), "{list}");
}
}

/// Runs `levee experiment run FILE ARGS…` as the holder of `token`; (exit code, output).
async fn run_cli(base: &str, token: &str, spec: &Value, args: &[&str]) -> (i32, String) {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("experiment.yaml");
    std::fs::write(&file, serde_json::to_string_pretty(spec).unwrap()).unwrap();
    let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_levee"));
    cmd.args(["experiment", "run"]).arg(&file).args(["--reason", "pipeline after deploy"]).args(args);
    let out = cmd
        .env("LEVEE_SERVER", base)
        .env("LEVEE_TOKEN", token)
        .env("LEVEE_CREDENTIALS", dir.path().join("none"))
        .output()
        .await
        .expect("levee runs");
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    (out.status.code().unwrap_or(-1), format!("{stdout}{}", String::from_utf8_lossy(&out.stderr)))
}

on_both_backends! {
async fn levee_experiment_run_says_approval_is_pending_and_wait_follows_the_decision(app) {
    app.seed().await;
    let alice = app.user("alice", "operator").await;
    let bob = app.user("bob", "operator").await;
    rules(&app, &["experiment"]).await;

    // Without --wait: exit 5, saying so; nothing started.
    let (code, out) = run_cli(&app.base, &alice, &spec("pending", "5s"), &[]).await;
    assert_eq!(code, 5, "{out}");
    assert!(out.contains("approval pending") && out.contains("not started"), "{out}");
    let first = open_request_after(&app, 0).await;

    // --wait, rejected by bob: exit 6.
    let cli = tokio::spawn({
        let (base, token) = (app.base.clone(), alice.clone());
        async move { run_cli(&base, &token, &spec("rejected", "5s"), &["--wait"]).await }
    });
    let id = open_request_after(&app, first).await;
    let no = json!({"reason": "not during the sale"});
    let (s, _, b) = app.call_as(&bob, Method::POST, &format!("{REQS}/{id}/reject"), Some(no), &[]).await;
    assert_eq!(s, StatusCode::OK, "{b}");
    let (code, out) = cli.await.unwrap();
    assert_eq!(code, 6, "{out}");
    assert!(out.contains("rejected: not during the sale") && out.contains("never started"), "{out}");

    // --wait, approved by bob: the CLI applies it and follows the experiment to its verdict
    // (no agent reports here: aborted on its baseline, exit 4).
    let cli = tokio::spawn({
        let (base, token) = (app.base.clone(), alice.clone());
        async move { run_cli(&base, &token, &spec("approved", "5s"), &["--wait"]).await }
    });
    let id = open_request_after(&app, id).await;
    let ok = json!({"version": 1, "reason": "go ahead"});
    let (s, _, b) = app.call_as(&bob, Method::POST, &format!("{REQS}/{id}/approve"), Some(ok), &[]).await;
    assert_eq!(s, StatusCode::OK, "{b}");
    let (code, out) = cli.await.unwrap();
    assert!(out.contains(&format!("change request {id} approved by bob: applying it")), "{out}");
    assert!(out.contains("verdict aborted"), "{out}");
    assert_eq!(code, 4, "{out}");
    let (_, _, r) = app.call(Method::GET, &format!("{REQS}/{id}"), None).await;
    assert_eq!((r["state"].as_str(), r["applied_by"].as_str()), (Some("applied"), Some("alice")), "{r}");
}
}

/// The id of the open change request of prod newer than `after`, once there is one.
async fn open_request_after(app: &TestApp, after: i64) -> i64 {
    for _ in 0..400 {
        let (_, _, list) = app.call(Method::GET, REQS, None).await;
        if let Some(r) = list
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["state"] == "open" && r["id"].as_i64().unwrap() > after)
        {
            return r["id"].as_i64().unwrap();
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    panic!("no open change request after {after} appeared");
}

on_both_backends! {
/// `levee experiment run --at TIME --wait`: scheduled, started by the server's own task when
/// due, followed to its verdict (no agent reports here: aborted, exit 4); a time that is
/// not one is refused before anything is sent.
async fn levee_experiment_run_at_schedules_it_and_wait_follows_it(app) {
    app.seed().await;
    let alice = app.user("alice", "operator").await;
    let (code, out) = run_cli(&app.base, &alice, &spec("nightly", "5s"), &["--at", "tonight"]).await;
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("\"tonight\" is not an RFC 3339 time"), "{out}");
    let at = Timestamp::from_unix_ms(Timestamp::now().unix_ms() + 3_000).to_string();
    let (code, out) = run_cli(&app.base, &alice, &spec("nightly", "5s"), &["--at", &at, "--wait"]).await;
    assert_eq!(code, 4, "{out}");
    let (_, _, list) = app.call(Method::GET, SCHED, None).await;
    let c = &list[0];
    assert_eq!((c["target"].as_str(), c["state"].as_str()), (Some("nightly"), Some("applied")), "{list}");
    let id = c["experiment_id"].as_i64().unwrap();
    for line in [format!("scheduled change {}: the experiment starts at {at}", c["id"]), format!("experiment {id} started")] {
        assert!(out.contains(&line), "{line:?} not in: {out}");
    }
    assert!(out.contains("nothing was injected"), "{out}");
}
}

//! What `levee apply` builds on: the plan, the whole-service PUT and the service DELETE,
//! each with its preconditions.

use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

use crate::helpers::{Db, TestApp, assert_problem};

const SVC: &str = "/api/v1/environments/prod/services/checkout";

fn manifest(service: &str, policy: Value, flags: Value) -> Value {
    json!({"api_version": "levee/v1", "environment": "prod", "service": service, "policy": policy, "flags": flags})
}

async fn viewer_token(app: &TestApp) -> String {
    let (s, _, b) = app
        .call(
            Method::POST,
            "/api/v1/tokens",
            Some(json!({"kind": "api", "name": "reader", "role": "viewer", "reason": "test"})),
        )
        .await;
    assert_eq!(s, StatusCode::CREATED, "{b}");
    b["token"].as_str().unwrap().to_string()
}

on_both_backends! {
async fn put_service_replaces_policy_and_flags_in_one_revision_with_if_match(app) {
    app.seed().await;
    let body = json!({"description": "orders", "policy": {"dependencies": {"pricing": {"attempt_timeout": "200ms"}}},
                      "flags": {"new.flag": {"type": "int", "value": 3}}, "reason": "apply"});
    let put = |rev: Option<&'static str>, body: Value| {
        let app = &app;
        async move {
            let headers: Vec<(&str, &str)> = rev.map(|r| vec![("if-match", r)]).unwrap_or_default();
            app.call_as(&app.token, Method::PUT, SVC, Some(body), &headers).await
        }
    };
    let (s, h, b) = put(None, body.clone()).await;
    assert_problem(s, &h, &b, StatusCode::PRECONDITION_REQUIRED);
    let (s, h, b) = put(Some("\"7\""), body.clone()).await;
    assert_problem(s, &h, &b, StatusCode::CONFLICT);
    assert_eq!(b["current_revision"], 1);

    let (s, _, b) = put(Some("\"1\""), body.clone()).await;
    assert_eq!(s, StatusCode::OK, "{b}");
    assert_eq!((b["revision"].as_u64(), b["changed"].as_bool()), (Some(2), Some(true)));
    let (_, _, snap) = app.call(Method::GET, &format!("{SVC}/snapshot"), None).await;
    assert_eq!(
        snap["config"]["flags"],
        json!({"new.flag": {"type": "int", "value": 3, "description": "", "owner": "",
        "expires_at": null, "stale": "hold", "rollout": null}}),
        "the kill switch not declared is gone"
    );
    assert!(snap["config"]["policy"]["dependencies"].get("recommendations").is_none());
    let (_, _, one) = app.call(Method::GET, SVC, None).await;
    assert_eq!(one["description"], "orders");
    let (_, _, audit) = app.call(Method::GET, "/api/v1/audit?service=checkout&limit=2", None).await;
    assert_eq!(audit[0]["target"], "description", "{audit}");
    assert_eq!((&audit[0]["before"], &audit[0]["after"]), (&json!(""), &json!("orders")));
    assert_eq!(audit[1]["action"], "service.apply");
    assert_eq!(audit[1]["before"]["flags"]["recommendations.enabled"]["value"], true, "{audit}");

    // The same again: no revision, nothing audited as a change.
    let (s, _, b) = put(Some("\"2\""), body).await;
    assert_eq!((s, b["changed"].as_bool(), b["revision"].as_u64()), (StatusCode::OK, Some(false), Some(2)));

    // A viewer cannot; a policy that breaks a kill switch is refused whole.
    let viewer = viewer_token(&app).await;
    let (s, h, b) = app
        .call_as(&viewer, Method::PUT, SVC, Some(json!({"policy": {}, "reason": "x"})), &[("if-match", "*")])
        .await;
    assert_problem(s, &h, &b, StatusCode::FORBIDDEN);
    let (s, h, b) = put(
        Some("*"),
        json!({"policy": {"dependencies": {"r": {"enabled_flag": "missing"}}}, "flags": {}, "reason": "x"}),
    )
    .await;
    assert_problem(s, &h, &b, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(b["errors"][0]["path"], "policy.dependencies.r.enabled_flag", "{b}");
}
}

#[tokio::test]
async fn a_deleted_service_is_gone_and_comes_back_with_its_next_revision_sqlite() {
    deleted_service_comes_back(TestApp::spawn().await).await;
}

#[tokio::test]
async fn a_deleted_service_is_gone_and_comes_back_with_its_next_revision_postgres() {
    if let Some(app) = TestApp::spawn_on(Db::Postgres).await {
        deleted_service_comes_back(app).await;
    }
}

async fn deleted_service_comes_back(app: TestApp) {
    app.seed().await;
    let (s, h, b) = app.call(Method::DELETE, &format!("{SVC}?reason=gone"), None).await;
    assert_problem(s, &h, &b, StatusCode::PRECONDITION_REQUIRED);
    let (s, h, b) = app.call_as(&app.token, Method::DELETE, SVC, None, &[("if-match", "\"1\"")]).await;
    assert_problem(s, &h, &b, StatusCode::BAD_REQUEST);
    assert!(b["detail"].as_str().unwrap().contains("reason"), "{b}");
    let (s, h, b) = app
        .call_as(&app.token, Method::DELETE, &format!("{SVC}?reason=gone"), None, &[("if-match", "\"9\"")])
        .await;
    assert_problem(s, &h, &b, StatusCode::CONFLICT);
    let (s, _, b) = app
        .call_as(&app.token, Method::DELETE, &format!("{SVC}?reason=gone"), None, &[("if-match", "\"1\"")])
        .await;
    assert_eq!(s, StatusCode::NO_CONTENT, "{b}");

    for path in [SVC.to_string(), format!("{SVC}/snapshot"), format!("{SVC}/policy")] {
        let (s, _, _) = app.call(Method::GET, &path, None).await;
        assert_eq!(s, StatusCode::NOT_FOUND, "{path}");
    }
    let (s, _, b) = app
        .call_as(
            &app.token,
            Method::PATCH,
            &format!("{SVC}/flags/recommendations.enabled"),
            Some(json!({"value": false, "reason": "x"})),
            &[],
        )
        .await;
    assert_eq!(s, StatusCode::NOT_FOUND, "a deleted service takes no change: {b}");
    let (_, _, audit) = app.call(Method::GET, "/api/v1/audit?service=checkout&limit=5", None).await;
    let delete = audit.as_array().unwrap().iter().find(|r| r["action"] == "service.delete").unwrap();
    assert_eq!(delete["before"]["flags"]["recommendations.enabled"]["value"], true, "{delete}");

    let (s, _, b) = app
        .call(
            Method::POST,
            "/api/v1/environments/prod/services",
            Some(json!({"name": "checkout", "reason": "back"})),
        )
        .await;
    assert_eq!(s, StatusCode::CREATED, "{b}");
    assert_eq!(b["revision"], 2, "revisions continue, so agents holding revision 1 take it");
    let (_, _, snap) = app.call(Method::GET, &format!("{SVC}/snapshot"), None).await;
    assert_eq!(snap["config"]["flags"], json!({}), "the old flags did not come back");
    let (_, _, old) = app.call(Method::GET, &format!("{SVC}/revisions/1"), None).await;
    assert_eq!(old["config"]["flags"]["recommendations.enabled"]["value"], true, "history stays");
}

on_both_backends! {
async fn the_plan_says_what_apply_would_do_and_writes_nothing(app) {
    app.seed().await;
    let (_, _, policy) = app.call(Method::GET, &format!("{SVC}/policy"), None).await;
    let (_, _, snap) = app.call(Method::GET, &format!("{SVC}/snapshot"), None).await;
    let mut changed = policy["policy"].clone();
    changed["dependencies"]["recommendations"]["attempt_timeout"] = json!("70ms");
    let viewer = viewer_token(&app).await;
    let body = json!({"manifests": [
        manifest("checkout", changed, snap["config"]["flags"].clone()),
        manifest("search", json!({"dependencies": {"index": {"criticality": "critical", "fallback": "stale"}}}), json!({})),
    ]});
    let (s, _, plan) = app.call_as(&viewer, Method::POST, "/api/v1/plan", Some(body.clone()), &[]).await;
    assert_eq!(s, StatusCode::OK, "a viewer may plan: {plan}");
    let entries = plan["services"].as_array().unwrap();
    assert_eq!(entries.len(), 2, "{plan}");
    assert_eq!((&entries[0]["action"], &entries[0]["revision"]), (&json!("change"), &json!(1)));
    assert_eq!(
        entries[0]["changes"],
        json!([{"path": "policy.dependencies.recommendations.attempt_timeout", "op": "changed",
                "before": "80ms", "after": "70ms"}])
    );
    assert_eq!(entries[1]["action"], "create");
    assert!(entries[1].get("revision").is_none());
    assert_eq!(
        entries[1]["lints"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|l| l["code"] == "readiness_on_non_critical")
            .count(),
        1,
        "{plan}"
    );
    let (_, _, list) = app.call(Method::GET, "/api/v1/environments/prod/services", None).await;
    assert_eq!(list.as_array().unwrap().len(), 1, "planning wrote nothing");

    // Only the new one named: checkout is unmanaged, or would be pruned.
    let only = |prune: bool| json!({"manifests": [body["manifests"][1].clone()], "prune": prune});
    let (_, _, plan) = app.call(Method::POST, "/api/v1/plan", Some(only(false))).await;
    assert_eq!(plan["services"][1]["action"], "unmanaged", "{plan}");
    let (_, _, plan) = app.call(Method::POST, "/api/v1/plan", Some(only(true))).await;
    assert_eq!(
        (&plan["services"][1]["action"], &plan["services"][1]["revision"]),
        (&json!("prune"), &json!(1))
    );

    // Every bad manifest and a missing environment are named by index.
    let bad = json!({"manifests": [
        manifest("a", json!({"dependencies": {"p": {"retry": {"max_attempts": 50}}}}), json!({})),
        {"api_version": "levee/v1", "environment": "staging", "service": "b", "policy": {}},
    ]});
    let (s, h, b) = app.call(Method::POST, "/api/v1/plan", Some(bad)).await;
    assert_problem(s, &h, &b, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(b["errors"][0]["path"], "manifests[0].policy.dependencies.p.retry.max_attempts", "{b}");
    let bad = json!({"manifests": [{"api_version": "levee/v1", "environment": "staging", "service": "b", "policy": {}}]});
    let (s, h, b) = app.call(Method::POST, "/api/v1/plan", Some(bad)).await;
    assert_problem(s, &h, &b, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(b["errors"][0]["path"], "manifests[0].environment", "{b}");
    // An expiry in the past is refused by the plan as by the write, so a dry run in CI
    // fails where the apply on merge would.
    let bad = json!({"manifests": [manifest("a", json!({}),
        json!({"k": {"type": "bool", "value": true, "expires_at": "2020-01-01T00:00:00Z"}}))]});
    let (s, h, b) = app.call(Method::POST, "/api/v1/plan", Some(bad)).await;
    assert_problem(s, &h, &b, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(b["errors"][0]["path"], "manifests[0].flags.k.expires_at", "{b}");
    assert!(b["errors"][0]["message"].as_str().unwrap().contains("must be in the future"), "{b}");
    assert!(b["errors"][0]["message"].as_str().unwrap().contains("take expires_at, or the flag, out of the manifest"), "{b}");
}
}

on_both_backends! {
async fn the_plan_names_an_active_profile_and_what_it_would_undo(app) {
    app.seed().await;
    let (s, _, b) = app
        .call(
            Method::PUT,
            "/api/v1/environments/prod/profiles/recs-down",
            Some(json!({"services": {"checkout": {"flags": {"recommendations.enabled": false}}}, "reason": "agreed"})),
        )
        .await;
    assert!(s.is_success(), "{b}");
    let (_, _, policy) = app.call(Method::GET, &format!("{SVC}/policy"), None).await;
    let (_, _, before) = app.call(Method::GET, &format!("{SVC}/snapshot"), None).await;
    let plan_of = |flags: Value| {
        json!({"manifests": [manifest("checkout", policy["policy"].clone(), flags)]})
    };
    let (_, _, plan) = app.call(Method::POST, "/api/v1/plan", Some(plan_of(before["config"]["flags"].clone()))).await;
    assert!(plan["services"][0].get("profile").is_none(), "no profile active: {plan}");

    let (s, _, a) = app
        .call(
            Method::POST,
            "/api/v1/environments/prod/profiles/recs-down/apply",
            Some(json!({"expires_in": "2h", "reason": "INC-1"})),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{a}");
    let (_, _, active) = app.call(Method::GET, "/api/v1/environments/prod/active-profile", None).await;

    // The repository still says true: the plan says the profile is active and what it undoes.
    let (s, _, plan) = app.call(Method::POST, "/api/v1/plan", Some(plan_of(before["config"]["flags"].clone()))).await;
    assert_eq!(s, StatusCode::OK, "{plan}");
    let e = &plan["services"][0];
    assert_eq!(e["action"], "change", "{plan}");
    assert_eq!(e["profile"]["expires_at"], active["expires_at"], "{plan} {active}");
    assert_eq!(
        (&e["profile"]["name"], &e["profile"]["applied_by"], &e["profile"]["undoes"]),
        (&json!("recs-down"), &json!("admin"), &json!(["flags.recommendations.enabled"])),
        "{plan}"
    );

    // A manifest that keeps what the profile set undoes nothing, and still names it.
    let (_, _, now) = app.call(Method::GET, &format!("{SVC}/snapshot"), None).await;
    let (_, _, plan) = app.call(Method::POST, "/api/v1/plan", Some(plan_of(now["config"]["flags"].clone()))).await;
    let e = &plan["services"][0];
    assert_eq!((&e["action"], &e["profile"]["undoes"]), (&json!("unchanged"), &json!([])), "{plan}");

    // Pruning the service would undo every entry the profile set in it.
    let prune = json!({"manifests": [manifest("search", json!({}), json!({}))], "prune": true});
    let (_, _, plan) = app.call(Method::POST, "/api/v1/plan", Some(prune)).await;
    let e = &plan["services"][1];
    assert_eq!(
        (&e["action"], &e["profile"]["undoes"]),
        (&json!("prune"), &json!(["flags.recommendations.enabled"])),
        "{plan}"
    );
}
}

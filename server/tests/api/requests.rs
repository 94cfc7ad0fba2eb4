//! Four-eyes change requests: where an environment requires approval, a direct change is
//! refused; the proposer cannot approve; an edit after approval voids it; what is applied
//! is exactly what was approved (the diff the approver saw); break-glass applies at once,
//! audited as a bypass.

use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

use crate::helpers::{Db, TestApp, assert_problem};

const REQS: &str = "/api/v1/environments/prod/change-requests";
const FLAG: &str = "/api/v1/environments/prod/services/checkout/flags/recommendations.enabled";

async fn four_eyes(app: TestApp) {
    app.seed().await;
    let (s, _, rules) = app
        .call(
            Method::PUT,
            "/api/v1/environments/prod/approval-rules",
            Some(json!({"kinds": ["flag", "policy"], "reason": "SOC 2"})),
        )
        .await;
    assert_eq!((s, &rules["kinds"]), (StatusCode::OK, &json!(["flag", "policy"])), "{rules}");
    let olivia = app.user("olivia", "operator").await;
    let rita = app.user("rita", "operator").await;

    // The direct change is refused.
    let (s, h, b) = app
        .call_as(&olivia, Method::PATCH, FLAG, Some(json!({"value": false, "reason": "INC-3"})), &[])
        .await;
    assert_problem(s, &h, &b, StatusCode::FORBIDDEN);
    assert!(b["detail"].as_str().unwrap().contains("need an approved change request"), "{b}");

    // Proposed; the diff is what the approver reviews.
    let body = |v: bool| json!({"kind": "flag", "service": "checkout", "flag": "recommendations.enabled", "value": v, "reason": "INC-3"});
    let (s, _, r) = app.call_as(&olivia, Method::POST, REQS, Some(body(false)), &[]).await;
    assert_eq!(s, StatusCode::CREATED, "{r}");
    assert_eq!(r["diff"], json!([{"path": "value", "op": "changed", "before": true, "after": false}]), "{r}");
    let id = r["id"].as_i64().unwrap();
    let url = format!("{REQS}/{id}");

    // The proposer cannot approve it.
    let approve = json!({"version": 1, "reason": "looks right"});
    let (s, h, b) =
        app.call_as(&olivia, Method::POST, &format!("{url}/approve"), Some(approve.clone()), &[]).await;
    assert_problem(s, &h, &b, StatusCode::FORBIDDEN);
    assert!(b["detail"].as_str().unwrap().contains("someone else must approve it"), "{b}");
    // Applying before approval is refused.
    let (s, h, b) =
        app.call_as(&olivia, Method::POST, &format!("{url}/apply"), Some(json!({"reason": "go"})), &[]).await;
    assert_problem(s, &h, &b, StatusCode::NOT_FOUND);

    // Approved, then edited: the approval is void.
    let (s, _, r) =
        app.call_as(&rita, Method::POST, &format!("{url}/approve"), Some(approve.clone()), &[]).await;
    assert_eq!((s, r["state"].as_str()), (StatusCode::OK, Some("approved")), "{r}");
    let edited = json!({"kind": "flag", "service": "checkout", "flag": "recommendations.enabled", "value": true, "reason": "changed my mind"});
    let (s, _, r) = app.call_as(&olivia, Method::PUT, &url, Some(edited), &[]).await;
    assert_eq!(s, StatusCode::OK, "{r}");
    assert_eq!(
        (r["state"].as_str(), r["version"].as_u64(), &r["approved_by"]),
        (Some("open"), Some(2), &Value::Null)
    );
    let (s, h, b) =
        app.call_as(&olivia, Method::POST, &format!("{url}/apply"), Some(json!({"reason": "go"})), &[]).await;
    assert_problem(s, &h, &b, StatusCode::NOT_FOUND);
    // An approval of the version reviewed before the edit is refused.
    let (s, h, b) = app.call_as(&rita, Method::POST, &format!("{url}/approve"), Some(approve), &[]).await;
    assert_problem(s, &h, &b, StatusCode::CONFLICT);
    // Someone else cannot edit it.
    let (s, h, b) = app.call_as(&rita, Method::PUT, &url, Some(body(false)), &[]).await;
    assert_problem(s, &h, &b, StatusCode::FORBIDDEN);

    // Back to false, approved at version 3, applied exactly so.
    let (_, _, r) = app.call_as(&olivia, Method::PUT, &url, Some(body(false)), &[]).await;
    assert_eq!(r["version"], 3);
    let (s, _, r) = app
        .call_as(
            &rita,
            Method::POST,
            &format!("{url}/approve"),
            Some(json!({"version": 3, "reason": "ok"})),
            &[],
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{r}");
    let (s, _, r) =
        app.call_as(&olivia, Method::POST, &format!("{url}/apply"), Some(json!({"reason": "go"})), &[]).await;
    assert_eq!(
        (s, r["state"].as_str(), r["revision"].as_u64()),
        (StatusCode::OK, Some("applied"), Some(2)),
        "{r}"
    );
    let (_, _, flag) = app.call(Method::GET, FLAG, None).await;
    assert_eq!(flag["value"], json!(false));
    let (_, _, audit) = app.call(Method::GET, "/api/v1/audit?environment=prod&limit=2", None).await;
    assert_eq!(audit[0]["action"], "request.apply", "{audit}");
    assert_eq!((&audit[1]["action"], &audit[1]["actor"]), (&json!("flag.set"), &json!("olivia")), "{audit}");
    assert!(audit[1]["reason"].as_str().unwrap().contains("approved by rita"), "{audit}");

    // Break-glass: applied at once, with a reason, audited as a bypass.
    let (s, h, b) = app
        .call_as(
            &olivia,
            Method::PATCH,
            FLAG,
            Some(json!({"value": true, "reason": "x"})),
            &[("x-levee-break-glass", " ")],
        )
        .await;
    assert_problem(s, &h, &b, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(b["errors"][0]["path"], "break_glass", "{b}");
    let (s, _, w) = app
        .call_as(
            &olivia,
            Method::PATCH,
            FLAG,
            Some(json!({"value": true, "reason": "restore now"})),
            &[("x-levee-break-glass", "checkout is down, no reviewer awake")],
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{w}");
    let (_, _, audit) = app.call(Method::GET, "/api/v1/audit?environment=prod&limit=2", None).await;
    // The bypass is recorded once the change it bypassed is made, naming its revision.
    assert_eq!(audit[1]["action"], "flag.set", "{audit}");
    assert_eq!(
        (&audit[0]["action"], &audit[0]["outcome"], &audit[0]["reason"]),
        (&json!("approval.bypass"), &json!("bypass"), &json!("checkout is down, no reviewer awake")),
        "{audit}"
    );
    assert_eq!(audit[0]["revision"], audit[1]["revision"], "{audit}");
}

#[tokio::test]
async fn four_eyes_on_sqlite() {
    four_eyes(TestApp::spawn().await).await;
}

#[tokio::test]
async fn four_eyes_on_postgres() {
    if let Some(app) = TestApp::spawn_on(Db::Postgres).await {
        four_eyes(app).await;
    }
}

#[tokio::test]
async fn an_approved_policy_whose_base_moved_is_a_conflict_not_applied() {
    let app = TestApp::spawn().await;
    app.seed().await;
    let (_, _, _) = app
        .call(
            Method::PUT,
            "/api/v1/environments/prod/approval-rules",
            Some(json!({"kinds": ["policy"], "reason": "r"})),
        )
        .await;
    let olivia = app.user("olivia", "operator").await;
    let (_, _, pol) = app.call(Method::GET, "/api/v1/environments/prod/services/checkout/policy", None).await;
    let mut policy = pol.get("policy").cloned().unwrap_or(pol.clone());
    policy["default_deadline"] = json!("900ms");
    let (s, _, r) = app
        .call_as(
            &olivia,
            Method::POST,
            REQS,
            Some(json!({"kind": "policy", "service": "checkout", "policy": policy, "reason": "slower"})),
            &[],
        )
        .await;
    assert_eq!(s, StatusCode::CREATED, "{r}");
    assert!(r["diff"].as_array().unwrap().iter().any(|d| d["path"] == "default_deadline"), "{r}");
    let id = r["id"].as_i64().unwrap();
    let (s, _, _) = app
        .call(Method::POST, &format!("{REQS}/{id}/approve"), Some(json!({"version": 1, "reason": "ok"})))
        .await;
    assert_eq!(s, StatusCode::OK);
    // The policy moves (an admin breaks the glass) before the request is applied.
    let mut other = policy.clone();
    other["default_deadline"] = json!("700ms");
    let (s, _, b) = app
        .call_as(
            &app.token,
            Method::PUT,
            "/api/v1/environments/prod/services/checkout/policy",
            Some(json!({"policy": other, "reason": "hotfix"})),
            &[("x-levee-break-glass", "hotfix"), ("if-match", "*")],
        )
        .await;
    assert!(s.is_success(), "{b}");
    let (s, h, b) = app
        .call_as(&olivia, Method::POST, &format!("{REQS}/{id}/apply"), Some(json!({"reason": "go"})), &[])
        .await;
    assert_problem(s, &h, &b, StatusCode::CONFLICT);
    let (_, _, r) = app.call(Method::GET, &format!("{REQS}/{id}"), None).await;
    assert_eq!(r["state"], "conflict", "{r}");
    assert!(
        r["outcome"].as_str().unwrap().contains("policy of checkout changed since the request was proposed"),
        "{r}"
    );
}

on_both_backends! {
async fn a_flag_approval_rule_covers_apply_and_rollback_not_only_flips(app) {
    // With approval required for flags, `levee apply` (the whole-service PUT) and rollback
    // change flags too: each needs the approval a flip needs, or a bypass audited.
    app.seed().await;
    let (s, _, b) = app
        .call(
            Method::PUT,
            "/api/v1/environments/prod/approval-rules",
            Some(json!({"kinds": ["flag"], "reason": "SOC 2"})),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{b}");
    let olivia = app.user("olivia", "operator").await;
    let svc = "/api/v1/environments/prod/services/checkout";
    let (_, _, snap) = app.call(Method::GET, &format!("{svc}/snapshot"), None).await;
    let (policy, flags) = (snap["config"]["policy"].clone(), snap["config"]["flags"].clone());
    let put = |flags: Value, headers: &'static [(&'static str, &'static str)]| {
        let (app, olivia, policy) = (&app, &olivia, policy.clone());
        async move {
            let mut h = vec![("if-match", "*")];
            h.extend_from_slice(headers);
            let body = json!({"description": "orders", "policy": policy, "flags": flags, "reason": "gitops"});
            app.call_as(olivia, Method::PUT, svc, Some(body), &h).await
        }
    };

    // Flags as they are: not a flag change, applied.
    let (s, _, b) = put(flags.clone(), &[]).await;
    assert_eq!(s, StatusCode::OK, "{b}");

    // The kill switch off through apply: refused like a flip, nothing written.
    let mut off = flags.clone();
    off["recommendations.enabled"]["value"] = json!(false);
    let (s, h, b) = put(off.clone(), &[]).await;
    assert_problem(s, &h, &b, StatusCode::FORBIDDEN);
    assert!(b["detail"].as_str().unwrap().contains("need an approved change request"), "{b}");
    let (_, _, flag) = app.call(Method::GET, FLAG, None).await;
    assert_eq!(flag["value"], json!(true), "{flag}");

    // Break-glass applies it, audited as a bypass.
    let (s, _, b) = put(off, &[("x-levee-break-glass", "checkout is down")]).await;
    assert_eq!(s, StatusCode::OK, "{b}");
    let (_, _, audit) = app.call(Method::GET, "/api/v1/audit?environment=prod&limit=2", None).await;
    assert_eq!(audit[1]["action"], "service.apply", "{audit}");
    assert_eq!((&audit[0]["action"], &audit[0]["outcome"]), (&json!("approval.bypass"), &json!("bypass")), "{audit}");
    let (_, _, flag) = app.call(Method::GET, FLAG, None).await;
    assert_eq!(flag["value"], json!(false), "{flag}");

    // A rollback to a revision with the switch on changes a flag too.
    let (s, h, b) = app
        .call_as(&olivia, Method::POST, &format!("{svc}/rollback"), Some(json!({"to_revision": 1, "reason": "undo"})), &[])
        .await;
    assert_problem(s, &h, &b, StatusCode::FORBIDDEN);
    let (_, _, flag) = app.call(Method::GET, FLAG, None).await;
    assert_eq!(flag["value"], json!(false), "{flag}");
}
}

//! The whole-service write (`PUT`) and the deletion of a service refuse to undo what the
//! active emergency profile set, unless told why (`override_profile`), which the audit
//! row's reason records — on SQLite and on PostgreSQL.

use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

use crate::helpers::{TestApp, assert_problem};

const SVC: &str = "/api/v1/environments/prod/services/checkout";

/// Applies profile `recs-down` (the kill switch off) until 2 h from now; returns the
/// activation.
async fn apply_profile(app: &TestApp) -> Value {
    let (s, _, b) = app
        .call(
            Method::PUT,
            "/api/v1/environments/prod/profiles/recs-down",
            Some(json!({"services": {"checkout": {"flags": {"recommendations.enabled": false}}},
                        "reason": "agreed"})),
        )
        .await;
    assert_eq!(s, StatusCode::CREATED, "{b}");
    let (s, _, a) = app
        .call(
            Method::POST,
            "/api/v1/environments/prod/profiles/recs-down/apply",
            Some(json!({"expires_in": "2h", "reason": "INC-1"})),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{a}");
    a
}

/// The service's configuration as stored.
async fn config(app: &TestApp) -> Value {
    let (s, _, snap) = app.call(Method::GET, &format!("{SVC}/snapshot"), None).await;
    assert_eq!(s, StatusCode::OK, "{snap}");
    snap["config"].clone()
}

async fn put(app: &TestApp, body: Value) -> (StatusCode, reqwest::header::HeaderMap, Value) {
    app.call_as(&app.token, Method::PUT, SVC, Some(body), &[("if-match", "*")]).await
}

async fn newest_audit(app: &TestApp) -> Value {
    let (s, _, rows) = app.call(Method::GET, "/api/v1/audit?service=checkout&limit=1", None).await;
    assert_eq!(s, StatusCode::OK, "{rows}");
    rows[0].clone()
}

/// The refusal names the profile, who applied it, until when, what would be undone and how
/// to proceed.
fn assert_refused(s: StatusCode, h: &reqwest::header::HeaderMap, b: &Value, activation: &Value) {
    assert_problem(s, h, b, StatusCode::CONFLICT);
    let p = b;
    assert_eq!(p["type"], "urn:levee:problem:profile-would-undo", "{p}");
    assert_eq!(
        p["profile"],
        json!({"name": "recs-down", "applied_by": "admin", "expires_at": activation["expires_at"],
               "undoes": ["flags.recommendations.enabled"]}),
        "{p}"
    );
    let detail = p["detail"].as_str().unwrap();
    for part in [
        "flags.recommendations.enabled",
        "emergency profile recs-down",
        "applied by admin",
        activation["expires_at"].as_str().unwrap(),
        "POST /api/v1/environments/prod/active-profile/revert",
        "override_profile",
    ] {
        assert!(detail.contains(part), "{part:?} missing from {detail:?}");
    }
}

on_both_backends! {
async fn put_refuses_to_undo_the_active_profile_unless_told_why(app) {
    app.seed().await;
    let activation = apply_profile(&app).await;
    let applied = config(&app).await;
    assert_eq!(applied["flags"]["recommendations.enabled"]["value"], json!(false), "{applied}");

    // A manifest that switches the kill switch back on: refused, nothing written, audited.
    let mut on = applied["flags"].clone();
    on["recommendations.enabled"] = json!({"type": "bool", "value": true, "description": "kill switch"});
    let body = json!({"policy": applied["policy"], "flags": on, "reason": "manifest sync"});
    let (s, h, b) = put(&app, body.clone()).await;
    assert_refused(s, &h, &b, &activation);
    assert_eq!(config(&app).await, applied, "nothing written");
    let row = newest_audit(&app).await;
    assert_eq!((&row["action"], &row["outcome"]), (&json!("service.apply"), &json!("rejected")), "{row}");
    assert_eq!(row["detail"], b["detail"], "{row}");

    // An empty override says nothing: refused as a bad field.
    let mut empty = body.clone();
    empty["override_profile"] = json!("  ");
    let (s, h, b) = put(&app, empty).await;
    assert_problem(s, &h, &b, StatusCode::BAD_REQUEST);
    assert_eq!(b["errors"][0]["path"], "override_profile", "{b}");

    // A write that leaves the profile's flags as it set them goes through.
    let mut policy = applied["policy"].clone();
    policy["default_deadline"] = json!("900ms");
    let (s, _, b) = put(&app, json!({"policy": policy, "flags": applied["flags"], "reason": "tune"})).await;
    assert_eq!(s, StatusCode::OK, "{b}");
    let row = newest_audit(&app).await;
    assert_eq!((&row["outcome"], &row["reason"]), (&json!("ok"), &json!("tune")), "{row}");
    let tuned = config(&app).await;
    assert_eq!(tuned["flags"], applied["flags"], "{tuned}");
    assert_eq!(tuned["policy"]["default_deadline"], json!("900ms"), "{tuned}");

    // Told why: the write goes through, the reason records the override.
    let mut told = body.clone();
    told["policy"] = tuned["policy"].clone();
    told["override_profile"] = json!("INC-1 is over on this service");
    let (s, _, b) = put(&app, told).await;
    assert_eq!(s, StatusCode::OK, "{b}");
    assert_eq!(config(&app).await["flags"]["recommendations.enabled"]["value"], json!(true));
    let row = newest_audit(&app).await;
    assert_eq!((&row["action"], &row["outcome"]), (&json!("service.apply"), &json!("ok")), "{row}");
    assert_eq!(
        row["reason"],
        "manifest sync (overrides emergency profile recs-down: INC-1 is over on this service)",
        "{row}"
    );
}
}

on_both_backends! {
async fn delete_refuses_to_undo_the_active_profile_unless_told_why(app) {
    app.seed().await;
    let activation = apply_profile(&app).await;
    let (s, h, b) = app
        .call_as(&app.token, Method::DELETE, &format!("{SVC}?reason=cleanup"), None, &[("if-match", "*")])
        .await;
    assert_refused(s, &h, &b, &activation);
    let (s, _, _) = app.call(Method::GET, SVC, None).await;
    assert_eq!(s, StatusCode::OK, "still there");
    let row = newest_audit(&app).await;
    assert_eq!((&row["action"], &row["outcome"]), (&json!("service.delete"), &json!("rejected")), "{row}");

    let (s, _, b) = app
        .call_as(
            &app.token,
            Method::DELETE,
            &format!("{SVC}?reason=cleanup&override_profile=decommissioned%20anyway"),
            None,
            &[("if-match", "*")],
        )
        .await;
    assert_eq!(s, StatusCode::NO_CONTENT, "{b}");
    let (s, _, _) = app.call(Method::GET, SVC, None).await;
    assert_eq!(s, StatusCode::NOT_FOUND, "deleted");
    let row = newest_audit(&app).await;
    assert_eq!((&row["action"], &row["outcome"]), (&json!("service.delete"), &json!("ok")), "{row}");
    assert_eq!(row["reason"], "cleanup (overrides emergency profile recs-down: decommissioned anyway)", "{row}");
}
}

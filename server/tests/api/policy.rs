use reqwest::{Method, StatusCode};
use serde_json::json;

use crate::helpers::{Db, TestApp};

const POLICY: &str = "/api/v1/environments/prod/services/checkout/policy";

async fn concurrent_edits_second_gets_409_and_audit_has_both(app: TestApp) {
    app.seed().await;
    let (s, h, b) = app.call(Method::GET, POLICY, None).await;
    assert_eq!(s, StatusCode::OK);
    let etag = h.get("etag").unwrap().to_str().unwrap().to_string();
    assert_eq!(etag, format!("\"{}\"", b["revision"]));
    let edit = |timeout: &str| json!({"reason": format!("set timeout {timeout}"), "policy": {"dependencies": {"pricing": {"attempt_timeout": timeout}}}});
    let hdr = [("if-match", etag.as_str())];
    let a = app.call_as(&app.token, Method::PUT, POLICY, Some(edit("300ms")), &hdr);
    let b2 = app.call_as(&app.token, Method::PUT, POLICY, Some(edit("500ms")), &hdr);
    let ((sa, _, ba), (sb, _, bb)) = tokio::join!(a, b2);
    let mut statuses = [sa, sb];
    statuses.sort();
    assert_eq!(statuses, [StatusCode::OK, StatusCode::CONFLICT], "{ba} / {bb}");
    let (winner, loser) = if sa == StatusCode::OK { (ba, bb) } else { (bb, ba) };
    assert_eq!(loser["current_revision"], winner["revision"], "409 must carry the current revision");
    // Nothing is lost: the stored policy is the winner's.
    let (_, _, now) = app.call(Method::GET, POLICY, None).await;
    assert_eq!(now["revision"], winner["revision"]);
    let timeout = now["policy"]["dependencies"]["pricing"]["attempt_timeout"].as_str().unwrap().to_string();
    assert!(timeout == "300ms" || timeout == "500ms");
    // The loser retries with the new revision and wins.
    let retry_etag = format!("\"{}\"", loser["current_revision"]);
    let (s, _, _) =
        app.call_as(&app.token, Method::PUT, POLICY, Some(edit("400ms")), &[("if-match", &retry_etag)]).await;
    assert_eq!(s, StatusCode::OK);
    // The audit log shows both attempts' outcomes.
    let (_, _, audit) = app.call(Method::GET, "/api/v1/audit?service=checkout&limit=10", None).await;
    let outcomes: Vec<(String, String)> = audit
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["action"] == "policy.update")
        .map(|r| (r["outcome"].as_str().unwrap().to_string(), r["reason"].as_str().unwrap().to_string()))
        .collect();
    assert_eq!(outcomes.len(), 3, "{outcomes:?}");
    assert_eq!(outcomes.iter().filter(|(o, _)| o == "ok").count(), 2);
    assert_eq!(outcomes.iter().filter(|(o, _)| o == "conflict").count(), 1);
}

#[tokio::test]
async fn concurrent_policy_edits_sqlite() {
    concurrent_edits_second_gets_409_and_audit_has_both(TestApp::spawn().await).await;
}

#[tokio::test]
async fn concurrent_policy_edits_postgres() {
    if let Some(app) = TestApp::spawn_on(Db::Postgres).await {
        concurrent_edits_second_gets_409_and_audit_has_both(app).await;
    }
}

async fn flags_set_flip_delete(app: TestApp) {
    app.seed().await;
    let flag = "/api/v1/environments/prod/services/checkout/flags/search.max_results";
    let (s, _, b) = app
        .call(Method::PUT, flag, Some(json!({"type": "int", "value": 50, "owner": "search", "stale": {"revert_after": "1h"}, "reason": "new"})))
        .await;
    assert_eq!(s, StatusCode::OK, "{b}");
    let rev = b["revision"].as_u64().unwrap();
    let (s, _, b) = app.call(Method::PATCH, flag, Some(json!({"value": "many", "reason": "oops"}))).await;
    assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{b}");
    let (s, _, b) = app.call(Method::PATCH, flag, Some(json!({"value": 20, "reason": "load"}))).await;
    assert_eq!(s, StatusCode::OK, "{b}");
    assert_eq!(b["revision"].as_u64().unwrap(), rev + 1);
    // Same value again: no new revision.
    let (_, _, b) = app.call(Method::PATCH, flag, Some(json!({"value": 20, "reason": "again"}))).await;
    assert_eq!((b["changed"].as_bool(), b["revision"].as_u64()), (Some(false), Some(rev + 1)));
    let (_, _, f) = app.call(Method::GET, flag, None).await;
    assert_eq!(
        (f["value"].clone(), f["owner"].clone(), f["stale"].clone()),
        (json!(20), json!("search"), json!({"revert_after": "1h"}))
    );
    let (s, _, _) = app.call(Method::DELETE, &format!("{flag}?reason=done"), None).await;
    assert_eq!(s, StatusCode::OK);
    let (s, _, _) = app.call(Method::GET, flag, None).await;
    assert_eq!(s, StatusCode::NOT_FOUND);
    let (_, _, snap) =
        app.call(Method::GET, "/api/v1/environments/prod/services/checkout/snapshot", None).await;
    assert!(snap["config"]["flags"].get("search.max_results").is_none());
    assert_eq!(snap["revision"].as_u64().unwrap(), rev + 2);
}

#[tokio::test]
async fn flags_set_flip_delete_sqlite() {
    flags_set_flip_delete(TestApp::spawn().await).await;
}

#[tokio::test]
async fn flags_set_flip_delete_postgres() {
    if let Some(app) = TestApp::spawn_on(Db::Postgres).await {
        flags_set_flip_delete(app).await;
    }
}

on_both_backends! {
async fn faults_need_permission_and_a_future_expiry_and_expire_by_themselves(app) {
    app.seed().await;
    let fault = "/api/v1/environments/prod/services/checkout/faults/slow-recs";
    let (s, _, b) = app
        .call(
            Method::PUT,
            fault,
            Some(json!({"dependency": "recommendations", "action": {"type": "delay", "delay": "2s"}, "percent": 50,
                        "expires_at": "2001-01-01T00:00:00Z", "reason": "game day"})),
        )
        .await;
    assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{b}");
    let soon =
        levee_agent::policy::Timestamp::from_unix_ms(levee_agent::policy::Timestamp::now().unix_ms() + 1500);
    let (s, _, b) = app
        .call(
            Method::PUT,
            fault,
            Some(json!({"dependency": "recommendations", "action": {"type": "delay", "delay": "2s"}, "percent": 50,
                        "expires_at": soon.to_string(), "reason": "game day"})),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{b}");
    // The sweeper removes it after expiry (bounded wait, polling the observable state).
    let faults = "/api/v1/environments/prod/services/checkout/faults";
    let mut gone = false;
    for _ in 0..100 {
        let (_, _, list) = app.call(Method::GET, faults, None).await;
        if list.as_array().unwrap().is_empty() {
            gone = true;
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert!(gone, "expired fault rule was not removed");
    let (_, _, audit) = app.call(Method::GET, "/api/v1/audit?actor=levee", None).await;
    assert_eq!(audit[0]["action"], json!("expiry"), "{audit}");
}
}

/// A route deadline keyed by a raw path (`/quote/{sku}` without its method) is stored, but
/// the server warns that it can never match: the inbound layers key routes as
/// `"METHOD template"` or by gRPC method (the deadline would silently never apply).
#[tokio::test]
async fn route_keys_that_can_never_match_are_warned_about() {
    let app = TestApp::spawn().await;
    app.seed().await;
    let (s, h, _) = app.call(Method::GET, POLICY, None).await;
    assert_eq!(s, StatusCode::OK);
    let etag = h.get("etag").unwrap().to_str().unwrap().to_string();
    let body = json!({"reason": "route deadlines", "policy": {"inbound": {"routes": {
        "/quote/{sku}": {"deadline": "900ms"}, "GET /quote/{sku}": {"deadline": "900ms"}}}}});
    let (s, _, b) =
        app.call_as(&app.token, Method::PUT, POLICY, Some(body), &[("if-match", etag.as_str())]).await;
    assert_eq!(s, StatusCode::OK, "{b}");
    let (s, _, lints) = app.call(Method::GET, "/api/v1/environments/prod/services/checkout/lint", None).await;
    assert_eq!(s, StatusCode::OK, "{lints}");
    let never: Vec<&str> = lints
        .as_array()
        .unwrap()
        .iter()
        .filter(|l| l["code"] == "route_never_matches")
        .map(|l| l["path"].as_str().unwrap())
        .collect();
    assert_eq!(never, ["inbound.routes./quote/{sku}"], "{lints}");
}

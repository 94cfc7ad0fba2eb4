//! CD-1: a write whose snapshot an agent would reject is refused with 422 before anything
//! is stored — the same rule (`levee_agent::policy::accept`) on both sides.

use levee_agent::policy::defaults::{MAX_BODY_DEPTH, MAX_FLAG_VALUE_DEPTH, MAX_SNAPSHOT_BYTES};
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

use crate::helpers::{TestApp, assert_problem};

const SVC: &str = "/api/v1/environments/prod/services/checkout";

/// A JSON value of `levels` nested arrays.
fn nested(levels: usize) -> Value {
    let text = format!("{}{}", "[".repeat(levels), "]".repeat(levels));
    serde_json::from_str(&text).unwrap()
}

/// The service's current revision.
async fn revision(app: &TestApp) -> u64 {
    let (s, _, b) = app.call(Method::GET, SVC, None).await;
    assert_eq!(s, StatusCode::OK, "{b}");
    b["revision"].as_u64().unwrap()
}

/// Asserts a 422 whose one error names `path` with `value`, its message stating `limit`.
fn assert_refused(
    reply: (StatusCode, reqwest::header::HeaderMap, Value),
    path: &str,
    value: &str,
    limit: usize,
) {
    let (s, h, b) = reply;
    assert_problem(s, &h, &b, StatusCode::UNPROCESSABLE_ENTITY);
    let errors = b["errors"].as_array().unwrap_or_else(|| panic!("no errors: {b}"));
    let e = errors.iter().find(|e| e["path"] == path).unwrap_or_else(|| panic!("no error at {path}: {b}"));
    assert_eq!(e["value"], value, "{b}");
    assert!(e["message"].as_str().unwrap().contains(&limit.to_string()), "{b}");
}

on_both_backends! {
/// CD-1 (the first finding): a JSON flag nested 125 deep was stored with 200 and
/// made a snapshot no agent decodes. Every way of writing it is now refused with 422
/// naming where, the depth and the limit — the document's own budget past 64 levels, the
/// flag value's past 32 — and nothing is stored; a value at the limit is accepted.
async fn cd_1_json_flag_nested_past_the_budget_is_refused_before_storing(app) {
    app.seed().await;
    let before = revision(&app).await;
    let deep = |levels| json!({"type": "json", "value": nested(levels), "reason": "test"});

    // The flag's own write names the field of its request body.
    let reply = app.call(Method::PUT, &format!("{SVC}/flags/deep"), Some(deep(125))).await;
    assert_refused(reply, "value[0][0][0][0][0][0][0]…", "126 levels", MAX_BODY_DEPTH);
    let reply = app.call(Method::PUT, &format!("{SVC}/flags/deep"), Some(deep(MAX_FLAG_VALUE_DEPTH + 1))).await;
    assert_refused(reply, "value", &format!("{} levels", MAX_FLAG_VALUE_DEPTH + 1), MAX_FLAG_VALUE_DEPTH);

    // The whole-service write and a new service carrying it are refused the same way.
    let (_, _, current) = app.call(Method::GET, &format!("{SVC}/snapshot"), None).await;
    let mut flags = current["config"]["flags"].clone();
    flags["deep"] = json!({"type": "json", "value": nested(125)});
    let put = json!({"policy": current["config"]["policy"], "flags": flags, "reason": "test"});
    let reply = app.call_as(&app.token, Method::PUT, SVC, Some(put), &[("if-match", "*")]).await;
    assert_refused(reply, "flags.deep.value[0][0][0][0][0]…", "128 levels", MAX_BODY_DEPTH);
    let deep_flags = |levels| json!({"deep": {"type": "json", "value": nested(levels)}});
    let create = json!({"name": "other", "reason": "test", "flags": deep_flags(125)});
    let reply = app.call(Method::POST, "/api/v1/environments/prod/services", Some(create)).await;
    assert_refused(reply, "flags.deep.value[0][0][0][0][0]…", "128 levels", MAX_BODY_DEPTH);
    let create = json!({"name": "other", "reason": "test", "flags": deep_flags(MAX_FLAG_VALUE_DEPTH + 1)});
    let reply = app.call(Method::POST, "/api/v1/environments/prod/services", Some(create)).await;
    let too_deep = format!("{} levels", MAX_FLAG_VALUE_DEPTH + 1);
    assert_refused(reply, "flags.deep.value", &too_deep, MAX_FLAG_VALUE_DEPTH);
    let (s, _, _) = app.call(Method::GET, "/api/v1/environments/prod/services/other", None).await;
    assert_eq!(s, StatusCode::NOT_FOUND, "no service was created");

    assert_eq!(revision(&app).await, before, "no revision was stored");
    let (s, _, snap) = app.call(Method::GET, &format!("{SVC}/snapshot"), None).await;
    assert_eq!(s, StatusCode::OK, "{snap}");
    assert_eq!(snap["revision"].as_u64(), Some(before));

    let (s, _, b) = app.call(Method::PUT, &format!("{SVC}/flags/deep"), Some(deep(MAX_FLAG_VALUE_DEPTH))).await;
    assert_eq!(s, StatusCode::OK, "a value at the limit is fine: {b}");
    assert_eq!(revision(&app).await, before + 1);
}
}

on_both_backends! {
/// CD-1: a snapshot grown past the size budget by writes each well under the request body
/// limit (string flags of 15 kB) is refused at the write that would cross it — 422 naming
/// the size, the limit and the largest parts — and the stored snapshot stays under it.
async fn cd_1_snapshot_grown_past_the_size_budget_is_refused_at_the_write_that_crosses_it(app) {
    app.seed().await;
    let blob = "x".repeat(15_000);
    let mut refused = None;
    for i in 0..(MAX_SNAPSHOT_BYTES / 15_000 + 2) {
        let flag = json!({"type": "string", "value": blob, "reason": "test"});
        let reply = app.call(Method::PUT, &format!("{SVC}/flags/blob-{i}"), Some(flag)).await;
        if reply.0 != StatusCode::OK {
            refused = Some((i, reply));
            break;
        }
    }
    let (i, (s, h, b)) = refused.expect("a write past the budget is refused");
    assert_problem(s, &h, &b, StatusCode::UNPROCESSABLE_ENTITY);
    let e = &b["errors"][0];
    assert_eq!(e["path"], ".", "{b}");
    let size: usize = e["value"].as_str().unwrap().strip_suffix(" bytes").unwrap().parse().unwrap();
    assert!(size > MAX_SNAPSHOT_BYTES, "{b}");
    let message = e["message"].as_str().unwrap();
    assert!(message.contains(&format!("at most {MAX_SNAPSHOT_BYTES} bytes")), "{b}");
    assert!(message.contains("largest parts: flags "), "{b}");

    assert_eq!(revision(&app).await, 1 + i as u64, "the refused write stored nothing");
    let stored = app.store().latest_snapshot("prod", "checkout").await.unwrap().unwrap();
    assert!(stored.body.len() <= MAX_SNAPSHOT_BYTES);
    assert!(stored.body.len() + 16_000 > MAX_SNAPSHOT_BYTES, "refused only at the budget: {}", stored.body.len());
    let (s, _, _) = app.call(Method::GET, &format!("{SVC}/flags/blob-{i}"), None).await;
    assert_eq!(s, StatusCode::NOT_FOUND);
}
}

on_both_backends! {
/// CD-1 (the second finding): with the request body limit raised, a 4.3 MB
/// snapshot was stored in one write. The body limit lets the request in; the snapshot
/// budget refuses it.
async fn cd_1_a_raised_body_limit_does_not_let_a_snapshot_past_the_budget(app)
    with |s: &mut levee_server::config::Settings| s.max_body_bytes = 8 * 1024 * 1024; {
    app.seed().await;
    let blob = "x".repeat(15_000);
    let flags: serde_json::Map<String, Value> = (0..287)
        .map(|i| (format!("blob-{i}"), json!({"type": "string", "value": blob})))
        .chain([("recommendations.enabled".to_string(), json!({"type": "bool", "value": true}))])
        .collect();
    let (_, _, current) = app.call(Method::GET, &format!("{SVC}/snapshot"), None).await;
    let put = json!({"policy": current["config"]["policy"], "flags": flags, "reason": "test"});
    assert!(put.to_string().len() > 4_300_000);
    let (s, h, b) = app.call_as(&app.token, Method::PUT, SVC, Some(put), &[("if-match", "*")]).await;
    assert_problem(s, &h, &b, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(b["errors"][0]["path"], ".", "{b}");
    assert!(b["detail"].as_str().unwrap().contains(&MAX_SNAPSHOT_BYTES.to_string()), "{b}");
    assert_eq!(revision(&app).await, 1);
}
}

on_both_backends! {
/// CD-1: rolling back to a revision stored before the rule (over the size budget, written
/// straight into the database) is refused like any other write: 422, nothing stored.
async fn cd_1_rollback_to_a_stored_revision_agents_would_refuse_is_refused(app) {
    app.seed().await;
    let blob = "x".repeat(15_000);
    let flags: serde_json::Map<String, Value> =
        (0..80).map(|i| (format!("blob-{i}"), json!({"type": "string", "value": blob}))).collect();
    let legacy = json!({"flags": flags}).to_string();
    assert!(legacy.len() > MAX_SNAPSHOT_BYTES);
    let old = app.store_raw_revision(&legacy).await;
    let (s, _, b) = app
        .call(Method::PATCH, &format!("{SVC}/flags/recommendations.enabled"), Some(json!({"value": false, "reason": "t"})))
        .await;
    assert_eq!(s, StatusCode::OK, "{b}");
    let now = revision(&app).await;
    let reply = app
        .call(Method::POST, &format!("{SVC}/rollback"), Some(json!({"to_revision": old, "reason": "back"})))
        .await;
    let (s, h, b) = reply;
    assert_problem(s, &h, &b, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(b["errors"][0]["path"], ".", "{b}");
    assert!(b["errors"][0]["message"].as_str().unwrap().contains(&MAX_SNAPSHOT_BYTES.to_string()), "{b}");
    assert_eq!(revision(&app).await, now);
}
}

on_both_backends! {
/// CD-3: a current revision that no longer decodes (written by another version; here
/// straight into the database) is answered as such by every endpoint that reads it — a
/// 409 problem naming the revision, never a 5xx — the others keep working, a flip still
/// goes through (it writes from the stored parts), and a rollback replaces it.
async fn cd_3_an_undecodable_stored_revision_is_a_clear_problem_never_a_500(app) {
    app.seed().await;
    let bad = json!({"flags": {"deep": {"type": "json", "value": nested(126)}}}).to_string();
    let rev = app.store_raw_revision(&bad).await;
    assert_eq!(rev, 2);
    for path in ["/snapshot", "/flags", "/flags/recommendations.enabled", "/breaker-overrides", "/faults",
        "/revisions/2", "/revisions/2/diff", "/revisions/1/diff?against=2"]
    {
        let (s, h, b) = app.call(Method::GET, &format!("{SVC}{path}"), None).await;
        assert_problem(s, &h, &b, StatusCode::CONFLICT);
        assert_eq!(b["type"], "urn:levee:problem:revision-unreadable", "{path}: {b}");
        let detail = b["detail"].as_str().unwrap();
        assert!(detail.contains("revision 2 of prod/checkout cannot be read"), "{path}: {detail}");
        assert!(detail.contains("roll back"), "{path}: {detail}");
    }
    for path in ["", "/revisions", "/revisions/1", "/revisions/1/diff", "/agents", "/nacks", "/policy", "/lint",
        "/temporary-flags"]
    {
        let (s, _, b) = app.call(Method::GET, &format!("{SVC}{path}"), None).await;
        assert!(s.is_success() || s == StatusCode::CONFLICT, "{path}: {s} {b}");
    }
    let (s, _, b) = app
        .call(Method::POST, &format!("{SVC}/rollback"), Some(json!({"to_revision": 2, "reason": "t"})))
        .await;
    assert_eq!(s, StatusCode::CONFLICT, "rolling back to it: {b}");

    // The emergency lane: a flip writes from the stored parts, not from the snapshot.
    let (s, _, b) = app
        .call(Method::PATCH, &format!("{SVC}/flags/recommendations.enabled"), Some(json!({"value": false, "reason": "t"})))
        .await;
    assert_eq!(s, StatusCode::OK, "{b}");
    assert_eq!(b["revision"].as_u64(), Some(3));
    let (s, _, snap) = app.call(Method::GET, &format!("{SVC}/snapshot"), None).await;
    assert_eq!(s, StatusCode::OK, "{snap}");

    let again = app.store_raw_revision(&bad).await;
    let (s, _, b) = app
        .call(Method::POST, &format!("{SVC}/rollback"), Some(json!({"to_revision": 3, "reason": "readable"})))
        .await;
    assert_eq!(s, StatusCode::OK, "{b}");
    assert_eq!(b["revision"].as_u64(), Some(again + 1));
    let (s, _, snap) = app.call(Method::GET, &format!("{SVC}/snapshot"), None).await;
    assert_eq!(s, StatusCode::OK, "{snap}");
    assert_eq!(snap["config"]["flags"]["recommendations.enabled"]["value"], false);
}
}

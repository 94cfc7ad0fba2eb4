//! OPS-1: a kill switch never silently does nothing. Every API path that could leave a
//! policy naming a flag the service does not define — creating a service, replacing its
//! policy, deleting or retyping a flag, a flag's expiry — refuses with 422 naming the field
//! and the flags that exist, or keeps the reference valid.

use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

use crate::helpers::{Db, TestApp, assert_problem};

const POLICY: &str = "/api/v1/environments/prod/services/checkout/policy";
const FLAGS: &str = "/api/v1/environments/prod/services/checkout/flags";

/// The one error of a 422 answer, after checking it is problem+json.
fn only_error(status: StatusCode, headers: &reqwest::header::HeaderMap, body: &Value) -> Value {
    assert_problem(status, headers, body, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(body["errors"].as_array().map(Vec::len), Some(1), "{body}");
    body["errors"][0].clone()
}

async fn ops_1_dangling_kill_switch_is_refused_naming_the_field_and_the_flags(app: TestApp) {
    app.seed().await;
    // A one-letter typo in the dependency's kill switch.
    let typo = json!({"reason": "typo", "policy": {"dependencies": {"recommendations": {
        "criticality": "non_critical", "enabled_flag": "recommendation.enabled", "fallback": "generic"}}}});
    let (s, h, b) = app.call_as(&app.token, Method::PUT, POLICY, Some(typo), &[("if-match", "*")]).await;
    let e = only_error(s, &h, &b);
    assert_eq!(e["path"], "policy.dependencies.recommendations.enabled_flag", "{b}");
    assert_eq!(e["value"], "\"recommendation.enabled\"", "{b}");
    let message = e["message"].as_str().unwrap();
    assert!(message.contains(r#"flags: "recommendations.enabled""#), "{message}");
    assert!(message.contains("policy.compiled_in_flags"), "{message}");
    assert!(b["detail"].as_str().unwrap().contains("recommendations.enabled"), "{b}");

    // The same in a degradation-matrix row; and a row naming an unknown dependency (the
    // policy's own fields are checked before the references to flags).
    for (dep, flag, path, listed) in [
        (
            "recommendations",
            "recs.off",
            "policy.degradation_matrix[0].enabled_flag",
            r#"flags: "recommendations.enabled""#,
        ),
        (
            "recomendations",
            "recommendations.enabled",
            "policy.degradation_matrix[0].dependencies[0]",
            r#"declared: "recommendations""#,
        ),
    ] {
        let row = json!({"reason": "matrix", "policy": {
            "dependencies": {"recommendations": {"enabled_flag": "recommendations.enabled"}},
            "degradation_matrix": [{"feature": "Recommendations", "dependencies": [dep],
                                    "on_failure": "generic", "enabled_flag": flag}]}});
        let (s, h, b) = app.call_as(&app.token, Method::PUT, POLICY, Some(row), &[("if-match", "*")]).await;
        let e = only_error(s, &h, &b);
        assert_eq!(e["path"], path, "{b}");
        assert!(e["message"].as_str().unwrap().contains(listed), "{b}");
    }

    // Creating a service with a dangling kill switch is refused too.
    let (s, h, b) = app
        .call(
            Method::POST,
            "/api/v1/environments/prod/services",
            Some(json!({"name": "search", "reason": "new",
                "policy": {"dependencies": {"index": {"enabled_flag": "index.on"}}},
                "flags": {"index.enabled": {"type": "bool", "value": true}}})),
        )
        .await;
    let e = only_error(s, &h, &b);
    assert_eq!(e["path"], "policy.dependencies.index.enabled_flag", "{b}");
    assert!(e["message"].as_str().unwrap().contains(r#"flags: "index.enabled""#), "{b}");

    // Nothing was stored: the policy still names the real flag.
    let (_, _, doc) = app.call(Method::GET, POLICY, None).await;
    assert_eq!(doc["policy"]["dependencies"]["recommendations"]["enabled_flag"], "recommendations.enabled");
}

#[tokio::test]
async fn ops_1_dangling_kill_switch_is_refused_sqlite() {
    ops_1_dangling_kill_switch_is_refused_naming_the_field_and_the_flags(TestApp::spawn().await).await;
}

#[tokio::test]
async fn ops_1_dangling_kill_switch_is_refused_postgres() {
    if let Some(app) = TestApp::spawn_on(Db::Postgres).await {
        ops_1_dangling_kill_switch_is_refused_naming_the_field_and_the_flags(app).await;
    }
}

on_both_backends! {
/// Deleting the flag a kill switch names, or making it a non-bool flag, would leave the
/// switch doing nothing: refused, naming the policy field. Declared in
/// `compiled_in_flags`, the switch may live in the service's code alone.
async fn ops_1_flag_changes_that_break_a_kill_switch_are_refused(app) {
    app.seed().await;
    let flag = format!("{FLAGS}/recommendations.enabled");
    let (s, h, b) = app.call(Method::DELETE, &format!("{flag}?reason=cleanup"), None).await;
    let e = only_error(s, &h, &b);
    assert_eq!(e["path"], "policy.dependencies.recommendations.enabled_flag", "{b}");
    assert!(e["message"].as_str().unwrap().contains("flags: none"), "{b}");
    let (s, h, b) =
        app.call(Method::PUT, &flag, Some(json!({"type": "int", "value": 1, "reason": "retype"}))).await;
    let e = only_error(s, &h, &b);
    assert!(e["message"].as_str().unwrap().contains("must name a bool flag"), "{b}");
    let (s, _, _) = app.call(Method::GET, &flag, None).await;
    assert_eq!(s, StatusCode::OK, "the flag is still there");

    // Declared as compiled into the service: the server flag may go.
    let (_, _, doc) = app.call(Method::GET, POLICY, None).await;
    let mut policy = doc["policy"].clone();
    policy["compiled_in_flags"] = json!(["recommendations.enabled"]);
    let (s, _, b) = app
        .call_as(
            &app.token,
            Method::PUT,
            POLICY,
            Some(json!({"policy": policy, "reason": "the code holds the default"})),
            &[("if-match", "*")],
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{b}");
    let (s, _, b) = app.call(Method::DELETE, &format!("{flag}?reason=cleanup"), None).await;
    assert_eq!(s, StatusCode::OK, "{b}");
    let (_, _, snap) =
        app.call(Method::GET, "/api/v1/environments/prod/services/checkout/snapshot", None).await;
    assert_eq!(snap["config"]["policy"]["compiled_in_flags"], json!(["recommendations.enabled"]), "{snap}");
    assert!(snap["config"]["flags"].get("recommendations.enabled").is_none());
}
}

on_both_backends! {
/// An expired kill switch that has no earlier flag to go back to (it was created with its
/// expiry) reverts to the service's compiled-in default: the sweeper removes the flag and
/// declares it in `compiled_in_flags`, so the reference stays valid.
async fn ops_1_expired_kill_switch_is_declared_compiled_in_when_the_sweeper_removes_it(app) {
    let soon =
        levee_agent::policy::Timestamp::from_unix_ms(levee_agent::policy::Timestamp::now().unix_ms() + 1500);
    app.seed_with_switch_until(Some(soon.to_string())).await;
    let flag = format!("{FLAGS}/recommendations.enabled");
    // Bounded wait, polling the observable state.
    let mut gone = false;
    for _ in 0..100 {
        let (s, _, _) = app.call(Method::GET, &flag, None).await;
        if s == StatusCode::NOT_FOUND {
            gone = true;
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert!(gone, "expired flag was not removed");
    let (_, _, doc) = app.call(Method::GET, POLICY, None).await;
    assert_eq!(doc["policy"]["compiled_in_flags"], json!(["recommendations.enabled"]), "{doc}");
    let (_, _, audit) = app.call(Method::GET, "/api/v1/audit?actor=levee", None).await;
    assert_eq!(audit[0]["after"]["policy"]["compiled_in_flags"], json!(["recommendations.enabled"]), "{audit}");
    assert_eq!(audit[0]["after"]["flags"], json!({"recommendations.enabled": null}), "{audit}");
    assert!(
        audit[0]["detail"].as_str().unwrap().contains("recommendations.enabled now declared in policy.compiled_in_flags"),
        "{audit}"
    );
}
}

on_both_backends! {
/// `flip … false --for 2h` then `flip … true` settles the flag: the first flip's expiry does
/// not stay on it (the sweeper would remove the settled switch two hours later). An expiry
/// already past is refused by PATCH, PUT, apply and create: accepted, the flag would vanish
/// within a second and a manifest carrying it would re-create it on every apply.
async fn a_flip_without_expiry_settles_the_flag_and_past_expiries_are_refused(app) {
    app.seed().await;
    use levee_agent::policy::Timestamp;
    let flag = format!("{FLAGS}/recommendations.enabled");
    let later = Timestamp::from_unix_ms(Timestamp::now().unix_ms() + 2 * 3600 * 1000);
    let (s, _, b) = app
        .call(Method::PATCH, &flag, Some(json!({"value": false, "expires_at": later.to_string(), "reason": "melting"})))
        .await;
    assert_eq!(s, StatusCode::OK, "{b}");
    let (_, _, f) = app.call(Method::GET, &flag, None).await;
    assert_eq!(Timestamp::parse(f["expires_at"].as_str().unwrap()), Some(later), "{f}");
    let (s, _, b) = app.call(Method::PATCH, &flag, Some(json!({"value": true, "reason": "recovered"}))).await;
    assert_eq!(s, StatusCode::OK, "{b}");
    let (_, _, f) = app.call(Method::GET, &flag, None).await;
    assert_eq!((&f["value"], &f["expires_at"]), (&json!(true), &Value::Null), "{f}");

    let past = "2026-01-01T00:00:00Z";
    let (s, h, b) =
        app.call(Method::PATCH, &flag, Some(json!({"value": false, "expires_at": past, "reason": "x"}))).await;
    assert_problem(s, &h, &b, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(b["errors"][0]["path"], "expires_at", "{b}");
    assert!(b["errors"][0]["message"].as_str().unwrap().contains("future"), "{b}");
    let (s, h, b) = app
        .call(Method::PUT, &flag, Some(json!({"type": "bool", "value": false, "expires_at": past, "reason": "x"})))
        .await;
    assert_problem(s, &h, &b, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(b["errors"][0]["path"], "expires_at", "{b}");

    let (_, _, snap) = app.call(Method::GET, "/api/v1/environments/prod/services/checkout/snapshot", None).await;
    let mut flags = snap["config"]["flags"].clone();
    flags["recommendations.enabled"]["expires_at"] = json!(past);
    let body = json!({"policy": snap["config"]["policy"], "flags": flags, "reason": "gitops"});
    let (s, h, b) = app
        .call_as(&app.token, Method::PUT, "/api/v1/environments/prod/services/checkout", Some(body), &[("if-match", "*")])
        .await;
    assert_problem(s, &h, &b, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(b["errors"][0]["path"], "flags.recommendations.enabled.expires_at", "{b}");
    let (s, h, b) = app
        .call(
            Method::POST,
            "/api/v1/environments/prod/services",
            Some(json!({"name": "fresh", "policy": {}, "reason": "x",
                        "flags": {"f": {"type": "bool", "value": true, "expires_at": past}}})),
        )
        .await;
    assert_problem(s, &h, &b, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(b["errors"][0]["path"], "flags.f.expires_at", "{b}");
    let (_, _, f) = app.call(Method::GET, &flag, None).await;
    assert_eq!((&f["value"], &f["expires_at"]), (&json!(true), &Value::Null), "nothing written: {f}");
}
}

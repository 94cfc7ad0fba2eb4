//! Emergency profiles through the API: defined and versioned, applied with an expiry that
//! every entry carries (the operator levers included), reverted by hand or by the server at the expiry, audited — on
//! SQLite and on PostgreSQL.

use levee_agent::policy::Timestamp;
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

use crate::helpers::{Db, TestApp, assert_problem};

const PROFILES: &str = "/api/v1/environments/prod/profiles";
const SVC: &str = "/api/v1/environments/prod/services/checkout";

fn definition() -> Value {
    json!({
        "description": "recommendations are melting down",
        "services": {"checkout": {
            "flags": {"recommendations.enabled": false},
            "breakers": [{"dependency": "recommendations", "state": "forced_open"}],
            "faults": [{"id": "slow", "dependency": "recommendations",
                        "action": {"type": "delay", "delay": "2s"}, "percent": 10}],
            "shed_sheddable_percent": 30, "pause_retries": true, "inbound_limit": 40
        }},
        "reason": "agreed in the incident review"
    })
}

async fn snapshot(app: &TestApp) -> Value {
    let (s, _, snap) = app.call(Method::GET, &format!("{SVC}/snapshot"), None).await;
    assert_eq!(s, StatusCode::OK, "{snap}");
    snap["config"].clone()
}

async fn define_apply_revert(app: TestApp) {
    app.seed().await;
    let before = snapshot(&app).await;

    // Defined and versioned, with a lost update refused.
    let (s, h, p) = app.call(Method::PUT, &format!("{PROFILES}/recs-down"), Some(definition())).await;
    assert_eq!(s, StatusCode::CREATED, "{p}");
    assert_eq!(h["etag"], "\"1\"");
    assert_eq!(p["definition"]["services"]["checkout"]["flags"]["recommendations.enabled"], json!(false));
    let (s, h, b) = app
        .call_as(
            &app.token,
            Method::PUT,
            &format!("{PROFILES}/recs-down"),
            Some(definition()),
            &[("if-match", "0")],
        )
        .await;
    assert_problem(s, &h, &b, StatusCode::CONFLICT);
    let (s, _, p) = app
        .call_as(
            &app.token,
            Method::PUT,
            &format!("{PROFILES}/recs-down"),
            Some(definition()),
            &[("if-match", "1")],
        )
        .await;
    assert_eq!((s, p["version"].as_u64()), (StatusCode::OK, Some(2)), "{p}");

    // Applied until an expiry that every entry carries.
    let (s, _, a) = app
        .call(
            Method::POST,
            &format!("{PROFILES}/recs-down/apply"),
            Some(json!({"expires_in": "2h", "reason": "INC-1: recommendations timing out"})),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{a}");
    assert_eq!((a["profile"].as_str(), a["version"].as_u64()), (Some("recs-down"), Some(2)));
    assert_eq!(a["applied_by"], "admin");
    assert_eq!(a["services"], json!(["checkout"]));
    let until = Timestamp::parse(a["expires_at"].as_str().unwrap()).unwrap();
    let cfg = snapshot(&app).await;
    let flag = &cfg["flags"]["recommendations.enabled"];
    assert_eq!(flag["value"], json!(false), "{cfg}");
    assert_eq!(Timestamp::parse(flag["expires_at"].as_str().unwrap()), Some(until));
    assert_eq!(cfg["breaker_overrides"][0]["state"], "forced_open");
    assert_eq!(Timestamp::parse(cfg["breaker_overrides"][0]["expires_at"].as_str().unwrap()), Some(until));
    assert_eq!(Timestamp::parse(cfg["faults"][0]["expires_at"].as_str().unwrap()), Some(until));
    // The operator levers, until the same expiry (the agent ends them by itself then).
    let levers = &cfg["levers"];
    assert_eq!(
        (&levers["shed_sheddable_percent"], &levers["retries_paused"], &levers["inbound_limit"]),
        (&json!(30.0), &json!(true), &json!(40)),
        "{cfg}"
    );
    assert_eq!(Timestamp::parse(levers["expires_at"].as_str().unwrap()), Some(until));
    assert_eq!(levers["reason"], "profile recs-down: INC-1: recommendations timing out");

    let (s, _, active) = app.call(Method::GET, "/api/v1/environments/prod/active-profile", None).await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(active["reason"], "INC-1: recommendations timing out");
    assert_eq!(active["reverted_at"], Value::Null);

    // One profile at a time.
    let (s, _, _) = app.call(Method::PUT, &format!("{PROFILES}/other"), Some(definition())).await;
    assert_eq!(s, StatusCode::CREATED);
    let (s, h, b) = app
        .call(
            Method::POST,
            &format!("{PROFILES}/other/apply"),
            Some(json!({"expires_in": "1h", "reason": "x"})),
        )
        .await;
    assert_problem(s, &h, &b, StatusCode::CONFLICT);
    assert!(b["detail"].as_str().unwrap().contains("recs-down"), "{b}");

    // Reverted: exactly what it replaced comes back.
    let (s, _, r) = app
        .call(
            Method::POST,
            "/api/v1/environments/prod/active-profile/revert",
            Some(json!({"reason": "recovered"})),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{r}");
    assert_eq!(r["reverted_by"], "admin");
    assert_eq!(snapshot(&app).await, before, "the levers gone with the rest");
    assert_eq!(before.get("levers"), None);
    let (s, _, _) = app.call(Method::GET, "/api/v1/environments/prod/active-profile", None).await;
    assert_eq!(s, StatusCode::NOT_FOUND);

    let (_, _, audit) = app.call(Method::GET, "/api/v1/audit?environment=prod", None).await;
    let actions: Vec<(&str, &str)> = audit
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["action"].as_str().unwrap().starts_with("profile."))
        .map(|r| (r["action"].as_str().unwrap(), r["service"].as_str().unwrap_or("-")))
        .collect();
    assert_eq!(
        actions,
        [
            ("profile.revert", "checkout"),
            ("profile.revert", "-"),
            ("profile.set", "-"),
            ("profile.apply", "-"),
            ("profile.apply", "checkout"),
            ("profile.set", "-"),
            ("profile.set", "-"),
        ],
        "{audit}"
    );
}

#[tokio::test]
async fn profiles_are_defined_applied_and_reverted_on_sqlite() {
    define_apply_revert(TestApp::spawn().await).await;
}

#[tokio::test]
async fn profiles_are_defined_applied_and_reverted_on_postgres() {
    if let Some(app) = TestApp::spawn_on(Db::Postgres).await {
        define_apply_revert(app).await;
    }
}

#[tokio::test]
async fn a_bad_definition_names_every_bad_field() {
    let app = TestApp::spawn().await;
    app.seed().await;
    let body = json!({"services": {
        "checkout": {"flags": {"nope": true, "recommendations.enabled": 3}, "read_only": true,
                     "breakers": [{"dependency": "ghost", "state": "forced_open"}]},
        "ghost-service": {}
    }, "reason": "r"});
    let (s, h, b) = app.call(Method::PUT, &format!("{PROFILES}/bad"), Some(body)).await;
    assert_problem(s, &h, &b, StatusCode::UNPROCESSABLE_ENTITY);
    let paths: Vec<&str> =
        b["errors"].as_array().unwrap().iter().map(|e| e["path"].as_str().unwrap()).collect();
    assert_eq!(
        paths,
        [
            "services.checkout.flags.nope",
            "services.checkout.flags.recommendations.enabled",
            "services.checkout.read_only",
            "services.ghost-service",
        ],
        "{b}"
    );
    // The dependency a breaker names is checked by the policy's own validation.
    let body = json!({"services": {"checkout": {"breakers": [{"dependency": "ghost", "state": "forced_open"}]}},
                      "reason": "r"});
    let (s, h, b) = app.call(Method::PUT, &format!("{PROFILES}/bad"), Some(body)).await;
    assert_problem(s, &h, &b, StatusCode::UNPROCESSABLE_ENTITY);
    assert!(b["errors"][0]["path"].as_str().unwrap().starts_with("services.checkout."), "{b}");

    // A lever out of range: the profile's field, the value and the allowed range.
    let body = json!({"services": {"checkout": {"shed_sheddable_percent": 120, "inbound_limit": 0}},
                      "reason": "r"});
    let (s, h, b) = app.call(Method::PUT, &format!("{PROFILES}/bad"), Some(body)).await;
    assert_problem(s, &h, &b, StatusCode::UNPROCESSABLE_ENTITY);
    let errors: Vec<(&str, &str, &str)> = b["errors"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| (e["path"].as_str().unwrap(), e["value"].as_str().unwrap(), e["message"].as_str().unwrap()))
        .collect();
    assert_eq!(
        errors,
        [
            ("services.checkout.shed_sheddable_percent", "120", "must be between 0 and 100 percent"),
            ("services.checkout.inbound_limit", "0", "must be between 1 and 100000"),
        ],
        "{b}"
    );

    let (s, _, _) = app.call(Method::PUT, &format!("{PROFILES}/ok"), Some(definition())).await;
    assert_eq!(s, StatusCode::CREATED);
    for (body, field) in [
        (json!({"reason": "r"}), "expires_at"),
        (json!({"expires_at": "2001-01-01T00:00:00Z", "reason": "r"}), "expires_at"),
        (json!({"expires_in": "30d", "reason": "r"}), "expires_at"),
        (json!({"expires_in": "1h", "reason": " "}), "reason"),
    ] {
        let (s, h, b) = app.call(Method::POST, &format!("{PROFILES}/ok/apply"), Some(body.clone())).await;
        assert!(s.is_client_error(), "{body}: {b}");
        assert_problem(s, &h, &b, s);
        assert_eq!(b["errors"][0]["path"], field, "{body}: {b}");
    }
    let (s, h, b) = app
        .call(
            Method::POST,
            &format!("{PROFILES}/missing/apply"),
            Some(json!({"expires_in": "1h", "reason": "r"})),
        )
        .await;
    assert_problem(s, &h, &b, StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn an_expired_profile_is_reverted_by_the_server_and_a_changed_entry_is_left() {
    let app = TestApp::spawn().await;
    app.seed().await;
    let (s, _, _) = app.call(Method::PUT, &format!("{PROFILES}/recs-down"), Some(definition())).await;
    assert_eq!(s, StatusCode::CREATED);
    let (s, _, a) = app
        .call(
            Method::POST,
            &format!("{PROFILES}/recs-down/apply"),
            Some(json!({"expires_in": "1h", "reason": "r"})),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{a}");
    // An operator takes the breaker back by hand meanwhile.
    let (s, _, b) = app
        .call(
            Method::PUT,
            &format!("{SVC}/breaker-overrides/recommendations"),
            Some(json!({"state": "forced_closed", "reason": "probing by hand"})),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{b}");

    let actions = &app.server.as_ref().unwrap().actions;
    let not_yet = Timestamp::from_unix_ms(Timestamp::now().unix_ms() + 30 * 60_000);
    assert_eq!(actions.expire_profiles(not_yet).await.unwrap(), 0);
    let after = Timestamp::from_unix_ms(Timestamp::now().unix_ms() + 2 * 3_600_000);
    assert_eq!(actions.expire_profiles(after).await.unwrap(), 1);
    assert_eq!(actions.expire_profiles(after).await.unwrap(), 0, "reverted once");

    let cfg = snapshot(&app).await;
    assert_eq!(cfg["flags"]["recommendations.enabled"]["value"], json!(true), "{cfg}");
    assert_eq!(
        cfg["flags"]["recommendations.enabled"].get("expires_at").cloned().unwrap_or(Value::Null),
        Value::Null
    );
    assert_eq!(cfg["faults"], json!([]));
    assert_eq!(cfg.get("levers"), None, "the levers end with the profile");
    assert_eq!(cfg["breaker_overrides"][0]["state"], "forced_closed", "changed since: left as it is");
    let (_, _, list) = app.call(Method::GET, "/api/v1/environments/prod/profile-activations", None).await;
    assert_eq!(list[0]["reverted_by"], "levee", "{list}");
    assert!(list[0]["revert_reason"].as_str().unwrap().contains("expired"), "{list}");
}

//! The audit log records JSON values of the target — as it was (`before`) and as it is
//! after (`after`), `null` where it does not exist — for every kind of row: refused and
//! conflicting writes (why in `detail`, the target unchanged), the expiry, and emergency
//! profiles applied and reverted. Read through `GET /audit`, on SQLite and PostgreSQL.

use levee_agent::policy::Timestamp;
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

use crate::helpers::TestApp;

const SVC: &str = "/api/v1/environments/prod/services/checkout";
const FLAG: &str = "/api/v1/environments/prod/services/checkout/flags/recommendations.enabled";

/// The service's configuration as agents receive it.
async fn config(app: &TestApp) -> Value {
    let (s, _, snap) = app.call(Method::GET, &format!("{SVC}/snapshot"), None).await;
    assert_eq!(s, StatusCode::OK, "{snap}");
    snap["config"].clone()
}

/// The breaker override of `dependency` in `cfg`, or `null`.
fn breaker(cfg: &Value, dependency: &str) -> Value {
    cfg["breaker_overrides"]
        .as_array()
        .and_then(|a| a.iter().find(|o| o["dependency"] == dependency))
        .cloned()
        .unwrap_or(Value::Null)
}

/// The newest audit rows matching `query`.
async fn audit(app: &TestApp, query: &str) -> Vec<Value> {
    let (s, _, rows) = app.call(Method::GET, &format!("/api/v1/audit?{query}"), None).await;
    assert_eq!(s, StatusCode::OK, "{rows}");
    rows.as_array().unwrap().clone()
}

on_both_backends! {
/// A refused write and a conflicting one change nothing: `before` and `after` are both the
/// target as stored (`null` when it does not exist), the refusal is in `detail`.
async fn refused_and_conflicting_writes_record_the_unchanged_target_and_why(app) {
    app.seed().await;
    let flag = config(&app).await["flags"]["recommendations.enabled"].clone();
    assert_eq!(flag["value"], json!(true), "{flag}");

    // Refused by the edit: a value of the wrong type for an existing flag.
    let (s, _, b) = app.call(Method::PATCH, FLAG, Some(json!({"value": "off", "reason": "typo"}))).await;
    assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{b}");
    let row = &audit(&app, "service=checkout&limit=1").await[0];
    assert_eq!((&row["action"], &row["outcome"]), (&json!("flag.set"), &json!("rejected")), "{row}");
    assert_eq!(row["before"], flag, "{row}");
    assert_eq!(row["after"], flag, "{row}");
    assert_eq!(row["detail"], json!("invalid value: value: must be a bool value, as the flag's type says (got \"off\")"), "{row}");

    // Refused: a flag that does not exist was neither there before nor after.
    let (s, _, b) = app
        .call(Method::DELETE, &format!("{SVC}/flags/nope?reason=cleanup"), None)
        .await;
    assert_eq!(s, StatusCode::NOT_FOUND, "{b}");
    let row = &audit(&app, "service=checkout&limit=1").await[0];
    assert_eq!((&row["action"], &row["outcome"]), (&json!("flag.delete"), &json!("rejected")), "{row}");
    assert_eq!((&row["before"], &row["after"]), (&Value::Null, &Value::Null), "{row}");
    assert!(row["detail"].as_str().is_some_and(|d| d.contains("nope")), "{row}");

    // A conflict: the policy as stored (revision 1 was moved past) on both sides.
    let policy = config(&app).await["policy"].clone();
    let (s, _, b) = app
        .call(Method::PATCH, FLAG, Some(json!({"value": false, "reason": "incident"})))
        .await;
    assert_eq!(s, StatusCode::OK, "{b}");
    let mut newer = policy.clone();
    newer["default_deadline"] = json!("900ms");
    let (s, _, b) = app
        .call_as(
            &app.token,
            Method::PUT,
            &format!("{SVC}/policy"),
            Some(json!({"policy": newer, "reason": "stale edit"})),
            &[("if-match", "\"1\"")],
        )
        .await;
    assert_eq!(s, StatusCode::CONFLICT, "{b}");
    let row = &audit(&app, "service=checkout&limit=1").await[0];
    assert_eq!((&row["action"], &row["outcome"]), (&json!("policy.update"), &json!("conflict")), "{row}");
    assert_eq!(row["before"], policy, "{row}");
    assert_eq!(row["after"], policy, "{row}");
    assert_eq!(row["detail"], json!("revision conflict: expected 1, current 2"), "{row}");
    assert_eq!(row["revision"], Value::Null, "{row}");
}
}

on_both_backends! {
/// The expiry records the entries it removed as they were and `null` after, the policy
/// before and after when a kill switch reverts to its compiled-in default, and what it
/// did in words.
async fn expiry_records_the_removed_entries_and_the_policy(app) {
    // A kill switch created with an expiry: nothing to go back to, so it is removed (a
    // flag given an expiry later goes back to what it was: `temporary_flips.rs`).
    let hour = Timestamp::from_unix_ms(Timestamp::now().unix_ms() + 3_600_000);
    app.seed_with_switch_until(Some(hour.to_string())).await;
    let policy_before = config(&app).await["policy"].clone();
    let (s, _, b) = app
        .call(
            Method::PUT,
            &format!("{SVC}/breaker-overrides/recommendations"),
            Some(json!({"state": "forced_open", "expires_at": hour.to_string(), "reason": "1 h"})),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{b}");
    let set = config(&app).await;
    let (flag, forced) = (set["flags"]["recommendations.enabled"].clone(), breaker(&set, "recommendations"));
    assert_eq!((&flag["expires_at"], &forced["state"]), (&json!(hour.to_string()), &json!("forced_open")), "{set}");

    let later = Timestamp::from_unix_ms(hour.unix_ms() + 1000);
    assert_eq!(app.server.as_ref().unwrap().actions.expire(later).await.unwrap(), 1);
    let after = config(&app).await;
    assert_eq!(after["policy"]["compiled_in_flags"], json!(["recommendations.enabled"]), "{after}");

    let row = &audit(&app, "actor=levee&limit=1").await[0];
    assert_eq!((&row["action"], &row["outcome"]), (&json!("expiry"), &json!("ok")), "{row}");
    assert_eq!(
        row["before"],
        json!({"flags": {"recommendations.enabled": flag},
               "breaker_overrides": {"recommendations": forced},
               "policy": policy_before}),
        "{row}"
    );
    assert_eq!(
        row["after"],
        json!({"flags": {"recommendations.enabled": null},
               "breaker_overrides": {"recommendations": null},
               "policy": after["policy"]}),
        "{row}"
    );
    assert_eq!(
        row["detail"],
        json!("removed flag recommendations.enabled, breaker override recommendations; \
               kill switch recommendations.enabled now declared in policy.compiled_in_flags"),
        "{row}"
    );
}
}

on_both_backends! {
/// Applying a profile records, per service, the entries it set as they were and as it set
/// them; reverting it, the same entries as it left them and as restored, with what was
/// restored in `detail`; the environment's rows record the application itself.
async fn profile_apply_and_revert_record_the_entries_they_change(app) {
    app.seed().await;
    let original = config(&app).await;
    let (s, _, b) = app
        .call(
            Method::PUT,
            "/api/v1/environments/prod/profiles/recs-down",
            Some(json!({
                "services": {"checkout": {
                    "flags": {"recommendations.enabled": false},
                    "breakers": [{"dependency": "recommendations", "state": "forced_open"}],
                    "pause_retries": true
                }},
                "reason": "agreed"
            })),
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
    let applied = config(&app).await;
    let entries = |cfg: &Value| {
        json!({"flags": {"recommendations.enabled": cfg["flags"]["recommendations.enabled"]},
               "breaker_overrides": {"recommendations": breaker(cfg, "recommendations")},
               "levers": cfg.get("levers").cloned().unwrap_or(Value::Null)})
    };
    assert_eq!(applied["levers"]["retries_paused"], json!(true), "{applied}");
    let activation = json!({"profile": "recs-down", "version": 1, "expires_at": a["expires_at"],
                            "services": ["checkout"]});

    let rows = audit(&app, "environment=prod&limit=2").await;
    let (env_row, svc_row) = (&rows[0], &rows[1]);
    assert_eq!((&svc_row["action"], &svc_row["service"]), (&json!("profile.apply"), &json!("checkout")));
    assert_eq!(svc_row["before"], entries(&original), "{svc_row}");
    assert_eq!(svc_row["before"]["breaker_overrides"]["recommendations"], Value::Null, "{svc_row}");
    assert_eq!(svc_row["after"], entries(&applied), "{svc_row}");
    assert_eq!((&env_row["action"], &env_row["service"]), (&json!("profile.apply"), &Value::Null));
    assert_eq!((&env_row["before"], &env_row["after"]), (&Value::Null, &activation), "{env_row}");

    let (s, _, r) = app
        .call(
            Method::POST,
            "/api/v1/environments/prod/active-profile/revert",
            Some(json!({"reason": "INC-1 resolved"})),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{r}");
    let reverted = config(&app).await;
    assert_eq!(entries(&reverted), entries(&original), "everything restored: {reverted}");
    let rows = audit(&app, "environment=prod&limit=2").await;
    let (svc_row, env_row) = (&rows[0], &rows[1]);
    assert_eq!((&svc_row["action"], &svc_row["service"]), (&json!("profile.revert"), &json!("checkout")));
    assert_eq!(svc_row["before"], entries(&applied), "{svc_row}");
    assert_eq!(svc_row["after"], entries(&original), "{svc_row}");
    assert_eq!(
        svc_row["detail"],
        json!("flag recommendations.enabled restored; breaker override recommendations restored; levers restored"),
        "{svc_row}"
    );
    assert_eq!((&env_row["action"], &env_row["service"]), (&json!("profile.revert"), &Value::Null));
    assert_eq!((&env_row["before"], &env_row["after"]), (&activation, &Value::Null), "{env_row}");
}
}

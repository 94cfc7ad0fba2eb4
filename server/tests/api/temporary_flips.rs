//! A temporary value of a flag that existed (`levee flip … --for`, a `PATCH`/`PUT` with
//! `expires_at`) ends by putting back the flag as it was, not by deleting it: deleting a
//! kill switch git declares would make every later dry run plan a change and agents use the
//! compiled-in default. The expiry is driven by
//! calling the sweeper's action with a later instant (no waiting).

use levee_agent::policy::Timestamp;
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

use crate::helpers::TestApp;

const SVC: &str = "/api/v1/environments/prod/services/checkout";
const FLAG: &str = "/api/v1/environments/prod/services/checkout/flags/recommendations.enabled";

fn in_ms(ms: i64) -> Timestamp {
    Timestamp::from_unix_ms(Timestamp::now().unix_ms() + ms)
}

async fn get(app: &TestApp, path: &str) -> Value {
    let (s, _, b) = app.call(Method::GET, path, None).await;
    assert_eq!(s, StatusCode::OK, "{b}");
    b
}

async fn patch(app: &TestApp, body: Value) {
    let (s, _, b) = app.call(Method::PATCH, FLAG, Some(body)).await;
    assert_eq!(s, StatusCode::OK, "{b}");
}

on_both_backends! {
/// The flip's expiry puts back the flag as it was before the FIRST flip (a second flip
/// while one is pending keeps that original), in the revision that removes the temporary
/// value, audited as the expiry with the flag's values before and after.
async fn a_temporary_flip_ends_by_putting_back_the_flag_as_it_was(app) {
    app.seed().await;
    let declared = get(&app, FLAG).await;
    assert_eq!(get(&app, &format!("{SVC}/temporary-flags")).await, json!([]));
    let hour = in_ms(3_600_000);
    patch(&app, json!({"value": false, "expires_at": hour.to_string(), "reason": "INC-1"})).await;
    let two_hours = in_ms(2 * 3_600_000);
    patch(&app, json!({"value": false, "expires_at": two_hours.to_string(), "reason": "INC-1 longer"})).await;
    let flipped = get(&app, FLAG).await;
    assert_eq!((&flipped["value"], &flipped["expires_at"]), (&json!(false), &json!(two_hours.to_string())));
    assert_eq!(
        get(&app, &format!("{SVC}/temporary-flags")).await,
        json!([{"key": "recommendations.enabled", "flag": flipped, "restores": declared}]),
        "the original, not the first flip, is what the flag goes back to"
    );

    let actions = &app.server.as_ref().unwrap().actions;
    assert_eq!(actions.expire(hour).await.unwrap(), 0, "the second flip's expiry counts");
    let revision = get(&app, SVC).await["revision"].clone();
    assert_eq!(actions.expire(Timestamp::from_unix_ms(two_hours.unix_ms() + 1000)).await.unwrap(), 1);
    assert_eq!(get(&app, FLAG).await, declared);
    let cfg = get(&app, &format!("{SVC}/snapshot")).await;
    assert_eq!(cfg["revision"], revision.as_u64().unwrap() + 1, "one revision");
    let compiled_in = &cfg["config"]["policy"]["compiled_in_flags"];
    assert!(compiled_in.as_array().is_none_or(Vec::is_empty), "{cfg}");
    assert_eq!(get(&app, &format!("{SVC}/temporary-flags")).await, json!([]), "the memory is dropped");

    let (_, _, rows) = app.call(Method::GET, "/api/v1/audit?actor=levee&limit=1", None).await;
    let row = &rows[0];
    assert_eq!((&row["action"], &row["outcome"]), (&json!("expiry"), &json!("ok")), "{row}");
    assert_eq!(row["before"], json!({"flags": {"recommendations.enabled": flipped}}), "{row}");
    assert_eq!(row["after"], json!({"flags": {"recommendations.enabled": declared}}), "{row}");
    assert_eq!(
        row["detail"],
        json!("restored flag recommendations.enabled back to true (its value before the temporary one)"),
        "{row}"
    );
}
}

on_both_backends! {
/// A write without expiry settles the flag (the operator decided the value): nothing is
/// remembered any more, and a later temporary value goes back to the settled flag.
async fn a_permanent_write_forgets_what_the_flag_went_back_to(app) {
    app.seed().await;
    let hour = in_ms(3_600_000);
    patch(&app, json!({"value": false, "expires_at": hour.to_string(), "reason": "INC-2"})).await;
    patch(&app, json!({"value": false, "reason": "keep it off"})).await;
    assert_eq!(get(&app, &format!("{SVC}/temporary-flags")).await, json!([]));
    let settled = get(&app, FLAG).await;

    // A PUT with an expiry remembers the settled flag; a PUT without one forgets it.
    let put = |value: bool, expires_at: Option<Timestamp>| {
        let mut body = json!({"type": "bool", "value": value, "description": "kill switch", "reason": "x"});
        if let Some(t) = expires_at {
            body["expires_at"] = json!(t.to_string());
        }
        body
    };
    let (s, _, b) = app.call(Method::PUT, FLAG, Some(put(true, Some(hour)))).await;
    assert_eq!(s, StatusCode::OK, "{b}");
    let temporary = get(&app, &format!("{SVC}/temporary-flags")).await;
    assert_eq!(temporary[0]["restores"], settled, "{temporary}");
    let (s, _, b) = app.call(Method::PUT, FLAG, Some(put(true, None))).await;
    assert_eq!(s, StatusCode::OK, "{b}");
    assert_eq!(get(&app, &format!("{SVC}/temporary-flags")).await, json!([]));
    let actions = &app.server.as_ref().unwrap().actions;
    assert_eq!(actions.expire(Timestamp::from_unix_ms(hour.unix_ms() + 1000)).await.unwrap(), 0);
    assert_eq!(get(&app, FLAG).await["value"], json!(true));

    let (s, _, b) = app.call(Method::GET, "/api/v1/environments/prod/services/nope/temporary-flags", None).await;
    assert_eq!(s, StatusCode::NOT_FOUND, "{b}");
}
}

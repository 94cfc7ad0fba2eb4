//! The API as automation sees it: every time is RFC 3339 (answers and query parameters),
//! the audit log's before/after are JSON values, and a bad duration says what is accepted.

use levee_agent::policy::Timestamp;
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

use crate::helpers::assert_problem;

const SVC: &str = "/api/v1/environments/prod/services/checkout";

/// Asserts `v[field]` is an RFC 3339 string within a minute of now; returns it.
fn recent(v: &Value, field: &str) -> Timestamp {
    let s = v[field].as_str().unwrap_or_else(|| panic!("{field} is not a string in {v}"));
    let t = Timestamp::parse(s).unwrap_or_else(|| panic!("{field} = {s:?} is not RFC 3339"));
    let age = Timestamp::now().unix_ms() - t.unix_ms();
    assert!((-60_000..60_000).contains(&age), "{field} = {s} is not now");
    t
}

on_both_backends! {
async fn every_time_in_the_answers_is_rfc3339(app) {
    let res = app
        .client
        .post(app.url("/api/v1/auth/login"))
        .json(&json!({"username": "admin", "password": crate::helpers::ADMIN_PASSWORD}))
        .send()
        .await
        .unwrap();
    let login: Value = res.json().await.unwrap();
    let expires = recent_or_later(&login, "expires_at");
    assert!(expires.unix_ms() > Timestamp::now().unix_ms() + 11 * 3600 * 1000, "{login}");
    app.seed().await;

    let (_, _, envs) = app.call(Method::GET, "/api/v1/environments", None).await;
    recent(&envs[0], "created_at");
    let (_, _, services) = app.call(Method::GET, "/api/v1/environments/prod/services", None).await;
    recent(&services[0], "updated_at");
    let (_, _, one) = app.call(Method::GET, SVC, None).await;
    recent(&one, "updated_at");
    let (_, _, revs) = app.call(Method::GET, &format!("{SVC}/revisions"), None).await;
    recent(&revs[0], "created_at");
    let (_, _, snap) = app.call(Method::GET, &format!("{SVC}/snapshot"), None).await;
    recent(&snap, "created_at");
    let (_, _, rev) = app.call(Method::GET, &format!("{SVC}/revisions/1"), None).await;
    recent(&rev, "created_at");

    let (s, _, minted) = app
        .call(
            Method::POST,
            "/api/v1/tokens",
            Some(json!({"kind": "api", "name": "ci", "role": "operator", "expires_in": "1.5d", "reason": "ci"})),
        )
        .await;
    assert_eq!(s, StatusCode::CREATED, "{minted}");
    let created = recent(&minted, "created_at");
    let expires = recent_or_later(&minted, "expires_at");
    assert_eq!(expires.unix_ms() - created.unix_ms(), 36 * 3600 * 1000, "1.5d is a day and a half");
    assert_eq!(minted["revoked_at"], Value::Null);
    let id = minted["id"].as_str().unwrap();
    let (s, _, _) = app.call(Method::DELETE, &format!("/api/v1/tokens/{id}?reason=rotated"), None).await;
    assert_eq!(s, StatusCode::NO_CONTENT);
    let (_, _, tokens) = app.call(Method::GET, "/api/v1/tokens", None).await;
    recent(&tokens[0], "revoked_at");

    let (_, _, users) = app.call(Method::GET, "/api/v1/users", None).await;
    recent(&users[0], "created_at");
    let (_, _, audit) = app.call(Method::GET, "/api/v1/audit", None).await;
    for row in audit.as_array().unwrap() {
        recent(row, "at");
    }
}
}

/// Like `recent`, for times in the future (expiries).
fn recent_or_later(v: &Value, field: &str) -> Timestamp {
    let s = v[field].as_str().unwrap_or_else(|| panic!("{field} is not a string in {v}"));
    let t = Timestamp::parse(s).unwrap_or_else(|| panic!("{field} = {s:?} is not RFC 3339"));
    assert!(t.unix_ms() > Timestamp::now().unix_ms() - 60_000, "{field} = {s} is in the past");
    t
}

on_both_backends! {
async fn audit_before_and_after_are_json_values_and_since_until_take_rfc3339(app) {
    app.seed().await;
    let (s, _, b) = app
        .call(
            Method::PATCH,
            &format!("{SVC}/flags/recommendations.enabled"),
            Some(json!({"value": false, "reason": "incident 7"})),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{b}");
    let (_, _, audit) = app.call(Method::GET, "/api/v1/audit?service=checkout&limit=1", None).await;
    let row = &audit[0];
    assert_eq!(row["action"], "flag.set", "{row}");
    assert_eq!(row["before"]["value"], json!(true), "before is a JSON object: {row}");
    assert_eq!(row["after"]["value"], json!(false), "after is a JSON object: {row}");
    assert_eq!(row["after"]["type"], json!("bool"));

    let (_, _, all) = app.call(Method::GET, "/api/v1/audit?service=checkout", None).await;
    let created = recent(all.as_array().unwrap().last().unwrap(), "at");
    let flipped = recent(row, "at");
    let at = |t: Timestamp, ms: i64| Timestamp::from_unix_ms(t.unix_ms() + ms).to_rfc3339();
    let count = |q: String| {
        let app = &app;
        async move {
            let (s, _, b) = app.call(Method::GET, &format!("/api/v1/audit?service=checkout&{q}"), None).await;
            assert_eq!(s, StatusCode::OK, "{q}: {b}");
            b.as_array().unwrap().len()
        }
    };
    assert_eq!(count(format!("since={}&until={}", at(created, 0), at(flipped, 0))).await, 2);
    assert_eq!(count(format!("since={}", at(flipped, 1))).await, 0);
    assert_eq!(count(format!("until={}", at(created, -1))).await, 0);
    // Any offset is accepted (`+` escaped in a query string): the same instant, the same rows.
    let paris = format!("{}+01:00", at(flipped, 3_600_000).trim_end_matches('Z')).replace('+', "%2B");
    assert_eq!(count(format!("since={paris}")).await, count(format!("since={}", at(flipped, 0))).await);
    assert_eq!(count(format!("since={}", at(flipped, 0))).await.min(1), 1);

    let (s, h, b) = app.call(Method::GET, "/api/v1/audit?since=yesterday", None).await;
    assert_problem(s, &h, &b, StatusCode::BAD_REQUEST);
    assert_eq!(b["errors"][0]["path"], "since", "{b}");
    assert_eq!(b["errors"][0]["value"], "\"yesterday\"", "{b}");
    assert!(b["detail"].as_str().unwrap().contains("expected RFC 3339"), "{b}");
    let (s, h, b) = app.call(Method::GET, "/api/v1/audit?until=1764590400000", None).await;
    assert_problem(s, &h, &b, StatusCode::BAD_REQUEST);
    assert_eq!(b["errors"][0]["path"], "until", "milliseconds are not a time any more: {b}");
    let (s, h, b) = app.call(Method::GET, "/api/v1/audit?limit=many", None).await;
    assert_problem(s, &h, &b, StatusCode::BAD_REQUEST);
    assert_eq!(b["errors"][0]["path"], "limit", "{b}");
}
}

on_both_backends! {
async fn a_bad_duration_echoes_the_value_and_the_accepted_formats(app) {
    app.seed().await;
    let (_, _, doc) = app.call(Method::GET, &format!("{SVC}/policy"), None).await;
    let mut policy = doc["policy"].clone();
    for (bad, echoed) in
        [(json!("300"), "\"300\""), (json!("fast"), "\"fast\""), (json!(300), "integer `300`")]
    {
        policy["dependencies"]["recommendations"]["attempt_timeout"] = bad.clone();
        let (s, h, b) = app
            .call_as(
                &app.token,
                Method::PUT,
                &format!("{SVC}/policy"),
                Some(json!({"policy": policy, "reason": "typo"})),
                &[("if-match", "*")],
            )
            .await;
        assert_problem(s, &h, &b, StatusCode::BAD_REQUEST);
        let detail = b["detail"].as_str().unwrap();
        assert_eq!(b["errors"][0]["path"], "policy.dependencies.recommendations.attempt_timeout", "{b}");
        assert!(detail.contains(echoed), "{bad}: {detail}");
        assert!(detail.contains(r#""250ms", "1.5s""#), "{bad}: {detail}");
    }
    // And a fraction is a duration.
    policy["dependencies"]["recommendations"]["attempt_timeout"] = json!("0.075s");
    let (s, _, b) = app
        .call_as(
            &app.token,
            Method::PUT,
            &format!("{SVC}/policy"),
            Some(json!({"policy": policy, "reason": "75 ms"})),
            &[("if-match", "*")],
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{b}");
    let (_, _, doc) = app.call(Method::GET, &format!("{SVC}/policy"), None).await;
    assert_eq!(doc["policy"]["dependencies"]["recommendations"]["attempt_timeout"], "75ms");
}
}

on_both_backends! {
/// Every property and query parameter of the OpenAPI document that names a time is an
/// RFC 3339 string: a new field written as milliseconds fails here.
async fn the_openapi_document_types_every_time_as_date_time(app) {
    let doc: Value =
        app.client.get(app.url("/api/v1/openapi.json")).send().await.unwrap().json().await.unwrap();
    let is_time = |name: &str| {
        name == "at"
            || name.ends_with("_at")
            || name == "since"
            || name == "until"
            || name.ends_with("_since")
            || name == "last_seen"
    };
    let mut checked = Vec::new();
    let mut wrong = Vec::new();
    let schemas = doc["components"]["schemas"].clone();
    let resolve = |s: &Value| match s["$ref"].as_str() {
        Some(r) => schemas[r.trim_start_matches("#/components/schemas/")].clone(),
        None => s.clone(),
    };
    let mut check = |where_: String, schema: &Value| {
        // `Option<T>` is `{"type": ["string", "null"]}`, or a oneOf of T and null.
        let alternatives: Vec<Value> = match schema["oneOf"].as_array() {
            Some(one_of) => one_of.iter().map(resolve).filter(|s| s["type"] != "null").collect(),
            None => vec![resolve(schema)],
        };
        let ok = alternatives.len() == 1 && {
            let s = &alternatives[0];
            let types: Vec<&str> = match &s["type"] {
                Value::String(t) => vec![t.as_str()],
                Value::Array(ts) => ts.iter().filter_map(Value::as_str).collect(),
                _ => Vec::new(),
            };
            types.contains(&"string") && !types.contains(&"integer") && s["format"] == "date-time"
        };
        if ok { checked.push(where_) } else { wrong.push(format!("{where_}: {schema}")) }
    };
    for (name, schema) in doc["components"]["schemas"].as_object().unwrap() {
        for (prop, s) in schema["properties"].as_object().into_iter().flatten() {
            if is_time(prop) {
                check(format!("{name}.{prop}"), s);
            }
            assert!(
                !prop.ends_with("_ms"),
                "{name}.{prop}: a time is RFC 3339, a duration a string like \"250ms\""
            );
        }
    }
    for (path, item) in doc["paths"].as_object().unwrap() {
        for (method, op) in item.as_object().unwrap() {
            for p in op["parameters"].as_array().into_iter().flatten() {
                let name = p["name"].as_str().unwrap_or("");
                if is_time(name) {
                    check(format!("{method} {path} ?{name}"), &p["schema"]);
                }
            }
        }
    }
    assert!(wrong.is_empty(), "times that are not RFC 3339 strings:\n{}", wrong.join("\n"));
    for expected in ["AuditRow.at", "TokenRow.expires_at", "AgentRow.last_seen", "get /api/v1/audit ?since"] {
        assert!(checked.iter().any(|c| c == expected), "{expected} not checked: {checked:?}");
    }
}
}

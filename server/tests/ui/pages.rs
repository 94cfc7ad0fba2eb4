//! Read-only pages: environments, the services overview, the audit log.

use reqwest::{Method, StatusCode};
use serde_json::json;

use crate::helpers::{KILL_SWITCH, SERVICE, TestApp};

#[tokio::test]
async fn environments_and_overview_list_what_exists() {
    let app = TestApp::spawn().await;
    app.seed().await;
    app.user("vera", "viewer").await;
    let mut b = app.logged_in("vera").await;
    let home = b.get("/").await;
    assert_eq!(home.status, StatusCode::OK);
    assert!(home.body.contains("href=\"/ui/environments/prod\""), "{}", home.body);
    let overview = b.get("/ui/environments/prod").await;
    assert_eq!(overview.status, StatusCode::OK);
    assert!(overview.body.contains(&format!("href=\"{SERVICE}\"")), "{}", overview.body);
    let missing = b.get("/ui/environments/nope").await;
    assert_eq!(missing.status, StatusCode::NOT_FOUND);
    assert!(missing.body.contains("no environment"), "{}", missing.body);
    assert_eq!(b.get("/ui/environments/prod/services/nope").await.status, StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn audit_page_filters_by_service_and_actor_newest_first() {
    let app = TestApp::spawn().await;
    app.seed().await;
    app.user("olivia", "operator").await;
    // Admin changes another service through the API; olivia flips the switch in the UI.
    let (s, _, b) = app
        .api(
            Method::POST,
            "/environments/prod/services",
            Some(json!({"name": "cart", "reason": "cart via api"})),
        )
        .await;
    assert_eq!(s, StatusCode::CREATED, "{b}");
    let mut b = app.logged_in("olivia").await;
    let csrf = b.get(SERVICE).await.csrf();
    for (value, reason) in [("false", "first flip by olivia"), ("true", "second flip by olivia")] {
        let rev = app.snapshot().await["revision"].as_u64().unwrap().to_string();
        let res = b
            .post(KILL_SWITCH, &[("csrf", &csrf), ("value", value), ("revision", &rev), ("reason", reason)])
            .await;
        assert_eq!(res.status, StatusCode::SEE_OTHER, "{}", res.body);
    }

    let mine = b.get("/ui/audit?actor=olivia").await;
    assert_eq!(mine.status, StatusCode::OK);
    let second = mine.body.find("second flip by olivia").expect("newest entry shown");
    let first = mine.body.find("first flip by olivia").expect("older entry shown");
    assert!(second < first, "newest first");
    assert!(!mine.body.contains("cart via api"), "another actor's entry is filtered out");
    assert!(mine.body.contains("value=\"olivia\""), "the filter stays in the form");

    let cart = b.get("/ui/audit?service=cart&actor=").await;
    assert!(cart.body.contains("cart via api"));
    assert!(!cart.body.contains("flip by olivia"));

    let bad = b.get("/ui/audit?before_id=abc").await;
    assert_eq!(bad.status, StatusCode::BAD_REQUEST);
}

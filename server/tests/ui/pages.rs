//! Read-only pages: environments, the services overview, the audit log.

use reqwest::{Method, StatusCode};
use serde_json::json;

use crate::helpers::{KILL_SWITCH, SERVICE};

on_both_backends! {
async fn environments_and_overview_list_what_exists(app) {
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
}

on_both_backends! {
async fn audit_page_filters_by_service_and_actor_newest_first(app) {
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

    // By action: a family, and every change without the logins.
    let flags = b.get("/ui/audit?action=flag").await;
    assert!(flags.body.contains("second flip by olivia"), "{}", flags.body);
    assert!(!flags.body.contains("cart via api"), "service.create is not a flag action");
    let changes = b.get("/ui/audit?action=changes").await;
    assert!(changes.body.contains("cart via api") && changes.body.contains("first flip by olivia"));
    assert!(!changes.body.contains("<code>auth.login</code>"), "no logins: {}", changes.body);
    let logins = b.get("/ui/audit?action=auth").await;
    assert!(logins.body.contains("<code>auth.login</code>") && !logins.body.contains("flip by olivia"));
    let unknown = b.get("/ui/audit?action=nonsense").await;
    assert_eq!(unknown.status, StatusCode::BAD_REQUEST);
    assert!(unknown.body.contains("is not one of: changes, access.refused"), "{}", unknown.body);

    let bad = b.get("/ui/audit?before_id=abc").await;
    assert_eq!(bad.status, StatusCode::BAD_REQUEST);
}
}

on_both_backends! {
/// OPS-1: the service page shows a kill switch that cannot work as a problem, never in
/// green; one declared as compiled into the service is not shown as fine either.
async fn ops_1_service_page_never_shows_a_dangling_kill_switch_in_green(app) {
    app.seed().await;
    let mut b = app.logged_in("admin").await;
    let page = b.get(SERVICE).await;
    assert!(
        page.body.contains(r#"<code>recommendations.enabled</code>: <span class="ok">on</span>"#),
        "{}",
        page.body
    );
    assert!(!page.body.contains(r#"id="problems""#));

    // Declared as compiled into the service, then deleted on the server: not switchable here.
    let (_, _, doc) = app.api(Method::GET, "/environments/prod/services/checkout/policy", None).await;
    let mut policy = doc["policy"].clone();
    policy["compiled_in_flags"] = json!(["recommendations.enabled"]);
    let (s, _, r) = app
        .api_with(
            Method::PUT,
            "/environments/prod/services/checkout/policy",
            Some(json!({"policy": policy, "reason": "code default"})),
            &[("if-match", "*")],
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{r}");
    let (s, _, r) = app
        .api(
            Method::DELETE,
            "/environments/prod/services/checkout/flags/recommendations.enabled?reason=gone",
            None,
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{r}");
    let page = b.get(SERVICE).await;
    let compiled_in = r#"<code>recommendations.enabled</code>: <span class="warn">compiled into the service"#;
    assert_eq!(page.body.matches(compiled_in).count(), 2, "dependency and matrix row: {}", page.body);

    // A snapshot stored before references were checked, naming a flag that does not exist
    // (written into the database as an older server stored it).
    sqlx::query("UPDATE revisions SET body = replace(body, $1, $2)")
        .bind(r#""enabled_flag":"recommendations.enabled""#)
        .bind(r#""enabled_flag":"recommendation.enabled""#)
        .execute(app._server.store.pool())
        .await
        .unwrap();
    let page = b.get(SERVICE).await;
    let broken = r#"<code>recommendation.enabled</code>: <span class="bad">broken: no such flag, this switch does nothing</span>"#;
    assert_eq!(page.body.matches(broken).count(), 2, "{}", page.body);
    assert!(page.body.contains(r#"id="problems""#), "{}", page.body);
    assert!(
        page.body.contains("<code>policy.dependencies.recommendations.enabled_flag</code>"),
        "{}",
        page.body
    );
    assert!(!page.body.contains(r#"<span class="ok">"#), "nothing in green: {}", page.body);
}
}

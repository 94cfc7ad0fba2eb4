//! Game-day fault rules, scheduled changes and change requests in the UI, through forms with
//! the session's anti-CSRF token.

use reqwest::{Method, StatusCode};
use serde_json::json;

use crate::helpers::TestApp;

#[tokio::test]
async fn fault_rules_need_an_expiry_are_listed_and_end_early() {
    let app = TestApp::spawn().await;
    app.seed().await;
    app.user("olivia", "operator").await;
    let mut b = app.logged_in("olivia").await;
    let url = "/ui/environments/prod/faults";
    let page = b.get(url).await;
    assert_eq!(page.status, StatusCode::OK, "{}", page.body);
    assert!(page.body.contains("No fault rule is active in prod."));
    let csrf = page.csrf();
    let form = |lasts: &'static str| {
        vec![
            ("service", "checkout"),
            ("id", "slow-pay"),
            ("dependency", "payments"),
            ("operation", ""),
            ("kind", "delay"),
            ("param", "2s"),
            ("percent", "25"),
            ("lasts", lasts),
            ("reason", "game day 12"),
        ]
    };
    let mut no_expiry = form("");
    no_expiry.push(("csrf", &csrf));
    let r = b.post(url, &no_expiry).await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    assert!(r.body.contains("every fault rule ends by itself"), "{}", r.body);
    assert_eq!(app.snapshot().await["config"]["faults"], json!([]));

    let mut ok = form("30m");
    ok.push(("csrf", &csrf));
    let r = b.post(url, &ok).await;
    assert_eq!(r.status, StatusCode::SEE_OTHER, "{}", r.body);
    let page = b.get(r.location()).await;
    assert!(page.body.contains("delay 2s"), "{}", page.body);
    let rule = &app.snapshot().await["config"]["faults"][0];
    assert_eq!((&rule["id"], &rule["percent"]), (&json!("slow-pay"), &json!(25.0)), "{rule}");
    assert!(rule["expires_at"].is_string());

    let r = b
        .post(&format!("{url}/checkout/slow-pay/end"), &[("csrf", &csrf), ("reason", "game day over")])
        .await;
    assert_eq!(r.status, StatusCode::SEE_OTHER, "{}", r.body);
    assert_eq!(app.snapshot().await["config"]["faults"], json!([]));
    let audit = app.audit().await;
    assert_eq!((audit[0]["action"].as_str(), audit[0]["via"].as_str()), (Some("fault.delete"), Some("ui")));
}

#[tokio::test]
async fn a_change_request_is_proposed_and_approved_by_a_second_user_in_the_ui() {
    let app = TestApp::spawn().await;
    app.seed().await;
    let (s, _, b) = app
        .api(
            Method::PUT,
            "/environments/prod/approval-rules",
            Some(json!({"kinds": ["flag"], "reason": "r"})),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{b}");
    app.user("olivia", "operator").await;
    app.user("rita", "operator").await;
    let url = "/ui/environments/prod/requests";
    let mut o = app.logged_in("olivia").await;
    let csrf = o.get(url).await.csrf();
    let r = o
        .post(
            url,
            &[
                ("csrf", &csrf),
                ("target", "checkout/recommendations.enabled"),
                ("value", "false"),
                ("reason", "INC-5"),
            ],
        )
        .await;
    assert_eq!(r.status, StatusCode::SEE_OTHER, "{}", r.body);
    let page = o.get(url).await;
    assert!(page.body.contains("<code>value</code>"), "the diff is shown: {}", page.body);
    assert!(!page.body.contains("Approve version 1"), "no approve button for the proposer");
    let own = o
        .post(
            &format!("{url}/1"),
            &[("csrf", &csrf), ("decision", "approve"), ("version", "1"), ("reason", "me")],
        )
        .await;
    assert_eq!(own.status, StatusCode::BAD_REQUEST);
    assert!(own.body.contains("someone else must approve it"), "{}", own.body);

    let mut r2 = app.logged_in("rita").await;
    let page = r2.get(url).await;
    assert!(page.body.contains("Approve version 1"), "{}", page.body);
    let csrf2 = page.csrf();
    let r = r2
        .post(
            &format!("{url}/1"),
            &[("csrf", &csrf2), ("decision", "approve"), ("version", "1"), ("reason", "ok")],
        )
        .await;
    assert_eq!(r.status, StatusCode::SEE_OTHER, "{}", r.body);
    let r = o
        .post(
            &format!("{url}/1"),
            &[("csrf", &csrf), ("decision", "apply"), ("version", "1"), ("reason", "go")],
        )
        .await;
    assert_eq!(r.status, StatusCode::SEE_OTHER, "{}", r.body);
    assert_eq!(app.kill_switch().await, false);
}

#[tokio::test]
async fn a_flag_value_is_scheduled_and_cancelled_in_the_ui() {
    let app = TestApp::spawn().await;
    app.seed().await;
    let mut b = app.logged_in("admin").await;
    let url = "/ui/environments/prod/scheduled";
    let csrf = b.get(url).await.csrf();
    let r = b
        .post(
            url,
            &[
                ("csrf", &csrf),
                ("target", "checkout/recommendations.enabled"),
                ("value", "false"),
                ("run_in", "1h"),
                ("revert_in", "2h"),
                ("reason", "maintenance"),
            ],
        )
        .await;
    assert_eq!(r.status, StatusCode::SEE_OTHER, "{}", r.body);
    let page = b.get(url).await;
    assert!(page.body.contains("checkout: flag recommendations.enabled"), "{}", page.body);
    assert!(page.body.contains("pending"));
    let r = b.post(&format!("{url}/1/cancel"), &[("csrf", &csrf), ("reason", "not needed")]).await;
    assert_eq!(r.status, StatusCode::SEE_OTHER, "{}", r.body);
    let (_, _, list) = app.api(Method::GET, "/environments/prod/scheduled-changes", None).await;
    assert_eq!(list[0]["state"], "cancelled", "{list}");
    assert_eq!(app.kill_switch().await, true);
}

#[tokio::test]
async fn an_admin_creates_a_user_and_mints_a_token_shown_once_then_revokes_it() {
    let app = TestApp::spawn().await;
    app.seed().await;
    let mut b = app.logged_in("admin").await;
    let page = b.get("/ui/admin").await;
    assert_eq!(page.status, StatusCode::OK, "{}", page.body);
    assert!(page.body.contains("href=\"/ui/admin\""), "the nav links the page for an admin");
    let csrf = page.csrf();
    let r = b
        .post(
            "/ui/admin/users",
            &[
                ("csrf", &csrf),
                ("username", "nora"),
                ("password", "a-long-enough-password"),
                ("role", "operator"),
                ("reason", "new on-call"),
            ],
        )
        .await;
    assert_eq!(r.status, StatusCode::SEE_OTHER, "{}", r.body);
    let short = b
        .post(
            "/ui/admin/users",
            &[("csrf", &csrf), ("username", "x"), ("password", "short"), ("role", "viewer"), ("reason", "r")],
        )
        .await;
    assert_eq!(short.status, StatusCode::BAD_REQUEST);
    assert!(short.body.contains("password"), "{}", short.body);

    let minted = b
        .post(
            "/ui/admin/tokens",
            &[
                ("csrf", &csrf),
                ("kind", "agent"),
                ("name", "checkout-prod"),
                ("role", "viewer"),
                ("environment", "prod"),
                ("services", "checkout"),
                ("expires_in", "30d"),
                ("reason", "deploy"),
            ],
        )
        .await;
    assert_eq!(minted.status, StatusCode::OK, "{}", minted.body);
    let start = minted.body.find("<pre>").unwrap() + 5;
    let secret = &minted.body[start..start + minted.body[start..].find("</pre>").unwrap()];
    assert!(secret.len() > 40, "{secret}");
    let again = b.get("/ui/admin").await;
    assert!(again.body.contains("checkout-prod"));
    assert!(!again.body.contains(secret), "a secret is shown once");

    let (_, _, tokens) = app.api(Method::GET, "/tokens", None).await;
    let id = tokens[0]["id"].as_str().unwrap().to_string();
    let r = b.post("/ui/admin/tokens/revoke", &[("csrf", &csrf), ("id", &id), ("reason", "rotated")]).await;
    assert_eq!(r.status, StatusCode::SEE_OTHER, "{}", r.body);
    let (_, _, tokens) = app.api(Method::GET, "/tokens", None).await;
    assert!(tokens[0]["revoked_at"].is_string(), "{tokens}");

    // Not for operators.
    let mut n = app.logged_in("nora").await;
    let r = n.get("/ui/admin").await;
    assert_eq!(r.status, StatusCode::FORBIDDEN);
    assert!(!n.get("/").await.body.contains("href=\"/ui/admin\""));
}

on_both_backends! {
    /// An admin changes a user's role and disables it from the users page: a confirmation
    /// page says what happens, the change needs a reason, is audited, and ends the user's
    /// sessions; a disabled user cannot log in until enabled again; nobody disables themselves.
    async fn an_admin_changes_a_role_and_disables_a_user_from_the_page(app) {
        app.seed().await;
        app.user("olivia", "operator").await;
        let mut o = app.logged_in("olivia").await;
        assert_eq!(o.get("/ui/environments/prod").await.status, StatusCode::OK);
        let mut b = app.logged_in("admin").await;
        let page = b.get("/ui/admin").await;
        assert!(page.body.contains("id=\"user-olivia\""), "{}", page.body);
        let csrf = page.csrf();
        let edit = |role: &'static str, state: &'static str| {
            [("username", "olivia"), ("role", role), ("state", state)]
        };
        // Without the session's token the form is refused.
        let r = b.post("/ui/admin/users/confirm", &edit("viewer", "active")).await;
        assert_eq!(r.status, StatusCode::FORBIDDEN, "{}", r.body);
        // Nothing changes: said so, nothing to confirm.
        let f = edit("operator", "active");
        let r = b.post("/ui/admin/users/confirm", &[&[("csrf", csrf.as_str())][..], &f[..]].concat()).await;
        assert_eq!(r.status, StatusCode::BAD_REQUEST, "{}", r.body);
        assert!(r.body.contains("nothing to change"), "{}", r.body);
        // The confirmation says what happens and changes nothing yet.
        let f = edit("viewer", "active");
        let with_csrf = [&[("csrf", csrf.as_str())][..], &f[..]].concat();
        let r = b.post("/ui/admin/users/confirm", &with_csrf).await;
        assert_eq!(r.status, StatusCode::OK, "{}", r.body);
        assert!(r.body.contains("role operator → viewer"), "{}", r.body);
        assert!(r.body.contains("every session olivia has open ends now"), "{}", r.body);
        assert_eq!(o.get("/ui/environments/prod").await.status, StatusCode::OK, "not changed before confirming");
        // A reason is required.
        let r = b.post("/ui/admin/users/update", &with_csrf).await;
        assert_eq!(r.status, StatusCode::BAD_REQUEST, "{}", r.body);
        assert!(r.body.contains("a reason is required"), "{}", r.body);
        let r = b.post("/ui/admin/users/update", &[&with_csrf[..], &[("reason", "moved teams")]].concat()).await;
        assert_eq!(r.status, StatusCode::SEE_OTHER, "{}", r.body);
        let r = o.get("/ui/environments/prod").await;
        assert_eq!(r.status, StatusCode::SEE_OTHER, "olivia's session ended: {}", r.body);
        assert!(r.location().starts_with("/login"), "{}", r.location());
        let (_, _, users) = app.api(Method::GET, "/users", None).await;
        let olivia = users.as_array().unwrap().iter().find(|u| u["username"] == "olivia").unwrap().clone();
        assert_eq!((olivia["role"].as_str(), olivia["disabled"].as_bool()), (Some("viewer"), Some(false)));

        // Disable: she cannot log in any more; enable: she can again.
        let f = edit("viewer", "disabled");
        let dis = [&[("csrf", csrf.as_str()), ("reason", "left the company")][..], &f[..]].concat();
        let r = b.post("/ui/admin/users/confirm", &dis).await;
        assert!(r.body.contains("olivia is disabled: it cannot log in"), "{}", r.body);
        let r = b.post("/ui/admin/users/update", &dis).await;
        assert_eq!(r.status, StatusCode::SEE_OTHER, "{}", r.body);
        assert!(b.get("/ui/admin").await.body.contains("<span class=\"bad\">disabled</span>"));
        let r = app.browser().login("olivia", crate::helpers::PASSWORD).await;
        assert_ne!(r.status, StatusCode::SEE_OTHER, "a disabled user cannot log in: {}", r.body);
        let f = edit("viewer", "active");
        let en = [&[("csrf", csrf.as_str()), ("reason", "came back")][..], &f[..]].concat();
        assert_eq!(b.post("/ui/admin/users/update", &en).await.status, StatusCode::SEE_OTHER);
        app.logged_in("olivia").await;

        // An admin cannot disable or demote themselves here.
        let me = [("csrf", csrf.as_str()), ("reason", "oops"), ("username", "admin"), ("role", "admin"), ("state", "disabled")];
        let r = b.post("/ui/admin/users/update", &me).await;
        assert_eq!(r.status, StatusCode::BAD_REQUEST, "{}", r.body);
        assert!(r.body.contains("disabled") && r.body.contains("cannot disable or demote yourself"), "{}", r.body);
        assert_eq!(b.get("/ui/admin").await.status, StatusCode::OK, "still logged in");

        // Audited, via the UI, with before and after.
        let (_, _, audit) = app.api(Method::GET, "/audit?actor=admin", None).await;
        let rows: Vec<&serde_json::Value> =
            audit.as_array().unwrap().iter().filter(|r| r["action"] == "user.update").collect();
        assert_eq!(rows.len(), 3, "{audit}");
        assert!(rows.iter().all(|r| r["via"] == "ui"), "{audit}");
        assert!(rows.iter().any(|r| r["reason"] == "left the company"
            && r["before"]["disabled"] == false && r["after"]["disabled"] == true), "{audit}");
        assert!(rows.iter().any(|r| r["before"]["role"] == "operator" && r["after"]["role"] == "viewer"));

        // Not for operators.
        app.user("nora", "operator").await;
        let mut n = app.logged_in("nora").await;
        let ncsrf = n.get("/ui/environments/prod").await.csrf();
        let r = n.post("/ui/admin/users/confirm", &[&[("csrf", ncsrf.as_str())][..], &f[..]].concat()).await;
        assert_eq!(r.status, StatusCode::FORBIDDEN, "{}", r.body);
    }
}

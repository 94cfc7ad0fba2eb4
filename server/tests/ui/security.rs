//! CSRF, escaping and roles.

use reqwest::{Method, StatusCode};
use serde_json::json;

use crate::helpers::{ESCAPED_SCRIPT, KILL_SWITCH, RAW_SCRIPT, SERVICE, TestApp};

/// Nothing was changed through the UI: same switch value, no UI audit row.
async fn assert_untouched(app: &TestApp) {
    assert_eq!(app.kill_switch().await, json!(true));
    assert!(app.audit().await.iter().all(|r| r["via"] != "ui"), "no UI change was even attempted");
}

#[tokio::test]
async fn cross_site_form_posts_are_refused_and_change_nothing() {
    let app = TestApp::spawn().await;
    app.seed().await;
    app.user("olivia", "operator").await;
    let mut b = app.logged_in("olivia").await;
    let csrf = b.get(SERVICE).await.csrf();
    let rev = app.snapshot().await["revision"].as_u64().unwrap().to_string();
    let fields =
        [("csrf", csrf.as_str()), ("value", "false"), ("revision", rev.as_str()), ("reason", "forged")];
    let evil = "https://evil.example";
    for headers in [
        vec![("sec-fetch-site", "cross-site"), ("origin", evil)],
        // A browser that sends no Sec-Fetch-Site: the Origin must match the Host.
        vec![("origin", evil)],
        // A sibling site is still another origin.
        vec![("sec-fetch-site", "same-site"), ("origin", "http://other.localhost")],
    ] {
        let res = b.post_with(KILL_SWITCH, &fields, &headers).await;
        assert_eq!(res.status, StatusCode::FORBIDDEN, "with {headers:?}");
        assert!(res.body.contains("sent from another site"), "{}", res.body);
    }
    // Logging someone out from another site does not work either.
    let res = b.post_with("/logout", &[("csrf", &csrf)], &[("sec-fetch-site", "cross-site")]).await;
    assert_eq!(res.status, StatusCode::FORBIDDEN);
    assert!(res.set_cookie("levee_session").is_none());
    assert_untouched(&app).await;
    // The same form from the site itself goes through.
    let res = b.post(KILL_SWITCH, &fields).await;
    assert_eq!(res.status, StatusCode::SEE_OTHER, "{}", res.body);
    assert_eq!(app.kill_switch().await, json!(false));
}

#[tokio::test]
async fn form_posts_without_the_session_token_are_refused() {
    let app = TestApp::spawn().await;
    app.seed().await;
    app.user("olivia", "operator").await;
    let mut admin = app.logged_in("admin").await;
    let admin_token = admin.get(SERVICE).await.csrf();
    let mut b = app.logged_in("olivia").await;
    let own = b.get(SERVICE).await.csrf();
    let login_token = app.browser().get("/login").await.csrf();
    let rev = app.snapshot().await["revision"].as_u64().unwrap().to_string();
    for token in [None, Some(""), Some("forged"), Some(admin_token.as_str()), Some(login_token.as_str())] {
        let mut fields = vec![("value", "false"), ("revision", rev.as_str()), ("reason", "no token")];
        if let Some(t) = token {
            fields.push(("csrf", t));
        }
        let res = b.post(KILL_SWITCH, &fields).await;
        assert_eq!(res.status, StatusCode::FORBIDDEN, "with token {token:?}");
        assert!(res.body.contains("anti-CSRF token"), "{}", res.body);
    }
    assert_untouched(&app).await;
    assert_ne!(own, admin_token, "tokens are per session");
}

#[tokio::test]
async fn viewer_sees_no_switch_and_a_forged_post_is_forbidden() {
    let app = TestApp::spawn().await;
    app.seed().await;
    app.user("vera", "viewer").await;
    let mut b = app.logged_in("vera").await;
    let page = b.get(SERVICE).await;
    assert_eq!(page.status, StatusCode::OK);
    assert!(page.body.contains("recommendations.enabled"), "a viewer reads everything");
    for form in ["/confirm\"", "Turn off", "Override…", "Remove…", "name=\"value\""] {
        assert!(!page.body.contains(form), "a viewer's page has no {form:?}");
    }
    // The viewer's own, valid token does not make a forged form acceptable.
    let csrf = page.csrf();
    let rev = app.snapshot().await["revision"].as_u64().unwrap().to_string();
    let flip =
        [("csrf", csrf.as_str()), ("value", "false"), ("revision", rev.as_str()), ("reason", "forged")];
    let breaker = [
        ("csrf", csrf.as_str()),
        ("revision", rev.as_str()),
        ("dependency", "payments"),
        ("state", "forced_open"),
        ("reason", "forged"),
    ];
    for (path, fields) in
        [(KILL_SWITCH.to_string(), &flip[..]), (format!("{SERVICE}/breakers"), &breaker[..])]
    {
        let res = b.post(&path, fields).await;
        assert_eq!(res.status, StatusCode::FORBIDDEN, "{path}");
        assert!(res.body.contains("needs the operator role; you are viewer"), "{}", res.body);
    }
    // Nor does the confirmation page open for a viewer.
    for path in [
        format!("{KILL_SWITCH}/confirm?value=false&revision={rev}"),
        format!("{SERVICE}/breakers/confirm?dependency=payments&state=forced_open&revision={rev}"),
    ] {
        let res = b.get(&path).await;
        assert_eq!(res.status, StatusCode::FORBIDDEN, "{path}");
        assert!(res.body.contains("needs the operator role; you are viewer"), "{}", res.body);
    }
    // Nothing changed; what the UI audited for this service are the viewer's refusals
    // (filed under the service they were about), nothing else.
    assert_eq!(app.kill_switch().await, json!(true));
    let ui: Vec<_> = app.audit().await.into_iter().filter(|r| r["via"] == "ui").collect();
    assert!(
        ui.iter().all(|r| (r["action"].as_str(), r["outcome"].as_str(), r["actor"].as_str())
            == (Some("access.refused"), Some("forbidden"), Some("vera"))),
        "{ui:?}"
    );
    assert!(app.snapshot().await["config"]["breaker_overrides"].as_array().unwrap().is_empty());
}

#[tokio::test]
async fn user_text_is_escaped_everywhere() {
    let app = TestApp::spawn().await;
    app.seed().await;
    // A flag whose description, owner and reason are markup.
    let (s, _, b) = app
        .api(
            Method::PUT,
            "/environments/prod/services/checkout/flags/banner.enabled",
            Some(json!({"type": "bool", "value": true, "description": RAW_SCRIPT, "owner": RAW_SCRIPT, "reason": RAW_SCRIPT})),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{b}");
    // A matrix owner and decision that are markup.
    let (_, h, doc) = app.api(Method::GET, "/environments/prod/services/checkout/policy", None).await;
    let mut policy = doc["policy"].clone();
    policy["degradation_matrix"][0]["owner"] = json!(RAW_SCRIPT);
    policy["degradation_matrix"][0]["decision"] = json!(RAW_SCRIPT);
    let etag = h["etag"].to_str().unwrap().to_string();
    let (s, _, b) = app
        .api_with(
            Method::PUT,
            "/environments/prod/services/checkout/policy",
            Some(json!({"policy": policy, "reason": RAW_SCRIPT})),
            &[("if-match", &etag)],
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{b}");
    // A breaker override whose reason is markup.
    let (s, _, b) = app
        .api(
            Method::PUT,
            "/environments/prod/services/checkout/breaker-overrides/payments",
            Some(json!({"state": "forced_closed", "reason": RAW_SCRIPT})),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{b}");

    let mut b = app.logged_in("admin").await;
    let service = b.get(SERVICE).await;
    let csrf = service.csrf();
    let rev = app.snapshot().await["revision"].as_u64().unwrap().to_string();
    let confirm = b.get(&format!("{SERVICE}/flags/banner.enabled/confirm?value=false&revision={rev}")).await;
    assert_eq!(confirm.status, StatusCode::OK, "{}", confirm.body);
    // A reason refused for its length is shown again for editing, escaped too.
    let refused = b
        .post(
            &format!("{SERVICE}/flags/banner.enabled"),
            &[("csrf", &csrf), ("value", "false"), ("revision", &rev), ("reason", &RAW_SCRIPT.repeat(50))],
        )
        .await;
    assert_eq!(refused.status, StatusCode::BAD_REQUEST);
    assert!(refused.body.contains("at most 1000 characters"), "{}", refused.body);
    let audit = b.get("/ui/audit").await;
    assert_eq!(audit.status, StatusCode::OK);
    for (name, page) in
        [("service", &service), ("confirmation", &confirm), ("refused", &refused), ("audit", &audit)]
    {
        assert!(page.body.contains(ESCAPED_SCRIPT), "{name} page shows the text escaped: {}", page.body);
        // The one script tag a page may hold is the live part's own file (same origin).
        let ours = page.body.matches("<script src=\"/static/live.js\" defer></script>").count();
        assert_eq!(page.body.matches("<script").count(), ours, "{name} page contains a raw script tag");
    }
    // Matrix owner, flag description and override reason all reached the service page.
    assert!(service.body.matches(ESCAPED_SCRIPT).count() >= 4, "{}", service.body);
    for page in [&service, &audit] {
        let csp = page.headers["content-security-policy"].to_str().unwrap();
        assert!(csp.contains("default-src 'none'") && csp.contains("frame-ancestors 'none'"), "{csp}");
        // Scripts only from this origin: no inline script, no eval.
        assert!(csp.contains("script-src 'self';") && !csp.contains("unsafe"), "{csp}");
        assert_eq!(page.headers["x-frame-options"], "DENY");
    }
}

/// Auth matrix, XSS row: a script payload in every field a person types — environment and
/// service descriptions, flag description, owner and string and JSON values, an operation
/// name, a fault rule's operation, every reason — is shown escaped on every page that shows
/// it (overview, environment, service, audit) and never as markup.
#[tokio::test]
async fn auth_xss_payloads_in_every_user_entered_field_are_escaped_in_ui_and_audit() {
    let app = TestApp::spawn().await;
    let (s, _, b) = app
        .api(
            Method::POST,
            "/environments",
            Some(json!({"name": "prod", "description": RAW_SCRIPT, "allow_faults": true, "reason": RAW_SCRIPT})),
        )
        .await;
    assert_eq!(s, StatusCode::CREATED, "{b}");
    let (s, _, b) = app
        .api(
            Method::POST,
            "/environments/prod/services",
            Some(json!({
                "name": "checkout", "description": RAW_SCRIPT, "reason": RAW_SCRIPT,
                "policy": {"dependencies": {"payments": {"attempt_timeout": "300ms",
                    "operations": {RAW_SCRIPT: {"attempt_timeout": "200ms"}}}}},
                "flags": {
                    "banner.text": {"type": "string", "value": RAW_SCRIPT, "description": RAW_SCRIPT, "owner": RAW_SCRIPT},
                    "banner.json": {"type": "json", "value": {"html": RAW_SCRIPT}, "description": "json"}
                }
            })),
        )
        .await;
    assert_eq!(s, StatusCode::CREATED, "{b}");
    let (s, _, b) = app
        .api(
            Method::PUT,
            "/environments/prod/services/checkout/faults/f1",
            Some(json!({"dependency": "payments", "operation": RAW_SCRIPT, "action": {"type": "delay", "delay": "1s"},
                "percent": 5.0, "expires_at": "2099-01-01T00:00:00Z", "reason": RAW_SCRIPT})),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{b}");

    let mut b = app.logged_in("admin").await;
    let pages = ["/", "/ui/environments/prod", SERVICE, "/ui/audit"];
    for path in pages {
        let page = b.get(path).await;
        assert_eq!(page.status, StatusCode::OK, "{path}");
        // The only script a page may carry is the UI's own (the service page's live.js).
        let scripts = page.body.matches("<script").count();
        let own = page.body.matches(r#"<script src="/static/live.js" defer></script>"#).count();
        assert_eq!(scripts, own, "{path} contains a raw script tag");
        assert!(!page.body.contains("alert(1)</"), "{path} contains unescaped markup");
    }
    let service = b.get(SERVICE).await;
    // Service description, string value, flag description and owner at least.
    assert!(service.body.matches(ESCAPED_SCRIPT).count() >= 4, "{}", service.body);
    let audit = b.get("/ui/audit").await;
    assert!(audit.body.contains(ESCAPED_SCRIPT), "reasons escaped in the audit page");
    // The API returns the text as it was typed (JSON is data; escaping is the page's job).
    let rows = app.audit().await;
    assert!(rows.iter().any(|r| r["reason"] == RAW_SCRIPT));
}

/// The degradation matrix's runbooks on the service page: an http(s) address is a link,
/// escaped in its `href` and its text; a page name and an address of another scheme are
/// text only, escaped.
#[tokio::test]
async fn a_runbook_is_a_link_only_when_it_is_a_web_address() {
    let app = TestApp::spawn().await;
    app.seed().await;
    let (_, h, doc) = app.api(Method::GET, "/environments/prod/services/checkout/policy", None).await;
    let mut policy = doc["policy"].clone();
    policy["degradation_matrix"][0]["runbook"] =
        json!("https://runbooks.example.com/recs?team=growth&x=\"><script>");
    policy["degradation_matrix"]
        .as_array_mut()
        .unwrap()
        .push(json!({"feature": "payment", "dependencies": ["payments"], "on_failure": "feature_error",
                     "runbook": "javascript:alert(1)"}));
    policy["degradation_matrix"]
        .as_array_mut()
        .unwrap()
        .push(json!({"feature": "receipts", "dependencies": ["payments"], "on_failure": "feature_error",
                     "runbook": RAW_SCRIPT}));
    let etag = h["etag"].to_str().unwrap().to_string();
    let (s, _, b) = app
        .api_with(
            Method::PUT,
            "/environments/prod/services/checkout/policy",
            Some(json!({"policy": policy, "reason": "runbooks"})),
            &[("if-match", &etag)],
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{b}");
    let mut b = app.logged_in("admin").await;
    let page = b.get(SERVICE).await;
    assert_eq!(page.status, StatusCode::OK, "{}", page.body);
    let start = page.body.find("<section id=\"matrix\">").expect("the matrix");
    let matrix = &page.body[start..start + page.body[start..].find("</section>").unwrap()];
    let href = "<a href=\"https://runbooks.example.com/recs?team=growth&#38;x=&#34;&#62;&#60;script&#62;\" rel=\"noreferrer\">";
    assert_eq!(matrix.matches(href).count(), 1, "{matrix}");
    assert_eq!(
        matrix.matches("<a href").count(),
        1 + matrix.matches("class=\"edit\"").count(),
        "one runbook link: {matrix}"
    );
    assert!(matrix.contains("<td class=\"runbook\">javascript:alert(1)</td>"), "{matrix}");
    assert!(matrix.contains(&format!("<td class=\"runbook\">{ESCAPED_SCRIPT}</td>")), "{matrix}");
    assert!(!matrix.contains("<script"), "{matrix}");
}

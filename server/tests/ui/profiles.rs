//! Emergency profiles in the UI: define one from its JSON, apply it through a confirmation
//! with a reason, see it on the service page (who, why, since, until; the operator levers it
//! set with their expiry), revert it; a viewer
//! gets no form and is refused.

use reqwest::StatusCode;

use crate::helpers::{ESCAPED_SCRIPT, RAW_SCRIPT, SERVICE, TestApp};

const PROFILES: &str = "/ui/environments/prod/profiles";

const DEFINITION: &str = r#"{"description": "recommendations down",
  "services": {"checkout": {"flags": {"recommendations.enabled": false},
                            "breakers": [{"dependency": "payments", "state": "forced_open"}],
                            "shed_sheddable_percent": 25, "pause_retries": true, "inbound_limit": 40}}}"#;

#[tokio::test]
async fn an_operator_defines_applies_sees_and_reverts_a_profile() {
    let app = TestApp::spawn().await;
    app.seed().await;
    app.user("olivia", "operator").await;
    let mut b = app.logged_in("olivia").await;

    let page = b.get(PROFILES).await;
    assert_eq!(page.status, StatusCode::OK, "{}", page.body);
    assert!(page.body.contains("No profile is active in prod."));
    let csrf = page.csrf();

    // A bad definition comes back with the field named and the text kept.
    let bad = b
        .post(
            PROFILES,
            &[
                ("csrf", &csrf),
                ("name", "recs-down"),
                ("definition", r#"{"services": {"checkout": {"flags": {"nope": false}}}}"#),
                ("reason", "r"),
            ],
        )
        .await;
    assert_eq!(bad.status, StatusCode::BAD_REQUEST);
    assert!(bad.body.contains("services.checkout.flags.nope"), "{}", bad.body);
    assert!(bad.body.contains("&#34;nope&#34;"), "the text typed is kept (escaped)");

    let saved = b
        .post(
            PROFILES,
            &[("csrf", &csrf), ("name", "recs-down"), ("definition", DEFINITION), ("reason", RAW_SCRIPT)],
        )
        .await;
    assert_eq!(saved.status, StatusCode::SEE_OTHER, "{}", saved.body);
    let page = b.get(saved.location()).await;
    assert!(page.body.contains("Saved profile recs-down as version 1"), "{}", page.body);
    assert!(page.body.contains("checkout: flag recommendations.enabled = false"));
    for lever in [
        "checkout: shed 25 % of SHEDDABLE and SHEDDABLE_PLUS traffic",
        "checkout: all outgoing retries paused",
        "checkout: inbound limit fixed at 40",
    ] {
        assert!(page.body.contains(lever), "{lever}: {}", page.body);
    }
    assert!(page.body.contains(&format!("action=\"{PROFILES}/recs-down/confirm\"")));

    // Confirmation first: it changes nothing.
    let confirm = b.get(&format!("{PROFILES}/recs-down/confirm?for=2h")).await;
    assert_eq!(confirm.status, StatusCode::OK, "{}", confirm.body);
    assert!(confirm.body.contains("checkout: breaker payments FORCED_OPEN"), "{}", confirm.body);
    assert_eq!(app.kill_switch().await, true);
    let no_reason = b
        .post(&format!("{PROFILES}/recs-down/apply"), &[("csrf", &csrf), ("for", "2h"), ("reason", " ")])
        .await;
    assert_eq!(no_reason.status, StatusCode::BAD_REQUEST);
    assert!(no_reason.body.contains("a reason is required"));
    assert_eq!(app.kill_switch().await, true);

    let why = format!("INC-9 {RAW_SCRIPT}");
    let done = b
        .post(&format!("{PROFILES}/recs-down/apply"), &[("csrf", &csrf), ("for", "2h"), ("reason", &why)])
        .await;
    assert_eq!(done.status, StatusCode::SEE_OTHER, "{}", done.body);
    assert_eq!(app.kill_switch().await, false);
    let audit = app.audit().await;
    assert_eq!((audit[0]["action"].as_str(), audit[0]["via"].as_str()), (Some("profile.apply"), Some("ui")));

    // The service page says which profile, by whom, why, since and until when.
    let svc = b.get(SERVICE).await;
    assert!(
        svc.body.contains(
            "Emergency profile recs-down</strong> (version 1) is active in prod and changes this service"
        ),
        "{}",
        svc.body
    );
    assert!(svc.body.contains("by olivia"));
    assert!(svc.body.contains(&format!("INC-9 {ESCAPED_SCRIPT}")), "the reason is escaped");
    assert!(!svc.body.contains(RAW_SCRIPT));
    let active = app.api(reqwest::Method::GET, "/environments/prod/active-profile", None).await.2;
    let until = active["expires_at"].as_str().unwrap();
    assert!(svc.body.contains(&format!("until <time datetime=\"{until}\"")), "{}", svc.body);
    // The levers it set, in force until the same instant.
    assert!(svc.body.contains("Limit fixed at 40 by an operator lever"), "{}", svc.body);
    assert!(svc.body.contains("shedding 25% of SHEDDABLE and SHEDDABLE_PLUS traffic"), "{}", svc.body);
    assert!(svc.body.contains("all outgoing retries paused"));
    assert!(svc.body.contains(&format!("Levers set until <time datetime=\"{until}\"")), "{}", svc.body);
    assert!(
        svc.body.contains(&format!("</time> (profile recs-down: INC-9 {ESCAPED_SCRIPT})")),
        "{}",
        svc.body
    );

    let page = b.get(PROFILES).await;
    assert!(page.body.contains("Active: recs-down (version 1)"));
    let reverted = b.post(&format!("{PROFILES}/revert"), &[("csrf", &csrf), ("reason", "recovered")]).await;
    assert_eq!(reverted.status, StatusCode::SEE_OTHER, "{}", reverted.body);
    assert_eq!(app.kill_switch().await, true);
    let svc = b.get(SERVICE).await;
    assert!(!svc.body.contains("Emergency profile"));
    assert!(!svc.body.contains("id=\"levers\""), "the levers ended with the profile");
}

#[tokio::test]
async fn a_viewer_sees_profiles_but_cannot_change_them() {
    let app = TestApp::spawn().await;
    app.seed().await;
    app.user("vera", "viewer").await;
    let mut b = app.logged_in("vera").await;
    let page = b.get(PROFILES).await;
    assert_eq!(page.status, StatusCode::OK);
    assert!(!page.body.contains("Save profile"));
    let csrf = page.csrf();
    let r = b
        .post(PROFILES, &[("csrf", &csrf), ("name", "x"), ("definition", DEFINITION), ("reason", "r")])
        .await;
    assert_eq!(r.status, StatusCode::FORBIDDEN);
    let built = [
        ("csrf", csrf.as_str()),
        ("name", "x"),
        ("flag:checkout:recommendations.enabled", "false"),
        ("reason", "r"),
    ];
    let r = b.post(&format!("{PROFILES}/build"), &built).await;
    assert_eq!(r.status, StatusCode::FORBIDDEN);
    let r = b.post(&format!("{PROFILES}/revert"), &[("csrf", &csrf), ("reason", "r")]).await;
    assert_eq!(r.status, StatusCode::FORBIDDEN);
    // Without the session's token, nothing happens either.
    let mut op = app.logged_in("admin").await;
    let r = op
        .post(&format!("{PROFILES}/recs-down/apply"), &[("csrf", "forged"), ("for", "1h"), ("reason", "r")])
        .await;
    assert_eq!(r.status, StatusCode::FORBIDDEN);
}

/// Under a `profile` approval rule, applying a profile from its confirmation is refused
/// back onto that page (403, reason kept, propose and break-glass offered), and the refusal
/// is audited as `profile.apply` with outcome `rejected`; proposing it makes a change
/// request; break-glass applies it.
#[tokio::test]
async fn a_profile_applied_under_an_approval_rule_is_proposed_or_applied_by_break_glass() {
    let app = TestApp::spawn().await;
    app.seed().await;
    app.user("olivia", "operator").await;
    let (s, _, b) = app
        .api(
            reqwest::Method::PUT,
            "/environments/prod/profiles/recs-down",
            Some(serde_json::json!({"reason": "r", "services": {"checkout": {"flags": {"recommendations.enabled": false}}}})),
        )
        .await;
    assert!(s.is_success(), "{b}");
    let mut b = app.logged_in("olivia").await;
    let csrf = b.get(PROFILES).await.csrf();
    let (s, _, r) = app
        .api(
            reqwest::Method::PUT,
            "/environments/prod/approval-rules",
            Some(serde_json::json!({"kinds": ["profile"], "reason": "four eyes"})),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{r}");
    let apply = format!("{PROFILES}/recs-down/apply");
    let refused = b.post(&apply, &[("csrf", &csrf), ("for", "1h"), ("reason", "INC-3")]).await;
    assert_eq!(refused.status, StatusCode::FORBIDDEN, "{}", refused.body);
    assert!(
        refused.body.contains("Not applied: profile changes in prod need an approved change request"),
        "{}",
        refused.body
    );
    assert!(refused.body.contains(">INC-3</textarea>"), "the reason is kept: {}", refused.body);
    assert!(refused.body.contains("value=\"propose\"") && refused.body.contains("value=\"break_glass\""));
    assert_eq!(app.kill_switch().await, true);
    let (_, _, audit) =
        app.api(reqwest::Method::GET, "/audit?environment=prod&action=profile.apply", None).await;
    assert_eq!(
        (audit[0]["outcome"].as_str(), audit[0]["via"].as_str()),
        (Some("rejected"), Some("ui")),
        "{audit}"
    );

    let proposed =
        b.post(&apply, &[("csrf", &csrf), ("for", "1h"), ("reason", "INC-3"), ("mode", "propose")]).await;
    assert_eq!(proposed.status, StatusCode::SEE_OTHER, "{}", proposed.body);
    assert!(proposed.location().contains("/requests?done=Proposed"), "{}", proposed.location());
    let (_, _, req) = app.api(reqwest::Method::GET, "/environments/prod/change-requests/1", None).await;
    assert_eq!((req["kind"].as_str(), req["target"].as_str()), (Some("profile"), Some("recs-down")), "{req}");

    let forced = b
        .post(&apply, &[("csrf", &csrf), ("for", "1h"), ("reason", "INC-3 now"), ("mode", "break_glass")])
        .await;
    assert_eq!(forced.status, StatusCode::SEE_OTHER, "{}", forced.body);
    assert_eq!(app.kill_switch().await, false);
}

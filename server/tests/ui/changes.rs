//! Changes through the UI: switch → confirmation with a reason → commit through the API's
//! write path, then the service page following the new revision.

use std::time::Duration;

use levee_agent::{Agent, SyncClientSettings};
use reqwest::{Method, StatusCode};
use serde_json::json;

use crate::helpers::{KILL_SWITCH, SERVICE, TestApp};

async fn revision(app: &TestApp) -> u64 {
    app.snapshot().await["revision"].as_u64().unwrap()
}

on_both_backends! {
async fn operator_flips_the_kill_switch_through_confirmation_and_reason(app) {
    app.seed().await;
    app.user("olivia", "operator").await;
    let mut b = app.logged_in("olivia").await;
    let rev = revision(&app).await;

    let page = b.get(SERVICE).await;
    assert_eq!(page.status, StatusCode::OK);
    assert!(page.body.contains(&format!("action=\"{KILL_SWITCH}/confirm\"")), "switch form on the page");
    assert!(page.body.contains("Turn off…"));

    // Step 1: the switch leads to a confirmation that changes nothing yet (an address:
    // the form asks for it with GET, and a reload shows it again).
    assert!(page.body.contains(&format!("<form method=\"get\" action=\"{KILL_SWITCH}/confirm\"")));
    let confirm = b.get(&format!("{KILL_SWITCH}/confirm?revision={rev}&value=false")).await;
    assert_eq!(confirm.status, StatusCode::OK, "{}", confirm.body);
    for text in [
        "Dependency recommendations is switched off",
        "Feature product recommendations is forced onto its fallback (GENERIC)",
        "name=\"reason\"",
        &format!("action=\"{KILL_SWITCH}\""),
    ] {
        assert!(confirm.body.contains(text), "confirmation page lacks {text:?}: {}", confirm.body);
    }
    assert_eq!(app.kill_switch().await, json!(true), "the confirmation page changes nothing");
    assert_eq!(revision(&app).await, rev);
    // The change route opened as an address (a reload after confirming, a bookmark) says
    // what it is and where to go, and changes nothing.
    let again = b.get(KILL_SWITCH).await;
    assert_eq!(again.status, StatusCode::METHOD_NOT_ALLOWED);
    assert_eq!(again.headers.get("allow").and_then(|v| v.to_str().ok()), Some("POST"));
    assert!(again.body.contains("changes nothing"), "{}", again.body);
    assert!(again.body.contains("/ui/environments/prod/services/checkout"), "{}", again.body);

    // Step 2: confirmed with a reason.
    let done = b
        .post(
            KILL_SWITCH,
            &[
                ("csrf", &confirm.csrf()),
                ("value", &confirm.field("value").unwrap()),
                ("revision", &confirm.field("revision").unwrap()),
                ("reason", "incident 42: recommendations time out"),
            ],
        )
        .await;
    assert_eq!(done.status, StatusCode::SEE_OTHER, "{}", done.body);
    assert_eq!(done.location(), format!("{SERVICE}?changed={}#propagation", rev + 1));

    assert_eq!(app.kill_switch().await, json!(false));
    assert_eq!(revision(&app).await, rev + 1);
    let audit = app.audit().await;
    let row = &audit[0];
    assert_eq!(row["action"], "flag.set");
    assert_eq!(row["via"], "ui");
    assert_eq!(row["actor"], "olivia");
    assert_eq!(row["outcome"], "ok");
    assert_eq!(row["target"], "flag recommendations.enabled");
    assert_eq!(row["reason"], "incident 42: recommendations time out");
    assert_eq!(row["revision"], json!(rev + 1));

    // The service page shows the new revision and how far it has spread.
    let after = b.get(done.location().split('#').next().unwrap()).await;
    assert_eq!(after.status, StatusCode::OK);
    assert!(after.body.contains(&format!("Saved as revision {}.", rev + 1)), "{}", after.body);
    // Reaching no agent is a warning, never a success.
    assert!(
        after.body.contains("<strong>Delivered to no agent:</strong> none is connected"),
        "{}",
        after.body
    );
    assert!(!after.body.contains("<p class=\"ok\"><strong>Saved"), "not shown as a success");
    // And the page says at the top what is abnormal now, with where to act.
    assert!(after.body.contains("kill switch recommendations.enabled is OFF"), "{}", after.body);
    assert!(after.body.contains("#flag-recommendations.enabled\">see the flag</a>"), "{}", after.body);
    // With the lever that undoes it, straight to its confirmation page.
    assert!(
        after.body.contains(
            "href=\"/ui/environments/prod/services/checkout/flags/recommendations.enabled/confirm?value=true&#38;revision=2\">turn recommendations.enabled back on…</a>"
        ),
        "{}",
        after.body
    );
    assert!(after.body.contains("Turn on…"), "the switch now offers the way back");
}
}

on_both_backends! {
async fn a_change_without_reason_is_refused_with_a_clear_message(app) {
    app.seed().await;
    app.user("olivia", "operator").await;
    let mut b = app.logged_in("olivia").await;
    let rev = revision(&app).await.to_string();
    let csrf = b.get(SERVICE).await.csrf();
    for reason in [Some(""), Some("   \n "), None] {
        let mut fields = vec![("csrf", csrf.as_str()), ("value", "false"), ("revision", rev.as_str())];
        if let Some(r) = reason {
            fields.push(("reason", r));
        }
        let res = b.post(KILL_SWITCH, &fields).await;
        assert_eq!(res.status, StatusCode::BAD_REQUEST, "reason {reason:?}");
        assert!(res.body.contains("a reason is required"), "{}", res.body);
        assert!(res.body.contains("name=\"reason\""), "the confirmation is shown again to fill in");
    }
    assert_eq!(app.kill_switch().await, json!(true));
    assert_eq!(revision(&app).await.to_string(), rev);
    assert!(app.audit().await.iter().all(|r| r["via"] != "ui"), "nothing was attempted");
}
}

on_both_backends! {
async fn operator_overrides_a_breaker_then_removes_the_override(app) {
    app.seed().await;
    app.user("olivia", "operator").await;
    let mut b = app.logged_in("olivia").await;
    let page = b.get(SERVICE).await;
    assert!(page.body.contains(&format!("action=\"{SERVICE}/breakers/confirm\"")));
    let csrf = page.csrf();
    let rev = revision(&app).await.to_string();

    let fields = [
        ("csrf", csrf.as_str()),
        ("revision", rev.as_str()),
        ("dependency", "payments"),
        ("operation", ""),
        ("state", "forced_open"),
        ("expires_in", "30m"),
    ];
    let query = serde_urlencoded::to_string(&fields[1..]).unwrap();
    let confirm = b.get(&format!("{SERVICE}/breakers/confirm?{query}")).await;
    assert_eq!(confirm.status, StatusCode::OK, "{}", confirm.body);
    assert!(confirm.body.contains("Every call to payments is rejected as if its breaker were open"));
    assert!(confirm.body.contains("ends by itself 30m after you confirm"));
    assert!(app.snapshot().await["config"]["breaker_overrides"].as_array().unwrap().is_empty());

    let mut confirmed: Vec<(&str, &str)> = fields.to_vec();
    confirmed.push(("reason", "payments provider outage"));
    let done = b.post(&format!("{SERVICE}/breakers"), &confirmed).await;
    assert_eq!(done.status, StatusCode::SEE_OTHER, "{}", done.body);
    let snap = app.snapshot().await;
    let o = &snap["config"]["breaker_overrides"][0];
    assert_eq!(o["dependency"], "payments");
    assert_eq!(o["state"], "forced_open");
    assert_eq!(o["reason"], "payments provider outage");
    let expires = levee_agent::policy::Timestamp::parse(o["expires_at"].as_str().unwrap()).unwrap();
    let left = expires.unix_ms() - levee_agent::policy::Timestamp::now().unix_ms();
    assert!((29 * 60_000..=30 * 60_000).contains(&left), "expires in {left} ms");

    let page = b.get(SERVICE).await;
    assert!(page.body.contains("FORCED_OPEN") && page.body.contains("payments provider outage"));
    assert!(page.body.contains(&format!("action=\"{SERVICE}/breakers/remove/confirm\"")));
    let rev = revision(&app).await.to_string();
    let fields =
        [("csrf", csrf.as_str()), ("revision", rev.as_str()), ("dependency", "payments"), ("operation", "")];
    let query = serde_urlencoded::to_string(&fields[1..]).unwrap();
    let confirm = b.get(&format!("{SERVICE}/breakers/remove/confirm?{query}")).await;
    assert_eq!(confirm.status, StatusCode::OK, "{}", confirm.body);
    assert!(confirm.body.contains("decides on its own again"));
    let mut confirmed: Vec<(&str, &str)> = fields.to_vec();
    confirmed.push(("reason", "provider recovered"));
    let done = b.post(&format!("{SERVICE}/breakers/remove"), &confirmed).await;
    assert_eq!(done.status, StatusCode::SEE_OTHER, "{}", done.body);
    assert!(app.snapshot().await["config"]["breaker_overrides"].as_array().unwrap().is_empty());

    let audit = app.audit().await;
    assert_eq!(audit[0]["action"], "breaker.override.delete");
    assert_eq!(audit[0]["reason"], "provider recovered");
    assert_eq!(audit[1]["action"], "breaker.override");
    assert!(audit[..2].iter().all(|r| r["via"] == "ui" && r["actor"] == "olivia" && r["outcome"] == "ok"));
}
}

on_both_backends! {
async fn a_confirmation_of_an_older_revision_changes_nothing(app) {
    app.seed().await;
    app.user("olivia", "operator").await;
    let mut b = app.logged_in("olivia").await;
    let csrf = b.get(SERVICE).await.csrf();
    let seen = revision(&app).await.to_string();
    // Someone else changes the service after the confirmation page was shown.
    let (s, _, body) = app
        .api(
            Method::PATCH,
            "/environments/prod/services/checkout/flags/checkout.max_items",
            Some(json!({"value": 20, "reason": "smaller carts"})),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{body}");
    let res = b
        .post(
            KILL_SWITCH,
            &[("csrf", &csrf), ("value", "false"), ("revision", &seen), ("reason", "incident")],
        )
        .await;
    assert_eq!(res.status, StatusCode::CONFLICT);
    assert!(res.body.contains("changed while you were looking at it"), "{}", res.body);
    assert_eq!(app.kill_switch().await, json!(true));
    let audit = app.audit().await;
    assert_eq!(audit[0]["outcome"], "conflict");
    assert_eq!(audit[0]["via"], "ui");
}
}

on_both_backends! {
async fn service_page_shows_how_many_agents_applied_the_change(app) {
    app.seed().await;
    let token = app.agent_token("checkout").await;
    let cache = tempfile::tempdir().unwrap();
    let agent = Agent::builder(&app.grpc, &token, "prod", "checkout")
        .cache_dir(cache.path())
        .sync_settings(SyncClientSettings {
            backoff_base: Duration::from_millis(50),
            backoff_cap: Duration::from_millis(300),
            reconnect_jitter: Duration::from_millis(50),
            ..SyncClientSettings::default()
        })
        .build()
        .expect("agent builds");
    let switch = agent.flag_bool("recommendations.enabled", true);

    let mut b = app.logged_in("admin").await;
    let page = wait_for_page(&mut b, SERVICE, "<strong>1 of 1 agents applied revision").await;
    let rev = revision(&app).await;
    let done = b
        .post(
            KILL_SWITCH,
            &[
                ("csrf", &page.csrf()),
                ("value", "false"),
                ("revision", &rev.to_string()),
                ("reason", "game day"),
            ],
        )
        .await;
    assert_eq!(done.status, StatusCode::SEE_OTHER, "{}", done.body);
    let follow = done.location().split('#').next().unwrap().to_string();
    let page = wait_for_page(&mut b, &follow, "1 of 1 connected agents have applied it").await;
    assert!(page.body.contains(&format!("Saved as revision {}.", rev + 1)));
    assert!(!page.body.contains("http-equiv=\"refresh\""), "no more reloading once every agent applied it");
    assert!(!switch.get(), "the agent really switched recommendations off");
    let agents = b.get("/ui/environments/prod").await;
    assert!(agents.body.contains("1 / 1"), "overview: 1 of 1 connected agents on the current revision");
    agent.shutdown().await;
}
}

/// Reloads `path` until it contains `text` (the way the page's own refresh would).
async fn wait_for_page(b: &mut crate::helpers::Browser<'_>, path: &str, text: &str) -> crate::helpers::Page {
    let start = tokio::time::Instant::now();
    loop {
        let page = b.get(path).await;
        assert_eq!(page.status, StatusCode::OK);
        if page.body.contains(text) {
            return page;
        }
        assert!(
            start.elapsed() < Duration::from_secs(15),
            "timed out waiting for {text:?} on {path}: {}",
            page.body
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

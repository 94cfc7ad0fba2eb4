//! Four-eyes on the policy editor's commit and on a rollback: under a policy approval rule
//! they offer what a refused flip offers (the reason kept, propose the same change, break
//! the glass), a refusal is audited, and nothing answers a bare 403 page.

use reqwest::{Method, StatusCode};
use serde_json::json;

use crate::helpers::{Browser, Page, SERVICE, TestApp};

async fn policy(app: &TestApp) -> serde_json::Value {
    app.snapshot().await["config"]["policy"].clone()
}

async fn rules(app: &TestApp, kinds: &[&str]) {
    let (s, _, b) = app
        .api(
            Method::PUT,
            "/environments/prod/approval-rules",
            Some(json!({"kinds": kinds, "reason": "four eyes in prod"})),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{b}");
}

/// The newest audit row of `action` in prod/checkout.
async fn last(app: &TestApp, action: &str) -> serde_json::Value {
    let (s, _, rows) = app
        .api(Method::GET, &format!("/audit?environment=prod&service=checkout&action={action}"), None)
        .await;
    assert_eq!(s, StatusCode::OK, "{rows}");
    rows[0].clone()
}

/// The preview of payments' attempt timeout set to `timeout`, with its commit form.
async fn preview(b: &mut Browser<'_>, timeout: &str) -> Page {
    let edit = b.get(&format!("{SERVICE}/policy/edit?part=dependency:payments")).await;
    assert_eq!(edit.status, StatusCode::OK, "{}", edit.body);
    let csrf = edit.csrf();
    let revision = edit.field("revision").unwrap();
    let page = b
        .post(
            &format!("{SERVICE}/policy/preview"),
            &[
                ("csrf", &csrf),
                ("revision", &revision),
                ("part", "dependency:payments"),
                ("k:/dependencies/payments/attempt_timeout", "s"),
                ("v:/dependencies/payments/attempt_timeout", timeout),
            ],
        )
        .await;
    assert_eq!(page.status, StatusCode::OK, "{}", page.body);
    assert!(page.body.contains("id=\"commit-form\""), "{}", page.body);
    page
}

/// The fields of the commit form of a preview, with `reason` and `mode`.
fn commit_fields(p: &Page, reason: &str, mode: Option<&str>) -> Vec<(&'static str, String)> {
    let form = &p.body[p.body.find("id=\"commit-form\"").unwrap()..];
    let hidden = |name: &str| {
        let needle = format!("name=\"{name}\" value=\"");
        let start = form.find(&needle).unwrap() + needle.len();
        let end = form[start..].find('"').unwrap() + start;
        html_unescape(&form[start..end])
    };
    let mut f = vec![
        ("csrf", p.csrf()),
        ("revision", hidden("revision")),
        ("part", hidden("part")),
        ("policy", hidden("policy")),
        ("reason", reason.to_string()),
    ];
    if let Some(m) = mode {
        f.push(("mode", m.to_string()));
    }
    f
}

/// The HTML escapes askama writes in an attribute.
fn html_unescape(s: &str) -> String {
    s.replace("&#34;", "\"")
        .replace("&#39;", "'")
        .replace("&#60;", "<")
        .replace("&#62;", ">")
        .replace("&quot;", "\"")
        .replace("&#38;", "&")
        .replace("&amp;", "&")
}

async fn post(b: &mut Browser<'_>, path: &str, fields: &[(&'static str, String)]) -> Page {
    let f: Vec<(&str, &str)> = fields.iter().map(|(k, v)| (*k, v.as_str())).collect();
    b.post(path, &f).await
}

on_both_backends! {
/// Under a policy rule, the editor's preview says so before anything is tried and offers
/// propose and break-glass instead of the commit; a commit prepared before the rule came
/// in is refused onto the same preview (403, reason kept, both offers, audited as
/// `policy.update` rejected); proposing makes a change request of exactly the policy
/// previewed and changes nothing; break-glass commits it, audited as a bypass.
async fn a_policy_commit_under_an_approval_rule_is_proposed_or_applied_by_break_glass(app) {
    app.seed().await;
    app.user("olivia", "operator").await;
    let mut b = app.logged_in("olivia").await;
    let before = policy(&app).await;

    // Previewed before the rule: a plain commit form.
    let early = preview(&mut b, "250ms").await;
    assert!(!early.body.contains("id=\"approval-needed\""), "{}", early.body);
    rules(&app, &["policy"]).await;

    let refused = post(&mut b, &format!("{SERVICE}/policy/commit"), &commit_fields(&early, "INC-9 payments slow", None)).await;
    assert_eq!(refused.status, StatusCode::FORBIDDEN, "{}", refused.body);
    for text in [
        "Not applied: policy changes in prod need an approved change request",
        "value=\"propose\"",
        "value=\"break_glass\"",
        ">INC-9 payments slow</textarea>",
        "id=\"commit-form\"",
    ] {
        assert!(refused.body.contains(text), "the refused commit lacks {text:?}: {}", refused.body);
    }
    assert!(!refused.body.contains("/api/v1"), "no API path: {}", refused.body);
    assert!(refused.body.contains("value=\"250ms\""), "the form keeps the value previewed: {}", refused.body);
    assert_eq!(policy(&app).await, before, "nothing changed");
    let row = last(&app, "policy.update").await;
    assert_eq!((row["outcome"].as_str(), row["via"].as_str(), row["actor"].as_str()),
        (Some("rejected"), Some("ui"), Some("olivia")), "{row}");
    assert!(row["detail"].as_str().unwrap_or_default().contains("need an approved change request"), "{row}");

    // With the rule known, the preview says so up front.
    let gated = preview(&mut b, "250ms").await;
    assert!(gated.body.contains("policy changes in prod need an approved change request"), "{}", gated.body);
    assert!(!gated.body.contains("Not applied"), "{}", gated.body);
    assert!(!gated.body.contains("Commit as a new revision"), "no plain commit under the rule: {}", gated.body);

    // Propose: a change request of the policy previewed, with the reason.
    let proposed = post(&mut b, &format!("{SERVICE}/policy/commit"),
        &commit_fields(&gated, "INC-9 payments slow", Some("propose"))).await;
    assert_eq!(proposed.status, StatusCode::SEE_OTHER, "{}", proposed.body);
    assert!(proposed.location().starts_with("/ui/environments/prod/requests?done="), "{}", proposed.location());
    let (s, _, r) = app.api(Method::GET, "/environments/prod/change-requests/1", None).await;
    assert_eq!(s, StatusCode::OK, "{r}");
    assert_eq!((r["kind"].as_str(), r["state"].as_str(), r["proposed_by"].as_str(), r["reason"].as_str()),
        (Some("policy"), Some("open"), Some("olivia"), Some("INC-9 payments slow")), "{r}");
    assert_eq!(r["proposed"]["dependencies"]["payments"]["attempt_timeout"], "250ms", "{r}");
    assert_eq!(policy(&app).await, before, "proposing changes nothing");

    // Break the glass: committed at once, audited as the edit and as a bypass.
    let glass = post(&mut b, &format!("{SERVICE}/policy/commit"),
        &commit_fields(&gated, "INC-9 cannot wait", Some("break_glass"))).await;
    assert_eq!(glass.status, StatusCode::SEE_OTHER, "{}", glass.body);
    assert!(glass.location().contains("?changed=2"), "{}", glass.location());
    assert_eq!(policy(&app).await["dependencies"]["payments"]["attempt_timeout"], "250ms");
    let row = last(&app, "policy.update").await;
    assert_eq!((row["outcome"].as_str(), row["reason"].as_str()), (Some("ok"), Some("INC-9 cannot wait")), "{row}");
    let row = last(&app, "approval.bypass").await;
    assert_eq!((row["outcome"].as_str(), row["actor"].as_str()), (Some("bypass"), Some("olivia")), "{row}");
}
}

on_both_backends! {
/// Under a policy rule, a rollback's confirmation offers propose and break-glass; a
/// rollback refused there comes back with the reason kept and is audited as
/// `service.rollback` rejected; a rollback that changes only the policy is proposed as a
/// change request of the old revision's policy; one that also changes a flag cannot be one
/// request, and the page says why (a crafted proposal is refused), but break-glass rolls it
/// back whole.
async fn a_rollback_under_an_approval_rule_is_proposed_or_applied_by_break_glass(app) {
    app.seed().await;
    app.user("olivia", "operator").await;
    // Revision 2: a policy edit, made before the rule.
    let mut b = app.logged_in("olivia").await;
    let p = preview(&mut b, "250ms").await;
    let done = post(&mut b, &format!("{SERVICE}/policy/commit"), &commit_fields(&p, "slower payments", None)).await;
    assert_eq!(done.status, StatusCode::SEE_OTHER, "{}", done.body);
    rules(&app, &["policy"]).await;

    let confirm = b.get(&format!("{SERVICE}/rollback/confirm?to=1&revision=2")).await;
    assert_eq!(confirm.status, StatusCode::OK, "{}", confirm.body);
    assert!(confirm.body.contains("policy changes in prod need an approved change request"), "{}", confirm.body);
    assert!(confirm.body.contains("value=\"propose\"") && confirm.body.contains("value=\"break_glass\""), "{}", confirm.body);
    let csrf = confirm.csrf();
    let form = |reason: &str, mode: Option<&str>| {
        let mut f = vec![("csrf", csrf.clone()), ("to", "1".to_string()), ("revision", "2".to_string()),
            ("reason", reason.to_string())];
        if let Some(m) = mode {
            f.push(("mode", m.to_string()));
        }
        f
    };

    // Confirmed as a plain rollback (a page loaded before the rule): refused, reason kept.
    let refused = post(&mut b, &format!("{SERVICE}/rollback"), &form("payments recovered", None)).await;
    assert_eq!(refused.status, StatusCode::FORBIDDEN, "{}", refused.body);
    assert!(refused.body.contains("Not applied: policy changes in prod need an approved change request"), "{}", refused.body);
    assert!(refused.body.contains(">payments recovered</textarea>"), "{}", refused.body);
    assert!(refused.body.contains("value=\"propose\""), "{}", refused.body);
    let row = last(&app, "service.rollback").await;
    assert_eq!((row["outcome"].as_str(), row["via"].as_str()), (Some("rejected"), Some("ui")), "{row}");
    assert_eq!(policy(&app).await["dependencies"]["payments"]["attempt_timeout"], "250ms");

    // Proposed: a change request of revision 1's policy.
    let proposed = post(&mut b, &format!("{SERVICE}/rollback"), &form("payments recovered", Some("propose"))).await;
    assert_eq!(proposed.status, StatusCode::SEE_OTHER, "{}", proposed.body);
    let (_, _, r) = app.api(Method::GET, "/environments/prod/change-requests/1", None).await;
    assert_eq!((r["kind"].as_str(), r["state"].as_str()), (Some("policy"), Some("open")), "{r}");
    assert_eq!(r["proposed"]["dependencies"]["payments"]["attempt_timeout"], "300ms", "{r}");
    assert_eq!(policy(&app).await["dependencies"]["payments"]["attempt_timeout"], "250ms", "nothing applied");

    // Revision 3: a flag flipped (no rule on flags). Rolling back to 1 changes the flag too.
    let (s, _, body) = app
        .api(Method::PATCH, "/environments/prod/services/checkout/flags/recommendations.enabled",
            Some(json!({"value": false, "reason": "game day"})))
        .await;
    assert_eq!(s, StatusCode::OK, "{body}");
    let confirm = b.get(&format!("{SERVICE}/rollback/confirm?to=1&revision=3")).await;
    assert_eq!(confirm.status, StatusCode::OK, "{}", confirm.body);
    assert!(confirm.body.contains("this rollback changes flags"), "{}", confirm.body);
    assert!(!confirm.body.contains("value=\"propose\""), "{}", confirm.body);
    let form = |reason: &str, mode: &str| {
        vec![("csrf", csrf.clone()), ("to", "1".to_string()), ("revision", "3".to_string()),
            ("reason", reason.to_string()), ("mode", mode.to_string())]
    };
    let crafted = post(&mut b, &format!("{SERVICE}/rollback"), &form("only the policy", "propose")).await;
    assert_eq!(crafted.status, StatusCode::BAD_REQUEST, "{}", crafted.body);
    assert!(crafted.body.contains("cannot be proposed as one"), "{}", crafted.body);
    let glass = post(&mut b, &format!("{SERVICE}/rollback"), &form("INC-9 back to the start", "break_glass")).await;
    assert_eq!(glass.status, StatusCode::SEE_OTHER, "{}", glass.body);
    assert!(glass.location().contains("?changed=4"), "{}", glass.location());
    assert_eq!(policy(&app).await["dependencies"]["payments"]["attempt_timeout"], "300ms");
    assert_eq!(app.kill_switch().await, json!(true), "the whole revision is back");
    let row = last(&app, "approval.bypass").await;
    assert_eq!((row["outcome"].as_str(), row["reason"].as_str()), (Some("bypass"), Some("INC-9 back to the start")), "{row}");
}
}

on_both_backends! {
/// The approval-rules page has a checkbox for experiments: it says what it covers, an admin
/// sets it, and the environment's rules then name `experiment`.
async fn the_rules_page_sets_a_rule_covering_experiments(app) {
    app.seed().await;
    let mut b = app.logged_in("admin").await;
    let page = b.get("/ui/environments/prod/approval-rules").await;
    assert_eq!(page.status, StatusCode::OK, "{}", page.body);
    assert!(page.body.contains("name=\"experiment\""), "{}", page.body);
    assert!(page.body.contains("starting an experiment"), "{}", page.body);
    let csrf = page.csrf();
    let done = b
        .post(
            "/ui/environments/prod/approval-rules",
            &[("csrf", &csrf), ("experiment", "on"), ("reason", "game days are changes")],
        )
        .await;
    assert_eq!(done.status, StatusCode::SEE_OTHER, "{}", done.body);
    let (s, _, r) = app.api(Method::GET, "/environments/prod/approval-rules", None).await;
    assert_eq!((s, r["kinds"].clone()), (StatusCode::OK, json!(["experiment"])), "{r}");
}
}

//! Four-eyes on every path (cases AP-1…AP-6): an approval rule covers what a write changes
//! whatever carries it, an approval binds to the content approved, scheduled changes are
//! checked when they run, the proposer is the person behind any token, and moving a
//! scheduled change keeps its revert — on SQLite and on PostgreSQL.

use levee_agent::policy::Timestamp;
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

use crate::helpers::{TestApp, assert_problem};

const ENV: &str = "/api/v1/environments/prod";
const SVC: &str = "/api/v1/environments/prod/services/checkout";
const FLAG: &str = "/api/v1/environments/prod/services/checkout/flags/recommendations.enabled";
const REQS: &str = "/api/v1/environments/prod/change-requests";
const PROFILES: &str = "/api/v1/environments/prod/profiles";
const NEEDS_APPROVAL: &str = "need an approved change request";

async fn rules(app: &TestApp, kinds: &[&str]) {
    let body = json!({"kinds": kinds, "reason": "SOC 2"});
    let (s, _, b) = app.call(Method::PUT, &format!("{ENV}/approval-rules"), Some(body)).await;
    assert_eq!(s, StatusCode::OK, "{b}");
}

/// The newest `n` audit rows of `prod`, newest first.
async fn audit(app: &TestApp, n: usize) -> Vec<Value> {
    let (_, _, a) = app.call(Method::GET, &format!("/api/v1/audit?environment=prod&limit={n}"), None).await;
    a.as_array().unwrap().clone()
}

async fn flag_value(app: &TestApp) -> Value {
    let (s, _, f) = app.call(Method::GET, FLAG, None).await;
    assert_eq!(s, StatusCode::OK, "{f}");
    f["value"].clone()
}

fn new_service(flags: Value) -> Value {
    json!({
        "name": "checkout",
        "reason": "again",
        "policy": {"dependencies": {"recommendations": {"criticality": "non_critical",
            "attempt_timeout": "1ms", "fallback": "generic"}}},
        "flags": flags,
    })
}

/// A profile switching the kill switch off, defined by the admin.
async fn define_profile(app: &TestApp, flags: Value) -> Value {
    let body = json!({
        "description": "recommendations are melting down",
        "services": {"checkout": {"flags": flags,
            "breakers": [{"dependency": "recommendations", "state": "forced_open"}]}},
        "reason": "agreed in review",
    });
    let (s, _, p) = app.call(Method::PUT, &format!("{PROFILES}/recs-down"), Some(body)).await;
    assert!(s.is_success(), "{p}");
    p
}

/// Proposes `body` as `proposer`, has `approver` approve version 1; returns the request's URL.
async fn approved(app: &TestApp, proposer: &str, approver: &str, body: Value) -> String {
    let (s, _, r) = app.call_as(proposer, Method::POST, REQS, Some(body), &[]).await;
    assert_eq!(s, StatusCode::CREATED, "{r}");
    let url = format!("{REQS}/{}", r["id"]);
    let ok = json!({"version": 1, "reason": "reviewed"});
    let (s, _, r) = app.call_as(approver, Method::POST, &format!("{url}/approve"), Some(ok), &[]).await;
    assert_eq!((s, r["state"].as_str()), (StatusCode::OK, Some("approved")), "{r}");
    url
}

on_both_backends! {
async fn ap_1_deleting_and_creating_a_service_again_needs_the_approval_of_changing_it(app) {
    app.seed().await;
    rules(&app, &["flag", "policy"]).await;
    let olivia = app.user("olivia", "operator").await;
    let glass = [("x-levee-break-glass", "migrating checkout"), ("if-match", "*")];
    // What is not there, or already there, is answered as such whatever the rules.
    let nope = format!("{ENV}/services/nope?reason=x");
    let (s, h, b) = app.call_as(&olivia, Method::DELETE, &nope, None, &[("if-match", "*")]).await;
    assert_problem(s, &h, &b, StatusCode::NOT_FOUND);
    let taken = new_service(json!({}));
    let (s, h, b) = app.call_as(&olivia, Method::POST, &format!("{ENV}/services"), Some(taken), &[]).await;
    assert_problem(s, &h, &b, StatusCode::CONFLICT);

    // Deleting removes the policy and flags new instances receive: refused, audited.
    let del = format!("{SVC}?reason=recreate");
    let (s, h, b) = app.call_as(&olivia, Method::DELETE, &del, None, &[("if-match", "*")]).await;
    assert_problem(s, &h, &b, StatusCode::FORBIDDEN);
    assert!(b["detail"].as_str().unwrap().contains(NEEDS_APPROVAL), "{b}");
    let (s, _, _) = app.call(Method::GET, SVC, None).await;
    assert_eq!(s, StatusCode::OK, "the service is still there");
    let a = audit(&app, 1).await;
    assert_eq!((&a[0]["action"], &a[0]["outcome"]), (&json!("service.delete"), &json!("rejected")), "{a:?}");

    // Deleted by break-glass: audited as a bypass.
    let (s, _, b) = app.call_as(&olivia, Method::DELETE, &del, None, &glass).await;
    assert_eq!(s, StatusCode::NO_CONTENT, "{b}");
    let a = audit(&app, 2).await;
    assert_eq!((&a[0]["action"], &a[0]["outcome"]), (&json!("approval.bypass"), &json!("bypass")), "{a:?}");
    assert_eq!(a[1]["action"], "service.delete", "{a:?}");

    // Created again with the kill switch off and another policy: refused like changing
    // them, nothing created; without flags the policy alone still needs approval.
    let services = format!("{ENV}/services");
    let off = json!({"recommendations.enabled": {"type": "bool", "value": false}});
    for flags in [off.clone(), json!({})] {
        let (s, h, b) = app.call_as(&olivia, Method::POST, &services, Some(new_service(flags)), &[]).await;
        assert_problem(s, &h, &b, StatusCode::FORBIDDEN);
        assert!(b["detail"].as_str().unwrap().contains(NEEDS_APPROVAL), "{b}");
        let (s, _, _) = app.call(Method::GET, SVC, None).await;
        assert_eq!(s, StatusCode::NOT_FOUND);
    }
    let a = audit(&app, 1).await;
    assert_eq!((&a[0]["action"], &a[0]["outcome"]), (&json!("service.create"), &json!("rejected")), "{a:?}");

    // Break-glass creates it, audited as a bypass naming both kinds.
    let (s, _, b) = app.call_as(&olivia, Method::POST, &services, Some(new_service(off)), &glass).await;
    assert_eq!(s, StatusCode::CREATED, "{b}");
    assert_eq!(flag_value(&app).await, json!(false));
    let a = audit(&app, 2).await;
    assert_eq!((&a[0]["action"], &a[0]["outcome"]), (&json!("approval.bypass"), &json!("bypass")), "{a:?}");
    assert_eq!(a[0]["target"], "policy, flag: checkout", "{a:?}");
    assert_eq!(a[1]["action"], "service.create", "{a:?}");

    // Where only flags need approval, a service created without flags needs none.
    rules(&app, &["flag"]).await;
    let mut bare = new_service(json!({}));
    bare["name"] = json!("search");
    let (s, _, b) = app.call_as(&olivia, Method::POST, &services, Some(bare), &[]).await;
    assert_eq!(s, StatusCode::CREATED, "{b}");
}
}

on_both_backends! {
async fn ap_2_an_approval_binds_to_the_content_approved(app) {
    app.seed().await;
    let olivia = app.user("olivia", "operator").await;
    let rita = app.user("rita", "operator").await;
    define_profile(&app, json!({"recommendations.enabled": false})).await;
    rules(&app, &["profile", "flag"]).await;
    let profile_request = json!({"kind": "profile", "profile": "recs-down", "expires_in": "1h", "reason": "INC-7"});

    // The profile is approved as defined (version 1), then edited (its PUT is not gated):
    // the approval does not cover the edited profile, so nothing is applied.
    let url = approved(&app, &olivia, &rita, profile_request.clone()).await;
    let (_, _, r) = app.call(Method::GET, &url, None).await;
    assert_eq!(r["diff"].as_array().unwrap().iter().find(|d| d["path"] == "version").unwrap()["after"], 1, "{r}");
    let mut edit = app.call(Method::GET, &format!("{PROFILES}/recs-down"), None).await.2["definition"].clone();
    edit["services"]["checkout"]["breakers"] = json!([]);
    edit["reason"] = json!("no forced breaker after all");
    let (s, _, edited) = app.call(Method::PUT, &format!("{PROFILES}/recs-down"), Some(edit)).await;
    assert_eq!((s, &edited["version"]), (StatusCode::OK, &json!(2)), "{edited}");
    let (s, h, b) = app.call_as(&olivia, Method::POST, &format!("{url}/apply"), Some(json!({"reason": "go"})), &[]).await;
    assert_problem(s, &h, &b, StatusCode::CONFLICT);
    assert_eq!(b["type"], "urn:levee:problem:approval-void", "{b}");
    let (_, _, r) = app.call(Method::GET, &url, None).await;
    assert_eq!(r["state"], "conflict", "{r}");
    assert!(r["outcome"].as_str().unwrap().contains("edited since the request was proposed"), "{r}");
    let (s, _, _) = app.call(Method::GET, &format!("{ENV}/active-profile"), None).await;
    assert_eq!(s, StatusCode::NOT_FOUND, "nothing applied");
    assert_eq!(flag_value(&app).await, json!(true));

    // The same again on the definition as it now is: applied, at the version approved.
    define_profile(&app, json!({"recommendations.enabled": false})).await;
    let url = approved(&app, &olivia, &rita, profile_request).await;
    let (s, _, r) = app.call_as(&olivia, Method::POST, &format!("{url}/apply"), Some(json!({"reason": "go"})), &[]).await;
    assert_eq!((s, r["state"].as_str()), (StatusCode::OK, Some("applied")), "{r}");
    let (_, _, active) = app.call(Method::GET, &format!("{ENV}/active-profile"), None).await;
    assert_eq!(active["version"], 3, "{active}");
    assert_eq!(flag_value(&app).await, json!(false));
    let (s, _, b) = app.call(Method::POST, &format!("{ENV}/active-profile/revert"), Some(json!({"reason": "over"}))).await;
    assert_eq!(s, StatusCode::OK, "{b}");

    // A flag approved, then changed by another object (a whole-service write): void.
    let flag_request = json!({"kind": "flag", "service": "checkout", "flag": "recommendations.enabled",
                              "value": false, "reason": "INC-8"});
    let url = approved(&app, &olivia, &rita, flag_request).await;
    let (_, _, snap) = app.call(Method::GET, &format!("{SVC}/snapshot"), None).await;
    let mut flags = snap["config"]["flags"].clone();
    flags["recommendations.enabled"]["description"] = json!("edited after the approval");
    let put = json!({"description": "", "policy": snap["config"]["policy"], "flags": flags, "reason": "gitops"});
    let (s, _, b) = app
        .call_as(&rita, Method::PUT, SVC, Some(put), &[("if-match", "*"), ("x-levee-break-glass", "docs")])
        .await;
    assert_eq!(s, StatusCode::OK, "{b}");
    let (s, h, b) = app.call_as(&olivia, Method::POST, &format!("{url}/apply"), Some(json!({"reason": "go"})), &[]).await;
    assert_problem(s, &h, &b, StatusCode::CONFLICT);
    assert_eq!(b["type"], "urn:levee:problem:approval-void", "{b}");
    assert_eq!(flag_value(&app).await, json!(true));

    // An approval holds while its approver could still give it: rita, demoted, no longer
    // approves what she approved before.
    let flag_request = json!({"kind": "flag", "service": "checkout", "flag": "recommendations.enabled",
                              "value": false, "reason": "INC-10"});
    let url = approved(&app, &olivia, &rita, flag_request).await;
    let demote = json!({"role": "viewer", "reason": "moved teams"});
    let (s, _, b) = app.call(Method::PATCH, "/api/v1/users/rita", Some(demote)).await;
    assert!(s.is_success(), "{b}");
    let (s, h, b) = app.call_as(&olivia, Method::POST, &format!("{url}/apply"), Some(json!({"reason": "go"})), &[]).await;
    assert_problem(s, &h, &b, StatusCode::CONFLICT);
    assert!(b["detail"].as_str().unwrap().contains("approved by rita, who can no longer approve it"), "{b}");
    let (_, _, r) = app.call(Method::GET, &url, None).await;
    assert_eq!(r["state"], "conflict", "{r}");
    assert_eq!(flag_value(&app).await, json!(true));
}
}

on_both_backends! {
async fn ap_3_a_rule_covers_what_a_write_changes_whatever_carries_it(app) {
    app.seed().await;
    let olivia = app.user("olivia", "operator").await;
    let rita = app.user("rita", "operator").await;
    define_profile(&app, json!({"recommendations.enabled": false})).await;
    // Only flags need approval; the profile switches a flag off.
    rules(&app, &["flag"]).await;
    let apply = format!("{PROFILES}/recs-down/apply");
    let body = json!({"expires_in": "1h", "reason": "INC-9"});

    let (s, h, b) = app.call_as(&olivia, Method::POST, &apply, Some(body.clone()), &[]).await;
    assert_problem(s, &h, &b, StatusCode::FORBIDDEN);
    assert!(b["detail"].as_str().unwrap().contains("flag changes in environment"), "{b}");
    let (s, _, _) = app.call(Method::GET, &format!("{ENV}/active-profile"), None).await;
    assert_eq!(s, StatusCode::NOT_FOUND, "nothing applied");
    let (_, _, hist) = app.call(Method::GET, &format!("{ENV}/profile-activations"), None).await;
    assert_eq!(hist, json!([]), "a refused application leaves no record of one");
    assert_eq!(flag_value(&app).await, json!(true));

    // Break-glass applies it, the flag change audited as a bypass.
    let (s, _, b) =
        app.call_as(&olivia, Method::POST, &apply, Some(body.clone()), &[("x-levee-break-glass", "sev1")]).await;
    assert_eq!(s, StatusCode::OK, "{b}");
    let a = audit(&app, 10).await;
    let bypass = a.iter().find(|r| r["action"] == "approval.bypass").expect("a bypass row");
    assert_eq!((&bypass["outcome"], &bypass["target"]), (&json!("bypass"), &json!("flag: profile recs-down")), "{a:?}");
    // Its revert puts back what it replaced: upkeep, not a change of its own.
    let (s, _, b) = app.call_as(&olivia, Method::POST, &format!("{ENV}/active-profile/revert"), Some(json!({"reason": "over"})), &[]).await;
    assert_eq!(s, StatusCode::OK, "{b}");
    assert_eq!(flag_value(&app).await, json!(true));

    // An approved profile request covers the flags it sets, though `profile` is not gated.
    let url = approved(&app, &olivia, &rita, json!({"kind": "profile", "profile": "recs-down", "expires_in": "1h", "reason": "INC-9"})).await;
    let (s, _, r) = app.call_as(&olivia, Method::POST, &format!("{url}/apply"), Some(json!({"reason": "go"})), &[]).await;
    assert_eq!((s, r["state"].as_str()), (StatusCode::OK, Some("applied")), "{r}");
    assert_eq!(flag_value(&app).await, json!(false));
    app.call(Method::POST, &format!("{ENV}/active-profile/revert"), Some(json!({"reason": "over"}))).await;

    // A profile that changes no flag (a breaker only) needs no flag approval.
    define_profile(&app, json!({})).await;
    let (s, _, b) = app.call_as(&olivia, Method::POST, &apply, Some(body), &[]).await;
    assert_eq!(s, StatusCode::OK, "{b}");
}
}

const SCHED: &str = "/api/v1/environments/prod/scheduled-changes";
const HOUR: i64 = 3_600_000;

fn at(from_now_ms: i64) -> Timestamp {
    Timestamp::from_unix_ms(Timestamp::now().unix_ms() + from_now_ms)
}

async fn run_due(app: &TestApp, t: Timestamp) -> usize {
    app.server.as_ref().unwrap().actions.run_due_changes(t).await.unwrap()
}

/// Schedules the kill switch to `value` at `run_at` (reverted at `revert_at`) as `who`.
async fn schedule_flip(
    app: &TestApp,
    who: &str,
    value: bool,
    run_at: Timestamp,
    revert_at: Option<Timestamp>,
    headers: &[(&str, &str)],
) -> (StatusCode, Value) {
    let mut body = json!({"kind": "flag", "service": "checkout", "flag": "recommendations.enabled",
                          "value": value, "run_at": run_at, "reason": "maintenance window"});
    if let Some(r) = revert_at {
        body["revert_at"] = json!(r);
    }
    let (s, _, c) = app.call_as(who, Method::POST, SCHED, Some(body), headers).await;
    (s, c)
}

async fn change(app: &TestApp, c: &Value) -> Value {
    let (s, _, c) = app.call(Method::GET, &format!("{SCHED}/{}", c["id"]), None).await;
    assert_eq!(s, StatusCode::OK, "{c}");
    c
}

on_both_backends! {
async fn ap_4_scheduled_changes_are_checked_against_the_rules_and_role_when_they_run(app) {
    app.seed().await;
    let olivia = app.user("olivia", "operator").await;

    // Scheduled before any rule existed (a flip, a profile that sets a flag); then flags
    // come to need approval.
    let (s, c) = schedule_flip(&app, &olivia, false, at(HOUR), None, &[]).await;
    assert_eq!(s, StatusCode::CREATED, "{c}");
    define_profile(&app, json!({"recommendations.enabled": false})).await;
    let body = json!({"kind": "profile", "profile": "recs-down", "run_at": at(HOUR / 2),
                      "revert_at": at(HOUR / 2 + 60_000), "reason": "drill"});
    let (s, _, p) = app.call_as(&olivia, Method::POST, SCHED, Some(body), &[]).await;
    assert_eq!(s, StatusCode::CREATED, "{p}");
    rules(&app, &["flag"]).await;
    assert_eq!(run_due(&app, at(HOUR / 2 + 1000)).await, 1);
    let done = change(&app, &p).await;
    assert_eq!(done["state"], "failed", "{done}");
    assert!(done["outcome"].as_str().unwrap().contains("flag changes in environment"), "{done}");
    let (s, _, _) = app.call(Method::GET, &format!("{ENV}/active-profile"), None).await;
    assert_eq!(s, StatusCode::NOT_FOUND, "the profile was not applied");
    // Moving it to "now" is a change too.
    let moved = json!({"run_at": at(1000), "reason": "sooner"});
    let (s, h, b) = app.call_as(&olivia, Method::PATCH, &format!("{SCHED}/{}", c["id"]), Some(moved), &[]).await;
    assert_problem(s, &h, &b, StatusCode::FORBIDDEN);
    assert!(b["detail"].as_str().unwrap().contains(NEEDS_APPROVAL), "{b}");
    // When it comes due, the rule in force then refuses it: not applied, audited.
    assert_eq!(run_due(&app, at(HOUR + 1000)).await, 1);
    assert_eq!(flag_value(&app).await, json!(true));
    let done = change(&app, &c).await;
    assert_eq!(done["state"], "failed", "{done}");
    assert!(done["outcome"].as_str().unwrap().contains(NEEDS_APPROVAL), "{done}");
    let a = audit(&app, 2).await;
    assert!(a.iter().any(|r| r["action"] == "schedule.run" && r["outcome"] == "failed"), "{a:?}");

    // Scheduled with break-glass: applied when it runs, the bypass audited then too.
    let glass = [("x-levee-break-glass", "planned maintenance, CAB approved")];
    let (s, c) = schedule_flip(&app, &olivia, false, at(2 * HOUR), None, &glass).await;
    assert_eq!((s, c["break_glass"].as_str()), (StatusCode::CREATED, Some(glass[0].1)), "{c}");
    assert_eq!(run_due(&app, at(2 * HOUR + 1000)).await, 1);
    assert_eq!(flag_value(&app).await, json!(false));
    let done = change(&app, &c).await;
    assert_eq!(done["state"], "applied", "{done}");
    let a = audit(&app, 2).await;
    assert_eq!((&a[0]["action"], &a[0]["actor"]), (&json!("approval.bypass"), &json!("olivia")), "{a:?}");
    assert_eq!(a[0]["revision"], done["revision"], "{a:?}");
    assert_eq!(a[1]["action"], "flag.set", "{a:?}");

    // The author's role when it runs: a user demoted to viewer changes nothing.
    rules(&app, &[]).await;
    let (s, c) = schedule_flip(&app, &olivia, true, at(3 * HOUR), None, &[]).await;
    assert_eq!(s, StatusCode::CREATED, "{c}");
    let demote = json!({"role": "viewer", "reason": "left the on-call rota"});
    let (s, _, b) = app.call(Method::PATCH, "/api/v1/users/olivia", Some(demote)).await;
    assert!(s.is_success(), "{b}");
    assert_eq!(run_due(&app, at(3 * HOUR + 1000)).await, 1);
    let done = change(&app, &c).await;
    assert_eq!(done["state"], "failed", "{done}");
    assert!(done["outcome"].as_str().unwrap().contains("you are viewer"), "{done}");
    assert_eq!(flag_value(&app).await, json!(false));

    // Through an API token: the token's role when it runs; revoked, nothing runs.
    let mint = json!({"kind": "api", "name": "deploy-bot", "role": "operator", "reason": "ci"});
    let (s, _, t) = app.call(Method::POST, "/api/v1/tokens", Some(mint)).await;
    assert_eq!(s, StatusCode::CREATED, "{t}");
    let (s, c) = schedule_flip(&app, t["token"].as_str().unwrap(), true, at(4 * HOUR), None, &[]).await;
    assert_eq!(s, StatusCode::CREATED, "{c}");
    let (s, _, b) = app.call(Method::DELETE, &format!("/api/v1/tokens/{}?reason=leaked", t["id"].as_str().unwrap()), None).await;
    assert!(s.is_success(), "{b}");
    assert_eq!(run_due(&app, at(4 * HOUR + 1000)).await, 1);
    let done = change(&app, &c).await;
    assert_eq!(done["state"], "failed", "{done}");
    assert!(done["outcome"].as_str().unwrap().contains("token deploy-bot is revoked"), "{done}");
    assert_eq!(flag_value(&app).await, json!(false));
}
}

on_both_backends! {
async fn ap_5_nobody_approves_their_own_request_through_a_token(app) {
    app.seed().await;
    rules(&app, &["flag"]).await;
    let alice = app.user("alice", "admin").await;
    let rita = app.user("rita", "operator").await;
    let mint = |name: &str, role: &str| json!({"kind": "api", "name": name, "role": role, "reason": "automation"});
    // Alice's token, and a token that token minted: both act for alice.
    let (s, _, t) = app.call_as(&alice, Method::POST, "/api/v1/tokens", Some(mint("alice-admin-bot", "admin")), &[]).await;
    assert_eq!(s, StatusCode::CREATED, "{t}");
    let alice_bot = t["token"].as_str().unwrap().to_string();
    let (s, _, t) = app.call_as(&alice_bot, Method::POST, "/api/v1/tokens", Some(mint("review-bot", "operator")), &[]).await;
    assert_eq!(s, StatusCode::CREATED, "{t}");
    assert_eq!((&t["created_by"], &t["person"]), (&json!("token:alice-admin-bot"), &json!("alice")), "{t}");
    let review_bot = t["token"].as_str().unwrap().to_string();

    let body = json!({"kind": "flag", "service": "checkout", "flag": "recommendations.enabled", "value": false, "reason": "INC-5"});
    let ok = json!({"version": 1, "reason": "lgtm"});
    for (proposer, approver) in [(&alice, &alice_bot), (&alice, &review_bot), (&review_bot, &alice), (&alice_bot, &review_bot)] {
        let (s, _, r) = app.call_as(proposer, Method::POST, REQS, Some(body.clone()), &[]).await;
        assert_eq!(s, StatusCode::CREATED, "{r}");
        let url = format!("{REQS}/{}", r["id"]);
        let (s, h, b) = app.call_as(approver, Method::POST, &format!("{url}/approve"), Some(ok.clone()), &[]).await;
        assert_problem(s, &h, &b, StatusCode::FORBIDDEN);
        assert!(b["detail"].as_str().unwrap().contains("someone else must approve it"), "{b}");
        // Another person approves it.
        let (s, _, r) = app.call_as(&rita, Method::POST, &format!("{url}/approve"), Some(ok.clone()), &[]).await;
        assert_eq!((s, r["state"].as_str()), (StatusCode::OK, Some("approved")), "{r}");
        let (s, _, r) = app.call_as(proposer, Method::POST, &format!("{url}/reject"), Some(json!({"reason": "test done"})), &[]).await;
        assert_eq!(s, StatusCode::OK, "{r}");
    }
    // The proposer may edit their request through their own token, nobody else through theirs.
    let (_, _, r) = app.call_as(&alice, Method::POST, REQS, Some(body.clone()), &[]).await;
    let url = format!("{REQS}/{}", r["id"]);
    let (s, _, r) = app.call_as(&review_bot, Method::PUT, &url, Some(body.clone()), &[]).await;
    assert_eq!((s, r["version"].as_u64()), (StatusCode::OK, Some(2)), "{r}");
    let (s, h, b) = app.call_as(&rita, Method::PUT, &url, Some(body), &[]).await;
    assert_problem(s, &h, &b, StatusCode::FORBIDDEN);
}
}

on_both_backends! {
async fn ap_6_moving_a_scheduled_change_keeps_its_revert(app) {
    app.seed().await;
    let (one, two, three, four, five) = (at(HOUR), at(2 * HOUR), at(3 * HOUR), at(4 * HOUR), at(5 * HOUR));
    let (s, c) = schedule_flip(&app, &app.token, false, one, Some(three), &[]).await;
    assert_eq!(s, StatusCode::CREATED, "{c}");
    let url = format!("{SCHED}/{}", c["id"]);
    let iso = |t: Timestamp| json!(t.to_string());

    // Moved without a word about the revert: kept, and the audit shows both times.
    let (s, _, m) = app.call(Method::PATCH, &url, Some(json!({"run_at": two, "reason": "later"}))).await;
    assert_eq!((s, &m["revert_at"]), (StatusCode::OK, &iso(three)), "{m}");
    let a = audit(&app, 1).await;
    assert_eq!(a[0]["action"], "schedule.update", "{a:?}");
    let side = |v: &Value| v.as_str().map_or(v.clone(), |t| serde_json::from_str(t).unwrap());
    assert_eq!(side(&a[0]["before"]), json!({"run_at": iso(one), "revert_at": iso(three)}), "{a:?}");
    assert_eq!(side(&a[0]["after"]), json!({"run_at": iso(two), "revert_at": iso(three)}), "{a:?}");

    // A kept revert that would come before the new time is refused, naming it.
    let (s, h, b) = app.call(Method::PATCH, &url, Some(json!({"run_at": four, "reason": "much later"}))).await;
    assert_problem(s, &h, &b, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(b["errors"][0]["path"], "revert_at", "{b}");
    // Changed explicitly: both recorded; the change and its revert run at their new times.
    let (s, _, m) = app.call(Method::PATCH, &url, Some(json!({"run_at": four, "revert_at": five, "reason": "much later"}))).await;
    assert_eq!((s, &m["revert_at"]), (StatusCode::OK, &iso(five)), "{m}");
    let a = audit(&app, 1).await;
    assert_eq!(side(&a[0]["before"]), json!({"run_at": iso(two), "revert_at": iso(three)}), "{a:?}");
    assert_eq!(side(&a[0]["after"]), json!({"run_at": iso(four), "revert_at": iso(five)}), "{a:?}");
    assert_eq!(run_due(&app, at(4 * HOUR + 1000)).await, 1);
    assert_eq!(flag_value(&app).await, json!(false));
    assert_eq!(run_due(&app, at(5 * HOUR + 1000)).await, 1);
    assert_eq!(flag_value(&app).await, json!(true));

    // Dropped explicitly with null: recorded as dropped.
    let (_, c) = schedule_flip(&app, &app.token, false, at(6 * HOUR), Some(at(7 * HOUR)), &[]).await;
    let url = format!("{SCHED}/{}", c["id"]);
    let (s, _, m) = app.call(Method::PATCH, &url, Some(json!({"run_at": at(6 * HOUR + 1000), "revert_at": null, "reason": "keep it"}))).await;
    assert_eq!((s, &m["revert_at"]), (StatusCode::OK, &Value::Null), "{m}");
    let a = audit(&app, 1).await;
    assert_eq!(side(&a[0]["after"])["revert_at"], Value::Null, "{a:?}");

    // A profile's end (its expiry) is its revert: kept when it is moved.
    define_profile(&app, json!({"recommendations.enabled": false})).await;
    let body = json!({"kind": "profile", "profile": "recs-down", "run_at": at(8 * HOUR), "revert_at": at(9 * HOUR), "reason": "drill"});
    let (s, _, c) = app.call(Method::POST, SCHED, Some(body)).await;
    assert_eq!(s, StatusCode::CREATED, "{c}");
    let expiry = c["value"]["expires_at"].clone();
    let url = format!("{SCHED}/{}", c["id"]);
    let (s, _, m) = app.call(Method::PATCH, &url, Some(json!({"run_at": at(8 * HOUR + 60_000), "reason": "later"}))).await;
    assert_eq!((s, &m["value"]["expires_at"]), (StatusCode::OK, &expiry), "{m}");
    let (s, h, b) = app.call(Method::PATCH, &url, Some(json!({"run_at": at(10 * HOUR), "reason": "too late"}))).await;
    assert_problem(s, &h, &b, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(b["errors"][0]["path"], "revert_at", "{b}");
}
}

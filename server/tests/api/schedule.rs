//! Scheduled changes: applied once when due (the test runs due jobs explicitly, at chosen
//! times, instead of waiting), reverted by themselves, rescheduled or cancelled without a
//! trace of the old job, a moved target shown as a conflict and never applied, one replica
//! applying each on a shared PostgreSQL.

use levee_agent::policy::Timestamp;
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

use crate::helpers::{Db, TestApp, assert_problem, postgres_url};

const SCHED: &str = "/api/v1/environments/prod/scheduled-changes";
const FLAG: &str = "/api/v1/environments/prod/services/checkout/flags/recommendations.enabled";

fn at(from_now_ms: i64) -> Timestamp {
    Timestamp::from_unix_ms(Timestamp::now().unix_ms() + from_now_ms)
}

const HOUR: i64 = 3_600_000;

async fn flag(app: &TestApp) -> Value {
    app.call(Method::GET, FLAG, None).await.2["value"].clone()
}

async fn schedule_flip(app: &TestApp, value: bool, run_at: Timestamp, revert_at: Option<Timestamp>) -> Value {
    let mut body = json!({"kind": "flag", "service": "checkout", "flag": "recommendations.enabled",
                          "value": value, "run_at": run_at, "reason": "maintenance window"});
    if let Some(r) = revert_at {
        body["revert_at"] = json!(r);
    }
    let (s, _, c) = app.call(Method::POST, SCHED, Some(body)).await;
    assert_eq!(s, StatusCode::CREATED, "{c}");
    c
}

async fn run_due(app: &TestApp, t: Timestamp) -> usize {
    app.server.as_ref().unwrap().actions.run_due_changes(t).await.unwrap()
}

async fn flip_applies_when_due_and_reverts(app: TestApp) {
    app.seed().await;
    let c = schedule_flip(&app, false, at(HOUR), Some(at(2 * HOUR))).await;
    assert_eq!((c["state"].as_str(), c["base_revision"].as_u64()), (Some("pending"), Some(1)), "{c}");
    assert_eq!(run_due(&app, at(HOUR - 60_000)).await, 0, "not due yet");
    assert_eq!(flag(&app).await, json!(true));

    assert_eq!(run_due(&app, at(HOUR + 1000)).await, 1);
    assert_eq!(run_due(&app, at(HOUR + 1000)).await, 0, "applied once");
    assert_eq!(flag(&app).await, json!(false));
    let id = c["id"].as_i64().unwrap();
    let (_, _, done) = app.call(Method::GET, &format!("{SCHED}/{id}"), None).await;
    assert_eq!((done["state"].as_str(), done["revision"].as_u64()), (Some("applied"), Some(2)), "{done}");
    let (_, _, audit) = app.call(Method::GET, "/api/v1/audit?service=checkout&limit=1", None).await;
    assert_eq!(
        (&audit[0]["action"], &audit[0]["actor"], &audit[0]["via"], &audit[0]["outcome"]),
        (&json!("flag.set"), &json!("admin"), &json!("server"), &json!("ok")),
        "{audit}"
    );

    // Its revert is a scheduled change of its own, due at revert_at.
    let (_, _, list) = app.call(Method::GET, &format!("{SCHED}?service=checkout"), None).await;
    let revert = &list[0];
    assert_eq!((revert["state"].as_str(), revert["reverts"].as_i64()), (Some("pending"), Some(id)), "{list}");
    assert_eq!(revert["value"], json!(true));
    assert_eq!(run_due(&app, at(2 * HOUR + 1000)).await, 1);
    assert_eq!(flag(&app).await, json!(true));
}

#[tokio::test]
async fn a_scheduled_flip_applies_once_when_due_and_reverts_on_sqlite() {
    flip_applies_when_due_and_reverts(TestApp::spawn().await).await;
}

#[tokio::test]
async fn a_scheduled_flip_applies_once_when_due_and_reverts_on_postgres() {
    if let Some(app) = TestApp::spawn_on(Db::Postgres).await {
        flip_applies_when_due_and_reverts(app).await;
    }
}

#[tokio::test]
async fn rescheduling_and_cancelling_leave_no_old_job() {
    let app = TestApp::spawn().await;
    app.seed().await;
    let c = schedule_flip(&app, false, at(HOUR), None).await;
    let id = c["id"].as_i64().unwrap();
    let (s, _, moved) = app
        .call(
            Method::PATCH,
            &format!("{SCHED}/{id}"),
            Some(json!({"run_at": at(3 * HOUR), "reason": "later"})),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{moved}");
    assert_eq!(run_due(&app, at(2 * HOUR)).await, 0, "the old time is gone");
    assert_eq!(flag(&app).await, json!(true));
    let (s, _, cancelled) = app.call(Method::DELETE, &format!("{SCHED}/{id}?reason=not+needed"), None).await;
    assert_eq!((s, cancelled["state"].as_str()), (StatusCode::OK, Some("cancelled")), "{cancelled}");
    assert_eq!(run_due(&app, at(4 * HOUR)).await, 0, "a cancelled change never runs");
    assert_eq!(flag(&app).await, json!(true));
    let (s, h, b) = app.call(Method::DELETE, &format!("{SCHED}/{id}?reason=again"), None).await;
    assert_problem(s, &h, &b, StatusCode::NOT_FOUND);

    let (_, _, audit) = app.call(Method::GET, "/api/v1/audit?service=checkout", None).await;
    let actions: Vec<&str> =
        audit.as_array().unwrap().iter().map(|r| r["action"].as_str().unwrap()).collect();
    assert_eq!(
        actions,
        ["schedule.cancel", "schedule.update", "schedule.create", "service.create"],
        "{audit}"
    );

    // Bad times and kinds name their field.
    for (body, field) in [
        (
            json!({"kind": "flag", "service": "checkout", "flag": "recommendations.enabled", "value": false,
                "run_at": at(-1000), "reason": "r"}),
            "run_at",
        ),
        (
            json!({"kind": "flag", "service": "checkout", "flag": "recommendations.enabled", "value": false,
                "run_at": at(HOUR), "revert_at": at(HOUR - 1), "reason": "r"}),
            "revert_at",
        ),
        (
            json!({"kind": "flag", "service": "checkout", "flag": "recommendations.enabled", "value": 3,
                "run_at": at(HOUR), "reason": "r"}),
            "value",
        ),
        (json!({"kind": "flag", "service": "checkout", "run_at": at(HOUR), "reason": "r"}), "flag"),
        (json!({"kind": "dance", "run_at": at(HOUR), "reason": "r"}), "kind"),
        (json!({"kind": "profile", "profile": "p", "run_at": "tomorrow", "reason": "r"}), "run_at"),
    ] {
        let (s, h, b) = app.call(Method::POST, SCHED, Some(body.clone())).await;
        assert!(s.is_client_error(), "{body}: {b}");
        assert_problem(s, &h, &b, s);
        assert_eq!(b["errors"][0]["path"], field, "{body}: {b}");
    }
}

#[tokio::test]
async fn a_change_whose_target_moved_shows_the_conflict_and_is_not_applied() {
    let app = TestApp::spawn().await;
    app.seed().await;
    let c = schedule_flip(&app, false, at(HOUR), Some(at(2 * HOUR))).await;
    // Someone changes the flag after the change was scheduled.
    let (s, _, _) = app
        .call(Method::PATCH, FLAG, Some(json!({"value": true, "expires_at": at(5 * HOUR), "reason": "x"})))
        .await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(run_due(&app, at(HOUR + 1000)).await, 1);
    let id = c["id"].as_i64().unwrap();
    let (_, _, done) = app.call(Method::GET, &format!("{SCHED}/{id}"), None).await;
    assert_eq!(done["state"], "conflict", "{done}");
    let outcome = done["outcome"].as_str().unwrap();
    assert!(
        outcome.contains(
            "flag recommendations.enabled changed since the change was scheduled (at revision 1, now 2)"
        ),
        "{outcome}"
    );
    assert_eq!(flag(&app).await, json!(true));
    let (_, _, audit) = app.call(Method::GET, "/api/v1/audit?service=checkout&limit=2", None).await;
    assert_eq!(
        (&audit[0]["action"], &audit[0]["outcome"]),
        (&json!("schedule.run"), &json!("conflict")),
        "{audit}"
    );
    assert_eq!(audit[1]["reason"], "x", "no flag.set was audited for the scheduled change");
    // No revert is scheduled for a change that was not applied.
    let (_, _, list) = app.call(Method::GET, SCHED, None).await;
    assert!(list.as_array().unwrap().iter().all(|c| c["state"] != "pending"), "{list}");
}

#[tokio::test]
async fn a_scheduled_profile_is_applied_until_its_revert_time() {
    let app = TestApp::spawn().await;
    app.seed().await;
    let (s, _, _) = app
        .call(
            Method::PUT,
            "/api/v1/environments/prod/profiles/night",
            Some(json!({"services": {"checkout": {"flags": {"recommendations.enabled": false}}}, "reason": "r"})),
        )
        .await;
    assert_eq!(s, StatusCode::CREATED);
    let until = at(2 * HOUR);
    let (s, _, c) = app
        .call(
            Method::POST,
            SCHED,
            Some(json!({"kind": "profile", "profile": "night", "run_at": at(HOUR), "revert_at": until, "reason": "batch window"})),
        )
        .await;
    assert_eq!(s, StatusCode::CREATED, "{c}");
    assert_eq!(run_due(&app, at(HOUR + 1000)).await, 1);
    let (s, _, active) = app.call(Method::GET, "/api/v1/environments/prod/active-profile", None).await;
    assert_eq!(s, StatusCode::OK, "{active}");
    assert_eq!(Timestamp::parse(active["expires_at"].as_str().unwrap()), Some(until));
    assert_eq!(flag(&app).await, json!(false));
}

#[tokio::test]
async fn with_two_replicas_exactly_one_applies_a_due_change() {
    let Some(url) = postgres_url().await else { return };
    let a = TestApp::spawn_with(Some(url.clone())).await;
    let b = TestApp::spawn_with(Some(url)).await;
    a.seed().await;
    let c = schedule_flip(&a, false, at(HOUR), None).await;
    let t = at(HOUR + 1000);
    let (ra, rb) = tokio::join!(run_due(&a, t), run_due(&b, t));
    assert_eq!(ra + rb, 1, "one replica claims the change");
    let id = c["id"].as_i64().unwrap();
    let (_, _, done) = b.call(Method::GET, &format!("{SCHED}/{id}"), None).await;
    assert_eq!((done["state"].as_str(), done["revision"].as_u64()), (Some("applied"), Some(2)), "{done}");
    let (_, _, revs) =
        a.call(Method::GET, "/api/v1/environments/prod/services/checkout/revisions", None).await;
    assert_eq!(revs.as_array().unwrap().len(), 2, "one revision made: {revs}");
}

const LEASE_MS: i64 = levee_server::actions::SCHEDULE_LEASE.as_millis() as i64;

/// Claims change `id` as a replica that then dies without finishing it.
async fn claim_and_die(app: &TestApp, id: i64, t: Timestamp) {
    let store = &app.server.as_ref().unwrap().store;
    let claimed = store.claim_change(id, "dead-replica", t.unix_ms(), t.unix_ms() + LEASE_MS).await.unwrap();
    assert!(claimed.is_some_and(|c| c.reclaimed_from.is_none()), "the dead replica claimed it when due");
}

async fn get_change(app: &TestApp, id: i64) -> Value {
    let (s, _, c) = app.call(Method::GET, &format!("{SCHED}/{id}"), None).await;
    assert_eq!(s, StatusCode::OK, "{c}");
    c
}

/// The `schedule.run` audit rows of change `id`.
async fn run_audits(app: &TestApp, id: i64) -> Vec<Value> {
    let (_, _, audit) = app.call(Method::GET, "/api/v1/audit?service=checkout", None).await;
    let tag = format!("(scheduled change {id})");
    audit
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["action"] == "schedule.run" && r["target"].as_str().unwrap_or("").contains(&tag))
        .cloned()
        .collect()
}

async fn a_crashed_run_is_taken_over_after_its_lease(app: TestApp) {
    app.seed().await;
    let c = schedule_flip(&app, false, at(HOUR), Some(at(2 * HOUR))).await;
    let id = c["id"].as_i64().unwrap();
    assert_eq!(
        (&c["claimed_by"], &c["claim_expires_at"]),
        (&Value::Null, &Value::Null),
        "never claimed: {c}"
    );
    let t = at(HOUR + 1000);
    claim_and_die(&app, id, t).await;
    // While the lease holds, nobody else runs it.
    assert_eq!(run_due(&app, t).await, 0);
    assert_eq!(run_due(&app, Timestamp::from_unix_ms(t.unix_ms() + LEASE_MS - 1)).await, 0);
    let running = get_change(&app, id).await;
    assert_eq!(running["state"], "running");
    // Who holds it and until when, as the API shows it (RFC 3339, like every time).
    assert_eq!(running["claimed_by"], "dead-replica", "{running}");
    let lease_end = Timestamp::from_unix_ms(t.unix_ms() + LEASE_MS);
    assert_eq!(Timestamp::parse(running["claim_expires_at"].as_str().unwrap()), Some(lease_end), "{running}");
    assert_eq!(flag(&app).await, json!(true));

    // Once it expired, one run takes it over and applies it, once.
    let later = Timestamp::from_unix_ms(t.unix_ms() + LEASE_MS + 1000);
    assert_eq!(run_due(&app, later).await, 1);
    assert_eq!(run_due(&app, later).await, 0, "taken over once");
    assert_eq!(flag(&app).await, json!(false));
    let done = get_change(&app, id).await;
    assert_eq!((done["state"].as_str(), done["revision"].as_u64()), (Some("applied"), Some(2)), "{done}");
    let outcome = done["outcome"].as_str().unwrap();
    assert!(
        outcome.starts_with("taken over after the claim of dead-replica expired: applied as revision 2"),
        "{outcome}"
    );
    let runs = run_audits(&app, id).await;
    assert_eq!(runs.len(), 1, "the takeover is audited once: {runs:?}");
    assert_eq!(runs[0]["outcome"], "ok");
    assert!(runs[0]["detail"].as_str().unwrap().contains("dead-replica"), "{:?}", runs[0]);
    assert_eq!(
        (&runs[0]["before"], &runs[0]["after"]),
        (&json!({"state": "running"}), &json!({"state": "applied"}))
    );
    let (_, _, audit) = app.call(Method::GET, "/api/v1/audit?service=checkout", None).await;
    let sets = audit
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["action"] == "flag.set" && r["via"] == "server")
        .count();
    assert_eq!(sets, 1, "applied once: {audit}");
    // The dead run cannot record an end over the one that took over.
    let store = &app.server.as_ref().unwrap().store;
    assert!(
        !store
            .finish_change(id, "dead-replica", levee_server::db::ScheduledState::Failed, "late", None)
            .await
            .unwrap()
    );
    assert_eq!(get_change(&app, id).await["state"], "applied");
    // Its revert was scheduled and runs.
    its_revert_is_pending_and_puts_the_flag_back(&app, id).await;
}

/// The newest scheduled change of checkout is the pending revert of change `id`; run at
/// 2 h + 1 s, it sets the flag back on.
async fn its_revert_is_pending_and_puts_the_flag_back(app: &TestApp, id: i64) {
    let (_, _, list) = app.call(Method::GET, &format!("{SCHED}?service=checkout"), None).await;
    assert_eq!(
        (list[0]["state"].as_str(), list[0]["reverts"].as_i64()),
        (Some("pending"), Some(id)),
        "{list}"
    );
    assert_eq!(run_due(app, at(2 * HOUR + 1000)).await, 1);
    assert_eq!(flag(app).await, json!(true));
}

#[tokio::test]
async fn a_change_left_running_by_a_crashed_replica_is_taken_over_after_its_lease_on_sqlite() {
    a_crashed_run_is_taken_over_after_its_lease(TestApp::spawn().await).await;
}

#[tokio::test]
async fn a_change_left_running_by_a_crashed_replica_is_taken_over_after_its_lease_on_postgres() {
    if let Some(app) = TestApp::spawn_on(Db::Postgres).await {
        a_crashed_run_is_taken_over_after_its_lease(app).await;
    }
}

async fn a_crashed_run_that_applied_is_not_applied_twice(app: TestApp) {
    app.seed().await;
    let c = schedule_flip(&app, false, at(HOUR), Some(at(2 * HOUR))).await;
    let id = c["id"].as_i64().unwrap();
    let t = at(HOUR + 1000);
    claim_and_die(&app, id, t).await;
    // The dead run had applied the flip (revision 2) before it died, without recording it.
    let (s, _, b) =
        app.call(Method::PATCH, FLAG, Some(json!({"value": false, "reason": "applied, then crashed"}))).await;
    assert_eq!(s, StatusCode::OK, "{b}");
    assert_eq!(run_due(&app, Timestamp::from_unix_ms(t.unix_ms() + LEASE_MS + 1000)).await, 1);
    let done = get_change(&app, id).await;
    assert_eq!(done["state"], "applied", "{done}");
    let outcome = done["outcome"].as_str().unwrap();
    assert!(
        outcome.contains(
            "already in place at revision 2 when the claim of dead-replica expired: not applied again"
        ),
        "{outcome}"
    );
    let (_, _, revs) =
        app.call(Method::GET, "/api/v1/environments/prod/services/checkout/revisions", None).await;
    assert_eq!(revs.as_array().unwrap().len(), 2, "no second revision: {revs}");
    assert_eq!(run_audits(&app, id).await.len(), 1, "audited once");
    // The revert the dead run never scheduled is scheduled now, and puts the flag back.
    its_revert_is_pending_and_puts_the_flag_back(&app, id).await;
}

#[tokio::test]
async fn a_change_a_crashed_replica_applied_is_recorded_not_applied_twice_on_sqlite() {
    a_crashed_run_that_applied_is_not_applied_twice(TestApp::spawn().await).await;
}

#[tokio::test]
async fn a_change_a_crashed_replica_applied_is_recorded_not_applied_twice_on_postgres() {
    if let Some(app) = TestApp::spawn_on(Db::Postgres).await {
        a_crashed_run_that_applied_is_not_applied_twice(app).await;
    }
}

#[tokio::test]
async fn with_two_replicas_exactly_one_takes_over_an_expired_claim() {
    let Some(url) = postgres_url().await else { return };
    let a = TestApp::spawn_with(Some(url.clone())).await;
    let b = TestApp::spawn_with(Some(url)).await;
    a.seed().await;
    let c = schedule_flip(&a, false, at(HOUR), None).await;
    let id = c["id"].as_i64().unwrap();
    let t = at(HOUR + 1000);
    claim_and_die(&a, id, t).await;
    let later = Timestamp::from_unix_ms(t.unix_ms() + LEASE_MS + 1000);
    let (ra, rb) = tokio::join!(run_due(&a, later), run_due(&b, later));
    assert_eq!(ra + rb, 1, "one replica takes the change over");
    let done = get_change(&b, id).await;
    assert_eq!((done["state"].as_str(), done["revision"].as_u64()), (Some("applied"), Some(2)), "{done}");
    assert_eq!(run_audits(&a, id).await.len(), 1, "audited once");
}

async fn a_claim_without_expiry_is_taken_over_at_once(app: TestApp) {
    app.seed().await;
    let c = schedule_flip(&app, false, at(HOUR), None).await;
    let id = c["id"].as_i64().unwrap();
    // As a replica left it before claims had a lease (migration 0014): running, no expiry.
    let store = &app.server.as_ref().unwrap().store;
    let res =
        sqlx::query("UPDATE scheduled_changes SET state = 'running', claimed_by = 'levee' WHERE id = $1")
            .bind(id)
            .execute(store.pool())
            .await
            .unwrap();
    assert_eq!(res.rows_affected(), 1);
    // A claim without expiry is taken over at once, whatever the time: the server's own
    // sweeper (every second, on the real clock) may be the one that takes it, so either
    // that run or this one applies it, once.
    let ran = run_due(&app, at(HOUR + 1000)).await;
    assert!(ran <= 1, "{ran}");
    let mut done = get_change(&app, id).await;
    for _ in 0..200 {
        if done["state"] != "running" {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        done = get_change(&app, id).await;
    }
    assert_eq!(done["state"], "applied", "{done}");
    assert_eq!(run_audits(&app, id).await.len(), 1, "applied once");
    assert!(
        done["outcome"].as_str().unwrap().starts_with("taken over after the claim of levee expired"),
        "{done}"
    );
    assert_eq!(flag(&app).await, json!(false));
}

#[tokio::test]
async fn a_change_claimed_before_leases_existed_is_taken_over_on_sqlite() {
    a_claim_without_expiry_is_taken_over_at_once(TestApp::spawn().await).await;
}

#[tokio::test]
async fn a_change_claimed_before_leases_existed_is_taken_over_on_postgres() {
    if let Some(app) = TestApp::spawn_on(Db::Postgres).await {
        a_claim_without_expiry_is_taken_over_at_once(app).await;
    }
}

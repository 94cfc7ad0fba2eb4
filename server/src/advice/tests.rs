use serde_json::json;

use super::*;

fn policy(v: serde_json::Value) -> Policy {
    levee_agent::policy::decode_policy(v.to_string().as_bytes()).unwrap()
}

fn agent(connected: bool, status: serde_json::Value) -> AgentRow {
    AgentRow {
        environment: "prod".into(),
        service: "checkout".into(),
        instance_id: "i".into(),
        agent_version: "0".into(),
        connected,
        connected_at: 0,
        last_seen: 0,
        applied_revision: 1,
        applied_hash: String::new(),
        source: String::new(),
        status: Some(status),
    }
}

fn codes(lints: &[Lint], code: &str) -> Vec<String> {
    lints.iter().filter(|l| l.code == code).map(|l| l.path.clone()).collect()
}

const NOW: Timestamp = Timestamp::from_unix_ms(1_800_000_000_000);

fn env(entries: &[(&str, &Policy)]) -> BTreeMap<String, Policy> {
    entries.iter().map(|(n, p)| (n.to_string(), (*p).clone())).collect()
}

#[test]
fn retries_on_two_links_of_a_chain_are_flagged_at_both_ends() {
    let checkout = policy(json!({"dependencies": {
        "payments": {"retry": {"max_attempts": 3}},
        "ads": {"retry": {"max_attempts": 3}}}}));
    let payments = policy(json!({"dependencies": {"bank": {"retry": {"max_attempts": 2}}}}));
    let environment = env(&[("checkout", &checkout), ("payments", &payments)]);

    let outer = advise("checkout", &checkout, &environment, &[], NOW);
    assert_eq!(codes(&outer, "retries_on_several_layers"), ["dependencies.payments.retry"]);
    let msg = &outer.iter().find(|l| l.code == "retries_on_several_layers").unwrap().message;
    assert!(msg.contains("bank (2 attempts)") && msg.contains("up to 6 calls"), "{msg}");

    let inner = advise("payments", &payments, &environment, &[], NOW);
    assert_eq!(codes(&inner, "retries_on_several_layers"), ["dependencies.bank.retry"]);
    let msg = &inner.iter().find(|l| l.code == "retries_on_several_layers").unwrap().message;
    assert!(msg.contains("checkout (3 attempts)"), "{msg}");

    // One layer only: the inner service stops retrying, nothing to say on either side.
    let payments = policy(json!({"dependencies": {"bank": {"retry": {"max_attempts": 1}}}}));
    let environment = env(&[("checkout", &checkout), ("payments", &payments)]);
    assert!(
        codes(&advise("checkout", &checkout, &environment, &[], NOW), "retries_on_several_layers").is_empty()
    );
    assert!(
        codes(&advise("payments", &payments, &environment, &[], NOW), "retries_on_several_layers").is_empty()
    );
    // An operation's own retry counts as retrying.
    let payments = policy(json!({"dependencies": {"bank": {"retry": {"max_attempts": 1},
        "operations": {"POST /charge": {"retry": {"max_attempts": 2}}}}}}));
    let environment = env(&[("checkout", &checkout), ("payments", &payments)]);
    assert_eq!(
        codes(&advise("checkout", &checkout, &environment, &[], NOW), "retries_on_several_layers"),
        ["dependencies.payments.retry"]
    );
}

#[test]
fn a_dependency_that_is_not_a_service_of_the_environment_is_no_chain() {
    let checkout = policy(json!({"dependencies": {"checkout": {"retry": {"max_attempts": 3}},
        "stripe": {"retry": {"max_attempts": 3}}}}));
    let environment = env(&[("checkout", &checkout)]);
    assert!(
        codes(&advise("checkout", &checkout, &environment, &[], NOW), "retries_on_several_layers").is_empty()
    );
}

fn bulkhead_report(suggested: f64, in_use: u32) -> serde_json::Value {
    json!({"bulkheads": [{"dependency": "pricing", "operation": "", "max_concurrent": 25, "in_use": in_use,
                          "suggested_size": suggested}]})
}

#[test]
fn bulkheads_far_from_littles_law_are_flagged_both_ways() {
    let sized = |n: u32| policy(json!({"dependencies": {"pricing": {"bulkhead": {"max_concurrent": n}}}}));
    let agents = [agent(true, bulkhead_report(8.0, 3)), agent(true, bulkhead_report(10.0, 4))];
    let lint_of = |p: &Policy| {
        codes(&advise("checkout", p, &BTreeMap::new(), &agents, NOW), "bulkhead_far_from_littles_law")
    };
    // The busiest instance suggests 10: 10..=40 is fine.
    assert!(lint_of(&sized(10)).is_empty());
    assert!(lint_of(&sized(40)).is_empty());
    assert_eq!(lint_of(&sized(9)), ["dependencies.pricing.bulkhead.max_concurrent"]);
    assert_eq!(lint_of(&sized(41)), ["dependencies.pricing.bulkhead.max_concurrent"]);
    let msg = advise("checkout", &sized(200), &BTreeMap::new(), &agents, NOW)
        .into_iter()
        .find(|l| l.code == "bulkhead_far_from_littles_law")
        .unwrap()
        .message;
    assert!(
        msg.contains("max_concurrent is 200") && msg.contains("suggests 10") && msg.contains("2 connected"),
        "{msg}"
    );

    let sizing = bulkheads(&sized(25), &agents);
    assert_eq!(
        sizing,
        [BulkheadSizing {
            dependency: "pricing".into(),
            operation: None,
            max_concurrent: 25,
            suggested_size: Some(10),
            in_use: 7,
            instances: 2
        }]
    );
}

#[test]
fn no_measurement_and_disconnected_or_garbled_reports_give_no_bulkhead_advice() {
    let p = policy(json!({"dependencies": {"pricing": {"bulkhead": {"max_concurrent": 500}}}}));
    for agents in [
        vec![],
        vec![agent(true, bulkhead_report(0.0, 0))],
        vec![agent(false, bulkhead_report(3.0, 0))],
        vec![agent(true, json!({"bulkheads": "lots"}))],
        vec![agent(true, bulkhead_report(f64::NAN, 0))],
    ] {
        let lints = advise("checkout", &p, &BTreeMap::new(), &agents, NOW);
        assert!(codes(&lints, "bulkhead_far_from_littles_law").is_empty(), "{agents:?}");
        assert_eq!(bulkheads(&p, &agents)[0].suggested_size, None, "{agents:?}");
    }
}

#[test]
fn an_operation_with_its_own_bulkhead_is_sized_on_its_own() {
    let p = policy(json!({"dependencies": {"pricing": {"bulkhead": {"max_concurrent": 10},
        "operations": {"GET /price": {"bulkhead": {"max_concurrent": 100}}}}}}));
    let agents = [agent(
        true,
        json!({"bulkheads": [
            {"dependency": "pricing", "operation": "", "in_use": 1, "suggested_size": 10.0},
            {"dependency": "pricing", "operation": "GET /price", "in_use": 1, "suggested_size": 5.0}]}),
    )];
    let lints = advise("checkout", &p, &BTreeMap::new(), &agents, NOW);
    assert_eq!(
        codes(&lints, "bulkhead_far_from_littles_law"),
        ["dependencies.pricing.operations.GET /price.bulkhead.max_concurrent"]
    );
    let sizing = bulkheads(&p, &agents);
    assert_eq!(sizing.len(), 2);
    assert_eq!((sizing[1].operation.as_deref(), sizing[1].suggested_size), (Some("GET /price"), Some(5)));
}

#[test]
fn readiness_on_a_dependency_the_policy_can_do_without_is_flagged() {
    let p = policy(json!({
        "dependencies": {
            "pricing": {"criticality": "critical"},
            "recs": {"criticality": "critical", "fallback": "generic"},
            "ads": {"criticality": "critical", "enabled_flag": "ads.enabled"},
            "reviews": {"criticality": "critical"},
            "search": {"criticality": "non_critical", "fallback": "empty_marked"}},
        "degradation_matrix": [
            {"feature": "Reviews", "dependencies": ["reviews"], "on_failure": "empty_marked"},
            {"feature": "Checkout", "dependencies": ["pricing"], "on_failure": "feature_error"}],
        "compiled_in_flags": ["ads.enabled"]}));
    let lints = advise("checkout", &p, &BTreeMap::new(), &[], NOW);
    assert_eq!(
        codes(&lints, "readiness_on_non_critical"),
        ["dependencies.ads.criticality", "dependencies.recs.criticality", "dependencies.reviews.criticality"]
    );
    let by_path = |path: &str| lints.iter().find(|l| l.path == path).unwrap().message.clone();
    assert!(by_path("dependencies.recs.criticality").contains("\"GENERIC\""));
    assert!(by_path("dependencies.ads.criticality").contains("kill switch (ads.enabled)"));
    assert!(by_path("dependencies.reviews.criticality").contains("(Reviews)"));
}

#[test]
fn a_feature_on_its_fallback_longer_than_alert_after_is_flagged() {
    let p = policy(json!({
        "dependencies": {"recs": {"criticality": "non_critical", "fallback": "generic"}},
        "degradation_matrix": [{"feature": "Recommendations", "dependencies": ["recs"], "on_failure": "generic",
                                "alert_after": "30m", "owner": "growth team"}]}));
    let since = |ago: Duration| Timestamp::from_unix_ms(NOW.unix_ms() - ago.as_millis() as i64);
    let report = |level: &str, ago: Option<Duration>| json!({"features": [{"feature": "Recommendations", "level": level, "degraded_since": ago.map(since)}]});
    let lint_of = |agents: &[AgentRow]| {
        codes(&advise("checkout", &p, &BTreeMap::new(), agents, NOW), "fallback_longer_than_alert")
    };
    let min = |m: u64| Duration::from_secs(60 * m);
    assert!(lint_of(&[agent(true, report("GENERIC", Some(min(29))))]).is_empty());
    assert!(lint_of(&[agent(true, report("FRESH", None))]).is_empty());
    assert!(
        lint_of(&[agent(false, report("GENERIC", Some(min(120))))]).is_empty(),
        "an old report of a gone agent"
    );
    let agents =
        [agent(true, report("GENERIC", Some(min(31)))), agent(true, report("GENERIC", Some(min(5))))];
    assert_eq!(lint_of(&agents), ["degradation_matrix[0].alert_after"]);
    let msg = advise("checkout", &p, &BTreeMap::new(), &agents, NOW)
        .into_iter()
        .find(|l| l.code == "fallback_longer_than_alert")
        .unwrap()
        .message;
    assert!(
        msg.contains("(GENERIC)")
            && msg.contains("for 31m")
            && msg.contains("1 of 2")
            && msg.contains("growth team"),
        "{msg}"
    );
}

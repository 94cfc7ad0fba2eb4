//! An emergency profile reaches a real agent, and its expiry is enforced by the agent
//! itself: with the server gone, the profile's kill switch and operator levers (shedding,
//! fixed inbound limit) still end at the expiry.

use std::time::Duration;

use levee_agent::admission::AdmissionRequest;
use levee_agent::policy::{Criticality, Timestamp};
use reqwest::Method;
use serde_json::json;

use crate::helpers::TestApp;
use crate::support::{Api, agent, wait_until};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_applied_profile_reaches_the_agent_and_expires_there_with_the_server_down() {
    let mut app = TestApp::spawn().await;
    let api = Api::login(&app.base).await;
    api.seed().await;
    api.send(
        Method::PUT,
        "/environments/prod/profiles/recs-down",
        Some(json!({"services": {"checkout": {"flags": {"recommendations.enabled": false},
                                              "shed_sheddable_percent": 100, "inbound_limit": 3}},
                   "reason": "e2e"})),
    )
    .await;
    let token = api.agent_token("prod", &["checkout"]).await;
    let cache = tempfile::tempdir().unwrap();
    let agent = agent(&app.grpc, &token, cache.path());
    agent.wait_for_initial_sync(Duration::from_secs(10)).await.expect("initial sync");
    let recommendations = agent.dependency("recommendations");
    assert!(recommendations.is_enabled());
    let admission = agent.admission();
    let policy_limit = agent.config().policy.inbound.limit.initial_limit;
    let sheddable = AdmissionRequest::new("GET /x").criticality(Criticality::Sheddable);
    let levers_on = || admission.status().limit == 3 && admission.try_admit(&sheddable).is_err();
    let levers_off = || admission.status().limit == policy_limit && admission.try_admit(&sheddable).is_ok();
    assert!(levers_off());

    let ttl = Duration::from_secs(3);
    let until = Timestamp::from_unix_ms(Timestamp::now().unix_ms() + ttl.as_millis() as i64);
    let a = api
        .send(
            Method::POST,
            "/environments/prod/profiles/recs-down/apply",
            Some(json!({"expires_at": until, "reason": "e2e: game day"})),
        )
        .await;
    assert_eq!(a["services"], json!(["checkout"]), "{a}");
    wait_until("the agent to apply the profile", Duration::from_secs(2), || {
        !recommendations.is_enabled() && levers_on()
    })
    .await;

    // The server goes away for good; only the agent can end the profile now.
    app.server.take().unwrap().shutdown().await;
    wait_until("the agent to end the profile at its expiry", ttl + Duration::from_secs(5), || {
        recommendations.is_enabled() && levers_off()
    })
    .await;
    let ended = Timestamp::now().unix_ms();
    assert!(ended >= until.unix_ms() - 50, "ended {} ms before the expiry", until.unix_ms() - ended);
    agent.shutdown().await;
}

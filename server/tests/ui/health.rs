//! The service page's health section and its alarms: what a real agent's calls and
//! requests did reaches the server in its status reports, and the page shows it per
//! dependency and route — escaped, since the names come from the agent — with an alarm (and
//! the dependency's levers) when calls fail and when admission refuses requests.

use std::time::Duration;

use levee_agent::AdmissionRequest;
use levee_agent::policy::Criticality;
use reqwest::{Method, StatusCode};
use serde_json::json;

use crate::helpers::TestApp;

const SHOP: &str = "/ui/environments/prod/services/shop";

#[tokio::test]
async fn failing_calls_and_refused_requests_show_on_the_service_page_with_alarms() {
    let app = TestApp::spawn().await;
    app.seed().await;
    let (s, _, b) = app
        .api(
            Method::POST,
            "/environments/prod/services",
            Some(json!({"name": "shop", "reason": "test", "policy": {"inbound": {
                "limit": {"algorithm": "fixed", "initial_limit": 1},
                "queue": {"max_len": 0}}}})),
        )
        .await;
    assert_eq!(s, StatusCode::CREATED, "{b}");
    let cache = tempfile::tempdir().unwrap();
    let agent = app.reporting_agent("shop", cache.path()).await;

    // 30 calls to db, 10 of them failing (no retries: a POST).
    let db = agent.dependency("db");
    for i in 0..30 {
        let _ = db
            .call("POST /rows", || async move {
                if i % 3 == 0 { Err(std::io::Error::other("down")) } else { Ok(()) }
            })
            .await;
    }
    // A route whose name is markup: 24 requests refused while one holds the only slot.
    let admission = agent.admission();
    let hostile = AdmissionRequest::new("GET /<b>x</b>").criticality(Criticality::Critical);
    let held = admission.try_admit(&hostile).expect("the first takes the slot");
    for _ in 0..24 {
        assert!(admission.try_admit(&hostile).is_err(), "the limit is 1");
    }
    drop(held);

    let mut b = app.logged_in("admin").await;
    let start = tokio::time::Instant::now();
    let page = loop {
        let page = b.get(SHOP).await;
        assert_eq!(page.status, StatusCode::OK);
        if page.body.contains("admission refused")
            && page.body.contains("failed or timed out in the last minute")
        {
            break page;
        }
        assert!(start.elapsed() < Duration::from_secs(15), "no health on the page: {}", page.body);
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let body = &page.body;
    // The alarms: db fails a third of its calls (bad), with the dependency's levers; the
    // route's requests were refused by admission.
    assert!(
        body.contains(
            "dependency db: 33.3% of 30 calls failed or timed out in the last minute (10 failed, 0 timed out)"
        ),
        "{body}"
    );
    assert!(body.contains("admission refused 96% of 25 requests in the last minute"), "{body}");
    assert!(body.contains("href=\"/ui/environments/prod/services/shop#health\""), "{body}");
    // The section, one row each.
    let section = &body[body.find("<section id=\"health\"").expect("the health section")..];
    let section = &section[..section.find("</section>").unwrap()];
    assert!(section.contains("<td><strong>db</strong></td><td class=\"num\">30</td>"), "{section}");
    assert!(section.contains("<td class=\"num bad\">33.3%</td><td class=\"num\">10 / 0</td>"), "{section}");
    // The agent's route name is text on the page, never markup.
    assert!(section.contains("<strong>GET /&#60;b&#62;x&#60;/b&#62;</strong>"), "{section}");
    assert!(!body.contains("<b>x</b>"), "{body}");
    agent.shutdown().await;
}

//! Inbound admission on the service page: a real agent in shadow mode counts what it would
//! have shed; the counts reach the server in its status report and the page shows them by
//! route, criticality and reason — escaped, since the route names come from the agent.

use std::time::Duration;

use levee_agent::AdmissionRequest;
use levee_agent::policy::Criticality;
use reqwest::{Method, StatusCode};
use serde_json::json;

use crate::helpers::TestApp;

const SHOP: &str = "/ui/environments/prod/services/shop";

#[tokio::test]
async fn shadow_mode_counts_reach_the_service_page() {
    let app = TestApp::spawn().await;
    app.seed().await;
    let (s, _, b) = app
        .api(
            Method::POST,
            "/environments/prod/services",
            Some(json!({"name": "shop", "reason": "test", "policy": {"inbound": {
                "mode": "shadow",
                "limit": {"algorithm": "fixed", "initial_limit": 1},
                "queue": {"max_len": 0}}}})),
        )
        .await;
    assert_eq!(s, StatusCode::CREATED, "{b}");
    let cache = tempfile::tempdir().unwrap();
    let agent = app.reporting_agent("shop", cache.path()).await;

    // Limit 1, no queue, shadow: with one request holding the slot, each further one would
    // have been shed (reason `limit`) and is admitted anyway.
    let admission = agent.admission();
    let quote = AdmissionRequest::new("GET /quote/{sku}").criticality(Criticality::Sheddable);
    let hostile = AdmissionRequest::new("GET /<b>x</b>").criticality(Criticality::Critical);
    let held = admission.try_admit(&quote).expect("the first takes the slot");
    for _ in 0..3 {
        drop(admission.try_admit(&quote).expect("shadow mode rejects nothing"));
    }
    drop(admission.try_admit(&hostile).expect("shadow mode rejects nothing"));

    let mut b = app.logged_in("admin").await;
    let start = tokio::time::Instant::now();
    let page = loop {
        let page = b.get(SHOP).await;
        assert_eq!(page.status, StatusCode::OK);
        if page.body.contains("would have shed 4 request(s)") {
            break page;
        }
        assert!(start.elapsed() < Duration::from_secs(15), "no shadow counts on the page: {}", page.body);
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let body = &page.body;
    assert!(body.contains("Mode <strong class=\"warn\">shadow</strong>"), "{body}");
    assert!(body.contains("fixed at 1"), "{body}");
    assert!(
        body.contains("<td><code>GET /quote/{sku}</code></td>\n    <td>SHEDDABLE</td>\n    <td>limit</td>\n    <td class=\"num\">0</td>\n    <td class=\"num\">3</td>"),
        "{body}"
    );
    // The agent's route name is text on the page, never markup.
    assert!(body.contains("GET /&#60;b&#62;x&#60;/b&#62;"), "{body}");
    assert!(!body.contains("<b>x</b>"), "{body}");
    // The instance's limit and load.
    assert!(body.contains("<td class=\"num\">1</td>"), "{body}");
    drop(held);
    agent.shutdown().await;
}

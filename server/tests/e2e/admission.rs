//! The example service's inbound admission: its checkout route goes through the admission
//! layer under its route template, CRITICAL by the compiled-in policy, so an operator
//! shedding all SHEDDABLE traffic sheds a caller that lowered itself and serves the rest.

use levee_agent::Agent;
use levee_agent::admission::Reason;
use levee_agent::policy::Criticality;

use crate::support::{page, start_example};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_example_admits_checkout_as_a_critical_route() {
    let mut defaults = crate::checkout_app::safe_defaults();
    defaults.policy.inbound.shed_sheddable_percent = 100.0;
    let cache = tempfile::tempdir().unwrap();
    // No control plane (a closed loopback port): the compiled-in policy is enforced.
    let agent = Agent::builder("http://127.0.0.1:9", "unused", "prod", "checkout")
        .cache_dir(cache.path())
        .defaults(defaults)
        .build()
        .expect("agent builds");
    let (url, _) = start_example(&agent).await;
    // The route's own criticality (CRITICAL) is never shed by the operator lever.
    page(&url).await;
    let res = reqwest::Client::new()
        .get(format!("{url}/checkout/bob"))
        .header("levee-criticality", "SHEDDABLE")
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 503, "a SHEDDABLE caller is shed");
    assert!(res.headers().contains_key("retry-after"));
    let status = agent.admission().status();
    let route =
        status.routes.iter().find(|r| r.route == "GET /checkout/{user}").expect("named by its template");
    assert_eq!(route.shed.len(), 1, "{route:?}");
    assert_eq!(
        (route.shed[0].criticality, route.shed[0].reason, route.shed[0].count),
        (Criticality::Sheddable, Reason::Operator, 1)
    );
    agent.shutdown().await;
}

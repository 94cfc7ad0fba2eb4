//! Inbound admission on real servers over loopback (real time; handlers held on a gate
//! the test opens, so nothing depends on timing): IN-1 (probes and CRITICAL_PLUS are not
//! traffic), IN-2 (shed from the bottom), a SHEDDABLE flood that cannot starve CRITICAL
//! requests, and a pushed policy changing the limit live.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use axum::routing::get;
use levee_agent::Agent;
use levee_agent::admission::Reason;
use levee_agent::policy::decode_config;
use tokio::sync::{Semaphore, mpsc};
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_client::HealthClient;

use crate::support::*;

/// An agent on compiled-in defaults with `inbound` as its admission policy.
fn agent_with(inbound: &str) -> Agent {
    let body = format!(r#"{{"policy": {{"inbound": {inbound}}}}}"#);
    let cfg = decode_config(body.as_bytes()).expect("valid test policy");
    Agent::builder("http://127.0.0.1:9", "no-token", "test", "admission").defaults(cfg).build().unwrap()
}

/// A shop behind `agent.admission_layer()`: `/work`, `/cart` and `/batch` report that they
/// started (on `entered`) and then wait for the gate; `/flood` and `/crit` work 5 ms;
/// `/vip` and the probes answer at once.
struct Shop {
    addr: SocketAddr,
    entered: mpsc::UnboundedReceiver<&'static str>,
    gate: Arc<Semaphore>,
}

async fn shop(agent: &Agent) -> Shop {
    let (tx, entered) = mpsc::unbounded_channel();
    let gate = Arc::new(Semaphore::new(0));
    let gated = |name: &'static str| {
        let (tx, gate) = (tx.clone(), gate.clone());
        get(move || {
            let (tx, gate) = (tx.clone(), gate.clone());
            async move {
                let _ = tx.send(name);
                gate.acquire().await.unwrap().forget();
                name
            }
        })
    };
    let app = axum::Router::new()
        .route("/work", gated("work"))
        .route("/cart", gated("cart"))
        .route("/batch", gated("batch"))
        .route("/vip", get(|| async { "vip" }))
        .route(
            "/flood",
            get(|| async {
                tokio::time::sleep(Duration::from_millis(5)).await;
                "flood"
            }),
        )
        .route(
            "/crit",
            get(|| async {
                tokio::time::sleep(Duration::from_millis(5)).await;
                "crit"
            }),
        )
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(|| async { "ok" }))
        .route("/metrics", get(|| async { "# metrics" }))
        .layer(agent.admission_layer());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    Shop { addr, entered, gate }
}

fn client() -> reqwest::Client {
    reqwest::Client::builder().pool_max_idle_per_host(0).build().unwrap()
}

async fn get_status(
    c: &reqwest::Client,
    addr: SocketAddr,
    path: &str,
    criticality: Option<&str>,
) -> reqwest::Response {
    let mut r = c.get(format!("http://{addr}{path}"));
    if let Some(v) = criticality {
        r = r.header("levee-criticality", v);
    }
    r.send().await.unwrap()
}

/// [`get_status`] on a clone of the client, for `tokio::spawn`.
fn spawned(
    c: &reqwest::Client,
    addr: SocketAddr,
    path: &'static str,
    criticality: Option<&'static str>,
) -> impl std::future::Future<Output = reqwest::Response> + Send + 'static {
    let c = c.clone();
    async move { get_status(&c, addr, path, criticality).await }
}

/// Waits until the admission status satisfies `f` (a condition, not a fixed sleep).
async fn until(agent: &Agent, what: &str, f: impl Fn(&levee_agent::admission::AdmissionStatus) -> bool) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !f(&agent.admission().status()) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}: {:?}",
            agent.admission().status()
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

/// IN-1: while the service sheds, health, readiness and metrics endpoints — HTTP and the
/// gRPC health service on the same engine — and CRITICAL_PLUS requests are still served.
#[tokio::test]
async fn in_1_probes_and_critical_plus_are_never_shed() {
    let agent = agent_with(
        r#"{"limit": {"algorithm": "fixed", "initial_limit": 2}, "queue": {"max_len": 0},
            "routes": {"GET /work": {"criticality": "SHEDDABLE"}, "GET /vip": {"criticality": "CRITICAL_PLUS"}}}"#,
    );
    let mut s = shop(&agent).await;
    let c = client();
    let busy: Vec<_> = (0..2).map(|_| tokio::spawn(spawned(&c, s.addr, "/work", None))).collect();
    for _ in 0..2 {
        assert_eq!(s.entered.recv().await, Some("work"));
    }
    // Saturated: ordinary traffic is refused, cheaply and explicitly.
    let res = get_status(&c, s.addr, "/work", None).await;
    assert_eq!(res.status(), 503);
    assert_eq!(res.headers()["retry-after"], "1");
    assert_eq!(res.headers()["content-type"], "application/problem+json");
    // A caller cannot promote itself past the cap (CRITICAL by default).
    assert_eq!(get_status(&c, s.addr, "/work", Some("CRITICAL_PLUS")).await.status(), 503);
    // Probes and CRITICAL_PLUS are served, many at once.
    let mut probes = Vec::new();
    for (path, claim) in
        [("/healthz", Some("SHEDDABLE")), ("/readyz", None), ("/metrics", None), ("/vip", None)]
    {
        for _ in 0..5 {
            probes.push(tokio::spawn(spawned(&c, s.addr, path, claim)));
        }
    }
    for p in probes {
        assert_eq!(p.await.unwrap().status(), 200);
    }
    // The gRPC health service behind the same engine.
    let (reporter, health) = tonic_health::server::health_reporter();
    reporter.set_service_status("", tonic_health::ServingStatus::Serving).await;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let grpc_addr = listener.local_addr().unwrap();
    let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener);
    let layer = agent.admission_layer();
    tokio::spawn(async move {
        tonic::transport::Server::builder()
            .layer(layer)
            .add_service(health)
            .serve_with_incoming(incoming)
            .await
    });
    let channel = tonic::transport::Channel::from_shared(format!("http://{grpc_addr}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut hc = HealthClient::new(channel);
    let answer = hc.check(HealthCheckRequest { service: String::new() }).await.unwrap();
    assert_eq!(
        answer.into_inner().status,
        tonic_health::pb::health_check_response::ServingStatus::Serving as i32
    );
    let st = agent.admission().status();
    assert_eq!(st.in_flight, 2, "probes took no slot; CRITICAL_PLUS ones finished");
    assert_eq!(st.shed_total(Reason::Limit, false), 2);
    s.gate.add_permits(2);
    for b in busy {
        assert_eq!(b.await.unwrap().status(), 200);
    }
    until(&agent, "the slots to be free", |st| st.in_flight == 0).await;
}

/// IN-2: at the limit with a full queue of SHEDDABLE requests, arriving CRITICAL requests
/// displace queued SHEDDABLE ones and are served first; SHEDDABLE absorbs the shedding.
#[tokio::test]
async fn in_2_sheddable_absorbs_the_shedding_and_critical_displaces_it() {
    // CoDel timeouts far above the test's duration: this is about order, not time.
    let agent = agent_with(
        r#"{"limit": {"algorithm": "fixed", "initial_limit": 2},
            "queue": {"max_len": 4, "codel_target": "5s", "codel_interval": "10s"},
            "routes": {"GET /batch": {"criticality": "SHEDDABLE"}, "GET /cart": {"criticality": "CRITICAL"}}}"#,
    );
    let mut s = shop(&agent).await;
    let c = client();
    let mut batch = Vec::new();
    for _ in 0..2 {
        batch.push(tokio::spawn(spawned(&c, s.addr, "/batch", None)));
    }
    for _ in 0..2 {
        assert_eq!(s.entered.recv().await, Some("batch"));
    }
    let mut queued = Vec::new();
    for _ in 0..4 {
        queued.push(tokio::spawn(spawned(&c, s.addr, "/batch", None)));
    }
    until(&agent, "4 queued", |st| st.queued == 4).await;
    let mut cart = Vec::new();
    for _ in 0..2 {
        cart.push(tokio::spawn(spawned(&c, s.addr, "/cart", None)));
    }
    until(&agent, "2 displaced", |st| st.shed_total(Reason::Displaced, false) == 2).await;
    // Another SHEDDABLE finds nothing lower to push out.
    assert_eq!(get_status(&c, s.addr, "/batch", None).await.status(), 503);
    assert_eq!(agent.admission().status().shed_total(Reason::QueueFull, false), 1);
    // Open the gate one request at a time: both CRITICAL requests start before any queued
    // SHEDDABLE one.
    let mut order = Vec::new();
    for _ in 0..4 {
        s.gate.add_permits(1);
        order.push(s.entered.recv().await.unwrap());
    }
    assert_eq!(order, ["cart", "cart", "batch", "batch"]);
    s.gate.add_permits(4);
    for r in cart {
        assert_eq!(r.await.unwrap().status(), 200);
    }
    let mut statuses: Vec<u16> = Vec::new();
    for r in batch.into_iter().chain(queued) {
        statuses.push(r.await.unwrap().status().as_u16());
    }
    statuses.sort_unstable();
    assert_eq!(statuses, [200, 200, 200, 200, 503, 503], "2 in flight + 2 queued served; 2 displaced");
}

/// A flood of SHEDDABLE traffic (32 clients in a loop on a 5 ms route, far past the
/// limit and the queue) cannot starve CRITICAL requests: every one of them is served.
#[tokio::test]
async fn a_sheddable_flood_cannot_starve_critical_requests() {
    let agent = agent_with(
        r#"{"limit": {"algorithm": "fixed", "initial_limit": 4},
            "queue": {"max_len": 8, "codel_target": "50ms", "codel_interval": "2s"},
            "routes": {"GET /flood": {"criticality": "SHEDDABLE"}, "GET /crit": {"criticality": "CRITICAL"}}}"#,
    );
    let s = shop(&agent).await;
    let stop = Arc::new(AtomicU32::new(0));
    let (ok, shed) = (Arc::new(AtomicU32::new(0)), Arc::new(AtomicU32::new(0)));
    let mut flood = Vec::new();
    for _ in 0..32 {
        let (c, stop, ok, shed, addr) = (client(), stop.clone(), ok.clone(), shed.clone(), s.addr);
        flood.push(tokio::spawn(async move {
            while stop.load(Ordering::Relaxed) == 0 {
                match get_status(&c, addr, "/flood", None).await.status().as_u16() {
                    200 => ok.fetch_add(1, Ordering::Relaxed),
                    _ => shed.fetch_add(1, Ordering::Relaxed),
                };
            }
        }));
    }
    until(&agent, "the flood to be shed", |st| st.shed_total(Reason::QueueFull, false) > 100).await;
    let c = client();
    for i in 0..50 {
        let res = get_status(&c, s.addr, "/crit", None).await;
        assert_eq!(res.status(), 200, "CRITICAL request {i} was refused");
    }
    stop.store(1, Ordering::Relaxed);
    for f in flood {
        f.await.unwrap();
    }
    assert!(shed.load(Ordering::Relaxed) > 100 && ok.load(Ordering::Relaxed) > 0);
    let st = agent.admission().status();
    let crit = st.routes.iter().find(|r| r.route == "GET /crit").unwrap();
    assert!(crit.shed.is_empty(), "{:?}", crit.shed);
}

/// A pushed policy changes the limit live: requests in flight keep running, the new
/// limit applies to the next ones.
#[tokio::test(start_paused = true)]
async fn a_pushed_policy_resizes_admission_without_dropping_work_in_flight() {
    init_tracing();
    let dir = tempfile::tempdir().unwrap();
    let mut server = TestServer::start().await;
    let a = agent(&server.url(), dir.path());
    let admission = a.admission();
    let (_, _, conn) = server.connected().await;
    let policy = |limit: u32| {
        format!(
            r#"{{"policy": {{"inbound": {{"limit": {{"algorithm": "fixed", "initial_limit": {limit}}}, "queue": {{"max_len": 0}}}}}}}}"#
        )
    };
    conn.snapshot(1, &policy(3)).await;
    server.ack().await;
    let req = levee_agent::AdmissionRequest::new("GET /x");
    let held: Vec<_> = (0..3).map(|_| admission.try_admit(&req).unwrap()).collect();
    assert_eq!(admission.try_admit(&req).unwrap_err().reason(), Reason::Limit);
    conn.snapshot(2, &policy(1)).await;
    server.ack().await;
    let st = admission.status();
    assert_eq!((st.limit, st.in_flight), (1, 3), "work in flight kept");
    drop(held);
    let one = admission.try_admit(&req).unwrap();
    assert_eq!(admission.try_admit(&req).unwrap_err().reason(), Reason::Limit);
    drop(one);
    a.shutdown().await;
}

//! The outbound policy over xDS (docs/xds.md) with the real server on loopback: every
//! resource it serves decodes with Envoy's API types (the `envoy-types` crate) and says what
//! the policy says; a change is pushed as a new version on the open stream; a NACKed
//! version is not sent again; a token of another service, another environment or another
//! kind is refused.

use std::collections::BTreeMap;
use std::time::Duration;

use envoy_types::pb::envoy::config::cluster::v3::{Cluster, cluster};
use envoy_types::pb::envoy::config::core::v3::{Node, address, socket_address};
use envoy_types::pb::envoy::config::endpoint::v3::{ClusterLoadAssignment, lb_endpoint};
use envoy_types::pb::envoy::config::listener::v3::Listener;
use envoy_types::pb::envoy::config::route::v3::{RouteConfiguration, route, route_match};
use envoy_types::pb::envoy::extensions::filters::http::fault::v3::{HttpFault, fault_abort};
use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::{
    HttpConnectionManager, http_connection_manager, http_filter,
};
use envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient;
use envoy_types::pb::envoy::service::discovery::v3::{DiscoveryRequest, DiscoveryResponse};
use envoy_types::pb::google::protobuf::{Any, Duration as PbDuration};
use envoy_types::pb::google::rpc::Status as RpcStatus;
use levee_server::xds::resources::{CLUSTER, ENDPOINT, FAULT_FILTER, LISTENER, ROUTE};
use prost::{Message, Name};
use reqwest::{Method, StatusCode};
use serde_json::json;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::Streaming;

use crate::helpers::TestApp;

/// How long a pushed response may take: a bound on the wait, not a measurement.
const PATIENCE: Duration = Duration::from_secs(10);

/// An ADS stream as a client holds it.
struct Ads {
    tx: mpsc::Sender<DiscoveryRequest>,
    rx: Streaming<DiscoveryResponse>,
}

impl Ads {
    /// Opens a stream whose first request (the one that names the node) asks for every
    /// listener.
    async fn open(grpc: &str, token: Option<&str>, node_id: &str) -> Result<Ads, tonic::Status> {
        let mut client = AggregatedDiscoveryServiceClient::connect(grpc.to_string()).await.unwrap();
        let (tx, rx) = mpsc::channel(16);
        let node = Node { id: node_id.to_string(), cluster: "checkout".into(), ..Default::default() };
        let first = DiscoveryRequest { node: Some(node), type_url: LISTENER.into(), ..Default::default() };
        tx.send(first).await.unwrap();
        let mut req = tonic::Request::new(ReceiverStream::new(rx));
        if let Some(t) = token {
            req.metadata_mut().insert("authorization", format!("Bearer {t}").parse().unwrap());
        }
        let rx = client.stream_aggregated_resources(req).await?.into_inner();
        Ok(Ads { tx, rx })
    }

    async fn request(&mut self, type_url: &str, names: &[&str], version: &str, nonce: &str) {
        self.send(DiscoveryRequest {
            version_info: version.into(),
            resource_names: names.iter().map(|n| n.to_string()).collect(),
            type_url: type_url.into(),
            response_nonce: nonce.into(),
            ..Default::default()
        })
        .await;
    }

    async fn send(&self, req: DiscoveryRequest) {
        self.tx.send(req).await.expect("the stream is open");
    }

    /// The next response; a stream error or end is a failure.
    async fn next(&mut self) -> DiscoveryResponse {
        tokio::time::timeout(PATIENCE, self.rx.message())
            .await
            .expect("a response in time")
            .expect("no stream error")
            .expect("the stream goes on")
    }

    /// ACKs `res` and returns it.
    async fn ack(&mut self, res: &DiscoveryResponse, names: &[&str]) {
        self.request(&res.type_url, names, &res.version_info, &res.nonce).await;
    }
}

fn decode<T: Message + Name + Default>(any: &Any) -> T {
    assert_eq!(any.type_url, T::type_url());
    T::decode(any.value.as_slice()).unwrap_or_else(|e| panic!("{}: {e}", T::full_name()))
}

fn by_name<T: Message + Name + Default>(
    res: &DiscoveryResponse,
    name: impl Fn(&T) -> String,
) -> BTreeMap<String, T> {
    res.resources.iter().map(|a| decode::<T>(a)).map(|t| (name(&t), t)).collect()
}

fn ms(d: &Option<PbDuration>) -> i64 {
    let d = d.as_ref().expect("a duration");
    d.seconds * 1000 + i64::from(d.nanos) / 1_000_000
}

/// Environment `prod` (faults allowed) and service `checkout` calling `pricing` (retries,
/// a bulkhead, outlier detection, a faster gRPC method) and `recommendations`
/// (non-critical: its attempts are capped at 80 ms).
async fn seed(app: &TestApp) {
    app.seed().await;
    let (s, _, b) = app
        .call_as(
            &app.token,
            Method::PUT,
            "/api/v1/environments/prod/services/checkout/policy",
            Some(json!({"reason": "xds", "policy": {
                "non_critical_cap": "80ms",
                "dependencies": {
                    "pricing": {
                        "attempt_timeout": "300ms",
                        "retry": {"max_attempts": 3, "base": "20ms", "cap": "100ms"},
                        "bulkhead": {"max_concurrent": 7},
                        "outlier_detection": {"consecutive_errors": 4, "interval": "5s", "base_ejection_time": "20s",
                                              "max_ejection_percent": 40},
                        "operations": {"/shop.Pricing/Quote": {"attempt_timeout": "100ms"}}
                    },
                    "recommendations": {"criticality": "non_critical", "enabled_flag": "recommendations.enabled",
                                        "attempt_timeout": "200ms", "retry": {"max_attempts": 1}, "fallback": "generic"}
                }}})),
            &[("if-match", "*")],
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{b}");
}

async fn spawn() -> TestApp {
    TestApp::spawn_on_with(crate::helpers::Db::Sqlite, |s| {
        s.xds_endpoints = levee_server::xds::Endpoints::parse([
            "prod/pricing=127.0.0.1:50051",
            "prod/pricing=127.0.0.2:50051",
        ])
        .unwrap();
    })
    .await
    .unwrap()
}

async fn revision(app: &TestApp) -> String {
    let (s, _, b) = app.call(Method::GET, "/api/v1/environments/prod/services/checkout", None).await;
    assert_eq!(s, StatusCode::OK, "{b}");
    b["revision"].as_u64().expect("a revision").to_string()
}

#[tokio::test]
async fn every_resource_decodes_with_envoy_types_and_says_what_the_policy_says() {
    let app = spawn().await;
    seed(&app).await;
    let (token, _) = app.agent_token(&["checkout"]).await;
    let rev = revision(&app).await;
    let mut ads = Ads::open(&app.grpc, Some(&token), "prod/checkout/xds-1").await.unwrap();

    // LDS, wildcard: an API listener per dependency, routes from RDS over ADS, the fault
    // filter before the router.
    let lds = ads.next().await;
    assert_eq!((lds.type_url.as_str(), lds.version_info.as_str()), (LISTENER, rev.as_str()));
    let listeners = by_name::<Listener>(&lds, |l| l.name.clone());
    assert_eq!(listeners.keys().collect::<Vec<_>>(), ["pricing", "recommendations"]);
    let hcm: HttpConnectionManager =
        decode(listeners["pricing"].api_listener.as_ref().unwrap().api_listener.as_ref().unwrap());
    match hcm.route_specifier {
        Some(http_connection_manager::RouteSpecifier::Rds(rds)) => {
            assert_eq!(rds.route_config_name, "pricing");
            assert!(rds.config_source.unwrap().config_source_specifier.is_some());
        }
        other => panic!("routes from RDS, not {other:?}"),
    }
    let filters: Vec<&str> = hcm.http_filters.iter().map(|f| f.name.as_str()).collect();
    assert_eq!(filters, [FAULT_FILTER, "envoy.filters.http.router"]);
    for f in &hcm.http_filters {
        let Some(http_filter::ConfigType::TypedConfig(any)) = &f.config_type else { panic!("typed config") };
        assert!(
            any.type_url.starts_with("type.googleapis.com/envoy.extensions.filters.http."),
            "{}",
            any.type_url
        );
    }
    ads.ack(&lds, &[]).await;

    // RDS: timeouts, retries, the operation's route first.
    ads.request(ROUTE, &["pricing", "recommendations"], "", "").await;
    let rds = ads.next().await;
    assert_eq!((rds.type_url.as_str(), rds.version_info.as_str()), (ROUTE, rev.as_str()));
    let routes = by_name::<RouteConfiguration>(&rds, |r| r.name.clone());
    let pricing = &routes["pricing"].virtual_hosts[0];
    assert_eq!(pricing.domains, ["*"]);
    assert_eq!(pricing.routes.len(), 2);
    let quote = &pricing.routes[0];
    assert_eq!(
        quote.r#match.as_ref().unwrap().path_specifier,
        Some(route_match::PathSpecifier::Path("/shop.Pricing/Quote".into()))
    );
    let Some(route::Action::Route(quote_action)) = &quote.action else { panic!("a route action") };
    assert_eq!(ms(&quote_action.retry_policy.as_ref().unwrap().per_try_timeout), 100);
    let Some(route::Action::Route(all)) = &pricing.routes[1].action else { panic!("a route action") };
    assert_eq!(
        pricing.routes[1].r#match.as_ref().unwrap().path_specifier,
        Some(route_match::PathSpecifier::Prefix("/".into()))
    );
    let retry = all.retry_policy.as_ref().unwrap();
    assert_eq!(retry.num_retries.as_ref().unwrap().value, 2);
    assert_eq!(ms(&retry.per_try_timeout), 300);
    assert!(retry.retry_on.split(',').any(|c| c == "unavailable"), "{}", retry.retry_on);
    let back_off = retry.retry_back_off.as_ref().unwrap();
    assert_eq!((ms(&back_off.base_interval), ms(&back_off.max_interval)), (20, 100));
    // Three attempts of 300 ms and two backoffs of at most 100 ms: 1.1 s; without a
    // deadline from the caller, the default deadline (1 s) bounds it; a caller's deadline
    // is kept up to 1.1 s (under the maximum deadline, 10 s).
    assert_eq!(ms(&all.timeout), 1000);
    let msd = all.max_stream_duration.as_ref().unwrap();
    assert_eq!((ms(&msd.max_stream_duration), ms(&msd.grpc_timeout_header_max)), (1000, 1100));
    let cluster_name = match &all.cluster_specifier {
        Some(envoy_types::pb::envoy::config::route::v3::route_action::ClusterSpecifier::Cluster(c)) => {
            c.clone()
        }
        other => panic!("one cluster, not {other:?}"),
    };
    assert_eq!(cluster_name, "pricing");
    let fault: HttpFault = decode(&pricing.routes[1].typed_per_filter_config[FAULT_FILTER]);
    assert_eq!(fault, HttpFault::default(), "no fault rule yet");
    // Non-critical: one attempt, capped at non_critical_cap.
    let recs = &routes["recommendations"].virtual_hosts[0].routes[0];
    let Some(route::Action::Route(recs)) = &recs.action else { panic!("a route action") };
    assert!(recs.retry_policy.is_none());
    assert_eq!(ms(&recs.timeout), 80);
    ads.ack(&rds, &["pricing", "recommendations"]).await;

    // CDS: the bulkhead, the retry budget, outlier detection, endpoints from EDS.
    ads.request(CLUSTER, &[], "", "").await;
    let cds = ads.next().await;
    assert_eq!(cds.type_url, CLUSTER);
    let clusters = by_name::<Cluster>(&cds, |c| c.name.clone());
    assert_eq!(clusters.keys().collect::<Vec<_>>(), ["pricing", "recommendations"]);
    let c = &clusters["pricing"];
    assert_eq!(
        c.cluster_discovery_type,
        Some(cluster::ClusterDiscoveryType::Type(cluster::DiscoveryType::Eds as i32))
    );
    assert_eq!(c.eds_cluster_config.as_ref().unwrap().service_name, "pricing");
    let t = &c.circuit_breakers.as_ref().unwrap().thresholds[0];
    assert_eq!(t.max_requests.as_ref().unwrap().value, 7);
    assert!(t.retry_budget.as_ref().unwrap().budget_percent.is_some());
    let o = c.outlier_detection.as_ref().unwrap();
    assert_eq!(o.consecutive_5xx.as_ref().unwrap().value, 4);
    assert_eq!((ms(&o.interval), ms(&o.base_ejection_time)), (5000, 20_000));
    assert_eq!(o.max_ejection_percent.as_ref().unwrap().value, 40);
    assert_eq!(o.enforcing_success_rate.as_ref().unwrap().value, 0);
    assert!(clusters["recommendations"].outlier_detection.is_none());
    ads.ack(&cds, &[]).await;

    // EDS: the endpoints the settings name; none for a dependency they do not name.
    ads.request(ENDPOINT, &["pricing", "recommendations"], "", "").await;
    let eds = ads.next().await;
    let cla = by_name::<ClusterLoadAssignment>(&eds, |c| c.cluster_name.clone());
    let addrs: Vec<String> = cla["pricing"].endpoints[0]
        .lb_endpoints
        .iter()
        .map(|e| {
            let Some(lb_endpoint::HostIdentifier::Endpoint(ep)) = &e.host_identifier else {
                panic!("an endpoint")
            };
            let Some(address::Address::SocketAddress(sa)) = &ep.address.as_ref().unwrap().address else {
                panic!("a socket address")
            };
            let Some(socket_address::PortSpecifier::PortValue(port)) = sa.port_specifier else {
                panic!("a port")
            };
            format!("{}:{port}", sa.address)
        })
        .collect();
    assert_eq!(addrs, ["127.0.0.1:50051", "127.0.0.2:50051"]);
    assert!(cla["recommendations"].endpoints.is_empty());
}

#[tokio::test]
async fn a_change_is_pushed_as_a_new_version_and_a_nacked_version_is_not_sent_again() {
    let app = spawn().await;
    seed(&app).await;
    let (token, _) = app.agent_token(&["checkout"]).await;
    let mut ads = Ads::open(&app.grpc, Some(&token), "prod/checkout/xds-2").await.unwrap();
    let lds = ads.next().await;
    ads.ack(&lds, &[]).await;
    ads.request(ROUTE, &["pricing"], "", "").await;
    let rds = ads.next().await;
    ads.ack(&rds, &["pricing"]).await;

    // A fault rule: pushed on the open stream as the next revision, listeners and routes.
    let in_an_hour = levee_agent::policy::Timestamp::from_unix_ms(
        levee_agent::policy::Timestamp::now().unix_ms() + 3_600_000,
    );
    let (s, _, b) = app
        .call(
            Method::PUT,
            "/api/v1/environments/prod/services/checkout/faults/pricing-down",
            Some(json!({"dependency": "pricing", "action": {"type": "abort", "status": 503}, "percent": 100,
                        "expires_at": in_an_hour.to_string(), "reason": "game day"})),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{b}");
    let rev = revision(&app).await;
    assert_ne!(rev, rds.version_info);
    let mut pushed = BTreeMap::new();
    while pushed.len() < 2 {
        let r = ads.next().await;
        assert_eq!(r.version_info, rev, "{}", r.type_url);
        pushed.insert(r.type_url.clone(), r);
    }
    let routes = by_name::<RouteConfiguration>(&pushed[ROUTE], |r| r.name.clone());
    assert_eq!(routes.keys().collect::<Vec<_>>(), ["pricing"], "only what was asked for");
    let last = routes["pricing"].virtual_hosts[0].routes.last().unwrap();
    let fault: HttpFault = decode(&last.typed_per_filter_config[FAULT_FILTER]);
    let abort = fault.abort.unwrap();
    assert_eq!(abort.error_type, Some(fault_abort::ErrorType::HttpStatus(503)));
    assert_eq!(abort.percentage.unwrap().numerator, 1_000_000);
    ads.ack(&pushed[LISTENER], &[]).await;

    // The client rejects the routes: the version stays unsent to it; the next revision is
    // the next response of the type (never this version again).
    let nacked = &pushed[ROUTE];
    ads.send(DiscoveryRequest {
        version_info: rds.version_info.clone(),
        resource_names: vec!["pricing".into()],
        type_url: ROUTE.into(),
        response_nonce: nacked.nonce.clone(),
        error_detail: Some(RpcStatus {
            code: 3,
            message: "route rejected by the test".into(),
            details: vec![],
        }),
        ..Default::default()
    })
    .await;
    let (s, _, b) = app
        .call(
            Method::DELETE,
            "/api/v1/environments/prod/services/checkout/faults/pricing-down?reason=over",
            None,
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{b}");
    let after = revision(&app).await;
    let mut seen = BTreeMap::new();
    while seen.len() < 2 {
        let r = ads.next().await;
        assert_eq!(r.version_info, after, "{}: only the new revision after a NACK", r.type_url);
        seen.insert(r.type_url.clone(), r);
    }
    let routes = by_name::<RouteConfiguration>(&seen[ROUTE], |r| r.name.clone());
    let last = routes["pricing"].virtual_hosts[0].routes.last().unwrap();
    assert_eq!(decode::<HttpFault>(&last.typed_per_filter_config[FAULT_FILTER]), HttpFault::default());
}

#[tokio::test]
async fn only_an_agent_token_of_the_nodes_service_and_environment_opens_a_stream() {
    let app = spawn().await;
    seed(&app).await;
    let (s, _, b) = app
        .call(
            Method::POST,
            "/api/v1/environments/prod/services",
            Some(json!({"name": "search", "reason": "xds", "policy": {}})),
        )
        .await;
    assert_eq!(s, StatusCode::CREATED, "{b}");
    let (search_token, _) = app.agent_token(&["search"]).await;
    let (checkout_token, _) = app.agent_token(&["checkout"]).await;

    let refused = |r: Result<Ads, tonic::Status>| r.err().expect("refused");
    let e = refused(Ads::open(&app.grpc, Some(&search_token), "prod/checkout/xds-3").await);
    assert_eq!(e.code(), tonic::Code::PermissionDenied, "{e:?}");
    assert!(e.message().contains("not scoped to service \"checkout\""), "{}", e.message());
    let e = refused(Ads::open(&app.grpc, Some(&checkout_token), "staging/checkout/xds-3").await);
    assert_eq!(e.code(), tonic::Code::PermissionDenied, "{e:?}");
    let e = refused(Ads::open(&app.grpc, None, "prod/checkout/xds-3").await);
    assert_eq!(e.code(), tonic::Code::Unauthenticated, "{e:?}");
    // The admin's API token is no agent token.
    let e = refused(Ads::open(&app.grpc, Some(&app.token), "prod/checkout/xds-3").await);
    assert_eq!(e.code(), tonic::Code::Unauthenticated, "{e:?}");
    let e = refused(Ads::open(&app.grpc, Some(&checkout_token), "checkout").await);
    assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e:?}");
    assert!(e.message().contains("ENVIRONMENT/SERVICE/INSTANCE"), "{}", e.message());

    let mut ok = Ads::open(&app.grpc, Some(&search_token), "prod/search/xds-3").await.unwrap();
    let lds = ok.next().await;
    assert!(lds.resources.is_empty(), "search calls nothing");
}

/// The Python program (`tests/clients/xds_client.py`) in the venv .ci/run makes; without
/// it the test is skipped, unless LEVEE_REQUIRE_XDS_CLIENT is set (CI).
fn xds_python() -> Option<std::path::PathBuf> {
    let python = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/xds-venv/bin/python");
    if python.exists() {
        return Some(python);
    }
    assert!(
        std::env::var("LEVEE_REQUIRE_XDS_CLIENT").is_err(),
        "LEVEE_REQUIRE_XDS_CLIENT is set but {} is missing",
        python.display()
    );
    eprintln!("{} missing: skipping gRPC's xDS client", python.display());
    None
}

/// The program: its test gRPC server and gRPC's xDS client, driven one JSON line at a time.
struct GrpcClient {
    _child: tokio::process::Child,
    stdin: tokio::process::ChildStdin,
    lines: tokio::io::Lines<tokio::io::BufReader<tokio::process::ChildStdout>>,
}

impl GrpcClient {
    async fn start(python: &std::path::Path, bootstrap: &std::path::Path) -> (GrpcClient, u16) {
        use tokio::io::AsyncBufReadExt;
        let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/clients/xds_client.py");
        let mut child = tokio::process::Command::new(python)
            .arg(script)
            .env("GRPC_XDS_BOOTSTRAP", bootstrap)
            // The agent token reaches Levee as call credentials read from a file (gRFC A97).
            .env("GRPC_EXPERIMENTAL_XDS_BOOTSTRAP_CALL_CREDS", "true")
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .expect("the xDS client program starts");
        let stdin = child.stdin.take().unwrap();
        let mut lines = tokio::io::BufReader::new(child.stdout.take().unwrap()).lines();
        let ready = tokio::time::timeout(PATIENCE, lines.next_line()).await.expect("ready in time").unwrap();
        let ready: serde_json::Value =
            serde_json::from_str(ready.as_deref().expect("the program prints")).unwrap();
        let port = ready["port"].as_u64().expect("the test server's port") as u16;
        (GrpcClient { _child: child, stdin, lines }, port)
    }

    async fn cmd(&mut self, cmd: serde_json::Value) -> serde_json::Value {
        use tokio::io::AsyncWriteExt;
        self.stdin.write_all(format!("{cmd}\n").as_bytes()).await.unwrap();
        self.stdin.flush().await.unwrap();
        let line = tokio::time::timeout(Duration::from_secs(60), self.lines.next_line())
            .await
            .expect("the program answers")
            .unwrap()
            .expect("the program is running");
        serde_json::from_str(&line).unwrap_or_else(|e| panic!("{line}: {e}"))
    }

    async fn call(&mut self) -> serde_json::Value {
        self.cmd(json!({"cmd": "call"})).await
    }

    /// Calls until `done` holds for an answer (Levee's push reaching the client), at most
    /// [`PATIENCE`]; returns that answer.
    async fn until(
        &mut self,
        what: &str,
        mut done: impl FnMut(&serde_json::Value) -> bool,
    ) -> serde_json::Value {
        let start = tokio::time::Instant::now();
        loop {
            let r = self.call().await;
            if done(&r) {
                return r;
            }
            assert!(start.elapsed() < PATIENCE, "{what}: still {r}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// The API over HTTPS (Levee's listeners serve TLS: gRPC sends call credentials only over
/// TLS), logged in as admin.
struct TlsApi {
    cfg: std::sync::Arc<rustls::ClientConfig>,
    addr: std::net::SocketAddr,
    token: String,
}

impl TlsApi {
    async fn call(&self, method: &str, path: &str, body: Option<serde_json::Value>) -> serde_json::Value {
        self.call_with(method, path, body, &[]).await
    }

    async fn call_with(
        &self,
        method: &str,
        path: &str,
        body: Option<serde_json::Value>,
        headers: &[(&str, &str)],
    ) -> serde_json::Value {
        let (text, _) = crate::tls::https_raw(
            &self.cfg,
            self.addr,
            method,
            &format!("/api/v1{path}"),
            Some(&self.token).filter(|t| !t.is_empty()).map(String::as_str),
            body.as_ref(),
            headers,
        )
        .await;
        let code: u16 = text.split_whitespace().nth(1).unwrap().parse().unwrap();
        assert!((200..300).contains(&code), "{method} {path}: {text}");
        crate::tls::json_of(text.split_once("\r\n\r\n").unwrap().1)
    }

    async fn pricing(&self, dependency: serde_json::Value) {
        self.call_with(
            "PUT",
            "/environments/prod/services/checkout/policy",
            Some(json!({"reason": "xds", "policy": {"dependencies": {"pricing": dependency}}})),
            &[("if-match", "*")],
        )
        .await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_proxyless_client_obeys_levees_faults_timeouts_retries_and_bulkhead() {
    let Some(python) = xds_python() else { return };
    let _ = rustls::crypto::ring::default_provider().install_default();
    let dir = tempfile::tempdir().unwrap();
    let bootstrap = dir.path().join("bootstrap.json");
    // The client's test server first: Levee's settings name its address.
    let (mut client, port) = GrpcClient::start(&python, &bootstrap).await;

    let files =
        levee_server::tls::TlsFiles { cert: dir.path().join("tls.crt"), key: dir.path().join("tls.key") };
    let ca = crate::tls::new_ca("levee xds test CA");
    crate::tls::write_leaf(&ca, "levee", &files);
    std::fs::write(dir.path().join("ca.pem"), &ca.pem).unwrap();
    let mut settings = levee_server::config::Settings::for_dir(&dir.path().join("data"));
    settings.admin_password = Some(levee_server::config::Secret::new(crate::helpers::ADMIN_PASSWORD));
    settings.jwt_secret = Some(levee_server::config::Secret::new(crate::helpers::JWT_SECRET));
    settings.tls = Some(files);
    settings.xds_endpoints =
        levee_server::xds::Endpoints::parse([format!("prod/pricing=127.0.0.1:{port}").as_str()]).unwrap();
    let server = levee_server::Server::start(settings, None).await.expect("server starts");

    let mut api =
        TlsApi { cfg: crate::tls::client_config(&ca.pem), addr: server.http_addr, token: String::new() };
    let login = api
        .call(
            "POST",
            "/auth/login",
            Some(json!({"username": "admin", "password": crate::helpers::ADMIN_PASSWORD})),
        )
        .await;
    api.token = login["token"].as_str().unwrap().to_string();
    api.call("POST", "/environments", Some(json!({"name": "prod", "allow_faults": true, "reason": "xds"})))
        .await;
    api.call(
        "POST",
        "/environments/prod/services",
        // A generous first timeout: the call's deadline runs while the client fetches its
        // first resources, which a loaded machine may make slow.
        Some(json!({"name": "checkout", "reason": "xds",
                    "policy": {"dependencies": {"pricing": {"attempt_timeout": "10s", "retry": {"max_attempts": 1}}}}})),
    )
    .await;
    let token = api
        .call(
            "POST",
            "/tokens",
            Some(json!({"kind": "agent", "name": "xds", "environment": "prod", "services": ["checkout"], "reason": "xds"})),
        )
        .await;
    std::fs::write(dir.path().join("token"), token["token"].as_str().unwrap()).unwrap();
    let boot = json!({
        "xds_servers": [{
            "server_uri": format!("localhost:{}", server.grpc_addr.port()),
            "channel_creds": [{"type": "tls", "config": {"ca_certificate_file": dir.path().join("ca.pem")}}],
            "call_creds": [{"type": "jwt_token_file", "config": {"jwt_token_file": dir.path().join("token")}}],
            "server_features": ["xds_v3"]
        }],
        "node": {"id": "prod/checkout/python-1", "cluster": "checkout"}
    });
    std::fs::write(&bootstrap, boot.to_string()).unwrap();
    assert_eq!(client.cmd(json!({"cmd": "connect", "target": "xds:///pricing"})).await["ok"], true);

    // Through Levee's listener, route, cluster and endpoints to the test server.
    let r = client.call().await;
    assert_eq!((r["code"].as_str(), r["attempts"].as_u64()), (Some("OK"), Some(1)), "{r}");

    // A fault rule: every call fails with the rule's status (503: UNAVAILABLE), the test
    // server sees none.
    let fault = "/environments/prod/services/checkout/faults/pricing-down";
    let in_an_hour = levee_agent::policy::Timestamp::from_unix_ms(
        levee_agent::policy::Timestamp::now().unix_ms() + 3_600_000,
    );
    api.call(
        "PUT",
        fault,
        Some(json!({"dependency": "pricing", "action": {"type": "abort", "status": 503}, "percent": 100,
                    "expires_at": in_an_hour.to_string(), "reason": "game day"})),
    )
    .await;
    let r = client.until("the abort fault", |r| r["code"] == "UNAVAILABLE").await;
    assert_eq!(r["attempts"], 0, "{r}");
    api.call("DELETE", &format!("{fault}?reason=over"), None).await;
    client.until("the fault removed", |r| r["code"] == "OK").await;

    // Retries: without them a failure reaches the caller; with three attempts two failures
    // are retried away.
    client.cmd(json!({"cmd": "backend", "fail_next": 1})).await;
    let r = client.call().await;
    assert_eq!((r["code"].as_str(), r["attempts"].as_u64()), (Some("UNAVAILABLE"), Some(1)), "{r}");
    api.pricing(
        json!({"attempt_timeout": "2s", "retry": {"max_attempts": 3, "base": "10ms", "cap": "50ms"}}),
    )
    .await;
    let start = tokio::time::Instant::now();
    loop {
        client.cmd(json!({"cmd": "backend", "fail_next": 2})).await;
        let r = client.call().await;
        if r["code"] == "OK" {
            assert_eq!(r["attempts"], 3, "two failures, then the answer: {r}");
            break;
        }
        assert!(start.elapsed() < PATIENCE, "retries: still {r}");
    }
    client.cmd(json!({"cmd": "backend"})).await;

    // The timeout: a call slower than the attempt timeout ends DEADLINE_EXCEEDED.
    client.cmd(json!({"cmd": "backend", "delay_ms": 1000})).await;
    api.pricing(json!({"attempt_timeout": "200ms", "retry": {"max_attempts": 1}})).await;
    let r = client.until("the attempt timeout", |r| r["code"] == "DEADLINE_EXCEEDED").await;
    assert!(r["ms"].as_u64().unwrap() < 1000, "{r}");
    api.pricing(json!({"attempt_timeout": "5s", "retry": {"max_attempts": 1}})).await;
    client.until("a longer timeout", |r| r["code"] == "OK").await;

    // The bulkhead: one call at a time; of three at once, the excess fails UNAVAILABLE.
    api.pricing(
        json!({"attempt_timeout": "5s", "retry": {"max_attempts": 1}, "bulkhead": {"max_concurrent": 1}}),
    )
    .await;
    // Calls long enough to overlap however the client's threads are scheduled.
    client.cmd(json!({"cmd": "backend", "delay_ms": 1500})).await;
    let start = tokio::time::Instant::now();
    loop {
        let r = client.cmd(json!({"cmd": "calls", "n": 3})).await;
        if r["codes"] == json!(["OK", "UNAVAILABLE", "UNAVAILABLE"]) {
            assert_eq!(r["attempts"], 1, "{r}");
            break;
        }
        assert!(start.elapsed() < PATIENCE, "the bulkhead: still {r}");
    }
    drop(client);
    server.shutdown().await;
}

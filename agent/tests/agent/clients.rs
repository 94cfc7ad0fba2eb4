//! The enforcement stack on real clients over loopback (real time, no control plane): a
//! hyper client and a tonic channel through the tower layer, and a generated tonic client
//! through `Dependency::call`. Backoffs are 1 ms so nothing waits long.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use levee_agent::breaker::State;
use levee_agent::deadline::{Deadline, with_deadline};
use levee_agent::policy::{ServiceConfig, decode_config};
use levee_agent::{Agent, CallError, GrpcJudge, HttpJudge};
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_client::HealthClient;
use tower::{Service, ServiceBuilder, ServiceExt};

const CHECK: &str = "/grpc.health.v1.Health/Check";

/// An agent on compiled-in defaults only (the control plane is not reachable), with one
/// dependency `dep` configured by `policy` (a JSON dependency object).
fn agent(policy: &str) -> Agent {
    let body = format!(r#"{{"policy": {{"dependencies": {{"dep": {policy}}}}}}}"#);
    let cfg: ServiceConfig = decode_config(body.as_bytes()).expect("valid test policy");
    Agent::builder("http://127.0.0.1:9", "no-token", "test", "clients")
        .defaults(cfg)
        .build()
        .expect("agent builds")
}

const RETRYING: &str = r#"{"retry": {"max_attempts": 3, "base": "1ms", "cap": "2ms"},
    "attempt_timeout": "2s",
    "operations": {"/grpc.health.v1.Health/Check": {"idempotent": true}}}"#;

const BREAKING: &str = r#"{"retry": {"max_attempts": 1},
    "circuit_breaker": {"window": {"type": "count", "size": 10}, "minimum_calls": 3,
                        "failure_rate_threshold": 0.5, "wait_in_open": "60s"}}"#;

/// What the HTTP test server saw per request: the retry marker and the deadline header.
#[derive(Default)]
struct Seen {
    hits: AtomicU32,
    marked: AtomicU32,
    with_deadline: AtomicU32,
}

/// An HTTP server answering 503 to the first `failures` requests, then 200.
async fn http_server(failures: u32, seen: Arc<Seen>) -> SocketAddr {
    let app = axum::Router::new().route(
        "/price",
        axum::routing::get(move |headers: http::HeaderMap| {
            let seen = seen.clone();
            async move {
                let n = seen.hits.fetch_add(1, Ordering::SeqCst);
                if headers.get("levee-retried").is_some() {
                    seen.marked.fetch_add(1, Ordering::SeqCst);
                }
                let budget =
                    headers.get("levee-deadline-ms").and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
                if budget.is_some_and(|ms| ms > 0 && ms <= 1000) {
                    seen.with_deadline.fetch_add(1, Ordering::SeqCst);
                }
                if n < failures {
                    (http::StatusCode::SERVICE_UNAVAILABLE, "busy")
                } else {
                    (http::StatusCode::OK, "42")
                }
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    addr
}

/// A gRPC health server whose first `failures` calls are refused with UNAVAILABLE by an
/// interceptor (a Trailers-Only answer, as real servers send early errors).
async fn grpc_server(failures: u32, hits: Arc<AtomicU32>) -> SocketAddr {
    let (reporter, health) = tonic_health::server::health_reporter();
    reporter
        .set_serving::<tonic_health::pb::health_server::HealthServer<tonic_health::server::HealthService>>()
        .await;
    let interceptor = move |req: tonic::Request<()>| {
        if hits.fetch_add(1, Ordering::SeqCst) < failures {
            Err(tonic::Status::unavailable("warming up"))
        } else {
            Ok(req)
        }
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener);
    tokio::spawn(async move {
        tonic::transport::Server::builder()
            .add_service(tonic::service::interceptor::InterceptedService::new(health, interceptor))
            .serve_with_incoming(incoming)
            .await
    });
    addr
}

/// A hyper client under the tower layer with `HttpJudge`: 503s are retried (GET is
/// idempotent) until the 200, every attempt carries the remaining deadline and, since the
/// stack retries, the retry marker for the service called.
#[tokio::test]
async fn hyper_client_through_the_layer_retries_5xx_and_propagates_the_deadline() {
    let seen = Arc::new(Seen::default());
    let addr = http_server(2, seen.clone()).await;
    let agent = agent(RETRYING);
    let dep = agent.dependency("dep");
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build_http::<Full<Bytes>>();
    let mut svc =
        ServiceBuilder::new().layer(dep.layer().operation("GET /price").judge(HttpJudge)).service(client);
    let req = http::Request::get(format!("http://{addr}/price")).body(Full::new(Bytes::new())).unwrap();
    let res = with_deadline(Deadline::after(Duration::from_secs(1)), async {
        svc.ready().await.unwrap().call(req).await
    })
    .await
    .expect("the third attempt succeeds");
    assert_eq!(res.status(), http::StatusCode::OK);
    assert_eq!(res.into_body().collect().await.unwrap().to_bytes(), Bytes::from_static(b"42"));
    assert_eq!(seen.hits.load(Ordering::SeqCst), 3, "two 503s retried, then the 200");
    assert_eq!(seen.marked.load(Ordering::SeqCst), 3, "every attempt says it is retried upstream");
    assert_eq!(seen.with_deadline.load(Ordering::SeqCst), 3, "every attempt carries the remaining budget");
    assert_eq!(dep.breaker("GET /price").window.calls, 3, "the breaker saw each attempt");
}

/// A tonic channel under the tower layer with `GrpcJudge`: UNAVAILABLE answers count as
/// failures, the breaker opens, and the next call is refused locally without reaching the
/// server. Requests on a channel cannot be replayed: one attempt each.
#[tokio::test]
async fn tonic_channel_through_the_layer_opens_the_breaker_on_unavailable() {
    let hits = Arc::new(AtomicU32::new(0));
    let addr = grpc_server(u32::MAX, hits.clone()).await;
    let agent = agent(BREAKING);
    let dep = agent.dependency("dep");
    let channel =
        tonic::transport::Endpoint::from_shared(format!("http://{addr}")).unwrap().connect().await.unwrap();
    let svc = ServiceBuilder::new().layer(dep.layer().operation(CHECK).judge(GrpcJudge)).service(channel);
    let mut client = HealthClient::new(svc);
    for _ in 0..3 {
        let status = client.check(HealthCheckRequest { service: String::new() }).await.unwrap_err();
        assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}");
    }
    assert_eq!(hits.load(Ordering::SeqCst), 3, "one attempt per call");
    assert_eq!(dep.breaker(CHECK).state, State::Open, "3 failures of 3 reach the 50 % threshold");
    let refused = client.check(HealthCheckRequest { service: String::new() }).await.unwrap_err();
    assert_eq!(hits.load(Ordering::SeqCst), 3, "the open breaker refused locally: {refused:?}");

    // Retries allowed by policy, but a channel's streaming body cannot be replayed: one
    // attempt, and the caller gets the server's own status (not a replay error).
    let retrying = self::agent(RETRYING);
    let dep = retrying.dependency("dep");
    let channel =
        tonic::transport::Endpoint::from_shared(format!("http://{addr}")).unwrap().connect().await.unwrap();
    let svc = ServiceBuilder::new().layer(dep.layer().operation(CHECK).judge(GrpcJudge)).service(channel);
    hits.store(0, Ordering::SeqCst);
    let status =
        HealthClient::new(svc).check(HealthCheckRequest { service: String::new() }).await.unwrap_err();
    assert_eq!((status.code(), status.message()), (tonic::Code::Unavailable, "warming up"));
    assert_eq!(hits.load(Ordering::SeqCst), 1);
}

/// A generated tonic client through `Dependency::call`: `tonic::Status` is classified
/// (UNAVAILABLE is retryable), the method is idempotent by policy, so the call succeeds on
/// the third attempt.
#[tokio::test]
async fn tonic_client_through_call_retries_unavailable() {
    let hits = Arc::new(AtomicU32::new(0));
    let addr = grpc_server(2, hits.clone()).await;
    let agent = agent(RETRYING);
    let dep = agent.dependency("dep");
    let channel =
        tonic::transport::Endpoint::from_shared(format!("http://{addr}")).unwrap().connect().await.unwrap();
    let client = HealthClient::new(channel);
    let answer = dep
        .call(CHECK, || {
            let mut c = client.clone();
            async move { c.check(HealthCheckRequest { service: String::new() }).await }
        })
        .await
        .expect("the third attempt succeeds");
    assert_eq!(
        answer.into_inner().status,
        tonic_health::pb::health_check_response::ServingStatus::Serving as i32
    );
    assert_eq!(hits.load(Ordering::SeqCst), 3);

    // The same through a non-idempotent name: one attempt, the server's status returned.
    hits.store(0, Ordering::SeqCst);
    let err = dep
        .call("/grpc.health.v1.Health/Watch", || {
            let mut c = client.clone();
            async move { c.check(HealthCheckRequest { service: String::new() }).await }
        })
        .await
        .unwrap_err();
    assert!(matches!(&err, CallError::Inner(s) if s.code() == tonic::Code::Unavailable), "{err:?}");
    assert_eq!(hits.load(Ordering::SeqCst), 1, "not idempotent: no retry");
}

/// A `reqwest::Client` as a tower service under the layer with `HttpJudge` (feature
/// `reqwest`): the same retries and propagation as the hyper client.
#[cfg(feature = "reqwest")]
#[tokio::test]
async fn reqwest_client_through_the_layer_retries_5xx() {
    let seen = Arc::new(Seen::default());
    let addr = http_server(2, seen.clone()).await;
    let agent = agent(RETRYING);
    let dep = agent.dependency("dep");
    let http = reqwest::Client::new();
    let mut svc = ServiceBuilder::new()
        .layer(dep.layer().operation("GET /price").judge(HttpJudge))
        .service(http.clone());
    let req = http.get(format!("http://{addr}/price")).build().unwrap();
    let res = with_deadline(Deadline::after(Duration::from_secs(1)), async {
        svc.ready().await.unwrap().call(req).await
    })
    .await
    .expect("the third attempt succeeds");
    assert_eq!(res.status(), reqwest::StatusCode::OK);
    assert_eq!(res.text().await.unwrap(), "42");
    assert_eq!(seen.hits.load(Ordering::SeqCst), 3);
    assert_eq!(seen.with_deadline.load(Ordering::SeqCst), 3);
}

/// A plain `reqwest` call inside `Dependency::call`, its error boxed (feature `reqwest`):
/// `error_for_status()` turns the 503s into `reqwest::Error`s, which are classified as
/// HTTP 503 — retryable — out of the box, so the third attempt gets the 200.
#[cfg(feature = "reqwest")]
#[tokio::test]
async fn boxed_reqwest_503_is_classified_and_retried() {
    let seen = Arc::new(Seen::default());
    let addr = http_server(2, seen.clone()).await;
    let agent = agent(RETRYING);
    let dep = agent.dependency("dep");
    let http = reqwest::Client::new();
    let url = format!("http://{addr}/price");
    let body = dep
        .call("GET /price", || async {
            let res = http.get(&url).send().await?.error_for_status()?;
            Ok::<_, levee_agent::BoxError>(res.text().await?)
        })
        .await
        .expect("retried until the 200");
    assert_eq!(body, "42");
    assert_eq!(seen.hits.load(Ordering::SeqCst), 3);
}

/// `reqwest::Error` as the attempt's own error type (feature `reqwest`): classified by
/// kind — status, connection refused, reqwest's timeout — against real loopback sockets.
#[cfg(feature = "reqwest")]
#[tokio::test]
async fn reqwest_errors_are_classified_by_kind() {
    use levee_agent::retry::{Classify, ErrorKind};

    let seen = Arc::new(Seen::default());
    let addr = http_server(1, seen.clone()).await;
    let agent = agent(RETRYING);
    let dep = agent.dependency("dep");
    let http = reqwest::Client::new();
    let url = format!("http://{addr}/price");
    let status = dep
        .call("GET /price", || async { http.get(&url).send().await?.error_for_status().map(|r| r.status()) })
        .await
        .expect("the 503 is retried");
    assert_eq!(status, reqwest::StatusCode::OK);
    assert_eq!(seen.hits.load(Ordering::SeqCst), 2);

    let err =
        http.get(format!("http://{addr}/nothing")).send().await.unwrap().error_for_status().unwrap_err();
    assert_eq!(err.error_kind(), ErrorKind::HttpStatus(404));
    assert!(!err.error_kind().is_retryable() && !err.error_kind().is_dependency_failure());

    // Connection refused: a port that was just freed.
    let closed = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap().local_addr().unwrap();
    let err = http.get(format!("http://{closed}/")).send().await.unwrap_err();
    assert_eq!(err.error_kind(), ErrorKind::Connect, "{err:?}");

    // reqwest's own timeout, against a server that accepts and never answers.
    let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let silent_addr = silent.local_addr().unwrap();
    let _hold = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((s, _)) = silent.accept().await {
            held.push(s);
        }
    });
    let err = http
        .get(format!("http://{silent_addr}/"))
        .timeout(Duration::from_millis(50))
        .send()
        .await
        .unwrap_err();
    assert_eq!(err.error_kind(), ErrorKind::AttemptTimeout, "{err:?}");
    let boxed: levee_agent::BoxError = err.into();
    assert_eq!(boxed.error_kind(), ErrorKind::AttemptTimeout);
}

/// `HttpStatusError::check` keeps the server's `Retry-After`, which a `reqwest::Error`
/// cannot: asked to wait 5 s with 500 ms left, the call stops after one attempt instead of
/// retrying (RT-3), also through a boxed error.
#[cfg(feature = "reqwest")]
#[tokio::test]
async fn http_status_error_keeps_retry_after_from_the_response() {
    use levee_agent::retry::{Classify, ErrorKind, HttpStatusError};

    let hits = Arc::new(AtomicU32::new(0));
    let counter = hits.clone();
    let app = axum::Router::new().route(
        "/busy",
        axum::routing::get(move || {
            counter.fetch_add(1, Ordering::SeqCst);
            async { (http::StatusCode::SERVICE_UNAVAILABLE, [(http::header::RETRY_AFTER, "5")], "busy") }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    let agent = agent(RETRYING);
    let dep = agent.dependency("dep");
    let http = reqwest::Client::new();
    let url = format!("http://{addr}/busy");

    let err = with_deadline(Deadline::after(Duration::from_millis(500)), async {
        dep.call("GET /busy", || async {
            let res = http.get(&url).send().await.map_err(levee_agent::BoxError::from)?;
            Ok::<_, levee_agent::BoxError>(HttpStatusError::check(res)?.status())
        })
        .await
    })
    .await
    .unwrap_err();
    assert_eq!(hits.load(Ordering::SeqCst), 1, "no retry before the server's Retry-After");
    assert!(matches!(err, CallError::DeadlineExceeded(..)), "{err:?}");
    assert!(err.to_string().contains("retry after 5s"), "{err}");

    let res = http.get(&url).send().await.unwrap();
    let e = HttpStatusError::check(res).unwrap_err();
    assert_eq!(e.status(), http::StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!((e.error_kind(), e.retry_after()), (ErrorKind::HttpStatus(503), Some(Duration::from_secs(5))));
    let ok = http.get(format!("http://{addr}/missing")).send().await.unwrap();
    assert_eq!(
        HttpStatusError::check(ok).unwrap().status(),
        http::StatusCode::NOT_FOUND,
        "a 404 is an answer"
    );
}

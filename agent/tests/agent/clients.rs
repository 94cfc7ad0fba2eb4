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
use levee_agent::{Agent, CallError, GrpcPolicy, HttpPolicy};
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
    with_criticality: AtomicU32,
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
                if headers.get("levee-criticality").is_some_and(|v| v == "CRITICAL") {
                    seen.with_criticality.fetch_add(1, Ordering::SeqCst);
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

/// A hyper client under the tower layer with `HttpPolicy`: 503s are retried (GET is
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
        ServiceBuilder::new().layer(dep.layer().operation("GET /price").policy(HttpPolicy)).service(client);
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

/// A tonic channel under the tower layer with `GrpcPolicy`: UNAVAILABLE answers count as
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
    let svc = ServiceBuilder::new().layer(dep.layer().operation(CHECK).policy(GrpcPolicy)).service(channel);
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
    let svc = ServiceBuilder::new().layer(dep.layer().operation(CHECK).policy(GrpcPolicy)).service(channel);
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

/// A `reqwest::Client` as a tower service under the layer with `HttpPolicy` (feature
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
        .layer(dep.layer().operation("GET /price").policy(HttpPolicy))
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

/// A 300 ms attempt timeout under a 1 s deadline, for the late-body tests.
const SHORT_ATTEMPT: &str = r#"{"retry": {"max_attempts": 1}, "attempt_timeout": "300ms"}"#;

/// An HTTP server whose `/late` answers its head at once and its body 2 s later.
async fn late_body_server() -> SocketAddr {
    let app = axum::Router::new().route(
        "/late",
        axum::routing::get(|| async {
            let body = async_stream::stream! {
                tokio::time::sleep(Duration::from_secs(2)).await;
                yield Ok::<_, std::io::Error>(Bytes::from_static(b"late"));
            };
            axum::body::Body::from_stream(body)
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    addr
}

/// The body's lateness is cut at the attempt timeout (300 ms), well before the 1 s
/// deadline and the 2 s the body takes: `elapsed` is bounded on both sides and the error
/// says it was the attempt's timer.
fn assert_cut_at_the_attempt_timeout(elapsed: Duration, err: &(dyn std::error::Error + 'static)) {
    assert!(elapsed >= Duration::from_millis(300), "cut before the attempt timeout: {elapsed:?}");
    assert!(elapsed < Duration::from_millis(900), "the late body was waited for: {elapsed:?}");
    let mut cur = Some(err);
    while let Some(e) = cur {
        if let Some(t) = e.downcast_ref::<levee_agent::AttemptTimeout>() {
            assert_eq!(t.timeout().as_millis().div_ceil(10), 30, "{t}");
            return;
        }
        cur = e.source();
    }
    panic!("not an attempt timeout: {err:?}");
}

/// Plain path: the body read inside the attempt future is under the attempt timeout.
#[cfg(feature = "reqwest")]
#[tokio::test]
async fn late_body_fails_at_the_attempt_timeout_through_a_plain_call() {
    let addr = late_body_server().await;
    let agent = agent(SHORT_ATTEMPT);
    let dep = agent.dependency("dep");
    let http = reqwest::Client::new();
    let url = format!("http://{addr}/late");
    let started = tokio::time::Instant::now();
    let err = with_deadline(Deadline::after(Duration::from_secs(1)), async {
        dep.call("GET /late", || async {
            let res = http.get(&url).send().await?;
            Ok::<_, levee_agent::BoxError>(res.bytes().await?)
        })
        .await
    })
    .await
    .unwrap_err();
    let elapsed = started.elapsed();
    assert_cut_at_the_attempt_timeout(elapsed, err.into_box().as_ref());
}

/// Tower path (hyper client, `HttpPolicy`): the head comes back at once, and reading the
/// body fails when the attempt's time is up — not after the 2 s the body takes.
#[tokio::test]
async fn late_body_fails_at_the_attempt_timeout_through_the_tower_layer() {
    let addr = late_body_server().await;
    let agent = agent(SHORT_ATTEMPT);
    let dep = agent.dependency("dep");
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build_http::<Full<Bytes>>();
    let mut svc = ServiceBuilder::new().layer(dep.layer().policy(HttpPolicy)).service(client);
    let started = tokio::time::Instant::now();
    let err = with_deadline(Deadline::after(Duration::from_secs(1)), async {
        let req = http::Request::get(format!("http://{addr}/late")).body(Full::new(Bytes::new())).unwrap();
        let res = svc.ready().await.unwrap().call(req).await.expect("the head is on time");
        assert_eq!(res.status(), http::StatusCode::OK);
        res.into_body().collect().await.map(|_| ())
    })
    .await
    .unwrap_err();
    assert_cut_at_the_attempt_timeout(started.elapsed(), err.as_ref());
}

/// Tower path on a `reqwest::Client` (feature `reqwest`): reqwest's own timeout is set to
/// what is left of the attempt, and reqwest applies it to the body.
#[cfg(feature = "reqwest")]
#[tokio::test]
async fn late_body_fails_at_the_attempt_timeout_through_a_reqwest_tower_service() {
    let addr = late_body_server().await;
    let agent = agent(SHORT_ATTEMPT);
    let dep = agent.dependency("dep");
    let http = reqwest::Client::new();
    let mut svc = ServiceBuilder::new().layer(dep.layer().policy(HttpPolicy)).service(http.clone());
    let started = tokio::time::Instant::now();
    let err = with_deadline(Deadline::after(Duration::from_secs(1)), async {
        let req = http.get(format!("http://{addr}/late")).build().unwrap();
        let res = svc.ready().await.unwrap().call(req).await.expect("the head is on time");
        res.bytes().await
    })
    .await
    .unwrap_err();
    let elapsed = started.elapsed();
    assert!(err.is_timeout(), "{err:?}");
    assert!(elapsed >= Duration::from_millis(290) && elapsed < Duration::from_millis(900), "{elapsed:?}");
}

/// `reqwest-middleware`: a `ClientWithMiddleware` whose plain `get(url).send()` is
/// enforced. The body is read inside the attempt, so the late body fails the `send()`
/// itself at the attempt timeout.
#[cfg(feature = "reqwest-middleware")]
#[tokio::test]
async fn late_body_fails_at_the_attempt_timeout_through_the_middleware() {
    let addr = late_body_server().await;
    let agent = agent(SHORT_ATTEMPT);
    let client = reqwest_middleware::ClientBuilder::new(reqwest::Client::new())
        .with(agent.dependency("dep").middleware())
        .build();
    let started = tokio::time::Instant::now();
    let err = with_deadline(Deadline::after(Duration::from_secs(1)), async {
        client.get(format!("http://{addr}/late")).send().await
    })
    .await
    .unwrap_err();
    let reqwest_middleware::Error::Middleware(e) = &err else { panic!("{err:?}") };
    assert_cut_at_the_attempt_timeout(started.elapsed(), e.as_ref());
    assert_eq!(agent.dependency("dep").breaker("dep").window.calls, 1, "the breaker saw the failed attempt");
}

/// `reqwest-middleware`: through `client.get(url).send()` alone, 503s are retried (GET is
/// idempotent), every attempt carries the attempt's deadline and the retry marker, the
/// body arrives intact, and the breaker saw every attempt.
#[cfg(feature = "reqwest-middleware")]
#[tokio::test]
async fn middleware_enforces_a_plain_send_retries_5xx_and_propagates() {
    use levee_agent::Operation;
    let seen = Arc::new(Seen::default());
    let addr = http_server(2, seen.clone()).await;
    let agent = agent(RETRYING);
    let dep = agent.dependency("dep");
    let client =
        reqwest_middleware::ClientBuilder::new(reqwest::Client::new()).with(dep.middleware()).build();
    let res = with_deadline(Deadline::after(Duration::from_secs(1)), async {
        client
            .get(format!("http://{addr}/price"))
            .with_extension(Operation::from_static("GET /price"))
            .send()
            .await
    })
    .await
    .expect("the third attempt succeeds");
    assert_eq!(res.status(), reqwest::StatusCode::OK);
    assert_eq!(res.url().path(), "/price");
    assert_eq!(res.text().await.unwrap(), "42");
    assert_eq!(seen.hits.load(Ordering::SeqCst), 3, "two 503s retried, then the 200");
    assert_eq!(seen.marked.load(Ordering::SeqCst), 3, "every attempt says it is retried upstream");
    assert_eq!(seen.with_deadline.load(Ordering::SeqCst), 3, "every attempt carries its deadline");
    assert_eq!(seen.with_criticality.load(Ordering::SeqCst), 3, "and the request's criticality");
    assert_eq!(dep.breaker("GET /price").window.calls, 3, "the breaker saw each attempt");
}

/// `reqwest-middleware`: a 429 whose `Retry-After` (5 s) does not fit the deadline ends
/// the call after one attempt, the 429 handed back; three 503s open the breaker, which
/// then refuses locally, found with `downcast_ref` on the middleware error.
#[cfg(feature = "reqwest-middleware")]
#[tokio::test]
async fn middleware_honours_retry_after_and_refuses_when_the_breaker_is_open() {
    let hits = Arc::new(AtomicU32::new(0));
    let counter = hits.clone();
    let app = axum::Router::new().route(
        "/busy",
        axum::routing::get(move || {
            counter.fetch_add(1, Ordering::SeqCst);
            async { (http::StatusCode::TOO_MANY_REQUESTS, [(http::header::RETRY_AFTER, "5")], "busy") }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    let agent = agent(RETRYING);
    let client = reqwest_middleware::ClientBuilder::new(reqwest::Client::new())
        .with(agent.dependency("dep").middleware())
        .build();
    let res = with_deadline(Deadline::after(Duration::from_millis(500)), async {
        client.get(format!("http://{addr}/busy")).send().await
    })
    .await
    .expect("when retries end on an answer, the answer is handed back");
    assert_eq!(res.status(), http::StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(hits.load(Ordering::SeqCst), 1, "no retry before the server's Retry-After");

    let seen = Arc::new(Seen::default());
    let failing = http_server(u32::MAX, seen.clone()).await;
    let breaking = self::agent(BREAKING);
    let client = reqwest_middleware::ClientBuilder::new(reqwest::Client::new())
        .with(breaking.dependency("dep").middleware())
        .build();
    for _ in 0..3 {
        let res = client.get(format!("http://{failing}/price")).send().await.expect("a 503 is an answer");
        assert_eq!(res.status(), http::StatusCode::SERVICE_UNAVAILABLE);
    }
    let err = client.get(format!("http://{failing}/price")).send().await.unwrap_err();
    let reqwest_middleware::Error::Middleware(e) = &err else { panic!("{err:?}") };
    assert!(e.downcast_ref::<levee_agent::breaker::BreakerOpen>().is_some(), "{e:?}");
    assert_eq!(seen.hits.load(Ordering::SeqCst), 3, "refused locally");
}

/// `reqwest-middleware`, the three failure channels folded into one answer: a 503 that
/// survived the retries (an `Ok` of `send`), Levee's own refusal (an opaque error of
/// `send`, asked with `Refused::refusal` instead of downcasting) and a success — each
/// through `send_or_fallback`, which says the level as `call_or_fallback` does.
#[cfg(feature = "reqwest-middleware")]
#[tokio::test]
async fn middleware_refusals_are_typed_and_send_or_fallback_reports_the_level() {
    use levee_agent::policy::FallbackLevel;
    use levee_agent::{Refusal, Refused};
    let seen = Arc::new(Seen::default());
    let failing = http_server(u32::MAX, seen.clone()).await;
    let agent = agent(
        r#"{"retry": {"max_attempts": 1}, "fallback": "generic",
            "circuit_breaker": {"window": {"type": "count", "size": 10}, "minimum_calls": 3,
                                "failure_rate_threshold": 0.5, "wait_in_open": "60s"}}"#,
    );
    let dep = agent.dependency("dep");
    let client =
        reqwest_middleware::ClientBuilder::new(reqwest::Client::new()).with(dep.middleware()).build();
    let url = format!("http://{failing}/price");
    let read = |res: reqwest::Response| res.text();
    let generic = |_: &CallError<reqwest_middleware::Error>| async { "generic".to_string() };
    // A 503 answer: a failure, with its status, not a refusal.
    let answer = dep.send_or_fallback(client.get(&url), read, generic).await;
    assert_eq!((answer.value.as_str(), answer.level), ("generic", FallbackLevel::Generic));
    let cause = answer.cause.expect("the 503 is the cause");
    assert_eq!(cause.refusal(), None, "the dependency's failure: {cause}");
    let CallError::Inner(reqwest_middleware::Error::Middleware(e)) = &cause else { panic!("{cause:?}") };
    let status = e.downcast_ref::<levee_agent::retry::HttpStatusError>().expect("the failure status");
    assert_eq!(status.status(), http::StatusCode::SERVICE_UNAVAILABLE);
    for _ in 0..2 {
        let _ = client.get(&url).send().await;
    }
    assert_eq!(dep.breaker("dep").state, State::Open);
    // Levee refuses: the plain `send` error says why, and so does the fallback's cause.
    let err = client.get(&url).send().await.unwrap_err();
    assert_eq!(err.refusal(), Some(Refusal::BreakerOpen), "{err}");
    assert!(Refusal::BreakerOpen.before_the_dependency());
    let answer = dep.send_or_fallback(client.get(&url), read, generic).await;
    assert_eq!(answer.level, FallbackLevel::Generic);
    assert!(matches!(answer.cause, Some(CallError::BreakerOpen(_))), "{:?}", answer.cause);
    assert_eq!(answer.cause.unwrap().refusal(), Some(Refusal::BreakerOpen));
    assert_eq!(seen.hits.load(Ordering::SeqCst), 3, "refused locally");
    // A success is the dependency's answer, level FRESH.
    let ok = http_server(0, Arc::new(Seen::default())).await;
    let other = self::agent(r#"{"fallback": "generic"}"#).dependency("dep");
    let client =
        reqwest_middleware::ClientBuilder::new(reqwest::Client::new()).with(other.middleware()).build();
    let answer = other.send_or_fallback(client.get(format!("http://{ok}/price")), read, generic).await;
    assert_eq!(
        (answer.value.as_str(), answer.level, answer.cause.is_none()),
        ("42", FallbackLevel::Fresh, true)
    );
}

/// `levee_calls_total{operation}` says the operation of the call whenever one is set —
/// named in the policy or not — and the dependency's name only for the dependency as a
/// whole (it said the dependency's name for every operation without guards of its own).
#[tokio::test]
async fn calls_are_counted_under_their_operation_label() {
    let recorder = super::prometheus();
    let handle = recorder.handle();
    let _guard = metrics::set_default_local_recorder(&recorder);
    let agent = agent(r#"{"operations": {"GET /price/{user}": {"idempotent": true}}}"#);
    let dep = agent.dependency("dep");
    let ok = || async { Ok::<_, std::io::Error>(()) };
    dep.call("GET /price/{user}", ok).await.unwrap();
    dep.call("GET /stock/{sku}", ok).await.unwrap();
    dep.call("GET /stock/{sku}", ok).await.unwrap();
    dep.call("dep", ok).await.unwrap();
    let rendered = handle.render();
    let calls = |op: &str| {
        super::series(&rendered, "levee_calls_total", &[&format!("operation=\"{op}\""), "outcome=\"ok\""])
    };
    assert_eq!(calls("GET /price/{user}"), Some(1.0), "{rendered}");
    assert_eq!(calls("GET /stock/{sku}"), Some(2.0), "{rendered}");
    assert_eq!(calls("dep"), Some(1.0), "the dependency as a whole: {rendered}");
}

/// Issue 7: one tonic channel under one layer with `GrpcPolicy` and no fixed operation:
/// each call's operation is the gRPC method of its path, so the method's own override in
/// the policy (here a breaker that opens after 3 failures) applies to it, and the calls are
/// counted under the method's name — not under the dependency's.
#[tokio::test]
async fn grpc_policy_takes_the_operation_from_the_method_path() {
    let recorder = super::prometheus();
    let handle = recorder.handle();
    let _guard = metrics::set_default_local_recorder(&recorder);
    let hits = Arc::new(AtomicU32::new(0));
    let addr = grpc_server(u32::MAX, hits.clone()).await;
    let agent = agent(
        r#"{"retry": {"max_attempts": 1},
            "operations": {"/grpc.health.v1.Health/Check": {"circuit_breaker":
                {"window": {"type": "count", "size": 10}, "minimum_calls": 3,
                 "failure_rate_threshold": 0.5, "wait_in_open": "60s"}}}}"#,
    );
    let dep = agent.dependency("dep");
    let channel =
        tonic::transport::Endpoint::from_shared(format!("http://{addr}")).unwrap().connect().await.unwrap();
    let svc = ServiceBuilder::new().layer(dep.layer().policy(GrpcPolicy)).service(channel);
    let mut client = HealthClient::new(svc);
    for _ in 0..3 {
        let status = client.check(HealthCheckRequest { service: String::new() }).await.unwrap_err();
        assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}");
    }
    assert_eq!(dep.breaker(CHECK).state, State::Open, "the method's own breaker saw its 3 failures");
    assert_eq!(dep.breaker("dep").state, State::Closed, "the dependency's breaker is not the method's");
    let refused = client.check(HealthCheckRequest { service: String::new() }).await.unwrap_err();
    assert_eq!(hits.load(Ordering::SeqCst), 3, "the method's open breaker refused locally: {refused:?}");
    let rendered = handle.render();
    let calls = |op: &str, outcome: &str| {
        super::series(
            &rendered,
            "levee_calls_total",
            &[&format!("operation=\"{op}\""), &format!("outcome=\"{outcome}\"")],
        )
    };
    assert_eq!(calls(CHECK, "failed"), Some(3.0), "{rendered}");
    assert_eq!(calls(CHECK, "breaker_open"), Some(1.0), "{rendered}");
    assert_eq!(calls("dep", "failed"), Some(0.0), "{rendered}");
}

/// Issue 7: operation names taken from request paths are bounded per dependency: the first
/// `MAX_LABELLED_OPERATIONS` (64) methods are labelled by name, every later one shares
/// `_other` (`OTHER_OPERATION`), and all calls are still counted. Paths that are not
/// `/service/method` fall back to the layer's operation. Real HTTP on loopback.
#[tokio::test]
async fn grpc_method_names_are_bounded_per_dependency() {
    use levee_agent::enforce::{MAX_LABELLED_OPERATIONS, OTHER_OPERATION};
    let recorder = super::prometheus();
    let handle = recorder.handle();
    let _guard = metrics::set_default_local_recorder(&recorder);
    let app = axum::Router::new().fallback(|| async { "ok" });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    let agent = agent(r#"{"retry": {"max_attempts": 1}}"#);
    let dep = agent.dependency("dep");
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build_http::<Full<Bytes>>();
    let mut svc =
        ServiceBuilder::new().layer(dep.layer().operation("fixed").policy(GrpcPolicy)).service(client);
    // The layer's operation takes the first label slot, so 63 remain for methods.
    for path in ["/health", "/a/b/c", "//m"] {
        let req = http::Request::get(format!("http://{addr}{path}")).body(Full::new(Bytes::new())).unwrap();
        svc.ready().await.unwrap().call(req).await.unwrap();
    }
    let extra = 6;
    for i in 0..MAX_LABELLED_OPERATIONS + extra {
        let req =
            http::Request::post(format!("http://{addr}/pkg.Svc/M{i}")).body(Full::new(Bytes::new())).unwrap();
        let res = svc.ready().await.unwrap().call(req).await.unwrap();
        assert_eq!(res.status(), http::StatusCode::OK);
    }
    let rendered = handle.render();
    let ok = |op: &str| {
        super::series(&rendered, "levee_calls_total", &[&format!("operation=\"{op}\""), "outcome=\"ok\""])
    };
    let labelled =
        (0..MAX_LABELLED_OPERATIONS + extra).filter(|i| ok(&format!("/pkg.Svc/M{i}")).is_some()).count();
    assert_eq!(labelled, MAX_LABELLED_OPERATIONS - 1, "{rendered}");
    assert_eq!(ok(OTHER_OPERATION), Some((extra + 1) as f64), "{rendered}");
    assert_eq!(ok("fixed"), Some(3.0), "paths that name no method take the layer's: {rendered}");
}

//! The example shop: two real HTTP dependencies and a checkout service embedding the agent,
//! showing the whole crate at work.
//!
//! * `pricing` (critical): `GET /price/{user}` → the cart total.
//! * `recommendations` (non-critical): `GET /recommendations/{user}` → personal picks.
//! * Both are steered at runtime with `POST /control {"delay_ms": 5000, "fail": false}`, to
//!   play an incident.
//! * `checkout`: `GET /checkout/{user}` calls both through `reqwest-middleware` clients
//!   carrying the Levee middleware (`dependency.middleware()`): kill switch, deadline,
//!   bulkhead, retry, breaker and attempt timeout on a plain `client.get(url).send()`. The
//!   recommendations are the feature "Personal recommendations" of the degradation matrix,
//!   served through `Feature::serve`: when recommendations is switched off in Levee (flag
//!   `recommendations.enabled`), slow or failing, checkout answers with top sellers
//!   instead, marked `"degraded"`. Its inbound side goes through Levee's admission layer:
//!   the route is CRITICAL in the policy, so under overload SHEDDABLE callers are shed
//!   first (`levee-criticality` header).
//! * Around the routes, the agent's inbound context layer gives every request its deadline
//!   (the policy's `default_deadline`, or the caller's `levee-deadline-ms`), criticality and
//!   retry marker. `GET /ready` answers 200 while every critical dependency can be called,
//!   `GET /metrics` is the Prometheus exposition of the agent's metrics, and
//!   `GET /levee/status` the agent's status as JSON.
//!
//! This file is also compiled into the server's end-to-end tests.

#![allow(dead_code)]

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::routing::{get, post};
use axum::{Json, Router};
use levee_agent::admission::RouteTemplate;
use levee_agent::feature::Feature;
use levee_agent::policy::{
    BulkheadPolicy, CircuitBreakerPolicy, Criticality, DependencyCriticality, DependencyPolicy,
    FallbackLevel, Flag, FlagType, MatrixRow, Policy, Retry, Route, ServiceConfig, Window,
};
use levee_agent::{Agent, Operation};
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use reqwest_middleware::{ClientBuilder, ClientWithMiddleware};
use serde::{Deserialize, Serialize};
use serde_json::json;
use tokio::net::TcpListener;

/// Top sellers: the generic answer when personal recommendations are unavailable.
pub const TOP_SELLERS: [&str; 3] = ["bestseller-1", "bestseller-2", "bestseller-3"];

/// The feature of the degradation matrix that the recommendations make up.
pub const RECOMMENDATIONS_FEATURE: &str = "Personal recommendations";

/// The checkout service's compiled-in safe defaults: used before the first sync and
/// whenever neither the server nor the disk cache has a configuration. A dependency (or a
/// matrix row) that the live policy names is taken from the live policy as a whole, not
/// merged field by field with these.
pub fn safe_defaults() -> ServiceConfig {
    let mut cfg = ServiceConfig {
        policy: Policy { default_deadline: Duration::from_millis(800), ..Policy::default() },
        ..Default::default()
    };
    cfg.policy.dependencies.insert(
        "pricing".into(),
        DependencyPolicy {
            criticality: DependencyCriticality::Critical,
            attempt_timeout: Duration::from_millis(300),
            retry: Retry { max_attempts: 2, cap: Duration::from_millis(500), ..Retry::default() },
            bulkhead: BulkheadPolicy { max_concurrent: 40, max_wait: Duration::from_millis(10) },
            fallback: FallbackLevel::FeatureError,
            ..DependencyPolicy::default()
        },
    );
    cfg.policy.dependencies.insert(
        "recommendations".into(),
        DependencyPolicy {
            criticality: DependencyCriticality::NonCritical,
            enabled_flag: Some("recommendations.enabled".into()),
            attempt_timeout: Duration::from_millis(80),
            retry: Retry { max_attempts: 1, ..Retry::default() },
            circuit_breaker: CircuitBreakerPolicy {
                window: Window::Time { seconds: 10 },
                minimum_calls: 10,
                wait_in_open: Duration::from_secs(5),
                ..CircuitBreakerPolicy::default()
            },
            bulkhead: BulkheadPolicy { max_concurrent: 10, max_wait: Duration::ZERO },
            fallback: FallbackLevel::Generic,
            ..DependencyPolicy::default()
        },
    );
    // Inbound admission per route (the template, never the raw path): checkout is what
    // pays, so this read is marked CRITICAL (reads are SHEDDABLE_PLUS by default); a caller
    // may lower its own requests with `levee-criticality: SHEDDABLE`.
    cfg.policy.inbound.routes.insert(
        "GET /checkout/{user}".into(),
        Route { criticality: Some(Criticality::Critical), ..Route::default() },
    );
    cfg.policy.degradation_matrix.push(MatrixRow {
        feature: RECOMMENDATIONS_FEATURE.into(),
        dependencies: vec!["recommendations".into()],
        on_failure: FallbackLevel::Generic,
        owner: "growth team".into(),
        decision: "top sellers are good enough while personal picks are down".into(),
        runbook: "https://runbooks.example.com/growth/recommendations".into(),
        alert_after: Duration::from_secs(30 * 60),
        enabled_flag: None,
    });
    cfg.flags.insert(
        "recommendations.enabled".into(),
        Flag {
            kind: FlagType::Bool,
            value: json!(true),
            description: "Kill switch for personal recommendations".into(),
            owner: "growth team".into(),
            expires_at: None,
            stale: Default::default(),
            rollout: None,
        },
    );
    cfg
}

/// Runtime knobs of a fake dependency (pricing or recommendations), set with its
/// `POST /control`.
#[derive(Debug, Default)]
pub struct DependencyControl {
    /// Added latency, ms.
    pub delay_ms: AtomicU64,
    /// Answer 503 when set.
    pub fail: AtomicBool,
    /// Requests received.
    pub hits: AtomicU64,
}

/// The knobs of the recommendations service (its tests steer it directly).
pub type RecsControl = DependencyControl;

#[derive(Debug, Deserialize)]
struct ControlBody {
    #[serde(default)]
    delay_ms: u64,
    #[serde(default)]
    fail: bool,
}

async fn serve(router: Router, addr: SocketAddr) -> std::io::Result<SocketAddr> {
    let listener = TcpListener::bind(addr).await?;
    let local = listener.local_addr()?;
    tokio::spawn(async move {
        let _ = axum::serve(listener, router).await;
    });
    Ok(local)
}

/// A fake dependency: `route` answers `answer(user)` after the configured delay (or 503),
/// and `POST /control` sets delay and failure.
fn fake_dependency(
    route: &str,
    control: Arc<DependencyControl>,
    answer: fn(String) -> serde_json::Value,
) -> Router {
    Router::new()
        .route(
            route,
            get(move |State(c): State<Arc<DependencyControl>>, Path(user): Path<String>| async move {
                c.hits.fetch_add(1, Ordering::Relaxed);
                let delay = c.delay_ms.load(Ordering::Relaxed);
                if delay > 0 {
                    tokio::time::sleep(Duration::from_millis(delay)).await;
                }
                if c.fail.load(Ordering::Relaxed) {
                    return Err(StatusCode::SERVICE_UNAVAILABLE);
                }
                Ok(Json(answer(user)))
            }),
        )
        .route(
            "/control",
            post(|State(c): State<Arc<DependencyControl>>, Json(b): Json<ControlBody>| async move {
                c.delay_ms.store(b.delay_ms, Ordering::Relaxed);
                c.fail.store(b.fail, Ordering::Relaxed);
                Json(json!({"delay_ms": b.delay_ms, "fail": b.fail}))
            }),
        )
        .with_state(control)
}

/// Starts `pricing` on `addr` (port 0 for any).
pub async fn start_pricing(addr: SocketAddr) -> std::io::Result<SocketAddr> {
    let control = Arc::new(DependencyControl::default());
    serve(fake_dependency("/price/{user}", control, |user| json!({"user": user, "total_cents": 4200})), addr)
        .await
}

/// Starts `recommendations` on `addr`, steered by `control`.
pub async fn start_recommendations(
    addr: SocketAddr,
    control: Arc<RecsControl>,
) -> std::io::Result<SocketAddr> {
    let answer = |user: String| json!([format!("for-{user}-1"), format!("for-{user}-2")]);
    serve(fake_dependency("/recommendations/{user}", control, answer), addr).await
}

/// What `GET /checkout/{user}` answers.
#[derive(Debug, Serialize, Deserialize, PartialEq)]
pub struct CheckoutPage {
    /// User.
    pub user: String,
    /// Cart total from pricing.
    pub total_cents: u64,
    /// Recommendations shown.
    pub recommendations: Vec<String>,
    /// `FRESH` (personal picks) or the fallback level that produced them.
    pub recommendations_level: String,
    /// Features served degraded, with the reason.
    pub degraded: Vec<String>,
}

#[derive(Clone, Debug)]
struct Checkout {
    /// `reqwest` clients carrying the Levee middleware of their dependency.
    pricing: ClientWithMiddleware,
    recommendations: ClientWithMiddleware,
    pricing_url: String,
    recs_url: String,
    /// The feature the recommendations make up (degradation matrix row).
    recs_feature: Feature,
}

const PRICING_OP: &str = "GET /price/{user}";
const RECS_OP: &str = "GET /recommendations/{user}";

/// A GET through a client with the Levee middleware: the call is enforced, the answer
/// judged (a 5xx after the last attempt comes back as an answer, turned into an error
/// here), and the body was read inside the attempt.
async fn get_json<T: serde::de::DeserializeOwned>(
    client: &ClientWithMiddleware,
    url: &str,
    operation: &'static str,
) -> Result<T, String> {
    let res = client
        .get(url)
        .with_extension(Operation::from_static(operation))
        .send()
        .await
        .map_err(|e| levee_agent::report::ErrorChain(&e).to_string())?;
    if !res.status().is_success() {
        return Err(format!("status {}", res.status()));
    }
    res.json().await.map_err(|e| e.to_string())
}

async fn checkout(
    State(c): State<Checkout>,
    Path(user): Path<String>,
) -> Result<Json<CheckoutPage>, (StatusCode, Json<serde_json::Value>)> {
    // Critical: no price, no checkout page; say so clearly.
    let total: serde_json::Value =
        get_json(&c.pricing, &format!("{}/price/{user}", c.pricing_url), PRICING_OP).await.map_err(|e| {
            (StatusCode::SERVICE_UNAVAILABLE, Json(json!({"error": "pricing unavailable", "detail": e})))
        })?;
    // Non-critical: a feature of the degradation matrix, degrading to top sellers.
    let mut cause = None;
    let recs_url = format!("{}/recommendations/{user}", c.recs_url);
    let primary = async {
        let r = get_json::<Vec<String>>(&c.recommendations, &recs_url, RECS_OP).await;
        if let Err(e) = &r {
            cause = Some(e.clone());
        }
        r
    };
    let served = c
        .recs_feature
        .serve(primary, |level| async move {
            match level {
                FallbackLevel::Generic => Ok(TOP_SELLERS.iter().map(|s| s.to_string()).collect()),
                FallbackLevel::EmptyMarked => Ok(Vec::new()),
                _ => Err("no stale copy kept"),
            }
        })
        .await;
    let (recommendations, level) = match served {
        Ok(s) => (s.value, s.level),
        Err(_) => (Vec::new(), FallbackLevel::FeatureError),
    };
    let mut degraded = Vec::new();
    if level != FallbackLevel::Fresh {
        let why = cause.unwrap_or_else(|| "switched off in the degradation matrix".into());
        degraded.push(format!("recommendations: {why}"));
    }
    Ok(Json(CheckoutPage {
        user,
        total_cents: total["total_cents"].as_u64().unwrap_or(0),
        recommendations,
        recommendations_level: level.as_str().to_string(),
        degraded,
    }))
}

/// The Prometheus handle of this process: the agent's metrics go through the `metrics`
/// facade, recorded by the exporter installed here once (a process that installed another
/// recorder first gets an empty exposition). Call it before building the agent: a metric
/// handle registered earlier records nowhere.
pub fn metrics_handle() -> PrometheusHandle {
    METRICS
        .get_or_init(|| {
            let recorder = PrometheusBuilder::new().build_recorder();
            let handle = recorder.handle();
            let _ = metrics::set_global_recorder(recorder);
            handle
        })
        .clone()
}

static METRICS: std::sync::OnceLock<PrometheusHandle> = std::sync::OnceLock::new();

/// For a process that installs its own Prometheus recorder (the server's end-to-end tests
/// run Levee and this example in one process): checkout's `/metrics` renders `handle`, and
/// [`metrics_handle`] installs nothing. Call it before [`start_checkout`]; later it does
/// nothing.
pub fn adopt_metrics_handle(handle: PrometheusHandle) {
    let _ = METRICS.set(handle);
}

/// `GET /levee/status`: the agent's status (source, revision, age, connection, last
/// error), readiness, and each dependency's kill switch and breaker, as JSON.
fn status_json(agent: &Agent) -> serde_json::Value {
    let deps: serde_json::Map<String, serde_json::Value> = [
        ("pricing", PRICING_OP),
        ("recommendations", RECS_OP),
    ]
    .into_iter()
    .map(|(name, op)| {
        let d = agent.dependency(name);
        let b = d.breaker(op);
        (
            name.to_string(),
            json!({"enabled": d.is_enabled(), "breaker": b.state.as_str(), "failure_rate": b.failure_rate}),
        )
    })
    .collect();
    json!({"agent": agent.status(), "ready": agent.readiness(), "dependencies": deps})
}

/// Starts `checkout` on `addr`, calling pricing and recommendations through `agent`.
pub async fn start_checkout(
    addr: SocketAddr,
    agent: &Agent,
    pricing: SocketAddr,
    recs: SocketAddr,
) -> std::io::Result<SocketAddr> {
    // Before the dependency handles: metrics handles bind to the recorder of their time.
    let metrics = metrics_handle();
    let http = reqwest::Client::builder().pool_max_idle_per_host(64).build().expect("client");
    let state = Checkout {
        pricing: ClientBuilder::new(http.clone()).with(agent.dependency("pricing").middleware()).build(),
        recommendations: ClientBuilder::new(http)
            .with(agent.dependency("recommendations").middleware())
            .build(),
        pricing_url: format!("http://{pricing}"),
        recs_url: format!("http://{recs}"),
        recs_feature: agent.feature(RECOMMENDATIONS_FEATURE),
    };
    // The shop's own routes, with inbound admission (limit, criticality, queue, levers)
    // around them only; the template names the route (axum's MatchedPath does too when
    // the `axum` feature is on).
    let shop = Router::new()
        .route("/checkout/{user}", get(checkout))
        .route_layer(agent.admission_layer())
        .route_layer(axum::Extension(RouteTemplate("/checkout/{user}".into())))
        .with_state(state);
    let (ready_agent, status_agent) = (agent.clone(), agent.clone());
    let operations = Router::new()
        .route(
            "/ready",
            get(move || {
                let ready = ready_agent.readiness();
                async move {
                    if ready {
                        (StatusCode::OK, "ready")
                    } else {
                        (StatusCode::SERVICE_UNAVAILABLE, "not ready")
                    }
                }
            }),
        )
        .route("/metrics", get(move || std::future::ready(metrics.render())))
        .route(
            "/levee/status",
            get(move || std::future::ready(Json(status_json(&status_agent)).into_response())),
        );
    // Every request gets its deadline, criticality and retry marker from the agent's
    // inbound context layer (after routing, so routes are keyed by their template).
    let router = shop.merge(operations).layer(agent.inbound_layer());
    serve(router, addr).await
}

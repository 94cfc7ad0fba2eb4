//! The example shop: two real HTTP dependencies and a checkout service embedding the agent.
//!
//! * `pricing` (critical): `GET /price/{user}` → the cart total.
//! * `recommendations` (non-critical): `GET /recommendations/{user}` → personal picks. Its
//!   behaviour is steered at runtime with `POST /control {"delay_ms": 5000, "fail": false}`,
//!   to play an incident.
//! * `checkout`: `GET /checkout/{user}` calls both through the Levee agent. When
//!   recommendations is switched off in Levee (flag `recommendations.enabled`), slow or
//!   failing, checkout answers with top sellers instead, marked `"degraded"`. Its inbound
//!   side goes through Levee's admission layer: the route is CRITICAL in the policy, so
//!   under overload SHEDDABLE callers are shed first (`levee-criticality` header).
//!
//! This file is also compiled into the server's end-to-end tests.

#![allow(dead_code)]

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::routing::{get, post};
use axum::{Json, Router};
use levee_agent::admission::RouteTemplate;
use levee_agent::policy::{
    BulkheadPolicy, CircuitBreakerPolicy, Criticality, DependencyCriticality, DependencyPolicy,
    FallbackLevel, Flag, FlagType, Policy, Retry, Route, ServiceConfig, Window,
};
use levee_agent::retry::{Classify, ErrorKind};
use levee_agent::{Agent, Dependency};
use serde::{Deserialize, Serialize};
use serde_json::json;
use tokio::net::TcpListener;

/// Top sellers: the generic answer when personal recommendations are unavailable.
pub const TOP_SELLERS: [&str; 3] = ["bestseller-1", "bestseller-2", "bestseller-3"];

/// The checkout service's compiled-in safe defaults: used before the first sync and
/// whenever neither the server nor the disk cache has a configuration.
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
    // pays; a caller may lower its own requests with `levee-criticality: SHEDDABLE`.
    cfg.policy.inbound.routes.insert(
        "GET /checkout/{user}".into(),
        Route { criticality: Criticality::Critical, ..Route::default() },
    );
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

/// Runtime knobs of the fake recommendations service.
#[derive(Debug, Default)]
pub struct RecsControl {
    /// Added latency, ms.
    pub delay_ms: AtomicU64,
    /// Answer 503 when set.
    pub fail: AtomicBool,
    /// Requests received.
    pub hits: AtomicU64,
}

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

/// Starts `pricing` on `addr` (port 0 for any).
pub async fn start_pricing(addr: SocketAddr) -> std::io::Result<SocketAddr> {
    let router = Router::new().route(
        "/price/{user}",
        get(|Path(user): Path<String>| async move { Json(json!({"user": user, "total_cents": 4200})) }),
    );
    serve(router, addr).await
}

/// Starts `recommendations` on `addr`, steered by `control`.
pub async fn start_recommendations(
    addr: SocketAddr,
    control: Arc<RecsControl>,
) -> std::io::Result<SocketAddr> {
    let router = Router::new()
        .route(
            "/recommendations/{user}",
            get(|State(c): State<Arc<RecsControl>>, Path(user): Path<String>| async move {
                c.hits.fetch_add(1, Ordering::Relaxed);
                let delay = c.delay_ms.load(Ordering::Relaxed);
                if delay > 0 {
                    tokio::time::sleep(Duration::from_millis(delay)).await;
                }
                if c.fail.load(Ordering::Relaxed) {
                    return Err(StatusCode::SERVICE_UNAVAILABLE);
                }
                Ok(Json(json!([format!("for-{user}-1"), format!("for-{user}-2")])))
            }),
        )
        .route(
            "/control",
            post(|State(c): State<Arc<RecsControl>>, Json(b): Json<ControlBody>| async move {
                c.delay_ms.store(b.delay_ms, Ordering::Relaxed);
                c.fail.store(b.fail, Ordering::Relaxed);
                Json(json!({"delay_ms": b.delay_ms, "fail": b.fail}))
            }),
        )
        .with_state(control);
    serve(router, addr).await
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
    http: reqwest::Client,
    pricing_url: String,
    recs_url: String,
    pricing: Dependency,
    recommendations: Dependency,
}

#[derive(Debug, thiserror::Error)]
enum UpstreamError {
    #[error("transport: {0}")]
    Transport(#[from] reqwest::Error),
    #[error("status {0}")]
    Status(StatusCode),
}

impl Classify for UpstreamError {
    fn error_kind(&self) -> ErrorKind {
        match self {
            UpstreamError::Transport(e) if e.is_connect() => ErrorKind::Connect,
            UpstreamError::Transport(e) if e.is_timeout() => ErrorKind::AttemptTimeout,
            UpstreamError::Transport(_) => ErrorKind::Reset,
            UpstreamError::Status(s) => ErrorKind::HttpStatus(s.as_u16()),
        }
    }
}

/// GET with the request context propagated: remaining deadline, criticality, and the retry
/// marker when this call may be retried (so the service called does not retry again).
async fn get_json<T: serde::de::DeserializeOwned>(
    http: &reqwest::Client,
    url: &str,
    will_retry: bool,
) -> Result<T, UpstreamError> {
    let mut headers = axum::http::HeaderMap::new();
    levee_agent::enforce::propagate(&mut headers, will_retry);
    let res = http.get(url).headers(headers).send().await?;
    if !res.status().is_success() {
        return Err(UpstreamError::Status(res.status()));
    }
    Ok(res.json().await?)
}

async fn checkout(
    State(c): State<Checkout>,
    Path(user): Path<String>,
) -> Result<Json<CheckoutPage>, (StatusCode, Json<serde_json::Value>)> {
    // Critical: no price, no checkout page; say so clearly.
    let price_url = format!("{}/price/{user}", c.pricing_url);
    let op = "GET /price/{user}";
    let retry = c.pricing.will_retry(op);
    let total =
        c.pricing.call(op, || get_json::<serde_json::Value>(&c.http, &price_url, retry)).await.map_err(
            |e| {
                (
                    StatusCode::SERVICE_UNAVAILABLE,
                    Json(json!({"error": "pricing unavailable", "detail": e.to_string()})),
                )
            },
        )?;
    // Non-critical: degrade to top sellers.
    let recs_url = format!("{}/recommendations/{user}", c.recs_url);
    let op = "GET /recommendations/{user}";
    let retry = c.recommendations.will_retry(op);
    let recs = c
        .recommendations
        .call_or_fallback(
            op,
            || get_json::<Vec<String>>(&c.http, &recs_url, retry),
            |_| async { TOP_SELLERS.iter().map(|s| s.to_string()).collect() },
        )
        .await;
    let mut degraded = Vec::new();
    if let Some(cause) = &recs.cause {
        degraded.push(format!("recommendations: {cause}"));
    }
    Ok(Json(CheckoutPage {
        user,
        total_cents: total["total_cents"].as_u64().unwrap_or(0),
        recommendations: recs.value,
        recommendations_level: recs.level.as_str().to_string(),
        degraded,
    }))
}

/// Starts `checkout` on `addr`, calling pricing and recommendations through `agent`.
pub async fn start_checkout(
    addr: SocketAddr,
    agent: &Agent,
    pricing: SocketAddr,
    recs: SocketAddr,
) -> std::io::Result<SocketAddr> {
    let state = Checkout {
        http: reqwest::Client::builder().pool_max_idle_per_host(64).build().expect("client"),
        pricing_url: format!("http://{pricing}"),
        recs_url: format!("http://{recs}"),
        pricing: agent.dependency("pricing"),
        recommendations: agent.dependency("recommendations"),
    };
    let status_agent = agent.clone();
    let router = Router::new()
        .route("/checkout/{user}", get(checkout))
        // Admission (limit, criticality, queue, levers) before the handler; the template
        // names the route (axum's MatchedPath does too when the `axum` feature is on).
        .route_layer(agent.admission_layer())
        .route_layer(axum::Extension(RouteTemplate("/checkout/{user}".into())))
        .with_state(state)
        .route(
            "/levee/status",
            get(move || {
                let a = status_agent.clone();
                async move { Json(json!(format!("{:?}", a.status()))) }
            }),
        );
    serve(router, addr).await
}

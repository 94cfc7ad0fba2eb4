//! The JSON API under `/api/v1`, plus `/healthz`, `/readyz` and `/metrics`.
//!
//! Conventions: errors are `application/problem+json` naming the field; bodies are JSON
//! with unknown fields rejected and a size limit (413); every mutation takes a `reason`;
//! policy writes take `If-Match` with the revision read (409 with the current revision on a
//! mismatch). The OpenAPI document is generated from these handlers.

mod audit;
pub(crate) mod auth_routes;
#[cfg(test)]
mod doc_snippets;
pub(crate) mod envs;
mod extract;
pub(crate) mod flags;
mod fleet;
mod openapi;
pub(crate) mod overrides;
pub(crate) mod services;
mod tokens;

use std::sync::Arc;

use axum::Router;
use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderValue, Request, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use metrics_exporter_prometheus::PrometheusHandle;
use tower_http::request_id::{MakeRequestUuid, PropagateRequestIdLayer, SetRequestIdLayer};

pub use extract::{ApiJson, Auth, RequestCtx, SESSION_COOKIE};
pub use openapi::ApiDoc;

use crate::auth::Keys;
use crate::db::Store;
use crate::error::{ApiError, PROBLEM_JSON};
use crate::hub::Hub;

/// Shared state of the HTTP side.
#[derive(Clone, Debug)]
pub struct AppState {
    /// Storage.
    pub store: Store,
    /// Token keys.
    pub keys: Keys,
    /// Fan-out to this replica's agent streams.
    pub hub: Hub,
    /// Body limit in bytes.
    pub max_body_bytes: usize,
    /// Login attempts limiter.
    pub logins: Arc<auth_routes::LoginLimiter>,
    /// Prometheus exporter handle (None when another recorder is installed).
    pub metrics: Option<PrometheusHandle>,
}

/// Builds the whole HTTP application (API, health, metrics; the UI is merged by the caller).
pub fn router(state: AppState) -> Router {
    let api = Router::new()
        .route("/auth/login", post(auth_routes::login))
        .route("/auth/logout", post(auth_routes::logout))
        .route("/environments", get(envs::list).post(envs::create))
        .route("/environments/{env}", get(envs::get_one))
        .route("/environments/{env}/services", get(services::list).post(services::create))
        .route("/environments/{env}/services/{svc}", get(services::get_one))
        .route(
            "/environments/{env}/services/{svc}/policy",
            get(services::get_policy).put(services::put_policy),
        )
        .route("/environments/{env}/services/{svc}/snapshot", get(services::get_snapshot))
        .route("/environments/{env}/services/{svc}/lint", get(services::get_lint))
        .route("/environments/{env}/services/{svc}/revisions", get(services::list_revisions))
        .route("/environments/{env}/services/{svc}/revisions/{rev}", get(services::get_revision))
        .route("/environments/{env}/services/{svc}/revisions/{rev}/diff", get(services::diff_revision))
        .route("/environments/{env}/services/{svc}/rollback", post(services::rollback))
        .route("/environments/{env}/services/{svc}/flags", get(flags::list))
        .route(
            "/environments/{env}/services/{svc}/flags/{key}",
            get(flags::get_one).put(flags::put).patch(flags::patch).delete(flags::delete),
        )
        .route("/environments/{env}/services/{svc}/breaker-overrides", get(overrides::list_overrides))
        .route(
            "/environments/{env}/services/{svc}/breaker-overrides/{dep}",
            axum::routing::put(overrides::put_override).delete(overrides::delete_override),
        )
        .route("/environments/{env}/services/{svc}/faults", get(overrides::list_faults))
        .route(
            "/environments/{env}/services/{svc}/faults/{id}",
            axum::routing::put(overrides::put_fault).delete(overrides::delete_fault),
        )
        .route("/environments/{env}/services/{svc}/agents", get(fleet::agents))
        .route("/environments/{env}/services/{svc}/nacks", get(fleet::nacks))
        .route("/audit", get(audit::list))
        .route("/tokens", get(tokens::list).post(tokens::create))
        .route("/tokens/{id}", axum::routing::delete(tokens::revoke))
        .route("/users", get(tokens::list_users).post(tokens::create_user))
        .route("/openapi.json", get(openapi::document))
        .fallback(not_found);

    Router::new()
        .nest("/api/v1", api)
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics_text))
        .layer(middleware::from_fn_with_state(state.clone(), problem_for_bare_errors))
        .layer(PropagateRequestIdLayer::x_request_id())
        .layer(SetRequestIdLayer::x_request_id(MakeRequestUuid))
        .with_state(state)
}

async fn not_found() -> ApiError {
    ApiError::NotFound("no such API resource".into())
}

/// `GET /healthz`: the process is alive.
async fn healthz() -> &'static str {
    "ok"
}

/// `GET /readyz`: the database answers.
async fn readyz(State(s): State<AppState>) -> Response {
    if s.store.ping().await {
        (StatusCode::OK, "ready").into_response()
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "database unreachable").into_response()
    }
}

/// `GET /metrics`: Prometheus text format.
async fn metrics_text(State(s): State<AppState>) -> Response {
    match &s.metrics {
        Some(h) => ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], h.render()).into_response(),
        None => (StatusCode::NOT_FOUND, "metrics exporter not installed in this process").into_response(),
    }
}

/// Turns error responses produced outside our handlers (axum's 405, path rejections, the
/// body limit) into problem+json, so every error a client sees has the same shape.
async fn problem_for_bare_errors(State(s): State<AppState>, req: Request<Body>, next: Next) -> Response {
    let is_api = req.uri().path().starts_with("/api/");
    let res = next.run(req).await;
    let status = res.status();
    if !is_api || status.as_u16() < 400 {
        return res;
    }
    let ct = res.headers().get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).unwrap_or("");
    if ct.starts_with(PROBLEM_JSON) {
        return res;
    }
    let (parts, body) = res.into_parts();
    let text = axum::body::to_bytes(body, 16 * 1024).await.map(|b| String::from_utf8_lossy(&b).into_owned());
    let detail = match text {
        Ok(t) if !t.trim().is_empty() => t,
        _ => status.canonical_reason().unwrap_or("error").to_lowercase(),
    };
    let err = match status {
        StatusCode::METHOD_NOT_ALLOWED => ApiError::MethodNotAllowed,
        StatusCode::PAYLOAD_TOO_LARGE => ApiError::TooLarge { limit: s.max_body_bytes },
        StatusCode::NOT_FOUND => ApiError::NotFound(detail),
        StatusCode::UNSUPPORTED_MEDIA_TYPE => ApiError::UnsupportedMediaType(detail),
        s if s.is_server_error() => ApiError::Internal(anyhow::anyhow!("{detail}")),
        _ => ApiError::bad_request(detail),
    };
    let mut out = err.into_response();
    if let Some(allow) = parts.headers.get(header::ALLOW) {
        out.headers_mut().insert(header::ALLOW, allow.clone());
    }
    if let StatusCode::PAYLOAD_TOO_LARGE = status {
        out.headers_mut().insert(header::CONNECTION, HeaderValue::from_static("close"));
    }
    out
}

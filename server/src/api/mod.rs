//! The JSON API under `/api/v1`: it turns requests into reads of the store and into
//! [`actions`](crate::actions), and their results and errors into JSON and problem+json.
//!
//! Conventions: errors are `application/problem+json` naming the field; bodies are JSON
//! with unknown fields rejected and a size limit (413); every mutation takes a `reason`;
//! policy writes take `If-Match` with the revision read (409 with the current revision on a
//! mismatch). The OpenAPI document is generated from these handlers.

mod agent_sync;
mod audit;
mod auth_routes;
#[cfg(test)]
mod doc_snippets;
mod envs;
mod error;
mod experiments;
mod extract;
mod flags;
mod fleet;
mod health;
mod ofrep;
mod openapi;
mod overrides;
mod plan;
mod profiles;
mod requests;
mod rollouts;
mod schedule;
mod services;
mod tokens;

use axum::Router;
use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderValue, Request, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};

pub use error::{ApiError, ApiResult, PROBLEM_JSON, Problem};
pub use extract::{ApiJson, ApiQuery, Auth};
pub use ofrep::sidecar_router;
pub use openapi::ApiDoc;

use crate::web::AppState;

/// The routes under `/api/v1`, with problem+json for every error they answer.
pub fn router(state: AppState) -> Router {
    let api = Router::new()
        .route("/auth/login", post(auth_routes::login))
        .route("/auth/logout", post(auth_routes::logout))
        .route("/environments", get(envs::list).post(envs::create))
        .route("/environments/{env}", get(envs::get_one))
        .route("/environments/{env}/services", get(services::list).post(services::create))
        .route(
            "/environments/{env}/services/{svc}",
            get(services::get_one).put(services::put_service).delete(services::delete_service),
        )
        .route("/plan", post(plan::plan))
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
        .route("/environments/{env}/services/{svc}/temporary-flags", get(flags::temporary))
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
        .route("/environments/{env}/services/{svc}/health", get(health::get))
        .route("/sync/{env}/{svc}", get(agent_sync::poll))
        .route("/ofrep/v1/evaluate/flags", post(ofrep::evaluate_all))
        .route("/ofrep/v1/evaluate/flags/{key}", post(ofrep::evaluate_one))
        .route("/environments/{env}/profiles", get(profiles::list))
        .route(
            "/environments/{env}/profiles/{name}",
            get(profiles::get_one).put(profiles::put).delete(profiles::delete),
        )
        .route("/environments/{env}/profiles/{name}/apply", post(profiles::apply))
        .route("/environments/{env}/active-profile", get(profiles::active))
        .route("/environments/{env}/active-profile/revert", post(profiles::revert))
        .route("/environments/{env}/profile-activations", get(profiles::activations))
        .route("/environments/{env}/scheduled-changes", get(schedule::list).post(schedule::create))
        .route(
            "/environments/{env}/scheduled-changes/{id}",
            get(schedule::get_one).patch(schedule::reschedule).delete(schedule::cancel),
        )
        .route(
            "/environments/{env}/rollout-settings",
            get(rollouts::get_settings).put(rollouts::put_settings),
        )
        .route("/environments/{env}/rollouts", get(rollouts::list))
        .route("/environments/{env}/rollouts/{id}", get(rollouts::get_one))
        .route("/environments/{env}/rollouts/{id}/promote", post(rollouts::promote))
        .route("/environments/{env}/rollouts/{id}/pause", post(rollouts::pause))
        .route("/environments/{env}/rollouts/{id}/resume", post(rollouts::resume))
        .route("/environments/{env}/rollouts/{id}/abort", post(rollouts::abort))
        .route("/environments/{env}/approval-rules", get(requests::get_rules).put(requests::put_rules))
        .route("/environments/{env}/change-requests", get(requests::list).post(requests::create))
        .route("/environments/{env}/change-requests/{id}", get(requests::get_one).put(requests::edit))
        .route("/environments/{env}/change-requests/{id}/approve", post(requests::approve))
        .route("/environments/{env}/change-requests/{id}/reject", post(requests::reject))
        .route("/environments/{env}/change-requests/{id}/apply", post(requests::apply))
        .route("/environments/{env}/services/{svc}/revisions/{rev}/propagation", get(fleet::propagation))
        .route("/experiments", get(experiments::list).post(experiments::start))
        .route("/experiments/{id}", get(experiments::get_one))
        .route("/experiments/{id}/stop", post(experiments::stop))
        .route("/audit", get(audit::list))
        .route("/tokens", get(tokens::list).post(tokens::create))
        .route("/tokens/{id}", axum::routing::delete(tokens::revoke))
        .route("/tokens/{id}/rotate", axum::routing::post(tokens::rotate))
        .route("/users", get(tokens::list_users).post(tokens::create_user))
        .route("/users/{username}", axum::routing::patch(tokens::update_user))
        .route("/openapi.json", get(openapi::document))
        .fallback(not_found);

    Router::new()
        .nest("/api/v1", api)
        .layer(middleware::from_fn_with_state(state.clone(), problem_for_bare_errors))
        .with_state(state)
}

async fn not_found() -> ApiError {
    ApiError::NotFound("no such API resource".into())
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

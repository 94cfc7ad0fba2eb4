//! The operator web UI (askama, server-rendered). Minimal for now: the router exists so the
//! application shape is final; pages come with the UI issue.

use axum::Router;
use axum::response::Redirect;
use axum::routing::get;

use crate::api::AppState;

/// Routes of the UI.
pub fn router(_state: AppState) -> Router {
    Router::new().route("/", get(|| async { Redirect::temporary("/api/v1/openapi.json") }))
}

//! What the API and the UI share on the HTTP side: the state every handler gets, the
//! request id and the session cookie. Neither `api` nor `ui` is imported here, so both
//! depend on this module and never on each other.

use std::convert::Infallible;
use std::sync::Arc;

use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use axum::http::{HeaderMap, header};
use metrics_exporter_prometheus::PrometheusHandle;

use crate::actions::Actions;
use crate::auth::{Keys, LoginLimiter};
use crate::db::Store;
use crate::hub::Hub;

/// Name of the UI session cookie (it holds the session JWT; the API reads it for safe
/// methods only).
pub const SESSION_COOKIE: &str = "levee_session";

/// Shared state of the HTTP side. Cheap to clone.
#[derive(Clone, Debug)]
pub struct AppState {
    /// Everything the handlers read.
    pub store: Store,
    /// Every audited write.
    pub actions: Actions,
    /// Verifies tokens and signs sessions and anti-CSRF tokens.
    pub keys: Keys,
    /// Largest request body accepted, in bytes (`LEVEE_MAX_BODY_BYTES`).
    pub max_body_bytes: usize,
    /// Failed logins per username.
    pub logins: Arc<LoginLimiter>,
    /// Renders `/metrics`; `None` when another recorder is installed in this process.
    pub metrics: Option<PrometheusHandle>,
    /// This replica's newest snapshots (the agents' HTTP fallback long-polls it).
    pub hub: Hub,
}

impl AppState {
    /// The state over `store`, whose writes publish to `hub`.
    pub fn new(
        store: Store,
        keys: Keys,
        hub: Hub,
        max_body_bytes: usize,
        metrics: Option<PrometheusHandle>,
    ) -> AppState {
        AppState {
            actions: Actions::new(store.clone(), hub.clone(), keys.clone()),
            hub,
            store,
            keys,
            max_body_bytes,
            logins: Arc::default(),
            metrics,
        }
    }
}

/// The request id set by the request-id layer (`x-request-id`, at most 64 characters), for
/// the audit log; empty when there is none.
#[derive(Clone, Debug)]
pub struct RequestId(pub String);

impl<S: Send + Sync> FromRequestParts<S> for RequestId {
    type Rejection = Infallible;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Self::Rejection> {
        let id = parts
            .headers
            .get("x-request-id")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .chars()
            .take(64)
            .collect();
        Ok(RequestId(id))
    }
}

/// The value of cookie `name` in the request headers.
pub fn cookie<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|kv| kv.trim().split_once('='))
        .find(|(k, _)| *k == name)
        .map(|(_, v)| v)
}

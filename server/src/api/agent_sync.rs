//! HTTP fallback of the sync protocol, for agents where gRPC is blocked
//! (control-plane.md §2): `GET /api/v1/sync/{env}/{svc}` with the agent's token (same
//! audience and scope as its stream). The answer is the stream's own `Snapshot` message,
//! protobuf-encoded (`application/x-protobuf`), with `ETag: "<revision>"`. With
//! `If-None-Match: "<revision>"` the request waits — at most `wait` (default and cap
//! [`LONG_POLL_MAX`]) — for a newer revision, then answers `304 Not Modified`.

use axum::extract::{Path, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use levee_agent::policy::SCHEMA_VERSION;
use levee_agent::proto::Snapshot;
use prost::Message;
use serde::Deserialize;
use std::time::Duration;

use super::{ApiError, ApiQuery, ApiResult};
use crate::auth::{AuthError, authenticate_agent, bearer_token};
use crate::db::SnapshotRow;
use crate::rollout;
use crate::web::AppState;

/// Longest long-poll (`wait`), and its default.
pub const LONG_POLL_MAX: Duration = Duration::from_secs(30);
/// Media type of the answer: the sync protocol's `Snapshot` message.
pub const SNAPSHOT_MEDIA_TYPE: &str = "application/x-protobuf; messageType=levee.sync.v1.Snapshot";

/// Query of the long-poll.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PollQuery {
    /// How long to wait for a revision newer than `If-None-Match` (e.g. `20s`; at most 30 s).
    #[serde(default, with = "levee_agent::policy::duration::option")]
    wait: Option<Duration>,
}

fn if_none_match(headers: &HeaderMap) -> Option<u64> {
    let v = headers.get(header::IF_NONE_MATCH)?.to_str().ok()?;
    v.trim().trim_start_matches("W/").trim_matches('"').parse().ok()
}

/// HTTP fallback of the sync stream for agents: the newest snapshot of a service as the
/// protobuf `levee.sync.v1.Snapshot` message, `ETag: "<revision>"`; with
/// `If-None-Match: "<revision>"`, waits up to `wait` (≤ 30 s) for a newer one, else 304.
/// Needs an agent token scoped to the service.
///
/// # Errors
/// 401 without a valid agent token, 403 outside its scope, 404 without a snapshot, 400 for
/// a `wait` that is not a duration, 422 for one past 30 s, 503 when the database is away and
/// this replica holds no copy.
#[utoipa::path(get, path = "/api/v1/sync/{env}/{svc}", tag = "fleet",
    params(("env" = String, Path), ("svc" = String, Path),
        ("wait" = Option<levee_agent::policy::duration::Text>, Query, description = "long-poll wait, e.g. `20s`, at most 30s (default)"),
        ("If-None-Match" = Option<String>, Header, description = "the revision the agent has, quoted")),
    responses(
        (status = 200, description = "newer snapshot", content_type = "application/x-protobuf", body = Vec<u8>),
        (status = 304, description = "nothing newer within the wait"),
        (status = 403, description = "the token is not scoped to this service", body = super::error::Problem),
        (status = 503, description = "the database is away and this replica holds no copy", body = super::error::Problem)))]
pub async fn poll(
    State(s): State<AppState>,
    Path((env, svc)): Path<(String, String)>,
    ApiQuery(q): ApiQuery<PollQuery>,
    headers: HeaderMap,
) -> ApiResult<Response> {
    let token = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(bearer_token)
        .ok_or_else(|| ApiError::Unauthorized("missing agent bearer token".into()))?;
    let principal = authenticate_agent(&s.keys, &s.store, token).await.map_err(|e| match e {
        AuthError::Unavailable(cause) => ApiError::unavailable(cause),
        other => ApiError::Unauthorized(format!("agent token refused: {other}")),
    })?;
    principal.check_scope(&env, &svc).map_err(|e| ApiError::Forbidden(e.to_string()))?;
    let wait = q.wait.unwrap_or(LONG_POLL_MAX);
    if wait > LONG_POLL_MAX {
        return Err(crate::actions::BadInput::rule("wait", format!("{wait:?}"), "must be at most 30s").into());
    }
    let have = if_none_match(&headers).unwrap_or(0);
    let mut rx = s.hub.subscribe(&env, &svc);
    let mut rollout_rx = s.hub.subscribe_rollout(&env, &svc);
    // The database first (the hub may be stale or empty); this replica's copy when it is away.
    match s.store.delivery(&env, &svc).await {
        Ok(d) => s.hub.publish_delivery(d),
        Err(e) if crate::db::is_unavailable(&e) => {}
        Err(e) => return Err(ApiError::storage(e)),
    }
    // A poll says no instance id, so it is never in a rollout's cohort: during a staged
    // rollout it gets the stable snapshot (`rollout::serve`).
    let newer = || {
        let view = s.hub.rollout(&env, &svc);
        rollout::serve(s.hub.current(&env, &svc), view.as_deref().map(|v| (&v.row, v.stable.as_ref())), None)
            .filter(|c| c.revision > have)
    };
    // A stopping server answers at once (nothing newer): the poll ends instead of holding
    // the shutdown for up to `wait`, and the agent's next poll goes to another replica.
    let mut stop = s.shutdown.clone();
    let until = tokio::time::Instant::now() + wait;
    loop {
        rx.borrow_and_update();
        rollout_rx.borrow_and_update();
        if let Some(snap) = newer() {
            return Ok(answer(&snap));
        }
        tokio::select! {
            () = tokio::time::sleep_until(until) => break,
            r = rx.changed() => if r.is_err() { break },
            r = rollout_rx.changed() => if r.is_err() { break },
            () = crate::shutdown::stopped(&mut stop) => return Ok(not_modified(have)),
        }
    }
    if s.hub.current(&env, &svc).is_none() {
        return Err(ApiError::NotFound(format!("no snapshot of {env}/{svc} is available")));
    }
    Ok(not_modified(have))
}

fn etag(revision: u64) -> HeaderValue {
    HeaderValue::from_str(&format!("\"{revision}\"")).expect("digits are a valid header value")
}

fn answer(snap: &SnapshotRow) -> Response {
    let msg = Snapshot {
        service: snap.service.clone(),
        revision: snap.revision,
        hash: snap.hash.clone(),
        body: snap.body.clone().into_bytes().into(),
        nonce: 0,
        schema_version: SCHEMA_VERSION,
        environment: snap.environment.clone(),
        created_at_ms: snap.created_at,
    };
    let mut res = (StatusCode::OK, msg.encode_to_vec()).into_response();
    res.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static(SNAPSHOT_MEDIA_TYPE));
    res.headers_mut().insert(header::ETAG, etag(snap.revision));
    res.headers_mut().insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    res
}

fn not_modified(have: u64) -> Response {
    let mut res = StatusCode::NOT_MODIFIED.into_response();
    res.headers_mut().insert(header::ETAG, etag(have));
    res
}

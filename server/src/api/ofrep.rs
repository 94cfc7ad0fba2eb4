//! OFREP (the OpenFeature Remote Evaluation Protocol) under the API:
//! `POST /api/v1/ofrep/v1/evaluate/flags/{key}` and `POST /api/v1/ofrep/v1/evaluate/flags`,
//! so an OFREP provider's base URL is `<server>/api/v1`. They read flags with a flags
//! token (read-only, scoped to an environment and services), never an API token. The
//! mapping of Levee's flags to OFREP answers is `levee_agent::ofrep`'s, which the sidecar
//! ([`sidecar_router`]) serves too.
//!
//! Errors are problem+json documents that also carry OFREP's `key`, `errorCode` and
//! `errorDetails`, which is what providers read.

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use levee_agent::Agent;
use levee_agent::ofrep::{self, Bulk, Context, ErrorCode, Evaluation, Failure, Reason};
use levee_agent::policy::Timestamp;

use super::{ApiError, ApiResult};
use crate::auth::{AgentPrincipal, AuthError, authenticate_flags, bearer_token};
use crate::web::AppState;

/// Body of an evaluation request (OFREP's `evaluationRequest`), as the OpenAPI document
/// states it; bodies are read by `levee_agent::ofrep::parse_request`, which names the
/// attribute that is wrong with OFREP's error codes.
#[derive(Debug, utoipa::ToSchema)]
#[allow(dead_code)]
pub struct EvaluationRequest {
    /// The evaluation context. Levee reads `targetingKey` (the rollout key, at most 256
    /// bytes) and `service` (which of the token's services to read; needed when the token
    /// reads several); other attributes are accepted and ignored. At most 64 attributes.
    #[schema(value_type = Object, example = json!({"targetingKey": "user-123", "service": "checkout"}))]
    pub context: Option<serde_json::Value>,
}

/// Evaluates one flag of a service (OFREP single evaluation) with a flags token.
///
/// # Errors
/// 400 with OFREP's `errorCode` `PARSE_ERROR`, `INVALID_CONTEXT` or `TARGETING_KEY_MISSING`;
/// 404 `FLAG_NOT_FOUND` (absent or expired); 401 without a valid flags token; 403 for a
/// service outside the token's scope; 409 when the service's stored revision cannot be read.
#[utoipa::path(post, path = "/api/v1/ofrep/v1/evaluate/flags/{key}", tag = "ofrep",
    params(("key" = String, Path, description = "the flag's key")),
    request_body = EvaluationRequest,
    responses(
        (status = 200, description = "the flag's value (none: use the code default), reason and metadata",
            body = levee_agent::ofrep::Success),
        (status = 400, description = "PARSE_ERROR, INVALID_CONTEXT or TARGETING_KEY_MISSING", body = super::Problem),
        (status = 404, description = "FLAG_NOT_FOUND, or no such service", body = super::Problem),
        (status = 409, description = "the service's current revision cannot be read", body = super::Problem)))]
pub async fn evaluate_one(
    State(s): State<AppState>,
    Path(key): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> ApiResult<Response> {
    let principal = authenticate(&s, &headers).await?;
    let ctx = ofrep::parse_request(&body).map_err(|f| ApiError::Ofrep(f.for_key(&key)))?;
    let (env, svc) = scope(&principal, &ctx).map_err(|e| match e {
        ApiError::Ofrep(f) => ApiError::Ofrep(f.for_key(&key)),
        other => other,
    })?;
    let Some(snap) = s.store.latest_snapshot(&env, &svc).await? else {
        return Err(ApiError::Ofrep(Failure::not_found(&key)));
    };
    let config = snap.config()?;
    let flag = ofrep::stored_flag(&config, &key, Timestamp::now());
    one(ofrep::evaluate(&key, flag, &ctx, Reason::Static))
}

/// Evaluates every flag of a service (OFREP bulk evaluation) with a flags token. The
/// answer's `ETag` changes exactly when the answer does; send it back as `If-None-Match`
/// for a 304 while nothing changed.
///
/// # Errors
/// 400 with OFREP's `errorCode` `PARSE_ERROR` or `INVALID_CONTEXT`; 401 without a valid
/// flags token; 403 for a service outside the token's scope; 404 for a service without
/// a revision; 409 when its stored revision cannot be read.
#[utoipa::path(post, path = "/api/v1/ofrep/v1/evaluate/flags", tag = "ofrep",
    params(("If-None-Match" = Option<String>, Header, description = "the ETag of an earlier answer")),
    request_body = EvaluationRequest,
    responses(
        (status = 200, description = "every flag of the service, in key order", body = Bulk,
            headers(("ETag" = String, description = "tag of this answer"))),
        (status = 304, description = "the answer has not changed since the ETag sent",
            headers(("ETag" = String, description = "tag of this answer"))),
        (status = 400, description = "PARSE_ERROR or INVALID_CONTEXT", body = super::Problem),
        (status = 404, description = "no such service", body = super::Problem),
        (status = 409, description = "the service's current revision cannot be read", body = super::Problem)))]
pub async fn evaluate_all(State(s): State<AppState>, headers: HeaderMap, body: Bytes) -> ApiResult<Response> {
    let principal = authenticate(&s, &headers).await?;
    let ctx = ofrep::parse_request(&body).map_err(ApiError::Ofrep)?;
    let (env, svc) = scope(&principal, &ctx)?;
    let Some(snap) = s.store.latest_snapshot(&env, &svc).await? else {
        return Err(ApiError::NotFound(format!("service {env}/{svc} has no revision")));
    };
    let config = snap.config()?;
    let now = Timestamp::now();
    let bulk = ofrep::evaluate_all(
        config.flags.keys().map(String::as_str),
        |k| ofrep::stored_flag(&config, k, now),
        &ctx,
        Reason::Static,
        ofrep::snapshot_metadata(&env, &svc, snap.revision),
    );
    Ok(all(&bulk, &headers))
}

/// The flags token of a request: `Authorization: Bearer <token>`, or `X-API-Key: <token>`
/// (the two ways OFREP providers send one).
async fn authenticate(s: &AppState, headers: &HeaderMap) -> ApiResult<AgentPrincipal> {
    let bearer = headers.get(header::AUTHORIZATION).and_then(|v| v.to_str().ok()).and_then(bearer_token);
    let token =
        bearer.or_else(|| headers.get("x-api-key").and_then(|v| v.to_str().ok())).ok_or_else(|| {
            ApiError::Unauthorized("missing flags token (Authorization: Bearer, or X-API-Key)".into())
        })?;
    authenticate_flags(&s.keys, &s.store, token.trim()).await.map_err(|e| match e {
        AuthError::Unavailable(cause) => ApiError::unavailable(cause),
        other => ApiError::Unauthorized(format!("flags token refused: {other}")),
    })
}

/// The environment and service a request reads: `context.service` if given (it must be
/// one of the token's), else the token's only service.
fn scope(p: &AgentPrincipal, ctx: &Context) -> ApiResult<(String, String)> {
    let svc = match (&ctx.service, p.services.as_slice()) {
        (Some(svc), _) if p.services.contains(svc) => svc.clone(),
        (Some(svc), _) => {
            return Err(ApiError::Forbidden(format!(
                "this token reads environment {:?}, services {}; not {svc:?}",
                p.environment,
                p.services.join(", ")
            )));
        }
        (None, [only]) => only.clone(),
        (None, several) => {
            return Err(ApiError::Ofrep(Failure::request(
                ErrorCode::InvalidContext,
                format!(
                    "this token reads several services ({}): name one in context.{}",
                    several.join(", "),
                    ofrep::SERVICE_ATTRIBUTE
                ),
            )));
        }
    };
    Ok((p.environment.clone(), svc))
}

/// A single evaluation's answer: 200 with the success, or its failure as a problem.
fn one(e: Evaluation) -> ApiResult<Response> {
    match e {
        Evaluation::Success(s) => {
            let mut res = axum::Json(s).into_response();
            res.headers_mut().insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
            Ok(res)
        }
        Evaluation::Failure(f) => Err(ApiError::Ofrep(f)),
    }
}

/// A bulk answer with its `ETag`, or 304 when `If-None-Match` names it.
fn all(bulk: &Bulk, headers: &HeaderMap) -> Response {
    let (body, tag) = bulk.to_body();
    let tag_value = HeaderValue::from_str(&tag).expect("a quoted hex tag is a valid header value");
    let unchanged = headers
        .get(header::IF_NONE_MATCH)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| ofrep::etag_matches(v, &tag));
    let mut res = if unchanged {
        StatusCode::NOT_MODIFIED.into_response()
    } else {
        let mut r = (StatusCode::OK, body).into_response();
        r.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
        r
    };
    res.headers_mut().insert(header::ETAG, tag_value);
    // Revalidate every time: the tag, not an age, says whether the answer changed.
    res.headers_mut().insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    res
}

/// OFREP served from an agent's applied snapshot, at `/ofrep/v1/evaluate/flags[/{key}]`
/// (an OFREP provider's base URL is the listener's root): what `levee sidecar` serves on
/// localhost. No token: whoever reaches the loopback listener reads the flags of the one
/// service the agent follows; a `context.service` naming another is refused. Answers and
/// errors are the server's.
pub fn sidecar_router(agent: Agent) -> Router {
    Router::new()
        .route("/ofrep/v1/evaluate/flags", post(sidecar_all))
        .route("/ofrep/v1/evaluate/flags/{key}", post(sidecar_one))
        .with_state(agent)
}

fn sidecar_context(agent: &Agent, body: &[u8]) -> Result<Context, Failure> {
    let ctx = ofrep::parse_request(body)?;
    match &ctx.service {
        Some(svc) if svc != agent.service() => Err(Failure::request(
            ErrorCode::InvalidContext,
            format!(
                "this sidecar serves {}/{}, not {svc:?}: leave context.{} out or name that service",
                agent.environment(),
                agent.service(),
                ofrep::SERVICE_ATTRIBUTE
            ),
        )),
        _ => Ok(ctx),
    }
}

async fn sidecar_one(
    State(agent): State<Agent>,
    Path(key): Path<String>,
    body: Bytes,
) -> ApiResult<Response> {
    let ctx = sidecar_context(&agent, &body).map_err(|f| ApiError::Ofrep(f.for_key(&key)))?;
    one(agent.ofrep_evaluate(&key, &ctx))
}

async fn sidecar_all(State(agent): State<Agent>, headers: HeaderMap, body: Bytes) -> ApiResult<Response> {
    let ctx = sidecar_context(&agent, &body).map_err(ApiError::Ofrep)?;
    Ok(all(&agent.ofrep_evaluate_all(&ctx), &headers))
}

//! Extractors: the authenticated caller, and JSON bodies with path-aware errors.

use axum::extract::{FromRequest, FromRequestParts, Request};
use axum::http::header;
use axum::http::request::Parts;
use serde::de::DeserializeOwned;

use super::ApiError;
use crate::actions::{Action, Actor, Via};
use crate::auth::{AuthError, Principal, authenticate_api, authenticate_ui, bearer_token};
use crate::db::Role;
use crate::web::{AppState, Refusals, RequestId, SESSION_COOKIE, cookie};

/// An authenticated caller (bearer token, or the UI session cookie for safe methods only).
#[derive(Clone, Debug)]
pub struct Auth {
    /// Who, with the role read from the database on this request.
    pub principal: Principal,
    /// [`Via::Cli`] when the request says `x-levee-client: cli`, [`Via::Ui`] for the
    /// session cookie, else [`Via::Api`].
    pub via: Via,
    /// The reason in the `X-Levee-Break-Glass` header: apply at once a change whose kind
    /// needs an approved change request (audited as a bypass).
    pub break_glass: Option<String>,
    /// Where a refusal is recorded (audit and log), with the request's method and path.
    refusals: Refusals,
}

/// The header that breaks the glass: its value is the reason for bypassing review.
pub const BREAK_GLASS_HEADER: &str = "x-levee-break-glass";

impl Auth {
    /// Refuses with 403 unless the caller has at least `role` (audited and logged).
    pub fn require(&self, role: Role) -> Result<(), ApiError> {
        Ok(self.refusals.check(&self.principal, self.via, role, &format!("role {}", role.as_str()))?)
    }

    /// The caller as the actor of `action`, refused with 403 unless its role allows the
    /// action (checked before the request's other parts, as the action checks it again).
    /// A refusal is audited and logged.
    pub fn actor(&self, action: Action, request: &RequestId) -> Result<Actor, ApiError> {
        let mut actor = Actor::new(&self.principal, self.via, request.0.clone());
        if let Some(why) = &self.break_glass {
            actor.approval = crate::actions::Approval::BreakGlass(why.clone());
        }
        self.refusals.may(&actor, action)?;
        Ok(actor)
    }
}

impl FromRequestParts<AppState> for Auth {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, Self::Rejection> {
        let (token, via) = match parts.headers.get(header::AUTHORIZATION) {
            Some(v) => {
                let v = v
                    .to_str()
                    .map_err(|_| ApiError::Unauthorized("malformed Authorization header".into()))?;
                let t = bearer_token(v)
                    .ok_or_else(|| ApiError::Unauthorized("Authorization must be `Bearer <token>`".into()))?;
                let via = match parts.headers.get("x-levee-client").and_then(|v| v.to_str().ok()) {
                    Some("cli") => Via::Cli,
                    _ => Via::Api,
                };
                (t.to_string(), via)
            }
            None => match cookie(&parts.headers, SESSION_COOKIE) {
                // The session cookie reads the API from the browser; a change through the
                // API needs a bearer token, so a forged cross-site request can never
                // carry the operator's authority (the UI's own forms have CSRF tokens).
                Some(_) if !parts.method.is_safe() => {
                    return Err(ApiError::Unauthorized(
                        "changes through the API need an Authorization: Bearer token; the UI session cookie only reads"
                            .into(),
                    ));
                }
                Some(c) => (c.to_string(), Via::Ui),
                None => {
                    return Err(ApiError::Unauthorized(
                        "missing bearer token: log in with POST /api/v1/auth/login".into(),
                    ));
                }
            },
        };
        // A bearer token is an API session or an API token; the cookie only a UI session.
        let principal = match via {
            Via::Ui => authenticate_ui(&state.keys, &state.store, &token).await,
            _ => authenticate_api(&state.keys, &state.store, &token).await,
        };
        let principal = principal.map_err(|e| match e {
            AuthError::Expired => ApiError::Unauthorized("token expired: log in again".into()),
            AuthError::Revoked => ApiError::Unauthorized("token revoked".into()),
            AuthError::UserGone => ApiError::Unauthorized("user is disabled or no longer exists".into()),
            AuthError::Missing => ApiError::Unauthorized("missing bearer token".into()),
            AuthError::Invalid(_) => ApiError::Unauthorized("invalid token".into()),
            AuthError::Unavailable(cause) => ApiError::unavailable(cause),
        })?;
        let break_glass =
            parts.headers.get(BREAK_GLASS_HEADER).map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned());
        let refusals = Refusals {
            actions: state.actions.clone(),
            request_id: RequestId::from_request_parts(parts, state).await.map(|r| r.0).unwrap_or_default(),
            target: format!(
                "{} {}",
                parts.method,
                parts.extensions.get::<axum::extract::OriginalUri>().map_or(parts.uri.path(), |u| u.0.path())
            ),
        };
        Ok(Auth { principal, via, break_glass, refusals })
    }
}

/// A JSON body decoded with path-aware errors: 415 without a JSON content type, 413 past
/// the body limit, 400 naming the field for malformed JSON, wrong types or unknown fields.
#[derive(Debug)]
pub struct ApiJson<T>(pub T);

impl<T: DeserializeOwned> FromRequest<AppState> for ApiJson<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &AppState) -> Result<Self, Self::Rejection> {
        let ct = req.headers().get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).unwrap_or("");
        let mime = ct.split(';').next().unwrap_or("").trim().to_ascii_lowercase();
        if mime != "application/json" && !(mime.starts_with("application/") && mime.ends_with("+json")) {
            return Err(ApiError::UnsupportedMediaType(format!(
                "expected Content-Type: application/json, got {:?}",
                if ct.is_empty() { "nothing" } else { ct }
            )));
        }
        let limit = state.max_body_bytes;
        let bytes = axum::body::to_bytes(req.into_body(), limit).await.map_err(|e| {
            let too_large = std::error::Error::source(&e)
                .and_then(|s| s.downcast_ref::<http_body_util::LengthLimitError>())
                .is_some()
                || e.to_string().contains("length limit");
            if too_large {
                ApiError::TooLarge { limit }
            } else {
                ApiError::bad_request("could not read the request body")
            }
        })?;
        match levee_agent::policy::decode_json::<T>(&bytes) {
            Ok(v) => Ok(ApiJson(v)),
            // JSON Schema's `integer` (the OpenAPI document's) holds `5.0`; serde's whole
            // numbers do not. Read such a body once more with those numbers written whole;
            // what fails again is answered with the first decoding's errors.
            Err(e) => whole_numbers(&bytes)
                .and_then(|b| levee_agent::policy::decode_json::<T>(&b).ok())
                .map(ApiJson)
                .ok_or_else(|| ApiError::from_policy(e)),
        }
    }
}

/// `bytes` with every number that has a zero fraction (`5.0`, `1e3`) written as the whole
/// number it is, or `None` when it holds none (or is not JSON).
fn whole_numbers(bytes: &[u8]) -> Option<Vec<u8>> {
    fn walk(v: &mut serde_json::Value) -> bool {
        match v {
            serde_json::Value::Number(n) if n.is_f64() => {
                let f = n.as_f64().unwrap_or(f64::NAN);
                let whole = if f.fract() == 0.0 && f >= 0.0 && f <= u64::MAX as f64 {
                    Some(serde_json::Number::from(f as u64))
                } else if f.fract() == 0.0 && f < 0.0 && f >= i64::MIN as f64 {
                    Some(serde_json::Number::from(f as i64))
                } else {
                    None
                };
                whole.map(|w| *n = w).is_some()
            }
            serde_json::Value::Array(a) => a.iter_mut().fold(false, |changed, v| walk(v) | changed),
            serde_json::Value::Object(o) => o.values_mut().fold(false, |changed, v| walk(v) | changed),
            _ => false,
        }
    }
    let mut v: serde_json::Value = serde_json::from_slice(bytes).ok()?;
    walk(&mut v).then(|| serde_json::to_vec(&v).ok()).flatten()
}

/// Query parameters decoded with errors that name the parameter: 400 with the
/// parameter as the field (`since`), the value's own complaint (an RFC 3339 time, a
/// duration, a number) and nothing else of the request. Unknown parameters are refused
/// where the type says `deny_unknown_fields`.
#[derive(Debug)]
pub struct ApiQuery<T>(pub T);

impl<T: DeserializeOwned, S: Send + Sync> FromRequestParts<S> for ApiQuery<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Self::Rejection> {
        let query = parts.uri.query().unwrap_or("");
        let de = serde_urlencoded::Deserializer::new(form_urlencoded::parse(query.as_bytes()));
        serde_path_to_error::deserialize(de).map(ApiQuery).map_err(|e| {
            let path = e.path().to_string();
            let message = e.into_inner().to_string();
            if path.is_empty() || path == "." {
                ApiError::bad_request(format!("bad query string: {message}"))
            } else {
                let value = form_urlencoded::parse(query.as_bytes())
                    .find(|(k, _)| *k == path)
                    .map(|(_, v)| format!("{v:?}"))
                    .unwrap_or_default();
                ApiError::bad_field(&path, value, message)
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::whole_numbers;

    #[test]
    fn whole_numbers_rewrites_only_numbers_with_a_zero_fraction() {
        let out = whole_numbers(br#"{"a":5.0,"b":[1.5,2e0,-3.0],"c":{"d":"5.0","e":7}}"#).unwrap();
        assert_eq!(String::from_utf8(out).unwrap(), r#"{"a":5,"b":[1.5,2,-3],"c":{"d":"5.0","e":7}}"#);
        assert_eq!(whole_numbers(br#"{"a":5,"b":1.5}"#), None);
        assert_eq!(whole_numbers(b"not json"), None);
    }
}

//! UI sessions: the `levee_session` cookie, the logged-in user extractor, and form posts
//! that carry the session's anti-CSRF token.

use std::time::Duration;

use axum::extract::{FromRequest, FromRequestParts, Request};
use axum::http::request::Parts;
use axum::http::{HeaderMap, HeaderValue, Method, header};
use serde::Deserialize;
use serde::de::DeserializeOwned;

use super::error::UiError;
use super::page::{Layout, NavUser};
use crate::actions::{Action, Actor, BadInput, Reason, ReasonError, Via};
use crate::auth::{Principal, SESSION_TTL, authenticate_ui};
use crate::db::Role;
use crate::web::{AppState, Refusals, RequestId, SESSION_COOKIE, cookie};

/// Name of the cookie that carries the login form's anti-CSRF nonce (before a session exists).
pub const LOGIN_NONCE_COOKIE: &str = "levee_login";
/// Lifetime of the login nonce cookie.
pub const LOGIN_NONCE_TTL: Duration = Duration::from_secs(3600);

/// A logged-in UI user (from the session cookie only, never from a bearer token).
#[derive(Clone, Debug)]
pub struct UiUser {
    /// Who, with the role read from the database on this request.
    pub principal: Principal,
    /// The session's anti-CSRF token, embedded in every form the user is shown.
    pub csrf: String,
    /// Records a refusal (audit and log).
    refusals: Refusals,
}

impl UiUser {
    /// Refuses with 403 unless the user's role allows `action` (audited and logged as an
    /// attempt at that action: a page that only shows what the action will do is refused
    /// as the action itself).
    pub fn require(&self, action: Action) -> Result<(), UiError> {
        Ok(self.refusals.check(&self.principal, Via::Ui, action.role(), action.name())?)
    }

    /// Refuses with 403 unless the user has at least `role` (audited and logged as the
    /// page `page`, e.g. `the users and tokens page`).
    pub fn require_role(&self, role: Role, page: &str) -> Result<(), UiError> {
        Ok(self.refusals.check(&self.principal, Via::Ui, role, page)?)
    }

    /// Whether the user may flip switches and override breakers (the roles those actions
    /// need), so the page shows their forms.
    pub fn can_operate(&self) -> bool {
        [Action::FlagSet, Action::BreakerOverride, Action::BreakerOverrideDelete]
            .iter()
            .all(|a| self.principal.role >= a.role())
    }

    /// The user as the actor of `action` through the UI, refused with 403 unless the role
    /// allows it.
    pub fn actor(&self, action: Action, request: &RequestId) -> Result<Actor, UiError> {
        let actor = Actor::new(&self.principal, Via::Ui, request.0.clone());
        self.refusals.may(&actor, action)?;
        Ok(actor)
    }

    /// The page frame for this user.
    pub fn layout(&self) -> Layout {
        Layout {
            user: Some(NavUser {
                name: self.principal.actor.clone(),
                role: self.principal.role.as_str(),
                csrf: self.csrf.clone(),
            }),
        }
    }
}

/// The user of the session cookie, if it holds a valid session.
pub async fn session_user(headers: &HeaderMap, state: &AppState) -> Option<UiUser> {
    let token = cookie(headers, SESSION_COOKIE)?;
    let principal = authenticate_ui(&state.keys, &state.store, token).await.ok()?;
    let csrf = state.keys.csrf_token(&principal.jti).ok()?;
    let request_id = headers.get("x-request-id").and_then(|v| v.to_str().ok()).unwrap_or("");
    let refusals = Refusals {
        actions: state.actions.clone(),
        target: String::new(),
        request_id: request_id.chars().take(64).collect(),
    };
    Some(UiUser { principal, csrf, refusals })
}

/// The reason typed in a confirmation form, or what to tell the user about it.
pub fn reason(text: &str) -> Result<Reason, String> {
    Reason::parse(text).map_err(|e| match e {
        ReasonError::Missing => {
            "a reason is required: say why you are making this change (it is recorded in the \
                                 audit log)"
                .to_string()
        }
        e => BadInput::from(e).to_string(),
    })
}

impl FromRequestParts<AppState> for UiUser {
    type Rejection = UiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, Self::Rejection> {
        let mut user = session_user(&parts.headers, state).await.ok_or_else(|| login_required(parts))?;
        user.refusals.target = format!(
            "{} {}",
            parts.method,
            parts.extensions.get::<axum::extract::OriginalUri>().map_or(parts.uri.path(), |u| u.0.path())
        );
        Ok(user)
    }
}

fn login_required(parts: &Parts) -> UiError {
    // After logging in, a GET goes back where it was; a refused POST starts from the top.
    let next = if parts.method == Method::GET {
        parts.uri.path_and_query().map(|pq| pq.as_str()).unwrap_or("/")
    } else {
        "/"
    };
    UiError::LoginRequired { next: local_path(next).to_string() }
}

/// `next` when it is a path on this site, else `/` (no open redirect).
pub fn local_path(next: &str) -> &str {
    let ok = next.starts_with('/')
        && !next.starts_with("//")
        && !next.starts_with("/\\")
        && next.len() <= 512
        && next.bytes().all(|b| b.is_ascii_graphic());
    if ok { next } else { "/" }
}

/// A form post by a logged-in user whose anti-CSRF token was checked.
///
/// The body must be `application/x-www-form-urlencoded` and contain the field `csrf` with
/// the session's token; only then is it decoded into `T` (which ignores the `csrf` field).
/// Without a session the answer is the login page; with a missing or wrong token, 403.
#[derive(Debug)]
pub struct Posted<T> {
    /// The logged-in user whose session token the form carried.
    pub user: UiUser,
    /// The decoded form.
    pub form: T,
}

#[derive(Deserialize)]
struct CsrfOnly {
    #[serde(default)]
    csrf: String,
}

/// A form without fields besides the anti-CSRF token.
#[derive(Debug, Deserialize)]
pub struct NoFields {}

impl<T: DeserializeOwned> FromRequest<AppState> for Posted<T> {
    type Rejection = UiError;

    async fn from_request(req: Request, state: &AppState) -> Result<Self, Self::Rejection> {
        let (mut parts, body) = req.into_parts();
        let user = UiUser::from_request_parts(&mut parts, state).await?;
        let bytes = read_form(&parts.headers, body, state.max_body_bytes).await?;
        let token: CsrfOnly = serde_urlencoded::from_bytes(&bytes).map_err(|_| UiError::BadCsrfToken)?;
        if !state.keys.check_csrf_token(&user.principal.jti, &token.csrf) {
            tracing::warn!(actor = %user.principal.actor, path = %parts.uri.path(), "form without a valid anti-CSRF token");
            return Err(UiError::BadCsrfToken);
        }
        let form = serde_urlencoded::from_bytes(&bytes)
            .map_err(|e| UiError::BadRequest(format!("the form could not be read: {e}")))?;
        Ok(Posted { user, form })
    }
}

/// Reads a url-encoded form body, refusing other content types and oversized bodies.
pub async fn read_form(
    headers: &HeaderMap,
    body: axum::body::Body,
    limit: usize,
) -> Result<Vec<u8>, UiError> {
    let ct = headers.get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).unwrap_or("");
    let mime = ct.split(';').next().unwrap_or("").trim();
    if !mime.eq_ignore_ascii_case("application/x-www-form-urlencoded") {
        return Err(UiError::BadRequest(format!(
            "expected a form (application/x-www-form-urlencoded), got {:?}",
            if ct.is_empty() { "no content type" } else { ct }
        )));
    }
    axum::body::to_bytes(body, limit)
        .await
        .map(|b| b.to_vec())
        .map_err(|_| UiError::BadRequest(format!("the form is larger than the limit of {limit} bytes")))
}

/// A `Set-Cookie` value: HttpOnly, SameSite=Strict, Path=/, and `Secure` when the client
/// came over HTTPS (`web::Https`, the one rule of it).
pub fn set_cookie(name: &str, value: &str, max_age: Duration, secure: bool) -> HeaderValue {
    let mut c = format!("{name}={value}; Path=/; HttpOnly; SameSite=Strict; Max-Age={}", max_age.as_secs());
    if secure {
        c.push_str("; Secure");
    }
    // Values are JWTs or hex nonces: always valid header text.
    HeaderValue::from_str(&c).unwrap_or_else(|_| HeaderValue::from_static("invalid=; Max-Age=0"))
}

/// The session cookie for a freshly issued session token.
pub fn session_cookie(token: &str, secure: bool) -> HeaderValue {
    set_cookie(SESSION_COOKIE, token, SESSION_TTL, secure)
}

/// A `Set-Cookie` value that deletes cookie `name`.
pub fn clear_cookie(name: &str, secure: bool) -> HeaderValue {
    set_cookie(name, "", Duration::ZERO, secure)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_local_paths_are_followed_after_login() {
        assert_eq!(local_path("/ui/audit?actor=alice"), "/ui/audit?actor=alice");
        assert_eq!(local_path("//evil.example/"), "/");
        assert_eq!(local_path("/\\evil.example"), "/");
        assert_eq!(local_path("https://evil.example/"), "/");
        assert_eq!(local_path("/a b"), "/");
    }

    #[test]
    fn cookies_are_http_only_and_strict() {
        let c = session_cookie("abc.def.ghi", false);
        let c = c.to_str().unwrap();
        assert!(c.starts_with("levee_session=abc.def.ghi; Path=/; HttpOnly; SameSite=Strict; Max-Age="));
        assert!(!c.contains("Secure"));
        assert!(session_cookie("t", true).to_str().unwrap().ends_with("; Secure"));
        assert!(clear_cookie(SESSION_COOKIE, false).to_str().unwrap().contains("Max-Age=0"));
    }
}

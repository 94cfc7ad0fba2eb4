//! `GET /login`, `POST /login` and `POST /logout`.
//!
//! The login form exists before any session, so its anti-CSRF token is bound to a random
//! nonce kept in a short-lived `levee_login` cookie (HttpOnly, SameSite=Strict): a form
//! posted from another site carries neither the cookie nor a token that matches it.

use askama::Template;
use axum::extract::{Query, Request, State};
use axum::http::{StatusCode, header};
use axum::response::{AppendHeaders, IntoResponse, Redirect, Response};
use rand::Rng;
use serde::Deserialize;

use super::error::UiError;
use super::page::{Layout, Page};
use super::session::{
    LOGIN_NONCE_COOKIE, LOGIN_NONCE_TTL, NoFields, Posted, clear_cookie, local_path, read_form,
    session_cookie, session_user, set_cookie,
};
use crate::actions::{LoginAttempt, Via};
use crate::auth::LoginError;
use crate::web::{AppState, ClientAddr, Https, RequestId, SESSION_COOKIE, cookie};

#[derive(Template)]
#[template(path = "login.html")]
struct LoginPage {
    layout: Layout,
    username: String,
    next: String,
    csrf: String,
    error: Option<String>,
}

/// Query of `GET /login`.
#[derive(Debug, Deserialize)]
pub struct LoginQuery {
    next: Option<String>,
}

/// Fields of the login form.
#[derive(Debug, Deserialize)]
struct LoginForm {
    #[serde(default)]
    username: String,
    #[serde(default)]
    password: String,
    #[serde(default)]
    next: String,
    #[serde(default)]
    csrf: String,
}

fn login_token_subject(nonce: &str) -> String {
    format!("login:{nonce}")
}

/// Renders the login form with a fresh nonce cookie and its token.
fn form_response(
    state: &AppState,
    secure: bool,
    status: StatusCode,
    username: String,
    next: &str,
    error: Option<String>,
) -> Result<Response, UiError> {
    let nonce = hex::encode(rand::rng().random::<[u8; 16]>());
    let csrf = state.keys.csrf_token(&login_token_subject(&nonce))?;
    let page =
        LoginPage { layout: Layout::default(), username, next: local_path(next).to_string(), csrf, error };
    let cookie = set_cookie(LOGIN_NONCE_COOKIE, &nonce, LOGIN_NONCE_TTL, secure);
    Ok(([(header::SET_COOKIE, cookie)], Page::with_status(status, page)).into_response())
}

/// `GET /login`: the form, or straight on when the session is still valid.
pub async fn form(
    State(state): State<AppState>,
    Query(q): Query<LoginQuery>,
    Https(secure): Https,
    req: Request,
) -> Result<Response, UiError> {
    let next = q.next.as_deref().map(local_path).unwrap_or("/");
    if session_user(req.headers(), &state).await.is_some() {
        return Ok(Redirect::to(next).into_response());
    }
    form_response(&state, secure, StatusCode::OK, String::new(), next, None)
}

/// `POST /login`: checks the password (throttled per account and client address, and per
/// address) and sets the session cookie.
pub async fn submit(
    State(state): State<AppState>,
    ClientAddr(client): ClientAddr,
    RequestId(request_id): RequestId,
    Https(secure): Https,
    req: Request,
) -> Result<Response, UiError> {
    let nonce = cookie(req.headers(), LOGIN_NONCE_COOKIE).unwrap_or("").to_string();
    let (parts, body) = req.into_parts();
    let bytes = read_form(&parts.headers, body, state.max_body_bytes).await?;
    let f: LoginForm = serde_urlencoded::from_bytes(&bytes)
        .map_err(|e| UiError::BadRequest(format!("the login form could not be read: {e}")))?;
    if nonce.is_empty() || !state.keys.check_csrf_token(&login_token_subject(&nonce), &f.csrf) {
        return form_response(
            &state,
            secure,
            StatusCode::FORBIDDEN,
            f.username,
            &f.next,
            Some("This login form expired or was not sent by a Levee page. Please log in again.".into()),
        );
    }
    let attempt =
        LoginAttempt { username: f.username.trim(), password: &f.password, client, via: Via::Ui, request_id };
    match state.actions.login(&state.logins, attempt).await {
        Ok(session) => Ok((
            AppendHeaders([
                (header::SET_COOKIE, session_cookie(&session.token, secure)),
                (header::SET_COOKIE, clear_cookie(LOGIN_NONCE_COOKIE, secure)),
            ]),
            Redirect::to(local_path(&f.next)),
        )
            .into_response()),
        Err(LoginError::WrongCredentials) => form_response(
            &state,
            secure,
            StatusCode::UNAUTHORIZED,
            f.username,
            &f.next,
            Some("Wrong username or password.".into()),
        ),
        Err(e @ LoginError::TooManyAttempts(_)) => form_response(
            &state,
            secure,
            StatusCode::TOO_MANY_REQUESTS,
            f.username,
            &f.next,
            Some(e.to_string()),
        ),
        Err(e) => Err(e.into()),
    }
}

/// `POST /logout`: ends the session token on the server (it is refused from now on, even
/// if the cookie was copied) and deletes the cookie. A form with the session's token, so
/// another site cannot log the user out.
pub async fn logout(
    State(state): State<AppState>,
    Https(secure): Https,
    posted: Posted<NoFields>,
) -> Result<Response, UiError> {
    state.actions.end_session(&posted.user.principal.jti).await?;
    Ok((AppendHeaders([(header::SET_COOKIE, clear_cookie(SESSION_COOKIE, secure))]), Redirect::to("/login"))
        .into_response())
}

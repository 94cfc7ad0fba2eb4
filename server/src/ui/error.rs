//! The UI's error type: a redirect to the login page, or an HTML error page that says what
//! went wrong and what to do. Internal causes are logged, never shown.

use askama::Template;
use axum::http::{StatusCode, header};
use axum::response::{Html, IntoResponse, Redirect, Response};
use tower_http::csrf::ProtectionError;

use super::page::Layout;
use crate::actions::{ChangeError, Forbidden};
use crate::auth::LoginError;
use crate::db::Unreadable;

/// Why a UI request did not succeed.
#[derive(Debug, thiserror::Error)]
pub enum UiError {
    /// No valid session: go to the login page, then come back to `next`.
    #[error("log in first")]
    LoginRequired {
        /// Where to return after logging in (a local path).
        next: String,
    },
    /// The role does not allow the action.
    #[error("{0}")]
    Forbidden(String),
    /// A form without the session's anti-CSRF token, or with a wrong one.
    #[error(
        "this form was not sent by a Levee page of your current session (missing or wrong anti-CSRF token); \
         reload the page and try again"
    )]
    BadCsrfToken,
    /// No such environment, service, flag…
    #[error("{0}")]
    NotFound(String),
    /// The form could not be understood.
    #[error("{0}")]
    BadRequest(String),
    /// The service changed between reading and writing.
    #[error("{0}")]
    Conflict(String),
    /// A stored revision does not decode with this server version: shown as such, with
    /// the service's history, where a rollback to a revision that reads is offered.
    #[error("{0}")]
    Unreadable(Unreadable),
    /// Too many failed logins (`auth::LoginLimiter`).
    #[error("{0}")]
    TooManyRequests(String),
    /// A bug or an unreachable database.
    #[error("internal error")]
    Internal(#[source] anyhow::Error),
}

impl From<anyhow::Error> for UiError {
    fn from(e: anyhow::Error) -> Self {
        UiError::Internal(e)
    }
}

impl From<Unreadable> for UiError {
    fn from(e: Unreadable) -> Self {
        UiError::Unreadable(e)
    }
}

impl From<Forbidden> for UiError {
    fn from(e: Forbidden) -> Self {
        UiError::Forbidden(e.to_string())
    }
}

impl From<crate::web::NotInEnvironment> for UiError {
    fn from(e: crate::web::NotInEnvironment) -> Self {
        UiError::NotFound(e.to_string())
    }
}

impl From<ChangeError> for UiError {
    fn from(e: ChangeError) -> Self {
        match e {
            ChangeError::Forbidden(f) => f.into(),
            ChangeError::NotFound(m) => UiError::NotFound(m.to_string()),
            ChangeError::Conflict { expected, current } => UiError::Conflict(format!(
                "the service changed while you were looking at it: you saw revision {expected}, it is now at \
                 revision {current}. Nothing was changed. Open the service page again, check what changed, \
                 and repeat the action if it is still needed."
            )),
            e @ ChangeError::FaultsNotAllowed { .. } => UiError::Forbidden(e.to_string()),
            e @ (ChangeError::ProfileActive { .. }
            | ChangeError::ProfileWouldUndo { .. }
            | ChangeError::ApprovalVoid { .. }
            | ChangeError::Rollout(_)) => UiError::Conflict(e.to_string()),
            e @ (ChangeError::ApprovalRequired { .. }
            | ChangeError::NotProposer { .. }
            | ChangeError::AuthorGone { .. }
            | ChangeError::SelfApproval { .. }) => UiError::Forbidden(e.to_string()),
            ChangeError::Unreadable(u) => UiError::Unreadable(u),
            ChangeError::Storage(cause) => UiError::Internal(cause),
            e @ (ChangeError::Invalid(_) | ChangeError::InvalidField(_)) => {
                UiError::BadRequest(e.to_string())
            }
        }
    }
}

impl From<crate::actions::CreateError> for UiError {
    fn from(e: crate::actions::CreateError) -> Self {
        use crate::actions::CreateError as E;
        match e {
            E::Forbidden(f) => f.into(),
            E::NotFound(m) => UiError::NotFound(m.to_string()),
            E::AlreadyExists(x) => UiError::Conflict(x.to_string()),
            e @ E::Invalid(_) => UiError::BadRequest(e.to_string()),
            E::Refused(e) => (*e).into(),
            E::Storage(cause) => UiError::Internal(cause),
        }
    }
}

impl From<crate::actions::TokenError> for UiError {
    fn from(e: crate::actions::TokenError) -> Self {
        use crate::actions::TokenError as E;
        match e {
            E::Forbidden(f) => f.into(),
            E::NotFound(m) => UiError::NotFound(m.to_string()),
            e @ (E::InvalidField(_) | E::Ended(_)) => UiError::BadRequest(e.to_string()),
            E::Storage(cause) => UiError::Internal(cause),
        }
    }
}

impl From<LoginError> for UiError {
    fn from(e: LoginError) -> Self {
        match e {
            LoginError::Internal(cause) => UiError::Internal(cause),
            e @ LoginError::WrongCredentials => UiError::BadRequest(e.to_string()),
            e @ LoginError::TooManyAttempts(_) => UiError::TooManyRequests(e.to_string()),
        }
    }
}

#[derive(Template)]
#[template(path = "error.html")]
struct ErrorPage {
    layout: Layout,
    status: u16,
    title: &'static str,
    message: String,
    /// Where to go from here (address, words), besides the environments.
    next: Option<(String, String)>,
}

impl UiError {
    fn status(&self) -> StatusCode {
        match self {
            UiError::LoginRequired { .. } => StatusCode::SEE_OTHER,
            UiError::Forbidden(_) | UiError::BadCsrfToken => StatusCode::FORBIDDEN,
            UiError::NotFound(_) => StatusCode::NOT_FOUND,
            UiError::BadRequest(_) => StatusCode::BAD_REQUEST,
            UiError::Conflict(_) | UiError::Unreadable(_) => StatusCode::CONFLICT,
            UiError::TooManyRequests(_) => StatusCode::TOO_MANY_REQUESTS,
            UiError::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }
}

impl IntoResponse for UiError {
    fn into_response(self) -> Response {
        if let UiError::LoginRequired { next } = &self {
            let target = if next == "/" {
                "/login".to_string()
            } else {
                format!("/login?{}", serde_urlencoded::to_string([("next", next)]).unwrap_or_default())
            };
            return Redirect::to(&target).into_response();
        }
        if let UiError::Internal(cause) = &self {
            tracing::error!(error = %levee_agent::report::ErrorChain(cause.as_ref()), "internal error answering a UI request");
        }
        let status = self.status();
        let title = match &self {
            UiError::Forbidden(_) => "Not allowed",
            UiError::BadCsrfToken => "Request refused",
            UiError::NotFound(_) => "Not found",
            UiError::BadRequest(_) => "Cannot do that",
            UiError::Conflict(_) => "Changed meanwhile",
            UiError::Unreadable(_) => "This revision cannot be read",
            UiError::TooManyRequests(_) => "Too many attempts",
            _ => "Something went wrong",
        };
        let message = match &self {
            UiError::Internal(_) => {
                "the server could not answer this request; the cause is in the server log".to_string()
            }
            UiError::Unreadable(u) => format!(
                "{u}. It was written by another version of Levee, or outside Levee; agents refuse it too and \
                 keep their last good configuration. Nothing is lost: every revision is kept. If it is the \
                 current revision, roll back to one that reads."
            ),
            other => other.to_string(),
        };
        let next = match &self {
            UiError::Unreadable(u) => Some((
                format!("{}/history", super::page::service_url(&u.environment, &u.service)),
                format!("History of {}: roll back to a revision that reads", u.service),
            )),
            _ => None,
        };
        error_page(status, title, message, next)
    }
}

/// Renders the error page directly (not through [`Page`], whose own failure renders an
/// error page), falling back to plain text.
fn error_page(
    status: StatusCode,
    title: &'static str,
    message: String,
    next: Option<(String, String)>,
) -> Response {
    let page = ErrorPage { layout: Layout::default(), status: status.as_u16(), title, message, next };
    match page.render() {
        Ok(html) => (status, Html(html)).into_response(),
        Err(_) => (status, [(header::CONTENT_TYPE, "text/plain; charset=utf-8")], title).into_response(),
    }
}

/// Answer of the UI's fallback route.
pub async fn not_found() -> UiError {
    UiError::NotFound("there is no page at this address".into())
}

/// Answer of tower-http's CSRF layer when a browser says the form came from another site.
pub fn cross_site(err: ProtectionError) -> Response {
    tracing::warn!(error = %err, "refused a cross-site form submission");
    error_page(
        StatusCode::FORBIDDEN,
        "Request refused",
        "this form was sent from another site (cross-origin request); Levee only accepts forms sent from \
         its own pages. Nothing was changed."
            .into(),
        None,
    )
}

/// Answer of a UI address asked with a method it does not take: most often a change
/// route opened again (a reload, a bookmark, the browser's history), which only takes the
/// form of its confirmation page. Says so, changes nothing, and points to the page the
/// address belongs to.
pub async fn method_not_allowed(uri: axum::http::Uri) -> Response {
    let path = uri.path();
    let segments: Vec<&str> = path.split('/').collect();
    // ["", "ui", "environments", env, "services", svc, …]
    let back = match segments.as_slice() {
        ["", "ui", "environments", env, "services", svc, ..] => {
            format!("/ui/environments/{env}/services/{svc}")
        }
        ["", "ui", "environments", env, page, ..]
            if ["profiles", "requests", "scheduled", "faults"].contains(page) =>
        {
            format!("/ui/environments/{env}/{page}")
        }
        ["", "ui", "environments", env, ..] => format!("/ui/environments/{env}"),
        ["", "ui", "admin", ..] => "/ui/admin".to_string(),
        _ => "/".to_string(),
    };
    // The segments come from a path axum routed: percent-encoded, no quote or angle
    // bracket; the template escapes them anyway.
    // axum adds the `Allow` header of the route to this answer.
    error_page(
        StatusCode::METHOD_NOT_ALLOWED,
        "Nothing to show here",
        format!(
            "this address makes a change and only takes the form of its confirmation page, so opening it again \
             (a reload, a bookmark, Back) shows nothing and changes nothing. Open {back} to see the current state \
             and act from there."
        ),
        None,
    )
}

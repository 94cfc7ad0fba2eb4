//! Rendering helpers shared by every page: the layout data, the template response
//! wrapper, the stylesheet and formatting of times and durations.

use std::time::Duration;

use askama::Template;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{Html, IntoResponse, Response};
use levee_agent::policy::Timestamp;

use super::error::UiError;

/// The one stylesheet, compiled into the binary so the UI needs no files at run time.
const STYLESHEET: &str = include_str!("../../../web/static/levee.css");
/// The one script: the service page's live part (server-sent events), compiled in too.
const LIVE_SCRIPT: &str = include_str!("../../../web/static/live.js");

/// What the page frame shows about the logged-in user.
#[derive(Clone, Debug)]
pub struct NavUser {
    /// Username (or `token:<name>`).
    pub name: String,
    /// `viewer`, `operator` or `admin`.
    pub role: &'static str,
    /// Anti-CSRF token of the session (for the log-out form).
    pub csrf: String,
}

/// Data of the page frame (`base.html`).
#[derive(Clone, Debug, Default)]
pub struct Layout {
    /// The user, when logged in.
    pub user: Option<NavUser>,
}

/// A rendered template with a status code.
#[derive(Debug)]
pub struct Page<T> {
    status: StatusCode,
    template: T,
}

impl<T: Template> Page<T> {
    /// A 200 page.
    pub fn ok(template: T) -> Self {
        Page { status: StatusCode::OK, template }
    }

    /// A page with another status (a form shown again with an error, say).
    pub fn with_status(status: StatusCode, template: T) -> Self {
        Page { status, template }
    }
}

impl<T: Template> IntoResponse for Page<T> {
    fn into_response(self) -> Response {
        match self.template.render() {
            Ok(html) => (self.status, Html(html)).into_response(),
            Err(e) => UiError::Internal(anyhow::anyhow!("rendering a template: {e}")).into_response(),
        }
    }
}

/// `GET /static/levee.css`.
pub async fn stylesheet() -> Response {
    (
        [
            (header::CONTENT_TYPE, HeaderValue::from_static("text/css; charset=utf-8")),
            (header::CACHE_CONTROL, HeaderValue::from_static("public, max-age=3600")),
        ],
        STYLESHEET,
    )
        .into_response()
}

/// `GET /static/live.js`.
pub async fn live_script() -> Response {
    (
        [
            (header::CONTENT_TYPE, HeaderValue::from_static("text/javascript; charset=utf-8")),
            (header::CACHE_CONTROL, HeaderValue::from_static("public, max-age=3600")),
        ],
        LIVE_SCRIPT,
    )
        .into_response()
}

/// A time in milliseconds since the epoch as RFC 3339 (UTC), or `—` for zero.
pub fn time(ms: i64) -> String {
    if ms <= 0 { "—".to_string() } else { Timestamp::from_unix_ms(ms).to_rfc3339() }
}

/// A duration the way policies write it (`80ms`, `2s`, `1m 30s`).
pub fn duration(d: Duration) -> String {
    levee_agent::policy::duration::format(d)
}

/// A ratio 0..=1 as a percentage.
pub fn percent(ratio: f64) -> String {
    format!("{}%", (ratio * 1000.0).round() / 10.0)
}

/// Percent-encodes one URL path segment.
pub fn seg(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// Path of a service's page.
pub fn service_url(env: &str, svc: &str) -> String {
    format!("/ui/environments/{}/services/{}", seg(env), seg(svc))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn path_segments_are_encoded() {
        assert_eq!(seg("checkout-v2.eu_1"), "checkout-v2.eu_1");
        assert_eq!(seg("a/b c?"), "a%2Fb%20c%3F");
        assert_eq!(service_url("prod", "x y"), "/ui/environments/prod/services/x%20y");
    }
}

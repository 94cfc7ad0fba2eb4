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

/// A moment as pages show it: how long ago (or how soon) in words, with the exact time for
/// a hover (`<time title>`, see `macros.html`) and for text that has no hover.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, serde::Serialize)]
pub struct When {
    /// RFC 3339 with milliseconds, UTC (`2026-05-01T19:31:02.123Z`); empty for no time.
    pub exact: String,
    /// `just now`, `less than a minute ago`, `5 min ago`, `2 h 5 min ago`, `3 days ago`, `in 58 min`; `—`
    /// for no time.
    pub ago: String,
    /// The exact time, short, for text: `19:31:02 UTC` on the day it is shown, else
    /// `2026-05-01 19:31 UTC`.
    pub short: String,
}

impl When {
    /// `ms` (since the epoch; zero or less is "no time") as seen at `now_ms`.
    pub fn at(ms: i64, now_ms: i64) -> When {
        if ms <= 0 {
            return When { exact: String::new(), ago: "—".into(), short: "—".into() };
        }
        let exact = Timestamp::from_unix_ms(ms).to_rfc3339();
        let today = Timestamp::from_unix_ms(now_ms).to_rfc3339();
        let short = if exact.get(..10) == today.get(..10) {
            format!("{} UTC", exact.get(11..19).unwrap_or_default())
        } else {
            format!("{} {} UTC", exact.get(..10).unwrap_or_default(), exact.get(11..16).unwrap_or_default())
        };
        When { ago: relative(ms - now_ms), exact, short }
    }

    /// Whether there is a time at all.
    pub fn is_some(&self) -> bool {
        !self.exact.is_empty()
    }
}

/// The short exact time and how long ago, for text without a hover: `19:31:02 UTC (5 min
/// ago)`, `— ` for no time.
impl std::fmt::Display for When {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.is_some() { write!(f, "{} ({})", self.short, self.ago) } else { f.write_str("—") }
    }
}

/// An offset from now in words: negative is the past (`5 min ago`), positive the future
/// (`in 5 min`); within 5 s either way, `just now`; then `less than a minute ago`.
pub fn relative(offset_ms: i64) -> String {
    let secs = offset_ms.unsigned_abs() / 1000;
    if secs < 5 {
        return "just now".into();
    }
    let amount = match secs {
        // Minutes at the finest: a page that shows a time changes at most once a minute
        // (its live stream would otherwise see a new page every second).
        0..60 => "less than a minute".to_string(),
        60..3600 => format!("{} min", secs / 60),
        3600..172_800 => match (secs / 3600, secs % 3600 / 60) {
            (h, 0) => format!("{h} h"),
            (h, m) => format!("{h} h {m} min"),
        },
        _ => format!("{} days", secs / 86_400),
    };
    if offset_ms < 0 { format!("{amount} ago") } else { format!("in {amount}") }
}

/// A time in milliseconds since the epoch as seen now (see [`When`]).
pub fn time(ms: i64) -> When {
    When::at(ms, Timestamp::now().unix_ms())
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
    fn times_read_as_how_long_ago_with_the_exact_time_beside() {
        let now = Timestamp::parse("2026-05-01T19:36:02Z").unwrap().unix_ms();
        let w = When::at(now - 5 * 60_000, now);
        assert_eq!((w.ago.as_str(), w.short.as_str()), ("5 min ago", "19:31:02 UTC"));
        assert_eq!(w.exact, "2026-05-01T19:31:02.000Z");
        assert_eq!(w.to_string(), "19:31:02 UTC (5 min ago)");
        assert_eq!(When::at(now + 3_600_000 + 120_000, now).ago, "in 1 h 2 min");
        assert_eq!(When::at(now - 3 * 86_400_000, now).short, "2026-04-28 19:36 UTC");
        assert_eq!(When::at(now - 2_000, now).ago, "just now");
        assert_eq!(When::at(0, now).to_string(), "—");
        assert_eq!(relative(-59_999), "less than a minute ago");
        assert_eq!(relative(-7_200_000), "2 h ago");
    }

    #[test]
    fn path_segments_are_encoded() {
        assert_eq!(seg("checkout-v2.eu_1"), "checkout-v2.eu_1");
        assert_eq!(seg("a/b c?"), "a%2Fb%20c%3F");
        assert_eq!(service_url("prod", "x y"), "/ui/environments/prod/services/x%20y");
    }
}

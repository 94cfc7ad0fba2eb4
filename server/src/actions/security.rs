//! Sign-in and refusals: logins, failed logins, throttled logins (SEC-1) and actions refused
//! for a lack of role (403), each in the audit log and the server log.
//!
//! Usernames and addresses come from whoever is knocking: the log writes them as
//! escaped, quoted fields (`?` formatting), never as text of its own, and a username that
//! is not a valid name is recorded as [`INVALID_USERNAME`].

use std::net::IpAddr;

use tokio::time::Instant;

use super::{Actions, Actor, Forbidden, Via};
use crate::auth::{Door, LoginError, LoginLimiter, Session, login_to};
use crate::db::{AuditOutcome, AuditRow, now_ms};

/// Audit action of a successful login.
pub const AUDIT_LOGIN: &str = "auth.login";
/// Audit action of a failed login (unknown user, disabled user or wrong password).
pub const AUDIT_LOGIN_FAILED: &str = "auth.login_failed";
/// Audit action of a login refused before its password was checked (throttled).
pub const AUDIT_LOGIN_THROTTLED: &str = "auth.login_throttled";
/// Audit action of a request refused for a lack of role (403).
pub const AUDIT_REFUSED: &str = "access.refused";
/// How an attempted username that is not a valid name is recorded.
pub const INVALID_USERNAME: &str = "(not a valid username)";

/// One login attempt, as it reached an edge.
#[derive(Clone, Debug)]
pub struct LoginAttempt<'a> {
    /// The username typed (untrusted).
    pub username: &'a str,
    /// The password typed.
    pub password: &'a str,
    /// The client address (the socket peer, or what a trusted proxy said).
    pub client: IpAddr,
    /// `ui` or `api`.
    pub via: Via,
    /// The request's `x-request-id`.
    pub request_id: String,
}

fn recorded_name(username: &str) -> &str {
    if levee_agent::policy::check_name(username).is_ok() { username } else { INVALID_USERNAME }
}

impl Actions {
    /// Checks a login through `limiter` ([`login_to`]) and records its outcome: a success or a
    /// failure in the audit log and the server log; a throttled attempt in the log each
    /// time and in the audit log when a wait begins (so a flood of refused attempts does not
    /// flood the audit table).
    ///
    /// # Errors
    /// [`LoginError`], as [`login_to`] answers it.
    pub async fn login(&self, limiter: &LoginLimiter, a: LoginAttempt<'_>) -> Result<Session, LoginError> {
        let name = recorded_name(a.username);
        // The web form opens a UI session (audience levee-ui), anything else an API one.
        let door = if matches!(a.via, Via::Ui) { Door::Ui } else { Door::Api };
        let result = login_to(door, &self.store, &self.keys, limiter, a.client, a.username, a.password).await;
        let client = a.client.to_string();
        let mut began_wait = None;
        let (action, outcome) = match &result {
            Ok(s) => {
                tracing::info!(user = ?name, client = %client, via = a.via.as_str(), role = s.role.as_str(), "login");
                (AUDIT_LOGIN, AuditOutcome::Ok)
            }
            Err(LoginError::WrongCredentials) => {
                began_wait = limiter.check(a.username, a.client, Instant::now()).await.err();
                tracing::warn!(user = ?name, client = %client, via = a.via.as_str(),
                    throttled_for_s = began_wait.map(|t| t.retry_after.as_secs_f64()), "failed login");
                (AUDIT_LOGIN_FAILED, AuditOutcome::Failed)
            }
            Err(LoginError::TooManyAttempts(t)) => {
                tracing::warn!(user = ?name, client = %client, via = a.via.as_str(), by = t.by.as_str(),
                    retry_after_s = t.retry_after.as_secs_f64(), "login throttled");
                return result;
            }
            Err(LoginError::Internal(_)) => return result,
        };
        let mut rows = vec![row(name, &a, action, outcome, format!("from {client}"))];
        if let Some(t) = began_wait {
            // This failure started a wait: audited once, with its length.
            let detail = format!(
                "from {client}: further logins wait {:.1} s (throttled by {})",
                t.retry_after.as_secs_f64(),
                t.by.as_str()
            );
            rows.push(row(name, &a, AUDIT_LOGIN_THROTTLED, AuditOutcome::Throttled, detail));
        }
        for r in rows {
            if let Err(e) = self.store.append_audit(&r).await {
                tracing::error!(error = %levee_agent::report::ErrorChain(e.as_ref()), "auditing a login");
            }
        }
        result
    }

    /// Records that `by` was refused `attempted` (an action name or a page) on `target` for
    /// a lack of role: a warning in the log and a row in the audit log (outcome
    /// `forbidden`). Called by the edges, which check the role before anything else.
    pub async fn refused(&self, by: &Actor, attempted: &str, target: &str, why: &Forbidden) {
        tracing::warn!(actor = ?by.name, via = by.via.as_str(), request_id = ?by.request_id,
            attempted = ?attempted, target = ?target, needed = why.needed.as_str(), role = why.actual.as_str(),
            "refused: role too low");
        let r = AuditRow {
            at: now_ms(),
            actor: by.name.clone(),
            via: by.via,
            request_id: by.request_id.clone(),
            action: AUDIT_REFUSED.to_string(),
            environment: scope(target).0,
            service: scope(target).1,
            target: target.to_string(),
            outcome: AuditOutcome::Forbidden,
            detail: Some(format!(
                "{attempted} needs role {}; the actor has role {}",
                why.needed.as_str(),
                why.actual.as_str()
            )),
            ..Default::default()
        };
        if let Err(e) = self.store.append_audit(&r).await {
            tracing::error!(error = %levee_agent::report::ErrorChain(e.as_ref()), "auditing a refusal");
        }
    }

    /// [`Actions::refused`] without waiting for the audit write (for edges that check roles
    /// synchronously).
    pub fn spawn_refused(&self, by: Actor, attempted: String, target: String, why: Forbidden) {
        let actions = self.clone();
        tokio::spawn(async move { actions.refused(&by, &attempted, &target, &why).await });
    }
}

/// The environment and service a refused request was about, read from its address
/// (`METHOD /ui/environments/{env}/services/{svc}/…`, the same under `/api/v1`), so the
/// audit log's environment and service filters find the refusal with the changes.
fn scope(target: &str) -> (Option<String>, Option<String>) {
    let path = target.split_once(' ').map_or(target, |(_, p)| p);
    let path = path.split(['?', '#']).next().unwrap_or_default();
    let rest = path.strip_prefix("/ui/").or_else(|| path.strip_prefix("/api/v1/")).unwrap_or_default();
    let name = |s: Option<&str>| s.filter(|s| levee_agent::policy::check_name(s).is_ok()).map(String::from);
    let mut parts = rest.split('/');
    if parts.next() != Some("environments") {
        return (None, None);
    }
    let env = name(parts.next());
    let svc = if env.is_some() && parts.next() == Some("services") { name(parts.next()) } else { None };
    (env, svc)
}

/// A login's audit row: the account is its target, which it does not change (no `before`
/// or `after`); where it came from, and any wait it started, are its `detail`.
fn row(name: &str, a: &LoginAttempt<'_>, action: &str, outcome: AuditOutcome, detail: String) -> AuditRow {
    AuditRow {
        at: now_ms(),
        actor: name.to_string(),
        via: a.via,
        request_id: a.request_id.clone(),
        action: action.to_string(),
        target: format!("user:{name}"),
        outcome,
        detail: Some(detail),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::scope;

    #[test]
    fn a_refusal_is_filed_under_the_environment_and_service_it_was_about() {
        let s = |e: &str, v: &str| (Some(e.to_string()), Some(v.to_string()));
        assert_eq!(scope("POST /ui/environments/prod/services/checkout/flags/a.b"), s("prod", "checkout"));
        assert_eq!(scope("PUT /api/v1/environments/prod/services/checkout"), s("prod", "checkout"));
        assert_eq!(scope("POST /ui/environments/prod/profiles/x/apply"), (Some("prod".into()), None));
        assert_eq!(scope("GET /ui/admin"), (None, None));
        assert_eq!(scope("GET /ui/environments/%3Cb%3E/services/x"), (None, None), "only names are kept");
    }
}

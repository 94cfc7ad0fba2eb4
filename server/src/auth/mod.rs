//! Authentication: who a caller is, from a session, an API, agent or flags token. The
//! signing keys are in `keys.rs`, passwords in `password.rs`, logging in and out in
//! `login.rs`; the login limiter is its own module ([`crate::login_limit`], re-exported
//! here).
//!
//! Five kinds of token exist, told apart by audience and `kind`:
//! API sessions (`POST /api/v1/auth/login`, audience `levee-api`, 12 h), UI sessions (the
//! web login form, audience `levee-ui`, 12 h, only ever in the `levee_session` cookie), API
//! tokens for automation (audience `levee-api`, with a role, revocable) and agent tokens
//! (audience `levee-agent`, scoped to one environment and a list of services, revocable), and
//! flags tokens (audience `levee-flags`, scoped like an agent token, revocable), which read
//! flag evaluations over OFREP and nothing else.
//! Only HS256 is accepted, so a token signed with `none` or another algorithm, or minted for
//! another audience, is refused: a UI session cookie is not a bearer token of the API, an
//! API token put in a cookie does not open the UI, and an agent token calls neither.
//!
//! Expiry is checked with a leeway of [`EXPIRY_LEEWAY`] (5 s) so replicas whose clocks
//! differ slightly agree on a token at the moment it expires; no other claim has a leeway.
//!
//! A session also carries its user's session epoch (`epoch`): changing a user's password
//! or role bumps the epoch, which ends every session the user had open.

mod keys;
mod login;
mod password;

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::db::{Reader, Role, TokenKind};

pub use crate::login_limit::{
    LOGIN_ADDRESS_FREE_FAILURES, LOGIN_BASE_DELAY, LOGIN_FORGET_AFTER, LOGIN_FREE_FAILURES, LOGIN_MAX_DELAY,
    LOGIN_MAX_TRACKED, LoginLimiter, Throttled, ThrottledBy, login_delay,
};
pub use keys::Keys;
pub use login::{LoginError, Session, end_session, login, login_to};
pub use password::{
    MAX_PASSWORD_BYTES, MAX_PASSWORD_CHARS, MIN_PASSWORD_CHARS, check_password, hash_password,
    verify_password,
};

/// Issuer of every token.
pub const ISSUER: &str = "levee";
/// Audience of session and API tokens.
pub const AUDIENCE_API: &str = "levee-api";
/// Audience of agent tokens.
pub const AUDIENCE_AGENT: &str = "levee-agent";
/// Audience of UI sessions (the `levee_session` cookie).
pub const AUDIENCE_UI: &str = "levee-ui";
/// Audience of flags tokens (OFREP evaluation only).
pub const AUDIENCE_FLAGS: &str = "levee-flags";
/// Leeway on `exp`, in seconds: a token is accepted up to this long after its expiry so
/// replicas with slightly different clocks agree (documented in docs/api.md).
pub const EXPIRY_LEEWAY: u64 = 5;
/// Lifetime of a login session.
pub const SESSION_TTL: Duration = Duration::from_secs(12 * 3600);
/// Default lifetime of minted tokens: a quarter, so a token nobody rotates stops working
/// within one (rotation with an overlap, `levee tokens rotate`, replaces one without a
/// restart of the instances that use it).
pub const TOKEN_TTL: Duration = Duration::from_secs(90 * 86400);
/// Claims of every Levee token.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Claims {
    /// Subject: the username, or the token name.
    pub sub: String,
    /// Issuer (`levee`).
    pub iss: String,
    /// Audience: [`AUDIENCE_API`] or [`AUDIENCE_AGENT`].
    pub aud: String,
    /// Expiry, seconds since the epoch.
    pub exp: u64,
    /// Issued at, seconds since the epoch.
    pub iat: u64,
    /// Token id: a UUID; for API and agent tokens the id of its row (revocation looks it up).
    pub jti: String,
    /// `session`, `api` or `agent`.
    pub kind: String,
    /// Role (sessions and API tokens).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub role: Option<Role>,
    /// Environment (agent tokens).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub env: Option<String>,
    /// Services (agent tokens).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub services: Vec<String>,
    /// The user's session epoch when the session was opened (sessions); a session whose
    /// epoch is not the user's current one was ended by a password or role change.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub epoch: Option<i64>,
}

/// Where a session is used: the API (a bearer token) or the web UI (the cookie).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Door {
    /// `POST /api/v1/auth/login`: a bearer token, audience [`AUDIENCE_API`].
    Api,
    /// The web login form: the `levee_session` cookie, audience [`AUDIENCE_UI`].
    Ui,
}

impl Door {
    /// The audience of this door's sessions.
    pub const fn audience(self) -> &'static str {
        match self {
            Door::Api => AUDIENCE_API,
            Door::Ui => AUDIENCE_UI,
        }
    }
}

/// Who is calling, once authenticated.
#[derive(Clone, Debug)]
pub struct Principal {
    /// Name recorded in the audit log (`alice`, `token:deploy-bot`).
    pub actor: String,
    /// Read on this request: a user's from the database, an API token's from its row.
    pub role: Role,
    /// Token id (`jti`); logging out records it as ended.
    pub jti: String,
    /// The user this caller is (a session of that user, through the UI or the API);
    /// `None` for an API token, whatever its name.
    pub user: Option<String>,
    /// The person behind this caller: the user of a session; for an API token, the person
    /// it acts for (`TokenRow::person`). What four-eyes compares, never the actor's name.
    pub person: String,
    /// The API token this caller uses (its id); `None` for a session.
    pub token: Option<String>,
}

/// An authenticated agent.
#[derive(Clone, Debug)]
pub struct AgentPrincipal {
    /// Token name, for logs.
    pub name: String,
    /// Environment it may read.
    pub environment: String,
    /// Services it may read.
    pub services: Vec<String>,
    /// Token id (`jti`).
    pub jti: String,
    /// When a rotation's overlap ends the token (ms since the epoch); `None`: not rotated.
    /// Checked again when the token is accepted from memory while the database is away.
    pub revoked_at: Option<i64>,
}

impl AgentPrincipal {
    /// The one scope rule of an agent or flags token: it reads only its own environment.
    ///
    /// # Errors
    /// [`ScopeError::Environment`] naming both environments.
    pub fn check_environment(&self, environment: &str) -> Result<(), ScopeError> {
        if self.environment == environment {
            return Ok(());
        }
        Err(ScopeError::Environment { scoped: self.environment.clone(), asked: environment.to_string() })
    }

    /// …and of that environment only the services it names.
    ///
    /// # Errors
    /// [`ScopeError::Service`] naming the service and the allowed ones.
    pub fn check_service(&self, service: &str) -> Result<(), ScopeError> {
        if self.services.iter().any(|s| s == service) {
            return Ok(());
        }
        Err(ScopeError::Service { service: service.to_string(), allowed: self.services.join(", ") })
    }

    /// Both: it may read `service` of `environment`.
    ///
    /// # Errors
    /// The first of [`AgentPrincipal::check_environment`] and
    /// [`AgentPrincipal::check_service`] that refuses.
    pub fn check_scope(&self, environment: &str, service: &str) -> Result<(), ScopeError> {
        self.check_environment(environment)?;
        self.check_service(service)
    }
}

/// Why a scoped token may not read a service.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ScopeError {
    /// Another environment than the token's.
    #[error("this token is scoped to environment {scoped:?}, not {asked:?}")]
    Environment { scoped: String, asked: String },
    /// A service the token does not name.
    #[error("this token is not scoped to service {service:?} (allowed: {allowed})")]
    Service { service: String, allowed: String },
}

/// The token of an `Authorization` header's value `Bearer <token>` (the scheme in either
/// case, the token trimmed); `None` for another scheme.
pub fn bearer_token(authorization: &str) -> Option<&str> {
    let token = authorization.strip_prefix("Bearer ").or_else(|| authorization.strip_prefix("bearer "))?;
    Some(token.trim())
}

/// Why a token was refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum AuthError {
    /// No token was sent.
    #[error("missing bearer token")]
    Missing,
    /// Past its `exp` ([`EXPIRY_LEEWAY`]).
    #[error("token expired")]
    Expired,
    /// Bad signature, algorithm, audience, issuer or shape.
    #[error("invalid token: {0}")]
    Invalid(String),
    /// Revoked or unknown.
    #[error("token revoked")]
    Revoked,
    /// User disabled or gone.
    #[error("user is disabled or no longer exists")]
    UserGone,
    /// The token could not be checked: the database failed (never reported as an auth
    /// failure: an agent told "revoked" backs off for minutes). The cause is for the log.
    #[error("the token cannot be checked now: the database is unavailable")]
    Unavailable(String),
}

fn unavailable(e: anyhow::Error) -> AuthError {
    AuthError::Unavailable(levee_agent::report::ErrorChain(e.as_ref()).to_string())
}

/// Authenticates an API caller from a bearer token: checks the JWT, then that the session
/// was not ended by logging out and its user still exists and is enabled (taking the role
/// from the database so a demotion applies at once), or that the API token is not revoked.
pub async fn authenticate_api(keys: &Keys, store: &Reader, token: &str) -> Result<Principal, AuthError> {
    authenticate(keys, store, token, Door::Api).await
}

/// Authenticates a UI session cookie: a session of audience [`AUDIENCE_UI`], checked as
/// [`authenticate_api`] checks an API session. No other token opens the UI.
pub async fn authenticate_ui(keys: &Keys, store: &Reader, token: &str) -> Result<Principal, AuthError> {
    authenticate(keys, store, token, Door::Ui).await
}

async fn authenticate(keys: &Keys, store: &Reader, token: &str, door: Door) -> Result<Principal, AuthError> {
    let claims = keys.verify(token, door.audience())?;
    match claims.kind.as_str() {
        "session" => {
            if store.session_revoked(&claims.jti).await.map_err(unavailable)? {
                return Err(AuthError::Revoked);
            }
            let user = store.user(&claims.sub).await.map_err(unavailable)?;
            match user {
                Some(u) if u.disabled => Err(AuthError::UserGone),
                // A password or role change since this session opened ended it.
                Some(u) if claims.epoch.unwrap_or(0) != u.session_epoch => Err(AuthError::Revoked),
                Some(u) => Ok(Principal {
                    user: Some(u.username.clone()),
                    person: u.username.clone(),
                    token: None,
                    actor: u.username,
                    role: u.role,
                    jti: claims.jti,
                }),
                None => Err(AuthError::UserGone),
            }
        }
        "api" if door == Door::Api => {
            let row = store.token(&claims.jti).await.map_err(unavailable)?;
            match row {
                Some(t) if !t.revoked(crate::db::now_ms()) && t.kind == TokenKind::Api => Ok(Principal {
                    actor: format!("token:{}", t.name),
                    role: t.role.unwrap_or(Role::Viewer),
                    person: t.person(),
                    token: Some(t.id.clone()),
                    jti: t.id,
                    user: None,
                }),
                _ => Err(AuthError::Revoked),
            }
        }
        other => Err(AuthError::Invalid(format!("a {other} token cannot call the API"))),
    }
}

/// Authenticates an agent: an agent-audience JWT whose token row is not revoked (a
/// revocation scheduled by a rotation counts from its time).
/// [`AuthError::Unavailable`] when the row cannot be read (the caller may fall back on a
/// recent verification of the same token).
pub async fn authenticate_agent(
    keys: &Keys,
    store: &Reader,
    token: &str,
) -> Result<AgentPrincipal, AuthError> {
    authenticate_scoped(keys, store, token, TokenKind::Agent).await
}

/// Authenticates a flags token (OFREP): a flags-audience JWT whose token row is not
/// revoked. Its scope has the shape of an agent's.
pub async fn authenticate_flags(
    keys: &Keys,
    store: &Reader,
    token: &str,
) -> Result<AgentPrincipal, AuthError> {
    authenticate_scoped(keys, store, token, TokenKind::Flags).await
}

/// A token of `kind` (agent or flags: scoped to an environment and services), by its
/// audience and its row.
async fn authenticate_scoped(
    keys: &Keys,
    store: &Reader,
    token: &str,
    kind: TokenKind,
) -> Result<AgentPrincipal, AuthError> {
    let audience = match kind {
        TokenKind::Flags => AUDIENCE_FLAGS,
        TokenKind::Agent | TokenKind::Api => AUDIENCE_AGENT,
    };
    let claims = keys.verify(token, audience)?;
    if claims.kind != kind.as_str() {
        return Err(AuthError::Invalid(format!("not a token of kind {}", kind.as_str())));
    }
    let row = store.token(&claims.jti).await.map_err(unavailable)?;
    match row {
        Some(t) if !t.revoked(crate::db::now_ms()) && t.kind == kind => Ok(AgentPrincipal {
            name: t.name,
            environment: t.environment.unwrap_or_default(),
            services: t.services,
            jti: t.id,
            revoked_at: t.revoked_at,
        }),
        _ => Err(AuthError::Revoked),
    }
}

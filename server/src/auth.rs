//! Authentication: argon2 password hashes and HS256 JWTs with a pinned algorithm,
//! issuer and audience.
//!
//! Four kinds of token exist, told apart by audience and `kind`:
//! API sessions (`POST /api/v1/auth/login`, audience `levee-api`, 12 h), UI sessions (the
//! web login form, audience `levee-ui`, 12 h, only ever in the `levee_session` cookie), API
//! tokens for automation (audience `levee-api`, with a role, revocable) and agent tokens
//! (audience `levee-agent`, scoped to one environment and a list of services, revocable).
//! Only HS256 is accepted, so a token signed with `none` or another algorithm, or minted for
//! another audience, is refused: a UI session cookie is not a bearer token of the API, an
//! API token put in a cookie does not open the UI, and an agent token calls neither.
//!
//! Expiry is checked with a leeway of [`EXPIRY_LEEWAY`] (5 s) so replicas whose clocks
//! differ slightly agree on a token at the moment it expires; no other claim has a leeway.
//!
//! A session also carries its user's session epoch (`epoch`): changing a user's password
//! or role bumps the epoch, which ends every session the user had open.

use std::collections::HashMap;
use std::time::Duration;

use argon2::Argon2;
use argon2::password_hash::phc::PasswordHash;
use argon2::password_hash::{PasswordHasher, PasswordVerifier};
use jsonwebtoken::{Algorithm, DecodingKey, EncodingKey, Header, Validation};
use serde::{Deserialize, Serialize};
use tokio::time::Instant;

use crate::db::{Role, Store, TokenKind, TokenRow, now_ms};

/// Issuer of every token.
pub const ISSUER: &str = "levee";
/// Audience of session and API tokens.
pub const AUDIENCE_API: &str = "levee-api";
/// Audience of agent tokens.
pub const AUDIENCE_AGENT: &str = "levee-agent";
/// Audience of UI sessions (the `levee_session` cookie).
pub const AUDIENCE_UI: &str = "levee-ui";
/// Leeway on `exp`, in seconds: a token is accepted up to this long after its expiry so
/// replicas with slightly different clocks agree (documented in docs/api.md).
pub const EXPIRY_LEEWAY: u64 = 5;
/// Lifetime of a login session.
pub const SESSION_TTL: Duration = Duration::from_secs(12 * 3600);
/// Default lifetime of minted API and agent tokens.
pub const TOKEN_TTL: Duration = Duration::from_secs(365 * 86400);
/// Failed logins allowed per username within [`LOGIN_WINDOW`].
pub const LOGIN_MAX_FAILURES: u32 = 10;
/// Window of the failed-login count.
pub const LOGIN_WINDOW: Duration = Duration::from_secs(300);

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

/// Signs and checks tokens.
#[derive(Clone)]
pub struct Keys {
    enc: EncodingKey,
    dec: DecodingKey,
}

impl std::fmt::Debug for Keys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Keys(<secret>)")
    }
}

fn now_s() -> u64 {
    (now_ms() / 1000) as u64
}

impl Keys {
    /// Keys from a shared secret (at least 32 bytes).
    pub fn new(secret: &[u8]) -> anyhow::Result<Keys> {
        anyhow::ensure!(secret.len() >= 32, "the JWT secret must be at least 32 bytes");
        Ok(Keys { enc: EncodingKey::from_secret(secret)?, dec: DecodingKey::from_secret(secret)? })
    }

    /// Signs claims with HS256.
    pub fn sign(&self, claims: &Claims) -> anyhow::Result<String> {
        Ok(jsonwebtoken::encode(&Header::new(Algorithm::HS256), claims, &self.enc)?)
    }

    /// Verifies signature (HS256 only), issuer, audience and expiry.
    pub fn verify(&self, token: &str, audience: &str) -> Result<Claims, AuthError> {
        let mut v = Validation::new(Algorithm::HS256);
        v.set_audience(&[audience]);
        v.set_issuer(&[ISSUER]);
        v.set_required_spec_claims(&["exp", "iss", "aud", "sub"]);
        v.leeway = EXPIRY_LEEWAY;
        match jsonwebtoken::decode::<Claims>(token, &self.dec, &v) {
            Ok(data) => Ok(data.claims),
            Err(e) => match e.kind() {
                jsonwebtoken::errors::ErrorKind::ExpiredSignature => Err(AuthError::Expired),
                other => Err(AuthError::Invalid(format!("{other:?}").to_lowercase())),
            },
        }
    }

    /// A login session token for a user, for `door`, at the user's session `epoch`.
    pub fn session(
        &self,
        username: &str,
        role: Role,
        epoch: i64,
        door: Door,
    ) -> anyhow::Result<(String, u64)> {
        let iat = now_s();
        let exp = iat + SESSION_TTL.as_secs();
        let claims = Claims {
            sub: username.to_string(),
            iss: ISSUER.into(),
            aud: door.audience().into(),
            exp,
            iat,
            jti: uuid::Uuid::new_v4().to_string(),
            kind: "session".into(),
            role: Some(role),
            env: None,
            services: Vec::new(),
            epoch: Some(epoch),
        };
        Ok((self.sign(&claims)?, exp))
    }

    /// The anti-CSRF token of a UI session: HMAC-SHA256, under the JWT key, of the
    /// session's token id with a fixed label (so it can never be mistaken for a JWT
    /// signature). Bound to one session; nothing is stored.
    pub fn csrf_token(&self, session_id: &str) -> anyhow::Result<String> {
        Ok(jsonwebtoken::crypto::sign(&csrf_message(session_id), &self.enc, Algorithm::HS256)?)
    }

    /// Whether `token` is the anti-CSRF token of the session `session_id` (constant-time).
    pub fn check_csrf_token(&self, session_id: &str, token: &str) -> bool {
        !token.is_empty()
            && jsonwebtoken::crypto::verify(token, &csrf_message(session_id), &self.dec, Algorithm::HS256)
                .unwrap_or(false)
    }

    /// Mints the JWT of a token row.
    pub fn mint(&self, t: &TokenRow) -> anyhow::Result<String> {
        let claims = Claims {
            sub: t.name.clone(),
            iss: ISSUER.into(),
            aud: match t.kind {
                TokenKind::Api => AUDIENCE_API.into(),
                TokenKind::Agent => AUDIENCE_AGENT.into(),
            },
            exp: (t.expires_at / 1000) as u64,
            iat: (t.created_at / 1000) as u64,
            jti: t.id.clone(),
            kind: t.kind.as_str().into(),
            role: t.role,
            env: t.environment.clone(),
            services: t.services.clone(),
            epoch: None,
        };
        self.sign(&claims)
    }
}

fn csrf_message(session_id: &str) -> Vec<u8> {
    format!("levee-ui-csrf\0{session_id}").into_bytes()
}

/// Fewest characters of a password.
pub const MIN_PASSWORD_CHARS: usize = 12;
/// Most bytes of a password.
pub const MAX_PASSWORD_BYTES: usize = 1024;

/// Checks a new password: [`MIN_PASSWORD_CHARS`] characters to [`MAX_PASSWORD_BYTES`] bytes.
///
/// # Errors
/// What is allowed, in words.
pub fn check_password(password: &str) -> Result<(), String> {
    if password.chars().count() < MIN_PASSWORD_CHARS || password.len() > MAX_PASSWORD_BYTES {
        return Err(format!("must be {MIN_PASSWORD_CHARS} to {MAX_PASSWORD_BYTES} characters long"));
    }
    Ok(())
}

/// Hashes a password with argon2id (default parameters). Runs on a blocking thread.
pub async fn hash_password(password: String) -> anyhow::Result<String> {
    tokio::task::spawn_blocking(move || {
        Argon2::default()
            .hash_password(password.as_bytes())
            .map(|h| h.to_string())
            .map_err(|e| anyhow::anyhow!("hashing password: {e}"))
    })
    .await?
}

/// Checks a password against a PHC string. Runs on a blocking thread.
pub async fn verify_password(password: String, phc: String) -> bool {
    tokio::task::spawn_blocking(move || {
        PasswordHash::new(&phc)
            .map(|h| Argon2::default().verify_password(password.as_bytes(), &h).is_ok())
            .unwrap_or(false)
    })
    .await
    .unwrap_or(false)
}

/// Authenticates an API caller from a bearer token: checks the JWT, then that the session
/// was not ended by logging out and its user still exists and is enabled (taking the role
/// from the database so a demotion applies at once), or that the API token is not revoked.
pub async fn authenticate_api(keys: &Keys, store: &Store, token: &str) -> Result<Principal, AuthError> {
    authenticate(keys, store, token, Door::Api).await
}

/// Authenticates a UI session cookie: a session of audience [`AUDIENCE_UI`], checked as
/// [`authenticate_api`] checks an API session. No other token opens the UI.
pub async fn authenticate_ui(keys: &Keys, store: &Store, token: &str) -> Result<Principal, AuthError> {
    authenticate(keys, store, token, Door::Ui).await
}

async fn authenticate(keys: &Keys, store: &Store, token: &str, door: Door) -> Result<Principal, AuthError> {
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
                Some(u) => Ok(Principal { actor: u.username, role: u.role, jti: claims.jti }),
                None => Err(AuthError::UserGone),
            }
        }
        "api" if door == Door::Api => {
            let row = store.token(&claims.jti).await.map_err(unavailable)?;
            match row {
                Some(t) if t.revoked_at.is_none() && t.kind == TokenKind::Api => Ok(Principal {
                    actor: format!("token:{}", t.name),
                    role: t.role.unwrap_or(Role::Viewer),
                    jti: t.id,
                }),
                _ => Err(AuthError::Revoked),
            }
        }
        other => Err(AuthError::Invalid(format!("a {other} token cannot call the API"))),
    }
}

/// Authenticates an agent: an agent-audience JWT whose token row is not revoked.
/// [`AuthError::Unavailable`] when the row cannot be read (the caller may fall back on a
/// recent verification of the same token).
pub async fn authenticate_agent(
    keys: &Keys,
    store: &Store,
    token: &str,
) -> Result<AgentPrincipal, AuthError> {
    let claims = keys.verify(token, AUDIENCE_AGENT)?;
    if claims.kind != "agent" {
        return Err(AuthError::Invalid("not an agent token".into()));
    }
    let row = store.token(&claims.jti).await.map_err(unavailable)?;
    match row {
        Some(t) if t.revoked_at.is_none() && t.kind == TokenKind::Agent => Ok(AgentPrincipal {
            name: t.name,
            environment: t.environment.unwrap_or_default(),
            services: t.services,
            jti: t.id,
        }),
        _ => Err(AuthError::Revoked),
    }
}

/// Counts failed logins per username, so guessing a password is throttled per user (a
/// lockout of [`LOGIN_WINDOW`] after [`LOGIN_MAX_FAILURES`]; a success clears the count).
#[derive(Debug, Default)]
pub struct LoginLimiter {
    failures: tokio::sync::Mutex<HashMap<String, (u32, Instant)>>,
}

impl LoginLimiter {
    /// Whether another attempt for `user` is allowed now.
    pub async fn allowed(&self, user: &str) -> bool {
        let mut m = self.failures.lock().await;
        match m.get(user) {
            Some((n, since)) if since.elapsed() < LOGIN_WINDOW => *n < LOGIN_MAX_FAILURES,
            Some(_) => {
                m.remove(user);
                true
            }
            None => true,
        }
    }

    /// Records a failure.
    pub async fn failed(&self, user: &str) {
        let mut m = self.failures.lock().await;
        if m.len() > 100_000 {
            m.retain(|_, (_, since)| since.elapsed() < LOGIN_WINDOW);
        }
        let e = m.entry(user.to_string()).or_insert((0, Instant::now()));
        if e.1.elapsed() >= LOGIN_WINDOW {
            *e = (0, Instant::now());
        }
        e.0 += 1;
    }

    /// Clears the count after a success.
    pub async fn succeeded(&self, user: &str) {
        self.failures.lock().await.remove(user);
    }
}

/// A session opened by logging in.
#[derive(Clone)]
pub struct Session {
    /// The session JWT ([`AUDIENCE_API`], [`SESSION_TTL`]).
    pub token: String,
    /// Its expiry, seconds since the epoch.
    pub expires_at: u64,
    /// The user's role.
    pub role: Role,
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session").field("expires_at", &self.expires_at).field("role", &self.role).finish()
    }
}

/// Why a login failed.
#[derive(Debug, thiserror::Error)]
pub enum LoginError {
    /// Unknown user, disabled user or wrong password (never told apart).
    #[error("wrong username or password")]
    WrongCredentials,
    /// [`LOGIN_MAX_FAILURES`] failures within [`LOGIN_WINDOW`] for this username.
    #[error("too many failed logins for this user; try again in {} minutes", LOGIN_WINDOW.as_secs() / 60)]
    TooManyAttempts,
    /// The database or the signing key failed; the cause is for the log only.
    #[error("login failed")]
    Internal(#[from] anyhow::Error),
}

const DUMMY_HASH: &str =
    "$argon2id$v=19$m=19456,t=2,p=1$c29tZXNhbHRzb21lc2FsdA$Jr1h7BO0U6A4lR2UMmNGZhbNvnxKkPfJuLx9c/7nQg8";

/// Checks a username and password and opens a session. Rate limited per username by
/// `limiter`; an unknown user costs the same argon2 verification as a known one, so timing
/// does not tell them apart.
///
/// # Errors
/// [`LoginError`].
pub async fn login(
    store: &Store,
    keys: &Keys,
    limiter: &LoginLimiter,
    username: &str,
    password: &str,
) -> Result<Session, LoginError> {
    login_to(Door::Api, store, keys, limiter, username, password).await
}

/// [`login`] for `door`: the session's audience is the door's, so a UI session is never
/// a bearer token of the API (and an API session never a UI cookie).
///
/// # Errors
/// [`LoginError`].
pub async fn login_to(
    door: Door,
    store: &Store,
    keys: &Keys,
    limiter: &LoginLimiter,
    username: &str,
    password: &str,
) -> Result<Session, LoginError> {
    if levee_agent::policy::check_name(username).is_err() || password.len() > MAX_PASSWORD_BYTES {
        return Err(LoginError::WrongCredentials);
    }
    if !limiter.allowed(username).await {
        return Err(LoginError::TooManyAttempts);
    }
    let user = store.user(username).await?;
    let (phc, known) = match &user {
        Some(u) if !u.disabled => (u.password_hash.clone(), true),
        _ => (DUMMY_HASH.to_string(), false),
    };
    let ok = verify_password(password.to_string(), phc).await && known;
    let Some(user) = user.filter(|_| ok) else {
        limiter.failed(username).await;
        return Err(LoginError::WrongCredentials);
    };
    limiter.succeeded(username).await;
    let (token, expires_at) = keys.session(&user.username, user.role, user.session_epoch, door)?;
    Ok(Session { token, expires_at, role: user.role })
}

/// Ends a session before its expiry: its token is refused from now on. The record is kept
/// until the token would have expired anyway ([`SESSION_TTL`]).
///
/// # Errors
/// The database failed.
pub async fn end_session(store: &Store, jti: &str) -> anyhow::Result<()> {
    store.revoke_session(jti, now_ms() + SESSION_TTL.as_millis() as i64).await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys() -> Keys {
        Keys::new(&[7u8; 32]).unwrap()
    }

    #[test]
    fn session_verifies_only_for_its_audience() {
        let k = keys();
        let (tok, _) = k.session("alice", Role::Operator, 0, Door::Api).unwrap();
        assert_eq!(k.verify(&tok, AUDIENCE_API).unwrap().sub, "alice");
        assert!(matches!(k.verify(&tok, AUDIENCE_AGENT), Err(AuthError::Invalid(_))));
    }

    #[test]
    fn other_key_and_alg_none_are_refused() {
        let (tok, _) = keys().session("alice", Role::Admin, 0, Door::Api).unwrap();
        let other = Keys::new(&[8u8; 32]).unwrap();
        assert!(matches!(other.verify(&tok, AUDIENCE_API), Err(AuthError::Invalid(_))));
        // alg=none: header {"alg":"none","typ":"JWT"}, same payload, empty signature.
        let payload = tok.split('.').nth(1).unwrap();
        let none = format!("eyJhbGciOiJub25lIiwidHlwIjoiSldUIn0.{payload}.");
        assert!(keys().verify(&none, AUDIENCE_API).is_err());
    }

    #[test]
    fn csrf_token_is_bound_to_the_session_and_the_key() {
        let k = keys();
        let t = k.csrf_token("session-a").unwrap();
        assert!(k.check_csrf_token("session-a", &t));
        assert!(!k.check_csrf_token("session-b", &t));
        assert!(!k.check_csrf_token("session-a", ""));
        assert!(!k.check_csrf_token("session-a", "not base64 at all!"));
        let other = Keys::new(&[8u8; 32]).unwrap();
        assert!(!other.check_csrf_token("session-a", &t));
    }

    #[test]
    fn expired_token_is_expired() {
        let k = keys();
        let claims = Claims {
            sub: "a".into(),
            iss: ISSUER.into(),
            aud: AUDIENCE_API.into(),
            exp: 1000,
            iat: 10,
            jti: "j".into(),
            kind: "session".into(),
            role: Some(Role::Viewer),
            env: None,
            services: vec![],
            epoch: None,
        };
        let tok = k.sign(&claims).unwrap();
        assert_eq!(k.verify(&tok, AUDIENCE_API).unwrap_err(), AuthError::Expired);
    }
}

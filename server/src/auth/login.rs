//! Logging in and out: a username and password checked (throttled by the login limiter)
//! open a session for a door; logging out ends one.

use std::net::IpAddr;

use tokio::time::Instant;

use super::{Door, Keys, MAX_PASSWORD_BYTES, SESSION_TTL, verify_password};
use crate::db::{Reader, Role, Store, now_ms};
use crate::login_limit::{LoginLimiter, Throttled};

/// A session opened by logging in.
#[derive(Clone)]
pub struct Session {
    /// The session JWT ([`AUDIENCE_API`](super::AUDIENCE_API), [`SESSION_TTL`]).
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
    /// Too many failed logins for this account from this address, or from this address
    /// over every account ([`LoginLimiter`]): try again after the wait.
    #[error("too many failed logins; try again in {} s", .0.retry_after.as_secs().max(1))]
    TooManyAttempts(Throttled),
    /// The database or the signing key failed; the cause is for the log only.
    #[error("login failed")]
    Internal(#[from] anyhow::Error),
}

const DUMMY_HASH: &str =
    "$argon2id$v=19$m=19456,t=2,p=1$c29tZXNhbHRzb21lc2FsdA$Jr1h7BO0U6A4lR2UMmNGZhbNvnxKkPfJuLx9c/7nQg8";

/// Checks a username and password from client address `addr` and opens a session.
/// Throttled by `limiter` per (account, address) and per address; an unknown user costs the
/// same argon2 verification as a known one, so timing does not tell them apart.
///
/// # Errors
/// [`LoginError`].
pub async fn login(
    store: &Reader,
    keys: &Keys,
    limiter: &LoginLimiter,
    addr: IpAddr,
    username: &str,
    password: &str,
) -> Result<Session, LoginError> {
    login_to(Door::Api, store, keys, limiter, addr, username, password).await
}

/// [`login`] for `door`: the session's audience is the door's, so a UI session is never
/// a bearer token of the API (and an API session never a UI cookie).
///
/// # Errors
/// [`LoginError`].
pub async fn login_to(
    door: Door,
    store: &Reader,
    keys: &Keys,
    limiter: &LoginLimiter,
    addr: IpAddr,
    username: &str,
    password: &str,
) -> Result<Session, LoginError> {
    limiter.check(username, addr, Instant::now()).await.map_err(LoginError::TooManyAttempts)?;
    if levee_agent::policy::check_name(username).is_err() || password.len() > MAX_PASSWORD_BYTES {
        // Not a name any account can have: counted against the address (one shared key).
        limiter.failed("", addr, Instant::now()).await;
        return Err(LoginError::WrongCredentials);
    }
    let user = store.user(username).await?;
    let (phc, known) = match &user {
        Some(u) if !u.disabled => (u.password_hash.clone(), true),
        _ => (DUMMY_HASH.to_string(), false),
    };
    let ok = verify_password(password.to_string(), phc).await && known;
    let Some(user) = user.filter(|_| ok) else {
        limiter.failed(username, addr, Instant::now()).await;
        return Err(LoginError::WrongCredentials);
    };
    limiter.succeeded(username, addr).await;
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

//! Authentication: argon2 password hashes and HS256 JWTs with a pinned algorithm,
//! issuer and audience.
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

use std::collections::HashMap;
use std::net::IpAddr;
use std::time::Duration;

use argon2::Argon2;
use argon2::password_hash::phc::PasswordHash;
use argon2::password_hash::{PasswordHasher, PasswordVerifier};
use jsonwebtoken::{Algorithm, DecodingKey, EncodingKey, Header, Validation};
use serde::{Deserialize, Serialize};
use tokio::time::Instant;

use crate::db::{Reader, Role, Store, TokenKind, TokenRow, now_ms};

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
/// Failed logins of one account from one client address that cost nothing; each one past
/// them makes that pair wait ([`login_delay`]).
pub const LOGIN_FREE_FAILURES: u32 = 5;
/// Failed logins from one client address, over every account, that cost nothing; past
/// them the whole address waits (password spraying across usernames).
pub const LOGIN_ADDRESS_FREE_FAILURES: u32 = 20;
/// Wait after the first failure past the free ones; it doubles with each further failure.
pub const LOGIN_BASE_DELAY: Duration = Duration::from_secs(1);
/// Longest wait, of an (account, address) pair and of an address: the owner of an account
/// is never held up for longer, even from the attacker's address.
pub const LOGIN_MAX_DELAY: Duration = Duration::from_secs(30);
/// A key's failures are forgotten after this long without a new one.
pub const LOGIN_FORGET_AFTER: Duration = Duration::from_secs(15 * 60);
/// Most (account, address) and address entries kept; past it the oldest are dropped.
pub const LOGIN_MAX_TRACKED: usize = 100_000;

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

/// Signs and checks tokens: signs with the current secret, accepts a signature by the
/// current one or by any previous one still listed (a secret rotated by the operator:
/// tokens signed before the rotation keep working until they expire or the old secret is
/// taken off the list).
#[derive(Clone)]
pub struct Keys {
    enc: EncodingKey,
    dec: DecodingKey,
    previous: Vec<DecodingKey>,
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
        Keys::rotated(secret, &[])
    }

    /// Keys signing with `current` and also accepting what `previous` secrets signed (each
    /// at least 32 bytes).
    pub fn rotated(current: &[u8], previous: &[&[u8]]) -> anyhow::Result<Keys> {
        anyhow::ensure!(current.len() >= 32, "the JWT secret must be at least 32 bytes");
        anyhow::ensure!(
            previous.iter().all(|p| p.len() >= 32),
            "every previous JWT secret must be at least 32 bytes"
        );
        Ok(Keys {
            enc: EncodingKey::from_secret(current)?,
            dec: DecodingKey::from_secret(current)?,
            previous: previous.iter().map(|p| DecodingKey::from_secret(p)).collect::<Result<_, _>>()?,
        })
    }

    /// The current key, then the previous ones.
    fn decoding_keys(&self) -> impl Iterator<Item = &DecodingKey> {
        std::iter::once(&self.dec).chain(&self.previous)
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
        let mut last = None;
        for key in self.decoding_keys() {
            match jsonwebtoken::decode::<Claims>(token, key, &v) {
                Ok(data) => return Ok(data.claims),
                // Another key may have signed it: only a bad signature moves on.
                Err(e) if matches!(e.kind(), jsonwebtoken::errors::ErrorKind::InvalidSignature) => {
                    last = Some(e)
                }
                Err(e) => return Err(token_error(&e)),
            }
        }
        Err(token_error(&last.expect("there is always a current key")))
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
            && self.decoding_keys().any(|key| {
                jsonwebtoken::crypto::verify(token, &csrf_message(session_id), key, Algorithm::HS256)
                    .unwrap_or(false)
            })
    }

    /// Mints the JWT of a token row.
    pub fn mint(&self, t: &TokenRow) -> anyhow::Result<String> {
        let claims = Claims {
            sub: t.name.clone(),
            iss: ISSUER.into(),
            aud: match t.kind {
                TokenKind::Api => AUDIENCE_API.into(),
                TokenKind::Agent => AUDIENCE_AGENT.into(),
                TokenKind::Flags => AUDIENCE_FLAGS.into(),
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

fn token_error(e: &jsonwebtoken::errors::Error) -> AuthError {
    match e.kind() {
        jsonwebtoken::errors::ErrorKind::ExpiredSignature => AuthError::Expired,
        other => AuthError::Invalid(format!("{other:?}").to_lowercase()),
    }
}

fn csrf_message(session_id: &str) -> Vec<u8> {
    format!("levee-ui-csrf\0{session_id}").into_bytes()
}

/// Fewest characters of a password.
pub const MIN_PASSWORD_CHARS: usize = 12;
/// Most bytes of a password.
pub const MAX_PASSWORD_BYTES: usize = 1024;

/// Most characters of a new password: at most four bytes each, so never past
/// [`MAX_PASSWORD_BYTES`]. Counted in characters, as the OpenAPI document's `maxLength` is.
pub const MAX_PASSWORD_CHARS: usize = MAX_PASSWORD_BYTES / 4;

/// Checks a new password: [`MIN_PASSWORD_CHARS`] to [`MAX_PASSWORD_CHARS`] characters.
///
/// # Errors
/// What is allowed, in words.
pub fn check_password(password: &str) -> Result<(), String> {
    let chars = password.chars().count();
    if !(MIN_PASSWORD_CHARS..=MAX_PASSWORD_CHARS).contains(&chars) {
        return Err(format!("must be {MIN_PASSWORD_CHARS} to {MAX_PASSWORD_CHARS} characters long"));
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

/// The wait after `failures` failures when `free` of them cost nothing: none up to
/// `free`, then [`LOGIN_BASE_DELAY`] doubling per failure, at most `max`.
pub fn login_delay(failures: u32, free: u32, max: Duration) -> Duration {
    if failures <= free {
        return Duration::ZERO;
    }
    let doublings = (failures - free - 1).min(16);
    LOGIN_BASE_DELAY.saturating_mul(1 << doublings).min(max)
}

#[derive(Clone, Copy, Debug)]
struct Failures {
    count: u32,
    last: Instant,
    /// No attempt is checked before this.
    until: Instant,
}

impl Failures {
    fn fresh(&self, now: Instant) -> bool {
        now.saturating_duration_since(self.last) < LOGIN_FORGET_AFTER
    }

    fn fail(entry: Option<Failures>, now: Instant, free: u32, max: Duration) -> Failures {
        let count = entry.filter(|e| e.fresh(now)).map_or(0, |e| e.count).saturating_add(1);
        Failures { count, last: now, until: now + login_delay(count, free, max) }
    }
}

/// Which key made a login wait.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ThrottledBy {
    /// This account from this address ([`LOGIN_FREE_FAILURES`]).
    AccountAndAddress,
    /// This address, over every account ([`LOGIN_ADDRESS_FREE_FAILURES`]).
    Address,
}

impl ThrottledBy {
    /// `account+address` or `address`, as logged and audited.
    pub const fn as_str(self) -> &'static str {
        match self {
            ThrottledBy::AccountAndAddress => "account+address",
            ThrottledBy::Address => "address",
        }
    }
}

/// A login refused before its password was checked, and for how long.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Throttled {
    /// How long until an attempt is checked again.
    pub retry_after: Duration,
    /// Which limit it hit.
    pub by: ThrottledBy,
}

/// Throttles password guessing without handing attackers a way to lock an owner out
/// (scenario SEC-1).
///
/// Failures are counted per (account, client address) and per client address. Past the
/// free failures a key waits, growing from [`LOGIN_BASE_DELAY`] to at most
/// [`LOGIN_MAX_DELAY`]; an attempt made while waiting is refused without checking the password and
/// does not lengthen the wait. There is no lockout per account alone: wrong passwords for
/// `admin` from one address never slow down `admin` logging in from another, and even
/// from the same address the wait never exceeds [`LOGIN_MAX_DELAY`]. A success clears the
/// (account, address) count, never the address's. Both waits are capped at
/// [`LOGIN_MAX_DELAY`]. Counts are forgotten after
/// [`LOGIN_FORGET_AFTER`] without a failure. Memory is bounded by [`LOGIN_MAX_TRACKED`].
#[derive(Debug, Default)]
pub struct LoginLimiter {
    state: tokio::sync::Mutex<LimiterState>,
}

#[derive(Debug, Default)]
struct LimiterState {
    pairs: HashMap<(String, IpAddr), Failures>,
    addresses: HashMap<IpAddr, Failures>,
}

fn bound<K: Eq + std::hash::Hash + Clone>(m: &mut HashMap<K, Failures>, now: Instant) {
    if m.len() < LOGIN_MAX_TRACKED {
        return;
    }
    m.retain(|_, f| f.fresh(now));
    if m.len() >= LOGIN_MAX_TRACKED {
        // Still full of fresh keys: drop the oldest half.
        let mut lasts: Vec<Instant> = m.values().map(|f| f.last).collect();
        lasts.sort_unstable();
        let cut = lasts[lasts.len() / 2];
        m.retain(|_, f| f.last > cut);
    }
}

impl LoginLimiter {
    /// Whether an attempt for `user` from `addr` is checked now, at `now`.
    ///
    /// # Errors
    /// [`Throttled`] with the wait, when either key is still waiting.
    pub async fn check(&self, user: &str, addr: IpAddr, now: Instant) -> Result<(), Throttled> {
        let user = if levee_agent::policy::check_name(user).is_ok() { user } else { "" };
        let st = self.state.lock().await;
        let wait = |f: Option<&Failures>| {
            f.filter(|f| f.fresh(now) && f.until > now).map(|f| f.until.saturating_duration_since(now))
        };
        if let Some(retry_after) = wait(st.addresses.get(&addr)) {
            return Err(Throttled { retry_after, by: ThrottledBy::Address });
        }
        if let Some(retry_after) = wait(st.pairs.get(&(user.to_string(), addr))) {
            return Err(Throttled { retry_after, by: ThrottledBy::AccountAndAddress });
        }
        Ok(())
    }

    /// Records a failed attempt of `user` from `addr` at `now`.
    pub async fn failed(&self, user: &str, addr: IpAddr, now: Instant) {
        let mut st = self.state.lock().await;
        bound(&mut st.pairs, now);
        bound(&mut st.addresses, now);
        let key = (user.to_string(), addr);
        let pair = Failures::fail(st.pairs.get(&key).copied(), now, LOGIN_FREE_FAILURES, LOGIN_MAX_DELAY);
        st.pairs.insert(key, pair);
        let a = Failures::fail(
            st.addresses.get(&addr).copied(),
            now,
            LOGIN_ADDRESS_FREE_FAILURES,
            LOGIN_MAX_DELAY,
        );
        st.addresses.insert(addr, a);
    }

    /// Clears the count of `user` from `addr` after a success.
    pub async fn succeeded(&self, user: &str, addr: IpAddr) {
        self.state.lock().await.pairs.remove(&(user.to_string(), addr));
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

    /// A rotated secret: what the old one signed is accepted until it expires, new tokens
    /// are signed with the new one (which a replica still on the old key alone refuses),
    /// and once the old secret is taken off the list its tokens are refused.
    #[test]
    fn rotated_secret_accepts_old_tokens_and_signs_with_the_new_one() {
        let (old_tok, _) = keys().session("alice", Role::Admin, 0, Door::Api).unwrap();
        let old_csrf = keys().csrf_token("s").unwrap();
        let rotated = Keys::rotated(&[9u8; 32], &[&[7u8; 32]]).unwrap();
        assert_eq!(rotated.verify(&old_tok, AUDIENCE_API).unwrap().sub, "alice");
        assert!(rotated.check_csrf_token("s", &old_csrf));
        let (new_tok, _) = rotated.session("bob", Role::Admin, 0, Door::Api).unwrap();
        assert!(matches!(keys().verify(&new_tok, AUDIENCE_API), Err(AuthError::Invalid(_))));
        let done = Keys::new(&[9u8; 32]).unwrap();
        assert!(matches!(done.verify(&old_tok, AUDIENCE_API), Err(AuthError::Invalid(_))));
        assert_eq!(done.verify(&new_tok, AUDIENCE_API).unwrap().sub, "bob");
        // The audience is still checked with an old key.
        assert!(matches!(rotated.verify(&old_tok, AUDIENCE_AGENT), Err(AuthError::Invalid(_))));
        assert!(Keys::rotated(&[9u8; 32], &[b"short"]).is_err());
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

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn login_delays_grow_to_a_cap() {
        let d = |n| login_delay(n, LOGIN_FREE_FAILURES, LOGIN_MAX_DELAY).as_secs();
        let free = LOGIN_FREE_FAILURES;
        assert_eq!((d(0), d(free)), (0, 0));
        assert_eq!((d(free + 1), d(free + 2), d(free + 3), d(free + 4)), (1, 2, 4, 8));
        assert_eq!(d(free + 10), LOGIN_MAX_DELAY.as_secs());
        assert_eq!(d(u32::MAX), LOGIN_MAX_DELAY.as_secs());
    }

    /// SEC-1: wrong passwords for `admin` from one address make that address wait (growing,
    /// capped); `admin` from another address is never slowed; an attempt while waiting
    /// does not lengthen the wait, and after it the right password works even from the
    /// attacker's address. Spraying one address across usernames is limited too.
    #[tokio::test]
    async fn sec_1_throttle_per_account_and_address_never_locks_the_owner_out() {
        let l = LoginLimiter::default();
        let (attacker, owner) = (ip("203.0.113.66"), ip("198.51.100.7"));
        let t0 = Instant::now();
        let mut now = t0;
        for _ in 0..LOGIN_FREE_FAILURES {
            assert!(l.check("admin", attacker, now).await.is_ok());
            l.failed("admin", attacker, now).await;
        }
        assert!(l.check("admin", attacker, now).await.is_ok(), "the free failures cost nothing");
        // Keep guessing, each time as soon as allowed, for an hour.
        let mut waits = Vec::new();
        while now < t0 + Duration::from_secs(3600) {
            match l.check("admin", attacker, now).await {
                Ok(()) => l.failed("admin", attacker, now).await,
                Err(t) => {
                    assert!(t.retry_after <= LOGIN_MAX_DELAY, "never more than the cap: {t:?}");
                    // Hammering while waiting changes nothing.
                    for _ in 0..100 {
                        assert_eq!(l.check("admin", attacker, now).await, Err(t));
                    }
                    waits.push(t.retry_after);
                    now += t.retry_after;
                }
            }
            // The owner, from elsewhere, is never held up.
            assert!(l.check("admin", owner, now).await.is_ok());
        }
        assert_eq!(&waits[..4], &[1, 2, 4, 8].map(Duration::from_secs));
        assert_eq!(*waits.last().unwrap(), LOGIN_MAX_DELAY);
        // The owner logging in from the attacker's address after one wait: allowed, and a
        // success clears that pair's count.
        let wait = l.check("admin", attacker, now).await.err().map_or(Duration::ZERO, |t| t.retry_after);
        now += wait;
        assert!(l.check("admin", attacker, now).await.is_ok());
        l.succeeded("admin", attacker).await;
        l.failed("admin", attacker, now).await;
        // The pair's count was cleared by the success (one failure is free again); the
        // address keeps its own count (a valid account must not reset a sprayer's).
        assert_eq!(l.check("admin", attacker, now).await.map_err(|t| t.by), Err(ThrottledBy::Address));
        let fresh = ip("203.0.113.67");
        l.failed("admin", fresh, now).await;
        l.succeeded("admin", fresh).await;
        l.failed("admin", fresh, now).await;
        assert!(l.check("admin", fresh, now).await.is_ok());

        // Spraying: one wrong password each for many usernames from one address.
        let sprayer = ip("192.0.2.50");
        let mut first_wait = None;
        for i in 0..LOGIN_ADDRESS_FREE_FAILURES + 1 {
            let user = format!("user{i}");
            assert!(l.check(&user, sprayer, now).await.is_ok(), "attempt {i}");
            l.failed(&user, sprayer, now).await;
            first_wait = l.check("someone-else", sprayer, now).await.err();
        }
        let t = first_wait.expect("the address waits past its free failures");
        assert_eq!(t.by, ThrottledBy::Address);
        assert_eq!(t.retry_after, LOGIN_BASE_DELAY);
        assert!(l.check("someone-else", owner, now).await.is_ok(), "other addresses are not affected");

        // Forgotten after a quiet period.
        now += LOGIN_FORGET_AFTER;
        assert!(l.check("user0", sprayer, now).await.is_ok());
        l.failed("user0", sprayer, now).await;
        assert!(l.check("user1", sprayer, now).await.is_ok());
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

//! Durable storage over SQLite (embedded default) or PostgreSQL (several replicas).
//!
//! One `Store` speaks both through sqlx's `Any` driver; the SQL is written to run on both
//! (numbered `$n` placeholders in first-use order, BIGINT millisecond times, TEXT JSON).
//! Each backend has its own migrations folder. Every change to what agents receive goes
//! through [`Store::mutate`] (a new service through [`Store::create_service`]), which bumps
//! the per-service revision counter row inside the same transaction as the change, stores
//! the full snapshot with its hash and appends the audit row — so history, diff and
//! rollback are exact and no update is ever lost.
//!
//! The store knows nothing of who may do what or of HTTP: its errors are storage outcomes
//! (not found, conflict, invalid, the caller's own refusal, database failure).

/// A closed set of values a column stores as words: the enum, its `ALL` values, `as_str`
/// (the stored word, which serde writes too), `parse` of what the database holds (an unknown
/// word is an error naming the column) and `Display`. The words are the variants' names in
/// snake case (checked by a test per enum).
macro_rules! stored_words {
    ($(#[$m:meta])* pub enum $name:ident in $column:literal {
        $($(#[$vm:meta])* $variant:ident => $word:literal),+ $(,)?
    }) => {
        $(#[$m])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Default, serde::Serialize, utoipa::ToSchema)]
        #[serde(rename_all = "snake_case")]
        pub enum $name {
            $($(#[$vm])* $variant),+
        }

        impl $name {
            /// Every value, in declaration order.
            pub const ALL: &'static [$name] = &[$($name::$variant),+];

            /// The word stored in the column.
            pub const fn as_str(self) -> &'static str {
                match self {
                    $($name::$variant => $word),+
                }
            }

            /// The value the stored word names.
            ///
            /// # Errors
            /// A word no value has (written by a newer server, or by hand).
            pub fn parse(word: &str) -> anyhow::Result<Self> {
                Self::ALL.iter().copied().find(|v| v.as_str() == word).ok_or_else(|| {
                    anyhow::anyhow!(concat!($column, " {:?} is not one this server knows"), word)
                })
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.as_str())
            }
        }
    };
}

mod backup;
mod health;
mod mutate;
mod profiles;
mod requests;
mod rollouts;
mod rows;
mod schedule;

pub use backup::{Contents, check_file, restore_file, sqlite_path};
pub use health::HealthRow;
pub use mutate::{AuditCtx, AuditDiff, Change, Committed, Entries, MutateError, Parts, Subject};
pub use profiles::{ActivationRow, ProfileRow, VersionMoved};
pub use requests::{RequestRow, RequestState};
pub use rollouts::{
    DEFAULT_BAKE, DEFAULT_STAGES, Delivery, MAX_STAGES, Plan, ROLLOUT_STATES, RolloutRow, RolloutSettings,
    STAGEABLE_KINDS, Stage, Staging, Step,
};
pub use rows::*;
pub use schedule::{Claimed, ScheduledRow, ScheduledState};

use std::str::FromStr;
use std::time::Duration;

use anyhow::Context;
use sqlx::any::{AnyConnectOptions, AnyPoolOptions};
use sqlx::migrate::Migrator;
use sqlx::{AnyPool, Executor, Row};

static SQLITE_MIGRATIONS: Migrator = sqlx::migrate!("../migrations/sqlite");
static POSTGRES_MIGRATIONS: Migrator = sqlx::migrate!("../migrations/postgres");

/// Which database the store talks to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    /// Embedded SQLite file: a single replica.
    Sqlite,
    /// PostgreSQL: several replicas fan out through LISTEN/NOTIFY.
    Postgres,
}

/// Longest wait for a pooled connection: past it a query fails as unavailable (the API
/// answers 503, agents are served from memory) instead of holding its caller.
pub const ACQUIRE_TIMEOUT: Duration = Duration::from_secs(3);
/// Most agent rows per upsert statement of the fleet writer (12 parameters each: well
/// under SQLite's 32,766 and PostgreSQL's 65,535).
pub const FLEET_ROWS_PER_STATEMENT: usize = 500;
/// Most rows per statement of the fleet writer on SQLite, where each statement is its own
/// transaction and holds the store's write lock: a revision waits for at most this many
/// rows (500 took 50–200 ms on the loaded 2-core VM, 100 a fifth of it).
pub const FLEET_ROWS_PER_SQLITE_TURN: usize = 100;

/// Whether an error means the database could not be reached (pool timeout, closed pool,
/// I/O or TLS failure, a connection the server ended) rather than a refused statement.
/// Such failures are answered as "unavailable", never as an auth failure or a 500.
pub fn is_unavailable(err: &anyhow::Error) -> bool {
    err.chain().any(|c| match c.downcast_ref::<sqlx::Error>() {
        Some(
            sqlx::Error::PoolTimedOut | sqlx::Error::PoolClosed | sqlx::Error::Io(_) | sqlx::Error::Tls(_),
        ) => true,
        Some(sqlx::Error::Database(db)) => {
            // PostgreSQL: class 08 (connection exception), 57P01-03 (admin shutdown,
            // crash shutdown, cannot connect now).
            db.code().is_some_and(|code| code.starts_with("08") || code.starts_with("57P"))
        }
        Some(_) => false,
        None => c.downcast_ref::<std::io::Error>().is_some(),
    })
}

/// Whether an error means a value could not be stored as text by the database (PostgreSQL
/// refuses a NUL character: SQLSTATE 22021 / 22P05). The value was bad input, not a
/// failure of the server; SQLite stores such text as it is.
pub fn is_unstorable_text(err: &anyhow::Error) -> bool {
    err.chain().any(|c| match c.downcast_ref::<sqlx::Error>() {
        Some(sqlx::Error::Database(db)) => db.code().is_some_and(|code| code == "22021" || code == "22P05"),
        _ => false,
    })
}

/// Creates the data directory `dir` (and its parents) for its owner only (0700) when it is
/// missing; an existing directory is left as it is.
///
/// # Errors
/// The directory cannot be created; the message names it.
pub fn private_dir(dir: &std::path::Path) -> anyhow::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    if dir.exists() {
        return Ok(());
    }
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .with_context(|| format!("creating data directory {}", dir.display()))
}

/// Makes the SQLite file of `url` readable by its owner only (0600), creating it (and its
/// directory, 0700) when missing: it holds password hashes, the audit log and, unless the
/// operator gives one, the JWT secret. SQLite gives its `-wal` and `-shm` files the mode of
/// the database file; files of an older start that are more open are narrowed too.
fn private_sqlite_file(url: &str) -> anyhow::Result<()> {
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    let Ok(path) = sqlite_path(url) else { return Ok(()) };
    let path = path.as_path();
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        private_dir(dir)?;
    }
    match std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(path) {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(e).with_context(|| format!("creating the database file {}", path.display())),
    }
    for suffix in ["", "-wal", "-shm"] {
        let file = std::path::PathBuf::from(format!("{}{suffix}", path.display()));
        if let Ok(meta) = std::fs::metadata(&file)
            && meta.permissions().mode() & 0o077 != 0
        {
            std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600))
                .with_context(|| format!("making {} readable by its owner only", file.display()))?;
            tracing::info!(file = %file.display(), "database file made readable by its owner only (0600)");
        }
    }
    Ok(())
}

/// Inserts a token row (minted or a rotation's new token).
async fn insert_token_row(conn: &mut sqlx::AnyConnection, t: &TokenRow) -> anyhow::Result<()> {
    sqlx::query(
        "INSERT INTO tokens (id, kind, name, role, environment, services, created_by, created_at, expires_at, revoked_at, \
         person) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)",
    )
    .bind(&t.id)
    .bind(t.kind.as_str())
    .bind(&t.name)
    .bind(t.role.map(|r| r.as_str().to_string()))
    .bind(t.environment.clone())
    .bind(serde_json::to_string(&t.services)?)
    .bind(&t.created_by)
    .bind(t.created_at)
    .bind(t.expires_at)
    .bind(t.revoked_at)
    .bind(t.person.clone())
    .execute(conn)
    .await?;
    Ok(())
}

/// A rotation asked of a token that no longer works (revoked, or expired): a new token of
/// its scope is minted, not rotated from it.
#[derive(Debug, thiserror::Error)]
#[error("token {id} ended at {}: mint a new token instead of rotating this one", levee_agent::policy::Timestamp::from_unix_ms(*at))]
pub struct TokenEnded {
    /// The token's id.
    pub id: String,
    /// When it stopped working (ms since the epoch).
    pub at: i64,
}

/// Most counters of one agent status report stored in [`AgentRow::status`] (the sync
/// writer keeps no more; the service page reads no more, whatever an older row holds).
pub const MAX_STATUS_COUNTERS: usize = 4096;
/// Longest counter name of a stored status report, in bytes (a longer one is dropped).
pub const MAX_COUNTER_NAME: usize = 512;

/// Most ACKs a [`Propagation`] lists one by one (the fastest); its counts and percentiles
/// cover them all.
pub const MAX_ACKS_LISTED: usize = 1000;

/// Channel used for cross-replica change notifications.
pub const NOTIFY_CHANNEL: &str = "levee_changes";

/// How long an agent whose stream closed stays in the fleet list (UI and API) after it was
/// last seen; a reconnect under the same instance id brings it back.
pub const DISCONNECTED_AGENTS_KEPT_FOR: std::time::Duration = std::time::Duration::from_secs(3600);

/// The store. Cheap to clone.
#[derive(Clone, Debug)]
pub struct Store {
    pool: AnyPool,
    backend: Backend,
    /// SQLite has one writer; serializing writes here avoids SQLITE_BUSY upgrades.
    write_lock: std::sync::Arc<tokio::sync::Mutex<()>>,
}

/// Current time in milliseconds since the Unix epoch.
/// Records how long a store operation took, when dropped, in
/// `levee_server_db_query_duration_seconds{op}` (errors included).
pub(crate) struct QueryTimer(&'static str, tokio::time::Instant);

impl Drop for QueryTimer {
    fn drop(&mut self) {
        metrics::histogram!("levee_server_db_query_duration_seconds", "op" => self.0)
            .record(self.1.elapsed().as_secs_f64());
    }
}

/// Starts timing operation `op` (a fixed name per store method).
pub(crate) fn timed(op: &'static str) -> QueryTimer {
    QueryTimer(op, tokio::time::Instant::now())
}

pub fn now_ms() -> i64 {
    levee_agent::policy::Timestamp::now().unix_ms()
}

impl Store {
    /// Connects to `url` (`sqlite://path?mode=rwc` or `postgres://…`) and applies migrations.
    ///
    /// SQLite runs in WAL mode with `synchronous=FULL`, foreign keys on and a busy timeout,
    /// so acknowledged writes survive `kill -9`.
    pub async fn connect(url: &str) -> anyhow::Result<Store> {
        sqlx::any::install_default_drivers();
        let backend = if url.starts_with("sqlite:") {
            Backend::Sqlite
        } else if url.starts_with("postgres:") || url.starts_with("postgresql:") {
            Backend::Postgres
        } else {
            anyhow::bail!("unsupported database URL {url:?}: expected sqlite:… or postgres://…");
        };
        if backend == Backend::Sqlite {
            private_sqlite_file(url)?;
        }
        let opts = AnyConnectOptions::from_str(url).context("parsing the database URL")?;
        let mut pool_opts = AnyPoolOptions::new().acquire_timeout(ACQUIRE_TIMEOUT);
        pool_opts = match backend {
            Backend::Sqlite => pool_opts.max_connections(8).after_connect(|conn, _| {
                Box::pin(async move {
                    conn.execute("PRAGMA journal_mode = WAL").await?;
                    conn.execute("PRAGMA synchronous = FULL").await?;
                    conn.execute("PRAGMA foreign_keys = ON").await?;
                    conn.execute("PRAGMA busy_timeout = 10000").await?;
                    Ok(())
                })
            }),
            Backend::Postgres => pool_opts.max_connections(16),
        };
        let pool =
            pool_opts.connect_with(opts).await.with_context(|| format!("connecting to {}", redact(url)))?;
        let store = Store { pool, backend, write_lock: Default::default() };
        store.migrate().await?;
        Ok(store)
    }

    /// Applies pending migrations of this backend.
    pub async fn migrate(&self) -> anyhow::Result<()> {
        let m = match self.backend {
            Backend::Sqlite => &SQLITE_MIGRATIONS,
            Backend::Postgres => &POSTGRES_MIGRATIONS,
        };
        m.run(&self.pool).await.context("running database migrations")?;
        Ok(())
    }

    /// The backend in use.
    pub fn backend(&self) -> Backend {
        self.backend
    }

    /// The pool (for tests and the PostgreSQL listener).
    pub fn pool(&self) -> &AnyPool {
        &self.pool
    }

    /// Closes every connection of the pool (waiting for those in use).
    pub async fn close(&self) {
        self.pool.close().await;
    }

    /// Whether the database answers within `within` (used by `/readyz`).
    pub async fn ping(&self, within: Duration) -> bool {
        matches!(tokio::time::timeout(within, sqlx::query("SELECT 1").execute(&self.pool)).await, Ok(Ok(_)))
    }

    pub(crate) async fn write_guard(&self) -> Option<tokio::sync::MutexGuard<'_, ()>> {
        match self.backend {
            Backend::Sqlite => {
                let asked = tokio::time::Instant::now();
                let guard = self.write_lock.lock().await;
                let waited = asked.elapsed();
                metrics::histogram!("levee_server_db_write_lock_wait_seconds").record(waited.as_secs_f64());
                Some(guard)
            }
            Backend::Postgres => None,
        }
    }

    // ---- settings ---------------------------------------------------------------------

    /// Returns the setting `key`, storing `init()` first if it is absent (race-free).
    pub async fn setting_or_init(&self, key: &str, init: impl FnOnce() -> String) -> anyhow::Result<String> {
        let _g = self.write_guard().await;
        let v = init();
        sqlx::query("INSERT INTO settings (key, value) VALUES ($1, $2) ON CONFLICT (key) DO NOTHING")
            .bind(key)
            .bind(v)
            .execute(&self.pool)
            .await?;
        let row =
            sqlx::query("SELECT value FROM settings WHERE key = $1").bind(key).fetch_one(&self.pool).await?;
        Ok(row.try_get("value")?)
    }

    // ---- users -------------------------------------------------------------------------

    /// Creates a user, with its audit row in the same transaction when one is given.
    /// Returns `false` when the username is taken (nothing is written).
    pub async fn create_user(
        &self,
        username: &str,
        password_hash: &str,
        role: Role,
        audit: Option<&AuditRow>,
    ) -> anyhow::Result<bool> {
        let _g = self.write_guard().await;
        let mut tx = self.pool.begin().await?;
        let res = sqlx::query(
            "INSERT INTO users (username, password_hash, role, disabled, created_at) VALUES ($1, $2, $3, $4, $5) \
             ON CONFLICT (username) DO NOTHING",
        )
        .bind(username)
        .bind(password_hash)
        .bind(role.as_str())
        .bind(0i64)
        .bind(now_ms())
        .execute(&mut *tx)
        .await?;
        if res.rows_affected() != 1 {
            return Ok(false);
        }
        if let Some(audit) = audit {
            mutate::insert_audit(&mut tx, audit).await?;
        }
        tx.commit().await?;
        Ok(true)
    }

    /// Replaces a user's password hash, role and/or disabled flag and bumps its session epoch (ending
    /// every session it had open), with its audit row in the same transaction when one is
    /// given. Returns `false` when there is no such user (nothing is written).
    pub async fn update_user(
        &self,
        username: &str,
        password_hash: Option<&str>,
        role: Option<Role>,
        disabled: Option<bool>,
        audit: Option<&AuditRow>,
    ) -> anyhow::Result<bool> {
        let _g = self.write_guard().await;
        let mut tx = self.pool.begin().await?;
        let res = sqlx::query(
            "UPDATE users SET password_hash = COALESCE($1, password_hash), role = COALESCE($2, role), \
             disabled = COALESCE($3, disabled), session_epoch = session_epoch + 1 WHERE username = $4",
        )
        .bind(password_hash)
        .bind(role.map(Role::as_str))
        .bind(disabled.map(i64::from))
        .bind(username)
        .execute(&mut *tx)
        .await?;
        if res.rows_affected() != 1 {
            return Ok(false);
        }
        if let Some(audit) = audit {
            mutate::insert_audit(&mut tx, audit).await?;
        }
        tx.commit().await?;
        Ok(true)
    }

    /// Looks a user up by name.
    pub async fn user(&self, username: &str) -> anyhow::Result<Option<UserRow>> {
        let _t = timed("user");
        let row = sqlx::query(
            "SELECT id, username, password_hash, role, disabled, created_at, session_epoch FROM users WHERE username = $1",
        )
        .bind(username)
        .fetch_optional(&self.pool)
        .await?;
        row.map(|r| UserRow::from_row(&r)).transpose()
    }

    /// Lists users by name.
    pub async fn users(&self) -> anyhow::Result<Vec<UserRow>> {
        let rows = sqlx::query(
            "SELECT id, username, password_hash, role, disabled, created_at, session_epoch FROM users ORDER BY username",
        )
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(UserRow::from_row).collect()
    }

    // ---- tokens ------------------------------------------------------------------------

    /// Records a minted token and its audit row, in one transaction.
    pub async fn insert_token(&self, t: &TokenRow, audit: &AuditRow) -> anyhow::Result<()> {
        let _g = self.write_guard().await;
        let mut tx = self.pool.begin().await?;
        insert_token_row(&mut tx, t).await?;
        mutate::insert_audit(&mut tx, audit).await?;
        tx.commit().await?;
        Ok(())
    }

    /// Looks a token up by id (`jti`).
    pub async fn token(&self, id: &str) -> anyhow::Result<Option<TokenRow>> {
        let _t = timed("token");
        let row = sqlx::query(
            "SELECT id, kind, name, role, environment, services, created_by, created_at, expires_at, revoked_at, \
             person FROM tokens WHERE id = $1",
        )
        .bind(id).fetch_optional(&self.pool).await?;
        row.map(|r| TokenRow::from_row(&r)).transpose()
    }

    /// Ends a session token before its expiry (`expires_at`, ms since the epoch); purges
    /// rows of sessions that have expired anyway.
    pub async fn revoke_session(&self, jti: &str, expires_at: i64) -> anyhow::Result<()> {
        let _g = self.write_guard().await;
        let mut tx = self.pool.begin().await?;
        sqlx::query("DELETE FROM revoked_sessions WHERE expires_at < $1")
            .bind(now_ms())
            .execute(&mut *tx)
            .await?;
        sqlx::query(
            "INSERT INTO revoked_sessions (jti, expires_at) VALUES ($1, $2) ON CONFLICT (jti) DO NOTHING",
        )
        .bind(jti)
        .bind(expires_at)
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(())
    }

    /// Whether a session token was ended by logging out.
    pub async fn session_revoked(&self, jti: &str) -> anyhow::Result<bool> {
        let row = sqlx::query("SELECT 1 AS one FROM revoked_sessions WHERE jti = $1")
            .bind(jti)
            .fetch_optional(&self.pool)
            .await?;
        Ok(row.is_some())
    }

    /// Lists tokens, newest first.
    pub async fn tokens(&self) -> anyhow::Result<Vec<TokenRow>> {
        let rows = sqlx::query(
            "SELECT id, kind, name, role, environment, services, created_by, created_at, expires_at, revoked_at, \
             person FROM tokens ORDER BY created_at DESC",
        )
        .fetch_all(&self.pool).await?;
        rows.iter().map(TokenRow::from_row).collect()
    }

    /// Ids and revocation times (ms) of tokens revoked at or after `since` (ms) and by now:
    /// a revocation a rotation scheduled is listed once its time has come.
    pub async fn tokens_revoked_since(&self, since: i64) -> anyhow::Result<Vec<(String, i64)>> {
        let rows =
            sqlx::query("SELECT id, revoked_at FROM tokens WHERE revoked_at >= $1 AND revoked_at <= $2")
                .bind(since)
                .bind(now_ms())
                .fetch_all(&self.pool)
                .await?;
        rows.iter().map(|r| Ok((r.try_get("id")?, r.try_get("revoked_at")?))).collect()
    }

    /// Revokes a token now (a revoked one keeps its first revocation time; one whose
    /// rotation's overlap is still running ends now) and appends its audit row, in one
    /// transaction. Returns `false` when there is no such token (nothing is written).
    pub async fn revoke_token(&self, id: &str, audit: &AuditRow) -> anyhow::Result<bool> {
        let _g = self.write_guard().await;
        let mut tx = self.pool.begin().await?;
        let now = now_ms();
        let res = sqlx::query(
            "UPDATE tokens SET revoked_at = $1 WHERE id = $2 AND (revoked_at IS NULL OR revoked_at > $1)",
        )
        .bind(now)
        .bind(id)
        .execute(&mut *tx)
        .await?;
        if res.rows_affected() == 0
            && sqlx::query("SELECT 1 AS one FROM tokens WHERE id = $1")
                .bind(id)
                .fetch_optional(&mut *tx)
                .await?
                .is_none()
        {
            return Ok(false);
        }
        mutate::insert_audit(&mut tx, audit).await?;
        tx.commit().await?;
        Ok(true)
    }

    /// A rotation, in one transaction: token `old` (read again here, and refused when it is
    /// gone or already ended) is revoked at `ends_at` (ms; an earlier scheduled end is
    /// kept), `new` is recorded, then the audit row. Returns the old token as it is now, or
    /// `None` when there is no such token.
    ///
    /// # Errors
    /// [`TokenEnded`] (in the chain) when `old` is revoked or expired at `now`; storage.
    pub async fn rotate_token(
        &self,
        old: &str,
        ends_at: i64,
        new: &TokenRow,
        audit: &AuditRow,
    ) -> anyhow::Result<Option<TokenRow>> {
        let _g = self.write_guard().await;
        let mut tx = self.pool.begin().await?;
        let select = "SELECT id, kind, name, role, environment, services, created_by, created_at, \
                      expires_at, revoked_at, person FROM tokens WHERE id = $1";
        let Some(before) = sqlx::query(select).bind(old).fetch_optional(&mut *tx).await? else {
            return Ok(None);
        };
        let before = TokenRow::from_row(&before)?;
        let now = now_ms();
        if before.revoked(now) || before.expires_at <= now {
            return Err(TokenEnded { at: before.ends_at(), id: before.id }.into());
        }
        sqlx::query(
            "UPDATE tokens SET revoked_at = $1 WHERE id = $2 AND (revoked_at IS NULL OR revoked_at > $1)",
        )
        .bind(ends_at)
        .bind(old)
        .execute(&mut *tx)
        .await?;
        insert_token_row(&mut tx, new).await?;
        let after = sqlx::query(select).bind(old).fetch_one(&mut *tx).await?;
        let after = TokenRow::from_row(&after)?;
        mutate::insert_audit(&mut tx, audit).await?;
        tx.commit().await?;
        Ok(Some(after))
    }

    // ---- environments and services ----------------------------------------------------

    /// Creates an environment and appends its audit row, in one transaction. Returns `None`
    /// when one of that name exists (nothing is written).
    pub async fn create_environment(
        &self,
        name: &str,
        description: &str,
        allow_faults: bool,
        audit: &AuditRow,
    ) -> anyhow::Result<Option<EnvironmentRow>> {
        let _g = self.write_guard().await;
        let mut tx = self.pool.begin().await?;
        let created_at = now_ms();
        let res = sqlx::query(
            "INSERT INTO environments (name, description, allow_faults, created_at) VALUES ($1, $2, $3, $4) \
             ON CONFLICT (name) DO NOTHING",
        )
        .bind(name)
        .bind(description)
        .bind(i64::from(allow_faults))
        .bind(created_at)
        .execute(&mut *tx)
        .await?;
        if res.rows_affected() != 1 {
            return Ok(None);
        }
        mutate::insert_audit(&mut tx, audit).await?;
        tx.commit().await?;
        Ok(Some(EnvironmentRow {
            name: name.to_string(),
            description: description.to_string(),
            allow_faults,
            created_at,
        }))
    }

    /// Lists environments by name.
    pub async fn environments(&self) -> anyhow::Result<Vec<EnvironmentRow>> {
        let rows =
            sqlx::query("SELECT name, description, allow_faults, created_at FROM environments ORDER BY name")
                .fetch_all(&self.pool)
                .await?;
        rows.iter().map(EnvironmentRow::from_row).collect()
    }

    /// The environment `name`, if it exists.
    pub async fn environment(&self, name: &str) -> anyhow::Result<Option<EnvironmentRow>> {
        let row = sqlx::query(
            "SELECT name, description, allow_faults, created_at FROM environments WHERE name = $1",
        )
        .bind(name)
        .fetch_optional(&self.pool)
        .await?;
        row.map(|r| EnvironmentRow::from_row(&r)).transpose()
    }

    /// Lists the services of an environment by name.
    pub async fn services(&self, env: &str) -> anyhow::Result<Vec<ServiceRow>> {
        let rows = sqlx::query(
            "SELECT environment, name, description, revision, policy, created_at, updated_at FROM services \
             WHERE environment = $1 AND deleted_at IS NULL ORDER BY name",
        )
        .bind(env)
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(ServiceRow::from_row).collect()
    }

    /// Service `name` of `env` with its current revision, if it exists.
    pub async fn service(&self, env: &str, name: &str) -> anyhow::Result<Option<ServiceRow>> {
        let row = sqlx::query(
            "SELECT environment, name, description, revision, policy, created_at, updated_at FROM services \
             WHERE environment = $1 AND name = $2 AND deleted_at IS NULL",
        )
        .bind(env)
        .bind(name)
        .fetch_optional(&self.pool)
        .await?;
        row.map(|r| ServiceRow::from_row(&r)).transpose()
    }

    /// Flags of a service by key.
    pub async fn flags(&self, env: &str, service: &str) -> anyhow::Result<Vec<(String, String)>> {
        let rows =
            sqlx::query("SELECT key, body FROM flags WHERE environment = $1 AND service = $2 ORDER BY key")
                .bind(env)
                .bind(service)
                .fetch_all(&self.pool)
                .await?;
        rows.iter().map(|r| Ok((r.try_get("key")?, r.try_get("body")?))).collect()
    }

    // ---- revisions -----------------------------------------------------------------------

    /// Revision history of a service, newest first, at most `limit`.
    pub async fn revisions(&self, env: &str, service: &str, limit: i64) -> anyhow::Result<Vec<RevisionMeta>> {
        let rows = sqlx::query(
            "SELECT revision, hash, created_at, actor, reason FROM revisions \
             WHERE environment = $1 AND service = $2 ORDER BY revision DESC LIMIT $3",
        )
        .bind(env)
        .bind(service)
        .bind(limit)
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(RevisionMeta::from_row).collect()
    }

    /// Revision `revision` of a service, if it was stored.
    pub async fn revision(
        &self,
        env: &str,
        service: &str,
        revision: u64,
    ) -> anyhow::Result<Option<SnapshotRow>> {
        let row = sqlx::query(
            "SELECT environment, service, revision, hash, body, created_at FROM revisions \
             WHERE environment = $1 AND service = $2 AND revision = $3",
        )
        .bind(env)
        .bind(service)
        .bind(revision as i64)
        .fetch_optional(&self.pool)
        .await?;
        row.map(|r| SnapshotRow::from_row(&r)).transpose()
    }

    /// The newest stored snapshot of a service.
    pub async fn latest_snapshot(&self, env: &str, service: &str) -> anyhow::Result<Option<SnapshotRow>> {
        let _t = timed("latest_snapshot");
        let row = sqlx::query(
            "SELECT environment, service, revision, hash, body, created_at FROM revisions \
             WHERE environment = $1 AND service = $2 ORDER BY revision DESC LIMIT 1",
        )
        .bind(env)
        .bind(service)
        .fetch_optional(&self.pool)
        .await?;
        row.map(|r| SnapshotRow::from_row(&r)).transpose()
    }

    /// Snapshots created after `after_ms` or newer than the given revisions: the catch-up
    /// query of the PostgreSQL listener. Returns (environment, service, revision) of every
    /// service's current revision.
    pub async fn current_revisions(&self) -> anyhow::Result<Vec<(String, String, u64)>> {
        let rows =
            sqlx::query("SELECT environment, name, revision FROM services").fetch_all(&self.pool).await?;
        rows.iter()
            .map(|r| {
                let rev: i64 = r.try_get("revision")?;
                Ok((r.try_get("environment")?, r.try_get("name")?, rev as u64))
            })
            .collect()
    }

    // ---- audit -------------------------------------------------------------------------

    /// Appends an audit row outside of a mutation (e.g. a refused attempt).
    pub async fn append_audit(&self, row: &AuditRow) -> anyhow::Result<()> {
        let _g = self.write_guard().await;
        let mut conn = self.pool.acquire().await?;
        mutate::insert_audit(&mut conn, row).await
    }

    /// Audit rows matching the filter, newest first.
    pub async fn audit(&self, f: &AuditFilter) -> anyhow::Result<Vec<AuditRow>> {
        let _t = timed("audit_read");
        // Every filter is optional; `$n IS NULL OR col = $n` keeps one static statement.
        let rows = sqlx::query(
            "SELECT id, at, actor, via, request_id, action, environment, service, target, outcome, reason, \
             before, after, revision, detail FROM audit \
             WHERE ($1 IS NULL OR environment = $1) AND ($2 IS NULL OR service = $2) \
             AND ($3 IS NULL OR actor = $3) AND ($4 IS NULL OR at >= $4) AND ($5 IS NULL OR at <= $5) \
             AND ($6 IS NULL OR id < $6) \
             AND ($8 IS NULL OR action = $8 OR action LIKE $8 || '.%') AND ($9 IS NULL OR action NOT LIKE $9) \
             ORDER BY id DESC LIMIT $7",
        )
        .bind(f.environment.clone())
        .bind(f.service.clone())
        .bind(f.actor.clone())
        .bind(f.since)
        .bind(f.until)
        .bind(f.before_id)
        .bind(f.limit)
        .bind(f.action.clone())
        .bind(f.exclude_action.clone())
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(AuditRow::from_row).collect()
    }

    // ---- fleet -------------------------------------------------------------------------

    /// Writes a batch of agent state changes: the upserts as multi-row statements of at most
    /// [`FLEET_ROWS_PER_STATEMENT`] rows ([`FLEET_ROWS_PER_SQLITE_TURN`] on SQLite; one row
    /// per agent: the caller coalesces several events of one agent into its newest), then
    /// the NACKs and the first ACK of each revision per instance. Every written row takes `replica` as its holder and
    /// `lease_until` (ms since the epoch) as its lease. A disconnect reported by a replica
    /// that no longer holds the agent (it reconnected elsewhere meanwhile) changes nothing.
    ///
    /// On PostgreSQL the batch is one transaction. On SQLite, whose writers take turns on
    /// the store's (fair) write lock, each statement is its own transaction under its own
    /// turn: a revision written meanwhile waits for one statement, not for the batch of a
    /// whole fleet's ACKs. An error leaves the earlier statements written; the caller
    /// retries the batch, and every statement is idempotent (upserts of the newest state,
    /// ACKs `DO NOTHING`, NACKs keyed by revision).
    pub async fn write_fleet(
        &self,
        upserts: &[AgentUpsert],
        nacks: &[NackRow],
        acks: &[AckRow],
        replica: &str,
        lease_until: i64,
    ) -> anyhow::Result<()> {
        let _t = timed("write_fleet");
        let rows = match self.backend {
            Backend::Sqlite => FLEET_ROWS_PER_SQLITE_TURN,
            Backend::Postgres => FLEET_ROWS_PER_STATEMENT,
        };
        let mut statements = Vec::new();
        for chunk in upserts.chunks(rows) {
            let mut sql = String::from(
                "INSERT INTO agents (environment, service, instance_id, agent_version, connected, connected_at, \
                 last_seen, applied_revision, applied_hash, status, replica, lease_until) VALUES ",
            );
            push_values(&mut sql, chunk.len(), 12);
            sql.push_str(
                " ON CONFLICT (environment, service, instance_id) DO UPDATE SET agent_version = excluded.agent_version, \
                 connected = excluded.connected, connected_at = excluded.connected_at, last_seen = excluded.last_seen, \
                 applied_revision = excluded.applied_revision, applied_hash = excluded.applied_hash, \
                 status = COALESCE(excluded.status, agents.status), replica = excluded.replica, \
                 lease_until = excluded.lease_until \
                 WHERE excluded.connected = 1 OR agents.replica = excluded.replica",
            );
            let mut q = sqlx::query(sqlx::AssertSqlSafe(sql));
            for a in chunk {
                q = q
                    .bind(&a.environment)
                    .bind(&a.service)
                    .bind(&a.instance_id)
                    .bind(&a.agent_version)
                    .bind(i64::from(a.connected))
                    .bind(a.connected_at)
                    .bind(a.last_seen)
                    .bind(a.applied_revision as i64)
                    .bind(&a.applied_hash)
                    .bind(a.status.clone())
                    .bind(replica)
                    .bind(if a.connected { lease_until } else { 0 });
            }
            statements.push(q);
        }
        for n in nacks {
            statements.push(
                sqlx::query(sqlx::AssertSqlSafe(
                    "INSERT INTO nacks (environment, service, instance_id, revision, error_detail, at) \
                     VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT (environment, service, instance_id, revision) \
                     DO UPDATE SET error_detail = excluded.error_detail, at = excluded.at"
                        .to_string(),
                ))
                .bind(&n.environment)
                .bind(&n.service)
                .bind(&n.instance_id)
                .bind(n.revision as i64)
                .bind(&n.error_detail)
                .bind(n.at),
            );
        }
        // ACKs in multi-row statements too: a flip reaching 10,000 agents is 20 statements
        // on PostgreSQL (100 on SQLite), not 10,000.
        for chunk in acks.chunks(rows) {
            let mut sql = String::from(
                "INSERT INTO acks (environment, service, revision, instance_id, acked_at) VALUES ",
            );
            push_values(&mut sql, chunk.len(), 5);
            sql.push_str(" ON CONFLICT (environment, service, revision, instance_id) DO NOTHING");
            let mut q = sqlx::query(sqlx::AssertSqlSafe(sql));
            for a in chunk {
                q = q
                    .bind(&a.environment)
                    .bind(&a.service)
                    .bind(a.revision as i64)
                    .bind(&a.instance_id)
                    .bind(a.acked_at);
            }
            statements.push(q);
        }
        if statements.is_empty() {
            return Ok(());
        }
        match self.backend {
            Backend::Sqlite => {
                for q in statements {
                    // A statement outside a transaction commits on its own.
                    let _g = self.write_guard().await;
                    q.execute(&self.pool).await?;
                }
            }
            Backend::Postgres => {
                let mut tx = self.pool.begin().await?;
                for q in statements {
                    q.execute(&mut *tx).await?;
                }
                tx.commit().await?;
            }
        }
        Ok(())
    }

    /// Extends to `lease_until` (ms since the epoch) the lease of every agent `replica`
    /// holds a stream of: one statement, however many agents. Returns how many rows.
    pub async fn renew_leases(&self, replica: &str, lease_until: i64) -> anyhow::Result<u64> {
        let _g = self.write_guard().await;
        let res = sqlx::query("UPDATE agents SET lease_until = $1 WHERE replica = $2 AND connected = 1")
            .bind(lease_until)
            .bind(replica)
            .execute(&self.pool)
            .await?;
        Ok(res.rows_affected())
    }

    /// Marks every agent of this server as disconnected (at start-up, for SQLite's single
    /// replica, whose previous process cannot have live streams).
    pub async fn mark_all_disconnected(&self) -> anyhow::Result<()> {
        let _g = self.write_guard().await;
        sqlx::query("UPDATE agents SET connected = $1").bind(0i64).execute(&self.pool).await?;
        Ok(())
    }

    /// Agents of a service (every connected one: a fleet of 10,000 is counted whole, and
    /// those disconnected for less than [`DISCONNECTED_AGENTS_KEPT_FOR`]), most recently
    /// seen first. `connected` is true only while the holder's lease runs.
    pub async fn agents(&self, env: &str, service: &str) -> anyhow::Result<Vec<AgentRow>> {
        let shown_since = now_ms() - DISCONNECTED_AGENTS_KEPT_FOR.as_millis() as i64;
        let rows = sqlx::query(
            "SELECT environment, service, instance_id, agent_version, connected, connected_at, last_seen, \
             applied_revision, applied_hash, status, lease_until FROM agents WHERE environment = $1 AND service = $2 \
             AND (connected <> 0 OR last_seen >= $3) ORDER BY last_seen DESC",
        )
        .bind(env)
        .bind(service)
        .bind(shown_since)
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(AgentRow::from_row).collect()
    }

    /// How far revision `revision` of a service has reached ([`Propagation`]), or `None`
    /// when it was never stored.
    pub async fn propagation(
        &self,
        env: &str,
        service: &str,
        revision: u64,
    ) -> anyhow::Result<Option<Propagation>> {
        let Some(rev) = self.revision(env, service, revision).await? else { return Ok(None) };
        let rows = sqlx::query(
            "SELECT instance_id, acked_at FROM acks WHERE environment = $1 AND service = $2 AND revision = $3 \
             ORDER BY acked_at",
        )
        .bind(env)
        .bind(service)
        .bind(revision as i64)
        .fetch_all(&self.pool)
        .await?;
        let mut acks = Vec::with_capacity(rows.len());
        for r in &rows {
            let acked_at: i64 = r.try_get("acked_at")?;
            acks.push(AgentAck {
                instance_id: r.try_get("instance_id")?,
                acked_at,
                latency: ms(acked_at - rev.created_at),
            });
        }
        // Every ACK counts in `acked` and the percentiles; the list itself is cut to the
        // fastest MAX_ACKS_LISTED, so a fleet of tens of thousands stays a small answer.
        let mut lat: Vec<i64> = acks.iter().map(|a| a.latency.as_millis() as i64).collect();
        lat.sort_unstable();
        let acked = acks.len();
        acks.truncate(MAX_ACKS_LISTED);
        let agents = self.agents(env, service).await?;
        let live = agents.iter().filter(|a| a.connected);
        Ok(Some(Propagation {
            environment: env.to_string(),
            service: service.to_string(),
            revision,
            committed_at: rev.created_at,
            applied: live.clone().filter(|a| a.applied_revision >= revision).count(),
            connected: live.count(),
            acked,
            p50: percentile(&lat, 50.0).map(ms),
            p99: percentile(&lat, 99.0).map(ms),
            max: lat.last().copied().map(ms),
            acks,
        }))
    }

    /// NACKs of a service, newest first (the newest per instance and revision).
    pub async fn nacks(&self, env: &str, service: &str) -> anyhow::Result<Vec<NackRow>> {
        let rows = sqlx::query(
            "SELECT environment, service, instance_id, revision, error_detail, at FROM nacks \
             WHERE environment = $1 AND service = $2 ORDER BY at DESC",
        )
        .bind(env)
        .bind(service)
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(NackRow::from_row).collect()
    }

    /// Revisions newer than `above` that this agent instance NACKed (read once when its
    /// stream opens, so a reconnecting agent is not sent them again).
    pub async fn nacked_revisions(
        &self,
        env: &str,
        service: &str,
        instance: &str,
        above: u64,
    ) -> anyhow::Result<Vec<u64>> {
        let rows = sqlx::query(
            "SELECT revision FROM nacks WHERE environment = $1 AND service = $2 AND instance_id = $3 \
             AND revision > $4",
        )
        .bind(env)
        .bind(service)
        .bind(instance)
        .bind(above as i64)
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(|r| Ok(r.try_get::<i64, _>("revision")? as u64)).collect()
    }

    /// The flags of `service` whose value is temporary and that go back to an earlier flag
    /// at their expiry: (key, the flag in force as JSON, the flag it goes back to as JSON),
    /// by key, read in one statement.
    pub async fn temporary_flags(
        &self,
        env: &str,
        service: &str,
    ) -> anyhow::Result<Vec<(String, String, String)>> {
        let rows = sqlx::query(
            "SELECT r.key AS key, f.body AS flag, r.body AS restores FROM flag_restores r \
             JOIN flags f ON f.environment = r.environment AND f.service = r.service AND f.key = r.key \
             WHERE r.environment = $1 AND r.service = $2 ORDER BY r.key",
        )
        .bind(env)
        .bind(service)
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(|r| Ok((r.try_get("key")?, r.try_get("flag")?, r.try_get("restores")?))).collect()
    }

    /// Expired flags, fault rules, breaker overrides and levers as (environment, service) pairs.
    pub async fn services_with_expired(&self, now: i64) -> anyhow::Result<Vec<(String, String)>> {
        let rows = sqlx::query(
            "SELECT environment, service FROM faults WHERE expires_at <= $1 \
             UNION SELECT environment, service FROM breaker_overrides WHERE expires_at IS NOT NULL AND expires_at <= $1 \
             UNION SELECT environment, service FROM flags WHERE expires_at IS NOT NULL AND expires_at <= $1 \
             UNION SELECT environment, service FROM levers WHERE expires_at <= $1",
        )
        .bind(now)
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(|r| Ok((r.try_get("environment")?, r.try_get("service")?))).collect()
    }
}

/// Milliseconds as a duration, a negative count (clocks of two replicas) as zero.
/// Appends `rows` parenthesised groups of `cols` numbered placeholders (`($1, $2), ($3, $4)`)
/// for a multi-row `VALUES` (the same `$n` syntax serves SQLite and PostgreSQL).
fn push_values(sql: &mut String, rows: usize, cols: usize) {
    use std::fmt::Write;
    for i in 0..rows {
        sql.push_str(if i == 0 { "(" } else { ", (" });
        for c in 1..=cols {
            let sep = if c == 1 { "" } else { ", " };
            let _ = write!(sql, "{sep}${}", i * cols + c);
        }
        sql.push(')');
    }
}

fn ms(v: i64) -> std::time::Duration {
    std::time::Duration::from_millis(u64::try_from(v).unwrap_or(0))
}

/// Hides the password of a database URL for logs.
pub fn redact(url: &str) -> String {
    match (url.find("://"), url.find('@')) {
        (Some(s), Some(at)) if at > s => {
            let creds = &url[s + 3..at];
            match creds.find(':') {
                Some(c) => format!("{}{}:***{}", &url[..s + 3], &creds[..c], &url[at..]),
                None => url.to_string(),
            }
        }
        _ => url.to_string(),
    }
}

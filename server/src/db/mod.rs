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
/// (the stored word, which serde reads and writes too: the API's word is the column's),
/// `parse` of what the database holds (an unknown word is an error naming the column) and
/// `Display`.
// `$word` is a `tt`, not a `literal`: a `literal` fragment reaches the derives wrapped in
// an invisible group, which serde reads through and utoipa's derive does not (the OpenAPI
// document then named the variants, not the words the API sends).
macro_rules! stored_words {
    ($(#[$m:meta])* pub enum $name:ident in $column:literal {
        $($(#[$vm:meta])* $variant:ident => $word:tt),+ $(,)?
    }) => {
        $(#[$m])*
        // The API and the CLI read and write the stored word, so serde spells it too.
        #[derive(
            Clone, Copy, Debug, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize, utoipa::ToSchema,
        )]
        pub enum $name {
            $($(#[$vm])* #[serde(rename = $word)] $variant),+
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

mod accounts;
mod audit;
mod backup;
mod experiments;
mod fleet;
mod game_day;
mod health;
mod mutate;
mod parts;
mod profiles;
mod requests;
mod rollouts;
mod rows;
mod schedule;
mod services;
mod tokens;

pub use audit::{AuditDiff, Entries, Subject};
pub use backup::{Contents, check_file, restore_file, sqlite_path};
pub use experiments::{ExperimentReadingRow, ExperimentRow, ExperimentState, ExperimentUpdate};
pub use fleet::{
    DISCONNECTED_AGENTS_KEPT_FOR, FLEET_ROWS_PER_SQLITE_TURN, FLEET_ROWS_PER_STATEMENT, MAX_ACKS_LISTED,
    MAX_COUNTER_NAME, MAX_STATUS_COUNTERS,
};
pub use game_day::GameDayView;
pub use health::{HealthRow, SubjectKind};
pub use mutate::{AuditCtx, Change, Committed, MutateError};
pub use parts::Parts;
pub use profiles::{ActivationRow, ProfileRow, VersionMoved};
pub use requests::{ChangeKind, RequestRow, RequestState};
pub use rollouts::{
    DEFAULT_BAKE, DEFAULT_STAGES, Delivery, MAX_STAGES, Plan, RolloutRow, RolloutSettings, RolloutState,
    STAGEABLE_KINDS, Stage, Staging, Step,
};
pub use rows::*;
pub use schedule::{Claimed, ScheduledRow, ScheduledState};
pub use tokens::TokenEnded;

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

/// Channel used for cross-replica change notifications.
pub const NOTIFY_CHANNEL: &str = "levee_changes";

/// The store: reads (through [`Reader`], which it dereferences to) and writes. Cheap to
/// clone. Only the actions, the fleet and health writers and the server's start hold one.
#[derive(Clone, Debug)]
pub struct Store {
    reader: Reader,
    /// SQLite has one writer; serializing writes here avoids SQLITE_BUSY upgrades.
    write_lock: std::sync::Arc<tokio::sync::Mutex<()>>,
}

/// The store's reads and nothing else: what the API and the UI hold, so that every change
/// they make goes through an action (its role check, approval rules and audit row); the
/// compiler, not a convention, keeps them from writing. Cheap to clone.
#[derive(Clone, Debug)]
pub struct Reader {
    pool: AnyPool,
    backend: Backend,
}

impl std::ops::Deref for Store {
    type Target = Reader;

    fn deref(&self) -> &Reader {
        &self.reader
    }
}

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

/// Current time in milliseconds since the Unix epoch.
pub fn now_ms() -> i64 {
    levee_agent::policy::Timestamp::now().unix_ms()
}

impl Reader {
    /// The backend in use.
    pub fn backend(&self) -> Backend {
        self.backend
    }

    /// Whether the database answers within `within` (used by `/readyz`).
    pub async fn ping(&self, within: Duration) -> bool {
        matches!(tokio::time::timeout(within, sqlx::query("SELECT 1").execute(&self.pool)).await, Ok(Ok(_)))
    }
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
        let store = Store { reader: Reader { pool, backend }, write_lock: Default::default() };
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

    /// The pool (for tests and the PostgreSQL listener).
    pub fn pool(&self) -> &AnyPool {
        &self.pool
    }

    /// The reads of this store, for a holder that must not write.
    pub fn reader(&self) -> Reader {
        self.reader.clone()
    }

    /// Closes every connection of the pool (waiting for those in use).
    pub async fn close(&self) {
        self.pool.close().await;
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
}

/// Appends `rows` parenthesised groups of `cols` placeholders for a multi-row `VALUES`, the
/// whole statement's only placeholders, bound in order: numbered on PostgreSQL
/// (`($1, $2), ($3, $4)`), anonymous on SQLite (`(?, ?), (?, ?)`). sqlx binds each SQLite
/// parameter after asking its name, which SQLite finds by a scan of the statement's named
/// parameters: with `$n` a 100-row upsert of 1,200 parameters cost 720,000 steps, 16 % of
/// the server's CPU during a flip to 10,000 agents (docs/benchmarks.md); `?` has no name.
fn push_values(sql: &mut String, backend: Backend, rows: usize, cols: usize) {
    use std::fmt::Write;
    for i in 0..rows {
        sql.push_str(if i == 0 { "(" } else { ", (" });
        for c in 1..=cols {
            let sep = if c == 1 { "" } else { ", " };
            let _ = match backend {
                Backend::Postgres => write!(sql, "{sep}${}", i * cols + c),
                Backend::Sqlite => write!(sql, "{sep}?"),
            };
        }
        sql.push(')');
    }
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

#[cfg(test)]
mod tests {
    use super::{AuditOutcome, ChangeKind, ExperimentState, RequestState, RolloutState, ScheduledState, Via};

    /// The stored word of every state is what serde writes (the API's value) and reads back.
    #[test]
    fn stored_words_are_the_serde_names_and_parse_back() {
        fn check<T: Copy + PartialEq + std::fmt::Debug + serde::Serialize + utoipa::PartialSchema>(
            all: &[T],
            word: fn(T) -> &'static str,
            parse: fn(&str) -> anyhow::Result<T>,
        ) {
            for &v in all {
                assert_eq!(serde_json::to_value(v).unwrap(), serde_json::json!(word(v)));
                assert_eq!(parse(word(v)).unwrap(), v);
            }
            assert!(parse("Open").is_err() && parse("").is_err());
            // The OpenAPI document lists the same words (schemathesis checks responses
            // against it).
            let schema = serde_json::to_value(T::schema()).unwrap();
            let words: Vec<&str> = all.iter().map(|&v| word(v)).collect();
            assert_eq!(schema["enum"], serde_json::json!(words), "{schema}");
        }
        check(RequestState::ALL, RequestState::as_str, RequestState::parse);
        check(ScheduledState::ALL, ScheduledState::as_str, ScheduledState::parse);
        check(ChangeKind::ALL, ChangeKind::as_str, ChangeKind::parse);
        check(RolloutState::ALL, RolloutState::as_str, RolloutState::parse);
        check(ExperimentState::ALL, ExperimentState::as_str, ExperimentState::parse);
        check(AuditOutcome::ALL, AuditOutcome::as_str, AuditOutcome::parse);
        check(Via::ALL, Via::as_str, Via::parse);
        let e = ScheduledState::parse("paused").unwrap_err().to_string();
        assert_eq!(e, r#"scheduled_changes.state "paused" is not one this server knows"#);
        let e = AuditOutcome::parse("refused").unwrap_err().to_string();
        assert_eq!(e, r#"audit.outcome "refused" is not one this server knows"#);
    }
}

//! Backup and restore of the SQLite database (`levee backup`, `levee restore`); PostgreSQL
//! is backed up with its own tools (docs/operations.md, "Backup and restore").
//!
//! A backup is `VACUUM INTO`: one read transaction, so the copy is the database as of one
//! commit — every write acknowledged before it started is in it, none half — taken while
//! the server runs and writes (WAL readers never block the writer). A restore checks the
//! copy, puts it in place (temporary file, fsync, rename), and then moves every service to
//! a revision well above the restored one ([`Store::advance_revisions`]): agents may have
//! applied revisions written after the backup, and an agent never goes back.

use std::path::{Path, PathBuf};

use anyhow::Context;
use sqlx::Row;

use super::{AuditOutcome, AuditRow, Backend, Store, now_ms};

/// What a backup or a restored file holds, for the operator's summary.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Contents {
    /// Services, deleted ones included.
    pub services: i64,
    /// Stored revisions (snapshots).
    pub revisions: i64,
    /// Audit rows.
    pub audit_rows: i64,
}

impl std::fmt::Display for Contents {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} services, {} revisions, {} audit rows", self.services, self.revisions, self.audit_rows)
    }
}

/// The SQLite file a `sqlite:` URL names.
///
/// # Errors
/// Not a file URL (an in-memory database has nothing to back up or restore).
pub fn sqlite_path(url: &str) -> anyhow::Result<PathBuf> {
    let rest = url.strip_prefix("sqlite://").or_else(|| url.strip_prefix("sqlite:")).unwrap_or(url);
    let path = rest.split('?').next().unwrap_or(rest);
    anyhow::ensure!(
        !path.is_empty() && path != ":memory:" && !rest.contains("mode=memory"),
        "the database is in memory: there is no file to back up or restore"
    );
    Ok(PathBuf::from(path))
}

/// Opens `file` read-only and checks that it is a sound Levee database: SQLite's
/// `integrity_check` passes and Levee's tables are there. Returns what it holds.
///
/// # Errors
/// The file cannot be opened, is damaged, or is not a Levee database.
pub async fn check_file(file: &Path) -> anyhow::Result<Contents> {
    sqlx::any::install_default_drivers();
    anyhow::ensure!(file.is_file(), "{} is not a file", file.display());
    let url = format!("sqlite://{}?mode=ro", file.display());
    let pool = sqlx::any::AnyPoolOptions::new()
        .max_connections(1)
        .connect(&url)
        .await
        .with_context(|| format!("opening {}", file.display()))?;
    let result = async {
        let check: String = sqlx::query("PRAGMA integrity_check")
            .fetch_one(&pool)
            .await
            .with_context(|| format!("{} is not an SQLite database", file.display()))?
            .try_get(0)?;
        anyhow::ensure!(check == "ok", "{} is damaged: {check}", file.display());
        let count = |table: &'static str| {
            let pool = &pool;
            async move {
                let n: i64 = sqlx::query(sqlx::AssertSqlSafe(format!("SELECT COUNT(*) FROM {table}")))
                    .fetch_one(pool)
                    .await
                    .with_context(|| {
                        format!("{} is not a Levee database (no table {table})", file.display())
                    })?
                    .try_get(0)?;
                anyhow::Ok(n)
            }
        };
        Ok(Contents {
            services: count("services").await?,
            revisions: count("revisions").await?,
            audit_rows: count("audit").await?,
        })
    }
    .await;
    pool.close().await;
    result
}

impl Store {
    /// Writes a consistent copy of this SQLite database to `to` (a new file, created 0600),
    /// while the server may be running and writing; checks the copy and returns what it
    /// holds.
    ///
    /// # Errors
    /// A PostgreSQL store (use `pg_dump`), `to` exists already, or the copy failed.
    pub async fn backup_to(&self, to: &Path) -> anyhow::Result<Contents> {
        use std::os::unix::fs::OpenOptionsExt;
        anyhow::ensure!(
            self.backend == Backend::Sqlite,
            "the database is PostgreSQL: back it up with pg_dump (docs/operations.md, \"Backup and restore\")"
        );
        // VACUUM INTO fills an empty file: created here first, private, never over another.
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(to)
            .with_context(|| format!("creating the backup file {}", to.display()))?;
        let res = sqlx::query("VACUUM INTO $1").bind(to.display().to_string()).execute(&self.pool).await;
        if let Err(e) = res {
            let _ = std::fs::remove_file(to);
            return Err(e).with_context(|| format!("copying the database to {}", to.display()));
        }
        std::fs::File::open(to).and_then(|f| f.sync_all())?;
        check_file(to).await
    }

    /// After a restore: every live service gets a new revision `gap` above its current one
    /// with the current snapshot's content (same body and hash) and an audit row made from
    /// `audit` (its actor, via, action and reason), all in one transaction. Returns
    /// (environment, service, from, to) for each.
    ///
    /// # Errors
    /// The database failed (nothing is written then).
    pub async fn advance_revisions(
        &self,
        gap: u64,
        audit: &AuditRow,
    ) -> anyhow::Result<Vec<(String, String, u64, u64)>> {
        anyhow::ensure!(gap >= 1, "the revision gap must be at least 1");
        let _g = self.write_guard().await;
        let mut tx = self.pool.begin().await?;
        let rows = sqlx::query("SELECT environment, name, revision FROM services WHERE deleted_at IS NULL")
            .fetch_all(&mut *tx)
            .await?;
        let now = now_ms();
        let mut moved = Vec::new();
        for r in rows {
            let (env, svc): (String, String) = (r.try_get("environment")?, r.try_get("name")?);
            let from = r.try_get::<i64, _>("revision")?;
            let Some(last) = sqlx::query(
                "SELECT hash, body FROM revisions WHERE environment = $1 AND service = $2 \
                 ORDER BY revision DESC LIMIT 1",
            )
            .bind(&env)
            .bind(&svc)
            .fetch_optional(&mut *tx)
            .await?
            else {
                continue;
            };
            let to = from + gap as i64;
            sqlx::query(
                "UPDATE services SET revision = $1, updated_at = $2 WHERE environment = $3 AND name = $4",
            )
            .bind(to)
            .bind(now)
            .bind(&env)
            .bind(&svc)
            .execute(&mut *tx)
            .await?;
            sqlx::query(
                "INSERT INTO revisions (environment, service, revision, hash, body, created_at, actor, reason) \
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8)",
            )
            .bind(&env)
            .bind(&svc)
            .bind(to)
            .bind(last.try_get::<String, _>("hash")?)
            .bind(last.try_get::<String, _>("body")?)
            .bind(now)
            .bind(&audit.actor)
            .bind(&audit.reason)
            .execute(&mut *tx)
            .await?;
            let row = AuditRow {
                at: now,
                environment: Some(env.clone()),
                service: Some(svc.clone()),
                target: "revision".into(),
                outcome: AuditOutcome::Ok,
                before: Some(from.to_string()),
                after: Some(to.to_string()),
                revision: Some(to),
                ..audit.clone()
            };
            super::audit::insert_audit(&mut tx, &row).await?;
            moved.push((env, svc, from as u64, to as u64));
        }
        tx.commit().await?;
        Ok(moved)
    }
}

/// Puts the backup `from` in place as the SQLite file `target` (0600, through a temporary
/// file, fsynced, renamed). An existing `target` is refused unless `force`: then it and its
/// `-wal`/`-shm` files are kept beside it as `<name>.before-restore-<ms>`.
///
/// # Errors
/// The backup is not a sound Levee database, `target` exists without `force`, or a file
/// operation failed; the message names the file.
pub async fn restore_file(from: &Path, target: &Path, force: bool) -> anyhow::Result<Contents> {
    use std::os::unix::fs::OpenOptionsExt;
    let contents = check_file(from).await?;
    if let Some(dir) = target.parent().filter(|d| !d.as_os_str().is_empty()) {
        super::private_dir(dir)?;
    }
    if target.exists() {
        anyhow::ensure!(
            force,
            "{} exists: restore into an empty data directory, or give --force to keep it aside \
             (stop the server first)",
            target.display()
        );
        let stamp = now_ms();
        for suffix in ["", "-wal", "-shm"] {
            let file = PathBuf::from(format!("{}{suffix}", target.display()));
            if file.exists() {
                let aside = PathBuf::from(format!("{}.before-restore-{stamp}", file.display()));
                std::fs::rename(&file, &aside)
                    .with_context(|| format!("moving {} aside to {}", file.display(), aside.display()))?;
            }
        }
    }
    let tmp = PathBuf::from(format!("{}.restoring", target.display()));
    let _ = std::fs::remove_file(&tmp);
    {
        let mut out = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&tmp)
            .with_context(|| format!("creating {}", tmp.display()))?;
        let mut input = std::fs::File::open(from).with_context(|| format!("reading {}", from.display()))?;
        std::io::copy(&mut input, &mut out).with_context(|| format!("writing {}", tmp.display()))?;
        out.sync_all()?;
    }
    std::fs::rename(&tmp, target)
        .with_context(|| format!("moving {} to {}", tmp.display(), target.display()))?;
    if let Some(dir) = target.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::File::open(dir).and_then(|d| d.sync_all())?;
    }
    Ok(contents)
}

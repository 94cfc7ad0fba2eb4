//! Disk cache of the last good snapshots, so a service restarted during an outage starts
//! from the configuration it last enforced rather than from its compiled-in defaults.
//!
//! Layout: one file per generation in `<cache_dir>/<environment>/<service>/`, named
//! `rev-<revision, 20 digits>.json`, holding an [`Envelope`]. Writes are atomic (a
//! uniquely named temp file in the same directory is written, fsynced, renamed over the
//! target, and the directory is fsynced), so a crash leaves either the old or the new file,
//! never half of one. The newest [`GENERATIONS_KEPT`] generations are kept.
//!
//! Loading tries the newest generation first and falls back to older ones. A file that is
//! unreadable, truncated, garbage, of another schema version, of another environment or
//! service, whose hash does not match its body, or whose body does not decode and validate
//! is reported (a `tracing` warning and [`CACHE_ERRORS_TOTAL`](crate::metrics_names::CACHE_ERRORS_TOTAL)
//! with a `reason` label) and skipped — never trusted, never a panic.

use std::fs;
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use serde::{Deserialize, Serialize};

use crate::metrics_names;
use crate::policy::{self, SCHEMA_VERSION, ServiceConfig, Timestamp};

/// Generations kept on disk; older files are deleted after each successful write.
pub const GENERATIONS_KEPT: usize = 3;
/// Largest cache file read, in bytes; a bigger file is reported as `malformed`.
pub const MAX_FILE_BYTES: u64 = 32 * 1024 * 1024;
/// Temp files left by a crashed writer are deleted once older than this.
pub const STALE_TEMP_AGE: Duration = Duration::from_secs(3600);

const PREFIX: &str = "rev-";
const SUFFIX: &str = ".json";
const TEMP_PREFIX: &str = ".tmp-";

/// The JSON document of one cache file.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Envelope {
    /// Schema version of `body` ([`SCHEMA_VERSION`] when written by this agent).
    pub schema_version: u32,
    /// Environment the snapshot belongs to.
    pub environment: String,
    /// Service the snapshot belongs to.
    pub service: String,
    /// Revision of the snapshot (≥ 1).
    pub revision: u64,
    /// Lower-case hex SHA-256 of `body`'s UTF-8 bytes.
    pub hash: String,
    /// When the file was written (wall clock).
    pub written_at: Timestamp,
    /// The snapshot body exactly as the server sent it (canonical JSON text).
    pub body: String,
}

/// A snapshot read back from the cache, verified and validated.
#[derive(Clone, Debug)]
pub struct CachedSnapshot {
    /// Revision of the snapshot (≥ 1, matching the file name).
    pub revision: u64,
    /// Lower-case hex SHA-256 of `body`, verified.
    pub hash: String,
    /// The snapshot body exactly as the server sent it (canonical JSON text).
    pub body: String,
    /// `body` decoded and validated.
    pub config: ServiceConfig,
    /// When the file was written, which is when the snapshot was last confirmed live.
    pub written_at: Timestamp,
    /// The cache file it was read from.
    pub path: PathBuf,
}

/// Why one cache file was not used. [`CacheError::reason`] is the metric label.
#[derive(Debug, thiserror::Error)]
pub enum CacheError {
    /// The file or directory could not be read or written.
    #[error("cannot read {path}: {source}")]
    Io {
        /// The cache file or generation directory.
        path: PathBuf,
        /// The operating system's error.
        source: io::Error,
    },
    /// Not a JSON envelope (truncated, garbage, too big, wrong field types).
    #[error("{path} is not a valid cache file: {detail}")]
    Malformed {
        /// The cache file (`<dir>/<env>/<service>/rev-<revision>.json`).
        path: PathBuf,
        /// What the decoder said.
        detail: String,
    },
    /// Written by an agent with another schema version.
    #[error("{path} has schema version {found:?}, this agent reads {expected}")]
    Schema {
        /// The cache file (`<dir>/<env>/<service>/rev-<revision>.json`).
        path: PathBuf,
        /// Version in the file, if it had one.
        found: Option<u64>,
        /// [`SCHEMA_VERSION`].
        expected: u32,
    },
    /// Belongs to another environment, service or revision than its place says.
    #[error("{path} belongs to {found}, expected {expected}")]
    Mismatch {
        /// The cache file (`<dir>/<env>/<service>/rev-<revision>.json`).
        path: PathBuf,
        /// What the file says.
        found: String,
        /// What its location says.
        expected: String,
    },
    /// The body does not hash to the recorded hash (bit rot or a partial write).
    #[error("{path}: body hash {actual} does not match recorded {recorded}")]
    Hash {
        /// The cache file (`<dir>/<env>/<service>/rev-<revision>.json`).
        path: PathBuf,
        /// Hash in the envelope.
        recorded: String,
        /// Hash of the body.
        actual: String,
    },
    /// The body does not decode or validate as a [`ServiceConfig`].
    #[error("{path}: body is not a valid configuration: {source}")]
    Invalid {
        /// The cache file (`<dir>/<env>/<service>/rev-<revision>.json`).
        path: PathBuf,
        /// Decoding or validation errors.
        source: policy::PolicyError,
    },
    /// Writing a new generation failed.
    #[error("cannot write cache file in {dir}: {source}")]
    Write {
        /// The generation directory written to.
        dir: PathBuf,
        /// The operating system's error.
        source: io::Error,
    },
}

impl CacheError {
    /// The `reason` label: `io`, `malformed`, `schema`, `mismatch`, `hash`, `invalid`, `write`.
    pub fn reason(&self) -> &'static str {
        match self {
            CacheError::Io { .. } => "io",
            CacheError::Malformed { .. } => "malformed",
            CacheError::Schema { .. } => "schema",
            CacheError::Mismatch { .. } => "mismatch",
            CacheError::Hash { .. } => "hash",
            CacheError::Invalid { .. } => "invalid",
            CacheError::Write { .. } => "write",
        }
    }
}

/// What [`DiskCache::load`] found.
#[derive(Debug, Default)]
pub struct LoadReport {
    /// The newest valid generation, if any.
    pub snapshot: Option<CachedSnapshot>,
    /// Every newer file that was skipped, newest first, and why.
    pub skipped: Vec<CacheError>,
}

/// The cache directory of one (environment, service).
#[derive(Clone, Debug)]
pub struct DiskCache {
    dir: PathBuf,
    environment: String,
    service: String,
}

impl DiskCache {
    /// A cache rooted at `root`; files go to `root/<environment>/<service>/`. Nothing is
    /// touched until [`load`](Self::load) or [`store`](Self::store). `environment` and
    /// `service` must be valid names ([`policy::check_name`]), which keeps them single,
    /// safe path components; the agent builder checks this.
    pub fn new(root: impl Into<PathBuf>, environment: &str, service: &str) -> Self {
        let dir = root.into().join(environment).join(service);
        Self { dir, environment: environment.to_string(), service: service.to_string() }
    }

    /// Directory holding the generations.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Reads the newest valid generation. Every skipped file is logged (`warn`) and
    /// counted in [`CACHE_ERRORS_TOTAL`](crate::metrics_names::CACHE_ERRORS_TOTAL). A missing
    /// directory is an empty cache, not an error. Never panics on file contents.
    pub fn load(&self) -> LoadReport {
        let mut report = LoadReport::default();
        let files = match self.generations() {
            Ok(files) => files,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return report,
            Err(source) => {
                let err = CacheError::Io { path: self.dir.clone(), source };
                self.report(&err);
                report.skipped.push(err);
                return report;
            }
        };
        for (revision, path) in files {
            match self.read(&path, revision) {
                Ok(snapshot) => {
                    report.snapshot = Some(snapshot);
                    break;
                }
                Err(err) => {
                    self.report(&err);
                    report.skipped.push(err);
                }
            }
        }
        report
    }

    /// Writes one generation atomically and prunes to the newest [`GENERATIONS_KEPT`].
    ///
    /// Inputs: the snapshot's `revision` (≥ 1), its `hash` and `body` (the canonical JSON
    /// text it was verified and validated from — callers only pass snapshots that passed
    /// validation), and the wall-clock `written_at`.
    ///
    /// # Errors
    /// [`CacheError::Write`] when the directory cannot be created or the file cannot be
    /// written, synced or renamed; it is also logged and counted.
    pub fn store(
        &self,
        revision: u64,
        hash: &str,
        body: &str,
        written_at: Timestamp,
    ) -> Result<PathBuf, CacheError> {
        let envelope = Envelope {
            schema_version: SCHEMA_VERSION,
            environment: self.environment.clone(),
            service: self.service.clone(),
            revision,
            hash: hash.to_string(),
            written_at,
            body: body.to_string(),
        };
        let result = self.write_atomically(revision, &envelope);
        match result {
            Ok(path) => {
                self.prune();
                Ok(path)
            }
            Err(source) => {
                let err = CacheError::Write { dir: self.dir.clone(), source };
                self.report(&err);
                Err(err)
            }
        }
    }

    fn write_atomically(&self, revision: u64, envelope: &Envelope) -> io::Result<PathBuf> {
        fs::create_dir_all(&self.dir)?;
        let bytes = serde_json::to_vec(envelope).map_err(io::Error::other)?;
        let target = self.dir.join(file_name(revision));
        let temp = self.dir.join(format!("{TEMP_PREFIX}{}", uuid::Uuid::new_v4()));
        let written = (|| {
            let mut file = fs::OpenOptions::new().write(true).create_new(true).open(&temp)?;
            file.write_all(&bytes)?;
            file.sync_all()?;
            drop(file);
            fs::rename(&temp, &target)
        })();
        if let Err(e) = written {
            let _ = fs::remove_file(&temp);
            return Err(e);
        }
        sync_dir(&self.dir)?;
        Ok(target)
    }

    /// Files named like generations, newest (highest revision) first.
    fn generations(&self) -> io::Result<Vec<(u64, PathBuf)>> {
        let mut files = Vec::new();
        for entry in fs::read_dir(&self.dir)? {
            let entry = entry?;
            let name = entry.file_name();
            let Some(name) = name.to_str() else { continue };
            if let Some(revision) = parse_file_name(name) {
                files.push((revision, entry.path()));
            }
        }
        files.sort_by_key(|f| std::cmp::Reverse(f.0));
        Ok(files)
    }

    fn read(&self, path: &Path, revision_from_name: u64) -> Result<CachedSnapshot, CacheError> {
        let io_err = |source| CacheError::Io { path: path.to_path_buf(), source };
        let malformed = |detail: String| CacheError::Malformed { path: path.to_path_buf(), detail };
        let len = fs::metadata(path).map_err(io_err)?.len();
        if len > MAX_FILE_BYTES {
            return Err(malformed(format!("{len} bytes, more than the {MAX_FILE_BYTES} allowed")));
        }
        let bytes = fs::read(path).map_err(io_err)?;
        // Look at the schema version before the shape, so a file of another schema is
        // reported as such rather than as malformed.
        let raw: serde_json::Value = serde_json::from_slice(&bytes).map_err(|e| malformed(e.to_string()))?;
        let found = raw.get("schema_version").and_then(serde_json::Value::as_u64);
        if found != Some(u64::from(SCHEMA_VERSION)) {
            return Err(CacheError::Schema { path: path.to_path_buf(), found, expected: SCHEMA_VERSION });
        }
        let env: Envelope = serde_json::from_value(raw).map_err(|e| malformed(e.to_string()))?;
        if env.environment != self.environment
            || env.service != self.service
            || env.revision != revision_from_name
            || env.revision == 0
        {
            return Err(CacheError::Mismatch {
                path: path.to_path_buf(),
                found: format!("{}/{} revision {}", env.environment, env.service, env.revision),
                expected: format!("{}/{} revision {}", self.environment, self.service, revision_from_name),
            });
        }
        let actual = policy::content_hash(env.body.as_bytes());
        if actual != env.hash {
            return Err(CacheError::Hash { path: path.to_path_buf(), recorded: env.hash, actual });
        }
        // The schema version was checked above, with the envelope's shape.
        let config = policy::accept(SCHEMA_VERSION, env.body.as_bytes())
            .map_err(|source| CacheError::Invalid { path: path.to_path_buf(), source })?;
        Ok(CachedSnapshot {
            revision: env.revision,
            hash: env.hash,
            body: env.body,
            config,
            written_at: env.written_at,
            path: path.to_path_buf(),
        })
    }

    /// Deletes generations beyond the newest [`GENERATIONS_KEPT`] and temp files a crashed
    /// writer left behind. Failures here are harmless and only logged at debug level.
    fn prune(&self) {
        if let Ok(files) = self.generations() {
            for (_, path) in files.into_iter().skip(GENERATIONS_KEPT) {
                if let Err(e) = fs::remove_file(&path) {
                    tracing::debug!(path = %path.display(), error = %e, "could not delete old cache generation");
                }
            }
        }
        let Ok(entries) = fs::read_dir(&self.dir) else { return };
        for entry in entries.flatten() {
            let is_temp = entry.file_name().to_str().is_some_and(|n| n.starts_with(TEMP_PREFIX));
            let old = entry
                .metadata()
                .and_then(|m| m.modified())
                .ok()
                .and_then(|m| SystemTime::now().duration_since(m).ok())
                .is_some_and(|age| age > STALE_TEMP_AGE);
            if is_temp && old {
                let _ = fs::remove_file(entry.path());
            }
        }
    }

    fn report(&self, err: &CacheError) {
        tracing::warn!(
            environment = %self.environment,
            service = %self.service,
            reason = err.reason(),
            error = %err,
            "levee cache file skipped"
        );
        metrics::counter!(
            metrics_names::CACHE_ERRORS_TOTAL,
            "environment" => self.environment.clone(),
            "service" => self.service.clone(),
            "reason" => err.reason(),
        )
        .increment(1);
    }
}

fn file_name(revision: u64) -> String {
    format!("{PREFIX}{revision:020}{SUFFIX}")
}

fn parse_file_name(name: &str) -> Option<u64> {
    let digits = name.strip_prefix(PREFIX)?.strip_suffix(SUFFIX)?;
    if digits.len() != 20 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

#[cfg(unix)]
fn sync_dir(dir: &Path) -> io::Result<()> {
    fs::File::open(dir)?.sync_all()
}

#[cfg(not(unix))]
fn sync_dir(_dir: &Path) -> io::Result<()> {
    // Directory handles cannot be fsynced on this platform; the rename is still atomic.
    Ok(())
}

#[cfg(test)]
mod tests;

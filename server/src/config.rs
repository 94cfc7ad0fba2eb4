//! Layered settings: built-in defaults, then an optional TOML file, then environment
//! variables (`LEVEE_*`), then command-line flags — later layers win.
//!
//! Every setting, with its flag, environment variable, TOML key and default, is listed in
//! docs/operations.md ("Settings"); the defaults themselves are the named constants used
//! below, and a test checks that table against them.

use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context;
use ipnet::IpNet;
use serde::Deserialize;

/// Default HTTP listen address.
pub const DEFAULT_HTTP_ADDR: &str = "127.0.0.1:8080";
/// Default gRPC listen address.
pub const DEFAULT_GRPC_ADDR: &str = "127.0.0.1:8081";
/// Default data directory.
pub const DEFAULT_DATA_DIR: &str = "levee-data";
/// Default request body limit: twice the snapshot budget, so a whole-service write of a
/// snapshot at its budget (with its reason, formatted) gets through; the budget itself is
/// checked on every write whatever this limit is.
pub const DEFAULT_MAX_BODY_BYTES: usize = 2 * levee_agent::policy::defaults::MAX_SNAPSHOT_BYTES;

/// A secret string that never prints.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    /// Wraps a value.
    pub fn new(s: impl Into<String>) -> Self {
        Secret(s.into())
    }
    /// The value, for the one place that needs it.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(***)")
    }
}

/// Command-line / environment layer of `levee serve`.
#[derive(Clone, Debug, Default, clap::Args)]
pub struct ServeArgs {
    /// TOML settings file.
    #[arg(long, env = "LEVEE_CONFIG")]
    pub config: Option<PathBuf>,
    /// Data directory; the SQLite file lives there.
    #[arg(long, env = "LEVEE_DATA_DIR")]
    pub data_dir: Option<PathBuf>,
    /// API and UI address.
    #[arg(long, env = "LEVEE_HTTP_ADDR")]
    pub http_addr: Option<SocketAddr>,
    /// Agent sync (gRPC) address.
    #[arg(long, env = "LEVEE_GRPC_ADDR")]
    pub grpc_addr: Option<SocketAddr>,
    /// Database URL (sqlite:… or postgres://…).
    #[arg(long, env = "LEVEE_DATABASE_URL", hide_env_values = true)]
    pub database_url: Option<String>,
    /// File holding the database URL (instead of --database-url).
    #[arg(long, env = "LEVEE_DATABASE_URL_FILE")]
    pub database_url_file: Option<PathBuf>,
    /// PostgreSQL password, set into the database URL (which then names none).
    #[arg(long, env = "LEVEE_DATABASE_PASSWORD", hide_env_values = true)]
    pub database_password: Option<String>,
    /// File holding the PostgreSQL password (instead of --database-password).
    #[arg(long, env = "LEVEE_DATABASE_PASSWORD_FILE")]
    pub database_password_file: Option<PathBuf>,
    /// Password of the bootstrap admin user `admin`, used when the database has no admin
    /// yet (the first start), or with --reset-admin-password.
    #[arg(long, env = "LEVEE_ADMIN_PASSWORD", hide_env_values = true)]
    pub admin_password: Option<String>,
    /// File holding the bootstrap admin password (instead of --admin-password).
    #[arg(long, env = "LEVEE_ADMIN_PASSWORD_FILE")]
    pub admin_password_file: Option<PathBuf>,
    /// Sets user `admin`'s password to --admin-password at this start even though it
    /// exists (ending its sessions; audited). Remove it again after the start.
    #[arg(long, env = "LEVEE_RESET_ADMIN_PASSWORD", num_args = 0..=1, default_missing_value = "true")]
    pub reset_admin_password: Option<bool>,
    /// JWT signing secret (at least 32 bytes).
    #[arg(long, env = "LEVEE_JWT_SECRET", hide_env_values = true)]
    pub jwt_secret: Option<String>,
    /// File holding the JWT signing secret (instead of --jwt-secret).
    #[arg(long, env = "LEVEE_JWT_SECRET_FILE")]
    pub jwt_secret_file: Option<PathBuf>,
    /// Former JWT secrets, still accepted to verify tokens they signed (never used to
    /// sign); comma-separated (in a file: one per line).
    #[arg(long, env = "LEVEE_JWT_PREVIOUS_SECRETS", hide_env_values = true)]
    pub jwt_previous_secrets: Option<String>,
    /// File holding the former JWT secrets, one per line.
    #[arg(long, env = "LEVEE_JWT_PREVIOUS_SECRETS_FILE")]
    pub jwt_previous_secrets_file: Option<PathBuf>,
    /// Heartbeat interval on agent streams (e.g. `15s`).
    #[arg(long, env = "LEVEE_HEARTBEAT_INTERVAL", value_parser = humantime::parse_duration)]
    pub heartbeat_interval: Option<Duration>,
    /// Maximum agent stream age before a reconnect is requested (e.g. `30m`).
    #[arg(long, env = "LEVEE_MAX_STREAM_AGE", value_parser = humantime::parse_duration)]
    pub max_stream_age: Option<Duration>,
    /// New agent streams accepted per second.
    #[arg(long, env = "LEVEE_NEW_STREAMS_PER_SEC")]
    pub new_streams_per_sec: Option<u32>,
    /// Threads of the agent sync runtime (gRPC streams and their fan-out), apart from the
    /// API's; default: one per CPU.
    #[arg(long, env = "LEVEE_SYNC_THREADS")]
    pub sync_threads: Option<usize>,
    /// Agent liveness lease (e.g. `30s`): an agent whose replica stops renewing it stops
    /// counting as connected after this long.
    #[arg(long, env = "LEVEE_AGENT_LEASE", value_parser = humantime::parse_duration)]
    pub agent_lease: Option<Duration>,
    /// How often staged rollouts are judged and their stages moved on (e.g. `1s`).
    #[arg(long, env = "LEVEE_ROLLOUT_INTERVAL", value_parser = humantime::parse_duration)]
    pub rollout_interval: Option<Duration>,
    /// Request body limit in bytes.
    #[arg(long, env = "LEVEE_MAX_BODY_BYTES")]
    pub max_body_bytes: Option<usize>,
    /// Log filter (tracing EnvFilter syntax).
    #[arg(long, env = "LEVEE_LOG")]
    pub log: Option<String>,
    /// TLS certificate chain (PEM); with --tls-key, the HTTP and gRPC listeners serve TLS.
    #[arg(long, env = "LEVEE_TLS_CERT")]
    pub tls_cert: Option<PathBuf>,
    /// TLS private key (PEM) of --tls-cert.
    #[arg(long, env = "LEVEE_TLS_KEY")]
    pub tls_key: Option<PathBuf>,
    /// Reverse proxies whose `X-Forwarded-For` names the client (login throttling, audit)
    /// and whose `X-Forwarded-Proto` is believed; comma-separated addresses or CIDR ranges.
    #[arg(long, env = "LEVEE_TRUSTED_PROXIES", value_delimiter = ',', value_parser = parse_proxy)]
    pub trusted_proxies: Option<Vec<IpNet>>,
    /// Plain-HTTP address of `/metrics` and the probes; set, `/metrics` leaves the HTTP
    /// address.
    #[arg(long, env = "LEVEE_OPS_ADDR")]
    pub ops_addr: Option<SocketAddr>,
    /// Bearer token `/metrics` asks for (at least 16 bytes).
    #[arg(long, env = "LEVEE_METRICS_TOKEN", hide_env_values = true)]
    pub metrics_token: Option<String>,
    /// File holding the metrics token (instead of --metrics-token).
    #[arg(long, env = "LEVEE_METRICS_TOKEN_FILE")]
    pub metrics_token_file: Option<PathBuf>,
    /// URL that receives one JSON POST each time a feature's fallback passes its
    /// `alert_after`, or stops (a secret: chat webhooks carry their token in the URL).
    #[arg(long, env = "LEVEE_ALERT_WEBHOOK_URL", hide_env_values = true)]
    pub alert_webhook_url: Option<String>,
    /// Endpoints of dependencies served over xDS, `ENVIRONMENT/DEPENDENCY=IP:PORT`,
    /// comma-separated (one entry per endpoint).
    #[arg(long, env = "LEVEE_XDS_ENDPOINTS", value_delimiter = ',')]
    pub xds_endpoints: Option<Vec<String>>,
    /// File holding the alert webhook URL (instead of --alert-webhook-url).
    #[arg(long, env = "LEVEE_ALERT_WEBHOOK_URL_FILE")]
    pub alert_webhook_url_file: Option<PathBuf>,
}

/// The TOML file layer.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileLayer {
    data_dir: Option<PathBuf>,
    http_addr: Option<SocketAddr>,
    grpc_addr: Option<SocketAddr>,
    database_url: Option<String>,
    database_url_file: Option<PathBuf>,
    database_password: Option<String>,
    database_password_file: Option<PathBuf>,
    admin_password: Option<String>,
    admin_password_file: Option<PathBuf>,
    reset_admin_password: Option<bool>,
    jwt_secret: Option<String>,
    jwt_secret_file: Option<PathBuf>,
    jwt_previous_secrets: Option<Vec<String>>,
    jwt_previous_secrets_file: Option<PathBuf>,
    #[serde(default, with = "humantime_serde::option")]
    heartbeat_interval: Option<Duration>,
    #[serde(default, with = "humantime_serde::option")]
    max_stream_age: Option<Duration>,
    new_streams_per_sec: Option<u32>,
    sync_threads: Option<usize>,
    #[serde(default, with = "humantime_serde::option")]
    agent_lease: Option<Duration>,
    #[serde(default, with = "humantime_serde::option")]
    rollout_interval: Option<Duration>,
    max_body_bytes: Option<usize>,
    log: Option<String>,
    tls_cert: Option<PathBuf>,
    tls_key: Option<PathBuf>,
    trusted_proxies: Option<Vec<String>>,
    ops_addr: Option<SocketAddr>,
    metrics_token: Option<String>,
    metrics_token_file: Option<PathBuf>,
    alert_webhook_url: Option<String>,
    xds_endpoints: Option<Vec<String>>,
    alert_webhook_url_file: Option<PathBuf>,
}

/// Validated settings of a running server; the module documentation gives the flag,
/// variable, file key and default of each.
#[derive(Clone, Debug)]
pub struct Settings {
    /// Where the SQLite file lives (created when missing).
    pub data_dir: PathBuf,
    /// Where the API, the UI and the probes listen (port 0: any free port).
    pub http_addr: SocketAddr,
    /// Where agents sync (gRPC).
    pub grpc_addr: SocketAddr,
    /// `sqlite:…` or `postgres://…`; a secret because it may hold a password.
    pub database_url: Secret,
    /// The password of user `admin` when the first start creates it; `None`: generated
    /// and printed once. Ignored once the user exists, unless `reset_admin_password`.
    pub admin_password: Option<Secret>,
    /// Sets `admin_password` on the existing user `admin` at this start (audited as
    /// `user.update`, ending its sessions).
    pub reset_admin_password: bool,
    /// Signs every token; `None`: generated once and stored in the database.
    pub jwt_secret: Option<Secret>,
    /// Former secrets whose signatures are still accepted (a rotation's overlap).
    pub jwt_previous_secrets: Vec<Secret>,
    /// How often an agent stream gets a heartbeat.
    pub heartbeat_interval: Duration,
    /// How long an agent stream lives before the agent is asked to reconnect (jittered).
    pub max_stream_age: Duration,
    /// Most new agent streams accepted per second, so a reconnect storm is spread out.
    pub new_streams_per_sec: u32,
    /// Worker threads of the runtime agent sync runs on, apart from the API's
    /// ([`crate::runtime::SyncRuntime`]).
    pub sync_threads: usize,
    /// Lifetime of an agent's liveness lease, renewed every third of it by the replica
    /// holding the stream.
    pub agent_lease: Duration,
    /// How often every rollout in progress is judged on its cohort's health and NACKs
    /// (halted when worse) and moved to its next stage when the stage baked.
    pub rollout_interval: Duration,
    /// Largest request body accepted, in bytes (413 beyond).
    pub max_body_bytes: usize,
    /// `tracing` filter directives, e.g. `info,levee_server=debug`.
    pub log: String,
    /// Certificate and key both listeners serve TLS with (reloaded when they change);
    /// `None`: plain TCP (for a TLS-terminating proxy in front, see docs/operations.md).
    pub tls: Option<crate::tls::TlsFiles>,
    /// Proxies (addresses and ranges) whose `X-Forwarded-For` and `X-Forwarded-Proto` are
    /// believed; empty: only the socket peer counts.
    pub trusted_proxies: Vec<IpNet>,
    /// Where `/metrics` and the probes are also served, in plain HTTP; `/metrics` then
    /// leaves the HTTP address. `None`: everything on the HTTP address.
    pub ops_addr: Option<SocketAddr>,
    /// The bearer token `/metrics` asks for; `None`: open.
    pub metrics_token: Option<Secret>,
    /// Where each environment's dependencies run, for the endpoints served over xDS
    /// (Levee stores policies, not a service registry).
    pub xds_endpoints: crate::xds::Endpoints,
    /// Where features past their `alert_after` are POSTed (`http://` or `https://`); a
    /// secret, since chat webhooks carry their token in the URL.
    pub alert_webhook_url: Option<Secret>,
}

impl Settings {
    /// Settings for a test or embedded server: everything on loopback port 0 in `data_dir`.
    pub fn for_dir(data_dir: &Path) -> Settings {
        Settings {
            data_dir: data_dir.to_path_buf(),
            http_addr: "127.0.0.1:0".parse().expect("valid"),
            grpc_addr: "127.0.0.1:0".parse().expect("valid"),
            database_url: Secret::new(sqlite_url(data_dir)),
            admin_password: None,
            reset_admin_password: false,
            jwt_secret: None,
            jwt_previous_secrets: Vec::new(),
            heartbeat_interval: crate::sync::HEARTBEAT_INTERVAL,
            max_stream_age: crate::sync::MAX_STREAM_AGE,
            new_streams_per_sec: crate::sync::NEW_STREAMS_PER_SEC,
            sync_threads: crate::runtime::default_sync_threads(),
            agent_lease: crate::fleet::LEASE_TTL,
            rollout_interval: crate::sweeper::ROLLOUT_INTERVAL,
            max_body_bytes: DEFAULT_MAX_BODY_BYTES,
            log: "info".into(),
            tls: None,
            trusted_proxies: Vec::new(),
            ops_addr: None,
            metrics_token: None,
            alert_webhook_url: None,
            xds_endpoints: crate::xds::Endpoints::default(),
        }
    }

    /// Merges the layers.
    ///
    /// # Errors
    /// An unreadable or invalid TOML file, or an invalid value, naming the setting.
    pub fn load(args: ServeArgs) -> anyhow::Result<Settings> {
        let file = match &args.config {
            Some(path) => {
                let text = std::fs::read_to_string(path)
                    .with_context(|| format!("reading settings file {}", path.display()))?;
                toml::from_str::<FileLayer>(&text)
                    .with_context(|| format!("invalid settings file {}", path.display()))?
            }
            None => FileLayer::default(),
        };
        let data_dir = args.data_dir.or(file.data_dir).unwrap_or_else(|| PathBuf::from(DEFAULT_DATA_DIR));
        let http_addr =
            args.http_addr.or(file.http_addr).unwrap_or_else(|| DEFAULT_HTTP_ADDR.parse().expect("valid"));
        let grpc_addr =
            args.grpc_addr.or(file.grpc_addr).unwrap_or_else(|| DEFAULT_GRPC_ADDR.parse().expect("valid"));
        let database_url = secret(
            "database_url",
            (args.database_url, args.database_url_file),
            (file.database_url, file.database_url_file),
        )?
        .map(|s| s.0)
        .unwrap_or_else(|| sqlite_url(&data_dir));
        let database_password = secret(
            "database_password",
            (args.database_password, args.database_password_file),
            (file.database_password, file.database_password_file),
        )?;
        let database_url = match database_password {
            Some(p) => with_password(&database_url, p.expose())?,
            None => database_url,
        };
        let jwt_secret = secret(
            "jwt_secret",
            (args.jwt_secret, args.jwt_secret_file),
            (file.jwt_secret, file.jwt_secret_file),
        )?;
        if let Some(s) = &jwt_secret {
            anyhow::ensure!(
                s.expose().len() >= 32,
                "jwt_secret (LEVEE_JWT_SECRET) must be at least 32 bytes long"
            );
        }
        let jwt_previous_secrets: Vec<Secret> = match secret(
            "jwt_previous_secrets",
            (args.jwt_previous_secrets, args.jwt_previous_secrets_file),
            (file.jwt_previous_secrets.map(|v| v.join(",")), file.jwt_previous_secrets_file),
        )? {
            Some(list) => list
                .expose()
                .split([',', '\n'])
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(Secret::new)
                .collect(),
            None => Vec::new(),
        };
        anyhow::ensure!(
            jwt_previous_secrets.iter().all(|s| s.expose().len() >= 32),
            "every secret of jwt_previous_secrets (LEVEE_JWT_PREVIOUS_SECRETS) must be at least 32 bytes long"
        );
        anyhow::ensure!(
            jwt_previous_secrets.is_empty() || jwt_secret.is_some(),
            "jwt_previous_secrets (LEVEE_JWT_PREVIOUS_SECRETS) needs jwt_secret (LEVEE_JWT_SECRET): \
             the previous secrets are the overlap of a rotation to a secret you give"
        );
        let admin_password = secret(
            "admin_password",
            (args.admin_password, args.admin_password_file),
            (file.admin_password, file.admin_password_file),
        )?;
        let metrics_token = secret(
            "metrics_token",
            (args.metrics_token, args.metrics_token_file),
            (file.metrics_token, file.metrics_token_file),
        )?;
        if let Some(t) = &metrics_token {
            anyhow::ensure!(
                t.expose().len() >= 16,
                "metrics_token (LEVEE_METRICS_TOKEN) must be at least 16 bytes long"
            );
        }
        let trusted_proxies = match (args.trusted_proxies, file.trusted_proxies) {
            (Some(v), _) => v,
            (None, Some(v)) => v
                .iter()
                .map(|p| parse_proxy(p).map_err(|e| anyhow::anyhow!("trusted_proxies: {e}")))
                .collect::<anyhow::Result<_>>()?,
            (None, None) => Vec::new(),
        };
        let max_body_bytes = args.max_body_bytes.or(file.max_body_bytes).unwrap_or(DEFAULT_MAX_BODY_BYTES);
        anyhow::ensure!(
            (1024..=64 * 1024 * 1024).contains(&max_body_bytes),
            "max_body_bytes (LEVEE_MAX_BODY_BYTES) must be between 1024 and 67108864"
        );
        let heartbeat_interval =
            args.heartbeat_interval.or(file.heartbeat_interval).unwrap_or(crate::sync::HEARTBEAT_INTERVAL);
        anyhow::ensure!(
            heartbeat_interval >= Duration::from_millis(10) && heartbeat_interval <= Duration::from_secs(600),
            "heartbeat_interval (LEVEE_HEARTBEAT_INTERVAL) must be between 10ms and 10m"
        );
        let max_stream_age =
            args.max_stream_age.or(file.max_stream_age).unwrap_or(crate::sync::MAX_STREAM_AGE);
        anyhow::ensure!(
            max_stream_age >= Duration::from_secs(1),
            "max_stream_age (LEVEE_MAX_STREAM_AGE) must be at least 1s"
        );
        let new_streams_per_sec =
            args.new_streams_per_sec.or(file.new_streams_per_sec).unwrap_or(crate::sync::NEW_STREAMS_PER_SEC);
        anyhow::ensure!(
            new_streams_per_sec >= 1,
            "new_streams_per_sec (LEVEE_NEW_STREAMS_PER_SEC) must be at least 1"
        );
        let sync_threads =
            args.sync_threads.or(file.sync_threads).unwrap_or_else(crate::runtime::default_sync_threads);
        anyhow::ensure!(
            (1..=crate::runtime::MAX_SYNC_THREADS).contains(&sync_threads),
            "sync_threads (LEVEE_SYNC_THREADS) must be between 1 and {}, not {sync_threads}",
            crate::runtime::MAX_SYNC_THREADS
        );
        let tls = match (args.tls_cert.or(file.tls_cert), args.tls_key.or(file.tls_key)) {
            (Some(cert), Some(key)) => Some(crate::tls::TlsFiles { cert, key }),
            (None, None) => None,
            _ => anyhow::bail!(
                "tls_cert (LEVEE_TLS_CERT) and tls_key (LEVEE_TLS_KEY) go together: set both or neither"
            ),
        };
        let agent_lease = args.agent_lease.or(file.agent_lease).unwrap_or(crate::fleet::LEASE_TTL);
        anyhow::ensure!(
            agent_lease >= Duration::from_secs(1) && agent_lease <= Duration::from_secs(600),
            "agent_lease (LEVEE_AGENT_LEASE) must be between 1s and 10m"
        );
        let rollout_interval =
            args.rollout_interval.or(file.rollout_interval).unwrap_or(crate::sweeper::ROLLOUT_INTERVAL);
        anyhow::ensure!(
            rollout_interval >= Duration::from_millis(10) && rollout_interval <= Duration::from_secs(60),
            "rollout_interval (LEVEE_ROLLOUT_INTERVAL) must be between 10ms and 1m"
        );
        let alert_webhook_url = secret(
            "alert_webhook_url",
            (args.alert_webhook_url, args.alert_webhook_url_file),
            (file.alert_webhook_url, file.alert_webhook_url_file),
        )?;
        if let Some(u) = alert_webhook_url.as_ref().map(Secret::expose) {
            anyhow::ensure!(
                u.starts_with("http://") || u.starts_with("https://"),
                "alert_webhook_url (LEVEE_ALERT_WEBHOOK_URL) must be an http:// or https:// URL"
            );
        }
        let xds_endpoints = crate::xds::Endpoints::parse(
            args.xds_endpoints.or(file.xds_endpoints).unwrap_or_default().iter().map(String::as_str),
        )
        .map_err(|e| anyhow::anyhow!("xds_endpoints (LEVEE_XDS_ENDPOINTS): {e}"))?;
        Ok(Settings {
            xds_endpoints,
            tls,
            data_dir,
            http_addr,
            grpc_addr,
            database_url: Secret::new(database_url),
            admin_password,
            reset_admin_password: args.reset_admin_password.or(file.reset_admin_password).unwrap_or(false),
            jwt_secret,
            jwt_previous_secrets,
            heartbeat_interval,
            max_stream_age,
            new_streams_per_sec,
            sync_threads,
            agent_lease,
            rollout_interval,
            max_body_bytes,
            log: args.log.or(file.log).unwrap_or_else(|| "info".into()),
            trusted_proxies,
            ops_addr: args.ops_addr.or(file.ops_addr),
            metrics_token,
            alert_webhook_url,
        })
    }
}

/// One secret setting from its layers — (value, file) of the flag/environment layer, then
/// of the TOML file — the first layer that names it winning. A file's content is the value
/// without its line ending (what `echo … > file` and Kubernetes/compose secrets leave).
///
/// # Errors
/// Value and file both given in one layer, a file that cannot be read, or an empty one;
/// the message names the setting and the file, never the value.
fn secret(
    name: &str,
    flags: (Option<String>, Option<PathBuf>),
    toml: (Option<String>, Option<PathBuf>),
) -> anyhow::Result<Option<Secret>> {
    let env = format!("LEVEE_{}", name.to_uppercase());
    for (value, file) in [flags, toml] {
        match (value, file) {
            (Some(_), Some(_)) => {
                anyhow::bail!("{name} ({env}) and {name}_file ({env}_FILE) are both set: give one")
            }
            (Some(v), None) => return Ok(Some(Secret::new(v))),
            (None, Some(path)) => {
                let text = std::fs::read_to_string(&path)
                    .with_context(|| format!("reading {name}_file ({env}_FILE) {}", path.display()))?;
                let v = text.strip_suffix('\n').map(|t| t.strip_suffix('\r').unwrap_or(t)).unwrap_or(&text);
                anyhow::ensure!(!v.is_empty(), "{name}_file ({env}_FILE) {} is empty", path.display());
                return Ok(Some(Secret::new(v)));
            }
            (None, None) => {}
        }
    }
    Ok(None)
}

/// `url` with `password` set as its password (percent-encoded).
///
/// # Errors
/// A URL that is not a PostgreSQL one, or that already names a password.
fn with_password(url: &str, password: &str) -> anyhow::Result<String> {
    let mut u = url::Url::parse(url).map_err(|e| anyhow::anyhow!("database_url is not a URL: {e}"))?;
    anyhow::ensure!(
        matches!(u.scheme(), "postgres" | "postgresql"),
        "database_password (LEVEE_DATABASE_PASSWORD) needs a postgres:// database_url"
    );
    anyhow::ensure!(
        u.password().is_none(),
        "database_url names a password and database_password (LEVEE_DATABASE_PASSWORD) is set: give one"
    );
    u.set_password(Some(password)).map_err(|()| anyhow::anyhow!("database_url cannot take a password"))?;
    Ok(u.to_string())
}

/// A trusted proxy: an address (`10.0.0.1`, one host) or a CIDR range (`10.0.0.0/8`).
fn parse_proxy(s: &str) -> Result<IpNet, String> {
    let s = s.trim();
    if s.contains('/') {
        s.parse::<IpNet>().map(|n| n.trunc()).map_err(|e| format!("{s:?} is not a CIDR range: {e}"))
    } else {
        s.parse::<std::net::IpAddr>()
            .map(IpNet::from)
            .map_err(|_| format!("{s:?} is neither an IP address nor a CIDR range (e.g. 10.0.0.0/8)"))
    }
}

/// SQLite URL of the database file in `data_dir`, created when missing.
pub fn sqlite_url(data_dir: &Path) -> String {
    format!("sqlite://{}?mode=rwc", data_dir.join("levee.db").display())
}

impl ServeArgs {
    /// Arguments taken only from the environment (for `levee` run without a subcommand).
    pub fn default_from_env() -> ServeArgs {
        #[derive(clap::Parser)]
        struct Only {
            #[command(flatten)]
            args: ServeArgs,
        }
        <Only as clap::Parser>::parse_from(["levee"]).args
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_win_over_file_and_defaults_fill_the_rest() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("levee.toml");
        std::fs::write(
            &path,
            "http_addr = \"127.0.0.1:9000\"\ngrpc_addr = \"127.0.0.1:9001\"\nheartbeat_interval = \"5s\"\n",
        )
        .unwrap();
        let args = ServeArgs {
            config: Some(path),
            http_addr: Some("127.0.0.1:7000".parse().unwrap()),
            ..Default::default()
        };
        let s = Settings::load(args).unwrap();
        assert_eq!(s.http_addr.port(), 7000);
        assert_eq!(s.grpc_addr.port(), 9001);
        assert_eq!(s.heartbeat_interval, Duration::from_secs(5));
        assert_eq!(s.max_body_bytes, DEFAULT_MAX_BODY_BYTES);
    }

    #[test]
    fn unknown_file_keys_and_short_secrets_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("levee.toml");
        std::fs::write(&path, "http_adr = \"127.0.0.1:9000\"\n").unwrap();
        let err = Settings::load(ServeArgs { config: Some(path), ..Default::default() }).unwrap_err();
        assert!(format!("{err:#}").contains("http_adr"), "{err:#}");
        let err =
            Settings::load(ServeArgs { jwt_secret: Some("short".into()), ..Default::default() }).unwrap_err();
        assert!(err.to_string().contains("32 bytes"));
    }

    #[test]
    fn sync_threads_default_to_the_cpus_and_refuse_zero() {
        let s = Settings::load(ServeArgs::default()).unwrap();
        assert_eq!(s.sync_threads, crate::runtime::default_sync_threads());
        assert!(s.sync_threads >= 1);
        let s = Settings::load(ServeArgs { sync_threads: Some(3), ..Default::default() }).unwrap();
        assert_eq!(s.sync_threads, 3);
        for bad in [0, crate::runtime::MAX_SYNC_THREADS + 1] {
            let err =
                Settings::load(ServeArgs { sync_threads: Some(bad), ..Default::default() }).unwrap_err();
            assert!(err.to_string().contains("sync_threads (LEVEE_SYNC_THREADS)"), "{err}");
        }
    }

    /// docs/operations.md's settings table states each numeric default as the server
    /// applies it (the constants are the one source; the table must not drift from them).
    #[test]
    fn documented_defaults_are_the_applied_ones() {
        let doc =
            std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/operations.md")).unwrap();
        let default_of = |key: &str| -> String {
            let row = doc
                .lines()
                .find(|l| l.starts_with('|') && l.contains(&format!("| `{key}` |")))
                .unwrap_or_else(|| panic!("docs/operations.md has no settings row for `{key}`"));
            let cells: Vec<&str> = row.split('|').map(str::trim).collect();
            cells[cells.len() - 2].trim_matches('`').to_string()
        };
        let s = Settings::load(ServeArgs::default()).unwrap();
        let dur = |key: &str| humantime::parse_duration(&default_of(key)).unwrap();
        assert_eq!(dur("heartbeat_interval"), s.heartbeat_interval);
        assert_eq!(dur("max_stream_age"), s.max_stream_age);
        assert_eq!(dur("agent_lease"), s.agent_lease);
        assert_eq!(dur("rollout_interval"), s.rollout_interval);
        assert_eq!(default_of("new_streams_per_sec").parse::<u32>().unwrap(), s.new_streams_per_sec);
        assert_eq!(default_of("max_body_bytes").parse::<usize>().unwrap(), s.max_body_bytes);
    }

    #[test]
    fn secrets_come_from_files_without_their_line_ending() {
        let dir = tempfile::tempdir().unwrap();
        let jwt = dir.path().join("jwt");
        std::fs::write(&jwt, "0123456789abcdef0123456789abcdef-from-file\n").unwrap();
        let pw = dir.path().join("pw");
        std::fs::write(&pw, "p@ss/word:with#signs\r\n").unwrap();
        let prev = dir.path().join("prev");
        std::fs::write(&prev, "old-secret-old-secret-old-secret-1\nold-secret-old-secret-old-secret-2\n")
            .unwrap();
        let s = Settings::load(ServeArgs {
            jwt_secret_file: Some(jwt.clone()),
            jwt_previous_secrets_file: Some(prev),
            database_url: Some("postgres://levee@db.internal:5432/levee?sslmode=verify-full".into()),
            database_password_file: Some(pw),
            ..Default::default()
        })
        .unwrap();
        assert_eq!(s.jwt_secret.unwrap().expose(), "0123456789abcdef0123456789abcdef-from-file");
        assert_eq!(s.jwt_previous_secrets.len(), 2);
        // The password is percent-encoded into the URL, the rest of it kept.
        assert_eq!(
            s.database_url.expose(),
            "postgres://levee:p%40ss%2Fword%3Awith%23signs@db.internal:5432/levee?sslmode=verify-full"
        );
        // In the TOML file too.
        let toml = dir.path().join("levee.toml");
        std::fs::write(&toml, format!("jwt_secret_file = {:?}\n", jwt.display().to_string())).unwrap();
        let s = Settings::load(ServeArgs { config: Some(toml), ..Default::default() }).unwrap();
        assert!(s.jwt_secret.unwrap().expose().ends_with("-from-file"));
        // A chat webhook's URL is its token: a secret too, never in Debug.
        let hook = dir.path().join("hook");
        std::fs::write(&hook, "https://hooks.example/services/T0/B0/s3cr3t\n").unwrap();
        let s =
            Settings::load(ServeArgs { alert_webhook_url_file: Some(hook), ..Default::default() }).unwrap();
        assert_eq!(
            s.alert_webhook_url.as_ref().unwrap().expose(),
            "https://hooks.example/services/T0/B0/s3cr3t"
        );
        assert!(!format!("{s:?}").contains("s3cr3t"));
    }

    #[test]
    fn secret_files_are_refused_with_the_setting_named() {
        let dir = tempfile::tempdir().unwrap();
        let empty = dir.path().join("empty");
        std::fs::write(&empty, "\n").unwrap();
        let err = |args: ServeArgs| format!("{:#}", Settings::load(args).unwrap_err());
        let e = err(ServeArgs { admin_password_file: Some(empty.clone()), ..Default::default() });
        assert!(e.contains("admin_password_file (LEVEE_ADMIN_PASSWORD_FILE)") && e.contains("empty"), "{e}");
        let e = err(ServeArgs {
            jwt_secret: Some("x".repeat(40)),
            jwt_secret_file: Some(empty),
            ..Default::default()
        });
        assert!(e.contains("both set"), "{e}");
        let e = err(ServeArgs { metrics_token_file: Some(dir.path().join("missing")), ..Default::default() });
        assert!(e.contains("metrics_token_file (LEVEE_METRICS_TOKEN_FILE)"), "{e}");
        let e = err(ServeArgs { database_password: Some("pw".into()), ..Default::default() });
        assert!(e.contains("needs a postgres:// database_url"), "{e}");
        let e = err(ServeArgs {
            database_url: Some("postgres://u:inline@h/db".into()),
            database_password: Some("pw".into()),
            ..Default::default()
        });
        assert!(e.contains("names a password"), "{e}");
        let e = err(ServeArgs { jwt_previous_secrets: Some("y".repeat(40)), ..Default::default() });
        assert!(e.contains("needs jwt_secret"), "{e}");
    }

    #[test]
    fn trusted_proxies_take_addresses_and_ranges() {
        assert_eq!(parse_proxy("10.0.0.7").unwrap(), "10.0.0.7/32".parse::<IpNet>().unwrap());
        assert_eq!(parse_proxy(" 10.244.0.0/16").unwrap(), "10.244.0.0/16".parse::<IpNet>().unwrap());
        assert_eq!(parse_proxy("10.244.3.9/16").unwrap(), "10.244.0.0/16".parse::<IpNet>().unwrap());
        assert_eq!(parse_proxy("fd00::/8").unwrap(), "fd00::/8".parse::<IpNet>().unwrap());
        assert!(parse_proxy("10.0.0.0/33").unwrap_err().contains("not a CIDR range"));
        assert!(parse_proxy("proxy.internal").unwrap_err().contains("neither an IP address"));
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("levee.toml");
        std::fs::write(&path, "trusted_proxies = [\"172.18.0.0/16\", \"nope\"]\n").unwrap();
        let e = format!(
            "{:#}",
            Settings::load(ServeArgs { config: Some(path), ..Default::default() }).unwrap_err()
        );
        assert!(e.contains("trusted_proxies") && e.contains("\"nope\""), "{e}");
    }

    /// deploy/levee.toml, the sample the systemd install copies, names every setting of
    /// docs/operations.md's table (and the file twin of every secret), and with every
    /// setting uncommented it is a valid settings file (no unknown key, no wrong type).
    #[test]
    fn sample_settings_file_names_every_setting() {
        let root = concat!(env!("CARGO_MANIFEST_DIR"), "/..");
        let sample = std::fs::read_to_string(format!("{root}/deploy/levee.toml")).unwrap();
        let settings: Vec<(String, String)> = sample
            .lines()
            .filter_map(|l| l.strip_prefix("# "))
            .filter_map(|l| l.split_once(" = "))
            .filter(|(k, _)| k.chars().all(|c| c.is_ascii_lowercase() || c == '_'))
            .map(|(k, v)| {
                // The value without a trailing comment (values hold no " #").
                (k.to_string(), v.split("   #").next().unwrap().trim().to_string())
            })
            .collect();
        let uncommented: String = settings.iter().map(|(k, v)| format!("{k} = {v}\n")).collect();
        if let Err(e) = toml::from_str::<FileLayer>(&uncommented) {
            panic!("deploy/levee.toml uncommented does not load: {e}\n{uncommented}");
        }
        let doc = std::fs::read_to_string(format!("{root}/docs/operations.md")).unwrap();
        let table = doc.split("## Settings").nth(1).unwrap().split("\n## ").next().unwrap();
        let documented: Vec<&str> = table
            .lines()
            .filter(|l| l.starts_with("| "))
            .filter_map(|l| l.split('|').nth(4))
            .filter_map(|cell| cell.trim().strip_prefix('`')?.strip_suffix('`'))
            .collect();
        assert!(documented.len() >= 20, "{documented:?}");
        let named = |key: &str| settings.iter().any(|(k, _)| k == key);
        for key in documented {
            let secret = [
                "database_url",
                "database_password",
                "admin_password",
                "jwt_secret",
                "jwt_previous_secrets",
                "metrics_token",
                "alert_webhook_url",
            ]
            .contains(&key);
            assert!(
                named(key) || (secret && named(&format!("{key}_file"))),
                "deploy/levee.toml does not name setting `{key}`"
            );
        }
    }

    #[test]
    fn secrets_do_not_print() {
        let s = Secret::new("hunter2");
        assert_eq!(format!("{s:?}"), "Secret(***)");
    }
}

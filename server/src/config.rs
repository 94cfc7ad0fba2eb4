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
use serde::Deserialize;

/// Default HTTP listen address.
pub const DEFAULT_HTTP_ADDR: &str = "127.0.0.1:8080";
/// Default gRPC listen address.
pub const DEFAULT_GRPC_ADDR: &str = "127.0.0.1:8081";
/// Default data directory.
pub const DEFAULT_DATA_DIR: &str = "levee-data";
/// Default request body limit.
pub const DEFAULT_MAX_BODY_BYTES: usize = 1024 * 1024;

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
    /// Password of the bootstrap admin user `admin`, used when the database has no admin
    /// yet (the first start), or with --reset-admin-password.
    #[arg(long, env = "LEVEE_ADMIN_PASSWORD", hide_env_values = true)]
    pub admin_password: Option<String>,
    /// Sets user `admin`'s password to --admin-password at this start even though it
    /// exists (ending its sessions; audited). Remove it again after the start.
    #[arg(long, env = "LEVEE_RESET_ADMIN_PASSWORD", num_args = 0..=1, default_missing_value = "true")]
    pub reset_admin_password: Option<bool>,
    /// JWT signing secret (at least 32 bytes).
    #[arg(long, env = "LEVEE_JWT_SECRET", hide_env_values = true)]
    pub jwt_secret: Option<String>,
    /// Heartbeat interval on agent streams (e.g. `15s`).
    #[arg(long, env = "LEVEE_HEARTBEAT_INTERVAL", value_parser = humantime::parse_duration)]
    pub heartbeat_interval: Option<Duration>,
    /// Maximum agent stream age before a reconnect is requested (e.g. `30m`).
    #[arg(long, env = "LEVEE_MAX_STREAM_AGE", value_parser = humantime::parse_duration)]
    pub max_stream_age: Option<Duration>,
    /// New agent streams accepted per second.
    #[arg(long, env = "LEVEE_NEW_STREAMS_PER_SEC")]
    pub new_streams_per_sec: Option<u32>,
    /// Agent liveness lease (e.g. `30s`): an agent whose replica stops renewing it stops
    /// counting as connected after this long.
    #[arg(long, env = "LEVEE_AGENT_LEASE", value_parser = humantime::parse_duration)]
    pub agent_lease: Option<Duration>,
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
    /// Addresses of reverse proxies whose `X-Forwarded-For` names the client (login
    /// throttling, audit); comma-separated IPs.
    #[arg(long, env = "LEVEE_TRUSTED_PROXIES", value_delimiter = ',')]
    pub trusted_proxies: Option<Vec<std::net::IpAddr>>,
    /// URL that receives one JSON POST each time a feature's fallback passes its
    /// `alert_after`, or stops.
    #[arg(long, env = "LEVEE_ALERT_WEBHOOK_URL")]
    pub alert_webhook_url: Option<String>,
}

/// The TOML file layer.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileLayer {
    data_dir: Option<PathBuf>,
    http_addr: Option<SocketAddr>,
    grpc_addr: Option<SocketAddr>,
    database_url: Option<String>,
    admin_password: Option<String>,
    reset_admin_password: Option<bool>,
    jwt_secret: Option<String>,
    #[serde(default, with = "humantime_serde::option")]
    heartbeat_interval: Option<Duration>,
    #[serde(default, with = "humantime_serde::option")]
    max_stream_age: Option<Duration>,
    new_streams_per_sec: Option<u32>,
    #[serde(default, with = "humantime_serde::option")]
    agent_lease: Option<Duration>,
    max_body_bytes: Option<usize>,
    log: Option<String>,
    tls_cert: Option<PathBuf>,
    tls_key: Option<PathBuf>,
    trusted_proxies: Option<Vec<std::net::IpAddr>>,
    alert_webhook_url: Option<String>,
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
    /// How often an agent stream gets a heartbeat.
    pub heartbeat_interval: Duration,
    /// How long an agent stream lives before the agent is asked to reconnect (jittered).
    pub max_stream_age: Duration,
    /// Most new agent streams accepted per second, so a reconnect storm is spread out.
    pub new_streams_per_sec: u32,
    /// Lifetime of an agent's liveness lease, renewed every third of it by the replica
    /// holding the stream.
    pub agent_lease: Duration,
    /// Largest request body accepted, in bytes (413 beyond).
    pub max_body_bytes: usize,
    /// `tracing` filter directives, e.g. `info,levee_server=debug`.
    pub log: String,
    /// Certificate and key both listeners serve TLS with (reloaded when they change);
    /// `None`: plain TCP (for a TLS-terminating proxy in front, see docs/operations.md).
    pub tls: Option<crate::tls::TlsFiles>,
    /// Proxies whose `X-Forwarded-For` is believed; empty: only the socket peer counts.
    pub trusted_proxies: Vec<std::net::IpAddr>,
    /// Where features past their `alert_after` are POSTed (`http://` or `https://`).
    pub alert_webhook_url: Option<String>,
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
            heartbeat_interval: crate::sync::HEARTBEAT_INTERVAL,
            max_stream_age: crate::sync::MAX_STREAM_AGE,
            new_streams_per_sec: crate::sync::NEW_STREAMS_PER_SEC,
            agent_lease: crate::fleet::LEASE_TTL,
            max_body_bytes: DEFAULT_MAX_BODY_BYTES,
            log: "info".into(),
            tls: None,
            trusted_proxies: Vec::new(),
            alert_webhook_url: None,
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
        let database_url = args.database_url.or(file.database_url).unwrap_or_else(|| sqlite_url(&data_dir));
        let jwt_secret = args.jwt_secret.or(file.jwt_secret);
        if let Some(s) = &jwt_secret {
            anyhow::ensure!(s.len() >= 32, "jwt_secret (LEVEE_JWT_SECRET) must be at least 32 bytes long");
        }
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
        let alert_webhook_url = args.alert_webhook_url.or(file.alert_webhook_url);
        if let Some(u) = &alert_webhook_url {
            anyhow::ensure!(
                u.starts_with("http://") || u.starts_with("https://"),
                "alert_webhook_url (LEVEE_ALERT_WEBHOOK_URL) must be an http:// or https:// URL"
            );
        }
        Ok(Settings {
            tls,
            data_dir,
            http_addr,
            grpc_addr,
            database_url: Secret::new(database_url),
            admin_password: args.admin_password.or(file.admin_password).map(Secret::new),
            reset_admin_password: args.reset_admin_password.or(file.reset_admin_password).unwrap_or(false),
            jwt_secret: jwt_secret.map(Secret::new),
            heartbeat_interval,
            max_stream_age,
            new_streams_per_sec,
            agent_lease,
            max_body_bytes,
            log: args.log.or(file.log).unwrap_or_else(|| "info".into()),
            trusted_proxies: args.trusted_proxies.or(file.trusted_proxies).unwrap_or_default(),
            alert_webhook_url,
        })
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
        assert_eq!(default_of("new_streams_per_sec").parse::<u32>().unwrap(), s.new_streams_per_sec);
        assert_eq!(default_of("max_body_bytes").parse::<usize>().unwrap(), s.max_body_bytes);
    }

    #[test]
    fn secrets_do_not_print() {
        let s = Secret::new("hunter2");
        assert_eq!(format!("{s:?}"), "Secret(***)");
    }
}

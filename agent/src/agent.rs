//! The agent: built once per service process, it publishes the configuration to enforce
//! (live → disk cache → compiled-in defaults) and keeps it current in the background.

use std::fmt;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::applied::{Applied, ResolveCtx, Source, wall_to_monotonic};
use crate::cache::DiskCache;
use crate::enforce::Dependency;
use crate::flags::{FlagBool, FlagFloat, FlagInt, FlagJson, FlagString};
use crate::policy::{self, ServiceConfig, Timestamp};
use crate::state::{AgentStatus, Shared, StatusContributor};
use crate::sync::{SyncClient, SyncClientSettings, TokenProblem, TokenSource, run_housekeeping};

/// Why [`AgentBuilder::build`] failed. Each is a programming or deployment error, found at
/// startup rather than at the first call.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BuildError {
    /// The environment or service name is not a valid name (`a-z 0-9 . _ -`, 1..=64).
    #[error("invalid {what} {value:?}: {reason}")]
    InvalidName {
        /// `environment` or `service`.
        what: &'static str,
        /// The rejected value.
        value: String,
        /// What is allowed.
        reason: &'static str,
    },
    /// The server address is not a valid `http://host:port` URI.
    #[error("invalid server address {address:?}: {source}")]
    InvalidAddress {
        /// The rejected address.
        address: String,
        /// The URI parser's error.
        source: tonic::transport::Error,
    },
    /// The token cannot be sent as gRPC metadata (not visible ASCII), or the token file is
    /// empty. The token itself is never printed.
    #[error("the agent token is not valid ASCII header text")]
    InvalidToken,
    /// The token file ([`AgentBuilder::token_file`]) cannot be read.
    #[error("cannot read the agent token file {path:?}: {source}")]
    TokenFile {
        /// The file.
        path: PathBuf,
        /// The file system's error.
        source: std::io::Error,
    },
    /// The compiled-in defaults do not validate.
    #[error("the compiled-in defaults are invalid: {0}")]
    InvalidDefaults(#[from] policy::ValidationErrors),
    /// A CA was given for an `http://` address, or an `https://` address has no CA to
    /// verify the server against ([`AgentBuilder::tls_ca_pem`]).
    #[error("server address {address:?}: use https:// together with tls_ca_pem, or http:// without it")]
    TlsMismatch {
        /// The server address.
        address: String,
    },
    /// `build` was called outside a tokio runtime.
    #[error("AgentBuilder::build must be called inside a tokio runtime")]
    NoRuntime,
}

/// [`Agent::wait_for_initial_sync`] gave up.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "no live configuration from the Levee server within {waited:?}; enforcing the {enforcing} configuration"
)]
pub struct InitialSyncTimeout {
    /// How long it waited.
    pub waited: Duration,
    /// Source of what is enforced meanwhile.
    pub enforcing: Source,
}

/// Configures and starts an [`Agent`]. Create with [`Agent::builder`].
pub struct AgentBuilder {
    server: String,
    fallback_servers: Vec<String>,
    token: String,
    token_file: Option<PathBuf>,
    environment: String,
    service: String,
    cache_dir: Option<PathBuf>,
    defaults: ServiceConfig,
    refuse_until_fresh: bool,
    settings: SyncClientSettings,
    tls_ca_pem: Option<Vec<u8>>,
    instance_name: Option<String>,
}

/// Environment variables an agent takes its instance name from, in this order (the
/// Kubernetes downward API's pod name, then the host name most shells and container
/// runtimes set).
pub const INSTANCE_NAME_VARS: [&str; 2] = ["POD_NAME", "HOSTNAME"];
/// Name used when neither [`INSTANCE_NAME_VARS`] nor `/etc/hostname` gives one.
pub const DEFAULT_INSTANCE_NAME: &str = "agent";
/// Longest instance name kept (characters); the id adds `-` and 8 hex digits.
pub const MAX_INSTANCE_NAME_CHARS: usize = 100;

/// An instance name reduced to letters, digits, `.`, `_` and `-` (anything else becomes
/// `_`), at most [`MAX_INSTANCE_NAME_CHARS`]; `None` when nothing is left.
fn clean_instance_name(name: &str) -> Option<String> {
    let cleaned: String = name
        .trim()
        .chars()
        .take(MAX_INSTANCE_NAME_CHARS)
        .map(|c| if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') { c } else { '_' })
        .collect();
    (!cleaned.is_empty()).then_some(cleaned)
}

/// The instance name from the environment: [`INSTANCE_NAME_VARS`], else `/etc/hostname`,
/// else [`DEFAULT_INSTANCE_NAME`].
fn instance_name_from_env() -> String {
    INSTANCE_NAME_VARS
        .iter()
        .filter_map(|v| std::env::var(v).ok())
        .chain(std::fs::read_to_string("/etc/hostname").ok())
        .find_map(|n| clean_instance_name(&n))
        .unwrap_or_else(|| DEFAULT_INSTANCE_NAME.to_string())
}

/// The id announced in `Hello`: the instance name and 8 random hex digits, so two processes
/// on one host never share an id and the fleet view still says which host or pod it is.
fn instance_id(name: &str) -> String {
    let suffix = uuid::Uuid::new_v4().simple().to_string();
    format!("{name}-{}", &suffix[..8])
}

/// The instance name inside an id [`Agent::instance_id`] announces: the id without its `-`
/// and 8 random hex digits (an id of another shape is its own name). It is what stays the
/// same when the instance restarts, so the server draws a staged rollout's cohort from it.
pub fn instance_name_of(id: &str) -> &str {
    match id.rsplit_once('-') {
        Some((name, suffix))
            if !name.is_empty()
                && suffix.len() == 8
                && suffix.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)) =>
        {
            name
        }
        _ => id,
    }
}

impl fmt::Debug for AgentBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AgentBuilder")
            .field("server", &self.server)
            .field("fallback_servers", &self.fallback_servers)
            .field("token", &"<redacted>")
            .field("token_file", &self.token_file)
            .field("environment", &self.environment)
            .field("service", &self.service)
            .field("cache_dir", &self.cache_dir)
            .field("refuse_until_fresh", &self.refuse_until_fresh)
            .field("settings", &self.settings)
            .field("tls_ca", &self.tls_ca_pem.is_some())
            .field("instance_name", &self.instance_name)
            .finish_non_exhaustive()
    }
}

impl AgentBuilder {
    /// Another address of the server's gRPC endpoint (a replica reached directly, or a
    /// second load balancer), of the same scheme as the first: the agent moves to the next
    /// address after an attempt that failed before any message or a replica that said it
    /// is stopping, and stays on the one that answers. Call once per address.
    pub fn fallback_server(mut self, server: impl Into<String>) -> Self {
        self.fallback_servers.push(server.into());
        self
    }

    /// Reads the token from this file (its content without surrounding whitespace)
    /// instead of the one given to [`Agent::builder`], now and again before every
    /// connection attempt, so a rotated token (`levee tokens rotate`) written there is used
    /// without a restart. While the server refuses the token in use, the file is read
    /// every [`crate::sync::TOKEN_FILE_POLL`] and a new token ends the long wait at once.
    /// A file that cannot be read or is empty at a later read keeps the token in use.
    pub fn token_file(mut self, path: impl Into<PathBuf>) -> Self {
        self.token_file = Some(path.into());
        self
    }

    /// The name this instance shows in the server's fleet view (the id it announces is the
    /// name, `-` and 8 random hex digits). Characters other than ASCII letters, digits,
    /// `.`, `_` and `-` become `_`; at most [`MAX_INSTANCE_NAME_CHARS`] are kept. Default:
    /// `POD_NAME`, else `HOSTNAME`, else `/etc/hostname`, else [`DEFAULT_INSTANCE_NAME`].
    pub fn instance_name(mut self, name: impl Into<String>) -> Self {
        self.instance_name = Some(name.into());
        self
    }

    /// Directory of the disk cache (files go to `<dir>/<environment>/<service>/`). Without
    /// one, nothing is persisted and a restart during an outage starts from the defaults.
    pub fn cache_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.cache_dir = Some(dir.into());
        self
    }

    /// The service's compiled-in safe defaults, enforced when neither the server nor the
    /// cache has a configuration, and for dependencies the applied snapshot does not name.
    /// Default: [`ServiceConfig::default()`].
    pub fn defaults(mut self, defaults: ServiceConfig) -> Self {
        self.defaults = defaults;
        self
    }

    /// When `true`, [`Agent::readiness`] reports not ready until a configuration has been
    /// confirmed live by the server (for services that must never serve on stale policy).
    /// Default `false`.
    pub fn refuse_until_fresh(mut self, refuse: bool) -> Self {
        self.refuse_until_fresh = refuse;
        self
    }

    /// Verifies the server's TLS certificate against this CA (PEM, one or more
    /// certificates) and connects with TLS; the server address must then be
    /// `https://host:port`, its host being a name (or IP) the certificate is for. An
    /// `https://` address needs it: the agent trusts no other root.
    pub fn tls_ca_pem(mut self, pem: impl Into<Vec<u8>>) -> Self {
        self.tls_ca_pem = Some(pem.into());
        self
    }

    /// Timings of the sync client. Default: [`SyncClientSettings::default()`].
    pub fn sync_settings(mut self, settings: SyncClientSettings) -> Self {
        self.settings = settings;
        self
    }

    /// Starts the agent and returns at once: loads the newest valid cache generation (or
    /// takes the defaults), publishes it, and spawns the sync task on the current tokio
    /// runtime. Never waits for the server.
    ///
    /// # Errors
    /// See [`BuildError`].
    pub fn build(self) -> Result<Agent, BuildError> {
        for (what, value) in [("environment", &self.environment), ("service", &self.service)] {
            policy::check_name(value).map_err(|reason| BuildError::InvalidName {
                what,
                value: value.clone(),
                reason,
            })?;
        }
        self.defaults.validate()?;
        let mut endpoints = Vec::with_capacity(1 + self.fallback_servers.len());
        for address in std::iter::once(&self.server).chain(&self.fallback_servers) {
            let mut endpoint = SyncClient::endpoint(address, &self.settings)
                .map_err(|source| BuildError::InvalidAddress { address: address.clone(), source })?;
            let https = endpoint.uri().scheme_str() == Some("https");
            match (&self.tls_ca_pem, https) {
                (Some(pem), true) => {
                    let tls = tonic::transport::ClientTlsConfig::new()
                        .ca_certificate(tonic::transport::Certificate::from_pem(pem));
                    endpoint = endpoint
                        .tls_config(tls)
                        .map_err(|source| BuildError::InvalidAddress { address: address.clone(), source })?;
                }
                (None, false) => {}
                (Some(_), false) | (None, true) => {
                    return Err(BuildError::TlsMismatch { address: address.clone() });
                }
            }
            endpoints.push(endpoint);
        }
        let token = match &self.token_file {
            Some(path) => TokenSource::file(path),
            None => TokenSource::fixed(&self.token),
        }
        .map_err(|e| match e {
            TokenProblem::Invalid => BuildError::InvalidToken,
            TokenProblem::Unreadable(source) => {
                BuildError::TokenFile { path: self.token_file.clone().unwrap_or_default(), source }
            }
        })?;
        let runtime = tokio::runtime::Handle::try_current().map_err(|_| BuildError::NoRuntime)?;

        let defaults = Arc::new(self.defaults);
        let cache = self.cache_dir.map(|dir| DiskCache::new(dir, &self.environment, &self.service));
        let now = Instant::now();
        let (initial, confirmed_at) = match cache.as_ref().and_then(|c| c.load().snapshot) {
            Some(snap) => {
                let wall_now = Timestamp::now();
                // Confirmed live when it was written (never later than now, whatever the clocks say).
                let written = wall_to_monotonic(snap.written_at, wall_now, now).map(|t| t.min(now));
                tracing::info!(
                    environment = %self.environment,
                    service = %self.service,
                    revision = snap.revision,
                    written_at = %snap.written_at,
                    "levee agent starting from its disk cache"
                );
                let applied = Applied::new(
                    snap.config,
                    snap.revision,
                    snap.hash,
                    Source::Cache,
                    Some(Arc::from(snap.body)),
                    now,
                    wall_now,
                );
                (applied, written)
            }
            None => {
                tracing::info!(
                    environment = %self.environment,
                    service = %self.service,
                    "levee agent starting from the compiled-in defaults"
                );
                (Applied::defaults(defaults.clone(), now), None)
            }
        };
        let shared =
            Arc::new(Shared::new(self.environment, self.service, defaults, initial, confirmed_at, cache));
        shared.refuse_until_fresh.store(self.refuse_until_fresh, std::sync::atomic::Ordering::Relaxed);
        let (shutdown_tx, shutdown_rx) = watch::channel(false);
        let name = self.instance_name.as_deref().and_then(clean_instance_name);
        let instance_id = instance_id(&name.unwrap_or_else(instance_name_from_env));
        // Before the first refresh that can see a fault rule naming instances (the slots
        // are resolved again once it is set).
        let _ = shared.instance_id.set(instance_id.clone());
        shared.refresh();
        let client = SyncClient {
            shared: shared.clone(),
            endpoints,
            current: 0,
            token,
            instance_id: instance_id.clone(),
            settings: self.settings.clone(),
            shutdown: shutdown_rx.clone(),
        };
        let tasks = vec![
            runtime.spawn(client.run()),
            runtime.spawn(run_housekeeping(shared.clone(), self.settings.metrics_interval, shutdown_rx)),
        ];
        Ok(Agent {
            inner: Arc::new(Inner {
                shared,
                shutdown_tx,
                tasks: tokio::sync::Mutex::new(tasks),
                instance_id,
                admission: std::sync::OnceLock::new(),
                runtime,
            }),
        })
    }
}

struct Inner {
    shared: Arc<Shared>,
    shutdown_tx: watch::Sender<bool>,
    tasks: tokio::sync::Mutex<Vec<JoinHandle<()>>>,
    instance_id: String,
    admission: std::sync::OnceLock<crate::admission::Admission>,
    /// The runtime the agent was built on (admission's queue task runs there).
    runtime: tokio::runtime::Handle,
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.shutdown_tx.send_replace(true);
    }
}

/// The status as JSON (what an endpoint such as the example's `/levee/status` answers):
/// `{"source": "live"|"cache"|"default", "revision": 3, "hash": "…", "age_seconds": 1.5
/// (or null), "connected": true, "last_error": null, "last_nack": {"revision": 4,
/// "detail": "…"} (or null)}`.
impl serde::Serialize for AgentStatus {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct;
        #[derive(serde::Serialize)]
        struct Nack<'a> {
            revision: u64,
            detail: &'a str,
        }
        let mut st = s.serialize_struct("AgentStatus", 7)?;
        st.serialize_field("source", self.source.as_str())?;
        st.serialize_field("revision", &self.revision)?;
        st.serialize_field("hash", &self.hash)?;
        st.serialize_field("age_seconds", &self.age.map(|a| a.as_secs_f64()))?;
        st.serialize_field("connected", &self.connected)?;
        st.serialize_field("last_error", &self.last_error)?;
        let nack = self.last_nack.as_ref().map(|n| Nack { revision: n.revision, detail: &n.detail });
        st.serialize_field("last_nack", &nack)?;
        st.end()
    }
}

/// The Levee agent of one service. Cheap to clone (all clones share one sync task); the
/// background tasks stop on [`shutdown`](Self::shutdown) or when the last clone is dropped.
#[derive(Clone)]
pub struct Agent {
    inner: Arc<Inner>,
}

impl fmt::Debug for Agent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Agent")
            .field("environment", &self.inner.shared.environment)
            .field("service", &self.inner.shared.service)
            .field("instance_id", &self.inner.instance_id)
            .finish_non_exhaustive()
    }
}

impl Agent {
    /// Starts configuring an agent.
    ///
    /// Inputs: `server`, the `http://host:port` address of the server's gRPC endpoint;
    /// `token`, the agent's JWT (sent as `authorization: Bearer <token>`; or read from a
    /// file that may change, [`AgentBuilder::token_file`]); `environment` and `service`,
    /// the names the token is scoped to. More addresses: [`AgentBuilder::fallback_server`].
    pub fn builder(
        server: impl Into<String>,
        token: impl Into<String>,
        environment: impl Into<String>,
        service: impl Into<String>,
    ) -> AgentBuilder {
        AgentBuilder {
            server: server.into(),
            fallback_servers: Vec::new(),
            token: token.into(),
            token_file: None,
            environment: environment.into(),
            service: service.into(),
            cache_dir: None,
            defaults: ServiceConfig::default(),
            refuse_until_fresh: false,
            settings: SyncClientSettings::default(),
            tls_ca_pem: None,
            instance_name: None,
        }
    }

    /// The applied configuration: one lock-free load, no copy.
    pub fn current(&self) -> Arc<Applied> {
        self.inner.shared.current.load_full()
    }

    /// The configuration being enforced (of [`current`](Self::current)): one lock-free
    /// load, no copy.
    pub fn config(&self) -> Arc<ServiceConfig> {
        self.inner.shared.current.load().config.clone()
    }

    /// Source, revision, age, connection state and the last error / NACK.
    pub fn status(&self) -> AgentStatus {
        self.inner.shared.status()
    }

    /// Whether the configuration has been confirmed live by the server at least once since
    /// this agent started.
    pub fn is_fresh(&self) -> bool {
        *self.inner.shared.live_tx.borrow()
    }

    /// Whether the service should report ready: every **critical** dependency it has
    /// called is switched on and its circuit breaker is not open, and — only when built
    /// with [`refuse_until_fresh`](AgentBuilder::refuse_until_fresh) — a configuration was
    /// confirmed live ([`is_fresh`](Self::is_fresh)). Never depends on non-critical
    /// dependencies nor on the control-plane connection (an outage of either must not take
    /// services out of rotation).
    pub fn readiness(&self) -> bool {
        self.inner.shared.ready()
    }

    /// Waits at most `timeout` for a configuration confirmed live by the server (a snapshot
    /// applied, or the cached revision confirmed current). Returns at once when that has
    /// already happened.
    ///
    /// # Errors
    /// [`InitialSyncTimeout`] after `timeout`; the agent keeps enforcing its cache or
    /// defaults and keeps trying in the background.
    pub async fn wait_for_initial_sync(&self, timeout: Duration) -> Result<(), InitialSyncTimeout> {
        let mut rx = self.inner.shared.live_tx.subscribe();
        match tokio::time::timeout(timeout, rx.wait_for(|live| *live)).await {
            Ok(Ok(_)) => Ok(()),
            _ => Err(InitialSyncTimeout { waited: timeout, enforcing: self.current().source }),
        }
    }

    fn declare<R>(&self, f: impl FnOnce(&Shared, &ResolveCtx<'_>) -> R) -> R {
        let shared = &self.inner.shared;
        let r = shared.with_ctx(|ctx| f(shared, ctx));
        // Kill switches of dependencies may be keyed to the new flag, and its expiry may
        // be the next timer.
        shared.refresh();
        r
    }

    /// Declares a bool flag with its compiled-in default; see [`FlagBool`]. Declare once
    /// and clone the handle: every declaration gets its own slot.
    pub fn flag_bool(&self, key: &str, default: bool) -> FlagBool {
        self.declare(|s, ctx| s.flags.declare_bool(key, default, ctx))
    }

    /// Declares an integer flag with its compiled-in default; see [`FlagInt`].
    pub fn flag_int(&self, key: &str, default: i64) -> FlagInt {
        self.declare(|s, ctx| s.flags.declare_int(key, default, ctx))
    }

    /// Declares a float flag with its compiled-in default; see [`FlagFloat`].
    pub fn flag_float(&self, key: &str, default: f64) -> FlagFloat {
        self.declare(|s, ctx| s.flags.declare_float(key, default, ctx))
    }

    /// Declares a string flag with its compiled-in default; see [`FlagString`].
    pub fn flag_string(&self, key: &str, default: impl Into<String>) -> FlagString {
        let default = default.into();
        self.declare(|s, ctx| s.flags.declare_string(key, default, ctx))
    }

    /// Declares a JSON flag with its compiled-in default; see [`FlagJson`].
    pub fn flag_json(&self, key: &str, default: serde_json::Value) -> FlagJson {
        self.declare(|s, ctx| s.flags.declare_json(key, default, ctx))
    }

    /// The handle of a product feature of the degradation matrix (see [`crate::feature`]);
    /// handles of the same name share state. Keep it; do not look it up per request.
    pub fn feature(&self, name: &str) -> crate::feature::Feature {
        self.inner.shared.feature_handle(name)
    }

    /// The service's inbound admission engine (see [`crate::admission`]): one per agent,
    /// created on first use (its queue task runs on the runtime the agent was built on),
    /// following this agent's policy (`inbound`) and read-only flag, and reported in the
    /// agent's status report.
    pub fn admission(&self) -> crate::admission::Admission {
        self.inner
            .admission
            .get_or_init(|| {
                let a =
                    crate::admission::Admission::for_agent(self.inner.shared.clone(), &self.inner.runtime);
                self.add_status_contributor(a.contributor());
                a
            })
            .clone()
    }

    /// A tower layer admitting every inbound request through [`admission`](Self::admission)
    /// (axum: `Router::layer`; tonic: `Server::builder().layer`); it also installs the
    /// request context, so it replaces [`inbound_layer`](Self::inbound_layer).
    pub fn admission_layer(&self) -> crate::admission::AdmissionLayer {
        self.admission().layer()
    }

    /// The handle of an outgoing dependency; handles of the same name share state.
    pub fn dependency(&self, name: &str) -> Dependency {
        self.inner.shared.dependency_handle(name)
    }

    /// Adds a contributor to the periodic status report (breakers, features, bulkheads).
    pub fn add_status_contributor(&self, contributor: Arc<dyn StatusContributor>) {
        self.inner.shared.add_contributor(contributor);
    }

    /// The id this process announces in `Hello`: its instance name (see
    /// [`AgentBuilder::instance_name`]), `-` and 8 random hex digits.
    pub fn instance_id(&self) -> &str {
        &self.inner.instance_id
    }

    /// The environment name given to [`Agent::builder`]; snapshots for another are
    /// rejected.
    pub fn environment(&self) -> &str {
        &self.inner.shared.environment
    }

    /// The service name given to [`Agent::builder`]: the one service whose snapshots this
    /// agent follows.
    pub fn service(&self) -> &str {
        &self.inner.shared.service
    }

    pub(crate) fn shared(&self) -> &Arc<Shared> {
        &self.inner.shared
    }

    /// Stops the sync and timer tasks and waits for them to end. The applied configuration
    /// and every handle keep working, frozen at their current values (expiry and stale
    /// timers stop too). Idempotent.
    pub async fn shutdown(&self) {
        self.inner.shutdown_tx.send_replace(true);
        let tasks = std::mem::take(&mut *self.inner.tasks.lock().await);
        for t in tasks {
            let _ = t.await;
        }
    }
}

#[cfg(test)]
mod instance_name_tests {
    use super::*;

    #[test]
    fn instance_ids_carry_a_clean_name_and_a_random_suffix() {
        assert_eq!(clean_instance_name("checkout-7f9c6d-x2kq\n").as_deref(), Some("checkout-7f9c6d-x2kq"));
        assert_eq!(clean_instance_name("a b\u{1b}[31m=\"x\"").as_deref(), Some("a_b__31m__x_"));
        assert_eq!(clean_instance_name("   "), None);
        assert_eq!(clean_instance_name(&"h".repeat(500)).unwrap().len(), MAX_INSTANCE_NAME_CHARS);
        let (a, b) = (instance_id("web-1"), instance_id("web-1"));
        assert!(a.starts_with("web-1-") && a.len() == "web-1-".len() + 8, "{a}");
        assert_ne!(a, b, "two processes on one host never share an id");
    }
}

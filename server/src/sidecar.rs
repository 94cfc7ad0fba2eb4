//! `levee sidecar`: the agent for services that cannot embed the crate. It syncs one
//! service like any agent (agent token, from a file it follows if given one; several
//! server addresses to fail over among; pushed snapshots with ACK/NACK, the disk cache,
//! defaults from a manifest file), shows in the fleet view as `<host>-sidecar`, and serves
//! the flags of its applied snapshot over OFREP on a loopback address
//! ([`api::sidecar_router`](crate::api::sidecar_router)). With the server away it answers
//! from what it applied, and after its own restart from its disk cache.

use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::Context as _;
use levee_agent::Agent;
use levee_agent::policy::ServiceConfig;

/// Default OFREP listener: the port OFREP providers use when given no base URL.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:8016";

/// Settings of `levee sidecar`.
#[derive(Clone, clap::Args)]
pub struct SidecarArgs {
    /// The server's agent sync address, e.g. `http://levee.internal:8081`. Several (the flag
    /// repeated, or a comma-separated list) are tried in turn: after an attempt that fails
    /// before any message, or a replica that says it is stopping, the next attempt goes to
    /// the next address, and the sidecar stays on the one that answers.
    #[arg(long = "server", value_name = "URL", env = "LEVEE_SYNC_URL", value_delimiter = ',', required = true,
          value_parser = address)]
    pub servers: Vec<String>,
    /// An agent token scoped to the environment and the service. This or `--token-file` is
    /// required.
    #[arg(long, env = "LEVEE_AGENT_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// A file holding the agent token (a mounted secret), instead of `--token`: read now,
    /// again before every connection, and every 5 s while the server refuses the token in
    /// use, so a rotated token written there (`levee tokens rotate`) is used without a
    /// restart.
    #[arg(long, env = "LEVEE_AGENT_TOKEN_FILE")]
    pub token_file: Option<PathBuf>,
    /// The environment to follow.
    #[arg(long, env = "LEVEE_ENVIRONMENT")]
    pub environment: String,
    /// The service to follow.
    #[arg(long, env = "LEVEE_SERVICE")]
    pub service: String,
    /// Where OFREP is served: a loopback address (there is no token on it).
    #[arg(long, env = "LEVEE_SIDECAR_LISTEN", default_value = DEFAULT_LISTEN)]
    pub listen: SocketAddr,
    /// Directory of the disk cache; without one, a restart during an outage starts from
    /// the defaults.
    #[arg(long, env = "LEVEE_CACHE_DIR")]
    pub cache_dir: Option<PathBuf>,
    /// A manifest (`levee/v1`, YAML or JSON) whose document for this environment and
    /// service gives the defaults used before the first snapshot and without a cache.
    #[arg(long, env = "LEVEE_SIDECAR_DEFAULTS")]
    pub defaults: Option<PathBuf>,
    /// A PEM CA certificate for a server that speaks TLS.
    #[arg(long, env = "LEVEE_TLS_CA")]
    pub tls_ca: Option<PathBuf>,
    /// The name shown in the fleet view (default: `$POD_NAME` or `$HOSTNAME`, then
    /// `-sidecar`).
    #[arg(long, env = "LEVEE_INSTANCE_NAME")]
    pub instance_name: Option<String>,
}

impl std::fmt::Debug for SidecarArgs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SidecarArgs")
            .field("servers", &self.servers)
            .field("token", &self.token.as_ref().map(|_| "<redacted>"))
            .field("token_file", &self.token_file)
            .field("environment", &self.environment)
            .field("service", &self.service)
            .field("listen", &self.listen)
            .field("cache_dir", &self.cache_dir)
            .field("defaults", &self.defaults)
            .finish_non_exhaustive()
    }
}

/// A running sidecar.
#[derive(Debug)]
pub struct Sidecar {
    /// The address OFREP is served on.
    pub addr: SocketAddr,
    /// The agent whose snapshot it serves.
    pub agent: Agent,
    stop: tokio::sync::watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
}

impl Sidecar {
    /// Starts the agent (cache or defaults at once, never waiting for the server) and the
    /// OFREP listener.
    ///
    /// # Errors
    /// A listen address that is not loopback, no token or two (`--token` and
    /// `--token-file`), a token file that does not read, a server address the agent refuses,
    /// a defaults file that does not read or has no document for the service, a CA file
    /// that does not read, an address in use.
    pub async fn start(args: SidecarArgs) -> anyhow::Result<Sidecar> {
        if !args.listen.ip().is_loopback() {
            anyhow::bail!(
                "--listen {}: the sidecar serves flags without a token, so it listens on a loopback \
                 address only (127.0.0.1 or ::1)",
                args.listen
            );
        }
        let name = args.instance_name.clone().unwrap_or_else(|| {
            let host = std::env::var("POD_NAME").or_else(|_| std::env::var("HOSTNAME")).unwrap_or_default();
            if host.is_empty() { "sidecar".to_string() } else { format!("{host}-sidecar") }
        });
        // The agent's own settings, not a copy: its builder checks the addresses and reads
        // the token file, and its sync task fails over and follows the file.
        let (first, others) = args.servers.split_first().context("--server: give at least one address")?;
        let token = match (&args.token, &args.token_file) {
            (Some(token), None) => token.as_str(),
            (None, Some(_)) => "",
            (Some(_), Some(_)) => anyhow::bail!(
                "--token (LEVEE_AGENT_TOKEN) and --token-file (LEVEE_AGENT_TOKEN_FILE) are both set: give one"
            ),
            (None, None) => anyhow::bail!(
                "give the agent token: --token (LEVEE_AGENT_TOKEN) or --token-file (LEVEE_AGENT_TOKEN_FILE)"
            ),
        };
        let mut builder = Agent::builder(first, token, &args.environment, &args.service).instance_name(name);
        for server in others {
            builder = builder.fallback_server(server);
        }
        if let Some(path) = &args.token_file {
            builder = builder.token_file(path);
        }
        if let Some(dir) = &args.cache_dir {
            builder = builder.cache_dir(dir);
        }
        if let Some(path) = &args.defaults {
            builder = builder.defaults(defaults(path, &args.environment, &args.service)?);
        }
        if let Some(path) = &args.tls_ca {
            let pem = std::fs::read(path).with_context(|| format!("reading --tls-ca {}", path.display()))?;
            builder = builder.tls_ca_pem(pem);
        }
        let agent = builder.build().context("starting the agent")?;
        let listener = tokio::net::TcpListener::bind(args.listen)
            .await
            .with_context(|| format!("listening on {}", args.listen))?;
        let addr = listener.local_addr()?;
        let (stop, mut stopped) = tokio::sync::watch::channel(false);
        let app = crate::api::sidecar_router(agent.clone());
        let task = tokio::spawn(async move {
            let serve = axum::serve(listener, app).with_graceful_shutdown(async move {
                let _ = stopped.wait_for(|s| *s).await;
            });
            if let Err(e) = serve.await {
                tracing::error!(error = %e, "the sidecar's OFREP listener failed");
            }
        });
        Ok(Sidecar { addr, agent, stop, task })
    }

    /// Stops the listener and the agent's tasks.
    pub async fn shutdown(self) {
        self.stop.send_replace(true);
        let _ = self.task.await;
        self.agent.shutdown().await;
    }
}

/// One `--server` address without surrounding blanks (`a, b` in `LEVEE_SYNC_URL` reads as
/// two addresses); its form is checked by the agent's builder.
fn address(text: &str) -> Result<String, String> {
    let text = text.trim();
    if text.is_empty() {
        return Err("an empty address (write e.g. http://levee.internal:8081)".to_string());
    }
    Ok(text.to_string())
}

/// The defaults of `environment`/`service` in the manifest file at `path`.
fn defaults(path: &std::path::Path, environment: &str, service: &str) -> anyhow::Result<ServiceConfig> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading --defaults {}", path.display()))?;
    let manifests =
        crate::manifest::parse(&path.display().to_string(), &text).map_err(|e| anyhow::anyhow!("{e}"))?;
    manifests
        .iter()
        .find(|m| m.environment == environment && m.service == service)
        .map(|m| m.to_config())
        .ok_or_else(|| {
            anyhow::anyhow!("--defaults {}: no document for {environment}/{service}", path.display())
        })
}

/// `levee sidecar`: runs until SIGINT or SIGTERM.
///
/// # Errors
/// As [`Sidecar::start`].
pub async fn run(args: SidecarArgs, stop: impl std::future::Future<Output = ()>) -> anyhow::Result<()> {
    let (env, svc) = (args.environment.clone(), args.service.clone());
    let sidecar = Sidecar::start(args).await?;
    println!("levee sidecar listening: http://{} (OFREP, {env}/{svc})", sidecar.addr);
    tracing::info!(addr = %sidecar.addr, environment = %env, service = %svc, "levee sidecar started");
    stop.await;
    sidecar.shutdown().await;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser as _;

    #[derive(clap::Parser)]
    struct Cli {
        #[command(flatten)]
        args: SidecarArgs,
    }

    fn parse(args: &[&str]) -> Result<SidecarArgs, clap::Error> {
        let base = ["levee-sidecar", "--environment", "prod", "--service", "checkout"];
        Cli::try_parse_from(base.iter().chain(args)).map(|c| c.args)
    }

    #[test]
    fn several_server_addresses_repeated_or_comma_separated_keep_their_order() {
        let repeated =
            parse(&["--server", "http://a:8081", "--server", " http://b:8081", "--token", "t"]).unwrap();
        assert_eq!(repeated.servers, ["http://a:8081", "http://b:8081"]);
        let listed = parse(&["--server", "http://a:8081, http://b:8081", "--token", "t"]).unwrap();
        assert_eq!(listed.servers, repeated.servers);
        let e = parse(&["--server", "http://a:8081,,", "--token", "t"]).expect_err("an empty address");
        assert!(e.to_string().contains("empty address"), "{e}");
    }

    async fn start_error(args: SidecarArgs) -> String {
        let e = Sidecar::start(args).await.expect_err("refused at start");
        format!("{e:#}")
    }

    #[tokio::test]
    async fn the_token_comes_from_exactly_one_of_the_flag_and_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("missing-token");
        let neither = parse(&["--server", "http://127.0.0.1:9"]).unwrap();
        let e = start_error(neither.clone()).await;
        assert!(e.contains("--token (LEVEE_AGENT_TOKEN) or --token-file (LEVEE_AGENT_TOKEN_FILE)"), "{e}");
        let both =
            SidecarArgs { token: Some("t".into()), token_file: Some(missing.clone()), ..neither.clone() };
        let e = start_error(both).await;
        assert!(e.contains("both set: give one"), "{e}");
        // The agent's builder reads the file: one that does not read stops the start.
        let unreadable = SidecarArgs { token_file: Some(missing.clone()), ..neither };
        let e = start_error(unreadable).await;
        assert!(e.contains("cannot read the agent token file") && e.contains("missing-token"), "{e}");
    }
}

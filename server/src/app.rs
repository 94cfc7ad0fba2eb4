//! The application: [`app`] builds the whole HTTP surface (API, UI, health, metrics) from
//! an [`AppState`], and [`Server`] starts everything around it (store, gRPC sync on its own
//! runtime, fleet writer, expiry sweeper, PostgreSQL listener) and stops it gracefully.

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::Context;
use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use rand::Rng;
use rand::distr::Alphanumeric;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_stream::wrappers::TcpListenerStream;
use tower_http::request_id::{MakeRequestUuid, PropagateRequestIdLayer, SetRequestIdLayer};

use crate::actions::{Actions, Actor, Reason, UserChange};
use crate::auth::{Keys, hash_password};
use crate::config::Settings;
use crate::db::{Backend, Role, Store};
use crate::fleet::FleetWriter;
use crate::hub::Hub;
use crate::shutdown::stopped;
use crate::sync::{SyncService, SyncSettings};
use crate::web::AppState;

/// The whole HTTP surface: the API under `/api/v1`, the UI, `/healthz`, `/readyz`,
/// `/readyz/agents` and `/metrics`, every response carrying an `x-request-id` (the caller's, or a new UUID).
/// Serving it needs nothing else running: tests call it with `tower::ServiceExt::oneshot`.
pub fn app(state: AppState) -> Router {
    surface(state, true)
}

/// [`app`], with `/metrics` or without it (when the operations address serves it).
fn surface(state: AppState, with_metrics: bool) -> Router {
    let probes = if with_metrics { ops(state.clone()) } else { probes(state.clone()) };
    crate::ui::router(state.clone())
        .merge(crate::api::router(state))
        .merge(probes)
        .layer(axum::middleware::from_fn(record_http))
        .layer(PropagateRequestIdLayer::x_request_id())
        .layer(SetRequestIdLayer::x_request_id(MakeRequestUuid))
}

/// `/healthz`, `/readyz` and `/readyz/agents`.
fn probes(state: AppState) -> Router {
    Router::new()
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/readyz/agents", get(readyz_agents))
        .with_state(state)
}

/// What the operations address serves (plain HTTP, `LEVEE_OPS_ADDR`): the probes and
/// `/metrics` (behind the metrics token when one is set).
pub fn ops(state: AppState) -> Router {
    probes(state.clone()).merge(Router::new().route("/metrics", get(metrics_text)).with_state(state))
}

/// Records each request's latency in `levee_server_http_request_duration_seconds` by route
/// template (never the raw path: the label set stays bounded), method and status.
async fn record_http(req: axum::extract::Request, next: axum::middleware::Next) -> Response {
    let route = req
        .extensions()
        .get::<axum::extract::MatchedPath>()
        .map(|p| p.as_str().to_owned())
        .unwrap_or_else(|| "unmatched".to_owned());
    let method: &'static str = match req.method().as_str() {
        "GET" => "GET",
        "POST" => "POST",
        "PUT" => "PUT",
        "PATCH" => "PATCH",
        "DELETE" => "DELETE",
        "HEAD" => "HEAD",
        "OPTIONS" => "OPTIONS",
        _ => "other",
    };
    let start = tokio::time::Instant::now();
    let res = next.run(req).await;
    metrics::histogram!(
        "levee_server_http_request_duration_seconds",
        "route" => route, "method" => method, "status" => res.status().as_u16().to_string()
    )
    .record(start.elapsed().as_secs_f64());
    res
}

/// The Prometheus recorder of the server, with histogram buckets (seconds) for every
/// `_seconds` series; `main` installs it, tests too.
pub fn prometheus_builder() -> metrics_exporter_prometheus::PrometheusBuilder {
    use metrics_exporter_prometheus::Matcher;
    const BUCKETS: [f64; 14] =
        [0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0];
    metrics_exporter_prometheus::PrometheusBuilder::new()
        .set_buckets_for_metric(Matcher::Suffix("_seconds".into()), &BUCKETS)
        .expect("buckets are not empty")
}

/// `GET /healthz`: the process is alive.
async fn healthz() -> &'static str {
    "ok"
}

/// Longest time `/readyz` waits for the database before answering 503.
pub const READYZ_TIMEOUT: Duration = Duration::from_secs(1);

/// `GET /readyz`: this replica can take writes — it is not stopping and the database
/// answers within [`READYZ_TIMEOUT`] (else 503 at once). For the API's load balancer.
async fn readyz(State(s): State<AppState>) -> Response {
    if crate::shutdown::is_stopped(&s.shutdown) {
        (StatusCode::SERVICE_UNAVAILABLE, "shutting down").into_response()
    } else if s.store.ping(READYZ_TIMEOUT).await {
        (StatusCode::OK, "ready").into_response()
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "database unreachable").into_response()
    }
}

/// `GET /readyz/agents`: this replica can serve agents — it is not stopping (every stored
/// snapshot was loaded into memory before it listened, and the listener keeps them
/// current). The database is not asked: while it is away a replica serves new agent
/// streams from memory, so the pod's readiness and the agents' load balancer use this one.
async fn readyz_agents(State(s): State<AppState>) -> Response {
    if crate::shutdown::is_stopped(&s.shutdown) {
        (StatusCode::SERVICE_UNAVAILABLE, "shutting down").into_response()
    } else {
        (StatusCode::OK, "ready to serve agents").into_response()
    }
}

/// `GET /metrics`: Prometheus text format (404 when this process has no exporter); with a
/// metrics token, 401 unless the request carries `Authorization: Bearer <token>`.
async fn metrics_text(State(s): State<AppState>, headers: axum::http::HeaderMap) -> Response {
    if let Some(token) = &s.metrics_token {
        let given = headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(crate::auth::bearer_token)
            .unwrap_or("");
        if !token.matches(given) {
            return (
                StatusCode::UNAUTHORIZED,
                [(header::WWW_AUTHENTICATE, "Bearer realm=\"levee metrics\"")],
                "a bearer token is needed for /metrics (LEVEE_METRICS_TOKEN)",
            )
                .into_response();
        }
    }
    match &s.metrics {
        Some(h) => ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], h.render()).into_response(),
        None => (StatusCode::NOT_FOUND, "metrics exporter not installed in this process").into_response(),
    }
}

/// A running server.
#[derive(Debug)]
pub struct Server {
    /// Bound HTTP address (API, UI, probes).
    pub http_addr: SocketAddr,
    /// Bound gRPC address (agent sync).
    pub grpc_addr: SocketAddr,
    /// Bound operations address (`/metrics`, probes), when one is set.
    pub ops_addr: Option<SocketAddr>,
    /// The admin password when it was generated by this start (print it once).
    pub generated_admin_password: Option<String>,
    /// The store the server runs on.
    pub store: Store,
    /// This replica's fan-out to its agent streams.
    pub hub: Hub,
    /// The domain actions of this replica (tests run due jobs with them explicitly).
    pub actions: crate::actions::Actions,
    /// Agents' health as this replica aggregates it, and the queries over it.
    pub health: crate::health::Health,
    /// This replica's experiments (tests start scheduled ones with them explicitly).
    pub experiments: crate::experiments::Experiments,
    shutdown: watch::Sender<bool>,
    tasks: Vec<JoinHandle<()>>,
    /// Where the gRPC streams run (`crate::runtime`); last, so it stops after the rest.
    sync_runtime: crate::runtime::SyncRuntime,
}

fn random_secret(len: usize) -> String {
    rand::rng().sample_iter(&Alphanumeric).take(len).map(char::from).collect()
}

/// Name of the file, in the data directory, that receives the generated password of the
/// first admin.
pub const INITIAL_ADMIN_PASSWORD_FILE: &str = "initial-admin-password";

/// Writes the first admin's generated `password` to [`INITIAL_ADMIN_PASSWORD_FILE`] in
/// `data_dir` (created 0700 when missing), readable by its owner only (0600), never over
/// an existing file. Returns the file's path.
///
/// # Errors
/// The directory or the file cannot be created, or the file exists already.
pub fn write_initial_admin_password(
    data_dir: &std::path::Path,
    password: &str,
) -> anyhow::Result<std::path::PathBuf> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    crate::db::private_dir(data_dir)?;
    let path = data_dir.join(INITIAL_ADMIN_PASSWORD_FILE);
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&path)
        .with_context(|| format!("creating {}", path.display()))?;
    writeln!(f, "{password}")
        .and_then(|()| f.sync_all())
        .with_context(|| format!("writing {}", path.display()))?;
    Ok(path)
}

/// The token keys of this server: the operator's secret (with the previous ones of a
/// rotation) when given — never written to the database — else the secret generated once
/// and stored there. Every replica and every local command (`levee users set`,
/// `levee tokens rotate`) gets the same keys from the same settings.
///
/// # Errors
/// The database failed, or a secret is shorter than 32 bytes.
pub async fn keys(store: &Store, settings: &Settings) -> anyhow::Result<Keys> {
    match &settings.jwt_secret {
        Some(s) => {
            let previous: Vec<&[u8]> =
                settings.jwt_previous_secrets.iter().map(|p| p.expose().as_bytes()).collect();
            Keys::rotated(s.expose().as_bytes(), &previous)
        }
        None => Keys::new(store.setting_or_init("jwt_secret", || random_secret(64)).await?.as_bytes()),
    }
}

/// Creates the bootstrap admin on the first start: with `password`, or a generated one that
/// is returned to be printed once. Once `admin` exists the password is left alone (so a
/// restart with `LEVEE_ADMIN_PASSWORD` never undoes `levee users set admin`), unless `reset`
/// asks for it: then it is set through the `user.update` action (audited, sessions ended).
async fn bootstrap_admin(
    store: &Store,
    actions: &Actions,
    password: Option<&str>,
    reset: bool,
) -> anyhow::Result<Option<String>> {
    match (store.user("admin").await?, password) {
        // Two replicas starting together on an empty database both see no admin; the
        // insert decides (the loser's row is not written), and only the winner's generated
        // password is handed back: it is the one stored.
        (None, Some(p)) => {
            if !store.create_user("admin", &hash_password(p.to_string()).await?, Role::Admin, None).await? {
                tracing::info!("user admin was created by another replica starting at the same time");
            }
            Ok(None)
        }
        (None, None) => {
            let p = random_secret(24);
            if store.create_user("admin", &hash_password(p.clone()).await?, Role::Admin, None).await? {
                Ok(Some(p))
            } else {
                tracing::info!("user admin was created by another replica starting at the same time");
                Ok(None)
            }
        }
        (Some(_), Some(p)) if reset => {
            let change = UserChange::new("admin", Some(p.to_string()), None, None)
                .map_err(|e| anyhow::anyhow!("LEVEE_ADMIN_PASSWORD: {e}"))?;
            let reason = Reason::parse("LEVEE_RESET_ADMIN_PASSWORD at server start")
                .map_err(|e| anyhow::anyhow!("{e}"))?;
            actions.update_user(&Actor::server(), &reason, change).await?;
            tracing::warn!(
                "admin password reset from LEVEE_ADMIN_PASSWORD; remove LEVEE_RESET_ADMIN_PASSWORD"
            );
            Ok(None)
        }
        (Some(_), Some(_)) => {
            tracing::info!(
                "user admin exists: LEVEE_ADMIN_PASSWORD is ignored (it only sets the first start's \
                 password; use `levee users set admin` or LEVEE_RESET_ADMIN_PASSWORD=true to change it)"
            );
            Ok(None)
        }
        (Some(_), None) if reset => anyhow::bail!("LEVEE_RESET_ADMIN_PASSWORD needs LEVEE_ADMIN_PASSWORD"),
        (Some(_), None) => Ok(None),
    }
}

impl Server {
    /// Starts everything and returns once both listeners are bound.
    ///
    /// # Errors
    /// Unreachable database, failed migration, or an address that cannot be bound.
    pub async fn start(
        settings: Settings,
        metrics: Option<metrics_exporter_prometheus::PrometheusHandle>,
    ) -> anyhow::Result<Server> {
        if settings.database_url.expose().starts_with("sqlite:") {
            crate::db::private_dir(&settings.data_dir)?;
        }
        let store = Store::connect(settings.database_url.expose()).await?;
        let keys = keys(&store, &settings).await?;
        let hub = Hub::default();
        let generated_admin_password = bootstrap_admin(
            &store,
            &Actions::new(store.clone(), hub.clone(), keys.clone()),
            settings.admin_password.as_ref().map(|s| s.expose()),
            settings.reset_admin_password,
        )
        .await?;
        if store.backend() == Backend::Sqlite {
            store.mark_all_disconnected().await?;
        }
        // Every stored snapshot in memory before the first agent can connect: from here on
        // a new agent stream is served even while the database is away (`/readyz/agents`).
        crate::listener::catch_up(&store, &hub).await.context("loading the stored snapshots")?;

        let (shutdown, shutdown_rx) = crate::shutdown::channel();
        let replica = format!("replica-{}", uuid::Uuid::new_v4().simple());
        tracing::info!(replica = %replica, "this replica's id in the agent leases");
        let (health, health_task) =
            crate::health::Health::spawn(store.clone(), &replica, shutdown_rx.clone());
        let (fleet, fleet_task) = FleetWriter::spawn(store.clone(), replica, settings.agent_lease);
        let mut tasks = vec![fleet_task, health_task];

        // Agent sync runs on threads of its own (`crate::runtime`): the services are built
        // here, so their database reads come back to this runtime.
        let sync_runtime = crate::runtime::SyncRuntime::new(settings.sync_threads)
            .context("starting the agent sync runtime")?;
        let sync = SyncService::new(
            store.clone(),
            keys.clone(),
            hub.clone(),
            fleet.clone(),
            health.clone(),
            SyncSettings {
                heartbeat_interval: settings.heartbeat_interval,
                max_stream_age: settings.max_stream_age,
                new_streams_per_sec: settings.new_streams_per_sec,
                ..SyncSettings::default()
            },
            shutdown_rx.clone(),
        );
        // The outbound policy over xDS, on the same port as agent sync.
        let xds = crate::xds::XdsService::new(
            store.clone(),
            keys.clone(),
            hub.clone(),
            settings.xds_endpoints.clone(),
            shutdown_rx.clone(),
        );
        let grpc_listener = TcpListener::bind(settings.grpc_addr)
            .await
            .with_context(|| format!("binding the gRPC address {}", settings.grpc_addr))?;
        let grpc_addr = grpc_listener.local_addr()?;
        // Bound here so a taken address fails the start; registered again on the sync
        // runtime, which accepts the connections and so drives their sockets.
        let grpc_listener = grpc_listener.into_std()?;
        let tls = match &settings.tls {
            Some(files) => {
                let cert = crate::tls::ReloadingCert::new(files.clone())?;
                tasks.push(tokio::spawn(crate::tls::watch(cert.clone(), shutdown_rx.clone())));
                Some(cert)
            }
            None => None,
        };
        let mut grpc_shutdown = shutdown_rx.clone();
        let grpc_tls = tls.as_ref().map(|c| c.server_config(&[b"h2"]));
        tasks.push(sync_runtime.handle().spawn(async move {
            let grpc_listener = match TcpListener::from_std(grpc_listener) {
                Ok(l) => l,
                Err(e) => {
                    tracing::error!(error = %e, "gRPC listener");
                    return;
                }
            };
            let server = tonic::transport::Server::builder()
                .tcp_nodelay(true)
                .tcp_keepalive(Some(Duration::from_secs(60)))
                .http2_keepalive_interval(Some(Duration::from_secs(30)))
                .http2_keepalive_timeout(Some(Duration::from_secs(10)))
                .add_service(sync.into_server())
                .add_service(xds.into_server());
            let stop = async move {
                stopped(&mut grpc_shutdown).await;
                // Let sessions send GoAway before the transport closes.
                tokio::time::sleep(Duration::from_millis(100)).await;
            };
            let res = match grpc_tls {
                Some(cfg) => match crate::tls::TlsListener::new(grpc_listener, cfg) {
                    Ok(tls) => server.serve_with_incoming_shutdown(tls.into_stream(), stop).await,
                    Err(e) => {
                        tracing::error!(error = %e, "gRPC TLS listener");
                        return;
                    }
                },
                None => {
                    server.serve_with_incoming_shutdown(TcpListenerStream::new(grpc_listener), stop).await
                }
            };
            if let Err(e) = res {
                tracing::error!(error = ?e, "gRPC server stopped");
            }
        }));

        let mut state = AppState::new(store.clone(), keys, hub.clone(), settings.max_body_bytes, metrics);
        state.trusted_proxies = settings.trusted_proxies.clone().into();
        state.shutdown = shutdown_rx.clone();
        state.health = health.clone();
        state.experiments = crate::experiments::Experiments::new(
            store.clone(),
            state.actions.clone(),
            health.clone(),
            shutdown_rx.clone(),
        );
        let experiments = state.experiments.clone();
        tasks.push(tokio::spawn(experiments.clone().watchdog()));
        state.metrics_token =
            settings.metrics_token.as_ref().map(|t| crate::web::MetricsToken::new(t.expose()));
        let actions = state.actions.clone();
        let ops_addr = match settings.ops_addr {
            Some(addr) => {
                let listener = TcpListener::bind(addr)
                    .await
                    .with_context(|| format!("binding the operations address {addr}"))?;
                let bound = listener.local_addr()?;
                let mut stop = shutdown_rx.clone();
                let service = ops(state.clone()).into_make_service();
                tasks.push(tokio::spawn(async move {
                    let res = axum::serve(listener, service)
                        .with_graceful_shutdown(async move { stopped(&mut stop).await })
                        .await;
                    if let Err(e) = res {
                        tracing::error!(error = ?e, "operations server stopped");
                    }
                }));
                Some(bound)
            }
            None => None,
        };
        let app = surface(state, ops_addr.is_none());
        let http_listener = TcpListener::bind(settings.http_addr)
            .await
            .with_context(|| format!("binding the HTTP address {}", settings.http_addr))?;
        let http_addr = http_listener.local_addr()?;
        let mut http_shutdown = shutdown_rx.clone();
        let stop = async move { stopped(&mut http_shutdown).await };
        match tls.as_ref().map(|c| c.server_config(&[b"h2", b"http/1.1"])) {
            Some(cfg) => {
                let listener = crate::tls::TlsListener::new(http_listener, cfg)?;
                let service = crate::tls::with_socket_addr(app.layer(axum::Extension(crate::web::OverTls)))
                    .into_make_service_with_connect_info::<crate::tls::PeerAddr>();
                tasks.push(tokio::spawn(async move {
                    let res = axum::serve(listener, service).with_graceful_shutdown(stop).await;
                    if let Err(e) = res {
                        tracing::error!(error = ?e, "HTTPS server stopped");
                    }
                }));
            }
            None => tasks.push(tokio::spawn(async move {
                let service = app.into_make_service_with_connect_info::<SocketAddr>();
                let res = axum::serve(http_listener, service).with_graceful_shutdown(stop).await;
                if let Err(e) = res {
                    tracing::error!(error = ?e, "HTTP server stopped");
                }
            })),
        }

        tasks.push(tokio::spawn(crate::sweeper::run(
            actions.clone(),
            health.clone(),
            store.clone(),
            settings.alert_webhook_url.as_ref().map(|u| u.expose().to_string()),
            settings.rollout_interval,
            shutdown_rx.clone(),
        )));
        tasks.push(tokio::spawn(crate::listener::follow_revocations(
            store.clone(),
            hub.clone(),
            shutdown_rx.clone(),
        )));
        tasks.push(tokio::spawn(crate::alerts::run(
            store.clone(),
            settings.alert_webhook_url.as_ref().map(|u| u.expose().to_string()),
            shutdown_rx.clone(),
        )));
        if store.backend() == Backend::Postgres {
            tasks.push(tokio::spawn(crate::listener::run(
                settings.database_url.expose().to_string(),
                store.clone(),
                hub.clone(),
                shutdown_rx.clone(),
            )));
        }

        Ok(Server {
            http_addr,
            grpc_addr,
            ops_addr,
            generated_admin_password,
            store,
            hub,
            actions,
            health,
            experiments,
            shutdown,
            tasks,
            sync_runtime,
        })
    }

    /// The runtime the agent streams run on (tests block it to show the API does not
    /// depend on it).
    pub fn sync_runtime(&self) -> &tokio::runtime::Handle {
        self.sync_runtime.handle()
    }

    /// Stops gracefully: agents are told to reconnect elsewhere, HTTP drains.
    pub async fn shutdown(self) {
        let _ = self.shutdown.send(true);
        for t in self.tasks {
            let _ = tokio::time::timeout(Duration::from_secs(5), t).await;
        }
        self.store.close().await;
    }
}

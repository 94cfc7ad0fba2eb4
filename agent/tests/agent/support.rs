//! A scripted in-process Levee sync server on 127.0.0.1, speaking the real protocol over
//! real TCP, and helpers to drive an agent against it.

use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use levee_agent::policy::{SCHEMA_VERSION, content_hash};
use levee_agent::proto::levee_sync_server::{LeveeSync, LeveeSyncServer};
use levee_agent::proto::{
    AgentMessage, Heartbeat, Hello, ServerMessage, ServiceRevision, Snapshot, StatusReport, agent_message,
    server_message,
};
use levee_agent::{Agent, SyncClientSettings};
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;
use tokio_stream::wrappers::{ReceiverStream, TcpListenerStream};
use tokio_stream::{Stream, StreamExt};
use tonic::{Request, Response, Status, Streaming};

pub const ENV: &str = "prod";
pub const SERVICE: &str = "checkout";
pub const TOKEN: &str = "test-token";

/// What the server saw.
#[derive(Debug)]
pub enum Event {
    /// A stream opened and sent its Hello; `conn` pushes messages to that agent.
    Connected {
        hello: Hello,
        at: Instant,
        conn: Conn,
    },
    /// A stream was refused for its token.
    Refused {
        at: Instant,
    },
    /// A stream was answered UNAVAILABLE (overload mode).
    Unavailable {
        at: Instant,
    },
    Ack {
        revision: u64,
        nonce: u64,
    },
    Nack {
        revision: u64,
        nonce: u64,
        detail: String,
    },
    Status(StatusReport),
    /// The agent's side of a stream ended.
    Closed,
}

/// The server side of one agent stream.
#[derive(Debug, Clone)]
pub struct Conn {
    tx: mpsc::Sender<Result<ServerMessage, Status>>,
    nonce: Arc<AtomicUsize>,
}

impl Conn {
    pub async fn send(&self, kind: server_message::Kind) {
        self.tx.send(Ok(ServerMessage { kind: Some(kind) })).await.expect("agent stream open");
    }

    /// Pushes a snapshot with a correct hash; returns its nonce.
    pub async fn snapshot(&self, revision: u64, body: &str) -> u64 {
        let snap = snapshot(revision, body);
        self.snapshot_raw(snap).await
    }

    /// Pushes a snapshot as given (its nonce is set here); returns the nonce.
    pub async fn snapshot_raw(&self, mut snap: Snapshot) -> u64 {
        let nonce = self.nonce.fetch_add(1, Ordering::SeqCst) as u64 + 1;
        snap.nonce = nonce;
        self.send(server_message::Kind::Snapshot(snap)).await;
        nonce
    }

    /// Ends the stream with `status`, as the server ends a revoked token's stream.
    pub async fn end(&self, status: Status) {
        self.tx.send(Err(status)).await.expect("agent stream open");
    }

    pub async fn heartbeat(&self, revision: u64, interval: Duration) {
        self.send(server_message::Kind::Heartbeat(Heartbeat {
            services: vec![ServiceRevision { service: SERVICE.into(), revision }],
            interval_ms: interval.as_millis() as u64,
        }))
        .await;
    }
}

pub fn snapshot(revision: u64, body: &str) -> Snapshot {
    Snapshot {
        service: SERVICE.into(),
        revision,
        hash: content_hash(body.as_bytes()),
        body: body.as_bytes().to_vec().into(),
        nonce: 0,
        schema_version: SCHEMA_VERSION,
        environment: ENV.into(),
        created_at_ms: 0,
    }
}

#[derive(Clone)]
struct Sync {
    events: mpsc::UnboundedSender<Event>,
    refuse: Arc<AtomicBool>,
    unavailable: Arc<AtomicBool>,
    /// The tokens accepted (at first [`TOKEN`] alone).
    tokens: Arc<arc_swap::ArcSwap<Vec<String>>>,
}

type Outbound = Pin<Box<dyn Stream<Item = Result<ServerMessage, Status>> + Send>>;

#[tonic::async_trait]
impl LeveeSync for Sync {
    type SyncStream = Outbound;

    async fn sync(&self, request: Request<Streaming<AgentMessage>>) -> Result<Response<Outbound>, Status> {
        let auth = request.metadata().get("authorization").and_then(|v| v.to_str().ok()).map(str::to_string);
        let known = auth
            .as_deref()
            .and_then(|a| a.strip_prefix("Bearer "))
            .is_some_and(|t| self.tokens.load().iter().any(|k| k == t));
        if self.refuse.load(Ordering::SeqCst) || !known {
            let _ = self.events.send(Event::Refused { at: Instant::now() });
            return Err(Status::unauthenticated("token revoked"));
        }
        if self.unavailable.load(Ordering::SeqCst) {
            let _ = self.events.send(Event::Unavailable { at: Instant::now() });
            return Err(Status::unavailable("too many new streams"));
        }
        let (tx, rx) = mpsc::channel(64);
        let conn = Conn { tx, nonce: Arc::new(AtomicUsize::new(0)) };
        let events = self.events.clone();
        let mut inbound = request.into_inner();
        tokio::spawn(async move {
            let mut conn = Some(conn);
            while let Ok(Some(m)) = inbound.message().await {
                let event = match m.kind {
                    Some(agent_message::Kind::Hello(hello)) => match conn.take() {
                        Some(conn) => Event::Connected { hello, at: Instant::now(), conn },
                        None => panic!("second Hello on one stream"),
                    },
                    Some(agent_message::Kind::Ack(a)) => Event::Ack { revision: a.revision, nonce: a.nonce },
                    Some(agent_message::Kind::Nack(n)) => {
                        Event::Nack { revision: n.revision, nonce: n.nonce, detail: n.error_detail }
                    }
                    Some(agent_message::Kind::Status(s)) => Event::Status(s),
                    None => continue,
                };
                let _ = events.send(event);
            }
            let _ = events.send(Event::Closed);
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }
}

/// A running test server.
pub struct TestServer {
    pub addr: SocketAddr,
    pub events: mpsc::UnboundedReceiver<Event>,
    refuse: Arc<AtomicBool>,
    unavailable: Arc<AtomicBool>,
    tokens: Arc<arc_swap::ArcSwap<Vec<String>>>,
    stop: Option<oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl TestServer {
    /// Starts on a free port.
    pub async fn start() -> Self {
        Self::start_on("127.0.0.1:0".parse().unwrap()).await
    }

    /// Starts on `addr` (to bring a server "back" on the same port).
    pub async fn start_on(addr: SocketAddr) -> Self {
        clock_granularity();
        let listener = tokio::net::TcpListener::bind(addr).await.expect("bind");
        let addr = listener.local_addr().unwrap();
        let (events_tx, events) = mpsc::unbounded_channel();
        let refuse = Arc::new(AtomicBool::new(false));
        let unavailable = Arc::new(AtomicBool::new(false));
        let tokens = Arc::new(arc_swap::ArcSwap::from_pointee(vec![TOKEN.to_string()]));
        let svc = Sync {
            events: events_tx,
            refuse: refuse.clone(),
            unavailable: unavailable.clone(),
            tokens: tokens.clone(),
        };
        let (stop_tx, stop_rx) = oneshot::channel::<()>();
        // No Nagle: a write held back for a delayed ACK waits in *real* time, which the
        // ticking virtual clock would turn into seconds.
        let incoming = TcpListenerStream::new(listener).map(|s| {
            let s = s?;
            s.set_nodelay(true)?;
            Ok::<_, std::io::Error>(s)
        });
        let task = tokio::spawn(async move {
            tonic::transport::Server::builder()
                // CP-10: accept the agents' keepalive pings.
                .http2_keepalive_interval(None)
                .add_service(LeveeSyncServer::new(svc))
                .serve_with_incoming_shutdown(incoming, async {
                    let _ = stop_rx.await;
                })
                .await
                .expect("test server");
        });
        Self { addr, events, refuse, unavailable, tokens, stop: Some(stop_tx), task: Some(task) }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Refuse every new stream with UNAUTHENTICATED.
    pub fn refuse_all(&self) {
        self.refuse.store(true, Ordering::SeqCst);
    }

    /// Accept exactly these tokens on new streams (streams already open stay).
    pub fn accept_tokens(&self, tokens: &[&str]) {
        self.tokens.store(Arc::new(tokens.iter().map(|t| t.to_string()).collect()));
    }

    /// Answer every new stream with UNAVAILABLE (before any message).
    pub fn unavailable(&self, on: bool) {
        self.unavailable.store(on, Ordering::SeqCst);
    }

    /// The next event, or a panic naming what was awaited (bounded in virtual time).
    pub async fn next(&mut self, what: &str) -> Event {
        match tokio::time::timeout(Duration::from_secs(3600), self.events.recv()).await {
            Ok(Some(e)) => e,
            Ok(None) => panic!("server gone while waiting for {what}"),
            Err(_) => panic!("no event within an hour while waiting for {what}"),
        }
    }

    /// Skips status reports and closes; returns the next other event.
    pub async fn next_significant(&mut self, what: &str) -> Event {
        loop {
            match self.next(what).await {
                Event::Status(_) | Event::Closed => continue,
                e => return e,
            }
        }
    }

    pub async fn connected(&mut self) -> (Hello, Instant, Conn) {
        match self.next_significant("a connection").await {
            Event::Connected { hello, at, conn } => (hello, at, conn),
            other => panic!("expected a connection, got {other:?}"),
        }
    }

    pub async fn ack(&mut self) -> (u64, u64) {
        match self.next_significant("an ACK").await {
            Event::Ack { revision, nonce } => (revision, nonce),
            other => panic!("expected an ACK, got {other:?}"),
        }
    }

    pub async fn nack(&mut self) -> (u64, u64, String) {
        match self.next_significant("a NACK").await {
            Event::Nack { revision, nonce, detail } => (revision, nonce, detail),
            other => panic!("expected a NACK, got {other:?}"),
        }
    }

    /// Every event already queued, without waiting.
    pub fn drain(&mut self) -> Vec<Event> {
        let mut out = Vec::new();
        while let Ok(e) = self.events.try_recv() {
            out.push(e);
        }
        out
    }

    pub async fn stop(mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        if let Some(t) = self.task.take() {
            t.abort();
            let _ = t.await;
        }
    }
}

/// An address with nothing listening (connections are refused).
pub async fn dead_address() -> SocketAddr {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    l.local_addr().unwrap()
}

/// Settings for tests: the defaults (tests assert the real timings).
pub fn settings() -> SyncClientSettings {
    SyncClientSettings::default()
}

pub fn agent(url: &str, cache: &std::path::Path) -> Agent {
    Agent::builder(url, TOKEN, ENV, SERVICE)
        .cache_dir(cache)
        .sync_settings(settings())
        .build()
        .expect("agent builds")
}

/// Virtual-clock granularity for tests over real sockets.
///
/// With a paused clock, tokio advances time whenever the runtime is idle — also while it
/// waits for socket I/O — straight to the next pending timer, so one loopback round trip
/// could "take" as long as the nearest timeout (seconds). A task that always has a timer
/// [`TICK`] ahead bounds every such jump to one tick, so protocol timings measured on the
/// virtual clock are exact to within a few ticks. Every test server starts one.
pub fn clock_granularity() {
    tokio::spawn(async {
        loop {
            tokio::time::sleep(TICK).await;
        }
    });
}

/// Largest virtual-time step while tests wait on sockets.
pub const TICK: Duration = Duration::from_millis(10);

/// Lets spawned tasks run without moving the clock much.
pub async fn settle() {
    for _ in 0..20 {
        tokio::task::yield_now().await;
    }
}

/// Silences nothing unless TEST_LOG is set.
pub fn init_tracing() {
    if std::env::var_os("TEST_LOG").is_some() {
        let _ = tracing_subscriber::fmt().with_env_filter("levee_agent=debug").with_test_writer().try_init();
    }
}

pub const RULES: &str = r#"{
  "policy": {"dependencies": {
    "recommendations": {"criticality": "non_critical", "enabled_flag": "recommendations.enabled",
                        "attempt_timeout": "250ms", "fallback": "generic"}
  }},
  "flags": {
    "recommendations.enabled": {"type": "bool", "value": false},
    "search.max_results": {"type": "int", "value": 20}
  }
}"#;

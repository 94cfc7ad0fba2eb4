//! The agent sync service (`levee.sync.v1.LeveeSync/Sync`).
//!
//! One bidirectional stream per agent process. The agent says `Hello` with what it has
//! applied; the server sends a full snapshot only for services where it has something
//! newer, then pushes each new revision as it is committed. The agent ACKs or NACKs per
//! revision; a NACKed revision is recorded (visible in the API) and never resent to that
//! agent. Heartbeats every ~15 s (jittered) let the agent detect a silently dead stream;
//! a jittered maximum stream age makes agents rebalance across replicas; new streams per
//! second are bounded so a mass reconnect cannot overwhelm the server.

use std::collections::{HashMap, HashSet};
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use futures::Stream;
use levee_agent::policy::SCHEMA_VERSION;
use levee_agent::proto::levee_sync_server::{LeveeSync, LeveeSyncServer};
use levee_agent::proto::{
    AgentMessage, GoAway, Heartbeat, ServerMessage, ServiceRevision, Snapshot, agent_message, server_message,
};
use rand::Rng;
use tokio::sync::{mpsc, watch};
use tokio_stream::StreamExt;
use tokio_stream::wrappers::{ReceiverStream, WatchStream};
use tonic::{Request, Response, Status, Streaming};

use crate::agent_text;
use crate::auth::{AgentPrincipal, AuthError, Keys, authenticate_agent};
use crate::db::{AckRow, AgentUpsert, DISCONNECTED_SOURCE, FleetEvent, NackRow, SnapshotRow, Store, now_ms};
use crate::fleet::FleetWriter;
use crate::hub::Hub;

/// Tunables of the sync service; defaults are the named constants below.
#[derive(Clone, Debug)]
pub struct SyncSettings {
    /// Mean heartbeat interval (jittered ±20 %).
    pub heartbeat_interval: Duration,
    /// Mean maximum stream age before a `GoAway` (jittered ±10 %).
    pub max_stream_age: Duration,
    /// New streams accepted per second (token bucket, burst = rate).
    pub new_streams_per_sec: u32,
    /// How long the server waits for `Hello`.
    pub hello_timeout: Duration,
}

/// Default heartbeat interval.
pub const HEARTBEAT_INTERVAL: Duration = Duration::from_secs(15);
/// Default maximum stream age.
pub const MAX_STREAM_AGE: Duration = Duration::from_secs(30 * 60);
/// Default bound on new streams per second. At 2,000 a restart re-admits 10,000 agents in
/// about 5 s of admission (13 s to all re-synced, measured: docs/benchmarks.md); at 500 the
/// admission alone took 20 s and the refused agents' backoff stretched it to 43 s.
pub const NEW_STREAMS_PER_SEC: u32 = 2_000;
/// Default wait for `Hello`.
pub const HELLO_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a verified agent token is trusted from memory while the database cannot be
/// read (a token revoked meanwhile could only have been revoked while it was reachable,
/// and a stream it opened ends at its maximum age).
pub const VERIFIED_TOKEN_TTL: Duration = Duration::from_secs(15 * 60);
/// Most tokens remembered as verified (past it the oldest half is forgotten).
pub const VERIFIED_TOKENS_MAX: usize = 100_000;
/// At most one log line per refusal reason per this interval (the others are counted in
/// `levee_server_streams_refused_total` and summed into the next line).
pub const REFUSAL_LOG_INTERVAL: Duration = Duration::from_secs(10);

impl Default for SyncSettings {
    fn default() -> Self {
        SyncSettings {
            heartbeat_interval: HEARTBEAT_INTERVAL,
            max_stream_age: MAX_STREAM_AGE,
            new_streams_per_sec: NEW_STREAMS_PER_SEC,
            hello_timeout: HELLO_TIMEOUT,
        }
    }
}

/// Token bucket bounding new streams per second.
#[derive(Debug)]
struct StreamLimiter {
    rate: f64,
    state: tokio::sync::Mutex<(f64, tokio::time::Instant)>,
}

impl StreamLimiter {
    fn new(rate: u32) -> Self {
        let rate = f64::from(rate.max(1));
        StreamLimiter { rate, state: tokio::sync::Mutex::new((rate, tokio::time::Instant::now())) }
    }

    async fn try_take(&self) -> bool {
        let mut s = self.state.lock().await;
        let now = tokio::time::Instant::now();
        let refill = now.duration_since(s.1).as_secs_f64() * self.rate;
        s.0 = (s.0 + refill).min(self.rate);
        s.1 = now;
        if s.0 >= 1.0 {
            s.0 -= 1.0;
            true
        } else {
            false
        }
    }
}

/// Agent tokens verified against the database recently: while it is away, a stream
/// presenting one of them is accepted from memory (its signature and expiry are still
/// checked) instead of being refused.
#[derive(Debug, Default)]
struct VerifiedTokens {
    map: tokio::sync::Mutex<HashMap<String, (AgentPrincipal, tokio::time::Instant)>>,
}

impl VerifiedTokens {
    async fn remember(&self, p: &AgentPrincipal) {
        let mut m = self.map.lock().await;
        if m.len() >= VERIFIED_TOKENS_MAX {
            let mut ages: Vec<_> = m.values().map(|(_, at)| *at).collect();
            ages.sort();
            let cut = ages[ages.len() / 2];
            m.retain(|_, (_, at)| *at > cut);
        }
        m.insert(p.jti.clone(), (p.clone(), tokio::time::Instant::now()));
    }

    async fn forget(&self, jti: &str) {
        self.map.lock().await.remove(jti);
    }

    async fn recent(&self, jti: &str) -> Option<AgentPrincipal> {
        let m = self.map.lock().await;
        m.get(jti).filter(|(_, at)| at.elapsed() < VERIFIED_TOKEN_TTL).map(|(p, _)| p.clone())
    }
}

/// Why a stream was refused, for the rate-limited log and the metric label.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Refusal {
    ShuttingDown,
    Rate,
    Unauthenticated,
    Unavailable,
    Hello,
    Scope,
}

impl Refusal {
    fn label(self) -> &'static str {
        match self {
            Refusal::ShuttingDown => "shutting_down",
            Refusal::Rate => "rate",
            Refusal::Unauthenticated => "unauthenticated",
            Refusal::Unavailable => "database_unavailable",
            Refusal::Hello => "bad_hello",
            Refusal::Scope => "scope",
        }
    }
}

/// Logs stream refusals, structured, at most once per reason per
/// [`REFUSAL_LOG_INTERVAL`] (a mass reconnect refused by the rate limit is one line every
/// few seconds with a count, not thousands).
#[derive(Debug, Default)]
struct RefusalLog {
    #[allow(clippy::disallowed_types)] // short critical section, never held across an await
    last: std::sync::Mutex<HashMap<Refusal, (tokio::time::Instant, u64)>>,
}

impl RefusalLog {
    /// Counts a refusal and logs it unless one of its reason was logged within the
    /// interval. Returns the number of refusals the line it wrote summed up, `None` when
    /// it wrote none.
    fn refused(&self, why: Refusal, status: &Status, peer: Option<std::net::SocketAddr>) -> Option<u64> {
        self.refused_at(tokio::time::Instant::now(), why, status, peer)
    }

    fn refused_at(
        &self,
        now: tokio::time::Instant,
        why: Refusal,
        status: &Status,
        peer: Option<std::net::SocketAddr>,
    ) -> Option<u64> {
        metrics::counter!("levee_server_streams_refused_total", "reason" => why.label()).increment(1);
        let suppressed = {
            let mut m = self.last.lock().unwrap_or_else(|e| e.into_inner());
            match m.get_mut(&why) {
                Some((at, n)) if now.duration_since(*at) < REFUSAL_LOG_INTERVAL => {
                    *n += 1;
                    return None;
                }
                Some((at, n)) => {
                    *at = now;
                    std::mem::take(n)
                }
                None => {
                    m.insert(why, (now, 0));
                    0
                }
            }
        };
        let peer = peer.map(|p| p.to_string()).unwrap_or_default();
        let code = format!("{:?}", status.code());
        match why {
            Refusal::Unavailable | Refusal::ShuttingDown | Refusal::Rate => tracing::warn!(
                reason = why.label(), code = %code, detail = %status.message(), peer = %peer,
                suppressed_since_last = suppressed, "agent stream refused"
            ),
            _ => tracing::info!(
                reason = why.label(), code = %code, detail = %status.message(), peer = %peer,
                suppressed_since_last = suppressed, "agent stream refused"
            ),
        }
        Some(suppressed)
    }
}

/// The `LeveeSync` gRPC service: one bidirectional stream per agent. Cheap to clone.
#[derive(Clone, Debug)]
pub struct SyncService {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    store: Store,
    keys: Keys,
    hub: Hub,
    fleet: FleetWriter,
    settings: SyncSettings,
    limiter: StreamLimiter,
    shutdown: watch::Receiver<bool>,
    streams: AtomicU64,
    verified: VerifiedTokens,
    refusals: RefusalLog,
}

impl SyncService {
    /// The service over `store`, authenticating agents with `keys`, pushing what `hub`
    /// publishes, recording agent state through `fleet`; its streams end (with `GoAway`)
    /// once `shutdown` is set.
    pub fn new(
        store: Store,
        keys: Keys,
        hub: Hub,
        fleet: FleetWriter,
        settings: SyncSettings,
        shutdown: watch::Receiver<bool>,
    ) -> Self {
        let limiter = StreamLimiter::new(settings.new_streams_per_sec);
        SyncService {
            inner: Arc::new(Inner {
                store,
                keys,
                hub,
                fleet,
                settings,
                limiter,
                shutdown,
                streams: AtomicU64::new(0),
                verified: VerifiedTokens::default(),
                refusals: RefusalLog::default(),
            }),
        }
    }

    /// Wraps it in the tonic server type.
    pub fn into_server(self) -> LeveeSyncServer<SyncService> {
        LeveeSyncServer::new(self)
    }

    /// Agent streams open on this replica now.
    pub fn open_streams(&self) -> u64 {
        self.inner.streams.load(Ordering::Relaxed)
    }
}

fn bearer(req: &Request<Streaming<AgentMessage>>) -> Option<String> {
    let v = req.metadata().get("authorization")?.to_str().ok()?;
    let t = v.strip_prefix("Bearer ").or_else(|| v.strip_prefix("bearer "))?;
    Some(t.trim().to_string())
}

fn jitter(d: Duration, ratio: f64) -> Duration {
    let f = rand::rng().random_range((1.0 - ratio)..=(1.0 + ratio));
    d.mul_f64(f)
}

type SyncStream = Pin<Box<dyn Stream<Item = Result<ServerMessage, Status>> + Send>>;

#[tonic::async_trait]
impl LeveeSync for SyncService {
    type SyncStream = SyncStream;

    async fn sync(&self, req: Request<Streaming<AgentMessage>>) -> Result<Response<SyncStream>, Status> {
        let peer = req.remote_addr();
        self.accept(req).await.map_err(|(why, status)| {
            let _ = self.inner.refusals.refused(why, &status, peer);
            status
        })
    }
}

impl SyncService {
    /// Checks a new stream and starts its session, or says why it is refused. Order: a
    /// stopping server refuses before anything else (no token check, no database read),
    /// then the new-stream rate limit, then the token.
    async fn accept(
        &self,
        req: Request<Streaming<AgentMessage>>,
    ) -> Result<Response<SyncStream>, (Refusal, Status)> {
        let inner = self.inner.clone();
        if crate::shutdown::is_stopped(&inner.shutdown) {
            return Err((
                Refusal::ShuttingDown,
                Status::unavailable("server shutting down; reconnect with backoff"),
            ));
        }
        if !inner.limiter.try_take().await {
            return Err((Refusal::Rate, Status::unavailable("too many new streams; retry with backoff")));
        }
        let unauthenticated = |m: String| (Refusal::Unauthenticated, Status::unauthenticated(m));
        let token = bearer(&req).ok_or_else(|| unauthenticated("missing bearer token".into()))?;
        // The database answered for this stream's token: read it for the rest of the setup.
        let mut db_ok = true;
        let principal = match authenticate_agent(&inner.keys, &inner.store, &token).await {
            Ok(p) => {
                inner.verified.remember(&p).await;
                p
            }
            Err(AuthError::Unavailable(cause)) => {
                let jti =
                    inner.keys.verify(&token, crate::auth::AUDIENCE_AGENT).map(|c| c.jti).unwrap_or_default();
                match inner.verified.recent(&jti).await {
                    Some(p) => {
                        tracing::debug!(error = %cause, token = %p.name, "database unavailable: agent token accepted from memory");
                        db_ok = false;
                        p
                    }
                    None => {
                        return Err((
                            Refusal::Unavailable,
                            Status::unavailable(
                                "the token cannot be checked now: the database is unavailable; retry with backoff",
                            ),
                        ));
                    }
                }
            }
            Err(AuthError::Missing) => return Err(unauthenticated("missing bearer token".into())),
            Err(e @ (AuthError::Revoked | AuthError::UserGone)) => {
                if let Ok(c) = inner.keys.verify(&token, crate::auth::AUDIENCE_AGENT) {
                    inner.verified.forget(&c.jti).await;
                }
                return Err(unauthenticated(format!("agent token refused: {e}")));
            }
            Err(other) => return Err(unauthenticated(format!("agent token refused: {other}"))),
        };
        let mut incoming = req.into_inner();
        let bad_hello = |s: Status| (Refusal::Hello, s);
        let hello = match tokio::time::timeout(inner.settings.hello_timeout, incoming.message()).await {
            Ok(Ok(Some(AgentMessage { kind: Some(agent_message::Kind::Hello(h)) }))) => h,
            Ok(Ok(_)) => return Err(bad_hello(Status::invalid_argument("the first message must be Hello"))),
            Ok(Err(s)) => return Err(bad_hello(s)),
            Err(_) => return Err(bad_hello(Status::deadline_exceeded("no Hello received in time"))),
        };
        if hello.environment != principal.environment {
            return Err((
                Refusal::Scope,
                Status::permission_denied(format!(
                    "this token is scoped to environment {:?}, not {:?}",
                    principal.environment, hello.environment
                )),
            ));
        }
        if hello.services.is_empty() {
            return Err(bad_hello(Status::invalid_argument("Hello names no service")));
        }
        for s in &hello.services {
            if !principal.services.iter().any(|p| p == &s.name) {
                return Err((
                    Refusal::Scope,
                    Status::permission_denied(format!(
                        "this token is not scoped to service {:?} (allowed: {})",
                        s.name,
                        principal.services.join(", ")
                    )),
                ));
            }
        }
        // What an agent sends is untrusted (SEC-2): identifiers it chooses are refused
        // outside their alphabet rather than stored, logged and shown.
        agent_text::check_instance_id(&hello.instance_id)
            .map_err(|e| bad_hello(Status::invalid_argument(e)))?;
        agent_text::check_version(&hello.agent_version)
            .map_err(|e| bad_hello(Status::invalid_argument(e)))?;
        let (tx, rx) = mpsc::channel::<Result<ServerMessage, Status>>(16);
        tokio::spawn(run_session(inner, principal, hello, incoming, tx, db_ok));
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }
}

struct ServiceState {
    applied_revision: u64,
    applied_hash: String,
    last_sent: u64,
    nacked: HashSet<u64>,
    /// Where the agent's configuration comes from (`live`, `cache`, `default`): from its
    /// last status report, `live` once it ACKed a snapshot of this stream, empty until
    /// either (a reconnect starts empty: the previous stream's report is not carried over).
    source: String,
    /// The agent's last status report on this stream (JSON object), without the fields
    /// the session owns (`applied_revision`, `source`).
    report: Option<serde_json::Value>,
}

impl ServiceState {
    /// The status stored for the agent: its last report with `applied_revision` and
    /// `source` set to what the session knows, so the fleet row's top-level fields and
    /// its status never disagree. A closed stream's source is `disconnected`.
    fn status_json(&self, connected: bool) -> String {
        let mut v = self.report.clone().unwrap_or_else(|| serde_json::json!({}));
        v["applied_revision"] = self.applied_revision.into();
        v["source"] = if connected { self.source.clone() } else { DISCONNECTED_SOURCE.to_string() }.into();
        v.to_string()
    }
}

struct Session {
    inner: Arc<Inner>,
    env: String,
    instance: String,
    version: String,
    connected_at: i64,
    nonce: u64,
    services: HashMap<String, ServiceState>,
    tx: mpsc::Sender<Result<ServerMessage, Status>>,
}

impl Session {
    fn upsert(&self, service: &str, connected: bool) {
        let st = &self.services[service];
        let status = Some(st.status_json(connected));
        self.inner.fleet.send(FleetEvent::Upsert(AgentUpsert {
            environment: self.env.clone(),
            service: service.to_string(),
            instance_id: self.instance.clone(),
            agent_version: self.version.clone(),
            connected,
            connected_at: self.connected_at,
            last_seen: now_ms(),
            applied_revision: st.applied_revision,
            applied_hash: st.applied_hash.clone(),
            status,
        }));
    }

    /// Sends `snap` if it is newer than what the agent has and was not NACKed by it. No
    /// database access: a push to thousands of streams must not cost thousands of queries.
    async fn offer(&mut self, snap: &SnapshotRow) -> Result<(), ()> {
        let Some(st) = self.services.get_mut(&snap.service) else { return Ok(()) };
        if snap.revision <= st.applied_revision
            || snap.revision <= st.last_sent
            || st.nacked.contains(&snap.revision)
        {
            return Ok(());
        }
        self.nonce += 1;
        st.last_sent = snap.revision;
        let msg = ServerMessage {
            kind: Some(server_message::Kind::Snapshot(Snapshot {
                service: snap.service.clone(),
                revision: snap.revision,
                hash: snap.hash.clone(),
                body: snap.body.clone().into_bytes(),
                nonce: self.nonce,
                schema_version: SCHEMA_VERSION,
                environment: snap.environment.clone(),
                created_at_ms: snap.created_at,
            })),
        };
        metrics::counter!("levee_server_snapshots_sent_total").increment(1);
        self.tx.send(Ok(msg)).await.map_err(|_| ())
    }

    fn handle(&mut self, msg: AgentMessage) {
        match msg.kind {
            Some(agent_message::Kind::Ack(ack)) => {
                if let Some(st) = self.services.get_mut(&ack.service)
                    && ack.revision >= st.applied_revision
                {
                    st.applied_revision = ack.revision;
                    // It applied (or confirmed) what this stream sent: live configuration.
                    st.source = "live".to_string();
                    // The hash of what was acked is the hash we sent for that revision.
                    if let Some(cur) = self.inner.hub.current(&self.env, &ack.service)
                        && cur.revision == ack.revision
                    {
                        st.applied_hash = cur.hash.clone();
                        // Commit to this agent's ACK, for the current revision only.
                        let took = (now_ms() - cur.created_at).max(0) as f64 / 1000.0;
                        metrics::histogram!("levee_server_propagation_seconds").record(took);
                    }
                    metrics::counter!("levee_server_acks_total").increment(1);
                    // Propagation latency: only an ACK of a revision this stream pushed.
                    if st.last_sent == ack.revision {
                        self.inner.fleet.send(FleetEvent::Ack(AckRow {
                            environment: self.env.clone(),
                            service: ack.service.clone(),
                            revision: ack.revision,
                            instance_id: self.instance.clone(),
                            acked_at: now_ms(),
                        }));
                    }
                    self.upsert(&ack.service, true);
                }
            }
            Some(agent_message::Kind::Nack(nack)) => {
                if let Some(st) = self.services.get_mut(&nack.service) {
                    st.nacked.insert(nack.revision);
                    metrics::counter!("levee_server_nacks_total").increment(1);
                    // One line whatever the agent wrote: escaped, bounded, and a quoted field.
                    let detail = agent_text::text(&nack.error_detail, agent_text::MAX_DETAIL_CHARS);
                    tracing::warn!(
                        environment = %self.env, service = %nack.service, instance = %self.instance,
                        revision = nack.revision, detail = ?detail, "agent rejected a snapshot"
                    );
                    self.inner.fleet.send(FleetEvent::Nack(NackRow {
                        environment: self.env.clone(),
                        service: nack.service.clone(),
                        instance_id: self.instance.clone(),
                        revision: nack.revision,
                        error_detail: detail,
                        at: now_ms(),
                    }));
                    self.upsert(&nack.service, true);
                }
            }
            Some(agent_message::Kind::Status(report)) => {
                if let Some(st) = self.services.get_mut(&report.service) {
                    // A report about the revision the session knows tells where it came
                    // from; one about another revision (built before its ACK went out) only
                    // brings breakers and features, until the ACK says the rest.
                    if report.applied_revision == st.applied_revision {
                        st.source = agent_text::one_of(&report.source, agent_text::SOURCES).to_string();
                    }
                    st.report = serde_json::from_str(&status_json(&report)).ok();
                    self.upsert(&report.service, true);
                }
            }
            Some(agent_message::Kind::Hello(_)) | None => {}
        }
    }
}

/// The status report as stored: every string bounded and escaped, every word from a fixed
/// vocabulary either known or [`agent_text::UNRECOGNIZED`], lists capped (SEC-2).
fn status_json(r: &levee_agent::proto::StatusReport) -> String {
    use crate::db::{MAX_COUNTER_NAME, MAX_STATUS_COUNTERS};
    use agent_text::{MAX_REASON_CHARS, MAX_REPORT_ENTRIES as N, name, one_of, text};
    serde_json::json!({
        "applied_revision": r.applied_revision,
        "source": one_of(&r.source, agent_text::SOURCES),
        "breakers": r.breakers.iter().take(N).map(|b| serde_json::json!({
            "dependency": name(&b.dependency), "operation": name(&b.operation),
            "state": one_of(&b.state, agent_text::BREAKER_STATES),
            "transitions": b.transitions,
            "last_transition_reason": text(&b.last_transition_reason, MAX_REASON_CHARS),
            "failure_rate": finite(b.failure_rate), "slow_call_rate": finite(b.slow_call_rate),
        })).collect::<Vec<_>>(),
        "features": r.features.iter().take(N).map(|f| serde_json::json!({
            "feature": name(&f.feature), "level": one_of(&f.level, agent_text::FEATURE_LEVELS),
            "degraded_since": (f.degraded_since_ms > 0)
                .then(|| levee_agent::policy::Timestamp::from_unix_ms(f.degraded_since_ms)),
        })).collect::<Vec<_>>(),
        "bulkheads": r.bulkheads.iter().take(N).map(|b| serde_json::json!({
            "dependency": name(&b.dependency), "operation": name(&b.operation),
            "max_concurrent": b.max_concurrent, "in_use": b.in_use,
            "suggested_size": finite(b.suggested_size),
        })).collect::<Vec<_>>(),
        // At most MAX_STATUS_COUNTERS counters are kept, none with a name longer than
        // MAX_COUNTER_NAME bytes, escaped like every agent string (the admission section of
        // the service page reads them; ui/admission.rs checks their labels).
        "counters": r.counters.iter()
            .filter(|c| c.name.len() <= MAX_COUNTER_NAME)
            .take(MAX_STATUS_COUNTERS)
            .map(|c| (text(&c.name, MAX_COUNTER_NAME), c.value))
            .collect::<HashMap<_, _>>(),
        "fallbacks": r.fallbacks.iter().take(N).map(|f| serde_json::json!({
            "dependency": name(&f.dependency),
            "level": one_of(&f.level, agent_text::FEATURE_LEVELS),
            "since": (f.since_ms > 0).then(|| levee_agent::policy::Timestamp::from_unix_ms(f.since_ms)),
        })).collect::<Vec<_>>(),
    })
    .to_string()
}

/// A rate an agent reported, or `null` for NaN and infinities (which JSON cannot hold).
fn finite(v: f64) -> Option<f64> {
    v.is_finite().then_some(v)
}

async fn run_session(
    inner: Arc<Inner>,
    principal: AgentPrincipal,
    hello: levee_agent::proto::Hello,
    mut incoming: Streaming<AgentMessage>,
    tx: mpsc::Sender<Result<ServerMessage, Status>>,
    mut db_ok: bool,
) {
    inner.streams.fetch_add(1, Ordering::Relaxed);
    metrics::gauge!("levee_server_streams").increment(1.0);
    let mut session = Session {
        inner: inner.clone(),
        env: hello.environment.clone(),
        instance: hello.instance_id.clone(),
        version: hello.agent_version.clone(),
        connected_at: now_ms(),
        nonce: 0,
        services: HashMap::new(),
        tx: tx.clone(),
    };
    tracing::debug!(token = %principal.name, instance = %session.instance, "agent stream opened");
    let mut watches = tokio_stream::StreamMap::new();
    for s in &hello.services {
        // NACKs this instance sent on an earlier stream (a NACKed revision is never resent).
        let nacked = if !db_ok {
            HashSet::new()
        } else {
            match inner
                .store
                .nacked_revisions(&hello.environment, &s.name, &hello.instance_id, s.applied_revision)
                .await
            {
                Ok(revs) => revs.into_iter().collect(),
                Err(e) => {
                    db_ok = false;
                    tracing::warn!(error = %levee_agent::report::ErrorChain(e.as_ref()), "loading the NACKs of a new agent stream");
                    HashSet::new()
                }
            }
        };
        session.services.insert(
            s.name.clone(),
            ServiceState {
                applied_revision: s.applied_revision,
                applied_hash: s.hash.clone(),
                last_sent: 0,
                nacked,
                source: String::new(),
                report: None,
            },
        );
        watches.insert(s.name.clone(), WatchStream::new(inner.hub.subscribe(&session.env, &s.name)));
        session.upsert(&s.name, true);
    }
    // Initial state: read the database (never trust only this replica's memory: an agent
    // ahead of the hub means the hub may be stale). While the database is away, what this
    // replica holds in memory is served; the hub pushes anything newer once it is back.
    let names: Vec<String> = session.services.keys().cloned().collect();
    for name in &names {
        let stored = if db_ok { inner.store.latest_snapshot(&session.env, name).await } else { Ok(None) };
        let snap = match stored {
            Ok(Some(snap)) => {
                inner.hub.publish(snap.clone());
                Some(Arc::new(snap))
            }
            Ok(None) if db_ok => None,
            Ok(None) => inner.hub.current(&session.env, name),
            Err(e) => {
                db_ok = false;
                tracing::warn!(
                    error = %levee_agent::report::ErrorChain(e.as_ref()),
                    "database unavailable loading a snapshot for a new agent stream; serving this replica's copy"
                );
                inner.hub.current(&session.env, name)
            }
        };
        if let Some(snap) = snap
            && session.offer(&snap).await.is_err()
        {
            return finish(&inner, &session);
        }
    }

    // SEC-3: the stream ends as soon as its token is revoked (on any replica).
    let mut revoked = inner.hub.revocations().watch();
    if revoked.borrow_and_update().contains(&principal.jti) {
        let _ = tx.send(Err(token_revoked())).await;
        return finish(&inner, &session);
    }
    let mut shutdown = inner.shutdown.clone();
    let age = tokio::time::sleep(jitter(inner.settings.max_stream_age, 0.1));
    tokio::pin!(age);
    // The first heartbeat goes out at once: it tells an agent whose revision is current
    // that its configuration is confirmed live, without waiting a whole interval.
    let mut next_heartbeat = tokio::time::Instant::now();
    loop {
        tokio::select! {
            msg = incoming.message() => match msg {
                Ok(Some(m)) => session.handle(m),
                Ok(None) | Err(_) => break,
            },
            Some((_, Some(snap))) = watches.next() => {
                if session.offer(&snap).await.is_err() { break; }
            }
            _ = tokio::time::sleep_until(next_heartbeat) => {
                let interval = jitter(inner.settings.heartbeat_interval, 0.2);
                next_heartbeat = tokio::time::Instant::now() + interval;
                let services = session.services.keys().map(|name| ServiceRevision {
                    service: name.clone(),
                    revision: inner.hub.current(&session.env, name).map(|s| s.revision).unwrap_or(0),
                }).collect();
                let hb = ServerMessage { kind: Some(server_message::Kind::Heartbeat(Heartbeat {
                    services, interval_ms: interval.as_millis() as u64,
                }))};
                if tx.send(Ok(hb)).await.is_err() { break; }
            }
            _ = &mut age => {
                let _ = tx.send(Ok(go_away("maximum stream age reached; reconnect to rebalance", false))).await;
                break;
            }
            Ok(()) = revoked.changed() => {
                if revoked.borrow_and_update().contains(&principal.jti) {
                    tracing::info!(token = %principal.name, instance = %session.instance, "agent token revoked: stream ended");
                    metrics::counter!("levee_server_streams_ended_total", "reason" => "revoked").increment(1);
                    let _ = tx.send(Err(token_revoked())).await;
                    break;
                }
            }
            _ = shutdown.changed() => {
                let _ = tx.send(Ok(go_away("server shutting down", true))).await;
                break;
            }
        }
    }
    finish(&inner, &session)
}

fn token_revoked() -> Status {
    Status::unauthenticated("agent token revoked")
}

fn go_away(reason: &str, shutting_down: bool) -> ServerMessage {
    ServerMessage {
        kind: Some(server_message::Kind::GoAway(GoAway { reason: reason.to_string(), shutting_down })),
    }
}

fn finish(inner: &Inner, session: &Session) {
    for name in session.services.keys() {
        session.upsert(name, false);
    }
    inner.streams.fetch_sub(1, Ordering::Relaxed);
    metrics::gauge!("levee_server_streams").decrement(1.0);
    tracing::debug!(instance = %session.instance, "agent stream closed");
}

#[cfg(test)]
mod tests {
    use levee_agent::proto::{FeatureStatus, StatusReport};

    use super::{REFUSAL_LOG_INTERVAL, Refusal, RefusalLog};

    /// A refusal storm is one log line per reason per interval, the next one saying how
    /// many were not logged; another reason is logged on its own.
    #[test]
    fn refusals_are_logged_once_per_reason_per_interval_with_the_count() {
        let log = RefusalLog::default();
        let t0 = tokio::time::Instant::now();
        let busy = tonic::Status::unavailable("too many new streams");
        assert_eq!(log.refused_at(t0, Refusal::Rate, &busy, None), Some(0));
        for _ in 0..99 {
            assert_eq!(log.refused_at(t0, Refusal::Rate, &busy, None), None);
        }
        let bad = tonic::Status::unauthenticated("agent token refused");
        assert_eq!(log.refused_at(t0, Refusal::Unauthenticated, &bad, None), Some(0));
        let later = t0 + REFUSAL_LOG_INTERVAL;
        assert_eq!(log.refused_at(later, Refusal::Rate, &busy, None), Some(99));
        assert_eq!(log.refused_at(later, Refusal::Rate, &busy, None), None);
    }

    /// The fleet API shows an agent's status report as JSON: the time a feature went onto
    /// its fallback is RFC 3339 like every other time of the API, `null` while it is fresh.
    #[test]
    fn status_json_writes_degraded_since_as_rfc3339() {
        let report = StatusReport {
            features: vec![
                FeatureStatus {
                    feature: "recs".into(),
                    level: "GENERIC".into(),
                    degraded_since_ms: 1_764_590_400_000,
                },
                FeatureStatus { feature: "cart".into(), level: "FRESH".into(), degraded_since_ms: 0 },
            ],
            ..StatusReport::default()
        };
        let json: serde_json::Value = serde_json::from_str(&super::status_json(&report)).unwrap();
        assert_eq!(json["features"][0]["degraded_since"], "2025-12-01T12:00:00.000Z");
        assert_eq!(json["features"][1]["degraded_since"], serde_json::Value::Null);
        assert!(json["features"][0].get("degraded_since_ms").is_none());
    }
}

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

use crate::auth::{AgentPrincipal, AuthError, Keys, authenticate_agent};
use crate::db::{AgentUpsert, FleetEvent, NackRow, SnapshotRow, Store, now_ms};
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
/// Default bound on new streams per second.
pub const NEW_STREAMS_PER_SEC: u32 = 500;
/// Default wait for `Hello`.
pub const HELLO_TIMEOUT: Duration = Duration::from_secs(10);

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
        let inner = self.inner.clone();
        if !inner.limiter.try_take().await {
            metrics::counter!("levee_server_streams_refused_total", "reason" => "rate").increment(1);
            return Err(Status::unavailable("too many new streams; retry with backoff"));
        }
        let token = bearer(&req).ok_or_else(|| Status::unauthenticated("missing bearer token"))?;
        let principal = authenticate_agent(&inner.keys, &inner.store, &token).await.map_err(|e| match e {
            AuthError::Missing => Status::unauthenticated("missing bearer token"),
            other => Status::unauthenticated(format!("agent token refused: {other}")),
        })?;
        let mut incoming = req.into_inner();
        let hello = match tokio::time::timeout(inner.settings.hello_timeout, incoming.message()).await {
            Ok(Ok(Some(AgentMessage { kind: Some(agent_message::Kind::Hello(h)) }))) => h,
            Ok(Ok(_)) => return Err(Status::invalid_argument("the first message must be Hello")),
            Ok(Err(s)) => return Err(s),
            Err(_) => return Err(Status::deadline_exceeded("no Hello received in time")),
        };
        if hello.environment != principal.environment {
            return Err(Status::permission_denied(format!(
                "this token is scoped to environment {:?}, not {:?}",
                principal.environment, hello.environment
            )));
        }
        if hello.services.is_empty() {
            return Err(Status::invalid_argument("Hello names no service"));
        }
        for s in &hello.services {
            if !principal.services.iter().any(|p| p == &s.name) {
                return Err(Status::permission_denied(format!(
                    "this token is not scoped to service {:?} (allowed: {})",
                    s.name,
                    principal.services.join(", ")
                )));
            }
        }
        if hello.instance_id.is_empty() || hello.instance_id.len() > 128 {
            return Err(Status::invalid_argument("instance_id must be 1 to 128 characters"));
        }
        let (tx, rx) = mpsc::channel::<Result<ServerMessage, Status>>(16);
        tokio::spawn(run_session(inner, principal, hello, incoming, tx));
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }
}

struct ServiceState {
    applied_revision: u64,
    applied_hash: String,
    last_sent: u64,
    nacked: HashSet<u64>,
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
    fn upsert(&self, service: &str, connected: bool, status: Option<String>) {
        let st = &self.services[service];
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
                    // The hash of what was acked is the hash we sent for that revision.
                    if let Some(cur) = self.inner.hub.current(&self.env, &ack.service)
                        && cur.revision == ack.revision
                    {
                        st.applied_hash = cur.hash.clone();
                    }
                    metrics::counter!("levee_server_acks_total").increment(1);
                    self.upsert(&ack.service, true, None);
                }
            }
            Some(agent_message::Kind::Nack(nack)) => {
                if let Some(st) = self.services.get_mut(&nack.service) {
                    st.nacked.insert(nack.revision);
                    metrics::counter!("levee_server_nacks_total").increment(1);
                    tracing::warn!(
                        environment = %self.env, service = %nack.service, instance = %self.instance,
                        revision = nack.revision, detail = %nack.error_detail, "agent rejected a snapshot"
                    );
                    let mut detail = nack.error_detail;
                    detail.truncate(4000);
                    self.inner.fleet.send(FleetEvent::Nack(NackRow {
                        environment: self.env.clone(),
                        service: nack.service.clone(),
                        instance_id: self.instance.clone(),
                        revision: nack.revision,
                        error_detail: detail,
                        at: now_ms(),
                    }));
                    self.upsert(&nack.service, true, None);
                }
            }
            Some(agent_message::Kind::Status(report)) => {
                if self.services.contains_key(&report.service) {
                    let json = status_json(&report);
                    self.upsert(&report.service, true, Some(json));
                }
            }
            Some(agent_message::Kind::Hello(_)) | None => {}
        }
    }
}

/// Most counters of one agent status report the server stores.
pub const MAX_STATUS_COUNTERS: usize = 4096;
/// Longest counter name of a status report the server stores, in bytes.
pub const MAX_COUNTER_NAME: usize = 512;

fn status_json(r: &levee_agent::proto::StatusReport) -> String {
    serde_json::json!({
        "applied_revision": r.applied_revision,
        "source": r.source,
        "breakers": r.breakers.iter().map(|b| serde_json::json!({
            "dependency": b.dependency, "operation": b.operation, "state": b.state,
            "transitions": b.transitions, "last_transition_reason": b.last_transition_reason,
            "failure_rate": b.failure_rate, "slow_call_rate": b.slow_call_rate,
        })).collect::<Vec<_>>(),
        "features": r.features.iter().map(|f| serde_json::json!({
            "feature": f.feature, "level": f.level,
            "degraded_since": (f.degraded_since_ms > 0)
                .then(|| levee_agent::policy::Timestamp::from_unix_ms(f.degraded_since_ms)),
        })).collect::<Vec<_>>(),
        "bulkheads": r.bulkheads.iter().map(|b| serde_json::json!({
            "dependency": b.dependency, "operation": b.operation, "max_concurrent": b.max_concurrent,
            "in_use": b.in_use, "suggested_size": b.suggested_size,
        })).collect::<Vec<_>>(),
        // Untrusted: at most MAX_STATUS_COUNTERS counters are kept, and none with a name
        // longer than MAX_COUNTER_NAME bytes (the admission section of the service page
        // reads them; see ui/admission.rs for the label checks).
        "counters": r.counters.iter()
            .filter(|c| c.name.len() <= MAX_COUNTER_NAME)
            .take(MAX_STATUS_COUNTERS)
            .map(|c| (c.name.clone(), c.value))
            .collect::<HashMap<_, _>>(),
    })
    .to_string()
}

async fn run_session(
    inner: Arc<Inner>,
    principal: AgentPrincipal,
    hello: levee_agent::proto::Hello,
    mut incoming: Streaming<AgentMessage>,
    tx: mpsc::Sender<Result<ServerMessage, Status>>,
) {
    inner.streams.fetch_add(1, Ordering::Relaxed);
    metrics::gauge!("levee_server_streams").increment(1.0);
    let mut session = Session {
        inner: inner.clone(),
        env: hello.environment.clone(),
        instance: hello.instance_id.clone(),
        version: hello.agent_version.chars().take(64).collect(),
        connected_at: now_ms(),
        nonce: 0,
        services: HashMap::new(),
        tx: tx.clone(),
    };
    tracing::debug!(token = %principal.name, instance = %session.instance, "agent stream opened");
    let mut watches = tokio_stream::StreamMap::new();
    for s in &hello.services {
        // NACKs this instance sent on an earlier stream (a NACKed revision is never resent).
        let nacked = match inner
            .store
            .nacked_revisions(&hello.environment, &s.name, &hello.instance_id, s.applied_revision)
            .await
        {
            Ok(revs) => revs.into_iter().collect(),
            Err(e) => {
                tracing::error!(error = ?e, "loading the NACKs of a new agent stream");
                HashSet::new()
            }
        };
        session.services.insert(
            s.name.clone(),
            ServiceState {
                applied_revision: s.applied_revision,
                applied_hash: s.hash.clone(),
                last_sent: 0,
                nacked,
            },
        );
        watches.insert(s.name.clone(), WatchStream::new(inner.hub.subscribe(&session.env, &s.name)));
        session.upsert(&s.name, true, None);
    }
    // Initial state: read the database (never trust only this replica's memory: an agent
    // ahead of the hub means the hub may be stale).
    let names: Vec<String> = session.services.keys().cloned().collect();
    for name in &names {
        match inner.store.latest_snapshot(&session.env, name).await {
            Ok(Some(snap)) => {
                inner.hub.publish(snap.clone());
                if session.offer(&snap).await.is_err() {
                    return finish(&inner, &session);
                }
            }
            Ok(None) => {}
            Err(e) => tracing::error!(error = ?e, "loading a snapshot for a new agent stream"),
        }
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
                let _ = tx.send(Ok(go_away("maximum stream age reached; reconnect to rebalance"))).await;
                break;
            }
            _ = shutdown.changed() => {
                let _ = tx.send(Ok(go_away("server shutting down"))).await;
                break;
            }
        }
    }
    finish(&inner, &session)
}

fn go_away(reason: &str) -> ServerMessage {
    ServerMessage { kind: Some(server_message::Kind::GoAway(GoAway { reason: reason.to_string() })) }
}

fn finish(inner: &Inner, session: &Session) {
    for name in session.services.keys() {
        session.upsert(name, false, None);
    }
    inner.streams.fetch_sub(1, Ordering::Relaxed);
    metrics::gauge!("levee_server_streams").decrement(1.0);
    tracing::debug!(instance = %session.instance, "agent stream closed");
}

#[cfg(test)]
mod tests {
    use levee_agent::proto::{FeatureStatus, StatusReport};

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
        assert_eq!(json["features"][0]["degraded_since"], "2025-12-01T12:00:00Z");
        assert_eq!(json["features"][1]["degraded_since"], serde_json::Value::Null);
        assert!(json["features"][0].get("degraded_since_ms").is_none());
    }
}

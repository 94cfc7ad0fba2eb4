//! The agent sync service (`levee.sync.v1.LeveeSync/Sync`).
//!
//! One bidirectional stream per agent process. The agent says `Hello` with what it has
//! applied; the server sends a full snapshot only for services where it has something
//! newer, then pushes each new revision as it is committed. The agent ACKs or NACKs per
//! revision; a NACKed revision is recorded (visible in the API) and never resent to that
//! agent. Heartbeats every ~15 s (jittered) let the agent detect a silently dead stream;
//! a jittered maximum stream age makes agents rebalance across replicas; new streams per
//! second are bounded so a mass reconnect cannot overwhelm the server.

//!
//! By reason: this file holds the settings, the service and the checks a new stream
//! passes (`accept`); `limits.rs` the new-stream rate limit, `tokens.rs` the verified-token
//! cache, `refusals.rs` the rate-limited log of refused streams, `session.rs` the loop of
//! one stream (offer, heartbeats, age, revocation, ACK/NACK), `status.rs` what is kept of
//! an agent's status report, `wire.rs` the gRPC service and its codec (a snapshot encoded
//! once for every stream).

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use futures::Stream;
use levee_agent::proto::{AgentMessage, agent_message};
use tokio::sync::{mpsc, watch};
use tokio_stream::StreamExt;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};

use crate::agent_text;
use crate::auth::{AuthError, Keys};
use crate::db::Store;
use crate::fleet::FleetWriter;
use crate::health::Health;
use crate::hub::Hub;
use crate::runtime::DbRuntime;
use crate::streams;

mod limits;
mod refusals;
mod session;
mod status;
mod tokens;
mod wire;

pub use limits::NEW_STREAMS_PER_SEC;
use limits::StreamLimiter;
pub use refusals::REFUSAL_LOG_INTERVAL;
use refusals::{Refusal, RefusalLog};
use session::run_session;
use tokens::VerifiedTokens;
pub use tokens::{VERIFIED_TOKEN_TTL, VERIFIED_TOKENS_MAX};
pub use wire::SyncServer;
use wire::{EncodedSnapshots, Frame};

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
    health: Health,
    settings: SyncSettings,
    limiter: StreamLimiter,
    shutdown: watch::Receiver<bool>,
    streams: AtomicU64,
    verified: VerifiedTokens,
    refusals: RefusalLog,
    /// Where the database reads of a new stream run (`crate::runtime::DbRuntime`).
    db: DbRuntime,
    /// Each snapshot encoded once for all the streams it is sent on.
    encoded: EncodedSnapshots,
}

impl SyncService {
    /// The service over `store`, authenticating agents with `keys`, pushing what `hub`
    /// publishes, recording agent state through `fleet` and the health of their reports
    /// through `health`; its streams end (with `GoAway`) once `shutdown` is set. Its
    /// database reads run on the runtime this is called on, wherever its streams run.
    pub fn new(
        store: Store,
        keys: Keys,
        hub: Hub,
        fleet: FleetWriter,
        health: Health,
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
                health,
                settings,
                limiter,
                shutdown,
                streams: AtomicU64::new(0),
                verified: VerifiedTokens::default(),
                refusals: RefusalLog::default(),
                db: DbRuntime::current(),
                encoded: EncodedSnapshots::default(),
            }),
        }
    }

    /// Wraps it in the gRPC service (`levee.sync.v1.LeveeSync`).
    pub fn into_server(self) -> SyncServer {
        SyncServer::new(self)
    }

    /// Agent streams open on this replica now.
    pub fn open_streams(&self) -> u64 {
        self.inner.streams.load(Ordering::Relaxed)
    }
}

type SyncStream = Pin<Box<dyn Stream<Item = Result<Frame, Status>> + Send>>;

/// What a session hands its stream: a message to send, or the status that ends it. Small
/// (a boxed status): every stream's queue holds a block of them.
#[derive(Debug)]
enum Outgoing {
    Send(Frame),
    End(Box<Status>),
}

impl SyncService {
    /// The `Sync` method: a new agent stream, or why it is refused.
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
        streams::refuse_if_stopping(&inner.shutdown).map_err(|s| (Refusal::ShuttingDown, s))?;
        if !inner.limiter.try_take().await {
            return Err((Refusal::Rate, Status::unavailable("too many new streams; retry with backoff")));
        }
        let unauthenticated = |m: String| (Refusal::Unauthenticated, Status::unauthenticated(m));
        let token = streams::bearer(&req).ok_or_else(|| unauthenticated("missing bearer token".into()))?;
        // The database answered for this stream's token: read it for the rest of the setup.
        let mut db_ok = true;
        let principal = match streams::authenticate(&inner.db, &inner.keys, &inner.store, &token).await {
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
                    None => return Err((Refusal::Unavailable, streams::unavailable())),
                }
            }
            Err(e) => {
                if matches!(e, AuthError::Revoked | AuthError::UserGone)
                    && let Ok(c) = inner.keys.verify(&token, crate::auth::AUDIENCE_AGENT)
                {
                    inner.verified.forget(&c.jti).await;
                }
                return Err((Refusal::Unauthenticated, streams::refused(&e)));
            }
        };
        let mut incoming = req.into_inner();
        let bad_hello = |s: Status| (Refusal::Hello, s);
        let hello = match tokio::time::timeout(inner.settings.hello_timeout, incoming.message()).await {
            Ok(Ok(Some(AgentMessage { kind: Some(agent_message::Kind::Hello(h)) }))) => h,
            Ok(Ok(_)) => return Err(bad_hello(Status::invalid_argument("the first message must be Hello"))),
            Ok(Err(s)) => return Err(bad_hello(s)),
            Err(_) => return Err(bad_hello(Status::deadline_exceeded("no Hello received in time"))),
        };
        let out_of_scope = |e| (Refusal::Scope, streams::out_of_scope(&e));
        principal.check_environment(&hello.environment).map_err(out_of_scope)?;
        if hello.services.is_empty() {
            return Err(bad_hello(Status::invalid_argument("Hello names no service")));
        }
        for s in &hello.services {
            principal.check_service(&s.name).map_err(out_of_scope)?;
        }
        // What an agent sends is untrusted (SEC-2): identifiers it chooses are refused
        // outside their alphabet rather than stored, logged and shown.
        agent_text::check_instance_id(&hello.instance_id)
            .map_err(|e| bad_hello(Status::invalid_argument(e)))?;
        agent_text::check_version(&hello.agent_version)
            .map_err(|e| bad_hello(Status::invalid_argument(e)))?;
        let (tx, rx) = mpsc::channel::<Outgoing>(16);
        tokio::spawn(run_session(inner, principal, hello, incoming, tx, db_ok));
        let out = ReceiverStream::new(rx).map(|o| match o {
            Outgoing::Send(frame) => Ok(frame),
            Outgoing::End(status) => Err(*status),
        });
        Ok(Response::new(Box::pin(out)))
    }
}

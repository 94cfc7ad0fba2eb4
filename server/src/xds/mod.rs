//! The outbound policy over xDS: Envoy's aggregated discovery service (ADS, state of the
//! world) on the gRPC port, for Envoy and for gRPC's proxyless clients (docs/xds.md).
//!
//! A node is one instance of one service: its id is `ENVIRONMENT/SERVICE/INSTANCE`, and the
//! stream carries the service's agent token (`authorization: Bearer`), scoped to that
//! environment and service. Per type (listeners, routes, clusters, endpoints) the stream
//! keeps what the client subscribed to and what it last sent; the version of every resource
//! is the service's revision (during a staged rollout, the one this instance is served), so
//! a committed change is pushed as the hub publishes it, like to agents. A NACK is logged
//! and counted, and the version it rejected is not sent again to that stream; the next
//! revision is.
//!
//! `resources.rs` holds the mapping of a configuration to resources.

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use envoy_types::pb::envoy::config::core::v3::ControlPlane;
use envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_server::{
    AggregatedDiscoveryService, AggregatedDiscoveryServiceServer,
};
use envoy_types::pb::envoy::service::discovery::v3::{
    DeltaDiscoveryRequest, DeltaDiscoveryResponse, DiscoveryRequest, DiscoveryResponse,
};
use futures::Stream;
use levee_agent::policy::Timestamp;
use tokio::sync::{mpsc, watch};
use tokio_stream::StreamExt;
use tokio_stream::wrappers::{ReceiverStream, WatchStream};
use tonic::{Request, Response, Status, Streaming};

use crate::agent_text;
use crate::auth::{AgentPrincipal, Keys};
use crate::db::{SnapshotRow, Store};
use crate::hub::Hub;
use crate::rollout;
use crate::streams;

pub mod resources;

pub use resources::{Endpoints, Resources};

/// How long the server waits for a stream's first request (which names the node).
pub const FIRST_REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// Largest message either way: a service's resources are far below it (the snapshot they
/// come from is bounded by `policy::accept`).
pub const MAX_MESSAGE_BYTES: usize = 4 * 1024 * 1024;
/// The identifier of this control plane in every response.
pub const CONTROL_PLANE: &str = "levee";

/// The ADS service. Cheap to clone.
#[derive(Clone, Debug)]
pub struct XdsService {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    store: Store,
    keys: Keys,
    hub: Hub,
    endpoints: Endpoints,
    shutdown: watch::Receiver<bool>,
    streams: AtomicU64,
    /// Where the token check runs (`crate::runtime::DbRuntime`).
    db: crate::runtime::DbRuntime,
}

impl XdsService {
    /// The service over `store` (tokens), serving what `hub` holds, with dependency
    /// endpoints from the settings; its streams end once `shutdown` is set. Its database
    /// reads run on the runtime this is called on.
    pub fn new(
        store: Store,
        keys: Keys,
        hub: Hub,
        endpoints: Endpoints,
        shutdown: watch::Receiver<bool>,
    ) -> Self {
        XdsService {
            inner: Arc::new(Inner {
                store,
                keys,
                hub,
                endpoints,
                shutdown,
                streams: AtomicU64::new(0),
                db: crate::runtime::DbRuntime::current(),
            }),
        }
    }

    /// Wraps it in the tonic server type.
    pub fn into_server(self) -> AggregatedDiscoveryServiceServer<XdsService> {
        AggregatedDiscoveryServiceServer::new(self)
            .max_decoding_message_size(MAX_MESSAGE_BYTES)
            .max_encoding_message_size(MAX_MESSAGE_BYTES)
    }

    /// xDS streams open on this replica now.
    pub fn open_streams(&self) -> u64 {
        self.inner.streams.load(Ordering::Relaxed)
    }
}

/// The node a stream is for, from its id `ENVIRONMENT/SERVICE/INSTANCE`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeId {
    pub environment: String,
    pub service: String,
    pub instance: String,
}

impl NodeId {
    /// Parses a node id.
    ///
    /// # Errors
    /// What is wrong with it, in words.
    pub fn parse(id: &str) -> Result<NodeId, String> {
        let mut parts = id.splitn(3, '/');
        let (Some(env), Some(service), Some(instance)) = (parts.next(), parts.next(), parts.next()) else {
            return Err(format!(
                "the node id {:?} is not ENVIRONMENT/SERVICE/INSTANCE (e.g. prod/checkout/pod-1)",
                agent_text::text(id, 200)
            ));
        };
        for (what, name) in [("environment", env), ("service", service)] {
            levee_agent::policy::check_name(name)
                .map_err(|why| format!("the node id's {what} {:?} {why}", agent_text::text(name, 200)))?;
        }
        agent_text::check_instance_id(instance).map_err(|e| format!("the node id's instance: {e}"))?;
        Ok(NodeId {
            environment: env.to_string(),
            service: service.to_string(),
            instance: instance.to_string(),
        })
    }
}

type AdsStream = Pin<Box<dyn Stream<Item = Result<DiscoveryResponse, Status>> + Send>>;
type DeltaStream = Pin<Box<dyn Stream<Item = Result<DeltaDiscoveryResponse, Status>> + Send>>;

#[tonic::async_trait]
impl AggregatedDiscoveryService for XdsService {
    type StreamAggregatedResourcesStream = AdsStream;
    type DeltaAggregatedResourcesStream = DeltaStream;

    async fn stream_aggregated_resources(
        &self,
        req: Request<Streaming<DiscoveryRequest>>,
    ) -> Result<Response<AdsStream>, Status> {
        let peer = req.remote_addr();
        self.accept(req).await.inspect_err(|status| {
            // Counted, and logged at debug only: the client is told why in the status, and a
            // storm of refused reconnects must not flood the server's log.
            metrics::counter!("levee_server_xds_streams_refused_total").increment(1);
            tracing::debug!(peer = ?peer, code = ?status.code(), reason = %status.message(), "xDS stream refused");
        })
    }

    async fn delta_aggregated_resources(
        &self,
        _req: Request<Streaming<DeltaDiscoveryRequest>>,
    ) -> Result<Response<DeltaStream>, Status> {
        Err(Status::unimplemented(
            "Levee serves the state-of-the-world ADS (StreamAggregatedResources), not delta xDS",
        ))
    }
}

impl XdsService {
    /// Checks a new stream (a running server, the token, the node of the first request
    /// within its scope) and starts its session.
    async fn accept(&self, req: Request<Streaming<DiscoveryRequest>>) -> Result<Response<AdsStream>, Status> {
        let inner = self.inner.clone();
        streams::refuse_if_stopping(&inner.shutdown)?;
        let token = streams::bearer(&req).ok_or_else(|| {
            Status::unauthenticated("missing bearer token: xDS streams carry the service's agent token")
        })?;
        let principal = streams::authenticate(&inner.db, &inner.keys, &inner.store, &token)
            .await
            .map_err(|e| streams::refused(&e))?;
        let mut incoming = req.into_inner();
        let first = match tokio::time::timeout(FIRST_REQUEST_TIMEOUT, incoming.message()).await {
            Ok(Ok(Some(r))) => r,
            Ok(Ok(None)) => {
                return Err(Status::invalid_argument("the stream ended before its first request"));
            }
            Ok(Err(s)) => return Err(s),
            Err(_) => return Err(Status::deadline_exceeded("no request received in time")),
        };
        let node = first
            .node
            .as_ref()
            .ok_or_else(|| Status::invalid_argument("the first request must carry the node"))?;
        let node = NodeId::parse(&node.id).map_err(Status::invalid_argument)?;
        principal.check_scope(&node.environment, &node.service).map_err(|e| streams::out_of_scope(&e))?;
        let (tx, rx) = mpsc::channel::<Result<DiscoveryResponse, Status>>(16);
        tokio::spawn(run(inner, principal, node, first, incoming, tx));
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }
}

/// What a stream knows of one type.
#[derive(Debug, Default)]
struct Subscription {
    /// The names asked for, sorted; empty = every resource (wildcard).
    names: Vec<String>,
    /// The nonce of the last response of this type; a request with another one is stale.
    nonce: String,
    /// Version and names of the last response.
    sent: Option<(String, Vec<String>)>,
    /// The version the client last rejected.
    nacked: Option<String>,
}

struct Session {
    inner: Arc<Inner>,
    node: NodeId,
    nonce: u64,
    subs: HashMap<String, Subscription>,
    /// The revision served and its resources (revision 0: the service has none).
    current: (u64, Arc<Resources>),
    tx: mpsc::Sender<Result<DiscoveryResponse, Status>>,
}

impl Session {
    /// The snapshot this instance is to have now (`rollout::serve`, as for agents).
    fn target(&self) -> Option<Arc<SnapshotRow>> {
        let hub = &self.inner.hub;
        let (env, service) = (&self.node.environment, &self.node.service);
        let latest = hub.current(env, service);
        let view = hub.rollout(env, service);
        rollout::serve(
            latest,
            view.as_deref().map(|v| (&v.row, v.stable.as_ref())),
            Some(&self.node.instance),
        )
    }

    /// Rebuilds the resources when the revision to serve changed; whether it did.
    fn refresh(&mut self) -> bool {
        let Some(snap) = self.target() else { return false };
        if snap.revision == self.current.0 {
            return false;
        }
        match snap.config() {
            Ok(config) => {
                let built =
                    resources::build(&snap.environment, &config, &self.inner.endpoints, Timestamp::now());
                self.current = (snap.revision, Arc::new(built));
                true
            }
            Err(e) => {
                // Stored only after `policy::accept`: a body that does not decode is a
                // server bug; the client keeps what it has.
                tracing::error!(error = %e, "xDS: a stored snapshot does not decode");
                false
            }
        }
    }

    /// Sends the current resources of `type_url` as subscribed, unless the client rejected
    /// this very response already.
    async fn send(&mut self, type_url: &str) -> Result<(), ()> {
        let (revision, res) = (self.current.0, self.current.1.clone());
        let Some(all) = res.of_type(type_url) else { return Ok(()) };
        let Some(sub) = self.subs.get_mut(type_url) else { return Ok(()) };
        let version = revision.to_string();
        if sub.nacked.as_deref() == Some(version.as_str())
            && sub.sent.as_ref().is_some_and(|(_, names)| names == &sub.names)
        {
            return Ok(());
        }
        let resources = all
            .iter()
            .filter(|r| sub.names.is_empty() || sub.names.binary_search(&r.name).is_ok())
            .map(|r| r.resource.clone())
            .collect();
        self.nonce += 1;
        sub.nonce = self.nonce.to_string();
        sub.sent = Some((version.clone(), sub.names.clone()));
        let response = DiscoveryResponse {
            version_info: version,
            resources,
            type_url: type_url.to_string(),
            nonce: sub.nonce.clone(),
            control_plane: Some(ControlPlane { identifier: CONTROL_PLANE.to_string() }),
            ..Default::default()
        };
        metrics::counter!("levee_server_xds_responses_total").increment(1);
        self.tx.send(Ok(response)).await.map_err(|_| ())
    }

    /// Takes a request in: a new subscription or a changed one is answered, an ACK is
    /// noted, a NACK is logged and its version not sent again, a stale one (a nonce that is
    /// not the type's last) is ignored. Returns the type to answer, if any.
    fn on_request(&mut self, req: DiscoveryRequest) -> Option<String> {
        if !resources::TYPES.contains(&req.type_url.as_str()) {
            tracing::debug!(type_url = %agent_text::text(&req.type_url, 200), "xDS: a type Levee does not serve");
            return None;
        }
        let sub = self.subs.entry(req.type_url.clone()).or_default();
        if !req.response_nonce.is_empty() && req.response_nonce != sub.nonce {
            return None;
        }
        let mut names = req.resource_names;
        names.sort();
        names.dedup();
        let changed = names != sub.names || sub.sent.is_none();
        sub.names = names;
        if let Some(err) = req.error_detail {
            sub.nacked = sub.sent.as_ref().map(|(v, _)| v.clone());
            metrics::counter!("levee_server_xds_nacks_total").increment(1);
            tracing::warn!(
                environment = %self.node.environment, service = %self.node.service, instance = %self.node.instance,
                type_url = %req.type_url, version = ?sub.nacked,
                detail = ?agent_text::text(&err.message, agent_text::MAX_DETAIL_CHARS),
                "xDS client rejected a response"
            );
        }
        (req.response_nonce.is_empty() || changed).then_some(req.type_url)
    }

    async fn push_all(&mut self) -> Result<(), ()> {
        let types: Vec<String> = self.subs.keys().cloned().collect();
        for t in types {
            self.send(&t).await?;
        }
        Ok(())
    }
}

async fn run(
    inner: Arc<Inner>,
    principal: AgentPrincipal,
    node: NodeId,
    first: DiscoveryRequest,
    mut incoming: Streaming<DiscoveryRequest>,
    tx: mpsc::Sender<Result<DiscoveryResponse, Status>>,
) {
    inner.streams.fetch_add(1, Ordering::Relaxed);
    metrics::gauge!("levee_server_xds_streams").increment(1.0);
    tracing::debug!(token = %principal.name, node = ?node, "xDS stream opened");
    let mut snapshots = WatchStream::new(inner.hub.subscribe(&node.environment, &node.service));
    let mut rollouts = WatchStream::new(inner.hub.subscribe_rollout(&node.environment, &node.service));
    let mut session = Session {
        inner: inner.clone(),
        node,
        nonce: 0,
        subs: HashMap::new(),
        current: (0, Arc::default()),
        tx: tx.clone(),
    };
    session.refresh();
    let mut revoked = inner.hub.revocations().watch();
    let mut shutdown = inner.shutdown.clone();
    let mut next = Some(first);
    loop {
        if let Some(req) = next.take()
            && let Some(t) = session.on_request(req)
            && session.send(&t).await.is_err()
        {
            break;
        }
        if revoked.borrow_and_update().contains(&principal.jti) {
            let _ = tx.send(Err(Status::unauthenticated("agent token revoked"))).await;
            break;
        }
        tokio::select! {
            msg = incoming.message() => match msg {
                Ok(Some(req)) => next = Some(req),
                Ok(None) | Err(_) => break,
            },
            Some(_) = snapshots.next() => {
                if session.refresh() && session.push_all().await.is_err() { break; }
            }
            Some(_) = rollouts.next() => {
                if session.refresh() && session.push_all().await.is_err() { break; }
            }
            Ok(()) = revoked.changed() => {}
            _ = shutdown.changed() => {
                let _ = tx.send(Err(Status::unavailable("server shutting down; reconnect with backoff"))).await;
                break;
            }
        }
    }
    inner.streams.fetch_sub(1, Ordering::Relaxed);
    metrics::gauge!("levee_server_xds_streams").decrement(1.0);
    tracing::debug!(instance = %session.node.instance, "xDS stream closed");
}

//! One agent stream: the snapshots it is behind on, then each new revision, heartbeats,
//! its maximum age, its token's revocation, and what the agent says back (ACK, NACK,
//! status report), handed to the fleet writer.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use levee_agent::policy::defaults::MAX_MESSAGE_BYTES;
use levee_agent::proto::{
    AgentMessage, GoAway, Heartbeat, ServerMessage, ServiceRevision, agent_message, server_message,
};
use rand::Rng;
use tokio::sync::mpsc;
use tokio_stream::StreamExt;
use tokio_stream::wrappers::WatchStream;
use tonic::{Status, Streaming};

use crate::agent_text;
use crate::auth::AgentPrincipal;
use crate::db::{AckRow, AgentUpsert, FleetEvent, NackRow, SnapshotRow, now_ms};
use crate::rollout;

use super::status::Shown;
use super::wire::Frame;
use super::{Inner, Outgoing};

/// An agent's row is written again after this long even when its reports say nothing new,
/// so its `last_seen` stays within it.
pub const UNCHANGED_STATUS_REFRESH: Duration = Duration::from_secs(60);

fn jitter(d: Duration, ratio: f64) -> Duration {
    let f = rand::rng().random_range((1.0 - ratio)..=(1.0 + ratio));
    d.mul_f64(f)
}

pub(super) struct ServiceState {
    pub(super) applied_revision: u64,
    pub(super) applied_hash: String,
    pub(super) last_sent: u64,
    /// The hash of the snapshot sent as `last_sent` (what an ACK of it applied: during a
    /// rollout, not necessarily the service's newest).
    pub(super) sent_hash: String,
    pub(super) nacked: HashSet<u64>,
    /// Where the agent's configuration comes from (`live`, `cache`, `default`): from its
    /// last status report, `live` once it ACKed a snapshot of this stream, empty until
    /// either (a reconnect starts empty: the previous stream's report is not carried over).
    pub(super) source: String,
    /// What the agent's last status report on this stream shows, without the fields the
    /// session owns (`applied_revision`, `source`).
    pub(super) report: Option<Shown>,
    /// When the agent's row was last handed to the fleet writer.
    pub(super) stored_at: std::cell::Cell<Option<tokio::time::Instant>>,
}

impl ServiceState {
    /// A service as the agent's `Hello` names it: `applied_revision` with `applied_hash`,
    /// `nacked` its revisions it refused on earlier streams; nothing sent or reported yet.
    pub(super) fn new(applied_revision: u64, applied_hash: String, nacked: HashSet<u64>) -> Self {
        ServiceState {
            applied_revision,
            applied_hash,
            last_sent: 0,
            sent_hash: String::new(),
            nacked,
            source: String::new(),
            report: None,
            stored_at: std::cell::Cell::new(None),
        }
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
    tx: mpsc::Sender<Outgoing>,
}

impl Session {
    fn upsert(&self, service: &str, connected: bool) {
        let st = &self.services[service];
        st.stored_at.set(Some(tokio::time::Instant::now()));
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
    /// database access: a push to thousands of streams must not cost thousands of queries,
    /// and no encoding per stream: every stream writes the same encoded message
    /// (`EncodedSnapshots`), with its own nonce.
    async fn offer(&mut self, snap: &Arc<SnapshotRow>) -> Result<(), ()> {
        let Some(st) = self.services.get_mut(&snap.service) else { return Ok(()) };
        if snap.revision <= st.applied_revision
            || snap.revision <= st.last_sent
            || st.nacked.contains(&snap.revision)
        {
            return Ok(());
        }
        self.nonce += 1;
        st.last_sent = snap.revision;
        st.sent_hash = snap.hash.clone();
        let encoded = self.inner.encoded.get(snap);
        // A message the agent could not receive would end its stream, and every reconnect
        // would bring it again: it is not sent, and the server records the NACK the agent
        // cannot send (stored before the budget of `policy::accept` held, or by another
        // version). Old agents receive at most this too (tonic's default).
        let size = Frame::snapshot_len(&encoded, self.nonce);
        if size > MAX_MESSAGE_BYTES {
            let detail = format!(
                "not sent: the snapshot message is {size} bytes, over the {MAX_MESSAGE_BYTES} bytes an agent \
                 receives (recorded by the server for this agent)"
            );
            self.nacked(&snap.service, snap.revision, detail);
            return Ok(());
        }
        metrics::counter!("levee_server_snapshots_sent_total").increment(1);
        send(&self.tx, Frame::Snapshot { encoded, nonce: self.nonce }).await
    }

    /// Records that this agent will not apply `revision` of `service`, and why (`detail`,
    /// already bounded and escaped): never sent to it again, shown per revision.
    /// The snapshot this instance is to have now, from what this replica holds: the newest
    /// one, or while a staged rollout is in progress and the instance is outside its cohort,
    /// the stable one (`rollout::serve`). `None`: nothing to offer yet.
    fn target(&self, service: &str) -> Option<Arc<SnapshotRow>> {
        let latest = self.inner.hub.current(&self.env, service);
        let view = self.inner.hub.rollout(&self.env, service);
        rollout::serve(latest, view.as_deref().map(|v| (&v.row, v.stable.as_ref())), Some(&self.instance))
    }

    /// Offers `service`'s target snapshot, if any.
    async fn offer_target(&mut self, service: &str) -> Result<(), ()> {
        match self.target(service) {
            Some(snap) => self.offer(&snap).await,
            None => Ok(()),
        }
    }

    fn nacked(&mut self, service: &str, revision: u64, detail: String) {
        let Some(st) = self.services.get_mut(service) else { return };
        st.nacked.insert(revision);
        metrics::counter!("levee_server_nacks_total").increment(1);
        tracing::warn!(
            environment = %self.env, service = %service, instance = %self.instance,
            revision, detail = ?detail, "agent rejected a snapshot"
        );
        self.inner.fleet.send(FleetEvent::Nack(NackRow {
            environment: self.env.clone(),
            service: service.to_string(),
            instance_id: self.instance.clone(),
            revision,
            error_detail: detail,
            at: now_ms(),
        }));
        self.upsert(service, true);
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
                    if st.last_sent == ack.revision {
                        st.applied_hash = st.sent_hash.clone();
                    }
                    if let Some(cur) = self.inner.hub.current(&self.env, &ack.service)
                        && cur.revision == ack.revision
                    {
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
                // One line whatever the agent wrote: escaped, bounded, and a quoted field.
                let detail = agent_text::text(&nack.error_detail, agent_text::MAX_DETAIL_CHARS);
                self.nacked(&nack.service, nack.revision, detail);
            }
            Some(agent_message::Kind::Status(mut report)) => {
                if let Some(st) = self.services.get_mut(&report.service) {
                    // A report about the revision the session knows tells where it came
                    // from; one about another revision (built before its ACK went out) only
                    // brings breakers and features, until the ACK says the rest.
                    let mut changed = false;
                    if report.applied_revision == st.applied_revision {
                        let source = agent_text::one_of(&report.source, agent_text::SOURCES);
                        if st.source != source {
                            st.source = source.to_string();
                            changed = true;
                        }
                    }
                    self.inner.health.report(&self.env, &self.instance, report.applied_revision, &report);
                    changed |= Shown::take(&mut st.report, &mut report);
                    // A report that says nothing new is not written again (at 10,000 agents
                    // every 10 s that is 1,000 upserts a second), but the row's `last_seen`
                    // is kept within UNCHANGED_STATUS_REFRESH.
                    let stale = st.stored_at.get().is_none_or(|t| t.elapsed() >= UNCHANGED_STATUS_REFRESH);
                    if changed || stale {
                        self.upsert(&report.service, true);
                    }
                }
            }
            Some(agent_message::Kind::Hello(_)) | None => {}
        }
    }
}

pub(super) async fn run_session(
    inner: Arc<Inner>,
    principal: AgentPrincipal,
    hello: levee_agent::proto::Hello,
    mut incoming: Streaming<AgentMessage>,
    tx: mpsc::Sender<Outgoing>,
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
    let mut rollout_watches = tokio_stream::StreamMap::new();
    for s in &hello.services {
        // NACKs this instance sent on an earlier stream (a NACKed revision is never resent).
        let nacked = if !db_ok {
            HashSet::new()
        } else {
            let read = {
                let (i, env, name, instance) =
                    (inner.clone(), hello.environment.clone(), s.name.clone(), hello.instance_id.clone());
                let applied = s.applied_revision;
                inner.db.run(async move { i.store.nacked_revisions(&env, &name, &instance, applied).await })
            };
            match read.await.unwrap_or_else(|| Err(anyhow::anyhow!("the server is stopping"))) {
                Ok(revs) => revs.into_iter().collect(),
                Err(e) => {
                    db_ok = false;
                    tracing::warn!(error = %levee_agent::report::ErrorChain(e.as_ref()), "loading the NACKs of a new agent stream");
                    HashSet::new()
                }
            }
        };
        session
            .services
            .insert(s.name.clone(), ServiceState::new(s.applied_revision, s.hash.clone(), nacked));
        watches.insert(s.name.clone(), WatchStream::new(inner.hub.subscribe(&session.env, &s.name)));
        rollout_watches
            .insert(s.name.clone(), WatchStream::new(inner.hub.subscribe_rollout(&session.env, &s.name)));
        session.upsert(&s.name, true);
    }
    // Initial state: read the database (never trust only this replica's memory: an agent
    // ahead of the hub means the hub may be stale). While the database is away, what this
    // replica holds in memory is served; the hub pushes anything newer once it is back.
    let names: Vec<String> = session.services.keys().cloned().collect();
    for name in &names {
        // The newest snapshot with the rollout that says who gets it, read together.
        let stored = if db_ok {
            let (i, env, name) = (inner.clone(), session.env.clone(), name.clone());
            let read = inner.db.run(async move { i.store.delivery(&env, &name).await });
            read.await.unwrap_or_else(|| Err(anyhow::anyhow!("the server is stopping"))).map(Some)
        } else {
            Ok(None)
        };
        match stored {
            Ok(Some(delivery)) => inner.hub.publish_delivery(delivery),
            Ok(None) => {}
            Err(e) => {
                db_ok = false;
                tracing::warn!(
                    error = %levee_agent::report::ErrorChain(e.as_ref()),
                    "database unavailable loading a snapshot for a new agent stream; serving this replica's copy"
                );
            }
        }
        if session.offer_target(name).await.is_err() {
            return finish(&inner, &session);
        }
    }

    // SEC-3: the stream ends as soon as its token is revoked (on any replica).
    let mut revoked = inner.hub.revocations().watch();
    if revoked.borrow_and_update().contains(&principal.jti) {
        let _ = tx.send(token_revoked()).await;
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
            Some((name, Some(_))) = watches.next() => {
                if session.offer_target(&name).await.is_err() { break; }
            }
            Some((name, _)) = rollout_watches.next() => {
                if session.offer_target(&name).await.is_err() { break; }
            }
            _ = tokio::time::sleep_until(next_heartbeat) => {
                let interval = jitter(inner.settings.heartbeat_interval, 0.2);
                next_heartbeat = tokio::time::Instant::now() + interval;
                let services = session.services.keys().map(|name| ServiceRevision {
                    service: name.clone(),
                    revision: session.target(name).map(|s| s.revision).unwrap_or(0),
                }).collect();
                let hb = ServerMessage { kind: Some(server_message::Kind::Heartbeat(Heartbeat {
                    services, interval_ms: interval.as_millis() as u64,
                }))};
                if send(&tx, Frame::Message(Box::new(hb))).await.is_err() { break; }
            }
            _ = &mut age => {
                let _ = send(&tx, go_away("maximum stream age reached; reconnect to rebalance", false)).await;
                break;
            }
            Ok(()) = revoked.changed() => {
                if revoked.borrow_and_update().contains(&principal.jti) {
                    tracing::info!(token = %principal.name, instance = %session.instance, "agent token revoked: stream ended");
                    metrics::counter!("levee_server_streams_ended_total", "reason" => "revoked").increment(1);
                    let _ = tx.send(token_revoked()).await;
                    break;
                }
            }
            _ = shutdown.changed() => {
                let _ = send(&tx, go_away("server shutting down", true)).await;
                break;
            }
        }
    }
    finish(&inner, &session)
}

/// Queues `frame` on the stream; `Err` when the stream is gone.
async fn send(tx: &mpsc::Sender<Outgoing>, frame: Frame) -> Result<(), ()> {
    tx.send(Outgoing::Send(frame)).await.map_err(|_| ())
}

fn token_revoked() -> Outgoing {
    Outgoing::End(Box::new(Status::unauthenticated("agent token revoked")))
}

fn go_away(reason: &str, shutting_down: bool) -> Frame {
    Frame::Message(Box::new(ServerMessage {
        kind: Some(server_message::Kind::GoAway(GoAway { reason: reason.to_string(), shutting_down })),
    }))
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
    use levee_agent::proto::{Ack, BreakerStatus, StatusReport};
    use tokio::sync::watch;

    use super::*;
    use crate::fleet::FleetWriter;

    /// A session of instance `pod-a` for prod/checkout on revision 3, over a temporary
    /// store, whose fleet events are kept in the returned queue.
    async fn session(dir: &tempfile::TempDir) -> (Session, mpsc::Receiver<FleetEvent>) {
        let url = format!("sqlite://{}?mode=rwc", dir.path().join("t.db").display());
        let store = crate::db::Store::connect(&url).await.unwrap();
        let (fleet, events) = FleetWriter::queue_only(100);
        let (_, shutdown) = watch::channel(false);
        let (health, _) = crate::health::Health::spawn(store.clone(), "r1", shutdown.clone());
        let keys = crate::auth::Keys::new(&[7; 32]).unwrap();
        let svc = super::super::SyncService::new(
            store,
            keys,
            crate::hub::Hub::default(),
            fleet,
            health,
            super::super::SyncSettings::default(),
            shutdown,
        );
        let (tx, _) = mpsc::channel(1);
        let mut services = HashMap::new();
        services.insert("checkout".to_string(), ServiceState::new(3, "h3".into(), HashSet::new()));
        let session = Session {
            inner: svc.inner.clone(),
            env: "prod".into(),
            instance: "pod-a".into(),
            version: "t".into(),
            connected_at: 1,
            nonce: 0,
            services,
            tx,
        };
        (session, events)
    }

    fn report(state: &str) -> AgentMessage {
        AgentMessage {
            kind: Some(agent_message::Kind::Status(StatusReport {
                service: "checkout".into(),
                applied_revision: 3,
                source: "live".into(),
                breakers: vec![BreakerStatus {
                    dependency: "pricing".into(),
                    state: state.into(),
                    ..BreakerStatus::default()
                }],
                ..StatusReport::default()
            })),
        }
    }

    /// The status of each agent row handed to the fleet writer so far.
    fn written(events: &mut mpsc::Receiver<FleetEvent>) -> Vec<serde_json::Value> {
        let mut out = Vec::new();
        while let Ok(ev) = events.try_recv() {
            if let FleetEvent::Upsert(a) = ev {
                out.push(serde_json::from_str(a.status.as_deref().unwrap()).unwrap());
            }
        }
        out
    }

    /// A status report that shows nothing new is not written, yet the agent's row is
    /// written again once UNCHANGED_STATUS_REFRESH passed since the last write, so its
    /// `last_seen` stays within that bound; a changed report and an ACK are written at once,
    /// the ACK's row with the report printed earlier and the ACKed revision.
    #[tokio::test]
    async fn unchanged_reports_are_written_only_to_keep_last_seen_within_its_bound() {
        let dir = tempfile::tempdir().unwrap();
        let (mut s, mut events) = session(&dir).await;
        // Paused once the store is open (its pool's timeouts run on tokio's clock).
        tokio::time::pause();
        s.handle(report("CLOSED"));
        let first = written(&mut events);
        assert_eq!(first.len(), 1, "the first report is written");
        assert_eq!(first[0]["breakers"][0]["state"], "CLOSED");
        assert_eq!(
            (first[0]["applied_revision"].as_u64(), first[0]["source"].as_str()),
            (Some(3), Some("live"))
        );

        tokio::time::advance(UNCHANGED_STATUS_REFRESH - Duration::from_secs(1)).await;
        s.handle(report("CLOSED"));
        assert!(written(&mut events).is_empty(), "an unchanged report within the bound is not written");
        tokio::time::advance(Duration::from_secs(1)).await;
        s.handle(report("CLOSED"));
        assert_eq!(written(&mut events), first, "at the bound the row is written again, unchanged");
        s.handle(report("CLOSED"));
        assert!(written(&mut events).is_empty(), "and the bound starts again");

        s.handle(report("OPEN"));
        let open = written(&mut events);
        assert_eq!(open.len(), 1, "a changed report is written at once");
        assert_eq!(open[0]["breakers"][0]["state"], "OPEN");

        s.services.get_mut("checkout").unwrap().last_sent = 4;
        s.handle(AgentMessage {
            kind: Some(agent_message::Kind::Ack(Ack { service: "checkout".into(), revision: 4, nonce: 1 })),
        });
        let acked = written(&mut events);
        let mut expected = open[0].clone();
        expected["applied_revision"] = 4.into();
        assert_eq!(acked, vec![expected], "the ACK's row: the same report, the new revision");
    }
}

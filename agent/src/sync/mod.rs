//! The sync client: one bidirectional gRPC stream to the Levee server that receives
//! snapshots and heartbeats and answers with ACK / NACK and status reports.
//!
//! # Lifecycle
//! Connect (fresh channel, HTTP/2 and TCP keepalive) → send `Hello` with the applied
//! revision → for each message: `Snapshot` is judged, applied, persisted and ACKed (or
//! NACKed, keeping the last good configuration); `Heartbeat` sets the expected interval and
//! confirms the applied revision; `GoAway` ends the stream. The stream is dead when
//! nothing arrives for `missed_heartbeats` intervals (CP-5). Then reconnect:
//! * after a stream on which a message arrived: backoff reset, random delay in
//!   `[0, reconnect_jitter]`;
//! * after a failure before any message, or a `GoAway` saying the server is shutting
//!   down: exponential backoff with full jitter (a stopping server is not a success: the
//!   agent does not come straight back to a port that is closing), plus
//!   `reconnect_jitter` after a shutdown;
//! * after `UNAUTHENTICATED` / `PERMISSION_DENIED`: the long `unauthorized_backoff`,
//!   logged once per distinct error (CP-7);
//! * with an `http_fallback` URL, after `http_fallback_after` attempts in a row failed
//!   before any message: long-poll the snapshot over HTTP (`http.rs`) for
//!   `http_fallback_period`, then try the stream again (one more failure returns to HTTP).
//!
//! With several server addresses, an attempt that failed before any message, or a server
//! that said it is stopping, moves the next attempt to the next address. With a token file
//! (`token.rs`), the file is read again before every attempt, and while the token is
//! refused every `TOKEN_FILE_POLL`: a rotated token ends the long wait.

mod apply;
mod http;
mod settings;
mod token;

pub use settings::*;
pub use token::TOKEN_FILE_POLL;
pub(crate) use token::{TokenProblem, TokenSource};

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, watch};
use tokio::time::{Instant, MissedTickBehavior, sleep, sleep_until};
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::{Channel, Endpoint};
use tonic::{Code, Request, Status};

use crate::policy::Timestamp;
use crate::policy::defaults::MAX_MESSAGE_BYTES;
use crate::proto::levee_sync_client::LeveeSyncClient;
use crate::proto::{Ack, AgentMessage, Hello, Nack, ServiceState, agent_message, server_message};
use crate::state::Shared;
use apply::{Verdict, judge};

/// Capacity of the outbound message queue of one stream.
const OUTBOUND_QUEUE: usize = 64;

/// Work for the answer task of one stream, handled strictly in arrival order.
enum Answer {
    /// Write the applied snapshot to the disk cache, then send the ACK (persist, then ACK:
    /// control-plane.md §2).
    PersistThenAck { revision: u64, hash: String, body: Arc<str>, ack: Ack },
    /// Send at once (an ACK of an already applied revision, or a NACK) — but after every
    /// answer queued before it, so the server sees answers in snapshot order.
    Send(agent_message::Kind),
}

/// How one stream ended.
#[derive(Debug)]
enum Ended {
    Shutdown,
    /// The server refused the token.
    Unauthorized(String),
    /// Anything else; `received` = a message arrived on this stream.
    Dropped {
        received: bool,
        error: String,
    },
    /// The server said it is shutting down (`GoAway.shutting_down`); `received` as above.
    ServerStopping {
        received: bool,
        error: String,
    },
}

pub(crate) struct SyncClient {
    pub(crate) shared: Arc<Shared>,
    /// The server's addresses, tried in turn: the stream stays on the one that answers and
    /// moves to the next after an attempt that failed before any message or a server that
    /// said it is stopping.
    pub(crate) endpoints: Vec<Endpoint>,
    /// Index in `endpoints` of the address the next attempt uses.
    pub(crate) current: usize,
    pub(crate) token: TokenSource,
    pub(crate) instance_id: String,
    pub(crate) settings: SyncClientSettings,
    pub(crate) shutdown: watch::Receiver<bool>,
}

impl SyncClient {
    /// Builds the endpoint with the keepalive policy of `settings`.
    ///
    /// # Errors
    /// When `address` is not a valid URI.
    pub(crate) fn endpoint(
        address: &str,
        s: &SyncClientSettings,
    ) -> Result<Endpoint, tonic::transport::Error> {
        Endpoint::from_shared(address.to_string())?
            .connect_timeout(s.connect_timeout)
            .tcp_nodelay(true)
            .tcp_keepalive(Some(s.tcp_keepalive))
            .http2_keep_alive_interval(s.http2_keepalive_interval)
            .keep_alive_timeout(s.http2_keepalive_timeout)
            .keep_alive_while_idle(true)
            .user_agent(concat!("levee-agent/", env!("CARGO_PKG_VERSION")))
    }

    /// Runs until shutdown.
    pub(crate) async fn run(mut self) {
        let mut backoff = ReconnectBackoff::new(&self.settings);
        let mut last_logged: Option<String> = None;
        // Stream attempts in a row that failed before any message arrived.
        let mut failures: u32 = 0;
        loop {
            let after = self.settings.http_fallback_after;
            let ended = match self.settings.http_fallback.clone() {
                Some(base) if after > 0 && failures >= after => {
                    let ended = self.poll_http(&base).await;
                    // Back to the stream; one more failure returns to HTTP.
                    failures = after - 1;
                    match ended {
                        Some(e) => e,
                        None => continue,
                    }
                }
                _ => self.session().await,
            };
            match &ended {
                Ended::Dropped { received: false, .. } | Ended::ServerStopping { received: false, .. } => {
                    failures = failures.saturating_add(1)
                }
                Ended::Dropped { received: true, .. } | Ended::ServerStopping { received: true, .. } => {
                    failures = 0
                }
                _ => {}
            }
            if matches!(ended, Ended::Dropped { received: false, .. } | Ended::ServerStopping { .. })
                && self.endpoints.len() > 1
            {
                self.current = (self.current + 1) % self.endpoints.len();
                tracing::debug!(next = %self.endpoints[self.current].uri(), "trying the next server address");
            }
            self.shared.set_connected(false);
            // Set while the wait is the long one of a refused token: a new token in the
            // token file ends it.
            let mut refused = false;
            let delay = match ended {
                Ended::Shutdown => return,
                Ended::Unauthorized(error) if self.token.reload() => {
                    // The token was rotated and the file already holds the new one.
                    self.shared.set_error(error.clone());
                    last_logged = Some(error);
                    uniform(Duration::ZERO, self.settings.reconnect_jitter)
                }
                Ended::Unauthorized(error) => {
                    refused = true;
                    if last_logged.as_deref() != Some(error.as_str()) {
                        tracing::error!(
                            environment = %self.shared.environment,
                            service = %self.shared.service,
                            error = %error,
                            retry_in = ?self.settings.unauthorized_backoff,
                            "the Levee server refused this agent's token; check the token's environment and services. \
                             Enforcement continues with the last good configuration"
                        );
                    }
                    self.shared.set_error(error.clone());
                    last_logged = Some(error);
                    unauthorized_delay(self.settings.unauthorized_backoff)
                }
                Ended::ServerStopping { received, error } => {
                    tracing::info!(error = %error, "the Levee server is stopping; reconnecting with backoff");
                    self.shared.set_error(error.clone());
                    last_logged = Some(error);
                    // Messages arrived, so the attempts before this stream are forgotten;
                    // the stop itself counts as the first failed attempt.
                    if received {
                        backoff.reset();
                    }
                    self.settings.reconnect_jitter + backoff.next_delay()
                }
                Ended::Dropped { received, error } => {
                    if last_logged.as_deref() != Some(error.as_str()) {
                        tracing::warn!(
                            environment = %self.shared.environment,
                            service = %self.shared.service,
                            error = %error,
                            "levee sync stream lost; reconnecting. Enforcement continues with the last good configuration"
                        );
                    } else {
                        tracing::debug!(error = %error, "levee sync stream lost again");
                    }
                    self.shared.set_error(error.clone());
                    last_logged = Some(error);
                    if received {
                        backoff.reset();
                        uniform(Duration::ZERO, self.settings.reconnect_jitter)
                    } else {
                        backoff.next_delay()
                    }
                }
            };
            tokio::select! {
                _ = sleep(delay) => {}
                _ = self.token.changed(), if refused => {
                    self.token.reload();
                }
                _ = self.shutdown.changed() => return,
            }
            if *self.shutdown.borrow() {
                return;
            }
        }
    }

    fn hello(&self) -> AgentMessage {
        let current = self.shared.current.load();
        AgentMessage {
            kind: Some(agent_message::Kind::Hello(Hello {
                instance_id: self.instance_id.clone(),
                agent_version: env!("CARGO_PKG_VERSION").to_string(),
                environment: self.shared.environment.clone(),
                services: vec![ServiceState {
                    name: self.shared.service.clone(),
                    applied_revision: current.revision,
                    hash: current.hash.clone(),
                }],
            })),
        }
    }

    fn dead_after(&self, interval: Duration) -> Duration {
        interval.saturating_mul(self.settings.missed_heartbeats.max(1))
    }

    async fn connect(&mut self) -> Result<Channel, String> {
        let endpoint = &self.endpoints[self.current];
        tokio::select! {
            r = endpoint.connect() => r.map_err(|e| {
                format!("cannot connect to {}: {}", endpoint.uri(), crate::report::ErrorChain(&e))
            }),
            _ = self.shutdown.changed() => Err(String::new()),
        }
    }

    /// One stream, from connecting to its end.
    async fn session(&mut self) -> Ended {
        self.token.reload();
        let channel = match self.connect().await {
            Ok(c) => c,
            Err(_) if *self.shutdown.borrow() => return Ended::Shutdown,
            Err(error) => return Ended::Dropped { received: false, error },
        };
        // Explicit, and equal to the server's: the budgets of `policy::accept` keep every
        // snapshot far below it.
        let mut client = LeveeSyncClient::new(channel)
            .max_decoding_message_size(MAX_MESSAGE_BYTES)
            .max_encoding_message_size(MAX_MESSAGE_BYTES);
        let (tx, rx) = mpsc::channel(OUTBOUND_QUEUE);
        tx.try_send(self.hello()).expect("a fresh queue has room for the hello");
        let mut request = Request::new(ReceiverStream::new(rx));
        request.metadata_mut().insert("authorization", self.token.header().clone());

        let interval = self.settings.heartbeat_interval;
        let opened = Instant::now();
        let answer_by = opened + self.dead_after(interval);
        let response = tokio::select! {
            r = client.sync(request) => r,
            _ = self.shutdown.changed() => return Ended::Shutdown,
            _ = sleep_until(answer_by) => {
                return Ended::Dropped { received: false, error: "the server did not answer the sync request".into() };
            }
        };
        let mut stream = match response {
            Ok(r) => r.into_inner(),
            Err(status) => return ended_by(status, false),
        };
        self.shared.set_connected(true);
        let (ended_tx, ended_rx) = watch::channel(false);
        let (answers, answering) = self.spawn_answer_task(tx.clone(), ended_rx);
        tracing::info!(
            environment = %self.shared.environment,
            service = %self.shared.service,
            revision = self.shared.current.load().revision,
            "levee sync stream established"
        );

        let ended = self.read_stream(&mut stream, &tx, &answers, opened, interval).await;
        // Let the answer task finish what is queued (persist every applied snapshot) before
        // reconnecting or reporting shutdown done.
        let _ = ended_tx.send(true);
        drop(answers);
        let _ = answering.await;
        ended
    }

    /// Reads one established stream until it ends.
    async fn read_stream(
        &mut self,
        stream: &mut tonic::Streaming<crate::proto::ServerMessage>,
        tx: &mpsc::Sender<AgentMessage>,
        answers: &mpsc::Sender<Answer>,
        opened: Instant,
        mut interval: Duration,
    ) -> Ended {
        let mut received = false;
        let mut last_message = opened;
        // The newest revision of this service the server's heartbeats announced.
        let mut announced = 0;
        // The first report goes out at once, so the server's fleet view says where this
        // agent's configuration comes from right after a (re)connect, and another whenever
        // the applied revision or its source changes (see `report_if_changed`).
        let mut status_tick = tokio::time::interval_at(opened, self.settings.status_interval);
        status_tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
        let mut reported = None;
        // Changes to breakers, fallbacks and degraded features are reported within
        // `min_report_gap` (see `send_report`); `last_report` = (when, generation of the
        // changes it includes), `prompt_at` = when the pending extra report is due.
        let changes = self.shared.status_changes.clone();
        let mut last_report = (opened, changes.generation());
        let mut prompt_at: Option<Instant> = None;

        loop {
            let dead_at = last_message + self.dead_after(interval);
            tokio::select! {
                biased;
                _ = self.shutdown.changed() => return Ended::Shutdown,
                message = stream.message() => {
                    let message = match message {
                        Ok(Some(m)) => m,
                        Ok(None) => return Ended::Dropped { received, error: "the server closed the sync stream".into() },
                        Err(status) if undeliverable(&status) => return self.undeliverable(tx, announced, &status),
                        Err(status) => return ended_by(status, received),
                    };
                    received = true;
                    last_message = Instant::now();
                    match message.kind {
                        Some(server_message::Kind::Snapshot(snap)) => {
                            if let Err(error) = self.on_snapshot(answers, snap) {
                                return Ended::Dropped { received, error };
                            }
                        }
                        Some(server_message::Kind::Heartbeat(hb)) => {
                            if hb.interval_ms > 0 {
                                interval = Duration::from_millis(hb.interval_ms).min(MAX_HEARTBEAT_INTERVAL);
                            }
                            for s in hb.services.iter().filter(|s| s.service == self.shared.service) {
                                announced = announced.max(s.revision);
                                self.shared.confirm(s.revision);
                            }
                        }
                        Some(server_message::Kind::GoAway(g)) => {
                            tracing::info!(reason = %g.reason, shutting_down = g.shutting_down, "the Levee server asked this agent to reconnect");
                            let error = format!("server sent GoAway: {}", g.reason);
                            if g.shutting_down {
                                return Ended::ServerStopping { received, error };
                            }
                            return Ended::Dropped { received, error };
                        }
                        None => {}
                    }
                    self.report_if_changed(tx, &mut reported, &mut last_report);
                }
                _ = sleep_until(dead_at) => {
                    return Ended::Dropped {
                        received,
                        error: format!(
                            "no message from the server for {:?} ({} missed heartbeats); the stream is considered dead",
                            self.dead_after(interval),
                            self.settings.missed_heartbeats
                        ),
                    };
                }
                _ = status_tick.tick() => self.send_report(tx, &mut reported, &mut last_report),
                // A breaker, fallback or degraded feature changed: report it once the gap
                // since the last report has passed (at once when it already has).
                _ = async {
                    match prompt_at {
                        Some(at) => sleep_until(at).await,
                        None => changes.notified().await,
                    }
                } => {
                    if prompt_at.take().is_some() {
                        if changes.generation() != last_report.1 {
                            self.send_report(tx, &mut reported, &mut last_report);
                        }
                    } else if changes.generation() != last_report.1 {
                        prompt_at = Some(last_report.0 + self.settings.min_report_gap);
                    }
                }
            }
        }
    }

    /// Ends a stream on which a message could not be received (larger than
    /// [`MAX_MESSAGE_BYTES`], or a server that could not encode it). The stream cannot go
    /// on past it, and reconnecting at once would receive the same message again: the end
    /// counts as a failed attempt, so the reconnects back off. When a heartbeat announced a
    /// revision newer than the applied one, that revision is what did not arrive: it is
    /// NACKed with the reason, which a server records and never sends to this instance
    /// again.
    fn undeliverable(&self, tx: &mpsc::Sender<AgentMessage>, announced: u64, status: &Status) -> Ended {
        let error = format!(
            "a message from the server could not be received (this agent receives at most {MAX_MESSAGE_BYTES} \
             bytes): {}",
            status.message()
        );
        let applied = self.shared.current.load().revision;
        tracing::warn!(
            environment = %self.shared.environment,
            service = %self.shared.service,
            announced,
            applied,
            error = %error,
            "levee sync message could not be received; keeping the last good configuration"
        );
        if announced > applied {
            self.shared.set_nack(announced, error.clone());
            let nack = Nack {
                service: self.shared.service.clone(),
                revision: announced,
                nonce: 0,
                error_detail: error.clone(),
            };
            let _ = tx.try_send(AgentMessage { kind: Some(agent_message::Kind::Nack(nack)) });
        }
        Ended::Dropped { received: false, error }
    }

    /// Sends a status report now when the applied revision or its source changed since the
    /// last one (`reported`), instead of waiting for the next periodic report.
    fn report_if_changed(
        &self,
        tx: &mpsc::Sender<AgentMessage>,
        reported: &mut Option<(u64, String)>,
        last_report: &mut (Instant, u64),
    ) {
        let current = self.shared.current.load();
        let now = (current.revision, current.source.as_str());
        if reported.as_ref().is_some_and(|(r, s)| (*r, s.as_str()) == now) {
            return;
        }
        drop(current);
        self.send_report(tx, reported, last_report);
    }

    /// Sends a status report now and notes what it covers: the applied revision and source
    /// (`reported`), and when it was built with which generation of
    /// [`StatusChanges`](crate::applied::StatusChanges) (`last_report`; read before the
    /// report is built, so a change during the build is reported again, never missed).
    fn send_report(
        &self,
        tx: &mpsc::Sender<AgentMessage>,
        reported: &mut Option<(u64, String)>,
        last_report: &mut (Instant, u64),
    ) {
        let generation = self.shared.status_changes.generation();
        let report = self.shared.status_report();
        *reported = Some((report.applied_revision, report.source.clone()));
        *last_report = (Instant::now(), generation);
        if tx.try_send(AgentMessage { kind: Some(agent_message::Kind::Status(report)) }).is_err() {
            tracing::debug!("status report dropped: the outbound queue is full");
        }
    }

    /// Judges and applies one snapshot, then queues its answer. Applying never waits for
    /// the disk: the cache write and the ACK happen on the stream's answer task, so a slow
    /// `fsync` cannot delay the next snapshot (a kill switch flipped right after another
    /// change still takes effect at once). An `Err` ends the stream (the answer could not
    /// be queued: the server is not reading).
    fn on_snapshot(
        &self,
        answers: &mpsc::Sender<Answer>,
        snap: crate::proto::Snapshot,
    ) -> Result<(), String> {
        let (service, revision, nonce) = (snap.service.clone(), snap.revision, snap.nonce);
        let ack = Ack { service: service.clone(), revision, nonce };
        let answer = match judge(&self.shared, &snap, Instant::now(), Timestamp::now()) {
            Verdict::Apply(applied) => {
                let body = applied.body.clone();
                let hash = applied.hash.clone();
                self.shared.install_live(applied);
                tracing::info!(service = %service, revision, "levee configuration applied");
                match body {
                    Some(body) if self.shared.cache.is_some() => {
                        Answer::PersistThenAck { revision, hash, body, ack }
                    }
                    _ => Answer::Send(agent_message::Kind::Ack(ack)),
                }
            }
            Verdict::AlreadyApplied => {
                self.shared.confirm(revision);
                Answer::Send(agent_message::Kind::Ack(ack))
            }
            Verdict::Reject(error_detail) => {
                tracing::warn!(service = %service, revision, reason = %error_detail, "levee snapshot rejected; keeping the last good configuration");
                self.shared.set_nack(revision, error_detail.clone());
                Answer::Send(agent_message::Kind::Nack(Nack { service, revision, nonce, error_detail }))
            }
        };
        answers
            .try_send(answer)
            .map_err(|_| "the outbound queue is full: the server is not reading the stream".to_string())
    }

    /// Starts the task that persists applied snapshots and sends the answers, one at a
    /// time in arrival order. It ends when the session drops its sender, after finishing
    /// what is queued (a write in progress is never abandoned half-way).
    fn spawn_answer_task(
        &self,
        tx: mpsc::Sender<AgentMessage>,
        mut ended: watch::Receiver<bool>,
    ) -> (mpsc::Sender<Answer>, tokio::task::JoinHandle<()>) {
        let (answers, mut queue) = mpsc::channel::<Answer>(OUTBOUND_QUEUE);
        let cache = self.shared.cache.clone();
        let task = tokio::spawn(async move {
            let mut stream_open = true;
            while let Some(answer) = queue.recv().await {
                let kind = match answer {
                    Answer::Send(kind) => kind,
                    Answer::PersistThenAck { revision, hash, body, ack } => {
                        if let Some(cache) = cache.clone() {
                            let written = tokio::task::spawn_blocking(move || {
                                cache.store(revision, &hash, &body, Timestamp::now()).map(|_| ())
                            })
                            .await;
                            if let Ok(Err(e)) = written {
                                // Already logged and counted; the configuration is applied in memory.
                                tracing::debug!(error = %e, "snapshot applied but not persisted");
                            }
                        }
                        agent_message::Kind::Ack(ack)
                    }
                };
                // Once the stream is gone, later answers are dropped but later snapshots are
                // still persisted; a reconnect's Hello reports the applied revision.
                if stream_open && !*ended.borrow() {
                    let message = AgentMessage { kind: Some(kind) };
                    stream_open = tokio::select! {
                        sent = tx.send(message) => sent.is_ok(),
                        _ = ended.changed() => false,
                    };
                }
            }
        });
        (answers, task)
    }
}

/// Whether `status` says a message was too large to receive or to send (tonic's limits on
/// either side), rather than that the stream failed.
fn undeliverable(status: &Status) -> bool {
    matches!(status.code(), Code::OutOfRange | Code::ResourceExhausted)
}

fn ended_by(status: Status, received: bool) -> Ended {
    match status.code() {
        Code::Unauthenticated | Code::PermissionDenied => {
            Ended::Unauthorized(format!("{:?}: {}", status.code(), status.message()))
        }
        code => {
            Ended::Dropped { received, error: format!("sync stream failed: {code:?}: {}", status.message()) }
        }
    }
}

/// Keeps the flag and kill-switch slots current as time passes (sleeps until the next
/// expiry or stale deadline, then re-resolves; woken early whenever the state changed) and
/// refreshes the staleness gauges every `metrics_interval`, connected or not.
pub(crate) async fn run_housekeeping(
    shared: Arc<Shared>,
    metrics_interval: Duration,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut metrics_tick = tokio::time::interval_at(Instant::now() + metrics_interval, metrics_interval);
    metrics_tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
    loop {
        let next = shared.next_wake();
        tokio::select! {
            _ = async {
                match next {
                    Some(at) => sleep_until(at).await,
                    None => std::future::pending().await,
                }
            } => shared.refresh(),
            _ = shared.wake.notified() => {}
            _ = metrics_tick.tick() => shared.update_metrics(),
            _ = shutdown.changed() => return,
        }
    }
}

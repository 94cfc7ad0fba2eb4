//! Batched persistence of agent state (connections, ACKs, NACKs, status reports) and the
//! liveness leases of this replica's streams.
//!
//! Streams hand events to a bounded channel; one task collects them for at most
//! [`FLUSH_INTERVAL`], keeps only the newest state of each agent (10,000 agents ACKing a
//! flip and reporting status are 10,000 rows, however many events they sent) and writes
//! them as multi-row upserts (`Store::write_fleet`: one transaction on PostgreSQL; on
//! SQLite one statement per turn of the store's write lock, so a revision written during a
//! flip's flood of ACKs waits for one statement, not the batch). A batch the database
//! refused (it is away) is kept and merged with what arrives meanwhile, then written once
//! it is back: nothing an agent acknowledged is lost to an outage.
//!
//! Liveness is a lease: every row this replica writes carries its id and a lease (default
//! [`LEASE_TTL`]), renewed every third of it by one `UPDATE` for all its connected agents.
//! A replica that is killed stops renewing, so its agents stop counting as connected
//! within one lease.

use std::collections::HashMap;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio::time::Instant;

use crate::db::{AckRow, AgentUpsert, FleetEvent, NackRow, Store, now_ms};

/// Longest time an event waits before it is written.
pub const FLUSH_INTERVAL: Duration = Duration::from_millis(250);
/// Events buffered before new ones are dropped (status reports only matter when fresh).
pub const QUEUE_CAPACITY: usize = 100_000;
/// Most events collected into one batch before it is written.
pub const BATCH: usize = 20_000;
/// Default lifetime of an agent's liveness lease (`LEVEE_AGENT_LEASE`); it is renewed
/// every third of it, so two renewals may fail in a row.
pub const LEASE_TTL: Duration = Duration::from_secs(30);
/// First wait before retrying a batch the database refused; doubles up to
/// [`RETRY_MAX`].
pub const RETRY_MIN: Duration = Duration::from_millis(200);
/// Longest wait between retries of a refused batch.
pub const RETRY_MAX: Duration = Duration::from_secs(2);

/// Sender side. Cheap to clone.
#[derive(Clone, Debug)]
pub struct FleetWriter {
    tx: mpsc::Sender<FleetEvent>,
}

/// Agent state not written yet: the newest upsert per agent, the NACKs and ACKs in order.
#[derive(Default)]
struct Pending {
    upserts: HashMap<(String, String, String), AgentUpsert>,
    nacks: Vec<NackRow>,
    acks: Vec<AckRow>,
}

impl Pending {
    fn add(&mut self, ev: FleetEvent) {
        match ev {
            FleetEvent::Upsert(a) => {
                let key = (a.environment.clone(), a.service.clone(), a.instance_id.clone());
                match self.upserts.get_mut(&key) {
                    Some(old) => {
                        // The newer event wins; a status report it does not carry is kept.
                        let status = a.status.clone().or_else(|| old.status.take());
                        *old = AgentUpsert { status, ..a };
                    }
                    None => {
                        self.upserts.insert(key, a);
                    }
                }
            }
            FleetEvent::Nack(n) => self.nacks.push(n),
            FleetEvent::Ack(a) => self.acks.push(a),
        }
    }

    fn len(&self) -> usize {
        self.upserts.len() + self.nacks.len() + self.acks.len()
    }
}

impl FleetWriter {
    /// Starts the writer task for the replica named `replica` (its id in the lease
    /// columns). It ends when every sender is gone, after a last attempt to write what it
    /// holds.
    pub fn spawn(
        store: Store,
        replica: String,
        lease: Duration,
    ) -> (FleetWriter, tokio::task::JoinHandle<()>) {
        let (tx, rx) = mpsc::channel::<FleetEvent>(QUEUE_CAPACITY);
        let handle = tokio::spawn(run(store, replica, lease, rx));
        (FleetWriter { tx }, handle)
    }

    /// A writer whose events are only queued, for tests to read what was handed over.
    #[cfg(test)]
    pub(crate) fn queue_only(capacity: usize) -> (FleetWriter, mpsc::Receiver<FleetEvent>) {
        let (tx, rx) = mpsc::channel(capacity);
        (FleetWriter { tx }, rx)
    }

    /// Queues an event; drops it (with a metric) when the queue is full.
    pub fn send(&self, ev: FleetEvent) {
        if self.tx.try_send(ev).is_err() {
            metrics::counter!("levee_server_fleet_events_dropped_total").increment(1);
        }
    }
}

async fn run(store: Store, replica: String, lease: Duration, mut rx: mpsc::Receiver<FleetEvent>) {
    let renew_every = lease / 3;
    let lease_until = || now_ms() + lease.as_millis() as i64;
    let mut pending = Pending::default();
    let mut retry = RETRY_MIN;
    let mut next_renewal = Instant::now() + renew_every;
    let mut open = true;
    loop {
        // Collect: wait for a first event (or a renewal), then for more until the flush
        // deadline. A batch waiting for the database retries on its own timer.
        let flush_at = if pending.len() > 0 { Some(Instant::now() + retry) } else { None };
        let mut deadline = None;
        while open && pending.len() < BATCH {
            let wake = match (deadline, flush_at) {
                (Some(d), _) => d,
                (None, Some(f)) => f.min(next_renewal),
                (None, None) => next_renewal,
            };
            match tokio::time::timeout_at(wake, rx.recv()).await {
                Ok(Some(ev)) => {
                    pending.add(ev);
                    if deadline.is_none() {
                        deadline = Some(Instant::now() + FLUSH_INTERVAL);
                    }
                }
                Ok(None) => open = false,
                Err(_) => break,
            }
        }
        if Instant::now() >= next_renewal {
            next_renewal = Instant::now() + renew_every;
            if let Err(e) = store.renew_leases(&replica, lease_until()).await {
                tracing::warn!(error = %levee_agent::report::ErrorChain(e.as_ref()), "renewing agent leases");
            }
        }
        if pending.len() > 0 {
            let upserts: Vec<AgentUpsert> = pending.upserts.values().cloned().collect();
            match store.write_fleet(&upserts, &pending.nacks, &pending.acks, &replica, lease_until()).await {
                Ok(()) => {
                    metrics::counter!("levee_server_fleet_rows_written_total")
                        .increment(pending.len() as u64);
                    pending = Pending::default();
                    retry = RETRY_MIN;
                }
                Err(e) => {
                    tracing::warn!(
                        error = %levee_agent::report::ErrorChain(e.as_ref()),
                        rows = pending.len(),
                        retry_in = ?retry,
                        "writing fleet state failed; kept to retry"
                    );
                    metrics::counter!("levee_server_fleet_write_failures_total").increment(1);
                    retry = (retry * 2).min(RETRY_MAX);
                }
            }
        }
        // Every sender is gone (the server stops): one last attempt was made above.
        if !open {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn up(instance: &str, rev: u64, status: Option<&str>) -> FleetEvent {
        FleetEvent::Upsert(AgentUpsert {
            environment: "prod".into(),
            service: "checkout".into(),
            instance_id: instance.into(),
            agent_version: "t".into(),
            connected: true,
            connected_at: 1,
            last_seen: rev as i64,
            applied_revision: rev,
            applied_hash: format!("h{rev}"),
            status: status.map(str::to_string),
        })
    }

    /// Many events of one agent are one row: the newest, keeping the last status report.
    #[test]
    fn events_of_one_agent_coalesce_into_its_newest_state() {
        let mut p = Pending::default();
        p.add(up("a", 1, Some("{\"s\":1}")));
        p.add(up("a", 2, None));
        p.add(up("b", 1, None));
        p.add(up("a", 3, None));
        assert_eq!(p.upserts.len(), 2);
        let a = &p.upserts[&("prod".into(), "checkout".into(), "a".into())];
        assert_eq!(a.applied_revision, 3);
        assert_eq!(a.status.as_deref(), Some("{\"s\":1}"));
    }

    /// On SQLite, a writer that asks for the store's write lock while the fleet writer stores
    /// a large batch gets it after one statement of the batch, not after all of it: a flip
    /// written during the flood of a fleet's ACKs waits for at most
    /// `FLEET_ROWS_PER_SQLITE_TURN` rows. (The test holds the lock first, so the fleet writer
    /// queues, then the other writer; the lock is fair.)
    #[tokio::test(flavor = "current_thread")]
    async fn a_writer_waiting_on_a_fleet_batch_goes_after_one_statement() {
        use crate::db::FLEET_ROWS_PER_SQLITE_TURN as TURN;
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite://{}?mode=rwc", dir.path().join("t.db").display());
        let store = Store::connect(&url).await.unwrap();
        let n = 3 * TURN;
        let rows: Vec<AgentUpsert> = (0..n)
            .map(|i| match up(&format!("agent-{i}"), 1, None) {
                FleetEvent::Upsert(a) => a,
                _ => unreachable!(),
            })
            .collect();
        let held = store.write_guard().await;
        let fleet = tokio::spawn({
            let store = store.clone();
            async move { store.write_fleet(&rows, &[], &[], "r1", i64::MAX).await }
        });
        // current_thread: the spawned task runs until it waits for the lock.
        tokio::task::yield_now().await;
        let other = tokio::spawn({
            let store = store.clone();
            async move {
                let _turn = store.write_guard().await;
                store.agents("prod", "checkout").await.unwrap().len()
            }
        });
        tokio::task::yield_now().await;
        drop(held);
        assert_eq!(other.await.unwrap(), TURN, "the other writer went after one statement");
        fleet.await.unwrap().unwrap();
        assert_eq!(store.agents("prod", "checkout").await.unwrap().len(), n);
    }

    /// 1,500 agents, three events each, through the writer: every agent is stored once with
    /// its newest state, and the fleet read returns all of them (no cap at 1,000).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn fleet_of_1500_agents_is_written_and_read_whole() {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite://{}?mode=rwc", dir.path().join("t.db").display());
        let store = Store::connect(&url).await.unwrap();
        let (writer, task) = FleetWriter::spawn(store.clone(), "r1".into(), LEASE_TTL);
        for rev in 1..=3 {
            for i in 0..1_500 {
                writer.send(up(&format!("agent-{i}"), rev, None));
            }
        }
        drop(writer);
        task.await.unwrap();
        let agents = store.agents("prod", "checkout").await.unwrap();
        assert_eq!(agents.len(), 1_500);
        assert!(agents.iter().all(|a| a.connected && a.applied_revision == 3));
    }
}

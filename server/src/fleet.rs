//! Batched persistence of agent state (connections, ACKs, NACKs, status reports).
//!
//! Streams hand events to a bounded channel; one task writes them in a single transaction
//! at least every [`FLUSH_INTERVAL`], so 10,000 agents ACKing a change cost a handful of
//! transactions, not 10,000.

use std::time::Duration;

use tokio::sync::mpsc;

use crate::db::{FleetEvent, Store};

/// Longest time an event waits before it is written.
pub const FLUSH_INTERVAL: Duration = Duration::from_millis(250);
/// Events buffered before new ones are dropped (status reports only matter when fresh).
pub const QUEUE_CAPACITY: usize = 100_000;
/// Most events per transaction.
pub const BATCH: usize = 2_000;

/// Sender side. Cheap to clone.
#[derive(Clone, Debug)]
pub struct FleetWriter {
    tx: mpsc::Sender<FleetEvent>,
}

impl FleetWriter {
    /// Starts the writer task.
    pub fn spawn(store: Store) -> (FleetWriter, tokio::task::JoinHandle<()>) {
        let (tx, mut rx) = mpsc::channel::<FleetEvent>(QUEUE_CAPACITY);
        let handle = tokio::spawn(async move {
            let mut batch = Vec::with_capacity(BATCH);
            loop {
                let Some(first) = rx.recv().await else { break };
                batch.push(first);
                let deadline = tokio::time::Instant::now() + FLUSH_INTERVAL;
                while batch.len() < BATCH {
                    match tokio::time::timeout_at(deadline, rx.recv()).await {
                        Ok(Some(ev)) => batch.push(ev),
                        Ok(None) | Err(_) => break,
                    }
                }
                if let Err(e) = store.write_fleet(&batch).await {
                    tracing::error!(error = ?e, events = batch.len(), "writing fleet state");
                }
                batch.clear();
            }
        });
        (FleetWriter { tx }, handle)
    }

    /// Queues an event; drops it (with a metric) when the queue is full.
    pub fn send(&self, ev: FleetEvent) {
        if self.tx.try_send(ev).is_err() {
            metrics::counter!("levee_server_fleet_events_dropped_total").increment(1);
        }
    }
}

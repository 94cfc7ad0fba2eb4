//! In-process fan-out of new snapshots to the sync streams of this replica.
//!
//! Every (environment, service) has a `watch` channel holding its newest snapshot. Writers
//! publish after commit (or the PostgreSQL listener does, for changes committed by another
//! replica); each agent stream waits on the channels of its services. A `watch` keeps only
//! the newest value, so a burst of edits coalesces into one push of the latest revision per
//! stream, and a slow stream never holds back the others.

use std::collections::HashMap;
use std::sync::Arc;

use tokio::sync::watch;

use crate::db::SnapshotRow;

type Slot = watch::Sender<Option<Arc<SnapshotRow>>>;

/// The fan-out hub. Cheap to clone.
#[derive(Clone, Debug, Default)]
pub struct Hub {
    // A short, non-async critical section; never held across an await.
    #[allow(clippy::disallowed_types)]
    slots: Arc<std::sync::RwLock<HashMap<(String, String), Slot>>>,
}

impl Hub {
    /// Receiver of the newest snapshot of a service (None until one is published).
    pub fn subscribe(&self, env: &str, service: &str) -> watch::Receiver<Option<Arc<SnapshotRow>>> {
        let key = (env.to_string(), service.to_string());
        if let Some(tx) = self.slots.read().unwrap_or_else(|e| e.into_inner()).get(&key) {
            return tx.subscribe();
        }
        let mut map = self.slots.write().unwrap_or_else(|e| e.into_inner());
        map.entry(key).or_insert_with(|| watch::channel(None).0).subscribe()
    }

    /// Publishes a snapshot unless a newer one is already there. Returns whether it was
    /// published.
    pub fn publish(&self, snap: SnapshotRow) -> bool {
        let key = (snap.environment.clone(), snap.service.clone());
        let tx = {
            let mut map = self.slots.write().unwrap_or_else(|e| e.into_inner());
            map.entry(key).or_insert_with(|| watch::channel(None).0).clone()
        };
        let snap = Arc::new(snap);
        tx.send_if_modified(|cur| match cur {
            Some(c) if c.revision >= snap.revision => false,
            _ => {
                *cur = Some(snap.clone());
                true
            }
        })
    }

    /// Newest published revision of a service, if any.
    pub fn current(&self, env: &str, service: &str) -> Option<Arc<SnapshotRow>> {
        let key = (env.to_string(), service.to_string());
        self.slots.read().unwrap_or_else(|e| e.into_inner()).get(&key).and_then(|tx| tx.borrow().clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn snap(rev: u64) -> SnapshotRow {
        SnapshotRow {
            environment: "prod".into(),
            service: "checkout".into(),
            revision: rev,
            hash: format!("h{rev}"),
            body: "{}".into(),
            created_at: 0,
        }
    }

    #[tokio::test]
    async fn older_revisions_never_replace_newer() {
        let hub = Hub::default();
        let mut rx = hub.subscribe("prod", "checkout");
        assert!(hub.publish(snap(3)));
        assert!(!hub.publish(snap(2)));
        rx.changed().await.unwrap();
        assert_eq!(rx.borrow_and_update().as_ref().unwrap().revision, 3);
        assert!(hub.publish(snap(4)));
        assert_eq!(hub.current("prod", "checkout").unwrap().revision, 4);
    }
}

//! In-process fan-out of new snapshots to the sync streams of this replica.
//!
//! Every (environment, service) has a `watch` channel holding its newest snapshot. Writers
//! publish after commit (or the PostgreSQL listener does, for changes committed by another
//! replica); each agent stream waits on the channels of its services. A `watch` keeps only
//! the newest value, so a burst of edits coalesces into one push of the latest revision per
//! stream, and a slow stream never holds back the others.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use tokio::sync::watch;

use crate::db::{Delivery, RolloutRow, SnapshotRow};

type Slot = watch::Sender<Option<Arc<SnapshotRow>>>;
type RolloutSlot = watch::Sender<Option<Arc<RolloutView>>>;

/// A service's newest rollout as this replica knows it, with the snapshot served outside
/// its cohort while it is in progress (`stable`). A stream chooses each instance's
/// revision from it and the newest snapshot without the database.
#[derive(Clone, Debug)]
pub struct RolloutView {
    pub row: RolloutRow,
    pub stable: Option<Arc<SnapshotRow>>,
}

/// The fan-out hub. Cheap to clone.
#[derive(Clone, Debug, Default)]
pub struct Hub {
    // A short, non-async critical section; never held across an await.
    #[allow(clippy::disallowed_types)]
    slots: Arc<std::sync::RwLock<HashMap<(String, String), Slot>>>,
    // Same as `slots`.
    #[allow(clippy::disallowed_types)]
    rollouts: Arc<std::sync::RwLock<HashMap<(String, String), RolloutSlot>>>,
    revocations: Revocations,
}

/// Token ids revoked since this replica started, so agent streams opened with one of them
/// end at once (SEC-3). Filled by the revoke action on this replica and by
/// `listener::follow_revocations` for every replica; the set only grows (revocations are
/// rare, and a revoked token never comes back). Cheap to clone.
#[derive(Clone, Debug)]
pub struct Revocations {
    tx: Arc<watch::Sender<Arc<HashSet<String>>>>,
}

impl Default for Revocations {
    fn default() -> Self {
        Revocations { tx: Arc::new(watch::channel(Arc::new(HashSet::new())).0) }
    }
}

impl Revocations {
    /// Adds revoked token ids; streams watching are woken only when one is new.
    pub fn revoke(&self, ids: impl IntoIterator<Item = String>) {
        let ids: Vec<String> = ids.into_iter().collect();
        self.tx.send_if_modified(|set| {
            let new: Vec<&String> = ids.iter().filter(|id| !set.contains(*id)).collect();
            if new.is_empty() {
                return false;
            }
            let mut next = HashSet::clone(set);
            next.extend(new.into_iter().cloned());
            *set = Arc::new(next);
            true
        });
    }

    /// The set of revoked ids, to wait on.
    pub fn watch(&self) -> watch::Receiver<Arc<HashSet<String>>> {
        self.tx.subscribe()
    }

    /// Whether `id` was revoked since this replica started.
    pub fn is_revoked(&self, id: &str) -> bool {
        self.tx.borrow().contains(id)
    }
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

    /// Receiver of the newest rollout of a service (None until one is published).
    pub fn subscribe_rollout(&self, env: &str, service: &str) -> watch::Receiver<Option<Arc<RolloutView>>> {
        let key = (env.to_string(), service.to_string());
        if let Some(tx) = self.rollouts.read().unwrap_or_else(|e| e.into_inner()).get(&key) {
            return tx.subscribe();
        }
        let mut map = self.rollouts.write().unwrap_or_else(|e| e.into_inner());
        map.entry(key).or_insert_with(|| watch::channel(None).0).subscribe()
    }

    /// Publishes a rollout as it is now, unless this replica knows a newer one of the
    /// service (a higher id, or the same at a higher version). Returns whether it was
    /// published.
    pub fn publish_rollout(&self, row: RolloutRow, stable: Option<SnapshotRow>) -> bool {
        let key = (row.environment.clone(), row.service.clone());
        let tx = {
            let mut map = self.rollouts.write().unwrap_or_else(|e| e.into_inner());
            map.entry(key).or_insert_with(|| watch::channel(None).0).clone()
        };
        let view = Arc::new(RolloutView { row, stable: stable.map(Arc::new) });
        tx.send_if_modified(|cur| match cur {
            Some(c) if (c.row.id, c.row.version) >= (view.row.id, view.row.version) => false,
            _ => {
                *cur = Some(view.clone());
                true
            }
        })
    }

    /// The newest rollout of a service this replica knows.
    pub fn rollout(&self, env: &str, service: &str) -> Option<Arc<RolloutView>> {
        let key = (env.to_string(), service.to_string());
        self.rollouts.read().unwrap_or_else(|e| e.into_inner()).get(&key).and_then(|tx| tx.borrow().clone())
    }

    /// The services whose rollout this replica holds as in progress.
    pub fn rollouts_in_progress(&self) -> Vec<(String, String)> {
        let map = self.rollouts.read().unwrap_or_else(|e| e.into_inner());
        map.iter()
            .filter(|(_, tx)| tx.borrow().as_ref().is_some_and(|v| v.row.active()))
            .map(|(k, _)| k.clone())
            .collect()
    }

    /// Publishes what the database says a service delivers: its rollout first, so that a
    /// stream woken by the snapshot already knows which instances it is for.
    pub fn publish_delivery(&self, d: Delivery) {
        if let Some((row, stable)) = d.rollout {
            self.publish_rollout(row, stable);
        }
        if let Some(latest) = d.latest {
            self.publish(latest);
        }
    }

    /// Revoked token ids.
    pub fn revocations(&self) -> &Revocations {
        &self.revocations
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
    async fn revocations_wake_watchers_only_for_new_ids() {
        let hub = Hub::default();
        let mut rx = hub.revocations().watch();
        hub.revocations().revoke(["a".to_string()]);
        assert!(rx.has_changed().unwrap());
        assert!(rx.borrow_and_update().contains("a"));
        hub.revocations().revoke(["a".to_string()]);
        assert!(!rx.has_changed().unwrap());
        assert!(hub.clone().revocations().is_revoked("a"));
        assert!(!hub.revocations().is_revoked("b"));
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

//! Cross-replica fan-out on PostgreSQL: `LISTEN levee_changes` on a dedicated connection.
//!
//! Writers `NOTIFY` inside their transaction (delivered after commit). A notification can
//! be lost while the listener reconnects, so on every (re)connect the listener first
//! LISTENs, then catches up by comparing every service's current revision with what this
//! replica has published; a periodic safety-net poll does the same.

use std::time::Duration;

use sqlx::postgres::PgListener;
use tokio::sync::watch;

use crate::db::{NOTIFY_CHANNEL, Store};
use crate::hub::Hub;

/// Period of the safety-net poll.
pub const SAFETY_POLL: Duration = Duration::from_secs(15);
/// Longest wait between attempts to reconnect the `LISTEN` connection (a database back
/// from an outage is caught up with within about this long).
pub const RECONNECT_MAX: Duration = Duration::from_secs(2);

/// Publishes every service whose stored revision is newer than the hub's, and every
/// rollout whose stored state differs from the hub's (with the snapshot it serves).
pub async fn catch_up(store: &Store, hub: &Hub) -> anyhow::Result<usize> {
    let mut n = 0;
    for (env, svc, rev) in store.current_revisions().await? {
        if hub.current(&env, &svc).is_none_or(|s| s.revision < rev) {
            hub.publish_delivery(store.delivery(&env, &svc).await?);
            n += 1;
        }
    }
    // Rollouts in progress as stored, and those this replica still holds in progress (which
    // may have ended without a new revision: completed).
    let mut stale: Vec<(String, String)> = store
        .active_rollouts()
        .await?
        .into_iter()
        .filter(|r| {
            hub.rollout(&r.environment, &r.service)
                .is_none_or(|v| (v.row.id, v.row.version) != (r.id, r.version))
        })
        .map(|r| (r.environment, r.service))
        .collect();
    stale.extend(hub.rollouts_in_progress());
    stale.sort();
    stale.dedup();
    for (env, svc) in stale {
        hub.publish_delivery(store.delivery(&env, &svc).await?);
        n += 1;
    }
    Ok(n)
}

async fn caught_up(store: &Store, hub: &Hub, what: &str) -> bool {
    match catch_up(store, hub).await {
        Ok(n) => {
            if n > 0 {
                tracing::info!(services = n, "{what}: published changes committed elsewhere");
            }
            true
        }
        Err(e) => {
            tracing::warn!(error = %levee_agent::report::ErrorChain(e.as_ref()), "{what} failed");
            false
        }
    }
}

/// Publishes the snapshot a notification names. `false` when it could not be loaded (the
/// caller catches up soon instead).
async fn publish_one(store: &Store, hub: &Hub, payload: &str) -> bool {
    let v: serde_json::Value = match serde_json::from_str(payload) {
        Ok(v) => v,
        Err(_) => return true,
    };
    let (Some(env), Some(svc)) = (v["environment"].as_str(), v["service"].as_str()) else {
        return true;
    };
    // A new revision this replica has already, and no word of a rollout: nothing to load.
    let rollout = v["rollout"].as_bool().unwrap_or(false);
    if !rollout
        && v["revision"].as_u64().is_some_and(|rev| hub.current(env, svc).is_some_and(|s| s.revision >= rev))
    {
        return true;
    }
    match store.delivery(env, svc).await {
        Ok(d) => {
            hub.publish_delivery(d);
            true
        }
        Err(e) => {
            tracing::warn!(error = %levee_agent::report::ErrorChain(e.as_ref()), "loading a notified snapshot");
            false
        }
    }
}

/// Runs the listener until shutdown.
pub async fn run(url: String, store: Store, hub: Hub, mut shutdown: watch::Receiver<bool>) {
    let mut backoff = Duration::from_millis(200);
    loop {
        if crate::shutdown::is_stopped(&shutdown) {
            return;
        }
        let mut listener = match PgListener::connect(&url).await {
            Ok(l) => l,
            Err(e) => {
                tracing::warn!(error = %e, "LISTEN connection failed; retrying");
                tokio::select! {
                    _ = tokio::time::sleep(backoff) => {}
                    _ = crate::shutdown::stopped(&mut shutdown) => return,
                }
                backoff = (backoff * 2).min(RECONNECT_MAX);
                continue;
            }
        };
        backoff = Duration::from_millis(200);
        if let Err(e) = listener.listen(NOTIFY_CHANNEL).await {
            tracing::warn!(error = %e, "LISTEN failed; reconnecting");
            tokio::select! {
                _ = tokio::time::sleep(RECONNECT_MAX) => {}
                _ = crate::shutdown::stopped(&mut shutdown) => return,
            }
            continue;
        }
        // LISTEN first, then catch up: nothing committed from here on can be missed. A
        // catch-up that failed (the pool is still reconnecting) is retried soon, not at the
        // next safety-net poll.
        let poll_after =
            |ok: bool| tokio::time::Instant::now() + if ok { SAFETY_POLL } else { RECONNECT_MAX };
        let mut next_poll = poll_after(caught_up(&store, &hub, "catch-up after LISTEN").await);
        loop {
            tokio::select! {
                n = listener.try_recv() => match n {
                    Ok(Some(n)) => {
                        if !publish_one(&store, &hub, n.payload()).await {
                            next_poll = poll_after(false);
                        }
                    }
                    // The connection dropped: notifications may be lost; catch up after re-LISTEN.
                    Ok(None) => break,
                    Err(e) => {
                        tracing::warn!(error = %e, "LISTEN connection error");
                        break;
                    }
                },
                _ = tokio::time::sleep_until(next_poll) => {
                    next_poll = poll_after(caught_up(&store, &hub, "safety-net poll").await);
                }
                _ = crate::shutdown::stopped(&mut shutdown) => return,
            }
        }
    }
}

/// How often every replica reads the tokens revoked lately, so an agent stream opened with
/// a token revoked through another replica ends within this period (SEC-3).
pub const REVOCATION_POLL: Duration = Duration::from_secs(2);

/// Margin read back on every poll, covering commits that land out of order and replicas
/// whose clocks differ (ids seen twice are ignored).
const REVOCATION_OVERLAP_MS: i64 = 60_000;

/// Feeds the hub's [`Revocations`](crate::hub::Revocations) from the database until
/// `shutdown`: one query per [`REVOCATION_POLL`] per replica, whatever the number of streams.
pub async fn follow_revocations(store: Store, hub: Hub, mut shutdown: watch::Receiver<bool>) {
    let mut since = crate::db::now_ms() - REVOCATION_OVERLAP_MS;
    loop {
        match store.tokens_revoked_since(since).await {
            Ok(rows) => {
                if let Some(newest) = rows.iter().map(|(_, at)| *at).max() {
                    since = since.max(newest - REVOCATION_OVERLAP_MS);
                }
                hub.revocations().revoke(rows.into_iter().map(|(id, _)| id));
            }
            Err(e) => {
                tracing::warn!(error = %levee_agent::report::ErrorChain(e.as_ref()), "reading revoked tokens")
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(REVOCATION_POLL) => {}
            _ = crate::shutdown::stopped(&mut shutdown) => return,
        }
    }
}

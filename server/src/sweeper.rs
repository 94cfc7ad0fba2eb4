//! The expiry sweeper: a task that runs the expiry action (`Actions::expire`) every
//! [`EXPIRY_SWEEP_INTERVAL`] and drives staged rollouts every `rollout_interval`
//! (`Settings::rollout_interval`, default [`ROLLOUT_INTERVAL`]) until shutdown.

use std::time::Duration;

use levee_agent::policy::Timestamp;
use tokio::sync::watch;

use crate::actions::Actions;
use crate::db::{RolloutRow, Store};
use crate::health::Health;
use crate::rollout;
use crate::shutdown::stopped;

/// How often expired flags, fault rules and breaker overrides are removed.
pub const EXPIRY_SWEEP_INTERVAL: Duration = Duration::from_secs(1);
/// How often rollouts in progress are judged and moved on, unless the settings say.
pub const ROLLOUT_INTERVAL: Duration = Duration::from_secs(1);

/// Runs until `shutdown` is set; rollouts are judged every `rollout_interval` on the
/// agents' health as `health` and `store` hold it, and one the server halts is POSTed to
/// `webhook`.
pub async fn run(
    actions: Actions,
    health: Health,
    store: Store,
    webhook: Option<String>,
    rollout_interval: Duration,
    mut shutdown: watch::Receiver<bool>,
) {
    let client = reqwest::Client::new();
    let mut expiry = tokio::time::interval(EXPIRY_SWEEP_INTERVAL);
    expiry.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut rollouts = tokio::time::interval(rollout_interval);
    rollouts.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = expiry.tick() => expire(&actions).await,
            _ = rollouts.tick() => drive(&actions, &health, &store, webhook.as_deref(), &client).await,
            _ = stopped(&mut shutdown) => return,
        }
    }
}

async fn expire(actions: &Actions) {
    // Profiles first: their revert restores what their entries replaced, which the
    // expiry of single entries would otherwise just remove.
    if let Err(e) = actions.expire_profiles(Timestamp::now()).await {
        tracing::warn!(error = ?e, "profile expiry query failed");
    }
    if let Err(e) = actions.run_due_changes(Timestamp::now()).await {
        tracing::warn!(error = ?e, "scheduled changes query failed");
    }
    if let Err(e) = actions.expire(Timestamp::now()).await {
        tracing::warn!(error = ?e, "expiry sweep query failed");
    }
}

/// Staged rollouts: halts first (in the same turn as the stage that baked), then stages,
/// each judged on the cohort's health against the rest's and on its NACKs.
async fn drive(
    actions: &Actions,
    health: &Health,
    store: &Store,
    webhook: Option<&str>,
    client: &reqwest::Client,
) {
    let now = Timestamp::now().unix_ms();
    let sides = |r: RolloutRow| {
        let (health, store) = (health.clone(), store.clone());
        async move { rollout::sides(&health, &store, &r, now).await }
    };
    match actions.drive_rollouts(now, sides).await {
        Ok(halted) => {
            for h in halted {
                if let Some(url) = webhook.map(str::to_string) {
                    let client = client.clone();
                    tokio::spawn(async move { crate::alerts::deliver(&client, &url, &h).await });
                }
            }
        }
        Err(e) => tracing::warn!(error = ?e, "rollouts query failed"),
    }
}

//! The expiry sweeper: a task that runs the expiry action (`Actions::expire`) every
//! [`EXPIRY_SWEEP_INTERVAL`] until shutdown.

use std::time::Duration;

use levee_agent::policy::Timestamp;
use tokio::sync::watch;

use crate::actions::Actions;
use crate::rollout::Side;
use crate::shutdown::stopped;

/// How often expired flags, fault rules and breaker overrides are removed.
pub const EXPIRY_SWEEP_INTERVAL: Duration = Duration::from_secs(1);

/// Runs until `shutdown` is set; a rollout the server halts is POSTed to `webhook`.
pub async fn run(actions: Actions, webhook: Option<String>, mut shutdown: watch::Receiver<bool>) {
    let client = reqwest::Client::new();
    let mut tick = tokio::time::interval(EXPIRY_SWEEP_INTERVAL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = stopped(&mut shutdown) => return,
        }
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
        // Staged rollouts: halts first (in the same turn as the stage that baked), then stages.
        // Outcome counts come with the agents' health reports; until then NACKs decide.
        let no_counts =
            |_: crate::db::RolloutRow| async { Ok::<_, anyhow::Error>((Side::default(), Side::default())) };
        match actions.drive_rollouts(Timestamp::now().unix_ms(), no_counts).await {
            Ok(halted) => {
                for h in halted {
                    if let Some(url) = webhook.clone() {
                        let client = client.clone();
                        tokio::spawn(async move { crate::alerts::deliver(&client, &url, &h).await });
                    }
                }
            }
            Err(e) => tracing::warn!(error = ?e, "rollouts query failed"),
        }
    }
}

//! The expiry sweeper: a task that runs the expiry action (`Actions::expire`) every
//! [`EXPIRY_SWEEP_INTERVAL`] until shutdown.

use std::time::Duration;

use levee_agent::policy::Timestamp;
use tokio::sync::watch;

use crate::actions::Actions;
use crate::shutdown::stopped;

/// How often expired flags, fault rules and breaker overrides are removed.
pub const EXPIRY_SWEEP_INTERVAL: Duration = Duration::from_secs(1);

/// Runs until `shutdown` is set.
pub async fn run(actions: Actions, mut shutdown: watch::Receiver<bool>) {
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
    }
}

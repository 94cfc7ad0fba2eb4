//! One experiment's run on the replica that started it: baseline, injection, watching,
//! removal, recovery, verdict; and the watchdog that ends the runs of a replica that died
//! and starts the scheduled experiments due.

use std::time::Duration;

use levee_agent::policy::Timestamp;
use serde_json::json;
use tokio::time::Instant;

use super::Experiments;
use super::judge::{self, AbortRule, Phase, Reading, Verdict};
use super::measure;
use super::spec::{BlastRadius, ExperimentSpec};
use crate::actions::{Actions, ChangeError, Missing, Name, NewFaultRule, ServiceAt, experiment_fault_id};
use crate::db::{ExperimentRow, ExperimentState, ExperimentUpdate, now_ms};
use crate::shutdown::stopped;

/// A run that recorded no reading for this long is taken to have lost its replica: the
/// watchdog of any replica ends it.
pub const ORPHAN_AFTER: Duration = Duration::from_secs(30);

/// Why a run stopped before its course ended.
enum Cut {
    /// Ends with this verdict and why.
    End(Verdict, String),
    /// The server is stopping: the run ends as aborted, saying so.
    Shutdown,
}

impl From<anyhow::Error> for Cut {
    fn from(e: anyhow::Error) -> Cut {
        Cut::End(Verdict::Aborted, format!("the run failed: {}", levee_agent::report::ErrorChain(e.as_ref())))
    }
}

/// Runs experiment `id` to its end and records the verdict. Whatever happens, a fault it
/// set is removed before the verdict is recorded.
pub(super) async fn run(x: Experiments, id: i64, spec: ExperimentSpec) {
    let (verdict, why) = match drive(&x, id, &spec).await {
        Ok(v) => v,
        Err(Cut::End(v, why)) => (v, why),
        Err(Cut::Shutdown) => (Verdict::Aborted, "the server stopped during the experiment".to_string()),
    };
    let Ok(Some(row)) = x.store.experiment(id).await else {
        tracing::error!(id, "experiment vanished before its end was recorded");
        return;
    };
    if row.injected_at.is_some() && row.fault_removed_at.is_none() {
        remove_fault(&x.actions, &x.store, &row, &format!("ended: {}", verdict.as_str())).await;
    }
    match x.actions.finish_experiment(&row, verdict.as_str(), &why).await {
        Ok(true) => tracing::info!(id, verdict = verdict.as_str(), why = %why, "experiment ended"),
        Ok(false) => tracing::warn!(id, "experiment ended elsewhere before this run recorded its end"),
        Err(e) => {
            tracing::error!(id, error = %levee_agent::report::ErrorChain(&e), "recording an experiment's end")
        }
    }
}

async fn drive(x: &Experiments, id: i64, spec: &ExperimentSpec) -> Result<(Verdict, String), Cut> {
    let mut readings: Vec<Reading> = Vec::new();
    // Where the next reading's period starts: the previous complete reading (measure.rs).
    let mut from: Option<i64> = None;
    let pause = |d: Duration| {
        let mut shutdown = x.shutdown.clone();
        async move {
            tokio::select! {
                _ = tokio::time::sleep(d) => Ok(()),
                _ = stopped(&mut shutdown) => Err(Cut::Shutdown),
            }
        }
    };

    // Baseline: nothing is injected unless the hypothesis held, with data for every probe.
    let end = Instant::now() + spec.baseline;
    loop {
        stop_asked(x, id).await?;
        readings.push(read(x, id, spec, Phase::Baseline, &mut from).await?);
        if Instant::now() >= end {
            break;
        }
        pause(x.every).await?;
    }
    judge::baseline_ok(spec, &readings).map_err(|why| Cut::End(Verdict::Aborted, why))?;

    // The blast radius, among the instances connected now.
    let connected: Vec<String> = x
        .store
        .agents(&spec.environment, &spec.service)
        .await?
        .into_iter()
        .filter(|a| a.connected)
        .map(|a| a.instance_id)
        .collect();
    let n = spec
        .blast_radius
        .count(connected.len())
        .map_err(|why| Cut::End(Verdict::Aborted, format!("{why} — nothing was injected")))?;
    let instances = if matches!(spec.blast_radius, BlastRadius::All(true)) {
        Vec::new()
    } else {
        pick_instances(id, connected.clone(), n)
    };

    // Inject: a fault rule that ends by itself with the experiment, on those instances.
    let row = x.store.experiment(id).await?.ok_or_else(|| anyhow::anyhow!("experiment {id} vanished"))?;
    let injected_at = now_ms();
    let expires_at = injected_at + spec.duration.as_millis() as i64;
    let fault_id = experiment_fault_id(id);
    let new = NewFaultRule {
        dependency: spec.fault.dependency.clone(),
        operation: spec.fault.operation.clone(),
        action: spec.fault.action.clone(),
        percent: spec.fault.percent,
        expires_at: Timestamp::from_unix_ms(expires_at),
        instances: instances.clone(),
    };
    let chosen = if instances.is_empty() { connected.clone() } else { instances.clone() };
    let at = ServiceAt::new(&spec.environment, &spec.service, None);
    let name = Name::parse("fault.id", &fault_id).map_err(|e| anyhow::anyhow!("{e}"))?;
    let by = Actions::experiment_actor(&row);
    let reason = Actions::experiment_reason(
        &row,
        &format!("fault on {} of {} instances", chosen.len(), connected.len()),
    );
    if let Err(e) = x.actions.set_fault_rule(&by, &reason, &at, &name, new).await {
        return Err(Cut::End(
            Verdict::Aborted,
            format!("the fault could not be set: {e} — nothing was injected"),
        ));
    }
    x.store
        .update_experiment(
            id,
            &ExperimentUpdate {
                state: Some(ExperimentState::Injected),
                instances: Some(json!(chosen).to_string()),
                injected_at: Some(injected_at),
                fault_expires_at: Some(expires_at),
                ..Default::default()
            },
        )
        .await?;

    // Watch: abort when the hypothesis is violated for abort_after, or when asked.
    let mut rule = AbortRule::new(spec.abort_after);
    let end = Instant::now() + spec.duration;
    let mut aborted = None;
    loop {
        pause(x.every.min(end.saturating_duration_since(Instant::now()))).await?;
        if let Err(Cut::End(_, why)) = stop_asked(x, id).await {
            aborted = Some(why);
            break;
        }
        let r = read(x, id, spec, Phase::Injected, &mut from).await?;
        let abort = rule.observe(spec, &r);
        readings.push(r);
        if let Some(why) = abort {
            aborted = Some(why);
            break;
        }
        if Instant::now() >= end {
            break;
        }
    }
    let row = x.store.experiment(id).await?.ok_or_else(|| anyhow::anyhow!("experiment {id} vanished"))?;
    let what = if aborted.is_some() { "aborted" } else { "duration over" };
    remove_fault(&x.actions, &x.store, &row, what).await;
    x.store
        .update_experiment(
            id,
            &ExperimentUpdate { state: Some(ExperimentState::Recovery), ..Default::default() },
        )
        .await?;

    // Recovery: does the hypothesis hold again once the fault is gone?
    let end = Instant::now() + spec.recovery;
    while Instant::now() < end {
        pause(x.every.min(end.saturating_duration_since(Instant::now()))).await?;
        readings.push(read(x, id, spec, Phase::Recovery, &mut from).await?);
    }
    Ok(match aborted {
        Some(why) => (Verdict::Aborted, why),
        None => judge::verdict(spec, &readings),
    })
}

/// `Err` ending the run as aborted when someone asked it to stop.
async fn stop_asked(x: &Experiments, id: i64) -> Result<(), Cut> {
    let row = x.store.experiment(id).await?.ok_or_else(|| anyhow::anyhow!("experiment {id} vanished"))?;
    match (&row.stop_requested_by, &row.stop_reason) {
        (Some(by), reason) => {
            Err(Cut::End(Verdict::Aborted, format!("stopped by {by}: {}", reason.as_deref().unwrap_or(""))))
        }
        (None, _) => Ok(()),
    }
}

/// Reads every probe now over the period after `from` (the first reading: the last
/// [`measure::READING_WINDOW`]), judges and stores the reading (which is the run's sign of
/// life); a complete reading moves `from` to itself.
async fn read(
    x: &Experiments,
    id: i64,
    spec: &ExperimentSpec,
    phase: Phase,
    from: &mut Option<i64>,
) -> Result<Reading, Cut> {
    let at = now_ms();
    let start = from.unwrap_or(at - measure::READING_WINDOW.as_millis() as i64);
    let seen = measure::observe(&x.health, &x.store, spec, start, at).await?;
    if seen.complete {
        *from = Some(at);
    }
    let r = judge::reading(spec, at, phase, &seen.observed);
    let body = json!({"values": r.values, "holds": r.holds}).to_string();
    x.store.add_experiment_reading(id, at, phase.as_str(), &body).await?;
    Ok(r)
}

/// Removes experiment `e`'s fault rule (already gone — expired and swept — is fine) and
/// records when. Failures are logged: the rule still ends at its expiry on every agent.
async fn remove_fault(actions: &Actions, store: &crate::db::Store, e: &ExperimentRow, what: &str) {
    let at = ServiceAt::new(&e.environment, &e.service, None);
    let by = Actions::experiment_actor(e);
    let reason = Actions::experiment_reason(e, what);
    match actions.delete_fault_rule(&by, &reason, &at, &experiment_fault_id(e.id)).await {
        Ok(_) | Err(ChangeError::NotFound(Missing::FaultRule { .. })) => {}
        Err(err) => {
            tracing::error!(id = e.id, error = %levee_agent::report::ErrorChain(&err), "removing an experiment's fault (it still ends at its expiry)");
            return;
        }
    }
    let update = ExperimentUpdate { fault_removed_at: Some(now_ms()), ..Default::default() };
    if let Err(err) = store.update_experiment(e.id, &update).await {
        tracing::error!(id = e.id, error = ?err, "recording the removal of an experiment's fault");
    }
}

/// The `n` instances of `connected` a run of experiment `id` gives the fault: ordered by a
/// hash of the experiment and the instance id (FNV-1a 64), so the choice is the same on
/// every replica and differs from one experiment to the next.
pub fn pick_instances(id: i64, mut connected: Vec<String>, n: usize) -> Vec<String> {
    let key = |instance: &str| {
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for b in id.to_be_bytes().iter().copied().chain(instance.bytes()) {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
        h
    };
    connected.sort_by_key(|i| (key(i), i.clone()));
    connected.truncate(n);
    connected.sort();
    connected
}

/// Ends the experiments whose replica stopped recording readings ([`ORPHAN_AFTER`]):
/// their fault removed (it also ends at its expiry on every agent), verdict `aborted`.
/// Starts the scheduled experiments due every [`super::SCHEDULE_INTERVAL`].
pub(super) async fn watchdog(x: Experiments) {
    let mut shutdown = x.shutdown.clone();
    let mut tick = tokio::time::interval(ORPHAN_AFTER / 3);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut scheduled = tokio::time::interval(super::SCHEDULE_INTERVAL);
    scheduled.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = scheduled.tick() => {
                if let Err(e) = x.start_due(Timestamp::now()).await {
                    tracing::warn!(error = %levee_agent::report::ErrorChain(&e), "scheduled experiments query failed");
                }
                continue;
            }
            _ = stopped(&mut shutdown) => return,
        }
        let before = now_ms() - ORPHAN_AFTER.as_millis() as i64;
        let orphans = match x.store.orphaned_experiments(before).await {
            Ok(o) => o,
            Err(e) => {
                tracing::warn!(error = ?e, "listing orphaned experiments");
                continue;
            }
        };
        for e in orphans {
            if e.injected_at.is_some() && e.fault_removed_at.is_none() {
                remove_fault(&x.actions, &x.store, &e, "its server replica stopped").await;
            }
            let why = format!(
                "the server replica running it ({}) stopped recording readings at {}; ended by another replica{}",
                e.replica,
                Timestamp::from_unix_ms(e.heartbeat_at),
                e.fault_expires_at
                    .map(|t| format!(
                        " (agents ended the fault by themselves at {} if it was not removed)",
                        Timestamp::from_unix_ms(t)
                    ))
                    .unwrap_or_default()
            );
            if let Err(err) = x.actions.finish_experiment(&e, Verdict::Aborted.as_str(), &why).await {
                tracing::warn!(id = e.id, error = %levee_agent::report::ErrorChain(&err), "ending an orphaned experiment");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The choice is deterministic, depends on the experiment, and is returned sorted.
    #[test]
    fn instances_are_picked_deterministically() {
        let all: Vec<String> = (0..10).map(|i| format!("checkout-{i}")).collect();
        let a = pick_instances(7, all.clone(), 3);
        assert_eq!(a, pick_instances(7, all.iter().rev().cloned().collect(), 3));
        assert_eq!(a.len(), 3);
        assert!(a.windows(2).all(|w| w[0] < w[1]));
        let others: Vec<Vec<String>> = (1..6).map(|id| pick_instances(id, all.clone(), 3)).collect();
        assert!(others.iter().any(|o| *o != a), "another experiment picks other instances");
    }
}

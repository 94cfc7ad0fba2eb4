//! Game days, as the console meets them: who may see what a running game day injected,
//! and each person's first look at its service (their time to detect).
//!
//! While a game day runs, what it injected (its fault, blast radius, hypothesis and
//! readings) is shown only to the person who started it and to admins; everyone else sees
//! that a game day is running on the service, by whom and since when. Once it ends, all of
//! it is shown to everyone. A game day scheduled to start later is hidden the same way
//! until it has ended. docs/experiments.md, "Game days", lists every place.

use std::collections::HashSet;
use std::sync::Arc;

use tokio::sync::Mutex;

use super::Actions;
use crate::auth::Principal;
use crate::db::{ChangeKind, ExperimentRow, Reader, Role, ScheduledRow, now_ms};

/// The audit actions that are a lever pulled during a game day: a kill switch (or any
/// flag) set, a breaker override, an emergency profile applied (environment-wide), an
/// approved change applied.
pub const LEVER_ACTIONS: [&str; 4] = ["flag.set", "breaker.override", "profile.apply", "request.apply"];

/// Most (game day, person) pairs a replica remembers as recorded: past it the memory is
/// emptied and the next view of each pair costs one write that changes nothing.
const SEEN_MAX: usize = 10_000;

/// The pairs already recorded by this replica, so a page opened again costs no write.
#[derive(Clone, Debug, Default)]
pub(super) struct Seen(Arc<Mutex<HashSet<(i64, String)>>>);

/// Whether experiment `e` is a game day (its spec says `game_day: true`).
pub fn is_game_day(e: &ExperimentRow) -> bool {
    spec_is_game_day(&e.spec)
}

/// Whether an experiment's spec (JSON) says `game_day: true`.
fn spec_is_game_day(spec: &str) -> bool {
    serde_json::from_str::<serde_json::Value>(spec)
        .ok()
        .and_then(|v| v.get("game_day").and_then(serde_json::Value::as_bool))
        .unwrap_or(false)
}

/// Whether `who` is `author` (by name, or through a token acting for them).
fn is_author(author: &str, who: &Principal) -> bool {
    who.actor == author || who.person == author
}

/// Whether `who` is the person who started `e`.
fn started(e: &ExperimentRow, who: &Principal) -> bool {
    is_author(&e.created_by, who)
}

/// Whether `who` may see what experiment `e` injected: always, except while a game day
/// runs, when only its starter and admins may.
pub fn sees_injected(e: &ExperimentRow, who: &Principal) -> bool {
    !is_game_day(e) || e.ended_at.is_some() || who.role == Role::Admin || started(e, who)
}

/// Scheduled changes as `who` may see them: a scheduled game day shows what it would
/// inject only to the person who scheduled it and to admins, until the game day it
/// started has ended (the rule of [`sees_injected`], before the start); to everyone else
/// its target reads "game day" and its spec and reason are left out (payload `null`).
///
/// # Errors
/// The store could not be read.
pub async fn scheduled_as_seen(
    store: &Reader,
    mut rows: Vec<ScheduledRow>,
    who: &Principal,
) -> anyhow::Result<Vec<ScheduledRow>> {
    for c in &mut rows {
        if c.kind != ChangeKind::Experiment
            || !spec_is_game_day(&c.payload)
            || who.role == Role::Admin
            || is_author(&c.created_by, who)
        {
            continue;
        }
        let ended = match c.experiment_id {
            Some(id) => store.experiment(id).await?.is_some_and(|e| e.ended_at.is_some()),
            None => false,
        };
        if !ended {
            c.target = "game day".into();
            c.payload = "null".into();
            c.reason = String::new();
        }
    }
    Ok(rows)
}

/// Experiment `e` as shown to someone who may not see what it injected (see
/// [`sees_injected`]): its name, spec, reason, instances and the fault's times left out.
pub fn hide_injected(e: &mut ExperimentRow) {
    e.name = "game day".into();
    e.spec = String::new();
    e.reason = String::new();
    e.instances = None;
    e.injected_at = None;
    e.fault_expires_at = None;
    e.fault_removed_at = None;
}

/// The game days running on `env`/`svc` (not ended), oldest first.
///
/// # Errors
/// The store could not be read.
pub async fn running_game_days(store: &Reader, env: &str, svc: &str) -> anyhow::Result<Vec<ExperimentRow>> {
    let mut out = Vec::new();
    for id in store.running_experiment_ids(env, svc).await? {
        out.extend(store.experiment(id).await?.filter(is_game_day));
    }
    Ok(out)
}

impl Actions {
    /// Records `who`'s first look at the service of each of `game_days` whose fault is
    /// injected (not its starter's: they know). A person's later looks write nothing.
    ///
    /// # Errors
    /// The store could not be written.
    pub async fn record_game_day_look(
        &self,
        game_days: &[ExperimentRow],
        who: &Principal,
    ) -> anyhow::Result<()> {
        for e in game_days {
            if e.injected_at.is_none() || e.ended_at.is_some() || started(e, who) {
                continue;
            }
            let key = (e.id, who.actor.clone());
            let known = self.game_day_seen.0.lock().await.contains(&key);
            if known {
                continue;
            }
            self.store.record_game_day_view(e.id, &who.actor, now_ms()).await?;
            let mut seen = self.game_day_seen.0.lock().await;
            if seen.len() >= SEEN_MAX {
                seen.clear();
            }
            seen.insert(key);
        }
        Ok(())
    }
}

//! The aggregation task: sums reports into slots, keeps each instance's last report,
//! writes slots to the database every flush interval and prunes old rows.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::Duration;

use serde::Serialize;
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

use super::{HealthTotals, INSTANCE_TTL, Msg, RETENTION, Report, SLOT_MS, SubjectKind, Window, slot_of};
use crate::db::{HealthRow, Store, now_ms};

/// The last report of one instance.
#[derive(Clone, Debug, Serialize, utoipa::ToSchema)]
pub struct InstanceHealth {
    /// The agent instance.
    pub instance_id: String,
    /// The revision it had applied when it reported.
    pub revision: u64,
    /// It said it was not ready.
    pub not_ready: bool,
    /// When it reported, ms since the Unix epoch.
    pub at_ms: i64,
    /// Its windows (what happened since its report before).
    #[serde(skip)]
    pub(crate) windows: Vec<Window>,
}

impl InstanceHealth {
    /// The counts of its last report for one subject, if it had calls there.
    pub fn subject(&self, kind: SubjectKind, name: &str) -> Option<&HealthTotals> {
        self.windows.iter().find(|w| w.kind == kind && w.name == name).map(|w| &w.counts)
    }

    /// The counts of its last report summed over every subject of `kind`.
    pub fn total(&self, kind: SubjectKind) -> HealthTotals {
        let mut t = HealthTotals::empty();
        for w in self.windows.iter().filter(|w| w.kind == kind) {
            t.add(&w.counts);
        }
        t
    }
}

/// (environment, service, revision, slot start).
type SlotKey = (String, String, u64, i64);

#[derive(Default)]
struct Slot {
    subjects: BTreeMap<(SubjectKind, String), HealthTotals>,
    instances: HashSet<String>,
    not_ready: HashSet<String>,
    /// Changed since it was last written.
    dirty: bool,
}

#[derive(Default)]
struct State {
    replica: String,
    slots: HashMap<SlotKey, Slot>,
    instances: HashMap<(String, String, String), InstanceHealth>,
}

impl State {
    /// Adds a report to its slot. A window the agent cut when it switched revisions counts
    /// for the revision it names only when that is the revision the instance reported
    /// before (an agent cannot lend its counts to a revision it was not seen on); else,
    /// as an untagged window, for the report's.
    fn add(&mut self, r: Report) {
        let instance_key = (r.environment.clone(), r.service.clone(), r.instance.clone());
        let previous = self.instances.get(&instance_key).map(|i| i.revision);
        let slot_ms = slot_of(r.at_ms);
        let key = (r.environment.clone(), r.service.clone(), r.revision, slot_ms);
        let slot = self.slots.entry(key).or_default();
        slot.dirty = true;
        slot.instances.insert(r.instance.clone());
        if r.not_ready {
            slot.not_ready.insert(r.instance.clone());
        }
        let (cut, own): (Vec<Window>, Vec<Window>) =
            r.windows.into_iter().partition(|w| w.cut_from.is_some() && w.cut_from == previous);
        for w in &own {
            slot.subjects.entry((w.kind, w.name.clone())).or_insert_with(HealthTotals::empty).add(&w.counts);
        }
        for w in &cut {
            let revision = w.cut_from.expect("partitioned on it");
            let key = (r.environment.clone(), r.service.clone(), revision, slot_ms);
            let slot = self.slots.entry(key).or_default();
            slot.dirty = true;
            slot.subjects.entry((w.kind, w.name.clone())).or_insert_with(HealthTotals::empty).add(&w.counts);
        }
        self.instances.insert(
            instance_key,
            InstanceHealth {
                instance_id: r.instance,
                revision: r.revision,
                not_ready: r.not_ready,
                at_ms: r.at_ms,
                windows: own,
            },
        );
    }

    fn rows_of(&self, key: &SlotKey, slot: &Slot) -> Vec<HealthRow> {
        let (environment, service, revision, slot_ms) = key;
        let row = |kind: Option<SubjectKind>, name: &str, t: &HealthTotals| HealthRow {
            replica: self.replica.clone(),
            environment: environment.clone(),
            service: service.clone(),
            revision: *revision,
            slot_ms: *slot_ms,
            kind,
            name: name.to_string(),
            calls: t.calls,
            successes: t.successes,
            failures: t.failures,
            timeouts: t.timeouts,
            fallbacks: t.fallbacks,
            shed: t.shed,
            breaker_opens: t.breaker_opens,
            latency: t.latency_buckets.clone(),
            instances: t.instances,
            not_ready: t.not_ready,
        };
        let head = HealthTotals {
            instances: slot.instances.len() as u64,
            not_ready: slot.not_ready.len() as u64,
            ..HealthTotals::empty()
        };
        std::iter::once(row(None, "", &head))
            .chain(slot.subjects.iter().map(|((k, n), t)| row(Some(*k), n, t)))
            .collect()
    }

    fn pending(&self, env: &str, service: &str) -> Vec<HealthRow> {
        self.slots
            .iter()
            .filter(|((e, s, _, _), _)| e == env && s == service)
            .flat_map(|(k, slot)| self.rows_of(k, slot))
            .collect()
    }

    /// Writes every slot changed since its last write. Slots older than three slot lengths
    /// are let go once written (a reader asking this replica for its rows after reading
    /// the database finds them here or there, never in neither).
    async fn flush(&mut self, store: &Store) -> anyhow::Result<()> {
        let dirty: Vec<SlotKey> =
            self.slots.iter().filter(|(_, s)| s.dirty).map(|(k, _)| k.clone()).collect();
        let rows: Vec<HealthRow> = dirty.iter().flat_map(|k| self.rows_of(k, &self.slots[k])).collect();
        if !rows.is_empty() {
            store.write_health(&rows).await?;
            metrics::counter!("levee_server_health_rows_written_total").increment(rows.len() as u64);
        }
        for k in &dirty {
            if let Some(s) = self.slots.get_mut(k) {
                s.dirty = false;
            }
        }
        let now = now_ms();
        let keep_from = slot_of(now) - 3 * SLOT_MS;
        self.slots.retain(|(_, _, _, slot), s| s.dirty || *slot >= keep_from);
        let ttl = INSTANCE_TTL.as_millis() as i64;
        self.instances.retain(|_, i| now - i.at_ms < ttl);
        Ok(())
    }

    /// Lets go of slots past the retention that could not be written (the database has
    /// been away that long): memory stays bounded.
    fn forget_expired(&mut self) {
        let from = now_ms() - RETENTION.as_millis() as i64;
        self.slots.retain(|(_, _, _, slot), _| *slot >= from);
    }
}

pub(super) async fn run(
    store: Store,
    replica: String,
    flush_interval: Duration,
    mut rx: mpsc::Receiver<Msg>,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut state = State { replica, ..State::default() };
    let mut next_flush = Instant::now() + flush_interval;
    let prune_every = Duration::from_secs(3600);
    let mut next_prune = Instant::now() + flush_interval;
    loop {
        let msg = tokio::select! {
            m = rx.recv() => m,
            () = crate::shutdown::stopped(&mut shutdown) => None,
            () = tokio::time::sleep_until(next_flush) => {
                next_flush = Instant::now() + flush_interval;
                if let Err(e) = state.flush(&store).await {
                    tracing::warn!(error = %levee_agent::report::ErrorChain(e.as_ref()), "writing health windows failed; kept to retry");
                    metrics::counter!("levee_server_health_write_failures_total").increment(1);
                    state.forget_expired();
                }
                if Instant::now() >= next_prune {
                    next_prune = Instant::now() + prune_every;
                    let before = now_ms() - RETENTION.as_millis() as i64;
                    if let Err(e) = store.prune_health(before).await {
                        tracing::warn!(error = %levee_agent::report::ErrorChain(e.as_ref()), "pruning health windows");
                    }
                }
                continue;
            }
        };
        match msg {
            Some(Msg::Report(r)) => state.add(r),
            Some(Msg::Pending { environment, service, reply }) => {
                let _ = reply.send(state.pending(&environment, &service));
            }
            Some(Msg::Instances { environment, service, since_ms, reply }) => {
                let mut out: Vec<InstanceHealth> = state
                    .instances
                    .iter()
                    .filter(|((e, s, _), i)| *e == environment && *s == service && i.at_ms >= since_ms)
                    .map(|(_, i)| i.clone())
                    .collect();
                out.sort_by(|a, b| a.instance_id.cmp(&b.instance_id));
                let _ = reply.send(out);
            }
            Some(Msg::Flush(reply)) => {
                let _ = reply.send(state.flush(&store).await);
            }
            None => {
                // The server stops: one last write.
                if let Err(e) = state.flush(&store).await {
                    tracing::warn!(error = %levee_agent::report::ErrorChain(e.as_ref()), "writing health windows at stop");
                }
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use levee_agent::proto::{HealthWindow, StatusReport};

    use super::*;
    use crate::health::windows_of;

    /// A report of instance `pod-1` on `revision` at `at_ms` whose window of `db` saw
    /// `failed` failures, cut from `cut_from` (0: not cut).
    fn report(revision: u64, at_ms: i64, windows: &[(u64, u64)]) -> Report {
        let health = windows
            .iter()
            .map(|&(failed, cut_from)| HealthWindow {
                kind: "dependency".into(),
                name: "db".into(),
                window_ms: 1_000,
                calls: failed,
                failures: failed,
                revision: cut_from,
                ..HealthWindow::default()
            })
            .collect();
        let r = StatusReport { applied_revision: revision, health, ..StatusReport::default() };
        Report {
            environment: "prod".into(),
            service: "checkout".into(),
            instance: "pod-1".into(),
            revision,
            not_ready: false,
            at_ms,
            windows: windows_of(&r),
        }
    }

    fn failures_by_revision(state: &State) -> BTreeMap<u64, u64> {
        let mut out = BTreeMap::new();
        for row in state.pending("prod", "checkout") {
            *out.entry(row.revision).or_default() += row.failures;
        }
        out
    }

    /// The windows an agent cut when it switched revisions count for the revision they
    /// ran under — the one the instance reported before — and only that one: a cut naming
    /// a revision the instance was never seen on counts for the report's own.
    #[test]
    fn windows_cut_at_a_switch_count_for_the_revision_the_instance_was_on() {
        let mut state = State::default();
        let at = 1_000_000;
        state.add(report(1, at, &[(2, 0)]));
        state.add(report(2, at + 100, &[(5, 1), (1, 0)]));
        assert_eq!(failures_by_revision(&state), BTreeMap::from([(1, 7), (2, 1)]));
        // Revision 1 is no longer the instance's previous one: a window naming it is
        // taken as the report's.
        state.add(report(3, at + 200, &[(4, 1)]));
        assert_eq!(failures_by_revision(&state), BTreeMap::from([(1, 7), (2, 1), (3, 4)]));
        let instance = &state.instances[&("prod".into(), "checkout".into(), "pod-1".into())];
        assert_eq!(instance.revision, 3);
    }
}

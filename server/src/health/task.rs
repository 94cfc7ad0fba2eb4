//! The aggregation task: sums reports into slots, keeps each instance's last report and
//! its recent reports (for readings over a period), writes slots to the database every
//! flush interval and prunes old rows.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::time::Duration;

use serde::Serialize;
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

use levee_agent::health::MAX_HEALTH_WINDOWS;

use super::{
    HISTORY, HealthTotals, INSTANCE_TTL, MAX_HISTORY_REPORTS, MAX_HISTORY_WINDOWS, Msg, RETENTION, Report,
    SLOT_MS, SubjectKind, Window, slot_of,
};
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

/// One of an instance's recent reports, as kept for readings over a period.
#[derive(Clone, Debug)]
pub struct Reported {
    /// When it arrived, ms since the Unix epoch.
    pub at_ms: i64,
    /// The instance said it was not ready.
    pub not_ready: bool,
    /// Every window of the report (what happened since the instance's report before),
    /// whichever revision the agent counted it for.
    pub(crate) windows: Vec<Window>,
}

/// An instance's reports within a period, and when it last reported at all.
#[derive(Clone, Debug)]
pub struct InstanceReports {
    /// The agent instance.
    pub instance_id: String,
    /// Its last report, ms since the Unix epoch (maybe before the period).
    pub last_at_ms: i64,
    /// Its reports that arrived within the period, oldest first.
    pub reports: Vec<Reported>,
}

/// (environment, service, instance).
type InstanceKey = (String, String, String);

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
    instances: HashMap<InstanceKey, InstanceHealth>,
    /// Each instance's reports of the last [`HISTORY`], oldest first.
    history: HashMap<InstanceKey, VecDeque<Reported>>,
    /// Windows held in `history`, all instances together (bounded by
    /// [`MAX_HISTORY_WINDOWS`]).
    history_windows: usize,
    /// Another bound than [`MAX_HISTORY_WINDOWS`] (tests).
    history_cap: Option<usize>,
}

impl State {
    /// Adds a report to its slot. A window the agent cut when it switched revisions counts
    /// for the revision it names only when that is the revision the instance reported
    /// before (an agent cannot lend its counts to a revision it was not seen on); else,
    /// as an untagged window, for the report's.
    fn add(&mut self, r: Report) {
        let instance_key = (r.environment.clone(), r.service.clone(), r.instance.clone());
        let previous = self.instances.get(&instance_key).map(|i| i.revision);
        self.remember(instance_key.clone(), r.at_ms, r.not_ready, r.windows.clone());
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

    /// Keeps a report in its instance's history. Bounded whatever agents send: reports
    /// older than [`HISTORY`] are let go; past [`MAX_HISTORY_REPORTS`] of one instance its
    /// two oldest are merged (their counts kept, at the later one's time), so an agent
    /// reporting very often loses no call, only the precision of when; past
    /// [`MAX_HISTORY_WINDOWS`] in all, the instance's oldest are dropped, and when that
    /// is not enough the report is not kept (counted in
    /// `levee_server_health_history_dropped_total`).
    fn remember(&mut self, key: InstanceKey, at_ms: i64, not_ready: bool, windows: Vec<Window>) {
        let from = at_ms - HISTORY.as_millis() as i64;
        let kept = self.history.entry(key).or_default();
        while kept.front().is_some_and(|e| e.at_ms < from) {
            let old = kept.pop_front().expect("checked");
            self.history_windows -= old.windows.len();
        }
        if kept.len() >= MAX_HISTORY_REPORTS
            && let Some(oldest) = kept.pop_front()
            && let Some(next) = kept.front_mut()
        {
            let before = oldest.windows.len() + next.windows.len();
            merge_older(next, oldest);
            self.history_windows = self.history_windows + next.windows.len() - before;
        }
        let cap = self.history_cap.unwrap_or(MAX_HISTORY_WINDOWS);
        while self.history_windows + windows.len() > cap {
            let Some(old) = kept.pop_front() else {
                metrics::counter!("levee_server_health_history_dropped_total").increment(1);
                return;
            };
            self.history_windows -= old.windows.len();
        }
        self.history_windows += windows.len();
        kept.push_back(Reported { at_ms, not_ready, windows });
    }

    /// Every instance of one service that reported after `live_since_ms`, with its
    /// reports that arrived after `from_ms`, ordered by instance.
    fn reported(&self, env: &str, service: &str, from_ms: i64, live_since_ms: i64) -> Vec<InstanceReports> {
        let mut out: Vec<InstanceReports> = self
            .instances
            .iter()
            .filter(|((e, s, _), i)| e == env && s == service && i.at_ms > live_since_ms)
            .map(|(key, i)| InstanceReports {
                instance_id: i.instance_id.clone(),
                last_at_ms: i.at_ms,
                reports: self
                    .history
                    .get(key)
                    .into_iter()
                    .flatten()
                    .filter(|r| r.at_ms > from_ms)
                    .cloned()
                    .collect(),
            })
            .collect();
        out.sort_by(|a, b| a.instance_id.cmp(&b.instance_id));
        out
    }

    /// Lets go of the reports older than [`HISTORY`], and of instances gone quiet.
    fn forget_history(&mut self, now: i64) {
        let from = now - HISTORY.as_millis() as i64;
        for kept in self.history.values_mut() {
            kept.retain(|r| r.at_ms >= from);
        }
        self.history.retain(|_, kept| !kept.is_empty());
        self.history_windows = self.history.values().flatten().map(|r| r.windows.len()).sum();
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
        self.forget_history(now);
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
                    state.forget_history(now_ms());
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
            Some(Msg::Reported { environment, service, from_ms, live_since_ms, reply }) => {
                let _ = reply.send(state.reported(&environment, &service, from_ms, live_since_ms));
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

/// Adds `older`'s windows and readiness into `newer` (which keeps its time). A subject
/// `newer` lacks is added while it holds fewer than [`MAX_HEALTH_WINDOWS`].
fn merge_older(newer: &mut Reported, older: Reported) {
    newer.not_ready |= older.not_ready;
    for w in older.windows {
        if let Some(same) = newer.windows.iter_mut().find(|n| n.kind == w.kind && n.name == w.name) {
            same.counts.add(&w.counts);
        } else if newer.windows.len() < MAX_HEALTH_WINDOWS {
            newer.windows.push(w);
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

    /// A report of `instance` at `at_ms` with one window of `db` holding `failed` failures.
    fn of(instance: &str, at_ms: i64, failed: u64) -> Report {
        Report { instance: instance.into(), ..report(1, at_ms, &[(failed, 0)]) }
    }

    fn failures(reports: &[Reported]) -> u64 {
        reports.iter().flat_map(|r| &r.windows).map(|w| w.counts.failures).sum()
    }

    /// A period's reports are those that arrived after its start, each instance's own;
    /// an instance that reported before but not in the period is listed with none, one
    /// silent since before `live_since` not at all.
    #[test]
    fn an_instance_s_reports_of_a_period_are_kept_and_listed() {
        let mut state = State::default();
        let at = 1_000_000;
        state.add(of("pod-1", at, 1));
        state.add(of("pod-2", at + 100, 2));
        state.add(of("pod-1", at + 1_000, 4));
        state.add(of("pod-1", at + 2_000, 8));
        state.add(of("pod-3", at - 20_000, 16));
        let listed = state.reported("prod", "checkout", at + 500, at - 15_000);
        let names: Vec<&str> = listed.iter().map(|i| i.instance_id.as_str()).collect();
        assert_eq!(names, ["pod-1", "pod-2"], "pod-3 is silent since before live_since");
        assert_eq!((listed[0].reports.len(), failures(&listed[0].reports)), (2, 12));
        assert_eq!(listed[0].last_at_ms, at + 2_000);
        assert!(listed[1].reports.is_empty(), "pod-2 reported before the period only");
        assert_eq!(failures(&state.reported("prod", "checkout", 0, 0)[0].reports), 13);
        assert!(state.reported("prod", "other", 0, 0).is_empty());
    }

    /// Per instance at most MAX_HISTORY_REPORTS reports, none older than HISTORY: past the
    /// count the oldest are merged (no call is lost), past the age they are let go.
    #[test]
    fn an_instance_s_history_is_bounded_and_keeps_its_counts() {
        let mut state = State::default();
        let at = 1_000_000;
        let n = MAX_HISTORY_REPORTS as i64 + 10;
        for i in 0..n {
            state.add(of("pod-1", at + i * 10, 1));
        }
        let kept = &state.history[&("prod".into(), "checkout".into(), "pod-1".into())];
        assert_eq!(kept.len(), MAX_HISTORY_REPORTS);
        assert_eq!(failures(&kept.iter().cloned().collect::<Vec<_>>()), n as u64, "merged, not dropped");
        assert_eq!(state.history_windows, MAX_HISTORY_REPORTS);
        let later = at + HISTORY.as_millis() as i64 + 1_000;
        state.add(of("pod-1", later, 5));
        let all = state.reported("prod", "checkout", 0, 0);
        assert_eq!((all[0].reports.len(), failures(&all[0].reports)), (1, 5), "the old ones let go");
        assert_eq!(state.history_windows, 1);
        state.forget_history(later + HISTORY.as_millis() as i64 + 1);
        assert!(state.history.is_empty() && state.history_windows == 0);
    }

    /// All instances together hold at most the cap of windows: a new report pushes out its
    /// own instance's oldest, and one that cannot fit is not kept.
    #[test]
    fn the_histories_together_are_bounded() {
        let mut state = State { history_cap: Some(3), ..State::default() };
        let at = 1_000_000;
        state.add(of("pod-1", at, 1));
        state.add(of("pod-2", at, 1));
        state.add(of("pod-3", at, 1));
        state.add(of("pod-1", at + 10, 2));
        assert_eq!(state.history_windows, 3);
        let pod_1 = &state.reported("prod", "checkout", 0, 0)[0];
        assert_eq!(failures(&pod_1.reports), 2, "pod-1's oldest made room");
        // pod-4 has nothing of its own to let go: its report is not kept (its last
        // report still is).
        state.add(of("pod-4", at + 20, 1));
        let all = state.reported("prod", "checkout", 0, 0);
        assert_eq!(all.len(), 4);
        assert!(all[3].reports.is_empty());
        assert_eq!(state.history_windows, 3);
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

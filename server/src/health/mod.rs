//! Agents' health: the windowed outcome counts each status report carries per dependency
//! and inbound route (`levee_agent::health`), kept per instance (its last report, and its
//! reports of the last [`HISTORY`] for readings over a period) and per service revision
//! (10-second slots, in memory and in `health_windows`), and the one
//! place that answers "how healthy is this revision / these instances / this subject"
//! for the API, the rollout, experiments and the console.
//!
//! Reports reach [`Health::report`] from the stream loop, which only bounds and escapes
//! them (SEC-2) and hands them over without waiting: the aggregation runs on its own task
//! (`task.rs`), and slots are written to the database by that task every
//! [`FLUSH_INTERVAL`], one row per (revision, slot, subject) whatever the number of
//! agents — never per report.

mod task;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use levee_agent::health::{LATENCY_BOUNDS_MS, LATENCY_BUCKETS, MAX_HEALTH_WINDOWS};
use levee_agent::proto::StatusReport;
use serde::Serialize;
use tokio::sync::{mpsc, oneshot, watch};

use crate::agent_text;
pub use crate::db::SubjectKind;
use crate::db::{HealthRow, Store, now_ms};

pub use task::{InstanceHealth, InstanceReports, Reported};

/// Length of the slots windows are summed into, in ms.
pub const SLOT_MS: i64 = 10_000;
/// How often a replica writes its slots to the database.
pub const FLUSH_INTERVAL: Duration = Duration::from_secs(10);
/// How long rows are kept.
pub const RETENTION: Duration = Duration::from_secs(24 * 3600);
/// How long an instance's last report is kept after it stopped reporting.
pub const INSTANCE_TTL: Duration = Duration::from_secs(15 * 60);
/// How long an instance's reports are kept for readings over a period (an experiment's
/// reading covers at most about 15 s and one reading interval: docs/experiments.md).
pub const HISTORY: Duration = Duration::from_secs(60);
/// Most reports kept per instance within [`HISTORY`]; past it the two oldest are merged.
pub const MAX_HISTORY_REPORTS: usize = 64;
/// Most windows kept in all instances' histories together, this replica.
pub const MAX_HISTORY_WINDOWS: usize = 262_144;
/// Most calls a window may claim per second it covers; more is clamped (an agent's claim
/// is untrusted, and one agent must not outweigh a fleet).
pub const MAX_CALLS_PER_SEC: u64 = 10_000_000;
/// Longest window an agent may claim, in ms (a report after a long disconnection covers
/// the whole time; more than this is clamped).
pub const MAX_WINDOW_MS: u64 = 24 * 3600 * 1000;
/// Reports queued for the aggregation task; past it a report is dropped and counted in
/// `levee_server_health_reports_dropped_total`.
pub const QUEUE_CAPACITY: usize = 16_384;

/// Which windows a query sums.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SubjectFilter {
    /// Every dependency and route.
    All,
    /// Every subject of one kind.
    Kind(SubjectKind),
    /// One dependency or route.
    One(SubjectKind, String),
}

impl SubjectFilter {
    fn matches(&self, kind: SubjectKind, name: &str) -> bool {
        match self {
            SubjectFilter::All => true,
            SubjectFilter::Kind(k) => *k == kind,
            SubjectFilter::One(k, n) => *k == kind && n == name,
        }
    }
}

/// Summed health: counts of calls and their outcomes (each call is one of `successes`,
/// `failures`, `timeouts`, `shed`), answers by fallbacks, breaker opens, calls per latency
/// bucket, and the instances that reported.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct HealthTotals {
    /// Calls counted.
    pub calls: u64,
    /// Calls the dependency (or the route's handler) answered with success.
    pub successes: u64,
    /// Calls that failed at the dependency (or route).
    pub failures: u64,
    /// Calls whose last attempt timed out.
    pub timeouts: u64,
    /// Answers a fallback gave instead of the dependency.
    pub fallbacks: u64,
    /// Calls refused on the agent's own machine (kill switch, open breaker, full
    /// bulkhead, throttle, spent deadline, admission): not the dependency's failure.
    pub shed: u64,
    /// Times a circuit breaker opened.
    pub breaker_opens: u64,
    /// Calls per latency bucket; bounds in `latency_bounds` of the answer
    /// (`levee_agent::health::LATENCY_BOUNDS_MS`, then one bucket past the last).
    pub latency_buckets: Vec<u64>,
    /// Instances that reported: the most in one 10-second slot of the range (an instance
    /// reports about every 10 s).
    pub instances: u64,
    /// Of those, the most that said they were not ready in one slot.
    pub not_ready: u64,
}

impl Default for HealthTotals {
    fn default() -> Self {
        HealthTotals {
            calls: 0,
            successes: 0,
            failures: 0,
            timeouts: 0,
            fallbacks: 0,
            shed: 0,
            breaker_opens: 0,
            latency_buckets: vec![0; LATENCY_BUCKETS],
            instances: 0,
            not_ready: 0,
        }
    }
}

/// The health of the agents on one revision, per subject.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RevisionTotals {
    /// As [`HealthTotals::instances`].
    pub instances: u64,
    /// As [`HealthTotals::not_ready`].
    pub not_ready: u64,
    /// Instance reports summed over the slots: each instance counts once per 10-second
    /// slot it reported in (an instance reports about every 10 s).
    pub instance_slots: u64,
    /// Of those, the ones in which the instance said it was not ready.
    pub not_ready_slots: u64,
    /// Per (kind, name).
    pub subjects: BTreeMap<(SubjectKind, String), HealthTotals>,
}

impl HealthTotals {
    fn empty() -> HealthTotals {
        HealthTotals::default()
    }

    /// Adds `other`'s counts (instances excepted: see [`HealthTotals::instances`]).
    pub fn add(&mut self, other: &HealthTotals) {
        self.calls += other.calls;
        self.successes += other.successes;
        self.failures += other.failures;
        self.timeouts += other.timeouts;
        self.fallbacks += other.fallbacks;
        self.shed += other.shed;
        self.breaker_opens += other.breaker_opens;
        if self.latency_buckets.len() < LATENCY_BUCKETS {
            self.latency_buckets.resize(LATENCY_BUCKETS, 0);
        }
        for (a, b) in self.latency_buckets.iter_mut().zip(&other.latency_buckets) {
            *a += b;
        }
    }

    /// Share of the calls that reached the dependency that failed or timed out, 0..1
    /// (0 without any): `(failures + timeouts) / (successes + failures + timeouts)`.
    pub fn error_rate(&self) -> f64 {
        let reached = self.successes + self.failures + self.timeouts;
        if reached == 0 { 0.0 } else { (self.failures + self.timeouts) as f64 / reached as f64 }
    }

    /// Share of all calls refused locally, 0..1 (0 without calls).
    pub fn shed_rate(&self) -> f64 {
        if self.calls == 0 { 0.0 } else { self.shed as f64 / self.calls as f64 }
    }

    /// The latency under which a fraction `q` (0..=1) of the measured calls ended, in ms:
    /// the upper bound of the bucket holding that call (`None` without measured calls;
    /// past the last bound, the last bound).
    pub fn quantile_ms(&self, q: f64) -> Option<f64> {
        let total: u64 = self.latency_buckets.iter().sum();
        if total == 0 {
            return None;
        }
        let rank = ((q.clamp(0.0, 1.0) * total as f64).ceil() as u64).max(1);
        let mut seen = 0;
        for (i, n) in self.latency_buckets.iter().enumerate() {
            seen += n;
            if seen >= rank {
                let bound = LATENCY_BOUNDS_MS.get(i).or(LATENCY_BOUNDS_MS.last()).copied().unwrap_or(0);
                return Some(bound as f64);
            }
        }
        LATENCY_BOUNDS_MS.last().map(|b| *b as f64)
    }

    /// [`quantile_ms`](Self::quantile_ms) at 0.5.
    pub fn p50_ms(&self) -> Option<f64> {
        self.quantile_ms(0.5)
    }

    /// [`quantile_ms`](Self::quantile_ms) at 0.99.
    pub fn p99_ms(&self) -> Option<f64> {
        self.quantile_ms(0.99)
    }
}

/// One window of a report, as kept: name bounded and escaped, counts clamped.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Window {
    pub(crate) kind: SubjectKind,
    pub(crate) name: String,
    pub(crate) counts: HealthTotals,
    /// The revision the agent says these calls ran under, when not the report's (a
    /// window it cut when it switched revisions). Only believed when it is the revision
    /// the instance reported before (see `task::State::add`).
    pub(crate) cut_from: Option<u64>,
}

/// A status report's health, as kept.
#[derive(Clone, Debug)]
pub(crate) struct Report {
    pub(crate) environment: String,
    pub(crate) service: String,
    pub(crate) instance: String,
    pub(crate) revision: u64,
    pub(crate) not_ready: bool,
    pub(crate) at_ms: i64,
    pub(crate) windows: Vec<Window>,
}

/// The windows of `r` as kept (SEC-2): unknown kinds dropped, names bounded and escaped,
/// at most [`MAX_HEALTH_WINDOWS`], every count clamped to what the window's length allows
/// ([`MAX_CALLS_PER_SEC`]), `calls` the sum of its outcomes, a latency list of another
/// length than [`LATENCY_BUCKETS`] ignored.
pub(crate) fn windows_of(r: &StatusReport) -> Vec<Window> {
    r.health
        .iter()
        .take(MAX_HEALTH_WINDOWS)
        .filter_map(|w| {
            let kind = SubjectKind::parse(&w.kind)?;
            let window_ms = w.window_ms.clamp(1, MAX_WINDOW_MS);
            let cap = MAX_CALLS_PER_SEC.saturating_mul(window_ms.div_ceil(1000));
            let c = |v: u64| v.min(cap);
            let (successes, failures, timeouts, shed) =
                (c(w.successes), c(w.failures), c(w.timeouts), c(w.shed));
            let latency_buckets = if w.latency_buckets.len() == LATENCY_BUCKETS {
                w.latency_buckets.iter().map(|v| c(*v)).collect()
            } else {
                vec![0; LATENCY_BUCKETS]
            };
            Some(Window {
                kind,
                cut_from: (w.revision != 0 && w.revision != r.applied_revision).then_some(w.revision),
                name: agent_text::name(&w.name),
                counts: HealthTotals {
                    calls: successes + failures + timeouts + shed,
                    successes,
                    failures,
                    timeouts,
                    fallbacks: c(w.fallbacks),
                    shed,
                    breaker_opens: c(w.breaker_opens),
                    latency_buckets,
                    instances: 0,
                    not_ready: 0,
                },
            })
        })
        .collect()
}

/// The start of the slot holding `at_ms`.
pub(crate) fn slot_of(at_ms: i64) -> i64 {
    at_ms - at_ms.rem_euclid(SLOT_MS)
}

pub(crate) enum Msg {
    Report(Report),
    /// This replica's rows of one service not yet known to be in the database.
    Pending {
        environment: String,
        service: String,
        reply: oneshot::Sender<Vec<HealthRow>>,
    },
    Instances {
        environment: String,
        service: String,
        since_ms: i64,
        reply: oneshot::Sender<Vec<InstanceHealth>>,
    },
    Reported {
        environment: String,
        service: String,
        from_ms: i64,
        live_since_ms: i64,
        reply: oneshot::Sender<Vec<InstanceReports>>,
    },
    Flush(oneshot::Sender<anyhow::Result<()>>),
}

/// This replica's health aggregation: a handle on its task. Cheap to clone.
#[derive(Clone, Debug)]
pub struct Health {
    tx: mpsc::Sender<Msg>,
    store: Store,
    replica: Arc<str>,
}

impl Health {
    /// Starts the aggregation task of replica `replica` over `store` (its slots are
    /// written there every [`FLUSH_INTERVAL`]). It ends, after a last flush, once
    /// `shutdown` is set or every handle is gone.
    pub fn spawn(
        store: Store,
        replica: &str,
        shutdown: watch::Receiver<bool>,
    ) -> (Health, tokio::task::JoinHandle<()>) {
        Self::spawn_with(store, replica, FLUSH_INTERVAL, shutdown)
    }

    /// As [`spawn`](Self::spawn), flushing every `flush_interval`.
    pub fn spawn_with(
        store: Store,
        replica: &str,
        flush_interval: Duration,
        shutdown: watch::Receiver<bool>,
    ) -> (Health, tokio::task::JoinHandle<()>) {
        let (tx, rx) = mpsc::channel(QUEUE_CAPACITY);
        let handle =
            tokio::spawn(task::run(store.clone(), replica.to_string(), flush_interval, rx, shutdown));
        (Health { tx, store, replica: replica.into() }, handle)
    }

    /// Hands over the health of a status report of `instance` (stream of `environment`),
    /// about `revision` (the one the agent had applied). Never waits: with the task's
    /// queue full the report is dropped and counted.
    pub fn report(&self, environment: &str, instance: &str, revision: u64, r: &StatusReport) {
        let report = Report {
            environment: environment.to_string(),
            service: r.service.clone(),
            instance: instance.to_string(),
            revision,
            not_ready: r.not_ready,
            at_ms: now_ms(),
            windows: windows_of(r),
        };
        if self.tx.try_send(Msg::Report(report)).is_err() {
            metrics::counter!("levee_server_health_reports_dropped_total").increment(1);
        }
    }

    /// Writes this replica's slots to the database now (tests, shutdown).
    ///
    /// # Errors
    /// The database refused them (they are kept for the next flush), or the task is gone.
    pub async fn flush(&self) -> anyhow::Result<()> {
        let (reply, rx) = oneshot::channel();
        self.tx.send(Msg::Flush(reply)).await.map_err(|_| anyhow::anyhow!("the health task has ended"))?;
        rx.await.map_err(|_| anyhow::anyhow!("the health task has ended"))?
    }

    /// Every replica's rows of one service from `from_ms` on: the database's, with this
    /// replica's newer ones from memory in their place.
    async fn rows(&self, env: &str, service: &str, from_ms: i64) -> anyhow::Result<Vec<HealthRow>> {
        let stored = self.store.health_rows(env, service, from_ms).await?;
        let (reply, rx) = oneshot::channel();
        let pending = match self
            .tx
            .send(Msg::Pending { environment: env.to_string(), service: service.to_string(), reply })
            .await
        {
            Ok(()) => rx.await.unwrap_or_default(),
            Err(_) => Vec::new(),
        };
        type Key = (String, u64, i64, Option<SubjectKind>, String);
        let key =
            |r: &HealthRow| -> Key { (r.replica.clone(), r.revision, r.slot_ms, r.kind, r.name.clone()) };
        let mut all: BTreeMap<Key, HealthRow> = stored.into_iter().map(|r| (key(&r), r)).collect();
        for r in pending.into_iter().filter(|r| r.slot_ms >= from_ms) {
            all.insert(key(&r), r);
        }
        Ok(all.into_values().collect())
    }

    /// Health per revision of one service since `since_ms` (ms since the epoch; slots that
    /// end after it count), summed over every replica's agents, for the subjects `filter`
    /// selects. A revision appears when an agent on it reported.
    ///
    /// # Errors
    /// The database could not be read.
    pub async fn by_revision(
        &self,
        env: &str,
        service: &str,
        since_ms: i64,
        filter: &SubjectFilter,
    ) -> anyhow::Result<BTreeMap<u64, HealthTotals>> {
        let rows = self.rows(env, service, slot_of(since_ms)).await?;
        Ok(sum_by_revision(&rows, filter))
    }

    /// Health per revision and subject of one service since `since_ms`.
    ///
    /// # Errors
    /// The database could not be read.
    pub async fn by_revision_and_subject(
        &self,
        env: &str,
        service: &str,
        since_ms: i64,
    ) -> anyhow::Result<BTreeMap<u64, RevisionTotals>> {
        let rows = self.rows(env, service, slot_of(since_ms)).await?;
        let mut out: BTreeMap<u64, RevisionTotals> = BTreeMap::new();
        for (rev, t) in sum_by_revision(&rows, &SubjectFilter::All) {
            let r = out.entry(rev).or_default();
            r.instances = t.instances;
            r.not_ready = t.not_ready;
        }
        for r in &rows {
            let Some(kind) = r.kind else {
                let t = out.entry(r.revision).or_default();
                t.instance_slots += r.instances;
                t.not_ready_slots += r.not_ready;
                continue;
            };
            out.entry(r.revision)
                .or_default()
                .subjects
                .entry((kind, r.name.clone()))
                .or_insert_with(HealthTotals::empty)
                .add(&totals_of(r));
        }
        Ok(out)
    }

    /// The last report of every instance of one service connected to this replica that
    /// reported since `since_ms` (per instance the server keeps its last report only; use
    /// [`by_revision`](Self::by_revision) for totals over time across replicas).
    ///
    /// # Errors
    /// The task has ended.
    pub async fn instances(
        &self,
        env: &str,
        service: &str,
        since_ms: i64,
    ) -> anyhow::Result<Vec<InstanceHealth>> {
        let (reply, rx) = oneshot::channel();
        self.tx
            .send(Msg::Instances {
                environment: env.to_string(),
                service: service.to_string(),
                since_ms,
                reply,
            })
            .await
            .map_err(|_| anyhow::anyhow!("the health task has ended"))?;
        rx.await.map_err(|_| anyhow::anyhow!("the health task has ended"))
    }

    /// Every instance of one service connected to this replica that reported after
    /// `live_since_ms`, each with its reports that arrived after `from_ms` (an empty list
    /// when it reported nothing since; reports older than [`HISTORY`] are not kept).
    ///
    /// # Errors
    /// The task has ended.
    pub async fn reported(
        &self,
        env: &str,
        service: &str,
        from_ms: i64,
        live_since_ms: i64,
    ) -> anyhow::Result<Vec<InstanceReports>> {
        let (reply, rx) = oneshot::channel();
        self.tx
            .send(Msg::Reported {
                environment: env.to_string(),
                service: service.to_string(),
                from_ms,
                live_since_ms,
                reply,
            })
            .await
            .map_err(|_| anyhow::anyhow!("the health task has ended"))?;
        rx.await.map_err(|_| anyhow::anyhow!("the health task has ended"))
    }

    /// This replica's id (its rows' `replica`).
    pub fn replica(&self) -> &str {
        &self.replica
    }
}

/// The windows of every report in `instances` summed, for the subjects `filter` selects;
/// `instances` counts the instances with at least one report there, `not_ready` those of
/// them that said they were not ready in any of those reports.
pub fn sum_reports(instances: &[InstanceReports], filter: &SubjectFilter) -> HealthTotals {
    let mut t = HealthTotals::empty();
    for i in instances.iter().filter(|i| !i.reports.is_empty()) {
        t.instances += 1;
        t.not_ready += u64::from(i.reports.iter().any(|r| r.not_ready));
        for w in i.reports.iter().flat_map(|r| &r.windows).filter(|w| filter.matches(w.kind, &w.name)) {
            t.add(&w.counts);
        }
    }
    t
}

fn totals_of(r: &HealthRow) -> HealthTotals {
    let mut latency_buckets = r.latency.clone();
    latency_buckets.resize(LATENCY_BUCKETS, 0);
    HealthTotals {
        calls: r.calls,
        successes: r.successes,
        failures: r.failures,
        timeouts: r.timeouts,
        fallbacks: r.fallbacks,
        shed: r.shed,
        breaker_opens: r.breaker_opens,
        latency_buckets,
        instances: 0,
        not_ready: 0,
    }
}

/// Sums rows per revision: counts of the subjects `filter` selects, and instances as the
/// most that reported in one slot (summed over replicas).
fn sum_by_revision(rows: &[HealthRow], filter: &SubjectFilter) -> BTreeMap<u64, HealthTotals> {
    let mut out: BTreeMap<u64, HealthTotals> = BTreeMap::new();
    let mut per_slot: BTreeMap<(u64, i64), (u64, u64)> = BTreeMap::new();
    for r in rows {
        let t = out.entry(r.revision).or_insert_with(HealthTotals::empty);
        let Some(kind) = r.kind else {
            let s = per_slot.entry((r.revision, r.slot_ms)).or_default();
            s.0 += r.instances;
            s.1 += r.not_ready;
            continue;
        };
        if filter.matches(kind, &r.name) {
            t.add(&totals_of(r));
        }
    }
    for ((rev, _), (instances, not_ready)) in per_slot {
        let t = out.entry(rev).or_insert_with(HealthTotals::empty);
        t.instances = t.instances.max(instances);
        t.not_ready = t.not_ready.max(not_ready);
    }
    out
}

#[cfg(test)]
mod tests;

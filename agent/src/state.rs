//! The agent's shared state: the applied snapshot, staleness, and the slots that flag and
//! dependency handles read.
//!
//! One writer changes the applied snapshot (the builder at startup, then the sync task);
//! readers only load. Every change ends in [`Shared::refresh`], which rewrites the flag and
//! dependency slots and tells the timer task when the next time-driven change is due.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use arc_swap::{ArcSwap, ArcSwapOption};
use tokio::sync::{Notify, watch};
use tokio::time::Instant;

use crate::applied::{Applied, ResolveCtx, Source, StatusChanges};
use crate::cache::DiskCache;
use crate::enforce::{DepRegistry, Dependency};
use crate::feature::{Feature, FeatureRegistry};
use crate::flags::FlagRegistry;
use crate::health::MAX_HEALTH_WINDOWS;
use crate::metrics_names;
use crate::policy::ServiceConfig;
use crate::proto::StatusReport;

/// The last snapshot the agent rejected.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LastNack {
    /// Revision that was rejected.
    pub revision: u64,
    /// The reason sent to the server.
    pub detail: String,
}

/// What the agent enforces and how fresh it is; see [`Agent::status`](crate::Agent::status).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AgentStatus {
    /// Where the applied configuration came from.
    pub source: Source,
    /// Revision of the applied configuration (0 = compiled-in defaults).
    pub revision: u64,
    /// Hash of the applied snapshot body (empty for defaults).
    pub hash: String,
    /// Time since the configuration was last confirmed live (applied from the server or
    /// named current by a heartbeat; for a cached snapshot, at least since it was written).
    /// `None` when it never was (compiled-in defaults).
    pub age: Option<Duration>,
    /// Whether a sync stream is established right now.
    pub connected: bool,
    /// The last sync error (connection, stream or authorization), cleared when a stream
    /// is established.
    pub last_error: Option<String>,
    /// The last snapshot rejected, if any.
    pub last_nack: Option<LastNack>,
}

/// Adds the resilience layer's state (breakers, features, bulkheads, counters) to the
/// periodic status report the agent sends the server.
///
/// Register with [`Agent::add_status_contributor`](crate::Agent::add_status_contributor).
/// `contribute` runs on the sync task every report interval (~10 s); keep it short and
/// non-blocking.
pub trait StatusContributor: Send + Sync + 'static {
    /// Appends entries to `report` (its `service`, `applied_revision` and `source` are
    /// already filled in).
    fn contribute(&self, report: &mut StatusReport);

    /// Appends the health windows of what it counts (at most `room` windows in `out` in
    /// all), each covering the `window_ms` since the previous report and holding only
    /// what happened in it. Nothing by default.
    fn health(&self, window_ms: u64, room: usize, out: &mut Vec<crate::proto::HealthWindow>) {
        let _ = (window_ms, room, out);
    }
}

pub(crate) struct Shared {
    pub(crate) environment: String,
    pub(crate) service: String,
    pub(crate) defaults: Arc<ServiceConfig>,
    pub(crate) current: ArcSwap<Applied>,
    /// The snapshot the slots were last rewritten from. Status reads this, not `current`:
    /// a status naming revision N promises that handles already enforce N (the sync task
    /// swaps `current` a moment before the slots follow).
    enforced: ArcSwap<Applied>,
    pub(crate) flags: FlagRegistry,
    pub(crate) deps: DepRegistry,
    pub(crate) features: FeatureRegistry,
    pub(crate) cache: Option<DiskCache>,
    pub(crate) started_at: Instant,
    confirmed_at: ArcSwapOption<Instant>,
    connected: AtomicBool,
    last_error: ArcSwapOption<String>,
    last_nack: ArcSwapOption<LastNack>,
    /// `true` once the configuration has been confirmed live at least once. Every install or
    /// confirmation sends on it, and so does a lever override ending with time (value
    /// unchanged): what the admission engine watches.
    pub(crate) live_tx: watch::Sender<bool>,
    contributors: ArcSwap<Vec<Arc<dyn StatusContributor>>>,
    refresh_busy: AtomicBool,
    refresh_dirty: AtomicBool,
    next_wake: ArcSwapOption<Instant>,
    /// Whether the last refresh found a lever override in force: when that changes with
    /// time (the override expired), `live_tx` is bumped so the admission engine, which
    /// follows the configuration through it, re-resolves its settings.
    levers_in_force: AtomicBool,
    /// Wakes the timer task when `next_wake` changed.
    pub(crate) wake: Notify,
    /// Bumped when what the status report says about breakers, fallbacks or degraded
    /// features changes; the sync client sends a report soon after.
    pub(crate) status_changes: Arc<StatusChanges>,
    /// When the health windows were last taken (a status report built, or the windows cut
    /// at a change of revision), in ms since `started_at`: the next windows cover the
    /// time since.
    last_report_ms: AtomicU64,
    /// Windows cut when the enforced revision changed, each naming the revision its calls
    /// ran under; the next status report carries them before its own. At most
    /// [`MAX_HEALTH_WINDOWS`].
    cut_health: ArcSwap<Vec<crate::proto::HealthWindow>>,
    /// Readiness waits for a configuration confirmed live (`refuse_until_fresh`).
    pub(crate) refuse_until_fresh: AtomicBool,
    /// The instance id the agent announces, set once by `AgentBuilder::build` before any
    /// task runs: a fault rule naming instances applies only to those.
    pub(crate) instance_id: std::sync::OnceLock<String>,
}

impl fmt::Debug for Shared {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Shared")
            .field("environment", &self.environment)
            .field("service", &self.service)
            .field("revision", &self.current.load().revision)
            .finish_non_exhaustive()
    }
}

impl Shared {
    pub(crate) fn new(
        environment: String,
        service: String,
        defaults: Arc<ServiceConfig>,
        initial: Applied,
        confirmed_at: Option<Instant>,
        cache: Option<DiskCache>,
    ) -> Self {
        let (live_tx, _) = watch::channel(false);
        let initial = Arc::new(initial);
        let status_changes = Arc::new(StatusChanges::default());
        let shared = Self {
            deps: DepRegistry::new(&environment, &service),
            features: FeatureRegistry::new(&environment, &service, status_changes.clone()),
            status_changes,
            environment,
            service,
            defaults,
            enforced: ArcSwap::new(Arc::clone(&initial)),
            current: ArcSwap::new(initial),
            flags: FlagRegistry::default(),
            cache,
            started_at: Instant::now(),
            confirmed_at: ArcSwapOption::new(confirmed_at.map(Arc::new)),
            connected: AtomicBool::new(false),
            last_error: ArcSwapOption::empty(),
            last_nack: ArcSwapOption::empty(),
            live_tx,
            contributors: ArcSwap::from_pointee(Vec::new()),
            refresh_busy: AtomicBool::new(false),
            refresh_dirty: AtomicBool::new(false),
            next_wake: ArcSwapOption::empty(),
            levers_in_force: AtomicBool::new(false),
            wake: Notify::new(),
            last_report_ms: AtomicU64::new(0),
            cut_health: ArcSwap::from_pointee(Vec::new()),
            refuse_until_fresh: AtomicBool::new(false),
            instance_id: std::sync::OnceLock::new(),
        };
        shared.refresh();
        shared.update_metrics();
        shared
    }

    pub(crate) fn confirmed_at(&self) -> Option<Instant> {
        self.confirmed_at.load().as_deref().copied()
    }

    /// Runs `f` with a resolution context over the current state.
    pub(crate) fn with_ctx<R>(&self, f: impl FnOnce(&ResolveCtx<'_>) -> R) -> R {
        self.with_snapshot(|ctx, _| f(ctx))
    }

    fn with_snapshot<R>(&self, f: impl FnOnce(&ResolveCtx<'_>, &Arc<Applied>) -> R) -> R {
        let applied = self.current.load_full();
        let ctx = ResolveCtx {
            changes: &self.status_changes,
            applied: &applied,
            defaults: &self.defaults,
            declared: &self.flags,
            now: Instant::now(),
            confirmed_at: self.confirmed_at(),
            instance_id: self.instance_id.get().map_or("", String::as_str),
        };
        f(&ctx, &applied)
    }

    /// Rewrites every flag and dependency slot from the current state. Lock-free: when
    /// another thread is already refreshing, it is asked to run once more instead.
    pub(crate) fn refresh(&self) {
        self.refresh_dirty.store(true, Ordering::SeqCst);
        loop {
            if self.refresh_busy.compare_exchange(false, true, Ordering::SeqCst, Ordering::SeqCst).is_err() {
                return;
            }
            while self.refresh_dirty.swap(false, Ordering::SeqCst) {
                let (next, levers) = self.with_snapshot(|ctx, applied| {
                    let before = self.enforced.load().revision;
                    if applied.revision != before {
                        self.cut_health_windows(before);
                    }
                    let a = self.flags.refresh(ctx);
                    let b = self.deps.refresh(ctx);
                    let c = self.features.views.refresh(ctx);
                    let (levers, d) = ctx.levers();
                    self.enforced.store(Arc::clone(applied));
                    ([a, b, c, d].into_iter().flatten().min(), levers.is_some())
                });
                self.next_wake.store(next.map(Arc::new));
                if self.levers_in_force.swap(levers, Ordering::SeqCst) != levers {
                    self.live_tx.send_modify(|_| {});
                }
            }
            self.refresh_busy.store(false, Ordering::SeqCst);
            self.wake.notify_one();
            if !self.refresh_dirty.load(Ordering::SeqCst) {
                return;
            }
        }
    }

    /// When the next time-driven change is due (a flag, breaker override, fault rule or
    /// lever override expiring, a stale deadline).
    pub(crate) fn next_wake(&self) -> Option<Instant> {
        self.next_wake.load().as_deref().copied()
    }

    /// The handle of a dependency, registering its slot on first use. The slot is resolved
    /// once more after registration: a snapshot installed between reading the state and
    /// registering the slot would otherwise leave it stale until the next change (a kill
    /// switch ignored when the handle is taken while a push is being applied).
    pub(crate) fn dependency_handle(&self, name: &str) -> Dependency {
        let handle = self.with_ctx(|ctx| self.deps.handle(name, ctx));
        self.refresh();
        handle
    }

    /// The handle of a feature of the degradation matrix; registered and re-resolved like
    /// [`Shared::dependency_handle`].
    pub(crate) fn feature_handle(&self, name: &str) -> Feature {
        let handle = self.with_ctx(|ctx| self.features.handle(name, ctx));
        self.refresh();
        handle
    }

    /// Installs a newly applied snapshot from the server: swaps it in, marks it confirmed
    /// live, and rewrites the slots; only then wakes whoever waits for a live config, so a
    /// waiter never sees the new revision before the handles enforce it.
    pub(crate) fn install_live(&self, applied: Applied) {
        let at = applied.applied_at;
        self.current.store(Arc::new(applied));
        self.confirmed_at.store(Some(Arc::new(at)));
        self.refresh();
        self.live_tx.send_replace(true);
        self.update_metrics();
    }

    /// The server named `revision` as current for this service (a heartbeat): when it is
    /// what the agent enforces, the configuration is confirmed live.
    pub(crate) fn confirm(&self, revision: u64) -> bool {
        let current = self.current.load_full();
        if current.revision != revision {
            return false;
        }
        if current.source == Source::Cache {
            self.current.store(Arc::new(current.with_source(Source::Live)));
        }
        self.confirmed_at.store(Some(Arc::new(Instant::now())));
        self.refresh();
        self.live_tx.send_replace(true);
        self.update_metrics();
        true
    }

    pub(crate) fn set_connected(&self, connected: bool) {
        self.connected.store(connected, Ordering::SeqCst);
        if connected {
            self.last_error.store(None);
        }
        self.update_metrics();
    }

    pub(crate) fn set_error(&self, error: String) {
        self.last_error.store(Some(Arc::new(error)));
    }

    pub(crate) fn set_nack(&self, revision: u64, detail: String) {
        self.last_nack.store(Some(Arc::new(LastNack { revision, detail })));
        metrics::counter!(
            metrics_names::SNAPSHOTS_REJECTED_TOTAL,
            "environment" => self.environment.clone(),
            "service" => self.service.clone(),
        )
        .increment(1);
    }

    pub(crate) fn add_contributor(&self, c: Arc<dyn StatusContributor>) {
        self.contributors.rcu(|v| {
            let mut v = Vec::clone(v);
            v.push(c.clone());
            v
        });
    }

    /// Whether the service should report ready (see `Agent::readiness`): every critical
    /// dependency callable, and a configuration confirmed live when readiness waits for one.
    pub(crate) fn ready(&self) -> bool {
        (!self.refuse_until_fresh.load(Ordering::Relaxed) || *self.live_tx.borrow())
            && self.deps.critical_ready()
    }

    /// Appends the health windows of every dependency and contributor (routes) since they
    /// were last taken, until `out` holds [`MAX_HEALTH_WINDOWS`] windows; their counts
    /// start again from 0.
    fn take_health(&self, out: &mut Vec<crate::proto::HealthWindow>) {
        let now_ms = Instant::now().saturating_duration_since(self.started_at).as_millis() as u64;
        let window_ms = now_ms.saturating_sub(self.last_report_ms.swap(now_ms, Ordering::Relaxed));
        self.deps.health(window_ms, MAX_HEALTH_WINDOWS, out);
        for c in self.contributors.load().iter() {
            c.health(window_ms, MAX_HEALTH_WINDOWS, out);
        }
    }

    /// Cuts the health windows when the enforced revision changes from `revision`: the
    /// calls so far ran under it, and the report that follows the change names the new
    /// one, so the windows are kept aside naming `revision` (a rollout compares the
    /// revisions' health; a window straddling the change would lend the old revision's
    /// calls to the new one). Windows not sent yet are cut again into their own entries;
    /// when the ones kept aside already fill a report, the calls stay counted and go to
    /// the next revision's window.
    fn cut_health_windows(&self, revision: u64) {
        if self.cut_health.load().len() >= MAX_HEALTH_WINDOWS {
            return;
        }
        let mut cut = Vec::new();
        self.take_health(&mut cut);
        if cut.is_empty() {
            return;
        }
        for w in &mut cut {
            w.revision = revision;
        }
        self.cut_health.rcu(|kept| {
            let mut all = Vec::clone(kept);
            all.extend(cut.iter().take(MAX_HEALTH_WINDOWS.saturating_sub(kept.len())).cloned());
            all
        });
    }

    /// The periodic status report for the server. Its health windows cover the time since
    /// the previous report was built (those cut at a change of revision first, naming
    /// theirs), and their counts start again from 0: a report that is built must be sent
    /// (a dropped one loses its windows' counts, never counts twice).
    pub(crate) fn status_report(&self) -> StatusReport {
        let current = self.enforced.load();
        let mut report = StatusReport {
            service: self.service.clone(),
            applied_revision: current.revision,
            source: current.source.as_str().to_string(),
            not_ready: !self.ready(),
            ..StatusReport::default()
        };
        report.health = Vec::clone(&self.cut_health.swap(Arc::new(Vec::new())));
        self.take_health(&mut report.health);
        self.deps.contribute(&mut report);
        self.features.contribute(&mut report);
        for c in self.contributors.load().iter() {
            c.contribute(&mut report);
        }
        report
    }

    pub(crate) fn status(&self) -> AgentStatus {
        let current = self.enforced.load();
        AgentStatus {
            source: current.source,
            revision: current.revision,
            hash: current.hash.clone(),
            age: self.confirmed_at().map(|c| Instant::now().saturating_duration_since(c)),
            connected: self.connected.load(Ordering::SeqCst),
            last_error: self.last_error.load_full().map(|e| e.to_string()),
            last_nack: self.last_nack.load_full().map(|n| LastNack::clone(&n)),
        }
    }

    /// Publishes the staleness gauges (also called periodically by the sync task so the
    /// age keeps growing while nothing happens), and every dependency's and feature's
    /// sampled gauges; series of a recorder installed after the agent was built are
    /// registered here at the latest (CB-9).
    pub(crate) fn update_metrics(&self) {
        if crate::metrics_names::recorder_installed() {
            self.deps.publish_metrics();
            self.features.publish_metrics();
        }
        let current = self.current.load();
        let env = self.environment.clone();
        let svc = self.service.clone();
        metrics::gauge!(metrics_names::CONFIG_REVISION, "environment" => env.clone(), "service" => svc.clone())
            .set(current.revision as f64);
        let age = self.confirmed_at().unwrap_or(self.started_at);
        metrics::gauge!(metrics_names::CONFIG_AGE_SECONDS, "environment" => env.clone(), "service" => svc.clone())
            .set(Instant::now().saturating_duration_since(age).as_secs_f64());
        for s in [Source::Live, Source::Cache, Source::Default] {
            metrics::gauge!(
                metrics_names::CONFIG_SOURCE,
                "environment" => env.clone(),
                "service" => svc.clone(),
                "source" => s.as_str(),
            )
            .set(if s == current.source { 1.0 } else { 0.0 });
        }
        metrics::gauge!(metrics_names::SYNC_CONNECTED, "environment" => env, "service" => svc)
            .set(if self.connected.load(Ordering::SeqCst) { 1.0 } else { 0.0 });
    }
}

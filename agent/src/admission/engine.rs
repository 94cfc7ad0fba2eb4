use std::borrow::Cow;
use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock, Weak};
use std::time::Duration;

use arc_swap::ArcSwap;
use metrics::{Counter, Gauge, Histogram};
use tokio::sync::{Notify, mpsc, watch};
use tokio::time::Instant;

use super::limit::Limiter;
use super::permit::{AdmissionPermit, CoreRef, Outcome};
use super::queue::{self, Wait, Waiter};
use super::route::{DEFAULT_EXEMPT_PATHS, RouteEntry, RouteSlots, RouteTable};
use super::{AdmissionStatus, Reason, Rejected};
use crate::deadline::Deadline;
use crate::flags::FlagBool;
use crate::metrics_names as names;
use crate::policy::{self, AdmissionMode, Criticality, ServiceConfig};
use crate::retry::FastRng;
use crate::state::Shared;

// The state word: requests in flight (low 32 bits) and admissions so far (high 32 bits,
// wrapping), so admitting is one CAS that also numbers the request.
const IN_FLIGHT: u64 = 0xffff_ffff;
const ADMITTED_ONE: u64 = 1 << 32;

/// The policy an engine enforces, resolved for the request path; swapped as a whole.
pub(crate) struct Settings {
    pub(crate) inbound: policy::Inbound,
    pub(crate) max_deadline: Duration,
    pub(crate) default_deadline: Duration,
    /// `shed_sheddable_percent` in hundredths of a percent.
    shed_permyriad: u64,
    read_only: Option<(String, FlagBool)>,
    pub(crate) routes: RouteTable,
    /// The agent configuration this was resolved from (`None` for a standalone engine).
    source: Option<Source>,
    exempt: Arc<Vec<Box<str>>>,
}

/// An agent configuration the settings were resolved from, and how to tell it changed.
#[derive(Clone)]
struct Source {
    /// Held, so its address cannot be reused by a newer configuration.
    config: Arc<ServiceConfig>,
    /// Subscribed before `config` was read: the agent bumps this channel every time it
    /// installs or confirms a configuration, so "has it changed?" is one atomic load.
    changes: watch::Receiver<bool>,
}

impl Settings {
    /// The same settings over other routes, exempt paths and source.
    fn with(&self, routes: RouteTable, exempt: Arc<Vec<Box<str>>>, source: Option<Source>) -> Self {
        Self {
            inbound: self.inbound.clone(),
            max_deadline: self.max_deadline,
            default_deadline: self.default_deadline,
            shed_permyriad: self.shed_permyriad,
            read_only: self.read_only.clone(),
            routes,
            source,
            exempt,
        }
    }
}

/// The engine's series, bound to the recorder late ([`late`](names::late)): at
/// construction when a recorder is installed, else at their first use or the next
/// [`Admission::status`] after one is (CB-9).
#[derive(Default)]
struct Metrics {
    limit: OnceLock<Gauge>,
    in_flight: OnceLock<Gauge>,
    queue_length: OnceLock<Gauge>,
    queue_delay: OnceLock<Histogram>,
    overloaded: OnceLock<Gauge>,
    route_overflow: OnceLock<Counter>,
}

impl Metrics {
    fn gauge(cell: &OnceLock<Gauge>, name: &'static str, value: f64) {
        if let Some(g) = names::late(cell, || metrics::gauge!(name)) {
            g.set(value);
        }
    }

    fn queue_delay(&self) -> Option<&Histogram> {
        names::late(&self.queue_delay, || metrics::histogram!(names::ADMISSION_QUEUE_DELAY))
    }

    fn route_overflow(&self) -> Option<&Counter> {
        names::late(&self.route_overflow, || metrics::counter!(names::ADMISSION_ROUTE_OVERFLOW))
    }
}

/// State shared by the handles, the permits, the waiters and the queue task.
pub(crate) struct Core {
    state: AtomicU64,
    limit: AtomicU32,
    /// Requests waiting in the queue (enqueued and not yet answered).
    pub(crate) waiting: AtomicU32,
    pub(crate) queue_len: AtomicU32,
    pub(crate) overloaded: AtomicBool,
    pub(crate) settings: ArcSwap<Settings>,
    pub(crate) limiter: Limiter,
    /// Wakes the queue task: a slot was released, the limit rose, the settings changed.
    pub(crate) notify: Notify,
    rng: FastRng,
    route_overflow: AtomicU64,
    metrics: Metrics,
    feed: Option<Arc<Shared>>,
    applying: AtomicBool,
    /// Every route state the settings ever held, by slot: what a permit's route slot
    /// names.
    pub(crate) route_slots: RouteSlots,
}

impl fmt::Debug for Core {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Admission")
            .field("limit", &self.limit.load(Ordering::Relaxed))
            .field("in_flight", &self.in_flight())
            .field("waiting", &self.waiting.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

impl Core {
    pub(crate) fn in_flight(&self) -> u32 {
        (self.state.load(Ordering::Relaxed) & IN_FLIGHT) as u32
    }

    pub(crate) fn limit(&self) -> u32 {
        self.limit.load(Ordering::Relaxed)
    }

    /// Takes a slot when fewer than `limit` are in flight; returns the number in flight
    /// with it and the admission's sequence number.
    #[inline]
    pub(crate) fn try_acquire(&self) -> Option<(u32, u64)> {
        let limit = u64::from(self.limit.load(Ordering::Relaxed));
        let mut s = self.state.load(Ordering::Relaxed);
        loop {
            if s & IN_FLIGHT >= limit {
                return None;
            }
            match self.state.compare_exchange_weak(
                s,
                s + 1 + ADMITTED_ONE,
                Ordering::AcqRel,
                Ordering::Relaxed,
            ) {
                Ok(_) => return Some((((s & IN_FLIGHT) + 1) as u32, s >> 32)),
                Err(cur) => s = cur,
            }
        }
    }

    /// Whether a request arriving now would have to wait for a slot: others wait, or the
    /// limit is reached.
    #[inline]
    fn busy(&self) -> bool {
        self.waiting.load(Ordering::SeqCst) > 0 || self.in_flight() >= self.limit()
    }

    /// Takes a slot whatever the limit (CRITICAL_PLUS is never shed).
    fn force_acquire(&self) -> (u32, u64) {
        let s = self.state.fetch_add(1 + ADMITTED_ONE, Ordering::AcqRel);
        (((s & IN_FLIGHT) + 1) as u32, s >> 32)
    }

    /// Gives a slot back and wakes the queue task when someone waits.
    #[inline]
    pub(crate) fn release(&self) {
        self.state.fetch_sub(1, Ordering::SeqCst);
        if self.waiting.load(Ordering::SeqCst) > 0 {
            self.notify.notify_one();
        }
    }

    pub(crate) fn set_limit(&self, limit: u32) {
        let old = self.limit.swap(limit.max(1), Ordering::SeqCst);
        Metrics::gauge(&self.metrics.limit, names::ADMISSION_LIMIT, f64::from(limit));
        Metrics::gauge(&self.metrics.in_flight, names::ADMISSION_IN_FLIGHT, f64::from(self.in_flight()));
        if limit > old {
            self.notify.notify_one();
        }
    }

    pub(crate) fn publish_queue(&self, len: usize, overloaded: bool) {
        let len = u32::try_from(len).unwrap_or(u32::MAX);
        self.queue_len.store(len, Ordering::Relaxed);
        self.overloaded.store(overloaded, Ordering::Relaxed);
        let m = &self.metrics;
        Metrics::gauge(&m.queue_length, names::ADMISSION_QUEUE_LENGTH, f64::from(len));
        Metrics::gauge(&m.overloaded, names::ADMISSION_OVERLOADED, if overloaded { 1.0 } else { 0.0 });
        Metrics::gauge(&m.in_flight, names::ADMISSION_IN_FLIGHT, f64::from(self.in_flight()));
    }

    /// Publishes the gauges at their current values, registering every series with a
    /// recorder installed since the engine was built (CB-9).
    fn publish_metrics(&self) {
        let len = self.queue_len.load(Ordering::Relaxed);
        self.publish_queue(len as usize, self.overloaded.load(Ordering::Relaxed));
        Metrics::gauge(&self.metrics.limit, names::ADMISSION_LIMIT, f64::from(self.limit()));
        self.metrics.queue_delay();
        self.metrics.route_overflow();
    }

    pub(crate) fn record_queue_delay(&self, waited: Duration) {
        if let Some(h) = self.metrics.queue_delay() {
            h.record(waited.as_secs_f64());
        }
    }

    fn read_only(settings: &Settings) -> bool {
        settings.read_only.as_ref().is_some_and(|(_, f)| f.get())
    }
}

/// The inbound admission engine of one service: concurrency limit, criticality, CoDel
/// queue, operator levers, shadow mode (agent-semantics §5).
///
/// One engine per service: [`Agent::admission`](crate::Agent::admission) returns the
/// agent's (it follows the agent's policy by itself: whether the agent installed a new
/// configuration is one atomic load per request); [`Admission::new`] builds a
/// standalone one fed with [`Admission::update`]. Cheap to clone; every clone, every
/// [`AdmissionLayer`](super::AdmissionLayer) built from it and every [`admit`](Self::admit)
/// call share the same limit and queue.
///
/// The request path is lock-free and does not allocate when the limit is not reached:
/// one `arc-swap` load of the settings, a route lookup, one CAS to take a slot; the permit
/// gives the slot back with one atomic subtraction. Waiting requests are ordered by a
/// queue task (spawned on the tokio runtime the engine is built on).
#[derive(Clone)]
pub struct Admission {
    inner: Arc<Handle>,
}

struct Handle {
    core: Arc<Core>,
    tx: mpsc::UnboundedSender<Waiter>,
}

impl fmt::Debug for Admission {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.inner.core.fmt(f)
    }
}

/// What admission decided for one request.
pub(crate) enum Start<'p> {
    Admitted(AdmissionPermit<'p>),
    Rejected(Rejected),
    Queued(Wait),
}

/// One request to admit through the plain API; see [`Admission::admit`].
#[derive(Clone, Copy, Debug)]
pub struct AdmissionRequest<'a> {
    route: &'a str,
    criticality: Option<Criticality>,
    deadline: Option<Deadline>,
}

impl<'a> AdmissionRequest<'a> {
    /// A request of `route`: its template, `"METHOD /path/{param}"` for HTTP or the method
    /// path for gRPC — never a raw path.
    pub fn new(route: &'a str) -> Self {
        Self { route, criticality: None, deadline: None }
    }

    /// Its criticality; default: the route's ([`route_criticality`](super::route_criticality):
    /// the policy's for the route, else `inbound.default_criticality`, else by the route's
    /// method).
    pub fn criticality(mut self, c: Criticality) -> Self {
        self.criticality = Some(c);
        self
    }

    /// Its deadline: an expired one is refused; while the service is busy, one whose
    /// remaining time is shorter than the route's expected service time is dropped too
    /// (reason `deadline`). Default: the deadline of the task's request context when its
    /// caller sent one ([`RequestContext::from_caller`](crate::deadline::RequestContext::from_caller)),
    /// else none.
    pub fn deadline(mut self, d: Deadline) -> Self {
        self.deadline = Some(d);
        self
    }
}

impl Admission {
    /// A standalone engine enforcing `inbound` (change it with [`update`](Self::update)).
    ///
    /// # Panics
    /// When called outside a tokio runtime (the queue task is spawned on it).
    pub fn new(inbound: &policy::Inbound) -> Self {
        Self::with_seed(inbound, rand::random())
    }

    /// As [`new`](Self::new), with the random draws (operator shedding, Vegas probe
    /// jitter) seeded: the same sequence of requests gets the same decisions (tests,
    /// simulations, comparing shadow and enforce mode).
    ///
    /// # Panics
    /// When called outside a tokio runtime.
    pub fn with_seed(inbound: &policy::Inbound, seed: u64) -> Self {
        let p = policy::Policy::default();
        Self::build(
            inbound,
            p.max_deadline,
            p.default_deadline,
            None,
            seed,
            &tokio::runtime::Handle::current(),
        )
    }

    /// The engine of an agent: follows the agent's applied policy (whether it changed is
    /// one atomic load per request) and its read-only flag.
    pub(crate) fn for_agent(shared: Arc<Shared>, runtime: &tokio::runtime::Handle) -> Self {
        let config = shared.current.load().config.clone();
        let policy = &config.policy;
        let a = Self::build(
            &policy.inbound,
            policy.max_deadline,
            policy.default_deadline,
            Some(shared.clone()),
            rand::random(),
            runtime,
        );
        a.refresh(&shared);
        a
    }

    fn build(
        inbound: &policy::Inbound,
        max_deadline: Duration,
        default_deadline: Duration,
        feed: Option<Arc<Shared>>,
        seed: u64,
        runtime: &tokio::runtime::Handle,
    ) -> Self {
        let exempt: Arc<Vec<Box<str>>> = Arc::new(DEFAULT_EXEMPT_PATHS.iter().map(|p| (*p).into()).collect());
        let limiter = Limiter::new(&inbound.limit, seed);
        let route_slots = RouteSlots::default();
        let settings = Settings {
            inbound: inbound.clone(),
            max_deadline,
            default_deadline,
            shed_permyriad: permyriad(inbound.shed_sheddable_percent),
            read_only: None,
            routes: RouteTable::build(inbound, &exempt, None, &route_slots),
            source: None,
            exempt,
        };
        let core = Arc::new(Core {
            state: AtomicU64::new(0),
            limit: AtomicU32::new(limiter.limit()),
            waiting: AtomicU32::new(0),
            queue_len: AtomicU32::new(0),
            overloaded: AtomicBool::new(false),
            settings: ArcSwap::from_pointee(settings),
            limiter,
            notify: Notify::new(),
            rng: FastRng::with_seed(seed),
            route_overflow: AtomicU64::new(0),
            metrics: Metrics::default(),
            feed,
            applying: AtomicBool::new(false),
            route_slots,
        });
        names::recorder_installed();
        core.set_limit(core.limiter.limit());
        core.publish_metrics();
        let (tx, rx) = mpsc::unbounded_channel();
        runtime.spawn(queue::run(core.clone(), rx));
        Self { inner: Arc::new(Handle { core, tx }) }
    }

    pub(crate) fn core(&self) -> &Arc<Core> {
        &self.inner.core
    }

    /// Reports this engine in the agent's status report without keeping it alive.
    pub(crate) fn contributor(&self) -> Arc<dyn crate::StatusContributor> {
        Arc::new(Report(Arc::downgrade(&self.inner)))
    }

    /// Applies new admission settings to a standalone engine. Requests in flight are never
    /// affected; a new limit applies to the next admissions; the queue follows the new
    /// CoDel settings, and a changed `queue.flush_generation` flushes it. (An agent's
    /// engine follows the agent's policy by itself.)
    pub fn update(&self, inbound: &policy::Inbound) {
        let old = self.inner.core.settings.load();
        self.apply(
            inbound,
            old.max_deadline,
            old.default_deadline,
            old.read_only.clone(),
            old.source.clone(),
        );
    }

    /// Never sheds requests whose route path (the template without the method, e.g.
    /// `"/status"`, or a gRPC method path) is `path`, in addition to
    /// [`DEFAULT_EXEMPT_PATHS`](super::DEFAULT_EXEMPT_PATHS): for health, readiness and
    /// metrics endpoints with other names. Exempt requests are not counted in flight.
    pub fn exempt(&self, path: &str) {
        let core = &self.inner.core;
        core.settings.rcu(|s| {
            let mut exempt = Vec::clone(&s.exempt);
            if !exempt.iter().any(|e| **e == *path) {
                exempt.push(path.into());
            }
            let exempt = Arc::new(exempt);
            s.with(
                RouteTable::build(&s.inbound, &exempt, Some(&s.routes), &core.route_slots),
                exempt,
                s.source.clone(),
            )
        });
    }

    fn apply(
        &self,
        inbound: &policy::Inbound,
        max_deadline: Duration,
        default_deadline: Duration,
        read_only: Option<(String, FlagBool)>,
        source: Option<Source>,
    ) {
        let core = &self.inner.core;
        let limit = core.limiter.reconfigure(&inbound.limit);
        core.settings.rcu(|old| {
            let routes = if old.inbound == *inbound {
                old.routes.clone()
            } else {
                RouteTable::build(inbound, &old.exempt, Some(&old.routes), &core.route_slots)
            };
            Settings {
                inbound: inbound.clone(),
                max_deadline,
                default_deadline,
                shed_permyriad: permyriad(inbound.shed_sheddable_percent),
                read_only: read_only.clone(),
                routes,
                source: source.clone(),
                exempt: old.exempt.clone(),
            }
        });
        core.set_limit(limit);
        // The queue task re-reads the settings (CoDel, flush generation).
        core.notify.notify_one();
    }

    /// Re-resolves the settings from the agent's applied configuration.
    fn refresh(&self, shared: &Shared) {
        let core = &self.inner.core;
        if core.applying.compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed).is_err() {
            return; // another request is applying it; this one uses the previous settings
        }
        let changes = shared.live_tx.subscribe();
        // The configuration and the operator levers in force now (a lever override that
        // ends with time bumps `changes` too).
        let (config, levers) = shared.with_ctx(|ctx| (ctx.applied.config.clone(), ctx.levers().0.cloned()));
        let old = core.settings.load_full();
        let source = Source { config: config.clone(), changes };
        let policy = &config.policy;
        let inbound = policy.inbound.with_levers(levers.as_ref());
        if old.source.as_ref().is_some_and(|s| Arc::ptr_eq(&s.config, &config)) && old.inbound == *inbound {
            // The same configuration, confirmed again: only remember that it was seen.
            core.settings.rcu(|s| s.with(s.routes.clone(), s.exempt.clone(), Some(source.clone())));
        } else {
            let read_only = match (&policy.inbound.read_only_flag, &old.read_only) {
                (Some(key), Some((k, handle))) if k == key => Some((k.clone(), handle.clone())),
                (Some(key), _) => {
                    let handle = shared.with_ctx(|ctx| shared.flags.declare_bool(key, false, ctx));
                    shared.refresh();
                    Some((key.clone(), handle))
                }
                (None, _) => None,
            };
            self.apply(&inbound, policy.max_deadline, policy.default_deadline, read_only, Some(source));
        }
        core.applying.store(false, Ordering::Release);
    }

    /// The settings, after following the agent's policy when it changed.
    #[inline]
    pub(crate) fn settings(&self) -> arc_swap::Guard<Arc<Settings>> {
        let core = &self.inner.core;
        let settings = core.settings.load();
        if let Some(shared) = &core.feed
            && settings.source.as_ref().is_none_or(|s| s.changes.has_changed().unwrap_or(false))
        {
            drop(settings);
            self.refresh(shared);
            return core.settings.load();
        }
        settings
    }

    /// The entry of route `name`, registering it on first sight (bounded: past
    /// [`MAX_TRACKED_ROUTES`](super::MAX_TRACKED_ROUTES), the shared overflow route).
    #[inline]
    pub(crate) fn route<'s>(&self, settings: &'s Settings, name: &str) -> Cow<'s, Arc<RouteEntry>> {
        match settings.routes.get(name) {
            Some(e) => Cow::Borrowed(e),
            None => Cow::Owned(self.register(name)),
        }
    }

    /// The entry of a route named by the client alone (a gRPC method path): its own when
    /// it is tracked already (the policy names it, or the service answered it before) or
    /// exempt (health), else `None` — it shares [`UNMATCHED_ROUTE`] until
    /// [`confirm`](Self::confirm)ed.
    #[inline]
    pub(crate) fn tracked_route<'s>(
        &self,
        settings: &'s Settings,
        name: &str,
    ) -> Option<Cow<'s, Arc<RouteEntry>>> {
        match settings.routes.get(name) {
            Some(e) => Some(Cow::Borrowed(e)),
            None if super::route::is_exempt(name, &settings.exempt) => Some(Cow::Owned(self.register(name))),
            None => None,
        }
    }

    /// Tracks `name` from now on: the service answered a request of it (IN-7).
    #[cold]
    pub(crate) fn confirm(&self, name: &str) {
        if self.inner.core.settings.load().routes.get(name).is_none() {
            self.register(name);
        }
    }

    #[cold]
    fn register(&self, name: &str) -> Arc<RouteEntry> {
        let core = &self.inner.core;
        let mut out = None;
        // Made once, however often the update is retried: each state takes a slot.
        let mut state = None;
        core.settings.rcu(|s| {
            if let Some(e) = s.routes.get(name) {
                out = Some(e.clone());
                return Arc::clone(s);
            }
            if s.routes.is_full() {
                out = Some(s.routes.overflow(name, &s.exempt));
                return Arc::clone(s);
            }
            let state = state.get_or_insert_with(|| core.route_slots.state(name)).clone();
            let (routes, entry) = s.routes.with(name, &s.inbound, &s.exempt, state);
            out = Some(entry);
            Arc::new(s.with(routes, s.exempt.clone(), s.source.clone()))
        });
        let entry = out.expect("rcu ran at least once");
        if Arc::ptr_eq(&entry.state, core.settings.load().routes.overflow_state()) {
            core.route_overflow.fetch_add(1, Ordering::Relaxed);
            if let Some(c) = core.metrics.route_overflow() {
                c.increment(1);
            }
        }
        entry
    }

    /// Decides for one request (see the module docs for the order of the checks).
    /// `owner` makes the engine reference of a permit holding a slot (called only then).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn start<'p>(
        &self,
        settings: &Settings,
        entry: &Arc<RouteEntry>,
        criticality: Criticality,
        deadline: Option<Deadline>,
        may_wait: bool,
        outcome: Outcome,
        owner: impl FnOnce() -> CoreRef<'p>,
    ) -> Start<'p> {
        let core = &self.inner.core;
        if entry.exempt {
            return Start::Admitted(AdmissionPermit::uncounted(None, criticality, outcome));
        }
        let shadow = settings.inbound.mode == AdmissionMode::Shadow;
        // Read-only mode is a deliberate operator switch, not a policy on trial: enforced
        // in shadow mode too.
        if entry.mutating && Core::read_only(settings) {
            entry.state.count_shed(false, criticality, Reason::ReadOnly);
            return Start::Rejected(Rejected::new(Reason::ReadOnly, criticality));
        }
        if criticality >= Criticality::SheddablePlus
            && settings.shed_permyriad > 0
            && core.rng.below(10_000) < settings.shed_permyriad
        {
            return Self::shed(entry, criticality, Reason::Operator, shadow, outcome);
        }
        if let Some(d) = deadline {
            // An expired deadline is refused whatever the load. One shorter than the
            // route's expected service time only while the service is busy (a slot must
            // be waited for): then serving it would take capacity from requests that can
            // still finish. With a free slot it is served — nothing is gained by refusing
            // it, and the admitted requests keep the route's learned service time up to
            // date, so no estimate can lock a route out of an idle service (IN-4).
            let left = d.instant().saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Self::shed(entry, criticality, Reason::Deadline, shadow, outcome);
            }
            if left < entry.state.expected() && core.busy() {
                entry.state.refused_for_time();
                return Self::shed(entry, criticality, Reason::Deadline, shadow, outcome);
            }
        }
        let acquired = if criticality == Criticality::CriticalPlus {
            Some(core.force_acquire())
        } else if core.waiting.load(Ordering::SeqCst) == 0 {
            core.try_acquire()
        } else {
            None // others wait: no overtaking them
        };
        if let Some((in_flight, seq)) = acquired {
            let stride = core.limiter.sample_stride();
            let started = (seq & (stride - 1) == 0).then(|| (Instant::now(), stride));
            return Start::Admitted(AdmissionPermit::counted(
                owner(),
                &entry.state,
                started,
                criticality,
                in_flight,
                outcome,
            ));
        }
        let max_len = settings.inbound.queue.max_len;
        if shadow {
            if max_len == 0 {
                return Self::shed(entry, criticality, Reason::Limit, true, outcome);
            }
            entry.state.count_would_queue(criticality);
            return Start::Admitted(AdmissionPermit::uncounted(Some(&entry.state), criticality, outcome));
        }
        if max_len == 0 || !may_wait {
            return Self::shed(entry, criticality, Reason::Limit, false, outcome);
        }
        self.enqueue(entry.clone(), criticality, deadline, outcome)
    }

    fn shed<'p>(
        entry: &Arc<RouteEntry>,
        criticality: Criticality,
        reason: Reason,
        shadow: bool,
        outcome: Outcome,
    ) -> Start<'p> {
        entry.state.count_shed(shadow, criticality, reason);
        if shadow {
            Start::Admitted(AdmissionPermit::uncounted(Some(&entry.state), criticality, outcome))
        } else {
            Start::Rejected(Rejected::new(reason, criticality))
        }
    }

    #[cold]
    fn enqueue(
        &self,
        entry: Arc<RouteEntry>,
        criticality: Criticality,
        deadline: Option<Deadline>,
        outcome: Outcome,
    ) -> Start<'static> {
        let core = &self.inner.core;
        core.waiting.fetch_add(1, Ordering::SeqCst);
        let (waiter, wait) = queue::waiter(core.clone(), entry, criticality, deadline, outcome);
        if let Err(mpsc::error::SendError(waiter)) = self.inner.tx.send(waiter) {
            // The queue task is gone (runtime shutting down): nobody will answer.
            drop(waiter);
        }
        Start::Queued(wait)
    }

    /// Admits a request through the plain API, waiting in the queue when the limit is
    /// reached (bounded by CoDel and the deadline).
    ///
    /// The permit holds the slot; dropping it gives the slot back and records the
    /// request's latency and [`Outcome`] (default [`Outcome::Success`]; set another with
    /// [`AdmissionPermit::set_outcome`]). Dropped while a panic unwinds, it records
    /// nothing but still gives the slot back. The deadline defaults to the task's request
    /// context deadline when a caller sent it.
    ///
    /// # Errors
    /// [`Rejected`] with its [`Reason`]. In shadow mode, never (the would-be rejection is
    /// counted and the request admitted).
    pub fn admit(&self, req: &AdmissionRequest<'_>) -> super::Admit {
        let settings = self.settings();
        let entry = self.route(&settings, req.route);
        let deadline = req.deadline.or_else(crate::deadline::caller_deadline);
        let criticality = req.criticality.unwrap_or(entry.criticality);
        let owner = || CoreRef::Shared(self.inner.core.clone());
        match self.start(&settings, &entry, criticality, deadline, true, Outcome::Success, owner) {
            Start::Admitted(p) => super::Admit::ready(Ok(p)),
            Start::Rejected(r) => super::Admit::ready(Err(r)),
            Start::Queued(w) => super::Admit::waiting(w),
        }
    }

    /// Admits a request only if it needs not wait: as [`admit`](Self::admit), but a
    /// request that would have to queue is refused at once (reason `limit`). Never
    /// allocates.
    ///
    /// # Errors
    /// [`Rejected`] with its [`Reason`].
    pub fn try_admit(&self, req: &AdmissionRequest<'_>) -> Result<AdmissionPermit<'_>, Rejected> {
        let settings = self.settings();
        let entry = self.route(&settings, req.route);
        let deadline = req.deadline.or_else(crate::deadline::caller_deadline);
        let criticality = req.criticality.unwrap_or(entry.criticality);
        let owner = || CoreRef::Borrowed(&self.inner.core);
        match self.start(&settings, &entry, criticality, deadline, false, Outcome::Success, owner) {
            Start::Admitted(p) => Ok(p),
            Start::Rejected(r) => Err(r),
            Start::Queued(_) => unreachable!("may_wait is false"),
        }
    }

    /// Whether read-only mode is on (the `inbound.read_only_flag` flag is `true`). The
    /// service reads it too, to refuse writes outside mutating routes or to say so in
    /// its pages.
    pub fn read_only(&self) -> bool {
        Core::read_only(&self.settings())
    }

    /// The engine's state: limit, in flight, queue, overload, and per route what was
    /// admitted, shed (by criticality and reason) and, in shadow mode, would have been.
    pub fn status(&self) -> AdmissionStatus {
        let settings = self.settings();
        let core = &self.inner.core;
        core.publish_metrics();
        let mut routes: Vec<_> = settings.routes.states().map(|s| s.status()).collect();
        let overflow = settings.routes.overflow_state().status();
        if !overflow.shed.is_empty() || !overflow.would_shed.is_empty() {
            routes.push(overflow);
        }
        routes.sort_by(|a, b| a.route.cmp(&b.route));
        AdmissionStatus {
            mode: settings.inbound.mode,
            algorithm: core.limiter.algorithm(),
            limit: core.limit(),
            in_flight: core.in_flight(),
            queued: core.waiting.load(Ordering::Relaxed),
            overloaded: core.overloaded.load(Ordering::Relaxed),
            read_only: Core::read_only(&settings),
            tracked_routes: settings.routes.len(),
            route_overflow: core.route_overflow.load(Ordering::Relaxed),
            routes,
        }
    }

    /// Appends the health window of every route that saw requests since the last report
    /// (`window_ms` long, kind [`KIND_ROUTE`](crate::health::KIND_ROUTE), named as in
    /// [`route_key`](super::route_key); the shared overflow route included), at most
    /// `room` windows in all; the other routes keep their counts for a later report.
    /// Exempt routes (health, readiness, metrics) count nothing.
    pub(crate) fn health(&self, window_ms: u64, room: usize, out: &mut Vec<crate::proto::HealthWindow>) {
        let settings = self.inner.core.settings.load();
        let routes = settings.routes.states().chain(std::iter::once(settings.routes.overflow_state()));
        for state in routes {
            if out.len() >= room {
                return;
            }
            if let Some(w) = state.health.take(crate::health::KIND_ROUTE, &state.name, window_ms, 0) {
                out.push(w);
            }
        }
    }

    /// A tower layer admitting every request of a server (axum, hyper, tonic) through this
    /// engine; see [`AdmissionLayer`](super::AdmissionLayer).
    pub fn layer(&self) -> super::AdmissionLayer {
        super::AdmissionLayer::new(self.clone())
    }
}

struct Report(Weak<Handle>);

impl crate::StatusContributor for Report {
    fn contribute(&self, report: &mut crate::proto::StatusReport) {
        if let Some(inner) = self.0.upgrade() {
            Admission { inner }.status().contribute(report);
        }
    }

    fn health(&self, window_ms: u64, room: usize, out: &mut Vec<crate::proto::HealthWindow>) {
        if let Some(inner) = self.0.upgrade() {
            Admission { inner }.health(window_ms, room, out);
        }
    }
}

fn permyriad(percent: f64) -> u64 {
    if percent.is_finite() { (percent.clamp(0.0, 100.0) * 100.0).round() as u64 } else { 0 }
}

use std::fmt;
use std::sync::Arc;

use tokio::time::Instant;

use super::engine::Core;
use super::route::{NO_SLOT, RouteState};
use crate::health::HealthOutcome;
use crate::policy::Criticality;

/// How an admitted request ended, as the concurrency limit sees it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Outcome {
    /// Served (whatever the answer): its latency is a sample for the limit.
    #[default]
    Success,
    /// Ended as an overload signal (the service answered 503/504 or gRPC UNAVAILABLE /
    /// RESOURCE_EXHAUSTED / DEADLINE_EXCEEDED, or timed out): counts as a *drop* for the
    /// limit algorithm, which then lowers the limit.
    Dropped,
    /// Says nothing about the service's load (cancelled by the client, failed before any
    /// work): not a sample (as Netflix concurrency-limits' `onIgnore`; cancellations were
    /// once counted as drops there, which let bad clients shrink the server's limit).
    Ignore,
}

/// The engine a permit gives its slot back to: shared (permits that outlive the call
/// that made them: the tower layer, queued requests) or borrowed (`try_admit`, which then
/// pays no reference count).
pub(crate) enum CoreRef<'a> {
    Shared(Arc<Core>),
    Borrowed(&'a Core),
}

impl std::ops::Deref for CoreRef<'_> {
    type Target = Core;

    fn deref(&self) -> &Core {
        match self {
            CoreRef::Shared(c) => c,
            CoreRef::Borrowed(c) => c,
        }
    }
}

/// The route a permit counts its request's end in.
enum RouteRef {
    /// Not counted anywhere (exempt routes: probes are not the service's traffic).
    None,
    /// Kept in the engine's route slots (see [`RouteSlots`](super::route::RouteSlots)):
    /// read through the engine the permit holds, with no reference count taken.
    Slot(u32),
    /// Held by the permit itself: a permit without an engine (shadow mode), or a state
    /// with no slot.
    Held(Arc<RouteState>),
}

/// Holds one admission slot; dropping it gives the slot back, records the request's
/// latency and [`Outcome`] for the concurrency limit, and counts how the request ended in
/// its route's health window (reported to the server: see [`set_failed`](Self::set_failed)).
///
/// Dropped normally, on cancellation, or while unwinding from a panic (then nothing is
/// recorded, but the slot is still given back): a permit is never leaked. Permits from
/// [`Admission::try_admit`](super::Admission::try_admit) borrow the engine; the others
/// are `'static`.
#[must_use = "the slot is released as soon as the permit is dropped"]
pub struct AdmissionPermit<'a> {
    /// The engine when this permit holds a slot; `None` for requests admitted without one
    /// (exempt routes, shadow-mode admissions past a would-be rejection).
    core: Option<CoreRef<'a>>,
    /// The route whose health window counts how the request ended.
    route: RouteRef,
    criticality: Criticality,
    in_flight: u32,
    /// For a request whose service time is measured: when it started, and how many
    /// requests its latency reading stands for in the route's health window (the limit
    /// measures one admission in its sample stride).
    started: Option<(Instant, u64)>,
    outcome: Outcome,
    /// How the request ended for its route's health window, when the caller said more
    /// than the [`Outcome`] does; else taken from the outcome (see [`Self::served`]).
    served: Option<HealthOutcome>,
}

impl fmt::Debug for AdmissionPermit<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AdmissionPermit")
            .field("criticality", &self.criticality)
            .field("counted", &self.core.is_some())
            .field("outcome", &self.outcome)
            .finish()
    }
}

impl<'a> AdmissionPermit<'a> {
    /// A permit holding a slot of `route`; `started` is set for a request whose service
    /// time is measured (with the number of requests its reading stands for).
    #[inline]
    pub(crate) fn counted(
        core: CoreRef<'a>,
        route: &Arc<RouteState>,
        started: Option<(Instant, u64)>,
        criticality: Criticality,
        in_flight: u32,
        outcome: Outcome,
    ) -> Self {
        let route = match route.slot() {
            NO_SLOT => RouteRef::Held(route.clone()),
            slot => RouteRef::Slot(slot),
        };
        Self { core: Some(core), route, criticality, in_flight, started, outcome, served: None }
    }

    /// A permit holding no slot: an exempt route (`route` is `None`: not counted anywhere)
    /// or a request shadow mode admitted (counted in its route's health window only).
    pub(crate) fn uncounted(
        route: Option<&Arc<RouteState>>,
        criticality: Criticality,
        outcome: Outcome,
    ) -> Self {
        let route = route.map_or(RouteRef::None, |r| RouteRef::Held(r.clone()));
        Self { core: None, route, criticality, in_flight: 0, started: None, outcome, served: None }
    }

    /// Sets what the drop records (see [`Outcome`]).
    pub fn set_outcome(&mut self, outcome: Outcome) {
        self.outcome = outcome;
    }

    /// Counts the request as failed in its route's health window (an error answer, say a
    /// 500) without telling the limit anything about load: the limit still reads the
    /// [`Outcome`]. A request whose outcome is [`Outcome::Dropped`] counts as failed anyway;
    /// one whose outcome is [`Outcome::Ignore`] counts for nothing.
    pub fn set_failed(&mut self) {
        self.served = Some(HealthOutcome::Failure);
    }

    /// How the request ended, as the tower layer saw its answer.
    pub(crate) fn set_served(&mut self, served: HealthOutcome) {
        self.served = Some(served);
    }

    /// What the route's health window counts: nothing for an ignored request (cancelled,
    /// or the layer's request that never finished); else what the caller said, or the
    /// outcome read as a success or a failure.
    fn served(&self) -> Option<HealthOutcome> {
        match self.outcome {
            Outcome::Ignore if self.served.is_none() => None,
            Outcome::Dropped => Some(self.served.unwrap_or(HealthOutcome::Failure)),
            _ => Some(self.served.unwrap_or(HealthOutcome::Success)),
        }
    }

    /// The outcome the drop will record.
    pub fn outcome(&self) -> Outcome {
        self.outcome
    }

    /// The request's criticality.
    pub fn criticality(&self) -> Criticality {
        self.criticality
    }

    /// Whether the permit holds a slot of the limit: `false` for exempt routes (health,
    /// readiness, metrics) and for requests shadow mode admitted past a would-be
    /// rejection.
    pub fn is_counted(&self) -> bool {
        self.core.is_some()
    }
}

impl Drop for AdmissionPermit<'_> {
    #[inline]
    fn drop(&mut self) {
        let core = self.core.take();
        if let Some(core) = &core {
            core.release();
        }
        if std::thread::panicking() {
            return;
        }
        let route = match (&self.route, &core) {
            (RouteRef::Held(r), _) => &**r,
            (RouteRef::Slot(slot), Some(core)) => match core.route_slots.get(*slot) {
                Some(r) => r,
                None => return,
            },
            _ => return,
        };
        let served = self.served();
        if let Some(served) = served {
            // The route's latency readings are the limit's samples (below), so the
            // window's own sampling weight is not used.
            route.health.count(served);
        }
        let (Some(core), Some((started, weight))) = (&core, self.started) else { return };
        if self.outcome == Outcome::Ignore {
            if served.is_some() {
                route.health.latency(Instant::now().saturating_duration_since(started), weight);
            }
            return;
        }
        let now = Instant::now();
        let rtt = now.saturating_duration_since(started);
        route.learn(rtt);
        route.health.latency(rtt, weight);
        if let Some(limit) = core.limiter.record(now, rtt, self.in_flight, self.outcome == Outcome::Dropped) {
            core.set_limit(limit);
        }
    }
}

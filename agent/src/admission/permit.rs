use std::fmt;
use std::sync::Arc;

use tokio::time::Instant;

use super::engine::Core;
use super::route::RouteEntry;
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

/// Holds one admission slot; dropping it gives the slot back and records the request's
/// latency and [`Outcome`] for the concurrency limit.
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
    /// The route, for requests whose service time is measured.
    route: Option<Arc<RouteEntry>>,
    criticality: Criticality,
    in_flight: u32,
    started: Option<Instant>,
    outcome: Outcome,
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
    /// A permit holding a slot; `measured` carries the route and start of a request whose
    /// service time is measured.
    pub(crate) fn counted(
        core: CoreRef<'a>,
        measured: Option<(Arc<RouteEntry>, Instant)>,
        criticality: Criticality,
        in_flight: u32,
        outcome: Outcome,
    ) -> Self {
        let (route, started) = measured.map_or((None, None), |(r, s)| (Some(r), Some(s)));
        Self { core: Some(core), route, criticality, in_flight, started, outcome }
    }

    pub(crate) fn uncounted(criticality: Criticality, outcome: Outcome) -> Self {
        Self { core: None, route: None, criticality, in_flight: 0, started: None, outcome }
    }

    /// Sets what the drop records (see [`Outcome`]).
    pub fn set_outcome(&mut self, outcome: Outcome) {
        self.outcome = outcome;
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
        let Some(core) = self.core.take() else { return };
        core.release();
        let (Some(started), Some(route)) = (self.started, &self.route) else { return };
        if self.outcome == Outcome::Ignore || std::thread::panicking() {
            return;
        }
        let now = Instant::now();
        let rtt = now.saturating_duration_since(started);
        route.state.learn(rtt);
        if let Some(limit) = core.limiter.record(now, rtt, self.in_flight, self.outcome == Outcome::Dropped) {
            core.set_limit(limit);
        }
    }
}

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use metrics::Counter;

use super::reason::{CRITICALITIES, crit_index};
use super::{Reason, ShedCount};
use crate::health::{HealthCounters, HealthOutcome};
use crate::metrics_names as names;
use crate::policy::{self, Criticality};

/// Route of requests that match no route template, and of gRPC requests to a method the
/// service has not answered yet. Raw paths are never used as route names (they would make
/// metrics and state unbounded).
pub const UNMATCHED_ROUTE: &str = "_unmatched";
/// Route shared by every route seen after [`MAX_TRACKED_ROUTES`] were tracked; counted in
/// `levee_admission_route_overflow_total` and the status. Only names the service vouches
/// for take a slot (templates its router matched, gRPC methods it answered, routes the
/// policy names, plain-API names), so a client cannot fill the table with paths of its
/// choice.
pub const OVERFLOW_ROUTE: &str = "_overflow";
/// Most routes one admission engine tracks (the policy may name at most
/// [`MAX_ROUTES`](crate::policy::defaults::MAX_ROUTES), which always fit).
pub const MAX_TRACKED_ROUTES: usize = 1024;
/// Paths (route templates without the method) that are never shed: health, readiness,
/// liveness and metrics endpoints, and the standard gRPC health service. Add more with
/// [`Admission::exempt`](super::Admission::exempt).
pub const DEFAULT_EXEMPT_PATHS: [&str; 9] = [
    "/health",
    "/healthz",
    "/ready",
    "/readyz",
    "/live",
    "/livez",
    "/metrics",
    "/grpc.health.v1.Health/Check",
    "/grpc.health.v1.Health/Watch",
];

/// Names the route template of a request for routers other than axum (whose
/// `MatchedPath` is read directly with the `axum` feature): insert it as a request
/// extension before the admission layer runs, e.g. `"/users/{id}"`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RouteTemplate(pub Arc<str>);

const KEY_CAP: usize = 160;

/// A route's expected service time loses 1/this of itself each time it refuses a request
/// (see [`RouteState::refused_for_time`]).
const REFUSAL_DECAY: u64 = 64;

/// The route name of a request, built without allocating: `"METHOD template"` for HTTP
/// (`"GET /quote/{sku}"`), the method path for gRPC (`"/shop.Pricing/Quote"`), or
/// [`UNMATCHED_ROUTE`].
#[derive(Clone, Copy)]
pub struct RouteKey {
    buf: [u8; KEY_CAP],
    len: usize,
}

impl std::fmt::Debug for RouteKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("RouteKey").field(&self.as_str()).finish()
    }
}

impl RouteKey {
    fn from_parts(parts: &[&str]) -> Self {
        let mut key = Self { buf: [0; KEY_CAP], len: 0 };
        for p in parts {
            let b = p.as_bytes();
            if key.len + b.len() > KEY_CAP {
                return Self::from_parts(&[UNMATCHED_ROUTE]);
            }
            key.buf[key.len..key.len + b.len()].copy_from_slice(b);
            key.len += b.len();
        }
        key
    }

    /// The route name.
    pub fn as_str(&self) -> &str {
        std::str::from_utf8(&self.buf[..self.len]).unwrap_or(UNMATCHED_ROUTE)
    }
}

/// Whether `path` is a gRPC method path: `/package.Service/Method`.
fn is_grpc_method(path: &str) -> bool {
    let Some(rest) = path.strip_prefix('/') else { return false };
    match rest.split_once('/') {
        Some((service, method)) => !service.is_empty() && !method.is_empty() && !method.contains('/'),
        None => false,
    }
}

/// Whether the request is gRPC (`content-type: application/grpc…`).
pub(crate) fn is_grpc<B>(req: &http::Request<B>) -> bool {
    req.headers()
        .get(http::header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"application/grpc"))
}

/// The route name of `req` (see [`RouteKey`]): the template the router matched (axum's
/// `MatchedPath` with the `axum` feature, or a [`RouteTemplate`] extension) prefixed by
/// the method; for a gRPC request without a template, its method path; else
/// [`UNMATCHED_ROUTE`]. The raw path of an HTTP request is never used.
pub fn route_key<B>(req: &http::Request<B>) -> RouteKey {
    route_key_known(req).0
}

/// [`route_key`], and whether the router vouches for the name: a template it matched, or
/// [`UNMATCHED_ROUTE`]. A gRPC method path is only the client's word until the service
/// answers it (a client can send any path): see [`AdmissionService`](super::AdmissionService).
pub(crate) fn route_key_known<B>(req: &http::Request<B>) -> (RouteKey, bool) {
    #[cfg(feature = "axum")]
    if let Some(p) = req.extensions().get::<axum::extract::MatchedPath>() {
        return (RouteKey::from_parts(&[req.method().as_str(), " ", p.as_str()]), true);
    }
    if let Some(t) = req.extensions().get::<RouteTemplate>() {
        return (RouteKey::from_parts(&[req.method().as_str(), " ", &t.0]), true);
    }
    let path = req.uri().path();
    if is_grpc(req) && is_grpc_method(path) {
        return (RouteKey::from_parts(&[path]), false);
    }
    (RouteKey::from_parts(&[UNMATCHED_ROUTE]), true)
}

/// Whether a gRPC answer says the service does not know the method: `grpc-status: 12`
/// (UNIMPLEMENTED) in the response headers, as tonic's router answers an unknown path.
pub(crate) fn is_unimplemented<B>(res: &http::Response<B>) -> bool {
    res.headers().get("grpc-status").is_some_and(|v| v.as_bytes() == b"12")
}

/// Hashes route names a machine word at a time (the Fx hash of rustc): route names are
/// short and chosen by the service (or bounded by [`MAX_TRACKED_ROUTES`]), so a fast
/// non-keyed hash is enough.
#[derive(Default)]
pub(crate) struct WordHash(u64);

impl WordHash {
    const K: u64 = 0x51_7c_c1_b7_27_22_0a_95;

    #[inline]
    fn add(&mut self, word: u64) {
        self.0 = (self.0.rotate_left(5) ^ word).wrapping_mul(Self::K);
    }
}

impl Hasher for WordHash {
    #[inline]
    fn finish(&self) -> u64 {
        self.0
    }

    #[inline]
    fn write(&mut self, bytes: &[u8]) {
        let mut chunks = bytes.chunks_exact(8);
        for c in &mut chunks {
            self.add(u64::from_le_bytes(c.try_into().expect("8 bytes")));
        }
        let rest = chunks.remainder();
        if !rest.is_empty() {
            let mut last = [0u8; 8];
            last[..rest.len()].copy_from_slice(rest);
            self.add(u64::from_le_bytes(last));
        }
    }

    #[inline]
    fn write_u8(&mut self, b: u8) {
        self.add(u64::from(b));
    }
}

type Counters = [[AtomicU64; Reason::ALL.len()]; 4];
type Handles = [[OnceLock<Counter>; Reason::ALL.len()]; 4];

/// [`RouteState::slot`] of a state that has none.
pub(crate) const NO_SLOT: u32 = u32::MAX;
/// Slots of one engine's [`RouteSlots`]: every tracked route and the overflow route, with
/// as much room again for states made by a registration that lost a race (made, never
/// published).
const ROUTE_SLOTS: usize = 2 * (MAX_TRACKED_ROUTES + 1);

/// Every route state an engine ever published, by slot, for as long as the engine lives.
///
/// A route's state is never dropped from an engine's settings (each rebuild of the
/// [`RouteTable`] carries every state of the one before), so the engine can keep them in
/// a table of its own; a permit then names its route by slot and reads the state through
/// the engine it already holds, instead of taking a reference count on the route: two
/// locked instructions on a count every thread serving the route shares, off the
/// admission's success path. States past the table's room (only after many lost races)
/// have [`NO_SLOT`], and their permits hold the `Arc`.
pub(crate) struct RouteSlots {
    slots: Box<[OnceLock<Arc<RouteState>>]>,
    next: AtomicUsize,
}

impl std::fmt::Debug for RouteSlots {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RouteSlots").field("used", &self.next.load(Ordering::Relaxed)).finish()
    }
}

impl Default for RouteSlots {
    fn default() -> Self {
        Self { slots: (0..ROUTE_SLOTS).map(|_| OnceLock::new()).collect(), next: AtomicUsize::new(0) }
    }
}

impl RouteSlots {
    /// A new state for route `name`, kept in the next free slot when there is one.
    pub(crate) fn state(&self, name: &str) -> Arc<RouteState> {
        let i = self.next.fetch_add(1, Ordering::Relaxed);
        let Some(cell) = self.slots.get(i) else { return Arc::new(RouteState::new(name)) };
        let slot = u32::try_from(i).expect("ROUTE_SLOTS fits in u32");
        let state = Arc::new(RouteState::in_slot(name, slot));
        let _ = cell.set(state.clone());
        state
    }

    /// The state kept in `slot`.
    #[inline]
    pub(crate) fn get(&self, slot: u32) -> Option<&RouteState> {
        self.slots.get(slot as usize).and_then(OnceLock::get).map(|s| &**s)
    }
}

/// What a route accumulates across policy changes: counters and the expected service time.
#[derive(Debug)]
pub(crate) struct RouteState {
    pub(crate) name: Arc<str>,
    /// Where the engine's [`RouteSlots`] keep this state, or [`NO_SLOT`].
    slot: u32,
    shed: Counters,
    shadow: Counters,
    shed_handles: Handles,
    shadow_handles: Handles,
    would_queue: [AtomicU64; 4],
    /// Estimated service time in ns (see [`RouteState::learn`]), 0 before any sample.
    expected_ns: AtomicU64,
    /// How the route's requests ended since the last status report: served (a success,
    /// or a failure or timeout as the answer said) or refused here (shed). Its latency
    /// readings are the limit's sampled measurements, each standing for the stride it
    /// was sampled at, so the buckets add up to the served requests give or take the
    /// stride.
    pub(crate) health: HealthCounters,
}

impl RouteState {
    /// Where the engine's [`RouteSlots`] keep this state ([`NO_SLOT`]: nowhere).
    pub(crate) fn slot(&self) -> u32 {
        self.slot
    }

    /// A state not kept in any slot table (tests, and states past the table's room).
    pub(crate) fn new(name: &str) -> Self {
        Self::in_slot(name, NO_SLOT)
    }

    fn in_slot(name: &str, slot: u32) -> Self {
        Self {
            name: name.into(),
            slot,
            shed: Default::default(),
            shadow: Default::default(),
            shed_handles: Default::default(),
            shadow_handles: Default::default(),
            would_queue: Default::default(),
            expected_ns: AtomicU64::new(0),
            health: HealthCounters::default(),
        }
    }

    fn counter(&self, shadow: bool, c: Criticality, r: Reason) -> Option<&Counter> {
        let handles = if shadow { &self.shadow_handles } else { &self.shed_handles };
        names::late(&handles[crit_index(c)][r.index()], || {
            let name = if shadow { names::ADMISSION_SHADOW_SHED } else { names::ADMISSION_SHED };
            metrics::counter!(
                name,
                names::LABEL_ROUTE => self.name.to_string(),
                names::LABEL_CRITICALITY => crate::deadline::format_criticality(c),
                names::LABEL_REASON => r.as_str(),
            )
        })
    }

    /// Counts a rejection (or, with `shadow`, a would-be rejection). The series is set
    /// from the route's own count, so it is exact whenever the recorder was installed.
    pub(crate) fn count_shed(&self, shadow: bool, c: Criticality, r: Reason) {
        if !shadow {
            self.health.count(HealthOutcome::Shed);
        }
        let cells = if shadow { &self.shadow } else { &self.shed };
        let n = cells[crit_index(c)][r.index()].fetch_add(1, Ordering::Relaxed) + 1;
        if let Some(counter) = self.counter(shadow, c, r) {
            counter.absolute(n);
        }
    }

    /// Counts a request that would have waited in the queue (shadow mode).
    pub(crate) fn count_would_queue(&self, c: Criticality) {
        self.would_queue[crit_index(c)].fetch_add(1, Ordering::Relaxed);
    }

    /// The expected service time of this route (zero before any measurement).
    pub(crate) fn expected(&self) -> Duration {
        Duration::from_nanos(self.expected_ns.load(Ordering::Relaxed))
    }

    /// Learns one measured service time. The estimate is only ever used to refuse
    /// requests, so it errs low: it falls halfway to a shorter sample, and rises by at
    /// most 1/8 of itself per sample (a sample counts as at most twice the estimate), so
    /// one request that took 900× the usual time moves it by 1/8, not by 112×. Racy on
    /// purpose: a lost update of an average costs nothing.
    pub(crate) fn learn(&self, rtt: Duration) {
        let x = u64::try_from(rtt.as_nanos()).unwrap_or(u64::MAX);
        let old = self.expected_ns.load(Ordering::Relaxed);
        let new = if old == 0 {
            x
        } else if x >= old {
            old + (x - old).min(old) / 8
        } else {
            old - (old - x) / 2
        };
        self.expected_ns.store(new.max(1), Ordering::Relaxed);
    }

    /// Lowers the estimate by 1/[`REFUSAL_DECAY`] after it made admission refuse a request
    /// (reason `deadline`): refused requests teach nothing by themselves, so an estimate
    /// above every caller's deadline would otherwise never be measured again while the
    /// service stays busy. A route that really is that slow sees about one request in
    /// `REFUSAL_DECAY / 8` admitted to measure it again.
    pub(crate) fn refused_for_time(&self) {
        let old = self.expected_ns.load(Ordering::Relaxed);
        self.expected_ns.store(old - old / REFUSAL_DECAY, Ordering::Relaxed);
    }

    fn collect(cells: &Counters) -> Vec<ShedCount> {
        let mut out = Vec::new();
        for (ci, row) in cells.iter().enumerate() {
            for (ri, cell) in row.iter().enumerate() {
                let count = cell.load(Ordering::Relaxed);
                if count > 0 {
                    out.push(ShedCount { criticality: CRITICALITIES[ci], reason: Reason::ALL[ri], count });
                }
            }
        }
        out
    }

    pub(crate) fn status(&self) -> super::RouteStatus {
        super::RouteStatus {
            route: self.name.to_string(),
            shed: Self::collect(&self.shed),
            would_shed: Self::collect(&self.shadow),
            would_queue: self.would_queue.iter().map(|c| c.load(Ordering::Relaxed)).sum(),
            expected_service_time: self.expected(),
        }
    }
}

/// A route's settings from the policy, with its state.
#[derive(Debug)]
pub(crate) struct RouteEntry {
    pub(crate) state: Arc<RouteState>,
    pub(crate) criticality: Criticality,
    pub(crate) deadline: Option<Duration>,
    pub(crate) mutating: bool,
    pub(crate) exempt: bool,
}

pub(crate) fn is_exempt(name: &str, exempt: &[Box<str>]) -> bool {
    let path = name.split_once(' ').map_or(name, |(_, p)| p);
    exempt.iter().any(|e| **e == *path)
}

impl RouteEntry {
    pub(crate) fn resolve(state: Arc<RouteState>, inbound: &policy::Inbound, exempt: &[Box<str>]) -> Self {
        let route = inbound.routes.get(&*state.name);
        Self {
            criticality: super::route_criticality(inbound, &state.name),
            deadline: route.and_then(|r| r.deadline),
            mutating: route.is_some_and(|r| r.mutating),
            exempt: is_exempt(&state.name, exempt),
            state,
        }
    }
}

type Map = HashMap<Box<str>, Arc<RouteEntry>, BuildHasherDefault<WordHash>>;

/// The routes an engine tracks, resolved against one policy. Rebuilt (states kept) when
/// the policy changes; extended copy-on-write the first time a route is seen.
#[derive(Debug, Clone)]
pub(crate) struct RouteTable {
    map: Map,
    overflow: Arc<RouteEntry>,
    overflow_exempt: Arc<RouteEntry>,
}

impl RouteTable {
    /// A table for `inbound` over the states of `previous` (when any), with every route
    /// the policy names registered.
    pub(crate) fn build(
        inbound: &policy::Inbound,
        exempt: &[Box<str>],
        previous: Option<&RouteTable>,
        slots: &RouteSlots,
    ) -> Self {
        let state_of = |name: &str| -> Arc<RouteState> {
            previous
                .and_then(|t| t.map.get(name))
                .map(|e| e.state.clone())
                .unwrap_or_else(|| slots.state(name))
        };
        let mut map = Map::default();
        if let Some(prev) = previous {
            for name in prev.map.keys() {
                map.insert(name.clone(), Arc::new(RouteEntry::resolve(state_of(name), inbound, exempt)));
            }
        }
        for name in inbound.routes.keys() {
            if !map.contains_key(name.as_str()) && map.len() < MAX_TRACKED_ROUTES {
                map.insert(
                    name.as_str().into(),
                    Arc::new(RouteEntry::resolve(state_of(name), inbound, exempt)),
                );
            }
        }
        let overflow_state =
            previous.map(|t| t.overflow.state.clone()).unwrap_or_else(|| slots.state(OVERFLOW_ROUTE));
        let overflow = Arc::new(RouteEntry::resolve(overflow_state, inbound, exempt));
        let overflow_exempt = Arc::new(RouteEntry {
            state: overflow.state.clone(),
            criticality: Criticality::CriticalPlus,
            deadline: None,
            mutating: false,
            exempt: true,
        });
        Self { map, overflow, overflow_exempt }
    }

    #[inline]
    pub(crate) fn get(&self, name: &str) -> Option<&Arc<RouteEntry>> {
        self.map.get(name)
    }

    pub(crate) fn len(&self) -> usize {
        self.map.len()
    }

    pub(crate) fn is_full(&self) -> bool {
        self.map.len() >= MAX_TRACKED_ROUTES
    }

    /// The entry for a route past the cap: the shared overflow route (exempt when its path
    /// is exempt, so probes are never shed even then).
    pub(crate) fn overflow(&self, name: &str, exempt: &[Box<str>]) -> Arc<RouteEntry> {
        if is_exempt(name, exempt) { self.overflow_exempt.clone() } else { self.overflow.clone() }
    }

    pub(crate) fn overflow_state(&self) -> &Arc<RouteState> {
        &self.overflow.state
    }

    /// A copy with `name` added, over its new `state`.
    pub(crate) fn with(
        &self,
        name: &str,
        inbound: &policy::Inbound,
        exempt: &[Box<str>],
        state: Arc<RouteState>,
    ) -> (Self, Arc<RouteEntry>) {
        let mut t = self.clone();
        let entry = Arc::new(RouteEntry::resolve(state, inbound, exempt));
        t.map.insert(name.into(), entry.clone());
        (t, entry)
    }

    pub(crate) fn states(&self) -> impl Iterator<Item = &Arc<RouteState>> {
        self.map.values().map(|e| &e.state)
    }
}

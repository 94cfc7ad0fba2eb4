use std::future::Future;
use std::pin::pin;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering, fence};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use futures::future::Either;
use metrics::{Counter, Gauge};
use tokio::sync::Notify;
use tokio::time::Instant;

use super::little::Little;
use super::{BulkheadError, BulkheadFull, LittleEstimate};
use crate::deadline::{Deadline, DeadlineExceeded};
use crate::metrics_names::{self as names, Labels, late};
use crate::policy;

// The state word: calls in flight (low 32 bits) and admissions so far (high 32 bits,
// wrapping), so admitting is one CAS that also counts the arrival for Little's law.
const IN_FLIGHT: u64 = 0xffff_ffff;
const ADMITTED_ONE: u64 = 1 << 32;
/// One admitted call in this many has its holding time measured.
const SAMPLE_EVERY: u64 = 16;

#[derive(Debug)]
struct Inner {
    state: AtomicU64,
    limit: AtomicU32,
    max_wait_ns: AtomicU64,
    waiting: AtomicU32,
    rejected: AtomicU64,
    notify: Notify,
    little: Little,
    metrics: Option<BulkheadMetrics>,
}

/// The bulkhead's handles, bound to the recorder late ([`late`]).
#[derive(Debug)]
struct BulkheadMetrics {
    labels: Labels,
    in_use: OnceLock<Gauge>,
    rejected: OnceLock<Counter>,
    suggested: OnceLock<Gauge>,
}

impl BulkheadMetrics {
    fn in_use(&self) -> Option<&Gauge> {
        late(&self.in_use, || self.labels.gauge(names::BULKHEAD_IN_USE))
    }

    fn rejected(&self) -> Option<&Counter> {
        late(&self.rejected, || self.labels.counter(names::BULKHEAD_REJECTED))
    }

    fn suggested(&self) -> Option<&Gauge> {
        late(&self.suggested, || self.labels.gauge(names::BULKHEAD_SUGGESTED))
    }
}

/// Limits how many calls run at once, with a bounded wait for a slot (resilience4j's
/// semaphore bulkhead).
///
/// All clones share one limit (BH-2). Admission is one CAS, release one `fetch_sub`: no
/// lock and no allocation on the call path. A caller that finds it full waits at most
/// `max_wait` and never past its deadline (`max_wait` 0 = fail fast), then gets
/// [`BulkheadFull`]; a waiter that gives up holds nothing and can never be handed a slot
/// later (BH-1). Permits are released on drop, so cancelled futures and panicking calls
/// return them. [`Bulkhead::resize`] changes the limit without touching calls in flight:
/// lowering it below the calls in flight makes new calls wait until fewer than the new
/// limit are in flight (BH-3).
///
/// It also measures arrival rate and holding time and suggests a size by Little's law
/// ([`Bulkhead::estimate`]: rps × latency × 2).
#[derive(Clone, Debug)]
pub struct Bulkhead {
    inner: Arc<Inner>,
}

impl Bulkhead {
    /// A bulkhead with `settings` (`max_concurrent`, `max_wait`); metrics not registered.
    pub fn new(settings: &policy::BulkheadPolicy) -> Self {
        Self::build(settings, None)
    }

    /// As [`Bulkhead::new`], registering
    /// [`BULKHEAD_IN_USE`](crate::metrics_names::BULKHEAD_IN_USE) (see
    /// [`publish_metrics`](Self::publish_metrics)),
    /// [`BULKHEAD_REJECTED`](crate::metrics_names::BULKHEAD_REJECTED) and
    /// [`BULKHEAD_SUGGESTED`](crate::metrics_names::BULKHEAD_SUGGESTED) with `labels`.
    pub fn with_metrics(settings: &policy::BulkheadPolicy, labels: &Labels) -> Self {
        let metrics = BulkheadMetrics {
            labels: labels.clone(),
            in_use: OnceLock::new(),
            rejected: OnceLock::new(),
            suggested: OnceLock::new(),
        };
        let b = Self::build(settings, Some(metrics));
        if names::recorder_installed() {
            b.publish_metrics();
        }
        b
    }

    /// Publishes the in-use gauge (the calls holding a slot now) and registers this
    /// bulkhead's series with a recorder installed since it was built (CB-9). An agent does
    /// it on its metrics tick; the gauge is sampled there, not set by every call (two
    /// recorder calls less on the success path). Call it yourself for a bulkhead of your
    /// own.
    pub fn publish_metrics(&self) {
        let Some(m) = &self.inner.metrics else { return };
        if let Some(g) = m.in_use() {
            g.set(f64::from(self.in_flight()));
        }
        m.rejected();
        m.suggested();
    }

    fn build(settings: &policy::BulkheadPolicy, metrics: Option<BulkheadMetrics>) -> Self {
        let b = Self {
            inner: Arc::new(Inner {
                state: AtomicU64::new(0),
                limit: AtomicU32::new(0),
                max_wait_ns: AtomicU64::new(0),
                waiting: AtomicU32::new(0),
                rejected: AtomicU64::new(0),
                notify: Notify::new(),
                little: Little::new(),
                metrics,
            }),
        };
        b.update(settings);
        b
    }

    /// Applies new settings live: resizes (see [`Bulkhead::resize`]) and sets the wait.
    /// Calls in flight are never affected.
    pub fn update(&self, settings: &policy::BulkheadPolicy) {
        let wait = u64::try_from(settings.max_wait.as_nanos()).unwrap_or(u64::MAX);
        self.inner.max_wait_ns.store(wait, Ordering::Relaxed);
        self.resize(settings.max_concurrent);
    }

    /// Changes the limit (at least 1). Raising it wakes waiters; lowering it lets calls in
    /// flight finish and makes new ones wait until fewer than `max_concurrent` are in flight.
    pub fn resize(&self, max_concurrent: u32) {
        let old = self.inner.limit.swap(max_concurrent.max(1), Ordering::SeqCst);
        if max_concurrent > old {
            self.inner.notify.notify_waiters();
        }
    }

    /// The current limit.
    pub fn max_concurrent(&self) -> u32 {
        self.inner.limit.load(Ordering::Relaxed)
    }

    /// Calls holding a permit now.
    pub fn in_flight(&self) -> u32 {
        (self.inner.state.load(Ordering::Relaxed) & IN_FLIGHT) as u32
    }

    /// Calls rejected so far.
    pub fn rejected(&self) -> u64 {
        self.inner.rejected.load(Ordering::Relaxed)
    }

    /// Takes a slot if one is free now.
    ///
    /// # Errors
    /// [`BulkheadFull`] when `max_concurrent` calls are in flight. Does not count as a
    /// rejection (the caller may still wait); [`Bulkhead::acquire`] counts its own.
    #[inline]
    pub fn try_acquire(&self) -> Result<BulkheadPermit<'_>, BulkheadFull> {
        let inner = &*self.inner;
        let limit = u64::from(inner.limit.load(Ordering::Relaxed));
        let mut s = inner.state.load(Ordering::Relaxed);
        loop {
            if s & IN_FLIGHT >= limit {
                return Err(BulkheadFull::new());
            }
            match inner.state.compare_exchange_weak(
                s,
                s + 1 + ADMITTED_ONE,
                Ordering::Acquire,
                Ordering::Relaxed,
            ) {
                Ok(_) => break,
                Err(cur) => s = cur,
            }
        }
        let admitted = (s >> 32) + 1;
        let started = (admitted % SAMPLE_EVERY == 0).then(Instant::now);
        Ok(BulkheadPermit { inner, started })
    }

    /// Takes a slot, waiting for one at most `max_wait` and never past `deadline`; the
    /// deadline is checked again once the slot is held.
    ///
    /// A free slot is taken synchronously and the returned future is ready at once (no
    /// allocation); only a caller that has to wait gets a boxed waiting future.
    ///
    /// # Errors
    /// [`BulkheadError::Full`] when no slot freed up within `max_wait` (counted as a
    /// rejection); [`BulkheadError::DeadlineExceeded`] when the deadline passed first or
    /// had passed when the slot came (the slot is given back).
    pub fn acquire(
        &self,
        deadline: Option<Deadline>,
    ) -> impl Future<Output = Result<BulkheadPermit<'_>, BulkheadError>> + Send + '_ {
        match self.try_acquire() {
            Ok(permit) => Either::Left(std::future::ready(Self::recheck(permit, deadline))),
            Err(_) => Either::Right(Box::pin(async move {
                let permit = self.wait(deadline).await?;
                Self::recheck(permit, deadline)
            })),
        }
    }

    #[inline]
    fn recheck(
        permit: BulkheadPermit<'_>,
        deadline: Option<Deadline>,
    ) -> Result<BulkheadPermit<'_>, BulkheadError> {
        if deadline.is_some_and(Deadline::is_expired) {
            return Err(BulkheadError::DeadlineExceeded(DeadlineExceeded::new()));
        }
        Ok(permit)
    }

    #[cold]
    async fn wait(&self, deadline: Option<Deadline>) -> Result<BulkheadPermit<'_>, BulkheadError> {
        let inner = &*self.inner;
        let max_wait = Duration::from_nanos(inner.max_wait_ns.load(Ordering::Relaxed));
        let now = Instant::now();
        let mut until = now.checked_add(max_wait).unwrap_or(now + Duration::from_secs(86_400));
        let mut deadline_binds = false;
        if let Some(d) = deadline
            && d.instant() <= until
        {
            until = d.instant();
            deadline_binds = true;
        }
        if !max_wait.is_zero() && now < until {
            let _waiting = WaitingGuard::new(&inner.waiting);
            let sleep = pin!(tokio::time::sleep_until(until));
            let mut sleep = sleep;
            loop {
                let mut notified = pin!(inner.notify.notified());
                notified.as_mut().enable();
                // Registered before re-checking: a release from now on wakes us (pairs
                // with the SeqCst release/`waiting` load in `BulkheadPermit::drop`).
                fence(Ordering::SeqCst);
                if let Ok(p) = self.try_acquire() {
                    return Ok(p);
                }
                tokio::select! {
                    biased;
                    () = &mut notified => {}
                    () = &mut sleep => break,
                }
            }
        }
        if deadline_binds {
            return Err(BulkheadError::DeadlineExceeded(DeadlineExceeded::new()));
        }
        inner.rejected.fetch_add(1, Ordering::Relaxed);
        if let Some(c) = inner.metrics.as_ref().and_then(BulkheadMetrics::rejected) {
            c.increment(1);
        }
        Err(BulkheadError::Full(BulkheadFull::new()))
    }

    /// Arrival rate, typical holding time and the Little's-law size they suggest
    /// (also published as [`BULKHEAD_SUGGESTED`](crate::metrics_names::BULKHEAD_SUGGESTED)).
    pub fn estimate(&self) -> LittleEstimate {
        let inner = &*self.inner;
        inner.little.tick(Instant::now(), self.arrivals());
        let e = inner.little.estimate();
        if let Some(g) = inner.metrics.as_ref().and_then(BulkheadMetrics::suggested) {
            g.set(f64::from(e.suggested));
        }
        e
    }

    fn arrivals(&self) -> u64 {
        (self.inner.state.load(Ordering::Relaxed) >> 32) + self.inner.rejected.load(Ordering::Relaxed)
    }
}

/// A [`BulkheadPermit`] held apart from its bulkhead (see [`BulkheadPermit::detach`]): the
/// slot stays taken until it is reattached to the same bulkhead and dropped.
#[derive(Debug)]
pub(crate) struct DetachedBulkheadPermit {
    started: Option<Instant>,
}

impl Bulkhead {
    /// The permit `detached` from this bulkhead, back as a [`BulkheadPermit`].
    pub(crate) fn reattach(&self, detached: DetachedBulkheadPermit) -> BulkheadPermit<'_> {
        BulkheadPermit { inner: &self.inner, started: detached.started }
    }
}

impl BulkheadPermit<'_> {
    /// Keeps the slot without the borrow of the bulkhead, for a future that holds it across
    /// polls beside the bulkhead's owner (the enforcement future); see
    /// [`Bulkhead::reattach`].
    pub(crate) fn detach(self) -> DetachedBulkheadPermit {
        let d = DetachedBulkheadPermit { started: self.started };
        std::mem::forget(self);
        d
    }
}

/// Counts a waiter for as long as it waits (also when its future is dropped).
struct WaitingGuard<'a>(&'a AtomicU32);

impl<'a> WaitingGuard<'a> {
    fn new(c: &'a AtomicU32) -> Self {
        c.fetch_add(1, Ordering::SeqCst);
        Self(c)
    }
}

impl Drop for WaitingGuard<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Holds one bulkhead slot; dropping it (normally, on cancellation or while unwinding
/// from a panic) gives the slot back and wakes a waiter.
#[derive(Debug)]
#[must_use = "the slot is released as soon as the permit is dropped"]
pub struct BulkheadPermit<'a> {
    inner: &'a Inner,
    started: Option<Instant>,
}

impl Drop for BulkheadPermit<'_> {
    #[inline]
    fn drop(&mut self) {
        let inner = self.inner;
        let prev = inner.state.fetch_sub(1, Ordering::SeqCst);
        if inner.waiting.load(Ordering::SeqCst) > 0 {
            inner.notify.notify_one();
        }
        if let Some(started) = self.started {
            let arrivals = (prev >> 32) + inner.rejected.load(Ordering::Relaxed);
            inner.little.sample(started, arrivals);
        }
    }
}

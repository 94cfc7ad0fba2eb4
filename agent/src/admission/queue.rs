//! The bounded admission queue: one task per engine orders the waiters (criticality
//! first, then FIFO — LIFO while CoDel says the queue is overloaded), hands them slots
//! as they free up, and drops what waited too long.

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::task::{Context, Poll};
use std::time::Duration;

use pin_project_lite::pin_project;
use tokio::sync::{mpsc, oneshot};
use tokio::time::{Instant, Sleep};

use super::codel::CoDel;
use super::engine::Core;
use super::permit::{AdmissionPermit, CoreRef, Outcome};
use super::reason::crit_index;
use super::route::RouteEntry;
use super::{Reason, Rejected};
use crate::deadline::Deadline;
use crate::policy::Criticality;

/// A request waiting for a slot, as the queue task holds it.
pub(crate) struct Waiter {
    criticality: Criticality,
    route: Arc<RouteEntry>,
    enqueued: Instant,
    deadline: Option<Deadline>,
    tx: oneshot::Sender<Grant>,
}

/// The queue task's answer to a waiter.
pub(crate) enum Grant {
    Admitted { in_flight: u32, slot: Slot },
    Rejected(Reason),
}

/// One slot taken on a waiter's behalf; given back if it never reaches a permit.
pub(crate) struct Slot(Option<Arc<Core>>);

impl Slot {
    fn take(mut self) -> Arc<Core> {
        self.0.take().expect("a slot is taken once")
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        if let Some(core) = self.0.take() {
            core.release();
        }
    }
}

/// Whether a request with `deadline` can still be served, given the route's expected
/// service time.
fn fits(deadline: Option<Deadline>, expected: Duration, now: Instant) -> bool {
    deadline.is_none_or(|d| {
        let left = d.instant().saturating_duration_since(now);
        !left.is_zero() && left >= expected
    })
}

/// Creates the queue entry of a request and the future its caller waits on. The caller
/// has already counted it in `waiting`.
pub(crate) fn waiter(
    core: Arc<Core>,
    route: Arc<RouteEntry>,
    criticality: Criticality,
    deadline: Option<Deadline>,
    outcome: Outcome,
) -> (Waiter, Wait) {
    let (tx, rx) = oneshot::channel();
    let sleep = deadline.map(|d| {
        let at = d.instant().checked_sub(route.state.expected()).unwrap_or_else(|| d.instant());
        tokio::time::sleep_until(at)
    });
    let waiter = Waiter { criticality, route: route.clone(), enqueued: Instant::now(), deadline, tx };
    let wait = Wait { rx, sleep, core, route: Some(route), criticality, outcome, done: false };
    (waiter, wait)
}

pin_project! {
    /// Waits for the queue task to admit or refuse a queued request; gives up by itself
    /// when the request can no longer meet its deadline. Dropping it leaves the queue
    /// (and gives back a slot granted meanwhile).
    pub(crate) struct Wait {
        rx: oneshot::Receiver<Grant>,
        #[pin]
        sleep: Option<Sleep>,
        core: Arc<Core>,
        route: Option<Arc<RouteEntry>>,
        criticality: Criticality,
        outcome: Outcome,
        done: bool,
    }

    impl PinnedDrop for Wait {
        fn drop(this: Pin<&mut Self>) {
            let this = this.project();
            if !*this.done {
                leave(this.rx, this.core);
            }
        }
    }
}

/// Leaves the queue: after `close`, either the queue task already answered (it counted
/// the answer; a granted slot is given back when the grant drops here) or it never will
/// (then the waiter un-counts itself).
fn leave(rx: &mut oneshot::Receiver<Grant>, core: &Core) -> Option<Grant> {
    rx.close();
    match rx.try_recv() {
        Ok(grant) => Some(grant),
        Err(_) => {
            core.waiting.fetch_sub(1, Ordering::SeqCst);
            None
        }
    }
}

impl Wait {
    fn answer(
        grant: Grant,
        core: &Arc<Core>,
        route: Arc<RouteEntry>,
        criticality: Criticality,
        outcome: Outcome,
    ) -> Result<AdmissionPermit<'static>, Rejected> {
        match grant {
            Grant::Admitted { in_flight, slot } => {
                debug_assert!(Arc::ptr_eq(core, slot.0.as_ref().expect("untaken slot")));
                let core = CoreRef::Shared(slot.take());
                // Every request that waited is measured: its reading stands for itself.
                Ok(AdmissionPermit::counted(
                    core,
                    &route.state,
                    Some((Instant::now(), 1)),
                    criticality,
                    in_flight,
                    outcome,
                ))
            }
            Grant::Rejected(reason) => Err(Rejected::new(reason, criticality)),
        }
    }
}

impl Future for Wait {
    type Output = Result<AdmissionPermit<'static>, Rejected>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let criticality = *this.criticality;
        if let Poll::Ready(r) = Pin::new(&mut *this.rx).poll(cx) {
            *this.done = true;
            let route = this.route.take().expect("polled after completion");
            return Poll::Ready(match r {
                Ok(grant) => Self::answer(grant, this.core, route, criticality, *this.outcome),
                Err(_) => {
                    // The queue task ended (runtime shutting down) without answering.
                    this.core.waiting.fetch_sub(1, Ordering::SeqCst);
                    Err(Rejected::new(Reason::QueueFull, criticality))
                }
            });
        }
        if let Some(sleep) = this.sleep.as_pin_mut()
            && sleep.poll(cx).is_ready()
        {
            *this.done = true;
            let route = this.route.take().expect("polled after completion");
            return Poll::Ready(match leave(this.rx, this.core) {
                Some(grant) => Self::answer(grant, this.core, route, criticality, *this.outcome),
                None => {
                    route.state.count_shed(false, criticality, Reason::Deadline);
                    Err(Rejected::new(Reason::Deadline, criticality))
                }
            });
        }
        Poll::Pending
    }
}

/// The waiters, one FIFO per criticality (index 0 = CRITICAL_PLUS), and the CoDel state.
struct Queue {
    classes: [VecDeque<Waiter>; 4],
    codel: CoDel,
    flush_generation: u64,
}

impl Queue {
    fn len(&self) -> usize {
        self.classes.iter().map(VecDeque::len).sum()
    }

    /// How long a waiter of class `ci` may wait now: while overloaded, SHEDDABLE_PLUS and
    /// SHEDDABLE get CoDel's short `target`; CRITICAL keeps `interval` (shed from the
    /// bottom: a critical request behind a full limit waits about one service time, which
    /// may well exceed 5 ms).
    fn timeout(&self, ci: usize, now: Instant) -> Duration {
        if ci >= crit_index(Criticality::SheddablePlus) {
            self.codel.timeout(now)
        } else {
            self.codel.interval()
        }
    }

    fn reject(core: &Core, w: Waiter, reason: Reason) {
        let (route, criticality) = (w.route.clone(), w.criticality);
        if w.tx.send(Grant::Rejected(reason)).is_ok() {
            core.waiting.fetch_sub(1, Ordering::SeqCst);
            route.state.count_shed(false, criticality, reason);
        }
    }

    fn purge_closed(&mut self) {
        for c in &mut self.classes {
            c.retain(|w| !w.tx.is_closed());
        }
    }

    /// Applies settings changes: CoDel parameters, and a flush when the operator changed
    /// the flush generation.
    fn sync(&mut self, core: &Core, now: Instant) {
        let settings = core.settings.load();
        let q = &settings.inbound.queue;
        self.codel.set(q.codel_target, q.codel_interval);
        if q.flush_generation != self.flush_generation {
            self.flush_generation = q.flush_generation;
            for c in &mut self.classes {
                for w in c.drain(..) {
                    Self::reject(core, w, Reason::Flushed);
                }
            }
            self.codel.observe(now, 0);
        }
    }

    fn insert(&mut self, core: &Core, w: Waiter, now: Instant) {
        let max_len = core.settings.load().inbound.queue.max_len as usize;
        if self.len() >= max_len {
            self.purge_closed();
        }
        if self.len() >= max_len {
            // Shed from the bottom: push out the oldest waiter of the lowest class below
            // the arrival, if any; else the arrival itself.
            let arrival = crit_index(w.criticality);
            match (arrival + 1..4).rev().find(|&ci| !self.classes[ci].is_empty()) {
                Some(ci) => {
                    let victim = self.classes[ci].pop_front().expect("class is not empty");
                    Self::reject(core, victim, Reason::Displaced);
                    self.codel.dropped(now);
                }
                None => {
                    self.codel.dropped(now);
                    return Self::reject(core, w, Reason::QueueFull);
                }
            }
        }
        if self.len() == 0 {
            self.codel.observe(now, 0);
        }
        self.classes[crit_index(w.criticality)].push_back(w);
    }

    /// Drops the waiters that waited their timeout (oldest first in each class) or left.
    fn expire(&mut self, core: &Core, now: Instant) {
        for ci in 0..4 {
            let timeout = self.timeout(ci, now);
            while let Some(w) = self.classes[ci].front() {
                if w.tx.is_closed() {
                    self.classes[ci].pop_front();
                } else if now.saturating_duration_since(w.enqueued) >= timeout {
                    let w = self.classes[ci].pop_front().expect("front exists");
                    Self::reject(core, w, Reason::QueueTimeout);
                    self.codel.dropped(now);
                } else {
                    break;
                }
            }
        }
    }

    /// Hands free slots to waiters: highest criticality first; within a class the oldest,
    /// or the newest while overloaded (adaptive LIFO).
    fn dispatch(&mut self, core: &Arc<Core>, now: Instant) {
        let lifo = core.settings.load().inbound.queue.adaptive_lifo && self.codel.is_overloaded(now);
        let mut held: Option<(u32, Slot)> = None;
        while let Some(ci) = self.classes.iter().position(|c| !c.is_empty()) {
            let (in_flight, slot) = match held.take() {
                Some(h) => h,
                None => match core.try_acquire() {
                    Some((in_flight, _)) => (in_flight, Slot(Some(core.clone()))),
                    None => break,
                },
            };
            let w = if lifo { self.classes[ci].pop_back() } else { self.classes[ci].pop_front() };
            let w = w.expect("class is not empty");
            if w.tx.is_closed() {
                held = Some((in_flight, slot));
                continue;
            }
            if !fits(w.deadline, w.route.state.expected(), now) {
                held = Some((in_flight, slot));
                Self::reject(core, w, Reason::Deadline);
                continue;
            }
            let waited = now.saturating_duration_since(w.enqueued);
            match w.tx.send(Grant::Admitted { in_flight, slot }) {
                Ok(()) => {
                    core.waiting.fetch_sub(1, Ordering::SeqCst);
                    core.record_queue_delay(waited);
                }
                Err(Grant::Admitted { in_flight, slot }) => held = Some((in_flight, slot)),
                Err(Grant::Rejected(_)) => unreachable!("sent a grant"),
            }
        }
    }

    /// When something changes by itself: the oldest waiter of a class reaches its
    /// timeout, or the overload state begins.
    fn next_wake(&self, now: Instant) -> Option<Instant> {
        let mut next: Option<Instant> = None;
        for (ci, c) in self.classes.iter().enumerate() {
            if let Some(w) = c.front() {
                let at = w.enqueued + self.timeout(ci, now);
                next = Some(next.map_or(at, |n| n.min(at)));
            }
        }
        if next.is_some() && !self.codel.is_overloaded(now) {
            let at = self.codel.overloaded_at();
            next = next.map(|n| n.min(at));
        }
        next
    }
}

/// The queue task of one engine. Ends when every handle of the engine is gone (the
/// channel closes); the waiters left then are answered with `queue_full`.
pub(crate) async fn run(core: Arc<Core>, mut rx: mpsc::UnboundedReceiver<Waiter>) {
    let now = Instant::now();
    let q = core.settings.load().inbound.queue.clone();
    let mut queue = Queue {
        classes: Default::default(),
        codel: CoDel::new(q.codel_target, q.codel_interval, now),
        flush_generation: q.flush_generation,
    };
    loop {
        let now = Instant::now();
        queue.sync(&core, now);
        while let Ok(w) = rx.try_recv() {
            queue.insert(&core, w, now);
        }
        queue.expire(&core, now);
        queue.dispatch(&core, now);
        let len = queue.len();
        queue.codel.observe(now, len);
        core.publish_queue(len, len > 0 && queue.codel.is_overloaded(now));
        let wake = queue.next_wake(now);
        let far = now + Duration::from_secs(3600);
        tokio::select! {
            biased;
            m = rx.recv() => match m {
                Some(w) => queue.insert(&core, w, Instant::now()),
                None => break,
            },
            () = core.notify.notified() => {}
            () = tokio::time::sleep_until(wake.unwrap_or(far)), if wake.is_some() => {}
        }
    }
    core.publish_queue(0, false);
}

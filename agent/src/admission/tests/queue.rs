//! The queue under a paused clock: FIFO, then LIFO while CoDel says overloaded; CoDel's
//! timeouts; displacement by criticality; deadline-aware dropping; flushes and live
//! resizes.

use std::time::Duration;

use tokio::sync::mpsc;
use tokio::time::{Instant, advance};

use super::*;
use crate::deadline::Deadline;

/// Queues a request of `route` in a task that reports `(name, result)` when admission
/// answers, and holds an admitted permit until the test drops the message.
fn queue_up(
    a: &Admission,
    name: &'static str,
    c: Criticality,
    deadline: Option<Deadline>,
    out: &mpsc::UnboundedSender<(&'static str, Result<AdmissionPermit<'static>, Rejected>)>,
) {
    let mut r = req("GET /q", c);
    if let Some(d) = deadline {
        r = r.deadline(d);
    }
    let fut = a.admit(&r);
    let out = out.clone();
    tokio::spawn(async move {
        let _ = out.send((name, fut.await));
    });
}

fn reason(r: &Result<AdmissionPermit, Rejected>) -> Option<Reason> {
    r.as_ref().err().map(Rejected::reason)
}

#[test]
fn codel_is_overloaded_once_the_queue_stayed_non_empty_for_an_interval() {
    let t0 = Instant::now();
    let mut c = CoDel::new(5 * MS, 100 * MS, t0);
    assert!(!c.is_overloaded(t0));
    assert_eq!(c.timeout(t0), 100 * MS);
    c.observe(t0 + 10 * MS, 3);
    assert!(!c.is_overloaded(t0 + 99 * MS));
    assert!(c.is_overloaded(t0 + 100 * MS));
    assert_eq!(c.timeout(t0 + 100 * MS), 5 * MS);
    assert_eq!(c.overloaded_at(), t0 + 100 * MS);
    // Emptied once: the clock starts again.
    c.observe(t0 + 150 * MS, 0);
    assert!(!c.is_overloaded(t0 + 249 * MS));
    assert!(c.is_overloaded(t0 + 250 * MS));
}

/// Under a steady overload the short timeout empties the queue by itself; were an empty
/// queue the end of the overload, waiters would get the whole interval again half of the
/// time (docs/benchmarks.md, "Overload").
#[test]
fn codel_emptied_by_its_own_drops_stays_overloaded_until_an_interval_without_one() {
    let t0 = Instant::now();
    let mut c = CoDel::new(5 * MS, 100 * MS, t0);
    c.observe(t0, 3);
    assert!(c.is_overloaded(t0 + 100 * MS));
    // Every waiter waited past the 5 ms target and was dropped: the queue is empty.
    c.dropped(t0 + 105 * MS);
    c.observe(t0 + 105 * MS, 0);
    c.observe(t0 + 150 * MS, 2);
    assert!(c.is_overloaded(t0 + 150 * MS), "emptied by drops, not by serving");
    assert_eq!(c.timeout(t0 + 150 * MS), 5 * MS);
    c.dropped(t0 + 160 * MS);
    c.observe(t0 + 170 * MS, 0);
    assert!(c.is_overloaded(t0 + 259 * MS));
    // An interval without a drop, the queue emptied by serving meanwhile: over.
    c.observe(t0 + 260 * MS, 0);
    assert!(!c.is_overloaded(t0 + 260 * MS));
    assert_eq!(c.timeout(t0 + 260 * MS), 100 * MS);
}

#[tokio::test(start_paused = true)]
async fn the_queue_serves_fifo_normally_and_lifo_while_overloaded() {
    let a = engine(r#"{"limit": {"algorithm": "fixed", "initial_limit": 1}, "queue": {"max_len": 10}}"#);
    let (tx, mut rx) = mpsc::unbounded_channel();
    // Normal: FIFO.
    let hold = a.try_admit(&req("GET /q", Criticality::Critical)).unwrap();
    for name in ["a", "b", "c"] {
        queue_up(&a, name, Criticality::Critical, None, &tx);
        settle().await;
        advance(MS).await;
    }
    assert_eq!(a.status().queued, 3);
    drop(hold);
    let mut order = Vec::new();
    for _ in 0..3 {
        let (name, r) = rx.recv().await.unwrap();
        assert!(r.is_ok());
        order.push(name);
        drop(r); // releases the slot to the next waiter
    }
    assert_eq!(order, ["a", "b", "c"]);
    assert!(!a.status().overloaded);

    // Overloaded: the queue has not been empty since t0 for 100 ms.
    let hold = a.try_admit(&req("GET /q", Criticality::Critical)).unwrap();
    let t0 = Instant::now();
    queue_up(&a, "first", Criticality::Critical, None, &tx);
    settle().await;
    tokio::time::sleep_until(t0 + 60 * MS).await;
    queue_up(&a, "d", Criticality::Critical, None, &tx);
    tokio::time::sleep_until(t0 + 70 * MS).await;
    // A waiter that leaves in the middle of the queue: its turn must pass its slot on.
    let gone = a.admit(&req("GET /q", Criticality::Critical));
    tokio::time::sleep_until(t0 + 80 * MS).await;
    queue_up(&a, "f", Criticality::Critical, None, &tx);
    settle().await;
    drop(gone);
    // At 100 ms the first waiter reaches the interval and is dropped; the queue is
    // overloaded from then on.
    let (name, r) = rx.recv().await.unwrap();
    assert_eq!((name, reason(&r)), ("first", Some(Reason::QueueTimeout)));
    assert_eq!(Instant::now() - t0, 100 * MS);
    settle().await;
    assert!(a.status().overloaded);
    drop(hold);
    let mut order = Vec::new();
    let mut last = None;
    for _ in 0..2 {
        drop(last.take()); // the previous one finishes: its slot goes to the next
        let (name, r) = rx.recv().await.unwrap();
        assert!(r.is_ok(), "{name}");
        order.push(name);
        last = Some(r);
    }
    assert_eq!(order, ["f", "d"], "newest first while overloaded");
    settle().await;
    let s = a.status();
    assert_eq!((s.in_flight, s.queued), (1, 0), "only d's slot is held");
    drop(last);
}

#[tokio::test(start_paused = true)]
async fn while_overloaded_sheddable_waiters_get_the_short_target_and_critical_ones_the_interval() {
    let a = engine(r#"{"limit": {"algorithm": "fixed", "initial_limit": 1}, "queue": {"max_len": 10}}"#);
    let (tx, mut rx) = mpsc::unbounded_channel();
    let _hold = a.try_admit(&req("GET /q", Criticality::Critical)).unwrap();
    let t0 = Instant::now();
    queue_up(&a, "keeps the queue busy", Criticality::Critical, None, &tx);
    settle().await;
    tokio::time::sleep_until(t0 + 95 * MS).await;
    queue_up(&a, "critical", Criticality::Critical, None, &tx);
    queue_up(&a, "sheddable", Criticality::Sheddable, None, &tx);
    settle().await;
    // Not yet overloaded: the SHEDDABLE waiter may wait up to the interval...
    let (name, _) = rx.recv().await.unwrap();
    assert_eq!(name, "keeps the queue busy");
    assert_eq!(Instant::now() - t0, 100 * MS);
    // ...but once overloaded (at 100 ms) it has already waited ≥ 5 ms: dropped now.
    let (name, r) = rx.recv().await.unwrap();
    assert_eq!((name, reason(&r)), ("sheddable", Some(Reason::QueueTimeout)));
    assert_eq!(Instant::now() - t0, 100 * MS);
    // The CRITICAL waiter keeps the interval: 95 + 100 ms.
    let (name, r) = rx.recv().await.unwrap();
    assert_eq!((name, reason(&r)), ("critical", Some(Reason::QueueTimeout)));
    assert_eq!(Instant::now() - t0, 195 * MS);
    let s = a.status();
    assert_eq!(s.shed_total(Reason::QueueTimeout, false), 3);
}

#[tokio::test(start_paused = true)]
async fn a_higher_criticality_displaces_the_oldest_queued_lower_one() {
    let a = engine(r#"{"limit": {"algorithm": "fixed", "initial_limit": 1}, "queue": {"max_len": 2}}"#);
    let (tx, mut rx) = mpsc::unbounded_channel();
    let hold = a.try_admit(&req("GET /q", Criticality::Critical)).unwrap();
    queue_up(&a, "s1", Criticality::Sheddable, None, &tx);
    settle().await;
    queue_up(&a, "s2", Criticality::Sheddable, None, &tx);
    settle().await;
    queue_up(&a, "c", Criticality::Critical, None, &tx);
    settle().await;
    let (name, r) = rx.recv().await.unwrap();
    assert_eq!((name, reason(&r)), ("s1", Some(Reason::Displaced)));
    // A SHEDDABLE arrival finds nothing lower to push out.
    queue_up(&a, "s3", Criticality::Sheddable, None, &tx);
    settle().await;
    let (name, r) = rx.recv().await.unwrap();
    assert_eq!((name, reason(&r)), ("s3", Some(Reason::QueueFull)));
    // SHEDDABLE_PLUS displaces SHEDDABLE too.
    queue_up(&a, "sp", Criticality::SheddablePlus, None, &tx);
    settle().await;
    let (name, r) = rx.recv().await.unwrap();
    assert_eq!((name, reason(&r)), ("s2", Some(Reason::Displaced)));
    // Highest criticality is served first.
    drop(hold);
    let (name, r) = rx.recv().await.unwrap();
    assert_eq!(name, "c");
    drop(r);
    let (name, _) = rx.recv().await.unwrap();
    assert_eq!(name, "sp");
}

#[tokio::test(start_paused = true)]
async fn a_queued_request_is_dropped_when_its_deadline_no_longer_fits_the_service_time() {
    let a = engine(r#"{"limit": {"algorithm": "fixed", "initial_limit": 1}, "queue": {"max_len": 10}}"#);
    let (tx, mut rx) = mpsc::unbounded_channel();
    // Learn a service time of 50 ms.
    let p = a
        .try_admit(&req("GET /q", Criticality::Critical).deadline(Deadline::after(Duration::from_secs(1))))
        .unwrap();
    advance(50 * MS).await;
    drop(p);
    let _hold = a.try_admit(&req("GET /q", Criticality::Critical)).unwrap();
    let t0 = Instant::now();
    queue_up(&a, "late", Criticality::Critical, Some(Deadline::after(90 * MS)), &tx);
    let (name, r) = rx.recv().await.unwrap();
    // Gives up at 90 − 50 = 40 ms: it could not have finished in time any more.
    assert_eq!((name, reason(&r)), ("late", Some(Reason::Deadline)));
    assert_eq!(Instant::now() - t0, 40 * MS);
    settle().await;
    assert_eq!(a.status().queued, 0);
}

#[tokio::test(start_paused = true)]
async fn flushing_rejects_every_waiter_once_and_later_arrivals_queue_normally() {
    let json = |generation: u32| {
        format!(
            r#"{{"limit": {{"algorithm": "fixed", "initial_limit": 1}}, "queue": {{"max_len": 10, "flush_generation": {generation}}}}}"#
        )
    };
    let a = engine(&json(3));
    let (tx, mut rx) = mpsc::unbounded_channel();
    let hold = a.try_admit(&req("GET /q", Criticality::Critical)).unwrap();
    for name in ["a", "b"] {
        queue_up(&a, name, Criticality::Critical, None, &tx);
    }
    settle().await;
    a.update(&inbound(&json(4)));
    for _ in 0..2 {
        let (_, r) = rx.recv().await.unwrap();
        assert_eq!(reason(&r), Some(Reason::Flushed));
    }
    queue_up(&a, "c", Criticality::Critical, None, &tx);
    settle().await;
    a.update(&inbound(&json(4))); // same generation: no flush
    settle().await;
    assert_eq!(a.status().queued, 1);
    drop(hold);
    let (name, r) = rx.recv().await.unwrap();
    assert_eq!(name, "c");
    assert!(r.is_ok());
}

#[tokio::test(start_paused = true)]
async fn a_live_resize_keeps_work_in_flight_and_admits_waiters_as_room_appears() {
    let fixed = |n: u32| {
        format!(r#"{{"limit": {{"algorithm": "fixed", "initial_limit": {n}}}, "queue": {{"max_len": 10}}}}"#)
    };
    let a = engine(&fixed(2));
    let (tx, mut rx) = mpsc::unbounded_channel();
    let p1 = a.try_admit(&req("GET /q", Criticality::Critical)).unwrap();
    let p2 = a.try_admit(&req("GET /q", Criticality::Critical)).unwrap();
    a.update(&inbound(&fixed(1)));
    assert_eq!((a.status().limit, a.status().in_flight), (1, 2));
    queue_up(&a, "w1", Criticality::Critical, None, &tx);
    queue_up(&a, "w2", Criticality::Critical, None, &tx);
    settle().await;
    drop(p1);
    settle().await;
    assert_eq!(a.status().queued, 2, "2 in flight → 1: still at the new limit");
    drop(p2);
    let (name, first) = rx.recv().await.unwrap();
    assert_eq!(name, "w1");
    settle().await;
    assert_eq!(a.status().queued, 1);
    // Raising the limit admits the next waiter without any release.
    a.update(&inbound(&fixed(3)));
    let (name, second) = rx.recv().await.unwrap();
    assert_eq!(name, "w2");
    assert!(first.is_ok() && second.is_ok());
    assert_eq!(a.status().in_flight, 2);
}

#[tokio::test(start_paused = true)]
async fn a_cancelled_waiter_leaves_the_queue_and_its_slot_goes_to_the_next() {
    let a = engine(r#"{"limit": {"algorithm": "fixed", "initial_limit": 1}, "queue": {"max_len": 10}}"#);
    let hold = a.try_admit(&req("GET /q", Criticality::Critical)).unwrap();
    let mut cancelled = Box::pin(a.admit(&req("GET /q", Criticality::Critical)));
    assert!(futures::poll!(cancelled.as_mut()).is_pending());
    let next = a.admit(&req("GET /q", Criticality::Critical));
    settle().await;
    assert_eq!(a.status().queued, 2);
    drop(cancelled);
    assert_eq!(a.status().queued, 1);
    drop(hold);
    let p = next.await.unwrap();
    assert!(p.is_counted());
    assert_eq!(a.status().in_flight, 1);
}

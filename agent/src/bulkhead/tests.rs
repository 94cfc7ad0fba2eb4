use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use futures::FutureExt;
use tokio::time::{Instant, advance};

use super::*;
use crate::deadline::{Deadline, DeadlineExceeded};
use crate::policy;

const MS: Duration = Duration::from_millis(1);

fn bulkhead(max_concurrent: u32, max_wait: Duration) -> Bulkhead {
    Bulkhead::new(&policy::BulkheadPolicy { max_concurrent, max_wait })
}

/// Exactly `n` calls can hold a permit at once, the next one is refused.
fn assert_admits_exactly(b: &Bulkhead, n: u32) {
    let held: Vec<_> =
        (0..n).map(|i| b.try_acquire().unwrap_or_else(|_| panic!("permit {i} of {n}"))).collect();
    assert!(b.try_acquire().is_err(), "permit {} of {n}", n + 1);
    drop(held);
    assert_eq!(b.in_flight(), 0);
}

#[tokio::test(start_paused = true)]
async fn bh_1_timed_out_waiters_dropped_and_panicked_calls_never_leak_permits() {
    let b = bulkhead(5, 10 * MS);
    // 3,334 waiters that time out while the bulkhead is full.
    let held: Vec<_> = (0..5).map(|_| b.try_acquire().unwrap()).collect();
    let waiters = (0..3334).map(|_| b.acquire(None));
    let results = futures::future::join_all(waiters).await;
    assert!(results.iter().all(|r| matches!(r, Err(BulkheadError::Full(_)))));
    assert_eq!(b.rejected(), 3334);
    drop(held);
    assert_eq!(b.in_flight(), 0, "no timed-out waiter was handed a permit later");
    // 3,333 calls dropped mid-flight while holding a permit.
    for _ in 0..3333 {
        let call = async {
            let _p = b.acquire(None).await.unwrap();
            std::future::pending::<()>().await;
        };
        assert!(tokio::time::timeout(MS, call).await.is_err());
    }
    assert_eq!(b.in_flight(), 0);
    // 3,333 calls that panic while holding a permit.
    for _ in 0..3333 {
        let call = AssertUnwindSafe(async {
            let _p = b.acquire(None).await.unwrap();
            panic!("BH-1 injected panic");
        });
        assert!(call.catch_unwind().await.is_err());
    }
    assert_eq!(b.in_flight(), 0);
    assert_admits_exactly(&b, 5);
}

#[test]
fn bh_2_clones_share_one_limit() {
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(4).enable_all().build().unwrap();
    rt.block_on(async {
        let b = bulkhead(7, Duration::from_secs(30));
        let clones: Vec<_> = (0..10).map(|_| b.clone()).collect();
        let current = Arc::new(AtomicU32::new(0));
        let peak = Arc::new(AtomicU32::new(0));
        let mut tasks = Vec::new();
        for i in 0..200 {
            let (bh, current, peak) = (clones[i % 10].clone(), current.clone(), peak.clone());
            tasks.push(tokio::spawn(async move {
                let _p = bh.acquire(None).await.expect("waits are long enough");
                let now = current.fetch_add(1, Ordering::SeqCst) + 1;
                peak.fetch_max(now, Ordering::SeqCst);
                for _ in 0..5 {
                    tokio::task::yield_now().await;
                }
                current.fetch_sub(1, Ordering::SeqCst);
            }));
        }
        for t in tasks {
            t.await.unwrap();
        }
        let peak = peak.load(Ordering::SeqCst);
        assert!(peak <= 7, "peak {peak} exceeds the shared limit");
        assert_eq!(b.in_flight(), 0);
        assert_admits_exactly(&clones[3], 7);
    });
}

#[tokio::test(start_paused = true)]
async fn bh_3_lowering_the_limit_under_load_keeps_calls_in_flight_and_holds_new_ones() {
    let b = bulkhead(20, Duration::from_secs(10));
    let mut in_flight: Vec<_> = (0..20).map(|_| b.try_acquire().unwrap()).collect();
    b.update(&policy::BulkheadPolicy { max_concurrent: 5, max_wait: Duration::from_secs(10) });
    assert_eq!((b.in_flight(), b.max_concurrent()), (20, 5));
    let mut waiter = std::pin::pin!(b.acquire(None));
    assert!(futures::poll!(&mut waiter).is_pending());
    // Calls in flight finish one by one; the waiter stays parked until fewer than 5 remain.
    while in_flight.len() > 5 {
        in_flight.pop();
        tokio::task::yield_now().await;
        assert!(futures::poll!(&mut waiter).is_pending(), "{} in flight", in_flight.len());
    }
    assert!(b.try_acquire().is_err(), "5 in flight = full");
    in_flight.pop();
    let admitted = match futures::poll!(&mut waiter) {
        std::task::Poll::Ready(r) => r.expect("admitted once 4 are in flight"),
        std::task::Poll::Pending => panic!("still waiting with 4 in flight"),
    };
    assert_eq!(b.in_flight(), 5);
    assert!(b.try_acquire().is_err());
    drop(admitted);
    drop(in_flight);
    assert_admits_exactly(&b, 5);
    // Raising it again wakes waiters at once.
    let held: Vec<_> = (0..5).map(|_| b.try_acquire().unwrap()).collect();
    let mut waiter = std::pin::pin!(b.acquire(None));
    assert!(futures::poll!(&mut waiter).is_pending());
    b.resize(6);
    assert!(matches!(futures::poll!(&mut waiter), std::task::Poll::Ready(Ok(_))));
    drop(held);
}

#[tokio::test(start_paused = true)]
async fn waiting_is_bounded_by_max_wait_and_by_the_deadline() {
    let b = bulkhead(1, 100 * MS);
    let held = b.try_acquire().unwrap();
    let start = Instant::now();
    assert!(matches!(b.acquire(None).await, Err(BulkheadError::Full(_))));
    assert_eq!(Instant::now() - start, 100 * MS);
    let start = Instant::now();
    let deadline = Deadline::after(30 * MS);
    assert_eq!(
        b.acquire(Some(deadline)).await.unwrap_err(),
        BulkheadError::DeadlineExceeded(DeadlineExceeded::new())
    );
    assert_eq!(Instant::now() - start, 30 * MS);
    drop(held);
    // A slot is free but the deadline already passed: the slot is given back.
    advance(MS).await;
    assert!(matches!(b.acquire(Some(deadline)).await, Err(BulkheadError::DeadlineExceeded(_))));
    assert_eq!(b.in_flight(), 0);
    // Fail fast with max_wait 0.
    let fast = bulkhead(1, Duration::ZERO);
    let _h = fast.try_acquire().unwrap();
    let start = Instant::now();
    assert!(matches!(fast.acquire(None).await, Err(BulkheadError::Full(_))));
    assert_eq!(Instant::now(), start);
    let boxed = BulkheadError::Full(BulkheadFull::new()).into_boxed();
    assert!(boxed.downcast_ref::<BulkheadFull>().is_some());
    assert_eq!(boxed.to_string(), "bulkhead is full");
}

#[tokio::test(start_paused = true)]
async fn a_waiter_is_woken_when_a_slot_frees_up() {
    let b = bulkhead(1, Duration::from_secs(1));
    let held = b.try_acquire().unwrap();
    let mut waiter = std::pin::pin!(b.acquire(None));
    assert!(futures::poll!(&mut waiter).is_pending());
    advance(300 * MS).await;
    drop(held);
    let start = Instant::now();
    let p = waiter.await.unwrap();
    assert_eq!(Instant::now(), start, "woken by the release, not by a timer");
    drop(p);
}

#[tokio::test(start_paused = true)]
async fn littles_law_suggests_rate_times_latency_times_two() {
    let b = bulkhead(100, Duration::ZERO);
    assert_eq!(b.estimate().suggested, 0, "nothing measured yet");
    // 200 calls per second, each holding its slot 50 ms: L = 200 × 0.05 = 10, × 2 = 20.
    let mut held = std::collections::VecDeque::new();
    for _ in 0..1000 {
        held.push_back(b.try_acquire().unwrap());
        advance(5 * MS).await;
        if held.len() > 9 {
            held.pop_front();
        }
    }
    let e = b.estimate();
    assert!((e.arrival_rate - 200.0).abs() < 10.0, "{e:?}");
    assert!((e.latency.as_secs_f64() - 0.05).abs() < 0.006, "{e:?}");
    assert!((19..=22).contains(&e.suggested), "{e:?}");
    drop(held);
}

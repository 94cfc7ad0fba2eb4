//! IN-3 metastability: after an overload ends, goodput returns to normal by itself —
//! the queue drains, the limit recovers, nothing stays shed — with no operator action.
//!
//! A simulated service under a paused clock: 10 workers taking 10 ms each (capacity
//! 1,000 rps); requests beyond the workers wait inside the service, so the round trip
//! grows with concurrency (what the adaptive limits measure). 5× capacity for 2 s, then
//! 0.3× for 3 s.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use tokio::sync::Semaphore;
use tokio::time::Instant;

use super::*;

#[derive(Default)]
struct Tally {
    served: AtomicU32,
    shed: AtomicU32,
}

async fn one_request(a: Admission, workers: Arc<Semaphore>, tally: Arc<Tally>) {
    match a.admit(&req("GET /work", Criticality::Critical)).await {
        Ok(mut permit) => {
            let started = Instant::now();
            let _worker = workers.acquire().await.unwrap();
            tokio::time::sleep(10 * MS).await;
            // The service's own overload answer: past 100 ms it would have timed out.
            if started.elapsed() > 100 * MS {
                permit.set_outcome(Outcome::Dropped);
            }
            tally.served.fetch_add(1, Ordering::Relaxed);
        }
        Err(_) => {
            tally.shed.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// Offers `rps` for `secs`, open loop (requests are sent at their scheduled times
/// whatever happens to the earlier ones).
async fn offer(a: &Admission, workers: &Arc<Semaphore>, rps: u64, secs: u64) -> Arc<Tally> {
    let tally = Arc::new(Tally::default());
    let start = Instant::now();
    let gap = Duration::from_nanos(1_000_000_000 / rps);
    let mut tasks = Vec::new();
    for i in 0..rps * secs {
        tokio::time::sleep_until(start + gap * u32::try_from(i).unwrap()).await;
        tasks.push(tokio::spawn(one_request(a.clone(), workers.clone(), tally.clone())));
    }
    for t in tasks {
        t.await.unwrap();
    }
    tally
}

async fn recovers_after_overload(algorithm: &str) {
    let a = engine(&format!(
        r#"{{"limit": {{"algorithm": "{algorithm}", "initial_limit": 20, "min_limit": 2, "max_limit": 200,
                        "timeout": "100ms"}},
            "queue": {{"max_len": 50}}}}"#
    ));
    let workers = Arc::new(Semaphore::new(10));
    let overload = offer(&a, &workers, 5000, 2).await;
    let (served, shed) = (overload.served.load(Ordering::Relaxed), overload.shed.load(Ordering::Relaxed));
    assert!(shed > 5000, "{algorithm}: the overload must be shed ({served} served, {shed} shed)");
    assert!(served >= 1500, "{algorithm}: goodput under overload collapsed ({served} served)");
    // Load back to 0.3× capacity: the first second drains whatever is left...
    let _ = offer(&a, &workers, 300, 1).await;
    let s = a.status();
    assert_eq!((s.queued, s.overloaded), (0, false), "{algorithm}: queue still standing");
    // ...and from then on everything is served, with no operator action.
    let after = offer(&a, &workers, 300, 2).await;
    assert_eq!(after.shed.load(Ordering::Relaxed), 0, "{algorithm}: still shedding after the overload");
    assert_eq!(after.served.load(Ordering::Relaxed), 600);
    let s = a.status();
    assert!(s.limit >= 10, "{algorithm}: limit stuck at {} after recovery", s.limit);
    assert_eq!(s.in_flight, 0);
}

#[tokio::test(start_paused = true)]
async fn in_3_gradient2_recovers_by_itself_after_overload() {
    recovers_after_overload("gradient2").await;
}

#[tokio::test(start_paused = true)]
async fn in_3_aimd_recovers_by_itself_after_overload() {
    recovers_after_overload("aimd").await;
}

#[tokio::test(start_paused = true)]
async fn in_3_vegas_recovers_by_itself_after_overload() {
    recovers_after_overload("vegas").await;
}

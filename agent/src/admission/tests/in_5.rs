//! IN-5 adaptive limit drift: under a sustained overload of minutes at constant capacity,
//! the adaptive limits stay near the capacity — Gradient2's long-term RTT does not absorb
//! the queueing and let the limit climb back to its maximum.
//!
//! A simulated service under a paused clock: 4 workers taking 50 ms each (capacity 80 rps);
//! requests beyond the workers wait inside the service, so the round trip grows with the
//! limit (what the adaptive limits measure) and nothing is ever dropped. Offered 3× its
//! capacity, open loop, for five minutes.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use tokio::sync::Semaphore;
use tokio::time::Instant;

use super::*;

const WORKERS: usize = 4;
const WORK: Duration = Duration::from_millis(50);

async fn one_request(a: Admission, workers: Arc<Semaphore>, served: Arc<AtomicU32>) {
    if let Ok(_permit) = a.admit(&req("GET /work", Criticality::Critical)).await {
        let _worker = workers.acquire().await.unwrap();
        tokio::time::sleep(WORK).await;
        served.fetch_add(1, Ordering::Relaxed);
    }
}

/// Offers `rps` for `secs` and returns the limit at the end of every 10 s and the number
/// of requests served.
async fn sustained(a: &Admission, rps: u64, secs: u64) -> (Vec<u32>, u32) {
    let workers = Arc::new(Semaphore::new(WORKERS));
    let served = Arc::new(AtomicU32::new(0));
    let start = Instant::now();
    let gap = Duration::from_nanos(1_000_000_000 / rps);
    let mut limits = Vec::new();
    for i in 0..rps * secs {
        tokio::time::sleep_until(start + gap * u32::try_from(i).unwrap()).await;
        tokio::spawn(one_request(a.clone(), workers.clone(), served.clone()));
        if i % (rps * 10) == rps * 10 - 1 {
            limits.push(a.status().limit);
        }
    }
    (limits, served.load(Ordering::Relaxed))
}

async fn holds(algorithm: &str) {
    let a = engine(&format!(
        r#"{{"limit": {{"algorithm": "{algorithm}", "initial_limit": 11, "min_limit": 1, "max_limit": 200}},
            "queue": {{"max_len": 50}}}}"#
    ));
    let capacity = WORKERS as u64 * 1000 / WORK.as_millis() as u64;
    let (limits, served) = sustained(&a, 3 * capacity, 300).await;
    let first_minute = *limits[..6].iter().max().unwrap();
    let last_minute = *limits[24..].iter().max().unwrap();
    // The service does its best with 4 in flight; with the queue inside it, a limit of
    // a few times that keeps it busy. Drifting would end far above.
    assert!(
        last_minute <= 24 && last_minute <= first_minute + 4,
        "{algorithm}: the limit drifted up under a constant overload: {limits:?}"
    );
    assert!(
        u64::from(served) >= capacity * 300 * 95 / 100,
        "{algorithm}: goodput fell below the capacity: {served} served; limits {limits:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn in_5_gradient2_holds_under_five_minutes_of_sustained_overload() {
    holds("gradient2").await;
}

#[tokio::test(start_paused = true)]
async fn in_5_aimd_holds_under_five_minutes_of_sustained_overload() {
    holds("aimd").await;
}

#[tokio::test(start_paused = true)]
async fn in_5_vegas_holds_under_five_minutes_of_sustained_overload() {
    holds("vegas").await;
}

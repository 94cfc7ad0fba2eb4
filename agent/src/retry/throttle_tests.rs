//! Client-side adaptive throttling: the SRE book's probability, exactly, counted when
//! outcomes are known, and its window (paused clock, seeded draws).

use std::time::Duration;

use tokio::time::advance;

use super::{AdaptiveThrottle, Throttled, throttle_probability};
use crate::policy;

fn settings(k: f64) -> policy::ClientThrottle {
    policy::ClientThrottle { k, window: Duration::from_secs(120) }
}

/// `accepts` accepted answers, then `rejections` overload rejections.
fn answers(t: &AdaptiveThrottle, accepts: u64, rejections: u64) {
    for _ in 0..accepts {
        t.record(true);
    }
    for _ in 0..rejections {
        t.record(false);
    }
}

#[test]
fn probability_is_max_zero_requests_minus_k_accepts_over_requests_plus_one() {
    assert_eq!(throttle_probability(0, 0, 2.0), 0.0);
    assert_eq!(throttle_probability(100, 50, 2.0), 0.0); // (100 − 100)/101
    assert_eq!(throttle_probability(100, 100, 2.0), 0.0);
    assert!((throttle_probability(100, 30, 2.0) - 40.0 / 101.0).abs() < 1e-12);
    assert!((throttle_probability(100, 0, 2.0) - 100.0 / 101.0).abs() < 1e-12);
    assert!((throttle_probability(100, 30, 1.1) - 67.0 / 101.0).abs() < 1e-12);
}

#[tokio::test(start_paused = true)]
async fn a_backend_that_accepts_everything_is_never_throttled() {
    let t = AdaptiveThrottle::with_seed(&settings(2.0), 1);
    for _ in 0..10_000 {
        t.try_acquire().unwrap();
        t.record(true);
    }
    assert_eq!((t.counts(), t.throttled()), ((10_000, 10_000), 0));
}

/// Requests are counted when answered: the first burst of concurrent calls (none answered
/// yet) is not a reason to throttle. Counted at send, 100 calls in flight would give the
/// 101st p = 100/101.
#[tokio::test(start_paused = true)]
async fn a_first_burst_of_concurrent_calls_is_not_throttled() {
    let t = AdaptiveThrottle::with_seed(&settings(2.0), 1);
    for _ in 0..1_000 {
        t.try_acquire().unwrap();
    }
    assert_eq!((t.counts(), t.reject_probability()), ((0, 0), 0.0));
}

#[tokio::test(start_paused = true)]
async fn local_refusals_follow_the_probability_and_stop_when_the_window_forgets() {
    let t = AdaptiveThrottle::with_seed(&settings(2.0), 3);
    // 100 answers, 30 accepted: p = (100 − 2 × 30) / 101 = 40/101.
    answers(&t, 30, 70);
    assert_eq!(t.counts(), (100, 30));
    assert!((t.reject_probability() - 40.0 / 101.0).abs() < 1e-12);
    // The refusal rate at that probability: the same window rebuilt with 2,000 seeds.
    let mut refused = 0;
    for seed in 0..2000 {
        let fresh = AdaptiveThrottle::with_seed(&settings(2.0), seed);
        answers(&fresh, 30, 70);
        let refused_now = fresh.try_acquire().is_err();
        assert_eq!(fresh.throttled(), u64::from(refused_now));
        refused += u64::from(refused_now);
    }
    let rate = refused as f64 / 2000.0;
    assert!((rate - 40.0 / 101.0).abs() < 0.04, "refusal rate {rate}");
    // A local refusal counts as a request: (100, 30) → (101, 30) after one refusal.
    let seed = (0..).find(|s| {
        let f = AdaptiveThrottle::with_seed(&settings(2.0), *s);
        answers(&f, 30, 70);
        f.try_acquire().is_err()
    });
    let f = AdaptiveThrottle::with_seed(&settings(2.0), seed.unwrap());
    answers(&f, 30, 70);
    assert_eq!(f.try_acquire(), Err(Throttled::default()));
    assert_eq!((f.counts(), f.throttled()), ((101, 30), 1));
    // Two minutes later the window has forgotten everything: nothing is refused.
    advance(Duration::from_secs(121)).await;
    assert_eq!(t.counts(), (0, 0));
    assert_eq!(t.reject_probability(), 0.0);
    for _ in 0..100 {
        t.try_acquire().unwrap();
    }
    // K changes live.
    t.update(&settings(1.0));
    assert_eq!(t.k(), 1.0);
    assert_eq!(Throttled::default().to_string(), "throttled locally: the backend is rejecting most requests");
}

/// Accepts of the quiet time (no refusal in the window) are kept without the clock and
/// enter the window when a refusal comes: all of them when they span less than the
/// window, else the share of the window, as if they had come evenly.
#[tokio::test(start_paused = true)]
async fn quiet_accepts_enter_the_window_with_the_first_refusal() {
    let t = AdaptiveThrottle::with_seed(&settings(2.0), 5);
    answers(&t, 1000, 0);
    advance(Duration::from_secs(60)).await;
    answers(&t, 0, 1);
    // 60 s of quiet < 120 s window: all 1,000 accepts, plus the refusal.
    assert_eq!(t.counts(), (1001, 1000));

    let t = AdaptiveThrottle::with_seed(&settings(2.0), 5);
    answers(&t, 1000, 0);
    advance(Duration::from_secs(240)).await;
    answers(&t, 0, 1);
    // 240 s of quiet: 1000 × 120/240 = 500 accepts fall in the window.
    assert_eq!(t.counts(), (501, 500));
    // A backend now refusing everything: after 1,000 more rejections (1501, 500) the
    // probability is (1501 − 1000) / 1502.
    answers(&t, 0, 1000);
    assert_eq!(t.counts(), (1501, 500));
    assert!((t.reject_probability() - 501.0 / 1502.0).abs() < 1e-12);
}

/// After the last refusal leaves the window the throttle is quiet again: calls are not
/// refused and answers are counted without the clock.
#[tokio::test(start_paused = true)]
async fn the_throttle_returns_to_quiet_after_a_window_without_refusals() {
    let t = AdaptiveThrottle::with_seed(&settings(2.0), 9);
    answers(&t, 0, 50); // p = 50/51
    assert!(t.reject_probability() > 0.9);
    advance(Duration::from_secs(121)).await;
    t.try_acquire().unwrap();
    answers(&t, 10, 0);
    assert_eq!(t.counts(), (10, 10));
    assert_eq!(t.throttled(), 0);
}

/// A local refusal is a local overload rejection: never retried, not the dependency's
/// failure, not an accept.
#[test]
fn a_refusal_is_not_retryable() {
    let kind = super::classify_error(&Throttled::default());
    assert_eq!(kind, super::ErrorKind::BulkheadFull);
    assert!(!kind.is_retryable() && !kind.is_dependency_failure());
    assert_eq!(kind.throttle_answer(), None, "a local refusal says nothing about the backend");
}

/// Nothing is refused before the window holds 20 answers: with the formula alone one
/// rejection (1 request, 0 accepts) would refuse half of the next attempts, the retry of
/// that very call included. At 20 rejections p = 20/21.
#[tokio::test(start_paused = true)]
async fn nothing_is_refused_below_twenty_answers() {
    let t = AdaptiveThrottle::with_seed(&settings(2.0), 11);
    answers(&t, 0, 19);
    assert_eq!(t.reject_probability(), 0.0);
    for _ in 0..1000 {
        t.try_acquire().unwrap();
    }
    answers(&t, 0, 1);
    assert!((t.reject_probability() - 20.0 / 21.0).abs() < 1e-12);
}

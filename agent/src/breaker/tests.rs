use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use proptest::prelude::*;
use tokio::time::{Instant, advance};

use super::window::{CountWindow, FAIL, OK, SLOW, TimeWindow};
use super::*;
use crate::policy::{self, BreakerOverrideState, Window};

const MS: Duration = Duration::from_millis(1);
const SEC: Duration = Duration::from_secs(1);
const ATTEMPT_TIMEOUT: Duration = Duration::from_secs(1);

fn settings(window: Window, minimum_calls: u32) -> policy::CircuitBreakerPolicy {
    policy::CircuitBreakerPolicy {
        window,
        minimum_calls,
        half_open_probes: 3,
        wait_in_open: 15 * SEC,
        max_wait_in_open: 300 * SEC,
        ..Default::default()
    }
}

fn count(size: u32) -> Window {
    Window::Count { size }
}

fn breaker(window: Window, minimum_calls: u32) -> CircuitBreaker {
    CircuitBreaker::new(&settings(window, minimum_calls), ATTEMPT_TIMEOUT)
}

fn call(b: &CircuitBreaker, outcome: Outcome) -> Result<(), BreakerOpen> {
    b.try_acquire().map(|p| p.record(outcome, MS))
}

fn trip(b: &CircuitBreaker, failures: u32) {
    for _ in 0..failures {
        call(b, Outcome::Failure).expect("closed while tripping");
    }
    assert_eq!(b.state(), State::Open);
}

fn edge(b: &CircuitBreaker, from: State, to: State) -> u64 {
    b.snapshot().transitions.iter().find(|t| t.from == from && t.to == to).map_or(0, |t| t.count)
}

#[tokio::test(start_paused = true)]
async fn cb_1_hung_probe_reopens_after_half_open_wait() {
    let b = breaker(count(10), 4);
    trip(&b, 4);
    advance(15 * SEC).await;
    let hung = b.try_acquire().expect("first probe");
    assert!(hung.is_probe());
    assert_eq!(b.state(), State::HalfOpen);
    let p2 = b.try_acquire().unwrap();
    let p3 = b.try_acquire().unwrap();
    p2.record(Outcome::Success, MS);
    p3.record(Outcome::Success, MS);
    assert_eq!(call(&b, Outcome::Success), Err(BreakerOpen::new()), "all probe permits are out");
    // max_wait_in_half_open defaults to attempt timeout × 2 = 2 s.
    advance(2 * SEC - MS).await;
    assert_eq!(call(&b, Outcome::Success), Err(BreakerOpen::new()));
    assert_eq!(b.state(), State::HalfOpen);
    advance(MS).await;
    assert_eq!(call(&b, Outcome::Success), Err(BreakerOpen::new()));
    let snap = b.snapshot();
    assert_eq!(snap.state, State::Open);
    assert_eq!(snap.last_reason, Some(TransitionReason::HalfOpenTimeout));
    assert_eq!(snap.consecutive_opens, 2);
    // The hung probe finally answers: too late to decide anything.
    hung.record(Outcome::Success, 3 * SEC);
    assert_eq!(b.state(), State::Open);
    // Second open period is doubled: 30 s.
    advance(30 * SEC - MS).await;
    assert_eq!(call(&b, Outcome::Success), Err(BreakerOpen::new()));
    advance(MS).await;
    let probe = b.try_acquire().expect("new probes after the next open period");
    assert!(probe.is_probe());
    assert_eq!(b.snapshot().half_open_free, 2);
}

/// CB-8: a dependency called once every 2 s recovers while its breaker is open. Each
/// probe answers at once, so no probe is ever outstanding for long; the 2 s between probes
/// are time with no traffic, which the half-open wait (here 2 × 300 ms) must not count.
#[tokio::test(start_paused = true)]
async fn cb_8_low_traffic_recovery_closes_the_breaker() {
    let b = CircuitBreaker::new(&settings(count(10), 4), 300 * MS);
    trip(&b, 4);
    advance(15 * SEC).await;
    for probe in 0..3 {
        let p = b.try_acquire().unwrap_or_else(|_| panic!("probe {probe} refused: {:?}", b.snapshot()));
        assert!(p.is_probe());
        p.record(Outcome::Success, 20 * MS);
        if probe < 2 {
            assert_eq!(b.state(), State::HalfOpen, "probe {probe}");
            advance(2 * SEC).await;
        }
    }
    let snap = b.snapshot();
    assert_eq!(snap.state, State::Closed, "{snap:?}");
    assert_eq!(snap.reasons.iter().find(|(r, _)| *r == TransitionReason::HalfOpenTimeout), None);
    assert_eq!(edge(&b, State::HalfOpen, State::Closed), 1);
}

/// The half-open wait (2 s here) times each probe from when it was sent, by cohorts: a
/// probe sent while another is out is timed from the moment that one answers.
#[tokio::test(start_paused = true)]
async fn half_open_wait_times_probes_that_are_out_never_idle_time() {
    let mut s = settings(count(10), 2);
    s.half_open_probes = 2;
    let b = CircuitBreaker::new(&s, ATTEMPT_TIMEOUT);
    let reopened_by_timeout = |b: &CircuitBreaker| {
        b.snapshot()
            .reasons
            .iter()
            .find(|(r, _)| *r == TransitionReason::HalfOpenTimeout)
            .map_or(0, |(_, n)| *n)
    };

    // An overlapping probe is not cut short by the earlier one's deadline.
    trip(&b, 2);
    advance(15 * SEC).await;
    let a = b.try_acquire().unwrap();
    advance(1800 * MS).await;
    let late = b.try_acquire().unwrap();
    advance(100 * MS).await;
    a.record(Outcome::Success, 1900 * MS);
    advance(1500 * MS).await; // 3.4 s after the first probe, 1.6 s after the second
    assert_eq!(call(&b, Outcome::Success), Err(BreakerOpen::new()), "both permits were taken");
    assert_eq!(b.state(), State::HalfOpen);
    late.record(Outcome::Success, 1700 * MS);
    assert_eq!(b.state(), State::Closed);

    // A probe that hangs while an earlier one answers is timed from that answer.
    trip(&b, 2);
    advance(15 * SEC).await;
    let a = b.try_acquire().unwrap();
    advance(500 * MS).await;
    let hung = b.try_acquire().unwrap();
    advance(100 * MS).await;
    a.record(Outcome::Success, 600 * MS);
    advance(2 * SEC - MS).await;
    assert_eq!(call(&b, Outcome::Success), Err(BreakerOpen::new()));
    assert_eq!(b.state(), State::HalfOpen, "2 s after the first probe answered");
    advance(MS).await;
    assert_eq!(call(&b, Outcome::Success), Err(BreakerOpen::new()));
    assert_eq!(b.state(), State::Open, "the hung probe counts as failed");
    assert_eq!(reopened_by_timeout(&b), 1);
    drop(hung);

    // A probe that answers after the wait counts as failed even when no call noticed it.
    advance(30 * SEC).await;
    let slow = b.try_acquire().unwrap();
    assert!(slow.is_probe());
    advance(2 * SEC).await;
    slow.record(Outcome::Success, 2 * SEC);
    assert_eq!(b.state(), State::Open);
    assert_eq!(reopened_by_timeout(&b), 2);

    // Cancelling the probe being timed hands the wait to the probe still out.
    advance(60 * SEC).await;
    let first = b.try_acquire().unwrap();
    advance(500 * MS).await;
    let second = b.try_acquire().unwrap();
    advance(100 * MS).await;
    drop(first);
    advance(2 * SEC - MS).await;
    assert_eq!(b.state(), State::HalfOpen);
    call(&b, Outcome::Success).expect("the cancelled probe's permit is free again");
    assert_eq!(b.state(), State::HalfOpen, "one success of two");
    advance(MS).await;
    assert_eq!(call(&b, Outcome::Success), Err(BreakerOpen::new()));
    assert_eq!(b.state(), State::Open, "the probe still out is overdue");
    assert_eq!(reopened_by_timeout(&b), 3);
    drop(second);
}

#[test]
fn cb_2_stampede_at_the_transition_lets_exactly_the_probes_through() {
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(4).enable_all().build().unwrap();
    rt.block_on(async {
        for round in 0..20 {
            let mut s = settings(count(10), 2);
            s.wait_in_open = Duration::ZERO; // the open period is over at once: every caller races the transition
            let b = Arc::new(CircuitBreaker::new(&s, ATTEMPT_TIMEOUT));
            trip(&b, 2);
            let start = Arc::new(tokio::sync::Barrier::new(50));
            let attempted = Arc::new(tokio::sync::Barrier::new(50));
            let tasks: Vec<_> = (0..50)
                .map(|_| {
                    let (b, start, attempted) = (b.clone(), start.clone(), attempted.clone());
                    tokio::spawn(async move {
                        start.wait().await;
                        let permit = b.try_acquire();
                        // Hold the probe until every caller has tried.
                        attempted.wait().await;
                        match permit {
                            Ok(p) => {
                                assert!(p.is_probe());
                                p.record(Outcome::Success, MS);
                                true
                            }
                            Err(_) => false,
                        }
                    })
                })
                .collect();
            let mut through = 0;
            for t in tasks {
                through += usize::from(t.await.unwrap());
            }
            assert_eq!(through, 3, "round {round}: exactly half_open_probes reach the dependency");
            assert_eq!(b.state(), State::Closed, "round {round}: all probes succeeded");
            assert_eq!(edge(&b, State::Open, State::HalfOpen), 1, "round {round}");
            assert_eq!(edge(&b, State::HalfOpen, State::Closed), 1, "round {round}");
        }
    });
}

#[tokio::test(start_paused = true)]
async fn cb_3_late_result_from_closed_generation_does_not_decide_half_open() {
    let mut s = settings(count(10), 4);
    s.half_open_probes = 1;
    let b = CircuitBreaker::new(&s, ATTEMPT_TIMEOUT);
    let slow_ok = b.try_acquire().unwrap();
    let slow_fail = b.try_acquire().unwrap();
    trip(&b, 4);
    advance(15 * SEC).await;
    let probe = b.try_acquire().unwrap();
    assert_eq!(b.state(), State::HalfOpen);
    assert!(probe.generation() > slow_ok.generation());
    // A failure from the CLOSED generation must not reopen...
    slow_fail.record(Outcome::Failure, 20 * SEC);
    assert_eq!(b.state(), State::HalfOpen);
    // ...and a success from it must not close.
    slow_ok.record(Outcome::Success, 20 * SEC);
    assert_eq!(b.state(), State::HalfOpen);
    assert_eq!(b.snapshot().window, WindowCounts::default(), "late results never reach the new window");
    probe.record(Outcome::Success, MS);
    assert_eq!(b.state(), State::Closed);
    assert_eq!(b.snapshot().last_reason, Some(TransitionReason::ProbesSucceeded));
}

#[tokio::test(start_paused = true)]
async fn cb_4_cancelled_probe_returns_its_permit_and_decides_nothing() {
    let mut s = settings(count(10), 2);
    s.half_open_probes = 1;
    let b = CircuitBreaker::new(&s, ATTEMPT_TIMEOUT);
    trip(&b, 2);
    advance(15 * SEC).await;
    let caller = async {
        let _probe = b.try_acquire().expect("probe");
        std::future::pending::<()>().await;
    };
    // The client goes away: the future is dropped while holding the probe.
    assert!(tokio::time::timeout(10 * MS, caller).await.is_err());
    let snap = b.snapshot();
    assert_eq!(snap.state, State::HalfOpen);
    assert_eq!(snap.half_open_free, 1, "the cancelled probe's permit is back");
    assert_eq!(edge(&b, State::HalfOpen, State::Open) + edge(&b, State::HalfOpen, State::Closed), 0);
    // Dropping a permit without recording works the same outside a future.
    drop(b.try_acquire().unwrap());
    assert_eq!(b.snapshot().half_open_free, 1);
    call(&b, Outcome::Success).expect("the freed permit is usable");
    assert_eq!(b.state(), State::Closed);
}

#[tokio::test(start_paused = true)]
async fn cb_6_count_window_edges_19_failures_do_not_trip_the_20th_does() {
    let b = breaker(count(100), 20);
    for _ in 0..19 {
        call(&b, Outcome::Failure).unwrap();
    }
    assert_eq!(b.state(), State::Closed, "19 calls are below minimum_calls");
    assert_eq!(b.snapshot().window, WindowCounts { calls: 19, failures: 19, slow: 0 });
    call(&b, Outcome::Failure).unwrap();
    assert_eq!(b.state(), State::Open);
    assert_eq!(b.snapshot().last_reason, Some(TransitionReason::FailureRate));
}

#[tokio::test(start_paused = true)]
async fn cb_6_time_window_forgets_failures_older_than_the_window() {
    // The window runs on the monotonic tokio clock; the wall clock is never read, so a
    // backward jump of the system time cannot change what it holds.
    let b = breaker(Window::Time { seconds: 10 }, 5);
    for _ in 0..4 {
        call(&b, Outcome::Failure).unwrap();
    }
    advance(10 * SEC - MS).await;
    assert_eq!(b.snapshot().window, WindowCounts { calls: 4, failures: 4, slow: 0 });
    advance(MS).await;
    assert_eq!(b.snapshot().window, WindowCounts::default(), "10 s old failures no longer count");
    call(&b, Outcome::Failure).unwrap();
    assert_eq!(b.state(), State::Closed, "only 1 call in the window");
    for _ in 0..3 {
        call(&b, Outcome::Failure).unwrap();
    }
    assert_eq!(b.state(), State::Closed);
    call(&b, Outcome::Failure).unwrap();
    assert_eq!(b.state(), State::Open);
}

#[tokio::test(start_paused = true)]
async fn cb_7_failures_arriving_while_open_do_not_push_the_open_period() {
    let b = breaker(count(10), 4);
    let in_flight: Vec<_> = (0..50).map(|_| b.try_acquire().unwrap()).collect();
    trip(&b, 4);
    let opened = Instant::now();
    advance(10 * SEC).await;
    for p in in_flight {
        p.record(Outcome::Failure, 10 * SEC);
    }
    for _ in 0..100 {
        assert_eq!(call(&b, Outcome::Failure), Err(BreakerOpen::new()));
    }
    advance(opened + 15 * SEC - Instant::now()).await;
    assert!(b.try_acquire().unwrap().is_probe(), "half-open exactly 15 s after opening");
    assert_eq!(edge(&b, State::Closed, State::Open), 1);
    assert_eq!(b.snapshot().consecutive_opens, 1);
}

#[tokio::test(start_paused = true)]
async fn open_period_doubles_per_consecutive_open_caps_and_resets_on_close() {
    let mut s = settings(count(10), 2);
    s.half_open_probes = 1;
    s.max_wait_in_open = 50 * SEC;
    let b = CircuitBreaker::new(&s, ATTEMPT_TIMEOUT);
    trip(&b, 2);
    for (n, period) in [(1, 15), (2, 30), (3, 50), (4, 50)] {
        assert_eq!(b.snapshot().consecutive_opens, n);
        advance(period * SEC - MS).await;
        assert!(b.try_acquire().is_err(), "open {n} lasts {period} s");
        advance(MS).await;
        b.try_acquire().unwrap().record(Outcome::Failure, MS);
        assert_eq!(b.state(), State::Open);
        assert_eq!(b.snapshot().last_reason, Some(TransitionReason::ProbeFailed));
    }
    advance(50 * SEC).await;
    call(&b, Outcome::Success).unwrap();
    let snap = b.snapshot();
    assert_eq!(snap.state, State::Closed);
    assert_eq!(snap.consecutive_opens, 0);
    assert_eq!(snap.window, WindowCounts::default(), "closes with an empty window");
    trip(&b, 2);
    advance(15 * SEC).await;
    assert!(b.try_acquire().is_ok(), "after a close the open period starts again at 15 s");
}

#[tokio::test(start_paused = true)]
async fn half_open_closes_only_when_every_probe_succeeded_and_a_slow_probe_reopens() {
    let mut s = settings(count(10), 2);
    s.slow_call_duration = Some(500 * MS);
    let b = CircuitBreaker::new(&s, ATTEMPT_TIMEOUT);
    trip(&b, 2);
    advance(15 * SEC).await;
    let probes: Vec<_> = (0..3).map(|_| b.try_acquire().unwrap()).collect();
    let mut probes = probes.into_iter();
    probes.next().unwrap().record(Outcome::Success, MS);
    probes.next().unwrap().record(Outcome::Success, MS);
    assert_eq!(b.state(), State::HalfOpen);
    probes.next().unwrap().record(Outcome::Success, 500 * MS);
    assert_eq!(b.state(), State::Open);
    assert_eq!(b.snapshot().last_reason, Some(TransitionReason::ProbeSlow));
}

#[tokio::test(start_paused = true)]
async fn slow_calls_trip_when_their_rate_reaches_the_threshold() {
    let mut s = settings(count(10), 4);
    s.slow_call_duration = Some(200 * MS);
    s.slow_call_rate_threshold = 0.5;
    let b = CircuitBreaker::new(&s, ATTEMPT_TIMEOUT);
    b.try_acquire().unwrap().record(Outcome::Success, 10 * MS);
    b.try_acquire().unwrap().record(Outcome::Success, 10 * MS);
    b.try_acquire().unwrap().record(Outcome::Success, 200 * MS);
    assert_eq!(b.state(), State::Closed);
    b.try_acquire().unwrap().record(Outcome::Success, 5 * SEC);
    let snap = b.snapshot();
    assert_eq!(snap.state, State::Open);
    assert_eq!(snap.last_reason, Some(TransitionReason::SlowCallRate));
    assert_eq!(snap.window, WindowCounts { calls: 4, failures: 0, slow: 2 });
}

#[tokio::test(start_paused = true)]
async fn below_threshold_failure_rate_never_trips_and_old_calls_roll_out() {
    let b = breaker(count(10), 10);
    for i in 0..1000 {
        let outcome = if i % 10 < 4 { Outcome::Failure } else { Outcome::Success };
        call(&b, outcome).unwrap();
    }
    let snap = b.snapshot();
    assert_eq!(snap.state, State::Closed);
    assert_eq!(snap.window, WindowCounts { calls: 10, failures: 4, slow: 0 });
    assert!((snap.failure_rate - 0.4).abs() < 1e-9);
}

#[tokio::test(start_paused = true)]
async fn overrides_force_states_and_expire_lazily() {
    let b = breaker(count(10), 2);
    b.set_override(Some(BreakerOverrideState::ForcedOpen), Some(Instant::now() + 60 * SEC));
    assert_eq!(call(&b, Outcome::Success), Err(BreakerOpen::new()));
    assert_eq!(b.state(), State::ForcedOpen);
    advance(60 * SEC).await;
    call(&b, Outcome::Success).expect("override expired");
    assert_eq!(b.state(), State::Closed);
    assert_eq!(b.snapshot().last_reason, Some(TransitionReason::OverrideExpired));

    b.set_override(Some(BreakerOverrideState::ForcedClosed), None);
    for _ in 0..10 {
        call(&b, Outcome::Failure).unwrap();
    }
    let snap = b.snapshot();
    assert_eq!(snap.state, State::ForcedClosed, "forced closed never trips");
    assert_eq!(snap.window.failures, 10, "but still records");

    b.set_override(Some(BreakerOverrideState::Disabled), None);
    call(&b, Outcome::Failure).unwrap();
    call(&b, Outcome::Success).unwrap();
    assert_eq!(
        b.snapshot().window,
        WindowCounts { calls: 10, failures: 10, slow: 0 },
        "disabled records nothing"
    );

    b.set_override(None, None);
    let snap = b.snapshot();
    assert_eq!(snap.state, State::Closed);
    assert_eq!(snap.last_reason, Some(TransitionReason::OverrideCleared));
    assert_eq!(edge(&b, State::Closed, State::ForcedOpen), 1);
    assert_eq!(edge(&b, State::ForcedOpen, State::Closed), 1);
    assert_eq!(edge(&b, State::ForcedClosed, State::Disabled), 1);
    assert_eq!(edge(&b, State::Disabled, State::Closed), 1);
    let reasons: Vec<_> = snap.reasons.iter().map(|(r, n)| (*r, *n)).collect();
    assert_eq!(
        reasons,
        vec![
            (TransitionReason::OverrideSet, 3),
            (TransitionReason::OverrideCleared, 1),
            (TransitionReason::OverrideExpired, 1)
        ]
    );
}

#[tokio::test(start_paused = true)]
async fn update_keeps_the_window_when_its_shape_is_unchanged_and_resets_it_when_changed() {
    let mut s = settings(count(10), 5);
    let b = CircuitBreaker::new(&s, ATTEMPT_TIMEOUT);
    for _ in 0..3 {
        call(&b, Outcome::Failure).unwrap();
    }
    s.failure_rate_threshold = 0.9;
    s.wait_in_open = 5 * SEC;
    b.update(&s);
    assert_eq!(b.snapshot().window.failures, 3, "same shape: window kept");
    s.window = count(20);
    b.update(&s);
    assert_eq!(b.snapshot().window, WindowCounts::default(), "new shape: window emptied");
    call(&b, Outcome::Failure).unwrap();
    s.window = Window::Time { seconds: 5 };
    b.update(&s);
    assert_eq!(b.snapshot().window, WindowCounts::default());
    call(&b, Outcome::Failure).unwrap();
    s.window = count(10);
    b.update(&s);
    assert_eq!(b.snapshot().window, WindowCounts::default(), "back to the original shape: emptied too");
    call(&b, Outcome::Failure).unwrap();
    assert_eq!(b.snapshot().window.failures, 1);
    s.window = count(20);
    b.update(&s);
    trip(&b, 5);
    s.minimum_calls = 100;
    b.update(&s);
    assert_eq!(b.state(), State::Open, "state survives an update");
    advance(5 * SEC).await;
    assert!(b.try_acquire().is_ok(), "new wait_in_open applies to the next open period");
    s.enabled = false;
    b.update(&s);
    assert!(b.try_acquire().is_ok());
}

#[test]
fn breaker_open_is_an_opaque_error_with_lowercase_display() {
    let e: Box<dyn std::error::Error + Send + Sync> = Box::new(BreakerOpen::new());
    assert_eq!(e.to_string(), "circuit breaker is open");
    assert!(e.downcast_ref::<BreakerOpen>().is_some());
}

#[test]
fn breaker_emits_state_gauge_and_transition_counters() {
    let recorder = metrics_exporter_prometheus::PrometheusBuilder::new().build_recorder();
    let handle = recorder.handle();
    let b = ::metrics::with_local_recorder(&recorder, || {
        CircuitBreaker::with_metrics(
            &settings(count(10), 2),
            ATTEMPT_TIMEOUT,
            crate::metrics_names::Labels::new("pricing", "quote"),
        )
    });
    let rt = tokio::runtime::Builder::new_current_thread().enable_time().start_paused(true).build().unwrap();
    // Transition counters are registered on a breaker's first transition of each kind, with
    // the recorder installed then (in a service: the global one).
    ::metrics::with_local_recorder(&recorder, || {
        rt.block_on(async {
            trip(&b, 2);
            assert!(b.try_acquire().is_err());
        })
    });
    let text = handle.render();
    assert!(text.contains(r#"levee_breaker_state{dependency="pricing",operation="quote"} 1"#), "{text}");
    assert!(
        text.contains(r#"levee_breaker_transitions_total{dependency="pricing",operation="quote",from="CLOSED",to="OPEN",reason="failure_rate"} 1"#),
        "{text}"
    );
    assert!(
        text.contains(r#"levee_breaker_rejected_total{dependency="pricing",operation="quote"} 1"#),
        "{text}"
    );
}

fn code_strategy() -> impl Strategy<Value = u8> {
    prop_oneof![Just(OK), Just(FAIL), Just(OK | SLOW), Just(FAIL | SLOW)]
}

fn naive(codes: impl Iterator<Item = u8>) -> WindowCounts {
    let mut c = WindowCounts::default();
    for code in codes {
        c.calls += 1;
        c.failures += u64::from(code & FAIL != 0);
        c.slow += u64::from(code & SLOW != 0);
    }
    c
}

proptest! {
    // A fixed seed: the same cases every run (the suite is deterministic); a failure found
    // once is kept in proptest-regressions/ and replayed first.
    #![proptest_config(proptest::test_runner::Config {
        rng_seed: proptest::test_runner::RngSeed::Fixed(0x006c_6576_6565),
        ..proptest::test_runner::Config::default()
    })]
    /// The breaker's own bookkeeping (including the "window full of successes" shortcut)
    /// always matches a naive model of the last N calls.
    #[test]
    fn breaker_count_window_always_equals_a_naive_model(
        size in 1u32..40,
        outcomes in prop::collection::vec((any::<bool>(), any::<bool>()), 0..400),
    ) {
        let rt = tokio::runtime::Builder::new_current_thread().enable_time().start_paused(true).build().unwrap();
        rt.block_on(async {
            let mut s = settings(count(size), 10_000); // never trips
            s.slow_call_duration = Some(100 * MS);
            let b = CircuitBreaker::new(&s, ATTEMPT_TIMEOUT);
            let mut model = VecDeque::new();
            for (fail, slow) in outcomes {
                let outcome = if fail { Outcome::Failure } else { Outcome::Success };
                b.try_acquire().unwrap().record(outcome, if slow { 100 * MS } else { MS });
                model.push_back(if fail { FAIL } else { OK } | if slow { SLOW } else { 0 });
                if model.len() > size as usize {
                    model.pop_front();
                }
                assert_eq!(b.snapshot().window, naive(model.iter().copied()));
            }
        });
    }

    /// `None` resets the window (as entering HALF_OPEN does); more than 32 resets exercise
    /// the wrap of the epoch tags.
    #[test]
    fn count_window_always_equals_a_naive_model(
        size in 1u32..40,
        ops in prop::collection::vec(prop_oneof![20 => code_strategy().prop_map(Some), 1 => Just(None)], 0..2000),
    ) {
        let w = CountWindow::new(size);
        let mut model = VecDeque::new();
        for op in ops {
            match op {
                Some(code) => {
                    w.record(code);
                    model.push_back(code);
                    if model.len() > size as usize {
                        model.pop_front();
                    }
                }
                None => {
                    w.reset();
                    model.clear();
                }
            }
            prop_assert_eq!(w.counts(), naive(model.iter().copied()));
        }
    }

    #[test]
    fn time_window_always_equals_a_naive_model(
        seconds in 1u32..20,
        ops in prop::collection::vec((0u64..4000, code_strategy()), 0..300),
    ) {
        let origin = Instant::now();
        let w = TimeWindow::new(seconds, origin);
        let mut model: Vec<(u64, u8)> = Vec::new();
        let mut now = origin;
        for (step_ms, code) in ops {
            now += Duration::from_millis(step_ms);
            let second = (now - origin).as_secs();
            w.record(code, now);
            model.push((second, code));
            let live = model.iter().filter(|(s, _)| s + u64::from(seconds) > second).map(|(_, c)| *c);
            prop_assert_eq!(w.counts(now), naive(live));
        }
    }
}

/// CB-2, CB-4 and CB-8 under every interleaving loom finds of the state and timer words (at
/// most 2 preemptions). Only this crate needs `--cfg loom`, so pass it with `cargo rustc`:
///
/// ```text
/// cargo rustc -p levee-agent --lib --profile test --message-format short -- --cfg loom
/// target/debug/deps/levee_agent-<hash> loom_model   # the binary cargo just built
/// ```
///
/// (`RUSTFLAGS="--cfg loom" cargo test -p levee-agent --lib loom_model` works too, but rebuilds
/// every dependency.)
#[cfg(loom)]
mod loom_model {
    use loom::sync::Arc;
    use loom::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    /// Every interleaving with at most 2 preemptions (loom's usual bound; unbounded, the
    /// 3-thread models take many minutes).
    fn model(f: impl Fn() + Sync + Send + 'static) {
        let mut builder = loom::model::Builder::new();
        builder.preemption_bound = Some(2);
        builder.check(f);
    }

    fn open_breaker(probes: u32) -> CircuitBreaker {
        let mut s = settings(count(1), 1);
        s.wait_in_open = Duration::ZERO; // the open period is over: callers race the transition
        s.half_open_probes = probes;
        let b = CircuitBreaker::new(&s, ATTEMPT_TIMEOUT);
        call(&b, Outcome::Failure).unwrap();
        assert_eq!(b.state(), State::Open);
        b
    }

    #[test]
    fn cb_2_loom_exactly_half_open_probes_and_all_succeeding_closes() {
        model(|| {
            let b = Arc::new(open_breaker(2));
            let probes = Arc::new(AtomicUsize::new(0));
            let threads: Vec<_> = (0..3)
                .map(|_| {
                    let (b, probes) = (b.clone(), probes.clone());
                    loom::thread::spawn(move || match b.try_acquire() {
                        Ok(p) => {
                            let probe = p.is_probe();
                            if probe {
                                probes.fetch_add(1, Ordering::SeqCst);
                            }
                            p.record(Outcome::Success, MS);
                            if probe { "probe" } else { "normal" }
                        }
                        Err(_) => "rejected",
                    })
                })
                .collect();
            let seen: Vec<_> = threads.into_iter().map(|t| t.join().unwrap()).collect();
            assert_eq!(probes.load(Ordering::SeqCst), 2, "{seen:?} {:?}", b.snapshot());
            assert_eq!(b.state(), State::Closed);
        });
    }

    #[test]
    fn cb_4_loom_cancelled_probe_frees_its_permit_and_never_decides() {
        model(|| {
            let b = Arc::new(open_breaker(1));
            let outstanding = Arc::new(AtomicUsize::new(0));
            let threads: Vec<_> = (0..3)
                .map(|i| {
                    let (b, outstanding) = (b.clone(), outstanding.clone());
                    loom::thread::spawn(move || {
                        if let Ok(p) = b.try_acquire() {
                            let probe = p.is_probe();
                            if probe {
                                // Never more probes out at once than the breaker allows.
                                assert_eq!(outstanding.fetch_add(1, Ordering::SeqCst), 0);
                            }
                            loom::thread::yield_now();
                            if probe {
                                outstanding.fetch_sub(1, Ordering::SeqCst); // still held until below
                            }
                            if i == 0 {
                                drop(p); // the client went away
                            } else {
                                p.record(Outcome::Success, MS);
                            }
                        }
                    })
                })
                .collect();
            for t in threads {
                t.join().unwrap();
            }
            let state = b.state();
            assert!(matches!(state, State::HalfOpen | State::Closed), "{state:?}");
            if state == State::HalfOpen {
                assert_eq!(b.snapshot().half_open_free, 1, "a cancelled probe's permit is back");
            }
        });
    }

    /// Probes answering, cancelled and taken at once hand the half-open wait from cohort
    /// to cohort: whatever the interleaving, once no probe is out nothing is being timed
    /// (CB-8), while probes are out the current cohort's deadline is published (CB-1), and
    /// a wait never ends early (the model runs in far less than the 2 s wait).
    #[test]
    fn cb_8_loom_the_half_open_wait_follows_the_probes_out() {
        model(|| {
            let b = Arc::new(open_breaker(3));
            let threads: Vec<_> = (0..3)
                .map(|i| {
                    let b = b.clone();
                    loom::thread::spawn(move || {
                        let p = b.try_acquire().expect("3 probe permits for 3 callers");
                        assert!(p.is_probe());
                        if i == 0 {
                            drop(p); // cancelled
                        } else {
                            p.record(Outcome::Success, MS);
                        }
                        let (out, current, published) = b.probe_counts();
                        assert!(current <= out, "{out} {current}");
                        assert!(out == 0 || current > 0, "probes out but none timed");
                        let _ = published; // may still be on its way from another thread
                    })
                })
                .collect();
            for t in threads {
                t.join().unwrap();
            }
            let (out, current, published) = b.probe_counts();
            assert_eq!((out, current), (0, 0), "no probe is out, none is timed");
            assert!(published, "the current generation's timer is in place");
            let snap = b.snapshot();
            assert_eq!(snap.state, State::HalfOpen, "2 of 3 probes at most succeeded: {snap:?}");
            assert!(
                snap.reasons.iter().all(|(r, _)| *r != TransitionReason::HalfOpenTimeout),
                "no wait ended early: {snap:?}"
            );
        });
    }
}

/// A service shows its breakers on its own status page: the snapshot serializes with the
/// names the status report and metrics use.
#[tokio::test(start_paused = true)]
async fn a_snapshot_serializes_for_a_status_page() {
    let b = breaker(count(10), 3);
    trip(&b, 3);
    let v = serde_json::to_value(b.snapshot()).unwrap();
    assert_eq!(v["state"], "OPEN");
    assert_eq!(v["window"]["failures"], 3);
    assert_eq!(v["last_reason"], "failure_rate");
    assert_eq!(v["transitions"][0]["from"], "CLOSED");
    assert_eq!(v["reasons"][0][0], "failure_rate");
}

use std::time::Duration;

use http::{HeaderMap, HeaderValue};
use tokio::time::{Instant, advance};

use super::*;
use crate::policy::{Criticality, DependencyCriticality};

const MS: Duration = Duration::from_millis(1);

#[test]
fn grpc_timeout_parses_every_unit() {
    let cases: &[(&str, Duration)] = &[
        ("1H", Duration::from_secs(3600)),
        ("2M", Duration::from_secs(120)),
        ("3S", Duration::from_secs(3)),
        ("250m", Duration::from_millis(250)),
        ("99999999u", Duration::from_micros(99_999_999)),
        ("7n", Duration::from_nanos(7)),
        ("99999999H", Duration::from_secs(99_999_999 * 3600)),
        ("0m", Duration::ZERO),
    ];
    for (text, want) in cases {
        assert_eq!(parse_grpc_timeout(text.as_bytes()), Some(*want), "{text}");
    }
}

#[test]
fn grpc_timeout_rejects_malformed_values_without_panicking() {
    for bad in ["", "m", "100", "100x", "-5m", "+5m", " 5m", "5 m", "123456789m", "1.5S", "٣m", "5mm"] {
        assert_eq!(parse_grpc_timeout(bad.as_bytes()), None, "{bad:?}");
    }
    assert_eq!(parse_grpc_timeout(&[0xff, b'm']), None);
}

#[test]
fn deadline_ms_header_parses_digits_only() {
    assert_eq!(parse_deadline_ms(b"250"), Some(Duration::from_millis(250)));
    assert_eq!(parse_deadline_ms(b"0"), Some(Duration::ZERO));
    for bad in ["", "-1", "1.5", "abc", " 10", "1234567890123456789", "1e3"] {
        assert_eq!(parse_deadline_ms(bad.as_bytes()), None, "{bad:?}");
    }
}

fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
    let mut h = HeaderMap::new();
    for (k, v) in pairs {
        h.insert(*k, HeaderValue::from_static(v));
    }
    h
}

#[tokio::test(start_paused = true)]
async fn inbound_deadline_prefers_grpc_then_ms_then_default_and_clamps() {
    let max = Duration::from_secs(5);
    let default = Duration::from_secs(1);
    let check = |h: HeaderMap, want: Duration| {
        let d = inbound_deadline(&h, max, default);
        assert_eq!(d.instant() - Instant::now(), want, "{h:?}");
    };
    check(headers(&[]), default);
    check(headers(&[("grpc-timeout", "300m")]), 300 * MS);
    check(headers(&[("levee-deadline-ms", "200")]), 200 * MS);
    check(headers(&[("grpc-timeout", "300m"), ("levee-deadline-ms", "200")]), 300 * MS);
    // Malformed gRPC value: ignored, the HTTP header is used.
    check(headers(&[("grpc-timeout", "lots"), ("levee-deadline-ms", "200")]), 200 * MS);
    // Huge values are capped, zero is raised to the minimum, garbage means default.
    check(headers(&[("grpc-timeout", "99999999H")]), max);
    check(headers(&[("levee-deadline-ms", "999999999999999999")]), max);
    check(headers(&[("levee-deadline-ms", "0")]), MIN_INBOUND_BUDGET);
    check(headers(&[("levee-deadline-ms", "-20")]), default);
    // The default itself is capped by the maximum.
    let d = inbound_deadline(&HeaderMap::new(), Duration::from_millis(100), default);
    assert_eq!(d.remaining(), Duration::from_millis(100));
}

#[tokio::test(start_paused = true)]
async fn propagation_sends_the_remaining_budget_truncated() {
    let d = Deadline::after(Duration::from_millis(1500));
    assert_eq!(d.to_header_ms(), "1500");
    assert_eq!(d.to_grpc_timeout(), "1500000u");
    advance(Duration::from_millis(1400)).await;
    assert_eq!(d.to_header_ms(), "100");
    assert_eq!(d.to_grpc_timeout(), "100000u");
    assert_eq!(parse_grpc_timeout(d.to_grpc_timeout().as_bytes()), Some(Duration::from_millis(100)));
    advance(Duration::from_millis(200)).await;
    assert!(d.is_expired());
    assert_eq!(d.to_header_ms(), "1");
    assert_eq!(d.to_grpc_timeout(), "1n");
    let long = Deadline::after(Duration::from_secs(3 * 86_400));
    assert_eq!(long.to_grpc_timeout(), "259200S");
    assert_eq!(super::header::format_grpc_timeout(Duration::from_nanos(99_999_999)), "99999999n");
    assert_eq!(super::header::format_grpc_timeout(Duration::from_nanos(100_000_001)), "100000u");
}

#[tokio::test(start_paused = true)]
async fn attempt_budget_is_the_minimum_of_timeout_remaining_minus_reserve_and_cap() {
    let reserve = 50 * MS;
    let cap = 80 * MS;
    let d = Deadline::after(1000 * MS);
    let crit = DependencyCriticality::Critical;
    let non = DependencyCriticality::NonCritical;
    assert_eq!(d.attempt_budget(300 * MS, reserve, crit, cap), Ok(300 * MS));
    assert_eq!(d.attempt_budget(300 * MS, reserve, non, cap), Ok(80 * MS));
    assert_eq!(d.attempt_budget(2000 * MS, reserve, crit, cap), Ok(950 * MS));
    advance(900 * MS).await;
    assert_eq!(d.attempt_budget(300 * MS, reserve, crit, cap), Ok(50 * MS));
    assert_eq!(d.attempt_budget(300 * MS, reserve, non, cap), Ok(50 * MS));
    advance(60 * MS).await;
    // 40 ms left is inside the reserve: fail at once.
    assert_eq!(d.attempt_budget(300 * MS, reserve, crit, cap), Err(DeadlineExceeded::new()));
    advance(100 * MS).await;
    assert_eq!(d.attempt_budget(300 * MS, Duration::ZERO, crit, cap), Err(DeadlineExceeded::new()));
    assert_eq!(DeadlineExceeded::new().to_string(), "deadline exceeded");
}

#[tokio::test(start_paused = true)]
async fn context_is_task_local_and_a_nested_deadline_never_extends_the_outer_one() {
    assert_eq!(current(), None);
    let outer = Deadline::after(100 * MS);
    let ctx = RequestContext {
        deadline: outer,
        from_caller: true,
        criticality: Criticality::Sheddable,
        inbound_retried: true,
    };
    with_context(ctx, async {
        assert_eq!(current(), Some(ctx));
        with_deadline(Deadline::after(500 * MS), async {
            let inner = current().unwrap();
            assert_eq!(inner.deadline, outer);
            assert_eq!(inner.criticality, Criticality::Sheddable);
            assert!(inner.inbound_retried);
        })
        .await;
        let shorter = Deadline::after(10 * MS);
        with_deadline(shorter, async { assert_eq!(current_deadline(), Some(shorter)) }).await;
    })
    .await;
    assert_eq!(current(), None);
    let d = Deadline::after(10 * MS);
    with_deadline(d, async { assert_eq!(current(), Some(RequestContext::new(d))) }).await;
}

#[test]
fn criticality_header_round_trips_sre_names() {
    for c in
        [Criticality::CriticalPlus, Criticality::Critical, Criticality::SheddablePlus, Criticality::Sheddable]
    {
        assert_eq!(parse_criticality(format_criticality(c).as_bytes()), Some(c));
    }
    assert_eq!(parse_criticality(b" sheddable_plus "), Some(Criticality::SheddablePlus));
    assert_eq!(parse_criticality(b"URGENT"), None);
    assert_eq!(parse_criticality(b""), None);
}

use levee_agent::proto::{HealthWindow, StatusReport};

use super::*;

fn window(kind: &str, name: &str, window_ms: u64, ok: u64, failed: u64) -> HealthWindow {
    let mut latency_buckets = vec![0; LATENCY_BUCKETS];
    latency_buckets[2] = ok + failed;
    HealthWindow {
        kind: kind.into(),
        name: name.into(),
        window_ms,
        calls: ok + failed,
        successes: ok,
        failures: failed,
        latency_buckets,
        ..HealthWindow::default()
    }
}

/// What an agent claims is bounded: unknown kinds dropped, names escaped, counts clamped
/// to the window's length, `calls` the sum of the outcomes, a latency list of the wrong
/// length ignored, at most MAX_HEALTH_WINDOWS windows.
#[test]
fn windows_are_bounded_escaped_and_clamped() {
    let mut r = StatusReport::default();
    r.health.push(window("dependency", "db\u{1b}[31m", 1_000, 5, 1));
    r.health.push(window("bogus", "x", 1_000, 1, 0));
    let mut huge = window("route", "GET /", 2_000, u64::MAX, 0);
    huge.calls = 1;
    huge.latency_buckets = vec![1, 2];
    r.health.push(huge);
    for i in 0..MAX_HEALTH_WINDOWS {
        r.health.push(window("dependency", &format!("d{i}"), 1_000, 1, 0));
    }
    let w = windows_of(&r);
    assert_eq!(w.len(), MAX_HEALTH_WINDOWS - 1, "the bogus one dropped, the rest cut at the cap");
    assert_eq!(w[0].kind, SubjectKind::Dependency);
    assert_eq!(w[0].name, "db\\u{1b}[31m");
    assert_eq!((w[0].counts.calls, w[0].counts.successes, w[0].counts.failures), (6, 5, 1));
    assert_eq!(w[1].kind, SubjectKind::Route);
    assert_eq!(w[1].counts.successes, 2 * MAX_CALLS_PER_SEC);
    assert_eq!(w[1].counts.calls, 2 * MAX_CALLS_PER_SEC, "calls follow the outcomes, not the claim");
    assert_eq!(w[1].counts.latency_buckets, vec![0; LATENCY_BUCKETS]);
}

#[test]
fn rates_and_quantiles_come_from_the_counts_and_buckets() {
    let mut t = HealthTotals::empty();
    assert_eq!((t.error_rate(), t.shed_rate(), t.p99_ms()), (0.0, 0.0, None));
    t.calls = 10;
    t.successes = 6;
    t.failures = 1;
    t.timeouts = 1;
    t.shed = 2;
    t.latency_buckets[0] = 98; // ≤ 1 ms
    t.latency_buckets[6] = 1; // ≤ 100 ms
    t.latency_buckets[LATENCY_BUCKETS - 1] = 1; // past 5 s
    assert_eq!(t.error_rate(), 0.25);
    assert_eq!(t.shed_rate(), 0.2);
    assert_eq!(t.p50_ms(), Some(1.0));
    assert_eq!(t.p99_ms(), Some(100.0));
    assert_eq!(t.quantile_ms(1.0), Some(5_000.0), "past the last bound: the last bound");
}

fn row(replica: &str, rev: u64, slot: i64, kind: &str, name: &str, calls: u64, instances: u64) -> HealthRow {
    let kind = (!kind.is_empty()).then(|| SubjectKind::parse(kind).unwrap());
    HealthRow {
        replica: replica.into(),
        environment: "prod".into(),
        service: "checkout".into(),
        revision: rev,
        slot_ms: slot,
        kind,
        name: name.into(),
        calls,
        successes: calls,
        failures: 0,
        timeouts: 0,
        fallbacks: 0,
        shed: 0,
        breaker_opens: 0,
        latency: vec![0; LATENCY_BUCKETS],
        instances,
        not_ready: 0,
    }
}

/// Counts add up over slots and replicas; instances are the most in one slot, summed over
/// the replicas of that slot; the filter picks subjects.
#[test]
fn rows_sum_per_revision() {
    let rows = vec![
        row("a", 1, 0, "", "", 0, 3),
        row("b", 1, 0, "", "", 0, 2),
        row("a", 1, 10_000, "", "", 0, 4),
        row("a", 1, 0, "dependency", "db", 10, 0),
        row("b", 1, 0, "dependency", "db", 5, 0),
        row("a", 1, 10_000, "dependency", "db", 7, 0),
        row("a", 1, 10_000, "route", "GET /", 100, 0),
        row("a", 2, 10_000, "", "", 0, 1),
        row("a", 2, 10_000, "dependency", "db", 1, 0),
    ];
    let all = sum_by_revision(&rows, &SubjectFilter::All);
    assert_eq!((all[&1].calls, all[&1].instances), (122, 5));
    assert_eq!((all[&2].calls, all[&2].instances), (1, 1));
    let db = sum_by_revision(&rows, &SubjectFilter::One(SubjectKind::Dependency, "db".into()));
    assert_eq!(db[&1].calls, 22);
    let routes = sum_by_revision(&rows, &SubjectFilter::Kind(SubjectKind::Route));
    assert_eq!((routes[&1].calls, routes[&2].calls), (100, 0));
}

#[test]
fn slots_start_on_multiples_of_their_length() {
    assert_eq!(slot_of(0), 0);
    assert_eq!(slot_of(9_999), 0);
    assert_eq!(slot_of(10_000), 10_000);
    assert_eq!(slot_of(1_764_590_412_345), 1_764_590_410_000);
}

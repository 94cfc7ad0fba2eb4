use std::time::Duration;

use tokio::time::advance;

use super::*;
use crate::policy::FallbackLevel;

const SEC: Duration = Duration::from_secs(1);

#[test]
fn chain_walks_down_failing_and_panicking_levels() {
    let chain = FallbackChain::from_level(FallbackLevel::Stale);
    assert_eq!(chain.levels(), [FallbackLevel::Stale, FallbackLevel::Generic, FallbackLevel::EmptyMarked]);
    let mut tried = Vec::new();
    let got = chain.resolve(|level| {
        tried.push(level);
        match level {
            FallbackLevel::Stale => Err("no cached value"),
            FallbackLevel::Generic => panic!("generic provider bug"),
            _ => Ok("unavailable marker"),
        }
    });
    assert_eq!(got, Ok(Served { value: "unavailable marker", level: FallbackLevel::EmptyMarked }));
    assert_eq!(tried, [FallbackLevel::Stale, FallbackLevel::Generic, FallbackLevel::EmptyMarked]);
    let none = chain.resolve(|_| Err::<(), _>(()));
    assert_eq!(none, Err(FeatureUnavailable::default()));
    assert_eq!(FeatureUnavailable::default().to_string(), "feature unavailable");
    let generic_first = FallbackChain::from_level(FallbackLevel::Generic);
    assert_eq!(generic_first.levels(), [FallbackLevel::Generic, FallbackLevel::EmptyMarked]);
    assert_eq!(FallbackChain::from_level(FallbackLevel::FeatureError).levels(), []);
    let picked = FallbackChain::new(&[
        FallbackLevel::EmptyMarked,
        FallbackLevel::Fresh,
        FallbackLevel::Stale,
        FallbackLevel::Stale,
    ]);
    assert_eq!(picked.levels(), [FallbackLevel::Stale, FallbackLevel::EmptyMarked]);
}

#[tokio::test(start_paused = true)]
async fn async_chain_runs_primary_then_degrades_with_a_time_limit_per_level() {
    let chain = FallbackChain::from_level(FallbackLevel::Stale);
    let fresh = chain.run(async { Ok::<_, ()>(1) }, SEC, |_| async { Ok::<_, ()>(0) }).await;
    assert_eq!(fresh, Ok(Served::fresh(1)));
    assert!(!fresh.unwrap().is_degraded());
    let degraded = chain
        .run(async { Err::<u32, _>("primary down") }, 50 * Duration::from_millis(1), |level| async move {
            match level {
                FallbackLevel::Stale => {
                    std::future::pending::<()>().await; // a hung fallback
                    Ok(1)
                }
                FallbackLevel::Generic => panic!("boom"),
                _ => Ok::<u32, ()>(3),
            }
        })
        .await
        .unwrap();
    assert_eq!(degraded, Served { value: 3, level: FallbackLevel::EmptyMarked });
    assert!(degraded.is_degraded());
    assert_eq!(degraded.map(|v| v * 2).value, 6);
}

#[tokio::test(start_paused = true)]
async fn stale_cache_serves_within_max_staleness_only() {
    let cache = StaleCache::new(16, 10 * SEC);
    assert_eq!(cache.get_if_error(&"k"), None);
    cache.put("k", 1);
    advance(10 * SEC).await;
    let stale = cache.get_if_error(&"k").unwrap();
    assert_eq!((stale.value, stale.age), (1, 10 * SEC));
    advance(Duration::from_millis(1)).await;
    assert_eq!(cache.get_if_error(&"k"), None, "older than max staleness");
    cache.put("k", 2);
    assert_eq!(cache.get_if_error(&"k").unwrap().value, 2, "replaced, not duplicated");
    assert_eq!(cache.len(), 1);
    cache.set_max_staleness(SEC);
    advance(2 * SEC).await;
    assert_eq!(cache.get_if_error(&"k"), None);
}

#[tokio::test(start_paused = true)]
async fn stale_cache_is_bounded_and_evicts_the_oldest_of_a_set() {
    let cache = StaleCache::new(8, 3600 * SEC);
    assert_eq!(cache.capacity(), 8);
    for i in 0..1000u32 {
        cache.put(i, i);
        advance(Duration::from_millis(1)).await;
    }
    assert_eq!(cache.len(), 8);
    assert_eq!(
        cache.get_if_error(&999),
        Some(Stale {
            value: 999,
            age: Duration::from_millis(1),
            stored_at: cache.get_if_error(&999).unwrap().stored_at
        })
    );
    let kept = (0..1000u32).filter(|i| cache.get_if_error(i).is_some()).count();
    assert_eq!(kept, 8);
}

#[tokio::test(start_paused = true)]
async fn feature_tracker_records_degraded_since_per_feature() {
    let tracker = FeatureTracker::new(2);
    let recs = tracker.feature("recommendations");
    let prices = tracker.feature("prices");
    recs.record(FallbackLevel::Fresh);
    advance(SEC).await;
    recs.record(FallbackLevel::Stale);
    advance(5 * SEC).await;
    recs.record(FallbackLevel::Generic); // still the same degraded period
    prices.record(FallbackLevel::Fresh);
    let report = tracker.report();
    assert_eq!(report.len(), 2);
    assert_eq!(report[0].feature, "prices");
    assert_eq!(
        (report[0].level, report[0].degraded_since, report[0].degraded_for),
        (FallbackLevel::Fresh, None, Duration::ZERO)
    );
    assert_eq!(report[1].feature, "recommendations");
    assert_eq!(report[1].level, FallbackLevel::Generic);
    assert!(report[1].degraded_since.is_some());
    assert_eq!(report[1].degraded_for, 5 * SEC);
    recs.record(FallbackLevel::Fresh);
    assert_eq!(tracker.report()[1].degraded_since, None);
    // Past the cap, new names share the overflow entry instead of growing the table.
    tracker.feature("third").record(FallbackLevel::FeatureError);
    tracker.feature("fourth").record(FallbackLevel::FeatureError);
    let names: Vec<_> = tracker.report().into_iter().map(|s| s.feature).collect();
    assert_eq!(names, [OVERFLOW_FEATURE, "prices", "recommendations"]);
}

#[test]
fn feature_tracker_signals_level_changes_only() {
    let changes = std::sync::Arc::new(crate::applied::StatusChanges::default());
    let tracker = FeatureTracker::new(4).reporting_to(changes.clone());
    let recs = tracker.feature("recommendations");
    recs.record(FallbackLevel::Fresh);
    assert_eq!(changes.generation(), 0, "fresh as before: nothing to report");
    recs.record(FallbackLevel::Stale);
    assert_eq!(changes.generation(), 1, "degraded period started");
    recs.record(FallbackLevel::Stale);
    recs.record(FallbackLevel::Stale);
    assert_eq!(changes.generation(), 1, "still stale: no signal per call");
    recs.record(FallbackLevel::Generic);
    assert_eq!(changes.generation(), 2, "another fallback level");
    recs.record(FallbackLevel::Fresh);
    assert_eq!(changes.generation(), 3, "degraded period ended");
}

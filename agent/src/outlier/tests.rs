use std::time::Duration;

use tokio::time::advance;

use super::*;
use crate::policy;

const SEC: Duration = Duration::from_secs(1);

fn settings() -> policy::OutlierDetection {
    policy::OutlierDetection {
        consecutive_errors: 5,
        interval: 10 * SEC,
        base_ejection_time: 30 * SEC,
        max_ejection_percent: 50,
    }
}

fn fail(d: &OutlierDetector<&str>, i: usize, n: u32) {
    for _ in 0..n {
        d.record(i, false);
    }
}

#[tokio::test(start_paused = true)]
async fn five_consecutive_errors_eject_and_a_success_resets_the_count() {
    let d = OutlierDetector::new(&settings(), vec!["a", "b", "c", "d"]);
    fail(&d, 0, 4);
    d.record(0, true);
    fail(&d, 0, 4);
    assert!(!d.is_ejected(0), "the success reset the count");
    d.record(0, false);
    assert!(d.is_ejected(0));
    assert_eq!(d.ejected_count(), 1);
    let picks: Vec<_> = (0..6).map(|_| d.pick().unwrap().0).collect();
    assert!(!picks.contains(&0), "{picks:?}");
    assert_eq!(picks.iter().filter(|i| **i == 1).count(), 2, "round robin over the rest: {picks:?}");
}

#[tokio::test(start_paused = true)]
async fn never_ejects_more_than_max_percent_and_never_the_whole_pool() {
    let d = OutlierDetector::new(&settings(), vec!["a", "b", "c", "d"]);
    for i in 0..4 {
        fail(&d, i, 5);
    }
    assert_eq!(d.ejected_count(), 2, "50 % of 4");
    assert_eq!(d.status().iter().filter(|s| s.ejected).count(), 2);
    let single = OutlierDetector::new(&settings(), vec!["only"]);
    fail(&single, 0, 50);
    assert_eq!(single.ejected_count(), 0, "a pool of one is never emptied");
    assert_eq!(single.pick().unwrap(), (0, &"only"));
    let all = OutlierDetector::new(
        &policy::OutlierDetection { max_ejection_percent: 100, ..settings() },
        vec![1, 2, 3],
    );
    for i in 0..3 {
        for _ in 0..5 {
            all.record(i, false);
        }
    }
    assert_eq!(all.ejected_count(), 2, "100 % still leaves one endpoint");
    let small = OutlierDetector::new(
        &policy::OutlierDetection { max_ejection_percent: 10, ..settings() },
        vec![1, 2, 3],
    );
    for _ in 0..5 {
        small.record(0, false);
    }
    assert_eq!(small.ejected_count(), 1, "as Envoy: at least one host may be ejected");
    let none =
        OutlierDetector::new(&policy::OutlierDetection { max_ejection_percent: 0, ..settings() }, vec![1, 2]);
    for _ in 0..5 {
        none.record(0, false);
    }
    assert_eq!(none.ejected_count(), 0);
}

#[tokio::test(start_paused = true)]
async fn ejection_time_grows_with_ejections_and_ends_at_an_interval_sweep() {
    let d = OutlierDetector::new(&settings(), vec!["a", "b"]);
    fail(&d, 0, 5); // ejected at t=0 for 30 s
    advance(29 * SEC).await;
    d.pick();
    assert!(d.is_ejected(0));
    advance(SEC).await; // t=30: the sweep due at 30 s returns it
    d.pick();
    assert!(!d.is_ejected(0));
    fail(&d, 0, 5); // second ejection: 60 s
    assert_eq!(d.status()[0].times_ejected, 2);
    advance(50 * SEC).await; // t=80, sweep at 80: ejected until 90
    d.pick();
    assert!(d.is_ejected(0));
    advance(10 * SEC).await; // t=90
    d.pick();
    assert!(!d.is_ejected(0));
    // Healthy intervals shrink the multiplier again.
    advance(10 * SEC).await;
    d.pick();
    assert_eq!(d.status()[0].times_ejected, 1);
}

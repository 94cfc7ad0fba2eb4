use std::sync::Arc;
use std::time::Duration;

use proptest::prelude::*;
use tokio::time::Instant;

use super::*;
use crate::flags::tests::{apply, shared_with};
use crate::state::Shared;

#[test]
fn wall_clock_times_map_onto_the_monotonic_clock_at_the_same_distance() {
    let now = Instant::now();
    let wall = Timestamp::from_unix_ms(1_800_000_000_000);
    let at = |ms: i64| wall_to_monotonic(Timestamp::from_unix_ms(wall.unix_ms() + ms), wall, now);
    assert_eq!(at(0), Some(now));
    assert_eq!(at(90_000), Some(now + Duration::from_secs(90)));
    assert_eq!(at(-1_500), now.checked_sub(Duration::from_millis(1_500)));
    let far = at(i64::MAX / 2).expect("the far future is clamped, not lost");
    assert!(far > now + Duration::from_secs(10 * 365 * 24 * 3600));
}

#[test]
fn expiries_are_converted_once_when_applied() {
    let wall = Timestamp::now();
    let now = Instant::now();
    let in_ms = |ms: i64| Timestamp::from_unix_ms(wall.unix_ms() + ms).to_rfc3339();
    let body = format!(
        r#"{{"policy": {{"dependencies": {{"d": {{}}, "e": {{}}}}}},
            "flags": {{"f": {{"type": "bool", "value": true, "expires_at": "{f}"}}}},
            "breaker_overrides": [{{"dependency": "d", "state": "forced_open", "expires_at": "{o}", "reason": "drill"}},
                                  {{"dependency": "e", "state": "disabled", "reason": "until cleared"}}],
            "faults_allowed": true,
            "faults": [{{"id": "x", "dependency": "d", "action": {{"type": "abort", "status": 503}},
                         "percent": 100, "expires_at": "{x}"}}]}}"#,
        f = in_ms(60_000),
        o = in_ms(30_000),
        x = in_ms(-5_000),
    );
    let config = crate::policy::decode_config(body.as_bytes()).unwrap();
    let applied = Applied::new(config, 1, String::new(), Source::Live, None, now, wall);
    let secs = |s: u64| now + Duration::from_secs(s);
    assert_eq!(applied.flag_expiry("f"), Some(secs(60)));
    let overrides: Vec<_> = applied.breaker_overrides().map(|(_, at)| at).collect();
    assert_eq!(overrides, vec![Some(secs(30)), None]);
    let faults: Vec<_> = applied.fault_rules().map(|(_, at)| at).collect();
    assert_eq!(faults, vec![now.checked_sub(Duration::from_secs(5)).unwrap()]);
}

/// What the kill-switch rule says, computed here independently of the code under test.
fn expected_switch(value: bool, rollout: Option<f64>, declared: Option<bool>) -> bool {
    let default = declared.unwrap_or(true);
    match rollout {
        None => value,
        Some(p) if (p * 10_000.0).round() >= 1_000_000.0 => value,
        Some(_) => default,
    }
}

fn switch_config(key: &str, value: bool, rollout: Option<f64>) -> String {
    let mut flag = serde_json::json!({"type": "bool", "value": value});
    if let Some(p) = rollout {
        flag["rollout"] = serde_json::json!({"percent": p});
    }
    serde_json::json!({
        "policy": {
            "dependencies": {"d": {"enabled_flag": key, "fallback": "generic"}},
            "degradation_matrix": [{"feature": "f", "dependencies": ["d"], "on_failure": "generic",
                                    "enabled_flag": key}]
        },
        "flags": {key: flag}
    })
    .to_string()
}

fn rollouts() -> impl Strategy<Value = Option<f64>> {
    proptest::option::of(prop_oneof![
        Just(0.0),
        Just(50.0),
        Just(100.0),
        // Just below 100 %: rounds to every bucket or to all but one.
        99.9999f64..=100.0,
        0.0f64..=100.0,
    ])
}

proptest! {
    // A fixed seed: the same 200 cases every run (the suite is deterministic).
    #![proptest_config(ProptestConfig {
        cases: 200,
        rng_seed: proptest::test_runner::RngSeed::Fixed(0x006c_6576_6565),
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    /// A dependency, a feature and a bool flag handle bound to the same switch always give
    /// the same unkeyed answer, whatever the value, the rollout and the declared default —
    /// before and after a second snapshot, whichever handle is taken first.
    #[test]
    fn a_dependency_a_feature_and_a_flag_on_one_switch_always_agree(
        key in "[a-z][a-z0-9._-]{0,20}",
        first in (any::<bool>(), rollouts()),
        second in (any::<bool>(), rollouts()),
        declared in proptest::option::of(any::<bool>()),
        declare_first in any::<bool>(),
        callers in proptest::collection::vec("[a-z0-9-]{0,12}", 0..6),
    ) {
        let shared: Arc<Shared> = shared_with(&switch_config(&key, first.0, first.1));
        let declare = |s: &Shared| declared.map(|d| {
            let h = s.with_ctx(|ctx| s.flags.declare_bool(&key, d, ctx));
            s.refresh();
            h
        });
        let handle = if declare_first { declare(&shared) } else { None };
        let dep = shared.dependency_handle("d");
        let feature = shared.feature_handle("f");
        let handle = if declare_first { handle } else { declare(&shared) };
        for (revision, (value, rollout)) in [(1, first), (2, second)] {
            if revision == 2 {
                apply(&shared, 2, &switch_config(&key, value, rollout));
            }
            let want = expected_switch(value, rollout, declared);
            prop_assert_eq!(dep.is_enabled(), want, "dependency, revision {}", revision);
            prop_assert_eq!(feature.is_enabled(), want, "feature, revision {}", revision);
            if let Some(h) = &handle {
                prop_assert_eq!(h.get(), want, "flag handle, revision {}", revision);
                for caller in &callers {
                    // Keyed reads follow the rollout; with every key inside, they agree too.
                    let inside = rollout.is_none_or(|p| {
                        rollout_bucket(&key, caller) < (p * 10_000.0).round() as u64
                    });
                    prop_assert_eq!(h.get_for(caller), if inside { value } else { h.default_value() });
                    if rollout.is_none_or(|p| (p * 10_000.0).round() >= 1_000_000.0) {
                        prop_assert_eq!(h.get_for(caller), dep.is_enabled());
                    }
                }
            }
        }
    }
}

/// One rule for a dependency and a feature alike: a `false` switch under a partial
/// rollout is on for a dependency *and* a feature (unkeyed callers are outside the
/// rollout and get the default), off at 100 %; a declared default decides for both.
#[tokio::test(start_paused = true)]
async fn a_false_switch_under_a_partial_rollout_takes_the_default_everywhere() {
    let shared = shared_with(&switch_config("k", false, Some(50.0)));
    let (dep, feature) = (shared.dependency_handle("d"), shared.feature_handle("f"));
    assert!(dep.is_enabled() && feature.is_enabled(), "no declared default: on");
    let k = shared.with_ctx(|ctx| shared.flags.declare_bool("k", false, ctx));
    shared.refresh();
    assert!(!k.get() && !dep.is_enabled() && !feature.is_enabled(), "declared default false: off");
    apply(&shared, 2, &switch_config("k", false, Some(100.0)));
    assert!(!k.get() && !dep.is_enabled() && !feature.is_enabled());
}

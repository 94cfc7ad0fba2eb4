use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;

use super::*;
use crate::applied::{Applied, Source};
use crate::policy::{ServiceConfig, Timestamp, decode_config};
use crate::state::Shared;

pub(crate) fn shared_with(body: &str) -> Arc<Shared> {
    let shared = Arc::new(Shared::new(
        "prod".into(),
        "checkout".into(),
        Arc::new(ServiceConfig::default()),
        Applied::defaults(Arc::new(ServiceConfig::default()), Instant::now()),
        None,
        None,
    ));
    apply(&shared, 1, body);
    shared
}

pub(crate) fn apply(shared: &Shared, revision: u64, body: &str) {
    let config = decode_config(body.as_bytes()).unwrap();
    shared.install_live(Applied::new(
        config,
        revision,
        crate::policy::content_hash(body.as_bytes()),
        Source::Live,
        Some(Arc::from(body)),
        Instant::now(),
        Timestamp::now(),
    ));
}

fn declare_bool(shared: &Shared, key: &str, default: bool) -> FlagBool {
    let h = shared.with_ctx(|ctx| shared.flags.declare_bool(key, default, ctx));
    shared.refresh();
    h
}

/// Starts the timer task that re-resolves flags at expiries and stale deadlines.
pub(crate) fn timers(shared: &Arc<Shared>) -> watch::Sender<bool> {
    let (tx, rx) = watch::channel(false);
    tokio::spawn(crate::sync::run_housekeeping(shared.clone(), Duration::from_secs(3600), rx));
    tx
}

/// Moves the paused clock and lets woken tasks run.
pub(crate) async fn advance(d: Duration) {
    tokio::time::advance(d).await;
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
}

fn wall_in(d: Duration) -> String {
    Timestamp::from_unix_ms(Timestamp::now().unix_ms() + d.as_millis() as i64).to_rfc3339()
}

#[tokio::test(start_paused = true)]
async fn value_from_snapshot_else_compiled_default() {
    let shared = shared_with(r#"{"flags":{"a":{"type":"bool","value":false},"n":{"type":"int","value":7}}}"#);
    let a = declare_bool(&shared, "a", true);
    let b = declare_bool(&shared, "b", true);
    let n = shared.with_ctx(|ctx| shared.flags.declare_int("n", 1, ctx));
    let f = shared.with_ctx(|ctx| shared.flags.declare_float("x", 0.5, ctx));
    assert!(!a.get(), "server value false wins over default true");
    assert!(b.get(), "absent flag gives the default");
    assert_eq!(n.get(), 7);
    assert_eq!(f.get(), 0.5);
}

#[tokio::test(start_paused = true)]
async fn deleting_a_flag_reverts_every_type_to_its_default() {
    let shared = shared_with(
        r#"{"flags":{"b":{"type":"bool","value":false},"i":{"type":"int","value":-3},
            "f":{"type":"float","value":2.5},"s":{"type":"string","value":"red"},
            "j":{"type":"json","value":{"k":[1,2]}}}}"#,
    );
    let (b, i, f, s, j) = shared.with_ctx(|ctx| {
        (
            shared.flags.declare_bool("b", true, ctx),
            shared.flags.declare_int("i", 10, ctx),
            shared.flags.declare_float("f", 1.0, ctx),
            shared.flags.declare_string("s", "blue".into(), ctx),
            shared.flags.declare_json("j", serde_json::json!(null), ctx),
        )
    });
    assert_eq!((b.get(), i.get(), f.get()), (false, -3, 2.5));
    assert_eq!(s.get().as_str(), "red");
    assert_eq!(*j.get(), serde_json::json!({"k":[1,2]}));
    assert_eq!(j.get_as::<std::collections::BTreeMap<String, Vec<u8>>>().unwrap()["k"], vec![1, 2]);

    apply(&shared, 2, "{}");
    assert_eq!((b.get(), i.get(), f.get()), (true, 10, 1.0));
    assert_eq!(s.get().as_str(), "blue");
    assert_eq!(*j.get(), serde_json::Value::Null);
}

#[tokio::test(start_paused = true)]
async fn wrong_type_on_the_server_gives_the_default() {
    let shared = shared_with(r#"{"flags":{"a":{"type":"int","value":0},"s":{"type":"bool","value":true}}}"#);
    let a = declare_bool(&shared, "a", true);
    let s = shared.with_ctx(|ctx| shared.flags.declare_string("s", "dflt".into(), ctx));
    assert!(a.get());
    assert_eq!(s.get().as_str(), "dflt");
}

#[tokio::test(start_paused = true)]
async fn flag_expiry_timer_reverts_to_default_without_any_read_of_a_clock() {
    let body = format!(
        r#"{{"flags":{{"a":{{"type":"bool","value":false,"expires_at":"{}"}}}}}}"#,
        wall_in(Duration::from_secs(60))
    );
    let shared = shared_with(&body);
    let _timers = timers(&shared);
    let a = declare_bool(&shared, "a", true);
    assert!(!a.get());
    advance(Duration::from_secs(58)).await;
    assert!(!a.get(), "not expired after 58 s");
    advance(Duration::from_secs(3)).await;
    assert!(a.get(), "expired after 61 s: back to the compiled-in default");
}

#[tokio::test(start_paused = true)]
async fn flag_already_expired_when_applied_gives_the_default_at_once() {
    let body = r#"{"flags":{"a":{"type":"bool","value":false,"expires_at":"2001-01-01T00:00:00Z"}}}"#;
    let shared = shared_with(body);
    assert!(declare_bool(&shared, "a", true).get());
}

#[tokio::test(start_paused = true)]
async fn revert_after_reverts_when_not_confirmed_live_and_returns_on_confirmation() {
    let shared = shared_with(r#"{"flags":{"n":{"type":"int","value":50,"stale":{"revert_after":"60s"}}}}"#);
    let _timers = timers(&shared);
    let n = shared.with_ctx(|ctx| shared.flags.declare_int("n", 10, ctx));
    assert_eq!(n.get(), 50);
    advance(Duration::from_secs(40)).await;
    assert!(shared.confirm(1), "heartbeat names the applied revision");
    advance(Duration::from_secs(40)).await;
    assert_eq!(n.get(), 50, "80 s after apply but only 40 s after the last confirmation");
    advance(Duration::from_secs(21)).await;
    assert_eq!(n.get(), 10, "61 s without confirmation: reverted to the default");
    assert!(!shared.confirm(7), "a heartbeat naming another revision confirms nothing");
    assert_eq!(n.get(), 10);
    assert!(shared.confirm(1));
    assert_eq!(n.get(), 50, "confirmed live again: the server value is back");
}

#[tokio::test(start_paused = true)]
async fn hold_flags_never_revert() {
    let shared = shared_with(r#"{"flags":{"k":{"type":"bool","value":false,"stale":"hold"}}}"#);
    let _timers = timers(&shared);
    let k = declare_bool(&shared, "k", true);
    advance(Duration::from_secs(365 * 86400)).await;
    assert!(!k.get());
}

#[test]
fn rollout_bucket_is_a_fixed_function() {
    // Golden values: changing the hash would move users between rollout groups.
    assert_eq!(
        rollout_bucket("recommendations.enabled", "user-1"),
        rollout_bucket("recommendations.enabled", "user-1")
    );
    let golden: Vec<u64> = ["a", "b", "user-42"].iter().map(|k| rollout_bucket("flag", k)).collect();
    assert_eq!(golden, GOLDEN_BUCKETS.to_vec());
    assert_ne!(
        rollout_bucket("flag", "ab"),
        rollout_bucket("flaga", "b"),
        "key boundary is part of the hash"
    );
}

// Computed independently from the documented algorithm (FNV-1a 64 + SplitMix64 finalizer).
const GOLDEN_BUCKETS: [u64; 3] = [723_849, 180_567, 78_522];

#[tokio::test(start_paused = true)]
async fn rollout_is_stable_proportional_and_monotonic() {
    let body =
        |p: f64| format!(r#"{{"flags":{{"r":{{"type":"bool","value":true,"rollout":{{"percent":{p}}}}}}}}}"#);
    let shared = shared_with(&body(30.0));
    let r = declare_bool(&shared, "r", false);
    let keys: Vec<String> = (0..2000).map(|i| format!("user-{i}")).collect();
    let at30: Vec<bool> = keys.iter().map(|k| r.get_for(k)).collect();
    let n30 = at30.iter().filter(|b| **b).count();
    assert!((500..=700).contains(&n30), "about 30 % of 2000 keys, got {n30}");
    assert_eq!(keys.iter().map(|k| r.get_for(k)).collect::<Vec<_>>(), at30, "same key, same answer");
    assert!(!r.get(), "unkeyed callers are outside a partial rollout");

    apply(&shared, 2, &body(60.0));
    let at60: Vec<bool> = keys.iter().map(|k| r.get_for(k)).collect();
    let n60 = at60.iter().filter(|b| **b).count();
    assert!((1100..=1300).contains(&n60), "about 60 %, got {n60}");
    assert!(at30.iter().zip(&at60).all(|(a, b)| !a || *b), "raising the percentage only adds keys");

    apply(&shared, 3, &body(100.0));
    assert!(r.get() && keys.iter().all(|k| r.get_for(k)));
    apply(&shared, 4, &body(0.0));
    assert!(!r.get() && keys.iter().all(|k| !r.get_for(k)));
}

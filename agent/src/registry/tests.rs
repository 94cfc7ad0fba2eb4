use std::sync::Arc;

use tokio::time::Instant;

use super::*;
use crate::applied::{Applied, Source};
use crate::enforce::DepView;
use crate::policy::{ServiceConfig, Timestamp, decode_config};

/// Past the cap, names the policy does not configure share the overflow slot (each
/// counted), while a configured name still gets its own slot, so its kill switch holds.
#[test]
fn past_the_cap_only_unconfigured_names_share_the_overflow_slot_and_each_is_counted() {
    let recorder = metrics_exporter_prometheus::PrometheusBuilder::new().build_recorder();
    let rendered = recorder.handle();
    let body = r#"{"policy": {"dependencies": {"payments": {"enabled_flag": "payments.on"}}},
                   "flags": {"payments.on": {"type": "bool", "value": false}}}"#;
    let config = decode_config(body.as_bytes()).unwrap();
    let applied =
        Applied::new(config, 1, String::new(), Source::Live, None, Instant::now(), Timestamp::now());
    let defaults = ServiceConfig::default();
    let changes = Arc::default();
    let ctx = ResolveCtx {
        changes: &changes,
        applied: &applied,
        defaults: &defaults,
        declared: &(),
        now: Instant::now(),
        confirmed_at: None,
        instance_id: "",
    };
    let registry = Registry::<DepView>::with_cap(2, "prod", "checkout");
    metrics::with_local_recorder(&recorder, || {
        let (a, a_slot) = registry.slot("a", &ctx);
        registry.slot("b", &ctx);
        let (c, c_slot) = registry.slot("c", &ctx);
        let (d, d_slot) = registry.slot("d", &ctx);
        assert_eq!((&*a, &*c, &*d), ("a", "_overflow", "_overflow"));
        assert!(Arc::ptr_eq(&c_slot, &d_slot), "one shared overflow slot");
        assert!(Arc::ptr_eq(&registry.slot("a", &ctx).1, &a_slot), "a tracked name keeps its slot");
        let (p, p_slot) = registry.slot("payments", &ctx);
        assert_eq!(&*p, "payments", "a configured name is tracked past the cap");
        assert!(!p_slot.load().enabled, "and its kill switch holds");
    });
    let names: Vec<String> = registry.all().iter().map(|(n, _)| n.to_string()).collect();
    assert_eq!(names, ["a", "b", "_overflow", "payments"]);
    let line = rendered
        .render()
        .lines()
        .find(|l| l.starts_with(metrics_names::TRACKING_OVERFLOW_TOTAL))
        .map(str::to_string)
        .expect("overflow counted");
    assert!(line.contains(r#"kind="dependency""#) && line.contains(r#"service="checkout""#), "{line}");
    assert!(line.ends_with(" 2"), "two names overflowed: {line}");
}

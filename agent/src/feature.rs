//! Product features of the degradation matrix: serve each through its fallback chain,
//! honour the feature's kill switch, and record which level answered so the server can
//! alert on features living on fallbacks for too long.

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::applied::{ResolveCtx, StatusChanges};
use crate::fallback::{
    FallbackChain, FeatureHandle, FeatureTracker, FeatureUnavailable, OVERFLOW_FEATURE, Served,
};
use crate::policy::{self, FallbackLevel, MatrixRow, ServiceConfig};
use crate::registry::{Registry, Resolve, Slot};

/// Most features one agent tracks one by one; past it, a feature the degradation matrix
/// does not name shares an `_overflow` entry (no kill switch, FEATURE_ERROR on failure, as
/// any unknown feature), counted in `levee_tracking_overflow_total{kind="feature"}`.
pub const MAX_TRACKED_FEATURES: usize = 256;

/// A feature's row, resolved for the call path.
#[derive(Debug)]
pub(crate) struct FeatureView {
    enabled: bool,
    chain: FallbackChain,
    on_failure: FallbackLevel,
    fallback_timeout: Duration,
}

fn row<'c>(config: &'c ServiceConfig, name: &str) -> Option<&'c MatrixRow> {
    config.policy.degradation_matrix.iter().find(|r| r.feature == name)
}

impl Resolve for FeatureView {
    const KIND: &'static str = "feature";
    const CAP: usize = MAX_TRACKED_FEATURES;
    const OVERFLOW: &'static str = OVERFLOW_FEATURE;

    fn resolve(name: &Arc<str>, _: Option<&Self>, ctx: &ResolveCtx<'_>) -> (Self, Option<Instant>) {
        let config = &ctx.applied.config;
        let (row, policy): (Option<&MatrixRow>, &policy::Policy) = match row(config, name) {
            Some(r) => (Some(r), &config.policy),
            None => (row(ctx.defaults, name), &ctx.defaults.policy),
        };
        let on_failure = row.map(|r| r.on_failure).unwrap_or(FallbackLevel::FeatureError);
        // The fallback's own time limit: the smallest of the row's dependencies'.
        let fallback_timeout = row
            .and_then(|r| {
                r.dependencies
                    .iter()
                    .filter_map(|d| policy.dependencies.get(d))
                    .map(|d| d.fallback_timeout)
                    .min()
            })
            .unwrap_or(policy::defaults::FALLBACK_TIMEOUT);
        let (enabled, wake) = ctx.switch_on(row.and_then(|r| r.enabled_flag.as_deref()));
        (Self { enabled, chain: FallbackChain::from_level(on_failure), on_failure, fallback_timeout }, wake)
    }

    fn configured(name: &str, ctx: &ResolveCtx<'_>) -> bool {
        row(&ctx.applied.config, name).is_some() || row(ctx.defaults, name).is_some()
    }
}

/// Every feature handle of one agent: their slots, and how each has been served.
#[derive(Debug)]
pub(crate) struct FeatureRegistry {
    pub(crate) views: Registry<FeatureView>,
    pub(crate) tracker: FeatureTracker,
}

impl FeatureRegistry {
    /// `changes` is signalled when a feature's level changes (its degraded period starts
    /// or ends, or it moves to another fallback).
    pub(crate) fn new(environment: &str, service: &str, changes: Arc<StatusChanges>) -> Self {
        Self {
            views: Registry::new(environment, service),
            tracker: FeatureTracker::new(MAX_TRACKED_FEATURES).reporting_to(changes),
        }
    }

    /// The handle of feature `name` (see [`Registry::slot`]).
    pub(crate) fn handle(&self, name: &str, ctx: &ResolveCtx<'_>) -> Feature {
        let (name, slot) = self.views.slot(name, ctx);
        let tracked = self.tracker.feature(&name);
        Feature { name, slot, tracked }
    }

    /// Refreshes the features' degraded-seconds gauges and registers their series with a
    /// recorder installed since they were first seen (the agent's metrics tick, CB-9).
    pub(crate) fn publish_metrics(&self) {
        self.tracker.report();
    }

    /// The features' levels and degraded-since times, for the status report.
    pub(crate) fn contribute(&self, report: &mut crate::proto::StatusReport) {
        for s in self.tracker.report() {
            report.features.push(crate::proto::FeatureStatus {
                feature: s.feature,
                level: s.level.as_str().to_string(),
                degraded_since_ms: s.degraded_since.map(|t| t.unix_ms()).unwrap_or(0),
            });
        }
    }
}

/// A product feature (a row of the degradation matrix). Cheap to clone; get it once with
/// [`Agent::feature`](crate::Agent::feature).
#[derive(Clone)]
pub struct Feature {
    name: Arc<str>,
    slot: Slot<FeatureView>,
    tracked: FeatureHandle,
}

impl fmt::Debug for Feature {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Feature").field("name", &self.name).field("enabled", &self.is_enabled()).finish()
    }
}

impl Feature {
    /// The feature's name, as in the degradation matrix (`_overflow` past
    /// [`MAX_TRACKED_FEATURES`]).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Whether the feature's kill switch (the row's `enabled_flag`) lets the primary path
    /// run; `true` without one.
    pub fn is_enabled(&self) -> bool {
        self.slot.load().enabled
    }

    /// The first fallback level on failure (the row's `on_failure`; FEATURE_ERROR for a
    /// feature the matrix does not name).
    pub fn on_failure(&self) -> FallbackLevel {
        self.slot.load().on_failure
    }

    /// Records a result produced elsewhere (FRESH or a fallback level).
    pub fn record(&self, level: FallbackLevel) {
        self.tracked.record(level);
    }

    /// Serves the feature: `primary` (normally a [`Dependency`](crate::Dependency) call,
    /// already under its policy) unless the feature's kill switch is off; when it fails or
    /// is switched off, the fallback chain from the row's `on_failure` down — STALE →
    /// GENERIC → EMPTY_MARKED — asking `provide(level)` for each, each within the
    /// fallback's own time limit; a failing, slow or panicking level degrades to the next.
    /// The level that answered is recorded (metrics, and "degraded since" for the server).
    ///
    /// Returns the value and its level. `primary` is not polled while switched off.
    ///
    /// # Errors
    /// [`FeatureUnavailable`] (the FEATURE_ERROR level) when no level could answer: a clear
    /// error for this feature only.
    pub async fn serve<T, E, E2, P, F, Fut>(
        &self,
        primary: P,
        provide: F,
    ) -> Result<Served<T>, FeatureUnavailable>
    where
        P: Future<Output = Result<T, E>>,
        F: FnMut(FallbackLevel) -> Fut,
        Fut: Future<Output = Result<T, E2>>,
    {
        let view = self.slot.load_full();
        let result = if view.enabled {
            view.chain.run(primary, view.fallback_timeout, provide).await
        } else {
            view.chain.resolve_async(view.fallback_timeout, provide).await
        };
        match &result {
            Ok(d) => self.tracked.record(d.level),
            Err(_) => self.tracked.record(FallbackLevel::FeatureError),
        }
        result
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU32, Ordering};

    use super::*;
    use crate::flags::tests::{apply, shared_with};
    use crate::state::Shared;

    const BODY: &str = r#"{
      "policy": {"dependencies": {"recommendations": {"criticality": "non_critical", "fallback": "stale",
                                                      "fallback_timeout": "20ms"}},
                 "degradation_matrix": [{"feature": "Personal recommendations", "dependencies": ["recommendations"],
                                         "on_failure": "stale", "enabled_flag": "recs.feature"}]},
      "flags": {"recs.feature": {"type": "bool", "value": true}}
    }"#;

    fn feature(shared: &Shared) -> Feature {
        shared.with_ctx(|ctx| shared.features.handle("Personal recommendations", ctx))
    }

    #[tokio::test(start_paused = true)]
    async fn failing_levels_degrade_in_order_and_the_level_is_reported() {
        let shared = shared_with(BODY);
        let f = feature(&shared);
        // Primary fails; STALE has nothing; GENERIC answers.
        let mut asked = Vec::new();
        let d = f
            .serve(async { Err::<&str, _>("down") }, |level| {
                asked.push(level);
                async move {
                    match level {
                        FallbackLevel::Stale => Err("no cached value"),
                        _ => Ok("top sellers"),
                    }
                }
            })
            .await
            .unwrap();
        assert_eq!((d.value, d.level), ("top sellers", FallbackLevel::Generic));
        assert_eq!(asked, vec![FallbackLevel::Stale, FallbackLevel::Generic]);
        let mut report = crate::proto::StatusReport::default();
        shared.features.contribute(&mut report);
        assert_eq!(report.features[0].level, "GENERIC");
        assert!(report.features[0].degraded_since_ms > 0, "degraded since is reported");

        // Fresh again: the degraded period ends.
        let d = f
            .serve(async { Ok::<_, &str>("personal") }, |_| async { Err::<&str, &str>("unused") })
            .await
            .unwrap();
        assert_eq!(d.level, FallbackLevel::Fresh);
        let mut report = crate::proto::StatusReport::default();
        shared.features.contribute(&mut report);
        assert_eq!((report.features[0].level.as_str(), report.features[0].degraded_since_ms), ("FRESH", 0));
    }

    #[tokio::test(start_paused = true)]
    async fn kill_switch_forces_the_fallback_without_polling_the_primary() {
        let shared = shared_with(BODY);
        let f = feature(&shared);
        apply(&shared, 2, &BODY.replace(r#""value": true"#, r#""value": false"#));
        assert!(!f.is_enabled());
        let polled = AtomicU32::new(0);
        let primary = async {
            polled.fetch_add(1, Ordering::SeqCst);
            Ok::<_, &str>("personal")
        };
        let d = f.serve(primary, |_| async { Ok::<_, &str>("cached") }).await.unwrap();
        assert_eq!((d.value, d.level), ("cached", FallbackLevel::Stale));
        assert_eq!(polled.load(Ordering::SeqCst), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn slow_or_failing_fallbacks_end_in_feature_error_not_a_panic() {
        let shared = shared_with(BODY);
        let f = feature(&shared);
        let started = Instant::now();
        let r = f
            .serve(async { Err::<u32, _>("down") }, |level| async move {
                if level == FallbackLevel::Stale {
                    tokio::time::sleep(Duration::from_secs(5)).await;
                }
                Err::<u32, _>("nothing")
            })
            .await;
        assert!(r.is_err());
        assert_eq!(
            started.elapsed(),
            Duration::from_millis(20),
            "the slow STALE level was cut at its 20 ms limit"
        );
        let mut report = crate::proto::StatusReport::default();
        shared.features.contribute(&mut report);
        assert_eq!(report.features[0].level, "FEATURE_ERROR");
    }
}

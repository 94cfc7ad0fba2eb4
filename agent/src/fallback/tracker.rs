use std::collections::HashMap;
use std::sync::atomic::{AtomicI64, AtomicU8, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use arc_swap::ArcSwap;
use metrics::{Counter, Gauge, Label};
use tokio::time::Instant;

use crate::applied::StatusChanges;
use crate::metrics_names::{self as names, LABEL_FEATURE, LABEL_LEVEL, late};
use crate::policy::{FallbackLevel, Timestamp};

/// Name under which features past the tracker's capacity are counted together.
pub const OVERFLOW_FEATURE: &str = "_overflow";

#[derive(Debug)]
struct FeatureState {
    name: Arc<str>,
    level: AtomicU8,
    /// ms since the tracker's origin + 1 when degradation began; 0 = fresh.
    since_mono: AtomicU64,
    since_wall_ms: AtomicI64,
    /// Bound to the recorder late ([`late`]), as the gauge.
    results: [OnceLock<Counter>; 5],
    degraded_seconds: OnceLock<Gauge>,
}

impl FeatureState {
    fn results(&self, level: FallbackLevel) -> Option<&Counter> {
        late(&self.results[level as usize], || {
            metrics::counter!(
                names::FEATURE_RESULTS,
                vec![
                    Label::new(LABEL_FEATURE, self.name.to_string()),
                    Label::new(LABEL_LEVEL, level.as_str())
                ]
            )
        })
    }

    fn degraded_seconds(&self, seconds: f64) {
        let gauge = late(&self.degraded_seconds, || {
            metrics::gauge!(
                names::FEATURE_DEGRADED_SECONDS,
                vec![Label::new(LABEL_FEATURE, self.name.to_string())]
            )
        });
        if let Some(g) = gauge {
            g.set(seconds);
        }
    }
}

/// A feature's degradation, as reported to the server (which alerts on long fallback).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FeatureDegradation {
    /// The feature's name, as in the degradation matrix.
    pub feature: String,
    /// The level of its latest result (FRESH when not degraded).
    pub level: FallbackLevel,
    /// When it started living on fallbacks (wall clock, for people); `None` when fresh.
    pub degraded_since: Option<Timestamp>,
    /// How long it has been degraded (monotonic); zero when fresh.
    pub degraded_for: Duration,
}

/// Records each result of one feature; cheap to clone (an `Arc`).
#[derive(Clone, Debug)]
pub struct FeatureHandle {
    state: Arc<FeatureState>,
    origin: Instant,
    /// Signalled when the feature's level changes (the agent's status report shows it).
    changes: Option<Arc<StatusChanges>>,
}

impl FeatureHandle {
    /// Records that a result of the feature came from `level`: counts it in
    /// [`FEATURE_RESULTS`](crate::metrics_names::FEATURE_RESULTS) and starts or ends the
    /// "degraded since" period. A fresh result ends it; only the first degraded result of
    /// a period sets its start. Lock-free; reads the clock only when the period starts.
    pub fn record(&self, level: FallbackLevel) {
        let s = &*self.state;
        if let Some(c) = s.results(level) {
            c.increment(1);
        }
        // One load in the steady state; a level change is signalled to the sync client.
        if s.level.load(Ordering::Relaxed) != level as u8
            && s.level.swap(level as u8, Ordering::Relaxed) != level as u8
        {
            if let Some(changes) = &self.changes {
                changes.changed();
            }
        }
        if level == FallbackLevel::Fresh {
            if s.since_mono.load(Ordering::Relaxed) != 0 {
                s.since_mono.store(0, Ordering::Relaxed);
                s.degraded_seconds(0.0);
            }
            return;
        }
        if s.since_mono.load(Ordering::Relaxed) == 0 {
            let mono = u64::try_from(Instant::now().saturating_duration_since(self.origin).as_millis())
                .unwrap_or(0)
                + 1;
            if s.since_mono.compare_exchange(0, mono, Ordering::AcqRel, Ordering::Relaxed).is_ok() {
                s.since_wall_ms.store(Timestamp::now().unix_ms(), Ordering::Relaxed);
            }
        }
    }

    fn status(&self) -> FeatureDegradation {
        let s = &*self.state;
        let since = s.since_mono.load(Ordering::Relaxed);
        // Stored as its rank (`level as u8`).
        let level = FallbackLevel::ALL
            [usize::from(s.level.load(Ordering::Relaxed)).min(FallbackLevel::ALL.len() - 1)];
        let (degraded_since, degraded_for) = if since == 0 {
            (None, Duration::ZERO)
        } else {
            let now = u64::try_from(Instant::now().saturating_duration_since(self.origin).as_millis())
                .unwrap_or(0)
                + 1;
            (
                Some(Timestamp::from_unix_ms(s.since_wall_ms.load(Ordering::Relaxed))),
                Duration::from_millis(now.saturating_sub(since)),
            )
        };
        s.degraded_seconds(degraded_for.as_secs_f64());
        // Registers the series with a recorder installed since the feature was first seen.
        for l in FallbackLevel::ALL {
            s.results(l);
        }
        FeatureDegradation { feature: s.name.to_string(), level, degraded_since, degraded_for }
    }
}

/// Tracks, per product feature, the level of its latest result and since when it has been
/// degraded (monotonic for the duration, wall clock for reporting).
///
/// Bounded: at most `max_features` features; further names share one
/// [`OVERFLOW_FEATURE`] entry (explicit, visible in reports) instead of growing without
/// bound. Registering copies the name table (cold); recording is lock-free.
#[derive(Debug)]
pub struct FeatureTracker {
    features: ArcSwap<HashMap<Arc<str>, FeatureHandle>>,
    max_features: usize,
    origin: Instant,
    changes: Option<Arc<StatusChanges>>,
}

impl FeatureTracker {
    /// A tracker for at most `max_features` named features.
    pub fn new(max_features: usize) -> Self {
        Self {
            features: ArcSwap::from_pointee(HashMap::new()),
            max_features,
            origin: Instant::now(),
            changes: None,
        }
    }

    /// Signals `changes` whenever a tracked feature's level changes.
    pub(crate) fn reporting_to(mut self, changes: Arc<StatusChanges>) -> Self {
        self.changes = Some(changes);
        self
    }

    /// The handle of `feature`, registering it (and its metrics) on first use. Keep the
    /// handle; do not look it up per call.
    pub fn feature(&self, feature: &str) -> FeatureHandle {
        if let Some(h) = self.features.load().get(feature) {
            return h.clone();
        }
        let mut created = None;
        self.features.rcu(|map| {
            let mut map = HashMap::clone(map);
            let name: &str = if map.len() >= self.max_features && !map.contains_key(feature) {
                OVERFLOW_FEATURE
            } else {
                feature
            };
            let handle = map.entry(Arc::from(name)).or_insert_with(|| self.handle(name)).clone();
            created = Some(handle);
            map
        });
        created.expect("rcu runs its closure at least once")
    }

    fn handle(&self, name: &str) -> FeatureHandle {
        let state = Arc::new(FeatureState {
            name: Arc::from(name),
            level: AtomicU8::new(0),
            since_mono: AtomicU64::new(0),
            since_wall_ms: AtomicI64::new(0),
            results: Default::default(),
            degraded_seconds: OnceLock::new(),
        });
        if names::recorder_installed() {
            for l in FallbackLevel::ALL {
                state.results(l);
            }
            state.degraded_seconds(0.0);
        }
        FeatureHandle { state, origin: self.origin, changes: self.changes.clone() }
    }

    /// Every tracked feature's status, sorted by name; also refreshes the
    /// [`FEATURE_DEGRADED_SECONDS`](crate::metrics_names::FEATURE_DEGRADED_SECONDS) gauges.
    pub fn report(&self) -> Vec<FeatureDegradation> {
        let mut out: Vec<_> = self.features.load().values().map(FeatureHandle::status).collect();
        out.sort_by(|a, b| a.feature.cmp(&b.feature));
        out
    }
}

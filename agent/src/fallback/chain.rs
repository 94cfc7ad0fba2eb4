use std::fmt;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::time::Duration;

use futures::FutureExt;

use crate::policy::FallbackLevel;

/// A value and the fallback level that served it, as a fallback chain or
/// [`Feature::serve`](crate::feature::Feature::serve) returns it.
///
/// Degraded success is not success: callers report `level` (metrics separate ok /
/// degraded(level) / failed) and may show users that the answer is partial.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Served<T> {
    /// The primary path's answer, or the fallback's.
    pub value: T,
    /// Which level produced it: FRESH for the primary path.
    pub level: FallbackLevel,
}

impl<T> Served<T> {
    /// A fresh (primary path) result.
    pub const fn fresh(value: T) -> Self {
        Self { value, level: FallbackLevel::Fresh }
    }

    /// Whether a fallback produced it.
    pub fn is_degraded(&self) -> bool {
        self.level != FallbackLevel::Fresh
    }

    /// Maps the value, keeping the level.
    pub fn map<U>(self, f: impl FnOnce(T) -> U) -> Served<U> {
        Served { value: f(self.value), level: self.level }
    }
}

/// Reports that a feature could not be served at any level: the FEATURE_ERROR level, a
/// clear error for this feature only (never a 500 of the whole request).
///
/// Opaque, lowercase `Display` (tower style).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FeatureUnavailable(());

impl fmt::Display for FeatureUnavailable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("feature unavailable")
    }
}

impl std::error::Error for FeatureUnavailable {}

/// Walks the fallback levels of a feature, best first, until one produces a value.
///
/// The levels come from the degradation matrix (`on_failure`) or the dependency's
/// `fallback`: starting there, every worse level is tried in order (STALE → GENERIC →
/// EMPTY_MARKED), each through the caller's provider; a provider that fails, panics or —
/// in [`FallbackChain::resolve_async`] — exceeds the fallback's own time limit degrades to
/// the next level, never to a panic. FEATURE_ERROR ends the chain with
/// [`FeatureUnavailable`]. FRESH is the primary path and is never a fallback level.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FallbackChain {
    levels: Vec<FallbackLevel>,
}

const FALLBACKS: [FallbackLevel; 3] =
    [FallbackLevel::Stale, FallbackLevel::Generic, FallbackLevel::EmptyMarked];

impl FallbackChain {
    /// Every level from `first` down to FEATURE_ERROR (FRESH as `first` means STALE).
    pub fn from_level(first: FallbackLevel) -> Self {
        Self { levels: FALLBACKS.into_iter().filter(|l| *l >= first).collect() }
    }

    /// Exactly the given levels, sorted best first, without duplicates, FRESH and
    /// FEATURE_ERROR (which always ends the chain).
    pub fn new(levels: &[FallbackLevel]) -> Self {
        let mut levels: Vec<_> = levels.iter().copied().filter(|l| FALLBACKS.contains(l)).collect();
        levels.sort();
        levels.dedup();
        Self { levels }
    }

    /// The levels tried, in order (FEATURE_ERROR implied after them).
    pub fn levels(&self) -> &[FallbackLevel] {
        &self.levels
    }

    /// Tries each level with `provide(level)` until one returns `Ok`.
    ///
    /// # Errors
    /// [`FeatureUnavailable`] when every level failed or panicked.
    pub fn resolve<T, E>(
        &self,
        mut provide: impl FnMut(FallbackLevel) -> Result<T, E>,
    ) -> Result<Served<T>, FeatureUnavailable> {
        for &level in &self.levels {
            match std::panic::catch_unwind(AssertUnwindSafe(|| provide(level))) {
                Ok(Ok(value)) => return Ok(Served { value, level }),
                Ok(Err(_)) => tracing::debug!(level = level.as_str(), "fallback level failed"),
                Err(_) => tracing::warn!(level = level.as_str(), "fallback level panicked"),
            }
        }
        Err(FeatureUnavailable(()))
    }

    /// As [`FallbackChain::resolve`] for async providers, each limited to `limit`
    /// (the dependency's `fallback_timeout`): a fallback must be cheaper than the primary
    /// path.
    ///
    /// # Errors
    /// [`FeatureUnavailable`] when every level failed, panicked or timed out.
    pub async fn resolve_async<T, E, F, Fut>(
        &self,
        limit: Duration,
        mut provide: F,
    ) -> Result<Served<T>, FeatureUnavailable>
    where
        F: FnMut(FallbackLevel) -> Fut,
        Fut: Future<Output = Result<T, E>>,
    {
        for &level in &self.levels {
            let attempt = AssertUnwindSafe(provide(level)).catch_unwind();
            match tokio::time::timeout(limit, attempt).await {
                Ok(Ok(Ok(value))) => return Ok(Served { value, level }),
                Ok(Ok(Err(_))) => tracing::debug!(level = level.as_str(), "fallback level failed"),
                Ok(Err(_)) => tracing::warn!(level = level.as_str(), "fallback level panicked"),
                Err(_) => tracing::debug!(level = level.as_str(), "fallback level timed out"),
            }
        }
        Err(FeatureUnavailable(()))
    }

    /// Runs the primary path and falls back when it fails: `Ok` → FRESH, `Err` → the
    /// chain (see [`FallbackChain::resolve_async`]).
    ///
    /// # Errors
    /// [`FeatureUnavailable`] when the primary path and every level failed.
    pub async fn run<T, E, E2, P, F, Fut>(
        &self,
        primary: P,
        limit: Duration,
        provide: F,
    ) -> Result<Served<T>, FeatureUnavailable>
    where
        P: Future<Output = Result<T, E>>,
        F: FnMut(FallbackLevel) -> Fut,
        Fut: Future<Output = Result<T, E2>>,
    {
        match primary.await {
            Ok(v) => Ok(Served::fresh(v)),
            Err(_) => self.resolve_async(limit, provide).await,
        }
    }
}

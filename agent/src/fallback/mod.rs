//! Degradation: a bounded stale-if-error cache (RFC 5861), the fallback chain that walks
//! down the levels FRESH → STALE → GENERIC → EMPTY_MARKED → FEATURE_ERROR, and a tracker
//! of how long each feature has been degraded (agent-semantics §6).

mod chain;
mod stale;
mod tracker;

pub use chain::{FallbackChain, FeatureUnavailable, Served};
pub use stale::{Stale, StaleCache};
pub use tracker::{FeatureDegradation, FeatureHandle, FeatureTracker, OVERFLOW_FEATURE};

#[cfg(test)]
mod tests;

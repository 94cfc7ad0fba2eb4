//! Per-endpoint outlier detection with Envoy semantics, and a round-robin picker that
//! skips ejected endpoints.

mod detector;

pub use detector::{EndpointStatus, OutlierDetector};

#[cfg(test)]
mod tests;

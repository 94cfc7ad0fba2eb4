//! Bulkheads: bounded concurrency with a bounded wait, resizable live, and a Little's-law
//! estimate of the right size (agent-semantics §4).

mod error;
mod little;
mod semaphore;

pub use error::{BulkheadError, BulkheadFull};
pub use little::LittleEstimate;
pub(crate) use semaphore::DetachedBulkheadPermit;
pub use semaphore::{Bulkhead, BulkheadPermit};

#[cfg(test)]
mod tests;

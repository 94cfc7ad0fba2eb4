//! Fault injection for game days: which fault, if any, an attempt gets (agent-semantics §8).

mod decide;

pub use decide::{FaultDecision, FaultInjector, decide};

#[cfg(test)]
mod tests;

use std::fmt;

use crate::policy::Criticality;

/// Why admission refused (or, in shadow mode, would have refused) a request (serialized
/// as [`Reason::as_str`] spells it).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Reason {
    /// At the concurrency limit with no queue (`queue.max_len` 0).
    Limit,
    /// At the limit and the queue was full of requests at least as critical.
    QueueFull,
    /// Waiting in the queue, pushed out by an arriving request of higher criticality.
    Displaced,
    /// Waited in the queue longer than CoDel allows (`codel_interval`, or `codel_target`
    /// while the queue is overloaded).
    QueueTimeout,
    /// The remaining deadline was shorter than the route's expected service time.
    Deadline,
    /// The operator lever `shed_sheddable_percent` picked it.
    Operator,
    /// Read-only mode is on and the route is marked `mutating`.
    ReadOnly,
    /// The operator flushed the queue (`queue.flush_generation` changed).
    Flushed,
}

impl Reason {
    /// Every reason, in a stable order (index = position).
    pub const ALL: [Reason; 8] = [
        Reason::Limit,
        Reason::QueueFull,
        Reason::Displaced,
        Reason::QueueTimeout,
        Reason::Deadline,
        Reason::Operator,
        Reason::ReadOnly,
        Reason::Flushed,
    ];

    /// Lower-case label (metrics, status reports): `limit`, `queue_full`, `displaced`,
    /// `queue_timeout`, `deadline`, `operator`, `read_only`, `flushed`.
    pub const fn as_str(self) -> &'static str {
        match self {
            Reason::Limit => "limit",
            Reason::QueueFull => "queue_full",
            Reason::Displaced => "displaced",
            Reason::QueueTimeout => "queue_timeout",
            Reason::Deadline => "deadline",
            Reason::Operator => "operator",
            Reason::ReadOnly => "read_only",
            Reason::Flushed => "flushed",
        }
    }

    pub(crate) const fn index(self) -> usize {
        self as usize
    }
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Position of a criticality in per-criticality arrays (0 = CRITICAL_PLUS).
pub(crate) const fn crit_index(c: Criticality) -> usize {
    match c {
        Criticality::CriticalPlus => 0,
        Criticality::Critical => 1,
        Criticality::SheddablePlus => 2,
        Criticality::Sheddable => 3,
    }
}

/// Every criticality, highest first (index = [`crit_index`]).
pub(crate) const CRITICALITIES: [Criticality; 4] =
    [Criticality::CriticalPlus, Criticality::Critical, Criticality::SheddablePlus, Criticality::Sheddable];

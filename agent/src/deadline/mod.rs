//! Request deadlines: an absolute monotonic [`Deadline`], the task-local request context
//! that carries it (with the request's [`Criticality`](crate::policy::Criticality)) to
//! outgoing calls, and the wire formats that propagate it as a remaining budget.
//!
//! Inbound, [`inbound_deadline`] turns a `grpc-timeout` or `levee-deadline-ms` header into
//! a [`Deadline`], capped by the service's maximum and defaulting to its default budget.
//! Outbound, [`Deadline::to_grpc_timeout`] and [`Deadline::to_header_ms`] send what is
//! *left* (never a wall-clock time: clocks differ between hosts), and
//! [`Deadline::attempt_budget`] sizes each attempt (agent-semantics §1).

mod budget;
mod context;
mod header;

pub use budget::{Deadline, DeadlineExceeded};
pub(crate) use context::caller_deadline;
pub use context::{RequestContext, current, current_deadline, scope, with_context, with_deadline};
pub(crate) use header::inbound_budget;
pub use header::{
    CRITICALITY_HEADER, DEADLINE_MS_HEADER, GRPC_TIMEOUT_HEADER, MIN_INBOUND_BUDGET, caller_budget,
    format_criticality, inbound_deadline, parse_criticality, parse_deadline_ms, parse_grpc_timeout,
};

#[cfg(test)]
mod tests;

//! Local enforcement of a dependency's policy around outgoing calls.
//!
//! [`Dependency`] is the handle (`agent.dependency("recommendations")`); its
//! [`call`](Dependency::call) wraps any future, [`call_or_fallback`](Dependency::call_or_fallback)
//! adds a fallback, and [`DependencyLayer`] does the same for any `tower::Service`. All three
//! go through `run.rs` (its `Run` future), the one place that decides the order of
//! enforcement.
//!
//! The hot path reads the dependency's resolved view with one lock-free `arc-swap` load
//! and takes no lock; the view is rewritten whenever a snapshot is applied or a flag
//! changes. `view.rs` resolves each dependency's view; `handle.rs` is the public
//! [`Dependency`] handle over it.

mod client;
mod error;
mod guards;
mod handle;
mod judgement;
#[cfg(feature = "reqwest-middleware")]
mod middleware;
mod run;
mod view;

#[cfg(test)]
mod stack_tests;
#[cfg(test)]
mod tests;

pub use client::{
    Attempt, AttemptBody, CallPolicy, DependencyLayer, DependencyService, ErrorPolicy, GrpcPolicy,
    HttpPolicy, Operation, OperationFrom, ReplayBody, ReplayRequest, ResponseFuture, propagate,
};
pub use error::{
    AttemptTimeout, CallError, DeadlineError, InjectedFault, KillSwitched, NotReplayable, Refusal, Refused,
};
#[cfg(feature = "reqwest-middleware")]
pub use middleware::LeveeMiddleware;
pub use run::idempotent_by_name;

pub use guards::{MAX_LABELLED_OPERATIONS, OTHER_OPERATION};
pub use handle::{Dependency, Endpoints, WithFallback};
pub use judgement::Judgement;
pub(crate) use view::{CallsAt, DepRegistry, DepView, Scope, ScopeAt};
pub use view::{MAX_TRACKED_DEPENDENCIES, OVERFLOW_DEPENDENCY};

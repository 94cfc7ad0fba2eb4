//! Levee agent: embed it in a service to receive its resilience policy and kill switches
//! from a Levee server and enforce them locally.
//!
//! ```no_run
//! # async fn example() -> Result<(), Box<dyn std::error::Error>> {
//! use std::time::Duration;
//! use levee_agent::Agent;
//!
//! let agent = Agent::builder("http://levee.internal:8081", "<agent token>", "prod", "checkout")
//!     .cache_dir("/var/cache/levee")
//!     .build()?; // returns at once: cache or defaults, never waits for the server
//! let recommendations_on = agent.flag_bool("recommendations.enabled", true);
//! let recommendations = agent.dependency("recommendations");
//! if recommendations_on.get() {
//!     let answer = recommendations
//!         .call("GET /recommendations/{user}", || async { Ok::<_, std::io::Error>(vec!["book"]) })
//!         .await;
//! }
//! # let _ = agent.wait_for_initial_sync(Duration::from_secs(2)).await;
//! # Ok(()) }
//! ```
//!
//! The crate holds the [`policy`] model shared with the server, the generated sync
//! protocol ([`proto`]), the [`Agent`] runtime (sync client, disk [`cache`], [`flags`]) and
//! local enforcement ([`enforce`]). Metric names are in [`metrics_names`].
//!
//! Invariants: enforcement never waits on the network; the hot path takes no lock
//! (`arc-swap` loads and atomics only); all time the agent measures is `tokio::time`
//! (monotonic, pausable in tests).

#![warn(missing_docs)]

pub mod admission;
mod agent;
mod applied;
pub mod breaker;
pub mod bulkhead;
pub mod cache;
pub mod deadline;
pub mod enforce;
mod failure;
pub mod fallback;
pub mod fault;
pub mod feature;
pub mod flags;
pub mod health;
pub mod inbound;
pub mod metrics_names;
pub mod ofrep;
#[cfg(feature = "openfeature")]
pub mod openfeature;
pub mod outlier;
pub mod policy;
mod registry;
pub mod report;
pub mod retry;
mod state;
pub mod sync;

pub use admission::{Admission, AdmissionLayer, AdmissionPermit, AdmissionRequest, AdmissionService};
pub use agent::{Agent, AgentBuilder, BuildError, InitialSyncTimeout, instance_name_of};
pub use applied::{Applied, Source};
pub use enforce::{
    AttemptTimeout, CallError, CallPolicy, DeadlineError, Dependency, DependencyLayer, DependencyService,
    Endpoints, ErrorPolicy, GrpcPolicy, HttpPolicy, InjectedFault, Judgement, KillSwitched, NotReplayable,
    Operation, Refusal, Refused, ReplayBody, ReplayRequest, WithFallback,
};
pub use flags::{FlagBool, FlagFloat, FlagInt, FlagJson, FlagString};
pub use inbound::{InboundContext, InboundContextLayer};
pub use state::{AgentStatus, LastNack, StatusContributor};
pub use sync::{SyncClientSettings, TOKEN_FILE_POLL};

/// The Rust blocks of `docs/agent-guide.md` and `docs/patterns.md`, compiled (and run,
/// unless marked otherwise) as doctests so the guides cannot drift from the API.
#[cfg(doctest)]
#[doc = include_str!("../../docs/agent-guide.md")]
#[doc = include_str!("../../docs/patterns.md")]
pub struct DocsAreDoctests;

/// A type-erased error, as tower middleware returns (`Box<dyn Error + Send + Sync>`).
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Generated types and stubs of the `levee.sync.v1` gRPC protocol.
#[allow(missing_docs, missing_debug_implementations, clippy::all)]
pub mod proto {
    tonic::include_proto!("levee.sync.v1");
}

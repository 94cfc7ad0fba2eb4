use std::fmt;
use std::time::Duration;

use tokio::time::Instant;

use crate::policy::DependencyCriticality;

/// Fails an operation whose request deadline has passed, or whose remaining budget is too
/// small to start an attempt (no network round trip is made).
///
/// Not retryable. Opaque on purpose (tower style): find it with `downcast_ref`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DeadlineExceeded(());

impl DeadlineExceeded {
    /// Builds the error.
    pub const fn new() -> Self {
        Self(())
    }
}

impl fmt::Display for DeadlineExceeded {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("deadline exceeded")
    }
}

impl std::error::Error for DeadlineExceeded {}

/// Tracks the instant by which a request must be answered.
///
/// Absolute and monotonic (`tokio::time::Instant`, so paused-time tests drive it). It is
/// only ever sent to another host as a *remaining* budget ([`Deadline::to_grpc_timeout`],
/// [`Deadline::to_header_ms`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Deadline(Instant);

impl Deadline {
    /// A deadline at `instant`.
    pub const fn at(instant: Instant) -> Self {
        Self(instant)
    }

    /// A deadline `budget` from now. A budget too large to represent is capped at about
    /// 30 years, which no caller reaches.
    pub fn after(budget: Duration) -> Self {
        let now = Instant::now();
        Self(now.checked_add(budget).unwrap_or_else(|| now + Duration::from_secs(30 * 365 * 86_400)))
    }

    /// The instant of the deadline.
    pub const fn instant(self) -> Instant {
        self.0
    }

    /// Time left, zero once passed.
    pub fn remaining(self) -> Duration {
        self.0.saturating_duration_since(Instant::now())
    }

    /// Whether the deadline has passed (remaining time is zero).
    pub fn is_expired(self) -> bool {
        Instant::now() >= self.0
    }

    /// The earlier of two deadlines.
    pub fn min(self, other: Deadline) -> Deadline {
        if other.0 < self.0 { other } else { self }
    }

    /// Time limit of one outgoing attempt (agent-semantics §1):
    /// `min(configured, remaining − reserve)`, and for a non-critical dependency also at most
    /// `non_critical_cap`.
    ///
    /// Inputs: `configured` is the dependency's attempt timeout; `reserve` is kept back so the
    /// service can still build a degraded answer; `non_critical_cap` applies only when
    /// `criticality` is [`DependencyCriticality::NonCritical`].
    ///
    /// # Errors
    /// [`DeadlineExceeded`] at once, without any round trip, when the deadline has passed or
    /// the remaining time does not exceed the reserve (the result would be a zero budget).
    pub fn attempt_budget(
        self,
        configured: Duration,
        reserve: Duration,
        criticality: DependencyCriticality,
        non_critical_cap: Duration,
    ) -> Result<Duration, DeadlineExceeded> {
        self.attempt_budget_at(Instant::now(), configured, reserve, criticality, non_critical_cap)
    }

    /// [`attempt_budget`](Self::attempt_budget) with the current time given by the caller
    /// (who has just read the clock and must not pay for reading it again).
    ///
    /// # Errors
    /// As [`attempt_budget`](Self::attempt_budget).
    pub fn attempt_budget_at(
        self,
        now: Instant,
        configured: Duration,
        reserve: Duration,
        criticality: DependencyCriticality,
        non_critical_cap: Duration,
    ) -> Result<Duration, DeadlineExceeded> {
        let usable = self.0.saturating_duration_since(now).saturating_sub(reserve);
        let mut budget = configured.min(usable);
        if criticality == DependencyCriticality::NonCritical {
            budget = budget.min(non_critical_cap);
        }
        if budget.is_zero() { Err(DeadlineExceeded::new()) } else { Ok(budget) }
    }

    /// The remaining budget as a `grpc-timeout` header value: at most 8 digits and a unit
    /// (`n`, `u`, `m`, `S`, `M`, `H`), in the finest unit that fits, truncated so the callee
    /// never gets more time than is left.
    ///
    /// An expired deadline gives `"1n"`: the callee sees an already-spent budget rather
    /// than no deadline at all.
    pub fn to_grpc_timeout(self) -> String {
        super::header::format_grpc_timeout(self.remaining())
    }

    /// The remaining budget in whole milliseconds for the `levee-deadline-ms` header,
    /// truncated, and never below 1 (a zero would read as "no deadline" to some peers).
    pub fn to_header_ms(self) -> String {
        let ms = self.remaining().as_millis().max(1);
        ms.to_string()
    }
}

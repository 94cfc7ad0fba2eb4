use std::time::Duration;

use super::Reason;
use crate::deadline::format_criticality;
use crate::policy::{AdmissionMode, Criticality, LimitAlgorithm};
use crate::proto::{Counter, StatusReport};

/// A count of rejections (or, in shadow mode, would-be rejections) of one criticality for
/// one reason.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub struct ShedCount {
    /// Criticality of the requests.
    pub criticality: Criticality,
    /// Why they were (would have been) shed.
    pub reason: Reason,
    /// How many since the engine started.
    pub count: u64,
}

/// What one route saw since the engine started.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct RouteStatus {
    /// The route (template, gRPC method path, `_unmatched` or `_overflow`).
    pub route: String,
    /// Requests rejected, by criticality and reason.
    pub shed: Vec<ShedCount>,
    /// Shadow mode: requests that would have been rejected, by criticality and reason
    /// ("would have shed N requests of criticality C on route R, reason X").
    pub would_shed: Vec<ShedCount>,
    /// Shadow mode: requests that would have waited in the queue.
    pub would_queue: u64,
    /// Expected service time learnt from measured requests (zero before the first), as
    /// admission uses it for deadlines; serialized as the policy spells a duration
    /// ([`policy::duration::format`](crate::policy::duration::format), `"12ms 500us"`).
    #[serde(with = "crate::policy::duration")]
    pub expected_service_time: Duration,
}

/// The state of an admission engine; see [`Admission::status`](super::Admission::status).
/// Serializes (serde) for a service's own status page: `{"mode": "enforce", "algorithm":
/// "aimd", "limit": 20, "in_flight": 3, …, "routes": [{"route": "GET /cart", "shed":
/// [{"criticality": "SHEDDABLE_PLUS", "reason": "queue_timeout", "count": 4}], …}]}`.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct AdmissionStatus {
    /// `enforce` or `shadow`.
    pub mode: AdmissionMode,
    /// The limit algorithm in force.
    pub algorithm: LimitAlgorithm,
    /// The concurrency limit now.
    pub limit: u32,
    /// Requests holding a slot now.
    pub in_flight: u32,
    /// Requests waiting in the queue now.
    pub queued: u32,
    /// Local overload: requests wait, and the queue has not been empty for a CoDel interval
    /// or dropped a waiter within the last one ([`CoDel`](super::CoDel)). Reported, never
    /// a reason to fail readiness (an orchestrator restarting an overloaded instance moves
    /// its load onto the others).
    pub overloaded: bool,
    /// Read-only mode is on.
    pub read_only: bool,
    /// Routes tracked (at most [`MAX_TRACKED_ROUTES`](super::MAX_TRACKED_ROUTES)).
    pub tracked_routes: usize,
    /// Requests of routes seen after the cap, counted under `_overflow`.
    pub route_overflow: u64,
    /// Per route, sorted by name; routes that saw nothing yet included.
    pub routes: Vec<RouteStatus>,
}

impl AdmissionStatus {
    /// The total of rejections of `reason` (all routes and criticalities); shadow-mode
    /// would-be rejections with `shadow`.
    pub fn shed_total(&self, reason: Reason, shadow: bool) -> u64 {
        self.routes
            .iter()
            .flat_map(|r| if shadow { &r.would_shed } else { &r.shed })
            .filter(|c| c.reason == reason)
            .map(|c| c.count)
            .sum()
    }

    /// Adds the engine's figures to the agent's periodic status report as counters:
    /// `admission_limit`, `admission_in_flight`, `admission_queued`,
    /// `admission_overloaded` (0/1), `admission_shadow` (0/1), `admission_route_overflow`,
    /// and per route, criticality and reason
    /// `admission_shed{route="…",criticality="…",reason="…"}` and
    /// `admission_would_shed{…}` (shadow mode).
    pub fn contribute(&self, report: &mut StatusReport) {
        let mut push = |name: String, value: u64| report.counters.push(Counter { name, value });
        push("admission_limit".into(), u64::from(self.limit));
        push("admission_in_flight".into(), u64::from(self.in_flight));
        push("admission_queued".into(), u64::from(self.queued));
        push("admission_overloaded".into(), u64::from(self.overloaded));
        push("admission_shadow".into(), u64::from(self.mode == AdmissionMode::Shadow));
        push("admission_route_overflow".into(), self.route_overflow);
        for r in &self.routes {
            for (kind, counts) in [("admission_shed", &r.shed), ("admission_would_shed", &r.would_shed)] {
                for c in counts {
                    push(
                        format!(
                            "{kind}{{route={:?},criticality=\"{}\",reason=\"{}\"}}",
                            r.route,
                            format_criticality(c.criticality),
                            c.reason
                        ),
                        c.count,
                    );
                }
            }
        }
    }
}

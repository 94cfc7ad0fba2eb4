use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use arc_swap::ArcSwap;

use crate::metrics_names::{self as names, LABEL_FAULT, Labels, LateCounter};
use crate::policy::{FaultAction, FaultRule, Timestamp};
use crate::retry::{ErrorKind, FastRng};

/// What to do to one attempt.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FaultDecision {
    /// Nothing: make the call normally.
    None,
    /// Wait this long, then make the call (inside the attempt timeout, so a delay longer
    /// than it surfaces as an attempt timeout).
    Delay(Duration),
    /// Fail the attempt with this HTTP status without calling.
    Abort(u16),
    /// Fail the attempt as a connection error without calling.
    ConnectionError,
}

impl FaultDecision {
    /// The error kind the attempt fails with, so retries and breakers react as they would
    /// to a real failure (`None` for no fault and for a delay).
    pub const fn error_kind(self) -> Option<ErrorKind> {
        match self {
            FaultDecision::Abort(status) => Some(ErrorKind::HttpStatus(status)),
            FaultDecision::ConnectionError => Some(ErrorKind::Connect),
            FaultDecision::None | FaultDecision::Delay(_) => None,
        }
    }
}

/// Decides the fault for one attempt of `operation` on `dependency`.
///
/// Inputs: the service's rules, whether the environment permits faults (`allowed`;
/// when false nothing ever fires), the wall-clock `now` (a rule whose `expires_at` is not
/// after `now` never fires), and a random source. Rules apply when their dependency
/// matches and their operation is unset or equal; each applicable rule fires with
/// probability `percent / 100`, tried in order; the first that fires decides.
pub fn decide(
    rules: &[FaultRule],
    dependency: &str,
    operation: &str,
    allowed: bool,
    now: Timestamp,
    rng: &FastRng,
) -> FaultDecision {
    if !allowed {
        return FaultDecision::None;
    }
    for rule in rules {
        if rule.dependency != dependency
            || rule.operation.as_deref().is_some_and(|op| op != operation)
            || rule.expires_at <= now
            || rule.percent.is_nan()
            || rule.percent <= 0.0
        {
            continue;
        }
        if rule.percent < 100.0 && rng.next_f64() * 100.0 >= rule.percent {
            continue;
        }
        return match rule.action {
            FaultAction::Delay { delay } => FaultDecision::Delay(delay),
            FaultAction::Abort { status } => FaultDecision::Abort(status),
            FaultAction::ConnectionError => FaultDecision::ConnectionError,
        };
    }
    FaultDecision::None
}

/// Holds the live fault rules of a service and decides faults for attempts.
///
/// Rules and permission are swapped atomically on config updates; deciding takes no lock
/// and allocates nothing (an `ArcSwap` load and a scan of the rules, at most 64).
#[derive(Debug)]
pub struct FaultInjector {
    rules: ArcSwap<Vec<FaultRule>>,
    allowed: AtomicBool,
    rng: FastRng,
    injected: [LateCounter; 3],
}

impl FaultInjector {
    /// An injector with no rules and faults not allowed. Metrics not registered.
    pub fn new() -> Self {
        Self {
            rules: ArcSwap::from_pointee(Vec::new()),
            allowed: AtomicBool::new(false),
            rng: FastRng::new(),
            injected: [LateCounter::noop(), LateCounter::noop(), LateCounter::noop()],
        }
    }

    /// As [`FaultInjector::new`], counting injected faults in
    /// [`FAULTS_INJECTED`](crate::metrics_names::FAULTS_INJECTED) with `labels` (one
    /// counter per kind of fault).
    pub fn with_metrics(labels: &Labels) -> Self {
        let c = |kind| LateCounter::with(labels, names::FAULTS_INJECTED, Some((LABEL_FAULT, kind)));
        Self { injected: [c("delay"), c("abort"), c("connection_error")], ..Self::new() }
    }

    /// Registers the injected-fault counters with a recorder installed since the injector
    /// was built (CB-9).
    pub(crate) fn publish_metrics(&self) {
        self.injected.iter().for_each(LateCounter::publish);
    }

    /// Replaces the rules and the environment's permission (from a new snapshot).
    pub fn update(&self, rules: Vec<FaultRule>, allowed: bool) {
        self.rules.store(Arc::new(rules));
        self.allowed.store(allowed, Ordering::Relaxed);
    }

    /// The fault for one attempt now (see [`decide`]).
    pub fn decide(&self, dependency: &str, operation: &str) -> FaultDecision {
        if !self.allowed.load(Ordering::Relaxed) {
            return FaultDecision::None;
        }
        let d = decide(&self.rules.load(), dependency, operation, true, Timestamp::now(), &self.rng);
        match d {
            FaultDecision::Delay(_) => self.injected[0].increment(1),
            FaultDecision::Abort(_) => self.injected[1].increment(1),
            FaultDecision::ConnectionError => self.injected[2].increment(1),
            FaultDecision::None => {}
        }
        d
    }
}

impl Default for FaultInjector {
    fn default() -> Self {
        Self::new()
    }
}

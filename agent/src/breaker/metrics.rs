use std::sync::OnceLock;

use metrics::{Counter, Gauge};

use super::{State, TransitionReason};
use crate::metrics_names::{self as names, LABEL_FROM, LABEL_REASON, LABEL_TO, Labels};

const EDGES: usize = State::ALL.len() * State::ALL.len();
const SLOTS: usize = EDGES * TransitionReason::ALL.len();

/// Pre-bound metric handles of one breaker.
///
/// The state gauge and the rejection counter are registered at construction. Transition
/// counters (labelled from, to, reason) are registered the first time that transition
/// happens and cached; the table itself is allocated on the first transition, so a breaker
/// that never changes state costs one pointer.
#[derive(Debug)]
pub(super) struct BreakerMetrics {
    labels: Option<Labels>,
    pub(super) state: Gauge,
    pub(super) rejected: Counter,
    transitions: OnceLock<Box<[OnceLock<Counter>]>>,
}

impl BreakerMetrics {
    pub(super) fn noop() -> Self {
        Self { labels: None, state: Gauge::noop(), rejected: Counter::noop(), transitions: OnceLock::new() }
    }

    pub(super) fn new(labels: Labels) -> Self {
        let state = labels.gauge(names::BREAKER_STATE);
        state.set(0.0);
        let rejected = labels.counter(names::BREAKER_REJECTED);
        Self { labels: Some(labels), state, rejected, transitions: OnceLock::new() }
    }

    pub(super) fn transition(&self, from: State, to: State, reason: TransitionReason) {
        self.state.set(to.index() as f64);
        let Some(labels) = &self.labels else { return };
        let table = self.transitions.get_or_init(|| (0..SLOTS).map(|_| OnceLock::new()).collect());
        let slot =
            (from.index() * State::ALL.len() + to.index()) * TransitionReason::ALL.len() + reason.index();
        table[slot]
            .get_or_init(|| {
                labels.counter_with(
                    names::BREAKER_TRANSITIONS,
                    &[(LABEL_FROM, from.as_str()), (LABEL_TO, to.as_str()), (LABEL_REASON, reason.as_str())],
                )
            })
            .increment(1);
    }
}

use std::sync::OnceLock;

use metrics::{Counter, Gauge};

use super::{State, TransitionReason};
use crate::metrics_names::{self as names, LABEL_FROM, LABEL_REASON, LABEL_TO, Labels, late};

const EDGES: usize = State::ALL.len() * State::ALL.len();
const SLOTS: usize = EDGES * TransitionReason::ALL.len();

/// Metric handles of one breaker, bound to the recorder late ([`late`]).
///
/// The state gauge and the rejection counter are registered at construction when a
/// recorder is installed, else at their first use or [`publish`](Self::publish) after one
/// is. Transition counters (labelled from, to, reason) are registered the first time that
/// transition happens and cached; the table itself is allocated on the first transition,
/// so a breaker that never changes state costs one pointer.
#[derive(Debug)]
pub(super) struct BreakerMetrics {
    labels: Option<Labels>,
    state: OnceLock<Gauge>,
    rejected: OnceLock<Counter>,
    transitions: OnceLock<Box<[OnceLock<Counter>]>>,
}

impl BreakerMetrics {
    pub(super) fn noop() -> Self {
        Self { labels: None, state: OnceLock::new(), rejected: OnceLock::new(), transitions: OnceLock::new() }
    }

    pub(super) fn new(labels: Labels) -> Self {
        let m = Self { labels: Some(labels), ..Self::noop() };
        if names::recorder_installed() {
            m.publish(State::Closed);
        }
        m
    }

    /// Registers the state gauge (set to `state`) and the rejection counter if they are
    /// not yet and a recorder is installed.
    pub(super) fn publish(&self, state: State) {
        self.set_state(state);
        self.rejected_counter();
    }

    fn set_state(&self, state: State) {
        let Some(labels) = &self.labels else { return };
        if let Some(g) = late(&self.state, || labels.gauge(names::BREAKER_STATE)) {
            g.set(state.index() as f64);
        }
    }

    fn rejected_counter(&self) -> Option<&Counter> {
        let labels = self.labels.as_ref()?;
        late(&self.rejected, || labels.counter(names::BREAKER_REJECTED))
    }

    #[inline]
    pub(super) fn rejected(&self) {
        if let Some(c) = self.rejected_counter() {
            c.increment(1);
        }
    }

    pub(super) fn transition(&self, from: State, to: State, reason: TransitionReason) {
        self.set_state(to);
        let Some(labels) = &self.labels else { return };
        let table = self.transitions.get_or_init(|| (0..SLOTS).map(|_| OnceLock::new()).collect());
        let slot =
            (from.index() * State::ALL.len() + to.index()) * TransitionReason::ALL.len() + reason.index();
        let counter = late(&table[slot], || {
            labels.counter_with(
                names::BREAKER_TRANSITIONS,
                &[(LABEL_FROM, from.as_str()), (LABEL_TO, to.as_str()), (LABEL_REASON, reason.as_str())],
            )
        });
        if let Some(c) = counter {
            c.increment(1);
        }
    }
}

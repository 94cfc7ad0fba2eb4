use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU32, AtomicU64, Ordering};

/// The atomic of the state word and the timer word: loom's under `--cfg loom`, so the
/// model in `breaker::tests::loom_model` explores every interleaving of the permit logic.
#[cfg(loom)]
use loom::sync::atomic::AtomicU64 as WordAtomic;
#[cfg(not(loom))]
use std::sync::atomic::AtomicU64 as WordAtomic;
use std::time::Duration;

use arc_swap::ArcSwap;
use tokio::time::Instant;

use super::metrics::BreakerMetrics;
use super::window::{Change, CountWindow, FAIL, OK, SLOW, SlidingWindow, WindowCounts};
use super::{BreakerOpen, BreakerSnapshot, State, Transition, TransitionReason};
use crate::applied::StatusChanges;
use crate::metrics_names::Labels;
use crate::policy::{self, BreakerOverrideState};

/// How a call that held a permit ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// The dependency did its job (a client error such as most 4xx counts as success for
    /// the breaker: it is not the dependency's fault).
    Success,
    /// The dependency failed (see
    /// [`ErrorKind::is_dependency_failure`](crate::retry::ErrorKind::is_dependency_failure)).
    Failure,
}

// The state word: every fact a permit decision needs, changed by one CAS.
//   bits 0..3   state (State as u64)
//   bits 3..11  HALF_OPEN: probe permits still free
//   bits 11..19 HALF_OPEN: probe successes still needed to close
//   bits 19..27 HALF_OPEN: probes of the current cohort still out (see below)
//   bits 27..64 generation, +1 on every transition and every time the half-open wait is
//               armed for a new cohort (wraps at 2^37)
//
// HALF_OPEN probes out = need − free (taken and not yet answered). The half-open wait
// bounds probes that are out, never time with no probe out (CB-8): probes form cohorts.
// A probe taken while none is out starts a cohort of its own (generation +1, the wait
// armed from now). A probe taken while others are out joins the next cohort (its permit is
// tagged generation + 1). When the last probe of the current cohort answers or is
// cancelled, the next cohort (the probes still out) becomes current (generation +1, the
// wait re-armed from now); with no probe out, the wait is disarmed. So every probe gets at
// least `max_wait_in_half_open`, and one that never answers reopens the breaker at most
// twice that long after it was sent (CB-1).
const STATE_MASK: u64 = 0b111;
const FREE_SHIFT: u32 = 3;
const NEED_SHIFT: u32 = 11;
const OLD_SHIFT: u32 = 19;
const COUNT_MASK: u64 = 0xff;
const GEN_SHIFT: u32 = 27;
const GEN_MASK: u64 = (1 << (64 - GEN_SHIFT)) - 1;
/// Most probes a HALF_OPEN period can have (validation allows 100).
const MAX_PROBES: u32 = 255;

#[inline]
const fn state_of(w: u64) -> State {
    State::from_index(w & STATE_MASK)
}
#[inline]
const fn gen_of(w: u64) -> u64 {
    w >> GEN_SHIFT
}
#[inline]
const fn free_of(w: u64) -> u32 {
    ((w >> FREE_SHIFT) & COUNT_MASK) as u32
}
#[inline]
const fn need_of(w: u64) -> u32 {
    ((w >> NEED_SHIFT) & COUNT_MASK) as u32
}
#[inline]
const fn old_of(w: u64) -> u32 {
    ((w >> OLD_SHIFT) & COUNT_MASK) as u32
}
/// The generation after `g` (wrapping inside the word's field).
#[inline]
const fn next_gen(g: u64) -> u64 {
    (g + 1) & GEN_MASK
}
/// A word outside HALF_OPEN (no probe counts).
#[inline]
const fn word(state: State, generation: u64) -> u64 {
    half_open_word(state, generation, 0, 0, 0)
}
#[inline]
const fn half_open_word(state: State, generation: u64, free: u32, need: u32, old: u32) -> u64 {
    ((generation & GEN_MASK) << GEN_SHIFT)
        | ((old as u64 & COUNT_MASK) << OLD_SHIFT)
        | ((need as u64 & COUNT_MASK) << NEED_SHIFT)
        | ((free as u64 & COUNT_MASK) << FREE_SHIFT)
        | state.index() as u64
}

// The timer word: one instant, in ms since `origin`, tagged with the generation it belongs
// to (low 20 bits): the end of the open period in OPEN, the deadline of the current probe
// cohort in HALF_OPEN, the override's expiry in FORCED_*/DISABLED. The CAS's winner
// publishes it right after its CAS; until then the tag does not match and readers treat the
// timer as not yet reached (OPEN keeps rejecting), so a stale instant from an earlier period
// is never trusted. A publication never replaces a newer generation's timer (a winner
// delayed between its CAS and its publication must not hide its successors' timers).
const TAG_SHIFT: u32 = 44;
const TAG_MASK: u64 = 0xf_ffff;
/// Half the tag space: a tag less than this far ahead is later.
const TAG_HALF: u64 = 1 << 19;
const MS_MASK: u64 = (1 << TAG_SHIFT) - 1;
/// "No expiry".
const NEVER: u64 = MS_MASK;

#[inline]
const fn timer(generation: u64, ms: u64) -> u64 {
    ((generation & TAG_MASK) << TAG_SHIFT) | (if ms > NEVER { NEVER } else { ms })
}
#[inline]
const fn timer_for(t: u64, generation: u64) -> Option<u64> {
    if t >> TAG_SHIFT == generation & TAG_MASK { Some(t & MS_MASK) } else { None }
}
/// Whether the timer `t` belongs to a later generation than `generation` (serial-number
/// order on the 20-bit tags, RFC 1982: later means less than half the tag space ahead).
#[inline]
const fn timer_is_newer(t: u64, generation: u64) -> bool {
    let ahead = ((t >> TAG_SHIFT).wrapping_sub(generation)) & TAG_MASK;
    ahead != 0 && ahead < TAG_HALF
}

fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(NEVER).min(NEVER)
}

fn ppm(ratio: f64) -> u64 {
    if ratio.is_finite() { (ratio.clamp(0.0, 1.0) * 1e6).round() as u64 } else { 1_000_000 }
}

/// Protects a dependency by failing fast once it fails too often (resilience4j semantics).
///
/// * **CLOSED**: calls pass and their outcomes fill a sliding window (the last N calls,
///   or the last N seconds in one-second buckets). Once the window holds `minimum_calls`,
///   it trips to OPEN when the failure rate ≥ `failure_rate_threshold` or — when
///   `slow_call_duration` is set — the slow-call rate ≥ `slow_call_rate_threshold`
///   (ratios 0..1; a call is slow when its duration ≥ `slow_call_duration`).
/// * **OPEN**: calls fail with [`BreakerOpen`] for `wait_in_open × 2^(consecutive opens −
///   1)`, capped at `max_wait_in_open`; consecutive opens reset when the breaker closes.
///   Results of calls started earlier are ignored, so they cannot extend the period (CB-7).
/// * **HALF_OPEN**: entered lazily by the first call after the open period (no timer
///   thread). Exactly `half_open_probes` permits are handed out (CB-2); any failed or slow
///   probe reopens; when all succeed the breaker closes with an empty window. A probe
///   dropped without a result frees its permit and decides nothing (CB-4). A probe that
///   has been out for `max_wait_in_half_open` (default: attempt timeout × 2) without
///   answering counts as failed: the next call, or the next probe to answer, reopens the
///   breaker (CB-1). Only probes that are out are timed: while none is, HALF_OPEN waits for
///   traffic for as long as it takes, so a rarely called dependency that recovered still
///   closes its breaker (CB-8). (Each probe gets at least the wait; with several probes
///   out at once, a later one may get up to twice the wait, see the word layout.)
/// * **Overrides** (FORCED_OPEN, FORCED_CLOSED, DISABLED) are set by an operator with an
///   optional monotonic expiry ([`CircuitBreaker::set_override`]).
///
/// Every permit carries the generation of the state it was taken in; a result from an
/// older generation never decides anything (CB-3). Every transition is counted per
/// (from, to) and per reason ([`CircuitBreaker::snapshot`]), and emitted as metrics and a
/// `tracing` event.
///
/// Concurrency: the CLOSED path is lock-free and allocation-free. `try_acquire` is one
/// atomic load. `record` of a success into a count window full of successes (the steady
/// state of a healthy dependency) is two atomic loads and writes nothing, so threads do
/// not contend; any other record loads the window (`ArcSwap`), advances its position
/// (`fetch_add`) and, only when the outcome in that slot changes, updates the totals and
/// evaluates the thresholds. Transitions are single CAS operations on one word.
#[derive(Debug)]
pub struct CircuitBreaker {
    word: WordAtomic,
    enabled: AtomicBool,
    timer: WordAtomic,
    /// The count window in place (no pointer to chase), active while `inline` is set:
    /// the default shape, and any count shape of the size the breaker was built with.
    count: CountWindow,
    inline: AtomicBool,
    /// Any other window (time-based, or a count window reshaped to another size).
    window: ArcSwap<SlidingWindow>,
    /// Set (bit 0) while the count window is full of plain successes, so recording another
    /// one is a no-op that needs no access to the window; the upper bits are a version
    /// bumped around every other write, so a stale "all successes" is never published.
    quiet: AtomicU64,
    window_shape: ArcSwap<policy::Window>,
    origin: Instant,
    consecutive_opens: AtomicU32,
    // Settings, read without locks.
    minimum_calls: AtomicU64,
    failure_ppm: AtomicU64,
    slow_ppm: AtomicU64,
    /// Slow-call duration in ns; `u64::MAX` = slow-call detection off.
    slow_ns: AtomicU64,
    wait_in_open_ms: AtomicU64,
    max_wait_in_open_ms: AtomicU64,
    half_open_probes: AtomicU32,
    max_wait_in_half_open: AtomicU64,
    configured_half_open_wait: AtomicU64,
    attempt_timeout_ms: AtomicU64,
    // Reporting.
    edges: [AtomicU64; 36],
    reasons: [AtomicU64; 10],
    last_reason: AtomicU8,
    metrics: BreakerMetrics,
    /// Signalled on every transition (the agent's status report shows the state).
    changes: Option<Arc<StatusChanges>>,
}

impl CircuitBreaker {
    /// A CLOSED breaker with `settings`; `attempt_timeout` gives the default
    /// `max_wait_in_half_open` (twice it). Metrics are not registered.
    pub fn new(settings: &policy::CircuitBreakerPolicy, attempt_timeout: Duration) -> Self {
        Self::build(settings, attempt_timeout, BreakerMetrics::noop())
    }

    /// As [`CircuitBreaker::new`], registering its metrics
    /// ([`BREAKER_STATE`](crate::metrics_names::BREAKER_STATE),
    /// [`BREAKER_TRANSITIONS`](crate::metrics_names::BREAKER_TRANSITIONS),
    /// [`BREAKER_REJECTED`](crate::metrics_names::BREAKER_REJECTED)) with `labels`.
    pub fn with_metrics(
        settings: &policy::CircuitBreakerPolicy,
        attempt_timeout: Duration,
        labels: Labels,
    ) -> Self {
        Self::build(settings, attempt_timeout, BreakerMetrics::new(labels))
    }

    /// Signals `changes` on every transition (lock-free, no allocation), so the agent
    /// reports the new state to the server without waiting for the periodic report.
    pub(crate) fn reporting_to(mut self, changes: Arc<StatusChanges>) -> Self {
        self.changes = Some(changes);
        self
    }

    fn build(
        settings: &policy::CircuitBreakerPolicy,
        attempt_timeout: Duration,
        metrics: BreakerMetrics,
    ) -> Self {
        let b = Self {
            word: WordAtomic::new(word(State::Closed, 0)),
            enabled: AtomicBool::new(true),
            timer: WordAtomic::new(timer(0, NEVER)),
            count: CountWindow::new(match settings.window {
                policy::Window::Count { size } => size,
                policy::Window::Time { .. } => 1,
            }),
            inline: AtomicBool::new(matches!(settings.window, policy::Window::Count { .. })),
            // A count shape lives inline; the swappable window then only holds a 1-slot
            // placeholder until a reshape needs it.
            window: ArcSwap::from_pointee(SlidingWindow::new(match settings.window {
                policy::Window::Count { .. } => policy::Window::Count { size: 1 },
                time => time,
            })),
            quiet: AtomicU64::new(0),
            window_shape: ArcSwap::from_pointee(settings.window),
            origin: Instant::now(),
            consecutive_opens: AtomicU32::new(0),
            minimum_calls: AtomicU64::new(0),
            failure_ppm: AtomicU64::new(0),
            slow_ppm: AtomicU64::new(0),
            slow_ns: AtomicU64::new(u64::MAX),
            wait_in_open_ms: AtomicU64::new(0),
            max_wait_in_open_ms: AtomicU64::new(0),
            half_open_probes: AtomicU32::new(1),
            max_wait_in_half_open: AtomicU64::new(0),
            configured_half_open_wait: AtomicU64::new(u64::MAX),
            attempt_timeout_ms: AtomicU64::new(ms(attempt_timeout)),
            edges: std::array::from_fn(|_| AtomicU64::new(0)),
            reasons: std::array::from_fn(|_| AtomicU64::new(0)),
            last_reason: AtomicU8::new(u8::MAX),
            metrics,
            changes: None,
        };
        b.update(settings);
        b
    }

    /// Applies new settings live.
    ///
    /// Kept: the state, the open period under way, consecutive opens, and the window when
    /// its shape (count/time and size) is unchanged. Reset deliberately: the window,
    /// emptied when its shape changed (old outcomes do not fit the new shape). Thresholds,
    /// `minimum_calls` and slow-call settings apply from the next recorded call; durations
    /// and probe count from the next transition.
    pub fn update(&self, settings: &policy::CircuitBreakerPolicy) {
        self.enabled.store(settings.enabled, Ordering::Relaxed);
        self.minimum_calls.store(u64::from(settings.minimum_calls.max(1)), Ordering::Relaxed);
        self.failure_ppm.store(ppm(settings.failure_rate_threshold), Ordering::Relaxed);
        self.slow_ppm.store(ppm(settings.slow_call_rate_threshold), Ordering::Relaxed);
        let slow =
            settings.slow_call_duration.map_or(u64::MAX, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX));
        self.slow_ns.store(slow, Ordering::Relaxed);
        self.wait_in_open_ms.store(ms(settings.wait_in_open), Ordering::Relaxed);
        self.max_wait_in_open_ms.store(ms(settings.max_wait_in_open), Ordering::Relaxed);
        self.half_open_probes.store(settings.half_open_probes.clamp(1, MAX_PROBES), Ordering::Relaxed);
        self.configured_half_open_wait
            .store(settings.max_wait_in_half_open.map_or(u64::MAX, ms), Ordering::Relaxed);
        self.refresh_half_open_wait();
        if **self.window_shape.load() != settings.window {
            self.window_shape.store(Arc::new(settings.window));
            self.reset_window();
            tracing::info!(window = ?settings.window, "circuit breaker window reshaped; window emptied");
        }
    }

    /// Changes the attempt timeout that the default `max_wait_in_half_open` derives from.
    pub fn set_attempt_timeout(&self, attempt_timeout: Duration) {
        self.attempt_timeout_ms.store(ms(attempt_timeout), Ordering::Relaxed);
        self.refresh_half_open_wait();
    }

    fn refresh_half_open_wait(&self) {
        let configured = self.configured_half_open_wait.load(Ordering::Relaxed);
        let wait = if configured == u64::MAX {
            self.attempt_timeout_ms.load(Ordering::Relaxed).saturating_mul(2)
        } else {
            configured
        };
        self.max_wait_in_half_open.store(wait.max(1), Ordering::Relaxed);
    }

    #[inline]
    fn now_ms(&self) -> u64 {
        ms(Instant::now().saturating_duration_since(self.origin))
    }

    /// Asks to make a call.
    ///
    /// # Errors
    /// [`BreakerOpen`] when OPEN (before its period ends), FORCED_OPEN, or HALF_OPEN with
    /// every probe permit taken. Never blocks.
    #[inline]
    pub fn try_acquire(&self) -> Result<BreakerPermit<'_>, BreakerOpen> {
        let w = self.word.load(Ordering::Acquire);
        if state_of(w) == State::Closed && self.enabled.load(Ordering::Relaxed) {
            return Ok(BreakerPermit {
                breaker: self,
                generation: gen_of(w),
                kind: Kind::Normal,
                done: false,
            });
        }
        self.try_acquire_slow(w)
    }

    #[cold]
    fn try_acquire_slow(&self, mut w: u64) -> Result<BreakerPermit<'_>, BreakerOpen> {
        if !self.enabled.load(Ordering::Relaxed) {
            return Ok(BreakerPermit {
                breaker: self,
                generation: gen_of(w),
                kind: Kind::Passthrough,
                done: false,
            });
        }
        loop {
            let g = gen_of(w);
            let permit = |kind| Ok(BreakerPermit { breaker: self, generation: g, kind, done: false });
            match state_of(w) {
                State::Closed => return permit(Kind::Normal),
                State::Open => {
                    let Some(until) = timer_for(self.timer.load(Ordering::Acquire), g) else {
                        // The timer is another generation's: either this OPEN period's is not
                        // published yet (reject: it has just begun), or the breaker moved on
                        // since `w` was read (then retry with the new word; the loom model covers both).
                        let cur = self.word.load(Ordering::Acquire);
                        if cur != w {
                            w = cur;
                            continue;
                        }
                        return self.reject();
                    };
                    let now = self.now_ms();
                    if now < until {
                        return self.reject();
                    }
                    let probes = self.half_open_probes.load(Ordering::Relaxed);
                    let g1 = next_gen(g);
                    // The first probe is taken with the transition: it starts the first cohort.
                    let next = half_open_word(State::HalfOpen, g1, probes - 1, probes, 1);
                    match self.word.compare_exchange(w, next, Ordering::AcqRel, Ordering::Acquire) {
                        Ok(_) => {
                            let until = self.half_open_deadline(now);
                            self.enter(
                                State::Open,
                                State::HalfOpen,
                                TransitionReason::OpenElapsed,
                                g1,
                                until,
                            );
                            return self.probe(g1);
                        }
                        Err(cur) => w = cur,
                    }
                }
                State::HalfOpen => {
                    let now = self.now_ms();
                    match self.half_open_overdue(w, now) {
                        Overdue::No => {}
                        Overdue::Yes => {
                            if self.reopen(w, TransitionReason::HalfOpenTimeout, now) {
                                return self.reject();
                            }
                            w = self.word.load(Ordering::Acquire);
                            continue;
                        }
                        Overdue::Moved(cur) => {
                            w = cur;
                            continue;
                        }
                    }
                    let (free, need, old) = (free_of(w), need_of(w), old_of(w));
                    if free == 0 {
                        return self.reject();
                    }
                    if old == 0 {
                        // No probe is out: this one starts a cohort, and the wait starts now.
                        let g1 = next_gen(g);
                        let next = half_open_word(State::HalfOpen, g1, free - 1, need, 1);
                        match self.word.compare_exchange(w, next, Ordering::AcqRel, Ordering::Acquire) {
                            Ok(_) => {
                                self.publish_timer(g1, self.half_open_deadline(now));
                                return self.probe(g1);
                            }
                            Err(cur) => w = cur,
                        }
                    } else {
                        // Probes are out: this one joins the next cohort, timed once the
                        // current one is over.
                        let next = half_open_word(State::HalfOpen, g, free - 1, need, old);
                        match self.word.compare_exchange_weak(w, next, Ordering::AcqRel, Ordering::Acquire) {
                            Ok(_) => return self.probe(next_gen(g)),
                            Err(cur) => w = cur,
                        }
                    }
                }
                forced @ (State::ForcedOpen | State::ForcedClosed | State::Disabled) => {
                    let expiry = timer_for(self.timer.load(Ordering::Acquire), g);
                    if let Some(e) = expiry.filter(|e| *e != NEVER)
                        && self.now_ms() >= e
                    {
                        self.close_override(w, TransitionReason::OverrideExpired);
                        w = self.word.load(Ordering::Acquire);
                        continue;
                    }
                    return match forced {
                        State::ForcedOpen => self.reject(),
                        State::ForcedClosed => permit(Kind::Normal),
                        _ => permit(Kind::Passthrough),
                    };
                }
            }
        }
    }

    /// A HALF_OPEN probe permit timed with `cohort`.
    fn probe(&self, cohort: u64) -> Result<BreakerPermit<'_>, BreakerOpen> {
        Ok(BreakerPermit { breaker: self, generation: cohort, kind: Kind::Probe, done: false })
    }

    /// When a probe cohort armed at `now` is overdue.
    fn half_open_deadline(&self, now: u64) -> u64 {
        now.saturating_add(self.max_wait_in_half_open.load(Ordering::Relaxed))
    }

    fn reject(&self) -> Result<BreakerPermit<'_>, BreakerOpen> {
        self.metrics.rejected();
        Err(BreakerOpen::new())
    }

    /// Publishes the timer of generation `g`, unless a later generation's is already there.
    fn publish_timer(&self, g: u64, ms: u64) {
        let next = timer(g, ms);
        let _ = self
            .timer
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |t| (!timer_is_newer(t, g)).then_some(next));
    }

    /// Whether the current probe cohort of the HALF_OPEN word `w` is past its deadline.
    fn half_open_overdue(&self, w: u64, now: u64) -> Overdue {
        if old_of(w) == 0 {
            return Overdue::No; // no probe out: nothing to time (CB-8)
        }
        match timer_for(self.timer.load(Ordering::Acquire), gen_of(w)) {
            Some(deadline) if now >= deadline => Overdue::Yes,
            Some(_) => Overdue::No,
            None => {
                // Either the cohort's winner has not published its deadline yet (it has just
                // begun: not overdue), or the breaker moved on since `w` was read.
                let cur = self.word.load(Ordering::Acquire);
                if cur != w { Overdue::Moved(cur) } else { Overdue::No }
            }
        }
    }

    /// Publishes the side effects of a transition won by CAS to generation `g`.
    fn enter(&self, from: State, to: State, reason: TransitionReason, g: u64, timer_ms: u64) {
        self.publish_timer(g, timer_ms);
        if to == State::HalfOpen || (to == State::Closed && from != State::HalfOpen) {
            // A fresh window for the trial (and after an override): nothing recorded before
            // it may decide what comes after. HALF_OPEN → CLOSED keeps the window emptied
            // on entering HALF_OPEN, which only stale results could have reached (they are
            // filtered by generation).
            self.reset_window();
        }
        self.edges[from.index() * 6 + to.index()].fetch_add(1, Ordering::Relaxed);
        self.reasons[reason.index()].fetch_add(1, Ordering::Relaxed);
        self.last_reason.store(reason.index() as u8, Ordering::Relaxed);
        self.metrics.transition(from, to, reason);
        if let Some(changes) = &self.changes {
            changes.changed();
        }
        tracing::info!(
            from = from.as_str(),
            to = to.as_str(),
            reason = reason.as_str(),
            generation = g,
            "circuit breaker transition"
        );
    }

    /// Empties the window for the current shape: in place when it is a count window of
    /// the inline size, else by swapping in a new one.
    fn reset_window(&self) {
        let shape = **self.window_shape.load();
        match shape {
            policy::Window::Count { size } if u64::from(size.max(1)) == self.count.len() => {
                self.count.reset();
                self.inline.store(true, Ordering::Release);
            }
            _ => {
                self.window.store(Arc::new(SlidingWindow::new(shape)));
                self.inline.store(false, Ordering::Release);
            }
        }
        self.unquiet();
    }

    /// The window's counts now.
    fn counts(&self) -> WindowCounts {
        if self.inline.load(Ordering::Acquire) { self.count.counts() } else { self.window.load().counts() }
    }

    /// The open period for the `n`-th consecutive open: `wait_in_open × 2^(n−1)`, capped.
    fn open_period_ms(&self, n: u32) -> u64 {
        let base = self.wait_in_open_ms.load(Ordering::Relaxed);
        let cap = self.max_wait_in_open_ms.load(Ordering::Relaxed);
        let shift = n.saturating_sub(1).min(63);
        base.saturating_mul(1u64 << shift).min(cap)
    }

    /// CAS from `w` (CLOSED or HALF_OPEN) to OPEN. Returns whether this call won.
    fn reopen(&self, w: u64, reason: TransitionReason, now: u64) -> bool {
        let g = next_gen(gen_of(w));
        if self.word.compare_exchange(w, word(State::Open, g), Ordering::AcqRel, Ordering::Acquire).is_err() {
            return false;
        }
        let n = self.consecutive_opens.fetch_add(1, Ordering::Relaxed).saturating_add(1);
        self.enter(state_of(w), State::Open, reason, g, now.saturating_add(self.open_period_ms(n)));
        true
    }

    fn close_override(&self, w: u64, reason: TransitionReason) -> bool {
        let g = next_gen(gen_of(w));
        if self.word.compare_exchange(w, word(State::Closed, g), Ordering::AcqRel, Ordering::Acquire).is_err()
        {
            return false;
        }
        self.consecutive_opens.store(0, Ordering::Relaxed);
        self.enter(state_of(w), State::Closed, reason, g, NEVER);
        true
    }

    /// Sets or clears an operator override.
    ///
    /// `Some(state)` forces FORCED_OPEN, FORCED_CLOSED or DISABLED until `expires_at`
    /// (monotonic; `None` = until cleared). Setting the state already in force only
    /// changes the expiry. `None` clears an override: the breaker goes CLOSED with an empty
    /// window and no consecutive opens. An expired override is cleared lazily by the next
    /// call.
    pub fn set_override(&self, state: Option<BreakerOverrideState>, expires_at: Option<Instant>) {
        let target = state.map(|s| match s {
            BreakerOverrideState::ForcedOpen => State::ForcedOpen,
            BreakerOverrideState::ForcedClosed => State::ForcedClosed,
            BreakerOverrideState::Disabled => State::Disabled,
        });
        let expiry = expires_at.map_or(NEVER, |e| ms(e.saturating_duration_since(self.origin)));
        loop {
            let w = self.word.load(Ordering::Acquire);
            let cur = state_of(w);
            let is_forced = matches!(cur, State::ForcedOpen | State::ForcedClosed | State::Disabled);
            match target {
                None if !is_forced => return,
                None => {
                    if self.close_override(w, TransitionReason::OverrideCleared) {
                        return;
                    }
                }
                Some(t) if t == cur => {
                    self.publish_timer(gen_of(w), expiry);
                    return;
                }
                Some(t) => {
                    let g = next_gen(gen_of(w));
                    if self.word.compare_exchange(w, word(t, g), Ordering::AcqRel, Ordering::Acquire).is_ok()
                    {
                        self.enter(cur, t, TransitionReason::OverrideSet, g, expiry);
                        return;
                    }
                }
            }
        }
    }

    #[inline]
    fn code(&self, outcome: Outcome, elapsed: Duration) -> u8 {
        let mut code = if outcome == Outcome::Success { OK } else { FAIL };
        let slow_ns = self.slow_ns.load(Ordering::Relaxed);
        if slow_ns != u64::MAX && elapsed.as_nanos() >= u128::from(slow_ns) {
            code |= SLOW;
        }
        code
    }

    #[inline]
    fn record_normal(&self, generation: u64, outcome: Outcome, elapsed: Duration) {
        let w = self.word.load(Ordering::Acquire);
        if gen_of(w) != generation {
            return; // taken in an earlier state: decides nothing (CB-3, CB-7)
        }
        let code = self.code(outcome, elapsed);
        if code == OK && self.quiet.load(Ordering::Acquire) & 1 == 1 {
            // The last N calls all succeeded: one more success changes nothing (it would
            // replace a success), so there is nothing to write.
            return;
        }
        self.record_in_window(w, code);
    }

    /// Clears the "window full of successes" flag and bumps its version.
    fn unquiet(&self) {
        let _ = self.quiet.fetch_update(Ordering::AcqRel, Ordering::Acquire, |q| Some((q | 1) + 1));
    }

    #[inline(never)]
    fn record_in_window(&self, w: u64, code: u8) {
        if code != OK {
            self.unquiet(); // before the write: nobody may skip past it from now on
        }
        let version = self.quiet.load(Ordering::Acquire);
        let (change, counts, full) = if self.inline.load(Ordering::Acquire) {
            let change = self.count.record(code);
            (change, self.count.counts(), self.count.len())
        } else {
            let window = self.window.load();
            let change = window.record(code);
            let full = match &**window {
                SlidingWindow::Count(c) => c.len(),
                SlidingWindow::Time(_) => u64::MAX, // never "full of successes"
            };
            (change, window.counts(), full)
        };
        if code != OK {
            // After the write too: a success that saw "all successes" in between and
            // published the flag with the bumped version has its flag cleared here.
            self.unquiet();
        } else if counts.calls == full && counts.failures == 0 && counts.slow == 0 {
            // Fails when any other write bumped the version since `version` was read.
            let _ = self.quiet.compare_exchange(version, version | 1, Ordering::AcqRel, Ordering::Relaxed);
        }
        if change == Change::Changed && state_of(w) == State::Closed {
            self.evaluate(w, counts);
        }
    }

    #[cold]
    fn evaluate(&self, w: u64, c: WindowCounts) {
        if c.calls < self.minimum_calls.load(Ordering::Relaxed) {
            return;
        }
        let reason = if c.failures * 1_000_000 >= self.failure_ppm.load(Ordering::Relaxed) * c.calls {
            TransitionReason::FailureRate
        } else if self.slow_ns.load(Ordering::Relaxed) != u64::MAX
            && c.slow * 1_000_000 >= self.slow_ppm.load(Ordering::Relaxed) * c.calls
        {
            TransitionReason::SlowCallRate
        } else {
            return;
        };
        self.reopen(w, reason, self.now_ms());
    }

    /// Whether a probe permit of `cohort` still belongs to the trial of the word `w`: it is
    /// in the current cohort (`Some(true)`) or in the next one (`Some(false)`).
    #[inline]
    fn probe_cohort(w: u64, cohort: u64) -> Option<bool> {
        if state_of(w) != State::HalfOpen {
            None
        } else if gen_of(w) == cohort {
            Some(true)
        } else if next_gen(gen_of(w)) == cohort {
            Some(false)
        } else {
            None
        }
    }

    /// The HALF_OPEN word after one probe of the current cohort is no longer out (answered
    /// or cancelled), with `free` and `need` already updated: when it was the cohort's
    /// last, the next cohort (the probes still out) becomes current and the wait is
    /// re-armed (`true`), or with none out the wait is disarmed.
    #[inline]
    fn cohort_left(w: u64, free: u32, need: u32) -> (u64, bool) {
        let (g, old) = (gen_of(w), old_of(w));
        if old > 1 {
            return (half_open_word(State::HalfOpen, g, free, need, old - 1), false);
        }
        let out = need - free;
        if out == 0 {
            (half_open_word(State::HalfOpen, g, free, need, 0), false)
        } else {
            (half_open_word(State::HalfOpen, next_gen(g), free, need, out), true)
        }
    }

    fn record_probe(&self, cohort: u64, outcome: Outcome, elapsed: Duration) {
        let code = self.code(outcome, elapsed);
        let mut w = self.word.load(Ordering::Acquire);
        loop {
            let Some(current) = Self::probe_cohort(w, cohort) else {
                return; // the trial this probe belonged to is over
            };
            let now = self.now_ms();
            let (free, need) = (free_of(w), need_of(w));
            if code != OK {
                let reason = if code & FAIL != 0 {
                    TransitionReason::ProbeFailed
                } else {
                    TransitionReason::ProbeSlow
                };
                if self.reopen(w, reason, now) {
                    return;
                }
            } else {
                match self.half_open_overdue(w, now) {
                    Overdue::Yes => {
                        // A probe of the current cohort (this one, or one still out) has
                        // been out longer than the wait: it counts as failed.
                        if self.reopen(w, TransitionReason::HalfOpenTimeout, now) {
                            return;
                        }
                    }
                    Overdue::Moved(cur) => {
                        w = cur;
                        continue;
                    }
                    Overdue::No if need <= 1 => {
                        let g = next_gen(gen_of(w));
                        if self
                            .word
                            .compare_exchange(w, word(State::Closed, g), Ordering::AcqRel, Ordering::Acquire)
                            .is_ok()
                        {
                            self.consecutive_opens.store(0, Ordering::Relaxed);
                            self.enter(
                                State::HalfOpen,
                                State::Closed,
                                TransitionReason::ProbesSucceeded,
                                g,
                                NEVER,
                            );
                            return;
                        }
                    }
                    Overdue::No => {
                        let (next, rearm) = if current {
                            Self::cohort_left(w, free, need - 1)
                        } else {
                            (half_open_word(State::HalfOpen, gen_of(w), free, need - 1, old_of(w)), false)
                        };
                        if self.word.compare_exchange(w, next, Ordering::AcqRel, Ordering::Acquire).is_ok() {
                            if rearm {
                                self.publish_timer(gen_of(next), self.half_open_deadline(now));
                            }
                            return;
                        }
                    }
                }
            }
            w = self.word.load(Ordering::Acquire);
        }
    }

    fn release_probe(&self, cohort: u64) {
        let mut w = self.word.load(Ordering::Acquire);
        loop {
            let Some(current) = Self::probe_cohort(w, cohort) else {
                return;
            };
            let (free, need) = (free_of(w) + 1, need_of(w));
            let (next, rearm) = if current {
                Self::cohort_left(w, free, need)
            } else {
                (half_open_word(State::HalfOpen, gen_of(w), free, need, old_of(w)), false)
            };
            match self.word.compare_exchange(w, next, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => {
                    if rearm {
                        self.publish_timer(gen_of(next), self.half_open_deadline(self.now_ms()));
                    }
                    return;
                }
                Err(cur) => w = cur,
            }
        }
    }

    /// HALF_OPEN bookkeeping for the model tests: probes out, probes of the current cohort
    /// out, and whether the current generation's timer is published.
    #[cfg(all(test, loom))]
    pub(crate) fn probe_counts(&self) -> (u32, u32, bool) {
        let w = self.word.load(Ordering::Acquire);
        let published = timer_for(self.timer.load(Ordering::Acquire), gen_of(w)).is_some();
        if state_of(w) == State::HalfOpen {
            (need_of(w) - free_of(w), old_of(w), published)
        } else {
            (0, 0, published)
        }
    }

    /// The current state (an expired override or an elapsed open period shows until the
    /// next call notices it).
    pub fn state(&self) -> State {
        state_of(self.word.load(Ordering::Acquire))
    }

    /// Registers this breaker's series with a recorder installed since it was built, the
    /// state gauge at its current value (CB-9).
    pub(crate) fn publish_metrics(&self) {
        self.metrics.publish(self.state());
    }

    /// A point-in-time view: state, window counts and rates, transitions and last reason.
    /// Allocates; meant for status reports, not the call path.
    pub fn snapshot(&self) -> BreakerSnapshot {
        let w = self.word.load(Ordering::Acquire);
        let window = self.counts();
        let rate = |n: u64| if window.calls == 0 { 0.0 } else { n as f64 / window.calls as f64 };
        let mut transitions = Vec::new();
        for from in State::ALL {
            for to in State::ALL {
                let count = self.edges[from.index() * 6 + to.index()].load(Ordering::Relaxed);
                if count > 0 {
                    transitions.push(Transition { from, to, count });
                }
            }
        }
        let reasons = TransitionReason::ALL
            .into_iter()
            .map(|r| (r, self.reasons[r.index()].load(Ordering::Relaxed)))
            .filter(|(_, n)| *n > 0)
            .collect();
        let last = self.last_reason.load(Ordering::Relaxed);
        BreakerSnapshot {
            state: state_of(w),
            generation: gen_of(w),
            window,
            failure_rate: rate(window.failures),
            slow_call_rate: rate(window.slow),
            consecutive_opens: self.consecutive_opens.load(Ordering::Relaxed),
            half_open_free: if state_of(w) == State::HalfOpen { free_of(w) } else { 0 },
            transitions,
            reasons,
            last_reason: TransitionReason::ALL.get(usize::from(last)).copied(),
        }
    }
}

/// Whether the current probe cohort is past its deadline.
enum Overdue {
    No,
    Yes,
    /// The breaker changed since the word was read: decide again on this one.
    Moved(u64),
}

/// A [`BreakerPermit`] held apart from its breaker (see [`BreakerPermit::detach`]); it
/// must be reattached to the same breaker, which records or releases it.
#[derive(Debug)]
pub(crate) struct DetachedBreakerPermit {
    generation: u64,
    kind: Kind,
}

impl CircuitBreaker {
    /// The permit `detached` from this breaker, back as a [`BreakerPermit`].
    pub(crate) fn reattach(&self, detached: DetachedBreakerPermit) -> BreakerPermit<'_> {
        BreakerPermit { breaker: self, generation: detached.generation, kind: detached.kind, done: false }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    /// CLOSED or FORCED_CLOSED: the outcome goes to the window.
    Normal,
    /// HALF_OPEN: the outcome decides the trial; dropping frees the slot.
    Probe,
    /// DISABLED (by override or config): nothing is recorded.
    Passthrough,
}

/// Grants one call through a [`CircuitBreaker`], tagged with the state generation it was
/// taken in.
///
/// Report the result with [`BreakerPermit::record`]. Dropping it unrecorded means the call
/// was cancelled: it counts neither way, and a HALF_OPEN probe permit is handed back.
#[derive(Debug)]
#[must_use = "record the outcome, or drop the permit to cancel the call"]
pub struct BreakerPermit<'a> {
    breaker: &'a CircuitBreaker,
    generation: u64,
    kind: Kind,
    done: bool,
}

impl BreakerPermit<'_> {
    /// Reports how the call ended and how long it took (`elapsed` decides whether it was
    /// slow). Ignored when the breaker has changed state since the permit was taken.
    #[inline]
    pub fn record(mut self, outcome: Outcome, elapsed: Duration) {
        self.done = true;
        match self.kind {
            Kind::Normal => self.breaker.record_normal(self.generation, outcome, elapsed),
            Kind::Probe => self.breaker.record_probe(self.generation, outcome, elapsed),
            Kind::Passthrough => {}
        }
    }

    /// Gives the permit up without recording or releasing anything, for a future that
    /// holds it across polls beside the breaker's owner (the enforcement future): it is
    /// taken back with [`CircuitBreaker::reattach`] on the same breaker.
    pub(crate) fn detach(self) -> DetachedBreakerPermit {
        let d = DetachedBreakerPermit { generation: self.generation, kind: self.kind };
        std::mem::forget(self);
        d
    }

    /// Whether this permit is a HALF_OPEN probe.
    pub fn is_probe(&self) -> bool {
        self.kind == Kind::Probe
    }

    /// The state generation the permit was taken in; for a HALF_OPEN probe taken while
    /// other probes were out, the generation of the cohort it will be timed with (one more).
    pub fn generation(&self) -> u64 {
        self.generation
    }
}

impl Drop for BreakerPermit<'_> {
    #[inline]
    fn drop(&mut self) {
        if !self.done && self.kind == Kind::Probe {
            self.breaker.release_probe(self.generation);
        }
    }
}

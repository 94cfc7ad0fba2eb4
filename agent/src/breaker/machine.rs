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
//   bits 19..64 generation, +1 on every transition
const STATE_MASK: u64 = 0b111;
const FREE_SHIFT: u32 = 3;
const NEED_SHIFT: u32 = 11;
const COUNT_MASK: u64 = 0xff;
const GEN_SHIFT: u32 = 19;
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
const fn word(state: State, generation: u64, free: u32, need: u32) -> u64 {
    (generation << GEN_SHIFT)
        | ((need as u64 & COUNT_MASK) << NEED_SHIFT)
        | ((free as u64 & COUNT_MASK) << FREE_SHIFT)
        | state.index() as u64
}

// The timer word: one instant, in ms since `origin`, tagged with the generation it belongs
// to (low 20 bits): the end of the open period in OPEN, the half-open deadline in
// HALF_OPEN, the override's expiry in FORCED_*/DISABLED. The transition's winner stores it
// right after its CAS; until then the tag does not match and readers treat the timer as not
// yet reached (OPEN keeps rejecting), so a stale instant from an earlier period is never
// trusted.
const TAG_SHIFT: u32 = 44;
const MS_MASK: u64 = (1 << TAG_SHIFT) - 1;
/// "No expiry".
const NEVER: u64 = MS_MASK;

#[inline]
const fn timer(generation: u64, ms: u64) -> u64 {
    ((generation & 0xf_ffff) << TAG_SHIFT) | (if ms > NEVER { NEVER } else { ms })
}
#[inline]
const fn timer_for(t: u64, generation: u64) -> Option<u64> {
    if t >> TAG_SHIFT == generation & 0xf_ffff { Some(t & MS_MASK) } else { None }
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
///   dropped without a result frees its permit and decides nothing (CB-4). If the probes
///   have not all come back within `max_wait_in_half_open` (default: attempt timeout × 2),
///   the next call reopens it (CB-1).
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

    fn build(
        settings: &policy::CircuitBreakerPolicy,
        attempt_timeout: Duration,
        metrics: BreakerMetrics,
    ) -> Self {
        let b = Self {
            word: WordAtomic::new(word(State::Closed, 0, 0, 0)),
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
                        // since `w` was read (found by the loom model: retry with the new word).
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
                    let next = word(State::HalfOpen, g + 1, probes - 1, probes);
                    match self.word.compare_exchange(w, next, Ordering::AcqRel, Ordering::Acquire) {
                        Ok(_) => {
                            let wait = self.max_wait_in_half_open.load(Ordering::Relaxed);
                            self.enter(
                                State::Open,
                                State::HalfOpen,
                                TransitionReason::OpenElapsed,
                                g + 1,
                                now + wait,
                            );
                            return Ok(BreakerPermit {
                                breaker: self,
                                generation: g + 1,
                                kind: Kind::Probe,
                                done: false,
                            });
                        }
                        Err(cur) => w = cur,
                    }
                }
                State::HalfOpen => {
                    let deadline = timer_for(self.timer.load(Ordering::Acquire), g);
                    if let Some(deadline) = deadline {
                        let now = self.now_ms();
                        if now >= deadline {
                            if self.reopen(w, TransitionReason::HalfOpenTimeout, now) {
                                return self.reject();
                            }
                            w = self.word.load(Ordering::Acquire);
                            continue;
                        }
                    }
                    let free = free_of(w);
                    if free == 0 {
                        return self.reject();
                    }
                    let next = word(State::HalfOpen, g, free - 1, need_of(w));
                    match self.word.compare_exchange_weak(w, next, Ordering::AcqRel, Ordering::Acquire) {
                        Ok(_) => return permit(Kind::Probe),
                        Err(cur) => w = cur,
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

    fn reject(&self) -> Result<BreakerPermit<'_>, BreakerOpen> {
        self.metrics.rejected.increment(1);
        Err(BreakerOpen::new())
    }

    /// Publishes the side effects of a transition won by CAS to generation `g`.
    fn enter(&self, from: State, to: State, reason: TransitionReason, g: u64, timer_ms: u64) {
        self.timer.store(timer(g, timer_ms), Ordering::Release);
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
        let g = gen_of(w);
        let next = word(State::Open, g + 1, 0, 0);
        if self.word.compare_exchange(w, next, Ordering::AcqRel, Ordering::Acquire).is_err() {
            return false;
        }
        let n = self.consecutive_opens.fetch_add(1, Ordering::Relaxed).saturating_add(1);
        self.enter(state_of(w), State::Open, reason, g + 1, now.saturating_add(self.open_period_ms(n)));
        true
    }

    fn close_override(&self, w: u64, reason: TransitionReason) -> bool {
        let g = gen_of(w);
        let next = word(State::Closed, g + 1, 0, 0);
        if self.word.compare_exchange(w, next, Ordering::AcqRel, Ordering::Acquire).is_err() {
            return false;
        }
        self.consecutive_opens.store(0, Ordering::Relaxed);
        self.enter(state_of(w), State::Closed, reason, g + 1, NEVER);
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
                    self.timer.store(timer(gen_of(w), expiry), Ordering::Release);
                    return;
                }
                Some(t) => {
                    let g = gen_of(w);
                    if self
                        .word
                        .compare_exchange(w, word(t, g + 1, 0, 0), Ordering::AcqRel, Ordering::Acquire)
                        .is_ok()
                    {
                        self.enter(cur, t, TransitionReason::OverrideSet, g + 1, expiry);
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

    fn record_probe(&self, generation: u64, outcome: Outcome, elapsed: Duration) {
        let code = self.code(outcome, elapsed);
        let mut w = self.word.load(Ordering::Acquire);
        loop {
            if gen_of(w) != generation || state_of(w) != State::HalfOpen {
                return; // the trial this probe belonged to is over
            }
            if code != OK {
                let reason = if code & FAIL != 0 {
                    TransitionReason::ProbeFailed
                } else {
                    TransitionReason::ProbeSlow
                };
                if self.reopen(w, reason, self.now_ms()) {
                    return;
                }
            } else if need_of(w) <= 1 {
                let next = word(State::Closed, generation + 1, 0, 0);
                if self.word.compare_exchange(w, next, Ordering::AcqRel, Ordering::Acquire).is_ok() {
                    self.consecutive_opens.store(0, Ordering::Relaxed);
                    self.enter(
                        State::HalfOpen,
                        State::Closed,
                        TransitionReason::ProbesSucceeded,
                        generation + 1,
                        NEVER,
                    );
                    return;
                }
            } else {
                let next = word(State::HalfOpen, generation, free_of(w), need_of(w) - 1);
                if self.word.compare_exchange(w, next, Ordering::AcqRel, Ordering::Acquire).is_ok() {
                    return;
                }
            }
            w = self.word.load(Ordering::Acquire);
        }
    }

    fn release_probe(&self, generation: u64) {
        let _ = self.word.fetch_update(Ordering::AcqRel, Ordering::Acquire, |w| {
            (gen_of(w) == generation && state_of(w) == State::HalfOpen)
                .then(|| word(State::HalfOpen, generation, free_of(w) + 1, need_of(w)))
        });
    }

    /// The current state (an expired override or an elapsed open period shows until the
    /// next call notices it).
    pub fn state(&self) -> State {
        state_of(self.word.load(Ordering::Acquire))
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

    /// Whether this permit is a HALF_OPEN probe.
    pub fn is_probe(&self) -> bool {
        self.kind == Kind::Probe
    }

    /// The state generation the permit was taken in.
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

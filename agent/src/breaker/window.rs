//! Sliding windows of call outcomes: the last N calls, or the last N seconds in one-second
//! buckets (resilience4j's COUNT_BASED and TIME_BASED windows), both lock-free.

use std::sync::atomic::{AtomicI64, AtomicU8, AtomicU32, AtomicU64, AtomicUsize, Ordering};

use tokio::time::Instant;

use crate::policy;

/// Calls, failures and slow calls held by a window.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct WindowCounts {
    /// Calls recorded.
    pub calls: u64,
    /// Of which failed.
    pub failures: u64,
    /// Of which were slow (successful or not).
    pub slow: u64,
}

/// One outcome as stored in a count-window slot: 0 = empty.
pub(super) const OK: u8 = 1;
pub(super) const FAIL: u8 = 2;
pub(super) const SLOW: u8 = 4;

/// Running totals; each field can be briefly off by the number of racing writers (never
/// garbage: negative values read as zero).
#[derive(Debug, Default)]
struct Totals {
    calls: AtomicI64,
    failures: AtomicI64,
    slow: AtomicI64,
}

impl Totals {
    fn apply(&self, code: u8, sign: i64) {
        if code == 0 {
            return;
        }
        self.calls.fetch_add(sign, Ordering::Relaxed);
        if code & FAIL != 0 {
            self.failures.fetch_add(sign, Ordering::Relaxed);
        }
        if code & SLOW != 0 {
            self.slow.fetch_add(sign, Ordering::Relaxed);
        }
    }

    fn apply_packed(&self, packed: u64, sign: i64) {
        let (c, f, s) = unpack(packed);
        self.calls.fetch_add(sign * c as i64, Ordering::Relaxed);
        self.failures.fetch_add(sign * f as i64, Ordering::Relaxed);
        self.slow.fetch_add(sign * s as i64, Ordering::Relaxed);
    }

    fn read(&self) -> WindowCounts {
        let get = |a: &AtomicI64| a.load(Ordering::Relaxed).max(0) as u64;
        WindowCounts { calls: get(&self.calls), failures: get(&self.failures), slow: get(&self.slow) }
    }
}

/// Whether a record changed the window's contents (only then can the rates change).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Change {
    Changed,
    Unchanged,
}

/// The last `size` calls in a ring of one-byte slots.
///
/// Each slot holds an outcome code (low 3 bits) tagged with the window's epoch (high 5
/// bits); the totals are one word holding the epoch and the three counts, so a reader
/// always sees a consistent triple. Resetting is O(1): bump the epoch and zero the
/// counts; slots of older epochs then read as empty. (Every 32 resets the tags would
/// repeat, so the slots are also cleared then; resets happen at most once per open
/// period, when no current-generation call writes the window.)
///
/// Record: a load of the totals, one `fetch_add` for the position and one load of the
/// slot; only when the slot's outcome changes, a swap and a CAS of the totals. A write
/// that raced with a reset is dropped (its epoch is stale) and an evicted newer value is
/// put back.
///
/// The position is one cursor per thread group ([`CURSORS`], each on its own cache
/// line, a thread's group fixed when it first records): one shared position made every
/// call of two threads a locked add on the same line, which made a window holding any
/// failure several times slower on two threads than on one. Each cursor walks the whole
/// ring, starting at its own place, so a single thread still holds exactly its last
/// `size` calls; with several threads each slot holds whichever cursor wrote it last,
/// and the ring holds about the last `size` calls of all of them (exactly when they call
/// at the same rate), in no particular order — the window's counts, not its order, are
/// what the breaker reads.
#[derive(Debug)]
pub(super) struct CountWindow {
    slots: Box<[AtomicU8]>,
    /// Lemire's fastmod constant for `slots.len()`.
    magic: u64,
    cursors: Box<[Cursor; CURSORS]>,
    /// epoch (bits 0..5) | calls (5..24) | failures (24..44) | slow (44..64)
    totals: AtomicU64,
}

/// Cursors of a [`CountWindow`]: more than the cores that commonly share one breaker
/// (threads beyond it share a cursor, which is correct, only slower).
const CURSORS: usize = 4;

/// A ring position alone on its cache line.
#[derive(Debug, Default)]
#[repr(align(64))]
struct Cursor(AtomicU32);

/// The cursor group of the calling thread: given in turn to threads as they first record.
#[inline]
fn cursor_of_thread() -> usize {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    thread_local! {
        static GROUP: usize = NEXT.fetch_add(1, Ordering::Relaxed) % CURSORS;
    }
    GROUP.with(|g| *g)
}

const EPOCH_MASK: u64 = 0x1f;
const CALLS_SHIFT: u32 = 5;
const FAILURES_SHIFT: u32 = 24;
const SLOW_SHIFT: u32 = 44;
const CALLS_MASK: u64 = (1 << 19) - 1;
const TWENTY_MASK: u64 = (1 << 20) - 1;

fn decode(t: u64) -> WindowCounts {
    WindowCounts {
        calls: (t >> CALLS_SHIFT) & CALLS_MASK,
        failures: (t >> FAILURES_SHIFT) & TWENTY_MASK,
        slow: (t >> SLOW_SHIFT) & TWENTY_MASK,
    }
}

fn encode(epoch: u64, c: WindowCounts) -> u64 {
    epoch
        | (c.calls.min(CALLS_MASK) << CALLS_SHIFT)
        | (c.failures.min(TWENTY_MASK) << FAILURES_SHIFT)
        | (c.slow.min(TWENTY_MASK) << SLOW_SHIFT)
}

/// The totals after replacing outcome `old` (0 = empty) by `new`.
fn replace(t: u64, new: u8, old: u8) -> u64 {
    let mut c = decode(t);
    let add = |n: &mut u64, on: bool| *n = n.saturating_add(u64::from(on));
    let sub = |n: &mut u64, on: bool| *n = n.saturating_sub(u64::from(on));
    add(&mut c.calls, new != 0);
    add(&mut c.failures, new & FAIL != 0);
    add(&mut c.slow, new & SLOW != 0);
    sub(&mut c.calls, old != 0);
    sub(&mut c.failures, old & FAIL != 0);
    sub(&mut c.slow, old & SLOW != 0);
    encode(t & EPOCH_MASK, c)
}

impl CountWindow {
    pub(super) fn new(size: u32) -> Self {
        let size = size.clamp(1, CALLS_MASK as u32);
        // Each cursor starts at its own part of the ring, so that two threads write
        // (rarely: only changed outcomes are written) different cache lines.
        let start = |k: usize| Cursor(AtomicU32::new((u64::from(size) * k as u64 / CURSORS as u64) as u32));
        Self {
            slots: (0..size).map(|_| AtomicU8::new(0)).collect(),
            magic: (u64::MAX / u64::from(size)).wrapping_add(1),
            cursors: Box::new(std::array::from_fn(start)),
            totals: AtomicU64::new(0),
        }
    }

    #[inline]
    fn index(&self, pos: u32) -> usize {
        let low = self.magic.wrapping_mul(u64::from(pos));
        ((u128::from(low) * self.slots.len() as u128) >> 64) as usize
    }

    #[inline]
    pub(super) fn record(&self, code: u8) -> Change {
        let epoch = self.totals.load(Ordering::Acquire) & EPOCH_MASK;
        let tagged = ((epoch as u8) << 3) | code;
        let cursor = &self.cursors[cursor_of_thread()].0;
        let slot = &self.slots[self.index(cursor.fetch_add(1, Ordering::Relaxed))];
        // Writing the value a slot already holds changes nothing: linearize at the load.
        if slot.load(Ordering::Relaxed) == tagged {
            return Change::Unchanged;
        }
        let old = slot.swap(tagged, Ordering::AcqRel);
        let old_epoch = u64::from(old >> 3);
        let old_code = if old_epoch == epoch { old & 0b111 } else { 0 };
        if old_code == code {
            return Change::Unchanged;
        }
        let updated = self.totals.fetch_update(Ordering::AcqRel, Ordering::Acquire, |t| {
            (t & EPOCH_MASK == epoch).then(|| replace(t, code, old_code))
        });
        if updated.is_err() {
            // A reset happened after we read the epoch: our write belongs to the old
            // window and reads as empty; if we evicted a value of the new window, put it
            // back.
            if old_epoch == (epoch + 1) & EPOCH_MASK {
                let _ = slot.compare_exchange(tagged, old, Ordering::AcqRel, Ordering::Relaxed);
            }
            return Change::Unchanged;
        }
        Change::Changed
    }

    /// Empties the window in O(1) (see the type's docs).
    pub(super) fn reset(&self) {
        if self.totals.load(Ordering::Acquire) & EPOCH_MASK == EPOCH_MASK {
            // The next epoch is 0 again: clear the tags first, while values written now
            // still carry the old epoch and are dropped by the bump below.
            for slot in &self.slots[..] {
                slot.store(0, Ordering::Release);
            }
        }
        let _ = self
            .totals
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |t| Some(((t & EPOCH_MASK) + 1) & EPOCH_MASK));
    }

    pub(super) fn counts(&self) -> WindowCounts {
        decode(self.totals.load(Ordering::Acquire))
    }

    /// Calls the window holds when full.
    pub(super) fn len(&self) -> u64 {
        self.slots.len() as u64
    }
}

/// Field width of a packed time bucket: calls, failures, slow calls of one second.
const BITS: u32 = 21;
const MASK: u64 = (1 << BITS) - 1;

fn pack(code: u8) -> u64 {
    1 | (u64::from(code & FAIL != 0) << BITS) | (u64::from(code & SLOW != 0) << (2 * BITS))
}

fn unpack(v: u64) -> (u64, u64, u64) {
    (v & MASK, (v >> BITS) & MASK, (v >> (2 * BITS)) & MASK)
}

/// The last `seconds` seconds in one-second buckets of packed counts (up to 2^21 − 1
/// calls per second per breaker), with running totals. Buckets that fall out of the
/// window are subtracted lazily by whichever call first notices a new second, so old
/// failures stop counting even without traffic (checked again on every read).
/// Time is monotonic (`tokio::time::Instant`): wall-clock jumps change nothing (CB-6).
#[derive(Debug)]
pub(super) struct TimeWindow {
    buckets: Box<[AtomicU64]>,
    /// Newest second seen, counted from `origin`.
    head: AtomicU64,
    origin: Instant,
    totals: Totals,
}

impl TimeWindow {
    pub(super) fn new(seconds: u32, origin: Instant) -> Self {
        Self {
            buckets: (0..seconds.max(1)).map(|_| AtomicU64::new(0)).collect(),
            head: AtomicU64::new(0),
            origin,
            totals: Totals::default(),
        }
    }

    fn second(&self, now: Instant) -> u64 {
        now.saturating_duration_since(self.origin).as_secs()
    }

    fn advance(&self, s: u64) {
        let len = self.buckets.len() as u64;
        let mut h = self.head.load(Ordering::Acquire);
        while s > h {
            match self.head.compare_exchange_weak(h, s, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => {
                    // Seconds h+1..=s start anew; at most a full turn of the ring.
                    for t in (h + 1).max(s.saturating_sub(len - 1))..=s {
                        let old = self.buckets[(t % len) as usize].swap(0, Ordering::AcqRel);
                        if old != 0 {
                            self.totals.apply_packed(old, -1);
                        }
                    }
                    return;
                }
                Err(cur) => h = cur,
            }
        }
    }

    pub(super) fn record(&self, code: u8, now: Instant) -> Change {
        let s = self.second(now);
        self.advance(s);
        let len = self.buckets.len() as u64;
        if s + len <= self.head.load(Ordering::Acquire) {
            // A result so late its second has left the window.
            return Change::Unchanged;
        }
        self.buckets[(s % len) as usize].fetch_add(pack(code), Ordering::AcqRel);
        self.totals.apply(code, 1);
        Change::Changed
    }

    pub(super) fn counts(&self, now: Instant) -> WindowCounts {
        self.advance(self.second(now));
        self.totals.read()
    }
}

/// A count- or time-based window, with the shape it was built from.
#[derive(Debug)]
pub(super) enum SlidingWindow {
    Count(CountWindow),
    Time(TimeWindow),
}

impl SlidingWindow {
    pub(super) fn new(shape: policy::Window) -> Self {
        match shape {
            policy::Window::Count { size } => SlidingWindow::Count(CountWindow::new(size)),
            policy::Window::Time { seconds } => SlidingWindow::Time(TimeWindow::new(seconds, Instant::now())),
        }
    }

    #[inline]
    pub(super) fn record(&self, code: u8) -> Change {
        match self {
            SlidingWindow::Count(w) => w.record(code),
            SlidingWindow::Time(w) => w.record(code, Instant::now()),
        }
    }

    pub(super) fn counts(&self) -> WindowCounts {
        match self {
            SlidingWindow::Count(w) => w.counts(),
            SlidingWindow::Time(w) => w.counts(Instant::now()),
        }
    }
}

use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use tokio::time::Instant;

use crate::metrics_names::{self as names, Labels, LateCounter, LateGauge};
use crate::policy;

/// "Not ejected" in `ejected_until`.
const NOT_EJECTED: u64 = 0;

#[derive(Debug)]
struct Endpoint<E> {
    value: E,
    consecutive_errors: AtomicU32,
    /// ms since origin (+1, so 0 means not ejected) until which it is out.
    ejected_until: AtomicU64,
    times_ejected: AtomicU32,
}

/// State of one endpoint, for status reports and tests.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EndpointStatus {
    /// Position of the endpoint in the pool.
    pub index: usize,
    /// Whether it is ejected now.
    pub ejected: bool,
    /// Its ejection multiplier (times ejected, decayed by one per healthy interval).
    pub times_ejected: u32,
    /// Consecutive errors since its last success.
    pub consecutive_errors: u32,
}

/// Ejects endpoints that fail repeatedly from a load-balancing pool (Envoy's outlier
/// detection, `consecutive_5xx` flavour).
///
/// * An endpoint is ejected when it reaches `consecutive_errors` consecutive errors (a
///   success resets the count), for `base_ejection_time × times ejected` (the multiplier
///   grows with each ejection and shrinks by one for each sweep it spends in the pool).
/// * Every `interval` a sweep (run lazily by the first call after it is due) returns the
///   endpoints whose ejection time is over.
/// * At most `max_ejection_percent` of the pool (percent 0..100, at least one endpoint
///   when the percentage is above zero, as in Envoy) is ejected at once, and never the
///   whole pool: at least one endpoint always stays.
///
/// Lock-free: per-endpoint atomics and one counter of ejected endpoints.
#[derive(Debug)]
pub struct OutlierDetector<E> {
    endpoints: Box<[Endpoint<E>]>,
    consecutive_errors: AtomicU32,
    interval_ms: AtomicU64,
    base_ejection_ms: AtomicU64,
    max_ejection_percent: AtomicU32,
    ejected: AtomicU32,
    next_sweep: AtomicU64,
    next_pick: AtomicUsize,
    origin: Instant,
    ejections: LateCounter,
    ejected_gauge: LateGauge,
}

fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX / 4)
}

impl<E> OutlierDetector<E> {
    /// A detector over `endpoints`, none ejected. Metrics not registered.
    pub fn new(settings: &policy::OutlierDetection, endpoints: Vec<E>) -> Self {
        Self::build(settings, endpoints, LateCounter::noop(), LateGauge::noop())
    }

    /// As [`OutlierDetector::new`], registering
    /// [`OUTLIER_EJECTIONS`](crate::metrics_names::OUTLIER_EJECTIONS) and
    /// [`OUTLIER_EJECTED`](crate::metrics_names::OUTLIER_EJECTED) with `labels`.
    pub fn with_metrics(settings: &policy::OutlierDetection, endpoints: Vec<E>, labels: &Labels) -> Self {
        Self::build(
            settings,
            endpoints,
            LateCounter::new(labels, names::OUTLIER_EJECTIONS),
            LateGauge::new(labels, names::OUTLIER_EJECTED),
        )
    }

    fn build(
        settings: &policy::OutlierDetection,
        endpoints: Vec<E>,
        ejections: LateCounter,
        ejected_gauge: LateGauge,
    ) -> Self {
        let endpoints = endpoints
            .into_iter()
            .map(|value| Endpoint {
                value,
                consecutive_errors: AtomicU32::new(0),
                ejected_until: AtomicU64::new(NOT_EJECTED),
                times_ejected: AtomicU32::new(0),
            })
            .collect();
        let d = Self {
            endpoints,
            consecutive_errors: AtomicU32::new(0),
            interval_ms: AtomicU64::new(0),
            base_ejection_ms: AtomicU64::new(0),
            max_ejection_percent: AtomicU32::new(0),
            ejected: AtomicU32::new(0),
            next_sweep: AtomicU64::new(0),
            next_pick: AtomicUsize::new(0),
            origin: Instant::now(),
            ejections,
            ejected_gauge,
        };
        d.update(settings);
        d.next_sweep.store(d.interval_ms.load(Ordering::Relaxed), Ordering::Relaxed);
        d
    }

    /// Applies new settings live; ejections in force and multipliers are kept (a lower
    /// maximum only prevents new ejections).
    pub fn update(&self, settings: &policy::OutlierDetection) {
        self.consecutive_errors.store(settings.consecutive_errors.max(1), Ordering::Relaxed);
        self.interval_ms.store(ms(settings.interval).max(1), Ordering::Relaxed);
        self.base_ejection_ms.store(ms(settings.base_ejection_time), Ordering::Relaxed);
        self.max_ejection_percent.store(settings.max_ejection_percent.min(100), Ordering::Relaxed);
    }

    fn now_ms(&self) -> u64 {
        ms(Instant::now().saturating_duration_since(self.origin))
    }

    /// Most endpoints that may be ejected at once.
    pub fn max_ejected(&self) -> u32 {
        let n = self.endpoints.len() as u32;
        let pct = self.max_ejection_percent.load(Ordering::Relaxed);
        if pct == 0 || n < 2 {
            return 0;
        }
        ((u64::from(n) * u64::from(pct) / 100) as u32).max(1).min(n - 1)
    }

    /// Number of endpoints in the pool.
    pub fn len(&self) -> usize {
        self.endpoints.len()
    }

    /// Whether the pool is empty.
    pub fn is_empty(&self) -> bool {
        self.endpoints.is_empty()
    }

    /// Endpoints ejected now.
    pub fn ejected_count(&self) -> u32 {
        self.ejected.load(Ordering::Relaxed)
    }

    /// Records the result of a call to endpoint `index` (ignored when out of range);
    /// may eject it. `success` is whether the endpoint did its job.
    pub fn record(&self, index: usize, success: bool) {
        let Some(ep) = self.endpoints.get(index) else { return };
        let now = self.now_ms();
        self.sweep_if_due(now);
        if success {
            if ep.consecutive_errors.load(Ordering::Relaxed) != 0 {
                ep.consecutive_errors.store(0, Ordering::Relaxed);
            }
            return;
        }
        let errors = ep.consecutive_errors.fetch_add(1, Ordering::Relaxed) + 1;
        if errors < self.consecutive_errors.load(Ordering::Relaxed)
            || ep.ejected_until.load(Ordering::Acquire) != NOT_EJECTED
        {
            return;
        }
        let max = self.max_ejected();
        if self
            .ejected
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |c| (c < max).then_some(c + 1))
            .is_err()
        {
            return; // the pool may not lose more endpoints; the count keeps growing
        }
        let times = ep.times_ejected.load(Ordering::Relaxed) + 1;
        let until = now + self.base_ejection_ms.load(Ordering::Relaxed).saturating_mul(u64::from(times)) + 1;
        if ep.ejected_until.compare_exchange(NOT_EJECTED, until, Ordering::AcqRel, Ordering::Acquire).is_err()
        {
            self.ejected.fetch_sub(1, Ordering::AcqRel); // another caller ejected it first
            return;
        }
        ep.times_ejected.store(times, Ordering::Relaxed);
        ep.consecutive_errors.store(0, Ordering::Relaxed);
        self.ejections.increment(1);
        self.ejected_gauge.set(f64::from(self.ejected.load(Ordering::Relaxed)));
        tracing::info!(endpoint = index, times_ejected = times, "outlier ejected");
    }

    fn sweep_if_due(&self, now: u64) {
        let due = self.next_sweep.load(Ordering::Acquire);
        if now < due {
            return;
        }
        // Sweeps stay on a fixed grid (every `interval` from the start), as Envoy's timer.
        let interval = self.interval_ms.load(Ordering::Relaxed);
        let next = due + interval * ((now - due) / interval + 1);
        if self.next_sweep.compare_exchange(due, next, Ordering::AcqRel, Ordering::Acquire).is_err() {
            return;
        }
        for (i, ep) in self.endpoints.iter().enumerate() {
            let until = ep.ejected_until.load(Ordering::Acquire);
            if until == NOT_EJECTED {
                let _ =
                    ep.times_ejected.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |t| t.checked_sub(1));
            } else if until - 1 <= now
                && ep
                    .ejected_until
                    .compare_exchange(until, NOT_EJECTED, Ordering::AcqRel, Ordering::Acquire)
                    .is_ok()
            {
                self.ejected.fetch_sub(1, Ordering::AcqRel);
                tracing::info!(endpoint = i, "outlier returned to the pool");
            }
        }
        self.ejected_gauge.set(f64::from(self.ejected.load(Ordering::Relaxed)));
    }

    /// Whether endpoint `index` is ejected now.
    pub fn is_ejected(&self, index: usize) -> bool {
        self.endpoints.get(index).is_some_and(|e| e.ejected_until.load(Ordering::Acquire) != NOT_EJECTED)
    }

    /// Picks the next endpoint round robin, skipping ejected ones. Returns its index and
    /// value; `None` only for an empty pool. Runs a due sweep first.
    pub fn pick(&self) -> Option<(usize, &E)> {
        let n = self.endpoints.len();
        if n == 0 {
            return None;
        }
        self.sweep_if_due(self.now_ms());
        // Round robin over the endpoints in the pool: the k-th one not ejected, so an
        // ejected endpoint's share is spread evenly rather than given to its neighbour.
        let start = self.next_pick.fetch_add(1, Ordering::Relaxed);
        let healthy = n - (self.ejected.load(Ordering::Relaxed) as usize).min(n - 1);
        let k = start % healthy;
        let mut first = None;
        let mut seen = 0;
        for (i, ep) in self.endpoints.iter().enumerate() {
            if ep.ejected_until.load(Ordering::Acquire) == NOT_EJECTED {
                if seen == k {
                    return Some((i, &ep.value));
                }
                first = first.or(Some(i));
                seen += 1;
            }
        }
        // Ejections raced with this pick: take the first endpoint in the pool (one always
        // stays), or any endpoint if even that changed under us.
        let i = first.unwrap_or(start % n);
        Some((i, &self.endpoints[i].value))
    }

    /// Every endpoint's state.
    pub fn status(&self) -> Vec<EndpointStatus> {
        self.endpoints
            .iter()
            .enumerate()
            .map(|(index, e)| EndpointStatus {
                index,
                ejected: e.ejected_until.load(Ordering::Acquire) != NOT_EJECTED,
                times_ejected: e.times_ejected.load(Ordering::Relaxed),
                consecutive_errors: e.consecutive_errors.load(Ordering::Relaxed),
            })
            .collect()
    }
}

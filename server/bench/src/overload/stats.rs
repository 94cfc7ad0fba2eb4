//! Figures of one load step, from the client's samples.

use std::time::Duration;

use serde::Serialize;

use super::load::{CRITICALITIES, Outcome, Sample};

/// What one protection did at one offered load.
#[derive(Clone, Debug, Serialize)]
pub struct Step {
    /// Offered load as a multiple of the service's capacity.
    pub multiple: f64,
    pub offered_rps: f64,
    /// Requests answered 2xx within their deadline, per second.
    pub goodput_rps: f64,
    /// Median and 99th percentile latency of the admitted requests (not refused by the
    /// protection: answered, or given up at the deadline, which counts as the deadline), ms.
    pub p50_admitted_ms: f64,
    pub p99_admitted_ms: f64,
    /// Share refused by the protection (503/429).
    pub rejected_ratio: f64,
    /// Share given up by the client at the deadline.
    pub timed_out_ratio: f64,
    /// Per criticality (CRITICAL, SHEDDABLE_PLUS, SHEDDABLE): share of the requests sent
    /// that were answered 2xx within their deadline.
    pub goodput_ratio_by_criticality: [f64; 3],
    /// Per criticality: requests answered 2xx within their deadline, per second (they add
    /// up to `goodput_rps`).
    pub goodput_rps_by_criticality: [f64; 3],
    /// p99 of the admitted requests of each criticality (as `p99_admitted_ms`), ms: says
    /// which class a high p99 comes from.
    pub p99_admitted_ms_by_criticality: [f64; 3],
}

impl Step {
    /// The figures of `samples` sent during `window` (intended send times), offered at
    /// `multiple` × capacity with deadline `budget`.
    pub fn measure(
        multiple: f64,
        samples: &[Sample],
        window: (Duration, Duration),
        budget: Duration,
    ) -> Self {
        let in_window: Vec<&Sample> =
            samples.iter().filter(|s| s.at >= window.0 && s.at < window.1).collect();
        let secs = (window.1 - window.0).as_secs_f64();
        let n = in_window.len().max(1) as f64;
        let good = in_window.iter().filter(|s| s.good(budget)).count();
        let mut admitted: Vec<Duration> =
            in_window.iter().filter(|s| !s.rejected()).map(|s| s.latency.min(budget)).collect();
        admitted.sort_unstable();
        let mut by_crit = [0.0; 3];
        let mut rps_by_crit = [0.0; 3];
        let mut p99_by_crit = [0.0; 3];
        for (i, c) in CRITICALITIES.iter().enumerate() {
            let sent: Vec<_> = in_window.iter().filter(|s| s.criticality == *c).collect();
            let mut lat: Vec<Duration> =
                sent.iter().filter(|s| !s.rejected()).map(|s| s.latency.min(budget)).collect();
            lat.sort_unstable();
            p99_by_crit[i] = percentile_ms(&lat, 0.99);
            let good = sent.iter().filter(|s| s.good(budget)).count() as f64;
            rps_by_crit[i] = good / secs;
            by_crit[i] = if sent.is_empty() { 1.0 } else { good / sent.len() as f64 };
        }
        Self {
            multiple,
            offered_rps: in_window.len() as f64 / secs,
            goodput_rps: good as f64 / secs,
            p50_admitted_ms: percentile_ms(&admitted, 0.50),
            p99_admitted_ms: percentile_ms(&admitted, 0.99),
            rejected_ratio: in_window.iter().filter(|s| s.rejected()).count() as f64 / n,
            timed_out_ratio: in_window.iter().filter(|s| s.outcome == Outcome::TimedOut).count() as f64 / n,
            goodput_ratio_by_criticality: by_crit,
            goodput_rps_by_criticality: rps_by_crit,
            p99_admitted_ms_by_criticality: p99_by_crit,
        }
    }
}

/// The `q` quantile of sorted durations, in milliseconds (nearest rank); 0 when empty.
pub fn percentile_ms(sorted: &[Duration], q: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1].as_secs_f64() * 1000.0
}

/// Rounds for printing: 3 significant decimals are plenty for these figures.
pub fn round3(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

#[cfg(test)]
mod tests {
    use http::StatusCode;
    use levee_agent::policy::Criticality;

    use super::*;

    fn sample(at_ms: u64, c: Criticality, outcome: Outcome, latency_ms: u64) -> Sample {
        Sample {
            at: Duration::from_millis(at_ms),
            criticality: c,
            route: 0,
            outcome,
            latency: Duration::from_millis(latency_ms),
            degraded: false,
        }
    }

    #[test]
    fn percentiles_are_nearest_rank() {
        let d: Vec<Duration> = (1..=100).map(Duration::from_millis).collect();
        assert_eq!(percentile_ms(&d, 0.5), 50.0);
        assert_eq!(percentile_ms(&d, 0.99), 99.0);
        assert_eq!(percentile_ms(&d[..1], 0.99), 1.0);
        assert_eq!(percentile_ms(&[], 0.99), 0.0);
    }

    /// Goodput counts 2xx within the deadline only; shed requests are not admitted; a
    /// request given up at the deadline is admitted, at the deadline; samples outside the
    /// window are ignored.
    #[test]
    fn a_step_is_measured_from_its_window() {
        let ok = Outcome::Answered(StatusCode::OK);
        let shed = Outcome::Answered(StatusCode::SERVICE_UNAVAILABLE);
        let budget = Duration::from_millis(500);
        let samples = [
            sample(0, Criticality::Critical, ok, 10), // before the window
            sample(1000, Criticality::Critical, ok, 100),
            sample(1100, Criticality::Sheddable, shed, 1),
            sample(1200, Criticality::Sheddable, Outcome::TimedOut, 500),
            sample(1300, Criticality::SheddablePlus, ok, 600), // answered late
        ];
        let s = Step::measure(3.0, &samples, (Duration::from_secs(1), Duration::from_secs(2)), budget);
        assert_eq!((s.offered_rps, s.goodput_rps), (4.0, 1.0));
        assert_eq!((s.rejected_ratio, s.timed_out_ratio), (0.25, 0.25));
        // Admitted latencies 100, 500 (given up), 500 (600 capped at the deadline).
        assert_eq!((s.p50_admitted_ms, s.p99_admitted_ms), (500.0, 500.0));
        assert_eq!(s.goodput_ratio_by_criticality, [1.0, 0.0, 0.0]);
        assert_eq!(s.goodput_rps_by_criticality, [1.0, 0.0, 0.0]);
        // Per class: CRITICAL 100; SHEDDABLE_PLUS 500 (600 capped); SHEDDABLE 500 (given up).
        assert_eq!(s.p99_admitted_ms_by_criticality, [100.0, 500.0, 500.0]);
    }
}

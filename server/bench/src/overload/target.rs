//! `levee-bench overload --target URL`: load to failure against any HTTP service (article
//! §10.3: test to failure, not to a target). The same open-loop generator as the
//! harness ([`Generator`]: scheduled send times, latency from the intended send time,
//! a `levee-criticality` header drawn from the mix and a `levee-deadline-ms` header on
//! every request, the client giving up at that deadline) is pointed at a URL:
//!
//! 1. **Capacity**: given (`--capacity`), or found by a probe, an open-loop ramp from
//!    `--probe-start` rps growing by [`PROBE_GROWTH`] per short step until fewer than
//!    [`PROBE_GOOD`] of a step's requests are answered 2xx within the deadline (or
//!    `--max-rps` is reached); the capacity is the highest goodput a probe step measured.
//! 2. **Ramp**: steps at multiples of that capacity (`--multiples`, default 0.5× to 5×),
//!    each measured after a warm-up: offered rps, goodput, goodput per criticality, p50 /
//!    p99 of what was admitted, refused (503/429) and late shares.
//! 3. **Where goodput falls**: the peak step, the first step after it whose goodput is
//!    below [`FALL`] × the peak, and per criticality the first step where fewer than
//!    [`FALL`] of that class's requests were answered in time.
//!
//! The last line printed is one JSON object ([`summary`]); `--plot` draws the curves
//! ([`super::target_plot`]). `--max-rps` bounds every rate the run offers: the generator
//! is open-loop and does not slow down with the service.

use std::time::Duration;

use anyhow::{Context, anyhow, bail, ensure};
use clap::Args as ClapArgs;
use http::{HeaderName, HeaderValue, Method, Uri};
use serde::Serialize;
use serde_json::{Value, json};

use super::load::{Generator, Mix, Phase, Sample, Target};
use super::stats::{Step, round3};

/// A probe step goes on to the next rate while at least this share of its requests is
/// answered 2xx within the deadline.
pub const PROBE_GOOD: f64 = 0.95;
/// Each probe step offers this many times the previous one's rate.
pub const PROBE_GROWTH: f64 = 1.5;
/// Goodput has "fallen" at the first step after the peak below this share of the peak; a
/// criticality has fallen at the first step where less than this share of it is good.
pub const FALL: f64 = 0.9;
/// Default multiples of the capacity the ramp offers.
const MULTIPLES: [f64; 7] = [0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 5.0];
const SMOKE_MULTIPLES: [f64; 4] = [0.5, 1.0, 2.0, 4.0];
const SEED: u64 = 0x7a26_e7ed;

/// Options of `levee-bench overload` that point it at a service of one's own.
#[derive(Debug, Clone, ClapArgs)]
pub struct TargetOpts {
    /// Drive this HTTP service to failure instead of the harness' own: `http://host:port/path`
    /// (plain HTTP; the path and query are requested as given).
    #[arg(long, value_name = "URL")]
    pub target: Option<String>,
    /// HTTP method of the requests sent to --target.
    #[arg(long, default_value = "GET", requires = "target")]
    pub method: String,
    /// The target's capacity in requests/s, if known; otherwise a probe finds it.
    #[arg(long, value_name = "RPS", requires = "target")]
    pub capacity: Option<f64>,
    /// First rate of the capacity probe, requests/s.
    #[arg(long, default_value_t = 20.0, value_name = "RPS", requires = "target")]
    pub probe_start: f64,
    /// No step (probe or ramp) offers more than this, requests/s.
    #[arg(long, default_value_t = 5000.0, value_name = "RPS", requires = "target")]
    pub max_rps: f64,
    /// Criticality mix in per mille, CRITICAL,SHEDDABLE_PLUS,SHEDDABLE (sums to 1000),
    /// sent as the `levee-criticality` header.
    #[arg(long, default_value = "100,300,600", value_name = "C,S+,S", requires = "target")]
    pub mix: String,
    /// Deadline of every request (`levee-deadline-ms`); the client gives up at it and a
    /// later answer is not goodput. Levee's duration syntax (`500ms`, `1.5s`).
    #[arg(long, default_value = "500ms", requires = "target")]
    pub deadline: String,
    /// Offered load of the ramp's steps, as multiples of the capacity (comma-separated).
    #[arg(long, value_delimiter = ',', value_name = "X,...", requires = "target")]
    pub multiples: Vec<f64>,
    /// A header sent with every request, `name: value` (repeatable), e.g. authentication.
    #[arg(long = "header", value_name = "NAME: VALUE", requires = "target")]
    pub headers: Vec<String>,
}

/// A checked `--target` run.
#[derive(Debug, Clone)]
pub struct Plan {
    /// `http://host:port`.
    pub base: String,
    /// Path and query.
    pub path: String,
    pub method: Method,
    pub capacity: Option<f64>,
    pub probe_start: f64,
    pub max_rps: f64,
    pub mix: Mix,
    pub deadline: Duration,
    pub multiples: Vec<f64>,
    pub headers: Vec<(HeaderName, HeaderValue)>,
    /// Seconds of each probe step; warm-up and measured seconds of each ramp step.
    pub probe_secs: f64,
    pub warmup: Duration,
    pub measure: Duration,
}

impl TargetOpts {
    /// Checks every option, naming the option and what it accepts on error.
    pub fn plan(&self, smoke: bool, step_secs: Option<f64>) -> anyhow::Result<Plan> {
        let url = self.target.as_deref().ok_or_else(|| anyhow!("--target is required"))?;
        let (base, path) = split_url(url)?;
        let method = Method::from_bytes(self.method.as_bytes())
            .map_err(|_| anyhow!("--method {:?} is not an HTTP method", self.method))?;
        let positive = |name: &str, v: f64| -> anyhow::Result<f64> {
            ensure!(v.is_finite() && v > 0.0, "{name} must be a positive number of requests/s, got {v}");
            Ok(v)
        };
        let capacity = self.capacity.map(|c| positive("--capacity", c)).transpose()?;
        let probe_start = positive("--probe-start", self.probe_start)?;
        let max_rps = positive("--max-rps", self.max_rps)?;
        ensure!(
            probe_start <= max_rps,
            "--probe-start ({probe_start}) must not exceed --max-rps ({max_rps})"
        );
        let mix = parse_mix(&self.mix)?;
        let deadline =
            levee_agent::policy::duration::parse(&self.deadline).map_err(|e| anyhow!("--deadline: {e}"))?;
        ensure!(
            deadline >= Duration::from_millis(1) && deadline <= Duration::from_secs(60),
            "--deadline must be between 1ms and 60s, got {}",
            self.deadline
        );
        let multiples = if self.multiples.is_empty() {
            (if smoke { &SMOKE_MULTIPLES[..] } else { &MULTIPLES[..] }).to_vec()
        } else {
            self.multiples.clone()
        };
        ensure!(
            multiples.iter().all(|m| m.is_finite() && *m > 0.0 && *m <= 100.0),
            "--multiples must be numbers in (0, 100], got {multiples:?}"
        );
        ensure!(
            multiples.windows(2).all(|w| w[0] < w[1]),
            "--multiples must be increasing, got {multiples:?}"
        );
        let headers = self.headers.iter().map(|h| parse_header(h)).collect::<anyhow::Result<Vec<_>>>()?;
        let measure = Duration::from_secs_f64(step_secs.unwrap_or(if smoke { 1.5 } else { 8.0 }));
        ensure!(measure >= Duration::from_millis(200), "--step-secs must be at least 0.2");
        Ok(Plan {
            base,
            path,
            method,
            capacity,
            probe_start,
            max_rps,
            mix,
            deadline,
            multiples,
            headers,
            probe_secs: if smoke { 1.0 } else { 3.0 },
            warmup: measure / 4,
            measure,
        })
    }
}

/// `http://host:port/path?query` → (`http://host:port`, `/path?query`).
fn split_url(url: &str) -> anyhow::Result<(String, String)> {
    let uri: Uri = url.parse().with_context(|| format!("--target {url:?} is not a URL"))?;
    match uri.scheme_str() {
        Some("http") => {}
        Some(other) => bail!("--target {url:?}: scheme {other:?} is not supported, only http"),
        None => bail!("--target {url:?} needs a scheme: http://host:port/path"),
    }
    let authority = uri.authority().ok_or_else(|| anyhow!("--target {url:?} has no host"))?;
    let path = uri.path_and_query().map_or("/", |p| p.as_str());
    let path = if path.is_empty() { "/" } else { path };
    Ok((format!("http://{authority}"), path.to_string()))
}

/// `C,S+,S` per mille → [`Mix`].
fn parse_mix(s: &str) -> anyhow::Result<Mix> {
    let parts: Vec<&str> = s.split(',').map(str::trim).collect();
    ensure!(
        parts.len() == 3,
        "--mix takes three per-mille shares CRITICAL,SHEDDABLE_PLUS,SHEDDABLE, got {s:?}"
    );
    let mut shares = [0u32; 3];
    for (share, p) in shares.iter_mut().zip(&parts) {
        *share = p.parse().map_err(|_| anyhow!("--mix: {p:?} is not a whole number of per mille"))?;
    }
    let sum: u32 = shares.iter().sum();
    ensure!(sum == 1000, "--mix shares must add up to 1000 per mille, got {sum} ({s:?})");
    Ok(Mix(shares))
}

/// `name: value` → a header.
fn parse_header(s: &str) -> anyhow::Result<(HeaderName, HeaderValue)> {
    let (name, value) = s.split_once(':').ok_or_else(|| anyhow!("--header {s:?} must be `name: value`"))?;
    let name = HeaderName::from_bytes(name.trim().as_bytes())
        .map_err(|_| anyhow!("--header {s:?}: {:?} is not a header name", name.trim()))?;
    let value = HeaderValue::from_str(value.trim())
        .map_err(|_| anyhow!("--header {s:?}: the value is not a valid header value"))?;
    Ok((name, value))
}

/// One step of the capacity probe.
#[derive(Clone, Debug, Serialize)]
pub struct ProbeStep {
    pub offered_rps: f64,
    pub goodput_rps: f64,
    /// Share of the step's requests answered 2xx within the deadline.
    pub good_ratio: f64,
    pub p99_admitted_ms: f64,
}

/// Where the capacity came from.
#[derive(Clone, Debug)]
pub struct Capacity {
    pub rps: f64,
    /// `"given"`, `"probe"`, or `"max_rps"` when the probe reached `--max-rps` with the
    /// service still keeping up (the figure is then a lower bound).
    pub source: &'static str,
    pub probe: Vec<ProbeStep>,
}

/// What a whole `--target` run measured.
#[derive(Clone, Debug)]
pub struct Run {
    pub capacity: Capacity,
    pub steps: Vec<Step>,
}

/// Runs the probe (unless the capacity is given) and the ramp against the target.
pub async fn run(plan: &Plan) -> anyhow::Result<Run> {
    // The run's one copy of the path; the generator's targets are 'static.
    let path: &'static str = Box::leak(plan.path.clone().into_boxed_str());
    let target =
        Target { method: plan.method.clone(), path, share: 1000, send_criticality: true, class: None };
    let generator = Generator::with_base(plan.base.clone(), vec![target], plan.mix, plan.deadline, SEED)
        .headers(plan.headers.clone());
    let capacity = match plan.capacity {
        Some(rps) => Capacity { rps, source: "given", probe: Vec::new() },
        None => probe(&generator, plan).await?,
    };
    println!(
        "capacity {:.0} rps ({}); ramp {:?} x capacity, {:?} warm-up + {:?} per step",
        capacity.rps, capacity.source, plan.multiples, plan.warmup, plan.measure
    );
    if 2.0 * capacity.rps > plan.max_rps {
        println!(
            "--max-rps {} is below twice the capacity: the ramp cannot go past {:.2} x capacity (raise --max-rps)",
            plan.max_rps,
            plan.max_rps / capacity.rps
        );
    }
    print_header();
    let mut steps = Vec::new();
    for &multiple in &plan.multiples {
        let rps = (multiple * capacity.rps).min(plan.max_rps);
        let phase = Phase { rps, duration: plan.warmup + plan.measure };
        let samples = generator.run(&[phase]).await;
        // The multiple actually offered (--max-rps may cap the rate).
        let step = Step::measure(
            round3(rps / capacity.rps),
            &samples,
            (plan.warmup, plan.warmup + plan.measure),
            plan.deadline,
        );
        print_step(&step);
        steps.push(step);
        if rps >= plan.max_rps {
            println!("--max-rps {} reached: the ramp stops here", plan.max_rps);
            break;
        }
    }
    Ok(Run { capacity, steps })
}

async fn probe(generator: &Generator, plan: &Plan) -> anyhow::Result<Capacity> {
    let secs = Duration::from_secs_f64(plan.probe_secs);
    let mut rate = plan.probe_start;
    let mut rows = Vec::new();
    println!(
        "probe: from {rate} rps, x{PROBE_GROWTH} per {secs:?} step, until < {:.0} % good",
        PROBE_GOOD * 100.0
    );
    loop {
        let samples = generator.run(&[Phase { rps: rate, duration: secs }]).await;
        let row = probe_step(&samples, secs, plan.deadline);
        println!(
            "probe {:>9.0} rps offered {:>9.0} good {:>6.1}% p99 {:>8.1} ms",
            row.offered_rps,
            row.goodput_rps,
            row.good_ratio * 100.0,
            row.p99_admitted_ms
        );
        let kept_up = row.good_ratio >= PROBE_GOOD;
        rows.push(row);
        if !kept_up || rate >= plan.max_rps {
            let best = rows.iter().map(|r| r.goodput_rps).fold(0.0, f64::max);
            ensure!(
                best > 0.0,
                "the target answered nothing 2xx within {:?} even at {} rps: is {}{} up, and is the deadline long enough?",
                plan.deadline,
                plan.probe_start,
                plan.base,
                plan.path
            );
            let source = if kept_up { "max_rps" } else { "probe" };
            return Ok(Capacity { rps: round3(best), source, probe: rows });
        }
        rate = (rate * PROBE_GROWTH).min(plan.max_rps);
    }
}

fn probe_step(samples: &[Sample], secs: Duration, deadline: Duration) -> ProbeStep {
    let s = Step::measure(1.0, samples, (Duration::ZERO, secs), deadline);
    let good_ratio = if s.offered_rps > 0.0 { s.goodput_rps / s.offered_rps } else { 0.0 };
    ProbeStep {
        offered_rps: round3(s.offered_rps),
        goodput_rps: round3(s.goodput_rps),
        good_ratio: round3(good_ratio),
        p99_admitted_ms: round3(s.p99_admitted_ms),
    }
}

fn print_header() {
    println!(
        "{:>6} {:>9} {:>9} {:>8} {:>8} {:>7} {:>7} {:>22} {:>17}",
        "x", "offered", "goodput", "p50 ms", "p99 ms", "shed", "late", "good CRIT/S+/S", "p99 CRIT/S+/S"
    );
}

fn print_step(s: &Step) {
    let [c, sp, sh] = s.goodput_ratio_by_criticality;
    let [pc, psp, psh] = s.p99_admitted_ms_by_criticality;
    println!(
        "{:>6} {:>9.0} {:>9.0} {:>8.1} {:>8.1} {:>6.1}% {:>6.1}% {:>6.1}%/{:>5.1}%/{:>5.1}% {:>5.0}/{:>5.0}/{:>5.0}",
        s.multiple,
        s.offered_rps,
        s.goodput_rps,
        s.p50_admitted_ms,
        s.p99_admitted_ms,
        s.rejected_ratio * 100.0,
        s.timed_out_ratio * 100.0,
        c * 100.0,
        sp * 100.0,
        sh * 100.0,
        pc,
        psp,
        psh
    );
}

/// The criticality names of the summary, in the order of `load::CRITICALITIES`.
const CLASS_NAMES: [&str; 3] = ["CRITICAL", "SHEDDABLE_PLUS", "SHEDDABLE"];

/// The step where goodput peaked, and the first step after it below [`FALL`] × the peak.
pub fn fall(steps: &[Step]) -> (Option<usize>, Option<usize>) {
    let peak =
        steps.iter().enumerate().max_by(|a, b| a.1.goodput_rps.total_cmp(&b.1.goodput_rps)).map(|(i, _)| i);
    let falls = peak.and_then(|p| {
        let top = steps[p].goodput_rps;
        (p + 1..steps.len()).find(|&i| steps[i].goodput_rps < FALL * top)
    });
    (peak, falls)
}

/// The JSON summary: the target, the capacity and its probe, every step, and where
/// goodput falls in total and per criticality (`null`: not within the ramp). Goodput per
/// criticality is in requests/s; a class the mix does not send is `null`.
pub fn summary(plan: &Plan, run: &Run) -> Value {
    let (peak, falls) = fall(&run.steps);
    let at = |i: Option<usize>| {
        i.map(|i| {
            let s = &run.steps[i];
            json!({"multiple": s.multiple, "offered_rps": round3(s.offered_rps), "goodput_rps": round3(s.goodput_rps)})
        })
    };
    let mut by_class = serde_json::Map::new();
    for (c, name) in CLASS_NAMES.iter().enumerate() {
        let sent = plan.mix.0[c] > 0;
        let first_bad = run.steps.iter().position(|s| s.goodput_ratio_by_criticality[c] < FALL);
        by_class.insert(
            (*name).into(),
            json!({
                "share_per_mille": plan.mix.0[c],
                "falls_at": if sent { at(first_bad) } else { None },
            }),
        );
    }
    let steps: Vec<Value> = run
        .steps
        .iter()
        .map(|s| {
            let mut good = serde_json::Map::new();
            let mut p99 = serde_json::Map::new();
            for (c, name) in CLASS_NAMES.iter().enumerate() {
                let sent = plan.mix.0[c] > 0;
                let share = f64::from(plan.mix.0[c]) / 1000.0;
                good.insert(
                    (*name).into(),
                    if sent {
                        json!(round3(s.goodput_ratio_by_criticality[c] * share * s.offered_rps))
                    } else {
                        Value::Null
                    },
                );
                p99.insert(
                    (*name).into(),
                    if sent { json!(round3(s.p99_admitted_ms_by_criticality[c])) } else { Value::Null },
                );
            }
            json!({
                "multiple": s.multiple,
                "offered_rps": round3(s.offered_rps),
                "goodput_rps": round3(s.goodput_rps),
                "goodput_rps_by_criticality": good,
                "p50_admitted_ms": round3(s.p50_admitted_ms),
                "p99_admitted_ms": round3(s.p99_admitted_ms),
                "p99_admitted_ms_by_criticality": p99,
                "rejected_ratio": round3(s.rejected_ratio),
                "timed_out_ratio": round3(s.timed_out_ratio),
            })
        })
        .collect();
    json!({
        "target": format!("{} {}{}", plan.method, plan.base, plan.path),
        "deadline_ms": plan.deadline.as_millis() as u64,
        "mix_per_mille": plan.mix.0,
        "capacity_rps": run.capacity.rps,
        "capacity_source": run.capacity.source,
        "probe": run.capacity.probe,
        "steps": steps,
        "peak": at(peak),
        "p99_admitted_ms_at_peak": peak.map(|i| round3(run.steps[i].p99_admitted_ms)),
        "goodput_falls_at": at(falls),
        "criticality": by_class,
    })
}

/// The CI check of a `--target` summary: every figure of every step is a number, the ramp
/// has at least three steps and went past the capacity (its last step offered at least
/// twice the capacity), unless the probe reached `--max-rps` with the service keeping up. No absolute threshold: what a
/// service does past its capacity is what the run is for.
pub fn check(summary: &Value) -> anyhow::Result<()> {
    let num = |v: &Value, path: &str| -> anyhow::Result<f64> {
        v.pointer(path).and_then(Value::as_f64).ok_or_else(|| anyhow!("summary has no number at {path}: {v}"))
    };
    let capacity = num(summary, "/capacity_rps")?;
    ensure!(capacity > 0.0, "capacity {capacity} is not positive");
    let steps =
        summary.pointer("/steps").and_then(Value::as_array).ok_or_else(|| anyhow!("summary has no steps"))?;
    let source = summary.pointer("/capacity_source").and_then(Value::as_str).unwrap_or("");
    // A service still keeping up at --max-rps has a ramp cut short there: nothing past
    // its capacity can be offered, and the summary says so (`capacity_source`).
    let least = if source == "max_rps" { 1 } else { 3 };
    ensure!(steps.len() >= least, "the ramp has {} steps, at least {least} expected", steps.len());
    for (i, step) in steps.iter().enumerate() {
        for f in [
            "multiple",
            "offered_rps",
            "goodput_rps",
            "p50_admitted_ms",
            "p99_admitted_ms",
            "rejected_ratio",
            "timed_out_ratio",
        ] {
            num(step, &format!("/{f}")).with_context(|| format!("step {i}"))?;
        }
        ensure!(
            step.pointer("/goodput_rps_by_criticality").is_some_and(Value::is_object),
            "step {i} has no goodput per criticality"
        );
    }
    let last = num(&steps[steps.len() - 1], "/multiple")?;
    ensure!(
        last >= 2.0 || source == "max_rps",
        "the ramp stopped at {last} x capacity: it must go past the capacity (>= 2x); \
         if --max-rps cut it short, raise --max-rps or give the target a lower capacity"
    );
    ensure!(summary.pointer("/peak").is_some_and(Value::is_object), "summary has no peak");
    ensure!(summary.pointer("/goodput_falls_at").is_some(), "summary has no goodput_falls_at");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opts(target: &str) -> TargetOpts {
        TargetOpts {
            target: Some(target.into()),
            method: "GET".into(),
            capacity: None,
            probe_start: 20.0,
            max_rps: 5000.0,
            mix: "100,300,600".into(),
            deadline: "500ms".into(),
            multiples: Vec::new(),
            headers: Vec::new(),
        }
    }

    #[test]
    fn the_target_url_keeps_its_path_and_query() {
        let plan = opts("http://127.0.0.1:3000/checkout/alice?x=1").plan(true, None).unwrap();
        assert_eq!(
            (plan.base.as_str(), plan.path.as_str()),
            ("http://127.0.0.1:3000", "/checkout/alice?x=1")
        );
        assert_eq!(opts("http://localhost:8080").plan(false, None).unwrap().path, "/");
        let err = opts("https://example.com/").plan(false, None).unwrap_err().to_string();
        assert!(err.contains("only http"), "{err}");
        let err = opts("127.0.0.1:3000/x").plan(false, None).unwrap_err().to_string();
        assert!(err.contains("--target"), "{err}");
    }

    /// Every bad option is refused with its name and what it accepts.
    #[test]
    fn bad_options_name_the_option_and_the_range() {
        let bad = |f: &dyn Fn(&mut TargetOpts)| {
            let mut o = opts("http://127.0.0.1:3000/");
            f(&mut o);
            o.plan(false, None).unwrap_err().to_string()
        };
        assert!(bad(&|o| o.mix = "100,300".into()).contains("--mix takes three"));
        assert!(bad(&|o| o.mix = "100,300,500".into()).contains("add up to 1000"));
        assert!(bad(&|o| o.mix = "a,300,700".into()).contains("--mix"));
        assert!(bad(&|o| o.deadline = "soon".into()).contains("--deadline"));
        assert!(bad(&|o| o.deadline = "2m".into()).contains("between 1ms and 60s"));
        assert!(bad(&|o| o.capacity = Some(0.0)).contains("--capacity"));
        assert!(bad(&|o| o.max_rps = f64::NAN).contains("--max-rps"));
        assert!(bad(&|o| o.probe_start = 10_000.0).contains("must not exceed --max-rps"));
        assert!(bad(&|o| o.multiples = vec![2.0, 1.0]).contains("increasing"));
        assert!(bad(&|o| o.method = "GE T".into()).contains("--method"));
        assert!(bad(&|o| o.headers = vec!["no colon".into()]).contains("name: value"));
        let mut o = opts("http://127.0.0.1:3000/");
        o.headers = vec!["Authorization: Bearer x".into()];
        let plan = o.plan(false, None).unwrap();
        assert_eq!(plan.headers[0].0, "authorization");
        assert_eq!(plan.headers[0].1, "Bearer x");
    }

    fn step(multiple: f64, offered: f64, goodput: f64, by_class: [f64; 3]) -> Step {
        Step {
            multiple,
            offered_rps: offered,
            goodput_rps: goodput,
            p50_admitted_ms: 10.0,
            p99_admitted_ms: 50.0,
            rejected_ratio: 0.0,
            timed_out_ratio: 0.0,
            goodput_ratio_by_criticality: by_class,
            p99_admitted_ms_by_criticality: [50.0; 3],
        }
    }

    /// The peak is the best step; goodput falls at the first later step under 90 % of it;
    /// each class falls at its first step under 90 % good; a class not sent is null.
    #[test]
    fn the_summary_finds_where_goodput_falls() {
        let mut plan = opts("http://127.0.0.1:3000/").plan(false, None).unwrap();
        plan.mix = Mix([100, 900, 0]);
        let run = Run {
            capacity: Capacity { rps: 100.0, source: "probe", probe: Vec::new() },
            steps: vec![
                step(0.5, 50.0, 50.0, [1.0, 1.0, 1.0]),
                step(1.0, 100.0, 98.0, [1.0, 0.97, 1.0]),
                step(2.0, 200.0, 95.0, [1.0, 0.47, 1.0]),
                step(4.0, 400.0, 40.0, [0.5, 0.05, 1.0]),
            ],
        };
        let s = summary(&plan, &run);
        assert_eq!(s["peak"]["multiple"], json!(1.0));
        assert_eq!(s["goodput_falls_at"]["multiple"], json!(4.0));
        assert_eq!(s["criticality"]["SHEDDABLE_PLUS"]["falls_at"]["multiple"], json!(2.0));
        assert_eq!(s["criticality"]["CRITICAL"]["falls_at"]["multiple"], json!(4.0));
        assert_eq!(s["criticality"]["SHEDDABLE"]["falls_at"], Value::Null);
        assert_eq!(s["steps"][2]["goodput_rps_by_criticality"]["CRITICAL"], json!(20.0));
        assert_eq!(s["steps"][2]["goodput_rps_by_criticality"]["SHEDDABLE"], Value::Null);
        check(&s).unwrap();
        // A service that holds its goodput never "falls".
        let held = Run { steps: run.steps[..3].to_vec(), ..run.clone() };
        assert_eq!(summary(&plan, &held)["goodput_falls_at"], Value::Null);
    }

    #[test]
    fn the_check_wants_a_ramp_past_the_capacity() {
        let plan = opts("http://127.0.0.1:3000/").plan(false, None).unwrap();
        let short = Run {
            capacity: Capacity { rps: 100.0, source: "probe", probe: Vec::new() },
            steps: vec![
                step(0.5, 50.0, 50.0, [1.0; 3]),
                step(1.0, 100.0, 98.0, [1.0; 3]),
                step(1.5, 150.0, 98.0, [1.0; 3]),
            ],
        };
        let err = check(&summary(&plan, &short)).unwrap_err().to_string();
        assert!(err.contains("past the capacity"), "{err}");
        let err = check(&json!({"capacity_rps": 10.0, "steps": []})).unwrap_err().to_string();
        assert!(err.contains("at least 3"), "{err}");
    }

    /// A real run on loopback against a service of known capacity (20 workers x 50 ms =
    /// 400 rps): the probe finds a capacity, the ramp goes past it and the summary passes
    /// the CI check. No figure is asserted beyond that (timings on a shared machine).
    #[test]
    fn a_run_against_a_loopback_service_probes_and_ramps() {
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
        rt.block_on(async {
            let pool = super::super::service::Pool::new(20);
            let router = super::super::service::work_router(pool.clone(), Duration::from_millis(50));
            let server = super::super::service::Server::start(super::super::service::protect(
                router,
                &super::super::service::Protection::None,
            ))
            .await
            .unwrap();
            let mut o = opts(&format!("http://{}/work", server.addr));
            o.probe_start = 100.0;
            o.max_rps = 2000.0;
            o.multiples = vec![0.5, 1.0, 2.0];
            let mut plan = o.plan(true, Some(0.4)).unwrap();
            plan.probe_secs = 0.4;
            let run = run(&plan).await.unwrap();
            assert!(run.capacity.rps > 0.0);
            assert!(!run.capacity.probe.is_empty());
            check(&summary(&plan, &run)).unwrap();
            pool.close();
        });
    }
}

//! `levee-bench overload --target URL`: load to failure against any HTTP service (article
//! §10.3: test to failure, not to a target). The same open-loop generator as the
//! harness ([`Generator`]: scheduled send times, latency from the intended send time,
//! a `levee-criticality` header drawn from the mix and a `levee-deadline-ms` header on
//! every request, the client giving up at that deadline) is pointed at a URL (a
//! loopback one unless `--allow-non-loopback`: the run overloads it on purpose), with the
//! method, path, headers and body given:
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

use std::net::IpAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, anyhow, bail, ensure};
use bytes::Bytes;
use clap::Args as ClapArgs;
use http::uri::PathAndQuery;
use http::{HeaderName, HeaderValue, Method, Uri};
use levee_agent::deadline::{CRITICALITY_HEADER, DEADLINE_MS_HEADER};
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
    /// (plain HTTP; the path and query are requested as given). Only a loopback host
    /// (`127.0.0.0/8`, `[::1]`, `localhost`) unless --allow-non-loopback.
    #[arg(long, value_name = "URL")]
    pub target: Option<String>,
    /// Path and query to request, when --target names only `http://host:port`.
    #[arg(long, value_name = "/PATH?QUERY", requires = "target")]
    pub path: Option<String>,
    /// HTTP method of the requests sent to --target: GET by default, POST when a body is
    /// given (as curl does with -d).
    #[arg(long, requires = "target")]
    pub method: Option<String>,
    /// Body of every request, as given (set its type with --header 'content-type: ...').
    #[arg(long, value_name = "TEXT", requires = "target", conflicts_with = "body_file")]
    pub body: Option<String>,
    /// Body of every request, read from this file once at start.
    #[arg(long, value_name = "FILE", requires = "target")]
    pub body_file: Option<PathBuf>,
    /// A header sent with every request, `name: value` (repeatable), e.g. authentication.
    #[arg(long = "header", value_name = "NAME: VALUE", requires = "target")]
    pub headers: Vec<String>,
    /// Allow a --target that is not on loopback. The run offers several times the
    /// target's capacity on purpose: point it only at a service you own, in an
    /// environment made for it.
    #[arg(long, requires = "target")]
    pub allow_non_loopback: bool,
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
}

/// A checked `--target` run.
#[derive(Debug, Clone)]
pub struct Plan {
    /// `http://host:port`.
    pub base: String,
    /// Path and query.
    pub path: String,
    pub method: Method,
    pub body: Bytes,
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
        let (base, host, url_path) = split_url(url)?;
        if !self.allow_non_loopback {
            ensure!(
                is_loopback(&host),
                "--target {url:?}: {host} is not a loopback address (127.0.0.0/8, [::1], localhost); \
                 this run offers several times the target's capacity, so it goes elsewhere only \
                 with --allow-non-loopback, to a service you own"
            );
        }
        let path = match (&self.path, url_path) {
            (None, path) => path.unwrap_or_else(|| "/".into()),
            (Some(p), None) => {
                ensure!(
                    p.starts_with('/') && p.parse::<PathAndQuery>().is_ok(),
                    "--path {p:?} must be a path starting with / (and an optional ?query)"
                );
                p.clone()
            }
            (Some(p), Some(in_url)) => bail!(
                "--path {p:?} and the path of --target ({in_url:?}) both name what to request: give one"
            ),
        };
        let method = match &self.method {
            Some(m) => Method::from_bytes(m.as_bytes())
                .map_err(|_| anyhow!("--method {m:?} is not an HTTP method"))?,
            None if self.body.is_some() || self.body_file.is_some() => Method::POST,
            None => Method::GET,
        };
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
        let body = match (&self.body, &self.body_file) {
            (Some(text), _) => Bytes::from(text.clone()),
            (None, Some(file)) => {
                Bytes::from(std::fs::read(file).with_context(|| format!("--body-file {}", file.display()))?)
            }
            (None, None) => Bytes::new(),
        };
        let measure = Duration::from_secs_f64(step_secs.unwrap_or(if smoke { 1.5 } else { 8.0 }));
        ensure!(measure >= Duration::from_millis(200), "--step-secs must be at least 0.2");
        Ok(Plan {
            base,
            path,
            method,
            body,
            capacity,
            probe_start,
            max_rps,
            mix,
            deadline,
            multiples,
            headers,
            probe_secs: if smoke { 0.5 } else { 3.0 },
            warmup: measure / 4,
            measure,
        })
    }
}

/// `http://host:port/path?query` → (`http://host:port`, the host, `/path?query` unless the
/// URL has no path or only `/`).
fn split_url(url: &str) -> anyhow::Result<(String, String, Option<String>)> {
    let uri: Uri = url.parse().with_context(|| format!("--target {url:?} is not a URL"))?;
    match uri.scheme_str() {
        Some("http") => {}
        Some(other) => bail!("--target {url:?}: scheme {other:?} is not supported, only http"),
        None => bail!("--target {url:?} needs a scheme: http://host:port/path"),
    }
    let authority = uri.authority().ok_or_else(|| anyhow!("--target {url:?} has no host"))?;
    let path = uri.path_and_query().map(|p| p.as_str()).filter(|p| !p.is_empty() && *p != "/");
    Ok((format!("http://{authority}"), authority.host().to_string(), path.map(str::to_string)))
}

/// A host this machine reaches without leaving it: an address of 127.0.0.0/8 or ::1
/// (also IPv4-mapped), or the name `localhost`. Any other name is refused unchecked rather
/// than resolved: what it resolves to when checked need not be what the generator reaches.
fn is_loopback(host: &str) -> bool {
    let host = host.trim_start_matches('[').trim_end_matches(']');
    match host.parse::<IpAddr>() {
        Ok(ip) => ip.to_canonical().is_loopback(),
        Err(_) => host.trim_end_matches('.').eq_ignore_ascii_case("localhost"),
    }
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
    // Headers the run sets itself: a second copy would contradict it (two criticalities,
    // two deadlines, a length that is not the body's).
    let owned = if name == CRITICALITY_HEADER {
        Some("--mix draws it for each request")
    } else if name == DEADLINE_MS_HEADER {
        Some("--deadline sets it for each request")
    } else if name == http::header::CONTENT_LENGTH || name == http::header::TRANSFER_ENCODING {
        Some("it follows from --body")
    } else {
        None
    };
    if let Some(why) = owned {
        bail!("--header {s:?}: {name} is not set with --header: {why}");
    }
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
    let generator = generator(plan);
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

/// The generator of a run: every request is the plan's method, path, headers and body.
fn generator(plan: &Plan) -> Generator {
    // The run's one copy of the path; the generator's targets are 'static.
    let path: &'static str = Box::leak(plan.path.clone().into_boxed_str());
    let target =
        Target { method: plan.method.clone(), path, share: 1000, send_criticality: true, class: None };
    Generator::with_base(plan.base.clone(), vec![target], plan.mix, plan.deadline, SEED)
        .headers(plan.headers.clone())
        .body(plan.body.clone())
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
                good.insert(
                    (*name).into(),
                    if sent { json!(round3(s.goodput_rps_by_criticality[c])) } else { Value::Null },
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

/// The summary's conclusions in words, printed before its JSON line: the peak and the p99
/// of what was admitted there, where goodput falls (the knee), and where each class sent
/// stops being answered in time. Read from the summary, so the words and the JSON cannot
/// disagree.
pub fn conclusions(summary: &Value) -> Vec<String> {
    let step = |v: &Value| {
        format!(
            "{}x capacity ({} rps offered, {} rps good)",
            v["multiple"],
            v["offered_rps"].as_f64().unwrap_or(0.0).round(),
            v["goodput_rps"].as_f64().unwrap_or(0.0).round()
        )
    };
    let last =
        summary["steps"].as_array().and_then(|s| s.last()).map_or(Value::Null, |s| s["multiple"].clone());
    let fall = FALL * 100.0;
    let mut lines = Vec::new();
    if summary["peak"].is_object() {
        lines.push(format!(
            "goodput peaks at {}, p99 of the admitted {:.1} ms",
            step(&summary["peak"]),
            summary["p99_admitted_ms_at_peak"].as_f64().unwrap_or(0.0)
        ));
    }
    let falls = &summary["goodput_falls_at"];
    lines.push(if falls.is_object() {
        format!("goodput falls below {fall:.0} % of the peak at {}", step(falls))
    } else {
        format!("goodput stays above {fall:.0} % of the peak over the whole ramp (to {last}x)")
    });
    let classes: Vec<String> = CLASS_NAMES
        .iter()
        .filter(|c| summary["criticality"][**c]["share_per_mille"].as_u64().unwrap_or(0) > 0)
        .map(|c| {
            let at = &summary["criticality"][*c]["falls_at"];
            if at.is_object() {
                format!("{c} from {}x", at["multiple"])
            } else {
                format!("{c} never (to {last}x)")
            }
        })
        .collect();
    lines.push(format!("under {fall:.0} % of a class answered in time: {}", classes.join(", ")));
    lines
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
    use levee_agent::policy::Criticality;

    use super::super::load::{CRITICALITIES, Outcome};
    use super::*;

    fn opts(target: &str) -> TargetOpts {
        TargetOpts {
            target: Some(target.into()),
            path: None,
            method: None,
            body: None,
            body_file: None,
            allow_non_loopback: false,
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

    /// The command line as a user writes it: repeated --header, one body source.
    #[test]
    fn the_command_line_takes_repeated_headers_and_one_body() {
        use clap::Parser;
        #[derive(Debug, Parser)]
        struct Cli {
            #[command(flatten)]
            target: TargetOpts,
        }
        let cli = Cli::try_parse_from([
            "levee-bench",
            "--target",
            "http://127.0.0.1:3000",
            "--path",
            "/checkout/alice",
            "--header",
            "authorization: Bearer t",
            "--header",
            "x-tenant: 7",
            "--body",
            "{}",
        ])
        .unwrap();
        let plan = cli.target.plan(false, None).unwrap();
        assert_eq!(plan.headers.len(), 2);
        assert_eq!(plan.headers[1].0, "x-tenant");
        assert_eq!((plan.method, plan.path.as_str()), (Method::POST, "/checkout/alice"));
        let both = Cli::try_parse_from([
            "levee-bench",
            "--target",
            "http://127.0.0.1:3000/",
            "--body",
            "{}",
            "--body-file",
            "b.json",
        ]);
        assert!(both.unwrap_err().to_string().contains("--body-file"));
        let no_target = Cli::try_parse_from(["levee-bench", "--path", "/x"]);
        assert!(no_target.unwrap_err().to_string().contains("--target"));
    }

    /// The run offers several times a service's capacity: it goes to this machine only,
    /// unless said otherwise. Names other than localhost are refused without resolving them.
    #[test]
    fn only_loopback_targets_unless_allowed() {
        for ok in [
            "http://127.0.0.1:3000/",
            "http://127.3.2.1:3000/",
            "http://[::1]:3000/",
            "http://[::ffff:127.0.0.1]:3000/",
            "http://localhost:3000/",
            "http://LOCALHOST.:3000/",
        ] {
            opts(ok).plan(false, None).unwrap_or_else(|e| panic!("{ok}: {e}"));
        }
        for far in [
            "http://10.0.0.1:3000/",
            "http://192.0.2.1/",
            "http://0.0.0.0:3000/",
            "http://[2001:db8::1]:3000/",
            "http://example.com/",
            "http://localhost.example.com/",
            "http://user@192.0.2.1/",
        ] {
            let err = opts(far).plan(false, None).unwrap_err().to_string();
            assert!(
                err.contains("not a loopback address") && err.contains("--allow-non-loopback"),
                "{far}: {err}"
            );
            let mut o = opts(far);
            o.allow_non_loopback = true;
            o.plan(false, None).unwrap_or_else(|e| panic!("{far} allowed: {e}"));
        }
    }

    /// `--path` names what to request when the URL does not; a body is sent as given, or
    /// read from a file.
    #[test]
    fn path_and_body_options() {
        let mut o = opts("http://127.0.0.1:3000");
        o.path = Some("/checkout/alice?x=1".into());
        o.body = Some(r#"{"items":[1]}"#.into());
        let plan = o.plan(false, None).unwrap();
        assert_eq!(plan.path, "/checkout/alice?x=1");
        assert_eq!(plan.method, Method::POST, "a body without --method is a POST");
        assert_eq!(plan.body, Bytes::from_static(br#"{"items":[1]}"#));
        o.method = Some("PUT".into());
        assert_eq!(o.plan(false, None).unwrap().method, Method::PUT);
        let get = opts("http://127.0.0.1:3000/").plan(false, None).unwrap();
        assert_eq!((get.method, get.body), (Method::GET, Bytes::new()));

        let mut both = opts("http://127.0.0.1:3000/checkout/bob");
        both.path = Some("/checkout/alice".into());
        let err = both.plan(false, None).unwrap_err().to_string();
        assert!(err.contains("--path") && err.contains("give one"), "{err}");
        let mut relative = opts("http://127.0.0.1:3000");
        relative.path = Some("checkout".into());
        let err = relative.plan(false, None).unwrap_err().to_string();
        assert!(err.contains("--path \"checkout\" must be a path"), "{err}");

        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("body.json");
        std::fs::write(&file, b"[1,2,3]").unwrap();
        let mut from_file = opts("http://127.0.0.1:3000/");
        from_file.body_file = Some(file);
        assert_eq!(from_file.plan(false, None).unwrap().body, Bytes::from_static(b"[1,2,3]"));
        from_file.body_file = Some(dir.path().join("missing.json"));
        let err = from_file.plan(false, None).unwrap_err().to_string();
        assert!(err.contains("--body-file"), "{err}");
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
        assert!(bad(&|o| o.method = Some("GE T".into())).contains("--method"));
        assert!(bad(&|o| o.headers = vec!["no colon".into()]).contains("name: value"));
        assert!(bad(&|o| o.headers = vec!["Levee-Criticality: CRITICAL".into()]).contains("--mix"));
        assert!(bad(&|o| o.headers = vec!["levee-deadline-ms: 100".into()]).contains("--deadline"));
        assert!(bad(&|o| o.headers = vec!["content-length: 3".into()]).contains("--body"));
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
            // The mix of the test below: 10 % CRITICAL, 90 % SHEDDABLE_PLUS.
            goodput_rps_by_criticality: [by_class[0] * 0.1 * offered, by_class[1] * 0.9 * offered, 0.0],
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

    /// The samples of one 2 s step at `multiple` × 100 rps against a model service, the
    /// classes in the default mix's proportions (of every ten requests one CRITICAL, three
    /// SHEDDABLE_PLUS, six SHEDDABLE); `answer` says how the `k`-th request of its class,
    /// sent at `at`, ended and after how many ms.
    fn model_step(multiple: f64, answer: &dyn Fn(Criticality, usize, Duration) -> (Outcome, u64)) -> Step {
        let secs = 2.0;
        let offered = multiple * 100.0;
        let total = (offered * secs) as usize;
        let class = |i: usize| match i % 10 {
            0 => Criticality::Critical,
            1..=3 => Criticality::SheddablePlus,
            _ => Criticality::Sheddable,
        };
        let mut seen = std::collections::HashMap::new();
        let samples: Vec<Sample> = (0..total)
            .map(|i| {
                let c = class(i);
                let k = seen.entry(c).or_insert(0usize);
                let at = Duration::from_secs_f64(i as f64 / offered);
                let (outcome, latency_ms) = answer(c, *k, at);
                *k += 1;
                Sample {
                    at,
                    criticality: c,
                    route: 0,
                    outcome,
                    latency: Duration::from_millis(latency_ms),
                    degraded: false,
                }
            })
            .collect();
        Step::measure(
            multiple,
            &samples,
            (Duration::ZERO, Duration::from_secs_f64(secs)),
            Duration::from_millis(500),
        )
    }

    /// The knee, goodput per criticality and p99 of what was admitted, computed from the
    /// samples of two model services of capacity 100 rps (no timing, no network).
    /// A service that sheds by criticality serves 100 rps, CRITICAL first, and refuses the
    /// rest at once: goodput holds (no knee), SHEDDABLE falls first, CRITICAL never, the
    /// p99 of the admitted stays at their 20 ms. A service with a FIFO queue serves every
    /// request in turn: past its capacity the queue grows until answers come after the
    /// 500 ms deadline, and goodput falls at 2×, every class at once, p99 at the deadline.
    #[test]
    fn the_knee_and_goodput_per_criticality_of_two_model_services() {
        let ok = Outcome::Answered(http::StatusCode::OK);
        let shed = Outcome::Answered(http::StatusCode::SERVICE_UNAVAILABLE);
        let multiples = [0.5, 1.0, 2.0, 4.0, 8.0];
        let plan = opts("http://127.0.0.1:3000/").plan(false, None).unwrap();
        let capacity = Capacity { rps: 100.0, source: "given", probe: Vec::new() };

        // 200 requests per 2 s fit; the classes fill them in order of criticality.
        let shedding: Vec<Step> = multiples
            .iter()
            .map(|&m| {
                // Sent per class in the step: its share of m x 200.
                let sent = [0.1, 0.3, 0.6].map(|share| (m * 200.0 * share) as usize);
                model_step(m, &|c, k, _| {
                    let before: usize =
                        CRITICALITIES.iter().zip(sent).take_while(|(x, _)| **x != c).map(|(_, n)| n).sum();
                    if before + k < 200 { (ok, 20) } else { (shed, 1) }
                })
            })
            .collect();
        let s = summary(&plan, &Run { capacity: capacity.clone(), steps: shedding });
        assert_eq!(s["goodput_falls_at"], Value::Null, "{s}");
        assert_eq!(s["steps"][1]["goodput_rps"], json!(100.0));
        assert_eq!(s["steps"][4]["goodput_rps"], json!(100.0));
        assert_eq!(s["criticality"]["SHEDDABLE"]["falls_at"]["multiple"], json!(2.0));
        assert_eq!(s["criticality"]["SHEDDABLE_PLUS"]["falls_at"]["multiple"], json!(4.0));
        assert_eq!(s["criticality"]["CRITICAL"]["falls_at"], Value::Null);
        // At 4x: CRITICAL 40 rps all served, SHEDDABLE_PLUS 60 of 120, SHEDDABLE none.
        assert_eq!(
            s["steps"][3]["goodput_rps_by_criticality"],
            json!({"CRITICAL": 40.0, "SHEDDABLE_PLUS": 60.0, "SHEDDABLE": 0.0})
        );
        assert_eq!(s["steps"][3]["rejected_ratio"], json!(0.75));
        assert_eq!(s["steps"][4]["p99_admitted_ms"], json!(20.0));
        check(&s).unwrap();
        assert_eq!(
            conclusions(&s)[1..],
            [
                "goodput stays above 90 % of the peak over the whole ramp (to 8.0x)",
                "under 90 % of a class answered in time: CRITICAL never (to 8.0x), SHEDDABLE_PLUS from 4.0x, \
                 SHEDDABLE from 2.0x",
            ]
        );

        // FIFO: the i-th request sent at `at` leaves the queue at i / capacity (it cannot
        // start before it arrives); given up at the deadline when that is later.
        let queueing: Vec<Step> = multiples
            .iter()
            .map(|&m| {
                model_step(m, &|_, _, at| {
                    let i = (at.as_secs_f64() * m * 100.0).round();
                    let done_ms = (i * 10.0).max(at.as_secs_f64() * 1000.0) + 20.0;
                    let latency = (done_ms - at.as_secs_f64() * 1000.0).round() as u64;
                    if latency > 500 { (Outcome::TimedOut, 500) } else { (ok, latency) }
                })
            })
            .collect();
        let s = summary(&plan, &Run { capacity, steps: queueing });
        assert_eq!(s["peak"]["multiple"], json!(1.0), "{s}");
        assert_eq!(s["p99_admitted_ms_at_peak"], json!(20.0));
        assert_eq!(s["goodput_falls_at"]["multiple"], json!(2.0));
        // At 2x the k-th request waits 5k ms: the first 97 of 400 are in time.
        assert_eq!(s["steps"][2]["goodput_rps"], json!(48.5));
        assert_eq!(s["steps"][2]["p99_admitted_ms"], json!(500.0));
        for class in CLASS_NAMES {
            assert_eq!(s["criticality"][class]["falls_at"]["multiple"], json!(2.0), "{class}");
        }
        check(&s).unwrap();
        assert_eq!(
            conclusions(&s),
            [
                "goodput peaks at 1.0x capacity (100 rps offered, 100 rps good), p99 of the admitted 20.0 ms",
                "goodput falls below 90 % of the peak at 2.0x capacity (200 rps offered, 49 rps good)",
                "under 90 % of a class answered in time: CRITICAL from 2.0x, SHEDDABLE_PLUS from 2.0x, \
                 SHEDDABLE from 2.0x",
            ]
        );
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

    /// What the target receives, on a real connection: the method, path and query, body
    /// and headers given, with Levee's criticality and deadline headers beside them.
    #[tokio::test]
    async fn the_target_receives_the_request_as_given() {
        use axum::extract::{Request, State};
        use tokio::sync::mpsc;

        let (tx, mut rx) = mpsc::unbounded_channel();
        let app = axum::Router::new().fallback(
            |State(tx): State<mpsc::UnboundedSender<_>>, req: Request| async move {
                let (parts, body) = req.into_parts();
                let body = axum::body::to_bytes(body, 1 << 20).await.unwrap();
                let _ = tx.send((parts.method, parts.uri.to_string(), parts.headers, body));
                "ok"
            },
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let server = tokio::spawn(async move { axum::serve(listener, app.with_state(tx)).await });

        let mut o = opts(&format!("http://{addr}"));
        o.path = Some("/orders?dry=1".into());
        o.method = Some("POST".into());
        o.body = Some(r#"{"sku":42}"#.into());
        o.headers = vec!["content-type: application/json".into(), "authorization: Bearer t0k".into()];
        o.mix = "0,1000,0".into();
        let plan = o.plan(false, None).unwrap();
        let samples =
            generator(&plan).run(&[Phase { rps: 50.0, duration: Duration::from_millis(100) }]).await;
        assert_eq!(samples.len(), 5);
        assert!(samples.iter().all(|s| s.good(plan.deadline)), "{samples:?}");
        for _ in 0..5 {
            let (method, uri, headers, body) = rx.recv().await.unwrap();
            assert_eq!(
                (method, uri.as_str(), &body[..]),
                (Method::POST, "/orders?dry=1", &br#"{"sku":42}"#[..])
            );
            assert_eq!(headers["content-type"], "application/json");
            assert_eq!(headers["authorization"], "Bearer t0k");
            assert_eq!(headers[CRITICALITY_HEADER], "SHEDDABLE_PLUS");
            let deadline_ms: u64 = headers[DEADLINE_MS_HEADER].to_str().unwrap().parse().unwrap();
            assert!((1..=500).contains(&deadline_ms), "{deadline_ms}");
        }
        server.abort();
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

//! `levee-bench overload`: tests to failure (article §10.3, targets.md "Overload
//! behaviour"). A service of known capacity is driven by an open-loop generator from
//! 0.5× to 10× its capacity, behind each protection in turn, in one run: no protection,
//! tower's `ConcurrencyLimit` + `LoadShed`, `tower-acc` Gradient2 and Vegas, and Levee's
//! admission layer. Each step prints offered rps, goodput within the deadline, p50/p99 of
//! the admitted requests and goodput per criticality. Two more parts: the article's §1
//! scenario (a non-critical dependency going from 20 ms to 5 s, [`dependency`]) and
//! recovery (how long until goodput is back once a 10× overload stops). The last line
//! printed is one JSON object with every figure.

use std::time::Duration;

use clap::{Args as ClapArgs, Subcommand};
use http::Method;
use levee_agent::policy::{Criticality, Inbound, LimitAlgorithm};
use serde_json::{Map, Value, json};

mod dependency;
mod load;
mod plot;
mod service;
mod stats;
mod target;
mod target_plot;

use load::{Generator, Mix, Phase, Target};
use service::{Pool, Protection, Server, protect, work_router};
use stats::{Step, round3};

/// The overload modes.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Tests to failure: inbound admission against the Rust peers, from 0.5× to 10× the
    /// capacity of a service on loopback.
    Overload(Args),
}

/// Options of `levee-bench overload`.
#[derive(Debug, ClapArgs)]
pub struct Args {
    /// A few seconds per protection (CI): fewer, shorter steps.
    #[arg(long)]
    smoke: bool,
    /// Seconds measured per step (after a warm-up of a quarter of it); default 8, 1.5 with
    /// --smoke.
    #[arg(long)]
    step_secs: Option<f64>,
    /// Draw the steps (goodput and p99 per protection) into this PNG.
    #[arg(long)]
    plot: Option<std::path::PathBuf>,
    /// TrueType font for the plot's labels.
    #[arg(long, default_value = "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf")]
    font: std::path::PathBuf,
    /// After printing, check the summary (CI): every figure present, and the comparisons
    /// that hold on any machine, however loaded — no absolute threshold (see [`check`]).
    #[arg(long)]
    check: bool,
    /// Which parts to run.
    #[arg(long, value_enum, default_value_t = Mode::All)]
    mode: Mode,
    /// Run only these protections of the steps and recovery (names as in the summary,
    /// comma-separated, e.g. `levee,levee_fixed`): for experiments; `--check` needs them
    /// all.
    #[arg(long, value_delimiter = ',', conflicts_with = "target")]
    only: Vec<String>,
    /// Load to failure against a service of one's own (`--target URL` and its options).
    #[command(flatten)]
    target: target::TargetOpts,
}

/// The parts of `levee-bench overload`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Mode {
    /// Everything below.
    All,
    /// 0.5× to 10× capacity, every protection.
    Steps,
    /// The article's §1 scenario: a non-critical dependency from 20 ms to 5 s and back.
    Dependency,
    /// Time until goodput is back after a 10× overload stops.
    Recovery,
}

/// The service of the steps: `WORKERS` handlers each holding a worker for `WORK`.
const WORKERS: usize = 40;
const WORK: Duration = Duration::from_millis(100);
/// The deadline every request carries; the client gives up at it.
const BUDGET: Duration = Duration::from_millis(500);
/// Offered load, as multiples of the capacity.
const STEPS: [f64; 8] = [0.5, 1.0, 1.5, 2.0, 3.0, 5.0, 7.0, 10.0];
const SMOKE_STEPS: [f64; 4] = [0.5, 1.0, 3.0, 10.0];
/// The traffic mix in per mille: CRITICAL, SHEDDABLE_PLUS, SHEDDABLE. At 10× the
/// CRITICAL share alone is half the capacity.
const MIX: Mix = Mix([50, 250, 700]);
const SEED: u64 = 0x5eed_1e7e;

fn capacity_rps() -> f64 {
    WORKERS as f64 / WORK.as_secs_f64()
}

/// One protection compared.
struct Variant {
    /// Key in the JSON summary.
    name: &'static str,
    protection: Protection,
    traffic: Traffic,
}

/// What the generator sends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Traffic {
    /// `GET /work`, each request with a `levee-criticality` header drawn from [`MIX`]: the
    /// caller says what matters.
    Headers,
    /// No header anywhere: [`MIX`]'s CRITICAL share is `POST /checkout`, the rest
    /// `GET /work` (reported as SHEDDABLE_PLUS), and the service tells them apart by
    /// itself (its default policy's classification, IN-8).
    Routes,
}

impl Traffic {
    fn targets(self) -> Vec<Target> {
        let target = |method, path, share, send_criticality, class| Target {
            method,
            path,
            share,
            send_criticality,
            class,
        };
        match self {
            Traffic::Headers => vec![target(Method::GET, "/work", 1000, true, None)],
            Traffic::Routes => vec![
                target(Method::POST, "/checkout", MIX.0[0], false, Some(Criticality::Critical)),
                target(Method::GET, "/work", 1000 - MIX.0[0], false, Some(Criticality::SheddablePlus)),
            ],
        }
    }
}

fn variants() -> Vec<Variant> {
    vec![
        variant("none", Protection::None),
        variant("tower_concurrency_limit", Protection::TowerFixed { limit: WORKERS }),
        variant("tower_acc_gradient2", Protection::AccGradient2),
        variant("tower_acc_vegas", Protection::AccVegas),
        variant("levee", Protection::Levee(Box::default())),
        variant("levee_gradient2", Protection::Levee(Box::new(algorithm(LimitAlgorithm::Gradient2)))),
        variant("levee_vegas", Protection::Levee(Box::new(algorithm(LimitAlgorithm::Vegas)))),
        // What tower's ConcurrencyLimit is given: the pool size, known in advance.
        variant("levee_fixed", Protection::Levee(Box::new(fixed(WORKERS as u32)))),
        // The default policy with no criticality header anywhere: protection out of the box.
        Variant {
            name: "levee_default_no_headers",
            protection: Protection::Levee(Box::default()),
            traffic: Traffic::Routes,
        },
    ]
}

fn variant(name: &'static str, protection: Protection) -> Variant {
    Variant { name, protection, traffic: Traffic::Headers }
}

/// Levee with a fixed limit, every other setting default.
fn fixed(limit: u32) -> Inbound {
    let mut i = Inbound::default();
    i.limit.algorithm = LimitAlgorithm::Fixed;
    i.limit.initial_limit = limit;
    i
}

/// Levee with another limit algorithm, every other setting default.
fn algorithm(algorithm: LimitAlgorithm) -> Inbound {
    let mut i = Inbound::default();
    i.limit.algorithm = algorithm;
    i
}

impl Command {
    pub fn run(self) -> anyhow::Result<()> {
        match self {
            Command::Overload(args) => args.run(),
        }
    }
}

impl Args {
    /// The protections this run compares (`--only`).
    fn variants(&self) -> Vec<Variant> {
        variants()
            .into_iter()
            .filter(|v| self.only.is_empty() || self.only.iter().any(|o| o == v.name))
            .collect()
    }

    fn run(self) -> anyhow::Result<()> {
        if self.target.target.is_some() {
            return self.run_target();
        }
        // The server and the generator get their own runtimes, so a busy server cannot
        // delay the generator's send times (and the reverse).
        let server_rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("server")
            .enable_all()
            .build()?;
        let client_rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("client")
            .enable_all()
            .build()?;
        let steps: &[f64] = if self.smoke { &SMOKE_STEPS } else { &STEPS };
        let measure = Duration::from_secs_f64(self.step_secs.unwrap_or(if self.smoke { 1.5 } else { 8.0 }));
        let warmup = measure / 4;
        println!(
            "overload: capacity {} rps ({WORKERS} workers x {WORK:?}), deadline {BUDGET:?}, mix CRITICAL/SHEDDABLE_PLUS/SHEDDABLE = {:?} per mille, {warmup:?} warm-up + {measure:?} per step",
            capacity_rps(),
            MIX.0
        );
        let mut out = Map::new();
        if matches!(self.mode, Mode::All | Mode::Steps) {
            let results = self.steps(&server_rt, &client_rt, steps, warmup, measure)?;
            if let Some(path) = &self.plot {
                plot::draw(path, &self.font, capacity_rps(), &results)?;
                println!("plot written to {}", path.display());
            }
            out.extend(summary(&results));
        }
        if matches!(self.mode, Mode::All | Mode::Dependency) {
            println!(
                "dependency: 1000 rps, 10 % POST /checkout (CRITICAL), 90 % GET /product/{{id}} calling a non-critical dependency 20 ms -> 5 s -> 20 ms; 200 handlers; checkout p99 budget {:?}",
                dependency::CHECKOUT_P99_BUDGET
            );
            let rows = client_rt.block_on(dependency::run(server_rt.handle(), self.smoke))?;
            let mut o = Map::new();
            for (name, row) in rows {
                println!("{name:<8} {}", serde_json::to_string(&row)?);
                o.insert(name.into(), serde_json::to_value(row)?);
            }
            out.insert("dependency".into(), Value::Object(o));
        }
        if matches!(self.mode, Mode::All | Mode::Recovery) {
            let mut o = Map::new();
            let [before, during, after] = recovery_phases(self.smoke);
            println!(
                "recovery: 0.5x for {before:?}, 10x for {during:?}, 0.5x for {after:?}; time until every 250 ms bucket has >= 95 % goodput"
            );
            for variant in self.variants() {
                let secs = client_rt.block_on(run_recovery(server_rt.handle(), &variant, self.smoke))?;
                println!(
                    "{:<24} recovered after {}",
                    variant.name,
                    secs.map_or("never (within the run)".into(), |s| format!("{s} s"))
                );
                o.insert(variant.name.into(), json!(secs));
            }
            out.insert("recovery_s".into(), Value::Object(o));
        }
        let out = Value::Object(out);
        println!("{out}");
        if self.check {
            check(&out, self.mode)?;
        }
        Ok(())
    }

    /// `--target URL`: the probe and the ramp against that service (module [`target`]).
    fn run_target(&self) -> anyhow::Result<()> {
        anyhow::ensure!(self.mode == Mode::All, "--mode does not apply to --target (it runs its own ramp)");
        let plan = self.target.plan(self.smoke, self.step_secs)?;
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("client")
            .enable_all()
            .build()?;
        println!(
            "overload --target {} {}{}: deadline {:?}, mix CRITICAL/SHEDDABLE_PLUS/SHEDDABLE = {:?} per mille, at most {} rps",
            plan.method, plan.base, plan.path, plan.deadline, plan.mix.0, plan.max_rps
        );
        let run = rt.block_on(target::run(&plan))?;
        if let Some(path) = &self.plot {
            target_plot::draw(path, &self.font, &plan, &run)?;
            println!("plot written to {}", path.display());
        }
        let out = target::summary(&plan, &run);
        for line in target::conclusions(&out) {
            println!("{line}");
        }
        println!("{out}");
        if self.check {
            target::check(&out)?;
        }
        Ok(())
    }

    fn steps(
        &self,
        server_rt: &tokio::runtime::Runtime,
        client_rt: &tokio::runtime::Runtime,
        steps: &[f64],
        warmup: Duration,
        measure: Duration,
    ) -> anyhow::Result<Vec<(&'static str, Vec<Step>)>> {
        println!(
            "{:<24} {:>5} {:>9} {:>9} {:>8} {:>8} {:>7} {:>7} {:>22} {:>17}",
            "protection",
            "x",
            "offered",
            "goodput",
            "p50 ms",
            "p99 ms",
            "shed",
            "late",
            "good CRIT/S+/S",
            "p99 CRIT/S+/S"
        );
        let mut results = Vec::new();
        for variant in self.variants() {
            let rows = client_rt.block_on(run_steps(
                server_rt.handle(),
                &variant,
                steps,
                warmup,
                measure,
                self.smoke,
            ))?;
            results.push((variant.name, rows));
        }
        Ok(results)
    }
}

/// Recovery run: 0.5× capacity, then 10×, then 0.5× again.
fn recovery_phases(smoke: bool) -> [Duration; 3] {
    if smoke {
        [Duration::from_secs(1), Duration::from_secs(2), Duration::from_secs(3)]
    } else {
        [Duration::from_secs(3), Duration::from_secs(10), Duration::from_secs(10)]
    }
}

/// Seconds from the end of a 10× overload until goodput is back (every later 250 ms
/// bucket answers ≥ 95 % of its requests within the deadline); `None` if not within the
/// run.
async fn run_recovery(
    server_rt: &tokio::runtime::Handle,
    variant: &Variant,
    smoke: bool,
) -> anyhow::Result<Option<f64>> {
    let [before, during, after] = recovery_phases(smoke);
    let pool = Pool::new(WORKERS);
    let router = work_router(pool.clone(), WORK);
    let protection = variant.protection.clone();
    let server = server_rt.spawn(async move { Server::start(protect(router, &protection)).await }).await??;
    let generator = Generator::new(server.addr, variant.traffic.targets(), MIX, BUDGET, SEED);
    let low = 0.5 * capacity_rps();
    let phases = [
        Phase { rps: low, duration: before },
        Phase { rps: 10.0 * capacity_rps(), duration: during },
        Phase { rps: low, duration: after },
    ];
    let samples = generator.run(&phases).await;
    drop(server);
    pool.close();
    let end = before + during + after;
    Ok(dependency::recovery(&samples, before + during, end, 0.95, |_| true, |s| s.good(BUDGET)))
}

/// One protection through every step, on one server (an adaptive limit carries what it
/// learnt from step to step, as in a service whose load grows), after a warm-up at 0.5×.
async fn run_steps(
    server_rt: &tokio::runtime::Handle,
    variant: &Variant,
    steps: &[f64],
    warmup: Duration,
    measure: Duration,
    smoke: bool,
) -> anyhow::Result<Vec<Step>> {
    let pool = Pool::new(WORKERS);
    let router = work_router(pool.clone(), WORK);
    let protection = variant.protection.clone();
    let server = server_rt.spawn(async move { Server::start(protect(router, &protection)).await }).await??;
    let generator = Generator::new(server.addr, variant.traffic.targets(), MIX, BUDGET, SEED);
    let first = Duration::from_secs(if smoke { 1 } else { 3 });
    generator.run(&[Phase { rps: 0.5 * capacity_rps(), duration: first }]).await;
    let mut rows = Vec::new();
    for &multiple in steps {
        let phase = Phase { rps: multiple * capacity_rps(), duration: warmup + measure };
        let samples = generator.run(&[phase]).await;
        // Every client has its answer or gave up; what still waits for a worker is
        // abandoned work, which must not slow the next step.
        pool.reset();
        let step = Step::measure(multiple, &samples, (warmup, warmup + measure), BUDGET);
        print_step(variant.name, &step);
        rows.push(step);
    }
    drop(server);
    pool.close();
    Ok(rows)
}

fn print_step(name: &str, s: &Step) {
    let [c, sp, sh] = s.goodput_ratio_by_criticality;
    let [pc, psp, psh] = s.p99_admitted_ms_by_criticality;
    println!(
        "{:<24} {:>5} {:>9.0} {:>9.0} {:>8.1} {:>8.1} {:>6.1}% {:>6.1}% {:>6.1}%/{:>5.1}%/{:>5.1}% {:>5.0}/{:>5.0}/{:>5.0}",
        name,
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

/// The JSON summary of the steps: Levee's figures at the top level, each peer's under
/// `peers`. Goodput ratios are relative to the peak goodput measured in the run (any
/// protection, any step), so every protection is compared with the same reference.
fn summary(results: &[(&str, Vec<Step>)]) -> Map<String, Value> {
    let peak = results
        .iter()
        .flat_map(|(_, rows)| rows.iter().map(|s| s.goodput_rps))
        .fold(0.0_f64, f64::max)
        .max(1.0);
    let figures = |rows: &[Step]| -> Map<String, Value> {
        let at = |m: f64| rows.iter().find(|s| (s.multiple - m).abs() < 1e-9);
        let mut o = Map::new();
        let unloaded = rows.first();
        o.insert("goodput_ratio_at_3x".into(), json!(at(3.0).map(|s| round3(s.goodput_rps / peak))));
        o.insert("goodput_ratio_at_10x".into(), json!(at(10.0).map(|s| round3(s.goodput_rps / peak))));
        o.insert(
            "critical_goodput_ratio_at_10x".into(),
            json!(at(10.0).map(|s| round3(s.goodput_ratio_by_criticality[0]))),
        );
        o.insert("p99_admitted_ms_at_3x".into(), json!(at(3.0).map(|s| round3(s.p99_admitted_ms))));
        o.insert("p99_unloaded_ms".into(), json!(unloaded.map(|s| round3(s.p99_admitted_ms))));
        o
    };
    let mut top = Map::new();
    top.insert("capacity_rps".into(), json!(capacity_rps()));
    top.insert("peak_goodput_rps".into(), json!(round3(peak)));
    let mut peers = Map::new();
    let mut variants = Map::new();
    for (name, rows) in results {
        if *name == "levee" {
            top.extend(figures(rows));
        } else if let Some(v) = name.strip_prefix("levee_") {
            variants.insert(v.into(), Value::Object(figures(rows)));
        } else {
            peers.insert((*name).into(), Value::Object(figures(rows)));
        }
    }
    top.insert("peers".into(), Value::Object(peers));
    top.insert("levee_variants".into(), Value::Object(variants));
    top
}

/// The figures every summary of the steps has, for Levee and for each peer.
pub const FIGURES: [&str; 5] = [
    "goodput_ratio_at_3x",
    "goodput_ratio_at_10x",
    "critical_goodput_ratio_at_10x",
    "p99_admitted_ms_at_3x",
    "p99_unloaded_ms",
];

/// The CI check of a summary. Timings on a shared 2-core machine vary too much for
/// absolute floors (targets.md: ratios side by side, not timed assertions), so it checks
/// that every figure is there and the comparisons that follow from the set-up whatever
/// the load: at 10× capacity an unprotected service answers (almost) nothing in time while
/// Levee keeps CRITICAL traffic going; with the slow dependency the unprotected service
/// starves checkout while Levee serves it and degrades the pages rather than fail them.
pub fn check(summary: &Value, mode: Mode) -> anyhow::Result<()> {
    let num = |v: &Value, path: &str| -> anyhow::Result<f64> {
        v.pointer(path)
            .and_then(Value::as_f64)
            .ok_or_else(|| anyhow::anyhow!("summary has no number at {path}: {v}"))
    };
    if matches!(mode, Mode::All | Mode::Steps) {
        for f in FIGURES {
            num(summary, &format!("/{f}"))?;
            for peer in ["none", "tower_concurrency_limit", "tower_acc_gradient2", "tower_acc_vegas"] {
                num(summary, &format!("/peers/{peer}/{f}"))?;
            }
        }
        let levee = num(summary, "/critical_goodput_ratio_at_10x")?;
        let none = num(summary, "/peers/none/critical_goodput_ratio_at_10x")?;
        anyhow::ensure!(
            levee > none,
            "CRITICAL goodput at 10x: Levee {levee} is not above no protection {none}"
        );
    }
    if matches!(mode, Mode::All | Mode::Dependency) {
        let levee = num(summary, "/dependency/levee/checkout_goodput_ratio_slow")?;
        let none = num(summary, "/dependency/none/checkout_goodput_ratio_slow")?;
        anyhow::ensure!(levee > none, "checkout goodput with a slow dependency: Levee {levee}, none {none}");
        let degraded = num(summary, "/dependency/levee/page_degraded_ratio_slow")?;
        let failed = num(summary, "/dependency/levee/page_5xx_ratio_slow")?;
        anyhow::ensure!(
            degraded > failed,
            "pages must be served degraded rather than fail: {degraded} vs {failed}"
        );
    }
    if matches!(mode, Mode::All | Mode::Recovery) {
        anyhow::ensure!(
            summary.pointer("/recovery_s/levee").is_some(),
            "summary has no recovery figure for Levee: {summary}"
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn figures(critical: f64) -> Value {
        json!({"goodput_ratio_at_3x": 1.0, "goodput_ratio_at_10x": 1.0, "critical_goodput_ratio_at_10x": critical,
               "p99_admitted_ms_at_3x": 120.0, "p99_unloaded_ms": 105.0})
    }

    fn steps_summary(levee: f64, none: f64) -> Value {
        let mut s = figures(levee);
        s["peers"] = json!({"none": figures(none), "tower_concurrency_limit": figures(0.1),
                            "tower_acc_gradient2": figures(0.1), "tower_acc_vegas": figures(0.1)});
        s
    }

    #[test]
    fn the_check_needs_every_figure_and_levee_ahead_of_no_protection() {
        assert!(check(&steps_summary(1.0, 0.0), Mode::Steps).is_ok());
        let err = check(&steps_summary(0.0, 0.0), Mode::Steps).unwrap_err().to_string();
        assert!(err.contains("not above no protection"), "{err}");
        let mut missing = steps_summary(1.0, 0.0);
        missing["peers"]["tower_acc_vegas"].as_object_mut().unwrap().remove("p99_unloaded_ms");
        let err = check(&missing, Mode::Steps).unwrap_err().to_string();
        assert!(err.contains("/peers/tower_acc_vegas/p99_unloaded_ms"), "{err}");
    }

    #[test]
    fn the_check_of_the_dependency_scenario_wants_checkout_kept_and_pages_degraded() {
        let dep = |levee_checkout: f64, degraded: f64, failed: f64| {
            json!({"dependency": {
                "levee": {"checkout_goodput_ratio_slow": levee_checkout, "page_degraded_ratio_slow": degraded,
                          "page_5xx_ratio_slow": failed},
                "none": {"checkout_goodput_ratio_slow": 0.05}}})
        };
        assert!(check(&dep(1.0, 0.99, 0.0), Mode::Dependency).is_ok());
        assert!(check(&dep(0.01, 0.99, 0.0), Mode::Dependency).is_err());
        assert!(check(&dep(1.0, 0.0, 0.9), Mode::Dependency).is_err());
    }

    /// The summary's top-level figures are Levee's; the ratios are against the run's peak.
    #[test]
    fn the_summary_puts_levee_on_top_and_the_peers_below() {
        let step = |m: f64, goodput: f64| Step {
            multiple: m,
            offered_rps: m * 400.0,
            goodput_rps: goodput,
            p50_admitted_ms: 100.0,
            p99_admitted_ms: 110.0,
            rejected_ratio: 0.0,
            timed_out_ratio: 0.0,
            goodput_ratio_by_criticality: [1.0, 1.0, 1.0],
            goodput_rps_by_criticality: [goodput / 3.0; 3],
            p99_admitted_ms_by_criticality: [110.0; 3],
        };
        let rows = vec![step(0.5, 200.0), step(3.0, 400.0), step(10.0, 380.0)];
        let none = vec![step(0.5, 200.0), step(3.0, 0.0), step(10.0, 0.0)];
        let s = Value::Object(summary(&[("none", none), ("levee", rows.clone()), ("levee_gradient2", rows)]));
        assert_eq!(s["goodput_ratio_at_10x"], json!(0.95));
        assert_eq!(s["peers"]["none"]["goodput_ratio_at_3x"], json!(0.0));
        assert_eq!(s["levee_variants"]["gradient2"]["p99_unloaded_ms"], json!(110.0));
        assert_eq!(s["peak_goodput_rps"], json!(400.0));
    }
}

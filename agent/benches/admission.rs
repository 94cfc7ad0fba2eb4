//! Inbound admission of a request when the limit is not reached, side by side with
//! `tower-acc` (Gradient2, adaptive) and tower's `ConcurrencyLimit` (fixed), in one run
//! (targets.md: "inbound admission … ≤ 100 ns/call, 0 allocations").
//!
//! Each iteration admits one request, awaits an immediately ready future under it, and
//! releases the slot. Levee: `Admission::try_admit` on a named route with a criticality,
//! under the default policy (AIMD: every request measured) and under a fixed limit; the
//! peers: a `ready().await` + `call()` through their layer around a ready service.
//!
//! `cargo bench -p levee-agent --bench admission`; `LEVEE_BENCH_SMOKE=1` (or `-- --quick`)
//! for a short CI run. After criterion, prints ns/call (best of several runs) and heap
//! allocations per call, and asserts that Levee's admission allocates nothing.

use std::alloc::System;
use std::future::ready;
use std::time::Duration;

use criterion::Criterion;
use levee_agent::admission::{Admission, AdmissionRequest};
use levee_agent::policy::{Criticality, Inbound, Limit, LimitAlgorithm};
use stats_alloc::{INSTRUMENTED_SYSTEM, Region, StatsAlloc};
use tokio::time::Instant;
use tower::{Service, ServiceExt};

#[global_allocator]
static GLOBAL: &StatsAlloc<System> = &INSTRUMENTED_SYSTEM;

fn smoke() -> bool {
    std::env::var_os("LEVEE_BENCH_SMOKE").is_some_and(|v| v != "0")
        || std::env::args().any(|a| a == "--quick")
}

const ROUTE: &str = "GET /quote/{sku}";

async fn levee_calls(a: &Admission, n: u64) {
    let req = AdmissionRequest::new(ROUTE).criticality(Criticality::Critical);
    for _ in 0..n {
        let permit = a.try_admit(&req).expect("not saturated");
        let v = ready(1u32).await;
        std::hint::black_box(v);
        drop(permit);
    }
}

async fn tower_calls<S: Service<(), Response = u32> + Clone>(svc: &S, n: u64)
where
    S::Error: std::fmt::Debug,
{
    let mut svc = svc.clone();
    for _ in 0..n {
        let v = svc.ready().await.unwrap().call(()).await.unwrap();
        std::hint::black_box(v);
    }
}

fn inner() -> impl Service<(), Response = u32, Error = std::convert::Infallible, Future: Send> + Clone {
    tower::service_fn(|()| ready(Ok::<u32, std::convert::Infallible>(1)))
}

fn best_of(rounds: usize, mut f: impl FnMut() -> Duration, n: u64) -> f64 {
    (0..rounds).map(|_| f().as_nanos() as f64 / n as f64).fold(f64::INFINITY, f64::min)
}

fn main() {
    let mut c = Criterion::default().configure_from_args();
    if smoke() {
        c = c
            .warm_up_time(Duration::from_millis(50))
            .measurement_time(Duration::from_millis(200))
            .sample_size(10);
    }
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let (adaptive, fixed, agent) = rt.block_on(async {
        let fixed = Inbound {
            limit: Limit { algorithm: LimitAlgorithm::Fixed, initial_limit: 1000, ..Limit::default() },
            ..Inbound::default()
        };
        // An agent on compiled-in defaults (no control plane reachable): its engine also
        // checks, per request, whether the agent applied a new configuration.
        let agent =
            levee_agent::Agent::builder("http://127.0.0.1:9", "bench", "bench", "bench").build().unwrap();
        (Admission::new(&Inbound::default()), Admission::new(&fixed), agent)
    });
    let agents = agent.admission();
    let tower_fixed = tower::limit::ConcurrencyLimit::new(inner(), 1000);
    let acc =
        tower::Layer::layer(&tower_acc::ConcurrencyLimitLayer::new(tower_acc::Gradient2::default()), inner());

    let mut g = c.benchmark_group("inbound_admission");
    for (name, a) in [("levee_aimd", &adaptive), ("levee_fixed", &fixed), ("levee_agent_engine", &agents)] {
        g.bench_function(name, |b| {
            b.to_async(&rt).iter_custom(|iters| async move {
                let start = Instant::now();
                levee_calls(a, iters).await;
                start.elapsed()
            })
        });
    }
    g.bench_function("tower_acc_gradient2", |b| {
        b.to_async(&rt).iter_custom(|iters| {
            let svc = acc.clone();
            async move {
                let start = Instant::now();
                tower_calls(&svc, iters).await;
                start.elapsed()
            }
        })
    });
    g.bench_function("tower_concurrency_limit", |b| {
        b.to_async(&rt).iter_custom(|iters| {
            let svc = tower_fixed.clone();
            async move {
                let start = Instant::now();
                tower_calls(&svc, iters).await;
                start.elapsed()
            }
        })
    });
    g.finish();
    c.final_summary();

    let (n, rounds) = if smoke() { (20_000u64, 3) } else { (500_000u64, 7) };
    let timed_levee = |a: &Admission| {
        best_of(
            rounds,
            || {
                rt.block_on(async {
                    let start = Instant::now();
                    levee_calls(a, n).await;
                    start.elapsed()
                })
            },
            n,
        )
    };
    let timed_tower = |svc: &dyn Fn() -> Duration| best_of(rounds, svc, n);
    let ours = timed_levee(&adaptive);
    let ours_fixed = timed_levee(&fixed);
    let ours_agent = timed_levee(&agents);
    let acc_ns = timed_tower(&|| {
        rt.block_on(async {
            let start = Instant::now();
            tower_calls(&acc, n).await;
            start.elapsed()
        })
    });
    let tower_ns = timed_tower(&|| {
        rt.block_on(async {
            let start = Instant::now();
            tower_calls(&tower_fixed, n).await;
            start.elapsed()
        })
    });

    let calls = 10_000u64;
    let allocs = |f: &dyn Fn()| {
        f(); // warm up lazily initialised state (route registration, metric handles)
        let region = Region::new(GLOBAL);
        f();
        region.change().allocations as f64 / calls as f64
    };
    let ours_allocs = allocs(&|| rt.block_on(levee_calls(&adaptive, calls)));
    let ours_fixed_allocs = allocs(&|| rt.block_on(levee_calls(&fixed, calls)));
    let ours_agent_allocs = allocs(&|| rt.block_on(levee_calls(&agents, calls)));
    let acc_allocs = allocs(&|| rt.block_on(tower_calls(&acc, calls)));
    let tower_allocs = allocs(&|| rt.block_on(tower_calls(&tower_fixed, calls)));
    // Hot-path discipline, checked on every run (smoke mode in CI included): admitting a
    // request below the limit allocates nothing.
    assert!(ours_allocs < 0.01, "admission allocates: {ours_allocs:.2} allocations per request");
    assert!(ours_fixed_allocs < 0.01, "admission allocates: {ours_fixed_allocs:.2} allocations per request");
    assert!(ours_agent_allocs < 0.01, "admission allocates: {ours_agent_allocs:.2} allocations per request");

    println!("\n== inbound admission, not saturated (best of {rounds} runs, {n} requests) ==");
    println!("{:<26} {:>10} {:>14}", "impl", "ns/call", "allocs/call");
    println!("{:<26} {:>10.1} {:>14.2}", "levee (AIMD, default)", ours, ours_allocs);
    println!("{:<26} {:>10.1} {:>14.2}", "levee (fixed limit)", ours_fixed, ours_fixed_allocs);
    println!("{:<26} {:>10.1} {:>14.2}", "levee (an agent's engine)", ours_agent, ours_agent_allocs);
    println!("{:<26} {:>10.1} {:>14.2}", "tower-acc Gradient2", acc_ns, acc_allocs);
    println!("{:<26} {:>10.1} {:>14.2}", "tower ConcurrencyLimit", tower_ns, tower_allocs);
    println!(
        "ratio tower-acc / levee: {:.1}x; tower ConcurrencyLimit / levee: {:.1}x\n",
        acc_ns / ours,
        tower_ns / ours
    );
}

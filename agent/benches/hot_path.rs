//! Hot-path benchmarks of the agent's resilience primitives, side by side with published
//! peers on the same workload, in one run (docs: shared/spec/targets.md, "Agent hot path").
//!
//! `cargo bench -p levee-agent --bench hot_path` runs criterion on every pair and then
//! prints a summary table (ns/call, ratios, heap allocations per call counted by a
//! counting global allocator). `LEVEE_BENCH_SMOKE=1` (or `-- --quick`) makes both short
//! enough for CI.

use std::alloc::System;
use std::hint::black_box;
use std::sync::{Arc, Barrier};
use std::time::Duration;

use criterion::{BenchmarkId, Criterion};
use levee_agent::breaker::{CircuitBreaker, Outcome};
use levee_agent::bulkhead::Bulkhead;
use levee_agent::policy;
use stats_alloc::{INSTRUMENTED_SYSTEM, Region, StatsAlloc};
use tokio::time::Instant;
use tower::{Layer, Service, ServiceExt};

#[global_allocator]
static GLOBAL: &StatsAlloc<System> = &INSTRUMENTED_SYSTEM;

const ELAPSED: Duration = Duration::from_micros(200);

fn smoke() -> bool {
    std::env::var_os("LEVEE_BENCH_SMOKE").is_some_and(|v| v != "0")
        || std::env::args().any(|a| a == "--quick")
}

fn levee_breaker() -> CircuitBreaker {
    CircuitBreaker::new(&policy::CircuitBreakerPolicy::default(), Duration::from_secs(1))
}

fn recloser() -> recloser::Recloser {
    // Same window and threshold as Levee's defaults.
    recloser::Recloser::custom().error_rate(0.5).closed_len(100).build()
}

type Failsafe = failsafe::StateMachine<
    failsafe::failure_policy::OrElse<
        failsafe::failure_policy::SuccessRateOverTimeWindow<failsafe::backoff::EqualJittered>,
        failsafe::failure_policy::ConsecutiveFailures<failsafe::backoff::EqualJittered>,
    >,
    (),
>;

fn failsafe() -> Failsafe {
    failsafe::Config::new().build()
}

#[inline]
fn levee_call(b: &CircuitBreaker) {
    if let Ok(p) = b.try_acquire() {
        p.record(Outcome::Success, black_box(ELAPSED));
    }
}

#[inline]
fn recloser_call(r: &recloser::Recloser) {
    let _ = black_box(r.call(|| Ok::<(), ()>(())));
}

#[inline]
fn failsafe_call(f: &Failsafe) {
    if f.is_call_permitted() {
        f.on_success();
    }
}

thread_local! {
    static CALLS: std::cell::Cell<u32> = const { std::cell::Cell::new(0) };
}

/// One call in 100 fails: the window always holds a few failures (never enough to trip),
/// so every record goes through the window. The realistic case of a healthy dependency.
#[inline]
fn one_in_100_fails() -> bool {
    CALLS.with(|c| {
        let n = c.get().wrapping_add(1);
        c.set(n);
        n % 100 == 0
    })
}

#[inline]
fn levee_call_mixed(b: &CircuitBreaker) {
    let outcome = if one_in_100_fails() { Outcome::Failure } else { Outcome::Success };
    if let Ok(p) = b.try_acquire() {
        p.record(outcome, black_box(ELAPSED));
    }
}

#[inline]
fn recloser_call_mixed(r: &recloser::Recloser) {
    let fail = one_in_100_fails();
    let _ = black_box(r.call(|| if fail { Err(()) } else { Ok(()) }));
}

#[inline]
fn failsafe_call_mixed(f: &Failsafe) {
    let fail = one_in_100_fails();
    if f.is_call_permitted() {
        if fail { f.on_error() } else { f.on_success() }
    }
}

fn levee_bulkhead() -> Bulkhead {
    Bulkhead::new(&policy::BulkheadPolicy::default())
}

#[inline]
fn bulkhead_call(b: &Bulkhead) {
    if let Ok(p) = b.try_acquire() {
        black_box(&p);
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap()
}

/// Wall time for each of `threads` threads to make `iters` calls on one shared value.
fn contended<T: Sync>(shared: &T, threads: usize, iters: u64, call: fn(&T)) -> Duration {
    let barrier = Barrier::new(threads + 1);
    std::thread::scope(|s| {
        for _ in 0..threads {
            s.spawn(|| {
                barrier.wait();
                for _ in 0..iters {
                    call(black_box(shared));
                }
                barrier.wait();
            });
        }
        // Start the clock before releasing the workers: a main thread descheduled after the
        // release must not miss their work (it can only over-count, and we keep the best).
        let start = Instant::now();
        barrier.wait();
        barrier.wait();
        start.elapsed()
    })
}

fn bench_breaker(c: &mut Criterion) {
    let mut g = c.benchmark_group("breaker_closed_allow_record");
    let (ours, rc, fs) = (levee_breaker(), recloser(), failsafe());
    g.bench_function(BenchmarkId::new("levee", "1thread"), |b| b.iter(|| levee_call(&ours)));
    g.bench_function(BenchmarkId::new("recloser", "1thread"), |b| b.iter(|| recloser_call(&rc)));
    g.bench_function(BenchmarkId::new("failsafe", "1thread"), |b| b.iter(|| failsafe_call(&fs)));
    g.bench_function(BenchmarkId::new("levee", "1thread_1pct_failures"), |b| {
        b.iter(|| levee_call_mixed(&ours))
    });
    g.bench_function(BenchmarkId::new("recloser", "1thread_1pct_failures"), |b| {
        b.iter(|| recloser_call_mixed(&rc))
    });
    g.bench_function(BenchmarkId::new("failsafe", "1thread_1pct_failures"), |b| {
        b.iter(|| failsafe_call_mixed(&fs))
    });
    g.bench_function(BenchmarkId::new("levee", "2threads"), |b| {
        b.iter_custom(|iters| contended(&ours, 2, iters, levee_call))
    });
    g.bench_function(BenchmarkId::new("recloser", "2threads"), |b| {
        b.iter_custom(|iters| contended(&rc, 2, iters, recloser_call))
    });
    g.bench_function(BenchmarkId::new("failsafe", "2threads"), |b| {
        b.iter_custom(|iters| contended(&fs, 2, iters, failsafe_call))
    });
    g.finish();
}

/// A service that answers at once, wrapped by each contender, driven the same way.
fn bench_tower(c: &mut Criterion) {
    let rt = runtime();
    let mut g = c.benchmark_group("tower_service_call");
    let inner = tower::service_fn(|_: ()| std::future::ready(Ok::<(), std::io::Error>(())));

    let breaker = Arc::new(levee_breaker());
    g.bench_function("levee_breaker", |b| {
        b.to_async(&rt).iter_custom(|iters| {
            let (breaker, mut svc) = (breaker.clone(), inner);
            async move {
                let start = Instant::now();
                for _ in 0..iters {
                    let permit = breaker.try_acquire().unwrap();
                    let r = svc.ready().await.unwrap().call(()).await;
                    permit.record(if r.is_ok() { Outcome::Success } else { Outcome::Failure }, ELAPSED);
                }
                start.elapsed()
            }
        })
    });
    let layer = tower_resilience::circuitbreaker::CircuitBreakerLayer::builder()
        .failure_rate_threshold(0.5)
        .sliding_window_size(100)
        .build()
        .unwrap();
    let theirs = layer.layer(inner);
    g.bench_function("tower_resilience_breaker", |b| {
        b.to_async(&rt).iter_custom(|iters| {
            let mut svc = theirs.clone();
            async move {
                let start = Instant::now();
                for _ in 0..iters {
                    svc.ready().await.unwrap().call(()).await.unwrap();
                }
                start.elapsed()
            }
        })
    });

    let bulkhead = levee_bulkhead();
    g.bench_function("levee_bulkhead", |b| {
        b.to_async(&rt).iter_custom(|iters| {
            let (bulkhead, mut svc) = (bulkhead.clone(), inner);
            async move {
                let start = Instant::now();
                for _ in 0..iters {
                    let _permit = bulkhead.acquire(None).await.unwrap();
                    svc.ready().await.unwrap().call(()).await.unwrap();
                }
                start.elapsed()
            }
        })
    });
    let layer =
        tower_resilience::bulkhead::BulkheadLayer::builder().max_concurrent_calls(25).build().unwrap();
    let theirs = layer.layer(inner);
    g.bench_function("tower_resilience_bulkhead", |b| {
        b.to_async(&rt).iter_custom(|iters| {
            let mut svc = theirs.clone();
            async move {
                let start = Instant::now();
                for _ in 0..iters {
                    svc.ready().await.unwrap().call(()).await.unwrap();
                }
                start.elapsed()
            }
        })
    });
    g.finish();
}

/// ns per call: best of `rounds` runs of `n` calls (on `threads` threads sharing `shared`).
fn ns_per_call<T: Sync>(shared: &T, threads: usize, n: u64, rounds: u32, call: fn(&T)) -> f64 {
    (0..rounds)
        .map(|_| contended(shared, threads, n, call).as_nanos() as f64 / n as f64)
        .fold(f64::INFINITY, f64::min)
}

fn allocs_per_call<T>(shared: &T, n: u64, call: fn(&T)) -> f64 {
    call(shared); // warm up lazily initialised state
    let region = Region::new(GLOBAL);
    for _ in 0..n {
        call(shared);
    }
    region.change().allocations as f64 / n as f64
}

fn allocs_per_async_call(
    rt: &tokio::runtime::Runtime,
    n: u64,
    fut: impl std::future::Future<Output = ()>,
) -> f64 {
    let region = Region::new(GLOBAL);
    rt.block_on(fut);
    region.change().allocations as f64 / n as f64
}

/// Prints the figures targets.md asks for, measured side by side in this run.
fn summary() {
    let (n, rounds) = if smoke() { (200_000, 3) } else { (5_000_000, 9) };
    let (ours, rc, fs) = (levee_breaker(), recloser(), failsafe());
    let rows = [
        (
            "levee",
            ns_per_call(&ours, 1, n, rounds, levee_call),
            ns_per_call(&ours, 2, n, rounds, levee_call),
            allocs_per_call(&ours, 100_000, levee_call),
        ),
        (
            "recloser",
            ns_per_call(&rc, 1, n, rounds, recloser_call),
            ns_per_call(&rc, 2, n, rounds, recloser_call),
            allocs_per_call(&rc, 100_000, recloser_call),
        ),
        (
            "failsafe",
            ns_per_call(&fs, 1, n / 4, rounds, failsafe_call),
            ns_per_call(&fs, 2, n / 8, rounds, failsafe_call),
            allocs_per_call(&fs, 100_000, failsafe_call),
        ),
    ];
    println!("\n== breaker allow+record, CLOSED (best of {rounds} runs, {n} calls per thread) ==");
    println!(
        "{:<10} {:>12} {:>14} {:>10} {:>14}",
        "impl", "1 thread ns", "2 threads ns", "2t / 1t", "allocs/call"
    );
    for (name, one, two, allocs) in rows {
        println!("{name:<10} {one:>12.1} {two:>14.1} {:>10.2} {allocs:>14.3}", two / one);
    }
    let (l1, l2) = (rows[0].1, rows[0].2);
    println!(
        "levee vs recloser: {:.2}x (1t), {:.2}x (2t); levee vs failsafe: {:.2}x (1t), {:.2}x (2t)",
        rows[1].1 / l1,
        rows[1].2 / l2,
        rows[2].1 / l1,
        rows[2].2 / l2
    );
    let (ours, rc, fs) = (levee_breaker(), recloser(), failsafe());
    let mixed = [
        (
            "levee",
            ns_per_call(&ours, 1, n, rounds, levee_call_mixed),
            ns_per_call(&ours, 2, n, rounds, levee_call_mixed),
        ),
        (
            "recloser",
            ns_per_call(&rc, 1, n, rounds, recloser_call_mixed),
            ns_per_call(&rc, 2, n, rounds, recloser_call_mixed),
        ),
        (
            "failsafe",
            ns_per_call(&fs, 1, n / 4, rounds, failsafe_call_mixed),
            ns_per_call(&fs, 2, n / 8, rounds, failsafe_call_mixed),
        ),
    ];
    println!("\n== same, 1 call in 100 failing (the window always holds failures; nothing trips) ==");
    println!("{:<10} {:>12} {:>14} {:>10}", "impl", "1 thread ns", "2 threads ns", "2t / 1t");
    for (name, one, two) in mixed {
        println!("{name:<10} {one:>12.1} {two:>14.1} {:>10.2}", two / one);
    }
    println!(
        "levee vs recloser: {:.2}x (1t), {:.2}x (2t); levee vs failsafe: {:.2}x (1t), {:.2}x (2t)",
        mixed[1].1 / mixed[0].1,
        mixed[1].2 / mixed[0].2,
        mixed[2].1 / mixed[0].1,
        mixed[2].2 / mixed[0].2
    );

    let bh = levee_bulkhead();
    println!(
        "\n== bulkhead try_acquire+release: {:.1} ns/call (1 thread), {:.1} ns/call (2 threads), {:.3} allocs/call ==",
        ns_per_call(&bh, 1, n, rounds, bulkhead_call),
        ns_per_call(&bh, 2, n, rounds, bulkhead_call),
        allocs_per_call(&bh, 100_000, bulkhead_call)
    );

    // Memory of 1,000 dependencies, each with a breaker, a bulkhead and a retry budget
    // (default settings), as heap bytes still allocated plus the values' own size.
    let region = Region::new(GLOBAL);
    let deps: Vec<_> = (0..1000)
        .map(|_| {
            (
                levee_breaker(),
                levee_bulkhead(),
                levee_agent::retry::RetryBudget::new(&policy::RetryBudgetPolicy::default()),
            )
        })
        .collect();
    let stats = region.change();
    let heap = stats.bytes_allocated as i64 - stats.bytes_deallocated as i64;
    println!(
        "\n== memory: 1,000 x (breaker + bulkhead + retry budget) = {:.2} MB (heap incl. the Vec), {} B per dependency ==",
        heap as f64 / 1e6,
        heap / 1000
    );
    drop(deps);

    // Allocations per call through the tower-style service wrappers (success path).
    let rt = runtime();
    let inner = tower::service_fn(|_: ()| std::future::ready(Ok::<(), std::io::Error>(())));
    let calls = 10_000u64;
    let breaker = levee_breaker();
    let ours_breaker = allocs_per_async_call(&rt, calls, async {
        let mut svc = inner;
        for _ in 0..calls {
            let p = breaker.try_acquire().unwrap();
            svc.ready().await.unwrap().call(()).await.unwrap();
            p.record(Outcome::Success, ELAPSED);
        }
    });
    let mut theirs_breaker =
        tower_resilience::circuitbreaker::CircuitBreakerLayer::builder().build().unwrap().layer(inner);
    let theirs_breaker = allocs_per_async_call(&rt, calls, async {
        for _ in 0..calls {
            theirs_breaker.ready().await.unwrap().call(()).await.unwrap();
        }
    });
    let bulkhead = levee_bulkhead();
    let ours_bulkhead = allocs_per_async_call(&rt, calls, async {
        let mut svc = inner;
        for _ in 0..calls {
            let _p = bulkhead.acquire(None).await.unwrap();
            svc.ready().await.unwrap().call(()).await.unwrap();
        }
    });
    let mut theirs_bulkhead =
        tower_resilience::bulkhead::BulkheadLayer::builder().build().unwrap().layer(inner);
    let theirs_bulkhead = allocs_per_async_call(&rt, calls, async {
        for _ in 0..calls {
            theirs_bulkhead.ready().await.unwrap().call(()).await.unwrap();
        }
    });
    println!("\n== heap allocations per service call (success path) ==");
    println!("levee breaker {ours_breaker:.2}, tower-resilience breaker {theirs_breaker:.2}");
    println!("levee bulkhead {ours_bulkhead:.2}, tower-resilience bulkhead {theirs_bulkhead:.2}");
    println!("(criterion's per-benchmark times are above; tower_service_call compares the wrappers)\n");
}

fn main() {
    let mut c = Criterion::default().configure_from_args();
    if smoke() {
        c = c
            .warm_up_time(Duration::from_millis(50))
            .measurement_time(Duration::from_millis(200))
            .sample_size(10);
    }
    bench_breaker(&mut c);
    bench_tower(&mut c);
    c.final_summary();
    summary();
}

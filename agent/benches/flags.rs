//! Flag reads: `FlagBool::get()` (target ≤ 5 ns, one atomic load) against the same flag
//! evaluated through the OpenFeature API (target: ≥ 10× slower than the handle).
//!
//! Full run:  `cargo bench -p levee-agent --features openfeature --bench flags`
//! Smoke run: `cargo bench -p levee-agent --features openfeature --bench flags -- --test`
//! (each benchmark once, as CI does), or `LEVEE_BENCH_QUICK=1` for short measurements.

use std::hint::black_box;
use std::time::Duration;

use criterion::{Criterion, criterion_group, criterion_main};
use levee_agent::Agent;

fn agent(rt: &tokio::runtime::Runtime) -> Agent {
    // Nothing listens on the discard port: the agent runs on its compiled-in defaults and
    // its sync task backs off in the background, off the measured path.
    rt.block_on(async {
        Agent::builder("http://127.0.0.1:9", "bench", "bench", "flags").build().expect("agent")
    })
}

fn flags(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
    let agent = agent(&rt);
    let flag = agent.flag_bool("recommendations.enabled", true);
    let mut group = c.benchmark_group("flag_bool");
    group.bench_function("handle_get", |b| b.iter(|| black_box(&flag).get()));
    group.bench_function("handle_get_for", |b| b.iter(|| black_box(&flag).get_for(black_box("user-42"))));

    #[cfg(feature = "openfeature")]
    {
        use levee_agent::openfeature::LeveeProvider;
        let client = rt.block_on(async {
            let mut api = open_feature::OpenFeature::default();
            api.set_provider(LeveeProvider::new(&agent)).await;
            api.create_client()
        });
        group.bench_function("openfeature_get_bool_value", |b| {
            b.to_async(&rt).iter(|| async {
                black_box(
                    client
                        .get_bool_value(black_box("recommendations.enabled"), None, None)
                        .await
                        .unwrap_or(true),
                )
            })
        });
    }
    group.finish();
    drop(agent);
}

fn config() -> Criterion {
    let c = Criterion::default();
    if std::env::var_os("LEVEE_BENCH_QUICK").is_some() {
        c.warm_up_time(Duration::from_millis(200))
            .measurement_time(Duration::from_millis(500))
            .sample_size(10)
    } else {
        c
    }
}

criterion_group! { name = benches; config = config(); targets = flags }
criterion_main!(benches);

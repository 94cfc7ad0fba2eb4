//! Heap allocations per GET through a `reqwest_middleware::ClientWithMiddleware`: with
//! Levee's middleware, and with a pass-through middleware that only calls `next.run` (the
//! cost of reqwest, hyper, the loopback server and `reqwest-middleware` itself), so the
//! difference is what Levee's middleware adds per request. Real HTTP on loopback (an axum
//! server in the same process, counted in both).
//!
//! `cargo bench -p levee-agent --all-features --bench middleware`; `LEVEE_BENCH_SMOKE=1`
//! (or `-- --quick`) for a short run. Prints allocations and ns per GET (best of rounds).

use std::alloc::System;
use std::time::Duration;

use http::Extensions;
use levee_agent::Agent;
use levee_agent::deadline::{Deadline, with_deadline};
use levee_agent::policy::ServiceConfig;
use reqwest_middleware::{ClientBuilder, ClientWithMiddleware, Middleware, Next};
use stats_alloc::{INSTRUMENTED_SYSTEM, Region, StatsAlloc};
use tokio::time::Instant;

#[global_allocator]
static GLOBAL: &StatsAlloc<System> = &INSTRUMENTED_SYSTEM;

fn smoke() -> bool {
    std::env::var_os("LEVEE_BENCH_SMOKE").is_some_and(|v| v != "0")
        || std::env::args().any(|a| a == "--quick")
}

/// Calls `next` and nothing else.
struct PassThrough;

#[async_trait::async_trait]
impl Middleware for PassThrough {
    async fn handle(
        &self,
        req: reqwest::Request,
        extensions: &mut Extensions,
        next: Next<'_>,
    ) -> reqwest_middleware::Result<reqwest::Response> {
        next.run(req, extensions).await
    }
}

async fn gets(client: &ClientWithMiddleware, url: &str, n: u64) {
    with_deadline(Deadline::after(Duration::from_secs(3600)), async {
        for _ in 0..n {
            let body = client.get(url).send().await.unwrap().bytes().await.unwrap();
            assert_eq!(&body[..], b"42");
        }
    })
    .await;
}

fn main() {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let (n, rounds) = if smoke() { (500u64, 3) } else { (5_000u64, 5) };
    rt.block_on(async {
        let app = axum::Router::new().route("/price", axum::routing::get(|| async { "42" }));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/price", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await });
        let cfg: ServiceConfig = levee_agent::policy::decode_config(
            br#"{"policy": {"dependencies": {"p": {"retry": {"max_attempts": 3}}}}}"#,
        )
        .unwrap();
        let agent =
            Agent::builder("http://127.0.0.1:9", "bench", "bench", "bench").defaults(cfg).build().unwrap();
        let levee = ClientBuilder::new(reqwest::Client::new())
            .with(agent.dependency("p").middleware().operation("GET /price"))
            .build();
        let plain = ClientBuilder::new(reqwest::Client::new()).with(PassThrough).build();
        let mut rows = Vec::new();
        for (name, client) in [("pass-through", &plain), ("levee", &levee)] {
            gets(client, &url, 50).await; // connection and lazily initialised state
            let region = Region::new(GLOBAL);
            gets(client, &url, n).await;
            let allocs = region.change().allocations as f64 / n as f64;
            let mut best = f64::INFINITY;
            for _ in 0..rounds {
                let start = Instant::now();
                gets(client, &url, n).await;
                best = best.min(start.elapsed().as_nanos() as f64 / n as f64);
            }
            rows.push((name, allocs, best));
        }
        println!("\n== GET through reqwest-middleware on loopback ({n} requests, best of {rounds}) ==");
        println!("{:<14} {:>12} {:>12}", "middleware", "allocs/GET", "µs/GET");
        for (name, allocs, ns) in &rows {
            println!("{name:<14} {allocs:>12.1} {:>12.1}", ns / 1000.0);
        }
        println!("levee adds {:.1} allocations per GET\n", rows[1].1 - rows[0].1);
    });
}

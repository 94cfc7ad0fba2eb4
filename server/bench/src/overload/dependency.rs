//! The article's §1 scenario: a shop of 200 handlers takes 1,000 rps — 10 % checkouts
//! (CRITICAL, fixed work) and 90 % product pages (SHEDDABLE_PLUS) that also call a
//! non-critical `recommendations` service on loopback. The dependency goes from 20 ms to
//! 5 s, then heals. Without protection the pages hold every handler while they wait and
//! the checkouts starve behind them; with Levee (admission layer + the outbound stack on
//! the dependency: non-critical cap, breaker, fallback) the page is served degraded and
//! checkout keeps its goodput and p99.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use bytes::Bytes;
use http::{Method, Request, StatusCode};
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use levee_agent::Agent;
use levee_agent::deadline::{Deadline, RequestContext};
use levee_agent::policy::ServiceConfig;
use levee_agent::retry::HttpStatusError;
use serde::Serialize;
use serde_json::json;
use tokio::time::Instant;
use tower::BoxError;

use super::load::{DEGRADED_HEADER, Generator, Mix, Phase, Sample, Target};
use super::service::{HttpService, Pool, Server};
use super::stats::{percentile_ms, round3};

const RPS: f64 = 1000.0;
const HANDLERS: usize = 200;
/// Work of a checkout, and of a page besides its call to the dependency.
const WORK: Duration = Duration::from_millis(10);
const FAST: Duration = Duration::from_millis(20);
const SLOW: Duration = Duration::from_secs(5);
/// The deadline each request carries.
const BUDGET: Duration = Duration::from_secs(1);
/// The p99 checkout must keep (targets.md: "p99 within its budget").
pub const CHECKOUT_P99_BUDGET: Duration = Duration::from_millis(250);
/// Levee's breaker on the dependency: `wait_in_open` (recovery target: 2 × this).
const WAIT_IN_OPEN: Duration = Duration::from_secs(1);
/// The plain service's client timeout on the dependency (a common library default).
const PLAIN_TIMEOUT: Duration = Duration::from_secs(30);
const CHECKOUT: usize = 0;
const PAGE: usize = 1;
/// Width of the time buckets in which recovery is judged.
const BUCKET: Duration = Duration::from_millis(250);

/// The `recommendations` service: answers after `delay_ms`.
async fn start_recommendations(delay_ms: Arc<AtomicU64>) -> anyhow::Result<Server> {
    let router = Router::new()
        .route(
            "/recs/{id}",
            get(|State(delay): State<Arc<AtomicU64>>| async move {
                tokio::time::sleep(Duration::from_millis(delay.load(Ordering::Relaxed))).await;
                "[17, 42, 99]"
            }),
        )
        .with_state(delay_ms);
    Server::start(super::service::protect(router, &super::service::Protection::None)).await
}

type DepClient = Client<HttpConnector, Empty<Bytes>>;

fn client() -> DepClient {
    Client::builder(TokioExecutor::new()).pool_max_idle_per_host(usize::MAX).build_http()
}

async fn fetch(client: &DepClient, uri: &str) -> Result<(), BoxError> {
    let req = Request::get(uri).body(Empty::new())?;
    let resp = client.request(req).await?;
    let (parts, body) = resp.into_parts();
    body.collect().await?;
    match HttpStatusError::from_parts(parts.status, &parts.headers) {
        Some(e) => Err(Box::new(e)),
        None => Ok(()),
    }
}

#[derive(Clone)]
struct Shop {
    pool: Pool,
    client: DepClient,
    recs: String,
    agent: Option<Agent>,
}

async fn checkout(State(shop): State<Shop>) -> Response {
    shop.pool.run(WORK).await;
    (StatusCode::OK, "order placed").into_response()
}

/// A product page: its own work, then the recommendations. Plain: a failed call is a 500.
/// Levee: the call goes through the agent's outbound stack, and a failed call (timeout at
/// the non-critical cap, open breaker) serves the page without recommendations.
async fn product(State(shop): State<Shop>) -> Response {
    let Shop { pool, client, recs, agent } = shop;
    let protected = agent.is_some();
    let served = match agent {
        None => {
            pool.run_with(async move {
                tokio::time::sleep(WORK).await;
                matches!(tokio::time::timeout(PLAIN_TIMEOUT, fetch(&client, &recs)).await, Ok(Ok(())))
            })
            .await
        }
        Some(agent) => {
            // The handler runs on a pool worker: carry the request context there.
            let ctx = levee_agent::deadline::current()
                .unwrap_or_else(|| RequestContext::new(Deadline::after(BUDGET)));
            let dep = agent.dependency("recommendations");
            pool.run_with(levee_agent::deadline::scope(ctx, async move {
                tokio::time::sleep(WORK).await;
                dep.call("GET /recs/{id}", || fetch(&client, &recs)).await.is_ok()
            }))
            .await
        }
    };
    match served {
        Some(true) => (StatusCode::OK, "product page with recommendations").into_response(),
        Some(false) if protected => {
            ([(DEGRADED_HEADER, "recommendations")], "product page, recommendations unavailable")
                .into_response()
        }
        Some(false) => (StatusCode::INTERNAL_SERVER_ERROR, "recommendations failed").into_response(),
        None => StatusCode::SERVICE_UNAVAILABLE.into_response(),
    }
}

/// The shop's policy under Levee: route criticalities, the dependency non-critical with a
/// short `wait_in_open` (so recovery fits a smoke run), everything else default.
fn levee_config() -> ServiceConfig {
    serde_json::from_value(json!({
        "policy": {
            "inbound": {
                "routes": {
                    "POST /checkout": {"criticality": "CRITICAL"},
                    "GET /product/{id}": {"criticality": "SHEDDABLE_PLUS"}
                }
            },
            "dependencies": {
                "recommendations": {
                    "criticality": "non_critical",
                    "circuit_breaker": {"wait_in_open": format!("{}ms", WAIT_IN_OPEN.as_millis())}
                }
            }
        }
    }))
    .expect("valid shop policy")
}

/// Builds the shop (on the server runtime: the agent spawns its tasks there).
async fn start_shop(
    protected: bool,
    pool: Pool,
    recs: std::net::SocketAddr,
) -> anyhow::Result<(Server, Option<Agent>)> {
    let agent = if protected {
        let cache = std::env::temp_dir().join(format!("levee-bench-{}", std::process::id()));
        // No control plane: the agent enforces the compiled-in policy (its sync client
        // retries a closed loopback port in the background).
        Some(
            Agent::builder("http://127.0.0.1:9", "bench", "bench", "shop")
                .cache_dir(cache)
                .defaults(levee_config())
                .build()?,
        )
    } else {
        None
    };
    let shop = Shop { pool, client: client(), recs: format!("http://{recs}/recs/1"), agent: agent.clone() };
    let mut router = Router::new()
        .route("/checkout", post(checkout))
        .route("/product/{id}", get(product))
        .with_state(shop);
    if let Some(agent) = &agent {
        router = router.layer(agent.admission_layer());
    }
    let svc: HttpService = tower::util::BoxCloneSyncService::new(tower::ServiceExt::map_request(
        router,
        |r: Request<hyper::body::Incoming>| r.map(Body::new),
    ));
    Ok((Server::start(svc).await?, agent))
}

/// Phases of the scenario: normal, dependency slow, healed.
fn phases(smoke: bool) -> [Duration; 3] {
    if smoke {
        [Duration::from_millis(1500), Duration::from_secs(3), Duration::from_secs(5)]
    } else {
        // Healed for 20 s: the breaker's open time doubles at each failed probe (1, 2, 4,
        // 8 s…), so after 10 s of slowness the next probe may come up to 16 s after the heal.
        [Duration::from_secs(4), Duration::from_secs(10), Duration::from_secs(20)]
    }
}

/// What one variant did during the slow phase, and how it came back.
#[derive(Clone, Debug, Serialize)]
pub struct Outcome {
    /// CRITICAL checkouts answered 2xx within the deadline, share of those sent.
    pub checkout_goodput_ratio_normal: f64,
    pub checkout_goodput_ratio_slow: f64,
    /// p99 of checkouts, ms (given up at the deadline counts as the deadline).
    pub checkout_p99_ms_normal: f64,
    pub checkout_p99_ms_slow: f64,
    /// Product pages during the slow phase, shares of those sent.
    pub page_full_ratio_slow: f64,
    pub page_degraded_ratio_slow: f64,
    /// Answered 5xx by the service (an error page), not counting sheds.
    pub page_5xx_ratio_slow: f64,
    /// Refused by admission (503 + Retry-After: the client may come back).
    pub page_shed_ratio_slow: f64,
    pub page_timed_out_ratio_slow: f64,
    /// After the dependency healed: time until every later 250 ms bucket has the goodput
    /// of the normal phase (−5 %), and until pages are served whole again (95 %); `null`
    /// when that never happened before the end of the run.
    pub goodput_recovery_s: Option<f64>,
    pub full_pages_recovery_s: Option<f64>,
}

fn ratio(samples: &[&Sample], f: impl Fn(&Sample) -> bool) -> f64 {
    if samples.is_empty() {
        return 0.0;
    }
    samples.iter().filter(|s| f(s)).count() as f64 / samples.len() as f64
}

fn p99(samples: &[&Sample]) -> f64 {
    let mut l: Vec<Duration> = samples.iter().map(|s| s.latency.min(BUDGET)).collect();
    l.sort_unstable();
    percentile_ms(&l, 0.99)
}

/// The first time from `from` after which every bucket until `end` satisfies `ok` (the
/// share of its samples for which the predicate holds is at least `floor`).
pub fn recovery(
    samples: &[Sample],
    from: Duration,
    end: Duration,
    floor: f64,
    keep: impl Fn(&Sample) -> bool,
    good: impl Fn(&Sample) -> bool,
) -> Option<f64> {
    let buckets = ((end - from).as_secs_f64() / BUCKET.as_secs_f64()).floor() as usize;
    let mut shares = vec![(0usize, 0usize); buckets];
    for s in samples.iter().filter(|s| s.at >= from && keep(s)) {
        let i = ((s.at - from).as_secs_f64() / BUCKET.as_secs_f64()) as usize;
        if let Some(b) = shares.get_mut(i) {
            b.0 += 1;
            b.1 += usize::from(good(s));
        }
    }
    let ok = |(n, g): (usize, usize)| n > 0 && g as f64 >= floor * n as f64;
    // The earliest bucket from which all later buckets are ok.
    let mut first = None;
    for (i, b) in shares.iter().enumerate().rev() {
        if ok(*b) {
            first = Some(i);
        } else {
            break;
        }
    }
    // The last bucket must be ok, or the service never came back during the run.
    first.map(|i| round3(i as f64 * BUCKET.as_secs_f64()))
}

/// Runs the scenario once without protection and once with Levee.
pub async fn run(
    server_rt: &tokio::runtime::Handle,
    smoke: bool,
) -> anyhow::Result<Vec<(&'static str, Outcome)>> {
    let [normal, slow, healed] = phases(smoke);
    let mut out = Vec::new();
    for (name, protected) in [("none", false), ("levee", true)] {
        let delay = Arc::new(AtomicU64::new(FAST.as_millis() as u64));
        let pool = Pool::new(HANDLERS);
        let (recs, shop, agent) = {
            let delay = delay.clone();
            let pool = pool.clone();
            server_rt
                .spawn(async move {
                    let recs = start_recommendations(delay).await?;
                    let (shop, agent) = start_shop(protected, pool, recs.addr).await?;
                    anyhow::Ok((recs, shop, agent))
                })
                .await??
        };
        let targets = vec![
            Target {
                method: Method::POST,
                path: "/checkout",
                share: 100,
                send_criticality: false,
                class: None,
            },
            Target {
                method: Method::GET,
                path: "/product/1",
                share: 900,
                send_criticality: false,
                class: None,
            },
        ];
        let generator = Generator::new(shop.addr, targets, Mix([1000, 0, 0]), BUDGET, 0x5eed);
        let start = Instant::now();
        let switch = {
            let delay = delay.clone();
            tokio::spawn(async move {
                tokio::time::sleep_until(start + normal).await;
                delay.store(SLOW.as_millis() as u64, Ordering::Relaxed);
                tokio::time::sleep_until(start + normal + slow).await;
                delay.store(FAST.as_millis() as u64, Ordering::Relaxed);
            })
        };
        let samples =
            generator.run_from(start, &[Phase { rps: RPS, duration: normal + slow + healed }]).await;
        switch.await?;
        drop(shop);
        drop(recs);
        pool.close();
        if let Some(agent) = agent {
            agent.shutdown().await;
        }
        // The first half second of the run warms connections up.
        let warm = Duration::from_millis(500);
        let phase = |from: Duration, to: Duration, route: usize| -> Vec<&Sample> {
            samples.iter().filter(|s| s.at >= from && s.at < to && s.route == route).collect()
        };
        let good = |s: &Sample| s.good(BUDGET);
        let checkout_normal = phase(warm, normal, CHECKOUT);
        let checkout_slow = phase(normal, normal + slow, CHECKOUT);
        let pages_slow = phase(normal, normal + slow, PAGE);
        let all_normal: Vec<&Sample> = samples.iter().filter(|s| s.at >= warm && s.at < normal).collect();
        let normal_goodput = ratio(&all_normal, good);
        let healed_at = normal + slow;
        let end = normal + slow + healed;
        let outcome = Outcome {
            checkout_goodput_ratio_normal: round3(ratio(&checkout_normal, good)),
            checkout_goodput_ratio_slow: round3(ratio(&checkout_slow, good)),
            checkout_p99_ms_normal: round3(p99(&checkout_normal)),
            checkout_p99_ms_slow: round3(p99(&checkout_slow)),
            page_full_ratio_slow: round3(ratio(&pages_slow, |s| good(s) && !s.degraded)),
            page_degraded_ratio_slow: round3(ratio(&pages_slow, |s| good(s) && s.degraded)),
            page_5xx_ratio_slow: round3(ratio(&pages_slow, |s| {
                !s.rejected() && matches!(s.outcome, super::load::Outcome::Answered(c) if c.is_server_error())
            })),
            page_shed_ratio_slow: round3(ratio(&pages_slow, Sample::rejected)),
            page_timed_out_ratio_slow: round3(ratio(&pages_slow, |s| {
                s.outcome == super::load::Outcome::TimedOut
            })),
            goodput_recovery_s: recovery(&samples, healed_at, end, normal_goodput - 0.05, |_| true, good),
            full_pages_recovery_s: recovery(
                &samples,
                healed_at,
                end,
                0.95,
                |s| s.route == PAGE,
                |s| good(s) && !s.degraded,
            ),
        };
        out.push((name, outcome));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use http::StatusCode;
    use levee_agent::policy::Criticality;

    use super::*;
    use crate::overload::load::Outcome as Answer;

    fn at(ms: u64, good: bool) -> Sample {
        Sample {
            at: Duration::from_millis(ms),
            criticality: Criticality::Critical,
            route: 0,
            outcome: Answer::Answered(if good { StatusCode::OK } else { StatusCode::SERVICE_UNAVAILABLE }),
            latency: Duration::from_millis(1),
            degraded: false,
        }
    }

    /// Buckets of 250 ms from the heal at 1 s; answers bad until 0.6 s after it: the bucket
    /// [0.5, 0.75) is 3 of 5 good, so the good tail starts at 0.75 s. A bad last bucket
    /// means not recovered.
    #[test]
    fn recovery_is_the_start_of_the_good_tail() {
        let samples: Vec<Sample> = (0..40).map(|i| at(1000 + i * 50, i * 50 >= 600)).collect();
        let end = Duration::from_secs(3);
        let r = recovery(&samples, Duration::from_secs(1), end, 0.95, |_| true, |s| s.good(BUDGET));
        assert_eq!(r, Some(0.75));
        let mut bad_end = samples.clone();
        bad_end.push(at(2900, false));
        bad_end.push(at(2950, false));
        assert_eq!(recovery(&bad_end, Duration::from_secs(1), end, 0.95, |_| true, |s| s.good(BUDGET)), None);
    }
}

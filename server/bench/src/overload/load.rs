//! The open-loop load generator: requests leave at scheduled times (constant arrival rate)
//! whatever the server does, and each latency is measured from the request's *intended*
//! send time, so a generator that falls behind cannot hide the server's overload
//! (coordinated omission; closed-loop generators slow down with the server they measure).

use std::time::Duration;

use bytes::Bytes;
use http::{Method, Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use levee_agent::deadline::{CRITICALITY_HEADER, DEADLINE_MS_HEADER, format_criticality};
use levee_agent::policy::Criticality;
use tokio::time::Instant;

/// The criticalities the generator sends, in the order results are reported.
pub const CRITICALITIES: [Criticality; 3] =
    [Criticality::Critical, Criticality::SheddablePlus, Criticality::Sheddable];

/// A traffic mix: per mille of each of [`CRITICALITIES`].
#[derive(Clone, Copy, Debug)]
pub struct Mix(pub [u32; 3]);

impl Mix {
    fn pick(&self, draw: u32) -> Criticality {
        let mut acc = 0;
        for (c, share) in CRITICALITIES.iter().zip(self.0) {
            acc += share;
            if draw % 1000 < acc {
                return *c;
            }
        }
        Criticality::Sheddable
    }
}

/// How one request ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Answered with this status, after `latency` from its intended send time.
    Answered(StatusCode),
    /// No answer within the deadline (the client gave up).
    TimedOut,
    /// Connection error.
    Failed,
}

/// One request as the client saw it.
#[derive(Clone, Copy, Debug)]
pub struct Sample {
    /// Intended send time, from the start of the run.
    pub at: Duration,
    pub criticality: Criticality,
    pub route: usize,
    pub outcome: Outcome,
    /// From the intended send time to the answer (or to the give-up).
    pub latency: Duration,
    /// The answer said it was served degraded (header [`DEGRADED_HEADER`]).
    pub degraded: bool,
}

/// Response header a service sets on an answer served degraded (a fallback).
pub const DEGRADED_HEADER: &str = "x-degraded";

impl Sample {
    /// A refusal by the protection layer (not an answer of the service).
    pub fn rejected(&self) -> bool {
        matches!(self.outcome, Outcome::Answered(s) if s == StatusCode::SERVICE_UNAVAILABLE || s == StatusCode::TOO_MANY_REQUESTS)
    }

    /// Answered 2xx within the deadline `budget`.
    pub fn good(&self, budget: Duration) -> bool {
        matches!(self.outcome, Outcome::Answered(s) if s.is_success()) && self.latency <= budget
    }
}

/// A phase of constant arrival rate.
#[derive(Clone, Copy, Debug)]
pub struct Phase {
    pub rps: f64,
    pub duration: Duration,
}

/// A route the generator calls: method, path, share of the traffic (per mille), and
/// whether its criticality comes from the mix (else the route's default applies).
#[derive(Clone, Debug)]
pub struct Target {
    pub method: Method,
    pub path: &'static str,
    pub share: u32,
    pub send_criticality: bool,
    /// The class its requests are reported under, instead of the one drawn from the mix
    /// (for traffic whose criticality the service decides from the route).
    pub class: Option<Criticality>,
}

/// An open-loop generator against one server.
#[derive(Clone, Debug)]
pub struct Generator {
    client: Client<HttpConnector, Full<Bytes>>,
    base: String,
    targets: Vec<Target>,
    mix: Mix,
    /// The deadline each request carries (`levee-deadline-ms`) and the client's give-up.
    pub budget: Duration,
    seed: u64,
    /// Sent with every request, after Levee's own headers (`--header` of `--target`).
    extra_headers: Vec<(http::HeaderName, http::HeaderValue)>,
    /// The body of every request (`--body` of `--target`; empty: none).
    body: Bytes,
}

impl Generator {
    pub fn new(
        addr: std::net::SocketAddr,
        targets: Vec<Target>,
        mix: Mix,
        budget: Duration,
        seed: u64,
    ) -> Self {
        Self::with_base(format!("http://{addr}"), targets, mix, budget, seed)
    }

    /// A generator against `base` (`http://host:port`, no trailing slash): the targets'
    /// paths are appended to it.
    pub fn with_base(base: String, targets: Vec<Target>, mix: Mix, budget: Duration, seed: u64) -> Self {
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        let client = Client::builder(TokioExecutor::new())
            .pool_max_idle_per_host(usize::MAX)
            .pool_idle_timeout(Duration::from_secs(30))
            .build(connector);
        Self { client, base, targets, mix, budget, seed, extra_headers: Vec::new(), body: Bytes::new() }
    }

    /// Sends `headers` with every request as well (authentication of a real service).
    pub fn headers(mut self, headers: Vec<(http::HeaderName, http::HeaderValue)>) -> Self {
        self.extra_headers = headers;
        self
    }

    /// Sends `body` with every request (a POST to a service of one's own).
    pub fn body(mut self, body: Bytes) -> Self {
        self.body = body;
        self
    }

    /// Sends the phases one after the other and returns every request, in send order.
    pub async fn run(&self, phases: &[Phase]) -> Vec<Sample> {
        self.run_from(Instant::now(), phases).await
    }

    /// As [`run`](Self::run), with the run's time origin given (to line up other events).
    pub async fn run_from(&self, start: Instant, phases: &[Phase]) -> Vec<Sample> {
        let mut rng = self.seed | 1;
        let mut handles = Vec::new();
        let mut phase_start = Duration::ZERO;
        for phase in phases {
            let n = (phase.rps * phase.duration.as_secs_f64()).round() as u64;
            let gap = Duration::from_secs_f64(1.0 / phase.rps.max(0.001));
            for i in 0..n {
                let at = phase_start + gap.mul_f64(i as f64);
                tokio::time::sleep_until(start + at).await;
                rng = xorshift(rng);
                let target = self.pick_target((rng >> 20) as u32);
                let criticality =
                    self.targets[target].class.unwrap_or_else(|| self.mix.pick((rng >> 40) as u32));
                handles.push(tokio::spawn(self.clone().one(start, at, target, criticality)));
            }
            phase_start += phase.duration;
        }
        let mut out = Vec::with_capacity(handles.len());
        for h in handles {
            if let Ok(s) = h.await {
                out.push(s);
            }
        }
        out
    }

    fn pick_target(&self, draw: u32) -> usize {
        let total: u32 = self.targets.iter().map(|t| t.share).sum::<u32>().max(1);
        let mut d = draw % total;
        for (i, t) in self.targets.iter().enumerate() {
            if d < t.share {
                return i;
            }
            d -= t.share;
        }
        0
    }

    async fn one(self, start: Instant, at: Duration, route: usize, criticality: Criticality) -> Sample {
        let intended = start + at;
        let give_up = intended + self.budget;
        let target = &self.targets[route];
        let left = give_up.saturating_duration_since(Instant::now());
        let mut req = Request::builder()
            .method(target.method.clone())
            .uri(format!("{}{}", self.base, target.path))
            .header(DEADLINE_MS_HEADER, left.as_millis().max(1).to_string());
        if target.send_criticality {
            req = req.header(CRITICALITY_HEADER, format_criticality(criticality));
        }
        for (name, value) in &self.extra_headers {
            req = req.header(name, value);
        }
        // An empty `Full` is the end of the stream at once: hyper sends no body and, for a GET,
        // no content-length, as with no body at all.
        let req = req.body(Full::new(self.body.clone())).expect("valid request");
        let call = async {
            let resp = self.client.request(req).await?;
            let status = resp.status();
            let degraded = resp.headers().contains_key(DEGRADED_HEADER);
            resp.into_body().collect().await?;
            Ok::<_, anyhow::Error>((status, degraded))
        };
        let (outcome, degraded) = match tokio::time::timeout_at(give_up, call).await {
            Ok(Ok((status, degraded))) => (Outcome::Answered(status), degraded),
            Ok(Err(_)) => (Outcome::Failed, false),
            Err(_) => (Outcome::TimedOut, false),
        };
        let latency = Instant::now().saturating_duration_since(intended);
        Sample { at, criticality, route, outcome, latency, degraded }
    }
}

fn xorshift(mut x: u64) -> u64 {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    x
}

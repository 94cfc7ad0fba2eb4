//! N real agents in this process, each with its own sync stream (its own TCP connection),
//! its own disk cache directory, and the default sync settings — what a pod runs.

use std::path::PathBuf;
use std::time::Duration;

use levee_agent::{Agent, SyncClientSettings};
use tokio::time::Instant;

use super::Common;
use super::api::Api;

/// What [`Fleet::measure_flips`] timed, one entry per flip, in milliseconds.
#[derive(Debug, Default)]
pub struct Flips {
    /// From the API's answer until the last agent applied the revision (0 when all had it
    /// before the answer).
    pub after_answer: Vec<f64>,
    /// From the request until the last agent applied it.
    pub from_request: Vec<f64>,
    /// The API's own answer time.
    pub api_answer: Vec<f64>,
}

#[derive(Debug)]
pub struct Fleet {
    pub agents: std::sync::Arc<Vec<Agent>>,
    /// The task making the agents' calls (`--calls-per-sec`).
    traffic: Option<tokio::task::JoinHandle<()>>,
    _cache: Option<tempfile::TempDir>,
}

/// What the agents of a fleet call and how they report.
#[derive(Clone, Debug)]
pub struct Traffic {
    /// Calls per second each agent makes to dependency `recommendations`; 0: none.
    pub calls_per_sec: f64,
    /// How long the dependency takes to answer (with success); zero: at once, and the
    /// calls are made one after the other.
    pub latency: Duration,
    /// The agents' sync settings (the status report interval among them).
    pub sync: SyncClientSettings,
}

impl Fleet {
    /// Builds `n` agents for prod/checkout against `grpc` (they connect on their own),
    /// calling an immediate dependency at `--calls-per-sec`, with the default sync settings.
    pub fn start(common: &Common, grpc: &str, token: &str, n: usize) -> anyhow::Result<Fleet> {
        let traffic = Traffic {
            calls_per_sec: common.calls_per_sec(),
            latency: Duration::ZERO,
            sync: SyncClientSettings::default(),
        };
        Fleet::start_with(common, grpc, token, n, &traffic)
    }

    /// [`Fleet::start`] with `traffic`.
    pub fn start_with(
        common: &Common,
        grpc: &str,
        token: &str,
        n: usize,
        traffic: &Traffic,
    ) -> anyhow::Result<Fleet> {
        let cache = if common.no_cache {
            None
        } else {
            let parent = common.cache_dir.clone().unwrap_or_else(|| {
                let shm = PathBuf::from("/dev/shm");
                if shm.is_dir() { shm } else { std::env::temp_dir() }
            });
            Some(tempfile::Builder::new().prefix("levee-bench-").tempdir_in(parent)?)
        };
        let mut agents = Vec::with_capacity(n);
        for i in 0..n {
            let mut b = Agent::builder(grpc, token, "prod", "checkout")
                .instance_name(format!("bench-{i}"))
                .sync_settings(traffic.sync.clone());
            if let Some(dir) = &cache {
                b = b.cache_dir(dir.path().join(i.to_string()));
            }
            agents.push(b.build()?);
        }
        let agents = std::sync::Arc::new(agents);
        let (rate, latency) = (traffic.calls_per_sec, traffic.latency);
        let traffic = (rate > 0.0).then(|| tokio::spawn(calls(agents.clone(), rate, latency)));
        Ok(Fleet { agents, traffic, _cache: cache })
    }

    /// How many agents have a stream established.
    pub fn connected(&self) -> usize {
        self.agents.iter().filter(|a| a.status().connected).count()
    }

    /// Waits until every agent has a stream and has applied at least `revision`; returns
    /// how long it took, or an error naming how many were missing after `timeout`.
    pub async fn wait_synced(&self, revision: u64, timeout: Duration) -> anyhow::Result<Duration> {
        let start = Instant::now();
        loop {
            let missing = self
                .agents
                .iter()
                .filter(|a| a.current().revision < revision || !a.status().connected)
                .count();
            if missing == 0 {
                return Ok(start.elapsed());
            }
            anyhow::ensure!(
                start.elapsed() < timeout,
                "{missing} of {} agents not synced to revision {revision} after {timeout:?}",
                self.agents.len()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// From `start` until every agent applied `revision`: the time the last one took (ms).
    /// Polls every agent's applied revision (one lock-free load each) every millisecond.
    pub async fn time_to_all(&self, start: Instant, revision: u64, timeout: Duration) -> anyhow::Result<f64> {
        let mut pending: Vec<&Agent> = self.agents.iter().collect();
        loop {
            pending.retain(|a| a.current().revision < revision);
            if pending.is_empty() {
                return Ok(start.elapsed().as_secs_f64() * 1000.0);
            }
            anyhow::ensure!(
                start.elapsed() < timeout,
                "{} of {} agents had not applied revision {revision} after {timeout:?}",
                pending.len(),
                self.agents.len()
            );
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }

    /// Flips the flag `flips` times through `api`, one after the other with a 200 ms pause
    /// (each measured on its own, not queued behind the last), watching every agent while
    /// the request is in flight (the server pushes before it answers). `label` names where
    /// the agents are, for the progress lines on stderr.
    pub async fn measure_flips(&self, api: &Api, flips: usize, label: &str) -> anyhow::Result<Flips> {
        let mut out = Flips::default();
        for i in 0..flips {
            // The revision the write will make is the next one.
            let rev = self.agents[0].current().revision + 1;
            let sent = Instant::now();
            let (written, total) = tokio::join!(
                async { (api.flip(i % 2 == 1).await, sent.elapsed().as_secs_f64() * 1000.0) },
                self.time_to_all(sent, rev, Duration::from_secs(60))
            );
            let (written, answered) = (written.0?, written.1);
            anyhow::ensure!(written == rev, "the write made revision {written}, not the next one ({rev})");
            let total = total?;
            // From the answer; 0 when every agent had it before the API answered.
            let ms = (total - answered).max(0.0);
            eprintln!(
                "flip {i}: revision {rev} on all {} agents {label} after {ms:.1} ms",
                self.agents.len()
            );
            out.after_answer.push(ms);
            out.from_request.push(total);
            out.api_answer.push(answered);
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        Ok(out)
    }

    pub async fn shutdown(self) {
        if let Some(t) = &self.traffic {
            t.abort();
        }
        futures::future::join_all(self.agents.iter().map(|a| a.shutdown())).await;
    }
}

/// Every agent calls dependency `recommendations` `rate` times per second (a success
/// after `latency`), spread over the second in ticks of 10 ms, so each status report
/// carries a health window. Runs until aborted.
async fn calls(agents: std::sync::Arc<Vec<Agent>>, rate: f64, latency: Duration) {
    let deps: Vec<_> = agents.iter().map(|a| a.dependency("recommendations")).collect();
    let tick = Duration::from_millis(10);
    let mut interval = tokio::time::interval(tick);
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // Calls owed, in agent-calls: rate × agents per second, 1/100 of it per tick.
    let per_tick = rate * deps.len() as f64 / 100.0;
    let (mut owed, mut next) = (0.0, 0usize);
    loop {
        interval.tick().await;
        owed += per_tick;
        while owed >= 1.0 {
            owed -= 1.0;
            if latency.is_zero() {
                let _ =
                    deps[next].call("GET /recommendations", || async { Ok::<_, std::io::Error>(()) }).await;
            } else {
                // Each call on its own task: the dependency's latency must not slow the others.
                let dep = deps[next].clone();
                tokio::spawn(async move {
                    let answer = || async {
                        tokio::time::sleep(latency).await;
                        Ok::<_, std::io::Error>(())
                    };
                    let _ = dep.call("GET /recommendations", answer).await;
                });
            }
            next = (next + 1) % deps.len();
        }
    }
}

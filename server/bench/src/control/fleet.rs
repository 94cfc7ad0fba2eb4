//! N real agents in this process, each with its own sync stream (its own TCP connection),
//! its own disk cache directory, and the default sync settings — what a pod runs.

use std::path::PathBuf;
use std::time::Duration;

use levee_agent::Agent;
use tokio::time::Instant;

use super::Common;

#[derive(Debug)]
pub struct Fleet {
    pub agents: Vec<Agent>,
    _cache: Option<tempfile::TempDir>,
}

impl Fleet {
    /// Builds `n` agents for prod/checkout against `grpc` (they connect on their own).
    pub fn start(common: &Common, grpc: &str, token: &str, n: usize) -> anyhow::Result<Fleet> {
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
            let mut b = Agent::builder(grpc, token, "prod", "checkout").instance_name(format!("bench-{i}"));
            if let Some(dir) = &cache {
                b = b.cache_dir(dir.path().join(i.to_string()));
            }
            agents.push(b.build()?);
        }
        Ok(Fleet { agents, _cache: cache })
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
            let missing =
                self.agents.iter().filter(|a| a.current().revision < revision || !a.status().connected).count();
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

    pub async fn shutdown(self) {
        futures::future::join_all(self.agents.iter().map(|a| a.shutdown())).await;
    }
}

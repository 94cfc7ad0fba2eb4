//! `levee-bench` control-plane modes (issue 10, targets.md "Control plane"): the real
//! `levee` binary as a child process on free loopback ports, real `levee_agent::Agent`s in
//! this process (the real sync protocol: apply, persist to the disk cache, ACK). One file
//! per mode: [`propagation`], [`streams`], [`reconnect`], [`replicas`], [`writes`],
//! [`rollout`]; the shared setup (server process, API client, fleet of agents, /proc
//! figures) lives in [`server`], [`api`] and [`fleet`]. Each mode's last line is one JSON
//! object.

use std::path::PathBuf;

use clap::{Args as ClapArgs, Subcommand};

mod api;
mod fleet;
mod propagation;
mod reconnect;
mod replicas;
mod rollout;
mod server;
mod streams;
mod writes;

/// The control-plane modes.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Flip a flag through the API repeatedly; p50/p99/max from the API's answer until the
    /// last of N agents applied it.
    Propagation(propagation::Args),
    /// Server RSS and CPU with N idle agent streams.
    Streams(streams::Args),
    /// Restart the server under N agents: time until all re-synced, refusals, peak memory.
    Reconnect(reconnect::Args),
    /// Two replicas on one PostgreSQL: writes on one, agents on the other; p99.
    Replicas(replicas::Args),
    /// Sustained flag writes per second (each audited) on SQLite or PostgreSQL.
    Writes(writes::Args),
    /// Bad staged policy changes under N reporting agents: first canary ACK → halt,
    /// halt → last cohort agent reverted, agents outside the cohort that received it.
    Rollout(rollout::Args),
}

impl Command {
    pub fn run(self) -> anyhow::Result<()> {
        raise_nofile();
        let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
        let summary = rt.block_on(async {
            match self {
                Command::Propagation(a) => propagation::run(a).await,
                Command::Streams(a) => streams::run(a).await,
                Command::Reconnect(a) => reconnect::run(a).await,
                Command::Replicas(a) => replicas::run(a).await,
                Command::Writes(a) => writes::run(a).await,
                Command::Rollout(a) => rollout::run(a).await,
            }
        })?;
        // Agents and servers are gone with the runtime; the summary is the last line.
        rt.shutdown_timeout(std::time::Duration::from_secs(2));
        println!("{summary}");
        Ok(())
    }
}

/// Options every control-plane mode shares.
#[derive(Debug, Clone, ClapArgs)]
pub struct Common {
    /// A few seconds with a small N (CI): proves the mode runs, measures nothing.
    #[arg(long)]
    pub smoke: bool,
    /// The `levee` binary to run; default: `levee` next to this executable
    /// (`target/<profile>/levee`).
    #[arg(long)]
    pub server_bin: Option<PathBuf>,
    /// Agents without a disk cache (nothing persisted before the ACK).
    #[arg(long, conflicts_with = "cache_dir")]
    pub no_cache: bool,
    /// Parent directory of the agents' disk caches (one subdirectory per agent, removed at
    /// the end); default: a temporary directory in /dev/shm (else the system temp dir).
    #[arg(long)]
    pub cache_dir: Option<PathBuf>,
    /// Calls per second each agent makes to a dependency (an immediate success), so its
    /// status reports carry health windows as a serving agent's do; 0: agents that call
    /// nothing (reports without health). Default 1 (`rollout --smoke`: 20, so a canary of
    /// two agents reaches the plan's `min_calls` within a report interval).
    #[arg(long)]
    pub calls_per_sec: Option<f64>,
}

impl Common {
    /// `--calls-per-sec`, else 1.
    pub fn calls_per_sec(&self) -> f64 {
        self.calls_per_sec.unwrap_or(1.0)
    }

    /// The `levee` binary: `--server-bin`, else next to this executable.
    pub fn server_bin(&self) -> anyhow::Result<PathBuf> {
        if let Some(p) = &self.server_bin {
            return Ok(p.clone());
        }
        let exe = std::env::current_exe()?;
        let p = exe.with_file_name("levee");
        anyhow::ensure!(
            p.exists(),
            "no levee binary at {} (build it with `cargo build --release -p levee-server --bin levee`, or pass --server-bin PATH)",
            p.display()
        );
        Ok(p)
    }
}

/// Raises the soft RLIMIT_NOFILE to the hard limit: every agent stream is a TCP connection
/// of its own, one descriptor here and one in the server (which gets the raised limit as
/// its inherited soft limit). The hard limit itself is the operator's (`ulimit -Hn`,
/// `LimitNOFILE=` in systemd, `nofile` in limits.conf).
fn raise_nofile() {
    use rustix::process::{Resource, getrlimit, setrlimit};
    let mut l = getrlimit(Resource::Nofile);
    if l.maximum.is_some() && l.current != l.maximum {
        l.current = l.maximum;
        if let Err(e) = setrlimit(Resource::Nofile, l) {
            eprintln!("could not raise RLIMIT_NOFILE: {e}");
        }
    }
    eprintln!("RLIMIT_NOFILE: {:?} (hard {:?})", getrlimit(Resource::Nofile).current, l.maximum);
}

/// p50 / p99 / max of durations in milliseconds (nearest rank), rounded to 0.1 ms.
pub fn percentiles_ms(samples: &[f64]) -> serde_json::Value {
    let mut s = samples.to_vec();
    s.sort_by(f64::total_cmp);
    let at = |q: f64| {
        if s.is_empty() {
            return 0.0;
        }
        let i = ((q * s.len() as f64).ceil() as usize).clamp(1, s.len()) - 1;
        (s[i] * 10.0).round() / 10.0
    };
    serde_json::json!({"p50_ms": at(0.50), "p99_ms": at(0.99), "max_ms": at(1.0), "samples": s.len()})
}

/// What most modes start with: a seeded server on SQLite in a temp dir (admission of new
/// streams raised so setup is quick unless `env` sets it), the API, an agent token.
#[derive(Debug)]
pub struct Setup {
    pub _data: tempfile::TempDir,
    pub spawn: server::Spawn,
    pub server: server::Server,
    pub api: api::Api,
    pub token: String,
}

impl Setup {
    pub async fn sqlite(common: &Common, env: &[(&str, &str)]) -> anyhow::Result<Setup> {
        let data = tempfile::Builder::new().prefix("levee-bench-data-").tempdir()?;
        let mut spawn = server::Spawn::new(&common.server_bin()?, data.path());
        for (k, v) in env {
            spawn = spawn.env(k, *v);
        }
        let server = server::Server::start(&spawn).await?;
        let api = api::Api::login(&server.base()).await?;
        api.seed().await?;
        let token = api.agent_token().await?;
        Ok(Setup { _data: data, spawn, server, api, token })
    }
}

/// Admission of new streams during setup (not what is measured, except by `reconnect`).
pub const SETUP_STREAMS_PER_SEC: &str = "100000";

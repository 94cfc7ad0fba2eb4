//! The `levee` server as a child process: started on loopback (port 0 picks free ones, or
//! the ports of a previous run for a restart), its memory and CPU read from /proc, stopped
//! with SIGTERM; and a fresh PostgreSQL database per run.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use anyhow::Context;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

/// The admin password of every server the harness starts (loopback only).
pub const ADMIN_PASSWORD: &str = "levee-bench-admin-pw";

/// What to start.
#[derive(Debug, Clone)]
pub struct Spawn {
    pub bin: PathBuf,
    pub data_dir: PathBuf,
    pub http: String,
    pub grpc: String,
    /// More environment (LEVEE_DATABASE_URL, LEVEE_NEW_STREAMS_PER_SEC, …).
    pub env: Vec<(String, String)>,
}

impl Spawn {
    pub fn new(bin: &Path, data_dir: &Path) -> Spawn {
        Spawn {
            bin: bin.to_path_buf(),
            data_dir: data_dir.to_path_buf(),
            http: "127.0.0.1:0".into(),
            grpc: "127.0.0.1:0".into(),
            env: Vec::new(),
        }
    }

    pub fn env(mut self, k: &str, v: impl Into<String>) -> Spawn {
        self.env.push((k.into(), v.into()));
        self
    }
}

/// A running `levee serve`.
#[derive(Debug)]
pub struct Server {
    pub child: Child,
    pub http: SocketAddr,
    pub grpc: SocketAddr,
    pub pid: u32,
}

impl Server {
    /// Starts it and waits (≤ 60 s) for its "levee listening:" line.
    pub async fn start(s: &Spawn) -> anyhow::Result<Server> {
        let mut cmd = Command::new(&s.bin);
        cmd.arg("serve")
            .env("LEVEE_DATA_DIR", &s.data_dir)
            .env("LEVEE_HTTP_ADDR", &s.http)
            .env("LEVEE_GRPC_ADDR", &s.grpc)
            .env("LEVEE_ADMIN_PASSWORD", ADMIN_PASSWORD)
            .env("LEVEE_LOG", std::env::var("LEVEE_BENCH_SERVER_LOG").unwrap_or_else(|_| "error".into()))
            .env_remove("LEVEE_DATABASE_URL")
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true);
        for (k, v) in &s.env {
            cmd.env(k, v);
        }
        let mut child = cmd.spawn().with_context(|| format!("starting {}", s.bin.display()))?;
        let pid = child.id().context("levee has a pid")?;
        let mut lines = BufReader::new(child.stdout.take().context("stdout piped")?).lines();
        let line = tokio::time::timeout(Duration::from_secs(60), async {
            while let Some(l) = lines.next_line().await? {
                if l.starts_with("levee listening:") {
                    return Ok(l);
                }
            }
            anyhow::bail!("levee exited before listening")
        })
        .await
        .context("levee did not print its addresses within 60 s")??;
        // "levee listening: http://A (API, UI)  grpc://B (agent sync)"
        let addr = |scheme: &str| -> anyhow::Result<SocketAddr> {
            let rest = line.split(scheme).nth(1).context("address in the listening line")?;
            Ok(rest.split_whitespace().next().unwrap_or_default().parse()?)
        };
        let (http, grpc) = (addr("http://")?, addr("grpc://")?);
        tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
        Ok(Server { child, http, grpc, pid })
    }

    pub fn base(&self) -> String {
        format!("http://{}", self.http)
    }

    pub fn grpc_url(&self) -> String {
        format!("http://{}", self.grpc)
    }

    /// SIGTERM (graceful: GoAway to every stream), then waits for the exit.
    pub async fn stop(mut self) -> anyhow::Result<()> {
        if let Some(pid) = rustix::process::Pid::from_raw(self.pid as i32) {
            let _ = rustix::process::kill_process(pid, rustix::process::Signal::TERM);
        }
        if tokio::time::timeout(Duration::from_secs(30), self.child.wait()).await.is_err() {
            self.child.kill().await?;
        }
        Ok(())
    }

    /// Resident memory now and its peak (VmRSS, VmHWM), in KiB.
    pub fn rss_kib(&self) -> (u64, u64) {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid)).unwrap_or_default();
        let field = |name: &str| -> u64 {
            status
                .lines()
                .find(|l| l.starts_with(name))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse().ok())
                .unwrap_or(0)
        };
        (field("VmRSS:"), field("VmHWM:"))
    }

    /// CPU time used so far (user + system), in seconds.
    pub fn cpu_seconds(&self) -> f64 {
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", self.pid)).unwrap_or_default();
        // Fields after the command name (which is in parentheses): state is field 3, utime 14, stime 15.
        let after = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
        let f: Vec<u64> = after.split_whitespace().map(|x| x.parse().unwrap_or(0)).collect();
        let ticks = (f.get(11).copied().unwrap_or(0) + f.get(12).copied().unwrap_or(0)) as f64;
        ticks / rustix::param::clock_ticks_per_second() as f64
    }

    /// The sum of a counter family on the server's /metrics (all label sets).
    pub async fn counter(&self, client: &reqwest::Client, name: &str) -> f64 {
        let Ok(res) = client.get(format!("{}/metrics", self.base())).send().await else { return 0.0 };
        let text = res.text().await.unwrap_or_default();
        text.lines()
            .filter(|l| l.starts_with(name) && l[name.len()..].starts_with(['{', ' ']))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .fold(0.0, |a, b| a + b)
    }
}

/// A fresh PostgreSQL database for one run (created and dropped with `psql`), on the
/// server `base` (`postgres://user@host:port`, loopback).
#[derive(Debug)]
pub struct PgDatabase {
    pub base: String,
    pub name: String,
}

impl PgDatabase {
    pub fn create(base: &str) -> anyhow::Result<PgDatabase> {
        let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?.subsec_nanos();
        let name = format!("levee_bench_{}_{nanos}", std::process::id());
        psql(base, &format!("CREATE DATABASE {name}"))?;
        Ok(PgDatabase { base: base.trim_end_matches('/').to_string(), name })
    }

    pub fn url(&self) -> String {
        format!("{}/{}", self.base, self.name)
    }
}

impl Drop for PgDatabase {
    fn drop(&mut self) {
        let _ = psql(&self.base, &format!("DROP DATABASE IF EXISTS {} WITH (FORCE)", self.name));
    }
}

fn psql(base: &str, sql: &str) -> anyhow::Result<()> {
    let out = std::process::Command::new("psql")
        .arg(format!("{}/postgres", base.trim_end_matches('/')))
        .args(["-v", "ON_ERROR_STOP=1", "-q", "-c", sql])
        .output()
        .context("running psql (the PostgreSQL client) to create the run's database")?;
    anyhow::ensure!(out.status.success(), "psql {sql}: {}", String::from_utf8_lossy(&out.stderr));
    Ok(())
}

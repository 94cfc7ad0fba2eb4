//! `levee-bench rollout --agents N`: staged policy changes that are bad, halted by the
//! server on the agents' health (issue 18, targets.md "Change delivery").
//!
//! N agents call dependency `recommendations`, which answers in [`DEPENDENCY_LATENCY`];
//! each reports its health windows through the real status path every
//! `--report-interval`. Policy changes of `prod` are staged (the server's default stages,
//! each baking `--bake`), and the server judges rollouts every `--evaluation-interval`
//! (its `LEVEE_ROLLOUT_INTERVAL`). Each of `--rollouts` bad changes gives `recommendations`
//! an attempt timeout of a few milliseconds: the canary cohort's calls time out from the
//! moment it applied the candidate, its reports say so, and the server halts the rollout
//! and reverts (the rule is the server's, `rollout::halt_reason`; nothing here judges).
//!
//! Measured per rollout: from the first canary ACK of the candidate (the server's ACK
//! time, `…/revisions/{rev}/propagation`) to the halt decision (the rollout's `ended_at`,
//! the transaction that halted it), and from the decision until each cohort agent applied
//! the revert (the agent persists and ACKs right after; the last of them is the figure).
//! The agents outside the cohort that received the candidate are counted from the agents'
//! own history of applied revisions (every agent's revision sampled every millisecond for
//! the whole run) and cross-checked against the server's ACKs of the candidate: both
//! must be 0, and the server's ACKs must be exactly the agents that applied it.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::Context;
use clap::Args as ClapArgs;
use levee_agent::policy::{Timestamp, duration};
use levee_agent::{Agent, SyncClientSettings};
use reqwest::Method;
use serde_json::json;

use super::api::Api;
use super::fleet::{Fleet, Traffic};
use super::{Common, SETUP_STREAMS_PER_SEC, Setup, percentiles_ms};

/// How long `recommendations` takes to answer: well within its default attempt timeout,
/// far beyond the few milliseconds a bad change gives it.
pub const DEPENDENCY_LATENCY: Duration = Duration::from_millis(50);
/// Most bad changes of a run: the n-th gives an attempt timeout of n ms, each distinct
/// (a rollout's cohort is judged on the revisions carrying its own candidate policy) and
/// each below [`DEPENDENCY_LATENCY`].
pub const MAX_ROLLOUTS: usize = 20;

#[derive(Debug, ClapArgs)]
pub struct Args {
    #[command(flatten)]
    pub common: Common,
    /// Agents (streams); default 1,000, 20 with --smoke.
    #[arg(long)]
    pub agents: Option<usize>,
    /// Bad changes staged one after the other, each its own rollout and cohort (1–20);
    /// default 5, 1 with --smoke.
    #[arg(long)]
    pub rollouts: Option<usize>,
    /// Bake time of each stage (the plan's `bake`, 1s–7d): how long a stage runs before the
    /// next starts.
    #[arg(long, value_parser = duration::parse, default_value = "10s")]
    pub bake: Duration,
    /// The agents' status report interval; default 1s, 200ms with --smoke.
    #[arg(long, value_parser = duration::parse)]
    pub report_interval: Option<Duration>,
    /// How often the server judges rollouts (`LEVEE_ROLLOUT_INTERVAL`, 10ms–1m); default the
    /// server's (1s), 200ms with --smoke.
    #[arg(long, value_parser = duration::parse)]
    pub evaluation_interval: Option<Duration>,
    /// Fails (exit 1) unless every rollout was halted by the server in its first stage on
    /// the cohort's health, no agent outside a cohort received a candidate (the agents'
    /// history and the server's ACKs agree), and every figure is present.
    #[arg(long)]
    pub check: bool,
}

/// What one bad change did.
#[derive(Debug)]
struct Outcome {
    id: i64,
    candidate: u64,
    revert: u64,
    /// The rollout's `ended_at` (ms since the epoch).
    halted_at: f64,
    /// The stage it ended in (1-based) and its state and outcome in words.
    stage: u64,
    state: String,
    reason: String,
    /// Instance ids the server counts in the cohort.
    cohort: BTreeSet<String>,
    /// The server's ACKs of the candidate: (instance id, ms since the epoch), fastest first.
    acks: Vec<(String, f64)>,
    /// The server's count of them (every one, listed or not).
    acked: usize,
}

pub async fn run(a: Args) -> anyhow::Result<serde_json::Value> {
    let smoke = a.common.smoke;
    let n = a.agents.unwrap_or(if smoke { 20 } else { 1_000 });
    let rollouts = a.rollouts.unwrap_or(if smoke { 1 } else { 5 });
    anyhow::ensure!(
        (1..=MAX_ROLLOUTS).contains(&rollouts),
        "--rollouts must be between 1 and {MAX_ROLLOUTS}"
    );
    let report = a.report_interval.unwrap_or(Duration::from_millis(if smoke { 200 } else { 1000 }));
    let evaluation = a.evaluation_interval.or(smoke.then_some(Duration::from_millis(200)));
    let calls_per_sec = a.common.calls_per_sec.unwrap_or(if smoke { 20.0 } else { 1.0 });
    anyhow::ensure!(calls_per_sec > 0.0, "--calls-per-sec must be above 0: the halt is decided on the calls");

    let mut env = vec![("LEVEE_NEW_STREAMS_PER_SEC", SETUP_STREAMS_PER_SEC.to_string())];
    if let Some(e) = evaluation {
        env.push(("LEVEE_ROLLOUT_INTERVAL", duration::format(e)));
    }
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let s = Setup::sqlite(&a.common, &env).await?;
    let traffic = Traffic {
        calls_per_sec,
        latency: DEPENDENCY_LATENCY,
        sync: SyncClientSettings { status_interval: report, ..SyncClientSettings::default() },
    };
    let fleet = Fleet::start_with(&a.common, &s.server.grpc_url(), &s.token, n, &traffic)?;
    let connect = fleet.wait_synced(1, Duration::from_secs(120)).await?;
    wait_connected(&s.api, n, Duration::from_secs(60)).await?;
    eprintln!("{n} agents synced in {:.1} s", connect.as_secs_f64());
    s.api
        .send(
            Method::PUT,
            "/environments/prod/rollout-settings",
            Some(json!({"reason": "levee-bench rollout", "settings": {
                "staged": ["policy"], "plan": {"bake": duration::format(a.bake)}}})),
        )
        .await?;

    let history = History::start(fleet.agents.clone());
    // Health of the stable policy in every report before the first change.
    tokio::time::sleep(report * 2).await;
    let mut outcomes = Vec::new();
    for i in 0..rollouts {
        let o = bad_change(&s.api, &fleet, i, a.bake).await?;
        eprintln!(
            "rollout {}: {} at stage {} ({} cohort agents): {}",
            o.id,
            o.state,
            o.stage,
            o.cohort.len(),
            o.reason
        );
        outcomes.push(o);
        // The next change starts from a quiet fleet: every agent reported on the revert.
        tokio::time::sleep(report * 2).await;
    }
    let history = history.stop().await;
    let (rss, hwm) = s.server.rss_kib();
    fleet.shutdown().await;
    s.server.stop().await?;

    let ids: Vec<&str> = fleet_ids(&history);
    let mut to_halt = Vec::new();
    let mut to_last_revert = Vec::new();
    let mut to_revert = Vec::new();
    let (mut outside_received, mut outside_acked, mut disagreements) = (0usize, 0usize, 0usize);
    let mut cohort_sizes = Vec::new();
    let mut problems = Vec::new();
    for o in &outcomes {
        cohort_sizes.push(o.cohort.len());
        // The agents' own history: who ever applied the candidate, and when each cohort
        // agent applied the revert.
        let received: BTreeSet<&str> = ids
            .iter()
            .zip(&history.seen)
            .filter(|(_, h)| h.contains_key(&o.candidate))
            .map(|(id, _)| *id)
            .collect();
        outside_received += received.iter().filter(|id| !o.cohort.contains(**id)).count();
        let acked: BTreeSet<&str> = o.acks.iter().map(|(id, _)| id.as_str()).collect();
        outside_acked += acked.iter().filter(|id| !o.cohort.contains(**id)).count();
        if acked != received || o.acked != o.acks.len() {
            disagreements += 1;
            problems.push(format!(
                "rollout {}: the server has {} ACKs of revision {} ({} listed), the agents' history {} receivers",
                o.id,
                o.acked,
                o.candidate,
                o.acks.len(),
                received.len()
            ));
        }
        if let Some((_, first)) = o.acks.first() {
            to_halt.push(o.halted_at - first);
        }
        let reverted: Vec<f64> = ids
            .iter()
            .zip(&history.seen)
            .filter(|(id, _)| o.cohort.contains(**id))
            .filter_map(|(_, h)| h.get(&o.revert).map(|t| (t - o.halted_at).max(0.0)))
            .collect();
        if reverted.len() != o.cohort.len() {
            problems.push(format!(
                "rollout {}: {} of {} cohort agents applied the revert {}",
                o.id,
                reverted.len(),
                o.cohort.len(),
                o.revert
            ));
        }
        if let Some(last) = reverted.iter().copied().reduce(f64::max) {
            to_last_revert.push(last);
        }
        to_revert.extend(reverted);
        if o.state != "halted" || o.stage != 1 || !o.reason.contains("dependency recommendations:") {
            problems.push(format!("rollout {}: {} at stage {}: {}", o.id, o.state, o.stage, o.reason));
        }
    }
    if outside_received > 0 || outside_acked > 0 {
        problems.push(format!(
            "agents outside the cohort received a candidate: {outside_received} by their history, \
             {outside_acked} by the server's ACKs"
        ));
    }
    let summary = json!({
        "mode": "rollout", "smoke": smoke, "agents": n, "rollouts": outcomes.len(),
        "calls_per_sec": calls_per_sec, "dependency_latency_ms": DEPENDENCY_LATENCY.as_millis() as u64,
        "bake": duration::format(a.bake), "report_interval": duration::format(report),
        "evaluation_interval": evaluation.map_or_else(|| "server default (1s)".to_string(), duration::format),
        "cohort_agents": cohort_sizes,
        "halted": outcomes.iter().filter(|o| o.state == "halted").count(),
        "halted_in_stage_1": outcomes.iter().filter(|o| o.state == "halted" && o.stage == 1).count(),
        "reason": outcomes.first().map(|o| o.reason.clone()),
        "first_canary_ack_to_halt": percentiles_ms(&to_halt),
        "halt_to_last_cohort_reverted": percentiles_ms(&to_last_revert),
        "halt_to_cohort_agent_reverted": percentiles_ms(&to_revert),
        "outside_cohort_received": outside_received,
        "outside_cohort_acked": outside_acked,
        "history_and_acks_disagree": disagreements,
        "history_samples": history.samples,
        "connect_seconds": (connect.as_secs_f64() * 100.0).round() / 100.0,
        "server_rss_mib": rss / 1024, "server_peak_rss_mib": hwm / 1024,
    });
    if a.check {
        if to_halt.len() != outcomes.len() || to_last_revert.len() != outcomes.len() {
            problems.push("a figure is missing (a rollout without ACKs or reverts)".into());
        }
        if !problems.is_empty() {
            // The summary still goes out (stdout) before the failure.
            println!("{summary}");
            anyhow::bail!("--check failed:\n  {}", problems.join("\n  "));
        }
    } else {
        for p in &problems {
            eprintln!("warning: {p}");
        }
    }
    Ok(summary)
}

/// Stages the `i`-th bad change (an attempt timeout of `i + 1` ms on `recommendations`)
/// and waits until the server ended its rollout, every agent applied what came after, and
/// the server recorded the ACKs of the candidate.
async fn bad_change(api: &Api, fleet: &Fleet, i: usize, bake: Duration) -> anyhow::Result<Outcome> {
    let current = api.send(Method::GET, "/environments/prod/services/checkout/policy", None).await?;
    let rev = current["revision"].as_u64().context("the policy's revision")?;
    let mut policy = current["policy"].clone();
    policy["dependencies"]["recommendations"]["attempt_timeout"] = json!(format!("{}ms", i + 1));
    let written = api
        .send_with(
            Method::PUT,
            "/environments/prod/services/checkout/policy",
            Some(json!({"policy": policy, "reason": "levee-bench rollout: a bad change", "staged": true})),
            &[("if-match", &format!("\"{rev}\""))],
        )
        .await?;
    let id = written["rollout"]["id"].as_i64().context("the write started a rollout")?;
    let candidate = written["revision"].as_u64().context("the write's revision")?;
    // The halt comes within the first stage or the run says where it did not.
    let limit = bake * 4 + Duration::from_secs(30);
    let started = tokio::time::Instant::now();
    let detail = loop {
        let d = api.send(Method::GET, &format!("/environments/prod/rollouts/{id}"), None).await?;
        if d["rollout"]["state"] != "running" {
            break d;
        }
        anyhow::ensure!(started.elapsed() < limit, "rollout {id} still running after {limit:?}: {d}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let r = &detail["rollout"];
    let state = r["state"].as_str().unwrap_or_default().to_string();
    let revert = r["revert_revision"].as_u64().unwrap_or(candidate);
    let halted_at = r["ended_at"]
        .as_str()
        .and_then(|t| serde_json::from_value::<Timestamp>(json!(t)).ok())
        .map(|t| t.unix_ms() as f64)
        .context("an ended rollout has ended_at")?;
    let cohort: BTreeSet<String> = detail["instances"]
        .as_array()
        .context("the rollout's instances")?
        .iter()
        .filter(|i| i["in_cohort"] == true)
        .filter_map(|i| i["instance_id"].as_str().map(str::to_string))
        .collect();
    fleet.wait_synced(revert, Duration::from_secs(60)).await?;
    // ACKs reach the database through the fleet writer, a moment after the agents sent
    // them: read until every agent that applied the candidate is there, at most 10 s.
    let applied = |a: &Agent| cohort.contains(a.instance_id());
    let expected = fleet.agents.iter().filter(|a| applied(a)).count();
    let path = format!("/environments/prod/services/checkout/revisions/{candidate}/propagation");
    let mut propagation = api.send(Method::GET, &path, None).await?;
    let waited = tokio::time::Instant::now();
    while propagation["acked"].as_u64().unwrap_or(0) < expected as u64
        && waited.elapsed() < Duration::from_secs(10)
    {
        tokio::time::sleep(Duration::from_millis(50)).await;
        propagation = api.send(Method::GET, &path, None).await?;
    }
    let acks = propagation["acks"]
        .as_array()
        .context("the propagation's acks")?
        .iter()
        .filter_map(|a| {
            let at = serde_json::from_value::<Timestamp>(a["acked_at"].clone()).ok()?;
            Some((a["instance_id"].as_str()?.to_string(), at.unix_ms() as f64))
        })
        .collect();
    Ok(Outcome {
        id,
        candidate,
        revert,
        halted_at,
        stage: r["stage"].as_u64().unwrap_or(0) + 1,
        state,
        reason: r["outcome"].as_str().unwrap_or_default().to_string(),
        cohort,
        acks,
        acked: propagation["acked"].as_u64().unwrap_or(0) as usize,
    })
}

/// Waits until the server's fleet view counts `n` connected agents (the cohort of a stage
/// is drawn from them).
async fn wait_connected(api: &Api, n: usize, timeout: Duration) -> anyhow::Result<()> {
    let start = tokio::time::Instant::now();
    loop {
        let agents = api.send(Method::GET, "/environments/prod/services/checkout/agents", None).await?;
        let connected = agents.as_array().map_or(0, |a| a.iter().filter(|a| a["connected"] == true).count());
        if connected >= n {
            return Ok(());
        }
        anyhow::ensure!(start.elapsed() < timeout, "the server counts {connected} of {n} agents connected");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Every agent's history of applied revisions: when (ms since the epoch) each revision
/// was first seen applied, sampled every millisecond by one task.
struct History {
    stop: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<Recorded>,
}

struct Recorded {
    ids: Vec<String>,
    /// Per agent (in the fleet's order): revision → first seen.
    seen: Vec<BTreeMap<u64, f64>>,
    /// Samples of the whole fleet taken.
    samples: u64,
}

fn now_ms() -> f64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64() * 1000.0)
}

fn fleet_ids(r: &Recorded) -> Vec<&str> {
    r.ids.iter().map(String::as_str).collect()
}

impl History {
    fn start(agents: Arc<Vec<Agent>>) -> History {
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = stop.clone();
        let task = tokio::spawn(async move {
            let ids = agents.iter().map(|a| a.instance_id().to_string()).collect();
            let mut seen: Vec<BTreeMap<u64, f64>> = vec![BTreeMap::new(); agents.len()];
            let mut last = vec![u64::MAX; agents.len()];
            let mut samples = 0;
            let mut tick = tokio::time::interval(Duration::from_millis(1));
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
            while !stopped.load(Ordering::Relaxed) {
                tick.tick().await;
                let at = now_ms();
                for (i, a) in agents.iter().enumerate() {
                    let rev = a.current().revision;
                    if rev != last[i] {
                        last[i] = rev;
                        seen[i].entry(rev).or_insert(at);
                    }
                }
                samples += 1;
            }
            Recorded { ids, seen, samples }
        });
        History { stop, task }
    }

    async fn stop(self) -> Recorded {
        self.stop.store(true, Ordering::Relaxed);
        self.task.await.unwrap_or(Recorded { ids: Vec::new(), seen: Vec::new(), samples: 0 })
    }
}

//! `levee experiment run|stop|get`: experiments from the command line, so a pipeline can
//! run one after every deploy and fail on its verdict.
//!
//! Exit codes of `run --wait` (and `get` of an ended experiment): 0 passed, 3 failed,
//! 4 aborted (including "nothing was injected": the hypothesis did not hold before),
//! 6 never started (its change request was rejected, or its approval void; scheduled with
//! `--at`, it could not start when due), 1 the experiment could not be started or
//! followed. `run` without `--wait` exits 0 once the experiment started (or was scheduled),
//! 5 when approval is pending.
//!
//! `run --at TIME` schedules the experiment instead (a scheduled change of kind
//! `experiment`, started by the server when due, as its author is then); with `--wait` it
//! waits for the start and follows the experiment to its verdict.
//!
//! Where the environment's approval rules cover experiments, `run` proposes the experiment
//! as a change request and says so; with `--wait` it waits for another person's decision,
//! applies the request once approved (which starts exactly the definition approved) and
//! follows the experiment to its verdict.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use levee_agent::policy::Timestamp;
use reqwest::Method;
use serde::Deserialize;
use serde_json::{Value, json};

use super::{CliError, Connection};
use crate::db::{ExperimentState, RequestState};

/// Exit code of an experiment whose verdict is `failed`.
pub const EXIT_FAILED: u8 = 3;
/// Exit code of an experiment whose verdict is `aborted`.
pub const EXIT_ABORTED: u8 = 4;
/// Exit code of `run` without `--wait` where approval is pending: nothing started yet.
pub const EXIT_PENDING: u8 = 5;
/// Exit code of `run --wait` whose change request was rejected or whose approval was
/// void, or whose scheduled start failed when due: nothing started.
pub const EXIT_NOT_STARTED: u8 = 6;

/// `levee experiment …`.
#[derive(Debug, clap::Subcommand)]
pub enum ExperimentCommand {
    /// Starts the experiment of FILE (YAML or JSON); with --wait, follows it to its verdict.
    ///
    /// Where approval rules cover experiments it is proposed as a change request instead;
    /// --wait then waits for the decision and applies the request once approved.
    ///
    /// With --at TIME it is scheduled instead: the server starts it then, as its author is
    /// then; --wait waits for the start and follows it.
    ///
    /// Exit codes with --wait: 0 passed, 3 failed, 4 aborted, 6 never started (rejected, or
    /// its scheduled start failed), 1 error; without --wait: 0 started or scheduled, 5
    /// approval pending.
    Run(RunArgs),
    /// Asks a running experiment to stop: it aborts and removes its fault.
    Stop(StopArgs),
    /// Prints an experiment's state, verdict and timeline (exit code as `run --wait` once
    /// it ended).
    Get(GetArgs),
}

/// `levee experiment run`.
#[derive(Debug, clap::Args)]
pub struct RunArgs {
    #[command(flatten)]
    pub connection: Connection,
    /// The experiment: a YAML or JSON file (see docs/experiments.md).
    pub file: PathBuf,
    /// Why, recorded in the audit log; required.
    #[arg(long)]
    pub reason: String,
    /// Follow the experiment until it ends; the exit code is its verdict. Where approval
    /// is needed, wait for the decision first (bound the wait with your pipeline's timeout).
    #[arg(long)]
    pub wait: bool,
    /// Schedule it instead: the server starts it at this time (RFC 3339, in the future),
    /// as its author is then and under the approval rules in force then.
    #[arg(long, value_name = "TIME", value_parser = parse_time)]
    pub at: Option<Timestamp>,
    #[command(flatten)]
    pub break_glass: super::BreakGlass,
}

/// `levee experiment stop`.
#[derive(Debug, clap::Args)]
pub struct StopArgs {
    #[command(flatten)]
    pub connection: Connection,
    /// The experiment's id.
    pub id: i64,
    /// Why, recorded in the audit log; required.
    #[arg(long)]
    pub reason: String,
}

/// `levee experiment get`.
#[derive(Debug, clap::Args)]
pub struct GetArgs {
    #[command(flatten)]
    pub connection: Connection,
    /// The experiment's id.
    pub id: i64,
}

/// What the CLI reads of an experiment.
#[derive(Debug, Deserialize)]
struct View {
    id: i64,
    name: String,
    state: ExperimentState,
    verdict: Option<String>,
    why: Option<String>,
}

/// What the CLI reads of a change request proposing an experiment.
#[derive(Debug, Deserialize)]
struct Request {
    id: i64,
    state: RequestState,
    approved_by: Option<String>,
    decided_reason: Option<String>,
    outcome: Option<String>,
    experiment_id: Option<i64>,
}

/// What `POST /experiments` answers: started, or proposed for approval.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum Start {
    Pending { message: String, change_request: Request },
    Started(View),
}

/// What the CLI reads of a report.
#[derive(Debug, Deserialize)]
struct Report {
    experiment: View,
    timeline: Vec<Event>,
    /// A game day's measures (absent from older servers, `null` for other experiments).
    #[serde(default)]
    game_day: Option<GameDay>,
}

/// What the CLI reads of a game day's measures: the server says them in words.
#[derive(Debug, Deserialize)]
struct GameDay {
    summary: Vec<String>,
}

#[derive(Debug, Deserialize)]
struct Event {
    at: String,
    event: String,
    by: Option<String>,
    detail: String,
}

/// How often `--wait` asks the server.
const POLL: Duration = Duration::from_secs(1);

/// Runs `levee experiment …`.
pub async fn run(cmd: ExperimentCommand) -> Result<ExitCode, CliError> {
    match cmd {
        ExperimentCommand::Run(a) => {
            let text = std::fs::read_to_string(&a.file)
                .map_err(|e| CliError::Usage(format!("{}: {e}", a.file.display())))?;
            let spec: Value = serde_saphyr::from_str(&text).map_err(|e| {
                CliError::Usage(format!("{}: not a YAML or JSON document: {e}", a.file.display()))
            })?;
            let env = spec.get("environment").and_then(Value::as_str).unwrap_or_default().to_string();
            let api = a.connection.api()?.break_glass(a.break_glass.break_glass.as_deref())?;
            if let Some(at) = a.at {
                let id = match scheduled(&api, &env, spec, at, &a.reason, a.wait).await? {
                    Ok(id) => id,
                    Err(code) => return Ok(code),
                };
                return follow(&api, id).await;
            }
            let body = json!({"experiment": spec, "reason": a.reason});
            let id = match api.send(Method::POST, "/experiments", Some(&body), None).await? {
                Start::Started(v) => {
                    println!("experiment {} ({}) started: measuring the baseline", v.id, v.name);
                    v.id
                }
                Start::Pending { message, change_request } => {
                    println!("{message}");
                    if !a.wait {
                        println!(
                            "not started; approve it with the console's change requests page or \
                             `POST /api/v1/environments/{env}/change-requests/{}/approve`",
                            change_request.id
                        );
                        return Ok(ExitCode::from(EXIT_PENDING));
                    }
                    match approved(&api, &env, change_request.id, &a.reason).await? {
                        Ok(id) => id,
                        Err(code) => return Ok(code),
                    }
                }
            };
            if !a.wait {
                return Ok(ExitCode::SUCCESS);
            }
            follow(&api, id).await
        }
        ExperimentCommand::Stop(a) => {
            let api = a.connection.api()?;
            let path = format!("/experiments/{}/stop", a.id);
            let v: View = api.send(Method::POST, &path, Some(&json!({"reason": a.reason})), None).await?;
            println!("experiment {} ({}): asked to stop; it aborts at its next reading", v.id, v.name);
            Ok(ExitCode::SUCCESS)
        }
        ExperimentCommand::Get(a) => {
            let api = a.connection.api()?;
            let r: Report = api.get(&format!("/experiments/{}", a.id)).await?;
            for e in &r.timeline {
                print_event(e);
            }
            println!("state {}", r.experiment.state);
            print_game_day(r.game_day.as_ref());
            Ok(ended(&r.experiment).unwrap_or(ExitCode::SUCCESS))
        }
    }
}

/// Waits for change request `id` of `env` (proposing an experiment) to be decided; applies
/// it once approved (unless someone did) and returns the experiment it started, or the exit
/// code of a request that will never start one.
async fn approved(
    api: &super::Api,
    env: &str,
    id: i64,
    reason: &str,
) -> Result<Result<i64, ExitCode>, CliError> {
    let path = format!("/environments/{}/change-requests/{id}", super::session::seg(env));
    println!("waiting for another person to approve change request {id}");
    loop {
        let r: Request = api.get(&path).await?;
        match r.state {
            RequestState::Open => {}
            RequestState::Approved => {
                println!(
                    "change request {id} approved by {}: applying it",
                    r.approved_by.as_deref().unwrap_or("someone")
                );
                let apply = format!("{path}/apply");
                let r: Request =
                    match api.send(Method::POST, &apply, Some(&json!({"reason": reason})), None).await {
                        Ok(r) => r,
                        // Applied by someone else in the meantime, or its approval found void
                        // (it is then `conflict`): read where it is.
                        Err(CliError::Api { status, .. })
                            if status == reqwest::StatusCode::NOT_FOUND
                                || status == reqwest::StatusCode::CONFLICT =>
                        {
                            continue;
                        }
                        Err(e) => return Err(e),
                    };
                if let Some(e) = r.experiment_id {
                    println!("experiment {e} started: measuring the baseline");
                    return Ok(Ok(e));
                }
            }
            RequestState::Applied => {
                if let Some(e) = r.experiment_id {
                    println!("change request {id} was applied: experiment {e} started");
                    return Ok(Ok(e));
                }
            }
            other => {
                let why = r.decided_reason.or(r.outcome).unwrap_or_default();
                println!("change request {id} is {other}: {why}; the experiment never started");
                return Ok(Err(ExitCode::from(EXIT_NOT_STARTED)));
            }
        }
        tokio::time::sleep(POLL).await;
    }
}

/// What the CLI reads of a scheduled change.
#[derive(Debug, Deserialize)]
struct Scheduled {
    id: i64,
    state: String,
    outcome: Option<String>,
    experiment_id: Option<i64>,
}

fn parse_time(text: &str) -> Result<Timestamp, String> {
    Timestamp::parse(text).ok_or_else(|| format!("{text:?} is not an RFC 3339 time (2026-12-07T02:00:00Z)"))
}

/// Schedules experiment `spec` of `env` at `at`; with `wait`, waits for the server to
/// start it and returns the experiment started, or the exit code of one that did not
/// start; without, the exit code 0.
async fn scheduled(
    api: &super::Api,
    env: &str,
    spec: Value,
    at: Timestamp,
    reason: &str,
    wait: bool,
) -> Result<Result<i64, ExitCode>, CliError> {
    let path = format!("/environments/{}/scheduled-changes", super::session::seg(env));
    let body = json!({"kind": "experiment", "experiment": spec, "run_at": at, "reason": reason});
    let c: Scheduled = api.send(Method::POST, &path, Some(&body), None).await?;
    println!("scheduled change {}: the experiment starts at {at}", c.id);
    if !wait {
        return Ok(Err(ExitCode::SUCCESS));
    }
    let path = format!("{path}/{}", c.id);
    loop {
        let c: Scheduled = api.get(&path).await?;
        match (c.state.as_str(), c.experiment_id) {
            ("pending" | "running", _) => {}
            (_, Some(e)) => {
                println!("scheduled change {} ran: experiment {e} started", c.id);
                return Ok(Ok(e));
            }
            (state, None) => {
                let why = c.outcome.unwrap_or_default();
                println!("scheduled change {} is {state}: {why}; the experiment never started", c.id);
                return Ok(Err(ExitCode::from(EXIT_NOT_STARTED)));
            }
        }
        tokio::time::sleep(POLL).await;
    }
}

/// Prints the timeline as it grows until the experiment ends; its verdict is the exit code.
async fn follow(api: &super::Api, id: i64) -> Result<ExitCode, CliError> {
    let mut shown = 0;
    loop {
        let r: Report = api.get(&format!("/experiments/{id}")).await?;
        for e in r.timeline.iter().skip(shown) {
            print_event(e);
        }
        shown = r.timeline.len();
        if !r.experiment.state.is_running() {
            print_game_day(r.game_day.as_ref());
        }
        if let Some(code) = ended(&r.experiment) {
            return Ok(code);
        }
        tokio::time::sleep(POLL).await;
    }
}

/// A game day's three times, who did what, and the runbooks of the features it hit.
fn print_game_day(g: Option<&GameDay>) {
    for line in g.iter().flat_map(|g| &g.summary) {
        println!("{line}");
    }
}

fn print_event(e: &Event) {
    let by = e.by.as_deref().map(|b| format!(" by {b}")).unwrap_or_default();
    println!("{} {}{by}: {}", e.at, e.event, e.detail);
}

/// The exit code of an ended experiment (its verdict, printed), `None` while it runs.
fn ended(v: &View) -> Option<ExitCode> {
    if v.state.is_running() {
        return None;
    }
    let verdict = v.verdict.as_deref().unwrap_or("");
    println!("verdict {verdict}: {}", v.why.as_deref().unwrap_or(""));
    Some(ExitCode::from(match verdict {
        "passed" => 0,
        "failed" => EXIT_FAILED,
        "aborted" => EXIT_ABORTED,
        _ => 1,
    }))
}

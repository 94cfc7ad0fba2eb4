//! `levee experiment run|stop|get`: experiments from the command line, so a pipeline can
//! run one after every deploy and fail on its verdict.
//!
//! Exit codes of `run --wait` (and `get` of an ended experiment): 0 passed, 3 failed,
//! 4 aborted (including "nothing was injected": the hypothesis did not hold before),
//! 1 the experiment could not be started or followed. `run` without `--wait` exits 0 once
//! the experiment started.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use reqwest::Method;
use serde::Deserialize;
use serde_json::{Value, json};

use super::{CliError, Connection};

/// Exit code of an experiment whose verdict is `failed`.
pub const EXIT_FAILED: u8 = 3;
/// Exit code of an experiment whose verdict is `aborted`.
pub const EXIT_ABORTED: u8 = 4;

/// `levee experiment …`.
#[derive(Debug, clap::Subcommand)]
pub enum ExperimentCommand {
    /// Starts the experiment of FILE (YAML or JSON); with --wait, follows it to its verdict.
    ///
    /// Exit codes with --wait: 0 passed, 3 failed, 4 aborted, 1 error.
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
    /// Follow the experiment until it ends; the exit code is its verdict.
    #[arg(long)]
    pub wait: bool,
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
    state: String,
    verdict: Option<String>,
    why: Option<String>,
}

/// What the CLI reads of a report.
#[derive(Debug, Deserialize)]
struct Report {
    experiment: View,
    timeline: Vec<Event>,
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
            let api = a.connection.api()?;
            let body = json!({"experiment": spec, "reason": a.reason});
            let v: View = api.send(Method::POST, "/experiments", Some(&body), None).await?;
            println!("experiment {} ({}) started: measuring the baseline", v.id, v.name);
            if !a.wait {
                return Ok(ExitCode::SUCCESS);
            }
            follow(&api, v.id).await
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
            Ok(ended(&r.experiment).unwrap_or(ExitCode::SUCCESS))
        }
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
        if let Some(code) = ended(&r.experiment) {
            return Ok(code);
        }
        tokio::time::sleep(POLL).await;
    }
}

fn print_event(e: &Event) {
    let by = e.by.as_deref().map(|b| format!(" by {b}")).unwrap_or_default();
    println!("{} {}{by}: {}", e.at, e.event, e.detail);
}

/// The exit code of an ended experiment (its verdict, printed), `None` while it runs.
fn ended(v: &View) -> Option<ExitCode> {
    if v.state != "done" {
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

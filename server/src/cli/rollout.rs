//! `levee rollout status|promote|pause|resume|abort`: staged rollouts from the command line.

use std::process::ExitCode;

use reqwest::Method;
use serde_json::{Value, json};

use super::session::seg;
use super::{CliError, Connection, split_target};

/// `levee rollout …`.
#[derive(Debug, clap::Subcommand)]
pub enum RolloutCommand {
    /// Shows the newest rollout of ENV/SERVICE: stage, cohort beside the rest, outcome.
    Status(StatusArgs),
    /// Starts the next stage of rollout ID of ENV now (at the last stage, completes it).
    Promote(StepArgs),
    /// Pauses rollout ID of ENV (no next stage until resumed; a halt still applies).
    Pause(StepArgs),
    /// Resumes paused rollout ID of ENV.
    Resume(StepArgs),
    /// Aborts rollout ID of ENV: the previous policy back for every instance.
    Abort(StepArgs),
}

/// `levee rollout status`.
#[derive(Debug, clap::Args)]
pub struct StatusArgs {
    #[command(flatten)]
    pub connection: Connection,
    /// ENV/SERVICE.
    pub target: String,
    /// text or json (the API's document).
    #[arg(long, short, value_enum, default_value = "text")]
    pub output: super::Output,
}

/// `levee rollout promote|pause|resume|abort`.
#[derive(Debug, clap::Args)]
pub struct StepArgs {
    #[command(flatten)]
    pub connection: Connection,
    /// The environment.
    pub env: String,
    /// The rollout's id (`levee rollout status` shows it).
    pub id: i64,
    /// Why, recorded in the audit log; required.
    #[arg(long)]
    pub reason: String,
}

/// Runs `levee rollout …`.
pub async fn run(cmd: RolloutCommand) -> Result<ExitCode, CliError> {
    let (a, verb) = match cmd {
        RolloutCommand::Status(a) => return status(a).await,
        RolloutCommand::Promote(a) => (a, "promote"),
        RolloutCommand::Pause(a) => (a, "pause"),
        RolloutCommand::Resume(a) => (a, "resume"),
        RolloutCommand::Abort(a) => (a, "abort"),
    };
    let api = a.connection.api()?;
    let path = format!("/environments/{}/rollouts/{}/{verb}", seg(&a.env), a.id);
    let r: Value = api.send(Method::POST, &path, Some(&json!({"reason": a.reason})), None).await?;
    println!("{}", line(&r));
    Ok(ExitCode::SUCCESS)
}

async fn status(a: StatusArgs) -> Result<ExitCode, CliError> {
    let (env, Some(svc)) = split_target(&a.target)? else {
        return Err(CliError::Usage(format!("{:?}: expected ENV/SERVICE, e.g. prod/checkout", a.target)));
    };
    let api = a.connection.api()?;
    let list: Vec<Value> =
        api.get(&format!("/environments/{}/rollouts?service={}", seg(env), seg(svc))).await?;
    let Some(newest) = list.first() else {
        println!("{env}/{svc}: no rollout");
        return Ok(ExitCode::SUCCESS);
    };
    let id = newest["id"].as_i64().unwrap_or_default();
    let d: Value = api.get(&format!("/environments/{}/rollouts/{id}", seg(env))).await?;
    if a.output == super::Output::Json {
        println!("{}", serde_json::to_string_pretty(&d).unwrap_or_default());
        return Ok(ExitCode::SUCCESS);
    }
    println!("{}", line(&d["rollout"]));
    for (side, served) in [("cohort", "candidate_revision"), ("rest", "stable_revision")] {
        let s = &d[side];
        println!(
            "  {side:<6} revision {:<6} {} of {} connected instances on it, {} NACK(s)",
            d["rollout"][served], s["on_revision"], s["instances"], s["nacks"]
        );
    }
    if let Some(outcome) = d["rollout"]["outcome"].as_str() {
        println!("  outcome: {outcome}");
    }
    Ok(ExitCode::SUCCESS)
}

/// One line about a rollout: id, service, state, stage, revisions.
fn line(r: &Value) -> String {
    let stages = r["plan"]["stages"].as_array().map_or(0, Vec::len);
    format!(
        "rollout {} of {}/{}: {}, stage {} of {stages}, cohort on revision {}, the rest on {}",
        r["id"],
        r["environment"].as_str().unwrap_or(""),
        r["service"].as_str().unwrap_or(""),
        r["state"].as_str().unwrap_or(""),
        r["stage"].as_u64().unwrap_or(0) + 1,
        r["candidate_revision"],
        r["stable_revision"]
    )
}

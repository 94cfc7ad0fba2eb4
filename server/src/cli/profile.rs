//! `levee profile apply|revert`: emergency profiles from the command line.

use std::process::ExitCode;
use std::time::Duration;

use levee_agent::policy::Timestamp;
use reqwest::Method;
use serde::Deserialize;
use serde_json::json;

use super::session::seg;
use super::{CliError, Connection};

/// `levee profile …`.
#[derive(Debug, clap::Subcommand)]
pub enum ProfileCommand {
    /// Applies profile NAME to environment ENV until the duration given has passed.
    Apply(ApplyArgs),
    /// Reverts the profile active in environment ENV now.
    Revert(RevertArgs),
}

/// `levee profile apply`.
#[derive(Debug, clap::Args)]
pub struct ApplyArgs {
    #[command(flatten)]
    pub connection: Connection,
    /// The environment.
    pub env: String,
    /// The profile.
    pub name: String,
    /// How long it stays applied (e.g. 30m, 2h; at most 7d); it reverts by itself then.
    #[arg(long = "for", value_name = "DURATION", value_parser = levee_agent::policy::duration::parse)]
    pub for_: Duration,
    /// Why, recorded in the audit log and shown on the service pages; required.
    #[arg(long)]
    pub reason: String,
    #[command(flatten)]
    pub break_glass: super::BreakGlass,
}

/// `levee profile revert`.
#[derive(Debug, clap::Args)]
pub struct RevertArgs {
    #[command(flatten)]
    pub connection: Connection,
    /// The environment.
    pub env: String,
    /// Why, recorded in the audit log; required.
    #[arg(long)]
    pub reason: String,
}

/// An application of a profile, as the API answers it.
#[derive(Deserialize)]
struct Activation {
    profile: String,
    version: u64,
    expires_at: String,
    services: Vec<String>,
}

/// Runs `levee profile …`.
pub async fn run(cmd: ProfileCommand) -> Result<ExitCode, CliError> {
    match cmd {
        ProfileCommand::Apply(a) => {
            let api = a.connection.api()?.break_glass(a.break_glass.break_glass.as_deref())?;
            let now = Timestamp::now().unix_ms();
            let until = Timestamp::from_unix_ms(now.saturating_add(a.for_.as_millis() as i64));
            let body = json!({"expires_at": until, "reason": a.reason});
            let path = format!("/environments/{}/profiles/{}/apply", seg(&a.env), seg(&a.name));
            let act: Activation = api.send(Method::POST, &path, Some(&body), None).await?;
            println!(
                "{}: profile {} (version {}) applied to {} until {}",
                a.env,
                act.profile,
                act.version,
                act.services.join(", "),
                act.expires_at
            );
        }
        ProfileCommand::Revert(a) => {
            let api = a.connection.api()?;
            let path = format!("/environments/{}/active-profile/revert", seg(&a.env));
            #[derive(Deserialize)]
            struct Reverted {
                #[serde(flatten)]
                activation: Activation,
                #[serde(default)]
                left: std::collections::BTreeMap<String, Vec<String>>,
            }
            let r: Reverted = api.send(Method::POST, &path, Some(&json!({"reason": a.reason})), None).await?;
            let act = r.activation;
            println!("{}: profile {} reverted in {}", a.env, act.profile, act.services.join(", "));
            for (svc, notes) in &r.left {
                for note in notes {
                    println!("  {svc}: {note}");
                }
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

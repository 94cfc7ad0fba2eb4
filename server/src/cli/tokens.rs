//! `levee tokens list|create|rotate|revoke`: API, agent and flags tokens from the command line
//! (admin). A new token's secret goes to `--out FILE` (0600, replaced atomically: what an
//! agent's token file or a mounted secret reads) or, without it, alone on stdout, so
//! `$(levee tokens rotate …)` captures it; everything else goes to stderr.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use levee_agent::policy::Timestamp;
use reqwest::Method;
use serde::Deserialize;
use serde_json::json;

use super::session::{seg, write_private};
use super::{CliError, Connection};
use crate::db::TokenKind;

/// A token that expires within this is marked by `levee tokens list` (and counted on
/// stderr): time to rotate it. A token whose end a rotation or a revocation set is not:
/// its end is the one an operator chose.
pub const EXPIRING_SOON: Duration = Duration::from_secs(14 * 86400);

/// `levee tokens …`.
#[derive(Debug, clap::Subcommand)]
pub enum TokensCommand {
    /// Lists tokens: id, kind, name, scope, expiry, and when a revoked or rotated one ends.
    List(ListArgs),
    /// Mints a token (an agent or flags token: --environment and --service; an API token:
    /// --role).
    Create(CreateArgs),
    /// Mints a token of the same kind, name and scope as TOKEN and ends TOKEN after
    /// --overlap, so instances move to the new one without a restart.
    ///
    /// Agents configured with a token file re-read it when they reconnect: write the new
    /// token there (or into the secret it is mounted from) within the overlap.
    Rotate(RotateArgs),
    /// Revokes TOKEN now: its agent streams end within seconds, on every replica.
    Revoke(RevokeArgs),
}

/// `levee tokens list`.
#[derive(Debug, clap::Args)]
pub struct ListArgs {
    #[command(flatten)]
    pub connection: Connection,
    /// Also list tokens that have ended (revoked or expired).
    #[arg(long)]
    pub all: bool,
}

/// `levee tokens create`.
#[derive(Debug, clap::Args)]
pub struct CreateArgs {
    #[command(flatten)]
    pub connection: Connection,
    /// A name for people, e.g. checkout-prod.
    pub name: String,
    /// agent (sync, scoped to an environment and services), flags (OFREP flag evaluation,
    /// scoped as an agent token) or api (automation, a role).
    #[arg(long, default_value = "agent", value_parser = ["agent", "flags", "api"])]
    pub kind: String,
    /// The environment an agent or flags token may read.
    #[arg(long)]
    pub environment: Option<String>,
    /// A service an agent or flags token may read (repeat, or comma-separated).
    #[arg(long = "service", value_delimiter = ',')]
    pub services: Vec<String>,
    /// Role of an API token: viewer (default), operator or admin.
    #[arg(long)]
    pub role: Option<String>,
    /// Lifetime, e.g. 30d (default: the server's, 90d).
    #[arg(long, value_name = "DURATION")]
    pub expires_in: Option<String>,
    /// Why, recorded in the audit log; required.
    #[arg(long)]
    pub reason: String,
    /// Writes the token to this file (mode 0600) instead of stdout.
    #[arg(long, value_name = "FILE")]
    pub out: Option<PathBuf>,
}

/// `levee tokens rotate`.
#[derive(Debug, clap::Args)]
pub struct RotateArgs {
    #[command(flatten)]
    pub connection: Connection,
    /// The token's id, or its name when one token that still works has it.
    pub token: String,
    /// How long the old token keeps working beside the new one (0s: it ends now).
    #[arg(long, default_value = "1h", value_parser = levee_agent::policy::duration::parse)]
    pub overlap: Duration,
    /// Lifetime of the new token, e.g. 90d (default: the old token's lifetime).
    #[arg(long, value_name = "DURATION")]
    pub expires_in: Option<String>,
    /// Why, recorded in the audit log; required.
    #[arg(long)]
    pub reason: String,
    /// Writes the new token to this file (mode 0600, replaced atomically) instead of stdout.
    #[arg(long, value_name = "FILE")]
    pub out: Option<PathBuf>,
}

/// `levee tokens revoke`.
#[derive(Debug, clap::Args)]
pub struct RevokeArgs {
    #[command(flatten)]
    pub connection: Connection,
    /// The token's id, or its name when one token that still works has it.
    pub token: String,
    /// Why, recorded in the audit log; required.
    #[arg(long)]
    pub reason: String,
}

/// A token as the API lists it.
#[derive(Debug, Deserialize)]
struct Listed {
    id: String,
    kind: TokenKind,
    name: String,
    #[serde(default)]
    role: Option<String>,
    #[serde(default)]
    environment: Option<String>,
    #[serde(default)]
    services: Vec<String>,
    expires_at: String,
    #[serde(default)]
    revoked_at: Option<String>,
}

impl Listed {
    /// When it stops working, and whether that is past.
    fn end(&self, now: i64) -> (String, bool) {
        let expiry = Timestamp::parse(&self.expires_at).map_or(i64::MAX, Timestamp::unix_ms);
        let revoked = self.revoked_at.as_deref().and_then(Timestamp::parse).map(Timestamp::unix_ms);
        match revoked {
            Some(at) if at < expiry => (format!("revoked {}", Timestamp::from_unix_ms(at)), at <= now),
            _ => (format!("expires {}", self.expires_at), expiry <= now),
        }
    }

    /// Whether it expires within [`EXPIRING_SOON`] of `now` with no end set by a rotation
    /// or a revocation.
    fn expires_soon(&self, now: i64) -> bool {
        let expiry = Timestamp::parse(&self.expires_at).map_or(i64::MAX, Timestamp::unix_ms);
        self.revoked_at.is_none() && expiry > now && expiry - now <= EXPIRING_SOON.as_millis() as i64
    }

    fn scope(&self) -> String {
        match self.kind {
            TokenKind::Agent | TokenKind::Flags => {
                format!("{}/{}", self.environment.as_deref().unwrap_or(""), self.services.join(","))
            }
            TokenKind::Api => format!("role {}", self.role.as_deref().unwrap_or("viewer")),
        }
    }
}

/// A minted token as the API answers it.
#[derive(Debug, Deserialize)]
struct Minted {
    id: String,
    name: String,
    expires_at: String,
    token: String,
    #[serde(default)]
    replaced: Option<Listed>,
}

/// Runs `levee tokens …`.
pub async fn run(cmd: TokensCommand) -> Result<ExitCode, CliError> {
    let now = Timestamp::now().unix_ms();
    match cmd {
        TokensCommand::List(a) => {
            let api = a.connection.api()?;
            let tokens: Vec<Listed> = api.get("/tokens").await?;
            println!("{:<36}  {:<5}  {:<24}  {:<32}  ENDS", "ID", "KIND", "NAME", "SCOPE");
            let mut soon = 0;
            for t in &tokens {
                let (end, ended) = t.end(now);
                if ended && !a.all {
                    continue;
                }
                let end = if ended {
                    format!("{end} (ended)")
                } else if t.expires_soon(now) {
                    soon += 1;
                    format!("{end} (soon: rotate it)")
                } else {
                    end
                };
                println!("{:<36}  {:<5}  {:<24}  {:<32}  {end}", t.id, t.kind.as_str(), t.name, t.scope());
            }
            if soon > 0 {
                eprintln!(
                    "{soon} token(s) expire within {}: levee tokens rotate TOKEN --expires-in …",
                    levee_agent::policy::duration::format(EXPIRING_SOON)
                );
            }
            Ok(ExitCode::SUCCESS)
        }
        TokensCommand::Create(a) => {
            let api = a.connection.api()?;
            let mut body = json!({"kind": a.kind, "name": a.name, "reason": a.reason});
            if let Some(e) = &a.environment {
                body["environment"] = json!(e);
            }
            if !a.services.is_empty() {
                body["services"] = json!(a.services);
            }
            if let Some(r) = &a.role {
                body["role"] = json!(r);
            }
            if let Some(t) = &a.expires_in {
                body["expires_in"] = json!(t);
            }
            let m: Minted = api.send(Method::POST, "/tokens", Some(&body), None).await?;
            hand_out(&m, a.out.as_deref())?;
            eprintln!("token {} ({}) minted; it expires {}", m.name, m.id, m.expires_at);
            Ok(ExitCode::SUCCESS)
        }
        TokensCommand::Rotate(a) => {
            let api = a.connection.api()?;
            let old = resolve(&api, &a.token, now).await?;
            let mut body = json!({
                "overlap": levee_agent::policy::duration::format(a.overlap),
                "reason": a.reason,
            });
            if let Some(t) = &a.expires_in {
                body["expires_in"] = json!(t);
            }
            let path = format!("/tokens/{}/rotate", seg(&old));
            let m: Minted = api.send(Method::POST, &path, Some(&body), None).await?;
            hand_out(&m, a.out.as_deref())?;
            eprintln!("token {} ({}) minted; it expires {}", m.name, m.id, m.expires_at);
            if let Some(r) = &m.replaced {
                let (end, ended) = r.end(Timestamp::now().unix_ms());
                let when = if ended { "has ended".to_string() } else { format!("works until it is {end}") };
                eprintln!("the old token {} {when}", r.id);
            }
            Ok(ExitCode::SUCCESS)
        }
        TokensCommand::Revoke(a) => {
            let api = a.connection.api()?;
            let id = resolve(&api, &a.token, now).await?;
            let path = format!("/tokens/{}?reason={}", seg(&id), seg(&a.reason));
            let _: serde_json::Value = api.send(Method::DELETE, &path, None, None).await?;
            eprintln!("token {id} revoked");
            Ok(ExitCode::SUCCESS)
        }
    }
}

/// The id of the token `given` names: an id as it is, or the name of exactly one token
/// that still works.
async fn resolve(api: &super::Api, given: &str, now: i64) -> Result<String, CliError> {
    let tokens: Vec<Listed> = api.get("/tokens").await?;
    if tokens.iter().any(|t| t.id == given) {
        return Ok(given.to_string());
    }
    let named: Vec<&Listed> = tokens.iter().filter(|t| t.name == given && !t.end(now).1).collect();
    match named.as_slice() {
        [one] => Ok(one.id.clone()),
        [] => Err(CliError::Usage(format!(
            "no token has the id {given:?}, nor does a token that still works have that name (levee tokens list)"
        ))),
        many => Err(CliError::Usage(format!(
            "{} tokens that still work are named {given:?}: give the id of one ({})",
            many.len(),
            many.iter().map(|t| t.id.as_str()).collect::<Vec<_>>().join(", ")
        ))),
    }
}

/// The new token's secret: to `out` (0600) or alone on stdout.
fn hand_out(m: &Minted, out: Option<&std::path::Path>) -> Result<(), CliError> {
    match out {
        Some(path) => {
            write_private(path, format!("{}\n", m.token).as_bytes())?;
            eprintln!("the token is in {} (mode 0600)", path.display());
        }
        None => println!("{}", m.token),
    }
    Ok(())
}

//! The `levee` command line as a client of the HTTP API: `login`, `get`, `export`,
//! `apply`, `flip`, `profile`, `rollout`, `tokens` and `experiment`. It never opens the database; everything goes through `/api/v1`
//! with a bearer token, and every write sends `If-Match` with the revision it was based
//! on and a reason.
//!
//! Exit codes, for scripts and CI jobs: 0 done (or nothing to do), 2 `apply --dry-run`
//! found changes, 3 / 4 an experiment followed with `--wait` failed / was aborted, 1
//! anything went wrong (the message on stderr names the file, the path
//! inside it and what is allowed).

mod apply;
mod experiment;
mod profile;
mod rollout;
mod session;
mod tokens;

use std::path::PathBuf;
use std::process::ExitCode;

use levee_agent::policy::{Flag, Timestamp};
use reqwest::Method;
use serde::Deserialize;
use serde_json::json;

pub use apply::ApplyArgs;
pub use experiment::{EXIT_ABORTED, EXIT_FAILED, ExperimentCommand};
pub use profile::ProfileCommand;
pub use rollout::RolloutCommand;
pub use session::{Api, CliError, Credentials, DEFAULT_SERVER, credentials_path};
pub use tokens::TokensCommand;

use crate::manifest::{self, ServiceManifest};

/// Exit code of a dry run whose plan has changes.
pub const EXIT_CHANGES: u8 = 2;

/// Where the server and the token are.
#[derive(Clone, Debug, Default, clap::Args)]
pub struct Connection {
    /// URL of the Levee server (default: LEVEE_SERVER, else the one `levee login` saved,
    /// else http://127.0.0.1:8080). The token comes from LEVEE_TOKEN, else from the
    /// credentials file.
    #[arg(long, env = "LEVEE_SERVER")]
    pub server: Option<String>,
    /// The credentials file `levee login` writes (mode 0600).
    #[arg(long, env = "LEVEE_CREDENTIALS", value_name = "FILE")]
    pub credentials: Option<PathBuf>,
}

/// `--break-glass REASON`, for writes where the environment requires approval.
#[derive(Clone, Debug, Default, clap::Args)]
pub struct BreakGlass {
    /// Apply at once where the environment requires an approved change request for this
    /// kind of change, audited and highlighted as a bypass with this reason (plain ASCII).
    #[arg(long = "break-glass", value_name = "REASON")]
    pub break_glass: Option<String>,
}

impl Connection {
    /// The API client: server and token from flags, environment and the credentials file.
    fn api(&self) -> Result<Api, CliError> {
        let path = credentials_path(self.credentials.as_deref())?;
        let token_env = std::env::var("LEVEE_TOKEN").ok().filter(|t| !t.trim().is_empty());
        let saved = Credentials::load(&path)?;
        let server = self.server.clone().or(saved.server).unwrap_or_else(|| DEFAULT_SERVER.to_string());
        Api::new(&server, token_env.map(|t| t.trim().to_string()).or(saved.token))
    }
}

/// The commands that talk to a server.
#[derive(Debug, clap::Subcommand)]
pub enum ClientCommand {
    /// Logs in and keeps the session token in a file only you can read.
    ///
    /// The token (12 h) goes to the credentials file, mode 0600. The password is read from
    /// LEVEE_PASSWORD, else asked for (or read from stdin when it is not a terminal).
    /// Automation can skip this and set LEVEE_TOKEN to an API token.
    Login(LoginArgs),
    /// Prints a service (ENV/SERVICE) or an environment (ENV) as manifests.
    ///
    /// The output is what `levee apply` takes: one YAML document per service (or JSON).
    Get(GetArgs),
    /// Like `get`; with --dir, writes one manifest file per service.
    ///
    /// The files are DIR/SERVICE.yaml (or .json), ready for a git repository.
    Export(ExportArgs),
    /// Applies manifests from files or directories, showing the plan first.
    ///
    /// The plan says per service: created / changed with the diff / unchanged / would be
    /// pruned, with the server's lint warnings. Then each service is written with If-Match
    /// (the revision the plan saw). Exit 0: applied or nothing to do; 2: --dry-run and the
    /// plan has changes; 1: error.
    Apply(ApplyArgs),
    /// Sets the value of one flag, e.g. a kill switch.
    ///
    /// `levee flip prod/checkout recommendations.enabled false --reason "…"`: the value is
    /// read as the flag's type and written with If-Match (the revision read).
    Flip(FlipArgs),
    /// Applies or reverts an emergency profile of an environment.
    ///
    /// `levee profile apply prod payments-down --for 2h --reason "…"` applies it until then
    /// (it reverts by itself, in every agent too); `levee profile revert prod --reason "…"`
    /// reverts the active one now.
    #[command(subcommand)]
    Profile(ProfileCommand),
    /// Shows and steps staged rollouts: status, promote, pause, resume, abort.
    ///
    /// `levee rollout status prod/checkout` shows the newest rollout of a service, its
    /// stage and its cohort beside the rest; `levee rollout abort prod 7 --reason "…"` puts
    /// the previous policy back for every instance.
    #[command(subcommand)]
    Rollout(RolloutCommand),
    /// Lists, mints, rotates and revokes API and agent tokens (admin).
    ///
    /// `levee tokens rotate checkout-prod --overlap 1h --out token --reason "…"` mints a
    /// token of the same scope and ends the old one an hour later; agents reading a token
    /// file pick the new one up when they reconnect.
    #[command(subcommand)]
    Tokens(TokensCommand),
    /// Runs, follows or stops an experiment: a fault with a steady-state hypothesis.
    ///
    /// `levee experiment run checkout-recs-slow.yaml --reason "after deploy" --wait` starts
    /// it and exits with its verdict: 0 passed, 3 failed, 4 aborted, 1 error.
    #[command(subcommand)]
    Experiment(ExperimentCommand),
}

/// `levee login`.
#[derive(Debug, clap::Args)]
pub struct LoginArgs {
    #[command(flatten)]
    pub connection: Connection,
    /// The user to log in as.
    #[arg(long, short, default_value = "admin")]
    pub username: String,
}

/// `levee get`.
#[derive(Debug, clap::Args)]
pub struct GetArgs {
    #[command(flatten)]
    pub connection: Connection,
    /// ENV for every service of an environment, or ENV/SERVICE for one.
    pub target: String,
    /// yaml (one document per service) or json.
    #[arg(long, short, value_enum, default_value = "yaml")]
    pub output: ManifestFormat,
}

/// How `get` writes manifests; also the files' extension.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum ManifestFormat {
    Yaml,
    Json,
}

/// How `apply` and `rollout` print what they did or read: for people, or as JSON.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Output {
    Text,
    Json,
}

/// `levee export`.
#[derive(Debug, clap::Args)]
pub struct ExportArgs {
    #[command(flatten)]
    pub get: GetArgs,
    /// Writes DIR/SERVICE.yaml for each service instead of printing.
    #[arg(long, value_name = "DIR")]
    pub dir: Option<PathBuf>,
}

/// `levee flip`.
#[derive(Debug, clap::Args)]
pub struct FlipArgs {
    #[command(flatten)]
    pub connection: Connection,
    /// ENV/SERVICE.
    pub target: String,
    /// The flag's key.
    pub flag: String,
    /// The new value, read as the flag's type: true/false, an integer, a number, text,
    /// or JSON for a json flag.
    pub value: String,
    /// Why, recorded in the audit log; required.
    #[arg(long)]
    pub reason: String,
    /// The value is temporary: after this long (e.g. 30m, 1.5h) the server puts back the
    /// flag as it was before the flip (a second flip keeps that original); agents use their
    /// compiled-in default from that instant until they receive it. Without it the value
    /// is permanent (an earlier flip's expiry is removed).
    #[arg(long = "for", value_name = "DURATION", value_parser = levee_agent::policy::duration::parse)]
    pub for_: Option<std::time::Duration>,
    #[command(flatten)]
    pub break_glass: BreakGlass,
}

/// Runs a client command; returns the process's exit code. Errors are printed on stderr.
pub async fn run(cmd: ClientCommand) -> ExitCode {
    let result = match cmd {
        ClientCommand::Login(a) => login(a).await,
        ClientCommand::Get(a) => get(&a, None).await,
        ClientCommand::Export(a) => get(&a.get, a.dir.as_deref()).await,
        ClientCommand::Apply(a) => apply::run(a).await,
        ClientCommand::Flip(a) => flip(a).await,
        ClientCommand::Profile(c) => profile::run(c).await,
        ClientCommand::Rollout(c) => rollout::run(c).await,
        ClientCommand::Tokens(c) => tokens::run(c).await,
        ClientCommand::Experiment(c) => experiment::run(c).await,
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            report(&e);
            ExitCode::FAILURE
        }
    }
}

/// Prints an error and the fields it names, one per line.
fn report(e: &CliError) {
    // One problem per line, each marked, so a CI log's error filter catches every one.
    for line in e.to_string().lines() {
        eprintln!("error: {line}");
    }
    if let CliError::Api { errors, current_revision, .. } = e {
        for f in errors {
            let value = if f.value.is_empty() { String::new() } else { format!(" (got {})", f.value) };
            eprintln!("  {}: {}{value}", f.path, f.message);
        }
        if let Some(rev) = current_revision {
            eprintln!("  the service is at revision {rev} now: read it again (levee get) and retry");
        }
    }
}

fn split_target(target: &str) -> Result<(&str, Option<&str>), CliError> {
    let bad = || CliError::Usage(format!("{target:?}: expected ENV or ENV/SERVICE, e.g. prod/checkout"));
    match target.split_once('/') {
        None if !target.is_empty() => Ok((target, None)),
        Some((env, svc)) if !env.is_empty() && !svc.is_empty() && !svc.contains('/') => Ok((env, Some(svc))),
        _ => Err(bad()),
    }
}

fn service_path(env: &str, svc: &str) -> String {
    format!("/environments/{}/services/{}", session::seg(env), session::seg(svc))
}

async fn login(a: LoginArgs) -> Result<ExitCode, CliError> {
    let path = credentials_path(a.connection.credentials.as_deref())?;
    let mut saved = Credentials::load(&path)?;
    let server =
        a.connection.server.clone().or(saved.server.clone()).unwrap_or_else(|| DEFAULT_SERVER.into());
    let password = match std::env::var("LEVEE_PASSWORD") {
        Ok(p) => p,
        Err(_) => read_password(&a.username)?,
    };
    let api = Api::new(&server, None)?;
    #[derive(Deserialize)]
    struct Session {
        token: String,
        expires_at: Timestamp,
        role: String,
    }
    let body = json!({"username": a.username, "password": password});
    let s: Session = api.send(Method::POST, "/auth/login", Some(&body), None).await?;
    saved.server = Some(api.server.clone());
    saved.token = Some(s.token);
    saved.save(&path)?;
    println!(
        "logged in to {} as {} ({}) until {}; token saved in {}",
        api.server,
        a.username,
        s.role,
        s.expires_at,
        path.display()
    );
    Ok(ExitCode::SUCCESS)
}

fn read_password(username: &str) -> Result<String, CliError> {
    use std::io::IsTerminal;
    let read = if std::io::stdin().is_terminal() {
        rpassword::prompt_password(format!("password for {username}: "))
    } else {
        let mut line = String::new();
        std::io::stdin().read_line(&mut line).map(|_| line.trim_end_matches(['\r', '\n']).to_string())
    };
    read.map_err(|e| CliError::Usage(format!("cannot read the password: {e} (or set LEVEE_PASSWORD)")))
}

/// The summary of a service that the manifest needs besides its snapshot.
#[derive(Deserialize)]
struct Summary {
    name: String,
    #[serde(default)]
    description: String,
}

/// The current snapshot of a service, as `GET .../snapshot` answers it.
#[derive(Deserialize)]
struct Snapshot {
    revision: u64,
    config: levee_agent::policy::ServiceConfig,
}

/// A flag under a temporary value, as `GET .../temporary-flags` answers it.
#[derive(Deserialize)]
struct TemporaryFlag {
    key: String,
    flag: Flag,
    restores: Flag,
}

/// The manifest of one service as declared now: a flag under a temporary value (a flip
/// with `--for`, a profile) is the flag it goes back to, so git never receives incident
/// state; each such flip is named on stderr.
async fn fetch_manifest(api: &Api, env: &str, svc: &str) -> Result<ServiceManifest, CliError> {
    let summary: Summary = api.get(&service_path(env, svc)).await?;
    let snap: Snapshot = api.get(&format!("{}/snapshot", service_path(env, svc))).await?;
    let temporary: Vec<TemporaryFlag> =
        api.get(&format!("{}/temporary-flags", service_path(env, svc))).await?;
    let mut flags = snap.config.flags;
    for t in temporary {
        let until = t.flag.expires_at.map_or_else(|| "its expiry".to_string(), |e| e.to_string());
        eprintln!(
            "note: {env}/{svc}: flag {} is temporarily {} until {until}; not exported: the manifest has \
             the flag it goes back to then ({})",
            t.key, t.flag.value, t.restores.value
        );
        flags.insert(t.key, t.restores);
    }
    Ok(ServiceManifest {
        description: summary.description,
        policy: snap.config.policy,
        flags,
        ..ServiceManifest::new(env, svc)
    })
}

async fn get(a: &GetArgs, dir: Option<&std::path::Path>) -> Result<ExitCode, CliError> {
    let api = a.connection.api()?;
    let (env, svc) = split_target(&a.target)?;
    let names: Vec<String> = match svc {
        Some(s) => vec![s.to_string()],
        None => {
            let list: Vec<Summary> =
                api.get(&format!("/environments/{}/services", session::seg(env))).await?;
            list.into_iter().map(|s| s.name).collect()
        }
    };
    let mut manifests = Vec::new();
    for name in &names {
        manifests.push(fetch_manifest(&api, env, name).await?);
    }
    let render = |ms: &[ServiceManifest]| match a.output {
        ManifestFormat::Json => manifest::to_json(ms),
        ManifestFormat::Yaml => manifest::to_yaml(ms),
    };
    match dir {
        None => print!("{}", render(&manifests)),
        Some(dir) => {
            std::fs::create_dir_all(dir)
                .map_err(|e| CliError::Usage(format!("cannot create {}: {e}", dir.display())))?;
            let ext = match a.output {
                ManifestFormat::Json => "json",
                ManifestFormat::Yaml => "yaml",
            };
            for m in &manifests {
                let file = dir.join(format!("{}.{ext}", m.service));
                std::fs::write(&file, render(std::slice::from_ref(m)))
                    .map_err(|e| CliError::Usage(format!("cannot write {}: {e}", file.display())))?;
                println!("wrote {}", file.display());
            }
            if svc.is_none() {
                warn_of_stale_files(dir, env, &names, ext);
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// After exporting environment `env` into `dir`: warns of every other manifest file there
/// that holds a service of `env` the server no longer has: left there, the next apply would
/// create that deleted service again.
fn warn_of_stale_files(dir: &std::path::Path, env: &str, exported: &[String], ext: &str) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    let mut files: Vec<std::path::PathBuf> = entries.filter_map(|e| e.ok().map(|e| e.path())).collect();
    files.sort();
    for file in files {
        let name = file.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        let is_manifest = [".yaml", ".yml", ".json"].iter().any(|x| name.ends_with(x));
        let written = exported.iter().any(|s| name == format!("{s}.{ext}"));
        if !is_manifest || written || name.starts_with('.') {
            continue;
        }
        let Ok(text) = std::fs::read_to_string(&file) else { continue };
        let Ok(ms) = manifest::parse(&name, &text) else { continue };
        for m in ms.iter().filter(|m| m.environment == env && !exported.contains(&m.service)) {
            eprintln!(
                "warning: {} holds {}, which the server does not have: delete the file, or the next \
                 levee apply creates the service again",
                file.display(),
                m.key()
            );
        }
    }
}

async fn flip(a: FlipArgs) -> Result<ExitCode, CliError> {
    let (env, Some(svc)) = split_target(&a.target)? else {
        return Err(CliError::Usage(format!("{:?}: expected ENV/SERVICE, e.g. prod/checkout", a.target)));
    };
    let api = a.connection.api()?.break_glass(a.break_glass.break_glass.as_deref())?;
    let path = service_path(env, svc);
    let snap: Snapshot = api.get(&format!("{path}/snapshot")).await?;
    let flag: &Flag = snap.config.flags.get(&a.flag).ok_or_else(|| {
        let known: Vec<&str> = snap.config.flags.keys().map(String::as_str).collect();
        CliError::Usage(format!("{env}/{svc} has no flag {:?}; its flags: {}", a.flag, known.join(", ")))
    })?;
    let value = flag
        .kind
        .parse_text(&a.value)
        .map_err(|m| CliError::Usage(format!("{} {m} (got {:?})", a.flag, a.value)))?;
    let mut body = json!({"value": value, "reason": a.reason});
    if let Some(d) = a.for_ {
        let until = Timestamp::from_unix_ms(Timestamp::now().unix_ms().saturating_add(d.as_millis() as i64));
        body["expires_at"] = json!(until);
    }
    #[derive(Deserialize)]
    struct Written {
        revision: u64,
        changed: bool,
    }
    let w: Written = api
        .send(
            Method::PATCH,
            &format!("{path}/flags/{}", session::seg(&a.flag)),
            Some(&body),
            Some(snap.revision),
        )
        .await?;
    let note = if w.changed { format!("revision {}", w.revision) } else { "it already was".into() };
    println!("{env}/{svc}: {} = {value} ({note})", a.flag);
    Ok(ExitCode::SUCCESS)
}
